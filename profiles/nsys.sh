#!/usr/bin/env bash
# nsys.sh "CASE-ID" [OUT]: Nsight Systems timeline of exactly one launch of one case: capture starts
# and stops with kvbench's cudaProfilerStart/Stop around the launch; the NVTX range (domain
# "kvbench") is named by the case id. (nsys is not installed on the lent GPU machines; use it where
# it is.)
set -eu
id=${1:?usage: nsys.sh "CASE-ID" [OUT]}
out=${2:-nsys-report}
kvbench=${KVBENCH:-$(dirname "$0")/../build/bin/kvbench}
exec nsys profile --capture-range=cudaProfilerApi --capture-range-end=stop --trace=cuda,nvtx \
    -o "$out" --force-overwrite true "$kvbench" profile "$id"
