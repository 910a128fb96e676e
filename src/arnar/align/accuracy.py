"""How close an aligner's boundaries are to the synthesizer's own timings (the oracle).

- **Word boundaries**: the start and the end of every word, matched by position (a successful
  forced alignment has the text's word sequence; an utterance whose word sequences differ is
  counted as not comparable). Error = |t_aligner - t_oracle|.
- **Phone boundaries**: the aligner's dictionary and the synthesizer's phone set need not give
  the same phone sequence, so each oracle boundary (start and end of every spoken phone) is
  scored against the nearest boundary of the aligner (a one-sided, nearest-boundary error).

Reported per group (voice) and overall: mean and median absolute error in ms, and the share of
boundaries within 20 ms (the tolerance the forced-alignment literature reports).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable, Sequence

import numpy as np

from arnar.align.base import Alignment

TOLERANCE_MS = 20.0


def word_boundary_errors(aligned: Alignment, oracle: Alignment) -> np.ndarray | None:
    """Absolute errors (ms) of word starts and ends; None when the word sequences differ."""
    if [w.symbol for w in aligned.words] != [w.symbol for w in oracle.words]:
        return None
    times_a = np.array([t for w in aligned.words for t in (w.start, w.end)])
    times_o = np.array([t for w in oracle.words for t in (w.start, w.end)])
    return 1000.0 * np.abs(times_a - times_o)


def phone_boundary_errors(aligned: Alignment, oracle: Alignment) -> np.ndarray:
    """For every oracle phone boundary, the distance (ms) to the nearest aligner phone boundary."""
    ours = np.unique([t for p in aligned.phones for t in (p.start, p.end)])
    theirs = np.array([t for p in oracle.phones for t in (p.start, p.end)])
    if ours.size == 0 or theirs.size == 0:
        return np.zeros(0)
    # utterances have tens of phones: the full distance matrix is small
    return 1000.0 * np.abs(theirs[:, None] - ours[None, :]).min(axis=1)


def summarize(errors_ms: Sequence[float]) -> dict:
    errors = np.asarray(errors_ms, dtype=np.float64)
    if errors.size == 0:
        return {"boundaries": 0, "mean_ms": None, "median_ms": None, "within_20ms": None}
    return {
        "boundaries": int(errors.size),
        "mean_ms": round(float(errors.mean()), 2),
        "median_ms": round(float(np.median(errors)), 2),
        "within_20ms": round(float(np.mean(errors <= TOLERANCE_MS)), 4),
    }


def score_aligner(
    pairs: Iterable[tuple[str, Alignment, Alignment]], failures: dict[str, int] | None = None
) -> dict:
    """Score (group, aligned, oracle) triples; ``failures`` counts utterances the aligner could
    not align, per group, so the failure rate stands beside the errors."""
    words, phones = defaultdict(list), defaultdict(list)
    counts = defaultdict(lambda: {"aligned": 0, "word_sequence_differs": 0})
    for group, aligned, oracle in pairs:
        for key in (group, "overall"):
            counts[key]["aligned"] += 1
        word_err = word_boundary_errors(aligned, oracle)
        if word_err is None:
            for key in (group, "overall"):
                counts[key]["word_sequence_differs"] += 1
        else:
            words[group].append(word_err)
            words["overall"].append(word_err)
        phone_err = phone_boundary_errors(aligned, oracle)
        phones[group].append(phone_err)
        phones["overall"].append(phone_err)
    failures = dict(failures or {})
    failures["overall"] = sum(failures.values())
    result = {}
    for group in sorted(set(counts) | set(failures), key=lambda g: (g == "overall", g)):
        result[group] = {
            **counts[group],
            "failed": failures.get(group, 0),
            "word": summarize(np.concatenate(words[group]) if words[group] else []),
            "phone": summarize(np.concatenate(phones[group]) if phones[group] else []),
        }
    return result


def accuracy_markdown(aligner: str, groups: dict) -> str:
    """The accuracy table of results/<profile>/alignment.md."""
    lines = [
        f"# Alignment accuracy: {aligner} vs the synthesizer's timings", "",
        "| Voice | Aligned | Failed | Word MAE (ms) | Word median (ms) | Word <= 20 ms | "
        "Phone MAE (ms) | Phone median (ms) | Phone <= 20 ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for group, g in groups.items():
        w, p = g["word"], g["phone"]
        pct = lambda v: "–" if v is None else f"{100 * v:.1f}%"  # noqa: E731
        num = lambda v: "–" if v is None else f"{v:.1f}"  # noqa: E731
        name = f"**{group}**" if group == "overall" else group
        lines.append(f"| {name} | {g['aligned']} | {g['failed']} | {num(w['mean_ms'])} | {num(w['median_ms'])} | "
                     f"{pct(w['within_20ms'])} | {num(p['mean_ms'])} | {num(p['median_ms'])} | {pct(p['within_20ms'])} |")
    lines += ["", "Word boundaries: start and end of every word, matched by position. Phone boundaries: "
              "each oracle boundary against the nearest boundary of the aligner (the phone sets differ). "
              "Failed: utterances the aligner could not align (quarantined with the reason)."]
    return "\n".join(lines) + "\n"
