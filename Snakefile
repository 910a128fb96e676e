# arnar: the whole pipeline as one DAG (docs/design.md sections 1-3).
#
#   snakemake --cores all                          # the embedded default profile (speak)
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
import yaml

from arnar.config import ConfigError, resolve_profile


# glibc's malloc returns every block above its mmap threshold (at most 32 MiB by default) to the
# kernel when freed, so a training update's attention scores and activations are page-faulted and
# zeroed afresh on every update: ~18 % of a SyncSpeech update's CPU time in the kernel at the
# default profile's lengths. Keeping freed memory in the heap removes most of those faults
# (bench/malloc_settings.py measures the ratio); results do not change, only where memory comes
# from. Jobs inherit these; a value already in the environment wins.
for _name, _value in {"MALLOC_MMAP_THRESHOLD_": "4294967296", "MALLOC_TRIM_THRESHOLD_": "68719476736",
                      "MALLOC_TOP_PAD_": "268435456"}.items():
    os.environ.setdefault(_name, _value)


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
        rules.samples.output,
    default_target: True
