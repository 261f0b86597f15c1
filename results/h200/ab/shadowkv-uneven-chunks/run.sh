#!/usr/bin/env bash
# A = main (new.txz, kvbench 5f88a19); B = a variant of 65a51d6 (branch shadowkv-uneven-chunks; "-dirty": uncommitted
# notes only): ShadowKV's batch in chunks 1:2:2:1 at B >= 4. B: check --determinism over ShadowKV's step cases,
# its timelines at 60K and 244K; A B A B A B over ShadowKV's goal steps and dense at its largest batch.
set -u
root=$PWD
tar xJf .device/new.txz -C /tmp && mkdir -p /tmp/vb && tar xJf .device/v19.txz -C /tmp/vb
rm -rf /tmp/bb && cp -r /tmp/bundle /tmp/bb && cp -r --remove-destination /tmp/vb/bundle-variant/. /tmp/bb/
cd /tmp/bb && bin/kvbench --version
bin/kvbench check --determinism decode_step "method=shadowkv" --json $OUT/b_check.json > $OUT/b_check.log 2>&1; echo "check B: rc=$? $(grep -E '^[0-9]+ passed' $OUT/b_check.log | tail -1)"
grep -E "^(FAIL|ERROR)" $OUT/b_check.log | head -5
mkdir -p $OUT/tr
for c in "B=48 ctx=61440 budget=1024" "B=12 ctx=249856 budget=4096"; do
  n=$(echo $c | cut -d' ' -f1 | tr -d '=')
  TRACE_MATCH="gather_misses landmark_logits decode_attn" timeout 80 bash trace.sh "decode_step method=shadowkv model=llama3-8b $c" $OUT/tr/b_$n.csv > $OUT/tr/b_$n.txt 2>&1; echo "trace $n rc=$?"
  grep -E "gather_misses|window|match" $OUT/tr/b_$n.txt | cut -c1-150
done
cd /tmp/bundle
KVB_CASES=$root/.device/ab15cases AB_REPEATS=3 bash ab_round.sh $OUT/ab /tmp/vb/bundle-variant "method=shadowkv" "method=dense"
cat $OUT/ab/compare_*.txt | cut -c1-150
cd $OUT && rm -rf ab/b_bundle && gzip tr/*.csv && tar czf ab.tgz ab tr b_check.json b_check.log && rm -rf ab tr b_check.json b_check.log
