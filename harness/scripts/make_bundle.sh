#!/usr/bin/env bash
# make_bundle.sh OUT BINARY...: a relocatable folder for a GPU machine without Debian packages:
#   OUT/bin   the binaries (rpath $ORIGIN/../lib, then /usr/local/cuda/lib64 for cuBLAS)
#   OUT/lib   every non-system shared library they load (benchmark, cmocka, gomp, stdc++, lapacke and
#             the BLAS/LAPACK under it: libblas, liblapack, libopenblas, libgfortran, libquadmath, ...),
#             each with rpath $ORIGIN (patchelf) so that their own dependencies load from OUT/lib too
#   OUT/cases, OUT/tests (the test runner scripts), OUT/gpu_round.sh, OUT/main_job.sh (`make run`'s job:
#             bash OUT/main_job.sh OUT/bin/kvbench RESULTS), OUT/detached.sh (a round longer than one
#             command's time limit), OUT/*.py (optional peers), OUT/trace.sh (a case's CUPTI timeline,
#             with OUT/lib/kernel_trace.so where the build had CUPTI),
#   OUT/durations the one-GPU main job's check.json and bench.json (results/h200/main-job/): their wall
#             times balance main_job.sh's shards
# The CUDA driver, cuBLAS and cuSOLVER (with its cuSPARSE and nvJitLink) come from the GPU machine
# (too large to carry).
# BUNDLE_FROM_HOST=REGEX leaves more libraries to the GPU machine (matched on the soname), for one
# known to have them: the LAPACK stack is 51 MB of the bundle's 129 MB (libopenblas alone 37 MB; most of
# the rest is libkvbench.so's device code, stored uncompressed: see NVFLAGS), so
#   BUNDLE_FROM_HOST='liblapacke|liblapack|libblas|libopenblas|libgfortran|libquadmath|libtmglib'
# makes a bundle of about 79 MB that loads Debian's liblapacke.so.3 from the GPU machine.
set -eu
out=$1
shift
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/tests"
cp "$@" "$out/bin/"
cp -r cases "$out/cases"
cp tests/run_tests.sh tests/cli_test.sh tests/step_report_test.py tests/plot_test.py "$out/tests/"
cp tests/fuzz/gpu_sweep.py "$out/tests/" # random shapes through check (make gpu-sweep)
cp -r tests/data "$out/tests/data" # plot_test.py's fixture
mkdir -p "$out/durations"
for f in check bench; do [ -s "results/h200/main-job/$f.json" ] && cp "results/h200/main-job/$f.json" "$out/durations/"; done
cp harness/report/plots.gp "$out/" # beside plot_report.py (harness/report/*.py below), for `plot_test.py`'s gnuplot test
cp harness/scripts/gpu_round.sh harness/scripts/main_job.sh harness/scripts/gate.sh harness/scripts/host_interference.sh "$out/"
cp profiles/*_round.sh profiles/sanitize.sh profiles/detached.sh "$out/" 2>/dev/null || true # the families' own rounds (int2_round.sh BUNDLE OUT)
cp harness/report/*.py harness/scripts/*.py "$out/" # optional external peers timed in the same run (torch_peers.py)
cp profiles/int2_v3_trace.py "$out/" # int2_v3_round.sh trace: the medians of v3's per-block trace
cp profiles/trace.sh profiles/kernel_trace.py "$out/" # a case's timeline without Nsight Systems
# KERNEL_TRACE_LIB (make bundle: build/lib/kernel_trace.so where the toolkit has CUPTI): the CUPTI tracer
# trace.sh loads into the driver; its libcupti travels beside it (the ldd loop below)
libs_of=("$@")
if [ -n "${KERNEL_TRACE_LIB:-}" ]; then cp "$KERNEL_TRACE_LIB" "$out/lib/" && libs_of+=("$KERNEL_TRACE_LIB"); fi
skip='^(linux-vdso|libc\.so|libm\.so|libdl\.so|libpthread\.so|librt\.so|libutil\.so|ld-linux|libcuda\.so|libcublas|libcublasLt|libcusolver|libcusparse|libnvJitLink|libnvidia)'
if [ -n "${BUNDLE_FROM_HOST:-}" ]; then skip="$skip|^(${BUNDLE_FROM_HOST})"; fi
for b in "${libs_of[@]}"; do
    ldd "$b" | awk '/=> \// {print $1, $3}' | while read -r name path; do
        if ! grep -qE "$skip" <<<"$name"; then cp -Ln "$path" "$out/lib/$name" 2>/dev/null || true; fi
    done
done
# the host code's debug information stays here (0.7 MB of the xz-packed bundle); its symbols travel
if command -v strip >/dev/null; then strip --strip-debug "$out/lib/libkvbench.so"; fi
if command -v patchelf >/dev/null; then
    for l in "$out"/lib/*; do patchelf --set-rpath '$ORIGIN' "$l"; done
fi
# A bundle that cannot load is refused here, not on the GPU machine: every library of every binary
# must resolve inside the bundle or the system, except the CUDA driver and cuBLAS (from the GPU host).
missing=$(for b in "$out"/bin/* "$out"/lib/*; do LD_LIBRARY_PATH= ldd "$b" 2>/dev/null | grep "not found"; done |
          grep -vE 'libcuda\.so|libcublas|libcusolver|libcusparse|libnvJitLink' | sort -u)
if [ -n "$missing" ]; then
    echo "bundle: unresolved libraries (link with rpath \$ORIGIN or install patchelf):" >&2
    echo "$missing" >&2
    exit 1
fi
# "Resolves" above is judged on this machine, which has the Debian packages: a library that the
# bundle holds but that its dependents find only through the system folders (liblapacke -> liblapack
# -> libopenblas -> libgfortran, without patchelf's rpath $ORIGIN) passes there and fails on a bare
# GPU machine. So every library a binary loads, other than the skipped system ones, must load from
# the bundle's lib/ (ldd lists the whole load tree, as the loader resolves it).
lib=$(cd "$out/lib" && pwd -P)
leaks=$(for b in "$out"/bin/*; do LD_LIBRARY_PATH= ldd "$b" 2>/dev/null | awk '/=> \// {print $1, $3}'; done |
        sort -u | while read -r name path; do
            grep -qE "$skip" <<<"$name" && continue
            case "$(readlink -f "$path")" in "$lib"/*) ;; *) echo "  $name => $path" ;; esac
        done)
if [ -n "$leaks" ]; then
    echo "bundle: libraries loaded from outside the bundle (install patchelf so bundle/lib/* get rpath \$ORIGIN):" >&2
    echo "$leaks" >&2
    exit 1
fi
du -sh "$out" | sed 's/^/bundle: /'
ls "$out/lib"
