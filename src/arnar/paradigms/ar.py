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
    decoding_options,
    EOS,
    IGNORE,
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
        n_speech = len(inputs) - first_speech_input
        hit = torch.rand(n_speech, generator=generator) < self.input_noise
        noise = torch.randint(self.vocab.speech_size, (n_speech,), generator=generator) + self.vocab.speech_offset
        inputs[first_speech_input:] = torch.where(hit, noise, inputs[first_speech_input:])
        return inputs

    def speech_or_eos(self, device) -> torch.Tensor:
        allowed = torch.zeros(self.vocab.size, dtype=torch.bool, device=device)
        allowed[self.vocab.speech_offset:] = True
        allowed[EOS] = True
        return allowed

    @torch.no_grad()
    def generate(self, request: SynthesisRequest, generator: torch.Generator, **decoding: Any) -> Generation:
        opts = decoding_options("AR", DECODING, decoding)
        from arnar.nn import KVCache

        device = self.embed.weight.device
        text = torch.cat([request.prompt_text, request.text])
        prefix = ar_sequence(self.vocab, text, request.prompt_speech)[:-1].to(device)  # drop <eos>
        min_len = int(opts["min_ratio"] * len(request.text))
        max_len = max(min_len + 1, int(opts["max_ratio"] * len(request.text)))
        if request.target_frames is not None:  # a fixed length was asked for: no <eos> decision
            min_len = max_len = int(request.target_frames)
        allowed = self.speech_or_eos(device)
        no_eos = allowed.clone()
        no_eos[EOS] = False
        # what the loop needs, made once: the restriction once <eos> is allowed (ids set to -inf)
        # and the positions of the generated tokens (token n, 0-based, is the input at position
        # len(prefix) + n). While <eos> is not allowed the allowed ids are the speech codes, the
        # ids from speech_offset on: the sampler then reads them without a restricted copy.
        disallowed, disallowed_eos = ~allowed, ~no_eos
        positions = torch.arange(len(prefix), len(prefix) + max_len, device=device)[None]
        sampling = {"temperature": opts["temperature"], "top_k": opts["top_k"], "top_p": opts["top_p"]}
        window, ras_ratio = int(opts["ras_window"]), opts["ras_ratio"]

        started = time.perf_counter()
        first_packet_seconds = None  # an AR model can stream: the first chunk exists after chunk_size tokens
        cache = KVCache()
        logits = self.logits(prefix[None], torch.arange(len(prefix), device=device)[None], cache=cache)[:, -1]
        passes, generated = 1, []
        # every draw of the loop is a row of exponentials (sampling and repetition-aware redraws):
        # from a CPU generator they are taken ahead in blocks of DRAW_BLOCK rows, the generator
        # left as if drawn row by row
        cpu_generator = generator.device.type == "cpu" if generator is not None else device.type == "cpu"
        ahead = ExponentialDraws(generator, DRAW_BLOCK * self.vocab.size, expected=max_len * self.vocab.size) \
            if cpu_generator else None
        with ahead or contextlib.nullcontext() as draws:
            while True:
                eos_allowed = len(generated) >= min_len
                if eos_allowed:
                    restricted = logits.masked_fill(disallowed, float("-inf"))
                    token = sample_token(restricted, generator, draws=draws, **sampling)
                else:
                    token = sample_token(logits, generator, allowed_from=self.vocab.speech_offset, draws=draws,
                                         **sampling)
                if window > 0 and generated and generated[-window:].count(token) > ras_ratio * window:
                    # repetition-aware sampling redraws from the whole (restricted) distribution
                    step_logits = logits.masked_fill(disallowed if eos_allowed else disallowed_eos, float("-inf"))
                    token = int(repetition_aware(torch.tensor([token]), step_logits, generated, generator,
                                                 window=window, max_ratio=ras_ratio, token=token, draws=draws)[0])
                if token == EOS:
                    break
                generated.append(token)
                if len(generated) == opts["chunk_size"]:
                    first_packet_seconds = time.perf_counter() - started
                if len(generated) >= max_len:
                    break
                position = positions.narrow(1, len(generated) - 1, 1)
                logits = self.logits(torch.tensor([[token]], device=device), position, cache=cache)[:, -1]
                passes += 1
        speech = self.vocab.speech_codes(torch.tensor(generated, dtype=torch.long))
        if first_packet_seconds is None:  # shorter than one chunk: the packet is the whole utterance
            first_packet_seconds = time.perf_counter() - started
        return Generation(speech, forward_passes=passes, first_packet_passes=min(passes, int(opts["chunk_size"])),
                          info={"stopped_by_eos": token == EOS, "first_packet_seconds": first_packet_seconds,
                                "chunk_size": int(opts["chunk_size"]), "text_tokens_waited": len(request.text)})
