"""What every paradigm shares: the token layout, one training example, batching, the interface.

A paradigm (``arnar.paradigms.<name>``) is one module that says only what is different about it:

* ``training_example(utt, generator)``: how an utterance becomes one training sequence, its
  attention mask and its targets (an :class:`Example`);
* ``loss(batch)``: its objective, as a *sum* over target tokens plus the count of those tokens,
  so that the engine can normalise over the whole global batch (all gradient-accumulation
  micro-batches and all DDP ranks) and a 2-process run makes exactly the update of one process
  on the merged batch;
* ``generate(...)``: its decoding loop.

Everything else (the backbone, the optimiser, batching, checkpoints, DDP, logging) is shared:
:mod:`arnar.nn` and :mod:`arnar.train`.

Token layout. Text (BPE) and speech tokens live in one id space so that one embedding table and
one backbone serve every paradigm (the CosyVoice 2 LM layout, where the LLM's text vocabulary and
the speech codes share the input embedding matrix)::

    0 .. N_SPECIAL-1                      special tokens (PAD, SOS, TURN, EOS, MASK, ...)
    text_offset .. text_offset+V_text-1   BPE ids
    speech_offset .. +V_speech-1          speech codes of the (first) codebook

Positions are explicit (``position_ids``) so that a paradigm can give text and speech separate
position ranges (SyncSpeech, PALLE) or one running range (AR).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

# ----------------------------------------------------------------------------- token layout

PAD, SOS, TURN, EOS, MASK, SPEECH_BOS = range(6)  # TURN: "speech follows" (CosyVoice's task id)
N_SPECIAL = 8  # two ids spare for paradigm-specific markers
SPECIAL_NAMES = {PAD: "<pad>", SOS: "<sos>", TURN: "<turn>", EOS: "<eos>", MASK: "<mask>",
                 SPEECH_BOS: "<speech_bos>", 6: "<spare6>", 7: "<spare7>"}
IGNORE = -100  # target value that contributes no loss (torch cross_entropy's ignore_index)


@dataclass(frozen=True)
class Vocab:
    """The shared id space: specials, then text, then speech codes."""

    text_size: int
    speech_size: int

    @property
    def text_offset(self) -> int:
        return N_SPECIAL

    @property
    def speech_offset(self) -> int:
        return N_SPECIAL + self.text_size

    @property
    def size(self) -> int:
        return N_SPECIAL + self.text_size + self.speech_size

    def text(self, ids: torch.Tensor) -> torch.Tensor:
        """BPE ids -> shared ids."""
        return ids.long() + self.text_offset

    def speech(self, codes: torch.Tensor) -> torch.Tensor:
        """Speech codes -> shared ids."""
        return codes.long() + self.speech_offset

    def speech_codes(self, ids: torch.Tensor) -> torch.Tensor:
        """Shared ids (all speech) -> speech codes."""
        return ids.long() - self.speech_offset

    def is_speech(self, ids: torch.Tensor) -> torch.Tensor:
        return (ids >= self.speech_offset) & (ids < self.size)

    def to_dict(self) -> dict[str, int]:
        return {"text_size": self.text_size, "speech_size": self.speech_size}


# ----------------------------------------------------------------------------- data

@dataclass
class Utterance:
    """One training/evaluation utterance as the paradigms see it.

    ``text``: BPE ids [L] (not offset); ``speech``: codes [T] of the first codebook (all the
    single-stream paradigms use; CoD's levels are derived from them); ``ends``: the frame index
    one past the last frame of each BPE token, a_n of SyncSpeech Eq. 1 (``ends[-1] == T``),
    from the forced alignment; ``None`` where no alignment exists. ``acoustic``: codes
    ``[K - 1, T]`` of the codebooks after the first, for a paradigm that generates ``K`` codebooks
    of an RVQ stack (option ``codebooks``, CoD); ``None`` for the others.
    """

    utt_id: str
    speaker: str
    text: torch.Tensor
    speech: torch.Tensor
    ends: torch.Tensor | None = None
    # per-utterance inputs some paradigms add (e.g. phoneme ids, a speaker embedding), from a
    # features file built by the DAG (arnar.train.data.load_utterances(features=...))
    features: dict[str, torch.Tensor] = field(default_factory=dict)
    acoustic: torch.Tensor | None = None

    @property
    def num_frames(self) -> int:
        return int(self.speech.shape[-1])


@dataclass
class Example:
    """One training sequence of a paradigm.

    ``input_ids`` [S] shared ids; ``position_ids`` [S]; ``attention_mask`` [S, S] bool, True where
    query i may attend key j (None: causal); ``targets`` [S] shared ids or IGNORE, aligned with
    the *output* at each position (a paradigm that predicts the next token shifts itself);
    ``extras``: any further per-position ([S, ...]) or per-sequence tensors a paradigm needs
    (e.g. a diffusion time, a level id), padded by :func:`collate` along dim 0 when their first
    dim is S and stacked otherwise.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    targets: torch.Tensor
    attention_mask: torch.Tensor | None = None
    extras: dict[str, torch.Tensor] = field(default_factory=dict)

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])


@dataclass
class Batch:
    """Padded examples. ``attention_mask`` [B, S, S] bool; padded positions attend to themselves
    only (so that no attention row is empty) and are attended by nothing; targets there IGNORE."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    targets: torch.Tensor
    attention_mask: torch.Tensor
    lengths: torch.Tensor
    extras: dict[str, torch.Tensor] = field(default_factory=dict)

    def to(self, device: torch.device | str) -> "Batch":
        return Batch(
            self.input_ids.to(device), self.position_ids.to(device), self.targets.to(device),
            self.attention_mask.to(device), self.lengths.to(device),
            {k: v.to(device) for k, v in self.extras.items()},
        )

    @property
    def n_targets(self) -> int:
        return int((self.targets != IGNORE).sum())


def causal_mask(n: int) -> torch.Tensor:
    """[n, n] bool, True on and below the diagonal."""
    return torch.ones(n, n, dtype=torch.bool).tril()


def collate(examples: list[Example]) -> Batch:
    """Right-pad a list of examples to one batch (see :class:`Batch` for the padding rule)."""
    if not examples:
        raise ValueError("collate: empty list of examples")
    lengths = torch.tensor([len(e) for e in examples])
    B, S = len(examples), int(lengths.max())
    input_ids = torch.full((B, S), PAD, dtype=torch.long)
    position_ids = torch.zeros((B, S), dtype=torch.long)
    targets = torch.full((B, S), IGNORE, dtype=torch.long)
    mask = torch.eye(S, dtype=torch.bool).repeat(B, 1, 1)
    extras: dict[str, Any] = {}
    for b, e in enumerate(examples):
        n = len(e)
        input_ids[b, :n] = e.input_ids
        position_ids[b, :n] = e.position_ids
        targets[b, :n] = e.targets
        mask[b, :n, :n] = causal_mask(n) if e.attention_mask is None else e.attention_mask
        for key, value in e.extras.items():
            if value.dim() >= 1 and value.shape[0] == n:
                if key not in extras:
                    extras[key] = torch.zeros((B, S, *value.shape[1:]), dtype=value.dtype)
                extras[key][b, :n] = value
            else:
                extras.setdefault(key, []).append(value)
    extras = {k: (torch.stack(v) if isinstance(v, list) else v) for k, v in extras.items()}
    return Batch(input_ids, position_ids, targets, mask, lengths, extras)


def spread_positions(n_text: int, n_speech: int) -> torch.Tensor:
    """Positions of ``n_text`` text tokens spread evenly over ``n_speech`` speech positions
    ``0 .. n_speech - 1``: token ``i`` at ``floor((i + 1/2) n_speech / n_text)`` (4 over 8: 1, 3, 5, 7).
    The alignment-free paradigms' ``text_positions: proportional`` option (NAR, CoD; not in the
    papers): under RoPE a speech position then meets the text it speaks at a small relative offset
    if speech runs at a uniform rate, a prior that needs only the total length they are given."""
    i = torch.arange(n_text)
    return torch.div((2 * i + 1) * n_speech, 2 * max(n_text, 1), rounding_mode="floor")


TEXT_POSITIONS = ("sequence", "proportional")  # the papers' running range | spread_positions


def corrupt(tokens: torch.Tensor, rate: float, n_codes: int, generator: torch.Generator) -> torch.Tensor:
    """Each token independently replaced, with probability ``rate``, by a code drawn uniformly from
    ``0 .. n_codes - 1`` (CoD III-B: "randomly replacing a portion of these tokens with randomly
    chosen indices within the vocabulary"; the ``input_noise`` of AR and NAR, not in their papers).
    A replacement can draw the same code, so the share of tokens that *change* is
    ``rate * (1 - 1 / n_codes)``."""
    hit = torch.rand(tokens.shape, generator=generator) < rate
    random_codes = torch.randint(n_codes, tokens.shape, generator=generator)
    return torch.where(hit, random_codes, tokens)


def right_padded(sequences: list[torch.Tensor], device: torch.device | str | None = None,
                 pad: int = PAD) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch of a bidirectional paradigm's decoding: ``sequences`` (1-D ids) right-padded
    with ``pad`` to ``[B, width]``, and ``keys`` ``[B, width]`` bool, True at each item's real
    positions (give it to :func:`padded_attention`)."""
    width = max(len(seq) for seq in sequences)
    batch = torch.full((len(sequences), width), pad, dtype=torch.long)
    keys = torch.zeros(len(sequences), width, dtype=torch.bool)
    for b, seq in enumerate(sequences):
        batch[b, :len(seq)], keys[b, :len(seq)] = seq, True
    return batch.to(device), keys.to(device)


def padded_attention(keys: torch.Tensor) -> torch.Tensor:
    """``[B, S, S]`` bidirectional attention over each item's real positions (``keys`` ``[B, S]``
    of :func:`right_padded`): no query attends a padding key, except a padding query itself (a row
    with no key would be NaN). A real position's output is then that of the item decoded alone, up
    to float rounding (kernels may sum in another order for another shape; bounded in
    tests/test_decode_identical.py, where the decisions taken from it are the batch-1 ones)."""
    width = keys.shape[1]
    return keys[:, None, :] | torch.eye(width, dtype=torch.bool, device=keys.device)[None]


# ----------------------------------------------------------------------------- synthesis I/O

@dataclass
class SynthesisRequest:
    """What a paradigm's decoding loop gets: the target text, the prompt (transcript + speech
    codes of the first codebook) and, optionally, the number of frames to generate (NAR paradigms
    that are given the ground-truth length; otherwise they estimate it, PALLE (arXiv:2504.10352) Eq. 11)."""

    text: torch.Tensor  # BPE ids [L] of the text to speak
    prompt_text: torch.Tensor  # BPE ids of the prompt's transcript
    prompt_speech: torch.Tensor  # codes [T_p]
    target_frames: int | None = None
    text_ends: torch.Tensor | None = None  # a_n of the target (oracle durations), if a paradigm uses them
    # inputs a paradigm derives itself in its prepare_request() hook (e.g. phonemes, a speaker embedding)
    features: dict[str, Any] = field(default_factory=dict)
    # codes [K - 1, T_p] of the prompt's codebooks after the first, for a paradigm that generates K
    # codebooks (option ``codebooks``); None for the others
    prompt_acoustic: torch.Tensor | None = None


@dataclass
class Generation:
    """A decoding loop's result: generated codes (prompt excluded) and what it cost."""

    speech: torch.Tensor  # codes [T], or [K, T] from a paradigm that generates K codebooks
    forward_passes: int  # sequential backbone calls (the papers' NFE / step count)
    first_packet_passes: int | None = None  # passes before the first audio packet could be emitted
    info: dict[str, Any] = field(default_factory=dict)


@dataclass
class LossOutput:
    """``loss_sum`` summed over target tokens, ``n_targets`` their count (the engine divides by the
    global count), ``metrics`` detached scalars for logging (e.g. accuracy numerators)."""

    loss_sum: torch.Tensor
    n_targets: torch.Tensor
    metrics: dict[str, torch.Tensor] = field(default_factory=dict)


# ----------------------------------------------------------------------------- the interface

class Paradigm(torch.nn.Module):
    """Shared parts of every paradigm: one embedding table over the shared vocabulary, the
    backbone (:class:`arnar.nn.Transformer`), one output head. Subclasses implement
    :meth:`training_example` and :meth:`generate`, and override :meth:`forward` when their loss
    is not token cross-entropy over ``targets``."""

    name: str = ""

    def __init__(self, vocab: Vocab, model: Any, **options: Any):
        super().__init__()
        from arnar.nn import Transformer, TransformerConfig

        cfg = model if isinstance(model, TransformerConfig) else TransformerConfig.from_dict(dict(model))
        self.vocab = vocab
        self.model_config = cfg
        self.options = dict(options)
        self.embed = torch.nn.Embedding(vocab.size, cfg.dim)
        self.backbone = Transformer(cfg)
        self.head = torch.nn.Linear(cfg.dim, vocab.size, bias=False)
        torch.nn.init.normal_(self.embed.weight, std=0.02)
        torch.nn.init.normal_(self.head.weight, std=0.02)

    # -- shared computation
    def logits(self, input_ids: torch.Tensor, position_ids: torch.Tensor,
               attention_mask: torch.Tensor | None = None, cache: Any = None,
               cond: torch.Tensor | None = None) -> torch.Tensor:
        """[B, S] ids -> [B, S, vocab.size] logits."""
        hidden = self.backbone(self.embed(input_ids), position_ids, attention_mask, cache=cache, cond=cond)
        return self.head(hidden)

    def forward(self, batch: Batch) -> LossOutput:
        """Default objective: cross-entropy summed over the positions whose target is not IGNORE."""
        logits = self.logits(batch.input_ids, batch.position_ids, batch.attention_mask,
                             cond=batch.extras.get("cond"))
        return token_cross_entropy(logits, batch.targets)

    # -- what each paradigm says
    def training_example(self, utt: Utterance, generator: torch.Generator) -> Example:
        raise NotImplementedError

    @torch.no_grad()
    def generate(self, request: SynthesisRequest, generator: torch.Generator, **decoding: Any) -> Generation:
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        """Size and settings for the report."""
        return {"paradigm": self.name, "parameters": sum(p.numel() for p in self.parameters()),
                "model": self.model_config.to_dict(), "options": self.options, "vocab": self.vocab.to_dict()}


def decoding_options(paradigm: str, defaults: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """A paradigm's decoding defaults overridden by ``given``; an unknown option is an error (a
    typo must not silently decode with the default)."""
    unknown = set(given) - set(defaults)
    if unknown:
        raise ValueError(f"{paradigm} decoding: unknown options {sorted(unknown)}; known: {sorted(defaults)}")
    return {**defaults, **given}


def token_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> LossOutput:
    """Summed cross-entropy and accuracy over positions with a target (``targets != IGNORE``)."""
    keep = targets != IGNORE
    picked = logits[keep].float()
    gold = targets[keep]
    loss_sum = torch.nn.functional.cross_entropy(picked, gold, reduction="sum")
    correct = (picked.argmax(-1) == gold).sum().detach()
    return LossOutput(loss_sum, keep.sum(), {"correct": correct.float()})
