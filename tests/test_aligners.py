"""Tests of the aligner backends (arnar.align: base, pocketsphinx_aligner, mfa, oracle).

pocketsphinx aligns real synthetic speech: utterances of the embedded mini corpus, scored
against the synthesizers' own timings, and sentences synthesized here with flite. MFA cannot
run here (Kaldi comes from conda-forge only), so its tests check everything up to the
``mfa`` binary: the corpus layout and dictionary written, the command lines, the TextGrid
parser on long- and short-format files written here, the unavailable error, and the run/parse
path through a small stand-in script that mimics MFA's command-line contract (it writes
evenly spaced TextGrids; it is a test double, not an aligner).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
import wave
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from arnar.align import (
    AlignItem,
    Aligner,
    AlignerUnavailableError,
    Alignment,
    AlignmentFailure,
    Interval,
    alignment_from_json,
    alignment_to_json,
    check_alignment,
    items_from_cuts,
    load_aligner,
    spoken_words,
)
from arnar.align import mfa as mfa_mod
from arnar.align.oracle import oracle_alignment

ROOT = Path(__file__).resolve().parents[1]
MINI = ROOT / "data" / "mini"


def _speech_like(seconds: float, rate: int = 16_000) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    phase = 2 * np.pi * np.cumsum(120 + 30 * np.sin(2 * np.pi * 3 * t)) / rate
    x = sum(np.sin(k * phase) / k for k in range(1, 6))
    return (0.3 * x / np.abs(x).max()).astype(np.float32)


# --------------------------------------------------------------------------- base


def test_spoken_words_normalisation():
    assert spoken_words("Don't -- the snow-blinded sons' CAFÉ, 42!") == [
        "don't", "the", "snow", "blinded", "sons", "café", "42",
    ]  # fmt: skip
    assert spoken_words(" -- ... ") == []
    assert spoken_words("\u201cIt\u2019s\u201d \u2014 fine.") == ["it's", "fine"]


def test_spoken_words_fit_the_duration_module():
    # arnar.align.durations maps aligned words back onto the text's words: our naming must fit
    from arnar.align import durations
    from arnar.text.normalize import normalize_text

    # aligned word i spans [i, i + 0.5]; a text word's span is the union of its aligned words, and
    # a text word with no letters or digits ("--", "&") has none
    expected = {
        "Hello, well-known world!": [(0, 0.5), (1, 2.5), (3, 3.5)],  # hello | well known | world
        "Don't stop -- sons' wives & 42 cafés.": [
            (0, 0.5), (1, 1.5), None, (2, 2.5), (3, 3.5), None, (4, 4.5), (5, 5.5)],
        "U.S. e.g. x": [(0, 1.5), (2, 3.5), (4, 4.5)],  # u s | e g | x
    }
    for text, want in expected.items():
        words = spoken_words(text)
        aligned = [Interval(w, i, i + 0.5) for i, w in enumerate(words)]
        spans = durations.word_spans(normalize_text(text).split(" "), aligned)
        assert spans == want, text
    # an aligner that names a word differently is refused, not silently matched
    with pytest.raises(durations.DurationError, match="do not match"):
        durations.word_spans(["well-known"], [Interval("well", 0, 1), Interval("know", 1, 2)])


def test_json_round_trip_and_rounding():
    a = Alignment(
        "u1",
        [Interval("hello", 0.123456, 0.5), Interval("world", 0.61, 1.00004)],
        [Interval("HH", 0.123456, 0.2), Interval("W", 0.61, 0.7)],
        1.23456789,
    )
    d = alignment_to_json(a)
    assert d == {
        "utt_id": "u1",
        "duration": 1.2346,
        "words": [["hello", 0.1235, 0.5], ["world", 0.61, 1.0]],
        "phones": [["HH", 0.1235, 0.2], ["W", 0.61, 0.7]],
    }
    b = alignment_from_json(json.loads(json.dumps(d)))
    assert alignment_to_json(b) == d and b.words[1] == Interval("world", 0.61, 1.0)
    with pytest.raises(ValueError):
        alignment_from_json({"utt_id": "x", "words": [["a", 0]]})


def test_check_alignment_finds_problems():
    bad = Alignment("u", [Interval("a", 0.5, 0.4), Interval("b", 0.3, 2.0)], [], 1.0)
    problems = check_alignment(bad)
    assert any("start 0.5 > end" in p for p in problems)
    assert any("outside" in p for p in problems)
    assert any("before the previous end" in p for p in problems)


def test_load_aligner_unknown():
    with pytest.raises(ValueError, match="pocketsphinx"):
        load_aligner("nope")


# --------------------------------------------------------------------------- pocketsphinx


@pytest.fixture(scope="module")
def sphinx():
    aligner = load_aligner("pocketsphinx")
    assert isinstance(aligner, Aligner)
    return aligner


def _mini_items(n_per_speaker: int = 2) -> list[AlignItem]:
    manifest = MINI / "manifests" / "test_cuts.jsonl"
    if not manifest.is_file():
        pytest.skip(f"the embedded mini corpus is not built ({manifest} missing)")
    items = items_from_cuts(manifest, root=ROOT)
    chosen, count = [], {}
    for item in items:
        speaker = item.utt_id.split("_")[0]
        if count.get(speaker, 0) < n_per_speaker:
            chosen.append(item)
            count[speaker] = count.get(speaker, 0) + 1
    return chosen


def test_pocketsphinx_matches_oracle_on_mini_corpus(sphinx):
    items = _mini_items(2)  # 4 held-out voices (festival and flite), 2 utterances each
    results = sphinx.align_batch(items, progress=False)
    errors = []
    for item, result in zip(items, results):
        assert isinstance(result, Alignment), result
        assert not check_alignment(result)
        assert [w.symbol for w in result.words] == spoken_words(item.text)
        assert result.phones and all(p.symbol.isalpha() and p.symbol.isupper() for p in result.phones)
        assert result.duration == pytest.approx(sf.info(str(item.audio_path)).duration, abs=1e-3)
        oracle = oracle_alignment(item.utt_id, item.oracle)
        assert [w.symbol for w in oracle.words] == [w.symbol for w in result.words]
        errors += [abs(a.start - b.start) for a, b in zip(result.words, oracle.words)]
        errors += [abs(a.end - b.end) for a, b in zip(result.words, oracle.words)]
    errors_ms = 1000 * np.array(errors)
    # Measured on the whole test split: median 10.7 ms, mean 14.8 ms (see the module docs).
    assert np.median(errors_ms) <= 20.0
    assert np.mean(errors_ms <= 50.0) >= 0.85


# Word -> phone count in flite's (cmulex) pronunciation, to cut flite's phone timings into words.
FLITE_SENTENCES = [
    ("Please call the doctor before noon tomorrow.", [4, 3, 2, 5, 5, 3, 6]),
    ("The children walked to school in the morning.", [2, 7, 4, 2, 4, 2, 2, 5]),
]


@pytest.fixture(scope="module")
def flite_items(tmp_path_factory):
    if shutil.which("flite") is None:
        pytest.skip("needs the Debian package flite (apt-get install flite)")
    out = tmp_path_factory.mktemp("flite")
    items, references = [], []
    for i, (text, counts) in enumerate(FLITE_SENTENCES):
        wav = out / f"f{i}.wav"
        done = subprocess.run(
            ["flite", "-voice", "rms", "-psdur", "-t", text, "-o", str(wav)],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        phones, previous = [], 0.0
        for token in done.stdout.split():
            symbol, _, end = token.rpartition(":")
            phones.append((symbol, previous, float(end)))
            previous = float(end)
        speech = [p for p in phones if p[0] != "pau"]
        words = None
        if len(speech) == sum(counts):  # same lexicon as when the counts were written
            words, k = [], 0
            for c in counts:
                words.append((speech[k][1], speech[k + c - 1][2]))
                k += c
        items.append(AlignItem(f"f{i}", wav, text))
        references.append(words)
    # kal is an 8 kHz voice: the aligner resamples to 16 kHz
    wav = out / "kal.wav"
    subprocess.run(["flite", "-voice", "kal", "-t", FLITE_SENTENCES[0][0], "-o", str(wav)], check=True)
    assert sf.info(str(wav)).samplerate == 8000
    items.append(AlignItem("kal", wav, FLITE_SENTENCES[0][0]))
    references.append(None)
    return items, references


def test_pocketsphinx_aligns_flite_speech(sphinx, flite_items):
    items, references = flite_items
    results = sphinx.align_batch(items, progress=False)
    for item, result, reference in zip(items, results, references):
        assert isinstance(result, Alignment), result
        assert not check_alignment(result)
        assert [w.symbol for w in result.words] == spoken_words(item.text)
        assert result.words[0].start > 0.05  # flite starts with a pause
        assert all(w.end - w.start >= 0.03 for w in result.words)
        if reference is not None:
            err = [abs(w.start - b) + abs(w.end - e) for w, (b, e) in zip(result.words, reference)]
            assert np.median(err) / 2 <= 0.025, err


def test_pocketsphinx_deterministic_and_order_free(flite_items):
    items, _ = flite_items
    first = [alignment_to_json(a) for a in load_aligner("pocketsphinx").align_batch(items, progress=False)]
    backwards = load_aligner("pocketsphinx").align_batch(items[::-1], progress=False)[::-1]
    assert [alignment_to_json(a) for a in backwards] == first
    one = load_aligner("pocketsphinx")
    again = [alignment_to_json(one.align_batch([item], progress=False)[0]) for item in items[::-1]]
    assert again[::-1] == first
    # two processes give the same intervals, in the input's order
    parallel = load_aligner("pocketsphinx", workers=2).align_batch(items, progress=False)
    assert [alignment_to_json(a) for a in parallel] == first
    with pytest.raises(ValueError, match="workers"):
        load_aligner("pocketsphinx", workers=0)


def test_pocketsphinx_adds_out_of_vocabulary_words(sphinx, flite_items):
    items, _ = flite_items
    # "Zorblatt" is in neither dictionary: its phones come from the OOV fallback
    text = "Please call doctor Zorblatt before noon tomorrow."
    wav = items[0].audio_path.parent / "oov.wav"
    subprocess.run(["flite", "-voice", "rms", "-t", text, "-o", str(wav)], check=True)
    result = sphinx.align_batch([AlignItem("oov", wav, text)], progress=False)[0]
    assert isinstance(result, Alignment), result
    assert [w.symbol for w in result.words] == spoken_words(text)
    assert "zorblatt" in sphinx._prons


def test_pocketsphinx_failures_are_results_not_exceptions(sphinx, flite_items, tmp_path):
    rate = 16_000
    silent = tmp_path / "silent.wav"
    sf.write(str(silent), np.zeros(2 * rate, np.float32), rate)
    noise = tmp_path / "noise.wav"
    sf.write(str(noise), np.random.default_rng(1).normal(0, 0.1, 2 * rate).astype(np.float32), rate)
    short = tmp_path / "short.wav"
    sf.write(str(short), _speech_like(0.15), rate)
    garbage = tmp_path / "garbage.wav"
    garbage.write_bytes(b"this is not audio")
    speech = flite_items[0][0].audio_path  # 2.9 s of "Please call the doctor before noon tomorrow."
    items = [
        AlignItem("silent", silent, "hello world"),
        AlignItem("noise", noise, "hello world"),
        AlignItem("short", short, "a long sentence that cannot fit into so little audio"),
        AlignItem("garbage", garbage, "hello"),
        AlignItem("missing", tmp_path / "nope.wav", "hello"),
        AlignItem("empty", noise, " -- ... "),
        AlignItem("too_much_text", speech, " ".join(["stop and go and"] * 5)),
    ]
    results = sphinx.align_batch(items, progress=False)
    assert all(isinstance(r, AlignmentFailure) for r in results), results
    assert [r.utt_id for r in results] == [i.utt_id for i in items]
    kinds = [r.reason.split(" (")[0] for r in results]
    assert kinds == [
        "align: silent audio",
        "align: implausible alignment",  # noise is not speech: (nearly) every phone at its minimum
        "align: audio too short",
        "align: unreadable audio",
        "align: unreadable audio",
        "align: empty text",
        "align: no alignment found",
    ]
    # the aligner is still fine afterwards
    assert isinstance(sphinx.align_batch(flite_items[0][:1], progress=False)[0], Alignment)


def test_pocketsphinx_options():
    with pytest.raises(ValueError, match="16 kHz"):
        load_aligner("pocketsphinx", samprate=8000)
    with pytest.raises(FileNotFoundError):
        load_aligner("pocketsphinx", hmm="/nonexistent/model")
    aligner = load_aligner("pocketsphinx", time_offset=0.005, retry_beams=())
    assert aligner.settings["time_offset"] == 0.005 and aligner.settings["bestpath"] is False
    assert aligner.model_id.startswith("pocketsphinx-5")


# --------------------------------------------------------------------------- oracle


def test_oracle_from_festival_timings_with_a_compound(tmp_path):
    # festival-style timings: pau, schwa "ax", a hyphenated compound and a trailing apostrophe
    oracle = {
        "phones": [["pau", 0.0, 0.2], ["s", 0.2, 0.3], ["n", 0.3, 0.35], ["ow", 0.35, 0.5],
                   ["b", 0.5, 0.55], ["l", 0.55, 0.6], ["ay", 0.6, 0.7], ["n", 0.7, 0.75],
                   ["d", 0.75, 0.8], ["ih", 0.8, 0.85], ["d", 0.85, 0.9], ["pau", 0.9, 1.1],
                   ["s", 1.1, 1.2], ["ah1", 1.2, 1.3], ["n", 1.3, 1.35], ["z", 1.35, 1.4],
                   ["h#", 1.4, 1.5]],
        "words": [["Snow-blinded", 0.2, 0.9], ["sons'", 1.1, 1.4]],
    }  # fmt: skip
    wav = tmp_path / "o.wav"
    sf.write(str(wav), np.zeros(24_000, np.float32), 16_000)
    result = load_aligner("oracle").align_batch([AlignItem("o", wav, "Snow-blinded sons'.", oracle)])[0]
    assert isinstance(result, Alignment)
    assert result.duration == pytest.approx(1.5)
    assert [(w.symbol, w.start, w.end) for w in result.words] == [
        ("snow", 0.2, 0.5), ("blinded", 0.5, 0.9), ("sons", 1.1, 1.4)
    ]
    symbols = [p.symbol for p in result.phones]
    assert symbols[:3] == ["S", "N", "OW"] and "AH" in symbols
    assert not {"PAU", "H#", "SIL"} & set(symbols)
    assert not check_alignment(result)


def test_oracle_on_mini_corpus_and_missing_timings(tmp_path):
    items = _mini_items(1)
    results = load_aligner("oracle").align_batch(items)
    for item, result in zip(items, results):
        assert isinstance(result, Alignment)
        assert [w.symbol for w in result.words] == spoken_words(item.text)
        assert not check_alignment(result)
        assert "PAU" not in {p.symbol for p in result.phones}
    none = load_aligner("oracle").align_batch([AlignItem("x", tmp_path / "x.wav", "hi")])[0]
    assert isinstance(none, AlignmentFailure) and none.reason.startswith("align: no oracle timings")


# --------------------------------------------------------------------------- MFA: files


def _wav(path: Path, seconds: float = 1.0, rate: int = 16_000) -> Path:
    sf.write(str(path), _speech_like(seconds, rate), rate)
    return path


def test_mfa_corpus_layout_and_dictionary(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    stereo = src / "stereo.wav"
    sf.write(str(stereo), np.stack([_speech_like(1.0, 22_050)] * 2, axis=1), 22_050)
    items = [
        AlignItem("spkA_0001", _wav(src / "a1.wav"), "The snow-blinded sons' café, 42!"),
        AlignItem("spkA_0002", stereo, "Don't Zorblatt."),
        AlignItem("spkB_0001", _wav(src / "b1.wav"), "-- ..."),
        AlignItem("spkB_0002", src / "missing.wav", "hello"),
    ]
    entries, failures = mfa_mod.write_corpus(items, tmp_path / "corpus")
    corpus = tmp_path / "corpus"
    assert sorted(p.relative_to(corpus).as_posix() for p in corpus.rglob("*") if p.is_file()) == [
        "spkA/spkA_0001.lab", "spkA/spkA_0001.wav", "spkA/spkA_0002.lab", "spkA/spkA_0002.wav",
    ]  # fmt: skip
    assert (corpus / "spkA" / "spkA_0001.wav").is_symlink()  # mono WAV: linked, not copied
    converted = sf.info(str(corpus / "spkA" / "spkA_0002.wav"))  # stereo 22 kHz: converted
    assert (converted.channels, converted.samplerate) == (1, 16_000)
    lab = (corpus / "spkA" / "spkA_0001.lab").read_text(encoding="utf-8")
    assert lab == "the snow blinded sons café 42\n"
    assert [e.item.utt_id for e in entries] == ["spkA_0001", "spkA_0002"]
    assert [f.reason.split(" (")[0] for f in failures] == ["align: empty text", "align: unreadable audio"]

    path = tmp_path / "dict.txt"
    mfa_mod.write_dictionary((w for e in entries for w in e.words), path)
    lines = path.read_text(encoding="utf-8").splitlines()
    entries_by_word: dict[str, list[str]] = {}
    for line in lines:
        word, phones = line.split("\t")
        entries_by_word.setdefault(word, []).append(phones)
    assert sorted(entries_by_word) == sorted(
        ["the", "snow", "blinded", "sons", "café", "42", "don't", "zorblatt"]
    )
    assert "DH AH0" in entries_by_word["the"] and "DH IY0" in entries_by_word["the"]  # all CMUdict prons
    assert entries_by_word["snow"] == ["S N OW1"]
    assert entries_by_word["café"][0] == "K AH0 F EY1"  # looked up accent-folded
    assert entries_by_word["42"] == ["F AO1 R T IY1 T UW1"]  # fallback: stress 1 on vowels
    fallback = entries_by_word["zorblatt"][0].split()
    assert all(p[-1] == "1" for p in fallback if p[:-1] in mfa_mod._VOWELS)
    assert all(p[-1] != "1" for p in fallback if p[:-1] not in mfa_mod._VOWELS)


LONG_TEXTGRID = '''File type = "ooTextFile"
Object class = "TextGrid"

xmin = 0
xmax = 1.2
tiers? <exists>
size = 2
item []:
    item [1]:
        class = "IntervalTier"
        name = "words"
        xmin = 0
        xmax = 1.2
        intervals: size = 4
        intervals [1]:
            xmin = 0
            xmax = 0.1
            text = ""
        intervals [2]:
            xmin = 0.1
            xmax = 0.45
            text = "don't"
        intervals [3]:
            xmin = 0.45
            xmax = 1.0
            text = "stop"
        intervals [4]:
            xmin = 1.0
            xmax = 1.2
            text = ""
    item [2]:
        class = "IntervalTier"
        name = "phones"
        xmin = 0
        xmax = 1.2
        intervals: size = 10
        intervals [1]:
            xmin = 0
            xmax = 0.1
            text = "sil"
        intervals [2]:
            xmin = 0.1
            xmax = 0.2
            text = "D"
        intervals [3]:
            xmin = 0.2
            xmax = 0.35
            text = "OW1"
        intervals [4]:
            xmin = 0.35
            xmax = 0.4
            text = "N"
        intervals [5]:
            xmin = 0.4
            xmax = 0.45
            text = "T"
        intervals [6]:
            xmin = 0.45
            xmax = 0.5
            text = "sp"
        intervals [7]:
            xmin = 0.5
            xmax = 0.7
            text = "S"
        intervals [8]:
            xmin = 0.7
            xmax = 0.8
            text = "T"
        intervals [9]:
            xmin = 0.8
            xmax = 1.0
            text = "AA1"
        intervals [10]:
            xmin = 1.0
            xmax = 1.2
            text = ""
'''

SHORT_TEXTGRID = '''File type = "ooTextFile"
Object class = "TextGrid"

0
1.2
<exists>
2
"IntervalTier"
"spk1 - words"
0
1.2
3
0
0.5
"say ""hi"""
0.5
0.6
"sp"
0.6
1.2
"there"
"IntervalTier"
"spk1 - phones"
0
1.2
4
0
0.5
"EY2"
0.5
0.6
"spn"
0.6
0.9
"DH"
0.9
1.2
"EH0"
'''


def test_textgrid_long_format(tmp_path):
    path = tmp_path / "long.TextGrid"
    path.write_text(LONG_TEXTGRID, encoding="utf-8")
    grid = mfa_mod.read_textgrid(path)
    assert (grid.xmin, grid.xmax, [t.name for t in grid.tiers]) == (0.0, 1.2, ["words", "phones"])
    a = mfa_mod.textgrid_to_alignment("u", grid)
    assert [(w.symbol, w.start, w.end) for w in a.words] == [("don't", 0.1, 0.45), ("stop", 0.45, 1.0)]
    assert [p.symbol for p in a.phones] == ["D", "OW", "N", "T", "S", "T", "AA"]
    assert a.duration == 1.2 and not check_alignment(a)
    # the same file as UTF-16 with a byte-order mark (Praat's choice for non-ASCII text)
    path.write_bytes(LONG_TEXTGRID.encode("utf-16"))
    assert mfa_mod.read_textgrid(path) == grid


def test_textgrid_short_format(tmp_path):
    path = tmp_path / "short.TextGrid"
    path.write_text(SHORT_TEXTGRID, encoding="utf-8")
    grid = mfa_mod.read_textgrid(path)
    assert grid.tier("words").name == "spk1 - words"
    a = mfa_mod.textgrid_to_alignment("u", grid, duration=1.25)
    assert [w.symbol for w in a.words] == ['say "hi"', "there"]
    assert [(p.symbol, p.start) for p in a.phones] == [("EY", 0.0), ("DH", 0.6), ("EH", 0.9)]
    assert a.duration == 1.25


@pytest.mark.parametrize(
    "broken, message",
    [
        (LONG_TEXTGRID.replace('"TextGrid"', '"Pitch"'), "not a TextGrid"),
        (LONG_TEXTGRID.replace("xmax = 0.45\n            text", "xmax = 0.05\n            text", 1), "out of order"),
        (LONG_TEXTGRID.replace("intervals: size = 4", "intervals: size = 5"), "expected"),
        (LONG_TEXTGRID + "\n0.5\n", "after the last tier"),
        (SHORT_TEXTGRID.replace('"spk1 - phones"', '"spk1 - words"'), None),
        (LONG_TEXTGRID.replace("xmin = 0\n", "xmin = zero\n", 1), "unexpected text"),
    ],
)
def test_textgrid_parser_is_strict(broken, message):
    if message is None:  # parses, but the words tier is ambiguous
        with pytest.raises(mfa_mod.TextGridError, match="expected one tier"):
            mfa_mod.parse_textgrid(broken).tier("words")
    else:
        with pytest.raises(mfa_mod.TextGridError, match=message):
            mfa_mod.parse_textgrid(broken)


# --------------------------------------------------------------------------- MFA: commands


def test_mfa_unavailable_without_the_command(monkeypatch):
    monkeypatch.setattr(mfa_mod.shutil, "which", lambda name: None)
    with pytest.raises(AlignerUnavailableError) as err:
        load_aligner("mfa")
    message = str(err.value)
    assert "envs/align.yaml" in message and "snakemake --sdm conda" in message
    assert "conda-forge" in message


STAND_IN = '''#!{python}
"""Stand-in for MFA's `mfa` command (a test double): same CLI contract, evenly spaced output."""
import json, sys, wave
from pathlib import Path

here = Path(__file__).parent
with open(here / "calls.jsonl", "a") as log:
    log.write(json.dumps(sys.argv[1:]) + "\\n")
cmd = sys.argv[1]
if cmd == "version":
    print("3.4.3-standin")
    sys.exit(0)
if cmd == "train":
    corpus, dictionary, model = sys.argv[2:5]
    Path(model).write_text("trained")
    sys.exit(0)
assert cmd == "align", cmd
corpus, dictionary, model, output = map(Path, sys.argv[2:6])
if model.name == "missing_model":
    print("Loading corpus...", file=sys.stderr)
    print("Error: Could not find a model named missing_model", file=sys.stderr)
    sys.exit(2)
assert "--output_format" in sys.argv and "-j" in sys.argv
prons = {{}}
for line in dictionary.read_text(encoding="utf-8").splitlines():
    word, phones = line.split("\\t")
    prons.setdefault(word, phones.split())
short = "short" in sys.argv
for lab in sorted(corpus.rglob("*.lab")):
    words = lab.read_text(encoding="utf-8").split()
    if "unalignable" in words:
        continue
    missing = [w for w in words if w not in prons]
    if missing:
        print(f"Error: {{missing}} not in dictionary", file=sys.stderr)
        sys.exit(1)
    with wave.open(str(lab.with_suffix(".wav"))) as w:
        duration = w.getnframes() / w.getframerate()
    step = (duration - 0.2) / len(words)
    tiers = {{"words": [(0.0, 0.1, "")], "phones": [(0.0, 0.1, "sil")]}}
    for i, word in enumerate(words):
        b = 0.1 + i * step
        tiers["words"].append((b, b + step, word))
        n = len(prons[word])
        for k, p in enumerate(prons[word]):
            tiers["phones"].append((b + k * step / n, b + (k + 1) * step / n, p))
    tiers["words"].append((duration - 0.1, duration, ""))
    tiers["phones"].append((duration - 0.1, duration, "sil"))
    if short:
        out = ['File type = "ooTextFile"', 'Object class = "TextGrid"', "", "0", str(duration), "<exists>", "2"]
        for name, ivs in tiers.items():
            out += ['"IntervalTier"', f'"{{name}}"', "0", str(duration), str(len(ivs))]
            for b, e, t in ivs:
                out += [repr(b), repr(e), f'"{{t}}"']
    else:
        out = ['File type = "ooTextFile"', 'Object class = "TextGrid"', "", "xmin = 0",
               f"xmax = {{duration}}", "tiers? <exists>", "size = 2", "item []:"]
        for j, (name, ivs) in enumerate(tiers.items(), 1):
            out += [f"    item [{{j}}]:", '        class = "IntervalTier"', f'        name = "{{name}}"',
                    "        xmin = 0", f"        xmax = {{duration}}", f"        intervals: size = {{len(ivs)}}"]
            for i, (b, e, t) in enumerate(ivs, 1):
                out += [f"        intervals [{{i}}]:", f"            xmin = {{b!r}}",
                        f"            xmax = {{e!r}}", f'            text = "{{t}}"']
    target = output / lab.parent.name / (lab.stem + ".TextGrid")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("\\n".join(out) + "\\n", encoding="utf-8")
'''


@pytest.fixture()
def stand_in(tmp_path) -> Path:
    folder = tmp_path / "bin"
    folder.mkdir()
    script = folder / "mfa"
    script.write_text(STAND_IN.format(python=sys.executable), encoding="utf-8")
    script.chmod(0o755)
    return script


def _calls(stand_in: Path) -> list[list[str]]:
    return [json.loads(line) for line in (stand_in.parent / "calls.jsonl").read_text().splitlines()]


def test_mfa_command_lines(stand_in, tmp_path):
    aligner = load_aligner("mfa", executable=stand_in, num_jobs=3)
    assert aligner.model_id == "mfa-3.4.3-standin:english_us_arpa"
    c, d, o, w = (tmp_path / n for n in ("corpus", "dict.txt", "out", "work"))
    exe = str(stand_in)
    assert aligner.commands(c, d, o, w) == [
        [exe, "align", str(c), str(d), "english_us_arpa", str(o), "--clean", "--overwrite",
         "--output_format", "long_textgrid", "-j", "3"],
    ]  # fmt: skip
    assert load_aligner("mfa", executable=stand_in, workers=5).num_jobs == 5  # the CLI's name
    trainer = load_aligner("mfa", executable=stand_in, num_jobs=2, train_on_corpus=True,
                           extra_args=["--beam", "100"])  # fmt: skip
    model = str(w / "trained_acoustic_model.zip")
    assert trainer.commands(c, d, o, w) == [
        [exe, "train", str(c), str(d), model, "--clean", "-j", "2"],
        [exe, "align", str(c), str(d), model, str(o), "--clean", "--overwrite",
         "--output_format", "long_textgrid", "-j", "2", "--beam", "100"],
    ]  # fmt: skip
    assert trainer.model_id == "mfa-3.4.3-standin:trained-on-corpus"


def _mfa_items(tmp_path: Path) -> list[AlignItem]:
    src = tmp_path / "audio"
    src.mkdir()
    return [
        AlignItem("spk1_0001", _wav(src / "1.wav", 1.2), "Don't stop, well-known sons'!"),
        AlignItem("spk1_0002", _wav(src / "2.wav", 0.8), "Hello Zorblatt."),
        AlignItem("spk2_0001", _wav(src / "3.wav", 0.9), "This is unalignable."),
        AlignItem("spk2_0002", _wav(src / "4.wav", 0.5), "..."),
    ]


@pytest.mark.parametrize("fmt", ["long", "short"])
def test_mfa_run_and_parse_through_a_stand_in(stand_in, tmp_path, fmt):
    items = _mfa_items(tmp_path)
    extra = ["short"] if fmt == "short" else []  # makes the stand-in write short TextGrids
    work = tmp_path / "work"
    aligner = load_aligner("mfa", executable=stand_in, work_dir=work, num_jobs=2, extra_args=extra)
    results = aligner.align_batch(items, progress=False)
    assert [r.utt_id for r in results] == [i.utt_id for i in items]
    first, second, unaligned, empty = results
    assert isinstance(first, Alignment) and isinstance(second, Alignment)
    assert [w.symbol for w in first.words] == ["don't", "stop", "well", "known", "sons"]
    assert [w.symbol for w in second.words] == ["hello", "zorblatt"]
    assert first.duration == pytest.approx(1.2) and not check_alignment(first)
    assert first.phones[0].symbol == "D" and first.phones[1].symbol == "OW"  # stress stripped
    assert first.words[0].start == pytest.approx(0.1)  # leading "sil" dropped
    assert unaligned.reason.startswith("align: not aligned by MFA (no TextGrid for spk2/spk2_0001")
    assert empty.reason.startswith("align: empty text")
    grids = sorted(p.relative_to(work / "aligned").as_posix() for p in (work / "aligned").rglob("*.TextGrid"))
    assert grids == ["spk1/spk1_0001.TextGrid", "spk1/spk1_0002.TextGrid"]
    align_call = _calls(stand_in)[-1]
    assert align_call[:2] == ["align", str(work / "corpus")]


def test_mfa_train_path_and_temporary_work_dir(stand_in, tmp_path):
    items = _mfa_items(tmp_path)[:2]
    aligner = load_aligner("mfa", executable=stand_in, train_on_corpus=True)
    results = aligner.align_batch(items, progress=False)
    assert all(isinstance(r, Alignment) for r in results)
    calls = [c for c in _calls(stand_in) if c[0] != "version"]
    assert [c[0] for c in calls] == ["train", "align"]
    assert calls[1][3] == calls[0][3]  # aligned with the model it trained
    assert not Path(calls[0][1]).exists()  # the temporary work dir is gone


def test_mfa_failure_reports_stderr_tail(stand_in, tmp_path):
    aligner = load_aligner("mfa", executable=stand_in, acoustic_model="missing_model")
    with pytest.raises(mfa_mod.MfaError) as err:
        aligner.align_batch(_mfa_items(tmp_path)[:1], progress=False)
    message = str(err.value)
    assert "exit status 2" in message and "Could not find a model named missing_model" in message
    assert "mfa model download acoustic missing_model" in message


def test_mfa_word_mismatch_is_a_failure(stand_in, tmp_path):
    # A TextGrid whose words differ from the transcript (e.g. MFA's own text normalisation).
    aligner = load_aligner("mfa", executable=stand_in)
    entry = mfa_mod.CorpusEntry(AlignItem("u", tmp_path / "u.wav", "don't go"), "spk", "u", ["don't", "go"], 1.2)
    path = tmp_path / "u.TextGrid"
    path.write_text(LONG_TEXTGRID, encoding="utf-8")
    result = aligner._result(entry, path, tmp_path)
    assert isinstance(result, AlignmentFailure)
    assert result.reason.startswith("align: word sequence mismatch")
    path.write_text("not a textgrid", encoding="utf-8")
    assert aligner._result(entry, path, tmp_path).reason.startswith("align: bad TextGrid")


def test_stand_in_wav_is_readable_by_wave(tmp_path):
    # the corpus links the original WAV: the stand-in (like MFA) must be able to open it
    path = _wav(tmp_path / "x.wav", 0.3)
    with wave.open(str(path)) as w:
        assert w.getframerate() == 16_000


def test_align_yaml_environment():
    yaml = pytest.importorskip("yaml")
    env = yaml.safe_load((ROOT / "envs" / "align.yaml").read_text())
    deps = env["dependencies"]
    assert "conda-forge" in env["channels"] and "python=3.11" in deps
    assert any(str(d).startswith("montreal-forced-aligner=3.") for d in deps)
    pip = next(d["pip"] for d in deps if isinstance(d, dict))
    assert "-e .." in pip and "-r ../requirements.lock" in pip


def test_items_from_cuts_keeps_the_first_n_of_each_speaker(tmp_path):
    # five cuts in file order: a, b, a, a, b -> per_speaker=2 keeps a1, b1, a2 (a3 dropped), b2
    lines = []
    for utt, speaker in [("a1", "a"), ("b1", "b"), ("a2", "a"), ("a3", "a"), ("b2", "b")]:
        lines.append(json.dumps({"id": utt, "recording": {"sources": [{"source": f"{utt}.wav"}]},
                                 "supervisions": [{"speaker": speaker, "text": "hello"}]}))
    manifest = tmp_path / "cuts.jsonl"
    manifest.write_text("\n".join(lines) + "\n")
    assert [i.utt_id for i in items_from_cuts(manifest, per_speaker=2)] == ["a1", "b1", "a2", "b2"]
    assert [i.utt_id for i in items_from_cuts(manifest, per_speaker=1)] == ["a1", "b1"]
    assert len(items_from_cuts(manifest)) == 5
    with pytest.raises(ValueError, match="at least 1"):
        items_from_cuts(manifest, per_speaker=0)
