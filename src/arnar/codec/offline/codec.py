"""The trained offline codec as a :class:`~arnar.codec.base.Codec`: :class:`OfflineCodec` reads a
model folder written by :func:`~arnar.codec.offline.train.train_offline_codec` and serves its
semantic stream (phone encoder, nearest centroid; tokens -> token decoder -> mel) or its RVQ stream
(residual nearest centroids; summed code vectors -> mel), both turned into audio by a vocoder
(:mod:`~arnar.codec.offline.vocoder`: Griffin-Lim, or HiFi-GAN with ``vocoder="hifigan"``); the
loaders ``offline`` and ``offline_rvq`` are registered with :func:`~arnar.codec.base.load_codec`
when this module is imported (the package imports it)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from arnar.codec.base import CodecError, check_clips, register_codec, state_dict_hash
from arnar.codec.offline.config import CONFIG, FORMAT, WEIGHTS
from arnar.codec.offline.features import (
    HOP,
    N_MELS,
    RVQ_STACK,
    SAMPLE_RATE,
    SEMANTIC_STACK,
    _speaker_stats,
    _torch,
    log_mel,
    mel_analysis,
)
from arnar.codec.offline.kmeans import _assign
from arnar.codec.offline.nets import _frontend, _make_decoder, _make_encoder
from arnar.codec.offline.vocoder import VOCODERS, load_vocoder


class OfflineCodec:
    """A trained offline codec (:func:`train_offline_codec`) as a :class:`~arnar.codec.base.Codec`.

    ``stream="semantic"``: name ``offline``, 25 Hz, 1 codebook of ``n_tokens``.
    ``stream="rvq"``: name ``offline_rvq``, 50 Hz, ``n_codebooks`` (default all trained) of
    ``rvq_size``. See the package docstring (:mod:`arnar.codec.offline`) for decoding and
    ``prompt_audio``.
    """

    sample_rate = SAMPLE_RATE
    can_decode = True
    package = "arnar"

    def __init__(self, model: str | os.PathLike, *, stream: str = "semantic", n_codebooks: int | None = None,
                 gl_iters: int | None = None, vocoder: str = "griffin_lim", device: str = "cpu",
                 threads: int | None = None):
        torch = _torch()
        folder = Path(model)
        if not (folder / CONFIG).is_file() or not (folder / WEIGHTS).is_file():
            raise CodecError(f"{folder}: not an offline codec folder (needs {CONFIG} and {WEIGHTS}; "
                             f"train one with arnar.codec.offline.train_offline_codec)")
        cfg = json.loads((folder / CONFIG).read_text(encoding="utf-8"))
        if cfg.get("format") != FORMAT:
            raise CodecError(f"{folder / CONFIG}: format {cfg.get('format')!r}, expected {FORMAT!r}")
        try:
            state = torch.load(str(folder / WEIGHTS), map_location="cpu", weights_only=True)
        except Exception as err:
            raise CodecError(f"{folder / WEIGHTS}: not a readable weights file ({err})") from err
        if stream not in ("semantic", "rvq"):
            raise CodecError(f"stream must be 'semantic' or 'rvq', got {stream!r}")
        self.stream = stream
        self.cfg = cfg
        self.source = str(folder)
        self.device = torch.device(device)
        self.threads = threads
        self.gl_iters = int(gl_iters if gl_iters is not None else cfg.get("gl_iters", 32))
        # the STFT analysis of every mel this codec reads and writes (folders older than the
        # option used the 25 ms window)
        try:
            self.analysis = mel_analysis(cfg.get("mel_analysis", "stft25ms"))
        except ValueError as err:
            raise CodecError(f"{folder / CONFIG}: {err}") from err
        if vocoder not in VOCODERS:
            raise CodecError(f"unknown vocoder {vocoder!r}; known: {', '.join(VOCODERS)}")
        self.vocoder = vocoder
        self._vocode = None  # loaded on the first decode (HiFi-GAN's weights are 56 MB)
        self._encoder_inputs = _frontend(dict(cfg), threads) if stream == "semantic" else None

        def sub(prefix):
            return {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}

        try:
            if stream == "semantic":
                self.name = "offline"
                self.frame_rate = float(cfg["semantic_frame_rate"])
                self.n_codebooks = 1
                self.codebook_size = int(cfg["n_tokens"])
                self.encoder = _make_encoder(cfg)
                self.encoder.load_state_dict(sub("encoder."), strict=True)
                self.decoder = _make_decoder(cfg)
                self.decoder.load_state_dict(sub("decoder."), strict=True)
                self.centroids = state["semantic_centroids"]
                self.default_speaker = state["default_speaker"]
                self.encoder.eval().to(self.device)
                self.decoder.eval().to(self.device)
                hashed = {k: v for k, v in state.items()
                          if k.startswith(("encoder.", "decoder.")) or k in ("semantic_centroids", "default_speaker")}
            else:
                self.name = "offline_rvq"
                self.frame_rate = float(cfg["rvq_frame_rate"])
                trained = int(cfg["rvq_codebooks"])
                n = trained if n_codebooks is None else int(n_codebooks)
                if not 1 <= n <= trained:
                    raise CodecError(f"n_codebooks must be in 1..{trained}, got {n_codebooks}")
                self.n_codebooks = n
                self.codebook_size = int(cfg["rvq_size"])
                self.codebooks = state["rvq.codebooks"][:n].contiguous()
                self.mean = state["rvq.mean"]
                self.std = state["rvq.std"]
                hashed = {k: v for k, v in state.items() if k in ("rvq.mean", "rvq.std")}
                hashed["rvq.codebooks"] = self.codebooks
        except (KeyError, RuntimeError) as err:
            raise CodecError(f"{folder / WEIGHTS}: weights do not match {CONFIG} ({err})") from err
        settings = {k: v for k, v in cfg.items() if k not in ("threads",)}
        self._hash = state_dict_hash(hashed, {"codec": self.name, "stream": stream, "config": settings,
                                              "n_codebooks": self.n_codebooks})

    # ---------------------------------------------------------------- protocol

    def config_hash(self) -> str:
        return self._hash

    @property
    def samples_per_frame(self) -> int:
        return HOP * (SEMANTIC_STACK if self.stream == "semantic" else RVQ_STACK)

    def n_frames(self, n_samples: int) -> int:
        """Tokens for a clip of ``n_samples`` at 16 kHz: ``ceil(n / 640)`` (25 Hz) or ``ceil(n / 320)``."""
        return max(1, -(-int(n_samples) // self.samples_per_frame))

    @contextmanager
    def _threads(self):
        torch = _torch()
        if not self.threads:
            with torch.inference_mode():
                yield
            return
        previous = torch.get_num_threads()
        torch.set_num_threads(int(self.threads))
        try:
            with torch.inference_mode():
                yield
        finally:
            torch.set_num_threads(previous)

    def encode(self, audio: Sequence[np.ndarray], sample_rate: int) -> list[np.ndarray]:
        """One ``int64 [n_codebooks, T]`` per clip; each clip is processed alone (no padding)."""
        from arnar.evaluate.audio import resample

        clips = [resample(c, sample_rate, SAMPLE_RATE) for c in check_clips(audio)]
        with self._threads():
            return [self._encode_one(c) for c in clips]

    def latents(self, audio: np.ndarray, sample_rate: int):
        """The vectors this stream quantizes, one per token frame: ``float32 [T, D]`` (torch).

        Semantic stream: the phone encoder's features at ``token_layer`` (what its k-means
        clusters, 25 Hz). RVQ stream: the globally normalised log-mel, 2 frames stacked (160-d,
        50 Hz), which codebook 1 quantizes. Chain-of-Details' coarse-token ablation
        (:mod:`arnar.codec.coarse`) pools and quantizes these."""
        from arnar.evaluate.audio import resample

        clip = resample(check_clips([audio])[0], sample_rate, SAMPLE_RATE)
        with self._threads():
            return self._latents(clip).clone()

    def _latents(self, clip: np.ndarray):
        torch = _torch()
        if self.stream == "semantic":
            inputs = self._encoder_inputs(clip, log_mel(clip, SEMANTIC_STACK, self.analysis))
            return self._semantic_latents(torch.from_numpy(inputs))
        mel = torch.from_numpy(log_mel(clip, RVQ_STACK, self.analysis))
        return ((mel - self.mean) / self.std).reshape(-1, RVQ_STACK * N_MELS)

    def _semantic_latents(self, encoder_inputs):
        x = encoder_inputs[None].to(self.device)
        return self.encoder.features(x, self.cfg.get("token_layer", "bottleneck"))[0].cpu()

    def semantic_tokens(self, encoder_inputs) -> np.ndarray:
        """The semantic stream's ``int64 [1, T]`` tokens of one clip from its encoder inputs
        (``float32 [T, D]`` torch, what the front end makes of the clip): :meth:`encode` without
        the front end, for a caller that has computed it already (the codec's own training
        writes the train split's tokens this way, :func:`~arnar.codec.offline.train.write_train_tokens`)."""
        if self.stream != "semantic":
            raise CodecError("semantic_tokens: this is the RVQ stream")
        with self._threads():
            return self._semantic_tokens(encoder_inputs)

    def _semantic_tokens(self, encoder_inputs) -> np.ndarray:
        return _assign(self._semantic_latents(encoder_inputs), self.centroids).numpy().astype(np.int64)[None, :]

    def _encode_one(self, clip: np.ndarray) -> np.ndarray:
        torch = _torch()
        if self.stream == "semantic":
            inputs = self._encoder_inputs(clip, log_mel(clip, SEMANTIC_STACK, self.analysis))
            return self._semantic_tokens(torch.from_numpy(inputs))
        res = self._latents(clip)
        codes = []
        for cb in self.codebooks:
            idx = _assign(res, cb)
            res = res - cb[idx]
            codes.append(idx)
        return torch.stack(codes).numpy().astype(np.int64)

    def _check_codes(self, codes: np.ndarray, what: str) -> np.ndarray:
        codes = np.asarray(codes)
        if codes.ndim == 1 and self.n_codebooks == 1:
            codes = codes[None, :]
        if codes.ndim != 2 or codes.shape[0] != self.n_codebooks:
            raise CodecError(f"{what}: expected codes [{self.n_codebooks}, T], got shape {codes.shape}")
        if not np.issubdtype(codes.dtype, np.integer):
            raise CodecError(f"{what}: codes must be integers, got {codes.dtype}")
        if codes.size and (codes.min() < 0 or codes.max() >= self.codebook_size):
            raise CodecError(f"{what}: codes outside 0..{self.codebook_size - 1}")
        return codes.astype(np.int64)

    def decode_mel(self, codes: Sequence[np.ndarray], prompt: Sequence[np.ndarray | None] | None = None, *,
                   prompt_audio: Sequence[np.ndarray | None] | None = None,
                   prompt_sample_rate: int = SAMPLE_RATE) -> list[np.ndarray]:
        """Log-mel ``[k T, 80]`` per item (what :meth:`decode` turns into audio)."""
        from arnar.evaluate.audio import resample

        torch = _torch()
        n = len(codes)
        prompt = list(prompt) if prompt is not None else [None] * n
        prompt_audio = list(prompt_audio) if prompt_audio is not None else [None] * n
        if len(prompt) != n or len(prompt_audio) != n:
            raise CodecError(f"{n} code arrays but {len(prompt)} prompts and {len(prompt_audio)} prompt audios")
        mels = []
        with self._threads():
            for i in range(n):
                body = self._check_codes(codes[i], f"item {i}")
                head = (self._check_codes(prompt[i], f"prompt {i}") if prompt[i] is not None
                        else np.zeros((self.n_codebooks, 0), dtype=np.int64))
                full = np.concatenate([head, body], axis=1)
                if full.shape[1] == 0:
                    mels.append(np.zeros((0, N_MELS), dtype=np.float32))
                    continue
                if self.stream == "semantic":
                    if prompt_audio[i] is not None:
                        clip = resample(check_clips([prompt_audio[i]])[0], prompt_sample_rate, SAMPLE_RATE)
                        stats = torch.from_numpy(_speaker_stats(log_mel(clip, SEMANTIC_STACK, self.analysis)))
                    else:
                        stats = self.default_speaker
                    tok = torch.from_numpy(full)[0][None].to(self.device)
                    norm = self.decoder(tok, stats[None].to(self.device))[0].cpu()
                    mel = norm * stats[N_MELS:] + stats[:N_MELS]
                    cut = head.shape[1] * SEMANTIC_STACK
                else:
                    vec = torch.zeros((full.shape[1], RVQ_STACK * N_MELS))
                    for q, cb in enumerate(self.codebooks):
                        vec += cb[torch.from_numpy(full[q])]
                    mel = vec.reshape(-1, N_MELS) * self.std + self.mean
                    cut = head.shape[1] * RVQ_STACK
                mels.append(mel[cut:].numpy().astype(np.float32))
        return mels

    def decode(self, codes: Sequence[np.ndarray], prompt: Sequence[np.ndarray | None] | None = None, *,
               prompt_audio: Sequence[np.ndarray | None] | None = None,
               prompt_sample_rate: int = SAMPLE_RATE) -> list[np.ndarray]:
        """Audio (float32, 16 kHz, ``T * samples_per_frame`` samples) per item. ``prompt_audio``:
        per item a mono clip of the speaker (at ``prompt_sample_rate``) or None; semantic stream
        only (see the package docstring, :mod:`arnar.codec.offline`)."""
        mels = self.decode_mel(codes, prompt, prompt_audio=prompt_audio, prompt_sample_rate=prompt_sample_rate)
        if self._vocode is None:
            self._vocode = load_vocoder(self.vocoder, gl_iters=self.gl_iters, device=str(self.device),
                                       analysis=self.analysis)
        with self._threads():
            return [self._vocode(m) if m.shape[0] else np.zeros(0, np.float32) for m in mels]


@register_codec("offline")
def load_offline(**options: Any) -> OfflineCodec:
    """``load_codec("offline", model=<dir>, stream="semantic"|"rvq", ...)``."""
    if "model" not in options:
        raise CodecError("the offline codec needs model=<folder written by train_offline_codec>")
    return OfflineCodec(**options)


@register_codec("offline_rvq")
def load_offline_rvq(**options: Any) -> OfflineCodec:
    """``load_codec("offline_rvq", model=<dir>)``: the RVQ stream of an offline codec folder."""
    if "model" not in options:
        raise CodecError("the offline codec needs model=<folder written by train_offline_codec>")
    options.setdefault("stream", "rvq")
    return OfflineCodec(**options)
