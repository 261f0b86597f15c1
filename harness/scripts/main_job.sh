#!/usr/bin/env bash
# The main job: validate every check-tier case, then benchmark the bench tier, results under
# RESULTS. On a machine without a GPU it says so and runs what can run (the C references and their
# invariants over the check tier; nothing is timed). Exit status as kvbench's (kvbench --help): 0 all
# ran and passed, 1 a step failed, 3 nothing was measured (no GPU; the references ran and passed).
set -u
kvbench=${1:-build/bin/kvbench}
results=${2:-results/local}
mkdir -p "$results"
"$kvbench" ceilings --json "$results/ceilings.json"
ceil_rc=$?
[ $ceil_rc -eq 0 ] || [ $ceil_rc -eq 3 ] || exit 1 # 3: no device, the references still run
"$kvbench" check --json "$results/check.json"
check_rc=$?
"$kvbench" bench --json "$results/bench.json" --summary "$results/summary.md"
bench_rc=$?
echo "main job: check exit $check_rc, bench exit $bench_rc; results in $results/"
for rc in $check_rc $bench_rc; do [ $rc -eq 0 ] || [ $rc -eq 3 ] || exit 1; done
[ $check_rc -eq 0 ] && [ $bench_rc -eq 0 ] || exit 3
