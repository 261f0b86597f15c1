// page_scoring.cu: RocketKV hybrid scoring (Quest scoring, its peer: quest_score.cu; the page metadata
// they read: page_meta.cu; page_scoring.h; contract, budget and measurements kernels/page_scoring/NOTES.md;
// reference reference/page_scoring.c; what the two scorings share: scoring_common.cuh).
//
// Hybrid pass 1 (design at hybrid_score_kernel): the r x pages product on the tensor cores (mma.sync
// m16n8k16, the scaled queries split into a bf16 hi and lo column each); a block tile of 8 warps x 64
// pages (16 for small contexts, 128 where every block slot gets two such tiles), each warp streaming its
// own 16-channel stages through its own cp.async ring (started on a 128-byte line), with no block
// barrier until the end.
//
// Budget (kernels/page_scoring/NOTES.md has the numbers and the registers): hybrid's floor is r rows x
// 2 B per page + 4 B of u (128 B at r = 62: 358 MB, ~80 us at B = 8, 128K, T = 2048); pass 1 also writes
// z and pass 2 reads it back, G x 4 B per page, or G x 2 B as codes where fp32 z would not stay in L2
// (z_code). Pass 2 and the page top-k are one launch (clusters of blocks a head for 8K-48K pages a row,
// one block a row up to 8192). Hybrid on fp32 FMAs was instruction-bound on an H200, hence the tensor
// cores.
#include <cfloat>
#include <climits>
#include <cstdint>

#include <cooperative_groups.h>

#include "kernels/common/kvb_cuda.h"
#include "kernels/common/kvb_device.cuh"
#include "kernels/common/kvb_grid.h"
#include "kernels/page_scoring/page_scoring.h"
#include "kernels/page_scoring/scoring_common.cuh"
#include "kernels/select/select.h"
#include "kernels/select/select_row.cuh"

namespace {

// (m, s) of a log-sum-exp: s = sum w exp(z - m). Merging two; an empty one has m = -inf, s = 0.
__device__ __forceinline__ void lse_merge(float &m, float &s, float m2, float s2)
{
    const float M = fmaxf(m, m2);
    if (M == -INFINITY) return; // both empty
    s = (m == -INFINITY ? 0.f : s * expf(m - M)) + (m2 == -INFINITY ? 0.f : s2 * expf(m2 - M));
    m = M;
}

// Merged over the lanes with xor offsets 16, 8, .., LAST (LAST = 1: the whole warp; 4: the 8 lanes of
// one t = lane % 4, a column of an mma fragment).
template <int LAST = 1>
__device__ __forceinline__ void lse_warp_merge(float &m, float &s)
{
#pragma unroll
    for (int o = 16; o >= LAST; o >>= 1) lse_merge(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
}

// ---- RocketKV hybrid scoring ----

// Pass 1 on the tensor cores: for a warp's WT pages, z^T (WT pages x heads) = E^T (WT x Kp) Qs (Kp x
// heads), Kp = r rounded up to 16, one mma.sync m16n8k16 (bf16 in, fp32 accumulate) per 16 pages, 16
// channels and 8 columns. A = E^T: the warp's stage holds 16 channel rows x WT pages as they lie in
// the metadata (pages contiguous), so ldmatrix .trans gives the row-major A fragment. B = the scaled
// queries s = q[h][c] / tau_h split in two bf16, hi = bf16(s) in column 2h' and lo = bf16(s - hi) in
// column 2h' + 1 of n-tile h / 4 (h' = h % 4): the products of bf16 E with hi and lo are exact, so z
// keeps ~17 bits of s where one bf16 of s would keep 8 (an error of ~1e-2 in z, a relative error of
// u). Thread (g, t) of a warp then holds z of head 4 nt + t for pages g and g + 8 of each m-tile as
// c0 + c1 and c2 + c3: no shuffle. Padded channels (r..Kp-1) have zero rows (zero-filled copies) and
// zero B entries, so they add exactly 0.
//
// Streaming: a block tile is WARPS x WT pages; warp w owns pages [w WT, (w + 1) WT) of every tile of
// the block's run and streams its steps (tile, 16-channel chunk) through its own ring of STAGES stages:
// it copies a stage (16 rows x 2 WT bytes, 16-byte cp.async, a row's 2 WT bytes contiguous), waits for
// its own groups and __syncwarp()s, then ldmatrix + mma. No block barrier in the loop; the block's
// warps meet only at the end, for the (max, sum) partials.
constexpr int HYB_KC = 16; // channels per k-chunk (the mma's k)

// Where fp32 z would not stay in L2 between the passes (coded_z), z travels from pass 1 to pass 2 as
// 16-bit codes: code = round((ref - z) / Z_STEP), at most 65535, where ref is the largest z of its
// group (one head's pages of one long warp tile), kept as fp32 beside the codes. Pass 2 takes z = ref -
// Z_STEP code: an error of at most Z_STEP / 2 = 2^-13 in z, a relative error of 1.2e-4 in exp(z - lse)
// (u's rtol is 1e-3); a page more than 65535 Z_STEP = 16 below its group's largest contributes at most
// e^-16 of that page's mass, which the code overstates by no more. Half the bytes of fp32 z, written
// once and read once (2 B per page and head instead of 4).
constexpr float Z_STEP = 1.f / 4096.f;
constexpr int Z_GROUP = 128; // pages per group: the long warp tile's

__device__ __forceinline__ uint16_t z_code(float below_ref)
{
    const float c = below_ref * (1.f / Z_STEP);
    return c >= 65535.f ? (uint16_t)65535 : (uint16_t)__float2uint_rn(c);
}

template <int G, int WT>
struct HybTile {
    static_assert(WT == 128 || WT == 64 || WT == 16, "warp tiles of 128 (LONG), 64 (WIDE) or 16 (NARROW) pages");
    static constexpr int TILE = WARPS * WT;         // pages per block tile: 1024, 512 or 128
    static constexpr int MT = WT / 16;              // m16 tiles per step
    static constexpr int U = WT / 8;                // 16-byte units per row of a stage
    static constexpr int ROWB = WT * 2;             // bytes per row of a stage
    static constexpr int STAGE = HYB_KC * ROWB;     // bytes per stage: 2 KB or 512 B
    static constexpr int PIECES = HYB_KC * U / 32;  // cp.async per lane and stage: 8, 4 or 1
    // stages per warp: 2 KB x 4 (G <= 4; 3 x 6 KB in flight per warp) or x 3 (G >= 5, whose larger
    // static shared memory leaves 3 x 48 KB), or 512 B x 8 (narrow)
    // long tiles: 4 KB x 3 (2 x 8 KB in flight per warp, 2 blocks a SM)
    static constexpr int STAGES = WT == 128 ? 3 : WT == 64 ? (G <= 4 ? 4 : 3) : 8;
    static constexpr int MIN_BLOCKS = WT == 128 ? 2 : 3; // blocks per SM asked of ptxas
    // dynamic shared memory per block: 96, 64, 48 or 32 KB, and a line to start the ring on one
    // (smem_line_start: at G <= 4 the static part before it is 16 bytes past a 32-byte boundary)
    static constexpr int RING = WARPS * STAGES * STAGE + SMEM_LINE;
    // Unit u of row k of a stage lies at unit u ^ swz(k): the 8 rows (same u, consecutive k) that one
    // ldmatrix phase reads fall in 8 different 16-byte bank groups (8 / U rows share a 128-byte line).
    // Rows of 256 bytes (long tiles): unit u of row k at u ^ (k mod 8).
    __device__ static int swz(int k) { return U >= 8 ? (k & 7) : (k / (8 / U)) & (U - 1); }
    __device__ static uint32_t at(int k, int u) { return (uint32_t)(k * ROWB + ((u ^ swz(k)) << 4)); }
};

struct HybridArgs {
    const uint16_t *q, *kmin, *kmax;
    int Hkv, D, L, P, cap, n_pages, r;
    int tiles, per_block, blocks; // tiles per head, tiles per block, blocks per head
    float *z;                     // [heads, G, cap]: z as fp32 (CODED = false); the codes start at the same address
    uint16_t *zc;                 // [heads, G, cap]: z as a code below its group's reference (z_code; CODED)
    float *zref;                  // [heads, G, zref_stride]: each group's reference, the group's largest z
    int zref_stride;              // CODED: a group is the 128 pages of one long warp tile
    float2 *part;                 // [heads, blocks, G]: (m, s) of each block
    float *u;                     // [heads, n_pages]
    int32_t *channels;            // [heads, r] or NULL
    // hybrid_score_append: the key appended at position t[b] (NULL: plain scoring); the bounds it updates
    // are kmin and kmax themselves, written by the block that reads that page
    const uint16_t *knew;         // [heads, D]
    const int32_t *t;             // [B]
    uint16_t *kmin_w, *kmax_w;
    // and, when K is not NULL, the cache rows t[b] of K and V (kv_append)
    const uint16_t *vnew;         // [heads, D]
    uint16_t *K, *V;              // [heads, cache_L, D]
    int64_t cache_L;
};

// The prologue's scratch, in the (then unused) dynamic shared memory of the ring: dead once the channel
// choice is made, before the ring's first copies are issued.
struct HybridScratch {
    alignas(16) uint32_t key[PAGE_MAX_D]; // read four at a time (the channel choice)
};

template <int G>
struct HybridSmem {
    static constexpr int NT = (G + 3) / 4; // n8 tiles: 4 heads' (hi, lo) column pairs each
    uint2 bq[PAGE_MAX_D / HYB_KC][NT][32]; // B fragments (b0, b1) per k-chunk, n-tile and lane
    uint16_t q[G][PAGE_MAX_D];             // q as its bf16 bits (tau and the B fragments, after the ring's
                                           // first copies are issued)
    const uint16_t *row[PAGE_MAX_D];       // E row of each chosen channel (kmax or kmin by the sign
                                           // of sg); padded channels: kmin (never read)
    int chosen[PAGE_MAX_D];                // the r channels, ascending
    float inv_tau[G];
    int warp_count[WARPS];
    unsigned char use_max[PAGE_MAX_D];
    float2 lse[WARPS][G];
};

// Pass 1: the channel choice of this (b, KV head), then z for the block's tiles (written to a.z) and
// the block's (max, sum n_j exp(z - max)) per query head (written to a.part).
template <int G, int WT, bool CODED = false>
__global__ void __launch_bounds__(THREADS, HybTile<G, WT>::MIN_BLOCKS) hybrid_score_kernel(HybridArgs a, int64_t head0)
{
    static_assert(!CODED || WT == Z_GROUP, "z's codes are grouped by long warp tiles");
    using T = HybTile<G, WT>;
    constexpr int NT = HybridSmem<G>::NT;
    static_assert(sizeof(HybridScratch) <= (size_t)T::RING, "the prologue's scratch fits in the ring");
    __shared__ HybridSmem<G> sm;
    extern __shared__ __align__(16) uint4 ring[]; // [WARPS][STAGES][STAGE bytes]
    HybridScratch &scr = *reinterpret_cast<HybridScratch *>(ring);
    chain_wait(); // launched chained (kvb_device.cuh): page_meta_append's writes are visible from here
    const int64_t bh = head0 + blockIdx.y;
    const int D = a.D, r = a.r, warp = threadIdx.x / 32, lane = threadIdx.x % 32;

    // hybrid_score_append: page_meta_append's update of the page holding position t[b], every channel,
    // by the one block whose tiles hold that page (the only one that reads it), before the prologue's
    // barriers and so before the ring's copies read it. Bit for bit ref_page_meta_append.
    if (a.knew) {
        const int pos = a.t[bh / a.Hkv], page = pos / a.P, tile = page / T::TILE;
        const TileRun own = tile_run(a.per_block, a.tiles);
        if (tile >= own.first && tile < own.first + own.count)
            for (int c = threadIdx.x; c < D; c += THREADS) {
                const int64_t at = (bh * D + c) * a.cap + page;
                const uint16_t v = a.knew[bh * D + c];
                if (a.K) { // the attention after this launch reads row pos: kv_append's writes
                    const int64_t row = (bh * a.cache_L + pos) * D + c;
                    a.K[row] = v, a.V[row] = a.vnew[bh * D + c];
                }
                if (pos % a.P == 0) { // the page starts: the entry becomes k, whatever it held
                    a.kmin_w[at] = v, a.kmax_w[at] = v;
                    continue;
                }
                if (bf16_bits_to_float(v) < bf16_bits_to_float(a.kmin_w[at])) a.kmin_w[at] = v;
                if (bf16_bits_to_float(v) > bf16_bits_to_float(a.kmax_w[at])) a.kmax_w[at] = v;
            }
    }

    // a[c] = sum_h |q[h][c]| and sg[c] = sum_h q[h][c], in double with h ascending as the reference
    // does, so the channel scores (a rounded to fp32) and the signs are bit for bit the reference's.
    // The thread of channel c reads q[h][c] of the G heads itself (all G loads before any is used), so
    // no barrier separates the loads from the sums.
    const uint16_t *qg = a.q + bh * G * D;
    for (int c = threadIdx.x; c < D; c += THREADS) {
        uint16_t qc[G];
#pragma unroll
        for (int h = 0; h < G; ++h) qc[h] = qg[h * D + c];
        double abs_sum = 0, sum = 0;
#pragma unroll
        for (int h = 0; h < G; ++h) {
            sm.q[h][c] = qc[h];
            const double v = bf16_bits_to_float(qc[h]);
            abs_sum += fabs(v), sum += v;
        }
        scr.key[c] = order_key((float)abs_sum);
        sm.use_max[c] = sum > 0; // sg == 0 takes kmin
    }
    __syncthreads();
    // I = topk(a, r) by the suite's rule: channel c is chosen when fewer than r channels beat it (a
    // larger key, or an equal key at a lower channel); listed ascending by a block-wide prefix count.
    // The count is the prologue's longest part when a block has few tiles (B = 1), so two threads
    // share a channel where D <= THREADS / 2 (lanes 2c' and 2c' + 1 of a warp, each half the keys),
    // reading four keys a 16-byte load (D is a multiple of 8); D <= 256 = THREADS otherwise.
    const int split = D <= THREADS / 2 ? 2 : 1;
    const int c = threadIdx.x / split, half = threadIdx.x % split;
    int beaten_by = 0;
    if (c < D) {
        const uint32_t kc = scr.key[c];
        const uint4 *keys4 = reinterpret_cast<const uint4 *>(scr.key);
        const int per = D / 4 / split; // 16-byte groups a thread
        for (int i = half * per; i < (half + 1) * per; ++i) {
            const uint4 k = keys4[i];
            const int o = 4 * i;
            beaten_by += (k.x > kc || (k.x == kc && o < c)) + (k.y > kc || (k.y == kc && o + 1 < c)) +
                         (k.z > kc || (k.z == kc && o + 2 < c)) + (k.w > kc || (k.w == kc && o + 3 < c));
        }
    }
    if (split == 2) beaten_by += __shfl_xor_sync(0xffffffffu, beaten_by, 1);
    const bool chosen = c < D && half == 0 && beaten_by < r;
    const unsigned ballot = __ballot_sync(0xffffffffu, chosen);
    if (lane == 0) sm.warp_count[warp] = __popc(ballot);
    __syncthreads();
    const int n_kc = (r + HYB_KC - 1) / HYB_KC; // k-chunks per tile
    if (chosen) {
        int pos = __popc(ballot & ((1u << lane) - 1u));
        for (int w = 0; w < warp; ++w) pos += sm.warp_count[w];
        sm.chosen[pos] = c;
        sm.row[pos] = (sm.use_max[c] ? a.kmax : a.kmin) + (bh * D + c) * a.cap;
        if (a.channels && blockIdx.x == 0) a.channels[bh * r + pos] = c;
    }
    for (int i = r + threadIdx.x; i < n_kc * HYB_KC; i += THREADS) sm.row[i] = a.kmin; // padded: zero-filled, never read
    __syncthreads(); // the rows are known and the scratch is dead: the ring's first copies may be issued

    // This warp's steps: (tile, chunk) for the run's tiles in which it has pages (only the head's last
    // tile can leave a warp without any), chunk-minor.
    const TileRun run = tile_run(a.per_block, a.tiles);
    const int wp0 = warp * WT; // the warp's first page in a tile
    const int n_tiles = run.count - ((run.first + run.count - 1) * T::TILE + wp0 >= a.n_pages ? 1 : 0);
    const int steps = n_tiles * n_kc;
    const uint64_t policy = l2_evict_first_policy();
    const uint32_t ring0 = smem_u32(smem_line_start(reinterpret_cast<unsigned char *>(ring)));
    const uint32_t ring_w = ring0 + warp * (T::STAGES * T::STAGE); // this warp's ring
    // Copies: a row's ROWB bytes are taken by U consecutive lanes (one 16-byte unit each), so an
    // instruction copies 32 / U whole rows (long: 2 rows of 256 bytes; wide: 4 rows of one 128-byte line
    // each, 4 sectors per L2 request; narrow: 16 rows of 32 bytes) and piece p the rows p (32 / U) + lane / U. A source offset
    // is clamped into the row (cap - 8) where the piece is past n_pages (zero-filled, nothing read).
    constexpr int ROWS_PER_COPY = 32 / T::U;
    const int cu = lane % T::U, cl = cu * 8, last8 = a.cap - 8;
    uint32_t cp_off[T::PIECES];
#pragma unroll
    for (int p = 0; p < T::PIECES; ++p) {
        cp_off[p] = T::at(p * ROWS_PER_COPY + lane / T::U, cu);
        asm volatile("" : "+r"(cp_off[p])); // kept in a register, not recomputed at every step
    }
    int is = 0, is_kc = 0, is_stage = 0, is_page = run.first * T::TILE + wp0 + cl;
    auto issue = [&]() {
        if (is < steps) {
            const uint32_t dst = ring_w + is_stage * T::STAGE;
            const int page = is_page; // this lane's unit of every row it copies
#pragma unroll
            for (int p = 0; p < T::PIECES; ++p) {
                const int k = is_kc * HYB_KC + p * ROWS_PER_COPY + lane / T::U;
                const bool row_ok = k < r; // a padded channel: zero-filled
                cp_async16_hint(dst + cp_off[p], sm.row[k] + min(page, last8), row_ok && page < a.n_pages, policy);
            }
            if (++is_kc == n_kc) is_kc = 0, is_page += T::TILE;
            if (++is_stage == T::STAGES) is_stage = 0;
            ++is;
        }
        cp_async_commit(); // also when empty: one group per step keeps the wait count uniform
    };
    // the first stages in flight while tau and the B fragments are computed
#pragma unroll
    for (int s = 0; s < T::STAGES - 1; ++s) issue();

    // tau_h = sqrt(D * sum_{c in I} |q[h][c]| / sum_c |q[h][c]|), one warp per query head
    if (warp < G) {
        double part = 0, all = 0;
        for (int i = lane; i < D; i += 32) all += fabs((double)bf16_bits_to_float(sm.q[warp][i]));
        for (int i = lane; i < r; i += 32) part += fabs((double)bf16_bits_to_float(sm.q[warp][sm.chosen[i]]));
#pragma unroll
        for (int o = 16; o >= 1; o >>= 1) {
            part += __shfl_xor_sync(0xffffffffu, part, o);
            all += __shfl_xor_sync(0xffffffffu, all, o);
        }
        // tau = 0 (q[h] zero on every chosen channel): z = 0 on every page, as the reference defines 0/0
        if (lane == 0) sm.inv_tau[warp] = part > 0 ? (float)(1.0 / sqrt(D * part / all)) : 0.f;
    }
    __syncthreads();
    // B fragments: lane (g, t) of chunk kc and n-tile nt holds column g = (head 4 nt + g / 2, hi if g is
    // even, lo if odd) at channels kc 16 + 2t, +1 (b0) and kc 16 + 2t + 8, +9 (b1). s = q / tau in fp32.
    for (int i = threadIdx.x; i < n_kc * NT * 32; i += THREADS) {
        const int l = i % 32, nt = (i / 32) % NT, kc = i / (32 * NT);
        const int g = l / 4, t = l % 4, h = 4 * nt + g / 2;
        uint32_t w[2];
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            float v[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int k = kc * HYB_KC + half * 8 + 2 * t + e;
                const float s = k < r && h < G ? bf16_bits_to_float(sm.q[h][sm.chosen[k]]) * sm.inv_tau[h] : 0.f;
                const float hi = __bfloat162float(__float2bfloat16_rn(s));
                v[e] = g & 1 ? s - hi : hi; // s - hi is exact; pack_bf16 rounds it once
            }
            w[half] = pack_bf16(v[0], v[1]);
        }
        sm.bq[kc][nt][l] = make_uint2(w[0], w[1]);
    }
    __syncthreads(); // the B fragments are complete
    // ldmatrix .x4 .trans of m-tile mt: matrix i = lane / 8 is (channels 8 (i / 2) .., pages 16 mt + 8 (i % 2) ..),
    // lane gives the address of its row (channel 8 (i / 2) + lane % 8): fragments a0..a3 of the mma.
    uint32_t ld_off[T::MT];
#pragma unroll
    for (int mt = 0; mt < T::MT; ++mt) ld_off[mt] = T::at((lane / 16) * 8 + lane % 8, 2 * mt + (lane / 8) % 2);

    const int g = lane / 4, t = lane % 4;
    float run_m[NT], run_s[NT]; // this thread's (max, sum n_j exp(z - max)) of head 4 nt + t
    float acc[T::MT][NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        run_m[nt] = -INFINITY, run_s[nt] = 0.f;
#pragma unroll
        for (int mt = 0; mt < T::MT; ++mt)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[mt][nt][e] = 0.f;
    }
    int chunk = 0, stage = 0, page0 = run.first * T::TILE + wp0;
    for (int s = 0; s < steps; ++s) {
        cp_async_wait<T::STAGES - 2>(); // this lane's copies of step s have landed
        __syncwarp();                   // and every lane's: the stage is the warp's
        const uint32_t st = ring_w + stage * T::STAGE;
        uint2 b[NT];
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) b[nt] = sm.bq[chunk][nt][lane];
#pragma unroll
        for (int mt = 0; mt < T::MT; ++mt) {
            uint32_t af[4];
            ldsm_x4_trans(af, st + ld_off[mt]);
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) mma_bf16(acc[mt][nt], af, b[nt].x, b[nt].y);
        }
        issue(); // into the stage read in step s - 1 (before this step's __syncwarp)
        if (++stage == T::STAGES) stage = 0;
        if (++chunk < n_kc) continue;
        // The warp's WT pages are done: z = hi column + lo column, written, and folded into the
        // running (max, sum n_j exp(z - max)) of the thread's head.
        chunk = 0;
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
            const int h = 4 * nt + t;
            float z[T::MT][2], n_j[T::MT][2], mx = -INFINITY;
#pragma unroll
            for (int mt = 0; mt < T::MT; ++mt)
#pragma unroll
                for (int hf = 0; hf < 2; ++hf) {
                    const int j = page0 + mt * 16 + hf * 8 + g;
                    z[mt][hf] = acc[mt][nt][2 * hf] + acc[mt][nt][2 * hf + 1];
                    n_j[mt][hf] = j < a.n_pages ? (float)min(a.P, a.L - j * a.P) : 0.f;
                    if (h < G && j < a.n_pages) {
                        if (!CODED) a.z[(bh * G + h) * a.cap + j] = z[mt][hf];
                        mx = fmaxf(mx, z[mt][hf]);
                    }
                    acc[mt][nt][2 * hf] = acc[mt][nt][2 * hf + 1] = 0.f;
                }
            if (CODED) {
                // the group's reference: the largest z of head h over the warp's WT pages (its 8 lanes)
                float ref = mx;
#pragma unroll
                for (int o = 4; o < 32; o <<= 1) ref = fmaxf(ref, __shfl_xor_sync(0xffffffffu, ref, o));
                if (h < G && ref != -INFINITY) {
                    uint16_t *zc = a.zc + (bh * G + h) * a.cap;
#pragma unroll
                    for (int mt = 0; mt < T::MT; ++mt)
#pragma unroll
                        for (int hf = 0; hf < 2; ++hf) {
                            const int j = page0 + mt * 16 + hf * 8 + g;
                            if (j < a.n_pages) zc[j] = z_code(ref - z[mt][hf]);
                        }
                    if (g == 0) a.zref[(bh * G + h) * a.zref_stride + page0 / WT] = ref;
                }
            }
            const float M = fmaxf(run_m[nt], mx);
            if (M != -INFINITY) { // a head beyond G, or no valid page yet: nothing to fold
                float sum = run_m[nt] == -INFINITY ? 0.f : run_s[nt] * expf(run_m[nt] - M);
#pragma unroll
                for (int mt = 0; mt < T::MT; ++mt)
#pragma unroll
                    for (int hf = 0; hf < 2; ++hf)
                        if (n_j[mt][hf] > 0.f) sum += n_j[mt][hf] * expf(z[mt][hf] - M);
                run_m[nt] = M, run_s[nt] = sum;
            }
        }
        page0 += T::TILE;
    }
    cp_async_wait<0>();
    chain_release(); // the next kernel's blocks may take this SM's slots from here, not while it streams

    // the block's partial per query head: over the 8 lanes of a head (same t), then over the warps
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
        float m = run_m[nt], s = run_s[nt];
        lse_warp_merge<4>(m, s);
        if (g == 0 && 4 * nt + t < G) sm.lse[warp][4 * nt + t] = make_float2(m, s);
    }
    __syncthreads();
    if (threadIdx.x < G) {
        float m = -INFINITY, sum = 0.f;
        for (int w = 0; w < WARPS; ++w) lse_merge(m, sum, sm.lse[w][threadIdx.x].x, sm.lse[w][threadIdx.x].y);
        a.part[(bh * a.blocks + blockIdx.x) * G + threadIdx.x] = make_float2(m, sum);
    }
}

constexpr int NORM_PAGES = THREADS * 8; // pass 2: pages per block

// lse_h of query head h = warp < G of (b, KV head) bh, merged from the scoring blocks' partials.
template <int G>
__device__ void head_lse(const HybridArgs &a, int64_t bh, float *lse)
{
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (warp < G) {
        float m = -INFINITY, s = 0.f;
        for (int b = lane; b < a.blocks; b += 32) {
            const float2 p = a.part[(bh * a.blocks + b) * G + warp];
            lse_merge(m, s, p.x, p.y);
        }
        lse_warp_merge(m, s);
        if (lane == 0) lse[warp] = m + logf(s);
    }
}

// u[j] = sum_h exp(z[h][j] - lse_h) of (b, KV head) bh; CODED: z[h][j] = zref[h][group] - Z_STEP code[h][j]
template <int G, bool CODED>
__device__ __forceinline__ float page_mass(const HybridArgs &a, int64_t bh, const float *lse, int j)
{
    float sum = 0.f;
    if (!CODED) {
        const float *z = a.z + bh * G * a.cap + j;
#pragma unroll
        for (int h = 0; h < G; ++h) sum += expf(z[(int64_t)h * a.cap] - lse[h]);
        return sum;
    }
    const uint16_t *zc = a.zc + bh * G * a.cap + j;
    const float *ref = a.zref + bh * G * a.zref_stride + j / Z_GROUP;
#pragma unroll
    for (int h = 0; h < G; ++h)
        sum += expf((ref[(int64_t)h * a.zref_stride] - lse[h]) - Z_STEP * (float)zc[(int64_t)h * a.cap]);
    return sum;
}

// u[j..j+3] of (b, KV head) bh (j a multiple of 4): one 16-byte load of z per head (z's rows are
// 16-byte aligned when the workspace is: cap is a multiple of 8), all G issued before any is used;
// CODED: one 8-byte load of codes and the group's reference per head (the quad is in one group), all 2G
// issued before any is used
template <int G, bool CODED>
__device__ __forceinline__ float4 page_mass4(const HybridArgs &a, int64_t bh, const float *lse, int j)
{
    if (!CODED) {
        const float *z = a.z + bh * G * a.cap + j;
        float4 zq[G];
#pragma unroll
        for (int h = 0; h < G; ++h) zq[h] = *reinterpret_cast<const float4 *>(z + (int64_t)h * a.cap);
        float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int h = 0; h < G; ++h) {
            s.x += expf(zq[h].x - lse[h]), s.y += expf(zq[h].y - lse[h]);
            s.z += expf(zq[h].z - lse[h]), s.w += expf(zq[h].w - lse[h]);
        }
        return s;
    }
    const uint16_t *zc = a.zc + bh * G * a.cap + j;
    const float *ref = a.zref + bh * G * a.zref_stride + j / Z_GROUP;
    uint2 cq[G];
    float base[G];
#pragma unroll
    for (int h = 0; h < G; ++h) {
        cq[h] = *reinterpret_cast<const uint2 *>(zc + (int64_t)h * a.cap);
        base[h] = ref[(int64_t)h * a.zref_stride];
    }
    float4 s = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
    for (int h = 0; h < G; ++h) {
        const float c = base[h] - lse[h];
        s.x += expf(c - Z_STEP * (float)(cq[h].x & 0xffffu)), s.y += expf(c - Z_STEP * (float)(cq[h].x >> 16));
        s.z += expf(c - Z_STEP * (float)(cq[h].y & 0xffffu)), s.w += expf(c - Z_STEP * (float)(cq[h].y >> 16));
    }
    return s;
}

// Pass 2: lse_h from the blocks' partials, then u[j] = sum_h exp(z[h][j] - lse_h).
template <int G, bool CODED>
__global__ void __launch_bounds__(THREADS) hybrid_normalize_kernel(HybridArgs a, int64_t head0)
{
    __shared__ float lse[G];
    chain_wait(); // launched chained (kvb_device.cuh)
    chain_release();
    const int64_t bh = head0 + blockIdx.y;
    head_lse<G>(a, bh, lse);
    __syncthreads();
    // Four consecutive pages a thread (page_mass4); a block's last partial quad page by page (z past
    // n_pages is never written), and all of it so where the workspace is not 16-byte aligned.
    const int begin = blockIdx.x * NORM_PAGES, end = min(a.n_pages, begin + NORM_PAGES);
    const int quads = ((uintptr_t)a.z & 15) ? 0 : (end - begin) / 4;
    float *u = a.u + bh * a.n_pages;
    for (int i = threadIdx.x; i < quads; i += THREADS) {
        const int j = begin + 4 * i;
        const float4 m = page_mass4<G, CODED>(a, bh, lse, j);
        u[j] = m.x, u[j + 1] = m.y, u[j + 2] = m.z, u[j + 3] = m.w; // u's rows (n_pages) need not be aligned
    }
    for (int j = begin + 4 * quads + threadIdx.x; j < end; j += THREADS) u[j] = page_mass<G, CODED>(a, bh, lse, j);
}

// u of pages [lo, lo + m) of one head, written to u and kept as order keys in keys[0, m) for the
// selection: four consecutive pages a thread (page_mass4; lo is a multiple of 4), the last partial quad
// page by page, and all of it so where the workspace is not 16-byte aligned
template <int G, bool CODED>
__device__ __forceinline__ void masses_and_keys(const HybridArgs &a, int64_t bh, const float *lse, float *u,
                                                uint32_t *keys, int lo, int m)
{
    namespace ks = kvb_select;
    const int quads = ((uintptr_t)a.z & 15) ? 0 : m / 4;
    for (int i = threadIdx.x; i < quads; i += ks::THREADS) {
        const int j = lo + 4 * i;
        const float4 v = page_mass4<G, CODED>(a, bh, lse, j);
        u[j] = v.x, u[j + 1] = v.y, u[j + 2] = v.z, u[j + 3] = v.w; // u's rows (n_pages) need not be aligned
        keys[4 * i] = ks::order_key(v.x), keys[4 * i + 1] = ks::order_key(v.y);
        keys[4 * i + 2] = ks::order_key(v.z), keys[4 * i + 3] = ks::order_key(v.w);
    }
    for (int i = 4 * quads + threadIdx.x; i < m; i += ks::THREADS) {
        const float v = page_mass<G, CODED>(a, bh, lse, lo + i);
        u[lo + i] = v;
        keys[i] = ks::order_key(v);
    }
}

// Pass 2 with the page top-k where the selection holds a row in shared memory (n_pages <=
// kvb_select::SMEM_ROW_N, e.g. RocketKV's step): one block of kvb_select::THREADS per (b, KV head)
// computes u, writes it, keeps its order keys in shared memory and selects the pages from there. One
// launch where pass 2 and topk_rows took two, and u is not read back.
template <int G, bool CODED>
__global__ void __launch_bounds__(kvb_select::THREADS) hybrid_normalize_select_kernel(HybridArgs a, int64_t head0,
                                                                                     int n_sel, int32_t *pages)
{
    namespace ks = kvb_select;
    __shared__ ks::SelectSmem sel;
    __shared__ float lse[G];
    extern __shared__ uint32_t row_keys[]; // n_pages order keys of u
    chain_wait(); // launched chained (kvb_device.cuh)
    const int64_t bh = head0 + blockIdx.x;
    head_lse<G>(a, bh, lse);
    __syncthreads();
    // four consecutive pages a thread, as in pass 2 alone: a row of RocketKV's 4239 pages is 2-3 rounds
    // of G loads in flight, where page by page it was 8-9 rounds of one
    masses_and_keys<G, CODED>(a, bh, lse, a.u + bh * a.n_pages, row_keys, 0, a.n_pages);
    __syncthreads();
    chain_release(); // after the row's reads: the attention's blocks wait only through the selection
    int32_t *out = pages + bh * n_sel;
    if (ks::trivial_row(a.n_pages, n_sel, 0, 0, out)) return;
    ks::select_row(sel, ks::SmemKeys{row_keys}, a.n_pages, n_sel, out);
}

// Pass 2 with the page top-k as a cluster of C blocks a (b, KV head) (pass2_cluster: rows of 8K-48K
// pages that 2-8 blocks a head fit on the SMs, e.g. 64 rows of 43691 at B=8 128K, 8 at B=1): block r computes u of pages [r chunk, (r + 1) chunk), writes it, keeps its order keys in
// shared memory, and the cluster selects from the parts (cluster_select_part). One launch and one read
// of z where pass 2 and topk_rows took two launches, u written and read back.
template <int G, bool CODED>
__global__ void __launch_bounds__(kvb_select::THREADS) hybrid_normalize_select_cluster_kernel(HybridArgs a, int64_t head0,
                                                                                             int chunk, int n_sel, int32_t *pages)
{
    namespace ks = kvb_select;
    cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
    const int C = (int)cluster.num_blocks(), rank = (int)cluster.block_rank();
    __shared__ ks::SelectSmem sel;
    __shared__ int hsum[ks::NBINS]; // the cluster's histogram of a pass (this block's copy)
    __shared__ int part[2];         // this part's keys above and equal to the threshold
    __shared__ float lse[G];
    extern __shared__ uint32_t part_keys[]; // chunk order keys of u
    const int64_t bh = head0 + blockIdx.x / C;
    head_lse<G>(a, bh, lse);
    __syncthreads();
    const int lo = rank * chunk, m = max(0, min(chunk, a.n_pages - lo)); // chunk is a multiple of 4
    masses_and_keys<G, CODED>(a, bh, lse, a.u + bh * a.n_pages, part_keys, lo, m);
    chain_release(); // after the part's reads: the next kernel's blocks wait only through the selection
    int32_t *out = pages + bh * n_sel;
    if (n_sel == 0 || n_sel >= a.n_pages) { // the same in every block of the cluster: no cluster barrier
        if (rank == 0) ks::trivial_row(a.n_pages, n_sel, 0, 0, out);
        return;
    }
    __syncthreads();
    ks::cluster_select_part(sel, hsum, part, part_keys, m, lo, n_sel, out, C, rank);
}

// ---- host side ----

size_t align256(size_t b) { return (b + 255) & ~(size_t)255; }

struct HybridWorkspace {
    size_t z, zref, part, topk, total;
};

// z's groups per (b, query head) row of zref
int zref_stride(int cap) { return (cap + Z_GROUP - 1) / Z_GROUP; }

// z as codes (CODED) where fp32 z would take more than half the L2, so that it would not stay there
// between the passes (measured: faster at B=8 128K, 44.7 MB of z; slower at B=8 32K, 11.2 MB, and at B=1)
bool coded_z(int64_t heads, int G, int n_pages)
{
    return (double)sizeof(float) * (double)heads * G * n_pages > 0.5 * kvb_l2_bytes();
}

// The workspace: z as fp32, or in the same bytes its codes (half of them), then zref, the partials, the top-k's
HybridWorkspace hybrid_workspace(const page_layout *s)
{
    const int64_t heads = (int64_t)s->B * s->Hkv;
    const int G = s->Hq / s->Hkv, n = page_count(s->L, s->P);
    HybridWorkspace w;
    w.z = 0;
    w.zref = align256(sizeof(float) * (size_t)heads * G * s->cap);
    w.part = w.zref + align256(sizeof(float) * (size_t)heads * G * zref_stride(s->cap));
    w.topk = w.part + align256(sizeof(float2) * (size_t)heads * tiles_of(n, HybTile<1, 16>::TILE) * G); // blocks per head <= tiles
    w.total = w.topk + align256(topk_workspace_bytes((int)heads, n));
    return w;
}

// Hybrid's long tiles (128 pages a warp: each row's copy 256 contiguous bytes, where wide tiles copy
// one 128-byte line of each of 16 rows) when they give every resident block slot two tiles or more.
bool long_tiles(int resident, int64_t heads, int n_pages, int tile) { return heads * tiles_of(n_pages, tile) >= 2 * (int64_t)resident; }

// Pass 2 with the page top-k as clusters of C blocks a head (hybrid_normalize_select_cluster_kernel), each
// block holding chunk order keys in shared memory (past the default 48 KB: opted in); a plain launch
// (launch_cluster says why).
template <int G, bool CODED>
int launch_normalize_select_cluster(const HybridArgs &a, int64_t h0, unsigned heads, int C, int n_sel, int32_t *pages,
                                    cudaStream_t stream)
{
    const int chunk = kvb_select::cluster_chunk(a.n_pages, C);
    const size_t bytes = sizeof(uint32_t) * (size_t)chunk;
    const auto kernel = hybrid_normalize_select_cluster_kernel<G, CODED>;
    CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    CUDA_TRY(launch_cluster(kernel, heads * (unsigned)C, C, kvb_select::THREADS, bytes, stream, a, h0, chunk, n_sel,
                            pages));
    return KVB_OK;
}

// Pass 2 with the page top-k as clusters of how many blocks a head (1: not as clusters): where the
// selection alone would take the rows as clusters (topk_cluster_blocks), and also where it would split
// few long rows over blocks (8 rows of 43691 pages at B=1 128K): the most of 8, 4, 2 blocks a head with
// heads x C <= SMs and parts of at least CLUSTER_MIN_PART pages, for rows of at most SMEM_ROW_MAX. The
// selection alone measured 10% slower as clusters there than split; fused with pass 2 it saves pass 2's
// launch, u's round trip and the split plan's five launches.
int pass2_cluster(int64_t heads, int n_pages)
{
    namespace ks = kvb_select;
    const int c = topk_cluster_blocks((int)heads, n_pages);
    if (c > 1 || n_pages <= ks::SMEM_ROW_N || n_pages > ks::SMEM_ROW_MAX) return c;
    const int sms = kvb_sm_count();
    for (int C = ks::CLUSTER_MAX; C >= 2; C /= 2)
        if (heads * C <= sms && n_pages >= C * ks::CLUSTER_MIN_PART) return C;
    return 1;
}

// Pass 2 (normalize, and select where `selected`: as clusters of `cluster` blocks, else one block a row)
template <int G, bool CODED>
int launch_pass2(const HybridArgs &a, int64_t h0, unsigned n, int cluster, bool selected, int n_sel, int32_t *pages,
                 cudaStream_t stream)
{
    if (cluster > 1) return launch_normalize_select_cluster<G, CODED>(a, h0, n, cluster, n_sel, pages, stream);
    if (selected)
        CUDA_TRY(launch_chained(hybrid_normalize_select_kernel<G, CODED>, n, kvb_select::THREADS,
                                sizeof(uint32_t) * (size_t)a.n_pages, stream, a, h0, n_sel, pages));
    else
        CUDA_TRY(launch_chained(hybrid_normalize_kernel<G, CODED>,
                                dim3((unsigned)((a.n_pages + NORM_PAGES - 1) / NORM_PAGES), n), THREADS, 0, stream, a, h0));
    return KVB_OK;
}

// n_sel pages into `pages` as well when `pages` is not NULL and the selection would hold the rows in
// shared memory, by one block a row or as clusters (then *selected = true); otherwise u only, and the
// caller selects.
template <int G>
int launch_hybrid(HybridArgs a, int64_t heads, int n_sel, int32_t *pages, bool *selected, cudaStream_t stream)
{
    using Long = HybTile<G, 128>;
    using Wide = HybTile<G, 64>;
    using Narrow = HybTile<G, 16>;
    static int known[64], known_narrow[64], known_long[64]; // per instantiation and device
    int resident = 0, resident_narrow = 0, resident_long = 0;
    int rc = resident_blocks(hybrid_score_kernel<G, 64>, Wide::RING, known, &resident);
    if (rc || (rc = resident_blocks(hybrid_score_kernel<G, 16>, Narrow::RING, known_narrow, &resident_narrow)) ||
        (rc = resident_blocks(hybrid_score_kernel<G, 128>, Long::RING, known_long, &resident_long)))
        return rc;
    const bool narrow = narrow_tiles(resident, heads, a.n_pages, Wide::TILE);
    const bool longer = !narrow && long_tiles(resident_long, heads, a.n_pages, Long::TILE);
    a.tiles = tiles_of(a.n_pages, narrow ? Narrow::TILE : longer ? Long::TILE : Wide::TILE);
    plan_blocks(narrow ? resident_narrow : longer ? resident_long : resident, heads, a.tiles, &a.per_block, &a.blocks);
    const bool coded = longer && coded_z(heads, G, a.n_pages);
    static int known_coded[64];
    int resident_coded = 0; // sets its shared memory attribute, as for the others
    if (coded && (rc = resident_blocks(hybrid_score_kernel<G, 128, true>, Long::RING, known_coded, &resident_coded)))
        return rc;
    const int cluster = pages ? pass2_cluster(heads, a.n_pages) : 1;
    const bool sel = *selected = pages && (a.n_pages <= kvb_select::SMEM_ROW_N || cluster > 1);
    return kvb_grid_chunks(heads, [&](int64_t h0, unsigned n) -> int {
        const dim3 grid((unsigned)a.blocks, n);
        if (coded) {
            CUDA_TRY(launch_chained(hybrid_score_kernel<G, 128, true>, grid, THREADS, Long::RING, stream, a, h0));
            return launch_pass2<G, true>(a, h0, n, cluster, sel, n_sel, pages, stream);
        }
        if (narrow) CUDA_TRY(launch_chained(hybrid_score_kernel<G, 16>, grid, THREADS, Narrow::RING, stream, a, h0));
        else if (longer) CUDA_TRY(launch_chained(hybrid_score_kernel<G, 128>, grid, THREADS, Long::RING, stream, a, h0));
        else CUDA_TRY(launch_chained(hybrid_score_kernel<G, 64>, grid, THREADS, Wide::RING, stream, a, h0));
        return launch_pass2<G, false>(a, h0, n, cluster, sel, n_sel, pages, stream);
    });
}

} // namespace


extern "C" size_t hybrid_score_workspace_bytes(const page_layout *s)
{
    if (page_layout_check(s, "hybrid_score_workspace_bytes")) return 0;
    return hybrid_workspace(s).total;
}

// hybrid_score, or hybrid_score_append when app is not NULL.
static int hybrid_run(const char *who, const kvb_bf16 *q, const kvb_bf16 *kmin, const kvb_bf16 *kmax,
                      const hybrid_append *app, const page_layout *s, int r, int k, float *u, int32_t *pages,
                      int32_t *channels, void *workspace, size_t workspace_bytes, cudaStream_t stream)
{
    int rc = page_layout_check(s, who);
    if (rc || (rc = hybrid_params_check(s, r, k, who))) return rc;
    if (!q || !kmin || !kmax || !u) return kvb_fail(KVB_EINVAL, "%s: q, kmin, kmax or u is NULL", who);
    if ((rc = kvb_check_aligned16(who, "kmin", kmin)) || (rc = kvb_check_aligned16(who, "kmax", kmax))) return rc;
    if (app && (!app->knew || !app->t || !app->t_host || !app->kmin || !app->kmax))
        return kvb_fail(KVB_EINVAL, "%s: knew, t, t_host, kmin or kmax is NULL", who);
    if (app && app->K && (!app->V || !app->vnew)) return kvb_fail(KVB_EINVAL, "%s: K is given but V or vnew is NULL", who);
    if (app && app->K && app->cache_L < s->L)
        return kvb_fail(KVB_EINVAL, "%s: cache_L=%d out of range [L = %d, %d]", who, app->cache_L, s->L, INT_MAX);
    if (app && (rc = page_positions_check(s, app->t_host, who))) return rc;
    const HybridWorkspace w = hybrid_workspace(s);
    if ((rc = check_workspace(who, workspace, workspace_bytes, w.total))) return rc;
    const int64_t heads = (int64_t)s->B * s->Hkv;
    HybridArgs a = {};
    a.q = q, a.kmin = kmin, a.kmax = kmax;
    if (app) {
        a.knew = (const uint16_t *)app->knew, a.t = app->t;
        a.kmin_w = (uint16_t *)app->kmin, a.kmax_w = (uint16_t *)app->kmax;
        a.vnew = (const uint16_t *)app->vnew, a.K = (uint16_t *)app->K, a.V = (uint16_t *)app->V;
        a.cache_L = app->cache_L;
    }
    a.Hkv = s->Hkv, a.D = s->D, a.L = s->L, a.P = s->P, a.cap = s->cap, a.n_pages = page_count(s->L, s->P), a.r = r;
    a.z = (float *)((char *)workspace + w.z), a.zc = (uint16_t *)a.z;
    a.zref = (float *)((char *)workspace + w.zref), a.zref_stride = zref_stride(s->cap);
    a.part = (float2 *)((char *)workspace + w.part);
    a.u = u, a.channels = channels;
    const int n_sel = hybrid_selected_pages(k, s->P);
    bool selected = false;
    switch (s->Hq / s->Hkv) {
    case 1: rc = launch_hybrid<1>(a, heads, n_sel, pages, &selected, stream); break;
    case 2: rc = launch_hybrid<2>(a, heads, n_sel, pages, &selected, stream); break;
    case 3: rc = launch_hybrid<3>(a, heads, n_sel, pages, &selected, stream); break;
    case 4: rc = launch_hybrid<4>(a, heads, n_sel, pages, &selected, stream); break;
    case 5: rc = launch_hybrid<5>(a, heads, n_sel, pages, &selected, stream); break;
    case 6: rc = launch_hybrid<6>(a, heads, n_sel, pages, &selected, stream); break;
    case 7: rc = launch_hybrid<7>(a, heads, n_sel, pages, &selected, stream); break;
    default: rc = launch_hybrid<8>(a, heads, n_sel, pages, &selected, stream); break; // page_layout_check: G in [1, 8]
    }
    if (rc || !pages || selected) return rc;
    void *topk_ws = w.total > w.topk ? (char *)workspace + w.topk : NULL;
    return topk_rows(u, (int)heads, a.n_pages, a.n_pages, n_sel, 0, 0, pages, n_sel, topk_ws, stream);
}

extern "C" int hybrid_score(const kvb_bf16 *q, const kvb_bf16 *kmin, const kvb_bf16 *kmax, const page_layout *s, int r,
                            int k, float *u, int32_t *pages, int32_t *channels, void *workspace, size_t workspace_bytes,
                            cudaStream_t stream)
{
    return hybrid_run("hybrid_score", q, kmin, kmax, NULL, s, r, k, u, pages, channels, workspace, workspace_bytes,
                      stream);
}

extern "C" int hybrid_score_append(const kvb_bf16 *q, const hybrid_append *app, const page_layout *s, int r, int k,
                                   float *u, int32_t *pages, int32_t *channels, void *workspace,
                                   size_t workspace_bytes, cudaStream_t stream)
{
    if (!app) return kvb_fail(KVB_EINVAL, "hybrid_score_append: app is NULL");
    return hybrid_run("hybrid_score_append", q, app->kmin, app->kmax, app, s, r, k, u, pages, channels, workspace,
                      workspace_bytes, stream);
}
