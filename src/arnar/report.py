"""The report: paper-format Markdown tables, plots, a metrics file for DVC, an HTML page with audio.

Inputs are the evaluation results (``results/<profile>/eval/<system>/<task>.json`` and the
ground-truth audit); nothing is recomputed here, except the per-item word errors of an evaluation
written before its JSON carried them (from its utterance TSV, :func:`load_results`). The
comparison table follows PALLE (arXiv:2504.10352) Table 3: one row per system (reference rows
first), per task the WER of every ASR backend under both conventions, SIM, and the speed
columns; a dash where a system has no value (the ground truth has no generation time).
"""

from __future__ import annotations

import html
import json
import logging
import math
import shutil
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import matplotlib

matplotlib.use("Agg")  # files only; no display on these machines
import matplotlib.pyplot as plt  # noqa: E402

from arnar.ablations import GRIDS, grid_rows, value_name  # noqa: E402
from arnar.atomic import atomic_path, write_text  # noqa: E402
from arnar.evaluate.bootstrap import paired_bootstrap_wer_difference  # noqa: E402
from arnar.evaluate.testlists import TASKS, read_testlist  # noqa: E402

log = logging.getLogger(__name__)

TASK_TITLES = {"continuation": "Continuation", "cross_sentence": "Cross-sentence"}
ASR_SHORT = {"whisper": "W", "hubert": "H", "pocketsphinx": "P", "moonshine": "M",
             "faster_whisper": "FW"}  # WER-W / WER-H as in PALLE


def _fmt(value, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _save(fig, path: Path) -> None:
    """A figure, written atomically (the temporary name keeps the extension matplotlib reads)."""
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)


@dataclass
class Layout:
    """What the report knows of the systems (built by the DAG, ``workflow/rules/runs.smk``):
    reference rows; the comparison's systems, each with its seed replicas (itself first); the
    grids' values (:mod:`arnar.ablations`); named ablations; each system's training run; the
    tasks of systems that do not speak every task."""

    references: list[str]
    comparison: dict[str, list[str]]
    grids: dict[str, list] = field(default_factory=dict)
    ablations: list[str] = field(default_factory=list)
    runs: dict[str, str] = field(default_factory=dict)
    tasks: dict[str, list[str]] = field(default_factory=dict)
    lineages: dict[str, list[str]] = field(default_factory=dict)  # run -> the runs its weights come from, it last
    # system -> the reference row of its own decoding path (the codec resynthesis of the tokens it
    # models: the single stream, or the stack's first quantizer for CoD), its intelligibility ceiling
    ceilings: dict[str, str] = field(default_factory=dict)
    # the comparison's rows in this order (training.paradigms'), the others after them: the JSON
    # the DAG passes has its keys sorted, so the comparison mapping alone arrives alphabetical
    order: list[str] = field(default_factory=list)

    def __post_init__(self):
        if self.order:
            ordered = {s: self.comparison[s] for s in self.order if s in self.comparison}
            ordered.update({s: r for s, r in self.comparison.items() if s not in ordered})
            object.__setattr__(self, "comparison", ordered)

    @classmethod
    def plain(cls, systems: Sequence[str]) -> "Layout":
        """Without a layout: every system a row of its own, one seed, every task."""
        return cls(references=[], comparison={s: [s] for s in systems})

    def tasks_of(self, system: str) -> list[str]:
        return self.tasks.get(system, list(TASKS))


def load_results(eval_dir: Path, systems: Sequence[str], layout: Layout | None = None,
                 testlist_dir: Path | None = None) -> dict[str, dict[str, dict]]:
    """``results[system][task]``: the evaluation of every task each system speaks. With
    ``testlist_dir``, an evaluation whose headline judge has no ``per_item`` errors (written before
    the JSON carried them) gets them recomputed from its utterance TSV beside it
    (``<system>/<task>_utterances.tsv``), so that a committed run is re-reported without
    re-evaluating it; without the TSV it stays without (its WER claims then have no interval)."""
    from arnar.evaluate.run import per_item_errors_from_utterances

    layout = layout or Layout.plain(systems)
    lists: dict[str, list] = {}
    results = {}
    for system in systems:
        results[system] = {}
        for task in layout.tasks_of(system):
            path = eval_dir / system / f"{task}.json"
            if not path.exists():
                raise FileNotFoundError(f"{path}: evaluation result missing for system {system!r}")
            result = json.loads(path.read_text(encoding="utf-8"))
            name, judge_result = next(iter(result["asr"].items()))
            utterances = eval_dir / system / f"{task}_utterances.tsv"
            if "per_item" not in judge_result and testlist_dir is not None:
                if utterances.exists():
                    if task not in lists:
                        lists[task] = read_testlist(Path(testlist_dir) / f"{task}.tsv")
                    judge_result["per_item"] = per_item_errors_from_utterances(utterances, lists[task], name)
                else:
                    log.warning("%s: no per-item errors and no %s: its WER claims get no interval", path, utterances)
            results[system][task] = result
    return results


# --- numbers over seeds -------------------------------------------------------------------------


@dataclass(frozen=True)
class Stat:
    """A metric over the synthesis seeds of one system: mean, sample standard deviation (None
    for a single seed) and the number of seeds."""

    mean: float
    sd: float | None
    n: int

    @classmethod
    def of(cls, values: Sequence[float]) -> "Stat | None":
        values = [v for v in values if v is not None]
        if not values:
            return None
        sd = float(statistics.stdev(values)) if len(values) > 1 else None
        return cls(float(statistics.fmean(values)), sd, len(values))

    def format(self, digits: int = 2) -> str:
        if self.sd is None:
            return f"{self.mean:.{digits}f}"
        return f"{self.mean:.{digits}f} ± {self.sd:.{digits}f}"


def first_asr(r: dict) -> dict:
    return next(iter(r["asr"].values()))


def item_errors(r: dict) -> dict[str, tuple[int, int]] | None:
    """item id -> (errors, reference words) of the headline judge (the one :data:`METRICS` reads
    WER from), in test-list order; None for an evaluation without per-item numbers."""
    items = first_asr(r).get("per_item")
    if items is None:
        return None
    return {i: (e, w) for i, e, w in zip(items["item_ids"], items["errors"], items["ref_words"])}


METRICS = {  # name -> how to read it from one evaluation result
    "wer": lambda r: first_asr(r)["wer_corpus"],
    "sim": lambda r: r["sim"]["mean"],
    "rtf": lambda r: (r.get("speed") or {}).get("rtf_token_stage"),
    "fpl_l": lambda r: (r.get("speed") or {}).get("fpl_l"),
    "passes": lambda r: (r.get("speed") or {}).get("forward_passes"),
}


def stat(results: dict, replicas: Sequence[str], task: str, read) -> Stat | None:
    return Stat.of([read(results[s][task]) for s in replicas if s in results and task in results[s]])


# What comparison rows are where their names alone do not say it: a project variant beside the
# paper's own system. Each group is a line under every task's table when two or more of its rows
# are there (naming those).
ROW_NOTES = [
    {"cod": "this project's CoD (the prompt's tokens as an unmasked prefix, besides the adaLN speaker embedding; "
            "the finest level yields every codebook of the RVQ stack)",
     "cod_paper": "the paper's CoD (voice from the adaLN speaker embedding only; Chain-of-Details (arXiv:2604.19330) Sec. IV-A, Fig. 2)",
     "cod_q1": "this project's CoD generating the first quantizer alone, which the codec decodes on its own "
               "(reference row: the first quantizer's resynthesis)",
     "cod_single": "this project's CoD on the single token stream the other paradigms model (levels decimate it; "
                   "reference row: its resynthesis)"},
    {"palle_stage1": "PALLE stage one, the paper's network (text fused with speech along the features, Fig. 3a)",
     "palle": "PALLE, both stages, the paper's network",
     "palle_concat_stage1": "PALLE stage one on the temporal-concatenation layout (text then speech, AR's layout, "
                            "which the paper's Discussion allows; starts from AR where training.start_from_ar lists it)",
     "palle_concat": "PALLE, both stages, on the temporal-concatenation layout"},
]


def comparison_table(results: dict[str, dict[str, dict]], layout: Layout | None = None,
                     parameters: dict[str, float] | None = None,
                     summaries: dict[str, dict] | None = None) -> str:
    """One Markdown table per task in the columns of PALLE (arXiv:2504.10352) Table 3: reference rows, then every
    paradigm's system with mean ± standard deviation over its synthesis seeds."""
    layout = layout or Layout.plain(list(results))
    parameters = parameters or {}
    rows = [(s, [s]) for s in layout.references] + list(layout.comparison.items())
    first = results[rows[0][0]][TASKS[0]]
    asr_names = list(first["asr"])
    seeds = max(len(replicas) for _, replicas in rows)
    lines = []
    for task in TASKS:
        header = ["System", "Params"]
        for name in asr_names:
            short = ASR_SHORT.get(name, name)
            header += [f"WER-{short} utt-mean (%) ↓", f"WER-{short} corpus (%) ↓"]
        header += ["SIM ↑", "MOS ↑", "RTF token ↓", "RTF e2e ↓", "FPL-A (s) ↓", "1st packet decode (s) ↓",
                   "FPL-L (s) ↓", "Passes", "Missing"]
        lines += [f"### {TASK_TITLES[task]}", "", "| " + " | ".join(header) + " |",
                  "|" + "|".join("---" for _ in header) + "|"]
        for system, replicas in rows:
            def cell(read, digits=2, spread=True):
                value = stat(results, replicas, task, read)
                if value is None:
                    return "–"
                return value.format(digits) if spread else _fmt(value.mean, digits)

            params = parameters.get(layout.runs.get(system, system))
            row = [system, "–" if params is None else f"{params / 1e6:.2f}M"]
            for name in asr_names:
                # a later seed may lack a cross-checking judge (evaluation.extra_asr_seeds: first)
                row += [cell(lambda r, n=name: r["asr"].get(n, {}).get("wer_utterance_mean")),
                        cell(lambda r, n=name: r["asr"].get(n, {}).get("wer_corpus"))]
            row += [
                cell(METRICS["sim"], 3),
                cell(lambda r: (r.get("mos") or {}).get("mean")),
                cell(METRICS["rtf"], 3, spread=False),
                cell(lambda r: (r.get("speed") or {}).get("rtf_end_to_end"), 3, spread=False),
                cell(lambda r: (r.get("speed") or {}).get("fpl_a"), 3, spread=False),
                cell(lambda r: (r.get("speed") or {}).get("first_packet_decode"), 3, spread=False),
                cell(METRICS["fpl_l"], 3, spread=False),
                cell(METRICS["passes"], 1, spread=False),
                str(sum(len(results[s][task]["missing"]) for s in replicas)),
            ]
            lines.append("| " + " | ".join(row) + " |")
        models = ", ".join(f"{n}: {first['asr'][n]['model']}{judge_fingerprint(first['asr'][n])}" for n in asr_names)
        mos_note = mos_caption(results, task) + timing_caption(results, task) + judge_seeds_caption(results, layout, task)
        once = [s for s, replicas in layout.comparison.items() if len(replicas) == 1]
        seeds_note = (f" Paradigm rows: mean ± standard deviation over {seeds} synthesis seeds (speed columns: mean)"
                      + (f"; {', '.join(f'`{s}`' for s in once)} spoke once: its decoding draws nothing from the "
                         "seed (greedy), so every seed gives the same audio." if once else ".")
                      if seeds > 1 else "")
        present = {s for s, _ in rows}
        notes = ["; ".join(f"`{s}`: {text}" for s, text in group.items() if s in present) + "."
                 for group in ROW_NOTES if len(set(group) & present) >= 2]
        budget = budget_note([s for s, _ in rows], layout, summaries or {})
        lines += ["", f"{first['items']} items. ASR {models}; SIM {first['sim']['backend']} "
                      f"({first['sim']['model']}), {first['sim']['reference']}.{mos_note}{seeds_note}",
                  *([""] + notes if notes else []), *(["", budget] if budget else []), ""]
    return "\n".join(lines)


MOS_TITLES = {"p808": "P.808", "sig": "P.835 SIG", "bak": "P.835 BAK", "ovrl": "P.835 OVRL", "mos": "MOS"}


def judge_seeds_caption(results: dict[str, dict[str, dict]], layout: "Layout", task: str) -> str:
    """`` pocketsphinx judged the first synthesis seed only ...``: the judges that heard fewer of a
    paradigm row's seeds than the headline judge did (evaluation.extra_asr_seeds: first), so that
    their columns carry no ± and are read as one seed's figure."""
    def judged(replicas: Sequence[str], name: str) -> int:
        return sum(1 for s in replicas if name in ((results.get(s) or {}).get(task) or {}).get("asr", {}))

    partial = set()
    for replicas in layout.comparison.values():
        present = [s for s in replicas if task in (results.get(s) or {})]
        if len(present) < 2:
            continue
        headline = judged(present, next(iter(results[present[0]][task]["asr"])))
        partial |= {name for name in results[present[0]][task]["asr"] if judged(present, name) < headline}
    if not partial:
        return ""
    names = ", ".join(sorted(partial))
    return (f" {names}: each paradigm row's first synthesis seed only (a cross-check of the headline "
            f"judge; its columns carry no ± over seeds).")


def timing_caption(results: dict[str, dict[str, dict]], task: str) -> str:
    """`` Speed columns: the 8 of 20 items decoded alone (batch 1) ...``: how many items timed the
    speed columns, where the rest were decoded in batches (evaluation.timing_items)."""
    counts = {(r[task]["speed"]["items_timed"], r[task]["items"]) for r in results.values()
              if "items_timed" in ((r.get(task) or {}).get("speed") or {})}
    if not counts or all(timed == items for timed, items in counts):
        return ""
    timed = ", ".join(sorted({str(t) for t, _ in counts}, key=int))
    items = ", ".join(sorted({str(n) for _, n in counts}, key=int))
    return (f" Speed columns (RTF, FPL, passes): the {timed} of {items} items of each list decoded alone (batch 1); "
            "the rest were decoded in batches for the other columns (the same audio).")


def mos_caption(results: dict[str, dict[str, dict]], task: str) -> str:
    """`` MOS: dnsmos P.808 (model).``: what the MOS column holds, from the first row that has it."""
    for tasks in results.values():
        mos = (tasks.get(task) or {}).get("mos")
        if mos:
            title = MOS_TITLES.get(mos.get("headline", ""), mos.get("headline", "mean"))
            return f" MOS: {mos['backend']} {title} ({mos.get('model', 'model not recorded')})."
    return ""


@dataclass(frozen=True)
class Budget:
    """A system's training: updates and tokens seen, summed over the runs its weights come from."""

    updates: int
    tokens: float | None  # None where a summary predates tokens_seen
    parts: tuple[tuple[str, int], ...]  # (run, updates) in training order


def system_budget(system: str, layout: Layout, summaries: dict[str, dict]) -> Budget | None:
    """The training budget of an evaluated system (None for reference rows or missing summaries)."""
    run = layout.runs.get(system)
    if run is None:
        return None
    lineage = layout.lineages.get(run, [run])
    if any(r not in summaries for r in lineage):
        return None
    tokens = [summaries[r].get("tokens_seen") for r in lineage]
    return Budget(updates=sum(int(summaries[r]["steps"]) for r in lineage),
                  tokens=None if None in tokens else float(sum(tokens)),
                  parts=tuple((r, int(summaries[r]["steps"])) for r in lineage))


def budget_note(systems: Sequence[str], layout: Layout, summaries: dict[str, dict]) -> str:
    """The caption line that states every row's training budget and says whether they are equal
    (a table compares recipes fairly only at one budget; issue 21): updates summed over the runs
    each system's weights come from, tokens seen in those updates (the batch is in tokens)."""
    budgets = {s: b for s in systems if (b := system_budget(s, layout, summaries)) is not None}
    if not budgets:
        return ""

    def one(system: str, b: Budget) -> str:
        chain = "" if len(b.parts) == 1 else " (" + " + ".join(f"`{r}` {n}" for r, n in b.parts) + ")"
        tokens = "" if b.tokens is None else f", {b.tokens / 1e6:.2f}M tokens"
        return f"`{system}` {b.updates}{chain}{tokens}"

    low, high = min(b.updates for b in budgets.values()), max(b.updates for b in budgets.values())
    verdict = (f"Every row trained for {low} updates." if low == high else
               f"Budgets are not equal: {low} to {high} updates ({high / low:.2f}x); a row with more updates "
               "had more training, not only a different recipe.")
    return ("Training budget (updates summed over the runs each system's weights come from; tokens seen): "
            + "; ".join(one(s, b) for s, b in budgets.items()) + ". " + verdict)


def judge_fingerprint(asr_result: dict) -> str:
    """`` (sha256 abcdef123456)``: one digest over the judge's weight files, so two reports are
    compared only when their judges match (empty where the files are in a hub cache)."""
    import hashlib

    files = asr_result.get("model_sha256") or {}
    if not files:
        return ""
    digest = hashlib.sha256("".join(f"{k}={v};" for k, v in sorted(files.items())).encode()).hexdigest()
    return f" (weights sha256 {digest[:12]})"


def voice_group_table(results: dict[str, dict[str, dict]], layout: Layout | None = None) -> str:
    """WER (first ASR backend, corpus-level) and SIM per voice group and per voice, for the
    reference rows and the comparison, each task: a voice no training speaker uses is the real
    zero-shot case; a pitch/tempo variant of a training voice is an easier one."""
    layout = layout or Layout.plain(list(results))
    rows = [(s, [s]) for s in layout.references] + list(layout.comparison.items())
    first = results[rows[0][0]][TASKS[0]]
    asr_name = next(iter(first["asr"]))
    groups = sorted(first["asr"][asr_name].get("per_voice_group") or {})
    voices = sorted(first["asr"][asr_name].get("per_voice") or {})
    if not groups:
        return ""
    short = ASR_SHORT.get(asr_name, asr_name)
    lines = ["## Per voice group", "",
             f"WER-{short} corpus (%) / SIM to the prompt / MOS (where measured) per voice group and per test voice (mean ± sd over "
             "synthesis seeds where a row has several). *seen voice*: a held-out speaker whose synthesizer "
             "voice a training speaker has (a pitch/tempo variant); *unseen voice*: a voice no training "
             "speaker uses.", ""]
    has_mos = any((r.get(t) or {}).get("mos") for r in results.values() for t in TASKS)
    mos_groups = groups if has_mos else []
    for task in TASKS:
        header = (["System"] + [f"{g} WER" for g in groups] + [f"{g} SIM" for g in groups]
                  + [f"{g} MOS" for g in mos_groups] + voices)
        lines += [f"### {TASK_TITLES[task]}", "", "| " + " | ".join(header) + " |",
                  "|" + "|".join("---" for _ in header) + "|"]
        for system, replicas in rows:
            def cell(read, digits=2):
                value = stat(results, replicas, task, read)
                return "–" if value is None else value.format(digits)

            row = [system]
            row += [cell(lambda r, g=g: ((r["asr"][asr_name].get("per_voice_group") or {}).get(g) or {}).get("wer_corpus"))
                    for g in groups]
            row += [cell(lambda r, g=g: (r["sim"].get("per_voice_group") or {}).get(g), 3) for g in groups]
            row += [cell(lambda r, g=g: ((r.get("mos") or {}).get("per_voice_group") or {}).get(g)) for g in mos_groups]
            row += [cell(lambda r, v=v: ((r["asr"][asr_name].get("per_voice") or {}).get(v) or {}).get("wer_corpus"))
                    for v in voices]
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    return "\n".join(lines)


# Named ablations (variant sets) in their paper's table: (ablation key or None for always,
# title, paper table, setting column, [(system, setting), ...])
ABLATION_TABLES = [
    ("syncspeech_table2", "SyncSpeech: pre-training and attention mask", "SyncSpeech (arXiv:2502.11094) Table 2", "Variant",
     [("syncspeech", "SyncSpeech"), ("syncspeech_nopretrain", "w/o pre-training"),
      ("syncspeech_causal", "causal mask instead of hybrid")]),
    ("delta_table5", "DELTA-TTS: components of the conversion", "DELTA-TTS (OpenReview v2DbAIl7sf) Table 5", "Variant",
     [("delta", "DELTA-TTS (conv + LoRA + time-shifted + prompt)"), ("delta_noconv", "w/o convolution branch"),
      ("delta_lora_budget", "w/o convolution, LoRA rank at its budget"), ("delta_noprompt", "w/o prompt-conditioned training"),
      ("delta_unfrozen", "full unfreeze (no LoRA, + conv)"),
      # the paper's causal baseline: the same LoRA budget and updates, trained causally, so the
      # conversion's effect is read apart from the extra training
      ("ar_lora", "AR + LoRA, causal (no conversion)"), ("ar", "the AR source model")]),
    ("cod_table5", "Chain-of-Details: coarse token types", "Chain-of-Details (arXiv:2604.19330) Table V", "Coarse tokens",
     [("cod", "Decimated-with-3-levels (first quantizer decimated)"),
      ("cod_ind", "C2C1-Ind-trained (3 levels, k-means codebooks of their own on pooled latents)"),
      ("cod_shared", "C2C1-ShareCodebook (3 levels, the first codebook on pooled latents)"),
      ("cod_units", "units-2-levels (25 Hz encoder units; the paper's HuBERT-2-levels)")]),
    (None, "PALLE: stages", "PALLE (arXiv:2504.10352) Table 3", "Stages",
     [("palle_stage1", "PAR only"), ("palle", "PAR + refinement")]),
    (None, "PALLE on the temporal-concatenation layout: stages", "PALLE (arXiv:2504.10352) Table 3, Discussion", "Stages",
     [("palle_concat_stage1", "PAR only"), ("palle_concat", "PAR + refinement")]),
]


def _setting_table(title: str, source: str, setting: str, rows: list[tuple[str, str]],
                   results: dict[str, dict[str, dict]], note: str = "") -> str:
    """One ablation in its paper's shape: the setting, the system, then WER (corpus), SIM,
    token-stage RTF, FPL-L and forward passes for every task all its rows speak (one seed)."""
    tasks = [t for t in TASKS if all(t in results[s] for s, _ in rows)]
    header = [setting, "System"]
    for task in tasks:
        short = TASK_TITLES[task].split("-")[0][:5]
        header += [f"{short} WER ↓", f"{short} SIM ↑", f"{short} RTF ↓", f"{short} FPL-L ↓", f"{short} passes"]
    lines = [f"### {title} ({source})", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for system, value in rows:
        cells = [value, system]
        for task in tasks:
            r = results[system][task]
            cells += [_fmt(METRICS["wer"](r)), _fmt(METRICS["sim"](r), 3), _fmt(METRICS["rtf"](r), 3),
                      _fmt(METRICS["fpl_l"](r), 3), _fmt(METRICS["passes"](r), 1)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines + ([f"\n{note}"] if note else [])) + "\n"


def seed_spread_note(results: dict, layout: Layout, system: str) -> str:
    """The spread over seeds of a comparison system: the noise a one-seed ablation row carries."""
    replicas = layout.comparison.get(system, [system])
    parts = []
    for task in TASKS:
        value = stat(results, replicas, task, METRICS["wer"])
        if value is not None and value.sd is not None:
            parts.append(f"{TASK_TITLES[task].lower()} WER ± {value.sd:.2f}")
    if not parts:
        return ""
    return (f"One synthesis seed per row. Over {len(replicas)} seeds, `{system}` varies by "
            f"{', '.join(parts)} (standard deviation): a smaller difference is a tie.")


def ablation_tables(results: dict[str, dict[str, dict]], layout: Layout | None = None,
                    summaries: dict[str, dict] | None = None) -> str:
    """The named ablations and every grid axis, each in its paper's table shape."""
    layout = layout or Layout.plain(list(results))
    parts = []

    def notes(systems: list[str], base: str) -> str:
        return " ".join(n for n in (seed_spread_note(results, layout, base),
                                    budget_note(systems, layout, summaries or {})) if n)

    for key, title, source, setting, rows in ABLATION_TABLES:
        if (key is None or key in layout.ablations) and all(s in results for s, _ in rows):
            parts.append(_setting_table(title, source, setting, rows, results,
                                        notes([s for s, _ in rows], rows[0][0])))
    for axis, values in layout.grids.items():
        grid = GRIDS[axis]
        rows = [(system, value_name(value)) for value, system in grid_rows(axis, values)]
        if all(s in results for s, _ in rows):
            parts.append(_setting_table(grid.title, grid.source, grid.label, rows, results,
                                        notes([s for s, _ in rows], grid.base)))
    return "\n".join(parts)


# --- the papers' claims -------------------------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    """A paper's claim that the embedded corpus can test: system ``better`` beats ``worse`` on a
    metric (lower is better for WER, RTF, FPL; higher for SIM)."""

    text: str
    source: str
    better: str
    worse: str
    metric: str = "wer"
    tasks: tuple[str, ...] = ("continuation", "cross_sentence")


CLAIMS = [
    Claim("PAR beats AR on WER", "PALLE (arXiv:2504.10352) Table 3 (Sys. C1 vs A)", "palle_stage1", "ar"),
    Claim("PAR beats NAR on WER", "PALLE (arXiv:2504.10352) Table 3 (Sys. C1 vs B)", "palle_stage1", "nar"),
    Claim("PAR is faster than AR (token-stage RTF)", "PALLE (arXiv:2504.10352) Table 3", "palle_stage1", "ar", "rtf"),
    Claim("Refinement (stage two) lowers PALLE's WER", "PALLE (arXiv:2504.10352) Table 1", "palle", "palle_stage1"),
    # the same claims on PALLE's temporal-concatenation layout (its Discussion allows it; AR's layout)
    Claim("PAR beats AR on WER (concatenation layout)", "PALLE (arXiv:2504.10352) Table 3 (Sys. C1 vs A)",
          "palle_concat_stage1", "ar"),
    Claim("PAR beats NAR on WER (concatenation layout)", "PALLE (arXiv:2504.10352) Table 3 (Sys. C1 vs B)",
          "palle_concat_stage1", "nar"),
    Claim("PAR is faster than AR (token-stage RTF; concatenation layout)", "PALLE (arXiv:2504.10352) Table 3",
          "palle_concat_stage1", "ar", "rtf"),
    Claim("Refinement (stage two) lowers PALLE's WER (concatenation layout)", "PALLE (arXiv:2504.10352) Table 1",
          "palle_concat", "palle_concat_stage1"),
    Claim("SyncSpeech's first packet comes sooner than AR's (FPL-L)", "SyncSpeech (arXiv:2502.11094) Table 1", "syncspeech", "ar",
          "fpl_l"),
    Claim("SyncSpeech is faster than AR (token-stage RTF)", "SyncSpeech (arXiv:2502.11094) Table 1", "syncspeech", "ar", "rtf"),
    Claim("Pre-training helps SyncSpeech", "SyncSpeech (arXiv:2502.11094) Table 2", "syncspeech", "syncspeech_nopretrain"),
    Claim("The hybrid mask beats a causal mask", "SyncSpeech (arXiv:2502.11094) Table 2", "syncspeech", "syncspeech_causal"),
    Claim("Look-ahead q = 1 beats q = 2 on WER", "SyncSpeech (arXiv:2502.11094) Table 4", "syncspeech", "syncspeech_q2"),
    Claim("Three temporal levels beat one", "Chain-of-Details (arXiv:2604.19330) Table IV", "cod", "cod_l1"),
    Claim("Three temporal levels beat two", "Chain-of-Details (arXiv:2604.19330) Table IV", "cod", "cod_l2"),
    Claim("Decimated coarse tokens beat independently trained ones", "Chain-of-Details (arXiv:2604.19330) Table V", "cod", "cod_ind"),
    Claim("Decimated coarse tokens beat ones sharing the codebook", "Chain-of-Details (arXiv:2604.19330) Table V", "cod",
          "cod_shared"),
    Claim("The time-shifted schedule beats the uniform one", "DELTA-TTS (OpenReview v2DbAIl7sf) Table 5", "delta", "delta_mu1.0"),
    Claim("More unmasking steps lower WER (16 vs 4)", "DELTA-TTS (OpenReview v2DbAIl7sf) Fig. 2", "delta", "delta_steps4"),
    Claim("DELTA-TTS is faster than its AR model (token-stage RTF)", "DELTA-TTS (OpenReview v2DbAIl7sf) Table 1", "delta", "ar", "rtf"),
    Claim("The convolution branch lowers DELTA's WER", "DELTA-TTS (OpenReview v2DbAIl7sf) Table 5", "delta", "delta_noconv"),
]
LOWER_IS_BETTER = {"wer": True, "rtf": True, "fpl_l": True, "sim": False, "passes": True}
# A system "speaks" a task when its WER is at most this many times its own ceiling row's (issue 21's
# bar). A WER claim between two systems neither of which speaks compares babble: its verdict is
# "neither speaks", not a win, loss or tie.
SPEAKS_WITHIN = 2.0


def speaks(results: dict, layout: Layout, system: str, task: str, wer: Stat) -> bool | None:
    """Whether ``system``'s WER on ``task`` is within :data:`SPEAKS_WITHIN` times its ceiling row's;
    None where the layout names no ceiling for it or the row was not evaluated."""
    row = layout.ceilings.get(system)
    ceiling = stat(results, [row], task, METRICS["wer"]) if row else None
    if ceiling is None:
        return None
    return wer.mean <= SPEAKS_WITHIN * ceiling.mean


def judge(better: Stat, worse: Stat, noise: float | None, lower_is_better: bool) -> str:
    """``reproduced`` when ``better`` wins by more than the spread over seeds, ``reversed`` when
    it loses by more, else ``tie``. The spread is sqrt(sd_a^2 + sd_b^2) of the two systems;
    a one-seed system borrows ``noise`` (its paradigm's spread over seeds)."""
    sds = [x.sd if x.sd is not None else noise for x in (better, worse)]
    spread = (sum(sd * sd for sd in sds if sd is not None)) ** 0.5 if any(sd is not None for sd in sds) else 0.0
    gain = (worse.mean - better.mean) if lower_is_better else (better.mean - worse.mean)
    if gain > spread:
        return "reproduced"
    if gain < -spread:
        return "reversed"
    return "tie"


BOOTSTRAP_RESAMPLES = 2000
BOOTSTRAP_SEED = 0  # one fixed draw for every claim, so that a report is rebuilt to the same text


def paired_interval(results: dict, better: Sequence[str], worse: Sequence[str],
                    task: str) -> tuple[float, float, float] | None:
    """Corpus WER of ``better`` minus ``worse`` (percentage points) and its paired bootstrap 95 %
    interval over the items (:mod:`arnar.evaluate.bootstrap`), each side's errors and reference
    words summed over its seed replicas, on the items every replica of both was evaluated on
    (matched by id, in the first replica's test-list order). None where a replica has no
    per-item numbers or the two share no item."""
    def per_seed(replicas):  # one item -> (errors, words) mapping per replica that spoke the task
        return [item_errors(results[s][task]) for s in replicas if s in results and task in results[s]]

    a, b = per_seed(better), per_seed(worse)
    if not a or not b or any(p is None for p in a + b):
        return None
    shared = set.intersection(*(set(p) for p in a + b))
    items = [i for i in a[0] if i in shared]
    if not items:
        return None

    def summed_over_seeds(seeds):  # one unit per item: its seeds move together in the resampling
        return ([sum(p[i][0] for p in seeds) for i in items], [sum(p[i][1] for p in seeds) for i in items])

    (errors_a, words_a), (errors_b, words_b) = summed_over_seeds(a), summed_over_seeds(b)
    return paired_bootstrap_wer_difference(errors_a, words_a, errors_b, words_b,
                                           resamples=BOOTSTRAP_RESAMPLES, seed=BOOTSTRAP_SEED)


def judge_with_items(seed_verdict: str, interval: tuple[float, float, float] | None, lower_is_better: bool) -> str:
    """A WER claim's verdict: the seed-spread verdict (:func:`judge`) stands only where the item
    bootstrap agrees. ``reproduced`` needs the interval of better minus worse entirely on the
    better side of 0 (below it when lower is better), ``reversed`` entirely on the other side;
    anything else (the two disagree, the interval holds 0, or there is no interval) is a ``tie``.
    Two sources of noise are checked: the synthesis seeds (the same text spoken again) and the
    test items (another draw of sentences)."""
    if interval is None:
        return "tie"
    _, low, high = interval
    better_side, worse_side = (high < 0, low > 0) if lower_is_better else (low > 0, high < 0)
    if seed_verdict == "reproduced" and better_side:
        return "reproduced"
    if seed_verdict == "reversed" and worse_side:
        return "reversed"
    return "tie"


def claims_section(results: dict[str, dict[str, dict]], layout: Layout | None = None) -> str:
    """Every claim both of whose systems this run evaluated, per task, with the numbers and
    whether this run reproduces it."""
    layout = layout or Layout.plain(list(results))

    def replicas(system):
        return layout.comparison.get(system, [system])

    def noise(system, task):  # a grid or ablation system: the spread of its paradigm's main system
        base = next((b for b, reps in layout.comparison.items() if system in reps), None)
        for candidate in [base] + [b for b in layout.comparison if system.startswith(f"{b}_")]:
            value = candidate and stat(results, replicas(candidate), task, METRICS["wer"])
            if value and value.sd is not None:
                return value.sd
        return None

    lines = ["### Claims of the papers, tested on this run", "",
             "| Claim | Source | Task | Metric | Better (claimed) | Worse (claimed) "
             "| Paired bootstrap 95 % (better − worse, WER points) | This run |",
             "|---|---|---|---|---|---|---|---|"]
    counts: dict[str, int] = {}
    for claim in CLAIMS:
        if claim.better not in results or claim.worse not in results:
            continue
        for task in claim.tasks:
            a = stat(results, replicas(claim.better), task, METRICS[claim.metric])
            b = stat(results, replicas(claim.worse), task, METRICS[claim.metric])
            if a is None or b is None:
                continue
            # the spread over seeds is measured on WER; speed claims compare means only
            spread = noise(claim.better, task) if claim.metric == "wer" else None
            if claim.metric != "wer":
                a, b = Stat(a.mean, None, a.n), Stat(b.mean, None, b.n)
            verdict = judge(a, b, spread, LOWER_IS_BETTER[claim.metric])
            interval_cell = "–"
            if claim.metric == "wer":
                interval = paired_interval(results, replicas(claim.better), replicas(claim.worse), task)
                verdict = judge_with_items(verdict, interval, LOWER_IS_BETTER[claim.metric])
                if interval is not None:
                    interval_cell = "{:.2f} [{:.2f}, {:.2f}]".format(*interval)
            if claim.metric == "wer" and all(speaks(results, layout, system, task, value) is False
                                             for system, value in ((claim.better, a), (claim.worse, b))):
                verdict = "neither speaks"
            counts[verdict] = counts.get(verdict, 0) + 1
            digits = 3 if claim.metric in ("rtf", "fpl_l", "sim") else 2
            lines.append(f"| {claim.text} | {claim.source} | {TASK_TITLES[task]} | {claim.metric} | "
                         f"{claim.better} {a.format(digits)} | {claim.worse} {b.format(digits)} | {interval_cell} "
                         f"| **{verdict}** |")
    if not counts:
        return ""
    # the caption states the verdict rule in full: a reader of comparison.md has no other place to find it
    lines += ["", "reproduced: the claimed winner wins by more than the spread over synthesis seeds "
                  "(sqrt of the sum of both systems' variances; a one-seed ablation row borrows its paradigm's) "
                  "and, for a WER claim, the paired bootstrap 95 % interval lies entirely below 0; reversed: it "
                  "loses by more than that spread and the interval lies entirely above 0; tie: anything else (the "
                  "difference is within the spread, the interval holds 0, or the two disagree). The interval is "
                  "over the test items: corpus WER of the claimed better minus the claimed worse, recomputed on "
                  f"{BOOTSTRAP_RESAMPLES} resamples of the items with replacement, the same items for both systems "
                  "(paired, matched by item id, on the items both were evaluated on), each item's errors and "
                  "reference words summed over a system's synthesis seeds; the bounds are the 2.5th and 97.5th "
                  "percentiles, the number before them the difference on those items without resampling (–: "
                  "an evaluation without per-item numbers, so a tie). The seed spread says "
                  "whether the difference outlasts speaking the text again, the interval whether it outlasts "
                  "another draw of sentences. neither speaks: a WER claim "
                  f"whose two systems both read above {SPEAKS_WITHIN:g}x the WER of their own decoding path's "
                  "resynthesis row (the comparison's ceiling rows), so that it would compare babble. Speed claims compare means "
                  "(no interval: –) measured on this machine (one item at a time; results/bench.md), not on the papers' GPUs. "
                  "Totals: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) + "."]
    return "\n".join(lines) + "\n"


# parameters of one network as each paper states it (tests/test_paper_sizes.py: the model=paper*
# configs match within 2 %); AR, NAR and SyncSpeech have no stated count (PALLE's backbone)
PAPER_PARAMETERS = {"palle": 177.0e6, "cod": 263e6, "delta": 494e6}


def training_table(train_dir: Path | None, systems: Sequence[str]) -> str:
    """Model size and training budget of every trained system (docs/design.md section 6: a comparison
    states sizes and steps), from the engine's summaries ``<train_dir>/<system>.json``."""
    if train_dir is None:
        return ""
    # every run of the training phase (multi-stage paradigms have several), evaluated systems first
    paths = sorted(train_dir.glob("*.json"), key=lambda p: (p.stem not in systems, p.stem))
    rows = []
    for path in paths:
        system = path.stem
        run = json.loads(path.read_text(encoding="utf-8"))
        model = run.get("model", {})
        trainable, paper = run.get("trainable_parameters"), PAPER_PARAMETERS.get(run.get("paradigm"))
        rows.append("| " + " | ".join([
            system, run.get("paradigm", "–"), f"{run['parameters'] / 1e6:.2f}M",
            f"{trainable / 1e6:.2f}M" if trainable is not None else "–", f"{paper / 1e6:.1f}M" if paper else "–",
            f"{model.get('n_layers', '–')} x {model.get('dim', '–')}", str(run["steps"]),
            _fmt(run.get("epochs"), 1), _fmt(run["wall_time_s"] / 60, 1), _fmt(run.get("tokens_per_s"), 0),
            _fmt(run.get("final_train_loss"), 3), _fmt(run.get("final_dev_loss"), 3),
            _departures(run.get("not_in_the_papers")),
        ]) + " |")
    if not rows:
        return ""
    header = ("| Run | Paradigm | Parameters | Trainable | Paper (one network) | Layers x dim | Steps | Epochs "
              "| Train (min) | Tokens/s | Train loss | Dev loss | Not in the papers |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    return "### Training\n\n" + header + "\n" + "\n".join(rows) + "\n"


def _departures(departures: dict | None) -> str:
    """The training table's cell for a run's settings that no paper uses (arnar.train.config.
    NOT_IN_THE_PAPERS and the text units): ``prompt_pairs=0.5, text units phonemes``."""
    if departures is None:
        return "not recorded"  # a summary written before the engine recorded them
    if not departures:
        return "–"
    return ", ".join(f"text units {v}" if k == "text_units" else f"{k.rsplit('.', 1)[-1]}={v}"
                     for k, v in departures.items())


def audit_table(audit: dict) -> str:
    lines = [f"{audit['utterances']} utterances, {audit['speakers']} speakers.", ""]
    for name, asr in audit["asr"].items():
        lines += [f"### WER of the recordings, ASR {name} ({asr['model']}{judge_fingerprint(asr)})", "",
                  "| Voice | Utterances | WER utt-mean (%) | WER corpus (%) |", "|---|---|---|---|"]
        for voice, s in list(asr["per_voice"].items()) + [("**overall**", asr["overall"])]:
            lines.append(f"| {voice} | {s['utterances']} | {_fmt(s['wer_utterance_mean'])} | {_fmt(s['wer_corpus'])} |")
        lines.append("")
    mos = audit.get("mos")
    if mos:
        columns = list(mos["overall"])
        lines += [f"### Naturalness of the recordings, {mos['backend']} ({mos['model']})", "",
                  "| Voice | " + " | ".join(f"{MOS_TITLES.get(c, c)} ↑" for c in columns) + " |",
                  "|---|" + "---|" * len(columns)]
        for voice, values in list(mos["per_voice"].items()) + [("**overall**", mos["overall"])]:
            lines.append(f"| {voice} | " + " | ".join(_fmt(values[c]) for c in columns) + " |")
        lines.append("")
    sim = audit["sim"]
    lines += [f"### Speaker similarity, {sim['backend']} ({sim['model']})", "",
              "| Pairs | Same-speaker mean | Other mean | AUC ↑ | EER (%) ↓ | Same pairs | Other pairs |",
              "|---|---|---|---|---|---|---|"]
    for key, title in (("same_vs_different_speaker", "same vs any other speaker"),
                       ("same_vs_other_voice", "same vs other voice"),
                       ("same_vs_variant_of_same_voice", "same vs pitch/tempo variant of the same voice")):
        s = sim.get(key)
        if s:
            lines.append(f"| {title} | {s['same_mean']:.3f} | {s['different_mean']:.3f} | {s['auc']:.3f} | "
                         f"{100 * s['eer']:.1f} | {s['same_pairs']} | {s['different_pairs']} |")
    return "\n".join(lines) + "\n"


def metrics_summary(results: dict[str, dict[str, dict]], audit: dict) -> dict:
    """The flat numbers DVC tracks as metrics (`dvc metrics diff` across experiments)."""
    summary: dict = {}
    for system, tasks in results.items():
        for task, r in tasks.items():
            entry = {f"wer_{n}_{conv}": round(v[f"wer_{conv}"], 3)
                     for n, v in r["asr"].items() for conv in ("utterance_mean", "corpus")}
            entry["sim"] = None if r["sim"]["mean"] is None else round(r["sim"]["mean"], 4)
            for column in MOS_TITLES:
                if (r.get("mos") or {}).get(column) is not None:
                    entry[f"mos_{column}"] = round(r["mos"][column], 4)
            for key, value in (r.get("speed") or {}).items():
                entry[key] = round(value, 4)
            summary.setdefault(system, {})[task] = entry
    sep = audit["sim"].get("same_vs_different_speaker") or {}
    summary["ground_truth_audit"] = {
        **{f"wer_{n}_corpus": round(a["overall"]["wer_corpus"], 3) for n, a in audit["asr"].items()},
        "sim_auc": round(sep.get("auc", float("nan")), 4),
        "sim_eer": round(sep.get("eer", float("nan")), 4),
        **{f"mos_{c}": round(v, 4) for c, v in ((audit.get("mos") or {}).get("overall") or {}).items()},
    }
    return summary


# --- plots ----------------------------------------------------------------------------------------


def table_rows(layout: Layout) -> list[tuple[str, list[str]]]:
    """The comparison table's rows in its order, each with the systems its numbers pool: every
    reference row alone, then every paradigm's system with its seed replicas (as comparison_table)."""
    return [(s, [s]) for s in layout.references] + list(layout.comparison.items())


TASK_COLOURS = {"continuation": "tab:blue", "cross_sentence": "tab:orange"}


def systems_figure(results: dict[str, dict[str, dict]], layout: Layout):
    """The comparison table as bars: per row and task, WER (first ASR backend, corpus) and SIM at
    the table's mean over synthesis seeds (:func:`stat`, the numbers comparison_table prints), with
    ± one standard deviation as error bars where a row pooled several seeds. A paradigm's bar
    carries a diamond at its ceiling: the same metric of the resynthesis row of its own decoding
    path (Layout.ceilings, the reference of the claims' 2x bar). Horizontal bars, so long names
    read level; the legend sits under the axes, off the data."""
    rows = table_rows(layout)
    tasks = [t for t in TASKS if any(t in results.get(s, {}) for s, _ in rows)]
    asr = next(iter(results[rows[0][0]][tasks[0]]["asr"]))
    panels = [(METRICS["wer"], f"WER-{ASR_SHORT.get(asr, asr)} corpus (%) ↓"),
              (METRICS["sim"], "SIM to the prompt ↑")]
    bar = 0.8 / len(tasks)
    fig, axes = plt.subplots(1, 2, figsize=(10, 1.7 + 0.42 * len(rows)), sharey=True, dpi=110, layout="constrained")
    for ax, (read, title) in zip(axes, panels):
        right = 0.0
        for k, task in enumerate(tasks):
            offset = (k - (len(tasks) - 1) / 2) * bar
            ys, means, spread = [], [], []
            for i, (system, replicas) in enumerate(rows):
                value = stat(results, replicas, task, read)
                if value is None:
                    continue
                ys.append(i + offset)
                means.append(value.mean)
                spread.append(value.sd)
                right = max(right, value.mean + (value.sd or 0.0))
                ceiling = layout.ceilings.get(system)
                reference = stat(results, [ceiling], task, read) if ceiling else None
                if reference is not None:
                    ax.plot(reference.mean, i + offset, "d", ms=6, mfc="white", mec="black", mew=1.2, zorder=4,
                            label="its decoding path's resynthesis row (the ceiling)")
                    right = max(right, reference.mean)
            ax.barh(ys, means, bar, color=TASK_COLOURS.get(task), label=TASK_TITLES[task])
            with_sd = [(y, m, sd) for y, m, sd in zip(ys, means, spread) if sd is not None]
            if with_sd:
                ax.errorbar([m for _, m, _ in with_sd], [y for y, _, _ in with_sd], xerr=[sd for _, _, sd in with_sd],
                            fmt="none", ecolor="black", elinewidth=1, capsize=2.5, zorder=3,
                            label="± 1 sd over synthesis seeds")
        ax.set_xlim(0, right * 1.04 if right > 0 else 1)
        ax.set_title(title, fontsize=10)
        ax.grid(axis="x", lw=0.4, alpha=0.5)
        if layout.references and layout.comparison:  # reference rows above, paradigms below
            ax.axhline(len(layout.references) - 0.5, color="grey", lw=0.8, ls=":")
    axes[0].set_yticks(range(len(rows)), [s for s, _ in rows])
    axes[0].invert_yaxis()  # the table's order, top to bottom
    handles, labels = axes[0].get_legend_handles_labels()
    unique = dict(zip(labels, handles))  # one entry per kind (every ceiling diamond has the same label)
    order = [TASK_TITLES[t] for t in tasks] + [label for label in unique if label not in TASK_TITLES.values()]
    unique = {label: unique[label] for label in order if label in unique}
    seeds = max(len(replicas) for _, replicas in rows)
    fig.suptitle(f"Comparison rows: mean over {seeds} synthesis seeds (comparison.md); no error bar: one seed"
                 if seeds > 1 else "Comparison rows (one synthesis seed)", fontsize=10)
    fig.legend(list(unique.values()), list(unique), loc="outside lower center", ncol=len(unique), fontsize=8,
               frameon=False)
    return fig


def plot_systems(results: dict[str, dict[str, dict]], layout: Layout, path: Path) -> None:
    _save(systems_figure(results, layout), path)


def grid_lines(grids: dict[str, list], present: set[str]) -> list[tuple[str, list[str]]]:
    """``(axis, systems in the axis' value order)`` for every grid axis whose systems are all
    ``present``: the lines of the WER-RTF plot (one per axis, never across axes)."""
    lines = []
    for axis, values in grids.items():
        rows = grid_rows(axis, values)
        if all(isinstance(v, (int, float)) for v, _ in rows):
            rows = sorted(rows, key=lambda row: row[0])
        members = [system for _, system in rows]
        if len(members) > 1 and all(m in present for m in members):
            lines.append((axis, members))
    return lines


@dataclass(frozen=True)
class SpeedPoint:
    """A system on the WER-RTF plane: token-stage RTF, WER (corpus), its sd over seeds, passes."""

    rtf: float
    wer: float
    sd: float | None
    passes: float | None


def speed_points(results: dict[str, dict[str, dict]], layout: Layout, task: str
                 ) -> tuple[dict[str, SpeedPoint], dict[str, SpeedPoint]]:
    """The timed systems of ``task``: the comparison's, at the table's means over their seeds, and
    every other evaluated system (ablations, grid values) at its one seed. Seed replicas are
    pooled into their system, never points of their own."""
    compared = {}
    for system, replicas in layout.comparison.items():
        wer, rtf = stat(results, replicas, task, METRICS["wer"]), stat(results, replicas, task, METRICS["rtf"])
        if wer is not None and rtf is not None:
            passes = stat(results, replicas, task, METRICS["passes"])
            compared[system] = SpeedPoint(rtf.mean, wer.mean, wer.sd, passes.mean if passes else None)
    pooled = {r for replicas in layout.comparison.values() for r in replicas}
    single = {}
    for system, by_task in results.items():
        if system in pooled or task not in by_task or METRICS["rtf"](by_task[task]) is None:
            continue
        r = by_task[task]
        single[system] = SpeedPoint(METRICS["rtf"](r), METRICS["wer"](r), None, METRICS["passes"](r))
    return compared, single


def readable_log_ticks(ax, low: float, high: float) -> None:
    """Plain-number ticks on a log x axis between ``low`` and ``high``: the densest of 1-9, 1-2-3-5,
    1-2-5 and 1 per decade whose labels do not touch (a range inside one decade would otherwise
    show one tick or none, a wide one labels on top of one another); minor ticks unlabelled."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_xlim(low, high)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    ax.xaxis.set_minor_locator(LogLocator(base=10, subs=tuple(float(k) for k in range(1, 10))))
    ax.xaxis.set_minor_formatter(NullFormatter())
    renderer = ax.figure.canvas.get_renderer()
    for subs in ((1, 2, 3, 4, 5, 6, 7, 8, 9), (1, 2, 3, 5), (1, 2, 5), (1,)):
        ax.xaxis.set_major_locator(LogLocator(base=10, subs=tuple(float(k) for k in subs)))
        ax.figure.canvas.draw()
        boxes = sorted((label.get_window_extent(renderer) for label in ax.get_xticklabels()
                        if label.get_visible() and label.get_text() and low <= label.get_position()[0] <= high),
                       key=lambda box: box.x0)
        if len(boxes) >= 2 and all(a.x1 + 6 <= b.x0 for a, b in zip(boxes, boxes[1:])):
            return


def place_labels(ax, labels: list[tuple[float, float, str]], points: list[tuple[float, float]]) -> list:
    """Write each ``(x, y, text)`` beside its point so that no label covers another label or a point:
    the first free spot of eight around the point, then farther out with a leader line; a label
    with no free spot keeps the nearest one. The figure's layout must be final (the check is in
    pixels). Returns the annotations."""
    fig = ax.figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    taken = []
    for x, y in points:  # a marker's box, a few pixels either side of its centre
        px, py = ax.transData.transform((x, y))
        taken.append((px - 4, py - 4, px + 4, py + 4))

    def free(box) -> bool:
        inside = frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1
        return inside and not any(box.x0 < b[2] and b[0] < box.x1 and box.y0 < b[3] and b[1] < box.y1 for b in taken)

    directions = [(1, 1), (1, -1), (-1, 1), (-1, -1), (1, 0), (-1, 0), (0, 1), (0, -1)]
    placed = []
    for x, y, text in labels:
        chosen = None
        for radius in (3, 10, 18, 28):
            for dx, dy in directions:
                note = ax.annotate(
                    text, (x, y), xytext=(dx * radius, dy * radius), textcoords="offset points", fontsize=7,
                    ha={1: "left", 0: "center", -1: "right"}[dx], va={1: "bottom", 0: "center", -1: "top"}[dy],
                    arrowprops={"arrowstyle": "-", "lw": 0.5, "color": "grey"} if radius > 3 else None)
                box = note.get_window_extent(renderer)
                if free(box):
                    chosen = (note, box)
                    break
                note.remove()
            if chosen:
                break
        if chosen is None:  # crowded: the first spot, even if it touches a neighbour
            note = ax.annotate(text, (x, y), xytext=(3, 3), textcoords="offset points", fontsize=7)
            chosen = (note, note.get_window_extent(renderer))
        note, box = chosen
        taken.append((box.x0, box.y0, box.x1, box.y1))
        placed.append(note)
    return placed


COMPARISON_MARKERS = "osD^vP*Xh<>p"


def wer_rtf_figure(results: dict[str, dict[str, dict]], task: str = "cross_sentence",
                   grids: dict[str, list] | None = None, layout: Layout | None = None):
    """Quality against speed (the DELTA steps Pareto of DELTA-TTS (OpenReview v2DbAIl7sf) Fig. 2, PALLE's one vs two
    stages): WER (corpus) over the token-stage RTF of every timed system, None when none is timed.
    The comparison's systems sit at the table's means with ± one sd over seeds, each with its own
    marker, named in the legend. Each grid axis whose systems are all timed is one line in its
    values' order (DELTA steps 4 -> 8 -> 16, ...); its points and every other ablation are numbered,
    the key beside the legend names them. Legend and key sit beside the axes, off the data."""
    layout = layout or Layout.plain(list(results))
    compared, single = speed_points(results, layout, task)
    points = {**compared, **single}
    if not points:
        return None
    numbered = sorted(single, key=lambda s: (single[s].rtf, s))
    key = [f"{n:>2} {s}" + (f" ({single[s].passes:.0f} passes)" if single[s].passes else "")
           for n, s in enumerate(numbered, start=1)]
    columns = [key[i:i + 30] for i in range(0, len(key), 30)]
    widths = [3.0, 1.6] + [1.5] * len(columns)
    fig, axes = plt.subplots(1, len(widths), figsize=(4.2 + 2.6 * (len(widths) - 1), 4.8), dpi=110,
                             gridspec_kw={"width_ratios": widths})
    ax, side = axes[0], axes[1:]
    for panel in side:
        panel.axis("off")
    lines = grid_lines(grids or {}, set(points))
    palette = plt.get_cmap("Dark2")  # its first seven colours (the eighth is the loose points' grey), then dashed
    for k, (axis, members) in enumerate(lines):
        ax.plot([points[m].rtf for m in members], [points[m].wer for m in members], "o", ls="-" if k < 7 else "--",
                lw=1, ms=3, color=palette(k % 7), label=f"grid {axis}", zorder=2)
    on_lines = {m for _, members in lines for m in members}
    loose = [s for s in single if s not in on_lines]
    if loose:
        ax.plot([single[s].rtf for s in loose], [single[s].wer for s in loose], "o", ms=3, color="dimgray", zorder=2)
    for k, (system, p) in enumerate(compared.items()):
        passes = f" ({p.passes:.0f} passes)" if p.passes else ""
        ax.errorbar(p.rtf, p.wer, yerr=p.sd, fmt=COMPARISON_MARKERS[k % len(COMPARISON_MARKERS)],
                    ms=6, mec="black", mew=0.6, color=plt.get_cmap("tab10")(k % 10), ecolor="black", elinewidth=0.8,
                    capsize=2, label=f"{system}{passes}", zorder=3)
    rtfs = [p.rtf for p in points.values()]
    ax.set_xscale("log")
    readable_log_ticks(ax, min(rtfs) / 1.3, max(rtfs) * 1.3)
    ax.set_xlabel("RTF of the token stage (log scale)")
    ax.set_ylabel(f"WER corpus (%), {TASK_TITLES[task]}")
    ax.grid(lw=0.4, alpha=0.5)
    handles, labels = ax.get_legend_handles_labels()
    first = sorted(range(len(labels)), key=lambda i: labels[i].startswith("grid "))  # the systems, then the grids
    side[0].legend([handles[i] for i in first], [labels[i] for i in first], loc="upper left", fontsize=7,
                   frameon=False, borderaxespad=0,
                   title="mean ± sd over synthesis seeds" if any(p.sd for p in compared.values()) else None,
                   title_fontsize=7)
    for c, column in enumerate(columns):
        header = "numbered: one seed each\n" if c == 0 else "\n"
        side[1 + c].text(0, 1, header + "\n".join(column), fontsize=6.5, family="monospace", va="top",
                         transform=side[1 + c].transAxes)
    fig.tight_layout()
    # numbers of points that fall on one spot share a label ("4,5")
    clusters: list[list[str]] = []
    for system in numbered:
        px = ax.transData.transform((single[system].rtf, single[system].wer))
        for cluster in clusters:
            qx = ax.transData.transform((single[cluster[0]].rtf, single[cluster[0]].wer))
            if abs(px[0] - qx[0]) < 5 and abs(px[1] - qx[1]) < 5:
                cluster.append(system)
                break
        else:
            clusters.append([system])
    number = {s: n for n, s in enumerate(numbered, start=1)}
    place_labels(ax, [(single[c[0]].rtf, single[c[0]].wer, ",".join(str(number[s]) for s in c)) for c in clusters],
                 [(p.rtf, p.wer) for p in points.values()])
    return fig


def plot_wer_vs_rtf(results: dict[str, dict[str, dict]], path: Path, task: str = "cross_sentence",
                    grids: dict[str, list] | None = None, layout: Layout | None = None) -> bool:
    """:func:`wer_rtf_figure`, written to ``path``; False when no system is timed."""
    fig = wer_rtf_figure(results, task, grids, layout)
    if fig is None:
        return False
    _save(fig, path)
    return True


def plot_grid(results: dict[str, dict[str, dict]], axis: str, values: list, path: Path) -> bool:
    """An axis the paper draws as a curve (PALLE Figs. 4-5, DELTA steps): WER and SIM over the
    axis' values, one line per task its systems speak. False when the axis is not a curve."""
    grid = GRIDS[axis]
    rows = grid_rows(axis, values)
    if not grid.plot or len(rows) < 2 or any(s not in results for _, s in rows):
        return False
    tasks = [t for t in TASKS if all(t in results[s] for _, s in rows)]
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for task in tasks:
        xs = [float(v) for v, _ in rows]
        axes[0].plot(xs, [METRICS["wer"](results[s][task]) for _, s in rows], "o-", label=TASK_TITLES[task])
        axes[1].plot(xs, [METRICS["sim"](results[s][task]) for _, s in rows], "o-", label=TASK_TITLES[task])
    for ax, ylabel in zip(axes, ("WER corpus (%)", "SIM to prompt")):
        ax.set_xlabel(grid.label)
        ax.set_ylabel(ylabel)
        ax.set_xticks([float(v) for v, _ in rows])
        ax.legend(fontsize=8)
    fig.suptitle(f"{grid.title} ({grid.source})", fontsize=10)
    fig.tight_layout()
    _save(fig, path)
    return True


def plot_audit(audit: dict, wer_path: Path, sim_path: Path) -> None:
    name, asr = next(iter(audit["asr"].items()))
    groups = asr["per_voice"] or asr["per_speaker"]
    fig, ax = plt.subplots(figsize=(8, 3.4))
    labels = list(groups)
    ax.bar(labels, [groups[g]["wer_corpus"] for g in labels], color="tab:blue")
    ax.axhline(asr["overall"]["wer_corpus"], color="black", lw=1, ls="--", label="overall")
    ax.set_ylabel(f"WER corpus (%), {name}")
    ax.set_title("Ground truth: WER per " + ("voice" if asr["per_voice"] else "speaker"))
    ax.tick_params(axis="x", rotation=25)
    ax.legend()
    fig.tight_layout()
    _save(fig, wer_path)

    fig, ax = plt.subplots(figsize=(6, 3.4))
    histograms = audit["sim"].get("histograms") or {}
    lowest = min((h["edges"][next(i for i, c in enumerate(h["counts"]) if c)] for h in histograms.values()
                  if any(h["counts"])), default=-1.0)
    ax.set_xlim(max(-1.0, lowest - 0.05), 1.0)
    for label, hist in histograms.items():
        edges, counts = hist["edges"], hist["counts"]
        total = max(sum(counts), 1)
        ax.stairs([c / total for c in counts], edges, label=label, fill=False, lw=1.5)
    ax.set_xlabel(f"cosine ({audit['sim']['backend']})")
    ax.set_ylabel("share of pairs")
    ax.set_title("Speaker similarity of pairs")
    ax.legend(fontsize=8)
    fig.tight_layout()
    _save(fig, sim_path)


# --- HTML -----------------------------------------------------------------------------------------

_AUDIO_CHECK = """
// Mark every player once the browser has read its audio: data-state="loaded" or "error".
// The report test (and a reader) can see at a glance that every file plays.
document.querySelectorAll("audio").forEach(function (a) {
  a.dataset.state = "pending";
  a.addEventListener("loadedmetadata", function () { a.dataset.state = "loaded"; a.title = a.duration.toFixed(2) + " s"; });
  a.addEventListener("error", function () { a.dataset.state = "error"; a.parentElement.classList.add("broken"); });
  a.load();
});
"""

_STYLE = """
body { font-family: sans-serif; margin: 2em; max-width: 1200px; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f2f2f2; }
audio { width: 220px; }
td.broken { background: #fdd; }
.small { color: #555; font-size: 0.85em; }
img { max-width: 100%; }
"""


def _md_table_to_html(markdown: str) -> str:
    """Render the pipe tables and headings this module writes (no general Markdown)."""
    out, in_table = [], False
    for line in markdown.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            if all(set(c) <= set("-") for c in cells):
                continue
            tag = "th" if not in_table else "td"
            if not in_table:
                out.append("<table>")
                in_table = True
            out.append("<tr>" + "".join(f"<{tag}>{html.escape(c).replace('**', '')}</{tag}>" for c in cells) + "</tr>")
            continue
        if in_table:
            out.append("</table>")
            in_table = False
        if line.startswith("### "):
            out.append(f"<h3>{html.escape(line[4:])}</h3>")
        elif line.strip():
            out.append(f"<p class='small'>{html.escape(line)}</p>")
    if in_table:
        out.append("</table>")
    return "\n".join(out)


def build_html(*, profile: str, tables_md: str, audit_md: str, samples: dict, plots: list[str]) -> str:
    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>arnar report: {html.escape(profile)}</title><style>{_STYLE}</style></head><body>",
        f"<h1>arnar report — profile <code>{html.escape(profile)}</code></h1>",
        "<h2>Comparison</h2>", _md_table_to_html(tables_md),
        "<h2>Plots</h2>", *[f"<img src='{html.escape(p)}' alt='{html.escape(p)}'>" for p in plots],
        "<h2>Samples</h2>",
    ]
    for task, rows in samples.items():
        systems = list(rows[0]["systems"]) if rows else []
        parts += [f"<h3>{TASK_TITLES[task]}</h3>", "<table><tr><th>Item</th><th>Text</th><th>Prompt</th>"
                  + "".join(f"<th>{html.escape(s)}</th>" for s in systems) + "</tr>"]
        for row in rows:
            cells = [f"<td><code>{html.escape(row['item_id'])}</code></td>",
                     f"<td>{html.escape(row['text'])}</td>",
                     f"<td><audio controls preload='metadata' src='{html.escape(row['prompt'])}'></audio></td>"]
            for system in systems:
                src = row["systems"][system]
                cells.append(f"<td><audio controls preload='metadata' src='{html.escape(src)}'></audio></td>"
                             if src else "<td class='broken'>missing</td>")
            parts.append("<tr>" + "".join(cells) + "</tr>")
        parts.append("</table>")
    parts += ["<h2>Ground-truth audit</h2>", _md_table_to_html(audit_md),
              f"<script>{_AUDIO_CHECK}</script></body></html>"]
    return "\n".join(parts) + "\n"


def run_summaries(train_dir: Path | None) -> dict[str, dict]:
    """The engine's summary of every run (``<train_dir>/<run>.json``)."""
    if train_dir is None:
        return {}
    return {path.stem: json.loads(path.read_text(encoding="utf-8")) for path in train_dir.glob("*.json")}


def run_parameters(train_dir: Path | None) -> dict[str, float]:
    """Trained parameters of every run (the engine's summaries), for the comparison's Params column."""
    if train_dir is None:
        return {}
    return {path.stem: json.loads(path.read_text(encoding="utf-8"))["parameters"] for path in train_dir.glob("*.json")}


def comparison_plots(results: dict[str, dict[str, dict]], layout: Layout, plots_dir: Path) -> list[str]:
    """The plots drawn from the evaluation results alone (all but the audit's): the systems' bars,
    WER against RTF, one curve per grid axis. Returns the names of the files written."""
    plots_dir.mkdir(parents=True, exist_ok=True)
    plot_systems(results, layout, plots_dir / "systems.png")
    drawn = ["systems.png"]
    if plot_wer_vs_rtf(results, plots_dir / "wer_vs_rtf.png", grids=layout.grids, layout=layout):
        drawn.append("wer_vs_rtf.png")
    for axis in layout.grids:
        if plot_grid(results, axis, layout.grids[axis], plots_dir / f"grid_{axis}.png"):
            drawn.append(f"grid_{axis}.png")
    return drawn


def results_from_metrics(metrics: dict, asr: Sequence[str]) -> dict[str, dict[str, dict]]:
    """The evaluation results as far as ``metrics.json`` (:func:`metrics_summary`) keeps them, in
    the shape :func:`load_results` gives: WER per ASR backend (``asr`` in params.yaml's order,
    the first the headline; the file's keys are sorted), SIM, the speed figures. Enough for
    :func:`comparison_plots`, so the committed plots can be redrawn from the committed metrics
    (rounded there to 3 decimals for WER, 4 for SIM and speed: the tables print 2 and 3)."""
    results: dict[str, dict[str, dict]] = {}
    for system, tasks in metrics.items():
        if system == "ground_truth_audit":
            continue
        for task, entry in tasks.items():
            speed = {k: v for k, v in entry.items() if k != "sim" and not k.startswith("wer_")}
            results.setdefault(system, {})[task] = {
                "asr": {name: {"wer_corpus": entry[f"wer_{name}_corpus"],
                               "wer_utterance_mean": entry[f"wer_{name}_utterance_mean"]}
                        for name in asr if f"wer_{name}_corpus" in entry},
                "sim": {"mean": entry.get("sim")}, "speed": speed or None, "missing": []}
    return results


def plots_from_metrics(metrics_path: Path, layout: dict, asr: Sequence[str], plots_dir: Path) -> list[str]:
    """Redraw :func:`comparison_plots` from a committed ``metrics.json`` and the DAG's layout (the
    JSON `report_layout` in workflow/rules/runs.smk passes to ``arnar report --layout``)."""
    metrics = json.loads(Path(metrics_path).read_text(encoding="utf-8"))
    return comparison_plots(results_from_metrics(metrics, asr), Layout(**layout), plots_dir)


def build_report(*, eval_dir: Path, testlist_dir: Path, prompts_dir: Path, systems_dir: Path,
                 systems: Sequence[str], out_dir: Path, samples: int, profile: str,
                 train_dir: Path | None = None, layout: dict | None = None) -> None:
    layout = Layout(**layout) if layout else Layout.plain(systems)
    results = load_results(eval_dir, systems, layout, testlist_dir)
    audit = json.loads((eval_dir / "ground_truth_audit.json").read_text(encoding="utf-8"))
    summaries = run_summaries(train_dir)
    tables_md = comparison_table(results, layout, run_parameters(train_dir), summaries)
    for extra in (voice_group_table(results, layout), claims_section(results, layout),
                  ablation_tables(results, layout, summaries),
                  training_table(train_dir, systems)):
        if extra:
            tables_md = f"{tables_md}\n{extra}"
    audit_md = audit_table(audit)
    write_text(out_dir / "comparison.md", f"# Comparison — profile {profile}\n\n{tables_md}")
    write_text(out_dir / "ground_truth_audit.md", f"# Ground-truth audit — profile {profile}\n\n{audit_md}")
    write_text(out_dir.parent / "metrics.json",
                 json.dumps(metrics_summary(results, audit), indent=2, sort_keys=True) + "\n")

    plots_dir = out_dir / "plots"
    plot_audit(audit, plots_dir / "ground_truth_wer_per_voice.png", plots_dir / "sim_pairs.png")
    drawn = comparison_plots(results, layout, plots_dir)
    plots = [f"plots/{name}" for name in drawn[:1] + ["ground_truth_wer_per_voice.png", "sim_pairs.png"] + drawn[1:]]
    # the comparison's rows (first seed of each paradigm) in the audio samples
    shown = layout.references + list(layout.comparison)

    # Copy the sampled audio beside the page so the folder is self-contained (and DVC-trackable).
    audio_dir = out_dir / "audio"
    shutil.rmtree(audio_dir, ignore_errors=True)
    audio_dir.mkdir(parents=True)  # a DVC out of its own (dvc.yaml), so present even with no samples
    sample_rows: dict[str, list] = {}
    for task in TASKS:
        items = read_testlist(testlist_dir / f"{task}.tsv")[:samples]
        rows = []
        for item in items:
            name = f"{item.item_id}.wav"
            prompt_rel = f"audio/{task}/prompt/{name}"
            (audio_dir / task / "prompt").mkdir(parents=True, exist_ok=True)
            shutil.copyfile(prompts_dir / task / name, out_dir / prompt_rel)
            row = {"item_id": item.item_id, "text": item.target_text, "prompt": prompt_rel, "systems": {}}
            for system in shown:
                source = systems_dir / system / task / name
                if source.exists():
                    rel = f"audio/{task}/{system}/{name}"
                    (out_dir / rel).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(source, out_dir / rel)
                    row["systems"][system] = rel
                else:
                    row["systems"][system] = None
            rows.append(row)
        sample_rows[task] = rows
    write_text(out_dir / "index.html", build_html(profile=profile, tables_md=tables_md, audit_md=audit_md,
                                                    samples=sample_rows, plots=plots))
