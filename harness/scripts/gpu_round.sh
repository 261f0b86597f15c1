#!/usr/bin/env bash
# gpu_round.sh OUT [FILTER...]: one whole round on a GPU machine, from the bundle: device facts,
# the test programs, check over the check tier, the external peers (torch_peers.py, when PyTorch is
# there), bench over the bench tier with those peers (and, with SANITIZE=1, compute-sanitizer
# memcheck over the check tier's FILTER). Writes to OUT: round.log, check.json, peers.json,
# bench.json, summary.md (and sanitizer.log). Files stay few: the device tool returns at most 8.
# TESTS=0 skips the test programs, CHECK=0 the check, PEERS=0 the peers, BENCH=0 the bench.
set -u
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: gpu_round.sh OUT [FILTER...]}
shift
mkdir -p "$out"
log="$out/round.log"
# cuBLAS and cuSOLVER from the machine's CUDA toolkit, or from Python wheels if that is all there is
for lib in libcublas.so.13 libcusolver.so.12 libcusparse.so.12 libnvJitLink.so.13; do
    if ! ldconfig -p 2>/dev/null | grep -q "$lib" && [ ! -e "/usr/local/cuda/lib64/$lib" ]; then
        d=$(dirname "$(find / -name "$lib" -not -path '/proc/*' 2>/dev/null | head -n 1)")
        [ "$d" != . ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
    fi
done
kv="$here/bin/kvbench"
cd "$here"
{
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,memory.total --format=csv
    if [ "${TESTS:-1}" = 1 ]; then
        echo "== tests"
        KVB_CASES="$here/cases" bash tests/run_tests.sh bin 2>&1 | grep -vE '^\[ (RUN|      OK) '
    fi
    if [ "${CHECK:-1}" = 1 ]; then
        echo "== check"
        "$kv" check --cases cases --json "$out/check.json" "$@"
        echo "check exit $?"
    fi
} >"$log" 2>&1
tail -n 1 "$log"
grep -E "passed, .* failed" "$log"
grep -E '^FAIL|FAILED|ERROR|error' -A4 "$log" | head -n 60
if [ "${SANITIZE:-0}" = 1 ]; then
    compute-sanitizer --tool memcheck --leak-check no "$kv" check --cases cases "$@" >"$out/sanitizer.log" 2>&1
    echo "sanitizer exit $?: $(grep -E 'ERROR SUMMARY' "$out/sanitizer.log" | tail -n 1)"
fi
peers=()
if [ "${PEERS:-1}" = 1 ] && python3 -c "import torch" 2>/dev/null; then
    PYTHONUNBUFFERED=1 python3 "$here/torch_peers.py" --out "$out/peers.json" ${PEERS_ONLY:+--only "$PEERS_ONLY"} >>"$log" 2>&1
    echo "peers exit $?"
    [ -s "$out/peers.json" ] && peers=(--peers "$out/peers.json")
fi
if [ "${BENCH:-1}" = 1 ]; then
    "$kv" bench --cases cases --json "$out/bench.json" --summary "$out/summary.md" "${peers[@]}" "$@" >>"$log" 2>&1
    echo "bench exit $?"
    cat "$out/summary.md"
fi
