"""Synthesis input robustness: `arnar synthesize` (``Synthesizer.synthesize`` and the CLI) and
`arnar stream` on any text and any prompt audio either give audio or a one-line error that names
the input and the problem (``arnar.synthesize.SynthesisInputError``): never a traceback, never
unbounded work (the limits are in the arnar.synthesize docstring).

A real run is built here, so nothing from ``data/`` is needed: a tiny offline codec trained on
a few sentences synthesized with Debian's flite, a byte-fallback BPE (as the pipeline's),
the flite clips' codes as the training tokens, and 2 updates of a tiny AR and a tiny SyncSpeech
model. The models are untrained; what is tested is what reaches them and what comes back.
"""

from __future__ import annotations

import io
import json
import math
import shutil
import warnings
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from arnar.cli import main as cli_main
from arnar.evaluate.testlists import TestItem, to_tsv
from arnar.stream import StreamError, at_most, from_first_speakable
from arnar.stream import main as stream_main
from arnar.synthesize import (
    MAX_PROMPT_CHANNELS,
    MAX_PROMPT_PEAK,
    MAX_PROMPT_SECONDS,
    MAX_TEXT_TOKENS,
    SILENCE_DBFS,
    SynthesisInputError,
    Synthesizer,
    speakable,
    synthesize_testlist,
)
from arnar.text import normalize_text
from flite_audio import flite_utterance  # tests/flite_audio.py

SENTENCES = [
    "Please call the doctor before noon tomorrow.",
    "The children walked to school in the morning.",
    "A quiet river runs under the old stone bridge.",
    "She packed her bags and left before sunrise.",
]
VOICES = ["rms", "slt"]
# the offline codec at its smallest (trains in about two seconds); 4 Griffin-Lim iterations
CODEC_SIZES = dict(
    enc_channels=32, enc_dilations=[1, 2], bottleneck=8, enc_epochs=2, n_tokens=16, kmeans_iters=4,
    dec_channels=32, dec_dilations=[1], dec_fine_channels=16, dec_fine_dilations=[1], dec_epochs=1,
    enc_front_channels=8, enc_front_dilations=[1], rvq_codebooks=2, rvq_size=8, rvq_iters=2,
    batch_size=4, crop_seconds=1.0, gl_iters=4,
)
TINY = ["model=tiny", "model.dim=32", "model.n_layers=2", "model.n_heads=2", "train=smoke", "train.max_steps=2",
        "train.progress=false", "train.device=cpu"]
AR_MAX_RATIO = 3.0  # frames per text token for the tests' AR (the default 20 only makes them slower)
SMALL_LIMIT = 48  # text tokens of the property tests' synthesizer: long draws meet the limit cheaply
PROPERTY = settings(max_examples=25, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])



@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Paths of the codec, BPE model, AR and SyncSpeech runs, and a 16 kHz prompt clip."""
    if shutil.which("flite") is None:
        pytest.skip("needs the Debian package flite (apt-get install flite) to make its own tiny run")
    from arnar.codec import codec_info, load_codec, write_token_shards
    from arnar.codec.offline import train_offline_codec
    from arnar.text.bpe import train_bpe
    from arnar.train import compose_config, train

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("synthesis_inputs")
    cuts, wavs = [], {}
    for voice in VOICES:
        for i, text in enumerate(SENTENCES):
            utt = f"{voice}_{i}"
            wav = root / f"{utt}.wav"
            phones = flite_utterance(text, voice, wav)
            info = sf.info(str(wav))
            duration = info.frames / info.samplerate
            cuts.append({
                "id": utt, "start": 0.0, "duration": duration, "channel": 0, "type": "MonoCut",
                "supervisions": [{"id": utt, "recording_id": utt, "start": 0.0, "duration": duration, "channel": 0,
                                  "text": text, "speaker": voice,
                                  "alignment": {"phone": [[p, b, round(e - b, 4), None] for p, b, e in phones]}}],
                "recording": {"id": utt, "sources": [{"type": "file", "channels": [0], "source": str(wav)}],
                              "sampling_rate": info.samplerate, "num_samples": info.frames,
                              "duration": duration, "channel_ids": [0]},
            })
            wavs[utt] = (wav, text)
    (root / "cuts.jsonl").write_text("".join(json.dumps(c) + "\n" for c in cuts))
    train_offline_codec(root / "cuts.jsonl", None, root / "codec", seed=7, progress=False, threads=1, **CODEC_SIZES)
    codec = load_codec("offline", model=str(root / "codec"))
    with warnings.catch_warnings():  # the requested size is clamped to what 4 sentences allow
        warnings.simplefilter("ignore")
        bpe = train_bpe(SENTENCES, root / "bpe", vocab_size=300)

    # training data: the clips' own codes, each BPE token given an equal share of the frames
    tokens, rows = {}, []
    for utt, (wav, text) in wavs.items():
        audio, rate = sf.read(str(wav), dtype="float32")
        codes = codec.encode([audio], rate)[0]
        ids = bpe.encode(text)
        T = codes.shape[1]
        tokens[utt] = codes
        rows.append({"utt_id": utt, "frame_rate": codec.frame_rate, "num_frames": T, "bpe_ids": ids,
                     "ends": [(k + 1) * T // len(ids) for k in range(len(ids))]})
    split = write_token_shards(root / "tokens", "train", tokens, codec_info(codec))
    (root / "durations.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for paradigm in ("ar", "syncspeech"):
        train(compose_config([f"paradigm={paradigm}", *TINY]), run_dir=root / paradigm, train_tokens=split,
              train_durations=root / "durations.jsonl", bpe_model=root / "bpe.model")

    prompt_wav = wavs["rms_0"][0]
    prompt, rate = sf.read(str(prompt_wav), dtype="float32")
    yield {"root": root, "codec": root / "codec", "bpe": root / "bpe.model", "ar": root / "ar",
           "syncspeech": root / "syncspeech", "prompt_wav": prompt_wav, "prompt": prompt[: 2 * rate], "rate": rate,
           "prompt_text": "Please call"}
    torch.set_num_threads(threads)


def make_synth(built, **limits) -> Synthesizer:
    return Synthesizer(built["ar"], codec="offline", codec_model=str(built["codec"]), bpe_model=built["bpe"],
                       decoding={"max_ratio": AR_MAX_RATIO}, **limits)


@pytest.fixture(scope="module")
def synth(built):
    return make_synth(built)


@pytest.fixture(scope="module")
def small_synth(built):
    return make_synth(built, max_text_tokens=SMALL_LIMIT)


def assert_audio(audio: np.ndarray, record: dict, n_text_tokens: int) -> None:
    assert audio.dtype == np.float32 and audio.ndim == 1 and len(audio) > 0
    assert np.all(np.isfinite(audio))
    # the work is bounded by the text: AR stops at max_ratio frames per text token
    assert 1 <= record["generated_frames"] <= max(2 * n_text_tokens + 1, AR_MAX_RATIO * n_text_tokens)


def assert_one_line(message: str, *words: str) -> None:
    assert message and "\n" not in message and "Traceback" not in message, message
    for word in words:
        assert word in message, (word, message)


def has_a_word(text: str) -> bool:
    """Oracle of a word to speak, from the documented rule: a token of the normalised text with a
    letter or digit of any script, or one of the symbols read as words."""
    return any(any(c.isalnum() for c in token) or token in {"&", "+", "=", "@", "%"}
               for token in normalize_text(text).split(" "))


# ----------------------------------------------------------------------------- text

SCRIPTS = ["你好，世界", "Привет, мир", "مرحبا بالعالم", "नमस्ते दुनिया", "こんにちは", "Γειά σου κόσμε", "שלום עולם"]
EMOJI = ["😀", "🎉", "👍🏽", "👨‍👩‍👧", "🏳️‍🌈", "🇮🇸"]
ODD = ["", " ", "\t\n\r ", "\u200b\u2060\ufeff", "\x00\x07\x1b", "\u00ad", "0123456789", "3.14159 1,000,000 1st 2nd",
       "!@#$%^&*()_+-=[]{}|;:'\",.<>/?`~", "ﬁ Ａ１ … “quoted” — dash", "e\u0301" * 5, "\u2581\u2581", "\udcff ok",
       "a" * 200, "hello " * 40, "?!... ---", "...", "- -- ---", "«»", "?", "% 5", "& Co", "@"]
texts = st.one_of(
    st.text(st.characters(exclude_categories=()), max_size=40),  # any code point: controls, lone surrogates
    st.sampled_from(ODD + SCRIPTS + EMOJI),
    st.lists(st.sampled_from(SCRIPTS + EMOJI + ["7", "%", "the cat", " "]), max_size=12).map("".join),
)


@PROPERTY
@given(text=texts)
def test_any_text_gives_audio_or_names_the_problem(small_synth, built, text):
    """Oracle from the BPE and the word rule: refused exactly when the text is not encodable
    Unicode, is over the token limit, or has no word to speak (empty, or only whitespace,
    punctuation, emoji, invisible characters); otherwise audio."""
    try:
        text.encode("utf-8")
        expected_ids = small_synth.bpe.encode(text)
    except UnicodeEncodeError:  # a lone surrogate
        expected_ids = None
    try:
        audio, record = small_synth.synthesize(text, built["prompt"], built["prompt_text"], built["rate"])
    except SynthesisInputError as err:
        message = str(err)
        event("refused")  # --hypothesis-show-statistics: both outcomes are drawn
        assert_one_line(message, "text")
        if expected_ids is None:
            assert "Unicode" in message
        elif len(expected_ids) > SMALL_LIMIT:
            assert f"{len(expected_ids)} BPE tokens" in message
        else:
            assert "has no word to speak" in message and "nothing to speak" in message and not has_a_word(text)
        return
    event("audio")
    assert expected_ids and len(expected_ids) <= SMALL_LIMIT and has_a_word(text), text
    assert_audio(audio, record, len(expected_ids))


def test_text_of_10000_characters_is_refused_at_once(synth, built):
    for text in ("word " * 2000, "x" * 10_000, "😀" * 10_000, "你" * 10_000, "1" * 10_000):
        with pytest.raises(SynthesisInputError) as err:
            synth.synthesize(text, built["prompt"], built["prompt_text"], built["rate"])
        assert_one_line(str(err.value), "text:", f"{len(text)} characters",
                        f"the {MAX_TEXT_TOKENS} one synthesis takes", "split it into sentences")
        assert len(str(err.value)) < 300  # the text itself is not echoed whole
    # the prompt transcript has the same limit
    with pytest.raises(SynthesisInputError, match="prompt text: .* BPE tokens"):
        synth.synthesize("hello", built["prompt"], "word " * 2000, built["rate"])


def test_texts_within_the_limit_give_audio(synth, built):
    for text in ["0123456789", "20 % & more!?", "😀 ok 🎉", SCRIPTS[0], SCRIPTS[1], "Please call " * 20]:
        n = len(synth.bpe.encode(text))
        assert n <= MAX_TEXT_TOKENS
        audio, record = synth.synthesize(text, built["prompt"], built["prompt_text"], built["rate"])
        assert_audio(audio, record, n)


@pytest.mark.parametrize("text", ["", "   \n\t", "\u200b\x00", "?!... ---", "😀🎉", "!?%&", "— « » …"])
def test_empty_text_and_prompt_text_are_named(synth, built, text):
    """Text with no word to speak (empty, whitespace, punctuation, emoji) gets the one refusal."""
    assert not speakable(text)
    with pytest.raises(SynthesisInputError) as err:
        synth.synthesize(text, built["prompt"], built["prompt_text"], built["rate"])
    assert_one_line(str(err.value), "text:", repr(text), "has no word to speak", "nothing to speak")
    with pytest.raises(SynthesisInputError) as empty:
        synth.synthesize("", built["prompt"], built["prompt_text"], built["rate"])
    assert str(err.value).replace(repr(text), repr("")) == str(empty.value)  # the same error as empty text
    with pytest.raises(SynthesisInputError) as err:
        synth.synthesize("hello", built["prompt"], text, built["rate"])
    assert_one_line(str(err.value), "prompt text:", repr(text))
    with pytest.raises(SynthesisInputError, match=r"text: not valid Unicode \('\\udcff' at character 3"):
        synth.synthesize("ok \udcff", built["prompt"], built["prompt_text"], built["rate"])
    with pytest.raises(SynthesisInputError, match="expected a str, got NoneType"):
        synth.synthesize(None, built["prompt"], built["prompt_text"], built["rate"])


# ----------------------------------------------------------------------------- prompt audio

RATES = [0, -16000, float("nan"), 1, 100, 8000, 16000, 22050, 44100, 48000]
SECONDS = [0.0, 1e-4, 0.01, 0.05, 0.1, 0.5, 2.0, MAX_PROMPT_SECONDS - 0.5, MAX_PROMPT_SECONDS + 0.5, 45.0]
# quiet: a sine at -83 dBFS RMS, under the silence threshold (-60); faint: one at -53.5 dBFS, over it
KINDS = ["silence", "quiet", "faint", "noise", "sine", "nan", "inf", "loud", "int16 scale"]
LAYOUTS = ["mono", "stereo", "channels first", "3-d"]


def make_prompt(kind: str, n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(n, dtype=np.float32)
    audio = {
        "silence": np.zeros(n, np.float32),
        "noise": rng.uniform(-0.5, 0.5, n).astype(np.float32),
        "sine": (0.3 * np.sin(0.05 * t)).astype(np.float32),
        "quiet": (1e-4 * np.sin(0.05 * t)).astype(np.float32),
        "faint": (3e-3 * np.sin(0.05 * t)).astype(np.float32),
        "nan": np.zeros(n, np.float32),
        "inf": np.zeros(n, np.float32),
        "loud": np.full(n, 1e30, np.float32),
        "int16 scale": np.round(rng.uniform(-32767, 32767, n)).astype(np.float32),
    }[kind]
    if kind in ("nan", "inf") and n:
        audio[n // 2] = np.nan if kind == "nan" else np.inf
    return audio


@settings(PROPERTY, max_examples=60)  # cheap (most draws are refused before the codec): more of them
@given(rate=st.sampled_from(RATES), seconds=st.sampled_from(SECONDS), kind=st.sampled_from(KINDS),
       layout=st.sampled_from(LAYOUTS), seed=st.integers(0, 2**16))
def test_any_prompt_audio_gives_audio_or_names_the_problem(synth, built, rate, seconds, kind, layout, seed):
    """Oracle from the documented limits: a positive rate, mono or [samples, channels], one codec
    frame .. MAX_PROMPT_SECONDS, finite, peak <= MAX_PROMPT_PEAK, not silent; otherwise refused
    by name."""
    n = int(round(seconds * rate)) if rate > 0 else 16000
    mono = make_prompt(kind, n, seed)
    audio = {"mono": mono, "stereo": np.stack([mono, 0.5 * mono], axis=1), "channels first": np.stack([mono, mono]),
             "3-d": mono[None, :, None]}[layout]
    # samples as the documented layout reads them ([samples, <= 8 channels]: a [2, n] array is 2
    # samples of n channels when n <= 8, otherwise refused as channels-first); None: refused by shape
    samples = {"mono": n, "stereo": n, "channels first": (2 if n <= MAX_PROMPT_CHANNELS else None) if n else 0,
               "3-d": None if n else 0}[layout]
    try:
        out, record = synth.synthesize("hello there", audio, built["prompt_text"], rate)
    except SynthesisInputError as err:
        message = str(err)
        event("refused")
        assert_one_line(message, "prompt audio:")
        if not rate > 0:
            assert "sample rate" in message
        elif samples is None:
            assert "shape" in message
        elif samples / rate < 1 / synth.codec.frame_rate:
            assert "a prompt needs at least" in message
        elif samples / rate > MAX_PROMPT_SECONDS:
            assert "a prompt is at most" in message
        elif kind in ("nan", "inf"):
            assert "non-finite" in message
        elif kind == "loud":
            assert "peak amplitude" in message
        else:
            assert kind in ("silence", "quiet") and "silent prompt (RMS level" in message
        return
    event("audio")
    assert rate > 0 and samples is not None and 1 / synth.codec.frame_rate <= samples / rate <= MAX_PROMPT_SECONDS
    assert kind in ("faint", "noise", "sine", "int16 scale")
    assert_audio(out, record, len(synth.bpe.encode("hello there")))


def test_representative_prompts(synth, built):
    prompt, rate, text = built["prompt"], built["rate"], built["prompt_text"]
    # 0.1 s (of speech: the clip opens with silence), another sample rate: audio
    for audio, audio_rate in [(prompt[rate // 2: rate // 2 + rate // 10], rate), (prompt[::2], rate // 2),
                              (prompt, 44100)]:
        out, record = synth.synthesize("hello", audio, text, audio_rate)
        assert_audio(out, record, len(synth.bpe.encode("hello")))
    # stereo [samples, channels] is read as the average of its channels
    left, right = prompt, prompt[::-1].copy()
    mono, _ = synth.synthesize("hello", (left + right) / 2, text, rate, seed=3)
    stereo, _ = synth.synthesize("hello", np.stack([left, right], axis=1), text, rate, seed=3)
    np.testing.assert_array_equal(mono, stereo)
    # the peak limit, at and just over it
    spikes = np.zeros(rate, np.float32)
    spikes[::100] = MAX_PROMPT_PEAK
    out, record = synth.synthesize("hello", spikes, text, rate)
    assert_audio(out, record, len(synth.bpe.encode("hello")))
    spikes[0] = np.nextafter(np.float32(MAX_PROMPT_PEAK), np.float32(np.inf))
    with pytest.raises(SynthesisInputError, match="prompt audio: peak amplitude"):
        synth.synthesize("hello", spikes, text, rate)
    # 5 minutes: refused before any encoding
    with pytest.raises(SynthesisInputError, match=r"prompt audio: 300\.0 s long; a prompt is at most 30 s"):
        synth.synthesize("hello", np.zeros(300 * rate, np.float32), text, rate)
    # an array that is no audio
    with pytest.raises(SynthesisInputError, match="prompt audio: not an array of samples"):
        synth.synthesize("hello", ["a", "b"], text, rate)
    with pytest.raises(SynthesisInputError, match="sample rate True"):
        synth.synthesize("hello", prompt, text, True)


def level(audio: np.ndarray, dbfs: float) -> np.ndarray:
    """``audio`` scaled to an RMS level of ``dbfs``."""
    audio = np.asarray(audio, np.float64)
    return (audio * 10 ** (dbfs / 20) / np.sqrt(np.mean(audio**2))).astype(np.float32)


def test_a_silent_prompt_is_refused_with_its_level(synth, built):
    """A prompt under validation.silence_dbfs (RMS) has no voice to copy: refused, with its level."""
    prompt, rate, text = built["prompt"], built["rate"], built["prompt_text"]
    assert SILENCE_DBFS == -60.0  # the ingest's threshold (params.yaml validation.silence_dbfs)
    for audio, shown in [(np.zeros(3 * rate, np.float32), "-inf dBFS"), (level(prompt, -75.0), "-75.0 dBFS"),
                         (np.stack([prompt, -prompt], axis=1), "-inf dBFS")]:  # channels that cancel out
        with pytest.raises(SynthesisInputError) as err:
            synth.synthesize("hello", audio, text, rate)
        assert_one_line(str(err.value), "prompt audio: silent prompt (RMS level", shown,
                        "below the -60 dBFS of validation.silence_dbfs")
    out, record = synth.synthesize("hello", level(prompt, -55.0), text, rate)
    assert_audio(out, record, len(synth.bpe.encode("hello")))
    # the threshold is the caller's (arnar synthesize --silence-dbfs)
    lenient = make_synth(built, silence_dbfs=-80.0)
    out, record = lenient.synthesize("hello", level(prompt, -75.0), text, rate)
    assert_audio(out, record, len(synth.bpe.encode("hello")))


def test_testlist_synthesis_checks_each_item_as_arnar_synthesize_does(synth, built, tmp_path):
    """A test list's prompt files and texts get the checks of `arnar synthesize`, the error naming
    the list, the item and the prompt file."""
    prompts, out = tmp_path / "prompts", tmp_path / "out"
    prompts.mkdir()
    prompt_wav = prompts / "cross_rms_1.wav"
    item = TestItem(item_id="cross_rms_1", task="cross_sentence", speaker="rms", target_id="rms_1",
                    target_text=SENTENCES[1], target_duration=3.0, prompt_id="rms_0", prompt_start=0.0,
                    prompt_end=2.0, prompt_text=built["prompt_text"])
    testlist = tmp_path / "cross_sentence.tsv"

    def synthesize(*items: TestItem) -> None:
        testlist.write_text(to_tsv(list(items)))
        synthesize_testlist(synth, testlist, prompts, out, seed=0, progress=False)

    sf.write(str(prompt_wav), built["prompt"], built["rate"], subtype="FLOAT")
    synthesize(item)
    assert sf.info(str(out / "cross_rms_1.wav")).frames > 0
    cases = [
        (np.zeros(2 * built["rate"], np.float32), item,
         f"item cross_rms_1: {prompt_wav}: silent prompt (RMS level -inf dBFS"),
        (None, item, f"item cross_rms_1: {prompt_wav}: the prompt audio file does not exist"),
        (built["prompt"], TestItem(**{**item.__dict__, "target_text": "?!... ---"}),
         "item cross_rms_1: text: text '?!... ---' has no word to speak"),
    ]
    for audio, bad_item, words in cases:
        prompt_wav.unlink(missing_ok=True)
        if audio is not None:
            sf.write(str(prompt_wav), audio, built["rate"], subtype="FLOAT")
        with pytest.raises(SynthesisInputError) as err:
            synthesize(bad_item)
        assert_one_line(str(err.value), f"{testlist}: {words}")


def test_batched_testlist_synthesis_writes_the_batch_one_audio(synth, built, tmp_path, capsys, monkeypatch):
    """--batch-size 3 over 4 items (a full batch and a remainder, both tasks): the same audio as
    one item at a time, each record marked with its batch (AR, and SyncSpeech's streams); with
    --timing-items 2, items 0 and 2 (floor(i 4 / 2)) are decoded alone and are all timing.jsonl
    holds, the other two are one batch of 2 in batched.jsonl, and the audio is still batch 1's; a
    paradigm with no batched decoding falls back to batch 1 with a one-line notice."""
    prompts = tmp_path / "prompts"
    prompts.mkdir()
    items = []
    for i, sentence in enumerate(SENTENCES):
        task = "continuation" if i == 3 else "cross_sentence"
        item_id = f"{task[:5]}_rms_{i}"
        items.append(TestItem(item_id=item_id, task=task, speaker="rms", target_id=f"rms_{i}",
                              target_text=sentence if task == "cross_sentence" else "Please call the doctor now.",
                              target_duration=3.0, prompt_id="rms_0", prompt_start=0.0, prompt_end=2.0,
                              prompt_text=built["prompt_text"]))
        sf.write(str(prompts / f"{item_id}.wav"), built["prompt"], built["rate"], subtype="FLOAT")
    testlist = tmp_path / "list.tsv"
    testlist.write_text(to_tsv(items))
    sync = Synthesizer(built["syncspeech"], codec="offline", codec_model=str(built["codec"]), bpe_model=built["bpe"])
    for name, model, batch_size in [("ar", synth, 3), ("sync", sync, 2)]:
        synthesize_testlist(model, testlist, prompts, tmp_path / f"{name}_one", seed=5, progress=False)
        synthesize_testlist(model, testlist, prompts, tmp_path / f"{name}_batch", seed=5, progress=False,
                            batch_size=batch_size)
        for item in items:
            one, _ = sf.read(str(tmp_path / f"{name}_one" / f"{item.item_id}.wav"))
            batched, _ = sf.read(str(tmp_path / f"{name}_batch" / f"{item.item_id}.wav"))
            assert np.array_equal(one, batched), (name, item.item_id)
    def lines(folder, name):
        return [json.loads(line) for line in (tmp_path / folder / name).read_text().splitlines()]

    assert lines("ar_batch", "timing.jsonl") == []  # nothing decoded alone: no speed figures
    assert [r["batch_size"] for r in lines("ar_batch", "batched.jsonl")] == [3, 3, 3, 1]
    assert "batch_size" not in (tmp_path / "ar_one" / "timing.jsonl").read_text()
    assert not (tmp_path / "ar_one" / "batched.jsonl").exists() and len(lines("ar_one", "timing.jsonl")) == 4
    summary = synthesize_testlist(synth, testlist, prompts, tmp_path / "ar_timed", seed=5, progress=False,
                                  batch_size=3, timing_items=2)
    assert summary["items"] == 4 and summary["timed"] == 2
    timed = lines("ar_timed", "timing.jsonl")
    assert [r["item_id"] for r in timed] == [items[0].item_id, items[2].item_id]
    assert all("batch_size" not in r for r in timed)
    assert [(r["item_id"], r["batch_size"]) for r in lines("ar_timed", "batched.jsonl")] == [
        (items[1].item_id, 2), (items[3].item_id, 2)]
    for item in items:
        one, _ = sf.read(str(tmp_path / "ar_one" / f"{item.item_id}.wav"))
        assert np.array_equal(one, sf.read(str(tmp_path / "ar_timed" / f"{item.item_id}.wav"))[0]), item.item_id
    with pytest.raises(SynthesisInputError, match="timing-items"):
        synthesize_testlist(synth, testlist, prompts, tmp_path / "bad", seed=5, progress=False, batch_size=2,
                            timing_items=-1)
    # a paradigm without batched decoding (generate_batch is optional; every one in src has it):
    # one item at a time, each timed, with a one-line notice, and the same audio
    monkeypatch.setattr(synth.model, "generate_batch", None)
    capsys.readouterr()
    summary = synthesize_testlist(synth, testlist, prompts, tmp_path / "ar_alone", seed=5, progress=False,
                                  batch_size=2, timing_items=1)
    assert summary["timed"] == 4 and not (tmp_path / "ar_alone" / "batched.jsonl").exists()
    notice = capsys.readouterr().err
    assert_one_line(notice.strip(), "--batch-size 2", "generate_batch", "one item at a time")
    for item in items:
        one, _ = sf.read(str(tmp_path / "ar_one" / f"{item.item_id}.wav"))
        assert np.array_equal(one, sf.read(str(tmp_path / "ar_alone" / f"{item.item_id}.wav"))[0]), item.item_id


def test_a_transcript_far_shorter_than_its_prompt_is_refused(synth, built):
    """Eq. 11 at a 29 s prompt read as one word, for ~300 text tokens: over an hour of speech."""
    long_prompt = np.resize(built["prompt"], 29 * built["rate"])
    text = "the cat sat on the mat " * 20
    assert len(synth.bpe.encode(text)) <= MAX_TEXT_TOKENS
    with pytest.raises(SynthesisInputError) as err:
        synth.synthesize(text, long_prompt, "Please", built["rate"])
    assert_one_line(str(err.value), "is the prompt text the transcript of the prompt audio?")
    # target_frames is checked too
    for bad in (0, -3, 10**9, 2.5):
        with pytest.raises(SynthesisInputError, match="target_frames"):
            synth.synthesize("hello", built["prompt"], built["prompt_text"], built["rate"], target_frames=bad)
    out, record = synth.synthesize("hello", built["prompt"], built["prompt_text"], built["rate"], target_frames=7)
    assert record["generated_frames"] == 7


def test_a_paradigms_own_input_refusal_is_one_line(synth, built, monkeypatch):
    """A paradigm with inputs of its own (CoD's phonemes) refuses text in prepare_request with a
    ValueError: it reaches the caller as a SynthesisInputError."""
    def no_phonemes(request, *, text, **_):
        raise ValueError(f"CoD: text {text!r} has no phonemes")

    monkeypatch.setattr(synth.model, "prepare_request", no_phonemes, raising=False)
    with pytest.raises(SynthesisInputError, match="has no phonemes"):
        synth.synthesize("你好", built["prompt"], built["prompt_text"], built["rate"])


def test_unknown_decoding_options_are_refused_before_synthesis(built):
    with pytest.raises(SynthesisInputError, match=r"decoding options \['steps'\] are not options of the 'ar'"):
        Synthesizer(built["ar"], codec="offline", codec_model=str(built["codec"]), bpe_model=built["bpe"],
                    decoding={"steps": 8})


# ----------------------------------------------------------------------------- timing record, prompt alignment

class SimulatedTime:
    """``time.perf_counter`` of synthesis and of the paradigms that moves only when told:
    ``pass_seconds`` per backbone call, ``decode_seconds`` per codec decoding."""

    def __init__(self, monkeypatch, synth: Synthesizer, pass_seconds: float, decode_seconds: float):
        import types

        import arnar.paradigms.ar
        import arnar.paradigms.syncspeech
        import arnar.synthesize

        self.now = 0.0
        fake = types.SimpleNamespace(perf_counter=lambda: self.now)
        for module in (arnar.synthesize, arnar.paradigms.ar, arnar.paradigms.syncspeech):
            monkeypatch.setattr(module, "time", fake)
        self.hook = synth.model.backbone.register_forward_hook(lambda *_: self.advance(pass_seconds))
        decode = synth._decode

        def timed_decode(*args):
            self.advance(decode_seconds)
            return decode(*args)

        monkeypatch.setattr(synth, "_decode", timed_decode)

    def advance(self, seconds: float) -> None:
        self.now += seconds


def fixed_durations(synth: Synthesizer, frames: int) -> None:
    """SyncSpeech's duration head says ``frames`` whatever it sees."""
    head = synth.model.duration_head
    with torch.no_grad():
        head.weight.zero_()
        head.bias.fill_(-1e4)
        head.bias[frames] = 0.0


def one_item_testlist(tmp_path, built, text: str) -> tuple[Path, Path]:
    """A cross-sentence list of one item whose prompt is the first 2 s of rms_0 ("Please call")."""
    prompts = tmp_path / "prompts"
    prompts.mkdir(exist_ok=True)
    sf.write(str(prompts / "cross_rms_1.wav"), built["prompt"], built["rate"], subtype="FLOAT")
    item = TestItem(item_id="cross_rms_1", task="cross_sentence", speaker="rms", target_id="rms_1", target_text=text,
                    target_duration=3.0, prompt_id="rms_0", prompt_start=0.0, prompt_end=2.0,
                    prompt_text=built["prompt_text"])
    testlist = tmp_path / "cross_sentence.tsv"
    testlist.write_text(to_tsv([item]))
    return testlist, prompts


def test_timing_records_give_the_hand_worked_latencies(built, tmp_path, monkeypatch):
    """`arnar synthesize` on a simulated clock (30 ms a forward pass, 0.5 s a codec decoding), then
    the evaluation's speed summary (d_LLM = 25 ms), for SyncSpeech and AR with 4-token packets.

    SyncSpeech (q = 1), every duration 2: the first packet is spans 1 and 2, c = 3 passes, so
    FPL-A = 0.09 s; it started after q + 1 = 2 text tokens and had read 3 when the packet was
    complete: FPL-L (Eq. 7) = 2 x 0.025 + 0.09 = 0.14, waited 3 x 0.025 + 0.09 = 0.165.
    AR (min_ratio 2, so no <eos> before 2L >= 4 tokens): token k exists after pass k, FPL-A =
    4 x 0.03 = 0.12; it reads all L text tokens first: FPL-L = waited = L x 0.025 + 0.12.
    The codec's decoding of the first packet (0.5 s) is in neither, a column of its own."""
    from arnar.evaluate.run import speed_summary

    text = SENTENCES[1]
    testlist, prompts = one_item_testlist(tmp_path, built, text)
    records = {}
    for paradigm, decoding in (("syncspeech", {"chunk_size": 4}), ("ar", {"max_ratio": AR_MAX_RATIO, "chunk_size": 4})):
        synth = Synthesizer(built[paradigm], codec="offline", codec_model=str(built["codec"]), bpe_model=built["bpe"],
                            decoding=decoding)
        if paradigm == "syncspeech":
            fixed_durations(synth, 2)
        SimulatedTime(monkeypatch, synth, pass_seconds=0.03, decode_seconds=0.5)
        out = tmp_path / paradigm
        synthesize_testlist(synth, testlist, prompts, out, seed=0, progress=False)
        (records[paradigm],) = [json.loads(line) for line in (out / "timing.jsonl").read_text().splitlines()]
        monkeypatch.undo()
    L = len(synth.bpe.encode(text))
    assert L >= 3

    sync = records["syncspeech"]
    assert sync["first_packet_passes"] == 3 and sync["forward_passes"] == L + 1
    assert sync["fpl_a"] == pytest.approx(0.09) and sync["first_packet_decode_seconds"] == pytest.approx(0.5)
    assert (sync["text_tokens_to_start"], sync["text_tokens_waited"]) == (2, 3)
    assert sync["token_seconds"] == pytest.approx((L + 1) * 0.03) and sync["prompt_ends"] == "uniform"
    speed = speed_summary({"i": sync}, {"i": 3.0}, d_llm=0.025)
    assert speed["fpl_a"] == pytest.approx(0.09) and speed["first_packet_decode"] == pytest.approx(0.5)
    assert speed["fpl_l"] == pytest.approx(0.14) and speed["fpl_l_waited"] == pytest.approx(0.165)

    ar = records["ar"]
    assert ar["first_packet_passes"] == 4 and ar["fpl_a"] == pytest.approx(0.12)
    assert ar["first_packet_decode_seconds"] == pytest.approx(0.5)
    assert ar["text_tokens_to_start"] == ar["text_tokens_waited"] == L and "prompt_ends" not in ar
    speed = speed_summary({"i": ar}, {"i": 3.0}, d_llm=0.025)
    assert speed["fpl_l"] == speed["fpl_l_waited"] == pytest.approx(L * 0.025 + 0.12)


def test_prompt_clip_words_hand_worked():
    from arnar.align.base import Interval

    from arnar.synthesize import prompt_clip_words

    words = [Interval("others", 0.1, 0.4), Interval("fell", 0.5, 0.8), Interval("among", 0.9, 1.3),
             Interval("the", 1.35, 1.5), Interval("thorns", 1.55, 2.9), Interval("and", 3.05, 3.2)]
    # a continuation prompt [0, 3] reads the five words that end inside it
    assert prompt_clip_words(words, "Others fell among the thorns", 0.0, 3.0) == words[:5]
    # a clip from 0.45 s: times from its start, the word running past its end cut there
    got = prompt_clip_words(words, "fell among the thorns", 0.45, 1.6)
    assert [w.symbol for w in got] == ["fell", "among", "the", "thorns"]
    assert [(round(w.start, 6), round(w.end, 6)) for w in got] == [(0.05, 0.35), (0.45, 0.85), (0.9, 1.05),
                                                                   (1.1, 1.15)]
    # spoken words, not whitespace words: "well-known" is two, "&" none (as the aligner sees them)
    pairs = [Interval("well", 0.0, 0.2), Interval("known", 0.2, 0.5), Interval("facts", 0.6, 0.9)]
    assert prompt_clip_words(pairs, "Well-known & facts", 0.0, 1.0) == pairs
    assert prompt_clip_words(pairs, "well known facts and more", 0.0, 1.0) is None  # too few words


def test_prompt_ends_come_from_the_prompt_alignment(built, tmp_path, caplog):
    """With the aligner's JSONL the SyncSpeech prompt's a_n follow the alignment (by the training
    durations' rules) and the record says "aligned"; without the recording in it, or with words
    that are not the transcript's, they are uniform and the record says so.

    Hand-made alignment of the 2 s prompt "Please call": "please" 0.1-0.5 s, "call" 0.8-1.2 s.
    "please" owns its pause, up to where "call" starts: its last piece ends at 0.8 s = frame
    round(0.8 T / 2); "call" runs to the end of the clip, frame T."""
    from arnar.align.base import Alignment, Interval, alignment_to_json

    testlist, prompts = one_item_testlist(tmp_path, built, SENTENCES[1])
    synth = Synthesizer(built["syncspeech"], codec="offline", codec_model=str(built["codec"]), bpe_model=built["bpe"])
    seen = []
    generate = synth.model.generate

    def spy(request, generator, **decoding):
        seen.append(request.features.get("prompt_ends"))
        return generate(request, generator, **decoding)

    synth.model.generate = spy  # this test's own Synthesizer
    clip = synth.prompt_clip(built["prompt"], built["rate"])
    T, seconds = len(synth.prompt_codes(clip)), len(clip) / synth.codec.sample_rate
    pieces = synth.bpe.encode_with_words(built["prompt_text"])
    last_of_please = max(n for n, (_, word) in enumerate(pieces) if word == 0)

    def run(words, utt="rms_0"):
        path = tmp_path / "test.jsonl"
        alignment = Alignment(utt, [Interval(*w) for w in words], [], 3.0)
        path.write_text(json.dumps(alignment_to_json(alignment)) + "\n")
        seen.clear()
        synthesize_testlist(synth, testlist, prompts, tmp_path / "out", seed=0, progress=False, prompt_alignments=path)
        record = json.loads((tmp_path / "out" / "timing.jsonl").read_text())
        return seen[0], record["prompt_ends"]

    ends, used = run([("please", 0.1, 0.5), ("call", 0.8, 1.2)])
    assert used == "aligned" and len(ends) == len(pieces)
    assert int(ends[last_of_please]) == math.floor(0.8 * T / seconds + 0.5) and int(ends[-1]) == T
    assert ends.tolist() == sorted(ends.tolist())
    with caplog.at_level("WARNING", logger="arnar.synthesize"):
        assert run([("please", 0.1, 0.5), ("call", 0.8, 1.2)], utt="rms_3") == (None, "uniform")
        assert "rms_0 is not in" in caplog.text
        ends, used = run([("police", 0.1, 0.5), ("call", 0.8, 1.2)])
        assert (ends, used) == (None, "uniform") and "does not fit" in caplog.text
    synthesize_testlist(synth, testlist, prompts, tmp_path / "out", seed=0, progress=False)  # no file
    assert json.loads((tmp_path / "out" / "timing.jsonl").read_text())["prompt_ends"] == "uniform"
    with pytest.raises(SynthesisInputError, match="no such file"):
        synthesize_testlist(synth, testlist, prompts, tmp_path / "out", seed=0, progress=False,
                            prompt_alignments=tmp_path / "missing.jsonl")


# ----------------------------------------------------------------------------- command lines

def run_cli(main, argv, capsys) -> tuple[int, str]:
    capsys.readouterr()
    code = main(argv)
    err = capsys.readouterr().err
    return code, err


def synthesize_argv(built, tmp_path, **flags) -> list[str]:
    argv = ["synthesize", "--run-dir", str(built["ar"]), "--codec", "offline", "--codec-model", str(built["codec"]),
            "--text-units", str(built["bpe"]), "--decoding", json.dumps({"max_ratio": AR_MAX_RATIO})]
    options = {"text": "hello there", "prompt-wav": str(built["prompt_wav"]), "prompt-text": built["prompt_text"],
               "out": str(tmp_path / "out.wav"), **flags}
    for name, value in options.items():
        if value is not None:
            argv += [f"--{name}", value]
    return argv


def test_cli_synthesize_gives_one_line_errors(built, tmp_path, capsys):
    code, err = run_cli(cli_main, synthesize_argv(built, tmp_path), capsys)
    assert code == 0 and sf.info(str(tmp_path / "out.wav")).frames > 0, err

    corrupt = tmp_path / "corrupt.wav"
    corrupt.write_bytes(b"RIFF\x10\x00\x00\x00WAVEfmt garbage")
    long_wav = tmp_path / "five_minutes.wav"
    sf.write(str(long_wav), np.zeros(300 * 8000, np.float32), 8000, subtype="PCM_16")
    silent = tmp_path / "three_seconds_of_silence.wav"
    sf.write(str(silent), np.zeros(3 * 16000, np.float32), 16000, subtype="PCM_16")
    cases = [
        ({"text": ""}, ["--text: text ''", "nothing to speak"]),
        ({"text": "?!... ---"}, ["--text: text '?!... ---' has no word to speak", "nothing to speak"]),
        ({"text": "word " * 2000}, ["--text:", "BPE tokens", "split it into sentences"]),
        ({"prompt-wav": str(corrupt)}, [str(corrupt), "unreadable audio"]),
        ({"prompt-wav": str(long_wav)}, [str(long_wav), "300.0 s long"]),
        ({"prompt-wav": str(silent)}, [f"{silent}: silent prompt (RMS level -inf dBFS", "-60 dBFS"]),
        ({"prompt-wav": str(tmp_path / "missing.wav")},
         [f"{tmp_path / 'missing.wav'}: the prompt audio file does not exist"]),
        ({"prompt-wav": str(tmp_path)}, [f"{tmp_path}: a folder, not a prompt audio file"]),
        ({"prompt-text": " "}, ["--prompt-text:"]),
        ({"prompt-text": None}, ["missing: --prompt-text"]),
        ({"out": str(tmp_path / "no" / "such" / "out.wav")}, ["--out", "no such folder"]),
        ({"text": "\udcff"}, ["--text:", "Unicode"]),  # an argv byte that is not UTF-8
        ({"prompt-alignments": str(tmp_path / "test.jsonl")}, ["--prompt-alignments needs --testlist"]),
    ]
    for flags, words in cases:
        code, err = run_cli(cli_main, synthesize_argv(built, tmp_path, **flags), capsys)
        assert code == 2, (flags, err)
        assert_one_line(err.strip(), "arnar synthesize: error: ", *words)
    # a run folder without a model, and --decoding that is not an object
    argv = synthesize_argv(built, tmp_path)
    code, err = run_cli(cli_main, [*argv[:2], str(tmp_path), *argv[3:]], capsys)
    assert code == 2 and "no such checkpoint" in err
    assert_one_line(err.strip())
    code, err = run_cli(cli_main, [*synthesize_argv(built, tmp_path), "--decoding", "[1]"], capsys)
    assert code == 2 and "expected a JSON object" in err
    assert_one_line(err.strip())
    # a quiet prompt passes a lower --silence-dbfs
    quiet = tmp_path / "quiet.wav"
    sf.write(str(quiet), level(built["prompt"], -65.0), built["rate"], subtype="FLOAT")
    code, err = run_cli(cli_main, synthesize_argv(built, tmp_path, **{"prompt-wav": str(quiet)}), capsys)
    assert code == 2 and "RMS level -65.0 dBFS" in err
    code, err = run_cli(cli_main, [*synthesize_argv(built, tmp_path, **{"prompt-wav": str(quiet)}),
                                   "--silence-dbfs", "-70"], capsys)
    assert code == 0, err


def stream_argv(built, tmp_path, **flags) -> list[str]:
    argv = ["--run-dir", str(built["syncspeech"]), "--codec", "offline", "--codec-model", str(built["codec"]),
            "--text-units", str(built["bpe"]), "--d-llm", "0", "--out-dir", str(tmp_path / "stream")]
    options = {"prompt-wav": str(built["prompt_wav"]), "prompt-text": built["prompt_text"], "text": "hello there",
               **flags}
    for name, value in options.items():
        if value is not None:
            argv += [f"--{name}", value]
    return argv


def test_stream_gives_one_line_errors(built, tmp_path, capsys, monkeypatch):
    code, err = run_cli(stream_main, stream_argv(built, tmp_path), capsys)
    assert code == 0 and sf.info(str(tmp_path / "stream" / "stream.wav")).frames > 0, err
    # a 0.1 s prompt (of speech: the clip opens with silence) at 8 kHz, stereo, and text in other
    # scripts and emoji: audio too
    short = tmp_path / "short.wav"
    sf.write(str(short), np.stack([built["prompt"][::2][4000:4800]] * 2, axis=1), 8000, subtype="PCM_16")
    code, err = run_cli(stream_main, stream_argv(built, tmp_path, **{"prompt-wav": str(short),
                                                                     "text": "Привет 😀 你好 42%"}), capsys)
    assert code == 0 and sf.info(str(tmp_path / "stream" / "stream.wav")).frames > 0, err

    corrupt = tmp_path / "corrupt.wav"
    corrupt.write_bytes(b"\x00" * 100)
    silent = tmp_path / "silent.wav"
    sf.write(str(silent), np.zeros(2 * 16000, np.float32), 16000, subtype="PCM_16")
    cases = [
        ({"text": ""}, ["--text: text ''", "nothing to speak"]),
        ({"text": " \t "}, ["--text:", "nothing to speak"]),
        ({"text": "?!... ---"}, ["--text: text '?!... ---' has no word to speak", "nothing to speak"]),
        ({"text": "😀" * 10_000}, ["--text:", "BPE tokens"]),
        ({"prompt-wav": str(corrupt)}, [str(corrupt), "unreadable audio"]),
        ({"prompt-wav": str(tmp_path / "missing.wav")},
         [f"{tmp_path / 'missing.wav'}: the prompt audio file does not exist"]),
        ({"prompt-wav": str(silent)}, [f"{silent}: silent prompt (RMS level -inf dBFS"]),
        ({"prompt-text": ""}, ["--prompt-text:"]),
    ]
    for flags, words in cases:
        code, err = run_cli(stream_main, stream_argv(built, tmp_path, **flags), capsys)
        assert code == 2, (flags, err)
        assert_one_line(err.strip(), "arnar stream: error: ", *words)
    # text from stdin that never comes, or has no word to speak: refused as empty text is, no audio
    for text in ("", "?!... ---\n"):
        out = tmp_path / f"stdin_{len(text)}"
        monkeypatch.setattr("sys.stdin", io.StringIO(text))
        code, err = run_cli(stream_main, [*stream_argv(built, tmp_path, text=None), "--out-dir", str(out)], capsys)
        assert code == 2 and "nothing to speak" in err
        assert_one_line(err.strip())
        assert not list(out.glob("*.wav"))


@settings(PROPERTY, max_examples=200)
@given(words=st.lists(st.sampled_from(["?!", "...", "---", "😀", "«", "hello", "42", "%", "你好", "a"]),
                      max_size=8))
def test_stdin_words_wait_for_the_first_word_to_speak(words):
    """Words before the first one to speak are held back, then released with it; input without one
    is refused as empty text is. Nothing past the first word to speak is read before it is out."""
    pulled = []

    def source():
        for word in words:
            pulled.append(word)
            yield word

    first = next((k for k, word in enumerate(words) if has_a_word(word)), None)
    released = from_first_speakable(source(), speakable, lambda text: f"stdin: text {text!r}: nothing to speak")
    if first is None:
        with pytest.raises(StreamError, match="nothing to speak"):
            next(released)
        return
    assert next(released) == words[0] and pulled == words[: first + 1]
    assert [words[0], *released] == words


def test_stdin_text_is_cut_off_at_the_limit_as_it_arrives():
    """stdin is read lazily, so its limit is enforced on arrival: every token up to the limit
    passes, the next one stops the stream (never a read of the whole input first)."""
    pulled = []

    def source():
        for k in range(100):
            pulled.append(k)
            yield k

    tokens = at_most(source(), 7)
    assert [next(tokens) for _ in range(7)] == list(range(7))
    with pytest.raises(StreamError, match="passed 7 BPE tokens"):
        next(tokens)
    assert pulled == list(range(8))
    assert list(at_most(iter([1, 2]), 2)) == [1, 2]


def test_timed_positions_spread_over_the_list():
    """floor(i n / k): 20 items, 8 timed -> 0, 2, 5, 7, 10, 12, 15, 17; k >= n times all; 0 none."""
    from arnar.synthesize import timed_positions

    assert timed_positions(20, 8) == [0, 2, 5, 7, 10, 12, 15, 17]
    assert timed_positions(4, 2) == [0, 2]
    assert timed_positions(3, 5) == [0, 1, 2]
    assert timed_positions(6, 0) == [] and timed_positions(0, 3) == []


def test_cod_generates_and_speaks_the_whole_stack(built, tmp_path):
    """Chain-of-Details end to end on the real paths (issue 53): the engine resolves `codebooks:
    all` from the offline_rvq token manifest (2 codebooks here) and trains on both, and the
    synthesizer asks the codec for both, hands the model the prompt's whole stack and decodes
    the generated [2, T] codes: the audio is the codec's decoding of exactly those codes."""
    from arnar.codec import codec_info, load_codec, write_token_shards
    from arnar.evaluate.similarity import load_speaker_encoder
    from arnar.text.phonemes import PhonemeTokenizer
    from arnar.train import compose_config, train
    from arnar.train.checkpoints import load_model

    rvq = load_codec("offline_rvq", model=str(built["codec"]))
    assert rvq.n_codebooks == 2
    phonemes, speakers = PhonemeTokenizer(), load_speaker_encoder("resemblyzer")
    tokens, rows, features = {}, [], {}
    for voice in VOICES:
        for i, text in enumerate(SENTENCES):
            utt = f"{voice}_{i}"
            audio, rate = sf.read(str(built["root"] / f"{utt}.wav"), dtype="float32")
            codes = rvq.encode([audio], rate)[0]
            tokens[utt] = codes
            rows.append({"utt_id": utt, "frame_rate": rvq.frame_rate, "num_frames": codes.shape[1], "bpe_ids": [1],
                         "ends": [codes.shape[1]]})
            features[utt] = {"phonemes": torch.tensor(phonemes.encode(text)),
                             "speaker": torch.as_tensor(speakers.embed([audio], rate)[0], dtype=torch.float)}
    split = write_token_shards(tmp_path / "tokens", "train", tokens, codec_info(rvq))
    (tmp_path / "durations.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    torch.save(features, tmp_path / "features.pt")
    run = tmp_path / "cod"
    train(compose_config(["paradigm=cod", *TINY, f"data.features={tmp_path / 'features.pt'}"]),
          run_dir=run, train_tokens=split, train_durations=tmp_path / "durations.jsonl", bpe_model=built["bpe"])
    model, cfg = load_model(run)
    assert cfg.paradigm.options.codebooks == 2 and model.codebooks == 2

    synth = Synthesizer(run, codec="offline_rvq", codec_model=str(built["codec"]), bpe_model=built["bpe"],
                        decoding={"steps": 2})
    assert synth.codebooks == 2 and synth.codec.n_codebooks == 2
    job = synth.prepare("The river runs.", built["prompt"], built["prompt_text"], built["rate"])
    assert tuple(job.request.prompt_acoustic.shape) == (1, len(job.request.prompt_speech))
    assert torch.equal(torch.stack([job.request.prompt_speech, job.request.prompt_acoustic[0]]), job.prompt_codes)
    generation = synth.model.generate(job.request, torch.Generator().manual_seed(0), **synth.decoding)
    assert generation.speech.shape[0] == 2 and int(generation.speech.max()) < rvq.codebook_size
    audio, record = synth.finish(job, generation, token_seconds=0.0)
    expected = synth.codec.decode([generation.speech.numpy()], prompt_audio=[job.prompt])[0]
    np.testing.assert_allclose(audio, expected, rtol=0, atol=1e-6)
    assert record["codebooks"] == 2 and record["generated_frames"] == generation.speech.shape[1]

    # the ladder's level-forced rung on the same run: one cross-sentence item whose target is a
    # clip of the corpus. Forcing all 3 levels gives back the target's own first quantizer (every
    # code right, no MaskGIT pass); forcing none is the free-running chain, which a 2-update model
    # does not get right
    from arnar.evaluate.ladder import level_forced_testlist
    from arnar.evaluate.testlists import COLUMNS

    target_wav, target_text = built["root"] / "slt_1.wav", SENTENCES[1]
    info = sf.info(str(target_wav))
    row = {"item_id": "cross_slt_1", "task": "cross_sentence", "speaker": "slt", "target_id": "slt_1",
           "target_text": target_text, "target_duration": str(info.frames / info.samplerate), "prompt_id": "rms_0",
           "prompt_start": "0.0", "prompt_end": "2.0", "prompt_text": built["prompt_text"]}
    testlist = tmp_path / "cross_sentence.tsv"
    testlist.write_text("\t".join(COLUMNS) + "\n" + "\t".join(row[c] for c in COLUMNS) + "\n")
    for folder, wav in (("prompts", None), ("targets", target_wav)):
        (tmp_path / folder).mkdir()
        if wav is None:
            sf.write(str(tmp_path / folder / "cross_slt_1.wav"), built["prompt"], built["rate"])
        else:
            shutil.copy(wav, tmp_path / folder / "cross_slt_1.wav")
    accuracy = {}
    for forced in (3, 0):
        out = tmp_path / f"forced{forced}"
        summary = level_forced_testlist(synth, testlist, tmp_path / "prompts", tmp_path / "targets", out,
                                        forced_levels=forced, progress=False)
        assert (out / "cross_slt_1.wav").exists() and json.loads((out / "ladder.json").read_text()) == summary
        assert summary["rung"] == "level_forced" and summary["forced_levels"] == forced and summary["items"] == 1
        accuracy[forced] = summary["accuracy"]
    assert accuracy[3] == 1.0 and accuracy[0] < 0.5
    with pytest.raises(ValueError, match="level-forced rung reads Chain-of-Details"):
        level_forced_testlist(Synthesizer(built["ar"], codec="offline", codec_model=str(built["codec"]),
                                          bpe_model=built["bpe"]), testlist, tmp_path / "prompts",
                              tmp_path / "targets", tmp_path / "ar", forced_levels=1, progress=False)
