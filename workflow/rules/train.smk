# Training phase: every paradigm in training.paradigms trained by the one engine (arnar.train)
# on the single-stream token set, then the frozen test lists synthesized from each run.
#
# A paradigm is one or more *runs* (multi-stage recipes chain runs with train.init_from) and one
# or more evaluated *systems* (a run plus decoding options). RUNS and SYSTEMS_OF below are the
# only place that knows the chaining; params.yaml just names the paradigms.
#
# Runs live in data/<profile>/runs/<run>/ (checkpoints, TensorBoard logs, config.yaml);
# `final.pt` marks a finished run. An interrupted run resumes from its last checkpoint when the
# rule is run again (the engine restores optimizer, RNG and data order).

TRAIN = P["training"]
TOKEN_RATE = {"offline": 25, "s3": 25}  # frames per second of the single-stream token sets
TOKENS = f"{DATA}/tokens/{TRAIN['token_set']}"
DURATIONS = f"{DATA}/align/durations_{TOKEN_RATE[TRAIN['token_set']]}hz"

# run -> Hydra paradigm config, the run it starts from, extra overrides, runs it reads
RUNS = {
    "ar": {"config": "ar"},
    "nar": {"config": "nar"},
    # SyncSpeech (syncspeech.txt 2.3): high-probability masked pre-training, then fine-tuning
    "syncspeech_pretrain": {"config": "syncspeech_pretrain"},
    "syncspeech": {"config": "syncspeech", "init_from": "syncspeech_pretrain"},
    # PALLE (palle.txt 4.2): stage two is fine-tuned from stage one at ~1/9 of its learning rate
    "palle_stage1": {"config": "palle_stage1"},
    "palle": {"config": "palle_stage2", "init_from": "palle_stage1", "lr_scale": 1 / 9},
    # DELTA-TTS converts the trained AR baseline (delta_tts.txt 3)
    "delta": {"config": "delta", "reads": ["ar"],
              "options": {"ar_run": "{runs}/ar", "bpe_model": "{data}/tokenizers/bpe.model"}},
}
# paradigm named in params.yaml -> evaluated systems: system -> (run, decoding options)
SYSTEMS_OF = {
    "ar": {"ar": ("ar", {})},
    "nar": {"nar": ("nar", {})},
    "syncspeech": {"syncspeech": ("syncspeech", {})},
    "palle": {"palle_stage1": ("palle", {"refine_steps": 0}), "palle": ("palle", {})},
    "delta": {"delta": ("delta", {})},
}
PARADIGM_SYSTEMS = {s: run for p in TRAIN["paradigms"] for s, run in SYSTEMS_OF[p].items()}
PARADIGMS = list(PARADIGM_SYSTEMS)  # evaluated systems of the paradigms (rows of the tables)


def runs_needed(run):
    spec = RUNS[run]
    before = [spec["init_from"]] if "init_from" in spec else []
    return before + spec.get("reads", [])


ALL_RUNS = []
for _system, (_run, _) in PARADIGM_SYSTEMS.items():
    for _r in [_run] + runs_needed(_run):
        if _r not in ALL_RUNS:
            ALL_RUNS.append(_r)


def run_dir(run):
    return f"{DATA}/runs/{run}"


def hydra_overrides(run):
    spec = RUNS[run]
    overrides = [f"paradigm={spec['config']}", f"model={TRAIN['model']}", f"train={TRAIN['recipe']}",
                 f"train.seed={P['seed']}"]
    if "init_from" in spec:
        overrides.append(f"train.init_from={run_dir(spec['init_from'])}")
    for key, value in spec.get("options", {}).items():  # paths of runs and files it reads
        overrides.append(f"paradigm.options.{key}={value.format(runs=f'{DATA}/runs', data=DATA)}")
    return " ".join(overrides + TRAIN["overrides"].get(run, []))


rule train:
    """Train one run (resumes from data/<profile>/runs/<run>/checkpoints/last.pt)."""
    input:
        tokens=f"{TOKENS}/train/manifest.json",
        durations=f"{DURATIONS}/train.jsonl",
        dev_tokens=f"{TOKENS}/dev/manifest.json",
        dev_durations=f"{DURATIONS}/dev.jsonl",
        bpe=f"{DATA}/tokenizers/bpe.model",
        before=lambda wildcards: [f"{run_dir(r)}/final.pt" for r in runs_needed(wildcards.run)],
    output:
        final=f"{DATA}/runs/{{run}}/final.pt",
        summary=f"{RESULTS}/train/{{run}}.json",
    params:
        run_dir=lambda wildcards: run_dir(wildcards.run),
        overrides=lambda wildcards: hydra_overrides(wildcards.run),
        lr=lambda wildcards: recipe_lr_override(wildcards.run),
        tokens=lambda wildcards, input: os.path.dirname(input.tokens),
        dev_tokens=lambda wildcards, input: os.path.dirname(input.dev_tokens),
    wildcard_constraints:
        run="|".join(ALL_RUNS) or "none",
    threads: 2
    log:
        f"{LOGS}/train_{{run}}.log",
    conda:
        CORE_ENV
    shell:
        "arnar train --run-dir {params.run_dir} --tokens {params.tokens} --durations {input.durations}"
        " --dev-tokens {params.dev_tokens} --dev-durations {input.dev_durations} --bpe {input.bpe}"
        " --threads {threads} --summary {output.summary} -- {params.overrides} {params.lr} 2> {log}"


def recipe_lr_override(run):
    """Fine-tuning stages train at a fraction of the recipe's learning rate."""
    scale = RUNS[run].get("lr_scale")
    if scale is None:
        return ""
    from arnar.train import compose_config

    lr = float(compose_config([f"train={TRAIN['recipe']}"]).train.lr)
    return f"train.lr={lr * scale:.3g}"


rule synthesize:
    """One evaluated system speaks one frozen test list (wavs + timing.jsonl for the evaluation)."""
    input:
        run=lambda wildcards: f"{run_dir(PARADIGM_SYSTEMS[wildcards.system][0])}/final.pt",
        testlist=f"{DATA}/eval/testlists/{{task}}.tsv",
        prompts=f"{DATA}/eval/prompts/{{task}}",
        bpe=f"{DATA}/tokenizers/bpe.model",
        codec=lambda wildcards: codec_model(TRAIN["token_set"]),
    output:
        system=directory(f"{DATA}/systems/{{system}}/{{task}}"),
    params:
        run_dir=lambda wildcards, input: os.path.dirname(input.run),
        codec=lambda wildcards, input: f"--codec {TRAIN['token_set']}" + (f" --codec-model {input.codec}" if input.codec else ""),
        decoding=lambda wildcards: json.dumps(
            {**PARADIGM_SYSTEMS[wildcards.system][1], **TRAIN["decoding"].get(wildcards.system, {})}, sort_keys=True),
        seed=P["seed"],
    wildcard_constraints:
        system="|".join(PARADIGMS) or "none",
    threads: 1
    log:
        f"{LOGS}/synthesize_{{system}}_{{task}}.log",
    conda:
        CORE_ENV
    shell:
        "arnar synthesize --run-dir {params.run_dir} {params.codec} --bpe {input.bpe}"
        " --testlist {input.testlist} --prompts {input.prompts} --out {output.system}"
        " --decoding '{params.decoding}' --seed {params.seed} 2> {log}"


rule training:
    """Target of the training phase (dvc.yaml stage `train`)."""
    input:
        expand("{data}/runs/{run}/final.pt", data=DATA, run=ALL_RUNS),
