// decode.cu: dense and sparse decode attention, flash decoding on the tensor cores (contract, budget
// and measurements: kernels/decode/NOTES.md).
//
// Napkin math, Llama-3-8B decode (B=8, Hq=32, Hkv=8, D=128), L=32K tokens per sequence:
//   K + V = 2 * 8 * 8 * 32768 * 128 * 2 B = 1073.7 MB; q and o 64 KB each. At a read ceiling of
//   ~4.5 TB/s the floor is ~239 us; the goal, 90% of the read rate, is <= ~265 us. L=128K: 4.29 GB,
//   floor ~954 us.
//   Arithmetic: 4 * B * Hq * L * D = 4.29 GFLOP = 4 FLOP per byte of K+V (G = 4 heads per element):
//   nothing for the tensor cores (even with the MMA's 8 head columns half empty at G=4), but ~2 FMA per
//   byte would be a quarter of the fp32 pipe, and a per-token shuffle reduction more: so the products
//   go through mma.sync, not CUDA cores.
//   Per SM at 90%: ~15 B/cycle, i.e. one 16-token step (8 KB of K+V) every ~550 cycles; a step is
//   ~130 warp instructions (16 LDG.128, 16 MMA, 16 PRMT, softmax): ~0.25 IPC, far from a limit.
//   Bytes in flight: ~4.5 TB/s x ~1 us of latency = ~4.5 MB, ~34 KB per SM: 4+ warps with a step's
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
// - Sparse sources, equal lists: where a head's 2 to 8 blocks can all be resident as one cluster, they
//   merge through distributed shared memory instead (cluster_merge, attn_device.h: no global partial, no
//   arrival fence, no reload under the stream's memory queue). Where they cannot (64 heads of 4 blocks at
//   B=8: 62 clusters of 4 fit an H200 at 2 blocks a SM), a head takes half as many blocks of 8 warps, one
//   a SM, as one cluster: the same warps a head and steps a warp (kernels/decode/NOTES.md, Tried).
// - Sparse decode (sparse_attn_idx, sparse_attn_pages) is the same kernel with another token source:
//   a head's "tokens" are the entries of its index list, or the tokens of its listed pages, gathered
//   row by row (a K or V row is 256 contiguous bytes at D=128: whole sectors, as in the dense case).
//   Napkin math, 2048 tokens a head, B=8, Hkv=8: 64 heads x 2048 x 512 B = 67.1 MB of K+V rows (plus
//   0.5 MB of lists), ~15 us at 4.5 TB/s; at B=1 8.4 MB, ~2 us: launch and latency dominate.
#include <cstdint>
#include <cstdio>

#include <cub/block/block_scan.cuh>

#include "kernels/common/kvb_cuda.h"
#include "kernels/common/kvb_divide.h"
#include "kernels/common/kvb_grid.h"
#include "kernels/common/attn_device.h"
#include "kernels/decode/decode.h"

using namespace kvb_attn;

namespace {

constexpr int MIN_STEPS_PER_BLOCK = 16; // 256 tokens: below that the merge costs more than it spreads
// Sparse lists are short (a 2048-token budget is 128 steps a head): of 16, 8 and 4 steps a block, the
// most that still gives 7/8 of the SMs a block, so that a head's steps split into equal blocks
// (kernels/decode/NOTES.md, Tried: one block per SM at uneven splits was slower)
constexpr int SPARSE_MIN_STEPS_PER_BLOCK = 4;

// Where a head's tokens come from: every token below len[b] (dense), the first cnt[b] entries of
// its index list, or the tokens below len[b] of the first cnt[b] pages of its page list.
enum { SRC_DENSE = 0, SRC_IDX = 1, SRC_PAGES = 2 };

struct DecodeParams {
    const __nv_bfloat16 *q, *K, *V;
    const int32_t *len;
    __nv_bfloat16 *o;
    int B, Hq, Hkv, G;
    int64_t L;
    float scale; // log2(e) / sqrt(D)
    int *counters;
    float *parts;
    const int32_t *list, *cnt; // sparse: lists [B, Hkv, n], entries used per sequence
    int n, P;
    kvb_divisor page_div; // pages: / P
    // > 0 where every sequence has the same length and positions a head (the host's copies, checked
    // equal to the device's by contract): the step line is then arithmetic, with no read of len or cnt
    // and no scan before the first loads
    int64_t same_tokens;
    int same_len;
    int cluster; // > 1 (sparse sources' ring only): launched as clusters of this many blocks, one per head (cluster_merge)
};

// positions on a head's line: dense tokens, list entries, or list pages x P
template <int SRC>
__device__ __forceinline__ int64_t head_tokens(const DecodeParams &p, int b)
{
    if constexpr (SRC == SRC_DENSE) return p.len[b];
    else if constexpr (SRC == SRC_IDX) return p.cnt[b];
    else return (int64_t)p.cnt[b] * p.P;
}

// Sparse sources (S == 1): each warp copies the K and V rows of its next two steps into a shared-memory
// ring by cp.async while it computes the current one, so a step's gathers are in flight during the
// previous steps' math instead of being waited on where they are used. A stage holds one step's 16 K
// rows then its 16 V rows; the ring shares its space with the merge's MergeSmem (used only after the
// step loop, behind a barrier). At D=128 it is 96 KB a block, so 2 blocks a SM instead of 3.
constexpr int RING_STAGES = 3; // a step computed while the next two are copied
template <int D>
__host__ __device__ constexpr int ring_stage_elems()
{
    return 2 * 16 * D;
}
template <int S, int SRC>
__host__ __device__ constexpr bool uses_ring()
{
    return SRC != SRC_DENSE && S == 1;
}
template <int D, int S, int SRC, int NW = WARPS>
__host__ __device__ constexpr size_t front_bytes()
{
    constexpr size_t ring = (size_t)NW * RING_STAGES * ring_stage_elems<D>() * sizeof(__nv_bfloat16);
    return uses_ring<S, SRC>() && ring > sizeof(MergeSmem<D, NW>) ? ring : sizeof(MergeSmem<D, NW>);
}

// The per-sequence step prefix after the front, then (clusters) the merging block's C partial slots of
// G (D + 2) floats (cluster_merge), apart from the ring so that they may land while it still streams.
__host__ __device__ constexpr size_t slots_offset(size_t front, int B)
{
    return front + ((sizeof(int64_t) * (size_t)(B + 1) + 15) & ~(size_t)15);
}
template <int D, int S, int SRC, int NW = WARPS>
size_t smem_bytes(int B, int cluster = 0, int G = 0)
{
    return SMEM_LINE + slots_offset(front_bytes<D, S, SRC, NW>(), B) + sizeof(float) * (size_t)cluster * G * (D + 2); // the ring on a line
}

// The ring's 16-byte chunk `cidx` of row `row` (K or V): XOR-swizzled within each group of 8 chunks so
// that the fragment reads below (8 lanes a phase: rows g, g+8 at chunk t*D/32 + c for K; rows 2t + e at
// chunks g, 8 + g for V) and the copies (8 consecutive chunks of one row) hit 8 distinct bank groups.
__device__ __forceinline__ int ring_chunk(int row, int cidx)
{
    return cidx ^ ((((row >> 1) & 3) << 1) ^ (row & 1) ^ ((cidx >> 3) << 1));
}

// Copies one step's rows into a stage: lane `j` (mod 16) holds the row of position j (`mine`, -1: none,
// zero-filled). Chunk c = lane + 32 i of the 16 x D/8 chunks, of K and of V.
template <int D>
__device__ __forceinline__ void ring_copy(__nv_bfloat16 *stage, const __nv_bfloat16 *Kh, const __nv_bfloat16 *Vh,
                                          int mine, int lane)
{
    constexpr int RC = D / 8, PER_LANE = 16 * RC / 32;
#pragma unroll
    for (int i = 0; i < PER_LANE; i++) {
        const int c = lane + 32 * i, row = c / RC, cidx = c % RC;
        const int tok = __shfl_sync(0xffffffffu, mine, row);
        const bool ok = tok >= 0;
        const int64_t off = (int64_t)(ok ? tok : 0) * D + cidx * 8;
        const int at = row * D + ring_chunk(row, cidx) * 8;
        cp_async16(smem_u32(stage + at), Kh + off, ok);
        cp_async16(smem_u32(stage + 16 * D + at), Vh + off, ok);
    }
}

// A stage's rows into the registers of one step (rows_load's mapping, VMAP_SPLIT).
template <int D>
__device__ __forceinline__ void ring_read(DenseRegs<D> &r, const __nv_bfloat16 *stage, int lane)
{
    constexpr int KW = D / 8;
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int c = 0; c < KW / 4; c++) {
        const int cidx = t * (D / 32) + c;
        const uint4 x = lds128(smem_u32(stage + g * D + ring_chunk(g, cidx) * 8));
        const uint4 y = lds128(smem_u32(stage + (g + 8) * D + ring_chunk(g + 8, cidx) * 8));
        r.k0[4 * c] = x.x, r.k0[4 * c + 1] = x.y, r.k0[4 * c + 2] = x.z, r.k0[4 * c + 3] = x.w;
        r.k8[4 * c] = y.x, r.k8[4 * c + 1] = y.y, r.k8[4 * c + 2] = y.z, r.k8[4 * c + 3] = y.w;
    }
    const __nv_bfloat16 *V = stage + 16 * D;
#pragma unroll
    for (int q = 0; q < 4; q++) {
        const int row = 2 * t + (q & 1) + 8 * (q >> 1);
        if constexpr (D == 64) {
            const uint4 x = lds128(smem_u32(V + row * D + ring_chunk(row, g) * 8));
            r.v[q][0] = x.x, r.v[q][1] = x.y, r.v[q][2] = x.z, r.v[q][3] = x.w;
        } else {
            const uint4 x = lds128(smem_u32(V + row * D + ring_chunk(row, g) * 8));
            const uint4 y = lds128(smem_u32(V + row * D + ring_chunk(row, 8 + g) * 8));
            r.v[q][0] = x.x, r.v[q][1] = x.y, r.v[q][2] = x.z, r.v[q][3] = x.w;
            r.v[q][4] = y.x, r.v[q][5] = y.y, r.v[q][6] = y.z, r.v[q][7] = y.w;
        }
    }
}

// One step in flight: at most 168 registers, for 3 blocks per SM (the sparse sources' ring leaves 2 at
// D=128 by shared memory; they take 161-163 registers, no spills). Blocks of 8 warps (NW, the sparse
// clusters above) are one a SM by shared memory, their registers left free (184-193).
// Dense: 168 registers and no spills; left free it takes 223 and fits 2 blocks per SM, which measured
// slower at B=8 32K (kernels/decode/NOTES.md, Tried).
template <int D, int S, int SRC, int NW = WARPS>
__global__ void __launch_bounds__(32 * NW, NW != WARPS ? 1 : S == 1 ? 3 : 1) decode_attn_kernel(DecodeParams p)
{
    extern __shared__ __align__(16) unsigned char smem_raw[];
    // the ring on a 128-byte line: the static part before it (the scan's storage) is not a multiple of 32 bytes
    unsigned char *smem = smem_line_start(smem_raw);
    MergeSmem<D, NW> &ms = *reinterpret_cast<MergeSmem<D, NW> *>(smem);
    int64_t *pre = reinterpret_cast<int64_t *>(smem + front_bytes<D, S, SRC, NW>()); // steps before sequence b, all heads
    __shared__ int flag_s;
    using Scan = cub::BlockScan<long long, 32 * NW>;
    __shared__ typename Scan::TempStorage scan_tmp;

    chain_wait(); // launched chained (kvb_device.cuh): the previous kernel's writes are visible from here
    chain_release();
    // clusters: the barrier's first phase tells the others that this block runs (its partial slots exist);
    // it is waited at the merge (cluster_merge)
    if constexpr (uses_ring<S, SRC>())
        if (p.cluster > 1) cluster_arrive_relaxed();
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int B = p.B, Hkv = p.Hkv, G = p.G;

    // the step line: sequence b holds Hkv * ceil(len[b] / 16) steps
    long long total;
    if (p.same_tokens > 0) {
        total = (long long)B * Hkv * ((p.same_tokens + 15) / 16);
    } else {
        constexpr int IPT = DECODE_MAX_B / (32 * NW);
        long long items[IPT];
#pragma unroll
        for (int i = 0; i < IPT; i++) {
            const int b = tid * IPT + i;
            items[i] = b < B ? (long long)((head_tokens<SRC>(p, b) + 15) / 16) * Hkv : 0;
        }
        Scan(scan_tmp).ExclusiveSum(items, items, total);
#pragma unroll
        for (int i = 0; i < IPT; i++)
            if (tid * IPT + i < B) pre[tid * IPT + i] = items[i];
        __syncthreads();
    }

    const int64_t N = total, grid = gridDim.x, k = blockIdx.x;
    int64_t u = part_begin(k, N, grid);
    const int64_t u1 = part_begin(k + 1, N, grid);
    while (u < u1) {
        int b, lenb;
        int64_t ntok, first_step; // first_step: the line's first step of sequence b
        if (p.same_tokens > 0) {
            ntok = p.same_tokens, lenb = p.same_len;
            const int64_t seq_steps = (int64_t)Hkv * ((ntok + 15) / 16);
            b = (int)(u / seq_steps), first_step = b * seq_steps;
        } else {
            int lo = 0, hi = B - 1; // the sequence holding step u: the last b with pre[b] <= u
            while (lo < hi) {
                const int mid = (lo + hi + 1) >> 1;
                if (pre[mid] <= u) lo = mid;
                else hi = mid - 1;
            }
            b = lo, lenb = p.len[b], ntok = head_tokens<SRC>(p, b), first_step = pre[b];
        }
        const int64_t ns = (ntok + 15) / 16;
        const int kvh = (int)((u - first_step) / ns);
        const int64_t hoff = first_step + kvh * ns, head = (int64_t)b * Hkv + kvh;
        const int64_t s0 = u - hoff, s1 = min(u1, hoff + ns) - hoff;

        __syncthreads(); // the previous segment is done with ms (and the ring over it)
        // q's fragments straight from its rows (16-byte aligned: checked at the launch): no staging and no
        // barrier, so that their loads are in flight with the first list reads and row copies below
        uint32_t qb[D / 16][2];
        q_frags_bf16_rows<D>(qb, p.q + ((int64_t)b * p.Hq + (int64_t)kvh * G) * D, G, lane);
        WarpState<D / 16> st;
        st.init();
        const __nv_bfloat16 *Kh = p.K + head * p.L * D, *Vh = p.V + head * p.L * D;
        if constexpr (SRC == SRC_DENSE) {
            for (int64_t s = s0 + warp; s < s1; s += NW * S) {
                DenseRegs<D> r[S];
#pragma unroll
                for (int i = 0; i < S; i++) {
                    const int64_t si = s + (int64_t)i * NW;
                    if (si < s1) dense_load<D, VMAP_SPLIT>(r[i], Kh, Vh, si * 16, (int)min((int64_t)16, lenb - si * 16), lane);
                }
#pragma unroll
                for (int i = 0; i < S; i++) {
                    const int64_t si = s + (int64_t)i * NW;
                    if (si < s1) dense_compute<D>(st, qb, r[i], (int)min((int64_t)16, lenb - si * 16), p.scale, lane);
                }
            }
        } else {
            // Lane j (mod 16) holds the row of position j of each step in flight, one list read per
            // lane, made an iteration ahead of its use. Row -1: past the list, past the sequence
            // (pages), or an entry outside the cache (only possible without the host check): no read.
            // 32-bit: positions and tokens stay below 2^21.
            const int32_t *list = p.list + head * p.n;
            const int j = lane & 15;
            auto row_at = [&](int64_t si) -> int {
                const int pos = (int)(si * 16) + j;
                if (si >= s1 || pos >= ntok) return -1;
                int t;
                if constexpr (SRC == SRC_IDX) {
                    t = __ldg(list + pos);
                } else {
                    const unsigned pg = kvb_divide(&p.page_div, (unsigned)pos);
                    t = __ldg(list + pg) * p.P + (int)((unsigned)pos - pg * (unsigned)p.P);
                }
                return t >= 0 && t < lenb ? t : -1;
            };
            if constexpr (uses_ring<S, SRC>()) {
                // The ring: this step's rows were copied two iterations ago; the copy of the step two
                // ahead is issued before this one is computed, and the list read for the step after it.
                __nv_bfloat16 *ring = reinterpret_cast<__nv_bfloat16 *>(smem) + warp * RING_STAGES * ring_stage_elems<D>();
                int cur = row_at(s0 + warp), nxt = row_at(s0 + warp + NW), nxt2 = row_at(s0 + warp + 2 * NW);
                int stage = 0;
                if (s0 + warp < s1) ring_copy<D>(ring, Kh, Vh, cur, lane);
                cp_async_commit();
                if (s0 + warp + NW < s1) ring_copy<D>(ring + ring_stage_elems<D>(), Kh, Vh, nxt, lane);
                cp_async_commit();
                for (int64_t s = s0 + warp; s < s1; s += NW) {
                    const int after = row_at(s + 3 * NW);
                    const int ahead = stage == 0 ? 2 : stage - 1; // (stage + 2) mod 3
                    if (s + 2 * NW < s1) ring_copy<D>(ring + ahead * ring_stage_elems<D>(), Kh, Vh, nxt2, lane);
                    cp_async_commit();
                    cp_async_wait<2>(); // this lane's copies of the current step have landed
                    __syncwarp();       // and every lane's
                    DenseRegs<D> r;
                    ring_read<D>(r, ring + stage * ring_stage_elems<D>(), lane);
                    const uint32_t valid = __ballot_sync(0xffffffffu, cur >= 0) & 0xffffu;
                    masked_compute<D>(st, qb, r, valid, p.scale, lane);
                    __syncwarp(); // every lane has read the stage before a later iteration copies into it
                    cur = nxt, nxt = nxt2, nxt2 = after, stage = stage == 2 ? 0 : stage + 1;
                }
                cp_async_wait<0>();
                __syncthreads(); // every warp is done with the ring, which MergeSmem overlays
            } else {
                int cur[S];
#pragma unroll
                for (int i = 0; i < S; i++) cur[i] = row_at(s0 + warp + (int64_t)i * NW);
                for (int64_t s = s0 + warp; s < s1; s += NW * S) {
                    DenseRegs<D> r[S];
                    uint32_t valid[S]; // bit j: position j of the step is a token
                    int nxt[S];
#pragma unroll
                    for (int i = 0; i < S; i++) nxt[i] = row_at(s + (int64_t)(S + i) * NW);
#pragma unroll
                    for (int i = 0; i < S; i++) {
                        if (s + (int64_t)i * NW >= s1) continue;
                        const int mine = cur[i];
                        rows_load<D, VMAP_SPLIT>(
                            r[i], Kh, Vh, [&](int jj) -> int64_t { return __shfl_sync(0xffffffffu, mine, jj); }, lane);
                        valid[i] = __ballot_sync(0xffffffffu, mine >= 0) & 0xffffu;
                    }
#pragma unroll
                    for (int i = 0; i < S; i++)
                        if (s + (int64_t)i * NW < s1) masked_compute<D>(st, qb, r[i], valid[i], p.scale, lane);
#pragma unroll
                    for (int i = 0; i < S; i++) cur[i] = nxt[i];
                }
            }
        }
        warp_deposit<D, VMAP_SPLIT, NW>(ms, st, warp, lane);
        __syncthreads();
        __nv_bfloat16 *out = p.o + ((int64_t)b * p.Hq + (int64_t)kvh * G) * D;
        if constexpr (uses_ring<S, SRC>()) {
            if (p.cluster > 1) { // one segment a block, a head's blocks one cluster
                cluster_merge<D, NW>(ms, reinterpret_cast<float *>(smem + slots_offset(front_bytes<D, S, SRC, NW>(), B)), G, out,
                                        tid, false);
                return;
            }
        }
        const int64_t first = block_of(hoff, N, grid), last = block_of(hoff + ns - 1, N, grid);
        finish_head<D, NW>(ms, G, head, first, last, k, p.parts, p.counters, out, &flag_s, tid);
        u = hoff + s1;
    }
}

template <int D, int S, int SRC>
int capacity_of(int B, int *cap)
{
    const int sms = kvb_sm_count();
    if (!sms) return kvb_fail(KVB_EDEVICE, "decode_attn: the device's SM count could not be read");
    int per_sm = 0;
    // the ring takes more than the 48 KB of dynamic shared memory a kernel gets without asking (and, as
    // clusters, the merging block's partial slots past it)
    CUDA_TRY(cudaFuncSetAttribute(decode_attn_kernel<D, S, SRC>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  (int)smem_bytes<D, S, SRC>(DECODE_MAX_B, uses_ring<S, SRC>() ? 8 : 0, MAXG)));
    CUDA_TRY(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, decode_attn_kernel<D, S, SRC>, THREADS,
                                                           smem_bytes<D, S, SRC>(B)));
    *cap = sms * (per_sm > 0 ? per_sm : 1);
    return KVB_OK;
}

template <int D, int SRC>
int capacity_d(int S, int B, int *cap)
{
    return S == 1 ? capacity_of<D, 1, SRC>(B, cap) : capacity_of<D, 2, SRC>(B, cap);
}

int capacity(int D, int S, int SRC, int B, int *cap)
{
    if (SRC == SRC_DENSE) return D == 64 ? capacity_d<64, SRC_DENSE>(S, B, cap) : capacity_d<128, SRC_DENSE>(S, B, cap);
    if (SRC == SRC_IDX) return D == 64 ? capacity_d<64, SRC_IDX>(S, B, cap) : capacity_d<128, SRC_IDX>(S, B, cap);
    return D == 64 ? capacity_d<64, SRC_PAGES>(S, B, cap) : capacity_d<128, SRC_PAGES>(S, B, cap);
}

size_t workspace_layout(const decode_layout *d, int cap, size_t *parts_off)
{
    const size_t heads = (size_t)d->B * d->Hkv, G = (size_t)(d->Hq / d->Hkv);
    *parts_off = (heads * sizeof(int) + 255) & ~(size_t)255;
    return *parts_off + (heads + (size_t)cap) * (size_t)part_slot_floats((int)G, d->D) * sizeof(float);
}

template <int D, int SRC>
cudaError_t launch_d(const DecodeParams &p, int steps, int warps, int grid, cudaStream_t stream)
{
    if constexpr (SRC != SRC_DENSE)
        if (p.cluster > 1 && warps == 2 * WARPS)
            return launch_chained_cluster(decode_attn_kernel<D, 1, SRC, 2 * WARPS>, grid, p.cluster, 64 * WARPS,
                                          smem_bytes<D, 1, SRC, 2 * WARPS>(p.B, p.cluster, p.G), stream, p);
    if (p.cluster > 1)
        return launch_chained_cluster(decode_attn_kernel<D, 1, SRC>, grid, p.cluster, THREADS,
                                      smem_bytes<D, 1, SRC>(p.B, p.cluster, p.G), stream, p);
    if (steps == 1) return launch_chained(decode_attn_kernel<D, 1, SRC>, grid, THREADS, smem_bytes<D, 1, SRC>(p.B), stream, p);
    return launch_chained(decode_attn_kernel<D, 2, SRC>, grid, THREADS, smem_bytes<D, 2, SRC>(p.B), stream, p);
}

// How many clusters of C blocks of NW warps of the ring kernel (with C partial slots of G heads) can be
// resident at once on the current device (resident_clusters_of asks once a shape).
template <int D, int NW>
int resident_clusters(int src, int C, int G, int B, int *out)
{
    void (*kernel)(DecodeParams) = src == SRC_IDX ? decode_attn_kernel<D, 1, SRC_IDX, NW> : decode_attn_kernel<D, 1, SRC_PAGES, NW>;
    const size_t smem = src == SRC_IDX ? smem_bytes<D, 1, SRC_IDX, NW>(B, C, G) : smem_bytes<D, 1, SRC_PAGES, NW>(B, C, G);
    if (NW != WARPS) { // (the 4-warp kernels' limit is set by capacity_of, called before)
        int dev = 0, optin = 0;
        cudaFuncAttributes fa;
        CUDA_TRY(cudaGetDevice(&dev));
        CUDA_TRY(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
        CUDA_TRY(cudaFuncGetAttributes(&fa, kernel));
        const size_t most = (size_t)optin - fa.sharedSizeBytes; // the block's dynamic share beside its static one
        if (smem > most) return *out = 0, KVB_OK;
        CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)most));
    }
    CUDA_TRY(resident_clusters_of(kernel, 32 * NW, smem, C, out));
    return KVB_OK;
}

// Everything checked; `tokens[b]` = positions on each head line of sequence b, `len_host` the lengths.
// Sizes the grid (one resident wave at most, at least `min_steps` 16-token steps per block; the sparse
// sources' rule above) and launches.
int launch(const kvb_bf16 *q, const kvb_bf16 *K, const kvb_bf16 *V, const int32_t *len, const int32_t *len_host,
           kvb_bf16 *o, const decode_layout *d, void *workspace, int steps, int src, const int32_t *list,
           const int32_t *cnt, int n, int P, const int64_t *tokens, int min_steps, cudaStream_t stream)
{
    int64_t N = 0;
    for (int b = 0; b < d->B; b++) N += (tokens[b] + 15) / 16 * d->Hkv;
    int cap = 0, rc;
    if ((rc = capacity(d->D, steps, src, d->B, &cap))) return rc;
    int per_block = min_steps;
    if (min_steps < MIN_STEPS_PER_BLOCK) {
        const int sms = kvb_sm_count();
        per_block = MIN_STEPS_PER_BLOCK;
        while (per_block > min_steps && N / per_block < (int64_t)sms * 7 / 8) per_block /= 2;
    }
    const int64_t want = (N + per_block - 1) / per_block;
    int grid = (int)(want < cap ? (want > 0 ? want : 1) : cap);
    // Every sequence the same length (dense) or list (sparse): a whole number of blocks a head, so that no
    // block straddles two heads (part_begin(j * per_head) = j * steps of a head) and each head's merge
    // waits only on its own blocks (kernels/decode/NOTES.md, Tried: 64 steps a block, 32 a head at B=1
    // L=32K; sparse grids that split heads evenly were the faster ones)
    bool equal = true, equal_len = true;
    for (int b = 1; equal && b < d->B; b++) equal = tokens[b] == tokens[0];
    for (int b = 1; equal_len && b < d->B; b++) equal_len = len_host[b] == len_host[0];
    const int64_t heads = (int64_t)d->B * d->Hkv, head_steps = (tokens[0] + 15) / 16;
    if (equal && heads <= grid) {
        int64_t per_head = grid / heads;
        const int64_t most = head_steps / per_block > 0 ? head_steps / per_block : 1;
        if (per_head > most) per_head = most;
        // Dense: blocks of at least 64 steps where that still gives every SM a block (B=1 L=32K: 32 a
        // head). Not the sparse lists: at B=8 budget 4096 it left 4 blocks a head, slower than 6 (Tried)
        const int64_t long_blocks = head_steps / 64;
        if (src == SRC_DENSE && long_blocks >= 1 && heads * long_blocks >= kvb_sm_count() && per_head > long_blocks)
            per_head = long_blocks;
        grid = (int)(heads * per_head);
    }
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
    p.list = list, p.cnt = cnt, p.n = n, p.P = P, p.page_div = kvb_divisor_of((uint32_t)P);
    p.same_tokens = equal && equal_len ? tokens[0] : 0, p.same_len = len_host[0];
    p.cluster = 0;
    int warps = WARPS;
    // A head's blocks as one cluster where they all fit at once; else, where a head has an even number of
    // blocks, half as many blocks of twice the warps (one a SM: the same warps a head and steps a warp) as
    // one cluster, where those fit (64 heads of 4 blocks: 62 clusters of 4 fit an H200 at 2 blocks a SM,
    // 66 of 2 at one; B=1's 8 heads of 16 blocks: 8 blocks of 8 warps a head, on 64 SMs)
    const int64_t per_head = equal && grid % heads == 0 ? grid / heads : 0;
    if (src != SRC_DENSE && steps == 1 && per_head >= 2 && per_head <= 16) {
        int fits = 0;
        if (per_head <= 8 && (rc = d->D == 64 ? resident_clusters<64, WARPS>(src, (int)per_head, p.G, p.B, &fits)
                                              : resident_clusters<128, WARPS>(src, (int)per_head, p.G, p.B, &fits)))
            return rc;
        if (per_head <= 8 && fits >= heads) {
            p.cluster = (int)per_head;
        } else if (per_head % 2 == 0 && per_head / 2 >= 2) {
            const int C = (int)(per_head / 2);
            if ((rc = d->D == 64 ? resident_clusters<64, 2 * WARPS>(src, C, p.G, p.B, &fits)
                                 : resident_clusters<128, 2 * WARPS>(src, C, p.G, p.B, &fits)))
                return rc;
            if (fits >= heads) p.cluster = C, warps = 2 * WARPS, grid = (int)(heads * C);
        }
    }
    cudaError_t e;
    if (src == SRC_DENSE)
        e = d->D == 64 ? launch_d<64, SRC_DENSE>(p, steps, warps, grid, stream) : launch_d<128, SRC_DENSE>(p, steps, warps, grid, stream);
    else if (src == SRC_IDX)
        e = d->D == 64 ? launch_d<64, SRC_IDX>(p, steps, warps, grid, stream) : launch_d<128, SRC_IDX>(p, steps, warps, grid, stream);
    else
        e = d->D == 64 ? launch_d<64, SRC_PAGES>(p, steps, warps, grid, stream) : launch_d<128, SRC_PAGES>(p, steps, warps, grid, stream);
    CUDA_TRY(e);
    return KVB_OK;
}

int max_capacity(int D, int B, int *cap)
{
    *cap = 0;
    for (int src = SRC_DENSE; src <= SRC_PAGES; src++)
        for (int S = 1; S <= 2; S++) {
            int c = 0;
            int rc = capacity(D, S, src, B, &c);
            if (rc) return rc;
            if (c > *cap) *cap = c;
        }
    return KVB_OK;
}

} // namespace

extern "C" size_t decode_attn_workspace_bytes(const decode_layout *d)
{
    if (decode_layout_check(d, "decode_attn_workspace_bytes")) return 0;
    int cap = 0;
    if (max_capacity(d->D, d->B, &cap)) return 0;
    size_t off;
    return workspace_layout(d, cap, &off);
}

extern "C" size_t sparse_attn_workspace_bytes(const sparse_layout *s)
{
    if (sparse_layout_check(s, "sparse_attn_workspace_bytes")) return 0;
    return decode_attn_workspace_bytes(&s->kv);
}

static int common_checks(const kvb_bf16 *q, const kvb_bf16 *K, const kvb_bf16 *V, const int32_t *len,
                         const int32_t *len_host, kvb_bf16 *o, void *workspace, int steps, const char *who)
{
    if (!q || !K || !V || !len || !len_host || !o)
        return kvb_fail(KVB_EINVAL, "%s: a tensor pointer is NULL (q=%p K=%p V=%p len=%p len_host=%p o=%p)", who,
                        (const void *)q, (const void *)K, (const void *)V, (const void *)len, (const void *)len_host,
                        (void *)o);
    if (!workspace)
        return kvb_fail(KVB_EINVAL, "%s: workspace is NULL (allocate the *_workspace_bytes() it asks for, zeroed once)",
                        who);
    if (steps != 1 && steps != 2) return kvb_fail(KVB_EINVAL, "%s: steps=%d out of range [1, 2]", who, steps);
    int rc;
    if ((rc = kvb_check_aligned16(who, "q", q)) || (rc = kvb_check_aligned16(who, "K", K)) ||
        (rc = kvb_check_aligned16(who, "V", V)))
        return rc;
    return KVB_OK;
}

extern "C" int decode_attn_variant(const kvb_bf16 *q, const kvb_bf16 *K, const kvb_bf16 *V, const int32_t *len,
                                   const int32_t *len_host, kvb_bf16 *o, const decode_layout *d, void *workspace,
                                   int steps, cudaStream_t stream)
{
    const char *who = "decode_attn";
    int rc = decode_layout_check(d, who);
    if (rc || (rc = common_checks(q, K, V, len, len_host, o, workspace, steps, who))) return rc;
    if ((rc = decode_lengths_check(d, len_host, who))) return rc;
    int64_t tokens[DECODE_MAX_B];
    for (int b = 0; b < d->B; b++) tokens[b] = len_host[b];
    return launch(q, K, V, len, len_host, o, d, workspace, steps, SRC_DENSE, NULL, NULL, 0, 1, tokens, MIN_STEPS_PER_BLOCK,
                  stream);
}

extern "C" int decode_attn(const kvb_bf16 *q, const kvb_bf16 *K, const kvb_bf16 *V, const int32_t *len,
                           const int32_t *len_host, kvb_bf16 *o, const decode_layout *d, void *workspace,
                           cudaStream_t stream)
{
    return decode_attn_variant(q, K, V, len, len_host, o, d, workspace, 1, stream);
}

static int sparse_launch(const kvb_bf16 *q, const kvb_bf16 *K, const kvb_bf16 *V, const int32_t *len,
                         const int32_t *len_host, const int32_t *list, const int32_t *list_host, const int32_t *cnt,
                         const int32_t *cnt_host, kvb_bf16 *o, const sparse_layout *s, void *workspace, int steps,
                         int pages, cudaStream_t stream)
{
    const char *who = pages ? "sparse_attn_pages" : "sparse_attn_idx";
    int rc = sparse_layout_check(s, who);
    if (rc || (rc = common_checks(q, K, V, len, len_host, o, workspace, steps, who))) return rc;
    if (!pages && s->P != 1) return kvb_fail(KVB_EINVAL, "%s: P=%d out of range [1, 1]: token lists have no pages", who, s->P);
    if (!list || !cnt || !cnt_host)
        return kvb_fail(KVB_EINVAL, "%s: a list pointer is NULL (%s=%p cnt=%p cnt_host=%p)", who, pages ? "pages" : "idx",
                        (const void *)list, (const void *)cnt, (const void *)cnt_host);
    if (list_host) {
        if ((rc = sparse_lists_check(s, len_host, list_host, cnt_host, pages, who))) return rc;
    } else { // the caller vouches for the entries (a list made on the device by topk_rows / hybrid_score)
        if ((rc = decode_lengths_check(&s->kv, len_host, who))) return rc;
        for (int b = 0; b < s->kv.B; b++)
            if (cnt_host[b] < 1 || cnt_host[b] > s->n)
                return kvb_fail(KVB_EINVAL, "%s: cnt[%d]=%d out of range [1, n = %d]", who, b, cnt_host[b], s->n);
    }
    int64_t tokens[DECODE_MAX_B];
    for (int b = 0; b < s->kv.B; b++) tokens[b] = (int64_t)cnt_host[b] * (pages ? s->P : 1);
    return launch(q, K, V, len, len_host, o, &s->kv, workspace, steps, pages ? SRC_PAGES : SRC_IDX, list, cnt, s->n, s->P, tokens,
                  SPARSE_MIN_STEPS_PER_BLOCK, stream);
}

extern "C" int sparse_attn_idx(const kvb_bf16 *q, const kvb_bf16 *K, const kvb_bf16 *V, const int32_t *len,
                               const int32_t *len_host, const int32_t *idx, const int32_t *idx_host, const int32_t *cnt,
                               const int32_t *cnt_host, kvb_bf16 *o, const sparse_layout *s, void *workspace, int steps,
                               cudaStream_t stream)
{
    return sparse_launch(q, K, V, len, len_host, idx, idx_host, cnt, cnt_host, o, s, workspace, steps, 0, stream);
}

extern "C" int sparse_attn_pages(const kvb_bf16 *q, const kvb_bf16 *K, const kvb_bf16 *V, const int32_t *len,
                                 const int32_t *len_host, const int32_t *pages, const int32_t *pages_host,
                                 const int32_t *cnt, const int32_t *cnt_host, kvb_bf16 *o, const sparse_layout *s,
                                 void *workspace, int steps, cudaStream_t stream)
{
    return sparse_launch(q, K, V, len, len_host, pages, pages_host, cnt, cnt_host, o, s, workspace, steps, 1, stream);
}

// ---- kv_append: one 16-byte vector of K or V per thread; a few KB, so its time is the launch ----
__global__ void kv_append_kernel(const uint4 *knew, const uint4 *vnew, const int32_t *t, uint4 *K, uint4 *V, int Hkv,
                                 int vecs, int64_t L)
{
    chain_wait(); // launched chained (kvb_device.cuh)
    chain_release();
    const int bh = blockIdx.x, i = threadIdx.x % vecs, b = bh / Hkv;
    const int64_t row = ((int64_t)bh * L + t[b]) * vecs + i;
    if (threadIdx.x < vecs) K[row] = knew[(int64_t)bh * vecs + i];
    else V[row] = vnew[(int64_t)bh * vecs + i];
}

extern "C" int kv_append(const kvb_bf16 *knew, const kvb_bf16 *vnew, const int32_t *t, const int32_t *t_host,
                         kvb_bf16 *K, kvb_bf16 *V, const decode_layout *d, cudaStream_t stream)
{
    const char *who = "kv_append";
    int rc = decode_layout_check(d, who);
    if (rc) return rc;
    if (!knew || !vnew || !t || !t_host || !K || !V)
        return kvb_fail(KVB_EINVAL, "%s: a pointer is NULL (knew=%p vnew=%p t=%p t_host=%p K=%p V=%p)", who,
                        (const void *)knew, (const void *)vnew, (const void *)t, (const void *)t_host, (void *)K, (void *)V);
    if ((rc = decode_positions_check(d, t_host, who))) return rc;
    if ((rc = kvb_check_aligned16(who, "knew", knew)) || (rc = kvb_check_aligned16(who, "vnew", vnew)) ||
        (rc = kvb_check_aligned16(who, "K", K)) || (rc = kvb_check_aligned16(who, "V", V)))
        return rc;
    const int vecs = d->D / 8; // D in {64, 128}: whole 16-byte vectors
    CUDA_TRY(launch_chained(kv_append_kernel, d->B * d->Hkv, 2 * vecs, 0, stream, (const uint4 *)knew, (const uint4 *)vnew, t,
                            (uint4 *)K, (uint4 *)V, d->Hkv, vecs, d->L));
    return KVB_OK;
}
