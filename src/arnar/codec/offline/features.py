"""Features of the offline codec: the 16 kHz log-mel (``torch.stft``, 80 Slaney mel bands, natural
log), its inverse (mel-filterbank pseudo-inverse, then fast Griffin-Lim from a seeded phase), and
the per-utterance normalisation and speaker statistics (per-band mean and deviation) that the phone
encoder's mel front end and the token decoder's speaker prompt use. The signal constants (rates,
FFT, hop, the mel frames per 25 Hz token and per 50 Hz RVQ frame) live here."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

SAMPLE_RATE = 16000
HOP = 160  # 10 ms -> 100 Hz mel frames, whatever the analysis window
N_MELS = 80
SEMANTIC_STACK = 4  # mel frames per semantic token: 25 Hz
RVQ_STACK = 2  # mel frames per RVQ frame: 50 Hz
LOG_FLOOR = 1e-5


@dataclass(frozen=True)
class MelAnalysis:
    """One STFT analysis of the codec's log-mel at 16 kHz (the hop is always :data:`HOP`).

    ``hifigan_log_gain``: what to add to this analysis's log-mel to get the level of HiFi-GAN's own
    mel of the same sound (:mod:`~arnar.codec.offline.vocoder`)."""

    name: str
    n_fft: int
    win: int  # Hann window length in samples
    hifigan_log_gain: float


MEL_ANALYSES = {
    # the codec's first analysis: a 25 ms window. Its gain to HiFi-GAN's mel is the ratio of the two
    # windows' sums, log(512 / 200); HiFi-GAN's mel of the same clip has a finer spectrum (a window
    # twice as long), which this one cannot carry.
    "stft25ms": MelAnalysis("stft25ms", 512, 400, math.log(512 / 200)),
    # HiFi-GAN's analysis: its 1024-sample window at 22.05 kHz lasts 46.4 ms, 743 samples here, with
    # the same 1024-point FFT. A mel band then sums the same spectrum at both rates (the bin spacing
    # and the window's sum both scale with the rate and cancel), so the gain is 0: this is the
    # vocoder's own mel on a 100 Hz grid (measured on 6 test clips: offset 0.000, mean absolute
    # difference 0.06 after the grid change; stft25ms: offset 1.08, difference 0.28).
    "hifigan": MelAnalysis("hifigan", 1024, 743, 0.0),
}
DEFAULT_ANALYSIS = "stft25ms"
N_FFT = MEL_ANALYSES[DEFAULT_ANALYSIS].n_fft
WIN = MEL_ANALYSES[DEFAULT_ANALYSIS].win


def mel_analysis(name: str | MelAnalysis) -> MelAnalysis:
    """The :class:`MelAnalysis` called ``name`` (a codec config's ``mel_analysis``)."""
    if isinstance(name, MelAnalysis):
        return name
    if name not in MEL_ANALYSES:
        raise ValueError(f"unknown mel analysis {name!r}; known: {', '.join(MEL_ANALYSES)}")
    return MEL_ANALYSES[name]


def _torch():
    import torch

    return torch


_MEL_CACHE: dict[str, Any] = {}


def _librosa_mel_filters(n_fft: int) -> np.ndarray:
    """``librosa.filters.mel`` of the codec's bands at FFT size ``n_fft`` (float32 [80, n_fft/2+1]),
    kept in the cache folder (:mod:`arnar.cache`) under librosa's version: importing
    ``librosa.filters`` (scipy.signal) costs ~1.3 s of every synthesis job, reading the array nothing."""
    from importlib.metadata import version

    from arnar.cache import cached_file

    def make(tmp) -> None:
        import librosa

        np.save(tmp, librosa.filters.mel(sr=SAMPLE_RATE, n_fft=n_fft, n_mels=N_MELS, fmin=0.0,
                                         fmax=SAMPLE_RATE / 2).astype(np.float32))

    name = f"mel/librosa-{version('librosa')}.sr{SAMPLE_RATE}.fft{n_fft}.mels{N_MELS}.slaney.npy"
    return np.load(cached_file(name, make))


def _mel_basis(analysis: str | MelAnalysis = DEFAULT_ANALYSIS):
    """(mel filters, their pseudo-inverse, the Hann window) of one analysis, built once."""
    a = mel_analysis(analysis)
    if a.name not in _MEL_CACHE:
        torch = _torch()
        basis = _librosa_mel_filters(a.n_fft)
        _MEL_CACHE[a.name] = (torch.from_numpy(basis),
                              torch.from_numpy(np.linalg.pinv(basis.astype(np.float64)).astype(np.float32)),
                              torch.hann_window(a.win))
    return _MEL_CACHE[a.name]


def log_mel(wav: np.ndarray, frames_per_token: int = SEMANTIC_STACK,
            analysis: str | MelAnalysis = DEFAULT_ANALYSIS) -> np.ndarray:
    """``float32 [4T, 80]`` natural-log mel of a 16 kHz clip, ``T = ceil(n / (160 * k))`` for
    ``k = frames_per_token``: the clip is zero-padded to ``k * T * 160`` samples first, so every
    token frame has exactly ``k`` mel frames (frame ``i`` is centred on sample ``160 i``)."""
    torch = _torch()
    a = mel_analysis(analysis)
    basis, _, window = _mel_basis(a)
    wav = np.asarray(wav, dtype=np.float32)
    step = HOP * frames_per_token
    n_tokens = max(1, -(-wav.size // step))
    n_frames = n_tokens * frames_per_token
    x = np.zeros(n_frames * HOP, dtype=np.float32)
    x[: wav.size] = wav
    spec = torch.stft(torch.from_numpy(x), a.n_fft, HOP, a.win, window, center=True, pad_mode="reflect",
                      return_complex=True)
    mel = basis @ spec.abs()[:, :n_frames]
    return torch.log(torch.clamp(mel, min=LOG_FLOOR)).T.contiguous().numpy()


def griffin_lim(magnitude: np.ndarray, n_iter: int = 32, momentum: float = 0.99, seed: int = 0,
                analysis: str | MelAnalysis = DEFAULT_ANALYSIS) -> np.ndarray:
    """Fast Griffin-Lim (Perraudin et al.) from a linear magnitude ``[n_fft/2+1, F]`` (frames
    centred on multiples of the hop) to ``F * 160`` samples; deterministic (seeded initial phase)."""
    torch = _torch()
    a = mel_analysis(analysis)
    _, _, window = _mel_basis(a)
    n_frames = magnitude.shape[1]
    length = n_frames * HOP
    mag = torch.as_tensor(np.asarray(magnitude, dtype=np.float32))
    mag = torch.cat([mag, mag[:, -1:]], dim=1)  # a centred STFT of `length` samples has F + 1 frames
    gen = torch.Generator().manual_seed(seed)
    angles = torch.polar(torch.ones_like(mag), 2 * math.pi * torch.rand(mag.shape, generator=gen))
    previous = torch.zeros_like(angles)
    for _ in range(n_iter):
        y = torch.istft(mag * angles, a.n_fft, HOP, a.win, window, center=True, length=length)
        rebuilt = torch.stft(y, a.n_fft, HOP, a.win, window, center=True, pad_mode="constant", return_complex=True)
        angles = rebuilt - (momentum / (1 + momentum)) * previous
        previous = rebuilt
        angles = angles / (angles.abs() + 1e-16)
    y = torch.istft(mag * angles, a.n_fft, HOP, a.win, window, center=True, length=length)
    return y.numpy().astype(np.float32)


def mel_to_audio(logmel: np.ndarray, n_iter: int = 32, analysis: str | MelAnalysis = DEFAULT_ANALYSIS) -> np.ndarray:
    """A ``[F, 80]`` log-mel (as :func:`log_mel` makes with the same ``analysis``) -> ``F * 160``
    float32 samples at 16 kHz."""
    torch = _torch()
    _, pinv, _ = _mel_basis(analysis)
    mel = torch.exp(torch.as_tensor(np.asarray(logmel, dtype=np.float32))).T  # [80, F]
    magnitude = torch.clamp(pinv @ mel, min=0.0).numpy()
    return griffin_lim(magnitude, n_iter=n_iter, analysis=analysis)


def _utterance_norm(mel: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-band mean/std normalisation over the clip; returns (normalised, mean, std)."""
    mean = mel.mean(axis=0)
    std = np.maximum(mel.std(axis=0), 1e-3)
    return ((mel - mean) / std).astype(np.float32), mean.astype(np.float32), std.astype(np.float32)


def _speaker_stats(mel: np.ndarray) -> np.ndarray:
    """The decoder's speaker prompt: per-band mean and std of a log-mel, ``[160]``."""
    _, mean, std = _utterance_norm(mel)
    return np.concatenate([mean, std]).astype(np.float32)
