"""Tests of the embedded offline corpus `synth` and its sentence source."""

from __future__ import annotations

import csv
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from arnar.corpus import synth, texts

pytestmark = pytest.mark.skipif(
    not all(shutil.which(p) for p in ("flite", "t2p", "festival", "sox", "diatheke")),
    reason="needs the Debian packages flite festival sox diatheke",
)

TINY = dict(n_speakers=4, utterances_per_speaker=3, n_test_speakers=1, seed=7, workers=2,
            progress=False)
ALLOWED = re.compile(r"[A-Z][A-Za-z ,;:'\-]*[A-Za-z'][.?!]")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("tiny")
    return out, synth.build_synth_corpus(out, **TINY)


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != "build_log.json"
    }


# --------------------------------------------------------------------------- texts


def test_load_sentences_filter():
    sents = texts.load_sentences()
    assert len(sents) > 10_000
    assert len(set(sents)) == len(sents)
    keys = {" ".join(re.sub(r"[^a-z' ]", " ", s.lower()).split()) for s in sents}
    assert len(keys) == len(sents)  # no duplicates up to case/punctuation
    for s in sents:
        assert ALLOWED.fullmatch(s), s
        assert s == " ".join(s.split()), s
        assert 5 <= len(s.split()) <= 20, s
        assert not re.search(r"[0-9\"()\[\]]", s), s
    tagged = texts.load_tagged_sentences()
    assert [t.text for t in tagged] == sents
    counts = {src: sum(t.source == src for t in tagged) for src in ("wordnet", "web")}
    assert counts["wordnet"] > 5000 and counts["web"] > 1000, counts
    # deterministic order, word-count range respected
    assert texts.load_sentences() == sents
    short = texts.load_sentences(min_words=6, max_words=8)
    assert short and all(6 <= len(s.split()) <= 8 for s in short)


def test_normalise_sentence():
    n = texts.normalise_sentence
    assert n("the  cat sat on the mat") == "The cat sat on the mat."
    assert n("did the cat sit on the mat?") == "Did the cat sit on the mat?"
    assert n("the cat sat on 3 mats") is None  # digits
    assert n("the cat (a tabby) sat on it") is None  # brackets
    assert n("the NATO cat sat on the mat") is None  # acronym
    assert n("too short") is None
    assert n("e.g. the cat sat on the mat") is None  # inner periods


def test_missing_sources_name_the_package(tmp_path):
    with pytest.raises(texts.SourceMissingError, match="wordnet-base"):
        texts.wordnet_examples(tmp_path)
    with pytest.raises(texts.SourceMissingError, match="sword-text-web"):
        texts._web_module(tmp_path)


# --------------------------------------------------------------------------- speakers


def test_speaker_plan_is_a_prefix_and_test_speakers_span_voices():
    full = synth.plan_speakers(synth.MAX_SPEAKERS)
    assert synth.MAX_SPEAKERS >= 40
    assert synth.plan_speakers(9) == full[:9]
    assert [s.speaker for s in full[:3]] == ["spk00", "spk01", "spk02"]
    assert len({(s.voice, s.pitch_cents, s.tempo) for s in full}) == len(full)
    assert all(s.plain for s in full[: len(synth.BASE_VOICES)])
    test = synth.select_test_speakers(full[:20], 4, seed=3)
    assert test == synth.select_test_speakers(full[:20], 4, seed=3)
    voices = {s.voice for s in full if s.speaker in test}
    assert len(test) == 4 and len(voices) == 4
    with pytest.raises(ValueError):
        synth.select_test_speakers(full[:3], 3, seed=0)
    with pytest.raises(ValueError):
        synth.plan_speakers(synth.MAX_SPEAKERS + 1)


# --------------------------------------------------------------------------- build


def test_tiny_build_layout(tiny):
    out, summary = tiny
    with open(out / "speakers.tsv", newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    assert (out / "speakers.tsv").read_text().splitlines()[0] == (
        "speaker\tvoice\tsynthesizer\tpitch_cents\ttempo\tsplit"
    )
    assert [r["speaker"] for r in rows] == ["spk00", "spk01", "spk02", "spk03"]
    assert {r["synthesizer"] for r in rows} == {"flite", "festival"}
    assert sorted(r["split"] for r in rows) == ["test", "train", "train", "train"]

    assert json.loads((out / "summary.json").read_text()) == {
        k: v
        for k, v in summary.items()
        if k not in ("build_seconds", "x_real_time", "workers", "jobs")
    }
    assert summary["speakers"] == 4 and summary["utterances"] == 12
    assert summary["splits"]["test"]["utterances"] == 3
    assert summary["splits"]["train"]["speakers"] == 3
    assert "build_seconds" not in json.loads((out / "summary.json").read_text())
    assert json.loads((out / "build_log.json").read_text())["build_seconds"] > 0
    assert not (out / ".tmp").exists()

    total = 0.0
    utt_ids = set()
    for r in rows:
        spk = r["speaker"]
        wavs = sorted((out / spk).glob("*.wav"))
        assert [w.stem for w in wavs] == [f"{spk}_{j:04d}" for j in range(3)]
        assert sorted(p.name for p in (out / spk).iterdir()) == sorted(
            f"{w.stem}{ext}" for w in wavs for ext in (".wav", ".txt", ".align.json")
        )
        for w in wavs:
            utt_ids.add(w.stem)
            info = sf.info(w)
            assert (info.channels, info.samplerate, info.subtype) == (1, 16000, "PCM_16")
            x, _ = sf.read(w)
            assert np.abs(x).max() > 0.05 and np.sqrt(np.mean(x**2)) > 0.005
            dur = len(x) / 16000
            total += dur
            text = w.with_suffix(".txt").read_text(encoding="utf-8")
            assert text.endswith("\n") and text.count("\n") == 1 and len(text.strip()) > 5
            align = json.loads(w.with_name(w.stem + ".align.json").read_text())
            assert set(align) == {"phones", "words", "source"}
            want = "festival-segs" if r["synthesizer"] == "festival" else "flite-psdur"
            assert align["source"] == want
            phones = align["phones"]
            assert len(phones) > 5
            prev = 0.0
            for sym, s, e in phones:
                assert isinstance(sym, str) and sym
                assert prev - 1e-6 <= s <= e <= dur + 0.01, (w, sym, s, e)
                prev = e
            assert abs(phones[-1][2] - dur) < 0.3
            words = align["words"]
            assert words, w  # every voice used here gives word timings
            stripped = [re.sub(r"[,;:.?!]+$", "", t) for t in text.split()]
            assert [wd[0] for wd in words] == stripped
            prev = 0.0
            for _, s, e in words:
                assert prev - 1e-6 <= s < e <= dur + 0.01
                prev = e
    assert len(utt_ids) == 12
    assert abs(summary["seconds"] - total) < 0.01


def test_build_is_deterministic(tiny, tmp_path):
    out, _ = tiny
    again = tmp_path / "again"
    synth.build_synth_corpus(again, **{**TINY, "workers": 1})
    a, b = _files(out), _files(again)
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name] == b[name], name


def test_variants_scale_timings(tmp_path):
    """A tempo variant's timings are the plain voice's, scaled by the output/input ratio."""
    plan = synth.plan_speakers(synth.MAX_SPEAKERS)
    var = next(s for s in plan if s.tempo < 1.0 and s.synthesizer == "flite")
    plain = next(s for s in plan if s.voice == var.voice and s.plain)
    text = "The quick brown fox jumps over the lazy dog."
    res = {}
    for spk in (plain, var):
        utt = f"{spk.speaker}_0000"
        ((_, n, has_words),) = synth._run_job((spk, [(utt, text)], str(tmp_path), 16000))
        x, sr = sf.read(tmp_path / spk.speaker / f"{utt}.wav")
        assert n == len(x) and has_words
        align = json.loads((tmp_path / spk.speaker / f"{utt}.align.json").read_text())
        res[spk.speaker] = (len(x) / sr, align)
    (dp, ap), (dv, av) = res[plain.speaker], res[var.speaker]
    assert dv > dp * 1.02  # slower tempo -> longer
    assert [p[0] for p in ap["phones"]] == [p[0] for p in av["phones"]]
    for p, v in zip(ap["phones"][:-1], av["phones"][:-1]):
        assert v[2] == pytest.approx(p[2] * dv / dp, abs=2e-3)
    assert av["phones"][-1][2] == pytest.approx(dv, abs=1e-4)


def test_synth_error_names_voice_and_utterance(tmp_path):
    with pytest.raises(synth.SynthError, match=r"nonexistent.*spk00_0000"):
        synth._synth_festival(
            "nonexistent", [("spk00_0000", "Hello there my old friend.")], tmp_path
        )
    with pytest.raises(synth.SynthError, match="nonexistent"):
        synth._check_flite_voices({"rms", "nonexistent"})


def test_cli_main(tmp_path, capsys):
    out = tmp_path / "cli"
    summary = synth.main([
        "--out", str(out), "--speakers", "2", "--utterances-per-speaker", "2",
        "--test-speakers", "1", "--seed", "1", "--workers", "2", "--no-progress",
    ])
    assert summary["utterances"] == 4
    assert "2 speakers, 4 utterances" in capsys.readouterr().out
    assert (out / "summary.json").is_file()
    assert len(list(out.glob("spk*/*.wav"))) == 4
