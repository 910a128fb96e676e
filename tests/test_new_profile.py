"""A new profile, as a new user adds one: every phase but the evaluation builds before its test
lists are frozen; `freeze_testlists` freezes them, and the evaluation asks for that in one line.

Dry runs (`snakemake -n`) of a copy of the workflow whose params.yaml has a profile `exp` (the
mini profile with more utterances per speaker) and no frozen lists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from arnar.evaluate.testlists import TestListError, verify_testlist
from smoke_dag import BIN, copy_workflow, run

FREEZE = "snakemake --cores 1 freeze_testlists --config profile=exp"


@pytest.fixture(scope="module")
def workflow(tmp_path_factory) -> Path:
    root = copy_workflow(tmp_path_factory.mktemp("new_profile"))
    params = yaml.safe_load((root / "params.yaml").read_text())
    exp = dict(params["profiles"]["mini"])
    exp["corpus"] = {**exp.get("corpus", {}), "utterances_per_speaker": 80}
    params["profiles"]["exp"] = exp
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    assert not (root / "src/arnar/evaluate/testlists/exp").exists()
    return root


def dry_run(workflow: Path, *targets: str, check: bool = True):
    return run([str(BIN / "snakemake"), "-n", "--cores", "1", *targets, "--config", "profile=exp"], workflow, check)


def planned(stdout: str) -> set[str]:
    stats = stdout[stdout.index("Job stats:"):]
    return {m.group(1) for m in re.finditer(r"^(\w+)\s+\d+$", stats, re.MULTILINE)} - {"total"}


def test_every_phase_but_the_evaluation_builds_without_frozen_lists(workflow):
    result = dry_run(workflow, "data", "alignment", "tokens", "training")
    jobs = planned(result.stdout)
    assert {"synth_corpus", "manifests", "tokenizers", "data", "align", "tokenize", "train", "training"} <= jobs
    assert not jobs & {"freeze_testlists", "testlists", "task_audio", "synthesize", "evaluate_system"}


def test_freezing_is_a_target_that_says_to_commit(workflow):
    result = dry_run(workflow, "freeze_testlists")
    assert {"synth_corpus", "manifests", "freeze_testlists"} <= planned(result.stdout)
    assert ("Freezing the exp test lists into src/arnar/evaluate/testlists/exp: commit them "
            "(git add src/arnar/evaluate/testlists/exp)") in result.stdout


@pytest.mark.parametrize("target", ["evaluate", "report", "all"])
def test_the_evaluation_asks_for_the_lists_in_one_line(workflow, target):
    result = dry_run(workflow, target, check=False)
    assert result.returncode != 0
    lines = [line.strip() for line in (result.stdout + result.stderr).splitlines()
             if "has no frozen test lists" in line]
    assert lines == [
        "src/arnar/evaluate/testlists/exp/continuation.tsv: profile 'exp' has no frozen test lists, which the "
        f"evaluation needs. Freeze them from its corpus with `{FREEZE}`, then commit them "
        "(git add src/arnar/evaluate/testlists/exp)."
    ]


def test_frozen_lists_make_freezing_a_no_op(workflow):
    """The mini profile's lists are committed: the target has nothing to do, the DAG never rewrites them."""
    result = run([str(BIN / "snakemake"), "-n", "--cores", "1", "freeze_testlists", "--config", "profile=mini"],
                 workflow)
    assert "Nothing to be done" in result.stdout + result.stderr


def test_checking_against_a_missing_frozen_list_says_how_to_freeze(tmp_path):
    with pytest.raises(TestListError, match=r"continuation.tsv: no frozen test list; freeze the lists with "
                                            r"`snakemake --cores 1 freeze_testlists"):
        verify_testlist(tmp_path / "continuation.tsv", [])
