#!/usr/bin/env bash
# Drawn on the development machine (kvbench 175b2a9, the same parser):
#   python3 tests/fuzz/gpu_sweep.py build/bin/kvbench sw19 --per-kernel 12 --seed 19 --draw-only
#   python3 tests/fuzz/gpu_sweep.py build/bin/kvbench sw20 --per-kernel 5 --seed 20 --max-cost 3 --max-host-mb 8192 --draw-only
# the sanitizers' lines: of each kernel's impl=kernel lines of seed 19 (`kvbench list --cases sweep.cases --costs`),
# the two cheapest into memcheck.cases, the third into other.cases.
# ---- the first call: the random-shape sweeps of seed 19 (12 a kernel) and seed 20 (5 a kernel, up to 3 s of
# check each) on the bundle of 175b2a9 ----
set -u
root=$PWD
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.memory --format=csv > $OUT/device.txt
tar xJf .device/head.txz -C /tmp && cd /tmp/bundle && bin/kvbench --version | tee -a $OUT/device.txt
for s in 19 20; do
  out=$OUT/sw$s; mkdir -p $out; cp $root/.device/sw$s/*.cases $out/
  timeout 240 python3 tests/gpu_sweep.py bin/kvbench $out --from $out/sweep.cases > $out/sweep.log 2>&1; echo "sweep $s rc=$?"; tail -4 $out/sweep.log
done
cd $OUT && tar czf sw.tgz sw19 sw20 && rm -rf sw19 sw20

# ---- the second call: the sanitizers ----
# call 2: seed 19's lines under compute-sanitizer on the bundle of HEAD: memcheck with leak checking over the two
# cheapest impl=kernel lines of each kernel (70), racecheck (cuBLAS's kernels left out, as profiles/sanitize.sh
# does), synccheck and initcheck over the third (35)
set -u
root=$PWD
tar xJf .device/head.txz -C /tmp && cd /tmp/bundle && bin/kvbench --version
command -v compute-sanitizer >/dev/null || PATH=$PATH:/usr/local/cuda/bin
out=$OUT/sw19s; mkdir -p $out; cp $root/.device/sw19/memcheck.cases $root/.device/sw19/other.cases $out/
for tool in memcheck racecheck synccheck initcheck; do
  extra=(); cases=other.cases; lim=100
  [ $tool = memcheck ] && extra=(--leak-check full) && cases=memcheck.cases && lim=230
  [ $tool = racecheck ] && extra=(--kernel-name-exclude kns=_cublas)
  timeout $lim compute-sanitizer --tool $tool "${extra[@]}" --error-exitcode 99 bin/kvbench check --cases $out/$cases > $out/$tool.log 2>&1
  echo "$tool rc=$? $(grep -hE '^[0-9]+ passed' $out/$tool.log | tail -1) $(grep -h 'SUMMARY' $out/$tool.log | tail -2 | tr '\n' ' ')"
done
cd $OUT && gzip sw19s/*.log && tar czf sw19s.tgz sw19s && rm -rf sw19s

# ---- the third call: racecheck's filters at the block_linear line (narrowed/rc1-3: kns=_cublas; kns=nvjet; both) ----
tar xJf .device/head.txz -C /tmp && cd /tmp/bundle && bin/kvbench --version
command -v compute-sanitizer >/dev/null || PATH=$PATH:/usr/local/cuda/bin
line="block_linear B=1 in=4096 out=8 accumulate=0 seed=11 impl=kernel"
mkdir -p $OUT/rc
i=0
for ex in "kns=_cublas" "kns=nvjet" "kns=_cublas kns=nvjet"; do
  i=$((i+1)); args=(); for e in $ex; do args+=(--kernel-name-exclude $e); done
  timeout 100 compute-sanitizer --tool racecheck "${args[@]}" --error-exitcode 99 bin/kvbench check "$line" > $OUT/rc/rc$i.log 2>&1
  echo "racecheck [$ex] rc=$? $(grep -hE '^[0-9]+ passed' $OUT/rc/rc$i.log | tail -1) $(grep -h 'SUMMARY\|Error:' $OUT/rc/rc$i.log | head -3 | tr '\n' ' ')"
done
