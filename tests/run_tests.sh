#!/usr/bin/env bash
# Runs every test program in BIN (default build/bin), the CLI tests, the fuzz smoke run, the random-shape sweep
# (2 lines a kernel) and the host-memory checks
# under AddressSanitizer (leaks, allocation failures), and sums their results into one closing line:
# "N passed, N failed, N skipped". Exits non-zero when anything failed.
#
# The parts are independent and run KVB_TEST_JOBS at a time (default: the number of processors), each with
# its output captured; a part's output is printed whole, in the fixed order below, as soon as it and every
# part before it have finished. A line "tests: PART started" and "tests: PART N s (CPU N s)" marks each part's
# start and end, so that a piped run shows where it is and what each part costs; a line "cmocka: PROGRAM
# N s (CPU N s)" each test program.
set -u
bin=${1:-build/bin}
export KVB_CASES=${KVB_CASES:-cases}
here=$(dirname "$0")
root=$(cd "$here/.." && pwd)
jobs=${KVB_TEST_JOBS:-$(nproc 2>/dev/null || echo 2)}
[ "$jobs" -ge 1 ] 2>/dev/null || jobs=1
export KVB_TEST_JOBS=$jobs # the leak check runs its per-case processes as many at a time
# The parts' references are OpenMP over every core, several processes at once: libgomp's idle threads spin
# 300000 rounds at each barrier by default, time taken from the other processes' working threads. A short
# spin measured (2 cores, `bash tests/run_tests.sh` of a CPU-only build): 99-103 s by default, 86-89 s at
# 10000 (85-90 s with OMP_WAIT_POLICY=passive, which made a reference alone 48% slower; 10000 left it as it
# was). A value set by the caller stays.
[ "$jobs" -gt 1 ] && export GOMP_SPINCOUNT=${GOMP_SPINCOUNT:-10000}

count() { # count LABEL TEXT: the number cmocka printed after "[  LABEL ]", or 0
    local n
    n=$(grep -oE "^\[  $1 *\] [0-9]+ test" <<<"$2" | grep -oE '[0-9]+' | tail -n 1)
    echo "${n:-0}"
}

# Each part prints its output and, last, its counts "PASSED FAILED SKIPPED" to the file $counts.

# cpu_delta BEFORE AFTER: the user + sys seconds between two of the children's lines `times` writes
# ("0m1.5s 0m0.2s"; the builtin is run in this shell: in a command substitution it would count the
# subshell's children, none)
cpu_delta() {
    printf '%s\n%s\n' "$1" "$2" | tr -s ' ms' '   ' | awk '{ c[NR] = $1 * 60 + $2 + $3 * 60 + $4 } END { printf "%.1f", c[2] - c[1] }'
}

part_cmocka() {
    local passed=0 failed=0 skipped=0 t out rc p f s t0 c0
    for t in "$bin"/test_*; do
        [ -x "$t" ] || continue
        t0=$SECONDS
        times >"$counts.times"
        c0=$(tail -n 1 "$counts.times")
        out=$("$t" 2>&1)
        rc=$?
        printf '%s\n' "$out"
        times >"$counts.times"
        # where the part's time goes, a program at a time
        echo "cmocka: $(basename "$t") $((SECONDS - t0)) s (CPU $(cpu_delta "$c0" "$(tail -n 1 "$counts.times")") s)"
        p=$(count PASSED "$out") f=$(count FAILED "$out") s=$(count SKIPPED "$out")
        if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then # crashed or failed outside a test
            echo "$(basename "$t"): exited with status $rc"
            f=1
        fi
        passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
    done
    echo "$passed $failed $skipped" >"$counts"
}

part_cli() {
    local out p f
    out=$(bash "$here/cli_test.sh" "$bin/kvbench" 2>&1)
    printf '%s\n' "$out"
    p=$(grep -oE '^cli: [0-9]+ passed' <<<"$out" | grep -oE '[0-9]+')
    f=$(grep -oE '^cli: [0-9]+ passed, [0-9]+ failed' <<<"$out" | grep -oE '[0-9]+ failed' | grep -oE '[0-9]+')
    [ -n "$p" ] || { p=0; f=1; echo "cli tests did not report"; }
    echo "$p ${f:-1} 0" >"$counts"
}

# A python3 (stdlib) test program that ends with "NAME: N passed, N failed": its counts, or SKIP skipped,
# and said so, where there is no python3
python_part() {
    local name=$1 script=$2 skip=$3 out p f
    if command -v python3 >/dev/null; then
        out=$(python3 "$here/$script" 2>&1)
        printf '%s\n' "$out"
        p=$(grep -oE "^$name: [0-9]+ passed" <<<"$out" | grep -oE '[0-9]+')
        f=$(grep -oE "^$name: [0-9]+ passed, [0-9]+ failed" <<<"$out" | grep -oE '[0-9]+ failed' | grep -oE '[0-9]+')
        [ -n "$p" ] || { p=0; f=1; echo "$name tests did not report"; }
        echo "$p ${f:-1} 0" >"$counts"
    else
        echo "$name tests: no python3, $skip skipped"
        echo "0 0 $skip" >"$counts"
    fi
}

# the decode_step report's joins
part_step_report() { python_part step_report step_report_test.py 5; }

# the NumPy emulations of kernels' index math (hybrid and Quest scoring, INT2 v2), each a test that
# passes when every shape is within its tolerance (skipped, and said so, without a python3 with numpy:
# the one on PATH, else the system's, where python3-numpy installs it beside a PATH's own python3)
part_emulate() {
    local p=0 f=0 e py=""
    for candidate in python3 /usr/bin/python3; do
        if "$candidate" -c "import numpy" 2>/dev/null; then py=$candidate && break; fi
    done
    if [ -z "$py" ]; then
        echo "emulators: no python3 numpy, 2 skipped"
        echo "0 0 2" >"$counts"
        return
    fi
    for e in emulate_page_scoring emulate_int2_v2; do
        if "$py" "$here/$e.py" >"$counts.$e" 2>&1; then
            p=$((p + 1)) && echo "emulator $e: $(tail -n 1 "$counts.$e")"
        else
            f=$((f + 1)) && cat "$counts.$e" && echo "emulator $e: FAILED"
        fi
    done
    echo "$p $f 0" >"$counts"
}

# the round index's reading of the sanitizers' verdicts
part_round_index() { python_part round_index round_index_test.py 4; }

# make plots: plot_report.py's rows and values on a committed fixture, and plots.gp where gnuplot is
# installed (its test counts as skipped, and says so, where it is not)
part_plot() {
    local out line p f s
    if command -v python3 >/dev/null; then
        out=$(python3 "$here/plot_test.py" 2>&1)
        printf '%s\n' "$out"
        line=$(grep -oE '^plot: [0-9]+ passed, [0-9]+ failed, [0-9]+ skipped' <<<"$out")
        if [ -n "$line" ]; then
            read -r p f s < <(grep -oE '[0-9]+' <<<"$line" | tr '\n' ' ')
        else
            p=0 f=1 s=0
            echo "plot tests did not report"
        fi
        echo "$p $f $s" >"$counts"
    else
        echo "plot tests: no python3, 8 skipped"
        echo "0 0 8" >"$counts"
    fi
}

# the fuzz targets' smoke run (make fuzz-smoke: one verdict a target, or skipped, and said so, without
# clang's libFuzzer); a bundle has no sources to build them from
part_fuzz() {
    local out line p f s
    if [ -f "$root/Makefile" ] && [ -d "$root/tests/fuzz" ]; then
        # a make of its own (run from `make test`, the parent's jobserver is not passed down to this script)
        out=$(env -u MAKEFLAGS -u MFLAGS make -j"$jobs" -C "$root" --no-print-directory fuzz-smoke 2>&1)
        printf '%s\n' "$out"
        line=$(grep -E '^fuzz: ' <<<"$out" | tail -n 1)
        p=$(grep -oE '^fuzz: [0-9]+ passed' <<<"$line" | grep -oE '[0-9]+')
        f=$(grep -oE '^fuzz: [0-9]+ passed, [0-9]+ failed' <<<"$line" | grep -oE '[0-9]+ failed' | grep -oE '[0-9]+')
        s=$(grep -oE '[0-9]+ skipped$' <<<"$line" | grep -oE '[0-9]+')
        if [ -n "$p" ]; then
            echo "$p ${f:-1} 0" >"$counts"
        elif [ -n "$s" ]; then
            echo "0 0 $s" >"$counts"
        else
            echo "fuzz tests did not report"
            echo "0 1 0" >"$counts"
        fi
    else
        echo "fuzz: no sources here (a bundle), 1 skipped"
        echo "0 0 1" >"$counts"
    fi
}

# host memory under AddressSanitizer, on the CPU path (a build of its own in build/san): LeakSanitizer over
# check of the smoke and sanitize tiers, one verdict a case (make leak-check); then a bounded allocation-failure
# injection, each allocation site of the first smoke case of each kernel failed in turn, one verdict in all
# (make alloc-fault-smoke; make alloc-fault runs the whole sanitize tier). Skipped, and said so, without gcc's
# AddressSanitizer; a bundle has no sources to build them from. The allocation-failure part starts after the
# leak check: both build build/san when it is absent.
part_leak() {
    local out line p f
    out=$(env -u MAKEFLAGS -u MFLAGS make -j"$jobs" -C "$root" --no-print-directory leak-check 2>&1)
    printf '%s\n' "$out"
    line=$(grep -E '^leak: ' <<<"$out" | tail -n 1)
    if grep -qE '^leak: [0-9]+ passed, [0-9]+ failed' <<<"$line"; then
        read -r p f < <(grep -oE '[0-9]+' <<<"$line" | tr '\n' ' ')
        echo "$p $f 0" >"$counts"
    elif grep -q '^leak: skipped' <<<"$line"; then
        echo "0 0 1" >"$counts"
    else
        echo "leak check did not report"
        echo "0 1 0" >"$counts"
    fi
}

part_alloc() {
    local out line rc
    out=$(env -u MAKEFLAGS -u MFLAGS make -j"$jobs" -C "$root" --no-print-directory alloc-fault-smoke 2>&1)
    rc=$?
    printf '%s\n' "$out"
    line=$(grep -E '^alloc-fault: ' <<<"$out" | tail -n 1)
    if grep -q '^alloc-fault: skipped' <<<"$line"; then
        echo "0 0 1" >"$counts"
    elif grep -qE '^alloc-fault: [0-9]+ injections' <<<"$line" && [ "$rc" -eq 0 ]; then
        echo "1 0 0" >"$counts"
    else
        [ -n "$line" ] || echo "alloc-fault did not report"
        echo "0 1 0" >"$counts"
    fi
}

# random case lines of every kernel through check (tests/fuzz/gpu_sweep.py, 2 a kernel, seed 1, --strict: a
# refusal must name a key of its kernel): with a GPU the whole check, without one the references and their
# invariants; one verdict
part_sweep() {
    local out rc dir script=$here/fuzz/gpu_sweep.py
    [ -f "$script" ] || script=$here/gpu_sweep.py # a bundle's tests/
    if ! command -v python3 >/dev/null; then
        echo "sweep: no python3, 1 skipped"
        echo "0 0 1" >"$counts"
        return
    fi
    dir=$(mktemp -d)
    out=$(python3 "$script" "$bin/kvbench" "$dir" --per-kernel 2 --seed 1 --strict 2>&1)
    rc=$?
    rm -rf "$dir"
    printf '%s\n' "$out"
    if [ "$rc" -eq 0 ]; then echo "1 0 0"; else echo "0 1 0"; fi >"$counts"
}

part_bundle_no_sanitizer() {
    echo "leak, alloc-fault: no sources here (a bundle), 2 skipped"
    echo "0 0 2" >"$counts"
}

# The parts in the order their output is printed, their names in the progress lines, and the order they
# start in: first the CLI tests, the longest of the parts that run one process at a time, and the leak
# check, then the allocation-failure run as soon as the leak check is done, the short ones last (the leak
# check and the fuzz smoke run several processes, so they also fill in whatever processor is free).
declare -A title after pid
if [ -f "$root/Makefile" ]; then
    parts=(cmocka cli step_report round_index plot emulate fuzz sweep leak alloc)
    start_order=(cli leak sweep alloc cmocka fuzz emulate plot step_report round_index)
else
    parts=(cmocka cli step_report plot fuzz sweep bundle_no_sanitizer)
    start_order=(cli sweep cmocka fuzz plot step_report bundle_no_sanitizer)
fi
title=([cmocka]="cmocka programs" [cli]="cli tests" [step_report]="step_report tests" [round_index]="round_index tests" [plot]="plot tests"
    [emulate]="kernel emulators" [fuzz]="fuzz smoke" [sweep]="random-shape sweep" [leak]="leak check" [alloc]="alloc-fault smoke"
    [bundle_no_sanitizer]="leak, alloc-fault")
after=([alloc]=leak)

# A part runs in a process group of its own (job control), so that an interrupt ends all of it; it writes
# its name to the fifo when done, which is what the loop below waits on.
set -m
tmp=$(mktemp -d)
mkfifo "$tmp/done"
exec 4<>"$tmp/done"
stop() { # on an interrupt: kvbench finishes its case on a first signal, so what is left after a second is killed
    local n
    if [ ${#pid[@]} -gt 0 ]; then
        exec 2>/dev/null # not the shell's report of each part it ended
        for n in "${!pid[@]}"; do kill -TERM -- "-${pid[$n]}"; done
        sleep 1
        for n in "${!pid[@]}"; do kill -KILL -- "-${pid[$n]}"; done
    fi
    rm -rf "$tmp"
}
trap stop EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

cpu_of() { # cpu_of FILE: user + sys seconds from the two lines `times` writes (the shell, its children)
    tr -s ' m\n' '   ' <"$1" | tr -d 's' | awk '{ print int($1 * 60 + $2 + $3 * 60 + $4 + $5 * 60 + $6 + $7 * 60 + $8 + 0.5) }'
}

declare -A state # started, done
finished=0 running=0 next_print=0 t0=$SECONDS
launch() {
    local n=$1
    echo "tests: ${title[$n]} started"
    (
        exec 4>&- </dev/null
        SECONDS=0
        counts=$tmp/$n.counts "part_$n" >"$tmp/$n.out" 2>&1
        echo "$SECONDS" >"$tmp/$n.wall"
        times >"$tmp/$n.times"
        echo "$n" >"$tmp/done"
    ) &
    pid[$n]=$!
    state[$n]=started
    running=$((running + 1))
}
passed=0 failed=0 skipped=0
print_ready() { # the outputs of the finished parts that are next in the printed order
    local n p f s
    while [ "$next_print" -lt ${#parts[@]} ] && [ "${state[${parts[$next_print]}]:-}" = done ]; do
        n=${parts[$next_print]}
        cat "$tmp/$n.out"
        if read -r p f s <"$tmp/$n.counts" 2>/dev/null && [ -n "${s:-}" ]; then
            passed=$((passed + p)) failed=$((failed + f)) skipped=$((skipped + s))
        else
            echo "${title[$n]}: did not report"
            failed=$((failed + 1))
        fi
        next_print=$((next_print + 1))
    done
}
while [ "$finished" -lt ${#parts[@]} ]; do
    for n in "${start_order[@]}"; do # start what may start
        [ "$running" -lt "$jobs" ] || break
        [ -z "${state[$n]:-}" ] || continue
        a=${after[$n]:-}
        [ -z "$a" ] || [ "${state[$a]:-}" = done ] || continue
        launch "$n"
    done
    # a part is done; or, every few seconds, one that ended without saying so (killed): it did not report
    if ! read -r -t 5 n <&4; then
        n=
        for m in "${!pid[@]}"; do kill -0 "${pid[$m]}" 2>/dev/null || n=$m; done
    fi
    [ -n "$n" ] && [ "${state[$n]:-}" = started ] || continue
    wait "${pid[$n]}" 2>/dev/null
    unset "pid[$n]"
    state[$n]=done
    running=$((running - 1)) finished=$((finished + 1))
    if [ -s "$tmp/$n.times" ]; then
        echo "tests: ${title[$n]} $(cat "$tmp/$n.wall") s (CPU $(cpu_of "$tmp/$n.times") s)"
    else
        echo "tests: ${title[$n]} ended without finishing"
    fi
    print_ready
done
echo "tests: all parts $((SECONDS - t0)) s, $jobs at a time (KVB_TEST_JOBS)"

echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
