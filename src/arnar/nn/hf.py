"""Paper-scale path: load a HuggingFace Qwen2 backbone (the CosyVoice 2 LM) into :class:`Transformer`.

CosyVoice 2's text-speech LM is a ``transformers`` ``Qwen2ForCausalLM`` (Qwen2.5-0.5B) driven with
``inputs_embeds``; DELTA-TTS converts such an AR LM (docs/design.md section 6). Our backbone has the
same architecture (transformers 5.x ``modeling_qwen2.py``): pre-norm RMSNorm computed in float32
(``input_layernorm`` before attention, ``post_attention_layernorm`` before the MLP, final
``norm``), rotate-half RoPE with ``inv_freq = 1 / theta^(2i/head_dim)``, q/k/v with biases and
o_proj without, grouped-query attention with kv head ``h`` serving query heads
``h*G .. h*G+G-1`` (``repeat_kv``), scaling ``head_dim ** -0.5``, SwiGLU ``gate/up/down_proj``
without biases. So the mapping is a renaming, tensor for tensor, and the outputs agree to float
rounding (tests/test_nn.py checks it against a random ``Qwen2Model``).

Not supported (raise): sliding-window layers, non-default RoPE scaling types, ``head_dim`` other
than ``hidden_size / num_attention_heads``, activations other than SiLU.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from arnar.nn.transformer import Transformer, TransformerConfig

# HF Qwen2DecoderLayer parameter -> our Block parameter (per layer).
_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn.q_proj.weight",
    "self_attn.q_proj.bias": "attn.q_proj.bias",
    "self_attn.k_proj.weight": "attn.k_proj.weight",
    "self_attn.k_proj.bias": "attn.k_proj.bias",
    "self_attn.v_proj.weight": "attn.v_proj.weight",
    "self_attn.v_proj.bias": "attn.v_proj.bias",
    "self_attn.o_proj.weight": "attn.o_proj.weight",
    "post_attention_layernorm.weight": "mlp_norm.weight",
    "mlp.gate_proj.weight": "mlp.gate_proj.weight",
    "mlp.up_proj.weight": "mlp.up_proj.weight",
    "mlp.down_proj.weight": "mlp.down_proj.weight",
}
# Keys under the backbone prefix that are not backbone parameters of ours.
_IGNORED = {"embed_tokens.weight", "rotary_emb.inv_freq", "rotary_emb.original_inv_freq"}


def _get(cfg: Any, name: str, default: Any = None) -> Any:
    """Read a field of a ``Qwen2Config`` or of a ``config.json`` dict."""
    if isinstance(cfg, Mapping):
        return cfg.get(name, default)
    return getattr(cfg, name, default)


def config_from_hf_qwen2(hf_config: Any) -> TransformerConfig:
    """:class:`TransformerConfig` equivalent to a ``Qwen2Config`` (or its ``config.json`` dict)."""
    hidden, n_heads = _get(hf_config, "hidden_size"), _get(hf_config, "num_attention_heads")
    n_layers = _get(hf_config, "num_hidden_layers")
    if _get(hf_config, "hidden_act", "silu") != "silu":
        raise ValueError(f"only SiLU (SwiGLU) MLPs are supported, got {_get(hf_config, 'hidden_act')!r}")
    head_dim = _get(hf_config, "head_dim")
    if head_dim is not None and head_dim != hidden // n_heads:
        raise ValueError(f"head_dim={head_dim} != hidden_size/num_attention_heads={hidden // n_heads}")
    # transformers 5 keeps RoPE settings in `rope_parameters`; older configs have `rope_theta`.
    rope = _get(hf_config, "rope_parameters") or _get(hf_config, "rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise ValueError(f"RoPE type {rope_type!r} is not supported (only the default, unscaled RoPE)")
    rope_theta = rope.get("rope_theta", _get(hf_config, "rope_theta", 10000.0))
    layer_types = _get(hf_config, "layer_types") or []
    if "sliding_attention" in layer_types or (
        _get(hf_config, "use_sliding_window", False) and _get(hf_config, "max_window_layers", n_layers) < n_layers
    ):
        raise ValueError("sliding-window attention layers are not supported")
    return TransformerConfig(
        dim=hidden,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=_get(hf_config, "num_key_value_heads") or n_heads,
        ffn_dim=_get(hf_config, "intermediate_size"),
        rope_theta=float(rope_theta),
        norm_eps=float(_get(hf_config, "rms_norm_eps", 1e-6)),
        dropout=0.0,
        qkv_bias=True,  # Qwen2Attention hard-codes bias=True on q, k, v
        cond_dim=0,
    )


def _backbone_prefix(state_dict: Mapping[str, Tensor]) -> str:
    """Where the Qwen2Model sits in a state dict: ``""`` (Qwen2Model), ``"model."``
    (Qwen2ForCausalLM), ``"llm.model.model."`` (a CosyVoice 2 ``llm.pt``), ..."""
    marker = "layers.0.input_layernorm.weight"
    prefixes = {k[: -len(marker)] for k in state_dict if k.endswith(marker)}
    if len(prefixes) != 1:
        raise ValueError(f"expected exactly one Qwen2 layer stack in the state dict, found prefixes {sorted(prefixes)}")
    return prefixes.pop()


def transformer_from_hf_qwen2(
    hf_model_or_state_dict: nn.Module | Mapping[str, Tensor], hf_config: Any = None
) -> tuple[TransformerConfig, dict[str, Tensor]]:
    """Map a HF ``Qwen2Model`` / ``Qwen2ForCausalLM`` (or a state dict containing one, under any
    prefix) to ``(TransformerConfig, state_dict)`` for :class:`Transformer`.

    ``hf_config`` (``Qwen2Config`` or ``config.json`` dict) defaults to ``model.config``. The token
    embedding and any LM head are not part of the backbone and are left out (see
    :func:`load_hf_qwen2`). Raises ``ValueError`` on missing or unexpected backbone tensors.
    """
    if isinstance(hf_model_or_state_dict, nn.Module):
        hf_config = hf_config if hf_config is not None else hf_model_or_state_dict.config
        state_dict = hf_model_or_state_dict.state_dict()
    else:
        state_dict = hf_model_or_state_dict
    if hf_config is None:
        raise ValueError("a state dict needs its hf_config (Qwen2Config or config.json dict)")
    cfg = config_from_hf_qwen2(hf_config)
    prefix = _backbone_prefix(state_dict)

    ours: dict[str, Tensor] = {}
    unexpected = []
    layer_key = re.compile(r"layers\.(\d+)\.(.+)")
    for key, tensor in state_dict.items():
        if not key.startswith(prefix):
            continue  # e.g. lm_head, or CosyVoice's speech embedding / decoder next to the LM
        name = key[len(prefix) :]
        if name in _IGNORED:
            continue
        if name == "norm.weight":
            ours["norm.weight"] = tensor
        elif (m := layer_key.fullmatch(name)) and m.group(2) in _LAYER_NAMES and int(m.group(1)) < cfg.n_layers:
            ours[f"layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}"] = tensor
        else:
            unexpected.append(key)
    missing = sorted(_expected_keys(cfg) - set(ours))
    if unexpected or missing:
        raise ValueError(f"Qwen2 state dict does not map: missing {missing[:8]}, unexpected {unexpected[:8]}")
    return cfg, ours


def _expected_keys(cfg: TransformerConfig) -> set[str]:
    return {"norm.weight"} | {f"layers.{i}.{ours}" for i in range(cfg.n_layers) for ours in _LAYER_NAMES.values()}


def load_hf_qwen2(
    path_or_model: str | Path | nn.Module | Mapping[str, Tensor],
    hf_config: Any = None,
    dtype: torch.dtype | None = None,
) -> tuple[Transformer, nn.Embedding | None]:
    """Build a :class:`Transformer` holding a Qwen2 backbone's weights.

    ``path_or_model`` is a HF model, a state dict, a ``save_pretrained`` directory / hub id
    (loaded with ``transformers``), or a torch checkpoint file (``.pt``/``.bin``, e.g. CosyVoice 2's
    ``llm.pt``; ``.safetensors`` too) which then needs ``hf_config`` (a ``Qwen2Config``, a
    ``config.json`` dict, or the path of a ``config.json`` or of its directory).

    Returns ``(transformer, embed_tokens)``: the text-token embedding the LM was trained with
    (``None`` if the weights have none), which a paradigm can use as its text embedding.
    """
    source: nn.Module | Mapping[str, Tensor]
    if isinstance(path_or_model, (nn.Module, Mapping)):
        source = path_or_model
    else:
        path = Path(path_or_model)
        if path.is_file():
            if path.suffix == ".safetensors":
                from safetensors.torch import load_file

                source = load_file(str(path))
            else:
                source = torch.load(path, map_location="cpu", weights_only=True)
            if hf_config is None:
                raise ValueError(f"{path} is a bare checkpoint: pass hf_config (Qwen2Config, dict or config.json path)")
        else:
            from transformers import AutoModel

            source = AutoModel.from_pretrained(str(path_or_model), dtype=dtype or "auto")
    if isinstance(hf_config, (str, Path)):
        from transformers import AutoConfig

        hf_config = AutoConfig.from_pretrained(str(Path(hf_config).parent if Path(hf_config).is_file() else hf_config))

    cfg, state_dict = transformer_from_hf_qwen2(source, hf_config)
    model = Transformer(cfg)
    model.load_state_dict(state_dict, strict=True)

    full = source.state_dict() if isinstance(source, nn.Module) else source
    embed_weight = full.get(_backbone_prefix(full) + "embed_tokens.weight")
    embed = None if embed_weight is None else nn.Embedding.from_pretrained(embed_weight.clone(), freeze=False)
    if dtype is not None:
        model = model.to(dtype)
        embed = None if embed is None else embed.to(dtype)
    return model, embed
