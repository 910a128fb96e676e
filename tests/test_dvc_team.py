"""DVC for a team: record the smoke DAG's outputs, push them, and a fresh clone pulls them with
nothing left for Snakemake to run; experiments (`dvc exp run -S`) and metrics work on top.

Starts from a copy of the session's finished smoke DAG (the `smoke` fixture), so `dvc repro`
only records hashes: Snakemake finds every job up to date, and the outs are `persist: true`, so
DVC does not delete them before calling it.
"""

import hashlib
import re
import shutil
import subprocess

import pytest
import yaml

from arnar.config import REPO_ROOT
from smoke_dag import BIN, ENV, run

pytestmark = pytest.mark.slow

DVC = str(BIN / "dvc")
SNAKEMAKE = str(BIN / "snakemake")
NOTHING_TO_DO = "Nothing to be done"


def git(cwd, *args):
    return run(["git", "-c", "user.name=arnar test", "-c", "user.email=test@arnar.invalid", *args], cwd)


def lock_outs(work) -> list[str]:
    lock = yaml.safe_load((work / "dvc.lock").read_text())
    return [out["path"] for stage in lock["stages"].values() for out in stage.get("outs", [])]


def digest_of(root, paths) -> dict[str, str]:
    """Content of every file under the given outs (relative path -> sha256)."""
    digests = {}
    for rel in paths:
        target = root / rel
        files = [target] if target.is_file() else sorted(p for p in target.rglob("*") if p.is_file())
        for f in files:
            digests[str(f.relative_to(root))] = hashlib.sha256(f.read_bytes()).hexdigest()
    return digests


def dry_run(cwd) -> tuple[dict[str, int], str]:
    """What `snakemake -n` would run: rule -> job count (empty when nothing is to be done), and why."""
    result = run([SNAKEMAKE, "-n"], cwd)
    out = result.stdout + result.stderr
    jobs = {}
    for line in out.split("Job stats:")[-1].splitlines() if "Job stats:" in out else []:
        words = line.split()
        if len(words) == 2 and words[0].isidentifier() and words[1].isdigit() and words[0] != "total":
            jobs[words[0]] = int(words[1])
    return jobs, out


def set_smoke_param(work, section, key, value):
    params = work / "params.yaml"
    data = yaml.safe_load(params.read_text())
    data["profiles"]["smoke"][section][key] = value
    params.write_text(yaml.safe_dump(data, sort_keys=False))


@pytest.fixture(scope="module")
def team_repo(smoke, tmp_path_factory):
    """My checkout: the finished smoke DAG recorded by `dvc repro`, committed and pushed."""
    tmp_path = tmp_path_factory.mktemp("team")
    work = tmp_path / "mine"
    shutil.copytree(smoke, work, symlinks=True)
    shutil.copy2(REPO_ROOT / ".gitignore", work / ".gitignore")
    (work / "scripts").mkdir()
    shutil.copy2(REPO_ROOT / "scripts/pull.sh", work / "scripts/pull.sh")
    params = work / "params.yaml"
    params.write_text(re.sub(r"^profile: \w+", "profile: smoke", params.read_text(), count=1, flags=re.M))
    # smoke is now the file's own profile, whose samples go to docs/samples (the folder dvc.yaml
    # records) rather than where the --config run put them: make them there, as that run would have
    shutil.rmtree(work / "results/smoke/report/samples")
    run([SNAKEMAKE, "--cores", "1", "samples"], work)
    remote = tmp_path / "remote"
    git(work, "init", "-q")
    run([DVC, "remote", "modify", "local", "url", str(remote)], work)
    repro = run([DVC, "repro"], work)  # every stage: data -> align -> ... -> report
    # Snakemake had nothing to build: the session's DAG already made every output
    assert (repro.stdout + repro.stderr).count(NOTHING_TO_DO) == 6, repro.stdout[-3000:] + repro.stderr[-3000:]
    assert "up to date" in run([DVC, "status"], work).stdout
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", "smoke DAG")
    run([DVC, "push"], work)
    return work, remote


def test_every_output_is_a_cached_out(team_repo):
    work, remote = team_repo
    outs = lock_outs(work)
    lock = (work / "dvc.lock").read_text()
    assert "data/smoke/manifests" in lock and "results/smoke/metrics.json" in lock and "md5" in lock
    # every file the DAG wrote under data/smoke and results/smoke lies in some stage's outs
    written = {str(p.relative_to(work)) for top in ("data/smoke", "results/smoke")
               for p in (work / top).rglob("*") if p.is_file() and p.name != ".gitignore"}
    covered = set(digest_of(work, outs))
    assert written - covered == set()
    assert any(remote.rglob("*")), "nothing pushed to the local remote"


def test_fresh_clone_pulls_with_nothing_to_rerun(team_repo, tmp_path):
    work, _ = team_repo
    clone = tmp_path / "teammate"
    git(tmp_path, "clone", "-q", str(work), str(clone))
    assert not (clone / "data").exists()

    result = run(["bash", "scripts/pull.sh"], clone)
    assert "outputs match dvc.lock" in result.stdout
    outs = lock_outs(work)
    assert digest_of(clone, outs) == digest_of(work, outs)
    # Snakemake agrees with DVC: nothing to run, and the touch left every hash as it was
    jobs, out = dry_run(clone)
    assert jobs == {} and NOTHING_TO_DO in out, out[-3000:]
    assert "up to date" in run([DVC, "status"], clone).stdout

    # the touch hides nothing: a changed param reruns the rule it feeds, and nothing else
    set_smoke_param(clone, "evaluation", "report_samples", 1)
    jobs, out = dry_run(clone)
    assert jobs == {"report": 1, "all": 1}, out[-3000:]
    assert "Params have changed since last execution" in out
    git(clone, "checkout", "params.yaml")
    assert dry_run(clone)[0] == {}


def test_pull_refuses_outputs_that_do_not_match_the_lock(team_repo, tmp_path):
    work, _ = team_repo
    clone = tmp_path / "teammate"
    git(tmp_path, "clone", "-q", str(work), str(clone))
    set_smoke_param(clone, "evaluation", "report_samples", 1)  # a local edit dvc.lock does not know
    result = subprocess.run(["bash", "scripts/pull.sh"], cwd=clone, env=ENV, capture_output=True, text=True)
    assert result.returncode == 1
    assert "does not match dvc.lock" in result.stderr
    assert not (clone / ".snakemake/metadata").exists()  # Snakemake's records untouched


def test_experiment_and_metrics(team_repo):
    work, _ = team_repo
    players_before = (work / "results/smoke/report/index.html").read_text().count("<audio")
    key = "profiles.smoke.evaluation.report_samples"
    run([DVC, "exp", "run", "-n", "fewer-samples", "-S", f"{key}=1"], work, timeout=600)
    players_after = (work / "results/smoke/report/index.html").read_text().count("<audio")
    assert 0 < players_after < players_before
    assert yaml.safe_load((work / "params.yaml").read_text())["profiles"]["smoke"]["evaluation"]["report_samples"] == 1
    assert "fewer-samples" in run([DVC, "exp", "show", "--no-pager", "--md"], work).stdout
    metrics = run([DVC, "metrics", "show", "--md"], work).stdout
    for path in ("results/smoke/metrics.json", "results/smoke/data/corpus.json", "results/smoke/data/tokenizers.json"):
        assert path in metrics
    assert "ground_truth_audit" in metrics
