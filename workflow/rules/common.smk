# Helpers shared by the rule files.

from arnar.evaluate.testlists import TASKS

CORE_ENV = "../../envs/core.yaml"


def frozen_dir(profile):
    """The committed test lists' folder (relative to the workflow root, so a copied workflow uses its own)."""
    return f"src/arnar/evaluate/testlists/{profile}"


def frozen_path(profile, task):
    return f"{frozen_dir(profile)}/{task}.tsv"


def frozen_testlists(wildcards):
    """Input of `testlists`: the profile's committed test lists. A synth or folder profile without
    them is asked to freeze them (its test split is whatever the profile makes); a downloaded corpus
    tests on a published set, so `freeze_testlists` makes them on its first build."""
    lists = [frozen_path(PROFILE, task) for task in TASKS]
    missing = [path for path in lists if not os.path.exists(path)]
    if missing and P["corpus"]["name"] in ("synth", "folder"):
        raise WorkflowError(
            f"{missing[0]}: profile {PROFILE!r} has no frozen test lists, which the evaluation needs. "
            f"Freeze them from its corpus with `snakemake --cores 1 freeze_testlists --config "
            f"profile={PROFILE}`, then commit them (git add {frozen_dir(PROFILE)})."
        )
    return lists


TRAINED_CODECS = {"offline", "offline_rvq"}  # token streams of the codec the DAG trains itself


def codec_model(codec):
    """The trained model folder a codec loads from, or nothing for codecs with hub weights."""
    return f"{DATA}/codec/offline" if codec in TRAINED_CODECS else []


def resynthesis_codec(row: str) -> str:
    """The codec of a resynthesis row: offline_rvq_q1_hifigan -> offline_rvq."""
    return row.removesuffix("_hifigan").removesuffix("_q1")


def system_asr_args(wildcards):
    """`arnar evaluate`'s judges for one system: every judge of evaluation.asr, but a paradigm's
    later synthesis seeds (ar_seed2, ...) get the headline judge alone where extra_asr_seeds is
    `first`: the cross-checking judges hear the first seed, the spread over seeds is the headline's."""
    judges = P["evaluation"]["asr"]
    if P["evaluation"]["extra_asr_seeds"] == "first" and wildcards.system in SYSTEM_SEED:
        judges = judges[:1]
    return " ".join(f"--asr {name}" for name in judges)


def testlist_choice():
    """`arnar testlists`' arguments for which items the lists hold (targets' durations, the
    continuation prompt, items per task and how they are drawn, the seed): the same for the rule
    that freezes the lists and the one that checks them against the corpus."""
    e = P["evaluation"]
    items = e["max_items"]
    if isinstance(items, dict):
        items = ",".join(f"{task}={items[task]}" for task in sorted(items))
    return (f"--min-duration {e['min_duration']} --max-duration {e['max_duration']}"
            f" --prompt-seconds {e['prompt_seconds']} --max-items {items}"
            f" --per-voice {e['per_voice']} --seed {P['seed']}")
