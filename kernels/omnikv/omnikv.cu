// omnikv.cu: OmniKV's filter-layer token selector (reference/omnikv.h; budget and measurements:
// kernels/omnikv/NOTES.md): scores = max over the Hq query heads of q.K/sqrt(D) per prompt token, then
// the suite's top-k (topk_rows) on the scores.
//
// Napkin math, Llama-3-8B heads (Hq=32, Hkv=8, D=128), L=32K, B=1:
//   K = 8 * 32768 * 128 * 2 B = 67.1 MB read once; scores 128 KB written and read back by the top-k;
//   q 8 KB. Arithmetic: 2 * Hq * L * D = 268 MFLOP = 4 FLOP per byte of K (G = 4 heads per KV row):
//   nothing for the tensor cores, but ~2 FMA per byte on the CUDA cores would cost a quarter of the
//   fp32 pipe; so the products go through mma.sync with the G heads as the n = 8 columns of
//   S^T = K . q^T (attn_device.h, as decode_attn). The kernel is bound by the read of K.
//   Bytes in flight: ~4.5 TB/s x ~1 us = ~34 KB per SM; a warp keeps S KV heads' 16 token rows
//   (S * 4 KB at D=128) outstanding, 4 warps a block, several blocks an SM.
//
// Design:
// - One block takes a tile of 64 tokens of one sequence for ALL Hkv heads: warp w its 16 tokens,
//   KV heads in groups of S whose K rows (16-byte loads straight into the MMA fragments, dense_load_k)
//   and q fragments (from the bf16 q rows, L1-resident) are all loaded before any is used. Each K row
//   is read once for the G query heads of its KV head; the max over the G columns and over the KV
//   heads stays in registers, so each score is written once, final, with no atomics and no pass over
//   a [B, Hq, L] intermediate.
// - Tokens past len[b] are neither read nor computed: their scores are written -inf, so topk_rows can
//   take the whole row of L scores (k <= len[b] never reaches them).
// - The selection: topk_rows over [B, L] (rows split over several blocks when B is small).
#include <cstdint>

#include "kernels/common/kvb_cuda.h"
#include "kernels/common/kvb_grid.h"
#include "kernels/common/attn_device.h"
#include "kernels/omnikv/omnikv.h"
#include "kernels/select/select.h"

using namespace kvb_attn;
using kvb_dev::chain_release;
using kvb_dev::chain_wait;
using kvb_dev::launch_chained;

namespace {

constexpr int TILE = 16 * WARPS; // tokens per block

struct OmniParams {
    const __nv_bfloat16 *q, *K;
    const int32_t *len;
    float *scores;
    int Hq, Hkv, G, L;
    float scale; // 1 / sqrt(D)
};

// KV heads whose K rows a warp has in flight at once: 8 KB of K per warp at either D.
template <int D>
constexpr int HEADS_IN_FLIGHT = D == 64 ? 4 : 2;

template <int D>
__global__ void __launch_bounds__(THREADS, 4) omnikv_score_kernel(OmniParams p)
{
    constexpr int S = HEADS_IN_FLIGHT<D>;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int b = blockIdx.y;
    const int64_t tok0 = (int64_t)blockIdx.x * TILE + 16 * warp;
    chain_wait(); // launched chained (kvb_device.cuh): the kernel before has ended and its writes are visible
    if (tok0 >= p.L) return;
    const int nvalid = (int)min((int64_t)16, (int64_t)p.len[b] - tok0); // <= 0: past the prompt
    // running max of rows g, g+8 over this thread's head columns 2t, 2t+1 (heads >= G masked)
    float m0 = -INFINITY, m8 = -INFINITY;
    if (nvalid > 0) {
        const bool col0 = 2 * t < p.G, col1 = 2 * t + 1 < p.G;
        const __nv_bfloat16 *Kb = p.K + (int64_t)b * p.Hkv * p.L * D, *qb_rows = p.q + (int64_t)b * p.Hq * D;
        for (int h0 = 0; h0 < p.Hkv; h0 += S) {
            uint32_t k0[S][D / 8], k8[S][D / 8];
#pragma unroll
            for (int i = 0; i < S; i++)
                if (h0 + i < p.Hkv) dense_load_k<D>(k0[i], k8[i], Kb + (int64_t)(h0 + i) * p.L * D, tok0, nvalid, lane);
#pragma unroll
            for (int i = 0; i < S; i++) {
                if (h0 + i >= p.Hkv) break;
                uint32_t qb[D / 16][2]; // L1 hits, read while K is in flight
                q_frags_bf16_rows<D>(qb, qb_rows + (int64_t)(h0 + i) * p.G * D, p.G, lane);
                float s[4] = {0.f, 0.f, 0.f, 0.f};
                dense_qk<D>(s, qb, k0[i], k8[i]);
                m0 = fmaxf(m0, fmaxf(col0 ? s[0] : -INFINITY, col1 ? s[1] : -INFINITY));
                m8 = fmaxf(m8, fmaxf(col0 ? s[2] : -INFINITY, col1 ? s[3] : -INFINITY));
            }
        }
        m0 = warp_max<1, 2>(m0); // over the 4 threads of a row: all 8 head columns
        m8 = warp_max<1, 2>(m8);
    }
    chain_release(); // after the reads of K: the top-k's first kernel does not wait beside them
    if (t == 0) {
        float *out = p.scores + (int64_t)b * p.L + tok0;
        if (tok0 + g < p.L) out[g] = g < nvalid ? m0 * p.scale : -INFINITY;
        if (tok0 + g + 8 < p.L) out[g + 8] = g + 8 < nvalid ? m8 * p.scale : -INFINITY;
    }
}

size_t align256(size_t b) { return (b + 255) & ~(size_t)255; }

size_t scores_bytes(const omnikv_layout *s) { return align256(sizeof(float) * (size_t)s->B * (size_t)s->L); }

} // namespace

extern "C" size_t omnikv_select_workspace_bytes(const omnikv_layout *s)
{
    if (omnikv_layout_check(s, "omnikv_select_workspace_bytes")) return 0;
    return scores_bytes(s) + topk_workspace_bytes(s->B, s->L);
}

extern "C" int omnikv_select(const kvb_bf16 *q, const kvb_bf16 *K, const int32_t *len, const int32_t *len_host,
                             const omnikv_layout *s, int k, int32_t *idx, float *scores, void *workspace,
                             size_t workspace_bytes, cudaStream_t stream)
{
    const char *who = "omnikv_select";
    int rc = omnikv_layout_check(s, who);
    if (rc) return rc;
    if (!q || !K || !len || !len_host || !idx)
        return kvb_fail(KVB_EINVAL, "%s: a tensor pointer is NULL (q=%p K=%p len=%p len_host=%p idx=%p)", who,
                        (const void *)q, (const void *)K, (const void *)len, (const void *)len_host, (void *)idx);
    if ((rc = kvb_check_aligned16(who, "q", q)) || (rc = kvb_check_aligned16(who, "K", K))) return rc;
    const size_t need = omnikv_select_workspace_bytes(s);
    if (!workspace || workspace_bytes < need)
        return kvb_fail(KVB_EINVAL, "%s: workspace_bytes=%zu out of range [%zu, ...) (or the workspace is NULL)", who,
                        workspace ? workspace_bytes : (size_t)0, need);
    if ((rc = omnikv_select_check(s, len_host, k, who))) return rc;

    OmniParams p;
    p.q = reinterpret_cast<const __nv_bfloat16 *>(q);
    p.K = reinterpret_cast<const __nv_bfloat16 *>(K);
    p.len = len;
    p.scores = scores ? scores : reinterpret_cast<float *>(workspace);
    p.Hq = s->Hq, p.Hkv = s->Hkv, p.G = s->Hq / s->Hkv, p.L = s->L;
    p.scale = 1.0f / sqrtf((float)s->D);
    unsigned tiles = 0;
    if ((rc = kvb_grid_x(who, "L", s->L, TILE, &tiles))) return rc;
    const dim3 grid(tiles, (unsigned)s->B); // B <= 1024: inside grid.y
    if (s->D == 64) CUDA_TRY(launch_chained(omnikv_score_kernel<64>, grid, THREADS, 0, stream, p));
    else CUDA_TRY(launch_chained(omnikv_score_kernel<128>, grid, THREADS, 0, stream, p));
    void *topk_ws = need > scores_bytes(s) ? reinterpret_cast<char *>(workspace) + scores_bytes(s) : nullptr;
    return topk_rows(p.scores, s->B, s->L, s->L, k, 0, 0, idx, k, topk_ws, stream);
}
