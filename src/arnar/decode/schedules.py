"""Schedules of the masked-generation paradigms.

* MaskGIT cosine schedule (Chang et al. 2022, used by MaskGCT): the share of tokens still masked
  after a fraction ``u`` of the decoding steps is ``gamma(u) = cos(pi/2 * u)``; training draws
  ``u ~ U(0, 1)`` and masks ``ceil(gamma(u) * T)`` tokens.
* Total-length estimate when the length is not given (PALLE, arXiv:2504.10352, Eq. 11):
  ``T_gen = T_ref * (1 + L_gen / L_ref)`` for prompt *plus* target, so the target alone gets
  ``T_ref * L_gen / L_ref`` frames.
"""

from __future__ import annotations

import math


def cosine_mask_ratio(u: float) -> float:
    """gamma(u) = cos(pi/2 * u): 1 at u=0 (all masked), 0 at u=1."""
    if not 0.0 <= u <= 1.0:
        raise ValueError(f"schedule position must be in [0, 1], got {u}")
    return math.cos(math.pi / 2 * u)


def masks_per_step(n_tokens: int, steps: int) -> list[int]:
    """How many tokens remain masked after each of ``steps`` MaskGIT steps (cosine schedule).

    Non-increasing, ends at 0, and each step unmasks at least one token while any remain
    (so ``steps`` larger than ``n_tokens`` cannot stall)."""
    if steps < 1:
        raise ValueError("steps must be >= 1")
    remaining = []
    previous = n_tokens
    for s in range(1, steps + 1):
        left = math.floor(n_tokens * cosine_mask_ratio(s / steps))
        left = min(left, max(previous - 1, 0))
        remaining.append(left)
        previous = left
    return remaining


def total_frames_estimate(prompt_frames: int, prompt_text_len: int, text_len: int) -> int:
    """Target frames from PALLE (arXiv:2504.10352) Eq. 11: T_ref * L_gen / L_ref (at least one frame)."""
    if prompt_text_len <= 0:
        raise ValueError("the prompt transcript is empty: cannot estimate the speaking rate")
    return max(1, round(prompt_frames * text_len / prompt_text_len))
