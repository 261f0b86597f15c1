#!/usr/bin/env bash
# int2_round.sh BUNDLE OUT [kvbench args]: the INT2 decode-attention GPU round, from a bundle (make bundle),
# in one command on the GPU machine (7 files under OUT; the device tool returns at most 8):
#   1. device facts, kvbench bench over the int2_decode_attn bench tier (BENCH_FILTER=...), kvbench check
#      over the int2 check tier (FILTER=..., default int2_) -> round.log, bench.json, summary.md, check.json
#   2. test_gpu_decode: every decode and int2 check-tier case validated twice on the same workspace, the
#      API rejections and v2's copy-plan self-test -> tests.log
#   3. the spiky-keys case on every version, for the record (v1 and dequant_dense are expected to fail), and
#      the error margins of the bench shapes (T=32K, 128K) for kernel (v3), v2 and v1 -> spiky.log
#   4. SASS instruction mix of the fused kernels, the opcode histogram of v2's (D=128, gs=16), Nsight Compute
#      on one launch of v2 at T=32K with its stall reasons (NCU=0 skips) -> kernels.txt
set -u
b=$(cd "${1:?usage: int2_round.sh BUNDLE OUT [kvbench args]}" && pwd)
out=${2:?usage: int2_round.sh BUNDLE OUT [kvbench args]}
shift 2
mkdir -p "$out"
kv="$b/bin/kvbench"
tmp=$(mktemp -d)
# most important first (a round cut short keeps what it wrote): the decode-attention bench, the check tier
{
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,memory.total --format=csv
    echo "== bench ${BENCH_FILTER:-int2_decode_attn}"
    "$kv" bench --cases "$b/cases" ${BENCH_FILTER:-int2_decode_attn} --json "$out/bench.json" --summary "$out/summary.md" "$@"
    echo "bench exit $?"
    echo "== check ${FILTER:-int2_}"
    "$kv" check --cases "$b/cases" ${FILTER:-int2_} --json "$out/check.json"
    echo "check exit $?"
} >"$out/round.log" 2>&1
grep -E "^bench exit|^check exit|passed, .* failed" "$out/round.log"
grep -E '^FAIL' -A4 "$out/round.log" | head -n 30
cat "$out/summary.md"
if [ "${TESTS:-1}" = 1 ]; then
    (cd "$b" && KVB_CASES="$b/cases" timeout 120 bin/test_gpu_decode) >"$out/tests.log" 2>&1
    echo "test_gpu_decode exit $?: $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/tests.log" | tr '\n' ' ')"
    grep -E '^\[  FAILED  \]|error:' "$out/tests.log" | head -n 20
fi
shape32="int2_decode_attn B=8 Hq=32 Hkv=8 D=128 gs=16 T=32768 R=64 dist=normal seed=1"
shape128="int2_decode_attn B=8 Hq=32 Hkv=8 D=128 gs=16 T=131072 R=64 dist=normal seed=1"
spiky="int2_decode_attn B=2 Hq=32 Hkv=8 D=64 gs=16 T=2048 R=33 dist=spiky seed=1"
"$kv" check --cases "$b/cases" "$spiky impl=kernel" "$spiky impl=v2" "$spiky impl=v1" "$spiky impl=dequant_dense" \
    >"$out/spiky.log" 2>&1
# the bench shapes' error margins (the bench only prints them on a failure)
"$kv" check --cases "$b/cases" "$shape32 impl=kernel" "$shape32 impl=v2" "$shape32 impl=v1" "$shape128 impl=kernel" \
    "$shape128 impl=v2" "$shape128 impl=v1" >>"$out/spiky.log" 2>&1
echo "spiky: $(grep -E '^(PASS|FAIL)' "$out/spiky.log" | awk '{print $1, $NF}' | tr '\n' ' ')"
{
    echo "== SASS instruction mix per fused kernel (cuobjdump --dump-sass lib/libkvbench.so)"
    cuobjdump --dump-sass "$b/lib/libkvbench.so" >"$tmp/all.sass" 2>/dev/null
    awk '
        /Function :/ { if (name) print name, n, h, lds, prmt, lop, ldl, stl, bar; name = $3; n = h = lds = prmt = lop = ldl = stl = bar = 0 }
        /^ +\/\*[0-9a-f]+\*\// { n++ }
        /HMMA/ { h++ } /LDS/ { lds++ } /PRMT/ { prmt++ } /LOP3/ { lop++ } /LDL/ { ldl++ } /STL/ { stl++ } /BAR.SYNC/ { bar++ }
        END { if (name) print name, n, h, lds, prmt, lop, ldl, stl, bar }' "$tmp/all.sass" | grep -E "attn_kernel" |
        awk 'BEGIN { print "kernel instructions HMMA LDS PRMT LOP3 LDL STL BAR.SYNC" } { print }'
    echo "== opcode histogram of v2 (D=128, gs=16, default), static"
    awk '/Function :/ { p = ($0 ~ /v211attn_kernelILi128ELi16EEEv/) } p' "$tmp/all.sass" |
        grep -E '^ +/\*[0-9a-f]+\*/' | sed -E 's/^ +\/\*[0-9a-f]+\*\/ +//; s/^@!?U?P[0-9T]+ +//' | awk '{print $1}' |
        sort | uniq -c | sort -rn | head -n 40
    if [ "${NCU:-1}" = 1 ] && command -v ncu >/dev/null; then
        echo "== ncu: $shape32 impl=v2"
        ncu --clock-control none --profile-from-start off \
            --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
            --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
            --section InstructionStats --metrics smsp__inst_executed.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,smsp__sass_inst_executed_op_local_ld.sum \
            "$kv" profile --cases "$b/cases" "$shape32 impl=v2" 2>&1 | grep -vE '^==PROF==|^\s*$|^\s*-{8,}'
        echo "== ncu stall reasons (warps per issue-active cycle): $shape32 impl=v2"
        m=""
        for r in barrier long_scoreboard short_scoreboard mio_throttle math_pipe_throttle wait not_selected selected \
            dispatch_stall lg_throttle no_instruction membar tex_throttle branch_resolving drain sleeping misc; do
            m="$m${m:+,}smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio"
        done
        ncu --clock-control none --profile-from-start off --metrics "$m" \
            "$kv" profile --cases "$b/cases" "$shape32 impl=v2" 2>&1 | grep -E 'stalled|ERROR'
    fi
} >"$out/kernels.txt" 2>&1
echo "kernels.txt: $(wc -l <"$out/kernels.txt") lines"
rm -rf "$tmp"
