"""Features of the offline codec: the 16 kHz log-mel (``torch.stft``, 80 Slaney mel bands, natural
log), its inverse (mel-filterbank pseudo-inverse, then fast Griffin-Lim from a seeded phase), and
the per-utterance normalisation and speaker statistics (per-band mean and deviation) that the phone
encoder's mel front end and the token decoder's speaker prompt use. The signal constants (rates,
FFT, hop, the mel frames per 25 Hz token and per 50 Hz RVQ frame) live here."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

SAMPLE_RATE = 16000
N_FFT = 512
WIN = 400  # 25 ms
HOP = 160  # 10 ms -> 100 Hz mel frames
N_MELS = 80
SEMANTIC_STACK = 4  # mel frames per semantic token: 25 Hz
RVQ_STACK = 2  # mel frames per RVQ frame: 50 Hz
LOG_FLOOR = 1e-5


def _torch():
    import torch

    return torch


_MEL_CACHE: dict[str, Any] = {}


def _librosa_mel_filters() -> np.ndarray:
    """``librosa.filters.mel`` of the codec's settings (float32 [80, 257]), kept in the cache folder
    (:mod:`arnar.cache`) under librosa's version: importing ``librosa.filters`` (scipy.signal) costs
    ~1.3 s of every synthesis job, reading the 82 kB array nothing."""
    from importlib.metadata import version

    from arnar.cache import cached_file

    def make(tmp) -> None:
        import librosa

        np.save(tmp, librosa.filters.mel(sr=SAMPLE_RATE, n_fft=N_FFT, n_mels=N_MELS, fmin=0.0,
                                         fmax=SAMPLE_RATE / 2).astype(np.float32))

    name = f"mel/librosa-{version('librosa')}.sr{SAMPLE_RATE}.fft{N_FFT}.mels{N_MELS}.slaney.npy"
    return np.load(cached_file(name, make))


def _mel_basis():
    if "basis" not in _MEL_CACHE:
        torch = _torch()
        basis = _librosa_mel_filters()
        _MEL_CACHE["basis"] = torch.from_numpy(basis)  # [80, 257]
        _MEL_CACHE["pinv"] = torch.from_numpy(np.linalg.pinv(basis.astype(np.float64)).astype(np.float32))
        _MEL_CACHE["window"] = torch.hann_window(WIN)
    return _MEL_CACHE["basis"], _MEL_CACHE["pinv"], _MEL_CACHE["window"]


def log_mel(wav: np.ndarray, frames_per_token: int = SEMANTIC_STACK) -> np.ndarray:
    """``float32 [4T, 80]`` natural-log mel of a 16 kHz clip, ``T = ceil(n / (160 * k))`` for
    ``k = frames_per_token``: the clip is zero-padded to ``k * T * 160`` samples first, so every
    token frame has exactly ``k`` mel frames (frame ``i`` is centred on sample ``160 i``)."""
    torch = _torch()
    basis, _, window = _mel_basis()
    wav = np.asarray(wav, dtype=np.float32)
    step = HOP * frames_per_token
    n_tokens = max(1, -(-wav.size // step))
    n_frames = n_tokens * frames_per_token
    x = np.zeros(n_frames * HOP, dtype=np.float32)
    x[: wav.size] = wav
    spec = torch.stft(torch.from_numpy(x), N_FFT, HOP, WIN, window, center=True, pad_mode="reflect",
                      return_complex=True)
    mel = basis @ spec.abs()[:, :n_frames]
    return torch.log(torch.clamp(mel, min=LOG_FLOOR)).T.contiguous().numpy()


def griffin_lim(magnitude: np.ndarray, n_iter: int = 32, momentum: float = 0.99, seed: int = 0) -> np.ndarray:
    """Fast Griffin-Lim (Perraudin et al.) from a linear magnitude ``[257, F]`` (frames centred on
    multiples of the hop) to ``F * 160`` samples; deterministic (seeded initial phase)."""
    torch = _torch()
    _, _, window = _mel_basis()
    n_frames = magnitude.shape[1]
    length = n_frames * HOP
    mag = torch.as_tensor(np.asarray(magnitude, dtype=np.float32))
    mag = torch.cat([mag, mag[:, -1:]], dim=1)  # a centred STFT of `length` samples has F + 1 frames
    gen = torch.Generator().manual_seed(seed)
    angles = torch.polar(torch.ones_like(mag), 2 * math.pi * torch.rand(mag.shape, generator=gen))
    previous = torch.zeros_like(angles)
    for _ in range(n_iter):
        y = torch.istft(mag * angles, N_FFT, HOP, WIN, window, center=True, length=length)
        rebuilt = torch.stft(y, N_FFT, HOP, WIN, window, center=True, pad_mode="constant", return_complex=True)
        angles = rebuilt - (momentum / (1 + momentum)) * previous
        previous = rebuilt
        angles = angles / (angles.abs() + 1e-16)
    y = torch.istft(mag * angles, N_FFT, HOP, WIN, window, center=True, length=length)
    return y.numpy().astype(np.float32)


def mel_to_audio(logmel: np.ndarray, n_iter: int = 32) -> np.ndarray:
    """A ``[F, 80]`` log-mel (as :func:`log_mel` makes) -> ``F * 160`` float32 samples at 16 kHz."""
    torch = _torch()
    _, pinv, _ = _mel_basis()
    mel = torch.exp(torch.as_tensor(np.asarray(logmel, dtype=np.float32))).T  # [80, F]
    magnitude = torch.clamp(pinv @ mel, min=0.0).numpy()
    return griffin_lim(magnitude, n_iter=n_iter)


def _utterance_norm(mel: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-band mean/std normalisation over the clip; returns (normalised, mean, std)."""
    mean = mel.mean(axis=0)
    std = np.maximum(mel.std(axis=0), 1e-3)
    return ((mel - mean) / std).astype(np.float32), mean.astype(np.float32), std.astype(np.float32)


def _speaker_stats(mel: np.ndarray) -> np.ndarray:
    """The decoder's speaker prompt: per-band mean and std of a log-mel, ``[160]``."""
    _, mean, std = _utterance_norm(mel)
    return np.concatenate([mean, std]).astype(np.float32)
