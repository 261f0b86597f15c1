#!/usr/bin/env bash
# The main job: validate every check-tier case, then benchmark the bench tier, results under
# RESULTS. On a machine without a GPU it says so and runs what can run (the C references and their
# invariants over the check tier; nothing is timed).
set -u
kvbench=${1:-build/bin/kvbench}
results=${2:-results/local}
mkdir -p "$results"
if ! "$kvbench" ceilings --json "$results/ceilings.json"; then exit 1; fi
"$kvbench" check --json "$results/check.json"
check_rc=$?
"$kvbench" bench --json "$results/bench.json" --summary "$results/summary.md"
bench_rc=$?
echo "main job: check exit $check_rc, bench exit $bench_rc; results in $results/"
[ $check_rc -eq 0 ] && [ $bench_rc -eq 0 ]
