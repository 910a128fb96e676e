"""`arnar stream`: speak text while an upstream LLM is still writing it (SyncSpeech, section 2.1).

Text comes word by word (``--text``, or stdin read as it arrives), each word is BPE-encoded as soon
as it is complete (sentencepiece never merges across whitespace, so per-word pieces are the
sentence's pieces), and the tokens are released as a simulated upstream LLM would emit them: token
``k`` (1-based) no earlier than ``k * d_LLM`` after the start (``--d-llm``, default 25 ms, the Qwen-7B
figure of section 3.1; 0 = as fast as they can be read). The model pulls a token only when a pass
needs it (:meth:`arnar.paradigms.syncspeech.SyncSpeech.stream`), and every ``chunk_size`` speech
tokens are decoded by the codec and written out as soon as they exist.

Reported (latency.json in ``--out-dir`` and on stdout), token stage only, as in the paper:

* ``fpl_l_measured``: seconds from the start of the upstream text until the first ``chunk_size``
  speech tokens exist, waiting on the simulated LLM;
* ``fpl_a_measured``: the same with the whole text available at once (a second run over the same
  tokens, stopped at the first packet, after an untimed warm-up run);
* ``fpl_l_eq7``: Eq. 7, ``(q + 1) d_LLM + c d_TTS``, with ``c`` the passes to the first packet and
  ``d_TTS`` = ``fpl_a_measured / c``; Eq. 7 assumes that only the first ``q + 1`` tokens are waited
  for, so it is below the measurement when a later pass had to wait for its text token (an
  upstream slower than the model, below);
* ``fpl_l_waited``: ``text_tokens_waited * d_LLM + fpl_a_measured``
  (:func:`arnar.evaluate.metrics.fpl_l`), as if no text arrived while decoding;
* ``first_packet_decode_seconds``: the codec's decoding of the first packet, not part of any of
  the above.

When the upstream is faster than the model (``d_LLM`` <= seconds per pass) the tokens a pass needs
have arrived by the time the pass before it ends, and the measured FPL-L is Eq. 7.

Each chunk is decoded with the codes before it (the prompt's, then the generated ones, up to
``--decoder-context`` frames) as left context, so chunk boundaries do not restart the decoder cold.

Inputs are checked as ``arnar synthesize`` checks them (:mod:`arnar.synthesize`: prompt file and
transcript, a word to speak, at most ``MAX_TEXT_TOKENS`` text tokens); a ``--text`` is checked
whole before anything runs, text from stdin as it arrives: words before the first word to speak
(punctuation, emoji) wait for it, input that ends without one is refused as empty text is, and
once the text passes the limit the stream stops with an error (the chunks written by then stay).
Each text token adds at most ``max_duration`` frames, so the work is bounded by the text.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import torch

from arnar import atomic
from arnar.synthesize import SILENCE_DBFS

log = logging.getLogger("arnar.stream")


class StreamError(ValueError):
    """Input that `arnar stream` cannot use (the message says why)."""


# ----------------------------------------------------------------------------- text arrival

def words(stream: TextIO) -> Iterator[str]:
    """Whitespace-separated words of ``stream``, each yielded as soon as the whitespace (or the end
    of input) after it has been read: a word is never released half-written."""
    word: list[str] = []
    while True:
        char = stream.read(1)
        if not char or char.isspace():
            if word:
                yield "".join(word)
                word = []
            if not char:
                return
        else:
            word.append(char)


def from_first_speakable(word_stream: Iterable[str], speakable: Callable[[str], bool],
                         refusal: Callable[[str], str]) -> Iterator[str]:
    """``word_stream`` as it comes, except that words before the first ``speakable`` one are held
    back and released with it; a StreamError (``refusal`` of the text read) when the input ends
    without one, so that text with nothing to speak gives no audio."""
    word_stream = iter(word_stream)
    held: list[str] = []
    for word in word_stream:
        held.append(word)
        if speakable(word):
            yield from held
            yield from word_stream
            return
    raise StreamError(refusal(" ".join(held)))


def bpe_tokens(word_stream: Iterable[str], encode: Callable[[str], list[int]]) -> Iterator[int]:
    """BPE ids of each word as it comes."""
    for word in word_stream:
        yield from encode(word)


def at_most(tokens: Iterable[int], limit: int) -> Iterator[int]:
    """``tokens`` as they come; a StreamError when a token past the ``limit``-th arrives."""
    for k, token in enumerate(tokens, start=1):
        if k > limit:
            raise StreamError(f"the text passed {limit} BPE tokens, the most one utterance takes: "
                              "stream one sentence at a time")
        yield token


class Upstream:
    """A simulated upstream LLM: token ``k`` (1-based) is released ``k * d_llm`` seconds after
    :meth:`start`, or when ``tokens`` yields it if that is later. Records when each token was
    handed over (seconds after the start)."""

    def __init__(self, tokens: Iterable[int], d_llm: float, *, clock: Callable[[], float] = time.perf_counter,
                 sleep: Callable[[float], None] = time.sleep):
        if d_llm < 0:
            raise StreamError(f"--d-llm must be >= 0, got {d_llm}")
        self.tokens, self.d_llm, self.clock, self.sleep = tokens, d_llm, clock, sleep
        self.t0: float | None = None
        self.arrivals: list[float] = []
        self.received: list[int] = []

    def start(self) -> float:
        self.t0 = self.clock()
        return self.t0

    def __iter__(self) -> Iterator[int]:
        if self.t0 is None:
            self.start()
        for k, token in enumerate(self.tokens, start=1):
            wait = self.t0 + k * self.d_llm - self.clock()
            if wait > 0:
                self.sleep(wait)
            self.arrivals.append(self.clock() - self.t0)
            self.received.append(int(token))
            yield int(token)


# ----------------------------------------------------------------------------- one streamed utterance

def run_stream(model, tokens: Iterable[int], prompt_text: torch.Tensor, prompt_speech: torch.Tensor, *,
               seed: int = 0, d_llm: float = 0.0, decoding: dict[str, Any] | None = None,
               on_chunk: Callable[[Any, float], None] | None = None, stop_after_first: bool = False,
               clock: Callable[[], float] = time.perf_counter,
               sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    """Stream ``tokens`` (target BPE ids) through ``model`` (a SyncSpeech paradigm) behind an
    :class:`Upstream` at ``d_llm``; ``on_chunk(chunk, ready_seconds)`` gets every packet as soon as
    it exists. Returns the timings (seconds from the upstream's start) and counts; ``codes`` are
    all generated codes. ``stop_after_first``: stop once the first packet exists (latency runs).
    ``clock`` and ``sleep`` are the upstream's and the timings' (tests pass a simulated pair)."""
    from arnar.paradigms.syncspeech import speech_chunks

    if not hasattr(model, "stream"):
        raise StreamError(f"paradigm {getattr(model, 'name', '?')!r} cannot stream text; only syncspeech does")
    decoding = dict(decoding or {})
    options = model.decoding_options(decoding)
    upstream = Upstream(tokens, d_llm, clock=clock, sleep=sleep)
    generator = torch.Generator().manual_seed(seed)
    t0 = upstream.start()
    steps = model.stream(upstream, prompt_text, prompt_speech, generator, **decoding)
    codes, chunks = [], []
    first: dict[str, Any] | None = None
    for chunk in speech_chunks(steps, int(options["chunk_size"])):
        ready = clock() - t0
        if first is None:
            first = {"seconds": ready, "text_tokens_waited": chunk.text_tokens_read,
                     "passes": chunk.forward_passes}
        chunks.append({"frames": len(chunk.speech), "ready_seconds": ready,
                       "text_tokens_read": chunk.text_tokens_read, "forward_passes": chunk.forward_passes})
        codes.append(chunk.speech)
        if on_chunk is not None and len(chunk.speech):
            on_chunk(chunk, ready)
        if stop_after_first:
            break
    total = clock() - t0
    if first is None:
        raise StreamError("no text tokens: nothing to speak")
    return {
        "first_packet_seconds": first["seconds"],
        "text_tokens_waited": first["text_tokens_waited"],
        "first_packet_passes": first["passes"],
        "forward_passes": chunks[-1]["forward_passes"],
        "text_tokens": len(upstream.received),
        "token_arrivals": upstream.arrivals,
        "chunk_size": int(options["chunk_size"]),
        "chunks": chunks,
        "seconds": total,
        "codes": torch.cat(codes) if codes else torch.zeros(0, dtype=torch.long),
        "received": list(upstream.received),
    }


def latency_summary(streamed: dict[str, Any], fpl_a_run: dict[str, Any], *, q: int, d_llm: float) -> dict[str, Any]:
    """FPL-L measured, FPL-A measured, Eq. 7 and the waited-tokens estimate (module docstring)."""
    from arnar.evaluate.metrics import fpl_l, syncspeech_fpl_l

    fpl_a = fpl_a_run["first_packet_seconds"]
    c = fpl_a_run["first_packet_passes"]
    d_tts = fpl_a / c if c else 0.0
    return {
        "fpl_l_measured": streamed["first_packet_seconds"],
        "fpl_a_measured": fpl_a,
        "fpl_l_eq7": syncspeech_fpl_l(q, c, d_tts, d_llm),
        "fpl_l_waited": fpl_l(fpl_a, streamed["text_tokens_waited"], d_llm),
        "c": c,
        "d_tts": d_tts,
        "d_llm": d_llm,
        "q": q,
        "text_tokens_waited": streamed["text_tokens_waited"],
        "chunk_size": streamed["chunk_size"],
    }


# ----------------------------------------------------------------------------- audio

class ChunkDecoder:
    """Codec decoding of one packet at a time, with the codes before it as left context."""

    def __init__(self, codec, prompt_codes: np.ndarray, prompt_audio: np.ndarray, context_frames: int):
        import inspect

        self.codec = codec
        self.history = np.asarray(prompt_codes, dtype=np.int64)
        self.prompt_audio = prompt_audio
        self.context_frames = max(0, int(context_frames))
        self.takes_prompt_audio = "prompt_audio" in inspect.signature(codec.decode).parameters

    def __call__(self, codes: np.ndarray) -> np.ndarray:
        codes = np.asarray(codes, dtype=np.int64)
        context = self.history[len(self.history) - min(self.context_frames, len(self.history)):]
        if self.takes_prompt_audio:
            audio = self.codec.decode([codes[None]], prompt=[context[None]], prompt_audio=[self.prompt_audio])[0]
        else:
            audio = self.codec.decode([codes[None]], prompt=[context[None]])[0]
        self.history = np.concatenate([self.history, codes])
        return np.asarray(audio, dtype=np.float32)


def _write_wav(path: Path, audio: np.ndarray, rate: int) -> None:
    import soundfile as sf

    with atomic.atomic_path(path) as tmp:
        sf.write(str(tmp), audio, rate, subtype="PCM_16", format="WAV")


# ----------------------------------------------------------------------------- command line

def build_parser(prog: str = "arnar stream") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    p.add_argument("--run-dir", required=True, help="a SyncSpeech training run")
    p.add_argument("--checkpoint", default="best", help="best (lowest dev loss; the default), final, last, or step_<N>")
    p.add_argument("--codec", required=True, help="the token set the run was trained on (offline, s3)")
    p.add_argument("--codec-model", help="folder of a trained codec (the offline codec)")
    p.add_argument("--text-units", required=True, help="the text units the run read (bpe.model or phonemes.json)")
    p.add_argument("--prompt-wav", required=True, help="prompt recording (the voice)")
    p.add_argument("--prompt-text", required=True, help="transcript of --prompt-wav")
    p.add_argument("--text", help="the text to speak (default: read from stdin as it arrives)")
    p.add_argument("--silence-dbfs", type=float, default=SILENCE_DBFS,
                   help=f"refuse a prompt whose RMS level is below this (default {SILENCE_DBFS:g}, "
                        "validation.silence_dbfs)")
    p.add_argument("--d-llm", type=float, default=0.025, help="seconds per upstream text token (default 0.025)")
    p.add_argument("--chunk-size", type=int, help="speech tokens per packet (default: the decoding default, 15)")
    p.add_argument("--decoder-context", type=int, default=50, help="frames of left context for each chunk")
    p.add_argument("--decoding", default="{}", help="JSON decoding options, e.g. '{\"duration_top_k\": 1}'")
    p.add_argument("--out-dir", required=True, help="chunk_NNNN.wav, stream.wav and latency.json go here")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def stream_main(args: argparse.Namespace) -> dict[str, Any]:
    from arnar.synthesize import Synthesizer, nothing_to_speak, speakable

    try:
        decoding = json.loads(args.decoding)
    except json.JSONDecodeError as err:
        raise StreamError(f"--decoding: not JSON ({err})") from None
    if not isinstance(decoding, dict):
        raise StreamError(f"--decoding: expected a JSON object of options, got {args.decoding!r}")
    if args.chunk_size is not None:
        if args.chunk_size < 1:
            raise StreamError(f"--chunk-size must be >= 1, got {args.chunk_size}")
        decoding["chunk_size"] = args.chunk_size
    if args.d_llm < 0 or not np.isfinite(args.d_llm):
        raise StreamError(f"--d-llm must be a number of seconds >= 0, got {args.d_llm}")
    synth = Synthesizer(args.run_dir, codec=args.codec, codec_model=args.codec_model, bpe_model=args.text_units,
                        device=args.device, checkpoint=args.checkpoint, silence_dbfs=args.silence_dbfs)
    model, codec = synth.model, synth.codec
    if not hasattr(model, "stream"):
        raise StreamError(f"{args.run_dir}: a {model.name!r} run; `arnar stream` needs a syncspeech run")
    try:  # the paradigm's own check of the option names, before anything runs
        model.decoding_options(decoding)
    except ValueError as err:
        raise StreamError(f"--decoding: {err}") from None

    # the inputs, checked before the model runs (SynthesisInputError names what is wrong)
    prompt_text = synth.text_ids(args.prompt_text, "--prompt-text")
    if args.text is not None:
        synth.text_ids(args.text, "--text")
    prompt, _ = synth.read_prompt(args.prompt_wav)
    prompt_speech = synth.prompt_codes(prompt)
    prompt_codes = prompt_speech.numpy()
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    source = io.StringIO(args.text) if args.text is not None else sys.stdin

    # warm-up (untimed): lazy initialisation must not land in the first measured packet
    run_stream(model, prompt_text.tolist(), prompt_text, prompt_speech, seed=args.seed, decoding=decoding,
               stop_after_first=True)

    chunk_decoder = ChunkDecoder(codec, prompt_codes, prompt, args.decoder_context)
    pieces: list[np.ndarray] = []
    decode_seconds: list[float] = []

    def write_chunk(chunk, ready: float) -> None:
        started = time.perf_counter()
        audio = chunk_decoder(chunk.speech.numpy())
        decode_seconds.append(time.perf_counter() - started)
        _write_wav(out / f"chunk_{len(pieces):04d}.wav", audio, codec.sample_rate)
        pieces.append(audio)
        log.info("chunk %d: %d tokens ready at %.3f s (%d text tokens read)", len(pieces) - 1, len(chunk.speech),
                 ready, chunk.text_tokens_read)

    source_name = "--text" if args.text is not None else "stdin"
    text_words = from_first_speakable(words(source), speakable, lambda text: nothing_to_speak(source_name, text))
    streamed = run_stream(model, at_most(bpe_tokens(text_words, synth.bpe.encode), synth.max_text_tokens),
                          prompt_text, prompt_speech,
                          seed=args.seed, d_llm=args.d_llm, decoding=decoding, on_chunk=write_chunk)
    fpl_a_run = run_stream(model, streamed["received"], prompt_text, prompt_speech, seed=args.seed,
                           decoding=decoding, stop_after_first=True)
    report = latency_summary(streamed, fpl_a_run, q=model.q, d_llm=args.d_llm)
    audio = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.float32)
    _write_wav(out / "stream.wav", audio, codec.sample_rate)
    report.update({
        "text_tokens": streamed["text_tokens"],
        "forward_passes": streamed["forward_passes"],
        "generated_frames": int(len(streamed["codes"])),
        "audio_seconds": len(audio) / codec.sample_rate,
        "token_seconds_streamed": streamed["seconds"],
        **({"first_packet_decode_seconds": decode_seconds[0]} if decode_seconds else {}),
        "chunks": streamed["chunks"],
    })
    atomic.write_text(out / "latency.json", json.dumps(report, indent=2, sort_keys=True) + "\n")
    return report


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
    from arnar.codec import CodecError
    from arnar.evaluate.audio import AudioError
    from arnar.synthesize import SynthesisInputError
    from arnar.text import TokenizerError
    from arnar.train import TrainError

    try:
        report = stream_main(args)
    except (StreamError, SynthesisInputError, CodecError, AudioError, TokenizerError, TrainError,
            FileNotFoundError) as err:
        print(f"arnar stream: error: {err}", file=sys.stderr)
        return 2
    print(json.dumps({k: v for k, v in report.items() if k != "chunks"}, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
