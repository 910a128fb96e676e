"""The training config (Hydra's compose API over ``arnar/conf``), the learning-rate schedule and
the engine's error."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf


CONF_DIR = Path(__file__).resolve().parent.parent / "conf"


class TrainError(RuntimeError):
    """A run that cannot start or continue as asked (the message says why and what to do)."""


def compose_config(overrides: Sequence[str] = ()) -> DictConfig:
    """The training config: ``arnar/conf/config.yaml`` with Hydra ``overrides`` such as
    ``["paradigm=nar", "model=small", "train=mini", "train.lr=3e-4"]``."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():  # a previous compose in this process
        GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3", job_name="arnar_train"):
        return compose(config_name="config", overrides=list(overrides))


def learning_rate(step: int, *, lr: float, warmup_steps: int, max_steps: int, min_lr_ratio: float = 0.1) -> float:
    """Learning rate of update ``step`` (0-based): linear warm-up ``lr * (step + 1) / warmup_steps``
    over the first ``warmup_steps`` updates (so the first update is not taken at lr 0), then a
    cosine from ``lr`` down to ``min_lr_ratio * lr`` at ``max_steps``, held there after."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    progress = min(1.0, (step - warmup_steps) / max(1, max_steps - warmup_steps))
    floor = min_lr_ratio * lr
    return floor + 0.5 * (lr - floor) * (1.0 + math.cos(math.pi * progress))


# Settings a run can take that none of the papers uses, each with the papers' value. A run that
# leaves one of them says so in its summary and the report's training table, so that an
# embedded-profile recipe (docs/lab-notes/2026-12-01-to-06-speak-recipe.md) is never read as
# the paper's.
NOT_IN_THE_PAPERS: dict[str, Any] = {
    "data.prompt_pairs": 0.0,                   # the papers train on single utterances
    "paradigm.options.input_noise": 0.0,        # AR, NAR and SyncSpeech read true tokens (teacher forcing)
    "paradigm.options.finetune_spans": "one",   # SyncSpeech Eq. 3: one masked span per sequence
    "paradigm.options.text_positions": "sequence",  # NAR, CoD: one running position range
    "paradigm.options.text_layout": "pad",      # PALLE: the text padded to the speech length (Eqs. 6, 13)
    "paradigm.options.span_scoring": "left_most",  # PALLE Eq. 9: the loss on the left-most 10 % span
    "paradigm.options.layout": "fused",         # PALLE Fig. 3a: text fused along the features (concat: its Discussion's alternative)
    "paradigm.options.readout": "own",          # PALLE: each masked position predicts its own frame
    "train.init_matching": False,               # a run starts from another paradigm's weights (start_from_ar)
}
# the papers' text units: Chain-of-Details reads phonemes, every other paper BPE
PAPER_TEXT_UNITS = {"cod": "phonemes"}


def departures_from_papers(cfg: DictConfig, text_units: str) -> dict[str, Any]:
    """The settings of ``cfg`` (and its ``text_units``, ``"bpe"`` or ``"phonemes"``) that differ
    from the papers' recipe, as ``{key: value}`` (empty for a run the papers would recognise)."""
    departures: dict[str, Any] = {}
    for key, paper_value in NOT_IN_THE_PAPERS.items():
        value = OmegaConf.select(cfg, key, default=paper_value)
        if value != paper_value:
            departures[key] = value
    paper_units = PAPER_TEXT_UNITS.get(str(cfg.paradigm.name), "bpe")
    if text_units != paper_units:
        departures["text_units"] = text_units
    return departures


def _options(cfg: DictConfig) -> dict[str, Any]:
    options = cfg.paradigm.get("options")
    return dict(OmegaConf.to_container(options, resolve=True)) if options else {}


PRECISIONS = ("auto", "bf16", "bf16_if_native", "fp32")


def cpu_computes_bf16_natively(cpuinfo: str | None = None) -> bool:
    """Whether this CPU has the bf16 matrix instructions oneDNN uses (x86 AVX-512 BF16 or AMX BF16,
    read from ``/proc/cpuinfo``'s flags). Without them bf16 autocast is emulated: on an AVX2-only
    AMD EPYC one update of the small model took 6.7-7.5 s in bf16 against 0.71 s in float32
    (bench/train_precision.py, 2026-12-06), where AVX-512 BF16 made it 1.4-1.6x faster than float32.
    Not Linux on x86 (no such file or flags): False, so such a machine trains in float32."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            return False
    flags: set[str] = set()
    for line in cpuinfo.splitlines():
        if line.startswith("flags"):
            flags.update(line.partition(":")[2].split())
    return bool(flags & {"avx512_bf16", "amx_bf16"})


def host_record(cpuinfo: str | None = None) -> dict[str, Any]:
    """The machine a run's numbers came from, for its summary: the CPU's model name and
    family/model/stepping (``/proc/cpuinfo``), the instruction set torch's CPU kernels picked, and
    torch's version. Two runs of one seed give the same digits only where these agree (issue 55:
    two AVX-512 BF16 hosts of one CPU model reproduced each other's losses and WERs exactly; a run
    on another host did not), so a reader comparing two summaries can tell noise from a change."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            cpuinfo = ""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key in ("model name", "cpu family", "model", "stepping") and key not in fields:
            fields[key] = value.strip()
    try:
        capability = torch.backends.cpu.get_cpu_capability()
    except AttributeError:  # an older torch
        capability = None
    return {
        "cpu": fields.get("model name"),
        "cpu_family_model_stepping": "/".join(fields.get(k, "?") for k in ("cpu family", "model", "stepping"))
        if fields else None,
        "bf16_instructions": cpu_computes_bf16_natively(cpuinfo) if cpuinfo else None,
        "torch_cpu_capability": capability,
        "torch": torch.__version__,
    }


def _autocast_dtype(precision: str, device: torch.device, *, native_bf16: bool | None = None) -> torch.dtype | None:
    """The autocast dtype of ``train.precision`` on ``device`` (None: float32).

    ``auto``            bf16 on CUDA, float32 on a CPU (a CPU run reproduces its float32 numbers);
    ``bf16``            bf16 on any device, a CPU included (emulated, so ~10x slower, on a CPU
                        without bf16 instructions: see :func:`cpu_computes_bf16_natively`);
    ``bf16_if_native``  bf16 on CUDA and on a CPU with bf16 instructions, float32 on any other CPU:
                        the speed of bf16 where the hardware has it, without a tenfold slowdown where
                        it does not. The two kinds of CPU then train different numbers (the run's
                        summary records the precision it used);
    ``fp32``            float32 everywhere.
    ``native_bf16``: the CPU probe's answer when the caller already has it (None: probe here)."""
    if precision not in PRECISIONS:
        raise TrainError(f"train.precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    if device.type == "cuda":
        return None if precision == "fp32" else torch.bfloat16
    if precision == "bf16_if_native":
        native = cpu_computes_bf16_natively() if native_bf16 is None else native_bf16
        return torch.bfloat16 if native else None
    return torch.bfloat16 if precision == "bf16" else None
