// int2_quantize.cu: the INT2 cache's interchange layout written and read back: quantize/pack of keys and
// values, the decode step's append with the flush every 128 tokens, and dequantize (kernels/int2/int2.h).
#include "kernels/int2/int2_device.cuh"

namespace {

// Keys: a block of 256 threads per tile of 128 tokens of one (b, h), staged in shared memory with
// cp.async. Work unit = (channel pair p, 16-token chunk c): 16 bf16 pairs in registers (one word of
// codes per channel). The min and max of a group of gs tokens are reduced over its gs/16 chunk lanes
// with shuffles. Tile layout [token][pair] with the 16-byte chunks of token t XOR-swizzled by t/16,
// so that the 8 chunk lanes of a pair read 8 different banks.
constexpr int QK_THREADS = 256, QK_TILE = 128;

template <int D, int GS>
__global__ void __launch_bounds__(QK_THREADS, 4) quant_keys_kernel(const __nv_bfloat16 *__restrict__ K, int64_t src_len,
                                                                  int64_t n, int64_t t0, uint32_t *__restrict__ Kq,
                                                                  __half *__restrict__ Ks, __half *__restrict__ Kz,
                                                                  int64_t Tcap, int64_t bh0)
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

    const int64_t words = Tcap / 16, groups = Tcap / GS;
    constexpr int per = GS / 16; // chunk lanes per group
    for (int u = tid; u < PAIRS * 8; u += QK_THREADS) { // warp-uniform trip count (PAIRS * 8 is a multiple of 256)
        const int c = u & 7, p = u >> 3;
        const bool active = 16 * c < ntile;
        uint32_t x[16];
        __nv_bfloat162 mn = __floats2bfloat162_rn(INFINITY, INFINITY), mx = __floats2bfloat162_rn(-INFINITY, -INFINITY);
        // the min NaN-propagating (in the shuffles too): a NaN anywhere in the group makes it NaN
#pragma unroll
        for (int i = 0; i < 16; i++) {
            const int t = 16 * c + i;
            x[i] = active ? tile[t * PAIRS + ((((p >> 2) ^ c) & (NCH - 1)) << 2) + (p & 3)] : 0u;
            const __nv_bfloat162 v = bf2_of(x[i]);
            mn = __hmin2_nan(mn, v), mx = __hmax2(mx, v);
        }
        uint32_t umn = bits_of(mn), umx = bits_of(mx);
#pragma unroll
        for (int off = 1; off < per; off <<= 1) {
            mn = __hmin2_nan(bf2_of(umn), bf2_of(__shfl_xor_sync(0xffffffffu, umn, off)));
            mx = __hmax2(bf2_of(umx), bf2_of(__shfl_xor_sync(0xffffffffu, umx, off)));
            umn = bits_of(mn), umx = bits_of(mx);
        }
        if (!active) continue;
        const float mn0 = __low2float(mn), mn1 = __high2float(mn), mx0 = __low2float(mx), mx1 = __high2float(mx);
        const bool bad0 = unsupported(mn0) || unsupported(mx0);
        const bool bad1 = unsupported(mn1) || unsupported(mx1);
        __half s0, z0, s1, z1;
        group_meta(mn0, mx0, bad0, s0, z0);
        group_meta(mn1, mx1, bad1, s1, z1);
        const int64_t tc = t0 + tile0 + 16 * c; // the chunk's first cache token
        const int64_t row0 = bh * D + 2 * p, row1 = row0 + 1;
        if (c % per == 0) {
            const int64_t g = tc / GS;
            Ks[row0 * groups + g] = s0, Kz[row0 * groups + g] = z0;
            Ks[row1 * groups + g] = s1, Kz[row1 * groups + g] = z1;
        }
        const float sf0 = __half2float(s0), zf0 = __half2float(z0), sf1 = __half2float(s1), zf1 = __half2float(z1);
        const bool live0 = !bad0 && sf0 != 0.f, live1 = !bad1 && sf1 != 0.f;
        const float r0 = live0 ? rcp_rn_normal(sf0) : 0.f, r1 = live1 ? rcp_rn_normal(sf1) : 0.f;
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

template <int D, int GS>
__global__ void __launch_bounds__(QV_THREADS) quant_values_kernel(const __nv_bfloat16 *__restrict__ V, int64_t src_len,
                                                                    int64_t n, int64_t t0, uint32_t *__restrict__ Vq,
                                                                    __half *__restrict__ Vs, __half *__restrict__ Vz,
                                                                    int64_t Tcap, int64_t bh0)
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
    // min and max on bf16 pairs, the min NaN-propagating (a NaN makes it NaN), then over the group's
    // gs/16 lanes
    __nv_bfloat162 mn = bf2_of(u[0]), mx = mn;
#pragma unroll
    for (int i = 1; i < 8; i++) {
        const __nv_bfloat162 v = bf2_of(u[i]);
        mn = __hmin2_nan(mn, v), mx = __hmax2(mx, v);
    }
    float fmn = fminf(__low2float(mn), __high2float(mn)), fmx = fmaxf(__low2float(mx), __high2float(mx));
    bool bad = isnan(__low2float(mn)) || isnan(__high2float(mn)); // fminf drops a NaN
#pragma unroll
    for (int off = 1; off < GS / 16; off <<= 1) {
        fmn = fminf(fmn, __shfl_xor_sync(0xffffffffu, fmn, off));
        fmx = fmaxf(fmx, __shfl_xor_sync(0xffffffffu, fmx, off));
        bad |= __shfl_xor_sync(0xffffffffu, (int)bad, off) != 0;
    }
    if (!active) return;
    bad |= unsupported(fmn) || unsupported(fmx);
    __half s, z;
    group_meta(fmn, fmx, bad, s, z);
    const int64_t row = bh * Tcap + t0 + tok;
    constexpr int per = GS / 16;
    if (w % per == 0) Vs[row * (D / GS) + w / per] = s, Vz[row * (D / GS) + w / per] = z;
    const float sf = __half2float(s), zf = __half2float(z);
    uint32_t word = 0;
    if (!bad && sf != 0.f) {
        const float r = rcp_rn_normal(sf);
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
        return with_cfg(l->D, l->gs, [&](auto dc, auto gc) -> int {
            quant_keys_kernel<dc.value, gc.value><<<grid, QK_THREADS, 0, stream>>>(src, src_len, n, t0, c->Kq, Ks, Kz,
                                                                                   l->Tcap, bh0);
            CUDA_TRY(cudaGetLastError());
            return KVB_OK;
        });
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
        return with_cfg(l->D, l->gs, [&](auto dc, auto gc) -> int {
            quant_values_kernel<dc.value, gc.value><<<grid, QV_THREADS, 0, stream>>>(src, src_len, n, t0, c->Vq, Vs, Vz,
                                                                                     l->Tcap, bh0);
            CUDA_TRY(cudaGetLastError());
            return KVB_OK;
        });
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
    int rc = int2_dequantize_check(l, L, who);
    if (rc) return rc;
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
