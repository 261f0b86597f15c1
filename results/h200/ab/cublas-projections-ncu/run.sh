#!/usr/bin/env bash
# cuBLAS's projections at B=1 on this machine: bench of the four (A = main 0d048c6), then ncu of qkv and
# gate_up (kernel names, grid, time, DRAM) as results/h200/ab/block-linear-main/ncu did
set -u
mkdir -p /tmp/a && tar xJf .device/new.txz -C /tmp/a && cd /tmp/a/bundle
nvidia-smi --query-gpu=name,pci.bus_id,serial,clocks.sm,clocks.max.sm,power.limit --format=csv > $OUT/device.txt 2>&1
cat $OUT/device.txt
for r in 1 2; do bin/kvbench bench "block_linear B=1 " --json $OUT/bench_$r.json > $OUT/bench_$r.log 2>&1; grep -E "^\| .block_linear" $OUT/bench_$r.log | cut -c1-120; done
NCU=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
for o in "out=6144 accumulate=0" "out=28672 accumulate=0"; do
  $NCU --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__grid_size,launch__block_size bin/kvbench check "block_linear B=1 in=4096 $o" > "$OUT/ncu_${o%% *}.txt" 2>&1
  grep -E "nvjet|sm90|gemm|Kernel|gpu__time|grid_size|dram__throughput" "$OUT/ncu_${o%% *}.txt" | head -12
done
