"""The SLURM profile for real: a one-node SLURM cluster on this machine runs the smoke DAG.

The fixture starts munged, slurmctld and slurmd (Debian's munge and slurm-wlm packages) on the
loopback interface, each with its own key, config, state and logs under a temporary folder, and
stops them afterwards. The node declares two GPU slots: gres/gpu entries whose device files are
character devices made under the temporary folder (SLURM 22.05 drops a GPU without a device
file). They carry no CUDA device, so a job's torch sees no GPU and trains on CPU, but SLURM
schedules --gpus requests against them for real and torchrun really starts one rank per slot.

Skipped, with the reason, where the daemons cannot run: the binaries are missing (run
scripts/setup.sh) or the process is not root (slurmd starts jobs as their user).
"""

import json
import os
import shutil
import socket
import stat
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from smoke_dag import ENV, copy_workflow, run

pytestmark = pytest.mark.slow

PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "scontrol", "scancel")
GPU_SLOTS = 2
TORCHRUN_RUN = "nar"  # the run that trains over both GPU slots (torchrun, 2 ranks)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _node_memory_mb() -> int:
    total_kb = next(int(line.split()[1]) for line in open("/proc/meminfo") if line.startswith("MemTotal:"))
    return total_kb // 1024 * 8 // 10  # leave the system a fifth


def _write_config(root: Path) -> Path:
    for i in range(GPU_SLOTS):
        try:  # a character device (the one /dev/null is): slurmd wants a device file per GPU
            os.mknod(root / f"gpu{i}", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
        except PermissionError as err:
            pytest.skip(f"SLURM test cluster: cannot make the GPU slots' device files ({err})")
    (root / "gres.conf").write_text(f"NodeName=localhost Name=gpu File={root}/gpu[0-{GPU_SLOTS - 1}]\n")
    (root / "cgroup.conf").write_text("# no cgroups: proctrack/linuxproc and task/none in slurm.conf\n")
    conf = root / "slurm.conf"
    conf.write_text(f"""\
ClusterName=arnartest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge/munge.socket
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
MailProg=/bin/true
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
GresTypes=gpu
# finished jobs stay visible to squeue (the status command here: there is no slurmdbd for sacct)
MinJobAge=7200
ReturnToService=2
NodeName=localhost NodeAddr=127.0.0.1 CPUs={os.cpu_count()} RealMemory={_node_memory_mb()} Gres=gpu:{GPU_SLOTS} State=UNKNOWN
PartitionName=test Nodes=localhost Default=YES MaxTime=INFINITE State=UP
""")
    return conf


def _wait(what: str, check, timeout: float, logs: list[Path]):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.5)
    tails = "\n".join(f"--- {log}\n{log.read_text()[-2000:]}" for log in logs if log.exists())
    pytest.skip(f"SLURM test cluster: {what} within {timeout:.0f} s\n{tails}")


@pytest.fixture
def slurm_cluster(tmp_path_factory):
    """A running one-node SLURM cluster; yields the environment its clients need (SLURM_CONF)."""
    missing = [name for name in PROGRAMS if shutil.which(name) is None]
    if missing:
        pytest.skip(f"SLURM/munge not installed ({', '.join(missing)} missing; scripts/setup.sh installs them)")
    if os.geteuid() != 0:
        pytest.skip("the SLURM test cluster needs root (slurmd starts jobs as their owner)")
    if os.cpu_count() < GPU_SLOTS:
        pytest.skip(f"the SLURM test cluster needs {GPU_SLOTS} CPUs (one per torchrun rank)")
    root = tmp_path_factory.mktemp("slurm")
    for folder in ("state", "spool", "log", "munge", "munge-key"):
        (root / folder).mkdir()
    (root / "munge").chmod(0o755)  # clients reach the socket through it
    (root / "munge-key").chmod(0o700)  # munged refuses a key others can read
    key = root / "munge-key" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    conf = _write_config(root)
    # Inside a job, the jobstep plugin clears every SLURM_* variable before its srun (issue #164 of
    # snakemake-executor-plugin-slurm), SLURM_CONF included, so a cluster whose slurm.conf is not
    # at /etc/slurm needs srun told again: a wrapper ahead of the real one on PATH does that.
    wrappers = root / "bin"
    wrappers.mkdir()
    srun = wrappers / "srun"
    srun.write_text(f"#!/bin/sh\nSLURM_CONF={conf} exec {shutil.which('srun')} \"$@\"\n")
    srun.chmod(0o755)
    env = dict(ENV, SLURM_CONF=str(conf), PATH=f"{wrappers}{os.pathsep}{ENV['PATH']}")
    log = root / "log"
    daemons = []

    def start(name, *cmd):
        with open(log / f"{name}.out", "w") as out:
            daemons.append(subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                            start_new_session=True))

    def query(*cmd):
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=30)

    try:
        # --force: pytest's temporary folders are private (0700) and munged wants every folder
        # above its socket open to all users; every client here is root anyway
        start("munged", "munged", "--foreground", "--force", f"--socket={root}/munge/munge.socket",
              f"--key-file={key}", f"--log-file={log}/munged.log", f"--pid-file={root}/munge/munged.pid",
              f"--seed-file={root}/munge/munged.seed")
        _wait("munged did not start", lambda: (root / "munge/munge.socket").exists(), 20, [log / "munged.out"])
        start("slurmctld", "slurmctld", "-D", "-f", str(conf))
        start("slurmd", "slurmd", "-D", "-N", "localhost", "-f", str(conf))
        logs = [log / "slurmctld.out", log / "slurmd.out", log / "slurmctld.log", log / "slurmd.log"]
        _wait("the node did not come up idle", lambda: query("sinfo", "-h", "-o", "%T").stdout.strip() == "idle",
              60, logs)
        yield env
    finally:
        if daemons:
            subprocess.run(["scancel", "--full", "--partition=test"], env=env, capture_output=True, timeout=30)
        for proc in reversed(daemons):  # slurmd, slurmctld, munged
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _cluster_profile(work: Path):
    """The repository's SLURM profile, adapted to this one-node cluster as a site would adapt it."""
    path = work / "workflow/profiles/slurm/config.yaml"
    profile = yaml.safe_load(path.read_text())
    node_mb = _node_memory_mb()
    profile["default-resources"].update(mem_mb=2000, runtime=60)
    for resources in profile["set-resources"].values():
        # short limits let SLURM's backfill start small jobs beside a long one
        resources.update(mem_mb=min(resources["mem_mb"], node_mb // 2), runtime=60)
    # One CPU per GPU slot (the node has two cores), so two single-GPU jobs share the node. The
    # smallest run trains on both slots: torchrun with two ranks.
    profile["set-resources"]["train"].update(gpu=f"{GPU_SLOTS} if wildcards.run == '{TORCHRUN_RUN}' else 1",
                                             cpus_per_gpu=1)
    profile.update({
        "slurm-status-command": "squeue",  # no accounting database here for sacct
        "slurm-no-account": True,
        "slurm-init-seconds-before-status-checks": 2,  # small jobs: poll often
        "seconds-between-status-checks": 2,
    })
    path.write_text(yaml.safe_dump(profile, sort_keys=False))
    return profile


def _slurm_jobs(env) -> list[dict]:
    """Every job the controller remembers (MinJobAge keeps finished ones): id, state, GPUs, rule."""
    out = subprocess.run(["squeue", "--states=all", "--noheader", "-O", "JobID:16,State:16,tres-per-job:32,Comment:300"],
                         env=env, capture_output=True, text=True, check=True).stdout
    jobs = []
    for line in out.splitlines():
        job_id, state, tres, comment = line.split()
        # the plugin's comment: rule_<rule> or rule_<rule>_wildcards_<values>
        jobs.append({"id": job_id, "state": state, "tres": tres, "rule": comment.removeprefix("rule_").split("_wildcards_")[0]})
    return jobs


# The smoke DAG through SLURM up to two evaluated systems: every phase and rule kind (corpus, ingest,
# alignment, codec training, tokens, a plain and a torchrun training run, synthesis, evaluation)
# goes through sbatch. The whole smoke DAG is ~150 jobs and each sbatch job costs 10-20 s of
# scheduling on a 2-core machine, too long for CI; the whole DAG runs locally in the session fixture.
TARGETS = ["results/smoke/eval/ar/cross_sentence.json", "results/smoke/eval/nar/cross_sentence.json"]


def test_smoke_dag_runs_through_slurm(slurm_cluster, tmp_path):
    env = slurm_cluster
    work = copy_workflow(tmp_path / "cluster")
    profile = _cluster_profile(work)
    assert profile["executor"] == "slurm" and profile["set-resources"]["synthesize"]["gpu"] == 1

    # targets first: --quiet takes every following word as one of its choices
    dry = run(["snakemake", *TARGETS, "-n", "--quiet", "rules", "--config", "profile=smoke"], work)
    planned = {}
    for line in dry.stdout.splitlines():
        words = line.split()
        if len(words) == 2 and words[1].isdigit() and words[0] not in ("total", "all"):
            planned[words[0]] = int(words[1])  # `all` has no command: Snakemake settles it locally

    started = time.monotonic()
    result = subprocess.run(
        ["snakemake", "--workflow-profile", "workflow/profiles/slurm", *TARGETS, "--config", "profile=smoke"],
        cwd=work, env=env, capture_output=True, text=True, timeout=2400)
    minutes = (time.monotonic() - started) / 60
    assert result.returncode == 0, result.stderr[-6000:]
    for target in TARGETS:
        assert json.loads((work / target).read_text())["items"] == 6

    # every job with a command was an sbatch job, and every one of them completed
    jobs = _slurm_jobs(env)
    per_rule = {rule: sum(job["rule"] == rule for job in jobs) for rule in {job["rule"] for job in jobs}}
    assert per_rule == planned
    assert {job["state"] for job in jobs} == {"COMPLETED"}, [j for j in jobs if j["state"] != "COMPLETED"]
    # the GPU requests reached the scheduler; train ran one torchrun rank per GPU slot
    gpus = {rule: {job["tres"] for job in jobs if job["rule"] == rule} for rule in per_rule}
    assert gpus["train"] == {f"gres:gpu:{GPU_SLOTS}", "gres:gpu:1"} and gpus["synthesize"] == {"gres:gpu:1"}
    assert gpus["manifests"] == {"N/A"}
    runs = sorted(p.name for p in (work / "data/smoke/runs").iterdir())
    assert len(runs) == per_rule["train"]
    for run_name in runs:
        log = (work / f"logs/smoke/train_{run_name}.log").read_text()
        ranks = GPU_SLOTS if run_name == TORCHRUN_RUN else 1
        assert f"{ranks} rank(s) on cpu" in log, log[-2000:]
    print(f"smoke DAG through SLURM: {len(jobs)} sbatch jobs in {minutes:.1f} min")
