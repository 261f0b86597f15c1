#!/usr/bin/env bash
# the removed-energy condition of shadowkv_lowrank's check on the GPU: smoke and check tiers of
# shadowkv_lowrank and shadowkv_prefill, the GPU test of the family; results straight into $OUT
set -u
export PATH=$PATH:/usr/local/cuda/bin
W=/tmp/lrc; rm -rf $W; mkdir -p $W && tar xJf .device/main.txz -C $W
cd $W/bundle
kv=bin/kvbench; $kv --version; nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
for t in smoke check; do
  timeout 240 $kv check --tier $t --cases cases shadowkv_lowrank shadowkv_prefill --json $OUT/check_$t.json > $OUT/check_$t.log 2>&1
  echo "check $t: $?"; tail -1 $OUT/check_$t.log; grep -E "^FAIL" $OUT/check_$t.log | head
done
timeout 120 bin/test_gpu_shadowkv > $OUT/test_gpu_shadowkv.log 2>&1; echo "test_gpu_shadowkv: $?"; tail -3 $OUT/test_gpu_shadowkv.log
