"""The ablation grids of the papers, one axis each, and how a grid value becomes a system.

``params.yaml`` lists the values of each axis under ``training.grids`` (reduced grids in ``mini``,
the papers' grids in ``libritts``). An axis either

* varies a **decoding option** of an already trained run: every value is one more evaluated
  system of the same checkpoint (no retraining), or
* varies a **training-time option**: every value is one more training run (and its system).

The run registry (:mod:`arnar.runs`, read by the DAG) turns each value into a system name with
:func:`grid_system` and the report (:mod:`arnar.report`) draws each axis as its paper's table
or curve from the same definitions, so names and settings cannot drift apart.

The value equal to an axis' default *is* the paradigm's main system (e.g. DELTA with 16 steps is
``delta``): it is not trained or synthesized twice. Axes with ``shared`` options (PALLE's
duration multiplier scales the ground-truth duration) give the default value its own system too.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from arnar.paradigms.cod import DECODING as COD_DECODING
from arnar.paradigms.palle import DECODING as PALLE_DECODING


@dataclass(frozen=True)
class Grid:
    name: str  # the key under training.grids
    paradigm: str  # the paradigm it varies (must be listed in training.paradigms)
    base: str  # evaluated system at the default value (a row of the comparison)
    default: Any
    label: str  # the axis as the paper writes it (column header)
    source: str  # the paper's table or figure
    title: str
    short: str  # system name = f"{base}_{short}{value}"
    decoding: str | None = None  # decoding option the axis sets (inference-only axes)
    override: str | None = None  # Hydra override of the base run (training-time axes)
    config_of: dict = field(default_factory=dict)  # training-time axes that switch paradigm configs
    shared: dict = field(default_factory=dict)  # decoding options every value of the axis gets
    plot: bool = False  # drawn as a curve (the paper shows a figure, not a table)

    @property
    def training(self) -> bool:
        return self.decoding is None


GRIDS = {g.name: g for g in [
    Grid("syncspeech_q", "syncspeech", "syncspeech", 1, "q (look-ahead)", "SyncSpeech (arXiv:2502.11094) Table 4",
         "SyncSpeech: look-ahead text tokens", "q", override="paradigm.options.q"),
    Grid("syncspeech_duration_top_k", "syncspeech", "syncspeech", 3, "Duration top-k", "SyncSpeech (arXiv:2502.11094) Table 3",
         "SyncSpeech: duration top-k (1 = greedy)", "dtopk", decoding="duration_top_k"),
    Grid("syncspeech_speech_top_k", "syncspeech", "syncspeech", 1, "Speech-token top-k", "SyncSpeech (arXiv:2502.11094) Table 3",
         "SyncSpeech: speech-token top-k (1 = greedy)", "stopk", decoding="speech_top_k"),
    Grid("cod_levels", "cod", "cod", 3, "Levels", "Chain-of-Details (arXiv:2604.19330) Table IV",
         "Chain-of-Details: temporal levels", "l", config_of={1: "cod_l1", 2: "cod_l2", 3: "cod"}),
    # Chain-of-Details (arXiv:2604.19330) Sec. IV-B (Inference details) says only "we decrease the guidance level linearly
    # from 3 to 0.75", not how w combines the conditional (c) and unconditional (u) logits: extrapolate
    # c + w (c - u) (still pushes away from u at 0.75) or interpolate u + w (c - u) (w = 1 is plain c).
    # Both decode the trained `cod` run. The default value (the `cod` row) is cod.py's own default, read
    # from DECODING, so the row names follow when that default is changed after a measured run.
    Grid("cod_guidance_form", "cod", "cod", COD_DECODING["guidance_form"], "CFG form (w: 3 -> 0.75)",
         "Chain-of-Details (arXiv:2604.19330) Sec. IV-B", "Chain-of-Details: guidance form (extrapolate c + w(c - u), "
         "interpolate u + w(c - u))", "guidance_", decoding="guidance_form"),
    Grid("delta_steps", "delta", "delta", 16, "Steps", "DELTA-TTS (OpenReview v2DbAIl7sf) Fig. 2",
         "DELTA-TTS: unmasking steps", "steps", decoding="steps", plot=True),
    Grid("delta_mu", "delta", "delta", 0.3, "Schedule mu (1 = uniform)", "DELTA-TTS (OpenReview v2DbAIl7sf) Table 5, Eq. 3",
         "DELTA-TTS: time-shifted schedule", "mu", decoding="mu"),
    Grid("palle_stage1_steps", "palle", "palle", 100, "Stage-one steps", "PALLE (arXiv:2504.10352) Fig. 4 (a, b)",
         "PALLE: stage-one inference steps", "s1steps", decoding="steps", plot=True),
    Grid("palle_stage2_steps", "palle", "palle", 7, "Stage-two steps", "PALLE (arXiv:2504.10352) Fig. 4 (c, d)",
         "PALLE: stage-two inference steps", "s2steps", decoding="refine_steps", plot=True),
    # PALLE (arXiv:2504.10352) Eqs. 15-16: every refinement step the stage-two network scores the current sequence
    # ("rescore", the default, read from palle.py) against the project's earlier rule, which walked
    # the frames stage one committed with the least confidence (issue 22 item 1: before / after)
    Grid("palle_refine_rule", "palle", "palle", PALLE_DECODING["refine_rule"], "Refinement rule",
         "PALLE (arXiv:2504.10352) Eqs. 15-16", "PALLE: stage-two refinement rule (rescore: stage two scores the current "
         "sequence each step; stage_one_confidence: stage one's confidences, fixed in advance)", "refine_",
         decoding="refine_rule"),
    # Fig. 5 scales the ground-truth duration, so every value (1.0 included) decodes with it
    Grid("palle_duration", "palle", "palle", 1.0, "Duration multiplier", "PALLE (arXiv:2504.10352) Fig. 5",
         "PALLE: total duration multiplier (x ground-truth duration)", "dur", decoding="duration_multiplier",
         shared={"target_duration": "ground_truth"}, plot=True),
]}


def value_name(value: Any) -> str:
    """A grid value as it appears in a system name: 8 -> '8', 0.3 -> '0.3', 1.0 -> '1.0',
    'interpolate' -> 'interpolate' (a string is its own name, lower case)."""
    return str(value).lower()


def grid_system(grid: Grid, value: Any) -> str:
    """The evaluated system of one grid value (the base system at the default, unless shared)."""
    if value == grid.default and not grid.shared:
        return grid.base
    if grid.config_of and value in grid.config_of and grid.config_of[value] != grid.base:
        return grid.config_of[value]  # CoD keeps the names of its Table IV configs: cod_l1, cod_l2
    return f"{grid.base}_{grid.short}{value_name(value)}"


def grid_rows(name: str, values: list) -> list[tuple[Any, str]]:
    """(value, system) of an axis in the order params.yaml lists them."""
    grid = GRIDS[name]
    return [(value, grid_system(grid, value)) for value in values]


def check_grid_values(name: str, values: list) -> None:
    """Values a config may give an axis; raises ValueError naming the key."""
    if name not in GRIDS:
        raise ValueError(f"training.grids.{name}: unknown axis; known: {sorted(GRIDS)}")
    grid = GRIDS[name]
    if grid.config_of and any(v not in grid.config_of for v in values):
        raise ValueError(f"training.grids.{name}: values must be among {sorted(grid.config_of)}, got {values}")
    if len(set(map(value_name, values))) != len(values):
        raise ValueError(f"training.grids.{name}: repeated value in {values}")
