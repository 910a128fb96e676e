"""What the Snakefile's malloc settings buy a training update: the same bf16 updates in two child
processes, one with glibc's default allocator settings and one with the Snakefile's, alternating,
and the ratio of their seconds per update, kernel time and page faults.

    python bench/malloc_settings.py [--paradigms ar nar syncspeech] [--frames 700] [--text 120]
                                    [--batch 3] [--updates 5] [--rounds 2] [--threads 1]

glibc hands every freed block above its mmap threshold (dynamic, at most 32 MiB) back to the kernel,
so the next update faults the same amount of memory in again and the kernel zeroes it page by
page. A training update of these small models frees and reallocates attention scores and
activations of tens of MiB each; at the default profile's lengths (prompt + target pairs of up to
~30 s, 25 Hz) that is the ``sys`` column below. The settings (MALLOC_MMAP_THRESHOLD_,
MALLOC_TRIM_THRESHOLD_, MALLOC_TOP_PAD_) keep freed memory in the heap instead. They change where
memory comes from, not what is computed: a child prints the loss of every update, and the bench
checks both settings print the same ones.

Each child trains one paradigm (bench/train_throughput.py's synthetic utterances, the engine's
``optimizer_step`` under bf16 autocast as ``train.precision: bf16`` runs it on a CPU) for two warm-up
updates and ``--updates`` timed ones; the two settings alternate for ``--rounds`` rounds, so the
machine's load falls on both alike. The DAG trains on one thread per run (``--threads 1``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = Path(__file__).resolve().parent


def snakefile_settings(snakefile: Path = ROOT / "Snakefile") -> dict[str, str]:
    """The MALLOC_* values the Snakefile sets (read from its text, so the bench measures what the
    DAG uses and fails loudly when the two drift apart)."""
    import re

    found = dict(re.findall(r'"(MALLOC_[A-Z_]+)":\s*"(\d+)"', snakefile.read_text()))
    if not found:
        raise SystemExit(f"{snakefile}: no MALLOC_* settings found")
    return found


def child(paradigm: str, frames: int, text: int, batch: int, updates: int, threads: int) -> dict:
    """One process's measurement (run with ``--child``): seconds per update, user and system CPU
    seconds, minor page faults, peak resident memory and the losses of the timed updates."""
    import resource
    import time

    import torch

    torch.set_num_threads(threads)
    sys.path.insert(0, str(BENCH))
    from train_throughput import SPEECH_VOCAB, TEXT_VOCAB, build, engine, synthetic_utterances, with_acoustic_stack

    from arnar.paradigms.base import Vocab, collate

    build_optimizer, optimizer_step, _ = engine()
    utts = synthetic_utterances(batch, frames, text, Vocab(TEXT_VOCAB, SPEECH_VOCAB), seed=0)
    model = build(paradigm, "small")[0].train()
    utts = with_acoustic_stack(utts, model, seed=0)
    optimizer = build_optimizer(model, lr=1e-4, weight_decay=0.0)
    generator = torch.Generator().manual_seed(0)
    torch.manual_seed(0)  # dropout

    def update() -> float:
        batch_ = collate([model.training_example(u, generator) for u in utts])
        result = optimizer_step(model, optimizer, [batch_], lr=1e-4, grad_clip=1.0, device=torch.device("cpu"),
                                autocast_dtype=torch.bfloat16)
        optimizer.zero_grad(set_to_none=True)
        return result.loss

    for _ in range(2):  # warm-up: optimizer state, oneDNN primitives, the allocator's first growth
        update()
    before, started = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    losses = [update() for _ in range(updates)]
    elapsed, after = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_SELF)
    return {"seconds_per_update": elapsed / updates, "user_s": after.ru_utime - before.ru_utime,
            "sys_s": after.ru_stime - before.ru_stime, "minor_faults": after.ru_minflt - before.ru_minflt,
            "max_rss_gib": after.ru_maxrss / 2 ** 20, "losses": losses}


def measure(paradigm: str, env: dict[str, str], args: argparse.Namespace) -> dict:
    command = [sys.executable, __file__, "--child", paradigm, "--frames", str(args.frames), "--text", str(args.text),
               "--batch", str(args.batch), "--updates", str(args.updates), "--threads", str(args.threads)]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"bench/malloc_settings.py: the {paradigm} child failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--paradigms", nargs="+", default=["ar", "nar", "syncspeech"])
    parser.add_argument("--frames", type=int, default=700, help="speech frames per utterance (25 Hz: 28 s)")
    parser.add_argument("--text", type=int, default=120, help="text tokens per utterance")
    parser.add_argument("--batch", type=int, default=3)
    parser.add_argument("--updates", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.frames, args.text, args.batch, args.updates, args.threads)))
        return 0

    settings = snakefile_settings()
    default_env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    envs = {"default": default_env, "snakefile": {**default_env, **settings}}
    print(f"{args.batch} x ({args.frames} frames + {args.text} text), {args.threads} thread(s), bf16, "
          f"{args.updates} updates x {args.rounds} alternating rounds; settings: "
          + " ".join(f"{k}={v}" for k, v in settings.items()))
    print(f"{'paradigm':<12}{'setting':<11}{'s/update':>9}{'sys %':>7}{'faults/upd':>12}{'RSS GiB':>9}")
    for paradigm in args.paradigms:
        runs: dict[str, list[dict]] = {name: [] for name in envs}
        for _ in range(args.rounds):
            for name, env in envs.items():
                runs[name].append(measure(paradigm, env, args))
        if runs["default"][0]["losses"] != runs["snakefile"][0]["losses"]:
            raise SystemExit(f"{paradigm}: the losses differ between the settings: "
                             f"{runs['default'][0]['losses']} against {runs['snakefile'][0]['losses']}")
        seconds = {}
        for name, results in runs.items():
            seconds[name] = statistics.median(r["seconds_per_update"] for r in results)
            cpu = sum(r["user_s"] + r["sys_s"] for r in results)
            print(f"{paradigm:<12}{name:<11}{seconds[name]:>9.3f}{100 * sum(r['sys_s'] for r in results) / cpu:>7.1f}"
                  f"{statistics.median(r['minor_faults'] for r in results) / args.updates:>12.0f}"
                  f"{max(r['max_rss_gib'] for r in results):>9.2f}")
        print(f"{paradigm:<12}default / snakefile seconds per update: {seconds['default'] / seconds['snakefile']:.3f} "
              "(same losses)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
