#!/usr/bin/env bash
# racecheck after the round's racecheck pass stopped at an internal sanitizer error in landmark_score's
# cublas_composed impl: that case under each racecheck filter, then the remaining sanitize cases of
# decode_step method=shadowkv, batch_gemm_rotary, rocketkv_decode and block_linear under the default filter
set -u
tar xJf .device/new.txz -C /tmp && cd /tmp/bundle
command -v compute-sanitizer >/dev/null || PATH=$PATH:/usr/local/cuda/bin
c="landmark_score B=3 Hq=4 Hkv=4 D=128 Lm=1000 M=1 outliers=48 dist=normal seed=7 impl=cublas_composed"
mkdir -p $OUT/rc
for f in "kns=_cublas" "kns=nvjet" "kns=_cublas kns=nvjet" ""; do
  ex=(); for o in $f; do ex+=(--kernel-name-exclude "$o"); done
  timeout 40 compute-sanitizer --tool racecheck --error-exitcode 1 "${ex[@]}" bin/kvbench check "$c" > $OUT/rc/one_${f// /+}.log 2>&1
  echo "filter '$f': rc=$? $(grep -E 'RACECHECK SUMMARY|Internal|^(PASS|FAIL)' $OUT/rc/one_${f// /+}.log | tr '\n' ' ' | cut -c1-200)"
done
SANITIZE_TOOLS=racecheck SANITIZE_TIMEOUT=90 timeout 100 bash sanitize.sh $OUT/rc/rest "decode_step method=shadowkv" batch_gemm_rotary rocketkv_decode > $OUT/rc/rest.log 2>&1; echo "rest rc=$?"; tail -3 $OUT/rc/rest.log
cd $OUT && tar czf rc.tgz rc && rm -rf rc
