// batch_gemm_rotary.cu: ShadowKV's low-rank key reconstruction fused with RoPE (see batch_gemm_rotary.h).
//
// The fused kernel. Per miss token the work is one gathered U row (r*2 bytes) in, one key (D*2 bytes)
// out and 2*r*D FLOPs (r=160, D=128: 71 FLOP per byte of the floor, far above what fp32 FMA can do at
// memory speed), so the product runs on the tensor cores:
//   - a CTA takes one (b, h) and a run of its miss tokens (tokens_per_cta, from the host); its D/32 warps
//     each own 32 of the D output dims for every token: n-tiles {2w, 2w+1} and their rotate-half partners
//     {2w+D/16, 2w+1+D/16}, so both halves of every RoPE pair land in the same thread's accumulators
//     (glm's interleaved pairs are adjacent in one accumulator pair anyway);
//   - SV of the (b, h) is copied once per CTA by whole lines into shared memory (where the ring's later
//     stages will be), r padded with zeros to 16*KS, read into mma B fragments by ldmatrix.trans, and
//     stays in registers: 8*KS per thread;
//   - U rows of 32 tokens (two m16 tiles) and their RoPE table rows are gathered by cp.async into a
//     3-stage shared-memory ring (rows padded by 16 bytes: conflict-free ldmatrix and table reads), the
//     chunk ids of the CTA's tokens read into shared memory once at its start;
//   - per tile, ldmatrix A fragments, mma.sync m16n8k16 (fp32 accumulate), RoPE on the accumulators
//     with the table row, one rounding to bf16, then 8-byte stores of half pieces after one exchange
//     between the lanes of each pair (no staging in shared memory, one barrier a tile).
// Hit slots are never read or written.
//
// The composed peer: gather kernel, cuBLAS strided batched GEMM, RoPE kernel (see the header).
#include "kernels/batch_gemm_rotary/batch_gemm_rotary.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "kernels/common/kvb_cuda.h"
#include "kernels/common/kvb_device.cuh"
#include "kernels/common/kvb_grid.h"

using namespace kvb_dev;

namespace {

constexpr int kTile = 32;  // tokens per pipeline stage: two m16 tiles
constexpr int kStages = 3; // cp.async ring depth
constexpr int kMaxTokensPerCta = 512;

struct bgr_args {
    const kvb_bf16 *U, *SV, *cos_sin;
    const int32_t *ids, *cnts;
    kvb_bf16 *Kbuf;
    int32_t *bad;
    int64_t S;
    int Hkv, M, c, NB, sparse_start, r, n_chunks, tokens_per_cta;
};

// Shared-memory geometry of one instantiation.
template <int D, int KS, int ROPE>
struct bgr_geom {
    static constexpr int kThreads = D;                   // D/32 warps, 32 dims each
    static constexpr int kUPieces = 2 * KS;              // 16-byte pieces of a U row padded to 16*KS
    static constexpr int kTPieces = ROPE == ROPE_LLAMA ? D / 8 : D / 16; // table: D cos+sin, or glm's D/2
    // Rows padded by 16 bytes: conflict-free ldmatrix and table reads. A 16-byte copy into an odd row (16
    // bytes off a 32-byte boundary) fetches its sectors twice; the 32-byte-aligned layouts, swizzled or not,
    // and bulk copies measured slower (NOTES, Tried)
    static constexpr int kURow = 32 * KS + 16;           // bytes
    static constexpr int kTRow = 16 * kTPieces + 16;
    // A load round: kLoadLanes threads a token, so that a warp's 16-byte copies cover 128 contiguous bytes
    // of each row (whole L2 lines of the table rows; the L2's request rate is the kernel's busiest unit)
    static constexpr int kLoadLanes = 8;
    static constexpr int kRoundTokens = kThreads / kLoadLanes;
    static constexpr int kRounds = kTile / kRoundTokens;
    static constexpr int kStage = kTile * (kURow + kTRow) + kTile * 4; // + a validity word per token
    static constexpr int kIds = kMaxTokensPerCta + 2;     // a CTA's chunk ids: its tokens span at most this many chunks
    static constexpr int kRingOff = (4 * kIds + 15) / 16 * 16; // the ids first, then the ring
    static constexpr int kSVRow = 2 * D + 16;            // bytes; 16 B of padding: conflict-free ldmatrix
    static constexpr int kSVBytes = 16 * KS * kSVRow;     // SV at the CTA's start, over the ring's stages 1..
    static constexpr int kSmem = kRingOff + (kStages * kStage > kStage + kSVBytes ? kStages * kStage : kStage + kSVBytes);
    static constexpr int kMinBlocks = KS <= 10 ? 3 : 2; // 3 CTAs per SM up to r = 160 (<= 170 registers)
    static_assert(kThreads % kLoadLanes == 0 && kTile % kRoundTokens == 0, "whole tokens per load round");
};

// Where a thread's token of the next load round lies: chunk jr of the CTA's ids (ids_s[jr]) at token
// offset off in it. The rounds are loaded in order, so it moves kRoundTokens tokens a round without a
// division.
struct ChunkCursor {
    int jr, off;  // this thread's token of the round about to be loaded
    int step_j, step_off; // kRoundTokens = step_j * c + step_off
    __device__ __forceinline__ void advance(int c)
    {
        jr += step_j, off += step_off;
        if (off >= c) off -= c, jr++;
    }
};

// Gather the U rows and table rows of the next tile's n_rows tokens (slot order of (b, h)) into one
// stage, in kRounds rounds of kRoundTokens tokens, and move the cursor on to the tile after it; rows past
// n_rows or with a bad chunk id are zero-filled and marked invalid. ids_s: the CTA's chunk ids in shared
// memory (no global load before the copies).
template <int D, int KS, int ROPE>
__device__ __forceinline__ void load_tile(const bgr_args &a, uint8_t *stage, const int *ids_s, ChunkCursor &cur,
                                          int64_t b, int n_rows)
{
    using G = bgr_geom<D, KS, ROPE>;
    const int sub = threadIdx.x % G::kLoadLanes;
#pragma unroll
    for (int round = 0; round < G::kRounds; round++) {
        const int i = threadIdx.x / G::kLoadLanes + round * G::kRoundTokens;
        int64_t pos = -1;
        if (i < n_rows) {
            const int id = ids_s[cur.jr];
            if (id >= 0 && id < a.n_chunks) pos = (int64_t)id * a.c + cur.off;
            else if (sub == 0 && a.bad) atomicOr(a.bad, 2);
        }
        cur.advance(a.c);
        const bool valid = pos >= 0;
        const uint8_t *urow = reinterpret_cast<const uint8_t *>(a.U + (valid ? (b * a.S + pos) * a.r : 0));
        const uint8_t *trow = reinterpret_cast<const uint8_t *>(a.cos_sin + (valid ? pos * D : 0));
        uint8_t *us = stage + i * G::kURow, *ts = stage + kTile * G::kURow + i * G::kTRow;
        if (sub == 0) reinterpret_cast<int *>(stage + kTile * (G::kURow + G::kTRow))[i] = valid;
        if (a.r % 8 == 0) { // rows are 16-byte aligned: whole pieces, zeros past r
#pragma unroll
            for (int q = sub; q < G::kUPieces; q += G::kLoadLanes) {
                const bool read = valid && 8 * q < a.r; // a zero-filled piece still names a valid address: U itself
                cp_async16(us + 16 * q, read ? urow + 16 * q : reinterpret_cast<const uint8_t *>(a.U), read);
            }
        } else { // odd ranks (r = 1, 37, ...): element loads, zeros past r
            const uint16_t *u16 = reinterpret_cast<const uint16_t *>(urow);
            for (int q = sub; q < G::kUPieces; q += G::kLoadLanes) {
                uint32_t w[4];
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int k = 8 * q + 2 * e;
                    const uint32_t lo = valid && k < a.r ? __ldg(u16 + k) : 0, hi = valid && k + 1 < a.r ? __ldg(u16 + k + 1) : 0;
                    w[e] = lo | hi << 16;
                }
                *reinterpret_cast<uint4 *>(us + 16 * q) = make_uint4(w[0], w[1], w[2], w[3]);
            }
        }
#pragma unroll
        for (int q = sub; q < G::kTPieces; q += G::kLoadLanes) cp_async16(ts + 16 * q, trow + (valid ? 16 * q : 0), valid);
    }
}

// SV of (b, h) bh (r rows of D) into shared memory rows of kSVRow bytes, zeros for rows r..16*KS-1: whole
// 16-byte pieces in order, so that a warp's copies cover whole lines
template <int D, int KS, int ROPE>
__device__ __forceinline__ void load_sv(const bgr_args &a, uint8_t *sv_s, int64_t bh)
{
    using G = bgr_geom<D, KS, ROPE>;
    constexpr int kPieces = D / 8; // a row's 16-byte pieces
    const uint8_t *sv = reinterpret_cast<const uint8_t *>(a.SV + bh * a.r * D);
    for (int p = threadIdx.x; p < 16 * KS * kPieces; p += G::kThreads) {
        const int k = p / kPieces, q = p % kPieces;
        const bool read = k < a.r;
        cp_async16(sv_s + k * G::kSVRow + 16 * q, read ? sv + 16 * p : reinterpret_cast<const uint8_t *>(a.SV), read);
    }
}

template <int D, int KS, int ROPE>
__global__ void __launch_bounds__(bgr_geom<D, KS, ROPE>::kThreads, bgr_geom<D, KS, ROPE>::kMinBlocks)
    bgr_kernel(bgr_args a, int64_t bh0)
{
    using G = bgr_geom<D, KS, ROPE>;
    constexpr int H = D / 16; // n-tiles per half: tile j pairs with j + H (rotate-half)
    extern __shared__ __align__(16) uint8_t smem[];
    const int64_t bh = bh0 + blockIdx.y, b = bh / a.Hkv;
    const int cnt = a.cnts[bh];
    if (cnt < 0 || cnt > a.M) {
        if (threadIdx.x == 0 && a.bad) atomicOr(a.bad, 1);
        return;
    }
    const int n_miss = (a.M - cnt) * a.c, first = blockIdx.x * a.tokens_per_cta;
    if (first >= n_miss) return;
    const int n_tok = min(a.tokens_per_cta, n_miss - first), n_tiles = (n_tok + kTile - 1) / kTile;
    const int s0 = cnt * a.c + first; // slot-order token of the CTA's first row

    // The chunk ids of the CTA's tokens, once, into shared memory: each tile's copies then start without
    // waiting on a global load
    int *ids_s = reinterpret_cast<int *>(smem);
    uint8_t *ring = smem + G::kRingOff;
    const int j0 = s0 / a.c, n_ids = (s0 + n_tok - 1) / a.c - j0 + 1;
    for (int q = threadIdx.x; q < n_ids; q += G::kThreads) ids_s[q] = a.ids[bh * a.M + j0 + q];
    __syncthreads();

    ChunkCursor cur; // the one division of the CTA: this thread's token of tile 0's first round
    {
        const int s = s0 + threadIdx.x / G::kLoadLanes, j = s / a.c;
        cur.jr = j - j0, cur.off = s - j * a.c, cur.step_j = G::kRoundTokens / a.c, cur.step_off = G::kRoundTokens % a.c;
    }
    // Tile 0 into stage 0 and SV into the stages after it, one group; the later tiles' copies start once
    // every warp holds its SV fragments
    if (n_tiles > 0) load_tile<D, KS, ROPE>(a, ring, ids_s, cur, b, min(kTile, n_tok));
    load_sv<D, KS, ROPE>(a, ring + G::kStage, bh);
    cp_async_commit();

    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    int tile_of[4] = {2 * warp, 2 * warp + 1, 2 * warp + H, 2 * warp + 1 + H};

    // SV -> B fragments: b0 = SV[16kk + 2t .. 2t+1, n], b1 = the same 8 rows further, n = 8 tile + g:
    // ldmatrix.trans of the 8x8 blocks (rows 16kk + 8 half .., columns 8 tile ..). Lanes 8i..8i+7 give the
    // rows of block i: n-tile jj0 + i / 2, half i % 2.
    uint32_t bfrag[KS][4][2];
    cp_async_wait<0>();
    __syncthreads();
    {
        const uint32_t sv_base = smem_u32(ring + G::kStage);
        const int i = lane / 8, row = lane % 8;
#pragma unroll
        for (int kk = 0; kk < KS; kk++)
#pragma unroll
            for (int jj0 = 0; jj0 < 4; jj0 += 2) {
                uint32_t f[4];
                const int k = 16 * kk + 8 * (i % 2) + row, n0 = 8 * (2 * warp + (jj0 ? H : 0) + i / 2); // tile_of[jj0 + i / 2]
                ldsm_x4_trans(f, sv_base + k * G::kSVRow + 2 * n0);
                bfrag[kk][jj0][0] = f[0], bfrag[kk][jj0][1] = f[1];
                bfrag[kk][jj0 + 1][0] = f[2], bfrag[kk][jj0 + 1][1] = f[3];
            }
    }
    __syncthreads(); // SV read by every warp: stages 1.. may be refilled
#pragma unroll
    for (int st = 1; st < kStages - 1; st++) {
        if (st < n_tiles) load_tile<D, KS, ROPE>(a, ring + st * G::kStage, ids_s, cur, b, min(kTile, n_tok - st * kTile));
        cp_async_commit();
    }

    // ldmatrix x4 row addresses: matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15), (rows 8-15, k 8-15)
    const uint32_t a_off = (uint32_t)((lane % 8 + 8 * ((lane / 8) % 2)) * G::kURow + (lane / 16) * 16);
    kvb_bf16 *kout_bh = a.Kbuf + (bh * a.NB + a.sparse_start) * D;

    for (int tile = 0; tile < n_tiles; tile++) {
        cp_async_wait<kStages - 2>();
        __syncthreads(); // tile's stage landed; every warp is done with the stage refilled below
        const int next = tile + kStages - 1;
        if (next < n_tiles)
            load_tile<D, KS, ROPE>(a, ring + (next % kStages) * G::kStage, ids_s, cur, b, min(kTile, n_tok - next * kTile));
        cp_async_commit();

        const uint8_t *stage = ring + (tile % kStages) * G::kStage;
        float acc[2][4][4];
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int jj = 0; jj < 4; jj++)
#pragma unroll
                for (int e = 0; e < 4; e++) acc[mt][jj][e] = 0.f;
        const uint32_t a_base = smem_u32(stage) + a_off;
#pragma unroll
        for (int kk = 0; kk < KS; kk++)
#pragma unroll
            for (int mt = 0; mt < 2; mt++) {
                uint32_t af[4];
                ldsm_x4(af, a_base + mt * 16 * G::kURow + kk * 32);
#pragma unroll
                for (int jj = 0; jj < 4; jj++) mma_bf16(acc[mt][jj], af, bfrag[kk][jj][0], bfrag[kk][jj][1]);
            }

        // RoPE on the accumulators, rows g and g + 8 of each m-tile. A thread holds 4 bytes (dims 2t, 2t+1)
        // of each of the row's four 8-dim pieces tile_of[0..3]. Lanes t and t ^ 1 swap two words so that each
        // holds words t & 2 and (t & 2) + 1 of two pieces: tile_of[0] and tile_of[2] the even lane, tile_of[1]
        // and tile_of[3] the odd one. Two 8-byte stores a row, each of which the quad fills as one whole
        // 32-byte sector (pieces tile_of[0..1], then tile_of[2..3]), straight from registers, with no
        // staging and no second barrier a tile.
        const uint8_t *tab = stage + kTile * G::kURow;
        const int *ok = reinterpret_cast<const int *>(stage + kTile * (G::kURow + G::kTRow));
        const int n_rows = min(kTile, n_tok - tile * kTile);
        const bool odd = t & 1;
        const int lo_piece = 2 * warp + odd, hi_piece = lo_piece + H, word0 = t & 2; // tile_of[odd], tile_of[2 + odd]
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int hh = 0; hh < 2; hh++) {
                const int row = 16 * mt + 8 * hh + g; // every lane takes part in the shuffles, valid row or not
                const uint8_t *trow = tab + row * G::kTRow; // zeros for a row past the tile or with a bad id
                uint32_t v[4];
#pragma unroll
                for (int pr = 0; pr < 2; pr++) {
                    const float x0 = acc[mt][pr][2 * hh], x1 = acc[mt][pr][2 * hh + 1];
                    const float z0 = acc[mt][pr + 2][2 * hh], z1 = acc[mt][pr + 2][2 * hh + 1];
                    if constexpr (ROPE == ROPE_LLAMA) { // dims i, i+1 with partners i + D/2, i+1 + D/2
                        const int i = 8 * tile_of[pr] + 2 * t;
                        const float2 co = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(trow + 2 * i));
                        const float2 si = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(trow + 2 * (D / 2 + i)));
                        v[pr] = pack_bf16(x0 * co.x - z0 * si.x, x1 * co.y - z1 * si.y);
                        v[pr + 2] = pack_bf16(z0 * co.x + x0 * si.x, z1 * co.y + x1 * si.y);
                    } else { // glm: dims 2i, 2i+1 rotated (tiles below H), tiles H.. copied
                        const int i = 4 * tile_of[pr] + t;
                        const float co = __bfloat162float(*reinterpret_cast<const __nv_bfloat16 *>(trow + 2 * i));
                        const float si = __bfloat162float(*reinterpret_cast<const __nv_bfloat16 *>(trow + 2 * (D / 4 + i)));
                        v[pr] = pack_bf16(x0 * co - x1 * si, x1 * co + x0 * si);
                        v[pr + 2] = pack_bf16(z0, z1);
                    }
                }
                // each lane sends its word of the pieces its partner keeps, and keeps its own of the others
                const uint32_t got_lo = __shfl_xor_sync(0xffffffffu, odd ? v[0] : v[1], 1);
                const uint32_t got_hi = __shfl_xor_sync(0xffffffffu, odd ? v[2] : v[3], 1);
                const uint32_t own_lo = odd ? v[1] : v[0], own_hi = odd ? v[3] : v[2];
                if (row < n_rows && ok[row]) { // the even lane's word comes first
                    kvb_bf16 *krow = kout_bh + (int64_t)(s0 + tile * kTile + row) * D;
                    *reinterpret_cast<uint2 *>(krow + 8 * lo_piece + 2 * word0) =
                        odd ? make_uint2(got_lo, own_lo) : make_uint2(own_lo, got_lo);
                    *reinterpret_cast<uint2 *>(krow + 8 * hi_piece + 2 * word0) =
                        odd ? make_uint2(got_hi, own_hi) : make_uint2(own_hi, got_hi);
                }
            }
    }
}

// r -> k-steps of 16 the kernel is instantiated for (zeros pad r up to 16 * KS)
int ks_of(int r)
{
    static const int ks[] = {1, 2, 4, 6, 8, 10, 12, 16};
    for (int k : ks)
        if (r <= 16 * k) return k;
    return 0;
}

template <int D, int KS, int ROPE>
int launch_fused(const bgr_args &a, int64_t n_bh, cudaStream_t stream)
{
    using G = bgr_geom<D, KS, ROPE>;
    static unsigned long long optin = 0; // the devices where the attribute is set (kvb_cuda.h)
    int rc = kvb_smem_optin((const void *)bgr_kernel<D, KS, ROPE>, G::kSmem, &optin);
    if (rc) return rc;
    unsigned gx = 0;
    rc = kvb_grid_x("batch_gemm_rotary", "M*c tokens", (int64_t)a.M * a.c, a.tokens_per_cta, &gx);
    if (rc) return rc;
    return kvb_grid_chunks(n_bh, [&](int64_t first, unsigned count) -> int {
        bgr_kernel<D, KS, ROPE><<<dim3(gx, count), G::kThreads, G::kSmem, stream>>>(a, first);
        CUDA_TRY(cudaGetLastError());
        return KVB_OK;
    });
}

template <int D, int ROPE>
int launch_by_rank(const bgr_args &a, int64_t n_bh, cudaStream_t stream)
{
    switch (ks_of(a.r)) {
    case 1: return launch_fused<D, 1, ROPE>(a, n_bh, stream);
    case 2: return launch_fused<D, 2, ROPE>(a, n_bh, stream);
    case 4: return launch_fused<D, 4, ROPE>(a, n_bh, stream);
    case 6: return launch_fused<D, 6, ROPE>(a, n_bh, stream);
    case 8: return launch_fused<D, 8, ROPE>(a, n_bh, stream);
    case 10: return launch_fused<D, 10, ROPE>(a, n_bh, stream);
    case 12: return launch_fused<D, 12, ROPE>(a, n_bh, stream);
    case 16: return launch_fused<D, 16, ROPE>(a, n_bh, stream);
    }
    return kvb_fail(KVB_EINVAL, "batch_gemm_rotary: r=%d out of range [1, %d] for the kernel", a.r, BGR_KERNEL_MAX_RANK);
}

int check_pointers(const char *who, const kvb_bf16 *U, const kvb_bf16 *SV, const int32_t *ids, const int32_t *cnts,
                   const kvb_bf16 *cos_sin, const kvb_bf16 *Kbuf)
{
    const void *p[] = {U, SV, ids, cnts, cos_sin, Kbuf};
    const char *name[] = {"U", "SV", "ids", "cnts", "cos_sin", "Kbuf"};
    const unsigned align[] = {16, 16, 4, 4, 16, 16};
    for (int i = 0; i < 6; i++) {
        if (!p[i]) return kvb_fail(KVB_EINVAL, "%s: %s is NULL", who, name[i]);
        if ((uintptr_t)p[i] % align[i])
            return kvb_fail(KVB_EINVAL, "%s: %s=%p is not %u-byte aligned", who, name[i], p[i], align[i]);
    }
    return KVB_OK;
}

// The checks both implementations share: the contract's (batch_gemm_rotary_check, no device data) and the
// table length every position needs.
int check_common(const char *who, const kvb_bf16 *U, const kvb_bf16 *SV, const int32_t *ids, const int32_t *cnts,
                 const kvb_bf16 *cos_sin, const gather_layout *g, int S, int r, int max_pos, rope_kind rope,
                 const kvb_bf16 *Kbuf)
{
    if (!g) return kvb_fail(KVB_EINVAL, "%s: layout g is NULL", who);
    int rc = batch_gemm_rotary_check(NULL, NULL, g, S, r, max_pos, rope, who);
    if (rc) return rc;
    const int64_t need = (int64_t)(S / g->c) * g->c;
    if (max_pos < need)
        return kvb_fail(KVB_EINVAL,
                        "%s: max_pos=%d out of range [(S/c)*c = %lld, 2^31): the RoPE table must cover every position of "
                        "the context's chunks", who, max_pos, (long long)need);
    return check_pointers(who, U, SV, ids, cnts, cos_sin, Kbuf);
}

// ---- the composed peer ----

// Ug[bh, i, :] = U[b, p, :] for the miss tokens i < (M - cnt) * c of (b, h), in slot order.
__global__ void peer_gather_kernel(bgr_args a, kvb_bf16 *Ug, int64_t bh0)
{
    const int64_t bh = bh0 + blockIdx.y, b = bh / a.Hkv;
    const int cnt = a.cnts[bh];
    if (cnt < 0 || cnt > a.M) return; // reported by the RoPE kernel
    const int i = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (i >= (a.M - cnt) * a.c) return;
    const int s = cnt * a.c + i, j = s / a.c, id = a.ids[bh * a.M + j];
    if (id < 0 || id >= a.n_chunks) return;
    const kvb_bf16 *src = a.U + (b * a.S + (int64_t)id * a.c + (s - j * a.c)) * a.r;
    kvb_bf16 *dst = Ug + (bh * a.M * a.c + i) * a.r;
    if (a.r % 8 == 0)
        for (int q = lane; q < a.r / 8; q += 32) reinterpret_cast<uint4 *>(dst)[q] = ldg16(src + 8 * q);
    else
        for (int k = lane; k < a.r; k += 32) dst[k] = src[k];
}

// Kbuf[b, h, sparse_start + s, :] = bf16(rope(X[bh, i, :], p)) for the miss tokens; one warp per token.
__global__ void peer_rope_kernel(bgr_args a, const float *X, int D, int rope, int64_t bh0)
{
    const int64_t bh = bh0 + blockIdx.y;
    const int cnt = a.cnts[bh];
    if (cnt < 0 || cnt > a.M) {
        if (threadIdx.x == 0 && blockIdx.x == 0 && a.bad) atomicOr(a.bad, 1);
        return;
    }
    const int i = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (i >= (a.M - cnt) * a.c) return;
    const int s = cnt * a.c + i, j = s / a.c, id = a.ids[bh * a.M + j];
    if (id < 0 || id >= a.n_chunks) {
        if (lane == 0 && a.bad) atomicOr(a.bad, 2);
        return;
    }
    const int64_t p = (int64_t)id * a.c + (s - j * a.c);
    const float *x = X + (bh * a.M * a.c + i) * D;
    const __nv_bfloat16 *cs = reinterpret_cast<const __nv_bfloat16 *>(a.cos_sin) + p * D;
    __nv_bfloat16 *out = reinterpret_cast<__nv_bfloat16 *>(a.Kbuf) + (bh * a.NB + a.sparse_start + s) * D;
    if (rope == ROPE_LLAMA) {
        for (int d = lane; d < D / 2; d += 32) {
            const float co = __bfloat162float(cs[d]), si = __bfloat162float(cs[D / 2 + d]);
            out[d] = __float2bfloat16_rn(x[d] * co - x[d + D / 2] * si);
            out[d + D / 2] = __float2bfloat16_rn(x[d + D / 2] * co + x[d] * si);
        }
    } else {
        for (int d = lane; d < D / 4; d += 32) {
            const float co = __bfloat162float(cs[d]), si = __bfloat162float(cs[D / 4 + d]);
            out[2 * d] = __float2bfloat16_rn(x[2 * d] * co - x[2 * d + 1] * si);
            out[2 * d + 1] = __float2bfloat16_rn(x[2 * d + 1] * co + x[2 * d] * si);
        }
        for (int d = D / 2 + lane; d < D; d += 32) out[d] = __float2bfloat16_rn(x[d]);
    }
}

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

bgr_args args_of(const kvb_bf16 *U, const kvb_bf16 *SV, const int32_t *ids, const int32_t *cnts, const kvb_bf16 *cos_sin,
                 const gather_layout *g, int S, int r, kvb_bf16 *Kbuf, int32_t *bad)
{
    bgr_args a;
    a.U = U, a.SV = SV, a.cos_sin = cos_sin, a.ids = ids, a.cnts = cnts, a.Kbuf = Kbuf, a.bad = bad;
    a.S = S, a.Hkv = g->Hkv, a.M = g->M, a.c = g->c, a.NB = g->NB, a.sparse_start = g->sparse_start, a.r = r;
    a.n_chunks = S / g->c;
    a.tokens_per_cta = 0;
    return a;
}

} // namespace

extern "C" int batch_gemm_rotary(const kvb_bf16 *U, const kvb_bf16 *SV, const int32_t *ids, const int32_t *cnts,
                                 const kvb_bf16 *cos_sin, const gather_layout *g, int S, int r, int max_pos, rope_kind rope,
                                 kvb_bf16 *Kbuf, int32_t *bad, cudaStream_t stream)
{
    const char *who = "batch_gemm_rotary";
    int rc = check_common(who, U, SV, ids, cnts, cos_sin, g, S, r, max_pos, rope, Kbuf);
    if (rc) return rc;
    if (r > BGR_KERNEL_MAX_RANK)
        return kvb_fail(KVB_EINVAL, "%s: r=%d out of range [1, %d] for the kernel (zero-padded to 16, 32, 64, 96, 128, 160, 192 or 256)",
                        who, r, BGR_KERNEL_MAX_RANK);
    if (g->D != 64 && g->D != 128) return kvb_fail(KVB_EINVAL, "%s: D=%d out of range {64, 128} for the kernel", who, g->D);
    bgr_args a = args_of(U, SV, ids, cnts, cos_sin, g, S, r, Kbuf, bad);
    // Tokens per CTA: 512 (SV, 40 KB at r = 160, is loaded once per CTA), halved while the grid would be
    // under two waves of 3 CTAs per SM (small batches), down to one 32-token tile.
    const int64_t n_bh = (int64_t)g->B * g->Hkv, mc = (int64_t)g->M * g->c;
    int tpc = kMaxTokensPerCta;
    while (tpc > kTile && n_bh * ((mc + tpc - 1) / tpc) < 6LL * kvb_sm_count()) tpc /= 2;
    a.tokens_per_cta = tpc;
    if (rope == ROPE_LLAMA) return g->D == 64 ? launch_by_rank<64, ROPE_LLAMA>(a, n_bh, stream) : launch_by_rank<128, ROPE_LLAMA>(a, n_bh, stream);
    return g->D == 64 ? launch_by_rank<64, ROPE_GLM>(a, n_bh, stream) : launch_by_rank<128, ROPE_GLM>(a, n_bh, stream);
}

__global__ void clear_bad_kernel(int32_t *bad) { *bad = 0; }

extern "C" int batch_gemm_rotary_clear_bad(int32_t *bad, cudaStream_t stream)
{
    if (!bad) return kvb_fail(KVB_EINVAL, "batch_gemm_rotary_clear_bad: bad is NULL");
    clear_bad_kernel<<<1, 1, 0, stream>>>(bad);
    CUDA_TRY(cudaGetLastError());
    return KVB_OK;
}

extern "C" size_t batch_gemm_rotary_composed_workspace_bytes(const gather_layout *g, int r)
{
    if (!g || r < 1) return 0;
    const size_t rows = (size_t)g->B * g->Hkv * g->M * g->c;
    return align256(rows * r * 2) + rows * g->D * 4;
}

extern "C" int batch_gemm_rotary_composed(void *cublas_handle, const kvb_bf16 *U, const kvb_bf16 *SV, const int32_t *ids,
                                          const int32_t *cnts, const kvb_bf16 *cos_sin, const gather_layout *g, int S,
                                          int r, int max_pos, rope_kind rope, kvb_bf16 *Kbuf, int32_t *bad,
                                          void *workspace, size_t workspace_bytes, cudaStream_t stream)
{
    const char *who = "batch_gemm_rotary_composed";
    int rc = check_common(who, U, SV, ids, cnts, cos_sin, g, S, r, max_pos, rope, Kbuf);
    if (rc) return rc;
    if (!cublas_handle) return kvb_fail(KVB_EINVAL, "%s: cublas_handle is NULL", who);
    const size_t need = batch_gemm_rotary_composed_workspace_bytes(g, r);
    if (!workspace || workspace_bytes < need)
        return kvb_fail(KVB_EINVAL, "%s: workspace_bytes=%zu out of range [%zu, inf) (or workspace NULL)", who,
                        workspace_bytes, need);
    const bgr_args a = args_of(U, SV, ids, cnts, cos_sin, g, S, r, Kbuf, bad);
    const int64_t n_bh = (int64_t)g->B * g->Hkv, mc = (int64_t)g->M * g->c;
    kvb_bf16 *Ug = static_cast<kvb_bf16 *>(workspace);
    float *X = reinterpret_cast<float *>(static_cast<uint8_t *>(workspace) + align256((size_t)n_bh * mc * r * 2));
    constexpr int kWarps = 8; // tokens per block of the gather and RoPE kernels
    unsigned gx = 0;
    if ((rc = kvb_grid_x(who, "M*c tokens", mc, kWarps, &gx))) return rc;
    cublasHandle_t h = static_cast<cublasHandle_t>(cublas_handle);
    CUBLAS_TRY(cublasSetStream(h, stream));
    const float one = 1.f, zero = 0.f;
    return kvb_grid_chunks(n_bh, [&](int64_t first, unsigned count) -> int {
        peer_gather_kernel<<<dim3(gx, count), 32 * kWarps, 0, stream>>>(a, Ug, first);
        CUDA_TRY(cudaGetLastError());
        // row-major X[bh] (Mc x D) = Ug[bh] (Mc x r) SV[bh] (r x D), i.e. column-major X^T = SV^T Ug^T
        CUBLAS_TRY(cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, g->D, (int)mc, r, &one, SV + first * r * g->D,
                                              CUDA_R_16BF, g->D, (long long)r * g->D, Ug + first * mc * r, CUDA_R_16BF, r,
                                              (long long)mc * r, &zero, X + first * mc * g->D, CUDA_R_32F, g->D,
                                              (long long)mc * g->D, (int)count, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        peer_rope_kernel<<<dim3(gx, count), 32 * kWarps, 0, stream>>>(a, X, g->D, (int)rope, first);
        CUDA_TRY(cudaGetLastError());
        return KVB_OK;
    });
}
