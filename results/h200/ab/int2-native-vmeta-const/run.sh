#!/usr/bin/env bash
# (run from a directory holding .device/new.txz, the whole bundle of main 4fdc684, and .device/v8.txz, the
# bundle-variant of branch int2-native-vmeta-const at ce0e6a1: `bash run.sh v8`)
# A = main 4fdc684 (whole bundle .device/new.txz), B = variant $1 (branch int2-native-vmeta-const): B's check,
# the A/B bench (A B A B) of the quantizers and the append, the four sanitizers on B over the quantizers' and
# append's sanitize and smoke cases (B's case files)
set -u
mkdir -p /tmp/a /tmp/b && tar xJf .device/new.txz -C /tmp/a && tar xJf .device/$1.txz -C /tmp/b
rm -rf /tmp/bb && cp -r /tmp/a/bundle /tmp/bb && cp -r --remove-destination /tmp/b/bundle-variant/. /tmp/bb/
cd /tmp/bb && bin/kvbench --version
bin/kvbench check --determinism int2_quantize int2_quantize_native int2_append int2_native method=minikv --json $OUT/b_check.json > $OUT/b_check.log 2>&1; echo "check B: $(tail -1 $OUT/b_check.log)"
cd /tmp/a/bundle
KVB_CASES=$PWD/cases AB_REPEATS=2 bash ab_round.sh $OUT/ab /tmp/b/bundle-variant int2_quantize int2_quantize_native int2_append
grep -h "int2_" $OUT/ab/compare_*.txt | cut -c1-220
cd /tmp/bb && unset KVB_CASES && SANITIZE_PARALLEL=1 bash sanitize.sh $OUT/san int2_quantize int2_quantize_native int2_append > $OUT/san.log 2>&1; echo "sanitize rc=$?"; tail -4 $OUT/san.log
cd $OUT && rm -rf ab/b_bundle && tar czf ab.tgz ab san san.log b_check.json b_check.log && rm -rf ab san san.log b_check.json b_check.log
