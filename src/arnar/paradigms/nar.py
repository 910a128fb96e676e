"""NAR baseline: MaskGCT stage-one (text-to-semantic) style masked generative transformer.

Sequence (one running position range, bidirectional attention)::

    <sos> x_ref x_gen <turn> c_ref c_gen

where ``c_gen`` is partly replaced by ``<mask>``. Training takes one utterance, keeps a random
prefix of its speech (up to ``prompt_max`` of it) unmasked as the prompt, and masks
``ceil(gamma(u) * T_gen)`` random positions of the rest, ``u ~ U(0, 1)``, with the MaskGIT cosine
schedule ``gamma(u) = cos(pi u / 2)``; the loss is cross-entropy on the masked positions only.

Decoding (MaskGIT, Chang et al. 2022): all ``T_gen`` target positions start masked; each of
``steps`` passes predicts every masked position, then re-masks the least confident ones so that
``floor(T_gen * gamma(s / steps))`` stay masked after step ``s``; confidence is the sampled
token's probability plus Gumbel noise annealed to zero over the steps. ``T_gen`` is the
ground truth when given, else PALLE (arXiv:2504.10352) Eq. 11: ``T_ref * L_gen / L_ref``.

Positions (option ``text_positions``): ``sequence`` (the default, MaskGCT's) numbers the whole
sequence 0, 1, 2, ...; ``proportional`` (not in the paper) puts ``<sos>`` at 0, ``<turn>`` at 1,
speech frame ``t`` at ``2 + t`` and spreads the ``L`` text tokens over the same range, token ``i``
at ``2 + floor((i + 1/2) T / L)``, where ``T`` frames (prompt and target) carry them. Under RoPE a
frame then finds the text it speaks at a small relative offset instead of one it must infer from
the lengths: a uniform-rate alignment prior that uses only the total length the model is given
anyway, so the paradigm stays alignment-free.

Input noise (option ``input_noise``, not in the paper): in training a share of the target's
*unmasked* tokens is replaced by random codes before the model reads them (the loss stays on the
masked positions, against the true tokens). MaskGIT never re-masks a committed token, so from the
second step on the model reads its own earlier guesses, some of them wrong, where teacher-forced
training only ever shows it true ones; this is AR's ``input_noise`` for a masked model. The
prompt is never corrupted: at test time it is real speech.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from arnar.decode.sampling import sample_tokens
from arnar.decode.schedules import cosine_mask_ratio, masks_per_step, total_frames_estimate
from arnar.paradigms import register_paradigm
from arnar.paradigms.base import (
    decoding_options,
    IGNORE,
    MASK,
    SOS,
    TEXT_POSITIONS,
    TURN,
    Example,
    Generation,
    Paradigm,
    SynthesisRequest,
    Utterance,
    corrupt,
    padded_attention,
    right_padded,
    spread_positions,
)

DECODING = {"steps": 16, "temperature": 1.0, "top_k": 0, "top_p": 0.9, "noise": 1.0}


def nar_sequence(vocab, text: torch.Tensor, prompt: torch.Tensor, target: torch.Tensor,
                 masked: torch.Tensor) -> torch.Tensor:
    """``<sos> text <turn> prompt target`` in shared ids, target positions where ``masked`` is True
    replaced by ``<mask>``."""
    target_ids = torch.where(masked, torch.tensor(MASK), vocab.speech(target))
    return torch.cat([torch.tensor([SOS]), vocab.text(text), torch.tensor([TURN]), vocab.speech(prompt), target_ids])


def nar_positions(n_text: int, n_speech: int, text_positions: str = "sequence") -> torch.Tensor:
    """RoPE positions of ``<sos> text <turn> speech`` (``n_text`` and ``n_speech`` tokens): see the
    module docstring; ``proportional`` with n_text=4, n_speech=8 gives ``0, 3, 5, 7, 9, 1, 2..9``."""
    if text_positions == "sequence":
        return torch.arange(n_text + n_speech + 2)
    if text_positions != "proportional":
        raise ValueError(f"text_positions must be one of {TEXT_POSITIONS}, got {text_positions!r}")
    text = 2 + spread_positions(n_text, n_speech)
    return torch.cat([torch.tensor([0]), text, torch.tensor([1]), 2 + torch.arange(n_speech)])


@register_paradigm
class NAR(Paradigm):
    name = "nar"

    def __init__(self, vocab, model, *, prompt_max: float = 0.4, text_positions: str = "sequence",
                 input_noise: float = 0.0, **options: Any):
        if text_positions not in TEXT_POSITIONS:
            raise ValueError(f"NAR text_positions must be one of {TEXT_POSITIONS}, got {text_positions!r}")
        if not 0.0 <= float(input_noise) < 1.0:
            raise ValueError(f"nar option input_noise must lie in [0, 1), got {input_noise}")
        super().__init__(vocab, model, prompt_max=prompt_max, text_positions=text_positions,
                         input_noise=float(input_noise), **options)
        self.prompt_max = prompt_max
        self.text_positions = text_positions
        self.input_noise = float(input_noise)

    def training_example(self, utt: Utterance, generator: torch.Generator) -> Example:
        T = utt.num_frames
        # prompt: a prefix of up to prompt_max of the utterance; at least one target frame
        n_prompt = min(int(torch.rand((), generator=generator) * self.prompt_max * T), T - 1)
        n_target = T - n_prompt
        u = float(torch.rand((), generator=generator))
        n_masked = max(1, math.ceil(cosine_mask_ratio(u) * n_target))
        order = torch.randperm(n_target, generator=generator)
        masked = torch.zeros(n_target, dtype=torch.bool)
        masked[order[:n_masked]] = True
        prompt, target = utt.speech[:n_prompt], utt.speech[n_prompt:]
        read = target
        if self.input_noise > 0:  # drawn only when set, so runs without it keep their draws
            read = corrupt(target, self.input_noise, self.vocab.speech_size, generator)
        inputs = nar_sequence(self.vocab, utt.text, prompt, read, masked)
        targets = torch.full_like(inputs, IGNORE)
        start = len(inputs) - n_target
        targets[start:][masked] = self.vocab.speech(target[masked])
        S = len(inputs)
        positions = nar_positions(len(utt.text), T, self.text_positions)
        return Example(inputs, positions, targets, torch.ones(S, S, dtype=torch.bool))

    @torch.no_grad()
    def generate(self, request: SynthesisRequest, generator: torch.Generator, **decoding: Any) -> Generation:
        return self.generate_batch([request], [generator], **decoding)[0]

    @torch.no_grad()
    def generate_batch(self, requests: list[SynthesisRequest], generators: list[torch.Generator],
                       **decoding: Any) -> list[Generation]:
        """MaskGIT decoding of B requests, one backbone pass per step for all of them: sequences
        right-padded (padding keys masked), every item on its own schedule over the same number of
        steps, sampled and re-masked from its own generator exactly as alone (B = 1 is
        :meth:`generate`)."""
        if len(requests) != len(generators):
            raise ValueError(f"{len(requests)} requests but {len(generators)} generators")
        opts = decoding_options("NAR", DECODING, decoding)
        device = self.embed.weight.device
        steps = int(opts["steps"])
        sampling = {"temperature": opts["temperature"], "top_k": opts["top_k"], "top_p": opts["top_p"]}
        sequences, position_rows, starts, lengths, schedules = [], [], [], [], []
        for request in requests:
            n_target = request.target_frames or total_frames_estimate(
                len(request.prompt_speech), len(request.prompt_text), len(request.text))
            text = torch.cat([request.prompt_text, request.text])
            sequence = nar_sequence(self.vocab, text, request.prompt_speech, torch.zeros(n_target, dtype=torch.long),
                                    torch.ones(n_target, dtype=torch.bool))
            sequences.append(sequence)
            position_rows.append(nar_positions(len(text), len(request.prompt_speech) + n_target, self.text_positions))
            starts.append(len(sequence) - n_target)
            lengths.append(n_target)
            schedules.append(masks_per_step(n_target, steps))
        batch, keys = right_padded(sequences, device)
        positions, _ = right_padded(position_rows, device, pad=0)  # a padding position is never attended
        attention = padded_attention(keys)
        # each item's masked target positions, ascending (the order its sampler's draws follow),
        # kept as indices from step to step instead of a mask searched again every step
        rows = [torch.arange(n, device=device) for n in lengths]
        passes = 0
        for step in range(1, steps + 1):
            hidden = self.backbone(self.embed(batch), positions, attention)
            passes += 1
            for b, generator in enumerate(generators):
                target = batch[b, starts[b]:starts[b] + lengths[b]]  # a view: writing it updates the batch
                keep_masked = schedules[b][step - 1]
                # predict the masked positions only
                codes, probs = sample_tokens(self.speech_logits(hidden[b, starts[b] + rows[b]]), generator, **sampling)
                target[rows[b]] = codes + self.vocab.speech_offset
                # re-mask the least confident fresh predictions; committed tokens are never re-masked.
                # Confidence: log-probability plus Gumbel noise annealed to zero over the steps.
                annealing = opts["noise"] * (1.0 - step / steps)
                gumbel = -torch.log(-torch.log(torch.rand(len(rows[b]), generator=generator).clamp_min(1e-20)))
                if keep_masked > 0:
                    confidence = torch.log(probs.clamp_min(1e-20)) + annealing * gumbel.to(device)
                    rows[b] = rows[b][torch.topk(confidence, keep_masked, largest=False).indices].sort().values
                    target[rows[b]] = MASK
                else:
                    rows[b] = rows[b][:0]
        return [Generation(self.vocab.speech_codes(batch[b, starts[b]:starts[b] + lengths[b]].cpu()),
                           forward_passes=passes,
                           info={"target_frames": lengths[b], "length_from": "given" if r.target_frames else "eq11"})
                for b, r in enumerate(requests)]

    def speech_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[..., dim]`` -> ``[..., speech_size]``: the head's speech rows only (only speech codes
        are ever sampled), ``hidden @ W_speech^T``."""
        return hidden @ self.head.weight[self.vocab.speech_offset:].T

    def logits(self, input_ids, position_ids, attention_mask=None, cache=None, cond=None):
        if attention_mask is None:  # this paradigm is bidirectional everywhere
            B, S = input_ids.shape
            attention_mask = torch.ones(B, S, S, dtype=torch.bool, device=input_ids.device)
        return super().logits(input_ids, position_ids, attention_mask, cache, cond)
