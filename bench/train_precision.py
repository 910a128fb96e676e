"""What bf16 autocast buys a training update on this machine: float32 and bf16 updates of every
paradigm timed side by side in one run, and their ratio.

    python bench/train_precision.py [--model small] [--paradigms ar nar ...] [--repeats 5]
                                    [--frames 75] [--text 18] [--batch 24] [--threads 1] [--device cpu]

``train.precision: bf16`` autocasts on a CPU too (``arnar.train.config._autocast_dtype``); ``auto``
keeps a CPU run in float32, so that a CPU run reproduces its numbers. Whether bf16 pays depends
on the CPU: with AVX-512 BF16 (AMD Zen 4, Intel Sapphire Rapids) oneDNN runs bf16 matmuls natively,
without it they are emulated and slower than float32. This bench says which, per paradigm.

Each paradigm trains on bench/train_throughput.py's synthetic batch, one model per precision built
from the same seed, with the engine's own ``arnar.train.optimizer_step``; the two precisions'
updates alternate within every repeat, so machine load falls on both alike. Reports the median
seconds per update of each and ``float32 / bf16`` (above 1: bf16 is faster). Writes JSON (default
results/bench/train_precision.json).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from train_throughput import (  # noqa: E402
    DEFAULT_PARADIGMS,
    SPEECH_VOCAB,
    TEXT_VOCAB,
    build,
    engine,
    synthetic_utterances,
    with_acoustic_stack,
    synchronizer,
)

from arnar.paradigms.base import Vocab, collate  # noqa: E402

PRECISIONS = {"fp32": None, "bf16": torch.bfloat16}


def benchmark(model_size: str = "small", paradigms: list[str] | None = None, repeats: int = 5, frames: int = 75,
              text: int = 18, batch_size: int = 24, device: str = "cpu", seed: int = 0,
              log: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """``{"config", "results"}``, ``results``: paradigm -> seconds per update per precision and the ratio."""
    device_ = torch.device(device)
    sync = synchronizer(device_)
    build_optimizer, optimizer_step, engine_name = engine()
    utts = synthetic_utterances(batch_size, frames, text, Vocab(TEXT_VOCAB, SPEECH_VOCAB), seed=seed)
    rows = {}
    for name in paradigms or DEFAULT_PARADIGMS:
        setups = {}
        for precision in PRECISIONS:
            model = build(name, model_size)[0].to(device_).train()
            g = torch.Generator().manual_seed(seed)
            batch = collate([model.training_example(u, g) for u in with_acoustic_stack(utts, model, seed)]).to(device_)
            setups[precision] = (model, batch, build_optimizer(model, lr=1e-4, weight_decay=0.0))
        times: dict[str, list[float]] = {p: [] for p in PRECISIONS}
        for repeat in range(repeats + 1):  # the first round warms up (allocator, kernels, optimizer state)
            for precision, (model, batch, optimizer) in setups.items():
                sync()
                started = time.perf_counter()
                optimizer_step(model, optimizer, [batch], lr=1e-4, grad_clip=1.0, device=device_,
                               autocast_dtype=PRECISIONS[precision])
                sync()
                if repeat:
                    times[precision].append(time.perf_counter() - started)
                optimizer.zero_grad(set_to_none=True)
        seconds = {p: statistics.median(t) for p, t in times.items()}
        rows[name] = {"seconds_per_update": seconds, "tokens_per_update": int(setups["fp32"][1].lengths.sum()),
                      "fp32_over_bf16": seconds["fp32"] / seconds["bf16"]}
        log(f"{name}: float32 {seconds['fp32']:.3f} s, bf16 {seconds['bf16']:.3f} s, "
            f"ratio {rows[name]['fp32_over_bf16']:.2f}")
    flags = Path("/proc/cpuinfo").read_text().split() if Path("/proc/cpuinfo").exists() else []
    config = {"model": model_size, "repeats": repeats, "frames": frames, "text": text, "batch": batch_size,
              "device": device, "threads": torch.get_num_threads(), "engine": engine_name, "torch": torch.__version__,
              "avx512_bf16": "avx512_bf16" in flags, "amx_bf16": "amx_bf16" in flags}
    return {"config": config, "results": rows}


def text_table(result: dict[str, Any]) -> str:
    c = result["config"]
    lines = [f"model={c['model']}, {c['device']}, {c['threads']} thread(s), batch {c['batch']} x ({c['frames']} frames "
             f"+ {c['text']} text), median of {c['repeats']} alternating repeats; avx512_bf16 {c['avx512_bf16']}, "
             f"amx_bf16 {c['amx_bf16']}; torch {c['torch']}",
             f"{'paradigm':<22}{'float32 s':>10}{'bf16 s':>10}{'fp32/bf16':>11}"]
    for name, r in result["results"].items():
        s = r["seconds_per_update"]
        lines.append(f"{name:<22}{s['fp32']:>10.3f}{s['bf16']:>10.3f}{r['fp32_over_bf16']:>11.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small")
    parser.add_argument("--paradigms", nargs="+", default=DEFAULT_PARADIGMS)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--frames", type=int, default=75, help="speech frames per utterance (25 Hz: 3 s)")
    parser.add_argument("--text", type=int, default=18, help="text tokens per utterance")
    parser.add_argument("--batch", type=int, default=24)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the DAG trains on one per run)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=Path("results/bench/train_precision.json"))
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    result = benchmark(args.model, args.paradigms, args.repeats, args.frames, args.text, args.batch, args.device,
                       log=lambda line: print(line, file=sys.stderr, flush=True))
    print(text_table(result))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
