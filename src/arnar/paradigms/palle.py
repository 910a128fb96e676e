"""PALLE (arXiv:2504.10352): pseudo-autoregressive span generation (stage one) + NAR refinement (stage two).

Both stages are the same network (Sec. 4.1, Fig. 3a), trained separately:

    speech ids [T] (codes; <mask> where masked) ─ embed ─────────────── + a_s PE ─ dropout ─┐
    text ids [T] (x_ref x_gen <pad> ... <pad>)  ─ embed ─ ConvNeXt V2 ─ + a_t PE ─ dropout ─┴─ concat
      ─ Linear(2D -> D) ─ + conv positional embedding (kernel 7) ─ bidirectional Transformer ─ head

The text is padded with ``<pad>`` to the speech length (Eqs. 6, 13) so the two streams fuse along
the feature dimension (E2 TTS; option ``text_layout: stretch``, not in the paper, spreads it
evenly over the frames instead, :func:`stretched_text`); ``PE`` is a sinusoidal encoding with a learnable scale per stream.
The shared backbone also applies RoPE at the same positions (arnar.nn.Transformer always does):
one more relative-position signal, on top of the paper's two.

Layout (option ``layout``): the above is ``fused`` (default, the paper's Fig. 3a network).
``concat`` (not the paper's network; its Discussion says pseudo-autoregressive generation fits
temporal concatenation, as in MaskGCT, as well as feature fusion, as in E2 TTS) puts the text in
front of the speech instead: each stage reads ``x_ref x_gen c_1 .. c_T`` (text shared ids, then
codes or ``<mask>``) at RoPE positions ``0 .. L+T-1``, bidirectional, through embed, backbone and
head only (no ConvNeXt, fusion, sinusoidal or convolutional position embeddings), and the logits
are read at the speech positions. That is the AR baseline's layout, with AR's parameter names
(``stage_one.embed.weight``, ``stage_one.backbone.*``, ``stage_one.head.weight``, the same for
stage two), so a run can start both stages from the trained AR run (``train.init_matching``).
:func:`stage_input` is where the two layouts differ; everything below (masks, losses, decoding)
is the same for both. ``text_layout`` is an option of ``fused`` only.

Readout (option ``readout``, ``concat`` only): ``own`` (default, the paper's masked prediction)
reads frame ``t``'s logits at frame ``t``'s own input position, which holds ``<mask>``.
``previous`` (not in the paper) reads them one position earlier, and the input is AR's
``<sos> text <turn> speech``: frame ``t`` is predicted from the position that holds frame ``t-1``
(``<turn>`` for the first frame), exactly as AR predicts its next token. With ``own``, a stage one
started from AR must relearn its head one position over (its first loss is near a uniform
guess's); with ``previous`` the first masked frame is AR's own prediction from the start, with
bidirectional attention over the ``<mask>`` frames after it the only change.

Training (one :class:`Example` per utterance: ``input_ids`` = the speech stream, ``extras["text_ids"]``
= the padded text stream (``concat``: ``input_ids`` = text then speech, no extras), all-True attention):

* stage one (Eqs. 7-9): the first ``floor(0.3 T)`` frames are a prompt; a span start
  ``s ~ U{floor(0.3T), ..., T - floor(0.1T) - 1}`` is drawn, every frame from ``s`` on is masked,
  and the loss is on the left-most ``k = floor(0.1 T)`` masked frames only (option
  ``span_scoring: suffix``, not in the paper: on every masked frame).
* stage two (Eq. 10): frames after ``floor(0.3 T)`` are masked independently with ``p = 0.1``; the
  loss is on the masked frames.
* input noise (option ``input_noise``, not in the paper; default 0 = the paper's true history):
  a share of the *unmasked* frames after ``floor(0.3 T)`` is replaced by random codes before the
  network reads them; the targets stay the true codes. At test time those frames are the model's
  own: stage one reads the spans it committed, stage two reads stage one's output. This is AR's
  ``input_noise`` for a span model; the first ``floor(0.3 T)`` frames stand for the prompt, real
  speech at test time, and are never corrupted.

Decoding (Sec. 4.3): ``T_gen`` from the request or Eq. 11, times ``duration_multiplier``
(Fig. 5). Two rules, each with the paper's as the default and the project's earlier one as a named
option (decoding options; the report labels a system decoded with the other one):

* stage one (Eq. 14), ``stage_one_rule``: each pass commits the left-most span of the still-masked
  frames. ``"fixed_ratio"`` (default): ``k' = min(floor(T / steps), N_left)`` with ``T`` the total
  length, prompt + target (5.1: ``floor(0.01 T)`` at 100 steps), so a 10 s target after a 3 s prompt
  at 25 Hz takes 84 passes, not 100. ``"even_split"``: the target split evenly over exactly
  ``steps`` passes. See :func:`stage_one_spans`.
* stage two (Eqs. 15-16), ``refine_rule``, ``refine_steps`` steps, never the same frame twice.
  ``"rescore"`` (default): every step, the stage-two network scores the current sequence; the
  least confident ``gamma`` quantile of the frames not yet refined is re-masked and re-predicted,
  two passes a step. ``"stage_one_confidence"``: the frames are ranked once by the confidence stage
  one committed them with, one pass a step. See :meth:`PALLE.refine`.

Both networks live in this one module, ``stage_one`` and ``stage_two``; option ``stage`` says
which one trains (the other is frozen). A stage-2 run starts from the stage-1 run's weights
(``train.init_from``), and loading a state dict whose stage two was never initialised copies
stage one into stage two (Sec. 5.1: "the second stage is fine-tuned based on the first").
The stage-2 checkpoint therefore holds both trained networks and decodes both stages.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from arnar.decode.sampling import sample_tokens
from arnar.decode.schedules import total_frames_estimate
from arnar.paradigms import register_paradigm
from arnar.paradigms.base import (
    corrupt,
    decoding_options,
    IGNORE,
    MASK,
    PAD,
    SOS,
    TURN,
    Batch,
    Example,
    Generation,
    LossOutput,
    Paradigm,
    SynthesisRequest,
    Utterance,
    padded_attention,
    right_padded,
    token_cross_entropy,
)

# PALLE (arXiv:2504.10352) Sec. 5.1 "Inference Details": 100 stage-one steps of floor(0.01 T) frames, 7 stage-two steps
# at gamma = 0.05, top-p with a small p (0.2-0.35) slightly better than greedy (temperature 0).
# stage_one_rule: "fixed_ratio" (Eq. 14, k' = floor(r' T) with r' = r, or 1 / steps when r is None)
#   or "even_split" (the target split evenly over exactly ``steps`` passes); see stage_one_spans.
# refine_steps None: 7 for a stage-2 model, 0 for a stage-1 model (whose stage two is untrained).
# refine_rule: "rescore" (Eqs. 15-16, stage two scores the current sequence every step) or
#   "stage_one_confidence" (frames ranked once by stage one's confidence); see PALLE.refine.
DECODING = {"steps": 100, "stage_one_rule": "fixed_ratio", "r": None, "refine_steps": None,
            "refine_rule": "rescore", "gamma": 0.05, "top_p": 0.3, "temperature": 1.0,
            "duration_multiplier": 1.0}
STAGE_ONE_RULES = ("fixed_ratio", "even_split")
REFINE_RULES = ("rescore", "stage_one_confidence")
REFINE_STEPS = 7
PINNED = 1.0  # confidence given to refined frames (Eq. 16 ranks log-probabilities <= 0): never again lowest

# floor(ratio * T) with a float ratio: 0.7 * 90 is 62.99999999999999 in binary floating point
_EPS = 1e-9


def _floor(ratio: float, n: int) -> int:
    return math.floor(ratio * n + _EPS)


# ----------------------------------------------------------------------------- sequences and masks

def padded_text(vocab, text: torch.Tensor, length: int) -> torch.Tensor:
    """BPE ids -> shared ids padded with ``<pad>`` to ``length`` (Eqs. 6, 13).

    A text longer than the speech cannot be padded; it is cut to ``length`` (F5-TTS does the same).
    With a 25 Hz codec and a 2000-class BPE it does not happen in real data; :meth:`PALLE.generate`
    lengthens the speech instead, so that no word to be spoken is dropped."""
    ids = vocab.text(text[:length])
    return torch.cat([ids, torch.full((length - len(ids),), PAD, dtype=torch.long)])


TEXT_LAYOUTS = ("pad", "stretch")
SPAN_SCORINGS = ("left_most", "suffix")  # Eq. 9 | every masked frame (not in the paper)


def stretched_text(vocab, text: torch.Tensor, length: int) -> torch.Tensor:
    """BPE ids -> shared ids stretched evenly over ``length`` frames (option ``text_layout:
    stretch``, not in the paper): frame ``t`` reads token ``floor(t L / T)``, so ``[a, b]`` over 5
    frames is ``a a a b b``. A uniform-rate alignment prior, like the padded
    layout it uses only the total length; it gives each frame the text near it instead of the
    sentence's first ``T`` tokens, which the model must otherwise learn to shift. A text longer
    than the speech is cut as :func:`padded_text` cuts it."""
    ids = vocab.text(text[:length])
    if len(ids) == 0:
        return torch.full((length,), PAD, dtype=torch.long)
    owner = torch.div(torch.arange(length) * len(ids), length, rounding_mode="floor")  # frame -> token
    return ids[owner]


def text_stream(vocab, text: torch.Tensor, length: int, layout: str) -> torch.Tensor:
    """The text stream of ``layout`` (``pad``: Eqs. 6, 13; ``stretch``: :func:`stretched_text`)."""
    return padded_text(vocab, text, length) if layout == "pad" else stretched_text(vocab, text, length)


LAYOUTS = ("fused", "concat")  # text fused along the feature dimension (Fig. 3a) | in front of the speech
READOUTS = ("own", "previous")  # frame t's logits at its own (masked) position | at t - 1, as AR reads them


def stage_input(vocab, text: torch.Tensor, speech: torch.Tensor, layout: str = "fused",
                text_layout: str = "pad", readout: str = "own") -> tuple[torch.Tensor, torch.Tensor | None, int]:
    """What a stage network reads for BPE ids ``text`` and the speech stream ``speech`` (``[T]``
    shared ids, codes or ``<mask>``): ``(input_ids, text_ids, offset)``, speech frame ``t`` at input
    position ``offset + t``, RoPE positions ``0 .. len(input_ids) - 1`` in both layouts. The one
    place where the layouts differ (besides the network each builds):

    * ``fused``: ``input_ids`` = ``speech``; ``text_ids`` = the text stream of ``text_layout`` over
      the ``T`` frames (:func:`text_stream`); offset 0.
    * ``concat``: ``input_ids`` = the text's shared ids then ``speech``, ``[L + T]``; no
      ``text_ids``; offset ``L``. With ``readout="previous"``: AR's ``<sos> text <turn> speech``,
      ``[L + 2 + T]``, offset ``L + 2`` (frame ``t``'s logits are then read at ``offset + t - 1``)."""
    if layout == "fused":
        return speech, text_stream(vocab, text, len(speech), text_layout), 0
    if readout == "previous":
        return torch.cat([torch.tensor([SOS]), vocab.text(text), torch.tensor([TURN]), speech]), None, len(text) + 2
    return torch.cat([vocab.text(text), speech]), None, len(text)


def span_mask(T: int, generator: torch.Generator, prompt_ratio: float = 0.3,
              span_ratio: float = 0.1, span_scoring: str = "left_most") -> tuple[torch.Tensor, torch.Tensor, int]:
    """Stage-one training mask (Eqs. 7-9): ``(masked, scored, s)``, bool ``[T]`` each.

    ``s ~ U{floor(0.3T), ..., T - floor(0.1T) - 1}`` (Eq. 7), ``masked`` = frames ``s..T-1``
    (Eq. 8), ``scored`` = the left-most ``k = floor(0.1T)`` of them (Eq. 9). Short utterances
    (``T < 10``, where ``floor(0.1T) = 0`` would leave nothing to learn) score ``k = 1`` frame; the
    upper bound of Eq. 7 keeps at least ``floor(0.1T) + 1 >= k`` masked frames, so exactly ``k``
    frames are scored for every ``T >= 1``.

    ``span_scoring: suffix`` (option, not in the paper) scores every masked frame instead of the
    left-most ``k``: the same input, ~4x the frames taught per sequence on average, the later
    ones predicted further from the speech they follow."""
    if T < 1:
        raise ValueError("an utterance needs at least one speech frame")
    if span_scoring not in SPAN_SCORINGS:
        raise ValueError(f"PALLE span_scoring must be one of {SPAN_SCORINGS}, got {span_scoring!r}")
    tail = _floor(span_ratio, T)
    k = max(1, tail)
    low, high = _floor(prompt_ratio, T), T - tail - 1
    s = low + int(torch.randint(high - low + 1, (), generator=generator))
    frame = torch.arange(T)
    masked = frame >= s
    if span_scoring == "suffix":
        return masked, masked.clone(), s
    return masked, masked & (frame < s + k), s


def refine_mask(T: int, generator: torch.Generator, prompt_ratio: float = 0.3, p: float = 0.1) -> torch.Tensor:
    """Stage-two training mask (Eq. 10): ``{0}^floor(0.3T) (+) Bernoulli(p)^(T - floor(0.3T))``.

    At least one frame is masked (one uniformly drawn after the prompt when the draws gave none),
    so that every example has a target; this raises the rate slightly above ``p`` on short
    utterances (by ``(1-p)^n / n`` for ``n`` candidate frames)."""
    if T < 1:
        raise ValueError("an utterance needs at least one speech frame")
    n_prompt = _floor(prompt_ratio, T)
    masked = torch.rand(T, generator=generator) < p
    masked[:n_prompt] = False
    fallback = n_prompt + int(torch.randint(T - n_prompt, (), generator=generator))
    if not masked.any():
        masked[fallback] = True
    return masked


# ----------------------------------------------------------------------------- decoding schedules

def stage_one_spans(n_generate: int, steps: int, total_frames: int | None = None, *,
                    rule: str = "fixed_ratio", r: float | None = None) -> list[int]:
    """How many frames each stage-one pass commits (left to right); sums to ``n_generate``.

    ``rule="fixed_ratio"`` (default, Eq. 14 and 5.1): every pass commits
    ``k' = min(floor(r' T), N_left)`` frames, ``T = total_frames`` the total length (prompt +
    target, ``n_generate`` when not given), ``N_left`` the frames still masked, ``r' = r`` or
    ``1 / steps`` when ``r`` is None (5.1: "100 steps ... each generating a span of size
    floor(0.01 T)"), and ``k' >= 1``. The passes run until every frame is committed (4.3: "until
    all the tokens are generated"): ``ceil(n_generate / k')``, fewer than ``steps`` when the prompt
    covers the frames that ``floor`` rounds away (a 3 s prompt + 10 s target at 25 Hz: T = 325,
    k' = 3, 84 passes), more only when it does not (T = 199 after a 60-frame prompt: k' = 1, 139
    passes); always under ``2 steps``.

    ``rule="even_split"`` (the project's earlier default): the ``n_generate`` frames are split
    evenly over exactly ``steps`` passes (sizes differ by at most one); fewer than ``steps`` frames
    take one pass per frame. ``r`` must then be None."""
    if n_generate < 0 or steps < 1:
        raise ValueError(f"need n_generate >= 0 and steps >= 1, got {n_generate}, {steps}")
    if rule == "even_split":
        if r is not None:
            raise ValueError("stage_one_rule 'even_split' takes no commit ratio r (it splits over `steps`)")
        passes = min(steps, n_generate)
        return [(i + 1) * n_generate // passes - i * n_generate // passes for i in range(passes)]
    if rule != "fixed_ratio":
        raise ValueError(f"stage_one_rule must be one of {STAGE_ONE_RULES}, got {rule!r}")
    T = total_frames if total_frames is not None else n_generate
    if r is None:
        span = T // steps  # floor(T / steps) exactly, no floating point
    elif 0.0 < r < 1.0:
        span = _floor(r, T)
    else:
        raise ValueError(f"the commit ratio r must be in (0, 1), got {r}")
    span = max(1, span)
    full, rest = divmod(n_generate, span)
    return [span] * full + ([rest] if rest else [])


def quantile_count(n: int, gamma: float) -> int:
    """Number of the ``n`` confidence scores at or below their ``gamma`` quantile (linear
    interpolation, as ``torch.quantile``; distinct scores): ``floor(gamma (n - 1)) + 1``, at
    least one. 5 of 100 frames at gamma 0.05; one frame per step below 21 frames."""
    if not 0.0 < gamma <= 1.0:
        raise ValueError(f"gamma must be in (0, 1], got {gamma}")
    return 0 if n <= 0 else math.floor(gamma * (n - 1) + _EPS) + 1


def log_max_probability(logits: torch.Tensor) -> torch.Tensor:
    """Confidence of Eq. 16, ``log P^max``: the log of the largest probability of each row."""
    return logits.log_softmax(-1).max(-1).values


def lowest_confidence(confidence: torch.Tensor, count: int) -> torch.Tensor:
    """Indices of the ``count`` least confident frames (Eq. 16 ranking), in frame order."""
    return torch.topk(confidence, count, largest=False).indices.sort().values


# ----------------------------------------------------------------------------- the network

def sinusoidal_positions(position_ids: torch.Tensor, dim: int) -> torch.Tensor:
    """Transformer sinusoidal encoding ``[..., dim]`` of ``position_ids`` (sines then cosines)."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=position_ids.device, dtype=torch.float32) / half)
    angles = position_ids.float()[..., None] * freqs
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


class PalleNetwork(nn.Module):
    """One PALLE masked generative transformer of layout ``fused`` (PALLE Sec. 4.1, Fig. 3a): speech
    and padded text streams of equal length -> logits over the shared vocabulary at every position.

    One embedding table serves both streams: text and speech ids are disjoint ranges of the shared
    vocabulary, so this is the same as two tables (the rows a stream never uses get no gradient)
    without a second copy of the specials. Embeddings start at N(0, 1) and the positional scales
    at 1, so both terms enter the fusion at comparable size (VALL-E's sinusoidal embedding does
    the same). ``passes`` counts calls: the decoding loops report it as their forward passes."""

    def __init__(self, vocab_size: int, cfg, *, convnext_kernel: int = 7, convnext_ffn_ratio: float = 2.0,
                 conv_pos_kernel: int = 7, conv_pos_groups: int = 16):
        super().__init__()
        from arnar.nn import ConvNeXtV2Block, ConvPositionEmbedding, Transformer

        if cfg.dim % 2:
            raise ValueError(f"PALLE's sinusoidal encoding needs an even model dim, got {cfg.dim}")
        dim = cfg.dim
        self.dim = dim
        self.embed = nn.Embedding(vocab_size, dim)
        # 5.1: "a one-layer ConvNeXt V2 block with 1024-dimensional embeddings and a 2048-dimensional
        # feed-forward layer" -> intermediate = 2 * dim
        self.text_encoder = ConvNeXtV2Block(dim, intermediate_dim=round(convnext_ffn_ratio * dim),
                                            kernel_size=convnext_kernel)
        self.speech_position_scale = nn.Parameter(torch.ones(()))
        self.text_position_scale = nn.Parameter(torch.ones(()))
        self.dropout = nn.Dropout(cfg.dropout)
        self.fuse = nn.Linear(2 * dim, dim)
        # Le et al. 2023 (Voicebox) convolutional positional embedding, GELU as there; kernel 7 (5.1)
        self.conv_position = ConvPositionEmbedding(dim, conv_pos_kernel, conv_pos_groups, activation="gelu")
        self.backbone = Transformer(cfg)
        self.head = nn.Linear(dim, vocab_size, bias=False)
        nn.init.normal_(self.head.weight, std=0.02)
        self.passes = 0

    def hidden(self, speech_ids: torch.Tensor, text_ids: torch.Tensor, position_ids: torch.Tensor,
               attention_mask: torch.Tensor) -> torch.Tensor:
        """``[B, S]`` speech and text ids -> ``[B, S, dim]`` backbone output."""
        if text_ids is None:
            raise ValueError("PALLE's fused layout needs text_ids, the padded text stream")
        self.passes += 1
        if position_ids.dim() == 1:
            position_ids = position_ids.unsqueeze(0).expand_as(speech_ids)
        real = speech_ids != PAD  # batch padding (the speech stream holds codes or <mask> elsewhere)
        speech = self.embed(speech_ids)
        positions = sinusoidal_positions(position_ids, self.dim).to(speech.dtype)
        speech = self.dropout(speech + self.speech_position_scale * positions)
        text = self.text_encoder(self.embed(text_ids), real)
        text = self.dropout(text + self.text_position_scale * positions)
        fused = self.conv_position(self.fuse(torch.cat([speech, text], dim=-1)), real)
        return self.backbone(fused, position_ids, attention_mask)

    def forward(self, speech_ids, text_ids, position_ids, attention_mask) -> torch.Tensor:
        return self.head(self.hidden(speech_ids, text_ids, position_ids, attention_mask))


class ConcatNetwork(nn.Module):
    """One PALLE stage of layout ``concat``: ``[B, S]`` ids (the text, then the speech stream; see
    :func:`stage_input`) -> logits at every position, through the AR baseline's modules under its
    names and shapes (``embed``, ``backbone``, ``head``, initialised as :class:`Paradigm` does), so
    that an AR state dict loads into it by :func:`arnar.train.checkpoints.matching_tensors`.
    ``hidden`` and ``forward`` take :class:`PalleNetwork`'s arguments, so that the paradigm calls
    either network alike; ``text_ids`` must be None here (the text is in ``input_ids``)."""

    def __init__(self, vocab_size: int, cfg):
        super().__init__()
        from arnar.nn import Transformer

        self.embed = nn.Embedding(vocab_size, cfg.dim)
        self.backbone = Transformer(cfg)
        self.head = nn.Linear(cfg.dim, vocab_size, bias=False)
        nn.init.normal_(self.embed.weight, std=0.02)
        nn.init.normal_(self.head.weight, std=0.02)
        self.passes = 0

    def hidden(self, input_ids: torch.Tensor, text_ids: torch.Tensor | None, position_ids: torch.Tensor,
               attention_mask: torch.Tensor) -> torch.Tensor:
        """``[B, S]`` ids -> ``[B, S, dim]`` backbone output."""
        if text_ids is not None:
            raise ValueError("PALLE's concat layout reads the text in input_ids; it takes no text_ids")
        self.passes += 1
        return self.backbone(self.embed(input_ids), position_ids, attention_mask)

    def forward(self, input_ids, text_ids, position_ids, attention_mask) -> torch.Tensor:
        return self.head(self.hidden(input_ids, text_ids, position_ids, attention_mask))


def _initialise_stage_two_after_load(module: "PALLE", incompatible_keys) -> None:
    """Load-state-dict post hook: a stage-2 model given the weights of a stage-1 run (whose stage
    two was never initialised) starts its stage two from its stage one. Resuming a stage-2 run or
    loading a finished one finds the flag set and keeps the loaded stage two."""
    if module.stage == 2 and not bool(module.stage_two_initialised):
        module.init_stage_two_from_stage_one()


# ----------------------------------------------------------------------------- the paradigm

@register_paradigm
class PALLE(Paradigm):
    name = "palle"

    def __init__(self, vocab, model, *, stage: int = 1, prompt_ratio: float = 0.3, span_ratio: float = 0.1,
                 refine_mask_prob: float = 0.1, convnext_kernel: int = 7, convnext_ffn_ratio: float = 2.0,
                 conv_pos_kernel: int = 7, conv_pos_groups: int = 16, text_layout: str = "pad",
                 span_scoring: str = "left_most", input_noise: float = 0.0, layout: str = "fused",
                 readout: str = "own", **unknown: Any):
        if unknown:
            raise ValueError(f"PALLE: unknown options {sorted(unknown)}")
        if not 0.0 <= float(input_noise) < 1.0:
            raise ValueError(f"PALLE input_noise must lie in [0, 1), got {input_noise}")
        if span_scoring not in SPAN_SCORINGS:
            raise ValueError(f"PALLE span_scoring must be one of {SPAN_SCORINGS}, got {span_scoring!r}")
        if text_layout not in TEXT_LAYOUTS:
            raise ValueError(f"PALLE text_layout must be one of {TEXT_LAYOUTS}, got {text_layout!r}")
        if layout not in LAYOUTS:
            raise ValueError(f"PALLE layout must be one of {LAYOUTS}, got {layout!r}")
        if layout == "concat" and text_layout != "pad":
            raise ValueError(f"PALLE text_layout {text_layout!r} spreads the text stream of layout 'fused'; layout "
                             f"'concat' puts the text in front of the speech: leave text_layout at 'pad'")
        if readout not in READOUTS:
            raise ValueError(f"PALLE readout must be one of {READOUTS}, got {readout!r}")
        if readout != "own" and layout != "concat":
            raise ValueError(f"PALLE readout {readout!r} reads AR's sequence: it needs layout 'concat', not {layout!r}")
        if stage not in (1, 2):
            raise ValueError(f"PALLE stage must be 1 or 2, got {stage!r}")
        if not (0.0 <= prompt_ratio and 0.0 < span_ratio and prompt_ratio + span_ratio < 1.0):
            raise ValueError(f"need 0 <= prompt_ratio, 0 < span_ratio, prompt_ratio + span_ratio < 1; "
                             f"got {prompt_ratio}, {span_ratio}")
        if not 0.0 < refine_mask_prob <= 1.0:
            raise ValueError(f"refine_mask_prob must be in (0, 1], got {refine_mask_prob}")
        architecture = {"convnext_kernel": convnext_kernel, "convnext_ffn_ratio": convnext_ffn_ratio,
                        "conv_pos_kernel": conv_pos_kernel, "conv_pos_groups": conv_pos_groups}
        super().__init__(vocab, model, stage=stage, prompt_ratio=prompt_ratio, span_ratio=span_ratio,
                         refine_mask_prob=refine_mask_prob, text_layout=text_layout, span_scoring=span_scoring,
                         input_noise=float(input_noise), layout=layout, readout=readout, **architecture)
        self.layout, self.text_layout, self.span_scoring, self.readout = layout, text_layout, span_scoring, readout
        # logits of frame t are read at input position offset + t - readout_shift
        self.readout_shift = 1 if readout == "previous" else 0
        self.input_noise = float(input_noise)
        # The base class's single embed/backbone/head would be dead weights here (in the checkpoint,
        # the parameter count and, without gradients, an error for DDP): each network has its own.
        del self.embed, self.backbone, self.head
        self.stage = int(stage)
        self.prompt_ratio, self.span_ratio, self.refine_mask_prob = prompt_ratio, span_ratio, refine_mask_prob
        if layout == "fused":
            self.stage_one = PalleNetwork(vocab.size, self.model_config, **architecture)
            self.stage_two = PalleNetwork(vocab.size, self.model_config, **architecture)
        else:  # the architecture options are the fused network's
            self.stage_one = ConcatNetwork(vocab.size, self.model_config)
            self.stage_two = ConcatNetwork(vocab.size, self.model_config)
        # only the network of this stage trains; the engine's optimiser takes requires_grad params
        self.network(3 - self.stage).requires_grad_(False)
        self.register_buffer("stage_two_initialised", torch.tensor(False))
        self._not_speech = ~vocab.is_speech(torch.arange(vocab.size))  # [V], on the CPU where sampling runs
        self.register_load_state_dict_post_hook(_initialise_stage_two_after_load)

    def network(self, stage: int | None = None) -> PalleNetwork | ConcatNetwork:
        return self.stage_one if (stage or self.stage) == 1 else self.stage_two

    @torch.no_grad()
    def init_stage_two_from_stage_one(self) -> None:
        """Stage two := stage one (in place, so an optimiser built before keeps its parameters)."""
        self.stage_two.load_state_dict(self.stage_one.state_dict())
        self.stage_two_initialised.fill_(True)

    def sequence_length(self, utt: Utterance) -> int:
        """Training sequence length for the engine's token budget: the speech length (``fused``:
        the text is fused along the feature dimension, not appended), plus the text's (``concat``;
        and ``<sos>``, ``<turn>`` with ``readout: previous``)."""
        if self.layout == "fused":
            return utt.num_frames
        return utt.num_frames + len(utt.text) + 2 * self.readout_shift

    # -- training
    def training_example(self, utt: Utterance, generator: torch.Generator) -> Example:
        T = utt.num_frames
        speech = self.vocab.speech(utt.speech)
        if self.stage == 1:
            masked, scored, _ = span_mask(T, generator, self.prompt_ratio, self.span_ratio, self.span_scoring)
        else:
            masked = scored = refine_mask(T, generator, self.prompt_ratio, self.refine_mask_prob)
        read = utt.speech
        if self.input_noise > 0:  # drawn only when set, so runs without it keep their draws
            generated = ~masked & (torch.arange(T) >= _floor(self.prompt_ratio, T))
            noisy = corrupt(utt.speech, self.input_noise, self.vocab.speech_size, generator)
            read = torch.where(generated, noisy, utt.speech)
        inputs = torch.where(masked, torch.tensor(MASK), self.vocab.speech(read))
        targets = torch.where(scored, speech, torch.tensor(IGNORE))
        input_ids, text_ids, offset = stage_input(self.vocab, utt.text, inputs, self.layout, self.text_layout,
                                                  self.readout)
        S = len(input_ids)
        targets = torch.cat([torch.full((offset,), IGNORE, dtype=torch.long), targets])  # no loss on the text
        if self.readout_shift:  # frame t's target at input position offset + t - 1; the last position reads nothing
            targets = torch.cat([targets[1:], torch.tensor([IGNORE])])
        return Example(input_ids, torch.arange(S), targets, torch.ones(S, S, dtype=torch.bool),
                       extras={} if text_ids is None else {"text_ids": text_ids})

    def logits(self, input_ids, position_ids, attention_mask=None, cache=None, cond=None, *,
               text_ids: torch.Tensor | None = None, stage: int | None = None) -> torch.Tensor:
        """``[B, S]`` input ids of the layout (:func:`stage_input`; ``fused``: the speech stream, with
        ``text_ids`` the padded text stream; ``concat``: text then speech, no ``text_ids``) -> logits
        of the network of ``stage`` (default: the one this model trains). Bidirectional, no cache."""
        if cache is not None or cond is not None:
            raise ValueError("PALLE has no KV cache and no conditioning vector")
        if attention_mask is None:
            B, S = input_ids.shape
            attention_mask = torch.ones(B, S, S, dtype=torch.bool, device=input_ids.device)
        return self.network(stage)(input_ids, text_ids, position_ids, attention_mask)

    def forward(self, batch: Batch) -> LossOutput:
        if self.stage == 2 and not bool(self.stage_two_initialised):
            raise RuntimeError("PALLE stage 2 fine-tunes the stage-one model (PALLE, arXiv:2504.10352, Sec. 5.1): start the run "
                               "from a stage-1 run (train.init_from=<stage-1 run dir>)")
        logits = self.logits(batch.input_ids, batch.position_ids, batch.attention_mask,
                             text_ids=batch.extras.get("text_ids"))
        return token_cross_entropy(logits, batch.targets)

    # -- decoding
    def _decoding_options(self, decoding: dict[str, Any]) -> dict[str, Any]:
        opts = decoding_options("PALLE", DECODING, decoding)
        if opts["refine_steps"] is None:
            opts["refine_steps"] = REFINE_STEPS if self.stage == 2 else 0
        if int(opts["refine_steps"]) < 0 or int(opts["steps"]) < 1:
            raise ValueError(f"need steps >= 1 and refine_steps >= 0, got {opts['steps']}, {opts['refine_steps']}")
        if opts["refine_steps"] > 0 and self.stage == 1:
            raise ValueError("this is a stage-1 model: its stage two was never trained; decode with "
                             "refine_steps=0 or use the stage-2 run")
        if opts["stage_one_rule"] not in STAGE_ONE_RULES:
            raise ValueError(f"stage_one_rule must be one of {STAGE_ONE_RULES}, got {opts['stage_one_rule']!r}")
        if opts["refine_rule"] not in REFINE_RULES:
            raise ValueError(f"refine_rule must be one of {REFINE_RULES}, got {opts['refine_rule']!r}")
        if not opts["duration_multiplier"] > 0:
            raise ValueError(f"duration_multiplier must be > 0, got {opts['duration_multiplier']}")
        quantile_count(1, opts["gamma"])  # validates gamma
        return opts

    def _plan(self, request: SynthesisRequest, opts: dict[str, Any]) -> dict[str, Any]:
        """One request's lengths, stage-one spans and initial input (Eqs. 12-13, :func:`stage_input`):
        ``ids``, ``text`` (the text stream; None in ``concat``) and ``first``, the input position of
        the first generated frame."""
        n_prompt, L_ref, L_gen = len(request.prompt_speech), len(request.prompt_text), len(request.text)
        # T_gen: given (ground-truth duration) or the linear estimate of Eq. 11; times Fig. 5's multiplier
        given = request.target_frames is not None
        n_generate = int(request.target_frames) if given else total_frames_estimate(n_prompt, L_ref, L_gen)
        n_generate = max(1, round(n_generate * float(opts["duration_multiplier"])))
        # the padded text must fit (Eq. 13): at least one frame per text token, so no word is cut
        # (concat cuts nothing, but lengthens alike: both layouts decode the same lengths)
        fitted = max(n_generate, L_ref + L_gen - n_prompt)
        total = n_prompt + fitted
        # Eqs. 12-13: prompt codes then <mask>; prompt transcript + target text then <pad> (fused)
        speech = torch.cat([self.vocab.speech(request.prompt_speech), torch.full((fitted,), MASK, dtype=torch.long)])
        ids, text, offset = stage_input(self.vocab, torch.cat([request.prompt_text, request.text]), speech,
                                        self.layout, self.text_layout, self.readout)
        return {
            "n_prompt": n_prompt, "n_generate": fitted, "given": given, "text_fit": fitted > n_generate,
            "spans": stage_one_spans(fitted, int(opts["steps"]), total, rule=opts["stage_one_rule"], r=opts["r"]),
            "ids": ids, "text": text, "first": offset + n_prompt,
        }

    def _pass(self, network: PalleNetwork | ConcatNetwork, streams: dict[str, torch.Tensor]) -> torch.Tensor:
        """One pass of ``network`` over the batch (``streams`` of :meth:`generate_batch`) ->
        hidden states ``[B, S, dim]``."""
        return network.hidden(streams["ids"], streams["text"], streams["positions"], streams["attention"])

    def _speech_logits(self, network: PalleNetwork | ConcatNetwork, hidden: torch.Tensor,
                       at: torch.Tensor) -> torch.Tensor:
        """One item's ``hidden`` ``[S, dim]`` -> float logits ``[len(at), V]`` at input positions
        ``at`` (read ``readout_shift`` positions earlier), on the CPU, every id but the speech ids at -inf."""
        logits = network.head(hidden[(at - self.readout_shift).to(hidden.device)]).float().cpu()
        return logits.masked_fill(self._not_speech, float("-inf"))

    def _predict(self, network: PalleNetwork | ConcatNetwork, hidden: torch.Tensor, at: torch.Tensor,
                 generator: torch.Generator, opts: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """Sampled speech ids at input positions ``at`` of one item's ``hidden`` and their confidence
        ``log P^max`` (Eq. 16). Sampling runs on the CPU, where the caller's generator lives (the
        same draws on any device)."""
        logits = self._speech_logits(network, hidden, at)
        ids, _ = sample_tokens(logits, generator, temperature=float(opts["temperature"]), top_p=float(opts["top_p"]))
        return ids, log_max_probability(logits)

    def commit_spans(self, streams: dict[str, torch.Tensor], items: list[dict[str, Any]],
                     generators: list[torch.Generator], opts: dict[str, Any]) -> None:
        """Stage one (Eq. 14), in place on ``streams["ids"]`` (prompt codes then ``<mask>``, after
        the text in ``concat``): each pass predicts every frame and commits, for every item with
        spans left, its next span of left-most still-masked frames. Sets each item's
        ``confidence``, the ``log P^max`` each generated frame was committed with ``[T_gen]``. An
        item whose spans are done rides along unchanged until the last item's are. Frames are
        counted from the item's first generated frame, at input position ``item["first"]``."""
        ids = streams["ids"]
        for item in items:
            item["confidence"], item["committed"] = torch.zeros(item["n_generate"]), 0
        for step in range(max(len(item["spans"]) for item in items)):
            hidden = self._pass(self.stage_one, streams)
            for b, (item, generator) in enumerate(zip(items, generators)):
                if step >= len(item["spans"]):
                    continue
                frames = torch.arange(item["committed"], item["committed"] + item["spans"][step])
                at = item["first"] + frames
                sampled, conf = self._predict(self.stage_one, hidden[b], at, generator, opts)
                ids[b, at.to(ids.device)] = sampled.to(ids.device)  # shared ids, sampled among the speech ids
                item["confidence"][frames] = conf
                item["committed"] += len(frames)

    def refine(self, streams: dict[str, torch.Tensor], items: list[dict[str, Any]],
               generators: list[torch.Generator], opts: dict[str, Any]) -> None:
        """Stage two (Eqs. 15-16), in place on ``streams["ids"]`` (prompt + stage one's output);
        sets each item's ``refined`` frames and ``refine_passes``. Each of the ``refine_steps`` steps
        re-masks the ``count =`` :func:`quantile_count` ``(T_gen, gamma)`` least confident generated
        frames of an item (the frames at or below the ``gamma`` quantile of its confidence vector, 5
        of 100 at gamma 0.05), re-predicts them with the stage-two network in one pass and pins them:
        their confidence becomes ``PINNED`` = 1, above any log-probability, so no frame is refined
        twice. An item whose every frame is pinned stops (and rides along unchanged). Which
        confidence:

        * ``refine_rule="rescore"`` (default, the paper): at every step the stage-two network scores
          the current sequence (Eq. 15, one pass with nothing masked), ``C = log P^max`` at every
          generated frame (Eq. 16), and pinned frames keep ``PINNED``. Two passes per step: the
          score, then the re-prediction of the re-masked frames. (The paper's update, written like
          Eq. 14, could be read as taking the new tokens from the scoring pass itself; the network
          is trained to predict masked frames only (Eq. 10), so they are re-predicted masked.)
        * ``refine_rule="stage_one_confidence"``: the confidence each frame was committed with in
          stage one, fixed before the first step, so the steps walk one list. One pass per step.
          (Its reason: under Eq. 10 the loss is on masked frames only, so a network's output at a
          visible frame, which is what "rescore" ranks, is never a training target.)
        """
        ids, gamma = streams["ids"], float(opts["gamma"])
        for item in items:
            item["pinned"] = torch.zeros(item["n_generate"], dtype=torch.bool)
            item["count"], item["refine_passes"] = quantile_count(item["n_generate"], gamma), 0
        for _ in range(int(opts["refine_steps"])):
            open_items = [b for b, item in enumerate(items) if not bool(item["pinned"].all())]
            if not open_items:
                break
            if opts["refine_rule"] == "rescore":
                hidden = self._pass(self.stage_two, streams)
            chosen = {}
            for b in open_items:
                item = items[b]
                if opts["refine_rule"] == "rescore":
                    generated = item["first"] + torch.arange(item["n_generate"])
                    confidence = log_max_probability(self._speech_logits(self.stage_two, hidden[b], generated))
                    item["refine_passes"] += 1
                else:
                    confidence = item["confidence"]
                n_open = int((~item["pinned"]).sum())
                chosen[b] = lowest_confidence(confidence.masked_fill(item["pinned"], PINNED), min(item["count"], n_open))
                ids[b, (chosen[b] + item["first"]).to(ids.device)] = MASK
            hidden = self._pass(self.stage_two, streams)
            for b in open_items:
                item, at = items[b], chosen[b] + items[b]["first"]
                sampled, _ = self._predict(self.stage_two, hidden[b], at, generators[b], opts)
                ids[b, at.to(ids.device)] = sampled.to(ids.device)
                item["pinned"][chosen[b]] = True
                item["refine_passes"] += 1
        for item in items:
            item["refined"] = int(item["pinned"].sum())

    @torch.no_grad()
    def generate(self, request: SynthesisRequest, generator: torch.Generator, **decoding: Any) -> Generation:
        return self.generate_batch([request], [generator], **decoding)[0]

    @torch.no_grad()
    def generate_batch(self, requests: list[SynthesisRequest], generators: list[torch.Generator],
                       **decoding: Any) -> list[Generation]:
        """Both stages of B requests, one pass of a network per step for all of them: the inputs
        right-padded (``fused``: both streams, the convolutions seeing ``<pad>`` as padding;
        ``concat``: text then speech, so each item's speech starts at its own offset), padding keys
        masked, each item on its own length, spans and refinement, sampled from its own generator
        exactly as alone (B = 1 is :meth:`generate`). Stage one runs until the item with the most spans is
        done, then stage two; an item with nothing left to do in a pass rides along unchanged.
        ``info`` holds each item's own pass counts; ``forward_passes`` is the batch's."""
        if len(requests) != len(generators):
            raise ValueError(f"{len(requests)} requests but {len(generators)} generators")
        opts = self._decoding_options(decoding)
        device = self.stage_one.head.weight.device
        items = [self._plan(request, opts) for request in requests]
        ids, keys = right_padded([item["ids"] for item in items], device)
        text = None if self.layout == "concat" else right_padded([item["text"] for item in items], device)[0]
        # positions 0 .. S-1: each item's own 0 .. len - 1 at its real positions (padding is never attended)
        streams = {"ids": ids, "text": text, "attention": padded_attention(keys),
                   "positions": torch.arange(ids.shape[1], device=device)[None].expand(len(items), -1)}
        passes_before = self.stage_one.passes + self.stage_two.passes
        self.commit_spans(streams, items, generators, opts)
        self.refine(streams, items, generators, opts)
        passes = self.stage_one.passes + self.stage_two.passes - passes_before
        out = []
        for b, item in enumerate(items):
            first = item["first"]
            codes = self.vocab.speech_codes(ids[b, first:first + item["n_generate"]].cpu())
            out.append(Generation(codes, forward_passes=passes, first_packet_passes=None, info={
                "target_frames": item["n_generate"],
                "length_from": "given" if item["given"] else "eq11",
                "extended_to_fit_text": item["text_fit"],
                "stage_one_rule": opts["stage_one_rule"],
                "refine_rule": opts["refine_rule"],
                "stage_one_passes": len(item["spans"]),
                "refine_passes": item["refine_passes"],
                "refined_frames": item["refined"],
            }))
        return out

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        info.update(stage=self.stage,
                    parameters_per_stage=sum(p.numel() for p in self.stage_one.parameters()),
                    trainable_parameters=sum(p.numel() for p in self.parameters() if p.requires_grad))
        return info
