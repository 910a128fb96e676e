"""Write a downloaded corpus in the corpus-folder layout ``arnar ingest`` reads.

The layout is the one :mod:`arnar.corpus.synth` writes (see :mod:`arnar.corpus.manifests`)::

    out_dir/speakers.tsv              speaker  gender  source  subset  split
    out_dir/<speaker>/<utt_id>.wav    mono 16-bit PCM at the corpus sample rate
    out_dir/<speaker>/<utt_id>.txt    transcript, UTF-8, one line + newline
    out_dir/summary.json              what went in, per source and split (deterministic)
    out_dir/build_log.json            wall time and workers (not deterministic)

Nothing is validated or dropped here beyond what a recipe selects on purpose (the MLS quality
filter, training readers who are also test speakers): ingest's validation and quarantine apply
to every corpus alike. An item whose audio cannot be decoded gets its transcript but no
``.wav``, so ingest quarantines it (``pairing: transcript has no audio file``); the decode
error is listed in ``summary.json``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf

from arnar.corpus.manifests import parallel_map

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SourceItem:
    """One utterance of a downloaded corpus, before conversion."""

    utt_id: str
    speaker: str
    audio: Path
    text: str | None  # None: the corpus has no transcript for it (ingest quarantines it)
    source: str    # libritts | librispeech | mls
    subset: str    # e.g. train-clean-100
    gender: str    # F | M | "" (unknown)
    split: str     # train | test (ingest draws dev from train)


_PRONOUN_I = re.compile(r"\bi\b")


def sentence_case(text: str) -> str:
    """LibriSpeech and MLS transcripts are all upper or all lower case; the BPE tokenizer is
    trained on LibriTTS text, which keeps case. Lower-case everything, then capitalise the first
    letter and the pronoun I (I, I'm, I'll, I've, I'd). Proper nouns stay lower case: no rule
    can restore them, and the WER normaliser ignores case anyway."""
    text = " ".join(text.split()).lower()
    text = _PRONOUN_I.sub("I", text)
    return text[:1].upper() + text[1:]


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".tmp.{path.name}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _convert(job: tuple[SourceItem, str, int]) -> tuple[str, int, str | None]:
    """Read, downmix, resample and write one item; return (utt_id, samples written, error)."""
    from arnar.evaluate.audio import resample

    item, out_dir, sample_rate = job
    speaker_dir = Path(out_dir) / item.speaker
    if item.text is not None:
        _atomic_write_text(speaker_dir / f"{item.utt_id}.txt", item.text + "\n")
    try:
        audio, rate = sf.read(str(item.audio), dtype="float32", always_2d=True)
    except (sf.SoundFileError, RuntimeError, OSError) as err:
        return item.utt_id, 0, f"{item.audio}: cannot decode ({err})"
    audio = resample(audio.mean(axis=1), rate, sample_rate)
    # Resampling can overshoot full scale by a hair on loud peaks; clip rather than wrap around.
    audio = np.clip(audio, -1.0, 1.0)
    target = speaker_dir / f"{item.utt_id}.wav"
    tmp = speaker_dir / f".tmp.{item.utt_id}.wav"
    sf.write(str(tmp), audio, sample_rate, subtype="PCM_16")
    os.replace(tmp, target)
    return item.utt_id, len(audio), None


def write_corpus(items: list[SourceItem], out_dir: Path, *, sample_rate: int, workers: int = 1,
                 extra_summary: dict | None = None, progress: bool = True) -> dict:
    """Convert ``items`` into ``out_dir``; write speakers.tsv, summary.json, build_log.json."""
    started = time.time()
    out_dir = Path(out_dir)
    items = sorted(items, key=lambda i: (i.speaker, i.utt_id))
    speakers: dict[str, SourceItem] = {}
    for item in items:
        first = speakers.setdefault(item.speaker, item)
        if first.split != item.split:
            raise ValueError(f"speaker {item.speaker} is in both {first.split} and {item.split}")
        (out_dir / item.speaker).mkdir(parents=True, exist_ok=True)

    results = parallel_map(_convert, [(item, str(out_dir), sample_rate) for item in items], workers=workers,
                           desc="convert", progress=progress, chunksize=32)

    header = "speaker\tgender\tsource\tsubset\tsplit\n"
    rows = "".join(
        f"{spk}\t{it.gender}\t{it.source}\t{it.subset}\t{it.split}\n" for spk, it in sorted(speakers.items())
    )
    _atomic_write_text(out_dir / "speakers.tsv", header + rows)

    samples = {utt: n for utt, n, _ in results}
    errors = sorted(err for _, _, err in results if err)
    per = defaultdict(lambda: {"utterances": 0, "speakers": set(), "seconds": 0.0})
    for item in items:
        for key in (f"{item.source}/{item.subset}", f"split/{item.split}"):
            per[key]["utterances"] += 1
            per[key]["speakers"].add(item.speaker)
            per[key]["seconds"] += samples[item.utt_id] / sample_rate
    summary = {
        "sample_rate": sample_rate,
        "utterances": len(items),
        "speakers": len(speakers),
        "hours": round(sum(samples.values()) / sample_rate / 3600, 4),
        "parts": {
            key: {"utterances": v["utterances"], "speakers": len(v["speakers"]), "hours": round(v["seconds"] / 3600, 4)}
            for key, v in sorted(per.items())
        },
        "gender": dict(sorted(Counter(it.gender or "unknown" for it in speakers.values()).items())),
        "undecodable": errors,
        **(extra_summary or {}),
    }
    _atomic_write_text(out_dir / "summary.json", json.dumps(summary, indent=2, sort_keys=True) + "\n")
    seconds = time.time() - started
    _atomic_write_text(out_dir / "build_log.json", json.dumps(
        {"build_seconds": round(seconds, 2), "workers": workers,
         "x_real_time": round(summary["hours"] * 3600 / max(seconds, 1e-9), 1)}, indent=2) + "\n")
    if errors:
        log.warning("%d items could not be decoded (ingest will quarantine them), e.g. %s", len(errors), errors[0])
    return summary
