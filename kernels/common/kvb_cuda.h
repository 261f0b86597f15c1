// kvb_cuda.h: what every kernels/*/*.cu shares: turn a failed CUDA or cuBLAS call into a kvb_fail
// status (KVB_EDEVICE) that names the call, the error and the place, returned to the C caller; refuse
// a tensor whose base is not aligned for the kernel's 16-byte accesses.
#ifndef KVB_KERNELS_CUDA_H
#define KVB_KERNELS_CUDA_H

#include <stdint.h>

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

// A tensor read or written 16 bytes at a time (vector loads, cp.async, TMA) must start 16-byte aligned:
// refused before anything is launched, naming the operation and the tensor.
static inline int kvb_check_aligned16(const char *who, const char *what, const void *p)
{
    if ((uintptr_t)p % 16)
        return kvb_fail(KVB_EINVAL, "%s: %s=%p is not 16-byte aligned (rows are read 16 bytes at a time)", who, what, p);
    return KVB_OK;
}

// Opts `kernel` in to `bytes` of dynamic shared memory (past the default 48 KB a block). The attribute
// belongs to a kernel on one device: `done`, the caller's static, keeps a bit per device where it is
// set, so a process that launches on several GPUs sets it on each, once (devices past 63: every call).
static inline int kvb_smem_optin(const void *kernel, int bytes, unsigned long long *done)
{
    int dev = 0;
    CUDA_TRY(cudaGetDevice(&dev));
    const unsigned long long bit = dev >= 0 && dev < 64 ? 1ull << dev : 0;
    if (bit && (*done & bit)) return KVB_OK;
    CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    *done |= bit;
    return KVB_OK;
}

#endif
