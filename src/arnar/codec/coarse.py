"""Coarse temporal tokens of other kinds, for Chain-of-Details' Table V (coarse token types).

CoD's own coarse levels are the first quantizer's codes decimated in time
(:mod:`arnar.codec.hierarchy`). Table V of Chain-of-Details (arXiv:2604.19330) asks what happens with other coarse
tokens; each kind here is the nearest thing the offline codec can make (the finest level is always
the first RVQ quantizer at 50 Hz, the codes that get decoded):

``independent`` (the paper's "C2C1-Ind-trained": independently trained level tokens with codebooks
    of their own): the RVQ stream's latent vectors (the 160-d normalised mel frames codebook 1
    quantizes, :meth:`arnar.codec.offline.OfflineCodec.latents`) averaged over each group of
    ``2 ** (L - l)`` frames, and quantized by a k-means codebook trained for that level alone.
``shared`` ("C2C1-ShareCodebook": temporal coarse tokens that share the codebook): the same
    averaged latents, quantized by the RVQ stream's own first codebook, so a coarse code is the
    same vector as a fine code, but is not one of the fine frames it covers.
``units`` ("HuBERT-2-levels", two levels only): HuBERT units are k-means clusters of a hidden
    layer of a speech encoder; here the 25 Hz features of the offline codec's phone encoder (an
    encoder trained with a recognition loss, as S3's) clustered by k-means. HuBERT itself is a hub
    download (``facebook/hubert-large-ll60k``), which the offline default cannot fetch.

Every coarse codebook has as many codes as the RVQ codebook (``rvq_size``), so coarse ids fit the
model's speech vocabulary; the level embedding of CoD tells the model which codebook a level's
ids come from. Level ``l`` of an utterance of ``T`` RVQ frames has ``ceil(T / 2 ** (L - l))``
tokens, as a decimated level: pooling averages a trailing partial group over the frames it has,
and the 25 Hz units of a clip of ``n`` samples number ``ceil(n / 640) = ceil(T / 2)``.

Files of a tokenizer folder: ``config.json`` (format, kind, levels, the codec folder and its hash,
the fit's data and seed) and ``codebooks.pt`` (one ``[K, D]`` tensor per coarse level, coarse to
fine). CLI: ``arnar coarse-tokens --kind K --levels L --codec-model M --split CUTS FEATURES OUT
... --out DIR`` (:func:`main`, :func:`build_coarse_tokens`).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from arnar import atomic
from arnar.codec.base import CodecError
from arnar.codec.hierarchy import level_factors

__all__ = ["KINDS", "CoarseTokenizer", "build_coarse_tokens", "main", "pool"]

log = logging.getLogger(__name__)

KINDS = ("independent", "shared", "units")
FORMAT = "arnar-cod-coarse/1"
CONFIG, CODEBOOKS = "config.json", "codebooks.pt"


def pool(latents, factor: int):
    """``[T, D]`` -> ``[ceil(T / factor), D]``: the mean of every group of ``factor`` frames (a
    trailing partial group averages the frames it has)."""
    import torch

    latents = torch.as_tensor(latents, dtype=torch.float32)
    T, D = latents.shape
    groups = math.ceil(T / factor)
    padded = torch.zeros(groups * factor, D)
    padded[:T] = latents
    counts = torch.zeros(groups * factor)
    counts[:T] = 1
    return padded.reshape(groups, factor, D).sum(1) / counts.reshape(groups, factor).sum(1, keepdim=True)


def _check_kind(kind: str, n_levels: int) -> None:
    if kind not in KINDS:
        raise ValueError(f"coarse token kind {kind!r}: expected one of {', '.join(KINDS)}")
    if int(n_levels) != n_levels or n_levels < 2:
        raise ValueError(f"coarse tokens need at least 2 levels (one coarse, one fine), got {n_levels!r}")
    if kind == "units" and n_levels != 2:
        raise ValueError(f"units are one coarse level at 25 Hz above the 50 Hz codes: levels must be 2, got {n_levels}")


class CoarseTokenizer:
    """Coarse levels ``1 .. L-1`` of an utterance, from its audio (module docstring)."""

    def __init__(self, kind: str, n_levels: int, codec_model: str, codebooks: Sequence[Any], *,
                 info: dict[str, Any] | None = None):
        from arnar.codec.offline import OfflineCodec

        _check_kind(kind, n_levels)
        if len(codebooks) != n_levels - 1:
            raise ValueError(f"{kind} coarse tokens with {n_levels} levels need {n_levels - 1} codebooks, "
                             f"got {len(codebooks)}")
        self.kind, self.n_levels, self.codec_model = kind, int(n_levels), str(codec_model)
        self.codec = OfflineCodec(codec_model, stream="semantic" if kind == "units" else "rvq", n_codebooks=None)
        self.codebooks = list(codebooks)
        self.info = dict(info or {})
        self.codebook_size = int(self.codec.cfg["rvq_size"])  # the fine level's codebook: the model's speech vocab

    @property
    def factors(self) -> list[int]:
        """Frames of the finest level per token of each coarse level, coarse to fine."""
        return level_factors(self.n_levels)[:-1]

    def coarse_latents(self, audio: np.ndarray, sample_rate: int) -> list[Any]:
        """The vectors each coarse level quantizes, coarse to fine."""
        latents = self.codec.latents(audio, sample_rate)
        if self.kind == "units":  # already at 25 Hz, the one coarse level
            return [latents]
        return [pool(latents, factor) for factor in self.factors]

    def levels(self, audio: np.ndarray, sample_rate: int, *, skip_frames: int = 0) -> list[np.ndarray]:
        """``int64`` codes of each coarse level, coarse to fine, of ``audio`` without its first
        ``skip_frames`` finest-level frames (CoD drops the first ``T_p mod 2 ** (L - 1)`` frames of a
        prompt so that the prompt ends on a level-1 token boundary)."""
        from arnar.codec.offline import RVQ_STACK, HOP, SAMPLE_RATE, _assign
        from arnar.evaluate.audio import resample

        clip = resample(np.asarray(audio, dtype=np.float32), sample_rate, SAMPLE_RATE)[int(skip_frames) * HOP * RVQ_STACK:]
        return [_assign(x, codebook).numpy().astype(np.int64)
                for x, codebook in zip(self.coarse_latents(clip, SAMPLE_RATE), self.codebooks)]

    def save(self, folder: str | Path) -> None:
        import torch

        folder = Path(folder)
        with atomic.atomic_path(folder / CODEBOOKS) as tmp:
            torch.save([torch.as_tensor(c) for c in self.codebooks], tmp)
        # the config last: a folder with a config is complete
        config = {"format": FORMAT, "kind": self.kind, "levels": self.n_levels, "codec_model": self.codec_model,
                  "codec_hash": self.codec.config_hash(), "codebook_size": self.codebook_size, **self.info}
        atomic.write_text(folder / CONFIG, json.dumps(config, indent=2, sort_keys=True) + "\n")

    @classmethod
    def load(cls, folder: str | Path) -> CoarseTokenizer:
        """A fitted tokenizer; its codec must be the one it was fitted with (same hash)."""
        import torch

        folder = Path(folder)
        try:
            config = json.loads((folder / CONFIG).read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise CodecError(f"{folder}: not a coarse token folder ({err}); make one with `arnar coarse-tokens`") \
                from None
        if not isinstance(config, dict) or config.get("format") != FORMAT:
            raise CodecError(f"{folder / CONFIG}: format {config.get('format') if isinstance(config, dict) else None!r}, "
                             f"expected {FORMAT!r}")
        try:
            codebooks = torch.load(folder / CODEBOOKS, map_location="cpu", weights_only=True)
        except Exception as err:  # torch raises several types for a bad file
            raise CodecError(f"{folder / CODEBOOKS}: unreadable codebooks ({err})") from None
        info = {k: v for k, v in config.items()
                if k not in ("format", "kind", "levels", "codec_model", "codec_hash", "codebook_size")}
        tokenizer = cls(config["kind"], int(config["levels"]), config["codec_model"], codebooks, info=info)
        if tokenizer.codec.config_hash() != config["codec_hash"]:
            raise CodecError(f"{folder}: fitted with another codec than the one now at {config['codec_model']} "
                             "(retrain the coarse tokens)")
        return tokenizer


def _cuts(cuts_jsonl: str | Path) -> list[Any]:
    from lhotse import load_manifest

    path = Path(cuts_jsonl)
    if not path.is_file():
        raise CodecError(f"{path}: cut manifest not found")
    try:
        return sorted(load_manifest(path), key=lambda c: c.id)
    except Exception as err:  # lhotse raises whatever its JSON/format readers raise
        raise CodecError(f"{path}: not a lhotse cut manifest ({err})") from None


def _split_latents(tokenizer: CoarseTokenizer, cuts: list[Any], where: str, progress: bool) -> dict[str, list[Any]]:
    """Coarse latents of every cut, by cut id."""
    from tqdm import tqdm

    from arnar.train.features import read_cut_audio

    latents = {}
    for cut in tqdm(cuts, desc=f"coarse latents ({tokenizer.kind}) {Path(where).name}", unit="utt",
                    disable=not progress):
        audio, rate = read_cut_audio(cut, where)
        latents[cut.id] = tokenizer.coarse_latents(audio, rate)
    return latents


def _features_table(path: Path) -> dict[str, Any]:
    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises several types for a bad file
        raise CodecError(f"{path}: not a CoD features file ({err}); make it with `arnar cod-features`") from None


def build_coarse_tokens(kind: str, n_levels: int, codec_model: str | Path, splits: Sequence[Sequence[str | Path]],
                        out_dir: str | Path, *, seed: int = 0, iters: int = 20, threads: int = 2,
                        progress: bool = True) -> CoarseTokenizer:
    """Fit the codebooks of ``kind`` on the first split and add every split's coarse levels to its
    CoD features table (:mod:`arnar.train.features`).

    ``splits``: ``(cut manifest, features file in, features file out)`` per split; the codebooks
    are fitted on the audio of the first (the training split). The output tables are the input
    ones with ``coarse`` added to each utterance (a list of LongTensors, coarse to fine); a cut
    the input table does not have (no phonemes) is left out, as training leaves it out. Each
    utterance's latents are computed once, for fitting and encoding. k-means:
    :func:`arnar.codec.offline.kmeans._kmeans` (k-means++ seeded, then Lloyd), one per coarse
    level, with the RVQ codebook's size; ``shared`` fits nothing (its codebook is the codec's first)."""
    import torch

    from arnar.codec.offline import OfflineCodec, _assign, _deterministic, _kmeans

    _check_kind(kind, n_levels)
    if not splits:
        raise ValueError("coarse tokens: give at least one split (the first is fitted on)")
    tables, latents = [], []
    unfitted = [torch.zeros(0)] * (n_levels - 1)  # empty until k-means fits them below: latents come first
    tokenizer = CoarseTokenizer(kind, n_levels, str(codec_model), unfitted,
                                info={"fitted_on": str(splits[0][0]), "seed": int(seed), "iters": int(iters)})
    with _deterministic(threads):
        for cuts_jsonl, features_in, _ in splits:
            cuts = _cuts(cuts_jsonl)
            table = _features_table(Path(features_in))
            cuts = [cut for cut in cuts if cut.id in table]
            if not cuts:
                raise CodecError(f"{cuts_jsonl}: no cut has features in {features_in}")
            tables.append(table)
            latents.append(_split_latents(tokenizer, cuts, str(cuts_jsonl), progress))
        if kind == "shared":
            first = OfflineCodec(codec_model, stream="rvq", n_codebooks=1).codebooks[0].clone()
            codebooks = [first] * (n_levels - 1)
        else:
            codebooks = []
            for level in range(n_levels - 1):
                data = torch.cat([x[level] for x in latents[0].values()])
                log.info("k-means for %s level %d: %d vectors of %d dims -> %d codes", kind, level + 1,
                         data.shape[0], data.shape[1], tokenizer.codebook_size)
                codebooks.append(_kmeans(data, tokenizer.codebook_size, iters, seed + level))
        tokenizer.codebooks = codebooks
        for (_, _, features_out), table, split_latents in zip(splits, tables, latents):
            out = {utt: {**table[utt], "coarse": [_assign(x, cb) for x, cb in zip(xs, codebooks)]}
                   for utt, xs in split_latents.items()}
            with atomic.atomic_path(Path(features_out)) as tmp:
                torch.save(out, tmp)
            log.info("%s coarse tokens of %d utterances -> %s", kind, len(out), features_out)
    tokenizer.save(out_dir)
    return tokenizer


def build_parser(prog: str = "arnar coarse-tokens") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="Coarse temporal tokens of other kinds for the "
                                     "Chain-of-Details coarse token ablation (arXiv:2604.19330, Table V): "
                                     "fit a coarse tokenizer on the first split, add coarse levels to the CoD "
                                     "features of every split.")
    parser.add_argument("--kind", required=True, choices=KINDS)
    parser.add_argument("--levels", type=int, required=True, help="CoD levels L (coarse levels: L - 1)")
    parser.add_argument("--codec-model", required=True, help="offline codec folder (data/<profile>/codec/offline)")
    parser.add_argument("--split", nargs=3, action="append", required=True, metavar=("CUTS", "FEATURES", "OUT"),
                        help="a split's lhotse cuts, its CoD features (arnar cod-features) and the features file "
                        "to write with `coarse` added; the first split is fitted on")
    parser.add_argument("--out", required=True, help="tokenizer folder to write (CoD option coarse_tokenizer)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--iters", type=int, default=20, help="Lloyd iterations of each k-means")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``arnar coarse-tokens``: exit status 0, or 2 with a one-line error naming the file."""
    from arnar.train.features import CodFeaturesError

    args = build_parser().parse_args(argv)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s",
                            stream=sys.stderr)
    try:
        build_coarse_tokens(args.kind, args.levels, args.codec_model, args.split, args.out, seed=args.seed,
                            iters=args.iters, progress=not args.no_progress)
    except (CodecError, CodFeaturesError, ValueError) as err:
        print(f"arnar coarse-tokens: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
