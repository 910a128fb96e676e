"""Extra modules some paradigms put around the shared :class:`~arnar.nn.Transformer`.

* :class:`LoRALinear`, :func:`apply_lora`, :func:`merge_lora`: low-rank adaptation (Hu et al.
  2021, "LoRA"); DELTA-TTS fine-tunes an AR LM into a masked-diffusion model with LoRA.
* :class:`ConformerConvModule`: the convolution module of Conformer (Gulati et al. 2020).
* :class:`ConvNeXtV2Block` with :class:`GRN`: ConvNeXt V2 (Woo et al. 2023) in 1-D, as in the
  F5-TTS text encoder and the Vocos backbone.
* :class:`ConvPositionEmbedding`: convolutional relative positions (wav2vec 2.0 style) as used by
  E2-TTS / F5-TTS in front of their transformer.
* :class:`TimestepEmbedding`: sinusoidal embedding of a flow/diffusion time ``t`` followed by an
  MLP (DDPM / DiT), giving the ``cond`` vector of the backbone's adaLN.

Sequence modules take ``x`` ``[B, T, D]`` and an optional ``mask`` ``[B, T]`` (True = real frame).
Padded frames are zeroed before every operation that mixes frames (convolutions over time, the
GRN's norm over time), so outputs at real frames do not depend on what the padding holds. Outputs
at padded frames are unspecified; keep carrying the mask.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def _zero_padding(x: Tensor, mask: Tensor | None) -> Tensor:
    """``x`` ``[B, T, D]`` with padded frames (``mask`` False) set to zero."""
    return x if mask is None else x.masked_fill(~mask[..., None], 0.0)


# ----------------------------------------------------------------------------------------------
# LoRA


class LoRALinear(nn.Module):
    """``base(x) + (alpha / rank) * B(A(dropout(x)))`` with ``base`` frozen (Hu et al. 2021).

    ``A`` is initialised like a Linear layer and ``B`` at zero, so the wrapped layer starts
    exactly equal to ``base``; only ``A`` and ``B`` train.
    """

    def __init__(self, base: nn.Linear, rank: int = 8, alpha: float = 16.0, dropout: float = 0.0) -> None:
        super().__init__()
        if rank < 1:
            raise ValueError(f"LoRA rank must be >= 1, got {rank}")
        self.base = base
        self.base.requires_grad_(False)
        self.rank, self.alpha, self.scaling = rank, alpha, alpha / rank
        dev, dtype = base.weight.device, base.weight.dtype
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features, device=dev, dtype=dtype))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, device=dev, dtype=dtype))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))  # nn.Linear's default init
        self.dropout = nn.Dropout(dropout)

    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features

    def forward(self, x: Tensor) -> Tensor:
        return self.base(x) + F.linear(F.linear(self.dropout(x), self.lora_A), self.lora_B) * self.scaling

    @torch.no_grad()
    def merge(self) -> nn.Linear:
        """A plain ``nn.Linear`` with ``W + (alpha / rank) * B @ A`` (no inference overhead)."""
        base = self.base
        merged = nn.Linear(base.in_features, base.out_features, bias=base.bias is not None)
        merged = merged.to(device=base.weight.device, dtype=base.weight.dtype)
        merged.weight.copy_(base.weight + (self.lora_B @ self.lora_A) * self.scaling)
        if base.bias is not None:
            merged.bias.copy_(base.bias)
        return merged

    def extra_repr(self) -> str:
        return f"rank={self.rank}, alpha={self.alpha}"


def apply_lora(
    module: nn.Module,
    target_names: Iterable[str] = ("q_proj", "k_proj", "v_proj", "o_proj"),
    rank: int = 8,
    alpha: float = 16.0,
    dropout: float = 0.0,
) -> list[str]:
    """Freeze every parameter of ``module`` and wrap each ``nn.Linear`` whose attribute name is in
    ``target_names`` (e.g. the attention projections of a :class:`Transformer`) in a
    :class:`LoRALinear`, in place. Returns the qualified names of the wrapped layers; raises
    ``ValueError`` if none matched (a misspelt target would otherwise silently train nothing)."""
    targets = set(target_names)
    module.requires_grad_(False)
    wrapped = []
    for parent_name, parent in list(module.named_modules()):
        if isinstance(parent, LoRALinear):
            continue  # already adapted; do not wrap its base again
        for child_name, child in list(parent.named_children()):
            if child_name in targets and isinstance(child, nn.Linear):
                setattr(parent, child_name, LoRALinear(child, rank=rank, alpha=alpha, dropout=dropout))
                wrapped.append(f"{parent_name}.{child_name}" if parent_name else child_name)
    if not wrapped:
        raise ValueError(f"no nn.Linear named any of {sorted(targets)} in {type(module).__name__}")
    return wrapped


def merge_lora(module: nn.Module) -> nn.Module:
    """Replace every :class:`LoRALinear` inside ``module`` by its merged ``nn.Linear`` (in place)."""
    for parent in list(module.modules()):
        for child_name, child in list(parent.named_children()):
            if isinstance(child, LoRALinear):
                setattr(parent, child_name, child.merge())
    return module


# ----------------------------------------------------------------------------------------------
# Convolutional blocks over [B, T, D]


class ConformerConvModule(nn.Module):
    """Conformer convolution module (Gulati et al. 2020, Fig. 2), residual included:

    ``x + Dropout(PW(SiLU(Norm(DW(GLU(PW(LayerNorm(x))))))))``

    PW = pointwise conv ``D -> 2D`` (halved again by the GLU) and ``D -> D``, DW = depthwise conv
    of ``kernel_size`` over time. ``norm="batch"`` is the paper's BatchNorm; ``"layer"`` is a
    per-frame LayerNorm, whose output does not depend on the other sequences of the batch.
    ``causal=True`` pads the depthwise conv on the left only (streaming).
    """

    def __init__(
        self, dim: int, kernel_size: int = 31, dropout: float = 0.0, norm: str = "batch", causal: bool = False
    ) -> None:
        super().__init__()
        if kernel_size % 2 == 0 and not causal:
            raise ValueError(f"kernel_size must be odd for a centred conv, got {kernel_size}")
        if norm not in ("batch", "layer"):
            raise ValueError(f"norm must be 'batch' or 'layer', got {norm!r}")
        self.causal, self.kernel_size = causal, kernel_size
        self.pre_norm = nn.LayerNorm(dim)
        self.pointwise_in = nn.Conv1d(dim, 2 * dim, kernel_size=1)
        self.depthwise = nn.Conv1d(dim, dim, kernel_size, groups=dim)  # padding applied by hand
        self.norm = nn.BatchNorm1d(dim) if norm == "batch" else nn.LayerNorm(dim)
        self.pointwise_out = nn.Conv1d(dim, dim, kernel_size=1)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        h = self.pointwise_in(self.pre_norm(x).transpose(1, 2))  # [B, 2D, T]
        h = F.glu(h, dim=1)
        # Zero padded frames right before the only op that mixes frames: then BatchNorm's
        # statistics and the real frames depend on real content only.
        h = _zero_padding(h.transpose(1, 2), mask).transpose(1, 2)
        left = self.kernel_size - 1 if self.causal else self.kernel_size // 2
        h = self.depthwise(F.pad(h, (left, self.kernel_size - 1 - left)))
        if isinstance(self.norm, nn.LayerNorm):  # normalises the channels of each frame
            h = self.norm(h.transpose(1, 2)).transpose(1, 2)
        else:
            h = self.norm(h)
        h = self.pointwise_out(F.silu(h))
        return x + self.dropout(h.transpose(1, 2))


class GRN(nn.Module):
    """Global Response Normalisation (ConvNeXt V2) on ``[B, T, C]``:
    ``gamma * (x * N(x)) + beta + x`` with ``G(x)_c = ||x_{:,c}||_2`` over time and
    ``N(x) = G(x) / (mean_c G(x) + eps)``. ``gamma, beta`` start at zero (identity)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.gamma = nn.Parameter(torch.zeros(dim))
        self.beta = nn.Parameter(torch.zeros(dim))

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        g = _zero_padding(x, mask).norm(p=2, dim=1, keepdim=True)  # [B, 1, C]; pads excluded
        n = g / (g.mean(dim=-1, keepdim=True) + self.eps)
        return self.gamma * (x * n) + self.beta + x


class ConvNeXtV2Block(nn.Module):
    """1-D ConvNeXt V2 block (Woo et al. 2023), as in F5-TTS's text encoder / Vocos:
    ``x + PW2(GRN(GELU(PW1(LayerNorm(DWConv(x))))))``, DWConv of ``kernel_size`` (7) over time,
    PW1 ``D -> intermediate_dim`` (4D), PW2 back to ``D``."""

    def __init__(self, dim: int, intermediate_dim: int | None = None, kernel_size: int = 7, dilation: int = 1) -> None:
        super().__init__()
        if kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be odd, got {kernel_size}")
        hidden = intermediate_dim or 4 * dim
        self.depthwise = nn.Conv1d(
            dim, dim, kernel_size, padding=dilation * (kernel_size // 2), groups=dim, dilation=dilation
        )
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pointwise_in = nn.Linear(dim, hidden)
        self.grn = GRN(hidden)
        self.pointwise_out = nn.Linear(hidden, dim)

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        h = self.depthwise(_zero_padding(x, mask).transpose(1, 2)).transpose(1, 2)
        h = F.gelu(self.pointwise_in(self.norm(h)))
        h = self.pointwise_out(self.grn(h, mask))
        return x + h


class ConvPositionEmbedding(nn.Module):
    """Convolutional position embedding (E2-TTS / F5-TTS): two grouped convs over time, each
    followed by Mish (or GELU), added to the input: ``x + act(conv(act(conv(x))))``."""

    def __init__(self, dim: int, kernel_size: int = 31, groups: int = 16, activation: str = "mish") -> None:
        super().__init__()
        if kernel_size % 2 == 0:
            raise ValueError(f"kernel_size must be odd, got {kernel_size}")
        if dim % groups:
            raise ValueError(f"dim={dim} is not divisible by groups={groups}")
        acts = {"mish": nn.Mish, "gelu": nn.GELU}
        if activation not in acts:
            raise ValueError(f"activation must be one of {sorted(acts)}, got {activation!r}")
        self.conv1 = nn.Conv1d(dim, dim, kernel_size, padding=kernel_size // 2, groups=groups)
        self.conv2 = nn.Conv1d(dim, dim, kernel_size, padding=kernel_size // 2, groups=groups)
        self.act = acts[activation]()

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
        h = self.act(self.conv1(_zero_padding(x, mask).transpose(1, 2))).transpose(1, 2)
        h = self.act(self.conv2(_zero_padding(h, mask).transpose(1, 2))).transpose(1, 2)
        return x + h


# ----------------------------------------------------------------------------------------------
# Time conditioning


class TimestepEmbedding(nn.Module):
    """``t`` in [0, 1] (``[B]`` or a scalar) -> ``[B, cond_dim]`` for the backbone's adaLN.

    Sinusoidal features of ``scale * t`` (Transformer position encoding; ``scale`` 1000 spreads
    [0, 1] over the frequencies as F5-TTS does) then ``Linear -> SiLU -> Linear`` (DiT). The output
    is left un-activated: the backbone applies SiLU before its modulation maps.
    """

    def __init__(self, cond_dim: int, freq_dim: int = 256, scale: float = 1000.0, max_period: float = 10000.0) -> None:
        super().__init__()
        if freq_dim % 2:
            raise ValueError(f"freq_dim must be even, got {freq_dim}")
        self.freq_dim, self.scale, self.max_period = freq_dim, scale, max_period
        self.mlp = nn.Sequential(nn.Linear(freq_dim, cond_dim), nn.SiLU(), nn.Linear(cond_dim, cond_dim))

    def sinusoidal(self, t: Tensor) -> Tensor:
        half = self.freq_dim // 2
        freqs = torch.exp(-math.log(self.max_period) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
        angles = self.scale * t.float()[:, None] * freqs
        return torch.cat([angles.sin(), angles.cos()], dim=-1)

    def forward(self, t: Tensor | float) -> Tensor:
        t = torch.as_tensor(t, device=self.mlp[0].weight.device)
        if t.dim() == 0:
            t = t[None]
        return self.mlp(self.sinusoidal(t).to(self.mlp[0].weight.dtype))
