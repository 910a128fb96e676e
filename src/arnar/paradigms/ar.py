"""AR baseline: a VALL-E stage-one / CosyVoice-style speech-token language model.

Sequence (one running position range, causal attention)::

    <sos> x_ref x_gen <turn> c_ref c_gen <eos>

The model predicts every speech token and the final ``<eos>`` from all tokens before it; text
positions carry no loss (CosyVoice 2 LM). Training uses single utterances (their text, their
speech): prompt continuation at inference is exactly this layout with the prompt's text and
speech as a prefix; cross-sentence prompting puts another utterance of the speaker there.

Decoding: prefill the prefix into the KV cache in one pass, then one pass per generated token
(nucleus / top-k sampling with repetition-aware resampling, as CosyVoice 2), until ``<eos>``
is sampled, bounded by ``min_ratio`` / ``max_ratio`` speech tokens per target text token
(CosyVoice's length bounds).
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

import torch

from arnar.decode.sampling import ExponentialDraws, repetition_aware, sample_token
from arnar.paradigms import register_paradigm
from arnar.paradigms.base import (
    corrupt,
    decoding_options,
    EOS,
    IGNORE,
    PAD,
    SOS,
    TURN,
    Example,
    Generation,
    Paradigm,
    SynthesisRequest,
    Utterance,
)

DECODING = {"temperature": 1.0, "top_k": 25, "top_p": 0.8, "ras_window": 10, "ras_ratio": 0.1,
            "min_ratio": 2.0, "max_ratio": 20.0, "chunk_size": 15}
DRAW_BLOCK = 16  # decoding steps' exponential draws taken from the generator at once (ExponentialDraws)


def ar_sequence(vocab, text: torch.Tensor, speech: torch.Tensor) -> torch.Tensor:
    """``<sos> text <turn> speech <eos>`` in shared ids (text: BPE ids, speech: codes)."""
    return torch.cat([
        torch.tensor([SOS]), vocab.text(text), torch.tensor([TURN]), vocab.speech(speech), torch.tensor([EOS]),
    ])


@register_paradigm
class AR(Paradigm):
    name = "ar"

    def __init__(self, vocab, model, *, input_noise: float = 0.0, **options: Any):
        if not 0.0 <= float(input_noise) < 1.0:
            raise ValueError(f"ar option input_noise must lie in [0, 1), got {input_noise}")
        super().__init__(vocab, model, input_noise=float(input_noise), **options)
        self.input_noise = float(input_noise)

    def training_example(self, utt: Utterance, generator: torch.Generator) -> Example:
        sequence = ar_sequence(self.vocab, utt.text, utt.speech)
        inputs, targets = sequence[:-1], sequence[1:].clone()
        # the position holding <turn> predicts the first speech token: everything before it is text
        first_speech_target = len(utt.text) + 1
        targets[:first_speech_target] = IGNORE
        if self.input_noise > 0:
            inputs = self.corrupt_speech_inputs(inputs, first_speech_target + 1, generator)
        return Example(inputs, torch.arange(len(inputs)), targets)

    def corrupt_speech_inputs(self, inputs: torch.Tensor, first_speech_input: int,
                              generator: torch.Generator) -> torch.Tensor:
        """Replace a share ``input_noise`` of the speech tokens the model *reads* (never the ones
        it predicts) by uniform random codes. Not in the papers (they train teacher-forced): an
        option for small models, whose free-running output drifts once one token is wrong
        (teacher-forced vs free-running rungs of ``arnar ladder``); the model learns to predict
        the right next token from a history with errors in it."""
        inputs = inputs.clone()
        codes = inputs[first_speech_input:] - self.vocab.speech_offset
        inputs[first_speech_input:] = (corrupt(codes, self.input_noise, self.vocab.speech_size, generator)
                                       + self.vocab.speech_offset)
        return inputs

    def speech_or_eos(self, device) -> torch.Tensor:
        allowed = torch.zeros(self.vocab.size, dtype=torch.bool, device=device)
        allowed[self.vocab.speech_offset:] = True
        allowed[EOS] = True
        return allowed

    @torch.no_grad()
    def generate(self, request: SynthesisRequest, generator: torch.Generator, **decoding: Any) -> Generation:
        from arnar.nn import KVCache

        device = self.embed.weight.device
        item = _ItemDecoder(self, request, generator, decoding_options("AR", DECODING, decoding), device)
        prefix = item.prefix
        positions = torch.arange(len(prefix), len(prefix) + item.max_len, device=device)[None]
        started = time.perf_counter()
        cache = KVCache()
        logits = self.logits(prefix[None], torch.arange(len(prefix), device=device)[None], cache=cache)[:, -1]
        passes = 1
        with item:
            while True:
                running = item.step(logits)
                if len(item.generated) == item.chunk_size and item.first_packet_seconds is None:
                    item.first_packet_seconds = time.perf_counter() - started
                if not running:
                    break
                position = positions.narrow(1, len(item.generated) - 1, 1)
                logits = self.logits(torch.tensor([[item.generated[-1]]], device=device), position, cache=cache)[:, -1]
                passes += 1
        return item.result(passes, started)

    @torch.no_grad()
    def generate_batch(self, requests: list[SynthesisRequest], generators: list[torch.Generator],
                       **decoding: Any) -> list[Generation]:
        """:meth:`generate` of B requests in one forward pass per step: prefixes left-padded (pad
        keys masked, positions counted from each prefix's first real token), each item sampled
        from its own generator by the same per-item loop, finished items carried along until the
        last one stops. The codes equal batch-1 decoding's (exactly on the CPU,
        tests/test_decode_identical.py; batched matmuls could in principle flip a near-tie on other
        hardware); timing fields are the batch's (the
        papers' RTF and FPL are batch-1 figures: measure those with :meth:`generate`)."""
        from arnar.nn import KVCache

        if len(requests) != len(generators):
            raise ValueError(f"{len(requests)} requests but {len(generators)} generators")
        device = self.embed.weight.device
        opts = decoding_options("AR", DECODING, decoding)
        items = [_ItemDecoder(self, r, g, opts, device) for r, g in zip(requests, generators)]
        lengths = torch.tensor([len(item.prefix) for item in items], device=device)
        width, B = int(lengths.max()), len(items)
        ids = torch.full((B, width), PAD, dtype=torch.long, device=device)
        keys = torch.zeros(B, width, dtype=torch.bool, device=device)  # real (not padding) keys
        for b, item in enumerate(items):
            ids[b, width - len(item.prefix):] = item.prefix
            keys[b, width - len(item.prefix):] = True
        positions = (keys.long().cumsum(1) - 1).clamp(min=0)
        causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()
        # a padding query attends itself only (a row with no key would be NaN)
        mask = (causal[None] & keys[:, None, :]) | torch.eye(width, dtype=torch.bool, device=device)[None]
        started = time.perf_counter()
        cache = KVCache()
        logits = self.logits(ids, positions, mask[:, None], cache=cache)[:, -1]
        passes, running = 1, [True] * B
        with contextlib.ExitStack() as stack:
            for item in items:
                stack.enter_context(item)
            while True:
                tokens = torch.full((B, 1), PAD, dtype=torch.long, device=device)
                for b, item in enumerate(items):
                    if running[b]:
                        running[b] = item.step(logits[b:b + 1])
                        if len(item.generated) == item.chunk_size and item.first_packet_seconds is None:
                            item.first_packet_seconds = time.perf_counter() - started
                    if running[b]:
                        tokens[b, 0] = item.generated[-1]
                if not any(running):
                    break
                keys = torch.cat([keys, torch.tensor(running, device=device)[:, None]], dim=1)
                position = (lengths + torch.tensor([len(item.generated) - 1 for item in items], device=device))[:, None]
                step_mask = keys[:, None, None, :] | (torch.arange(keys.shape[1], device=device) == keys.shape[1] - 1)
                logits = self.logits(tokens, position, step_mask, cache=cache)[:, -1]
                passes += 1
        return [item.result(passes, started) for item in items]


class _ItemDecoder:
    """One item of AR decoding: its prefix, length bounds and sampling state, and the choice of
    the next token from the logits of the last position (:meth:`step`). Shared by
    :meth:`AR.generate` and :meth:`AR.generate_batch`, so both take the same decisions."""

    def __init__(self, model: AR, request: SynthesisRequest, generator: torch.Generator, opts: dict, device):
        self.model, self.request, self.generator = model, request, generator
        vocab = model.vocab
        text = torch.cat([request.prompt_text, request.text])
        self.prefix = ar_sequence(vocab, text, request.prompt_speech)[:-1].to(device)  # drop <eos>
        self.min_len = int(opts["min_ratio"] * len(request.text))
        self.max_len = max(self.min_len + 1, int(opts["max_ratio"] * len(request.text)))
        if request.target_frames is not None:  # a fixed length was asked for: no <eos> decision
            self.min_len = self.max_len = int(request.target_frames)
        # what the loop needs, made once: the restriction once <eos> is allowed (ids set to -inf).
        # While <eos> is not allowed the allowed ids are the speech codes, the ids from
        # speech_offset on: the sampler then reads them without a restricted copy.
        allowed = model.speech_or_eos(device)
        no_eos = allowed.clone()
        no_eos[EOS] = False
        self.disallowed, self.disallowed_eos = ~allowed, ~no_eos
        self.sampling = {"temperature": opts["temperature"], "top_k": opts["top_k"], "top_p": opts["top_p"]}
        self.window, self.ras_ratio = int(opts["ras_window"]), opts["ras_ratio"]
        self.chunk_size = int(opts["chunk_size"])
        self.generated: list[int] = []
        self.token: int | None = None
        self.first_packet_seconds: float | None = None  # an AR model can stream: the first chunk exists after chunk_size tokens
        # every draw of the loop is a row of exponentials (sampling and repetition-aware redraws):
        # from a CPU generator they are taken ahead in blocks of DRAW_BLOCK rows, the generator
        # left as if drawn row by row
        cpu_generator = generator.device.type == "cpu" if generator is not None else device.type == "cpu"
        size = vocab.size
        self.ahead = ExponentialDraws(generator, DRAW_BLOCK * size, expected=self.max_len * size) \
            if cpu_generator else None
        self.draws = None

    def __enter__(self) -> "_ItemDecoder":
        self.draws = self.ahead.__enter__() if self.ahead is not None else None
        return self

    def __exit__(self, *exc) -> None:
        if self.ahead is not None:
            self.ahead.__exit__(*exc)

    def step(self, logits: torch.Tensor) -> bool:
        """Choose the next token from ``logits`` [1, V]; False once the item is finished (``<eos>``
        sampled, or the length bound reached with this token)."""
        generated, generator, draws = self.generated, self.generator, self.draws
        eos_allowed = len(generated) >= self.min_len
        if eos_allowed:
            restricted = logits.masked_fill(self.disallowed, float("-inf"))
            token = sample_token(restricted, generator, draws=draws, **self.sampling)
        else:
            token = sample_token(logits, generator, allowed_from=self.model.vocab.speech_offset, draws=draws,
                                 **self.sampling)
        window = self.window
        if window > 0 and generated and generated[-window:].count(token) > self.ras_ratio * window:
            # repetition-aware sampling redraws from the whole (restricted) distribution
            step_logits = logits.masked_fill(self.disallowed if eos_allowed else self.disallowed_eos, float("-inf"))
            token = int(repetition_aware(torch.tensor([token]), step_logits, generated, generator,
                                         window=window, max_ratio=self.ras_ratio, token=token, draws=draws)[0])
        self.token = token
        if token == EOS:
            return False
        generated.append(token)
        return len(generated) < self.max_len

    def result(self, passes: int, started: float) -> Generation:
        speech = self.model.vocab.speech_codes(torch.tensor(self.generated, dtype=torch.long))
        first_packet = self.first_packet_seconds
        if first_packet is None:  # shorter than one chunk: the packet is the whole utterance
            first_packet = time.perf_counter() - started
        return Generation(speech, forward_passes=passes, first_packet_passes=min(passes, self.chunk_size),
                          info={"stopped_by_eos": self.token == EOS, "first_packet_seconds": first_packet,
                                "chunk_size": self.chunk_size, "text_tokens_waited": len(self.request.text)})
