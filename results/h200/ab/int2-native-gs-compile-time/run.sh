#!/usr/bin/env bash
# This A/B ran results/h200/ab/int2-quantize-gs-compile-time/run.sh unchanged, from a directory holding
# .device/main.txz (the whole bundle of main 95af6b6) and .device/v2.txz (the bundle-variant of 563e835 with
# the native quantizer change), as `bash run.sh v2 int2_quantize_native int2_append`:
# A = main, B = both quantizer changes, B checked first over the same filters.
exec bash "$(dirname "$0")/../int2-quantize-gs-compile-time/run.sh" "$@"
