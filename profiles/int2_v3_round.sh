#!/usr/bin/env bash
# int2_v3_round.sh OUT [PHASE...]: int2_decode_attn v3 against v2 on the GPU, from a bundle (make bundle).
#   check     every int2 check case (every op; int2_decode_attn's v1, v2, v3 and peers) and the MiniKV
#             step's -> check.log, check.json
#   sanitize  the int2 and MiniKV sanitize cases under memcheck, racecheck, initcheck, synccheck -> sanitize/
#   bench     the int2_decode_attn bench cases (v1, v2, v3, the peers), one run per T in BENCH_T (default
#             8192 32768 131072) -> bench_T<T>.json, summary_T<T>.md, bench_T<T>.log
#   ab        v3's launch variants back to back, each a list of environment settings named in AB_VARIANTS
#             (default: new = early first records and the head-aligned grid, old = neither, early, aligned;
#             then new and old again, to see the drift; rw2, rw3, rw4 = a residual step weighing 2, 3, 4
#             units of the stream-K split; nocluster = the merge through global partials where a head's
#             blocks would form a cluster; fragslate = q's fragments stored after the residual steps;
#             fill2 = a first fill of 2 records a warp at every length; noqpf = q not prefetched into L2
#             (the old q path); oldq = q staged by the block, not by warp 0 alone; noinst = a cluster
#             block's first records claimed after its first barrier, not requested before it; rank0 =
#             the cluster's partials merged by rank 0, not by the last rank),
#             over the v3 bench cases at B=8 T=8K and 32K
#             (gs=16, 128), T=128K gs=16 and B=1 T=128K gs=16 -> ab_<n>_<variant>.json, ab_<n>_<variant>.log
#   ncu       Nsight Compute (SpeedOfLight, Occupancy, LaunchStats, WarpStateStats, SchedulerStats,
#             MemoryWorkloadAnalysis) on v2 and v3 at NCU_SHAPE (default B=8 T=32K gs=16) -> ncu_v2.txt, ncu_v3.txt
#   stalls    Nsight Compute's stall reasons per issued instruction, issue activity, instructions and DRAM
#             bytes of v3 at 8K gs=16 and 128 and 128K gs=128 (STALL_SHAPES: "name:keys" items), with ncu's
#             cache flush and without it (STALL_CACHE, default "all none": the bench keeps the SMs'
#             instruction caches, ncu's default flush does not) -> ncu_stalls_<name>_cc<all|none>.txt
#   trace     v3's per-block trace (KVB_INT2_V3_TRACE=1, a diagnostic instance) at B=8 T=8K gs=16 and 128
#             -> trace_gs<gs>.txt and their medians (int2_v3_trace.py) in trace_summary.md
set -u
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: int2_v3_round.sh OUT [check|sanitize|bench|ncu...]}
shift
phases=("$@")
[ ${#phases[@]} -gt 0 ] || phases=(check sanitize bench ncu)
kv=$here/bin/kvbench
cases=${KVB_CASES:-$here/cases}
PATH=$PATH:/usr/local/cuda/bin
mkdir -p "$out"
for ph in "${phases[@]}"; do
    t0=$(date +%s)
    case $ph in
    check)
        "$kv" check --cases "$cases" int2_ method=minikv --json "$out/check.json" >"$out/check.log" 2>&1
        echo "check: exit $? ($(grep -E '^[0-9]+ passed' "$out/check.log" | tail -n 1))"
        grep -E '^FAIL' -A3 "$out/check.log" | head -n 24 ;;
    sanitize)
        SANITIZE_PARALLEL=1 bash "$here/sanitize.sh" "$out/sanitize" int2_ method=minikv 2>&1 | tail -n 4 ;;
    bench)
        # one run and one JSON per context length (a long round cut short keeps the finished ones)
        for T in ${BENCH_T:-8192 32768 131072}; do
            grep -E '^int2_decode_attn .*tier=bench' "$cases/int2.cases" | grep -E " T=$T " >"$out/cases_T$T.cases"
            "$kv" bench --cases "$out/cases_T$T.cases" --json "$out/bench_T$T.json" --summary "$out/summary_T$T.md" \
                >"$out/bench_T$T.log" 2>&1
            echo "bench T=$T: exit $? ($(tail -n 1 "$out/bench_T$T.log"))"
        done ;;
    ab)
        grep -E '^int2_decode_attn .*impl=kernel_v3 tier=bench' "$cases/int2.cases" |
            grep -E 'B=8 .*gs=(16|128) T=(8192|32768) |B=8 .*gs=16 T=131072 |B=1 .*gs=16 T=131072 ' >"$out/cases_ab.cases"
        declare -A envs=([new]="" [old]="KVB_INT2_V3_EARLY=0 KVB_INT2_V3_GRID=stream" [early]="KVB_INT2_V3_GRID=stream"
            [aligned]="KVB_INT2_V3_EARLY=0" [rw2]="KVB_INT2_V3_RW=2" [rw3]="KVB_INT2_V3_RW=3" [rw4]="KVB_INT2_V3_RW=4"
            [nocluster]="KVB_INT2_V3_CLUSTER=0" [fragslate]="KVB_INT2_V3_FRAGS=late" [fill2]="KVB_INT2_V3_FILL=2"
            [noqpf]="KVB_INT2_V3_QPF=0" [oldq]="KVB_INT2_V3_QW0=0" [noinst]="KVB_INT2_V3_INSTANT=0"
            [rank0]="KVB_INT2_V3_MERGER=0")
        n=0
        for v in ${AB_VARIANTS:-new old early aligned new old}; do
            n=$((n + 1))
            env ${envs[$v]:-} "$kv" bench --cases "$out/cases_ab.cases" --json "$out/ab_${n}_$v.json" >"$out/ab_${n}_$v.log" 2>&1
            echo "ab $n $v (${envs[$v]:-defaults}): exit $? ($(tail -n 1 "$out/ab_${n}_$v.log"))"
        done ;;
    stalls)
        base='int2_decode_attn B=8 Hq=32 Hkv=8 D=128 T=8192 R=64 dist=normal seed=1 impl=kernel_v3'
        for cc in ${STALL_CACHE:-all none}; do
            for x in ${STALL_SHAPES:-8k_gs16:gs=16,T=8192 8k_gs128:gs=128,T=8192 128k_gs128:gs=128,T=131072}; do
                n=${x%%:*} k=${x#*:}
                timeout 200 ncu --clock-control none --cache-control "$cc" --profile-from-start off --section WarpStateStats \
                    --section SpeedOfLight --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio',smsp__inst_executed.sum,dram__bytes_read.sum,smsp__issue_active.avg.pct_of_peak_sustained_active \
                    "$kv" profile "${base/T=8192/${k/,/ }}" >"$out/ncu_stalls_${n}_cc$cc.txt" 2>&1
                echo "stalls $n $cc: exit $?"
            done
        done ;;
    trace)
        base='int2_decode_attn B=8 Hq=32 Hkv=8 D=128 T=8192 R=64 dist=normal seed=1 impl=kernel_v3'
        for g in 16 128; do
            KVB_INT2_V3_TRACE=1 "$kv" profile "${base/T=8192/gs=$g T=8192}" >"$out/trace_gs$g.txt" 2>&1
            echo "trace gs=$g: exit $?"
        done
        python3 "$here/int2_v3_trace.py" "$out"/trace_gs16.txt "$out"/trace_gs128.txt >"$out/trace_summary.md" 2>&1 ;;
    ncu)
        shape=${NCU_SHAPE:-int2_decode_attn B=8 Hq=32 Hkv=8 D=128 gs=16 T=32768 R=64 dist=normal seed=1}
        for v in kernel:v2 kernel_v3:v3; do
            timeout 200 ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \
                --section LaunchStats --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
                --metrics smsp__inst_executed.sum "$kv" profile "$shape impl=${v%%:*}" >"$out/ncu_${v##*:}.txt" 2>&1
            echo "ncu ${v##*:}: exit $?"
        done ;;
    esac
    echo "$ph: $(( $(date +%s) - t0 )) s"
done
