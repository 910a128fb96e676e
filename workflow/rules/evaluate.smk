# Evaluation phase: the frozen protocol (src/arnar/evaluate, docs/design.md section 7).
#
# A system is a folder data/<profile>/systems/<system>/<task>/ of <item_id>.wav (+ timing.jsonl);
# any paradigm plugs in by producing that folder and adding its name to SYSTEMS.

import os

from arnar.evaluate.testlists import TASKS

EVAL = P["evaluation"]
# Reference rows first (ground truth, then ground truth through each codec and back); paradigms
# append their names as they land.
SYSTEMS = (["ground_truth"] + [f"resynth_{codec}" for codec in P["codec"]["resynthesis"]]
           + PARADIGMS)  # the paradigms' evaluated systems (train.smk)
ASR_ARGS = " ".join(f"--asr {name}" for name in EVAL["asr"])
# The hub models (Whisper large-v3, HuBERT-Large, WavLM, UTMOSv2) want a GPU on a cluster
# (resource `gpu`, which the SLURM executor turns into sbatch --gpus); pocketsphinx and
# resemblyzer run on CPUs.
EVAL_GPUS = int(bool({"whisper", "hubert"} & set(EVAL["asr"])) or EVAL["sim"] == "wavlm" or EVAL["mos"] == "utmosv2")



wildcard_constraints:
    system="[a-z0-9_.]+",
    task="|".join(TASKS),

# The frozen test lists are committed (src/arnar/evaluate/testlists/<profile>/), and only the
# evaluation needs them: a profile without them builds every other phase, and `freeze_testlists`
# writes them (then commit them). The evaluation asks for that (frozen_testlists, common.smk),
# except on a downloaded corpus (libritts, mls), whose first build freezes them on its own.
FROZEN_LISTS = [frozen_path(PROFILE, t) for t in TASKS]
_missing_lists = [path for path in FROZEN_LISTS if not os.path.exists(path)]

if _missing_lists:
    # Defined only while a list is missing, so a frozen list is never rewritten by the DAG.
    rule freeze_testlists:
        """Freeze the profile's test lists from its test split (commit them)."""
        input:
            cuts=f"{DATA}/manifests/test_cuts.jsonl",
        output:
            FROZEN_LISTS,
        params:
            frozen_dir=lambda wildcards, output: os.path.dirname(output[0]),
            choice=testlist_choice(),
        message:
            f"Freezing the {PROFILE} test lists into {frozen_dir(PROFILE)}: "
            f"commit them (git add {frozen_dir(PROFILE)})"
        log:
            f"{LOGS}/freeze_testlists.log",
        conda:
            CORE_ENV
        shell:
            "arnar testlists --write --cuts {input.cuts} --frozen-dir {params.frozen_dir}"
            " {params.choice} 2> {log}"

else:

    rule freeze_testlists:
        """The lists are frozen: nothing to do (`arnar testlists --write` rebuilds them on purpose)."""
        input:
            FROZEN_LISTS,


rule testlists:
    """Rebuild the test lists from the corpus and check them against the frozen ones."""
    input:
        cuts=f"{DATA}/manifests/test_cuts.jsonl",
        frozen=frozen_testlists,
    output:
        expand("{data}/eval/testlists/{task}.tsv", data=DATA, task=TASKS),
    params:
        out_dir=lambda wildcards, output: os.path.dirname(output[0]),
        frozen_dir=lambda wildcards, input: os.path.dirname(input.frozen[0]),
        choice=testlist_choice(),
    log:
        f"{LOGS}/testlists.log",
    conda:
        CORE_ENV
    shell:
        "arnar testlists --cuts {input.cuts} --frozen-dir {params.frozen_dir} --out-dir {params.out_dir}"
        " {params.choice} 2> {log}"


rule task_audio:
    """Cut each item's prompt; the targets themselves are the ground-truth system."""
    input:
        testlist=f"{DATA}/eval/testlists/{{task}}.tsv",
        recordings=f"{DATA}/manifests/test_recordings.jsonl",
    output:
        targets=directory(f"{DATA}/systems/ground_truth/{{task}}"),
        prompts=directory(f"{DATA}/eval/prompts/{{task}}"),
    log:
        f"{LOGS}/task_audio_{{task}}.log",
    conda:
        CORE_ENV
    shell:
        "arnar task-audio --testlist {input.testlist} --recordings {input.recordings}"
        " --targets {output.targets} --prompts {output.prompts} 2> {log}"


rule evaluate_system:
    """WER (both conventions, every ASR backend), SIM to the prompt, speed when timed."""
    input:
        system=f"{DATA}/systems/{{system}}/{{task}}",
        testlist=f"{DATA}/eval/testlists/{{task}}.tsv",
        prompts=f"{DATA}/eval/prompts/{{task}}",
        corpus=f"{DATA}/corpus",  # speakers.tsv: WER and SIM per voice and voice group
    output:
        json=f"{RESULTS}/eval/{{system}}/{{task}}.json",
        tsv=f"{RESULTS}/eval/{{system}}/{{task}}_utterances.tsv",
    params:
        asr=system_asr_args,
        sim=EVAL["sim"],
        mos=f"--mos {EVAL['mos']} --mos-windows {EVAL['mos_windows']}",
        d_llm=EVAL["d_llm"],
    resources:
        gpu=EVAL_GPUS,
    log:
        f"{LOGS}/evaluate_{{system}}_{{task}}.log",
    conda:
        CORE_ENV
    shell:
        "arnar evaluate --system {wildcards.system} --task {wildcards.task}"
        " --system-dir {input.system} --testlist {input.testlist} --prompts {input.prompts}"
        " --corpus {input.corpus} {params.asr} --sim {params.sim} {params.mos} --d-llm {params.d_llm}"
        " --out-json {output.json} --out-tsv {output.tsv} 2> {log}"


rule ground_truth_audit:
    """Per-voice WER of the recordings and same/different-speaker SIM separation."""
    input:
        cuts=expand("{data}/manifests/{split}_cuts.jsonl", data=DATA, split=EVAL["audit_splits"]),
        corpus=f"{DATA}/corpus",
    output:
        json=f"{RESULTS}/eval/ground_truth_audit.json",
        tsv=f"{RESULTS}/eval/ground_truth_audit_utterances.tsv",
    params:
        cuts=lambda wildcards, input: " ".join(f"--cuts {c}" for c in input.cuts),
        asr=ASR_ARGS,
        sim=EVAL["sim"],
        per_speaker=(f"--per-speaker {EVAL['audit_per_speaker']}" if EVAL.get("audit_per_speaker") else ""),
        mos=f"--mos {EVAL['mos']} --mos-windows {EVAL['mos_windows']}",
    resources:
        gpu=EVAL_GPUS,
    log:
        f"{LOGS}/ground_truth_audit.log",
    conda:
        CORE_ENV
    shell:
        "arnar audit {params.cuts} --corpus {input.corpus} {params.asr} --sim {params.sim} {params.per_speaker} {params.mos}"
        " --out-json {output.json} --out-tsv {output.tsv} 2> {log}"


rule evaluate:
    """Target of the evaluation phase (dvc.yaml stage `evaluate`)."""
    input:
        evaluated(f"{RESULTS}/eval/{{system}}/{{task}}.json", SYSTEMS),
        rules.ground_truth_audit.output,
