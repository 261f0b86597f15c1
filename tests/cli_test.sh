#!/usr/bin/env bash
# Tests of the kvbench command line: bad input gives one clear message naming the parameter, its
# value and the allowed range, a non-zero exit, and nothing runs. Ends with "cli: N passed, N failed".
set -u
kvbench=${1:-build/bin/kvbench}
case $kvbench in /*) ;; *) kvbench=$(pwd)/$kvbench ;; esac # the tests below also run from elsewhere
cases=${KVB_CASES:-cases}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0 failed=0

ok() { passed=$((passed + 1)); echo "[       OK ] cli: $1"; }
fail() { failed=$((failed + 1)); echo "[  FAILED  ] cli: $1"; }

# expect NAME WANT_STATUS PATTERN -- ARGS...: run kvbench ARGS, check the exit status, that the
# output matches PATTERN, and that no case ran (no PASS/FAIL/SKIP line) when the status is 2.
expect() {
    local name=$1 want=$2 pattern=$3
    shift 4
    local out rc
    out=$("$kvbench" "$@" 2>&1)
    rc=$?
    local ok=1
    [ "$rc" -eq "$want" ] || ok=0
    grep -qE -- "$pattern" <<<"$out" || ok=0
    if [ "$want" -eq 2 ] && grep -qE '^(PASS|FAIL|SKIP) ' <<<"$out"; then ok=0; fi
    if [ $ok -eq 1 ]; then
        passed=$((passed + 1))
        echo "[       OK ] cli: $name"
    else
        failed=$((failed + 1))
        echo "[  FAILED  ] cli: $name (exit $rc, want $want, pattern '$pattern')"
        printf '%s\n' "$out" | head -n 20 | sed 's/^/    /'
    fi
}

expect "kernels shows a key's range and default" 0 '^  k +\[1, 8192\] +default 2048 ' -- kernels topk
expect "kernels shows an enum's choices" 0 '^  impl +kernel\|steps2 +default kernel ' -- kernels decode_attn
expect "kernels takes a family" 0 '^sparse_attn_pages \(decode\)' -- kernels decode
expect "kernels refuses an unknown name" 2 'kernels zzzz: not a kernel or a family; kernels: index_scan, ' -- kernels zzzz
expect "kernels refuses an option of check" 2 '--tier is not an option of kernels' -- kernels --tier check
if "$kvbench" kernels topk --json "$tmp/k.json" >/dev/null && python3 -c '
import json, sys
k = json.load(open(sys.argv[1]))["kernels"]
assert [x["name"] for x in k] == ["topk"], k
keys = {x["name"]: x for x in k[0]["keys"]}
assert keys["k"]["lo"] == 1 and keys["k"]["hi"] == 8192 and keys["k"]["default"] == "2048", keys["k"]
assert keys["impl"]["choices"] == "kernel|one_block", keys["impl"]
assert [i["name"] for i in k[0]["impls"]] == ["kernel", "one_block"]
' "$tmp/k.json"; then
    ok "kernels --json writes keys, ranges and impls"
else
    fail "kernels --json writes keys, ranges and impls"
fi
expect "sparse: len above L names len" 2 'sparse_attn_idx: len=7 out of range \[0, L = 5\]' -- check --cases "$cases" "sparse_attn_idx B=2 L=5 len=7"
: >"$tmp/empty.cases"
expect "a kernel without cases in the files" 2 "the case files hold no case of kernel topk .*kvbench kernels topk" -- list --cases "$tmp/empty.cases" topk
expect "shadowkv all=1 past the sparse slots names all and ctx" 2 'all=1 at ctx=33192 selects every landmark chunk, 4097 of them, .*all=1 needs ctx <= 33191' -- check --cases "$cases" "decode_step method=shadowkv B=2 ctx=33192 all=1"
expect "shadowkv_prefill D not a multiple of 4" 2 'shadowkv_prefill: D=22 out of range: a multiple of 4 in \[4, ' -- check --cases "$cases" "shadowkv_prefill S=2111 Hkv=3 D=22 r=25 c=3 local_chunks=2 outlier_chunks=36"
expect "shadowkv all=1 past the kernel's rank" 2 'all=1 takes the full rank Hkv\*D = 1024, past the 256' -- check --cases "$cases" "decode_step method=shadowkv model=llama3-8b B=1 ctx=1582 all=1"
expect "shadowkv rank past the kernel's" 2 'rank=300 out of range \[1, 256\]' -- check --cases "$cases" "decode_step method=shadowkv model=llama3-8b rank=300"
expect "shadowkv ctx below its kept chunks names ctx" 2 'ctx=384 out of range \[\(local \+ outlier \+ 1 chunks\) \* 8 = 424' -- check --cases "$cases" "decode_step method=shadowkv model=tiny B=2 ctx=384 budget=8 rank=32"
expect "shadowkv budget past the landmark chunks names budget" 2 'budget=800 out of range \[8, 8 \* min\(4096, landmark chunks 73\) = 584\]' -- check --cases "$cases" "decode_step method=shadowkv model=tiny B=2 ctx=1000 budget=800 rank=32"
expect "page scoring's size refusal names its formula" 2 'page_meta_append: the case.s tensors, min/max in and out 2\*2\*2\*B\*Hkv\*D\*cap bytes, take 33.8 GB' -- check --cases "$cases" "page_meta_append B=32 Hkv=21 D=192 P=1"
printf 'topk rows=8 n=4096 k=64\n\n# a comment\ntopk k=99999\n' >"$tmp/lines.txt"
expect "list --lines judges each line on its own" 2 '^4  refused  topk: k=99999 out of range \[1, 8192\]$' -- list --lines "$tmp/lines.txt"
expect "list --lines keeps the accepted lines" 2 '^1  none   topk rows=8 n=4096 k=64 dist=normal seed=1 impl=kernel$' -- list --lines "$tmp/lines.txt"
expect "list --lines takes no filter" 2 '--lines FILE is an option of list alone' -- list --lines "$tmp/lines.txt" topk
expect "M above 4096" 2 'M=5000 out of range \[1, 4096\]' -- check --cases "$cases" "gather_copy M=5000"
expect "chunk not a multiple of 16 bytes" 2 'chunk bytes c\*D\*2 = 1\*4\*2 = 8 must be a multiple of 16' -- check --cases "$cases" "gather_copy_all c=1 D=4"
expect "chunk ids outside the host range" 2 'M=256 out of range \[1, ctx/c = 125\]' -- check --cases "$cases" "gather_copy ctx=1000"
expect "negative size" 2 'B=-4 out of range \[1, 1024\]' -- check --cases "$cases" "gather_step B=-4"
expect "integer overflow with a suffix" 2 'L=17592186044417M out of range \[1, 1048576\] \(beyond a 64-bit integer\)' -- check --cases "$cases" "selective_attn L=17592186044417M"
expect "integer overflow without a suffix" 2 'B=99999999999999999999 out of range \[1, 1024\]' -- check --cases "$cases" "gather_copy B=99999999999999999999"
expect "unknown kernel" 2 "unknown kernel 'gathercopy'" -- check --cases "$cases" "gathercopy B=1"
expect "unknown key" 2 "unknown key 'Z'" -- bench --cases "$cases" "packed_load Z=1"
expect "malformed case line" 2 "malformed token 'B'" -- check --cases "$cases" "index_scan B M=2"
printf 'index_scan M=7 tier=smoke\ngather_copy M=4097 tier=smoke\n' >"$tmp/bad.cases"
expect "bad line in a case file stops everything" 2 "$tmp/bad.cases:2: gather_copy: M=4097 out of range" -- check --cases "$tmp/bad.cases"
expect "unknown option" 2 'unknown option --frobnicate' -- check --frobnicate
expect "unknown command" 2 "unknown command 'chekc'" -- chekc
# selective_attn, heavy_hitters, snapkv: each bad parameter named with its value and range, nothing run
expect "attention: unsupported D" 2 'selective_attn: D=96 is not one of \{64, 128\}' -- check --cases "$cases" "selective_attn D=96"
expect "attention: Hq not a multiple of Hkv" 2 'selective_attn: Hq=12 is not a multiple of Hkv=8' -- check --cases "$cases" "selective_attn Hq=12 Hkv=8"
expect "attention: L = 0" 2 'selective_attn: L=0 out of range \[1, 1048576\]' -- check --cases "$cases" "selective_attn L=0"
expect "attention: w0 past the last row" 2 'selective_attn: w0=4096 out of range \[0, L-1 = 4095\]' -- check --cases "$cases" "selective_attn L=4096 w0=4096"
expect "attention: forward alone without O" 2 'need_out=0 out of range \[1, 1\] for impl=fwd_only' -- bench --cases "$cases" "selective_attn need_out=0 w0=4000 impl=fwd_only"
expect "shadowkv: rank above min(S, Hkv*D)" 2 'shadowkv_lowrank: r=17 out of range \[1, min\(S, Hkv\*D\) = 16\]' -- check --cases "$cases" "shadowkv_lowrank S=100 Hkv=1 D=16 r=17"
expect "a filter written as a case line: the hint" 2 'give the kernel.s name alone or a part of their ids, e\.g\. "method=shadowkv"' -- check --cases "$cases" "decode_step method=shadowkv"
expect "shadowkv: rank 0" 2 'shadowkv_lowrank: r=0 out of range \[1, 8192\]' -- check --cases "$cases" "shadowkv_lowrank r=0"
expect "shadowkv: gesvdr on a wide matrix" 2 'shadowkv_lowrank: impl=gesvdr: S=100 out of range \[Hkv\*D = 256, 2\^24\]' -- check --cases "$cases" "shadowkv_lowrank S=100 Hkv=2 D=128 r=50 impl=gesvdr"
expect "shadowkv: more outliers than chunks" 2 'shadowkv_landmarks: outlier_chunks=9 out of range \[0, n_chunks = floor\(S/c\) - local_chunks = floor\(100/8\) - 4 = 8\]' -- check --cases "$cases" "shadowkv_landmarks S=100 outlier_chunks=9"
expect "shadowkv: no chunk before the local window" 2 'shadowkv_landmarks: S=30 out of range \[c\*\(local_chunks\+1\) = 8\*5 = 40' -- check --cases "$cases" "shadowkv_landmarks S=30"
expect "shadowkv prefill: odd D" 2 'shadowkv_prefill: D=33 out of range: a multiple of 4 in \[4, 1024\]' -- check --cases "$cases" "shadowkv_prefill S=203 Hkv=2 D=33 r=8"
expect "shadowkv prefill: rank above Hkv*D" 2 'shadowkv_prefill: r=100 out of range \[1, min\(S, Hkv\*D\) = 64\]' -- check --cases "$cases" "shadowkv_prefill S=203 Hkv=2 D=32 r=100"
expect "batch_gemm_rotary: rank 0" 2 'batch_gemm_rotary: r=0 out of range \[1, 1024\]' -- check --cases "$cases" "batch_gemm_rotary r=0"
expect "batch_gemm_rotary: more slots than chunks" 2 'batch_gemm_rotary: M=300 out of range \[1, ctx/c = 256\]' -- check --cases "$cases" "batch_gemm_rotary M=300 ctx=2048"
expect "batch_gemm_rotary: context shorter than a chunk" 2 'batch_gemm_rotary: ctx=4 out of range \[c = 8' -- check --cases "$cases" "batch_gemm_rotary ctx=4"
expect "landmark_score: M above Lm" 2 'landmark_score: M=101 out of range \[1, 100\]' -- check --cases "$cases" "landmark_score Lm=100 M=101"
expect "landmark_score: Hq not a multiple of Hkv" 2 'landmark_score: Hq=12 is not a multiple of Hkv=8' -- check --cases "$cases" "landmark_score Hq=12 Hkv=8"
expect "heavy hitters: heavy ratio above 1" 2 'heavy_hitters: heavy=1.5 out of range \[0, 1\]' -- check --cases "$cases" "heavy_hitters heavy=1.5"
expect "heavy hitters: negative recent ratio" 2 'heavy_hitters: recent=-0.25 out of range \[0, 1\]' -- check --cases "$cases" "heavy_hitters recent=-0.25"
expect "heavy hitters: pyramid ratio above 1" 2 'pyramid ratio of layer 0 = 1.04 out of range \[0, 1\]' -- check --cases "$cases" "heavy_hitters heavy=0.56 layers=32"
expect "heavy hitters: unsupported D" 2 'heavy_hitters: D=12 is not a multiple of 8' -- check --cases "$cases" "heavy_hitters D=12"
expect "snapkv: pooling kernel not odd" 2 'snapkv: ks=64 is not an odd pooling kernel in \[1, 8191\]' -- check --cases "$cases" "snapkv ks=64"
expect "snapkv: budget below the window" 2 'snapkv: budget=16 out of range \[W = min\(32, L\) = 32' -- check --cases "$cases" "snapkv budget=16"
expect "snapkv: unsupported D" 2 'snapkv: D=80 is not one of \{64, 128\}' -- check --cases "$cases" "snapkv D=80"
# B*Hkv past grid.y's 65535 (B=257, Hkv=256): accepted when the case is read (the heads run in grid.y
# chunks; the check tier holds such cases for the GPU), and listed
expect "int2_qk with B*Hkv = 65792 accepted" 0 '^none +int2_qk B=257 Hq=256 Hkv=256 D=64 gs=16 T=256' -- list --cases "$cases" "int2_qk B=257 Hq=256 Hkv=256 D=64 T=256"
expect "snapkv with B*Hkv = 65792 accepted" 0 '^none +snapkv B=257 Hq=256 Hkv=256 L=8 D=64 budget=8' -- list --cases "$cases" "snapkv B=257 Hq=256 Hkv=256 L=8 D=64 budget=8"
expect "int2 check-tier case with B*Hkv = 65792 shipped" 0 '^check +int2_quantize B=257 Hkv=256 D=64 gs=16 T=16' -- list --cases "$cases" --tier check int2_quantize
# page scoring: each bad input named with its value and range, nothing runs
expect "page metadata: P = 0" 2 'page_meta_build: P=0 out of range \[1, 4096\]' -- check --cases "$cases" "page_meta_build P=0"
expect "page metadata: capacity below the cache" 2 'page_meta_append: cap=56 out of range: metadata rows hold at least ceil\(L/P\) = ceil\(1000/16\) = 63 pages' -- check --cases "$cases" "page_meta_append L=1000 P=16 cap=56"
expect "page metadata: capacity not a multiple of 8" 2 'page_meta_build: cap=65 out of range: .* a multiple of 8' -- check --cases "$cases" "page_meta_build L=1000 P=16 cap=65"
expect "hybrid: r above D" 2 'hybrid_score: r=129 out of range \[1, 128\]' -- check --cases "$cases" "hybrid_score r=129"
expect "hybrid: budget leaves no token" 2 'hybrid_score: budget=1: rocketkv_budget: T=1 out of range \[2, ' -- check --cases "$cases" "hybrid_score budget=1"
expect "hybrid: budget above the context" 2 'hybrid_score: k = budget/2 = 2048 tokens to attend out of range \[1, L = 1000\]' -- check --cases "$cases" "hybrid_score L=1000 budget=4096"
expect "hybrid: k above the context" 2 'hybrid_score: k=1001 tokens to attend out of range \[1, L = 1000\]' -- check --cases "$cases" "hybrid_score L=1000 P=4 r=8 k=1001"
# omnikv_select: each bad input named with its value and range, nothing runs
expect "omnikv: k = 0" 2 'omnikv_select: k=0 out of range \[1, 2097152\]' -- check --cases "$cases" "omnikv_select k=0"
expect "omnikv: k above the prompt" 2 'omnikv_select: k=1001 out of range \[1, len = 1000\]' -- check --cases "$cases" "omnikv_select L=4096 len=1000 k=1001"
expect "omnikv: len above L" 2 'omnikv_select: len=5000 out of range \[0, L = 4096\]' -- check --cases "$cases" "omnikv_select L=4096 len=5000 k=10"
expect "omnikv: G above 8" 2 'omnikv_select: G = Hq/Hkv = 72/8 = 9 out of range \[1, 8\]' -- check --cases "$cases" "omnikv_select Hq=72 Hkv=8"
expect "omnikv: unsupported D" 2 'omnikv_select: D=96 is not one of \{64, 128\}' -- check --cases "$cases" "omnikv_select D=96"
expect "hybrid: G above 8" 2 'hybrid_score: G = Hq/Hkv = 72/8 = 9 out of range \[1, 8\]' -- check --cases "$cases" "hybrid_score Hq=72"
expect "quest: budget below a page" 2 'quest_score: budget=8 tokens out of range \[P = 16, L = 32768\]' -- check --cases "$cases" "quest_score budget=8"
expect "quest: budget above the context" 2 'quest_score: budget=40000 tokens out of range \[P = 16, L = 32768\]' -- check --cases "$cases" "quest_score budget=40000"
expect "quest: P = 0" 2 'quest_score: P=0 out of range \[1, 4096\]' -- check --cases "$cases" "quest_score P=0"
expect "hybrid with B*Hkv = 65792 accepted" 0 '^none +hybrid_score B=257 Hq=256 Hkv=256 D=8 L=8 ' -- list --cases "$cases" "hybrid_score B=257 Hq=256 Hkv=256 D=8 L=8 P=2 r=3 k=4"
expect "list shows the gather_copy cases" 0 '^check +gather_copy B=2 Hkv=8 M=256 c=8 D=128' -- list --cases "$cases" gather_copy
expect "list by tier" 0 '^smoke +packed_load' -- list --cases "$cases" --tier smoke
# exit status 3 when nothing was measured: every case skipped for want of a device (a CPU-only machine
# runs the references and their invariants); 0 where a GPU ran them. The probe says which machine this is.
"$kvbench" check --cases "$cases" "topk rows=1 n=1 k=1" >"$tmp/probe.log" 2>&1
ran=$?
if [ $ran -eq 0 ] || { [ $ran -eq 3 ] && grep -q '^0 passed, 0 failed, 1 skipped' "$tmp/probe.log" &&
    grep -q 'nothing was measured' "$tmp/probe.log"; }; then
    ok "one case: exit 0 on a GPU, 3 (nothing measured) without (here: $ran)"
else
    fail "one case: exit 0 on a GPU, 3 (nothing measured) without (exit $ran)"
    sed 's/^/    /' "$tmp/probe.log" | head -n 10
fi
expect "smoke tier runs (references on a CPU-only machine)" "$ran" '^[0-9]+ passed, 0 failed, [0-9]+ skipped' -- check --cases "$cases" --tier smoke
expect "check --json and --dump write files" "$ran" 'passed, 0 failed' -- check --cases "$cases" "index_scan B=1 Hkv=1 M=7 ids=64" --json "$tmp/c.json" --dump "$tmp/dump"
if grep -q '"status": ' "$tmp/c.json" 2>/dev/null && ls "$tmp"/dump/*/new_ids.npy >/dev/null 2>&1; then
    passed=$((passed + 1)); echo "[       OK ] cli: json and npy files exist"
else
    failed=$((failed + 1)); echo "[  FAILED  ] cli: json and npy files exist"
fi
# --dump: a directory that cannot be made stops everything (exit 2, naming it); a file that cannot be
# written fails the run (exit 1, naming it); only computed data is written (a sampled reference's mask
# and meta.json; no reference file for shadowkv_lowrank's factors, which have none)
: >"$tmp/afile"
expect "check --dump under a file: nothing runs" 2 "--dump: cannot create $tmp/afile/d: $tmp/afile exists and is not a directory" -- check --cases "$cases" "index_scan B=1 Hkv=1 M=7 ids=64" --dump "$tmp/afile/d"
scan_dir="$tmp/dd/$("$kvbench" list --cases "$cases" "index_scan B=1 Hkv=1 M=7 ids=64" | sed -E 's/^[a-z]+ +//; s/ /_/g')"
mkdir -p "$tmp/dd" && : >"$scan_dir"
expect "check --dump with a file it cannot write: exit 1 naming it" 1 "dump failed: cannot create $scan_dir: .* not a directory" -- check --cases "$cases" "index_scan B=1 Hkv=1 M=7 ids=64" --dump "$tmp/dd"
expect "check --dump of a sampled reference and of outputs without one" "$ran" 'passed, 0 failed' -- check --cases "$cases" "selective_attn B=2 Hq=8 Hkv=2 L=256 D=64 group_sum=1 sample=1" "shadowkv_lowrank S=64 Hkv=2 D=16 r=8" --dump "$tmp/ds"
if ls "$tmp"/ds/selective_attn_*/O.ref_mask.npy >/dev/null 2>&1 && grep -q '"reference": "sampled"' "$tmp"/ds/selective_attn_*/meta.json &&
   ls "$tmp"/ds/shadowkv_lowrank_*/info.ref.npy >/dev/null 2>&1 && ! ls "$tmp"/ds/shadowkv_lowrank_*/U.ref.npy >/dev/null 2>&1 &&
   grep -q '"reference": "none' "$tmp"/ds/shadowkv_lowrank_*/meta.json; then
    passed=$((passed + 1)); echo "[       OK ] cli: dumps hold computed data only (mask, meta.json, no reference for U)"
else
    failed=$((failed + 1)); echo "[  FAILED  ] cli: dumps hold computed data only (mask, meta.json, no reference for U)"
fi
# selective_attn's reference memo: a case after another on the same inputs (O and LSE kept; the column
# sums kept for the same w0, else from the window rows alone) dumps the same reference bytes as alone
sa="selective_attn B=2 Hq=8 Hkv=2 L=256 D=64 group_sum=1 sample=1"
"$kvbench" check --cases "$cases" "$sa w0=0" "$sa w0=224" "$sa w0=224 impl=kernel_mma" --dump "$tmp/memo" >"$tmp/memo.log" 2>&1
"$kvbench" check --cases "$cases" "$sa w0=224" --dump "$tmp/alone" >/dev/null 2>&1
"$kvbench" check --cases "$cases" "$sa w0=224 impl=kernel_mma" --dump "$tmp/alone" >/dev/null 2>&1
same=1 n=0
for f in "$tmp"/alone/*/*.ref.npy; do
    n=$((n + 1))
    cmp -s "$f" "$tmp/memo/${f#"$tmp"/alone/}" || same=0
done
if [ $same -eq 1 ] && [ $n -ge 8 ] && [ "$(grep -c "from an earlier case's identical inputs" "$tmp/memo.log")" -eq 2 ]; then
    ok "selective_attn's reference from the memo: the same bytes as alone ($n files)"
else
    fail "selective_attn's reference from the memo: the same bytes as alone ($n files, same=$same)"
    head -n 20 "$tmp/memo.log" | sed 's/^/    /'
fi
# tolerance overrides are not part of the id, but the reproduce line, the JSON and the list carry them
expect "check --json with a tolerance override" "$ran" 'passed, 0 failed' -- check --cases "$cases" "index_scan B=1 Hkv=1 M=7 ids=64 atol=0.5 rtol=0.125" --json "$tmp/o.json"
if grep -q '"reproduce": "index_scan B=1 Hkv=1 M=7 ids=64 .* atol=0.5 rtol=0.125"' "$tmp/o.json" && grep -q '"overridden": true' "$tmp/o.json"; then
    passed=$((passed + 1)); echo "[       OK ] cli: overrides in the JSON's reproduce line"
else
    failed=$((failed + 1)); echo "[  FAILED  ] cli: overrides in the JSON's reproduce line"
fi
printf 'index_scan B=1 Hkv=1 M=7 ids=64 atol=0.5 tier=smoke\n' >"$tmp/tol.cases"
expect "list shows a case's tolerance overrides" 0 '^smoke +index_scan B=1 Hkv=1 M=7 ids=64 .* atol=0.5$' -- list --cases "$tmp/tol.cases"
# decode and int2 families: each bad input named with its value and range, nothing runs
expect "gs not in the supported set" 2 'int2_quantize: gs=24 is not one of \{16, 32, 64, 128\}' -- check --cases "$cases" "int2_quantize gs=24"
expect "T not a multiple of gs" 2 'int2_decode_attn: T=1000 is not a multiple of gs=16' -- check --cases "$cases" "int2_decode_attn T=1000 gs=16"
expect "D not a multiple of gs" 2 'int2_qk: D=64 is not a multiple of gs=128' -- check --cases "$cases" "int2_qk D=64 gs=128"
expect "length beyond the allocated cache" 2 'decode_attn: len=40000 out of range \[0, L = 32768\]' -- check --cases "$cases" "decode_attn L=32768 len=40000"
expect "residual beyond its bound" 2 'int2_decode_attn: R=200 out of range \[0, min\(Rcap = 200, 128 \+ gs - 1 = 143\)\]' -- check --cases "$cases" "int2_decode_attn R=200"
expect "G above 8" 2 'decode_attn: Hq=72 out of range \[8, 64\]' -- check --cases "$cases" "decode_attn Hq=72 Hkv=8"
expect "non-finite quantizer input (rejected by the reference, nothing launched)" 1 'K\[0,0,0,5\]=nan out of range \[-32768, 32768\]' -- check --cases "$cases" "int2_quantize B=1 Hkv=1 D=64 gs=16 T=64 dist=nonfinite"
if ! grep -qE '^PASS ' <<<"$("$kvbench" check --cases "$cases" "int2_quantize B=1 Hkv=1 D=64 gs=16 T=64 dist=nonfinite" 2>&1)"; then
    passed=$((passed + 1)); echo "[       OK ] cli: the rejected case did not pass"
else
    failed=$((failed + 1)); echo "[  FAILED  ] cli: the rejected case did not pass"
fi
expect "list shows the decode and int2 cases" 0 '^bench +int2_decode_attn B=8 Hq=32 Hkv=8 D=128 gs=16 T=131072 R=64' -- list --cases "$cases" int2_decode_attn
expect "help" 0 'usage: kvbench' -- help
# a kernel's name selects its own cases only (decode_attn, not int2_decode_attn); other words are substrings
out=$("$kvbench" list --cases "$cases" decode_attn 2>&1)
if grep -qE '^[a-z]+ +decode_attn ' <<<"$out" && ! grep -q 'int2_decode_attn' <<<"$out" &&
   "$kvbench" list --cases "$cases" _decode_attn 2>&1 | grep -q 'int2_decode_attn'; then
    passed=$((passed + 1)); echo "[       OK ] cli: a kernel name filter selects that kernel only"
else
    failed=$((failed + 1)); echo "[  FAILED  ] cli: a kernel name filter selects that kernel only"
fi

# fault injection: outputs of zeros must fail validation for every smoke case (references only, no GPU)
expect "zeros caught on every smoke case" 0 'fault injection \(outputs of zeros\): [0-9]+ caught, 0 missed' -- check --cases "$cases" --tier smoke --fault zeros

# compare, the gate: a case 10% slower beyond the noise fails; options before or after the files;
# a missing case fails; a file that is not a kvbench bench file is unusable (exit 2)
mk() {
    printf '{"context": {"kvbench_git_revision": "abc1234"}, "benchmarks": [{"name": "x B=1/manual_time", "median_us": %s, "noise_pct": %s, "samples": 100}%s]}\n' "$2" "$3" "${4:-}" >"$1"
}
mk "$tmp/base.json" 100 1 ', {"name": "y B=2/manual_time", "median_us": 50, "noise_pct": 1, "samples": 100}'
mk "$tmp/slow.json" 110 1 ', {"name": "y B=2/manual_time", "median_us": 50, "noise_pct": 1, "samples": 100}'
mk "$tmp/same.json" 101 1 ', {"name": "y B=2/manual_time", "median_us": 50, "noise_pct": 1, "samples": 100}'
mk "$tmp/missing.json" 100 1
expect "compare flags a regression" 1 '^SLOWER .* x B=1' -- compare "$tmp/base.json" "$tmp/slow.json"
expect "compare passes within the threshold" 0 '^same .* x B=1' -- compare "$tmp/base.json" "$tmp/same.json"
expect "compare --threshold before the files" 0 'threshold 20.0%' -- compare --threshold 20 "$tmp/base.json" "$tmp/slow.json"
expect "compare --threshold after the files" 0 'threshold 20.0%' -- compare "$tmp/base.json" "$tmp/slow.json" --threshold 20
expect "compare fails on a missing case" 1 '^MISSING .* y B=2' -- compare "$tmp/base.json" "$tmp/missing.json"
# bench names a case "<id>/iterations:1/manual_time" (one Google Benchmark iteration holds the samples); earlier
# results "<id>/manual_time": the same case
sed 's|/manual_time|/iterations:1/manual_time|g' "$tmp/same.json" >"$tmp/iter.json"
expect "compare matches <id>/iterations:1/manual_time with <id>/manual_time" 0 '0 missing' -- compare "$tmp/base.json" "$tmp/iter.json"
expect "compare --subset leaves out what NEW did not run" 0 '1 case of BASE not in NEW, left out' -- compare --subset "$tmp/base.json" "$tmp/missing.json"
expect "compare --subset still fails a regression" 1 '^SLOWER .* x B=1' -- compare "$tmp/base.json" "$tmp/slow.json" --subset
expect "compare rejects a file that is not JSON" 2 'gather_copy.cases' -- compare "$tmp/base.json" "$cases/gather_copy.cases"
expect "compare rejects a foreign JSON file" 2 'not a Google Benchmark JSON' -- compare "$tmp/base.json" "$tmp/c.json"
expect "compare rejects an unknown option" 2 'unknown option --frobnicate' -- compare "$tmp/base.json" "$tmp/same.json" --frobnicate 1

# every GQA group G in [1, 8] is accepted (G = 3, 5, 6, 7 included); G = 9 is refused before anything runs
expect "omnikv_select G=5 accepted" "$ran" ' 0 failed' -- check --cases "$cases" "omnikv_select Hq=40 Hkv=8 L=100 k=10"
expect "hybrid_score G=7 accepted" "$ran" ' 0 failed' -- check --cases "$cases" "hybrid_score Hq=28 Hkv=4 L=100 P=4 r=8 k=10"
expect "quest_score G=3 accepted" "$ran" ' 0 failed' -- check --cases "$cases" "quest_score Hq=24 Hkv=8 L=100 P=4 budget=16"
expect "rocketkv_decode G=6 accepted" "$ran" ' 0 failed' -- check --cases "$cases" "rocketkv_decode Hq=12 Hkv=2 D=64 Lmax=300 T=64 M=8"
expect "quest_score G=9 refused" 2 'quest_score: G = Hq/Hkv = 72/8 = 9 out of range \[1, 8\]' -- check --cases "$cases" "quest_score Hq=72 Hkv=8"
expect "rocketkv_decode G=9 refused" 2 'rocketkv_step: Hq=72 out of range \[8, 64\]' -- check --cases "$cases" "rocketkv_decode Hq=72 Hkv=8"

# --determinism is an option of check (without a GPU the case is skipped, and nothing is compared)
expect "check --determinism accepted" "$ran" '0 failed, [01] skipped' -- check --determinism --cases "$cases" "topk rows=1 n=1 k=1"

# the progress line: "check i/n, m:ss: id" on stderr when asked (a terminal, or KVB_PROGRESS=1);
# off a terminal a plain line every 15 s at most, so a short run prints none
KVB_PROGRESS=1 expect "progress line when asked" "$ran" 'check 1/1, [0-9]+:[0-9]+: gather_copy' -- check --cases "$cases" "gather_copy B=1 M=8 ctx=1024"
out=$("$kvbench" check --cases "$cases" "gather_copy B=1 M=8 ctx=1024" 2>&1)
if grep -qE 'check [0-9]+/[0-9]+' <<<"$out"; then
    failed=$((failed + 1)); echo "[  FAILED  ] cli: no progress line off a terminal"
else
    passed=$((passed + 1)); echo "[       OK ] cli: no progress line off a terminal"
fi

# ---- the command line CI relies on: exit statuses, messages, result files ----
expect "--version" 0 '^kvbench [^ ]+ \(CUDA ([0-9]+\.[0-9]+|not built)\)$' -- --version
expect "help documents the exit statuses" 0 '130  interrupted by SIGINT' -- --help
expect "list with a filter matching nothing" 2 "no case matches 'zzzz'" -- list --cases "$cases" zzzz
expect "check with a filter matching nothing" 2 "no case matches 'zzzz'" -- check --cases "$cases" zzzz
expect "a bare unknown kernel lists every kernel" 2 "unknown kernel 'zzzz'.*kernels: index_scan, .*, decode_step$" -- list --cases "$cases" zzzz
expect "an unknown kernel in a case line lists every kernel" 2 "unknown kernel 'zzzz'; kernels: index_scan, .*, decode_step$" -- check --cases "$cases" "zzzz B=1"
expect "one filter of two matching nothing" 2 "no case matches 'zzzz'" -- list --cases "$cases" topk zzzz
expect "a filter whose cases are of another tier" 2 'no case of tier smoke matches .int2_native. \([0-9]+ cases of other tiers do: --tier all\)' -- check --cases "$cases" --tier smoke int2_native
expect "an empty filter" 2 'argument 2 is an empty filter' -- check ""
expect "a blank filter" 2 'argument 3 is an empty filter' -- check --determinism "   "
expect "an argument that is not UTF-8" 2 'argument 2 is not valid UTF-8 \(byte 0xff at offset 4\)' -- check $'topk\xff'
printf 'topk rows=1 n=1 k=1 tier=check # caf\xe9\n' >"$tmp/latin1.cases"
expect "a case file line that is not UTF-8" 2 'latin1.cases:1: not valid UTF-8 \(byte 0xe9 at column 37\)' -- list --cases "$tmp/latin1.cases"
printf 'topk rows=1 n=8 k=1 tier=check\rtopk rows=1 n=8 k=2 tier=check\r' >"$tmp/cr.cases"
expect "CR-only line ends: every line read" 0 'k=2' -- list --cases "$tmp/cr.cases"
expect "the same case twice runs once" "$ran" 'duplicate case .topk rows=1 n=1 k=1.*run once' -- check --cases "$cases" "topk rows=1 n=1 k=1" "topk k=1 n=1 rows=1"
out=$("$kvbench" check --cases "$cases" "topk rows=1 n=1 k=1" "topk k=1 n=1 rows=1" 2>&1)
if grep -qE '^0 passed, 0 failed, 1 skipped|^1 passed, 0 failed, 0 skipped' <<<"$out"; then ok "... and it ran once"; else fail "... and it ran once"; fi
expect "decode_step: a key the method ignores" 2 'method=dense: budget=256 out of range \[2048, 2048\]: method=dense does not read budget' -- check --cases "$cases" "decode_step method=dense model=tiny B=1 ctx=10 budget=256"
expect "ids print floats exactly" 0 ' hit=0.60000000001 ' -- list --cases "$cases" "gather_copy hit=0.60000000001"
if [ "$ran" -eq 3 ]; then # nothing to measure here: said with exit status 3
    expect "ceilings without a device" 3 'nothing measured' -- ceilings
    expect "profile without a device" 3 'nothing was profiled' -- profile --cases "$cases" "topk rows=1 n=1 k=1"
    expect "bench without a device" 3 'nothing was timed \(1 case selected\)' -- bench --cases "$cases" "topk rows=1 n=1 k=1"
    expect "the reason names the missing driver or device" 3 'kvbench: no CUDA device(: no NVIDIA driver found \(libcuda.so.1 not loadable\)| found|: the NVIDIA driver supports|: built without CUDA)' -- ceilings
fi

# where the cases are: beside the binary (a bundle's bin/../cases, the build tree's bin/../../cases), from
# any directory; and when there are none, where it looked
root=$(cd "$(dirname "$kvbench")/../.." && pwd)
if [ -d "$root/cases" ]; then
    out=$(cd / && env -u KVB_CASES "$kvbench" list topk 2>&1)
    if [ $? -eq 0 ] && grep -qE '^[a-z]+ +topk ' <<<"$out"; then ok "list from / finds the cases beside the binary"
    else fail "list from / finds the cases beside the binary"; printf '%s
' "$out" | head -n 5; fi
fi
mkdir -p "$tmp/lone/bin"
cp "$kvbench" "$tmp/lone/bin/kvbench"
ln -s "$(cd "$(dirname "$kvbench")/../lib" && pwd)" "$tmp/lone/lib"
out=$(cd "$tmp" && env -u KVB_CASES "$tmp/lone/bin/kvbench" list topk 2>&1)
rc=$?
if [ $rc -eq 2 ] && grep -q "no case directory: --cases not given, KVB_CASES not set, and none at $tmp/lone/bin/../cases, $tmp/lone/bin/../../cases, ./cases" <<<"$out"; then
    ok "no case directory: the message names where it looked"
else fail "no case directory: the message names where it looked (exit $rc)"; printf '%s\n' "$out" | head -n 5; fi
ln -s "$(cd "$cases" && pwd)" "$tmp/lone/cases"
out=$(cd / && env -u KVB_CASES "$tmp/lone/bin/kvbench" list topk 2>&1)
if [ $? -eq 0 ] && grep -qE '^[a-z]+ +topk ' <<<"$out"; then ok "a bundle's bin/../cases"; else fail "a bundle's bin/../cases"; fi

# result files: never over an input, replaced only when complete
cp "$cases/select.cases" "$tmp/own.cases"
expect "--json over the case file refused" 2 "--json $tmp/own.cases is the same file as --cases $tmp/own.cases" -- check --cases "$tmp/own.cases" --json "$tmp/own.cases"
if cmp -s "$cases/select.cases" "$tmp/own.cases"; then ok "... and the case file is untouched"; else fail "... and the case file is untouched"; fi
mkdir -p "$tmp/cdir" && cp "$cases/select.cases" "$tmp/cdir/"
expect "--summary over a case file of --cases DIR refused" 2 'is the same file as the case file' -- bench --cases "$tmp/cdir" --summary "$tmp/cdir/select.cases"
echo '{"peers": []}' >"$tmp/peers.json"
expect "--json over --peers refused" 2 'is the same file as --peers' -- bench --cases "$cases" --peers "$tmp/peers.json" --json "$tmp/peers.json"
expect "--peers a directory" 2 "is a directory" -- bench --cases "$cases" --peers "$tmp" topk
expect "compare --json over BASE refused" 2 'is the same file as BASE' -- compare "$tmp/base.json" "$tmp/same.json" --json "$tmp/base.json"
expect "compare a directory" 2 "kvbench compare: $tmp: is a directory, not a file" -- compare "$tmp/base.json" "$tmp"
out=$("$kvbench" compare "$tmp/base.json" "$tmp/nope.json" 2>&1)
if [ "$(grep -o "$tmp/nope.json" <<<"$out" | wc -l)" -eq 1 ]; then ok "compare names a missing file once"; else fail "compare names a missing file once"; echo "    $out"; fi
expect "compare --threshold abc" 2 '--threshold abc is not a number' -- compare "$tmp/base.json" "$tmp/same.json" --threshold abc
out=$(cat "$tmp/base.json" | "$kvbench" compare /dev/stdin "$tmp/same.json" 2>&1)
if [ $? -eq 0 ] && grep -q '^same .* x B=1' <<<"$out"; then ok "compare reads BASE from /dev/stdin (a pipe)"; else fail "compare reads BASE from /dev/stdin (a pipe)"; fi
out=$("$kvbench" compare <(cat "$tmp/base.json") <(cat "$tmp/slow.json") 2>&1)
if [ $? -eq 1 ] && grep -q '^SLOWER .* x B=1' <<<"$out"; then ok "compare reads pipes"; else fail "compare reads pipes"; fi
mk "$tmp/two.json" 100 1 ', {"name": "x B=1/manual_time", "median_us": 50, "noise_pct": 1, "samples": 100}'
expect "compare: a case id twice" 2 "case 'x B=1' appears twice" -- compare "$tmp/two.json" "$tmp/same.json"
printf '{"context": {"kvbench_git_revision": "a"}, "benchmarks": [{"name": "x B=1/manual_time", "median_us": 100, "noise_pct": 1, "samples": 2}]}\n' >"$tmp/few.json"
expect "compare: fewer than 3 samples" 2 "case 'x B=1': samples=2 out of range \[3, 1e\+12\]" -- compare "$tmp/base.json" "$tmp/few.json"
printf '{"context": {"kvbench_git_revision": "a"}, "benchmarks": [{"name": "x B=1/manual_time", "median_us": 1.7e308, "noise_pct": 1, "samples": 100}]}\n' >"$tmp/huge.json"
expect "compare: a median out of range" 2 "median_us=1.7e\+308 out of range" -- compare "$tmp/base.json" "$tmp/huge.json"
printf '{"context": {"kvbench_git_revision": "a"}, "benchmarks": [{"name": "x B=1/manual_time", "median_us": NaN, "noise_pct": 1, "samples": 100}]}\n' >"$tmp/nan.json"
expect "compare: a NaN median" 2 "median_us=NaN is not a finite number" -- compare "$tmp/base.json" "$tmp/nan.json"
printf '{"context": {"kvbench_git_revision": "a"}, "benchmarks": [{"name": "x B=1/manual_time", "median_us": 0x64, "noise_pct": 1, "samples": 100}]}\n' >"$tmp/hex.json"
expect "compare: a hex number" 2 'malformed JSON at byte [0-9]+ \(line 1, column [0-9]+\): a hexadecimal number' -- compare "$tmp/base.json" "$tmp/hex.json"
# check --json: replaced whole; an interrupted run writes the cases finished and exits 128 + the signal
echo old >"$tmp/r.json"
expect "a refused run leaves the result file" 2 'out of range' -- check --cases "$cases" --json "$tmp/r.json" "gather_copy M=5000"
if [ "$(cat "$tmp/r.json")" = old ]; then ok "... untouched"; else fail "... untouched"; fi
for sig in INT TERM; do
    want=$([ $sig = INT ] && echo 130 || echo 143)
    timeout --preserve-status -s $sig 1 "$kvbench" check --cases "$cases" --tier check --json "$tmp/int.json" >"$tmp/int.log" 2>&1
    rc=$?
    if [ $rc -eq "$want" ] && grep -qE "^kvbench: interrupted: [0-9]+ of [0-9]+ cases done; $tmp/int.json holds them" "$tmp/int.log" &&
       grep -q '"interrupted": true' "$tmp/int.json" && tail -n 1 "$tmp/int.json" | grep -q '^}$' &&
       { ! command -v python3 >/dev/null || python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$tmp/int.json"; }; then
        ok "SIG$sig: exit $want, a valid JSON of the cases done"
    else
        fail "SIG$sig: exit $want, a valid JSON of the cases done (exit $rc)"
        tail -n 3 "$tmp/int.log" | sed 's/^/    /'
    fi
done
# the same interrupt delivered twice at once (timeout(1) signals the command, then its process group) is
# one request: the run still ends between cases with its JSON
"$kvbench" check --cases "$cases" --tier check --json "$tmp/int2.json" >"$tmp/int2.log" 2>&1 &
pid=$!
sleep 1
kill -INT $pid
kill -INT $pid
wait $pid
rc=$?
if [ $rc -eq 130 ] && grep -q '"interrupted": true' "$tmp/int2.json"; then
    ok "SIGINT twice at once: one interrupt, exit 130, a valid JSON"
else
    fail "SIGINT twice at once: one interrupt, exit 130, a valid JSON (exit $rc)"
    tail -n 3 "$tmp/int2.log" | sed 's/^/    /'
fi
# shadowkv_lowrank: the next case of the same input reuses the reference's singular values; another seed does not
printf '%s\n' "shadowkv_lowrank S=2000 Hkv=4 D=64 r=32 seed=3 tier=check" "shadowkv_lowrank S=2000 Hkv=4 D=64 r=32 seed=3 impl=syevd_all tier=check" \
    "shadowkv_lowrank S=2000 Hkv=4 D=64 r=32 seed=4 impl=syevd_all tier=check" >"$tmp/lowrank.cases"
"$kvbench" check --cases "$tmp/lowrank.cases" --json "$tmp/lowrank.json" >/dev/null 2>&1
# the note (with a device, after the error ratios) in the second case only: the id lines and the note line in order
seq=$(grep -E '"id": |identical input' "$tmp/lowrank.json" | sed -E 's/.*(seed=[0-9]+ impl=[a-z_]+).*/\1/; s/.*identical input.*/reused/' | tr '\n' ' ')
if [ "$seq" = "seed=3 impl=kernel seed=3 impl=syevd_all reused seed=4 impl=syevd_all " ]; then ok "shadowkv_lowrank: the same input's singular values reused once, not across seeds"
else fail "shadowkv_lowrank: the same input's singular values reused once, not across seeds ($seq)"; fi

# ---- shards (--shard K/N), merge, the timing lock and the sharded main job ----
expect "--shard 0/2 refused" 2 '--shard 0/2: give K/N, whole numbers with 1 <= K <= N <= 64' -- check --cases "$cases" --shard 0/2
expect "--shard 3/2 refused" 2 '--shard 3/2: give K/N, whole numbers with 1 <= K <= N <= 64' -- check --cases "$cases" --shard 3/2
expect "--shard 1/65 refused" 2 '--shard 1/65: give K/N, whole numbers with 1 <= K <= N <= 64' -- bench --cases "$cases" --shard 1/65
expect "--shard x refused" 2 '--shard x: give K/N' -- list --cases "$cases" --shard x
expect "--shard without its value refused" 2 'unknown option --shard \(or it lacks its value\)' -- list --cases "$cases" --shard
expect "--shard of ceilings refused" 2 '--shard is an option of list, check and bench, not of ceilings' -- ceilings --shard 1/2
expect "--timing-lock of check refused" 2 '--timing-lock is an option of bench, not of check' -- check --cases "$cases" --timing-lock "$tmp/t.lock" topk
expect "--timing-lock that cannot be opened" 2 "--timing-lock cannot open $tmp: " -- bench --cases "$cases" --timing-lock "$tmp" topk
expect "--timing-lock over --json refused" 2 'and --timing-lock .* are the same file' -- bench --cases "$cases" --json "$tmp/tl.json" --timing-lock "$tmp/tl.json" topk
for spec in "check 3" "bench 4" "all 8"; do
    set -- $spec
    "$kvbench" list --cases "$cases" --tier "$1" | sort >"$tmp/list.all"
    : >"$tmp/list.union"
    for k in $(seq 1 "$2"); do "$kvbench" list --cases "$cases" --tier "$1" --shard "$k/$2" 2>/dev/null >>"$tmp/list.union"; done
    if [ -s "$tmp/list.all" ] && sort "$tmp/list.union" | cmp -s - "$tmp/list.all"; then ok "list --tier $1: the union of $2 shards is the list, each case once"
    else fail "list --tier $1: the union of $2 shards is the list, each case once"; fi
done
expect "an empty shard lists nothing, exit 0" 0 'shard 2/2: none of the 1 case selected falls to this shard: nothing to run' -- list --cases "$cases" "topk rows=3 n=100 k=7" --shard 2/2
expect "check of an empty shard: exit 0" 0 '0 passed, 0 failed, 0 skipped' -- check --cases "$cases" "topk rows=3 n=100 k=7" --shard 2/2 --json "$tmp/empty.json"
expect "bench of an empty shard: exit 0, no device needed" 0 'shard 2/2 has no case: nothing timed' -- bench --cases "$cases" "topk rows=3 n=100 k=7" --shard 2/2 --json "$tmp/empty_b.json" --summary "$tmp/empty_b.md"
if grep -q '"benchmarks": \[\]' "$tmp/empty_b.json" && grep -q '"shard": "2/2"' "$tmp/empty_b.json" && grep -q '"cases": \[\]' "$tmp/empty.json" &&
   grep -q '"shard": "2/2"' "$tmp/empty.json" && grep -q 'Shard 2/2 has no case' "$tmp/empty_b.md"; then ok "... their files: valid, no case, the shard in the context"
else fail "... their files: valid, no case, the shard in the context"; fi
expect "list --costs: tier, seconds, MB, the case" 0 '^none +[0-9]+\.[0-9]{2} +[0-9]+\.[0-9]  topk rows=3 n=100 k=7' -- list --cases "$cases" "topk rows=3 n=100 k=7" --costs
expect "--durations of list alone refused" 2 '--durations weighs the cases of check and bench .* not of list alone' -- list --cases "$cases" --durations "$tmp/empty.json" topk
expect "--durations of a check without the cases refused" 2 "--durations $tmp/empty.json holds none of the 1 selected case" -- check --cases "$cases" "topk rows=3 n=100 k=7" --durations "$tmp/empty.json"
expect "--durations of a file without the cases refused" 2 "--durations $tmp/empty.json holds none of the 1 selected case" -- check --cases "$cases" "topk rows=3 n=100 k=7" --shard 1/2 --durations "$tmp/empty.json"
echo '{"context": {}}' >"$tmp/not_results.json"
expect "--durations of a file that is not a result file refused" 2 'is not a kvbench check or bench result file' -- list --cases "$cases" topk --costs --durations "$tmp/not_results.json"
# merge: check shards (every case SKIP without a GPU, PASS with one) re-summed, in one process's order
sel=(--cases "$cases" --tier smoke topk index_scan packed_load)
"$kvbench" check "${sel[@]}" --json "$tmp/whole.json" >/dev/null 2>&1
for k in 1 2 3; do "$kvbench" check "${sel[@]}" --shard "$k/3" --json "$tmp/shard$k.json" >/dev/null 2>&1; done
expect "merge check shards" 0 'kvbench merge: [0-9]+ check cases from 4 files into' -- merge "$tmp/merged.json" "$tmp/shard1.json" "$tmp/shard2.json" "$tmp/shard3.json" "$tmp/empty.json"
if command -v python3 >/dev/null; then
    if python3 - "$tmp/whole.json" "$tmp/merged.json" <<'PY'
import json, sys
w, m = (json.load(open(p)) for p in sys.argv[1:])
s = dict(m["summary"])
assert s.pop("interrupted") is False and w["summary"]["interrupted"] is False
assert s == {k: w["summary"][k] for k in s} and len(s) == 4, (s, w["summary"])
assert [c["id"] for c in m["cases"]] == [c["id"] for c in w["cases"]]
assert [c["status"] for c in m["cases"]] == [c["status"] for c in w["cases"]]
assert "shard" not in m["context"] and [e["shard"] for e in m["context"]["merged"]] == ["1/3", "2/3", "3/3", "2/2"]
assert sum(e["cases"] for e in m["context"]["merged"]) == len(w["cases"]) > 3
PY
    then ok "... counts re-summed, every case once, in the order of one process"; else fail "... counts re-summed, every case once, in the order of one process"; fi
fi
# merge of a merged file: its own "merged" list goes into its entry (one "merged" key in the context)
"$kvbench" merge "$tmp/m12.json" "$tmp/shard1.json" "$tmp/shard2.json" >/dev/null 2>&1
expect "merge of a merged input" 0 'kvbench merge: [0-9]+ check cases from 2 files into' -- merge "$tmp/m123.json" "$tmp/m12.json" "$tmp/shard3.json"
if command -v python3 >/dev/null; then
    if python3 - "$tmp/m123.json" <<'PY'
import json, sys
def no_dup(pairs):
    keys = [k for k, _ in pairs]
    assert len(keys) == len(set(keys)), keys
    return dict(pairs)
m = json.load(open(sys.argv[1]), object_pairs_hook=no_dup)
e = m["context"]["merged"]
assert [x.get("shard") for x in e] == [None, "3/3"] and [x["shard"] for x in e[0]["merged"]] == ["1/3", "2/3"], e
PY
    then ok "... no duplicate key; the input's merge list kept in its entry"; else fail "... no duplicate key; the input's merge list kept in its entry"; fi
fi
cp "$tmp/shard1.json" "$tmp/shard1_copy.json"
expect "merge refuses a case in two inputs" 2 "case '.*' is in both $tmp/shard1.json and $tmp/shard1_copy.json" -- merge "$tmp/m2.json" "$tmp/shard1.json" "$tmp/shard1_copy.json"
expect "merge refuses a file given twice" 2 "$tmp/shard2.json is given twice" -- merge "$tmp/m2.json" "$tmp/shard2.json" "$tmp/shard2.json"
expect "merge refuses OUT over an input" 2 "OUT $tmp/shard1.json is the same file as the input $tmp/shard1.json" -- merge "$tmp/shard1.json" "$tmp/shard2.json" "$tmp/shard1.json"
if cmp -s "$tmp/shard1.json" "$tmp/shard1_copy.json"; then ok "... and the input is untouched"; else fail "... and the input is untouched"; fi
expect "merge refuses files of both kinds" 2 "$tmp/shard1.json is a check result file, $tmp/empty_b.json a bench one" -- merge "$tmp/m2.json" "$tmp/shard1.json" "$tmp/empty_b.json"
sed 's/"git_revision": "[^"]*"/"git_revision": "0000000"/' "$tmp/shard2.json" >"$tmp/shard2_rev.json"
expect "merge refuses different revisions" 2 "$tmp/shard2_rev.json revision 0000000: results of different revisions are not merged" -- merge "$tmp/m2.json" "$tmp/shard1.json" "$tmp/shard2_rev.json"
expect "merge refuses a missing file" 2 "$tmp/nope.json" -- merge "$tmp/m2.json" "$tmp/shard1.json" "$tmp/nope.json"
expect "merge refuses a file that is not a result" 2 "$tmp/peers.json: not a kvbench result file" -- merge "$tmp/m2.json" "$tmp/shard1.json" "$tmp/peers.json"
expect "merge --summary of check results refused" 2 'only bench results have a summary table' -- merge "$tmp/m2.json" "$tmp/shard1.json" --summary "$tmp/m2.md"
if [ ! -e "$tmp/m2.json" ]; then ok "... a refused merge writes nothing"; else fail "... a refused merge writes nothing"; fi
# merge: the canonical round's bench JSON split in two by the shards' listing, merged back, reads as the whole
round=$(cd "$(dirname "$kvbench")/../.." && pwd)/results/h200
if command -v python3 >/dev/null && [ -f "$round/bench.json" ] && [ -f "$root/harness/report/plot_report.py" ]; then
    mapfile -t ids < <(python3 -c 'import json,sys
for b in json.load(open(sys.argv[1]))["benchmarks"]: print(b["name"].split("/")[0])' "$round/bench.json")
    for k in 1 2; do "$kvbench" list --cases "$cases" --shard "$k/2" "${ids[@]}" 2>/dev/null | sed -E 's/^[a-z]+ +//' >"$tmp/ids$k"; done
    python3 - "$round/bench.json" "$tmp" <<'PY'
import json, re, sys
d = json.load(open(sys.argv[1]))
# a bench of this build writes each goal's words as "goal_text" (and "goal_us" of a goal against another
# impl); a round written before has them only in its summary: taken from there, so that the merged
# summary can be held to the original's goal cells
goals = {}
for line in open(sys.argv[1].replace("bench.json", "summary.md")):
    m = re.match(r"^\| `([^`]+)` \|.*\| [0-9.]+x of ([0-9.]+) us \((.*)\) \|$", line)
    if m and m.group(1) not in goals:
        goals[m.group(1)] = (float(m.group(2)), m.group(3))
for b in d["benchmarks"]:
    g = goals.get(b["name"].split("/")[0])
    if g and "goal_text" not in b:
        b["goal_text"] = g[1]
        b.setdefault("goal_us", g[0])
for k in (1, 2):
    ids = set(open("%s/ids%d" % (sys.argv[2], k)).read().split("\n")) - {""}
    part = [b for b in d["benchmarks"] if b["name"].split("/")[0] in ids]
    json.dump({"context": dict(d["context"], shard="%d/2" % k), "benchmarks": part}, open("%s/b%d.json" % (sys.argv[2], k), "w"), indent=1)
PY
    mkdir -p "$tmp/round"
    [ -f "$round/peers_excluded.json" ] && cp "$round/peers_excluded.json" "$tmp/round/" # peers the publisher moved out
    expect "merge bench shards with --summary" 0 "kvbench merge: ${#ids[@]} bench cases from 2 files" -- merge "$tmp/round/bench.json" "$tmp/b1.json" "$tmp/b2.json" --summary "$tmp/round/summary.md"
    expect "... compare ORIGINAL MERGED passes" 0 "compare: 0 slower, 0 faster, ${#ids[@]} same, .*: pass" -- compare "$round/bench.json" "$tmp/round/bench.json"
    if [ "$(grep -c '^| `' "$tmp/round/summary.md")" -eq "$(grep -c '^| `' "$round/summary.md")" ] && [ -s "$tmp/ids1" ] && [ -s "$tmp/ids2" ] &&
       python3 "$root/harness/report/plot_report.py" "$tmp/round/bench.json" "$tmp/plot" >/dev/null 2>&1 && [ -s "$tmp/plot/plot.dat" ] &&
       python3 "$root/harness/report/headline.py" "$tmp/round" >"$tmp/headline.txt" 2>&1 && ! grep -q 'not measured' "$tmp/headline.txt"; then
        ok "... its summary has every row; plot_report.py and headline.py read it"
    else fail "... its summary has every row; plot_report.py and headline.py read it"; fi
    goal_cells() { sed -nE 's/^\| `([^`]+)` \|.*\| ([0-9.]+x of [0-9.]+ us \(.*\)) \|$/\1 \2/p' "$1" | sort; }
    if [ "$(goal_cells "$tmp/round/summary.md" | grep -c ' us (')" -gt 0 ] &&
       diff <(goal_cells "$round/summary.md") <(goal_cells "$tmp/round/summary.md") >/dev/null; then
        ok "... its goal cells, with the goals' words, are the original's"
    else fail "... its goal cells, with the goals' words, are the original's"; fi
fi
# the canonical round's bench selection (headline.py --cases, what gpu_round.sh benches) is taken in one command
if command -v python3 >/dev/null && [ -f "$root/harness/report/headline.py" ] && [ -d "$root/results/h200" ]; then
    mapfile -t headline_sel < <(python3 "$root/harness/report/headline.py" --cases "$root/results/h200")
    expect "the round's headline selection (${#headline_sel[@]} filters) in one command" 0 "" -- list --cases "$cases" "${headline_sel[@]}"
fi
# profiles/detached.sh: a command in a session of its own, collected by later commands
if [ -f "$root/profiles/detached.sh" ]; then
    det="$root/profiles/detached.sh" d="$tmp/detached"
    bash "$det" start "$d" bash -c 'echo started; exit 5' >/dev/null
    out=$(bash "$det" wait "$d" 20)
    rc=$?
    if [ $rc -eq 0 ] && [ "$(cat "$d/rc")" = 5 ] && grep -q '^started$' <<<"$out"; then
        ok "detached.sh: the command's output and exit code collected"
    else fail "detached.sh: the command's output and exit code collected (wait exit $rc)"; fi
    bash "$det" start "$d" sleep 30 >/dev/null
    bash "$det" wait "$d" 1 >/dev/null
    rc=$?
    bash "$det" start "$d" true >/dev/null 2>&1
    rc2=$?
    bash "$det" stop "$d" >/dev/null
    if [ $rc -eq 3 ] && [ $rc2 -eq 2 ]; then ok "detached.sh: still running says so (exit 3); a second start is refused"
    else fail "detached.sh: still running says so (exit 3); a second start is refused (wait $rc, start $rc2)"; fi
fi
# the main job without a GPU, sharded or not: it says so first, runs the smoke tier's references and the
# reference self-tests, and exits 3 (nothing measured) without starting a shard
if [ "$ran" -eq 3 ] && [ -f "$root/harness/scripts/main_job.sh" ]; then
    GPUS=2 bash "$root/harness/scripts/main_job.sh" "$kvbench" "$tmp/run" >"$tmp/run.log" 2>&1
    rc=$?
    if [ $rc -eq 3 ] && head -n 1 "$tmp/run.log" | grep -q '^main job: no GPU here' &&
       grep -qE '^0 passed, 0 failed, [1-9][0-9]* skipped' "$tmp/run.log" && grep -q 'reference self-test programs' "$tmp/run.log" &&
       [ ! -d "$tmp/run/shards" ]; then
        ok "GPUS=2 main job without a GPU: says so first, the smoke references, exit 3"
    else fail "GPUS=2 main job without a GPU: says so first, the smoke references, exit 3 (exit $rc)"; sed 's/^/    /' "$tmp/run.log" | head -n 8; fi
    out=$(GPUS=0 bash "$root/harness/scripts/main_job.sh" "$kvbench" "$tmp/run0" 2>&1)
    rc=$?
    if [ $rc -eq 2 ] && grep -q 'GPUS=0: give a whole number in \[1, 64\]' <<<"$out"; then ok "main job GPUS=0 refused"
    else fail "main job GPUS=0 refused (exit $rc)"; fi
fi

# running PIDFILE: how many of the processes listed are still running (a zombie, killed but not yet reaped
# where no init reaps orphans, does not count)
running() {
    local n=0 p
    for p in $(cat "$1" 2>/dev/null); do
        [ -r "/proc/$p/stat" ] && [ "$(cut -d' ' -f3 "/proc/$p/stat" 2>/dev/null)" != Z ] && n=$((n + 1))
    done
    echo $n
}
# kernel_trace.py over a made-up trace: only the activities between the profiler marks, in start order; each
# stream's busy time (overlaps counted once) and its gaps; --match sums by name. trace.sh without its CUPTI
# library refuses, naming it.
if [ -f "$root/profiles/kernel_trace.py" ] && command -v python3 >/dev/null; then
    printf '%s\n' 'kernel,500,900,7,1,32,early_kernel(int)' 'profiler_start,1000' \
        'kernel,5000,9000,7,64,256,fetch_kernel(int)' 'kernel,2000,4000,7,8,128,select_kernel(int)' \
        'kernel,3000,6000,9,4,128,attn_kernel(float)' 'memset,9500,9600,7,4,0' 'kernel,10000,11000,9,4,128,late(int)' \
        'profiler_stop,9700' >"$tmp/trace.csv"
    python3 "$root/profiles/kernel_trace.py" "$tmp/trace.csv" --match fetch >"$tmp/trace.txt" 2>&1
    if grep -q '^window: 4 activities, 7.6 us' "$tmp/trace.txt" &&
       grep -q '^stream 7: 3 activities, busy 6.1 us, 0.0-7.6 us, 1 gaps >= 1 us summing 1.0 us' "$tmp/trace.txt" &&
       grep -q '^stream 9: 1 activities, busy 3.0 us' "$tmp/trace.txt" &&
       grep -q "^match 'fetch': 1 activities, summed 4.0 us" "$tmp/trace.txt" &&
       [ "$(sed -n 2p "$tmp/trace.txt" | awk '{print $NF}')" = select_kernel ] && ! grep -q 'early_kernel\|late' "$tmp/trace.txt"
    then ok "kernel_trace.py: the profiled window's timeline, busy time and gaps per stream"
    else fail "kernel_trace.py: the profiled window's timeline, busy time and gaps per stream"; sed 's/^/    /' "$tmp/trace.txt"; fi
    if KERNEL_TRACE_LIB="$tmp/none.so" bash "$root/profiles/trace.sh" "topk" "$tmp/t.csv" >"$tmp/trace_sh.txt" 2>&1; then
        fail "trace.sh: refuses without its CUPTI library"
    elif grep -q "trace.sh: no $tmp/none.so" "$tmp/trace_sh.txt"; then ok "trace.sh: refuses without its CUPTI library"
    else fail "trace.sh: refuses without its CUPTI library"; sed 's/^/    /' "$tmp/trace_sh.txt"; fi
fi
# sanitize.sh, with a stand-in compute-sanitizer (it logs its tool and tier and its pid, then sleeps): a tool
# killed by a signal ends its pass (memcheck starts no second tier behind it), and TERM to the script
# stops every pass under way, leaving no tool running
if [ -f "$root/profiles/sanitize.sh" ]; then
    mkdir -p "$tmp/fake"
    printf '%s\n' '#!/bin/bash' \
        'echo "$2 $(echo "$@" | grep -o -- "--tier [a-z]*")$(echo "$@" | grep -o -- " --kernel-name-exclude [^ ]*" | tr -d "\n")" >>"$FAKE_DIR/launches"' \
        'echo $$ >>"$FAKE_DIR/pids"' 'exec sleep 30' >"$tmp/fake/compute-sanitizer"
    chmod +x "$tmp/fake/compute-sanitizer"
    alive() { running "$tmp/fake/pids"; }
    : >"$tmp/fake/launches"; : >"$tmp/fake/pids"
    FAKE_DIR="$tmp/fake" PATH="$tmp/fake:$PATH" KVBENCH=/bin/true SANITIZE_PARALLEL=1 bash "$root/profiles/sanitize.sh" "$tmp/san" >"$tmp/san.txt" 2>&1 &
    sp=$!
    for _ in $(seq 300); do [ "$(wc -l <"$tmp/fake/pids")" -ge 4 ] && break; sleep 0.1; done
    kill -TERM $(cat "$tmp/fake/pids") 2>/dev/null
    wait $sp
    if [ "$(wc -l <"$tmp/fake/launches")" -eq 4 ] && ! grep -q 'memcheck --tier smoke' "$tmp/fake/launches" &&
       grep -q '^sanitize memcheck: exit 143' "$tmp/san.txt"; then ok "sanitize.sh: a killed tool ends its pass (no next tier)"
    else fail "sanitize.sh: a killed tool ends its pass (no next tier)"; sed 's/^/    /' "$tmp/fake/launches"; fi
    # racecheck alone leaves out cuBLAS's _cublas kernels by default
    if grep -qx 'racecheck --tier sanitize --kernel-name-exclude kns=_cublas' "$tmp/fake/launches" &&
       [ "$(grep -c -- '--kernel-name-exclude' "$tmp/fake/launches")" -eq 1 ]; then ok "sanitize.sh: racecheck leaves out cuBLAS's _cublas kernels"
    else fail "sanitize.sh: racecheck leaves out cuBLAS's _cublas kernels"; sed 's/^/    /' "$tmp/fake/launches"; fi
    : >"$tmp/fake/launches"; : >"$tmp/fake/pids"
    FAKE_DIR="$tmp/fake" PATH="$tmp/fake:$PATH" KVBENCH=/bin/true SANITIZE_PARALLEL=1 SANITIZE_RACECHECK_EXCLUDE="kns=_cublas kns=nvjet" \
        bash "$root/profiles/sanitize.sh" "$tmp/san" >"$tmp/san.txt" 2>&1 &
    sp=$!
    for _ in $(seq 300); do [ "$(wc -l <"$tmp/fake/pids")" -ge 4 ] && break; sleep 0.1; done
    kill -TERM $sp
    wait $sp
    rc=$?
    for _ in $(seq 20); do [ "$(alive)" -eq 0 ] && break; sleep 0.1; done
    if [ $rc -eq 143 ] && [ "$(alive)" -eq 0 ]; then ok "sanitize.sh: TERM stops every pass under way"
    else fail "sanitize.sh: TERM stops every pass under way (exit $rc, $(alive) tools left)"; kill $(cat "$tmp/fake/pids") 2>/dev/null; fi
    # SANITIZE_RACECHECK_EXCLUDE's filters, one option each (that launch's racecheck pass)
    if grep -qx 'racecheck --tier sanitize --kernel-name-exclude kns=_cublas --kernel-name-exclude kns=nvjet' "$tmp/fake/launches"
    then ok "sanitize.sh: SANITIZE_RACECHECK_EXCLUDE's filters, one option each"
    else fail "sanitize.sh: SANITIZE_RACECHECK_EXCLUDE's filters, one option each"; sed 's/^/    /' "$tmp/fake/launches"; fi
    # TERM to the script and to each pass's subshell at once (what `pkill -f sanitize.sh` sends): each
    # pass still stops its tool, none is left running on the GPU
    : >"$tmp/fake/launches"; : >"$tmp/fake/pids"
    FAKE_DIR="$tmp/fake" PATH="$tmp/fake:$PATH" KVBENCH=/bin/true SANITIZE_PARALLEL=1 bash "$root/profiles/sanitize.sh" "$tmp/san_all" >"$tmp/san.txt" 2>&1 &
    sp=$!
    for _ in $(seq 300); do [ "$(wc -l <"$tmp/fake/pids")" -ge 4 ] && break; sleep 0.1; done
    kill -TERM $(pgrep -f "profiles/sanitize.sh $tmp/san_all") 2>/dev/null
    wait $sp
    for _ in $(seq 20); do [ "$(alive)" -eq 0 ] && break; sleep 0.1; done
    if [ "$(alive)" -eq 0 ]; then ok "sanitize.sh: TERM to every one of its processes leaves no tool running"
    else fail "sanitize.sh: TERM to every one of its processes leaves no tool running ($(alive) tools left)"; kill $(cat "$tmp/fake/pids") 2>/dev/null; fi
fi

# gpu_round.sh from a stand-in bundle (its kvbench and sanitize.sh log their pids and sleep): the phases
# run one after the other (the sanitize phase has not started while the check runs), and TERM during the
# check ends the round with 143, says so in round.log, and leaves nothing running
if [ -f "$root/harness/scripts/gpu_round.sh" ]; then
    mkdir -p "$tmp/fb/bin" "$tmp/fb/cases"
    cp "$root/harness/scripts/gpu_round.sh" "$tmp/fb/"
    printf '%s\n' '#!/bin/bash' '[ "$1" = --version ] && { echo "kvbench stand-in"; exit 0; }' \
        "echo \$\$ >>'$tmp/fb/pids'" 'exec sleep 30' >"$tmp/fb/bin/kvbench"
    printf '%s\n' '#!/bin/bash' "echo \$\$ >>'$tmp/fb/pids'" 'exec sleep 30' >"$tmp/fb/sanitize.sh"
    chmod +x "$tmp/fb/bin/kvbench"
    : >"$tmp/fb/pids"
    TESTS=0 PEERS=0 BENCH=0 bash "$tmp/fb/gpu_round.sh" "$tmp/fbout" >/dev/null 2>&1 &
    rp=$!
    for _ in $(seq 300); do [ -s "$tmp/fb/pids" ] && break; sleep 0.1; done
    sleep 1 # time for a sanitize phase to start, were it to run beside the check
    running_now=$(grep -c . "$tmp/fb/pids")
    kill -TERM $rp
    wait $rp
    rc=$?
    fb_alive() { running "$tmp/fb/pids"; }
    for _ in $(seq 20); do [ "$(fb_alive)" -eq 0 ] && break; sleep 0.1; done
    if [ $rc -eq 143 ] && [ "$running_now" -eq 1 ] && [ "$(fb_alive)" -eq 0 ] && grep -q 'round: stopped by a signal' "$tmp/fbout/round.log" &&
        ! grep -q 'sanitize: start' "$tmp/fbout/round.log"; then
        ok "gpu_round.sh: one phase at a time; TERM stops the check under way and ends the round"
    else fail "gpu_round.sh: one phase at a time; TERM stops the check under way and ends the round (exit $rc, processes at once: $running_now, stand-ins left: $(fb_alive))"
        kill $(cat "$tmp/fb/pids") 2>/dev/null; fi
fi

# gpu_round.sh lists the compute processes already on the GPU before each phase (a stand-in nvidia-smi):
# a listed process is logged for the phase, nvidia-smi's messages are not processes
if [ -f "$root/harness/scripts/gpu_round.sh" ]; then
    mkdir -p "$tmp/gp/bin" "$tmp/gp/smi_busy" "$tmp/gp/smi_idle"
    cp "$root/harness/scripts/gpu_round.sh" "$tmp/gp/"
    printf '%s\n' '#!/bin/bash' 'echo "kvbench stand-in"' >"$tmp/gp/bin/kvbench"
    printf '%s\n' '#!/bin/bash' 'case "$*" in *query-compute-apps*) echo "4242, /usr/bin/python3, 1000 MiB";' \
        '  echo "[Not Supported]";; *) echo "stand-in GPU";; esac' >"$tmp/gp/smi_busy/nvidia-smi"
    printf '%s\n' '#!/bin/bash' 'case "$*" in *query-compute-apps*) echo "No running processes found";;' \
        '  *) echo "stand-in GPU";; esac' >"$tmp/gp/smi_idle/nvidia-smi"
    chmod +x "$tmp/gp/bin/kvbench" "$tmp/gp/smi_busy/nvidia-smi" "$tmp/gp/smi_idle/nvidia-smi"
    PATH="$tmp/gp/smi_busy:$PATH" TESTS=0 CHECK=0 SANITIZE=0 PEERS=0 BENCH=0 bash "$tmp/gp/gpu_round.sh" "$tmp/gpbusy" >/dev/null 2>&1
    PATH="$tmp/gp/smi_idle:$PATH" TESTS=0 CHECK=0 SANITIZE=0 PEERS=0 BENCH=0 bash "$tmp/gp/gpu_round.sh" "$tmp/gpidle" >/dev/null 2>&1
    if grep -q '^\[[^]]*\] device: other compute processes on the GPU: 4242, /usr/bin/python3, 1000 MiB$' "$tmp/gpbusy/round.log" &&
        ! grep -q 'other compute processes' "$tmp/gpidle/round.log"; then
        ok "gpu_round.sh: a compute process already on the GPU is logged before the phase, a message is not"
    else fail "gpu_round.sh: a compute process already on the GPU is logged before the phase, a message is not"; fi
    # the main job says so first too (a stand-in kvbench that finds no GPU: the quick path)
    mkdir -p "$tmp/gp/nogpu"
    printf '%s\n' '#!/bin/bash' 'echo "kvbench: no CUDA device"; exit 3' >"$tmp/gp/nogpu/kvbench"
    chmod +x "$tmp/gp/nogpu/kvbench"
    out=$(PATH="$tmp/gp/smi_busy:$PATH" bash "$root/harness/scripts/main_job.sh" "$tmp/gp/nogpu/kvbench" "$tmp/gpjob" 2>&1)
    if head -n 1 <<<"$out" | grep -q '^main job: other compute processes on the GPU: 4242, /usr/bin/python3, 1000 MiB; the times below may be shared'; then
        ok "main job: a compute process already on the GPU is said first"
    else fail "main job: a compute process already on the GPU is said first"; head -n 3 <<<"$out" | sed 's/^/    /'; fi
fi

if ! ls -A "$tmp" | grep -q '\.tmp\.'; then ok "no temporary files left"; else fail "no temporary files left"; fi

echo "cli: $passed passed, $failed failed"
