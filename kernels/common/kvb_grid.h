// kvb_grid.h: the grid-dimension limits of a launch, for the host code of kernels/*/*.cu (C++).
//
// CUDA allows grid.x up to 2^31 - 1 blocks, grid.y and grid.z up to 65535. Counts taken from shapes
// (B * Hkv heads, B * Hq rows) pass 65535 well inside the ranges the cases allow (B <= 1024, Hkv <= 256),
// so no such count goes to grid.y or grid.z directly: a launch either runs it in chunks of at most
// 65535 (kvb_grid_chunks; the kernel adds the chunk's first index to blockIdx.y), or puts it in grid.x
// through kvb_grid_x, which refuses, before anything is launched, a count that would pass 2^31 - 1
// blocks, naming it and its range. (No silent no-ops: a launch with a grid past the limits fails, or
// worse, a truncated count launches part of the work.)
#ifndef KVB_KERNELS_GRID_H
#define KVB_KERNELS_GRID_H
#ifndef __cplusplus
#error "kvb_grid.h is C++ (the host code of kernels/*/*.cu)"
#endif

#include <cstdint>

#include <cuda_runtime_api.h>

#include "reference/kvb.h"

// The current device's SM count, read once per device: the plans size their grids by it (one wave,
// splits that fill the SMs). 0 when it cannot be read (no device, a sticky error): a caller that must
// have it fails with KVB_EDEVICE; one that only shapes a plan takes the plan for a small GPU, and its
// launch then reports the device's error.
inline int kvb_sm_count()
{
    static int cached[64] = {};
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 0;
    if (!cached[dev] && cudaDeviceGetAttribute(&cached[dev], cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
        cached[dev] = 0;
    return cached[dev];
}

// The device's L2 in bytes (0 if it cannot be read), cached per device.
inline int kvb_l2_bytes()
{
    static int cached[64] = {};
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 0;
    if (!cached[dev] && cudaDeviceGetAttribute(&cached[dev], cudaDevAttrL2CacheSize, dev) != cudaSuccess) cached[dev] = 0;
    return cached[dev];
}

constexpr int64_t KVB_GRID_X_MAX = 2147483647;  // grid.x
constexpr int64_t KVB_GRID_YZ_MAX = 65535;      // grid.y, grid.z

// grid.x for `items` work items, `per_block` of them per block. KVB_EINVAL when that needs more than
// 2^31 - 1 blocks: "<who>: <what> = <items> out of range [1, <max>]".
inline int kvb_grid_x(const char *who, const char *what, int64_t items, int64_t per_block, unsigned *x)
{
    const int64_t max_items = KVB_GRID_X_MAX * per_block;
    if (items < 1 || items > max_items)
        return kvb_fail(KVB_EINVAL, "%s: %s = %lld out of range [1, %lld] (grid.x: at most 2^31 - 1 blocks of %lld)", who,
                        what, (long long)items, (long long)max_items, (long long)per_block);
    *x = (unsigned)((items + per_block - 1) / per_block);
    return KVB_OK;
}

// Calls launch(first, count) for consecutive chunks [first, first + count) of [0, n), count <= 65535,
// in order: one call when n <= 65535. For a count that goes to grid.y or grid.z. Returns the first
// non-zero status of a call (KVB_OK when n <= 0).
template <typename F>
int kvb_grid_chunks(int64_t n, F &&launch)
{
    for (int64_t first = 0; first < n; first += KVB_GRID_YZ_MAX) {
        const int64_t left = n - first;
        const int rc = launch(first, (unsigned)(left < KVB_GRID_YZ_MAX ? left : KVB_GRID_YZ_MAX));
        if (rc) return rc;
    }
    return KVB_OK;
}

#endif
