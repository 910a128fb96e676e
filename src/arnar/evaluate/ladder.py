"""The teacher-forced rung of the diagnostic ladder: where between the codec and free-running
decoding are the words lost?

The ladder reads one test list four ways, each judged by the same ASR:

1. ground truth (``systems/ground_truth``);
2. the codec fed the ground-truth tokens (``systems/resynth_<codec>``): the ceiling of every
   paradigm that decodes through it;
3. **teacher-forced** (this module): the model is fed the true prompt *and* the true target
   tokens and predicts each target token from the true history; its argmax predictions are
   decoded to audio. What is lost here the model has not learned to map from text to tokens,
   whatever the decoding loop does;
4. free-running (the paradigm's own ``generate``, the ``synthesize`` rule's output).

The sequence is the one the model decodes at test time (the prompt's transcript and speech as a
prefix, cross-sentence or continuation alike), so the rung measures the test layout, not the
training one. Teacher forcing is defined where a paradigm's decoding fills the target left to
right from the history before it: next-token paradigms (``ar``: each target token from the true
tokens before it) and PALLE's stage one (each span of Eq. 14's schedule, at the paper's 100 steps,
from the true prompt and true frames before the span, every frame after it masked; stage two is
not run). Other masked paradigms predict what is masked from what is not, in an order their own
confidence picks, so there is no single teacher-forced reading of them; they are refused with
that reason.

Chain-of-Details has a reading of its own between rungs 3 and 4, **level-forced**
(:func:`level_forced_testlist`): its coarse-to-fine chain with levels ``1..n`` given as the
target's own tokens (the decimated first quantizer) and the levels after them generated as at
synthesis. With ``n = L - 1`` only the finest level is generated, from the true level below it;
with ``n = L`` nothing is (the rest of the RVQ stack is read from the true first quantizer). The
WER of each ``n`` against the free-running row says which level loses the words.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

log = logging.getLogger(__name__)

TEACHER_FORCED = ("ar", "palle")  # paradigms whose target is filled left to right from the history before it
SPANS_PER_PASS = 16  # PALLE: spans predicted in one batched pass (bounds the [B, S, S] attention)


def teacher_forced_codes(model: Any, text: torch.Tensor, prompt_text: torch.Tensor,
                         prompt_speech: torch.Tensor, target_speech: torch.Tensor) -> tuple[torch.Tensor, float]:
    """Argmax prediction of each target code from the true history, and the share that is right.

    ``text`` / ``prompt_text``: text-unit ids (not offset); ``prompt_speech`` / ``target_speech``:
    codes. The AR layout is ``<sos> x_ref x_gen <turn> c_ref c_gen``; the output at the position
    before each target code predicts it. The argmax is taken over speech codes only (``<eos>``
    is not a frame)."""
    from arnar.paradigms.ar import ar_sequence

    if model.name not in TEACHER_FORCED:
        raise ValueError(f"teacher forcing is defined for paradigms that fill the target left to right {TEACHER_FORCED}; "
                         f"{model.name!r} predicts masked tokens from unmasked ones (no single teacher-forced reading)")
    if model.name == "palle":
        return palle_teacher_forced_codes(model, text, prompt_text, prompt_speech, target_speech)
    vocab = model.vocab
    sequence = ar_sequence(vocab, torch.cat([prompt_text, text]), torch.cat([prompt_speech, target_speech]))[:-1]
    device = model.embed.weight.device
    with torch.no_grad():
        logits = model.logits(sequence[None].to(device), torch.arange(len(sequence), device=device)[None])[0]
    # position i predicts token i + 1; the target codes are the last len(target_speech) tokens
    n = len(target_speech)
    predicting = logits[len(sequence) - n - 1: len(sequence) - 1, vocab.speech_offset:]
    codes = predicting.argmax(-1).cpu()
    accuracy = float((codes == target_speech.long()).float().mean()) if n else 0.0
    return codes, accuracy


def palle_teacher_forced_codes(model: Any, text: torch.Tensor, prompt_text: torch.Tensor,
                               prompt_speech: torch.Tensor, target_speech: torch.Tensor,
                               steps: int = 100) -> tuple[torch.Tensor, float]:
    """PALLE stage one fed the true history: for each span of Eq. 14's schedule (``steps`` passes
    at the fixed ratio, ``T`` = prompt + true target length), the argmax codes of that span from
    the true prompt and the true frames before it, every frame from the span on ``<mask>`` and the
    text as the run's layout reads it (fused: the text stream over the whole length, Eqs. 12-13;
    concat: the text before the speech). Returns the codes of all spans in order and the share
    that is right."""
    from arnar.paradigms.base import MASK
    from arnar.paradigms.palle import stage_input, stage_one_spans

    vocab = model.vocab
    n_prompt, n = len(prompt_speech), len(target_speech)
    if n == 0:
        return torch.zeros(0, dtype=torch.long), 0.0
    total = n_prompt + n
    speech = vocab.speech(torch.cat([prompt_speech, target_speech]))
    full_text = torch.cat([prompt_text, text])
    starts, start = [], n_prompt
    for size in stage_one_spans(n, steps, total):
        starts.append((start, size))
        start += size
    device = next(model.parameters()).device
    codes = torch.empty(n, dtype=torch.long)
    with torch.no_grad():
        for first in range(0, len(starts), SPANS_PER_PASS):
            chunk = starts[first:first + SPANS_PER_PASS]
            frame = torch.arange(total)
            rows = [stage_input(vocab, full_text, torch.where(frame >= s, torch.tensor(MASK), speech), model.layout,
                                model.text_layout, model.readout) for s, _ in chunk]
            offset, width = rows[0][2] - model.readout_shift, len(rows[0][0])
            B = len(chunk)
            text_ids = None if rows[0][1] is None else torch.stack([row[1] for row in rows]).to(device)
            logits = model.logits(torch.stack([row[0] for row in rows]).to(device),
                                  torch.arange(width).expand(B, width).to(device),
                                  torch.ones(B, width, width, dtype=torch.bool, device=device),
                                  text_ids=text_ids, stage=1)
            for b, (s, size) in enumerate(chunk):
                codes[s - n_prompt: s - n_prompt + size] = \
                    logits[b, offset + s:offset + s + size, vocab.speech_offset:].argmax(-1).cpu()
    accuracy = float((codes == target_speech.long()).float().mean())
    return codes, accuracy


def _rung_testlist(synth: Any, testlist: str | os.PathLike, prompts_dir: str | os.PathLike,
                   targets_dir: str | os.PathLike, out_dir: str | os.PathLike, speak: Any, *,
                   summary: dict[str, Any], desc: str, progress: bool) -> dict[str, Any]:
    """The loop both rungs share: for every item of the test list, its text (a continuation item's
    remainder), prompt and true target audio (the ground-truth file after the prompt for a
    continuation item) go to ``speak(item, text, prompt, target) -> (audio, frames, accuracy)``;
    the audio is written as synthesis writes it (a continuation item's prompt in front) and
    ``ladder.json`` gets ``summary`` plus the items and the frame-weighted accuracy."""
    import soundfile as sf
    from tqdm import tqdm

    from arnar.atomic import atomic_path
    from arnar.evaluate.audio import load_mono
    from arnar.evaluate.testlists import read_testlist
    from arnar.synthesize import continuation_text

    items = read_testlist(Path(testlist))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rate = synth.codec.sample_rate
    per_item = []
    for item in tqdm(items, desc=f"{desc} {out.name}", disable=not progress, unit="item"):
        continuing = item.task == "continuation"
        text = continuation_text(item.target_text, item.prompt_text) if continuing else item.target_text
        prompt, _ = synth.read_prompt(Path(prompts_dir) / f"{item.item_id}.wav")
        target_path = Path(targets_dir) / f"{item.item_id}.wav"
        if not target_path.exists():
            raise FileNotFoundError(f"{target_path}: the ground-truth audio of item {item.item_id} does not exist")
        target, _ = load_mono(target_path, rate)
        if continuing:  # the ground-truth file holds prompt + continuation; the model predicts the rest
            target = target[len(prompt):]
        audio, frames, accuracy = speak(item, text, prompt, target)
        if continuing:
            audio = np.concatenate([prompt.astype(np.float32), audio])
        with atomic_path(out / f"{item.item_id}.wav") as tmp:
            sf.write(str(tmp), audio, rate, subtype="PCM_16", format="WAV")
        per_item.append({"item_id": item.item_id, "frames": frames, "accuracy": accuracy})
    frames = sum(r["frames"] for r in per_item)
    summary = {
        **summary,
        "run_dir": str(synth.run_dir),
        "items": len(per_item),
        # frame-weighted: the share of all target frames predicted right
        "accuracy": sum(r["accuracy"] * r["frames"] for r in per_item) / frames if frames else 0.0,
        "per_item": per_item,
    }
    with atomic_path(out / "ladder.json") as tmp:
        tmp.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    log.info("%s %d items -> %s (accuracy %.1f %%)", desc, len(per_item), out, 100 * summary["accuracy"])
    return summary


def teacher_forced_testlist(synth: Any, testlist: str | os.PathLike, prompts_dir: str | os.PathLike,
                            targets_dir: str | os.PathLike, out_dir: str | os.PathLike,
                            progress: bool = True) -> dict[str, Any]:
    """Every item of a test list -> ``out_dir/<item_id>.wav`` decoded from the teacher-forced
    codes (the target part only; a continuation item keeps its prompt audio in front, as
    synthesis does), plus ``ladder.json``: per-item and mean teacher-forced token accuracy.

    ``synth``: an :class:`arnar.synthesize.Synthesizer` (the run, its codec and text units);
    ``targets_dir``: the task's ground-truth system folder (``<item_id>.wav``, prompt included for
    continuation items, as the evaluation reads them)."""
    rate = synth.codec.sample_rate

    def speak(item, text, prompt, target):
        prompt_codes = synth.prompt_codes(prompt)
        target_codes = torch.as_tensor(synth.codec.encode([target], rate)[0][0], dtype=torch.long)
        codes, accuracy = teacher_forced_codes(synth.model, synth.text_ids(text, "text"),
                                               synth.text_ids(item.prompt_text, "prompt text"),
                                               prompt_codes, target_codes)
        audio = synth._decode(codes.numpy()[None].astype(np.int64), prompt, prompt_codes)
        return audio, len(target_codes), accuracy

    return _rung_testlist(synth, testlist, prompts_dir, targets_dir, out_dir, speak,
                          summary={"rung": "teacher_forced"}, desc="teacher-forced", progress=progress)


def level_forced_testlist(synth: Any, testlist: str | os.PathLike, prompts_dir: str | os.PathLike,
                          targets_dir: str | os.PathLike, out_dir: str | os.PathLike, *, forced_levels: int,
                          seed: int = 1234, progress: bool = True) -> dict[str, Any]:
    """A Chain-of-Details run speaks every item of a test list with its levels ``1..forced_levels``
    taken from the item's ground truth (decoding option ``forced_levels``; module docstring) and the
    true target length, each item from its synthesis seed (:func:`arnar.synthesize.item_seed`);
    ``out_dir/<item_id>.wav`` as the synthesis writes it, plus ``ladder.json`` with the share of
    the finest level's first-quantizer codes that are right, per item and frame-weighted."""
    from arnar.synthesize import item_seed

    if synth.model.name != "cod":
        raise ValueError(f"the level-forced rung reads Chain-of-Details' levels; {synth.run_dir} is a "
                         f"{synth.model.name!r} run")
    rate = synth.codec.sample_rate

    def speak(item, text, prompt, target):
        truth = torch.as_tensor(np.asarray(synth.codec.encode([target], rate)[0]), dtype=torch.long)
        first_quantizer = truth.reshape(-1, truth.shape[-1])[0]
        job = synth.prepare(text, prompt, item.prompt_text, rate, target_frames=len(first_quantizer))
        job.request.features["forced_speech"] = first_quantizer
        generator = torch.Generator().manual_seed(item_seed(seed, item.item_id))
        generation = synth.model.generate(job.request, generator, **{**synth.decoding, "forced_levels": forced_levels})
        audio, _ = synth.finish(job, generation, 0.0)
        generated = generation.speech.reshape(-1, generation.speech.shape[-1])[0].cpu()
        return audio, len(first_quantizer), float((generated == first_quantizer).float().mean())

    return _rung_testlist(synth, testlist, prompts_dir, targets_dir, out_dir, speak,
                          summary={"rung": "level_forced", "forced_levels": forced_levels},
                          desc=f"level-forced ({forced_levels})", progress=progress)
