// attn_device.h: device code shared by kernels/decode/decode.cu, kernels/int2/int2_decode_v1.cu and
// kernels/omnikv/omnikv.cu (CUDA C++ only; not a C header). The flash-decoding warp state, the dense
// bf16 decode step (its K half alone: dense_load_k, dense_qk), and the stream-K partition with its
// log-sum-exp merge; the instruction wrappers they use are in kvb_device.cuh.
//
// Fragments (mma.sync m16n8k16, row.col; g = lane / 4, t = lane % 4):
//   A 16x16: a0 = (row g, k 2t..2t+1), a1 = (row g+8, k 2t..), a2 = (row g, k 2t+8..), a3 = (row g+8, k 2t+8..)
//   B 16x8:  b0 = (k 2t..2t+1, col g), b1 = (k 2t+8..2t+9, col g)
//   C 16x8:  c0, c1 = (row g, cols 2t, 2t+1), c2, c3 = (row g+8, cols 2t, 2t+1)
// Decode is computed transposed, so that the (at most 8) query heads of a KV head are the MMA's
// n = 8 columns and the tokens / channels are its 16 rows:
//   S^T [tokens x heads] = K [tokens x D] . q^T [D x heads]          (A = K rows, B = q)
//   O^T [D x heads]     += V^T [D x tokens] . P^T [tokens x heads]    (A = V columns, B = P)
// The C fragment of S^T (token rows, head columns) becomes the B fragment of P^T with one
// movmatrix.trans per 8x8 tile. The contraction index k may map to any channel (QK) or token (AV)
// as long as both operands agree, and the rows of O^T to any channel: each kernel picks the mapping
// that lets a thread load 16 contiguous bytes (or whole code words) straight into its fragments.
#ifndef KVB_KERNELS_ATTN_DEVICE_H
#define KVB_KERNELS_ATTN_DEVICE_H
#ifndef __CUDACC__
#error "attn_device.h is CUDA C++ (kernels/*/*.cu only)"
#endif

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cooperative_groups.h>

#include "kernels/common/kvb_device.cuh"

namespace kvb_attn {

using namespace kvb_dev; // the PTX wrappers, packing and warp reductions (kvb_device.cuh)

constexpr int WARPS = 4;
constexpr int THREADS = 32 * WARPS;
constexpr int MAXG = 8;
constexpr float LOG2E = 1.4426950408889634f;

// ---- the flash-decoding state of one warp for its KV head ----
// Heads 2t and 2t+1 (the thread's two C columns): running max m (log2 domain), this thread's part of
// the running sum l, and the O^T accumulators (MT m-tiles of 16 channels).
template <int MT>
struct WarpState {
    float m[2], l[2];
    float o[MT][4];
    __device__ __forceinline__ void init()
    {
        m[0] = m[1] = -INFINITY;
        l[0] = l[1] = 0.f;
#pragma unroll
        for (int i = 0; i < MT; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    }
};

// The running max of a warp's two heads (columns 2t, 2t+1 of S^T) over NT more tiles of log2-domain
// scores, reduced over the 8 row groups so that it is warp-uniform per head: m updated; b0, b1 the
// values the new probabilities are taken against (0 while nothing is seen: -inf scores stay 0);
// a0, a1 the factors that rescale the old state.
template <int NT>
__device__ __forceinline__ void running_max(float (&m)[2], const float (&s)[NT][4], float &b0, float &b1, float &a0,
                                            float &a1)
{
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int i = 0; i < NT; i++) {
        mx0 = fmaxf(mx0, fmaxf(s[i][0], s[i][2]));
        mx1 = fmaxf(mx1, fmaxf(s[i][1], s[i][3]));
    }
    warp_max<4, 16>(mx0, mx1); // over the 8 row groups
    const float n0 = fmaxf(m[0], mx0), n1 = fmaxf(m[1], mx1);
    b0 = n0 == -INFINITY ? 0.f : n0, b1 = n1 == -INFINITY ? 0.f : n1; // nothing seen yet
    a0 = ex2(m[0] - b0), a1 = ex2(m[1] - b1);
    m[0] = n0, m[1] = n1;
}

// Fold NT tiles of scores (C fragments of S^T, already in the log2 domain, masked tokens = -inf)
// into the state, and turn the probabilities into B fragments of P^T (pb[i] = {b0, b1}) in the
// requested 16-bit type. A warp-uniform running max per head (running_max).
template <int NT, int MT, bool F16>
__device__ __forceinline__ void softmax_update(WarpState<MT> &st, float (&s)[NT][4], uint32_t (&pb)[NT][2])
{
    float b0, b1, a0, a1;
    running_max<NT>(st.m, s, b0, b1, a0, a1);
    st.l[0] *= a0, st.l[1] *= a1;
#pragma unroll
    for (int i = 0; i < MT; i++) st.o[i][0] *= a0, st.o[i][1] *= a1, st.o[i][2] *= a0, st.o[i][3] *= a1;
#pragma unroll
    for (int i = 0; i < NT; i++) {
        float p0 = ex2(s[i][0] - b0), p1 = ex2(s[i][1] - b1), p2 = ex2(s[i][2] - b0), p3 = ex2(s[i][3] - b1);
        st.l[0] += p0 + p2, st.l[1] += p1 + p3;
        pb[i][0] = movmatrix_t(F16 ? pack_f16(p0, p1) : pack_bf16(p0, p1));
        pb[i][1] = movmatrix_t(F16 ? pack_f16(p2, p3) : pack_bf16(p2, p3));
    }
}

// ---- the dense bf16 step: 16 tokens of one KV head ----
// K mapping (QK contraction): thread t holds channels [t*D/4, (t+1)*D/4) of token rows g and g+8;
//   k-step j uses channels t*D/4 + 4j + {0,1} (a0/a1) and + {2,3} (a2/a3): its own registers.
// V mapping (rows of O^T), by VMAP:
//   VMAP_SPLIT (decode_attn): m-tile i < 4: channels 8g + 2i, +1; i >= 4: 64 + 8g + 2(i-4), +1
//              (two 16-byte loads per token that a warp reads as two whole 128-byte rows)
//   VMAP_WORD  (int2): m-tile i: channels 16g + 2i, +1 for D=128 (one INT2 code word per thread),
//              8g + 2i, +1 for D=64
// Row g of m-tile i is the first channel of the pair, row g+8 the second.
enum { VMAP_SPLIT = 0, VMAP_WORD = 1 };

template <int D, int VMAP>
__device__ __forceinline__ int vmap_channel(int i, int g) // channel of row g of O^T m-tile i (row g+8: +1)
{
    if constexpr (D == 64) return 8 * g + 2 * i;
    if constexpr (VMAP == VMAP_SPLIT) return i < 4 ? 8 * g + 2 * i : 64 + 8 * g + 2 * (i - 4);
    return 16 * g + 2 * i;
}

// q^T B fragments (bf16) for the K mapping above: qb[j] = {q[g][c0..c0+1], q[g][c0+2..c0+3]},
// c0 = t*D/4 + 4j, read from fp32 q rows in shared memory (heads >= G: zero).
template <int D>
__device__ __forceinline__ void q_frags_bf16(uint32_t (&qb)[D / 16][2], const float *q_s, int G, int lane)
{
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int j = 0; j < D / 16; j++) {
        const float *r = q_s + g * D + t * (D / 4) + 4 * j;
        qb[j][0] = g < G ? pack_bf16(r[0], r[1]) : 0u;
        qb[j][1] = g < G ? pack_bf16(r[2], r[3]) : 0u;
    }
}

// The same fragments read straight from the bf16 rows q_g [G][D] in global memory (16-byte loads;
// q_g 16-byte aligned): for kernels that walk many KV heads and stage no q in shared memory.
template <int D>
__device__ __forceinline__ void q_frags_bf16_rows(uint32_t (&qb)[D / 16][2], const __nv_bfloat16 *q_g, int G, int lane)
{
    const int g = lane >> 2, t = lane & 3;
    const __nv_bfloat16 *r = q_g + g * D + t * (D / 4);
#pragma unroll
    for (int c = 0; c < D / 32; c++) { // 8 channels = k-steps 2c, 2c+1
        const uint4 x = g < G ? ldg16(r + 8 * c) : make_uint4(0, 0, 0, 0);
        qb[2 * c][0] = x.x, qb[2 * c][1] = x.y, qb[2 * c + 1][0] = x.z, qb[2 * c + 1][1] = x.w;
    }
}

// One 16-token step over bf16 K, V rows (row stride D) starting at token `tok0`; `nvalid` of the 16
// are real (the rest are neither loaded nor counted). Split in a load and a compute half, so that a
// warp can have several steps' loads in flight.
template <int D>
struct DenseRegs {
    uint32_t k0[D / 8], k8[D / 8]; // K rows g, g+8: channels [t*D/4, (t+1)*D/4)
    uint32_t v[4][D / 16];         // V tokens 2t, 2t+1, 2t+8, 2t+9: word i = channel pair of m-tile i
};

// Loads the step's 16 tokens from rows row_of(i) of K and V (i in [0, 16); a negative row: not a token,
// zeros loaded). Contiguous decode passes i -> tok0 + i; sparse decode gathers from index or page
// lists. Each thread asks only for the 6 tokens it holds (rows g, g+8 of K; 2t, 2t+1, 2t+8, 2t+9 of V).
template <int D, int VMAP, class RowOf>
__device__ __forceinline__ void rows_load(DenseRegs<D> &r, const __nv_bfloat16 *__restrict__ K,
                                          const __nv_bfloat16 *__restrict__ V, const RowOf &row_of, int lane)
{
    constexpr int KW = D / 8;
    const int g = lane >> 2, t = lane & 3;
    const int64_t k0 = row_of(g), k8 = row_of(g + 8);
    const bool ok0 = k0 >= 0, ok8 = k8 >= 0;
    const __nv_bfloat16 *r0 = K + k0 * D + t * (D / 4), *r8 = K + k8 * D + t * (D / 4);
#pragma unroll
    for (int c = 0; c < KW / 4; c++) {
        uint4 x = ok0 ? ldg16(r0 + 8 * c) : make_uint4(0, 0, 0, 0);
        uint4 y = ok8 ? ldg16(r8 + 8 * c) : make_uint4(0, 0, 0, 0);
        r.k0[4 * c] = x.x, r.k0[4 * c + 1] = x.y, r.k0[4 * c + 2] = x.z, r.k0[4 * c + 3] = x.w;
        r.k8[4 * c] = y.x, r.k8[4 * c + 1] = y.y, r.k8[4 * c + 2] = y.z, r.k8[4 * c + 3] = y.w;
    }
#pragma unroll
    for (int q = 0; q < 4; q++) {
        const int64_t vr = row_of(2 * t + (q & 1) + 8 * (q >> 1));
        const bool ok = vr >= 0;
        const __nv_bfloat16 *row = V + vr * D;
        if constexpr (D == 64) {
            uint4 x = ok ? ldg16(row + 8 * g) : make_uint4(0, 0, 0, 0);
            r.v[q][0] = x.x, r.v[q][1] = x.y, r.v[q][2] = x.z, r.v[q][3] = x.w;
        } else {
            const __nv_bfloat16 *p0 = VMAP == VMAP_SPLIT ? row + 8 * g : row + 16 * g;
            const __nv_bfloat16 *p1 = VMAP == VMAP_SPLIT ? row + 64 + 8 * g : row + 16 * g + 8;
            uint4 x = ok ? ldg16(p0) : make_uint4(0, 0, 0, 0), y = ok ? ldg16(p1) : make_uint4(0, 0, 0, 0);
            r.v[q][0] = x.x, r.v[q][1] = x.y, r.v[q][2] = x.z, r.v[q][3] = x.w;
            r.v[q][4] = y.x, r.v[q][5] = y.y, r.v[q][6] = y.z, r.v[q][7] = y.w;
        }
    }
}

// The K half of a step (the K mapping above): rows tok0 + g, tok0 + g + 8 of K (row stride D), rows
// at or past `nvalid` zero and not loaded. Also the whole load of kernels that read K alone.
template <int D>
__device__ __forceinline__ void dense_load_k(uint32_t (&k0)[D / 8], uint32_t (&k8)[D / 8],
                                             const __nv_bfloat16 *__restrict__ K, int64_t tok0, int nvalid, int lane)
{
    constexpr int KW = D / 8;
    const int g = lane >> 2, t = lane & 3;
    const bool ok0 = g < nvalid, ok8 = g + 8 < nvalid;
    const __nv_bfloat16 *r0 = K + (tok0 + g) * D + t * (D / 4), *r8 = r0 + 8 * D;
#pragma unroll
    for (int c = 0; c < KW / 4; c++) {
        uint4 x = ok0 ? ldg16(r0 + 8 * c) : make_uint4(0, 0, 0, 0);
        uint4 y = ok8 ? ldg16(r8 + 8 * c) : make_uint4(0, 0, 0, 0);
        k0[4 * c] = x.x, k0[4 * c + 1] = x.y, k0[4 * c + 2] = x.z, k0[4 * c + 3] = x.w;
        k8[4 * c] = y.x, k8[4 * c + 1] = y.y, k8[4 * c + 2] = y.z, k8[4 * c + 3] = y.w;
    }
}

// s += S^T of the step's 16 tokens (rows g, g+8) x the 8 head columns: K (dense_load_k) . q^T (qb).
template <int D>
__device__ __forceinline__ void dense_qk(float (&s)[4], const uint32_t (&qb)[D / 16][2], const uint32_t (&k0)[D / 8],
                                         const uint32_t (&k8)[D / 8])
{
#pragma unroll
    for (int j = 0; j < D / 16; j++) mma_bf16(s, k0[2 * j], k8[2 * j], k0[2 * j + 1], k8[2 * j + 1], qb[j][0], qb[j][1]);
}

// The contiguous step: tokens tok0 .. tok0 + nvalid - 1. Not rows_load with i -> tok0 + i: with that
// (and a reworked merge), ptxas issued half the V loads after the softmax, and dense decode_attn ran
// slower (kernels/decode/NOTES.md). The K and V row loads are written out here and in rows_load: as
// shared inline helpers they changed the schedule of every decode_attn_kernel (SASS: 29 local-memory
// loads where there are 11 in decode_attn_kernel<128, 2, 0>).
template <int D, int VMAP>
__device__ __forceinline__ void dense_load(DenseRegs<D> &r, const __nv_bfloat16 *__restrict__ K,
                                           const __nv_bfloat16 *__restrict__ V, int64_t tok0, int nvalid, int lane)
{
    const int g = lane >> 2, t = lane & 3;
    dense_load_k<D>(r.k0, r.k8, K, tok0, nvalid, lane);
#pragma unroll
    for (int q = 0; q < 4; q++) {
        const int tk = 2 * t + (q & 1) + 8 * (q >> 1);
        const bool ok = tk < nvalid;
        const __nv_bfloat16 *row = V + (tok0 + tk) * D;
        if constexpr (D == 64) {
            uint4 x = ok ? ldg16(row + 8 * g) : make_uint4(0, 0, 0, 0);
            r.v[q][0] = x.x, r.v[q][1] = x.y, r.v[q][2] = x.z, r.v[q][3] = x.w;
        } else {
            const __nv_bfloat16 *p0 = VMAP == VMAP_SPLIT ? row + 8 * g : row + 16 * g;
            const __nv_bfloat16 *p1 = VMAP == VMAP_SPLIT ? row + 64 + 8 * g : row + 16 * g + 8;
            uint4 x = ok ? ldg16(p0) : make_uint4(0, 0, 0, 0), y = ok ? ldg16(p1) : make_uint4(0, 0, 0, 0);
            r.v[q][0] = x.x, r.v[q][1] = x.y, r.v[q][2] = x.z, r.v[q][3] = x.w;
            r.v[q][4] = y.x, r.v[q][5] = y.y, r.v[q][6] = y.z, r.v[q][7] = y.w;
        }
    }
}

// The step's products and softmax; ok0 / ok8: token rows g / g+8 of this thread are real (the
// others get probability 0).
template <int D>
__device__ __forceinline__ void step_compute(WarpState<D / 16> &st, const uint32_t (&qb)[D / 16][2],
                                             const DenseRegs<D> &r, bool ok0, bool ok8, float scale)
{
    constexpr int MT = D / 16;
    float s[1][4] = {{0.f, 0.f, 0.f, 0.f}};
    dense_qk<D>(s[0], qb, r.k0, r.k8);
    s[0][0] = ok0 ? s[0][0] * scale : -INFINITY;
    s[0][1] = ok0 ? s[0][1] * scale : -INFINITY;
    s[0][2] = ok8 ? s[0][2] * scale : -INFINITY;
    s[0][3] = ok8 ? s[0][3] * scale : -INFINITY;
    uint32_t pb[1][2];
    softmax_update<1, MT, false>(st, s, pb);
#pragma unroll
    for (int i = 0; i < MT; i++) // A = V^T: (channel pair of m-tile i) x (tokens 2t, 2t+1 | 2t+8, 2t+9)
        mma_bf16(st.o[i], __byte_perm(r.v[0][i], r.v[1][i], 0x5410), __byte_perm(r.v[0][i], r.v[1][i], 0x7632),
                 __byte_perm(r.v[2][i], r.v[3][i], 0x5410), __byte_perm(r.v[2][i], r.v[3][i], 0x7632), pb[0][0],
                 pb[0][1]);
}

// The contiguous step: the first `nvalid` tokens are real.
template <int D>
__device__ __forceinline__ void dense_compute(WarpState<D / 16> &st, const uint32_t (&qb)[D / 16][2],
                                              const DenseRegs<D> &r, int nvalid, float scale, int lane)
{
    const int g = lane >> 2;
    step_compute<D>(st, qb, r, g < nvalid, g + 8 < nvalid, scale);
}

// A gathered step: bit i of `valid` set when token i of the step is real.
template <int D>
__device__ __forceinline__ void masked_compute(WarpState<D / 16> &st, const uint32_t (&qb)[D / 16][2],
                                               const DenseRegs<D> &r, uint32_t valid, float scale, int lane)
{
    const int g = lane >> 2;
    step_compute<D>(st, qb, r, (valid >> g) & 1u, (valid >> (g + 8)) & 1u, scale);
}

// ---- stream-K partition and the log-sum-exp merge ----
// The work of every head is a run of steps on one line of N steps; block k of `grid` takes steps
// [k*N/grid, (k+1)*N/grid). A head touched by several blocks gets one partial (m, l, O) per block in
// slot (head + k) (unique: see merge_slot), and the last block to finish it merges them.

__device__ __forceinline__ int64_t part_begin(int64_t k, int64_t N, int64_t grid) { return k * N / grid; }

// The block whose range holds step u: the largest k with k*N/grid <= u.
__device__ __forceinline__ int64_t block_of(int64_t u, int64_t N, int64_t grid) { return ((u + 1) * grid - 1) / N; }

// A partial's slot in floats: O [G][D], then m [G], then l [G], padded to a multiple of 4 floats so
// that every slot's O is 16-byte aligned where the parts are (the merge reads it as float4).
__host__ __device__ constexpr int64_t part_slot_floats(int G, int D) { return (int64_t)G * D + ((2 * G + 3) & ~3); }

// The merge buffer of a block of NW warps: per warp and head the max, sum and O row.
template <int D, int NW = WARPS>
struct MergeSmem {
    float m[NW][MAXG], l[NW][MAXG];
    float o[NW][MAXG][D];
};

// Every warp deposits its state (channel mapping VMAP) in shared memory.
template <int D, int VMAP, int NW = WARPS>
__device__ __forceinline__ void warp_deposit(MergeSmem<D, NW> &ms, WarpState<D / 16> &st, int warp, int lane)
{
    const int g = lane >> 2, t = lane & 3;
    float l0 = st.l[0], l1 = st.l[1];
    warp_sum<4, 16>(l0, l1); // over the 8 row groups
    if (g == 0) {
        ms.m[warp][2 * t] = st.m[0], ms.m[warp][2 * t + 1] = st.m[1];
        ms.l[warp][2 * t] = l0, ms.l[warp][2 * t + 1] = l1;
    }
#pragma unroll
    for (int i = 0; i < D / 16; i++) {
        const int c = vmap_channel<D, VMAP>(i, g);
        ms.o[warp][2 * t][c] = st.o[i][0];
        ms.o[warp][2 * t + 1][c] = st.o[i][1];
        ms.o[warp][2 * t][c + 1] = st.o[i][2];
        ms.o[warp][2 * t + 1][c + 1] = st.o[i][3];
    }
}

// After a __syncthreads: combine the NW warps of the block for heads [0, G) and either write the
// final rows (out_bf16 / out_f32 != NULL, row stride D) or the block's partial into `part`
// (layout per slot: O [G][D], then m [G], then l [G]). CPT: channels per thread (1 or 2: two adjacent
// channels with 8-byte loads and stores, so that G D / 2 items take one pass of the block where G D
// would take two; the same arithmetic per channel). With CPT = 2, `part` is 8-byte aligned.
template <int D, int NW = WARPS, int CPT = 1>
__device__ __forceinline__ void block_combine(const MergeSmem<D, NW> &ms, int G, float *part, __nv_bfloat16 *out_bf16,
                                              int tid)
{
    static_assert(CPT == 1 || CPT == 2, "block_combine: 1 or 2 channels per thread");
    for (int i = tid; i < G * D / CPT; i += 32 * NW) {
        const int idx = i * CPT, h = idx / D, c = idx % D;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < NW; w++) M = fmaxf(M, ms.m[w][h]);
        const float base = M == -INFINITY ? 0.f : M;
        float O0 = 0.f, O1 = 0.f, L = 0.f;
#pragma unroll
        for (int w = 0; w < NW; w++) {
            const float a = ex2(ms.m[w][h] - base);
            if constexpr (CPT == 2) {
                const float2 v = *reinterpret_cast<const float2 *>(&ms.o[w][h][c]);
                O0 += a * v.x, O1 += a * v.y;
            } else {
                O0 += a * ms.o[w][h][c];
            }
            L += a * ms.l[w][h];
        }
        if (out_bf16) {
            if constexpr (CPT == 2)
                *reinterpret_cast<__nv_bfloat162 *>(out_bf16 + idx) = __floats2bfloat162_rn(O0 / L, O1 / L);
            else
                out_bf16[idx] = __float2bfloat16_rn(O0 / L);
        } else {
            if constexpr (CPT == 2)
                *reinterpret_cast<float2 *>(part + idx) = make_float2(O0, O1);
            else
                part[idx] = O0;
            if (c == 0) part[G * D + h] = M, part[G * D + G + h] = L;
        }
    }
}

// The last of `n` contributors of a head merges their partials (slots first .. first+n-1 of
// `parts`, part_slot_floats(G, D) floats each: O [G][D], then m [G], then l [G]) into the output rows
// out [G][D] (bf16). NT: the block's threads.
// Per head h: M = the contributors' largest m, each contributor's weight w = 2^(m - M),
// out = sum w*O / sum w*l. A thread takes 4 adjacent channels of one head and loads, for a chunk of
// MERGE_CHUNK contributors at once, their m, l and O (one 16-byte load); the chunk's largest m rescales
// the running sums, so a head's 32 partials take two rounds of L2 loads, with no shared memory, no
// barrier and no second pass for the weights. The merge runs once per head, cold: its code is one
// chunk's loop.
constexpr int MERGE_CHUNK = 16;
template <int D, int NT = THREADS>
__device__ __forceinline__ void merge_partials(const float *parts, int64_t first, int n, int G,
                                               __nv_bfloat16 *out, int tid)
{
    constexpr int Q = D / 4; // 4-channel groups a head
    const int64_t stride = part_slot_floats(G, D);
    const float *p0 = parts + first * stride;
    for (int i = tid; i < G * Q; i += NT) {
        const float *pm = p0 + G * D + i / Q; // m of contributor c at pm + c * stride, its l at + G
        float M = -INFINITY, L = 0.f;
        float4 O = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int c0 = 0; c0 < n; c0 += MERGE_CHUNK) {
            float m[MERGE_CHUNK], l[MERGE_CHUNK];
            float4 o[MERGE_CHUNK];
#pragma unroll
            for (int j = 0; j < MERGE_CHUNK; j++) {
                const bool in = c0 + j < n;
                const int64_t off = (int64_t)(c0 + j) * stride;
                m[j] = in ? __ldcg(pm + off) : -INFINITY;
                l[j] = in ? __ldcg(pm + off + G) : 0.f;
                o[j] = in ? __ldcg(reinterpret_cast<const float4 *>(p0 + off) + i) : make_float4(0.f, 0.f, 0.f, 0.f);
            }
            float Mc = M;
#pragma unroll
            for (int j = 0; j < MERGE_CHUNK; j++) Mc = fmaxf(Mc, m[j]);
            const float base = Mc == -INFINITY ? 0.f : Mc;
            const float r = ex2(M - base); // the sums so far, to the new maximum (0 before the first chunk)
            L *= r, O.x *= r, O.y *= r, O.z *= r, O.w *= r;
#pragma unroll
            for (int j = 0; j < MERGE_CHUNK; j++) {
                const float w = ex2(m[j] - base);
                L += w * l[j];
                O.x += w * o[j].x, O.y += w * o[j].y, O.z += w * o[j].z, O.w += w * o[j].w;
            }
            M = Mc;
        }
        const __nv_bfloat162 lo = __floats2bfloat162_rn(O.x / L, O.y / L), hi = __floats2bfloat162_rn(O.z / L, O.w / L);
        uint2 v;
        v.x = *reinterpret_cast<const uint32_t *>(&lo), v.y = *reinterpret_cast<const uint32_t *>(&hi);
        reinterpret_cast<uint2 *>(out)[i] = v; // rows of D (a multiple of 8): 8-byte aligned
    }
}

// Finish one head segment of a block: `ms` holds every warp's state (after a __syncthreads).
// With one contributor, write o directly; otherwise deposit the partial in slot (head + k) and let
// the last contributor (an arrival counter per head, reset by it) merge.
template <int D, int NW = WARPS>
__device__ __forceinline__ void finish_head(const MergeSmem<D, NW> &ms, int G, int64_t head, int64_t first, int64_t last,
                                            int64_t k, float *parts, int *counters, __nv_bfloat16 *out, int *flag_s,
                                            int tid)
{
    if (first == last) {
        block_combine<D, NW>(ms, G, nullptr, out, tid);
        return;
    }
    block_combine<D, NW>(ms, G, parts + (head + k) * part_slot_floats(G, D), nullptr, tid);
    __syncthreads();
    if (tid == 0) *flag_s = arrive_acq_rel_gpu(&counters[head]) == (int)(last - first);
    __syncthreads();
    if (*flag_s) {
        merge_partials<D, 32 * NW>(parts, head + first, (int)(last - first + 1), G, out, tid);
        if (tid == 0) counters[head] = 0; // ready for the next launch
    }
}

// The merge of a head whose C blocks form one cluster (C <= 8, rank = the block's rank): each block
// combines its warps into its partial (O [G][D], m [G], l [G], as finish_head's slots) and stores it in
// slot `rank` of the merger's shared memory (parts_s: C slots; distributed shared memory, stores only,
// so that no block waits on a remote load); after the cluster barrier the merger (the last rank, or rank
// 0) merges the C slots, in rank order, into the output rows. No global round trip: under the kernel's
// own stream of reads, a partial's write, the arrival fence and the merger's reads each waited in the
// memory queue. Where the slots alias the merger's rings, every block arrived on the cluster barrier
// (cluster_arrive) once its rings were drained; where they lie past them (int2_decode_attn's slots apart), every block
// arrived at its start, and one that is done writes its partial while the merger still runs.
// The combine and the merge take two adjacent channels a thread (8-byte accesses), so that G D / 2 items
// take one pass of the block's 32 NW threads at G <= 4. tr (the int2 trace build's clocks): [17] after
// the first wait, [18] after the combine, [19] before the merge.
template <int D, int NW>
__device__ __forceinline__ void cluster_merge(const MergeSmem<D, NW> &ms, float *parts_s, int G, __nv_bfloat16 *out, int tid,
                                              bool waited, long long *tr = nullptr)
{
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    const int C = (int)cluster.num_blocks(), stride = G * (D + 2);
    // the merging rank: the last (in int2_decode_attn its steps end last: rank 0 holds the head's residual
    // steps, weighted so that it ends first), so that its own partial stays local
    const int merger = C - 1;
    if (!waited) cluster_wait(); // every block's rings are drained (with the slots apart: waited at the start)
    if (tr && tid == 0) tr[17] = clock64();
    const int rank = (int)cluster.block_rank();
    const bool me = rank == merger;
    // the merger's own slot through its own window, so that a block barrier orders it
    block_combine<D, NW, 2>(ms, G, (me ? parts_s : cluster.map_shared_rank(parts_s, merger)) + rank * stride, nullptr, tid);
    if (tr && tid == 0) tr[18] = clock64();
    // every slot is written (release / acquire at cluster scope); no block touches another's shared memory
    // after it, so the others may exit. The merger has nothing to publish, so it arrives relaxed after a
    // block barrier, without the release's GPU-scope MEMBAR.
    if (me) {
        __syncthreads();
        cluster_arrive_relaxed();
    } else {
        cluster_arrive();
    }
    cluster_wait();
    if (!me) return;
    if (tr && tid == 0) tr[19] = clock64();
    for (int i = tid; i < G * D / 2; i += 32 * NW) {
        const int idx = 2 * i, h = idx / D;
        float M = -INFINITY;
        for (int r = 0; r < C; r++) M = fmaxf(M, parts_s[r * stride + G * D + h]);
        const float base = M == -INFINITY ? 0.f : M;
        float O0 = 0.f, O1 = 0.f, L = 0.f;
        for (int r = 0; r < C; r++) {
            const float a = ex2(parts_s[r * stride + G * D + h] - base);
            const float2 v = *reinterpret_cast<const float2 *>(parts_s + r * stride + idx); // stride, idx even
            O0 += a * v.x, O1 += a * v.y;
            L += a * parts_s[r * stride + G * D + G + h];
        }
        *reinterpret_cast<__nv_bfloat162 *>(out + idx) = __floats2bfloat162_rn(O0 / L, O1 / L); // rows of D (even)
    }
}

} // namespace kvb_attn

#endif
