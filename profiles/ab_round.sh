#!/usr/bin/env bash
# ab_round.sh OUT OTHER_BUNDLE [FILTER...]: the same bench cases timed by two builds in one call on one
# machine: this bundle (A, the script's own directory) and another bundle (B, e.g. main against a branch),
# back to back and repeated A B A B ... (AB_REPEATS rounds, default 2, so that drift shows), one JSON per
# run; then `kvbench compare` of each round's A against its B (the gate's rule: a change counts beyond
# AB_THRESHOLD percent, default 5, and 3 standard errors of the medians). Cases: this bundle's case files
# (KVB_CASES) at the bench tier, narrowed by the FILTERs as `kvbench bench` takes them; B must know them.
#   OTHER_BUNDLE may be a whole bundle (make bundle) or a variant (make bundle-variant: bin/, cases/ and
#   lib/libkvbench.so alone), which is laid over a copy of A's (symbolic links to A's libraries).
#   AB_OWN_CASES=1: each side runs its own bundle's cases (a branch's new cases or impls show as "new").
#   AB_CHECK=1: first B's `kvbench check` over the same FILTERs (its own cases), OUT/b_check.json and .log.
#   -> OUT/a_<r>.json, OUT/b_<r>.json, their logs, OUT/compare_<r>.txt; exit 0 unless a run failed.
set -u
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: ab_round.sh OUT OTHER_BUNDLE [FILTER...]}
other=${2:?usage: ab_round.sh OUT OTHER_BUNDLE [FILTER...]}
shift 2
mkdir -p "$out"
other=$(cd "$other" && pwd)
if [ -d "$other/lib" ] && [ -z "$(ls "$other/lib" | grep -v '^libkvbench\.so$')" ]; then
    # a variant: A's bundle as links, B's files over them
    rm -rf "$out/b_bundle"
    cp -rs "$here/." "$out/b_bundle"
    cp -r --remove-destination "$other/." "$out/b_bundle/"
    other=$out/b_bundle
fi
a=$here/bin/kvbench
b=$other/bin/kvbench
for kv in "$a" "$b"; do
    [ -x "$kv" ] || { echo "ab_round: $kv is not an executable kvbench (make bundle)"; exit 2; }
done
echo "A: $("$a" --version)  B: $("$b" --version)"
cases_a=${KVB_CASES:-$here/cases}
cases_b=$cases_a
[ "${AB_OWN_CASES:-0}" = 1 ] && cases_b=$other/cases
rc=0
if [ "${AB_CHECK:-0}" = 1 ]; then
    "$b" check --cases "$other/cases" "$@" --json "$out/b_check.json" >"$out/b_check.log" 2>&1
    s=$?
    [ $s -eq 0 ] || rc=1
    echo "check B: exit $s ($(grep -E '^[0-9]+ passed' "$out/b_check.log" | tail -n 1))"
fi
for r in $(seq 1 "${AB_REPEATS:-2}"); do
    for side in a b; do
        kv=$a cases=$cases_a
        [ $side = b ] && kv=$b cases=$cases_b
        "$kv" bench --cases "$cases" "$@" --json "$out/${side}_$r.json" >"$out/${side}_$r.log" 2>&1
        s=$?
        [ $s -eq 0 ] || rc=1
        echo "ab $r $side: exit $s ($(tail -n 1 "$out/${side}_$r.log"))"
    done
    "$a" compare "$out/a_$r.json" "$out/b_$r.json" --threshold "${AB_THRESHOLD:-5}" >"$out/compare_$r.txt" 2>&1
    echo "compare $r (B against A): exit $? ($(tail -n 1 "$out/compare_$r.txt"))"
done
exit $rc
