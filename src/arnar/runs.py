"""The run registry: the training runs and evaluated systems of the paradigms, as data.

A paradigm named in ``training.paradigms`` is one or more *runs* (multi-stage recipes chain runs
with ``train.init_from``) and one or more evaluated *systems* (a run plus decoding options).
:data:`SYSTEMS_OF` and the runs of :func:`run_registry` are the only place that knows the
chaining. The DAG (``workflow/rules/runs.smk``) builds its rules from :func:`run_registry` of the
resolved profile, and ``arnar runs`` prints the same registry, so the two cannot drift apart.
The one-knob sweeps are grids (:mod:`arnar.ablations`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from arnar.ablations import GRIDS, check_grid_values, grid_rows
from arnar.config import TRAIN_CONF_DIR

# run -> Hydra paradigm config; `init_from`: the run it starts from; `reads`: runs it loads;
# `options`: paradigm options that are paths ({runs}, {data}); `overrides`: further Hydra
# overrides (ablation variants); `stack`: models the acoustic
# stack (CoD: its first quantizer's decimations, then every codebook; `first_quantizer`: that
# quantizer alone); `features`: per-utterance inputs built by the cod_features rule;
# `sized_as`: the paradigm whose paper size it takes (sized_model)
BASE_RUNS: dict[str, dict[str, Any]] = {
    "ar": {"config": "ar"},
    "nar": {"config": "nar"},
    # SyncSpeech (arXiv:2502.11094, Sec. 2.1): high-probability masked pre-training, then fine-tuning
    "syncspeech_pretrain": {"config": "syncspeech_pretrain"},
    "syncspeech": {"config": "syncspeech", "init_from": "syncspeech_pretrain"},
    # its Table 2 ablations: fine-tuning objective only (no pre-training); causal instead of hybrid mask
    "syncspeech_nopretrain": {"config": "syncspeech"},
    "syncspeech_causal_pretrain": {"config": "syncspeech_pretrain", "overrides": ["paradigm.options.attention=causal"]},
    "syncspeech_causal": {"config": "syncspeech", "init_from": "syncspeech_causal_pretrain",
                          "overrides": ["paradigm.options.attention=causal"]},
    # PALLE (arXiv:2504.10352, Sec. 5.1): stage two is fine-tuned from stage one at ~1/9 of its learning rate
    "palle_stage1": {"config": "palle_stage1"},
    "palle": {"config": "palle_stage2", "init_from": "palle_stage1", "lr_scale": 1 / 9},
    # the same two stages on the temporal-concatenation layout (text then speech, as AR lays them out; the
    # paper's Discussion allows it beside its feature-dimension fusion), so stage one can start from AR
    "palle_concat_stage1": {"config": "palle_stage1", "overrides": ["paradigm.options.layout=concat"]},
    "palle_concat": {"config": "palle_stage2", "init_from": "palle_concat_stage1", "lr_scale": 1 / 9,
                     "overrides": ["paradigm.options.layout=concat"]},
    # DELTA-TTS converts the trained AR baseline (DELTA-TTS, OpenReview v2DbAIl7sf, Sec. 3; DELTA_SOURCE): "delta" and
    # "ar_lora" are added by run_registry, which knows the profile's model sizes
    # Chain-of-Details models the acoustic stack: temporal levels by decimating its first quantizer, the finest
    # level every codebook (paradigm option codebooks: all)
    "cod": {"config": "cod", "stack": True, "features": True, "sized_as": "cod",
            "options": {"phoneme_tokenizer": "{data}/tokenizers/phonemes.json"}},
    # the grid cod_levels: CoD with 2 and 1 temporal levels (Chain-of-Details, arXiv:2604.19330, Table IV)
    "cod_l2": {"config": "cod_l2", "stack": True, "features": True, "sized_as": "cod",
               "options": {"phoneme_tokenizer": "{data}/tokenizers/phonemes.json"}},
    "cod_l1": {"config": "cod_l1", "stack": True, "features": True, "sized_as": "cod",
               "options": {"phoneme_tokenizer": "{data}/tokenizers/phonemes.json"}},
}
# Chain-of-Details (arXiv:2604.19330) Table V: CoD whose coarse levels are tokens of another kind
# (arnar.codec.coarse; `features` names the kind, built by the coarse_tokens rule): run -> (kind, config)
COARSE_KINDS = {"cod_ind": ("independent", "cod"), "cod_shared": ("shared", "cod"), "cod_units": ("units", "cod_l2")}
COARSE_LEVELS = {kind: 2 if config == "cod_l2" else 3 for kind, config in COARSE_KINDS.values()}
# paradigm named in params.yaml -> evaluated systems: system -> (run, decoding options)
SYSTEMS_OF = {
    "ar": {"ar": ("ar", {})},
    "nar": {"nar": ("nar", {})},
    "syncspeech": {"syncspeech": ("syncspeech", {})},
    "palle": {"palle_stage1": ("palle", {"refine_steps": 0}), "palle": ("palle", {}),
              "palle_concat_stage1": ("palle_concat", {"refine_steps": 0}), "palle_concat": ("palle_concat", {})},
    "delta": {"delta": ("delta", {})},  # its steps Pareto (Fig. 2) is the grid delta_steps
    # ours (speech-prompt prefix), the paper's, ours decoding the first quantizer alone
    "cod": {"cod": ("cod", {}), "cod_paper": ("cod_paper", {}), "cod_q1": ("cod_q1", {}),
            "cod_single": ("cod_single", {})},
}


def systems_of(paradigm: str) -> dict[str, tuple[str, dict]]:
    """The evaluated systems of a paradigm named in training.paradigms: its :data:`SYSTEMS_OF`
    entry, or, for a paradigm that table does not list, one system of its name decoded with its
    defaults from one run of its name (its Hydra config src/arnar/conf/paradigm/<paradigm>.yaml;
    :func:`run_registry` adds the run). A single-run paradigm needs no entry here
    (docs/extending.md)."""
    return SYSTEMS_OF.get(paradigm, {paradigm: (paradigm, {})})


# training.palle_layouts: PALLE's rows of each layout (paradigm option `layout`)
PALLE_LAYOUT_SYSTEMS = {"fused": ("palle_stage1", "palle"), "concat": ("palle_concat_stage1", "palle_concat")}

DELTA_VARIANTS = ("delta_noconv", "delta_lora_budget", "delta_noprompt", "delta_unfrozen")


def draws_from_seed(system: str, decoding: dict) -> bool:
    """Whether a comparison system's decoding (its options, the profile's on top) draws anything
    from its synthesis seed. DELTA at temperature 0 commits each step's argmax codes in order of
    confidence and draws nothing: every seed gives the same audio (speak, 2026-12-05: the three
    seeds' wavs were the same bytes), so it speaks once and its row has no spread. Every other
    decoding here samples (AR's greedy top-k 1 too: CosyVoice's repetition-aware resampling
    draws where a code repeats)."""
    return not (system == "delta" and decoding.get("temperature") == 0)


def ablations(delta_source: str = "ar") -> dict[str, tuple[str, dict[str, tuple[str, dict]]]]:
    """Ablations named in training.ablations -> (the paradigm they vary, their extra systems); the
    one-knob sweeps are grids (training.grids, arnar.ablations.GRIDS)."""
    return {
        "syncspeech_table2": ("syncspeech", {"syncspeech_nopretrain": ("syncspeech_nopretrain", {}),
                                             "syncspeech_causal": ("syncspeech_causal", {})}),
        # DELTA-TTS (OpenReview v2DbAIl7sf) Table 5: each component of the conversion taken out (the uniform schedule is
        # the grid delta_mu: [1.0]), the fully unfrozen backbone, and the causal-LoRA baseline (the
        # AR model adapted without the conversion); with an AR source of its own (paper scale), that
        # AR model before adaptation too (elsewhere it is the comparison's `ar` row)
        "delta_table5": ("delta", {"delta_noconv": ("delta_noconv", {}),
                                   "delta_lora_budget": ("delta_lora_budget", {}),
                                   "delta_noprompt": ("delta_noprompt", {}), "delta_unfrozen": ("delta_unfrozen", {}),
                                   "ar_lora": ("ar_lora", {}),
                                   **({delta_source: (delta_source, {})} if delta_source != "ar" else {})}),
        # Chain-of-Details (arXiv:2604.19330) Table V: coarse token types (the offline codec's; needs token_set offline)
        "cod_table5": ("cod", {run: (run, {}) for run in COARSE_KINDS}),
    }


ABLATIONS = ablations()  # at the sizes where DELTA converts the comparison's `ar` run


class RunsError(ValueError):
    """params.yaml asks for runs or systems the registry cannot make (the message says why)."""


def sized_model(training: Mapping[str, Any], sized_as: str | None = None) -> str:
    """Model size. training.model names src/arnar/conf/model/<model>.yaml: the backbone the paradigms
    share in a comparison. A paradigm whose paper states a size of its own has
    <model>_<paradigm>.yaml beside it, used by the runs whose `sized_as` names that paradigm when
    the file exists: at paper scale paper_cod.yaml (CoD-Base, 263M) and paper_delta.yaml (the AR LM
    DELTA-TTS converts: CosyVoice3's Qwen2.5-0.5B); tiny and small have none, so every run shares them."""
    own = f"{training['model']}_{sized_as}"
    return own if sized_as and (TRAIN_CONF_DIR / "model" / f"{own}.yaml").exists() else training["model"]


@dataclass
class Registry:
    """The runs and systems of one resolved profile."""

    runs: dict[str, dict[str, Any]]  # run -> spec (BASE_RUNS and what the profile adds)
    run_base: dict[str, str]  # run -> the run whose per-profile overrides (training.overrides) it shares
    delta_source: str  # the AR run DELTA-TTS converts
    ablations: dict[str, tuple[str, dict[str, tuple[str, dict]]]]
    paradigm_systems: dict[str, tuple[str, dict]]  # evaluated system -> (run, decoding options)
    seeds_of: dict[str, list[str]]  # comparison system -> it and its seed replicas
    system_seed: dict[str, int]  # seed replica -> its synthesis seed
    system_tasks: dict[str, list[str]]  # systems evaluated on only some tasks (grids); the rest: every task

    def runs_needed(self, run: str) -> list[str]:
        """Runs that must be finished before ``run`` starts."""
        spec = self.runs[run]
        return ([spec["init_from"]] if "init_from" in spec else []) + spec.get("reads", [])

    def lineage(self, run: str) -> list[str]:
        """Every run whose training ``run``'s weights come from (what it starts from or loads, and
        theirs, transitively), each after the runs it needs, ``run`` last: a system's training budget
        is the sum over its lineage (DELTA converts its AR run; PALLE's stage two reads stage one)."""
        out: list[str] = []
        for needed in self.runs_needed(run):
            out += [r for r in self.lineage(needed) if r not in out]
        return out + [run]

    def chain_depth(self, run: str, among: list[str]) -> int:
        """Runs on the longest chain that starts at ``run`` (itself included): 1 for a run no run of
        ``among`` starts from or reads, 3 for ar where syncspeech_pretrain -> syncspeech start from it.
        The DAG starts the deepest first (train.smk's priority), so that the longest chain of
        training runs does not begin last and leave one core alone at the end."""
        after = [r for r in among if run in self.runs_needed(r)]
        return 1 + max((self.chain_depth(r, among) for r in after), default=0)

    def all_runs(self) -> list[str]:
        """Every run the evaluated systems need, each after the runs it needs... in first-seen order."""
        runs: list[str] = []
        for run, _ in self.paradigm_systems.values():
            for needed in [run] + self.runs_needed(run):
                if needed not in runs:
                    runs.append(needed)
        return runs


def run_registry(params: Mapping[str, Any]) -> Registry:
    """The registry of a resolved profile (:func:`arnar.config.resolve_profile`): its runs, their
    chains and the evaluated systems of training.paradigms, training.ablations and training.grids."""
    train = params["training"]
    # DELTA-TTS converts a trained AR model of its own size (DELTA-TTS, OpenReview v2DbAIl7sf, Sec. 3): the comparison's `ar`
    # run where the sizes agree, else an AR run of DELTA's size, `delta_ar` (paper scale)
    delta_source = "ar" if sized_model(train, "delta") == sized_model(train) else "delta_ar"
    delta_run = {"config": "delta", "sized_as": "delta", "reads": [delta_source],
                 "options": {"ar_run": f"{{runs}}/{delta_source}", "bpe_model": "{text_units}"}}
    runs: dict[str, dict[str, Any]] = {}
    for name, spec in BASE_RUNS.items():
        if name == "cod":
            runs["delta"] = delta_run
            # DELTA-TTS (OpenReview v2DbAIl7sf) Table 5's causal-LoRA baseline: the same AR model with DELTA's LoRA adapters,
            # fine-tuned with the AR objective (causal, next token) on the same data for the same updates
            # (run_base: delta's per-profile overrides) and decoded autoregressively, so that
            # delta - ar_lora is the conversion's effect without the extra training (delta.py `causal`)
            runs["ar_lora"] = {**delta_run,
                               "overrides": ["paradigm.options.causal=true", "paradigm.options.conv=false"]}
        runs[name] = spec
    # The paper's CoD: voice from the adaLN speaker embedding only (Chain-of-Details, arXiv:2604.19330, Sec. IV-A, Fig. 2),
    # where `cod` (this project's variant) also keeps the prompt's tokens as an unmasked prefix. The
    # same run as `cod` otherwise, with cod's per-profile overrides (run_base: the same updates). It
    # is a row of the comparison (SYSTEMS_OF) rather than an ablation set: it is the paper's model,
    # so it belongs beside the other papers' systems, speaks both tasks with every synthesis seed, and
    # `cod` vs `cod_paper` is read against the same seed spread as every other pair of rows.
    runs["cod_paper"] = {**runs["cod"],
                         "overrides": runs["cod"].get("overrides", []) + ["paradigm.options.speech_prompt=false"]}
    # CoD generating the first quantizer alone, which the codec decodes on its own (the variant this
    # project had before complete acoustic tokens; its reference row is resynth_<stack>_q1)
    runs["cod_q1"] = {**runs["cod"], "first_quantizer": True,
                      "overrides": runs["cod"].get("overrides", []) + ["paradigm.options.codebooks=1"]}
    # CoD on the single stream every other paradigm models (offline: the 25 Hz one-codebook tokens;
    # its levels decimate that stream, the finest level is the complete token; reference row: the
    # single stream's resynthesis), so that CoD is compared on the others' tokens too. The stack's
    # codebooks 2..K are what a one-pass head of the default's size does not learn (the ladder's
    # level-forced rung, docs/lab-notes/2026-12-07-evening-cod-palle-ladder.md)
    runs["cod_single"] = {**runs["cod"], "stack": False}
    if delta_source != "ar":
        runs[delta_source] = {"config": "ar", "sized_as": "delta"}
    for run, (kind, config) in COARSE_KINDS.items():
        runs[run] = {"config": config, "stack": True, "features": kind, "sized_as": "cod",
                     "options": {"phoneme_tokenizer": "{data}/tokenizers/phonemes.json",
                                 "coarse_tokenizer": f"{{data}}/codec/coarse_{kind}"}}
    # a paradigm SYSTEMS_OF does not list: one run of its name, from its Hydra config (systems_of)
    for paradigm in train["paradigms"]:
        if paradigm not in SYSTEMS_OF and paradigm not in runs:
            runs[paradigm] = {"config": paradigm}
    # training.start_from_ar: runs that start from the trained `ar` run's weights (those tensors
    # both models have, train.init_matching) instead of a fresh initialisation: not in the papers
    # (each trains from scratch), a lever for small corpora; their budget is ar's plus their own
    for run in train.get("start_from_ar", []):
        if run not in runs or run == "ar":
            raise RunsError(f"params.yaml: training.start_from_ar lists {run!r}, not a run that can start from ar "
                            f"(runs: {', '.join(r for r in runs if r != 'ar')})")
        if "init_from" in runs[run] or "reads" in runs[run]:
            raise RunsError(f"params.yaml: training.start_from_ar lists {run!r}, which already starts from or reads "
                            f"another run; list the first run of its recipe")
        if runs[run].get("stack"):
            raise RunsError(f"params.yaml: training.start_from_ar lists {run!r}, which models the acoustic stack's "
                            f"tokens (another vocabulary than ar's)")
        runs[run] = {**runs[run], "init_from": "ar", "init_matching": True}
    ablation_sets = ablations(delta_source)
    run_base: dict[str, str] = {}
    for variant in DELTA_VARIANTS:
        runs[variant] = {**runs["delta"], "config": variant}
        run_base[variant] = "delta"
    run_base["ar_lora"] = "delta"  # the same updates as the conversion
    run_base.update({run: "cod" for run in COARSE_KINDS})
    run_base["cod_paper"] = "cod"  # the same budget as the variant it is compared with
    run_base["cod_q1"] = "cod"
    run_base["cod_single"] = "cod"
    run_base.update({"palle_concat_stage1": "palle_stage1", "palle_concat": "palle"})  # the fused pair's budget

    def check_paradigm_listed(what: str, paradigm: str) -> None:
        if paradigm not in train["paradigms"]:
            raise RunsError(f"params.yaml: {what} varies paradigm {paradigm!r}: add it to training.paradigms")

    # The comparison: every paradigm's systems, each synthesized with evaluation.synthesis_seeds
    # seeds (system, system_seed2, ...), so the report can show the spread over seeds
    n_seeds = params["evaluation"]["synthesis_seeds"]
    paradigm_systems = {s: run for p in train["paradigms"] for s, run in systems_of(p).items()}
    for variant in ("cod_paper", "cod_q1", "cod_single"):  # a profile short of time keeps the project's CoD row (`cod`) only
        if not train[variant]:
            paradigm_systems.pop(variant, None)
    for layout, systems in PALLE_LAYOUT_SYSTEMS.items():  # training.palle_layouts: which PALLE rows
        if layout not in train["palle_layouts"]:
            for system in systems:
                paradigm_systems.pop(system, None)
    seeds_of = {s: [s] + [f"{s}_seed{k}" for k in range(2, n_seeds + 1)
                          if draws_from_seed(s, {**options, **train["decoding"].get(s, {})})]
                for s, (_, options) in paradigm_systems.items()}
    system_seed = {replica: params["seed"] + k for replicas in seeds_of.values() for k, replica in enumerate(replicas)
                   if k > 0}
    for system, replicas in seeds_of.items():
        paradigm_systems.update({replica: paradigm_systems[system] for replica in replicas[1:]})
    system_tasks: dict[str, list[str]] = {}

    for ablation in train["ablations"]:
        paradigm, systems = ablation_sets[ablation]
        check_paradigm_listed(f"training.ablations lists {ablation!r}, which", paradigm)
        if ablation == "cod_table5" and train["token_set"] != "offline":
            raise RunsError(f"params.yaml: training.ablations lists 'cod_table5', whose coarse tokens are made from "
                            f"the offline codec's latents (arnar.codec.coarse); token_set is {train['token_set']!r}")
        paradigm_systems.update(systems)
        system_tasks.update({system: train["grid_tasks"] for system in systems})

    # grids: a decoding value is one more system of the base run; a training value one more run
    for axis, values in train["grids"].items():
        try:
            check_grid_values(axis, values)
        except ValueError as err:
            raise RunsError(f"params.yaml: {err}") from None
        grid = GRIDS[axis]
        check_paradigm_listed(f"training.grids.{axis}", grid.paradigm)
        base_run, base_options = SYSTEMS_OF[grid.paradigm][grid.base]
        base_decoding = train["decoding"].get(grid.base, {})
        if not grid.training and not grid.shared and grid.decoding in base_decoding:
            # the axis' default value *is* the base system: decoded otherwise, its row would be mislabelled
            raise RunsError(f"params.yaml: training.decoding.{grid.base} sets {grid.decoding!r}, the option the grid "
                            f"{axis} varies (its default {grid.default!r} is the {grid.base} row): change the "
                            f"paradigm's default or leave the option to the grid")
        for value, system in grid_rows(axis, values):
            if system == grid.base:
                continue
            if grid.training:
                if system not in runs:  # a config_of run (cod_l2) is defined above
                    runs[system] = {**runs[base_run],
                                    "overrides": runs[base_run].get("overrides", []) + [f"{grid.override}={value}"]}
                run_base[system] = base_run
                paradigm_systems[system] = (system, base_options)
            else:
                # decoded as the base system is (its training.decoding options too), but for the axis' option
                paradigm_systems[system] = (base_run, {**base_options, **base_decoding, **grid.shared,
                                                       grid.decoding: value})
            system_tasks[system] = train["grid_tasks"]
    return Registry(runs=runs, run_base=run_base, delta_source=delta_source, ablations=ablation_sets,
                    paradigm_systems=paradigm_systems, seeds_of=seeds_of, system_seed=system_seed,
                    system_tasks=system_tasks)
