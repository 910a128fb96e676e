# Training phase: every run of the paradigms in training.paradigms (runs.smk) trained by the one
# engine (arnar.train), then the frozen test lists synthesized by every evaluated system.
#
# Runs live in data/<profile>/runs/<run>/ (checkpoints, TensorBoard logs, config.yaml);
# `final.pt` marks a finished run. An interrupted run resumes from its last checkpoint when the
# rule runs again (the engine restores optimizer, RNG and data order); a run whose model, data or
# tokens changed starts afresh (--resume-if-compatible).


rule cod_features:
    """Chain-of-Details inputs per utterance: phoneme ids and a speaker embedding."""
    input:
        cuts=f"{DATA}/manifests/{{split}}_cuts.jsonl",
        phonemes=f"{DATA}/tokenizers/phonemes.json",
    output:
        features=f"{DATA}/features/cod_{{split}}.pt",
    wildcard_constraints:
        split="train|dev",
    log:
        f"{LOGS}/cod_features_{{split}}.log",
    priority: 1  # as align
    conda:
        CORE_ENV
    shell:
        "arnar cod-features --cuts {input.cuts} --phonemes {input.phonemes} --out {output.features} 2> {log}"


rule coarse_tokens:
    """CoD Table V: coarse tokens of another kind, fitted on train, added to both splits' features."""
    input:
        codec=f"{DATA}/codec/offline",
        cuts=[f"{DATA}/manifests/{split}_cuts.jsonl" for split in ("train", "dev")],
        features=[f"{DATA}/features/cod_{split}.pt" for split in ("train", "dev")],
    output:
        tokenizer=directory(f"{DATA}/codec/coarse_{{kind}}"),
        features=[f"{DATA}/features/cod_{{kind}}_{split}.pt" for split in ("train", "dev")],
    params:
        levels=lambda wildcards: COARSE_LEVELS[wildcards.kind],
        seed=P["seed"],
    wildcard_constraints:
        kind="|".join(COARSE_LEVELS),
    threads: 2
    priority: 1  # as train: the training chains are the DAG's long paths
    log:
        f"{LOGS}/coarse_tokens_{{kind}}.log",
    conda:
        CORE_ENV
    shell:
        "arnar coarse-tokens --kind {wildcards.kind} --levels {params.levels} --codec-model {input.codec}"
        " --split {input.cuts[0]} {input.features[0]} {output.features[0]}"
        " --split {input.cuts[1]} {input.features[1]} {output.features[1]}"
        " --out {output.tokenizer} --seed {params.seed} --no-progress 2> {log}"


rule train:
    """Train one run (resumes from data/<profile>/runs/<run>/checkpoints/last.pt)."""
    input:
        unpack(run_inputs),
        bpe=TEXT_UNITS,
    output:
        final=f"{DATA}/runs/{{run}}/final.pt",
        summary=f"{RESULTS}/train/{{run}}.json",
    params:
        run_dir=lambda wildcards, output: os.path.dirname(output.final),
        overrides=hydra_overrides,
        tokens=lambda wildcards, input: os.path.dirname(input.tokens),
        dev_tokens=lambda wildcards, input: os.path.dirname(input.dev_tokens),
    wildcard_constraints:
        run="|".join(ALL_RUNS) or "none",
    threads: TRAIN["threads"]
    # Runs first, synthesis and evaluation in between: the chains of runs (pre-training ->
    # fine-tuning -> grid runs, features -> coarse tokens -> runs) are the DAG's long paths, and
    # started last they leave a core idle at the end (mini: 5 minutes of one core). The longest
    # chain first (ar on speak, which three runs wait for; left to the scheduler, ar once started
    # 27 min into the training phase, 2026-12-06)
    priority: train_priority
    resources:
        gpu=0,  # GPUs of the job (the SLURM profile sets it); above 1, torchrun starts a rank per GPU
    log:
        f"{LOGS}/train_{{run}}.log",
    conda:
        CORE_ENV
    shell:
        "$(test {resources.gpu} -le 1 || echo torchrun --standalone --nproc_per_node {resources.gpu} --no-python)"
        " arnar train --run-dir {params.run_dir} --tokens {params.tokens} --durations {input.durations}"
        " --dev-tokens {params.dev_tokens} --dev-durations {input.dev_durations} --text-units {input.bpe}"
        " --threads {threads} --summary {output.summary} --resume-if-compatible"
        " --fresh-if-older-than {input.before} -- {params.overrides}"
        " 2> {log}"


rule synthesize:
    """One evaluated system speaks one frozen test list (wavs + timing.jsonl for the evaluation)."""
    input:
        run=lambda wildcards: f"{run_dir(PARADIGM_SYSTEMS[wildcards.system][0])}/final.pt",
        testlist=f"{DATA}/eval/testlists/{{task}}.tsv",
        prompts=f"{DATA}/eval/prompts/{{task}}",
        bpe=TEXT_UNITS,
        codec=system_codec_model,
        # the forced aligner's word timings of the test split: SyncSpeech splits the prompt's
        # speech at its text tokens' real end frames (uniformly only where an item has none)
        prompt_alignments=f"{DATA}/align/{ALIGN['aligner']}/test.jsonl",
    output:
        system=directory(f"{DATA}/systems/{{system}}/{{task}}"),
    params:
        run_dir=lambda wildcards, input: os.path.dirname(input.run),
        codec=system_codec,
        decoding=system_decoding,
        seed=system_seed,
        silence_dbfs=P["validation"]["silence_dbfs"],  # a prompt below the ingest's level is refused
        # the quality audio in batches, the speed columns from items decoded alone
        batch=(f"--batch-size {P['evaluation']['synthesis_batch_size']}"
               f" --timing-items {P['evaluation']['timing_items']}"),
    wildcard_constraints:
        system="|".join(map(re.escape, PARADIGMS)) or "none",
    threads: 1
    log:
        f"{LOGS}/synthesize_{{system}}_{{task}}.log",
    conda:
        CORE_ENV
    shell:
        "arnar synthesize --run-dir {params.run_dir} {params.codec} --text-units {input.bpe}"
        " --testlist {input.testlist} --prompts {input.prompts} --out {output.system}"
        " --decoding '{params.decoding}' --seed {params.seed} --prompt-alignments {input.prompt_alignments}"
        " --silence-dbfs {params.silence_dbfs} {params.batch} 2> {log}"


rule training:
    """Target of the training phase (dvc.yaml stage `train`)."""
    input:
        expand("{data}/runs/{run}/final.pt", data=DATA, run=ALL_RUNS),
