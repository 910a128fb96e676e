"""Your own recordings (``corpus.name: folder``): a folder of audio and transcripts laid out as the
corpus folder ``arnar ingest`` reads (the layout :mod:`arnar.corpus.synth` writes).

What the folder at ``corpus.path`` may hold (docs/own-corpus.md has the user's version)::

    one speaker                          several speakers (one sub-folder each)
    <path>/a.wav  <path>/a.txt           <path>/alice/a.wav  <path>/alice/a.txt
    <path>/b.flac <path>/b.txt           <path>/bob/metadata.csv  <path>/bob/wavs/001.flac
    or <path>/metadata.csv + wavs/       or <path>/metadata.csv naming every speaker's files

- Audio: ``.wav`` or ``.flac`` at any sampling rate, mono or not. Names starting with a dot are
  ignored (editors' and macOS's side files).
- Speakers: audio at the top of ``<path>`` (or in its ``wavs/``) is one speaker, named after the
  folder; otherwise every sub-folder is a speaker, its audio directly inside or in its ``wavs/``.
- Transcripts: from the nearest ``metadata.csv`` (the speaker's folder, else ``<path>``), in
  LJSpeech's form ``id|text`` or ``id|text|normalized text`` (the normalized text is used when
  present; ``id`` is the audio file's name without its suffix); without one, from ``<id>.txt``
  beside the audio file.
- Utterance ids: the file's stem for one speaker; ``<speaker>_<stem>`` for several (so that every
  speaker's ``001.wav`` stays distinct), unless the stem already starts with ``<speaker>_``.
  Characters other than letters, digits, ``.``, ``_`` and ``-`` become ``_``.
- Test split: ``corpus.test_speakers`` speakers are held out (the zero-shot test set), the ones
  whose seeded hash ``sha256("<seed>:<speaker>")`` is smallest: deterministic, and adding a
  speaker moves at most one other out of the test set.

Output (``out_dir``)::

    speakers.tsv                 speaker  folder  split
    <speaker>/<id>.wav           mono 16-bit PCM at ``sample_rate`` (soxr, as the other recipes)
    <speaker>/<id>.txt           the transcript, copied byte for byte from a .txt file
    sources.tsv                  id  audio  transcript: where each item came from (relative to <path>)
    summary.json                 counts, source rates, test speakers, items kept as they were
    build_log.json               wall time and workers (not deterministic)

Nothing is validated or dropped here: ingest's checks and quarantine apply as to every corpus.
An audio file that cannot be converted faithfully (empty, truncated, unreadable) is copied byte
for byte under its ``.wav`` name, so ingest quarantines it with its usual reason (``audio:
truncated (...)``, ``audio: unreadable (...)``); an audio file without a transcript gets no
``.txt`` (``pairing: audio has no transcript file``); a transcript without audio gets no ``.wav``
(``pairing: transcript has no audio file``). Only what makes the layout itself ambiguous (two
audio files for one id, audio both at the top and in speaker folders, a metadata.csv that is not
UTF-8 or repeats an id) stops the recipe, with one line naming the file.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import struct
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf

from arnar import atomic
from arnar.corpus.manifests import CorpusError, parallel_map
from arnar.corpus.validate import wav_declared_data_bytes

log = logging.getLogger(__name__)

AUDIO_SUFFIXES = (".wav", ".flac")
METADATA_NAME = "metadata.csv"
AUDIO_SUBFOLDER = "wavs"  # LJSpeech keeps its audio here, beside metadata.csv
_UNSAFE = re.compile(r"[^\w.-]+")


@dataclass(frozen=True)
class FolderItem:
    """One utterance found in the folder: audio and/or transcript (one of them may be missing)."""

    utt_id: str
    speaker: str
    audio: Path | None
    transcript: bytes | None  # exactly what the .txt held, or the metadata text + newline
    transcript_source: str    # "<file>" or "<metadata.csv>:<line>", relative to the folder; "" if none


def safe_name(name: str) -> str:
    """A speaker or id usable as a file name and a TSV field."""
    return _UNSAFE.sub("_", name).strip("_") or "_"


def _visible(path: Path) -> bool:
    return not path.name.startswith(".")


def _audio_files(folder: Path) -> list[Path]:
    """Audio directly in ``folder`` and in its ``wavs/``."""
    found = []
    for where in (folder, folder / AUDIO_SUBFOLDER):
        if where.is_dir():
            found += [p for p in where.iterdir()
                      if p.is_file() and _visible(p) and p.suffix.lower() in AUDIO_SUFFIXES]
    return sorted(found)


def read_metadata(path: Path) -> dict[str, tuple[str, int]]:
    """id -> (transcript, line number) from an LJSpeech-style ``id|text[|normalized text]`` file."""
    try:
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise CorpusError(f"{path}: not valid UTF-8 (byte {err.start})") from None
    entries: dict[str, tuple[str, int]] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        fields = line.split("|", 2)
        utt_id = fields[0].strip()
        if not utt_id:
            raise CorpusError(f"{path}:{number}: no id before the first '|'")
        if utt_id in entries:
            raise CorpusError(f"{path}:{number}: id {utt_id!r} is already on line {entries[utt_id][1]}")
        # the normalized text (numbers and abbreviations spelled out) where the file has it;
        # a line with no text keeps an empty transcript, which ingest quarantines
        normalized = fields[2].strip() if len(fields) == 3 else ""
        entries[utt_id] = (normalized or (fields[1].strip() if len(fields) > 1 else ""), number)
    return entries


def _speaker_folders(root: Path) -> tuple[list[tuple[str, Path]], bool]:
    """(speaker name, folder) pairs and whether the folder is one speaker."""
    subfolders = sorted(p for p in root.iterdir() if p.is_dir() and _visible(p))
    if _audio_files(root) or ((root / METADATA_NAME).is_file() and not subfolders):
        others = [p.name for p in subfolders if p.name != AUDIO_SUBFOLDER]
        if others:
            raise CorpusError(f"{root}: audio files at the top and sub-folders ({', '.join(others[:3])}): "
                              f"put every speaker's files in a sub-folder of their own, or keep one speaker's at the top")
        return [(safe_name(root.resolve().name), root)], True
    speakers: dict[str, Path] = {}
    for folder in subfolders:
        name = safe_name(folder.name)
        if name in speakers:
            raise CorpusError(f"{speakers[name]} and {folder}: both speaker folders read as {name!r}; rename one")
        speakers[name] = folder
    return sorted(speakers.items()), False


def scan_folder(root: Path) -> tuple[list[FolderItem], dict]:
    """Every utterance of the folder at ``root`` and a description of what was found."""
    root = Path(root)
    if not root.is_dir():
        raise CorpusError(f"{root}: corpus folder does not exist (corpus.path)")
    speakers, one_speaker = _speaker_folders(root)
    top_metadata = read_metadata(root / METADATA_NAME) if (root / METADATA_NAME).is_file() else None
    items: list[FolderItem] = []
    used_top_ids: dict[str, Path] = {}
    for speaker, folder in speakers:
        own = folder / METADATA_NAME
        metadata, metadata_path = None, None
        if own.is_file() and not one_speaker:
            metadata, metadata_path = read_metadata(own), own
        elif top_metadata is not None:
            metadata, metadata_path = top_metadata, root / METADATA_NAME
        by_id: dict[str, FolderItem] = {}
        found_at: dict[str, Path] = {}

        def add(item: FolderItem, path: Path) -> None:
            if item.utt_id in by_id:
                raise CorpusError(f"{found_at[item.utt_id]} and {path}: both read as utterance {item.utt_id!r}; "
                                  f"rename or remove one")
            by_id[item.utt_id], found_at[item.utt_id] = item, path

        def utt_id(stem: str) -> str:
            stem = safe_name(stem)
            return stem if one_speaker or stem.startswith(f"{speaker}_") else f"{speaker}_{stem}"

        for audio in _audio_files(folder):
            stem = audio.name[: -len(audio.suffix)]
            if metadata is not None:
                entry = metadata.get(stem)
                if metadata_path == root / METADATA_NAME and not one_speaker and entry is not None:
                    if stem in used_top_ids:
                        raise CorpusError(f"{metadata_path}: id {stem!r} names {used_top_ids[stem]} and {audio}; "
                                          f"give the files distinct names or each speaker its own {METADATA_NAME}")
                    used_top_ids[stem] = audio
                transcript = None if entry is None else (entry[0] + "\n").encode("utf-8")
                source = "" if entry is None else f"{metadata_path.relative_to(root)}:{entry[1]}"
            else:
                text_path = audio.with_name(f"{stem}.txt")
                transcript = text_path.read_bytes() if text_path.is_file() else None
                source = str(text_path.relative_to(root)) if transcript is not None else ""
            add(FolderItem(utt_id(stem), speaker, audio, transcript, source), audio)
        # transcripts without audio: written alone, so that ingest reports them
        if metadata is not None and metadata_path == own:
            stems = {a.name[: -len(a.suffix)] for a in _audio_files(folder)}
            for stem, (text, line) in sorted(metadata.items()):
                if stem not in stems:
                    add(FolderItem(utt_id(stem), speaker, None, (text + "\n").encode("utf-8"),
                                   f"{own.relative_to(root)}:{line}"), own)
        elif metadata is None:
            audio_stems = {a.with_suffix("") for a in _audio_files(folder)}
            for where in (folder, folder / AUDIO_SUBFOLDER):
                if not where.is_dir():
                    continue
                for text_path in sorted(where.glob("*.txt")):
                    if _visible(text_path) and text_path.with_suffix("") not in audio_stems:
                        add(FolderItem(utt_id(text_path.stem), speaker, None, text_path.read_bytes(),
                                       str(text_path.relative_to(root))), text_path)
        items += by_id.values()

    unmatched = []
    if top_metadata is not None and not one_speaker:
        unmatched = sorted(set(top_metadata) - set(used_top_ids))
    if not items:
        raise CorpusError(f"{root}: no audio or transcripts found (expected .wav or .flac files with a .txt "
                          f"beside each, or a {METADATA_NAME}; see docs/own-corpus.md)")
    with_items = {item.speaker for item in items}
    found = {
        "layout": "one speaker" if one_speaker else "speaker folders",
        "folders_without_utterances": sorted(str(f.relative_to(root)) for s, f in speakers if s not in with_items),
        # ids of a top-level metadata.csv that name no audio file of any speaker
        "metadata_ids_without_audio": unmatched,
        "folders": {speaker: str(folder.relative_to(root)) or "." for speaker, folder in speakers},
    }
    if unmatched:
        log.warning("%s: %d ids name no audio file of any speaker (e.g. %s)", root / METADATA_NAME,
                    len(unmatched), unmatched[0])
    return sorted(items, key=lambda i: (i.speaker, i.utt_id)), found


def held_out_speakers(speakers: list[str], n_test: int, seed: int) -> set[str]:
    """The ``n_test`` speakers with the smallest seeded hash: the test split."""
    if not 0 <= n_test < len(speakers):
        raise CorpusError(f"corpus.test_speakers ({n_test}) must be fewer than the folder's speakers "
                          f"({len(speakers)}), so that some are left for training")

    def rank(speaker: str) -> bytes:
        return hashlib.sha256(f"{seed}:{speaker}".encode()).digest()

    return set(sorted(speakers, key=rank)[:n_test])


def _convert(job: tuple[FolderItem, str, int]) -> tuple[str, int, int | None, str | None]:
    """Write one item; return (id, samples written, source rate, why the audio was kept as it was)."""
    from arnar.evaluate.audio import resample

    item, out_dir, sample_rate = job
    speaker_dir = Path(out_dir) / item.speaker
    if item.transcript is not None:
        atomic.write_bytes(speaker_dir / f"{item.utt_id}.txt", item.transcript)
    if item.audio is None:
        return item.utt_id, 0, None, None
    target = speaker_dir / f"{item.utt_id}.wav"

    def keep_as_is(why: str) -> tuple[str, int, int | None, str]:
        # ingest reads the same bytes and quarantines the item with its own reason
        with atomic.atomic_path(target) as tmp:
            shutil.copyfile(item.audio, tmp)
        return item.utt_id, 0, None, why

    if item.audio.stat().st_size == 0:
        return keep_as_is("empty file")
    try:
        declared = wav_declared_data_bytes(item.audio)
    except (OSError, struct.error) as err:
        return keep_as_is(f"unreadable header ({err})")
    if declared is not None and declared[0] > declared[1]:
        # libsndfile would read the part that is there as a shorter file
        return keep_as_is(f"truncated ({declared[1]} of {declared[0]} data bytes)")
    try:
        samples, rate = sf.read(str(item.audio), dtype="float32", always_2d=True)
    except Exception as err:  # libsndfile raises several types; all mean "cannot be read"
        return keep_as_is(f"unreadable ({type(err).__name__})")
    if samples.shape[0] == 0:
        return keep_as_is("no samples")
    audio = resample(samples.mean(axis=1), rate, sample_rate)
    if np.all(np.isfinite(audio)):
        # resampling can overshoot full scale by a hair on loud peaks; clip rather than wrap around
        audio, subtype = np.clip(audio, -1.0, 1.0), "PCM_16"
    else:
        subtype = "FLOAT"  # keeps the NaN/inf for ingest to report
    with atomic.atomic_path(target) as tmp:
        sf.write(str(tmp), audio, sample_rate, subtype=subtype)
    return item.utt_id, len(audio), int(rate), None


def _remove_stale(out_dir: Path, written: set[Path]) -> None:
    """Utterance files of an earlier build that this one did not write (a removed source file)."""
    for speaker_dir in (p for p in out_dir.iterdir() if p.is_dir()):
        for path in speaker_dir.iterdir():
            if path.suffix in (".wav", ".txt") and path not in written:
                path.unlink()
        if not any(speaker_dir.iterdir()):
            speaker_dir.rmdir()


def prepare_folder_corpus(source: Path, out_dir: Path, *, sample_rate: int, test_speakers: int, seed: int,
                          workers: int = 1, progress: bool = True) -> dict:
    """Lay out the folder ``source`` as the corpus folder ``out_dir``; return its summary."""
    started = time.time()
    source, out_dir = Path(source), Path(out_dir)
    items, found = scan_folder(source)
    resolved_source, resolved_out = source.resolve(), out_dir.resolve()
    if resolved_out == resolved_source or resolved_source in resolved_out.parents or \
            resolved_out in resolved_source.parents:
        raise CorpusError(f"{out_dir}: the corpus folder must lie outside {source} and not contain it")
    # an earlier build's files that this one does not write are removed below: only in a corpus folder
    if out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / "speakers.tsv").is_file():
        raise CorpusError(f"{out_dir}: not empty and not a corpus folder (no speakers.tsv); choose a new folder")
    speakers = sorted({item.speaker for item in items})
    test = held_out_speakers(speakers, test_speakers, seed)

    for speaker in speakers:
        (out_dir / speaker).mkdir(parents=True, exist_ok=True)
    results = parallel_map(_convert, [(item, str(out_dir), sample_rate) for item in items], workers=workers,
                           desc="convert", progress=progress)
    written = {out_dir / i.speaker / f"{i.utt_id}{suffix}" for i in items
               for suffix, there in ((".wav", i.audio), (".txt", i.transcript)) if there is not None}
    _remove_stale(out_dir, written)

    folders = found.pop("folders")
    atomic.write_text(out_dir / "speakers.tsv", "speaker\tfolder\tsplit\n" + "".join(
        f"{speaker}\t{folders[speaker]}\t{'test' if speaker in test else 'train'}\n" for speaker in speakers))
    atomic.write_text(out_dir / "sources.tsv", "utt_id\taudio\ttranscript\n" + "".join(
        f"{i.utt_id}\t{i.audio.relative_to(source) if i.audio else ''}\t{i.transcript_source}\n" for i in items))

    samples = {utt: n for utt, n, _, _ in results}
    kept = {utt: why for utt, _, _, why in results if why}
    per_split: dict[str, dict] = {}
    for split in ("train", "test"):
        chosen = [i for i in items if (i.speaker in test) == (split == "test")]
        per_split[split] = {
            "speakers": len({i.speaker for i in chosen}),
            "audio_files": sum(i.audio is not None for i in chosen),
            "hours": round(sum(samples[i.utt_id] for i in chosen) / sample_rate / 3600, 4),
        }
    summary = {
        "corpus": "folder",
        "sample_rate": sample_rate,
        "speakers": len(speakers),
        "test_speakers": sorted(test),
        "audio_files": sum(i.audio is not None for i in items),
        "transcripts": sum(i.transcript is not None for i in items),
        "audio_without_transcript": sorted(i.utt_id for i in items if i.transcript is None),
        "transcript_without_audio": sorted(i.utt_id for i in items if i.audio is None),
        # audio that could not be converted, copied as it was for ingest to quarantine
        "audio_kept_as_is": dict(sorted(kept.items())),
        "source_sample_rates": {str(r): n for r, n in sorted(Counter(r for _, _, r, _ in results if r).items())},
        "hours": round(sum(samples.values()) / sample_rate / 3600, 4),
        "splits": per_split,
        **found,
    }
    atomic.write_text(out_dir / "summary.json", json.dumps(summary, indent=2, sort_keys=True) + "\n")
    seconds = time.time() - started
    atomic.write_text(out_dir / "build_log.json", json.dumps(
        {"build_seconds": round(seconds, 2), "workers": workers}, indent=2) + "\n")
    for what in ("audio_without_transcript", "transcript_without_audio"):
        if summary[what]:
            log.warning("%d items with %s (ingest quarantines them), e.g. %s", len(summary[what]),
                        what.replace("_", " "), summary[what][0])
    if kept:
        log.warning("%d audio files could not be converted and were copied as they were (ingest quarantines "
                    "them), e.g. %s: %s", len(kept), *next(iter(sorted(kept.items()))))
    return summary


def folder_fingerprint(source: str | os.PathLike) -> str:
    """What the folder holds (every file's name, size and modification time), as one digest: the
    Snakemake rule reruns when it changes. An absent folder gives ``""``."""
    root = Path(source)
    if not root.is_dir():
        return ""
    entries = []
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = [d for d in subfolders if not d.startswith(".")]
        for name in files:
            if not name.startswith("."):
                path = os.path.join(folder, name)
                stat = os.stat(path)
                entries.append(f"{os.path.relpath(path, root)}\t{stat.st_size}\t{stat.st_mtime_ns}\n")
    return hashlib.sha256("".join(sorted(entries)).encode()).hexdigest()
