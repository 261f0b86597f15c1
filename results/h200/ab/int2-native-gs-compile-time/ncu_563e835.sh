#!/usr/bin/env bash
# ncu (full set) of int2_quantize gs=16 / gs=128 and int2_quantize_native gs=16 on the variant $1 laid over main's bundle
set -u
mkdir -p /tmp/a /tmp/b && tar xJf .device/main.txz -C /tmp/a && tar xJf .device/$1.txz -C /tmp/b
cp -r --remove-destination /tmp/b/bundle-variant/. /tmp/a/bundle/
cd /tmp/a/bundle && bin/kvbench --version
export KVB_CASES=$PWD/cases
i=0
for id in "int2_quantize B=8 Hkv=8 D=128 gs=16 T=32768 dist=normal seed=1" "int2_quantize B=8 Hkv=8 D=128 gs=128 T=32768 dist=normal seed=1" "int2_quantize_native B=8 Hkv=8 D=128 gs=16 T=32768 dist=normal seed=1"; do
  i=$((i+1))
  ncu --clock-control none --profile-from-start off --set full --import-source yes -o $OUT/r$i -f bin/kvbench profile "$id" > $OUT/ncu$i.log 2>&1
  echo "ncu $i rc=$?"
  ncu -i $OUT/r$i.ncu-rep --page details --csv > $OUT/d$i.csv 2>/dev/null
  ncu -i $OUT/r$i.ncu-rep --page raw --csv --metrics smsp__inst_executed_pipe_alu.sum,smsp__inst_executed_pipe_fma.sum,smsp__inst_executed_pipe_fp16.sum,smsp__inst_executed_pipe_xu.sum,smsp__inst_executed_pipe_lsu.sum,smsp__inst_executed_pipe_adu.sum,smsp__inst_executed_pipe_cbu.sum,smsp__inst_executed_pipe_uniform.sum,sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active,sm__pipe_shared_cycles_active.avg.pct_of_peak_sustained_active,smsp__average_warp_latency_issue_stalled_long_scoreboard.ratio > $OUT/p$i.csv 2>&1
done
cd $OUT && tar czf ncu.tgz *.log *.csv && rm -f *.log *.csv && ls -la
