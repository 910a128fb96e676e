"""Audio a reader can hear: a few test items, spoken by every system, in a folder git can carry.

``docs/samples/`` holds, for a few cross-sentence items of the frozen test list, the prompt (the
voice to clone), the ground truth (the target recording), the resynthesis rows (the ground truth
through a codec and back: the best its tokens can sound) and every paradigm's output (the first
synthesis seed), as MP3, with two pages that play them: ``README.md`` (a Markdown table of links
with each item's text) and ``index.html`` (players in a browser).

MP3 because every browser plays it and LAME (through soundfile's libsndfile, no new dependency)
writes the same bytes for the same audio: the files carry no timestamp, and a rebuild is
byte-identical. (libsndfile's Ogg writer stamps each stream with a serial number drawn from the
clock, so Ogg Opus or Vorbis files would differ on every build.) The folder is capped at
:data:`MAX_BYTES` in all, so that a commit stays small; going over is an error that names the total.
"""

from __future__ import annotations

import html
import io
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import soundfile as sf

from arnar.atomic import write_bytes
from arnar.evaluate.testlists import TestItem, read_testlist

TASK = "cross_sentence"  # a voice from one sentence speaking another: the zero-shot case
ITEMS = 3
MAX_BYTES = 2_000_000  # the whole folder, audio and pages
# soundfile's compression_level for MP3 (0 best quality .. 1 smallest): about 28 kbit/s VBR for
# 16 kHz speech (~3.5 kB a second), clear enough to hear a word dropped or a voice lost
MP3_COMPRESSION = 0.6
# A system's clip is cut at this many times its item's ground-truth length: one that does not stop
# (an AR model missing its end token runs to its frame limit) is heard failing without filling the
# folder. The bound: 3 items x (3 s prompt + 4 references x 10 s + 7 paradigms x 20 s) ~ 1.9 MB.
CUT_FACTOR = 2.0
MP3_RATES = (8000, 11025, 12000, 16000, 22050, 24000, 32000, 44100, 48000)  # what MPEG audio defines
PROMPT = "prompt"  # the row name of the prompt; system names never take it (they are the rule's)


class SamplesError(ValueError):
    """Bad input for the samples: unreadable audio, no item every row speaks, or over the size cap."""


def choose_items(items: Sequence[TestItem], count: int) -> list[TestItem]:
    """``count`` items with as many speakers as there are: the first item of each speaker in the
    list's order (the frozen list is itself a seeded choice), then the next items in that order
    when the list has fewer speakers than ``count``."""
    firsts, seen = [], set()
    for item in items:
        if item.speaker not in seen:
            seen.add(item.speaker)
            firsts.append(item)
    rest = [item for item in items if item not in firsts]
    return (firsts + rest)[:count]


@dataclass(frozen=True)
class Clip:
    """One row's MP3: its bytes and, where it was cut, the length of the audio it was cut from."""

    data: bytes
    cut_from: float | None = None


def encode_mp3(wav: Path, max_seconds: float | None = None) -> Clip:
    """One wav as MP3 (its own channels and sample rate), cut at ``max_seconds`` when longer."""
    try:
        audio, rate = sf.read(wav, dtype="float32")
    except (sf.SoundFileError, OSError) as err:
        raise SamplesError(f"{wav}: cannot read the audio ({err})") from None
    if rate not in MP3_RATES:
        raise SamplesError(f"{wav}: sample rate {rate} Hz has no MP3 encoding "
                           f"(MP3 takes {', '.join(map(str, MP3_RATES))} Hz)")
    cut_from = None
    if max_seconds is not None and len(audio) > round(max_seconds * rate):
        cut_from = len(audio) / rate
        audio = audio[:round(max_seconds * rate)]
    buffer = io.BytesIO()
    sf.write(buffer, audio, rate, format="MP3", subtype="MPEG_LAYER_III", compression_level=MP3_COMPRESSION)
    return Clip(buffer.getvalue(), cut_from)


@dataclass(frozen=True)
class Sample:
    """One chosen item: its test-list entry and, per row (prompt first), the wav it comes from."""

    item: TestItem
    sources: dict[str, Path]

    def rel(self, row: str) -> str:
        """Where the row's MP3 lies, relative to the samples folder."""
        return f"{self.item.item_id}/{row}.mp3"


def collect(testlist: Path, prompts_dir: Path, systems_dir: Path, systems: Sequence[str], task: str,
            count: int) -> list[Sample]:
    """The items to play: among the test list's items whose prompt and every system's wav exist
    (a system may have failed an item; the evaluation lists it as missing), :func:`choose_items`."""
    if PROMPT in systems:
        raise SamplesError(f"--systems: {PROMPT!r} is the prompt's row, not a system")
    complete = []
    for item in read_testlist(testlist):
        sources = {PROMPT: prompts_dir / f"{item.item_id}.wav"}
        sources.update({s: systems_dir / s / task / f"{item.item_id}.wav" for s in systems})
        if all(path.is_file() for path in sources.values()):
            complete.append(Sample(item, sources))
    if not complete:
        raise SamplesError(f"{testlist}: no item has a prompt in {prompts_dir} and a wav from every system "
                           f"in {systems_dir}/<system>/{task} ({', '.join(systems)})")
    by_id = {sample.item.item_id: sample for sample in complete}
    return [by_id[item.item_id] for item in choose_items([sample.item for sample in complete], count)]


def _cell_text(text: str) -> str:
    """Text for a Markdown table cell: a pipe would end the cell."""
    return text.replace("|", "\\|")


def cut_note(cuts: dict[tuple[str, str], float]) -> str:
    """The pages' line on clips cut at :data:`CUT_FACTOR` times the ground truth (empty if none)."""
    if not cuts:
        return ""
    return (f"Cut at {CUT_FACTOR:g}x the ground truth's length (the system did not stop): "
            + "; ".join(f"{row} on {item_id} ({seconds:.1f} s long)" for (item_id, row), seconds in sorted(cuts.items()))
            + ".")


def readme(samples: Sequence[Sample], rows: Sequence[str], profile: str, task: str,
           cuts: dict[tuple[str, str], float]) -> str:
    lines = [
        f"# Audio samples — profile `{profile}`",
        "",
        f"{len(samples)} {task.replace('_', '-')} items of the frozen test list, one speaker each where the list "
        "has enough: the **prompt** (the voice to clone, another sentence of the same speaker), "
        "**ground_truth** (the recording of the text), the **resynth_** rows (the ground truth through a codec "
        "and back: the best its tokens can sound) and every paradigm's output (first synthesis seed). MP3; "
        "[index.html](index.html) plays them in a browser. Written by `snakemake --cores all` (rule `samples`, "
        "`arnar samples`); the tables in the report say how each system scores on the whole list.",
        "",
        "| Item | Text | " + " | ".join(rows) + " |",
        "|" + "---|" * (2 + len(rows)),
    ]
    for sample in samples:
        item = sample.item
        text = f"{_cell_text(item.target_text)}<br><sub>prompt: {_cell_text(item.prompt_text)}</sub>"
        links = [f"[▶]({sample.rel(row)})" for row in rows]
        lines.append(f"| `{item.item_id}` ({item.speaker}) | {text} | " + " | ".join(links) + " |")
    if cuts:
        lines += ["", cut_note(cuts)]
    return "\n".join(lines) + "\n"


_STYLE = """
body { font-family: sans-serif; margin: 2em; }
table { border-collapse: collapse; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 4px 6px; text-align: left; vertical-align: top; }
th { background: #f2f2f2; }
td.text { min-width: 16em; max-width: 24em; }
audio { width: 150px; }
.small { color: #555; font-size: 0.85em; }
"""


def index_html(samples: Sequence[Sample], rows: Sequence[str], profile: str, task: str,
               cuts: dict[tuple[str, str], float]) -> str:
    """One row per item: its text, then a player per row (prompt, references, paradigms)."""
    esc = html.escape
    parts = ["<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
             f"<title>arnar samples: {esc(profile)}</title><style>{_STYLE}</style></head><body>",
             f"<h1>Audio samples — profile <code>{esc(profile)}</code></h1>",
             f"<p class='small'>{len(samples)} {esc(task.replace('_', '-'))} items of the frozen test list: the prompt "
             "(the voice to clone), the ground truth, the resynthesis rows (the ground truth through a codec and "
             "back) and every paradigm's output (first synthesis seed).</p>",
             "<table><tr><th>Item</th><th>Text</th>" + "".join(f"<th>{esc(row)}</th>" for row in rows) + "</tr>"]
    for sample in samples:
        item = sample.item
        cells = [f"<td><code>{esc(item.item_id)}</code><br><span class='small'>{esc(item.speaker)}</span></td>",
                 f"<td class='text'>{esc(item.target_text)}<br><span class='small'>prompt: "
                 f"{esc(item.prompt_text)}</span></td>"]
        cells += [f"<td><audio controls preload='none' src='{esc(sample.rel(row))}'></audio></td>" for row in rows]
        parts.append("<tr>" + "".join(cells) + "</tr>")
    parts.append("</table>")
    if cuts:
        parts.append(f"<p class='small'>{esc(cut_note(cuts))}</p>")
    parts.append("</body></html>")
    return "\n".join(parts) + "\n"


def build_samples(*, testlist: Path, prompts_dir: Path, systems_dir: Path, systems: Sequence[str], out_dir: Path,
                  profile: str, task: str = TASK, count: int = ITEMS, max_bytes: int = MAX_BYTES) -> dict:
    """Write ``out_dir``: ``<item_id>/<row>.mp3`` for the chosen items, README.md and index.html.
    Everything is encoded and measured before anything is written, so a folder over ``max_bytes``
    is refused whole. ``systems`` are the rows after the prompt, in page order. Returns a summary."""
    samples = collect(Path(testlist), Path(prompts_dir), Path(systems_dir), systems, task, count)
    rows = [PROMPT, *systems]
    files, cuts = {}, {}
    for sample in samples:
        for row in rows:
            limit = None if row == PROMPT else CUT_FACTOR * sample.item.target_duration
            clip = encode_mp3(sample.sources[row], limit)
            files[sample.rel(row)] = clip.data
            if clip.cut_from is not None:
                cuts[(sample.item.item_id, row)] = clip.cut_from
    files["README.md"] = readme(samples, rows, profile, task, cuts).encode("utf-8")
    files["index.html"] = index_html(samples, rows, profile, task, cuts).encode("utf-8")
    total = sum(len(data) for data in files.values())
    if total > max_bytes:
        raise SamplesError(f"{out_dir}: the samples would take {total / 1e6:.2f} MB ({total} bytes), over the "
                           f"{max_bytes / 1e6:.2f} MB cap ({len(samples)} items x {len(rows)} rows)")
    out_dir = Path(out_dir)
    for rel, data in files.items():
        write_bytes(out_dir / rel, data)
    # a rebuild with other items or systems leaves no earlier MP3 behind (only this module's files)
    for stale in sorted(out_dir.glob("*/*.mp3")):
        if stale.relative_to(out_dir).as_posix() not in files:
            stale.unlink()
    for folder in sorted(out_dir.iterdir()):
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
    return {"items": [s.item.item_id for s in samples], "rows": rows, "files": len(files), "bytes": total,
            "cut": len(cuts)}
