"""Fixtures shared by test modules."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # the helper modules next to the tests

from smoke_dag import copy_workflow, snakemake  # noqa: E402


@pytest.fixture(scope="session")
def smoke(tmp_path_factory):
    """The whole default DAG (corpus to report) on the smoke profile, run once per session."""
    work = copy_workflow(tmp_path_factory.mktemp("smoke"))
    snakemake(work)
    return work
