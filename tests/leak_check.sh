#!/usr/bin/env bash
# leak_check.sh KVBENCH [TIER...]: LeakSanitizer over `kvbench check` on the CPU path (references only, no
# device), one process per case so that a leak names its case. KVBENCH is an AddressSanitizer build
# (make leak-check builds one in build/san). Tiers: smoke and sanitize unless given. A case passes when
# its process exits 0, 1 (a failed case is still a clean exit) or 3 (the references ran, nothing was
# measured: no device) with no sanitizer report. KVB_TEST_JOBS processes at a time (default: the number
# of processors); the verdicts are printed in case order whatever the order they finish in. Ends with
# "leak: N passed, N failed"; exits non-zero on a failure.
set -u
kvbench=${1:?usage: leak_check.sh KVBENCH [TIER...]}
shift
tiers=("$@")
[ ${#tiers[@]} -gt 0 ] || tiers=(smoke sanitize)
cases=${KVB_CASES:-cases}
jobs=${KVB_TEST_JOBS:-$(nproc 2>/dev/null || echo 1)}
# allocator_may_return_null: a failed allocation returns NULL, as glibc's does (the case then fails by
# name) instead of ASan aborting the process
export ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=1:abort_on_error=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export LSAN_OPTIONS="${LSAN_OPTIONS:-}"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

ids=()
for tier in "${tiers[@]}"; do
    while IFS= read -r id; do
        [ -n "$id" ] && ids+=("$id")
    done < <("$kvbench" list --cases "$cases" --tier "$tier" | sed 's/^[a-z]*  //')
done

# case i: its output in $dir/i.log, its exit status in $dir/i.rc
run_case() {
    "$kvbench" check --cases "$cases" "${ids[$1]}" >"$dir/$1.log" 2>&1
    echo $? >"$dir/$1.rc"
}
running=0
for i in "${!ids[@]}"; do
    if [ "$running" -ge "$jobs" ]; then
        wait -n
        running=$((running - 1))
    fi
    run_case "$i" &
    running=$((running + 1))
done
wait

passed=0 failed=0
for i in "${!ids[@]}"; do
    rc=$(cat "$dir/$i.rc" 2>/dev/null || echo none)
    if { [ "$rc" = 0 ] || [ "$rc" = 1 ] || [ "$rc" = 3 ]; } &&
        ! grep -qE 'ERROR: (AddressSanitizer|LeakSanitizer)' "$dir/$i.log"; then
        passed=$((passed + 1))
    else
        failed=$((failed + 1))
        echo "leak: FAIL (exit $rc) ${ids[$i]}"
        grep -E 'ERROR: |SUMMARY: |^    #[0-9] ' "$dir/$i.log" | head -n 20
    fi
done
echo "leak: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
