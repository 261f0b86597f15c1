// selective_attn_lse_packed.cu: the Hopper (sm_90a) LSE of a packed window for selective_attn's need_out=0
// forward (lse_packed_kernel): the G heads' window rows in one 128-row tile, loaded once, K streamed by a
// producer warp's TMA loads through mbarrier stages to two consumer warpgroups running wgmma. selective_attn.cu
// plans its key splits and merges their partials. Budget, design and what was tried:
// kernels/selective_attn/NOTES.md.
#include "kernels/selective_attn/selective_attn_wgmma.cuh"

#include <type_traits>

namespace {

// Shared memory of the packed LSE pass: the packed query tile | K stages | mbarriers (+1024 for alignment).
constexpr int LSE_STAGES = 4; // K tiles in flight (no V: need_out=0)
template <int D> struct LseSmem {
    static constexpr uint32_t Q = 0, K = tile_bytes<D>(ROWS), BAR = K + LSE_STAGES * tile_bytes<D>(TILE), BYTES = BAR + 128 + 1024;
};

struct LseArgs {
    float *lse;            // one split (gridDim.z == 1): the LSE
    float *part_m, *part_l; // else each split's (max in log2 units, sum) per row, merge_lse_kernel's layout
    int L, G, w0, pack_rows, lse_len, lse_row0, split_keys;
    float scale, scale_log2;
};

// ---- pass 1, packed window: LSE of few rows ---------------------------------------------------------
// With need_out=0 and the G heads' window rows in one 128-row tile (pack_rows = L - w0 a head, a
// multiple of 8), the LSE alone: CTA = (KV head, split of the keys), the packed tile (head h's rows at
// tile rows h * pack_rows.., one TMA box each, as colsum_packed_kernel's) loaded once as the register A
// operands of S = Q K^T, K tiles streamed through LSE_STAGES stages, an online max and sum per row and
// no V. Each warpgroup keeps two tiles' S: the next tile's MMAs are issued before this tile's exps. The splits are selective_attn.cu's plan (FwdPlan) and their partials its merge_lse_kernel's.
template <int D, bool CAUSAL>
__global__ void __launch_bounds__(THREADS, 1)
    lse_packed_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k, const LseArgs a)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using S = LseSmem<D>;
    constexpr int KSTEPS = D / 16, NCH = D / CHUNK;
    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = aligned_smem(smem_raw);
    const uint32_t base = smem_u32(smem);
    uint64_t *bar = reinterpret_cast<uint64_t *>(smem + S::BAR);
    uint64_t *q_full = bar, *k_full = bar + 1, *k_empty = k_full + LSE_STAGES;

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int L = a.L, G = a.G, w0 = a.w0, PR = a.pack_rows;
    const int bkv = blockIdx.x, split = blockIdx.z;
    const int kbeg = split * a.split_keys, kend = min(L, kbeg + a.split_keys);
    const int n_tiles = (kend - kbeg + TILE - 1) / TILE; // >= 1: every split starts below L

    if (tid == 0) {
        mbar_init(q_full, 1);
        for (int s = 0; s < LSE_STAGES; ++s) mbar_init(&k_full[s], 1), mbar_init(&k_empty[s], CONSUMER_WARPS);
        mbar_init_fence();
    }
    __syncthreads();

    if (warp >= PRODUCER_WARP) { // one lane issues every load; a stage is refilled once all 8 consumer warps freed it
        setmaxnreg_dec<PRODUCER_REGS>();
        if (warp == PRODUCER_WARP && lane == 0) {
            mbar_expect_tx(q_full, tile_bytes<D>(G * PR));
            for (int c = 0; c < NCH; ++c)
                for (int h = 0; h < G; ++h)
                    tma_load_3d(base + S::Q + chunk_off(ROWS, c) + h * PR * 128, &tm_q, c * CHUNK, w0, bkv * G + h, q_full);
            for (int it = 0; it < n_tiles; ++it) {
                const int st = it % LSE_STAGES;
                if (it >= LSE_STAGES) mbar_wait(&k_empty[st], ((it / LSE_STAGES) + 1) & 1);
                mbar_expect_tx(&k_full[st], tile_bytes<D>(TILE));
                for (int c = 0; c < NCH; ++c)
                    tma_load_3d(base + S::K + st * tile_bytes<D>(TILE) + chunk_off(TILE, c), &tm_k, c * CHUNK, kbeg + it * TILE,
                                bkv, &k_full[st]);
            }
        }
        return;
    }

    setmaxnreg_inc<CONSUMER_REGS>();
    const int wg = warp >> 2, wl = warp & 3, g = lane >> 2, t = lane & 3;
    int head[2], pos[2]; // tile rows wg * 64 + wl * 16 + g (+ 8): their query head in the group and position
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = wg * 64 + wl * 16 + g + 8 * r;
        head[r] = row / PR, pos[r] = w0 + row - head[r] * PR;
    }
    float s0[64], s1[64]; // S of two K tiles: one in the MMAs while the other's exps run
    float m_r[2] = {-INFINITY, -INFINITY}, l_r[2] = {0.f, 0.f}; // m in raw score units
    uint32_t qf[KSTEPS][4]; // this warp's 16 tile rows as register A operands (rows past the G heads: never stored)
    const uint64_t desc_k0 = wgmma_desc_sw128(base + S::K, 16, 1024);

    // The online max and sum of a tile's S (keys k0..): with EDGE, keys past the split or after a row's
    // position count as -inf. s is only read: a write to it while the other tile's MMAs run would
    // serialize them.
    auto softmax_sum = [&](const float(&s)[64], int k0, auto edge) {
        constexpr bool EDGE = decltype(edge)::value;
        auto val = [&](int n, int e) {
            const int j = k0 + n * 8 + 2 * t + (e & 1);
            return EDGE && (j >= kend || (CAUSAL && j > pos[e >> 1])) ? -INFINITY : s[4 * n + e];
        };
        float mx[2] = {m_r[0], m_r[1]};
#pragma unroll
        for (int n = 0; n < 16; ++n) {
            mx[0] = fmaxf(mx[0], fmaxf(val(n, 0), val(n, 1)));
            mx[1] = fmaxf(mx[1], fmaxf(val(n, 2), val(n, 3)));
        }
        float msc[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            mx[r] = warp_max<1, 2>(mx[r]); // the quad holding the row
            l_r[r] *= m_r[r] == -INFINITY ? 0.f : ex2((m_r[r] - mx[r]) * a.scale_log2);
            msc[r] = mx[r] == -INFINITY ? 0.f : mx[r] * a.scale_log2;
            m_r[r] = mx[r];
        }
#pragma unroll
        for (int n = 0; n < 16; ++n) {
            l_r[0] += ex2(fmaf(val(n, 0), a.scale_log2, -msc[0])) + ex2(fmaf(val(n, 1), a.scale_log2, -msc[0]));
            l_r[1] += ex2(fmaf(val(n, 2), a.scale_log2, -msc[1])) + ex2(fmaf(val(n, 3), a.scale_log2, -msc[1]));
        }
    };
    // tile it's S, its MMAs done: free its K stage, then its max and sum
    auto tile_lse = [&](float(&s)[64], int it) {
        wgmma_fence_regs(s);
        __syncwarp();
        if (lane == 0) mbar_arrive(&k_empty[it % LSE_STAGES]);
        const int k0 = kbeg + it * TILE;
        if (k0 + TILE > kend || (CAUSAL && k0 + TILE - 1 > w0))
            softmax_sum(s, k0, std::true_type{});
        else
            softmax_sum(s, k0, std::false_type{});
    };

    mbar_wait(q_full, 0);
    load_a_frags<D>(qf, base + S::Q + wg * 64 * 128, ROWS, wl * 16, lane);
    // S = Q K^T of tile it + 1 is issued before tile it's exps, so this warpgroup's next MMAs run under
    // its own exps (64 rows x 128 keys a warpgroup a tile)
    issue_qk<D, LSE_STAGES>(s0, qf, desc_k0, k_full, 0);
    int it = 0;
    for (; it + 2 < n_tiles; it += 2) { // tile it in flight in s0, two more tiles after it
        issue_qk<D, LSE_STAGES>(s1, qf, desc_k0, k_full, it + 1);
        wgmma_wait<1>();
        tile_lse(s0, it);
        issue_qk<D, LSE_STAGES>(s0, qf, desc_k0, k_full, it + 2);
        wgmma_wait<1>();
        tile_lse(s1, it + 1);
    }
    if (it + 1 < n_tiles) { // the last two tiles
        issue_qk<D, LSE_STAGES>(s1, qf, desc_k0, k_full, it + 1);
        wgmma_wait<1>();
        tile_lse(s0, it);
        wgmma_wait<0>();
        tile_lse(s1, it + 1);
    } else { // the last tile
        wgmma_wait<0>();
        tile_lse(s0, it);
    }

    // the rows' LSE, or this split's partial (max in log2 units, sum)
#pragma unroll
    for (int r = 0; r < 2; ++r) l_r[r] = warp_sum<1, 2>(l_r[r]);
    if (t == 0) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            if (head[r] >= G) continue; // a tile row past the G heads
            const int64_t bhr = (int64_t)bkv * G + head[r];
            const int i = pos[r];
            if (gridDim.z == 1) {
                if (i >= a.lse_row0) a.lse[bhr * a.lse_len + (i - a.lse_row0)] = m_r[r] * a.scale + logf(l_r[r]);
            } else {
                const int64_t at = ((int64_t)split * gridDim.x * G + bhr) * PR + (i - w0);
                a.part_m[at] = m_r[r] == -INFINITY ? -INFINITY : m_r[r] * a.scale_log2;
                a.part_l[at] = l_r[r];
            }
        }
    }
#endif
}

template <int D, bool CAUSAL> int launch_lse_packed(const CUtensorMap *m, const LseArgs &a, dim3 grid, cudaStream_t s)
{
    static unsigned long long optin = 0; // the devices where the attribute is set (kvb_cuda.h)
    int rc = kvb_smem_optin((const void *)lse_packed_kernel<D, CAUSAL>, LseSmem<D>::BYTES, &optin);
    if (rc) return rc;
    lse_packed_kernel<D, CAUSAL><<<grid, THREADS, LseSmem<D>::BYTES, s>>>(m[0], m[1], a);
    CUDA_TRY(cudaGetLastError());
    return KVB_OK;
}

} // namespace

extern "C" int selective_attn_lse_packed_wgmma(const kvb_bf16 *Q, const kvb_bf16 *K, const sattn_params *p, int splits,
                                               int split_keys, float *LSE, float *part_m, float *part_l, cudaStream_t stream)
{
    const char *who = "selective_attn_lse_packed_wgmma";
    int rc = sattn_check(p, who);
    if (rc) return rc;
    const int G = sattn_groups(p), rows = p->L - p->w0;
    if (p->need_out || (int64_t)G * rows > ROWS || rows % 8)
        return kvb_fail(KVB_EINVAL, "%s: need_out=%d, G*(L-w0)=%lld, L-w0=%d out of range: need_out=0, G*(L-w0) in [8, %d], L-w0 a multiple of 8",
                        who, p->need_out, (long long)G * rows, rows, ROWS);
    if (split_keys < 1 || splits < 1 || splits > 65535 || (int64_t)splits * split_keys < p->L || (int64_t)(splits - 1) * split_keys >= p->L)
        return kvb_fail(KVB_EINVAL, "%s: splits=%d split_keys=%d out of range: splits in [1, 65535] whose split_keys-key ranges end in the last of L=%d",
                        who, splits, split_keys, p->L);
    if (!Q || !K || (splits == 1 ? !LSE : (!part_m || !part_l)))
        return kvb_fail(KVB_EINVAL, "%s: NULL pointer among Q, K and LSE (one split) or part_m, part_l (several)", who);
    if ((rc = kvb_check_aligned16(who, "Q", Q)) || (rc = kvb_check_aligned16(who, "K", K))) return rc;
    if (!selective_attn_wgmma_supported()) return kvb_fail(KVB_EDEVICE, "%s: needs a compute capability 9.0 device (sm_90a code)", who);
    const int64_t BH = (int64_t)p->B * p->Hq, n_kv = (int64_t)p->B * p->Hkv;
    CUtensorMap m[2];
    if ((rc = make_map(&m[0], Q, p->D, p->L, BH, rows)) || (rc = make_map(&m[1], K, p->D, p->L, n_kv, TILE))) return rc;
    LseArgs a;
    a.lse = LSE, a.part_m = part_m, a.part_l = part_l;
    a.L = p->L, a.G = G, a.w0 = p->w0, a.pack_rows = rows;
    a.lse_len = sattn_lse_len(p), a.lse_row0 = sattn_lse_row0(p), a.split_keys = split_keys;
    a.scale = 1.f / sqrtf((float)p->D), a.scale_log2 = a.scale * LOG2E;
    const dim3 grid((unsigned)n_kv, 1u, (unsigned)splits);
    if (p->D == 64) return p->causal ? launch_lse_packed<64, true>(m, a, grid, stream) : launch_lse_packed<64, false>(m, a, grid, stream);
    return p->causal ? launch_lse_packed<128, true>(m, a, grid, stream) : launch_lse_packed<128, false>(m, a, grid, stream);
}
