#!/usr/bin/env bash
# ncu.sh "CASE-ID" [OUT] [extra ncu flags...]: Nsight Compute on exactly one launch of one case.
# kvbench profile validates the case and warms it up first, then runs one launch between
# cudaProfilerStart/Stop inside an NVTX range named by the case id (domain "kvbench"), so
# --profile-from-start off captures that launch's kernels and nothing else. Clocks are left as the
# card has them (--clock-control none): never lock or reset a shared GPU's clocks.
#   bash profiles/ncu.sh "gather_copy_d2d B=48 Hkv=8 M=256 c=8 D=128 ctx=131072 sparse_start=416 extra=64 hit=0.6 empty=0 seed=1 impl=kernel"
set -eu
id=${1:?usage: ncu.sh "CASE-ID" [OUT] [ncu flags...]}
out=${2:-ncu-report}
shift $(( $# >= 2 ? 2 : 1 ))
kvbench=${KVBENCH:-$(dirname "$0")/../build/bin/kvbench}
exec ncu --clock-control none --profile-from-start off --set full --import-source yes \
    -o "$out" -f "$@" "$kvbench" profile "$id"
