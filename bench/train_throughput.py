"""Training throughput of every paradigm at one backbone size, measured side by side.

    python bench/train_throughput.py [--model small] [--paradigms ar nar ...] [--repeats 3]
                                     [--frames 75] [--text 18] [--batch 24] [--threads 2]

Each paradigm trains on the same synthetic batch (random codes and BPE ids of the given
lengths, ``ends`` spread evenly so SyncSpeech has durations): one optimizer update (forward,
backward, AdamW step) per measurement, repetitions interleaved across paradigms so machine load
affects all alike. Reports the median seconds per update, training tokens per second (the
tokens of the paradigm's own sequences, which differ: SyncSpeech adds a duration placeholder
per text token, PALLE pads the text into the speech length) and utterances per second, and the
ratio of each to AR. Prints a table and writes JSON (default results/bench/train_throughput.json).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from omegaconf import OmegaConf

from arnar.paradigms import build_paradigm
from arnar.paradigms.base import Utterance, Vocab, collate
from arnar.train import build_optimizer, compose_config

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_speed import replace_section  # noqa: E402  (the shared results/bench.md writer)

DEFAULT_PARADIGMS = ["ar", "nar", "syncspeech", "palle_stage1", "delta", "cod"]


def synthetic_utterances(n: int, frames: int, text: int, vocab: Vocab, seed: int) -> list[Utterance]:
    g = torch.Generator().manual_seed(seed)
    ends = torch.linspace(frames / text, frames, text).round().long()
    ends[-1] = frames
    utts = []
    for i in range(n):
        features = {"phonemes": torch.randint(1, 60, (text * 3,), generator=g), "speaker": torch.randn(256, generator=g)}
        utts.append(Utterance(f"spk{i % 4:02d}_{i:04d}", f"spk{i % 4:02d}",
                              torch.randint(0, vocab.text_size, (text,), generator=g),
                              torch.randint(0, vocab.speech_size, (frames,), generator=g), ends.clone(), features))
    return utts


def build(config_name: str, model: str, vocab: Vocab):
    cfg = compose_config([f"paradigm={config_name}", f"model={model}"])
    options = OmegaConf.to_container(cfg.paradigm.options, resolve=True) or {}
    options.pop("ar_run", None)  # DELTA: speed does not depend on which AR weights it starts from
    return build_paradigm(str(cfg.paradigm.name), vocab, OmegaConf.to_container(cfg.model, resolve=True), **options)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small")
    parser.add_argument("--paradigms", nargs="+", default=DEFAULT_PARADIGMS)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--frames", type=int, default=75, help="speech frames per utterance (25 Hz: 3 s)")
    parser.add_argument("--text", type=int, default=18, help="BPE tokens per utterance")
    parser.add_argument("--batch", type=int, default=24)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="results/bench/train_throughput.json")
    parser.add_argument("--markdown", default="results/bench.md", help="Markdown file whose section gets the table")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    vocab = Vocab(text_size=1000, speech_size=512)
    utts = synthetic_utterances(args.batch, args.frames, args.text, vocab, seed=0)

    setups = {}
    for name in args.paradigms:
        try:
            model = build(name, args.model, vocab).train()
        except Exception as err:  # noqa: BLE001 - a paradigm that cannot be built here is reported, not fatal
            print(f"skip {name}: {err}", file=sys.stderr)
            continue
        g = torch.Generator().manual_seed(0)
        batch = collate([model.training_example(u, g) for u in utts])
        optimizer = build_optimizer(model, lr=1e-4, weight_decay=0.0, betas=[0.9, 0.95], eps=1e-8)
        setups[name] = (model, batch, optimizer)

    def update(model, batch, optimizer) -> float:
        start = time.perf_counter()
        out = model(batch)
        (out.loss_sum / out.n_targets.clamp_min(1)).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - start

    for setup in setups.values():  # warm-up (allocator, first-call costs)
        update(*setup)
    times: dict[str, list[float]] = {name: [] for name in setups}
    for _ in range(args.repeats):
        for name, setup in setups.items():
            times[name].append(update(*setup))

    rows = {}
    for name, (model, batch, _) in setups.items():
        seconds = statistics.median(times[name])
        tokens = int(batch.lengths.sum())
        rows[name] = {"seconds_per_update": seconds, "tokens_per_update": tokens, "tokens_per_s": tokens / seconds,
                      "utterances_per_s": len(utts) / seconds,
                      "parameters": sum(p.numel() for p in model.parameters()),
                      "trainable_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad)}
    base = rows.get("ar")
    print(f"model={args.model}, batch {args.batch} x ({args.frames} frames + {args.text} BPE), "
          f"{args.threads} threads, median of {args.repeats}")
    print(f"{'paradigm':14s} {'params':>8s} {'trainable':>9s} {'s/update':>9s} {'tokens/s':>9s} {'utt/s':>7s} {'utt/s vs AR':>11s}")
    for name, r in rows.items():
        ratio = r["utterances_per_s"] / base["utterances_per_s"] if base else float("nan")
        r["utterances_per_s_vs_ar"] = ratio
        print(f"{name:14s} {r['parameters'] / 1e6:7.2f}M {r['trainable_parameters'] / 1e6:8.2f}M "
              f"{r['seconds_per_update']:9.3f} {r['tokens_per_s']:9.0f} {r['utterances_per_s']:7.1f} {ratio:11.2f}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"config": vars(args), "results": rows}, indent=2) + "\n")
    if args.markdown:
        lines = [f"## Training throughput: model {args.model}, CPU, {args.threads} threads (bench/train_throughput.py)", "",
                 f"Batch {args.batch} x ({args.frames} frames + {args.text} BPE), one AdamW update per measurement, "
                 f"median of {args.repeats} interleaved repeats.", "",
                 "| paradigm | parameters | trainable | s / update | tokens / s | utterances / s | utterances / s vs AR |",
                 "|---|---:|---:|---:|---:|---:|---:|"]
        for name, r in rows.items():
            lines.append(f"| {name} | {r['parameters'] / 1e6:.2f}M | {r['trainable_parameters'] / 1e6:.2f}M | "
                         f"{r['seconds_per_update']:.3f} | {r['tokens_per_s']:.0f} | {r['utterances_per_s']:.1f} | "
                         f"{r['utterances_per_s_vs_ar']:.2f} |")
        replace_section(Path(args.markdown), "train_throughput", "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
