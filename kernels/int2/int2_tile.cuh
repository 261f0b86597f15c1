// int2_tile.cuh: the interchange cache read in 256-token tiles through shared memory, the codes
// dequantized to fp16 before each MMA: the tile loader and the two products shared by int2_decode_attn v1
// (int2_decode_v1.cu) and by int2_qk, int2_av (int2_qk_av.cu). Internal to kernels/int2/.
#ifndef KVB_KERNELS_INT2_TILE_CUH
#define KVB_KERNELS_INT2_TILE_CUH

#include "kernels/int2/int2_device.cuh"

namespace {

// ================================================================================================
// Fused dequant-matmul: 256-token tiles in shared memory, layouts fixed at compile time per (D, gs)
// ================================================================================================

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

} // namespace

#endif
