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
//   head) would need 3-4x that, so the products run on the tensor cores (fp16, fp32 accumulate) and the
//   dequant is ~2 instructions per value: LOP3 places two 2-bit codes in the mantissas of an fp16 pair
//   (1024 + c), HSUB2 removes the 1024 (exact), HFMA2 applies scale and zero (one rounding: the fp16
//   nearest to code*scale + zero). Estimated ~22 warp instructions per token: about half the issue
//   budget.
//   Quantize (keys and values of T tokens): reads 2 B per element, writes 0.25 B of codes and 4/gs B of
//   metadata: at T=32K, B=8: 1.07 GB read + 0.4 GB written, floor ~345 us; the 70% goal <= ~490 us.
//
// Fused-kernel design (int2_decode_attn; int2_qk and int2_av reuse its halves):
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
#include <type_traits>

#include "attn_device.h"
#include "int2.h"

using namespace kvb_attn;

#define CUDA_TRY(call)                                                                             \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            return kvb_fail(KVB_EDEVICE, "%s failed: %s (%s:%d)", #call, cudaGetErrorString(e_),   \
                            __FILE__, __LINE__);                                                   \
    } while (0)

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

__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, bool pred)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(pred ? 16 : 0));
}
__device__ __forceinline__ void cp_async8(void *smem, const void *gmem)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_async4(void *smem, const void *gmem)
{
    const unsigned s = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

__device__ __forceinline__ uint32_t bits_of(__nv_bfloat162 v) { return *reinterpret_cast<uint32_t *>(&v); }
__device__ __forceinline__ __nv_bfloat162 bf2_of(uint32_t u) { return *reinterpret_cast<__nv_bfloat162 *>(&u); }

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
                                                                  int64_t Tcap, int gs)
{
    constexpr int PAIRS = D / 2, NCH = PAIRS / 4; // 32-bit pairs per token, 16-byte chunks per token
    __shared__ __align__(16) uint32_t tile[QK_TILE * PAIRS]; // 32 KB (D=128) or 16 KB (D=64)
    const int tid = threadIdx.x;
    const int64_t bh = blockIdx.y, tile0 = (int64_t)blockIdx.x * QK_TILE;
    const int ntile = (int)min((int64_t)QK_TILE, n - tile0); // a multiple of gs
    const __nv_bfloat16 *src = K + (bh * src_len + tile0) * D;
    for (int c = tid; c < ntile * NCH; c += QK_THREADS) {
        const int t = c / NCH, ch = c % NCH;
        cp_async16(&tile[t * PAIRS + ((ch ^ ((t >> 4) & (NCH - 1))) << 2)], src + (int64_t)t * D + ch * 8, true);
    }
    cp_commit();
    cp_wait<0>();
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
            w0 |= code_of(__uint_as_float(x[i] << 16), sf0, zf0, r0) << (2 * i);
            w1 |= code_of(__uint_as_float(x[i] & 0xFFFF0000u), sf1, zf1, r1) << (2 * i);
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
                                                                    int64_t Tcap, int gs)
{
    constexpr int WPT = D / 16; // code words per token
    const int64_t bh = blockIdx.y;
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
            word |= code_of(__uint_as_float(u[i] << 16), sf, zf, r) << (4 * i);
            word |= code_of(__uint_as_float(u[i] & 0xFFFF0000u), sf, zf, r) << (4 * i + 2);
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
__global__ void dequant_keys_kernel(CachePtrs c, __nv_bfloat16 *K, int64_t L, int D, int64_t Tcap, int64_t T, int gs)
{
    const int64_t bh = blockIdx.y;
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

__global__ void dequant_values_kernel(CachePtrs c, __nv_bfloat16 *V, int64_t L, int D, int64_t Tcap, int64_t T, int gs)
{
    const int64_t bh = blockIdx.y;
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
                                     int Rcap, int R)
{
    const int64_t bh = blockIdx.y;
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
    else if constexpr (BYTES_ == 8) cp_async8(smem, gmem);
    else cp_async4(smem, gmem);
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

// q rows of one KV head's G query heads into shared memory (fp32) and, per head, the power of two
// that brings max |q| into [2^14, 2^15) (f_s) and its inverse (u_s).
__device__ __forceinline__ void stage_q(float *q_s, float *f_s, float *u_s, const __nv_bfloat16 *qh, int G, int D,
                                        int tid)
{
    for (int idx = tid; idx < G * D; idx += THREADS) q_s[idx] = __bfloat162float(qh[idx]);
    __syncthreads();
    const int warp = tid >> 5, lane = tid & 31;
    for (int h = warp; h < G; h += WARPS) {
        float mx = 0.f;
        for (int c = lane; c < D; c += 32) mx = fmaxf(mx, fabsf(q_s[h * D + c]));
#pragma unroll
        for (int off = 16; off; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
        int e = 0;
        if (mx > 0.f) {
            int E;
            frexpf(mx, &E); // mx in [2^(E-1), 2^E)
            e = 15 - E;
        }
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
            cp_commit();
            for (int tile = ta0; tile <= ta1; tile++) {
                const unsigned char *buf = smem + ((tile - ta0) & 1) * BUF;
                if (tile < ta1) {
                    load_tile<D, GS>(smem + ((tile - ta0 + 1) & 1) * BUF, p.c, head, tile + 1, p.T, p.Tcap, true, true, tid);
                    cp_commit();
                    cp_wait<1>();
                } else {
                    cp_wait<0>();
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

// ---- int2_qk: one block per (256-token tile, head) ----

struct QKParams {
    const __nv_bfloat16 *q;
    CachePtrs c;
    float *scores;
    int Hkv, Hq, G;
    int64_t Tcap, T;
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
    const int64_t head = blockIdx.y, b = head / p.Hkv;
    const int kvh = (int)(head % p.Hkv), G = p.G;
    load_tile<D, GS>(smem, p.c, head, tile, p.T, p.Tcap, true, false, tid);
    cp_commit();
    stage_q(q_s, f_s, u_s, p.q + (b * p.Hq + (int64_t)kvh * G) * D, G, D, tid); // while the tile lands
    cp_wait<0>();
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
    const int64_t split = blockIdx.x, head = blockIdx.y, b = head / p.Hkv;
    const int kvh = (int)(head % p.Hkv), G = p.G;
    const int tile_a = (int)(split * p.ntiles / p.nsplit), tile_b = (int)((split + 1) * p.ntiles / p.nsplit);
    const float *prow = p.p + (b * p.Hq + (int64_t)kvh * G + g) * p.T; // head g of the thread's B column
    float o[MT][4];
#pragma unroll
    for (int m = 0; m < MT; m++) o[m][0] = o[m][1] = o[m][2] = o[m][3] = 0.f;
    int e_run = 127; // O columns of head g are scaled by 2^e_run: p values enter fp16 below 2^15
    for (int tile = tile_a; tile < tile_b; tile++) {
        load_tile<D, GS>(smem, p.c, head, tile, p.T, p.Tcap, false, true, tid);
        cp_commit();
        cp_wait<0>();
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
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
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
    float *out = p.out + (b * p.Hq + (int64_t)kvh * G) * D;
    if (p.nsplit == 1) {
        for (int idx = tid; idx < G * D; idx += THREADS)
            out[idx] = o_s[0][idx / D][idx % D] + o_s[1][idx / D][idx % D] + o_s[2][idx / D][idx % D] +
                       o_s[3][idx / D][idx % D];
        return;
    }
    float *part = p.parts + (head * p.nsplit + split) * G * D;
    for (int idx = tid; idx < G * D; idx += THREADS)
        part[idx] = o_s[0][idx / D][idx % D] + o_s[1][idx / D][idx % D] + o_s[2][idx / D][idx % D] + o_s[3][idx / D][idx % D];
    __threadfence();
    __syncthreads();
    if (tid == 0) flag_s = atomicAdd(&p.counters[head], 1) == p.nsplit - 1;
    __syncthreads();
    if (!flag_s) return;
    __threadfence();
    for (int idx = tid; idx < G * D; idx += THREADS) {
        float v = 0.f;
        for (int sp = 0; sp < p.nsplit; sp++) v += __ldcg(p.parts + (head * p.nsplit + sp) * G * D + idx);
        out[idx] = v;
    }
    if (tid == 0) p.counters[head] = 0;
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

int attn_capacity_of(const int2_layout *l, int *cap)
{
    return with_cfg(l->D, l->gs, [&](auto dc, auto gc) -> int {
        constexpr int D = decltype(dc)::value, GS = decltype(gc)::value;
        constexpr size_t smem = attn_smem_bytes<D, GS>();
        auto kernel = int2_attn_kernel<D, GS>;
        CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        int per_sm = 0;
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
    dim3 grid((unsigned)((n + QK_TILE - 1) / QK_TILE), (unsigned)(l->B * l->Hkv));
    const __nv_bfloat16 *src = reinterpret_cast<const __nv_bfloat16 *>(K);
    __half *Ks = reinterpret_cast<__half *>(c->Ks), *Kz = reinterpret_cast<__half *>(c->Kz);
    if (l->D == 64) quant_keys_kernel<64><<<grid, QK_THREADS, 0, stream>>>(src, src_len, n, t0, c->Kq, Ks, Kz, l->Tcap, l->gs);
    else quant_keys_kernel<128><<<grid, QK_THREADS, 0, stream>>>(src, src_len, n, t0, c->Kq, Ks, Kz, l->Tcap, l->gs);
    CUDA_TRY(cudaGetLastError());
    return KVB_OK;
}

extern "C" int int2_quantize_values(const kvb_bf16 *V, int64_t src_len, int64_t n, int64_t t0, const int2_cache *c,
                                    const int2_layout *l, cudaStream_t stream)
{
    const char *who = "int2_quantize_values";
    int rc = int2_span_check(l, src_len, n, t0, who);
    if (rc) return rc;
    if (!V || (rc = check_values_present(c, who))) return rc ? rc : kvb_fail(KVB_EINVAL, "%s: V is NULL", who);
    if (n == 0) return KVB_OK;
    const int64_t threads = n * (l->D / 16);
    dim3 grid((unsigned)((threads + QV_THREADS - 1) / QV_THREADS), (unsigned)(l->B * l->Hkv));
    const __nv_bfloat16 *src = reinterpret_cast<const __nv_bfloat16 *>(V);
    __half *Vs = reinterpret_cast<__half *>(c->Vs), *Vz = reinterpret_cast<__half *>(c->Vz);
    if (l->D == 64) quant_values_kernel<64><<<grid, QV_THREADS, 0, stream>>>(src, src_len, n, t0, c->Vq, Vs, Vz, l->Tcap, l->gs);
    else quant_values_kernel<128><<<grid, QV_THREADS, 0, stream>>>(src, src_len, n, t0, c->Vq, Vs, Vz, l->Tcap, l->gs);
    CUDA_TRY(cudaGetLastError());
    return KVB_OK;
}

extern "C" int int2_append(const int2_cache *c, const kvb_bf16 *knew, const kvb_bf16 *vnew, const int2_layout *l,
                           cudaStream_t stream)
{
    const char *who = "int2_append";
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
    const unsigned heads = (unsigned)(l->B * l->Hkv);
    __nv_bfloat16 *Ko = reinterpret_cast<__nv_bfloat16 *>(K), *Vo = reinterpret_cast<__nv_bfloat16 *>(V);
    if (l->T > 0) {
        if ((rc = check_keys_present(c, who)) || (rc = check_values_present(c, who))) return rc;
        const int64_t nk = (l->T / 16) * l->D, nv = l->T * (l->D / 16);
        dequant_keys_kernel<<<dim3((unsigned)((nk + 255) / 256), heads), 256, 0, stream>>>(p, Ko, L, l->D, l->Tcap, l->T, l->gs);
        dequant_values_kernel<<<dim3((unsigned)((nv + 255) / 256), heads), 256, 0, stream>>>(p, Vo, L, l->D, l->Tcap, l->T, l->gs);
        CUDA_TRY(cudaGetLastError());
    }
    if (l->R > 0) {
        if (!c->Kr || !c->Vr) return kvb_fail(KVB_EINVAL, "%s: Kr or Vr is NULL", who);
        const int64_t n = (int64_t)l->R * l->D / 8;
        copy_residual_kernel<<<dim3((unsigned)((n + 255) / 256), heads), 256, 0, stream>>>(p, Ko, Vo, L, l->D, l->T,
                                                                                           l->Rcap, l->R);
        CUDA_TRY(cudaGetLastError());
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
    dim3 grid((unsigned)((l->T + TILE - 1) / TILE), (unsigned)(l->B * l->Hkv));
    return with_cfg(l->D, l->gs, [&](auto dc, auto gc) -> int {
        constexpr int D = decltype(dc)::value, GS = decltype(gc)::value;
        int2_qk_kernel<D, GS><<<grid, THREADS, qk_smem_bytes<D, GS>(), stream>>>(p);
        CUDA_TRY(cudaGetLastError());
        return KVB_OK;
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
    dim3 grid((unsigned)p.nsplit, (unsigned)(l->B * l->Hkv));
    return with_cfg(l->D, l->gs, [&](auto dc, auto gc) -> int {
        constexpr int D = decltype(dc)::value, GS = decltype(gc)::value;
        constexpr size_t smem = av_smem_bytes<D, GS>();
        CUDA_TRY(cudaFuncSetAttribute(int2_av_kernel<D, GS>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        int2_av_kernel<D, GS><<<grid, THREADS, smem, stream>>>(p);
        CUDA_TRY(cudaGetLastError());
        return KVB_OK;
    });
}

extern "C" size_t int2_decode_attn_workspace_bytes(const int2_layout *l)
{
    if (int2_attn_check(l, "int2_decode_attn_workspace_bytes")) return 0;
    int cap = 0;
    if (attn_capacity_of(l, &cap)) return 0;
    size_t off;
    return attn_workspace(l, cap, &off);
}

extern "C" int int2_decode_attn(const kvb_bf16 *q, const int2_cache *c, kvb_bf16 *o, const int2_layout *l,
                                void *workspace, cudaStream_t stream)
{
    const char *who = "int2_decode_attn";
    int rc = check_fused(l, who);
    if (rc) return rc;
    if (l->T > 0 && ((rc = check_keys_present(c, who)) || (rc = check_values_present(c, who)))) return rc;
    if (l->R > 0 && (!c->Kr || !c->Vr)) return kvb_fail(KVB_EINVAL, "%s: Kr or Vr is NULL with R=%d", who, l->R);
    if (!q || !o) return kvb_fail(KVB_EINVAL, "%s: q or o is NULL", who);
    if (!workspace)
        return kvb_fail(KVB_EINVAL, "%s: workspace is NULL (allocate int2_decode_attn_workspace_bytes(), zeroed once)", who);
    int cap = 0;
    if ((rc = attn_capacity_of(l, &cap))) return rc;
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
    const int grid = (int)(want < cap ? (want > 0 ? want : 1) : cap);
    return with_cfg(l->D, l->gs, [&](auto dc, auto gc) -> int {
        constexpr int D = decltype(dc)::value, GS = decltype(gc)::value;
        constexpr size_t smem = attn_smem_bytes<D, GS>();
        int2_attn_kernel<D, GS><<<grid, THREADS, smem, stream>>>(p);
        CUDA_TRY(cudaGetLastError());
        return KVB_OK;
    });
}

