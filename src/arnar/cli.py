"""The `arnar` command: thin entry points over the package, one subcommand per pipeline step.

Snakemake rules call these with explicit arguments (so a changed value reruns the rule);
people call them the same way. Every subcommand exits with a one-line error naming the file
and the problem for bad input, never with a traceback from deep inside.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
from pathlib import Path

log = logging.getLogger("arnar")


def _atomic_write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp.{path.name}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def cmd_config(args: argparse.Namespace) -> None:
    from arnar.config import load_params

    overrides = {"profile": args.profile} if args.profile else None
    print(json.dumps(load_params(args.params, overrides), indent=2))


def cmd_synth(args: argparse.Namespace) -> None:
    from arnar.data.synth import build_synth_corpus

    summary = build_synth_corpus(
        Path(args.out),
        n_speakers=args.speakers,
        utterances_per_speaker=args.utterances_per_speaker,
        n_test_speakers=args.test_speakers,
        seed=args.seed,
        sample_rate=args.sample_rate,
        workers=args.workers,
    )
    log.info("corpus: %s", json.dumps(summary, sort_keys=True))


def cmd_ingest(args: argparse.Namespace) -> None:
    from arnar.data.manifests import ingest_corpus
    from arnar.data.validate import ValidationLimits

    limits = ValidationLimits(
        sample_rate=args.sample_rate,
        min_duration=args.min_duration,
        max_duration=args.max_duration,
        silence_dbfs=args.silence_dbfs,
        clip_fraction=args.clip_fraction,
    )
    summary = ingest_corpus(
        Path(args.corpus), Path(args.out), limits=limits, dev_fraction=args.dev_fraction,
        seed=args.seed, workers=args.workers,
    )
    log.info(
        "ingest: %d accepted, %d quarantined (%s), %.3f h",
        summary["accepted"], summary["quarantined"]["total"],
        ", ".join(f"{k}: {v}" for k, v in summary["quarantined"]["by_reason"].items()) or "none",
        summary["hours"],
    )


def cmd_tokenizers(args: argparse.Namespace) -> None:
    from arnar.text.build import build_tokenizers

    report = build_tokenizers(
        supervisions=Path(args.supervisions), bpe_model=Path(args.bpe),
        phonemes=Path(args.phonemes), vocab_size=args.bpe_vocab_size, seed=args.seed,
    )
    _atomic_write_text(Path(args.report), json.dumps(report, indent=2, sort_keys=True) + "\n")


def cmd_corpus_report(args: argparse.Namespace) -> None:
    summary = json.loads(Path(args.summary).read_text(encoding="utf-8"))
    corpus_summary = Path(args.corpus) / "summary.json"
    if corpus_summary.exists():
        summary["synthesis"] = json.loads(corpus_summary.read_text(encoding="utf-8"))
    _atomic_write_text(Path(args.out), json.dumps(summary, indent=2, sort_keys=True) + "\n")
    out = Path(args.quarantine_out)
    tmp = out.with_name(f".tmp.{out.name}")
    shutil.copyfile(args.quarantine, tmp)
    os.replace(tmp, out)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="arnar", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("config", help="validate params.yaml and print the resolved profile")
    p.add_argument("--params", default="params.yaml")
    p.add_argument("--profile", help="override the profile named in the file")
    p.set_defaults(func=cmd_config)

    p = sub.add_parser("synth", help="build the embedded synthesized corpus")
    p.add_argument("--out", required=True)
    p.add_argument("--speakers", type=int, required=True)
    p.add_argument("--utterances-per-speaker", type=int, required=True)
    p.add_argument("--test-speakers", type=int, required=True)
    p.add_argument("--sample-rate", type=int, default=16000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=2)
    p.set_defaults(func=cmd_synth)

    p = sub.add_parser("ingest", help="validate a raw corpus, write lhotse manifests + quarantine report")
    p.add_argument("--corpus", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--sample-rate", type=int, required=True)
    p.add_argument("--min-duration", type=float, default=0.5)
    p.add_argument("--max-duration", type=float, default=30.0)
    p.add_argument("--silence-dbfs", type=float, default=-60.0)
    p.add_argument("--clip-fraction", type=float, default=0.01)
    p.add_argument("--dev-fraction", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--workers", type=int, default=1)
    p.set_defaults(func=cmd_ingest)

    p = sub.add_parser("tokenizers", help="train BPE and build the phoneme tokenizer")
    p.add_argument("--supervisions", required=True, help="lhotse supervisions (train split)")
    p.add_argument("--bpe", required=True, help="output .model path (the .vocab lands beside it)")
    p.add_argument("--phonemes", required=True, help="output phoneme tokenizer JSON")
    p.add_argument("--report", required=True, help="output JSON report (vocab sizes, OOV rate)")
    p.add_argument("--bpe-vocab-size", type=int, default=2000)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_tokenizers)

    p = sub.add_parser("corpus-report", help="publish corpus figures and the quarantine list")
    p.add_argument("--summary", required=True)
    p.add_argument("--quarantine", required=True)
    p.add_argument("--corpus", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--quarantine-out", required=True)
    p.set_defaults(func=cmd_corpus_report)
    return parser


# Errors that mean "bad input or environment", reported as one line; anything else is a bug
# and keeps its traceback.
def _user_errors() -> tuple[type[BaseException], ...]:
    from arnar.config import ConfigError
    from arnar.data.manifests import CorpusError
    from arnar.data.synth import SynthError
    from arnar.data.texts import SourceMissingError
    from arnar.text import TokenizerError

    return (ConfigError, CorpusError, SynthError, SourceMissingError, TokenizerError, FileNotFoundError)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    try:
        args.func(args)
    except _user_errors() as err:
        print(f"arnar {args.command}: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
