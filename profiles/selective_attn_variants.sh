#!/usr/bin/env bash
# selective_attn_variants.sh BUNDLE OUT: A/B timing of the kernel variants (kernels/selective_attn.cu,
# KVB_SATTN_FWD and KVB_SATTN_COLSUM) in one run: each variant is checked on small cases, then each pass
# alone is benchmarked at the goal shapes (B=1, H=32, D=128, causal, L = 16K and 32K; the reference on 2
# (b, head) slices) -> OUT/variants.log, with a table of medians at the end.
set -u
b=$(cd "${1:?usage: selective_attn_variants.sh BUNDLE OUT}" && pwd)
out=${2:?usage: selective_attn_variants.sh BUNDLE OUT}
mkdir -p "$out"
log="$out/variants.log"
kv="$b/bin/kvbench"
if ! ldconfig -p 2>/dev/null | grep -q libcublas.so.13 && [ ! -e /usr/local/cuda/lib64/libcublas.so.13 ]; then
    d=$(dirname "$(find / -name 'libcublas.so.13' -not -path '/proc/*' 2>/dev/null | head -n 1)")
    [ -n "$d" ] && export LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
fi
small=("selective_attn B=1 Hq=8 Hkv=2 L=1000 D=128 causal=1 group_sum=1" "selective_attn B=1 Hq=8 Hkv=2 L=1000 D=64 causal=0 w0=968 group_sum=1"
    "selective_attn B=2 Hq=4 Hkv=4 L=4096 D=128 causal=1 w0=17 input=sink" "selective_attn B=1 Hq=8 Hkv=2 L=127 D=128 need_out=0 w0=95 group_sum=1"
    "selective_attn B=1 Hq=8 Hkv=1 L=4096 D=64 causal=1 input=peaked group_sum=1")
big() { echo "selective_attn B=1 Hq=32 Hkv=32 L=$1 D=128 sample=2 impl=$2"; }
: >"$log"
run() { # run NAME ENV... -- kvbench args
    local name=$1
    shift
    local envs=()
    while [ "$1" != -- ]; do envs+=("$1"); shift; done
    shift
    echo "== $name: ${envs[*]} kvbench $*" >>"$log"
    env "${envs[@]}" "$kv" "$@" --cases "$b/cases" >>"$log" 2>&1
    echo "exit $?" >>"$log"
}
for v in 200 201 211 101 111; do
    run "colsum $v check" KVB_SATTN_COLSUM=$v -- check "${small[@]}"
    run "colsum $v bench" KVB_SATTN_COLSUM=$v -- bench "$(big 16384 colsum_only)" "$(big 32768 colsum_only)" --benchmark_min_time=0.05
done
for f in 0 1; do
    run "fwd $f check" KVB_SATTN_FWD=$f -- check "${small[@]}"
    run "fwd $f bench" KVB_SATTN_FWD=$f -- bench "$(big 16384 fwd_only)" "$(big 32768 fwd_only)" --benchmark_min_time=0.05
done
{
    echo "== summary (median us per variant)"
    awk '/^== /{v=$2" "$3} /^\| `selective_attn/{split($0, c, "|"); id=c[2]; gsub(/`/, "", id); sub(/.*L=/, "L=", id); sub(/ D=.*impl=/, " ", id); print v, id, c[3]} /passed, .* failed/{print v, $0}' "$log"
} | tee -a "$log"
