#!/usr/bin/env bash
# call 4: the bundle's trace.sh (CUPTI timeline) over ShadowKV's three goal steps; sanitize.sh (both racecheck
# filters) over block_linear's sanitize cases
set -u
root=$PWD
tar xJf .device/head2.txz -C /tmp && cd /tmp/bundle && bin/kvbench --version
mkdir -p $OUT/tr
i=0
for c in "decode_step method=shadowkv model=llama3-8b B=48 ctx=61440 budget=1024" "decode_step method=shadowkv model=llama3-8b B=24 ctx=124928 budget=2048" "decode_step method=shadowkv model=llama3-8b B=12 ctx=249856 budget=4096"; do
  i=$((i+1))
  TRACE_MATCH="gather_misses landmark_logits decode_attn" timeout 150 bash trace.sh "$c" $OUT/tr/t$i.csv > $OUT/tr/t$i.txt 2>&1; echo "trace $i rc=$?"; tail -9 $OUT/tr/t$i.txt | cut -c1-220
done
command -v compute-sanitizer >/dev/null || PATH=$PATH:/usr/local/cuda/bin
SANITIZE_TIMEOUT=200 bash sanitize.sh $OUT/san block_linear > $OUT/san.log 2>&1; echo "sanitize rc=$?"; tail -5 $OUT/san.log
grep -h "kernel-name-exclude\|RACECHECK SUMMARY" $OUT/san/sanitize_racecheck.log | head -3
cd $OUT && gzip tr/*.csv && tar czf c4.tgz tr san san.log && rm -rf tr san san.log
