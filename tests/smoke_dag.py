"""Running the real DAG from tests: copy the workflow into a temporary folder and call Snakemake.

Shared by the pipeline, reliability, DVC and SLURM tests. The smoke DAG itself runs once per
test session (the `smoke` fixture in tests/conftest.py) and its outputs feed every test that
only reads them; a test that changes files works on a copy.
"""

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from arnar.config import REPO_ROOT

BIN = Path(sys.executable).parent
ENV = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}")
WORKFLOW_FILES = ["Snakefile", "params.yaml", "workflow", "envs", "src", "dvc.yaml", ".dvc", ".dvcignore"]


def copy_workflow(dest: Path) -> Path:
    dest.mkdir(parents=True, exist_ok=True)
    for name in WORKFLOW_FILES:
        src = REPO_ROOT / name
        if src.is_dir():
            shutil.copytree(src, dest / name, ignore=shutil.ignore_patterns("tmp", "cache", "__pycache__", "*.egg-info"))
        else:
            shutil.copy2(src, dest / name)
    return dest


def run(cmd, cwd, check=True, timeout=900):
    result = subprocess.run(cmd, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f"{cmd} failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}")
    return result


DAG_TIMEOUT = 2400  # a whole smoke DAG: ~8 min alone on 2 cores; a safety net for a busy machine, not a timing test


def snakemake(cwd, *args, check=True, timeout=DAG_TIMEOUT):
    # --config takes every following word as a key=value pair, so it goes last
    return run([str(BIN / "snakemake"), "--cores", "2", *args, "--config", "profile=smoke"], cwd, check, timeout)


def tree_digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "build_log" not in p.name
    }


def job_counts(output: str) -> dict[str, int]:
    """Rule -> jobs from the last "Job stats" table Snakemake printed in ``output`` (a dry run's
    plan, or what a run did); empty when it printed none."""
    counts = {}
    for line in output.split("Job stats:")[-1].splitlines()[3:] if "Job stats:" in output else []:
        words = line.split()
        if len(words) != 2 or words[0] == "total" or not words[1].isdigit():
            break
        counts[words[0]] = int(words[1])
    return counts
