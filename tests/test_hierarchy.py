"""Chain-of-Details temporal levels (arnar.codec.hierarchy) on hand-worked sequences."""

from __future__ import annotations

import numpy as np
import pytest

from arnar.codec.hierarchy import decimate, level_factors, level_lengths, level_rates, levels, upsample


def test_factors_lengths_rates():
    assert level_factors(1) == [1]
    assert level_factors(3) == [4, 2, 1]
    assert level_factors(4) == [8, 4, 2, 1]
    assert level_lengths(10, 3) == [3, 5, 10]
    assert level_lengths(12, 3) == [3, 6, 12]
    assert level_lengths(1, 3) == [1, 1, 1]
    assert level_lengths(0, 3) == [0, 0, 0]
    # DAC 44.1 kHz, CoD section IV-A: 21.53 / 43.07 / 86.13 Hz
    assert [round(r, 2) for r in level_rates(44100 / 512, 3)] == [21.53, 43.07, 86.13]
    assert level_rates(25.0, 2) == [12.5, 25.0]
    with pytest.raises(ValueError):
        level_factors(0)
    with pytest.raises(ValueError):
        level_lengths(-1, 3)


def test_levels_hand_worked_t10():
    x = np.array([10, 11, 12, 13, 14, 15, 16, 17, 18, 19])
    l1, l2, l3 = levels(x, 3)
    # first token of every group of 4 / 2; the partial last group [18, 19] keeps 18
    np.testing.assert_array_equal(l1, [10, 14, 18])
    np.testing.assert_array_equal(l2, [10, 12, 14, 16, 18])
    np.testing.assert_array_equal(l3, x)
    assert [len(level) for level in (l1, l2, l3)] == level_lengths(10, 3)


def test_decimate_not_divisible_and_2d():
    x = np.array([5, 6, 7, 8, 9, 1, 2])  # T = 7
    np.testing.assert_array_equal(decimate(x, 4), [5, 9])
    np.testing.assert_array_equal(decimate(x, 2), [5, 7, 9, 2])
    np.testing.assert_array_equal(decimate(x, 1), x)
    np.testing.assert_array_equal(decimate(x, 8), [5])
    codes = np.arange(14).reshape(2, 7)  # [n_q, T]: time is the last axis
    np.testing.assert_array_equal(decimate(codes, 3), [[0, 3, 6], [7, 10, 13]])
    # codes [n_q, T] give the first quantizer's levels
    lv = levels(codes, 2)
    np.testing.assert_array_equal(lv[0], [0, 2, 4, 6])
    np.testing.assert_array_equal(lv[1], codes[0])
    assert decimate(np.array([], dtype=np.int64), 4).shape == (0,)
    with pytest.raises(ValueError):
        decimate(x, 0)


def test_upsample_hand_worked():
    c = np.array([3, 1, 4])
    np.testing.assert_array_equal(upsample(c, 4, 10), [3, 3, 3, 3, 1, 1, 1, 1, 4, 4])  # trimmed
    np.testing.assert_array_equal(upsample(c, 2, 6), [3, 3, 1, 1, 4, 4])
    np.testing.assert_array_equal(upsample(c, 2, 8), [3, 3, 1, 1, 4, 4, 4, 4])  # padded with last
    np.testing.assert_array_equal(upsample(c, 1, 3), c)
    assert upsample(c, 2, 0).shape == (0,)
    np.testing.assert_array_equal(upsample(np.array([[1, 2], [3, 4]]), 2, 3), [[1, 1, 2], [3, 3, 4]])
    with pytest.raises(ValueError):
        upsample(np.array([], dtype=np.int64), 2, 3)


def test_upsample_decimate_consistency():
    rng = np.random.default_rng(0)
    for T in range(1, 40):
        x = rng.integers(0, 1024, T)
        for k in (1, 2, 4, 8):
            coarse = decimate(x, k)
            assert len(coarse) == -(-T // k)
            up = upsample(coarse, k, T)
            assert len(up) == T
            # the conditioning sequence agrees with the fine tokens at every kept frame ...
            np.testing.assert_array_equal(up[::k], x[::k])
            # ... and frame j carries the token of its group's first frame
            np.testing.assert_array_equal(up, x[(np.arange(T) // k) * k])
            # decimating the stretched sequence gives the coarse level back
            np.testing.assert_array_equal(decimate(up, k), coarse)
        # levels nest: each level is the next finer one decimated by 2
        lv = levels(x, 4)
        for coarse, fine in zip(lv, lv[1:]):
            np.testing.assert_array_equal(coarse, decimate(fine, 2))
        np.testing.assert_array_equal(decimate(decimate(x, 2), 2), decimate(x, 4))
        assert [len(level) for level in lv] == level_lengths(T, 4)
