"""DELTA-TTS: an AR speech-token LM converted into a masked diffusion LM (DELTA-TTS, OpenReview v2DbAIl7sf).

Conversion (Sec. 3.2-3.3). The model is built with the *same* backbone config as the AR run it
converts; its embedding, backbone and head are the AR weights (option ``ar_run``, or
:meth:`DeltaTTS.from_ar` / :func:`convert_ar` on an in-memory AR model), frozen. Then:

* the causal mask becomes bidirectional (``logits`` with no mask attends everywhere);
* every block gets LoRA (Hu et al. 2021) on its attention and feed-forward projections
  (``q/k/v/o_proj``, ``gate/up/down_proj``); ``lora_B = 0``, so each starts as its base layer;
* after every block a Conformer convolution module (pointwise conv, GLU, depth-wise conv, Swish,
  pointwise conv; :class:`arnar.nn.ConformerConvModule`) is a residual branch. Its last
  pointwise conv starts at zero, so the branch starts as the identity and the converted model
  computes exactly the AR model's function (tests check the next-token logits on a causal input).
  It runs over the whole sequence, as the paper's branch after each block does (text and speech
  alike; only ``<pad>`` is excluded). The paper gives no kernel size; ours is 15 (0.6 s at
  25 Hz, "a short window") and the norm a per-frame LayerNorm (``conv_norm: batch`` is
  Conformer's BatchNorm, whose statistics would mix the sequences of a batch);
* the mask token M is the one new embedding, initialised to the mean of the speech-token
  embeddings (Sec. 3.4) and trained. It is a separate parameter (``mask_embedding``) that
  replaces the ``<mask>`` id's row of the frozen shared table wherever the input holds ``<mask>``.

The backbone has to run block by block to put the convolutions between the blocks:
:meth:`DeltaTTS.hidden_states` is :meth:`arnar.nn.Transformer.forward` without the KV cache and
adaLN (which a converted AR LM has neither of) with a convolution after each block.

Layout (Eq. 1, the AR model's own, one running position range)::

    <sos> x_ref x_gen <turn> s_prompt s_target <eos>

Only ``s_target`` is ever masked. Shift operation (Sec. 3.4, from the AR-to-dLLM conversions):
the hidden state at position ``i`` predicts the token at ``i + 1``, as in the AR model, so the
target token at sequence index ``j`` is scored from the output at ``j - 1`` (for the first target
token that is the last prompt token, or ``<turn>`` without a prompt).

Training (Eq. 2). One utterance gives one example: a random prefix of its speech, up to
``prompt_max`` of it, is the unmasked prompt (the paper's prompt-conditioned training,
Table 5; ``prompt_max: 0`` turns it off) and the rest is ``s_target``; its full transcript is the
text, as in the AR and NAR baselines. ``t = t_min + (1 - t_min) u`` with ``u ~ U(0, 1)``: the floor
``t_min`` (0.02) keeps the ``1/t`` weight at most 50, so that one masked token of a
barely-masked utterance cannot make a loss spike of ~1000x; below ``t_min`` the objective is
simply not sampled. Each target token is masked independently with probability ``t``, and the
loss is cross-entropy on the masked positions (over the speech codes, the decoding
distribution) times ``1/t``.

Normalisation. The engine divides ``loss_sum`` by the global ``n_targets``. ``loss_sum`` is
``sum_b (1/t_b) sum_{masked i} -log p``, i.e. Eq. 2's bracket summed over the batch, and
``n_targets`` is the number of target tokens ``sum_b L_b``, masked or not. Since
``E[#masked] = t L``, ``(1/t) sum_masked`` is an unbiased estimate of ``sum_{i<=L}`` of the
per-token loss, so ``loss_sum / n_targets`` estimates the ELBO per target token, comparable
across batches whatever their ``t`` (LLaDA divides by the sequence length the same way).
Metrics: ``masked`` (masked tokens), ``correct`` (argmax hits among them), ``masked_ce``
(unweighted CE sum); the engine logs each over ``n_targets``, so accuracy is
``correct / masked`` and the plain masked CE is ``masked_ce / masked``.

Decoding (Sec. 3.5). ``s_target`` starts as ``L`` masks; each of ``steps`` (T) iterations predicts
every masked position, draws a candidate with top-p sampling, takes as confidence the sampled
token's probability, and commits the ``k_n`` most confident, ``k_n`` from the time-shifted
schedule (Eq. 3, :mod:`arnar.decode.delta_schedules`; ``schedule: uniform`` is ``mu = 1``). A
step with ``k_n = 0`` (a short target with ``mu < 1``) would commit nothing, so no pass is run
for it; ``forward_passes`` counts the real backbone calls, ``T`` whenever ``L`` is long enough
that every step commits something. ``L`` is the request's ``target_frames`` when given,
otherwise the paper's rule-based length (see ``target_length``).

Ablations (Table 5, Fig. 2): decoding options ``schedule`` (``shifted``/``uniform``), ``mu`` and
``steps`` (4/8/16); training options ``conv: false``; ``match_conv_budget: true`` (with
``conv: false``: LoRA rank raised until LoRA alone has the trainable parameters of LoRA + conv);
``unfreeze: true`` (every weight trains); ``prompt_max: 0``.

Causal-LoRA baseline (Table 5 text: "Fine-tuning the AR backbone on the same corpus with LoRA
while keeping causal decoding reaches 1.87%, so part of the gain comes from English-only
adaptation; the conversion accounts for the remainder"): ``causal: true`` (with ``conv: false``)
is the same AR model with the same LoRA adapters (rank, alpha, the seven projections), frozen
otherwise, trained on the same data for the same updates, but *not converted*: causal mask, the
AR objective (:meth:`arnar.paradigms.ar.AR.training_example`, next-token cross-entropy on the
speech and ``<eos>``) and AR decoding (:meth:`arnar.paradigms.ar.AR.generate`, KV cache), no
conv modules and no mask token. DELTA minus this row is the conversion's own effect, the
extra training taken out. (The conv module's kernel sees future frames, so it has no place in
causal decoding; ``match_conv_budget: true`` gives the LoRA rank of DELTA's whole trainable
budget instead of its LoRA rank.)

Choices the paper's text leaves open (all options): LoRA rank 16 / alpha 32, conv kernel 15,
``mu = 0.3``, top-p 0.9, ``t_min`` 0.02, prompt prefix up to 40 % of the utterance, the length
rule's weights (:mod:`arnar.decode.delta_schedules`).

Paper-scale path: :func:`ar_from_cosyvoice_lm` (bottom of this file).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from arnar.decode.delta_schedules import piece_weight, rule_based_frames, unmask_counts
from arnar.decode.sampling import sample_tokens
from arnar.paradigms import register_paradigm
from arnar.paradigms.ar import AR
from arnar.paradigms.base import (
    decoding_options,
    EOS,
    IGNORE,
    MASK,
    PAD,
    SOS,
    TURN,
    Example,
    Generation,
    LossOutput,
    Paradigm,
    SynthesisRequest,
    Utterance,
    Vocab,
    padded_attention,
    right_padded,
)

log = logging.getLogger(__name__)

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
DECODING = {"steps": 16, "schedule": "shifted", "mu": 0.3, "temperature": 1.0, "top_k": 0, "top_p": 0.9,
            "length": "auto", "space_weight": 0.3, "punct_weight": 0.5}


def delta_sequence(vocab: Vocab, text: torch.Tensor, prompt: torch.Tensor, target: torch.Tensor,
                   masked: torch.Tensor) -> torch.Tensor:
    """``<sos> text <turn> prompt target <eos>`` in shared ids (Eq. 1), the target positions where
    ``masked`` is True replaced by ``<mask>``."""
    target_ids = torch.where(masked, torch.tensor(MASK), vocab.speech(target))
    return torch.cat([torch.tensor([SOS]), vocab.text(text), torch.tensor([TURN]), vocab.speech(prompt),
                      target_ids, torch.tensor([EOS])])


def lora_parameters_per_rank(cfg: Any) -> int:
    """LoRA parameters one unit of rank adds to one block: ``in + out`` of every adapted projection."""
    kv = cfg.kv_heads * cfg.head_dim
    attention = (cfg.dim + cfg.dim) + (cfg.dim + kv) * 2 + (cfg.dim + cfg.dim)  # q, k, v, o
    feed_forward = 3 * (cfg.dim + cfg.hidden_dim)  # gate, up, down
    return attention + feed_forward


def conv_module(dim: int, kernel_size: int, norm: str, dropout: float) -> nn.Module:
    """A Conformer convolution module whose last pointwise conv is zero: it starts as the identity."""
    from arnar.nn import ConformerConvModule

    module = ConformerConvModule(dim, kernel_size=kernel_size, dropout=dropout, norm=norm)
    nn.init.zeros_(module.pointwise_out.weight)
    nn.init.zeros_(module.pointwise_out.bias)
    return module


@register_paradigm
class DeltaTTS(AR):
    """The AR paradigm converted (an :class:`AR` subclass: ``causal: true`` keeps AR's example,
    objective and decoding, the Table 5 causal-LoRA baseline)."""

    name = "delta"

    def __init__(self, vocab, model, *, ar_run: str | None = None, bpe_model: str | None = None,
                 lora_rank: int = 16, lora_alpha: float = 32.0, lora_dropout: float = 0.0,
                 conv: bool = True, conv_kernel: int = 15, conv_norm: str = "layer", conv_dropout: float | None = None,
                 match_conv_budget: bool = False, unfreeze: bool = False,
                 prompt_max: float = 0.4, t_min: float = 0.02, causal: bool = False, **options: Any):
        super().__init__(vocab, model, ar_run=ar_run, bpe_model=bpe_model, lora_rank=lora_rank,
                         lora_alpha=lora_alpha, lora_dropout=lora_dropout, conv=conv, conv_kernel=conv_kernel,
                         conv_norm=conv_norm, conv_dropout=conv_dropout, match_conv_budget=match_conv_budget,
                         unfreeze=unfreeze, prompt_max=prompt_max, t_min=t_min, causal=causal, **options)
        if options:
            raise ValueError(f"delta: unknown options {sorted(options)}")
        self.causal = bool(causal)
        if self.causal and conv:
            raise ValueError("delta causal (the causal-LoRA baseline) decodes left to right: the conv module sees "
                             "future frames; set conv: false")
        cfg = self.model_config
        if cfg.cond_dim:
            raise ValueError("delta converts a plain AR LM: the backbone must have cond_dim = 0")
        if not 0.0 <= prompt_max < 1.0:
            raise ValueError(f"prompt_max must be in [0, 1), got {prompt_max}")
        if not 0.0 < t_min <= 1.0:
            raise ValueError(f"t_min must be in (0, 1], got {t_min}")
        if match_conv_budget and conv:
            raise ValueError("match_conv_budget raises the LoRA rank *instead of* the conv module: set conv: false")
        if lora_rank < 0:
            raise ValueError(f"lora_rank must be >= 0 (0: no LoRA), got {lora_rank}")
        self.prompt_max, self.t_min = prompt_max, t_min
        self.backbone_calls = 0  # real backbone passes, for Generation.forward_passes

        # LoRA on every block's attention and feed-forward projections (Sec. 3.3)
        conv_dropout = cfg.dropout if conv_dropout is None else conv_dropout
        if match_conv_budget:
            conv_params = sum(p.numel() for p in conv_module(cfg.dim, conv_kernel, conv_norm, 0.0).parameters())
            lora_rank = lora_rank + math.ceil(conv_params / lora_parameters_per_rank(cfg))
        self.lora_rank = lora_rank
        if lora_rank > 0:
            from arnar.nn import apply_lora

            apply_lora(self.backbone, LORA_TARGETS, rank=lora_rank, alpha=lora_alpha, dropout=lora_dropout)
        # a Conformer convolution module after every block, starting as the identity
        self.conv_modules = None
        if conv:
            self.conv_modules = nn.ModuleList(
                conv_module(cfg.dim, conv_kernel, conv_norm, conv_dropout) for _ in range(cfg.n_layers))
        # the mask token M (re-initialised from the AR embeddings by load_ar_weights); none when causal
        self.mask_embedding = None if self.causal else nn.Parameter(self.mean_speech_embedding())

        self.text_pieces: list[tuple[str, bool]] | None = None
        if bpe_model is not None:
            self.text_pieces = self.load_text_pieces(bpe_model)
        if ar_run is not None:
            from arnar.train import load_model

            ar_model, _ = load_model(ar_run, checkpoint="best")
            self.load_ar_weights(ar_model)
        else:
            log.info("delta: no ar_run given; the backbone is not a trained AR model until load_ar_weights()")
        self.set_trainable(unfreeze)

    # ------------------------------------------------------------------------- conversion
    @classmethod
    def from_ar(cls, ar_model: Paradigm, **options: Any) -> DeltaTTS:
        """Convert an in-memory AR paradigm (same vocab and backbone config, taken from it)."""
        if options.get("ar_run") is not None:
            raise ValueError("from_ar converts the model it is given: do not pass ar_run as well")
        delta = cls(ar_model.vocab, ar_model.model_config, **options)
        delta.load_ar_weights(ar_model)  # copies values only: which parameters train stays as set
        return delta.to(ar_model.embed.weight.device)

    @torch.no_grad()
    def mean_speech_embedding(self) -> torch.Tensor:
        return self.embed.weight[self.vocab.speech_offset:].mean(0).clone()

    @torch.no_grad()
    def load_ar_weights(self, ar_model: Paradigm | Mapping[str, torch.Tensor]) -> None:
        """Copy an AR model's embedding, backbone and head into this model and set M to the mean
        of its speech embeddings. Every AR tensor must land (LoRA-wrapped layers keep theirs
        under ``.base``); only the new parts (LoRA, conv, M) are left out."""
        if isinstance(ar_model, Paradigm):
            if ar_model.vocab != self.vocab:
                raise ValueError(f"AR vocab {ar_model.vocab} != this model's {self.vocab}")
            if ar_model.model_config != self.model_config:
                raise ValueError("the AR model's backbone config differs from this one: build delta with the "
                                 f"AR run's model config ({ar_model.model_config.to_dict()})")
            state = ar_model.state_dict()
        else:
            state = dict(ar_model)
        ours = self.state_dict()
        # our name without LoRA's ".base" -> our name
        by_ar_name = {name.replace(".base.", "."): name for name in ours
                      if ".lora_" not in name and not name.startswith(("conv_modules.", "mask_embedding"))}
        missing = sorted(set(by_ar_name) - set(state))
        unexpected = sorted(set(state) - set(by_ar_name))
        if missing or unexpected:
            raise ValueError(f"not an AR state dict of this shape: missing {missing[:6]}, unexpected {unexpected[:6]}")
        for ar_name, tensor in state.items():
            target = ours[by_ar_name[ar_name]]
            if target.shape != tensor.shape:
                raise ValueError(f"{ar_name}: AR shape {tuple(tensor.shape)} != {tuple(target.shape)}")
            target.copy_(tensor)
        if self.mask_embedding is not None:
            self.mask_embedding.copy_(self.mean_speech_embedding())

    def set_trainable(self, unfreeze: bool = False) -> None:
        """Default: only LoRA, the conv modules and M train; ``unfreeze``: everything trains."""
        self.requires_grad_(unfreeze)
        if unfreeze:
            return
        for name, parameter in self.named_parameters():
            if ".lora_" in name or name.startswith("conv_modules.") or name == "mask_embedding":
                parameter.requires_grad_(True)

    def load_text_pieces(self, bpe_model: str) -> list[tuple[str, bool]]:
        """The sentencepiece pieces of the BPE ids (for the length rule's character weights),
        as ``(piece, is_control)`` per BPE id."""
        from arnar.text import load_text_tokenizer

        bpe = load_text_tokenizer(bpe_model)
        if bpe.vocab_size != self.vocab.text_size:
            raise ValueError(f"{bpe_model}: {bpe.vocab_size} pieces, but the model has {self.vocab.text_size} text ids")
        controls = {bpe.bos_id, bpe.eos_id, bpe.pad_id} - {-1}
        return [(bpe.id_to_piece(i), i in controls) for i in range(bpe.vocab_size)]

    # ------------------------------------------------------------------------- computation
    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The frozen shared embedding, with M wherever the input holds ``<mask>``."""
        x = self.embed(input_ids)
        is_mask = (input_ids == MASK)[..., None]
        return torch.where(is_mask, self.mask_embedding.to(x.dtype), x)

    def hidden_states(self, input_ids: torch.Tensor, position_ids: torch.Tensor,
                      attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """``[B, S]`` ids -> ``[B, S, dim]``: the backbone's blocks, each followed by its conv
        module, then the final norm. ``attention_mask`` ``[S, S]`` or ``[B, S, S]`` bool (True =
        may attend); ``None`` is bidirectional (the converted model's mask). Conv modules see
        ``<pad>`` positions as padding."""
        from arnar.nn.transformer import rope_cos_sin

        x = self.embed_tokens(input_ids)
        B, S, _ = x.shape
        if position_ids.dim() == 1:
            position_ids = position_ids.unsqueeze(0).expand(B, -1)
        if attention_mask is None:
            attention_mask = torch.ones(S, S, dtype=torch.bool, device=x.device)
        if attention_mask.dtype != torch.bool or attention_mask.shape[-2:] != (S, S) or attention_mask.dim() not in (2, 3):
            raise ValueError(f"attention_mask must be bool [S, S] or [B, S, S] with S={S}, got "
                             f"{attention_mask.dtype} {tuple(attention_mask.shape)}")
        mask = attention_mask[None, None] if attention_mask.dim() == 2 else attention_mask[:, None]
        cfg = self.model_config
        cos, sin = rope_cos_sin(position_ids, cfg.head_dim, cfg.rope_theta, x.dtype)
        real = input_ids != PAD
        for i, block in enumerate(self.backbone.layers):
            x = block(x, cos, sin, mask, False, None, None)
            if self.conv_modules is not None:
                x = self.conv_modules[i](x, real)
        self.backbone_calls += 1
        return self.backbone.norm(x)

    def logits(self, input_ids, position_ids, attention_mask=None, cache=None, cond=None):
        """Full-vocabulary logits (the Paradigm contract); bidirectional when no mask is given
        (causal, with the KV cache, for the causal-LoRA baseline)."""
        if self.causal:
            return super().logits(input_ids, position_ids, attention_mask, cache=cache, cond=cond)
        if cache is not None or cond is not None:
            raise ValueError("delta has no KV cache (bidirectional) and no condition vector")
        return self.head(self.hidden_states(input_ids, position_ids, attention_mask))

    def speech_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[..., dim]`` -> ``[..., speech_size]``: the head's speech rows only (targets are
        always speech codes, so training and decoding use the same distribution)."""
        return F.linear(hidden, self.head.weight[self.vocab.speech_offset:])

    # ------------------------------------------------------------------------- training
    def sequence_length(self, utt: Utterance) -> int:
        if self.causal:
            return len(utt.text) + utt.num_frames + 2  # AR's inputs: <sos> text <turn> speech
        return len(utt.text) + utt.num_frames + 3  # <sos> <turn> <eos>

    def training_example(self, utt: Utterance, generator: torch.Generator) -> Example:
        if self.causal:
            return super().training_example(utt, generator)
        T = utt.num_frames
        # prompt-conditioned training: an unmasked prefix of up to prompt_max; >= 1 target frame
        n_prompt = min(int(torch.rand((), generator=generator) * self.prompt_max * T), T - 1)
        n_target = T - n_prompt
        t = self.t_min + (1.0 - self.t_min) * float(torch.rand((), generator=generator))
        masked = torch.rand(n_target, generator=generator) < t
        prompt, target = utt.speech[:n_prompt], utt.speech[n_prompt:]
        inputs = delta_sequence(self.vocab, utt.text, prompt, target, masked)
        start = len(inputs) - 1 - n_target  # index of the first target token
        targets = torch.full_like(inputs, IGNORE)
        # shift: the output at j - 1 predicts the target token at j
        targets[start - 1:start - 1 + n_target][masked] = self.vocab.speech(target[masked])
        S = len(inputs)
        return Example(inputs, torch.arange(S), targets, torch.ones(S, S, dtype=torch.bool),
                       extras={"t": torch.tensor(t, dtype=torch.float32), "n_target": torch.tensor(n_target)})

    def forward(self, batch) -> LossOutput:
        """Eq. 2 summed over the batch (see the module docstring for the normalisation); the AR
        objective when causal."""
        if self.causal:
            return super().forward(batch)
        hidden = self.hidden_states(batch.input_ids, batch.position_ids, batch.attention_mask)
        scored = batch.targets != IGNORE
        example_of = scored.nonzero(as_tuple=True)[0]
        logits = self.speech_logits(hidden[scored]).float()
        gold = self.vocab.speech_codes(batch.targets[scored])
        ce = F.cross_entropy(logits, gold, reduction="none")
        inverse_t = 1.0 / batch.extras["t"].float()
        loss_sum = (ce * inverse_t[example_of]).sum()
        metrics = {"masked": scored.sum().float(), "correct": (logits.argmax(-1) == gold).sum().float(),
                   "masked_ce": ce.sum().detach()}
        return LossOutput(loss_sum, batch.extras["n_target"].sum(), metrics)

    # ------------------------------------------------------------------------- decoding
    def text_weight(self, ids: torch.Tensor, space_weight: float, punct_weight: float) -> float:
        """``W`` of BPE ids: their pieces' character weights, or 1 per id without a BPE model."""
        if self.text_pieces is None:
            return float(len(ids))
        total = 0.0
        for i in ids.tolist():
            piece, control = self.text_pieces[i]
            total += piece_weight(piece, space_weight, punct_weight, control=control)
        return total

    def target_length(self, request: SynthesisRequest, opts: dict[str, Any]) -> tuple[int, str]:
        """``(L, how)``. ``length``: ``given`` = ``request.target_frames`` (the ground truth);
        ``rule`` = ``r_prompt * W_target`` (the paper's rule-based variant; characters from the
        BPE pieces when the ``bpe_model`` option is set, else every BPE id weighs 1, which is
        PALLE (arXiv:2504.10352) Eq. 11); ``auto`` = given when the request has it, else the rule."""
        how = opts["length"]
        if how not in ("auto", "given", "rule"):
            raise ValueError(f"delta: length must be auto, given or rule, got {how!r}")
        if how == "given" or (how == "auto" and request.target_frames is not None):
            if request.target_frames is None or int(request.target_frames) < 1:
                raise ValueError("delta: length=given needs request.target_frames >= 1")
            return int(request.target_frames), "given"
        w_prompt = self.text_weight(request.prompt_text, opts["space_weight"], opts["punct_weight"])
        w_target = self.text_weight(request.text, opts["space_weight"], opts["punct_weight"])
        frames = rule_based_frames(len(request.prompt_speech), w_prompt, w_target)
        return frames, "rule_characters" if self.text_pieces is not None else "rule_bpe_count"

    @property
    def generate_batch(self):
        """Batched decoding: AR's for the causal-LoRA baseline, else the masked model's own."""
        return super().generate_batch if self.causal else self.generate_masked_batch

    @torch.no_grad()
    def generate(self, request: SynthesisRequest, generator: torch.Generator, **decoding: Any) -> Generation:
        if self.causal:  # AR decoding with AR's options (top-k/top-p, RAS, length bounds)
            return super().generate(request, generator, **decoding)
        return self.generate_masked_batch([request], [generator], **decoding)[0]

    @torch.no_grad()
    def generate_masked_batch(self, requests: list[SynthesisRequest], generators: list[torch.Generator],
                              **decoding: Any) -> list[Generation]:
        """Masked-diffusion decoding (Eq. 3 schedule, confidence commits) of B requests, one pass
        per step for all: sequences right-padded (padding keys masked, the conv modules see
        ``<pad>`` as padding), each item committing its own schedule's count from its own
        generator exactly as alone; B = 1 is :meth:`generate`. A step where no item commits is
        skipped, as alone."""
        if len(requests) != len(generators):
            raise ValueError(f"{len(requests)} requests but {len(generators)} generators")
        opts = decoding_options("delta", DECODING, decoding)
        if opts["schedule"] not in ("shifted", "uniform"):
            raise ValueError(f"delta: schedule must be shifted or uniform, got {opts['schedule']!r}")
        mu = opts["mu"] if opts["schedule"] == "shifted" else 1.0  # mu = 1 in Eq. 3 is uniform
        steps = int(opts["steps"])
        device = self.embed.weight.device
        sampling = {"temperature": opts["temperature"], "top_k": opts["top_k"], "top_p": opts["top_p"]}
        items = []
        for request in requests:
            n_target, length_from = self.target_length(request, opts)
            text = torch.cat([request.prompt_text, request.text])
            sequence = delta_sequence(self.vocab, text, request.prompt_speech, torch.zeros(n_target, dtype=torch.long),
                                      torch.ones(n_target, dtype=torch.bool))
            items.append({"sequence": sequence, "start": len(sequence) - 1 - n_target, "n_target": n_target,
                          "length_from": length_from, "commits": unmask_counts(n_target, steps, mu),
                          "masked": torch.ones(n_target, dtype=torch.bool),
                          # the masked target positions, ascending (the draws' order)
                          "still": torch.arange(n_target)})
        batch, keys = right_padded([item["sequence"] for item in items], device)
        positions = torch.arange(batch.shape[1], device=device)
        attention = padded_attention(keys)
        calls_before = self.backbone_calls
        for step in range(len(items[0]["commits"])):
            if all(item["commits"][step] == 0 for item in items):
                continue  # nothing to commit at this step: a pass would change nothing
            hidden_all = self.hidden_states(batch, positions, attention)
            for b, (item, generator) in enumerate(zip(items, generators)):
                k, start, n_target, still = item["commits"][step], item["start"], item["n_target"], item["still"]
                if k == 0:
                    continue
                hidden = hidden_all[b, start - 1:start - 1 + n_target]  # shift: the output at j - 1 predicts token j
                # sampled on the CPU: the caller's generator is a CPU generator
                logits = self.speech_logits(hidden[still.to(device)]).float().cpu()
                codes, confidence = sample_tokens(logits, generator, **sampling)
                chosen = torch.topk(confidence, k).indices
                commit = still[chosen]
                batch[b, start + commit.to(device)] = self.vocab.speech(codes[chosen]).to(device)
                item["masked"][commit] = False
                item["still"] = item["masked"].nonzero(as_tuple=True)[0]
        passes = self.backbone_calls - calls_before
        out = []
        for b, item in enumerate(items):
            assert not item["masked"].any(), "the schedule must commit every target token"
            start, n_target = item["start"], item["n_target"]
            out.append(Generation(self.vocab.speech_codes(batch[b, start:start + n_target].cpu()), forward_passes=passes,
                                  first_packet_passes=passes,
                                  info={"target_frames": n_target, "length_from": item["length_from"], "steps": steps,
                                        "mu": float(mu), "schedule": opts["schedule"]}))
        return out

    def describe(self) -> dict[str, Any]:
        out = super().describe()
        out["trainable_parameters"] = sum(p.numel() for p in self.parameters() if p.requires_grad)
        out["lora_rank"] = self.lora_rank
        return out


def convert_ar(ar_model: Paradigm, **options: Any) -> DeltaTTS:
    """The conversion of Sec. 3.2-3.3 applied to an in-memory AR paradigm (:meth:`DeltaTTS.from_ar`)."""
    return DeltaTTS.from_ar(ar_model, **options)


# ----------------------------------------------------------------------------- paper scale

def ar_from_cosyvoice_lm(llm_state_dict: Mapping[str, torch.Tensor], hf_config: Any, *, version: int,
                         speech_size: int = 6561, drop_head_bias: bool = False) -> Paradigm:
    """An :class:`arnar.paradigms.ar.AR` paradigm holding a CosyVoice 2/3 text-speech LM, ready
    for :func:`convert_ar` (the paper converts CosyVoice3's; Table 6 also CosyVoice2's).

    ``llm_state_dict``: the LM checkpoint (``llm.pt``, any key prefix); ``hf_config``: the
    Qwen2 config of its backbone (``CosyVoice-BlankEN/config.json`` as a dict or ``Qwen2Config``).

    How the tensors map (CosyVoice ``cosyvoice/llm/llm.py``):

    * backbone ``*.model.model.layers.*`` / ``norm``: :func:`arnar.nn.hf.transformer_from_hf_qwen2`
      (renaming, tensor for tensor; ``rope_theta`` etc. from the config);
    * text ids: the Qwen2 ``embed_tokens`` rows become our text rows (``Vocab.text_size`` = its
      row count), so text must be tokenized with the *Qwen2 tokenizer*, not our BPE;
    * speech codes 0..S-1: ``speech_embedding`` rows and ``llm_decoder`` rows;
    * specials: CosyVoice2 has ``llm_embedding`` = [sos_eos, task_id] -> our ``<sos>``,
      ``<turn>``; its end-of-speech id is S (``speech_embedding[S]``, ``llm_decoder[S]``) ->
      ``<eos>``. CosyVoice3 keeps them in the speech table: sos = S, eos = S+1, task_id = S+2.
    * head rows of text and the other specials are zero (decoding and the DELTA loss only look at
      the speech rows).

    What is missing for a paper-scale run, and why this is not wired into the DAG:

    * CosyVoice2's ``llm_decoder`` has a bias and our shared head has none, so the converted logits
      would be off by a per-code constant: raise unless ``drop_head_bias`` (CosyVoice3's head is
      bias-free and maps exactly);
    * the text front end: synthesis tokenizes with our sentencepiece BPE; a CosyVoice LM needs the
      Qwen2 tokenizer, and CosyVoice3 also the instruction prefix
      (``"You are a helpful assistant.<|endofprompt|>"``, t_inst of Eq. 1) in the prompt text;
    * the speech side: S3 tokens (6561 codes at 25 Hz; :mod:`arnar.codec.s3` encodes them) and the
      flow-matching token-to-speech decoder, which is not a package here (docs/design.md section 6);
    * the paper's adaptation data (585 h) and the LoRA rank / conv kernel it used (not in our text).
    """
    from arnar.nn.hf import transformer_from_hf_qwen2
    from arnar.paradigms.ar import AR

    if version not in (2, 3):
        raise ValueError(f"version must be 2 (CosyVoice2) or 3 (CosyVoice3), got {version}")

    def one(suffix: str, required: bool = True) -> torch.Tensor | None:
        keys = [k for k in llm_state_dict if k == suffix or k.endswith("." + suffix)]
        if len(keys) > 1:
            raise ValueError(f"several tensors named *{suffix}: {keys}")
        if not keys and required:
            raise ValueError(f"no tensor named *{suffix} in the CosyVoice LM state dict")
        return llm_state_dict[keys[0]] if keys else None

    cfg, backbone_state = transformer_from_hf_qwen2(llm_state_dict, hf_config)
    text_embedding = one("embed_tokens.weight")  # Qwen2's own, CosyVoice's text embedding
    speech_embedding, decoder = one("speech_embedding.weight"), one("llm_decoder.weight")
    bias = one("llm_decoder.bias", required=False)
    if bias is not None and bool(bias.any()) and not drop_head_bias:
        raise ValueError("this LM's llm_decoder has a bias (CosyVoice2) and the shared head has none: the converted "
                         "logits would differ by it; pass drop_head_bias=True to accept that")
    if version == 2:
        specials = one("llm_embedding.weight")
        sos, turn = specials[0], specials[1]
        eos_index = speech_size
    else:
        sos, turn = speech_embedding[speech_size], speech_embedding[speech_size + 2]
        eos_index = speech_size + 1

    vocab = Vocab(text_size=int(text_embedding.shape[0]), speech_size=speech_size)
    embed = torch.zeros(vocab.size, cfg.dim, dtype=text_embedding.dtype)
    embed[vocab.text_offset:vocab.speech_offset] = text_embedding
    embed[vocab.speech_offset:] = speech_embedding[:speech_size]
    embed[SOS], embed[TURN], embed[EOS] = sos, turn, speech_embedding[eos_index]
    head = torch.zeros(vocab.size, cfg.dim, dtype=decoder.dtype)
    head[vocab.speech_offset:] = decoder[:speech_size]
    head[EOS] = decoder[eos_index]

    ar = AR(vocab, cfg)
    state = {"embed.weight": embed, "head.weight": head,
             **{f"backbone.{name}": tensor for name, tensor in backbone_state.items()}}
    ar.load_state_dict(state, strict=True)
    return ar
