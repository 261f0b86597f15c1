// int2_step.cuh: the codes as exact small integers on the tensor cores: v2's warp state, online softmax
// and fragment helpers, and v3's 64-token step record (the kernel-native layout) with its scores and value
// sums, shared by int2_decode_attn v2 (int2_decode_v2.cu), v3 (int2_decode.cu) and int2_qk_native,
// int2_av_native (int2_qk_av.cu). Internal to kernels/int2/.
#ifndef KVB_KERNELS_INT2_STEP_CUH
#define KVB_KERNELS_INT2_STEP_CUH

#include "kernels/int2/int2_device.cuh"

namespace {
namespace v2 {

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
    float b0, b1, a0, a1;
    kvb_attn::running_max<NT>(st.m, s, b0, b1, a0, a1);
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
    kvb_attn::dense_load_k<D>(r.k0, r.k8, K, tok0, nvalid, lane);
#pragma unroll
    for (int q = 0; q < 4; q++) {
        const int tk = 2 * t + (q & 1) + 8 * (q >> 1);
        const bool ok = tk < nvalid;
        const uint32_t *row = reinterpret_cast<const uint32_t *>(V + (tok0 + tk) * D) + g;
#pragma unroll
        for (int mv = 0; mv < D / 16; mv++) r.v[q][mv] = ok ? __ldg(row + 8 * mv) : 0u;
    }
}

// One 16-token step of the bf16 residual: its scores, the online softmax (sums in st.l) and the
// values, the V rows of m-tile mv scaled by the bf16 pair vscale(mv, f0, f1) gives (exact powers of two:
// the O^T units of the quantized tokens).
template <int D, class VScale>
__device__ __forceinline__ void dense_step(State<D / 16> &st, const uint32_t (&qb)[D / 16][2], const Dense<D> &r,
                                           int nvalid, float scale, int lane, VScale vscale)
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
#pragma unroll
    for (int mv = 0; mv < MT; mv++) {
        __nv_bfloat162 f0, f1;
        vscale(mv, f0, f1);
        const uint32_t a0 = bits_of(__hmul2(bf2_of(__byte_perm(r.v[0][mv], r.v[1][mv], 0x5410)), f0));
        const uint32_t a1 = bits_of(__hmul2(bf2_of(__byte_perm(r.v[0][mv], r.v[1][mv], 0x7632)), f1));
        const uint32_t a2 = bits_of(__hmul2(bf2_of(__byte_perm(r.v[2][mv], r.v[3][mv], 0x5410)), f0));
        const uint32_t a3 = bits_of(__hmul2(bf2_of(__byte_perm(r.v[2][mv], r.v[3][mv], 0x7632)), f1));
        mma_bf16(st.o[mv], a0, a1, a2, a3, pb[0][0], pb[0][1]);
    }
}

} // namespace v2

namespace v3 {

using v2::State;

struct NativePtrs {
    const uint32_t *Rec; // per 64-token step: key codes, value codes, value scales and zeros
    const __half *Km;    // per key group: scales then zeros, group-major
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
    // The step's products accumulate from zero on the tensor cores (its 4 k-steps) and are then added to
    // the state with fp32 adds, as v2's: the tensor cores' fp32 accumulation truncates each term to the
    // largest one's ulp, so a chain carrying the running state through all of a warp's steps loses up to
    // an ulp of the state per term, always downwards (every code product is positive). The code sums
    // cancel against the zeros' sums (|o| ~ 1/sqrt(T) against sums of order 1), so that bias grew with T.
    float zs[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        uint2 zv = make_uint2(0u, 0u);
        if (g < NGV) zv = *reinterpret_cast<const uint2 *>(rec + R::VM + ((2 * i + 1) * NGV + g) * 32 + 8 * t);
        mma_f16(zs, zv.x, one8, zv.y, one8, pb[i][0], pb[i][1]);
    }
#pragma unroll
    for (int e = 0; e < 4; e++) z[e] += zs[e];
    const unsigned char *vc = rec + R::VC + lane * (D / 8); // D/32 words per lane and k-step
#pragma unroll
    for (int mh = 0; mh < D / 64; mh++) { // m-tiles 4mh .. 4mh + 3 (channels 64mh ..)
        float os[4][4];                   // this step's O^T of those m-tiles
#pragma unroll
        for (int m = 0; m < 4; m++) os[m][0] = os[m][1] = os[m][2] = os[m][3] = 0.f;
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
                mma_f16(os[m], code_reg(w.x, w8x, 4 * m), code_reg(w.x, w8x, 4 * m + 2), code_reg(w.y, w8y, 4 * m),
                        code_reg(w.y, w8y, 4 * m + 2), pp0, pp1);
            }
        }
#pragma unroll
        for (int m = 0; m < 4; m++)
#pragma unroll
            for (int e = 0; e < 4; e++) o[4 * mh + m][e] += os[m][e];
    }
}

} // namespace v3
} // namespace

#endif
