"""How much a WER difference between two systems depends on which test items were drawn.

The spread over synthesis seeds says how much a system's WER moves when it speaks the same text
again; it says nothing about the test list itself. A handful of hard sentences can decide a
comparison on a small list, so a claim "A beats B" also needs the difference to survive a
different draw of items. The paired bootstrap (Koehn 2004, "Statistical significance tests for
machine translation evaluation") estimates that: resample the test items with replacement, the
*same* resampled items for both systems (pairing removes the item-to-item variation both systems
share), recompute each system's corpus WER on the resample, and read the 2.5th and 97.5th
percentiles of the difference.

Every number is corpus WER (total errors over total reference words, in percent), the convention
the claims compare (``wer_corpus`` in :mod:`arnar.evaluate.metrics`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def _as_items(name: str, values: Sequence[float]) -> np.ndarray:
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1:
        raise ValueError(f"{name} must be one number per item, got an array of shape {array.shape}")
    return array


def resampled_differences(errors_a: Sequence[float], words_a: Sequence[float], errors_b: Sequence[float],
                          words_b: Sequence[float], *, resamples: int = 2000, seed: int = 0) -> np.ndarray:
    """The corpus-WER difference A minus B (percentage points) on each of ``resamples`` paired
    resamples of the items; see :func:`paired_bootstrap_wer_difference` for the arguments."""
    arrays = {name: _as_items(name, values) for name, values in
              (("errors_a", errors_a), ("words_a", words_a), ("errors_b", errors_b), ("words_b", words_b))}
    lengths = {name: len(array) for name, array in arrays.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError("a paired bootstrap needs one entry per item for both systems, got "
                         + ", ".join(f"{name} {n} items" for name, n in lengths.items()))
    items = lengths["errors_a"]
    if items == 0:
        raise ValueError("a paired bootstrap needs at least one item")
    if resamples < 1:
        raise ValueError(f"resamples must be at least 1, got {resamples}")
    for name in ("words_a", "words_b"):
        if (arrays[name] <= 0).any():
            # word_errors refuses a reference without words, so every item has at least one
            raise ValueError(f"{name}: every item needs at least one reference word")
    # one row of item indices per resample, shared by both systems: that is the pairing
    picks = np.random.default_rng(seed).integers(0, items, size=(resamples, items))

    def corpus_wer(errors: np.ndarray, words: np.ndarray) -> np.ndarray:
        return 100.0 * errors[picks].sum(axis=1) / words[picks].sum(axis=1)

    return corpus_wer(arrays["errors_a"], arrays["words_a"]) - corpus_wer(arrays["errors_b"], arrays["words_b"])


def paired_bootstrap_wer_difference(errors_a: Sequence[float], words_a: Sequence[float], errors_b: Sequence[float],
                                    words_b: Sequence[float], *, resamples: int = 2000,
                                    seed: int = 0) -> tuple[float, float, float]:
    """``(difference, low, high)``: corpus WER of A minus corpus WER of B in percentage points, and
    the 95 % percentile interval of that difference over ``resamples`` paired resamples of the items.

    Each argument holds one entry per test item, in the same item order for both systems: the
    errors (substitutions + deletions + insertions) and the reference words. A system evaluated
    under several synthesis seeds enters with its errors and its reference words each *summed*
    over its seeds, so that an item is one unit of the resampling (its seeds move together) and
    the corpus WER of the sums is the mean of the seeds' corpus WERs (every seed has the same
    reference words). A and B may have different numbers of seeds. The difference is computed on
    the items as given, not on a resample; the resampling is deterministic for a ``seed``.
    """
    draws = resampled_differences(errors_a, words_a, errors_b, words_b, resamples=resamples, seed=seed)
    errors_a, words_a = np.asarray(errors_a, dtype=np.float64), np.asarray(words_a, dtype=np.float64)
    errors_b, words_b = np.asarray(errors_b, dtype=np.float64), np.asarray(words_b, dtype=np.float64)
    difference = 100.0 * (errors_a.sum() / words_a.sum() - errors_b.sum() / words_b.sum())
    low, high = np.percentile(draws, [2.5, 97.5])
    return float(difference), float(low), float(high)
