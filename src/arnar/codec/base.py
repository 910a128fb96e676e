"""The speech-codec interface every tokenizer of the pipeline implements, and how to load one.

A *codec* turns mono audio into integer tokens ``[n_codebooks, T]`` at ``frame_rate`` frames per
second and, when it has a decoder, back into audio (docs/design.md section 5). Backends
(``load_codec(name, **options)``):

``s3``       S3Tokenizer v2 (CosyVoice 2): 16 kHz in, 25 Hz, one codebook of 6561 codes; no
             decoder in its package (:mod:`arnar.codec.s3`).
``dac``      Descript Audio Codec, 44.1 kHz model: 9 codebooks x 1024 at 86.13 Hz, with a decoder
             (:mod:`arnar.codec.dac`).
``offline``  the codec the pipeline trains itself (``arnar.codec.offline``, written separately).

Plugging in a codec: a module ``arnar/codec/<name>.py`` registers its loader with
``@register_codec("<name>")`` (a callable ``**options -> Codec``); :func:`load_codec` imports
``arnar.codec.<name>`` on first use, so a new codec needs no edit here. Any object with the
attributes and methods of :class:`Codec` works with :func:`encode_files`,
:mod:`arnar.codec.shards` and :mod:`arnar.codec.hierarchy`.

Conventions (all codecs):

* ``encode(audio, sample_rate)`` takes a sequence of 1-D float arrays (mono, any length, all at
  ``sample_rate``), resamples them to ``codec.sample_rate`` with soxr (``arnar.evaluate.audio``),
  batches internally (``batch_size`` option) and returns one ``int64 [n_codebooks, T]`` array per
  clip, in input order. A clip's tokens do not depend on the other clips of the batch (padding
  is masked or cut), so batch size and order never change a token set.
* ``decode(codes, prompt=None)`` returns float32 mono audio at ``codec.sample_rate``, one array per
  item. ``prompt`` is an optional sequence (one per item, ``None`` entries allowed) of token arrays
  of the *same codec* that precede ``codes``: a decoder with context uses them (DAC decodes
  prompt + codes and cuts the prompt's samples, so the join is continuous; a token-to-speech model
  takes the speaker from them) and the returned audio covers ``codes`` only. Codecs without a
  decoder (``can_decode`` False) raise :class:`CodecError`.
* ``config_hash()`` is a hex sha256 of the exact weights (every tensor's name, dtype, shape and
  bytes) and the settings that change tokens (class config, number of codebooks used, sample
  rate). Token sets carry it (:mod:`arnar.codec.shards`) so that tokens of different codecs,
  weights or settings are never mixed. Device and batch size are not part of it.
* Weights that cannot be obtained (offline machine, empty cache) raise
  :class:`CodecUnavailableError` whose message says how to get them. Downloads by the packages
  themselves open URLs with no timeout, so loaders first look in the package's cache, then
  probe the host with a short timeout (``connect_timeout``, default 10 s); ``offline=True`` or
  ``HF_HUB_OFFLINE=1`` / ``ARNAR_OFFLINE=1`` never touch the network.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from arnar.hub import offline_requested

__all__ = [
    "CODECS",
    "Codec",
    "CodecError",
    "CodecUnavailableError",
    "codec_info",
    "encode_files",
    "load_codec",
    "register_codec",
    "state_dict_hash",
]

log = logging.getLogger("arnar.codec")


class CodecError(RuntimeError):
    """A codec cannot do what was asked (no decoder, bad input, unusable weights file)."""


class CodecUnavailableError(CodecError):
    """The codec's weights cannot be obtained here; the message says how to get them."""


@runtime_checkable
class Codec(Protocol):
    """What the pipeline needs from a speech tokenizer (see the module docstring)."""

    name: str  # "s3" | "dac" | "offline" | ...
    sample_rate: int  # input/output audio rate, Hz
    frame_rate: float  # token frames per second
    n_codebooks: int
    codebook_size: int
    can_decode: bool

    def encode(self, audio: Sequence[np.ndarray], sample_rate: int) -> list[np.ndarray]:
        """One ``int64 [n_codebooks, T]`` array per clip, in input order."""
        ...

    def decode(
        self, codes: Sequence[np.ndarray], prompt: Sequence[np.ndarray | None] | None = None
    ) -> list[np.ndarray]:
        """One float32 mono array at ``sample_rate`` per item; CodecError if not can_decode."""
        ...

    def config_hash(self) -> str:
        """Hex digest identifying the exact weights and token-changing settings."""
        ...


# --------------------------------------------------------------------------- registry

CODECS: dict[str, Callable[..., Codec]] = {}


def register_codec(name: str) -> Callable[[Callable[..., Codec]], Callable[..., Codec]]:
    """Decorator: register ``loader(**options) -> Codec`` under ``name`` for :func:`load_codec`."""

    def deco(loader: Callable[..., Codec]) -> Callable[..., Codec]:
        CODECS[name] = loader
        return loader

    return deco


# Codec names registered by a module of another name.
CODEC_MODULES = {"offline_rvq": "offline"}


def load_codec(name: str, **options: Any) -> Codec:
    """Build codec ``name`` (``s3``, ``dac``, ``offline``, or any registered one) with ``options``.

    Importing ``arnar.codec.<module>`` registers it, so codecs are loaded lazily (the packages
    behind them are heavy imports); a module may register several names (``offline`` also
    registers ``offline_rvq``), found through :data:`CODEC_MODULES`.
    """
    if name not in CODECS:
        if not name.isidentifier():
            raise CodecError(f"unknown codec {name!r}")
        module = f"arnar.codec.{CODEC_MODULES.get(name, name)}"
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as err:
            if err.name != module:
                raise  # the codec module exists but one of its dependencies is missing
    if name not in CODECS:
        raise CodecError(f"unknown codec {name!r}; available: {sorted(set(CODECS) | {'s3', 'dac'})}")
    return CODECS[name](**options)


# --------------------------------------------------------------------------- helpers


def codec_info(codec: Codec) -> dict[str, Any]:
    """The facts about ``codec`` a token set records (:mod:`arnar.codec.shards` manifests)."""
    return {
        "name": codec.name,
        "package": getattr(codec, "package", None),
        "package_version": getattr(codec, "package_version", None),
        "config_hash": codec.config_hash(),
        "frame_rate": float(codec.frame_rate),
        "n_codebooks": int(codec.n_codebooks),
        "codebook_size": int(codec.codebook_size),
        "sample_rate": int(codec.sample_rate),
    }


def state_dict_hash(state_dict: dict[str, Any], config: dict[str, Any]) -> str:
    """sha256 over ``config`` (canonical JSON) and every tensor's name, dtype, shape and bytes."""
    import torch

    h = hashlib.sha256()
    h.update(json.dumps(config, sort_keys=True, default=str).encode())
    for key in sorted(state_dict):
        value = state_dict[key]
        if not isinstance(value, torch.Tensor):
            h.update(f"{key}:{value!r}\n".encode())
            continue
        t = value.detach().to("cpu").contiguous()
        h.update(f"{key}:{t.dtype}:{tuple(t.shape)}\n".encode())
        if t.numel():
            # raw bytes through a uint8 view: works for every dtype, bfloat16 included
            h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


# Re-exported for the codec modules: one implementation for the whole package.
env_offline = offline_requested


def check_clips(audio: Sequence[np.ndarray], min_samples: int = 1) -> list[np.ndarray]:
    """Validate a batch of mono clips: 1-D, finite, at least ``min_samples`` long; float32 copies."""
    if isinstance(audio, np.ndarray) and audio.ndim == 1:
        raise CodecError("encode takes a sequence of clips, not one array: wrap it in a list")
    clips = []
    for i, clip in enumerate(audio):
        clip = np.asarray(clip, dtype=np.float32)
        if clip.ndim != 1:
            raise CodecError(f"clip {i}: expected mono 1-D audio, got shape {clip.shape}")
        if clip.size < min_samples:
            raise CodecError(f"clip {i}: {clip.size} samples, need at least {min_samples}")
        if not np.all(np.isfinite(clip)):
            raise CodecError(f"clip {i}: non-finite samples")
        clips.append(clip)
    return clips


def length_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Indices grouped into batches of similar length (less padding), longest first."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


# --------------------------------------------------------------------------- files


def encode_files(
    codec: Codec,
    paths: Iterable[str | Path],
    batch_size: int = 8,
    progress: bool = True,
) -> Iterator[tuple[Path, np.ndarray]]:
    """Encode audio files in batches; yields ``(path, codes)`` in input order.

    Each file is read as mono and resampled to ``codec.sample_rate``
    (``arnar.evaluate.audio.load_mono``; unreadable files raise ``AudioError``). A tqdm bar
    shows progress when ``progress``; a final log line (logger ``arnar.codec``) gives the
    throughput in x real time.
    """
    from tqdm import tqdm

    from arnar.evaluate.audio import load_mono

    paths = [Path(p) for p in paths]
    start = time.perf_counter()
    seconds = 0.0
    with tqdm(total=len(paths), desc=f"encode ({codec.name})", unit="utt", disable=not progress) as bar:
        for first in range(0, len(paths), batch_size):
            batch = paths[first : first + batch_size]
            clips = [load_mono(p, codec.sample_rate)[0] for p in batch]
            codes = codec.encode(clips, codec.sample_rate)
            seconds += sum(len(c) for c in clips) / codec.sample_rate
            yield from zip(batch, codes)
            bar.update(len(batch))
            wall = time.perf_counter() - start
            bar.set_postfix_str(f"{seconds / wall:.1f}x real time" if wall > 0 else "")
    wall = time.perf_counter() - start
    speed = seconds / wall if wall > 0 else float("inf")
    log.info(
        "encoded %d files (%.1f s of audio) with %s in %.1f s: %.1fx real time",
        len(paths), seconds, codec.name, wall, speed,
    )
