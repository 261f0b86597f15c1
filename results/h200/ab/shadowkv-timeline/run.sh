#!/usr/bin/env bash
# On one H200 (kvbench 175b2a9 bundle), one launch of each step under the CUPTI tracer (profiles/kernel_trace.c,
# loaded by the driver), then profiles/kernel_trace.py over each trace here (the *.txt files):
for c in "decode_step method=shadowkv model=llama3-8b B=48 ctx=61440 budget=1024" \
         "decode_step method=shadowkv model=llama3-8b B=12 ctx=249856 budget=4096" \
         "decode_step method=dense model=llama3-8b B=16 ctx=61440"; do
  n=$(echo "$c" | tr -c 'a-zA-Z0-9\n' '_' | cut -c1-80)
  CUDA_INJECTION64_PATH=$PWD/kernel_trace.so KERNEL_TRACE_OUT=$OUT/tr/$n.csv bin/kvbench profile "$c"
done
# python3 profiles/kernel_trace.py b48_60k.csv.gz --match gather_misses --match landmark_logits --match decode_attn > b48_60k.txt
# (profiles/trace.sh does both steps: bash trace.sh "CASE-ID" OUT.csv)
