"""bench/train_throughput.py: its copy of the engine's update equals arnar.train's (the GPU image
may lack OmegaConf), the FLOP estimate's N and arithmetic, and one CLI run with the training FLOP
rate as a share of the dense matmul of the same run."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import torch

from arnar.paradigms.base import Vocab, collate

ROOT = Path(__file__).resolve().parents[1]


def load(name: str):
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


tt = load("train_throughput")
VOCAB = Vocab(text_size=tt.TEXT_VOCAB, speech_size=tt.SPEECH_VOCAB)  # ids every paradigm holds


def batch_for(model, n=3, frames=30, text=7):
    utts = tt.synthetic_utterances(n, frames, text, VOCAB, seed=0)
    return collate([model.training_example(u, torch.Generator().manual_seed(0)) for u in utts])


@pytest.mark.parametrize("config", ["ar", "delta"])
def test_the_bench_copy_of_the_update_equals_the_engines(config):
    from arnar.train import build_optimizer, optimizer_step

    updated = []
    for build_opt, step in ((build_optimizer, optimizer_step), (tt._build_optimizer, tt._optimizer_step)):
        model, _ = tt.build(config, "tiny")  # the same random weights every time
        model.train()
        optimizer = build_opt(model, lr=1e-3, weight_decay=0.05, betas=[0.9, 0.95], eps=1e-8)
        batch = batch_for(model)
        for _ in range(2):
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(1)
                step(model, optimizer, [batch], lr=1e-3, grad_clip=0.5, device="cpu", autocast_dtype=None)
        updated.append({k: v.clone() for k, v in model.state_dict().items()})
        groups = [[tuple(p.shape) for p in g["params"]] for g in optimizer.param_groups]
        updated.append(groups)
    engine_state, engine_groups, copy_state, copy_groups = updated
    assert engine_groups == copy_groups
    assert engine_state.keys() == copy_state.keys()
    for key in engine_state:
        torch.testing.assert_close(copy_state[key], engine_state[key], msg=key)
    initial, _ = tt.build(config, "tiny")
    assert any(not torch.equal(initial.state_dict()[k], engine_state[k]) for k in engine_state)  # it did train


def test_engine_prefers_arnar_train():
    build_optimizer, optimizer_step, where = tt.engine()
    from arnar import train

    assert (build_optimizer, optimizer_step, where) == (train.build_optimizer, train.optimizer_step,
                                                        "arnar.train.optimizer_step")


def test_parameters_on_the_loss_path_and_the_estimate():
    model, cfg = tt.build("ar", "tiny")
    batch = batch_for(model)
    n = tt.parameters_on_loss_path(model, batch, None)
    embeddings = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Embedding))
    assert n == sum(p.numel() for p in model.parameters()) - embeddings  # AR: every weight but its table
    assert all(p.grad is None for p in model.parameters())
    # DELTA: the frozen backbone is on the path (its inputs need gradients), so N > trainable
    delta, _ = tt.build("delta", "tiny")
    frozen = {name for name, p in delta.named_parameters() if not p.requires_grad}
    n_delta = tt.parameters_on_loss_path(delta, batch_for(delta), None)
    assert n_delta > sum(p.numel() for p in delta.parameters() if p.requires_grad)
    assert {name for name, p in delta.named_parameters() if not p.requires_grad} == frozen  # restored
    # the arithmetic: 6 N T + 12 L d sum S^2
    lengths = torch.tensor([10, 20])
    est = tt.flop_estimate(1000, lengths, n_layers=2, dim=8)
    assert est == {"dense": 6 * 1000 * 30, "attention": 12 * 2 * 8 * (100 + 400), "total": 180000 + 96000}
    # the counted FLOPs cover the estimate's dense part (matmuls of every weight on the path)
    # and stay under the whole estimate plus padding (tiny: no padding, all sequences one length)
    counted = tt.counted_flops(model, batch, None)
    est = tt.flop_estimate(n, batch.lengths, cfg["n_layers"], cfg["dim"])
    assert 0.97 * est["dense"] <= counted <= 1.01 * est["total"]
    assert all(p.grad is None for p in model.parameters())


def test_matmul_seconds_is_per_call():
    a, b = torch.randn(64, 32), torch.randn(32, 48)
    seconds = tt.matmul_seconds(a, b, lambda: None, min_seconds=0.02)
    assert 0 < seconds < 0.02


def test_cli_reports_training_against_the_matmul(tmp_path):
    markdown = tmp_path / "bench.md"
    markdown.write_text("<!-- decode_speed -->\nkept\n<!-- /decode_speed -->\n")
    argv = ["--model", "tiny", "--paradigms", "ar", "palle_stage1", "cod", "--repeats", "1", "--frames", "25",
            "--text", "6", "--batch", "2", "--threads", "1", "--quiet", "--out", str(tmp_path / "t.json"),
            "--markdown", str(markdown)]
    assert tt.main(argv) == 0
    result = json.loads((tmp_path / "t.json").read_text())
    mm = result["matmul"]
    assert mm["shape"] == [2 * (25 + 6 + 2), 32, 64] and mm["dtype"] == "float32"
    assert mm["flops_per_s"] == pytest.approx(mm["flops"] / mm["seconds"])
    assert set(result["results"]) == {"ar", "palle_stage1", "cod"}
    for r in result["results"].values():
        assert r["share_of_matmul"] > 0 and r["counted_share_of_matmul"] > 0
        assert r["tokens_per_s"] == pytest.approx(r["tokens_per_update"] / r["seconds_per_update"])
    text = markdown.read_text()
    assert "<!-- decode_speed -->\nkept\n<!-- /decode_speed -->" in text
    section = text.split("<!-- train_throughput -->")[1]
    assert "share of matmul" in section and "dense matmul [66, 32] x [32, 64] float32" in section
    assert section.count("| palle_stage1 |") == 1 and "6 N T + 12 L d sum S_i^2" in section


def test_a_paradigm_with_a_size_of_its_own_gets_its_own_matmul(tmp_path, monkeypatch):
    """At paper scale CoD and DELTA have model configs of their own (paper_cod, paper_delta): each
    paradigm's FLOP rate is set against the matmul of its own backbone's shapes."""
    import shutil

    import yaml

    ds = sys.modules["decode_speed"]
    conf = tmp_path / "conf"
    shutil.copytree(ds.CONF_DIR / "paradigm", conf / "paradigm")
    (conf / "model").mkdir()
    tiny = yaml.safe_load((ds.CONF_DIR / "model" / "tiny.yaml").read_text())
    (conf / "model" / "tiny.yaml").write_text(yaml.safe_dump(tiny))
    (conf / "model" / "tiny_cod.yaml").write_text(  # a global package, as paper_cod.yaml
        "# @package _global_\n" + yaml.safe_dump({"model": {**tiny, "dim": 48, "ffn_dim": 96},
                                                  "paradigm": {"options": {"duration_layers": 1}}}))
    monkeypatch.setattr(ds, "CONF_DIR", conf)
    result = tt.benchmark("tiny", ["ar", "cod"], repeats=1, frames=20, text=5, batch_size=2, matmul_min_seconds=0.01)
    ar, cod = result["results"]["ar"], result["results"]["cod"]
    assert (ar["model_file"], cod["model_file"]) == ("tiny", "tiny_cod")
    assert ar["matmul"] == [2 * 27, 32, 64] and cod["matmul"] == [2 * 27, 48, 96]
    rates = {tuple(mm["shape"]): mm["flops_per_s"] for mm in result["matmuls"]}
    assert len(rates) == 2
    for r in (ar, cod):
        assert r["share_of_matmul"] == pytest.approx(r["flops_per_s"] / rates[tuple(r["matmul"])])
    assert "cod: tiny_cod" in tt.describe(result) and "[54, 48] x [48, 96]" in tt.describe(result)


def test_precision_bench_times_both_precisions_side_by_side(tmp_path, capsys):
    tp = load("train_precision")
    out = tmp_path / "precision.json"
    assert tp.main(["--model", "tiny", "--paradigms", "ar", "nar", "--repeats", "1", "--batch", "2",
                    "--frames", "12", "--text", "4", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert list(result["results"]) == ["ar", "nar"]
    for row in result["results"].values():
        fp32, bf16 = row["seconds_per_update"]["fp32"], row["seconds_per_update"]["bf16"]
        assert fp32 > 0 and bf16 > 0 and row["fp32_over_bf16"] == pytest.approx(fp32 / bf16)
    table = capsys.readouterr().out
    assert "fp32/bf16" in table and table.count("\n") == 4  # two header lines and one row per paradigm
