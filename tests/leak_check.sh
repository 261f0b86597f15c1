#!/usr/bin/env bash
# leak_check.sh KVBENCH [TIER...]: LeakSanitizer over `kvbench check` on the CPU path (references only, no
# device), one process per case so that a leak names its case. KVBENCH is an AddressSanitizer build
# (make leak-check builds one in build/san). Tiers: smoke and sanitize unless given. A case passes when
# its process exits 0, 1 (a failed case is still a clean exit) or 3 (the references ran, nothing was
# measured: no device) with no sanitizer report. Ends with
# "leak: N passed, N failed"; exits non-zero on a failure.
set -u
kvbench=${1:?usage: leak_check.sh KVBENCH [TIER...]}
shift
tiers=("$@")
[ ${#tiers[@]} -gt 0 ] || tiers=(smoke sanitize)
cases=${KVB_CASES:-cases}
# allocator_may_return_null: a failed allocation returns NULL, as glibc's does (the case then fails by
# name) instead of ASan aborting the process
export ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=1:abort_on_error=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export LSAN_OPTIONS="${LSAN_OPTIONS:-}"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
passed=0 failed=0
for tier in "${tiers[@]}"; do
    while IFS= read -r id; do
        [ -n "$id" ] || continue
        "$kvbench" check --cases "$cases" "$id" >"$log" 2>&1
        rc=$?
        if { [ "$rc" -le 1 ] || [ "$rc" -eq 3 ]; } && ! grep -qE 'ERROR: (AddressSanitizer|LeakSanitizer)' "$log"; then
            passed=$((passed + 1))
        else
            failed=$((failed + 1))
            echo "leak: FAIL (exit $rc) $id"
            grep -E 'ERROR: |SUMMARY: |^    #[0-9] ' "$log" | head -n 20
        fi
    done < <("$kvbench" list --cases "$cases" --tier "$tier" | sed 's/^[a-z]*  //')
done
echo "leak: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
