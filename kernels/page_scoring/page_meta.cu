// page_meta.cu: the pages' per-channel min/max metadata that Quest and RocketKV's hybrid scoring read
// (page_scoring.h): page_meta_build over a whole cache, page_meta_append for one new token a sequence.
// Contract and measurements: kernels/page_scoring/NOTES.md; reference reference/page_scoring.c.
#include <cstdint>

#include "kernels/common/kvb_cuda.h"
#include "kernels/common/kvb_device.cuh"
#include "kernels/common/kvb_grid.h"
#include "kernels/page_scoring/page_scoring.h"

namespace {

using namespace kvb_dev;

constexpr int THREADS = 256;
constexpr int BUILD_PAGES = 32; // pages per block of page_meta_build

// bf16 number x (0..7, a constant after unrolling) of a 16-byte piece
__device__ __forceinline__ uint16_t elem(const uint4 &v, int x)
{
    const uint32_t w = x < 2 ? v.x : x < 4 ? v.y : x < 6 ? v.z : v.w;
    return (uint16_t)(x & 1 ? w >> 16 : w & 0xFFFFu);
}

// The extrema of the tokens of page tiles: a group of D/8 threads reads one token row (D x 2 B,
// coalesced) per step and keeps 8 channels' min and max; the tile is transposed through shared memory
// so that the channel-major rows are written 4 bytes per thread, contiguous along pages.
__global__ void __launch_bounds__(THREADS) page_meta_build_kernel(const uint16_t *K, page_layout s, int n_pages,
                                                                  uint16_t *kmin, uint16_t *kmax, int64_t head0)
{
    __shared__ uint16_t smin[PAGE_MAX_D][BUILD_PAGES + 2], smax[PAGE_MAX_D][BUILD_PAGES + 2];
    const int64_t bh = head0 + blockIdx.y;
    const int D = s.D, cpr = D / 8, groups = THREADS / cpr, j0 = blockIdx.x * BUILD_PAGES;
    const int g = threadIdx.x / cpr, piece = threadIdx.x % cpr;
    if (g < groups)
        for (int jj = g; jj < BUILD_PAGES; jj += groups) {
            const int j = j0 + jj;
            uint16_t lo[8], hi[8];
            if (j < n_pages) {
                const int64_t t0 = (int64_t)j * s.P;
                const int nt = min(s.P, (int)(s.L - t0));
                const uint4 *src = reinterpret_cast<const uint4 *>(K + (bh * s.L + t0) * D) + piece;
                const uint4 v0 = __ldg(src);
#pragma unroll
                for (int x = 0; x < 8; ++x) lo[x] = hi[x] = elem(v0, x);
#pragma unroll 4
                for (int i = 1; i < nt; ++i) {
                    const uint4 v = __ldg(src + (int64_t)i * cpr);
#pragma unroll
                    for (int x = 0; x < 8; ++x) { // v < m ? v : m in token order, as the reference
                        const uint16_t e = elem(v, x);
                        if (bf16_bits_to_float(e) < bf16_bits_to_float(lo[x])) lo[x] = e;
                        if (bf16_bits_to_float(e) > bf16_bits_to_float(hi[x])) hi[x] = e;
                    }
                }
            } else {
#pragma unroll
                for (int x = 0; x < 8; ++x) lo[x] = 0x7F80u, hi[x] = 0xFF80u; // no token: +inf, -inf
            }
#pragma unroll
            for (int x = 0; x < 8; ++x) smin[piece * 8 + x][jj] = lo[x], smax[piece * 8 + x][jj] = hi[x];
        }
    __syncthreads();
    // 2 tensors x D rows x BUILD_PAGES/2 words
    const int words = BUILD_PAGES / 2;
    for (int w = threadIdx.x; w < 2 * D * words; w += THREADS) {
        const int t = w / (D * words), c = (w / words) % D, jj = (w % words) * 2;
        if (j0 + jj >= s.cap) continue; // cap is even: a pair is inside or outside
        const uint16_t(*src)[BUILD_PAGES + 2] = t ? smax : smin;
        const uint32_t pair = (uint32_t)src[c][jj] | (uint32_t)src[c][jj + 1] << 16;
        uint16_t *dst = (t ? kmax : kmin) + (bh * D + c) * s.cap + j0 + jj;
        *reinterpret_cast<uint32_t *>(dst) = pair;
    }
}

// One thread per (b, KV head, channel).
__global__ void page_meta_append_kernel(const uint16_t *k, const int32_t *t, page_layout s, int64_t total, uint16_t *kmin,
                                        uint16_t *kmax)
{
    chain_wait(); // launched chained (kvb_device.cuh)
    chain_release();
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const int64_t bh = i / s.D;
    const int c = (int)(i % s.D), pos = t[bh / s.Hkv];
    const int64_t at = (bh * s.D + c) * s.cap + pos / s.P;
    const uint16_t v = k[i];
    if (pos % s.P == 0) { // the page starts: the entry becomes k, whatever it held
        kmin[at] = v, kmax[at] = v;
        return;
    }
    if (bf16_bits_to_float(v) < bf16_bits_to_float(kmin[at])) kmin[at] = v;
    if (bf16_bits_to_float(v) > bf16_bits_to_float(kmax[at])) kmax[at] = v;
}

} // namespace

extern "C" int page_meta_build(const kvb_bf16 *K, const page_layout *s, kvb_bf16 *kmin, kvb_bf16 *kmax, cudaStream_t stream)
{
    int rc = page_layout_check(s, "page_meta_build");
    if (rc) return rc;
    if (!K || !kmin || !kmax) return kvb_fail(KVB_EINVAL, "page_meta_build: K, kmin or kmax is NULL");
    if ((rc = kvb_check_aligned16("page_meta_build", "K", K)) || (rc = kvb_check_aligned16("page_meta_build", "kmin", kmin)) ||
        (rc = kvb_check_aligned16("page_meta_build", "kmax", kmax)))
        return rc;
    const int64_t heads = (int64_t)s->B * s->Hkv;
    const unsigned tiles = (unsigned)((s->cap + BUILD_PAGES - 1) / BUILD_PAGES); // cap <= 2^21 + 7: < 2^17
    const int n = page_count(s->L, s->P);
    return kvb_grid_chunks(heads, [&](int64_t h0, unsigned cnt) -> int {
        page_meta_build_kernel<<<dim3(tiles, cnt), THREADS, 0, stream>>>(K, *s, n, kmin, kmax, h0);
        CUDA_TRY(cudaGetLastError());
        return KVB_OK;
    });
}

extern "C" int page_meta_append(const kvb_bf16 *k, const int32_t *t, const int32_t *t_host, const page_layout *s,
                                kvb_bf16 *kmin, kvb_bf16 *kmax, cudaStream_t stream)
{
    int rc = page_layout_check(s, "page_meta_append");
    if (rc) return rc;
    if (!k || !t || !t_host || !kmin || !kmax)
        return kvb_fail(KVB_EINVAL, "page_meta_append: k, t, t_host, kmin or kmax is NULL");
    if ((rc = page_positions_check(s, t_host, "page_meta_append"))) return rc;
    const int64_t total = (int64_t)s->B * s->Hkv * s->D;
    unsigned blocks = 0;
    if ((rc = kvb_grid_x("page_meta_append", "B*Hkv*D", total, THREADS, &blocks))) return rc;
    CUDA_TRY(launch_chained(page_meta_append_kernel, blocks, THREADS, 0, stream, k, t, *s, total, kmin, kmax));
    return KVB_OK;
}

