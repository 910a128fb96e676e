"""Reliability (issue 14): faulty corpora, crashes and resumption, determinism, bad configs.

1. Corpus faults: one item per fault kind is injected into a copy of the smoke corpus and the DAG
   reruns through the token phase: every faulty item is quarantined with its reason, every good
   item reaches the manifests and the tokens, and the counts by reason are in the reports.
2. Crash and resume: `arnar train` killed with SIGKILL at seeded random steps and rerun ends with
   the weights and optimizer state of an uninterrupted run; the smoke DAG killed while a training
   job runs finishes with `--rerun-incomplete` and leaves no half-written file.
3. Determinism: that interrupted-and-resumed DAG (the session's smoke run with two of its training
   runs deleted, so it trains them again and redoes what reads them) is a second run with the
   same seed; its checkpoints and metrics equal those of the session's uninterrupted `smoke` run.
5. Config faults: a wrong key, type or path in params.yaml stops Snakemake before any work,
   naming the key.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
import yaml

from smoke_dag import BIN, ENV, copy_workflow, job_counts, run, snakemake
from test_train import toy_dataset, write_spm

from arnar.atomic import TMP_PREFIX
from arnar.codec.shards import read_token_shards

SPLITS = ("train", "dev", "test")



def dag(work: Path, *args: str):
    """Snakemake on the smoke profile, with room for a busy machine (most of a DAG can take
    longer than smoke_dag.run's default limit on 2 shared cores)."""
    return run([str(BIN / "snakemake"), "--cores", "2", *args, "--config", "profile=smoke"], work, timeout=3600)


# ----------------------------------------------------------------------------- 1. corpus faults

def inject_faults(corpus: Path) -> dict[str, str]:
    """Add one item per fault kind to a training speaker of a synth corpus (test speakers are
    left alone: the frozen test lists are built from them). Returns utt_id -> the reason's stable
    part (`<category>: <kind>`) that ingest must give it."""
    speakers = [line.split("\t") for line in (corpus / "speakers.tsv").read_text().splitlines()[1:]]
    train_speakers = [row[0] for row in speakers if row[-1] == "train"]
    home, other = corpus / train_speakers[0], corpus / train_speakers[1]
    donor = sorted(home.glob("*.wav"))[0]
    speech, rate = sf.read(donor, dtype="float32")
    faults: dict[str, str] = {}

    def item(utt_id: str, reason: str, text: bytes | None = b"A perfectly good sentence.\n") -> Path:
        faults[utt_id] = reason
        if text is not None:
            (home / f"{utt_id}.txt").write_bytes(text)
        return home / f"{utt_id}.wav"

    wav = item("fault_truncated", "audio: truncated")
    wav.write_bytes(donor.read_bytes()[: donor.stat().st_size // 2])  # the header still declares all of it
    item("fault_zero_length", "audio: empty file").write_bytes(b"")
    low = speech[:: rate // 8000]
    sf.write(item("fault_wrong_rate", "audio: wrong sample rate"), low, 8000, subtype="PCM_16")
    sf.write(item("fault_stereo", "audio: wrong channel count"), np.stack([speech, speech], axis=1), rate,
             subtype="PCM_16")
    nan = speech.copy()
    nan[len(nan) // 2] = np.nan
    sf.write(item("fault_nan", "audio: non-finite samples"), nan, rate, subtype="FLOAT")
    inf = speech.copy()
    inf[len(inf) // 3] = np.inf
    sf.write(item("fault_inf", "audio: non-finite samples"), inf, rate, subtype="FLOAT")
    # "clipped silence": digital silence, and speech driven to full scale
    sf.write(item("fault_silent", "audio: silent"), np.zeros_like(speech), rate, subtype="PCM_16")
    square = np.where(speech >= 0, 1.0, -1.0).astype(np.float32)
    sf.write(item("fault_clipped", "audio: clipped"), square, rate, subtype="PCM_16")
    # pairing: a transcript whose audio is missing, audio whose transcript is missing
    item("fault_no_audio", "pairing: transcript has no audio file")
    shutil.copyfile(donor, item("fault_no_transcript", "pairing: audio has no transcript file", text=None))
    for utt_id, text, reason in (("fault_empty_text", b"", "transcript: empty or whitespace only"),
                                 ("fault_blank_text", b"  \t\n \n", "transcript: empty or whitespace only"),
                                 ("fault_not_utf8", b"caf\xe9 au lait\n", "transcript: not valid UTF-8")):
        shutil.copyfile(donor, item(utt_id, reason, text=text))
    # the same utterance id under two speakers: ambiguous, so both copies are quarantined
    shutil.copyfile(donor, item("fault_duplicate", "pairing: duplicate utterance id"))
    shutil.copyfile(donor, other / "fault_duplicate.wav")
    (other / "fault_duplicate.txt").write_text("Another good sentence.\n")
    return faults


@pytest.mark.slow  # reruns the DAG from ingest to tokens on a copy of the session's smoke run
def test_corpus_faults_are_quarantined_and_good_items_reach_the_tokens(smoke, tmp_path):
    work = tmp_path / "faulty"
    shutil.copytree(smoke, work, symlinks=True)
    corpus = work / "data/smoke/corpus"
    good = sorted(p.stem for p in corpus.glob("*/*.wav"))
    faults = inject_faults(corpus)
    dag(work, "data", "tokens", "--forcerun", "manifests")

    manifests = work / "data/smoke/manifests"
    rows = [line.split("\t") for line in (manifests / "quarantine.tsv").read_text().splitlines()[1:]]
    reasons: dict[str, list[str]] = {}
    for utt_id, _path, reason in rows:
        reasons.setdefault(utt_id, []).append(reason)
    assert set(reasons) == set(faults)
    for utt_id, expected in faults.items():
        assert all(r.startswith(f"{expected}") for r in reasons[utt_id]), (utt_id, reasons[utt_id])
    assert len(reasons["fault_duplicate"]) == 2  # one row per copy
    assert (work / "results/smoke/data/quarantine.tsv").read_text() == (manifests / "quarantine.tsv").read_text()

    # every good item past ingest and tokenization, in the split it had before the faults came
    for codec in ("offline", "offline_rvq"):
        tokenized = set()
        for split in SPLITS:
            ids = {json.loads(line)["id"] for line in (manifests / f"{split}_cuts.jsonl").read_text().splitlines()}
            before = {json.loads(line)["id"] for line in
                      (smoke / f"data/smoke/manifests/{split}_cuts.jsonl").read_text().splitlines()}
            assert ids == before, split
            tokens = set(read_token_shards(work / f"data/smoke/tokens/{codec}/{split}"))
            assert tokens == ids, (codec, split)
            tokenized |= tokens
        assert tokenized == set(good)

    # the counts by reason, in the ingest summary and the published corpus report alike
    expected_counts: dict[str, int] = {}
    for utt_id, reason in faults.items():
        expected_counts[reason] = expected_counts.get(reason, 0) + len(reasons[utt_id])
    for report in (manifests / "summary.json", work / "results/smoke/data/corpus.json"):
        summary = json.loads(report.read_text())
        assert summary["quarantined"]["by_reason"] == expected_counts, report
        assert summary["quarantined"]["total"] == len(faults) + 1  # the duplicate counts twice
        assert summary["accepted"] == len(good)


def test_transcript_byte_order_mark_is_not_text(tmp_path):
    from arnar.corpus.validate import read_transcript

    path = tmp_path / "bom.txt"
    path.write_bytes("\ufeffA sentence saved by Notepad.\n".encode("utf-8"))
    assert read_transcript(path) == (None, "A sentence saved by Notepad.")
    path.write_bytes("\ufeff \n".encode("utf-8"))
    assert read_transcript(path)[0] == "transcript: empty or whitespace only"


# ----------------------------------------------------------------------------- 2a. SIGKILL and resume

# Small enough to run in seconds, big enough that a step takes long enough to be caught by polling.
TRAIN_OVERRIDES = ["paradigm=nar", "model=tiny", "model.dim=48", "model.n_layers=2", "model.n_heads=2",
                   "model.dropout=0.2", "train.progress=false", "train.max_steps=40", "train.warmup_steps=4",
                   "train.max_tokens=400", "train.log_every=1", "train.eval_every=8", "train.ckpt_every=5",
                   "train.keep_checkpoints=1"]


@pytest.fixture(scope="module")
def train_data(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("kill_data")
    paths = toy_dataset(root, n=48)
    paths["bpe"] = write_spm(root / "bpe.model")
    dev = toy_dataset(root / "dev", n=8, seed=1)
    paths["dev_tokens"], paths["dev_durations"] = dev["tokens"], dev["durations"]
    return paths


def train_command(data: dict[str, Path], run_dir: Path) -> list[str]:
    return [sys.executable, "-m", "arnar.train", "--run-dir", str(run_dir), "--tokens", str(data["tokens"]),
            "--durations", str(data["durations"]), "--text-units", str(data["bpe"]),
            "--dev-tokens", str(data["dev_tokens"]), "--dev-durations", str(data["dev_durations"]),
            "--threads", "1", "--", *TRAIN_OVERRIDES]


def logged_steps(run_dir: Path) -> int:
    """The last step in log.jsonl (0 before the first); a line cut by a kill is ignored."""
    try:
        lines = (run_dir / "log.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return 0
    steps = [0]
    for line in lines:
        try:
            steps.append(json.loads(line)["step"])
        except (ValueError, KeyError):
            pass
    return max(steps)


def kill_at_step(command: list[str], run_dir: Path, step: int, log: Path) -> int:
    """Start training, SIGKILL it once it has logged ``step``; return the last step it logged."""
    with log.open("a") as err:
        process = subprocess.Popen(command, env=ENV, stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + 300
        while logged_steps(run_dir) < step:
            assert process.poll() is None, f"training ended before step {step}:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, "training made no progress"
            time.sleep(0.005)
        process.send_signal(signal.SIGKILL)
    finally:
        process.kill()
        process.wait()
    return logged_steps(run_dir)


def test_training_killed_at_random_steps_resumes_to_identical_weights(train_data, tmp_path):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    subprocess.run(train_command(train_data, straight), env=ENV, check=True, capture_output=True)
    # two kills at seeded random steps between checkpoints (every 5 steps): the resumed run
    # redoes the steps after the last checkpoint (one kill may come before the first checkpoint)
    kills = sorted(random.Random(14).sample([s for s in range(2, 38) if s % 5], 2))
    log = tmp_path / "killed.log"
    lost = []  # (last step logged, step of the checkpoint the next run resumes from) per kill
    for step in kills:
        reached = kill_at_step(train_command(train_data, killed), killed, step, log)
        assert not (killed / "final.pt").exists()
        last = killed / "checkpoints" / "last.pt"
        lost.append((reached, torch.load(last, weights_only=False)["step"] if last.exists() else 0))
    subprocess.run(train_command(train_data, killed), env=ENV, check=True, stdout=subprocess.DEVNULL,
                   stderr=log.open("a"))
    assert "resumed" in log.read_text()
    assert any(reached > saved for reached, saved in lost), f"no kill landed between checkpoints: {lost}"

    # the same weights and optimizer state, tensor for tensor, as the run nobody interrupted
    a = torch.load(straight / "final.pt", weights_only=False)
    b = torch.load(killed / "final.pt", weights_only=False)
    assert a["model"].keys() == b["model"].keys()
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    a = torch.load(straight / "checkpoints" / "last.pt", weights_only=False)
    b = torch.load(killed / "checkpoints" / "last.pt", weights_only=False)
    assert a["step"] == b["step"] == 40
    assert_same_optimizer(a["optimizer"], b["optimizer"])
    assert same_losses(straight) == same_losses(killed)  # the log rows of redone steps were replaced
    assert not list(killed.rglob(f"{TMP_PREFIX}*")) and not list(killed.rglob("*.tmp"))


@pytest.mark.parametrize("paradigm", ["ar", "nar", "syncspeech"])
def test_two_runs_of_the_default_recipes_precision_and_threads_give_the_same_weights(train_data, tmp_path, paradigm):
    """The default profile trains with bf16 autocast where the CPU has bf16 instructions
    (train.precision bf16_if_native) and a checkpoint is what every later figure reads: two runs of
    one seed, here on two threads, end with the same weights tensor for tensor and the same loss
    rows (issue 55: a rerun on one host reproduces the digits)."""
    finals, losses = [], []
    for name in ("first", "second"):
        command = train_command(train_data, tmp_path / name)
        command[command.index("--threads") + 1] = "2"
        command = [f"paradigm={paradigm}" if c == "paradigm=nar" else c for c in command]
        command += ["train.precision=bf16_if_native", "train.max_steps=20"]
        subprocess.run(command, env=ENV, check=True, capture_output=True)
        finals.append(torch.load(tmp_path / name / "final.pt", weights_only=False)["model"])
        losses.append(same_losses(tmp_path / name))
    assert finals[0].keys() == finals[1].keys()
    assert all(torch.equal(finals[0][k], finals[1][k]) for k in finals[0])
    assert losses[0] == losses[1] and len(losses[0]) == 20


def assert_same_optimizer(a: dict, b: dict) -> None:
    assert a["param_groups"] == b["param_groups"]
    assert a["state"].keys() == b["state"].keys()
    for index, state in a["state"].items():
        for name, value in state.items():
            other = b["state"][index][name]
            assert torch.equal(value, other) if torch.is_tensor(value) else value == other, (index, name)


def same_losses(run_dir: Path) -> list[tuple[int, float]]:
    rows = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines()]
    return [(r["step"], r["train/loss"]) for r in rows if "train/loss" in r]


# ----------------------------------------------------------------------------- 5. config faults

@pytest.mark.parametrize("keys, value, named", [
    # a wrong key: a typo inside a section
    (("validation", "silence_dbs"), -60.0,
     "validation: Additional properties are not allowed ('silence_dbs' was unexpected)"),
    # a wrong type, inside a profile preset (test_pipeline checks a top-level one)
    (("profiles", "smoke", "corpus", "speakers"), "six", "profiles.smoke.corpus.speakers: 'six' is not of type 'integer'"),
    # wrong paths: files named by a key that do not exist
    (("profiles", "smoke", "training", "recipe"), "smoek", "training.recipe: 'smoek' names no config file"),
    (("profiles", "smoke", "training", "model"), "tiny.yaml", "training.model: 'tiny.yaml' names no config file"),
    (("corpus", "mls", "brouhaha_model"), "./weights/brouhaha.ckpt",
     "corpus.mls.brouhaha_model: './weights/brouhaha.ckpt': no such weights file"),
])
def test_config_fault_stops_before_any_work_naming_the_key(tmp_path, keys, value, named):
    work = copy_workflow(tmp_path / "bad")
    params = yaml.safe_load((work / "params.yaml").read_text())
    section = params
    for key in keys[:-1]:
        section = section.setdefault(key, {})
    section[keys[-1]] = value
    (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    for dry in (["-n"], []):  # the dry run and the real one
        result = snakemake(work, *dry, check=False)
        assert result.returncode != 0
        assert named in result.stdout + result.stderr
    assert not (work / "data").exists() and not (work / "results").exists() and not (work / "logs").exists()


# ----------------------------------------------------------------------------- 2b + 3. interrupted DAG

def processes_in(folder: Path) -> list[int]:
    """Ids of the processes whose working directory is inside ``folder`` (this test's jobs)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if Path(os.readlink(proc / "cwd")).is_relative_to(folder):
                    found.append(int(proc.name))
            except OSError:  # gone, or not ours to read
                pass
    return found


def kill_dag_while_training(work: Path, log: Path) -> str:
    """Run the smoke DAG and SIGKILL its whole process group (Snakemake and its jobs, as a power
    cut or an OOM kill would) once a training job has checkpointed and is still running. Returns
    the run that was cut."""
    cmd = [str(BIN / "snakemake"), "--cores", "2", "--config", "profile=smoke"]
    with log.open("w") as out:
        dag = subprocess.Popen(cmd, cwd=work, env=ENV, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 1800
        while True:
            assert dag.poll() is None, f"the DAG ended before any training checkpoint:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, "no training checkpoint within 30 min"
            running = [p.parent.parent for p in (work / "data/smoke/runs").glob("*/checkpoints/last.pt")
                       if not (p.parent.parent / "final.pt").exists()]
            if running:
                break
            time.sleep(0.2)
        os.killpg(dag.pid, signal.SIGKILL)
        dag.wait()
    finally:
        if dag.poll() is None:
            os.killpg(dag.pid, signal.SIGKILL)
            dag.wait()
    for _ in range(50):  # the kill is asynchronous; the jobs were in the group and must be gone
        if not processes_in(work):
            break
        time.sleep(0.1)
    assert not processes_in(work), "jobs outlived the killed DAG"
    return running[0].name


def assert_no_half_written_file(root: Path) -> None:
    """Every output under data/ and results/ is whole: no temporary file is left, JSON parses,
    checkpoints load, WAVs hold every sample their header declares, token shards match their
    manifests' checksums."""
    from arnar.corpus.validate import wav_declared_data_bytes

    files = [p for top in ("data", "results") for p in sorted((root / top).rglob("*")) if p.is_file()]
    assert files
    leftovers = [p for p in files if p.name.startswith(TMP_PREFIX) or p.name.endswith(".tmp")]
    assert not leftovers, leftovers
    for path in files:
        if path.suffix == ".json":
            json.loads(path.read_text())
        elif path.suffix == ".jsonl":
            [json.loads(line) for line in path.read_text().splitlines()]
        elif path.suffix == ".pt":
            torch.load(path, map_location="cpu", weights_only=False)
        elif path.suffix == ".wav":
            declared = wav_declared_data_bytes(path)
            assert declared is not None and declared[0] <= declared[1], path
            assert sf.info(path).frames > 0, path
        elif path.name == "manifest.json" and path.parent.parent.parent.name == "tokens":
            read_token_shards(path.parent)


# Fields that measure wall time: training time and throughput (results/<profile>/train/<run>.json),
# real-time factors and first-packet latencies (eval/<system>/<task>.json "speed"). They differ
# between any two runs on a busy machine and are the only fields allowed to. ("seconds" elsewhere
# is audio duration, compared like everything else.)
WALL_TIME_FIELDS = {"wall_time_s", "tokens_per_s", "rtf_end_to_end", "rtf_token_stage", "fpl_a", "fpl_l",
                    "fpl_l_waited", "first_packet_decode"}


def without_wall_time(value):
    if isinstance(value, dict):
        return {k: without_wall_time(v) for k, v in value.items() if k not in WALL_TIME_FIELDS}
    if isinstance(value, list):
        return [without_wall_time(v) for v in value]
    return value


# The runs the interrupted DAG trains again (with everything downstream of them: DELTA's conversion
# of AR, the systems' synthesis and evaluation, the report): two paradigms of different kinds, an
# autoregressive LM and CoD's masked coarse-to-fine model. Retraining all eighteen smoke runs
# took ~10 of the suite's minutes; the data phase's determinism has its own tests (codec
# training, token shards: test_offline_codec.py, test_codec.py).
RETRAINED = ("ar", "cod")
RESUMED_RULES = {"train", "synthesize", "evaluate_system", "samples", "report", "all"}


def copy_smoke_without_runs(smoke: Path, work: Path, runs: tuple[str, ...]) -> Path:
    """The session's finished smoke run (outputs, Snakemake's records, times kept) without the
    given training runs, so that Snakemake trains them again and redoes what reads them."""
    runs_folder = smoke / "data/smoke/runs"

    def leave_out(folder: str, names: list[str]) -> list[str]:
        return [n for n in names if n in runs] if Path(folder) == runs_folder else []

    shutil.copytree(smoke, work, symlinks=True, ignore=leave_out)
    return work


@pytest.mark.slow  # part of a smoke DAG, interrupted and resumed
def test_interrupted_dag_resumes_to_the_outputs_of_an_uninterrupted_run(smoke, tmp_path):
    work = copy_smoke_without_runs(smoke, tmp_path / "interrupted", RETRAINED)
    cut = kill_dag_while_training(work, tmp_path / "first.log")
    assert cut in RETRAINED
    # what a user does after a crash: release Snakemake's lock, rerun what was left incomplete
    snakemake(work, "--unlock")
    resumed = dag(work, "--rerun-incomplete")
    assert "resumed" in (work / f"logs/smoke/train_{cut}.log").read_text()  # from its checkpoint, not afresh
    # nothing the first run had finished, and nothing outside the retrained runs' lineage, is redone:
    # at most ar, cod and the runs that start from or read ar (delta, palle_concat_stage1, palle_concat)
    jobs = job_counts(resumed.stdout + resumed.stderr)
    assert jobs and set(jobs) <= RESUMED_RULES and jobs.get("train", 0) <= 5, jobs
    assert_no_half_written_file(work)
    # 3. the same seed gives the same outputs: this run (interrupted, resumed) against the session's
    # uninterrupted one
    assert_same_outputs(smoke, work)


def assert_same_outputs(smoke: Path, work: Path) -> None:
    """Tokens and codec byte for byte, final and best weights tensor for tensor (and byte for byte), metrics
    (results JSON and TSV) equal up to the wall-time fields. Every difference is listed."""
    differ = []
    # the token sets and the codec that made them (its timings are in build_log.json, apart)
    tokens = [p.relative_to(smoke) for folder in ("tokens", "codec")
              for p in sorted((smoke / "data/smoke" / folder).rglob("*")) if p.is_file() and p.name != "build_log.json"]
    assert tokens
    differ += [path for path in tokens if (work / path).read_bytes() != (smoke / path).read_bytes()]
    weights = sorted(p.relative_to(smoke) for name in ("final.pt", "best.pt")
                     for p in (smoke / "data/smoke/runs").glob(f"*/{name}"))
    assert weights and weights == sorted(p.relative_to(work) for name in ("final.pt", "best.pt")
                                         for p in (work / "data/smoke/runs").glob(f"*/{name}"))
    for path in weights:
        a = torch.load(smoke / path, weights_only=False)
        b = torch.load(work / path, weights_only=False)
        if a["step"] != b["step"] or a["config"] != b["config"] or a["model"].keys() != b["model"].keys() or \
                not all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"]):
            differ.append(path)
        elif (smoke / path).read_bytes() != (work / path).read_bytes():  # torch.save is byte-stable
            differ.append(f"{path} (bytes only)")
    metrics = sorted(p.relative_to(smoke) for p in (smoke / "results/smoke").rglob("*") if p.suffix in (".json", ".tsv"))
    assert metrics == sorted(p.relative_to(work) for p in (work / "results/smoke").rglob("*")
                             if p.suffix in (".json", ".tsv"))
    for path in metrics:
        if path.suffix == ".tsv":
            same = (work / path).read_text() == (smoke / path).read_text()
        else:
            a, b = (json.loads(p.read_text()) for p in (smoke / path, work / path))
            same = without_wall_time(a) == without_wall_time(b)
        if not same:
            differ.append(path)
    assert not differ, f"{len(differ)} outputs differ between two runs with one seed: {differ}"
