"""bench/decode_speed.py: forward passes against each paradigm's theory, ratios to AR from the
same run, the forward-time instrumentation, the config loading and the shared Markdown file.

One benchmark run (model tiny, 1 s and 2 s, one repeat, fewer decoding steps than the defaults so
that every schedule runs all its steps on these short utterances) through the command line,
read back from its JSON."""

from __future__ import annotations

import importlib.util
import json
import math
import statistics
import sys
import time
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "bench" / "decode_speed.py"
SECONDS = [1.0, 2.0]
DECODING = {"nar": {"steps": 6}, "palle": {"steps": 10, "refine_steps": 3}, "delta": {"steps": 8}, "cod": {"steps": 5}}


def load_bench():
    spec = importlib.util.spec_from_file_location("decode_speed", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["decode_speed"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


ds = load_bench()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("decode_speed")
    markdown = out / "bench.md"
    markdown.write_text("# Benchmarks\n\n<!-- other -->\nkept\n<!-- /other -->\n")
    overrides = [f"{name}.{key}={value}" for name, options in DECODING.items() for key, value in options.items()]
    argv = ["--model", "tiny", "--seconds", *map(str, SECONDS), "--repeats", "1",
            "--threads", str(torch.get_num_threads()), "--quiet", "--breakdown", "--decoding", *overrides,
            "--out", str(out / "speed.json"), "--markdown", str(markdown), "--plot", str(out / "scaling.png")]
    assert ds.main(argv) == 0
    return json.loads((out / "speed.json").read_text()), out


def rows_of(result):
    return {(r["paradigm"], r["audio_seconds"]): r for r in result["results"]}


def test_forward_passes_match_each_paradigms_theory(run):
    result, _ = run
    rows = rows_of(result)
    assert {name for name, _ in rows} == {"ar", "nar", "syncspeech", "palle", "delta", "cod"}
    for s in SECONDS:
        T = round(25 * s)  # 25 Hz frames
        L = round(T / 4.37)  # BPE tokens at the mini corpus's 4.37 frames per token
        # AR: the prefill pass predicts the first token, one pass per further token; with a fixed
        # length there is no <eos> decision, so no pass after the last token
        assert rows["ar", s]["passes"] == T
        assert rows["nar", s]["passes"] == DECODING["nar"]["steps"]
        # SyncSpeech: one pass for the first duration, one per text token
        assert rows["syncspeech", s]["passes"] == L + 1
        # PALLE (Eq. 14): stage one commits k' = floor((T_prompt + T) / steps) frames a pass, so
        # ceil(T / k') passes; stage two (Eqs. 15-16) scores the sequence and re-predicts the
        # least confident floor(0.05 (T - 1)) + 1 frames, two passes a step, never the same frame
        # twice (they fit in T)
        steps, refine = DECODING["palle"]["steps"], DECODING["palle"]["refine_steps"]
        k = max(1, (T + round(25 * ds.PROMPT_SECONDS)) // steps)
        assert refine * (math.floor(0.05 * (T - 1)) + 1) <= T
        assert rows["palle", s]["passes"] == math.ceil(T / k) + 2 * refine
        # DELTA: one pass per step when the first step of the shifted schedule (mu = 0.3, Eq. 3)
        # already commits a token: floor(c_1 T) >= 1
        steps = DECODING["delta"]["steps"]
        assert 0.3 * (1 / steps) / (1 - 0.7 / steps) * T >= 1
        assert rows["delta", s]["passes"] == steps
        # CoD: steps per level, 3 levels of a 50 Hz stack (12.5 / 25 / 50 Hz), when even the coarsest
        # level keeps a token masked until the last step (cosine schedule at step steps - 1), and
        # one pass more that reads the stack's other codebooks (codebooks: all)
        steps = DECODING["cod"]["steps"]
        coarsest = math.ceil(2 * T / 4)
        assert math.floor(coarsest * math.cos(math.pi / 2 * (steps - 1) / steps)) >= 1
        assert rows["cod", s]["passes"] == 3 * steps + 1
        # the same duration everywhere: T frames at 25 Hz, 2 T at CoD's 50 Hz
        for name in ("ar", "nar", "syncspeech", "palle", "delta"):
            assert rows[name, s]["frames"] == T
        assert rows["cod", s]["frames"] == 2 * T


def test_ratios_to_ar_come_from_the_same_run(run):
    result, _ = run
    rows = rows_of(result)
    runs = result["runs"]
    for s in SECONDS:
        # interleaved: every paradigm ran at this length in every repeat
        for repeat in range(result["config"]["repeats"]):
            assert {r["paradigm"] for r in runs if r["repeat"] == repeat and r["audio_seconds"] == s} == \
                {name for name, _ in rows}
        ar_seconds = statistics.median(r["seconds"] for r in runs if r["paradigm"] == "ar" and r["audio_seconds"] == s)
        ar_fpl = statistics.median(r["fpl_seconds"] for r in runs if r["paradigm"] == "ar" and r["audio_seconds"] == s)
        for (name, length), row in rows.items():
            if length != s:
                continue
            mine = [r for r in runs if r["paradigm"] == name and r["audio_seconds"] == s]
            assert row["token_seconds"] == statistics.median(r["seconds"] for r in mine)
            assert row["passes_vs_ar"] == pytest.approx(row["passes"] / rows["ar", s]["passes"])
            assert row["token_seconds_vs_ar"] == pytest.approx(row["token_seconds"] / ar_seconds)
            assert row["fpl_seconds_vs_ar"] == pytest.approx(row["fpl_seconds"] / ar_fpl)
            assert row["rtf"] == pytest.approx(row["token_seconds"] / s)
        assert rows["ar", s]["token_seconds_vs_ar"] == 1.0
        # the streaming paradigms report their first packet; AR's comes after chunk_size (15) tokens
        assert rows["ar", s]["streams"] and rows["syncspeech", s]["streams"]
        assert rows["ar", s]["fpl_seconds"] < rows["ar", s]["token_seconds"]
        assert rows["nar", s]["fpl_seconds"] == rows["nar", s]["token_seconds"]


def test_forward_time_is_measured_inside_every_decoding_loop(run):
    result, _ = run
    for r in result["runs"]:
        # the hooks fired (a wrong module path would give 0) and never outlast the loop
        assert 0 < r["forward_seconds"] < r["profiled_seconds"], r
    for row in result["results"]:
        assert 0 < row["overhead"] < 1


def test_every_backbone_pass_runs_inside_the_timed_network_calls():
    """The modules and methods of NETWORK_CALLS enclose every pass: the first block of every
    backbone (each pass runs all blocks; DELTA runs them itself) is only ever called while the
    timer is inside a timed call, and it is called once per counted forward pass."""
    from arnar.nn import Transformer

    setups = ds.build_setups(ds.DEFAULT_PARADIGMS, "tiny", torch.device("cpu"), DECODING)
    requests = ds.make_requests(1.0, setups, seed=0)
    for name, setup in setups.items():
        timer = ds.ForwardTimer(lambda: None).attach(setup.model, ds.NETWORK_CALLS[name])
        first_blocks = [m.layers[0] for m in setup.model.modules() if isinstance(m, Transformer)]
        if name == "cod":  # its duration predictor's transformer is not run when the length is given
            first_blocks = [setup.model.backbone.layers[0]]
        seen = []
        handles = [block.register_forward_pre_hook(lambda module, args: seen.append(timer.inside))
                   for block in first_blocks]
        generation = setup.model.generate(requests[name], torch.Generator().manual_seed(0), **setup.decoding)
        timer.detach()
        for handle in handles:
            handle.remove()
        assert seen and all(seen), name
        assert len(seen) == generation.forward_passes, name


def test_outputs_share_the_markdown_file_and_plot(run):
    result, out = run
    text = (out / "bench.md").read_text()
    assert "<!-- other -->\nkept\n<!-- /other -->" in text
    assert text.count("<!-- decode_speed -->") == 1 and text.count("<!-- /decode_speed -->") == 1
    assert text.count("| cod |") == len(SECONDS)
    # a second write replaces the section, it does not add one
    ds.replace_section(out / "bench.md", "decode_speed", "replaced")
    text = (out / "bench.md").read_text()
    assert "<!-- decode_speed -->\nreplaced\n<!-- /decode_speed -->" in text and "| cod |" not in text
    assert "kept" in text
    assert (out / "scaling.png").read_bytes()[:4] == b"\x89PNG"
    assert result["config"]["decoding"]["palle"] == DECODING["palle"]


class Sleeper(torch.nn.Module):
    def __init__(self, seconds: float, child: torch.nn.Module | None = None):
        super().__init__()
        self.seconds, self.child = seconds, child

    def forward(self, x):
        time.sleep(self.seconds)
        return x if self.child is None else self.child(x)

    def helper(self, x):
        time.sleep(self.seconds)
        return x


def test_forward_timer_counts_nested_calls_once_and_detaches():
    root = torch.nn.Module()
    root.outer = Sleeper(0.05, Sleeper(0.05))
    timer = ds.ForwardTimer(lambda: None).attach(root, ("outer", "outer.child", "outer.helper"))
    root.outer(torch.zeros(1))  # 0.10 s, the child's 0.05 inside it (counted twice: 0.15)
    root.outer.helper(torch.zeros(1))  # a wrapped method: 0.05 s
    assert 0.15 <= timer.seconds < 0.18
    timer.detach()
    assert "helper" not in root.outer.__dict__
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in root.modules())
    root.outer(torch.zeros(1))
    assert timer.seconds < 0.18  # detached: nothing more is added


def test_overhead_breakdown_sees_only_the_loop_outside_the_network(run):
    """The profiler pauses inside the network calls: no backbone or attention function is among a
    paradigm's overhead entries, the shares are of the profiled overhead (at most 1 in all), and
    AR's sampling step is part of what it finds."""
    result, out = run
    breakdown = result["breakdown"]
    assert breakdown["audio_seconds"] == max(SECONDS)
    assert set(breakdown["paradigms"]) == set(result["config"]["paradigms"])
    for name, b in breakdown["paradigms"].items():
        assert b["overhead_seconds"] > 0 and b["top"], name
        assert sum(t["share"] for t in b["top"]) <= 1.0 + 1e-9
        for entry in b["top"]:
            assert not any(word in entry["function"] for word in ("transformer.py", "scaled_dot_product")), (name, entry)
    ar_functions = " ".join(t["function"] for t in breakdown["paradigms"]["ar"]["top"])
    assert "sampling.py" in ar_functions or "ar.py" in ar_functions, ar_functions
    table = ds.breakdown_section(breakdown["paradigms"], breakdown["audio_seconds"])
    assert table.startswith("### Where the loop overhead goes (2 s") and table.count("\n| `") == len(breakdown["paradigms"])


def test_breakdown_labels_and_the_timers_pause_callbacks():
    assert ds.label_function(("/x/arnar/decode/sampling.py", 10, "sample_token")) == "sampling.py:sample_token"
    assert ds.label_function(("~", 0, "<built-in method torch.tensor>")) == "torch.tensor"
    assert ds.label_function(("~", 0, "<method 'item' of 'torch._C.TensorBase' objects>")) == \
        "'item' of 'torch._C.TensorBase' objects"
    events = []
    root = torch.nn.Module()
    root.outer = Sleeper(0.0, Sleeper(0.0))
    timer = ds.ForwardTimer(lambda: None, on_enter=lambda: events.append("pause"),
                            on_exit=lambda: events.append("resume")).attach(root, ("outer", "outer.child"))
    root.outer(torch.zeros(1))  # nested: one pause and one resume around the outer call only
    timer.detach()
    assert events == ["pause", "resume"]


@pytest.mark.parametrize("size", ["tiny", "paper"])
def test_plain_yaml_configs_equal_hydra_composition(size):
    """Every paradigm config (those extending another through Hydra defaults too) at the model
    config the DAG gives it at this size (``sized_model``: paper_cod / paper_delta where they
    exist, a global package setting paradigm options as well)."""
    omegaconf = pytest.importorskip("omegaconf")
    from arnar.train import compose_config

    configs = sorted(p.stem for p in (ds.CONF_DIR / "paradigm").glob("*.yaml"))
    assert set(ds.DEFAULT_PARADIGMS) <= set(configs) and "delta_noconv" in configs
    for config in configs:
        name, model, options = ds.load_config(config, size)
        cfg = compose_config([f"paradigm={config}", f"model={ds.sized_model(size, name)}"])
        composed = omegaconf.OmegaConf.to_container(cfg.paradigm.options, resolve=True) or {}
        composed.pop("ar_run", None)
        assert (name, options) == (cfg.paradigm.name, composed), config
        assert model == omegaconf.OmegaConf.to_container(cfg.model, resolve=True), config


def test_sized_model_follows_the_dag():
    assert ds.sized_model("tiny", "cod") == "tiny" and ds.sized_model("small", "ar") == "small"
    for paradigm in ("ar", "nar", "syncspeech", "palle", "delta", "cod"):
        own = ds.CONF_DIR / "model" / f"paper_{paradigm}.yaml"
        assert ds.sized_model("paper", paradigm) == (f"paper_{paradigm}" if own.exists() else "paper")
    assert ds.vocab_for("paper", "ar").speech_size == 6561 and ds.vocab_for("paper", "cod").speech_size == 1024
    assert ds.vocab_for("small", "cod").speech_size == ds.COD_SPEECH_VOCAB
