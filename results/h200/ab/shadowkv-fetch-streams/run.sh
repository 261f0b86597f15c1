#!/usr/bin/env bash
# A = main's bundle (kvbench 6a02b16-dirty: the kernels of 2f12cf6); B = a variant bundle of 2f12cf6-dirty (v15.txz): the
# chunks' misses fetched on two side streams in turn, so a fetch starts beside the previous one's last blocks
# (the memset of the bad-id flag still before batch_gemm_rotary; 8bbd05d moved it, ../shadowkv-fetch-streams-memset).
# B: the three-stream compose test, check --determinism over decode_step's ShadowKV cases; A B A B A B over
# ShadowKV's goal steps and dense at its largest batch; B's timeline of the 60K step.
set -u
root=$PWD
mkdir -p /tmp/a /tmp/b && tar xJf .device/head2.txz -C /tmp/a && tar xJf .device/v15.txz -C /tmp/b
rm -rf /tmp/bb && cp -r /tmp/a/bundle /tmp/bb && cp -r --remove-destination /tmp/b/bundle-variant/. /tmp/bb/
cd /tmp/bb && bin/kvbench --version
KVB_TEST_GPU_CASES=0 bin/test_gpu_step_block > $OUT/b_test.log 2>&1; echo "test_gpu_step_block rc=$?"; grep -E "three_streams|PASSED|FAILED" $OUT/b_test.log | head
bin/kvbench check --determinism decode_step "method=shadowkv" --json $OUT/b_check.json > $OUT/b_check.log 2>&1; echo "check B: rc=$? $(grep -E '^[0-9]+ passed' $OUT/b_check.log | tail -1)"
grep -E "^(FAIL|ERROR)" $OUT/b_check.log | head -5
mkdir -p $OUT/tr
TRACE_MATCH="gather_misses landmark_logits decode_attn" timeout 100 bash trace.sh "decode_step method=shadowkv model=llama3-8b B=48 ctx=61440 budget=1024" $OUT/tr/b60k.csv > $OUT/tr/b60k.txt 2>&1; echo "trace rc=$?"
grep -E "gather_misses|stream" $OUT/tr/b60k.txt | head -20 | cut -c1-200; tail -6 $OUT/tr/b60k.txt | cut -c1-200
cd /tmp/a/bundle
KVB_CASES=$root/.device/ab15cases AB_REPEATS=3 bash ab_round.sh $OUT/ab /tmp/b/bundle-variant
cat $OUT/ab/compare_*.txt | cut -c1-150
cd $OUT && rm -rf ab/b_bundle && gzip tr/*.csv && tar czf ab.tgz ab tr b_check.json b_check.log b_test.log && rm -rf ab tr b_check.json b_check.log b_test.log
