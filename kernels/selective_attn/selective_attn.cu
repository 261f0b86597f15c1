// selective_attn.cu: selective flash attention (O, LSE and exact column sums), the forward alone,
// the column-sum pass alone, and the cuBLAS-materialized peer: the mma.sync passes (any sm_80+
// device; impl=*_mma, and the forward with need_out=0 everywhere), the entry points that pick the
// Hopper passes of selective_attn_wgmma.cu where they run, and the peer. Design in selective_attn.h;
// budget and what was tried: kernels/selective_attn/NOTES.md.
//
// Napkin math (B=1, H=32, D=128, causal, L=16K; pairs = H * L(L+1)/2 = 4.3e9):
//   forward   4 * D * pairs = 2.2 TFLOP (Q K^T and P V); its bytes (Q, K, V, O: 4 * 128 MiB) are
//             nothing next to that.
//   colsum    2 * D * pairs = 1.1 TFLOP (Q K^T again) plus one exp per pair (4.3e9 exps; the SFU does
//             16 per clock per SM: ~1.0 ms on 132 SMs at 1.98 GHz, overlappable with the MMAs).
//   mma.sync keeps the tensor cores below Hopper's wgmma rate, so these passes are the portable
//   baseline and the A/B reference for the Hopper ones, not the fast path.
//
// Fragment layouts (PTX ISA, mma.m16n8k16 bf16): lane = 4 * g + t.
//   A (16x16, row-major): reg0 = (row g, k 2t..2t+1), reg1 = (row g+8, k 2t..), reg2 = (row g, k 2t+8..),
//                         reg3 = (row g+8, k 2t+8..)
//   B (16x8, "col"):      reg0 = (k 2t..2t+1, col g), reg1 = (k 2t+8.., col g)
//   C (16x8, fp32):       c0, c1 = (row g, cols 2t, 2t+1), c2, c3 = (row g+8, cols 2t, 2t+1)
// Shared-memory tiles hold rows of D bf16 (D*2 bytes) in 16-byte chunks; chunk c of row r is stored at
// chunk c ^ (r & 7), so the 8 rows an ldmatrix phase reads fall in 8 different bank groups.
#include <cstdint>

#include <cublas_v2.h>
#include <cuda_bf16.h>

#include "kernels/common/kvb_cuda.h"
#include "kernels/common/kvb_device.cuh"
#include "kernels/selective_attn/selective_attn.h"

typedef __nv_bfloat16 bf16;
using namespace kvb_dev; // PTX wrappers, packing, warp reductions

namespace {

constexpr float LOG2E = 1.4426950408889634f;
constexpr float LN2 = 0.6931471805599453f;

// ---- shared-memory tiles ----------------------------------------------------------------------------

// byte offset of 16-byte chunk `c` of row `r` in a swizzled tile of ROWB-byte rows
template <int ROWB> __device__ __forceinline__ uint32_t swz(int r, int c) { return r * ROWB + ((c ^ (r & 7)) << 4); }

// ROWS rows of D bf16 from global rows row0.. (zero past L) into a swizzled shared tile
template <int ROWS, int D, int NTHREADS>
__device__ __forceinline__ void load_rows(uint32_t s_tile, const bf16 *g, int row0, int L, int tid)
{
    constexpr int CPR = D / 8, CHUNKS = ROWS * CPR;
    static_assert(CHUNKS % NTHREADS == 0, "tile chunks must divide evenly among the threads");
#pragma unroll
    for (int i = 0; i < CHUNKS / NTHREADS; ++i) {
        const int c = tid + i * NTHREADS, r = c / CPR, ch = c % CPR, gr = row0 + r;
        const bool ok = gr < L;
        cp_async16(s_tile + swz<D * 2>(r, ch), g + (int64_t)(ok ? gr : 0) * D + ch * 8, ok);
    }
}

// ---- pass 1: forward -------------------------------------------------------------------------------

constexpr int FWD_BR = 128, FWD_BC = 64, FWD_THREADS = 256; // 8 warps x 16 query rows

struct FwdArgs {
    const bf16 *Q, *K, *V;
    bf16 *O;
    float *lse;            // written directly when splits == 1
    float *part_m, *part_l; // [splits][BH][rows] when splits > 1 (m in log2 units; rows: FwdPlan)
    int G, L;
    int q_first, n_qtiles; // rows q_first .. are computed, in n_qtiles tiles
    int lse_len, lse_row0;
    int splits, split_keys; // keys [s * split_keys, (s + 1) * split_keys) go to split s
    int pack_rows;          // PACKED: rows q_first .. q_first + pack_rows - 1 of each of the G query heads
    float scale, scale_log2;
};

// PACKED tile: the G query heads of one KV head share its keys, so with few rows a head (need_out=0,
// G * pack_rows <= FWD_BR) one CTA holds them all: tile row r is row q_first + r % pack_rows of query
// head r / pack_rows (zero past G heads). Each key tile then feeds G heads' rows, not one head's and
// the rows below w0 that a 128-row tile of one head would compute and drop.
template <int D, int NTHREADS>
__device__ __forceinline__ void load_q_packed(uint32_t s_tile, const bf16 *Q, int64_t bh0, int G, int rows, int q_first,
                                              int L, int tid)
{
    constexpr int CPR = D / 8, CHUNKS = FWD_BR * CPR;
    static_assert(CHUNKS % NTHREADS == 0, "tile chunks must divide evenly among the threads");
#pragma unroll
    for (int i = 0; i < CHUNKS / NTHREADS; ++i) {
        const int c = tid + i * NTHREADS, r = c / CPR, ch = c % CPR, h = r / rows;
        const bool ok = h < G;
        const int64_t row = ok ? (bh0 + h) * L + q_first + r % rows : 0;
        cp_async16(s_tile + swz<D * 2>(r, ch), Q + row * D + ch * 8, ok);
    }
}

constexpr int FWD_STAGES = 3; // K (and V) tiles in flight

template <int D, bool NEED_OUT> constexpr int fwd_smem_bytes()
{
    return FWD_BR * D * 2 + FWD_STAGES * FWD_BC * D * 2 * (NEED_OUT ? 2 : 1);
}

template <int D, bool CAUSAL, bool NEED_OUT, bool PACKED>
__global__ void __launch_bounds__(FWD_THREADS, 1) fwd_kernel(const FwdArgs a)
{
    static_assert(!(PACKED && NEED_OUT), "a packed tile computes LSE only");
    constexpr int STAGES = FWD_STAGES;
    constexpr int KSTEPS = D / 16, NT = FWD_BC / 8, DT = D / 8, ROWB = D * 2;
    constexpr uint32_t KV_TILE = FWD_BC * ROWB;
    extern __shared__ __align__(128) uint8_t smem[];
    const uint32_t q_s = smem_u32(smem), k_s = q_s + FWD_BR * ROWB, v_s = k_s + STAGES * KV_TILE;

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int L = a.L;
    // PACKED: blockIdx.x is the KV head and the tile's rows are G heads' (load_q_packed); else
    // blockIdx.x is the query head and blockIdx.y its 128-row tile
    const int64_t bh = blockIdx.x, bkv = PACKED ? bh : bh / a.G;
    const int q0 = a.q_first + (PACKED ? 0 : (a.n_qtiles - 1 - (int)blockIdx.y) * FWD_BR); // the longest rows first
    const int split = blockIdx.z;
    const bf16 *Qg = a.Q + bh * L * D, *Kg = a.K + bkv * L * D, *Vg = a.V + bkv * L * D;
    const int kbeg = split * a.split_keys;
    int kend = min(L, kbeg + a.split_keys);
    if (CAUSAL) kend = min(kend, q0 + (PACKED ? a.pack_rows : FWD_BR));
    const int n_tiles = kend > kbeg ? (kend - kbeg + FWD_BC - 1) / FWD_BC : 0;

    if (n_tiles > 0) { // group s holds tile s (group 0 also Q)
        if (PACKED)
            load_q_packed<D, FWD_THREADS>(q_s, a.Q, bkv * a.G, a.G, a.pack_rows, q0, L, tid);
        else
            load_rows<FWD_BR, D, FWD_THREADS>(q_s, Qg, q0, L, tid);
#pragma unroll
        for (int s = 0; s < STAGES - 1; ++s) {
            if (s < n_tiles) {
                load_rows<FWD_BC, D, FWD_THREADS>(k_s + s * KV_TILE, Kg, kbeg + s * FWD_BC, L, tid);
                if (NEED_OUT) load_rows<FWD_BC, D, FWD_THREADS>(v_s + s * KV_TILE, Vg, kbeg + s * FWD_BC, L, tid);
            }
            cp_async_commit();
        }
    }

    // the positions of this thread's rows g and g + 8, and the lowest of the warp's rows (packed: q0)
    const int row_w = q0 + (PACKED ? 0 : warp * 16);
    int pos[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) pos[r] = PACKED ? q0 + (warp * 16 + g + 8 * r) % a.pack_rows : row_w + g + 8 * r;
    uint32_t qf[KSTEPS][4];
    float o[DT][4];
#pragma unroll
    for (int d = 0; d < DT; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.f;
    float m_r[2] = {-INFINITY, -INFINITY}, l_r[2] = {0.f, 0.f}; // rows g and g + 8; m in raw score units

    for (int it = 0; it < n_tiles; ++it) {
        cp_async_wait<STAGES - 2>();
        __syncthreads(); // tile `it` is in, and every warp is done with tile it - 1's buffers
        if (it == 0) {
#pragma unroll
            for (int kk = 0; kk < KSTEPS; ++kk)
                ldsm_x4(qf[kk], q_s + swz<ROWB>(warp * 16 + (lane & 15), 2 * kk + (lane >> 4)));
        }
        {
            const int nx = it + STAGES - 1;
            if (nx < n_tiles) {
                const uint32_t st = (nx % STAGES) * KV_TILE;
                load_rows<FWD_BC, D, FWD_THREADS>(k_s + st, Kg, kbeg + nx * FWD_BC, L, tid);
                if (NEED_OUT) load_rows<FWD_BC, D, FWD_THREADS>(v_s + st, Vg, kbeg + nx * FWD_BC, L, tid);
            }
            cp_async_commit();
        }
        const int k0 = kbeg + it * FWD_BC;
        const uint32_t kt = k_s + (it % STAGES) * KV_TILE;

        // S = Q K^T: 16 rows x 64 keys per warp
        float s[NT][4];
#pragma unroll
        for (int n = 0; n < NT; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < KSTEPS; ++kk) {
#pragma unroll
            for (int np = 0; np < NT / 2; ++np) {
                uint32_t b[4]; // keys np*16 + (lane>>4)*8 + (lane&7), d chunk 2kk + ((lane>>3)&1)
                ldsm_x4(b, kt + swz<ROWB>(np * 16 + (lane >> 4) * 8 + (lane & 7), 2 * kk + ((lane >> 3) & 1)));
                mma_bf16(s[2 * np], qf[kk], b[0], b[1]);
                mma_bf16(s[2 * np + 1], qf[kk], b[2], b[3]);
            }
        }
        if (k0 + FWD_BC > L || (CAUSAL && k0 + FWD_BC - 1 > row_w)) {
#pragma unroll
            for (int n = 0; n < NT; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int j = k0 + n * 8 + 2 * t + (e & 1);
                    if (j >= L || (CAUSAL && j > pos[e >> 1])) s[n][e] = -INFINITY;
                }
        }

        // online softmax
        float mx[2] = {m_r[0], m_r[1]};
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            mx[0] = fmaxf(mx[0], fmaxf(s[n][0], s[n][1]));
            mx[1] = fmaxf(mx[1], fmaxf(s[n][2], s[n][3]));
        }
        float alpha[2], msc[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            mx[r] = warp_max<1, 2>(mx[r]); // the quad holding the row
            alpha[r] = m_r[r] == -INFINITY ? 0.f : ex2((m_r[r] - mx[r]) * a.scale_log2);
            msc[r] = mx[r] == -INFINITY ? 0.f : mx[r] * a.scale_log2;
            m_r[r] = mx[r];
            l_r[r] *= alpha[r];
        }
        // P = exp2(s * scale_log2 - m): all exps, then the P V MMAs (each 16-key group's exps right
        // before its P V MMAs was slower: NOTES.md).
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            s[n][0] = ex2(fmaf(s[n][0], a.scale_log2, -msc[0]));
            s[n][1] = ex2(fmaf(s[n][1], a.scale_log2, -msc[0]));
            s[n][2] = ex2(fmaf(s[n][2], a.scale_log2, -msc[1]));
            s[n][3] = ex2(fmaf(s[n][3], a.scale_log2, -msc[1]));
            l_r[0] += s[n][0] + s[n][1];
            l_r[1] += s[n][2] + s[n][3];
        }
        if (NEED_OUT) {
#pragma unroll
            for (int d = 0; d < DT; ++d) {
                o[d][0] *= alpha[0], o[d][1] *= alpha[0];
                o[d][2] *= alpha[1], o[d][3] *= alpha[1];
            }
        }
        const uint32_t vt = v_s + (it % STAGES) * KV_TILE;
        if (NEED_OUT) {
#pragma unroll
            for (int kk = 0; kk < FWD_BC / 16; ++kk) {
                const uint32_t pa[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]), pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                                        pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                        pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
                for (int dp = 0; dp < D / 16; ++dp) {
                    uint32_t b[4]; // keys kk*16 + ((lane>>3)&1)*8 + (lane&7), d chunk 2dp + (lane>>4), transposed
                    ldsm_x4_trans(b, vt + swz<ROWB>(kk * 16 + ((lane >> 3) & 1) * 8 + (lane & 7), 2 * dp + (lane >> 4)));
                    mma_bf16(o[2 * dp], pa, b[0], b[1]);
                    mma_bf16(o[2 * dp + 1], pa, b[2], b[3]);
                }
            }
        }
    }

    // epilogue: full row sums, LSE (or the split's partial), O
#pragma unroll
    for (int r = 0; r < 2; ++r) l_r[r] = warp_sum<1, 2>(l_r[r]);
    if (t == 0) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int i = pos[r], h = PACKED ? (warp * 16 + g + 8 * r) / a.pack_rows : 0;
            if (PACKED && h >= a.G) continue; // a row past the G heads: zero, not stored
            const int64_t bhr = PACKED ? bkv * a.G + h : bh; // the row's query head
            if (a.splits == 1) {
                if (i < L && i >= a.lse_row0) a.lse[bhr * a.lse_len + (i - a.lse_row0)] = m_r[r] * a.scale + logf(l_r[r]);
            } else {
                const int64_t R = PACKED ? a.pack_rows : (int64_t)a.n_qtiles * FWD_BR;
                const int64_t BH = (int64_t)gridDim.x * (PACKED ? a.G : 1);
                const int64_t at = ((int64_t)split * BH + bhr) * R + (i - a.q_first);
                a.part_m[at] = m_r[r] == -INFINITY ? -INFINITY : m_r[r] * a.scale_log2;
                a.part_l[at] = l_r[r];
            }
        }
    }
    if (NEED_OUT) {
        const float inv[2] = {1.f / l_r[0], 1.f / l_r[1]}; // l > 0: key 0 is visible to every row
        __syncthreads();                                   // every warp is done reading shared memory
#pragma unroll
        for (int d = 0; d < DT; ++d) {
            const int r = warp * 16 + g;
            sts32(q_s + swz<ROWB>(r, d) + 4 * t, pack_bf16(o[d][0] * inv[0], o[d][1] * inv[0]));
            sts32(q_s + swz<ROWB>(r + 8, d) + 4 * t, pack_bf16(o[d][2] * inv[1], o[d][3] * inv[1]));
        }
        __syncthreads();
        constexpr int CPR = D / 8;
        bf16 *Og = a.O + bh * L * D;
#pragma unroll
        for (int k = 0; k < FWD_BR * CPR / FWD_THREADS; ++k) {
            const int c = tid + k * FWD_THREADS, r = c / CPR, ch = c % CPR;
            if (q0 + r < L) {
                *reinterpret_cast<uint4 *>(Og + (int64_t)(q0 + r) * D + ch * 8) = lds128(q_s + swz<ROWB>(r, ch));
            }
        }
    }
}

// LSE of the rows split over several CTAs: one warp a row, its lanes over the splits (lane, lane + 32,
// ..), then the max and the sum each by a butterfly: a fixed order, so the result does not depend on the
// launch. (A thread a row read its splits one after the other, a few hundred rows on a few SMs.)
constexpr int MERGE_THREADS = 256;
__global__ void __launch_bounds__(MERGE_THREADS) merge_lse_kernel(const float *part_m, const float *part_l, int splits, int64_t BH,
                                                                  int R, int q_first, int L, float *lse, int lse_len, int lse_row0)
{
    const int64_t x = ((int64_t)blockIdx.x * MERGE_THREADS + threadIdx.x) >> 5; // the row: the same for the warp
    const int lane = threadIdx.x & 31;
    if (x >= BH * R) return;
    const int64_t bh = x / R;
    const int row = q_first + (int)(x % R);
    if (row >= L || row < lse_row0) return;
    const int64_t stride = BH * R;
    float M = -INFINITY;
    for (int s = lane; s < splits; s += 32) M = fmaxf(M, part_m[s * stride + x]);
    M = warp_max<16, 1>(M);
    float l = 0.f;
    for (int s = lane; s < splits; s += 32) {
        const float m = part_m[s * stride + x];
        if (m != -INFINITY) l += part_l[s * stride + x] * ex2(m - M);
    }
    l = warp_sum<16, 1>(l);
    if (lane == 0) lse[bh * lse_len + (row - lse_row0)] = (M + log2f(l)) * LN2;
}

// ---- pass 2: column sums ---------------------------------------------------------------------------

constexpr int COL_BK = 128, COL_BQ = 64, COL_STAGES = 3; // 128 keys per CTA, 64-query tiles

struct ColArgs {
    const bf16 *Q, *K;
    const float *lse;
    float *colsum, *colsum_kv;
    int G, L, w0, lse_len, lse_row0;
    float scale_log2;
};

template <int D> constexpr int col_smem_bytes()
{
    return COL_BK * D * 2 + COL_STAGES * (COL_BQ * D * 2 + COL_BQ * 4);
}

// The warps of the column-sum pass: COL_MT key m-tiles of 16 per warp, 4 warps x 32 keys (K and S in
// 128 registers); a step runs all its MMAs, then the exps, with the raw LSE in shared memory scaled and
// masked per use. (8 warps x 16 keys, the query tile in two interleaved halves and a pre-scaled LSE
// were each slower: NOTES.md.)
constexpr int COL_MT = 2, COL_THREADS = 32 * (COL_BK / (16 * COL_MT));

// The log2-scaled LSE of this thread's query columns n*8 + 2t + e of a step (+inf for rows that do not
// contribute).
template <int NT>
__device__ __forceinline__ void col_lse(float (&l2)[NT][2], const float *ls, int t, int q0, int w0, int L)
{
#pragma unroll
    for (int n = 0; n < NT; ++n) {
        const float2 v = *reinterpret_cast<const float2 *>(ls + n * 8 + 2 * t);
        const int q = q0 + n * 8 + 2 * t;
        l2[n][0] = q >= w0 && q < L ? v.x * LOG2E : INFINITY;
        l2[n][1] = q + 1 >= w0 && q + 1 < L ? v.y * LOG2E : INFINITY;
    }
}

// One step of a warp: S^T = K Q^T for its 16 * MT keys x the tile's 64 queries, then p = exp2(s *
// scale_log2 - lse2[q]) added into the keys' sums (p = 0 where the query precedes the key when MASK).
template <int D, int MT, bool MASK>
__device__ __forceinline__ void colsum_step(const uint32_t (&kf)[MT][D / 16][4], uint32_t qt, const float *ls, float sl2,
                                            int lane, int q0, int wk0, int w0, int L, float (&acc)[MT][2])
{
    constexpr int KSTEPS = D / 16, ROWB = D * 2, NT = COL_BQ / 8;
    const int g = lane >> 2, t = lane & 3;
    float s[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int n = 0; n < NT; ++n) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.f;
    auto mma_pair = [&](int kk, int np) {
        uint32_t b[4]; // queries np*16 + (lane>>4)*8 + (lane&7), d chunk 2kk + ((lane>>3)&1)
        ldsm_x4(b, qt + swz<ROWB>(np * 16 + (lane >> 4) * 8 + (lane & 7), 2 * kk + ((lane >> 3) & 1)));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            mma_bf16(s[mt][2 * np], kf[mt][kk], b[0], b[1]);
            mma_bf16(s[mt][2 * np + 1], kf[mt][kk], b[2], b[3]);
        }
    };
    float l2[NT][2] = {};
    auto add = [&](int mt, int n, int e) {
        float p = ex2(fmaf(s[mt][n][e], sl2, -l2[n][e & 1]));
        if (MASK) {
            const int key = wk0 + mt * 16 + g + (e >> 1) * 8, q = q0 + n * 8 + 2 * t + (e & 1);
            if (q < key) p = 0.f;
        }
        acc[mt][e >> 1] += p;
    };
#pragma unroll
    for (int kk = 0; kk < KSTEPS; ++kk)
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) mma_pair(kk, np);
    col_lse(l2, ls, t, q0, w0, L);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int e = 0; e < 4; ++e) add(mt, n, e);
}

template <int D, bool CAUSAL>
__global__ void __launch_bounds__(COL_THREADS, 2) colsum_kernel(const ColArgs a)
{
    constexpr int KSTEPS = D / 16, ROWB = D * 2, MT = COL_MT, THREADS = COL_THREADS, WK = 16 * MT;
    constexpr uint32_t Q_TILE = COL_BQ * ROWB;
    static_assert(COL_STAGES == 3, "the LSE of step it + 2 is loaded at step it and stored at step it + 1");
    extern __shared__ __align__(128) uint8_t smem[];
    const uint32_t k_s = smem_u32(smem), q_s = k_s + COL_BK * ROWB;
    // [stage][COL_BQ]: the tile rows' LSE
    float *lse_s = reinterpret_cast<float *>(smem + COL_BK * ROWB + COL_STAGES * Q_TILE);
    const uint32_t lse_su = smem_u32(lse_s);

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int L = a.L, G = a.G, w0 = a.w0;
    const int64_t bkv = blockIdx.x;
    const int k0 = blockIdx.y * COL_BK, wk0 = k0 + warp * WK; // block's and warp's first key
    const int qbeg = (max(w0, CAUSAL ? k0 : 0) / COL_BQ) * COL_BQ;
    const int nq = (L - qbeg + COL_BQ - 1) / COL_BQ, total = G * nq; // (head, query tile) steps

    auto load_q = [&](int step, int stage) {
        const int h = step / nq, q0 = qbeg + (step % nq) * COL_BQ;
        load_rows<COL_BQ, D, THREADS>(q_s + stage * Q_TILE, a.Q + (bkv * G + h) * L * D, q0, L, tid);
    };
    auto lse_raw = [&](int step, int stage) { // cp.async of the raw values (rows not read stay zero)
        const int h = step / nq, q = qbeg + (step % nq) * COL_BQ + tid;
        const bool ok = q >= w0 && q < L;
        const float *src = ok ? a.lse + (bkv * G + h) * a.lse_len + (q - a.lse_row0) : a.lse;
        cp_async_zfill<4>(lse_su + (stage * COL_BQ + tid) * 4, src, ok);
    };

    // prologue: group 0 = K block + step 0, group 1 = step 1
    load_rows<COL_BK, D, THREADS>(k_s, a.K + bkv * L * D, k0, L, tid);
    load_q(0, 0);
    if (tid < COL_BQ) lse_raw(0, 0);
    cp_async_commit();
    if (total > 1) {
        load_q(1, 1);
        if (tid < COL_BQ) lse_raw(1, 1);
    }
    cp_async_commit();

    uint32_t kf[MT][KSTEPS][4]; // this warp's keys as A operands, for the whole kernel
    float acc[MT][2], kvacc[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) acc[mt][0] = acc[mt][1] = kvacc[mt][0] = kvacc[mt][1] = 0.f;

    for (int it = 0; it < total; ++it) {
        cp_async_wait<COL_STAGES - 2>();
        __syncthreads(); // step it's Q and LSE are in; every warp is done with step it - 1
        if (it == 0) {
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int kk = 0; kk < KSTEPS; ++kk)
                    ldsm_x4(kf[mt][kk], k_s + swz<ROWB>(warp * WK + mt * 16 + (lane & 15), 2 * kk + (lane >> 4)));
        }
        { // request step it + 2
            const int nx = it + 2;
            if (nx < total) {
                load_q(nx, nx % COL_STAGES);
                if (tid < COL_BQ) lse_raw(nx, nx % COL_STAGES);
            }
            cp_async_commit();
        }
        const int stage = it % COL_STAGES, h = it / nq, q0 = qbeg + (it % nq) * COL_BQ;
        const uint32_t qt = q_s + stage * Q_TILE;
        const float *ls = lse_s + stage * COL_BQ;
        if (!CAUSAL || q0 >= wk0 + WK) // every query of the tile follows every key of the warp
            colsum_step<D, MT, false>(kf, qt, ls, a.scale_log2, lane, q0, wk0, w0, L, acc);
        else if (q0 + COL_BQ - 1 >= wk0) // the diagonal crosses the tile (else every query precedes every key)
            colsum_step<D, MT, true>(kf, qt, ls, a.scale_log2, lane, q0, wk0, w0, L, acc);

        if (it % nq == nq - 1) { // head h done: reduce over the 4 lanes sharing each key, write once
            const int64_t bh = bkv * G + h;
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const float v = warp_sum<1, 2>(acc[mt][r]);
                    const int key = wk0 + mt * 16 + g + 8 * r;
                    if (t == 0 && key < L) a.colsum[bh * L + key] = v;
                    kvacc[mt][r] += v;
                    acc[mt][r] = 0.f;
                }
        }
    }
    if (a.colsum_kv && t == 0) {
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int key = wk0 + mt * 16 + g + 8 * r;
                if (key < L) a.colsum_kv[bkv * L + key] = kvacc[mt][r];
            }
    }
}

// ---- launch plumbing -------------------------------------------------------------------------------

constexpr int SPLIT_TARGET_CTAS = 264; // 2 per SM of an H100/H200: a fixed number, so splits do not depend on the device

struct FwdPlan {
    int q_first, n_qtiles, splits, split_keys;
    int pack_rows; // > 0: the packed tile (load_q_packed), rows q_first .. L - 1 of G heads a CTA
    int rows;      // rows a query head has in the split partials, from q_first
};

FwdPlan plan_fwd(const sattn_params *p)
{
    FwdPlan f;
    const int G = sattn_groups(p);
    f.pack_rows = !p->need_out && (int64_t)G * (p->L - p->w0) <= FWD_BR ? p->L - p->w0 : 0;
    f.q_first = p->need_out ? 0 : f.pack_rows ? p->w0 : (p->w0 / FWD_BR) * FWD_BR;
    f.n_qtiles = (p->L - f.q_first + FWD_BR - 1) / FWD_BR;
    f.rows = f.pack_rows ? f.pack_rows : f.n_qtiles * FWD_BR;
    const int key_tiles = (p->L + FWD_BC - 1) / FWD_BC;
    const int64_t ctas = f.pack_rows ? (int64_t)p->B * p->Hkv : (int64_t)p->B * p->Hq * f.n_qtiles;
    int splits = 1;
    if (!p->need_out && ctas < SPLIT_TARGET_CTAS) splits = (int)((SPLIT_TARGET_CTAS + ctas - 1) / ctas);
    if (splits > key_tiles) splits = key_tiles;
    const int tiles_per_split = (key_tiles + splits - 1) / splits;
    f.split_keys = tiles_per_split * FWD_BC;
    f.splits = (p->L + f.split_keys - 1) / f.split_keys;
    return f;
}

size_t part_bytes(const sattn_params *p, const FwdPlan &f)
{
    if (f.splits == 1) return 0;
    return 2 * sizeof(float) * (size_t)f.splits * p->B * p->Hq * (size_t)f.rows;
}


template <int D, bool CAUSAL, bool NEED_OUT, bool PACKED = false>
int launch_fwd_t(const FwdArgs &a, dim3 grid, cudaStream_t s)
{
    constexpr int smem = fwd_smem_bytes<D, NEED_OUT>();
    static unsigned long long optin = 0; // the devices where the attribute is set (kvb_cuda.h)
    int rc = kvb_smem_optin((const void *)fwd_kernel<D, CAUSAL, NEED_OUT, PACKED>, smem, &optin);
    if (rc) return rc;
    fwd_kernel<D, CAUSAL, NEED_OUT, PACKED><<<grid, FWD_THREADS, smem, s>>>(a);
    CUDA_TRY(cudaGetLastError());
    return KVB_OK;
}

int launch_fwd(const sattn_params *p, const FwdArgs &a, dim3 grid, cudaStream_t s)
{
    const bool c = p->causal, n = p->need_out;
    if (a.pack_rows) {
        if (p->D == 64) return c ? launch_fwd_t<64, true, false, true>(a, grid, s) : launch_fwd_t<64, false, false, true>(a, grid, s);
        return c ? launch_fwd_t<128, true, false, true>(a, grid, s) : launch_fwd_t<128, false, false, true>(a, grid, s);
    }
    if (p->D == 64) {
        if (c) return n ? launch_fwd_t<64, true, true>(a, grid, s) : launch_fwd_t<64, true, false>(a, grid, s);
        return n ? launch_fwd_t<64, false, true>(a, grid, s) : launch_fwd_t<64, false, false>(a, grid, s);
    }
    if (c) return n ? launch_fwd_t<128, true, true>(a, grid, s) : launch_fwd_t<128, true, false>(a, grid, s);
    return n ? launch_fwd_t<128, false, true>(a, grid, s) : launch_fwd_t<128, false, false>(a, grid, s);
}

template <int D, bool CAUSAL> int launch_col_t(const ColArgs &a, dim3 grid, cudaStream_t s)
{
    constexpr int smem = col_smem_bytes<D>();
    static unsigned long long optin = 0; // the devices where the attribute is set (kvb_cuda.h)
    int rc = kvb_smem_optin((const void *)colsum_kernel<D, CAUSAL>, smem, &optin);
    if (rc) return rc;
    colsum_kernel<D, CAUSAL><<<grid, COL_THREADS, smem, s>>>(a);
    CUDA_TRY(cudaGetLastError());
    return KVB_OK;
}

// hopper: a packed window whose heads have a multiple of 8 rows runs the Hopper LSE pass
// (selective_attn_lse_packed_wgmma) on the same splits and partials
int run_fwd(const bf16 *Q, const bf16 *K, const bf16 *V, const sattn_params *p, bf16 *O, float *LSE, void *ws,
            cudaStream_t s, bool hopper)
{
    const FwdPlan f = plan_fwd(p);
    FwdArgs a;
    a.Q = Q, a.K = K, a.V = V, a.O = O, a.lse = LSE;
    const size_t part = part_bytes(p, f) / 2 / sizeof(float);
    a.part_m = f.splits > 1 ? (float *)ws : nullptr;
    a.part_l = f.splits > 1 ? (float *)ws + part : nullptr;
    a.G = sattn_groups(p), a.L = p->L;
    a.q_first = f.q_first, a.n_qtiles = f.n_qtiles;
    a.lse_len = sattn_lse_len(p), a.lse_row0 = sattn_lse_row0(p);
    a.splits = f.splits, a.split_keys = f.split_keys;
    a.pack_rows = f.pack_rows;
    a.scale = 1.f / sqrtf((float)p->D);
    a.scale_log2 = a.scale * LOG2E;
    const int64_t BH = (int64_t)p->B * p->Hq;
    const dim3 grid = f.pack_rows ? dim3((unsigned)((int64_t)p->B * p->Hkv), 1u, (unsigned)f.splits)
                                  : dim3((unsigned)BH, (unsigned)f.n_qtiles, (unsigned)f.splits);
    int rc = hopper && f.pack_rows && f.pack_rows % 8 == 0
                 ? selective_attn_lse_packed_wgmma((const kvb_bf16 *)Q, (const kvb_bf16 *)K, p, f.splits, f.split_keys, LSE,
                                                   a.part_m, a.part_l, s)
                 : launch_fwd(p, a, grid, s);
    if (rc || f.splits == 1) return rc;
    const int R = f.rows;
    const int64_t n = BH * R;
    const unsigned blocks = (unsigned)((n * 32 + MERGE_THREADS - 1) / MERGE_THREADS); // a warp a row; n < 264 x 128 (plan_fwd)
    merge_lse_kernel<<<blocks, MERGE_THREADS, 0, s>>>(a.part_m, a.part_l, f.splits, BH, R, f.q_first, p->L, LSE, a.lse_len,
                                                      a.lse_row0);
    CUDA_TRY(cudaGetLastError());
    return KVB_OK;
}

int run_colsum(const bf16 *Q, const bf16 *K, const float *LSE, const sattn_params *p, float *colsum, float *colsum_kv,
               cudaStream_t s)
{
    ColArgs a;
    a.Q = Q, a.K = K, a.lse = LSE, a.colsum = colsum, a.colsum_kv = p->group_sum ? colsum_kv : nullptr;
    a.G = sattn_groups(p), a.L = p->L, a.w0 = p->w0;
    a.lse_len = sattn_lse_len(p), a.lse_row0 = sattn_lse_row0(p);
    a.scale_log2 = LOG2E / sqrtf((float)p->D);
    const dim3 grid((unsigned)((int64_t)p->B * p->Hkv), (unsigned)((p->L + COL_BK - 1) / COL_BK));
    if (p->D == 64) return p->causal ? launch_col_t<64, true>(a, grid, s) : launch_col_t<64, false>(a, grid, s);
    return p->causal ? launch_col_t<128, true>(a, grid, s) : launch_col_t<128, false>(a, grid, s);
}

int check_ptrs(const char *who, const void *Q, const void *K, const void *V, const void *LSE)
{
    if (!Q || !K || !V || !LSE) return kvb_fail(KVB_EINVAL, "%s: NULL pointer among Q, K, V, LSE", who);
    return KVB_OK;
}

// ---- the materialized peer -------------------------------------------------------------------------

// One block per row of S (fp32, scaled scores): LSE, P in place (fp32, 0 where masked) and P in bf16.
__global__ void softmax_rows_kernel(float *S, bf16 *P, int L, int R, int r0, int causal, float *lse, int lse_len,
                                    int lse_row0, int64_t bh0)
{
    const int64_t row = blockIdx.x; // (head_local, r)
    const int r = (int)(row % R), i = r0 + r;
    const int64_t bh = bh0 + row / R;
    float *s = S + row * L;
    bf16 *pb = P + row * L;
    const int n = causal ? i + 1 : L;
    __shared__ float red[32];
    float m = -INFINITY;
    for (int j = threadIdx.x; j < n; j += blockDim.x) m = fmaxf(m, s[j]);
    m = warp_max<16, 1>(m);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
    __syncthreads();
    m = -INFINITY;
    for (int w = 0; w < (int)(blockDim.x >> 5); ++w) m = fmaxf(m, red[w]);
    __syncthreads();
    float sum = 0.f;
    for (int j = threadIdx.x; j < n; j += blockDim.x) sum += expf(s[j] - m);
    sum = warp_sum<16, 1>(sum);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = sum;
    __syncthreads();
    sum = 0.f;
    for (int w = 0; w < (int)(blockDim.x >> 5); ++w) sum += red[w];
    const float lse_i = m + logf(sum);
    for (int j = threadIdx.x; j < L; j += blockDim.x) {
        const float p = j < n ? expf(s[j] - lse_i) : 0.f;
        s[j] = p;
        pb[j] = __float2bfloat16_rn(p);
    }
    if (threadIdx.x == 0 && i >= lse_row0) lse[bh * lse_len + (i - lse_row0)] = lse_i;
}

// colsum[bh, j] = sum over contributing rows of P (fp32 values, double accumulation); one thread per column
__global__ void colsum_rows_kernel(const float *P, int L, int R, int r0, int w0, float *colsum, int64_t bh0, int heads)
{
    const int64_t x = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (x >= (int64_t)heads * L) return;
    const int64_t hl = x / L;
    const int j = (int)(x % L);
    const float *p = P + hl * R * L + j;
    double c = 0;
    for (int r = w0 > r0 ? w0 - r0 : 0; r < R; ++r) c += p[(int64_t)r * L];
    colsum[(bh0 + hl) * L + j] = (float)c;
}

// colsum_kv[bkv, j] = sum over the G query heads, in order
__global__ void group_sum_kernel(const float *colsum, int L, int G, int64_t n_kv, float *colsum_kv)
{
    const int64_t x = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (x >= n_kv * L) return;
    const int64_t bkv = x / L;
    const int j = (int)(x % L);
    float c = 0.f;
    for (int g = 0; g < G; ++g) c += colsum[(bkv * G + g) * L + j];
    colsum_kv[x] = c;
}

struct MatPlan {
    int R, r0;
    int kv_per_chunk;
    size_t bytes;
};

int plan_materialized(const sattn_params *p, MatPlan *m)
{
    m->r0 = p->need_out ? 0 : p->w0;
    m->R = p->L - m->r0;
    const int G = sattn_groups(p);
    const double per_kv = (double)G * m->R * p->L * (sizeof(float) + sizeof(bf16));
    if (per_kv > (double)SATTN_MATERIALIZED_MAX_BYTES)
        return kvb_fail(KVB_EINVAL,
                        "selective_attn (materialized): L=%d out of range for the cuBLAS peer: one KV head's G=%d query heads "
                        "need G*R*L*6 = %.1f GB of S and P, more than %.0f GB",
                        p->L, G, per_kv * 1e-9, (double)SATTN_MATERIALIZED_MAX_BYTES * 1e-9);
    const int64_t n_kv = (int64_t)p->B * p->Hkv;
    int64_t c = (int64_t)((double)SATTN_MATERIALIZED_MAX_BYTES / 2 / per_kv); // a chunk of at most 20 GB
    if (c < 1) c = 1;
    if (c > n_kv) c = n_kv;
    m->kv_per_chunk = (int)c;
    m->bytes = (size_t)(per_kv * (double)c);
    return KVB_OK;
}

} // namespace

// ---- extern "C" API ----------------------------------------------------------------------------------

extern "C" size_t selective_attn_workspace_bytes(const sattn_params *p)
{
    if (sattn_check(p, "selective_attn_workspace_bytes")) return 0;
    return part_bytes(p, plan_fwd(p));
}

namespace {

// Which kernels run: the Hopper ones where the device has them and the shape is theirs (WGMMA_AUTO),
// or always the mma.sync ones (WGMMA_NEVER).
enum WgmmaUse { WGMMA_NEVER, WGMMA_AUTO };

int attn_common(const char *who, const kvb_bf16 *Q, const kvb_bf16 *K, const kvb_bf16 *V, const sattn_params *p,
                kvb_bf16 *O, float *LSE, float *colsum, float *colsum_kv, void *workspace, size_t workspace_bytes,
                cudaStream_t stream, WgmmaUse use)
{
    int rc = sattn_check(p, who);
    if (rc) return rc;
    if ((rc = check_ptrs(who, Q, K, V, LSE))) return rc;
    if (!colsum || (p->need_out && !O) || (p->group_sum && !colsum_kv))
        return kvb_fail(KVB_EINVAL, "%s: NULL output (colsum, O with need_out=1, colsum_kv with group_sum=1)", who);
    const size_t need = part_bytes(p, plan_fwd(p));
    if (workspace_bytes < need || (need && !workspace))
        return kvb_fail(KVB_EINVAL, "%s: workspace_bytes=%zu out of range [%zu, inf) for this shape", who, workspace_bytes, need);
    const bool hopper = use == WGMMA_AUTO && selective_attn_wgmma_supported();
    if (hopper && p->need_out)
        rc = selective_attn_fwd_wgmma(Q, K, V, p, O, LSE, stream);
    else
        rc = run_fwd((const bf16 *)Q, (const bf16 *)K, (const bf16 *)V, p, (bf16 *)O, LSE, workspace, stream, hopper);
    if (rc) return rc;
    if (hopper) return selective_attn_colsum_wgmma(Q, K, LSE, p, colsum, colsum_kv, stream);
    return run_colsum((const bf16 *)Q, (const bf16 *)K, LSE, p, colsum, colsum_kv, stream);
}

int fwd_common(const char *who, const kvb_bf16 *Q, const kvb_bf16 *K, const kvb_bf16 *V, const sattn_params *p,
               kvb_bf16 *O, float *LSE, cudaStream_t stream, WgmmaUse use)
{
    int rc = sattn_check(p, who);
    if (rc) return rc;
    if (!p->need_out)
        return kvb_fail(KVB_EINVAL, "%s: need_out=0 out of range [1, 1]: the forward alone exists to produce O", who);
    if ((rc = check_ptrs(who, Q, K, V, LSE))) return rc;
    if (!O) return kvb_fail(KVB_EINVAL, "%s: NULL O", who);
    if (use == WGMMA_AUTO && selective_attn_wgmma_supported()) return selective_attn_fwd_wgmma(Q, K, V, p, O, LSE, stream);
    return run_fwd((const bf16 *)Q, (const bf16 *)K, (const bf16 *)V, p, (bf16 *)O, LSE, nullptr, stream, false); // need_out=1
}

int colsum_common(const char *who, const kvb_bf16 *Q, const kvb_bf16 *K, const float *LSE, const sattn_params *p,
                  float *colsum, float *colsum_kv, cudaStream_t stream, WgmmaUse use)
{
    int rc = sattn_check(p, who);
    if (rc) return rc;
    if (!Q || !K || !LSE || !colsum || (p->group_sum && !colsum_kv))
        return kvb_fail(KVB_EINVAL, "%s: NULL pointer among Q, K, LSE, colsum, colsum_kv", who);
    if (use == WGMMA_AUTO && selective_attn_wgmma_supported())
        return selective_attn_colsum_wgmma(Q, K, LSE, p, colsum, colsum_kv, stream);
    return run_colsum((const bf16 *)Q, (const bf16 *)K, LSE, p, colsum, colsum_kv, stream);
}

} // namespace

extern "C" int selective_attn(const kvb_bf16 *Q, const kvb_bf16 *K, const kvb_bf16 *V, const sattn_params *p,
                              kvb_bf16 *O, float *LSE, float *colsum, float *colsum_kv, void *workspace,
                              size_t workspace_bytes, cudaStream_t stream)
{
    return attn_common("selective_attn", Q, K, V, p, O, LSE, colsum, colsum_kv, workspace, workspace_bytes, stream,
                       WGMMA_AUTO);
}

extern "C" int selective_attn_mma(const kvb_bf16 *Q, const kvb_bf16 *K, const kvb_bf16 *V, const sattn_params *p,
                                  kvb_bf16 *O, float *LSE, float *colsum, float *colsum_kv, void *workspace,
                                  size_t workspace_bytes, cudaStream_t stream)
{
    return attn_common("selective_attn_mma", Q, K, V, p, O, LSE, colsum, colsum_kv, workspace, workspace_bytes, stream,
                       WGMMA_NEVER);
}

extern "C" int selective_attn_fwd(const kvb_bf16 *Q, const kvb_bf16 *K, const kvb_bf16 *V, const sattn_params *p,
                                  kvb_bf16 *O, float *LSE, cudaStream_t stream)
{
    return fwd_common("selective_attn_fwd", Q, K, V, p, O, LSE, stream, WGMMA_AUTO);
}

extern "C" int selective_attn_fwd_mma(const kvb_bf16 *Q, const kvb_bf16 *K, const kvb_bf16 *V, const sattn_params *p,
                                      kvb_bf16 *O, float *LSE, cudaStream_t stream)
{
    return fwd_common("selective_attn_fwd_mma", Q, K, V, p, O, LSE, stream, WGMMA_NEVER);
}

extern "C" int selective_attn_colsum(const kvb_bf16 *Q, const kvb_bf16 *K, const float *LSE, const sattn_params *p,
                                     float *colsum, float *colsum_kv, cudaStream_t stream)
{
    return colsum_common("selective_attn_colsum", Q, K, LSE, p, colsum, colsum_kv, stream, WGMMA_AUTO);
}

extern "C" int selective_attn_colsum_mma(const kvb_bf16 *Q, const kvb_bf16 *K, const float *LSE, const sattn_params *p,
                                         float *colsum, float *colsum_kv, cudaStream_t stream)
{
    return colsum_common("selective_attn_colsum_mma", Q, K, LSE, p, colsum, colsum_kv, stream, WGMMA_NEVER);
}

extern "C" int selective_attn_materialized_workspace_bytes(const sattn_params *p, size_t *bytes)
{
    int rc = sattn_check(p, "selective_attn (materialized)");
    if (rc) return rc;
    MatPlan m = {0, 0, 0, 0};
    if ((rc = plan_materialized(p, &m))) return rc;
    *bytes = m.bytes;
    return KVB_OK;
}

extern "C" int selective_attn_materialized(void *cublas_handle, const kvb_bf16 *Q, const kvb_bf16 *K, const kvb_bf16 *V,
                                           const sattn_params *p, kvb_bf16 *O, float *LSE, float *colsum, float *colsum_kv,
                                           void *workspace, size_t workspace_bytes, cudaStream_t stream)
{
    int rc = sattn_check(p, "selective_attn (materialized)");
    if (rc) return rc;
    MatPlan m;
    if ((rc = plan_materialized(p, &m))) return rc;
    if ((rc = check_ptrs("selective_attn (materialized)", Q, K, V, LSE))) return rc;
    if (!colsum || (p->need_out && !O) || (p->group_sum && !colsum_kv) || !cublas_handle)
        return kvb_fail(KVB_EINVAL, "selective_attn (materialized): NULL output or cuBLAS handle");
    if (!workspace || workspace_bytes < m.bytes)
        return kvb_fail(KVB_EINVAL, "selective_attn (materialized): workspace_bytes=%zu out of range [%zu, inf)",
                        workspace_bytes, m.bytes);
    cublasHandle_t h = (cublasHandle_t)cublas_handle;
    CUBLAS_TRY(cublasSetStream(h, stream));
    const int L = p->L, D = p->D, G = sattn_groups(p), R = m.R;
    const int64_t n_kv = (int64_t)p->B * p->Hkv, LD = (int64_t)L * D, RL = (int64_t)R * L;
    float *S = (float *)workspace;
    bf16 *P = (bf16 *)((char *)workspace + (size_t)m.kv_per_chunk * G * RL * sizeof(float));
    const float scale = 1.f / sqrtf((float)D), one = 1.f, zero = 0.f;
    const bf16 *q = (const bf16 *)Q, *k = (const bf16 *)K, *v = (const bf16 *)V;
    for (int64_t c0 = 0; c0 < n_kv; c0 += m.kv_per_chunk) {
        const int nb = (int)(n_kv - c0 < m.kv_per_chunk ? n_kv - c0 : m.kv_per_chunk);
        // S[kv, g] (R x L, row-major) = scale * Q[kv*G + g, r0:] K[kv]^T; column-major: S^T = K Q^T
        for (int g = 0; g < G; ++g)
            CUBLAS_TRY(cublasGemmStridedBatchedEx(h, CUBLAS_OP_T, CUBLAS_OP_N, L, R, D, &scale, k + c0 * LD, CUDA_R_16BF, D, LD,
                                                  q + ((c0 * G + g) * L + m.r0) * D, CUDA_R_16BF, D, G * LD, &zero,
                                                  S + g * RL, CUDA_R_32F, L, G * RL, nb, CUBLAS_COMPUTE_32F,
                                                  CUBLAS_GEMM_DEFAULT));
        const int64_t rows = (int64_t)nb * G * R;
        softmax_rows_kernel<<<(unsigned)rows, 256, 0, stream>>>(S, P, L, R, m.r0, p->causal, LSE, sattn_lse_len(p),
                                                               sattn_lse_row0(p), c0 * G);
        CUDA_TRY(cudaGetLastError());
        const int64_t cols = (int64_t)nb * G * L;
        colsum_rows_kernel<<<(unsigned)((cols + 255) / 256), 256, 0, stream>>>(S, L, R, m.r0, p->w0, colsum, c0 * G, nb * G);
        CUDA_TRY(cudaGetLastError());
        if (p->need_out) // O[kv*G + g, r0:] (R x D) = P V; column-major: O^T = V^T P^T
            for (int g = 0; g < G; ++g)
                CUBLAS_TRY(cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, D, R, L, &one, v + c0 * LD, CUDA_R_16BF, D,
                                                      LD, P + g * RL, CUDA_R_16BF, L, G * RL, &zero,
                                                      (bf16 *)O + ((c0 * G + g) * L + m.r0) * D, CUDA_R_16BF, D, G * LD, nb,
                                                      CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    }
    if (p->group_sum) {
        group_sum_kernel<<<(unsigned)((n_kv * L + 255) / 256), 256, 0, stream>>>(colsum, L, G, n_kv, colsum_kv);
        CUDA_TRY(cudaGetLastError());
    }
    return KVB_OK;
}
