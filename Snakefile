# arnar: the whole pipeline as one DAG (DESIGN.md sections 1-3).
#
#   snakemake --cores all                          # the embedded default profile (mini)
#   snakemake --cores all --config profile=smoke   # the seconds-to-minutes test profile
#   snakemake --cores all data                     # one phase only (see the targets below)
#   snakemake --cores 1 freeze_testlists --config profile=exp  # a new profile's test lists
#                                                  # (commit them; only the evaluation needs them)
#
# params.yaml is the config; it is validated against workflow/schemas/params.schema.yaml and
# its profile preset merged in by arnar.config (the same code the Python CLIs use).

import json
import os
import re

from arnar.config import ConfigError, resolve_profile


configfile: "params.yaml"


try:
    P = resolve_profile(config)
except ConfigError as err:
    raise WorkflowError(f"params.yaml: {err}")

PROFILE = P["profile"]
DATA = f"data/{PROFILE}"
RESULTS = f"results/{PROFILE}"
LOGS = f"logs/{PROFILE}"
# The text units the single-stream paradigms read (params.yaml text.units): BPE pieces or phonemes
TEXT_UNITS = f"{DATA}/tokenizers/" + {"bpe": "bpe.model", "phonemes": "phonemes.json"}[P["text"]["units"]]


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/align.smk"
include: "workflow/rules/tokenize.smk"
include: "workflow/rules/runs.smk"
include: "workflow/rules/train.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/report.smk"


rule all:
    input:
        rules.data.input,
        rules.alignment.input,
        rules.tokens.input,
        rules.training.input,
        rules.report.output,
    default_target: True
