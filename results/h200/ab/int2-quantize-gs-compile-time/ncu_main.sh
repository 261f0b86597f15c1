#!/usr/bin/env bash
# (main 95af6b6, its whole bundle as .device/new.txz) the ncu details of the two kernels, exported as ncu_main_gs*.csv
# ncu of int2_quantize's two kernels at gs=16 and gs=128 (B=8 T=32K), plus a bench of both cases
set -u
mkdir -p /tmp/k && tar xJf .device/new.txz -C /tmp/k
cd /tmp/k/bundle
export KVB_CASES=$PWD/cases
for gs in 16 128; do
  id="int2_quantize B=8 Hkv=8 D=128 gs=$gs T=32768 dist=normal seed=1"
  ncu --clock-control none --profile-from-start off --set full -o $OUT/q$gs -f bin/kvbench profile "$id" > $OUT/ncu$gs.log 2>&1
  echo "ncu gs=$gs rc=$?"
  ncu -i $OUT/q$gs.ncu-rep --page details --csv > $OUT/q$gs.csv 2>/dev/null
done
bin/kvbench bench int2_quantize --json $OUT/bench.json > $OUT/bench.log 2>&1; tail -1 $OUT/bench.log
cd $OUT && tar czf ncu.tgz *.log *.csv && rm -f *.log *.csv
ls -la $OUT
