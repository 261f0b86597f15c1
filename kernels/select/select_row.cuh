// select_row.cuh: the device half of the suite's top-k (kernels/select/select.cu, contract in
// kernels/select/NOTES.md): one block of kvb_select::THREADS threads selects the k largest keys of one row by a radix
// select (11 + 11 + 10 bits from the top) and an ordered compaction. A header so that a kernel which
// produces the scores (a page scoring's normalization) can select from shared memory in the same launch.
// CUDA C++ only.
#ifndef KVB_KERNELS_SELECT_ROW_CUH
#define KVB_KERNELS_SELECT_ROW_CUH

#include <cstdint>

#include <cooperative_groups.h>
#include <cub/block/block_scan.cuh>

#include "kernels/common/kvb_device.cuh"

namespace kvb_select {

constexpr int THREADS = 512;           // one block per row, and the blocks of a split row
constexpr int NBINS = 2048;            // 11-bit digits (the last pass 10)
constexpr int ITEMS = 8;               // compaction: consecutive elements per thread and tile
constexpr int TILE = THREADS * ITEMS;  // elements per compaction step
constexpr int SMEM_ROW_N = 8192;      // rows up to this long are held in shared memory (32 KB of keys)
constexpr int SMEM_ROW_MAX = 49152;   // and, where the rows are fewer than the SMs, up to this long (192 KB):
constexpr int SMEM_ROW_FEW = 16384;   //   any such rows up to this long,
constexpr int SMEM_ROWS_MIN = 32;     //   longer ones only where there are at least this many
__host__ __device__ constexpr int pass_shift(int p) { return p == 0 ? 21 : p == 1 ? 10 : 0; }
__host__ __device__ constexpr int pass_bits(int p) { return p < 2 ? 11 : 10; }

using kvb_dev::order_key; // the one copy (kvb_device.cuh), shared with the page selections

using Scan = cub::BlockScan<int, THREADS>;

struct SelectSmem {
    typename Scan::TempStorage scan;
    int hist[NBINS];
    int digit, need, whole; // whole: the digit's bin is taken whole (its count is what is still needed)
};

// The digit d of the k-th largest: above(d) < need <= above(d) + hist[d], above(d) = sum of the
// bins above d. Thread t holds bins nbins - (t+1)*per .. nbins - t*per - 1 (thread 0 the highest);
// an exclusive scan gives each thread the count above its bins. Exactly one thread finds d. With
// CLEAR (a block's own histogram in shared memory) each thread zeroes the bins it holds once it has
// read them, so the next pass counts into a clear histogram with no clearing of its own and no barrier
// before it.
template <bool CLEAR = false, class H>
inline __device__ void find_digit(SelectSmem &s, H *hist, int nbins, int need)
{
    const int per = nbins / THREADS, hi = nbins - threadIdx.x * per; // per = 4 or 2
    int kept[CLEAR ? NBINS / THREADS : 1], mine = 0;                // CLEAR: the bins, zeroed in shared memory
    for (int d = hi - 1; d >= hi - per; --d) {
        mine += hist[d];
        if constexpr (CLEAR) kept[hi - 1 - d] = hist[d], hist[d] = 0;
    }
    int above;
    Scan(s.scan).ExclusiveSum(mine, above);
    for (int d = hi - 1; d >= hi - per; --d) {
        int count;
        if constexpr (CLEAR) count = kept[hi - 1 - d];
        else count = hist[d];
        if (above < need && above + count >= need) s.digit = d, s.need = need - above, s.whole = count == need - above;
        above += count;
    }
    __syncthreads();
}

// Where a pass reads its keys: the order keys of a row in global memory (read through L2 each pass),
// or a copy of them in shared memory (rows short enough to hold).
struct GlobalKeys {
    const float *x;
    __device__ uint32_t operator()(int i) const { return order_key(__ldg(x + i)); }
};
struct SmemKeys {
    const uint32_t *k;
    __device__ uint32_t operator()(int i) const { return k[i]; }
};
// One count into a histogram in shared memory (every caller's is): a reduction predicated on the key's
// higher bits matching the prefix, at the bin's shared-window address, so no branch and no convergence
// barrier surround it (the compiled `if (...) atomicAdd` did both, and rebuilt the generic address, per key).
__device__ __forceinline__ void count_key(int *hist, uint32_t key, uint32_t prefix, uint32_t mask, int shift, int nbins)
{
    const uint32_t bin = (uint32_t)__cvta_generic_to_shared(hist) + (((key >> shift) & (uint32_t)(nbins - 1)) << 2);
    asm volatile("{\n\t.reg .pred p;\n\tsetp.eq.u32 p, %0, %1;\n\t@p red.shared.add.u32 [%2], 1;\n\t}"
                 :
                 : "r"(key & mask), "r"(prefix), "r"(bin)
                 : "memory");
}

// Histogram of the digit at `shift` of the keys [lo, hi) whose higher bits equal `prefix`. Plain
// shared-memory atomics: adding once per warp for the lanes that hit the same bin (match_any) measured
// slower (kernels/select/NOTES.md, Tried).
template <class Keys>
inline __device__ void histogram(int *hist, Keys keys, int lo, int hi, uint32_t prefix, uint32_t mask, int shift, int nbins)
{
    for (int i = lo + threadIdx.x; i < hi; i += THREADS) count_key(hist, keys(i), prefix, mask, shift, nbins);
}

__device__ __forceinline__ void count_vec(int *hist, float4 a, uint32_t prefix, uint32_t mask, int shift, int nbins)
{
    count_key(hist, order_key(a.x), prefix, mask, shift, nbins);
    count_key(hist, order_key(a.y), prefix, mask, shift, nbins);
    count_key(hist, order_key(a.z), prefix, mask, shift, nbins);
    count_key(hist, order_key(a.w), prefix, mask, shift, nbins);
}

// Counts the vectors v[j], v[j + THREADS], ... DEPTH at a time, all DEPTH loads issued before any is
// counted, while DEPTH whole steps are left; returns where it stopped.
template <int DEPTH>
__device__ __forceinline__ int count_vectors(int *hist, const float4 *v, int j, int nvec, uint32_t prefix,
                                             uint32_t mask, int shift, int nbins)
{
    for (; j + (DEPTH - 1) * THREADS < nvec; j += DEPTH * THREADS) {
        float4 a[DEPTH];
#pragma unroll
        for (int d = 0; d < DEPTH; ++d) a[d] = __ldg(v + j + d * THREADS);
#pragma unroll
        for (int d = 0; d < DEPTH; ++d) count_vec(hist, a[d], prefix, mask, shift, nbins);
    }
    return j;
}

// From global memory the pass is a stream of the row: 16-byte loads, four per thread issued before
// any is counted (64 KB in flight a SM at two blocks), where one 4-byte load per iteration left the
// loads waiting on DRAM latency; what is left two, then one at a time (a split row's 4096-element
// chunk is two vectors a thread, and its pass is built with MAX_DEPTH 2: the four-deep loop it never
// enters made the split plan slower). A scalar head and tail to the 16-byte boundary.
template <int MAX_DEPTH>
inline __device__ void stream_histogram(int *hist, GlobalKeys keys, int lo, int hi, uint32_t prefix, uint32_t mask,
                                        int shift, int nbins)
{
    if (hi <= lo) return;
    const float *x = keys.x;
    const int mis = (int)(((uintptr_t)(x + lo) >> 2) & 3); // floats before the 16-byte boundary
    const int body = mis ? min(hi, lo + 4 - mis) : lo;
    for (int i = lo + threadIdx.x; i < body; i += THREADS) count_key(hist, keys(i), prefix, mask, shift, nbins);
    const int nvec = (hi - body) / 4;
    const float4 *v = reinterpret_cast<const float4 *>(x + body);
    int j = threadIdx.x;
    if (MAX_DEPTH >= 4) j = count_vectors<4>(hist, v, j, nvec, prefix, mask, shift, nbins);
    j = count_vectors<2>(hist, v, j, nvec, prefix, mask, shift, nbins);
    count_vectors<1>(hist, v, j, nvec, prefix, mask, shift, nbins);
    for (int i = body + 4 * nvec + threadIdx.x; i < hi; i += THREADS) count_key(hist, keys(i), prefix, mask, shift, nbins);
}

inline __device__ void histogram(int *hist, GlobalKeys keys, int lo, int hi, uint32_t prefix, uint32_t mask, int shift,
                                 int nbins)
{
    stream_histogram<4>(hist, keys, lo, hi, prefix, mask, shift, nbins);
}

// A thread's ITEMS consecutive keys from `first` (0 past hi).
template <class Keys>
__device__ __forceinline__ void load_items(Keys keys, int first, int hi, uint32_t (&key)[ITEMS])
{
#pragma unroll
    for (int j = 0; j < ITEMS; ++j) key[j] = first + j < hi ? keys(first + j) : 0u;
}

// From global memory: two 16-byte loads where the thread's items are whole and 16-byte aligned (one
// block per row: the row's start aligned), issued before any key is used.
__device__ __forceinline__ void load_items(GlobalKeys keys, int first, int hi, uint32_t (&key)[ITEMS])
{
    static_assert(ITEMS == 8, "two float4 loads a thread");
    const float *p = keys.x + first;
    if (first + ITEMS <= hi && ((uintptr_t)p & 15) == 0) {
        const float4 a = __ldg(reinterpret_cast<const float4 *>(p));
        const float4 b = __ldg(reinterpret_cast<const float4 *>(p) + 1);
        key[0] = order_key(a.x), key[1] = order_key(a.y), key[2] = order_key(a.z), key[3] = order_key(a.w);
        key[4] = order_key(b.x), key[5] = order_key(b.y), key[6] = order_key(b.z), key[7] = order_key(b.w);
        return;
    }
#pragma unroll
    for (int j = 0; j < ITEMS; ++j) key[j] = first + j < hi ? keys(first + j) : 0u;
}

// What compact writes for the key at position i: i itself (a row), or the row index a list of
// candidates holds for it (topk_row_sampled_kernel).
struct RowIndex {
    __device__ int operator()(int i) const { return i; }
};
struct ListIndex {
    const int32_t *at;
    __device__ int operator()(int i) const { return at[i]; }
};

// Ordered compaction of x[lo, hi): keys > T are taken; of the keys == T, those whose rank among the
// equal keys of the whole row is below `need_eq`. `written` and `eq_seen` count what came before lo.
// Each thread takes ITEMS consecutive elements, one scan per tile carries (gt, eq) counts.
template <class Keys, class Index = RowIndex>
inline __device__ void compact(SelectSmem &s, Keys keys, int lo, int hi, uint32_t T, int need_eq, int written, int eq_seen,
                               int32_t *out, Index index = {})
{
    for (int base = lo; base < hi; base += TILE) {
        const int first = base + threadIdx.x * ITEMS;
        uint32_t key[ITEMS];
        load_items(keys, first, hi, key);
        int gt = 0, eq = 0;
#pragma unroll
        for (int j = 0; j < ITEMS; ++j) {
            gt += first + j < hi && key[j] > T;
            eq += first + j < hi && key[j] == T;
        }
        // gt and eq per tile are at most TILE = 8192 < 2^16: one scan carries both
        int packed = gt | (eq << 16), before, total;
        Scan(s.scan).ExclusiveSum(packed, before, total);
        __syncthreads(); // the scan storage is reused next tile
        const int gt_before = before & 0xFFFF, eq_before = before >> 16;
        const int eq_total = total >> 16, gt_total = total & 0xFFFF;
        const int eq_left = need_eq - eq_seen > 0 ? need_eq - eq_seen : 0; // equal keys still wanted
        int pos = written + gt_before + (eq_before < eq_left ? eq_before : eq_left);
        int eq_rank = eq_before;
        // each key's take as a predicate and one predicated store, no branch per key (the branches and
        // their convergence barriers were the largest share of a shared-memory row's instructions)
#pragma unroll
        for (int j = 0; j < ITEMS; ++j) {
            const bool in = first + j < hi;
            const bool is_eq = in && key[j] == T;
            const bool take = (in && key[j] > T) || (is_eq && eq_rank < eq_left);
            eq_rank += is_eq;
            if (take) out[pos] = index(first + j);
            pos += take;
        }
        written += gt_total + (eq_total < eq_left ? eq_total : eq_left);
        eq_seen += eq_total;
    }
}

inline __device__ void fill_tail(int32_t *out, int k, int tail_first, int tail_n)
{
    for (int i = threadIdx.x; i < tail_n; i += THREADS) out[k + i] = tail_first + i;
}

// ---- many rows, or short ones: one block per row, the whole selection in one kernel ----

// Up to three radix passes over the row's keys: the threshold T of the k largest (returned) and how many
// keys equal to it are taken (need_eq). A pass whose digit's bin is taken whole (its count is what is
// still needed) ends the passes: the selection is then every key at or above the bin's lowest, T = that
// key - 1 with no equal keys wanted, the same set and order the remaining passes would give, one or two
// passes fewer (over a row in global memory, reads of the row; in shared memory, a pass's barriers and
// scan, which are what a short row's selection waits on). It ends on a barrier (callers reuse what the
// passes read).
// Hist says whose counts a pass searches: BlockHist, the block's own (its keys are the whole row); a
// cluster's blocks that each hold a part sum theirs (ClusterHist, below). A block's own histogram is
// cleared by find_digit as it reads it, so a pass takes two barriers and the scan's (the histogram is
// complete; the digit is found); a cluster's is read by the other blocks, so each pass clears it after a
// cluster barrier.
struct BlockHist {
    static constexpr bool CLEARS = true;
    __device__ void find(SelectSmem &s, int nbins, int need) const
    {
        __syncthreads(); // the block's histogram is complete
        find_digit<true>(s, s.hist, nbins, need);
    }
    __device__ void done() const { __syncthreads(); }
};

template <class Keys, class Hist = BlockHist>
inline __device__ uint32_t radix_threshold(SelectSmem &s, Keys keys, int n, int k, int *need_eq, Hist counts = {})
{
    uint32_t prefix = 0, mask = 0;
    int need = k;
#pragma unroll 1
    for (int p = 0; p < 3; ++p) {
        const int nbins = 1 << pass_bits(p);
        if (p == 0 || !Hist::CLEARS) {
            for (int i = threadIdx.x; i < nbins; i += THREADS) s.hist[i] = 0;
            __syncthreads();
        }
        histogram(s.hist, keys, 0, n, prefix, mask, pass_shift(p), nbins);
        counts.find(s, nbins, need);
        prefix |= (uint32_t)s.digit << pass_shift(p);
        mask |= (uint32_t)(nbins - 1) << pass_shift(p);
        need = s.need;
        const bool whole_bin = s.whole; // the same in every thread (of the cluster too)
        // a cluster: no block clears its histogram for the next pass while another still reads it. A
        // block's own: the next pass's find_digit writes digit, need and whole only after the barrier
        // that ends its counting, which every thread reaches after reading them here
        if (!Hist::CLEARS) counts.done();
        if (whole_bin && p < 2 && prefix > 0) {
            prefix -= 1, need = 0;
            break;
        }
    }
    if (Hist::CLEARS) counts.done();
    *need_eq = need;
    return prefix;
}

// The k largest of the row's n keys, in index order (index: what is written for position i).
template <class Keys, class Index = RowIndex>
inline __device__ void select_row(SelectSmem &s, Keys keys, int n, int k, int32_t *out, Index index = {})
{
    int need_eq;
    const uint32_t T = radix_threshold(s, keys, n, k, &need_eq);
    compact(s, keys, 0, n, T, need_eq, 0, 0, out, index);
}

// The rows' trivial selections (k = 0: nothing; k >= n: every index) and the tail; true when done.
inline __device__ bool trivial_row(int n, int k, int tail_first, int tail_n, int32_t *out)
{
    fill_tail(out, k, tail_first, tail_n);
    if (k >= n)
        for (int i = threadIdx.x; i < n; i += THREADS) out[i] = i;
    return k >= n || k == 0;
}

// ---- few rows of 8K to 48K keys: a cluster of C blocks a row, each holding 1/C of it in shared memory ----

// A cluster (C = 2, 4 or 8 blocks, one per rank) selects one row: rank r holds keys [r chunk, (r + 1) chunk)
// in its shared memory; each pass every block histograms its part, and after a cluster barrier every block
// sums the C histograms through distributed shared memory into its own copy and finds the same digit
// (the same sums in the same order in every block), so nothing is broadcast; the compaction writes each
// part from the counts of the parts before it. Where one block per row leaves most SMs idle (32 rows of
// 32K keys on 32 of 132 SMs, bound on one block's instructions), C blocks take a row's work in one launch.
constexpr int CLUSTER_MAX = 8;        // the portable cluster size
constexpr int CLUSTER_MIN_PART = 2048; // keys a block holds at least

// A part's keys: n / C rounded up to a multiple of 4 (a part starts 16-byte aligned where the row does).
__host__ __device__ constexpr int cluster_chunk(int n, int c) { return (n + 4 * c - 1) / (4 * c) * 4; }

// A pass's counts in a cluster: after a cluster barrier every block sums the C parts' histograms through
// distributed shared memory into its own copy (`sum`), the same sums in the same order in every block.
struct ClusterHist {
    static constexpr bool CLEARS = false;
    int *sum;
    int C; // blocks in the cluster
    __device__ void find(SelectSmem &s, int nbins, int need) const { find_digit(s, combine(s, nbins), nbins, need); }
    __device__ const int *combine(SelectSmem &s, int nbins) const
    {
        cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
        cluster.sync(); // every part's histogram is complete and visible to the cluster
        for (int d = threadIdx.x; d < nbins; d += THREADS) {
            int total = 0;
            for (int r = 0; r < C; ++r) total += cluster.map_shared_rank(s.hist, r)[d];
            sum[d] = total;
        }
        __syncthreads();
        return sum;
    }
    // no block clears its histogram for the next pass while another still reads it
    __device__ void done() const { cooperative_groups::this_cluster().sync(); }
};

struct OffsetIndex { // the row index of position i of a part that starts at `base`
    int base;
    __device__ int operator()(int i) const { return base + i; }
};

// The cluster's selection once every block holds its part (m keys of the row from index lo) in shared
// memory: the radix passes over the summed histograms, each part's counts above and at the threshold,
// and each part's compaction from the counts of the parts before it. s, hsum and part: the block's own
// shared memory; C and rank: the cluster's size and this block's rank. Every block of the cluster calls it
// (its barriers are the cluster's).
inline __device__ void cluster_select_part(SelectSmem &s, int *hsum, int *part, const uint32_t *part_keys, int m, int lo,
                                           int k, int32_t *out, int C, int rank)
{
    cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
    const SmemKeys keys{part_keys};
    int need_eq;
    const uint32_t T = radix_threshold(s, keys, m, k, &need_eq, ClusterHist{hsum, C});
    int gt = 0, eq = 0;
    for (int i = threadIdx.x; i < m; i += THREADS) {
        const uint32_t key = part_keys[i];
        gt += key > T, eq += key == T;
    }
    int before, total; // gt and eq of a part (at most SMEM_ROW_MAX / 2 keys) fit 16 bits each
    Scan(s.scan).ExclusiveSum(gt | (eq << 16), before, total);
    if (threadIdx.x == 0) part[0] = total & 0xFFFF, part[1] = total >> 16;
    cluster.sync(); // every part's counts are visible
    int gt_before = 0, eq_before = 0;
    for (int r = 0; r < rank; ++r) {
        const int *q = cluster.map_shared_rank(part, r);
        gt_before += q[0], eq_before += q[1];
    }
    compact(s, keys, 0, m, T, need_eq, gt_before + (eq_before < need_eq ? eq_before : need_eq), eq_before, out,
            OffsetIndex{lo});
    cluster.sync(); // no block exits while another may still read its counts
}

} // namespace kvb_select
#endif
