"""Paper-scale sizes (src/arnar/conf/model/paper*.yaml) against the parameter counts the papers state.

Every network is built on the meta device (shapes only, no memory) from the Hydra configs the DAG
composes for the libritts profile, with that profile's vocabulary: its BPE size (params.yaml
``text.bpe_vocab_size``, 2000 as in PALLE Sec. 5.1 and SyncSpeech Sec. 3.1) plus the 8 special ids,
and the speech codes of its token sets: S3Tokenizer v2's 6561 (3^8 FSQ codes) for the single-stream
paradigms, DAC's 1024 for CoD.

What is counted: every parameter of the network one run trains, embeddings and output heads
included. That is the reading under which PALLE's figure adds up: its stated architecture without
token tables (12 blocks of 4 x 1024^2 attention and a 2 x 1024 x 4096 feed-forward with biases and
norms, 151.2M; the ConvNeXt V2 block, 4.2M; the fusion layer, 2.1M; the convolutional positional
embedding, under 1M) is about 158M, so the rest of the 177.0M can only be the token tables (2000
text and 6561 speech rows of 1024 and the output head: 15.5M). The paper states no more detail.

| paradigm | paper | stated | ours (model config) |
|---|---|---|---|
| PALLE, per network | PALLE (arXiv:2504.10352) Sec. 5.1 | 177.0M | 176.6M (paper) |
| AR, NAR | PALLE (arXiv:2504.10352) Table 3: "the same Transformer backbone" | backbone | PALLE's backbone, 169.4M in all (paper) |
| SyncSpeech | not stated (its CosyVoice baselines are "identical model size") | - | PALLE's backbone, 169.4M (paper) |
| CoD-Base | Chain-of-Details (arXiv:2604.19330) Tables I-II | 263M | 263.6M (paper_cod, DAC's 9 codebooks) |
| DELTA-TTS | OpenReview v2DbAIl7sf: CosyVoice3's Qwen2.5-0.5B, "all 494M" | 494M | 357.9M + Qwen's table = 494.0M (paper_delta) |

DELTA's 494M is Qwen2.5-0.5B with its tied 151,936 x 896 text table; with our 2000-piece BPE and
6561 S3 codes the same architecture is 373.3M as an AR model. The test compares the architecture
(backbone plus Qwen's table) with 494M, and the backbone with Qwen's published non-embedding 0.36B.
"""

from __future__ import annotations

import json
import re

import pytest
import torch
from omegaconf import OmegaConf

from arnar.config import load_params
from arnar.paradigms import build_paradigm
from arnar.paradigms.base import N_SPECIAL, Vocab
from arnar.train import compose_config

S3_CODES = 6561  # S3Tokenizer v2 (CosyVoice 2): FSQ 3^8 (arnar.codec.s3)
DAC_CODES = 1024  # DAC 44.1 kHz, per codebook (arnar.codec.dac)
DAC_STACK = 9  # DAC 44.1 kHz's codebooks, all of which CoD's finest level yields
QWEN_VOCAB = 151936  # Qwen2.5-0.5B config.json vocab_size (tied input/output table)
TOLERANCE = 0.02


def libritts():
    return load_params(overrides={"profile": "libritts"})


def vocab(speech_size: int) -> Vocab:
    return Vocab(text_size=int(libritts()["text"]["bpe_vocab_size"]), speech_size=speech_size)


def build(paradigm: str, model: str, speech_size: int = S3_CODES, **overrides):
    """The paradigm of ``paradigm=<paradigm> model=<model>`` on the meta device."""
    cfg = compose_config([f"paradigm={paradigm}", f"model={model}"])
    model_cfg = {**OmegaConf.to_container(cfg.model, resolve=True), **overrides}
    options = OmegaConf.to_container(cfg.paradigm.options, resolve=True)
    if options.get("codebooks") == "all":  # CoD: the whole DAC stack, as training resolves it from the tokens
        options["codebooks"] = DAC_STACK
    with torch.device("meta"):
        return build_paradigm(str(cfg.paradigm.name), vocab(speech_size), model_cfg, **options)


def count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def within(ours: int, paper: float) -> bool:
    return abs(ours - paper) <= TOLERANCE * paper


def test_the_paper_profile_uses_the_paper_model_and_vocabulary():
    params = libritts()
    assert params["training"]["model"] == "paper" and params["training"]["token_set"] == "s3"
    assert params["text"]["bpe_vocab_size"] == 2000
    assert vocab(S3_CODES).size == N_SPECIAL + 2000 + 6561


def test_palle_network_is_177m():
    palle = build("palle_stage1", "paper")
    one, two = count(palle.stage_one), count(palle.stage_two)
    assert one == two == 176_585_730
    assert within(one, 177.0e6), f"PALLE network {one / 1e6:.2f}M vs 177.0M"
    net = palle.stage_one
    # the feed-forward as built from model=paper: a SwiGLU (three bias-free matrices, ffn_dim 2752) in
    # every block, costing what the paper's two-matrix 4096-wide MLP with biases does (within 1%)
    paper_mlp = 2 * 1024 * 4096 + 4096 + 1024  # 8,393,728
    for block in net.backbone.layers:
        assert count(block.mlp) == 3 * 1024 * 2752  # 8,454,144
    assert abs(count(net.backbone.layers[0].mlp) - paper_mlp) / paper_mlp < 0.01
    # what the paper describes besides the token tables, our modules of it
    # ConvNeXt V2 block, kernel 7, 1024 -> 2048 -> 1024: depth-wise conv, LayerNorm, two linears, GRN
    assert count(net.text_encoder) == (1024 * 7 + 1024) + 2 * 1024 + (1024 * 2048 + 2048) + 2 * 2048 \
        + (2048 * 1024 + 1024) == 4_211_712
    assert count(net.embed) == count(net.head) == (N_SPECIAL + 2000 + 6561) * 1024


@pytest.mark.parametrize("paradigm", ["ar", "nar", "syncspeech"])
def test_ar_nar_and_syncspeech_share_palles_backbone(paradigm):
    """PALLE (arXiv:2504.10352) Table 3: AR (Sys. A) and NAR (Sys. B) are trained "using the same ... Transformer
    backbone"; SyncSpeech states no size and shares it (docs/design.md section 6)."""
    model, palle = build(paradigm, "paper"), build("palle_stage1", "paper")
    # by hand from model=paper (dim 1024, 12 layers, 16 heads, no kv grouping, ffn 2752, no biases): per
    # block q, k, v, o 4 x 1024^2, SwiGLU 3 x 1024 x 2752, two RMSNorms 2 x 1024; then the final norm
    per_block = 4 * 1024 * 1024 + 3 * 1024 * 2752 + 2 * 1024  # 12,650,496
    assert count(model.backbone) == count(palle.stage_one.backbone) == 12 * per_block + 1024  # 151,806,976
    tables = 2 * (N_SPECIAL + 2000 + 6561) * 1024  # embedding and head
    extra = count(model) - count(model.backbone) - tables  # SyncSpeech's duration head (1024 -> 51)
    assert extra == (0 if paradigm != "syncspeech" else 1024 * 51 + 51)
    assert count(model) - extra == 169_356_288


@pytest.mark.parametrize("config", ["cod", "cod_l2", "cod_l1"])
def test_cod_base_is_263m_and_its_width_gives_cod_large(config):
    cod = build(config, "paper_cod", DAC_CODES)
    total = count(cod)
    assert within(total, 263e6), f"CoD-Base {total / 1e6:.2f}M vs 263M"
    # the paper's duration predictor (IV-A: 6 layers, hidden 256) is part of the count
    assert cod.duration.transformer.cfg.n_layers == 6 and cod.duration.transformer.cfg.dim == 256
    assert cod.backbone.cfg.cond_dim == 1024  # adaLN for the speaker (IV-A)
    # the free width was solved on Base; Large (24 layers, 503M in Table I, 502M in Table II) agrees
    large = count(build(config, "paper_cod", DAC_CODES, n_layers=24))
    assert within(large, 503e6) and within(large, 502e6), f"CoD-Large {large / 1e6:.2f}M"


def test_delta_converts_a_qwen2_5_0_5b():
    ar = build("ar", "paper_delta")
    backbone = count(ar.backbone)
    # Qwen2.5-0.5B per layer: q 896x896+896, k and v 896x128+128 each, o 896x896, SwiGLU 3x896x4864,
    # two RMSNorms; and the final norm
    per_layer = (896 * 896 + 896) + 2 * (896 * 128 + 128) + 896 * 896 + 3 * 896 * 4864 + 2 * 896
    assert backbone == 24 * per_layer + 896 == 357_898_112  # Qwen's "non-embedding" 0.36B
    assert within(backbone + QWEN_VOCAB * 896, 494e6)  # with Qwen's tied table: the paper's 494M
    assert count(ar) == backbone + 2 * (N_SPECIAL + 2000 + 6561) * 896 == 373_253_760
    delta = build("delta", "paper_delta")
    assert count(delta.backbone) - sum(p.numel() for n, p in delta.backbone.named_parameters() if ".lora_" in n) \
        == backbone  # the converted model holds the whole AR backbone
    trainable = sum(p.numel() for p in delta.parameters() if p.requires_grad)
    assert count(delta) == 440_350_208 and trainable == count(delta) - count(ar) == 67_096_448


def test_the_dag_gives_each_paradigm_its_paper_model(tmp_path):
    """workflow/rules/runs.smk at the libritts profile: CoD runs use paper_cod, DELTA's runs and the
    AR model they convert (delta_ar) paper_delta, every other run the shared paper backbone."""
    from smoke_dag import BIN, copy_workflow, run

    workflow = copy_workflow(tmp_path / "wf")
    out = run([str(BIN / "snakemake"), "-n", "-p", "--cores", "1", "training", "--config", "profile=libritts"],
              workflow).stdout
    models = {m.group(1): m.group(2) for m in re.finditer(r"arnar train --run-dir \S+/runs/(\w+) .*? model=(\w+)", out)}
    table = json.dumps(models, indent=1, sort_keys=True)  # the run -> model table, for a failing test's message
    # every train command of the dry run was read: as many "arnar train" lines as runs found
    assert len(models) == len(re.findall(r"arnar train --run-dir ", out)), table
    expected_delta = {"delta", "delta_ar", "ar_lora", "delta_noconv", "delta_lora_budget", "delta_noprompt",
                      "delta_unfrozen"}
    assert {run for run, model in models.items() if model == "paper_delta"} == expected_delta, table
    assert {run for run, model in models.items() if model == "paper_cod"} == {"cod", "cod_l1", "cod_l2", "cod_paper",
                                                                                "cod_q1"}, \
        table
    assert {"ar", "nar", "syncspeech", "palle_stage1", "palle"} <= {r for r, m in models.items() if m == "paper"}, table
    assert set(models.values()) == {"paper", "paper_cod", "paper_delta"}, table
    assert re.search(r"runs/delta .*paradigm\.options\.ar_run=data/libritts/runs/delta_ar ", out)
