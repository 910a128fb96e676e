from arnar.ablations import GRIDS, check_grid_values, grid_rows
from arnar.config import TRAIN_CONF_DIR
from arnar.evaluate.testlists import TASKS

# The training runs and evaluated systems of the paradigms (functions and tables only; the rules
# are in train.smk). A paradigm named in training.paradigms is one or more *runs* (multi-stage
# recipes chain runs with train.init_from) and one or more evaluated *systems* (a run plus
# decoding options). RUNS and SYSTEMS_OF are the only place that knows the chaining.

TRAIN = P["training"]
# token sets: the single stream most paradigms model, and the acoustic stack CoD decimates
TOKEN_SETS = {"offline": {"single": "offline", "stack": "offline_rvq"}, "s3": {"single": "s3", "stack": "dac"}}
TOKEN_RATE = {"offline": 25, "s3": 25, "offline_rvq": 50, "dac": 86.13}  # frames per second


# Model size. training.model names src/arnar/conf/model/<model>.yaml: the backbone the paradigms
# share in a comparison. A paradigm whose paper states a size of its own has
# <model>_<paradigm>.yaml beside it, used by the runs whose `sized_as` names that paradigm when
# the file exists: at paper scale paper_cod.yaml (CoD-Base, 263M) and paper_delta.yaml (the AR LM
# DELTA-TTS converts: CosyVoice3's Qwen2.5-0.5B); tiny and small have none, so every run shares them.
def sized_model(sized_as=None):
    own = f"{TRAIN['model']}_{sized_as}"
    return own if sized_as and (TRAIN_CONF_DIR / "model" / f"{own}.yaml").exists() else TRAIN["model"]


# DELTA-TTS converts a trained AR model of its own size (delta_tts.txt 3): the comparison's `ar`
# run where the sizes agree, else an AR run of DELTA's size, `delta_ar` (paper scale)
DELTA_SOURCE = "ar" if sized_model("delta") == sized_model() else "delta_ar"
DELTA_RUN = {"config": "delta", "sized_as": "delta", "reads": [DELTA_SOURCE],
             "options": {"ar_run": f"{{runs}}/{DELTA_SOURCE}", "bpe_model": "{text_units}"}}

# run -> Hydra paradigm config; `init_from`: the run it starts from; `reads`: runs it loads;
# `options`: paradigm options that are paths ({runs}, {data}); `overrides`: further Hydra
# overrides (ablation variants); `stack`: models the acoustic
# stack's first quantizer; `features`: per-utterance inputs built by the cod_features rule;
# `sized_as`: the paradigm whose paper size it takes (sized_model)
RUNS = {
    "ar": {"config": "ar"},
    "nar": {"config": "nar"},
    # SyncSpeech (syncspeech.txt 2.3): high-probability masked pre-training, then fine-tuning
    "syncspeech_pretrain": {"config": "syncspeech_pretrain"},
    "syncspeech": {"config": "syncspeech", "init_from": "syncspeech_pretrain"},
    # its Table 2 ablations: fine-tuning objective only (no pre-training); causal instead of hybrid mask
    "syncspeech_nopretrain": {"config": "syncspeech"},
    "syncspeech_causal_pretrain": {"config": "syncspeech_pretrain", "overrides": ["paradigm.options.attention=causal"]},
    "syncspeech_causal": {"config": "syncspeech", "init_from": "syncspeech_causal_pretrain",
                          "overrides": ["paradigm.options.attention=causal"]},
    # PALLE (palle.txt 4.2): stage two is fine-tuned from stage one at ~1/9 of its learning rate
    "palle_stage1": {"config": "palle_stage1"},
    "palle": {"config": "palle_stage2", "init_from": "palle_stage1", "lr_scale": 1 / 9},
    # DELTA-TTS converts the trained AR baseline (delta_tts.txt 3; DELTA_SOURCE)
    "delta": DELTA_RUN,
    # delta_tts.txt Table 5's causal-LoRA baseline: the same AR model with DELTA's LoRA adapters,
    # fine-tuned with the AR objective (causal, next token) on the same data for the same updates
    # (RUN_BASE below: delta's per-profile overrides) and decoded autoregressively, so that
    # delta - ar_lora is the conversion's effect without the extra training (delta.py `causal`)
    "ar_lora": {**DELTA_RUN, "overrides": ["paradigm.options.causal=true", "paradigm.options.conv=false"]},
    # Chain-of-Details models the first quantizer of the acoustic stack, temporal levels by decimation
    "cod": {"config": "cod", "stack": True, "features": True, "sized_as": "cod",
            "options": {"phoneme_tokenizer": "{data}/tokenizers/phonemes.json"}},
    # the grid cod_levels: CoD with 2 and 1 temporal levels (chain_of_details.txt Table IV)
    "cod_l2": {"config": "cod_l2", "stack": True, "features": True, "sized_as": "cod",
               "options": {"phoneme_tokenizer": "{data}/tokenizers/phonemes.json"}},
    "cod_l1": {"config": "cod_l1", "stack": True, "features": True, "sized_as": "cod",
               "options": {"phoneme_tokenizer": "{data}/tokenizers/phonemes.json"}},
}
# The paper's CoD: voice from the adaLN speaker embedding only (chain_of_details.txt IV-A, Fig. 2),
# where `cod` (this project's variant) also keeps the prompt's tokens as an unmasked prefix. The
# same run as `cod` otherwise, with cod's per-profile overrides (RUN_BASE: the same updates). It
# is a row of the comparison (SYSTEMS_OF) rather than an ablation set: it is the paper's model,
# so it belongs beside the other papers' systems, speaks both tasks with every synthesis seed, and
# `cod` vs `cod_paper` is read against the same seed spread as every other pair of rows.
RUNS["cod_paper"] = {**RUNS["cod"],
                     "overrides": RUNS["cod"].get("overrides", []) + ["paradigm.options.speech_prompt=false"]}
if DELTA_SOURCE != "ar":
    RUNS[DELTA_SOURCE] = {"config": "ar", "sized_as": "delta"}
# chain_of_details.txt Table V: CoD whose coarse levels are tokens of another kind
# (arnar.codec.coarse; `features` names the kind, built by the coarse_tokens rule)
COARSE_KINDS = {"cod_ind": ("independent", "cod"), "cod_shared": ("shared", "cod"), "cod_units": ("units", "cod_l2")}
for _run, (_kind, _config) in COARSE_KINDS.items():
    RUNS[_run] = {"config": _config, "stack": True, "features": _kind, "sized_as": "cod",
                  "options": {"phoneme_tokenizer": "{data}/tokenizers/phonemes.json",
                              "coarse_tokenizer": f"{{data}}/codec/coarse_{_kind}"}}
COARSE_LEVELS = {kind: 2 if config == "cod_l2" else 3 for kind, config in COARSE_KINDS.values()}
# paradigm named in params.yaml -> evaluated systems: system -> (run, decoding options)
SYSTEMS_OF = {
    "ar": {"ar": ("ar", {})},
    "nar": {"nar": ("nar", {})},
    "syncspeech": {"syncspeech": ("syncspeech", {})},
    "palle": {"palle_stage1": ("palle", {"refine_steps": 0}), "palle": ("palle", {})},
    "delta": {"delta": ("delta", {})},  # its steps Pareto (Fig. 2) is the grid delta_steps
    "cod": {"cod": ("cod", {}), "cod_paper": ("cod_paper", {})},  # ours (speech-prompt prefix), the paper's
}
# ablations named in training.ablations -> (the paradigm they vary, their extra systems); the
# one-knob sweeps are grids (training.grids, arnar.ablations.GRIDS)
ABLATIONS = {
    "syncspeech_table2": ("syncspeech", {"syncspeech_nopretrain": ("syncspeech_nopretrain", {}),
                                         "syncspeech_causal": ("syncspeech_causal", {})}),
    # delta_tts.txt Table 5: each component of the conversion taken out (the uniform schedule is
    # the grid delta_mu: [1.0]), the fully unfrozen backbone, and the causal-LoRA baseline (the
    # AR model adapted without the conversion); with an AR source of its own (paper scale), that
    # AR model before adaptation too (elsewhere it is the comparison's `ar` row)
    "delta_table5": ("delta", {"delta_noconv": ("delta_noconv", {}), "delta_lora_budget": ("delta_lora_budget", {}),
                               "delta_noprompt": ("delta_noprompt", {}), "delta_unfrozen": ("delta_unfrozen", {}),
                               "ar_lora": ("ar_lora", {}),
                               **({DELTA_SOURCE: (DELTA_SOURCE, {})} if DELTA_SOURCE != "ar" else {})}),
    # chain_of_details.txt Table V: coarse token types (the offline codec's; needs token_set offline)
    "cod_table5": ("cod", {run: (run, {}) for run in COARSE_KINDS}),
}
# run -> the run whose per-profile overrides (training.overrides) it shares: variants and grid values
RUN_BASE = {}
for _variant in ("delta_noconv", "delta_lora_budget", "delta_noprompt", "delta_unfrozen"):
    RUNS[_variant] = {**RUNS["delta"], "config": _variant}
    RUN_BASE[_variant] = "delta"
RUN_BASE["ar_lora"] = "delta"  # the same updates as the conversion
RUN_BASE.update({run: "cod" for run in COARSE_KINDS})
RUN_BASE["cod_paper"] = "cod"  # the same budget as the variant it is compared with


def check_paradigm_listed(what, paradigm):
    if paradigm not in TRAIN["paradigms"]:
        raise WorkflowError(f"params.yaml: {what} varies paradigm {paradigm!r}: add it to training.paradigms")


# The comparison: every paradigm's systems, each synthesized with evaluation.synthesis_seeds
# seeds (system, system_seed2, ...), so the report can show the spread over seeds
PARADIGM_SYSTEMS = {s: run for p in TRAIN["paradigms"] for s, run in SYSTEMS_OF[p].items()}
SEEDS_OF = {s: [s] + [f"{s}_seed{k}" for k in range(2, P["evaluation"]["synthesis_seeds"] + 1)]
            for s in PARADIGM_SYSTEMS}
SYSTEM_SEED = {f"{s}_seed{k}": P["seed"] + k - 1 for s in PARADIGM_SYSTEMS
               for k in range(2, P["evaluation"]["synthesis_seeds"] + 1)}
for _system, _replicas in SEEDS_OF.items():
    PARADIGM_SYSTEMS.update({replica: PARADIGM_SYSTEMS[_system] for replica in _replicas[1:]})
SYSTEM_TASKS = {}  # systems evaluated on only some tasks (grids); the rest: every task

for _ablation in TRAIN["ablations"]:
    _paradigm, _systems = ABLATIONS[_ablation]
    check_paradigm_listed(f"training.ablations lists {_ablation!r}, which", _paradigm)
    if _ablation == "cod_table5" and TRAIN["token_set"] != "offline":
        raise WorkflowError(f"params.yaml: training.ablations lists 'cod_table5', whose coarse tokens are made from "
                            f"the offline codec's latents (arnar.codec.coarse); token_set is {TRAIN['token_set']!r}")
    PARADIGM_SYSTEMS.update(_systems)
    SYSTEM_TASKS.update({_system: TRAIN["grid_tasks"] for _system in _systems})

# grids: a decoding value is one more system of the base run; a training value one more run
for _axis, _values in TRAIN["grids"].items():
    try:
        check_grid_values(_axis, _values)
    except ValueError as err:
        raise WorkflowError(f"params.yaml: {err}")
    _grid = GRIDS[_axis]
    check_paradigm_listed(f"training.grids.{_axis}", _grid.paradigm)
    _base_run, _base_options = SYSTEMS_OF[_grid.paradigm][_grid.base]
    _base_decoding = TRAIN["decoding"].get(_grid.base, {})
    if not _grid.training and not _grid.shared and _grid.decoding in _base_decoding:
        # the axis' default value *is* the base system: decoded otherwise, its row would be mislabelled
        raise WorkflowError(f"params.yaml: training.decoding.{_grid.base} sets {_grid.decoding!r}, the option the grid "
                            f"{_axis} varies (its default {_grid.default!r} is the {_grid.base} row): change the "
                            f"paradigm's default or leave the option to the grid")
    for _value, _system in grid_rows(_axis, _values):
        if _system == _grid.base:
            continue
        if _grid.training:
            if _system not in RUNS:  # a config_of run (cod_l2) is defined above
                RUNS[_system] = {**RUNS[_base_run],
                                 "overrides": RUNS[_base_run].get("overrides", []) + [f"{_grid.override}={_value}"]}
            RUN_BASE[_system] = _base_run
            PARADIGM_SYSTEMS[_system] = (_system, _base_options)
        else:
            # decoded as the base system is (its training.decoding options too), but for the axis' option
            PARADIGM_SYSTEMS[_system] = (_base_run, {**_base_options, **_base_decoding, **_grid.shared,
                                                     _grid.decoding: _value})
        SYSTEM_TASKS[_system] = TRAIN["grid_tasks"]
PARADIGMS = list(PARADIGM_SYSTEMS)  # evaluated systems of the paradigms (rows of the tables)


def system_tasks(system):
    return SYSTEM_TASKS.get(system, TASKS)


def evaluated(pattern, systems):
    """``pattern`` for every (system, task) the evaluation covers: grid systems speak only
    training.grid_tasks."""
    return [pattern.format(system=s, task=t) for s in systems for t in system_tasks(s)]


def report_layout(references):
    """What the report needs to know of the systems, as JSON: reference rows, the comparison's
    systems with their seed replicas, the grids' values and each system's training run."""
    layout = {"references": references, "comparison": SEEDS_OF, "grids": TRAIN["grids"],
              "ablations": TRAIN["ablations"], "runs": {s: run for s, (run, _) in PARADIGM_SYSTEMS.items()},
              "tasks": SYSTEM_TASKS}
    return json.dumps(layout, sort_keys=True)


def runs_needed(run):
    """Runs that must be finished before ``run`` starts."""
    spec = RUNS[run]
    return ([spec["init_from"]] if "init_from" in spec else []) + spec.get("reads", [])


def all_runs():
    runs = []
    for run, _ in PARADIGM_SYSTEMS.values():
        for needed in [run] + runs_needed(run):
            if needed not in runs:
                runs.append(needed)
    return runs


ALL_RUNS = all_runs()


def run_dir(run):
    return f"{DATA}/runs/{run}"


def run_model(run):
    """The Hydra model config of a run (sized_model)."""
    return sized_model(RUNS[run].get("sized_as"))


def run_token_set(run):
    return TOKEN_SETS[TRAIN["token_set"]]["stack" if RUNS[run].get("stack") else "single"]


def run_tokens(run, split):
    return f"{DATA}/tokens/{run_token_set(run)}/{split}/manifest.json"


def run_durations(run, split):
    return f"{DATA}/align/durations_{TOKEN_RATE[run_token_set(run)]}hz/{split}.jsonl"


def run_features(run, split):
    """The CoD features of a run: phonemes and speaker (`features: True`), plus coarse tokens of
    a kind (`features: <kind>`, Table V)."""
    kind = RUNS[run].get("features")
    if not kind:
        return []
    return [f"{DATA}/features/cod_{split}.pt" if kind is True else f"{DATA}/features/cod_{kind}_{split}.pt"]


def run_inputs(wildcards):
    run = wildcards.run
    return {
        "tokens": run_tokens(run, "train"), "durations": run_durations(run, "train"),
        "dev_tokens": run_tokens(run, "dev"), "dev_durations": run_durations(run, "dev"),
        "features": run_features(run, "train"), "dev_features": run_features(run, "dev"),
        "before": [f"{run_dir(r)}/final.pt" for r in runs_needed(run)],
        # the Hydra files that define the run: editing one retrains it
        "conf": [f"src/arnar/conf/paradigm/{RUNS[run]['config']}.yaml", f"src/arnar/conf/model/{run_model(run)}.yaml",
                 f"src/arnar/conf/train/{TRAIN['recipe']}.yaml", "src/arnar/conf/config.yaml"],
    }


def recipe_lr_override(run):
    """Fine-tuning stages train at a fraction of the recipe's learning rate."""
    scale = RUNS[run].get("lr_scale")
    if scale is None:
        return []
    from arnar.train import compose_config

    lr = float(compose_config([f"train={TRAIN['recipe']}"]).train.lr)
    return [f"train.lr={lr * scale:.3g}"]


def hydra_overrides(wildcards, input):
    run = wildcards.run
    spec = RUNS[run]
    overrides = [f"paradigm={spec['config']}", f"model={run_model(run)}", f"train={TRAIN['recipe']}",
                 f"train.seed={P['seed']}"]
    if "init_from" in spec:
        overrides.append(f"train.init_from={run_dir(spec['init_from'])}")
    for key, value in spec.get("options", {}).items():
        overrides.append(f"paradigm.options.{key}={value.format(runs=f'{DATA}/runs', data=DATA, text_units=TEXT_UNITS)}")
    overrides += spec.get("overrides", [])
    if input.features:
        overrides += [f"data.features={input.features[0]}", f"data.dev_features={input.dev_features[0]}"]
    profile_overrides = TRAIN["overrides"].get(run, TRAIN["overrides"].get(RUN_BASE.get(run), []))
    return " ".join(overrides + recipe_lr_override(run) + profile_overrides)


def system_codec(wildcards, input):
    """The codec a system's tokens decode with (the acoustic stack: first quantizer only)."""
    token_set = run_token_set(PARADIGM_SYSTEMS[wildcards.system][0])
    return f"--codec {token_set}" + (f" --codec-model {input.codec}" if input.codec else "")


def system_codec_model(wildcards):
    return codec_model(run_token_set(PARADIGM_SYSTEMS[wildcards.system][0]))


def seed_base(system):
    """The system a seed replica repeats (ar_seed2 -> ar); a system is its own base."""
    return next((base for base, replicas in SEEDS_OF.items() if system in replicas), system)


def system_decoding(wildcards):
    options = {**PARADIGM_SYSTEMS[wildcards.system][1], **TRAIN["decoding"].get(seed_base(wildcards.system), {})}
    return json.dumps(options, sort_keys=True)


def system_seed(wildcards):
    return SYSTEM_SEED.get(wildcards.system, P["seed"])
