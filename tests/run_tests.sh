#!/usr/bin/env bash
# Runs every test program in BIN (default build/bin), the CLI tests, the fuzz smoke run and the host-memory checks
# under AddressSanitizer (leaks, allocation failures), and sums their results into one closing line:
# "N passed, N failed, N skipped". Exits non-zero when anything failed.
set -u
bin=${1:-build/bin}
export KVB_CASES=${KVB_CASES:-cases}
passed=0 failed=0 skipped=0

count() { # count LABEL TEXT: the number cmocka printed after "[  LABEL ]", or 0
    local n
    n=$(grep -oE "^\[  $1 *\] [0-9]+ test" <<<"$2" | grep -oE '[0-9]+' | tail -n 1)
    echo "${n:-0}"
}

for t in "$bin"/test_*; do
    [ -x "$t" ] || continue
    out=$("$t" 2>&1)
    rc=$?
    printf '%s\n' "$out"
    p=$(count PASSED "$out") f=$(count FAILED "$out") s=$(count SKIPPED "$out")
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then # crashed or failed outside a test
        echo "$(basename "$t"): exited with status $rc"
        f=1
    fi
    passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
done

out=$(bash "$(dirname "$0")/cli_test.sh" "$bin/kvbench" 2>&1)
printf '%s\n' "$out"
p=$(grep -oE '^cli: [0-9]+ passed' <<<"$out" | grep -oE '[0-9]+')
f=$(grep -oE '^cli: [0-9]+ passed, [0-9]+ failed' <<<"$out" | grep -oE '[0-9]+ failed' | grep -oE '[0-9]+')
[ -n "$p" ] || { p=0; f=1; echo "cli tests did not report"; }
passed=$((passed + p)) failed=$((failed + ${f:-1}))

# the decode_step report's joins (stdlib python3; skipped, and said so, where there is none)
if command -v python3 >/dev/null; then
    out=$(python3 "$(dirname "$0")/step_report_test.py" 2>&1)
    printf '%s\n' "$out"
    p=$(grep -oE '^step_report: [0-9]+ passed' <<<"$out" | grep -oE '[0-9]+')
    f=$(grep -oE '^step_report: [0-9]+ passed, [0-9]+ failed' <<<"$out" | grep -oE '[0-9]+ failed' | grep -oE '[0-9]+')
    [ -n "$p" ] || { p=0; f=1; echo "step_report tests did not report"; }
    passed=$((passed + p)) failed=$((failed + ${f:-1}))
else
    echo "step_report tests: no python3, 3 skipped"
    skipped=$((skipped + 3))
fi

# make plots: plot_report.py's rows and values on a committed fixture, and plots.gp where gnuplot is
# installed (its test counts as skipped, and says so, where it is not)
if command -v python3 >/dev/null; then
    out=$(python3 "$(dirname "$0")/plot_test.py" 2>&1)
    printf '%s\n' "$out"
    line=$(grep -oE '^plot: [0-9]+ passed, [0-9]+ failed, [0-9]+ skipped' <<<"$out")
    if [ -n "$line" ]; then
        read -r p f s < <(grep -oE '[0-9]+' <<<"$line" | tr '\n' ' ')
    else
        p=0 f=1 s=0
        echo "plot tests did not report"
    fi
    passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
else
    echo "plot tests: no python3, 7 skipped"
    skipped=$((skipped + 7))
fi

# the fuzz targets' smoke run (make fuzz-smoke: one verdict a target, or skipped, and said so, without
# clang's libFuzzer); a bundle has no sources to build them from
root=$(cd "$(dirname "$0")/.." && pwd)
if [ -f "$root/Makefile" ] && [ -d "$root/tests/fuzz" ]; then
    # a make of its own (run from `make test`, the parent's jobserver is not passed down to this script)
    out=$(env -u MAKEFLAGS -u MFLAGS make -j"$(nproc 2>/dev/null || echo 2)" -C "$root" --no-print-directory fuzz-smoke 2>&1)
    printf '%s\n' "$out"
    line=$(grep -E '^fuzz: ' <<<"$out" | tail -n 1)
    p=$(grep -oE '^fuzz: [0-9]+ passed' <<<"$line" | grep -oE '[0-9]+')
    f=$(grep -oE '^fuzz: [0-9]+ passed, [0-9]+ failed' <<<"$line" | grep -oE '[0-9]+ failed' | grep -oE '[0-9]+')
    s=$(grep -oE '[0-9]+ skipped$' <<<"$line" | grep -oE '[0-9]+')
    if [ -n "$p" ]; then
        passed=$((passed + p)) failed=$((failed + ${f:-1}))
    elif [ -n "$s" ]; then
        skipped=$((skipped + s))
    else
        echo "fuzz tests did not report"
        failed=$((failed + 1))
    fi
else
    echo "fuzz: no sources here (a bundle), 1 skipped"
    skipped=$((skipped + 1))
fi

# host memory under AddressSanitizer, on the CPU path (a build of its own in build/san): LeakSanitizer over
# check of the smoke and sanitize tiers, one verdict a case (make leak-check); then a bounded allocation-failure
# injection, each allocation site of the first smoke case of each kernel failed in turn, one verdict in all
# (make alloc-fault-smoke; make alloc-fault runs the whole sanitize tier). Skipped, and said so, without gcc's
# AddressSanitizer; a bundle has no sources to build them from.
if [ -f "$root/Makefile" ]; then
    out=$(env -u MAKEFLAGS -u MFLAGS make -C "$root" --no-print-directory leak-check 2>&1)
    printf '%s\n' "$out"
    line=$(grep -E '^leak: ' <<<"$out" | tail -n 1)
    if grep -qE '^leak: [0-9]+ passed, [0-9]+ failed' <<<"$line"; then
        read -r p f < <(grep -oE '[0-9]+' <<<"$line" | tr '\n' ' ')
        passed=$((passed + p)) failed=$((failed + f))
    elif grep -q '^leak: skipped' <<<"$line"; then
        skipped=$((skipped + 1))
    else
        echo "leak check did not report"
        failed=$((failed + 1))
    fi
    out=$(env -u MAKEFLAGS -u MFLAGS make -C "$root" --no-print-directory alloc-fault-smoke 2>&1)
    rc=$?
    printf '%s\n' "$out"
    line=$(grep -E '^alloc-fault: ' <<<"$out" | tail -n 1)
    if grep -q '^alloc-fault: skipped' <<<"$line"; then
        skipped=$((skipped + 1))
    elif grep -qE '^alloc-fault: [0-9]+ injections' <<<"$line" && [ "$rc" -eq 0 ]; then
        passed=$((passed + 1))
    else
        [ -n "$line" ] || echo "alloc-fault did not report"
        failed=$((failed + 1))
    fi
else
    echo "leak, alloc-fault: no sources here (a bundle), 2 skipped"
    skipped=$((skipped + 2))
fi

echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
