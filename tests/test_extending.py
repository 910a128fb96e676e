"""docs/extending.md, checked: the page's worked example registered the way the page says.

The paradigm's module and Hydra config are taken from the page itself (the fenced blocks after
``<!-- file: <path> -->`` lines), and so are its schema and profile edits, so the page and this
test cannot drift apart. Fast checks: the module against hand-worked examples, one update through
the engine's batching, decoding on a tiny random model, registration by module name, the run
registry's run and systems of a paradigm it does not list, and every file and name the page
points at. Slow (``-m slow``): the paradigm registered in a copy of the session's smoke DAG
(the ``smoke`` fixture; only its training, synthesis, evaluation and the report run again),
trained, synthesized, evaluated and reported with a WER.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml

from arnar import paradigms
from arnar.config import REPO_ROOT, load_params
from arnar.evaluate.testlists import TASKS, read_testlist
from arnar.paradigms.base import IGNORE, MASK, SOS, TURN, SynthesisRequest, Utterance, Vocab, collate
from arnar.runs import run_registry
from arnar.train.step import build_optimizer, example_generator, make_batch
from smoke_dag import BIN, DAG_TIMEOUT, ENV, job_counts

DOC = REPO_ROOT / "docs" / "extending.md"
NAME = "oneshot"  # the page's worked example
TINY = {"dim": 32, "n_layers": 2, "n_heads": 4, "dropout": 0.0}
VOCAB = Vocab(text_size=4, speech_size=5)  # specials 0..7, text ids 8..11, speech ids 12..16
FENCE = re.compile(r"```([a-z]*)\n(.*?)\n```", re.S)


def page() -> str:
    return DOC.read_text(encoding="utf-8")


def page_files() -> dict[str, str]:
    """Path -> text of every file the page writes out in full."""
    found = {m[1]: m[2] + "\n" for m in re.finditer(r"<!-- file: (\S+) -->\n```[a-z]*\n(.*?)\n```", page(), re.S)}
    assert set(found) == {f"src/arnar/paradigms/{NAME}.py", f"src/arnar/conf/paradigm/{NAME}.yaml"}, found
    return found


def page_yaml(key: str) -> dict:
    """The page's YAML snippet whose top-level key is ``key`` (the schema and profile edits)."""
    for language, body in FENCE.findall(page()):
        if language == "yaml":
            snippet = yaml.safe_load(textwrap.dedent(body))
            if isinstance(snippet, dict) and key in snippet:
                return snippet
    raise AssertionError(f"{DOC}: no YAML snippet with the key {key!r}")


def register(root: Path) -> None:
    """Register the page's paradigm in the workflow at ``root`` as the page says: its module and
    Hydra config, its name in the schema's training.paradigms enum, the smoke preset's training
    restricted to it."""
    for path, text in page_files().items():
        (root / path).write_text(text, encoding="utf-8")
    schema_path = root / "workflow/schemas/params.schema.yaml"
    schema = yaml.safe_load(schema_path.read_text(encoding="utf-8"))
    enum = schema["$defs"]["training"]["properties"]["paradigms"]["items"]["enum"]
    added = [name for name in page_yaml("paradigms")["paradigms"]["items"]["enum"] if name not in enum]
    assert added == [NAME], added  # the page's enum is the schema's plus the new name
    enum += added
    schema_path.write_text(yaml.safe_dump(schema, sort_keys=False), encoding="utf-8")
    params_path = root / "params.yaml"
    params = yaml.safe_load(params_path.read_text(encoding="utf-8"))
    params["profiles"]["smoke"]["training"].update(page_yaml("profiles")["profiles"]["smoke"]["training"])
    params_path.write_text(yaml.safe_dump(params, sort_keys=False), encoding="utf-8")


@pytest.fixture
def oneshot(tmp_path, monkeypatch):
    """The page's module, found by ``paradigm_class`` as a module of ``arnar.paradigms`` (the
    package's search path extended to a temporary folder; the registry restored afterwards)."""
    folder = tmp_path / "paradigms"
    folder.mkdir()
    (folder / f"{NAME}.py").write_text(page_files()[f"src/arnar/paradigms/{NAME}.py"], encoding="utf-8")
    monkeypatch.setattr(paradigms, "__path__", [*paradigms.__path__, str(folder)])
    monkeypatch.setattr(paradigms, "PARADIGMS", dict(paradigms.PARADIGMS))
    yield paradigms.paradigm_class(NAME)
    sys.modules.pop(f"arnar.paradigms.{NAME}", None)
    vars(paradigms).pop(NAME, None)  # the import's attribute on the package


def utterance(text, speech):
    return Utterance("spk00_0000", "spk00", torch.tensor(text), torch.tensor(speech))


# ----------------------------------------------------------------------------- the page's module

def test_registered_under_its_module_name_with_its_config(oneshot):
    assert oneshot.name == NAME and paradigms.PARADIGMS[NAME] is oneshot
    config = yaml.safe_load(page_files()[f"src/arnar/conf/paradigm/{NAME}.yaml"])
    assert config["name"] == NAME
    model = paradigms.build_paradigm(config["name"], VOCAB, TINY, **config["options"])
    assert model.options == {"prompt_max": 0.5}
    with pytest.raises(ValueError, match="prompt_max"):
        oneshot(VOCAB, TINY, prompt_max=1.0)


def test_training_example_by_hand(oneshot):
    # prompt_max 0: no prompt, every frame masked. Text [1, 2] -> ids 9, 10; codes [0, 1, 2, 3] -> 12..15
    model = oneshot(VOCAB, TINY, prompt_max=0.0)
    example = model.training_example(utterance([1, 2], [0, 1, 2, 3]), torch.Generator().manual_seed(0))
    assert example.input_ids.tolist() == [SOS, 9, 10, TURN, MASK, MASK, MASK, MASK]
    assert example.targets.tolist() == [IGNORE] * 4 + [12, 13, 14, 15]
    assert example.position_ids.tolist() == list(range(8))
    assert example.attention_mask.shape == (8, 8) and bool(example.attention_mask.all())  # bidirectional


def test_training_example_keeps_a_prompt_prefix_and_masks_the_rest(oneshot):
    model = oneshot(VOCAB, TINY, prompt_max=0.5)
    speech = [4, 3, 2, 1, 0, 1, 2, 3, 4, 0]
    prompts = set()
    for seed in range(20):
        example = model.training_example(utterance([3], speech), torch.Generator().manual_seed(seed))
        ids, targets = example.input_ids.tolist(), example.targets.tolist()
        n_prompt = sum(i != MASK for i in ids[3:])  # <sos> text <turn>, then prompt codes and masks
        assert ids[:3] == [SOS, 11, TURN] and 0 <= n_prompt <= len(speech) // 2
        assert ids[3:3 + n_prompt] == [12 + c for c in speech[:n_prompt]]  # the prompt: real codes, no loss
        assert ids[3 + n_prompt:] == [MASK] * (len(speech) - n_prompt)
        assert targets == [IGNORE] * (3 + n_prompt) + [12 + c for c in speech[n_prompt:]]
        prompts.add(n_prompt)
    assert len(prompts) > 1  # the prompt's length is drawn


def test_one_update_through_the_engine_batching(oneshot):
    torch.manual_seed(0)
    model = oneshot(VOCAB, TINY)
    utts = [utterance([1, 2], [0, 1, 2, 3]), utterance([3], [4, 4, 0])]
    batch = make_batch(model, utts, [0, 1], seed=1, epoch=0, batch_index=0)
    again = collate([model.training_example(u, example_generator(1, 0, 0, i)) for i, u in enumerate(utts)])
    assert torch.equal(batch.input_ids, again.input_ids)  # the engine's seeding: the same examples
    out = model(batch)
    assert int(out.n_targets) == batch.n_targets == int((batch.input_ids == MASK).sum())
    assert torch.isfinite(out.loss_sum) and out.loss_sum.item() > 0
    optimizer = build_optimizer(model, lr=1e-2, weight_decay=0.0)
    (out.loss_sum / out.n_targets).backward()
    optimizer.step()
    assert model(batch).loss_sum.item() < out.loss_sum.item()


def test_generate_lengths_codes_and_seeds(oneshot):
    torch.manual_seed(0)
    model = oneshot(VOCAB, TINY).eval()
    request = SynthesisRequest(torch.tensor([1, 2, 3]), torch.tensor([0, 1]), torch.tensor([0, 1, 2, 3, 4, 0]))
    first = model.generate(request, torch.Generator().manual_seed(5))
    # PALLE (arXiv:2504.10352) Eq. 11: 6 prompt frames for 2 prompt text tokens -> 9 frames for 3
    assert len(first.speech) == first.info["target_frames"] == 9 and first.forward_passes == 1
    assert 0 <= int(first.speech.min()) and int(first.speech.max()) < VOCAB.speech_size
    assert torch.equal(model.generate(request, torch.Generator().manual_seed(5)).speech, first.speech)
    request.target_frames = 4
    greedy = model.generate(request, torch.Generator().manual_seed(1), temperature=0)
    assert len(greedy.speech) == 4
    assert torch.equal(model.generate(request, torch.Generator().manual_seed(2), temperature=0).speech, greedy.speech)
    with pytest.raises(ValueError, match="unknown options"):
        model.generate(request, torch.Generator(), steps=4)


def test_the_engine_trains_it_from_its_hydra_config_and_loads_it_back(oneshot, tmp_path, monkeypatch):
    from test_train import TINY as TINY_OVERRIDES
    from test_train import toy_dataset, write_spm

    from arnar.train import config as train_config
    from arnar.train import load_model, train

    conf = tmp_path / "conf"  # the Hydra configs with the page's file added, as the page says
    shutil.copytree(train_config.CONF_DIR, conf)
    (conf / "paradigm" / f"{NAME}.yaml").write_text(page_files()[f"src/arnar/conf/paradigm/{NAME}.yaml"])
    monkeypatch.setattr(train_config, "CONF_DIR", conf)
    cfg = train_config.compose_config([f"paradigm={NAME}", *TINY_OVERRIDES, "train.max_steps=4",
                                       "train.eval_every=0", "paradigm.options.prompt_max=0.3"])
    data = toy_dataset(tmp_path / "data")
    summary = train(cfg, run_dir=tmp_path / "run", train_tokens=data["tokens"], train_durations=data["durations"],
                    bpe_model=write_spm(tmp_path / "bpe.model"))
    assert summary["paradigm"] == NAME and summary["steps"] == 4
    model, saved = load_model(tmp_path / "run", "final")
    assert isinstance(model, oneshot) and model.prompt_max == 0.3 and saved.paradigm.name == NAME
    request = SynthesisRequest(torch.tensor([1, 2]), torch.tensor([3]), torch.tensor([5, 6, 7]), target_frames=6)
    assert len(model.generate(request, torch.Generator().manual_seed(0)).speech) == 6


# ----------------------------------------------------------------------------- registry and page

def test_a_paradigm_the_registry_does_not_list_is_one_run_and_its_seed_systems():
    params = load_params(REPO_ROOT / "params.yaml", {"profile": "smoke"})
    params["training"].update(paradigms=[NAME], ablations=[], grids={})
    registry = run_registry(params)
    assert registry.runs[NAME] == {"config": NAME}
    assert registry.all_runs() == [NAME] and registry.lineage(NAME) == [NAME]
    assert registry.paradigm_systems == {NAME: (NAME, {}), f"{NAME}_seed2": (NAME, {})}
    assert registry.seeds_of == {NAME: [NAME, f"{NAME}_seed2"]}
    # the listed paradigms are untouched: no run of the name unless it is listed
    assert NAME not in run_registry(load_params(REPO_ROOT / "params.yaml", {"profile": "smoke"})).runs


def test_every_file_and_name_the_page_points_at_exists():
    text = page()
    written = set(page_files())
    paths = set(re.findall(r"`((?:src|workflow|tests|bench|docs)/[^`\s]+)`", text))
    paths |= {f"docs/{link}" for link in re.findall(r"\]\(([\w-]+\.md)\)", text)}
    missing = sorted(p for p in paths - written if "<" not in p and not (REPO_ROOT / p).exists())
    assert not missing, f"{DOC} names files that do not exist: {missing}"
    # a table row "| `<file>` | ... |": every constant or function it names in backticks is in that file
    unknown = []
    for path, cell in re.findall(r"^\| `([^`<]+)` \| (.*) \|$", text, re.M):
        if (REPO_ROOT / path).is_file():
            source = (REPO_ROOT / path).read_text(encoding="utf-8")
            for name in re.findall(r"`([A-Za-z_][A-Za-z0-9_]*)`", cell):
                looks_defined = "_" in name.strip("_") or (name.isupper() and len(name) > 3)
                if looks_defined and not re.search(rf"\b{name}\b", source):
                    unknown.append(f"{path}: {name}")
    assert not unknown, f"{DOC} names what its files do not define: {unknown}"
    # and every constant or function it names in its prose exists somewhere in the code
    prose = FENCE.sub("", text)
    names = {name for span in re.findall(r"`([^`\n/]+)`", prose) for name in re.findall(r"[A-Za-z_]\w*", span)
             if ("_" in name.strip("_") or (name.isupper() and len(name) > 3)) and not name.startswith(NAME)}
    code = "\n".join(p.read_text(encoding="utf-8", errors="replace") for folder in ("src", "workflow", "bench")
                     for p in (REPO_ROOT / folder).rglob("*") if p.suffix in (".py", ".smk", ".yaml"))
    code += (REPO_ROOT / "params.yaml").read_text(encoding="utf-8")
    assert len(names) > 40  # the check reads the page's names at all
    absent = [name for name in sorted(names) if not re.search(rf"\b{name}\b", code)]
    assert not absent, f"{DOC} names what the code does not define: {absent}"


# ----------------------------------------------------------------------------- the DAG

# rules that may run again in the copy: everything else is the smoke run's and must stay so
PLANNED = {"train", "synthesize", "evaluate_system", "report", "samples", "all", "training", "evaluate"}


def copy_smoke_run(smoke: Path, work: Path) -> None:
    """The session's smoke run (workflow, outputs, Snakemake's records; times kept) without what
    its paradigms made: their runs, systems, evaluations and training summaries. The corpus,
    codec, tokens, alignments, test lists and reference rows stay, so only the new paradigm's jobs
    and the report have anything to do."""
    paradigm_outputs = {smoke / "data/smoke/systems", smoke / "results/smoke/eval"}

    def leave_out(folder: str, names: list[str]) -> list[str]:
        folder = Path(folder)
        if folder == smoke / "data/smoke":
            return [n for n in names if n == "runs"]
        if folder == smoke / "results/smoke":
            return [n for n in names if n == "train"]
        if folder in paradigm_outputs:  # keep the reference rows and the ground-truth audit
            return [n for n in names if (folder / n).is_dir() and not n.startswith(("ground_truth", "resynth_"))]
        return []

    shutil.copytree(smoke, work, symlinks=True, ignore=leave_out)


def run(cmd: list, cwd: Path, env: dict, timeout: int = 600) -> subprocess.CompletedProcess:
    result = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, \
        f"{cmd} failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-5000:]}"
    return result


@pytest.mark.slow  # the page's paradigm trained, synthesized, evaluated and reported on a copy of the smoke run
def test_the_page_paradigm_runs_through_the_smoke_dag(smoke, tmp_path):
    work = tmp_path / "extended"
    copy_smoke_run(smoke, work)
    register(work)
    # the copy's package first: the editable install points at the repository's src, which has no
    # arnar/paradigms/oneshot.py and whose schema does not know the name
    env = dict(ENV, PYTHONPATH=str(work / "src"))
    where = run([sys.executable, "-c", f"import arnar.paradigms.{NAME} as m; print(m.__file__)"], work, env)
    assert Path(where.stdout.strip()).resolve().is_relative_to((work / "src").resolve())
    listing = run([BIN / "arnar", "runs", "--profile", "smoke"], work, env).stdout.splitlines()
    assert listing[0] == "profile smoke: 1 runs, 2 evaluated systems"
    assert listing[2].split() == [NAME, NAME, "-", NAME, f"{NAME}_seed2"]

    snakemake = [BIN / "snakemake", "--cores", "2"]
    plan = job_counts(run([*snakemake, "-n", "--config", "profile=smoke"], work, env).stdout)
    assert set(plan) <= PLANNED, f"the copy would redo work of the smoke run: {plan}"
    n_systems = 2 * len(TASKS)  # two synthesis seeds, every task
    assert (plan.get("train"), plan.get("synthesize"), plan.get("evaluate_system"), plan.get("report")) == \
        (1, n_systems, n_systems, 1), plan
    run([*snakemake, "--config", "profile=smoke"], work, env, timeout=DAG_TIMEOUT)

    summary = json.loads((work / f"results/smoke/train/{NAME}.json").read_text())
    assert summary["paradigm"] == NAME and summary["steps"] > 0
    metrics = json.loads((work / "results/smoke/metrics.json").read_text())
    for system in (NAME, f"{NAME}_seed2"):
        for task in TASKS:
            items = read_testlist(work / f"data/smoke/eval/testlists/{task}.tsv")
            assert len(list((work / f"data/smoke/systems/{system}/{task}").glob("*.wav"))) == len(items)
            wer = metrics[system][task]["wer_moonshine_corpus"]  # the smoke profile's judge
            assert isinstance(wer, float) and wer >= 0, (system, task, wer)
    table = (work / "results/smoke/report/comparison.md").read_text()
    comparison = table.split("## Per voice group")[0]  # the per-task comparison tables come first
    rows = [line for line in comparison.splitlines() if line.startswith(f"| {NAME} |")]
    assert len(rows) == len(TASKS)  # one row per task's table, seeds folded into mean ± spread
    for row in rows:
        wer_cell = row.split("|")[4]  # System, Params, WER-M utt-mean, WER-M corpus
        assert re.fullmatch(r" \d+\.\d\d ± \d+\.\d\d ", wer_cell), row
