"""Checkpoints and exact resume: what a checkpoint holds, where it is written (``last.pt``,
``step_<N>.pt``, ``best.pt``, ``final.pt``), and how a run resumes from one or starts from another
run's weights.

Every file is written to a temporary name and moved into place, so a crash never leaves a
truncated checkpoint. A checkpoint holds the model, AdamW, the step, the epoch and the batch
position in it, and every rank's RNG states: a resumed run replays exactly what the
uninterrupted one would have done.
"""

from __future__ import annotations

import copy
import logging
import os
import random
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from arnar.atomic import atomic_path
from arnar.paradigms import build_paradigm
from arnar.paradigms.base import Paradigm, Vocab
from arnar.train.config import TrainError, _options
from arnar.train.distributed import Distributed, _gather_objects

log = logging.getLogger("arnar.train")  # one logger for the whole engine

CHECKPOINT_FORMAT = "arnar-train-checkpoint/1"


FINAL_FORMAT = "arnar-model/1"



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


class IncompatibleCheckpoint(TrainError):
    """A run folder's checkpoint was made with another model, data, vocabulary or token set."""


# train settings that do not change what a run learns (a run resumed with other values is the same run)
BOOKKEEPING = {"progress", "log_every", "ckpt_every", "keep_checkpoints", "device", "find_unused_parameters"}


# config keys added after runs were trained, with the value that reproduces those runs: a
# checkpoint whose config lacks one that the current config has was trained as this value trains
# (a new option does not make every trained run incompatible)
ADDED_KEYS = {("data", "prompt_pairs"): 0.0, ("paradigm", "options", "input_noise"): 0.0,
              ("paradigm", "options", "span_scoring"): "left_most", ("paradigm", "options", "codebooks"): 1,
              ("paradigm", "options", "layout"): "fused", ("paradigm", "options", "readout"): "own"}


def _with_added_keys(saved: dict[str, Any], current: dict[str, Any], section: str) -> Any:
    """``saved[section]`` with the :data:`ADDED_KEYS` it predates filled in."""
    value = copy.deepcopy(saved.get(section))
    for (top, *path), default in ADDED_KEYS.items():
        node, now = value, current.get(top)
        for key in path[:-1]:
            node = node.get(key) if isinstance(node, dict) else None
            now = now.get(key) if isinstance(now, dict) else None
        if top == section and isinstance(node, dict) and isinstance(now, dict) \
                and path[-1] in now and path[-1] not in node:
            node[path[-1]] = default
    return value


def _check_compatible(saved: dict[str, Any], cfg: DictConfig, vocab: Vocab, codec_hash: str | None, path: Path,
                      warn: bool = True, strict: bool = False) -> None:
    current = OmegaConf.to_container(cfg, resolve=True)
    for section in ("paradigm", "model", "data"):
        if _with_added_keys(saved["config"], current, section) != current.get(section):
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



def weights_record(cfg: DictConfig, vocab: Vocab, paradigm: Paradigm, step: int) -> dict[str, Any]:
    """The weights of a run at ``step`` with what it takes to rebuild the model (final.pt, best.pt)."""
    return {"format": FINAL_FORMAT, "paradigm": str(cfg.paradigm.name), "vocab": vocab.to_dict(),
            "config": OmegaConf.to_container(cfg, resolve=True), "model": paradigm.state_dict(),
            "step": step}


def save_checkpoint(path: Path, state: Progress, *, cfg: DictConfig, vocab: Vocab, codec_hash: str | None,
                    paradigm: Paradigm, optimizer: torch.optim.Optimizer, ctx: Distributed, next_lr: float,
                    started: float) -> None:
    """``last.pt`` (and its ``step_<N>.pt`` copy) at ``state``; collective: every rank gives its RNG
    states, rank 0 writes. ``started``: when this session of the run began (its wall time)."""
    tc = cfg.train
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
                         "next_lr": next_lr},
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
        }, path)
        _keep_step_copy(path, state.step, int(tc.keep_checkpoints))


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


def _init_from(paradigm: Paradigm, source: Path, vocab: Vocab, ctx: Distributed, *, matching: bool = False) -> None:
    """Start from the final weights of another run (multi-stage recipes: SyncSpeech fine-tuning
    after masked pre-training, PALLE stage two after stage one). The state dict must match
    exactly; a paradigm that derives more from the loaded weights (e.g. copying one network into
    another) does so in its ``after_init_from()``.

    ``matching`` (``train.init_matching``) starts a run of *another* paradigm from a trained one
    (``training.start_from_ar``): every tensor of the source whose name and shape a tensor of this
    model has (:func:`matching_tensors`) is loaded, the rest of this model keeps its fresh
    initialisation. The vocabularies must still agree: the loaded embedding rows mean the same ids."""
    path = checkpoint_path(source, "best")
    if not path.is_file():
        raise TrainError(f"train.init_from: {path} not found (train that run to the end first)")
    saved = torch.load(path, map_location="cpu", weights_only=False)
    if saved.get("vocab") != vocab.to_dict():
        raise TrainError(f"train.init_from: {path} was trained with vocabulary {saved.get('vocab')}, "
                         f"this run has {vocab.to_dict()}")
    if matching:
        own = paradigm.state_dict()
        loaded = matching_tensors(saved["model"], own)
        if not loaded:
            raise TrainError(f"train.init_from: {path} ({saved.get('paradigm')}) shares no tensor name and shape "
                             f"with this {paradigm.name} model")
        paradigm.load_state_dict({**own, **loaded})
        if ctx.is_main:
            fresh = sum(v.numel() for k, v in own.items() if k not in loaded)
            log.info("initialised %d of %d tensors from %s (step %s of %s); %d values keep their fresh "
                     "initialisation", len(loaded), len(own), path, saved.get("step"), saved.get("paradigm"), fresh)
        return
    try:
        paradigm.load_state_dict(saved["model"])
    except RuntimeError as err:
        raise TrainError(f"train.init_from: {path} does not fit this model: {str(err).splitlines()[0]}") from None
    hook = getattr(paradigm, "after_init_from", None)
    if callable(hook):
        hook()
    if ctx.is_main:
        log.info("initialised from %s (step %s of %s)", path, saved.get("step"), saved.get("paradigm"))


def matching_tensors(source: dict[str, torch.Tensor], target: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Target name -> source tensor, for every target tensor that a source tensor of the same shape
    names: the same name, or, for a model that nests its networks (PALLE's ``stage_one.`` and
    ``stage_two.``), the target's name ending in ``.`` + the source's. Buffers that are flags of
    a model's own state (PALLE's ``stage_two_initialised``) have no counterpart and stay as they are."""
    out = {}
    for name, tensor in target.items():
        candidates = [name] + [s for s in source if name.endswith("." + s)]
        for candidate in candidates:
            if candidate in source and source[candidate].shape == tensor.shape:
                out[name] = source[candidate]
                break
    return out
