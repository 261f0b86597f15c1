#!/usr/bin/env bash
# A = main's bundle (kvbench 6a02b16-dirty: the kernels of 2f12cf6); C = a variant bundle of 2f12cf6-dirty (v16.txz,
# the code of 8bbd05d): the fetches on two side streams in turn, and the bad-flag memset at the step's start
# instead of before batch_gemm_rotary. The ab_round's "b" files are C. C: check --determinism over
# ShadowKV's step cases, its timelines at 60K and 244K; A C A C over ShadowKV's goal steps and dense at its
# largest batch.
set -u
root=$PWD
mkdir -p /tmp/a /tmp/b /tmp/c && tar xJf .device/head2.txz -C /tmp/a && tar xJf .device/v16.txz -C /tmp/c
rm -rf /tmp/cc && cp -r /tmp/a/bundle /tmp/cc && cp -r --remove-destination /tmp/c/bundle-variant/. /tmp/cc/
cd /tmp/cc && bin/kvbench --version
bin/kvbench check --determinism decode_step "method=shadowkv" --json $OUT/c_check.json > $OUT/c_check.log 2>&1; echo "check C: rc=$? $(grep -E '^[0-9]+ passed' $OUT/c_check.log | tail -1)"
grep -E "^(FAIL|ERROR)" $OUT/c_check.log | head -5
mkdir -p $OUT/tr
for c in "B=48 ctx=61440 budget=1024" "B=12 ctx=249856 budget=4096"; do
  n=$(echo $c | cut -d' ' -f1 | tr -d '=')
  TRACE_MATCH="gather_misses landmark_logits decode_attn" timeout 100 bash trace.sh "decode_step method=shadowkv model=llama3-8b $c" $OUT/tr/c_$n.csv > $OUT/tr/c_$n.txt 2>&1; echo "trace $n rc=$?"
  grep -E "memset|bgr_ker|kv_append|decode_attn|gather_misses" $OUT/tr/c_$n.txt | cut -c1-110; tail -4 $OUT/tr/c_$n.txt | cut -c1-200
done
cd /tmp/a/bundle
KVB_CASES=$root/.device/ab15cases AB_REPEATS=3 bash ab_round.sh $OUT/ac /tmp/c/bundle-variant "method=shadowkv" "method=dense"
cat $OUT/ac/compare_*.txt | cut -c1-150
cd $OUT && rm -rf ac/b_bundle && gzip tr/*.csv && tar czf ac.tgz ac tr c_check.json c_check.log && rm -rf ac tr c_check.json c_check.log
