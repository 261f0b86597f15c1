// int2_qk_av.cu: the two fused dequant-matmuls, over the interchange layout (int2_qk, int2_av: v1's tiles)
// and over the kernel-native layout (int2_qk_native, int2_av_native: v3's step code).
#include "kernels/int2/int2_tile.cuh"
#include "kernels/int2/int2_step.cuh"

namespace {

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

int av_splits(const int2_layout *l)
{
    const int64_t heads = (int64_t)l->B * l->Hkv, ntiles = (l->T + TILE - 1) / TILE;
    int64_t want = ((int64_t)kvb_sm_count() * 4 + heads - 1) / heads; // 0 SMs read: 1 split
    if (want > ntiles) want = ntiles;
    if (want > 256) want = 256;
    return (int)(want > 0 ? want : 1);
}

size_t av_workspace(const int2_layout *l, size_t *parts_off)
{
    const size_t heads = (size_t)l->B * l->Hkv, G = (size_t)(l->Hq / l->Hkv);
    *parts_off = (heads * sizeof(int) + 255) & ~(size_t)255;
    return *parts_off + heads * (size_t)av_splits(l) * G * (size_t)l->D * sizeof(float);
}

} // namespace

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
