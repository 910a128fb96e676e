"""docs/samples: a few test items as MP3 with pages that play them (arnar.samples), on a tiny
systems tree of wavs built here (fast; no DAG)."""

import hashlib
import re
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from arnar.cli import main
from arnar.evaluate.testlists import TestItem, to_tsv
from arnar.samples import MAX_BYTES, PROMPT, SamplesError, build_samples, choose_items

RATE = 16000
REFERENCES = ["ground_truth", "resynth_offline"]
PARADIGMS = ["ar", "nar"]
SYSTEMS = REFERENCES + PARADIGMS


def item(item_id: str, speaker: str, text: str = "A plain sentence.") -> TestItem:
    return TestItem(item_id=item_id, task="cross_sentence", speaker=speaker, target_id=item_id[6:],
                    target_text=text, target_duration=0.5, prompt_id=f"{speaker}_0001", prompt_start=0.0,
                    prompt_end=0.3, prompt_text="The prompt's | own sentence.")


# two items of spkA first, so that choosing by voice shows: the list order alone would take both
ITEMS = [item("cross_spkA_0001", "spkA", "First of A."), item("cross_spkA_0002", "spkA", "Second of A."),
         item("cross_spkB_0001", "spkB", "First of B."), item("cross_spkC_0001", "spkC", "First of C."),
         item("cross_spkC_0002", "spkC", "Second of C.")]


def tone(seconds: float, pitch: float) -> np.ndarray:
    t = np.arange(int(RATE * seconds)) / RATE
    return (0.3 * np.sin(2 * np.pi * pitch * t) * np.hanning(t.size)).astype("float32")


def make_tree(root: Path, items=ITEMS, systems=SYSTEMS, skip=()) -> dict:
    """The DAG's layout: a test list, prompts/<item>.wav and systems/<system>/cross_sentence/<item>.wav
    (each a tone of its own pitch); ``skip``: (system, item_id) pairs left out."""
    (root / "prompts").mkdir(parents=True)
    (root / "testlist.tsv").write_text(to_tsv(list(items)), encoding="utf-8")
    for k, it in enumerate(items):
        sf.write(root / "prompts" / f"{it.item_id}.wav", tone(0.3, 150 + 10 * k), RATE)
        for s, system in enumerate(systems):
            if (system, it.item_id) in skip:
                continue
            folder = root / "systems" / system / "cross_sentence"
            folder.mkdir(parents=True, exist_ok=True)
            sf.write(folder / f"{it.item_id}.wav", tone(0.5, 200 + 40 * s + 10 * k), RATE)
    return {"testlist": root / "testlist.tsv", "prompts_dir": root / "prompts", "systems_dir": root / "systems"}


def digest(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_items_are_chosen_one_voice_each_in_the_lists_order():
    assert [i.item_id for i in choose_items(ITEMS, 3)] == ["cross_spkA_0001", "cross_spkB_0001", "cross_spkC_0001"]
    # fewer voices than items: the rest in the list's order
    assert [i.item_id for i in choose_items(ITEMS[:3], 3)] == ["cross_spkA_0001", "cross_spkB_0001",
                                                               "cross_spkA_0002"]
    assert choose_items(ITEMS[:1], 3) == ITEMS[:1]


def test_samples_play_every_row_of_three_items(tmp_path):
    out = tmp_path / "docs" / "samples"
    summary = build_samples(**make_tree(tmp_path / "tree"), systems=SYSTEMS, out_dir=out, profile="speak")
    chosen = ["cross_spkA_0001", "cross_spkB_0001", "cross_spkC_0001"]
    assert summary["items"] == chosen and summary["rows"] == [PROMPT, *SYSTEMS]
    mp3s = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.mp3"))
    assert mp3s == sorted(f"{i}/{row}.mp3" for i in chosen for row in [PROMPT, *SYSTEMS])
    assert sorted(p.name for p in out.iterdir() if p.is_file()) == ["README.md", "index.html"]
    assert summary["bytes"] == sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    # real MP3 of the source's length (the encoder pads a frame at most)
    audio, rate = sf.read(out / "cross_spkB_0001" / "ar.mp3")
    assert rate == RATE and abs(len(audio) - 0.5 * RATE) <= 1152
    # the pages: a link or a player for every file, each item's text (a pipe escaped in Markdown)
    readme = (out / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)]+\.mp3)\)", readme)
    assert sorted(links) == mp3s and all((out / link).is_file() for link in links)
    assert "| Item | Text | prompt | ground_truth | resynth_offline | ar | nar |" in readme
    assert "First of B." in readme and "The prompt's \\| own sentence." in readme
    assert "profile `speak`" in readme
    page = (out / "index.html").read_text(encoding="utf-8")
    assert sorted(re.findall(r"<audio controls preload='none' src='([^']+)'>", page)) == mp3s
    assert "First of C." in page and "Second of A." not in page


def test_a_rebuild_is_byte_identical_and_leaves_nothing_stale(tmp_path):
    tree = make_tree(tmp_path / "tree")
    first, second = tmp_path / "one", tmp_path / "two"
    build_samples(**tree, systems=SYSTEMS, out_dir=first, profile="speak")
    build_samples(**tree, systems=SYSTEMS, out_dir=second, profile="speak")
    assert digest(first) == digest(second)
    # the same folder rebuilt with one system fewer: its files go, nothing else changes
    build_samples(**tree, systems=SYSTEMS[:-1], out_dir=first, profile="speak")
    assert not list(first.rglob("nar.mp3"))
    kept = {rel: h for rel, h in digest(second).items() if rel.endswith(".mp3") and not rel.endswith("nar.mp3")}
    assert {rel: h for rel, h in digest(first).items() if rel.endswith(".mp3")} == kept
    assert not list(first.rglob(".tmp.*"))


def test_an_item_a_system_missed_is_not_chosen(tmp_path):
    tree = make_tree(tmp_path / "tree", skip={("nar", "cross_spkB_0001")})
    summary = build_samples(**tree, systems=SYSTEMS, out_dir=tmp_path / "out", profile="speak")
    assert summary["items"] == ["cross_spkA_0001", "cross_spkC_0001", "cross_spkA_0002"]


def test_the_size_cap_refuses_the_whole_folder(tmp_path):
    tree = make_tree(tmp_path / "tree")
    out = tmp_path / "out"
    with pytest.raises(SamplesError, match=r"out: the samples would take 0\.\d\d MB \(\d+ bytes\), over the "
                                           r"0\.01 MB cap \(3 items x 5 rows\)"):
        build_samples(**tree, systems=SYSTEMS, out_dir=out, profile="speak", max_bytes=10_000)
    assert not out.exists()  # nothing written
    assert MAX_BYTES == 2_000_000


def test_unreadable_or_missing_audio_is_one_clear_error(tmp_path):
    tree = make_tree(tmp_path / "tree")
    with pytest.raises(SamplesError, match="no item has a prompt in .* and a wav from every system"):
        build_samples(**tree, systems=[*SYSTEMS, "delta"], out_dir=tmp_path / "out", profile="speak")
    broken = tree["systems_dir"] / "ar" / "cross_sentence" / "cross_spkA_0001.wav"
    broken.write_bytes(b"not a wav")
    with pytest.raises(SamplesError, match=r"cross_spkA_0001\.wav: cannot read the audio"):
        build_samples(**tree, systems=SYSTEMS, out_dir=tmp_path / "out", profile="speak")
    sf.write(broken, tone(0.5, 300), 22000)  # no MPEG sample rate
    with pytest.raises(SamplesError, match="sample rate 22000 Hz has no MP3 encoding"):
        build_samples(**tree, systems=SYSTEMS, out_dir=tmp_path / "out", profile="speak")


def test_the_cli_writes_the_folder_and_fails_in_one_line(tmp_path, capsys):
    tree = make_tree(tmp_path / "tree")
    argv = ["samples", "--testlist", str(tree["testlist"]), "--prompts", str(tree["prompts_dir"]),
            "--systems-dir", str(tree["systems_dir"]), "--systems", *SYSTEMS, "--profile", "speak",
            "--out", str(tmp_path / "out")]
    assert main(argv) == 0
    assert (tmp_path / "out" / "README.md").is_file() and len(list((tmp_path / "out").rglob("*.mp3"))) == 15
    assert main([*argv[:-1], str(tmp_path / "out2"), "--systems", "prompt"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("arnar samples: error: --systems: 'prompt' is the prompt's row")


def test_a_system_that_does_not_stop_is_cut_at_twice_the_ground_truth(tmp_path):
    """The items' ground truth lasts 0.5 s: a 3 s clip is cut at 1 s, and the pages say so."""
    tree = make_tree(tmp_path / "tree")
    sf.write(tree["systems_dir"] / "nar" / "cross_sentence" / "cross_spkB_0001.wav", tone(3.0, 250), RATE)
    out = tmp_path / "out"
    assert build_samples(**tree, systems=SYSTEMS, out_dir=out, profile="speak")["cut"] == 1
    audio, _ = sf.read(out / "cross_spkB_0001" / "nar.mp3")
    assert abs(len(audio) - 1.0 * RATE) <= 1152
    note = "Cut at 2x the ground truth's length (the system did not stop): nar on cross_spkB_0001 (3.0 s long)."
    assert note in (out / "README.md").read_text(encoding="utf-8")
    assert note.replace("'", "&#x27;") in (out / "index.html").read_text(encoding="utf-8")
