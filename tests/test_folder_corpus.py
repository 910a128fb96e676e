"""Your own corpus (``corpus.name: folder``, arnar.corpus.recipes.folder): a folder of audio and
transcripts laid out as the corpus folder, its broken items quarantined by ingest, the config it
needs, and the DAG it plans. The end-to-end run (folder -> data phase -> tokens) is marked slow."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import yaml

from arnar.cli import main as arnar_main
from arnar.config import REPO_ROOT, ConfigError, load_params, resolve_profile
from arnar.corpus.manifests import CorpusError, RawItem, assign_split, ingest_corpus
from arnar.corpus.recipes.folder import (folder_fingerprint, held_out_speakers, prepare_folder_corpus,
                                         read_metadata, scan_folder)
from arnar.corpus.validate import ValidationLimits
from smoke_dag import BIN, DAG_TIMEOUT, copy_workflow, run

RATE = 16000
LIMITS = ValidationLimits(sample_rate=RATE, min_duration=0.5, max_duration=30.0)
RAW = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())


def tone(path: Path, rate: int, seconds: float = 1.0, *, channels: int = 1, subtype: str | None = None) -> None:
    """A 220 Hz tone at -10 dBFS: neither silent nor clipped for ingest."""
    t = np.arange(int(rate * seconds)) / rate
    mono = 0.3 * np.sin(2 * np.pi * 220 * t)
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(str(path), np.stack([mono] * channels, axis=1) if channels > 1 else mono, rate, subtype=subtype)


def text(path: Path, words: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(words + "\n", encoding="utf-8")


def two_speaker_folder(root: Path) -> Path:
    """anna: .wav at 22.05 kHz with a .txt beside each; ben: LJSpeech's metadata.csv + wavs/*.flac
    at 44.1 and 8 kHz (three columns: the normalized text is the transcript)."""
    tone(root / "anna" / "001.wav", 22050, 1.0)
    text(root / "anna" / "001.txt", "The first thing anna said.")
    tone(root / "anna" / "anna_002.wav", 22050, 1.5, channels=2)  # stereo, already named <speaker>_
    text(root / "anna" / "anna_002.txt", "Then a second one.")
    tone(root / "ben" / "wavs" / "001.flac", 44100, 1.2)
    tone(root / "ben" / "wavs" / "002.flac", 8000, 0.8)
    (root / "ben" / "metadata.csv").write_text(
        "001|It cost 3 dollars.|It cost three dollars.\n002|Good night.|\n", encoding="utf-8")
    return root


def frames(path: Path) -> tuple[int, int, int]:
    info = sf.info(str(path))
    return info.samplerate, info.channels, info.frames


# ---------------------------------------------------------------------------------------- layout


def test_speaker_folders_are_laid_out_at_the_corpus_rate(tmp_path):
    source = two_speaker_folder(tmp_path / "mine")
    summary = prepare_folder_corpus(source, tmp_path / "corpus", sample_rate=RATE, test_speakers=1, seed=1234,
                                    progress=False)
    out = tmp_path / "corpus"
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    assert files == ["anna/anna_001.txt", "anna/anna_001.wav", "anna/anna_002.txt", "anna/anna_002.wav",
                     "ben/ben_001.txt", "ben/ben_001.wav", "ben/ben_002.txt", "ben/ben_002.wav",
                     "build_log.json", "sources.tsv", "speakers.tsv", "summary.json"]
    # .txt copied byte for byte; metadata.csv: the normalized text where the line has one
    assert (out / "anna/anna_001.txt").read_text() == "The first thing anna said.\n"
    assert (out / "ben/ben_001.txt").read_text() == "It cost three dollars.\n"
    assert (out / "ben/ben_002.txt").read_text() == "Good night.\n"
    # every file mono at the corpus rate, its duration kept (soxr, within a few samples)
    for name, seconds in [("anna/anna_001", 1.0), ("anna/anna_002", 1.5), ("ben/ben_001", 1.2), ("ben/ben_002", 0.8)]:
        rate, channels, n = frames(out / f"{name}.wav")
        assert (rate, channels) == (RATE, 1) and abs(n - seconds * RATE) <= 2, name
    test = held_out_speakers(["anna", "ben"], 1, 1234)
    assert (out / "speakers.tsv").read_text().splitlines() == ["speaker\tfolder\tsplit"] + [
        f"{s}\t{s}\t{'test' if s in test else 'train'}" for s in ("anna", "ben")]
    assert (out / "sources.tsv").read_text().splitlines()[1:] == [
        "anna_001\tanna/001.wav\tanna/001.txt", "anna_002\tanna/anna_002.wav\tanna/anna_002.txt",
        "ben_001\tben/wavs/001.flac\tben/metadata.csv:1", "ben_002\tben/wavs/002.flac\tben/metadata.csv:2"]
    assert summary["source_sample_rates"] == {"8000": 1, "22050": 2, "44100": 1}
    assert summary["test_speakers"] == sorted(test) and summary["layout"] == "speaker folders"
    assert summary["audio_kept_as_is"] == {} and summary["audio_without_transcript"] == []


def test_files_at_the_top_are_one_speaker(tmp_path):
    source = tmp_path / "Jo's recordings"
    tone(source / "a.wav", 48000)
    text(source / "a.txt", "One speaker only.")
    tone(source / "b.flac", 24000)
    text(source / "b.txt", "Still the same one.")
    summary = prepare_folder_corpus(source, tmp_path / "corpus", sample_rate=RATE, test_speakers=0, seed=1,
                                    progress=False)
    out = tmp_path / "corpus"
    speaker = "Jo_s_recordings"  # the folder's name, made safe for file names and TSV fields
    assert sorted(p.name for p in (out / speaker).iterdir()) == ["a.txt", "a.wav", "b.txt", "b.wav"]
    assert (out / "speakers.tsv").read_text().splitlines()[1:] == [f"{speaker}\t.\ttrain"]
    assert summary["layout"] == "one speaker" and summary["speakers"] == 1


def test_ljspeech_layout_two_columns(tmp_path):
    source = tmp_path / "LJ"
    tone(source / "wavs" / "LJ001-0001.wav", 22050)
    tone(source / "wavs" / "LJ001-0002.wav", 22050)
    (source / "metadata.csv").write_text("LJ001-0001|Printing, in the only sense.\nLJ001-0002|In being comparatively "
                                         "modern.\n", encoding="utf-8")
    prepare_folder_corpus(source, tmp_path / "corpus", sample_rate=RATE, test_speakers=0, seed=1, progress=False)
    assert (tmp_path / "corpus/LJ/LJ001-0002.txt").read_text() == "In being comparatively modern.\n"
    assert frames(tmp_path / "corpus/LJ/LJ001-0001.wav")[0] == RATE


def test_one_metadata_file_for_every_speaker(tmp_path):
    source = tmp_path / "mine"
    tone(source / "anna" / "a1.wav", 16000)
    tone(source / "ben" / "b1.wav", 16000)
    (source / "metadata.csv").write_text("a1|Anna speaks.\nb1|Ben speaks.\nc1|Nobody has this file.\n")
    summary = prepare_folder_corpus(source, tmp_path / "corpus", sample_rate=RATE, test_speakers=0, seed=1,
                                    progress=False)
    assert (tmp_path / "corpus/ben/ben_b1.txt").read_text() == "Ben speaks.\n"
    assert summary["metadata_ids_without_audio"] == ["c1"]


def test_resampling_is_deterministic(tmp_path):
    source = two_speaker_folder(tmp_path / "mine")
    for out in ("one", "two"):
        prepare_folder_corpus(source, tmp_path / out, sample_rate=24000, test_speakers=1, seed=7, workers=1,
                              progress=False)
    digest = {out: {p.relative_to(tmp_path / out): p.read_bytes() for p in (tmp_path / out).rglob("*")
                    if p.is_file() and p.name != "build_log.json"} for out in ("one", "two")}
    assert digest["one"] == digest["two"]
    assert frames(tmp_path / "one/ben/ben_002.wav")[0] == 24000


def test_a_rebuild_removes_what_the_folder_no_longer_has(tmp_path):
    source = two_speaker_folder(tmp_path / "mine")
    prepare_folder_corpus(source, tmp_path / "corpus", sample_rate=RATE, test_speakers=0, seed=1, progress=False)
    before = folder_fingerprint(source)
    (source / "anna" / "001.wav").unlink()
    (source / "anna" / "001.txt").unlink()
    assert folder_fingerprint(source) != before and folder_fingerprint(tmp_path / "absent") == ""
    prepare_folder_corpus(source, tmp_path / "corpus", sample_rate=RATE, test_speakers=0, seed=1, progress=False)
    assert not (tmp_path / "corpus/anna/anna_001.wav").exists()
    assert (tmp_path / "corpus/anna/anna_002.wav").exists()


# ------------------------------------------------------------------ broken items go to quarantine


def test_broken_and_unpaired_items_are_quarantined_by_ingest(tmp_path):
    source = two_speaker_folder(tmp_path / "mine")
    (source / "anna" / "broken.wav").write_bytes(b"this is not audio at all" * 20)
    text(source / "anna" / "broken.txt", "A file that does not decode.")
    tone(source / "anna" / "cut.wav", 22050, 1.0)  # truncated: the header declares more than the file holds
    (source / "anna" / "cut.wav").write_bytes((source / "anna" / "cut.wav").read_bytes()[:5000])
    text(source / "anna" / "cut.txt", "A file cut short.")
    tone(source / "anna" / "untold.wav", 22050, 1.0)  # no transcript
    text(source / "anna" / "unheard.txt", "A transcript without audio.")
    tone(source / "ben" / "wavs" / "003.flac", 44100)  # not in ben's metadata.csv
    with (source / "ben" / "metadata.csv").open("a") as handle:
        handle.write("004|Ben never recorded this.\n")

    summary = prepare_folder_corpus(source, tmp_path / "corpus", sample_rate=RATE, test_speakers=0, seed=1,
                                    progress=False)
    assert summary["audio_kept_as_is"] == {"anna_broken": "unreadable (LibsndfileError)",
                                           "anna_cut": "truncated (4956 of 44100 data bytes)"}
    assert summary["audio_without_transcript"] == ["anna_untold", "ben_003"]
    assert summary["transcript_without_audio"] == ["anna_unheard", "ben_004"]

    ingested = ingest_corpus(tmp_path / "corpus", tmp_path / "manifests", limits=LIMITS, dev_fraction=0.0,
                             seed=1, progress=False)
    rows = [line.split("\t") for line in (tmp_path / "manifests/quarantine.tsv").read_text().splitlines()[1:]]
    reasons = {utt: reason for utt, _, reason in rows}
    assert set(reasons) == {"anna_broken", "anna_cut", "anna_untold", "anna_unheard", "ben_003", "ben_004"}
    assert reasons["anna_broken"].startswith("audio: unreadable (LibsndfileError: ")
    assert reasons["anna_cut"] == "audio: truncated (header declares 44100 data bytes, file holds 4956)"
    assert reasons["anna_untold"] == reasons["ben_003"] == "pairing: audio has no transcript file"
    assert reasons["anna_unheard"] == reasons["ben_004"] == "pairing: transcript has no audio file"
    for reason in reasons.values():
        assert re.fullmatch(r"(audio|transcript|pairing): [a-z ]+( \(.+\))?", reason), reason
    assert ingested["accepted"] == 4  # everything else goes on


# ------------------------------------------------------------------- errors that stop the recipe


def test_missing_or_empty_folder_names_the_path(tmp_path):
    with pytest.raises(CorpusError, match=re.escape(f"{tmp_path / 'absent'}: corpus folder does not exist")):
        prepare_folder_corpus(tmp_path / "absent", tmp_path / "corpus", sample_rate=RATE, test_speakers=0, seed=1)
    (tmp_path / "empty" / "anna").mkdir(parents=True)
    with pytest.raises(CorpusError, match=re.escape(f"{tmp_path / 'empty'}: no audio or transcripts found")):
        prepare_folder_corpus(tmp_path / "empty", tmp_path / "corpus", sample_rate=RATE, test_speakers=0, seed=1)


def test_the_cli_reports_a_missing_folder_in_one_line(tmp_path, capsys):
    args = ["corpus", "prepare", "--corpus", "folder", "--path", str(tmp_path / "absent"),
            "--out", str(tmp_path / "corpus"), "--sample-rate", "16000"]
    assert arnar_main(args) == 2
    assert capsys.readouterr().err.strip() == (f"arnar corpus: error: {tmp_path / 'absent'}: corpus folder "
                                               "does not exist (corpus.path)")
    two_speaker_folder(tmp_path / "mine")
    args[5] = str(tmp_path / "mine")
    assert arnar_main(args + ["--test-speakers", "1", "--seed", "3"]) == 0
    assert (tmp_path / "corpus/speakers.tsv").exists()


def test_ambiguous_layouts_stop_with_one_line(tmp_path):
    mixed = tmp_path / "mixed"
    tone(mixed / "a.wav", 16000)
    tone(mixed / "anna" / "b.wav", 16000)
    with pytest.raises(CorpusError, match="audio files at the top and sub-folders \\(anna\\)"):
        scan_folder(mixed)
    twice = tmp_path / "twice"
    tone(twice / "anna" / "a.wav", 16000)
    tone(twice / "anna" / "a.flac", 16000)
    with pytest.raises(CorpusError, match="both read as utterance 'anna_a'"):
        scan_folder(twice)
    (tmp_path / "metadata.csv").write_text("a|One.\nb|Two.\na|Three.\n")
    with pytest.raises(CorpusError, match=re.escape(f"{tmp_path / 'metadata.csv'}:3: id 'a' is already on line 1")):
        read_metadata(tmp_path / "metadata.csv")
    (tmp_path / "metadata.csv").write_bytes(b"a|caf\xe9\n")
    with pytest.raises(CorpusError, match="not valid UTF-8 \\(byte 5\\)"):
        read_metadata(tmp_path / "metadata.csv")
    source = two_speaker_folder(tmp_path / "mine")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "notes.md").write_text("mine")
    with pytest.raises(CorpusError, match="not empty and not a corpus folder"):
        prepare_folder_corpus(source, tmp_path / "elsewhere", sample_rate=RATE, test_speakers=0, seed=1)
    with pytest.raises(CorpusError, match="must lie outside"):
        prepare_folder_corpus(source, source / "corpus", sample_rate=RATE, test_speakers=0, seed=1)


def test_test_speakers_are_a_seeded_stable_choice():
    speakers = [f"s{i}" for i in range(10)]
    chosen = held_out_speakers(speakers, 3, seed=1234)
    assert chosen == held_out_speakers(list(reversed(speakers)), 3, seed=1234) and len(chosen) == 3
    assert len(chosen - held_out_speakers(speakers + ["new"], 3, seed=1234)) <= 1  # a new speaker moves at most one
    assert held_out_speakers(speakers, 0, seed=1) == set()
    with pytest.raises(CorpusError, match=r"corpus.test_speakers \(1\) must be fewer than the folder's speakers \(1\)"):
        held_out_speakers(["solo"], 1, seed=1)


# ----------------------------------------------------------------------------------------- config


def own_profile(path: str) -> dict:
    return {"corpus": {"name": "folder", "path": path, "test_speakers": 1}, "alignment": {"score_splits": []}}


def test_folder_profile_resolves_and_the_others_do_not_change():
    # the commented example at the end of params.yaml, uncommented
    lines = (REPO_ROOT / "params.yaml").read_text().splitlines()
    start = lines.index("  # own:")
    example = yaml.safe_load("\n".join(line.replace("  # ", "  ", 1) for line in lines[start:start + 3]))
    raw = copy.deepcopy(RAW)
    raw["profiles"].update(example)
    resolved = resolve_profile(dict(raw, profile="own"))
    assert resolved["corpus"]["name"] == "folder" and resolved["corpus"]["path"] == "/path/to/my-recordings"
    for profile in RAW["profiles"]:
        assert resolve_profile(dict(raw, profile=profile)) == resolve_profile(dict(RAW, profile=profile))


@pytest.mark.parametrize("alignment, message", [
    ({"aligner": "oracle"}, "alignment.aligner: 'oracle' reads the synthesizer's own timings, which corpus.name "
                            "'folder' does not have; use pocketsphinx or mfa"),
    ({"train_aligner": "oracle"}, "alignment.train_aligner: 'oracle' reads the synthesizer's own timings"),
    ({"score_splits": ["test"]}, "alignment.score_splits: ['test'] scores the aligner against the synthesizer's "
                                 "own timings, which corpus.name 'folder' does not have; set it to []"),
])
def test_oracle_timings_on_a_folder_corpus_are_a_config_error(alignment, message):
    profile = own_profile("/data/mine")
    profile["alignment"] = {"score_splits": [], **alignment}
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_params(overrides={"profile": "own", "profiles": {"own": profile}})


def test_a_folder_corpus_needs_its_path():
    with pytest.raises(ConfigError, match=r"corpus.path: corpus.name 'folder' needs the folder of your recordings"):
        load_params(overrides={"profile": "own", "profiles": {"own": own_profile(None)}})


# ------------------------------------------------------------------------------------------ DAG


def folder_workflow(root: Path, source: Path, *, dev_fraction: float = 0.15) -> Path:
    """A copy of the workflow whose params.yaml has the profile `own`: the smoke profile's sizes
    with the folder corpus at ``source`` and no frozen test lists."""
    workflow = copy_workflow(root)
    params = yaml.safe_load((workflow / "params.yaml").read_text())
    own = copy.deepcopy(params["profiles"]["smoke"])
    own["corpus"] = {"name": "folder", "path": str(source), "test_speakers": 1,
                     "dev_fraction": dev_fraction}
    own["alignment"] = {"score_splits": []}
    params["profiles"]["own"] = own
    (workflow / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return workflow


def planned_jobs(stdout: str) -> set[str]:
    stats = stdout[stdout.index("Job stats:"):]
    return {m.group(1) for m in re.finditer(r"^(\w+)\s+\d+$", stats, re.MULTILINE)} - {"total"}


def test_dry_run_plans_the_folder_corpus_through_the_data_phase_to_tokens(tmp_path):
    source = two_speaker_folder(tmp_path / "mine")
    workflow = folder_workflow(tmp_path / "wf", source)
    result = run([str(BIN / "snakemake"), "-n", "-p", "--cores", "2", "data", "tokens", "freeze_testlists",
                  "--config", "profile=own"], workflow)
    jobs = planned_jobs(result.stdout)
    assert {"folder_corpus", "manifests", "tokenizers", "corpus_report", "data", "align", "train_codec",
            "tokenize", "tokens", "freeze_testlists"} <= jobs
    assert not jobs & {"synth_corpus", "corpus_download", "corpus_prepare", "alignment_accuracy"}
    assert f"arnar corpus prepare --corpus folder --path {source} --out data/own/corpus" in result.stdout
    assert not (workflow / "data").exists()
    # a folder that is not there (and no corpus built from it yet) stops the DAG naming the key
    source.rename(tmp_path / "moved")
    result = run([str(BIN / "snakemake"), "-n", "--cores", "2", "data", "--config", "profile=own"], workflow,
                 check=False)
    assert result.returncode != 0
    assert f"params.yaml: corpus.path: '{source}': no such folder" in result.stdout + result.stderr


# ------------------------------------------------------------------------------ end to end (slow)


def synthesized_folder(root: Path, work: Path) -> dict[str, str]:
    """Two synthesized speakers rearranged as a user's folder: anna's .wav at 22.05 kHz with .txt
    beside each, ben's metadata.csv + wavs/*.flac at 44.1 and 8 kHz; one broken file and one
    audio file without a transcript. Returns the faults' ids and the reasons ingest must give."""
    from arnar.corpus.synth import build_synth_corpus
    from arnar.evaluate.audio import resample

    synth = work / "synth"
    build_synth_corpus(synth, n_speakers=2, utterances_per_speaker=10, n_test_speakers=0, seed=1, workers=2,
                       progress=False)
    for index, speaker_dir in enumerate(sorted(p for p in synth.iterdir() if p.is_dir())):
        name = ("anna", "ben")[index]
        (root / name / ("wavs" if name == "ben" else "")).mkdir(parents=True)
        metadata = []
        for number, wav in enumerate(sorted(speaker_dir.glob("*.wav")), start=1):
            audio, rate = sf.read(str(wav), dtype="float32")
            words = wav.with_suffix(".txt").read_text(encoding="utf-8").strip()
            if name == "anna":
                sf.write(str(root / name / f"{number:03d}.wav"), resample(audio, rate, 22050), 22050)
                if number != 4:  # the audio file without a transcript
                    text(root / name / f"{number:03d}.txt", words)
            else:
                target_rate = 8000 if number % 3 == 0 else 44100
                sf.write(str(root / name / "wavs" / f"{number:03d}.flac"), resample(audio, rate, target_rate),
                         target_rate)
                metadata.append(f"{number:03d}|{words}")
        if metadata:
            (root / name / "metadata.csv").write_text("\n".join(metadata) + "\n", encoding="utf-8")
    (root / "ben" / "wavs" / "011.flac").write_bytes(b"fLaC" + bytes(range(256)) * 4)  # broken
    with (root / "ben" / "metadata.csv").open("a", encoding="utf-8") as handle:
        handle.write("011|A file that never decodes.\n")
    return {"ben_011": "audio: unreadable (", "anna_004": "pairing: audio has no transcript file"}


@pytest.mark.slow
def test_a_folder_goes_through_the_data_phase_to_tokens(tmp_path):
    source = tmp_path / "mine"
    faults = synthesized_folder(source, tmp_path)
    workflow = folder_workflow(tmp_path / "wf", source, dev_fraction=0.3)
    # whichever speaker is held out, the other keeps utterances for both train and dev
    for speaker in ("anna", "ben"):
        items = [RawItem(f"{speaker}_{n:03d}", speaker, Path(), Path(), Path()) for n in range(1, 11)
                 if f"{speaker}_{n:03d}" not in faults]
        assert {assign_split(item, "train", 0.3, RAW["seed"]) for item in items} == {"train", "dev"}, speaker

    run([str(BIN / "snakemake"), "--cores", "2", "data", "tokens", "--config", "profile=own"], workflow,
        timeout=DAG_TIMEOUT)
    data = workflow / "data" / "own"
    rows = [line.split("\t") for line in (data / "manifests/quarantine.tsv").read_text().splitlines()[1:]]
    reasons = {utt: reason for utt, _, reason in rows}
    assert set(reasons) == set(faults), reasons
    for utt, start in faults.items():
        assert reasons[utt].startswith(start), reasons[utt]
    summary = json.loads((data / "manifests/summary.json").read_text())
    assert summary["accepted"] == 19 and summary["speakers"] == 2
    assert summary["splits"]["test"]["speakers"] == 1 and summary["splits"]["dev"]["utterances"] >= 1
    for codec in RAW["profiles"]["smoke"]["codec"]["tokenizers"]:
        for split in ("train", "dev", "test"):
            assert (data / "tokens" / codec / split / "manifest.json").is_file(), (codec, split)
