#!/usr/bin/env bash
# sanitize.sh [OUT] [FILTER...]: compute-sanitizer over the sanitize tier (cases/sanitize.cases: every
# kernel and every impl at a small shape), one pass per tool: memcheck (with leak checking), racecheck
# (shared-memory hazards), initcheck (reads of uninitialized device memory), synccheck (barrier misuse).
# Each pass runs `kvbench check --tier sanitize` under the tool with --error-exitcode 1; a case that fails
# its own check fails the pass too. Logs: OUT/sanitize_<tool>.log (default OUT: results/local). Exit 1
# if any pass failed; the last lines name each tool's verdict. (`make sanitize` runs it.)
set -u
here=$(cd "$(dirname "$0")" && pwd)
out=${1:-results/local}
[ $# -gt 0 ] && shift
kvbench=${KVBENCH:-$here/../build/bin/kvbench}
[ -x "$kvbench" ] || kvbench=$here/bin/kvbench # from a bundle (the script beside bin/)
cases=${KVB_CASES:-$here/../cases}
[ -d "$cases" ] || cases=$here/cases
command -v compute-sanitizer >/dev/null || PATH=$PATH:/usr/local/cuda/bin
if ! command -v compute-sanitizer >/dev/null; then
    echo "sanitize: compute-sanitizer not found (the CUDA toolkit's bin/); nothing run"
    exit 2
fi
mkdir -p "$out"
rc=0 verdicts=()
for tool in memcheck racecheck initcheck synccheck; do
    extra=()
    [ "$tool" = memcheck ] && extra=(--leak-check full)
    log="$out/sanitize_$tool.log"
    compute-sanitizer --tool "$tool" "${extra[@]}" --error-exitcode 1 --print-limit 100 \
        "$kvbench" check --tier sanitize --cases "$cases" "$@" >"$log" 2>&1
    t=$?
    summary=$(grep -E 'ERROR SUMMARY|LEAK SUMMARY|RACECHECK SUMMARY' "$log" | tail -n 1)
    cases_line=$(grep -E '^[0-9]+ passed, [0-9]+ failed' "$log" | tail -n 1)
    # a pass in which no case ran on a GPU checked nothing: it fails, and says why
    if grep -qE '^0 passed' <<<"$cases_line"; then
        t=1
        cases_line="$cases_line (no case ran on a GPU)"
    fi
    verdicts+=("$tool: exit $t; ${cases_line:-no case summary}; ${summary:-no sanitizer summary}")
    [ $t -eq 0 ] || rc=1
done
printf 'sanitize %s\n' "${verdicts[@]}"
exit $rc
