// landmark_score.cu: ShadowKV's decode-time chunk selection (landmark_score.h).
//
// Napkin math (H200, ~4.5 TB/s read): Llama-3-8B at B=24 and 124928 tokens has B*Hkv = 192 rows of
// Lm = 15564 landmarks x 256 bytes = 765 MB, ~170 us to read once. Per landmark the G = 4 query heads
// of its KV head need 4 x 128 multiply-adds: 2 FLOP per byte (4 with GLM's G = 8). FMA on unpacked
// bf16 would need ~60% of the SM's issue slots at G = 8 just to keep up; one mma.sync m16n8k16 (16
// landmarks x 8 query heads x 16 dims) does 2048 multiply-adds, 8 of them cover a 4 KB tile, and the
// SM is left to keeping loads in flight. The logits are G x 4 bytes per 256-byte landmark; writing
// them out and reading them back for the softmax would add 6% (G = 4) to 12.5% (G = 8) of traffic
// each way, so they stay on chip: a row is split over a thread-block cluster of S <= 8 blocks, each
// block keeps its landmarks' logits in shared memory, and the blocks exchange per-head maxima and
// sums through distributed shared memory. Only m (4 bytes per landmark) goes to memory, then the
// suite's top-k reads it. Rows too long for the shared memory (Lm beyond ~98K at G = 4, ~49K at
// G = 8) keep the logits in the workspace instead (same kernel, a global pointer).
//
// Not yet the floor (the figures: kernels/landmark_score/NOTES.md): 108 registers leave two blocks per
// SM (one where a block's logits take 125 KB: GLM at Lm = 31180), a warp issues its next two tiles only
// after it has consumed the last two, and a block stops streaming for its softmax passes and cluster
// barriers, so the bytes in flight per SM fall short of what the read rate needs. The next step is a
// deeper pipeline (bulk copies into a shared-memory ring, or loads issued a tile pair ahead).
#include <cmath>
#include <cstdint>

#include <cooperative_groups.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include "kernels/common/kvb_cuda.h"
#include "kernels/common/kvb_device.cuh"
#include "kernels/common/kvb_grid.h"
#include "kernels/landmark_score/landmark_score.h"
#include "kernels/select/select.h"

namespace cg = cooperative_groups;

namespace {

using bf16 = __nv_bfloat16;

constexpr int THREADS = 256, NW = THREADS / 32;
constexpr int MAX_CLUSTER = 8;                    // the portable cluster size
constexpr int MIN_PER_BLOCK = 512;                // landmarks per block before a row is split further
constexpr size_t SMEM_LOGITS_MAX = 200 * 1024;    // shared memory for one block's logits, at most
constexpr float LOG2E = 1.4426950408889634f;

size_t align256(size_t b) { return (b + 255) & ~(size_t)255; }
int groups_of(const lms_shape *s) { return s->Hq / s->Hkv; }
int64_t rows_of(const lms_shape *s) { return (int64_t)s->B * s->Hkv; }

// ---- the fused scores kernel ----

// How a row of Lm landmarks is split: S blocks (one cluster) of `per` landmarks each (a multiple of
// the 16-landmark tile); logits stored [G][P] per block, P = per rounded to 32 plus 4 so that the
// fragment stores (8 landmarks x 4 head pairs per warp) hit 32 distinct banks.
struct ScorePlan {
    int S, per, P;
    size_t logits_bytes; // per block
    bool spill;          // logits in the workspace rather than shared memory
    size_t spill_bytes;  // workspace for them
};

ScorePlan score_plan(const lms_shape *s)
{
    ScorePlan p;
    const int want = (s->Lm + MIN_PER_BLOCK - 1) / MIN_PER_BLOCK;
    p.S = want < 1 ? 1 : want > MAX_CLUSTER ? MAX_CLUSTER : want;
    const int per = (s->Lm + p.S - 1) / p.S;
    p.per = (per + 15) / 16 * 16;
    p.P = (p.per + 31) / 32 * 32 + 4;
    p.logits_bytes = (size_t)groups_of(s) * p.P * sizeof(float);
    p.spill = p.logits_bytes > SMEM_LOGITS_MAX;
    p.spill_bytes = p.spill ? (size_t)rows_of(s) * p.S * p.logits_bytes : 0;
    return p;
}

struct ScoreArgs {
    const bf16 *q, *landmarks;
    float *m;
    float *spill; // [rows * S][G][P] when the logits do not fit shared memory, else nullptr
    int Hq, Hkv, G, Lm, per, P;
    float scale_log2; // log2(e) / sqrt(D): logits in base 2, exp2 in the softmax
};

// One block: landmarks [lo, lo + n) of row (b, hk) = blockIdx.x / S, rank blockIdx.x % S in its cluster.
//  1. stream the landmarks: per warp 16-landmark tiles, two in flight; for each, 2 D/32 MMAs give the
//     16 x 8 logits (landmarks x query heads, heads >= G are zero columns); store them, track the max;
//  2. the row's max per head over the cluster; e = 2^(y - max) in place, its sum per head;
//  3. the row's sum per head over the cluster; m[l] = max over heads of e / sum.
// MMA operands straight from 16-byte loads: a dot product does not care in which order it visits
// the dimensions, so thread (g, t) of a warp loads the 16-byte words u = 4j + t of landmark rows g and
// g + 8 and of query head g, and feeds word u's 8 values to the k slots it owns in two MMAs (elements
// 0-1 and 2-3 as k = 2t.., 2t+8..; then 4-5 and 6-7): A and B pair the same dimension everywhere.
template <int D>
__global__ void __launch_bounds__(THREADS, 2) landmark_m_kernel(ScoreArgs a)
{
    constexpr int NJ = D / 32; // 16-byte words per thread per landmark row
    extern __shared__ float smem_logits[];
    __shared__ float red[NW][LMS_CUDA_MAX_G];
    __shared__ float blk_max[LMS_CUDA_MAX_G], blk_sum[LMS_CUDA_MAX_G], row_max[LMS_CUDA_MAX_G], row_inv[LMS_CUDA_MAX_G];

    cg::cluster_group cluster = cg::this_cluster();
    const int S = (int)cluster.num_blocks(), rank = (int)cluster.block_rank();
    const int64_t row = blockIdx.x / S;
    const int G = a.G, P = a.P, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int lo = rank * a.per, hi = min(a.Lm, lo + a.per), n = max(0, hi - lo);
    float *lg = a.spill ? a.spill + (int64_t)blockIdx.x * G * P : smem_logits;

    uint4 qf[NJ];
    {
        const int64_t b = row / a.Hkv, hk = row % a.Hkv;
        const uint4 *qrow = reinterpret_cast<const uint4 *>(a.q + ((b * a.Hq + hk * G + min(g, G - 1)) * D));
#pragma unroll
        for (int j = 0; j < NJ; ++j) qf[j] = g < G ? kvb_dev::ldg16(qrow + 4 * j + t) : make_uint4(0, 0, 0, 0);
    }
    const bf16 *base = a.landmarks + (row * a.Lm + lo) * D;

    // 1. logits and their max
    float mx0 = -INFINITY, mx1 = -INFINITY; // heads 2t, 2t + 1
    const int tiles = (n + 15) / 16;
    for (int t0 = warp; t0 < tiles; t0 += 2 * NW) {
        uint4 v[2][2][NJ]; // [tile][row g / g + 8][word]
#pragma unroll
        for (int s = 0; s < 2; ++s)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int l = (t0 + s * NW) * 16 + g + 8 * h;
                const bool ok = l < n;
                const uint4 *p = reinterpret_cast<const uint4 *>(base + (int64_t)(ok ? l : 0) * D);
#pragma unroll
                for (int j = 0; j < NJ; ++j) v[s][h][j] = ok ? kvb_dev::ldg16(p + 4 * j + t) : make_uint4(0, 0, 0, 0);
            }
#pragma unroll
        for (int s = 0; s < 2; ++s) {
            const int tile = t0 + s * NW;
            if (tile >= tiles) break; // warp-uniform
            float c[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int j = 0; j < NJ; ++j) {
                kvb_dev::mma_bf16(c, v[s][0][j].x, v[s][1][j].x, v[s][0][j].y, v[s][1][j].y, qf[j].x, qf[j].y);
                kvb_dev::mma_bf16(c, v[s][0][j].z, v[s][1][j].z, v[s][0][j].w, v[s][1][j].w, qf[j].z, qf[j].w);
            }
#pragma unroll
            for (int h = 0; h < 2; ++h) { // c[2h], c[2h+1]: landmark g + 8h, heads 2t, 2t + 1
                const int l = tile * 16 + g + 8 * h;
                if (l >= n) continue;
                const float y0 = c[2 * h] * a.scale_log2, y1 = c[2 * h + 1] * a.scale_log2;
                if (2 * t < G) lg[2 * t * P + l] = y0, mx0 = fmaxf(mx0, y0);
                if (2 * t + 1 < G) lg[(2 * t + 1) * P + l] = y1, mx1 = fmaxf(mx1, y1);
            }
        }
    }
    kvb_dev::warp_max<4, 16>(mx0, mx1); // over the 8 landmark rows g of the fragments
    if (g == 0) red[warp][2 * t] = mx0, red[warp][2 * t + 1] = mx1;
    __syncthreads();
    if (threadIdx.x < G) {
        float x = -INFINITY;
        for (int w = 0; w < NW; ++w) x = fmaxf(x, red[w][threadIdx.x]);
        blk_max[threadIdx.x] = x;
    }
    cluster.sync();
    if (threadIdx.x < G) {
        float x = -INFINITY;
        for (int r = 0; r < S; ++r) x = fmaxf(x, cluster.map_shared_rank(blk_max, r)[threadIdx.x]);
        row_max[threadIdx.x] = x;
    }
    __syncthreads();

    // 2. e = 2^(y - max) in place, and its sum per head
    float sum[LMS_CUDA_MAX_G];
#pragma unroll
    for (int h = 0; h < LMS_CUDA_MAX_G; ++h) sum[h] = 0.f;
    for (int l = threadIdx.x; l < n; l += THREADS)
#pragma unroll
        for (int h = 0; h < LMS_CUDA_MAX_G; ++h)
            if (h < G) {
                const float e = exp2f(lg[h * P + l] - row_max[h]);
                lg[h * P + l] = e;
                sum[h] += e;
            }
#pragma unroll
    for (int h = 0; h < LMS_CUDA_MAX_G; ++h)
        if (h < G) { // G is uniform: every lane shuffles
            const float x = kvb_dev::warp_sum<16, 1>(sum[h]);
            if (lane == 0) red[warp][h] = x;
        }
    __syncthreads();
    if (threadIdx.x < G) {
        float x = 0.f;
        for (int w = 0; w < NW; ++w) x += red[w][threadIdx.x];
        blk_sum[threadIdx.x] = x;
    }
    cluster.sync();
    if (threadIdx.x < G) {
        float x = 0.f;
        for (int r = 0; r < S; ++r) x += cluster.map_shared_rank(blk_sum, r)[threadIdx.x];
        row_inv[threadIdx.x] = 1.f / x;
    }
    cluster.sync(); // no block leaves (its shared memory) before every block has read its sums

    // 3. m = max over the group's heads of the softmax
    float *m = a.m + row * a.Lm + lo;
    for (int l = threadIdx.x; l < n; l += THREADS) {
        float x = 0.f;
#pragma unroll
        for (int h = 0; h < LMS_CUDA_MAX_G; ++h)
            if (h < G) x = fmaxf(x, lg[h * P + l] * row_inv[h]);
        m[l] = x;
    }
}

template <int D>
int launch_scores(const ScorePlan &pl, const lms_shape *s, const lms_args *a, float *spill, cudaStream_t stream)
{
    static bool smem_attr_set = false; // once per instantiation: the opt-in beyond 48 KB of shared memory
    if (!smem_attr_set) {
        CUDA_TRY(cudaFuncSetAttribute(landmark_m_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      (int)SMEM_LOGITS_MAX));
        smem_attr_set = true;
    }
    unsigned blocks = 0;
    int rc = kvb_grid_x("landmark_score", "B*Hkv*S", rows_of(s) * pl.S, 1, &blocks);
    if (rc) return rc;
    ScoreArgs k;
    k.q = reinterpret_cast<const bf16 *>(a->q);
    k.landmarks = reinterpret_cast<const bf16 *>(a->landmarks);
    k.m = a->m;
    k.spill = spill;
    k.Hq = s->Hq, k.Hkv = s->Hkv, k.G = groups_of(s), k.Lm = s->Lm, k.per = pl.per, k.P = pl.P;
    k.scale_log2 = LOG2E / sqrtf((float)D);
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(blocks);
    cfg.blockDim = dim3(THREADS);
    cfg.dynamicSmemBytes = pl.spill ? 0 : pl.logits_bytes;
    cfg.stream = stream;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = (unsigned)pl.S;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    CUDA_TRY(cudaLaunchKernelEx(&cfg, landmark_m_kernel<D>, k));
    return KVB_OK;
}

// ---- the peer's kernels (ShadowKV's structure: each step its own pass over memory) ----

template <bool MAX>
__device__ float block_reduce(float x, float *tmp)
{
    x = MAX ? kvb_dev::warp_max<16, 1>(x) : kvb_dev::warp_sum<16, 1>(x);
    if ((threadIdx.x & 31) == 0) tmp[threadIdx.x >> 5] = x;
    __syncthreads();
    float y = MAX ? -INFINITY : 0.f;
    for (int w = 0; w < NW; ++w) y = MAX ? fmaxf(y, tmp[w]) : y + tmp[w];
    __syncthreads(); // tmp is reused by the next reduction
    return y;
}

// In place: one block per (b, h) row of logits, s = exp(x - max) / sum.
__global__ void __launch_bounds__(THREADS) softmax_rows_kernel(float *x, int Lm)
{
    __shared__ float tmp[NW];
    float *r = x + (int64_t)blockIdx.x * Lm;
    float mx = -INFINITY;
    for (int i = threadIdx.x; i < Lm; i += THREADS) mx = fmaxf(mx, r[i]);
    mx = block_reduce<true>(mx, tmp);
    float sum = 0.f;
    for (int i = threadIdx.x; i < Lm; i += THREADS) sum += expf(r[i] - mx);
    sum = block_reduce<false>(sum, tmp);
    for (int i = threadIdx.x; i < Lm; i += THREADS) r[i] = expf(r[i] - mx) / sum;
}

// m[r, l] = max over g of s[r * G + g, l], rows in chunks of grid.y.
__global__ void group_max_kernel(const float *s, float *m, int G, int Lm, int64_t r0)
{
    const int64_t r = r0 + blockIdx.y;
    const int l = blockIdx.x * THREADS + threadIdx.x;
    if (l >= Lm) return;
    const float *p = s + r * G * Lm + l;
    float x = p[0];
    for (int g = 1; g < G; ++g) x = fmaxf(x, p[(int64_t)g * Lm]);
    m[r * Lm + l] = x;
}

// ---- the map: selected landmark positions -> chunk ids, in place ----

__global__ void map_ids_kernel(int32_t *ids, const int32_t *landmark_idx, int64_t total, int M, int Lm)
{
    const int64_t i = (int64_t)blockIdx.x * THREADS + threadIdx.x;
    if (i >= total) return;
    ids[i] = landmark_idx[(i / M) * Lm + ids[i]];
}

// ---- stages (the direct calls and the plans run the same ones) ----

size_t topk_bytes(const lms_shape *s) { return align256(topk_workspace_bytes((int)rows_of(s), s->Lm)); }

int stage_scores(void *ctx, cudaStream_t stream)
{
    const landmark_score_plan *p = static_cast<landmark_score_plan *>(ctx);
    const ScorePlan pl = score_plan(&p->s);
    float *spill = pl.spill ? reinterpret_cast<float *>(static_cast<char *>(p->a.workspace) + topk_bytes(&p->s)) : nullptr;
    return p->s.D == 64 ? launch_scores<64>(pl, &p->s, &p->a, spill, stream)
                        : launch_scores<128>(pl, &p->s, &p->a, spill, stream);
}

float *cublas_logits(const landmark_score_plan *p)
{
    return reinterpret_cast<float *>(static_cast<char *>(p->a.workspace) + topk_bytes(&p->s));
}

// logits[b, hk*G + g, l] = q[b, hk*G + g] . landmarks[b, hk, l] / sqrt(D): per (b, hk) one GEMM, in
// column-major terms logits^T (Lm x G) = landmarks (D x Lm)^T q^T (D x G).
int stage_gemm(void *ctx, cudaStream_t stream)
{
    const landmark_score_plan *p = static_cast<landmark_score_plan *>(ctx);
    const lms_shape *s = &p->s;
    cublasHandle_t h = static_cast<cublasHandle_t>(p->cublas);
    CUBLAS_TRY(cublasSetStream(h, stream));
    const int G = groups_of(s), D = s->D, Lm = s->Lm;
    const float scale = 1.f / sqrtf((float)D), zero = 0.f;
    CUBLAS_TRY(cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, Lm, G, D, &scale, p->a.landmarks, CUDA_R_16BF, D,
                                          (long long)Lm * D, p->a.q, CUDA_R_16BF, D, (long long)G * D, &zero,
                                          cublas_logits(p), CUDA_R_32F, Lm, (long long)G * Lm, (int)rows_of(s),
                                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    return KVB_OK;
}

int stage_softmax(void *ctx, cudaStream_t stream)
{
    const landmark_score_plan *p = static_cast<landmark_score_plan *>(ctx);
    unsigned blocks = 0;
    int rc = kvb_grid_x("landmark_score_cublas", "B*Hq", (int64_t)p->s.B * p->s.Hq, 1, &blocks);
    if (rc) return rc;
    softmax_rows_kernel<<<blocks, THREADS, 0, stream>>>(cublas_logits(p), p->s.Lm);
    CUDA_TRY(cudaGetLastError());
    return KVB_OK;
}

int stage_group_max(void *ctx, cudaStream_t stream)
{
    const landmark_score_plan *p = static_cast<landmark_score_plan *>(ctx);
    const float *s = cublas_logits(p);
    float *m = p->a.m;
    const int G = groups_of(&p->s), Lm = p->s.Lm;
    const unsigned tiles = (unsigned)((Lm + THREADS - 1) / THREADS);
    return kvb_grid_chunks(rows_of(&p->s), [&](int64_t r0, unsigned n) -> int {
        group_max_kernel<<<dim3(tiles, n), THREADS, 0, stream>>>(s, m, G, Lm, r0);
        CUDA_TRY(cudaGetLastError());
        return KVB_OK;
    });
}

int stage_topk(void *ctx, cudaStream_t stream)
{
    const landmark_score_plan *p = static_cast<landmark_score_plan *>(ctx);
    return topk_rows(p->a.m, (int)rows_of(&p->s), p->s.Lm, p->s.Lm, p->s.M, 0, 0, p->a.chunks, p->s.M, p->a.workspace,
                     stream);
}

int stage_map(void *ctx, cudaStream_t stream)
{
    const landmark_score_plan *p = static_cast<landmark_score_plan *>(ctx);
    const int64_t total = rows_of(&p->s) * p->s.M;
    unsigned blocks = 0;
    int rc = kvb_grid_x("landmark_score", "B*Hkv*M", total, THREADS, &blocks);
    if (rc) return rc;
    map_ids_kernel<<<blocks, THREADS, 0, stream>>>(p->a.chunks, p->a.landmark_idx, total, p->s.M, p->s.Lm);
    CUDA_TRY(cudaGetLastError());
    return KVB_OK;
}

struct StageDef {
    const char *name;
    kvb_stage_fn fn;
};
const StageDef FUSED_STAGES[] = {{"scores", stage_scores}, {"topk", stage_topk}, {"map", stage_map}};
const StageDef CUBLAS_STAGES[] = {{"gemm", stage_gemm}, {"softmax", stage_softmax}, {"group_max", stage_group_max},
                                  {"topk", stage_topk}, {"map", stage_map}};

const StageDef *stages_of(lms_impl impl, int *n)
{
    *n = impl == LMS_CUBLAS ? 5 : 3;
    return impl == LMS_CUBLAS ? CUBLAS_STAGES : FUSED_STAGES;
}

// Everything a call needs, checked before anything is enqueued.
int check_call(const landmark_score_plan *p, const char *who)
{
    int rc = landmark_score_check(&p->s, who);
    if (rc) return rc;
    const lms_args *a = &p->a;
    if (!a->q || !a->landmarks || !a->landmark_idx || !a->chunks || !a->m)
        return kvb_fail(KVB_EINVAL, "%s: NULL pointer among q, landmarks, landmark_idx, chunks, m", who);
    if (p->impl == LMS_CUBLAS && !p->cublas) return kvb_fail(KVB_EINVAL, "%s: cublas_handle is NULL", who);
    size_t need = 0;
    rc = p->impl == LMS_CUBLAS ? landmark_score_cublas_workspace_bytes(&p->s, &need)
                               : landmark_score_workspace_bytes(&p->s, &need);
    if (rc) return rc;
    if (need > 0 && (!a->workspace || a->workspace_bytes < need))
        return kvb_fail(KVB_EINVAL, "%s: workspace_bytes=%zu out of range [%zu, ...) (workspace %s)", who,
                        a->workspace ? a->workspace_bytes : (size_t)0, need, a->workspace ? "too small" : "NULL");
    return KVB_OK;
}

int run_direct(landmark_score_plan *p, const char *who, cudaStream_t stream)
{
    int rc = check_call(p, who);
    if (rc) return rc;
    int n;
    const StageDef *st = stages_of(p->impl, &n);
    for (int i = 0; i < n; ++i)
        if ((rc = st[i].fn(p, stream))) return rc;
    return KVB_OK;
}

} // namespace

extern "C" int landmark_score_check(const lms_shape *s, const char *who)
{
    int rc = lms_shape_check(s, who);
    if (rc) return rc;
    if (s->D != 64 && s->D != 128) return kvb_fail(KVB_EINVAL, "%s: D=%d out of range {64, 128}", who, s->D);
    const int G = groups_of(s);
    if (G > LMS_CUDA_MAX_G)
        return kvb_fail(KVB_EINVAL, "%s: G = Hq/Hkv = %d/%d = %d out of range [1, %d] (query heads per KV head)", who,
                        s->Hq, s->Hkv, G, LMS_CUDA_MAX_G);
    return KVB_OK;
}

extern "C" int landmark_score_workspace_bytes(const lms_shape *s, size_t *bytes)
{
    int rc = landmark_score_check(s, "landmark_score");
    if (rc) return rc;
    *bytes = topk_bytes(s) + score_plan(s).spill_bytes;
    return KVB_OK;
}

extern "C" int landmark_score_cublas_workspace_bytes(const lms_shape *s, size_t *bytes)
{
    int rc = landmark_score_check(s, "landmark_score_cublas");
    if (rc) return rc;
    *bytes = topk_bytes(s) + (size_t)s->B * s->Hq * (size_t)s->Lm * sizeof(float);
    return KVB_OK;
}

extern "C" int landmark_score(const lms_shape *s, const lms_args *a, cudaStream_t stream)
{
    if (!s || !a) return kvb_fail(KVB_EINVAL, "landmark_score: NULL shape or arguments");
    landmark_score_plan p = {};
    p.impl = LMS_FUSED, p.s = *s, p.a = *a;
    return run_direct(&p, "landmark_score", stream);
}

extern "C" int landmark_score_cublas(void *cublas_handle, const lms_shape *s, const lms_args *a, cudaStream_t stream)
{
    if (!s || !a) return kvb_fail(KVB_EINVAL, "landmark_score_cublas: NULL shape or arguments");
    landmark_score_plan p = {};
    p.impl = LMS_CUBLAS, p.s = *s, p.a = *a, p.cublas = cublas_handle;
    return run_direct(&p, "landmark_score_cublas", stream);
}

extern "C" int landmark_score_plan_make(landmark_score_plan *p, const char *name, lms_impl impl, void *cublas_handle,
                                        const lms_shape *s, const lms_args *a, cudaStream_t stream, int timing)
{
    if (!p || !s || !a) return kvb_fail(KVB_EINVAL, "landmark_score_plan_make: NULL plan, shape or arguments");
    *p = landmark_score_plan{};
    p->impl = impl, p->s = *s, p->a = *a, p->cublas = cublas_handle;
    int rc = check_call(p, impl == LMS_CUBLAS ? "landmark_score_cublas" : "landmark_score");
    if (rc) return rc;
    kvb_step_init(&p->step, name, stream, stream);
    int n;
    const StageDef *st = stages_of(impl, &n);
    for (int i = 0; i < n; ++i)
        if (kvb_step_add(&p->step, st[i].name, 0, -1, st[i].fn, p) < 0) return KVB_EINVAL;
    return kvb_step_finalize(&p->step, timing);
}

extern "C" int landmark_score_plan_enqueue(landmark_score_plan *p) { return kvb_step_enqueue(&p->step); }

extern "C" void landmark_score_plan_destroy(landmark_score_plan *p) { kvb_step_destroy(&p->step); }
