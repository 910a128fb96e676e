"""Naturalness of a finished run's audio and what the vocoder costs (issue 57), side by side.

    python bench/naturalness.py --data data/speak --out /tmp/naturalness.json

1. **Vocoder cost**, one thread: the first ``--vocoder-items`` cross-sentence targets through the
   single-stream codec (their own tokens, the item's prompt for the voice), the same decoded
   mels turned into audio by Griffin-Lim and by HiFi-GAN; seconds per second of audio of each and
   their ratio, measured in one process one after the other.
2. **DNSMOS of every system folder** of the run (``<data>/systems/<system>/<task>``, ground truth
   and resynthesis rows included): P.808 and P.835 OVRL per task, per voice group and overall;
   seed replicas (``<system>_seed<k>``) pooled under their system. Each row's P.808 is printed
   with its gap to the ground truth's on the same items, the issue's measure (within 0.2).

Nothing is trained; the run's own files are read. ``--workers 2`` scores the systems in two
one-thread processes.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

from arnar.evaluate.run import read_voice_groups
from arnar.evaluate.testlists import read_testlist

TASKS = ("cross_sentence", "continuation")


def vocoder_cost(data: Path, items: int) -> dict:
    import torch

    from arnar.codec import load_codec
    from arnar.codec.offline.features import mel_to_audio
    from arnar.codec.offline.vocoder import HifiganVocoder
    from arnar.evaluate.audio import load_mono

    torch.set_num_threads(1)
    codec = load_codec("offline", model=data / "codec" / "offline")
    chosen = read_testlist(data / "eval" / "testlists" / "cross_sentence.tsv")[:items]
    mels = []
    for item in chosen:
        target, _ = load_mono(data / "systems" / "ground_truth" / "cross_sentence" / f"{item.item_id}.wav", 16000)
        prompt, _ = load_mono(data / "eval" / "prompts" / "cross_sentence" / f"{item.item_id}.wav", 16000)
        mels += codec.decode_mel(codec.encode([target], 16000), prompt_audio=[prompt])
    seconds = sum(m.shape[0] for m in mels) * 160 / 16000
    hifigan = HifiganVocoder()
    hifigan(mels[0][:50])  # first call: allocations, not the steady state
    timings = {}
    for name, vocode in (("griffin_lim", lambda m: mel_to_audio(m, 32)), ("hifigan", hifigan)):
        start = time.perf_counter()
        for mel in mels:
            vocode(mel)
        timings[name] = (time.perf_counter() - start) / seconds
    return {"items": len(mels), "audio_seconds": round(seconds, 2),
            "seconds_per_audio_second": {k: round(v, 4) for k, v in timings.items()},
            "hifigan_over_griffin_lim": round(timings["hifigan"] / timings["griffin_lim"], 1)}


def score_folder(args: tuple[str, str]) -> dict[str, dict[str, float]]:
    """item_id -> DNSMOS columns for every wav of one folder (one thread)."""
    folder, windows = args
    from arnar.evaluate.audio import load_mono
    from arnar.evaluate.mos import DnsmosPredictor

    predictor = DnsmosPredictor(windows=windows)
    paths = sorted(Path(folder).glob("*.wav"))
    scores = predictor.score([load_mono(p, 16000)[0] for p in paths], 16000)
    return {p.stem: {c: float(v[i]) for c, v in scores.items()} for i, p in enumerate(paths)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="a run's data folder, e.g. data/speak")
    ap.add_argument("--out", required=True, help="JSON with every figure")
    ap.add_argument("--vocoder-items", type=int, default=8)
    ap.add_argument("--windows", choices=["first", "all"], default="first")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    data = Path(args.data)

    report: dict = {"vocoder": vocoder_cost(data, args.vocoder_items)}
    cost = report["vocoder"]
    print(f"vocoder, one thread, {cost['items']} items ({cost['audio_seconds']} s of audio): "
          + ", ".join(f"{k} {v:.3f} s per audio second" for k, v in cost["seconds_per_audio_second"].items())
          + f"; HiFi-GAN / Griffin-Lim = {cost['hifigan_over_griffin_lim']}x", flush=True)

    folders = sorted(p for p in (data / "systems").glob("*/*") if p.is_dir() and p.name in TASKS)
    with ProcessPoolExecutor(args.workers) as pool:
        scored = dict(zip(folders, pool.map(score_folder, [(str(f), args.windows) for f in folders])))

    voices = read_voice_groups(data / "corpus")
    rows: dict = defaultdict(dict)
    for task in TASKS:
        speaker_of = {i.item_id: i.speaker for i in read_testlist(data / "eval" / "testlists" / f"{task}.tsv")}
        pooled: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
        for folder, items in scored.items():
            if folder.name != task:
                continue
            system = re.sub(r"_seed\d+$", "", folder.parent.name)
            for item_id, columns in items.items():
                group = voices.get(speaker_of.get(item_id, ""), ("", "all"))[1]
                for column, value in columns.items():
                    pooled[system][f"{column}"].append(value)
                    pooled[system][f"{column} {group}"].append(value)
        for system, columns in pooled.items():
            rows[system][task] = {k: round(float(np.mean(v)), 3) for k, v in sorted(columns.items())}
    report["dnsmos"] = rows
    Path(args.out).write_text(json.dumps(report, indent=2, sort_keys=True) + "\n", encoding="utf-8")

    groups = sorted({k.split(" ", 1)[1] for r in rows.values() for t in r.values() for k in t if " " in k
                     and k.startswith("p808 ")})
    for task in TASKS:
        truth = rows.get("ground_truth", {}).get(task, {})
        print(f"\n{task}: DNSMOS P.808 (gap to ground truth), OVRL")
        print("| system | P.808 | gap | " + " | ".join(f"P.808 {g}" for g in groups) + " | OVRL |")
        print("|---|---|---|" + "---|" * len(groups) + "---|")
        for system in sorted(rows):
            r = rows[system].get(task)
            if not r:
                continue
            gap = r["p808"] - truth["p808"] if truth else float("nan")
            print(f"| {system} | {r['p808']:.2f} | {gap:+.2f} | "
                  + " | ".join(f"{r.get(f'p808 {g}', float('nan')):.2f}" for g in groups) + f" | {r['ovrl']:.2f} |")


if __name__ == "__main__":
    main()
