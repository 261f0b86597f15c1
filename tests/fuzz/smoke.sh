#!/usr/bin/env bash
# The CI's fuzz run: each target from its seeds in tests/fuzz/corpus/<target>/, a bounded run with a
# fixed seed (new inputs go to a scratch directory, never the repo). Bounded by a count, not a time: every
# seed, then mutated inputs up to 100000 executions in all, so that a loaded or slow machine runs as many
# inputs as a fast one (it takes longer instead; -timeout still ends a hung input). The targets run
# KVB_TEST_JOBS at a time (default: the number of processors). One verdict a target, in the order given;
# ends with "fuzz: N passed, N failed". Usage: smoke.sh FUZZ_DIR "LIBFUZZER ARGS" TARGET...
set -u
dir=$1 args=$2
shift 2
jobs=${KVB_TEST_JOBS:-$(nproc 2>/dev/null || echo 1)}

run_target() { # its log in $dir/TARGET.smoke.log, its exit status in $dir/TARGET.smoke.rc
    local t=$1 scratch
    scratch=$(mktemp -d)
    # shellcheck disable=SC2086 # args is a list of options
    "$dir/$t" $args -seed=1 -runs=100000 -print_final_stats=1 \
        -artifact_prefix="$dir/$t.smoke-" "$scratch" "tests/fuzz/corpus/$t" >"$dir/$t.smoke.log" 2>&1
    echo $? >"$dir/$t.smoke.rc"
    rm -rf "$scratch"
}
running=0
for t in "$@"; do
    rm -f "$dir/$t.smoke.rc"
    if [ "$running" -ge "$jobs" ]; then
        wait -n
        running=$((running - 1))
    fi
    run_target "$t" &
    running=$((running + 1))
done
wait

passed=0 failed=0
for t in "$@"; do
    log="$dir/$t.smoke.log"
    rc=$(cat "$dir/$t.smoke.rc" 2>/dev/null || echo none)
    stats=$(grep -oE '^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb): *[0-9]+' "$log" |
        sed -E 's/^stat::([a-z_]+): */\1=/' | paste -sd " ")
    if [ "$rc" = 0 ] && grep -q '^Done ' "$log"; then
        passed=$((passed + 1))
        echo "[       OK ] fuzz: $t ($stats)"
    else
        failed=$((failed + 1))
        echo "[  FAILED  ] fuzz: $t (exit $rc; log $log)"
        grep -E '^(==[0-9]+==|SUMMARY|artifact_prefix|fuzz_)|runtime error' "$log" | head -n 20 | sed 's/^/    /'
    fi
done
echo "fuzz: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
