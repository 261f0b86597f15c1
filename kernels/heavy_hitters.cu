// heavy_hitters.cu: top-k per row (radix select), MiniKV heavy hitters, SnapKV++ max-pooling and
// selection, gather of the kept rows. Not the performance focus (the attention is): one block per row
// for the top-k, simple and deterministic; the pooling and gather are plain bandwidth kernels.
#include <cstdint>

#include <cub/block/block_scan.cuh>

#include "kvb_cuda.h"
#include "kvb_grid.h"
#include "heavy_hitters.h"

namespace {

constexpr int TOPK_THREADS = 1024, POOL_OUT = 1024, POOL_THREADS = 256;

// order-preserving key: larger float -> larger unsigned; -0 is +0 (they compare equal)
__device__ __forceinline__ uint32_t order_key(float f)
{
    uint32_t u = __float_as_uint(f);
    if (u == 0x80000000u) u = 0;
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__global__ void __launch_bounds__(TOPK_THREADS) topk_kernel(const float *x, int64_t ld, int n, int k, int tail_first,
                                                            int tail_n, int32_t *idx, int64_t ldo)
{
    using Scan = cub::BlockScan<int, TOPK_THREADS>;
    __shared__ typename Scan::TempStorage scan_tmp;
    __shared__ uint32_t hist[256];
    __shared__ uint32_t s_digit, s_need;
    const int tid = threadIdx.x;
    const float *xr = x + blockIdx.x * ld;
    int32_t *out = idx + blockIdx.x * ldo;
    for (int i = tid; i < tail_n; i += TOPK_THREADS) out[k + i] = tail_first + i;
    if (k >= n) {
        for (int i = tid; i < n; i += TOPK_THREADS) out[i] = i;
        return;
    }
    if (k == 0) return;

    // radix select: the key of the k-th largest, 8 bits at a time from the top
    uint32_t prefix = 0, mask = 0, need = (uint32_t)k; // `need` of the keys matching prefix are still wanted
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int i = tid; i < 256; i += TOPK_THREADS) hist[i] = 0;
        __syncthreads();
        for (int i = tid; i < n; i += TOPK_THREADS) {
            const uint32_t key = order_key(xr[i]);
            if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (tid == 0) {
            uint32_t above = 0;
            int d = 255;
            for (; d > 0; --d) {
                if (above + hist[d] >= need) break;
                above += hist[d];
            }
            s_digit = (uint32_t)d;
            s_need = need - above;
        }
        __syncthreads();
        prefix |= s_digit << shift;
        mask |= 255u << shift;
        need = s_need;
        __syncthreads(); // s_digit / s_need are rewritten only after the next histogram's barriers, but keep it plain
    }
    // keys > prefix are all taken (k - need of them); of the keys == prefix, the `need` lowest indices
    int eq_seen = 0, written = 0;
    for (int base = 0; base < n; base += TOPK_THREADS) {
        const int i = base + tid;
        const uint32_t key = i < n ? order_key(xr[i]) : 0u;
        const int gt = i < n && key > prefix, eq = i < n && key == prefix;
        int eq_rank, eq_total;
        Scan(scan_tmp).ExclusiveSum(eq, eq_rank, eq_total);
        __syncthreads();
        const int sel = gt || (eq && (uint32_t)(eq_seen + eq_rank) < need);
        int pos, sel_total;
        Scan(scan_tmp).ExclusiveSum(sel, pos, sel_total);
        __syncthreads();
        if (sel) out[written + pos] = i;
        eq_seen += eq_total;
        written += sel_total;
    }
}

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

extern "C" int topk_rows(const float *scores, int rows, int64_t ld, int n, int k, int tail_first, int tail_n,
                         int32_t *idx, int64_t ldo, cudaStream_t stream)
{
    if (rows < 1) return kvb_fail(KVB_EINVAL, "topk_rows: rows=%d out of range [1, 2^31)", rows);
    if (n < 0 || ld < n) return kvb_fail(KVB_EINVAL, "topk_rows: n=%d out of range [0, ld = %lld]", n, (long long)ld);
    if (k < 0 || k > n) return kvb_fail(KVB_EINVAL, "topk_rows: k=%d out of range [0, n = %d]", k, n);
    if (tail_n < 0 || ldo < (int64_t)k + tail_n)
        return kvb_fail(KVB_EINVAL, "topk_rows: k + tail_n = %lld out of range [0, ldo = %lld]", (long long)k + tail_n,
                        (long long)ldo);
    if (!scores || !idx) return kvb_fail(KVB_EINVAL, "topk_rows: NULL pointer");
    topk_kernel<<<rows, TOPK_THREADS, 0, stream>>>(scores, ld, n, k, tail_first, tail_n, idx, ldo);
    CUDA_TRY(cudaGetLastError());
    return KVB_OK;
}

extern "C" int heavy_hitters_keep(const float *scores, int rows, int L, int n_hh, int n_rw, int32_t *keep,
                                  cudaStream_t stream)
{
    int rc = check_rows("heavy_hitters_keep", rows, L);
    if (rc) return rc;
    if (n_hh < 0 || n_hh > L) return kvb_fail(KVB_EINVAL, "heavy_hitters_keep: n_hh=%d out of range [0, L = %d]", n_hh, L);
    if (n_rw < 0 || n_rw > L) return kvb_fail(KVB_EINVAL, "heavy_hitters_keep: n_rw=%d out of range [0, L = %d]", n_rw, L);
    if ((int64_t)n_hh + n_rw >= L) return topk_rows(scores, rows, L, L, L, 0, 0, keep, L, stream); /* keep all */
    return topk_rows(scores, rows, L, L - n_rw, n_hh, L - n_rw, n_rw, keep, n_hh + n_rw, stream);
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
    if (n_keep == L) return topk_rows(pooled, rows, L, L, L, 0, 0, keep, L, stream);
    return topk_rows(pooled, rows, L, L - W, n_keep - W, L - W, W, keep, n_keep, stream);
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
