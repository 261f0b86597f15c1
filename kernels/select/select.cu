// select.cu: the suite's top-k (select.h). Radix select of the k-th largest order-preserving key,
// 11 + 11 + 10 bits from the top, then an ordered compaction. Contract, budget and measurements:
// kernels/select/NOTES.md.
//
// Napkin math (~4.5 TB/s read): rows=256 n=128K is 128 MiB of scores: one read ~30 us; the goal is
// 3 reads + 10 us. One block per row reads its row from DRAM in the first pass; the next passes and
// the compaction find it in L2 only while the rows in flight fit (256 rows x 512 KiB do not: up to 4
// DRAM reads). Few rows (the single-row shapes, 0.5-8 MiB) fit in L2: their cost is the launches (the
// workspace's clear, a histogram per pass, the count and write: 5 kernels) more than the bytes. Short
// rows (n <= 8K: page and chunk selections, e.g. RocketKV's 64 rows x 4239 pages, 136 KB to 1 MB of
// scores) are read once into shared memory by one block each and selected there in one launch.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include <cooperative_groups.h>
#include <cub/block/block_reduce.cuh>

#include "kernels/common/kvb_cuda.h"
#include "kernels/common/kvb_device.cuh"
#include "kernels/common/kvb_grid.h"
#include "kernels/select/select.h"
#include "kernels/select/select_row.cuh"

namespace {

using namespace kvb_select; // THREADS, NBINS, the passes and select_row (select_row.cuh)
using kvb_dev::chain_release;
using kvb_dev::chain_wait;
using kvb_dev::launch_cluster;
using kvb_dev::launch_chained;

constexpr int MIN_SPLIT = SMEM_ROW_N / 2; // elements per block of a split row, at least: a row short enough
                                        // for shared memory would split into at most 2 blocks

// Long rows: every pass reads the row again (from L2 while the rows in flight fit).
__global__ void __launch_bounds__(THREADS) topk_row_kernel(const float *scores, int64_t ld, int n, int k,
                                                           int tail_first, int tail_n, int32_t *idx, int64_t ldo)
{
    __shared__ SelectSmem s;
    int32_t *out = idx + blockIdx.x * ldo;
    if (trivial_row(n, k, tail_first, tail_n, out)) return;
    select_row(s, GlobalKeys{scores + blockIdx.x * ld}, n, k, out);
}

// ---- many long rows: a threshold from a sample of the row, then one read of it ----

// Rows of at least SAMPLED_MIN_N keys, where one block per row takes them (rows >= SMs), and whose
// candidates fit CAND_MAX: SAMPLE keys evenly spaced give a threshold t_lo that about
// k + 4 sqrt(k n / SAMPLE) keys of the row reach (4 standard deviations above k), one read of the row
// gathers those keys with their indices into shared memory, and the selection runs there: about 1.25
// reads of the row (the sample's sectors a quarter of it at most) where the radix passes read it 3-4
// times. A sample that leaves fewer than k candidates, or more than CAND_MAX, falls back to the passes
// over the row (the same selection, by the same tie rule).
constexpr int SAMPLE = 4096;
constexpr int SAMPLED_MIN_N = 16 * SAMPLE; // a sampled key per 16: its 32-byte sector a quarter of the row
constexpr int CAND_MAX = 8192;             // keys and indices: 64 KB of shared memory
constexpr size_t SAMPLED_SMEM = (size_t)CAND_MAX * (sizeof(uint32_t) + sizeof(int32_t));

// The sample's rank whose key is t_lo: k S / n plus 4 standard deviations, at least 1 and at most S.
__host__ __device__ inline int sample_rank(int n, int k)
{
    const double mean = (double)k * SAMPLE / n;
    const int r = (int)ceil(mean + 4.0 * sqrt(mean)) + 1;
    return r < SAMPLE ? r : SAMPLE;
}

// The plan's shapes: long rows, and candidates (rank r of the sample leaves about r n / S keys) well
// inside CAND_MAX.
bool sampled_rows(int n, int k)
{
    return n >= SAMPLED_MIN_N && k > 0 && k < n && (double)sample_rank(n, k) * n / SAMPLE + 4.0 * sqrt((double)k) <= 0.9 * CAND_MAX;
}

// Every key of the row at or above t_lo with its index, in index order, into key_out / pos_out (the
// first `cap` of them); returns how many there are (more than cap: an overflow). Tiles of TILE keys,
// ITEMS consecutive a thread, the next tile's loads issued before this one is counted.
inline __device__ int collect_at_least(SelectSmem &s, GlobalKeys keys, int n, uint32_t t_lo, uint32_t *key_out,
                                       int32_t *pos_out, int cap)
{
    int written = 0;
    uint32_t key[ITEMS], next[ITEMS];
    load_items(keys, threadIdx.x * ITEMS, n, key);
    for (int base = 0; base < n; base += TILE) {
        const int first = base + threadIdx.x * ITEMS;
        if (base + TILE < n) load_items(keys, first + TILE, n, next);
        int mine = 0;
#pragma unroll
        for (int j = 0; j < ITEMS; ++j) mine += first + j < n && key[j] >= t_lo;
        int before, total;
        Scan(s.scan).ExclusiveSum(mine, before, total);
        __syncthreads(); // the scan storage is reused next tile
        int pos = written + before;
#pragma unroll
        for (int j = 0; j < ITEMS; ++j)
            if (first + j < n && key[j] >= t_lo) {
                if (pos < cap) key_out[pos] = key[j], pos_out[pos] = first + j;
                ++pos;
            }
        written += total;
#pragma unroll
        for (int j = 0; j < ITEMS; ++j) key[j] = next[j];
    }
    return written;
}

__global__ void __launch_bounds__(THREADS) topk_row_sampled_kernel(const float *scores, int64_t ld, int n, int k,
                                                                   int tail_first, int tail_n, int32_t *idx, int64_t ldo)
{
    __shared__ SelectSmem s;
    extern __shared__ uint32_t cand_key[]; // CAND_MAX keys (first the sample's), then their CAND_MAX indices
    int32_t *cand_pos = reinterpret_cast<int32_t *>(cand_key + CAND_MAX);
    int32_t *out = idx + blockIdx.x * ldo;
    if (trivial_row(n, k, tail_first, tail_n, out)) return;
    const float *x = scores + blockIdx.x * ld;
#pragma unroll
    for (int i = threadIdx.x; i < SAMPLE; i += THREADS) cand_key[i] = order_key(__ldg(x + (int64_t)i * n / SAMPLE));
    __syncthreads();
    int need;
    uint32_t t_lo = radix_threshold(s, SmemKeys{cand_key}, SAMPLE, sample_rank(n, k), &need);
    if (need == 0) t_lo += 1; // the passes ended early: the keys above T (radix_threshold)
    // (radix_threshold ends on a barrier: the sample is read before the candidates overwrite it)
    const int count = collect_at_least(s, GlobalKeys{x}, n, t_lo, cand_key, cand_pos, CAND_MAX);
    if (count < k || count > CAND_MAX) { // the same in every thread
        select_row(s, GlobalKeys{x}, n, k, out);
        return;
    }
    __syncthreads();
    select_row(s, SmemKeys{cand_key}, count, k, out, ListIndex{cand_pos});
}

// The keys of x[0, n) into shared memory: 16-byte loads, four a thread in flight, from the first
// 16-byte boundary of the row (scalar head and tail); a row of 48K keys is 21 vectors a thread.
__device__ __forceinline__ void fill_row_keys(uint32_t *keys, const float *x, int n)
{
    const int mis = (int)(((uintptr_t)x >> 2) & 3); // floats before the 16-byte boundary
    const int head = mis ? min(n, 4 - mis) : 0;
    for (int i = threadIdx.x; i < head; i += THREADS) keys[i] = order_key(__ldg(x + i));
    const int nvec = (n - head) / 4;
    const float4 *v = reinterpret_cast<const float4 *>(x + head);
    uint32_t *kv = keys + head;
    auto put = [&](int j, float4 a) {
        kv[4 * j] = order_key(a.x), kv[4 * j + 1] = order_key(a.y);
        kv[4 * j + 2] = order_key(a.z), kv[4 * j + 3] = order_key(a.w);
    };
    int j = threadIdx.x;
    for (; j + 3 * THREADS < nvec; j += 4 * THREADS) {
        float4 a[4];
#pragma unroll
        for (int d = 0; d < 4; ++d) a[d] = __ldg(v + j + d * THREADS);
#pragma unroll
        for (int d = 0; d < 4; ++d) put(j + d * THREADS, a[d]);
    }
    for (; j < nvec; j += THREADS) put(j, __ldg(v + j));
    for (int i = head + 4 * nvec + threadIdx.x; i < n; i += THREADS) keys[i] = order_key(__ldg(x + i));
}

// Rows held in shared memory (smem_rows): the row's keys read once, every pass and the compaction
// work from there: one launch and one read, where the split path took five launches.
__global__ void __launch_bounds__(THREADS) topk_row_smem_kernel(const float *scores, int64_t ld, int n, int k,
                                                                int tail_first, int tail_n, int32_t *idx, int64_t ldo)
{
    __shared__ SelectSmem s;
    extern __shared__ uint32_t row_keys[]; // n keys
    int32_t *out = idx + blockIdx.x * ldo;
    chain_wait(); // launched chained (kvb_device.cuh): the scores' writer has ended
    if (trivial_row(n, k, tail_first, tail_n, out)) return;
    const float *x = scores + blockIdx.x * ld;
    if (n > SMEM_ROW_N) // a long row: its loads vectorized, four in flight
        fill_row_keys(row_keys, x, n);
    else // a short one: a load a key (a row of 4239 keys measured 3-5% slower with the vector fill)
        for (int i = threadIdx.x; i < n; i += THREADS) row_keys[i] = order_key(__ldg(x + i));
    chain_release(); // the row is read: the next kernel may be scheduled
    __syncthreads();
    select_row(s, SmemKeys{row_keys}, n, k, out);
}

// ---- few rows of 8K to 48K keys: a cluster of C blocks a row, each holding 1/C of it in shared memory ----
// (the cluster's passes and compaction: cluster_select_part, select_row.cuh)

__global__ void __launch_bounds__(THREADS) topk_row_cluster_kernel(const float *scores, int64_t ld, int n, int k,
                                                                   int chunk, int tail_first, int tail_n,
                                                                   int32_t *idx, int64_t ldo)
{
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    const int C = (int)cluster.num_blocks(), rank = (int)cluster.block_rank();
    __shared__ SelectSmem s;
    __shared__ int hsum[NBINS]; // the cluster's histogram of this pass (this block's copy)
    __shared__ int part[2];     // this part's keys above and equal to the threshold
    extern __shared__ uint32_t part_keys[]; // chunk keys
    const int64_t row = blockIdx.x / C;
    int32_t *out = idx + row * ldo;
    chain_wait(); // a no-op as launched (not chained); kept so a chained launch stays correct
    if (k == 0 || k >= n) { // the same in every block of the cluster: no cluster barrier is reached
        if (rank == 0) trivial_row(n, k, tail_first, tail_n, out);
        return;
    }
    if (rank == 0) fill_tail(out, k, tail_first, tail_n);
    const int lo = rank * chunk, m = max(0, min(chunk, n - lo));
    fill_row_keys(part_keys, scores + row * ld + lo, m);
    chain_release(); // the row is read: the next kernel may be scheduled
    __syncthreads();
    cluster_select_part(s, hsum, part, part_keys, m, lo, k, out, C, rank);
}

// ---- few rows: each row split over `split` blocks (blockIdx.x), rows on blockIdx.y ----

// A row's selection after a pass: the digits found so far (prefix under mask) and how many keys equal to
// them are still to take.
struct Digits {
    uint32_t prefix, mask;
    int need;
};

struct RowState {
    Digits after[2]; // after passes 0 and 1: written by the first block of the kernel after that pass
    int ticket;      // the write: chunks taken so far, in the order the blocks start
};

// A chunk's two counts for the write, published in one 64-bit word: keys > T in bits 0-21, keys == T in
// bits 22-43 (each <= n <= 2^21), bit 63 set once published (the workspace's clear makes it 0).
constexpr int COUNT_BITS = 22;
constexpr unsigned long long COUNT_MASK = (1ull << COUNT_BITS) - 1, PUBLISHED = 1ull << 63;

struct SplitArgs {
    const float *scores;
    int64_t ld;
    int n, k, split, chunk;
    int *hist;       // [rows, 3, NBINS]: each pass's histogram of the row, zeroed by the clear
    RowState *state; // [rows]
    unsigned long long *counts; // [rows, split]: a chunk's published counts (COUNT_BITS above)
};

__device__ __forceinline__ void chunk_of(const SplitArgs &a, int b, int *lo, int *hi)
{
    *lo = b * a.chunk;
    *hi = min(a.n, *lo + a.chunk);
}

// The split plan's workspace (histograms and row states) zeroed: a chained kernel, not a memset, so the
// chain from the kernel before the selection is not broken (a memset node ends programmatic overlap).
__global__ void split_clear_kernel(int *w, int64_t n)
{
    chain_wait(); // launched chained (kvb_device.cuh): the kernel before may still use a workspace it shares
    chain_release();
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) w[i] = 0;
}

// The selection after pass q: the digit of pass q, found from that pass's whole-row histogram (written
// by the kernel before, chained) under the selection after pass q - 1 (`before`; the row's state, or
// none at q = 0). Every block of the next kernel finds it itself, so that no last block of a pass has to
// find it alone; only the newest digit is searched, the earlier ones come from the row's state, written
// by the first block of the kernel before. A thread holds find_digit's bins (thread 0 the highest).
__device__ __forceinline__ Digits digits_after(SelectSmem &s, const int *hist_q, int q, Digits before)
{
    const int nbins = 1 << pass_bits(q), per = nbins / THREADS, hi = nbins - threadIdx.x * per;
    int bins[NBINS / THREADS], mine = 0;
#pragma unroll
    for (int j = 0; j < NBINS / THREADS; ++j) bins[j] = j < per ? __ldcg(hist_q + hi - 1 - j) : 0;
#pragma unroll
    for (int j = 0; j < NBINS / THREADS; ++j) mine += bins[j];
    int above;
    Scan(s.scan).ExclusiveSum(mine, above);
#pragma unroll
    for (int j = 0; j < NBINS / THREADS; ++j) {
        if (j < per && above < before.need && above + bins[j] >= before.need) s.digit = hi - 1 - j, s.need = before.need - above;
        above += bins[j];
    }
    __syncthreads();
    const Digits d = {before.prefix | (uint32_t)s.digit << pass_shift(q), before.mask | (uint32_t)(nbins - 1) << pass_shift(q),
                      s.need};
    __syncthreads(); // s.digit, s.need and the scan storage are reused
    return d;
}

// The row's state after pass q (q = 0, 1), as written by the first block of the kernel after it.
__device__ __forceinline__ Digits state_after(const RowState *st, int q)
{
    return Digits{__ldcg(&st->after[q].prefix), __ldcg(&st->after[q].mask), __ldcg(&st->after[q].need)};
}

// One pass: each block adds its chunk's histogram (of the keys under the digits of the passes before)
// to the row's histogram of this pass.
__global__ void __launch_bounds__(THREADS) split_pass_kernel(SplitArgs a, int p)
{
    __shared__ SelectSmem s;
    chain_wait(); // launched chained (kvb_device.cuh): the pass before is done and its histogram visible
    chain_release();
    const int row = blockIdx.y, nbins = 1 << pass_bits(p);
    const int *hist_row = a.hist + (int64_t)row * 3 * NBINS;
    RowState *st = a.state + row;
    Digits d = {0u, 0u, a.k};
    if (p > 0) {
        d = digits_after(s, hist_row + (p - 1) * NBINS, p - 1, p > 1 ? state_after(st, p - 2) : d);
        if (blockIdx.x == 0 && threadIdx.x == 0) st->after[p - 1] = d; // for the kernels after this one
    }
    const uint32_t prefix = d.prefix, mask = d.mask;
    for (int i = threadIdx.x; i < nbins; i += THREADS) s.hist[i] = 0;
    __syncthreads();
    int lo, hi;
    chunk_of(a, blockIdx.x, &lo, &hi);
    stream_histogram<2>(s.hist, GlobalKeys{a.scores + row * a.ld}, lo, hi, prefix, mask, pass_shift(p), nbins);
    __syncthreads();
    int *g = a.hist + ((int64_t)row * 3 + p) * NBINS;
    for (int i = threadIdx.x; i < nbins; i += THREADS)
        if (s.hist[i]) atomicAdd(&g[i], s.hist[i]);
}

// The ordered write, a chunk a block: the block counts its chunk's keys above and equal to the threshold,
// publishes the two counts, sums those of the chunks before its own (published by blocks of this
// launch) and writes its chunk's selected indices from there. A block takes its chunk by a ticket, in
// the order the blocks start, so it waits only on chunks taken by blocks already running (no deadlock
// whatever the residency). One launch where a count kernel and a write kernel took two.
__global__ void __launch_bounds__(THREADS) split_write_kernel(SplitArgs a, int tail_first, int tail_n, int32_t *idx,
                                                              int64_t ldo)
{
    __shared__ SelectSmem s;
    __shared__ int s_chunk, s_gt, s_eq;
    using Reduce = cub::BlockReduce<unsigned long long, THREADS>;
    __shared__ typename Reduce::TempStorage red;
    chain_wait(); // launched chained (kvb_device.cuh): the last pass is done and its histogram visible
    chain_release();
    const int row = blockIdx.y;
    RowState *st = a.state + row;
    if (threadIdx.x == 0) s_chunk = atomicAdd(&st->ticket, 1);
    const Digits d = digits_after(s, a.hist + ((int64_t)row * 3 + 2) * NBINS, 2, state_after(st, 1)); // its barriers publish s_chunk
    const uint32_t T = d.prefix;
    const int need_eq = d.need;
    const int b = s_chunk;
    int32_t *out = idx + row * ldo;
    if (b == 0) fill_tail(out, a.k, tail_first, tail_n);
    const float *x = a.scores + row * a.ld;
    int lo, hi;
    chunk_of(a, b, &lo, &hi);
    int gt = 0, eq = 0;
    for (int i = lo + threadIdx.x; i < hi; i += THREADS) {
        const uint32_t key = order_key(__ldg(x + i));
        gt += key > T, eq += key == T;
    }
    // the chunk's two counts in one reduction (keys == T in the high half, keys > T in the low; each
    // at most n <= 2^21), thread 0 publishes them
    const unsigned long long mine = Reduce(red).Sum((unsigned long long)eq << 32 | (unsigned)gt);
    unsigned long long *counts = a.counts + (int64_t)row * a.split;
    if (threadIdx.x == 0) atomicExch(counts + b, PUBLISHED | (mine >> 32) << COUNT_BITS | (mine & 0xffffffffull));
    unsigned long long before = 0; // the same two counts of the chunks before this one
    for (int c = threadIdx.x; c < b; c += THREADS) {
        unsigned long long v;
        while (!((v = *(volatile unsigned long long *)(counts + c)) & PUBLISHED)) {
        }
        before += (v >> COUNT_BITS & COUNT_MASK) << 32 | (v & COUNT_MASK);
    }
    __syncthreads(); // the reduction's storage is reused
    before = Reduce(red).Sum(before);
    if (threadIdx.x == 0) s_gt = (int)(before & 0xffffffffull), s_eq = (int)(before >> 32);
    __syncthreads();
    compact(s, GlobalKeys{x}, lo, hi, T, need_eq, s_gt + (s_eq < need_eq ? s_eq : need_eq), s_eq, out);
}

// Rows held in shared memory by one block each: short ones always; longer ones, up to SMEM_ROW_MAX,
// where the rows are fewer than the SMs (one block a SM by its shared memory), instead of the split
// plan's five launches. Past SMEM_ROW_FEW keys that pays only where the rows are many, so that the
// split plan could give each row few blocks: at 8 rows it spreads a row of 24K or 43K keys over 6-11
// blocks and measured faster than one block holding it (kernels/select/NOTES.md, Tried).
bool smem_rows(int rows, int n)
{
    if (n <= SMEM_ROW_N) return true;
    if (n > SMEM_ROW_MAX || rows >= kvb_sm_count()) return false;
    return n <= SMEM_ROW_FEW || rows >= SMEM_ROWS_MIN;
}

// The cluster plan's blocks a row: rows of more than SMEM_ROW_N and at most SMEM_ROW_MAX keys where at
// least two blocks a row fit the SMs: the most of 8, 4, 2 with rows x C <= SMs and parts of at least
// CLUSTER_MIN_PART keys; 1 where none does.
int cluster_of(int rows, int n)
{
    const int sms = kvb_sm_count();
    // Only rows the shared-memory plan would take: the split plan's few long rows (8 x 43691) measured
    // 10% slower as clusters of 8.
    if (n <= SMEM_ROW_N || !smem_rows(rows, n)) return 1;
    for (int c = CLUSTER_MAX; c >= 2; c /= 2)
        if ((int64_t)rows * c <= sms && n >= c * CLUSTER_MIN_PART) return c;
    return 1;
}

// The plan: how many blocks share a row (1: one block per row).
int split_of(int rows, int n)
{
    const int sms = kvb_sm_count(); // 0 (unreadable): one block per row, a valid plan on any GPU
    if (cluster_of(rows, n) > 1) return 1;
    // Split only when the rows alone leave SMs idle: at rows=256 n=128K two blocks per row measured
    // slower than one (kernels/select/NOTES.md, Tried): the extra passes cost more than they hide.
    if (rows >= sms || smem_rows(rows, n)) return 1;
    const int64_t want = (2LL * sms + rows - 1) / rows, most = (n + MIN_SPLIT - 1) / MIN_SPLIT;
    const int64_t split = want < most ? want : most;
    return split > 1 ? (int)split : 1;
}

size_t align256(size_t b) { return (b + 255) & ~(size_t)255; }

size_t split_bytes(int rows, int split, size_t *off_state, size_t *off_counts)
{
    *off_state = align256((size_t)rows * 3 * NBINS * sizeof(int));
    *off_counts = *off_state + align256((size_t)rows * sizeof(RowState));
    return *off_counts + align256((size_t)rows * split * sizeof(unsigned long long));
}

// ---- max-pooling and the gather of kept rows ----

constexpr int POOL_OUT = 1024, POOL_THREADS = 256; // max-pooling: outputs per block, threads
constexpr int POOL_MAX_SMEM = 2 * (POOL_OUT + MAXPOOL_MAX_KS - 1) * (int)sizeof(float);

// The max of a window of ks = 2 half + 1 values is the max of two windows of w = 2^floor(log2 ks)
// values that cover it (they overlap): M_w[i] = max x[i .. i + w - 1] is built by doubling
// (M_2w[i] = max(M_w[i], M_w[i + w])), log2 w passes over the tile, then y[o] = max(M_w[o],
// M_w[o + ks - w]). About 3 log2(ks) shared-memory accesses an output where the window's own loop
// took ks.
__global__ void __launch_bounds__(POOL_THREADS) maxpool_kernel(const float *x, int L, int half, float *y, int64_t r0)
{
    extern __shared__ float pool_smem[]; // two buffers of POOL_OUT + 2 * half values, -inf outside [0, L)
    const int64_t r = r0 + blockIdx.y;    // rows in chunks of grid.y (kvb_grid.h)
    const int ks = 2 * half + 1, j0 = blockIdx.x * POOL_OUT, span = POOL_OUT + 2 * half;
    const float *xr = x + r * L;
    float *m = pool_smem, *next = pool_smem + span;
    for (int i = threadIdx.x; i < span; i += POOL_THREADS) {
        const int j = j0 - half + i;
        m[i] = j >= 0 && j < L ? xr[j] : -INFINITY;
    }
    __syncthreads();
    int w = 1; // m holds M_w, valid at i <= span - w
    for (; 2 * w <= ks; w *= 2) {
        for (int i = threadIdx.x; i <= span - 2 * w; i += POOL_THREADS) next[i] = fmaxf(m[i], m[i + w]);
        __syncthreads();
        float *t = m;
        m = next, next = t;
    }
    for (int o = threadIdx.x; o < POOL_OUT && j0 + o < L; o += POOL_THREADS) // o + ks - w <= span - w
        y[r * L + j0 + o] = fmaxf(m[o], m[o + ks - w]);
}

// GATHER_UNROLL 16-byte chunks a thread, GATHER_THREADS apart: consecutive threads take consecutive
// chunks of the output (a kept row's chunks, then the next row's), so every lane copies and each
// thread has GATHER_UNROLL loads in flight before its stores (one warp a row kept half the lanes idle
// at D = 128 and one 256-byte row in flight a warp). blockIdx.y picks the tensor: (X0, Y0) or (X1, Y1),
// two tensors gathered by the same list in one launch.
constexpr int GATHER_THREADS = 256, GATHER_UNROLL = 4;
__global__ void __launch_bounds__(GATHER_THREADS) gather_kernel(const uint4 *X0, const uint4 *X1, int64_t rows_out, int group, int L,
                                                                int cpr, const int32_t *keep, int n_keep, uint4 *Y0, uint4 *Y1)
{
    const uint4 *X = blockIdx.y ? X1 : X0;
    uint4 *Y = blockIdx.y ? Y1 : Y0;
    const int64_t total = rows_out * n_keep * cpr;
    const int64_t first = (int64_t)blockIdx.x * GATHER_THREADS * GATHER_UNROLL + threadIdx.x;
    uint4 v[GATHER_UNROLL];
    bool ok[GATHER_UNROLL];
#pragma unroll
    for (int u = 0; u < GATHER_UNROLL; ++u) {
        const int64_t o = first + u * GATHER_THREADS, w = o / cpr; // output chunk, its kept row
        ok[u] = o < total;
        const int32_t t = ok[u] ? keep[w] : -1;
        ok[u] = t >= 0 && t < L; // an index outside [0, L) leaves its row unwritten (select.h)
        if (ok[u]) v[u] = X[((w / n_keep) / group * L + t) * cpr + (o - w * cpr)];
    }
#pragma unroll
    for (int u = 0; u < GATHER_UNROLL; ++u)
        if (ok[u]) Y[first + u * GATHER_THREADS] = v[u];
}

} // namespace

extern "C" int select_check_rows(const char *who, int rows, int L)
{
    if (rows < 1) return kvb_fail(KVB_EINVAL, "%s: rows=%d out of range [1, 2^31)", who, rows);
    if (L < 1) return kvb_fail(KVB_EINVAL, "%s: L=%d out of range [1, 2^31)", who, L);
    return KVB_OK;
}


extern "C" size_t topk_workspace_bytes(int rows, int n)
{
    if (rows < 1 || n < 1) return 0;
    if (cluster_of(rows, n) > 1) return 256; // none is used; a workspace asks for the cluster plan (NULL: one block a row)
    const int split = split_of(rows, n);
    if (split == 1) return 0;
    size_t a, b;
    return split_bytes(rows, split, &a, &b);
}

extern "C" int topk_cluster_blocks(int rows, int n) { return rows < 1 || n < 1 ? 1 : cluster_of(rows, n); }

extern "C" int topk_rows(const float *scores, int rows, int64_t ld, int n, int k, int tail_first, int tail_n,
                         int32_t *idx, int64_t ldo, void *workspace, cudaStream_t stream)
{
    if (rows < 1) return kvb_fail(KVB_EINVAL, "topk_rows: rows=%d out of range [1, 2^31)", rows);
    if (n < 0 || n > TOPK_MAX_N) return kvb_fail(KVB_EINVAL, "topk_rows: n=%d out of range [0, %d]", n, TOPK_MAX_N);
    if (ld < n) return kvb_fail(KVB_EINVAL, "topk_rows: ld=%lld out of range [n = %d, ...)", (long long)ld, n);
    if (k < 0 || k > n) return kvb_fail(KVB_EINVAL, "topk_rows: k=%d out of range [0, n = %d]", k, n);
    if (tail_n < 0 || ldo < (int64_t)k + tail_n)
        return kvb_fail(KVB_EINVAL, "topk_rows: k + tail_n = %lld out of range [0, ldo = %lld]", (long long)k + tail_n,
                        (long long)ldo);
    if (!scores || !idx) return kvb_fail(KVB_EINVAL, "topk_rows: scores or idx is NULL");
    const int cluster = workspace ? cluster_of(rows, n) : 1;
    if (cluster > 1) {
        const int chunk = cluster_chunk(n, cluster);
        const size_t bytes = (size_t)chunk * sizeof(uint32_t);
        // the kernel's static shared memory (s, hsum, part, and the compiler's padding between them: ptxas
        // reports 8 bytes more than their sizes) counts toward the default 48 KB a block; 128 bytes of margin,
        // since opting in where it was not needed is harmless and missing it fails the launch
        const size_t static_bytes = sizeof(SelectSmem) + (NBINS + 2) * sizeof(int) + 128;
        if (bytes + static_bytes > 48 * 1024) // past it: opt in (per device, so at each such call)
            CUDA_TRY(cudaFuncSetAttribute(topk_row_cluster_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
        // not launched chained: after hybrid_score's normalize pass the chained cluster launch measured 8 us
        // slower than a plain one (hybrid_score B=8 128K -4.2% unchained; kernels/select/NOTES.md, Tried)
        CUDA_TRY(launch_cluster(topk_row_cluster_kernel, (unsigned)(rows * cluster), cluster, THREADS, bytes, stream,
                                scores, ld, n, k, chunk, tail_first, tail_n, idx, ldo));
        return KVB_OK;
    }
    if (smem_rows(rows, n)) {
        const size_t bytes = (size_t)n * sizeof(uint32_t);
        if (n > SMEM_ROW_N) // past the default 48 KB a block: opt in (per device, so at each such call)
            CUDA_TRY(cudaFuncSetAttribute(topk_row_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
        CUDA_TRY(launch_chained(topk_row_smem_kernel, rows, THREADS, bytes, stream, scores, ld, n, k, tail_first,
                                tail_n, idx, ldo));
        return KVB_OK;
    }
    const int split = workspace && k > 0 && k < n ? split_of(rows, n) : 1;
    if (split == 1) {
        if (sampled_rows(n, k)) { // past the default 48 KB a block: opt in (per device, so at each such call)
            CUDA_TRY(cudaFuncSetAttribute(topk_row_sampled_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          (int)SAMPLED_SMEM));
            topk_row_sampled_kernel<<<rows, THREADS, SAMPLED_SMEM, stream>>>(scores, ld, n, k, tail_first, tail_n, idx, ldo);
        } else {
            topk_row_kernel<<<rows, THREADS, 0, stream>>>(scores, ld, n, k, tail_first, tail_n, idx, ldo);
        }
        CUDA_TRY(cudaGetLastError());
        return KVB_OK;
    }
    // split rows only when rows < 2 x SMs, so rows fits grid.y (65535) on any GPU with fewer SMs
    if (rows > 65535) return kvb_fail(KVB_EINVAL, "topk_rows: rows=%d out of range [1, 65535] for split rows", rows);
    size_t off_state, off_counts;
    const size_t ws_bytes = split_bytes(rows, split, &off_state, &off_counts);
    // the histograms, row states and published counts zeroed (whole ints, a multiple of 256 bytes)
    const int64_t words = (int64_t)(ws_bytes / sizeof(int));
    const unsigned clear_blocks = (unsigned)std::min<int64_t>((words + 255) / 256, 1024);
    CUDA_TRY(launch_chained(split_clear_kernel, clear_blocks, 256, 0, stream, (int *)workspace, words));
    SplitArgs a;
    a.scores = scores, a.ld = ld, a.n = n, a.k = k, a.split = split, a.chunk = (n + split - 1) / split;
    a.hist = (int *)workspace;
    a.state = (RowState *)((char *)workspace + off_state);
    a.counts = (unsigned long long *)((char *)workspace + off_counts);
    const dim3 grid((unsigned)split, (unsigned)rows);
    // the four kernels launched chained: each one's launch and block start-up overlap the one before
    for (int p = 0; p < 3; ++p) CUDA_TRY(launch_chained(split_pass_kernel, grid, THREADS, 0, stream, a, p));
    CUDA_TRY(launch_chained(split_write_kernel, grid, THREADS, 0, stream, a, tail_first, tail_n, idx, ldo));
    return KVB_OK;
}

extern "C" int maxpool_rows(const float *x, int rows, int L, int ks, float *y, cudaStream_t stream)
{
    int rc = select_check_rows("maxpool_rows", rows, L);
    if (rc) return rc;
    if (ks < 1 || ks > MAXPOOL_MAX_KS || ks % 2 == 0)
        return kvb_fail(KVB_EINVAL, "maxpool_rows: ks=%d is not an odd pooling kernel in [1, %d]", ks, MAXPOOL_MAX_KS);
    if (!x || !y) return kvb_fail(KVB_EINVAL, "maxpool_rows: NULL pointer");
    const int half = ks / 2;
    const size_t smem = 2 * sizeof(float) * (size_t)(POOL_OUT + 2 * half);
    const unsigned tiles = (unsigned)((L + POOL_OUT - 1) / POOL_OUT); // L < 2^31: < 2^21
    static unsigned long long optin = 0; // the devices where the attribute is set (kvb_cuda.h)
    if ((rc = kvb_smem_optin((const void *)maxpool_kernel, POOL_MAX_SMEM, &optin))) return rc;
    return kvb_grid_chunks(rows, [&](int64_t r0, unsigned n) -> int {
        maxpool_kernel<<<dim3(tiles, n), POOL_THREADS, smem, stream>>>(x, L, half, y, r0);
        CUDA_TRY(cudaGetLastError());
        return KVB_OK;
    });
}

namespace {

// gather_rows and gather_rows_pair: the checks, then one launch for one tensor (X1 == NULL) or two
int launch_gather(const char *who, const kvb_bf16 *X0, const kvb_bf16 *X1, int rows, int group, int L, int D,
                  const int32_t *keep, int n_keep, kvb_bf16 *Y0, kvb_bf16 *Y1, cudaStream_t stream)
{
    int rc = select_check_rows(who, rows, L);
    if (rc) return rc;
    if (group < 1 || rows % group) return kvb_fail(KVB_EINVAL, "%s: group=%d does not divide rows=%d", who, group, rows);
    if (D < 8 || D % 8) return kvb_fail(KVB_EINVAL, "%s: D=%d is not a positive multiple of 8 (16-byte rows)", who, D);
    if (n_keep < 1 || n_keep > L) return kvb_fail(KVB_EINVAL, "%s: n_keep=%d out of range [1, L = %d]", who, n_keep, L);
    // GATHER_THREADS * GATHER_UNROLL output chunks a block; the count is judged in double first, where
    // the product of three ints could pass int64
    const int64_t per_block = GATHER_THREADS * GATHER_UNROLL;
    const double chunks = (double)rows * n_keep * (D / 8);
    if (chunks > (double)KVB_GRID_X_MAX * per_block)
        return kvb_fail(KVB_EINVAL, "%s: rows*n_keep*D/8 = %.0f out of range [1, %lld] (grid.x: at most 2^31 - 1 blocks of %lld)",
                        who, chunks, (long long)(KVB_GRID_X_MAX * per_block), (long long)per_block);
    unsigned blocks = 0;
    if ((rc = kvb_grid_x(who, "rows*n_keep*D/8", (int64_t)rows * n_keep * (D / 8), per_block, &blocks))) return rc;
    const dim3 grid(blocks, X1 ? 2u : 1u);
    gather_kernel<<<grid, GATHER_THREADS, 0, stream>>>((const uint4 *)X0, (const uint4 *)X1, rows, group, L, D / 8, keep, n_keep,
                                                       (uint4 *)Y0, (uint4 *)Y1);
    CUDA_TRY(cudaGetLastError());
    return KVB_OK;
}

} // namespace

extern "C" int gather_rows(const kvb_bf16 *X, int rows, int group, int L, int D, const int32_t *keep, int n_keep,
                           kvb_bf16 *Y, cudaStream_t stream)
{
    if (!X || !keep || !Y) return kvb_fail(KVB_EINVAL, "gather_rows: NULL pointer");
    return launch_gather("gather_rows", X, nullptr, rows, group, L, D, keep, n_keep, Y, nullptr, stream);
}

extern "C" int gather_rows_pair(const kvb_bf16 *X0, const kvb_bf16 *X1, int rows, int group, int L, int D, const int32_t *keep,
                                int n_keep, kvb_bf16 *Y0, kvb_bf16 *Y1, cudaStream_t stream)
{
    if (!X0 || !X1 || !keep || !Y0 || !Y1) return kvb_fail(KVB_EINVAL, "gather_rows_pair: NULL pointer");
    return launch_gather("gather_rows_pair", X0, X1, rows, group, L, D, keep, n_keep, Y0, Y1, stream);
}
