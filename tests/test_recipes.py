"""Corpus recipes (arnar.corpus.recipes) on tiny fixtures laid out like the real corpora.

Nothing here reaches the internet: archives are served by a local HTTP server (with Range
support and a switch that drops the connection half-way), the corpora are written by the
tests with the real file names, transcript files and speaker tables, and the quality
estimators are checked on signals with a known SNR and a known room.
"""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import re
import subprocess
import tarfile
import threading
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from arnar.corpus.manifests import CorpusError, ingest_corpus
from arnar.corpus.recipes import prepare_corpus, required_archives
from arnar.corpus.recipes.corpus import sentence_case
from arnar.corpus.recipes.download import Archive, DownloadError, download, fetch
from arnar.corpus.recipes.quality import (
    C50_CAP,
    BrouhahaEstimator,
    OfflineEstimator,
    QualityUnavailableError,
    estimate_c50,
    estimate_snr,
    make_estimator,
)
from arnar.corpus.validate import ValidationLimits
from arnar.evaluate.testlists import build_testlists

from smoke_dag import BIN, copy_workflow, run

# --------------------------------------------------------------------------- signals


def speech_like(seconds: float, rate: int, seed: int, *, noise_bursts: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Bursts of 250-400 ms (a 140 Hz harmonic complex, or white noise) with 150-300 ms pauses;
    RMS 0.1 over the bursts. Returns the signal and the mask of burst samples."""
    rng = np.random.default_rng(seed)
    n = int(seconds * rate)
    on = np.zeros(n, dtype=bool)
    pos = int(0.2 * rate)
    while pos < n - int(0.5 * rate):
        length = int(rng.uniform(0.25, 0.4) * rate)
        on[pos: pos + length] = True
        pos += length + int(rng.uniform(0.15, 0.3) * rate)
    if noise_bursts:
        x = rng.standard_normal(n)
    else:
        t = np.arange(n) / rate
        x = sum(np.sin(2 * np.pi * 140 * k * t + rng.uniform(0, 2 * np.pi)) / k for k in range(1, 20))
    x = x * on
    return x / np.sqrt(np.mean(x[on] ** 2)) * 0.1, on


def write_audio(path: Path, seconds: float, rate: int, seed: int, fmt: str | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    audio, _ = speech_like(seconds, rate, seed)
    sf.write(str(path), audio.astype(np.float32), rate, format=fmt, subtype="PCM_16")


# --------------------------------------------------------------------------- corpus fixtures

LIBRITTS_SPEAKERS = {"19": "F", "26": "M", "103": "F"}
LIBRISPEECH_SPEAKERS = {"1089": "M", "121": "F"}


def write_libritts(root: Path, part: str = "train-clean-100", speakers: dict = LIBRITTS_SPEAKERS,
                   missing_text: str | None = None) -> Path:
    """LibriTTS/<part> as in the archive: SPEAKERS.txt, per-chapter trans.tsv/book.tsv, per-utterance
    .wav (24 kHz), .normalized.txt, .original.txt."""
    base = root / "LibriTTS"
    base.mkdir(parents=True, exist_ok=True)
    lines = [";ID  |SEX| SUBSET           |MINUTES| NAME"]
    lines += [f"{spk:<5}| {sex} | {part:<17}| 25.19 | Reader {spk}" for spk, sex in speakers.items()]
    (base / "SPEAKERS.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (base / "BOOKS.txt").write_text(";ID |TITLE\n", encoding="utf-8")
    for s, speaker in enumerate(speakers):
        chapter = str(198 + s)
        folder = base / part / speaker / chapter
        folder.mkdir(parents=True)
        rows = []
        for u in range(3):
            utt = f"{speaker}_{chapter}_{u:06d}_000000"
            text = f"Chapter {u + 1}, said reader {speaker}: it was the 2nd of May."
            normalized = f"Chapter {u + 1}, said reader {speaker}: it was the second of May."
            write_audio(folder / f"{utt}.wav", 1.2 + 0.3 * u, 24000, seed=100 * s + u)
            (folder / f"{utt}.original.txt").write_text(text, encoding="utf-8")
            if utt != missing_text:
                (folder / f"{utt}.normalized.txt").write_text(normalized, encoding="utf-8")
            rows.append(f"{utt}\t{text}\t{normalized}")
        (folder / f"{speaker}_{chapter}.trans.tsv").write_text("\n".join(rows) + "\n", encoding="utf-8")
        (folder / f"{speaker}_{chapter}.book.tsv").write_text("", encoding="utf-8")
    return root


def write_librispeech(root: Path, speakers: dict = LIBRISPEECH_SPEAKERS) -> Path:
    """LibriSpeech/test-clean as in the archive: SPEAKERS.TXT, <spk>/<chapter>/*.flac (16 kHz) and
    <spk>-<chapter>.trans.txt with upper-case transcripts; durations 4.5-6.5 s (inside 4-10 s)."""
    base = root / "LibriSpeech"
    base.mkdir(parents=True, exist_ok=True)
    lines = [";ID  |SEX| SUBSET           |MINUTES| NAME"]
    lines += [f"{spk:<5}| {sex} | test-clean       | 8.02 | Reader {spk}" for spk, sex in speakers.items()]
    (base / "SPEAKERS.TXT").write_text("\n".join(lines) + "\n", encoding="utf-8")
    for name in ("CHAPTERS.TXT", "BOOKS.TXT", "LICENSE.TXT", "README.TXT"):
        (base / name).write_text("", encoding="utf-8")
    for s, speaker in enumerate(speakers):
        chapter = str(134686 + s)
        folder = base / "test-clean" / speaker / chapter
        folder.mkdir(parents=True)
        rows = []
        for u in range(3):
            utt = f"{speaker}-{chapter}-{u:04d}"
            write_audio(folder / f"{utt}.flac", 4.5 + u, 16000, seed=500 + 10 * s + u, fmt="FLAC")
            rows.append(f"{utt} I THINK HE SAID THAT I'M NUMBER {u} OF THE {speaker} READERS")
        (folder / f"{speaker}-{chapter}.trans.txt").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return root


def write_mls(root: Path) -> Path:
    """mls_english/ as in the archive: metainfo.txt, train/transcripts.txt, train/audio/<spk>/<book>/*.flac.
    Speaker 4800 is clean (digital silence between words, dry); 5400 has white noise at 20 dB SNR."""
    base = root / "mls_english"
    (base / "train").mkdir(parents=True)
    (base / "metainfo.txt").write_text(
        "SPEAKER   |   GENDER   | PARTITION  |  MINUTES   |  BOOK ID   |   TITLE   |   CHAPTER   \n"
        "  4800    |     F      |   train    |   30.1     |   10003    |   Book    |   Ch 1      \n"
        "  5400    |     M      |   train    |   28.7     |   20004    |   Book    |   Ch 2      \n",
        encoding="utf-8")
    rows = []
    for speaker, book, noisy in (("4800", "10003", False), ("5400", "20004", True)):
        for u in range(2):
            utt = f"{speaker}_{book}_{u:06d}"
            path = base / "train" / "audio" / speaker / book / f"{utt}.flac"
            path.parent.mkdir(parents=True, exist_ok=True)
            audio, on = speech_like(3.0, 16000, seed=int(speaker) + u)
            if noisy:
                audio = audio + np.random.default_rng(u).standard_normal(len(audio)) * 0.1 * 10 ** (-20 / 20)
            sf.write(str(path), audio.astype(np.float32), 16000, format="FLAC", subtype="PCM_24")
            rows.append(f"{utt}\tand so the story of reader {speaker} goes on")
    (base / "train" / "transcripts.txt").write_text("\n".join(rows) + "\n", encoding="utf-8")
    return root


def tar_gz(folder: Path) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for path in sorted(folder.rglob("*")):
            tar.add(path, arcname=str(path.relative_to(folder)), recursive=False)
    return buffer.getvalue()


# --------------------------------------------------------------------------- HTTP server


class RangeServer:
    """Serves ``files`` (name -> bytes) with Range support; ``cut_after`` drops the connection
    of the next full response after that many bytes (an interrupted download)."""

    def __init__(self, files: dict[str, bytes]):
        self.files = files
        self.cut_after: int | None = None
        self.requests: list[tuple[str, str | None]] = []
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                name = self.path.lstrip("/")
                server.requests.append((name, self.headers.get("Range")))
                if name not in server.files:
                    self.send_error(404)
                    return
                data = server.files[name]
                match = re.match(r"bytes=(\d+)-$", self.headers.get("Range") or "")
                start = int(match.group(1)) if match else 0
                if start >= len(data) and match:
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{len(data)}")
                    self.end_headers()
                    return
                self.send_response(206 if match else 200)
                if match:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.send_header("Content-Length", str(len(data) - start))
                self.end_headers()
                body = data[start:]
                if server.cut_after is not None:
                    body, server.cut_after = body[: server.cut_after], None
                    self.wfile.write(body)
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(body)

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def served_archive(tmp_path):
    payload = tar_gz(write_libritts(tmp_path / "src", missing_text=None))
    server = RangeServer({"60/train-clean-100.tar.gz": payload})
    yield server, payload
    server.close()


def _archive(server, payload, checksum=None):
    digest = hashlib.sha256(payload).hexdigest()
    return Archive("libritts", "train-clean-100", f"{server.url}/60/train-clean-100.tar.gz",
                   checksum if checksum is not None else f"sha256:{digest}", "the test's own digest")


# --------------------------------------------------------------------------- download


def test_download_verifies_extracts_and_stamps(tmp_path, served_archive):
    server, payload = served_archive
    extracted = fetch(_archive(server, payload), tmp_path / "dl", progress=False)
    assert (extracted / "LibriTTS" / "train-clean-100" / "19").is_dir()
    stamp = json.loads((tmp_path / "dl" / "libritts" / "train-clean-100.json").read_text())
    assert stamp["sha256"] == hashlib.sha256(payload).hexdigest()
    assert stamp["bytes"] == len(payload)
    assert "matches the published checksum" in stamp["verified"]
    assert not list((tmp_path / "dl").rglob("*.part")) and not list((tmp_path / "dl").rglob("*.tmp"))


def test_interrupted_download_resumes_with_range(tmp_path, served_archive):
    server, payload = served_archive
    archive = _archive(server, payload)
    half = len(payload) // 2
    server.cut_after = half
    with pytest.raises(DownloadError, match=r"download failed after \d+ bytes.*run again to resume"):
        download(archive, tmp_path / "a", retries=0, progress=False)
    part = tmp_path / "a" / "train-clean-100.tar.gz.part"
    assert part.stat().st_size == half
    path, record = download(archive, tmp_path / "a", retries=0, progress=False)
    assert server.requests[-1] == ("60/train-clean-100.tar.gz", f"bytes={half}-")
    assert path.read_bytes() == payload and not part.exists()
    assert "matches" in record["verified"]

    # with retries the same interruption is resumed within one call
    server.cut_after, server.requests[:] = 1000, []
    path, _ = download(archive, tmp_path / "b", retries=1, progress=False)
    assert [r for _, r in server.requests] == [None, "bytes=1000-"]
    assert path.read_bytes() == payload


def test_checksum_mismatch_is_a_clear_error(tmp_path, served_archive):
    server, payload = served_archive
    archive = _archive(server, payload, checksum="sha256:" + "0" * 64)
    with pytest.raises(DownloadError) as err:
        fetch(archive, tmp_path / "dl", progress=False)
    message = str(err.value)
    assert "train-clean-100.tar.gz: sha256" in message and "differs from the published 000" in message
    assert "the test's own digest" in message and "removed" in message
    assert not (tmp_path / "dl" / "libritts" / "archives" / "train-clean-100.tar.gz").exists()
    assert not (tmp_path / "dl" / "libritts" / "train-clean-100.json").exists()


def test_archive_without_checksum_is_checked_by_its_gzip_crc(tmp_path, served_archive):
    server, payload = served_archive
    corrupt = bytearray(payload)
    corrupt[len(corrupt) // 2] ^= 0xFF
    server.files["60/train-clean-100.tar.gz"] = bytes(corrupt)
    archive = Archive("libritts", "train-clean-100", f"{server.url}/60/train-clean-100.tar.gz", None, "none published")
    with pytest.raises(DownloadError, match="cannot extract"):
        fetch(archive, tmp_path / "dl", progress=False)
    assert not (tmp_path / "dl" / "libritts" / "train-clean-100").exists()
    server.files["60/train-clean-100.tar.gz"] = payload
    (tmp_path / "dl" / "libritts" / "archives" / "train-clean-100.tar.gz").unlink()
    fetch(archive, tmp_path / "dl", progress=False)
    stamp = json.loads((tmp_path / "dl" / "libritts" / "train-clean-100.json").read_text())
    assert stamp["verified"].startswith("no published checksum (none published)")


def test_published_archives_of_each_corpus():
    libritts_only = required_archives("libritts", ["train-clean-100", "train-clean-360", "train-other-500"])
    assert [a.url for a in libritts_only] == [
        "https://www.openslr.org/resources/60/train-clean-100.tar.gz",
        "https://www.openslr.org/resources/60/train-clean-360.tar.gz",
        "https://www.openslr.org/resources/60/train-other-500.tar.gz",
        "https://www.openslr.org/resources/12/test-clean.tar.gz",
    ]
    assert all(a.checksum and a.checksum.startswith("sha256:") and len(a.checksum) == 7 + 64 for a in libritts_only)
    with_mls = required_archives("mls", [], mirrors={"mls": "http://mirror.example/mls"}, mls_audio="opus")
    assert [(a.source, a.url, a.checksum) for a in with_mls][0] == (
        "mls", "http://mirror.example/mls/mls_english_opus.tar.gz", None)
    with pytest.raises(CorpusError, match="no part 'train-clean-50'"):
        required_archives("libritts", ["train-clean-50"])


# --------------------------------------------------------------------------- prepare -> ingest


def _ingest(corpus: Path, out: Path, sample_rate: int) -> dict:
    limits = ValidationLimits(sample_rate=sample_rate, min_duration=0.5, max_duration=40.0)
    return ingest_corpus(corpus, out, limits=limits, dev_fraction=0.3, seed=7, progress=False)


def _speakers(manifest: Path) -> set[str]:
    return {json.loads(line)["speaker"] for line in manifest.read_text().splitlines()}


def test_libritts_recipe_gives_manifests_with_its_speakers_and_splits(tmp_path):
    downloads = tmp_path / "dl"
    write_libritts(downloads / "libritts" / "train-clean-100", missing_text="26_199_000001_000000")
    write_libritts(downloads / "libritts" / "train-clean-360", part="train-clean-360",
                   speakers={"1034": "M", "1089": "M"})  # 1089 also reads in test-clean
    write_librispeech(downloads / "librispeech" / "test-clean")
    corpus = tmp_path / "corpus"
    summary = prepare_corpus("libritts", downloads, corpus, sample_rate=24000,
                             libritts_parts=["train-clean-100", "train-clean-360"], workers=1, progress=False)
    assert summary["training_readers_left_out_as_test_readers"] == ["1089"]
    assert summary["parts"]["split/test"] == {"utterances": 6, "speakers": 2, "hours": summary["parts"]["split/test"]["hours"]}
    table = (corpus / "speakers.tsv").read_text().splitlines()
    assert table[0] == "speaker\tgender\tsource\tsubset\tsplit"
    assert "121\tF\tlibrispeech\ttest-clean\ttest" in table and "19\tF\tlibritts\ttrain-clean-100\ttrain" in table
    # the test set is resampled 16 -> 24 kHz and sentence-cased
    info = sf.info(str(corpus / "1089" / "1089-134686-0001.wav"))
    assert (info.samplerate, round(info.duration, 3)) == (24000, 5.5)
    assert (corpus / "1089" / "1089-134686-0001.txt").read_text() == \
        "I think he said that I'm number 1 of the 1089 readers\n"
    assert (corpus / "19" / "19_198_000000_000000.txt").read_text() == \
        "Chapter 1, said reader 19: it was the second of May.\n"

    result = _ingest(corpus, tmp_path / "manifests", 24000)
    manifests = tmp_path / "manifests"
    assert _speakers(manifests / "test_supervisions.jsonl") == set(LIBRISPEECH_SPEAKERS)
    train_dev = _speakers(manifests / "train_supervisions.jsonl") | _speakers(manifests / "dev_supervisions.jsonl")
    assert train_dev == {"19", "26", "103", "1034"}
    assert result["splits"]["test"]["utterances"] == 6
    assert result["accepted"] == 6 + 3 * 3 + 3 - 1
    quarantine = (manifests / "quarantine.tsv").read_text()
    assert "26_199_000001_000000" in quarantine and "pairing:" in quarantine

    # the test split gives both task lists (4-10 s targets; prompts of the same reader)
    lists = build_testlists(manifests / "test_cuts.jsonl", min_duration=4.0, max_duration=10.0,
                            prompt_seconds=3.0, max_items=2000, seed=1)
    assert len(lists["continuation"]) == 6 and len(lists["cross_sentence"]) == 6
    for item in lists["cross_sentence"]:
        assert item.prompt_id != item.target_id and item.prompt_id.split("-")[0] == item.speaker


def test_prepare_names_what_is_not_downloaded(tmp_path):
    write_librispeech(tmp_path / "dl" / "librispeech" / "test-clean")
    with pytest.raises(CorpusError, match=r"LibriTTS train-clean-360 is not there; run `arnar corpus download"):
        prepare_corpus("libritts", tmp_path / "dl", tmp_path / "c", sample_rate=24000,
                       libritts_parts=["train-clean-360"], progress=False)


def test_mls_recipe_keeps_only_clean_dry_readers(tmp_path):
    downloads = tmp_path / "dl"
    write_mls(downloads / "mls" / "english")
    write_librispeech(downloads / "librispeech" / "test-clean")
    corpus = tmp_path / "corpus"
    summary = prepare_corpus("mls", downloads, corpus, sample_rate=16000, libritts_parts=[],
                             mls_options={"audio": "flac", "estimator": "offline", "min_snr": 55.0, "min_c50": 55.0},
                             progress=False)
    assert summary["mls_filter"] == {"estimator": "offline", "min_snr": 55.0, "min_c50": 55.0, "measured": 4, "kept": 2}
    rows = [line.split("\t") for line in (corpus / "mls_quality.tsv").read_text().splitlines()[1:]]
    kept = {r[0]: r[4] for r in rows}
    assert kept == {"4800_10003_000000": "yes", "4800_10003_000001": "yes",
                    "5400_20004_000000": "no", "5400_20004_000001": "no"}
    noisy_snr = [float(r[1]) for r in rows if r[0].startswith("5400")]
    assert all(18.0 < snr < 22.0 for snr in noisy_snr)
    assert (corpus / "4800" / "4800_10003_000000.txt").read_text() == "And so the story of reader 4800 goes on\n"
    assert not (corpus / "5400").exists()
    _ingest(corpus, tmp_path / "manifests", 16000)
    assert _speakers(tmp_path / "manifests" / "test_supervisions.jsonl") == set(LIBRISPEECH_SPEAKERS)


def test_sentence_case():
    assert sentence_case("I THINK  I'LL GO ") == "I think I'll go"
    assert sentence_case("this is it i said") == "This is it I said"


# --------------------------------------------------------------------------- quality estimators


@pytest.mark.parametrize("snr", [10.0, 20.0, 30.0, 45.0])
def test_offline_snr_reads_a_known_snr(snr):
    clean, on = speech_like(4.0, 16000, seed=int(snr))
    power = np.mean(clean[on] ** 2)
    noise = np.random.default_rng(1).standard_normal(len(clean)) * np.sqrt(power / 10 ** (snr / 10))
    assert estimate_snr(clean + noise, 16000) == pytest.approx(snr, abs=1.5)


def _room(t60: float, rate: int, seed: int) -> np.ndarray:
    """An exponentially decaying noise impulse response (Polack's model) with the given T60."""
    t = np.arange(int(1.5 * t60 * rate)) / rate
    return np.random.default_rng(seed).standard_normal(len(t)) * np.exp(-3 * np.log(10) * t / t60)


def _true_c50(h: np.ndarray, rate: int) -> float:
    energy, k = h**2, int(0.05 * rate)
    return 10 * np.log10(energy[:k].sum() / energy[k:].sum())


def test_offline_c50_reads_known_rooms():
    rate = 16000
    dry, _ = speech_like(4.0, rate, seed=3, noise_bursts=True)
    readings = []
    for t60 in (0.1, 0.2, 0.4, 0.8):
        h = _room(t60, rate, seed=int(t60 * 10))
        wet = np.convolve(dry, h)[: len(dry)]
        wet = wet / np.std(wet) * 0.1 + np.random.default_rng(0).standard_normal(len(wet)) * 1e-5  # 80 dB below
        estimate, truth = estimate_c50(wet, rate), _true_c50(h, rate)
        # picking the largest drops reads the tail's random dips too: up to 4 dB above the truth
        assert truth - 1.0 <= estimate <= truth + 4.0, (t60, truth, estimate)
        readings.append(estimate)
    assert readings == sorted(readings, reverse=True)  # more reverberant rooms read lower
    assert estimate_c50(dry, rate) == C50_CAP  # a dry recording with silent pauses reads the cap
    assert OfflineEstimator()(dry, rate).snr == 100.0


def test_c50_reading_is_bounded_by_the_noise_floor():
    dry, _ = speech_like(4.0, 16000, seed=5, noise_bursts=True)
    noisy = dry + np.random.default_rng(2).standard_normal(len(dry)) * 0.1 * 10 ** (-30 / 20)
    assert estimate_c50(noisy, 16000) < 32.0


def test_brouhaha_is_explicit_when_missing_and_auto_falls_back(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_brouhaha(name, *args, **kwargs):
        if name.startswith(("brouhaha", "pyannote")):
            raise ImportError(f"No module named {name!r}", name=name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_brouhaha)
    with pytest.raises(QualityUnavailableError, match="Brouhaha cannot run: .* is not installed.*estimator=offline"):
        BrouhahaEstimator()
    assert make_estimator("auto").name == "offline"
    with pytest.raises(CorpusError, match="none of brouhaha, offline, auto"):
        make_estimator("neural")


# --------------------------------------------------------------------------- CLI and DAG


def test_cli_download_error_is_one_line(tmp_path, served_archive):
    server, _ = served_archive
    result = subprocess.run(
        [str(BIN / "arnar"), "corpus", "download", "--source", "libritts", "--part", "train-clean-100",
         "--download-dir", str(tmp_path), "--mirror-openslr", server.url, "--retries", "0"],
        capture_output=True, text=True)
    # the fixture's archive is not the real LibriTTS part: the published checksum rejects it
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("arnar corpus: error: ") and "differs from the published c5608bf1" in lines[-1]
    assert "Traceback" not in result.stderr


# The rules of the whole DAG that a libritts build does not run, and why.
NOT_IN_LIBRITTS_DAG = {
    "synth_corpus": "synth corpus only (defined for the synth profiles, not for a downloaded corpus)",
    "train_codec": "trains the offline codec; libritts tokenizes with the pretrained S3 and DAC",
    "align": "the pocketsphinx/oracle aligners; libritts aligns with MFA (align_mfa)",
    "align_codec_labels": "pocketsphinx phone labels for the offline codec (a synth profile with train_aligner set)",
    "alignment_accuracy": "scores an aligner against synth's own timings (libritts: score_splits: [])",
    "coarse_tokens": "CoD Table V's coarse tokens come from the offline codec; libritts models S3/DAC tokens",
}


def _rule_names(cwd: Path, profile: str) -> set[str]:
    out = run([str(BIN / "snakemake"), "--list-rules", "--config", f"profile={profile}"], cwd).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip() and not line.startswith(" ")}


def test_libritts_dry_run_plans_every_rule(tmp_path):
    workflow = copy_workflow(tmp_path / "wf")
    frozen = workflow / "src" / "arnar" / "evaluate" / "testlists" / "libritts"
    assert not frozen.exists()  # the lists are frozen by the first real build
    # the default target and every phase target (dvc.yaml's stages run those)
    targets = ["all", "data", "alignment", "tokens", "training", "evaluate", "report"]
    result = run([str(BIN / "snakemake"), "-n", "--cores", "all", *targets, "--config", "profile=libritts"], workflow)
    stats = result.stdout[result.stdout.index("Job stats:"):]
    planned = {m.group(1) for m in re.finditer(r"^(\w+)\s+\d+$", stats, re.MULTILINE)} - {"total"}
    defined = _rule_names(workflow, "libritts") | _rule_names(workflow, "smoke")
    expected = defined - set(NOT_IN_LIBRITTS_DAG)
    assert planned == expected, (sorted(expected - planned), sorted(planned - expected))
    assert {"corpus_download", "corpus_prepare", "freeze_testlists", "manifests", "align_mfa"} <= planned
    downloads = sorted(re.findall(r"output: (data/downloads/\S+\.json)", result.stdout))
    assert downloads == ["data/downloads/librispeech/test-clean.json", "data/downloads/libritts/train-clean-100.json",
                         "data/downloads/libritts/train-clean-360.json", "data/downloads/libritts/train-other-500.json"]
    assert not (workflow / "data").exists()  # a dry run downloads nothing
