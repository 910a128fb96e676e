"""One training engine for every paradigm (DESIGN.md section 2).

A paradigm says how an utterance becomes a training sequence and what its loss is
(:mod:`arnar.paradigms.base`); everything else is here, in one loop::

    for each update:
        grad_accum micro-batches per rank  ->  loss_sum.backward() each
        all-reduce (loss_sum, n_targets, metrics)  ->  grads *= world_size / global n_targets
        clip, set lr (warm-up + cosine), AdamW step; log; evaluate; checkpoint

Why it is built this way:

* **One update, whatever the world size.** A paradigm returns its loss *summed* over targets
  with their count. The engine divides by the number of targets of the whole update (every
  micro-batch of every rank) and multiplies by ``world_size`` to undo DDP's averaging over ranks,
  so 2 ranks x 1 micro-batch, 1 rank x 2 micro-batches and 1 rank on the merged batch make the
  same update (tests/test_train.py checks it).
* **Per-example randomness is named, not drawn.** Mask ratios, spans, prompt lengths come from a
  ``torch.Generator`` seeded from (seed, epoch, global batch index, position in batch)
  (:func:`example_generator`), never from the global RNG, so they do not depend on the world
  size, the rank or a resume. Only dropout draws from the global torch RNG; its state (and
  numpy's, Python's) is in the checkpoint.
* **Exact resume.** A checkpoint holds the model, AdamW, the step, the epoch and the batch
  position in it, and every rank's RNG states; the bucket sampler is a pure function of
  (seed, epoch), so a resumed run replays exactly what the uninterrupted one would have done.
  Files are written to a temporary name and moved into place (``os.replace``), so a crash never
  leaves a truncated checkpoint.
* **Config** is Hydra's compose API over ``arnar/conf`` (no ``@hydra.main``, so no change of
  working directory and no output folders); the paper-scale values are a config, not a code path.

Entry points: :func:`train` (Python), :func:`main` (``arnar train --run-dir R --tokens T
--durations D --bpe B [--dev-tokens T2 --dev-durations D2] [-- overrides...]``, also under
``torchrun --nproc_per_node N -m arnar.train ...``), :func:`load_model` for synthesis.

Run folder::

    config.yaml            the resolved config
    checkpoints/last.pt    the latest checkpoint; step_<N>.pt the last keep_checkpoints of them
    final.pt               model weights + config + vocab + paradigm name, once max_steps is reached
    train_summary.json     steps, wall time, parameters, final train/dev loss, tokens/s
    log.jsonl              every logged scalar, one row per logging step
    tb/                    the same scalars for TensorBoard
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import random
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from omegaconf import DictConfig, OmegaConf

from arnar.atomic import atomic_path
from arnar.atomic import write_text as atomic_write_text
from arnar.codec.shards import read_token_manifest
from arnar.train.data import (BucketBatchSampler, TrainDataError, load_utterances, prompt_pairs, stable_seed,
                            vocab_for)
from arnar.paradigms import build_paradigm
from arnar.paradigms.base import Batch, Paradigm, Utterance, Vocab, collate

__all__ = ["TrainError", "compose_config", "learning_rate", "train", "load_model", "main",
           "optimizer_step", "build_optimizer", "make_batch", "example_generator"]

log = logging.getLogger("arnar.train")

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
CHECKPOINT_FORMAT = "arnar-train-checkpoint/1"
FINAL_FORMAT = "arnar-model/1"
RECENT_LOSSES = 50  # steps averaged into the summary's final_train_loss


class TrainError(RuntimeError):
    """A run that cannot start or continue as asked (the message says why and what to do)."""


# ----------------------------------------------------------------------------- config

def compose_config(overrides: Sequence[str] = ()) -> DictConfig:
    """The training config: ``arnar/conf/config.yaml`` with Hydra ``overrides`` such as
    ``["paradigm=nar", "model=small", "train=mini", "train.lr=3e-4"]``."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():  # a previous compose in this process
        GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="arnar_train"):
        return compose(config_name="config", overrides=list(overrides))


def learning_rate(step: int, *, lr: float, warmup_steps: int, max_steps: int, min_lr_ratio: float = 0.1) -> float:
    """Learning rate of update ``step`` (0-based): linear warm-up ``lr * (step + 1) / warmup_steps``
    over the first ``warmup_steps`` updates (so the first update is not taken at lr 0), then a
    cosine from ``lr`` down to ``min_lr_ratio * lr`` at ``max_steps``, held there after."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, max_steps - warmup_steps))
    floor = min_lr_ratio * lr
    return floor + 0.5 * (lr - floor) * (1.0 + math.cos(math.pi * progress))


# ----------------------------------------------------------------------------- distributed

@dataclass
class Distributed:
    """Where this process sits: torchrun's RANK / WORLD_SIZE / LOCAL_RANK, or a single process."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    owns_group: bool = False  # this engine started the process group and ends it

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(device: str = "auto") -> Distributed:
    """Read torchrun's environment and join the process group (gloo on CPU, nccl on CUDA)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available() if device == "auto" else device.startswith("cuda")
    if use_cuda and not torch.cuda.is_available():
        raise TrainError("train.device=cuda but no CUDA device is available")
    if use_cuda:
        torch.cuda.set_device(local_rank)
        where = torch.device("cuda", local_rank)
    else:
        where = torch.device("cpu")
    owns = False
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if use_cuda else "gloo")
        owns = True
    return Distributed(rank, world_size, local_rank, where, owns)


def all_reduce_sum(tensor: torch.Tensor, world_size: int) -> torch.Tensor:
    if world_size > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


# ----------------------------------------------------------------------------- batches

def example_generator(seed: int, epoch: int | str, batch_index: int, position: int) -> torch.Generator:
    """The random stream of one training example, named by where it sits in the data order."""
    return torch.Generator().manual_seed(stable_seed(seed, epoch, batch_index, position))


def make_batch(paradigm: Paradigm, utterances: Sequence[Utterance], indices: Sequence[int], *,
               seed: int, epoch: int | str, batch_index: int) -> Batch:
    """Collate the paradigm's training examples of ``utterances[indices]``."""
    return collate([
        paradigm.training_example(utterances[i], example_generator(seed, epoch, batch_index, pos))
        for pos, i in enumerate(indices)
    ])


def sequence_length(paradigm: Paradigm, utt: Utterance) -> int:
    """Length of the paradigm's training sequence for ``utt``, for the batch token budget: the
    paradigm's own ``sequence_length(utt)`` if it has one, else text + speech + 2 markers (the
    AR and NAR layouts)."""
    own = getattr(paradigm, "sequence_length", None)
    return int(own(utt)) if callable(own) else len(utt.text) + utt.num_frames + 2


# ----------------------------------------------------------------------------- one update

def build_optimizer(model: torch.nn.Module, *, lr: float, weight_decay: float,
                    betas: Sequence[float] = (0.9, 0.95), eps: float = 1e-8) -> torch.optim.AdamW:
    """AdamW; weight decay on the matrices of linear layers only (not on norms, biases or
    embedding tables, whose scale is not a capacity to be regularised)."""
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 and id(p) not in embeddings else no_decay).append(p)
    fused = bool(decay) and decay[0].is_cuda
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr, betas=tuple(betas), eps=eps, fused=fused or None,
    )


@dataclass
class StepResult:
    loss: float  # mean over the update's global targets
    n_targets: int  # global
    n_tokens: int  # global, sequence positions without padding
    grad_norm: float  # before clipping
    metrics: dict[str, float]  # each metric's global sum / n_targets
    skipped: bool = False  # no target in the whole update: nothing to learn from


def optimizer_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, micro_batches: Sequence[Batch], *,
                   lr: float, grad_clip: float, world_size: int = 1, device: torch.device | str = "cpu",
                   autocast_dtype: torch.dtype | None = None) -> StepResult:
    """One update from this rank's ``micro_batches`` (collective under DDP: every rank calls it
    with the same number of micro-batches). Gradients are left in ``.grad`` until the next call."""
    device = torch.device(device)
    optimizer.zero_grad(set_to_none=True)
    ddp = isinstance(model, torch.nn.parallel.DistributedDataParallel)
    totals: torch.Tensor | None = None
    metric_names: list[str] = []
    for i, batch in enumerate(micro_batches):
        batch = batch.to(device)
        # DDP all-reduces gradients in backward; only the update's last micro-batch needs to
        last = i == len(micro_batches) - 1
        with (model.no_sync() if ddp and not last else contextlib.nullcontext()):
            with (torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype else contextlib.nullcontext()):
                out = model(batch)
            out.loss_sum.float().backward()
        metric_names = sorted(out.metrics)
        stats = torch.stack([
            out.loss_sum.detach().double(), torch.as_tensor(out.n_targets, device=device).double(),
            batch.lengths.sum().double(),
            *(torch.as_tensor(out.metrics[k], device=device).detach().double() for k in metric_names),
        ])
        totals = stats if totals is None else totals + stats
    assert totals is not None, "optimizer_step needs at least one micro-batch"
    totals = all_reduce_sum(totals, world_size).tolist()
    loss_sum, n_targets, n_tokens, *metric_sums = totals
    params = [p for p in model.parameters() if p.grad is not None]
    if n_targets <= 0:
        optimizer.zero_grad(set_to_none=True)
        return StepResult(float("nan"), 0, int(n_tokens), 0.0, {}, skipped=True)
    # .grad holds sum-over-this-rank's-targets (DDP: averaged over ranks) -> mean over all targets
    scale = world_size / n_targets
    for p in params:
        p.grad.mul_(scale)
    grad_norm = torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip > 0 else float("inf"))
    for group in optimizer.param_groups:
        group["lr"] = lr
    optimizer.step()
    return StepResult(loss_sum / n_targets, int(n_targets), int(n_tokens), float(grad_norm),
                      {k: v / n_targets for k, v in zip(metric_names, metric_sums)})


@torch.no_grad()
def evaluate(paradigm: Paradigm, utterances: Sequence[Utterance], sampler: BucketBatchSampler, *, seed: int,
             device: torch.device, autocast_dtype: torch.dtype | None, world_size: int) -> dict[str, float]:
    """Loss (and metrics) per target over a dev set, each rank on its share of the batches. The
    examples' randomness is the same at every evaluation, so dev losses are comparable."""
    was_training = paradigm.training
    paradigm.eval()
    totals: torch.Tensor | None = None
    names: list[str] = []
    for g, indices in sampler.indexed():
        batch = make_batch(paradigm, utterances, indices, seed=seed, epoch="dev", batch_index=g).to(device)
        with (torch.autocast(device.type, dtype=autocast_dtype) if autocast_dtype else contextlib.nullcontext()):
            out = paradigm(batch)
        names = sorted(out.metrics)
        stats = torch.stack([out.loss_sum.double(), torch.as_tensor(out.n_targets, device=device).double(),
                             *(torch.as_tensor(out.metrics[k], device=device).double() for k in names)])
        totals = stats if totals is None else totals + stats
    paradigm.train(was_training)
    if world_size > 1:  # every rank must join, even one that had no dev batch
        names = sorted(set(sum(_gather_objects(names, world_size), [])))
        if totals is None or totals.numel() != 2 + len(names):
            totals = torch.zeros(2 + len(names), dtype=torch.float64, device=device)
    if totals is None:
        return {}
    loss_sum, n_targets, *metric_sums = all_reduce_sum(totals, world_size).tolist()
    if n_targets <= 0:
        return {}
    return {"loss": loss_sum / n_targets, **{k: v / n_targets for k, v in zip(names, metric_sums)}}


# ----------------------------------------------------------------------------- checkpoints

def _gather_objects(obj: Any, world_size: int) -> list[Any]:
    if world_size == 1:
        return [obj]
    out: list[Any] = [None] * world_size
    dist.all_gather_object(out, obj)
    return out


def rng_state() -> dict[str, Any]:
    return {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


def seed_rngs(seed: int) -> None:
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)


def atomic_torch_save(obj: Any, path: Path) -> None:
    with atomic_path(path) as tmp:  # the shared atomic writer (arnar.atomic)
        torch.save(obj, tmp)



def _keep_step_copy(last: Path, step: int, keep: int) -> None:
    """``step_<N>.pt`` beside ``last.pt`` (a hard link where the file system allows: no second
    write), and only the newest ``keep`` of them."""
    folder = last.parent
    target, tmp = folder / f"step_{step}.pt", folder / f".step_{step}.pt.tmp"
    if keep > 0:
        tmp.unlink(missing_ok=True)
        try:
            os.link(last, tmp)
        except OSError:
            shutil.copyfile(last, tmp)
        os.replace(tmp, target)
    steps = sorted((int(p.stem.split("_")[1]), p) for p in folder.glob("step_*.pt") if p.stem.split("_")[1].isdigit())
    for _, old in steps[: max(0, len(steps) - keep)]:
        old.unlink(missing_ok=True)


def checkpoint_path(run_dir: str | os.PathLike, checkpoint: str | int = "last") -> Path:
    """``last`` -> checkpoints/last.pt, ``final`` -> final.pt, ``N`` or ``step_N`` ->
    checkpoints/step_N.pt; an existing file path is taken as it is."""
    run_dir = Path(run_dir)
    name = str(checkpoint)
    if Path(name).is_file():
        return Path(name)
    if name == "final":
        return run_dir / "final.pt"
    if name == "best":  # the lowest dev loss of the run; a run without dev data has only final.pt
        return run_dir / "best.pt" if (run_dir / "best.pt").is_file() else run_dir / "final.pt"
    if name == "last":
        return run_dir / "checkpoints" / "last.pt"
    if name.isdigit():
        name = f"step_{name}"
    return run_dir / "checkpoints" / f"{name}.pt"


def load_model(run_dir: str | os.PathLike, checkpoint: str | int = "last", *,
               device: str | torch.device = "cpu") -> tuple[Paradigm, DictConfig]:
    """The trained paradigm of a run (in eval mode) and the run's config, from a training
    checkpoint or ``final.pt`` (see :func:`checkpoint_path` for the names)."""
    path = checkpoint_path(run_dir, checkpoint)
    if not path.is_file():
        there = sorted(str(p.relative_to(run_dir)) for p in Path(run_dir).glob("**/*.pt"))
        raise TrainError(f"{path}: no such checkpoint (found: {', '.join(there) or 'none'})")
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:
        raise TrainError(f"{path}: unreadable checkpoint ({err})") from err
    if not isinstance(state, dict) or state.get("format") not in (CHECKPOINT_FORMAT, FINAL_FORMAT):
        raise TrainError(f"{path}: not an arnar checkpoint")
    cfg = OmegaConf.create(state["config"])
    paradigm = build_paradigm(state["paradigm"], Vocab(**state["vocab"]), OmegaConf.to_container(cfg.model),
                              **_options(cfg))
    paradigm.load_state_dict(state["model"])
    return paradigm.to(device).eval(), cfg


def _options(cfg: DictConfig) -> dict[str, Any]:
    options = cfg.paradigm.get("options")
    return dict(OmegaConf.to_container(options, resolve=True)) if options else {}


def _autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    if precision not in ("auto", "bf16", "fp32"):
        raise TrainError(f"train.precision must be auto, bf16 or fp32, got {precision!r}")
    if device.type != "cuda":
        if precision == "bf16":
            log.warning("train.precision=bf16 asked for on %s: training in float32 (bf16 autocast is for CUDA)", device)
        return None
    return None if precision == "fp32" else torch.bfloat16


# ----------------------------------------------------------------------------- the loop

class _Logger:
    """log.jsonl + TensorBoard on rank 0; nothing elsewhere."""

    def __init__(self, run_dir: Path, active: bool, resume_step: int):
        self.active = active
        self.path = run_dir / "log.jsonl"
        self.tb = None
        if not active:
            return
        if self.path.exists():  # rows beyond the checkpoint were logged by a run that then died
            kept = [line for line in self.path.read_text().splitlines()
                    if (step := _row_step(line)) is not None and step <= resume_step]
            atomic_write_text(self.path, "".join(line + "\n" for line in kept))
        from torch.utils.tensorboard import SummaryWriter

        self.tb = SummaryWriter(str(run_dir / "tb"), purge_step=resume_step + 1 if resume_step else None)

    def write(self, step: int, scalars: dict[str, float]) -> None:
        if not self.active:
            return
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps({"step": step, **scalars}) + "\n")
        for key, value in scalars.items():
            self.tb.add_scalar(key, value, step)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()


def _row_step(line: str) -> int | None:
    """The step of a log.jsonl row; None for a blank line or the last line of a killed run, which
    the kill may have cut short (it is beyond the checkpoint anyway)."""
    try:
        return int(json.loads(line).get("step", 0))
    except (ValueError, AttributeError):
        return None


def _clear_previous_run(run_dir: Path) -> None:
    """A run starting from step 0 removes what an earlier run left in its folder: its step_N.pt
    files would otherwise be counted among the newest to keep, its logs would mix with ours."""
    for path in [*(run_dir / "checkpoints").glob("*.pt"), run_dir / "final.pt", run_dir / "best.pt",
                 run_dir / "train_summary.json", run_dir / "log.jsonl"]:
        path.unlink(missing_ok=True)
    shutil.rmtree(run_dir / "tb", ignore_errors=True)


def _check_vocab(utterances: Sequence[Utterance], vocab: Vocab, source: str) -> None:
    text_max = max(int(u.text.max()) for u in utterances)
    speech_max = max(int(u.speech.max()) for u in utterances)
    if text_max >= vocab.text_size:
        raise TrainDataError(f"{source}: BPE id {text_max} outside the BPE model's {vocab.text_size} ids "
                             "(durations made with another BPE model?)")
    if speech_max >= vocab.speech_size:
        raise TrainDataError(f"{source}: speech code {speech_max} outside the codebook size {vocab.speech_size}")


class IncompatibleCheckpoint(TrainError):
    """A run folder's checkpoint was made with another model, data, vocabulary or token set."""


# train settings that do not change what a run learns (a run resumed with other values is the same run)
BOOKKEEPING = {"progress", "log_every", "ckpt_every", "keep_checkpoints", "device", "find_unused_parameters"}


def _check_compatible(saved: dict[str, Any], cfg: DictConfig, vocab: Vocab, codec_hash: str | None, path: Path,
                      warn: bool = True, strict: bool = False) -> None:
    current = OmegaConf.to_container(cfg, resolve=True)
    for section in ("paradigm", "model", "data"):
        if saved["config"].get(section) != current.get(section):
            raise IncompatibleCheckpoint(f"{path}: checkpoint of a different {section} config ({saved['config'].get(section)} "
                             f"vs {current.get(section)}); use another run dir or --no-resume")
    if saved["vocab"] != vocab.to_dict():
        raise IncompatibleCheckpoint(f"{path}: checkpoint vocabulary {saved['vocab']} differs from the data's {vocab.to_dict()}")
    if saved.get("codec_hash") != codec_hash:
        raise IncompatibleCheckpoint(f"{path}: checkpoint trained on tokens of codec {saved.get('codec_hash')}, these tokens are "
                         f"from codec {codec_hash}; use another run dir or --no-resume")
    changed = sorted(k for k in set(saved["config"]["train"]) | set(current["train"])
                     if saved["config"]["train"].get(k) != current["train"].get(k))
    if strict and set(changed) - BOOKKEEPING:
        raise IncompatibleCheckpoint(f"{path}: checkpoint of other train settings "
                                     f"({', '.join(sorted(set(changed) - BOOKKEEPING))})")
    if changed and warn:
        log.warning("resuming %s with changed train settings: %s", path, ", ".join(changed))


@dataclass
class Progress:
    """Where a run stands (saved in every checkpoint besides weights, optimizer and RNGs)."""

    step: int = 0  # updates done
    epoch: int = 0
    batch_in_epoch: int = 0  # this rank's batches of the epoch already used
    wall_time_s: float = 0.0  # of earlier sessions of this run
    tokens_seen: int = 0
    recent_losses: list[float] = field(default_factory=list)
    dev_loss: float | None = None
    best_dev_loss: float | None = None  # the weights of the lowest dev loss are kept as best.pt
    best_step: int | None = None


def _restore(path: Path, paradigm: Paradigm, optimizer: torch.optim.Optimizer, cfg: DictConfig, vocab: Vocab,
             codec_hash: str | None, ctx: Distributed, strict: bool = False) -> Progress:
    """Load ``path`` into the model, the optimizer and this rank's RNGs; return the progress."""
    try:
        saved = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:
        raise TrainError(f"{path}: unreadable checkpoint ({err}); delete it or use --no-resume") from err
    if not isinstance(saved, dict) or saved.get("format") != CHECKPOINT_FORMAT:
        raise TrainError(f"{path}: not an arnar training checkpoint")
    _check_compatible(saved, cfg, vocab, codec_hash, path, warn=ctx.is_main, strict=strict)
    paradigm.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    done_global = int(saved["global_batches_in_epoch"])  # the position in the epoch, whatever the world size
    rngs = saved["rng"]
    if len(rngs) != ctx.world_size and ctx.is_main:
        log.warning("resuming a %d-rank run on %d ranks: the data order is kept, dropout masks are not",
                    len(rngs), ctx.world_size)
    if done_global % ctx.world_size and ctx.is_main:
        log.warning("epoch position %d is not a multiple of %d ranks: %d batches are skipped",
                    done_global, ctx.world_size, done_global % ctx.world_size)
    set_rng_state(rngs[ctx.rank % len(rngs)])
    state = Progress(step=int(saved["step"]), epoch=int(saved["epoch"]),
                     batch_in_epoch=done_global // ctx.world_size, wall_time_s=float(saved["wall_time_s"]),
                     tokens_seen=int(saved["tokens_seen"]), recent_losses=list(saved["recent_losses"]),
                     dev_loss=saved.get("dev_loss"), best_dev_loss=saved.get("best_dev_loss"),
                     best_step=saved.get("best_step"))
    if ctx.is_main:
        log.info("resumed %s at step %d (epoch %d, batch %d)", path, state.step, state.epoch, state.batch_in_epoch)
    return state


def _init_from(paradigm: Paradigm, source: Path, vocab: Vocab, ctx: Distributed) -> None:
    """Start from the final weights of another run (multi-stage recipes: SyncSpeech fine-tuning
    after masked pre-training, PALLE stage two after stage one). The state dict must match
    exactly; a paradigm that derives more from the loaded weights (e.g. copying one network into
    another) does so in its ``after_init_from()``."""
    path = checkpoint_path(source, "best")
    if not path.is_file():
        raise TrainError(f"train.init_from: {path} not found (train that run to the end first)")
    saved = torch.load(path, map_location="cpu", weights_only=False)
    if saved.get("vocab") != vocab.to_dict():
        raise TrainError(f"train.init_from: {path} was trained with vocabulary {saved.get('vocab')}, "
                         f"this run has {vocab.to_dict()}")
    try:
        paradigm.load_state_dict(saved["model"])
    except RuntimeError as err:
        raise TrainError(f"train.init_from: {path} does not fit this model: {str(err).splitlines()[0]}") from None
    hook = getattr(paradigm, "after_init_from", None)
    if callable(hook):
        hook()
    if ctx.is_main:
        log.info("initialised from %s (step %s of %s)", path, saved.get("step"), saved.get("paradigm"))


def train(
    cfg: DictConfig | dict,
    *,
    run_dir: str | os.PathLike,
    train_tokens: str | os.PathLike,
    train_durations: str | os.PathLike,
    bpe_model: str | os.PathLike,
    dev_tokens: str | os.PathLike | None = None,
    dev_durations: str | os.PathLike | None = None,
    resume: bool | str = True,
    stop_after_steps: int | None = None,
) -> dict[str, Any]:
    """Train ``cfg.paradigm`` on a token split + its BPE durations; returns the summary (also in
    ``run_dir/train_summary.json``). ``resume``: continue from ``run_dir/checkpoints/last.pt`` ("if-compatible": only a checkpoint of the same model, data and tokens, else start afresh) if
    there is one. ``stop_after_steps``: checkpoint and return once this many updates are done,
    as an interrupted run would (time-sliced jobs, tests); ``final.pt`` is written only when
    ``train.max_steps`` is reached."""
    cfg = cfg if isinstance(cfg, DictConfig) else OmegaConf.create(cfg)
    tc = cfg.train
    run_dir = Path(run_dir)
    ctx = init_distributed(str(tc.device))
    try:
        return _train(cfg, tc, ctx, run_dir, train_tokens, train_durations, bpe_model, dev_tokens, dev_durations,
                      resume, stop_after_steps)
    finally:
        if ctx.owns_group:
            dist.destroy_process_group()


def _train(cfg, tc, ctx: Distributed, run_dir: Path, train_tokens, train_durations, bpe_model, dev_tokens,
           dev_durations, resume: bool | str, stop_after_steps: int | None) -> dict[str, Any]:
    started = time.time()
    if (dev_tokens is None) != (dev_durations is None):
        raise TrainError("give both dev tokens and dev durations, or neither")
    if (tc.max_tokens is None) == (tc.batch_size is None):
        raise TrainError("set exactly one of train.max_tokens and train.batch_size (the other null)")
    seed = int(tc.seed)
    device = ctx.device
    amp = _autocast_dtype(str(tc.precision), device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    # data: every rank reads all of it (token sets are small next to the model) and shards batches
    data_opts = {"codebook": int(cfg.data.codebook), "max_frames": cfg.data.max_frames}
    utterances = load_utterances(train_tokens, train_durations, **data_opts, features=cfg.data.get("features"))
    pair_fraction = float(cfg.data.get("prompt_pairs") or 0.0)
    if pair_fraction:
        singles = len(utterances)
        utterances = prompt_pairs(utterances, pair_fraction, seed)
        log.info("data.prompt_pairs %.2f: %d of %d training utterances behind a same-speaker prompt",
                 pair_fraction, sum("+" in u.utt_id for u in utterances), singles)
    vocab = vocab_for(train_tokens, bpe_model)
    codec_hash = read_token_manifest(train_tokens)["codec"].get("config_hash")  # no resuming onto other tokens
    _check_vocab(utterances, vocab, str(train_durations))
    dev = (load_utterances(dev_tokens, dev_durations, **data_opts, features=cfg.data.get("dev_features"))
           if dev_tokens is not None else [])
    if dev:
        _check_vocab(dev, vocab, str(dev_durations))

    # model: the same initial weights on every rank (DDP also broadcasts rank 0's)
    seed_rngs(seed)
    paradigm = build_paradigm(str(cfg.paradigm.name), vocab, OmegaConf.to_container(cfg.model, resolve=True),
                              **_options(cfg)).to(device)
    n_params = sum(p.numel() for p in paradigm.parameters())
    optimizer = build_optimizer(paradigm, lr=float(tc.lr), weight_decay=float(tc.weight_decay),
                                betas=list(tc.betas), eps=float(tc.adam_eps))
    # dropout streams differ across ranks (the same masks on every rank would waste the batch)
    seed_rngs(stable_seed(seed, "rank", ctx.rank))

    sampler = BucketBatchSampler(
        [sequence_length(paradigm, u) for u in utterances],
        max_tokens=tc.max_tokens, batch_size=tc.batch_size, shuffle=True, seed=seed,
        rank=ctx.rank, world_size=ctx.world_size,
    )
    if len(sampler) == 0:
        raise TrainError(f"{len(sampler.global_batches(0))} batches per epoch cannot be shared by "
                         f"{ctx.world_size} ranks: lower train.max_tokens / train.batch_size")
    dev_sampler = None
    if dev:
        dev_sampler = BucketBatchSampler(
            [sequence_length(paradigm, u) for u in dev], max_tokens=tc.max_tokens, batch_size=tc.batch_size,
            shuffle=False, seed=seed, rank=ctx.rank, world_size=ctx.world_size, even=False,
        )

    last_path = run_dir / "checkpoints" / "last.pt"
    state = Progress()
    if resume and last_path.is_file():
        try:
            state = _restore(last_path, paradigm, optimizer, cfg, vocab, codec_hash, ctx,
                             strict=resume == "if-compatible")
        except IncompatibleCheckpoint as err:
            if resume != "if-compatible":
                raise
            # the DAG reruns a run when its config changed: that is a new run, not a resumption
            log.warning("%s: starting this run afresh", str(err).split("; use another run dir")[0])
            state = Progress()
        if not dev:
            state.dev_loss = None  # a dev loss of this run's dev set only
    if state.step == 0 and tc.get("init_from"):
        _init_from(paradigm, Path(str(tc.init_from)), vocab, ctx)

    if ctx.is_main:
        run_dir.mkdir(parents=True, exist_ok=True)
        if state.step == 0:
            _clear_previous_run(run_dir)
        atomic_write_text(run_dir / "config.yaml", OmegaConf.to_yaml(cfg, resolve=True))
        log.info("%s: %d parameters, %d training utterances (%d batches per rank per epoch), %d dev; "
                 "%d rank(s) on %s, %s", cfg.paradigm.name, n_params, len(utterances), len(sampler), len(dev),
                 ctx.world_size, device, "bf16 autocast" if amp else "float32")

    model: torch.nn.Module = paradigm
    if ctx.world_size > 1:
        model = torch.nn.parallel.DistributedDataParallel(
            paradigm, device_ids=[ctx.local_rank] if device.type == "cuda" else None,
            find_unused_parameters=bool(tc.find_unused_parameters),
        )
    paradigm.train()
    logger = _Logger(run_dir, ctx.is_main, state.step)

    def batch_stream(epoch: int, start: int):
        """(epoch, batches of it done after this one, global batch index, indices), forever."""
        while True:
            sampler.set_epoch(epoch)
            sampler.set_start(start)
            for done, (g, indices) in enumerate(sampler.indexed(), start + 1):
                yield epoch, done, g, indices
            epoch, start = epoch + 1, 0

    def run_dev() -> float | None:
        if dev_sampler is None:
            return None
        result = evaluate(paradigm, dev, dev_sampler, seed=seed, device=device, autocast_dtype=amp,
                          world_size=ctx.world_size)
        if result:
            logger.write(state.step, {f"dev/{k}": v for k, v in result.items()})
        return result.get("loss")

    def weights_record() -> dict[str, Any]:
        return {"format": FINAL_FORMAT, "paradigm": str(cfg.paradigm.name), "vocab": vocab.to_dict(),
                "config": OmegaConf.to_container(cfg, resolve=True), "model": paradigm.state_dict(),
                "step": state.step}

    def keep_if_best() -> None:
        """Small corpora overfit within a few epochs: keep the weights of the lowest dev loss
        (best.pt), which synthesis and later stages use (checkpoint "best")."""
        if state.dev_loss is None or (state.best_dev_loss is not None and state.dev_loss >= state.best_dev_loss):
            return
        state.best_dev_loss, state.best_step = state.dev_loss, state.step
        if ctx.is_main:
            atomic_torch_save(weights_record(), run_dir / "best.pt")

    def save_checkpoint() -> None:
        rngs = _gather_objects(rng_state(), ctx.world_size)  # collective: every rank
        if ctx.is_main:
            atomic_torch_save({
                "format": CHECKPOINT_FORMAT,
                "paradigm": str(cfg.paradigm.name),
                "vocab": vocab.to_dict(),
                "codec_hash": codec_hash,
                "config": OmegaConf.to_container(cfg, resolve=True),
                "model": paradigm.state_dict(),
                "optimizer": optimizer.state_dict(),
                "schedule": {"kind": "warmup_cosine", "lr": float(tc.lr), "warmup_steps": int(tc.warmup_steps),
                             "max_steps": int(tc.max_steps), "min_lr_ratio": float(tc.min_lr_ratio),
                             "next_lr": lr_at(state.step)},
                "step": state.step,
                "epoch": state.epoch,
                "global_batches_in_epoch": state.batch_in_epoch * ctx.world_size,
                "world_size": ctx.world_size,
                "rng": rngs,
                "wall_time_s": state.wall_time_s + time.time() - started,
                "tokens_seen": state.tokens_seen,
                "recent_losses": state.recent_losses,
                "dev_loss": state.dev_loss,
                "best_dev_loss": state.best_dev_loss,
                "best_step": state.best_step,
            }, last_path)
            _keep_step_copy(last_path, state.step, int(tc.keep_checkpoints))

    def lr_at(s: int) -> float:
        return learning_rate(s, lr=float(tc.lr), warmup_steps=int(tc.warmup_steps),
                             max_steps=int(tc.max_steps), min_lr_ratio=float(tc.min_lr_ratio))

    from tqdm import tqdm

    max_steps = int(tc.max_steps)
    end = max_steps if stop_after_steps is None else min(max_steps, int(stop_after_steps))
    bar = tqdm(total=max_steps, initial=state.step, disable=not (ctx.is_main and tc.progress), mininterval=1.0,
               dynamic_ncols=True, desc=f"train {cfg.paradigm.name}")
    stream = batch_stream(state.epoch, state.batch_in_epoch)
    window_tokens, window_start = 0, time.time()
    last_saved = last_eval = state.step
    log_every, eval_every, ckpt_every = max(1, int(tc.log_every)), int(tc.eval_every), int(tc.ckpt_every)
    try:
        while state.step < end:
            micro = []
            for _ in range(int(tc.grad_accum)):
                state.epoch, state.batch_in_epoch, g, indices = next(stream)
                micro.append(make_batch(paradigm, utterances, indices, seed=seed, epoch=state.epoch, batch_index=g))
            lr = lr_at(state.step)
            result = optimizer_step(model, optimizer, micro, lr=lr, grad_clip=float(tc.grad_clip),
                                    world_size=ctx.world_size, device=device, autocast_dtype=amp)
            state.step += 1
            state.tokens_seen += result.n_tokens
            window_tokens += result.n_tokens
            if result.skipped:
                log.warning("step %d: no target in the whole update, skipped", state.step)
            else:
                state.recent_losses = (state.recent_losses + [result.loss])[-RECENT_LOSSES:]
            if state.step % log_every == 0 or state.step == end:
                elapsed = max(time.time() - window_start, 1e-9)
                scalars = {"train/loss": result.loss, "train/lr": lr, "train/grad_norm": result.grad_norm,
                           "train/tokens_per_s": window_tokens / elapsed,
                           "train/epoch": state.epoch + state.batch_in_epoch / len(sampler),
                           **{f"train/{k}": v for k, v in result.metrics.items()}}
                logger.write(state.step, scalars)
                bar.set_postfix(loss=f"{result.loss:.3f}", tok_s=f"{window_tokens / elapsed:.0f}", refresh=False)
                window_tokens, window_start = 0, time.time()
            bar.update(1)
            if eval_every > 0 and state.step % eval_every == 0:
                state.dev_loss, last_eval = run_dev(), state.step
                keep_if_best()
            if ckpt_every > 0 and state.step % ckpt_every == 0:
                save_checkpoint()
                last_saved = state.step
        finished = state.step >= max_steps
        if finished and dev_sampler is not None and last_eval != state.step:
            state.dev_loss = run_dev()
            keep_if_best()
        if last_saved != state.step:
            save_checkpoint()
    finally:
        bar.close()
        logger.close()

    wall = state.wall_time_s + time.time() - started
    summary = {
        "paradigm": str(cfg.paradigm.name),
        "finished": finished,
        "steps": state.step,
        "max_steps": max_steps,
        "epochs": round(state.epoch + state.batch_in_epoch / len(sampler), 4),
        "wall_time_s": round(wall, 3),
        "parameters": n_params,
        "final_train_loss": float(np.mean(state.recent_losses)) if state.recent_losses else None,
        "final_dev_loss": state.dev_loss,
        "best_dev_loss": state.best_dev_loss,
        "best_step": state.best_step,
        "tokens_seen": state.tokens_seen,
        "tokens_per_s": round(state.tokens_seen / wall, 1) if wall > 0 else None,
        "world_size": ctx.world_size,
        "device": str(device),
        "precision": "bf16" if amp else "fp32",
        "train_utterances": len(utterances),
        "dev_utterances": len(dev),
        "vocab": vocab.to_dict(),
        "model": OmegaConf.to_container(cfg.model, resolve=True),
    }
    if ctx.is_main:
        if finished:
            atomic_torch_save(weights_record(), run_dir / "final.pt")
        atomic_write_text(run_dir / "train_summary.json", json.dumps(summary, indent=2) + "\n")
        log.info("trained %s: %d steps in %.0f s, train loss %.4f%s", summary["paradigm"], state.step, wall,
                 summary["final_train_loss"] or float("nan"),
                 f", dev loss {state.dev_loss:.4f}" if state.dev_loss is not None else "")
    return summary


# ----------------------------------------------------------------------------- command line

def build_parser(prog: str = "arnar train") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description="Train a paradigm (one engine for all); under torchrun for DDP.",
        epilog="Hydra overrides follow the options, e.g. `-- paradigm=nar model=small train=mini train.lr=3e-4`.",
    )
    parser.add_argument("--run-dir", required=True, help="run folder (checkpoints, logs, final.pt)")
    parser.add_argument("--tokens", required=True, help="token split folder of the training set (with manifest.json)")
    parser.add_argument("--durations", required=True, help="BPE durations JSONL of the training set")
    parser.add_argument("--bpe", required=True, help="sentencepiece BPE model (.model)")
    parser.add_argument("--dev-tokens", help="token split folder of the dev set")
    parser.add_argument("--dev-durations", help="BPE durations JSONL of the dev set")
    parser.add_argument("--no-resume", action="store_true", help="start afresh even if run-dir has a checkpoint")
    parser.add_argument("--fresh-if-older-than", nargs="*", default=[], metavar="FILE",
                        help="start afresh if the last checkpoint is older than any of these files (the weights of "
                             "the runs this one starts from or reads)")
    parser.add_argument("--resume-if-compatible", action="store_true",
                        help="resume only a checkpoint of the same model, data, tokens and train settings; otherwise "
                             "start afresh "
                             "(the DAG's setting: a rerun with another config is a new run)")
    parser.add_argument("--stop-after", type=int, help="checkpoint and stop after this many updates")
    parser.add_argument("--threads", type=int, help="CPU threads for torch (default: torch's choice)")
    parser.add_argument("--summary", help="also write the training summary JSON here")
    parser.add_argument("--print-config", action="store_true", help="print the composed config and exit")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides (key=value, group=option)")
    return parser


def _user_errors() -> tuple[type[BaseException], ...]:
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from arnar.codec.shards import TokenShardError
    from arnar.text.normalize import TokenizerError

    return (TrainError, TrainDataError, TokenShardError, TokenizerError, HydraException, OmegaConfBaseException,
            FileNotFoundError)


def main(argv: Sequence[str] | None = None) -> int:
    """``arnar train`` (and ``python -m arnar.train``): exit status 0, or 2 with a one-line error."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if (args.dev_tokens is None) != (args.dev_durations is None):
        parser.error("--dev-tokens and --dev-durations go together")
    if not logging.getLogger().handlers:  # under torchrun, rank 0 speaks for all
        logging.basicConfig(level=logging.INFO if os.environ.get("RANK", "0") == "0" else logging.WARNING,
                            format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        cfg = compose_config(args.overrides)
        if args.print_config:
            print(OmegaConf.to_yaml(cfg, resolve=True), end="")
            return 0
        resume: bool | str = False if args.no_resume else "if-compatible" if args.resume_if_compatible else True
        last = checkpoint_path(args.run_dir, "last")
        newer = [f for f in args.fresh_if_older_than if last.is_file() and Path(f).stat().st_mtime > last.stat().st_mtime]
        if resume and newer:
            # a run this one starts from (or reads) changed since its last checkpoint: resuming would
            # keep weights derived from the old one
            log.warning("%s is newer than %s: starting this run afresh", ", ".join(newer), last)
            resume = False
        summary = train(cfg, run_dir=args.run_dir, train_tokens=args.tokens, train_durations=args.durations,
                        bpe_model=args.bpe, dev_tokens=args.dev_tokens, dev_durations=args.dev_durations,
                        resume=resume, stop_after_steps=args.stop_after)
        if args.summary and os.environ.get("RANK", "0") == "0":
            atomic_write_text(Path(args.summary), json.dumps(summary, indent=2) + "\n")
    except _user_errors() as err:
        print(f"arnar train: error: {err}", file=sys.stderr)
        return 2
    return 0

