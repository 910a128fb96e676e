"""Aligner-vs-oracle boundary errors on hand-worked alignments."""

import pytest

from arnar.align.accuracy import phone_boundary_errors, score_aligner, summarize, word_boundary_errors
from arnar.align.base import Alignment, Interval


def _alignment(words, phones=()):
    return Alignment("u", [Interval(*w) for w in words], [Interval(*p) for p in phones], 2.0)


def test_word_boundary_errors_by_position():
    oracle = _alignment([("a", 0.10, 0.50), ("b", 0.60, 1.00)])
    aligned = _alignment([("a", 0.11, 0.48), ("b", 0.60, 1.05)])
    # |0.11-0.10|, |0.48-0.50|, |0.60-0.60|, |1.05-1.00| = 10, 20, 0, 50 ms
    assert word_boundary_errors(aligned, oracle) == pytest.approx([10, 20, 0, 50])
    assert word_boundary_errors(_alignment([("x", 0, 1)]), oracle) is None  # other words


def test_phone_boundaries_use_the_nearest_aligner_boundary():
    oracle = _alignment([], [("AX", 0.10, 0.20), ("B", 0.20, 0.35)])
    aligned = _alignment([], [("AH", 0.12, 0.21), ("B", 0.21, 0.30)])
    # oracle boundaries 0.10, 0.20, 0.20, 0.35 vs aligner {0.12, 0.21, 0.30}: 20, 10, 10, 50 ms
    assert phone_boundary_errors(aligned, oracle) == pytest.approx([20, 10, 10, 50])


def test_summary_and_groups():
    assert summarize([10, 20, 30, 40]) == {"boundaries": 4, "mean_ms": 25.0, "median_ms": 25.0, "within_20ms": 0.5}
    assert summarize([])["mean_ms"] is None
    oracle = _alignment([("a", 0.10, 0.50)])
    pairs = [("v1", _alignment([("a", 0.11, 0.50)]), oracle), ("v2", _alignment([("b", 0, 1)]), oracle)]
    result = score_aligner(pairs, failures={"v2": 3})
    assert list(result) == ["v1", "v2", "overall"]
    assert result["v1"]["word"]["boundaries"] == 2 and result["v1"]["word"]["mean_ms"] == pytest.approx(5.0)
    assert result["v2"]["word_sequence_differs"] == 1 and result["v2"]["failed"] == 3
    assert result["overall"]["aligned"] == 2 and result["overall"]["failed"] == 3
