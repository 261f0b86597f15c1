// selective_attn_wgmma.cuh: what the Hopper passes of selective_attn share (selective_attn_wgmma.cu: the
// forward and the column sums; selective_attn_lse_packed.cu: the LSE of a packed window): the warpgroup
// layout, the tiles' shared-memory layout, the wgmma operand helpers, the ping-pong barriers and the
// tensor maps. Design: selective_attn_wgmma.cu's header and kernels/selective_attn/NOTES.md.
#ifndef KVB_KERNELS_SELECTIVE_ATTN_WGMMA_CUH
#define KVB_KERNELS_SELECTIVE_ATTN_WGMMA_CUH

#include <cstdint>

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>

#include "kernels/common/kvb_cuda.h"
#include "kernels/common/kvb_device.cuh"
#include "kernels/selective_attn/selective_attn.h"

typedef __nv_bfloat16 bf16;
using namespace kvb_dev;

// The compute_90 (PTX) pass compiles the kernels' bodies away (wgmma is sm_90a only), which leaves
// the helpers they use unreferenced there.
#pragma nv_diag_suppress 177

namespace {


constexpr float LOG2E = 1.4426950408889634f;

constexpr int WG_THREADS = 128;                       // a warpgroup
constexpr int TILE = 128;                             // keys (forward) or queries (col sums) per step
constexpr int CHUNK = 64;                             // D columns per 128-byte swizzled row

// The forward: two consumer warpgroups of 64 query rows and the producer warpgroup.
constexpr int CONSUMERS = 2;                          // consumer warpgroups
constexpr int PRODUCER_WARP = 4 * CONSUMERS;          // the TMA warp: the first of the producer warpgroup
constexpr int THREADS = (CONSUMERS + 1) * WG_THREADS; // 384, 168 registers each at launch; then the
constexpr int PRODUCER_REGS = 24, CONSUMER_REGS = 240; // producer warpgroup gives 144 each to the consumers
static_assert(PRODUCER_REGS * WG_THREADS + CONSUMER_REGS * CONSUMERS * WG_THREADS <= 65536, "register file");
constexpr int ROWS = 64 * CONSUMERS;                  // query rows per CTA
constexpr int FWD_STAGES = 2;                         // K, V tiles in flight
constexpr int CONSUMER_WARPS = 4 * CONSUMERS;         // arrivals that free a forward stage (one per warp)

// The column sums: four consumer warpgroups of 64 keys and the producer warpgroup. 640 threads launch
// with 96 registers each (each SM sub-partition's 16K registers hold five warps); setmaxnreg then
// gives the consumers 112 (one S^T register set; K stays in shared memory, where the MMAs read it:
// as registers it would take 32 of the 112) and the producer 24.
constexpr int COL_WARPGROUPS = 4;
constexpr int COL_ROWS = 64 * COL_WARPGROUPS;                      // keys per CTA
constexpr int COL_PRODUCER_WARP = 4 * COL_WARPGROUPS;
constexpr int COL_THREADS = (COL_WARPGROUPS + 1) * WG_THREADS;     // 640
constexpr int COL_PRODUCER_REGS = 24, COL_CONSUMER_REGS = 112;
static_assert(COL_PRODUCER_REGS * WG_THREADS + COL_CONSUMER_REGS * COL_WARPGROUPS * WG_THREADS <=
                  65536 / COL_THREADS / 8 * 8 * COL_THREADS,
              "register file");
constexpr int COL_STAGES = 4; // Q tiles in flight (5 do not fit beside the 64 KB K block at D=128)

// Bytes of a [rows x D] tile, and the offset of its 64-column chunk c.
template <int D> __host__ __device__ constexpr uint32_t tile_bytes(int rows) { return (uint32_t)rows * D * 2; }
__host__ __device__ constexpr uint32_t chunk_off(int rows, int c) { return (uint32_t)c * rows * 128; }

// Shared memory of the forward: Q | K stages | V stages | mbarriers (+1024 for the alignment of the base).
template <int D> struct FwdSmem {
    static constexpr uint32_t Q = 0, K = tile_bytes<D>(ROWS), V = K + FWD_STAGES * tile_bytes<D>(TILE),
                              BAR = V + FWD_STAGES * tile_bytes<D>(TILE), BYTES = BAR + 128 + 1024;
};
// Shared memory of the column sums: K block | Q stages | log2 LSE stages | raw LSE staging | mbarriers.
constexpr int LSE_SLOTS = 4; // the producer's cp.async staging of the LSE: 3 steps ahead
template <int D> struct ColSmem {
    static constexpr uint32_t K = 0, Q = tile_bytes<D>(COL_ROWS), LSE = Q + COL_STAGES * tile_bytes<D>(TILE),
                              LSE_RAW = LSE + COL_STAGES * TILE * 4, BAR = LSE_RAW + LSE_SLOTS * TILE * 4,
                              BYTES = BAR + 128 + 1024;
    static_assert(BYTES <= 227 * 1024, "shared memory of one CTA");
};

// Which (head, tile) a CTA runs (block_tile): the grid is 1-D, in sections of `hsec` consecutive heads
// (whole KV groups) so that the K and V (forward) or Q (column sums) streamed by the CTAs running at once
// stay in L2; within a section the longest tiles come first, the section's heads fastest.
struct Order {
    int heads, tiles, hsec;
};

struct FwdArgs {
    float *lse; // [B * Hq, L]
    int L, G, n_qtiles;
    float scale, scale_log2;
    Order ord; // heads = B Hq, tiles = n_qtiles
};

struct ColArgs {
    const float *lse;
    float *colsum, *colsum_kv;
    int L, G, w0, lse_len, lse_row0;
    float scale_log2;
    Order ord; // heads = B Hkv, tiles = key blocks
    // pack_rows > 0: the packed kernel, each head's rows in its tile (0: the tiles' kernel); the key
    // blocks of a KV head and of a CTA (1 for the tiles' kernel)
    int pack_rows, kblocks, kblocks_per_cta;
};

// Tile index 0 is the longest (the forward's last query tile, the column sums' first key block).
__device__ __forceinline__ void block_tile(const Order &o, int &head, int &tile)
{
    const int b = blockIdx.x, per = o.hsec * o.tiles, sec = b / per, r = b - sec * per;
    const int h0 = sec * o.hsec, n = min(o.hsec, o.heads - h0);
    tile = r / n;
    head = h0 + (r - tile * n);
}

// The 1024-byte-aligned base of the dynamic shared memory (TMA's 128-byte swizzle needs it).
__device__ __forceinline__ uint8_t *aligned_smem(uint8_t *raw)
{
    const uint32_t a = smem_u32(raw);
    return raw + (((a + 1023u) & ~1023u) - a);
}

// k-step kk of a 64 x 128 S tile: the first one writes it, the others accumulate (kk is a constant
// once the k-loop is unrolled).
__device__ __forceinline__ void wgmma_ss(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int kk)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if (kk == 0)
        wgmma_m64n128k16_ss<false>(d, desc_a, desc_b);
    else
        wgmma_m64n128k16_ss<true>(d, desc_a, desc_b);
#endif
}

// The same with A from registers.
__device__ __forceinline__ void wgmma_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b, int kk)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    if (kk == 0)
        wgmma_m64n128k16_rs<false>(d, a, desc_b);
    else
        wgmma_m64n128k16_rs<true>(d, a, desc_b);
#endif
}

// A warp's 16 rows (row0.. of a swizzled tile whose 64-column chunks are `chunk_rows` rows apart) as the
// A fragments of its D / 16 k-steps: ldmatrix x4 of rows lane & 15, 16-byte unit 2 (kk & 3) + lane / 16.
template <int D>
__device__ __forceinline__ void load_a_frags(uint32_t (&f)[D / 16][4], uint32_t tile, int chunk_rows, int row0, int lane)
{
    const int r = row0 + (lane & 15);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        const int u = 2 * (kk & 3) + (lane >> 4);
        ldsm_x4(f[kk], tile + chunk_off(chunk_rows, kk >> 2) + r * 128 + ((u ^ (r & 7)) << 4));
    }
}

// S = Q K^T of K stage it % STAGES (64 rows x 128 keys a warpgroup), issued once the stage is in, with the
// warp's 16 query rows as register A operands; committed, not waited for.
template <int D, int STAGES>
__device__ __forceinline__ void issue_qk(float (&s)[64], const uint32_t (&qf)[D / 16][4], uint64_t desc_k0, uint64_t *k_full, int it)
{
    const int st = it % STAGES;
    const uint64_t dk = desc_k0 + (uint64_t)(st * (tile_bytes<D>(TILE) >> 4));
    mbar_wait(&k_full[st], (it / STAGES) & 1);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) wgmma_rs(s, qf[kk], dk + ((chunk_off(TILE, kk >> 2) + (kk & 3) * 32) >> 4), kk);
    wgmma_commit();
}

// ---- ping-pong of the column sums (FlashAttention-3's warp-scheduler barriers) ---------------------
// Consumer warpgroup w issues a step's MMAs only after warpgroup w - 1 (cyclically) issued its own, so
// the warpgroups take turns on the tensor cores and one's exps run under another's MMAs instead of all
// of them computing exps at once. Hardware barrier TURN_BAR + w holds w's turn: w waits on it
// (bar.sync, 128 threads) and w - 1 arrives on it (bar.arrive, 128 more). The last warpgroup arrives
// once before its first step (warpgroup 0 goes first) and skips its arrival after its last step, so
// that every arrival is matched. (The forward does not take turns: see NOTES.md.)
constexpr int TURN_BAR = 3; // barriers 3..6 (0 is __syncthreads; the forward's epilogue uses 1 and 2)
__device__ __forceinline__ void turn_wait(int wg) { named_barrier(TURN_BAR + wg, 2 * WG_THREADS); }
__device__ __forceinline__ void turn_pass(int wg)
{
    named_barrier_arrive(TURN_BAR + (wg + 1) % COL_WARPGROUPS, 2 * WG_THREADS);
}

inline PFN_cuTensorMapEncodeTiled_v12000 encode_fn()
{
    static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
    if (!fn) {
        void *p = nullptr;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) == cudaSuccess &&
            q == cudaDriverEntryPointSuccess)
            fn = (PFN_cuTensorMapEncodeTiled_v12000)p;
    }
    return fn;
}

// A 3-D map of a [heads, L, D] bf16 tensor: boxes of 64 columns x box_rows rows of one head, 128-byte
// swizzled; rows past L read as zeros and are not written.
inline int make_map(CUtensorMap *m, const void *ptr, int D, int L, int64_t heads, int box_rows)
{
    PFN_cuTensorMapEncodeTiled_v12000 enc = encode_fn();
    if (!enc) return kvb_fail(KVB_EDEVICE, "selective_attn (wgmma): cuTensorMapEncodeTiled is not available from the driver");
    const cuuint64_t dims[3] = {(cuuint64_t)D, (cuuint64_t)L, (cuuint64_t)heads};
    const cuuint64_t strides[2] = {(cuuint64_t)D * 2, (cuuint64_t)L * D * 2};
    const cuuint32_t box[3] = {CHUNK, (cuuint32_t)box_rows, 1}, elem[3] = {1, 1, 1};
    const CUresult r = enc(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<void *>(ptr), dims, strides, box, elem,
                           CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                           CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS)
        return kvb_fail(KVB_EDEVICE, "selective_attn (wgmma): cuTensorMapEncodeTiled failed (%d) for D=%d L=%d heads=%lld",
                        (int)r, D, L, (long long)heads);
    return KVB_OK;
}

} // namespace

#endif
