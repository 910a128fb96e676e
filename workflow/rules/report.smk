# Report phase: paper-format tables, plots and an HTML page with audio players.


rule report:
    """Markdown tables, plots, metrics.json (DVC metrics) and index.html with audio."""
    input:
        evaluations=rules.evaluate.input,
        audit=rules.ground_truth_audit.output.json,
        testlists=expand("{data}/eval/testlists/{task}.tsv", data=DATA, task=TASKS),
        prompts=expand("{data}/eval/prompts/{task}", data=DATA, task=TASKS),
        systems=evaluated(f"{DATA}/systems/{{system}}/{{task}}", SYSTEMS),
        training=expand("{results}/train/{run}.json", results=RESULTS, run=ALL_RUNS),
    output:
        tables=report(f"{RESULTS}/report/comparison.md", caption="../report/comparison.rst", category="Evaluation"),
        audit=report(f"{RESULTS}/report/ground_truth_audit.md", caption="../report/audit.rst", category="Evaluation"),
        metrics=f"{RESULTS}/metrics.json",
        html=f"{RESULTS}/report/index.html",
        plots=report(
            directory(f"{RESULTS}/report/plots"),
            patterns=["{name}.png"],
            caption="../report/plots.rst",
            category="Evaluation",
        ),
    params:
        eval_dir=lambda wildcards, input: os.path.dirname(input.audit),
        profile=PROFILE,
        testlists=lambda wildcards, input: os.path.dirname(input.testlists[0]),
        prompts=lambda wildcards, input: os.path.dirname(input.prompts[0]),
        systems_dir=lambda wildcards, input: os.path.dirname(os.path.dirname(input.systems[0])),
        systems=" ".join(SYSTEMS),
        layout=report_layout(SYSTEMS[: len(SYSTEMS) - len(PARADIGMS)]),
        samples=EVAL["report_samples"],
        out_dir=lambda wildcards, output: os.path.dirname(output.html),
        train_dir=lambda wildcards, input: f"--train-dir {os.path.dirname(input.training[0])}" if input.training else "",
    log:
        f"{LOGS}/report.log",
    conda:
        CORE_ENV
    shell:
        "arnar report --eval-dir {params.eval_dir} --testlists {params.testlists}"
        " --prompts {params.prompts} --systems-dir {params.systems_dir} --systems {params.systems}"
        " --samples {params.samples} --profile {params.profile} --out-dir {params.out_dir}"
        " --layout '{params.layout}' {params.train_dir} 2> {log}"


# What a reader hears (arnar.samples): a few cross-sentence items spoken by every row of the
# comparison table (its first synthesis seed), as MP3 small enough for git. The default profile
# (the `profile` key of params.yaml itself) writes the repository's docs/samples, the build that is
# committed; a profile picked with --config writes results/<profile>/report/samples instead, so a
# smoke or mini run never overwrites the committed samples.
SAMPLE_TASK = "cross_sentence"
with open("params.yaml") as _params_file:  # the file itself, not the --config-overridden config
    SAMPLES_DIR = "docs/samples" if yaml.safe_load(_params_file)["profile"] == PROFILE else f"{RESULTS}/report/samples"
SAMPLE_ROWS = SYSTEMS[: len(SYSTEMS) - len(PARADIGMS)] + list(SEEDS_OF)  # references, then the paradigms


rule samples:
    """docs/samples (results/<profile>/report/samples off the default): three items as MP3 (prompt, ground truth, resynthesis rows, every paradigm), README.md and index.html."""
    input:
        testlist=f"{DATA}/eval/testlists/{SAMPLE_TASK}.tsv",
        prompts=f"{DATA}/eval/prompts/{SAMPLE_TASK}",
        systems=expand("{data}/systems/{system}/{task}", data=DATA, system=SAMPLE_ROWS, task=SAMPLE_TASK),
    output:
        directory(SAMPLES_DIR),
    params:
        systems_dir=lambda wildcards, input: os.path.dirname(os.path.dirname(input.systems[0])),
        systems=" ".join(SAMPLE_ROWS),
        task=SAMPLE_TASK,
        profile=PROFILE,
    log:
        f"{LOGS}/samples.log",
    conda:
        CORE_ENV
    shell:
        "arnar samples --testlist {input.testlist} --prompts {input.prompts} --systems-dir {params.systems_dir}"
        " --systems {params.systems} --task {params.task} --profile {params.profile} --out {output} 2> {log}"
