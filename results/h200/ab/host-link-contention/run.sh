#!/usr/bin/env bash
# on the GPU machine, in the call of the seed-19 sweep (results/h200/sweep/seed19/run.sh); the probe built here:
#   nvcc -O3 -arch=sm_90a -o hlc profiles/host_link_contention.cu
timeout 120 ./hlc > $OUT/host_link_contention.txt 2>&1
