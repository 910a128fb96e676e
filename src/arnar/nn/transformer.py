"""The one backbone every paradigm shares: a Llama/Qwen2-style transformer over embeddings.

What goes in and out is ``[B, S, dim]`` hidden states; token embeddings and output heads belong to
the paradigms (docs/design.md section 2), because each paradigm lays out its sequence differently (text
then speech for AR, interleaved text/speech for SyncSpeech, several temporal levels for
Chain-of-Details, ...). What the paradigms need from the backbone, and why it is written here
rather than borrowed from ``transformers``:

* **Explicit position ids.** RoPE is computed from ``position_ids`` ``[B, S]`` the caller gives, so
  text and speech can have their own position ranges and positions may repeat or jump.
* **Arbitrary boolean attention masks.** ``attention_mask[b, q, k]`` is True where query ``q`` may
  attend key ``k``: causal, bidirectional, block-causal, prefix-LM, anything a paradigm builds.
  ``None`` means causal.
* **A KV cache that can roll back.** :class:`KVCache` holds the past keys/values of all layers;
  :meth:`KVCache.crop` forgets positions so paradigms that re-predict positions (SyncSpeech,
  MaskGIT-style refinement on top of a prefix) can extend again from an earlier point.
* **adaLN.** With ``cond_dim > 0`` the RMSNorms become adaptive (scale/shift/gate from a condition
  vector such as a diffusion-time embedding, DiT, Peebles & Xie 2023), initialised so the model
  starts as the plain one.

The architecture and parameter names follow HF Llama/Qwen2 (pre-norm RMSNorm, rotate-half RoPE,
SwiGLU MLP, optional q/k/v biases, grouped-query attention), so a CosyVoice 2 LM (Qwen2) maps onto it
one tensor to one tensor (:mod:`arnar.nn.hf`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn


@dataclass
class TransformerConfig:
    dim: int = 256
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int | None = None  # grouped-query attention; None = n_heads
    ffn_dim: int | None = None  # SwiGLU hidden size; None = 8/3 * dim rounded up to a multiple of 64
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    dropout: float = 0.0
    qkv_bias: bool = False  # Qwen2 (CosyVoice 2 LM) has biases on q, k, v
    cond_dim: int = 0  # > 0: adaptive RMSNorm (adaLN) driven by a condition vector of this size

    def __post_init__(self) -> None:
        if self.dim % self.n_heads:
            raise ValueError(f"dim={self.dim} is not divisible by n_heads={self.n_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for RoPE")
        if self.n_heads % self.kv_heads:
            raise ValueError(f"n_heads={self.n_heads} is not divisible by n_kv_heads={self.kv_heads}")
        if self.cond_dim < 0:
            raise ValueError(f"cond_dim must be >= 0, got {self.cond_dim}")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def kv_heads(self) -> int:
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def hidden_dim(self) -> int:
        """SwiGLU hidden size: ``ffn_dim`` or 8/3 * dim (so the 3-matrix MLP costs about as much
        as a 4x GELU MLP, as in Llama) rounded up to a multiple of 64 for efficient matmuls."""
        if self.ffn_dim is not None:
            return self.ffn_dim
        return 64 * math.ceil(int(8 * self.dim / 3) / 64)

    @classmethod
    def from_dict(cls, d: dict) -> TransformerConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown TransformerConfig keys: {unknown}; known keys: {sorted(known)}")
        return cls(**d)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class KVCache:
    """Past keys and values of every layer, ``[B, n_kv_heads, S_past, head_dim]`` each (after RoPE).

    One object serves the whole stack: layer ``i`` appends to slot ``i`` during a forward pass.
    Keys are concatenated rather than written into a preallocated buffer: simpler, and
    :meth:`crop` is then just slicing. All sequences of a batch share one length; ragged batches
    express their padding through the attention mask.
    """

    def __init__(self) -> None:
        self.keys: list[Tensor] = []
        self.values: list[Tensor] = []

    @property
    def length(self) -> int:
        """Number of cached positions (``S_past``)."""
        return self.keys[0].shape[2] if self.keys else 0

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Append the new ``k, v`` of ``layer`` and return all its keys/values (past + new)."""
        if layer == len(self.keys):
            self.keys.append(k)
            self.values.append(v)
        elif layer < len(self.keys):
            self.keys[layer] = torch.cat([self.keys[layer], k], dim=2)
            self.values[layer] = torch.cat([self.values[layer], v], dim=2)
        else:
            raise IndexError(f"layer {layer} updated before layer {len(self.keys)}")
        return self.keys[layer], self.values[layer]

    def crop(self, n: int) -> None:
        """Keep the first ``n`` positions (``n <= length``), forgetting the rest."""
        if not 0 <= n <= self.length:
            raise ValueError(f"cannot crop a cache of length {self.length} to {n}")
        self.keys = [k[:, :, :n] for k in self.keys]
        self.values = [v[:, :, :n] for v in self.values]

    def reset(self) -> None:
        self.keys, self.values = [], []


class RMSNorm(nn.Module):
    """Root-mean-square norm (Zhang & Sennrich 2019) with a learned gain, computed in float32
    (as HF Llama/Qwen2 do, so bf16 runs match and weights map exactly)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


def rope_cos_sin(position_ids: Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos/sin tables ``[B, 1, S, head_dim]`` for rotary embeddings (Su et al. 2021) at the given
    positions. Frequencies are recomputed in float32 each call (cheap) instead of kept in a
    buffer, so casting the model to bf16 cannot round them."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=position_ids.device, dtype=torch.float32) / head_dim)
    angles = position_ids.float()[..., None] * inv_freq  # [B, S, head_dim/2]
    # Rotate-half layout (HF Llama/Qwen2): the two halves of a head form the rotated pairs.
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(dtype)[:, None], angles.sin().to(dtype)[:, None]


def rotate_half(x: Tensor) -> Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat([-second, first], dim=-1)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    return x * cos + rotate_half(x) * sin


class Attention(nn.Module):
    def __init__(self, cfg: TransformerConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer  # this layer's slot in the KVCache
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.kv_heads, cfg.head_dim
        self.dropout = cfg.dropout
        self.q_proj = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(cfg.dim, cfg.kv_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(cfg.dim, cfg.kv_heads * cfg.head_dim, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)

    def forward(
        self, x: Tensor, cos: Tensor, sin: Tensor, mask: Tensor | None, causal: bool, cache: KVCache | None
    ) -> Tensor:
        B, S, _ = x.shape
        q = self.q_proj(x).view(B, S, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, S, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, S, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is not None:
            k, v = cache.update(self.layer, k, v)
        out = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            is_causal=causal,
            dropout_p=self.dropout if self.training else 0.0,
            # kv head h serves query heads h*G .. h*G+G-1 (same grouping as HF repeat_kv)
            enable_gqa=self.n_kv_heads != self.n_heads,
        )
        return self.o_proj(out.transpose(1, 2).reshape(B, S, -1))


class SwiGLU(nn.Module):
    """Gated MLP ``down(silu(gate(x)) * up(x))`` (Shazeer 2020), as in Llama/Qwen2."""

    def __init__(self, dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden_dim, bias=False)
        self.up_proj = nn.Linear(dim, hidden_dim, bias=False)
        self.down_proj = nn.Linear(hidden_dim, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    """Pre-norm block: ``x + attn(norm(x))`` then ``x + mlp(norm(x))``.

    With ``cond_dim > 0`` (adaLN, DiT): a linear map of ``silu(cond)`` gives per-channel
    (shift, scale, gate) for each of the two sub-layers; the sub-layer sees
    ``norm(x) * (1 + scale) + shift`` and its output is multiplied by ``1 + gate``. The map is
    zero-initialised, so a fresh conditioned block computes exactly the plain block (DiT's
    gate-without-1 would start from the identity instead, discarding a pretrained backbone).
    """

    def __init__(self, cfg: TransformerConfig, layer: int) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attn = Attention(cfg, layer)
        self.mlp_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.mlp = SwiGLU(cfg.dim, cfg.hidden_dim)
        self.resid_dropout = nn.Dropout(cfg.dropout)
        self.modulation = None
        if cfg.cond_dim > 0:
            self.modulation = nn.Linear(cfg.cond_dim, 6 * cfg.dim)  # zero-initialised by Transformer

    def forward(
        self,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        mask: Tensor | None,
        causal: bool,
        cache: KVCache | None,
        cond: Tensor | None,
    ) -> Tensor:
        if self.modulation is None:
            x = x + self.resid_dropout(self.attn(self.attn_norm(x), cos, sin, mask, causal, cache))
            return x + self.resid_dropout(self.mlp(self.mlp_norm(x)))
        mod = self.modulation(F.silu(cond)).to(x.dtype)  # [B, 1 or S, 6*dim]
        shift_a, scale_a, gate_a, shift_m, scale_m, gate_m = mod.chunk(6, dim=-1)
        h = self.attn_norm(x) * (1 + scale_a) + shift_a
        x = x + self.resid_dropout(self.attn(h, cos, sin, mask, causal, cache)) * (1 + gate_a)
        h = self.mlp_norm(x) * (1 + scale_m) + shift_m
        return x + self.resid_dropout(self.mlp(h)) * (1 + gate_m)


class Transformer(nn.Module):
    """A stack of :class:`Block` s and a final RMSNorm over input embeddings ``[B, S, dim]``.

    ``forward(x, position_ids, attention_mask=None, cache=None, cond=None)``:

    * ``position_ids`` ``[B, S]`` (or ``[S]``, shared by the batch): RoPE positions of the new
      inputs; anything goes (separate ranges, repeats, jumps).
    * ``attention_mask``: bool, True = query may attend key; ``[B, S_q, S_k]``,
      ``[B, 1, S_q, S_k]`` or ``[S_q, S_k]`` with ``S_q = S`` and ``S_k = cache.length + S``
      (the cached past followed by the new positions). ``None`` = causal: each new query attends
      every cached position and the new positions up to itself. Every query must be allowed at
      least one key (SDPA returns NaN for an all-False row); give padding queries their own
      position. An all-False row raises ``ValueError`` (a cheap check; set
      ``check_mask = False`` to skip its device sync, e.g. under ``torch.compile``).
    * ``cache``: a :class:`KVCache`; the new keys/values are appended to it.
    * ``cond``: ``[B, cond_dim]`` or ``[B, S, cond_dim]``, required iff ``cfg.cond_dim > 0``.

    Returns ``[B, S, dim]`` after the final norm (adaptive too when ``cond_dim > 0``).
    """

    check_mask: bool = True

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.final_modulation = None
        if cfg.cond_dim > 0:
            self.final_modulation = nn.Linear(cfg.cond_dim, 2 * cfg.dim)
        self._init_weights()

    @torch.no_grad()
    def _init_weights(self) -> None:
        # GPT-2 style: N(0, 0.02), with the projections that write into the residual stream scaled
        # by 1/sqrt(2 * n_layers) so its variance does not grow with depth. The adaLN maps start at
        # zero: that is what makes a conditioned model start as the plain one.
        residual_std = 0.02 / math.sqrt(2 * self.cfg.n_layers)
        for name, module in self.named_modules():
            if not isinstance(module, nn.Linear):
                continue
            if name.endswith("modulation"):
                nn.init.zeros_(module.weight)
            elif name.endswith(("o_proj", "down_proj")):
                nn.init.normal_(module.weight, std=residual_std)
            else:
                nn.init.normal_(module.weight, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)

    def num_parameters(self, trainable_only: bool = False) -> int:
        return sum(p.numel() for p in self.parameters() if p.requires_grad or not trainable_only)

    def forward(
        self,
        x: Tensor,
        position_ids: Tensor,
        attention_mask: Tensor | None = None,
        cache: KVCache | None = None,
        cond: Tensor | None = None,
    ) -> Tensor:
        B, S, D = x.shape
        if D != self.cfg.dim:
            raise ValueError(f"input width {D} != cfg.dim {self.cfg.dim}")
        past = cache.length if cache is not None else 0
        n_keys = past + S

        if position_ids.dim() == 1:
            position_ids = position_ids.unsqueeze(0).expand(B, -1)
        if position_ids.shape != (B, S):
            raise ValueError(f"position_ids shape {tuple(position_ids.shape)} != (B, S) = {(B, S)}")

        cond = self._check_cond(cond, B, S)
        mask, causal = self._attention_mask(attention_mask, B, S, n_keys, past, x.device)

        cos, sin = rope_cos_sin(position_ids, self.cfg.head_dim, self.cfg.rope_theta, x.dtype)
        for block in self.layers:
            x = block(x, cos, sin, mask, causal, cache, cond)
        x = self.norm(x)
        if self.final_modulation is not None:
            shift, scale = self.final_modulation(F.silu(cond)).to(x.dtype).chunk(2, dim=-1)
            x = x * (1 + scale) + shift
        return x

    def _check_cond(self, cond: Tensor | None, B: int, S: int) -> Tensor | None:
        if self.cfg.cond_dim == 0:
            if cond is not None:
                raise ValueError("cond was given but this Transformer has cond_dim=0 (no adaLN)")
            return None
        if cond is None:
            raise ValueError(f"this Transformer has cond_dim={self.cfg.cond_dim}: pass cond")
        if cond.dim() == 2:
            cond = cond.unsqueeze(1)  # one vector per sequence, broadcast over positions
        if cond.dim() != 3 or cond.shape[0] != B or cond.shape[1] not in (1, S) or cond.shape[2] != self.cfg.cond_dim:
            raise ValueError(
                f"cond must be [B, {self.cfg.cond_dim}] or [B, S, {self.cfg.cond_dim}] with B={B}, S={S}; "
                f"got {tuple(cond.shape)}"
            )
        return cond

    def _attention_mask(
        self, mask: Tensor | None, B: int, S: int, n_keys: int, past: int, device: torch.device
    ) -> tuple[Tensor | None, bool]:
        """Normalise to a bool mask broadcastable to ``[B, heads, S, n_keys]``, or ``(None, True)``
        when SDPA's own causal path applies (no cache, no mask)."""
        if mask is None:
            if past == 0:
                return None, True
            # New query i sits at key index past+i and sees keys 0..past+i.
            query_at = torch.arange(S, device=device)[:, None] + past
            return torch.arange(n_keys, device=device)[None, :] <= query_at, False
        if mask.dtype != torch.bool:
            raise ValueError(f"attention_mask must be bool (True = may attend), got {mask.dtype}")
        if mask.dim() == 2:
            mask = mask[None, None]
        elif mask.dim() == 3:
            mask = mask[:, None]
        elif mask.dim() != 4 or mask.shape[1] != 1:
            raise ValueError(
                f"attention_mask must be [S_q, S_k], [B, S_q, S_k] or [B, 1, S_q, S_k]; got {tuple(mask.shape)}"
            )
        if mask.shape[-2:] != (S, n_keys) or mask.shape[0] not in (1, B):
            raise ValueError(
                f"attention_mask shape {tuple(mask.shape)} does not fit B={B}, S_q={S}, "
                f"S_k=cache.length+S={n_keys}"
            )
        if self.check_mask and not bool(mask.any(-1).all()):
            raise ValueError(
                "attention_mask has a query row with no allowed key (SDPA would give NaN); "
                "let every query attend at least itself, e.g. padding rows"
            )
        return mask.to(device), False
