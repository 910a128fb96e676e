"""The "oracle" aligner: the synthesizer's own timings that the embedded corpus ships.

The corpus builder (``arnar.corpus.synth``) keeps, next to each utterance, the phone and word
timings the synthesizer itself used (festival's segment/word relations, flite's ``-psdur``),
as ``{"phones": [[sym, start, end], ...], "words": [[word, start, end], ...]}`` in seconds; the
manifests carry the same as lhotse alignments (``items_from_cuts`` turns them back into this
dict). They are exact by construction, so they are the reference the real aligners are
measured against, and an alignment in their own right for the embedded corpus.

Conversion to an :class:`~arnar.align.base.Alignment`:

* **Phones**: festival and flite emit lower-case ARPAbet-like symbols (``ax``, ``dh``, ...;
  festival's diphone voices and flite both use the CMU phone set with ``ax`` for schwa) and
  ``pau`` for pauses. Pause/silence symbols (``pau``, ``sil``, ``h#``, ``ssil``, ``#``, ``sp``,
  ``spn``, ``brth``, ``_``) are dropped, stress digits are stripped (none are emitted here, but
  other voices/lexicons may) and symbols are upper-cased. ``AX`` is kept: it is the
  synthesizer's symbol, not CMUdict's (``AH``); phone scoring is by boundary, not by label.
* **Words** are lower-cased and split into spoken tokens as every aligner names them
  (:func:`arnar.align.base.spoken_words`: ``sons'`` -> ``sons``, ``snow-blinded`` -> ``snow``
  ``blinded``). A compound's interval is divided between its parts at a phone boundary: the
  oracle phones inside the word are shared in proportion to each part's CMUdict phone count
  (exact when the synthesizer's phones match CMUdict's, the usual case). Words with nothing
  spoken (punctuation only) are dropped.
* **Duration**: the audio file's length (``soundfile.info``), else the last oracle time.

An item without oracle timings gives ``AlignmentFailure("align: no oracle timings (...)")``,
malformed timings ``"align: bad oracle timings (...)"``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from arnar.align.base import (
    AlignItem,
    Alignment,
    AlignmentFailure,
    Interval,
    failure,
    spoken_words,
    strip_stress,
    word_pronunciations,
)

PAUSE_SYMBOLS = frozenset({"pau", "sil", "h#", "ssil", "#", "sp", "spn", "brth", "_", ""})
_EPS = 1e-6
_MAX_OVERLAP = 1e-3


class OracleAligner:
    """Returns the corpus's own timings (see the module docstring). No options."""

    name = "oracle"
    model_id = "oracle:synthesizer-timings"

    def __init__(self, **options: Any):
        if options:
            raise ValueError(f"the oracle aligner takes no options (got {sorted(options)})")

    def align_batch(
        self, items: Sequence[AlignItem], progress: bool = True
    ) -> list[Alignment | AlignmentFailure]:
        return [self.align_item(item) for item in items]

    def align_item(self, item: AlignItem) -> Alignment | AlignmentFailure:
        if not item.oracle or not item.oracle.get("words"):
            return failure(item.utt_id, "no oracle timings", f"{item.audio_path}")
        try:
            return oracle_alignment(item.utt_id, item.oracle, _audio_duration(item))
        except (TypeError, ValueError, KeyError) as err:
            return failure(item.utt_id, "bad oracle timings", repr(err))


def _audio_duration(item: AlignItem) -> float | None:
    try:
        import soundfile as sf

        info = sf.info(str(item.audio_path))
        return info.frames / info.samplerate
    except Exception:  # a missing/unreadable file: fall back to the timings
        return None


def oracle_alignment(utt_id: str, oracle: dict, duration: float | None = None) -> Alignment:
    """An Alignment from ``{"phones": [[sym, start, end]...], "words": [[word, start, end]...]}``."""
    raw_phones = [(str(s), float(b), float(e)) for s, b, e in oracle.get("phones") or []]
    raw_words = [(str(w), float(b), float(e)) for w, b, e in oracle["words"]]
    for sym, b, e in raw_phones + raw_words:
        if not e + _EPS >= b >= -_EPS:
            raise ValueError(f"interval {sym!r} [{b}, {e}]")
    if duration is None:
        duration = max([e for _, _, e in raw_phones + raw_words], default=0.0)
    phones = _tidy([
        Interval(strip_stress(s), b, e)
        for s, b, e in raw_phones
        if s.lower() not in PAUSE_SYMBOLS
    ])
    words: list[Interval] = []
    for word, b, e in raw_words:
        parts = spoken_words(word)
        if len(parts) == 1:
            words.append(Interval(parts[0], b, e))
        elif parts:
            inside = [p for p in phones if p.start >= b - _EPS and p.end <= e + _EPS]
            words.extend(_split_compound(parts, b, e, inside))
    return Alignment(utt_id, _tidy(words), phones, float(duration))


def _tidy(intervals: list[Interval]) -> list[Interval]:
    """Remove the tiny overlaps that rounding leaves (the manifests store start and duration,
    each rounded to 0.1 ms): an interval that ends up to ``_MAX_OVERLAP`` after the next one
    starts is cut there. Larger overlaps are left for the caller's checks to find."""
    out = list(intervals)
    for i in range(len(out) - 1):
        a, b = out[i], out[i + 1]
        if b.start < a.end <= b.start + _MAX_OVERLAP:
            out[i] = Interval(a.symbol, a.start, max(a.start, b.start))
    return out


def _split_compound(
    parts: list[str], start: float, end: float, phones: list[Interval]
) -> list[Interval]:
    """Divide [start, end] among ``parts`` at phone boundaries, by their CMUdict phone counts."""
    expected = [max(1, len(p)) for p in word_pronunciations(parts)]
    total = sum(expected)
    n = len(phones)
    cuts = []  # boundary times between consecutive parts
    if n >= len(parts):
        previous, cumulative = 0, 0
        for k, count in enumerate(expected[:-1]):
            cumulative += count
            index = round(cumulative / total * n)
            index = min(max(index, previous + 1), n - (len(parts) - 1 - k))
            cuts.append(phones[index].start)
            previous = index
    else:  # fewer phones than parts: share the time instead
        cumulative = 0
        for count in expected[:-1]:
            cumulative += count
            cuts.append(start + (end - start) * cumulative / total)
    bounds = [start, *cuts, end]
    return [Interval(p, bounds[i], bounds[i + 1]) for i, p in enumerate(parts)]
