#!/usr/bin/env bash
# (run from a directory holding .device/new.txz, the whole bundle of main 0a023b8: `bash run.sh`)
# ncu (--set full, one launch each) of int2_decode_attn v3 at B=8 T=128K, gs=128 and gs=16, on main 0a023b8 (the kernels of HEAD);
# the details page as CSV
set -u
tar xJf .device/new.txz -C /tmp && cd /tmp/bundle && bin/kvbench --version
command -v ncu >/dev/null || PATH=$PATH:/usr/local/cuda/bin
for gs in 128 16; do
  id="int2_decode_attn B=8 Hq=32 Hkv=8 D=128 gs=$gs T=131072 R=64 dist=normal seed=1 impl=kernel"
  ncu --clock-control none --profile-from-start off --set full -o $OUT/ncu_gs$gs -f bin/kvbench profile "$id" > $OUT/ncu_gs$gs.log 2>&1; echo "gs=$gs rc=$?"
  ncu -i $OUT/ncu_gs$gs.ncu-rep --page details --csv > $OUT/ncu_gs${gs}_details.csv 2>/dev/null
  gzip -9 $OUT/ncu_gs${gs}_details.csv; rm -f $OUT/ncu_gs$gs.ncu-rep
done
ls -la $OUT
