"""Results a reader can see (issue 24, item 2): the small results of every stage are `cache: false`
outs of dvc.yaml (`metrics`, `plots`, markdown tables), git tracks them (.gitignore un-ignores
them for every profile), and the `mini` profile's committed results lie where the DAG writes them.

Fast: parses dvc.yaml and asks git and DVC, never runs the DAG (test_dvc_team.py runs DVC on the
finished smoke DAG).
"""

import copy
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from arnar.config import REPO_ROOT
from smoke_dag import BIN, ENV

PROFILE = "mini"  # the profile whose results are committed
DVC = str(BIN / "dvc")
# a file a directory out may hold, to ask git whether such a file would be ignored
EXAMPLE_CHILD = {"plots": "example.png", "metrics": "example.json", "outs": "example.txt"}


def load_dvc_yaml() -> dict:
    return yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text(encoding="utf-8"))


def declared(dvc: dict, profile: str = PROFILE) -> list[tuple[str, str, str, dict]]:
    """Every out of every stage: (stage, kind: outs | metrics | plots, path with ${profile} resolved, flags)."""
    entries = []
    for stage_name, stage in dvc["stages"].items():
        for kind in ("outs", "metrics", "plots"):
            for entry in stage.get(kind) or []:
                path, flags = (entry, {}) if isinstance(entry, str) else next(iter(entry.items()))
                entries.append((stage_name, kind, path.replace("${profile}", profile), dict(flags or {})))
    return entries


def is_result(kind: str, path: str) -> bool:
    """What a reader looks at: every metric and plot, and the markdown tables."""
    return kind in ("metrics", "plots") or path.endswith(".md")


def git_ignored(paths: list[str]) -> set[str]:
    """The paths .gitignore ignores, judged by its patterns alone (not by what the index tracks)."""
    result = subprocess.run(["git", "check-ignore", "--no-index", "--stdin"], cwd=REPO_ROOT,
                            input="\n".join(paths) + "\n", capture_output=True, text=True)
    assert result.returncode in (0, 1), result.stderr  # 0: some ignored, 1: none, 128: error
    return set(result.stdout.splitlines())


def probe(kind: str, path: str) -> str:
    """The path to ask git about: the file itself, or a file inside a directory out."""
    is_dir = (REPO_ROOT / path).is_dir() or not Path(path).suffix
    return f"{path}/{EXAMPLE_CHILD[kind]}" if is_dir else path


def problems(dvc: dict, profile: str = PROFILE) -> list[str]:
    """What is wrong with dvc.yaml's results: empty when every result is a persisted `cache: false`
    out that git does not ignore, every cached out under results/ is ignored, and no path is
    declared twice or inside another declared out."""
    found = []
    entries = declared(dvc, profile)
    for stage, kind, path, flags in entries:
        if flags.get("persist") is not True:
            found.append(f"{stage}: {path} is not persist: true")
        if is_result(kind, path) and flags.get("cache", True) is not False:
            found.append(f"{stage}: result {path} ({kind}) is cached by DVC, not cache: false")
    uncached = [(kind, path) for _, kind, path, flags in entries if flags.get("cache", True) is False]
    cached_results = [(kind, path) for _, kind, path, flags in entries
                      if flags.get("cache", True) is not False and path.startswith("results/")]
    ignored = git_ignored([probe(k, p) for k, p in uncached + cached_results])
    found += [f"{path} is cache: false but git-ignored" for kind, path in uncached if probe(kind, path) in ignored]
    found += [f"{path} is DVC-cached but not git-ignored" for kind, path in cached_results
              if probe(kind, path) not in ignored]
    paths = [path.rstrip("/") for _, _, path, _ in entries]
    for i, a in enumerate(paths):
        for b in paths[i + 1:]:
            if a == b:
                found.append(f"{a} is declared twice")
            elif b.startswith(a + "/") or a.startswith(b + "/"):
                outer, inner = sorted((a, b), key=len)
                found.append(f"{outer} contains the out {inner}")
    return found


def test_results_are_uncached_outs_that_git_tracks():
    dvc = load_dvc_yaml()
    assert problems(dvc) == []
    results = {path for _, kind, path, _ in declared(dvc) if is_result(kind, path)}
    # the report's tables, plots and metrics, and each earlier stage's small summaries
    for path in ("report/comparison.md", "report/ground_truth_audit.md", "report/plots", "metrics.json",
                 "alignment.md", "alignment", "train", "data/corpus.json", "data/tokenizers.json"):
        assert f"results/{PROFILE}/{path}" in results, path
    # audio, tokens, checkpoints and the HTML page that plays the audio stay in the DVC cache
    cached = {path for _, _, path, flags in declared(dvc) if flags.get("cache", True)}
    for path in ("report/audio", "report/index.html", "eval"):
        assert f"results/{PROFILE}/{path}" in cached, path
    assert all(path.startswith("data/") or path.startswith("results/") for path in cached)
    assert {p for p in cached if p.startswith("data/")} == {p for _, _, p, _ in declared(dvc) if p.startswith("data/")}


@pytest.mark.parametrize("profile", ["smoke", "libritts", "exp"])
def test_every_profile_is_tracked_alike(profile):
    assert problems(load_dvc_yaml(), profile) == []


def _entry(dvc, stage, kind, suffix):
    for i, entry in enumerate(dvc["stages"][stage][kind]):
        if next(iter(entry)).endswith(suffix):
            return i
    raise KeyError(suffix)


def test_the_check_catches_a_cached_metric_an_overlap_and_an_ignored_result():
    dvc = load_dvc_yaml()
    cached_metric = copy.deepcopy(dvc)
    i = _entry(cached_metric, "report", "metrics", "/metrics.json")
    cached_metric["stages"]["report"]["metrics"][i] = {"results/${profile}/metrics.json": {"persist": True}}
    assert problems(cached_metric) == [  # and .gitignore would then let a DVC-cached file into git
        f"report: result results/{PROFILE}/metrics.json (metrics) is cached by DVC, not cache: false",
        f"results/{PROFILE}/metrics.json is DVC-cached but not git-ignored"]

    cached_table = copy.deepcopy(dvc)
    i = _entry(cached_table, "report", "outs", "/comparison.md")
    cached_table["stages"]["report"]["outs"][i] = {"results/${profile}/report/comparison.md": {"persist": True}}
    assert any("comparison.md" in p and "cached by DVC" in p for p in problems(cached_table))

    whole_folder = copy.deepcopy(dvc)  # the report folder as one out again, beside its files
    whole_folder["stages"]["report"]["outs"].append({"results/${profile}/report": {"persist": True}})
    assert f"results/{PROFILE}/report contains the out results/{PROFILE}/report/comparison.md" in problems(whole_folder)

    twice = copy.deepcopy(dvc)
    twice["stages"]["evaluate"]["metrics"] = [{"results/${profile}/metrics.json": {"cache": False, "persist": True}}]
    assert f"results/{PROFILE}/metrics.json is declared twice" in problems(twice)

    ignored = copy.deepcopy(dvc)  # a result .gitignore does not let through
    ignored["stages"]["evaluate"]["metrics"] = [{"results/${profile}/summary.json": {"cache": False, "persist": True}}]
    assert problems(ignored) == [f"results/{PROFILE}/summary.json is cache: false but git-ignored"]


def test_committed_mini_results_lie_where_the_dag_writes_them():
    tracked = subprocess.run(["git", "ls-files", f"results/{PROFILE}"], cwd=REPO_ROOT, capture_output=True,
                             text=True, check=True).stdout.split()
    uncached = [path for _, _, path, flags in declared(load_dvc_yaml()) if flags.get("cache", True) is False]
    for rel in tracked:  # every committed file is a cache: false out, or lies in one
        assert any(rel == p or rel.startswith(p + "/") for p in uncached), rel
        assert (REPO_ROOT / rel).is_file(), rel
    for rel in ("metrics.json", "report/comparison.md", "report/ground_truth_audit.md", "alignment.md"):
        assert f"results/{PROFILE}/{rel}" in tracked, rel
    assert any(rel.startswith(f"results/{PROFILE}/report/plots/") and rel.endswith(".png") for rel in tracked)
    assert any(rel.startswith(f"results/{PROFILE}/train/") and rel.endswith(".json") for rel in tracked)
    metrics = json.loads((REPO_ROOT / f"results/{PROFILE}/metrics.json").read_text(encoding="utf-8"))
    assert isinstance(metrics, dict) and metrics
    for rel in tracked:
        if rel.endswith(".json"):
            json.loads((REPO_ROOT / rel).read_text(encoding="utf-8"))
        if rel.endswith(".md"):
            assert (REPO_ROOT / rel).read_text(encoding="utf-8").startswith("# ")


def provenance_note(profile: str = PROFILE) -> Path:
    """The lab note that names the run behind a profile's committed results: scripts/publish_results.sh
    writes docs/lab-notes/<date>-<profile>-results.md, and the newest one is in force."""
    notes = sorted((REPO_ROOT / "docs/lab-notes").glob(f"*-{profile}-results.md"))
    assert notes, f"docs/lab-notes/ has no *-{profile}-results.md"
    return notes[-1]


def test_published_links_resolve():
    """The lab note naming the run behind the committed results (commit and machine) links those files,
    results/README.md links the note, and every link of theirs and the README's to results or lab notes
    resolves."""
    note = provenance_note()
    for doc, must in ((note, f"results/{PROFILE}"), (REPO_ROOT / "results/README.md", note.name),
                      (REPO_ROOT / "README.md", None)):
        links = [link for link in re.findall(r"\]\(([^)#\s]+)\)", doc.read_text(encoding="utf-8"))
                 if ("results/" in link or "lab-notes/" in link) and "://" not in link]
        assert must is None or any(must in link for link in links), f"{doc.relative_to(REPO_ROOT)}: no link to {must}"
        for link in links:
            assert (doc.parent / link).exists(), f"{doc.relative_to(REPO_ROOT)}: {link}"
    provenance = note.read_text(encoding="utf-8")
    assert re.search(r"commit `[0-9a-f]{7,}`", provenance) and "CPU" in provenance


def test_dvc_metrics_show_reads_the_committed_metrics(tmp_path):
    """`dvc metrics show` on dvc.yaml as it is, with the profile set to mini, in a copy of the repo's
    DVC files and mini results (offline; DVC reads metrics from the work tree)."""
    for name in ("dvc.yaml", ".dvcignore"):
        shutil.copy2(REPO_ROOT / name, tmp_path / name)
    shutil.copytree(REPO_ROOT / ".dvc", tmp_path / ".dvc", ignore=shutil.ignore_patterns("tmp", "cache"))
    params = (REPO_ROOT / "params.yaml").read_text(encoding="utf-8")
    (tmp_path / "params.yaml").write_text(re.sub(r"(?m)^profile: *\S+", f"profile: {PROFILE}", params, count=1))
    shutil.copytree(REPO_ROOT / f"results/{PROFILE}", tmp_path / f"results/{PROFILE}")
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)

    stages = subprocess.run([DVC, "stage", "list", "--name-only"], cwd=tmp_path, env=ENV, capture_output=True,
                            text=True, timeout=120)
    assert stages.returncode == 0, stages.stderr
    assert stages.stdout.split() == list(load_dvc_yaml()["stages"])

    shown = subprocess.run([DVC, "metrics", "show", "--json"], cwd=tmp_path, env=ENV, capture_output=True,
                           text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    (workspace,) = json.loads(shown.stdout).values()
    files = workspace["data"]
    assert files[f"results/{PROFILE}/metrics.json"]["data"] == json.loads(
        (REPO_ROOT / f"results/{PROFILE}/metrics.json").read_text(encoding="utf-8"))
    assert any(path.startswith(f"results/{PROFILE}/train/") for path in files)
