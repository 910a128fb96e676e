"""Metric math of the evaluation protocol (docs/design.md section 7), frozen in code.

Text normalisation for WER (applied to reference and hypothesis alike):
  1. Unicode NFKC, lower-case;
  2. numbers become words: "42" -> "forty two", "3.5" -> "three point five", "1,000" -> "one
     thousand", ordinals "21st" -> "twenty first", "007" -> "zero zero seven" (synthesizers and
     TTS front ends speak digits as words, so the reference must read as spoken); digits inside
     a word ("mp3", "1990s") are left as written;
  3. hyphens, dashes, slashes become spaces ("well-known" -> "well known"), since ASR systems
     split or join compounds arbitrarily;
  4. every other punctuation mark is removed, except an apostrophe inside a word ("don't",
     "speech's" stay as they are);
  5. whitespace collapsed.

WER (jiwer word alignment on normalised text), reported under two names:
  - ``wer_utterance_mean``: the mean over utterances of (S + D + I) / N_ref (Seed-TTS convention);
  - ``wer_corpus``: total (S + D + I) over total N_ref (PALLE convention).
An empty hypothesis is N_ref deletions (WER 1); insertions can push an utterance above 1.

Speed (SyncSpeech 3.1, Eq. 7), all of the text-to-token stage ("due to the off-the-shelf speech
decoder, we evaluate the latency and efficiency of the text-to-token stage across all models"):
  - RTF = generation time / duration of the generated audio (lower is faster); reported for the
    token stage and end to end separately by the caller;
  - FPL-A = time until the first ``chunk_size`` speech tokens exist, text fully available. The
    codec's decoding of that first packet is not part of it; it is measured and reported on its
    own (``first_packet_decode``);
  - FPL-L = Eq. 7, ``(q + 1) d_LLM + c d_TTS`` for SyncSpeech: the ``q + 1`` text tokens it waits
    for before its first pass, at d_LLM = 25 ms a token (Qwen-7B on an A800, as the paper
    assumes), plus ``c`` passes of ``d_TTS`` seconds to the first packet, which is FPL-A
    (``d_TTS = FPL-A / c``). "The FPL-L for other baseline models is calculated in a similar
    manner": the text tokens each must have before its decoding can start times d_LLM, plus its
    FPL-A; a model that needs the whole text (AR, NAR, PALLE, DELTA, CoD here) waits for all ``L``.
    The count is the timing record's ``text_tokens_to_start``; :func:`fpl_l` computes the sum,
    :func:`syncspeech_fpl_l` is Eq. 7 verbatim. Eq. 7 counts no text waited for after decoding
    started: the later tokens arrive while it decodes (exact when d_LLM <= d_TTS);
  - FPL-L waited (``fpl_l_waited``): the text tokens read by the time the first packet was
    complete (``text_tokens_waited``) times d_LLM, plus FPL-A, as if none of that text arrived
    while decoding: an upper bound for SyncSpeech, which reads ``y_{n+q}`` before the pass for
    ``y_n``; the same as FPL-L for a model that waits for the whole text.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

import jiwer
import numpy as np
import torch

from arnar.text.phonemes import int_to_words

D_LLM_SECONDS = 0.025  # SyncSpeech 3.1: Qwen-7B average token time on one A800

# --- text normalisation ----------------------------------------------------------------------

_ORDINAL_WORDS = {
    "one": "first", "two": "second", "three": "third", "five": "fifth", "eight": "eighth",
    "nine": "ninth", "twelve": "twelfth",
}
_NUMBER = re.compile(r"(?<![\w.])(\d{1,3}(?:,\d{3})+|\d+)(?:\.(\d+))?(st|nd|rd|th)?(?![\w])")
_SEPARATORS = re.compile(r"[-\u2010-\u2015/]+")
_NOT_WORD = re.compile(r"[^\w\s']+")
_STRAY_APOSTROPHE = re.compile(r"(?<!\w)'|'(?!\w)")


def _ordinal(words: list[str]) -> list[str]:
    last = words[-1]
    if last in _ORDINAL_WORDS:
        return words[:-1] + [_ORDINAL_WORDS[last]]
    if last.endswith("y"):
        return words[:-1] + [last[:-1] + "ieth"]
    return words[:-1] + [last + "th"]


def _spell_number(match: re.Match) -> str:
    integer, decimals, suffix = match.group(1), match.group(2), match.group(3)
    digits = integer.replace(",", "")
    # "007" is read digit by digit, and so is a number past the cardinals (a recogniser's
    # transcript of babble can be "7777...", 50 digits long)
    if (len(integer) > 1 and integer.startswith("0")) or len(digits) > 15:
        words = [int_to_words(int(d))[0] for d in digits]
    else:
        words = int_to_words(int(integer.replace(",", "")))
    if suffix and not decimals:
        words = _ordinal(words)
    if decimals:
        words = words + ["point"] + [int_to_words(int(d))[0] for d in decimals]
    return " " + " ".join(words) + " "


def normalize_for_wer(text: str) -> str:
    """The normalisation both sides of every WER go through (see the module docstring)."""
    text = unicodedata.normalize("NFKC", text).lower()
    text = text.replace("\u2019", "'").replace("\u2018", "'")
    text = _NUMBER.sub(_spell_number, text)
    text = _SEPARATORS.sub(" ", text)
    text = _NOT_WORD.sub(" ", text.replace("_", " "))
    text = _STRAY_APOSTROPHE.sub(" ", text)
    return " ".join(text.split())


# --- word error rate ---------------------------------------------------------------------------


@dataclass(frozen=True)
class WordErrors:
    """Alignment counts of one utterance (normalised text)."""

    ref_words: int
    substitutions: int
    deletions: int
    insertions: int

    @property
    def errors(self) -> int:
        return self.substitutions + self.deletions + self.insertions

    @property
    def wer(self) -> float:
        return self.errors / self.ref_words


def word_errors(reference: str, hypothesis: str) -> WordErrors:
    """Count S, D, I between normalised ``reference`` and ``hypothesis``."""
    ref, hyp = normalize_for_wer(reference), normalize_for_wer(hypothesis)
    if not ref:
        raise ValueError(f"reference {reference!r} has no words after normalisation; WER is undefined")
    if not hyp:  # jiwer needs a non-empty string to align; an empty output deletes every word
        return WordErrors(len(ref.split()), 0, len(ref.split()), 0)
    out = jiwer.process_words(ref, hyp)
    return WordErrors(len(ref.split()), out.substitutions, out.deletions, out.insertions)


def summarize_wer(per_utterance: Sequence[WordErrors]) -> dict[str, float]:
    """Both WER conventions, in percent, with the totals they come from."""
    if not per_utterance:
        raise ValueError("no utterances to summarise")
    errors = sum(u.errors for u in per_utterance)
    words = sum(u.ref_words for u in per_utterance)
    return {
        "wer_utterance_mean": 100.0 * float(np.mean([u.wer for u in per_utterance])),
        "wer_corpus": 100.0 * errors / words,
        "utterances": len(per_utterance),
        "ref_words": words,
        "substitutions": sum(u.substitutions for u in per_utterance),
        "deletions": sum(u.deletions for u in per_utterance),
        "insertions": sum(u.insertions for u in per_utterance),
    }


# --- speaker similarity --------------------------------------------------------------------------


def verification_separation(same: Sequence[float], different: Sequence[float]) -> dict[str, float]:
    """How well scores separate same-speaker from different-speaker pairs.

    ``auc``: probability that a random same-speaker pair scores above a random different-speaker
    pair (ties count one half; the Mann-Whitney statistic). ``eer``: the equal error rate, where
    the false-acceptance and false-rejection rates cross over all thresholds (their mean at the
    threshold where they are closest).
    """
    same, different = np.asarray(same, dtype=np.float64), np.asarray(different, dtype=np.float64)
    if same.size == 0 or different.size == 0:
        raise ValueError("need at least one same-speaker and one different-speaker score")
    greater = (same[:, None] > different[None, :]).sum()
    ties = (same[:, None] == different[None, :]).sum()
    auc = (greater + 0.5 * ties) / (same.size * different.size)
    best = (math.inf, 0.0)
    for threshold in np.unique(np.concatenate([same, different, [np.inf]])):
        false_reject = float(np.mean(same < threshold))
        false_accept = float(np.mean(different >= threshold))
        gap = abs(false_reject - false_accept)
        if gap < best[0]:
            best = (gap, (false_reject + false_accept) / 2)
    return {
        "auc": float(auc),
        "eer": best[1],
        "same_mean": float(same.mean()),
        "different_mean": float(different.mean()),
        "same_pairs": int(same.size),
        "different_pairs": int(different.size),
    }


# --- speed ----------------------------------------------------------------------------------------


def real_time_factor(generation_seconds: float, audio_seconds: float) -> float:
    """RTF = generation time / generated audio duration (PALLE, DELTA; < 1 is faster than real time)."""
    if audio_seconds <= 0:
        raise ValueError(f"audio duration must be positive, got {audio_seconds}")
    return generation_seconds / audio_seconds


def fpl_l(fpl_a_seconds: float, text_tokens_waited: int, d_llm: float = D_LLM_SECONDS) -> float:
    """First-packet latency behind a streaming LLM: ``text_tokens_waited`` tokens at ``d_llm``
    each, then FPL-A (SyncSpeech 3.1). With the tokens needed before decoding starts
    (``text_tokens_to_start``) this is FPL-L as Eq. 7 counts it; with those read by the time the
    first packet was complete it is the waited-tokens figure (module docstring)."""
    if text_tokens_waited < 0:
        raise ValueError("text_tokens_waited must be >= 0")
    return text_tokens_waited * d_llm + fpl_a_seconds


def syncspeech_fpl_l(q: int, c: int, d_tts: float, d_llm: float = D_LLM_SECONDS) -> float:
    """Eq. 7: L = (q + 1) * d_LLM + c * d_TTS (q look-ahead tokens, c decoding iterations until
    the generated speech tokens exceed the decoder's chunk size, d_TTS seconds per iteration)."""
    return fpl_l(c * d_tts, q + 1, d_llm)


def iterations_to_first_chunk(tokens_per_iteration: Iterable[int], chunk_size: int) -> int:
    """c of Eq. 7: decoding iterations until the cumulative speech tokens reach ``chunk_size``."""
    total = 0
    for iteration, produced in enumerate(tokens_per_iteration, start=1):
        total += produced
        if total >= chunk_size:
            return iteration
    raise ValueError(f"the decoding produced {total} tokens, never reaching the chunk size {chunk_size}")


class ForwardPassCounter:
    """Counts the top-level forward calls of a module: the sequential passes a decoding loop makes.

    Use as a context manager around a decoding call::

        with ForwardPassCounter(model) as passes:
            generate(model, ...)
        passes.count
    """

    def __init__(self, module: torch.nn.Module):
        self.module = module
        self.count = 0
        self._handle = None

    def _hook(self, _module, _inputs):
        self.count += 1

    def __enter__(self) -> "ForwardPassCounter":
        self.count = 0
        self._handle = self.module.register_forward_pre_hook(self._hook)
        return self

    def __exit__(self, *exc) -> None:
        self._handle.remove()


def as_dict(errors: WordErrors) -> dict:
    return dict(asdict(errors), errors=errors.errors, wer=errors.wer)
