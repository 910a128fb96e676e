"""Corpus recipes: the paper-scale corpora, downloaded, verified and laid out for ``arnar ingest``.

A corpus name (``corpus.name`` in params.yaml) other than the embedded ``synth`` is assembled
from downloaded sources:

``libritts``
    training readers: LibriTTS ``corpus.libritts_parts`` (the papers use all three training
    parts, 585 h); test readers: LibriSpeech test-clean (the papers' zero-shot test set).
``mls``
    Chain-of-Details-Large's data: the same, plus the MLS English training utterances that pass
    CoD's quality filter (SNR > 55 dB, C50 > 55; :mod:`.mls`, :mod:`.quality`). Set
    ``libritts_parts: []`` for MLS alone.

Two steps, each a CLI subcommand and a Snakemake rule:
  1. ``download`` (:func:`download_part`): one archive -> ``<download_dir>/<source>/<part>/``
     with Range resume and checksum verification (:mod:`.download`), and a stamp file.
  2. ``prepare`` (:func:`prepare_corpus`): the extracted sources -> the corpus folder
     (:mod:`.corpus`): readers of the test set go to ``test``, everyone else to ``train``
     (ingest draws ``dev`` from it). A training reader who is also a test reader (LibriVox ids
     are shared across the corpora) is left out of training, and the count is in the summary.
"""

from __future__ import annotations

from pathlib import Path

from arnar.corpus.manifests import CorpusError
from arnar.corpus.recipes import librispeech, libritts, mls
from arnar.corpus.recipes.corpus import SourceItem, write_corpus
from arnar.corpus.recipes.download import Archive, DownloadError, fetch

__all__ = ["CORPORA", "DEFAULT_MIRRORS", "DownloadError", "archive_for", "download_part", "prepare_corpus",
           "required_archives"]

CORPORA = ("libritts", "mls")
DEFAULT_MIRRORS = {"openslr": "https://www.openslr.org/resources", "mls": "https://dl.fbaipublicfiles.com/mls"}


def archive_for(source: str, part: str, *, mirrors: dict | None = None, mls_audio: str = "flac") -> Archive:
    """The archive of one part of one source (``libritts``, ``librispeech`` or ``mls``)."""
    mirrors = {**DEFAULT_MIRRORS, **(mirrors or {})}
    if source == "libritts":
        return libritts.archive(part, mirrors["openslr"])
    if source == "librispeech":
        return librispeech.archive(part, mirrors["openslr"])
    if source == "mls":
        if part != mls.PART:
            raise CorpusError(f"MLS: only the part {mls.PART!r} is used, not {part!r}")
        return mls.archive(mls_audio, mirrors["mls"])
    raise CorpusError(f"unknown corpus source {source!r} (libritts, librispeech, mls)")


def required_archives(name: str, libritts_parts: list[str], *, mirrors: dict | None = None,
                      mls_audio: str = "flac") -> list[Archive]:
    """Every archive corpus ``name`` is built from, in a fixed order."""
    if name not in CORPORA:
        raise CorpusError(f"corpus.name: {name!r} has no download recipe (recipes: {', '.join(CORPORA)})")
    wanted = [archive_for("libritts", part, mirrors=mirrors) for part in libritts_parts]
    if name == "mls":
        wanted.append(archive_for("mls", mls.PART, mirrors=mirrors, mls_audio=mls_audio))
    if not wanted:
        raise CorpusError("corpus.libritts_parts is empty and the corpus has no other training source")
    wanted.append(archive_for("librispeech", librispeech.TEST_PART, mirrors=mirrors))
    return wanted


def download_part(source: str, part: str, download_dir: Path, *, mirrors: dict | None = None,
                  mls_audio: str = "flac", retries: int = 3, keep_archive: bool = True,
                  progress: bool = True) -> Path:
    """Download, verify and extract one part; return the extracted folder."""
    archive = archive_for(source, part, mirrors=mirrors, mls_audio=mls_audio)
    return fetch(archive, Path(download_dir), retries=retries, keep_archive=keep_archive, progress=progress)


def prepare_corpus(name: str, download_dir: Path, out_dir: Path, *, sample_rate: int,
                   libritts_parts: list[str], mls_options: dict | None = None, workers: int = 1,
                   progress: bool = True) -> dict:
    """Lay out corpus ``name`` from its extracted sources in ``out_dir`` (the ingest layout)."""
    if name not in CORPORA:
        raise CorpusError(f"corpus.name: {name!r} has no download recipe (recipes: {', '.join(CORPORA)})")
    download_dir, out_dir = Path(download_dir), Path(out_dir)
    test = librispeech.items(download_dir / "librispeech" / librispeech.TEST_PART)
    train: list[SourceItem] = []
    for part in libritts_parts:
        train += libritts.items(download_dir / "libritts" / part, part)
    extra = {"corpus": name}
    if name == "mls":
        options = dict(mls_options or {})
        audio_format = options.pop("audio", "flac")
        candidates = mls.items(download_dir / "mls" / mls.PART, audio_format)
        kept, extra["mls_filter"] = mls.quality_filter(candidates, out_dir, workers=workers,
                                                       progress=progress, **options)
        train += kept
    if not train:
        raise CorpusError(f"corpus {name!r}: no training utterances (corpus.libritts_parts and the MLS filter)")
    test_speakers = {item.speaker for item in test}
    overlap = sorted({item.speaker for item in train} & test_speakers)
    if overlap:
        train = [item for item in train if item.speaker not in test_speakers]
    extra["training_readers_left_out_as_test_readers"] = overlap
    return write_corpus(train + test, out_dir, sample_rate=sample_rate, workers=workers,
                        extra_summary=extra, progress=progress)
