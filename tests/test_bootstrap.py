"""The paired bootstrap of a corpus-WER difference, on hand-worked examples."""

import numpy as np
import pytest

from arnar.evaluate.bootstrap import paired_bootstrap_wer_difference, resampled_differences


def test_identical_systems_differ_by_nothing_on_every_resample():
    errors, words = [1, 0, 3, 2], [10, 8, 12, 9]
    assert paired_bootstrap_wer_difference(errors, words, errors, words) == (0.0, 0.0, 0.0)


def test_a_system_better_on_every_item_has_an_interval_below_zero():
    # A makes one error fewer than B on each of four 10-word items: 4 / 40 against 8 / 40
    words = [10, 10, 10, 10]
    difference, low, high = paired_bootstrap_wer_difference([0, 1, 2, 1], words, [1, 2, 3, 2], words)
    assert difference == pytest.approx(10.0 - 20.0)
    # on every resample A has exactly 10 points fewer (one error fewer per 10 words): no spread
    assert low == pytest.approx(-10.0) and high == pytest.approx(-10.0)
    # unequal gains: still below zero whatever the resample
    difference, low, high = paired_bootstrap_wer_difference([0, 0, 2, 1], words, [5, 1, 3, 9], words)
    assert difference == pytest.approx(7.5 - 45.0)
    assert low <= difference <= high < 0


def test_two_items_every_resample_enumerated():
    """Item 1: 10 words, A 1 error, B 4; item 2: 5 words, A 2 errors, B 0. A resample of two items
    is one of four index pairs, each with probability 1/4:
        (1, 1): A 2/20 = 10 %,  B 8/20 = 40 %  -> -30
        (2, 2): A 4/10 = 40 %,  B 0/10 = 0 %   -> +40
        (1, 2) or (2, 1): A 3/15 = 20 %, B 4/15 = 26.67 % -> -6.67 (probability 1/2)
    The 2.5th percentile of 2000 draws falls among the ~500 draws of -30 and the 97.5th among the
    ~500 of +40, so the interval is [-30, +40]; the difference on the items as given is -6.67."""
    args = ([1, 2], [10, 5], [4, 0], [10, 5])
    draws = resampled_differences(*args)
    outcomes = {-30.0: 0.25, 40.0: 0.25, 100 * (3 / 15 - 4 / 15): 0.5}
    matched = np.isclose(draws[:, None], np.array(list(outcomes))[None, :])
    assert matched.any(axis=1).all()  # pairing: A and B never draw different items (that would give 9 outcomes)
    assert matched.mean(axis=0) == pytest.approx(list(outcomes.values()), abs=0.04)
    difference, low, high = paired_bootstrap_wer_difference(*args)
    assert difference == pytest.approx(-20 / 3)
    assert low == pytest.approx(-30.0) and high == pytest.approx(40.0)


def test_seed_makes_the_interval_reproducible():
    rng = np.random.default_rng(5)
    words = rng.integers(5, 20, size=30)
    errors_a, errors_b = rng.integers(0, 6, size=30), rng.integers(0, 6, size=30)
    first = paired_bootstrap_wer_difference(errors_a, words, errors_b, words, seed=3)
    assert paired_bootstrap_wer_difference(errors_a, words, errors_b, words, seed=3) == first
    other = paired_bootstrap_wer_difference(errors_a, words, errors_b, words, seed=4)
    assert other[0] == first[0] and other[1:] != first[1:]  # another draw of items, the same difference


def test_mismatched_lengths_and_bad_input_say_what_is_wrong():
    with pytest.raises(ValueError, match=r"one entry per item for both systems.*errors_a 3 items.*words_b 2 items"):
        paired_bootstrap_wer_difference([1, 2, 3], [5, 5, 5], [1, 2, 3], [5, 5])
    with pytest.raises(ValueError, match="at least one item"):
        paired_bootstrap_wer_difference([], [], [], [])
    with pytest.raises(ValueError, match="words_b: every item needs at least one reference word"):
        paired_bootstrap_wer_difference([1], [5], [1], [0])
    with pytest.raises(ValueError, match="resamples must be at least 1"):
        paired_bootstrap_wer_difference([1], [5], [1], [5], resamples=0)
