"""The shared backbone every paradigm uses (docs/design.md section 2).

:class:`Transformer` is a Llama/Qwen2-style stack over embeddings with explicit RoPE position ids,
arbitrary boolean attention masks, a crop-able :class:`KVCache` and optional adaLN conditioning;
:mod:`arnar.nn.modules` has LoRA and the convolutional/time-embedding modules some paradigms add;
:mod:`arnar.nn.hf` loads a HuggingFace Qwen2 (CosyVoice 2 LM) backbone into it.
"""

from arnar.nn.hf import config_from_hf_qwen2, load_hf_qwen2, transformer_from_hf_qwen2
from arnar.nn.modules import (
    GRN,
    ConformerConvModule,
    ConvNeXtV2Block,
    ConvPositionEmbedding,
    LoRALinear,
    TimestepEmbedding,
    apply_lora,
    merge_lora,
)
from arnar.nn.transformer import KVCache, RMSNorm, Transformer, TransformerConfig

__all__ = [
    "GRN",
    "ConformerConvModule",
    "ConvNeXtV2Block",
    "ConvPositionEmbedding",
    "KVCache",
    "LoRALinear",
    "RMSNorm",
    "TimestepEmbedding",
    "Transformer",
    "TransformerConfig",
    "apply_lora",
    "config_from_hf_qwen2",
    "load_hf_qwen2",
    "merge_lora",
    "transformer_from_hf_qwen2",
]
