"""Naturalness MOS predictors: DNSMOS (offline, the default) and UTMOSv2 (paper scale).

**DNSMOS** (Reddy et al., ICASSP 2022, arXiv:2110.01763; P.835 SIG/BAK/OVRL and the P.808 MOS)
runs from the ``speechmos`` wheel, which ships the ONNX models and the reference feature and
polynomial-mapping code: :class:`DnsmosPredictor` builds its two ONNX Runtime sessions with one
thread each (evaluation jobs run side by side on two cores; one thread also makes the scores the
same on every run) and otherwise calls the package's ``DNSMOS`` scorer per clip: 16 kHz, clips
shorter than its 9.01 s window repeated to fill it. ``windows="all"`` is the package's (and the
reference script's) reading: the repeated clip is scored in every 9.01 s window 1 s apart and the
scores averaged, so a 4 s clip, repeated to 16 s, costs 7 windows of cyclic shifts of itself;
``windows="first"`` (the default here) scores the first window only, one per clip of the test
lists (2-10 s): the P.835 network costs ~0.2 s a window on one thread, and the default run scores
~1000 clips. The headline column is P.808; SIG (speech), BAK (background) and OVRL (overall,
P.835) are kept beside it.

**UTMOSv2** (reported in SyncSpeech Tables 2-4): UTMOSv2 (sarulab-speech/UTMOSv2) is not on PyPI: it installs from its git repository, and its
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

__all__ = ["DnsmosPredictor", "INSTALL_HINT", "MOS_PREDICTORS", "MosUnavailableError", "UTMOSv2Predictor",
           "load_mos_predictor", "mos_available"]

MOS_PREDICTORS = ("dnsmos", "utmosv2")

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

    def score(self, audio: Sequence[np.ndarray], sample_rate: int) -> dict[str, np.ndarray]:
        """``{"mos": [N]}``: UTMOSv2 has one score (the shape :meth:`DnsmosPredictor.score` has)."""
        return {"mos": self.predict(audio, sample_rate)}


class DnsmosPredictor:
    """DNSMOS from the ``speechmos`` wheel: per clip P.808 MOS (the headline) and P.835 SIG, BAK,
    OVRL, all on a 1-5 scale."""

    name = "dnsmos"
    sample_rate = 16000  # DNSMOS's only rate
    columns = ("p808", "sig", "bak", "ovrl")
    window_seconds = 9.01  # the networks' input length (speechmos.dnsmos.INPUT_LENGTH)

    def __init__(self, threads: int = 1, windows: str = "first"):
        if windows not in ("first", "all"):
            raise ValueError(f"DNSMOS windows must be 'first' or 'all', got {windows!r}")
        self.windows = windows
        try:
            import onnxruntime as ort
            from speechmos import dnsmos
        except Exception as err:  # not installed, or a dependency failing at import time
            raise MosUnavailableError(f"DNSMOS needs the speechmos package ({type(err).__name__}: {err}); "
                                      "it is in requirements-nodeps.lock (scripts/setup.sh installs it)") from err
        from importlib.metadata import version
        from pathlib import Path

        models = Path(dnsmos.__file__).parent / "dnsmos_models"
        primary, p808 = models / "sig_bak_ovr.onnx", models / "model_v8.onnx"
        options = ort.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = int(threads)
        # the package's scorer, with sessions built here (its own constructor takes no options)
        scorer = dnsmos.DNSMOS.__new__(dnsmos.DNSMOS)
        scorer.primary_model_path = str(primary)
        scorer.onnx_sess = ort.InferenceSession(str(primary), options, providers=["CPUExecutionProvider"])
        scorer.p808_onnx_sess = ort.InferenceSession(str(p808), options, providers=["CPUExecutionProvider"])
        self._scorer = scorer
        self.model_id = (f"speechmos=={version('speechmos')}:dnsmos ({primary.name} + {p808.name}, "
                         f"{windows} window{'s' if windows == 'all' else ''})")

    def score(self, audio: Sequence[np.ndarray], sample_rate: int) -> dict[str, np.ndarray]:
        """``{"p808", "sig", "bak", "ovrl"}`` -> ``[N]`` float32 scores of mono clips at ``sample_rate``.
        Samples beyond [-1, 1] (a decoder may overshoot) are clipped first: the scorer refuses them."""
        out = {c: [] for c in self.columns}
        for i, x in enumerate(audio):
            x = np.asarray(x, dtype=np.float32)
            if x.ndim != 1 or x.size == 0 or not np.all(np.isfinite(x)):
                raise ValueError(f"audio[{i}]: need non-empty, finite mono 1-D audio")
            x = np.clip(resample(x, int(sample_rate), self.sample_rate), -1.0, 1.0)
            if not np.any(x):
                raise ValueError(f"audio[{i}]: silent (all zeros); DNSMOS has no score for it")
            if self.windows == "first":
                # repeated as the scorer would, then cut to one window: its loop then scores one
                n = int(self.window_seconds * self.sample_rate)
                x = np.tile(x, -(-n // x.size))[:n]
            result = self._scorer(x, self.sample_rate, False)
            for c in self.columns:
                out[c].append(float(result[f"{c}_mos"]))
        return {c: np.asarray(v, dtype=np.float32) for c, v in out.items()}

    def predict(self, audio: Sequence[np.ndarray], sample_rate: int) -> np.ndarray:
        """P.808 MOS ``[N]`` (float32)."""
        return self.score(audio, sample_rate)["p808"]


def load_mos_predictor(name: str = "utmosv2", device: str = "cpu",
                       dnsmos_windows: str = "first") -> UTMOSv2Predictor | DnsmosPredictor:
    """The MOS predictor ``name`` (one of :data:`MOS_PREDICTORS`); raises
    :class:`MosUnavailableError` with the reason and install instruction when it cannot be used here."""
    name = name.strip().lower()
    if name == "dnsmos":
        return DnsmosPredictor(windows=dnsmos_windows)
    if name != "utmosv2":
        raise ValueError(f"unknown MOS predictor {name!r}; known: {', '.join(MOS_PREDICTORS)}")
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
