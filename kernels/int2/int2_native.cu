// int2_native.cu: the kernel-native layout of int2_decode_attn v3 (reference/int2.h: int2_native) written on
// the device, from the interchange cache (int2_to_native) or straight from bf16 keys and values
// (int2_quantize_native).
#include "kernels/int2/int2_device.cuh"

namespace {
namespace v3 {

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
    constexpr __host__ __device__ QnLayout(int D_, int gs_)
        : D(D_), gs(gs_), CH(gs_ > 64 ? gs_ : 64), ngk(CH / gs_), ngv(D_ / gs_), KS(D_ / 2 + 8), VS(D_ / 2 + 2),
          kt(0), vt(kt + (size_t)CH * KS * 4), kq(vt + (size_t)CH * VS * 4), vq(kq + (size_t)D * ngk * 16),
          km(vq + (size_t)ngv * (CH + 1) * 16), vm(km + (size_t)2 * D * ngk * 2), bytes(vm + (size_t)2 * CH * ngv * 2)
    {
    }
};

// log2 of a power of two, at compile time
constexpr __host__ __device__ int log2_pow2(int x) { return x <= 1 ? 0 : 1 + log2_pow2(x / 2); }

template <int D> __device__ __forceinline__ int vpos(int p) { return D == 128 ? 2 * (p & 31) + (p >> 5) : p; }
template <int D> __device__ __forceinline__ int kq_at(int c, int gi) { return (2 * gi + (c & 1)) * (D / 2) + (c >> 1); }
__device__ __forceinline__ int vq_at(int tt, int gv, int CH) { return gv * (CH + 1) + (tt ^ ((tt >> 3) & 1)); }
// The value scales (a = 0) and zeros (a = 1) in the records' order, so that a metadata word of the records is
// one 4-byte copy: the half e of step t / 64's metadata part that write_record reads for token t of the
// chunk and group gv, e = ((2 i + a) ngv + gv) 16 + pos with i = (t % 64) / 16 and pos the inverse of
// tau(pos) = 2 (pos / 4) + 8 ((pos / 2) % 2) + pos % 2 for tau = t % 16.
template <int NGV> __device__ __forceinline__ int vm_at(int a, int t, int gv)
{
    const int i = (t >> 4) & 3, tau = t & 15, pos = ((tau & 6) << 1) | ((tau >> 2) & 2) | (tau & 1);
    return (t >> 6) * 128 * NGV + (((2 * i + a) * NGV + gv) << 4) + pos;
}

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
        return make_float4(sf, zf, rcp_rn_normal(sf), 0.f);
    }
};

__device__ __forceinline__ uint32_t code_m(float x, const float4 &m) { return code_of(x, m.x, m.y, m.z); }

template <int D, int GS>
__global__ void __launch_bounds__(256) quant_native_kernel(QuantNativeParams p)
{
    extern __shared__ __align__(128) unsigned char smem[];
    // (D, gs) at compile time: the layout's sizes, strides and shifts are constants, the group loops unrolled
    constexpr QnLayout L(D, GS);
    constexpr int gs = L.gs, CH = L.CH, ngk = L.ngk, ngv = L.ngv, KS = L.KS, VS = L.VS;
    constexpr int lgs = log2_pow2(gs), lngv = log2_pow2(ngv);
    const int tid = threadIdx.x;
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
    // group gv) over gs channels; min and max on bf16 pairs, the min NaN-propagating so that a NaN makes
    // it NaN (and an inf makes a bound inf), as the interchange quantizers, then the reference's ordered
    // scan where a bound is a zero (its sign)
    const __nv_bfloat162 pinf2 = __floats2bfloat162_rn(INFINITY, INFINITY), ninf2 = __floats2bfloat162_rn(-INFINITY, -INFINITY);
    for (int u = tid; u < (D / 2) * ngk + CH * ngv; u += blockDim.x) {
        if (u < (D / 2) * ngk) {
            const int pr = u % (D / 2), gi = u / (D / 2);
            const uint32_t *col = kt + gi * gs * KS + pr;
            __nv_bfloat162 mn = pinf2, mx = ninf2;
#pragma unroll
            for (int i = 0; i < gs; i++) {
                const __nv_bfloat162 v = bf2_of(col[i * KS]);
                mn = __hmin2_nan(mn, v), mx = __hmax2(mx, v);
            }
            GroupScan a, b;
            a.mn = __low2float(mn), a.mx = __low2float(mx), b.mn = __high2float(mn), b.mx = __high2float(mx);
            a.bad = unsupported(a.mn) || unsupported(a.mx);
            b.bad = unsupported(b.mn) || unsupported(b.mx);
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
            // the group's pairs pr0 + i, i < gs / 2: vpos(pr0 + i) = vpos(pr0) + vpos(i), as pr0 is a multiple
            // of gs / 2 (which divides 32, or is 64 with pr0 = 0), so each load is the row's address plus a constant
            const int pr0 = gv * (gs / 2);
            const uint32_t *row = vt + t * VS + vpos<D>(pr0);
            __nv_bfloat162 mn = pinf2, mx = ninf2;
#pragma unroll
            for (int i = 0; i < gs / 2; i++) {
                const __nv_bfloat162 v = bf2_of(row[vpos<D>(i)]);
                mn = __hmin2_nan(mn, v), mx = __hmax2(mx, v);
            }
            GroupScan a;
            a.mn = fminf(__low2float(mn), __high2float(mn)), a.mx = fmaxf(__low2float(mx), __high2float(mx));
            a.bad = unsupported(__low2float(mn)) || unsupported(__high2float(mn)) || unsupported(a.mx); // fminf drops a NaN
            if (a.needs_order()) {
                uint32_t x = row[0];
                a.first(bf16_lo(x)), a.add(bf16_hi(x));
                for (int i = 1; i < gs / 2; i++) {
                    x = row[vpos<D>(i)];
                    a.add(bf16_lo(x)), a.add(bf16_hi(x));
                }
            }
            vq[vq_at(t, gv, CH)] = a.finish(vm[vm_at<ngv>(0, t, gv)], vm[vm_at<ngv>(1, t, gv)]);
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
                // pair 32 mh + 8 m + g is in value group (64 mh + 16 m + 2 g) >> lgs = (64 mh >> lgs) + (16 m >> lgs),
                // as 2 g < 16 <= gs and 64 mh is a multiple of gs (gs <= 64) or both parts are 0 (gs = 128): the
                // group rows at constant offsets from the word's first; tt0 is even, so vq_at's token order puts
                // tokens tt0 and tt0 + 1 at tt0 + f and tt0 + 1 - f
                const unsigned f = (tt0 >> 3) & 1u;
                const float4 *mvb = vq + ((64u * mh) >> lgs) * (CH + 1) + tt0;
#pragma unroll
                for (int hb = 0; hb < 2; hb++) {
                    const float4 *mrow = mvb + (hb ^ f);
#pragma unroll
                    for (int m = 0; m < 4; m++) {
                        const float4 mv = mrow[((16 * m) >> lgs) * (CH + 1)];
                        const uint32_t x = xv[hb * VS + (D == 128 ? 16 : 8) * m];
                        word += code_m(bf16_lo(x), mv) << (16 * hb + 4 * m);
                        word += code_m(bf16_hi(x), mv) << (16 * hb + 4 * m + 2);
                    }
                }
            } else { // value scales and zeros, already in the records' order (vm_at)
                word = reinterpret_cast<const uint32_t *>(vm)[sl * 64 * ngv + (idx - 8 * D)];
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
} // namespace

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
    p.src_len = src_len, p.t0 = t0, p.Tcap = l->Tcap;
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
    return with_cfg(l->D, l->gs, [&](auto dc, auto gc) -> int { return run(v3::quant_native_kernel<dc.value, gc.value>); });
}
