#!/usr/bin/env bash
# A teammate's checkout: fetch the outputs of the checked-out commit from the DVC remote and make
# Snakemake accept them, without running anything (`make pull`; arguments go to `dvc pull`).
#
# Two tools judge "up to date" differently. DVC compares content hashes with dvc.lock; Snakemake
# compares modification times (output newer than inputs) and its own records in .snakemake/ of
# each job's code, params and inputs. After `dvc pull` the hashes are right, but every file's
# mtime is the moment of the pull, in no particular order, and a fresh clone has no .snakemake/,
# so Snakemake would rerun arbitrary jobs. DVC is the authority here: only when `dvc status`
# says every stage's deps (code, params) and outs match dvc.lock does `snakemake --touch
# --forceall` set the mtimes in DAG order and record each job's code and params as they are now.
# From then on Snakemake's usual triggers hold: an edited param or rule reruns what it feeds.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf 'pull: %s\n' "$*"; }

dvc pull "$@"
if ! dvc status --quiet; then
  dvc status >&2
  echo "pull: error: the workspace does not match dvc.lock (above); Snakemake's timestamps were left alone." \
       "Commit or revert local changes, or run 'dvc repro' to rebuild what changed." >&2
  exit 1
fi
say "outputs match dvc.lock; marking them up to date for Snakemake"
# Snakemake reads the same params.yaml (and profile) as dvc.yaml, so it touches the outputs DVC checked.
snakemake --touch --forceall --cores 1 --quiet
say "done: 'snakemake -n' has nothing to run"
