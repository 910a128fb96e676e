"""Decoding schedule and length rule of DELTA-TTS (OpenReview v2DbAIl7sf, Sec. 3.5 and the rule-based
length variant).

* Time-shifted unmasking schedule, Eq. 3: after step ``n`` of ``T`` a fraction

      c_n = mu * (n/T) / (1 + (mu - 1) * (n/T))

  of the ``L`` target tokens is unmasked, so step ``n`` commits
  ``k_n = floor(c_n L) - floor(c_{n-1} L)`` tokens. ``mu < 1`` commits few tokens early and most
  at the end; ``mu = 1`` is the uniform schedule ``c_n = n/T`` (the ablation baseline of Table 5).
  The arithmetic is exact (``fractions.Fraction``; ``mu`` is read through its decimal string, so
  ``0.3`` means 3/10): a float ``c_T`` can come out as ``0.9999999...`` and leave a token masked,
  and a float ``floor`` can land one below a hand-worked value. ``c_T = 1`` exactly, so the last
  step commits whatever is left and ``sum(k_n) == L`` always.

* Rule-based length: ``r_prompt * W_target`` target frames with
  ``r_prompt = N_prompt_frames / W_prompt`` and ``W`` a character count "with reduced weights for
  whitespace and punctuation". The paper gives no weights; ours are decoding options of the
  paradigm (``space_weight`` 0.3, ``punct_weight`` 0.5 by default: a word boundary is mostly not
  a pause, and punctuation is sometimes a pause and never a phone). Our requests carry BPE ids,
  not characters, so ``W`` is summed over the sentencepiece pieces the ids stand for: the
  word-start marker ``▁`` is the whitespace, byte-fallback pieces count the character their byte
  starts, control pieces count nothing.
"""

from __future__ import annotations

import math
import re
import unicodedata
from fractions import Fraction

WORD_START = "\u2581"  # sentencepiece's "a space was here" marker
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _exact(mu: float) -> Fraction:
    if isinstance(mu, bool) or not isinstance(mu, (int, float, Fraction)):
        raise TypeError(f"mu must be a number, got {mu!r}")
    value = Fraction(mu) if isinstance(mu, (int, Fraction)) else Fraction(repr(float(mu)))
    if value <= 0:
        raise ValueError(f"the time-shift mu must be > 0 (Eq. 3), got {mu}")
    return value


def unmasked_fraction(n: int, steps: int, mu: float = 1.0) -> Fraction:
    """``c_n`` of Eq. 3, exactly: the share of target tokens unmasked after step ``n`` of ``steps``."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if not 0 <= n <= steps:
        raise ValueError(f"step {n} is outside 0..{steps}")
    m, u = _exact(mu), Fraction(n, steps)
    return m * u / (1 + (m - 1) * u)


def unmask_counts(length: int, steps: int, mu: float = 1.0) -> list[int]:
    """``[k_1, ..., k_T]``: how many tokens step ``n`` commits (Eq. 3), summing to ``length``.

    Entries may be 0 (short targets with ``mu < 1``: the first steps have nothing to commit)."""
    if length < 0:
        raise ValueError(f"length must be >= 0, got {length}")
    committed = [math.floor(unmasked_fraction(n, steps, mu) * length) for n in range(steps + 1)]
    assert committed[0] == 0 and committed[-1] == length  # exact arithmetic: c_0 = 0, c_T = 1
    return [committed[n] - committed[n - 1] for n in range(1, steps + 1)]


# ----------------------------------------------------------------------------- length rule

def character_weight(ch: str, space_weight: float, punct_weight: float) -> float:
    """Weight of one character in ``W``: 1 for letters, digits and symbols, ``space_weight`` for
    whitespace (and ``▁``), ``punct_weight`` for punctuation (Unicode categories P*)."""
    if ch == WORD_START or ch.isspace():
        return space_weight
    if unicodedata.category(ch).startswith("P"):
        return punct_weight
    return 1.0


def piece_weight(piece: str, space_weight: float = 0.3, punct_weight: float = 0.5, *,
                 control: bool = False) -> float:
    """``W`` of one sentencepiece piece. A byte-fallback piece ``<0xNN>`` is one byte of UTF-8:
    an ASCII byte is its character, a lead byte (``>= 0xC0``) starts one character (weight 1),
    a continuation byte (``0x80..0xBF``) adds nothing, so a multi-byte character counts once.
    ``control`` pieces (``<s>``, ``</s>``, ``<pad>``) never stand for text: weight 0."""
    if control:
        return 0.0
    byte = _BYTE_PIECE.fullmatch(piece)
    if byte:
        value = int(byte.group(1), 16)
        if value < 0x80:
            return character_weight(chr(value), space_weight, punct_weight)
        return 1.0 if value >= 0xC0 else 0.0
    return sum(character_weight(ch, space_weight, punct_weight) for ch in piece)


def rule_based_frames(prompt_frames: int, prompt_weight: float, target_weight: float) -> int:
    """``r_prompt * W_target`` with ``r_prompt = prompt_frames / W_prompt``, rounded, >= 1 frame."""
    if prompt_frames <= 0:
        raise ValueError("the prompt has no speech frames: cannot estimate the speaking rate")
    if prompt_weight <= 0:
        raise ValueError("the prompt transcript has no weighted characters: cannot estimate the speaking rate")
    return max(1, round(prompt_frames / prompt_weight * target_weight))
