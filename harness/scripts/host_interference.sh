#!/usr/bin/env bash
# Host interference on two GPUs of one host: the cases that read pinned host memory (gather_copy,
# gather_copy_all, gather_step) timed alone on each GPU, then on both at once with no lock, then on both
# at once under one --timing-lock (the main job's way: a case that reads host memory is timed while no
# other process times anything). Each run's JSON is under OUT; OUT/compare_<how><gpu>.txt is `kvbench
# compare` of the GPU's alone run against that run.
# Usage: bash host_interference.sh KVBENCH OUT [GPU_A GPU_B]   (default GPUs 0 1)
# HOST_MEM_LIMIT_GB=G passes --host-mem-limit G (a VM whose free memory grows as it is used).
set -u
if [ $# -lt 2 ]; then echo "usage: host_interference.sh KVBENCH OUT [GPU_A GPU_B]" >&2; exit 2; fi
kv=$1 out=$2 gpu=("${3:-0}" "${4:-1}")
families=(gather_copy gather_copy_all gather_step)
extra=(); [ -n "${HOST_MEM_LIMIT_GB:-}" ] && extra=(--host-mem-limit "$HOST_MEM_LIMIT_GB")
mkdir -p "$out" || exit 2
rm -f "$out/lock"
run() { # run HOW INDEX [bench options]: one process on GPU gpu[INDEX]
    local how=$1 i=$2; shift 2
    CUDA_VISIBLE_DEVICES=${gpu[$i]} "$kv" bench "${families[@]}" "${extra[@]}" "$@" \
        --json "$out/$how$i.json" > "$out/$how$i.log" 2>&1
}
rc=0
run alone 0; r=$?
if [ $r -eq 3 ] || [ $r -eq 2 ]; then echo "host_interference: $(tail -n1 "$out/alone0.log")" >&2; exit $r; fi
[ $r -eq 0 ] || rc=1
run alone 1 || rc=1
run together 0 & run together 1 & wait -n || rc=1; wait -n || rc=1
run locked 0 --timing-lock "$out/lock" & run locked 1 --timing-lock "$out/lock" & wait -n || rc=1; wait -n || rc=1
for i in 0 1; do
    for how in together locked; do
        "$kv" compare "$out/alone$i.json" "$out/$how$i.json" > "$out/compare_$how$i.txt" 2>&1
        echo "GPU ${gpu[$i]}, $how against alone: $(tail -n1 "$out/compare_$how$i.txt")"
    done
done
exit $rc
