#!/usr/bin/env bash
# gpu_round.sh OUT [FILTER...]: one whole round on a GPU machine, from the bundle:
# device facts, ceilings, the test programs, check over the check tier, bench over the bench tier.
# Results (JSON, logs, summary) go to OUT. Run from the bundle folder's parent or anywhere.
set -u
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: gpu_round.sh OUT [FILTER...]}
shift
mkdir -p "$out"
# cuBLAS from the machine's CUDA toolkit, or from a Python wheel if that is all there is
if ! ldconfig -p 2>/dev/null | grep -q libcublas.so.13 && [ ! -e /usr/local/cuda/lib64/libcublas.so.13 ]; then
    d=$(dirname "$(find / -name 'libcublas.so.13' -not -path '*/proc/*' 2>/dev/null | head -n 1)")
    [ -n "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
fi
kv="$here/bin/kvbench"
cd "$here"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,memory.total --format=csv | tee "$out/device.txt"
{ KVB_CASES="$here/cases" bash tests/run_tests.sh bin; } 2>&1 | tee "$out/tests.log" | tail -n 3
"$kv" check --cases cases --json "$out/check.json" "$@" > "$out/check.log" 2>&1
echo "check exit $?: $(tail -n 1 "$out/check.log")"
grep -E '^FAIL' -A6 "$out/check.log" | head -n 40
"$kv" bench --cases cases --json "$out/bench.json" --summary "$out/summary.md" "$@" > "$out/bench.log" 2>&1
echo "bench exit $?"
cat "$out/summary.md"
