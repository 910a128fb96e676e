"""Ingest a raw corpus into lhotse manifests, quarantining every item that fails validation.

Raw corpus layout (the contract every corpus recipe writes; ``synth`` and the LibriTTS recipe
alike)::

    <corpus>/speakers.tsv                    speaker<TAB>...<TAB>split  (split: train | test)
    <corpus>/<speaker>/<utt_id>.wav          audio
    <corpus>/<speaker>/<utt_id>.txt          transcript, UTF-8
    <corpus>/<speaker>/<utt_id>.align.json   optional oracle timings {"phones": [[sym, start, end]...],
                                             "words": [...]} (synthesizer's own, for aligner checks)

Output, one set per split (train, dev, test), as plain JSON lines so that two builds are
byte-identical (gzip would stamp a time into the header)::

    <out>/<split>_recordings.jsonl  <out>/<split>_supervisions.jsonl  <out>/<split>_cuts.jsonl
    <out>/quarantine.tsv            utt_id<TAB>path<TAB>reason, one line per rejected item
    <out>/summary.json              counts, hours and speakers per split, rejections per reason

Splits: speakers marked ``test`` in speakers.tsv are held out entirely (zero-shot test set);
of every other speaker, a seeded ``dev_fraction`` of utterances goes to ``dev``.
"""

from __future__ import annotations

import csv
import hashlib
import json
from collections import Counter, defaultdict
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from lhotse import CutSet, MonoCut, Recording, RecordingSet, SupervisionSegment, SupervisionSet
from lhotse.supervision import AlignmentItem
from tqdm import tqdm

from arnar import atomic
from arnar.corpus.validate import ItemCheck, ValidationLimits, check_item

SPLITS = ("train", "dev", "test")
AUDIO_SUFFIX = ".wav"
TEXT_SUFFIX = ".txt"
ALIGN_SUFFIX = ".align.json"


class CorpusError(RuntimeError):
    """A corpus-level problem that no quarantine can fix (e.g. the folder does not exist)."""


def parallel_map(function, jobs: list, *, workers: int, desc: str, progress: bool, chunksize: int = 16) -> list:
    """``[function(job) for job in jobs]`` with a progress bar, over ``workers`` processes when
    more than one: the per-utterance passes of the corpus phase (convert, validate) share it.
    The results keep the jobs' order, so the outputs do not depend on the worker count."""
    bar = dict(total=len(jobs), desc=desc, unit="utt", disable=not progress)
    if workers > 1:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            return list(tqdm(pool.map(function, jobs, chunksize=chunksize), **bar))
    return [function(job) for job in tqdm(jobs, **bar)]


@dataclass(frozen=True)
class RawItem:
    utt_id: str
    speaker: str
    audio_path: Path
    text_path: Path
    align_path: Path


def read_speaker_splits(corpus_dir: Path) -> dict[str, str]:
    """speaker -> split from speakers.tsv; a corpus without the file puts everyone in train."""
    table = corpus_dir / "speakers.tsv"
    if not table.exists():
        return {}
    with table.open(encoding="utf-8", newline="") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t"))
    if rows and ("speaker" not in rows[0] or "split" not in rows[0]):
        raise CorpusError(f"{table}: needs the columns 'speaker' and 'split', has {list(rows[0])}")
    splits = {}
    for line, row in enumerate(rows, start=2):
        if row["split"] not in ("train", "test"):
            raise CorpusError(f"{table}:{line}: split {row['split']!r} is neither 'train' nor 'test'")
        splits[row["speaker"]] = row["split"]
    return splits


def scan_corpus(corpus_dir: Path) -> tuple[list[RawItem], list[tuple[str, str, str]]]:
    """Pair audio with transcripts by utterance id.

    Returns the candidate items and the items already rejected at this stage (duplicate ids):
    an id found under two speakers is ambiguous, so every copy of it is quarantined.
    """
    if not corpus_dir.is_dir():
        raise CorpusError(f"{corpus_dir}: corpus folder does not exist")
    found: dict[str, list[RawItem]] = defaultdict(list)
    for speaker_dir in sorted(p for p in corpus_dir.iterdir() if p.is_dir()):
        stems = set()
        for path in speaker_dir.iterdir():
            for suffix in (AUDIO_SUFFIX, TEXT_SUFFIX):
                if path.name.endswith(suffix) and not path.name.endswith(ALIGN_SUFFIX):
                    stems.add(path.name[: -len(suffix)])
        for stem in sorted(stems):
            found[stem].append(
                RawItem(
                    utt_id=stem,
                    speaker=speaker_dir.name,
                    audio_path=speaker_dir / f"{stem}{AUDIO_SUFFIX}",
                    text_path=speaker_dir / f"{stem}{TEXT_SUFFIX}",
                    align_path=speaker_dir / f"{stem}{ALIGN_SUFFIX}",
                )
            )
    items, rejected = [], []
    for utt_id in sorted(found):
        copies = found[utt_id]
        if len(copies) == 1:
            items.append(copies[0])
            continue
        where = ", ".join(c.speaker for c in copies)
        for copy in copies:
            rejected.append((utt_id, str(copy.audio_path), f"pairing: duplicate utterance id (speakers {where})"))
    return items, rejected


def assign_split(item: RawItem, speaker_split: str, dev_fraction: float, seed: int) -> str:
    """test speakers -> test; otherwise a seeded hash of the id decides train or dev.

    A hash (not a shuffle) keeps an item's split stable when other items are added or removed.
    """
    if speaker_split == "test":
        return "test"
    digest = hashlib.sha256(f"{seed}:{item.utt_id}".encode()).digest()
    draw = int.from_bytes(digest[:8], "big") / 2**64
    return "dev" if draw < dev_fraction else "train"


def _check(args: tuple[RawItem, ValidationLimits]) -> ItemCheck:
    item, limits = args
    return check_item(item.audio_path, item.text_path, limits)


def _read_alignment(item: RawItem, duration: float) -> tuple[dict | None, str | None]:
    """Oracle timings as lhotse AlignmentItems; a malformed file is reported, not fatal."""
    if not item.align_path.exists():
        return None, None
    try:
        raw = json.loads(item.align_path.read_text(encoding="utf-8"))
        alignment = {}
        for tier, key in (("phone", "phones"), ("word", "words")):
            entries = raw.get(key) or []
            alignment[tier] = [
                AlignmentItem(symbol=str(sym), start=round(float(s), 4), duration=round(float(e) - float(s), 4))
                for sym, s, e in entries
            ]
            if any(a.duration < 0 or a.start < 0 or a.start + a.duration > duration + 0.05 for a in alignment[tier]):
                return None, f"{item.align_path}: {key} outside the audio or with negative duration"
        return {k: v for k, v in alignment.items() if v}, None
    except (ValueError, TypeError, AttributeError) as err:
        return None, f"{item.align_path}: malformed oracle alignment ({err})"


def _write_jsonl_atomic(manifest, path: Path) -> None:
    with atomic.atomic_path(path) as tmp:  # keeps the .jsonl suffix lhotse reads the format from
        manifest.to_file(tmp)


def ingest_corpus(
    corpus_dir: Path,
    out_dir: Path,
    *,
    limits: ValidationLimits,
    dev_fraction: float,
    seed: int,
    workers: int = 1,
    progress: bool = True,
) -> dict:
    """Validate every item of ``corpus_dir`` and write manifests + quarantine report to ``out_dir``."""
    corpus_dir, out_dir = Path(corpus_dir), Path(out_dir)
    speaker_splits = read_speaker_splits(corpus_dir)
    items, quarantined = scan_corpus(corpus_dir)
    if not items and not quarantined:
        raise CorpusError(f"{corpus_dir}: no utterances found (expected <speaker>/<id>.wav + <id>.txt)")

    checks = parallel_map(_check, [(item, limits) for item in items], workers=workers, desc="validate",
                          progress=progress)

    recordings = defaultdict(list)
    supervisions = defaultdict(list)
    alignment_notes = []
    for item, check in zip(items, checks):
        if check.reason is not None:
            quarantined.append((item.utt_id, str(item.audio_path), check.reason))
            continue
        split = assign_split(item, speaker_splits.get(item.speaker, "train"), dev_fraction, seed)
        recording = Recording.from_file(item.audio_path, recording_id=item.utt_id)
        alignment, note = _read_alignment(item, recording.duration)
        if note:
            alignment_notes.append(note)
        recordings[split].append(recording)
        supervisions[split].append(
            SupervisionSegment(
                id=item.utt_id,
                recording_id=item.utt_id,
                start=0.0,
                duration=recording.duration,
                channel=0,
                text=check.text,
                language="English",
                speaker=item.speaker,
                alignment=alignment,
            )
        )

    out_dir.mkdir(parents=True, exist_ok=True)
    summary = {"corpus": str(corpus_dir), "splits": {}, "quarantined": {}}
    for split in SPLITS:
        recording_set = RecordingSet.from_recordings(recordings[split])
        supervision_set = SupervisionSet.from_segments(supervisions[split])
        # One cut per utterance, id = utterance id (lhotse's from_manifests would append "-0").
        cuts = CutSet.from_cuts(
            MonoCut(id=sup.id, start=0.0, duration=rec.duration, channel=0, recording=rec, supervisions=[sup])
            for rec, sup in zip(recordings[split], supervisions[split])
        )
        _write_jsonl_atomic(recording_set, out_dir / f"{split}_recordings.jsonl")
        _write_jsonl_atomic(supervision_set, out_dir / f"{split}_supervisions.jsonl")
        _write_jsonl_atomic(cuts, out_dir / f"{split}_cuts.jsonl")
        seconds = sum(r.duration for r in recordings[split])
        summary["splits"][split] = {
            "utterances": len(recordings[split]),
            "speakers": len({s.speaker for s in supervisions[split]}),
            "hours": round(seconds / 3600, 4),
        }

    quarantined.sort()
    reasons = Counter(reason.split(" (")[0] for _, _, reason in quarantined)
    summary["quarantined"] = {"total": len(quarantined), "by_reason": dict(sorted(reasons.items()))}
    summary["accepted"] = sum(s["utterances"] for s in summary["splits"].values())
    summary["speakers"] = len({s.speaker for sups in supervisions.values() for s in sups})
    summary["hours"] = round(sum(s["hours"] for s in summary["splits"].values()), 4)
    summary["alignment_problems"] = alignment_notes

    atomic.write_text(out_dir / "quarantine.tsv", "utt_id\tpath\treason\n" + "".join(
        f"{utt_id}\t{path}\t{reason}\n" for utt_id, path, reason in quarantined))
    atomic.write_text(out_dir / "summary.json", json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return summary
