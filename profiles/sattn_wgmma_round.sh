#!/usr/bin/env bash
# sattn_wgmma_round.sh OUT [PHASE...]: the Hopper selective-attention passes against the mma.sync ones
# and the external peers on the GPU, from a bundle (make bundle). Phases (default: all, in this order):
#   check     every selective_attn, heavy_hitters and snapkv check case (impl=kernel/fwd_only/colsum_only
#             run the Hopper passes, impl=*_mma the mma.sync ones) -> check.log, check.json
#   sanitize  the selective_attn sanitize cases under memcheck, racecheck, initcheck, synccheck -> sanitize/
#   bench     the external peers (torch_peers.py --only sdpa: SDPA cuDNN and flash forwards), then the
#             selective_attn bench cases with those peers, one run per L in BENCH_L (default 4096 16384
#             32768) -> peers.json, bench_L<L>.json, summary_L<L>.md, bench_L<L>.log
#   ncu       Nsight Compute on the Hopper forward and column-sum kernels (and the mma.sync ones) of
#             NCU_SHAPE (default B=1 H=32 L=4096 D=128 causal) -> ncu_kernel.txt, ncu_kernel_mma.txt
# The kernels have no run-time variants: an experiment lives on a git branch, and profiles/ab_round.sh
# times two bundles (e.g. main and the branch) back to back in one call, e.g.
#   bash ab_round.sh OUT ../other_bundle "selective_attn B=1 Hq=32 Hkv=32 L=16384 D=128 impl=colsum_only"
set -u
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: sattn_wgmma_round.sh OUT [check|sanitize|bench|ncu...]}
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
        "$kv" check --cases "$cases" selective_attn heavy_hitters snapkv --json "$out/check.json" >"$out/check.log" 2>&1
        echo "check: exit $? ($(grep -E '^[0-9]+ passed' "$out/check.log" | tail -n 1))"
        grep -E '^FAIL' -A3 "$out/check.log" | head -n 40 ;;
    sanitize)
        SANITIZE_PARALLEL=1 bash "$here/sanitize.sh" "$out/sanitize" selective_attn 2>&1 | tail -n 4 ;;
    bench)
        peers=()
        if python3 -c "import torch" 2>/dev/null; then
            PYTHONUNBUFFERED=1 python3 "$here/torch_peers.py" --out "$out/peers.json" --only sdpa >"$out/peers.log" 2>&1
            echo "peers: exit $?"
            [ -s "$out/peers.json" ] && peers=(--peers "$out/peers.json")
        fi
        for L in ${BENCH_L:-4096 16384 32768}; do
            grep -E '^selective_attn .*tier=bench' "$cases/selective_attn.cases" | grep -E " L=$L " >"$out/cases_L$L.cases"
            "$kv" bench --cases "$out/cases_L$L.cases" --json "$out/bench_L$L.json" --summary "$out/summary_L$L.md" \
                "${peers[@]}" >"$out/bench_L$L.log" 2>&1
            echo "bench L=$L: exit $? ($(tail -n 1 "$out/bench_L$L.log"))"
        done ;;
    ncu)
        shape=${NCU_SHAPE:-selective_attn B=1 Hq=32 Hkv=32 L=4096 D=128}
        for impl in kernel kernel_mma; do
            timeout 240 ncu --clock-control none --profile-from-start off --section SpeedOfLight \
                --section ComputeWorkloadAnalysis --section Occupancy --section LaunchStats --section WarpStateStats \
                --section SchedulerStats --metrics sm__pipe_shared_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,lts__t_bytes.sum.per_second,smsp__inst_executed.sum \
                "$kv" profile --cases "$cases" "$shape impl=$impl" >"$out/ncu_$impl.txt" 2>&1
            echo "ncu $impl: exit $?"
        done ;;
    *)
        echo "sattn_wgmma_round: unknown phase '$ph' (check, sanitize, bench, ncu)"
        exit 2 ;;
    esac
    echo "$ph: $(( $(date +%s) - t0 )) s"
done
