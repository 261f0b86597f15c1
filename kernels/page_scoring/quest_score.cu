// quest_score.cu: Quest scoring, the in-suite peer of RocketKV's hybrid scoring (page_scoring.cu) over
// the same page metadata (page_meta.cu); page_scoring.h; contract, budget and measurements
// kernels/page_scoring/NOTES.md; reference reference/page_scoring.c.
//
// Quest scoring: a block of 8 warps scores tiles of TILE pages of one KV head (256, or 128 for small
// contexts so that there are twice the blocks); a thread owns 8 consecutive pages of one row (a 16-byte
// piece of a bf16 metadata row), a row's tile takes TILE/8 lanes, and the rows are spread over the
// block's row slots (8 or 16), so that a small context still gives every SM work; a tile ends with a
// sum over the slots in shared memory. Each thread streams its own pieces through a ring of S stages of
// cp.async in shared memory (it reads back only what it copied itself, so no barrier guards the ring):
// S - 1 pieces in flight per thread, across tile boundaries too, without registers to hold them. The
// lanes of a row piece read 256 or 512 contiguous bytes of one row per step (channel-major rows); the
// pieces land in shared memory at thread x 16 B (conflict-free), and are read back the same way.
//
// Budget: both extrema tensors in full, 2 D x 2 B + 4 B per page (270 MB at B = 8, 128K, P = 16, ~60 us),
// and 2G FMAs a page, under the memory time at G <= 8 (NOTES.md, Budget).
#include <cfloat>
#include <climits>
#include <cstdint>

#include "kernels/common/kvb_cuda.h"
#include "kernels/common/kvb_device.cuh"
#include "kernels/common/kvb_grid.h"
#include "kernels/page_scoring/page_scoring.h"
#include "kernels/page_scoring/scoring_common.cuh"
#include "kernels/select/select.h"

namespace {

constexpr int WIDE = 256, NARROW = 128; // Quest: pages per tile (TILE), a row piece of TILE / 8 lanes x 8 pages
constexpr int QUEST_STAGES = 6; // Quest: 5 steps of 2 pieces (kmax, kmin) in flight (40 KB per block)

// How the threads of a block cover a tile: a row's TILE pages take LANES lanes (16 bytes each), so a
// warp covers SUB rows per step and the block SLOTS rows. WIDE tiles: one row per warp; NARROW tiles
// (twice as many blocks, for small contexts): two rows per warp.
template <int TILE>
struct Shape {
    static_assert(TILE == WIDE || TILE == NARROW, "tiles of 256 or 128 pages");
    static constexpr int LANES = TILE / 8, SUB = 32 / LANES, SLOTS = WARPS * SUB;
    // this thread's row slot in a step and its first page in the tile
    __device__ static int slot() { return (threadIdx.x / 32) * SUB + (threadIdx.x % 32) / LANES; }
    __device__ static int first_page() { return (threadIdx.x % LANES) * 8; }
};

constexpr int RED = WARPS * WIDE; // floats of one half of the reduction buffer (SLOTS x TILE, both shapes)

// The block's sum over its row slots of acc (each thread's partial sums of its 8 pages): thread
// t < TILE gets the total of page t of the tile (0 for the others). `buf` alternates between the two
// halves of red from one call to the next (one barrier per call: a half is rewritten only two calls
// later, after every thread has passed the barrier of the call in between).
template <int TILE>
__device__ __forceinline__ float block_sum_tile(float (&red)[2][RED], int &buf, const float (&acc)[8])
{
    using S = Shape<TILE>;
    float4 *dst = reinterpret_cast<float4 *>(&red[buf][S::slot() * TILE + S::first_page()]);
    dst[0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
    dst[1] = make_float4(acc[4], acc[5], acc[6], acc[7]);
    __syncthreads();
    float sum = 0.f;
    if (threadIdx.x < TILE)
#pragma unroll
        for (int w = 0; w < S::SLOTS; ++w) sum += red[buf][w * TILE + threadIdx.x];
    buf ^= 1;
    return sum;
}

// ---- Quest ----

struct QuestArgs {
    const uint16_t *q, *kmin, *kmax;
    int Hkv, D, cap, n_pages;
    int tiles, per_block;
    float *scores; // [heads, n_pages]
};

template <int G>
struct QuestSmem {
    float qpos[PAGE_MAX_D][G], qneg[PAGE_MAX_D][G]; // max(q, 0), min(q, 0)
    alignas(16) float red[2][RED]; // written as float4 (block_sum_tile): 16-byte aligned whatever G is
};

// scores[j] = max_h sum_c max(q[h][c] kmax[c][j], q[h][c] kmin[c][j]). With hi = max(kmax, kmin) and
// lo = min(kmax, kmin) that term is q+ hi + q- lo exactly (one of q+, q- is 0; bf16 x bf16 products are
// exact in fp32): two FMAs per head and two min/max per page shared by the G heads.
template <int G, int TILE>
__global__ void __launch_bounds__(THREADS, G <= 4 ? 3 : 2) quest_score_kernel(QuestArgs a, int64_t head0)
{
    using S = Shape<TILE>;
    __shared__ QuestSmem<G> sm;
    extern __shared__ __align__(16) uint4 ring[]; // [QUEST_STAGES][2][THREADS]: kmax and kmin pieces
    chain_wait(); // launched chained (kvb_device.cuh): the kernel before has ended and its writes are visible
    const int64_t bh = head0 + blockIdx.y;
    const int D = a.D;
    const uint16_t *qg = a.q + bh * G * D;
    // A step is one channel group of one tile: channel group * SLOTS + this thread's slot. Where D is
    // not a multiple of SLOTS the last group's padded channels copy zeros (below) and meet zero queries
    // here, so they add exactly 0 and the step needs no branch.
    const int groups = (D + S::SLOTS - 1) / S::SLOTS;
    for (int i = threadIdx.x; i < G * groups * S::SLOTS; i += THREADS) {
        const int c = i / G, h = i % G;
        const float v = c < D ? bf16_bits_to_float(qg[h * D + c]) : 0.f;
        sm.qpos[c][h] = fmaxf(v, 0.f);
        sm.qneg[c][h] = fminf(v, 0.f);
    }
    __syncthreads();

    const TileRun run = tile_run(a.per_block, a.tiles);
    // The copy cursor runs QUEST_STAGES - 1 steps ahead of the step consumed, as row pointers and a
    // shared-memory address advanced by additions (a division by the runtime group count each step
    // would cost about a third of the loop's instructions). A copy that is not valid (a padded channel, a
    // page past the row, a step past the block's run) zero-fills its stage (from the tensor's start).
    const int steps = run.count * groups;
    const uint64_t policy = l2_evict_first_policy();
    const uint32_t ring0 = smem_u32(ring + threadIdx.x);              // stage k, tensor t at + (2k + t) THREADS 16 B
    constexpr uint32_t STAGE_BYTES = 2 * THREADS * sizeof(uint4);
    const int64_t row_stride = (int64_t)S::SLOTS * a.cap;             // from one channel group to the next
    const int64_t tile_back = TILE - (int64_t)groups * row_stride;    // from past a tile's last group to the next tile
    int next = 0, next_group = 0, next_c = S::slot();
    int next_page = run.first * TILE + S::first_page();
    int64_t next_off = (bh * D + S::slot()) * a.cap + next_page;
    uint32_t next_dst = ring0;
    auto issue = [&]() {
        const bool valid = next < steps && next_c < D && next_page < a.n_pages;
        const int64_t off = valid ? next_off : 0;
        cp_async16_hint(next_dst, a.kmax + off, valid, policy);
        cp_async16_hint(next_dst + THREADS * sizeof(uint4), a.kmin + off, valid, policy);
        cp_async_commit();
        ++next;
        next_dst = next_dst == ring0 + (QUEST_STAGES - 1) * STAGE_BYTES ? ring0 : next_dst + STAGE_BYTES;
        next_off += row_stride;
        next_c += S::SLOTS;
        if (++next_group == groups) { // the next tile's first group
            next_group = 0;
            next_c = S::slot();
            next_page += TILE;
            next_off += tile_back;
        }
    };
#pragma unroll
    for (int s = 0; s < QUEST_STAGES - 1; ++s) issue();

    const uint4 *mine = ring + threadIdx.x;
    int buf = 0, stage = 0;
    for (int t = 0; t < run.count; ++t) {
        float acc[G][8];
#pragma unroll
        for (int h = 0; h < G; ++h)
#pragma unroll
            for (int p = 0; p < 8; ++p) acc[h][p] = 0.f;
        for (int c = S::slot(); c < groups * S::SLOTS; c += S::SLOTS) {
            cp_async_wait<QUEST_STAGES - 2>();
            float mx[8], mn[8];
            unpack_bf16x8(mine[2 * stage * THREADS], mx);
            unpack_bf16x8(mine[(2 * stage + 1) * THREADS], mn);
#pragma unroll
            for (int p = 0; p < 8; ++p) {
                const float hi = fmaxf(mx[p], mn[p]), lo = fminf(mx[p], mn[p]);
#pragma unroll
                for (int h = 0; h < G; ++h) acc[h][p] = fmaf(sm.qneg[c][h], lo, fmaf(sm.qpos[c][h], hi, acc[h][p]));
            }
            issue();
            stage = stage == QUEST_STAGES - 1 ? 0 : stage + 1;
        }
        const int j = (run.first + t) * TILE + threadIdx.x;
        float best = -INFINITY;
#pragma unroll
        for (int h = 0; h < G; ++h) best = fmaxf(best, block_sum_tile<TILE>(sm.red, buf, acc[h]));
        if (threadIdx.x < TILE && j < a.n_pages) a.scores[bh * a.n_pages + j] = best;
    }
    cp_async_wait<0>();
    chain_release(); // after the stream: the top-k's blocks do not wait beside it
}

template <int G>
int launch_quest(QuestArgs a, int64_t heads, cudaStream_t stream)
{
    constexpr size_t ring = sizeof(uint4) * 2 * QUEST_STAGES * THREADS;
    static int known[64], known_narrow[64]; // per instantiation and device
    int resident = 0, resident_narrow = 0;
    int rc = resident_blocks(quest_score_kernel<G, WIDE>, ring, known, &resident);
    if (rc || (rc = resident_blocks(quest_score_kernel<G, NARROW>, ring, known_narrow, &resident_narrow)))
        return rc;
    const bool narrow = narrow_tiles(resident, heads, a.n_pages, WIDE);
    a.tiles = tiles_of(a.n_pages, narrow ? NARROW : WIDE);
    int blocks = 0;
    plan_blocks(narrow ? resident_narrow : resident, heads, a.tiles, &a.per_block, &blocks);
    return kvb_grid_chunks(heads, [&](int64_t h0, unsigned n) -> int {
        const dim3 grid((unsigned)blocks, n);
        if (narrow) CUDA_TRY(launch_chained(quest_score_kernel<G, NARROW>, grid, THREADS, ring, stream, a, h0));
        else CUDA_TRY(launch_chained(quest_score_kernel<G, WIDE>, grid, THREADS, ring, stream, a, h0));
        return KVB_OK;
    });
}

} // namespace

extern "C" size_t quest_score_workspace_bytes(const page_layout *s)
{
    if (page_layout_check(s, "quest_score_workspace_bytes")) return 0;
    const int n = page_count(s->L, s->P);
    return topk_workspace_bytes(s->B * s->Hkv, n > 1 ? n - 1 : 1);
}

extern "C" int quest_score(const kvb_bf16 *q, const kvb_bf16 *kmin, const kvb_bf16 *kmax, const page_layout *s, int budget,
                           float *scores, int32_t *pages, void *workspace, size_t workspace_bytes, cudaStream_t stream)
{
    int rc = page_layout_check(s, "quest_score");
    if (rc || (rc = quest_params_check(s, budget, "quest_score"))) return rc;
    if (!q || !kmin || !kmax || !scores) return kvb_fail(KVB_EINVAL, "quest_score: q, kmin, kmax or scores is NULL");
    if ((rc = kvb_check_aligned16("quest_score", "kmin", kmin)) || (rc = kvb_check_aligned16("quest_score", "kmax", kmax))) return rc;
    const size_t need = quest_score_workspace_bytes(s);
    if ((rc = check_workspace("quest_score", workspace, workspace_bytes, need))) return rc;
    const int64_t heads = (int64_t)s->B * s->Hkv;
    QuestArgs a = {};
    a.q = q, a.kmin = kmin, a.kmax = kmax;
    a.Hkv = s->Hkv, a.D = s->D, a.cap = s->cap, a.n_pages = page_count(s->L, s->P);
    a.scores = scores;
    switch (s->Hq / s->Hkv) {
    case 1: rc = launch_quest<1>(a, heads, stream); break;
    case 2: rc = launch_quest<2>(a, heads, stream); break;
    case 3: rc = launch_quest<3>(a, heads, stream); break;
    case 4: rc = launch_quest<4>(a, heads, stream); break;
    case 5: rc = launch_quest<5>(a, heads, stream); break;
    case 6: rc = launch_quest<6>(a, heads, stream); break;
    case 7: rc = launch_quest<7>(a, heads, stream); break;
    default: rc = launch_quest<8>(a, heads, stream); break;
    }
    if (rc || !pages) return rc;
    // budget/P - 1 pages among the first n - 1, then the last page (topk_rows' tail)
    const int n_sel = quest_selected_pages(budget, s->P), n = a.n_pages;
    return topk_rows(scores, (int)heads, n, n - 1, n_sel - 1, n - 1, 1, pages, n_sel, need ? workspace : NULL, stream);
}
