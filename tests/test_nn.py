"""The shared backbone (arnar.nn): KV-cache equivalence, explicit positions, masks, GQA, adaLN,
the HF Qwen2 loader, LoRA and the extra modules. Tiny float32 models, seeded, CPU-fast."""

import pytest
import torch

from arnar.nn import (
    GRN,
    ConformerConvModule,
    ConvNeXtV2Block,
    ConvPositionEmbedding,
    KVCache,
    LoRALinear,
    TimestepEmbedding,
    Transformer,
    TransformerConfig,
    apply_lora,
    merge_lora,
)

TOL = 1e-5


def tiny(**overrides) -> Transformer:
    torch.manual_seed(0)
    cfg = TransformerConfig(**{"dim": 32, "n_layers": 2, "n_heads": 4, "ffn_dim": 48, **overrides})
    model = Transformer(cfg).eval()
    with torch.no_grad():  # larger weights than the 0.02 init so attention is far from uniform
        for name, p in model.named_parameters():
            if p.dim() == 2 and "modulation" not in name:
                p.normal_(std=0.3)
    return model


def inputs(B=2, S=10, D=32, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(B, S, D, generator=g), torch.arange(S).expand(B, S)


def max_diff(a, b) -> float:
    return (a - b).abs().max().item()


def run_chunks(model, x, pos, sizes, mask=None, cache=None):
    """Feed x in consecutive chunks through a KV cache; ``mask`` is the full [S, S] mask, whose
    rows for each chunk (keys up to the chunk's end) are passed along."""
    cache = cache if cache is not None else KVCache()
    outs, start = [], cache.length
    for n in sizes:
        end = start + n
        chunk_mask = None if mask is None else mask[start:end, :end]
        outs.append(model(x[:, start:end], pos[:, start:end], attention_mask=chunk_mask, cache=cache))
        start = end
    return torch.cat(outs, dim=1), cache


# --- config -------------------------------------------------------------------------------------


def test_config_roundtrip_and_unknown_keys():
    cfg = TransformerConfig(dim=64, n_heads=4, n_kv_heads=2, cond_dim=8)
    assert TransformerConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="n_layer"):
        TransformerConfig.from_dict({"dim": 64, "n_layer": 2})
    assert TransformerConfig(dim=256).hidden_dim == 704  # 8/3*256 = 682 -> next multiple of 64
    with pytest.raises(ValueError):
        TransformerConfig(dim=32, n_heads=4, n_kv_heads=3)


# --- KV cache -----------------------------------------------------------------------------------


@pytest.mark.parametrize("n_kv_heads", [None, 2, 1])  # MHA, GQA, MQA
def test_cached_decoding_matches_full_forward(n_kv_heads):
    model = tiny(n_kv_heads=n_kv_heads)
    x, pos = inputs()
    causal = torch.ones(10, 10, dtype=torch.bool).tril()
    with torch.no_grad():
        full = model(x, pos)
        assert max_diff(full, model(x, pos, attention_mask=causal)) <= TOL
        one_by_one, cache = run_chunks(model, x, pos, [4, 1, 1, 1, 1, 1, 1])
        chunks, _ = run_chunks(model, x, pos, [3, 4, 2, 1])
    assert cache.length == 10
    assert cache.keys[0].shape == (2, n_kv_heads or 4, 10, 8)
    assert max_diff(one_by_one, full) <= TOL
    assert max_diff(chunks, full) <= TOL


def test_cached_decoding_with_explicit_block_mask():
    model = tiny()
    x, pos = inputs(S=9)
    block = torch.arange(9) // 3  # blocks of 3: bidirectional inside a block, causal across blocks
    mask = block[:, None] >= block[None, :]
    with torch.no_grad():
        full = model(x, pos, attention_mask=mask)
        cached, _ = run_chunks(model, x, pos, [3, 3, 3], mask=mask)
        causal = model(x, pos)
    assert max_diff(cached, full) <= TOL
    assert max_diff(full, causal) > 1e-3  # the block mask really differs from causal


def test_crop_then_reextend():
    model = tiny()
    x, pos = inputs()
    junk = torch.randn(2, 3, 32)
    with torch.no_grad():
        full = model(x, pos)
        prefix, cache = run_chunks(model, x, pos, [6])
        model(junk, pos[:, 6:9], cache=cache)  # a guess that gets rolled back
        assert cache.length == 9
        cache.crop(6)
        assert cache.length == 6 and all(k.shape[2] == 6 for k in cache.keys + cache.values)
        rest, _ = run_chunks(model, x, pos, [2, 2], cache=cache)
    assert max_diff(torch.cat([prefix, rest], 1), full) <= TOL
    with pytest.raises(ValueError):
        cache.crop(11)
    cache.reset()
    assert cache.length == 0


# --- positions and masks ------------------------------------------------------------------------


def test_rope_is_relative_and_positions_matter():
    model = tiny()
    x, pos = inputs()
    with torch.no_grad():
        base = model(x, pos)
        shifted = model(x, pos + 17)
        repeated = model(x, torch.zeros_like(pos))
        permuted = model(x, pos[:, torch.randperm(10, generator=torch.Generator().manual_seed(0))])
    assert max_diff(base, shifted) <= TOL
    assert max_diff(base, repeated) > 1e-3
    assert max_diff(base, permuted) > 1e-3


def test_mask_layouts_agree_and_bidirectional_differs():
    model = tiny()
    x, pos = inputs()
    bidir = torch.ones(10, 10, dtype=torch.bool)
    with torch.no_grad():
        out2 = model(x, pos, attention_mask=bidir)
        out3 = model(x, pos, attention_mask=bidir.expand(2, 10, 10))
        out4 = model(x, pos, attention_mask=bidir.expand(2, 1, 10, 10))
        causal = model(x, pos)
    assert max_diff(out2, out3) == 0 and max_diff(out2, out4) == 0
    assert max_diff(out2, causal) > 1e-3


def test_padded_keys_do_not_influence_real_positions():
    model = tiny()
    x, pos = inputs()
    lengths = torch.tensor([10, 6])
    valid = torch.arange(10)[None, :] < lengths[:, None]  # [B, S]
    # bidirectional over real keys; padding queries attend themselves so no row is empty
    mask = valid[:, None, :] | torch.eye(10, dtype=torch.bool)[None]
    x2 = x.clone()
    x2[1, 6:] = torch.randn(4, 32) * 5
    with torch.no_grad():
        a, b = model(x, pos, attention_mask=mask), model(x2, pos, attention_mask=mask)
        c = model(x2, pos, attention_mask=torch.ones(10, 10, dtype=torch.bool))
    assert max_diff(a[valid], b[valid]) <= TOL
    assert max_diff(a[1, :6], c[1, :6]) > 1e-3  # without the mask the padding does leak


def test_bad_masks_and_inputs_raise():
    model = tiny()
    x, pos = inputs()
    empty_row = torch.ones(10, 10, dtype=torch.bool)
    empty_row[3] = False
    with pytest.raises(ValueError, match="no allowed key"):
        model(x, pos, attention_mask=empty_row)
    with pytest.raises(ValueError, match="bool"):
        model(x, pos, attention_mask=torch.ones(10, 10))
    with pytest.raises(ValueError, match="S_k"):
        model(x, pos, attention_mask=torch.ones(10, 9, dtype=torch.bool))
    with pytest.raises(ValueError, match="position_ids"):
        model(x, pos[:, :5])


# --- adaLN --------------------------------------------------------------------------------------


def test_adaln_starts_as_plain_model_and_then_depends_on_cond():
    conditioned = tiny(cond_dim=8)
    plain = Transformer(TransformerConfig(**{**conditioned.cfg.to_dict(), "cond_dim": 0})).eval()
    missing, unexpected = plain.load_state_dict(conditioned.state_dict(), strict=False)
    assert not missing and all("modulation" in k for k in unexpected) and unexpected
    x, pos = inputs()
    cond_a, cond_b = torch.randn(2, 8), torch.randn(2, 8)
    with torch.no_grad():
        assert max_diff(conditioned(x, pos, cond=cond_a), plain(x, pos)) <= TOL
        for name, p in conditioned.named_parameters():
            if "modulation" in name:
                p.normal_(std=0.1)
        out_a, out_b = conditioned(x, pos, cond=cond_a), conditioned(x, pos, cond=cond_b)
        per_position = conditioned(x, pos, cond=cond_a[:, None].expand(2, 10, 8))
    assert max_diff(out_a, out_b) > 1e-3
    assert max_diff(out_a, per_position) <= TOL  # [B, C] broadcasts like [B, S, C]
    with pytest.raises(ValueError, match="cond_dim=0"):
        plain(x, pos, cond=cond_a)
    with pytest.raises(ValueError, match="pass cond"):
        conditioned(x, pos)


def test_adaln_with_cache():
    model = tiny(cond_dim=8)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "modulation" in name:
                p.normal_(std=0.1)
    x, pos = inputs()
    cond = torch.randn(2, 10, 8)
    with torch.no_grad():
        full = model(x, pos, cond=cond)
        cache = KVCache()
        first = model(x[:, :7], pos[:, :7], cache=cache, cond=cond[:, :7])
        second = model(x[:, 7:], pos[:, 7:], cache=cache, cond=cond[:, 7:])
    assert max_diff(torch.cat([first, second], 1), full) <= TOL


# --- HF Qwen2 loader ----------------------------------------------------------------------------


def test_matches_hf_qwen2():
    transformers = pytest.importorskip("transformers")
    from arnar.nn import load_hf_qwen2, transformer_from_hf_qwen2

    torch.manual_seed(0)
    hf_cfg = transformers.Qwen2Config(
        vocab_size=40,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 30000.0},
        attn_implementation="eager",
    )
    hf = transformers.Qwen2Model(hf_cfg).eval()
    with torch.no_grad():  # HF zero-inits biases and ones-inits norms; randomise all of it
        for p in hf.parameters():
            p.normal_(std=0.1)
    cfg, state_dict = transformer_from_hf_qwen2(hf)
    assert cfg.rope_theta == 30000.0 and cfg.n_kv_heads == 2 and cfg.qkv_bias and cfg.ffn_dim == 96
    model, embed = load_hf_qwen2(hf)
    model.eval()
    assert torch.equal(embed.weight, hf.embed_tokens.weight)
    assert set(state_dict) == set(model.state_dict())

    x = torch.randn(2, 7, 64)
    pos = torch.tensor([[0, 1, 2, 3, 20, 21, 22], [5, 6, 7, 8, 9, 10, 11]])  # a jump, an offset
    with torch.no_grad():
        ref = hf(inputs_embeds=x, position_ids=pos).last_hidden_state
        ours = model(x, pos)
    assert max_diff(ours, ref) <= TOL

    # A CausalLM-style state dict under a prefix maps the same way; a broken one is refused.
    prefixed = {f"llm.model.{k}": v for k, v in hf.state_dict().items()}
    _, state_dict2 = transformer_from_hf_qwen2(prefixed, hf_cfg.to_dict())
    assert all(torch.equal(state_dict[k], state_dict2[k]) for k in state_dict)
    del prefixed["llm.model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(ValueError, match="missing"):
        transformer_from_hf_qwen2(prefixed, hf_cfg)


# --- LoRA ---------------------------------------------------------------------------------------


def test_lora_init_trainable_params_and_merge():
    model = tiny()
    x, pos = inputs()
    with torch.no_grad():
        base_out = model(x, pos)
    wrapped = apply_lora(model, target_names=("q_proj", "v_proj"), rank=4, alpha=8.0)
    assert wrapped == ["layers.0.attn.q_proj", "layers.0.attn.v_proj", "layers.1.attn.q_proj", "layers.1.attn.v_proj"]
    assert isinstance(model.layers[0].attn.q_proj, LoRALinear)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all(n.endswith(("lora_A", "lora_B")) for n in trainable)
    assert len(trainable) == 8
    with torch.no_grad():
        assert max_diff(model(x, pos), base_out) == 0  # B = 0: exactly the base model
        for name, p in model.named_parameters():
            if name.endswith("lora_B"):
                p.normal_(std=0.1)
        lora_out = model(x, pos)
        assert max_diff(lora_out, base_out) > 1e-3
        merge_lora(model)
        assert not any(isinstance(m, LoRALinear) for m in model.modules())
        assert max_diff(model(x, pos), lora_out) <= TOL
    with pytest.raises(ValueError, match="no nn.Linear"):
        apply_lora(tiny(), target_names=("qproj",))


def test_lora_linear_merge_single_layer():
    torch.manual_seed(0)
    layer = LoRALinear(torch.nn.Linear(6, 5), rank=2, alpha=4.0)
    with torch.no_grad():
        layer.lora_B.normal_()
    x = torch.randn(3, 6)
    assert max_diff(layer.merge()(x), layer(x)) <= TOL
    assert not layer.base.weight.requires_grad and layer.lora_A.requires_grad


# --- convolutional modules ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: ConformerConvModule(16, kernel_size=5),
        lambda: ConformerConvModule(16, kernel_size=5, norm="layer", causal=True),
        lambda: ConvNeXtV2Block(16, kernel_size=7),
        lambda: ConvPositionEmbedding(16, kernel_size=5, groups=4),
    ],
    ids=["conformer-batchnorm", "conformer-layernorm-causal", "convnextv2", "convpos"],
)
@pytest.mark.parametrize("training", [False, True])
def test_conv_modules_ignore_padding(make, training):
    torch.manual_seed(0)
    module = make().train(training)
    with torch.no_grad():  # make GRN / norms non-trivial so they could leak
        for name, p in module.named_parameters():
            if "grn" in name or "norm" in name:
                p.normal_()
    x = torch.randn(2, 12, 16)
    mask = torch.arange(12)[None, :] < torch.tensor([12, 8])[:, None]
    x2 = x.clone()
    x2[1, 8:] = torch.randn(4, 16) * 10
    out, out2 = module(x, mask), module(x2, mask)
    assert out.shape == x.shape
    assert max_diff(out[mask], out2[mask]) <= TOL
    assert max_diff(module(x2), out2) > 1e-3  # without the mask the padding leaks


def test_grn_against_its_formula():
    grn = GRN(3, eps=1e-6)
    with torch.no_grad():
        grn.gamma.copy_(torch.tensor([0.5, -1.0, 2.0]))
        grn.beta.copy_(torch.tensor([0.1, 0.2, 0.3]))
    x = torch.tensor([[[1.0, 0.0, 2.0], [2.0, 3.0, 0.0]]])  # [B=1, T=2, C=3]
    # G = column L2 norms over time: [sqrt5, 3, 2]; N = G / mean(G)
    g = torch.tensor([5**0.5, 3.0, 2.0])
    n = g / (g.mean() + 1e-6)
    expected = torch.tensor([0.5, -1.0, 2.0]) * (x * n) + torch.tensor([0.1, 0.2, 0.3]) + x
    assert max_diff(grn(x), expected) <= 1e-6
    # padding is excluded from the norm: a masked extra frame changes nothing at real frames
    padded = torch.cat([x, torch.full((1, 1, 3), 7.0)], dim=1)
    out = grn(padded, torch.tensor([[True, True, False]]))
    assert max_diff(out[:, :2], expected) <= 1e-6


def test_timestep_embedding():
    torch.manual_seed(0)
    emb = TimestepEmbedding(24, freq_dim=32)
    out = emb(torch.tensor([0.0, 0.5, 0.5, 1.0]))
    assert out.shape == (4, 24)
    assert max_diff(out[1], out[2]) == 0
    assert max_diff(out[0], out[1]) > 1e-3 and max_diff(out[1], out[3]) > 1e-3
    assert emb(0.25).shape == (1, 24)
    # drives the backbone's adaLN
    model = tiny(cond_dim=24)
    x, pos = inputs(B=4)
    assert model(x, pos, cond=out).shape == (4, 10, 32)
