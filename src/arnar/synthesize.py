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
"""

from __future__ import annotations

import hashlib
import inspect
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from arnar.paradigms.base import SynthesisRequest

log = logging.getLogger("arnar.synthesize")
# codecs whose tokens are a residual stack: single-stream paradigms (CoD) model its first quantizer
MULTI_CODEBOOK = {"offline_rvq", "dac"}
FIRST_PACKET_TOKENS = 15  # the decoder's chunk size at paper scale (syncspeech.txt 3.1), unless a paradigm says


def item_seed(seed: int, item_id: str) -> int:
    """A per-item seed independent of the order and subset of items synthesized."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{item_id}".encode()).digest()[:8], "little") & (2**63 - 1)


def continuation_text(target_text: str, prompt_text: str) -> str:
    """The part of ``target_text`` after the prompt's words (``prompt_text`` = the words that end
    inside the prompt, normalised, so count them rather than match their spelling)."""
    n_prompt = len(prompt_text.split())
    words = target_text.split()
    return " ".join(words[n_prompt:])


class Synthesizer:
    """A trained paradigm plus the codec and BPE model it was trained with."""

    def __init__(self, run_dir: str | os.PathLike, *, codec: str, codec_model: str | None, bpe_model: str | os.PathLike,
                 device: str = "cpu", decoding: dict[str, Any] | None = None, checkpoint: str = "best"):
        from arnar.codec import load_codec
        from arnar.text.bpe import BpeTokenizer
        from arnar.train import load_model

        self.run_dir = Path(run_dir)
        self.model, self.config = load_model(self.run_dir, checkpoint=checkpoint)
        self.model.to(device).eval()
        self.device = device
        options = {"model": codec_model} if codec_model else {}
        if codec in MULTI_CODEBOOK:  # the paradigms generate the first quantizer; decode from it alone
            options["n_codebooks"] = 1
        self.codec = load_codec(codec, **options)
        self.bpe = BpeTokenizer.load(bpe_model)
        self.decoding = dict(decoding or {})
        if self.codec.codebook_size != self.model.vocab.speech_size:
            raise ValueError(
                f"{self.run_dir}: the model was trained on {self.model.vocab.speech_size} speech codes, "
                f"codec {codec} has {self.codec.codebook_size}: wrong --codec for this run"
            )
        self._decode_takes_prompt_audio = "prompt_audio" in inspect.signature(self.codec.decode).parameters

    def text_ids(self, text: str, what: str) -> torch.Tensor:
        ids = self.bpe.encode(text)
        if not ids:
            raise ValueError(f"{what}: text {text!r} has no tokens after normalisation")
        return torch.tensor(ids, dtype=torch.long)

    def synthesize(self, text: str, prompt_audio: np.ndarray, prompt_text: str, sample_rate: int, *,
                   seed: int = 0, target_frames: int | None = None) -> tuple[np.ndarray, dict[str, Any]]:
        """Speak ``text`` in the voice of ``prompt_audio`` (mono float at ``sample_rate``, whose
        transcript is ``prompt_text``). Returns audio at ``self.codec.sample_rate`` and a timing
        record (token-stage and end-to-end seconds, forward passes)."""
        from arnar.evaluate.audio import resample

        start = time.perf_counter()
        prompt = resample(np.asarray(prompt_audio, dtype=np.float32), sample_rate, self.codec.sample_rate)
        prompt_codes = torch.as_tensor(self.codec.encode([prompt], self.codec.sample_rate)[0][0], dtype=torch.long)
        request = SynthesisRequest(self.text_ids(text, "text"), self.text_ids(prompt_text, "prompt text"),
                                   prompt_codes, target_frames=target_frames)
        prepare = getattr(self.model, "prepare_request", None)
        if callable(prepare):  # paradigms with inputs of their own (CoD: phonemes, speaker embedding)
            request = prepare(request, text=text, prompt_text=prompt_text, prompt_audio=prompt,
                              sample_rate=self.codec.sample_rate)
        generator = torch.Generator().manual_seed(seed)
        token_start = time.perf_counter()
        generation = self.model.generate(request, generator, **self.decoding)
        token_seconds = time.perf_counter() - token_start
        codes = generation.speech.cpu().numpy()[None].astype(np.int64)
        # first-packet latency (FPL-A): until the first chunk of tokens exists (streaming paradigms
        # say when; a non-streaming one after its last pass), plus decoding that chunk to audio
        info = generation.info
        chunk = int(info.get("chunk_size", FIRST_PACKET_TOKENS))
        decode_start = time.perf_counter()
        self._decode(codes[:, :chunk], prompt, prompt_codes)
        fpl_a = float(info.get("first_packet_seconds", token_seconds)) + time.perf_counter() - decode_start
        audio = self._decode(codes, prompt, prompt_codes)
        record = {
            "token_seconds": token_seconds,
            "total_seconds": time.perf_counter() - start,
            "forward_passes": generation.forward_passes,
            "generated_frames": int(codes.shape[1]),
            "fpl_a": fpl_a,
            # text tokens that had to arrive before the first packet (all of them unless streaming)
            "text_tokens_waited": int(info.get("text_tokens_waited", len(request.text))),
            **({"first_packet_passes": generation.first_packet_passes} if generation.first_packet_passes else {}),
            **{k: v for k, v in info.items() if isinstance(v, (int, float, str, bool)) and k != "text_tokens_waited"},
        }
        return np.asarray(audio, dtype=np.float32), record

    def _decode(self, codes: np.ndarray, prompt: np.ndarray, prompt_codes: torch.Tensor) -> np.ndarray:
        if codes.shape[1] == 0:
            return np.zeros(0, dtype=np.float32)
        if self._decode_takes_prompt_audio:  # the voice from the prompt audio (offline codec)
            return self.codec.decode([codes], prompt_audio=[prompt])[0]
        return self.codec.decode([codes], prompt=[prompt_codes.numpy()[None]])[0]


def synthesize_testlist(synth: Synthesizer, testlist: str | os.PathLike, prompts_dir: str | os.PathLike,
                        out_dir: str | os.PathLike, *, seed: int, progress: bool = True) -> dict[str, Any]:
    """Every item of a frozen test list -> ``out_dir/<item_id>.wav`` + ``out_dir/timing.jsonl``."""
    import soundfile as sf
    from tqdm import tqdm

    from arnar.evaluate.audio import load_mono
    from arnar.evaluate.testlists import read_testlist

    items = read_testlist(Path(testlist))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rate = synth.codec.sample_rate
    records = []
    for item in tqdm(items, desc=f"synthesize {out.parent.name}/{out.name}", disable=not progress, unit="item"):
        prompt, _ = load_mono(Path(prompts_dir) / f"{item.item_id}.wav", rate)
        continuing = item.task == "continuation"
        text = continuation_text(item.target_text, item.prompt_text) if continuing else item.target_text
        if not text.strip():
            raise ValueError(f"{testlist}: item {item.item_id} leaves no text to synthesize after its prompt")
        audio, record = synth.synthesize(text, prompt, item.prompt_text, rate, seed=item_seed(seed, item.item_id))
        if continuing:  # the evaluated utterance is the prompt followed by its continuation
            audio = np.concatenate([prompt.astype(np.float32), audio])
        tmp = out / f".tmp.{item.item_id}.wav"
        sf.write(str(tmp), audio, rate, subtype="PCM_16", format="WAV")
        os.replace(tmp, out / f"{item.item_id}.wav")
        records.append({"item_id": item.item_id, **record})
    tmp = out / ".tmp.timing.jsonl"
    tmp.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in records), encoding="utf-8")
    os.replace(tmp, out / "timing.jsonl")
    summary = {"items": len(records),
               "forward_passes_mean": float(np.mean([r["forward_passes"] for r in records])) if records else 0.0}
    log.info("synthesized %d items -> %s (%.1f forward passes per item)", len(records), out, summary["forward_passes_mean"])
    return summary
