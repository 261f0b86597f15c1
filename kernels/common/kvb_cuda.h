// kvb_cuda.h: what every kernels/*.cu shares: turn a failed CUDA or cuBLAS call into a kvb_fail
// status (KVB_EDEVICE) that names the call, the error and the place, returned to the C caller.
#ifndef KVB_KERNELS_CUDA_H
#define KVB_KERNELS_CUDA_H

#include <cuda_runtime_api.h>

#include "reference/kvb.h"

#define CUDA_TRY(call)                                                                             \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            return kvb_fail(KVB_EDEVICE, "%s failed: %s (%s:%d)", #call, cudaGetErrorString(e_),   \
                            __FILE__, __LINE__);                                                   \
    } while (0)

#define CUBLAS_TRY(call)                                                                           \
    do {                                                                                           \
        int s_ = (int)(call);                                                                      \
        if (s_ != 0)                                                                               \
            return kvb_fail(KVB_EDEVICE, "%s failed: cuBLAS status %d (%s:%d)", #call, s_,         \
                            __FILE__, __LINE__);                                                   \
    } while (0)

#endif
