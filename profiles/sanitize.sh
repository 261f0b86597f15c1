#!/usr/bin/env bash
# sanitize.sh [FILTER...]: compute-sanitizer memcheck, then racecheck (shared-memory races), over
# the check-tier cases matching FILTER (all of them by default).
set -u
kvbench=${KVBENCH:-$(dirname "$0")/../build/bin/kvbench}
cases=${KVB_CASES:-$(dirname "$0")/../cases}
rc=0
for tool in memcheck racecheck; do
    compute-sanitizer --tool "$tool" --error-exitcode 1 "$kvbench" check --cases "$cases" "$@" || rc=1
done
exit $rc
