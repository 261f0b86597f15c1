#!/usr/bin/env bash
# A = main d391631 (va.txz: its bin/, cases/ and libkvbench.so laid over B's bundle); B = new.txz, kvbench 5f88a19: the
# bad-id flag zeroed by a one-thread kernel instead of a memset node. B: check --determinism over ShadowKV's
# step cases and batch_gemm_rotary, its timelines at 60K and 244K; A B A B A B over ShadowKV's goal steps and dense
# at its largest batch.
set -u
root=$PWD
tar xJf .device/new.txz -C /tmp && mkdir -p /tmp/va && tar xJf .device/va.txz -C /tmp/va
rm -rf /tmp/aa && cp -r /tmp/bundle /tmp/aa && cp -r --remove-destination /tmp/va/bundle-variant/. /tmp/aa/
/tmp/aa/bin/kvbench --version; cd /tmp/bundle && bin/kvbench --version
bin/kvbench check --determinism decode_step "method=shadowkv" batch_gemm_rotary --json $OUT/b_check.json > $OUT/b_check.log 2>&1; echo "check B: rc=$? $(grep -E '^[0-9]+ passed' $OUT/b_check.log | tail -1)"
tail -2 $OUT/b_check.log
mkdir -p $OUT/tr
for c in "B=48 ctx=61440 budget=1024" "B=12 ctx=249856 budget=4096"; do
  n=$(echo $c | cut -d' ' -f1 | tr -d '=')
  TRACE_MATCH="gather_misses landmark_logits decode_attn" timeout 100 bash trace.sh "decode_step method=shadowkv model=llama3-8b $c" $OUT/tr/b_$n.csv > $OUT/tr/b_$n.txt 2>&1; echo "trace $n rc=$?"
  sed -n '/start_us/,+6p' $OUT/tr/b_$n.txt | cut -c1-110; grep window $OUT/tr/b_$n.txt
done
cd /tmp/aa
KVB_CASES=$root/.device/ab15cases AB_REPEATS=3 bash ab_round.sh $OUT/ab /tmp/bundle "method=shadowkv" "method=dense"
cat $OUT/ab/compare_*.txt | cut -c1-150
cd $OUT && gzip tr/*.csv && tar czf ab.tgz ab tr b_check.json b_check.log && rm -rf ab tr b_check.json b_check.log
