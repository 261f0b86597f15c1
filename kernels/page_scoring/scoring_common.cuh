// scoring_common.cuh: what hybrid scoring (page_scoring.cu) and Quest scoring (quest_score.cu) share:
// the block size, a block's run of tiles, and on the host the block plan, the occupancy query (which also
// opts a kernel in to its ring's shared memory), the narrow-tile rule and the workspace check. Both
// kernels' blocks take contiguous runs of tiles of one head, as many blocks as fill the GPU once
// (occupancy x SMs), so that the per-block prologue (hybrid: the channel choice) is paid once per block
// and the blocks end together.
#pragma once

#include <cstdint>

#include "kernels/common/kvb_cuda.h"
#include "kernels/common/kvb_device.cuh"
#include "kernels/common/kvb_grid.h"

namespace {

using namespace kvb_dev;

constexpr int THREADS = 256, WARPS = THREADS / 32;

__host__ __device__ constexpr int tiles_of(int n_pages, int tile) { return (n_pages + tile - 1) / tile; }

// The tiles of one block: [first, first + count) of its head's tiles.
struct TileRun {
    int first, count;
};

__device__ __forceinline__ TileRun tile_run(int per_block, int n_tiles)
{
    const int first = blockIdx.x * per_block;
    const int last = min(first + per_block, n_tiles);
    return {first, last - first};
}

// ---- host side ----

// Blocks per head: as many as fill the GPU once (resident blocks / heads), at most one per tile; the
// tiles of a head are split evenly, and no block is left without a tile.
inline void plan_blocks(int resident, int64_t heads, int tiles, int *per_block, int *blocks)
{
    int64_t want = resident / heads;
    if (want < 1) want = 1;
    if (want > tiles) want = tiles;
    *per_block = (int)((tiles + want - 1) / want);
    *blocks = (tiles + *per_block - 1) / *per_block;
}

// The blocks of `kernel` resident at once on the current device (per SM x SMs), asked once a device
// (`known`, the caller's static; past device 63 at every call); asking opts in its ring's memory.
template <typename K>
inline int resident_blocks(K kernel, size_t dyn_smem, int (&known)[64], int *out)
{
    int dev = 0, per_sm = 0;
    CUDA_TRY(cudaGetDevice(&dev));
    int *slot = dev >= 0 && dev < 64 ? &known[dev] : nullptr;
    if (slot && *slot) return *out = *slot, KVB_OK;
    CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dyn_smem));
    CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, THREADS, dyn_smem));
    if (per_sm < 1) return kvb_fail(KVB_EDEVICE, "page_scoring: a scoring kernel does not fit on an SM (%zu bytes of dynamic shared memory)", dyn_smem);
    const int sms = kvb_sm_count();
    if (!sms) return kvb_fail(KVB_EDEVICE, "page_scoring: the device's SM count could not be read");
    *out = per_sm * sms;
    if (slot) *slot = *out;
    return KVB_OK;
}

// Narrow tiles when wide ones (`wide` pages) would leave resident block slots empty (a small context):
// more blocks (Quest: twice, hybrid: four times).
inline bool narrow_tiles(int resident, int64_t heads, int n_pages, int wide) { return heads * tiles_of(n_pages, wide) < resident; }

inline int check_workspace(const char *who, const void *ws, size_t have, size_t need)
{
    if (need && (!ws || have < need))
        return kvb_fail(KVB_EINVAL, "%s: workspace_bytes=%zu out of range [%zu, ...) (or the workspace is NULL)", who,
                        ws ? have : 0, need);
    return KVB_OK;
}

} // namespace
