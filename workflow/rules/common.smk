# Helpers shared by the rule files.

CORE_ENV = "../../envs/core.yaml"


def frozen_path(profile, task):
    """The committed test list (relative to the workflow root, so a copied workflow uses its own)."""
    return f"src/arnar/evaluate/testlists/{profile}/{task}.tsv"


TRAINED_CODECS = {"offline", "offline_rvq"}  # token streams of the codec the DAG trains itself


def codec_model(codec):
    """The trained model folder a codec loads from, or nothing for codecs with hub weights."""
    return f"{DATA}/codec/offline" if codec in TRAINED_CODECS else []
