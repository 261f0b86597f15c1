#!/usr/bin/env bash
# A = main 0d048c6 kernels (.device/new.txz); B = v14 (hybrid-l2-prefetch: hybrid pass 1 on narrow tiles prefetches
# its first tile's rows into L2 while the channels are counted): B's check --determinism over hybrid_score,
# rocketkv_decode and RocketKV's steps, A B A B over RocketKV's bench shapes, the four sanitizers on B over
# hybrid_score's and rocketkv_decode's sanitize cases.
set -u
root=$PWD
mkdir -p /tmp/a /tmp/b && tar xJf .device/new.txz -C /tmp/a && tar xJf .device/v14.txz -C /tmp/b
rm -rf /tmp/bb && cp -r /tmp/a/bundle /tmp/bb && cp -r --remove-destination /tmp/b/bundle-variant/. /tmp/bb/
cd /tmp/bb && bin/kvbench --version
bin/kvbench check --determinism hybrid_score rocketkv_decode "method=rocketkv" --json $OUT/b_check.json > $OUT/b_check.log 2>&1; echo "check B: rc=$? $(grep -E '^[0-9]+ passed' $OUT/b_check.log | tail -1)"
grep -E "^(FAIL|ERROR)" $OUT/b_check.log | head -5
cd /tmp/a/bundle
KVB_CASES=$root/.device/ab12cases AB_REPEATS=2 bash ab_round.sh $OUT/ab /tmp/b/bundle-variant
cat $OUT/ab/compare_*.txt | cut -c1-150
cd /tmp/bb && SANITIZE_PARALLEL=1 SANITIZE_TIMEOUT=240 bash sanitize.sh $OUT/san hybrid_score rocketkv_decode > $OUT/san.log 2>&1; echo "sanitize rc=$?"; tail -4 $OUT/san.log
cd $OUT && rm -rf ab/b_bundle && tar czf ab.tgz ab san san.log b_check.json b_check.log && rm -rf ab san san.log b_check.json b_check.log
