// heavy_hitters.cu: MiniKV heavy hitters, SnapKV++ max-pooling and selection, gather of the kept rows.
// The selections go through the suite's top-k (select.h), one block per row; the pooling and gather
// are plain bandwidth kernels.
#include <cstdint>

#include <cub/block/block_scan.cuh>

#include "kvb_cuda.h"
#include "kvb_grid.h"
#include "heavy_hitters.h"
#include "select.h"

namespace {

constexpr int POOL_OUT = 1024, POOL_THREADS = 256;

__global__ void __launch_bounds__(POOL_THREADS) maxpool_kernel(const float *x, int L, int half, float *y, int64_t r0)
{
    extern __shared__ float tile[]; // POOL_OUT + 2 * half values, -inf outside [0, L)
    const int64_t r = r0 + blockIdx.y; // rows in chunks of grid.y (kvb_grid.h)
    const int j0 = blockIdx.x * POOL_OUT, span = POOL_OUT + 2 * half;
    const float *xr = x + r * L;
    for (int i = threadIdx.x; i < span; i += POOL_THREADS) {
        const int j = j0 - half + i;
        tile[i] = j >= 0 && j < L ? xr[j] : -INFINITY;
    }
    __syncthreads();
    for (int o = threadIdx.x; o < POOL_OUT && j0 + o < L; o += POOL_THREADS) {
        float m = tile[o];
        for (int w = 1; w <= 2 * half; ++w) m = fmaxf(m, tile[o + w]);
        y[r * L + j0 + o] = m;
    }
}

// one warp per kept row, 16-byte copies
__global__ void gather_kernel(const uint4 *X, int64_t rows_out, int group, int L, int cpr, const int32_t *keep,
                              int n_keep, uint4 *Y)
{
    const int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (w >= rows_out * n_keep) return;
    const int64_t r = w / n_keep;
    const int32_t t = keep[w];
    if (t < 0 || t >= L) return;
    const uint4 *src = X + ((r / group) * L + t) * cpr;
    uint4 *dst = Y + w * cpr;
    for (int c = lane; c < cpr; c += 32) dst[c] = src[c];
}

int check_rows(const char *who, int rows, int L)
{
    if (rows < 1) return kvb_fail(KVB_EINVAL, "%s: rows=%d out of range [1, 2^31)", who, rows);
    if (L < 1) return kvb_fail(KVB_EINVAL, "%s: L=%d out of range [1, 2^31)", who, L);
    return KVB_OK;
}

} // namespace

extern "C" int heavy_hitters_keep(const float *scores, int rows, int L, int n_hh, int n_rw, int32_t *keep,
                                  cudaStream_t stream)
{
    int rc = check_rows("heavy_hitters_keep", rows, L);
    if (rc) return rc;
    if (n_hh < 0 || n_hh > L) return kvb_fail(KVB_EINVAL, "heavy_hitters_keep: n_hh=%d out of range [0, L = %d]", n_hh, L);
    if (n_rw < 0 || n_rw > L) return kvb_fail(KVB_EINVAL, "heavy_hitters_keep: n_rw=%d out of range [0, L = %d]", n_rw, L);
    if ((int64_t)n_hh + n_rw >= L) return topk_rows(scores, rows, L, L, L, 0, 0, keep, L, nullptr, stream); /* keep all */
    return topk_rows(scores, rows, L, L - n_rw, n_hh, L - n_rw, n_rw, keep, n_hh + n_rw, nullptr, stream);
}

extern "C" int maxpool_rows(const float *x, int rows, int L, int ks, float *y, cudaStream_t stream)
{
    int rc = check_rows("maxpool_rows", rows, L);
    if (rc) return rc;
    if (ks < 1 || ks > SNAPKV_MAX_KS || ks % 2 == 0)
        return kvb_fail(KVB_EINVAL, "maxpool_rows: ks=%d is not an odd pooling kernel in [1, %d]", ks, SNAPKV_MAX_KS);
    if (!x || !y) return kvb_fail(KVB_EINVAL, "maxpool_rows: NULL pointer");
    const int half = ks / 2;
    const size_t smem = sizeof(float) * (size_t)(POOL_OUT + 2 * half);
    const unsigned tiles = (unsigned)((L + POOL_OUT - 1) / POOL_OUT); // L < 2^31: < 2^21
    return kvb_grid_chunks(rows, [&](int64_t r0, unsigned n) -> int {
        maxpool_kernel<<<dim3(tiles, n), POOL_THREADS, smem, stream>>>(x, L, half, y, r0);
        CUDA_TRY(cudaGetLastError());
        return KVB_OK;
    });
}

extern "C" int snapkv_keep(const float *pooled, int rows, int L, int W, int n_keep, int32_t *keep, cudaStream_t stream)
{
    int rc = check_rows("snapkv_keep", rows, L);
    if (rc) return rc;
    if (W < 1 || W > L) return kvb_fail(KVB_EINVAL, "snapkv_keep: W=%d out of range [1, L = %d]", W, L);
    if (n_keep < W || n_keep > L) return kvb_fail(KVB_EINVAL, "snapkv_keep: n_keep=%d out of range [W = %d, L = %d]", n_keep, W, L);
    if (n_keep == L) return topk_rows(pooled, rows, L, L, L, 0, 0, keep, L, nullptr, stream);
    return topk_rows(pooled, rows, L, L - W, n_keep - W, L - W, W, keep, n_keep, nullptr, stream);
}

extern "C" int gather_rows(const kvb_bf16 *X, int rows, int group, int L, int D, const int32_t *keep, int n_keep,
                           kvb_bf16 *Y, cudaStream_t stream)
{
    int rc = check_rows("gather_rows", rows, L);
    if (rc) return rc;
    if (group < 1 || rows % group) return kvb_fail(KVB_EINVAL, "gather_rows: group=%d does not divide rows=%d", group, rows);
    if (D < 8 || D % 8) return kvb_fail(KVB_EINVAL, "gather_rows: D=%d is not a positive multiple of 8 (16-byte rows)", D);
    if (n_keep < 1 || n_keep > L) return kvb_fail(KVB_EINVAL, "gather_rows: n_keep=%d out of range [1, L = %d]", n_keep, L);
    if (!X || !keep || !Y) return kvb_fail(KVB_EINVAL, "gather_rows: NULL pointer");
    unsigned blocks = 0; // one warp per kept row, 8 per block
    if ((rc = kvb_grid_x("gather_rows", "rows*n_keep", (int64_t)rows * n_keep, 256 / 32, &blocks))) return rc;
    gather_kernel<<<blocks, 256, 0, stream>>>((const uint4 *)X, rows, group, L, D / 8, keep, n_keep, (uint4 *)Y);
    CUDA_TRY(cudaGetLastError());
    return KVB_OK;
}
