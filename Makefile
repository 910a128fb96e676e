# The two commands of the README. Both install what they need first (scripts/setup.sh is
# idempotent: a second run installs nothing).
SHELL := /bin/bash
VENV := $(CURDIR)/.venv
export PATH := $(VENV)/bin:$(PATH)

.PHONY: setup reproduce test

setup:
	bash scripts/setup.sh

# Install everything, then run the whole DAG on the default profile (params.yaml).
reproduce: setup
	snakemake --cores all

# Install everything, then run the test suite (unit tests + smoke DAG).
test: setup
	python -m pytest -q
