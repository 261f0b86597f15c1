#!/usr/bin/env bash
# alloc_fault.sh [--every] [--first-per-op] [--tier T] [--pending REGEX] KVBENCH: allocation-failure
# injection over `kvbench check` on the CPU path (references only, no device).
#
# What it covers: the project's own checked host allocations, every kvb_xalloc (the tensors of a case,
# kvb_run_alloc's buffers, the references' scratch, the host pool without a device); not the C library's,
# OpenMP's, LAPACK's or the CUDA runtime's own allocations (an LD_PRELOAD shim would fail those too, and
# mostly test other people's code). The hook is in the allocator itself (reference/kvb.c,
# harness/core/run.c): KVB_ALLOC_TRACE=1 lists a case's allocations with what each is for, and
# KVB_FAIL_ALLOC_AT=n fails the n-th one as if the memory were not there.
#
# Per case of the tier (default: sanitize), one traced run lists its allocations; then the case runs once
# for each site (the first allocation of each distinct "what"; --every: each allocation) with that one
# failing. Each run must end cleanly: exit 0 or 3 (the failure was absorbed, e.g. by a fallback; 3: nothing
# measured, no device) or 1 with the failure named ("out of host memory ... for <what>"); never a signal
# (134, 137, 139), a sanitizer report or a leak (with an AddressSanitizer build: make alloc-fault builds
# one). --first-per-op: only the first case of each kernel (the bounded run of tests/run_tests.sh).
# --pending REGEX: leaks of the cases whose id matches are counted apart, as pending, and fail nothing
# (code that still allocates outside the checked allocator, named where the option is passed); a crash
# fails them like any other.
# Ends with "alloc-fault: N injections over N cases, N crashes, N leaks, N unnamed[, N pending leaks]";
# non-zero on a crash, a leak or an unnamed failure.
set -u
every=0 first_per_op=0 tier=sanitize pending=
while [ $# -gt 1 ]; do
    case "$1" in
    --every) every=1 ;;
    --first-per-op) first_per_op=1 ;;
    --tier) tier=$2; shift ;;
    --pending) pending=$2; shift ;;
    *) echo "alloc_fault.sh: unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
kvbench=${1:?usage: alloc_fault.sh [--every] [--first-per-op] [--tier T] [--pending REGEX] KVBENCH}
cases=${KVB_CASES:-cases}
export ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=1:abort_on_error=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
n_cases=0 injections=0 crashes=0 leaks=0 unnamed=0 pending_leaks=0
declare -A seen_op
while IFS= read -r id; do
    [ -n "$id" ] || continue
    op=${id%% *}
    if [ "$first_per_op" = 1 ]; then
        [ -z "${seen_op[$op]:-}" ] || continue
        seen_op[$op]=1
    fi
    n_cases=$((n_cases + 1))
    # the case's allocations: "kvbench: allocation N: B bytes for WHAT"
    KVB_ALLOC_TRACE=1 "$kvbench" check --cases "$cases" "$id" >"$log" 2>&1
    if [ "$every" = 1 ]; then
        sites=$(sed -n 's/^kvbench: allocation \([0-9]*\): .*/\1/p' "$log")
    else
        sites=$(sed -n 's/^kvbench: allocation \([0-9]*\): [0-9]* bytes for \(.*\)$/\1 \2/p' "$log" |
            awk '!seen[substr($0, index($0, " ") + 1)]++ { print $1 }')
    fi
    for n in $sites; do
        KVB_FAIL_ALLOC_AT=$n "$kvbench" check --cases "$cases" "$id" >"$log" 2>&1
        rc=$?
        grep -q "KVB_FAIL_ALLOC_AT=$n: the failure was injected" "$log" || continue # not reached this time
        injections=$((injections + 1))
        if grep -q 'ERROR: LeakSanitizer' "$log" && [ -n "$pending" ] && grep -qE "$pending" <<<"$id"; then
            pending_leaks=$((pending_leaks + 1))
        elif grep -q 'ERROR: LeakSanitizer' "$log"; then
            leaks=$((leaks + 1))
            echo "alloc-fault: LEAK after allocation $n failed: $id"
            grep -E '^(Direct|Indirect) leak|^    #[0-9] ' "$log" | head -n 12
        elif [ "$rc" -gt 3 ] || grep -q 'ERROR: AddressSanitizer' "$log"; then
            crashes=$((crashes + 1))
            echo "alloc-fault: CRASH (exit $rc) after allocation $n failed: $id"
            grep -E 'ERROR: |SUMMARY: |^    #[0-9] ' "$log" | head -n 12
        elif [ "$rc" -ne 0 ] && [ "$rc" -ne 3 ] && ! grep -q 'out of host memory' "$log"; then
            unnamed=$((unnamed + 1))
            echo "alloc-fault: UNNAMED (exit $rc) after allocation $n failed: $id"
            grep -E '^FAIL|^      ' "$log" | head -n 4
        fi
    done
done < <("$kvbench" list --cases "$cases" --tier "$tier" | sed 's/^[a-z]*  //')
echo "alloc-fault: $injections injections over $n_cases cases, $crashes crashes, $leaks leaks, $unnamed unnamed${pending:+, $pending_leaks pending leaks ($pending)}"
[ "$crashes" -eq 0 ] && [ "$leaks" -eq 0 ] && [ "$unnamed" -eq 0 ] && [ "$injections" -gt 0 ]
