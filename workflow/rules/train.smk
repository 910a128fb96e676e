# Training phase: every paradigm in training.paradigms trained by the one engine (arnar.train)
# on the single-stream token set, then the frozen test lists synthesized from each run.
#
# Runs live in data/<profile>/runs/<paradigm>/ (checkpoints, TensorBoard logs, config.yaml);
# `final.pt` marks a finished run. A run that was interrupted resumes from its last checkpoint
# when the rule is run again (the engine restores optimizer, scheduler, RNG and data order).

TRAIN = P["training"]
TOKEN_RATE = {"offline": 25, "s3": 25}  # frames per second of the single-stream token sets
TOKENS = f"{DATA}/tokens/{TRAIN['token_set']}"
DURATIONS = f"{DATA}/align/durations_{TOKEN_RATE[TRAIN['token_set']]}hz"
PARADIGMS = TRAIN["paradigms"]


def hydra_overrides(paradigm):
    extra = TRAIN["overrides"].get(paradigm, [])
    return " ".join([f"paradigm={paradigm}", f"model={TRAIN['model']}", f"train={TRAIN['recipe']}",
                     f"train.seed={P['seed']}", *extra])


rule train:
    """Train one paradigm (resumes from data/<profile>/runs/<paradigm>/checkpoints/last.pt)."""
    input:
        tokens=f"{TOKENS}/train/manifest.json",
        durations=f"{DURATIONS}/train.jsonl",
        dev_tokens=f"{TOKENS}/dev/manifest.json",
        dev_durations=f"{DURATIONS}/dev.jsonl",
        bpe=f"{DATA}/tokenizers/bpe.model",
    output:
        final=f"{DATA}/runs/{{paradigm}}/final.pt",
        summary=f"{RESULTS}/train/{{paradigm}}.json",
    params:
        run_dir=lambda wildcards: f"{DATA}/runs/{wildcards.paradigm}",
        overrides=lambda wildcards: hydra_overrides(wildcards.paradigm),
        tokens=lambda wildcards, input: os.path.dirname(input.tokens),
        dev_tokens=lambda wildcards, input: os.path.dirname(input.dev_tokens),
    wildcard_constraints:
        paradigm="|".join(PARADIGMS) or "none",
    threads: 2
    log:
        f"{LOGS}/train_{{paradigm}}.log",
    conda:
        CORE_ENV
    shell:
        "arnar train --run-dir {params.run_dir} --tokens {params.tokens} --durations {input.durations}"
        " --dev-tokens {params.dev_tokens} --dev-durations {input.dev_durations} --bpe {input.bpe}"
        " --threads {threads} --summary {output.summary} -- {params.overrides} 2> {log}"


rule synthesize:
    """One paradigm speaks one frozen test list (wavs + timing.jsonl for the evaluation)."""
    input:
        run=f"{DATA}/runs/{{paradigm}}/final.pt",
        testlist=f"{DATA}/eval/testlists/{{task}}.tsv",
        prompts=f"{DATA}/eval/prompts/{{task}}",
        bpe=f"{DATA}/tokenizers/bpe.model",
        codec=lambda wildcards: codec_model(TRAIN["token_set"]),
    output:
        system=directory(f"{DATA}/systems/{{paradigm}}/{{task}}"),
    params:
        run_dir=lambda wildcards, input: os.path.dirname(input.run),
        codec=lambda wildcards, input: f"--codec {TRAIN['token_set']}" + (f" --codec-model {input.codec}" if input.codec else ""),
        decoding=lambda wildcards: json.dumps(TRAIN["decoding"].get(wildcards.paradigm, {}), sort_keys=True),
        seed=P["seed"],
    wildcard_constraints:
        paradigm="|".join(PARADIGMS) or "none",
    threads: 1
    log:
        f"{LOGS}/synthesize_{{paradigm}}_{{task}}.log",
    conda:
        CORE_ENV
    shell:
        "arnar synthesize --run-dir {params.run_dir} {params.codec} --bpe {input.bpe}"
        " --testlist {input.testlist} --prompts {input.prompts} --out {output.system}"
        " --decoding '{params.decoding}' --seed {params.seed} 2> {log}"


rule training:
    """Target of the training phase (dvc.yaml stage `train`)."""
    input:
        expand("{data}/runs/{paradigm}/final.pt", data=DATA, paradigm=PARADIGMS),
