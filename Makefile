# The commands of the README. Each installs what it needs first (scripts/setup.sh is
# idempotent: a second run installs nothing).
SHELL := /bin/bash
VENV := $(CURDIR)/.venv
export PATH := $(VENV)/bin:$(PATH)

.PHONY: setup reproduce test pull

setup:
	bash scripts/setup.sh

# Install everything, then run the whole DAG on the default profile (params.yaml).
reproduce: setup
	snakemake --cores all

# Install everything, then run the test suite (unit tests + smoke DAG); the 30 slowest tests are
# listed at the end, so every CI log says where the suite's time goes.
test: setup
	python -m pytest -q --durations=30

# A teammate's checkout: fetch the outputs of this commit from the DVC remote, check them against
# dvc.lock and mark them up to date for Snakemake (scripts/pull.sh says why that order).
pull: setup
	bash scripts/pull.sh
