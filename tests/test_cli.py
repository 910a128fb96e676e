"""The `arnar` command: bad input ends in one line naming the file and the problem."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from arnar.cli import main


@pytest.mark.parametrize(
    "argv, message",
    [
        (["ingest", "--corpus", "{tmp}/none", "--out", "{tmp}/o", "--sample-rate", "16000"],
         "{tmp}/none: corpus folder does not exist"),
        (["tokenizers", "--supervisions", "{tmp}/s.jsonl", "--bpe", "{tmp}/b.model",
          "--phonemes", "{tmp}/p.json", "--report", "{tmp}/r.json"],
         "{tmp}/s.jsonl: supervision manifest not found"),
        (["config", "--profile", "bogus"], "profile: 'bogus' is not one of the presets"),
        (["synth", "--out", "{tmp}/c", "--speakers", "99", "--utterances-per-speaker", "1",
          "--test-speakers", "1"], "n_speakers must be in 1..47, got 99"),
        (["curve", "--run-dir", "{tmp}/none", "--codec", "offline", "--text-units", "{tmp}/b.model", "--testlist",
          "{tmp}/t.tsv", "--prompts", "{tmp}/p", "--asr", "moonshine", "--sim", "resemblyzer", "--out", "{tmp}/c"],
         "{tmp}/none: no kept checkpoints"),
    ],
)
def test_errors_are_one_line(argv, message, tmp_path, capsys):
    argv = [a.format(tmp=tmp_path) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"arnar {argv[0]}: error: ")
    assert message.format(tmp=tmp_path) in err[0]


def test_config_prints_resolved_profile(capsys):
    assert main(["config", "--profile", "smoke"]) == 0
    resolved = json.loads(capsys.readouterr().out)
    assert resolved["profile"] == "smoke" and "profiles" not in resolved


def test_console_script_is_installed():
    script = Path(sys.executable).parent / "arnar"
    result = subprocess.run([str(script), "--help"], capture_output=True, text=True)
    assert result.returncode == 0 and "synth" in result.stdout and "ingest" in result.stdout
