#!/usr/bin/env bash
# gate.sh BASELINE.json OUT [FILTER...]: the regression gate for a GPU runner. Three steps, and any of
# them fails the gate (exit 1):
#   1. check: `kvbench check` over the check tier (CHECK_FILTER, default FILTER): any failed case;
#   2. bench: `kvbench bench` over the bench tier (FILTER) into OUT/bench.json: a case that fails its
#      validation before or after timing, or no GPU (nothing timed);
#   3. compare: `kvbench compare BASELINE.json OUT/bench.json`: a case slower beyond THRESHOLD percent
#      (default 5) and 3 standard errors of the medians, a case missing or failed. With a FILTER the
#      baseline may hold more cases than were run: those are left out (--subset).
# BASELINE.json: a bench JSON of the same bench cases on the same GPU model (commit one per runner:
# `gate.sh none OUT FILTER...` runs steps 1 and 2 and leaves OUT/bench.json). Env: KVBENCH (the binary; default bin/kvbench beside this
# script in a bundle, else build/bin/kvbench), KVB_CASES (default: the cases/ beside it), PEERS (a peers
# JSON for bench), THRESHOLD. Writes OUT/{check,bench,compare}.{log,json} and OUT/summary.md.
set -u
base=${1:?usage: gate.sh BASELINE.json OUT [FILTER...]}
out=${2:?usage: gate.sh BASELINE.json OUT [FILTER...]}
shift 2
here=$(cd "$(dirname "$0")" && pwd)
kv=${KVBENCH:-}
for c in "$here/bin/kvbench" "$here/../../build/bin/kvbench"; do
    [ -z "$kv" ] && [ -x "$c" ] && kv=$c
done
[ -n "$kv" ] || { echo "gate: no kvbench binary (set KVBENCH)"; exit 2; }
cases=${KVB_CASES:-}
for c in "$here/cases" "$here/../../cases"; do
    [ -z "$cases" ] && [ -d "$c" ] && cases=$c
done
[ "$base" = none ] || [ -r "$base" ] || { echo "gate: baseline $base not readable (or none: make one)"; exit 2; }
mkdir -p "$out"
fail() { echo "gate: FAIL at $1"; exit 1; }

read -r -a check_filter <<<"${CHECK_FILTER:-}"
[ ${#check_filter[@]} -gt 0 ] || check_filter=("$@")
echo "== gate 1/3: check ${check_filter[*]:-(every check case)}"
"$kv" check --cases "$cases" --json "$out/check.json" "${check_filter[@]}" >"$out/check.log" 2>&1
rc=$?
grep -E '^[0-9]+ passed, [0-9]+ failed' "$out/check.log" | tail -n 1
grep -E '^FAIL ' "$out/check.log" | head -n 20
[ $rc -eq 0 ] || fail "check (exit $rc; $out/check.log)"
grep -qE '^0 passed, 0 failed' "$out/check.log" && fail "check (nothing ran: no GPU?)"

echo "== gate 2/3: bench $*"
"$kv" bench --cases "$cases" --json "$out/bench.json" --summary "$out/summary.md" ${PEERS:+--peers "$PEERS"} "$@" \
    >"$out/bench.log" 2>&1
rc=$?
tail -n 1 "$out/bench.log"
[ $rc -eq 0 ] || fail "bench (exit $rc; $out/bench.log)"
[ -s "$out/bench.json" ] || fail "bench (no bench.json: nothing was timed; is there a GPU?)"

if [ "$base" = none ]; then
    echo "gate: pass, with no baseline to compare: $out/bench.json can be committed as one"
    exit 0
fi
echo "== gate 3/3: compare $base $out/bench.json"
subset=()
[ $# -gt 0 ] && subset=(--subset)
"$kv" compare "$base" "$out/bench.json" --threshold "${THRESHOLD:-5}" --json "$out/compare.json" "${subset[@]}" \
    >"$out/compare.log" 2>&1
rc=$?
cat "$out/compare.log"
[ $rc -eq 0 ] || fail "compare (exit $rc)"
echo "gate: pass"
