#!/usr/bin/env bash
# Decoding speed of every paradigm at paper size on one GPU (bench/decode_speed.py --model paper
# --device cuda, 3 / 6 / 10 / 20 s, 3 interleaved repeats).
#
#   bash bench/gpu_decode_speed.sh [more bench/decode_speed.py options, e.g. --repeats 5]
#
# Writes decode_speed_paper_cuda.json, decode_scaling_paper_cuda.png and a log to $OUT when it is
# set (a device machine's output folder), else to results/bench/, and the table as the section
# <!-- decode_speed_paper_cuda --> of $OUT/bench.md, else of results/bench.md (beside the CPU
# run's <!-- decode_speed -->). Needs torch with CUDA, numpy, PyYAML and matplotlib, nothing
# else: the configs are read as plain YAML (no Hydra) and arnar is imported from src/, so a stock
# PyTorch image runs it as is. About 2-4 minutes on one H200, building six paper-size models
# (random weights, about 1.6 B parameters together) on the CPU included.
#
# Why a GPU run: on a CPU (results/bench/decode_speed.json from the default command) the numbers
# are compute-bound: a pass costs its matrix products, so a paradigm that runs few passes over the
# whole sequence (NAR, PALLE, DELTA, CoD) pays for every position in every pass while AR pays one
# token per pass (KV cache). On a GPU a short pass costs about its kernel launches, so the number
# of sequential passes dominates and the ratios to AR move in favour of the non-autoregressive
# paradigms; the loop overhead (sampling, Python bookkeeping) also weighs more there.
set -euo pipefail
cd "$(dirname "$0")/.."

out="${OUT:-results/bench}"
markdown="${OUT:-results}/bench.md"
mkdir -p "$out"
python="${PYTHON:-python3}"
if [ -z "${PYTHON:-}" ] && [ -x .venv/bin/python ]; then python=.venv/bin/python; fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

"$python" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else "no CUDA device visible to torch")'
"$python" -c 'import torch; print("torch", torch.__version__, "on", torch.cuda.get_device_name(0))'

"$python" bench/decode_speed.py --model paper --device cuda --seconds 3 6 10 20 --repeats 3 --threads 4 \
    --out "$out/decode_speed_paper_cuda.json" --plot "$out/decode_scaling_paper_cuda.png" \
    --markdown "$markdown" --section decode_speed_paper_cuda "$@" 2>&1 | tee "$out/decode_speed_paper_cuda.log"
