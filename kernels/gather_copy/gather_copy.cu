// gather_copy.cu: index_scan, gather_copy, gather_copy_d2d, gather_copy_misses, gather_copy_all,
// packed_load.
//
// Napkin math (ShadowKV Llama-3-8B decode, Hkv=8, c=8, D=128: 2 KB chunks, M=256 slots):
//   per (b, h) 256 chunks = 512 KB; at 60% hits, 154 hits (device) and 102 misses (host).
//   B=8: misses 13.4 MB over PCIe at ~55 GB/s = ~240 us; hits 20 MB read + 20 MB written at
//   ~3.5 TB/s = ~11 us. The step is PCIe-bound: the miss path must keep enough bytes in flight to
//   saturate the link (~55 GB/s x ~2 us latency = ~110 KB), and the hit moves should hide under it.
//
// Design:
// - misses are read by the SMs straight from pinned host memory (zero-copy), 16-byte loads, 8 per
//   thread in flight: 32 KB per block, far more than the link needs;
// - the hit compaction is in place (slot i <- slot offsets[i], offsets[i] >= i). A block owns a
//   range of slots; it first reads every source of its range (hits from the buffer, misses from the
//   host) into shared memory, publishes "my reads are done", waits until every earlier block of the
//   same (b, h) has published, then writes. A slot can only be read by a hit with a lower index
//   (offsets[h] >= h), i.e. by the same or an earlier block, so no write lands before the read it
//   would clobber. Blocks take their range from their row's atomic ticket, so every block waited on is
//   already running (no dependence on the hardware's block order; the decoupled look-back trick).
//   Hits and PCIe misses of all (b, h) overlap in one launch, with no temporary buffer.
// - gather_copy_misses reads only the misses, after gather_copy_d2d moved the hits: no in-place
//   reads, so no ordering, and a grid capped below one block per range (each block loops over
//   ranges) keeps the link's rate while leaving SMs to the kernels beside it.
#include <climits>
#include <cstdint>

#include <cub/block/block_radix_sort.cuh>
#include <cub/block/block_scan.cuh>

#include "kernels/common/kvb_cuda.h"
#include "kernels/common/kvb_device.cuh"
#include "kernels/common/kvb_grid.h"
#include "kernels/gather_copy/gather_copy.h"

using kvb_dev::smem_u32;
using kvb_dev::bulk_copy;
using kvb_dev::mbar_expect_tx;
using kvb_dev::mbar_init;
using kvb_dev::mbar_init_fence;
using kvb_dev::mbar_wait;

// ------------------------------------------------------------------------------------------------
// index_scan
// ------------------------------------------------------------------------------------------------

constexpr int SCAN_THREADS = 256;
constexpr int32_t EMPTY_KEY = -1; // valid chunk ids are >= 0

// Open-addressing hash set of chunk ids in shared memory (size a power of two, >= 2x the ids).
__device__ __forceinline__ uint32_t hash_slot(int32_t id, uint32_t mask) { return ((uint32_t)id * 0x9E3779B1u) & mask; }

__device__ __forceinline__ void set_insert(int32_t *set, uint32_t mask, int32_t id)
{
    for (uint32_t h = hash_slot(id, mask);; h = (h + 1) & mask) {
        int32_t prev = atomicCAS(&set[h], EMPTY_KEY, id);
        if (prev == EMPTY_KEY || prev == id) return;
    }
}

__device__ __forceinline__ bool set_contains(const int32_t *set, uint32_t mask, int32_t id)
{
    for (uint32_t h = hash_slot(id, mask);; h = (h + 1) & mask) {
        int32_t k = set[h];
        if (k == id) return true;
        if (k == EMPTY_KEY) return false;
    }
}

// One block per (b, h); items in the blocked arrangement (thread t holds slots t*IPT .. +IPT-1).
// Membership both ways through two hash sets. Misses are listed in ascending id order: for small
// rows (RANK_BY_COUNT) each miss counts the smaller misses in shared memory, O(M) per thread but
// with no barrier-heavy passes; larger rows radix-sort the new ids once, over only the bits the
// largest id needs. Hit positions come from a block-wide exclusive scan in old-slot order.
template <int IPT, bool RANK_BY_COUNT>
__global__ void __launch_bounds__(SCAN_THREADS)
index_scan_kernel(int32_t *cached_ids, const int32_t *__restrict__ new_ids, int32_t *offsets, int32_t *cnts, int M)
{
    constexpr int CAP = SCAN_THREADS * IPT, SET = 2 * CAP;
    using Sort = cub::BlockRadixSort<int32_t, SCAN_THREADS, IPT>;
    using Scan = cub::BlockScan<int32_t, SCAN_THREADS>;
    __shared__ union {
        typename Sort::TempStorage sort;
        typename Scan::TempStorage scan;
    } tmp;
    __shared__ int32_t max_id;
    extern __shared__ int32_t scan_smem[]; // [old set | new set | new ids (sorted, or misses: id or -1)]
    int32_t *old_set = scan_smem, *new_set = scan_smem + SET, *new_list = scan_smem + 2 * SET;
    const uint32_t mask = SET - 1;

    const int64_t row = (int64_t)blockIdx.x * M;
    const int t = threadIdx.x;
    for (int k = t; k < 2 * SET; k += SCAN_THREADS) scan_smem[k] = EMPTY_KEY;
    if (t == 0) max_id = 0;
    int32_t old_mine[IPT], keys[IPT], my_max = 0;
#pragma unroll
    for (int i = 0; i < IPT; i++) {
        int j = t * IPT + i;
        keys[i] = j < M ? new_ids[row + j] : INT_MAX; // padding sorts last, past the first M
        old_mine[i] = j < M ? cached_ids[row + j] : EMPTY_KEY;
        if (j < M) my_max = max(my_max, keys[i]);
    }
    __syncthreads();
    if (!RANK_BY_COUNT) atomicMax(&max_id, my_max);
#pragma unroll
    for (int i = 0; i < IPT; i++) {
        if (old_mine[i] >= 0) set_insert(old_set, mask, old_mine[i]);
        if (t * IPT + i < M) set_insert(new_set, mask, keys[i]);
    }
    __syncthreads();
    int32_t hit[IPT], miss[IPT], hit_pos[IPT], n_hit;
    if (!RANK_BY_COUNT) {
        // ids < 2^end_bit; INT_MAX padding has every low bit set, so it still sorts after them
        // (stably, behind an id equal to 2^end_bit - 1)
        const int end_bit = max(1, 32 - __clz(max_id));
        Sort(tmp.sort).Sort(keys, 0, end_bit);
        __syncthreads(); // tmp is reused by the scan below
    }
#pragma unroll
    for (int i = 0; i < IPT; i++) {
        int j = t * IPT + i;
        hit[i] = old_mine[i] >= 0 && set_contains(new_set, mask, old_mine[i]);
        miss[i] = j < M && !set_contains(old_set, mask, keys[i]);
        new_list[j] = RANK_BY_COUNT ? (miss[i] ? keys[i] : -1) : keys[i];
    }
    Scan(tmp.scan).ExclusiveSum(hit, hit_pos, n_hit);
    int32_t miss_pos[IPT];
    if (RANK_BY_COUNT) {
        // rank of each miss among the misses (ids are unique); entries past M are -1 (written
        // above: j runs over the whole capacity). 16-byte broadcast reads, unrolled, so the
        // shared-memory loads overlap instead of forming a dependent chain
        __syncthreads(); // new_list complete
#pragma unroll
        for (int i = 0; i < IPT; i++) miss_pos[i] = 0;
        const int4 *list4 = reinterpret_cast<const int4 *>(new_list);
#pragma unroll 4
        for (int j = 0; j < (M + 3) / 4; j++) {
            int4 o = list4[j];
#pragma unroll
            for (int i = 0; i < IPT; i++)
                miss_pos[i] += (o.x >= 0 && o.x < keys[i]) + (o.y >= 0 && o.y < keys[i]) +
                               (o.z >= 0 && o.z < keys[i]) + (o.w >= 0 && o.w < keys[i]);
        }
    } else {
        int32_t n_miss;
        __syncthreads();
        Scan(tmp.scan).ExclusiveSum(miss, miss_pos, n_miss);
    }
    // Every read of cached_ids happened before the first barrier, so the in-place update is safe.
#pragma unroll
    for (int i = 0; i < IPT; i++) {
        int j = t * IPT + i;
        if (hit[i]) {
            offsets[row + hit_pos[i]] = j;
            cached_ids[row + hit_pos[i]] = old_mine[i];
        }
        if (miss[i]) {
            int p = n_hit + miss_pos[i];
            offsets[row + p] = keys[i];
            cached_ids[row + p] = keys[i];
        }
    }
    if (t == 0) cnts[blockIdx.x] = n_hit;
}

template <int IPT, bool RANK_BY_COUNT>
static int launch_index_scan(int32_t *cached, const int32_t *fresh, int32_t *offsets, int32_t *cnts, int rows,
                             int M, cudaStream_t s)
{
    size_t smem = sizeof(int32_t) * 5 * SCAN_THREADS * IPT; // two sets of 2*CAP, the id list of CAP
    // opted in whatever the size: cub's sort and scan storage is static shared memory on top of this, and
    // the two together pass the default 48 KB a block from IPT = 8 (40 KB dynamic) on
    static unsigned long long opted;
    if (int rc = kvb_smem_optin((const void *)index_scan_kernel<IPT, RANK_BY_COUNT>, (int)smem, &opted)) return rc;
    index_scan_kernel<IPT, RANK_BY_COUNT><<<rows, SCAN_THREADS, smem, s>>>(cached, fresh, offsets, cnts, M);
    CUDA_TRY(cudaGetLastError());
    return KVB_OK;
}

extern "C" int index_scan(int32_t *cached_ids, const int32_t *new_ids, int32_t *offsets, int32_t *cnts, int B,
                          int Hkv, int M, cudaStream_t stream)
{
    if (B < 1 || B > 1024) return kvb_fail(KVB_EINVAL, "index_scan: B=%d out of range [1, 1024]", B);
    if (Hkv < 1 || Hkv > 256) return kvb_fail(KVB_EINVAL, "index_scan: Hkv=%d out of range [1, 256]", Hkv);
    if (M < 1 || M > GATHER_MAX_M) return kvb_fail(KVB_EINVAL, "index_scan: M=%d out of range [1, %d]", M, GATHER_MAX_M);
    if (!cached_ids || !new_ids || !offsets || !cnts) return kvb_fail(KVB_EINVAL, "index_scan: a NULL pointer argument");
    int rows = B * Hkv;
    if (M <= SCAN_THREADS * 1) return launch_index_scan<1, true>(cached_ids, new_ids, offsets, cnts, rows, M, stream);
    if (M <= SCAN_THREADS * 2) return launch_index_scan<2, true>(cached_ids, new_ids, offsets, cnts, rows, M, stream);
    if (M <= SCAN_THREADS * 4) return launch_index_scan<4, false>(cached_ids, new_ids, offsets, cnts, rows, M, stream);
    if (M <= SCAN_THREADS * 8) return launch_index_scan<8, false>(cached_ids, new_ids, offsets, cnts, rows, M, stream);
    return launch_index_scan<16, false>(cached_ids, new_ids, offsets, cnts, rows, M, stream);
}

// ------------------------------------------------------------------------------------------------
// gather_copy, gather_copy_d2d, gather_copy_misses, gather_copy_all
// ------------------------------------------------------------------------------------------------

constexpr int GC_THREADS = 256;
constexpr int GC_STAGE_BYTES = 32 * 1024; // bytes staged per block: sets the slots per block
constexpr int GC_MAX_SLOTS = 64;          // slots per block, at most (tiny chunks)
constexpr int GC_UNROLL = 8;              // 16-byte loads in flight per thread

// Ordering state per (b, h) row: a block ticket, the blocks finished in this launch, and a launch
// epoch; a row's flags hold epoch + 1 once that block's reads are done. Per-row counters keep the
// atomics spread over many addresses (one global ticket serialized ~10K same-address atomics in L2).
struct RowState {
    unsigned ticket, done, epoch, pad;
};

static int slots_per_block(const gather_layout *g)
{
    int64_t r = GC_STAGE_BYTES / gather_chunk_bytes(g);
    if (r < 1) r = 1;
    if (r > GC_MAX_SLOTS) r = GC_MAX_SLOTS;
    if (r > g->M) r = g->M;
    return (int)r;
}

struct GatherArgs {
    const uint4 *host;     // Vh (pinned host) or nullptr
    uint4 *buf;            // Vbuf / Kbuf
    const int32_t *offsets;
    const int32_t *cnts;   // nullptr: every slot is a miss (gather_copy_all)
    RowState *rows;        // [B*Hkv] ordering state (HITS kernels)
    unsigned *flags;       // [B*Hkv, nblk]
    int M, slots, nblk, chunk16;
    int64_t buf_row16;     // NB*D/8: uint4 per (b, h) row of the buffer
    int64_t sparse16;      // sparse_start*D/8
    int64_t host_row16;    // host_stride * chunk16
    int64_t items;         // B*Hkv*nblk (row, slot range) items (gather_copy_misses)
};

__device__ __forceinline__ unsigned load_acquire(const unsigned *p)
{
    unsigned v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void store_release(unsigned *p, unsigned v)
{
    asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// The block's slots, 16 bytes per thread and UNROLL loads in flight: the chunk of slot first + s
// from src[s] (null: nothing to move) into the buffer row, or into `stage` (TO_STAGE, word w of the
// block's range) when the sources are read in place.
template <bool TO_STAGE, int UNROLL>
__device__ __forceinline__ void copy_slots(const uint4 *const *src, uint4 *stage, uint4 *row, int first, int total,
                                           int chunk16)
{
    for (int base = threadIdx.x; base < total; base += UNROLL * GC_THREADS) {
        uint4 v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            int w = base + u * GC_THREADS;
            if (w < total) {
                int s = w / chunk16;
                if (src[s]) v[u] = src[s][w - s * chunk16];
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            int w = base + u * GC_THREADS;
            if (w < total) {
                int s = w / chunk16;
                if (!src[s]) continue;
                if (TO_STAGE) stage[w] = v[u];
                else row[(int64_t)(first + s) * chunk16 + (w - s * chunk16)] = v[u];
            }
        }
    }
}

// HITS: slots below cnts[bh] move inside the buffer (ordered, see the file comment).
// MISSES: slots from cnts[bh] on are read from the host.
// With hits, 4 loads in flight per thread and 40 registers let 6 blocks share an SM: block lifetimes
// are short and latency-bound, so residency matters more than loads per thread.
template <bool HITS, bool MISSES>
__global__ void __launch_bounds__(GC_THREADS, HITS ? 6 : 1) gather_slots_kernel(GatherArgs a)
{
    extern __shared__ uint4 stage[];
    __shared__ const uint4 *src[GC_MAX_SLOTS];
    __shared__ unsigned s_ticket, s_epoch;
    const int t = threadIdx.x;

    // Block -> (row, range). With hits, the range comes from the row's ticket, so every earlier
    // range of the row belongs to a block that is already running or done.
    const int64_t bh = blockIdx.x / a.nblk;
    int blk = blockIdx.x % a.nblk;
    // the epoch and the hit count do not depend on the ticket: all three requests fly together
    const int cnt = HITS ? a.cnts[bh] : 0;
    if (HITS) {
        if (t == 0) {
            s_epoch = *(volatile unsigned *)&a.rows[bh].epoch; // stable until the row's last block ends
            s_ticket = atomicAdd(&a.rows[bh].ticket, 1u);
        }
        __syncthreads();
        blk = s_ticket;
    }
    const int first = blk * a.slots;
    const int n = min(a.slots, a.M - first);
    const int32_t *off = a.offsets + bh * a.M;
    uint4 *row = a.buf + bh * a.buf_row16 + a.sparse16; // slot i starts at row + i*chunk16

    if (t < n) {
        int i = first + t;
        const uint4 *p = nullptr;
        if (i < cnt) {
            int s = off[i];
            if (s != i) p = row + (int64_t)s * a.chunk16; // a hit onto itself needs no move
        } else if (MISSES) {
            p = a.host + bh * a.host_row16 + (int64_t)off[i] * a.chunk16;
        }
        src[t] = p;
    }
    __syncthreads();

    const int total = n * a.chunk16;
    copy_slots<HITS, HITS ? GC_UNROLL / 2 : GC_UNROLL>(src, stage, row, first, total, a.chunk16);
    if (!HITS) return;

    __syncthreads(); // every read of this block is complete
    const unsigned mark = s_epoch + 1;
    unsigned *flags = a.flags + bh * a.nblk;
    bool writes = false;
    for (int s = 0; s < n; s++) writes |= src[s] != nullptr;
    if (t < 32) {
        if (t == 0) {
            __threadfence();
            store_release(&flags[blk], mark);
        }
        // a block that writes waits until every earlier block of its (b, h) has read its sources
        if (writes)
            for (int b = t; b < blk; b += 32)
                while (load_acquire(&flags[b]) != mark) __nanosleep(64);
        __syncwarp();
    }
    __syncthreads();
    for (int w = t; w < total; w += GC_THREADS) {
        int s = w / a.chunk16;
        if (src[s]) row[(int64_t)(first + s) * a.chunk16 + (w - s * a.chunk16)] = stage[w];
    }
    if (t == 0) {
        __threadfence();
        if (atomicAdd(&a.rows[bh].done, 1u) == (unsigned)a.nblk - 1) { // the row's last block resets it
            a.rows[bh].ticket = 0;
            a.rows[bh].done = 0;
            __threadfence();
            *(volatile unsigned *)&a.rows[bh].epoch = s_epoch + 1;
        }
    }
}

// gather_copy_misses: the slots from cnts[bh] on, read from the host once gather_copy_d2d moved the
// hits (slots below cnts[bh] are left alone). Nothing is read in place, so no ordering: the grid may
// be capped below one block per (row, range) item, each block looping over items.
__global__ void __launch_bounds__(GC_THREADS) gather_misses_kernel(GatherArgs a)
{
    __shared__ const uint4 *src[GC_MAX_SLOTS];
    const int t = threadIdx.x;
    for (int64_t item = blockIdx.x; item < a.items; item += gridDim.x) {
        const int64_t bh = item / a.nblk;
        const int first = (int)(item % a.nblk) * a.slots;
        const int n = min(a.slots, a.M - first);
        const int cnt = a.cnts[bh];
        if (first + n <= cnt) continue; // hits only (uniform in the block)
        const int32_t *off = a.offsets + bh * a.M;
        uint4 *row = a.buf + bh * a.buf_row16 + a.sparse16;
        if (t < n) {
            int i = first + t;
            src[t] = i < cnt ? nullptr : a.host + bh * a.host_row16 + (int64_t)off[i] * a.chunk16;
        }
        __syncthreads();
        copy_slots<false, GC_UNROLL>(src, nullptr, row, first, n * a.chunk16, a.chunk16);
        __syncthreads(); // src is the next item's
    }
}

static GatherArgs make_args(const kvb_bf16 *host, kvb_bf16 *buf, const int32_t *offsets, const int32_t *cnts,
                            const gather_layout *g, void *ws)
{
    GatherArgs a;
    a.host = (const uint4 *)host;
    a.buf = (uint4 *)buf;
    a.offsets = offsets;
    a.cnts = cnts;
    a.M = g->M;
    a.slots = slots_per_block(g);
    a.nblk = (g->M + a.slots - 1) / a.slots;
    a.items = (int64_t)g->B * g->Hkv * a.nblk;
    a.rows = (RowState *)ws;
    a.flags = ws ? (unsigned *)(a.rows + (int64_t)g->B * g->Hkv) : nullptr;
    a.chunk16 = (int)(gather_chunk_bytes(g) / 16);
    a.buf_row16 = (int64_t)g->NB * g->D / 8;
    a.sparse16 = (int64_t)g->sparse_start * g->D / 8;
    a.host_row16 = g->host_stride * a.chunk16;
    return a;
}

template <bool HITS, bool MISSES>
static int launch_gather(const GatherArgs &a, int rows, cudaStream_t s)
{
    size_t smem = HITS ? (size_t)a.slots * a.chunk16 * 16 : 0;
    if (smem > 48 * 1024)
        CUDA_TRY(cudaFuncSetAttribute(gather_slots_kernel<HITS, MISSES>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    if (HITS) // staging lives in shared memory: let it take the whole carveout, so 6 blocks fit an SM
        CUDA_TRY(cudaFuncSetAttribute(gather_slots_kernel<HITS, MISSES>,
                                      cudaFuncAttributePreferredSharedMemoryCarveout, 100));
    unsigned blocks = (unsigned)((int64_t)rows * a.nblk);
    gather_slots_kernel<HITS, MISSES><<<blocks, GC_THREADS, smem, s>>>(a);
    CUDA_TRY(cudaGetLastError());
    return KVB_OK;
}

extern "C" size_t gather_copy_workspace_bytes(const gather_layout *g)
{
    int slots = slots_per_block(g);
    int64_t rows = (int64_t)g->B * g->Hkv;
    return sizeof(RowState) * (size_t)rows + sizeof(unsigned) * (size_t)(rows * ((g->M + slots - 1) / slots));
}

extern "C" int gather_copy(const kvb_bf16 *Vh, kvb_bf16 *Vbuf, const int32_t *offsets, const int32_t *cnts,
                           const gather_layout *g, void *workspace, cudaStream_t stream)
{
    if (gather_layout_check(g, "gather_copy")) return KVB_EINVAL;
    if (!Vh || !Vbuf || !offsets || !cnts || !workspace) return kvb_fail(KVB_EINVAL, "gather_copy: a NULL pointer argument");
    return launch_gather<true, true>(make_args(Vh, Vbuf, offsets, cnts, g, workspace), g->B * g->Hkv, stream);
}

extern "C" int gather_copy_d2d(kvb_bf16 *Kbuf, const int32_t *offsets, const int32_t *cnts, const gather_layout *g,
                               void *workspace, cudaStream_t stream)
{
    if (gather_layout_check(g, "gather_copy_d2d")) return KVB_EINVAL;
    if (!Kbuf || !offsets || !cnts || !workspace) return kvb_fail(KVB_EINVAL, "gather_copy_d2d: a NULL pointer argument");
    return launch_gather<true, false>(make_args(nullptr, Kbuf, offsets, cnts, g, workspace), g->B * g->Hkv, stream);
}

extern "C" int gather_copy_misses(const kvb_bf16 *Vh, kvb_bf16 *Vbuf, const int32_t *offsets, const int32_t *cnts,
                                  const gather_layout *g, int max_blocks, cudaStream_t stream)
{
    if (gather_layout_check(g, "gather_copy_misses")) return KVB_EINVAL;
    if (max_blocks < 1 || max_blocks > 65535)
        return kvb_fail(KVB_EINVAL, "gather_copy_misses: max_blocks=%d out of range [1, 65535]", max_blocks);
    if (!Vh || !Vbuf || !offsets || !cnts) return kvb_fail(KVB_EINVAL, "gather_copy_misses: a NULL pointer argument");
    const GatherArgs a = make_args(Vh, Vbuf, offsets, cnts, g, nullptr);
    gather_misses_kernel<<<(unsigned)(a.items < max_blocks ? a.items : max_blocks), GC_THREADS, 0, stream>>>(a);
    CUDA_TRY(cudaGetLastError());
    return KVB_OK;
}

extern "C" int gather_copy_all(const kvb_bf16 *Vh, kvb_bf16 *Vbuf, const int32_t *ids, const gather_layout *g,
                               cudaStream_t stream)
{
    if (gather_layout_check(g, "gather_copy_all")) return KVB_EINVAL;
    if (!Vh || !Vbuf || !ids) return kvb_fail(KVB_EINVAL, "gather_copy_all: a NULL pointer argument");
    return launch_gather<false, true>(make_args(Vh, Vbuf, ids, nullptr, g, nullptr), g->B * g->Hkv, stream);
}

// gather_copy_all, TMA variant: one thread per block issues a bulk copy (cp.async.bulk, the
// Hopper copy engine inside the SM) per chunk from pinned host memory into shared memory, completing
// on an mbarrier, then bulk-stores the chunks to the buffer. An experiment against the 16-byte-load
// path: whether the bulk engine's reads of host memory cross PCIe more efficiently (they do not:
// kernels/gather_copy/NOTES.md, Tried).

__global__ void __launch_bounds__(32) gather_all_tma_kernel(GatherArgs a)
{
    extern __shared__ __align__(128) uint4 stage_tma[];
    __shared__ __align__(8) uint64_t bar;
    if (threadIdx.x != 0) return;
    const int64_t bh = blockIdx.x / a.nblk;
    const int blk = blockIdx.x % a.nblk;
    const int first = blk * a.slots;
    const int n = min(a.slots, a.M - first);
    const uint32_t bytes = (uint32_t)a.chunk16 * 16;
    const int32_t *off = a.offsets + bh * a.M + first;
    uint4 *row = a.buf + bh * a.buf_row16 + a.sparse16 + (int64_t)first * a.chunk16;
    mbar_init(&bar, 1);
    mbar_init_fence();
    mbar_expect_tx(&bar, bytes * n);
    for (int s = 0; s < n; s++)
        bulk_copy(stage_tma + (int64_t)s * a.chunk16, a.host + bh * a.host_row16 + (int64_t)off[s] * a.chunk16, bytes, &bar);
    mbar_wait(&bar, 0);
    for (int s = 0; s < n; s++)
        asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;"
                     ::"l"(row + (int64_t)s * a.chunk16), "r"(smem_u32(stage_tma + (int64_t)s * a.chunk16)), "r"(bytes)
                     : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

extern "C" int gather_copy_all_tma(const kvb_bf16 *Vh, kvb_bf16 *Vbuf, const int32_t *ids, const gather_layout *g,
                                   cudaStream_t stream)
{
    if (gather_layout_check(g, "gather_copy_all_tma")) return KVB_EINVAL;
    if (!Vh || !Vbuf || !ids) return kvb_fail(KVB_EINVAL, "gather_copy_all_tma: a NULL pointer argument");
    GatherArgs a = make_args(Vh, Vbuf, ids, nullptr, g, nullptr);
    size_t smem = (size_t)a.slots * a.chunk16 * 16;
    if (smem > 48 * 1024)
        CUDA_TRY(cudaFuncSetAttribute(gather_all_tma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    unsigned blocks = (unsigned)((int64_t)g->B * g->Hkv * a.nblk);
    gather_all_tma_kernel<<<blocks, 32, smem, stream>>>(a);
    CUDA_TRY(cudaGetLastError());
    return KVB_OK;
}

// ------------------------------------------------------------------------------------------------
// packed_load
// ------------------------------------------------------------------------------------------------

struct PackedArgs {
    const uint4 *src[PACKED_MAX_LAYERS]; // per layer: [B, T, row16]
    uint4 *dst[PACKED_MAX_LAYERS];       // per layer: [B, k, row16]
    const int32_t *idx;                  // [B, k]
    int B, T, k, row16, rows_per_block, nblk;
};

// Block = (layer, b, range of selected rows); 16-byte loads, GC_UNROLL in flight per thread.
__global__ void __launch_bounds__(GC_THREADS) packed_load_kernel(const __grid_constant__ PackedArgs a)
{
    const int blk = blockIdx.x % a.nblk;
    const int lb = blockIdx.x / a.nblk; // layer * B + b
    const int l = lb / a.B, b = lb % a.B;
    const int first = blk * a.rows_per_block;
    const int n = min(a.rows_per_block, a.k - first);
    const int total = n * a.row16;
    const int32_t *idx = a.idx + (int64_t)b * a.k + first;
    const uint4 *src = a.src[l] + (int64_t)b * a.T * a.row16;
    uint4 *dst = a.dst[l] + ((int64_t)b * a.k + first) * a.row16;
    for (int base = threadIdx.x; base < total; base += GC_UNROLL * GC_THREADS) {
        uint4 v[GC_UNROLL];
#pragma unroll
        for (int u = 0; u < GC_UNROLL; u++) {
            int w = base + u * GC_THREADS;
            if (w < total) {
                int r = w / a.row16;
                v[u] = src[(int64_t)idx[r] * a.row16 + (w - r * a.row16)];
            }
        }
#pragma unroll
        for (int u = 0; u < GC_UNROLL; u++) {
            int w = base + u * GC_THREADS;
            if (w < total) dst[w] = v[u];
        }
    }
}

extern "C" int packed_load(const kvb_bf16 *const *KVh, kvb_bf16 *const *KVg, const int32_t *idx,
                           const packed_layout *p, cudaStream_t stream)
{
    if (packed_layout_check(p, "packed_load")) return KVB_EINVAL;
    if (!KVh || !KVg || !idx) return kvb_fail(KVB_EINVAL, "packed_load: a NULL pointer argument");
    PackedArgs a;
    for (int l = 0; l < p->layers; l++) {
        if (!KVh[l] || !KVg[l]) return kvb_fail(KVB_EINVAL, "packed_load: layer %d has a NULL pointer", l);
        a.src[l] = (const uint4 *)KVh[l];
        a.dst[l] = (uint4 *)KVg[l];
    }
    a.idx = idx;
    a.B = p->B, a.T = p->T, a.k = p->k;
    a.row16 = (int)(packed_row_elems(p) * 2 / 16);
    a.rows_per_block = GC_STAGE_BYTES / (a.row16 * 16);
    if (a.rows_per_block < 1) a.rows_per_block = 1;
    a.nblk = (p->k + a.rows_per_block - 1) / a.rows_per_block;
    unsigned blocks = 0; // one per (layer, b, rows_per_block selected rows)
    if (kvb_grid_x("packed_load", "layers*B*ceil(k/rows_per_block) (blocks)", (int64_t)p->layers * p->B * a.nblk, 1, &blocks))
        return KVB_EINVAL;
    packed_load_kernel<<<blocks, GC_THREADS, 0, stream>>>(a);
    CUDA_TRY(cudaGetLastError());
    return KVB_OK;
}
