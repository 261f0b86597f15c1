#!/usr/bin/env bash
# (run from a directory holding .device/main.txz, the whole bundle of main 95af6b6, and .device/v2.txz, the bundle-variant of
# 563e835 with the native quantizer change: `bash run.sh v2 int2_quantize_native int2_append`) A = main, B = both quantizer changes.
# A: main (whole bundle), B: variant; check of B over int2 quantize cases, then A/B bench of int2_quantize
set -u
mkdir -p /tmp/a /tmp/b && tar xJf .device/main.txz -C /tmp/a && tar xJf .device/$1.txz -C /tmp/b
cd /tmp/a/bundle
export KVB_CASES=$PWD/cases
AB_CHECK=1 AB_REPEATS=2 bash ab_round.sh $OUT/ab /tmp/b/bundle-variant int2_quantize "${@:2}"
grep -h "int2_quantize" $OUT/ab/compare_*.txt | cut -c1-200
python3 - $OUT/ab <<'PY'
import json,sys,glob
for f in sorted(glob.glob(sys.argv[1]+'/[ab]_*.json')):
    d=json.load(open(f))
    print(f.split('/')[-1], ' '.join('%.1f'%b['real_time'] for b in d['benchmarks'] if b.get('run_type')=='iteration'))
PY
cd $OUT && tar czf ab.tgz ab && rm -rf ab
