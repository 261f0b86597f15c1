#!/usr/bin/env bash
# The main job: validate every check-tier case, time the external peers (torch_peers.py, where PyTorch
# is), benchmark the bench tier with them, then the summary, wall.md (where the cases' wall time went) and
# the plots (where gnuplot is); results under RESULTS, each phase's wall time said as it ends. On a machine without a GPU it says so first and runs what can
# run there, in about a minute: the C references over the smoke tier and the reference self-tests
# (nothing is compared with a device, nothing is timed). Exit status as kvbench's (kvbench --help): 0 all
# ran and passed, 1 a step failed, 3 nothing was measured (no GPU; the references ran and passed).
#
# GPUS=N (default 1) and SHARDS=M (default N): each tier is split into M shards (kvbench --shard K/M), run
# by one process per GPU at a time (CUDA_VISIBLE_DEVICES: the i-th of the caller's list, else i), shard
# K on GPU (K-1) mod N: N=1, M=2 runs two shards one after the other on one GPU. Every bench shard takes
# the same --timing-lock, so host-bound cases are timed while no other shard is timing. Each shard's JSON
# and log are under RESULTS/shards/; `kvbench merge` makes RESULTS/check.json, bench.json and
# summary.md of them, and each tier says its wall time. A shard that fails (or refuses its input) fails
# the job; one that measured nothing while others did fails it too (part of the tier was not measured).
# Side by side, each process's references take their share of the cores (OMP_NUM_THREADS, unless set).
# Without a usable GPU the shards are not started (the references would take long, split or not): each
# shard's log says why, and the job exits 3 at once. GPUS=1 without SHARDS is the one-process job.
# The cases are weighed by the wall times of an earlier main job (--durations: the shards' split and the
# progress estimate; DURATIONS=DIR holding its check.json and bench.json, by default the committed
# one-GPU job's, results/h200/main-job/).
# HOST_MEM_LIMIT_GB=G: each kvbench's --host-mem-limit G, for a machine whose free memory grows as it is
# used (a VM with a memory balloon: MemAvailable then reads low, and cases would be refused).
set -u
kvbench=${1:-build/bin/kvbench}
results=${2:-results/local}
gpus=${GPUS:-1}
shards=${SHARDS:-$gpus}
memlimit=(${HOST_MEM_LIMIT_GB:+--host-mem-limit "$HOST_MEM_LIMIT_GB"})
for v in "GPUS=$gpus" "SHARDS=$shards"; do
    case ${v#*=} in '' | *[!0-9]* | 0*) echo "main job: $v: give a whole number in [1, 64]" >&2; exit 2 ;; esac
    [ "${v#*=}" -le 64 ] || { echo "main job: $v: give a whole number in [1, 64]" >&2; exit 2; }
done
mkdir -p "$results"
bin=$(dirname "$kvbench")
here=$(cd "$(dirname "$0")" && pwd)
# the Python reports and peers: beside this script in a bundle, in harness/{scripts,report} in the tree
script() { local f; for f in "$here/$1" "$here/../report/$1"; do [ -f "$f" ] && { echo "$f"; return; }; done; }
t_job=$(date +%s)
t_phase=$t_job
said() { echo "main job: $1, $(($(date +%s) - t_phase)) s"; t_phase=$(date +%s); }

# durations TIER: the tier's --durations FILE: the wall times of an earlier main job weigh its cases (the
# shards' split, the progress estimate; shard.h). From DURATIONS=DIR (its check.json, bench.json), else
# the bundle's durations/ (the committed one-GPU job's files, results/h200/main-job/), else those files
# in the tree; none there: the estimate alone.
durations() {
    local d f
    if [ -n "${DURATIONS:-}" ]; then
        [ -s "$DURATIONS/$1.json" ] && { echo "$DURATIONS/$1.json"; return; }
        echo "main job: DURATIONS=$DURATIONS has no $1.json: the $1 cases are weighed by the estimate" >&2
        return
    fi
    for d in "$here/durations" "$here/../../results/h200/main-job"; do
        f="$d/$1.json"
        [ -s "$f" ] && { echo "$f"; return; }
    done
}

# compute processes already on the GPU share it with every timing below: said once, not refused (only
# nvidia-smi's lines that start with a pid; where it cannot list processes nothing is said)
others=$(command -v nvidia-smi >/dev/null && nvidia-smi --query-compute-apps=pid,process_name,used_memory \
    --format=csv,noheader 2>/dev/null | grep -E '^[0-9]+,' | paste -sd ';' -)
[ -n "$others" ] && echo "main job: other compute processes on the GPU: $others; the times below may be shared with them"
"$kvbench" ceilings --json "$results/ceilings.json" >"$results/ceilings.log" 2>&1
ceil_rc=$?
if [ $ceil_rc -eq 3 ]; then
    echo "main job: no GPU here: $(head -n 1 "$results/ceilings.log" | sed 's/^kvbench: //')"
    echo "main job: running the C references over the smoke tier and their self-tests; nothing is timed (exit 3)"
    "$kvbench" check --tier smoke --json "$results/check.json" >"$results/check.log" 2>&1
    check_rc=$?
    grep -m1 -E '^[0-9]+ passed, ' "$results/check.log"
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

# The external peers, timed on this GPU in this job, or said why not (the bench then has none)
peers=()
run_peers() {
    rm -f "$results/peers.json"
    if ! python3 -c "import torch; assert torch.cuda.is_available()" >/dev/null 2>&1; then
        echo "main job: peers not timed: no python3 with PyTorch and CUDA here (the summary has no external peers)"
        return
    fi
    PYTHONUNBUFFERED=1 python3 "$(script torch_peers.py)" --out "$results/peers.json" >"$results/peers.log" 2>&1
    local rc=$?
    if [ $rc -eq 0 ] && [ -s "$results/peers.json" ]; then peers=(--peers "$results/peers.json")
    else echo "main job: peers failed (exit $rc, $results/peers.log): the bench runs without them"; fi
    said "peers (exit $rc)"
}
# After the bench: where the wall time went, and the plots where gnuplot is
reports() {
    local walls=() f
    for f in "$results/check.json" "$results/bench.json"; do [ -s "$f" ] && walls+=("$f"); done
    [ ${#walls[@]} -gt 0 ] && python3 "$(script wall_report.py)" "${walls[@]}" --out "$results/wall.md" >/dev/null &&
        echo "main job: where the cases' wall time went: $results/wall.md"
    if [ ! -s "$results/bench.json" ]; then return; fi
    if ! command -v gnuplot >/dev/null; then
        echo "main job: no plots here (no gnuplot): make plots PLOT_RESULTS=$results/bench.json PLOT_OUT=DIR makes them"
    elif python3 "$(script plot_report.py)" "$results/bench.json" "$results" >"$results/plots.log" 2>&1 &&
        gnuplot -e "datadir='$results'" "$(script plots.gp)" >>"$results/plots.log" 2>&1; then
        echo "main job: plots: $results/pct_of_ceiling.png"
    else
        echo "main job: the plots failed ($results/plots.log)"
    fi
    said "reports"
}

if [ "$gpus" -eq 1 ] && [ "$shards" -eq 1 ]; then
    dur=(); f=$(durations check); [ -n "$f" ] && dur=(--durations "$f")
    "$kvbench" check --json "$results/check.json" ${dur[@]+"${dur[@]}"} ${memlimit[@]+"${memlimit[@]}"}
    check_rc=$?
    said "check tier (exit $check_rc)"
    run_peers
    dur=(); f=$(durations bench); [ -n "$f" ] && dur=(--durations "$f")
    "$kvbench" bench --json "$results/bench.json" --summary "$results/summary.md" ${peers[@]+"${peers[@]}"} \
        ${dur[@]+"${dur[@]}"} ${memlimit[@]+"${memlimit[@]}"}
    bench_rc=$?
    said "bench tier (exit $bench_rc)"
    reports
    echo "main job: check exit $check_rc, bench exit $bench_rc; results in $results/ ($(($(date +%s) - t_job)) s in all)"
    for rc in $check_rc $bench_rc; do [ $rc -eq 0 ] || [ $rc -eq 3 ] || exit 1; done
    [ $check_rc -eq 0 ] && [ $bench_rc -eq 0 ] || exit 3
    exit 0
fi

dir=$results/shards
mkdir -p "$dir"
# the references are OpenMP-parallel over every core: processes running side by side share the cores
if [ -z "${OMP_NUM_THREADS:-}" ] && [ "$gpus" -gt 1 ]; then
    cores=$(nproc 2>/dev/null || echo "$gpus")
    export OMP_NUM_THREADS=$((cores / gpus > 0 ? cores / gpus : 1))
fi
rm -f "$dir"/*.json "$dir"/*.log "$dir"/*.md "$dir"/*.rc "$dir"/*.pid "$dir/stop"
# SIGINT/SIGTERM: each running kvbench ends after its case with its JSON (kvbench's own handling), no
# shard starts after it, the tier's shards are merged, and the job ends with 128 + the signal
interrupted=0
stop() {
    interrupted=$1
    : >"$dir/stop"
    local f
    for f in "$dir"/*.pid; do [ -f "$f" ] && kill -s "$2" "$(cat "$f")" 2>/dev/null; done
}
trap 'stop 130 INT' INT
trap 'stop 143 TERM' TERM
IFS=, read -r -a visible <<<"${CUDA_VISIBLE_DEVICES:-}"
device() { # the device of GPU slot $1: the caller's CUDA_VISIBLE_DEVICES entry, else the index
    if [ ${#visible[@]} -gt 0 ]; then echo "${visible[$(($1 % ${#visible[@]}))]}"; else echo "$1"; fi
}
cp "$results/ceilings.log" "$dir/ceilings.log" # measured above, on the first visible device

# run_tier TIER EXTRA...: every shard of the tier, GPUs in parallel, a GPU's shards in sequence; then the
# merge. Sets tier_rc: 0 measured and passed, 1 a shard or the merge failed, 3 nothing measured.
run_tier() {
    local tier=$1 start=$SECONDS g k rc
    shift
    if [ $ceil_rc -eq 3 ]; then # no usable device: nothing to measure, said in each shard's log
        for k in $(seq 1 "$shards"); do
            echo "shard $k/$shards: $tier tier not run: $(grep -m1 'nothing measured' "$dir/ceilings.log")" >"$dir/$tier.$k.log"
        done
        tier_rc=3
        echo "main job: $tier tier $shards shards not run (no usable GPU), $((SECONDS - start)) s"
        return
    fi
    local dur=() f
    f=$(durations "$tier")
    [ -n "$f" ] && dur=(--durations "$f")
    for g in $(seq 0 $((gpus - 1))); do
        # a GPU's shards in turn; this loop outlives a signal (kvbench takes it) to record the exit status
        ( trap '' INT TERM
          for k in $(seq $((g + 1)) "$gpus" "$shards"); do
              [ -e "$dir/stop" ] && break
              summary=()
              [ "$tier" = bench ] && summary=(--summary "$dir/$tier.$k.md")
              CUDA_VISIBLE_DEVICES=$(device "$g") "$kvbench" "$tier" --shard "$k/$shards" --json "$dir/$tier.$k.json" \
                  ${summary[@]+"${summary[@]}"} ${dur[@]+"${dur[@]}"} "$@" >"$dir/$tier.$k.log" 2>&1 &
              echo $! >"$dir/$tier.$k.pid"
              wait $!
              echo $? >"$dir/$tier.$k.rc"
              rm -f "$dir/$tier.$k.pid"
          done ) &
    done
    while [ -n "$(jobs -rp)" ]; do wait; done # a trapped signal ends a wait early
    local measured=0 unmeasured=0 failed=0 inputs=()
    for k in $(seq 1 "$shards"); do
        rc=$(cat "$dir/$tier.$k.rc" 2>/dev/null || echo none)
        rm -f "$dir/$tier.$k.rc"
        [ -f "$dir/$tier.$k.json" ] && inputs+=("$dir/$tier.$k.json")
        if [ "$rc" = none ]; then [ $interrupted -ne 0 ] || { failed=$((failed + 1)); echo "main job: $tier shard $k/$shards did not run"; }
        elif [ "$rc" -ge 128 ] && [ $interrupted -ne 0 ]; then :
        elif [ "$rc" -eq 3 ]; then unmeasured=$((unmeasured + 1))
        elif [ "$rc" -ne 0 ]; then failed=$((failed + 1)); echo "main job: $tier shard $k/$shards exit $rc ($dir/$tier.$k.log)"
        elif ! grep -q 'nothing to run$' "$dir/$tier.$k.log"; then measured=$((measured + 1)); fi
    done
    local merged=(--summary "$results/summary.md")
    [ "$tier" = bench ] || merged=()
    if [ ${#inputs[@]} -gt 0 ] && ! "$kvbench" merge "$results/$tier.json" "${inputs[@]}" ${merged[@]+"${merged[@]}"}; then
        failed=$((failed + 1))
    fi
    if [ $interrupted -ne 0 ]; then tier_rc=$interrupted
    elif [ $failed -gt 0 ]; then tier_rc=1
    elif [ $measured -eq 0 ]; then tier_rc=3
    elif [ $unmeasured -gt 0 ]; then
        echo "main job: $tier: $unmeasured of $shards shards measured nothing (no usable GPU there?)"
        tier_rc=1
    else tier_rc=0; fi
    echo "main job: $tier tier $shards shard$([ "$shards" -eq 1 ] || echo s) on $gpus GPU$([ "$gpus" -eq 1 ] || echo s), $((SECONDS - start)) s"
}
run_tier check ${memlimit[@]+"${memlimit[@]}"}
check_rc=$tier_rc
if [ $interrupted -ne 0 ]; then
    echo "main job: interrupted: check exit $check_rc, bench not run; the results hold the cases finished"
    exit $interrupted
fi
t_phase=$(date +%s)
[ $ceil_rc -eq 3 ] || run_peers
run_tier bench --timing-lock "$dir/timing.lock" ${peers[@]+"${peers[@]}"} ${memlimit[@]+"${memlimit[@]}"}
bench_rc=$tier_rc
[ $interrupted -eq 0 ] || { echo "main job: interrupted: the results hold the cases finished"; exit $interrupted; }
t_phase=$(date +%s)
reports
echo "main job: check exit $check_rc, bench exit $bench_rc; results in $results/ (shards: $dir/; $(($(date +%s) - t_job)) s in all)"
for rc in $check_rc $bench_rc; do [ $rc -eq 0 ] || [ $rc -eq 3 ] || exit 1; done
[ $check_rc -eq 0 ] && [ $bench_rc -eq 0 ] || exit 3
