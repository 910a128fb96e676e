"""Moonshine's encoder as the offline codec's front end (arnar.codec.moonshine_frontend)."""

from __future__ import annotations

import numpy as np
import pytest

from arnar.codec.moonshine_frontend import FIRST_CENTRE, HOP, MIN_SAMPLES, MoonshineFrontend, output_frames


@pytest.fixture(scope="module")
def frontend() -> MoonshineFrontend:
    return MoonshineFrontend(threads=1)


def test_output_frames_is_the_graphs_own_shape(frontend):
    rng = np.random.default_rng(0)
    for n in (MIN_SAMPLES, 16_000, 16_001, 23_456, 48_000):
        states = frontend.states((0.1 * rng.standard_normal(n)).astype(np.float32))
        assert states.shape == (output_frames(n), 416)
    # hand-worked: 16000 samples -> floor(floor(floor(250 - 1.984)/3)/2) - 1 = floor(floor(82.67)/2) - 1 = 40
    assert output_frames(16_000) == 40


def test_features_interpolate_the_states_at_frame_centres(frontend, monkeypatch):
    """With states that count their own index (state j = j), the feature of codec frame k is
    the encoder position of its centre, ((k + 1/2) * spf - 447) / 384, clipped at 0."""
    seen = {}

    def counting_states(padded):
        seen["n"] = padded.size
        j = np.arange(output_frames(padded.size), dtype=np.float32)
        return np.repeat(j[:, None], 3, axis=1)

    monkeypatch.setattr(frontend, "states", counting_states)
    clip = np.zeros(12_800, np.float32)  # 0.8 s = 20 frames of 640 samples
    out = frontend.features(clip, 20, 640)
    expected = np.clip(((np.arange(20) + 0.5) * 640 - FIRST_CENTRE) / HOP, 0, None)
    # frame 0: centre 320 < 447 -> 0; frame 1: (960 - 447) / 384 = 1.3359; frame 19: (12480 - 447) / 384 = 31.336
    assert out.shape == (20, 3)
    np.testing.assert_allclose(out[:, 0], expected, atol=1e-5)
    assert out[1, 0] == pytest.approx(513 / 384, abs=1e-5)
    # the clip was padded until the last centre lies inside the encoder's output
    assert (output_frames(seen["n"]) - 1) * HOP + FIRST_CENTRE >= 19.5 * 640


def test_features_are_deterministic_and_cover_short_clips(frontend):
    rng = np.random.default_rng(1)
    clip = (0.1 * rng.standard_normal(7_000)).astype(np.float32)
    first = frontend.features(clip, 11, 640)
    assert first.shape == (11, 416) and first.dtype == np.float32
    np.testing.assert_array_equal(first, frontend.features(clip, 11, 640))
    assert frontend.features(clip[:50], 1, 640).shape == (1, 416)
    assert frontend.features(clip, 0, 640).shape == (0, 416)
    assert len(frontend.model_sha256) == 64


def test_missing_model_is_named(tmp_path):
    from arnar.codec.moonshine_frontend import FrontendError

    with pytest.raises(FrontendError, match="encoder_model.ort"):
        MoonshineFrontend(tmp_path)
