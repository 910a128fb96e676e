"""The training loop, top to bottom: set up the run (data, model, optimizer, samplers), start it
or resume it, then one update after another (log, evaluate, checkpoint), then the summary.

Why it is built this way:

* **One update, whatever the world size** (:func:`arnar.train.step.optimizer_step`).
* **Per-example randomness is named, not drawn** (:func:`arnar.train.step.example_generator`);
  only dropout draws from the global torch RNG, whose state is in the checkpoint.
* **Exact resume** (:mod:`arnar.train.checkpoints`): the bucket sampler is a pure function of
  (seed, epoch), so a resumed run replays what the uninterrupted one would have done.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from omegaconf import DictConfig, OmegaConf

from arnar.atomic import write_text as atomic_write_text
from arnar.codec.shards import read_token_manifest
from arnar.paradigms import build_paradigm
from arnar.paradigms.base import Paradigm, Utterance, Vocab
from arnar.text import text_units_of
from arnar.train.checkpoints import (IncompatibleCheckpoint, Progress, _init_from, _restore, atomic_torch_save,
                                     save_checkpoint, seed_rngs, weights_record)
from arnar.train.config import (TrainError, _autocast_dtype, _options, cpu_computes_bf16_natively, departures_from_papers,
                                host_record, learning_rate)
from arnar.train.data import (BucketBatchSampler, TrainDataError, load_utterances, prompt_pairs, stable_seed,
                              vocab_for)
from arnar.train.distributed import Distributed, init_distributed
from arnar.train.step import build_optimizer, evaluate, make_batch, optimizer_step, sequence_length

log = logging.getLogger("arnar.train")  # one logger for the whole engine

RECENT_LOSSES = 50  # steps averaged into the summary's final_train_loss


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
        return _train(cfg, ctx, run_dir, train_tokens, train_durations, bpe_model, dev_tokens, dev_durations,
                      resume, stop_after_steps)
    finally:
        if ctx.owns_group:
            dist.destroy_process_group()


@dataclass
class Run:
    """What a run trains with, built once by :func:`_set_up`."""

    cfg: DictConfig
    ctx: Distributed
    run_dir: Path
    seed: int
    amp: torch.dtype | None  # autocast dtype, None for float32
    utterances: list[Utterance]
    dev: list[Utterance]
    vocab: Vocab
    text_units: str  # "bpe" or "phonemes" (arnar.text.text_units_of)
    codec_hash: str | None  # of the tokens' codec: no resuming onto other tokens
    paradigm: Paradigm
    n_params: int
    optimizer: torch.optim.Optimizer
    sampler: BucketBatchSampler
    dev_sampler: BucketBatchSampler | None

    def lr_at(self, step: int) -> float:
        tc = self.cfg.train
        return learning_rate(step, lr=float(tc.lr), warmup_steps=int(tc.warmup_steps),
                             max_steps=int(tc.max_steps), min_lr_ratio=float(tc.min_lr_ratio))


def _train(cfg: DictConfig, ctx: Distributed, run_dir: Path, train_tokens, train_durations, bpe_model, dev_tokens,
           dev_durations, resume: bool | str, stop_after_steps: int | None) -> dict[str, Any]:
    started = time.time()
    tc = cfg.train
    run = _set_up(cfg, ctx, run_dir, train_tokens, train_durations, bpe_model, dev_tokens, dev_durations)
    state = _start(run, resume)
    if ctx.is_main:
        _open_run_dir(run, state)
    model = _wrap_ddp(run)
    run.paradigm.train()
    logger = _Logger(run_dir, ctx.is_main, state.step)

    from tqdm import tqdm

    max_steps = int(tc.max_steps)
    end = max_steps if stop_after_steps is None else min(max_steps, int(stop_after_steps))
    bar = tqdm(total=max_steps, initial=state.step, disable=not (ctx.is_main and tc.progress), mininterval=1.0,
               dynamic_ncols=True, desc=f"train {cfg.paradigm.name}")
    stream = _batches(run.sampler, state.epoch, state.batch_in_epoch)
    window_tokens, window_start = 0, time.time()
    last_saved = last_eval = state.step
    log_every, eval_every, ckpt_every = max(1, int(tc.log_every)), int(tc.eval_every), int(tc.ckpt_every)
    try:
        while state.step < end:
            micro = []
            for _ in range(int(tc.grad_accum)):
                state.epoch, state.batch_in_epoch, g, indices = next(stream)
                micro.append(make_batch(run.paradigm, run.utterances, indices, seed=run.seed, epoch=state.epoch,
                                        batch_index=g))
            lr = run.lr_at(state.step)
            result = optimizer_step(model, run.optimizer, micro, lr=lr, grad_clip=float(tc.grad_clip),
                                    world_size=ctx.world_size, device=ctx.device, autocast_dtype=run.amp)
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
                           "train/epoch": state.epoch + state.batch_in_epoch / len(run.sampler),
                           **{f"train/{k}": v for k, v in result.metrics.items()}}
                logger.write(state.step, scalars)
                bar.set_postfix(loss=f"{result.loss:.3f}", tok_s=f"{window_tokens / elapsed:.0f}", refresh=False)
                window_tokens, window_start = 0, time.time()
            bar.update(1)
            if eval_every > 0 and state.step % eval_every == 0:
                state.dev_loss, last_eval = _dev_loss(run, logger, state.step), state.step
                _keep_if_best(run, state)
            if ckpt_every > 0 and state.step % ckpt_every == 0:
                _save(run, state, started)
                last_saved = state.step
        finished = state.step >= max_steps
        if finished and run.dev_sampler is not None and last_eval != state.step:
            state.dev_loss = _dev_loss(run, logger, state.step)
            _keep_if_best(run, state)
        if last_saved != state.step:
            _save(run, state, started)
    finally:
        bar.close()
        logger.close()

    wall = state.wall_time_s + time.time() - started
    summary = _summary(run, state, finished, wall)
    if ctx.is_main:
        if finished:
            atomic_torch_save(weights_record(cfg, run.vocab, run.paradigm, state.step), run_dir / "final.pt")
        atomic_write_text(run_dir / "train_summary.json", json.dumps(summary, indent=2) + "\n")
        log.info("trained %s: %d steps in %.0f s, train loss %.4f%s", summary["paradigm"], state.step, wall,
                 summary["final_train_loss"] or float("nan"),
                 f", dev loss {state.dev_loss:.4f}" if state.dev_loss is not None else "")
    return summary


# ----------------------------------------------------------------------------- the steps of _train

def _set_up(cfg: DictConfig, ctx: Distributed, run_dir: Path, train_tokens, train_durations, bpe_model, dev_tokens,
            dev_durations) -> Run:
    """Check the settings, read the data, build the model, its optimizer and the batch samplers."""
    tc = cfg.train
    if (dev_tokens is None) != (dev_durations is None):
        raise TrainError("give both dev tokens and dev durations, or neither")
    if (tc.max_tokens is None) == (tc.batch_size is None):
        raise TrainError("set exactly one of train.max_tokens and train.batch_size (the other null)")
    seed = int(tc.seed)
    device = ctx.device
    native_bf16 = device.type == "cuda" or cpu_computes_bf16_natively()
    amp = _autocast_dtype(str(tc.precision), device, native_bf16=native_bf16)
    if str(tc.precision) in ("bf16", "bf16_if_native") and not native_bf16:
        if amp is None:
            log.warning("train.precision bf16_if_native: this CPU has no bf16 instructions (AVX-512 BF16 or AMX), "
                        "so the run trains in float32; its numbers differ from a bf16 host's in the digits")
        else:
            log.warning("train.precision bf16 on a CPU without bf16 instructions (AVX-512 BF16 or AMX): bf16 is "
                        "emulated there, ~10x slower than float32 (bench/train_precision.py); "
                        "train.precision=bf16_if_native trains in float32 on such a CPU")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    # data: every rank reads all of it (token sets are small next to the model) and shards batches
    codebooks = _resolve_codebooks(cfg, read_token_manifest(train_tokens)["codec"], train_tokens)
    data_opts = {"codebook": int(cfg.data.codebook), "codebooks": codebooks, "max_frames": cfg.data.max_frames}
    utterances = load_utterances(train_tokens, train_durations, **data_opts, features=cfg.data.get("features"))
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
    pair_fraction = float(cfg.data.get("prompt_pairs") or 0.0)
    if pair_fraction:  # after the paradigm: one with per-utterance features joins them itself
        singles = len(utterances)
        utterances = prompt_pairs(utterances, pair_fraction, seed, join=getattr(paradigm, "join_prompt_pair", None))
        log.info("data.prompt_pairs %.2f: %d of %d training utterances behind a same-speaker prompt",
                 pair_fraction, sum("+" in u.utt_id for u in utterances), singles)
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
    return Run(cfg=cfg, ctx=ctx, run_dir=run_dir, seed=seed, amp=amp, utterances=utterances, dev=dev, vocab=vocab,
               text_units=text_units_of(bpe_model), codec_hash=codec_hash, paradigm=paradigm, n_params=n_params, optimizer=optimizer, sampler=sampler,
               dev_sampler=dev_sampler)


def _start(run: Run, resume: bool | str) -> Progress:
    """Resume from ``checkpoints/last.pt`` where asked and there is one; a run at step 0 starts
    from ``train.init_from``'s weights where it names a run."""
    tc, ctx = run.cfg.train, run.ctx
    last_path = run.run_dir / "checkpoints" / "last.pt"
    state = Progress()
    if resume and last_path.is_file():
        try:
            state = _restore(last_path, run.paradigm, run.optimizer, run.cfg, run.vocab, run.codec_hash, ctx,
                             strict=resume == "if-compatible")
        except IncompatibleCheckpoint as err:
            if resume != "if-compatible":
                raise
            # the DAG reruns a run when its config changed: that is a new run, not a resumption
            log.warning("%s: starting this run afresh", str(err).split("; use another run dir")[0])
            state = Progress()
        if not run.dev:
            state.dev_loss = None  # a dev loss of this run's dev set only
    if state.step == 0 and tc.get("init_from"):
        _init_from(run.paradigm, Path(str(tc.init_from)), run.vocab, ctx, matching=bool(tc.get("init_matching")))
    return state


def _resolve_codebooks(cfg: DictConfig, codec: dict[str, Any], train_tokens: Any) -> int:
    """How many codebooks of the token stack the paradigm generates: its option ``codebooks``
    (CoD; 1 when a paradigm has no such option), ``all`` meaning every codebook of the tokens'
    codec, written back into ``cfg`` as a number so that the run's saved config says which."""
    options = cfg.paradigm.get("options")
    wanted = options.get("codebooks", 1) if options is not None else 1
    if wanted == "all":
        wanted = int(codec.get("n_codebooks", 1))
        options.codebooks = wanted
    if isinstance(wanted, bool) or not isinstance(wanted, int) or wanted < 1:
        raise TrainError(f"paradigm.options.codebooks must be a whole number >= 1 or 'all', got {wanted!r}")
    if wanted > int(codec.get("n_codebooks", 1)):
        raise TrainError(f"paradigm.options.codebooks={wanted}, the tokens of {train_tokens} have "
                         f"{codec.get('n_codebooks', 1)} codebooks ({codec.get('name')})")
    return wanted


def _open_run_dir(run: Run, state: Progress) -> None:
    """Rank 0: the run folder, cleared of an earlier run's files when starting afresh, with the
    resolved config."""
    run.run_dir.mkdir(parents=True, exist_ok=True)
    if state.step == 0:
        _clear_previous_run(run.run_dir)
    atomic_write_text(run.run_dir / "config.yaml", OmegaConf.to_yaml(run.cfg, resolve=True))
    log.info("%s: %d parameters, %d training utterances (%d batches per rank per epoch), %d dev; "
             "%d rank(s) on %s, %s", run.cfg.paradigm.name, run.n_params, len(run.utterances), len(run.sampler),
             len(run.dev), run.ctx.world_size, run.ctx.device, "bf16 autocast" if run.amp else "float32")


def _wrap_ddp(run: Run) -> torch.nn.Module:
    """The module the updates go through: the paradigm, or its DDP wrapper on more than one rank."""
    if run.ctx.world_size == 1:
        return run.paradigm
    return torch.nn.parallel.DistributedDataParallel(
        run.paradigm, device_ids=[run.ctx.local_rank] if run.ctx.device.type == "cuda" else None,
        find_unused_parameters=bool(run.cfg.train.find_unused_parameters),
    )


def _batches(sampler: BucketBatchSampler, epoch: int, start: int) -> Iterator[tuple[int, int, int, list[int]]]:
    """(epoch, batches of it done after this one, global batch index, indices), forever."""
    while True:
        sampler.set_epoch(epoch)
        sampler.set_start(start)
        for done, (g, indices) in enumerate(sampler.indexed(), start + 1):
            yield epoch, done, g, indices
        epoch, start = epoch + 1, 0


def _dev_loss(run: Run, logger: _Logger, step: int) -> float | None:
    """The dev loss now (logged with its metrics), None without dev data."""
    if run.dev_sampler is None:
        return None
    result = evaluate(run.paradigm, run.dev, run.dev_sampler, seed=run.seed, device=run.ctx.device,
                      autocast_dtype=run.amp, world_size=run.ctx.world_size)
    if result:
        logger.write(step, {f"dev/{k}": v for k, v in result.items()})
    return result.get("loss")


def _keep_if_best(run: Run, state: Progress) -> None:
    """Small corpora overfit within a few epochs: keep the weights of the lowest dev loss
    (best.pt), which synthesis and later stages use (checkpoint "best")."""
    if state.dev_loss is None or (state.best_dev_loss is not None and state.dev_loss >= state.best_dev_loss):
        return
    state.best_dev_loss, state.best_step = state.dev_loss, state.step
    if run.ctx.is_main:
        atomic_torch_save(weights_record(run.cfg, run.vocab, run.paradigm, state.step), run.run_dir / "best.pt")


def _save(run: Run, state: Progress, started: float) -> None:
    save_checkpoint(run.run_dir / "checkpoints" / "last.pt", state, cfg=run.cfg, vocab=run.vocab,
                    codec_hash=run.codec_hash, paradigm=run.paradigm, optimizer=run.optimizer, ctx=run.ctx,
                    next_lr=run.lr_at(state.step), started=started)


def _summary(run: Run, state: Progress, finished: bool, wall: float) -> dict[str, Any]:
    cfg = run.cfg
    return {
        "paradigm": str(cfg.paradigm.name),
        "finished": finished,
        "steps": state.step,
        "max_steps": int(cfg.train.max_steps),
        "epochs": round(state.epoch + state.batch_in_epoch / len(run.sampler), 4),
        "wall_time_s": round(wall, 3),
        "parameters": run.n_params,
        # what the optimizer updates (DELTA's conversion: adapters and conv modules only)
        "trainable_parameters": sum(p.numel() for p in run.paradigm.parameters() if p.requires_grad),
        "final_train_loss": float(np.mean(state.recent_losses)) if state.recent_losses else None,
        "final_dev_loss": state.dev_loss,
        "best_dev_loss": state.best_dev_loss,
        "best_step": state.best_step,
        "tokens_seen": state.tokens_seen,
        "tokens_per_s": round(state.tokens_seen / wall, 1) if wall > 0 else None,
        "world_size": run.ctx.world_size,
        "device": str(run.ctx.device),
        "precision": "bf16" if run.amp else "fp32",
        "host": host_record(),
        "train_utterances": len(run.utterances),
        "dev_utterances": len(run.dev),
        "vocab": run.vocab.to_dict(),
        "model": OmegaConf.to_container(cfg.model, resolve=True),
        "not_in_the_papers": departures_from_papers(cfg, run.text_units),
    }


# ----------------------------------------------------------------------------- the run folder

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
    speech_max = max(max(int(u.speech.max()), int(u.acoustic.max()) if u.acoustic is not None else 0)
                     for u in utterances)
    if text_max >= vocab.text_size:
        raise TrainDataError(f"{source}: BPE id {text_max} outside the BPE model's {vocab.text_size} ids "
                             "(durations made with another BPE model?)")
    if speech_max >= vocab.speech_size:
        raise TrainDataError(f"{source}: speech code {speech_max} outside the codebook size {vocab.speech_size}")
