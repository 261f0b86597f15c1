// decode.cu: dense decode attention (decode.md), flash decoding on the tensor cores.
//
// Napkin math, Llama-3-8B decode (B=8, Hq=32, Hkv=8, D=128), L=32K tokens per sequence:
//   K + V = 2 * 8 * 8 * 32768 * 128 * 2 B = 1073.7 MB; q and o 64 KB each. At the measured device copy
//   rate (~4.25 TB/s read+write, cudaMemcpy D2D on an H200) the floor is ~253 us; the goal, 90% of it,
//   is <= ~281 us. L=128K: 4.29 GB, floor ~1.01 ms.
//   Arithmetic: 4 * B * Hq * L * D = 1.07 GFLOP = 1 FLOP per byte: nothing for the tensor cores (even
//   with the MMA's 8 head columns half empty at G=4), but ~2 FMA per byte would be 25% of the fp32 pipe,
//   and a per-token shuffle reduction more: so the products go through mma.sync, not CUDA cores.
//   Per SM at 90%: ~14.9 B/cycle, i.e. one 16-token step (8 KB of K+V) every ~550 cycles; a step is
//   ~130 warp instructions (16 LDG.128, 16 MMA, 16 PRMT, softmax): ~0.25 IPC, far from a limit.
//   Bytes in flight: ~4.3 TB/s x ~1 us of latency = ~4.3 MB, ~33 KB per SM: 4+ warps with a step's
//   8 KB outstanding; 3 blocks of 4 warps per SM give 12.
//
// Design:
// - One read of K and V per KV head: its G <= 8 query heads are the n = 8 columns of
//   S^T = K . q^T and O^T += V^T . P^T (attn_device.h). Each thread loads its MMA fragments straight
//   from global memory with 16-byte loads, no shared-memory staging: K rows as 4 x 16 bytes per
//   thread (the QK contraction index is mapped to the channels a thread holds), V as two 16-byte
//   loads per token that a warp reads as whole 128-byte row halves; P goes from the S^T accumulators
//   to the B operand of the second MMA with one movmatrix.trans per 8x8 tile.
// - Split along L with a log-sum-exp merge, stream-K style: all heads' 16-token steps form one line
//   (prefix over the per-sequence lengths, computed by every block), and block k of a grid of
//   exactly one resident wave takes the k-th equal share. No tail wave, balanced for any mix of
//   lengths; a head touched by several blocks is merged by the last of them (arrival counter per
//   head, reset by the merger), in the same launch.
// - Within a block, 4 warps take the share's steps round robin and are combined in shared memory.
#include <cstdint>
#include <cstdio>

#include <cub/block/block_scan.cuh>

#include "kvb_cuda.h"
#include "attn_device.h"
#include "decode.h"

using namespace kvb_attn;

namespace {

constexpr int MIN_STEPS_PER_BLOCK = 16; // 256 tokens: below that the merge costs more than it spreads

struct DecodeParams {
    const __nv_bfloat16 *q, *K, *V;
    const int32_t *len;
    __nv_bfloat16 *o;
    int B, Hq, Hkv, G;
    int64_t L;
    float scale; // log2(e) / sqrt(D)
    int *counters;
    float *parts;
};

template <int D>
constexpr size_t smem_bytes_fixed()
{
    return sizeof(MergeSmem<D>) + sizeof(float) * (MAXG * D + 64 * MAXG);
}

template <int D>
size_t smem_bytes(int B)
{
    return smem_bytes_fixed<D>() + sizeof(int64_t) * (size_t)(B + 1);
}

template <int D, int S>
__global__ void __launch_bounds__(THREADS) decode_attn_kernel(DecodeParams p)
{
    extern __shared__ __align__(16) unsigned char smem[];
    MergeSmem<D> &ms = *reinterpret_cast<MergeSmem<D> *>(smem);
    float *q_s = reinterpret_cast<float *>(smem + sizeof(MergeSmem<D>));
    float *w_s = q_s + MAXG * D;
    int64_t *pre = reinterpret_cast<int64_t *>(w_s + 64 * MAXG); // steps before sequence b, all heads
    __shared__ int flag_s;
    using Scan = cub::BlockScan<long long, THREADS>;
    __shared__ typename Scan::TempStorage scan_tmp;

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int B = p.B, Hkv = p.Hkv, G = p.G;

    // the step line: sequence b holds Hkv * ceil(len[b] / 16) steps
    constexpr int IPT = DECODE_MAX_B / THREADS;
    long long items[IPT];
#pragma unroll
    for (int i = 0; i < IPT; i++) {
        const int b = tid * IPT + i;
        items[i] = b < B ? (long long)((p.len[b] + 15) / 16) * Hkv : 0;
    }
    long long total;
    Scan(scan_tmp).ExclusiveSum(items, items, total);
#pragma unroll
    for (int i = 0; i < IPT; i++)
        if (tid * IPT + i < B) pre[tid * IPT + i] = items[i];
    __syncthreads();

    const int64_t N = total, grid = gridDim.x, k = blockIdx.x;
    int64_t u = part_begin(k, N, grid);
    const int64_t u1 = part_begin(k + 1, N, grid);
    while (u < u1) {
        int lo = 0, hi = B - 1; // the sequence holding step u: the last b with pre[b] <= u
        while (lo < hi) {
            const int mid = (lo + hi + 1) >> 1;
            if (pre[mid] <= u) lo = mid;
            else hi = mid - 1;
        }
        const int b = lo, lenb = p.len[b];
        const int64_t ns = (lenb + 15) / 16;
        const int kvh = (int)((u - pre[b]) / ns);
        const int64_t hoff = pre[b] + kvh * ns, head = (int64_t)b * Hkv + kvh;
        const int64_t s0 = u - hoff, s1 = min(u1, hoff + ns) - hoff;

        __syncthreads(); // the previous segment is done with q_s and ms
        const __nv_bfloat16 *qh = p.q + ((int64_t)b * p.Hq + (int64_t)kvh * G) * D;
        for (int idx = tid; idx < G * D; idx += THREADS) q_s[idx] = __bfloat162float(qh[idx]);
        __syncthreads();
        uint32_t qb[D / 16][2];
        q_frags_bf16<D>(qb, q_s, G, lane);
        WarpState<D / 16> st;
        st.init();
        const __nv_bfloat16 *Kh = p.K + head * p.L * D, *Vh = p.V + head * p.L * D;
        for (int64_t s = s0 + warp; s < s1; s += WARPS * S) {
            DenseRegs<D> r[S];
#pragma unroll
            for (int i = 0; i < S; i++) {
                const int64_t si = s + (int64_t)i * WARPS;
                if (si < s1) dense_load<D, VMAP_SPLIT>(r[i], Kh, Vh, si * 16, (int)min((int64_t)16, lenb - si * 16), lane);
            }
#pragma unroll
            for (int i = 0; i < S; i++) {
                const int64_t si = s + (int64_t)i * WARPS;
                if (si < s1) dense_compute<D>(st, qb, r[i], (int)min((int64_t)16, lenb - si * 16), p.scale, lane);
            }
        }
        warp_deposit<D, VMAP_SPLIT>(ms, st, warp, lane);
        __syncthreads();
        const int64_t first = block_of(hoff, N, grid), last = block_of(hoff + ns - 1, N, grid);
        finish_head<D>(ms, G, head, first, last, k, p.parts, p.counters,
                       p.o + ((int64_t)b * p.Hq + (int64_t)kvh * G) * D, w_s, &flag_s, tid);
        u = hoff + s1;
    }
}

using KernelFn = void (*)(DecodeParams);

template <int D, int S>
int capacity_of(int B, int *cap)
{
    static int sms = 0;
    if (!sms) CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    int per_sm = 0;
    CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, decode_attn_kernel<D, S>, THREADS, smem_bytes<D>(B)));
    *cap = sms * (per_sm > 0 ? per_sm : 1);
    return KVB_OK;
}

int capacity(int D, int S, int B, int *cap)
{
    if (D == 64) return S == 1 ? capacity_of<64, 1>(B, cap) : capacity_of<64, 2>(B, cap);
    return S == 1 ? capacity_of<128, 1>(B, cap) : capacity_of<128, 2>(B, cap);
}

size_t workspace_layout(const decode_layout *d, int cap, size_t *parts_off)
{
    const size_t heads = (size_t)d->B * d->Hkv, G = (size_t)(d->Hq / d->Hkv);
    *parts_off = (heads * sizeof(int) + 255) & ~(size_t)255;
    return *parts_off + (heads + (size_t)cap) * G * (size_t)(d->D + 2) * sizeof(float);
}

} // namespace

extern "C" size_t decode_attn_workspace_bytes(const decode_layout *d)
{
    if (decode_layout_check(d, "decode_attn_workspace_bytes")) return 0;
    int c1 = 0, c2 = 0;
    if (capacity(d->D, 1, d->B, &c1) || capacity(d->D, 2, d->B, &c2)) return 0;
    size_t off;
    return workspace_layout(d, c1 > c2 ? c1 : c2, &off);
}

extern "C" int decode_attn_variant(const kvb_bf16 *q, const kvb_bf16 *K, const kvb_bf16 *V, const int32_t *len,
                                   const int32_t *len_host, kvb_bf16 *o, const decode_layout *d, void *workspace,
                                   int steps, cudaStream_t stream)
{
    const char *who = "decode_attn";
    int rc = decode_layout_check(d, who);
    if (rc) return rc;
    if (!q || !K || !V || !len || !len_host || !o)
        return kvb_fail(KVB_EINVAL, "%s: a tensor pointer is NULL (q=%p K=%p V=%p len=%p len_host=%p o=%p)", who,
                        (const void *)q, (const void *)K, (const void *)V, (const void *)len, (const void *)len_host,
                        (void *)o);
    if (!workspace)
        return kvb_fail(KVB_EINVAL, "%s: workspace is NULL (allocate decode_attn_workspace_bytes(), zeroed once)", who);
    if (steps != 1 && steps != 2) return kvb_fail(KVB_EINVAL, "%s: steps=%d out of range [1, 2]", who, steps);
    if ((rc = decode_lengths_check(d, len_host, who))) return rc;
    int64_t N = 0;
    for (int b = 0; b < d->B; b++) N += (int64_t)((len_host[b] + 15) / 16) * d->Hkv;
    int cap = 0;
    if ((rc = capacity(d->D, steps, d->B, &cap))) return rc;
    int64_t want = (N + MIN_STEPS_PER_BLOCK - 1) / MIN_STEPS_PER_BLOCK;
    const int grid = (int)(want < cap ? (want > 0 ? want : 1) : cap);
    size_t parts_off;
    workspace_layout(d, cap, &parts_off);
    DecodeParams p;
    p.q = reinterpret_cast<const __nv_bfloat16 *>(q);
    p.K = reinterpret_cast<const __nv_bfloat16 *>(K);
    p.V = reinterpret_cast<const __nv_bfloat16 *>(V);
    p.len = len;
    p.o = reinterpret_cast<__nv_bfloat16 *>(o);
    p.B = d->B, p.Hq = d->Hq, p.Hkv = d->Hkv, p.G = d->Hq / d->Hkv, p.L = d->L;
    p.scale = LOG2E / sqrtf((float)d->D);
    p.counters = reinterpret_cast<int *>(workspace);
    p.parts = reinterpret_cast<float *>(reinterpret_cast<char *>(workspace) + parts_off);
    if (d->D == 64) {
        const size_t sm = smem_bytes<64>(d->B);
        if (steps == 1) decode_attn_kernel<64, 1><<<grid, THREADS, sm, stream>>>(p);
        else decode_attn_kernel<64, 2><<<grid, THREADS, sm, stream>>>(p);
    } else {
        const size_t sm = smem_bytes<128>(d->B);
        if (steps == 1) decode_attn_kernel<128, 1><<<grid, THREADS, sm, stream>>>(p);
        else decode_attn_kernel<128, 2><<<grid, THREADS, sm, stream>>>(p);
    }
    CUDA_TRY(cudaGetLastError());
    return KVB_OK;
}

extern "C" int decode_attn(const kvb_bf16 *q, const kvb_bf16 *K, const kvb_bf16 *V, const int32_t *len,
                           const int32_t *len_host, kvb_bf16 *o, const decode_layout *d, void *workspace,
                           cudaStream_t stream)
{
    return decode_attn_variant(q, K, V, len, len_host, o, d, workspace, 1, stream);
}
