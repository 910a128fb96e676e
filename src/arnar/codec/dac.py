"""Descript Audio Codec (DAC): the acoustic tokens of Chain-of-Details.

CoD (section IV-A) uses the 44.1 kHz DAC model: 9 residual codebooks x 1024 codes at
44100 / 512 = 86.13 Hz (8 kbps), and builds its temporal levels by decimating the first
quantizer's tokens (:mod:`arnar.codec.hierarchy`). The package ``descript-audio-codec`` (1.0.0)
holds the model class ``dac.model.DAC``; its weights come from a GitHub release.

Loading (``load_codec("dac", model=...)``):

* ``model="44khz"`` (default; also ``"24khz"``, ``"16khz"``, with ``model_bitrate`` and ``tag`` as
  in ``dac.utils.download``): the package's own weights. As ``dac.utils.load_model`` does, the
  file is looked up in ``~/.cache/descript/dac/weights_<type>_<bitrate>_<tag>.pth`` and
  downloaded there on a connected machine. The package downloads with no timeout, so when the
  file is missing the release host is probed first (``connect_timeout`` s); offline (or
  ``offline=True``, ``HF_HUB_OFFLINE=1``, ``ARNAR_OFFLINE=1``) this raises
  :class:`CodecUnavailableError` at once.
* ``model=<path>``: a weights file in the format ``DAC.load`` / ``dac.utils.load_model(load_path=)``
  read, i.e. what ``DAC.save(path, package=False)`` writes and what the releases ship:
  ``{"state_dict": ..., "metadata": {"kwargs": <DAC constructor arguments>}}``. It is read with
  ``torch.load(weights_only=True)`` and loaded with ``strict=True`` (``DAC.load`` uses
  ``strict=False``, which would silently keep random weights for missing keys); a
  ``torch.package`` file (``DAC.save(path)`` default) falls back to ``DAC.load``.
* ``n_codebooks``: use only the first N quantizers (tokens and decoding); CoD's hierarchy needs
  only the first one. Default: all of the model's.

Encoding: each clip resampled to the model's rate (soxr), right-padded with zeros to a multiple
of the hop (``model.preprocess``), ``model.encode`` without gradient, codes ``[n_q, T]`` with
``T = ceil(n_samples / hop)``. Decoding: ``model.quantizer.from_codes`` -> ``model.decode``, cut
(or, for decoders whose transposed convolutions lose a few samples, zero-padded) to exactly
``T * hop`` samples, so ``decode(encode(x))`` has ``ceil(len(x) / hop) * hop`` samples.

Batching without changing tokens: DAC is fully convolutional with "same" padding, so in a
padded batch a clip's last frames would see the (non-zero) activations computed over its
neighbour's padding, where alone it sees the convolutions' zero padding. A batch therefore
runs with forward hooks on every convolution of the encoder (decoder) that track each clip's
valid length through the layer (the convolution's length formula) and zero the output beyond
it. Snake(0) = 0 and the residual sums keep zeros zero, so every layer sees exactly what it
sees for the clip alone: batched tokens equal one-clip-at-a-time tokens, and batched audio
equals one-at-a-time audio up to float rounding. Batches group clips of similar length
(``batch_size`` clips, at most ``max_batch_seconds`` of padded audio per forward pass). On a
GPU, kernels chosen per batch shape round differently, so a token at a near-tie could in
principle differ between batch sizes there; on CPU batched and single tokens are identical.
On CPU batches are slower, not faster (measured on 2 cores, small test model, 38 s of audio in
8 clips: one clip at a time 80x real time, batches of 4 18x, of 8 5x; the batched convolutions
themselves are slower, the masks cost little), so on CPU the default is one clip at a time.

Options: ``model``, ``model_bitrate``, ``tag``, ``n_codebooks``, ``device`` (default ``"cpu"``),
``batch_size`` (default 1 on CPU, 16 on GPU), ``max_batch_seconds`` (default 20 on CPU, 300 on
GPU), ``offline``, ``connect_timeout``.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import inspect
import math
import os
import warnings
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from arnar.codec.base import (
    CodecError,
    CodecUnavailableError,
    check_clips,
    env_offline,
    register_codec,
    state_dict_hash,
)
from arnar.hub import require_cached_or_reachable

__all__ = ["DacCodec", "load_dac"]

MODEL_TYPES = ("44khz", "24khz", "16khz")


def _import_dac():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.jit.script / weight_norm deprecations at import
        import dac
        import dac.utils
    return dac


def _package_version() -> str | None:
    try:
        return importlib.metadata.version("descript-audio-codec")
    except importlib.metadata.PackageNotFoundError:
        return None


def _fetch_tag(model_type: str, bitrate: str, tag: str, offline: bool, timeout: float) -> Path:
    """``dac.utils.download`` (cache, else download), failing fast when it cannot work."""
    dac = _import_dac()
    resolved = dac.utils.__MODEL_LATEST_TAGS__.get((model_type, bitrate)) if tag == "latest" else tag
    url = dac.utils.__MODEL_URLS__.get((model_type, resolved, bitrate))
    if url is None:
        raise CodecError(f"DAC has no released model {model_type} {bitrate} tag {tag}")
    # where dac.utils.download keeps it
    target = Path.home() / ".cache" / "descript" / "dac" / f"weights_{model_type}_{bitrate}_{resolved}.pth"
    todo = (
        f"on a connected machine run `python -m dac download --model_type {model_type} "
        f"--model_bitrate {bitrate}` (or download {url}) and copy the file to {target}, or put "
        f"it anywhere and pass model=<path>"
    )
    require_cached_or_reachable(
        target, url, offline=offline, timeout=timeout, todo=todo, error=CodecUnavailableError,
        what=f"DAC weights {model_type} {bitrate} (tag {resolved}) are not cached at {target}",
    )
    try:
        return Path(dac.utils.download(model_type=model_type, model_bitrate=bitrate, tag=resolved))
    except Exception as err:  # requests errors, HTTP status
        raise CodecUnavailableError(f"downloading DAC weights failed ({err}); {todo}") from err


def _load_weights(path: Path):
    """A DAC from a weights file (``DAC.save(package=False)`` format) or a torch.package."""
    import torch

    dac = _import_dac()
    DAC = dac.model.DAC
    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as err:
        obj, first_error = None, err
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # weight_norm deprecation inside DAC
        if obj is None:
            try:
                return DAC._load_package(str(path))  # DAC.load's first attempt
            except Exception:
                raise CodecError(f"{path}: not a DAC weights file ({first_error})") from first_error
        if not (isinstance(obj, dict) and "state_dict" in obj and "kwargs" in obj.get("metadata", {})):
            raise CodecError(f"{path}: not a DAC weights file (expected state_dict and metadata.kwargs)")
        accepted = set(inspect.signature(DAC).parameters)
        kwargs = {k: v for k, v in obj["metadata"]["kwargs"].items() if k in accepted}
        model = DAC(**kwargs)
        try:
            model.load_state_dict(obj["state_dict"], strict=True)
        except RuntimeError as err:
            raise CodecError(f"{path}: weights do not match DAC({kwargs}) ({err})") from err
        model.metadata = obj["metadata"]
    return model


def _conv_out_len(module, length: int) -> int:
    """Valid output length of a Conv1d / ConvTranspose1d for a valid input ``length``."""
    import torch

    k, s, d = module.kernel_size[0], module.stride[0], module.dilation[0]
    p = module.padding[0]
    if isinstance(module, torch.nn.ConvTranspose1d):
        return (length - 1) * s - 2 * p + d * (k - 1) + module.output_padding[0] + 1
    return (length + 2 * p - d * (k - 1) - 1) // s + 1


@contextlib.contextmanager
def _masked(module, lengths: list[int]) -> Iterator[dict]:
    """Zero every convolution output of ``module`` beyond each item's valid length (in place).

    The convolutions of DAC's encoder and decoder run in module order, and the only ones off the
    main path (inside residual units) keep the length, so the valid length of a convolution's
    input is the valid output length of the convolution that ran before it. For inference only.
    """
    import torch

    state = {"lengths": list(lengths)}

    def hook(mod, inputs, output):
        state["lengths"] = [_conv_out_len(mod, n) for n in state["lengths"]]
        for row, n in enumerate(state["lengths"]):
            if n < output.shape[-1]:
                output[row, :, max(n, 0) :] = 0
        return output

    handles = [
        m.register_forward_hook(hook)
        for m in module.modules()
        if isinstance(m, (torch.nn.Conv1d, torch.nn.ConvTranspose1d))
    ]
    try:
        yield state
    finally:
        for h in handles:
            h.remove()


class DacCodec:
    """Descript Audio Codec as a :class:`~arnar.codec.base.Codec`."""

    name = "dac"
    package = "descript-audio-codec"
    can_decode = True

    def __init__(
        self,
        model: str | os.PathLike = "44khz",
        *,
        model_bitrate: str = "8kbps",
        tag: str = "latest",
        n_codebooks: int | None = None,
        device: str = "cpu",
        batch_size: int | None = None,
        max_batch_seconds: float | None = None,
        offline: bool | None = None,
        connect_timeout: float = 10.0,
    ):
        import torch

        offline = env_offline() if offline is None else offline
        if Path(model).is_file():
            path = Path(model)
        elif str(model).lower() in MODEL_TYPES:
            path = _fetch_tag(str(model).lower(), model_bitrate, tag.lower(), offline, connect_timeout)
        else:
            raise CodecError(f"DAC model {str(model)!r}: neither a weights file nor one of {MODEL_TYPES}")
        net = _load_weights(path)
        self.model = net.eval().to(device)
        self.device = torch.device(device)
        self.source = str(model)
        self.sample_rate = int(net.sample_rate)
        self.hop_length = int(net.hop_length)
        self.frame_rate = self.sample_rate / self.hop_length
        self.codebook_size = int(net.codebook_size)
        available = int(net.n_codebooks)
        n = available if n_codebooks is None else int(n_codebooks)
        if not 1 <= n <= available:
            raise CodecError(f"n_codebooks={n_codebooks}: this DAC has {available} codebooks")
        self.n_codebooks = n
        cpu = self.device.type == "cpu"
        self.batch_size = int(batch_size if batch_size is not None else 1 if cpu else 16)
        self.max_batch_seconds = float(
            max_batch_seconds if max_batch_seconds is not None else 20.0 if cpu else 300.0
        )
        self.package_version = _package_version()
        kwargs = {k: v for k, v in (getattr(net, "metadata", {}) or {}).get("kwargs", {}).items()}
        config = {
            "encoder_dim": net.encoder_dim, "encoder_rates": list(net.encoder_rates),
            "latent_dim": net.latent_dim, "decoder_dim": net.decoder_dim,
            "decoder_rates": list(net.decoder_rates), "codebook_size": self.codebook_size,
            "codebook_dim": net.codebook_dim, "model_codebooks": available,
            "sample_rate": self.sample_rate,
        }
        self.config = {**kwargs, **config}
        self._hash = state_dict_hash(
            self.model.state_dict(),
            {"codec": self.name, "class": "DAC", "config": config, "n_codebooks": n},
        )

    def config_hash(self) -> str:
        return self._hash

    # ----------------------------------------------------------------------- batching

    def _batches(self, frames: Sequence[int]) -> list[list[int]]:
        """Clips grouped by length: <= batch_size clips and <= max_batch_seconds padded audio."""
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        cap = self.max_batch_seconds * self.frame_rate
        order = sorted(range(len(frames)), key=lambda i: (-frames[i], i))
        batches: list[list[int]] = []
        for i in order:
            if batches and len(batches[-1]) < self.batch_size and \
                    frames[batches[-1][0]] * (len(batches[-1]) + 1) <= cap:
                batches[-1].append(i)
            else:
                batches.append([i])
        return batches

    # ----------------------------------------------------------------------- encode

    def encode(self, audio: Sequence[np.ndarray], sample_rate: int) -> list[np.ndarray]:
        import torch

        from arnar.evaluate.audio import resample

        clips = [resample(c, sample_rate, self.sample_rate) for c in check_clips(audio)]
        hop = self.hop_length
        frames = [math.ceil(c.size / hop) for c in clips]
        out: list[np.ndarray | None] = [None] * len(clips)
        for batch in self._batches(frames):
            width = max(frames[i] for i in batch) * hop
            x = torch.zeros(len(batch), 1, width)
            for row, i in enumerate(batch):
                x[row, 0, : clips[i].size] = torch.from_numpy(clips[i])
            x = x.to(self.device)
            lengths = [frames[i] * hop for i in batch]
            with torch.inference_mode():
                x = self.model.preprocess(x, self.sample_rate)  # already a multiple of hop: no-op
                if len(batch) == 1:
                    codes = self.model.encode(x, self.n_codebooks)[1]
                else:
                    with _masked(self.model.encoder, lengths) as state:
                        z = self.model.encoder(x)
                    got = state["lengths"]
                    if got != [frames[i] for i in batch]:  # a DAC whose layers do not divide evenly
                        raise CodecError(f"DAC encoder frame counts {got} != expected {frames}")
                    codes = self.model.quantizer(z, self.n_codebooks)[1]
            codes = codes.cpu().numpy()
            for row, i in enumerate(batch):
                out[i] = codes[row, : self.n_codebooks, : frames[i]].astype(np.int64)
        return out  # type: ignore[return-value]

    # ----------------------------------------------------------------------- decode

    def _check_codes(self, codes: np.ndarray, what: str) -> np.ndarray:
        codes = np.asarray(codes)
        if codes.ndim != 2 or codes.shape[0] != self.n_codebooks:
            raise CodecError(f"{what}: expected codes [{self.n_codebooks}, T], got shape {codes.shape}")
        if not np.issubdtype(codes.dtype, np.integer):
            raise CodecError(f"{what}: codes must be integers, got {codes.dtype}")
        if codes.size and (codes.min() < 0 or codes.max() >= self.codebook_size):
            raise CodecError(f"{what}: codes outside [0, {self.codebook_size})")
        return codes.astype(np.int64)

    def decode(
        self, codes: Sequence[np.ndarray], prompt: Sequence[np.ndarray | None] | None = None
    ) -> list[np.ndarray]:
        import torch

        items = [self._check_codes(c, f"item {i}") for i, c in enumerate(codes)]
        if prompt is not None:
            if len(prompt) != len(items):
                raise CodecError(f"{len(prompt)} prompts for {len(items)} items")
            heads = [
                np.zeros((self.n_codebooks, 0), np.int64) if p is None else self._check_codes(p, f"prompt {i}")
                for i, p in enumerate(prompt)
            ]
        else:
            heads = [np.zeros((self.n_codebooks, 0), np.int64) for _ in items]
        full = [np.concatenate([h, c], axis=1) for h, c in zip(heads, items)]
        frames = [f.shape[1] for f in full]
        hop = self.hop_length
        out: list[np.ndarray | None] = [None] * len(items)
        for i, f in enumerate(frames):
            if items[i].shape[1] == 0:
                out[i] = np.zeros(0, np.float32)
        todo = [i for i in range(len(items)) if out[i] is None]
        for sub in self._batches([frames[i] for i in todo]):
            batch = [todo[j] for j in sub]
            width = max(frames[i] for i in batch)
            c = torch.zeros(len(batch), self.n_codebooks, width, dtype=torch.long)
            for row, i in enumerate(batch):
                c[row, :, : frames[i]] = torch.from_numpy(full[i])
            c = c.to(self.device)
            lengths = [frames[i] for i in batch]
            with torch.inference_mode():
                z = self.model.quantizer.from_codes(c)[0]
                if len(batch) == 1:
                    y = self.model.decode(z)
                else:
                    for row, n in enumerate(lengths):
                        z[row, :, n:] = 0  # alone, the decoder sees zero padding here
                    with _masked(self.model.decoder, lengths):
                        y = self.model.decode(z)
            y = y[:, 0].float().cpu().numpy()
            for row, i in enumerate(batch):
                start, stop = heads[i].shape[1] * hop, frames[i] * hop
                wav = y[row, start:stop]
                if wav.size < stop - start:  # odd-stride decoders lose a few samples at the end
                    wav = np.pad(wav, (0, stop - start - wav.size))
                out[i] = wav.astype(np.float32)
        return out  # type: ignore[return-value]


@register_codec("dac")
def load_dac(**options: Any) -> DacCodec:
    return DacCodec(**options)
