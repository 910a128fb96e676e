"""Zero-shot test lists: built once from the held-out speakers, then frozen in the repository.

Two tasks (VALL-E / PALLE convention, docs/design.md section 7):
  - ``continuation``: the first ``prompt_seconds`` (3 s) of the target are the prompt; the
    system continues it. The whole utterance is evaluated (PALLE 5.2). ``prompt_text`` holds the
    words that end inside the prompt, from the corpus's word alignment when it has one.
  - ``cross_sentence``: the prompt is another utterance of the same held-out speaker, drawn with
    a fixed seed; the target text is spoken in that voice.

Targets are the test-split utterances whose duration lies in [min_duration, max_duration]
(4-10 s, the LibriSpeech test-clean convention); continuation also needs at least one second
after the prompt. When more qualify than a task's item count (``max_items``: one count for both
tasks, or one per task), a seeded choice keeps that many: over the whole split (``per_voice``
``random``, how the lists frozen before 2026-12-07 were drawn), or the same number from every
held-out voice (``balanced``), so that every voice's per-voice figures rest on as many items.

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


PER_VOICE = ("random", "balanced")


def items_per_task(max_items: int | dict[str, int]) -> dict[str, int]:
    """``max_items`` as a count per task: one count for both, or a mapping with every task."""
    if isinstance(max_items, int):
        return {task: max_items for task in TASKS}
    if set(max_items) != set(TASKS) or not all(isinstance(n, int) and n >= 1 for n in max_items.values()):
        raise TestListError(f"max_items: one count for both tasks or a count for each of {', '.join(TASKS)}, "
                            f"got {max_items!r}")
    return dict(max_items)


def balanced_sample(items: list, n: int, speaker_of, rng: random.Random) -> list:
    """``n`` of ``items`` with the same number from every speaker: ``n // speakers`` each, the
    remainder one more each for the first speakers in name order. A speaker with fewer gives all
    it has, and the shortfall is drawn from the other speakers' remaining items."""
    by_speaker = defaultdict(list)
    for item in items:
        by_speaker[speaker_of(item)].append(item)
    speakers = sorted(by_speaker)
    quota = {s: n // len(speakers) + (1 if k < n % len(speakers) else 0) for k, s in enumerate(speakers)}
    chosen, rest = [], []
    for speaker in speakers:
        pool = list(by_speaker[speaker])
        rng.shuffle(pool)
        chosen += pool[:quota[speaker]]
        rest += pool[quota[speaker]:]
    return chosen + rng.sample(rest, n - len(chosen)) if len(chosen) < n else chosen


def build_testlists(
    test_cuts_path: Path,
    *,
    min_duration: float,
    max_duration: float,
    prompt_seconds: float,
    max_items: int | dict[str, int],
    seed: int,
    per_voice: str = "random",
) -> dict[str, list[TestItem]]:
    """Both task lists from the test-split cuts (lhotse), deterministic for a seed."""
    from lhotse import load_manifest  # here: reading a frozen list (every synthesis job) needs no lhotse

    if per_voice not in PER_VOICE:
        raise TestListError(f"per_voice: one of {', '.join(PER_VOICE)}, got {per_voice!r}")
    counts = items_per_task(max_items)
    cuts = sorted(load_manifest(test_cuts_path), key=lambda c: c.id)
    if not cuts:
        raise TestListError(f"{test_cuts_path}: the test split is empty; hold out speakers for it")
    by_speaker = defaultdict(list)
    for cut in cuts:
        by_speaker[cut.supervisions[0].speaker].append(cut)
    in_range = [c for c in cuts if min_duration <= c.duration <= max_duration]

    def choose(items: list, task: str) -> list:
        n = counts[task]
        if len(items) <= n:
            return items
        rng = random.Random(f"{seed}:{task}")
        if per_voice == "balanced":
            chosen = balanced_sample(items, n, lambda c: c.supervisions[0].speaker, rng)
        else:
            chosen = rng.sample(items, n)
        return sorted(chosen, key=lambda c: c.id)

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
