"""Forced alignment: the data types every aligner backend shares, and how to load a backend.

An aligner turns (audio, transcript) pairs into word and phone intervals. SyncSpeech (section
2.1) needs, for every text token, where its speech ends; the paper aligns with MFA and converts
the phone alignment to BPE level (``arnar.align.durations``). Backends (``load_aligner``):

``pocketsphinx``  the offline default: CMU PocketSphinx 5's forced-alignment mode with the US
                  English model its wheel ships (:mod:`arnar.align.pocketsphinx_aligner`).
``mfa``           Montreal Forced Aligner, the paper's tool (:mod:`arnar.align.mfa`); needs the
                  ``mfa`` command (conda-forge, ``envs/align.yaml``).
``oracle``        the synthesizer's own timings shipped with the embedded corpus
                  (:mod:`arnar.align.oracle`), to measure the other two against.

Conventions (all backends):

* **Words** are the *spoken tokens* of the text: ``normalize_text(text)``, lower-cased, every
  run of letters/digits with apostrophes *inside* it kept (``Don't!`` -> ``don't``,
  ``sons'`` -> ``sons``), every other character is a separator: punctuation is removed and
  hyphenated compounds are two words (``snow-blinded`` -> ``snow`` ``blinded``). Tokens with no
  letter or digit (``-``, ``&``) are not aligned. :func:`spoken_words` computes it;
  ``durations.word_spans`` applies it word by word to map an alignment back onto the text.
* ``Alignment.words`` lists only spoken words, in text order; silences are the gaps.
* ``Alignment.phones`` are ARPAbet symbols without stress digits (``AH`` not ``AH0``), upper
  case; silence/pause symbols are never listed.
* Times are seconds from the start of the file; intervals are non-overlapping, ordered and lie
  within ``[0, duration]``.
* An aligner never raises for one bad item: it returns :class:`AlignmentFailure` whose
  ``reason`` reads ``"align: <kind> (<details>)"`` with a short, stable kind first (``empty
  text``, ``unreadable audio``, ``no alignment found``, ``not aligned by MFA``, ...), so that a
  caller can quarantine the item and count failures by kind. Whole-backend problems (``mfa``
  missing) raise :class:`AlignerUnavailableError` when the aligner is loaded.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

__all__ = [
    "ALIGNERS",
    "AlignItem",
    "Aligner",
    "AlignerUnavailableError",
    "Alignment",
    "AlignmentFailure",
    "Interval",
    "alignment_from_json",
    "alignment_to_json",
    "check_alignment",
    "failure",
    "items_from_cuts",
    "load_aligner",
    "spoken_words",
    "strip_stress",
    "word_pronunciations",
]

ALIGNERS = ("pocketsphinx", "mfa", "oracle")

# A spoken token: letters/digits (Unicode), with apostrophes allowed between them.
_SPOKEN_TOKEN = re.compile(r"[^\W_]+(?:'[^\W_]+)*", re.UNICODE)
_STRESS = re.compile(r"^([A-Za-z]+)[0-2]$")
TIME_DECIMALS = 4  # JSON times are rounded to 0.1 ms


@dataclass(frozen=True)
class Interval:
    """One word or phone, in seconds."""

    symbol: str
    start: float
    end: float


@dataclass(frozen=True)
class Alignment:
    utt_id: str
    words: list[Interval]  # spoken words only, in order, lower-case; no silence entries
    phones: list[Interval]  # ARPAbet without stress digits; silences/pauses are not listed
    duration: float  # audio duration in seconds


@dataclass(frozen=True)
class AlignItem:
    utt_id: str
    audio_path: Path
    text: str
    oracle: dict | None = None  # the corpus's own timings if any ({"phones": ..., "words": ...})


@dataclass(frozen=True)
class AlignmentFailure:
    utt_id: str
    reason: str  # "align: <kind> (<details>)"


class AlignerUnavailableError(RuntimeError):
    """The backend cannot run on this machine (e.g. the ``mfa`` command is not installed)."""


@runtime_checkable
class Aligner(Protocol):
    name: str  # "pocketsphinx" | "mfa" | "oracle"
    model_id: str  # what aligned (package, version, model), for reports

    def align_batch(
        self, items: Sequence[AlignItem], progress: bool = True
    ) -> list[Alignment | AlignmentFailure]:
        """One result per item, in order; never raises for a single bad item."""
        ...


def load_aligner(name: str, **options: Any) -> Aligner:
    """Build the backend ``name`` (``pocketsphinx`` | ``mfa`` | ``oracle``) with its options."""
    if name == "pocketsphinx":
        from arnar.align.pocketsphinx_aligner import PocketSphinxAligner

        return PocketSphinxAligner(**options)
    if name == "mfa":
        from arnar.align.mfa import MfaAligner

        return MfaAligner(**options)
    if name == "oracle":
        from arnar.align.oracle import OracleAligner

        return OracleAligner(**options)
    raise ValueError(f"unknown aligner {name!r}; choose one of {', '.join(ALIGNERS)}")


# --------------------------------------------------------------------------- text helpers


def spoken_words(text: str) -> list[str]:
    """The words an aligner aligns for ``text`` (see the module docstring).

    >>> spoken_words("Don't -- the snow-blinded sons' café, 42!")
    ["don't", 'the', 'snow', 'blinded', 'sons', 'café', '42']
    """
    from arnar.text.normalize import normalize_text

    return _SPOKEN_TOKEN.findall(normalize_text(text).lower())


def word_pronunciations(words: Iterable[str]) -> list[tuple[str, ...]]:
    """Stress-free ARPAbet phones of each spoken word, from CMUdict through
    :func:`arnar.text.phonemes.analyze_words` (its first pronunciation, or its OOV fallback:
    numbers read out, compounds by parts, spelled letters); ``()`` if it has none."""
    from arnar.text.phonemes import UNK, analyze_words

    out = []
    for word in words:
        phones = tuple(p for w in analyze_words(word) for p in w.phones if p != UNK)
        out.append(phones)
    return out


def strip_stress(phone: str) -> str:
    """``AH0`` -> ``AH``; upper-cases; anything that is not letters + one stress digit is kept."""
    m = _STRESS.match(phone)
    return (m.group(1) if m else phone).upper()


def failure(utt_id: str, kind: str, details: str = "") -> AlignmentFailure:
    """An :class:`AlignmentFailure` with the reason ``"align: <kind> (<details>)"``."""
    details = " ".join(str(details).split())  # one line
    if len(details) > 300:
        details = details[:297] + "..."
    return AlignmentFailure(utt_id, f"align: {kind} ({details})" if details else f"align: {kind}")


def check_alignment(a: Alignment, tolerance: float = 1e-6) -> list[str]:
    """Problems with ``a``'s intervals (empty list if none): each interval has start <= end,
    lies within [0, duration], and each tier is ordered without overlaps."""
    problems = []
    for tier in ("words", "phones"):
        previous = 0.0
        for i, iv in enumerate(getattr(a, tier)):
            if not (iv.start <= iv.end + tolerance):
                problems.append(f"{tier}[{i}] {iv.symbol!r}: start {iv.start} > end {iv.end}")
            if iv.start < -tolerance or iv.end > a.duration + tolerance:
                problems.append(f"{tier}[{i}] {iv.symbol!r} outside [0, {a.duration}]")
            if iv.start < previous - tolerance:
                problems.append(f"{tier}[{i}] {iv.symbol!r} starts before the previous end")
            previous = max(previous, iv.end)
    return problems


# --------------------------------------------------------------------------- serialisation


def _intervals_to_json(intervals: Sequence[Interval]) -> list[list]:
    return [
        [iv.symbol, round(float(iv.start), TIME_DECIMALS), round(float(iv.end), TIME_DECIMALS)]
        for iv in intervals
    ]


def alignment_to_json(a: Alignment) -> dict:
    """``{"utt_id", "duration", "words": [[sym, start, end], ...], "phones": [...]}``, times
    rounded to 0.1 ms."""
    return {
        "utt_id": a.utt_id,
        "duration": round(float(a.duration), TIME_DECIMALS),
        "words": _intervals_to_json(a.words),
        "phones": _intervals_to_json(a.phones),
    }


def alignment_from_json(d: dict) -> Alignment:
    """Inverse of :func:`alignment_to_json`; raises ValueError on a malformed dict."""
    try:
        words = [Interval(str(s), float(b), float(e)) for s, b, e in d["words"]]
        phones = [Interval(str(s), float(b), float(e)) for s, b, e in d["phones"]]
        return Alignment(str(d["utt_id"]), words, phones, float(d["duration"]))
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"not an alignment JSON object ({err!r})") from None


# --------------------------------------------------------------------------- manifests


def items_from_cuts(path: str | Path, root: str | Path | None = None, per_speaker: int | None = None) -> list[AlignItem]:
    """AlignItems from a lhotse cuts JSONL (one single-file mono cut per line, as the data
    phase writes them): the recording's file, the supervision's text and, where the supervision
    carries an alignment (the synthesizer's oracle timings: lhotse AlignmentItems ``[symbol,
    start, duration, score]``), ``oracle = {"phones": [[sym, start, end]...], "words": ...}``.
    Relative audio paths are resolved against ``root`` (default: the current directory).
    ``per_speaker``: keep only the first N cuts of each speaker, in file order (a fixed subset:
    the offline codec's phone labels need about an hour, not the whole of a large corpus)."""
    if per_speaker is not None and per_speaker < 1:
        raise ValueError(f"per_speaker must be at least 1, got {per_speaker}")
    root = Path(root) if root is not None else None
    items = []
    kept: dict[str, int] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.strip():
                continue
            cut = json.loads(line)
            sup = cut["supervisions"][0]
            if per_speaker is not None:
                speaker = str(sup.get("speaker"))
                kept[speaker] = kept.get(speaker, 0) + 1
                if kept[speaker] > per_speaker:
                    continue
            source = Path(cut["recording"]["sources"][0]["source"])
            if root is not None and not source.is_absolute():
                source = root / source
            oracle = None
            ali = sup.get("alignment")
            if ali:
                oracle = {
                    tier: [[s, float(b), round(float(b) + float(d), TIME_DECIMALS)] for s, b, d, *_ in ali.get(key, [])]
                    for tier, key in (("phones", "phone"), ("words", "word"))
                }
            items.append(AlignItem(cut["id"], source, sup.get("text") or "", oracle))
    return items
