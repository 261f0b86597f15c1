#!/usr/bin/env bash
# publish.sh ROUND_DIR GPU: make a finished round (gpu_round.sh's OUT, copied back from the GPU machine)
# the canonical result set of that GPU: the round's files in results/GPU/ are replaced (the directories
# beside them, A/B rounds and the main job's runs, stay), the plot is drawn
# from its bench.json, the README's headline table and the family notes' figures are regenerated from it,
# the decode-step tables are written to results/GPU/steps/, and results/README.md's entry for GPU is
# rewritten from its logs. `make publish ROUND=dir [GPU_DIR=h200]`.
set -eu
round=${1:?usage: publish.sh ROUND_DIR GPU}
gpu=${2:?usage: publish.sh ROUND_DIR GPU}
root=$(cd "$(dirname "$0")/../.." && pwd)
dest=$root/results/$gpu
[ -s "$round/bench.json" ] || { echo "publish: $round/bench.json missing or empty" >&2; exit 2; }
round_files="device.txt round.log tests.log check.json check.log sanitize.txt peers.json peers.log peers_excluded.json round_notes.md bench.json bench.log summary.md"
mkdir -p "$dest"
# the previous round's files go (a file the new round lacks must not survive from the old one); the
# subdirectories other than sanitize/ are other measurements and stay
for f in $round_files pct_of_ceiling.png plot.dat plot_meta.gp; do rm -f "$dest/$f"; done
rm -rf "$dest/sanitize"
for f in $round_files; do
    [ -f "$round/$f" ] && cp "$round/$f" "$dest/"
done
if [ -d "$round/sanitize" ]; then # the four tools' logs, compressed (racecheck's can be large)
    mkdir -p "$dest/sanitize"
    for f in "$round"/sanitize/*.log; do gzip -9c "$f" >"$dest/sanitize/$(basename "$f").gz"; done
fi
python3 "$root/harness/report/plot_report.py" "$dest/bench.json" "$dest"
gnuplot -e "datadir='$dest'" "$root/harness/report/plots.gp"
python3 "$root/harness/report/headline.py" "$dest" --write
# the paper-style step tables (ShadowKV's Table 3 and 13, the dense step against PyTorch's block) from the
# round's decode_step cases; a round without any has none
rm -rf "$dest/steps"
if grep -q '"name": *"decode_step ' "$dest/bench.json"; then
    python3 "$root/harness/report/step_report.py" "$dest/bench.json" "$dest/steps"
    gnuplot -e "datafile='$dest/steps/stages.dat'; outfile='$dest/steps/stages.png'; gpu='$(echo "$gpu" | tr a-z A-Z)'" "$root/harness/report/step_stages.gp"
fi
python3 "$root/harness/report/round_index.py" "$dest"
echo "publish: results/$gpu/ is the canonical round"
