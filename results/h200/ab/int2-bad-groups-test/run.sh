#!/usr/bin/env bash
# (run from a directory holding .device/new.txz, the whole bundle of the test commit's tree, kvbench 12ee312-dirty)
set -u
tar xJf .device/new.txz -C /tmp && cd /tmp/bundle && bin/kvbench --version
command -v compute-sanitizer >/dev/null || PATH=$PATH:/usr/local/cuda/bin
KVB_TEST_GPU_CASES=0 bin/test_gpu_decode > $OUT/test.log 2>&1; echo "test rc=$?"; grep -E "out_of_range|PASSED|FAILED|SKIPPED *\]" $OUT/test.log | head
KVB_TEST_GPU_CASES=0 compute-sanitizer --tool memcheck --leak-check full --error-exitcode 99 bin/test_gpu_decode > $OUT/memcheck.log 2>&1; echo "memcheck rc=$?"; grep -E "PASSED|FAILED|SUMMARY" $OUT/memcheck.log | head
for t in racecheck initcheck synccheck; do KVB_TEST_GPU_CASES=0 compute-sanitizer --tool $t --error-exitcode 99 bin/test_gpu_decode > $OUT/$t.log 2>&1; echo "$t rc=$? $(grep -E 'SUMMARY' $OUT/$t.log | tail -1)"; done
