"""Chain-of-Details (CoD): temporal coarse-to-fine masked generation (Chain-of-Details, arXiv:2604.19330, Secs. III-IV).

Speech is generated in ``L`` temporal levels (option ``levels``; L = 3 in the paper, 1 and 2 are the
Table IV ablation), coarse to fine. Level ``l`` is the first quantizer's token sequence decimated by
``2 ** (L - l)`` (:mod:`arnar.codec.hierarchy`: keep the first token of every group); with the
offline codec's 50 Hz ``offline_rvq`` stream and L = 3 that is 12.5 / 25 / 50 Hz. One shared
bidirectional decoder (the shared backbone with an all-True mask) predicts every level with MaskGIT
masked token modelling (Eq. 1): level 1 from the transcript C, level ``l > 1`` from C and level
``l - 1``.

What is generated: complete acoustic tokens (option ``codebooks``). The coarse levels are the
first quantizer's decimations; the finest level yields every codebook of the RVQ stack (``codebooks:
all`` in the config, which the training engine resolves to the tokens' count: 8 for ``offline_rvq``,
9 for DAC), so ``Generation.speech`` is ``[K, T]`` and the codec decodes the whole stack. The paper
compares CoD with "DAC recon." (Tables I, III) and its second tokenizer adds quantizers to the full
RVQ (IV-A), which only makes sense for complete tokens; it does not say how the codebooks after the
first are produced. Here, as a single-stage masked acoustic model does (its reference [11]), the
shared decoder produces them at the finest level, conditioned on level ``L - 1``:

* input: at the finest level the prompt's frames carry their whole stack (the sum of one embedding
  per codebook, ``acoustic_embed``, added to the first quantizer's), so the voice's fine detail is
  in context; target frames carry the first quantizer or ``<mask>`` as at every level;
* output: a second head (``acoustic_head``) predicts codebooks ``2..K`` of every target frame whose
  first-quantizer token is in the input (not masked): at decoding, after the finest level's
  MaskGIT steps have committed every first-quantizer token, one more pass (conditional, no
  guidance) reads the rest of the stack from it, greedily (decoding ``acoustic_temperature: 0``);
* loss: one cross-entropy term per frame prediction, the first quantizer's at masked frames (as
  before) and the mean over codebooks ``2..K`` at unmasked target frames, each frame counted once.

``codebooks: 1`` is the first-quantizer-only variant (the finest level is the first quantizer and
the codec decodes from it alone, ``load_codec("offline_rvq", n_codebooks=1)``): it reads at ~67 %
WER on the offline codec (``resynth_offline_rvq_q1``) against ~12 % for the stack, so it is a named
row (``cod_q1``), not the default. A checkpoint whose config predates the option is this variant.

Coarse token types (Table V; option ``coarse_tokenizer``, a folder of :mod:`arnar.codec.coarse`).
Unset, the coarse levels are the decimations above. Set, levels ``1 .. L-1`` are tokens of another
kind, of the same lengths and codebook size: independently trained codebooks on time-pooled codec
latents, the codec's own first codebook on those pooled latents, or 25 Hz encoder units (L = 2).
Training reads them from the features (``coarse``, added by ``arnar coarse-tokens``); synthesis
computes the prompt's from its audio in :meth:`CoD.prepare_request`. Everything else, the finest
level included, is unchanged, so the runs differ only in what the coarse levels are.

Sequence layout of one training example (or one decoding pass at level ``l``)::

    position   0 .. P-1                         P .. P+N_l-1
    input      phoneme p_i                      x^l_j or <mask>   (+ x^{l-1} upsampled, l > 1)
               + level embedding                + level embedding

* **Phonemes as a prefix** (Fig. 2: "the phonetic indices are concatenated with a sequence of fully
  masked audio tokens"), embedded with their own table (``n_phonemes`` ids: the shared vocabulary
  holds BPE ids, not phonemes). The per-position extra ``phonemes`` carries ``id + 1`` at the prefix
  and 0 elsewhere.
* **The previous level is summed into the speech positions**, not given positions of its own:
  level ``l - 1`` stretched to level ``l``'s length (:func:`arnar.codec.hierarchy.upsample`, frame
  ``j`` gets coarse token ``j // 2``) so that position ``j`` sees the coarse token covering the same
  time. The paper does not say how ``X_{l-1}`` enters; summing keeps the sequence at ``P + N_l``
  instead of ``P + N_{l-1} + N_l`` and hands the model the time alignment for free. The previous
  level has its own embedding table (``speech_size + 1`` rows, row 0 = "no previous level" is fixed
  at zero); per-position extra ``previous`` = ``code + 1`` or 0.
* **Level embedding** added at every position, so the shared decoder knows the token rate.
* **Speaker**: adaptive LayerNorm (paper IV-A, DiT-style) from the speaker embedding of the
  utterance (a ``speaker_dim`` vector, per-sequence extra ``speaker``), projected by a linear layer to
  the backbone's ``cond_dim``. CoD needs adaLN, so when the engine's model config has
  ``cond_dim: 0`` (model/tiny, small, paper) the paradigm builds its backbone with
  ``cond_dim = dim``; a non-zero ``cond_dim`` is kept.
* Positions: one running range ``0 .. P + N_l - 1`` (RoPE), as the NAR baseline. Option
  ``text_positions: proportional`` (not in the paper) numbers the speech positions ``0 .. N_l - 1``
  and spreads the phonemes over them (:func:`arnar.paradigms.base.spread_positions`), a
  uniform-rate alignment prior at every level.

Prompting. The paper conditions on the voice only through the speaker embedding. For the
continuation / cross-sentence protocol shared by all paradigms here (option ``speech_prompt``, on by
default) the prompt's tokens, decimated to each level, are also an unmasked prefix of the speech
positions, and the phonemes cover prompt transcript + text, as in the NAR baseline: training keeps
a random prefix (up to ``prompt_max`` of the utterance) unmasked and unscored. Prefix lengths are
multiples of ``F = 2 ** (L - 1)`` frames, so that every level of "prompt + continuation" is exactly
"decimated prompt + decimated continuation" (decimating a concatenation is not the concatenation
of the decimations when the first part's length is not a multiple of the factor); at inference the
first ``T_p mod F`` prompt frames (under 80 ms at 50 Hz) are dropped for the same reason. With
``speech_prompt: false`` the model is the paper's: text phonemes only, voice from the embedding.

Training (III-B, IV-B), one example:

1. level ``l ~ Categorical(level_probs)``, biased to fine levels ([0.2, 0.3, 0.5] for L = 3);
2. MaskGIT masking of the non-prompt tokens of level ``l``: ``u ~ U(0, 1)``,
   ``ceil(cos(pi u / 2) * n)`` random positions become ``<mask>`` (at least one); loss on them only;
3. 10 % (``previous_noise``) of the previous level's conditioning tokens are replaced by random
   codes (each position independently);
4. 10 % of the examples (``condition_dropout``) drop the condition for classifier-free guidance:
   every phoneme embedding and every previous-level embedding is replaced by a learnable null
   embedding (``null_phoneme``, ``null_previous``); the speaker embedding is kept (the paper drops
   "transcript and previous coarse level conditionings" only). The sequence keeps its length, so
   the conditional and unconditional passes of a decoding step share one batch.

All levels of an utterance are never in one example: each example trains one level, which is how
the paper trains "all temporal coarse levels simultaneously".

Duration predictor (IV-A: "a pretrained duration predictor estimates the utterance length"; "6
transformer layers with hidden dimension 256"): a small bidirectional transformer of its own
(``duration_dim`` x ``duration_layers``) over the phonemes with the same speaker adaLN, mean-pooled,
predicting ``log(T / P)`` (log frames per phoneme at the finest level; the estimate is
``P * exp(.)``, so an untrained predictor starts at one frame per phoneme). Trained jointly with an
L1 loss on ``log T`` (the paper's predictor is pretrained separately; training it with the decoder
is one run instead of two and nothing flows between them). Frames of the finest level rather than
seconds: the paradigm does not know the codec's frame rate, and ``T`` sets every level's length.

Loss contract (sums plus a count, the engine divides by the global count): the masked-token
cross-entropy is summed over masked tokens, plus (``codebooks`` > 1) the per-frame mean
cross-entropy of codebooks 2..K over the given target frames of the finest level; an utterance's
duration error is added ``n_b`` times, ``n_b`` its number of targets, and ``n_targets`` counts the
targets (masked tokens, plus those frames).
After the engine's division the objective is therefore ``CE mean + duration_weight * (token-weighted
mean duration L1)`` whatever the batch composition, world size or accumulation, which a per-utterance
sum divided by a token count would not be.

Decoding (Fig. 2, IV-B "Inference details"), level by level:

* target length ``T``: ``request.target_frames`` if given, else the duration predictor on the text's
  phonemes (decoding ``length="predictor"``), or the prompt's frames per phoneme (``"prompt_rate"``,
  PALLE (arXiv:2504.10352) Eq. 11 with phoneme counts); level ``l`` then has ``ceil(T / 2 ** (L - l))`` tokens;
* ``steps`` MaskGIT steps per level (20 in the paper): all non-prompt tokens start masked; each step
  predicts every position, samples the masked ones, and re-masks the least confident so that the
  cosine schedule's count stays masked (confidence = probability of the sampled token, MaskGIT);
* classifier-free guidance (``c`` conditional logits, ``u`` with the null condition), ``w``
  decreasing linearly from 3 to 0.75 over a level's steps. The paper gives the schedule, not the
  formula; decoding option ``guidance_form`` picks it (:func:`guided_logits`): ``"extrapolate"``
  (default) ``c + w (c - u)``, where ``w = 0`` is the conditional model and the end value 0.75
  still pushes away from ``u``, or ``"interpolate"`` ``u + w (c - u)``, where ``w = 1`` is the
  conditional model and 0.75 mixes a quarter of ``u`` back in;
* Gaussian noise of variance decreasing linearly from 3 to 0 added to the guided logits before
  sampling;
* level ``l + 1`` is conditioned on the whole of level ``l`` (prompt + generated), upsampled.

Both schedules restart at every level: each level is its own MaskGIT decoding (the paper says "from
start decoding to the end" and runs one decoding per level). ``Generation.forward_passes`` counts
sequential backbone calls: CFG runs the conditional and the unconditional input as one batch of two,
which is one pass, so a decoding costs ``levels * steps`` passes (fewer only if a level has fewer
tokens than steps and finishes early), plus one that reads codebooks 2..K when ``codebooks`` > 1. The duration predictor's single call is a separate small
network and is reported as ``info["duration_passes"]``.

Synthesis inputs. :class:`~arnar.paradigms.base.SynthesisRequest` carries BPE ids; CoD needs
phonemes and a speaker embedding. :meth:`CoD.prepare_request` (called by
:class:`arnar.synthesize.Synthesizer` when a paradigm has it) puts ``phonemes``, ``prompt_phonemes``
and ``speaker`` into ``request.features``. Training reads the same names from
``Utterance.features``, built by :mod:`arnar.train.features`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from arnar.codec.hierarchy import decimate, level_factors, levels as decimated_levels, upsample
from arnar.decode.sampling import sample_tokens
from arnar.decode.schedules import cosine_mask_ratio, masks_per_step, total_frames_estimate
from arnar.paradigms import register_paradigm
from arnar.paradigms.base import (
    decoding_options,
    IGNORE,
    MASK,
    PAD,
    TEXT_POSITIONS,
    Batch,
    Example,
    Generation,
    LossOutput,
    Paradigm,
    SynthesisRequest,
    Utterance,
    corrupt,
    padded_attention,
    right_padded,
    spread_positions,
    token_cross_entropy,
)

PAPER_LEVEL_PROBS = (0.2, 0.3, 0.5)  # IV-B, coarsest to finest, L = 3
DECODING = {
    "steps": 20,  # MaskGIT steps per level (IV-B)
    "temperature": 1.0,
    "top_k": 0,
    "top_p": 1.0,
    "guidance_start": 3.0,  # CFG weight, linear over a level's steps (IV-B)
    "guidance_end": 0.75,
    "guidance_form": "extrapolate",  # extrapolate: c + w (c - u) | interpolate: u + w (c - u)
    "noise_start": 3.0,  # variance of the Gaussian logit noise, linear over a level's steps (IV-B)
    "noise_end": 0.0,
    "length": "predictor",  # predictor | prompt_rate (when the request gives no target_frames)
    "acoustic_temperature": 0.0,  # codebooks 2..K (option codebooks > 1): 0 = the most likely code, else sampled
    # a diagnostic, not a system: levels 1..forced_levels are the target's own tokens (the request's
    # features["forced_speech"], its first-quantizer codes), the levels after them are generated
    # (arnar ladder on a CoD run: which level loses the words)
    "forced_levels": 0,
}
MAX_FRAMES_PER_PHONEME = 64  # safety cap on a predicted length (1.3 s per phoneme at 50 Hz)


# ----------------------------------------------------------------------------- small pieces

def default_level_probs(n_levels: int) -> list[float]:
    """The paper's [0.2, 0.3, 0.5] for L = 3. For L < 3 (the Table IV ablation, whose probabilities
    the paper does not give) its finest ``L`` values renormalised: L = 2 -> [0.375, 0.625],
    L = 1 -> [1]. For L > 3 there is nothing to derive them from: set ``level_probs``."""
    if n_levels > len(PAPER_LEVEL_PROBS):
        raise ValueError(f"CoD with {n_levels} levels: give level_probs (the paper only gives them for 3 levels)")
    tail = PAPER_LEVEL_PROBS[len(PAPER_LEVEL_PROBS) - n_levels:]
    return [p / sum(tail) for p in tail]


def sample_level(probs: Tensor, generator: torch.Generator) -> int:
    """A level 1..L drawn with ``probs`` (coarsest first)."""
    return int(torch.multinomial(probs, 1, generator=generator)) + 1


def linear_schedule(start: float, end: float, steps: int) -> list[float]:
    """``steps`` values from ``start`` (first step) to ``end`` (last step), linearly."""
    if steps < 1:
        raise ValueError("steps must be >= 1")
    if steps == 1:
        return [float(start)]
    return [start + (end - start) * s / (steps - 1) for s in range(steps)]


# the weight at which each guidance form gives the plain conditional logits (no unconditional pass needed)
GUIDANCE_FORMS = {"extrapolate": 0.0, "interpolate": 1.0}


def guided_logits(cond: Tensor, uncond: Tensor, weight: float, form: str = "extrapolate") -> Tensor:
    """Classifier-free guidance of the conditional logits ``c`` by the unconditional ``u``.

    The paper (IV-B) says only "we decrease the guidance level linearly from 3 to 0.75", so both
    common forms are options:

    * ``"extrapolate"``: ``c + w (c - u)`` = ``(1 + w) c - w u`` (the form of Ho & Salimans' CFG
      paper): ``w = 0`` is the conditional model; every ``w > 0``, the end value 0.75 included,
      pushes away from ``u``.
    * ``"interpolate"``: ``u + w (c - u)`` = ``w c + (1 - w) u``: ``w = 1`` is the conditional
      model; ``w < 1`` mixes ``u`` back in (0.75: a quarter of it), ``w > 1`` pushes away.

    The two agree when the ``interpolate`` weight is the ``extrapolate`` weight plus one."""
    if form == "extrapolate":
        return cond + weight * (cond - uncond)
    if form == "interpolate":
        return uncond + weight * (cond - uncond)
    raise ValueError(f"CoD guidance_form must be one of {sorted(GUIDANCE_FORMS)}, got {form!r}")


def trim_prompt(prompt: Tensor, multiple: int) -> Tensor:
    """The last ``multiple * floor(T_p / multiple)`` frames of the prompt (see the module docstring:
    the prompt/continuation boundary must fall on a level-1 token boundary)."""
    keep = multiple * (len(prompt) // multiple)
    return prompt[len(prompt) - keep:]


# ----------------------------------------------------------------------------- duration predictor

class DurationPredictor(nn.Module):
    """Utterance length from phonemes and the speaker: ``log(T / P)`` of the finest level, a
    bidirectional transformer over the phonemes (speaker by adaLN), mean-pooled, one linear output."""

    def __init__(self, n_phonemes: int, speaker_dim: int, dim: int, n_layers: int, n_heads: int, dropout: float):
        super().__init__()
        from arnar.nn import Transformer, TransformerConfig

        self.embed = nn.Embedding(n_phonemes, dim)
        self.speaker = nn.Linear(speaker_dim, dim)
        self.transformer = Transformer(TransformerConfig(dim=dim, n_layers=n_layers, n_heads=n_heads,
                                                         dropout=dropout, cond_dim=dim))
        self.out = nn.Linear(dim, 1)
        nn.init.normal_(self.embed.weight, std=0.02)
        nn.init.zeros_(self.out.weight)
        nn.init.zeros_(self.out.bias)  # starts at one frame per phoneme

    def forward(self, phonemes: Tensor, lengths: Tensor, speaker: Tensor) -> Tensor:
        """``phonemes`` [B, P] ids (padded), ``lengths`` [B], ``speaker`` [B, speaker_dim] ->
        predicted ``log T`` [B]."""
        B, P = phonemes.shape
        valid = torch.arange(P, device=phonemes.device)[None] < lengths[:, None]
        # padded queries attend themselves only; real ones attend every real phoneme
        mask = valid[:, None, :] | torch.eye(P, dtype=torch.bool, device=phonemes.device)[None]
        hidden = self.transformer(self.embed(phonemes), torch.arange(P, device=phonemes.device), mask,
                                  cond=self.speaker(speaker))
        pooled = (hidden * valid[..., None]).sum(1) / lengths[:, None].clamp_min(1)
        return self.out(pooled).squeeze(-1).float() + lengths.clamp_min(1).float().log()


# ----------------------------------------------------------------------------- the paradigm

@register_paradigm
class CoD(Paradigm):
    name = "cod"

    def __init__(self, vocab, model, *, levels: int = 3, level_probs: list[float] | None = None,
                 n_phonemes: int = 64, speaker_dim: int = 256, speaker_encoder: str = "resemblyzer",
                 phoneme_tokenizer: str | None = None, condition_dropout: float = 0.1,
                 previous_noise: float = 0.1, speech_prompt: bool = True, prompt_max: float = 0.4,
                 duration_dim: int = 128, duration_layers: int = 2, duration_heads: int = 2,
                 duration_weight: float = 1.0, coarse_tokenizer: str | None = None,
                 text_positions: str = "sequence", codebooks: int | str = 1, **unknown: Any):
        from arnar.nn import TransformerConfig

        if unknown:
            raise ValueError(f"CoD: unknown options {sorted(unknown)}")
        if text_positions not in TEXT_POSITIONS:
            raise ValueError(f"CoD text_positions must be one of {TEXT_POSITIONS}, got {text_positions!r}")
        if codebooks == "all":
            raise ValueError("CoD codebooks 'all' is resolved from the token set by the training engine (arnar.train); "
                             "give the number of codebooks here")
        if isinstance(codebooks, bool) or not isinstance(codebooks, int) or codebooks < 1:
            raise ValueError(f"CoD codebooks must be a whole number >= 1 or 'all', got {codebooks!r}")
        levels = int(levels)
        if levels < 1:
            raise ValueError(f"CoD levels must be >= 1, got {levels}")
        probs = default_level_probs(levels) if level_probs is None else [float(p) for p in level_probs]
        if len(probs) != levels or any(p < 0 for p in probs) or not math.isclose(sum(probs), 1.0, abs_tol=1e-6):
            raise ValueError(f"CoD level_probs must be {levels} non-negative numbers summing to 1, got {level_probs}")
        for name, rate in (("condition_dropout", condition_dropout), ("previous_noise", previous_noise)):
            if not 0.0 <= rate < 1.0:
                raise ValueError(f"CoD {name} must be in [0, 1), got {rate}")
        if not 0.0 <= prompt_max < 1.0:
            raise ValueError(f"CoD prompt_max must be in [0, 1), got {prompt_max}")
        cfg = model if isinstance(model, TransformerConfig) else TransformerConfig.from_dict(dict(model))
        if cfg.cond_dim == 0:  # the speaker conditions every layer by adaLN (IV-A)
            cfg = dataclasses.replace(cfg, cond_dim=cfg.dim)
        super().__init__(vocab, cfg, levels=levels, level_probs=probs, n_phonemes=n_phonemes,
                         speaker_dim=speaker_dim, speaker_encoder=speaker_encoder,
                         phoneme_tokenizer=phoneme_tokenizer, condition_dropout=condition_dropout,
                         previous_noise=previous_noise, speech_prompt=speech_prompt, prompt_max=prompt_max,
                         duration_dim=duration_dim, duration_layers=duration_layers,
                         duration_heads=duration_heads, duration_weight=duration_weight,
                         coarse_tokenizer=coarse_tokenizer, text_positions=text_positions, codebooks=codebooks)
        self.text_positions = text_positions
        self.n_levels = levels
        self.level_probs = torch.tensor(probs, dtype=torch.float)
        self.n_phonemes, self.speaker_dim = int(n_phonemes), int(speaker_dim)
        self.condition_dropout, self.previous_noise = float(condition_dropout), float(previous_noise)
        self.speech_prompt, self.prompt_max = bool(speech_prompt), float(prompt_max)
        self.duration_weight = float(duration_weight)
        self.speaker_encoder_name, self.phoneme_tokenizer_path = speaker_encoder, phoneme_tokenizer
        if coarse_tokenizer is not None and levels < 2:
            raise ValueError("CoD coarse_tokenizer needs levels >= 2 (one level has no coarse tokens)")
        self.coarse_tokenizer_path = coarse_tokenizer  # None: coarse levels are decimations (Table V, row 1)
        dim = cfg.dim
        self.phoneme_embed = nn.Embedding(self.n_phonemes, dim)
        self.previous_embed = nn.Embedding(vocab.speech_size + 1, dim, padding_idx=0)  # row 0: none
        self.level_embed = nn.Embedding(levels, dim)
        self.null_phoneme = nn.Parameter(torch.zeros(dim))
        self.null_previous = nn.Parameter(torch.zeros(dim))
        self.speaker_proj = nn.Linear(self.speaker_dim, cfg.cond_dim)
        for table in (self.phoneme_embed, self.previous_embed, self.level_embed):
            nn.init.normal_(table.weight, std=0.02)
        with torch.no_grad():
            self.previous_embed.weight[0].zero_()
        nn.init.normal_(self.null_phoneme, std=0.02)
        nn.init.normal_(self.null_previous, std=0.02)
        # the rest of the RVQ stack at the finest level (module docstring): one embedding table per
        # codebook 2..K (rows code + 1; row 0 of each, "not given", is masked out) and one head
        self.codebooks = int(codebooks)
        if self.codebooks > 1:
            self.acoustic_embed = nn.Embedding((self.codebooks - 1) * (vocab.speech_size + 1), dim)
            self.acoustic_head = nn.Linear(dim, (self.codebooks - 1) * vocab.speech_size)
            nn.init.normal_(self.acoustic_embed.weight, std=0.02)
            nn.init.normal_(self.acoustic_head.weight, std=0.02)
            nn.init.zeros_(self.acoustic_head.bias)
        self.duration = DurationPredictor(self.n_phonemes, self.speaker_dim, int(duration_dim),
                                          int(duration_layers), int(duration_heads), cfg.dropout)
        self.backbone_calls = 0  # sequential calls of the shared backbone (Generation.forward_passes)

    # -- inputs
    @property
    def prompt_multiple(self) -> int:
        """Frames per level-1 token, ``F = 2 ** (L - 1)``: prompt lengths are multiples of it."""
        return level_factors(self.n_levels)[0]

    def _features(self, features: dict[str, Tensor], where: str) -> tuple[Tensor, Tensor]:
        """(phoneme ids [P], speaker embedding [speaker_dim]) from a features dict, checked."""
        if "phonemes" not in features or "speaker" not in features:
            raise ValueError(
                f"{where}: CoD needs features 'phonemes' and 'speaker' (got {sorted(features)}); build them with "
                "`arnar cod-features` and train with data.features=<file>, or call prepare_request at synthesis")
        phonemes = torch.as_tensor(features["phonemes"]).long().reshape(-1)
        speaker = torch.as_tensor(features["speaker"]).float().reshape(-1)
        if len(phonemes) and (int(phonemes.min()) < 0 or int(phonemes.max()) >= self.n_phonemes):
            raise ValueError(f"{where}: phoneme id {int(phonemes.max())} outside 0..{self.n_phonemes - 1}; "
                             "raise the CoD option n_phonemes to the phoneme tokenizer's vocab_size")
        if speaker.numel() != self.speaker_dim:
            raise ValueError(f"{where}: speaker embedding of size {speaker.numel()}, the CoD option speaker_dim is "
                             f"{self.speaker_dim} (features made with another speaker encoder?)")
        return phonemes, speaker

    def speech_levels(self, speech: Tensor, features: dict[str, Any], key: str, where: str) -> list[Tensor]:
        """Levels 1..L of ``speech`` (finest-level codes [T]), coarse to fine: its decimations, or
        with ``coarse_tokenizer`` the coarse levels of ``features[key]`` and ``speech`` itself."""
        if self.coarse_tokenizer_path is None:
            return [torch.from_numpy(x) for x in decimated_levels(speech.numpy(), self.n_levels)]
        coarse = features.get(key)
        if coarse is None or len(coarse) != self.n_levels - 1:
            raise ValueError(f"{where}: CoD with coarse_tokenizer needs features {key!r} with {self.n_levels - 1} "
                             f"coarse levels (got {'none' if coarse is None else len(coarse)}); add them with "
                             "`arnar coarse-tokens`, or prepare_request at synthesis")
        out = []
        for level, (codes, factor) in enumerate(zip(coarse, level_factors(self.n_levels)), start=1):
            codes = torch.as_tensor(codes).long().reshape(-1)
            if len(codes) != math.ceil(len(speech) / factor):
                raise ValueError(f"{where}: coarse level {level} has {len(codes)} tokens, {len(speech)} frames "
                                 f"need {math.ceil(len(speech) / factor)} (coarse tokens made with another codec?)")
            if len(codes) and (int(codes.min()) < 0 or int(codes.max()) >= self.vocab.speech_size):
                raise ValueError(f"{where}: coarse level {level} has codes outside 0..{self.vocab.speech_size - 1}")
            out.append(codes)
        return out + [speech.long()]

    def sequence_length(self, utt: Utterance) -> int:
        """Upper bound of the training sequence for the engine's token budget: phonemes + all
        frames (the finest level; coarser levels are shorter)."""
        phonemes = utt.features.get("phonemes")
        return (len(phonemes) if phonemes is not None else len(utt.text)) + utt.num_frames

    def _sequence(self, phonemes: Tensor, current: Tensor, previous: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        """``input_ids``, ``phonemes`` extra and ``previous`` extra of ``[phonemes, speech]``.
        ``current``: shared ids of this level (speech ids or MASK) [N]; ``previous``: codes [N]
        of the previous level upsampled to N, or None at level 1."""
        P, N = len(phonemes), len(current)
        input_ids = torch.cat([torch.full((P,), PAD, dtype=torch.long), current.long()])
        phoneme_extra = torch.cat([phonemes.long() + 1, torch.zeros(N, dtype=torch.long)])
        previous_extra = torch.cat([torch.zeros(P, dtype=torch.long),
                                    torch.zeros(N, dtype=torch.long) if previous is None else previous.long() + 1])
        return input_ids, phoneme_extra, previous_extra

    def level_positions(self, n_phonemes: int, n_speech: int) -> Tensor:
        """RoPE positions of ``[phonemes, speech]`` at one level (the module docstring)."""
        if self.text_positions == "sequence":
            return torch.arange(n_phonemes + n_speech)
        return torch.cat([spread_positions(n_phonemes, n_speech), torch.arange(n_speech)])

    def embed_inputs(self, input_ids: Tensor, phonemes: Tensor, previous: Tensor, level: Tensor,
                     drop: Tensor, acoustic: Tensor | None = None) -> Tensor:
        """[B, S, dim] inputs of the shared decoder (layout in the module docstring). ``phonemes``
        and ``previous`` [B, S] hold id + 1 (0: none), ``level`` [B] 1..L, ``drop`` [B] bool: the
        condition is replaced by the null embeddings (CFG). ``acoustic`` [B, S, K - 1]: codes + 1 of
        codebooks 2..K where a frame gives them (0: not given), with ``codebooks`` > 1."""
        x = self.embed(input_ids)
        is_phoneme = (phonemes > 0)[..., None]
        drop = drop.bool()[:, None, None]
        phoneme_x = torch.where(drop, self.null_phoneme.to(x.dtype), self.phoneme_embed((phonemes - 1).clamp_min(0)))
        x = torch.where(is_phoneme, phoneme_x, x)
        has_previous = (previous > 0)[..., None]
        previous_x = torch.where(drop, self.null_previous.to(x.dtype), self.previous_embed(previous))
        x = x + previous_x * has_previous
        if acoustic is not None and self.codebooks > 1:
            rows = acoustic.long() + torch.arange(self.codebooks - 1, device=acoustic.device) * (self.vocab.speech_size + 1)
            x = x + (self.acoustic_embed(rows) * (acoustic > 0)[..., None]).sum(-2).to(x.dtype)
        return x + self.level_embed(level.long() - 1)[:, None, :]

    def level_hidden(self, input_ids: Tensor, position_ids: Tensor, phonemes: Tensor, previous: Tensor,
                     level: Tensor, drop: Tensor, speaker: Tensor, attention_mask: Tensor | None = None,
                     acoustic: Tensor | None = None) -> Tensor:
        """One pass of the shared decoder -> [B, S, dim] hidden states (counted in ``backbone_calls``)."""
        B, S = input_ids.shape
        if attention_mask is None:  # bidirectional everywhere
            attention_mask = torch.ones(B, S, S, dtype=torch.bool, device=input_ids.device)
        x = self.embed_inputs(input_ids, phonemes, previous, level, drop, acoustic)
        self.backbone_calls += 1
        return self.backbone(x, position_ids, attention_mask, cond=self.speaker_proj(speaker.reshape(B, -1)))

    def level_logits(self, *args: Any, **kwargs: Any) -> Tensor:
        """:meth:`level_hidden` through the shared head -> [B, S, vocab.size] logits."""
        return self.head(self.level_hidden(*args, **kwargs))

    def acoustic_logits(self, hidden: Tensor) -> Tensor:
        """[..., dim] hidden states -> [..., K - 1, speech_size] logits of codebooks 2..K."""
        return self.acoustic_head(hidden).unflatten(-1, (self.codebooks - 1, self.vocab.speech_size))

    # -- training
    def prompt_frames(self, n_frames: int, generator: torch.Generator) -> int:
        """Frames of a training example's prompt: ``U(0, prompt_max) * T`` rounded down to whole level-1
        tokens (a multiple of ``F``), below ``T`` so that a target remains; 0 without ``speech_prompt``."""
        if not self.speech_prompt:
            return 0
        F = self.prompt_multiple
        drawn = float(torch.rand((), generator=generator)) * self.prompt_max * n_frames
        return F * int(min(drawn, n_frames - 1) // F)

    def join_prompt_pair(self, prompt: Utterance, target: Utterance) -> Utterance:
        """Two utterances of one speaker as one cross-sentence training example (``data.prompt_pairs``),
        laid out as a test item is at synthesis: the prompt's phonemes then the target's, the
        speaker embedding of the prompt (synthesis embeds the prompt audio), the prompt's speech
        cut to a whole number of level-1 tokens (``F`` frames) so that every level of the pair is
        the prompt's levels followed by the target's. The cut takes the prompt's last
        ``T_p mod F`` frames (synthesis drops its first ones, :func:`trim_prompt`): that keeps the
        prompt's own coarse tokens (``coarse_tokenizer``) valid as a prefix of each level."""
        from arnar.train.data import join_utterances_plain

        prompt_phonemes, prompt_speaker = self._features(prompt.features, prompt.utt_id)
        target_phonemes, _ = self._features(target.features, target.utt_id)
        F = self.prompt_multiple
        keep = F * (prompt.num_frames // F)
        if keep == 0:  # a prompt shorter than one level-1 token: the target alone
            return target
        joined = join_utterances_plain(prompt, target, prompt_frames=keep)
        joined.features = {"phonemes": torch.cat([prompt_phonemes, target_phonemes]), "speaker": prompt_speaker}
        if self.coarse_tokenizer_path is not None:
            prompt_levels = self.speech_levels(prompt.speech, prompt.features, "coarse", prompt.utt_id)[:-1]
            target_levels = self.speech_levels(target.speech, target.features, "coarse", target.utt_id)[:-1]
            joined.features["coarse"] = [torch.cat([p[: keep // factor], t]) for p, t, factor
                                         in zip(prompt_levels, target_levels, level_factors(self.n_levels))]
        return joined

    def training_example(self, utt: Utterance, generator: torch.Generator) -> Example:
        phonemes, speaker = self._features(utt.features, utt.utt_id)
        T = utt.num_frames
        level = sample_level(self.level_probs, generator)
        tokens = self.speech_levels(utt.speech, utt.features, "coarse", utt.utt_id)
        current = tokens[level - 1]
        N = len(current)
        n_prompt = self.prompt_frames(T, generator) // level_factors(self.n_levels)[level - 1]
        n_target = N - n_prompt
        u = float(torch.rand((), generator=generator))
        n_masked = max(1, math.ceil(cosine_mask_ratio(u) * n_target))
        masked = torch.zeros(N, dtype=torch.bool)
        masked[n_prompt + torch.randperm(n_target, generator=generator)[:n_masked]] = True
        previous = None
        if level > 1:  # Eq. 1, l > 1: conditioned on level l-1, augmented (III-B)
            previous = torch.from_numpy(upsample(tokens[level - 2].numpy(), 2, N))
            previous = corrupt(previous, self.previous_noise, self.vocab.speech_size, generator)
        drop = bool(torch.rand((), generator=generator) < self.condition_dropout)
        shared = self.vocab.speech(current)
        input_ids, phoneme_extra, previous_extra = self._sequence(phonemes, torch.where(masked, MASK, shared), previous)
        P = len(phonemes)
        targets = torch.full_like(input_ids, IGNORE)
        targets[P:][masked] = shared[masked]
        S = P + N
        extras = {"phonemes": phoneme_extra, "previous": previous_extra, "level": torch.tensor(level),
                  "drop": torch.tensor(drop), "speaker": speaker[None],  # [1, D]: never mistaken for per-position
                  "log_frames": torch.tensor(math.log(T), dtype=torch.float)}
        if self.codebooks > 1:  # the rest of the stack at the finest level (module docstring); zeros elsewhere
            acoustic_in = torch.zeros(S, self.codebooks - 1, dtype=torch.long)
            acoustic_targets = torch.zeros(S, self.codebooks - 1, dtype=torch.long)
            if level == self.n_levels:
                stack = self.acoustic_codes(utt).T + 1  # [T, K - 1], codes + 1
                acoustic_in[P:P + n_prompt] = stack[:n_prompt]
                given = ~masked
                given[:n_prompt] = False
                acoustic_targets[P:][given] = stack[given]
            extras["acoustic"], extras["acoustic_targets"] = acoustic_in, acoustic_targets
        return Example(input_ids, self.level_positions(P, N), targets, torch.ones(S, S, dtype=torch.bool), extras)

    def acoustic_codes(self, utt: Utterance) -> Tensor:
        """Codes ``[K - 1, T]`` of codebooks 2..K of ``utt``, checked."""
        stack = utt.acoustic
        if stack is None or tuple(stack.shape) != (self.codebooks - 1, utt.num_frames):
            got = "none" if stack is None else f"shape {tuple(stack.shape)}"
            raise ValueError(f"{utt.utt_id}: CoD with codebooks {self.codebooks} needs codebooks 2..{self.codebooks} "
                             f"of its {utt.num_frames} frames (load_utterances(codebooks={self.codebooks})), got {got}")
        return stack.long()

    def forward(self, batch: Batch) -> LossOutput:
        ex = batch.extras
        speaker = ex["speaker"].reshape(len(batch.input_ids), -1)
        hidden = self.level_hidden(batch.input_ids, batch.position_ids, ex["phonemes"], ex["previous"],
                                   ex["level"], ex["drop"], speaker, batch.attention_mask, ex.get("acoustic"))
        out = token_cross_entropy(self.head(hidden), batch.targets)
        per_sequence_targets = (batch.targets != IGNORE).sum(1).float()
        if self.codebooks > 1:
            # codebooks 2..K at the target frames whose first quantizer is given: one prediction per
            # frame (the mean of its codebooks' cross-entropies), counted as one target
            gold = ex["acoustic_targets"]
            frames = gold[..., 0] > 0
            logits = self.acoustic_logits(hidden[frames]).float()
            codes = gold[frames] - 1
            cross_entropy = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), codes.reshape(-1),
                                                        reduction="none").view_as(codes)
            out.loss_sum = out.loss_sum + cross_entropy.mean(-1).sum()
            out.n_targets = out.n_targets + frames.sum()
            # "correct" stays a share of all predictions: a frame adds the share of its codebooks right
            out.metrics["correct"] = out.metrics["correct"] + (logits.argmax(-1) == codes).float().mean(-1).sum().detach()
            per_sequence_targets = per_sequence_targets + frames.sum(1).float()
        # duration predictor on the (never dropped) phoneme prefix
        n_phonemes = (ex["phonemes"] > 0).sum(1)
        width = max(int(n_phonemes.max()), 1)
        phonemes = (ex["phonemes"][:, :width] - 1).clamp_min(0)
        predicted = self.duration(phonemes, n_phonemes, speaker)
        error = (predicted - ex["log_frames"].float()).abs()
        duration_sum = (error * per_sequence_targets).sum()
        out.loss_sum = out.loss_sum + self.duration_weight * duration_sum
        out.metrics["duration_abs_log_error"] = duration_sum.detach()
        return out

    # -- synthesis
    def _phoneme_tokenizer(self):
        if getattr(self, "_phoneme_tokenizer_cache", None) is None:
            from arnar.text.phonemes import PhonemeTokenizer

            path = self.phoneme_tokenizer_path
            self._phoneme_tokenizer_cache = PhonemeTokenizer.load(path) if path else PhonemeTokenizer()
        return self._phoneme_tokenizer_cache

    def _speaker_encoder(self):
        if getattr(self, "_speaker_encoder_cache", None) is None:
            from arnar.evaluate.similarity import load_speaker_encoder

            self._speaker_encoder_cache = load_speaker_encoder(self.speaker_encoder_name)
        return self._speaker_encoder_cache

    def prepare_request(self, request: SynthesisRequest, *, text: str, prompt_text: str, prompt_audio: np.ndarray,
                        sample_rate: int) -> SynthesisRequest:
        """The request with ``features``: ``phonemes`` of ``text``, ``prompt_phonemes`` of
        ``prompt_text`` (phoneme tokenizer of option ``phoneme_tokenizer``, default inventory when
        unset) and ``speaker``, the embedding of ``prompt_audio`` (mono float at ``sample_rate``)
        by the encoder of option ``speaker_encoder`` (the one the features file was built with)."""
        tokenizer = self._phoneme_tokenizer()
        if tokenizer.vocab_size > self.n_phonemes:
            raise ValueError(f"CoD: the phoneme tokenizer has {tokenizer.vocab_size} ids, the option n_phonemes is "
                             f"{self.n_phonemes}")
        phonemes = tokenizer.encode(text)
        if not phonemes:
            raise ValueError(f"CoD: text {text!r} has no phonemes")
        speaker = self._speaker_encoder().embed([np.asarray(prompt_audio, dtype=np.float32)], int(sample_rate))[0]
        out = dataclasses.replace(request)
        out.features = {**dict(getattr(request, "features", None) or {}),
                        "phonemes": torch.tensor(phonemes, dtype=torch.long),
                        "prompt_phonemes": torch.tensor(tokenizer.encode(prompt_text), dtype=torch.long),
                        "speaker": torch.as_tensor(speaker, dtype=torch.float)}
        if self.coarse_tokenizer_path is not None and self.speech_prompt:
            # the coarse levels of the prompt as generate trims it (trim_prompt: the first T_p mod F
            # frames dropped), from its audio
            skip = len(request.prompt_speech) % self.prompt_multiple
            levels = self._coarse_tokenizer().levels(prompt_audio, int(sample_rate), skip_frames=skip)
            out.features["prompt_coarse"] = [torch.from_numpy(x) for x in levels]
        return out

    def _coarse_tokenizer(self):
        if getattr(self, "_coarse_tokenizer_cache", None) is None:
            from arnar.codec.coarse import CoarseTokenizer

            tokenizer = CoarseTokenizer.load(self.coarse_tokenizer_path)
            if tokenizer.n_levels != self.n_levels:
                raise ValueError(f"CoD with {self.n_levels} levels, its coarse_tokenizer {self.coarse_tokenizer_path} "
                                 f"makes {tokenizer.n_levels}")
            self._coarse_tokenizer_cache = tokenizer
        return self._coarse_tokenizer_cache

    @torch.no_grad()
    def predict_frames(self, phonemes: Tensor, speaker: Tensor) -> int:
        """Finest-level frames of an utterance of ``phonemes`` from the duration predictor."""
        device = self.embed.weight.device
        log_frames = self.duration(phonemes[None].to(device), torch.tensor([len(phonemes)], device=device),
                                   speaker[None].to(device))
        frames = round(math.exp(min(float(log_frames), 30.0)))
        return max(1, min(frames, MAX_FRAMES_PER_PHONEME * len(phonemes)))

    def _decoding_options(self, decoding: dict[str, Any]) -> dict[str, Any]:
        opts = decoding_options("CoD", DECODING, decoding)
        if opts["guidance_form"] not in GUIDANCE_FORMS:
            raise ValueError(f"CoD guidance_form must be one of {sorted(GUIDANCE_FORMS)}, got {opts['guidance_form']!r}")
        if opts["length"] not in ("predictor", "prompt_rate"):
            raise ValueError(f"CoD decoding length must be 'predictor' or 'prompt_rate', got {opts['length']!r}")
        forced = opts["forced_levels"]
        if isinstance(forced, bool) or not isinstance(forced, int) or not 0 <= forced <= self.n_levels:
            raise ValueError(f"CoD forced_levels must be a whole number from 0 to the {self.n_levels} levels, got {forced!r}")
        if forced and self.coarse_tokenizer_path is not None:
            raise ValueError("CoD forced_levels reads the target's decimated first quantizer; this run's coarse levels "
                             "are other tokens (coarse_tokenizer)")
        return opts

    def _plan(self, request: SynthesisRequest, opts: dict[str, Any]) -> dict[str, Any]:
        """One request's inputs (phonemes of prompt transcript + text, speaker, the trimmed prompt
        and its levels) and target length (given, the duration predictor or the prompt's rate)."""
        features = dict(getattr(request, "features", None) or {})
        text_phonemes, speaker = self._features(features, "CoD synthesis request")
        if not len(text_phonemes):
            raise ValueError("CoD synthesis request: the text has no phonemes")
        prompt = trim_prompt(request.prompt_speech.long().cpu(), self.prompt_multiple) if self.speech_prompt \
            else torch.zeros(0, dtype=torch.long)
        prompt_acoustic = torch.zeros(max(self.codebooks - 1, 0), 0, dtype=torch.long)
        if self.codebooks > 1 and len(prompt):  # the prompt's whole stack, trimmed as its first quantizer
            stack = request.prompt_acoustic
            if stack is None or tuple(stack.shape) != (self.codebooks - 1, len(request.prompt_speech)):
                got = "none" if stack is None else f"shape {tuple(stack.shape)}"
                raise ValueError(f"CoD synthesis request: codebooks {self.codebooks} needs the prompt's codebooks "
                                 f"2..{self.codebooks} of its {len(request.prompt_speech)} frames "
                                 f"(request.prompt_acoustic), got {got}")
            prompt_acoustic = stack.long().cpu()[:, stack.shape[1] - len(prompt):]
        prompt_phonemes = torch.zeros(0, dtype=torch.long)
        if self.speech_prompt:
            prompt_phonemes, _ = self._features({"phonemes": features.get("prompt_phonemes", prompt_phonemes),
                                                 "speaker": speaker}, "CoD synthesis request (prompt)")
        duration_passes = 0
        if request.target_frames:
            n_frames, length_from = int(request.target_frames), "given"
        elif opts["length"] == "prompt_rate":
            n_frames = total_frames_estimate(len(request.prompt_speech), len(prompt_phonemes), len(text_phonemes))
            length_from = "prompt_rate"
        else:
            n_frames, length_from, duration_passes = self.predict_frames(text_phonemes, speaker), "predictor", 1
        prompt_levels = self.speech_levels(prompt, features, "prompt_coarse", "CoD synthesis request (prompt)") \
            if self.speech_prompt else [torch.zeros(0, dtype=torch.long)] * self.n_levels
        forced = None
        if opts["forced_levels"]:
            forced = features.get("forced_speech")
            if forced is None or forced.dim() != 1 or len(forced) != n_frames or length_from != "given":
                got = "none" if forced is None else f"shape {tuple(forced.shape)}"
                raise ValueError(f"CoD forced_levels needs the target's first-quantizer codes as features['forced_speech'] "
                                 f"and target_frames of the same length; got {got}, target_frames {request.target_frames}")
            forced = forced.long().cpu()
        return {"phonemes": torch.cat([prompt_phonemes, text_phonemes]), "speaker": speaker, "prompt": prompt,
                "prompt_acoustic": prompt_acoustic, "prompt_levels": prompt_levels, "n_frames": n_frames, "length_from": length_from,
                "duration_passes": duration_passes, "level_lengths": [], "finished": None, "forced": forced}

    def _level_sequence(self, item: dict[str, Any], level: int, factor: int) -> tuple[Tensor, Tensor, Tensor]:
        """One item's sequence at ``level`` (:meth:`_sequence`): its prompt's tokens of the level,
        ``<mask>`` for the target, conditioned on the item's previous level (``finished``). Sets
        the item's ``start`` (first target position) and ``n_target``."""
        n_prompt = len(item["prompt"]) // factor
        n_target = math.ceil(item["n_frames"] / factor)
        N = n_prompt + n_target
        item["level_lengths"].append(N)
        finished = item["finished"]
        previous = None if finished is None else torch.from_numpy(upsample(finished.numpy(), 2, N))
        current = torch.cat([self.vocab.speech(item["prompt_levels"][level - 1]),
                             torch.full((n_target,), MASK, dtype=torch.long)])
        item["start"], item["n_target"] = len(item["phonemes"]) + n_prompt, n_target
        return self._sequence(item["phonemes"], current, previous)

    @torch.no_grad()
    def generate(self, request: SynthesisRequest, generator: torch.Generator, **decoding: Any) -> Generation:
        return self.generate_batch([request], [generator], **decoding)[0]

    @torch.no_grad()
    def generate_batch(self, requests: list[SynthesisRequest], generators: list[torch.Generator],
                       **decoding: Any) -> list[Generation]:
        """Level-by-level MaskGIT decoding of B requests, one backbone pass per step for all of them
        and both CFG inputs (rows ``0..B-1`` conditional, ``B..2B-1`` unconditional): sequences
        right-padded (padding keys masked), every item on its own lengths and schedules, guided,
        noised and sampled from its own generator exactly as alone (B = 1 is :meth:`generate`). A
        level ends when every item's is done (an item done early rides along unchanged); the
        duration predictor runs once per item that needs it, alone. ``forward_passes`` is the
        batch's."""
        if len(requests) != len(generators):
            raise ValueError(f"{len(requests)} requests but {len(generators)} generators")
        opts = self._decoding_options(decoding)
        steps = int(opts["steps"])
        items = [self._plan(request, opts) for request in requests]
        device = self.embed.weight.device
        guidance = linear_schedule(opts["guidance_start"], opts["guidance_end"], steps)
        noise = linear_schedule(opts["noise_start"], opts["noise_end"], steps)
        form = opts["guidance_form"]
        guided = any(w != GUIDANCE_FORMS[form] for w in guidance)  # else every step is the conditional model
        B = len(items)
        copies = 2 if guided else 1  # the conditional rows, then as many unconditional ones

        def rows(t: Tensor) -> Tensor:
            return t.repeat(copies, *[1] * (t.dim() - 1))

        drop = torch.arange(copies * B, device=device) >= B
        speaker_rows = rows(torch.stack([item["speaker"] for item in items]).to(device))
        calls_before = self.backbone_calls
        for level, factor in enumerate(level_factors(self.n_levels), start=1):
            sequences = [self._level_sequence(item, level, factor) for item in items]
            input_ids, keys = right_padded([seq[0] for seq in sequences], device)
            phoneme_extra, _ = right_padded([seq[1] for seq in sequences], device, pad=0)
            previous_extra, _ = right_padded([seq[2] for seq in sequences], device, pad=0)
            positions, _ = right_padded([self.level_positions(len(item["phonemes"]), item["level_lengths"][-1])
                                         for item in items], device, pad=0)  # a padding key is never attended
            acoustic = None
            if self.codebooks > 1 and level == self.n_levels:  # the prompt's whole stack in context
                acoustic = torch.zeros(B, input_ids.shape[1], self.codebooks - 1, dtype=torch.long)
                for b, item in enumerate(items):
                    first = len(item["phonemes"])
                    acoustic[b, first:first + item["prompt_acoustic"].shape[1]] = item["prompt_acoustic"].T + 1
                acoustic = rows(acoustic.to(device))
            batch_inputs = dict(position_ids=rows(positions),
                                phonemes=rows(phoneme_extra), previous=rows(previous_extra),
                                level=torch.full((copies * B,), level, device=device), drop=drop,
                                speaker=speaker_rows, attention_mask=rows(padded_attention(keys)))
            if acoustic is not None:
                batch_inputs["acoustic"] = acoustic
            masked = [torch.ones(item["n_target"], dtype=torch.bool, device=device) for item in items]
            if level <= opts["forced_levels"]:  # the target's own tokens, committed before any pass
                for b, item in enumerate(items):
                    truth = torch.from_numpy(decimate(item["forced"].numpy(), factor))
                    input_ids[b, item["start"]:item["start"] + item["n_target"]] = self.vocab.speech(truth).to(device)
                    masked[b][:] = False
            schedules = [masks_per_step(item["n_target"], steps) for item in items]
            for step in range(steps):
                active = [b for b in range(B) if bool(masked[b].any())]
                if not active:
                    break
                logits = self.level_logits(rows(input_ids), **batch_inputs)
                for b in active:
                    start, n_target, generator = items[b]["start"], items[b]["n_target"], generators[b]
                    item_logits = logits[b::B, start:start + n_target, self.vocab.speech_offset:].float()  # speech codes only
                    step_logits = guided_logits(item_logits[0], item_logits[1], guidance[step], form) if guided \
                        else item_logits[0]
                    if noise[step] > 0:
                        gaussian = torch.randn(step_logits.shape, generator=generator).to(device)
                        step_logits = step_logits + math.sqrt(noise[step]) * gaussian
                    codes, probs = sample_tokens(step_logits, generator, temperature=opts["temperature"],
                                                 top_k=opts["top_k"], top_p=opts["top_p"])
                    # committed tokens are never re-masked; of the fresh ones, the least confident wait
                    confidence = probs.masked_fill(~masked[b], float("inf"))
                    target_ids = input_ids[b, start:start + n_target].clone()
                    target_ids[masked[b]] = self.vocab.speech(codes[masked[b]])
                    still_masked = torch.zeros_like(masked[b])
                    keep_masked = schedules[b][step]
                    if keep_masked > 0:
                        still_masked[torch.topk(confidence, keep_masked, largest=False).indices] = True
                    target_ids[still_masked] = MASK
                    input_ids[b, start:start + n_target] = target_ids
                    masked[b] = still_masked
            for b, item in enumerate(items):
                P = len(item["phonemes"])
                item["finished"] = self.vocab.speech_codes(input_ids[b, P:item["start"] + item["n_target"]].cpu())
        speech = [item["finished"][len(item["prompt"]):] for item in items]
        if self.codebooks > 1:  # one more pass reads codebooks 2..K of every generated frame (module docstring)
            conditional = {key: value[:B] for key, value in batch_inputs.items()}
            hidden = self.level_hidden(input_ids[:B], **conditional)
            for b, item in enumerate(items):
                logits = self.acoustic_logits(hidden[b, item["start"]:item["start"] + item["n_target"]]).float().cpu()
                speech[b] = torch.cat([speech[b][None], self.acoustic_sample(logits, opts["acoustic_temperature"],
                                                                              generators[b]).T])
        passes = self.backbone_calls - calls_before
        return [Generation(codes, forward_passes=passes, info={
            "target_frames": item["n_frames"], "length_from": item["length_from"], "levels": self.n_levels,
            "steps": steps, "level_lengths": item["level_lengths"], "prompt_frames_used": len(item["prompt"]),
            "duration_passes": item["duration_passes"], "guidance_form": form, "codebooks": self.codebooks})
            for item, codes in zip(items, speech)]

    @staticmethod
    def acoustic_sample(logits: Tensor, temperature: float, generator: torch.Generator) -> Tensor:
        """Codes ``[n, K - 1]`` from logits ``[n, K - 1, V]``: the most likely at temperature 0,
        else drawn from ``softmax(logits / temperature)`` with ``generator``."""
        if temperature < 0:
            raise ValueError(f"CoD acoustic_temperature must be >= 0, got {temperature}")
        if temperature == 0 or logits.shape[0] == 0:
            return logits.argmax(-1)
        probs = (logits / temperature).softmax(-1)
        flat = torch.multinomial(probs.reshape(-1, probs.shape[-1]), 1, generator=generator)
        return flat.view(probs.shape[:-1])
