"""Does a trained run read its text? Its dev loss with each utterance's own text, and with the
text of another utterance in its place.

A model that has learned to map text to speech tokens predicts an utterance's tokens much better
from its own text than from someone else's; a model that predicts them from the speech context
alone (the prompt, the unmasked frames, the previous frame) does as well either way. The gap
between the two dev losses is what the text is worth to the model. It tells apart the two ways a
paradigm can fail to speak at a given budget: the model reads the text but guesses the tokens
badly, or it has not yet found the text at all (an alignment-free paradigm that has not learned
where each word is).

Mismatched text: utterance ``i`` keeps its speech, speaker and every other input, and reads the
text of utterance ``(i + shift) % n`` (``shift`` defaults to half the list, so that neighbours,
often the same speaker's next sentence, are not paired). Where a paradigm reads durations
(SyncSpeech's a_n), the other utterance's are rescaled onto this one's frames
(:func:`rescaled_ends`), so that the text is wrong and its timing still plausible. CoD reads its
text as phonemes in its features; those are swapped with it.

The examples' random draws (masks, prompt lengths) are those of the dev loss: the batches are the
ones built from the *matched* lengths, so every utterance sits at the same batch and position in
both readings and gets the same generator. For AR and NAR the draws depend on the speech alone,
so the two readings differ only in the text; paradigms whose draws depend on the text length
(SyncSpeech's spans, PALLE's text stream) see slightly different masks too, which the matched
reading's spread over checkpoints bounds.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from arnar.paradigms.base import Paradigm, Utterance
from arnar.train.data import BucketBatchSampler, load_utterances
from arnar.train.step import evaluate, sequence_length

log = logging.getLogger(__name__)

TEXT_FEATURES = ("phonemes",)  # per-utterance features that are the text in another form (CoD)


def rescaled_ends(ends: torch.Tensor, n_frames: int) -> torch.Tensor:
    """Token end frames ``ends`` (non-decreasing, ``ends[-1]`` the frames they cover) stretched
    onto ``n_frames``: ``round(e * n_frames / ends[-1])``, halves rounded up, the last end exactly
    ``n_frames``. ``[2, 5, 10]`` onto 20 frames: ``[4, 10, 20]``; ``[1, 3]`` onto 5: ``[2, 5]``."""
    total = int(ends[-1])
    if total <= 0:
        raise ValueError(f"rescaled_ends: the ends cover {total} frames")
    out = torch.div(2 * ends.long() * n_frames + total, 2 * total, rounding_mode="floor")
    out[-1] = n_frames
    return out


def mismatched_text(utterances: Sequence[Utterance], shift: int | None = None) -> list[Utterance]:
    """Each utterance with the text (and its durations, and text-like features) of the one
    ``shift`` places on (see the module docstring)."""
    n = len(utterances)
    if n < 2:
        raise ValueError(f"mismatched text needs at least 2 utterances, got {n}")
    shift = n // 2 if shift is None else int(shift)
    if shift % n == 0:
        raise ValueError(f"shift {shift} pairs every utterance of {n} with itself")
    out = []
    for i, utt in enumerate(utterances):
        other = utterances[(i + shift) % n]
        ends = None
        if utt.ends is not None and other.ends is not None:
            ends = rescaled_ends(other.ends, utt.num_frames)
        features = dict(utt.features)
        for key in TEXT_FEATURES:
            if key in features and key in other.features:
                features[key] = other.features[key]
        out.append(replace(utt, text=other.text, ends=ends, features=features))
    return out


def text_reliance(paradigm: Paradigm, utterances: Sequence[Utterance], *, seed: int, max_tokens: int | None,
                  batch_size: int | None = None, shift: int | None = None,
                  device: torch.device | str = "cpu") -> dict[str, Any]:
    """Dev loss and accuracy of ``paradigm`` on ``utterances`` with their own text (``matched``,
    exactly the training loop's dev loss) and with another's (``mismatched``), and the gaps
    (mismatched minus matched: a loss gap near 0 means the text is not read)."""
    sampler = BucketBatchSampler([sequence_length(paradigm, u) for u in utterances], max_tokens=max_tokens,
                                 batch_size=batch_size, shuffle=False, seed=seed, even=False)
    device = torch.device(device)
    readings = {}
    for name, utts in (("matched", list(utterances)), ("mismatched", mismatched_text(utterances, shift))):
        result = evaluate(paradigm, utts, sampler, seed=seed, device=device, autocast_dtype=None, world_size=1)
        readings[name] = {"loss": result["loss"], "accuracy": result.get("correct")}
    matched, mismatched = readings["matched"], readings["mismatched"]
    accuracy_gap = (None if matched["accuracy"] is None or mismatched["accuracy"] is None
                    else mismatched["accuracy"] - matched["accuracy"])
    return {**readings, "loss_gap": mismatched["loss"] - matched["loss"], "accuracy_gap": accuracy_gap,
            "utterances": len(utterances)}


def run_text_reliance(run_dir: str | os.PathLike, checkpoints: Sequence[str], *, dev_tokens: str | os.PathLike,
                      dev_durations: str | os.PathLike, shift: int | None = None,
                      out: str | os.PathLike | None = None) -> list[dict[str, Any]]:
    """:func:`text_reliance` of each checkpoint of a run on a dev split (the run's own data
    settings and seed); rows written as JSON to ``out`` when given."""
    from arnar.train.checkpoints import load_model
    from arnar.train.loop import _check_vocab

    rows = []
    utterances = None
    for checkpoint in checkpoints:
        paradigm, cfg = load_model(run_dir, checkpoint)
        if utterances is None:
            utterances = load_utterances(dev_tokens, dev_durations, codebook=int(cfg.data.codebook),
                                         max_frames=cfg.data.max_frames, features=cfg.data.get("dev_features"))
            _check_vocab(utterances, paradigm.vocab, str(dev_durations))
        result = text_reliance(paradigm, utterances, seed=int(cfg.train.seed), max_tokens=cfg.train.max_tokens,
                               batch_size=cfg.train.batch_size, shift=shift)
        rows.append({"run": str(run_dir), "checkpoint": checkpoint, **result})
        log.info("%s@%s: dev loss %.3f with its text, %.3f with another's (gap %+.3f)", Path(run_dir).name,
                 checkpoint, result["matched"]["loss"], result["mismatched"]["loss"], result["loss_gap"])
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(rows, indent=2) + "\n")
    return rows


def markdown(rows: Sequence[dict[str, Any]]) -> str:
    """One table row per checkpoint: loss and accuracy with its own text and with another's."""
    def pct(x):
        return "-" if x is None else f"{100 * x:.1f} %"

    lines = ["| run | checkpoint | dev loss, own text | another's text | gap | accuracy, own text | another's text |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {Path(r['run']).name} | {r['checkpoint']} | {r['matched']['loss']:.3f} | "
                     f"{r['mismatched']['loss']:.3f} | {r['loss_gap']:+.3f} | {pct(r['matched']['accuracy'])} | "
                     f"{pct(r['mismatched']['accuracy'])} |")
    return "\n".join(lines) + "\n"
