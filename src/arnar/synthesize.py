"""Synthesis from a trained run: text + prompt audio (+ its transcript) -> speech.

The chain is the same for every single-stream paradigm:

    prompt wav --codec.encode--> prompt codes ┐
    text, prompt transcript --BPE-----------> ├─ paradigm.generate ─> codes ─ codec.decode ─> wav
                                               ┘                        (voice from the prompt)

``Synthesizer`` is the Python API; :func:`synthesize_testlist` runs a frozen test list and writes
the folder the evaluation reads (``<item_id>.wav`` + ``timing.jsonl``, see arnar.evaluate.run).

Continuation items (VALL-E / PALLE convention): the model continues the 3 s prompt with the rest
of the text, and the evaluated utterance is prompt audio + continuation, read against the whole
target text (PALLE 5.2).

Timing record (one per item in ``timing.jsonl``; the definitions are in :mod:`arnar.evaluate.metrics`):
``token_seconds`` and ``total_seconds``; ``fpl_a``, the token stage until the first packet's
``chunk_size`` tokens exist (a paradigm that streams says when, else after its last pass), without
the codec; ``first_packet_decode_seconds``, the codec decoding that packet, timed on its own;
``text_tokens_to_start``, the text tokens the paradigm needs before its decoding starts (SyncSpeech
says, ``q + 1``; every other paradigm reads the whole text), from which the evaluation computes
FPL-L (Eq. 7); ``text_tokens_waited``, those read by the time the first packet was complete;
``forward_passes`` and the paradigm's own ``info`` (SyncSpeech: ``prompt_ends``).

Prompt alignment. SyncSpeech splits the prompt's speech among the prompt's text tokens (its a_n).
Given the forced alignment of the prompt's recording (``prompt_words``; for a test list
``--prompt-alignments``, the aligner's JSONL of the test split, ``arnar align`` output), the a_n
are computed from it with the training durations' own rules
(:func:`arnar.align.durations.bpe_durations`, on the prompt clip's frames) and the record says
``"prompt_ends": "aligned"``; without one (no file, the prompt's recording not in it, or words that
do not match its transcript) they are spread uniformly and the record says ``"uniform"``.

Input limits. Every input either gives audio or a :class:`SynthesisInputError` whose one-line
message names the input and the problem (``arnar synthesize`` / ``arnar stream`` print it as
``error: ...``), and no input makes the work unbounded:

* text and prompt transcript: at least one word to speak (:func:`speakable`: a letter or digit
  of any script, or one of the symbols ``& + = @ %``; empty text and text of only whitespace,
  punctuation, emoji or invisible characters get the same refusal), at most
  :data:`MAX_TEXT_TOKENS` BPE tokens each. Longer text is refused, not cut: a cut would silently
  drop words, and a caller can split text into sentences. Around its words, emoji, digits,
  symbols and other scripts are spoken as the BPE encodes them (byte fallback: a character the
  model never saw becomes its UTF-8 byte pieces, which count towards the limit);
* prompt audio: mono, or ``[samples, channels]`` (soundfile's layout, at most
  :data:`MAX_PROMPT_CHANNELS` channels; they are averaged),
  finite, at a positive sample rate (resampled to the codec's), from one codec frame to
  :data:`MAX_PROMPT_SECONDS` long, peak at most :data:`MAX_PROMPT_PEAK` (float samples are in
  [-1, 1]; larger values overflow the codec's log-mel), and not silent: an RMS level of at least
  ``silence_dbfs`` (:data:`SILENCE_DBFS`, the ingest's ``validation.silence_dbfs``), since a
  silent prompt has no voice to copy. A prompt file must exist and is checked for its length
  (``soundfile.info``) before it is read; an unreadable one is refused with its path;
* the speech to generate: the speaking rate of the prompt (PALLE, arXiv:2504.10352, Eq. 11: prompt frames x
  text tokens / prompt-text tokens, the length the NAR family generates) must not ask for more
  than :data:`MAX_SPEECH_SECONDS`; that only happens when the transcript is far shorter than
  its audio, i.e. the wrong transcript.

With those, every paradigm's frames are bounded by the text: AR stops at ``max_ratio`` (20)
frames per text token, SyncSpeech at ``max_duration`` frames per token, the NAR family at the
Eq. 11 length above.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import math
import numbers
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from arnar.corpus.validate import ValidationLimits
from arnar.paradigms.base import SynthesisRequest
from arnar.text import analyze_words

log = logging.getLogger("arnar.synthesize")
# codecs whose tokens are a residual stack: single-stream paradigms (CoD) model its first quantizer
MULTI_CODEBOOK = {"offline_rvq", "dac"}
FIRST_PACKET_TOKENS = 15  # the decoder's chunk size at paper scale (SyncSpeech, arXiv:2502.11094, Sec. 3.1), unless a paradigm says

# Limits of one synthesis call (module docstring). The training utterances are at most ~35 s,
# about 150 BPE tokens; 512 tokens is ~2 min of speech, far past where the models are trained
# and still a bounded amount of work (AR: at most 20 x 512 passes).
MAX_TEXT_TOKENS = 512
MAX_PROMPT_SECONDS = 30.0  # the test lists use 3 s (continuation) and single-utterance prompts
MAX_SPEECH_SECONDS = 600.0  # Eq. 11 length of the requested speech
MAX_PROMPT_PEAK = 2.0**15  # int16 full scale: the largest sample scale a caller plausibly passes
MAX_PROMPT_CHANNELS = 8  # a 2-D prompt is [samples, channels]; a wider one is taken for channels-first
# a prompt quieter than this (RMS, dBFS) is silent: the ingest's default (params.yaml validation.silence_dbfs)
SILENCE_DBFS = ValidationLimits.silence_dbfs


class SynthesisInputError(ValueError):
    """Text or prompt that synthesis cannot use; the one-line message names the input and why."""


def _quote(text: str, limit: int = 40) -> str:
    """``repr`` of ``text`` cut to ``limit`` characters: one line, whatever the text holds."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


def speakable(text: str) -> bool:
    """Whether ``text`` has a word to speak: a word of the phoneme tokenizer
    (:func:`arnar.text.analyze_words`), i.e. a token of the normalised text with a letter or digit
    of any script, or one of the symbols it reads (``& + = @ %``). Punctuation, emoji and
    invisible characters alone have none."""
    return bool(analyze_words(text))


def nothing_to_speak(what: str, text: str) -> str:
    """The one refusal of a text without a word to speak (empty, whitespace, punctuation...)."""
    return (f"{what}: text {_quote(text)} has no word to speak (empty, or only whitespace, punctuation, "
            "emoji or invisible characters): nothing to speak")


def rms_dbfs(audio: np.ndarray) -> float:
    """RMS level of float samples in dB relative to full scale (1.0); -inf for digital silence."""
    rms = float(np.sqrt(np.mean(np.square(audio, dtype=np.float64))))
    return 20.0 * math.log10(rms) if rms > 0 else -math.inf


def item_seed(seed: int, item_id: str) -> int:
    """A per-item seed independent of the order and subset of items synthesized."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{item_id}".encode()).digest()[:8], "little") & (2**63 - 1)


def continuation_text(target_text: str, prompt_text: str) -> str:
    """The part of ``target_text`` after the prompt's words (``prompt_text`` = the words that end
    inside the prompt, normalised, so count them rather than match their spelling)."""
    n_prompt = len(prompt_text.split())
    words = target_text.split()
    return " ".join(words[n_prompt:])


@dataclass
class SynthesisJob:
    """One synthesis between :meth:`Synthesizer.prepare` and :meth:`Synthesizer.finish`."""

    request: SynthesisRequest
    prompt: np.ndarray  # the prompt audio at the codec's rate
    prompt_codes: torch.Tensor
    start: float  # perf_counter() when preparation began (the record's total_seconds)


class Synthesizer:
    """A trained paradigm plus the codec and BPE model it was trained with."""

    def __init__(self, run_dir: str | os.PathLike, *, codec: str, codec_model: str | None, bpe_model: str | os.PathLike,
                 device: str = "cpu", decoding: dict[str, Any] | None = None, checkpoint: str = "best",
                 max_text_tokens: int = MAX_TEXT_TOKENS, max_prompt_seconds: float = MAX_PROMPT_SECONDS,
                 max_speech_seconds: float = MAX_SPEECH_SECONDS, silence_dbfs: float = SILENCE_DBFS,
                 vocoder: str | None = None):
        from arnar.codec import load_codec
        from arnar.text import load_text_tokenizer
        from arnar.train import load_model

        self.run_dir = Path(run_dir)
        self.model, self.config = load_model(self.run_dir, checkpoint=checkpoint)
        self.model.to(device).eval()
        self.device = device
        options = {"model": codec_model} if codec_model else {}
        # codebooks of the stack the paradigm generates (CoD's option codebooks; 1 for the others,
        # which generate the first quantizer): the codec decodes from those alone
        self.codebooks = int(getattr(self.model, "codebooks", 1))
        if codec in MULTI_CODEBOOK:
            options["n_codebooks"] = self.codebooks
        elif self.codebooks > 1:
            raise SynthesisInputError(f"{self.run_dir}: the model generates {self.codebooks} codebooks, codec {codec} "
                                      f"has one stream: wrong --codec for this run")
        if vocoder:  # the offline codec's mel -> audio (arnar.codec.offline.vocoder); None: its default
            options["vocoder"] = vocoder
        self.codec = load_codec(codec, **options)
        self.bpe = load_text_tokenizer(bpe_model)  # BPE pieces or phonemes: the text units the run read
        self.max_text_tokens, self.max_prompt_seconds = int(max_text_tokens), float(max_prompt_seconds)
        self.max_speech_seconds, self.silence_dbfs = float(max_speech_seconds), float(silence_dbfs)
        if not isinstance(decoding or {}, dict):
            raise SynthesisInputError(f"decoding options must be a mapping of names to values, got {decoding!r}")
        self.decoding = dict(decoding or {})
        # every paradigm module names its decoding options in DECODING and refuses others: say so
        # here, before any synthesis, rather than from inside generate
        known = getattr(sys.modules.get(type(self.model).__module__), "DECODING", None)
        unknown = sorted(set(self.decoding) - set(known)) if isinstance(known, dict) else []
        if unknown:
            raise SynthesisInputError(f"decoding options {unknown} are not options of the {self.model.name!r} paradigm "
                                      f"(known: {sorted(known)})")
        if self.codec.codebook_size != self.model.vocab.speech_size:
            raise SynthesisInputError(
                f"{self.run_dir}: the model was trained on {self.model.vocab.speech_size} speech codes, "
                f"codec {codec} has {self.codec.codebook_size}: wrong --codec for this run"
            )
        self._decode_takes_prompt_audio = "prompt_audio" in inspect.signature(self.codec.decode).parameters

    # ------------------------------------------------------------------------- input checks

    def text_ids(self, text: str, what: str) -> torch.Tensor:
        """BPE ids of ``text`` (``what`` names it in errors): a text with a word to speak, of
        1 .. ``max_text_tokens`` BPE tokens."""
        if not isinstance(text, str):
            raise SynthesisInputError(f"{what}: expected a str, got {type(text).__name__}")
        try:  # lone surrogates: bytes of a command line that were not UTF-8 (Python's surrogateescape)
            text.encode("utf-8")
        except UnicodeEncodeError as err:
            raise SynthesisInputError(f"{what}: not valid Unicode ({err.object[err.start]!r} at character {err.start}; "
                                      "input bytes that are not UTF-8?)") from None
        ids = self.bpe.encode(text)
        if len(ids) > self.max_text_tokens:  # before the words are read: a long text is refused at once
            raise SynthesisInputError(
                f"{what}: {len(ids)} BPE tokens ({len(text)} characters, starting {_quote(text, 20)}), more than "
                f"the {self.max_text_tokens} one synthesis takes: split it into sentences")
        if not ids or not speakable(text):
            raise SynthesisInputError(nothing_to_speak(what, text))
        return torch.tensor(ids, dtype=torch.long)

    def prompt_clip(self, prompt_audio: Any, sample_rate: Any, what: str = "prompt audio") -> np.ndarray:
        """``prompt_audio`` checked (module docstring: mono or ``[samples, channels]``, finite,
        one codec frame .. ``max_prompt_seconds``, peak <= MAX_PROMPT_PEAK, RMS level at least
        ``silence_dbfs``) and resampled from ``sample_rate`` to the codec's rate; ``what`` names
        it in errors."""
        from arnar.evaluate.audio import resample

        if (isinstance(sample_rate, bool) or not isinstance(sample_rate, numbers.Real)
                or not math.isfinite(sample_rate) or sample_rate <= 0):
            raise SynthesisInputError(f"{what}: sample rate {sample_rate!r} is not a positive number of Hz")
        try:
            audio = np.asarray(prompt_audio, dtype=np.float32)
        except (TypeError, ValueError) as err:
            raise SynthesisInputError(f"{what}: not an array of samples ({err})") from None
        shortest = 1.0 / self.codec.frame_rate  # less than one token frame carries no voice
        if audio.size == 0:
            raise SynthesisInputError(f"{what}: 0 samples; a prompt needs at least {shortest:.3g} s (one codec frame)")
        if audio.ndim == 2 and audio.shape[1] <= MAX_PROMPT_CHANNELS:  # [samples, channels], as soundfile reads
            with np.errstate(invalid="ignore", over="ignore"):  # non-finite samples are refused below
                audio = audio.mean(axis=1)
        elif audio.ndim != 1:
            raise SynthesisInputError(f"{what}: expected mono samples [n] or [n, channels] with at most "
                                      f"{MAX_PROMPT_CHANNELS} channels, got shape {audio.shape}")
        seconds = len(audio) / float(sample_rate)
        if seconds < shortest:
            raise SynthesisInputError(f"{what}: {len(audio)} samples at {sample_rate} Hz = {seconds:.4g} s; "
                                      f"a prompt needs at least {shortest:.3g} s (one codec frame)")
        if seconds > self.max_prompt_seconds:
            raise SynthesisInputError(f"{what}: {seconds:.1f} s long; a prompt is at most "
                                      f"{self.max_prompt_seconds:g} s (cut a few seconds of it, with their transcript)")
        if not np.all(np.isfinite(audio)):
            raise SynthesisInputError(f"{what}: non-finite samples (NaN or inf)")
        peak = float(np.max(np.abs(audio)))
        if peak > MAX_PROMPT_PEAK:
            raise SynthesisInputError(f"{what}: peak amplitude {peak:.3g}; float samples belong in [-1, 1] "
                                      f"(at most {MAX_PROMPT_PEAK:g} is accepted)")
        level = rms_dbfs(audio)
        if level < self.silence_dbfs:
            raise SynthesisInputError(f"{what}: silent prompt (RMS level {level:.1f} dBFS, below the "
                                      f"{self.silence_dbfs:g} dBFS of validation.silence_dbfs): "
                                      "it has no voice to copy")
        return resample(audio, sample_rate, self.codec.sample_rate)

    def read_prompt(self, path: str | os.PathLike) -> tuple[np.ndarray, int]:
        """A prompt file, checked (its length from the header first, so that a long file is not
        read whole) and resampled to the codec's rate: ``(audio, codec sample rate)``. Errors
        name the file."""
        import soundfile as sf

        from arnar.evaluate.audio import load_mono

        path = Path(path)
        if not path.exists():
            raise SynthesisInputError(f"{path}: the prompt audio file does not exist")
        if path.is_dir():
            raise SynthesisInputError(f"{path}: a folder, not a prompt audio file")
        try:
            info = sf.info(str(path))
        except Exception as err:  # libsndfile raises several types; all mean "cannot be read"
            raise SynthesisInputError(f"{path}: unreadable audio ({err})") from None
        if info.samplerate > 0 and info.frames / info.samplerate > self.max_prompt_seconds:
            raise SynthesisInputError(f"{path}: {info.frames / info.samplerate:.1f} s long; a prompt is at most "
                                      f"{self.max_prompt_seconds:g} s (cut a few seconds of it, with their transcript)")
        audio, rate = load_mono(path)  # AudioError (a ValueError) names the file
        return self.prompt_clip(audio, rate, what=str(path)), self.codec.sample_rate

    def prompt_codes(self, prompt: np.ndarray) -> torch.Tensor:
        """Codes of a checked prompt (at the codec's rate): ``[T]`` of the first codebook, or
        ``[K, T]`` when the paradigm generates ``K`` codebooks."""
        codes = torch.as_tensor(self.codec.encode([prompt], self.codec.sample_rate)[0], dtype=torch.long)
        if codes.shape[-1] == 0:
            raise SynthesisInputError(f"prompt audio of {len(prompt)} samples gave no codec frames")
        return codes[:self.codebooks] if self.codebooks > 1 else codes[0]

    def check_speech_length(self, prompt_frames: int, prompt_tokens: int, text_tokens: int) -> None:
        """Refuse a request whose Eq. 11 length (the speech the NAR family would generate, and
        what any paradigm should say at the prompt's rate) is over ``max_speech_seconds``."""
        from arnar.decode.schedules import total_frames_estimate

        frames = total_frames_estimate(prompt_frames, prompt_tokens, text_tokens)
        if frames > self.max_speech_seconds * self.codec.frame_rate:
            prompt_seconds = prompt_frames / self.codec.frame_rate
            raise SynthesisInputError(
                f"the prompt speaks {prompt_tokens} text tokens in {prompt_seconds:.1f} s, so the text's {text_tokens} "
                f"tokens would take {frames / self.codec.frame_rate:.0f} s of speech, over the limit of "
                f"{self.max_speech_seconds:g} s: is the prompt text the transcript of the prompt audio?")

    # ------------------------------------------------------------------------- synthesis

    def aligned_prompt_ends(self, prompt_text: str, prompt_ids: torch.Tensor, words: Any, seconds: float,
                            n_frames: int) -> torch.Tensor:
        """a_n of the prompt's text tokens from the aligned ``words`` (:class:`arnar.align.base.Interval`,
        seconds from the start of the prompt clip of ``seconds`` and ``n_frames`` codec frames), by the
        rules of the training durations; :class:`arnar.align.durations.DurationError` when the
        words are not those of ``prompt_text`` or its tokens are not ``prompt_ids``."""
        from arnar.align.durations import DurationError, bpe_durations

        result = bpe_durations(prompt_text, list(words), seconds, self.bpe, total_frames=n_frames)
        if result.ids != prompt_ids.tolist():
            raise DurationError(f"the alignment's {len(result.ids)} text tokens are not the prompt's {len(prompt_ids)}")
        return torch.tensor(result.ends, dtype=torch.long)

    def synthesize(self, text: str, prompt_audio: np.ndarray, prompt_text: str, sample_rate: int, *,
                   seed: int = 0, target_frames: int | None = None,
                   prompt_words: Any = None) -> tuple[np.ndarray, dict[str, Any]]:
        """Speak ``text`` in the voice of ``prompt_audio`` (mono float at ``sample_rate``, whose
        transcript is ``prompt_text``). Returns audio at ``self.codec.sample_rate`` and a timing
        record (module docstring). ``prompt_words``: the forced alignment of the prompt's words
        (:class:`arnar.align.base.Interval`, seconds from the prompt's start), from which the
        prompt's a_n are computed (module docstring, "Prompt alignment"); unusable ones fall back
        to uniform a_n with a warning. Inputs out of the limits of the module docstring raise
        :class:`SynthesisInputError`."""
        job = self.prepare(text, prompt_audio, prompt_text, sample_rate, target_frames=target_frames,
                           prompt_words=prompt_words)
        generator = torch.Generator().manual_seed(seed)
        token_start = time.perf_counter()
        generation = self.model.generate(job.request, generator, **self.decoding)
        return self.finish(job, generation, time.perf_counter() - token_start)

    def synthesize_batch(self, jobs: list["SynthesisJob"], seeds: list[int]) -> list[tuple[np.ndarray, dict[str, Any]]]:
        """:meth:`synthesize` of prepared jobs (:meth:`prepare`) through the paradigm's
        ``generate_batch`` (one forward pass per step for all of them), each from its own seed.
        The codes are batch-1's (tests/test_decode_identical.py); the token-stage time of each
        record is the whole batch's, marked ``batch_size``: RTF and FPL are batch-1 figures."""
        generate_batch = getattr(self.model, "generate_batch", None)
        if generate_batch is None:
            raise SynthesisInputError(f"{self.run_dir}: this paradigm has no batched decoding (generate_batch)")
        generators = [torch.Generator().manual_seed(seed) for seed in seeds]
        token_start = time.perf_counter()
        generations = generate_batch([job.request for job in jobs], generators, **self.decoding)
        token_seconds = time.perf_counter() - token_start
        results = []
        for job, generation in zip(jobs, generations):
            audio, record = self.finish(job, generation, token_seconds)
            results.append((audio, {**record, "batch_size": len(jobs)}))
        return results

    def prepare(self, text: str, prompt_audio: np.ndarray, prompt_text: str, sample_rate: int, *,
                target_frames: int | None = None, prompt_words: Any = None) -> "SynthesisJob":
        """Everything before decoding: the checked inputs as the paradigm's request."""
        start = time.perf_counter()
        text_ids, prompt_ids = self.text_ids(text, "text"), self.text_ids(prompt_text, "prompt text")
        prompt = self.prompt_clip(prompt_audio, sample_rate)
        prompt_codes = self.prompt_codes(prompt)
        n_prompt_frames = int(prompt_codes.shape[-1])
        if target_frames is None:
            self.check_speech_length(n_prompt_frames, len(prompt_ids), len(text_ids))
        elif (isinstance(target_frames, bool) or not isinstance(target_frames, numbers.Integral)
              or not 1 <= target_frames <= self.max_speech_seconds * self.codec.frame_rate):
            most = int(self.max_speech_seconds * self.codec.frame_rate)
            raise SynthesisInputError(f"target_frames {target_frames!r}: expected a whole number of frames from 1 to "
                                      f"{most} ({self.max_speech_seconds:g} s)")
        request = SynthesisRequest(text_ids, prompt_ids, prompt_codes if self.codebooks == 1 else prompt_codes[0],
                                   target_frames=target_frames,
                                   prompt_acoustic=prompt_codes[1:] if self.codebooks > 1 else None)
        if prompt_words is not None:
            from arnar.align.durations import DurationError

            try:
                request.features["prompt_ends"] = self.aligned_prompt_ends(
                    prompt_text, prompt_ids, prompt_words, len(prompt) / self.codec.sample_rate, n_prompt_frames)
            except DurationError as err:
                log.warning("prompt %s: its alignment does not fit (%s); uniform prompt ends", _quote(prompt_text), err)
        prepare = getattr(self.model, "prepare_request", None)
        if callable(prepare):  # paradigms with inputs of their own (CoD: phonemes, speaker embedding)
            try:
                request = prepare(request, text=text, prompt_text=prompt_text, prompt_audio=prompt,
                                  sample_rate=self.codec.sample_rate)
            except SynthesisInputError:
                raise
            except ValueError as err:  # their inputs' own refusals (CoD: a text with no phonemes)
                raise SynthesisInputError(str(err)) from None
        return SynthesisJob(request, prompt, prompt_codes, start)

    def finish(self, job: "SynthesisJob", generation: Any, token_seconds: float) -> tuple[np.ndarray, dict[str, Any]]:
        """Everything after decoding: the codec's audio and the timing record."""
        request, prompt, prompt_codes, start = job.request, job.prompt, job.prompt_codes, job.start
        speech = generation.speech.cpu()
        codes = speech.reshape(-1, speech.shape[-1]).numpy().astype(np.int64)  # [K, T] (K = 1: [1, T])
        # first-packet latency (FPL-A): the token stage until the first chunk of tokens exists
        # (streaming paradigms say when; a non-streaming one after its last pass); the codec's
        # decoding of that chunk is timed on its own
        info = generation.info
        chunk = int(info.get("chunk_size", FIRST_PACKET_TOKENS))
        decode_start = time.perf_counter()
        self._decode(codes[:, :chunk], prompt, prompt_codes)
        first_packet_decode = time.perf_counter() - decode_start
        audio = self._decode(codes, prompt, prompt_codes)
        own = ("text_tokens_waited", "text_tokens_to_start")
        record = {
            "token_seconds": token_seconds,
            "total_seconds": time.perf_counter() - start,
            "forward_passes": generation.forward_passes,
            "generated_frames": int(codes.shape[1]),
            "fpl_a": float(info.get("first_packet_seconds", token_seconds)),
            "first_packet_decode_seconds": first_packet_decode,
            # text tokens needed before decoding starts (FPL-L, Eq. 7) and those read when the first
            # packet was complete: all of them for a paradigm that reads the whole text
            "text_tokens_to_start": int(info.get("text_tokens_to_start", len(request.text))),
            "text_tokens_waited": int(info.get("text_tokens_waited", len(request.text))),
            **({"first_packet_passes": generation.first_packet_passes} if generation.first_packet_passes else {}),
            **{k: v for k, v in info.items() if isinstance(v, (int, float, str, bool)) and k not in own},
        }
        return np.asarray(audio, dtype=np.float32), record

    def _decode(self, codes: np.ndarray, prompt: np.ndarray, prompt_codes: torch.Tensor) -> np.ndarray:
        if codes.shape[1] == 0:
            return np.zeros(0, dtype=np.float32)
        if self._decode_takes_prompt_audio:  # the voice from the prompt audio (offline codec)
            return self.codec.decode([codes], prompt_audio=[prompt])[0]
        return self.codec.decode([codes], prompt=[prompt_codes.reshape(-1, prompt_codes.shape[-1]).numpy()])[0]


def read_prompt_alignments(path: str | os.PathLike) -> dict[str, list]:
    """Recording id -> its aligned words (:class:`arnar.align.base.Interval`, seconds) from an
    aligner's JSONL (``arnar align`` output, ``data/<profile>/align/<aligner>/<split>.jsonl``)."""
    from arnar.align import alignment_from_json

    path = Path(path)
    if not path.is_file():
        raise SynthesisInputError(f"--prompt-alignments {path}: no such file")
    alignments = {}
    for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            try:
                alignment = alignment_from_json(json.loads(line))
            except ValueError as err:  # json.JSONDecodeError is one
                raise SynthesisInputError(f"{path}:{line_no}: not an alignment ({err})") from None
            alignments[alignment.utt_id] = alignment.words
    return alignments


def prompt_clip_words(words: list, prompt_text: str, start: float, end: float) -> list | None:
    """The aligned ``words`` of a recording that its clip ``[start, end]`` (seconds) speaks as
    ``prompt_text``, in seconds from the clip's start: as many as ``prompt_text`` has spoken words
    (:func:`arnar.align.base.spoken_words`), from the first that starts in the clip (a
    continuation prompt's transcript is the words that end inside it, which an aligner may place
    a little differently). None when the recording has too few; whether they are the transcript's
    words is checked where the a_n are computed."""
    from arnar.align.base import Interval, spoken_words
    from arnar.text import normalize_text

    wanted = sum(len(spoken_words(word)) for word in normalize_text(prompt_text).split(" "))
    inside = [w for w in words if w.start >= start - 1e-6]
    if wanted == 0 or len(inside) < wanted:
        return None
    length = end - start

    def shifted(t: float) -> float:
        return min(max(t - start, 0.0), length)

    return [Interval(w.symbol, shifted(w.start), shifted(w.end)) for w in inside[:wanted]]


def synthesize_testlist(synth: Synthesizer, testlist: str | os.PathLike, prompts_dir: str | os.PathLike,
                        out_dir: str | os.PathLike, *, seed: int, progress: bool = True,
                        ground_truth_duration: bool = False,
                        prompt_alignments: str | os.PathLike | None = None, batch_size: int = 1,
                        timing_items: int | None = None) -> dict[str, Any]:
    """Every item of a frozen test list -> ``out_dir/<item_id>.wav`` + ``out_dir/timing.jsonl``.

    ``batch_size`` 1, the default, decodes and times every item alone, as the papers' RTF and FPL
    are. ``batch_size`` > 1 decodes the items that many at a time through the paradigm's
    ``generate_batch`` (:meth:`Synthesizer.synthesize_batch`: the same codes, so the same audio),
    except ``timing_items`` of them (:func:`timed_positions`: spread evenly over the list), which
    are decoded alone: ``timing.jsonl`` holds only those batch-1 records, the speed figures the
    evaluation reads, and ``batched.jsonl`` the others' (their time is their batch's). A paradigm
    without ``generate_batch`` decodes one item at a time whatever ``batch_size`` says.

    ``ground_truth_duration``: generate as many frames as the recording lasts (for continuation,
    the part after the prompt), the "GT duration" setting of PALLE (arXiv:2504.10352) Table 1 and the base of its
    Fig. 5 multipliers; otherwise each paradigm decides the length. ``prompt_alignments``: the
    aligner's JSONL of the split the prompts come from (:func:`read_prompt_alignments`); each
    item's prompt words are its clip's (:func:`prompt_clip_words`), for the prompt's a_n (module
    docstring, "Prompt alignment")."""
    import soundfile as sf
    from tqdm import tqdm

    from arnar.evaluate.testlists import read_testlist

    items = read_testlist(Path(testlist))
    alignments = read_prompt_alignments(prompt_alignments) if prompt_alignments is not None else {}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rate = synth.codec.sample_rate
    if batch_size < 1:
        raise SynthesisInputError(f"--batch-size must be >= 1, got {batch_size}")
    if batch_size > 1 and getattr(synth.model, "generate_batch", None) is None:
        # batching only saves time (the codes are batch 1's), and generate_batch is optional for a
        # paradigm, so one pipeline-wide batch size must not stop a paradigm that lacks it
        print(f"arnar synthesize: {synth.run_dir} has no batched decoding (generate_batch); "
              f"--batch-size {batch_size} falls back to one item at a time", file=sys.stderr)
        batch_size = 1
    if timing_items is not None and timing_items < 0:
        raise SynthesisInputError(f"--timing-items must be >= 0, got {timing_items}")
    # positions decoded alone, for the speed figures: all of them at batch 1
    timed = (set(range(len(items))) if batch_size == 1
             else set(timed_positions(len(items), timing_items or 0)))
    records: dict[str, dict[str, Any]] = {}
    pending: list[tuple[Any, np.ndarray, SynthesisJob]] = []

    def write(item, prompt: np.ndarray, audio: np.ndarray, record: dict[str, Any]) -> None:
        if item.task == "continuation":  # the evaluated utterance is the prompt followed by its continuation
            audio = np.concatenate([prompt.astype(np.float32), audio])
        tmp = out / f".tmp.{item.item_id}.wav"
        sf.write(str(tmp), audio, rate, subtype="PCM_16", format="WAV")
        os.replace(tmp, out / f"{item.item_id}.wav")
        records[item.item_id] = {"item_id": item.item_id, **record}

    def flush() -> None:
        results = synth.synthesize_batch([job for _, _, job in pending],
                                         [item_seed(seed, item.item_id) for item, _, _ in pending])
        for (item, prompt, _), (audio, record) in zip(pending, results):
            write(item, prompt, audio, record)
        pending.clear()

    for position, item in enumerate(tqdm(items, desc=f"synthesize {out.parent.name}/{out.name}",
                                         disable=not progress, unit="item")):
        alone = position in timed
        continuing = item.task == "continuation"
        text = continuation_text(item.target_text, item.prompt_text) if continuing else item.target_text
        if not text.strip():
            raise SynthesisInputError(f"{testlist}: item {item.item_id} leaves no text to synthesize after its prompt")
        try:  # the prompt file checked as `arnar synthesize` checks one (its errors name the file)
            prompt, _ = synth.read_prompt(Path(prompts_dir) / f"{item.item_id}.wav")
            target_frames = None
            if ground_truth_duration:
                seconds = item.target_duration - (item.prompt_end - item.prompt_start if continuing else 0.0)
                target_frames = max(1, round(seconds * synth.codec.frame_rate))
            words = alignments.get(item.prompt_id)
            if words is not None:
                words = prompt_clip_words(words, item.prompt_text, item.prompt_start, item.prompt_end)
                if words is None:
                    log.warning("item %s: the alignment of %s has fewer words than the prompt text; uniform prompt "
                                "ends", item.item_id, item.prompt_id)
            elif prompt_alignments is not None:
                log.warning("item %s: prompt %s is not in %s; uniform prompt ends", item.item_id, item.prompt_id,
                            prompt_alignments)
            if alone:
                audio, record = synth.synthesize(text, prompt, item.prompt_text, rate,
                                                 seed=item_seed(seed, item.item_id), target_frames=target_frames,
                                                 prompt_words=words)
            else:
                pending.append((item, prompt, synth.prepare(text, prompt, item.prompt_text, rate,
                                                            target_frames=target_frames, prompt_words=words)))
        except SynthesisInputError as err:
            raise SynthesisInputError(f"{testlist}: item {item.item_id}: {err}") from None
        if alone:
            write(item, prompt, audio, record)
        elif len(pending) == batch_size:
            flush()
    if pending:
        flush()
    in_order = [records[i.item_id] for i in items]
    for name, chosen in (("timing.jsonl", [r for n, r in enumerate(in_order) if n in timed]),
                         ("batched.jsonl", [r for n, r in enumerate(in_order) if n not in timed])):
        if name == "batched.jsonl" and batch_size == 1:
            continue
        tmp = out / f".tmp.{name}"
        tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in chosen), encoding="utf-8")
        os.replace(tmp, out / name)
    summary = {"items": len(in_order), "timed": len(timed),
               "forward_passes_mean": float(np.mean([r["forward_passes"] for r in in_order])) if in_order else 0.0}
    log.info("synthesized %d items (%d timed alone) -> %s (%.1f forward passes per item)", len(in_order),
             len(timed), out, summary["forward_passes_mean"])
    return summary


def timed_positions(n_items: int, k: int) -> list[int]:
    """``k`` positions of a list of ``n_items`` spread evenly over it, ``floor(i n / k)`` for
    ``i < k`` (the first item always among them), all of them when ``k >= n_items``."""
    k = min(int(k), int(n_items))
    return [i * n_items // k for i in range(k)] if k > 0 else []
