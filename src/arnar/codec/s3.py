"""S3Tokenizer v2 (CosyVoice 2's supervised semantic tokens): 16 kHz, 25 Hz, 6561 codes.

PALLE (section 4.1) and SyncSpeech (section 2.2) tokenize speech with the pretrained S3Tokenizer
from CosyVoice 2: one stream of FSQ codes (3^8 = 6561) at 25 Hz. The package ``s3tokenizer``
(0.3.0) holds the model class ``S3TokenizerV2``; its weights come from modelscope.

Loading (``load_codec("s3", model=...)``):

* ``model="speech_tokenizer_v2_25hz"`` (default): the package's own name. As
  ``s3tokenizer.load_model`` does, the ONNX file is looked up in ``download_root`` (default
  ``$XDG_CACHE_HOME/s3tokenizer`` or ``~/.cache/s3tokenizer``) and downloaded there on a
  connected machine. The package's downloader has no timeout, so when the file is missing the
  modelscope host is probed first (``connect_timeout`` s); offline (or ``offline=True``,
  ``HF_HUB_OFFLINE=1``, ``ARNAR_OFFLINE=1``) this raises :class:`CodecUnavailableError` at once.
* ``model=<path>``: a local checkpoint in the package's formats: the ``.onnx`` file it downloads
  (converted with ``s3tokenizer.onnx2torch``, exactly as ``S3TokenizerV2.init_from_onnx``), or a
  torch state dict (``torch.save(model.state_dict())``, what ``S3TokenizerV2.init_from_pt``
  reads). The model dimensions are read from the tensors (width, layers, mel bins; heads =
  width / 64, the head size fixed by the model's rotary table), so the pretrained model
  (1280 wide, 6 layers, 20 heads) and the small random-initialised test models load through
  the same code; the state dict must match the model exactly (``strict=True``).

Encoding follows the package's reference pipeline: each clip resampled to 16 kHz (soxr),
``s3tokenizer.log_mel_spectrogram`` per clip (128 mel bins, 10 ms hop, per-clip level
normalisation), ``s3tokenizer.padding`` into a batch with per-item lengths, ``model.quantize``;
each clip's codes are cut to its own code length. The encoder masks padding (convolution
inputs, attention bias, FSMN memory), so a clip's tokens do not depend on its batch; clips over
30 s are tokenized by the package in 30 s windows with 4 s overlap. Token count:
``ceil(ceil(n_mel / 2) / 2)`` with ``n_mel = n_samples // 160``, i.e. 25 per second.

There is no decoder: CosyVoice 2's flow-matching token-to-mel model and HiFi-GAN vocoder are not
a package here (docs/design.md section 6), so ``can_decode`` is False and ``decode`` raises
:class:`CodecError`; the pipeline decodes S3-style tokens with a separate detokenizer stage.

Options: ``model``, ``device`` (default ``"cpu"``), ``batch_size`` (clips per forward pass,
default 16), ``download_root``, ``offline``, ``connect_timeout``.
"""

from __future__ import annotations

import importlib.metadata
import math
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from arnar.codec.base import (
    CodecError,
    CodecUnavailableError,
    check_clips,
    env_offline,
    length_batches,
    register_codec,
    state_dict_hash,
)
from arnar.hub import require_cached_or_reachable

__all__ = ["DEFAULT_MODEL", "S3Codec", "load_s3"]

DEFAULT_MODEL = "speech_tokenizer_v2_25hz"
SAMPLE_RATE = 16000
HOP = 160  # mel hop (10 ms); the encoder downsamples mel frames by 4 -> 40 ms per token
HEAD_DIM = 64  # fixed by S3TokenizerV2's rotary table (precompute_freqs_cis(64, ...))
MIN_SAMPLES = 400  # one STFT window (25 ms); shorter clips cannot be analysed


def _default_root() -> Path:
    cache = os.getenv("XDG_CACHE_HOME", os.path.join(os.path.expanduser("~"), ".cache"))
    return Path(cache) / "s3tokenizer"


def _package_version() -> str | None:
    try:
        return importlib.metadata.version("s3tokenizer")
    except importlib.metadata.PackageNotFoundError:
        return None


def _fetch_named(name: str, root: Path, offline: bool, timeout: float):
    """``s3tokenizer.load_model(name)`` (cache, else download), failing fast when it cannot work."""
    import s3tokenizer

    url = s3tokenizer._MODELS[name]
    target = root / f"{name}.onnx"  # where s3tokenizer's downloader keeps it
    todo = (
        f"on a connected machine run `python -c \"import s3tokenizer; "
        f"s3tokenizer.load_model('{name}')\"` (or download {url}) and copy the file to "
        f"{target}, or put it anywhere and pass model=<path>"
    )
    require_cached_or_reachable(
        target, url, offline=offline, timeout=timeout, todo=todo, error=CodecUnavailableError,
        what=f"S3 tokenizer weights {name!r} are not cached at {target}",
    )
    try:
        # checks the cached file's sha256, downloads (again) if needed, converts the ONNX weights
        return s3tokenizer.load_model(name, download_root=str(root))
    except Exception as err:  # urllib / checksum errors
        raise CodecUnavailableError(f"getting S3 tokenizer {name!r} failed ({err}); {todo}") from err


def _read_state_dict(path: Path) -> dict[str, Any]:
    import torch

    if path.suffix.lower() == ".onnx":
        from s3tokenizer.utils import onnx2torch

        try:
            return onnx2torch(str(path), None, False)
        except Exception as err:
            raise CodecError(f"{path}: not a readable S3 tokenizer ONNX file ({err})") from err
    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as err:
        raise CodecError(f"{path}: not a readable torch checkpoint ({err})") from err
    if isinstance(state, dict) and "model" in state and isinstance(state["model"], dict):
        state = state["model"]
    if not isinstance(state, dict) or "encoder.conv1.weight" not in state:
        raise CodecError(f"{path}: not an S3TokenizerV2 state dict (no encoder.conv1.weight)")
    return state


def _config_from_state(state: dict[str, Any]):
    """S3TokenizerV2's ModelConfig with the dimensions of ``state``'s tensors."""
    from s3tokenizer.model_v2 import ModelConfig

    conv1 = state["encoder.conv1.weight"]  # [n_state, n_mels, 3]
    n_state, n_mels = int(conv1.shape[0]), int(conv1.shape[1])
    layers = {int(m.group(1)) for k in state if (m := re.match(r"encoder\.blocks\.(\d+)\.", k))}
    if n_state % HEAD_DIM:
        raise CodecError(f"S3TokenizerV2 width {n_state} is not a multiple of the head size {HEAD_DIM}")
    return ModelConfig(
        n_mels=n_mels,
        n_audio_state=n_state,
        n_audio_head=n_state // HEAD_DIM,
        n_audio_layer=len(layers),
    )


class S3Codec:
    """S3Tokenizer v2 as a :class:`~arnar.codec.base.Codec` (encode only)."""

    name = "s3"
    package = "s3tokenizer"
    sample_rate = SAMPLE_RATE
    frame_rate = 25.0
    n_codebooks = 1
    can_decode = False

    def __init__(
        self,
        model: str | os.PathLike = DEFAULT_MODEL,
        *,
        device: str = "cpu",
        batch_size: int = 16,
        download_root: str | os.PathLike | None = None,
        offline: bool | None = None,
        connect_timeout: float = 10.0,
    ):
        import torch

        offline = env_offline() if offline is None else offline
        root = Path(download_root) if download_root is not None else _default_root()
        from s3tokenizer.model_v2 import S3TokenizerV2

        if Path(model).is_file():
            path = Path(model)
            state = _read_state_dict(path)
            config = _config_from_state(state)
            net = S3TokenizerV2(DEFAULT_MODEL, config)
            try:
                net.load_state_dict(state, strict=True)
            except RuntimeError as err:
                raise CodecError(f"{path}: state dict does not match S3TokenizerV2 ({err})") from err
        elif str(model) == DEFAULT_MODEL:
            net = _fetch_named(DEFAULT_MODEL, root, offline, connect_timeout)
            config = net.config
        else:
            raise CodecError(
                f"S3 tokenizer {str(model)!r}: neither a checkpoint file nor the package's name "
                f"{DEFAULT_MODEL!r} (this codec is S3Tokenizer v2, 25 Hz)"
            )
        self.model = net.eval().to(device)
        self.device = torch.device(device)
        self.batch_size = int(batch_size)
        self.source = str(model)
        self.config = {k: getattr(config, k) for k in vars(config)}
        self.codebook_size = int(config.n_codebook_size)
        self.package_version = _package_version()
        self._hash = state_dict_hash(
            self.model.state_dict(),
            {"codec": self.name, "class": "S3TokenizerV2", "model_config": self.config,
             "sample_rate": self.sample_rate, "n_mels": config.n_mels},
        )

    def config_hash(self) -> str:
        return self._hash

    @staticmethod
    def n_frames(n_samples: int) -> int:
        """Number of tokens for a clip of ``n_samples`` at 16 kHz (<= 30 s)."""
        mel = n_samples // HOP
        return math.ceil(math.ceil(mel / 2) / 2)

    def encode(self, audio: Sequence[np.ndarray], sample_rate: int) -> list[np.ndarray]:
        import s3tokenizer
        import torch

        from arnar.evaluate.audio import resample

        clips = [resample(c, sample_rate, SAMPLE_RATE) for c in check_clips(audio)]
        for i, clip in enumerate(clips):
            if clip.size < MIN_SAMPLES:
                raise CodecError(f"clip {i}: {clip.size / SAMPLE_RATE * 1000:.1f} ms at 16 kHz, "
                                 f"shorter than one {MIN_SAMPLES}-sample analysis window")
        out: list[np.ndarray | None] = [None] * len(clips)
        n_mels = self.config["n_mels"]
        with torch.inference_mode():
            for batch in length_batches([c.size for c in clips], self.batch_size):
                mels = [
                    s3tokenizer.log_mel_spectrogram(torch.from_numpy(clips[i]), n_mels=n_mels,
                                                    device=self.device)
                    for i in batch
                ]
                feats, lens = s3tokenizer.padding(mels)
                codes, code_lens = self.model.quantize(feats.to(self.device), lens.to(self.device))
                codes, code_lens = codes.cpu().numpy(), code_lens.cpu().numpy()
                for row, i in enumerate(batch):
                    out[i] = codes[row, : int(code_lens[row])].astype(np.int64)[None, :]
        return out  # type: ignore[return-value]

    def decode(self, codes: Sequence[np.ndarray], prompt: Sequence[np.ndarray | None] | None = None
               ) -> list[np.ndarray]:
        raise CodecError(
            "S3 tokens cannot be decoded by the s3 codec: its package has no decoder (CosyVoice 2's "
            "flow-matching token-to-speech model is not a package here); use the pipeline's "
            "detokenizer stage (docs/design.md section 6)"
        )


@register_codec("s3")
def load_s3(**options: Any) -> S3Codec:
    return S3Codec(**options)
