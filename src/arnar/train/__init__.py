"""One training engine for every paradigm (docs/design.md section 2).

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
--durations D --text-units U [--dev-tokens T2 --dev-durations D2] [-- overrides...]``, also under
``torchrun --nproc_per_node N -m arnar.train ...``), :func:`load_model` for synthesis.

The package::

    loop.py           the training loop, read top to bottom (train, _train and its steps)
    step.py           one update (optimizer_step), AdamW, batches, the dev loss
    checkpoints.py    what a checkpoint holds, last/step_N/best/final files, resume, init_from
    distributed.py    torchrun's rank and world size, the collectives
    config.py         Hydra composition of arnar/conf, the learning-rate schedule, TrainError
    data.py           token + duration loading, bucketed batches (the loader)
    features.py       Chain-of-Details inputs: phoneme ids and speaker embeddings per utterance
    cli.py            ``arnar train`` / ``python -m arnar.train``

Run folder::

    config.yaml            the resolved config
    checkpoints/last.pt    the latest checkpoint; step_<N>.pt the last keep_checkpoints of them
    final.pt               model weights + config + vocab + paradigm name, once max_steps is reached
    train_summary.json     steps, wall time, parameters, final train/dev loss, tokens/s
    log.jsonl              every logged scalar, one row per logging step
    tb/                    the same scalars for TensorBoard
"""

from arnar.train.checkpoints import (BOOKKEEPING, CHECKPOINT_FORMAT, FINAL_FORMAT, IncompatibleCheckpoint,
                                     Progress, _check_compatible, _init_from, _keep_step_copy, _restore,
                                     atomic_torch_save, checkpoint_path, load_model, rng_state, save_checkpoint,
                                     seed_rngs, set_rng_state, weights_record)
from arnar.train.cli import build_parser, main
from arnar.train.config import CONF_DIR, TrainError, compose_config, learning_rate
from arnar.train.distributed import Distributed, all_reduce_sum, init_distributed
from arnar.train.loop import RECENT_LOSSES, train
from arnar.train.step import (StepResult, build_optimizer, evaluate, example_generator, make_batch,
                              optimizer_step, sequence_length)

__all__ = ["TrainError", "compose_config", "learning_rate", "train", "load_model", "main",
           "optimizer_step", "build_optimizer", "make_batch", "example_generator"]
