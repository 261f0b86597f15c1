#!/usr/bin/env bash
# selective_attn_round.sh BUNDLE OUT: the selective_attn family's GPU round, from a bundle (make bundle),
# in one command on the GPU machine:
#   1. gpu_round.sh over the selective_attn, heavy_hitters and snapkv cases: device facts, the test
#      programs, kvbench check (check tier), the external peers of the same run (torch_peers.py:
#      SDPA's cuDNN and flash forwards, torch.topk), kvbench bench --peers (bench tier) -> round.log,
#      check.json, peers.json, bench.json, summary.md
#   2. compute-sanitizer memcheck and racecheck on a few small cases -> sanitizer.log
#   3. the kernels' SASS instruction mix (HGMMA for the Hopper passes, HMMA and LDSM for the mma.sync
#      ones, MUFU.EX2, local memory, barriers) and one Nsight Compute pass over both kernels of a 4K
#      case (impl=kernel: the Hopper passes on an H100/H200) -> kernels.txt
# Extra arguments go to kvbench (e.g. --benchmark_min_time=0.05). PEERS=0, SAN=0, NCU=0 skip steps.
set -u
b=$(cd "${1:?usage: selective_attn_round.sh BUNDLE OUT [kvbench args]}" && pwd)
out=${2:?usage: selective_attn_round.sh BUNDLE OUT [kvbench args]}
shift 2
PATH=$PATH:/usr/local/cuda/bin # compute-sanitizer, cuobjdump, ncu
mkdir -p "$out"
PEERS_ONLY=${PEERS_ONLY:-sdpa,topk} bash "$b/gpu_round.sh" "$out" selective_attn heavy_hitters snapkv "$@"
kv="$b/bin/kvbench"
small=("selective_attn B=1 Hq=8 Hkv=2 L=1000 D=128 causal=1 w0=0 group_sum=1"
    "selective_attn B=1 Hq=4 Hkv=2 L=127 D=64 causal=0 w0=95 need_out=0 group_sum=1"
    "snapkv B=1 Hq=8 Hkv=2 L=1000 D=128 budget=256"
    "heavy_hitters B=1 Hq=8 Hkv=2 L=1000 D=128 select_per=kv"
    "selective_attn B=1 Hq=4 Hkv=2 L=300 D=128 impl=cublas group_sum=1")
if [ "${SAN:-1}" = 1 ]; then
    for tool in memcheck racecheck; do
        compute-sanitizer --tool $tool "$kv" check --cases "$b/cases" "${small[@]}" >>"$out/sanitizer.log" 2>&1
        echo "$tool exit $?: $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/sanitizer.log" | tail -n 1)"
    done
fi
{
    echo "== SASS instruction mix per kernel (cuobjdump --dump-sass)"
    for f in "$kv" "$b"/lib/libkvbench*.so; do cuobjdump --dump-sass "$f"; done 2>/dev/null | awk '
        /Function :/ { if (name) print name, hg, h, l, m, ll, sl, bar; name = $3; hg = h = l = m = ll = sl = bar = 0 }
        /HGMMA/ { hg++ } /HMMA/ { h++ } /LDSM/ { l++ } /MUFU.EX2/ { m++ } /LDL/ { ll++ } /STL/ { sl++ } /BAR.SYNC/ { bar++ }
        END { if (name) print name, hg, h, l, m, ll, sl, bar }' |
        grep -E "fwd_(wgmma_)?kernel|colsum_(wgmma_)?kernel|topk|maxpool|gather_kernel" |
        awk 'BEGIN { print "kernel HGMMA HMMA LDSM MUFU.EX2 LDL STL BAR.SYNC" } { print }'
    if [ "${NCU:-1}" = 1 ] && command -v ncu >/dev/null; then
        echo "== ncu (one launch of both passes, B=1 H=32 L=4096 D=128 causal)"
        ncu --clock-control none --profile-from-start off \
            --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
            --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
            "$kv" profile --cases "$b/cases" "selective_attn B=1 Hq=32 Hkv=32 L=4096 D=128" 2>&1 | grep -vE '^==PROF==|^\s*$'
    fi
} >"$out/kernels.txt" 2>&1
echo "kernels.txt: $(wc -l <"$out/kernels.txt") lines"
