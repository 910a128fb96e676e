"""Zero-shot test lists: built once from the held-out speakers, then frozen in the repository.

Two tasks (VALL-E / PALLE convention, docs/design.md section 7):
  - ``continuation``: the first ``prompt_seconds`` (3 s) of the target are the prompt; the
    system continues it. The whole utterance is evaluated (PALLE 5.2). ``prompt_text`` holds the
    words that end inside the prompt, from the corpus's word alignment when it has one.
  - ``cross_sentence``: the prompt is another utterance of the same held-out speaker, drawn with
    a fixed seed; the target text is spoken in that voice.

Targets are the test-split utterances whose duration lies in [min_duration, max_duration]
(4-10 s, the LibriSpeech test-clean convention); continuation also needs at least one second
after the prompt. When more qualify than ``max_items``, a seeded choice keeps ``max_items``.

A list is a TSV with a header (columns :data:`COLUMNS`). Lists are *frozen*: the DAG checks the
committed list against the manifests (:func:`verify_testlist`) rather than rebuilding it, so a
protocol change is a visible diff. ``arnar testlists --write`` rebuilds them on purpose.
"""

from __future__ import annotations

import csv
import io
import random
from collections import defaultdict
from dataclasses import asdict, dataclass, fields
from pathlib import Path


TASKS = ("continuation", "cross_sentence")
FROZEN_DIR = Path(__file__).resolve().parent / "testlists"
CONTINUATION_MIN_REST = 1.0  # seconds of target speech after the continuation prompt


class TestListError(ValueError):
    """A frozen list that does not match the corpus, or one that cannot be built."""

    __test__ = False  # not a pytest test class despite the name


@dataclass(frozen=True)
class TestItem:
    __test__ = False  # not a pytest test class despite the name

    item_id: str
    task: str
    speaker: str
    target_id: str
    target_text: str
    target_duration: float
    prompt_id: str
    prompt_start: float
    prompt_end: float
    prompt_text: str


COLUMNS = tuple(f.name for f in fields(TestItem))


def frozen_path(profile: str, task: str) -> Path:
    return FROZEN_DIR / profile / f"{task}.tsv"


def _words_within(supervision, end: float) -> str:
    alignment = (supervision.alignment or {}).get("word") or []
    return " ".join(item.symbol for item in alignment if item.start + item.duration <= end + 1e-6)


def build_testlists(
    test_cuts_path: Path,
    *,
    min_duration: float,
    max_duration: float,
    prompt_seconds: float,
    max_items: int,
    seed: int,
) -> dict[str, list[TestItem]]:
    """Both task lists from the test-split cuts (lhotse), deterministic for a seed."""
    from lhotse import load_manifest  # here: reading a frozen list (every synthesis job) needs no lhotse

    cuts = sorted(load_manifest(test_cuts_path), key=lambda c: c.id)
    if not cuts:
        raise TestListError(f"{test_cuts_path}: the test split is empty; hold out speakers for it")
    by_speaker = defaultdict(list)
    for cut in cuts:
        by_speaker[cut.supervisions[0].speaker].append(cut)
    in_range = [c for c in cuts if min_duration <= c.duration <= max_duration]

    def choose(items: list, salt: str) -> list:
        if len(items) <= max_items:
            return items
        rng = random.Random(f"{seed}:{salt}")
        return sorted(rng.sample(items, max_items), key=lambda c: c.id)

    continuation = []
    for cut in choose([c for c in in_range if c.duration >= prompt_seconds + CONTINUATION_MIN_REST], "continuation"):
        sup = cut.supervisions[0]
        continuation.append(TestItem(
            item_id=f"cont_{cut.id}", task="continuation", speaker=sup.speaker, target_id=cut.id,
            target_text=sup.text, target_duration=round(cut.duration, 4), prompt_id=cut.id,
            prompt_start=0.0, prompt_end=prompt_seconds, prompt_text=_words_within(sup, prompt_seconds),
        ))

    cross = []
    rng = random.Random(f"{seed}:cross_sentence:prompts")
    for cut in choose(in_range, "cross_sentence"):
        sup = cut.supervisions[0]
        others = [c for c in by_speaker[sup.speaker] if c.id != cut.id]
        if not others:
            continue  # a speaker with a single test utterance cannot prompt itself
        prompt = rng.choice(others)
        cross.append(TestItem(
            item_id=f"cross_{cut.id}", task="cross_sentence", speaker=sup.speaker, target_id=cut.id,
            target_text=sup.text, target_duration=round(cut.duration, 4), prompt_id=prompt.id,
            prompt_start=0.0, prompt_end=round(prompt.duration, 4),
            prompt_text=prompt.supervisions[0].text,
        ))
    lists = {"continuation": continuation, "cross_sentence": cross}
    for task, items in lists.items():
        if not items:
            raise TestListError(
                f"{test_cuts_path}: no {task} items (targets must last {min_duration}-{max_duration} s"
                + (f" and over {prompt_seconds + CONTINUATION_MIN_REST} s" if task == "continuation" else "")
                + "); adjust evaluation.min_duration/max_duration in params.yaml"
            )
    return lists


def to_tsv(items: list[TestItem]) -> str:
    buffer = io.StringIO()
    writer = csv.writer(buffer, delimiter="\t", lineterminator="\n")
    writer.writerow(COLUMNS)
    for item in items:
        writer.writerow([getattr(item, name) for name in COLUMNS])
    return buffer.getvalue()


def read_testlist(path: Path) -> list[TestItem]:
    path = Path(path)
    if not path.exists():
        raise TestListError(f"{path}: test list not found")
    with path.open(encoding="utf-8", newline="") as handle:
        reader = csv.DictReader(handle, delimiter="\t")
        if tuple(reader.fieldnames or ()) != COLUMNS:
            raise TestListError(f"{path}: columns {reader.fieldnames} differ from {list(COLUMNS)}")
        items = []
        for line, row in enumerate(reader, start=2):
            try:
                items.append(TestItem(
                    **{**row, "target_duration": float(row["target_duration"]),
                       "prompt_start": float(row["prompt_start"]), "prompt_end": float(row["prompt_end"])}
                ))
            except (TypeError, ValueError) as err:
                raise TestListError(f"{path}:{line}: {err}") from None
    return items


def verify_testlist(frozen: Path, built: list[TestItem]) -> None:
    """Raise unless the frozen list equals what the current corpus and protocol give."""
    if not Path(frozen).exists():
        raise TestListError(
            f"{frozen}: no frozen test list; freeze the lists with `snakemake --cores 1 freeze_testlists "
            "--config profile=<profile>` (or `arnar testlists --write`) and commit them"
        )
    committed = read_testlist(frozen)
    if committed == built:
        return
    committed_ids = {i.item_id for i in committed}
    built_ids = {i.item_id for i in built}
    detail = []
    if committed_ids - built_ids:
        detail.append(f"{len(committed_ids - built_ids)} items no longer in the corpus (e.g. {sorted(committed_ids - built_ids)[0]})")
    if built_ids - committed_ids:
        detail.append(f"{len(built_ids - committed_ids)} new items (e.g. {sorted(built_ids - committed_ids)[0]})")
    changed = [a.item_id for a, b in zip(sorted(committed, key=lambda i: i.item_id), sorted(built, key=lambda i: i.item_id))
               if a.item_id == b.item_id and a != b]
    if changed:
        detail.append(f"{len(changed)} items with other text/timing (e.g. {changed[0]})")
    raise TestListError(
        f"{frozen}: the frozen test list does not match the corpus ({'; '.join(detail)}). "
        "If the corpus or protocol changed on purpose, rebuild the lists with "
        "`arnar testlists --write` and commit them."
    )


def item_record(item: TestItem) -> dict:
    return asdict(item)
