// int2_device.cuh: what the int2 kernel files share (kernels/int2/*.cu; not a public header): the
// interchange cache as device pointers, the quantizer's rounding, q's staging, the decode parameters, the
// decode versions' descriptors and the host checks. Everything but the descriptors sits in an anonymous
// namespace: each file compiles its own copy of what it uses. The family's contract, budget and design:
// kernels/int2/NOTES.md.
#ifndef KVB_KERNELS_INT2_DEVICE_CUH
#define KVB_KERNELS_INT2_DEVICE_CUH

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <type_traits>

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

inline CachePtrs ptrs_of(const int2_cache *c)
{
    CachePtrs p;
    p.Kq = c->Kq, p.Vq = c->Vq;
    p.Ks = reinterpret_cast<const __half *>(c->Ks), p.Kz = reinterpret_cast<const __half *>(c->Kz);
    p.Vs = reinterpret_cast<const __half *>(c->Vs), p.Vz = reinterpret_cast<const __half *>(c->Vz);
    p.Kr = reinterpret_cast<const __nv_bfloat16 *>(c->Kr), p.Vr = reinterpret_cast<const __nv_bfloat16 *>(c->Vr);
    return p;
}

// ---- the quantizer's rounding (bit-exact with the reference: fp32 arithmetic exactly where reference/int2.c puts it) ----

// RN(x / 3) for x >= 0 by Markstein's step with r = RN(1/3) (see code_of): the quotient __fdiv_rn gives
// for every normal x up to 2^17 (every such float checked on the H200, profiles/int2_rounding_check.cu),
// without the division's check and slow path. Below the normal range it may differ in the last bit of a
// quotient under 2^-126, which fp16 rounds to 0 either way.
__device__ __forceinline__ float third_rn(float x)
{
    const float r = 0x1.555556p-2f; // RN(1/3)
    const float q0 = __fmul_rn(x, r);
    return __fmaf_rn(__fmaf_rn(-q0, 3.0f, x), r, q0);
}

// RN(1/s) for a normal s: the hardware reciprocal and one Newton step, the fast path of __frcp_rn without
// its check for the inputs that need the slow one (denormals, exponents near the limits); every nonzero
// fp16 scale is normal as a float, and each gives __frcp_rn's bits (every one checked on the H200,
// profiles/int2_rounding_check.cu).
__device__ __forceinline__ float rcp_rn_normal(float s)
{
    float r0;
    asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r0) : "f"(s));
    return __fmaf_rn(r0, -__fmaf_rn(s, r0, -1.0f), r0);
}

// scale = fp16((mx - mn) / 3), zero = fp16(mn); a group holding an unsupported value gets NaN metadata.
__device__ __forceinline__ void group_meta(float mn, float mx, bool bad, __half &s, __half &z)
{
    if (bad) {
        s = z = __ushort_as_half((unsigned short)0x7E00);
        return;
    }
    s = __float2half_rn(third_rn(__fsub_rn(mx, mn)));
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

// the fused kernels' tile of tokens (the cache is allocated in 256-token granules)
constexpr int TILE = 256;

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

// (D, gs) at compile time: f(integral_constant<int, D>, integral_constant<int, gs>); the layout checks
// have already admitted only D in {64, 128} and gs in {16, 32, 64, 128} dividing D.
template <typename F>
inline int with_cfg(int D, int gs, F &&f)
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

inline int check_fused(const int2_layout *l, const char *who)
{
    int rc = int2_attn_check(l, who);
    if (rc) return rc;
    if (l->Tcap % INT2_TCAP_GRANULE != 0)
        return kvb_fail(KVB_EINVAL, "%s: Tcap=%lld is not a multiple of 256: the fused kernels read the cache in "
                        "256-token tiles (allocate it in 256-token granules; T may be any multiple of gs)", who,
                        (long long)l->Tcap);
    return KVB_OK;
}

inline int check_keys_present(const int2_cache *c, const char *who)
{
    if (!c || !c->Kq || !c->Ks || !c->Kz)
        return kvb_fail(KVB_EINVAL, "%s: a key cache pointer (Kq, Ks, Kz) is NULL", who);
    return KVB_OK;
}

inline int check_values_present(const int2_cache *c, const char *who)
{
    if (!c || !c->Vq || !c->Vs || !c->Vz)
        return kvb_fail(KVB_EINVAL, "%s: a value cache pointer (Vq, Vs, Vz) is NULL", who);
    return KVB_OK;
}

// ---- the fused decode versions (int2_decode_v1.cu, int2_decode_v2.cu, int2_decode.cu) ----

// Resident blocks of `kernel` on this device (its dynamic shared memory limit raised to smem first): the
// stream-K grid is one wave of them.
template <class Kernel>
inline int resident_blocks(Kernel kernel, int threads, size_t smem, int *cap)
{
    int per_sm = 0;
    CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
    const int sms = kvb_sm_count();
    if (!sms) return kvb_fail(KVB_EDEVICE, "int2: the device's SM count could not be read");
    *cap = sms * (per_sm > 0 ? per_sm : 1);
    return KVB_OK;
}

inline size_t attn_workspace(const int2_layout *l, int cap, size_t *parts_off)
{
    const size_t heads = (size_t)l->B * l->Hkv, G = (size_t)(l->Hq / l->Hkv);
    *parts_off = (heads * sizeof(int) + 255) & ~(size_t)255;
    return *parts_off + (heads + (size_t)cap) * (size_t)kvb_attn::part_slot_floats((int)G, l->D) * sizeof(float);
}

// What every version checks past its cache arrays: the residual, q, o and the workspace.
inline int decode_check(const char *who, const kvb_bf16 *q, const int2_cache *c, kvb_bf16 *o, const int2_layout *l,
                        void *workspace)
{
    if (l->R > 0 && (!c->Kr || !c->Vr)) return kvb_fail(KVB_EINVAL, "%s: Kr or Vr is NULL with R=%d", who, l->R);
    if (!q || !o) return kvb_fail(KVB_EINVAL, "%s: q or o is NULL", who);
    if (!workspace)
        return kvb_fail(KVB_EINVAL, "%s: workspace is NULL (allocate int2_decode_attn_workspace_bytes(), zeroed once)", who);
    return KVB_OK;
}

// The stream-K parameters of a launch with up to `cap` resident blocks, and its grid.
inline AttnParams decode_params(const kvb_bf16 *q, const int2_cache *c, kvb_bf16 *o, const int2_layout *l, void *workspace,
                                int cap, int *grid)
{
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
    *grid = (int)(want < cap ? (want > 0 ? want : 1) : cap);
    return p;
}

} // namespace

// A fused decode-attention version, defined beside its kernel: the resident blocks of its kernel on this
// device for l's (D, gs). The workspace (int2_decode_attn_workspace_bytes) holds a partial for every
// block of the largest grid of any version.
namespace int2_internal {
struct DecodeVersion {
    const char *name;
    int (*capacity)(const int2_layout *l, int *blocks);
};
extern const DecodeVersion decode_v1, decode_v2, decode_v3;
} // namespace int2_internal

#endif
