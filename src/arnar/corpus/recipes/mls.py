"""MLS English (Pratap et al., 2020; OpenSLR 94) with Chain-of-Details' quality filter.

CoD-Large trains on LibriTTS plus the MLS English utterances with SNR > 55 dB and C50 > 55
(Brouhaha estimates; about 3,000 h survive). CoD fetched those books at 44.1 kHz from LibriVox;
MLS itself is 16 kHz, which is what this recipe uses (resampled to the corpus rate).

Layout of the extracted archive (``mls_english_opus`` and ``.opus`` for the compressed one)::

    mls_english/metainfo.txt   "SPEAKER | GENDER | PARTITION | MINUTES | BOOK ID | TITLE | CHAPTER"
    mls_english/train/transcripts.txt               "<speaker>_<book>_<segment>\t<text>"
    mls_english/train/audio/<speaker>/<book>/<speaker>_<book>_<segment>.flac

The training partition is used. Its transcripts are lower case without punctuation; they are
sentence-cased like LibriSpeech's. The filter measures every utterance with the chosen
estimator (:mod:`.quality`) and writes ``mls_quality.tsv`` into the corpus folder (id, SNR,
C50, estimator, kept), so the selection is auditable and the estimator that made it is named.

MLS publishes no checksum for its archives (neither the OpenSLR 94 page nor the download
server lists one): the download checks the size against the server's and the gzip CRC while
extracting, and records the sha256 (:mod:`.download`).
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import soundfile as sf
from tqdm import tqdm

from arnar.corpus.manifests import CorpusError
from arnar.corpus.recipes.corpus import SourceItem, sentence_case
from arnar.corpus.recipes.download import Archive
from arnar.corpus.recipes.quality import OfflineEstimator, make_estimator

log = logging.getLogger(__name__)

SOURCE = "mls"
PART = "english"
ARCHIVES = {"flac": "mls_english.tar.gz", "opus": "mls_english_opus.tar.gz"}
NO_CHECKSUM = "MLS publishes no checksum on OpenSLR 94 or dl.fbaipublicfiles.com"
QUALITY_TABLE = "mls_quality.tsv"


def archive(audio_format: str, mirror: str) -> Archive:
    if audio_format not in ARCHIVES:
        raise CorpusError(f"corpus.mls.audio: {audio_format!r} is neither flac nor opus")
    return Archive(SOURCE, PART, f"{mirror.rstrip('/')}/{ARCHIVES[audio_format]}", None, NO_CHECKSUM)


def _corpus_root(extracted: Path, audio_format: str) -> Path:
    return Path(extracted) / ("mls_english" if audio_format == "flac" else "mls_english_opus")


def items(extracted: Path, audio_format: str = "flac", partition: str = "train") -> list[SourceItem]:
    root = _corpus_root(extracted, audio_format)
    transcripts = root / partition / "transcripts.txt"
    if not transcripts.is_file():
        raise CorpusError(f"{transcripts}: MLS English is not there; run `arnar corpus download --source mls` first")
    genders = {}
    metainfo = root / "metainfo.txt"
    if not metainfo.is_file():
        raise CorpusError(f"{metainfo}: MLS speaker table not found")
    for number, line in enumerate(metainfo.read_text(encoding="utf-8").splitlines(), start=1):
        fields = [f.strip() for f in line.split("|")]
        if number == 1 or not line.strip():
            continue  # the header
        if len(fields) < 3 or not fields[0].isdigit():
            raise CorpusError(f"{metainfo}:{number}: expected 'SPEAKER | GENDER | PARTITION | ...', got {line!r}")
        genders[fields[0]] = fields[1].upper()[:1]
    suffix = ".flac" if audio_format == "flac" else ".opus"
    found = []
    for number, line in enumerate(transcripts.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        utt_id, tab, text = line.partition("\t")
        parts = utt_id.split("_")
        if not tab or len(parts) != 3:
            raise CorpusError(f"{transcripts}:{number}: expected '<speaker>_<book>_<segment>\\t<text>', got {line!r}")
        speaker, book, _ = parts
        audio = root / partition / "audio" / speaker / book / f"{utt_id}{suffix}"
        found.append(SourceItem(utt_id, speaker, audio, sentence_case(text) if text.strip() else None,
                                SOURCE, f"english-{partition}", genders.get(speaker, ""), "train"))
    return found


def _measure_offline(path: str) -> tuple[float, float] | str:
    try:
        audio, rate = sf.read(path, dtype="float32", always_2d=True)
        quality = OfflineEstimator()(audio.mean(axis=1), rate)
    except Exception as err:  # unreadable or too short: reported in the table, not fatal
        return f"{type(err).__name__}: {err}"
    return quality.snr, quality.c50


def quality_filter(candidates: list[SourceItem], out_dir: Path, *, min_snr: float, min_c50: float,
                   estimator: str = "auto", brouhaha_model: str | None = None, workers: int = 1,
                   progress: bool = True) -> tuple[list[SourceItem], dict]:
    """Keep the items with SNR > min_snr and C50 > min_c50; write the quality table."""
    chosen = make_estimator(estimator, *([brouhaha_model] if brouhaha_model else []))
    paths = [str(item.audio) for item in candidates]
    if chosen.name == "offline" and workers > 1:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            measured = list(tqdm(pool.map(_measure_offline, paths, chunksize=16), total=len(paths),
                                 desc="mls quality", unit="utt", disable=not progress))
    else:
        measured = []
        for path in tqdm(paths, desc="mls quality", unit="utt", disable=not progress):
            try:
                audio, rate = sf.read(path, dtype="float32", always_2d=True)
                quality = chosen(audio.mean(axis=1), rate)
                measured.append((quality.snr, quality.c50))
            except (sf.SoundFileError, RuntimeError, OSError, CorpusError) as err:
                measured.append(f"{type(err).__name__}: {err}")
    kept, rows = [], ["utt_id\tsnr\tc50\testimator\tkept\tnote\n"]
    for item, result in zip(candidates, measured):
        if isinstance(result, str):
            rows.append(f"{item.utt_id}\t\t\t{chosen.name}\tno\t{result}\n")
            continue
        snr, c50 = result
        keep = snr > min_snr and c50 > min_c50
        rows.append(f"{item.utt_id}\t{snr:.2f}\t{c50:.2f}\t{chosen.name}\t{'yes' if keep else 'no'}\t\n")
        if keep:
            kept.append(item)
    table = Path(out_dir) / QUALITY_TABLE
    table.parent.mkdir(parents=True, exist_ok=True)
    tmp = table.with_name(f".tmp.{table.name}")
    tmp.write_text("".join(rows), encoding="utf-8")
    os.replace(tmp, table)
    stats = {"estimator": chosen.name, "min_snr": min_snr, "min_c50": min_c50,
             "measured": len(candidates), "kept": len(kept)}
    log.info("MLS quality filter (%s): kept %d of %d", chosen.name, len(kept), len(candidates))
    return kept, stats
