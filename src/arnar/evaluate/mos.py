"""Optional naturalness MOS prediction with UTMOSv2 (reported in SyncSpeech Tables 2-4).

UTMOSv2 (sarulab-speech/UTMOSv2) is not on PyPI: it installs from its git repository, and its
pretrained weights (plus the wav2vec 2.0 and EfficientNetV2 backbones it is built on) download
from the Hugging Face hub on first use. Where it is missing, :func:`mos_available` says why and
:func:`load_mos_predictor` raises :class:`MosUnavailableError`; the rest of evaluation runs
without it.

Call as documented in the package's README and ``UTMOSv2Model.predict``: ``create_model(
pretrained=True)``, then ``model.predict(data=<1-D float array at 16 kHz>, device=...,
num_workers=..., batch_size=..., num_repetitions=..., verbose=False)`` -> a score. ``predict`` has
no sample-rate argument: in-memory data is taken to be at the model config's rate (16 kHz), so
audio is resampled here first, one utterance per call (a 2-D ``data`` batch must be
rectangular, and zero-padding would be scored as part of the speech). UTMOSv2 scores randomly
chosen frames of the input; the global NumPy/torch/random generators are seeded for each
utterance (and restored afterwards) so that scores are reproducible.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np

from arnar.evaluate.audio import resample

__all__ = ["INSTALL_HINT", "MosUnavailableError", "UTMOSv2Predictor", "load_mos_predictor",
           "mos_available"]

INSTALL_HINT = (
    "pip install git+https://github.com/sarulab-speech/UTMOSv2.git (not on PyPI; needs network, "
    "and the first create_model(pretrained=True) downloads its weights from the Hugging Face hub)"
)


class MosUnavailableError(RuntimeError):
    """The MOS predictor cannot run here (package not installed, weights not downloadable)."""


def mos_available() -> tuple[bool, str]:
    """(True, version line) if ``utmosv2`` imports, else (False, the reason and how to install)."""
    try:
        import utmosv2
    except Exception as err:  # ImportError, or a dependency failing at import time
        return False, (f"utmosv2 cannot be imported ({type(err).__name__}: {err}); "
                       f"install it with: {INSTALL_HINT}")
    return True, f"utmosv2 {getattr(utmosv2, '__version__', 'unknown version')} imports"


class UTMOSv2Predictor:
    """UTMOSv2 naturalness MOS (1-5 scale) for each utterance."""

    name = "utmosv2"
    sample_rate = 16000  # the rate of the released configurations (cfg.sr)

    def __init__(self, model, model_id: str, device: str = "cpu", num_repetitions: int = 1,
                 seed: int = 0):
        self._model = model
        self.model_id = model_id
        self.device = device
        self.num_repetitions = int(num_repetitions)
        self.seed = int(seed)

    def _predict_one(self, wav: np.ndarray) -> float:
        import torch

        np_state, py_state = np.random.get_state(), random.getstate()
        try:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(self.seed)
                np.random.seed(self.seed)
                random.seed(self.seed)
                score = self._model.predict(
                    data=wav, device=self.device, num_workers=0, batch_size=1,
                    num_repetitions=self.num_repetitions, verbose=False,
                )
        finally:
            np.random.set_state(np_state)
            random.setstate(py_state)
        return float(np.asarray(score, dtype=np.float64).reshape(-1)[0])

    def predict(self, audio: Sequence[np.ndarray], sample_rate: int) -> np.ndarray:
        """MOS ``[N]`` (float32) of mono utterances at ``sample_rate``."""
        scores = []
        for i, x in enumerate(audio):
            x = np.asarray(x, dtype=np.float32)
            if x.ndim != 1 or x.size == 0 or not np.all(np.isfinite(x)):
                raise ValueError(f"audio[{i}]: need non-empty, finite mono 1-D audio")
            scores.append(self._predict_one(resample(x, int(sample_rate), self.sample_rate)))
        return np.asarray(scores, dtype=np.float32)


def load_mos_predictor(name: str = "utmosv2", device: str = "cpu") -> UTMOSv2Predictor:
    """The MOS predictor ``name`` (only ``"utmosv2"``); raises :class:`MosUnavailableError` with
    the reason and install instruction when it cannot be used here."""
    if name.strip().lower() != "utmosv2":
        raise ValueError(f"unknown MOS predictor {name!r}; only 'utmosv2' is supported")
    ok, reason = mos_available()
    if not ok:
        raise MosUnavailableError(reason)
    import utmosv2

    config, fold = "fusion_stage3", 0  # create_model's defaults: the full UTMOSv2 system
    try:
        model = utmosv2.create_model(pretrained=True, config=config, fold=fold)
    except Exception as err:
        raise MosUnavailableError(
            f"utmosv2 imports but create_model(pretrained=True) failed ({type(err).__name__}: "
            f"{err}); its weights and backbones download from the Hugging Face hub on first use, "
            "so run it once where the hub is reachable to fill the cache"
        ) from err
    version = getattr(utmosv2, "__version__", "unknown")
    return UTMOSv2Predictor(model, f"utmosv2=={version}:{config}/fold{fold}", device=device)
