# one call: the racecheck and initcheck findings of the third sweep, narrowed
K=$1 O=$2
L1="shadowkv_lowrank S=17720 Hkv=8 D=128 r=3 dist=rankdef seed=423 impl=kernel"
L2="shadowkv_prefill S=16252 Hkv=8 D=104 r=160 c=2 local_chunks=0 outlier_chunks=16 dist=normal seed=550 impl=kernel"
L3="shadowkv_lowrank S=17720 Hkv=8 D=128 r=3 dist=rankdef seed=423 impl=syevdx"
L4="block_linear B=1 in=3304 out=8 accumulate=1 seed=599 impl=kernel"
CS="compute-sanitizer --error-exitcode 99 --print-limit 30"
run() { local name=$1; shift; timeout 200 "$@" > "$O/$name.log" 2>&1; echo "$name rc=$? $(grep -E '^[0-9]+ passed|SUMMARY|Internal' "$O/$name.log" | tr '\n' ' ')"; }
run plain $K check "$L1" "$L2" "$L3" "$L4" &
run mc_l1 $CS --tool memcheck $K check "$L1" &
run mc_l2 $CS --tool memcheck $K check "$L2" &
run rc_l1_blocking env CUDA_LAUNCH_BLOCKING=1 $CS --tool racecheck --kernel-name-exclude kns=_cublas $K check "$L1" &
run rc_l3 $CS --tool racecheck --kernel-name-exclude kns=_cublas $K check "$L3" &
run rc_l1_all $CS --tool racecheck $K check "$L1" &
run ic_l4_mc $CS --tool memcheck $K check "$L4" &
wait
