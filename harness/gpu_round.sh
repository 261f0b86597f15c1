#!/usr/bin/env bash
# gpu_round.sh OUT [FILTER...]: one whole round on a GPU machine, from the bundle: device facts,
# the test programs, check over the check tier, bench over the bench tier (and, with SANITIZE=1,
# compute-sanitizer memcheck over the check tier's FILTER). Writes to OUT: round.log, check.json,
# bench.json, summary.md (and sanitizer.log). Files stay few: the device tool returns at most 8.
# TESTS=0 skips the test programs (a second round in the same call, for another family's filter).
set -u
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: gpu_round.sh OUT [FILTER...]}
shift
mkdir -p "$out"
log="$out/round.log"
# cuBLAS from the machine's CUDA toolkit, or from a Python wheel if that is all there is
if ! ldconfig -p 2>/dev/null | grep -q libcublas.so.13 && [ ! -e /usr/local/cuda/lib64/libcublas.so.13 ]; then
    d=$(dirname "$(find / -name 'libcublas.so.13' -not -path '/proc/*' 2>/dev/null | head -n 1)")
    [ -n "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
fi
kv="$here/bin/kvbench"
cd "$here"
{
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,memory.total --format=csv
    if [ "${TESTS:-1}" = 1 ]; then
        echo "== tests"
        KVB_CASES="$here/cases" bash tests/run_tests.sh bin 2>&1 | grep -vE '^\[ (RUN|      OK) '
    fi
    echo "== check"
    "$kv" check --cases cases --json "$out/check.json" "$@"
    echo "check exit $?"
} >"$log" 2>&1
tail -n 1 "$log"
grep -E "passed, .* failed" "$log"
grep -E '^FAIL|FAILED|ERROR|error' -A4 "$log" | head -n 60
if [ "${SANITIZE:-0}" = 1 ]; then
    compute-sanitizer --tool memcheck --leak-check no "$kv" check --cases cases "$@" >"$out/sanitizer.log" 2>&1
    echo "sanitizer exit $?: $(grep -E 'ERROR SUMMARY' "$out/sanitizer.log" | tail -n 1)"
fi
if [ "${BENCH:-1}" = 1 ]; then
    "$kv" bench --cases cases --json "$out/bench.json" --summary "$out/summary.md" "$@" >>"$log" 2>&1
    echo "bench exit $?"
    cat "$out/summary.md"
fi
