"""One update: batches named by where they sit in the data order, AdamW, the update whatever the
world size, and the dev loss."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from arnar.paradigms.base import Batch, Paradigm, Utterance, collate
from arnar.train.data import BucketBatchSampler, stable_seed
from arnar.train.distributed import _gather_objects, all_reduce_sum


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
