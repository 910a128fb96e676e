"""``arnar train`` (and ``python -m arnar.train``, also under torchrun)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from omegaconf import OmegaConf

from arnar.atomic import write_text as atomic_write_text
from arnar.train.checkpoints import checkpoint_path
from arnar.train.config import TrainError, compose_config
from arnar.train.data import TrainDataError
from arnar.train.loop import train

log = logging.getLogger("arnar.train")  # one logger for the whole engine


def build_parser(prog: str = "arnar train") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description="Train a paradigm (one engine for all); under torchrun for DDP.",
        epilog="Hydra overrides follow the options, e.g. `-- paradigm=nar model=small train=mini train.lr=3e-4`.",
    )
    parser.add_argument("--run-dir", required=True, help="run folder (checkpoints, logs, final.pt)")
    parser.add_argument("--tokens", required=True, help="token split folder of the training set (with manifest.json)")
    parser.add_argument("--durations", required=True, help="BPE durations JSONL of the training set")
    parser.add_argument("--text-units", required=True, help="the text units to read: a sentencepiece BPE model (bpe.model) or a phoneme table (phonemes.json)")
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
                        bpe_model=args.text_units, dev_tokens=args.dev_tokens, dev_durations=args.dev_durations,
                        resume=resume, stop_after_steps=args.stop_after)
        if args.summary and os.environ.get("RANK", "0") == "0":
            atomic_write_text(Path(args.summary), json.dumps(summary, indent=2) + "\n")
    except _user_errors() as err:
        print(f"arnar train: error: {err}", file=sys.stderr)
        return 2
    return 0

