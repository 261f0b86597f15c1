#!/usr/bin/env bash
# (run from a bundle with the older library beside it as .device/old/libkvbench.so.xz) A/B of the INT2 reference quantizer's threads: the new library (A) against 9c3ff37's (B), ABAB, one call;
# the check of four cases whose set-up quantizes (their reference phase in the JSON's wall_s)
set -u
mkdir -p /tmp/k && tar xJf .device/new.txz -C /tmp/k
xz -dc .device/old/libkvbench.so.xz > /tmp/old.so
cd /tmp/k/bundle
cp lib/libkvbench.so /tmp/new.so
C=("int2_decode_attn B=8 Hq=32 Hkv=8 D=128 gs=16 T=131072 R=64 dist=normal seed=1 impl=v2"
   "int2_decode_attn B=8 Hq=32 Hkv=8 D=128 gs=128 T=131072 R=64 dist=normal seed=1 impl=v2"
   "int2_decode_attn B=1 Hq=32 Hkv=8 D=128 gs=16 T=131072 R=64 dist=normal seed=1 impl=v2"
   "int2_quantize B=8 Hkv=8 D=128 gs=16 T=32768 dist=normal seed=1")
for i in 1 2; do
  cp /tmp/new.so lib/libkvbench.so; bin/kvbench check "${C[@]}" --json $OUT/A$i.json > $OUT/A$i.log 2>&1; tail -1 $OUT/A$i.log
  cp /tmp/old.so lib/libkvbench.so; bin/kvbench check "${C[@]}" --json $OUT/B$i.json > $OUT/B$i.log 2>&1; tail -1 $OUT/B$i.log
done
python3 - $OUT <<'PY'
import json, sys
o = sys.argv[1]
for run in ("A1", "B1", "A2", "B2"):
    d = json.load(open(f"{o}/{run}.json"))
    print(run, " | ".join("%s %.2f" % (c["id"].split(" impl")[0][-40:], c["wall_s"]["reference"]) for c in d["cases"]))
PY
cd $OUT && tar czf logs.tgz *.log && rm -f *.log
