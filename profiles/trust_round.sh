#!/usr/bin/env bash
# trust_round.sh OUT [PHASE...]: the GPU side of the trust issue, from a bundle (copied beside bin/ by
# make bundle). Phases (default: all, in this order; the timed one first, on a quiet GPU):
#   gate         gate.sh against GATE_BASELINE (a bench JSON of the same GPU model, e.g. the canonical
#                results/h200/bench.json copied to the GPU machine) for decode_attn B=8 L=8K and 32K;
#                skipped, and said so, without GATE_BASELINE
#   sanitize     sanitize.sh: memcheck, racecheck, initcheck, synccheck over the sanitize tier (the four
#                tools run side by side: correctness only, nothing is timed)
#   edge         kvbench check over cases/edge.cases
#   determinism  kvbench check --determinism over the check tier, one family per JSON (DET_DEADLINE seconds
#                from the start of this phase, default 300: families not reached are listed as such)
#                (NCU_DEADLINE, default 300, for the ncu phase)
#   ncu          profiles/ncu.sh's recipe, reduced to the SpeedOfLight, Occupancy and LaunchStats
#                sections, on one bench case of every family (a check case for decode_step), text logs
# Writes OUT/<phase>/... and OUT/round.log.
set -u
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: trust_round.sh OUT [gate|sanitize|edge|determinism|ncu...]}
shift
phases=("$@")
[ ${#phases[@]} -gt 0 ] || phases=(gate sanitize edge determinism ncu)
kv=$here/bin/kvbench
[ -x "$kv" ] || kv=$here/../build/bin/kvbench
cases=${KVB_CASES:-$here/cases}
export KVB_CASES=$cases KVBENCH=$kv
command -v ncu >/dev/null || PATH=$PATH:/usr/local/cuda/bin
mkdir -p "$out"
log() { echo "[$(date +%T)] $*" | tee -a "$out/round.log"; }

# kvbench list prints "<ceiling> <case id>"
ids() { "$kv" list --tier "$1" --cases "$cases" "${@:2}" | sed 's/^[^ ]* *//'; }
families() { ids "$1" | awk '{print $1}' | sort -u; }

for phase in "${phases[@]}"; do
    t0=$(date +%s)
    case $phase in
    gate)
        base=${GATE_BASELINE:-}
        if [ -z "$base" ]; then log "gate: skipped (no GATE_BASELINE)"; continue; fi
        ids=("decode_attn B=8 Hq=32 Hkv=8 D=128 L=8192 len=0 vary=0 dist=normal seed=1 impl=kernel"
             "decode_attn B=8 Hq=32 Hkv=8 D=128 L=32768 len=0 vary=0 dist=normal seed=1 impl=kernel")
        CHECK_FILTER=decode_attn bash "$here/gate.sh" "$base" "$out/gate" "${ids[@]}" >"$out/gate.txt" 2>&1
        log "gate: exit $? ($(tail -n 1 "$out/gate.txt"))"
        ;;
    sanitize)
        SANITIZE_PARALLEL=1 SANITIZE_TOOLS=${SANITIZE_TOOLS:-} bash "$here/sanitize.sh" "$out/sanitize" >"$out/sanitize.txt" 2>&1
        log "sanitize: exit $?"
        cat "$out/sanitize.txt" | tee -a "$out/round.log"
        ;;
    edge)
        "$kv" check --cases "$cases/edge.cases" --json "$out/edge.json" >"$out/edge.log" 2>&1
        log "edge: exit $? ($(grep -E '^[0-9]+ passed' "$out/edge.log" | tail -n 1))"
        ;;
    determinism)
        mkdir -p "$out/determinism"
        deadline=$((t0 + ${DET_DEADLINE:-300}))
        for f in $(families check); do
            if [ "$(date +%s)" -ge "$deadline" ]; then log "determinism $f: not reached (deadline)"; continue; fi
            left=$((deadline - $(date +%s) + 60))
            timeout $left "$kv" check --determinism --tier check --cases "$cases" --json "$out/determinism/$f.json" "$f" \
                >"$out/determinism/$f.log" 2>&1
            log "determinism $f: exit $? ($(grep -E '^[0-9]+ passed' "$out/determinism/$f.log" | tail -n 1))"
        done
        ;;
    ncu)
        mkdir -p "$out/ncu"
        for f in $(families bench); do
            tier=bench
            [ "$f" = decode_step ] && tier=check # bench steps take minutes to set up
            id=$(ids $tier "$f" | awk -v f="$f" '$1 == f' | head -n 1)
            if [ "$(date +%s)" -ge $((t0 + ${NCU_DEADLINE:-300})) ]; then log "ncu $f: not reached (deadline)"; continue; fi
            timeout 90 ncu --clock-control none --profile-from-start off \
                --section SpeedOfLight --section Occupancy --section LaunchStats \
                "$kv" profile "$id" >"$out/ncu/$f.txt" 2>&1
            log "ncu $f: exit $? ($id)"
        done
        ;;
    *) log "unknown phase $phase" ;;
    esac
    log "$phase: $(( $(date +%s) - t0 )) s"
done
