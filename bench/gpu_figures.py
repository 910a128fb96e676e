"""The GPU figures in one run: decoding speed, batched synthesis and training throughput of every
paradigm at paper size, with the papers' own figures beside them.

    python bench/gpu_figures.py                               # one GPU: model paper, bf16, <= 8 min
    python bench/gpu_figures.py --device cpu --model tiny     # the CPU check (tests/test_bench_gpu_figures.py)
    python bench/gpu_figures.py --merge-from DIR/bench.md     # copy a device run's section into results/bench.md

Three sections, each reusing its bench (bench/decode_speed.py, bench/train_throughput.py), each
kept when another fails:

1. **Decoding** (``decode_speed.benchmark``): every paradigm at ``model=paper`` (random weights:
   speed depends on lengths, not on what was learned), ``generate`` under bf16 autocast (weights
   float32, as the training engine on CUDA), batch 1 (the papers' convention for RTF and FPL), a
   3 s prompt and 6 / 10 s targets: passes, token-stage RTF, FPL-A, loop overhead and ratios to
   AR, and a second table with the papers' figures beside ours (:data:`PAPERS`, each checked
   against the paper's text: the number, the table or passage, the GPU; tests/test_bench_gpu_figures.py
   reads the texts where ARNAR_PAPERS_DIR points at them).
2. **Batched synthesis**: items per second at several batch sizes through the paradigms'
   ``generate_batch(requests, generators, **decoding)`` where a paradigm has one; where none
   has, the table says so and gives batch 1 only (one item per ``generate``).
3. **Training** (``train_throughput.benchmark``): tokens/s, s/update, peak memory per paradigm at
   the paper's batch (``conf/train/paper.yaml``: ``max_tokens`` 20000 a GPU, here 64 utterances of
   10 s: 64 x (250 + 57 + 2) tokens), bf16 autocast, and each paradigm's training FLOP rate as a
   share of a dense matmul of the step's shapes measured in the same run.

Writes ``gpu_figures.json`` and ``gpu_figures.log`` to ``--out`` (default ``$OUT`` when set, a
device machine's output folder, else results/bench/) and the tables as the Markdown section
``<!-- gpu_figures -->`` (other devices and sizes: ``<!-- gpu_figures_MODEL_DEVICE -->``, so a CPU
check never replaces the GPU table) of ``--markdown`` (default ``$OUT/bench.md``, else
results/bench.md). Needs torch, numpy and PyYAML only (no Hydra, no matplotlib, no downloads):
arnar is imported from src/ of this tree, the configs are read as plain YAML.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
try:
    import arnar  # noqa: F401
except ImportError:  # a copy of the tree with a stock PyTorch: arnar from src/
    sys.path.insert(0, str(ROOT / "src"))

import torch  # noqa: E402

import decode_speed as ds  # noqa: E402
import train_throughput as tt  # noqa: E402

SECTION = "gpu_figures"
BUDGET_MINUTES = 8.0

# The papers' speed figures, as printed (token stage, batch 1). ar_*: the AR baseline of the same
# paper and table; ratio = paradigm / that AR.
PAPERS: dict[str, dict[str, Any]] = {
    "syncspeech": {"rtf": 0.07, "ar_rtf": 0.45, "fpl": 0.06, "ar_fpl": 0.22,
                   "source": "SyncSpeech (arXiv:2502.11094) Table 1, LibriSpeech test-clean, text-to-token stage, one A800; "
                             "AR = CosyVoice / CosyVoice2 (the column is headed RTF(%) but holds fractions: "
                             "0.45 / 0.07 is the text's 6.4x)"},
    "palle": {"rtf": 0.06, "ar_rtf": 0.21,
              "source": "PALLE (arXiv:2504.10352) Table 3, cross-sentence, 10 s of speech, batch 1, one A100; PALLE two-stage "
                        "(stage one only: 0.05); AR = VALL-E stage one only, same backbone"},
    "nar": {"rtf": 0.10, "ar_rtf": 0.21,
            "source": "PALLE (arXiv:2504.10352) Table 3: MaskGCT stage one only (NAR), same backbone, tokenizer and data"},
    "delta": {"rtf": 0.144, "ar_rtf": 0.475,
              "source": "DELTA-TTS (OpenReview v2DbAIl7sf) Sec. 4 (Fig. 2 text): RTF 0.144 at 16 steps, token stage, a 3.3x speedup over "
                        "the AR baseline (AR 0.475 = 0.144 x 3.3, not printed); Table 3: 2.08x (< 3 s) to 4.46x (>= 5 s)"},
    "cod": {"source": "Chain-of-Details (arXiv:2604.19330) reports no speed figure"},
}


# ----------------------------------------------------------------------------- options

def defaults(device: str) -> dict[str, Any]:
    """What a run on this device does unless told otherwise: the GPU run the issue asks for, or
    the fast CPU check with the same lengths and paradigms."""
    cuda = device.startswith("cuda")
    return {"repeats": 3 if cuda else 1, "threads": 8 if cuda else 2,
            "train_batch": 64 if cuda else 4, "batch_sizes": [1, 8, 32, 64] if cuda else [1, 2]}


def section_name(model: str, device: str) -> str:
    return SECTION if (model, device.split(":")[0]) == ("paper", "cuda") else f"{SECTION}_{model}_{device.split(':')[0]}"


# ----------------------------------------------------------------------------- batched synthesis

def batched_synthesis(setups: dict[str, ds.Setup], seconds: float, batch_sizes: list[int], seed: int,
                      sync: Callable[[], None], batch1: dict[str, float],
                      log: Callable[[str], None]) -> dict[str, Any]:
    """Items per second per paradigm and batch size through ``generate_batch`` (B requests of
    ``seconds`` of speech, per-item seeds), one warm-up at the largest B; ``batch1``: each
    paradigm's batch-1 seconds from the decoding section (items/s = 1 / that)."""
    requests = ds.make_requests(seconds, setups, seed=seed + int(round(seconds * 1000)))
    rows = {}
    for name, setup in setups.items():
        row: dict[str, Any] = {"batch1_items_per_s": 1.0 / batch1[name] if name in batch1 else None,
                               "items_per_s": {}, "batched_path": False}
        fn = getattr(setup.model, "generate_batch", None)
        if fn is None:
            rows[name] = row
            continue
        row["batched_path"] = True

        def run(b: int) -> float:
            generators = [torch.Generator().manual_seed(seed + i) for i in range(b)]
            sync()
            started = time.perf_counter()
            with ds.autocast(setup):
                out = fn([requests[name]] * b, generators, **setup.decoding)
            sync()
            if len(out) != b:
                raise RuntimeError(f"generate_batch returned {len(out)} items for {b}")
            return time.perf_counter() - started

        try:
            run(max(batch_sizes))
            for b in batch_sizes:
                row["items_per_s"][b] = b / run(b)
                log(f"batched {name} B={b}: {row['items_per_s'][b]:.2f} items/s")
        except Exception as err:  # noqa: BLE001 - reported in the table, the run goes on
            row["error"] = f"{type(err).__name__}: {err}"
            log(f"batched {name}: {row['error']}")
        rows[name] = row
    return {"audio_seconds": seconds, "batch_sizes": batch_sizes, "rows": rows,
            "any_batched": any(r["batched_path"] for r in rows.values())}


# ----------------------------------------------------------------------------- tables

def _f(value: float | None, fmt: str) -> str:
    return "n/a" if value is None else fmt.format(value)


def decode_lines(result: dict[str, Any]) -> list[str]:
    header = [h for h, _, _ in ds.COLUMNS]
    return ["| " + " | ".join(header) + " |", "|" + "|".join(["---"] + ["---:"] * (len(header) - 1)) + "|",
            *("| " + " | ".join(ds.cells(r)) + " |" for r in result["results"])]


def paper_rows(result: dict[str, Any]) -> list[list[str]]:
    """Ours against the papers: RTF and FPL-A over AR at each length, the papers' own beside them."""
    lengths = result["config"]["seconds"]
    by = {(r["paradigm"], r["audio_seconds"]): r for r in result["results"]}
    rows = []
    for name in result["config"]["paradigms"]:
        paper = PAPERS.get(name, {})
        ours_rtf = " / ".join(f"{by[name, s]['rtf']:.3f}" for s in lengths)
        ours_ratio = " / ".join(_f(by[name, s]["token_seconds_vs_ar"], "{:.2f}") for s in lengths)
        ours_fpl = " / ".join(_f(by[name, s]["fpl_seconds_vs_ar"], "{:.2f}") for s in lengths)
        if name == "ar":
            paper_rtf, paper_ratio, paper_fpl = "0.45 / 0.21 / 0.475", "1", "1 (FPL-A 0.22 s)"
            source = "the AR baselines of the SyncSpeech / PALLE / DELTA papers (rows below)"
        else:
            paper_rtf = (f"{paper['rtf']:g} (AR {paper['ar_rtf']:g})" if "rtf" in paper else "-")
            paper_ratio = f"{paper['rtf'] / paper['ar_rtf']:.2f}" if "rtf" in paper else "-"
            paper_fpl = (f"{paper['fpl'] / paper['ar_fpl']:.2f} ({paper['fpl']:g} s vs {paper['ar_fpl']:g} s)"
                         if "fpl" in paper else "-")
            source = paper["source"] if paper else "-"
        rows.append([name, ours_rtf, ours_ratio, ours_fpl, paper_rtf, paper_ratio, paper_fpl, source])
    return rows


def paper_lines(result: dict[str, Any]) -> list[str]:
    lengths = " / ".join(f"{s:g} s" for s in result["config"]["seconds"])
    header = [f"paradigm", f"RTF ({lengths})", "RTF / AR", "FPL-A / AR", "paper RTF", "paper RTF / AR",
              "paper FPL-A / AR", "paper source"]
    return ["| " + " | ".join(header) + " |", "|---|" + "---:|" * 6 + "---|",
            *("| " + " | ".join(row) + " |" for row in paper_rows(result))]


def batched_lines(batched: dict[str, Any]) -> list[str]:
    sizes = batched["batch_sizes"] if batched["any_batched"] else []
    header = ["paradigm", "batched path", "items/s, B = 1 (generate)", *(f"items/s, B = {b}" for b in sizes)]
    lines = ["| " + " | ".join(header) + " |", "|---|---|" + "---:|" * (1 + len(sizes))]
    for name, r in batched["rows"].items():
        per_b = [_f(r["items_per_s"].get(b), "{:.2f}") for b in sizes]
        path = "generate_batch" if r["batched_path"] else "none in src"
        if "error" in r:
            path += f" (failed: {r['error'][:120]})"
        lines.append("| " + " | ".join([name, path, _f(r["batch1_items_per_s"], "{:.2f}"), *per_b]) + " |")
    return lines


def markdown(report: dict[str, Any], command: str) -> str:
    def failed(name: str) -> str:
        if name in report["skipped"]:
            return "skipped (--skip)"
        errors = report["errors"]
        return f"failed: {errors.get(name) or 'building the models: ' + errors.get('build', '?')}"

    c = report["config"]
    env = report["environment"]
    where = env.get("gpu", f"CPU ({env['threads']} thread{'s' if env['threads'] != 1 else ''})")
    out = [f"## GPU figures: model {c['model']}, {where} (bench/gpu_figures.py)", "",
           f"`{command}`: {report['elapsed_seconds'] / 60:.1f} min in all "
           f"({', '.join(f'{k} {v:.0f} s' for k, v in report['section_seconds'].items())}); torch {env['torch']}.", ""]
    decode = report.get("decode")
    out += ["### Decoding, batch 1", ""]
    if decode:
        out += [ds.describe_run(decode) + ".", "", *decode_lines(decode), "",
                "RTF: token-stage seconds per audio second. FPL-A: seconds until the first packet's tokens exist "
                "(\\* streaming: AR and SyncSpeech's first chunk of 15 tokens; otherwise the whole token stage). "
                "Loop overhead: share of `generate` outside the network's forward passes (instrumented run). "
                "Ratios: to AR at the same length, same run.", "",
                "Against the papers (theirs: trained models on their GPUs, their own AR baselines; ours: random "
                "weights, lengths given, one backbone):", "", *paper_lines(decode)]
    else:
        out.append(failed("decode"))
    out += ["", "### Batched synthesis", ""]
    batched = report.get("batched")
    if batched:
        if not batched["any_batched"]:
            out += ["No paradigm has a batched decoding path in src yet (`generate_batch`): only batch 1 exists, "
                    "one item per `generate`; items/s at B = 1 is 1 / its token seconds at "
                    f"{batched['audio_seconds']:g} s above.", ""]
        else:
            out += [f"{batched['audio_seconds']:g} s items, per-item seeds, one call of `generate_batch` per "
                    "measurement after one warm-up call at the largest B; every item of a batch has the same length "
                    "(no padding), so these are upper bounds for a test list of mixed lengths. B = 1 (generate): "
                    "from the decoding table.", ""]
        out += batched_lines(batched)
    else:
        out.append(failed("batched"))
    out += ["", "### Training", ""]
    train = report.get("train")
    if train:
        out += [tt.describe(train) + ".", "", *tt.markdown_table(train), "", tt.FOOTNOTE]
    else:
        out.append(failed("train"))
    return "\n".join(out)


# ----------------------------------------------------------------------------- the run

def merge(source: Path, target: Path) -> list[str]:
    """Copy every ``<!-- gpu_figures* -->`` section of ``source`` into ``target``."""
    text = source.read_text()
    names = sorted({line[5:-4] for line in text.splitlines()
                    if line.startswith(f"<!-- {SECTION}") and line.endswith(" -->")})
    for name in names:
        body = text.split(f"<!-- {name} -->", 1)[1].split(f"<!-- /{name} -->", 1)[0]
        ds.replace_section(target, name, body.strip("\n"))
    return names


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--model", default="paper", help="conf/model/<name>.yaml")
    parser.add_argument("--paradigms", nargs="+", default=ds.DEFAULT_PARADIGMS, help="decoding configs")
    parser.add_argument("--train-paradigms", nargs="+", default=tt.DEFAULT_PARADIGMS, help="training configs")
    parser.add_argument("--seconds", nargs="+", type=float, default=[6, 10], help="target lengths (3 s prompt)")
    parser.add_argument("--repeats", type=int, help="interleaved repeats (default: 3 on CUDA, 1 on a CPU)")
    parser.add_argument("--precision", choices=sorted(ds.PRECISIONS), default="bf16", help="decoding")
    parser.add_argument("--decoding", nargs="*", default=[], metavar="PARADIGM.OPTION=VALUE")
    parser.add_argument("--batch-sizes", nargs="+", type=int, help="batched synthesis (default 1 8 32 64 on CUDA)")
    parser.add_argument("--train-batch", type=int, help="utterances per update (default 64 on CUDA, 4 on a CPU)")
    parser.add_argument("--train-frames", type=int, default=250, help="speech frames per utterance (10 s)")
    parser.add_argument("--train-text", type=int, default=57, help="BPE tokens per utterance (250 / 4.37)")
    parser.add_argument("--threads", type=int)
    parser.add_argument("--skip", nargs="*", default=[], choices=["decode", "batched", "train"])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="folder of the JSON and log (default $OUT, else results/bench)")
    parser.add_argument("--markdown", help="file whose section gets the tables (default $OUT/bench.md, else results/bench.md)")
    parser.add_argument("--merge-from", help="only copy the gpu_figures sections of this bench.md into --markdown")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    env_out = os.environ.get("OUT")
    markdown_path = Path(args.markdown or (Path(env_out) / "bench.md" if env_out and not args.merge_from
                                           else ROOT / "results" / "bench.md"))
    if args.merge_from:
        names = merge(Path(args.merge_from), markdown_path)
        print(f"merged {', '.join(names) or 'nothing'} into {markdown_path}")
        return 0 if names else 1
    d = defaults(args.device)
    repeats = args.repeats or d["repeats"]
    batch_sizes = args.batch_sizes or d["batch_sizes"]
    train_batch = args.train_batch or d["train_batch"]
    torch.set_num_threads(args.threads or d["threads"])
    out_dir = Path(args.out or env_out or ROOT / "results" / "bench")
    out_dir.mkdir(parents=True, exist_ok=True)
    log_file = (out_dir / "gpu_figures.log").open("w")

    def log(line: str) -> None:
        log_file.write(line + "\n")
        log_file.flush()
        if not args.quiet:
            print(line, file=sys.stderr, flush=True)

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device visible to torch (use --device cpu --model tiny for the CPU check)", file=sys.stderr)
        return 2
    sync = ds.synchronizer(device)
    env = ds.environment(device)
    log(f"torch {env['torch']} on {env.get('gpu', 'CPU')}, model {args.model}, {torch.get_num_threads()} threads")
    report: dict[str, Any] = {"config": {"model": args.model, "device": args.device, "seconds": args.seconds,
                                         "repeats": repeats, "precision": args.precision, "batch_sizes": batch_sizes,
                                         "train_batch": train_batch, "train_frames": args.train_frames,
                                         "train_text": args.train_text, "seed": args.seed},
                              "environment": env, "errors": {}, "section_seconds": {}, "skipped": list(args.skip)}
    started = time.perf_counter()

    def section(name: str, fn: Callable[[], Any]) -> Any:
        if name in args.skip:
            return None
        t0 = time.perf_counter()
        try:
            return fn()
        except Exception as err:  # noqa: BLE001 - a failed section is reported; the others still run
            report["errors"][name] = f"{type(err).__name__}: {err}"
            log(f"{name} failed:\n{traceback.format_exc()}")
            return None
        finally:
            report["section_seconds"][name] = time.perf_counter() - t0
            log(f"{name}: {report['section_seconds'][name]:.1f} s")

    decoding = ds.parse_decoding(args.decoding)
    setups = None
    if not {"decode", "batched"} <= set(args.skip):
        setups = section("build", lambda: ds.build_setups(list(args.paradigms), args.model, device, decoding,
                                                          args.precision))
    if setups:
        report["decode"] = section("decode", lambda: ds.benchmark(
            args.model, args.seconds, repeats, list(args.paradigms), args.device, decoding, args.seed, log,
            args.precision, setups=setups))
        if report.get("decode"):
            report["decode"]["config"]["threads"] = torch.get_num_threads()
            print(ds.text_table(report["decode"]))
            longest = max(args.seconds)
            batch1 = {r["paradigm"]: r["token_seconds"] for r in report["decode"]["results"]
                      if r["audio_seconds"] == longest}
        else:
            batch1, longest = {}, max(args.seconds)
        report["batched"] = section("batched", lambda: batched_synthesis(setups, longest, batch_sizes, args.seed,
                                                                         sync, batch1, log))
    setups = None  # free the decoding models before training
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    report["train"] = section("train", lambda: tt.benchmark(
        args.model, list(args.train_paradigms), repeats, args.train_frames, args.train_text, train_batch,
        args.device, args.seed, log=log))
    if report.get("train"):
        print(tt.text_table(report["train"]))
    report["elapsed_seconds"] = time.perf_counter() - started
    minutes = report["elapsed_seconds"] / 60
    log(f"whole run: {minutes:.1f} min" + (f" (over the {BUDGET_MINUTES:g} min budget)" if minutes > BUDGET_MINUTES
                                           and device.type == "cuda" else ""))
    command = "python bench/gpu_figures.py " + " ".join(argv)
    name = section_name(args.model, args.device)
    ds.replace_section(markdown_path, name, markdown(report, command.strip()))
    (out_dir / "gpu_figures.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    log(f"wrote {out_dir / 'gpu_figures.json'} and the section <!-- {name} --> of {markdown_path}")
    log_file.close()
    return 1 if report["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
