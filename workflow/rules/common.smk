# Helpers shared by the rule files.

CORE_ENV = "../../envs/core.yaml"


def corpus_recipe_rule_missing(name):
    """Corpus names in the schema whose recipe is not part of the DAG yet fail early and clearly."""
    raise WorkflowError(
        f"params.yaml: corpus.name={name!r} (profile {PROFILE!r}) has no recipe in this DAG yet; "
        "the embedded corpus 'synth' is available (profiles smoke and mini)."
    )
