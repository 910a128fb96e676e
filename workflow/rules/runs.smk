from arnar import runs as runs_registry
from arnar.runs import COARSE_KINDS, COARSE_LEVELS, SYSTEMS_OF, RunsError, run_registry
from arnar.evaluate.testlists import TASKS

# The training runs and evaluated systems of the paradigms (functions and tables only; the rules
# are in train.smk). A paradigm named in training.paradigms is one or more *runs* (multi-stage
# recipes chain runs with train.init_from) and one or more evaluated *systems* (a run plus
# decoding options). The registry (src/arnar/runs.py) is the only place that knows the chaining.

TRAIN = P["training"]
# token sets: the single stream most paradigms model, and the acoustic stack CoD decimates
TOKEN_SETS = {"offline": {"single": "offline", "stack": "offline_rvq"}, "s3": {"single": "s3", "stack": "dac"}}
TOKEN_RATE = {"offline": 25, "s3": 25, "offline_rvq": 50, "dac": 86.13}  # frames per second

# The registry (arnar.runs: RUNS, SYSTEMS_OF, ABLATIONS, COARSE_KINDS; `arnar runs` prints it) of
# this profile, under the names the rules read
try:
    REGISTRY = run_registry(P)
except RunsError as err:
    raise WorkflowError(str(err))
RUNS = REGISTRY.runs
RUN_BASE = REGISTRY.run_base
DELTA_SOURCE = REGISTRY.delta_source
DELTA_RUN = RUNS["delta"]
ABLATIONS = REGISTRY.ablations
PARADIGM_SYSTEMS = REGISTRY.paradigm_systems
SEEDS_OF = REGISTRY.seeds_of
SYSTEM_SEED = REGISTRY.system_seed
SYSTEM_TASKS = REGISTRY.system_tasks
PARADIGMS = list(PARADIGM_SYSTEMS)  # evaluated systems of the paradigms (rows of the tables)


def sized_model(sized_as=None):
    return runs_registry.sized_model(TRAIN, sized_as)


def system_tasks(system):
    return SYSTEM_TASKS.get(system, TASKS)


def evaluated(pattern, systems):
    """``pattern`` for every (system, task) the evaluation covers: grid systems speak only
    training.grid_tasks."""
    return [pattern.format(system=s, task=t) for s in systems for t in system_tasks(s)]


def report_layout(references):
    """What the report needs to know of the systems, as JSON: reference rows, the comparison's
    systems with their seed replicas, the grids' values and each system's training run."""
    layout = {"references": references, "comparison": SEEDS_OF, "order": list(SEEDS_OF), "grids": TRAIN["grids"],
              "ablations": TRAIN["ablations"], "runs": {s: run for s, (run, _) in PARADIGM_SYSTEMS.items()},
              "tasks": SYSTEM_TASKS,
              "lineages": {run: REGISTRY.lineage(run) for run, _ in PARADIGM_SYSTEMS.values()},
              "ceilings": {s: ceiling_row(run) for s, (run, _) in PARADIGM_SYSTEMS.items()
                           if ceiling_row(run) in references}}
    return json.dumps(layout, sort_keys=True)


def ceiling_row(run):
    """The reference row of ``run``'s decoding path: the codec's resynthesis of the tokens it models
    (the single stream; the acoustic stack, or its first quantizer alone for a `first_quantizer` run)."""
    return f"resynth_{run_token_set(run)}" + ("_q1" if RUNS[run].get("first_quantizer") else "")


def runs_needed(run):
    """Runs that must be finished before ``run`` starts."""
    return REGISTRY.runs_needed(run)


def all_runs():
    return REGISTRY.all_runs()


ALL_RUNS = all_runs()


def train_priority(wildcards):
    """A training job's priority: the length of the chain of runs that starts at it (ar: 3 on
    speak), so the DAG starts the longest chain first; every run stays above synthesis and
    evaluation (0)."""
    return REGISTRY.chain_depth(wildcards.run, ALL_RUNS)


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
    if spec.get("init_matching"):
        overrides.append("train.init_matching=true")
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
    return (f"--codec {token_set}" + (f" --codec-model {input.codec}" if input.codec else "")
            + (f" --vocoder {CODEC['vocoder']}" if token_set.startswith("offline") else ""))


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
