#!/usr/bin/env bash
# The main job: validate every check-tier case, then benchmark the bench tier, results under RESULTS,
# each phase's wall time said as it ends. On a machine without a GPU it says so first and runs what can
# run there, in about a minute: the C references over the smoke tier and the reference self-tests
# (nothing is compared with a device, nothing is timed). Exit status as kvbench's (kvbench --help): 0 all
# ran and passed, 1 a step failed, 3 nothing was measured (no GPU; the references ran and passed).
set -u
kvbench=${1:-build/bin/kvbench}
results=${2:-results/local}
bin=$(dirname "$kvbench")
mkdir -p "$results"
t_job=$(date +%s)
t_phase=$t_job
said() { echo "main job: $1, $(($(date +%s) - t_phase)) s"; t_phase=$(date +%s); }

"$kvbench" ceilings --json "$results/ceilings.json" >"$results/ceilings.log" 2>&1
ceil_rc=$?
if [ $ceil_rc -eq 3 ]; then
    echo "main job: no GPU here: $(head -n 1 "$results/ceilings.log" | sed 's/^kvbench: //')"
    echo "main job: running the C references over the smoke tier and their self-tests; nothing is timed (exit 3)"
    "$kvbench" check --tier smoke --json "$results/check.json" >"$results/check.log" 2>&1
    check_rc=$?
    grep -E '^[0-9]+ passed, ' "$results/check.log"
    said "smoke-tier references (exit $check_rc)"
    tests_rc=0 n_tests=0
    for t in "$bin"/test_ref_*; do
        [ -x "$t" ] || continue
        n_tests=$((n_tests + 1))
        "$t" >>"$results/ref_tests.log" 2>&1 || { tests_rc=1; echo "main job: $(basename "$t") failed (see $results/ref_tests.log)"; }
    done
    said "$n_tests reference self-test programs"
    echo "main job: no GPU: nothing measured; results in $results/ ($(($(date +%s) - t_job)) s)"
    [ $check_rc -eq 3 ] && [ $tests_rc -eq 0 ] && exit 3
    exit 1
fi
[ $ceil_rc -eq 0 ] || { cat "$results/ceilings.log"; exit 1; }
said "ceilings"
"$kvbench" check --json "$results/check.json"
check_rc=$?
said "check tier (exit $check_rc)"
"$kvbench" bench --json "$results/bench.json" --summary "$results/summary.md"
bench_rc=$?
said "bench tier (exit $bench_rc)"
echo "main job: check exit $check_rc, bench exit $bench_rc; results in $results/ ($(($(date +%s) - t_job)) s)"
for rc in $check_rc $bench_rc; do [ $rc -eq 0 ] || [ $rc -eq 3 ] || exit 1; done
[ $check_rc -eq 0 ] && [ $bench_rc -eq 0 ] || exit 3
