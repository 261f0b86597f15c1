// probe_check.h: the standalone probes' one error check (profiles/*_probe.cu, host_link_contention.cu): a
// failed CUDA runtime call names itself and its error, and the probe exits 1.
#pragma once
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(x)                                                                                               \
    do {                                                                                                       \
        cudaError_t e_ = (x);                                                                                  \
        if (e_ != cudaSuccess) {                                                                               \
            fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));                                           \
            exit(1);                                                                                           \
        }                                                                                                      \
    } while (0)
