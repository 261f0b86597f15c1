// int2.cu: the INT2 KV cache (int2.md): quantize/pack, append with the flush every 128 tokens,
// dequantize, and the fused dequant-matmuls int2_qk, int2_av and int2_decode_attn.
//
// Napkin math, MiniKV on Llama-3-8B shapes (B=8, Hq=32, Hkv=8, D=128, gs=16), T=32K quantized tokens:
//   codes 2 * 64 heads * 32768 * 128 / 4 B = 134.2 MB, fp16 scale+zero 2 * 64 * 32768 * 128/16 * 4 B =
//   134.2 MB: 8 bytes per 16 values, 4 bits per element, 1/4 of bf16. With a bf16 residual of R tokens
//   (<= 32 KB per head) a decode step reads ~270 MB: ~64 us at ~4.25 TB/s, the 80% goal <= ~80 us;
//   dense bf16 over the same tokens reads 1.07 GB, >= ~253 us, so >= 3x is also a bandwidth question.
//   T=128K: ~1.07 GB, floor ~253 us.
//   Arithmetic per token and KV head: 256 values to dequantize (K and V) and 2 x 128 x G multiply-adds
//   per head. At 80% of the bandwidth an SM sees a token of a KV head (128 bytes) every ~10 cycles:
//   ~40 warp instructions of issue. Per-element fp32 dequant + FMA on CUDA cores (~5 ops per value per
//   head) would need 3-4x that, so the products run on the tensor cores (fp16, fp32 accumulate).
//   v1's plan: dequant at ~2 instructions per value (LOP3 places two 2-bit codes in the mantissas of an
//   fp16 pair (1024 + c), HSUB2 removes the 1024, HFMA2 applies scale and zero), estimated ~22 warp
//   instructions per token; ncu measured 2247 per 64-token warp step (~35 per token).
//   Quantize (keys and values of T tokens): reads 2 B per element, writes 0.25 B of codes and 4/gs B of
//   metadata: at T=32K, B=8: 1.07 GB read + 0.4 GB written, floor ~345 us; the 70% goal <= ~490 us.
//
// int2_decode_attn v2 (the default; v1 below is kept as int2_decode_attn_v1 for one-run comparisons).
//   v1 dequantized every code to an fp16 value before its MMA (SHF + LOP3 + HSUB2 + HFMA2 per pair of
//   values): ncu counted ~2250 warp instructions per 64-token step, issue slots idle half the time, 38% of
//   the copy rate at T=32K. v2 feeds the codes to the tensor cores as exact small integers and moves the
//   scales and zeros out of the per-element work:
//     keys:   s_t = sum_d q_d (c_dt s_dg + z_dg) = sum_d (q_d s_dg) c_dt + sum_d q_d z_dg
//             B = q s_g per 16-token m-tile (one group; hi + lo fp16 halves: q s_g is exact as their sum, so
//             the products are exact and only fp32 accumulation rounds), bias q . z_g by one more MMA.
//     values: o_d = sum_t (p_t s_tg) c_td + sum_t p_t z_tg
//             B = p s_g per 16-channel m-tile (one group), the zeros' term Z[g][h] by one MMA per k-step.
//   A fragments: row g of an m-tile is element 2g of a code word (row g+8: 2g+1), so one PRMT gathers
//   byte g/2 of the two words of a register's two k, and one LOP3 keeps one code per 16-bit half: the
//   fp16 with bits c << sh, i.e. c * 2^(sh-24), an exact subnormal (sh = 4(g&1) or 4(g&1)+2). The row
//   scale 2^(24-sh) is undone on the scores (keys: rows are tokens) and at the deposit (values: rows are
//   channels). 2 PRMT + 4 LOP3 per 8 codes: 0.75 instructions per code instead of ~2.
//   Per 64-token warp step (gs=16, G=4, D=128), counted from the code:
//     key codes    32 LDS.128 + 64 PRMT + 128 LOP3           q s_g (hi, lo)   32 LDS.64 + 64 HMUL2 + 64 HFMA2
//     QK MMAs      64 (hi and lo)                            bias q . z_g     8 LDS.64 + 8 MMA + 8 SHFL
//     scores, softmax ~100 (16 FFMA, 12 SHFL, 16 EX2, 8 MOVMATRIX; the O rescale only when a max moves)
//     value codes  32 LDS.128 + 64 PRMT + 128 LOP3           p s_g            32 LDS.64 + 64 HMUL2
//     AV MMAs      32, zeros + row sums 4 LDS.64 + 4 MMA, 36 FADD into the state
//     per tile (/4 warps): 16 cp.async, the metadata pass (~72), 2 barriers
//   ~1050 instructions per step by this count, against ~2580 issue slots per step at 80% of the copy
//   rate (one SM scheduler retires one step per ~2580 cycles when the SM moves a (token, KV head) every
//   ~10 cycles). Measured (ncu, H200, T=32K, results/h200/int2/NOTES.md): 1457 per step (v1: 2247),
//   the difference mostly register moves and address arithmetic around the MMAs and loads;
//   at 2 blocks of 4 warps per SM the schedulers issue only 31% of cycles (stalls: shared-load
//   dependencies, fixed latencies, tile copies, barriers): 40% of the copy rate at T=32K, 45% at 128K.
//   Bound: issue latency, not DRAM (36% busy).
//   Metadata layouts (the pass transposes them in place; details at Lay below): key scales/zeros
//   [group][channel in k order], value scales/zeros [group][token in k order], so that each B fragment's
//   scale pairs are one 8-byte load. 3 tile buffers (two tiles in flight), 2 blocks per SM (219
//   registers). Each step's AV products accumulate from zero and are added in fp32 (long tensor-core
//   accumulation chains over the all-positive code sums failed rel L2 at T=128K).
//
// v1 design (int2_decode_attn_v1; int2_qk and int2_av reuse its halves):
// - Transposed MMAs as in decode.cu (attn_device.h): S^T = dequant(K)^T . q^T with the G <= 8 query
//   heads as the 8 columns, O^T += dequant(V)^T . P^T.
// - The packed cache is read in tiles of 256 tokens into shared memory with cp.async, double buffered,
//   4 warps x 64 tokens per tile. Token order inside a warp's 64 tokens: row r of S^T m-tile i is token
//   8*(r%8) + 2i + (r>=8), so a thread owns 8 consecutive tokens = one half of a key code word, and the
//   QK contraction index of thread t is channel t + 4y, so that its 4 code words per k-step sit in
//   different banks. For AV, row r of O^T m-tile i is channel 16*(r%8) + 2i + (r>=8): a thread owns one
//   value code word per token. Two code words (two channels, or two tokens) are merged with one PRMT,
//   then each fp16 pair of the A fragment is SHF + LOP3 + HSUB2 + HFMA2.
// - q is scaled per head by a power of two into [2^14, 2^15) before it becomes fp16 (exact for bf16
//   inputs), and the scale is undone on the scores; P is in [0, 1] and goes to fp16 as is.
// - The bf16 residual is processed with decode.cu's dense step (bf16 MMA) into the same flash state.
// - Split along tokens stream-K style over one line of steps (per head: ceil(R/16) residual steps of
//   16 tokens, then ceil(T/64) quantized steps of 64 tokens, both ~8 KB at gs=16), one resident wave of
//   blocks, log-sum-exp merge by the last block of each head (attn_device.h).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cooperative_groups.h>
#include <type_traits>
#include <vector>

#include "kernels/common/kvb_cuda.h"
#include "kernels/common/kvb_grid.h"
#include "kernels/common/attn_device.h"
#include "kernels/int2/int2.h"

using namespace kvb_attn;

namespace {

struct CachePtrs {
    const uint32_t *Kq;
    const __half *Ks, *Kz;
    const uint32_t *Vq;
    const __half *Vs, *Vz;
    const __nv_bfloat16 *Kr, *Vr;
};

CachePtrs ptrs_of(const int2_cache *c)
{
    CachePtrs p;
    p.Kq = c->Kq, p.Vq = c->Vq;
    p.Ks = reinterpret_cast<const __half *>(c->Ks), p.Kz = reinterpret_cast<const __half *>(c->Kz);
    p.Vs = reinterpret_cast<const __half *>(c->Vs), p.Vz = reinterpret_cast<const __half *>(c->Vz);
    p.Kr = reinterpret_cast<const __nv_bfloat16 *>(c->Kr), p.Vr = reinterpret_cast<const __nv_bfloat16 *>(c->Vr);
    return p;
}

int sm_count()
{
    static int sms = 0;
    if (!sms && cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0) != cudaSuccess) sms = 132;
    return sms;
}

// ================================================================================================
// Quantization (bit-exact with the reference: fp32 arithmetic exactly where int2.md puts it)
// ================================================================================================

// scale = fp16((mx - mn) / 3), zero = fp16(mn); a group holding an unsupported value gets NaN metadata.
__device__ __forceinline__ void group_meta(float mn, float mx, bool bad, __half &s, __half &z)
{
    if (bad) {
        s = z = __ushort_as_half((unsigned short)0x7E00);
        return;
    }
    s = __float2half_rn(__fdiv_rn(__fsub_rn(mx, mn), 3.0f));
    z = __float2half_rn(mn);
}

// code = clamp(rint((x - zero) / scale), 0, 3) in fp32, for scale != 0, without a division: with
// r = RN(1/scale), q0 = RN(a r), rem = a - scale q0 (exact by FMA) and q1 = RN(q0 + rem r), q1 is the
// correctly rounded quotient RN(a / scale) (Markstein's theorem; no overflow or underflow here: |a| <=
// 2^16, scale >= 2^-24, and a quotient small enough to underflow gives code 0 either way). So the
// code equals rint of the IEEE fp32 quotient, ties to even included. 7 instructions, no branch.
__device__ __forceinline__ uint32_t code_of(float x, float s, float z, float r)
{
    const float a = __fsub_rn(x, z);
    const float q0 = __fmul_rn(a, r);
    const float rem = __fmaf_rn(-q0, s, a);
    const float q1 = __fmaf_rn(rem, r, q0);
    return min(__float2uint_rn(q1), 3u); // round half to even; negative -> 0 (saturating conversion)
}

__device__ __forceinline__ bool unsupported(float x) { return !(fabsf(x) <= (float)INT2_MAX_ABS); }

// Keys: a block of 256 threads per tile of 128 tokens of one (b, h), staged in shared memory with
// cp.async. Work unit = (channel pair p, 16-token chunk c): 16 bf16 pairs in registers (one word of
// codes per channel). The min and max of a group of gs tokens are reduced over its gs/16 chunk lanes
// with shuffles. Tile layout [token][pair] with the 16-byte chunks of token t XOR-swizzled by t/16,
// so that the 8 chunk lanes of a pair read 8 different banks.
constexpr int QK_THREADS = 256, QK_TILE = 128;

template <int D>
__global__ void __launch_bounds__(QK_THREADS, 4) quant_keys_kernel(const __nv_bfloat16 *__restrict__ K, int64_t src_len,
                                                                  int64_t n, int64_t t0, uint32_t *__restrict__ Kq,
                                                                  __half *__restrict__ Ks, __half *__restrict__ Kz,
                                                                  int64_t Tcap, int gs, int64_t bh0)
{
    constexpr int PAIRS = D / 2, NCH = PAIRS / 4; // 32-bit pairs per token, 16-byte chunks per token
    __shared__ __align__(16) uint32_t tile[QK_TILE * PAIRS]; // 32 KB (D=128) or 16 KB (D=64)
    const int tid = threadIdx.x;
    const int64_t bh = bh0 + blockIdx.y, tile0 = (int64_t)blockIdx.x * QK_TILE; // heads in chunks (kvb_grid.h)
    const int ntile = (int)min((int64_t)QK_TILE, n - tile0); // a multiple of gs
    const __nv_bfloat16 *src = K + (bh * src_len + tile0) * D;
    for (int c = tid; c < ntile * NCH; c += QK_THREADS) {
        const int t = c / NCH, ch = c % NCH;
        cp_async16(&tile[t * PAIRS + ((ch ^ ((t >> 4) & (NCH - 1))) << 2)], src + (int64_t)t * D + ch * 8, true);
    }
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();

    const int64_t words = Tcap / 16, groups = Tcap / gs;
    const int per = gs / 16; // chunk lanes per group
    for (int u = tid; u < PAIRS * 8; u += QK_THREADS) { // warp-uniform trip count (PAIRS * 8 is a multiple of 256)
        const int c = u & 7, p = u >> 3;
        const bool active = 16 * c < ntile;
        uint32_t x[16];
        __nv_bfloat162 mn = __floats2bfloat162_rn(INFINITY, INFINITY), mx = __floats2bfloat162_rn(-INFINITY, -INFINITY);
        __nv_bfloat162 probe = __floats2bfloat162_rn(0.f, 0.f);
        const __nv_bfloat162 zero2 = __floats2bfloat162_rn(0.f, 0.f);
#pragma unroll
        for (int i = 0; i < 16; i++) {
            const int t = 16 * c + i;
            x[i] = active ? tile[t * PAIRS + ((((p >> 2) ^ c) & (NCH - 1)) << 2) + (p & 3)] : 0u;
            const __nv_bfloat162 v = bf2_of(x[i]);
            mn = __hmin2(mn, v), mx = __hmax2(mx, v);
            probe = __hfma2(v, zero2, probe); // inf or NaN -> NaN
        }
        uint32_t umn = bits_of(mn), umx = bits_of(mx), upr = bits_of(probe);
        for (int off = 1; off < per; off <<= 1) {
            mn = __hmin2(bf2_of(umn), bf2_of(__shfl_xor_sync(0xffffffffu, umn, off)));
            mx = __hmax2(bf2_of(umx), bf2_of(__shfl_xor_sync(0xffffffffu, umx, off)));
            probe = __hadd2(bf2_of(upr), bf2_of(__shfl_xor_sync(0xffffffffu, upr, off)));
            umn = bits_of(mn), umx = bits_of(mx), upr = bits_of(probe);
        }
        if (!active) continue;
        const float mn0 = __low2float(mn), mn1 = __high2float(mn), mx0 = __low2float(mx), mx1 = __high2float(mx);
        const bool bad0 = unsupported(mn0) || unsupported(mx0) || isnan(__low2float(probe));
        const bool bad1 = unsupported(mn1) || unsupported(mx1) || isnan(__high2float(probe));
        __half s0, z0, s1, z1;
        group_meta(mn0, mx0, bad0, s0, z0);
        group_meta(mn1, mx1, bad1, s1, z1);
        const int64_t tc = t0 + tile0 + 16 * c; // the chunk's first cache token
        const int64_t row0 = bh * D + 2 * p, row1 = row0 + 1;
        if (c % per == 0) {
            Ks[row0 * groups + tc / gs] = s0, Kz[row0 * groups + tc / gs] = z0;
            Ks[row1 * groups + tc / gs] = s1, Kz[row1 * groups + tc / gs] = z1;
        }
        const float sf0 = __half2float(s0), zf0 = __half2float(z0), sf1 = __half2float(s1), zf1 = __half2float(z1);
        const bool live0 = !bad0 && sf0 != 0.f, live1 = !bad1 && sf1 != 0.f;
        const float r0 = live0 ? __frcp_rn(sf0) : 0.f, r1 = live1 ? __frcp_rn(sf1) : 0.f;
        uint32_t w0 = 0, w1 = 0;
#pragma unroll
        for (int i = 0; i < 16; i++) {
            w0 |= code_of(bf16_lo(x[i]), sf0, zf0, r0) << (2 * i);
            w1 |= code_of(bf16_hi(x[i]), sf1, zf1, r1) << (2 * i);
        }
        Kq[row0 * words + tc / 16] = live0 ? w0 : 0u;
        Kq[row1 * words + tc / 16] = live1 ? w1 : 0u;
    }
}

// Values: one thread per (token, 16 channels): 32 bytes in, one code word out; the group's min and
// max over gs/16 neighbouring lanes by shuffles.
constexpr int QV_THREADS = 256;

template <int D>
__global__ void __launch_bounds__(QV_THREADS) quant_values_kernel(const __nv_bfloat16 *__restrict__ V, int64_t src_len,
                                                                    int64_t n, int64_t t0, uint32_t *__restrict__ Vq,
                                                                    __half *__restrict__ Vs, __half *__restrict__ Vz,
                                                                    int64_t Tcap, int gs, int64_t bh0)
{
    constexpr int WPT = D / 16; // code words per token
    const int64_t bh = bh0 + blockIdx.y;
    const int64_t flat = (int64_t)blockIdx.x * QV_THREADS + threadIdx.x;
    const int64_t tok = flat / WPT;
    const int w = (int)(flat % WPT);
    const bool active = tok < n;
    uint32_t u[8];
    if (active) {
        const uint4 *src = reinterpret_cast<const uint4 *>(V + (bh * src_len + tok) * D + 16 * w);
        const uint4 a = __ldg(src), b = __ldg(src + 1);
        u[0] = a.x, u[1] = a.y, u[2] = a.z, u[3] = a.w, u[4] = b.x, u[5] = b.y, u[6] = b.z, u[7] = b.w;
    } else {
#pragma unroll
        for (int i = 0; i < 8; i++) u[i] = 0u;
    }
    // min, max and an inf/NaN probe on bf16 pairs, then over the group's gs/16 lanes
    const __nv_bfloat162 zero2 = __floats2bfloat162_rn(0.f, 0.f);
    __nv_bfloat162 mn = bf2_of(u[0]), mx = mn, probe = zero2;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const __nv_bfloat162 v = bf2_of(u[i]);
        mn = __hmin2(mn, v), mx = __hmax2(mx, v);
        probe = __hfma2(v, zero2, probe); // inf or NaN -> NaN
    }
    float fmn = fminf(__low2float(mn), __high2float(mn)), fmx = fmaxf(__low2float(mx), __high2float(mx));
    bool bad = isnan(__low2float(probe)) || isnan(__high2float(probe));
    for (int off = 1; off < gs / 16; off <<= 1) {
        fmn = fminf(fmn, __shfl_xor_sync(0xffffffffu, fmn, off));
        fmx = fmaxf(fmx, __shfl_xor_sync(0xffffffffu, fmx, off));
        bad |= __shfl_xor_sync(0xffffffffu, (int)bad, off) != 0;
    }
    if (!active) return;
    bad |= unsupported(fmn) || unsupported(fmx);
    __half s, z;
    group_meta(fmn, fmx, bad, s, z);
    const int64_t row = bh * Tcap + t0 + tok;
    const int per = gs / 16;
    if (w % per == 0) Vs[row * (D / gs) + w / per] = s, Vz[row * (D / gs) + w / per] = z;
    const float sf = __half2float(s), zf = __half2float(z);
    uint32_t word = 0;
    if (!bad && sf != 0.f) {
        const float r = __frcp_rn(sf);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            word |= code_of(bf16_lo(u[i]), sf, zf, r) << (4 * i);
            word |= code_of(bf16_hi(u[i]), sf, zf, r) << (4 * i + 2);
        }
    }
    Vq[row * WPT + w] = word;
}

// ---- append, shift, dequantize ----

__global__ void append_kernel(__nv_bfloat16 *Kr, __nv_bfloat16 *Vr, const __nv_bfloat16 *knew, const __nv_bfloat16 *vnew,
                              int64_t heads, int D, int Rcap, int R)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; // one 16-byte chunk
    const int per = D / 8;
    if (i >= heads * per) return;
    const int64_t bh = i / per, c = i % per;
    reinterpret_cast<uint4 *>(Kr + (bh * Rcap + R) * D)[c] = reinterpret_cast<const uint4 *>(knew + bh * D)[c];
    reinterpret_cast<uint4 *>(Vr + (bh * Rcap + R) * D)[c] = reinterpret_cast<const uint4 *>(vnew + bh * D)[c];
}

// residual rows [from, from + count) -> [0, count) (from >= count: no overlap)
__global__ void shift_kernel(__nv_bfloat16 *Kr, __nv_bfloat16 *Vr, int64_t heads, int D, int Rcap, int from, int count)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int per = count * D / 8;
    if (i >= heads * per) return;
    const int64_t bh = i / per, c = i % per;
    uint4 *k = reinterpret_cast<uint4 *>(Kr + bh * Rcap * D), *v = reinterpret_cast<uint4 *>(Vr + bh * Rcap * D);
    k[c] = k[(int64_t)from * D / 8 + c];
    v[c] = v[(int64_t)from * D / 8 + c];
}

// K: one thread per (channel, 16-token word) writes 16 rows' element; V: one thread per (token, word)
// writes 32 bytes; then the residual rows are copied.
__global__ void dequant_keys_kernel(CachePtrs c, __nv_bfloat16 *K, int64_t L, int D, int64_t Tcap, int64_t T, int gs,
                                    int64_t bh0)
{
    const int64_t bh = bh0 + blockIdx.y;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; // (word, channel), channel fastest
    if (i >= (T / 16) * D) return;
    const int d = (int)(i % D);
    const int64_t w = i / D;
    const int64_t row = bh * D + d;
    const uint32_t word = c.Kq[row * (Tcap / 16) + w];
#pragma unroll 4
    for (int k = 0; k < 16; k++) {
        const int64_t t = 16 * w + k;
        const int64_t gi = row * (Tcap / gs) + t / gs;
        const float v = fmaf((float)((word >> (2 * k)) & 3u), __half2float(c.Ks[gi]), __half2float(c.Kz[gi]));
        K[(bh * L + t) * D + d] = __float2bfloat16_rn(v);
    }
}

__global__ void dequant_values_kernel(CachePtrs c, __nv_bfloat16 *V, int64_t L, int D, int64_t Tcap, int64_t T, int gs,
                                      int64_t bh0)
{
    const int64_t bh = bh0 + blockIdx.y;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; // (token, word)
    const int wpt = D / 16;
    if (i >= T * wpt) return;
    const int64_t t = i / wpt;
    const int w = (int)(i % wpt);
    const int64_t row = bh * Tcap + t;
    const uint32_t word = c.Vq[row * wpt + w];
    const int64_t gi = row * (D / gs) + (16 * w) / gs;
    const float s = __half2float(c.Vs[gi]), z = __half2float(c.Vz[gi]);
    uint32_t out[8];
#pragma unroll
    for (int k = 0; k < 8; k++)
        out[k] = pack_bf16(fmaf((float)((word >> (4 * k)) & 3u), s, z), fmaf((float)((word >> (4 * k + 2)) & 3u), s, z));
    uint4 *dst = reinterpret_cast<uint4 *>(V + (bh * L + t) * D + 16 * w);
    dst[0] = make_uint4(out[0], out[1], out[2], out[3]);
    dst[1] = make_uint4(out[4], out[5], out[6], out[7]);
}

__global__ void copy_residual_kernel(CachePtrs c, __nv_bfloat16 *K, __nv_bfloat16 *V, int64_t L, int D, int64_t T,
                                     int Rcap, int R, int64_t bh0)
{
    const int64_t bh = bh0 + blockIdx.y;
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; // 16-byte chunk of the R rows
    if (i >= (int64_t)R * D / 8) return;
    reinterpret_cast<uint4 *>(K + (bh * L + T) * D)[i] = reinterpret_cast<const uint4 *>(c.Kr + bh * Rcap * D)[i];
    reinterpret_cast<uint4 *>(V + (bh * L + T) * D)[i] = reinterpret_cast<const uint4 *>(c.Vr + bh * Rcap * D)[i];
}

// ================================================================================================
// Fused dequant-matmul: 256-token tiles in shared memory, layouts fixed at compile time per (D, gs)
// ================================================================================================

constexpr int TILE = 256;

// One tile buffer. Key codes [D][16 words], the 4-word chunks of channel d at chunk ^ ((d >> 1) & 1)
// (the 4 threads t of a warp hit different banks); key scale and zero [D][TILE/gs]; value codes
// [TILE][D/16] with token tk in row swap(tk) (its two 4-bit halves swapped: the 4 tokens a warp reads
// at once sit in adjacent rows); value scale and zero [TILE][D/gs], rows swapped the same way when a
// row is 16 bytes (gs = 16 at D = 128, MiniKV's setting), in token order otherwise.
template <int D, int GS>
struct Tile {
    static constexpr int NGK = TILE / GS, NGV = D / GS, VW = D / 16;
    static constexpr int OFF_KS = D * 16 * 4;
    static constexpr int OFF_KZ = OFF_KS + D * NGK * 2;
    static constexpr int OFF_VQ = OFF_KZ + D * NGK * 2;
    static constexpr int OFF_VS = OFF_VQ + TILE * VW * 4;
    static constexpr int OFF_VZ = OFF_VS + TILE * NGV * 2;
    static constexpr int BYTES = OFF_VZ + TILE * NGV * 2;
    static constexpr bool VPERM = NGV * 2 == 16;
};

__device__ __forceinline__ int swap_nibbles(int r) { return ((r & 15) << 4) | (r >> 4); } // an involution on 0..255

template <int BYTES_>
__device__ __forceinline__ void cp_async_n(void *smem, const void *gmem)
{
    if constexpr (BYTES_ == 16) cp_async16(smem, gmem, true);
    else cp_async<BYTES_>(smem, gmem);
}

// Issue the cp.async copies of tile `tile` (tokens [256*tile, 256*tile + 256)) of head bh. Value
// tokens >= T are zero-filled (their probability is 0, and 0 * garbage could be NaN); key tokens past
// T are read from the (allocated) cache and masked as scores. Shared-memory writes are row by row.
template <int D, int GS>
__device__ __forceinline__ void load_tile(unsigned char *buf, const CachePtrs &c, int64_t bh, int tile, int64_t T,
                                          int64_t Tcap, bool keys, bool values, int tid)
{
    using C = Tile<D, GS>;
    const int64_t tok0 = (int64_t)tile * TILE;
    if (keys) {
        uint32_t *kq = reinterpret_cast<uint32_t *>(buf);
        const uint32_t *src = c.Kq + bh * D * (Tcap / 16) + tok0 / 16;
        for (int i = tid; i < D * 4; i += THREADS) {
            const int d = i >> 2, ch = i & 3;
            cp_async16(kq + d * 16 + ((ch ^ ((d >> 1) & 1)) << 2), src + (int64_t)d * (Tcap / 16) + ch * 4, true);
        }
        constexpr int ROW = C::NGK * 2, CS = ROW < 16 ? ROW : 16, CPR = ROW / CS;
#pragma unroll
        for (int part = 0; part < 2; part++) {
            const unsigned char *msrc = reinterpret_cast<const unsigned char *>((part ? c.Kz : c.Ks) + bh * D * (Tcap / GS) + tok0 / GS);
            unsigned char *mdst = buf + (part ? C::OFF_KZ : C::OFF_KS);
            for (int i = tid; i < D * CPR; i += THREADS) {
                const int d = i / CPR, ch = i % CPR;
                cp_async_n<CS>(mdst + d * ROW + ch * CS, msrc + (int64_t)d * (Tcap / GS) * 2 + ch * CS);
            }
        }
    }
    if (values) {
        constexpr int CPR = D / 64; // 16-byte chunks per value code row
        uint32_t *vq = reinterpret_cast<uint32_t *>(buf + C::OFF_VQ);
        const uint32_t *src = c.Vq + (bh * Tcap + tok0) * C::VW;
        for (int i = tid; i < TILE * CPR; i += THREADS) {
            const int r = i / CPR, ch = i % CPR, tk = swap_nibbles(r);
            cp_async16(vq + r * C::VW + ch * 4, src + (int64_t)tk * C::VW + ch * 4, tok0 + tk < T);
        }
#pragma unroll
        for (int part = 0; part < 2; part++) {
            const unsigned char *msrc = reinterpret_cast<const unsigned char *>((part ? c.Vz : c.Vs) + (bh * Tcap + tok0) * C::NGV);
            unsigned char *mdst = buf + (part ? C::OFF_VZ : C::OFF_VS);
            if constexpr (C::VPERM) {
                for (int r = tid; r < TILE; r += THREADS) {
                    const int tk = swap_nibbles(r);
                    cp_async16(mdst + 16 * r, msrc + 16 * tk, tok0 + tk < T);
                }
            } else {
                constexpr int CHUNKS = TILE * C::NGV * 2 / 16, TPC = TILE / CHUNKS; // tokens per chunk
                for (int i = tid; i < CHUNKS; i += THREADS) cp_async16(mdst + 16 * i, msrc + 16 * i, tok0 + (int64_t)i * TPC < T);
            }
        }
    }
}

__device__ __forceinline__ uint32_t codes_f16(uint32_t x) { return (x & 0x00030003u) | 0x64006400u; } // 1024 + c

__device__ __forceinline__ uint32_t dequant2(uint32_t x, __half2 s, __half2 z)
{
    __half2 h = *reinterpret_cast<__half2 *>(&x);
    h = __hfma2(__hsub2(h, __half2(__ushort_as_half(0x6400), __ushort_as_half(0x6400))), s, z);
    return *reinterpret_cast<uint32_t *>(&h);
}

// fp16 q^T fragments for the INT2 key mapping: k-step j uses channels t + 16j + {0, 4} (b0) and
// + {8, 12} (b1); head g's row is scaled by f_s[g] (a power of two).
template <int D>
__device__ __forceinline__ void q_frags_f16(uint32_t (&qh)[D / 16][2], const float *q_s, const float *f_s, int G, int lane)
{
    const int g = lane >> 2, t = lane & 3;
    const float f = g < G ? f_s[g] : 0.f;
#pragma unroll
    for (int j = 0; j < D / 16; j++) {
        const float *r = q_s + g * D + t + 16 * j;
        qh[j][0] = g < G ? pack_f16(r[0] * f, r[4] * f) : 0u;
        qh[j][1] = g < G ? pack_f16(r[8] * f, r[12] * f) : 0u;
    }
}

// S^T for warp w's 64 tokens [64w, 64w + 64) of the tile: s[i] = m-tile i (row r: token
// 64w + 8*(r%8) + 2i + (r>=8)), columns = heads; scaled q, unmasked. Every shared-memory address is
// a per-thread base plus a compile-time offset.
template <int D, int GS>
__device__ __forceinline__ void qk_tile(float (&s)[4][4], const unsigned char *buf, const uint32_t (&qh)[D / 16][2],
                                        int warp, int lane)
{
    using C = Tile<D, GS>;
    const int g = lane >> 2, t = lane & 3;
    // channel d = t + 16j + 4e: code word (64w + 8g) / 16 = 4w + g/2, in chunk w ^ ((d >> 1) & 1) = w ^ ((t >> 1) & 1)
    const uint32_t *kq = reinterpret_cast<const uint32_t *>(buf) + t * 16 + ((warp ^ ((t >> 1) & 1)) << 2) + (g >> 1);
    const int gk = (64 * warp + 8 * g) / GS; // the group of the thread's 8 tokens
    const __half *ks = reinterpret_cast<const __half *>(buf + C::OFF_KS) + t * C::NGK + gk;
    const __half *kz = reinterpret_cast<const __half *>(buf + C::OFF_KZ) + t * C::NGK + gk;
    const uint32_t sel = (g & 1) ? 0x7632 : 0x5410; // which 8-token half of the word
#pragma unroll
    for (int i = 0; i < 4; i++) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
    for (int j = 0; j < D / 16; j++) {
        uint32_t w[4];
        __half sc[4], zc[4];
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int off = 16 * j + 4 * e; // channel offset from t
            w[e] = kq[off * 16];
            sc[e] = ks[off * C::NGK];
            zc[e] = kz[off * C::NGK];
        }
        const uint32_t m01 = __byte_perm(w[0], w[1], sel), m23 = __byte_perm(w[2], w[3], sel);
        const __half2 s01 = __halves2half2(sc[0], sc[1]), z01 = __halves2half2(zc[0], zc[1]);
        const __half2 s23 = __halves2half2(sc[2], sc[3]), z23 = __halves2half2(zc[2], zc[3]);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint32_t a0 = dequant2(codes_f16(m01 >> (4 * i)), s01, z01);
            const uint32_t a1 = dequant2(codes_f16(m01 >> (4 * i + 2)), s01, z01);
            const uint32_t a2 = dequant2(codes_f16(m23 >> (4 * i)), s23, z23);
            const uint32_t a3 = dequant2(codes_f16(m23 >> (4 * i + 2)), s23, z23);
            mma_f16(s[i], a0, a1, a2, a3, qh[j][0], qh[j][1]);
        }
    }
}

// O^T += dequant(V)^T . P^T for warp w's 64 tokens: AV k-step i holds tokens ta = 64w + 16t + 2i, tc = ta + 8
// (k 2t, 2t+1) and ta+1, tc+1 (k 2t+8, 2t+9), matching the S^T rows of m-tile i through movmatrix.
// Token ta sits in value row 32i + 4w + t (tc: +128, ta+1: +16, tc+1: +144).
template <int D, int GS>
__device__ __forceinline__ void av_tile(float (&o)[D / 16][4], const unsigned char *buf, const uint32_t (&pb)[4][2],
                                        int warp, int lane)
{
    using C = Tile<D, GS>;
    constexpr int VW = C::VW, NGV = C::NGV;
    const int g = lane >> 2, t = lane & 3;
    const int vw = D == 128 ? g : (g >> 1);        // the code word of the thread's channels
    const int vg = (D == 128 ? 16 * g : 8 * g) / GS; // and their group
    const uint32_t *vq = reinterpret_cast<const uint32_t *>(buf + C::OFF_VQ) + (4 * warp + t) * VW + vw;
    const int mrow = C::VPERM ? 4 * warp + t : 64 * warp + 16 * t;
    const __half *vs = reinterpret_cast<const __half *>(buf + C::OFF_VS) + mrow * NGV + vg;
    const __half *vz = reinterpret_cast<const __half *>(buf + C::OFF_VZ) + mrow * NGV + vg;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const uint32_t Wa = vq[(32 * i) * VW], Wb = vq[(32 * i + 128) * VW];
        const uint32_t Wc = vq[(32 * i + 16) * VW], Wd = vq[(32 * i + 144) * VW];
        // metadata rows of ta, tc, ta+1, tc+1
        const int ma = C::VPERM ? 32 * i : 2 * i, mc = C::VPERM ? 32 * i + 128 : 2 * i + 8;
        const int ma1 = C::VPERM ? 32 * i + 16 : 2 * i + 1, mc1 = C::VPERM ? 32 * i + 144 : 2 * i + 9;
        const __half2 sab = __halves2half2(vs[ma * NGV], vs[mc * NGV]), zab = __halves2half2(vz[ma * NGV], vz[mc * NGV]);
        const __half2 scd = __halves2half2(vs[ma1 * NGV], vs[mc1 * NGV]), zcd = __halves2half2(vz[ma1 * NGV], vz[mc1 * NGV]);
        uint32_t mab[2], mcd[2];
        if constexpr (D == 128) {
            mab[0] = __byte_perm(Wa, Wb, 0x5410), mab[1] = __byte_perm(Wa, Wb, 0x7632);
            mcd[0] = __byte_perm(Wc, Wd, 0x5410), mcd[1] = __byte_perm(Wc, Wd, 0x7632);
        } else {
            const uint32_t sel = (g & 1) ? 0x7632 : 0x5410;
            mab[0] = mab[1] = __byte_perm(Wa, Wb, sel);
            mcd[0] = mcd[1] = __byte_perm(Wc, Wd, sel);
        }
#pragma unroll
        for (int m = 0; m < D / 16; m++) {
            const int sh = 4 * (m & 3);
            const uint32_t x = mab[m >> 2], y = mcd[m >> 2];
            const uint32_t a0 = dequant2(codes_f16(x >> sh), sab, zab);
            const uint32_t a1 = dequant2(codes_f16(x >> (sh + 2)), sab, zab);
            const uint32_t a2 = dequant2(codes_f16(y >> sh), scd, zcd);
            const uint32_t a3 = dequant2(codes_f16(y >> (sh + 2)), scd, zcd);
            mma_f16(o[m], a0, a1, a2, a3, pb[i][0], pb[i][1]);
        }
    }
}

// The exponent e that brings max |q| (mx) into [2^(top-1), 2^top) as mx 2^e (0 for mx = 0): q's
// power-of-two scale, f = 2^e, u = 2^-e.
__device__ __forceinline__ int q_scale_exp(float mx, int top)
{
    int e = 0;
    if (mx > 0.f) {
        int E;
        frexpf(mx, &E); // mx in [2^(E-1), 2^E)
        e = top - E;
    }
    return e;
}

// q rows of one KV head's G query heads into shared memory (fp32) and, per head, the power of two
// that brings max |q| into [2^(top-1), 2^top) (f_s; v1: top = 15) and its inverse (u_s). NT: the
// block's threads.
template <int NT = THREADS>
__device__ __forceinline__ void stage_q(float *q_s, float *f_s, float *u_s, const __nv_bfloat16 *qh, int G, int D,
                                        int tid, int top = 15)
{
    for (int idx = tid; idx < G * D; idx += NT) q_s[idx] = __bfloat162float(qh[idx]);
    __syncthreads();
    const int warp = tid >> 5, lane = tid & 31;
    for (int h = warp; h < G; h += NT / 32) {
        float mx = 0.f;
        for (int c = lane; c < D; c += 32) mx = fmaxf(mx, fabsf(q_s[h * D + c]));
        mx = warp_max<16, 1>(mx);
        const int e = q_scale_exp(mx, top);
        if (lane == 0) f_s[h] = ldexpf(1.f, e), u_s[h] = ldexpf(1.f, -e);
    }
    __syncthreads();
}

// ---- int2_decode_attn: stream-K over [residual steps | quantized steps] of every head ----

struct AttnParams {
    const __nv_bfloat16 *q;
    CachePtrs c;
    __nv_bfloat16 *o;
    int Hkv, Hq, G, Rcap, R;
    int64_t heads, Tcap, T;
    int64_t nr, nq; // residual (16-token) and quantized (64-token) steps per head
    float scale;    // log2(e) / sqrt(D)
    int *counters;
    float *parts;
};

template <int D, int GS>
__host__ __device__ constexpr size_t attn_tiles_bytes()
{
    return 2 * (size_t)Tile<D, GS>::BYTES > sizeof(MergeSmem<D>) ? 2 * (size_t)Tile<D, GS>::BYTES : sizeof(MergeSmem<D>);
}

template <int D, int GS>
constexpr size_t attn_smem_bytes()
{
    return attn_tiles_bytes<D, GS>() + sizeof(float) * (MAXG * D + 64 * MAXG + 2 * MAXG);
}

template <int D, int GS>
__global__ void __launch_bounds__(THREADS) int2_attn_kernel(AttnParams p)
{
    constexpr int MT = D / 16;
    constexpr int BUF = Tile<D, GS>::BYTES;
    extern __shared__ __align__(16) unsigned char smem[];
    MergeSmem<D> &ms = *reinterpret_cast<MergeSmem<D> *>(smem); // aliases the tile buffers once drained
    float *q_s = reinterpret_cast<float *>(smem + attn_tiles_bytes<D, GS>());
    float *w_s = q_s + MAXG * D, *f_s = w_s + 64 * MAXG, *u_s = f_s + MAXG;
    __shared__ int flag_s;

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int G = p.G;
    const int64_t per_head = p.nr + p.nq, N = p.heads * per_head, grid = gridDim.x, k = blockIdx.x;
    int64_t u = part_begin(k, N, grid);
    const int64_t u1 = part_begin(k + 1, N, grid);
    while (u < u1) {
        const int64_t head = u / per_head, hoff = head * per_head;
        const int64_t s0 = u - hoff, s1 = min(u1, hoff + per_head) - hoff;
        const int64_t b = head / p.Hkv;
        const int kvh = (int)(head % p.Hkv);
        __syncthreads(); // the previous segment is done with shared memory
        stage_q(q_s, f_s, u_s, p.q + (b * p.Hq + (int64_t)kvh * G) * D, G, D, tid);
        WarpState<MT> st;
        st.init();

        // the bf16 residual: steps [s0, min(s1, nr)) of 16 tokens, bf16 MMA
        const int64_t r_end = min(s1, p.nr);
        if (s0 < r_end) {
            uint32_t qb[D / 16][2];
            q_frags_bf16<D>(qb, q_s, G, lane);
            const __nv_bfloat16 *Kr = p.c.Kr + head * p.Rcap * D, *Vr = p.c.Vr + head * p.Rcap * D;
            for (int64_t s = s0 + warp; s < r_end; s += WARPS) {
                DenseRegs<D> r;
                const int nv = (int)min((int64_t)16, p.R - s * 16);
                dense_load<D, VMAP_WORD>(r, Kr, Vr, s * 16, nv, lane);
                dense_compute<D>(st, qb, r, nv, p.scale, lane);
            }
        }

        // the quantized tokens: steps [qa, qe) of 64 tokens, tiles of 4 steps, double buffered
        const int qa = (int)(max(s0, p.nr) - p.nr), qe = (int)(s1 - p.nr);
        if (qa < qe) {
            uint32_t qh[D / 16][2];
            q_frags_f16<D>(qh, q_s, f_s, G, lane);
            const float sc0 = 2 * t < G ? p.scale * u_s[2 * t] : 0.f;
            const float sc1 = 2 * t + 1 < G ? p.scale * u_s[2 * t + 1] : 0.f;
            const int ta0 = qa >> 2, ta1 = (qe - 1) >> 2;
            load_tile<D, GS>(smem, p.c, head, ta0, p.T, p.Tcap, true, true, tid);
            cp_async_commit();
            for (int tile = ta0; tile <= ta1; tile++) {
                const unsigned char *buf = smem + ((tile - ta0) & 1) * BUF;
                if (tile < ta1) {
                    load_tile<D, GS>(smem + ((tile - ta0 + 1) & 1) * BUF, p.c, head, tile + 1, p.T, p.Tcap, true, true, tid);
                    cp_async_commit();
                    cp_async_wait<1>();
                } else {
                    cp_async_wait<0>();
                }
                __syncthreads();
                const int step = tile * 4 + warp;
                if (step >= qa && step < qe) {
                    float s[4][4];
                    qk_tile<D, GS>(s, buf, qh, warp, lane);
                    const int64_t tok = (int64_t)tile * TILE + 64 * warp + 8 * g;
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        const bool v0 = tok + 2 * i < p.T, v1 = tok + 2 * i + 1 < p.T;
                        s[i][0] = v0 ? s[i][0] * sc0 : -INFINITY;
                        s[i][1] = v0 ? s[i][1] * sc1 : -INFINITY;
                        s[i][2] = v1 ? s[i][2] * sc0 : -INFINITY;
                        s[i][3] = v1 ? s[i][3] * sc1 : -INFINITY;
                    }
                    uint32_t pb[4][2];
                    softmax_update<4, MT, true>(st, s, pb);
                    av_tile<D, GS>(st.o, buf, pb, warp, lane);
                }
                __syncthreads(); // the buffer is refilled in the next iteration
            }
        }

        warp_deposit<D, VMAP_WORD>(ms, st, warp, lane);
        __syncthreads();
        const int64_t first = block_of(hoff, N, grid), last = block_of(hoff + per_head - 1, N, grid);
        finish_head<D>(ms, G, head, first, last, k, p.parts, p.counters, p.o + (b * p.Hq + (int64_t)kvh * G) * D,
                       w_s, &flag_s, tid);
        u = hoff + s1;
    }
}

// ================================================================================================
// int2_decode_attn v2: the codes enter the tensor cores as exact small integers; the scales and zeros
// leave the inner loop (folded into q and p per quantization group). Design and napkin math: the
// header of this file.
// ================================================================================================
namespace v2 {

// One tile buffer (256 tokens) of v2. The key and value scales/zeros arrive in their natural layout
// and are transposed in place by the pass below (each thread transposes what its own cp.async copied).
//   KQ  key codes [D][16 words]; the 16-byte chunk ch (tokens 64ch..64ch+63, warp ch's step) of channel
//       d at chunk ch ^ ((d >> 2) & 3) (the 4 threads t of a quad hit different banks)
//   KS, KZ  natural [D][NGK] -> [NGK][D]: group row g, channel c at element g*D + (kpos(c) ^ 32(g & 1))
//   VQ  value codes [TILE][D/16]; token tau in row rho(tau) (tokens 4t + b of a 16-token block in rows
//       4b + t: the 4 threads t of a quad read 4 different banks)
//   VS, VZ  natural [TILE][NGV] -> [NGV][TILE]: group row g, token tau at g*TILE + (vpos(tau) ^ 32(g & 1))
template <int D, int GS>
struct Lay {
    static constexpr int NGK = TILE / GS, NGV = D / GS, VW = D / 16;
    static constexpr int NGS = GS >= 64 ? 1 : 64 / GS; // key groups in one warp's 64-token step
    static constexpr int KQ = 0;
    static constexpr int KS = KQ + D * 64;
    static constexpr int KZ = KS + NGK * D * 2;
    static constexpr int VQ = KZ + NGK * D * 2;
    static constexpr int VS = VQ + TILE * VW * 4;
    static constexpr int VZ = VS + NGV * TILE * 2;
    static constexpr int BYTES = VZ + NGV * TILE * 2;
    // the key-metadata pass: items (channel pair, part of PG groups), at most one per thread
    static constexpr int PG = NGK * D / 256 > 2 ? NGK * D / 256 : 2;
    static constexpr int KITEMS = (D / 2) * (NGK / PG);
    static_assert(KITEMS <= THREADS && NGK % PG == 0, "key-metadata pass: one item per thread");
};

// QK contraction order: k-step j, thread t holds channels 16j + 4t + {0,1} (b0) and + {2,3} (b1). In the
// transposed key metadata, the 4 channels of (j, t) sit next to those of (j^1, t): one 16-byte load
// serves two k-steps.
__host__ __device__ constexpr int kpos(int c) { return 32 * (c >> 5) + 8 * ((c >> 2) & 3) + 4 * ((c >> 4) & 1) + (c & 3); }
template <int D>
__host__ __device__ __forceinline__ int kphys(int g, int c) { return g * D + (kpos(c) ^ (32 * (g & 1))); }
// AV contraction order: k-step i = the warp's 16-token m-tile i; thread t holds tokens 4t, 4t+2 (b0) and
// 4t+1, 4t+3 (b1): the order movmatrix leaves the probabilities in (QK row r = token 2r, row r+8 =
// token 2r+1). In the transposed value metadata these 4 tokens are contiguous, next to those of m-tile i^1.
__host__ __device__ constexpr int vpos(int tau)
{
    return 64 * (tau >> 6) + 32 * ((tau >> 5) & 1) + 8 * ((tau >> 2) & 3) + 4 * ((tau >> 4) & 1) + (((tau & 1) << 1) | ((tau >> 1) & 1));
}
__host__ __device__ __forceinline__ int vphys(int g, int tau) { return g * TILE + (vpos(tau) ^ (32 * (g & 1))); }
__host__ __device__ constexpr int rho(int tau) { return (tau & ~15) | ((tau & 3) << 2) | ((tau >> 2) & 3); }

// N 32-bit words from shared memory in one access (N = 1, 2, 4; 4N-byte aligned)
template <int N>
__device__ __forceinline__ void lds_words(uint32_t (&w)[N], const void *p)
{
    if constexpr (N == 4) {
        const uint4 v = *reinterpret_cast<const uint4 *>(p);
        w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
    } else if constexpr (N == 2) {
        const uint2 v = *reinterpret_cast<const uint2 *>(p);
        w[0] = v.x, w[1] = v.y;
    } else {
        w[0] = *reinterpret_cast<const uint32_t *>(p);
    }
}

// Per-thread copy plan of one segment (head): the cp.async sources at tile 0 (element offsets into the
// cache arrays) and the fixed shared-memory offsets of this thread's copies and of its metadata-pass
// stores. A tile only adds its token offset. Every thread copies, and later transposes, the same parts
// of every tile:
//   key codes    chunk k < D/32: channel tid/4 + 32k, 16-byte chunk tid%4 (at chunk ^ ((d >> 2) & 3))
//   Ks, Kz       item tid < KITEMS: channels c0, c0+1 = 2 (tid / NPP), groups part*PG .. +PG, part = tid % NPP
//   value codes  chunk k < 2 CPR: token tau0 + k * 128/CPR (tau0 = tid / CPR), 16-byte chunk tid % CPR
//   Vs, Vz       tokens t0, t0 + 2 (t0 = 4(tid/2) + tid%2); NGV = 1: tokens 4 tid .. 4 tid + 3 (tid < 64)
template <int D, int GS>
struct Plan {
    int64_t kq, vq, km, vm;      // element offsets at tile 0: Kq words, Vq words, Ks/Kz halves, Vs/Vz halves
    int kqd, vqd, kmd, vmd, t0;  // shared-memory byte offsets of the copies; t0: first value-metadata token
    int kst[2], vst[2];          // pass stores: byte offsets for even / odd groups (+ 2 g D, + 2 g TILE)

    __host__ __device__ __forceinline__ void init(int64_t bh, int64_t Tcap, int tid)
    {
        using L = Lay<D, GS>;
        constexpr int CPR = D / 64, NPP = L::NGK / L::PG;
        const int d0 = tid >> 2, ch = tid & 3;
        kq = (bh * D + d0) * (Tcap / 16) + 4 * ch;
        kqd = L::KQ + d0 * 64 + 16 * (ch ^ ((d0 >> 2) & 3));
        const int tau0 = tid / CPR, vch = tid % CPR;
        vq = (bh * Tcap + tau0) * L::VW + 4 * vch;
        vqd = L::VQ + rho(tau0) * (D / 4) + 16 * vch;
        const int pair = tid / NPP, part = tid % NPP, c0 = 2 * pair;
        km = (bh * D + c0) * (Tcap / GS) + part * L::PG;
        kmd = (c0 * L::NGK + part * L::PG) * 2;
        kst[0] = 2 * (part * L::PG * D + kpos(c0)), kst[1] = 2 * (part * L::PG * D + (kpos(c0) ^ 32));
        t0 = L::NGV >= 2 ? 4 * (tid >> 1) + (tid & 1) : 4 * tid;
        vm = (bh * Tcap + t0) * L::NGV;
        vmd = t0 * 2 * L::NGV;
        vst[0] = 2 * vpos(t0), vst[1] = 2 * (vpos(t0) ^ 32);
    }
};

// Issue the cp.async copies of tile `tile` (all of it: keys past T are read from the allocated cache and
// masked as scores; value tokens past T are zero-filled: their p is 0, and 0 * NaN would be NaN).
template <int D, int GS>
__device__ __forceinline__ void load_tile(unsigned char *buf, const CachePtrs &c, const Plan<D, GS> &pl, int tile,
                                          int64_t T, int64_t Tcap, int tid)
{
    using L = Lay<D, GS>;
    constexpr int CPR = D / 64, VSTEP = THREADS / CPR;
    const int64_t tok0 = (int64_t)tile * TILE;
    const uint32_t *kq = c.Kq + pl.kq + tok0 / 16;
#pragma unroll
    for (int k = 0; k < D / 32; k++) cp_async16(buf + pl.kqd + k * 32 * 64, kq + k * 32 * (Tcap / 16), true);
    if (tid < L::KITEMS) {
        const int64_t off = pl.km + tok0 / GS;
        cp_async_zfill<2 * L::PG>(buf + L::KS + pl.kmd, c.Ks + off, true);
        cp_async_zfill<2 * L::PG>(buf + L::KS + pl.kmd + L::NGK * 2, c.Ks + off + Tcap / GS, true);
        cp_async_zfill<2 * L::PG>(buf + L::KZ + pl.kmd, c.Kz + off, true);
        cp_async_zfill<2 * L::PG>(buf + L::KZ + pl.kmd + L::NGK * 2, c.Kz + off + Tcap / GS, true);
    }
    const uint32_t *vq = c.Vq + pl.vq + tok0 * L::VW;
    const int64_t vt = tok0 + tid / CPR; // token of chunk 0
#pragma unroll
    for (int k = 0; k < 2 * CPR; k++)
        cp_async16(buf + pl.vqd + k * VSTEP * (D / 4), vq + k * VSTEP * L::VW, vt + k * VSTEP < T);
    const int64_t voff = pl.vm + tok0 * L::NGV, vt0 = tok0 + pl.t0;
    if constexpr (L::NGV >= 2) {
        cp_async_zfill<2 * L::NGV>(buf + L::VS + pl.vmd, c.Vs + voff, vt0 < T);
        cp_async_zfill<2 * L::NGV>(buf + L::VS + pl.vmd + 4 * L::NGV, c.Vs + voff + 2 * L::NGV, vt0 + 2 < T);
        cp_async_zfill<2 * L::NGV>(buf + L::VZ + pl.vmd, c.Vz + voff, vt0 < T);
        cp_async_zfill<2 * L::NGV>(buf + L::VZ + pl.vmd + 4 * L::NGV, c.Vz + voff + 2 * L::NGV, vt0 + 2 < T);
    } else if (tid < TILE / 4) {
        cp_async_zfill<8>(buf + L::VS + pl.vmd, c.Vs + voff, vt0 < T);
        cp_async_zfill<8>(buf + L::VZ + pl.vmd, c.Vz + voff, vt0 < T);
    }
}

// The metadata pass: read what this thread copied (visible to it after cp.async.wait), then, after a
// barrier, write it transposed in place.
template <int D, int GS>
struct PassRegs {
    uint32_t k[2][Lay<D, GS>::PG];                             // (m(c0, g), m(c0 + 1, g)) for Ks, Kz
    uint32_t v[2][Lay<D, GS>::NGV >= 2 ? Lay<D, GS>::NGV : 2]; // (m(t0, g), m(t0 + 2, g)) for Vs, Vz
};

template <int D, int GS>
__device__ __forceinline__ void pass_read(PassRegs<D, GS> &r, const unsigned char *buf, const Plan<D, GS> &pl, int tid)
{
    using L = Lay<D, GS>;
    if (tid < L::KITEMS) {
        constexpr int NW = L::PG / 2;
#pragma unroll
        for (int a = 0; a < 2; a++) {
            const unsigned char *x = buf + (a ? L::KZ : L::KS) + pl.kmd;
            uint32_t w0[NW], w1[NW];
            lds_words<NW>(w0, x);
            lds_words<NW>(w1, x + L::NGK * 2);
#pragma unroll
            for (int k = 0; k < NW; k++) r.k[a][2 * k] = __byte_perm(w0[k], w1[k], 0x5410), r.k[a][2 * k + 1] = __byte_perm(w0[k], w1[k], 0x7632);
        }
    }
#pragma unroll
    for (int a = 0; a < 2; a++) {
        const unsigned char *x = buf + (a ? L::VZ : L::VS) + pl.vmd;
        if constexpr (L::NGV >= 2) {
            constexpr int NW = L::NGV / 2;
            uint32_t w0[NW], w1[NW];
            lds_words<NW>(w0, x);
            lds_words<NW>(w1, x + 4 * L::NGV);
#pragma unroll
            for (int k = 0; k < NW; k++) r.v[a][2 * k] = __byte_perm(w0[k], w1[k], 0x5410), r.v[a][2 * k + 1] = __byte_perm(w0[k], w1[k], 0x7632);
        } else if (tid < TILE / 4) {
            uint32_t w[2];
            lds_words<2>(w, x); // tokens 4a..4a+3
            r.v[a][0] = __byte_perm(w[0], w[1], 0x5410), r.v[a][1] = __byte_perm(w[0], w[1], 0x7632); // (4a, 4a+2), (4a+1, 4a+3)
        }
    }
}

template <int D, int GS>
__device__ __forceinline__ void pass_write(const PassRegs<D, GS> &r, unsigned char *buf, const Plan<D, GS> &pl, int tid)
{
    using L = Lay<D, GS>;
    if (tid < L::KITEMS) {
#pragma unroll
        for (int a = 0; a < 2; a++)
#pragma unroll
            for (int k = 0; k < L::PG; k++) // group part*PG + k (PG is even: its parity is k's)
                *reinterpret_cast<uint32_t *>(buf + (a ? L::KZ : L::KS) + pl.kst[k & 1] + 2 * k * D) = r.k[a][k];
    }
#pragma unroll
    for (int a = 0; a < 2; a++) {
        unsigned char *x = buf + (a ? L::VZ : L::VS);
        if constexpr (L::NGV >= 2) {
#pragma unroll
            for (int g = 0; g < L::NGV; g++) *reinterpret_cast<uint32_t *>(x + pl.vst[g & 1] + 2 * g * TILE) = r.v[a][g];
        } else if (tid < TILE / 4) { // vpos(4a + 1) = vpos(4a) + 2
            *reinterpret_cast<uint2 *>(x + pl.vst[0]) = make_uint2(r.v[a][0], r.v[a][1]);
        }
    }
}

// ---- registers of a warp ----

// Flash state of one warp: heads 2t, 2t+1; O^T in units of the code position scale of each row (see
// Consts::fv), and the value zeros' term Z[group][head] (rows g < NGV of one C fragment).
template <int MT>
struct State {
    float m[2], l[2];
    float o[MT][4];
    float z[4];
    __device__ __forceinline__ void init()
    {
        m[0] = m[1] = -INFINITY;
        l[0] = l[1] = 0.f;
#pragma unroll
        for (int i = 0; i < MT; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
        z[0] = z[1] = z[2] = z[3] = 0.f;
    }
};

// Per-thread constants. The A fragments of both products are built the same way: row g of an m-tile
// is element 2g of a 16-element code word, row g+8 element 2g+1; one PRMT takes byte g/2 of two
// words (the two k of a register), one LOP3 (code2) keeps one 2-bit code in each 16-bit half: the fp16
// whose bits are c << sh, i.e. the exact integer c times 2^(sh-24) (a subnormal; sh = 4(g&1) for row g,
// 4(g&1) + 2 for row g+8). rf[r] undoes the row scale (r = 0: row g, 1: row g+8). (Measured and
// dropped: 1024 + c 2^sh with an HSUB2 to remove the 1024, the same results 3-4% slower; see
// results/h200/int2/NOTES.md.)
struct Consts {
    uint32_t sel, m0, m1;
    float rf[2];
};

__device__ __forceinline__ Consts make_consts(int lane)
{
    const int g = lane >> 2, b = g >> 1, sh = 4 * (g & 1);
    Consts k;
    k.sel = (uint32_t)(b | (b << 4) | ((b + 4) << 8) | ((b + 4) << 12));
    k.m0 = 0x00030003u << sh, k.m1 = 0x000C000Cu << sh;
    k.rf[0] = exp2f((float)(24 - sh)), k.rf[1] = exp2f((float)(24 - sh - 2));
    return k;
}

__device__ __forceinline__ uint32_t code2(uint32_t m, uint32_t mask) { return m & mask; }

__device__ __forceinline__ uint32_t hmul2u(uint32_t a, uint32_t b)
{
    __half2 r = __hmul2(*reinterpret_cast<__half2 *>(&a), *reinterpret_cast<__half2 *>(&b));
    return *reinterpret_cast<uint32_t *>(&r);
}

// a * b - c, one rounding (the low half of the product when c = fp16(a * b): exact)
__device__ __forceinline__ uint32_t hfms2u(uint32_t a, uint32_t b, uint32_t c)
{
    __half2 r = __hfma2(*reinterpret_cast<__half2 *>(&a), *reinterpret_cast<__half2 *>(&b), __hneg2(*reinterpret_cast<__half2 *>(&c)));
    return *reinterpret_cast<uint32_t *>(&r);
}

__device__ __forceinline__ uint32_t word_of(const uint4 &v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

// fp16 q fragments in the v2 contraction order (channels 16j + 4t + {0,1}, {2,3}), head g's row scaled
// by f_s[g], written by warp 0 to shared memory (qf_s [D/16][32 lanes] uint2): the same for every warp,
// read back per k-step (16 registers fewer in the hot loop).
template <int D>
__device__ __forceinline__ void q_frags_store(uint2 *qf_s, const float *q_s, const float *f_s, int G, int lane)
{
    const int g = lane >> 2, t = lane & 3;
    const float f = g < G ? f_s[g] : 0.f;
#pragma unroll
    for (int j = 0; j < D / 16; j++) {
        const float *r = q_s + g * D + 16 * j + 4 * t;
        qf_s[32 * j + lane] = g < G ? make_uint2(pack_f16(r[0] * f, r[1] * f), pack_f16(r[2] * f, r[3] * f)) : make_uint2(0u, 0u);
    }
}

// Fold NT tiles of log2-domain scores (C fragments of S^T, masked = -inf) into the state and return
// the probabilities as B fragments of P^T (16-bit: fp16 or bf16). The O and Z rescale is skipped when
// no running max of the warp moved. SUM: add the probabilities to st.l here (the residual steps); the
// quantized steps get their sums from row 8 of the zeros' MMA instead (Z row 8 = sum of the fp16 p).
template <int NT, int MT, bool F16, bool SUM>
__device__ __forceinline__ void softmax(State<MT> &st, float (&s)[NT][4], uint32_t (&pb)[NT][2])
{
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int i = 0; i < NT; i++) {
        mx0 = fmaxf(mx0, fmaxf(s[i][0], s[i][2]));
        mx1 = fmaxf(mx1, fmaxf(s[i][1], s[i][3]));
    }
    warp_max<4, 16>(mx0, mx1); // over the 8 row groups
    const float n0 = fmaxf(st.m[0], mx0), n1 = fmaxf(st.m[1], mx1);
    const float b0 = n0 == -INFINITY ? 0.f : n0, b1 = n1 == -INFINITY ? 0.f : n1;
    const float a0 = ex2(st.m[0] - b0), a1 = ex2(st.m[1] - b1);
    st.m[0] = n0, st.m[1] = n1;
    if (__any_sync(0xffffffffu, a0 != 1.f || a1 != 1.f)) {
        st.l[0] *= a0, st.l[1] *= a1;
#pragma unroll
        for (int i = 0; i < MT; i++) st.o[i][0] *= a0, st.o[i][1] *= a1, st.o[i][2] *= a0, st.o[i][3] *= a1;
        st.z[0] *= a0, st.z[1] *= a1, st.z[2] *= a0, st.z[3] *= a1;
    }
#pragma unroll
    for (int i = 0; i < NT; i++) {
        float p0 = ex2(s[i][0] - b0), p1 = ex2(s[i][1] - b1), p2 = ex2(s[i][2] - b0), p3 = ex2(s[i][3] - b1);
        if constexpr (SUM) st.l[0] += p0 + p2, st.l[1] += p1 + p3;
        pb[i][0] = movmatrix_t(F16 ? pack_f16(p0, p1) : pack_bf16(p0, p1));
        pb[i][1] = movmatrix_t(F16 ? pack_f16(p2, p3) : pack_bf16(p2, p3));
    }
}

// ---- one 64-token step of the quantized cache (warp w of the tile in `buf`) ----
// uf[c]: the score factor of column 2t + c (log2(e)/sqrt(D) / q's power-of-two scale); tok: the step's
// first token (masking: T is a multiple of 16, so an m-tile is wholly valid or not).
template <int D, int GS>
__device__ __forceinline__ void quant_step(State<D / 16> &st, const unsigned char *buf, const uint2 *qf_s,
                                           const Consts &k, const float (&uf)[2], int w, int lane, int64_t tok, int64_t T)
{
    using L = Lay<D, GS>;
    constexpr int MT = D / 16, NGS = L::NGS, NGV = L::NGV;
    const int g = lane >> 2, t = lane & 3;

    // ---- S^T = codes^T . (q s_g) (hi and lo halves of q s_g), and the key zeros' bias q . z_g ----
    // (Measured and dropped: the hi half alone, 4-5% faster but the spiky case at 93% of its tolerance
    // instead of 25%; see results/h200/int2/NOTES.md.)
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
    float bacc[4] = {0.f, 0.f, 0.f, 0.f}; // rows g < NGS: the step's key group g
    const int gk0 = (64 * w) / GS;         // the tile's key group of the step's first m-tile
    const unsigned char *kq = buf + L::KQ + (4 * t) * 64 + 16 * (w ^ t);
    // Transposed key metadata of group gr, channels 16j + 4t..: element gr*D + (kpos ^ 32 (gr & 1)), and
    // kpos ^ 32p = 32 ((j >> 1) ^ p) + 8t + 4 (j & 1): one base per parity of (j >> 1) ^ p, the rest immediate.
    const unsigned char *ks_b = buf + L::KS + 2 * (gk0 * D + 8 * t); // step group r: + 2 r D
    const int pk = GS >= 64 ? (gk0 & 1) : 0;                          // parity of group gk0 (0 when GS <= 32)
    const unsigned char *kz_b[2] = {nullptr, nullptr};               // Kz^T of step group g, by (j >> 1) & 1
    if (g < NGS) {
        const int pz = (gk0 + g) & 1;
        const unsigned char *b = buf + L::KZ + 2 * ((gk0 + g) * D + 8 * t);
        kz_b[0] = b + 64 * pz, kz_b[1] = b + 64 * (1 - pz);
    }
#pragma unroll
    for (int j = 0; j < MT; j++) {
        const int jo = 2 * (32 * ((j >> 1) & ~1) + 4 * (j & 1)); // byte offset of k-step j past its parity base
        const uint2 qj = qf_s[32 * j + lane];
        uint4 wv[4]; // channels 16j + 4t + e: code words of the step's 4 m-tiles
#pragma unroll
        for (int e = 0; e < 4; e++) wv[e] = *reinterpret_cast<const uint4 *>(kq + j * 1024 + e * 64);
        uint2 zk = make_uint2(0u, 0u); // Kz^T of step group g (rows >= NGS: 0)
        if (g < NGS) zk = *reinterpret_cast<const uint2 *>(kz_b[(j >> 1) & 1] + jo);
        mma_f16(bacc, zk.x, 0u, zk.y, 0u, qj.x, qj.y);
        uint32_t bh[2], bl[2];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            if (i == 0 || (GS < 64 && (16 * i) % GS == 0)) { // q s_g of this m-tile's group, hi and lo
                const int r = GS >= 64 ? 0 : (16 * i) / GS;
                const int par = ((j >> 1) & 1) ^ ((GS >= 64 ? pk : r) & 1); // (j >> 1) ^ parity of group gk0 + r
                const uint2 sk = *reinterpret_cast<const uint2 *>(ks_b + 2 * r * D + 64 * par + jo);
                bh[0] = hmul2u(qj.x, sk.x), bh[1] = hmul2u(qj.y, sk.y);
                bl[0] = hfms2u(qj.x, sk.x, bh[0]), bl[1] = hfms2u(qj.y, sk.y, bh[1]);
            }
            const uint32_t m01 = __byte_perm(word_of(wv[0], i), word_of(wv[1], i), k.sel);
            const uint32_t m23 = __byte_perm(word_of(wv[2], i), word_of(wv[3], i), k.sel);
            const uint32_t a0 = code2(m01, k.m0), a1 = code2(m01, k.m1);
            const uint32_t a2 = code2(m23, k.m0), a3 = code2(m23, k.m1);
            mma_f16(acc[i], a0, a1, a2, a3, bh[0], bh[1]);
            mma_f16(acc[i], a0, a1, a2, a3, bl[0], bl[1]);
        }
    }

    // ---- scores (log2 domain): acc * rf[row] * uf[col] + bias * uf[col]; the bias of step group r is
    // row r of bacc, held by lanes 4r + t ----
    float bz[NGS][2];
#pragma unroll
    for (int r = 0; r < NGS; r++) {
        bz[r][0] = __shfl_sync(0xffffffffu, bacc[0], 4 * r + t) * uf[0];
        bz[r][1] = __shfl_sync(0xffffffffu, bacc[1], 4 * r + t) * uf[1];
    }
    const float f00 = k.rf[0] * uf[0], f01 = k.rf[0] * uf[1], f10 = k.rf[1] * uf[0], f11 = k.rf[1] * uf[1];
    float s[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int r = GS >= 64 ? 0 : (16 * i) / GS;
        s[i][0] = fmaf(acc[i][0], f00, bz[r][0]);
        s[i][1] = fmaf(acc[i][1], f01, bz[r][1]);
        s[i][2] = fmaf(acc[i][2], f10, bz[r][0]);
        s[i][3] = fmaf(acc[i][3], f11, bz[r][1]);
    }
    if (tok + 64 > T) // the step ends past T (T is a multiple of 16: whole m-tiles are masked)
#pragma unroll
        for (int i = 1; i < 4; i++)
            if (tok + 16 * i >= T) s[i][0] = s[i][1] = s[i][2] = s[i][3] = -INFINITY;
    uint32_t pb[4][2];
    softmax<4, MT, true, false>(st, s, pb);

    // ---- O^T += codes^T . (p s_g) per value group, Z += zeros^T . p ----
    const unsigned char *vq = buf + L::VQ + (64 * w + t) * (D / 4);
    const uint32_t one8 = g == 0 ? 0x3C003C00u : 0u; // A row 8 (lanes g = 0, registers a1, a3): fp16 1.0
    // Transposed value metadata of group gv, tokens 64w + 16i + 4t..: element gv*TILE + (vpos ^ 32 (gv & 1)),
    // vpos ^ 32p = 64w + 32 ((i >> 1) ^ p) + 8t + 4 (i & 1).
    const unsigned char *vs_b = buf + L::VS + 2 * (64 * w + 8 * t);
    const unsigned char *vz_b[2] = {nullptr, nullptr}; // Vz^T of value group g, by (i >> 1)
    if (g < NGV) {
        const unsigned char *b = buf + L::VZ + 2 * (g * TILE + 64 * w + 8 * t);
        vz_b[0] = b + 64 * (g & 1), vz_b[1] = b + 64 * (1 - (g & 1));
    }
    // The products of one step accumulate from zero on the tensor cores (4 k-steps) and are then added to
    // the running state with fp32 adds: the code sums sum_t p s c are all positive and cancel against the
    // zeros' sums, and long tensor-core accumulation chains (truncating, measured: rel L2 0.0106 at
    // T=128K with ~125 steps per warp) bias them.
    float zs[4] = {0.f, 0.f, 0.f, 0.f}; // this step's Z (rows g < NGV) and row 8 (the sum of p)
#pragma unroll
    for (int i = 0; i < 4; i++) {
        uint2 zv = make_uint2(0u, 0u); // (z(4t), z(4t+2)), (z(4t+1), z(4t+3)) of value group g (rows >= NGV: 0)
        if (g < NGV) zv = *reinterpret_cast<const uint2 *>(vz_b[i >> 1] + 8 * (i & 1));
        mma_f16(zs, zv.x, one8, zv.y, one8, pb[i][0], pb[i][1]);
    }
#pragma unroll
    for (int e = 0; e < 4; e++) st.z[e] += zs[e];
#pragma unroll
    for (int ch = 0; ch < D / 64; ch++) { // channels 64ch .. 64ch + 63: value m-tiles 4ch .. 4ch + 3
        float os[4][4];                   // this step's O^T of those m-tiles
#pragma unroll
        for (int mm = 0; mm < 4; mm++) os[mm][0] = os[mm][1] = os[mm][2] = os[mm][3] = 0.f;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            uint4 wv[4]; // code words of tokens 4t + b of m-tile i
#pragma unroll
            for (int b = 0; b < 4; b++) wv[b] = *reinterpret_cast<const uint4 *>(vq + (16 * i + 4 * b) * (D / 4) + 16 * ch);
            uint32_t pp0 = 0, pp1 = 0;
#pragma unroll
            for (int mm = 0; mm < 4; mm++) {
                const int mv = 4 * ch + mm, gv = (16 * mv) / GS;
                if (mm == 0 || (16 * mv) % GS == 0) { // p s_g of this m-tile's value group
                    const uint2 sv = *reinterpret_cast<const uint2 *>(vs_b + 2 * gv * TILE + 64 * ((i >> 1) ^ (gv & 1)) + 8 * (i & 1));
                    pp0 = hmul2u(pb[i][0], sv.x), pp1 = hmul2u(pb[i][1], sv.y);
                }
                const uint32_t m02 = __byte_perm(word_of(wv[0], mm), word_of(wv[2], mm), k.sel);
                const uint32_t m13 = __byte_perm(word_of(wv[1], mm), word_of(wv[3], mm), k.sel);
                mma_f16(os[mm], code2(m02, k.m0), code2(m02, k.m1), code2(m13, k.m0), code2(m13, k.m1), pp0, pp1);
            }
        }
#pragma unroll
        for (int mm = 0; mm < 4; mm++)
#pragma unroll
            for (int e = 0; e < 4; e++) st.o[4 * ch + mm][e] += os[mm][e];
    }
}

// ---- the bf16 residual: 16 tokens per step, bf16 MMA, into the same state ----
// K as decode.cu's dense step; V^T rows in the v2 order (m-tile mv, row g: channel 16mv + 2g, row g+8:
// 16mv + 2g + 1), each row scaled by 1 / rf (exact: a power of two) so that it shares the O^T units of
// the quantized tokens.
template <int D>
struct Dense {
    uint32_t k0[D / 8], k8[D / 8];
    uint32_t v[4][D / 16]; // tokens 2t, 2t+1, 2t+8, 2t+9: channels (16mv + 2g, +1)
};

template <int D>
__device__ __forceinline__ void dense_load_v2(Dense<D> &r, const __nv_bfloat16 *__restrict__ K,
                                              const __nv_bfloat16 *__restrict__ V, int64_t tok0, int nvalid, int lane)
{
    const int g = lane >> 2, t = lane & 3;
    const bool ok0 = g < nvalid, ok8 = g + 8 < nvalid;
    const __nv_bfloat16 *r0 = K + (tok0 + g) * D + t * (D / 4), *r8 = r0 + 8 * D;
#pragma unroll
    for (int c = 0; c < D / 32; c++) {
        uint4 x = ok0 ? ldg16(r0 + 8 * c) : make_uint4(0, 0, 0, 0);
        uint4 y = ok8 ? ldg16(r8 + 8 * c) : make_uint4(0, 0, 0, 0);
        r.k0[4 * c] = x.x, r.k0[4 * c + 1] = x.y, r.k0[4 * c + 2] = x.z, r.k0[4 * c + 3] = x.w;
        r.k8[4 * c] = y.x, r.k8[4 * c + 1] = y.y, r.k8[4 * c + 2] = y.z, r.k8[4 * c + 3] = y.w;
    }
#pragma unroll
    for (int q = 0; q < 4; q++) {
        const int tk = 2 * t + (q & 1) + 8 * (q >> 1);
        const bool ok = tk < nvalid;
        const uint32_t *row = reinterpret_cast<const uint32_t *>(V + (tok0 + tk) * D) + g;
#pragma unroll
        for (int mv = 0; mv < D / 16; mv++) r.v[q][mv] = ok ? __ldg(row + 8 * mv) : 0u;
    }
}

template <int D>
__device__ __forceinline__ void dense_step_v2(State<D / 16> &st, const uint32_t (&qb)[D / 16][2], const Dense<D> &r,
                                              int nvalid, float scale, uint32_t vs0, uint32_t vs1, int lane)
{
    constexpr int MT = D / 16;
    const int g = lane >> 2;
    float s[1][4] = {{0.f, 0.f, 0.f, 0.f}};
#pragma unroll
    for (int j = 0; j < D / 16; j++)
        mma_bf16(s[0], r.k0[2 * j], r.k8[2 * j], r.k0[2 * j + 1], r.k8[2 * j + 1], qb[j][0], qb[j][1]);
    s[0][0] = g < nvalid ? s[0][0] * scale : -INFINITY;
    s[0][1] = g < nvalid ? s[0][1] * scale : -INFINITY;
    s[0][2] = g + 8 < nvalid ? s[0][2] * scale : -INFINITY;
    s[0][3] = g + 8 < nvalid ? s[0][3] * scale : -INFINITY;
    uint32_t pb[1][2];
    softmax<1, MT, false, true>(st, s, pb);
    const __nv_bfloat162 f0 = bf2_of(vs0), f1 = bf2_of(vs1);
#pragma unroll
    for (int mv = 0; mv < MT; mv++) {
        const uint32_t a0 = bits_of(__hmul2(bf2_of(__byte_perm(r.v[0][mv], r.v[1][mv], 0x5410)), f0));
        const uint32_t a1 = bits_of(__hmul2(bf2_of(__byte_perm(r.v[0][mv], r.v[1][mv], 0x7632)), f1));
        const uint32_t a2 = bits_of(__hmul2(bf2_of(__byte_perm(r.v[2][mv], r.v[3][mv], 0x5410)), f0));
        const uint32_t a3 = bits_of(__hmul2(bf2_of(__byte_perm(r.v[2][mv], r.v[3][mv], 0x7632)), f1));
        mma_bf16(st.o[mv], a0, a1, a2, a3, pb[0][0], pb[0][1]);
    }
}

// Every warp deposits its state in the merge buffer: O^T rows back to channels and true units, plus Z.
template <int D, int GS>
__device__ __forceinline__ void deposit(MergeSmem<D> &ms, const State<D / 16> &st, const Consts &k, int warp, int lane)
{
    const int g = lane >> 2, t = lane & 3;
    float l0 = st.l[0] + (g == 0 ? st.z[2] : 0.f), l1 = st.l[1] + (g == 0 ? st.z[3] : 0.f); // + Z row 8 (sum of p)
    warp_sum<4, 16>(l0, l1); // over the 8 row groups
    if (g == 0) {
        ms.m[warp][2 * t] = st.m[0], ms.m[warp][2 * t + 1] = st.m[1];
        ms.l[warp][2 * t] = l0, ms.l[warp][2 * t + 1] = l1;
    }
#pragma unroll
    for (int mv = 0; mv < D / 16; mv++) {
        const int c = 16 * mv + 2 * g;
        ms.o[warp][2 * t][c] = st.o[mv][0] * k.rf[0];
        ms.o[warp][2 * t + 1][c] = st.o[mv][1] * k.rf[0];
        ms.o[warp][2 * t][c + 1] = st.o[mv][2] * k.rf[1];
        ms.o[warp][2 * t + 1][c + 1] = st.o[mv][3] * k.rf[1];
    }
    __syncwarp();
    if (g < D / GS)
        for (int c = g * GS; c < g * GS + GS; c++) ms.o[warp][2 * t][c] += st.z[0], ms.o[warp][2 * t + 1][c] += st.z[1];
}

// The residual steps of a segment and the merge run once per segment: out of line, so that their
// registers do not add to the hot loop's. The residual steps come first in a segment: they start the
// state and return it (by value: the caller's copy stays in registers).
template <int D>
__device__ __noinline__ State<D / 16> residual_steps(const float *q_s, int G, const __nv_bfloat16 *Kr,
                                                     const __nv_bfloat16 *Vr, int64_t s0, int64_t r_end, int R,
                                                     float scale, uint32_t vs0, uint32_t vs1, int warp, int lane)
{
    State<D / 16> st;
    st.init();
    uint32_t qb[D / 16][2];
    q_frags_bf16<D>(qb, q_s, G, lane);
    for (int64_t s = s0 + warp; s < r_end; s += WARPS) {
        Dense<D> r;
        const int nv = (int)min((int64_t)16, R - s * 16);
        dense_load_v2<D>(r, Kr, Vr, s * 16, nv, lane);
        dense_step_v2<D>(st, qb, r, nv, scale, vs0, vs1, lane);
    }
    return st;
}

template <int D>
__device__ __noinline__ void finish(const MergeSmem<D> &ms, int G, int64_t head, int64_t first, int64_t last, int64_t k,
                                    float *parts, int *counters, __nv_bfloat16 *out, float *w_s, int *flag_s, int tid)
{
    finish_head<D>(ms, G, head, first, last, k, parts, counters, out, w_s, flag_s, tid);
}

// Tile buffers: STAGES of them (two tiles in flight while one computes, at 2 blocks per SM), the merge
// buffer aliasing them. (Measured and dropped: registers for 3 blocks per SM, which spills and leaves
// shared memory for 2 buffers only, 4-6% slower; see results/h200/int2/NOTES.md.)
constexpr int STAGES = 3, MIN_BLOCKS = 2;

template <int D, int GS>
__host__ __device__ constexpr size_t tiles_bytes()
{
    return STAGES * (size_t)Lay<D, GS>::BYTES > sizeof(MergeSmem<D>) ? STAGES * (size_t)Lay<D, GS>::BYTES : sizeof(MergeSmem<D>);
}

template <int D, int GS>
constexpr size_t smem_bytes()
{
    return tiles_bytes<D, GS>() + sizeof(float) * (MAXG * D + 64 * MAXG + 2 * MAXG);
}

template <int D, int GS>
__global__ void __launch_bounds__(THREADS, MIN_BLOCKS) attn_kernel(AttnParams p)
{
    constexpr int MT = D / 16;
    constexpr int BUF = Lay<D, GS>::BYTES;
    extern __shared__ __align__(16) unsigned char smem[];
    MergeSmem<D> &ms = *reinterpret_cast<MergeSmem<D> *>(smem); // aliases the tile buffers once drained
    float *q_s = reinterpret_cast<float *>(smem + tiles_bytes<D, GS>());
    float *w_s = q_s + MAXG * D, *f_s = w_s + 64 * MAXG, *u_s = f_s + MAXG;
    __shared__ int flag_s;

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int G = p.G;
    const Consts k = make_consts(lane);
    const uint32_t vs0 = bits_of(__float2bfloat162_rn(1.f / k.rf[0])), vs1 = bits_of(__float2bfloat162_rn(1.f / k.rf[1]));
    const int64_t per_head = p.nr + p.nq, N = p.heads * per_head, grid = gridDim.x, kb = blockIdx.x;
    int64_t u = part_begin(kb, N, grid);
    const int64_t u1 = part_begin(kb + 1, N, grid);
    while (u < u1) {
        const int64_t head = u / per_head, hoff = head * per_head;
        const int64_t s0 = u - hoff, s1 = min(u1, hoff + per_head) - hoff;
        const int64_t b = head / p.Hkv;
        const int kvh = (int)(head % p.Hkv);
        __syncthreads(); // the previous segment is done with shared memory
        stage_q(q_s, f_s, u_s, p.q + (b * p.Hq + (int64_t)kvh * G) * D, G, D, tid, 1);
        State<MT> st;
        st.init();

        const int64_t r_end = min(s1, p.nr);
        if (s0 < r_end)
            st = residual_steps<D>(q_s, G, p.c.Kr + head * p.Rcap * D, p.c.Vr + head * p.Rcap * D, s0, r_end, p.R,
                                   p.scale, vs0, vs1, warp, lane);

        const int qa = (int)(max(s0, p.nr) - p.nr), qe = (int)(s1 - p.nr);
        if (qa < qe) {
            uint2 *qf_s = reinterpret_cast<uint2 *>(w_s); // w_s is free until the merge
            if (warp == 0) q_frags_store<D>(qf_s, q_s, f_s, G, lane); // visible after the tile loop's first barrier
            const float uf[2] = {2 * t < G ? p.scale * u_s[2 * t] : 0.f, 2 * t + 1 < G ? p.scale * u_s[2 * t + 1] : 0.f};
            const int ta0 = qa >> 2, ta1 = (qe - 1) >> 2;
            Plan<D, GS> pl;
            pl.init(head, p.Tcap, tid);
            // cp.async groups: one per tile (one per iteration, empty past the last tile), so that waiting
            // for all but the newest STAGES - 2 leaves this tile's complete
            static_assert(STAGES == 3, "the prologue issues tiles ta0 and ta0 + 1");
            load_tile<D, GS>(smem, p.c, pl, ta0, p.T, p.Tcap, tid);
            cp_async_commit();
            if (ta0 < ta1) load_tile<D, GS>(smem + BUF, p.c, pl, ta0 + 1, p.T, p.Tcap, tid);
            cp_async_commit();
            int slot = 0; // the buffer of `tile`
            for (int tile = ta0; tile <= ta1; tile++) {
                unsigned char *buf = smem + slot * BUF;
                cp_async_wait<STAGES - 2>();
                PassRegs<D, GS> pr;
                pass_read<D, GS>(pr, buf, pl, tid);
                __syncthreads(); // every warp is past the previous tile, and done reading this one's metadata
                pass_write<D, GS>(pr, buf, pl, tid);
                __syncthreads(); // the transposed metadata and the codes are visible
                const int nt = tile + STAGES - 1, ns = slot == 0 ? STAGES - 1 : slot - 1; // into the previous tile's buffer
                if (nt <= ta1) load_tile<D, GS>(smem + ns * BUF, p.c, pl, nt, p.T, p.Tcap, tid);
                cp_async_commit();
                slot = slot == STAGES - 1 ? 0 : slot + 1;
                const int step = tile * 4 + warp;
                if (step >= qa && step < qe)
                    quant_step<D, GS>(st, buf, qf_s, k, uf, warp, lane, (int64_t)step * 64, p.T);
            }
            __syncthreads(); // the merge buffer aliases the tiles
        }

        deposit<D, GS>(ms, st, k, warp, lane);
        __syncthreads();
        const int64_t first = block_of(hoff, N, grid), last = block_of(hoff + per_head - 1, N, grid);
        finish<D>(ms, G, head, first, last, kb, p.parts, p.counters, p.o + (b * p.Hq + (int64_t)kvh * G) * D, w_s,
                  &flag_s, tid);
        u = hoff + s1;
    }
    (void)g;
}

} // namespace v2

// ================================================================================================
// int2_decode_attn v3: the kernel-native layout (reference/int2.h) and warp-owned bulk-copy pipelines.
//
// Budget (per 64-token warp step of one KV head, D=128, gs=16, G=4; counted from the code below):
//   bytes: key codes 2 KB + value codes 2 KB + key scales/zeros 2 KB + value scales/zeros 2 KB = 8 KB;
//     at 80% of ~4.5 TB/s over 132 SMs one SM retires a step every ~590 cycles: with 4 schedulers,
//     ~2370 issue cycles of one scheduler per warp step.
//   v2 spent ~1457 instructions per step (ncu), ~1050 by its count: 4 LDS.128 + 8 PRMT + 16 LOP3 per
//     k-step to build fragments (codes in the interchange order), 16 cp.async per thread and a metadata
//     transposition pass per tile, two block barriers per tile.
//   v3 reads codes already in fragment order: per key k-step one LDS.64, 2 SHF and 16 LOP3 (one AND per A
//     register: the 2-bit code at bits 2(2i + h) of each half, or of the word shifted right by 8 where
//     that position is above 8, an exact fp16 subnormal; see code_reg); per value k-step one LDS.128,
//     4 SHF and 32 LOP3; metadata group-major (no pass). Count: keys 8 x (2 LDS +
//     16 LOP3 + 4 x (LDS + 4 HMUL/HFMA + 2 MMA) + LDS + MMA) ~ 400; scores and softmax ~100; values
//     4 x (LDS + 32 LOP3 + 8 x (LDS + 2 HMUL2 + MMA) + LDS + MMA) ~ 270; state adds ~36; the copy: one
//     lane issues the bulk copies, every lane waits on one mbarrier: ~10. About 820 per step (v2: ~1050).
//   Measured (results/h200/int2-v3-8f26078, ncu, T=32K): 1381 per step with six copies per step. The
//     SASS wraps each cp.async.bulk in an elect loop with uniform-register moves (~25 instructions per
//     copy, paid by the whole warp), so the layout now packs a step into two runs: its Rec run (codes
//     and value metadata) and its key-metadata rows (shared by two steps at gs=128, hence apart).
//   Then (G <= 4) the hi and lo halves of q s_g share one MMA as the two halves of its 8 columns (see
//     step's PAIR): 76 MMAs per step instead of 108; T=128K, gs=16 at 85% of the read rate
//     (results/h200/int2-v3-acdccf3).
//   Structure: each warp owns a ring of STAGES step records in shared memory and its own mbarriers; its
//     lane 0 bulk-copies (cp.async.bulk, complete_tx on the stage's mbarrier) the two contiguous runs of
//     a step STAGES - 1 steps ahead. No block barrier inside the token loop: warps drift freely, and a
//     block barrier only brackets a segment (staging q, the merge). The residual (bf16) steps and the
//     stream-K split are v2's, with two launch changes: the grid is a multiple of the heads (one segment
//     per block), and a segment's first records are requested before q is staged; on an H100 in one run,
//     32K gs=16 125.8 -> 114.2 us, gs=128 86.4 -> 76.4 us (results/h100/int2-v3-1dc67b9). In the split a
//     residual step weighs 4 units (v3_residual_weight).
//   Then one block of 12 warps per SM instead of 3 blocks of 4, its warps claiming the segment's steps
//     one at a time from a shared counter, so that an SM's warps finish within a step of each other
//     (with fixed shares, an SM's blocks ended up to ~12 us apart at 32K); where the head-aligned grid
//     gives a head 2 to 8 blocks, they form a cluster and merge through distributed shared memory
//     (cluster_merge) instead of global partials and an arrival counter; and deposit's zeros term from
//     two shuffles per m-tile, not a loop over a group's channels (~2.6 us at gs=128); q's fragments are
//     stored before the residual steps. On an H100, all B=8 cases 4-16% faster than before in one call;
//     32K gs=128 at 79.8-81.0% of the read rate, 5.56x dense (results/h100/s14-int2-12warps).
// ================================================================================================
// The output of an av block (int2_av, v3's int2_av_native): the 4 warps' partial rows o[w][g][d] summed.
// With several splits per head each split stores its sum in its slot of parts, and the last split to
// arrive (counters[head]) adds the slots in split order, so that the result does not depend on which
// split ends last; it resets the counter for the next launch.
template <int D>
__device__ __forceinline__ void av_store(float (*o)[MAXG][D], float *out, float *parts, int *counters, int *flag_s,
                                         int64_t head, int64_t split, int nsplit, int G, int tid)
{
    if (nsplit == 1) {
        for (int idx = tid; idx < G * D; idx += THREADS)
            out[idx] = o[0][idx / D][idx % D] + o[1][idx / D][idx % D] + o[2][idx / D][idx % D] + o[3][idx / D][idx % D];
        return;
    }
    float *part = parts + (head * nsplit + split) * G * D;
    for (int idx = tid; idx < G * D; idx += THREADS)
        part[idx] = o[0][idx / D][idx % D] + o[1][idx / D][idx % D] + o[2][idx / D][idx % D] + o[3][idx / D][idx % D];
    __syncthreads();
    if (tid == 0) *flag_s = arrive_acq_rel_gpu(&counters[head]) == nsplit - 1;
    __syncthreads();
    if (!*flag_s) return;
    for (int idx = tid; idx < G * D; idx += THREADS) {
        float v = 0.f;
        for (int sp = 0; sp < nsplit; sp++) v += __ldcg(parts + (head * nsplit + sp) * G * D + idx);
        out[idx] = v;
    }
    if (tid == 0) counters[head] = 0;
}

namespace v3 {

using v2::State;

struct NativePtrs {
    const uint32_t *Rec; // per 64-token step: key codes, value codes, value scales and zeros
    const __half *Km;    // per key group: scales then zeros, group-major
};

struct Params {
    AttnParams a; // q, the residual (a.c.Kr, a.c.Vr), shapes, the stream-K line, the merge workspace
    NativePtrs n;
    int early;    // 1: a segment's first records are requested before q is staged and the residual read
    int rw;       // units of the stream-K line per residual (16-token bf16) step: its weight in the split
    int cluster;  // > 1: launched as clusters of this many blocks, one cluster per head (cluster_merge)
    int frags_late; // 1: q's fragments stored after the residual steps (every warp waits for them)
    int fill0;      // records a warp requests before its first step (1..S-1; 0: by the segment's length)
    int q_prefetch; // 1: q's lines prefetched into L2 before the first records are requested
    int q_warp0;    // 1: warp 0 loads q before the first barrier and makes the fragments alone (q_rows_*)
    int instant;    // 1: a block's first fill is requested before its first barrier (static steps)
    int merge_last; // 1 (clusters): the last rank merges the cluster's partials (cluster_merge), not rank 0
    int slots_apart; // 1 (clusters): the merger's partial slots lie past the rings (dynamic shared memory from
                     // smem_bytes() on), not over them
    int wait_early;  // 1 (slots_apart): the cluster barrier's first phase waited once q is staged, not at the merge
    int relaxed_merger; // 1 (clusters): the merger's second arrival relaxed (its own slot written locally)
    int pairs;          // 1 (clusters): the cluster's combine and merge take two adjacent channels a thread
};

// One step record (64 tokens of one KV head) as the two bulk copies lay it down, byte offsets: the
// step's run of Rec (key codes, value codes, value metadata), then its NGS key-metadata rows of Km.
template <int D, int GS>
struct Rec {
    static constexpr int NGS = GS >= 64 ? 1 : 64 / GS; // key groups of a step
    static constexpr int NGV = D / GS;                  // value groups of a token
    static constexpr int KC = 0, VC = 16 * D;           // codes: 64 tokens x D channels x 2 bits each
    static constexpr int VM = 32 * D;                   // value scales/zeros of block i: VM + 2i NGV 32 (+ NGV 32)
    static constexpr int REC = VM + 4 * 2 * NGV * 32;   // the Rec run
    static constexpr int KM = REC;                      // key row r: scales at KM + r 4D, zeros + 2D
    static constexpr int KMB = NGS * 4 * D;
    static constexpr int BYTES = KM + KMB;
    static_assert(REC % 16 == 0 && KMB % 16 == 0, "bulk copies: 16-byte multiples");
};

// Where the two runs (Rec, Km) of step `step` of head `head` lie.
template <int D, int GS>
struct RecSrc {
    const uint32_t *rec;
    const __half *km;
    __device__ __forceinline__ RecSrc(const NativePtrs &n, int64_t head, int64_t step, int64_t Tcap)
        : rec(n.Rec + (head * (Tcap / 64) + step) * (Rec<D, GS>::REC / 4)),
          km(n.Km + (head * (Tcap / GS) + (step * 64) / GS) * (2 * D))
    {
    }
};

// Lane 0: the record at `src` into the ring slot at shared address `dst`, completing on the mbarrier at
// shared address `bar`. The fence orders this warp's earlier generic accesses to the slot (its reads,
// the tail zeroing) before the copy. (tr: the trace's clock after the expected bytes.)
template <int D, int GS>
__device__ __forceinline__ void issue_step(uint32_t dst, uint32_t bar, const RecSrc<D, GS> &src, long long *tr = nullptr)
{
    using R = Rec<D, GS>;
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    mbar_expect_tx(bar, R::BYTES);
    if (tr) *tr = clock64(); // (the trace)
    bulk_copy(dst, src.rec, R::REC, bar);
    bulk_copy(dst + R::KM, src.km, R::KMB, bar);
}

constexpr uint32_t CODE_MASK = 0x00030003u;

// The code at bit position pos (= 2(2x + h), 0..14) of each 16-bit half as an A-fragment register. The
// fp16 with bits c << s is the exact c * 2^(s - 24) only while c << s < 1024 (a subnormal: s <= 8), so
// the codes at 10..14 are taken from the word shifted right by 8 (w8), at 2..6: one AND either way, one
// shift per word. code_sh(pos): the s the register ends up with (its row is scaled by 2^(s - 24)).
__host__ __device__ constexpr int code_sh(int pos) { return pos <= 8 ? pos : pos - 8; }
__device__ __forceinline__ uint32_t code_reg(uint32_t w, uint32_t w8, int pos)
{
    return pos <= 8 ? w & (CODE_MASK << pos) : w8 & (CODE_MASK << (pos - 8));
}

// One 64-token step from its record: S^T = codes^T . (q s_g) (hi and lo halves, as v2) + q . z_g, the
// softmax update, O^T += codes^T . (p s_g) per value group, Z += zeros^T . p. Rows of the QK m-tile i:
// token 16i + g (row g) and 16i + g + 8 (row g + 8), code scale 2^(code_sh(4i) - 24) and
// 2^(code_sh(4i + 2) - 24). Rows of the AV m-tile mv: channel 16 mv + 2g (+1), code scale
// 2^(code_sh(4(mv % 4)) - 24) (+2 in the position).
// PAIR (G <= 4): the hi and lo halves of q s_g share one MMA as its two halves of N = 8 columns:
// column g < 4 is the hi half of head g, column g + 4 the lo half of head g (qm_s holds -q there, 0 in
// columns < 4: b = q s + qm s = hi or lo in two instructions per pair, as before), and the two halves
// of the scores are added across lanes t and t ^ 2 after the k-steps: 32 MMAs fewer per step.
__device__ __forceinline__ uint32_t hfma2u(uint32_t a, uint32_t b, uint32_t c)
{
    __half2 r = __hfma2(*reinterpret_cast<__half2 *>(&a), *reinterpret_cast<__half2 *>(&b), *reinterpret_cast<__half2 *>(&c));
    return *reinterpret_cast<uint32_t *>(&r);
}

template <int D>
__device__ __forceinline__ void q_frags_store_pair(uint2 *qf_s, uint2 *qm_s, const float *q_s, const float *f_s, int G,
                                                   int lane)
{
    const int g = lane >> 2, t = lane & 3, h = g & 3;
    const bool ok = h < G;
    const float f = ok ? f_s[h] : 0.f, fm = g >= 4 ? -f : 0.f;
#pragma unroll
    for (int j = 0; j < D / 16; j++) {
        const float *r = q_s + h * D + 16 * j + 4 * t;
        qf_s[32 * j + lane] = ok ? make_uint2(pack_f16(r[0] * f, r[1] * f), pack_f16(r[2] * f, r[3] * f)) : make_uint2(0u, 0u);
        qm_s[32 * j + lane] = ok ? make_uint2(pack_f16(r[0] * fm, r[1] * fm), pack_f16(r[2] * fm, r[3] * fm)) : make_uint2(0u, 0u);
    }
}

// Warp 0's q (P.q_warp0): lane 0 requests the G rows of the KV head (contiguous, G D bf16) with one bulk
// copy into qraw_s, completing on `bar`, before the block's first barrier, so that q's latency runs
// alongside the prologue's and ahead of the records' queue (no registers held: a load into registers
// was spilled, and the spill waited for q).
__device__ __forceinline__ void q_rows_issue(__nv_bfloat16 *qraw_s, const __nv_bfloat16 *qh, unsigned bytes, uint64_t *bar)
{
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); // warp 0's earlier reads of qraw_s first
    mbar_expect_tx(bar, bytes);
    bulk_copy(qraw_s, qh, bytes, bar);
}

// From warp 0's q (qraw_s, landed): what stage_q (top = 1) and q_frags_store(_pair) write, bit for bit:
// q's rows in fp32 (q_s, for the residual steps), the powers of two f_s and u_s, the fp16 fragments qf_s
// (and qm_s, PAIR). Lane (g, t) takes head h = g & 3 (PAIR) or g at channels 16j + 4t .. + 3, j < D / 16
// (zeros past G). One warp, and no block barrier between q's arrival and the fragments.
template <int D>
__device__ __forceinline__ void q_rows_finish(const __nv_bfloat16 *qraw_s, float *q_s, float *f_s, float *u_s, uint2 *qf_s,
                                              uint2 *qm_s, int G, bool pair, int lane)
{
    const int g = lane >> 2, t = lane & 3, h = pair ? g & 3 : g;
    uint2 qr[D / 16];
#pragma unroll
    for (int j = 0; j < D / 16; j++)
        qr[j] = h < G ? *reinterpret_cast<const uint2 *>(qraw_s + h * D + 16 * j + 4 * t) : make_uint2(0u, 0u);
    float mx = 0.f;
#pragma unroll
    for (int j = 0; j < D / 16; j++)
        mx = fmaxf(fmaxf(mx, fmaxf(fabsf(bf16_lo(qr[j].x)), fabsf(bf16_hi(qr[j].x)))),
                   fmaxf(fabsf(bf16_lo(qr[j].y)), fabsf(bf16_hi(qr[j].y))));
    mx = warp_max<1, 2>(mx); // the 4 lanes t of a row hold its D channels
    const int e = q_scale_exp(mx, 1);  // stage_q's scale at top = 1
    const bool own = h < G && h == g; // the lanes that write head h's row (PAIR: rows g < 4)
    if (own && t == 0) f_s[h] = ldexpf(1.f, e), u_s[h] = ldexpf(1.f, -e);
    const float f = h < G ? ldexpf(1.f, e) : 0.f, fm = pair && g >= 4 ? -f : 0.f;
#pragma unroll
    for (int j = 0; j < D / 16; j++) {
        const float r0 = bf16_lo(qr[j].x), r1 = bf16_hi(qr[j].x), r2 = bf16_lo(qr[j].y), r3 = bf16_hi(qr[j].y);
        if (own) *reinterpret_cast<float4 *>(q_s + h * D + 16 * j + 4 * t) = make_float4(r0, r1, r2, r3);
        qf_s[32 * j + lane] = make_uint2(pack_f16(r0 * f, r1 * f), pack_f16(r2 * f, r3 * f));
        if (pair) qm_s[32 * j + lane] = make_uint2(pack_f16(r0 * fm, r1 * fm), pack_f16(r2 * fm, r3 * fm));
    }
}

// The scores of a step record, S^T fragments s[i]: (token 16i + g, head 2t), (16i + g, 2t + 1),
// (16i + g + 8, 2t), (16i + g + 8, 2t + 1), each the fp32 q . k times uf of its column (PAIR: lanes
// t < 2 hold heads 0..3 and lanes t ^ 2 the same). Tokens at or past T are -inf.
template <int D, int GS, bool PAIR>
__device__ __forceinline__ void step_scores(float (&s)[4][4], const unsigned char *rec, const uint2 *qf_s, const uint2 *qm_s,
                                            const float (&uf)[2], int lane, int64_t tok, int64_t T)
{
    using R = Rec<D, GS>;
    constexpr int MT = D / 16, NGS = R::NGS;
    const int g = lane >> 2, t = lane & 3;

    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
    float bacc[4] = {0.f, 0.f, 0.f, 0.f}; // rows g < NGS: the step's key group g (the others are not read)
    const uint2 *kc = reinterpret_cast<const uint2 *>(rec + R::KC) + lane;
    // Km row r: channel chunk (c/4) at (c/4 + 4r) % (D/4) (the rotation of int2.h)
    const unsigned char *ks = rec + R::KM + 8 * t;
    const unsigned char *kz = rec + R::KM + 2 * D + 4 * D * (g < NGS ? g : 0) + 8 * t;
#pragma unroll
    for (int j = 0; j < MT; j++) {
        const uint2 qj = qf_s[32 * j + lane];
        const uint2 qm = PAIR ? qm_s[32 * j + lane] : make_uint2(0u, 0u);
        const uint2 w = kc[32 * j];
        const uint32_t w8x = w.x >> 8, w8y = w.y >> 8;
        // rows g >= NGS load row 0's zeros (in bounds, no branch): rows of bacc that nothing reads
        const uint2 zk = *reinterpret_cast<const uint2 *>(kz + 32 * ((j + (NGS > 1 ? g : 0)) % MT));
        mma_f16(bacc, zk.x, 0u, zk.y, 0u, qj.x, qj.y);
        uint32_t bh[2], bl[2];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            if (i == 0 || (GS < 64 && (16 * i) % GS == 0)) { // q s_g of this m-tile's group, hi and lo
                const int r = GS >= 64 ? 0 : (16 * i) / GS;
                const uint2 sk = *reinterpret_cast<const uint2 *>(ks + 4 * D * r + 32 * ((j + r) % MT));
                if constexpr (PAIR) { // hi (qm = 0) or lo (qm = -q) of q s, by column
                    bh[0] = hfma2u(qj.x, sk.x, v2::hmul2u(qm.x, sk.x)), bh[1] = hfma2u(qj.y, sk.y, v2::hmul2u(qm.y, sk.y));
                } else {
                    bh[0] = v2::hmul2u(qj.x, sk.x), bh[1] = v2::hmul2u(qj.y, sk.y);
                    bl[0] = v2::hfms2u(qj.x, sk.x, bh[0]), bl[1] = v2::hfms2u(qj.y, sk.y, bh[1]);
                }
            }
            const uint32_t a0 = code_reg(w.x, w8x, 4 * i), a1 = code_reg(w.x, w8x, 4 * i + 2);
            const uint32_t a2 = code_reg(w.y, w8y, 4 * i), a3 = code_reg(w.y, w8y, 4 * i + 2);
            mma_f16(acc[i], a0, a1, a2, a3, bh[0], bh[1]);
            if constexpr (!PAIR) mma_f16(acc[i], a0, a1, a2, a3, bl[0], bl[1]);
        }
    }
    if constexpr (PAIR) // lanes t < 2 hold the hi halves of heads 2t, 2t+1, lanes t ^ 2 their lo halves
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][e] += __shfl_xor_sync(0xffffffffu, acc[i][e], 2);

    // ---- scores (log2 domain) ----
    float bz[NGS][2];
#pragma unroll
    for (int r = 0; r < NGS; r++) {
        bz[r][0] = __shfl_sync(0xffffffffu, bacc[0], 4 * r + t) * uf[0];
        bz[r][1] = __shfl_sync(0xffffffffu, bacc[1], 4 * r + t) * uf[1];
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int r = GS >= 64 ? 0 : (16 * i) / GS;
        const float f0 = exp2f((float)(24 - code_sh(4 * i))), f1 = exp2f((float)(24 - code_sh(4 * i + 2))); // constants
        s[i][0] = fmaf(acc[i][0], f0 * uf[0], bz[r][0]);
        s[i][1] = fmaf(acc[i][1], f0 * uf[1], bz[r][1]);
        s[i][2] = fmaf(acc[i][2], f1 * uf[0], bz[r][0]);
        s[i][3] = fmaf(acc[i][3], f1 * uf[1], bz[r][1]);
    }
    if (tok + 64 > T) // T is a multiple of 16: whole m-tiles are masked
#pragma unroll
        for (int i = 1; i < 4; i++)
            if (tok + 16 * i >= T) s[i][0] = s[i][1] = s[i][2] = s[i][3] = -INFINITY;
}

// O^T += codes^T . (p s_g) per value group and Z += zeros^T . p of a step record, with p as B fragments
// of P^T: pb[i][0] = p of head g at tokens 16i + 2t, + 1 and pb[i][1] at 16i + 8 + 2t, + 1 (fp16). o and z
// in the units of deposit (O^T rows of m-tile mv scaled by 2^(code_sh - 24); Z row 8: the sum of p).
template <int D, int GS>
__device__ __forceinline__ void step_values(float (&o)[D / 16][4], float (&z)[4], const unsigned char *rec,
                                            const uint32_t (&pb)[4][2], int lane)
{
    using R = Rec<D, GS>;
    constexpr int NGV = R::NGV;
    const int g = lane >> 2, t = lane & 3;
    const uint32_t one8 = g == 0 ? 0x3C003C00u : 0u; // A row 8: fp16 1.0 (the sum of p)
    // the MMAs accumulate into the state itself (rescaled by the softmax before this step)
#pragma unroll
    for (int i = 0; i < 4; i++) {
        uint2 zv = make_uint2(0u, 0u);
        if (g < NGV) zv = *reinterpret_cast<const uint2 *>(rec + R::VM + ((2 * i + 1) * NGV + g) * 32 + 8 * t);
        mma_f16(z, zv.x, one8, zv.y, one8, pb[i][0], pb[i][1]);
    }
    const unsigned char *vc = rec + R::VC + lane * (D / 8); // D/32 words per lane and k-step
#pragma unroll
    for (int mh = 0; mh < D / 64; mh++) { // m-tiles 4mh .. 4mh + 3 (channels 64mh ..)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const uint2 w = *reinterpret_cast<const uint2 *>(vc + i * (32 * D / 8) + 8 * mh);
            const uint32_t w8x = w.x >> 8, w8y = w.y >> 8;
            uint32_t pp0 = 0, pp1 = 0;
#pragma unroll
            for (int m = 0; m < 4; m++) {
                const int mv = 4 * mh + m, gv = (16 * mv) / GS;
                if (m == 0 || (16 * mv) % GS == 0) { // p s_g of this m-tile's value group
                    const uint2 sv = *reinterpret_cast<const uint2 *>(rec + R::VM + (2 * i * NGV + gv) * 32 + 8 * t);
                    pp0 = v2::hmul2u(pb[i][0], sv.x), pp1 = v2::hmul2u(pb[i][1], sv.y);
                }
                mma_f16(o[mv], code_reg(w.x, w8x, 4 * m), code_reg(w.x, w8x, 4 * m + 2), code_reg(w.y, w8y, 4 * m),
                        code_reg(w.y, w8y, 4 * m + 2), pp0, pp1);
            }
        }
    }
}

// One 64-token step of the fused decode: scores, the online softmax, values.
template <int D, int GS, bool PAIR>
__device__ __forceinline__ void step(State<D / 16> &st, const unsigned char *rec, const uint2 *qf_s, const uint2 *qm_s,
                                     const float (&uf)[2], int lane, int64_t tok, int64_t T)
{
    float s[4][4];
    step_scores<D, GS, PAIR>(s, rec, qf_s, qm_s, uf, lane, tok, T);
    uint32_t pb[4][2];
    v2::softmax<4, D / 16, true, false>(st, s, pb);
    step_values<D, GS>(st.o, st.z, rec, pb, lane);
}

// The bf16 residual as v2's, with v3's row units: V rows of m-tile mv scaled by 2^(code_sh(4(mv % 4)) - 24)
// and 2^(code_sh(4(mv % 4) + 2) - 24) (exact: powers of two), the O^T units of the quantized tokens.
template <int D>
__device__ __forceinline__ void dense_step(State<D / 16> &st, const uint32_t (&qb)[D / 16][2], const v2::Dense<D> &r,
                                           int nvalid, float scale, int lane)
{
    constexpr int MT = D / 16;
    const int g = lane >> 2;
    float s[1][4] = {{0.f, 0.f, 0.f, 0.f}};
#pragma unroll
    for (int j = 0; j < D / 16; j++)
        mma_bf16(s[0], r.k0[2 * j], r.k8[2 * j], r.k0[2 * j + 1], r.k8[2 * j + 1], qb[j][0], qb[j][1]);
    s[0][0] = g < nvalid ? s[0][0] * scale : -INFINITY;
    s[0][1] = g < nvalid ? s[0][1] * scale : -INFINITY;
    s[0][2] = g + 8 < nvalid ? s[0][2] * scale : -INFINITY;
    s[0][3] = g + 8 < nvalid ? s[0][3] * scale : -INFINITY;
    uint32_t pb[1][2];
    v2::softmax<1, MT, false, true>(st, s, pb);
#pragma unroll
    for (int mv = 0; mv < MT; mv++) {
        const __nv_bfloat162 f0 = __float2bfloat162_rn(exp2f((float)(code_sh(4 * (mv % 4)) - 24)));
        const __nv_bfloat162 f1 = __float2bfloat162_rn(exp2f((float)(code_sh(4 * (mv % 4) + 2) - 24)));
        const uint32_t a0 = bits_of(__hmul2(bf2_of(__byte_perm(r.v[0][mv], r.v[1][mv], 0x5410)), f0));
        const uint32_t a1 = bits_of(__hmul2(bf2_of(__byte_perm(r.v[0][mv], r.v[1][mv], 0x7632)), f1));
        const uint32_t a2 = bits_of(__hmul2(bf2_of(__byte_perm(r.v[2][mv], r.v[3][mv], 0x5410)), f0));
        const uint32_t a3 = bits_of(__hmul2(bf2_of(__byte_perm(r.v[2][mv], r.v[3][mv], 0x7632)), f1));
        mma_bf16(st.o[mv], a0, a1, a2, a3, pb[0][0], pb[0][1]);
    }
}

// The NW warps of the block take the residual steps s0, s0 + 1, ... in turn.
template <int D, int NW>
__device__ __noinline__ State<D / 16> residual_steps(const float *q_s, int G, const __nv_bfloat16 *Kr,
                                                     const __nv_bfloat16 *Vr, int64_t s0, int64_t r_end, int R,
                                                     float scale, int warp, int lane)
{
    State<D / 16> st;
    st.init();
    uint32_t qb[D / 16][2];
    q_frags_bf16<D>(qb, q_s, G, lane);
    for (int64_t s = s0 + warp; s < r_end; s += NW) {
        v2::Dense<D> r;
        const int nv = (int)min((int64_t)16, R - s * 16);
        v2::dense_load_v2<D>(r, Kr, Vr, s * 16, nv, lane);
        dense_step<D>(st, qb, r, nv, scale, lane);
    }
    return st;
}

// Every warp deposits its state: O^T rows back to channels and true units, plus Z (as v2, v3's units).
template <int D, int GS, int NW>
__device__ __forceinline__ void deposit(MergeSmem<D, NW> &ms, const State<D / 16> &st, int warp, int lane)
{
    const int g = lane >> 2, t = lane & 3;
    float l0 = st.l[0] + (g == 0 ? st.z[2] : 0.f), l1 = st.l[1] + (g == 0 ? st.z[3] : 0.f);
    warp_sum<4, 16>(l0, l1);
    if (g == 0) {
        ms.m[warp][2 * t] = st.m[0], ms.m[warp][2 * t + 1] = st.m[1];
        ms.l[warp][2 * t] = l0, ms.l[warp][2 * t + 1] = l1;
    }
    // the zeros' term of channel c is Z of its value group c / GS, held by lane 4 (c / GS) + t: the same
    // group for a whole m-tile (GS >= 16), so two shuffles per m-tile instead of a loop over a group's
    // channels in lanes g < D / GS (GS iterations of two shared-memory updates: ~2.6 us at gs=128 in the
    // trace, results/h100/s14-int2-12warps)
#pragma unroll
    for (int mv = 0; mv < D / 16; mv++) {
        const int c = 16 * mv + 2 * g, gv = (16 * mv) / GS;
        const float z0 = __shfl_sync(0xffffffffu, st.z[0], 4 * gv + t), z1 = __shfl_sync(0xffffffffu, st.z[1], 4 * gv + t);
        const float r0 = exp2f((float)(24 - code_sh(4 * (mv % 4)))), r1 = exp2f((float)(24 - code_sh(4 * (mv % 4) + 2)));
        ms.o[warp][2 * t][c] = st.o[mv][0] * r0 + z0; // r0, r1: powers of two, the product exact
        ms.o[warp][2 * t + 1][c] = st.o[mv][1] * r0 + z1;
        ms.o[warp][2 * t][c + 1] = st.o[mv][2] * r1 + z0;
        ms.o[warp][2 * t + 1][c + 1] = st.o[mv][3] * r1 + z1;
    }
}

// One block of NW = 12 warps per SM (168 registers each). Its warps take the segment's 64-token steps
// from a shared counter as they go, so that they finish together: with 3 blocks of 4 warps, each warp
// with a fixed share, an SM's blocks ended up to ~12 us apart at 32K (results/h100/s12-int2-rw-87684ff,
// trace), the SM running on 8 or 4 warps meanwhile. (4 blocks of 4 warps per SM need 128 registers:
// 120 bytes of spills at D=128.)
constexpr int NW = 12, NT = 32 * NW;

// Stages per warp: as many records as fit in 192 KB, 2 to 4: 1-3 steps (8-24 KB at gs=16... 5 KB at
// gs=128) in flight per warp.
template <int D, int GS>
__host__ __device__ constexpr int stages()
{
    return 196608 / (NW * Rec<D, GS>::BYTES) >= 4 ? 4 : 196608 / (NW * Rec<D, GS>::BYTES) >= 2 ? 196608 / (NW * Rec<D, GS>::BYTES) : 2;
}

// The rings; once drained, the merge buffer and then the block's partial (cluster_merge).
template <int D, int GS>
__host__ __device__ constexpr size_t ring_bytes()
{
    const size_t ring = (size_t)stages<D, GS>() * NW * Rec<D, GS>::BYTES;
    const size_t merge = sizeof(MergeSmem<D, NW>) + sizeof(float) * 8 * MAXG * (D + 2); // + cluster_merge's 8 slots
    return ring > merge ? ring : merge;
}

template <int D>
__device__ __noinline__ void finish(const MergeSmem<D, NW> &ms, int G, int64_t head, int64_t first, int64_t last, int64_t k,
                                    float *parts, int *counters, __nv_bfloat16 *out, float *w_s, int *flag_s, int tid)
{
    finish_head<D, NW>(ms, G, head, first, last, k, parts, counters, out, w_s, flag_s, tid);
}

template <int D, int GS>
__host__ __device__ constexpr size_t smem_bytes()
{
    return ring_bytes<D, GS>() + sizeof(float) * (MAXG * D + 64 * MAXG + 2 * MAXG) + sizeof(__nv_bfloat16) * MAXG * D;
}

// TRACE (KVB_INT2_V3_TRACE=1, a diagnostic build of the same kernel): thread 0 of each block prints its
// segment, warp 0's count of steps, when the segment starts and ends (globaltimer, ns), and the SM
// clocks from the start to 20 points of the prologue, warp 0's first steps, the end of the steps and
// the merge (tr[i]; profiles/int2_v3_trace.py names them and prints their medians).
__device__ __forceinline__ uint64_t global_ns()
{
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// The merge of a head whose C blocks form one cluster (C <= 8, rank = the block's rank): each block
// combines its warps into its partial (O [G][D], m [G], l [G], as finish_head's slots) and stores it in
// slot `rank` of the merger's shared memory (parts_s: C slots; distributed shared memory, stores only,
// so that no block waits on a remote load); after the cluster barrier the merger (the last rank, or rank
// 0) merges the C slots, in rank order, into the output rows. No global round trip: under the kernel's
// own stream of reads, a partial's write, the arrival fence and the merger's reads each waited in the
// memory queue. Where the slots alias the merger's rings, every block arrived on the cluster barrier
// (cluster_arrive) once its rings were drained; where they lie past them (P.slots_apart), every block
// arrived at its start, and one that is done writes its partial while the merger still runs.
__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory"); }
// (the start's arrival, P.slots_apart: it orders nothing, it only tells the others that this block runs)
__device__ __forceinline__ void cluster_arrive_relaxed() { asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }
// CPT: channels per thread in the combine and the merge (2: two adjacent channels, 8-byte accesses, so
// that G D / 2 items take one pass of the block's NT threads at G <= 4).
template <int D, int CPT>
__device__ __forceinline__ void cluster_merge(const MergeSmem<D, NW> &ms, float *parts_s, int G, __nv_bfloat16 *out, int tid,
                                              bool merge_last, bool waited, bool relaxed_merger, long long *tr = nullptr)
{
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    const int C = (int)cluster.num_blocks(), stride = G * (D + 2);
    // the merging rank: the last (merge_last), whose steps end last (rank 0 holds the head's residual
    // steps, weighted so that it ends first), so that its own partial stays local and the others' arrive
    // while it still runs; or rank 0
    const int merger = merge_last ? C - 1 : 0;
    if (!waited) cluster_wait(); // every block's rings are drained (or, P.wait_early: waited at the start)
    if (tr && tid == 0) tr[17] = clock64();
    const int rank = (int)cluster.block_rank();
    const bool me = rank == merger;
    // (relaxed_merger: the merger's own slot through its own window, so that a block barrier orders it)
    block_combine<D, NW, CPT>(ms, G, (relaxed_merger && me ? parts_s : cluster.map_shared_rank(parts_s, merger)) + rank * stride,
                              nullptr, tid);
    if (tr && tid == 0) tr[18] = clock64();
    // every slot is written (release / acquire at cluster scope); no block touches another's shared memory
    // after it, so the others may exit. relaxed_merger: the merger has nothing to publish, so it arrives
    // relaxed after a block barrier, without the release's GPU-scope MEMBAR (the 8K gs=128 trace: 0.10 us
    // from "combined" to past the wait, against 0.48; results/h100/s19-int2-grid/r8)
    if (relaxed_merger && me) {
        __syncthreads();
        cluster_arrive_relaxed();
    } else {
        cluster_arrive();
    }
    cluster_wait();
    if (!me) return;
    if (tr && tid == 0) tr[19] = clock64();
    for (int i = tid; i < G * D / CPT; i += NT) {
        const int idx = i * CPT, h = idx / D;
        float M = -INFINITY;
        for (int r = 0; r < C; r++) M = fmaxf(M, parts_s[r * stride + G * D + h]);
        const float base = M == -INFINITY ? 0.f : M;
        float O0 = 0.f, O1 = 0.f, L = 0.f;
        for (int r = 0; r < C; r++) {
            const float a = ex2(parts_s[r * stride + G * D + h] - base);
            if constexpr (CPT == 2) {
                const float2 v = *reinterpret_cast<const float2 *>(parts_s + r * stride + idx); // stride, idx even
                O0 += a * v.x, O1 += a * v.y;
            } else {
                O0 += a * parts_s[r * stride + idx];
            }
            L += a * parts_s[r * stride + G * D + G + h];
        }
        if constexpr (CPT == 2)
            *reinterpret_cast<__nv_bfloat162 *>(out + idx) = __floats2bfloat162_rn(O0 / L, O1 / L); // rows of D (even)
        else
            out[idx] = __float2bfloat16_rn(O0 / L);
    }
}

template <int D, int GS, bool TRACE = false>
__global__ void __launch_bounds__(NT, 1) attn_kernel(Params P)
{
    constexpr int MT = D / 16, S = stages<D, GS>(), BYTES = Rec<D, GS>::BYTES;
    // the trace's clocks in shared memory: a local array would add spills (and their latency) to the
    // prologue it measures
    // (tr[29]: the globaltimer at the start; in shared memory too, not a register held through the kernel)
    __shared__ long long tr[TRACE ? 30 : 1];
    if (TRACE && threadIdx.x == 0) {
        for (int i = 1; i < 29; i++) tr[i] = 0;
        tr[29] = (long long)global_ns(), tr[0] = clock64();
    }
    const AttnParams &p = P.a;
    extern __shared__ __align__(128) unsigned char smem[];
    MergeSmem<D, NW> &ms = *reinterpret_cast<MergeSmem<D, NW> *>(smem); // aliases the rings once drained
    float *q_s = reinterpret_cast<float *>(smem + ring_bytes<D, GS>());
    float *w_s = q_s + MAXG * D, *f_s = w_s + 64 * MAXG, *u_s = f_s + MAXG;
    __nv_bfloat16 *qraw_s = reinterpret_cast<__nv_bfloat16 *>(u_s + MAXG); // q as loaded (P.q_warp0)
    __shared__ int flag_s;
    __shared__ int next_s;             // the segment's next unclaimed 64-token step
    __shared__ __align__(8) uint64_t qbar; // qraw_s's bulk copy (P.q_warp0), one phase a segment
    __shared__ int slot_step_s[NW][S]; // the step a ring slot holds (-1: none; the segment's steps ran out)
    __shared__ __align__(8) uint64_t bars[NW * S];

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, t = lane & 3;
    const int G = p.G;
    unsigned char *ring = smem + (size_t)warp * S * BYTES;
    uint64_t *bar = bars + warp * S;
    if (lane == 0)
        for (int s = 0; s < S; s++) mbar_init(bar + s, 1);
    if (tid == 0) mbar_init(&qbar, 1);
    mbar_init_fence();
    __syncwarp();
    // P.slots_apart: the cluster barrier's first phase at the start. The merger's partial slots lie apart
    // from its rings, so the other blocks need not wait for its rings to drain, only for it to have
    // started (distributed shared memory's rule); they write their partials as soon as they are done.
    if (P.cluster > 1 && P.slots_apart) cluster_arrive_relaxed();
    const bool wait_early = P.cluster > 1 && P.slots_apart && P.wait_early;
    if (TRACE && tid == 0) tr[13] = clock64();
    // this warp's ring, as shared addresses: the slot of the next record to issue, the slot and phase
    // parity of the next to use (every lane keeps them; the ring carries over from segment to segment)
    const uint32_t ring_a = smem_u32(ring), bar_a = smem_u32(bar);
    int issue_slot = 0, use_slot = 0;
    uint32_t use_phase = 0, q_phase = 0;
    auto next_slot = [](int slot) { return slot + 1 == S ? 0 : slot + 1; };

    // A head's line: its residual steps, P.rw units each (one costs a block several 64-token steps'
    // time: its loads are not pipelined), then its nq 64-token steps, one unit each.
    // (a head's line is below 2^31 units: decode_attn_launch bounds T; the heads, B Hkv, are ints)
    const int W = P.rw, nrw = p.nr * W, per_head = nrw + (int)p.nq;
    const int64_t N = p.heads * per_head, grid = gridDim.x, kb = blockIdx.x;
    // clusters (P.cluster = C > 1): one segment a block, the head kb / C's units [r per_head / C,
    // (r + 1) per_head / C) for rank r = kb % C, as part_begin's split; in 32 bits (the host keeps C
    // per_head below 2^31), so the start runs no 64-bit division: its subroutine lies apart from the
    // kernel's code, a cold fetch of its own after the bench's L2 flush, before the first request
    const int C = P.cluster > 1 ? P.cluster : 1;
    const int chead = (int)blockIdx.x / C, crank = (int)blockIdx.x - chead * C;
    int64_t u, u1;
    if (C > 1) {
        u = (int64_t)chead * per_head + crank * per_head / C;
        u1 = (int64_t)chead * per_head + (crank + 1) * per_head / C;
    } else {
        u = part_begin(kb, N, grid), u1 = part_begin(kb + 1, N, grid);
    }
    // P.instant (clusters): q and the first fill requested first thing, with no more arithmetic than their
    // addresses take (the loop's first segment then skips them), each warp's k-th record step
    // qa + k NW + warp (what the shared counter would hand out, in another order; it then starts past them)
    // records a warp requests before its first step: P.fill0, or 1 where the segment [qa, qe) is at most 8
    // steps a warp (T = 8K at B = 8), else S - 1; at most S - 1
    auto fill_count = [&](int qa, int qe) { return min(S - 1, P.fill0 > 0 ? P.fill0 : qe - qa <= 8 * NW ? 1 : S - 1); };
    int fill_first = 0; // records a warp requested here
    if (P.instant && C > 1) {
        const int qa = max(crank * per_head / C, nrw) - nrw, qe = (crank + 1) * per_head / C - nrw;
        if (qa < qe) {
            fill_first = fill_count(qa, qe);
            if (P.q_warp0 && tid == 0) q_rows_issue(qraw_s, p.q + (int64_t)chead * G * D, (unsigned)(G * D * 2), &qbar);
            if (lane == 0)
                for (int k = 0; k < fill_first; k++) {
                    const int got = qa + k * NW + warp;
                    slot_step_s[warp][k] = got < qe ? got : -1;
                    if (got < qe) issue_step<D, GS>(ring_a + k * BYTES, bar_a + k * 8, RecSrc<D, GS>(P.n, chead, got, p.Tcap));
                }
            issue_slot = fill_first; // < S
        }
    }
    if (TRACE && tid == 0) tr[14] = clock64();
    while (u < u1) {
        // (clusters: the head again, not held through the steps of the segment before: registers)
        const int64_t head = C > 1 ? (int64_t)(blockIdx.x / (unsigned)P.cluster) : u / per_head, hoff = head * per_head;
        const int s0 = (int)(u - hoff), s1 = (int)(min(u1, hoff + per_head) - hoff);
        const int b = (int)head / p.Hkv, kvh = (int)head - b * p.Hkv;
        // the segment's 64-token steps [qa, qe), claimed one at a time by the warps (lane 0 claims the
        // step, records it for the slot and issues its copy)
        const int qa = max(s0, nrw) - nrw, qe = s1 - nrw;
        if (TRACE && tid == 0) tr[15] = clock64();
        const __nv_bfloat16 *qh = p.q + ((int64_t)b * p.Hq + (int64_t)kvh * G) * D;
        const bool pair = G <= 4; // the PAIR step
        const bool instant = fill_first > 0; // the first segment: q and the first fill requested above
        if (P.q_warp0 && tid == 0 && !instant) q_rows_issue(qraw_s, qh, (unsigned)(G * D * 2), &qbar);
        const int fill_n = instant ? fill_first : fill_count(qa, qe);
        fill_first = 0;
        if (tid == 0) next_s = qa + (instant ? fill_n * NW : 0); // nobody claims before the barrier: the
                                                                // previous segment is done
        __syncthreads(); // the previous segment is done with shared memory
        if (TRACE && tid == 0) tr[12] = clock64();
        bool tr_claim = false; // (the trace: tid 0's second claim in the step loop, timed in parts)
        auto claim = [&]() {
            if (lane == 0) {
                const int got = qa < qe ? atomicAdd(&next_s, 1) : qe;
                slot_step_s[warp][issue_slot] = got < qe ? got : -1;
                if (TRACE && tr_claim) tr[25] = clock64();
                if (got < qe)
                    issue_step<D, GS>(ring_a + issue_slot * BYTES, bar_a + issue_slot * 8, RecSrc<D, GS>(P.n, head, got, p.Tcap),
                                      TRACE && tr_claim ? &tr[26] : nullptr);
            }
            issue_slot = next_slot(issue_slot);
        };
        // the first fill requests fill0 records per warp (0: one where the segment is at most 8 steps a
        // warp, else S - 1); the rest follow once q is staged, before the first step
        int ramp = instant ? S - 1 - fill_n : 0;
        bool filled = instant;
        auto fill = [&]() {
            if (filled) return;
#pragma unroll 1 // a cold start fetches every byte of code it runs: the loop, not 4 copies of it
            for (int k = 0; k < fill_n; k++) claim();
            ramp = S - 1 - fill_n, filled = true;
        };
        // early: the first records' latency overlaps q's staging and the residual steps' loads instead
        // of following them (a segment is only ~5 steps per warp at T = 8K)
        if (TRACE && tid == 0 && tr[5] != 0) tr[29] = (long long)global_ns(), tr[0] = clock64(); // a later segment
        // q's lines requested ahead of the records: its loads then wait for q alone, not behind the
        // records' queue
        if (!P.q_warp0 && P.q_prefetch && tid < (G * D * 2 + 127) / 128) prefetch_l2(qh + tid * 64);
        if (P.early) fill();
        if (TRACE && tid == 0) tr[6] = clock64();
        uint2 *qf_s = reinterpret_cast<uint2 *>(w_s); // w_s is free until the merge
        // PAIR (G <= 4): -q of the lo columns in q_s's rows 4..7 (unused: q_s holds G rows)
        uint2 *qm_s = reinterpret_cast<uint2 *>(q_s + 4 * D);
        const bool frags_late = P.frags_late && !P.q_warp0;
        if (P.q_warp0) {
            // warp 0 turns q into the fragments while the others request the rest of their first fill;
            // then one block barrier (the residual steps read q_s, the quantized steps qf_s, qm_s and
            // u_s). (With warp 0 arriving on a named barrier without waiting, compute-sanitizer's
            // racecheck reported hazards between the merge's accesses: results/h100/s16-int2-q/.)
            if (warp == 0) {
                mbar_wait(&qbar, q_phase);
                q_rows_finish<D>(qraw_s, q_s, f_s, u_s, qf_s, qm_s, G, pair, lane);
                if (TRACE && tid == 0) tr[7] = tr[16] = clock64();
            } else if (qa < qe) {
                if (TRACE && tid == 32) tr[21] = clock64();
#pragma unroll 1
                for (int k = 0; k < ramp; k++) claim();
                ramp = 0;
                if (TRACE && tid == 32) tr[22] = clock64();
            }
            __syncthreads();
            if (TRACE && tid == 32) tr[23] = clock64();
        } else {
            stage_q<NT>(q_s, f_s, u_s, qh, G, D, tid, 1);
        }
        // the quantized steps' q fragments, before the residual steps: the warps without residual steps
        // then start on the quantized ones at once instead of waiting at a block barrier behind them
        auto store_frags = [&]() {
            if (qa < qe) { // block-uniform
                if (warp == 0) {
                    if (pair) q_frags_store_pair<D>(qf_s, qm_s, q_s, f_s, G, lane);
                    else v2::q_frags_store<D>(qf_s, q_s, f_s, G, lane);
                    if (TRACE && tid == 0) tr[16] = clock64();
                }
                __syncthreads();
            }
        };
        if (!P.q_warp0) {
            if (TRACE && tid == 0) tr[7] = clock64();
            if (!frags_late) store_frags();
        }
        // residual step r belongs to the segment holding its first unit r W
        const int r_beg = (s0 + W - 1) / W, r_end = min((s1 + W - 1) / W, (int)p.nr);
        if (!P.early && !frags_late && qa < qe) fill(); // q staged: the records' requests follow it
        if (TRACE && tid == 0) tr[1] = clock64();
        // P.wait_early: the first phase (every block arrived at its start) waited here, where a block
        // waits for its first records anyway, instead of at the merge: its acquire (the SM's L1
        // invalidation, CCTL.IVALL) then lies off the end of the kernel. Every thread passes here once (a
        // cluster block has one segment).
        if (wait_early) {
            __syncwarp();
            cluster_wait();
        }
        State<MT> st;
        st.init();
        if (r_beg < r_end)
            st = residual_steps<D, NW>(q_s, G, p.c.Kr + head * p.Rcap * D, p.c.Vr + head * p.Rcap * D, r_beg, r_end, p.R,
                                       p.scale, warp, lane);
        if (frags_late) store_frags();
        int steps = 0; // this warp's 64-token steps in the segment (the trace)
        if (qa < qe) { // block-uniform
            const float uf[2] = {2 * t < G ? p.scale * u_s[2 * t] : 0.f, 2 * t + 1 < G ? p.scale * u_s[2 * t + 1] : 0.f};
            if (!P.early && frags_late) fill();
            // the rest of a short first fill, now that q is staged: the ring's S - 1 ahead before the
            // first step (not in the step loop: its code stays as it was)
#pragma unroll 1
            for (; ramp > 0; ramp--) claim();
            __syncwarp(); // lane 0's slot_step_s entries
            for (;; steps++) {
                const int cur = slot_step_s[warp][use_slot];
                if (cur < 0) break; // and every later claim of the segment came back empty
                if (TRACE && tid == 0 && steps == 1) tr[24] = clock64(), tr_claim = true;
                claim();             // into the slot the previous step freed
                if (TRACE && tid == 0 && steps == 1) tr[27] = clock64(), tr_claim = false;
                unsigned char *rec = ring + use_slot * BYTES;
                mbar_wait(bar_a + use_slot * 8, use_phase);
                if (TRACE && tid == 0 && steps < 3) tr[steps == 0 ? 2 : 7 + steps] = clock64();
                if (TRACE && tid == 32 && steps == 0) tr[28] = clock64();
                const int64_t tok = (int64_t)cur * 64;
                if (tok + 64 > p.T) { // value scales and zeros past T may be anything (NaN), and 0 * NaN is NaN
                    constexpr int BLKW = Rec<D, GS>::NGV * 16;   // words of one 16-token block's scales and zeros
                    uint32_t *vm = reinterpret_cast<uint32_t *>(rec + Rec<D, GS>::VM);
                    for (int o = lane; o < 4 * BLKW; o += 32)
                        if (tok + 16 * (o / BLKW) >= p.T) vm[o] = 0u;
                    __syncwarp();
                }
                if (pair) step<D, GS, true>(st, rec, qf_s, qm_s, uf, lane, tok, p.T);
                else step<D, GS, false>(st, rec, qf_s, qm_s, uf, lane, tok, p.T);
                __syncwarp(); // every lane is done with the record before it is refilled
                use_slot = next_slot(use_slot), use_phase ^= use_slot == 0;
            }
            // the slots from use_slot on were claimed empty and never issued: the next segment fills
            // them in order
            issue_slot = use_slot;
            if (TRACE && tid == 0) tr[3] = clock64();
        }
        __syncthreads(); // the merge buffer aliases the rings
        if (P.cluster > 1 && !P.slots_apart) cluster_arrive(); // this block's rings may now take the cluster's partials
        if (TRACE && tid == 0) tr[4] = clock64();
        deposit<D, GS, NW>(ms, st, warp, lane);
        __syncthreads();
        if (TRACE && tid == 0) tr[11] = clock64();
        if (P.cluster > 1) { // one segment per block, the head's blocks one cluster
            float *parts_s = reinterpret_cast<float *>(smem + (P.slots_apart ? smem_bytes<D, GS>() : sizeof(MergeSmem<D, NW>)));
            __nv_bfloat16 *out = p.o + ((int64_t)b * p.Hq + (int64_t)kvh * G) * D;
            if (P.pairs)
                cluster_merge<D, 2>(ms, parts_s, G, out, tid, P.merge_last, wait_early, P.relaxed_merger, TRACE ? tr : nullptr);
            else
                cluster_merge<D, 1>(ms, parts_s, G, out, tid, P.merge_last, wait_early, P.relaxed_merger, TRACE ? tr : nullptr);
        } else {
            const int64_t first = block_of(hoff, N, grid), last = block_of(hoff + per_head - 1, N, grid);
            finish<D>(ms, G, head, first, last, kb, p.parts, p.counters, p.o + ((int64_t)b * p.Hq + (int64_t)kvh * G) * D, w_s,
                      &flag_s, tid);
        }
        if (TRACE && tid == 0) {
            unsigned smid;
            asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
            tr[5] = clock64();
            // TR3 kb smid head s0 s1 steps g0 gend, then tr[1..20] - tr[0] (-1: not reached); one printf,
            // so that the blocks' lines do not interleave
            auto d = [&](int i) { return tr[i] ? tr[i] - tr[0] : -1LL; };
            printf("TR3 %d %u %lld %lld %lld %d %llu %llu "
                   "%lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld\n",
                   (int)kb, smid, (long long)head, (long long)s0, (long long)s1, steps, (unsigned long long)tr[29],
                   (unsigned long long)global_ns(), d(1), d(2), d(3), d(4), d(5), d(6), d(7), d(8), d(9), d(10), d(11),
                   d(12), d(13), d(14), d(15), d(16), d(17), d(18), d(19), d(20));
            // TR3X kb, then tr[21..28] - tr[0]: warp 1's ramp (before, after, past q's wait), warp 0's
            // second claim in the step loop (before, after the counter, after the expected bytes, after
            // the copies), warp 1's first step
            printf("TR3X %d %lld %lld %lld %lld %lld %lld %lld %lld\n", (int)kb, d(21), d(22), d(23), d(24), d(25), d(26),
                   d(27), d(28));
        }
        // a cluster block's one segment: exit here, without reloading the loop's state (spilled) to find
        // that no segment follows
        if (C > 1) return;
        q_phase ^= 1u;
        u = hoff + s1;
    }
}

// ---- int2_qk and int2_av over the native layout: a warp per 64-token step record ----
// The scores and the value sums of v3's step (step_scores, step_values) without the softmax: q . k with
// no 1/sqrt(D), and p . dequant(V) for p given in fp32.

// Lane 0: the value part of step `step`'s record (value codes, value scales and zeros) into `rec`.
template <int D, int GS>
__device__ __forceinline__ void issue_values(unsigned char *rec, uint64_t *bar, const NativePtrs &n, int64_t head,
                                             int64_t step, int64_t Tcap)
{
    using R = Rec<D, GS>;
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    mbar_expect_tx(bar, R::REC - R::VC);
    bulk_copy(rec + R::VC, n.Rec + (head * (Tcap / 64) + step) * (R::REC / 4) + R::VC / 4, R::REC - R::VC, bar);
}

// Lane 0: the key part of step `step`'s record (key codes, the key-metadata rows) into `rec`.
template <int D, int GS>
__device__ __forceinline__ void issue_keys(unsigned char *rec, uint64_t *bar, const NativePtrs &n, int64_t head,
                                           int64_t step, int64_t Tcap)
{
    using R = Rec<D, GS>;
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    mbar_expect_tx(bar, R::VC + R::KMB);
    bulk_copy(rec, n.Rec + (head * (Tcap / 64) + step) * (R::REC / 4), R::VC, bar);
    bulk_copy(rec + R::KM, n.Km + (head * (Tcap / GS) + (step * 64) / GS) * (2 * D), R::KMB, bar);
}

// Value scales and zeros of the record's 16-token blocks at or past T set to 0: past T they may be
// anything (NaN), and 0 * NaN is NaN.
template <int D, int GS>
__device__ __forceinline__ void zero_value_meta_past(unsigned char *rec, int64_t tok, int64_t T, int lane)
{
    constexpr int BLKW = Rec<D, GS>::NGV * 16; // words of one 16-token block's scales and zeros
    uint32_t *vm = reinterpret_cast<uint32_t *>(rec + Rec<D, GS>::VM);
    for (int o = lane; o < 4 * BLKW; o += 32)
        if (tok + 16 * (o / BLKW) >= T) vm[o] = 0u;
    __syncwarp();
}

struct QKNativeParams {
    const __nv_bfloat16 *q;
    NativePtrs n;
    float *scores;
    int Hkv, Hq, G;
    int64_t Tcap, T, head0; // head0: the launch's first head (kvb_grid.h)
};

template <int D>
constexpr size_t qk_native_smem_bytes(size_t rec_bytes)
{
    return WARPS * rec_bytes + sizeof(float) * (MAXG * D + 2 * MAXG) + 2 * sizeof(uint2) * (D / 16) * 32;
}

// Block (group of 4 steps, head): each warp one step, the key part of its record by one bulk copy pair.
template <int D, int GS>
__global__ void __launch_bounds__(THREADS) qk_native_kernel(QKNativeParams p)
{
    using R = Rec<D, GS>;
    extern __shared__ __align__(128) unsigned char smem[];
    __shared__ __align__(8) uint64_t bars[WARPS];
    float *q_s = reinterpret_cast<float *>(smem + WARPS * R::BYTES), *f_s = q_s + MAXG * D, *u_s = f_s + MAXG;
    uint2 *qf_s = reinterpret_cast<uint2 *>(u_s + MAXG), *qm_s = qf_s + (D / 16) * 32;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int64_t head = p.head0 + blockIdx.y, b = head / p.Hkv;
    const int kvh = (int)(head % p.Hkv), G = p.G;
    const int64_t step = (int64_t)blockIdx.x * WARPS + warp, tok = step * 64;
    unsigned char *rec = smem + warp * R::BYTES;
    const bool live = tok < p.T; // warp-uniform
    if (lane == 0) mbar_init(bars + warp, 1);
    mbar_init_fence();
    __syncwarp();
    if (live && lane == 0) issue_keys<D, GS>(rec, bars + warp, p.n, head, step, p.Tcap);
    stage_q(q_s, f_s, u_s, p.q + (b * p.Hq + (int64_t)kvh * G) * D, G, D, tid, 1); // while the record lands
    const bool pair = G <= 4;
    if (warp == 0) {
        if (pair) q_frags_store_pair<D>(qf_s, qm_s, q_s, f_s, G, lane);
        else v2::q_frags_store<D>(qf_s, q_s, f_s, G, lane);
    }
    __syncthreads();
    if (!live) return;
    mbar_wait(bars + warp, 0);
    const float uf[2] = {2 * t < G ? u_s[2 * t] : 0.f, 2 * t + 1 < G ? u_s[2 * t + 1] : 0.f}; // q's scale undone
    float s[4][4];
    if (pair) step_scores<D, GS, true>(s, rec, qf_s, qm_s, uf, lane, tok, p.T);
    else step_scores<D, GS, false>(s, rec, qf_s, qm_s, uf, lane, tok, p.T);
#pragma unroll
    for (int c = 0; c < 2; c++) {
        const int hc = 2 * t + c; // PAIR: lanes t >= 2 repeat lanes t - 2 and have hc >= 4 >= G
        if (hc >= G) continue;
        float *row = p.scores + (b * p.Hq + (int64_t)kvh * G + hc) * p.T + tok;
#pragma unroll
        for (int i = 0; i < 4; i++)
            if (tok + 16 * i < p.T) { // T is a multiple of 16
                row[16 * i + g] = s[i][c];
                row[16 * i + g + 8] = s[i][c + 2];
            }
    }
}

struct AVNativeParams {
    const float *p;
    NativePtrs n;
    float *out;
    int Hkv, Hq, G, nsplit;
    int64_t Tcap, T, nsteps;
    int *counters;
    float *parts;
    int64_t head0;
};

constexpr int AV_STAGES = 2; // records per warp: the next in flight while one is used

template <int D, int GS>
constexpr size_t av_native_smem_bytes()
{
    const size_t ring = (size_t)WARPS * AV_STAGES * Rec<D, GS>::BYTES;
    return ring > sizeof(MergeSmem<D>) ? ring : sizeof(MergeSmem<D>);
}

// Blocks (split, head) over whole steps; per step p of head g enters fp16 scaled by 2^e (e per head,
// only ever lowered), so that max p 2^e < 2 and p 2^e s_g cannot overflow fp16 (s_g <= 2 INT2_MAX_ABS /
// 3 = 21846), the O^T columns rescaled exactly when e drops. The splits are summed in split order by
// the last block.
template <int D, int GS>
__global__ void __launch_bounds__(THREADS) av_native_kernel(AVNativeParams p)
{
    using R = Rec<D, GS>;
    constexpr int MT = D / 16;
    extern __shared__ __align__(128) unsigned char smem[];
    MergeSmem<D> &ms = *reinterpret_cast<MergeSmem<D> *>(smem); // aliases the rings at the end
    __shared__ __align__(8) uint64_t bars[WARPS * AV_STAGES];
    __shared__ int flag_s;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int64_t split = blockIdx.x, head = p.head0 + blockIdx.y, b = head / p.Hkv;
    const int kvh = (int)(head % p.Hkv), G = p.G;
    const int64_t s_a = split * p.nsteps / p.nsplit, s_b = (split + 1) * p.nsteps / p.nsplit;
    unsigned char *ring = smem + (size_t)warp * AV_STAGES * R::BYTES;
    uint64_t *bar = bars + warp * AV_STAGES;
    if (lane == 0)
        for (int k = 0; k < AV_STAGES; k++) mbar_init(bar + k, 1);
    mbar_init_fence();
    __syncwarp();
    const int mine = s_a + warp < s_b ? (int)((s_b - 1 - s_a - warp) / WARPS + 1) : 0;
    if (mine > 0 && lane == 0) issue_values<D, GS>(ring, bar, p.n, head, s_a + warp, p.Tcap);
    const float *prow = p.p + (b * p.Hq + (int64_t)kvh * G + (g < G ? g : 0)) * p.T; // head g: the B column
    float o[MT][4], z[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int m = 0; m < MT; m++) o[m][0] = o[m][1] = o[m][2] = o[m][3] = 0.f;
    int e_run = 127;
    for (int k = 0; k < mine; k++) {
        if (k + 1 < mine && lane == 0)
            issue_values<D, GS>(ring + ((k + 1) % AV_STAGES) * R::BYTES, bar + (k + 1) % AV_STAGES, p.n, head,
                                s_a + warp + (int64_t)(k + 1) * WARPS, p.Tcap);
        unsigned char *rec = ring + (k % AV_STAGES) * R::BYTES;
        mbar_wait(bar + k % AV_STAGES, (k / AV_STAGES) & 1);
        const int64_t tok = (s_a + warp + (int64_t)k * WARPS) * 64;
        if (tok + 64 > p.T) zero_value_meta_past<D, GS>(rec, tok, p.T, lane);
        float pv[4][4]; // head g at tokens 16i + 2t, + 1 and 16i + 8 + 2t, + 1 (T a multiple of 16)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const bool ok = g < G && tok + 16 * i < p.T;
            const float2 lo = ok ? *reinterpret_cast<const float2 *>(prow + tok + 16 * i + 2 * t) : make_float2(0.f, 0.f);
            const float2 hi = ok ? *reinterpret_cast<const float2 *>(prow + tok + 16 * i + 8 + 2 * t) : make_float2(0.f, 0.f);
            pv[i][0] = lo.x, pv[i][1] = lo.y, pv[i][2] = hi.x, pv[i][3] = hi.y;
        }
        float mx = 0.f;
#pragma unroll
        for (int i = 0; i < 4; i++) mx = fmaxf(mx, fmaxf(fmaxf(fabsf(pv[i][0]), fabsf(pv[i][1])), fmaxf(fabsf(pv[i][2]), fabsf(pv[i][3]))));
        mx = warp_max<1, 2>(mx); // the quad of head g
        int e_step = 127;
        if (mx > 0.f) {
            int E;
            frexpf(mx, &E); // mx in [2^(E-1), 2^E): mx 2^(1-E) < 2
            e_step = min(1 - E, 126); // 127: no scale yet (2^126 is finite)
        }
        const int e_new = min(e_run, e_step);
        const int eo0 = __shfl_sync(0xffffffffu, e_run, 8 * t), eo1 = __shfl_sync(0xffffffffu, e_run, 8 * t + 4);
        const int en0 = __shfl_sync(0xffffffffu, e_new, 8 * t), en1 = __shfl_sync(0xffffffffu, e_new, 8 * t + 4);
        if (eo0 != en0 || eo1 != en1) { // exact power-of-two rescale of the columns of heads 2t, 2t + 1
            const float f0 = eo0 == 127 ? 0.f : ldexpf(1.f, en0 - eo0), f1 = eo1 == 127 ? 0.f : ldexpf(1.f, en1 - eo1);
#pragma unroll
            for (int m = 0; m < MT; m++) o[m][0] *= f0, o[m][1] *= f1, o[m][2] *= f0, o[m][3] *= f1;
            z[0] *= f0, z[1] *= f1, z[2] *= f0, z[3] *= f1;
        }
        e_run = e_new;
        const float f = e_run == 127 ? 0.f : ldexpf(1.f, e_run);
        uint32_t pb[4][2];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            pb[i][0] = pack_f16(pv[i][0] * f, pv[i][1] * f);
            pb[i][1] = pack_f16(pv[i][2] * f, pv[i][3] * f);
        }
        step_values<D, GS>(o, z, rec, pb, lane);
        __syncwarp(); // every lane is done with the record before it is refilled
    }
    // true units (the scale 2^-e of each head column, the code rows' 2^(24 - code_sh)), Z added to the
    // channels of its value group, then the warps summed
    __syncthreads(); // the merge buffer aliases the rings
    {
        const int e0 = __shfl_sync(0xffffffffu, e_run, 8 * t), e1 = __shfl_sync(0xffffffffu, e_run, 8 * t + 4);
        const float u0 = e0 == 127 ? 0.f : ldexpf(1.f, -e0), u1 = e1 == 127 ? 0.f : ldexpf(1.f, -e1);
#pragma unroll
        for (int mv = 0; mv < MT; mv++) {
            const int c = 16 * mv + 2 * g;
            const float r0 = exp2f((float)(24 - code_sh(4 * (mv % 4)))), r1 = exp2f((float)(24 - code_sh(4 * (mv % 4) + 2)));
            ms.o[warp][2 * t][c] = o[mv][0] * r0 * u0;
            ms.o[warp][2 * t + 1][c] = o[mv][1] * r0 * u1;
            ms.o[warp][2 * t][c + 1] = o[mv][2] * r1 * u0;
            ms.o[warp][2 * t + 1][c + 1] = o[mv][3] * r1 * u1;
        }
        __syncwarp();
        if (g < D / GS)
            for (int c = g * GS; c < g * GS + GS; c++)
                ms.o[warp][2 * t][c] += z[0] * u0, ms.o[warp][2 * t + 1][c] += z[1] * u1;
    }
    __syncthreads();
    av_store<D>(ms.o, p.out + (b * p.Hq + (int64_t)kvh * G) * D, p.parts, p.counters, &flag_s, head, split, p.nsplit, G, tid);
}

// ---- the native layout written on the device ----
// The layout's definition is reference/int2.h (ref_int2_to_native). One step record (64 tokens of one
// KV head) and the key-metadata rows are written by the block's threads, one output word each, from a
// source of codes and metadata: the interchange arrays (to_native_kernel) or a chunk quantized in
// shared memory (quant_native_kernel). Token and group arguments are relative to the step (record)
// or to the source's first group (rows).
template <class Src>
__device__ void write_record(uint32_t *rec, const Src &src, int D, int ngv)
{
    const int rw = 8 * D + 64 * ngv;
    for (int idx = threadIdx.x; idx < rw; idx += blockDim.x) {
        uint32_t word = 0;
        if (idx < 4 * D) { // key codes (j, lane, p)
            const int j = idx / 64, lane = (idx % 64) / 2, pp = idx % 2, g = lane / 4, t = lane % 4;
            for (int hb = 0; hb < 2; hb++) {
                const int c = 16 * j + 4 * t + 2 * pp + hb;
                for (int i = 0; i < 4; i++)
                    for (int h = 0; h < 2; h++) word |= src.kcode(16 * i + g + 8 * h, c) << (16 * hb + 2 * (2 * i + h));
            }
        } else if (idx < 8 * D) { // value codes (i, lane, 2mh + p)
            const int v = idx - 4 * D, i = v / D, lane = (v % D) / (D / 32), q = (v % D) % (D / 32);
            const int pp = q % 2, mh = q / 2, g = lane / 4, t = lane % 4;
            for (int hb = 0; hb < 2; hb++)
                for (int m = 0; m < 4; m++)
                    for (int h = 0; h < 2; h++)
                        word |= src.vcode(16 * i + 2 * t + 8 * pp + hb, 16 * (4 * mh + m) + 2 * g + h) << (16 * hb + 2 * (2 * m + h));
        } else { // value scales and zeros: halves 2e, 2e + 1 of the metadata part
            for (int half = 0; half < 2; half++) {
                const int e = 2 * (idx - 8 * D) + half;
                const int pos = e % 16, gv = (e / 16) % ngv, ia = e / (16 * ngv), i = ia / 2, a = ia % 2;
                const int tau = 2 * (pos / 4) + 8 * ((pos / 2) % 2) + pos % 2; // the inverse of pos(tau)
                word |= (uint32_t)src.vmeta(a, 16 * i + tau, gv) << (16 * half);
            }
        }
        rec[idx] = word;
    }
}

// Key-metadata rows r < nrows of groups grp0 + r (scales then zeros, rotated): km points at group 0's row
// of the head.
template <class Src>
__device__ void write_kmeta_rows(unsigned short *km, const Src &src, int D, int gs, int64_t grp0, int nrows)
{
    const int ngs = gs >= 64 ? 1 : 64 / gs, nq = D / 4, lD = __ffs(D) - 1; // D, gs: powers of two
    for (int idx = threadIdx.x; idx < nrows * 2 * D; idx += blockDim.x) {
        const int r = idx >> (lD + 1), a = (idx >> lD) & 1, P = idx & (D - 1);
        const int64_t grp = grp0 + r;
        const int rot = (int)grp & (ngs - 1);
        const int d = 4 * ((P / 4 - 4 * rot) & (nq - 1)) + (P & 3); // the channel stored at P (rotation mod nq)
        km[(grp * 2 + a) * D + P] = src.kmeta(a, r, d);
    }
}

// ---- interchange -> native: one block per (step, head) ----
struct PackParams {
    CachePtrs c;
    uint32_t *Rec;
    __half *Km;
    int D, gs;
    int64_t Tcap, s0;
};

// The interchange arrays of head bh as a source, tokens relative to tok0 and groups to grp0.
struct InterchangeSrc {
    const uint32_t *kq, *vq;
    const unsigned short *ks, *kz, *vs, *vz;
    int64_t bh, Tcap, tok0, grp0;
    int D, gs;
    __device__ uint32_t kcode(int tok, int c) const
    {
        const int64_t t = tok0 + tok;
        return (kq[(bh * D + c) * (Tcap / 16) + t / 16] >> (2 * (t % 16))) & 3u;
    }
    __device__ uint32_t vcode(int tok, int ch) const
    {
        return (vq[(bh * Tcap + tok0 + tok) * (D / 16) + ch / 16] >> (2 * (ch % 16))) & 3u;
    }
    __device__ unsigned short vmeta(int a, int tok, int gv) const
    {
        return (a ? vz : vs)[(bh * Tcap + tok0 + tok) * (D / gs) + gv];
    }
    __device__ unsigned short kmeta(int a, int r, int d) const
    {
        return (a ? kz : ks)[(bh * D + d) * (Tcap / gs) + grp0 + r];
    }
};

// Key-metadata rows are written by the steps that hold them (at gs=128 both steps of a group write
// the same row).
__global__ void __launch_bounds__(256) to_native_kernel(PackParams p)
{
    const int D = p.D, gs = p.gs, ngv = D / gs, ngs = gs >= 64 ? 1 : 64 / gs;
    const int64_t s = p.s0 + blockIdx.x, bh = blockIdx.y, Tcap = p.Tcap;
    InterchangeSrc src;
    src.kq = reinterpret_cast<const uint32_t *>(p.c.Kq), src.vq = reinterpret_cast<const uint32_t *>(p.c.Vq);
    src.ks = reinterpret_cast<const unsigned short *>(p.c.Ks), src.kz = reinterpret_cast<const unsigned short *>(p.c.Kz);
    src.vs = reinterpret_cast<const unsigned short *>(p.c.Vs), src.vz = reinterpret_cast<const unsigned short *>(p.c.Vz);
    src.bh = bh, src.Tcap = Tcap, src.tok0 = 64 * s, src.grp0 = (64 * s) / gs, src.D = D, src.gs = gs;
    write_record(p.Rec + (bh * (Tcap / 64) + s) * (8 * D + 64 * ngv), src, D, ngv);
    write_kmeta_rows(reinterpret_cast<unsigned short *>(p.Km) + bh * (Tcap / gs) * 2 * D, src, D, gs, src.grp0, ngs);
}

// ---- quantize straight into the native layout: one block per (chunk, head) ----
// A chunk is CH = max(64, gs) tokens: whole steps and whole key groups. Three phases, each over the
// block's 256 threads:
//   stage     K and V as bf16 channel pairs (one 32-bit word per token and pair) in shared memory, in
//             layouts chosen so that the native-word reads below meet no bank twice (QnLayout);
//   metadata  per key group (channel, gs tokens) and value group (token, gs channels): the reference's
//             scan in its order (the sign of a zero minimum included), group_meta, and the group's
//             (scale, zero, 1/scale) as floats, so that the codes need no conversion or reciprocal;
//   words     every native word computed where it is written: its 16 codes straight from the bf16
//             pairs and the float metadata, 7 instructions each (code_of), so each code is computed
//             once and nothing is gathered from a staging copy of the codes.
// The metadata of a dead group (NaN metadata or a zero scale: codes 0) is stored as (0, 0, 0):
// code_of gives 0 for every input then.
struct QuantNativeParams {
    const __nv_bfloat16 *K, *V; // [heads, src_len, D], tokens [0, n) quantized
    int64_t src_len, t0, Tcap;  // cache tokens [t0, t0 + n)
    uint32_t *Rec;
    __half *Km;
    int gs;
};

// Shared-memory layout of quant_native_kernel (bytes, every part 16-byte aligned). K pairs: row stride
// D/2 + 8 words, so that a key word's 8 tokens x 8 pairs of a warp fall on 32 banks. V pairs: row
// stride D/2 + 2 words and, at D=128, pair p at 2 (p % 32) + p / 32, so that a value word's 8 tokens
// x 4 pairs of a warp do. The float metadata (16 bytes a group) is read 8 threads at a time: key
// groups at [gi][c % 2][c / 2] (kq_at), value groups at [gv][token with bit 0 flipped by bit 3], rows
// CH + 1 apart (vq_at), so that those 8 threads' groups fall on different 16-byte slots, or 2 on one.
struct QnLayout {
    int D, gs, CH, ngk, ngv, KS, VS;
    size_t kt, vt, kq, vq, km, vm, bytes;
    __host__ __device__ QnLayout(int D_, int gs_)
        : D(D_), gs(gs_), CH(gs_ > 64 ? gs_ : 64), ngk(CH / gs_), ngv(D_ / gs_), KS(D_ / 2 + 8), VS(D_ / 2 + 2)
    {
        kt = 0;
        vt = kt + (size_t)CH * KS * 4;
        kq = vt + (size_t)CH * VS * 4;
        vq = kq + (size_t)D * ngk * 16;
        km = vq + (size_t)ngv * (CH + 1) * 16;
        vm = km + (size_t)2 * D * ngk * 2;
        bytes = vm + (size_t)2 * CH * ngv * 2;
    }
};

template <int D> __device__ __forceinline__ int vpos(int p) { return D == 128 ? 2 * (p & 31) + (p >> 5) : p; }
template <int D> __device__ __forceinline__ int kq_at(int c, int gi) { return (2 * gi + (c & 1)) * (D / 2) + (c >> 1); }
__device__ __forceinline__ int vq_at(int tt, int gv, int CH) { return gv * (CH + 1) + (tt ^ ((tt >> 3) & 1)); }

// The metadata of one group from its min, max and bad flag: fp16 bits for the native layout and
// (scale, zero, 1/scale) as floats for the codes. mn and mx as the reference's scan finds them (first
// element first, strict compares): the same values as min and max, and where a bound is a zero, the
// sign of the first zero in scan order (the callers rescan in order then, a rare case).
struct GroupScan {
    float mn, mx;
    bool bad; // inf, NaN or beyond INT2_MAX_ABS: NaN metadata, codes 0
    __device__ void first(float x) { mn = mx = x, bad = unsupported(x); }
    __device__ void add(float x)
    {
        if (x < mn) mn = x;
        if (x > mx) mx = x;
        bad |= unsupported(x);
    }
    __device__ bool needs_order() const { return !bad && (mn == 0.f || mx == 0.f); }
    __device__ float4 finish(unsigned short &sb, unsigned short &zb) const
    {
        __half s, z;
        group_meta(mn, mx, bad, s, z);
        sb = __half_as_ushort(s), zb = __half_as_ushort(z);
        const float sf = __half2float(s), zf = __half2float(z);
        if (!(sf == sf && sf != 0.f)) return make_float4(0.f, 0.f, 0.f, 0.f);
        return make_float4(sf, zf, __frcp_rn(sf), 0.f);
    }
};

__device__ __forceinline__ uint32_t code_m(float x, const float4 &m) { return code_of(x, m.x, m.y, m.z); }

template <int D>
__global__ void __launch_bounds__(256) quant_native_kernel(QuantNativeParams p)
{
    extern __shared__ __align__(128) unsigned char smem[];
    const QnLayout L(D, p.gs);
    const int gs = L.gs, CH = L.CH, ngk = L.ngk, ngv = L.ngv, KS = L.KS, VS = L.VS, tid = threadIdx.x;
    const int lgs = __ffs(gs) - 1, lngv = __ffs(ngv) - 1; // gs and D / gs are powers of two: no division per word
    uint32_t *kt = reinterpret_cast<uint32_t *>(smem + L.kt), *vt = reinterpret_cast<uint32_t *>(smem + L.vt);
    float4 *kq = reinterpret_cast<float4 *>(smem + L.kq), *vq = reinterpret_cast<float4 *>(smem + L.vq);
    unsigned short *km = reinterpret_cast<unsigned short *>(smem + L.km), *vm = reinterpret_cast<unsigned short *>(smem + L.vm);
    const int64_t bh = blockIdx.y, c0 = (int64_t)blockIdx.x * CH; // the chunk's first source token
    const uint4 *ksrc = reinterpret_cast<const uint4 *>(p.K + (bh * p.src_len + c0) * D);
    const uint4 *vsrc = reinterpret_cast<const uint4 *>(p.V + (bh * p.src_len + c0) * D);
    // 16 bytes = 4 pairs per load; a 64-token slab's loads all issued before its stores, so that each
    // thread has 2 PER of them in flight (a loop of load-then-store kept 2)
    constexpr int PER = 64 * D / 8 / 256;
    for (int base = 0; base < CH * D / 8; base += 64 * D / 8) {
        uint4 kb[PER], vb[PER];
#pragma unroll
        for (int r = 0; r < PER; r++) kb[r] = __ldcs(ksrc + base + tid + 256 * r), vb[r] = __ldcs(vsrc + base + tid + 256 * r);
#pragma unroll
        for (int r = 0; r < PER; r++) {
            const int i = base + tid + 256 * r, t = i / (D / 8), q = i % (D / 8);
            *reinterpret_cast<uint4 *>(kt + t * KS + 4 * q) = kb[r];
            uint32_t *vr = vt + t * VS;
            vr[vpos<D>(4 * q)] = vb[r].x, vr[vpos<D>(4 * q + 1)] = vb[r].y, vr[vpos<D>(4 * q + 2)] = vb[r].z,
                             vr[vpos<D>(4 * q + 3)] = vb[r].w;
        }
    }
    __syncthreads();
    // metadata: key tasks (pair pr, group gi) over gs tokens of two channels, value tasks (token t,
    // group gv) over gs channels; min, max and an inf/NaN probe on bf16 pairs, as the interchange
    // quantizers, then the reference's ordered scan where a bound is a zero (its sign)
    const __nv_bfloat162 zero2 = __floats2bfloat162_rn(0.f, 0.f), pinf2 = __floats2bfloat162_rn(INFINITY, INFINITY),
                         ninf2 = __floats2bfloat162_rn(-INFINITY, -INFINITY);
    for (int u = tid; u < (D / 2) * ngk + CH * ngv; u += blockDim.x) {
        if (u < (D / 2) * ngk) {
            const int pr = u % (D / 2), gi = u / (D / 2);
            const uint32_t *col = kt + gi * gs * KS + pr;
            __nv_bfloat162 mn = pinf2, mx = ninf2, probe = zero2;
            for (int i = 0; i < gs; i++) {
                const __nv_bfloat162 v = bf2_of(col[i * KS]);
                mn = __hmin2(mn, v), mx = __hmax2(mx, v);
                probe = __hfma2(v, zero2, probe); // inf or NaN -> NaN
            }
            GroupScan a, b;
            a.mn = __low2float(mn), a.mx = __low2float(mx), b.mn = __high2float(mn), b.mx = __high2float(mx);
            a.bad = unsupported(a.mn) || unsupported(a.mx) || isnan(__low2float(probe));
            b.bad = unsupported(b.mn) || unsupported(b.mx) || isnan(__high2float(probe));
            if (a.needs_order()) {
                a.first(bf16_lo(col[0]));
                for (int i = 1; i < gs; i++) a.add(bf16_lo(col[i * KS]));
            }
            if (b.needs_order()) {
                b.first(bf16_hi(col[0]));
                for (int i = 1; i < gs; i++) b.add(bf16_hi(col[i * KS]));
            }
            const int c = 2 * pr; // km [a][d][gi]
            kq[kq_at<D>(c, gi)] = a.finish(km[c * ngk + gi], km[(D + c) * ngk + gi]);
            kq[kq_at<D>(c + 1, gi)] = b.finish(km[(c + 1) * ngk + gi], km[(D + c + 1) * ngk + gi]);
        } else {
            const int w = u - (D / 2) * ngk, t = w >> lngv, gv = w & (ngv - 1);
            const uint32_t *row = vt + t * VS;
            const int pr0 = gv * (gs / 2);
            __nv_bfloat162 mn = pinf2, mx = ninf2, probe = zero2;
            for (int i = 0; i < gs / 2; i++) {
                const __nv_bfloat162 v = bf2_of(row[vpos<D>(pr0 + i)]);
                mn = __hmin2(mn, v), mx = __hmax2(mx, v);
                probe = __hfma2(v, zero2, probe);
            }
            GroupScan a;
            a.mn = fminf(__low2float(mn), __high2float(mn)), a.mx = fmaxf(__low2float(mx), __high2float(mx));
            a.bad = unsupported(a.mn) || unsupported(a.mx) || isnan(__low2float(probe)) || isnan(__high2float(probe));
            if (a.needs_order()) {
                uint32_t x = row[vpos<D>(pr0)];
                a.first(bf16_lo(x)), a.add(bf16_hi(x));
                for (int i = 1; i < gs / 2; i++) {
                    x = row[vpos<D>(pr0 + i)];
                    a.add(bf16_lo(x)), a.add(bf16_hi(x));
                }
            }
            vq[vq_at(t, gv, CH)] = a.finish(vm[t * ngv + gv], vm[(CH + t) * ngv + gv]); // vm [a][tau][gv]
        }
    }
    __syncthreads();
    // the records: word idx of step sl as write_record (reference/int2.h: ref_int2_to_native) defines it
    const int64_t tok = p.t0 + c0; // the chunk's first cache token: a multiple of CH
    const int rw = 8 * D + 64 * ngv;
    for (int sl = 0; sl < CH / 64; sl++) {
        uint32_t *rec = p.Rec + (bh * (p.Tcap / 64) + tok / 64 + sl) * rw;
        const int s0 = 64 * sl; // the step's first token in the chunk
        for (int idx = tid; idx < rw; idx += blockDim.x) {
            uint32_t word = 0;
            // (unsigned index arithmetic and per-word bases: the shifts and adds per code are the loop's
            // overhead beyond code_of)
            const unsigned ui = (unsigned)idx;
            if (ui < 4u * D) { // key codes (j, lane, p): channels 2 pr, 2 pr + 1, tokens 16 i + g + 8 h
                const unsigned j = ui >> 6, lane = (ui & 63u) >> 1, pp = ui & 1u, g = lane >> 2, t = lane & 3u;
                const unsigned pr = 8u * j + 2u * t + pp;
                const uint32_t *xk = kt + (s0 + g) * KS + pr;
                const float4 *mk = kq + pr; // kq_at(2 pr, gi) = gi D + pr, kq_at(2 pr + 1, gi) = gi D + D/2 + pr
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    const int gi = (s0 + 16 * i) >> lgs;
                    const float4 m0 = mk[gi * D], m1 = mk[gi * D + D / 2];
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        const uint32_t x = xk[(16 * i + 8 * h) * KS];
                        word += code_m(bf16_lo(x), m0) << (2 * (2 * i + h)); // disjoint fields: + is |, one LEA
                        word += code_m(bf16_hi(x), m1) << (16 + 2 * (2 * i + h));
                    }
                }
            } else if (ui < 8u * D) { // value codes (i, lane, 2 mh + p): tokens 16 i + 2 t + 8 p + hb, pairs 32 mh + 8 m + g
                const unsigned v = ui - 4u * D, i = v / D, lane = (v % D) / (D / 32), q = v % (D / 32);
                const unsigned pp = q & 1u, mh = q >> 1, g = lane >> 2, t = lane & 3u;
                const unsigned tt0 = s0 + 16u * i + 2u * t + 8u * pp; // hb = 0; tt0 + 1 for hb = 1
                const uint32_t *xv = vt + tt0 * VS + vpos<D>(32 * mh + g); // + 16 m (D=128) or + 8 m (D=64): pair 32 mh + 8 m + g
#pragma unroll
                for (int hb = 0; hb < 2; hb++) {
                    const unsigned tt = tt0 + hb, ttp = tt ^ ((tt >> 3) & 1u); // vq_at's token order
#pragma unroll
                    for (int m = 0; m < 4; m++) {
                        const unsigned gv = (64u * mh + 16u * m + 2u * g) >> lgs; // the value group of pair 32 mh + 8 m + g
                        const float4 mv = vq[gv * (CH + 1) + ttp];
                        const uint32_t x = xv[hb * VS + (D == 128 ? 16 : 8) * m];
                        word += code_m(bf16_lo(x), mv) << (16 * hb + 4 * m);
                        word += code_m(bf16_hi(x), mv) << (16 * hb + 4 * m + 2);
                    }
                }
            } else { // value scales and zeros: halves 2e, 2e + 1 of the metadata part
#pragma unroll
                for (int half = 0; half < 2; half++) {
                    const int e = 2 * (idx - 8 * D) + half;
                    const int pos = e % 16, gv = (e >> 4) & (ngv - 1), ia = e >> (4 + lngv), i = ia / 2, a = ia % 2;
                    const int tau = 2 * (pos / 4) + 8 * ((pos / 2) % 2) + pos % 2; // the inverse of pos(tau)
                    word |= (uint32_t)vm[(a * CH + s0 + 16 * i + tau) * ngv + gv] << (16 * half);
                }
            }
            rec[idx] = word;
        }
    }
    struct { // the key metadata as write_kmeta_rows reads it
        const unsigned short *km;
        int ngk;
        __device__ unsigned short kmeta(int a, int r, int d) const { return km[(a * D + d) * ngk + r]; }
    } src{km, ngk};
    write_kmeta_rows(reinterpret_cast<unsigned short *>(p.Km) + bh * (p.Tcap / gs) * 2 * D, src, D, gs, tok / gs, ngk);
}

} // namespace v3

// ---- int2_qk: one block per (256-token tile, head) ----

struct QKParams {
    const __nv_bfloat16 *q;
    CachePtrs c;
    float *scores;
    int Hkv, Hq, G;
    int64_t Tcap, T;
    int64_t head0; // the launch's first head: heads go to grid.y in chunks (kvb_grid.h)
};

template <int D, int GS>
constexpr size_t qk_smem_bytes() { return (size_t)Tile<D, GS>::OFF_VQ + sizeof(float) * (MAXG * D + 2 * MAXG); }

template <int D, int GS>
__global__ void __launch_bounds__(THREADS) int2_qk_kernel(QKParams p)
{
    extern __shared__ __align__(16) unsigned char smem[];
    float *q_s = reinterpret_cast<float *>(smem + Tile<D, GS>::OFF_VQ); // only the key part of the tile is used
    float *f_s = q_s + MAXG * D, *u_s = f_s + MAXG;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int tile = blockIdx.x;
    const int64_t head = p.head0 + blockIdx.y, b = head / p.Hkv;
    const int kvh = (int)(head % p.Hkv), G = p.G;
    load_tile<D, GS>(smem, p.c, head, tile, p.T, p.Tcap, true, false, tid);
    cp_async_commit();
    stage_q(q_s, f_s, u_s, p.q + (b * p.Hq + (int64_t)kvh * G) * D, G, D, tid); // while the tile lands
    cp_async_wait<0>();
    __syncthreads();
    const int64_t tok = (int64_t)tile * TILE + 64 * warp + 8 * g; // the thread's 8 tokens; T is a multiple of 16
    if ((int64_t)tile * TILE + 64 * warp >= p.T) return;
    uint32_t qh[D / 16][2];
    q_frags_f16<D>(qh, q_s, f_s, G, lane);
    float s[4][4];
    qk_tile<D, GS>(s, smem, qh, warp, lane);
    if (tok >= p.T) return;
#pragma unroll
    for (int c = 0; c < 2; c++) {
        const int hc = 2 * t + c;
        if (hc >= G) continue;
        const float u = u_s[hc];
        float4 *dst = reinterpret_cast<float4 *>(p.scores + ((b * p.Hq + (int64_t)kvh * G + hc) * p.T + tok));
        dst[0] = make_float4(s[0][c] * u, s[0][c + 2] * u, s[1][c] * u, s[1][c + 2] * u);
        dst[1] = make_float4(s[2][c] * u, s[2][c + 2] * u, s[3][c] * u, s[3][c + 2] * u);
    }
}

// ---- int2_av: blocks (split, head) over whole tiles, partial sums merged by the last block ----

struct AVParams {
    const float *p;
    CachePtrs c;
    float *out;
    int Hkv, Hq, G, nsplit;
    int64_t Tcap, T, ntiles;
    int *counters;
    float *parts;
    int64_t head0; // the launch's first head: heads go to grid.y in chunks (kvb_grid.h)
};

template <int D, int GS>
constexpr size_t av_smem_bytes()
{
    return (size_t)Tile<D, GS>::BYTES > sizeof(float) * WARPS * MAXG * D ? (size_t)Tile<D, GS>::BYTES
                                                                        : sizeof(float) * WARPS * MAXG * D;
}

template <int D, int GS>
__global__ void __launch_bounds__(THREADS) int2_av_kernel(AVParams p)
{
    constexpr int MT = D / 16;
    extern __shared__ __align__(16) unsigned char smem[];
    float(*o_s)[MAXG][D] = reinterpret_cast<float(*)[MAXG][D]>(smem); // aliases the tile at the end
    __shared__ int flag_s;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int64_t split = blockIdx.x, head = p.head0 + blockIdx.y, b = head / p.Hkv;
    const int kvh = (int)(head % p.Hkv), G = p.G;
    const int tile_a = (int)(split * p.ntiles / p.nsplit), tile_b = (int)((split + 1) * p.ntiles / p.nsplit);
    const float *prow = p.p + (b * p.Hq + (int64_t)kvh * G + g) * p.T; // head g of the thread's B column
    float o[MT][4];
#pragma unroll
    for (int m = 0; m < MT; m++) o[m][0] = o[m][1] = o[m][2] = o[m][3] = 0.f;
    int e_run = 127; // O columns of head g are scaled by 2^e_run: p values enter fp16 below 2^15
    for (int tile = tile_a; tile < tile_b; tile++) {
        load_tile<D, GS>(smem, p.c, head, tile, p.T, p.Tcap, false, true, tid);
        cp_async_commit();
        cp_async_wait<0>();
        __syncthreads();
        const int64_t tok = (int64_t)tile * TILE + 64 * warp + 16 * t; // the thread's 16 tokens (all or none below T)
        if ((int64_t)tile * TILE + 64 * warp < p.T) {
            float pv[16];
            const bool ok = g < G && tok < p.T;
#pragma unroll
            for (int c = 0; c < 4; c++) {
                const float4 v = ok ? __ldg(reinterpret_cast<const float4 *>(prow + tok) + c) : make_float4(0.f, 0.f, 0.f, 0.f);
                pv[4 * c] = v.x, pv[4 * c + 1] = v.y, pv[4 * c + 2] = v.z, pv[4 * c + 3] = v.w;
            }
            float mx = 0.f;
#pragma unroll
            for (int i = 0; i < 16; i++) mx = fmaxf(mx, fabsf(pv[i]));
            mx = warp_max<1, 2>(mx); // the quad of head g
            int e_step = 127;
            if (mx > 0.f) {
                int E;
                frexpf(mx, &E);
                e_step = 15 - E;
            }
            const int e_new = min(e_run, e_step);
            const int eo0 = __shfl_sync(0xffffffffu, e_run, 8 * t), eo1 = __shfl_sync(0xffffffffu, e_run, 8 * t + 4);
            const int en0 = __shfl_sync(0xffffffffu, e_new, 8 * t), en1 = __shfl_sync(0xffffffffu, e_new, 8 * t + 4);
            if (eo0 != en0 || eo1 != en1) { // exact power-of-two rescale of the O columns 2t, 2t+1
                const float f0 = ldexpf(1.f, en0 - eo0), f1 = ldexpf(1.f, en1 - eo1);
#pragma unroll
                for (int m = 0; m < MT; m++) o[m][0] *= f0, o[m][1] *= f1, o[m][2] *= f0, o[m][3] *= f1;
            }
            e_run = e_new;
            const float f = ldexpf(1.f, e_run);
            uint32_t pb[4][2];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                pb[i][0] = pack_f16(pv[2 * i] * f, pv[2 * i + 8] * f);
                pb[i][1] = pack_f16(pv[2 * i + 1] * f, pv[2 * i + 9] * f);
            }
            av_tile<D, GS>(o, smem, pb, warp, lane);
        }
        __syncthreads();
    }
    // unscale, combine the 4 warps (a sum), then the splits (in split order, by the last block)
    {
        const int e0 = __shfl_sync(0xffffffffu, e_run, 8 * t), e1 = __shfl_sync(0xffffffffu, e_run, 8 * t + 4);
        const float u0 = ldexpf(1.f, -e0), u1 = ldexpf(1.f, -e1);
#pragma unroll
        for (int m = 0; m < MT; m++) {
            const int ch = vmap_channel<D, VMAP_WORD>(m, g);
            o_s[warp][2 * t][ch] = o[m][0] * u0;
            o_s[warp][2 * t + 1][ch] = o[m][1] * u1;
            o_s[warp][2 * t][ch + 1] = o[m][2] * u0;
            o_s[warp][2 * t + 1][ch + 1] = o[m][3] * u1;
        }
    }
    __syncthreads();
    av_store<D>(o_s, p.out + (b * p.Hq + (int64_t)kvh * G) * D, p.parts, p.counters, &flag_s, head, split, p.nsplit, G, tid);
}

// (D, gs) at compile time: f(integral_constant<int, D>, integral_constant<int, gs>); the layout checks
// have already admitted only D in {64, 128} and gs in {16, 32, 64, 128} dividing D.
template <typename F>
int with_cfg(int D, int gs, F &&f)
{
    using std::integral_constant;
    if (D == 64) {
        if (gs == 16) return f(integral_constant<int, 64>{}, integral_constant<int, 16>{});
        if (gs == 32) return f(integral_constant<int, 64>{}, integral_constant<int, 32>{});
        return f(integral_constant<int, 64>{}, integral_constant<int, 64>{});
    }
    if (gs == 16) return f(integral_constant<int, 128>{}, integral_constant<int, 16>{});
    if (gs == 32) return f(integral_constant<int, 128>{}, integral_constant<int, 32>{});
    if (gs == 64) return f(integral_constant<int, 128>{}, integral_constant<int, 64>{});
    return f(integral_constant<int, 128>{}, integral_constant<int, 128>{});
}

// ---- host helpers ----

int check_fused(const int2_layout *l, const char *who)
{
    int rc = int2_attn_check(l, who);
    if (rc) return rc;
    if (l->Tcap % INT2_TCAP_GRANULE != 0)
        return kvb_fail(KVB_EINVAL, "%s: Tcap=%lld is not a multiple of 256: the fused kernels read the cache in "
                        "256-token tiles (allocate it in 256-token granules; T may be any multiple of gs)", who,
                        (long long)l->Tcap);
    return KVB_OK;
}

int check_keys_present(const int2_cache *c, const char *who)
{
    if (!c || !c->Kq || !c->Ks || !c->Kz)
        return kvb_fail(KVB_EINVAL, "%s: a key cache pointer (Kq, Ks, Kz) is NULL", who);
    return KVB_OK;
}

int check_values_present(const int2_cache *c, const char *who)
{
    if (!c || !c->Vq || !c->Vs || !c->Vz)
        return kvb_fail(KVB_EINVAL, "%s: a value cache pointer (Vq, Vs, Vz) is NULL", who);
    return KVB_OK;
}

int av_splits(const int2_layout *l)
{
    const int64_t heads = (int64_t)l->B * l->Hkv, ntiles = (l->T + TILE - 1) / TILE;
    int64_t want = ((int64_t)sm_count() * 4 + heads - 1) / heads;
    if (want > ntiles) want = ntiles;
    if (want > 256) want = 256;
    return (int)(want > 0 ? want : 1);
}

// The fused decode kernel of a version: v2 (the default), v1, or v3 (the native layout).
enum { ATTN_V2 = 0, ATTN_V1 = 1, ATTN_V3 = 2 };

template <int D, int GS>
void attn_kernel_of(int version, void (**kernel)(AttnParams), size_t *smem)
{
    if (version == ATTN_V1) *kernel = int2_attn_kernel<D, GS>, *smem = attn_smem_bytes<D, GS>();
    else *kernel = v2::attn_kernel<D, GS>, *smem = v2::smem_bytes<D, GS>();
}

// Resident blocks of the version's kernel on this device (the stream-K grid: one wave).
int attn_capacity_of(const int2_layout *l, int version, int *cap)
{
    return with_cfg(l->D, l->gs, [&](auto dc, auto gc) -> int {
        constexpr int D = decltype(dc)::value, GS = decltype(gc)::value;
        int per_sm = 0;
        if (version == ATTN_V3) {
            constexpr size_t smem = v3::smem_bytes<D, GS>();
            CUDA_TRY(cudaFuncSetAttribute(v3::attn_kernel<D, GS>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, v3::attn_kernel<D, GS>, v3::NT, smem));
            *cap = sm_count() * (per_sm > 0 ? per_sm : 1);
            return KVB_OK;
        }
        void (*kernel)(AttnParams);
        size_t smem;
        attn_kernel_of<D, GS>(version, &kernel, &smem);
        CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, THREADS, smem));
        *cap = sm_count() * (per_sm > 0 ? per_sm : 1);
        return KVB_OK;
    });
}

size_t attn_workspace(const int2_layout *l, int cap, size_t *parts_off)
{
    const size_t heads = (size_t)l->B * l->Hkv, G = (size_t)(l->Hq / l->Hkv);
    *parts_off = (heads * sizeof(int) + 255) & ~(size_t)255;
    return *parts_off + (heads + (size_t)cap) * G * (size_t)(l->D + 2) * sizeof(float);
}

size_t av_workspace(const int2_layout *l, size_t *parts_off)
{
    const size_t heads = (size_t)l->B * l->Hkv, G = (size_t)(l->Hq / l->Hkv);
    *parts_off = (heads * sizeof(int) + 255) & ~(size_t)255;
    return *parts_off + heads * (size_t)av_splits(l) * G * (size_t)l->D * sizeof(float);
}

namespace v2 {
// Host self-test of v2's copy plans (Plan::init + load_tile + the pass) against the layout formulas:
// every cp.async lands where the formulas put its source, each region is covered exactly once, and the
// pass stores cover the transposed layouts exactly once. Returns the number of violations (0: good).
template <int D, int GS>
long plan_selftest()
{
    using L = Lay<D, GS>;
    constexpr int CPR = D / 64, VSTEP = THREADS / CPR, NPP = L::NGK / L::PG;
    long bad = 0;
    const int64_t Tcap = 1024;
    for (int64_t bh : {0, 3})
        for (int tile : {0, 3}) {
            const int64_t tok0 = (int64_t)tile * TILE;
            std::vector<int> cover(L::BYTES, 0), tcover(L::BYTES, 0);
            for (int tid = 0; tid < THREADS; tid++) {
                Plan<D, GS> pl;
                pl.init(bh, Tcap, tid);
                for (int k = 0; k < D / 32; k++) { // key codes
                    const int i = tid + THREADS * k, d = i >> 2, ch = i & 3;
                    const int dst = pl.kqd + k * 32 * 64;
                    const int64_t src = pl.kq + tok0 / 16 + k * 32 * (Tcap / 16);
                    bad += dst != L::KQ + d * 64 + 16 * (ch ^ ((d >> 2) & 3));
                    bad += src != bh * D * (Tcap / 16) + (int64_t)d * (Tcap / 16) + tok0 / 16 + 4 * ch;
                    for (int b = 0; b < 16; b++) cover[dst + b]++;
                }
                if (tid < L::KITEMS) { // key metadata: rows c0, c0 + 1, groups part*PG..
                    const int pair = tid / NPP, part = tid % NPP, c0 = 2 * pair;
                    for (int r = 0; r < 2; r++) {
                        const int64_t src = pl.km + tok0 / GS + r * (Tcap / GS);
                        bad += src != (bh * D + c0 + r) * (Tcap / GS) + tok0 / GS + part * L::PG;
                        for (int b = 0; b < 2 * L::PG; b++) cover[L::KS + pl.kmd + r * L::NGK * 2 + b]++, cover[L::KZ + pl.kmd + r * L::NGK * 2 + b]++;
                        bad += pl.kmd + r * L::NGK * 2 != ((c0 + r) * L::NGK + part * L::PG) * 2;
                    }
                    for (int k = 0; k < L::PG; k++) {
                        const int g = part * L::PG + k;
                        bad += pl.kst[k & 1] + 2 * k * D != 2 * kphys<D>(g, c0);
                        bad += kphys<D>(g, c0 + 1) != kphys<D>(g, c0) + 1;
                        for (int b = 0; b < 4; b++) tcover[L::KS + pl.kst[k & 1] + 2 * k * D + b]++, tcover[L::KZ + pl.kst[k & 1] + 2 * k * D + b]++;
                    }
                }
                for (int k = 0; k < 2 * CPR; k++) { // value codes
                    const int i = tid + THREADS * k, tau = i / CPR, ch = i % CPR;
                    const int dst = pl.vqd + k * VSTEP * (D / 4);
                    const int64_t src = pl.vq + tok0 * L::VW + (int64_t)k * VSTEP * L::VW;
                    bad += dst != L::VQ + rho(tau) * (D / 4) + 16 * ch;
                    bad += src != (bh * Tcap + tok0 + tau) * L::VW + 4 * ch;
                    bad += tid / CPR + k * VSTEP != tau;
                    for (int b = 0; b < 16; b++) cover[dst + b]++;
                }
                if (L::NGV >= 2) { // value metadata: tokens t0, t0 + 2
                    const int t0 = 4 * (tid >> 1) + (tid & 1);
                    bad += pl.t0 != t0 || pl.vm != (bh * Tcap + t0) * L::NGV || pl.vmd != t0 * 2 * L::NGV;
                    for (int r = 0; r < 2; r++)
                        for (int b = 0; b < 2 * L::NGV; b++) cover[L::VS + pl.vmd + r * 4 * L::NGV + b]++, cover[L::VZ + pl.vmd + r * 4 * L::NGV + b]++;
                    for (int g = 0; g < L::NGV; g++) {
                        bad += pl.vst[g & 1] + 2 * g * TILE != 2 * vphys(g, t0);
                        bad += vphys(g, t0 + 2) != vphys(g, t0) + 1;
                        for (int b = 0; b < 4; b++) tcover[L::VS + pl.vst[g & 1] + 2 * g * TILE + b]++, tcover[L::VZ + pl.vst[g & 1] + 2 * g * TILE + b]++;
                    }
                } else if (tid < TILE / 4) {
                    bad += pl.t0 != 4 * tid || pl.vm != bh * Tcap + 4 * tid || pl.vmd != 8 * tid;
                    bad += pl.vst[0] != 2 * vphys(0, 4 * tid) || vphys(0, 4 * tid + 1) != vphys(0, 4 * tid) + 2;
                    bad += vphys(0, 4 * tid + 2) != vphys(0, 4 * tid) + 1 || vphys(0, 4 * tid + 3) != vphys(0, 4 * tid) + 3;
                    for (int b = 0; b < 8; b++) cover[L::VS + pl.vmd + b]++, cover[L::VZ + pl.vmd + b]++, tcover[L::VS + pl.vst[0] + b]++, tcover[L::VZ + pl.vst[0] + b]++;
                }
            }
            for (int b = 0; b < L::BYTES; b++) bad += cover[b] != 1;
            for (int b = L::KS; b < L::VQ; b++) bad += tcover[b] != 1;
            for (int b = L::VS; b < L::BYTES; b++) bad += tcover[b] != 1;
        }
    return bad;
}
} // namespace v2

} // namespace

// ================================================================================================
// API
// ================================================================================================

extern "C" int int2_quantize_keys(const kvb_bf16 *K, int64_t src_len, int64_t n, int64_t t0, const int2_cache *c,
                                  const int2_layout *l, cudaStream_t stream)
{
    const char *who = "int2_quantize_keys";
    int rc = int2_span_check(l, src_len, n, t0, who);
    if (rc) return rc;
    if (!K || (rc = check_keys_present(c, who))) return rc ? rc : kvb_fail(KVB_EINVAL, "%s: K is NULL", who);
    if (n == 0) return KVB_OK;
    const unsigned tiles = (unsigned)((n + QK_TILE - 1) / QK_TILE); // n <= Tcap <= 2^21: <= 16384
    const __nv_bfloat16 *src = reinterpret_cast<const __nv_bfloat16 *>(K);
    __half *Ks = reinterpret_cast<__half *>(c->Ks), *Kz = reinterpret_cast<__half *>(c->Kz);
    return kvb_grid_chunks((int64_t)l->B * l->Hkv, [&](int64_t bh0, unsigned heads) -> int {
        const dim3 grid(tiles, heads);
        if (l->D == 64)
            quant_keys_kernel<64><<<grid, QK_THREADS, 0, stream>>>(src, src_len, n, t0, c->Kq, Ks, Kz, l->Tcap, l->gs, bh0);
        else
            quant_keys_kernel<128><<<grid, QK_THREADS, 0, stream>>>(src, src_len, n, t0, c->Kq, Ks, Kz, l->Tcap, l->gs, bh0);
        CUDA_TRY(cudaGetLastError());
        return KVB_OK;
    });
}

extern "C" int int2_quantize_values(const kvb_bf16 *V, int64_t src_len, int64_t n, int64_t t0, const int2_cache *c,
                                    const int2_layout *l, cudaStream_t stream)
{
    const char *who = "int2_quantize_values";
    int rc = int2_span_check(l, src_len, n, t0, who);
    if (rc) return rc;
    if (!V || (rc = check_values_present(c, who))) return rc ? rc : kvb_fail(KVB_EINVAL, "%s: V is NULL", who);
    if (n == 0) return KVB_OK;
    unsigned blocks = 0;
    if ((rc = kvb_grid_x(who, "n*D/16 (threads per head)", n * (l->D / 16), QV_THREADS, &blocks))) return rc;
    const __nv_bfloat16 *src = reinterpret_cast<const __nv_bfloat16 *>(V);
    __half *Vs = reinterpret_cast<__half *>(c->Vs), *Vz = reinterpret_cast<__half *>(c->Vz);
    return kvb_grid_chunks((int64_t)l->B * l->Hkv, [&](int64_t bh0, unsigned heads) -> int {
        const dim3 grid(blocks, heads);
        if (l->D == 64)
            quant_values_kernel<64><<<grid, QV_THREADS, 0, stream>>>(src, src_len, n, t0, c->Vq, Vs, Vz, l->Tcap, l->gs, bh0);
        else
            quant_values_kernel<128><<<grid, QV_THREADS, 0, stream>>>(src, src_len, n, t0, c->Vq, Vs, Vz, l->Tcap, l->gs, bh0);
        CUDA_TRY(cudaGetLastError());
        return KVB_OK;
    });
}

// The append; with nat, a flush's 128 tokens are also quantized into the native cache, from the residual
// rows before the shift moves the rest over them.
static int append_impl(const int2_cache *c, const int2_native *nat, const kvb_bf16 *knew, const kvb_bf16 *vnew,
                       const int2_layout *l, cudaStream_t stream, const char *who)
{
    int rc = int2_append_check(l, who);
    if (rc) return rc;
    if (!knew || !vnew || !c || !c->Kr || !c->Vr)
        return kvb_fail(KVB_EINVAL, "%s: knew, vnew, Kr or Vr is NULL", who);
    const int64_t heads = (int64_t)l->B * l->Hkv;
    const int64_t chunks = heads * (l->D / 8);
    append_kernel<<<(unsigned)((chunks + 255) / 256), 256, 0, stream>>>(
        reinterpret_cast<__nv_bfloat16 *>(c->Kr), reinterpret_cast<__nv_bfloat16 *>(c->Vr),
        reinterpret_cast<const __nv_bfloat16 *>(knew), reinterpret_cast<const __nv_bfloat16 *>(vnew), heads, l->D, l->Rcap,
        l->R);
    CUDA_TRY(cudaGetLastError());
    const int R = l->R + 1;
    if (R < INT2_FLUSH) return KVB_OK;
    if ((rc = int2_quantize_keys(c->Kr, l->Rcap, INT2_FLUSH, l->T, c, l, stream))) return rc;
    if ((rc = int2_quantize_values(c->Vr, l->Rcap, INT2_FLUSH, l->T, c, l, stream))) return rc;
    if (nat && (rc = int2_quantize_native(c->Kr, c->Vr, l->Rcap, INT2_FLUSH, l->T, nat, l, stream))) return rc;
    if (R > INT2_FLUSH) {
        const int count = R - INT2_FLUSH;
        const int64_t n = heads * count * (l->D / 8);
        shift_kernel<<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(reinterpret_cast<__nv_bfloat16 *>(c->Kr),
                                                                       reinterpret_cast<__nv_bfloat16 *>(c->Vr), heads,
                                                                       l->D, l->Rcap, INT2_FLUSH, count);
        CUDA_TRY(cudaGetLastError());
    }
    return KVB_OK;
}

extern "C" int int2_append(const int2_cache *c, const kvb_bf16 *knew, const kvb_bf16 *vnew, const int2_layout *l,
                           cudaStream_t stream)
{
    return append_impl(c, NULL, knew, vnew, l, stream, "int2_append");
}

extern "C" int int2_append_native(const int2_cache *c, const int2_native *nat, const kvb_bf16 *knew,
                                  const kvb_bf16 *vnew, const int2_layout *l, cudaStream_t stream)
{
    const char *who = "int2_append_native";
    if (!nat || !nat->Rec || !nat->Km) return kvb_fail(KVB_EINVAL, "%s: a native cache pointer (Rec, Km) is NULL", who);
    if (int2_after_append(l).T > l->T && (l->T % 64 || l->gs > 64 && l->T % l->gs))
        return kvb_fail(KVB_EINVAL, "%s: this append flushes at T=%lld, which must be a multiple of max(64, gs=%d) for "
                        "the native layout's steps", who, (long long)l->T, l->gs);
    return append_impl(c, nat, knew, vnew, l, stream, who);
}

extern "C" int int2_dequantize(const int2_cache *c, kvb_bf16 *K, kvb_bf16 *V, int64_t L, const int2_layout *l,
                               cudaStream_t stream)
{
    const char *who = "int2_dequantize";
    int rc = int2_layout_check(l, who);
    if (rc) return rc;
    if (L < l->T + l->R)
        return kvb_fail(KVB_EINVAL, "%s: L=%lld out of range [T + R = %lld, inf)", who, (long long)L,
                        (long long)(l->T + l->R));
    if (!K || !V) return kvb_fail(KVB_EINVAL, "%s: K or V is NULL", who);
    const CachePtrs p = ptrs_of(c);
    const int64_t heads = (int64_t)l->B * l->Hkv;
    __nv_bfloat16 *Ko = reinterpret_cast<__nv_bfloat16 *>(K), *Vo = reinterpret_cast<__nv_bfloat16 *>(V);
    if (l->T > 0) {
        if ((rc = check_keys_present(c, who)) || (rc = check_values_present(c, who))) return rc;
        unsigned bk = 0, bv = 0;
        if ((rc = kvb_grid_x(who, "T/16*D (threads per head)", (l->T / 16) * l->D, 256, &bk)) ||
            (rc = kvb_grid_x(who, "T*D/16 (threads per head)", l->T * (l->D / 16), 256, &bv)))
            return rc;
        rc = kvb_grid_chunks(heads, [&](int64_t bh0, unsigned n) -> int {
            dequant_keys_kernel<<<dim3(bk, n), 256, 0, stream>>>(p, Ko, L, l->D, l->Tcap, l->T, l->gs, bh0);
            dequant_values_kernel<<<dim3(bv, n), 256, 0, stream>>>(p, Vo, L, l->D, l->Tcap, l->T, l->gs, bh0);
            CUDA_TRY(cudaGetLastError());
            return KVB_OK;
        });
        if (rc) return rc;
    }
    if (l->R > 0) {
        if (!c->Kr || !c->Vr) return kvb_fail(KVB_EINVAL, "%s: Kr or Vr is NULL", who);
        const unsigned br = (unsigned)(((int64_t)l->R * l->D / 8 + 255) / 256); // R < 128 + gs
        return kvb_grid_chunks(heads, [&](int64_t bh0, unsigned n) -> int {
            copy_residual_kernel<<<dim3(br, n), 256, 0, stream>>>(p, Ko, Vo, L, l->D, l->T, l->Rcap, l->R, bh0);
            CUDA_TRY(cudaGetLastError());
            return KVB_OK;
        });
    }
    return KVB_OK;
}

extern "C" int int2_qk(const kvb_bf16 *q, const int2_cache *c, float *scores, const int2_layout *l, cudaStream_t stream)
{
    const char *who = "int2_qk";
    int rc = check_fused(l, who);
    if (rc) return rc;
    if (l->T < 1)
        return kvb_fail(KVB_EINVAL, "%s: T=%lld out of range [gs = %d, Tcap = %lld]: no quantized tokens", who,
                        (long long)l->T, l->gs, (long long)l->Tcap);
    if ((rc = check_keys_present(c, who))) return rc;
    if (!q || !scores) return kvb_fail(KVB_EINVAL, "%s: q or scores is NULL", who);
    QKParams p;
    p.q = reinterpret_cast<const __nv_bfloat16 *>(q);
    p.c = ptrs_of(c);
    p.scores = scores;
    p.Hkv = l->Hkv, p.Hq = l->Hq, p.G = l->Hq / l->Hkv;
    p.Tcap = l->Tcap, p.T = l->T;
    const unsigned tiles = (unsigned)((l->T + TILE - 1) / TILE); // T <= 2^21: <= 8192
    return with_cfg(l->D, l->gs, [&](auto dc, auto gc) -> int {
        constexpr int D = decltype(dc)::value, GS = decltype(gc)::value;
        return kvb_grid_chunks((int64_t)l->B * l->Hkv, [&](int64_t head0, unsigned heads) -> int {
            p.head0 = head0;
            int2_qk_kernel<D, GS><<<dim3(tiles, heads), THREADS, qk_smem_bytes<D, GS>(), stream>>>(p);
            CUDA_TRY(cudaGetLastError());
            return KVB_OK;
        });
    });
}

extern "C" size_t int2_av_workspace_bytes(const int2_layout *l)
{
    if (int2_attn_check(l, "int2_av_workspace_bytes")) return 0;
    size_t off;
    return av_workspace(l, &off);
}

extern "C" int int2_av(const float *pr, const int2_cache *c, float *out, const int2_layout *l, void *workspace,
                       cudaStream_t stream)
{
    const char *who = "int2_av";
    int rc = check_fused(l, who);
    if (rc) return rc;
    if (l->T < 1)
        return kvb_fail(KVB_EINVAL, "%s: T=%lld out of range [gs = %d, Tcap = %lld]: no quantized tokens", who,
                        (long long)l->T, l->gs, (long long)l->Tcap);
    if ((rc = check_values_present(c, who))) return rc;
    if (!pr || !out) return kvb_fail(KVB_EINVAL, "%s: p or out is NULL", who);
    if (!workspace) return kvb_fail(KVB_EINVAL, "%s: workspace is NULL (allocate int2_av_workspace_bytes(), zeroed once)", who);
    AVParams p;
    size_t off;
    av_workspace(l, &off);
    p.p = pr;
    p.c = ptrs_of(c);
    p.out = out;
    p.Hkv = l->Hkv, p.Hq = l->Hq, p.G = l->Hq / l->Hkv;
    p.nsplit = av_splits(l);
    p.Tcap = l->Tcap, p.T = l->T, p.ntiles = (l->T + TILE - 1) / TILE;
    p.counters = reinterpret_cast<int *>(workspace);
    p.parts = reinterpret_cast<float *>(reinterpret_cast<char *>(workspace) + off);
    return with_cfg(l->D, l->gs, [&](auto dc, auto gc) -> int {
        constexpr int D = decltype(dc)::value, GS = decltype(gc)::value;
        constexpr size_t smem = av_smem_bytes<D, GS>();
        CUDA_TRY(cudaFuncSetAttribute(int2_av_kernel<D, GS>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        return kvb_grid_chunks((int64_t)l->B * l->Hkv, [&](int64_t head0, unsigned heads) -> int {
            p.head0 = head0; // nsplit <= 256 splits in grid.x
            int2_av_kernel<D, GS><<<dim3((unsigned)p.nsplit, heads), THREADS, smem, stream>>>(p);
            CUDA_TRY(cudaGetLastError());
            return KVB_OK;
        });
    });
}

static int check_native_matmul(const int2_layout *l, const int2_native *n, const char *who)
{
    int rc = check_fused(l, who);
    if (rc) return rc;
    if (l->T < 1)
        return kvb_fail(KVB_EINVAL, "%s: T=%lld out of range [gs = %d, Tcap = %lld]: no quantized tokens", who,
                        (long long)l->T, l->gs, (long long)l->Tcap);
    if (l->Tcap % 64)
        return kvb_fail(KVB_EINVAL, "%s: Tcap=%lld is not a multiple of 64 (the native layout's step)", who, (long long)l->Tcap);
    if (!n || !n->Rec || !n->Km) return kvb_fail(KVB_EINVAL, "%s: a native cache pointer (Rec, Km) is NULL", who);
    return KVB_OK;
}

extern "C" int int2_qk_native(const kvb_bf16 *q, const int2_native *n, float *scores, const int2_layout *l,
                              cudaStream_t stream)
{
    const char *who = "int2_qk_native";
    int rc = check_native_matmul(l, n, who);
    if (rc) return rc;
    if (!q || !scores) return kvb_fail(KVB_EINVAL, "%s: q or scores is NULL", who);
    v3::QKNativeParams p;
    p.q = reinterpret_cast<const __nv_bfloat16 *>(q);
    p.n.Rec = n->Rec, p.n.Km = reinterpret_cast<const __half *>(n->Km);
    p.scores = scores;
    p.Hkv = l->Hkv, p.Hq = l->Hq, p.G = l->Hq / l->Hkv;
    p.Tcap = l->Tcap, p.T = l->T;
    const unsigned blocks = (unsigned)((l->T + 64 * WARPS - 1) / (64 * WARPS)); // T <= 2^21: <= 8192
    return with_cfg(l->D, l->gs, [&](auto dc, auto gc) -> int {
        constexpr int D = decltype(dc)::value, GS = decltype(gc)::value;
        constexpr size_t smem = v3::qk_native_smem_bytes<D>(v3::Rec<D, GS>::BYTES);
        CUDA_TRY(cudaFuncSetAttribute(v3::qk_native_kernel<D, GS>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        return kvb_grid_chunks((int64_t)l->B * l->Hkv, [&](int64_t head0, unsigned heads) -> int {
            p.head0 = head0;
            v3::qk_native_kernel<D, GS><<<dim3(blocks, heads), THREADS, smem, stream>>>(p);
            CUDA_TRY(cudaGetLastError());
            return KVB_OK;
        });
    });
}

extern "C" int int2_av_native(const float *pr, const int2_native *n, float *out, const int2_layout *l, void *workspace,
                              cudaStream_t stream)
{
    const char *who = "int2_av_native";
    int rc = check_native_matmul(l, n, who);
    if (rc) return rc;
    if (!pr || !out) return kvb_fail(KVB_EINVAL, "%s: p or out is NULL", who);
    if (!workspace) return kvb_fail(KVB_EINVAL, "%s: workspace is NULL (allocate int2_av_workspace_bytes(), zeroed once)", who);
    v3::AVNativeParams p;
    size_t off;
    av_workspace(l, &off);
    p.p = pr;
    p.n.Rec = n->Rec, p.n.Km = reinterpret_cast<const __half *>(n->Km);
    p.out = out;
    p.Hkv = l->Hkv, p.Hq = l->Hq, p.G = l->Hq / l->Hkv;
    p.nsplit = av_splits(l); // <= the 256-token tiles <= the steps: no empty split
    p.Tcap = l->Tcap, p.T = l->T, p.nsteps = (l->T + 63) / 64;
    p.counters = reinterpret_cast<int *>(workspace);
    p.parts = reinterpret_cast<float *>(reinterpret_cast<char *>(workspace) + off);
    return with_cfg(l->D, l->gs, [&](auto dc, auto gc) -> int {
        constexpr int D = decltype(dc)::value, GS = decltype(gc)::value;
        constexpr size_t smem = v3::av_native_smem_bytes<D, GS>();
        CUDA_TRY(cudaFuncSetAttribute(v3::av_native_kernel<D, GS>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        return kvb_grid_chunks((int64_t)l->B * l->Hkv, [&](int64_t head0, unsigned heads) -> int {
            p.head0 = head0; // nsplit <= 256 splits in grid.x
            v3::av_native_kernel<D, GS><<<dim3((unsigned)p.nsplit, heads), THREADS, smem, stream>>>(p);
            CUDA_TRY(cudaGetLastError());
            return KVB_OK;
        });
    });
}

// The workspace serves every version: counters and the partials of up to `cap` blocks, the largest
// resident grid of any version.
extern "C" size_t int2_decode_attn_workspace_bytes(const int2_layout *l)
{
    if (int2_attn_check(l, "int2_decode_attn_workspace_bytes")) return 0;
    int cap = 0;
    for (int v : {ATTN_V2, ATTN_V1, ATTN_V3}) {
        int c = 0;
        if (attn_capacity_of(l, v, &c)) return 0;
        cap = c > cap ? c : cap;
    }
    size_t off;
    return attn_workspace(l, cap, &off);
}

// v3's A/B switches (read once): KVB_INT2_V3_EARLY=0 requests a segment's first records only after q is
// staged (before the residual steps); KVB_INT2_V3_GRID=stream keeps the plain stream-K grid
// (blocks straddling heads) instead of the head-aligned one.
// An A/B switch set to one value: KVB_INT2_V3_X=value.
static bool env_is(const char *name, const char *value)
{
    const char *e = getenv(name);
    return e && !strcmp(e, value);
}
// An on-by-default A/B switch: off only where the variable is set and starts with '0'.
static bool env_on(const char *name)
{
    const char *e = getenv(name);
    return !(e && e[0] == '0');
}
static bool v3_early()
{
    static const bool v = env_on("KVB_INT2_V3_EARLY");
    return v;
}
// v3's weight of a residual step in the stream-K split (KVB_INT2_V3_RW=1..4, default 4; an A/B switch,
// read once; 1 is the split as first built). A block doing a head's residual steps took ~14 us longer
// to reach its first 64-token step at 8K (their loads are not pipelined), and finished last; weighing
// each as 4 units gives that block fewer steps: on an H100, B=8 8K gs=16 48.1 -> 41.1 us, 32K gs=16
// 112.9 -> 109.7 us (results/h100/s12-int2-rw-*). At most 4: a segment spans 4 units or more (grid <= N / 8 rounded up, or the
// head-aligned grid with 8 or more per block), so one inside a head's residual part starts a residual
// step and no segment is empty.
static int v3_residual_weight()
{
    static int v = 0;
    if (!v) {
        const char *e = getenv("KVB_INT2_V3_RW");
        const int n = e ? atoi(e) : 4;
        v = n < 1 ? 1 : n > 4 ? 4 : n;
    }
    return v;
}
static bool v3_trace()
{
    static const bool v = getenv("KVB_INT2_V3_TRACE") && getenv("KVB_INT2_V3_TRACE")[0] == '1';
    return v;
}
// v3's merge through a cluster per head where the head-aligned grid gives each head 2 to 8 blocks
// (KVB_INT2_V3_CLUSTER=0: the global partials and arrival counter instead; an A/B switch, read once).
static bool v3_cluster()
{
    static const bool v = env_on("KVB_INT2_V3_CLUSTER");
    return v;
}
// v3 stores q's fragments after the residual steps, so that every warp waits for them at the block
// barrier (KVB_INT2_V3_FRAGS=late; an A/B switch against the default, before them).
static bool v3_frags_late()
{
    static const bool v = env_is("KVB_INT2_V3_FRAGS", "late");
    return v;
}
// v3's first fill: KVB_INT2_V3_FILL=n records per warp requested at the segment's start (clamped to
// 1..S-1), the rest of the ring's S - 1 once q is staged. Default: 1 where a segment holds at most 8
// steps a warp (T = 8K at B = 8), S - 1 elsewhere. A smaller first fill leaves shorter memory queues
// for the cold start's own requests (q, the kernel's code and parameters, all fetched from DRAM after
// the L2 flush), which delay a short segment's first step. On an H100 (results/h100/s15-int2-start/),
// 1 against 2 (S = 3 at gs >= 64): 8K gs=64 3.8% and gs=128 6.6% faster (r5); 32K gs=128 0.9% faster
// in one call (r1) and 2.5% slower in another (r4), so a longer segment keeps S - 1.
static int v3_fill0()
{
    static const int v = getenv("KVB_INT2_V3_FILL") ? atoi(getenv("KVB_INT2_V3_FILL")) : 0;
    return v < 0 ? 0 : v;
}
// v3's old q path (QW0=0) prefetches q into L2 before a segment's first records (KVB_INT2_V3_QPF=0:
// not; an A/B switch). On an H100, in one call, every case of the A/B 0.2-2.4% faster with it
// (results/h100/s15-int2-start/).
static bool v3_q_prefetch()
{
    static const bool v = env_on("KVB_INT2_V3_QPF");
    return v;
}
// v3's q by warp 0 alone (q_rows_issue, q_rows_finish; KVB_INT2_V3_QW0=0: stage_q by the block, then
// the fragments by warp 0 between two block barriers, the path a q not 16-byte aligned takes; an A/B
// switch, read once). On an H100 (results/h100/s16-int2-q/), the first step at 8K gs=128 4.6 us after
// the block's start instead of 6.9; against the old path in one bundle, 8K 2-6% and 32K gs=128 2-3%
// faster (r2).
static bool v3_q_warp0()
{
    static const bool v = env_on("KVB_INT2_V3_QW0");
    return v;
}
// v3's first fill before the block's first barrier, each warp's records statically (P.instant;
// KVB_INT2_V3_INSTANT=0: claimed from the shared counter after it; an A/B switch, read once). On an
// H100 (results/h100/s17-int2-instant/r2), against INSTANT=0 in one bundle: 8K gs=16-64 1.8-4.1%
// faster (gs=128: 7.5% and -0.5%), 32K 0.4-0.9%, B=1 128K (no clusters) level. q lands no sooner
// (its one request queues with the records'), but the records are in flight ~0.7 us earlier.
static bool v3_instant()
{
    static const bool v = env_on("KVB_INT2_V3_INSTANT");
    return v;
}
// v3's cluster merge by the last rank (P.merge_last; KVB_INT2_V3_MERGER=0: by rank 0; an A/B switch,
// read once). On an H100 (results/h100/s17-int2-instant/r7), against rank 0 in one bundle: 8K gs=16
// 1.2% faster, every other case within 1% either way; the 8K gs=128 trace ends 0.24 us sooner.
static bool v3_merge_last()
{
    static const bool v = env_on("KVB_INT2_V3_MERGER");
    return v;
}
// A diagnostic (KVB_INT2_V3_WARM=1, clusters only): each launch is preceded by one of the same kernel over
// the first head alone (one cluster; the same output rows), so that the kernel's code is in L2 when the
// launch that counts starts. Not for timing (the warm launch is inside the timed span): for the trace.
static bool v3_warm()
{
    static const bool v = getenv("KVB_INT2_V3_WARM") && getenv("KVB_INT2_V3_WARM")[0] == '1';
    return v;
}
// v3's cluster partial slots past the rings (P.slots_apart; KVB_INT2_V3_SLOTS=ring: over the merger's
// rings, as before; an A/B switch, read once). Where the launch's shared memory cannot take them
// (C G (D + 2) floats more), the slots go over the rings.
static bool v3_slots_apart()
{
    static const bool v = !env_is("KVB_INT2_V3_SLOTS", "ring");
    return v;
}
// v3's cluster barrier's first phase (P.slots_apart) waited early, once q is staged (default), or at the
// merge (KVB_INT2_V3_CWAIT=late, as before; an A/B switch, read once).
static bool v3_wait_early()
{
    static const bool v = !env_is("KVB_INT2_V3_CWAIT", "late");
    return v;
}
// v3's cluster merger arriving relaxed on the second phase (default), or with release as the others
// (KVB_INT2_V3_MREL=release, as before; an A/B switch, read once).
static bool v3_relaxed_merger()
{
    static const bool v = !env_is("KVB_INT2_V3_MREL", "release");
    return v;
}
// v3's cluster combine and merge with two channels a thread (default), or one (KVB_INT2_V3_CPT=1, as
// before; an A/B switch, read once).
static bool v3_pairs()
{
    static const bool v = !env_is("KVB_INT2_V3_CPT", "1");
    return v;
}
static bool v3_head_aligned()
{
    static const bool v = !env_is("KVB_INT2_V3_GRID", "stream");
    return v;
}

static int decode_attn_launch(const char *who, const kvb_bf16 *q, const int2_cache *c, kvb_bf16 *o,
                              const int2_layout *l, void *workspace, int version, cudaStream_t stream,
                              const int2_native *nat = nullptr)
{
    int rc = check_fused(l, who);
    if (rc) return rc;
    if (version == ATTN_V3) {
        if (!c) return kvb_fail(KVB_EINVAL, "%s: the cache (for its residual Kr, Vr) is NULL", who);
        if (l->T > 0 && (!nat || !nat->Rec || !nat->Km))
            return kvb_fail(KVB_EINVAL, "%s: a native cache pointer (Rec, Km) is NULL", who);
    } else if (l->T > 0 && ((rc = check_keys_present(c, who)) || (rc = check_values_present(c, who)))) {
        return rc;
    }
    if (l->R > 0 && (!c->Kr || !c->Vr)) return kvb_fail(KVB_EINVAL, "%s: Kr or Vr is NULL with R=%d", who, l->R);
    if (version == ATTN_V3 && l->T / 64 + 64 >= ((int64_t)1 << 31)) // v3 counts a head's steps in 32 bits
        return kvb_fail(KVB_EINVAL, "%s: T=%lld: v3 takes T < 64 (2^31 - 64) tokens", who, (long long)l->T);
    if (!q || !o) return kvb_fail(KVB_EINVAL, "%s: q or o is NULL", who);
    if (!workspace)
        return kvb_fail(KVB_EINVAL, "%s: workspace is NULL (allocate int2_decode_attn_workspace_bytes(), zeroed once)", who);
    int cap = 0;
    if ((rc = attn_capacity_of(l, version, &cap))) return rc;
    AttnParams p;
    size_t off;
    attn_workspace(l, cap, &off);
    p.q = reinterpret_cast<const __nv_bfloat16 *>(q);
    p.c = ptrs_of(c);
    p.o = reinterpret_cast<__nv_bfloat16 *>(o);
    p.Hkv = l->Hkv, p.Hq = l->Hq, p.G = l->Hq / l->Hkv;
    p.Rcap = l->Rcap, p.R = l->R;
    p.heads = (int64_t)l->B * l->Hkv, p.Tcap = l->Tcap, p.T = l->T;
    p.nr = (l->R + 15) / 16, p.nq = (l->T + 63) / 64;
    p.scale = LOG2E / sqrtf((float)l->D);
    p.counters = reinterpret_cast<int *>(workspace);
    p.parts = reinterpret_cast<float *>(reinterpret_cast<char *>(workspace) + off);
    const int64_t N = p.heads * (p.nr + p.nq), want = (N + 7) / 8;
    int grid = (int)(want < cap ? (want > 0 ? want : 1) : cap);
    // v3, head-aligned: a multiple of the heads, so that every block's part of the stream-K line lies in
    // one head (one segment: one q staging, one merge) instead of straddling two
    if (version == ATTN_V3 && v3_head_aligned() && grid == cap && p.heads <= cap) grid = (int)(p.heads * (cap / p.heads));
    return with_cfg(l->D, l->gs, [&](auto dc, auto gc) -> int {
        constexpr int D = decltype(dc)::value, GS = decltype(gc)::value;
        if (version == ATTN_V3) {
            v3::Params P;
            P.a = p;
            P.early = v3_early();
            P.rw = v3_residual_weight();
            P.frags_late = v3_frags_late();
            P.fill0 = v3_fill0();
            P.q_prefetch = v3_q_prefetch();
            P.q_warp0 = v3_q_warp0() && (uintptr_t)q % 16 == 0; // a bulk copy: 16-byte aligned
            P.instant = v3_instant();
            P.merge_last = v3_merge_last();
            if (nat) {
                P.n.Rec = nat->Rec, P.n.Km = reinterpret_cast<const __half *>(nat->Km);
            } else {
                P.n = v3::NativePtrs{};
            }
            void (*kernel)(v3::Params) = v3_trace() ? v3::attn_kernel<D, GS, true> : v3::attn_kernel<D, GS>;
            const size_t smem = v3::smem_bytes<D, GS>();
            CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            cudaLaunchConfig_t cfg = {};
            cfg.gridDim = dim3((unsigned)grid);
            cfg.blockDim = dim3(v3::NT);
            cfg.dynamicSmemBytes = smem;
            cfg.stream = stream;
            cudaLaunchAttribute attr[1];
            // a cluster per head: the head-aligned grid with 2 to 8 blocks per head (one segment each), if
            // that many clusters can be resident at once (one wave, as the stream-K grid assumes)
            const int64_t bph = grid % p.heads == 0 ? grid / p.heads : 0;
            P.cluster = 0, P.slots_apart = 0, P.wait_early = 0, P.relaxed_merger = v3_relaxed_merger(), P.pairs = v3_pairs();
            // (the kernel splits a head among its cluster in 32 bits: bph (nr rw + nq) < 2^31)
            const int64_t per_head = p.nr * P.rw + p.nq;
            if (version == ATTN_V3 && v3_cluster() && v3_head_aligned() && bph >= 2 && bph <= 8 && per_head >= bph &&
                bph * per_head < ((int64_t)1 << 31)) {
                attr[0].id = cudaLaunchAttributeClusterDimension;
                attr[0].val.clusterDim.x = (unsigned)bph, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
                cfg.attrs = attr, cfg.numAttrs = 1;
                // the partial slots past the rings where the block's shared memory takes them (the device's
                // opt-in limit refuses the attribute otherwise: then over the rings)
                if (v3_slots_apart()) {
                    const size_t apart = smem + sizeof(float) * (size_t)bph * p.G * (D + 2);
                    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)apart) == cudaSuccess)
                        cfg.dynamicSmemBytes = apart, P.slots_apart = 1, P.wait_early = v3_wait_early();
                    else
                        (void)cudaGetLastError();
                }
                // resident clusters of this instance, size and shared memory on this device, asked once (not
                // on every launch) for the first 16 such shapes of the process
                struct Known { int dev, trace, D, GS, bph; size_t smem; int n; };
                static Known known[16];
                static int n_known = 0;
                int dev = 0, n = -1;
                CUDA_TRY(cudaGetDevice(&dev));
                for (int i = 0; i < n_known && n < 0; i++)
                    if (known[i].dev == dev && known[i].trace == (int)v3_trace() && known[i].D == D && known[i].GS == GS &&
                        known[i].bph == (int)bph && known[i].smem == cfg.dynamicSmemBytes)
                        n = known[i].n;
                if (n < 0) {
                    CUDA_TRY(cudaOccupancyMaxActiveClusters(&n, kernel, &cfg));
                    if (n_known < 16) known[n_known++] = Known{dev, (int)v3_trace(), D, GS, (int)bph, cfg.dynamicSmemBytes, n};
                }
                if ((int64_t)n * bph >= grid) {
                    P.cluster = (int)bph;
                } else {
                    cfg.attrs = nullptr, cfg.numAttrs = 0, cfg.dynamicSmemBytes = smem, P.slots_apart = 0;
                }
            }
            if (v3_warm() && P.cluster > 1) {
                cudaLaunchConfig_t warm = cfg;
                warm.gridDim = dim3((unsigned)P.cluster);
                CUDA_TRY(cudaLaunchKernelEx(&warm, kernel, P));
            }
            CUDA_TRY(cudaLaunchKernelEx(&cfg, kernel, P));
            return KVB_OK;
        }
        void (*kernel)(AttnParams);
        size_t smem;
        attn_kernel_of<D, GS>(version, &kernel, &smem);
        kernel<<<grid, THREADS, smem, stream>>>(p);
        CUDA_TRY(cudaGetLastError());
        return KVB_OK;
    });
}

extern "C" int int2_decode_attn(const kvb_bf16 *q, const int2_cache *c, kvb_bf16 *o, const int2_layout *l,
                                void *workspace, cudaStream_t stream)
{
    return decode_attn_launch("int2_decode_attn", q, c, o, l, workspace, ATTN_V2, stream);
}

extern "C" int int2_decode_attn_v1(const kvb_bf16 *q, const int2_cache *c, kvb_bf16 *o, const int2_layout *l,
                                   void *workspace, cudaStream_t stream)
{
    return decode_attn_launch("int2_decode_attn_v1", q, c, o, l, workspace, ATTN_V1, stream);
}

extern "C" int int2_decode_attn_v3(const kvb_bf16 *q, const int2_cache *c, const int2_native *n, kvb_bf16 *o,
                                   const int2_layout *l, void *workspace, cudaStream_t stream)
{
    return decode_attn_launch("int2_decode_attn_v3", q, c, o, l, workspace, ATTN_V3, stream, n);
}

extern "C" int int2_to_native(const int2_cache *c, const int2_native *n, const int2_layout *l, int64_t t0, int64_t t1,
                              cudaStream_t stream)
{
    const char *who = "int2_to_native";
    int rc = int2_layout_check(l, who);
    if (rc) return rc;
    if (l->Tcap % 64)
        return kvb_fail(KVB_EINVAL, "%s: Tcap=%lld is not a multiple of 64 (the native layout's step)", who,
                        (long long)l->Tcap);
    if (t0 < 0 || t1 < t0 || t1 > l->Tcap)
        return kvb_fail(KVB_EINVAL, "%s: tokens [%lld, %lld) out of range: 0 <= t0 <= t1 <= Tcap = %lld", who,
                        (long long)t0, (long long)t1, (long long)l->Tcap);
    if ((rc = check_keys_present(c, who)) || (rc = check_values_present(c, who))) return rc;
    if (!n || !n->Rec || !n->Km) return kvb_fail(KVB_EINVAL, "%s: a native cache pointer (Rec, Km) is NULL", who);
    if (t1 == t0) return KVB_OK;
    v3::PackParams p;
    p.c = ptrs_of(c);
    p.Rec = n->Rec, p.Km = reinterpret_cast<__half *>(n->Km);
    p.D = l->D, p.gs = l->gs, p.Tcap = l->Tcap, p.s0 = t0 / 64;
    const int64_t steps = (t1 + 63) / 64 - p.s0, heads = (int64_t)l->B * l->Hkv;
    return kvb_grid_chunks(heads, [&](int64_t head0, unsigned nh) -> int {
        // one launch per chunk of heads: offset the head through the pointers' base (heads are outermost)
        v3::PackParams q = p;
        const int64_t kw = l->D * (l->Tcap / 16), km = l->D * (l->Tcap / l->gs), vw = l->Tcap * (l->D / 16),
                      vm = l->Tcap * (l->D / l->gs);
        q.c.Kq += head0 * kw, q.c.Ks += head0 * km, q.c.Kz += head0 * km;
        q.c.Vq += head0 * vw, q.c.Vs += head0 * vm, q.c.Vz += head0 * vm;
        q.Rec += head0 * (l->Tcap / 64) * int2_native_rec_words(l);
        q.Km += head0 * 2 * km;
        v3::to_native_kernel<<<dim3((unsigned)steps, nh), 256, 0, stream>>>(q);
        CUDA_TRY(cudaGetLastError());
        return KVB_OK;
    });
}

extern "C" int int2_quantize_native(const kvb_bf16 *K, const kvb_bf16 *V, int64_t src_len, int64_t n, int64_t t0,
                                    const int2_native *nat, const int2_layout *l, cudaStream_t stream)
{
    const char *who = "int2_quantize_native";
    int rc = int2_layout_check(l, who);
    if (rc) return rc;
    const int64_t CH = l->gs > 64 ? l->gs : 64;
    if (l->Tcap % 64)
        return kvb_fail(KVB_EINVAL, "%s: Tcap=%lld is not a multiple of 64 (the native layout's step)", who, (long long)l->Tcap);
    if (n < 0 || n % CH || t0 < 0 || t0 % CH || t0 + n > l->Tcap)
        return kvb_fail(KVB_EINVAL, "%s: tokens n=%lld at t0=%lld out of range: both multiples of max(64, gs) = %lld, "
                        "t0 + n <= Tcap = %lld", who, (long long)n, (long long)t0, (long long)CH, (long long)l->Tcap);
    if (src_len < n) return kvb_fail(KVB_EINVAL, "%s: src_len=%lld < n=%lld", who, (long long)src_len, (long long)n);
    if (!K || !V) return kvb_fail(KVB_EINVAL, "%s: K or V is NULL", who);
    if (!nat || !nat->Rec || !nat->Km) return kvb_fail(KVB_EINVAL, "%s: a native cache pointer (Rec, Km) is NULL", who);
    if (n == 0) return KVB_OK;
    v3::QuantNativeParams p;
    p.K = reinterpret_cast<const __nv_bfloat16 *>(K), p.V = reinterpret_cast<const __nv_bfloat16 *>(V);
    p.src_len = src_len, p.t0 = t0, p.Tcap = l->Tcap, p.gs = l->gs;
    p.Rec = nat->Rec, p.Km = reinterpret_cast<__half *>(nat->Km);
    const size_t smem = v3::QnLayout(l->D, l->gs).bytes; // bf16 pairs, float and fp16 metadata
    const int64_t chunks = n / CH, heads = (int64_t)l->B * l->Hkv;
    auto run = [&](auto kernel) -> int {
        CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        return kvb_grid_chunks(heads, [&](int64_t head0, unsigned nh) -> int {
            v3::QuantNativeParams q = p; // one launch per chunk of heads: the head offset through the pointers
            q.K += head0 * src_len * l->D, q.V += head0 * src_len * l->D;
            q.Rec += head0 * (l->Tcap / 64) * int2_native_rec_words(l);
            q.Km += head0 * (l->Tcap / l->gs) * 2 * l->D;
            kernel<<<dim3((unsigned)chunks, nh), 256, smem, stream>>>(q);
            CUDA_TRY(cudaGetLastError());
            return KVB_OK;
        });
    };
    return l->D == 64 ? run(v3::quant_native_kernel<64>) : run(v3::quant_native_kernel<128>);
}

// Host self-test of the v2 copy plans for every (D, gs): the number of violations (0: good).
extern "C" long int2_v2_plan_selftest(void)
{
    using namespace v2;
    return plan_selftest<64, 16>() + plan_selftest<64, 32>() + plan_selftest<64, 64>() + plan_selftest<128, 16>() +
           plan_selftest<128, 32>() + plan_selftest<128, 64>() + plan_selftest<128, 128>();
}
