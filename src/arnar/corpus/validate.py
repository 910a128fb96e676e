"""Checks applied to every corpus item on ingest (docs/design.md section 4).

An item is one utterance: an audio file and its transcript. ``check_item`` returns the
measured facts of a good item or the reason it must be quarantined; it never raises for a bad
file, so one broken item cannot stop a corpus. Reasons read ``<category>: <kind> (<details>)``
with category ``audio``, ``transcript`` or ``pairing``; the part before the parenthesis is
stable, so a report can count rejections by it.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf


@dataclass(frozen=True)
class ValidationLimits:
    sample_rate: int
    min_duration: float
    max_duration: float
    silence_dbfs: float = -60.0
    clip_fraction: float = 0.01


@dataclass(frozen=True)
class AudioFacts:
    sample_rate: int
    num_samples: int
    duration: float
    rms_dbfs: float


@dataclass(frozen=True)
class ItemCheck:
    """Outcome of checking one item: ``reason`` is None for a good item."""

    reason: str | None
    audio: AudioFacts | None = None
    text: str | None = None


def wav_declared_data_bytes(path: Path) -> tuple[int, int] | None:
    """For a RIFF/WAVE file, return (bytes the 'data' chunk declares, bytes actually present).

    libsndfile silently reads a truncated WAV as a shorter one, so truncation is only visible by
    comparing the header with the file size. Returns None for files that are not RIFF/WAVE.
    """
    size = path.stat().st_size
    with path.open("rb") as handle:
        header = handle.read(12)
        if len(header) < 12 or header[:4] != b"RIFF" or header[8:12] != b"WAVE":
            return None
        offset = 12
        while offset + 8 <= size:
            handle.seek(offset)
            chunk_id, chunk_size = struct.unpack("<4sI", handle.read(8))
            if chunk_id == b"data":
                return chunk_size, size - offset - 8
            offset += 8 + chunk_size + (chunk_size & 1)
    return None


def check_audio(path: Path, limits: ValidationLimits) -> tuple[str | None, AudioFacts | None]:
    """Read and check one audio file; return (reason, None) or (None, facts)."""
    if not path.exists():
        return "pairing: transcript has no audio file", None
    if path.stat().st_size == 0:
        return "audio: empty file (0 bytes)", None
    try:
        declared = wav_declared_data_bytes(path)
    except (OSError, struct.error) as err:
        return f"audio: unreadable header ({err})", None
    if declared is not None and declared[0] > declared[1]:
        return (
            f"audio: truncated (header declares {declared[0]} data bytes, file holds {declared[1]})",
            None,
        )
    try:
        samples, rate = sf.read(str(path), dtype="float64", always_2d=True)
    except Exception as err:  # libsndfile raises several types; all mean "cannot be read"
        return f"audio: unreadable ({type(err).__name__}: {str(err).strip()[:120]})", None
    channels = samples.shape[1]
    if samples.shape[0] == 0:
        return "audio: no samples", None
    if channels != 1:
        return f"audio: wrong channel count ({channels} channels, expected mono)", None
    if rate != limits.sample_rate:
        return f"audio: wrong sample rate ({rate} Hz, expected {limits.sample_rate} Hz)", None
    mono = samples[:, 0]
    if not np.all(np.isfinite(mono)):
        return f"audio: non-finite samples ({int(np.sum(~np.isfinite(mono)))} NaN/inf)", None
    duration = mono.shape[0] / rate
    if not limits.min_duration <= duration <= limits.max_duration:
        return (
            f"audio: duration out of range ({duration:.2f} s, allowed "
            f"[{limits.min_duration}, {limits.max_duration}] s)",
            None,
        )
    rms = float(np.sqrt(np.mean(mono**2)))
    rms_dbfs = 20.0 * math.log10(rms) if rms > 0 else -math.inf
    if rms_dbfs < limits.silence_dbfs:
        return f"audio: silent (RMS {rms_dbfs:.1f} dBFS < {limits.silence_dbfs} dBFS)", None
    clipped = float(np.mean(np.abs(mono) >= 0.999))
    if clipped > limits.clip_fraction:
        return f"audio: clipped ({100 * clipped:.1f}% of samples at full scale)", None
    return None, AudioFacts(rate, int(mono.shape[0]), duration, rms_dbfs)


def read_transcript(path: Path) -> tuple[str | None, str | None]:
    """Return (reason, None) or (None, text) for a transcript file."""
    if not path.exists():
        return "pairing: audio has no transcript file", None
    try:
        # utf-8-sig: a byte-order mark (editors on Windows write one) is not part of the text
        text = path.read_bytes().decode("utf-8-sig")
    except UnicodeDecodeError as err:
        return f"transcript: not valid UTF-8 (byte {err.start})", None
    text = " ".join(text.split())
    if not text:
        return "transcript: empty or whitespace only", None
    if not any(ch.isalpha() for ch in text):
        return "transcript: contains no letters", None
    return None, text


def check_item(audio_path: Path, text_path: Path, limits: ValidationLimits) -> ItemCheck:
    """Check one utterance; transcript problems are reported before audio problems."""
    reason, text = read_transcript(text_path)
    if reason is not None:
        if not audio_path.exists() and text_path.exists():
            reason = "pairing: transcript has no audio file"
        return ItemCheck(reason)
    reason, facts = check_audio(audio_path, limits)
    if reason is not None:
        return ItemCheck(reason)
    return ItemCheck(None, facts, text)
