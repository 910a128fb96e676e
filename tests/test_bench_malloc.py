"""bench/malloc_settings.py and the Snakefile's malloc settings: the bench reads the values the
Snakefile sets, and an update's losses are the same with and without them (the settings move
memory, not arithmetic), measured in two child processes as the bench does."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("malloc_settings", ROOT / "bench" / "malloc_settings.py")
ms = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ms)


def test_the_bench_reads_the_snakefiles_settings():
    settings = ms.snakefile_settings()
    assert set(settings) == {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_"}
    # the mmap threshold must exceed one update's largest block (tens of MiB) for the setting to act
    assert int(settings["MALLOC_MMAP_THRESHOLD_"]) >= 2 ** 30


def test_a_snakefile_without_settings_is_refused(tmp_path):
    (tmp_path / "Snakefile").write_text('configfile: "params.yaml"\n')
    try:
        ms.snakefile_settings(tmp_path / "Snakefile")
    except SystemExit as err:
        assert "no MALLOC_* settings" in str(err)
    else:
        raise AssertionError("a Snakefile without the settings was accepted")


def test_the_settings_do_not_change_an_updates_losses():
    args = ms.argparse.Namespace(frames=40, text=8, batch=2, updates=2, threads=1)
    plain = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    default = ms.measure("syncspeech", plain, args)
    tuned = ms.measure("syncspeech", {**plain, **ms.snakefile_settings()}, args)
    assert len(default["losses"]) == 2 and all(loss > 0 for loss in default["losses"])
    assert default["losses"] == tuned["losses"]


def test_the_cli_prints_the_ratio():
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "malloc_settings.py"), "--paradigms", "ar",
                           "--frames", "30", "--text", "6", "--batch", "2", "--updates", "1", "--rounds", "1"],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "default / snakefile seconds per update" in done.stdout and "(same losses)" in done.stdout
