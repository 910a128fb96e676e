"""Corpus synthesis and ingest throughput: 1 worker vs N workers, measured side by side.

    python bench/data_throughput.py [--speakers 14] [--utterances 24] [--repeats 2] [--workers 2]

Runs are interleaved (1, N, 1, N, ...) so machine load affects both alike; the table gives the
median wall time, audio seconds per wall second (x real time) and the speed-up of N workers
over 1. Prints a table and writes JSON (default results/bench/data_throughput.json).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from arnar.corpus.manifests import ingest_corpus
from arnar.corpus.synth import build_synth_corpus
from arnar.corpus.validate import ValidationLimits


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--speakers", type=int, default=14)
    parser.add_argument("--utterances", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", default="results/bench/data_throughput.json")
    args = parser.parse_args(argv)

    limits = ValidationLimits(sample_rate=16000, min_duration=0.5, max_duration=30.0)
    times: dict[tuple[str, int], list[float]] = {}
    audio_seconds = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        for rep in range(args.repeats):
            for workers in (1, args.workers):
                corpus = tmp / f"corpus-{workers}"
                shutil.rmtree(corpus, ignore_errors=True)
                summary = {}

                def synth():
                    summary.update(build_synth_corpus(
                        corpus, n_speakers=args.speakers, utterances_per_speaker=args.utterances,
                        n_test_speakers=1, seed=0, workers=workers, progress=False))

                times.setdefault(("synthesis", workers), []).append(timed(synth))
                audio_seconds = summary["seconds"]
                times.setdefault(("ingest", workers), []).append(timed(lambda: ingest_corpus(
                    corpus, tmp / f"manifests-{workers}", limits=limits, dev_fraction=0.1, seed=0,
                    workers=workers, progress=False)))
                print(f"repeat {rep + 1}/{args.repeats}, {workers} worker(s) done", file=sys.stderr)

    rows = []
    for stage in ("synthesis", "ingest"):
        one = statistics.median(times[(stage, 1)])
        many = statistics.median(times[(stage, args.workers)])
        rows.append({
            "stage": stage, "audio_seconds": round(audio_seconds, 2),
            "wall_1": round(one, 3), f"wall_{args.workers}": round(many, 3),
            "x_real_time_1": round(audio_seconds / one, 1),
            f"x_real_time_{args.workers}": round(audio_seconds / many, 1),
            "speedup": round(one / many, 2),
        })
    print(f"{'stage':<10} {'audio s':>8} {'1 worker s':>11} {f'{args.workers} workers s':>12} "
          f"{'xRT 1':>7} {f'xRT {args.workers}':>7} {'speed-up':>9}")
    for r in rows:
        print(f"{r['stage']:<10} {r['audio_seconds']:>8} {r['wall_1']:>11} {r[f'wall_{args.workers}']:>12} "
              f"{r['x_real_time_1']:>7} {r[f'x_real_time_{args.workers}']:>7} {r['speedup']:>9}")
    result = {"args": vars(args), "rows": rows}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
