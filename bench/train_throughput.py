"""Training throughput of every paradigm at one backbone size, measured side by side, and how far
it is from what the machine gives a dense matrix product of the same shapes.

    python bench/train_throughput.py [--model small] [--paradigms ar nar ...] [--repeats 3]
                                     [--frames 75] [--text 18] [--batch 24] [--threads 2] [--device cpu|cuda]

Each paradigm trains on the same synthetic batch (random codes and BPE ids of the given
lengths, ``ends`` spread evenly so SyncSpeech has durations): one optimizer update per
measurement, made by the training engine's own ``arnar.train.optimizer_step`` (forward under the
engine's precision: bf16 autocast on CUDA, float32 on a CPU; backward; gradient clipping; AdamW),
repetitions interleaved across paradigms so machine load affects all alike. Reports the median
seconds per update, training tokens per second (the tokens of the paradigm's own sequences, which
differ: SyncSpeech adds a duration placeholder per text token, PALLE pads the text into the speech
length), utterances per second and the ratio of each to AR; on CUDA also the peak memory of one
update (the paradigm's own weights and optimizer state plus the update's peak above them).

**Against the machine's own limit.** In the same run, interleaved with the updates, a dense
matrix product of the training step's shapes, ``[tokens, dim] x [dim, ffn_dim]`` (tokens: the
nominal tokens of one update, ``batch x (frames + text + 2)``) in the training dtype, gives what
this machine reaches on the step's largest matmuls. Each paradigm's training FLOP rate is
reported as a share of it, with FLOPs per update by the standard estimate (PaLM, Appendix B)

    6 N T + 12 L d sum_i S_i^2

``N``: the parameters on the loss's path without embedding tables (those a backward reaches when
every weight requires a gradient), ``T``: tokens of the update (sum of ``S_i``, the sequence
lengths without padding), ``L``, ``d``: the backbone's layers and width (attention score and
value products, forward and backward, over the full ``S x S``, causal or not). The FLOPs that
torch's ``FlopCounterMode`` counts in one forward and backward are reported beside it as a check,
with the share they give: below the estimate where frozen weights get no weight gradient (DELTA's
backbone), where a head scores only some positions (SyncSpeech) or where parameters act once per
utterance rather than per token (CoD's speaker adaLN and duration predictor); above it where
padding adds work. (Torch counts attention only for kernels it has a formula for: on a CPU with a
small head size the fused attention kernel goes uncounted.)

Prints a table, writes JSON (default results/bench/train_throughput.json) and the table as the
section ``<!-- train_throughput -->`` of results/bench.md. Needs torch, numpy and PyYAML only: the
configs are read as plain YAML (bench/decode_speed.py's ``load_config``), and where
``arnar.train`` cannot be imported (no OmegaConf) a copy of its update (checked equal in
tests/test_bench_train.py) is used.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from arnar.paradigms import build_paradigm
from arnar.paradigms.base import Batch, Paradigm, Utterance, Vocab, collate

sys.path.insert(0, str(Path(__file__).resolve().parent))
from decode_speed import (environment, load_config, replace_section, resolved_options, sized_model,  # noqa: E402
                          synchronizer, vocab_for)

DEFAULT_PARADIGMS = ["ar", "nar", "syncspeech", "palle_stage1", "delta", "cod"]
# the synthetic batch draws ids every paradigm's vocabulary holds (decode_speed.vocab_for: the
# smallest is CoD's 256 codes at the mini sizes), so every paradigm trains on the same utterances
TEXT_VOCAB, SPEECH_VOCAB = 1000, 256
GIB = 2 ** 30


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


def with_acoustic_stack(utts: list[Utterance], model: Paradigm, seed: int) -> list[Utterance]:
    """``utts`` with random codes of the stack's other codebooks where the model generates more
    than one (CoD, option ``codebooks``), below its codebook size; the same list otherwise."""
    stack = int(getattr(model, "codebooks", 1))
    if stack == 1:
        return utts
    g = torch.Generator().manual_seed(seed)
    return [dataclasses.replace(u, acoustic=torch.randint(model.vocab.speech_size, (stack - 1, u.num_frames), generator=g))
            for u in utts]


def build(config_name: str, model: str) -> tuple[Paradigm, dict[str, Any]]:
    """The paradigm of conf/paradigm/<config_name>.yaml at the model config it has at size
    ``model`` (decode_speed.sized_model: paper_cod, paper_delta at paper scale) with that size's
    vocabulary, random weights the same on every run; and the model config. Plain YAML, no Hydra."""
    name, model_cfg, options = load_config(config_name, model)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return build_paradigm(name, vocab_for(model, name), model_cfg, **resolved_options(options, model)), model_cfg


# ----------------------------------------------------------------------------- one update

def _build_optimizer(model: torch.nn.Module, *, lr: float, weight_decay: float,
                     betas: Sequence[float] = (0.9, 0.95), eps: float = 1e-8) -> torch.optim.AdamW:
    """arnar.train.build_optimizer, for an environment without OmegaConf."""
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 and id(p) not in embeddings else no_decay).append(p)
    fused = bool(decay) and decay[0].is_cuda
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
                             lr=lr, betas=tuple(betas), eps=eps, fused=fused or None)


def _optimizer_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, micro_batches: Sequence[Batch], *,
                    lr: float, grad_clip: float, device: torch.device | str = "cpu",
                    autocast_dtype: torch.dtype | None = None) -> None:
    """arnar.train.optimizer_step for one process, for an environment without OmegaConf: the same
    work (forward, backward, the loss statistics fetched to the host, gradient scaling, clipping,
    AdamW step)."""
    device = torch.device(device)
    optimizer.zero_grad(set_to_none=True)
    totals = None
    for batch in micro_batches:
        batch = batch.to(device)
        with torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype else contextlib.nullcontext():
            out = model(batch)
        out.loss_sum.float().backward()
        metric_names = sorted(out.metrics)
        stats = torch.stack([out.loss_sum.detach().double(), torch.as_tensor(out.n_targets, device=device).double(),
                             batch.lengths.sum().double(),
                             *(torch.as_tensor(out.metrics[k], device=device).detach().double() for k in metric_names)])
        totals = stats if totals is None else totals + stats
    _, n_targets, *_ = totals.tolist()
    if n_targets <= 0:
        optimizer.zero_grad(set_to_none=True)
        return
    params = [p for p in model.parameters() if p.grad is not None]
    for p in params:
        p.grad.mul_(1.0 / n_targets)
    torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip > 0 else float("inf"))
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.step()


def engine() -> tuple[Callable, Callable, str]:
    """``(build_optimizer, optimizer_step, where from)``: the training engine's own, or the copies
    above where ``arnar.train`` cannot be imported."""
    try:
        from arnar.train import build_optimizer, optimizer_step
    except ImportError:
        return _build_optimizer, _optimizer_step, "bench copy of arnar.train.optimizer_step (no OmegaConf)"
    return build_optimizer, optimizer_step, "arnar.train.optimizer_step"


def training_autocast(device: torch.device) -> torch.dtype | None:
    """The engine's ``train.precision=auto``: bf16 autocast on CUDA, float32 elsewhere."""
    return torch.bfloat16 if device.type == "cuda" else None


# ----------------------------------------------------------------------------- FLOPs

def parameters_on_loss_path(model: Paradigm, batch: Batch, amp: torch.dtype | None) -> int:
    """Parameters a backward reaches when every weight requires a gradient (the networks the
    training forward runs), embedding tables left out (a lookup is no matmul): ``N`` of 6 N T."""
    device = next(model.parameters()).device
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    saved = {p: p.requires_grad for p in model.parameters()}
    try:
        for p in saved:
            p.requires_grad_(True)
            p.grad = None
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            with torch.autocast(device.type, dtype=amp) if amp else contextlib.nullcontext():
                out = model(batch)
            out.loss_sum.float().backward()
        return sum(p.numel() for p in saved if p.grad is not None and id(p) not in embeddings)
    finally:
        for p, flag in saved.items():
            p.grad = None
            p.requires_grad_(flag)


def flop_estimate(n_params: int, lengths: torch.Tensor, n_layers: int, dim: int) -> dict[str, float]:
    """FLOPs of one update, forward and backward: ``6 N T`` (dense) + ``12 L d sum S_i^2`` (attention)."""
    lengths = lengths.double()
    dense = 6.0 * n_params * float(lengths.sum())
    attention = 12.0 * n_layers * dim * float((lengths ** 2).sum())
    return {"dense": dense, "attention": attention, "total": dense + attention}


def counted_flops(model: Paradigm, batch: Batch, amp: torch.dtype | None) -> float:
    """FLOPs torch's FlopCounterMode counts in one forward and backward (matmuls, convolutions,
    attention), with the trainable weights as they are (frozen ones get no weight gradient)."""
    from torch.utils.flop_counter import FlopCounterMode

    device = next(model.parameters()).device
    counter = FlopCounterMode(display=False)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), counter:
        with torch.autocast(device.type, dtype=amp) if amp else contextlib.nullcontext():
            out = model(batch)
        out.loss_sum.float().backward()
    for p in model.parameters():
        p.grad = None
    return float(counter.get_total_flops())


def matmul_seconds(a: torch.Tensor, b: torch.Tensor, sync: Callable[[], None], min_seconds: float = 0.2) -> float:
    """Seconds of one ``a @ b``: the median over batches of calls lasting at least ``min_seconds``."""
    for _ in range(3):  # warm-up: kernel selection, allocator
        a @ b
    sync()
    calls, seconds = 1, 0.0
    while True:  # as many calls as fill min_seconds
        started = time.perf_counter()
        for _ in range(calls):
            a @ b
        sync()
        seconds = time.perf_counter() - started
        if seconds >= min_seconds or calls >= 2 ** 16:
            return seconds / calls
        calls = max(calls * 2, int(calls * min_seconds / max(seconds, 1e-9)) + 1)


# ----------------------------------------------------------------------------- the benchmark

def benchmark(model_size: str = "small", paradigms: list[str] | None = None, repeats: int = 3, frames: int = 75,
              text: int = 18, batch_size: int = 24, device: str = "cpu", seed: int = 0, matmul_min_seconds: float = 0.2,
              log: Callable[[str], None] = lambda line: None) -> dict[str, Any]:
    """Training throughput and its FLOP rate against the dense matmul, every paradigm in one run:
    ``{"config", "environment", "matmul", "results"}`` (``results``: paradigm -> row)."""
    device_ = torch.device(device)
    sync = synchronizer(device_)
    cuda = device_.type == "cuda"
    amp = training_autocast(device_)
    build_optimizer, optimizer_step, engine_name = engine()
    load_before = os.getloadavg()[0]
    utts = synthetic_utterances(batch_size, frames, text, Vocab(TEXT_VOCAB, SPEECH_VOCAB), seed=seed)

    setups, skipped, model_cfgs = {}, {}, {}
    for name in paradigms or DEFAULT_PARADIGMS:
        try:
            model, model_cfgs[name] = build(name, model_size)
        except Exception as err:  # noqa: BLE001 - a paradigm that cannot be built here is reported, not fatal
            skipped[name] = f"{type(err).__name__}: {err}"
            log(f"skip {name}: {err}")
            continue
        model = model.to(device_).train()
        g = torch.Generator().manual_seed(seed)
        batch = collate([model.training_example(u, g) for u in with_acoustic_stack(utts, model, seed)]).to(device_)
        optimizer = build_optimizer(model, lr=1e-4, weight_decay=0.0, betas=[0.9, 0.95], eps=1e-8)
        setups[name] = (model, batch, optimizer)
    if not setups:
        raise RuntimeError(f"no paradigm could be built: {skipped}")

    def update(model: Paradigm, batch: Batch, optimizer: torch.optim.Optimizer) -> tuple[float, int | None]:
        """Seconds of one update and, on CUDA, its peak memory above what was allocated before it."""
        if cuda:
            torch.cuda.reset_peak_memory_stats(device_)
            before = torch.cuda.memory_allocated(device_)
        sync()
        started = time.perf_counter()
        optimizer_step(model, optimizer, [batch], lr=1e-4, grad_clip=1.0, device=device_, autocast_dtype=amp)
        sync()
        seconds = time.perf_counter() - started
        optimizer.zero_grad(set_to_none=True)  # gradients do not stay resident between measurements
        return seconds, (torch.cuda.max_memory_allocated(device_) - before) if cuda else None

    # the dense matmul of the step's shapes, [nominal tokens of one update, dim] x [dim, ffn], for
    # each backbone shape the paradigms have (one, unless a paradigm has a size of its own)
    dtype = amp or torch.float32
    tokens_nominal = batch_size * (frames + text + 2)
    shapes = {name: (tokens_nominal, int(model_cfgs[name]["dim"]), int(model_cfgs[name]["ffn_dim"])) for name in setups}
    operands = {shape: (torch.randn(shape[0], shape[1], device=device_, dtype=dtype),
                        torch.randn(shape[1], shape[2], device=device_, dtype=dtype))
                for shape in dict.fromkeys(shapes.values())}

    for name, setup in setups.items():  # warm-up (allocator, first-call costs, optimizer state)
        update(*setup)
        log(f"warm-up {name}")
    times: dict[str, list[float]] = {name: [] for name in setups}
    peaks: dict[str, list[int]] = {name: [] for name in setups}
    matmul_times: dict[tuple[int, int, int], list[float]] = {shape: [] for shape in operands}
    for repeat in range(repeats):
        for name, setup in setups.items():
            seconds, peak = update(*setup)
            times[name].append(seconds)
            if peak is not None:
                peaks[name].append(peak)
            log(f"repeat {repeat + 1}/{repeats} {name}: {seconds:.3f} s")
        for shape, (a, b) in operands.items():
            matmul_times[shape].append(matmul_seconds(a, b, sync, matmul_min_seconds))
    matmuls = {}
    for (m, k, n), measured in matmul_times.items():
        seconds = statistics.median(measured)
        matmuls[m, k, n] = {"shape": [m, k, n], "dtype": str(dtype).removeprefix("torch."), "seconds": seconds,
                            "flops": 2.0 * m * k * n, "flops_per_s": 2.0 * m * k * n / seconds}
    del operands

    rows = {}
    for name, (model, batch, optimizer) in setups.items():
        seconds = statistics.median(times[name])
        tokens = int(batch.lengths.sum())
        cfg, matmul = model_cfgs[name], matmuls[shapes[name]]
        n_on_path = parameters_on_loss_path(model, batch, amp)
        estimate = flop_estimate(n_on_path, batch.lengths.cpu(), int(cfg["n_layers"]), int(cfg["dim"]))
        counted = counted_flops(model, batch, amp)
        resident = sum(p.numel() * p.element_size() for p in model.parameters()) + sum(
            t.numel() * t.element_size() for state in optimizer.state.values() for t in state.values()
            if torch.is_tensor(t))
        rows[name] = {
            "seconds_per_update": seconds, "tokens_per_update": tokens, "tokens_per_s": tokens / seconds,
            "padded_tokens_per_update": int(batch.input_ids.numel()),
            "utterances_per_s": len(utts) / seconds,
            "parameters": sum(p.numel() for p in model.parameters()),
            "trainable_parameters": sum(p.numel() for p in model.parameters() if p.requires_grad),
            "parameters_on_loss_path": n_on_path,
            "flops_estimate": estimate["total"], "flops_estimate_dense": estimate["dense"],
            "flops_estimate_attention": estimate["attention"], "flops_counted": counted,
            "flops_per_s": estimate["total"] / seconds, "counted_flops_per_s": counted / seconds,
            "share_of_matmul": estimate["total"] / seconds / matmul["flops_per_s"],
            "counted_share_of_matmul": counted / seconds / matmul["flops_per_s"],
            "matmul": matmul["shape"], "model_file": sized_model(model_size, model.name),
            "resident_bytes": resident,
            "peak_bytes": resident + max(peaks[name]) if peaks[name] else None,
        }
    base = rows.get("ar")
    for r in rows.values():
        r["utterances_per_s_vs_ar"] = r["utterances_per_s"] / base["utterances_per_s"] if base else None
    first = next(iter(setups))
    config = {"model": model_size, "paradigms": list(setups), "skipped": skipped, "repeats": repeats, "frames": frames,
              "text": text, "batch": batch_size, "device": device, "seed": seed, "engine": engine_name,
              "precision": "bf16 autocast" if amp else "float32", "model_config": model_cfgs[first],
              "model_configs": model_cfgs, "load_average": [load_before, os.getloadavg()[0]], "cpus": os.cpu_count()}
    return {"config": config, "environment": environment(device_), "matmul": matmuls[shapes[first]],
            "matmuls": list(matmuls.values()), "results": rows}


# ----------------------------------------------------------------------------- output

def _tflops(flops: float) -> str:
    return f"{flops / 1e12:.3g}"


def _gib(nbytes: int | None) -> str:
    return "n/a" if nbytes is None else f"{nbytes / GIB:.2f}"


def _vs_ar(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


HEADER = ["paradigm", "parameters", "trainable", "on loss path", "s / update", "tokens / s", "utterances / s",
          "utt/s vs AR", "peak GiB", "TFLOP / update (est.)", "counted / est.", "TFLOP/s (est.)", "share of matmul",
          "share (counted)"]


def table_rows(result: dict[str, Any]) -> list[list[str]]:
    out = []
    for name, r in result["results"].items():
        out.append([name, f"{r['parameters'] / 1e6:.2f}M", f"{r['trainable_parameters'] / 1e6:.2f}M",
                    f"{r['parameters_on_loss_path'] / 1e6:.2f}M", f"{r['seconds_per_update']:.3f}",
                    f"{r['tokens_per_s']:.0f}", f"{r['utterances_per_s']:.1f}", _vs_ar(r["utterances_per_s_vs_ar"]),
                    _gib(r["peak_bytes"]), _tflops(r["flops_estimate"]),
                    f"{r['flops_counted'] / r['flops_estimate']:.2f}", _tflops(r["flops_per_s"]),
                    f"{r['share_of_matmul']:.1%}", f"{r['counted_share_of_matmul']:.1%}"])
    return out


def describe(result: dict[str, Any]) -> str:
    c, env = result["config"], result["environment"]
    where = env.get("gpu", f"CPU, {env['threads']} thread{'s' if env['threads'] != 1 else ''}")
    m = c["model_config"]
    own = [f"{name}: {r['model_file']}" for name, r in result["results"].items() if r["model_file"] != c["model"]]
    sizes = f"; {', '.join(own)}" if own else ""
    matmuls = "; ".join(f"[{mm['shape'][0]}, {mm['shape'][1]}] x [{mm['shape'][1]}, {mm['shape'][2]}] {mm['dtype']}: "
                        f"{_tflops(mm['flops_per_s'])} TFLOP/s ({mm['seconds'] * 1e3:.3g} ms)"
                        for mm in result.get("matmuls", [result["matmul"]]))
    if "gpu" not in env and "load_average" in c:  # a shared machine: what else ran
        where += f" (load average {c['load_average'][0]:.1f} -> {c['load_average'][1]:.1f} on {c['cpus']} CPUs)"
    return (f"model={c['model']} (dim {m['dim']}, {m['n_layers']} layers{sizes}), {where}, "
            f"{c['precision']}; batch {c['batch']} x ({c['frames']} frames + {c['text']} BPE), one update "
            f"({c['engine']}) per measurement, median of {c['repeats']} interleaved repeats; dense matmul "
            f"{matmuls}; torch {env['torch']}")


FOOTNOTE = ("TFLOP / update (est.): 6 N T + 12 L d sum S_i^2 (PaLM, Appendix B), N the parameters on the loss's path "
            "without embedding tables, T the update's tokens without padding, S_i the sequence lengths, L and d the "
            "backbone's layers and width. Counted / est.: torch FlopCounterMode over one forward and backward against "
            "that estimate (< 1 where frozen weights get no weight gradient, a head scores only some positions or "
            "parameters act once per utterance, e.g. CoD's duration predictor; > 1 where padding adds work; attention "
            "is uncounted where torch has no formula for the kernel, e.g. CPU flash attention). Share of matmul: the "
            "training FLOP rate (estimated; counted) over the dense matmul's rate in the same run. Peak: the "
            "paradigm's weights and AdamW state plus one update's peak above what was allocated before it (CUDA only).")


def text_table(result: dict[str, Any]) -> str:
    rows = [HEADER] + table_rows(result)
    widths = [max(len(row[i]) for row in rows) for i in range(len(HEADER))]
    lines = ["  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths)))
             for row in rows]
    skipped = [f"skipped {name}: {why}" for name, why in result["config"]["skipped"].items()]
    return "\n".join([describe(result), *lines, *skipped])


def markdown_table(result: dict[str, Any]) -> list[str]:
    return ["| " + " | ".join(HEADER) + " |", "|" + "|".join(["---"] + ["---:"] * (len(HEADER) - 1)) + "|",
            *("| " + " | ".join(row) + " |" for row in table_rows(result))]


def markdown_section(result: dict[str, Any], command: str) -> str:
    env = result["environment"]
    where = env.get("gpu", f"CPU, {env['threads']} thread{'s' if env['threads'] != 1 else ''}")
    return "\n".join([f"## Training throughput: model {result['config']['model']}, {where} (bench/train_throughput.py)",
                      "", describe(result) + ".", "", f"`{command}`", "", *markdown_table(result), "", FOOTNOTE])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="small")
    parser.add_argument("--paradigms", nargs="+", default=DEFAULT_PARADIGMS)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--frames", type=int, default=75, help="speech frames per utterance (25 Hz: 3 s)")
    parser.add_argument("--text", type=int, default=18, help="BPE tokens per utterance")
    parser.add_argument("--batch", type=int, default=24)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", default="results/bench/train_throughput.json")
    parser.add_argument("--markdown", default="results/bench.md", help="Markdown file whose section gets the table; '' to skip")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    log = (lambda line: None) if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    result = benchmark(args.model, args.paradigms, args.repeats, args.frames, args.text, args.batch, args.device, log=log)
    result["config"]["threads"] = args.threads
    print(text_table(result))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    if args.markdown:
        command = "python bench/train_throughput.py " + " ".join(argv if argv is not None else sys.argv[1:])
        replace_section(Path(args.markdown), "train_throughput", markdown_section(result, command.strip()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
