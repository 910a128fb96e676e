"""Audio I/O shared by the evaluation backends: mono float32 in, resampled with soxr."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import soundfile as sf
import soxr


class AudioError(ValueError):
    """An audio file that cannot be evaluated (unreadable, empty, not finite)."""


def load_mono(path: str | Path, target_rate: int | None = None) -> tuple[np.ndarray, int]:
    """Read ``path`` as mono float32 (channels averaged), optionally resampled to ``target_rate``."""
    path = Path(path)
    try:
        audio, rate = sf.read(str(path), dtype="float32", always_2d=True)
    except Exception as err:  # libsndfile raises several types; all mean "cannot be read"
        raise AudioError(f"{path}: unreadable audio ({err})") from None
    if audio.shape[0] == 0:
        raise AudioError(f"{path}: no samples")
    mono = audio.mean(axis=1)
    if not np.all(np.isfinite(mono)):
        raise AudioError(f"{path}: non-finite samples")
    if target_rate is not None and rate != target_rate:
        mono, rate = resample(mono, rate, target_rate), target_rate
    return mono, rate


def resample(audio: np.ndarray, rate: int, target_rate: int) -> np.ndarray:
    """High-quality, deterministic resampling (soxr, the resampler librosa uses)."""
    if rate == target_rate:
        return np.asarray(audio, dtype=np.float32)
    return soxr.resample(np.asarray(audio, dtype=np.float32), rate, target_rate).astype(np.float32)
