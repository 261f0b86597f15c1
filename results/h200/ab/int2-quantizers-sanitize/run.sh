#!/usr/bin/env bash
# (from the whole bundle of e737c0b, unpacked) the four compute-sanitizer tools over the sanitize and smoke
# cases of int2_quantize, int2_quantize_native and int2_append: every template instance the quantizer
# changes made (interchange gs 16, 32, 64, 128; native gs 16, 32, 128; D 64 and 128)
set -u
unset KVB_CASES
SANITIZE_PARALLEL=1 bash sanitize.sh $OUT/san int2_quantize int2_quantize_native int2_append > $OUT/san.log 2>&1
