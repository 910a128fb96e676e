"""The `arnar` command: bad input ends in one line naming the file and the problem."""

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from arnar.cli import build_parser, main

# `arnar --help` in 80 columns starts each subcommand's help at column 24: 54 characters fit its line
HELP_WIDTH = 54


def _subcommands(parser=None, path=()):
    """(path, parser, help) of every subcommand, nested ones (arnar corpus download) included."""
    parser = parser or build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, subparser in action.choices.items():
                yield (*path, name), subparser, helps.get(name)
                yield from _subcommands(subparser, (*path, name))


SUBCOMMANDS = [" ".join(path) for path, _, _ in _subcommands()]


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
        (["testlists", "--cuts", "{tmp}/c.jsonl", "--max-items", "cross=60", "--write", "--frozen-dir", "{tmp}/f"],
         "max_items: one count for both tasks or a count for each of continuation, cross_sentence"),
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


def test_every_subcommand_has_a_one_line_help():
    bad = [f"arnar {' '.join(path)}: {help!r}" for path, _, help in _subcommands()
           if not help or "\n" in help or len(help) > HELP_WIDTH]
    assert not bad, (f"each subcommand needs a help of one line of at most {HELP_WIDTH} characters "
                     f"(longer text goes in add_parser's description=): " + "; ".join(bad))


@pytest.mark.parametrize("path", [(), ("corpus",)], ids=["arnar", "arnar corpus"])
def test_help_lists_each_subcommand_on_its_own_line(path, monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "80")
    with pytest.raises(SystemExit) as info:
        main([*path, "--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    listed = [(p[-1], h) for p, _, h in _subcommands() if p[:-1] == path]
    assert listed
    for name, help in listed:
        assert re.search(rf"^ +{re.escape(name)} +{re.escape(help)}$", out, re.M), \
            f"arnar {' '.join(path)} --help: {name} is not listed on one line with its help:\n{out}"


@pytest.mark.parametrize("command", SUBCOMMANDS)
def test_every_subcommand_help_exits_0(command, capsys):
    try:
        code = main([*command.split(), "--help"])
    except SystemExit as exit_:
        code = exit_.code
    assert code in (0, None)
    assert "usage:" in capsys.readouterr().out
