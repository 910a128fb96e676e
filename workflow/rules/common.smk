# Helpers shared by the rule files.

CORE_ENV = "../../envs/core.yaml"


def corpus_recipe_rule_missing(name):
    """Corpus names in the schema whose recipe is not part of the DAG yet fail early and clearly."""
    raise WorkflowError(
        f"params.yaml: corpus.name={name!r} (profile {PROFILE!r}) has no recipe in this DAG yet; "
        "the embedded corpus 'synth' is available (profiles smoke and mini)."
    )


def frozen_path(profile, task):
    """The committed test list (relative to the workflow root, so a copied workflow uses its own)."""
    return f"src/arnar/evaluate/testlists/{profile}/{task}.tsv"


TRAINED_CODECS = {"offline", "offline_rvq"}  # token streams of the codec the DAG trains itself


def codec_model(codec):
    """The trained model folder a codec loads from, or nothing for codecs with hub weights."""
    return f"{DATA}/codec/offline" if codec in TRAINED_CODECS else []
