"""Speaker similarity (SIM) backends: speaker embeddings and their cosine (docs/design.md section 7).

SIM of a synthesized utterance is the cosine between the speaker embedding of the generated audio
and that of the reference (prompt or original) audio, in [-1, 1]. Two backends:

``resemblyzer``
    The GE2E LSTM speaker encoder whose pretrained weights ship inside the ``resemblyzer`` wheel:
    works offline, deterministic, 256-d embeddings. It is *not* the encoder the papers use, so its
    numbers are comparable between our own systems only, never with published SIM tables.
``wavlm``
    A WavLM x-vector speaker-verification model in Hugging Face format
    (``transformers.WavLMForXVector``; default hub id ``microsoft/wavlm-base-plus-sv``).
    See :class:`WavLMEncoder` for how it relates to the papers' protocol.

Public API: :func:`load_speaker_encoder`, :func:`cosine`, :func:`embed_files`,
:class:`SpeakerEncoder`, :class:`SimUnavailableError`.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from arnar.evaluate.audio import AudioError, load_mono, resample
from arnar.hub import offline_requested

__all__ = [
    "DEFAULT_WAVLM_MODEL",
    "ENCODERS",
    "ResemblyzerEncoder",
    "SimUnavailableError",
    "SpeakerEncoder",
    "WavLMEncoder",
    "cosine",
    "embed_files",
    "load_speaker_encoder",
]

ENCODERS = ("resemblyzer", "wavlm")
DEFAULT_WAVLM_MODEL = "microsoft/wavlm-base-plus-sv"
_HUB_PROBE_TIMEOUT_S = 3.0


class SimUnavailableError(RuntimeError):
    """A speaker-similarity backend cannot be used here (package or weights missing, offline)."""


class _ItemAudioError(AudioError):
    """An unusable item of a batch passed to ``embed``; ``index`` is its position in that batch."""

    def __init__(self, index: int, message: str):
        super().__init__(f"audio[{index}]: {message}")
        self.index = index
        self.reason = message


@runtime_checkable
class SpeakerEncoder(Protocol):
    name: str  # "resemblyzer" | "wavlm"
    model_id: str

    def embed(self, audio: Sequence[np.ndarray], sample_rate: int) -> np.ndarray:
        """Embeddings of the utterances, ``[N, D]`` float32 with L2-normalised rows."""
        ...


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise cosine similarity: ``[N, D] x [N, D] -> [N]``; two 1-D vectors give a 0-d array.

    Rows are normalised here, so inputs need not be unit vectors; ``[N, D] x [D]`` broadcasts.
    A zero vector has no direction and raises ``ValueError`` rather than returning NaN.
    """
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    if a.ndim not in (1, 2) or b.ndim not in (1, 2):
        raise ValueError(f"cosine needs 1-D or 2-D arrays, got shapes {a.shape} and {b.shape}")
    if a.shape[-1] != b.shape[-1] or (a.ndim == b.ndim == 2 and a.shape[0] != b.shape[0]):
        raise ValueError(f"cosine: shapes {a.shape} and {b.shape} do not pair row by row")
    norms = np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)
    if np.any(norms == 0):
        raise ValueError("cosine of a zero vector is undefined")
    return np.sum(a * b, axis=-1) / norms


def load_speaker_encoder(
    name: str, *, model: str | None = None, device: str = "cpu"
) -> SpeakerEncoder:
    """The speaker encoder ``name`` (one of :data:`ENCODERS`), ready to ``embed``.

    ``model``: for ``resemblyzer`` a ``.pt`` weights file (default: the weights in the wheel); for
    ``wavlm`` a directory in Hugging Face format or a hub id (default
    :data:`DEFAULT_WAVLM_MODEL`). Raises :class:`SimUnavailableError` when the backend's package
    or weights cannot be loaded here, ``ValueError`` for an unknown name.
    """
    key = name.strip().lower()
    if key == "resemblyzer":
        return ResemblyzerEncoder(weights=model, device=device)
    if key == "wavlm":
        return WavLMEncoder(model or DEFAULT_WAVLM_MODEL, device=device)
    raise ValueError(f"unknown speaker encoder {name!r}; choose one of {', '.join(ENCODERS)}")


def embed_files(
    encoder: SpeakerEncoder,
    paths: Sequence[str | Path],
    batch_size: int = 8,
    progress: bool = True,
) -> np.ndarray:
    """Embeddings ``[len(paths), D]`` of audio files, read as mono and resampled to the encoder's
    rate, ``batch_size`` files per ``embed`` call. Errors name the offending file."""
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    from tqdm import tqdm

    rate = int(getattr(encoder, "sample_rate", 16000))
    paths = [Path(p) for p in paths]
    chunks: list[np.ndarray] = []
    with tqdm(total=len(paths), desc=f"SIM {encoder.name}", unit="utt",
              disable=not progress) as bar:
        for start in range(0, len(paths), batch_size):
            batch = paths[start:start + batch_size]
            audio = [load_mono(p, rate)[0] for p in batch]
            try:
                chunks.append(encoder.embed(audio, rate))
            except _ItemAudioError as err:
                raise AudioError(f"{batch[err.index]}: {err.reason}") from None
            bar.update(len(batch))
    if not chunks:
        return np.zeros((0, getattr(encoder, "dim", 0)), dtype=np.float32)
    return np.concatenate(chunks, axis=0)


def _check_audio(audio: Sequence[np.ndarray], sample_rate: int) -> list[np.ndarray]:
    if isinstance(audio, np.ndarray) and audio.ndim == 1:
        raise TypeError("embed takes a sequence of 1-D arrays; wrap a single utterance in a list")
    if int(sample_rate) != sample_rate or sample_rate <= 0:
        raise ValueError(f"sample_rate must be a positive integer, got {sample_rate!r}")
    out = []
    for i, x in enumerate(audio):
        x = np.asarray(x, dtype=np.float32)
        if x.ndim != 1:
            raise _ItemAudioError(i, f"expected mono 1-D audio, got shape {x.shape}")
        if x.size == 0:
            raise _ItemAudioError(i, "no samples")
        if not np.all(np.isfinite(x)):
            raise _ItemAudioError(i, "non-finite samples")
        out.append(x)
    return out


def _unit_rows(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


# --------------------------------------------------------------------------- resemblyzer


class ResemblyzerEncoder:
    """Resemblyzer's GE2E voice encoder (3-layer LSTM on 40-band mel, 256-d, weights in the wheel).

    Per utterance, as ``resemblyzer.preprocess_wav`` does: resample to 16 kHz (soxr, the same
    resampler librosa uses), raise the level to -30 dBFS if quieter, drop long silences with
    webrtcvad; then ``VoiceEncoder.embed_utterance`` (mean of 1.6 s partial embeddings). One
    deviation: if VAD would leave under 0.1 s (noise, very short clips), the untrimmed audio is
    used instead of embedding (near) nothing. Digital silence raises ``AudioError``.
    """

    name = "resemblyzer"
    dim = 256
    _MIN_TRIMMED_S = 0.1

    def __init__(self, weights: str | Path | None = None, device: str = "cpu"):
        try:
            with warnings.catch_warnings():
                # resemblyzer imports binary_dilation from a deprecated scipy namespace
                warnings.simplefilter("ignore", DeprecationWarning)
                from resemblyzer import VoiceEncoder, hparams
                from resemblyzer.audio import normalize_volume, trim_long_silences
        except Exception as err:  # ImportError, or webrtcvad's pkg_resources import failing
            raise SimUnavailableError(
                f"resemblyzer cannot be imported ({type(err).__name__}: {err}); install "
                "'resemblyzer' with 'webrtcvad-wheels' (or setuptools<81 for webrtcvad)"
            ) from err
        if weights is not None and not Path(weights).is_file():
            raise SimUnavailableError(f"resemblyzer weights file not found: {weights}")
        from importlib.metadata import version

        self._normalize_volume = normalize_volume
        self._trim_long_silences = trim_long_silences
        self._target_dbfs = hparams.audio_norm_target_dBFS
        self.sample_rate = int(hparams.sampling_rate)
        self.device = device
        self.model_id = (str(Path(weights).resolve()) if weights is not None
                         else f"resemblyzer=={version('resemblyzer')}:pretrained.pt")
        self._model = VoiceEncoder(device, verbose=False, weights_fpath=weights)
        self._model.eval()

    def _preprocess(self, index: int, wav: np.ndarray, rate: int) -> np.ndarray:
        wav = resample(wav, rate, self.sample_rate)
        if not np.any(wav):
            raise _ItemAudioError(index, "digital silence has no speaker")
        wav = self._normalize_volume(wav, self._target_dbfs, increase_only=True)
        trimmed = self._trim_long_silences(wav)
        if len(trimmed) < self._MIN_TRIMMED_S * self.sample_rate:
            return wav.astype(np.float32)
        return trimmed.astype(np.float32)

    def embed(self, audio: Sequence[np.ndarray], sample_rate: int) -> np.ndarray:
        items = _check_audio(audio, sample_rate)
        if not items:
            return np.zeros((0, self.dim), dtype=np.float32)
        rows = [self._model.embed_utterance(self._preprocess(i, x, int(sample_rate)))
                for i, x in enumerate(items)]
        return _unit_rows(np.stack(rows))


# --------------------------------------------------------------------------- WavLM


def _hub_offline() -> bool:
    if offline_requested():
        return True
    try:
        from huggingface_hub import constants
    except ImportError:
        return True
    return bool(constants.HF_HUB_OFFLINE)


def _hub_unreachable() -> str | None:
    """Why the hub cannot be reached (None if it answers), in about a second or three: the hub
    clients retry for ~25 s before failing, which is no way to learn that we are offline."""
    try:
        from huggingface_hub import constants, get_session

        get_session().head(constants.ENDPOINT, timeout=_HUB_PROBE_TIMEOUT_S)
    except Exception as err:
        return f"{type(err).__name__}: {err}"
    return None


class WavLMEncoder:
    """WavLM x-vector speaker verification (``transformers.WavLMForXVector``).

    The papers' SIM protocol (Seed-TTS eval, as used by PALLE's SIM-o and, via CosyVoice 2, by
    SyncSpeech's SS) embeds with WavLM-large fine-tuned for speaker verification with an ECAPA-TDNN
    head, from the UniSpeech repository. That checkpoint is a plain ``.pth`` for the UniSpeech
    code base, not a pip- or hub-loadable package, so it is not available here. This backend
    takes any Hugging Face-format WavLM x-vector model (a local directory with config, weights and
    ``preprocessor_config.json``, or a hub id; default ``microsoft/wavlm-base-plus-sv``, WavLM
    base-plus with an x-vector TDNN head): the nearest loadable equivalent. Its absolute values
    differ from the papers' numbers; compare systems under one encoder only.

    Inference: each utterance is resampled to the feature extractor's rate and passed through the
    feature extractor on its own (so its normalisation never sees padding), then utterances are
    zero-padded into a batch with an attention mask. The x-vector head is evaluated here from the
    model's own modules rather than by ``WavLMForXVector.forward``, because that method's
    statistics pooling counts TDNN output frames ignoring the layers' dilation, so for a padded
    item it averages frames computed from padding (measured on a small random model: cosine
    0.9994 to the same item embedded alone, max deviation ~2 % of the largest component). With the true lengths a padded item embeds as it does alone, to float
    tolerance. Models whose convolutional feature encoder uses group norm (``feat_extract_norm
    == "group"``, e.g. base-plus) normalise over the whole padded time axis; for those only
    equal-length utterances share a batch. Output: the x-vector (``embeddings``), L2-normalised.
    """

    name = "wavlm"

    def __init__(self, model: str = DEFAULT_WAVLM_MODEL, device: str = "cpu", batch_size: int = 8):
        try:
            import torch
            from transformers import AutoConfig, AutoFeatureExtractor, WavLMForXVector
        except Exception as err:
            raise SimUnavailableError(
                f"transformers/torch cannot be imported ({type(err).__name__}: {err})"
            ) from err
        self._torch = torch
        source = os.path.expanduser(str(model))
        is_dir = Path(source).is_dir()
        if not is_dir and (source.startswith(("/", ".", "~")) or Path(source).exists()):
            raise SimUnavailableError(f"WavLM model directory not found: {source}")
        self.model_id = str(Path(source).resolve()) if is_dir else source
        self.device = device
        self.batch_size = int(batch_size)

        def load(local_only: bool):
            config = AutoConfig.from_pretrained(source, local_files_only=local_only)
            if getattr(config, "model_type", None) != "wavlm":
                raise SimUnavailableError(
                    f"{source}: model_type {getattr(config, 'model_type', None)!r}, "
                    "not a WavLM x-vector model"
                )
            extractor = AutoFeatureExtractor.from_pretrained(source, local_files_only=local_only)
            net, info = WavLMForXVector.from_pretrained(
                source, local_files_only=local_only, output_loading_info=True
            )
            return extractor, net, info

        try:
            try:
                extractor, net, info = load(local_only=True)
            except OSError as first:
                if is_dir:
                    raise
                if _hub_offline():
                    raise SimUnavailableError(
                        f"WavLM model {source!r} is not in the local Hugging Face cache and the "
                        "hub is set offline (HF_HUB_OFFLINE); give model= a local directory"
                    ) from first
                why = _hub_unreachable()
                if why is not None:
                    raise SimUnavailableError(
                        f"WavLM model {source!r} is not in the local Hugging Face cache and the "
                        f"hub cannot be reached ({why}); give model= a local directory"
                    ) from first
                extractor, net, info = load(local_only=False)
        except SimUnavailableError:
            raise
        except (OSError, ValueError) as err:
            raise SimUnavailableError(f"cannot load WavLM x-vector model {source!r}: {err}") from err

        ignorable = ("objective.", "classifier.", "wavlm.masked_spec_embed")
        missing = [k for k in info.get("missing_keys", []) if not k.startswith(ignorable)]
        mismatched = info.get("mismatched_keys", [])
        if missing or mismatched:
            raise SimUnavailableError(
                f"{source}: checkpoint lacks trained weights for the speaker head/encoder "
                f"(missing {sorted(missing)[:5]}, mismatched {list(mismatched)[:5]}); "
                "it is not a speaker-verification x-vector model"
            )
        self._extractor = extractor
        self._net = net.to(device).eval()
        cfg = net.config
        self.sample_rate = int(getattr(extractor, "sampling_rate", 16000))
        self.dim = int(cfg.xvector_output_dim)
        self._pad_exact = cfg.feat_extract_norm != "group"
        self._tdnn_shrink = sum(d * (k - 1) for k, d in zip(cfg.tdnn_kernel, cfg.tdnn_dilation))

    # Frames left after the conv feature encoder and the TDNN layers, for given sample counts.
    def _pooled_frames(self, n_samples):
        frames = self._net._get_feat_extract_output_lengths(n_samples)
        return frames - self._tdnn_shrink

    def _min_samples(self) -> int:
        """Fewest samples that leave two pooled frames (a standard deviation needs two)."""
        if not hasattr(self, "_min_n"):
            lo, hi = 1, 1
            while int(self._pooled_frames(self._torch.tensor(hi))) < 2:
                lo, hi = hi, hi * 2
            while lo < hi:
                mid = (lo + hi) // 2
                if int(self._pooled_frames(self._torch.tensor(mid))) < 2:
                    lo = mid + 1
                else:
                    hi = mid
            self._min_n = hi
        return self._min_n

    def _features(self, index: int, wav: np.ndarray, rate: int) -> np.ndarray:
        wav = resample(wav, rate, self.sample_rate)
        if len(wav) < self._min_samples():
            raise _ItemAudioError(
                index, f"{len(wav) / self.sample_rate:.3f} s is too short for {self.model_id} "
                f"(needs at least {self._min_samples() / self.sample_rate:.3f} s)"
            )
        feats = self._extractor(wav, sampling_rate=self.sample_rate, return_tensors="np")
        return np.asarray(feats["input_values"][0], dtype=np.float32)

    def _forward(self, inputs: list[np.ndarray]) -> np.ndarray:
        torch = self._torch
        net, cfg = self._net, self._net.config
        lengths = torch.tensor([len(x) for x in inputs])
        values = torch.zeros(len(inputs), int(lengths.max()))
        mask = torch.zeros(len(inputs), int(lengths.max()), dtype=torch.long)
        for i, x in enumerate(inputs):
            values[i, :len(x)] = torch.from_numpy(x)
            mask[i, :len(x)] = 1
        values, mask = values.to(self.device), mask.to(self.device)
        out = net.wavlm(values, attention_mask=mask, output_hidden_states=cfg.use_weighted_layer_sum)
        if cfg.use_weighted_layer_sum:
            layers = torch.stack(out.hidden_states, dim=1)
            weights = torch.softmax(net.layer_weights, dim=-1).view(-1, 1, 1)
            hidden = (layers * weights).sum(dim=1)
        else:
            hidden = out.last_hidden_state
        hidden = net.projector(hidden)
        for layer in net.tdnn:
            hidden = layer(hidden)
        stats = [torch.cat([hidden[i, :n].mean(dim=0), hidden[i, :n].std(dim=0)])
                 for i, n in enumerate(self._pooled_frames(lengths).tolist())]
        return net.feature_extractor(torch.stack(stats)).float().cpu().numpy()

    def embed(self, audio: Sequence[np.ndarray], sample_rate: int) -> np.ndarray:
        items = _check_audio(audio, sample_rate)
        inputs = [self._features(i, x, int(sample_rate)) for i, x in enumerate(items)]
        result = np.zeros((len(inputs), self.dim), dtype=np.float32)
        # Longest first, so that batches hold similar lengths (little padding).
        order = sorted(range(len(inputs)), key=lambda i: (-len(inputs[i]), i))
        if self._pad_exact:
            groups = [order[s:s + self.batch_size] for s in range(0, len(order), self.batch_size)]
        else:
            groups = []
            for i in order:
                if groups and len(inputs[groups[-1][0]]) == len(inputs[i]) \
                        and len(groups[-1]) < self.batch_size:
                    groups[-1].append(i)
                else:
                    groups.append([i])
        with self._torch.inference_mode(), warnings.catch_warnings():
            # raised inside WavLM's attention (bool padding mask + float position bias); harmless
            warnings.filterwarnings("ignore", message="Support for mismatched key_padding_mask")
            for group in groups:
                result[group] = self._forward([inputs[i] for i in group])
        return _unit_rows(result) if len(result) else result
