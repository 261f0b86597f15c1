#!/usr/bin/env bash
# the block's four projections alone (block_linear's bench tier, B = 1, 8, 16, 48) on the canonical
# round's build; results straight into $OUT
set -u
export PATH=$PATH:/usr/local/cuda/bin
B=/tmp/bl; rm -rf $B; mkdir -p $B && tar xJf .device/main.txz -C $B bundle && cd $B/bundle
bin/kvbench --version; nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader > $OUT/device.txt; bin/kvbench --version >> $OUT/device.txt
timeout 200 bin/kvbench bench --cases cases block_linear --json $OUT/bench.json --summary $OUT/summary.md > $OUT/bench.log 2>&1
echo "bench: $?"; tail -3 $OUT/bench.log
