"""Ingest: validation reasons, quarantine report, splits and lhotse manifests.

The corpus is made by the test (tones with noise, written with soundfile) so the checks are
exercised without the synthesizers.
"""

import json

import numpy as np
import pytest
import soundfile as sf
from lhotse import CutSet, load_manifest

from arnar.corpus.manifests import CorpusError, assign_split, ingest_corpus, RawItem
from arnar.corpus.validate import ValidationLimits, check_audio, wav_declared_data_bytes

RATE = 16000
LIMITS = ValidationLimits(sample_rate=RATE, min_duration=0.5, max_duration=10.0)


def tone(seconds=1.0, rate=RATE, seed=0):
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    return (0.3 * np.sin(2 * np.pi * 220 * t) + 0.01 * rng.standard_normal(t.size)).astype(np.float32)


def write_item(root, speaker, utt_id, audio=None, text="A short sentence.", rate=RATE, subtype="PCM_16"):
    folder = root / speaker
    folder.mkdir(parents=True, exist_ok=True)
    if audio is not None:
        sf.write(folder / f"{utt_id}.wav", audio, rate, subtype=subtype)
    if text is not None:
        (folder / f"{utt_id}.txt").write_bytes(text if isinstance(text, bytes) else text.encode())
    return folder


@pytest.fixture
def faulty_corpus(tmp_path):
    """Six good items over three speakers (one held out) plus one item per fault kind."""
    root = tmp_path / "corpus"
    (root).mkdir()
    (root / "speakers.tsv").write_text("speaker\tvoice\tsplit\nspkA\tx\ttrain\nspkB\tx\ttrain\nspkC\tx\ttest\n")
    good = []
    for i, spk in enumerate(["spkA", "spkA", "spkA", "spkB", "spkB", "spkC"]):
        utt = f"{spk}_good{i}"
        write_item(root, spk, utt, tone(1.0 + 0.1 * i, seed=i), f"Sentence number {i}.")
        good.append(utt)
    # alignment for one good item
    (root / "spkA" / "spkA_good0.align.json").write_text(
        json.dumps({"phones": [["HH", 0.0, 0.2], ["AY", 0.2, 0.9]], "words": [["hi", 0.0, 0.9]]})
    )
    faults = {}

    def fault(utt, reason, **kw):
        write_item(root, "spkA", utt, **kw)
        faults[utt] = reason

    fault("truncated", "audio: truncated", audio=tone(1.0))
    wav = root / "spkA" / "truncated.wav"
    wav.write_bytes(wav.read_bytes()[: 44 + 4000])
    fault("zerobytes", "audio: empty file", audio=None)
    (root / "spkA" / "zerobytes.wav").write_bytes(b"")
    fault("nosamples", "audio: no samples", audio=np.zeros(0, dtype=np.float32))
    fault("rate8k", "audio: wrong sample rate", audio=tone(1.0, rate=8000), rate=8000)
    fault("stereo", "audio: wrong channel count", audio=np.stack([tone(1.0), tone(1.0)], axis=1))
    nan = tone(1.0)
    nan[100] = np.nan
    nan[200] = np.inf
    fault("nonfinite", "audio: non-finite samples", audio=nan, subtype="FLOAT")
    fault("silent", "audio: silent", audio=np.zeros(RATE, dtype=np.float32))
    fault("clipped", "audio: clipped", audio=np.sign(tone(1.0)) * 1.0)
    fault("tooshort", "audio: duration out of range", audio=tone(0.2))
    fault("toolong", "audio: duration out of range", audio=tone(11.0))
    fault("garbage", "audio: unreadable", audio=None)
    (root / "spkA" / "garbage.wav").write_bytes(b"this is not audio at all" * 10)
    fault("notext", "pairing: audio has no transcript file", audio=tone(1.0), text=None)
    fault("noaudio", "pairing: transcript has no audio file", audio=None, text="Orphan transcript.")
    fault("emptytext", "transcript: empty or whitespace only", audio=tone(1.0), text="  \n\t ")
    fault("badutf8", "transcript: not valid UTF-8", audio=tone(1.0), text=b"caf\xe9 au lait")
    fault("noletters", "transcript: contains no letters", audio=tone(1.0), text="... 123 !")
    # the same id under two speakers: ambiguous, every copy is quarantined
    write_item(root, "spkA", "dup", tone(1.0))
    write_item(root, "spkB", "dup", tone(1.0))
    faults["dup"] = "pairing: duplicate utterance id"
    return root, good, faults


def test_every_fault_quarantined_with_its_reason_and_good_items_kept(faulty_corpus, tmp_path):
    root, good, faults = faulty_corpus
    out = tmp_path / "manifests"
    summary = ingest_corpus(root, out, limits=LIMITS, dev_fraction=0.0, seed=0, workers=1, progress=False)

    rows = [line.split("\t") for line in (out / "quarantine.tsv").read_text().splitlines()[1:]]
    reasons = {}
    for utt_id, _path, reason in rows:
        reasons.setdefault(utt_id, []).append(reason)
    assert set(reasons) == set(faults)
    for utt_id, expected in faults.items():
        assert all(r.startswith(expected) for r in reasons[utt_id]), (utt_id, reasons[utt_id])
    assert len(reasons["dup"]) == 2

    kept = set()
    for split in ("train", "dev", "test"):
        kept |= {c.id for c in load_manifest(out / f"{split}_cuts.jsonl")}
    assert kept == set(good)
    assert summary["accepted"] == len(good)
    assert summary["quarantined"]["total"] == len(faults) + 1  # dup counts twice
    assert summary["quarantined"]["by_reason"]["audio: duration out of range"] == 2


def test_held_out_speakers_and_alignment(faulty_corpus, tmp_path):
    root, _good, _ = faulty_corpus
    out = tmp_path / "manifests"
    summary = ingest_corpus(root, out, limits=LIMITS, dev_fraction=0.0, seed=0, progress=False)
    test_cuts = load_manifest(out / "test_cuts.jsonl")
    assert {c.supervisions[0].speaker for c in test_cuts} == {"spkC"}
    train = {c.id: c for c in load_manifest(out / "train_cuts.jsonl")}
    assert "spkC" not in {c.supervisions[0].speaker for c in train.values()}
    sup = train["spkA_good0"].supervisions[0]
    assert [a.symbol for a in sup.alignment["phone"]] == ["HH", "AY"]
    assert sup.alignment["phone"][1].start == pytest.approx(0.2)
    assert sup.alignment["phone"][1].duration == pytest.approx(0.7)
    assert sup.text == "Sentence number 0."
    assert summary["splits"]["test"]["speakers"] == 1
    assert isinstance(CutSet.from_file(out / "train_cuts.jsonl"), CutSet)


def test_ingest_is_byte_identical(faulty_corpus, tmp_path):
    root, _, _ = faulty_corpus
    a, b = tmp_path / "a", tmp_path / "b"
    ingest_corpus(root, a, limits=LIMITS, dev_fraction=0.3, seed=5, workers=2, progress=False)
    ingest_corpus(root, b, limits=LIMITS, dev_fraction=0.3, seed=5, workers=1, progress=False)
    for path in sorted(a.iterdir()):
        assert path.read_bytes() == (b / path.name).read_bytes(), path.name


def test_dev_split_is_seeded_and_stable():
    items = [RawItem(f"u{i}", "s", None, None, None) for i in range(2000)]
    dev = [assign_split(it, "train", 0.1, seed=1) == "dev" for it in items]
    assert 150 < sum(dev) < 250  # ~10% of 2000
    assert dev == [assign_split(it, "train", 0.1, seed=1) == "dev" for it in items]
    assert dev != [assign_split(it, "train", 0.1, seed=2) == "dev" for it in items]
    assert all(assign_split(it, "test", 0.1, seed=1) == "test" for it in items[:10])


def test_truncation_detected_from_header(tmp_path):
    path = tmp_path / "x.wav"
    sf.write(path, tone(1.0), RATE, subtype="PCM_16")
    declared, present = wav_declared_data_bytes(path)
    assert declared == present == RATE * 2
    path.write_bytes(path.read_bytes()[:-100])
    reason, facts = check_audio(path, LIMITS)
    assert reason.startswith("audio: truncated") and facts is None


def test_corpus_level_errors_name_the_path(tmp_path):
    with pytest.raises(CorpusError, match="corpus folder does not exist"):
        ingest_corpus(tmp_path / "none", tmp_path / "o", limits=LIMITS, dev_fraction=0, seed=0)
    (tmp_path / "empty").mkdir()
    with pytest.raises(CorpusError, match="no utterances found"):
        ingest_corpus(tmp_path / "empty", tmp_path / "o", limits=LIMITS, dev_fraction=0, seed=0)
    root = tmp_path / "badsplit"
    write_item(root, "s", "u", tone(1.0))
    (root / "speakers.tsv").write_text("speaker\tsplit\ns\tvalidation\n")
    with pytest.raises(CorpusError, match=r"speakers.tsv:2: split 'validation'"):
        ingest_corpus(root, tmp_path / "o", limits=LIMITS, dev_fraction=0, seed=0)
