"""Learning curves: what a run says at each of its kept checkpoints, judged like any system.

Dev loss going down is not speech coming out (docs/lab-notes/2026-12-01-to-06-speak-recipe.md:
AR's best speech came from its worst dev loss). A learning curve therefore reads a run's *speech* against
its updates: every kept ``checkpoints/step_<N>.pt`` (the recipe's ``ckpt_every`` and
``keep_checkpoints``; ``speak`` keeps one every 400) and ``final.pt`` speak one frozen test list
with one synthesis seed, and each is scored by the evaluation's own :func:`evaluate_system`
(corpus WER per ASR backend, SIM to the prompt). The dev loss each checkpoint had is read from
the checkpoint itself, so the two curves sit side by side.

This is the diagnostic a paradigm that misses its WER ratio owes (issue 21): is it still
improving at the end of its budget (more updates would help), flat (the recipe is the limit),
or turning (dev loss and WER disagree)?
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)


class CurveError(ValueError):
    """A learning curve that cannot be read (the message names the run or file)."""


def kept_checkpoints(run_dir: str | os.PathLike) -> list[str]:
    """The checkpoint names of a run in update order: each kept ``step_<N>`` and then ``final``
    when the run finished (``final.pt`` holds the weights after the last update)."""
    run_dir = Path(run_dir)
    folder = run_dir / "checkpoints"
    steps = sorted(int(p.stem.split("_", 1)[1]) for p in folder.glob("step_*.pt") if p.stem.split("_", 1)[1].isdigit())
    names = [f"step_{n}" for n in steps] + (["final"] if (run_dir / "final.pt").is_file() else [])
    if not names:
        raise CurveError(f"{run_dir}: no kept checkpoints (checkpoints/step_<N>.pt) and no final.pt")
    return names


def checkpoint_facts(run_dir: str | os.PathLike, name: str) -> dict[str, Any]:
    """``{"step", "dev_loss"}`` of one checkpoint. A training checkpoint (``step_<N>``) carries the
    dev loss last measured at or before its update; ``final.pt`` (weights only) its step alone, so
    its dev loss is the run summary's, where the caller has it."""
    from arnar.train.checkpoints import checkpoint_path

    path = checkpoint_path(run_dir, name)
    if not path.is_file():
        raise CurveError(f"{path}: no such checkpoint")
    try:
        record = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:  # noqa: BLE001 - any unpickling failure means a bad file
        raise CurveError(f"{path}: unreadable checkpoint ({err})") from None
    if not isinstance(record, dict) or "step" not in record:
        raise CurveError(f"{path}: not a checkpoint of this project (no step)")
    return {"step": int(record["step"]), "dev_loss": record.get("dev_loss")}


def curve_table(rows: Sequence[Mapping[str, Any]], backends: Sequence[str]) -> str:
    """Markdown: one row per checkpoint, updates / dev loss / WER per backend (percent, as
    :func:`evaluate_system` reports it) / SIM."""
    head = ["checkpoint", "updates", "dev loss"] + [f"WER {b}" for b in backends] + ["SIM"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        dev = "—" if row.get("dev_loss") is None else f"{row['dev_loss']:.3f}"
        wers = [f"{row['wer'][b]:.1f} %" for b in backends]
        sim = "—" if row.get("sim") is None else f"{row['sim']:.3f}"
        lines.append("| " + " | ".join([row["checkpoint"], str(row["step"]), dev] + wers + [sim]) + " |")
    return "\n".join(lines) + "\n"


def learning_curve(run_dir: str | os.PathLike, checkpoints: Sequence[str] | None, *,
                   speak: Callable[[str, Path], None], judge: Callable[[str, Path, Path], dict[str, Any]],
                   out_dir: str | os.PathLike, final_dev_loss: float | None = None,
                   best_dev_loss: float | None = None) -> list[dict[str, Any]]:
    """Every checkpoint speaks (``speak(name, wav_dir)``) and is judged (``judge(name, wav_dir,
    json_path)`` -> :func:`evaluate_system`'s result); ``final_dev_loss`` / ``best_dev_loss``
    (the run summary's) stand in for the dev loss of ``final`` / ``best``, which hold weights only; returns one row per checkpoint and writes
    ``curve.json`` and ``curve.md`` under ``out_dir``. A checkpoint already spoken and judged
    (its ``<name>/eval.json`` exists) is read back, so an interrupted curve resumes."""
    out_dir = Path(out_dir)
    names = list(checkpoints) if checkpoints else kept_checkpoints(run_dir)
    rows: list[dict[str, Any]] = []
    backends: list[str] = []
    for i, name in enumerate(names, 1):
        facts = checkpoint_facts(run_dir, name)
        if facts["dev_loss"] is None:  # weights-only files: the run summary's figures
            facts["dev_loss"] = {"final": final_dev_loss, "best": best_dev_loss}.get(name)
        wav_dir, result_path = out_dir / name / "wavs", out_dir / name / "eval.json"
        if result_path.is_file():
            result = json.loads(result_path.read_text())
        else:
            log.info("learning curve %s: checkpoint %d/%d (%s, update %d)", run_dir, i, len(names), name, facts["step"])
            speak(name, wav_dir)
            result = judge(name, wav_dir, result_path)
        backends = list(result["asr"])
        rows.append({"checkpoint": name, **facts,
                     "wer": {b: result["asr"][b]["wer_corpus"] for b in backends},
                     "sim": (result.get("sim") or {}).get("mean")})
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "curve.json").write_text(json.dumps({"run_dir": str(run_dir), "rows": rows}, indent=2) + "\n")
    (out_dir / "curve.md").write_text(curve_table(rows, backends))
    return rows
