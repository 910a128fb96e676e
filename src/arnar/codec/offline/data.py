"""Training data of the offline codec: the cuts (lhotse JSONL, audio resampled to 16 kHz, phone
timings from the supervisions), the aligner's phone JSONL, and the phone label of each 25 Hz frame
(the phone whose interval covers the frame's centre; silence for gaps and pause symbols, stress
digits and case ignored)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from arnar.codec.offline.features import SAMPLE_RATE

SILENCE = "<sil>"
PAUSES = {"", "pau", "sil", "sp", "spn", "h#", "<sil>", "sil0", "<s>", "</s>", "+sil+"}


def _read_cuts(path: Path, root: Path) -> list[dict]:
    """(id, speaker, audio at 16 kHz, supervision phone timings or None) per cut."""
    import soundfile as sf

    from arnar.evaluate.audio import resample

    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            cut = json.loads(line)
            rec = cut["recording"]
            source = Path(rec["sources"][0]["source"])
            if not source.is_absolute():
                source = root / source
            rate = int(rec.get("sampling_rate") or sf.info(str(source)).samplerate)
            start = float(cut.get("start", 0.0))
            duration = cut.get("duration")
            first = int(round(start * rate))
            frames = int(round(float(duration) * rate)) if duration is not None else -1
            audio, file_rate = sf.read(str(source), start=first, frames=frames, dtype="float32", always_2d=True)
            audio = resample(audio.mean(axis=1), file_rate, SAMPLE_RATE)
            sups = cut.get("supervisions") or [{}]
            sup = sups[0]
            phones = None
            ali = (sup.get("alignment") or {}).get("phone")
            if ali:  # lhotse AlignmentItems [symbol, start, duration, score], as items_from_cuts reads them
                phones = [(str(s), float(b), float(b) + float(d)) for s, b, d, *_ in ali]
            out.append({
                "id": cut["id"],
                "speaker": sup.get("speaker") or rec["id"],
                "audio": audio,
                "phones": phones,
            })
    return out


def _read_alignments(path: Path) -> dict[str, list[tuple[str, float, float]]]:
    out = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                d = json.loads(line)
                out[str(d["utt_id"])] = [(str(s), float(b), float(e)) for s, b, e in d["phones"]]
    return out


def _phone_key(symbol: str) -> str:
    s = symbol.strip().lower().rstrip("012")
    return SILENCE if s in PAUSES else s


def _frame_labels(phones: list[tuple[str, float, float]], n_frames: int, index: dict[str, int],
                  rate: float) -> np.ndarray:
    """Label of each frame: the phone covering its centre ``(t + 0.5) / rate``, else silence."""
    labels = np.zeros(n_frames, dtype=np.int64)  # 0 = silence
    centres = (np.arange(n_frames) + 0.5) / rate
    for symbol, start, end in phones:
        key = _phone_key(symbol)
        if key == SILENCE or key not in index:
            continue
        labels[(centres >= start) & (centres < end)] = index[key]
    return labels
