// int2_decode_v2.cu: int2_decode_attn_v2, the codes as exact small integers on the tensor cores, over the
// interchange layout; kept as a same-run peer of the production v3 (int2_decode.cu). kernels/int2/NOTES.md
// has the family's design and the measurements.
//
//   v1 dequantizes every code to an fp16 value before its MMA (SHF + LOP3 + HSUB2 + HFMA2 per pair of
//   values). v2 feeds the codes to the tensor cores as exact small integers and moves the scales and
//   zeros out of the per-element work:
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
//   ~10 cycles).
//   Metadata layouts (the pass transposes them in place; details at Lay below): key scales/zeros
//   [group][channel in k order], value scales/zeros [group][token in k order], so that each B fragment's
//   scale pairs are one 8-byte load. 3 tile buffers (two tiles in flight), 2 blocks per SM (219
//   registers). Each step's AV products accumulate from zero and are added in fp32 (long tensor-core
//   accumulation chains over the all-positive code sums failed rel L2 at T=128K).
#include <vector>

#include "kernels/int2/int2_step.cuh"

namespace {

// ================================================================================================
// int2_decode_attn v2: the codes enter the tensor cores as exact small integers; the scales and zeros
// leave the inner loop (folded into q and p per quantization group).
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

// Per-thread constants. The A fragments of both products are built the same way: row g of an m-tile
// is element 2g of a 16-element code word, row g+8 element 2g+1; one PRMT takes byte g/2 of two
// words (the two k of a register), one LOP3 (code2) keeps one 2-bit code in each 16-bit half: the fp16
// whose bits are c << sh, i.e. the exact integer c times 2^(sh-24) (a subnormal; sh = 4(g&1) for row g,
// 4(g&1) + 2 for row g+8). rf[r] undoes the row scale (r = 0: row g, 1: row g+8). (1024 + c 2^sh with an
// HSUB2 to remove the 1024 gives the same results and was slower: kernels/int2/NOTES.md.)
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

__device__ __forceinline__ uint32_t word_of(const uint4 &v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

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
    // (The hi half alone was faster but used most of the spiky case's tolerance: kernels/int2/NOTES.md.)
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
    // zeros' sums, and long tensor-core accumulation chains (truncating; at T=128K, ~125 steps per warp,
    // they failed the rel L2 bound) bias them.
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
        dense_step<D>(st, qb, r, nv, scale, lane, [=](int, __nv_bfloat162 &f0, __nv_bfloat162 &f1) {
            f0 = bf2_of(vs0), f1 = bf2_of(vs1);
        });
    }
    return st;
}

template <int D>
__device__ __noinline__ void finish(const MergeSmem<D> &ms, int G, int64_t head, int64_t first, int64_t last, int64_t k,
                                    float *parts, int *counters, __nv_bfloat16 *out, int *flag_s, int tid)
{
    finish_head<D>(ms, G, head, first, last, k, parts, counters, out, flag_s, tid);
}

// Tile buffers: STAGES of them (two tiles in flight while one computes, at 2 blocks per SM), the merge
// buffer aliasing them. (Registers for 3 blocks per SM spill and leave shared memory for 2 buffers only:
// slower, kernels/int2/NOTES.md.)
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
    float *qf_area = q_s + MAXG * D, *f_s = qf_area + 64 * MAXG, *u_s = f_s + MAXG;
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
            uint2 *qf_s = reinterpret_cast<uint2 *>(qf_area); // the fragments of q (64 x MAXG floats of room)
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
        finish<D>(ms, G, head, first, last, kb, p.parts, p.counters, p.o + (b * p.Hq + (int64_t)kvh * G) * D,
                  &flag_s, tid);
        u = hoff + s1;
    }
    (void)g;
}

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

int capacity(const int2_layout *l, int *cap)
{
    return with_cfg(l->D, l->gs, [&](auto dc, auto gc) -> int {
        constexpr int D = decltype(dc)::value, GS = decltype(gc)::value;
        return resident_blocks(attn_kernel<D, GS>, THREADS, smem_bytes<D, GS>(), cap);
    });
}
} // namespace v2
} // namespace

const int2_internal::DecodeVersion int2_internal::decode_v2 = {"v2", v2::capacity};

extern "C" int int2_decode_attn_v2(const kvb_bf16 *q, const int2_cache *c, kvb_bf16 *o, const int2_layout *l,
                                   void *workspace, cudaStream_t stream)
{
    const char *who = "int2_decode_attn_v2";
    int rc = check_fused(l, who);
    if (rc) return rc;
    if (l->T > 0 && ((rc = check_keys_present(c, who)) || (rc = check_values_present(c, who)))) return rc;
    if ((rc = decode_check(who, q, c, o, l, workspace))) return rc;
    int cap = 0, grid = 0;
    if ((rc = v2::capacity(l, &cap))) return rc;
    const AttnParams p = decode_params(q, c, o, l, workspace, cap, &grid);
    return with_cfg(l->D, l->gs, [&](auto dc, auto gc) -> int {
        constexpr int D = decltype(dc)::value, GS = decltype(gc)::value;
        v2::attn_kernel<D, GS><<<grid, THREADS, v2::smem_bytes<D, GS>(), stream>>>(p);
        CUDA_TRY(cudaGetLastError());
        return KVB_OK;
    });
}

// Host self-test of the v2 copy plans for every (D, gs): the number of violations (0: good).
extern "C" long int2_v2_plan_selftest(void)
{
    using namespace v2;
    return plan_selftest<64, 16>() + plan_selftest<64, 32>() + plan_selftest<64, 64>() + plan_selftest<128, 16>() +
           plan_selftest<128, 32>() + plan_selftest<128, 64>() + plan_selftest<128, 128>();
}
