"""Per-utterance inputs of Chain-of-Details: phoneme ids and a speaker embedding.

CoD (Chain-of-Details, arXiv:2604.19330, Sec. IV-A) reads the transcript as phonemes ("a pretrained G2P model generates
phonetic indices") and the voice as a speaker embedding ("a pretrained speaker encoder"), neither of
which the shared training data (BPE ids, codec tokens) carries. :func:`build_features` computes both
for every cut of a lhotse cut manifest and saves the table the training engine loads with
``data.features=<file>`` (:func:`arnar.train.data.load_utterances`, ``Utterance.features``)::

    {utt_id: {"phonemes": LongTensor [P], "speaker": FloatTensor [D]}}

* ``phonemes``: :meth:`arnar.text.phonemes.PhonemeTokenizer.encode` of the cut's (first)
  supervision text, with the tokenizer the pipeline built (``data/<profile>/tokenizers/phonemes.json``;
  CMUdict G2P here, SoundChoice in the paper).
* ``speaker``: the embedding of the cut's audio by the offline speaker-similarity backend's encoder
  (:func:`arnar.evaluate.similarity.load_speaker_encoder`, default ``resemblyzer``, 256-d,
  L2-normalised; WeSpeaker in the paper). At synthesis :meth:`arnar.paradigms.cod.CoD.prepare_request`
  embeds the prompt audio with the same encoder, so training and synthesis see the same space.

A cut whose text has no phonemes is left out (logged with its id): CoD's duration predictor needs at
least one phoneme, and the engine skips utterances without features. The output is written
atomically (temporary file + rename). CLI: ``arnar cod-features --cuts C --phonemes P --out F``
(:func:`main`).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from arnar.atomic import atomic_path

__all__ = ["CodFeaturesError", "build_features", "main", "read_cut_audio"]

log = logging.getLogger(__name__)


class CodFeaturesError(ValueError):
    """Inputs of the features builder that are missing or unusable (the message names the file)."""


def read_cut_audio(cut: Any, where: str) -> tuple[np.ndarray, int]:
    """Mono float32 audio of one cut (its offset and duration within the recording)."""
    import soundfile as sf

    source = Path(cut.recording.sources[0].source)
    rate = int(cut.recording.sampling_rate)
    first = int(round(float(cut.start) * rate))
    frames = int(round(float(cut.duration) * rate))
    try:
        audio, file_rate = sf.read(str(source), start=first, frames=frames, dtype="float32", always_2d=True)
    except Exception as err:  # libsndfile raises several types; all mean "cannot be read"
        raise CodFeaturesError(f"{where}: cut {cut.id}: unreadable audio {source} ({err})") from None
    if audio.shape[0] == 0:
        raise CodFeaturesError(f"{where}: cut {cut.id}: no samples in {source}")
    return audio.mean(axis=1), int(file_rate)


def build_features(cuts_jsonl: str | os.PathLike, out_path: str | os.PathLike, *,
                   phonemes: str | os.PathLike | None = None, sim_backend: str = "resemblyzer",
                   sim_model: str | None = None, progress: bool = True) -> dict[str, Any]:
    """Phoneme ids and speaker embedding of every cut of ``cuts_jsonl``, saved to ``out_path``.

    ``phonemes``: the phoneme tokenizer JSON (``PhonemeTokenizer.load``); None: the default
    inventory (the ids every pipeline-built tokenizer has unless its inventory was changed).
    ``sim_backend`` / ``sim_model``: the speaker encoder (``load_speaker_encoder(name, model=)``).
    Returns a summary: utterances written, left out (ids), phoneme vocabulary size, embedding size.
    """
    from lhotse import load_manifest
    from tqdm import tqdm

    from arnar.evaluate.audio import AudioError
    from arnar.evaluate.similarity import load_speaker_encoder
    from arnar.text.phonemes import PhonemeTokenizer

    cuts_path, out = Path(cuts_jsonl), Path(out_path)
    if not cuts_path.is_file():
        raise CodFeaturesError(f"{cuts_path}: cut manifest not found")
    tokenizer = PhonemeTokenizer.load(phonemes) if phonemes is not None else PhonemeTokenizer()
    try:
        cuts = sorted(load_manifest(cuts_path), key=lambda c: c.id)
    except Exception as err:  # lhotse raises whatever its JSON/format readers raise
        raise CodFeaturesError(f"{cuts_path}: not a lhotse cut manifest ({err})") from None
    encoder = load_speaker_encoder(sim_backend, model=sim_model)
    table: dict[str, dict[str, torch.Tensor]] = {}
    left_out: list[str] = []
    for cut in tqdm(cuts, desc=f"CoD features {cuts_path.name}", unit="utt", disable=not progress):
        if not cut.supervisions:
            raise CodFeaturesError(f"{cuts_path}: cut {cut.id} has no supervision (no transcript)")
        ids = tokenizer.encode(cut.supervisions[0].text or "")
        if not ids:
            left_out.append(cut.id)
            continue
        audio, rate = read_cut_audio(cut, str(cuts_path))
        try:
            embedding = encoder.embed([audio], rate)[0]
        except AudioError as err:
            raise CodFeaturesError(f"{cuts_path}: cut {cut.id} ({cut.recording.sources[0].source}): {err}") from None
        table[cut.id] = {"phonemes": torch.tensor(ids, dtype=torch.long),
                         "speaker": torch.from_numpy(np.asarray(embedding, dtype=np.float32))}
    if not table:
        raise CodFeaturesError(f"{cuts_path}: no cut with phonemes ({len(left_out)} cuts, all without)")
    if left_out:
        log.warning("%s: %d cuts without phonemes left out: %s", cuts_path, len(left_out), ", ".join(left_out[:10]))
    with atomic_path(out) as tmp:
        torch.save(table, tmp)
    summary = {"utterances": len(table), "left_out": left_out, "phoneme_vocab_size": tokenizer.vocab_size,
               "speaker_dim": int(next(iter(table.values()))["speaker"].numel()), "speaker_encoder": encoder.name}
    log.info("CoD features of %s -> %s: %d utterances (%d left out), %d phoneme ids, %d-d %s speaker embeddings",
             cuts_path, out, len(table), len(left_out), tokenizer.vocab_size, summary["speaker_dim"], encoder.name)
    return summary


def build_parser(prog: str = "arnar cod-features") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description="Phoneme ids and speaker embeddings of a cut manifest "
                                     "for Chain-of-Details training (data.features=<out>).")
    parser.add_argument("--cuts", required=True, help="lhotse cut manifest (JSONL)")
    parser.add_argument("--phonemes", help="phoneme tokenizer JSON (data/<profile>/tokenizers/phonemes.json)")
    parser.add_argument("--out", required=True, help="features file to write (torch.save)")
    parser.add_argument("--sim-backend", default="resemblyzer", help="speaker encoder (default resemblyzer)")
    parser.add_argument("--sim-model", help="speaker encoder weights/model (default: the backend's own)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``arnar cod-features``: exit status 0, or 2 with a one-line error naming the file."""
    from arnar.evaluate.similarity import SimUnavailableError
    from arnar.text.normalize import TokenizerError

    args = build_parser().parse_args(argv)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s",
                            stream=sys.stderr)
    try:
        build_features(args.cuts, args.out, phonemes=args.phonemes, sim_backend=args.sim_backend,
                       sim_model=args.sim_model, progress=not args.no_progress)
    except (CodFeaturesError, SimUnavailableError, TokenizerError, FileNotFoundError, ValueError) as err:
        print(f"arnar cod-features: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
