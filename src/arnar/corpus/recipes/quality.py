"""Recording quality for the Chain-of-Details MLS filter: SNR and C50 per utterance.

CoD (Chain-of-Details, arXiv:2604.19330, Sec. IV-C) keeps the MLS English utterances with SNR > 55 dB and
C50 > 55 as estimated by Brouhaha (Lavechin et al., 2023), a pyannote model that predicts, per
~17 ms frame, speech activity, the speech-to-noise ratio and the C50 of the room. Two
estimators give those two numbers here:

``brouhaha`` (:class:`BrouhahaEstimator`)
    The real model: ``pyannote.audio`` + the ``brouhaha`` package
    (github.com/marianne-m/brouhaha-vad) and its checkpoint (hub id ``ylacombe/brouhaha-best``,
    file ``best.ckpt``, or a local path). An utterance's SNR and C50 are the means of the
    per-frame predictions over the frames the model marks as speech (all frames if none are).

``offline`` (:class:`OfflineEstimator`)
    A signal-processing estimate that needs no weights, for machines without Brouhaha. It
    measures different things than the learned model and is *not calibrated to it*:

    - SNR: frames of 20 ms (hop 10 ms); the noise power is the mean power of the quietest 10 %
      of frames; speech frames are those at least 6 dB above it; SNR = 10 log10((P_speech -
      P_noise) / P_noise), i.e. the ratio of the speech power (noise removed) over active
      frames to the noise power. It assumes the utterance has pauses (read speech has them);
      without any, the noise floor is overestimated and the SNR reads low. Digital silence
      (no noise at all) reads :data:`SNR_CAP`.
    - C50 (a proxy): C50 is the early-to-late energy ratio of the room impulse response,
      10 log10(E[0, 50 ms] / E[50 ms, inf)). When a steady sound stops abruptly, the level
      50 ms later relative to the level before the stop equals E[50 ms, inf) / E[0, inf), so
      C50 = 10 log10(10^(drop/10) - 1) where ``drop`` is that level drop in dB. The estimator
      takes the envelope (16 ms frames, 2 ms hop), measures the drop from every frame still at
      its sound's steady level to the frame centred 50 ms after its end, and uses the median of
      the three largest drops at distinct offsets (at least 100 ms apart): speech offsets are
      not perfectly abrupt, so a drop underestimates the room's, and the largest are the
      closest to it. Choosing the largest also picks up the random fluctuation of the tail: on
      broadband bursts through exponential-decay rooms the reading lies 0-4 dB above the true
      C50 (tests/test_recipes.py), on strongly periodic sounds more. The reading cannot exceed
      the recording's SNR (the drop ends in the noise floor), and it is capped at
      :data:`C50_CAP`.

    Differences from Brouhaha: Brouhaha regresses SNR and C50 from learned features and was
    trained on simulated mixtures with C50 labels in a bounded range; it works without pauses
    and separates noise from reverberation. The offline SNR needs pauses; the offline C50
    needs sharp offsets and is bounded by the SNR. The thresholds in params.yaml
    (``corpus.mls.min_snr``/``min_c50``) are CoD's values on Brouhaha's scale; with the offline
    estimator they select clean, dry recordings by its own measure, and the quality table
    records which estimator produced every number.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from arnar.corpus.manifests import CorpusError

log = logging.getLogger(__name__)

SNR_CAP = 100.0  # dB; a recording with digitally silent pauses has no measurable noise
C50_CAP = 60.0   # dB; beyond this, under a millionth of the energy arrives late: dry
DEFAULT_BROUHAHA_MODEL = "ylacombe/brouhaha-best"


class QualityUnavailableError(CorpusError):
    """The requested estimator cannot run here (package or weights missing)."""


@dataclass(frozen=True)
class Quality:
    snr: float
    c50: float


def _frame_power(audio: np.ndarray, frame: int, hop: int) -> np.ndarray:
    """Mean square of each frame (frames that fit entirely)."""
    if len(audio) < frame:
        audio = np.pad(audio, (0, frame - len(audio)))
    frames = np.lib.stride_tricks.sliding_window_view(audio.astype(np.float64), frame)[::hop]
    return np.mean(frames**2, axis=1)


def estimate_snr(audio: np.ndarray, sample_rate: int) -> float:
    """Speech-to-noise ratio in dB from frame powers (see the module docstring)."""
    power = _frame_power(audio, int(0.020 * sample_rate), int(0.010 * sample_rate))
    quiet = np.sort(power)[: max(1, len(power) // 10)]
    noise = float(np.mean(quiet))
    if noise <= 0.0:
        return SNR_CAP
    active = power[power >= noise * 10 ** (6 / 10)]
    if active.size == 0:
        return 0.0  # nothing stands out of the noise
    speech = float(np.mean(active)) - noise
    return float(min(SNR_CAP, 10 * np.log10(max(speech, 1e-30) / noise)))


def estimate_c50(audio: np.ndarray, sample_rate: int) -> float:
    """C50 proxy in dB from the level drop 50 ms after the sharpest offsets (see the docstring)."""
    frame_seconds, hop = 0.016, max(1, int(0.002 * sample_rate))
    power = _frame_power(audio, int(frame_seconds * sample_rate), hop)
    level = 10 * np.log10(power + 1e-20)
    # A frame ending at the offset is compared with the frame centred 50 ms after it.
    lag = int(round((0.050 + frame_seconds / 2) * sample_rate / hop))
    if len(level) <= lag:
        raise CorpusError(f"audio of {len(audio) / sample_rate:.3f} s is too short for a C50 estimate")
    drop = level[:-lag] - level[lag:]
    # Only frames still at the sound's steady level count as the start of a drop (within 1 dB of
    # the loudest frame of the preceding 100 ms): inside a decaying tail every 50 ms falls by the
    # same amount, and a frame that has begun to decay would read the drop from a later start.
    back = int(round(0.100 * sample_rate / hop))
    running_max = np.lib.stride_tricks.sliding_window_view(
        np.concatenate([np.full(back, -np.inf), level]), back + 1).max(axis=1)
    candidates = np.where((level >= running_max - 1.0)[: len(drop)], drop, -np.inf)
    # the largest drops at distinct offsets: greedy, at least 100 ms apart
    spacing = back
    peaks: list[float] = []
    taken = np.zeros(len(candidates), dtype=bool)
    for index in np.argsort(candidates)[::-1]:
        if not np.isfinite(candidates[index]) or candidates[index] <= 0 or len(peaks) == 3:
            break
        if taken[index]:
            continue
        peaks.append(float(candidates[index]))
        taken[max(0, index - spacing): index + spacing + 1] = True
    if not peaks:
        return -C50_CAP  # the level never falls: no offset to read the room from
    drop_db = float(np.median(peaks))
    c50 = 10 * np.log10(max(10 ** (drop_db / 10) - 1.0, 1e-30))
    return float(np.clip(c50, -C50_CAP, C50_CAP))


class OfflineEstimator:
    """SNR and C50 proxy from the signal alone (no weights)."""

    name = "offline"

    def __call__(self, audio: np.ndarray, sample_rate: int) -> Quality:
        audio = np.asarray(audio, dtype=np.float64)
        return Quality(snr=round(estimate_snr(audio, sample_rate), 2), c50=round(estimate_c50(audio, sample_rate), 2))


class BrouhahaEstimator:
    """Brouhaha's SNR and C50 (pyannote.audio + brouhaha + checkpoint)."""

    name = "brouhaha"

    def __init__(self, model: str = DEFAULT_BROUHAHA_MODEL, device: str | None = None):
        try:
            import torch
            from brouhaha.pipeline import RegressiveActivityDetectionPipeline
            from pyannote.audio import Model
        except ImportError as err:
            raise QualityUnavailableError(
                f"Brouhaha cannot run: {err.name or err} is not installed (needs pyannote.audio and "
                "brouhaha from github.com/marianne-m/brouhaha-vad); use corpus.mls.estimator=offline"
            ) from None
        checkpoint = Path(model)
        if not checkpoint.is_file():
            from arnar.hub import offline_requested

            if offline_requested():
                raise QualityUnavailableError(
                    f"Brouhaha checkpoint {model!r} is not a local file and offline mode is on; "
                    "give corpus.mls.brouhaha_model a path to best.ckpt"
                )
            try:
                from huggingface_hub import hf_hub_download

                checkpoint = Path(hf_hub_download(repo_id=model, filename="best.ckpt"))
            except Exception as err:  # the hub client raises many types; all mean "no weights"
                raise QualityUnavailableError(
                    f"Brouhaha checkpoint {model!r} cannot be had ({type(err).__name__}: {err}); "
                    "give corpus.mls.brouhaha_model a path to best.ckpt"
                ) from None
        segmentation = Model.from_pretrained(checkpoint, strict=False)
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        segmentation.to(torch.device(device))
        self._pipeline = RegressiveActivityDetectionPipeline(segmentation=segmentation)
        self._pipeline.instantiate(self._pipeline.default_parameters())
        self._torch = torch

    def __call__(self, audio: np.ndarray, sample_rate: int) -> Quality:
        waveform = self._torch.from_numpy(np.asarray(audio, dtype=np.float32))[None, :]
        out = self._pipeline({"waveform": waveform, "sample_rate": sample_rate, "uri": "utterance"})
        snr, c50 = np.asarray(out["snr"], dtype=np.float64), np.asarray(out["c50"], dtype=np.float64)
        frames_per_second = len(snr) / (len(audio) / sample_rate)
        speech = np.zeros(len(snr), dtype=bool)
        for segment, _ in out["annotation"].itertracks():
            speech[int(segment.start * frames_per_second): int(np.ceil(segment.end * frames_per_second))] = True
        if not speech.any():
            speech[:] = True
        return Quality(snr=round(float(snr[speech].mean()), 2), c50=round(float(c50[speech].mean()), 2))


def make_estimator(kind: str, brouhaha_model: str = DEFAULT_BROUHAHA_MODEL):
    """``brouhaha``, ``offline``, or ``auto`` (Brouhaha where it loads, else offline, said in the log)."""
    if kind == "offline":
        return OfflineEstimator()
    if kind == "brouhaha":
        return BrouhahaEstimator(brouhaha_model)
    if kind == "auto":
        try:
            return BrouhahaEstimator(brouhaha_model)
        except QualityUnavailableError as err:
            log.warning("%s; falling back to the offline SNR/C50 estimator (arnar.corpus.recipes.quality)", err)
            return OfflineEstimator()
    raise CorpusError(f"corpus.mls.estimator: {kind!r} is none of brouhaha, offline, auto")
