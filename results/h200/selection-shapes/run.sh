#!/usr/bin/env bash
# every bench shape of the selection path and the INT2 quantizer, with torch.topk, on the canonical
# round's bench build; results under $OUT/r
set -u
export PATH=$PATH:/usr/local/cuda/bin
B=/tmp/sel; rm -rf $B; mkdir -p $B && tar xJf .device/main.txz -C $B bundle && cd $B
bundle/bin/kvbench --version
TESTS=0 CHECK=0 SANITIZE=0 PEERS_ONLY=topk timeout 280 bundle/gpu_round.sh $OUT/r topk sparse_attn_idx sparse_attn_pages hybrid_score quest_score rocketkv_decode int2_quantize > $OUT/r.out 2>&1
echo "round: $?"; tail -5 $OUT/r.out; tail -2 $OUT/r/bench.log
rm -f $OUT/r/.check*; tar cf $OUT/sel.tar -C $OUT r && rm -rf $OUT/r; ls -la $OUT
