"""Forced aligners (pocketsphinx offline default, MFA, the corpus's oracle timings) and the
conversion of their intervals to BPE-level durations; see :mod:`arnar.align.base`."""

from arnar.align.base import (
    ALIGNERS,
    AlignItem,
    Aligner,
    AlignerUnavailableError,
    Alignment,
    AlignmentFailure,
    Interval,
    alignment_from_json,
    alignment_to_json,
    check_alignment,
    items_from_cuts,
    load_aligner,
    spoken_words,
)

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
    "items_from_cuts",
    "load_aligner",
    "spoken_words",
]
