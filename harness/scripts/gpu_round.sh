#!/usr/bin/env bash
# gpu_round.sh OUT [FILTER...]: one whole round on a GPU machine, from the bundle (`make bundle`), in
# phases, each timed in OUT/round.log:
#   device    OUT/device.txt: the GPU, driver, clocks, memory, power limit (nvidia-smi), kvbench --version
#   tests     OUT/tests.log: the test programs and CLI tests (GPU tests included)     [TESTS=0 skips]
#   check     OUT/check.json, check.log: `kvbench check --determinism` over the check tier (or the
#             FILTERs): each case validated, launched again and held to the same bits (where the
#             kernel says why its bits vary, the relaunch validated)                   [CHECK=0 skips]
# The test programs' GPU tests run every check-tier case of their families and validate it two times
# (gather_copy three) on one device state; where this round's check runs the whole tier (CHECK=1, no
# FILTER, no SHARD) its relaunch covers that, and the test programs skip those cases
# (KVB_TEST_GPU_CASES=0; their fixed GPU tests still run), so that the round runs the tier once, not
# twice: on the H200, tests 81 s and check 195 s, where they took 244-433 s and 150-175 s.
#   sanitize  OUT/sanitize/: compute-sanitizer's four tools over the sanitize tier, side by side;
#             OUT/sanitize.txt: their verdicts                                          [SANITIZE=0 skips]
#   peers     OUT/peers.json: the external peers (torch_peers.py), when PyTorch is there [PEERS=0 skips]
#   bench     OUT/bench.json, summary.md: `kvbench bench` with those peers over the headline cases, their
#             in-suite peers, the step cases of the paper-style tables and the bench tier of the kernels
#             whose goals hold at every bench shape (harness/report/headline.py --cases), or BENCH_CASES=tier for the
#             whole bench tier, or the FILTERs when given                               [BENCH=0 skips]
# The phases run one after the other. Tests, check and sanitize side by side measured far slower on an
# H200 machine of 16 cores (results/h200/ab/round-side-by-side): the check 233 of its 819 cases in
# 1120 s where alone it takes 235 s for all, the tests unfinished after 1120 s where alone they take
# 268 s; the likely cause, not profiled: the check's references and the tests each run OpenMP over
# every core. CHECK=0 skips the check. BENCH_TIMEOUT=S ends the bench after S seconds with SIGTERM: the JSON then
# holds the cases finished (kvbench writes them on an interrupt). SHARD=K/N runs shard K of N of the check
# and the bench (kvbench --shard; `kvbench merge` joins the shards' JSON). OUT/wall.md: where the cases'
# wall time went (harness/report/wall_report.py). The phases' exit codes are in round.log; the script
# exits 1 if any failed.
# Before each phase the compute processes already on the GPU are listed (nvidia-smi): none of the
# round's own runs then, so any listed is another's work sharing the GPU with the phase, and round.log
# says so ("... other compute processes on the GPU: ..."); where nvidia-smi cannot list them (some
# containers) nothing is said.
# Back on the development machine, `make publish ROUND=OUT` makes OUT the canonical round.
set -u
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: gpu_round.sh OUT [FILTER...]}
shift
mkdir -p "$out"
out=$(cd "$out" && pwd)
log="$out/round.log"
: >"$log"
# cuBLAS and cuSOLVER from the machine's CUDA toolkit, or from Python wheels if that is all there is
for lib in libcublas.so.13 libcusolver.so.12 libcusparse.so.12 libnvJitLink.so.13; do
    if ! ldconfig -p 2>/dev/null | grep -q "$lib" && [ ! -e "/usr/local/cuda/lib64/$lib" ]; then
        d=$(dirname "$(find / -name "$lib" -not -path '/proc/*' 2>/dev/null | head -n 1)")
        [ "$d" != . ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
    fi
done
command -v compute-sanitizer >/dev/null || PATH=$PATH:/usr/local/cuda/bin
kv="$here/bin/kvbench"
cases="$here/cases"
cd "$here"
rc=0
round_t0=$(date +%s)
# TERM or INT stops the phases under way (their processes too: a check or a sanitizer left running would
# share the GPU with whatever runs next) and ends the round
phase_pids=()
stop_round() {
    trap - TERM INT
    local p
    for p in ${phase_pids[@]+"${phase_pids[@]}"}; do kill -TERM "$p" 2>/dev/null; done
    wait
    echo "[$(date -u +%FT%TZ)] round: stopped by a signal" >>"$log"
    exit 143
}
trap stop_round TERM INT

# the compute processes on the GPU now, "pid, name, memory" ";"-separated; empty when none or unknown
# (only lines that start with a pid: nvidia-smi's messages are not processes)
gpu_processes() {
    command -v nvidia-smi >/dev/null || return 0
    nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader 2>/dev/null |
        grep -E '^[0-9]+,' | paste -sd ';' -
}

# phase_start NAME CMD...: CMD in the background, in a subshell that logs its start, then its wall time
# and exit code, and that on TERM stops CMD and CMD's own processes. The GPU's other compute processes
# are listed only when none of the round's phases runs (its own would be listed as others).
phase_start() {
    local name=$1 others
    shift
    if [ ${#phase_pids[@]} -eq 0 ]; then
        others=$(gpu_processes)
        [ -n "$others" ] && echo "[$(date -u +%FT%TZ)] $name: other compute processes on the GPU: $others" >>"$log"
    fi
    echo "[$(date -u +%FT%TZ)] $name: start" >>"$log"
    (
        t0=$(date +%s)
        "$@" &
        cmd=$!
        trap 'kill -STOP "$cmd" 2>/dev/null; pkill -TERM -P "$cmd" 2>/dev/null; kill -TERM "$cmd" 2>/dev/null; kill -CONT "$cmd" 2>/dev/null; wait "$cmd"; exit 143' TERM
        wait "$cmd"
        s=$?
        echo "[$(date -u +%FT%TZ)] $name: exit $s, $(($(date +%s) - t0)) s" >>"$log"
        exit "$s"
    ) &
    phase_pids+=($!)
}
# phase_wait: waits for the phases under way (a signal is handled at once), prints their exit lines
phase_wait() {
    local p n=${#phase_pids[@]}
    for p in "${phase_pids[@]}"; do wait "$p" || rc=1; done
    phase_pids=()
    grep ': exit ' "$log" | tail -n "$n"
    return 0
}
# phase NAME CMD...: one phase, alone
phase() { phase_start "$@"; phase_wait; }

device_facts() {
    {
        nvidia-smi --query-gpu=name,driver_version,pci.bus_id,clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem,memory.total,power.limit,temperature.gpu --format=csv
        "$kv" --version
        echo "host: $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)"
    } >"$out/device.txt" 2>&1
}
# the phase's status is the tests' (not the filter's: a pipeline's status is its last command's)
gpu_cases=1
[ "${CHECK:-1}" = 1 ] && [ $# -eq 0 ] && [ -z "${SHARD:-}" ] && gpu_cases=0
run_tests() {
    KVB_TEST_GPU_CASES=$gpu_cases KVB_CASES="$cases" bash tests/run_tests.sh bin 2>&1 |
        grep -vE '^\[ (RUN|      OK) ' >"$out/tests.log"
    return "${PIPESTATUS[0]}"
}
shard=(${SHARD:+--shard "$SHARD"})
run_check() {
    "$kv" check --determinism --cases "$cases" --json "$out/check.json" "${shard[@]}" "$@" >"$out/check.log" 2>&1
}
run_sanitize() {
    SANITIZE_PARALLEL=1 KVBENCH="$kv" KVB_CASES="$cases" bash "$here/sanitize.sh" "$out/sanitize" >"$out/sanitize.txt" 2>&1
}
run_peers() {
    python3 -c "import torch" 2>/dev/null || { echo "peers: no PyTorch here" >"$out/peers.log"; return 0; }
    PYTHONUNBUFFERED=1 python3 "$here/torch_peers.py" --out "$out/peers.json" ${PEERS_ONLY:+--only "$PEERS_ONLY"} >"$out/peers.log" 2>&1
}
run_bench() {
    local sel=("$@") peers=()
    if [ ${#sel[@]} -eq 0 ] && [ "${BENCH_CASES:-headline}" = headline ]; then
        mapfile -t sel < <(python3 "$here/headline.py" --cases "$out")
    fi
    [ -s "$out/peers.json" ] && peers=(--peers "$out/peers.json")
    ${BENCH_TIMEOUT:+timeout -s TERM "$BENCH_TIMEOUT"} "$kv" bench --cases "$cases" --json "$out/bench.json" --summary "$out/summary.md" "${peers[@]}" "${shard[@]}" "${sel[@]}" >"$out/bench.log" 2>&1
}

phase device device_facts
[ "${TESTS:-1}" = 1 ] && phase tests run_tests
[ "${CHECK:-1}" = 1 ] && phase check run_check "$@"
[ "${SANITIZE:-1}" = 1 ] && phase sanitize run_sanitize
[ "${PEERS:-1}" = 1 ] && phase peers run_peers
[ "${BENCH:-1}" = 1 ] && phase bench run_bench "$@"
walls=()
for f in "$out/check.json" "$out/bench.json"; do [ -s "$f" ] && walls+=("$f"); done
[ ${#walls[@]} -gt 0 ] && python3 "$here/wall_report.py" "${walls[@]}" --out "$out/wall.md" >/dev/null
echo "[$(date -u +%FT%TZ)] round: $(($(date +%s) - round_t0)) s in all" >>"$log"
tail -n 1 "$log"
grep -hE '^[0-9]+ passed, [0-9]+ failed' "$out"/tests.log "$out"/check.log 2>/dev/null
grep -h '^sanitize ' "$out/sanitize.txt" 2>/dev/null
exit $rc
