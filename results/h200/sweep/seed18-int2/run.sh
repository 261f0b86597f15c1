#!/usr/bin/env bash
# the INT2 quantizers' random shapes (seed 18) on main: the drawn lines checked (gpu_sweep.py --from), then 12 of
# them (the 3 cheapest of each kernel) under compute-sanitizer's four tools
# ---- the first call (its sanitizer passes selected no case: no --tier sanitize) ----
set -u
tar xJf .device/new.txz -C /tmp && cd /tmp/bundle && bin/kvbench --version
out=$OUT/sw18; mkdir -p $out; cp $OLDPWD/.device/sw18/*.cases $out/
python3 tests/gpu_sweep.py bin/kvbench $out --from $out/sweep.cases > $out/sweep.log 2>&1; echo "sweep rc=$?"; tail -6 $out/sweep.log
command -v compute-sanitizer >/dev/null || PATH=$PATH:/usr/local/cuda/bin
for tool in memcheck racecheck initcheck synccheck; do
  extra=""; [ $tool = memcheck ] && extra="--leak-check full"
  compute-sanitizer --tool $tool $extra --error-exitcode 99 bin/kvbench check --cases $out/sanitize.cases > $out/$tool.log 2>&1; echo "$tool rc=$? $(grep -h 'passed,' $out/$tool.log | tail -1) $(grep -h 'SUMMARY' $out/$tool.log | tail -2 | tr '\n' ' ')"
done
cd $OUT && tar czf sw18.tgz sw18 && rm -rf sw18

# ---- the second call (the sanitizers with --tier sanitize) ----
# 12 of the seed-18 lines (the 3 cheapest of each INT2 quantizer kernel) under compute-sanitizer's four tools
set -u
tar xJf .device/new.txz -C /tmp && cd /tmp/bundle && bin/kvbench --version
out=$OUT/sw18s; mkdir -p $out; cp $OLDPWD/.device/sw18/sanitize.cases $out/
command -v compute-sanitizer >/dev/null || PATH=$PATH:/usr/local/cuda/bin
for tool in memcheck racecheck initcheck synccheck; do
  extra=""; [ $tool = memcheck ] && extra="--leak-check full"
  compute-sanitizer --tool $tool $extra --error-exitcode 99 bin/kvbench check --tier sanitize --cases $out/sanitize.cases > $out/$tool.log 2>&1; echo "$tool rc=$? $(grep -h 'passed,' $out/$tool.log | tail -1) $(grep -h 'SUMMARY' $out/$tool.log | tail -2 | tr '\n' ' ')"
done
cd $OUT && tar czf sw18s.tgz sw18s && rm -rf sw18s
