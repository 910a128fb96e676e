#!/usr/bin/env bash
# Copy a profile's small, readable results (tables, claims, plots, metrics, audits) into
# docs/results/<profile>/, the folder git tracks so that a reader sees them without running
# anything. Audio, tokens and checkpoints stay in the DVC cache. Usage, after a full DAG run:
#     bash scripts/publish_results.sh mini "2 cores, CPU, the project's CI machine kind"
set -euo pipefail
cd "$(dirname "$0")/.."
profile=${1:?usage: publish_results.sh <profile> "<machine>"}
machine=${2:?name the machine the run was made on}
src=results/$profile
dst=docs/results/$profile
for need in "$src/report/comparison.md" "$src/report/ground_truth_audit.md" "$src/metrics.json"; do
  [ -f "$need" ] || { echo "publish_results: $need is missing: run the DAG for $profile first" >&2; exit 1; }
done
rm -rf "$dst"
mkdir -p "$dst/plots"
cp "$src/report/comparison.md" "$src/report/ground_truth_audit.md" "$src/metrics.json" "$dst/"
cp "$src/report/plots/"*.png "$dst/plots/"
[ -f "$src/alignment.md" ] && cp "$src/alignment.md" "$dst/"
[ -d "$src/train" ] && mkdir -p "$dst/train" && cp "$src/train/"*.json "$dst/train/"
{
  echo "# Results of profile \`$profile\`"
  echo
  echo "Made by \`snakemake --cores all --config profile=$profile\` at commit \`$(git rev-parse --short HEAD)\`"
  echo "($(git log -1 --format=%cd --date=short)), on: $machine."
  echo
  echo "- [comparison.md](comparison.md): the comparison, per voice group, claims, ablations, training"
  echo "- [ground_truth_audit.md](ground_truth_audit.md): the judges on the recordings, per voice"
  [ -f "$dst/alignment.md" ] && echo "- [alignment.md](alignment.md): the aligner against the synthesizer's timings"
  echo "- [metrics.json](metrics.json): the flat numbers DVC tracks"
  echo "- plots: $(cd "$dst/plots" && ls | sed 's/.*/[&](plots\/&)/' | paste -sd' ' -)"
} > "$dst/README.md"
echo "published $src -> $dst"
