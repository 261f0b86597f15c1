#!/usr/bin/env bash
# trace.sh "CASE-ID" [OUT.csv]: the timeline of exactly one launch of one case where Nsight Systems is
# missing (the lent GPU machines have none): `kvbench profile` with the CUPTI tracer kernel_trace.so
# loaded by the CUDA driver (profiles/kernel_trace.c; built by make where the toolkit has CUPTI), then
# kernel_trace.py's table of every kernel, copy and memset between cudaProfilerStart and Stop: start,
# end and duration in us, stream, blocks, name; per stream its busy time and idle gaps. Works from the
# repository (build/) and from a bundle (trace.sh at its top). KVBENCH and KERNEL_TRACE_LIB override the
# paths; TRACE_MATCH="a b" sums the activities whose names hold each substring.
set -eu
id=${1:?usage: trace.sh "CASE-ID" [OUT.csv]}
out=${2:-kernel_trace.csv}
here=$(cd "$(dirname "$0")" && pwd)
if [ -x "$here/bin/kvbench" ]; then top=$here; else top=$here/../build; fi
kvbench=${KVBENCH:-$top/bin/kvbench}
lib=${KERNEL_TRACE_LIB:-$(dirname "$kvbench")/../lib/kernel_trace.so}
[ -f "$lib" ] || { echo "trace.sh: no $lib (make builds it where the CUDA toolkit has CUPTI)" >&2; exit 2; }
CUDA_INJECTION64_PATH=$(readlink -f "$lib") KERNEL_TRACE_OUT=$out "$kvbench" profile "$id"
match=()
for m in ${TRACE_MATCH:-}; do match+=(--match "$m"); done
python3 "$here/kernel_trace.py" "$out" "${match[@]}"
