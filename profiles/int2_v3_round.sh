#!/usr/bin/env bash
# int2_v3_round.sh OUT [PHASE...]: int2_decode_attn v3 against v2 on the GPU, from a bundle (make bundle).
#   check     every int2 check case (every op; int2_decode_attn's v1, v2, v3 and peers) and the MiniKV
#             step's -> check.log, check.json
#   sanitize  the int2 and MiniKV sanitize cases under memcheck, racecheck, initcheck, synccheck -> sanitize/
#   bench     the int2_decode_attn bench cases (v1, v2, v3, the peers), one run per T in BENCH_T (default
#             8192 32768 131072) -> bench_T<T>.json, summary_T<T>.md, bench_T<T>.log
#   ncu       Nsight Compute (SpeedOfLight, Occupancy, LaunchStats, WarpStateStats, SchedulerStats,
#             MemoryWorkloadAnalysis) on v2 and v3 at NCU_SHAPE (default B=8 T=32K gs=16) -> ncu_v2.txt, ncu_v3.txt
#   stalls    Nsight Compute's stall reasons per issued instruction, issue activity, instructions and DRAM
#             bytes of v3 at 8K gs=16 and 128 and 128K gs=128 (STALL_SHAPES: "name:keys" items), with ncu's
#             cache flush and without it (STALL_CACHE, default "all none": the bench keeps the SMs'
#             instruction caches, ncu's default flush does not) -> ncu_stalls_<name>_cc<all|none>.txt
#   trace     v3's per-block trace at B=8 T=8K gs=16 and 128 -> trace_gs<gs>.txt and their medians
#             (int2_v3_trace.py) in trace_summary.md. The trace is compiled only into the diagnostic build:
#             TRACE_BUNDLE=DIR names its bundle, made from the same revision with `make KVB_TRACE=1 bundle`
#             (written to build/trace/bundle; production bundles carry no trace code).
# Launch variants are not switches of the kernel: an experiment is a branch, and profiles/ab_round.sh times
# two bundles against each other in one call (e.g. `ab_round.sh OUT OTHER_BUNDLE int2_decode_attn`).
set -u
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: int2_v3_round.sh OUT [check|sanitize|bench|ncu|stalls|trace...]}
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
    stalls)
        base='int2_decode_attn B=8 Hq=32 Hkv=8 D=128 T=8192 R=64 dist=normal seed=1 impl=kernel'
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
        tkv=${TRACE_BUNDLE:?trace: set TRACE_BUNDLE to a bundle made with make KVB_TRACE=1 bundle}/bin/kvbench
        base='int2_decode_attn B=8 Hq=32 Hkv=8 D=128 T=8192 R=64 dist=normal seed=1 impl=kernel'
        for g in 16 128; do
            "$tkv" profile --cases "$cases" "${base/T=8192/gs=$g T=8192}" >"$out/trace_gs$g.txt" 2>&1
            echo "trace gs=$g: exit $?"
        done
        python3 "$here/int2_v3_trace.py" "$out"/trace_gs16.txt "$out"/trace_gs128.txt >"$out/trace_summary.md" 2>&1 ;;
    ncu)
        shape=${NCU_SHAPE:-int2_decode_attn B=8 Hq=32 Hkv=8 D=128 gs=16 T=32768 R=64 dist=normal seed=1}
        for v in v2:v2 kernel:v3; do
            timeout 200 ncu --clock-control none --profile-from-start off --section SpeedOfLight --section Occupancy \
                --section LaunchStats --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis \
                --metrics smsp__inst_executed.sum "$kv" profile "$shape impl=${v%%:*}" >"$out/ncu_${v##*:}.txt" 2>&1
            echo "ncu ${v##*:}: exit $?"
        done ;;
    esac
    echo "$ph: $(( $(date +%s) - t0 )) s"
done
