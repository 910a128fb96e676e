"""Chain-of-Details temporal levels: first-quantizer tokens decimated in time.

CoD (section IV-A) builds L temporal levels from the token sequence of the *first* RVQ quantizer:
level l = 1..L (coarse to fine) is that sequence decimated by ``2 ** (L - l)``; for L = 3 the
factors are 4, 2, 1, i.e. 21.53 / 43.07 / 86.13 Hz for DAC 44.1 kHz. Level l > 1 is generated
conditioned on level l - 1 (Eq. 1), which the model sees stretched to level l's length
(:func:`upsample`).

Decimation rule (the paper only says "decimated" / "downsampled by a factor of 2"): **keep the
first token of every group of ``factor`` tokens**, ``x[..., ::factor]``, so a level has
``ceil(T / factor)`` tokens and a partial last group still yields a token. Why this and not
pooling:

* Tokens are categories: there is no mean, and a majority vote is undefined on ties, which are
  the rule rather than the exception for factor 2 (any pair of different tokens); a tie-break
  such as "first" makes it this rule in disguise.
* Every coarse token is a real token of the finer level at a known position (frame
  ``factor * i``): the coarse level is a subsequence of the fine one, the "direct mapping
  relationship" with the final acoustic tokens that the paper (Table V) credits for decimated
  tokens beating independently trained coarse tokens; ``upsample(decimate(x, k), k, T)`` agrees
  with ``x`` at every kept frame.
* It nests: ``decimate(decimate(x, 2), 2) == decimate(x, 4)``, so level l is exactly level l + 1
  decimated by 2, for every pair of adjacent levels, whatever L is. Majority pooling does not
  nest (a mode of modes is not the mode).
* The first (not the centre) frame of each group is kept so that a trailing partial group
  ``[k * i, T)`` always has a token, whatever its size, and level lengths are simply
  ``ceil(T / factor)``; the phase offset (half a group at most, ~23 ms at level 1 for DAC) is
  the same for every utterance and is learnt by the model.

All functions work on any array whose last axis is time (``[T]`` or ``[n_q, T]``).
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["decimate", "level_factors", "level_lengths", "level_rates", "levels", "upsample"]


def _check_levels(n_levels: int) -> None:
    if int(n_levels) != n_levels or n_levels < 1:
        raise ValueError(f"number of levels must be a positive integer, got {n_levels!r}")


def _check_factor(factor: int) -> None:
    if int(factor) != factor or factor < 1:
        raise ValueError(f"factor must be a positive integer, got {factor!r}")


def level_factors(n_levels: int) -> list[int]:
    """Decimation factor of each level, coarse to fine: ``2 ** (L - l)`` (L=3: [4, 2, 1])."""
    _check_levels(n_levels)
    return [2 ** (n_levels - level) for level in range(1, n_levels + 1)]


def level_lengths(n_frames: int, n_levels: int) -> list[int]:
    """Tokens per level, coarse to fine, for ``n_frames`` full-rate tokens: ``ceil(T / factor)``."""
    if n_frames < 0:
        raise ValueError(f"n_frames must be >= 0, got {n_frames}")
    return [math.ceil(n_frames / f) for f in level_factors(n_levels)]


def level_rates(frame_rate: float, n_levels: int) -> list[float]:
    """Token rate of each level, coarse to fine (DAC 44.1k, L=3: 21.53, 43.07, 86.13 Hz)."""
    return [frame_rate / f for f in level_factors(n_levels)]


def decimate(tokens: np.ndarray, factor: int) -> np.ndarray:
    """Keep the first token of every group of ``factor`` along the last axis (``ceil(T/factor)``)."""
    _check_factor(factor)
    tokens = np.asarray(tokens)
    if tokens.ndim == 0:
        raise ValueError("tokens must have a time axis")
    return tokens[..., ::factor].copy()


def levels(tokens: np.ndarray, n_levels: int) -> list[np.ndarray]:
    """The CoD levels of a first-quantizer sequence, coarse to fine (the last one is ``tokens``).

    ``tokens`` is ``[T]``; codes ``[n_q, T]`` from a codec use their first quantizer (row 0).
    """
    tokens = np.asarray(tokens)
    if tokens.ndim == 2:
        tokens = tokens[0]
    if tokens.ndim != 1:
        raise ValueError(f"expected first-quantizer tokens [T] or codes [n_q, T], got shape {tokens.shape}")
    return [decimate(tokens, f) for f in level_factors(n_levels)]


def upsample(coarse: np.ndarray, factor: int, length: int) -> np.ndarray:
    """Repeat each token ``factor`` times along the last axis, cut or extended to ``length``.

    The inverse of :func:`decimate` used to condition the next level: frame j of the result is
    ``coarse[j // factor]``. If ``length`` exceeds ``factor * len(coarse)`` (a coarse level
    shorter than the fine one needs), the last token is repeated.
    """
    _check_factor(factor)
    if length < 0:
        raise ValueError(f"length must be >= 0, got {length}")
    coarse = np.asarray(coarse)
    if coarse.ndim == 0:
        raise ValueError("tokens must have a time axis")
    if length == 0:
        return coarse[..., :0].copy()
    if coarse.shape[-1] == 0:
        raise ValueError(f"cannot upsample an empty sequence to length {length}")
    index = np.minimum(np.arange(length) // factor, coarse.shape[-1] - 1)
    return coarse[..., index]
