#!/usr/bin/env bash
# (run from a directory holding .device/main.txz, the whole bundle of main 95af6b6, and .device/v3.txz, the bundle-variant of
# 0399fde with the value metadata in the records order: `bash run.sh v3`. Its sanitizer pass, at the end, read main's case files
# (KVB_CASES) and no int2_quantize_native case: not a result; the canonical round's sanitizers cover these kernels)
# A = main 95af6b6 (whole bundle), B = variant $1: B's check over the INT2 quantize, append and MiniKV step
# cases, the A/B bench (A B A B) of int2_quantize_native and int2_append, then the four sanitizers on B
set -u
mkdir -p /tmp/a /tmp/b && tar xJf .device/main.txz -C /tmp/a && tar xJf .device/$1.txz -C /tmp/b
rm -rf /tmp/bb && cp -r /tmp/a/bundle /tmp/bb && cp -r --remove-destination /tmp/b/bundle-variant/. /tmp/bb/
cd /tmp/bb && bin/kvbench --version
bin/kvbench check int2_quantize int2_quantize_native int2_append int2_native method=minikv --json $OUT/b_check.json > $OUT/b_check.log 2>&1; echo "check B: $(tail -1 $OUT/b_check.log)"
cd /tmp/a/bundle
export KVB_CASES=$PWD/cases
AB_REPEATS=2 bash ab_round.sh $OUT/ab /tmp/b/bundle-variant int2_quantize_native int2_append
grep -h "int2_" $OUT/ab/compare_*.txt | cut -c1-200
cd /tmp/bb && SANITIZE_PARALLEL=1 bash sanitize.sh $OUT/san int2_quantize int2_append int2_native > $OUT/san.log 2>&1; echo "sanitize rc=$?"; tail -5 $OUT/san.log
cd $OUT && rm -rf ab/b_bundle && tar czf ab.tgz ab san san.log b_check.json b_check.log && rm -rf ab san san.log b_check.json b_check.log
