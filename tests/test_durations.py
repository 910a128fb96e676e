"""BPE-level duration tokens a_n (SyncSpeech 2.1) from word intervals: hand-worked examples."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arnar.align.base import Interval, spoken_words
from arnar.align.durations import (
    DurationError,
    bpe_durations,
    bpe_end_positions,
    num_frames,
    phone_durations,
    word_spans,
)


def test_worked_example_with_punctuation_and_pauses():
    # "hello, world." as pieces hel|lo|,|world|. ; hello spoken 0.2-0.7 s, world 0.9-1.5 s;
    # D = 2 s at 25 Hz -> T = 50, 25 frames per second.
    # hello owns [0 (leading silence), 22.5): speech 0-17.5 split 3:2 by letters -> 10.5, 17.5;
    #   "," takes the pause 17.5-22.5 -> 22.5.
    # world owns [22.5, 50): speech 22.5-37.5 -> 37.5; "." takes the trailing silence -> 50.
    # Rounded once each (half up): 11, 18, 23, 38, 50.
    ends = bpe_end_positions(
        ["hel", "lo", ",", "world", "."], [0, 0, 0, 1, 1], [(0.2, 0.7), (0.9, 1.5)], 2.0, 50
    )
    assert ends == [11, 18, 23, 38, 50]


def test_word_without_punctuation_keeps_its_pause_in_its_last_piece():
    # "ab cd": ab spoken 0-0.4 (pieces a|b), cd 0.6-1.0; D = 1 s, T = 10
    # ab owns [0, 6): a -> 2, b -> 4 then the pause -> 6; cd -> 10
    assert bpe_end_positions(["a", "b", "cd"], [0, 0, 1], [(0.0, 0.4), (0.6, 1.0)], 1.0, 10) == [2, 6, 10]


def test_unspoken_word_gets_zero_frames():
    # "a - b": the dash is not spoken; it ends where b starts (a owns its pause up to 5)
    ends = bpe_end_positions(["a", "-", "b"], [0, 1, 2], [(0.0, 0.4), None, (0.5, 1.0)], 1.0, 10)
    assert ends == [5, 5, 10]


def test_duration_maps_onto_codec_frames():
    # a codec that pads: T = 26 frames for 1 s; the speech end 0.5 s maps to frame 13
    assert bpe_end_positions(["a", "b"], [0, 1], [(0.0, 0.5), (0.5, 1.0)], 1.0, 26) == [13, 26]


def test_spoken_tokens_and_word_matching():
    assert spoken_words("Hello,") == ["hello"]
    assert spoken_words("well-known") == ["well", "known"]
    assert spoken_words("don't!") == ["don't"]
    assert spoken_words("--") == []
    aligned = [Interval("hello", 0.1, 0.4), Interval("well", 0.5, 0.7), Interval("known", 0.7, 1.0),
               Interval("world", 1.2, 1.6)]
    spans = word_spans(["Hello,", "well-known", "--", "world."], aligned)
    assert spans == [(0.1, 0.4), (0.5, 1.0), None, (1.2, 1.6)]
    with pytest.raises(DurationError, match="do not match text word"):
        word_spans(["Hello,", "world"], [Interval("hello", 0, 1), Interval("word", 1, 2)])
    with pytest.raises(DurationError, match="words the text does not"):
        word_spans(["Hello"], [Interval("hello", 0, 1), Interval("again", 1, 2)])


def test_with_a_real_bpe_tokenizer(tmp_path):
    from arnar.text.bpe import train_bpe

    sentences = ["the cat sat on the mat", "a dog ran to the park", "hello world, said the cat."] * 40
    tokenizer = train_bpe(sentences, tmp_path / "bpe", vocab_size=300)
    text = "Hello world, said the cat."
    words = [Interval("hello", 0.10, 0.50), Interval("world", 0.55, 0.95), Interval("said", 1.20, 1.50),
             Interval("the", 1.50, 1.60), Interval("cat", 1.60, 2.00)]
    result = bpe_durations(text, words, duration=2.3, tokenizer=tokenizer, frame_rate=25)
    assert result.num_frames == num_frames(2.3, 25) == 58
    assert result.ends[-1] == 58 and len(result.ends) == len(result.ids) == len(tokenizer.encode(text))
    assert all(b >= a for a, b in zip(result.ends, result.ends[1:]))
    assert sum(result.lengths) == 58
    # the piece that ends "world," holds the pause up to "said" at 1.20 s = frame 30
    pieces = [tokenizer.id_to_piece(i) for i in result.ids]
    comma = pieces.index(",")
    assert result.ends[comma] == 30


def test_phonemes_as_text_units_hand_worked():
    """text.units=phonemes: "Hello, world." -> HH AH L OW <sil> W ER L D (CMUdict, stress dropped).
    hello spoken 0.1-0.5 s, world 0.7-1.1 s, D = 1.2 s, T = 30 (25 frames per second).
    hello owns [0, 17.5): 4 equal phone shares of 0-12.5 -> 3.125 6.25 9.375 12.5; the <sil>
    separator is hello's last piece, no speech, the pause to 17.5. world owns [17.5, 30): 2.5 each
    -> 20 22.5 25 27.5, its last phone takes the trailing silence -> 30. Rounded half up once each."""
    from arnar.text import PhonemeTokenizer, load_text_tokenizer

    tokenizer = PhonemeTokenizer()
    words = [Interval("hello", 0.1, 0.5), Interval("world", 0.7, 1.1)]
    result = bpe_durations("Hello, world.", words, duration=1.2, tokenizer=tokenizer, total_frames=30)
    assert [tokenizer.id_to_piece(i) for i in result.ids] == ["HH", "AH", "L", "OW", "<sil>", "W", "ER", "L", "D"]
    assert result.ends == [3, 6, 9, 13, 18, 20, 23, 25, 30]
    # without punctuation the separator is "|" and holds the (here empty) pause the same way
    plain = bpe_durations("hello world", [Interval("hello", 0.0, 0.4), Interval("world", 0.4, 0.8)],
                          duration=0.8, tokenizer=tokenizer, total_frames=20)
    assert tokenizer.id_to_piece(plain.ids[4]) == "|" and plain.ends == [3, 5, 8, 10, 10, 13, 15, 18, 20]


def test_text_tokenizer_loader_picks_by_suffix(tmp_path):
    from arnar.text import BpeTokenizer, PhonemeTokenizer, load_text_tokenizer
    from arnar.text.bpe import train_bpe

    PhonemeTokenizer().save(tmp_path / "phonemes.json")
    assert isinstance(load_text_tokenizer(tmp_path / "phonemes.json"), PhonemeTokenizer)
    train_bpe(["the cat sat on the mat", "a dog ran to the park"] * 20, tmp_path / "bpe", vocab_size=40)
    assert isinstance(load_text_tokenizer(tmp_path / "bpe.model"), BpeTokenizer)


def test_phone_durations_fill_gaps_with_silence():
    phones = [Interval("HH", 0.1, 0.2), Interval("AY", 0.2, 0.5)]
    assert phone_durations(phones, 1.0, 10) == [("<sil>", 1), ("HH", 1), ("AY", 3), ("<sil>", 5)]


@settings(max_examples=300, deadline=None)
@given(
    data=st.data(),
    n_words=st.integers(1, 8),
    total_frames=st.integers(1, 400),
    duration=st.floats(0.2, 20.0),
)
def test_end_positions_are_consistent_for_any_alignment(data, n_words, total_frames, duration):
    cuts = sorted(data.draw(st.lists(st.floats(0, duration), min_size=2 * n_words, max_size=2 * n_words)))
    spans = [(cuts[2 * i], cuts[2 * i + 1]) for i in range(n_words)]
    spans = [s if data.draw(st.booleans()) or i == 0 else None for i, s in enumerate(spans)]
    pieces, words = [], []
    for w in range(n_words):
        for _ in range(data.draw(st.integers(1, 3))):
            pieces.append(data.draw(st.sampled_from(["ab", "c", ",", "xyz", "."])))
            words.append(w)
    ends = bpe_end_positions(pieces, words, spans, duration, total_frames)
    assert len(ends) == len(pieces)
    assert all(0 <= a <= total_frames for a in ends)
    assert all(b >= a for a, b in zip(ends, ends[1:]))
    assert ends[-1] == total_frames


def test_bad_inputs_are_named():
    with pytest.raises(DurationError, match="no spoken word"):
        bpe_end_positions(["-"], [0], [None], 1.0, 10)
    with pytest.raises(DurationError, match="nothing to align to"):
        bpe_end_positions(["a"], [0], [(0, 1)], 0.0, 10)
