// landmark_score.cu: ShadowKV's decode-time chunk selection (landmark_score.h).
//
// Napkin math (H200, ~4.5 TB/s read): Llama-3-8B at B=24 and 124928 tokens has B*Hkv = 192 rows of
// Lm = 15564 landmarks x 256 bytes = 765 MB, ~170 us to read once. Per landmark the G = 4 query heads
// of its KV head need 4 x 128 multiply-adds: 2 FLOP per byte (4 with GLM's G = 8). FMA on unpacked
// bf16 would need ~60% of the SM's issue slots at G = 8 just to keep up; one mma.sync m16n8k16 (16
// landmarks x 8 query heads x 16 dims) does 2048 multiply-adds, 8 of them cover a 4 KB tile, and the
// SM is left to keeping loads in flight.
//
// Why two kernels: no m can be written before the row's softmax max and sum are known. A kernel that
// keeps the logits on chip must stop streaming until every block of the row has its share of them
// (a cluster kernel that did so read at 47-67% of the read rate: kernels/landmark_score/NOTES.md,
// Tried). Here the streaming never waits on another block:
//  - scores (landmark_logits_kernel): independent blocks, each a contiguous run of one row's
//    landmarks, write the G base-2 logits to the workspace and, per block and head, the online-softmax
//    partials (the block's max of the logits, the sum of 2^(y - that max));
//  - normalize (landmark_normalize_kernel): combines a row's partials into its max and sum per head and
//    writes m = max over heads of 2^(y - max) / sum;
//  - then the suite's top-k reads m, and the map.
// Bytes per landmark at D = 128: 256 read and G x 4 written by the scores, G x 4 read and 4 written by
// the normalize, 260 + 8 G in all: 292 at G = 4 and 324 at G = 8 against 260 for the landmarks and m
// alone, 12% and 25% more (D = 64: 24% and 48%); the partials add 8 bytes per scores block and head.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include <cublas_v2.h>
#include <cuda_bf16.h>

#include "kernels/common/kvb_cuda.h"
#include "kernels/common/kvb_device.cuh"
#include "kernels/common/kvb_grid.h"
#include "kernels/landmark_score/landmark_score.h"
#include "kernels/select/select.h"

namespace {

using bf16 = __nv_bfloat16;

constexpr int THREADS = 256, NW = THREADS / 32;
constexpr float LOG2E = 1.4426950408889634f;

// The scores grid: a row's landmarks in runs of `per` (a multiple of the 16-landmark tile), one block
// each. Blocks of equal work end spread over about one block's duration, with SMs around them idle at
// the end, so runs are short (the grid many waves deep), but long enough that a block's start (q, the
// first loads' latency) and end (the partials) are small against its stream, which the SM's other
// block covers meanwhile.
constexpr int SCORE_BLOCKS_PER_SM = 2;        // __launch_bounds__: 128 registers at most
constexpr int SCORE_WAVES = 16;               // runs sized for about this many waves of blocks
constexpr int MIN_RUN = 512, MAX_RUN = 4096;  // landmarks per scores block
constexpr int MAX_SPLIT = 1024;               // scores blocks per row: bounds the partials a normalize block combines
constexpr int NORM_RUN = 2048;                // landmarks per normalize block: 256 threads x 4 landmarks x 2 steps

size_t align256(size_t b) { return (b + 255) & ~(size_t)255; }
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
int groups_of(const lms_shape *s) { return s->Hq / s->Hkv; }
int64_t rows_of(const lms_shape *s) { return (int64_t)s->B * s->Hkv; }

// A row's logits per head in the workspace: Lm rounded up to the tile, so that every head's row starts
// 16-byte aligned and the scores blocks store whole tiles (the last tile's tail past Lm included, which
// the normalize's 16-byte loads then read without reading unwritten memory).
int padded_lm(int Lm) { return (int)ceil_div(Lm, 16) * 16; }

// The most scores blocks a row gets on any device (the partials' workspace is sized by it).
int max_split(int Lm) { return (int)std::min<int64_t>(ceil_div(Lm, MIN_RUN), MAX_SPLIT); }

struct SplitPlan {
    int per;    // landmarks per scores block
    int nblk;   // scores blocks per row, every one with at least one landmark
    int Lp;     // padded_lm
    int nchunk; // normalize blocks per row
};

SplitPlan split_plan(const lms_shape *s)
{
    const int sms = kvb_sm_count(); // 0 (unreadable): planned as for one SM, valid on any GPU
    const int64_t target_blocks = (int64_t)SCORE_WAVES * SCORE_BLOCKS_PER_SM * (sms > 0 ? sms : 1);
    int64_t per = ceil_div(rows_of(s) * s->Lm, target_blocks);
    per = std::min<int64_t>(std::max<int64_t>(per, MIN_RUN), MAX_RUN);
    per = std::max<int64_t>(per, ceil_div(s->Lm, MAX_SPLIT));
    SplitPlan p;
    p.per = (int)ceil_div(per, 16) * 16;
    p.nblk = (int)ceil_div(s->Lm, p.per);
    p.Lp = padded_lm(s->Lm);
    p.nchunk = (int)ceil_div(s->Lm, NORM_RUN);
    return p;
}

// (mx, sum) := the union of two online-softmax partials, each a max of base-2 logits and the sum of
// 2^(y - that max) over them; (-inf, 0) is the empty set, and (y, 1) the single logit y.
__device__ __forceinline__ void merge_partial(float &mx, float &sum, float mx2, float sum2)
{
    const float m = fmaxf(mx, mx2);
    if (m == -INFINITY) return; // both empty
    sum = sum * exp2f(mx - m) + sum2 * exp2f(mx2 - m);
    mx = m;
}

// ---- scores: the logits and the per-block partials ----

struct ScoreArgs {
    const bf16 *q, *landmarks;
    float *logits;    // [rows][G][Lp]
    float2 *partials; // [rows][nblk][G]: a scores block's (max, sum of 2^(y - max)) per head
    int Hq, Hkv, G, Lm, Lp, per, nblk;
    float scale_log2; // log2(e) / sqrt(D): logits in base 2, exp2 in the softmax
};

// Landmark rows g and g + 8 of 16-landmark tile `tile` of a run of n landmarks: thread (g, t)'s 16-byte
// words u = 4j + t of each. Rows past the run (the last tile of a row) read the run's last landmark
// again: no zero fill to wait on, and their logits land in the padding past Lm, outside the partials.
template <int D>
__device__ __forceinline__ void load_tile(uint4 (&v)[2][D / 32], const bf16 *run, int tile, int n, int g, int t)
{
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const uint4 *p = reinterpret_cast<const uint4 *>(run + (int64_t)min(tile * 16 + g + 8 * h, n - 1) * D);
#pragma unroll
        for (int j = 0; j < D / 32; ++j) v[h][j] = kvb_dev::ldg16(p + 4 * j + t);
    }
}

// One block: landmarks [lo, lo + n) of row (b, hk) = blockIdx.x / nblk, lo = (blockIdx.x % nblk) * per.
// Warp w takes tiles w, w + NW, ... (the block's warps together stream a contiguous stretch). Its SLOTS
// register slots hold one tile each, and a slot is refilled with its next tile as soon as its MMAs are
// issued, so the warp keeps SLOTS - 1 to SLOTS tiles in flight while it computes (SLOTS tiles: 8 KB).
// The loads' destinations are registers, so the bytes in flight per SM are a share of the register
// file whatever the occupancy: 2 blocks x 256 threads x 64 data registers x 4 bytes = 128 KB, against
// the ~35 KB that 4.5 TB/s over 132 SMs needs at ~1 us of loaded latency; three blocks per SM would
// need 80 registers and spill.
// For a tile, 2 D/32 MMAs give the 16 x 8 logits (landmarks x query heads, heads >= G zero columns),
// stored straight from the fragments: each store instruction writes 8 consecutive landmarks of a
// head, whole 32-byte sectors, so a shared-memory staging would only save store instructions.
// MMA operands straight from 16-byte loads: a dot product does not care in which order it visits the
// dimensions, so thread (g, t) loads the 16-byte words u = 4j + t of landmark rows g and g + 8 and of
// query head g, and feeds word u's 8 values to the k slots it owns in two MMAs (elements 0-1 and 2-3
// as k = 2t.., 2t+8..; then 4-5 and 6-7): A and B pair the same dimension everywhere.
template <int D>
__global__ void __launch_bounds__(THREADS, SCORE_BLOCKS_PER_SM) landmark_logits_kernel(ScoreArgs a)
{
    constexpr int NJ = D / 32;     // 16-byte words per thread per landmark row
    constexpr int SLOTS = 256 / D; // tiles per warp in flight: 8 KB of landmarks at D = 64 and 128
    __shared__ float2 red[NW][LMS_CUDA_MAX_G];

    const int64_t row = blockIdx.x / a.nblk;
    const int blk = blockIdx.x % a.nblk;
    const int G = a.G, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
    const int lo = blk * a.per, n = min(a.per, a.Lm - lo), tiles = (n + 15) / 16;
    const bf16 *run = a.landmarks + (row * a.Lm + lo) * D;

    uint4 v[SLOTS][2][NJ];
#pragma unroll
    for (int s = 0; s < SLOTS; ++s)
        if (warp + s * NW < tiles) load_tile<D>(v[s], run, warp + s * NW, n, g, t);
    uint4 qf[NJ];
    {
        const int64_t b = row / a.Hkv, hk = row % a.Hkv;
        const uint4 *qrow = reinterpret_cast<const uint4 *>(a.q + ((b * a.Hq + hk * G + min(g, G - 1)) * D));
#pragma unroll
        for (int j = 0; j < NJ; ++j) qf[j] = g < G ? kvb_dev::ldg16(qrow + 4 * j + t) : make_uint4(0, 0, 0, 0);
    }
    float *y_out = a.logits + (row * G + 2 * t) * a.Lp + lo; // head 2t; head 2t + 1 is Lp further

    float mx[2] = {-INFINITY, -INFINITY}, sum[2] = {0.f, 0.f}; // heads 2t, 2t + 1 over the thread's landmarks
    for (int t0 = warp; t0 < tiles; t0 += SLOTS * NW) {
#pragma unroll
        for (int s = 0; s < SLOTS; ++s) {
            const int tile = t0 + s * NW;
            if (tile >= tiles) break; // warp-uniform
            float c[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int j = 0; j < NJ; ++j) {
                kvb_dev::mma_bf16(c, v[s][0][j].x, v[s][1][j].x, v[s][0][j].y, v[s][1][j].y, qf[j].x, qf[j].y);
                kvb_dev::mma_bf16(c, v[s][0][j].z, v[s][1][j].z, v[s][0][j].w, v[s][1][j].w, qf[j].z, qf[j].w);
            }
            if (tile + SLOTS * NW < tiles) load_tile<D>(v[s], run, tile + SLOTS * NW, n, g, t);
            const int la = tile * 16 + g, lb = la + 8;
#pragma unroll
            for (int j = 0; j < 2; ++j) { // head 2t + j: c[j] at landmark la, c[2 + j] at lb
                if (2 * t + j >= G) continue;
                const float ya = c[j] * a.scale_log2, yb = c[2 + j] * a.scale_log2;
                y_out[j * a.Lp + la] = ya, y_out[j * a.Lp + lb] = yb;
                merge_partial(mx[j], sum[j], la < n ? ya : -INFINITY, 1.f);
                merge_partial(mx[j], sum[j], lb < n ? yb : -INFINITY, 1.f);
            }
        }
    }

    kvb_dev::chain_release(); // the stream is read: the chained normalize may be scheduled

    // the block's partials: over the 8 landmark rows g of the warp's fragments, then over the warps
#pragma unroll
    for (int j = 0; j < 2; ++j) {
#pragma unroll
        for (int o = 4; o <= 16; o <<= 1)
            merge_partial(mx[j], sum[j], __shfl_xor_sync(0xffffffffu, mx[j], o), __shfl_xor_sync(0xffffffffu, sum[j], o));
        if (g == 0 && 2 * t + j < G) red[warp][2 * t + j] = make_float2(mx[j], sum[j]);
    }
    __syncthreads();
    if (threadIdx.x < G) {
        float m = -INFINITY, s = 0.f;
        for (int w = 0; w < NW; ++w) merge_partial(m, s, red[w][threadIdx.x].x, red[w][threadIdx.x].y);
        a.partials[(row * a.nblk + blk) * G + threadIdx.x] = make_float2(m, s);
    }
}

template <int D>
int launch_logits(const SplitPlan &pl, const lms_shape *s, const lms_args *a, float *logits, float2 *partials,
                  cudaStream_t stream)
{
    unsigned blocks = 0;
    int rc = kvb_grid_x("landmark_score", "B*Hkv*blocks_per_row", rows_of(s) * pl.nblk, 1, &blocks);
    if (rc) return rc;
    ScoreArgs k;
    k.q = reinterpret_cast<const bf16 *>(a->q);
    k.landmarks = reinterpret_cast<const bf16 *>(a->landmarks);
    k.logits = logits, k.partials = partials;
    k.Hq = s->Hq, k.Hkv = s->Hkv, k.G = groups_of(s), k.Lm = s->Lm, k.Lp = pl.Lp, k.per = pl.per, k.nblk = pl.nblk;
    k.scale_log2 = LOG2E / sqrtf((float)D);
    landmark_logits_kernel<D><<<blocks, THREADS, 0, stream>>>(k);
    CUDA_TRY(cudaGetLastError());
    return KVB_OK;
}

// ---- normalize: the row's softmax per head, m = the maximum over the heads ----

struct NormalizeArgs {
    const float *logits;     // [rows][G][Lp]
    const float2 *partials;  // [rows][nblk][G]
    float *m;                // [rows][Lm]
    int G, Lm, Lp, nblk, nchunk;
};

// One block: landmarks [chunk * NORM_RUN, +NORM_RUN) of row blockIdx.x / nchunk, 4 per thread and step
// (16-byte loads of each head's logits). Every block combines its row's nblk partials again (warp h
// head h) rather than a step of their own doing it once per row: that is nblk x G x 8 bytes read per
// block, L2 hits, against NORM_RUN x G x 4 bytes of logits, a fraction nblk / 1024 of the block's reads
// (at most 6% at the bench shapes on an H200, nblk <= 61; equal at MAX_SPLIT = 1024, rows of 2^20 to
// 2^21 landmarks), where a step of its own would add a launch and a dependency (microseconds) to every
// shape.
template <int MAXG, int PRE>
__global__ void __launch_bounds__(THREADS) landmark_normalize_kernel(NormalizeArgs a)
{
    static_assert(NW >= MAXG, "one warp per head");
    constexpr int STEPS = NORM_RUN / (4 * THREADS);
    static_assert(PRE >= 1 && PRE <= STEPS, "steps whose logits are requested before the partials");
    __shared__ float row_max[MAXG], row_inv[MAXG];
    const int64_t row = blockIdx.x / a.nchunk;
    const int chunk = blockIdx.x % a.nchunk, G = a.G, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const float *y = a.logits + row * G * a.Lp;
    float *m = a.m + row * a.Lm;
    const int end = min(a.Lm, (chunk + 1) * NORM_RUN), l0 = chunk * NORM_RUN + 4 * threadIdx.x;

    kvb_dev::chain_wait(); // launched chained (kvb_device.cuh): the scores kernel has ended
    // the first PRE steps' logits are requested before the partials are combined, so the two reads'
    // latencies overlap instead of following each other
    uint4 w[PRE][MAXG];
#pragma unroll
    for (int st = 0; st < PRE; ++st)
#pragma unroll
        for (int h = 0; h < MAXG; ++h)
            if (h < G && l0 + st * 4 * THREADS < end) w[st][h] = kvb_dev::ldg16(y + (int64_t)h * a.Lp + l0 + st * 4 * THREADS);

    if (warp < G) {
        const float2 *p = a.partials + row * a.nblk * G + warp;
        float mx = -INFINITY, sum = 0.f;
        for (int b = lane; b < a.nblk; b += 32) {
            const float2 x = p[(int64_t)b * G];
            merge_partial(mx, sum, x.x, x.y);
        }
#pragma unroll
        for (int o = 16; o >= 1; o >>= 1)
            merge_partial(mx, sum, __shfl_xor_sync(0xffffffffu, mx, o), __shfl_xor_sync(0xffffffffu, sum, o));
        if (lane == 0) row_max[warp] = mx, row_inv[warp] = 1.f / sum;
    }
    __syncthreads();
    // the chained top-k may be scheduled once the block has requested all its logits: here where every
    // step's were prefetched, after the last step's loads otherwise
    if (PRE == STEPS) kvb_dev::chain_release();

#pragma unroll
    for (int st = 0; st < STEPS; ++st) {
        const int l = l0 + st * 4 * THREADS;
        if (l >= end) break;
        uint4 v[MAXG];
#pragma unroll
        for (int h = 0; h < MAXG; ++h)
            if (h < G) v[h] = st < PRE ? w[st < PRE ? st : 0][h] : kvb_dev::ldg16(y + (int64_t)h * a.Lp + l);
        float x[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int h = 0; h < MAXG; ++h)
            if (h < G) {
                const uint32_t u[4] = {v[h].x, v[h].y, v[h].z, v[h].w};
#pragma unroll
                for (int i = 0; i < 4; ++i) x[i] = fmaxf(x[i], exp2f(__uint_as_float(u[i]) - row_max[h]) * row_inv[h]);
            }
        if (l + 4 <= end && reinterpret_cast<uintptr_t>(m + l) % 16 == 0)
            *reinterpret_cast<float4 *>(m + l) = make_float4(x[0], x[1], x[2], x[3]);
        else
            for (int i = 0; i < 4 && l + i < end; ++i) m[l + i] = x[i];
    }
    if (PRE < STEPS) kvb_dev::chain_release();
}

int launch_normalize(const SplitPlan &pl, const lms_shape *s, float *m, const float *logits, const float2 *partials,
                     cudaStream_t stream)
{
    unsigned blocks = 0;
    int rc = kvb_grid_x("landmark_score", "B*Hkv*chunks_per_row", rows_of(s) * pl.nchunk, 1, &blocks);
    if (rc) return rc;
    NormalizeArgs k;
    k.logits = logits, k.partials = partials, k.m = m;
    k.G = groups_of(s), k.Lm = s->Lm, k.Lp = pl.Lp, k.nblk = pl.nblk, k.nchunk = pl.nchunk;
    // the logits requested ahead: both steps' at G <= 4 (60 registers), the first step's at larger G (both
    // steps' at G = 8 took 96 registers, two blocks a SM, and measured slower)
    CUDA_TRY(kvb_dev::launch_chained(k.G <= 4 ? landmark_normalize_kernel<4, 2> : landmark_normalize_kernel<LMS_CUDA_MAX_G, 1>,
                                     dim3(blocks), dim3(THREADS), 0, stream, k));
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
    kvb_dev::chain_wait(); // launched chained (kvb_device.cuh): the top-k has ended
    kvb_dev::chain_release();
    const int64_t i = (int64_t)blockIdx.x * THREADS + threadIdx.x;
    if (i >= total) return;
    ids[i] = landmark_idx[(i / M) * Lm + ids[i]];
}

// ---- stages (the direct calls and the plans run the same ones) ----

size_t topk_bytes(const lms_shape *s) { return align256(topk_workspace_bytes((int)rows_of(s), s->Lm)); }

// impl=kernel's workspace: the top-k's, then the logits, then the partials.
size_t logits_bytes(const lms_shape *s)
{
    return align256((size_t)rows_of(s) * groups_of(s) * padded_lm(s->Lm) * sizeof(float));
}
size_t partials_bytes(const lms_shape *s)
{
    return align256((size_t)rows_of(s) * max_split(s->Lm) * groups_of(s) * sizeof(float2));
}
float *logits_of(const landmark_score_plan *p)
{
    return reinterpret_cast<float *>(static_cast<char *>(p->a.workspace) + topk_bytes(&p->s));
}
float2 *partials_of(const landmark_score_plan *p)
{
    return reinterpret_cast<float2 *>(static_cast<char *>(p->a.workspace) + topk_bytes(&p->s) + logits_bytes(&p->s));
}

int stage_scores(void *ctx, cudaStream_t stream)
{
    const landmark_score_plan *p = static_cast<landmark_score_plan *>(ctx);
    const SplitPlan pl = split_plan(&p->s);
    return p->s.D == 64 ? launch_logits<64>(pl, &p->s, &p->a, logits_of(p), partials_of(p), stream)
                        : launch_logits<128>(pl, &p->s, &p->a, logits_of(p), partials_of(p), stream);
}

int stage_normalize(void *ctx, cudaStream_t stream)
{
    const landmark_score_plan *p = static_cast<landmark_score_plan *>(ctx);
    return launch_normalize(split_plan(&p->s), &p->s, p->a.m, logits_of(p), partials_of(p), stream);
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
    CUDA_TRY(kvb_dev::launch_chained(map_ids_kernel, dim3(blocks), dim3(THREADS), 0, stream, p->a.chunks,
                                     (const int32_t *)p->a.landmark_idx, total, p->s.M, p->s.Lm));
    return KVB_OK;
}

struct StageDef {
    const char *name;
    kvb_stage_fn fn;
};
const StageDef FUSED_STAGES[] = {{"scores", stage_scores}, {"normalize", stage_normalize}, {"topk", stage_topk},
                                 {"map", stage_map}};
const StageDef CUBLAS_STAGES[] = {{"gemm", stage_gemm}, {"softmax", stage_softmax}, {"group_max", stage_group_max},
                                  {"topk", stage_topk}, {"map", stage_map}};

const StageDef *stages_of(lms_impl impl, int *n)
{
    *n = impl == LMS_CUBLAS ? 5 : 4;
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
    if (p->impl == LMS_FUSED) return kvb_check_aligned16(who, "workspace", a->workspace); // the logits' 16-byte loads
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
    *bytes = topk_bytes(s) + logits_bytes(s) + partials_bytes(s);
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
