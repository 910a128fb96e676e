#!/usr/bin/env bash
# Name the run behind a profile's published results. The small, readable results (tables, claims,
# plots, metrics, audits, training summaries) are the `cache: false` outs of dvc.yaml: git tracks
# them where the DAG writes them, under results/<profile>/; audio, tokens and checkpoints stay in
# the DVC cache. This writes the lab note docs/lab-notes/<commit date>-<profile>-results.md, which
# links them and says which commit and machine made them, and lists it in docs/lab-notes/README.md.
# Usage, after a full DAG run (then commit results/<profile>/, dvc.lock and the note together):
#     bash scripts/publish_results.sh mini "2 cores, CPU, the project's CI machine kind"
set -euo pipefail
cd "$(dirname "$0")/.."
profile=${1:?usage: publish_results.sh <profile> "<machine>"}
machine=${2:?name the machine the run was made on}
src=results/$profile
dst=docs/lab-notes/$(git log -1 --format=%cd --date=short)-$profile-results.md
rel=../../$src
for need in "$src/report/comparison.md" "$src/report/ground_truth_audit.md" "$src/metrics.json"; do
  [ -f "$need" ] || { echo "publish_results: $need is missing: run the DAG for $profile first" >&2; exit 1; }
done
mkdir -p "$(dirname "$dst")"
{
  echo "# Results of profile \`$profile\`"
  echo
  echo "Made by \`snakemake --cores all --config profile=$profile\` at commit \`$(git rev-parse --short HEAD)\`"
  echo "($(git log -1 --format=%cd --date=short)), on: $machine."
  echo
  echo "The files lie where the DAG writes them, tracked by git as the \`cache: false\` outs of \`dvc.yaml\`"
  echo "(a later run of the profile overwrites them; commit them with its \`dvc.lock\`):"
  echo
  echo "- [comparison.md]($rel/report/comparison.md): the comparison, per voice group, claims, ablations, training"
  echo "- [ground_truth_audit.md]($rel/report/ground_truth_audit.md): the judges on the recordings, per voice"
  [ -f "$src/alignment.md" ] && echo "- [alignment.md]($rel/alignment.md): the aligner against the synthesizer's timings"
  echo "- [metrics.json]($rel/metrics.json): the flat numbers DVC tracks"
  [ -d "$src/train" ] && echo "- [train/]($rel/train): the training engine's summary of each run"
  echo "- plots: $(cd "$src/report/plots" && ls | sed "s|.*|[&]($rel/report/plots/&)|" | paste -sd' ' -)"
} > "$dst"
index=docs/lab-notes/README.md
note=$(basename "$dst")
if [ -f "$index" ] && ! grep -qF "($note)" "$index"; then
  echo "- [$note]($note): the run behind the committed \`$profile\` results (commit \`$(git rev-parse --short HEAD)\`)" >> "$index"
fi
echo "published: $dst names the run behind $src"
