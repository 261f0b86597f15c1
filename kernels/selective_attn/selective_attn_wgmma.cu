// selective_attn_wgmma.cu: the Hopper (sm_90a) passes of selective flash attention, as FlashAttention-3
// builds them: a producer warpgroup (one thread issuing TMA loads into a ring of shared-memory stages
// tracked with mbarriers; setmaxnreg hands its registers to the consumers) and consumer warpgroups
// running wgmma, with no block-wide barrier in the main loop. Semantics and API: selective_attn.h; the
// mma.sync passes stay in selective_attn.cu (impl=*_mma). Budget, design and what was tried:
// kernels/selective_attn/NOTES.md.
//
// Napkin math (B=1, H=32, D=128, causal, L=16K; pairs = H L (L+1) / 2 = 4.3e9):
//   forward   4 D pairs = 2.2 TFLOP: 2.75 ms at a bf16 matrix rate of 800 TFLOP/s.
//   colsum    2 D pairs = 1.1 TFLOP (1.37 ms at that rate) plus one exp2 per pair: per SM and clock
//             the tensor cores do ~4096 bf16 FLOP = 16 pairs of D=128 and the MUFU 16 exp2, so at the
//             peak rates the exps take as long as the MMAs (~1.0 ms each on 132 SMs at 1.98 GHz). The
//             pass lands above both floors: the two pipes overlap only partly.
//
// Tiles: every operand tile is [rows x D] bf16 in 64-column chunks of rows x 128 B, each chunk
// 128-byte-swizzled by TMA (16-byte unit u of row r at u ^ (r & 7)) and 1024-byte aligned, which is
// the layout a wgmma SW128 descriptor names (kvb_device.cuh: wgmma_desc_sw128).
//   forward     CTA = 128 query rows of one head (two consumer warpgroups of 64), 128-key steps, 2 K
//               and 2 V stages. S = Q K^T: m64n128k16, A = Q from registers (ldmatrix once), B = K
//               from shared memory (K-major). O += P V: m64n{D}k16, A = P from registers, B = V from
//               shared memory (N-major). Per tile one wait, the softmax, then P V of this tile and S
//               of the next issued back to back.
//   col sums    CTA = 256 keys of one KV head (four consumer warpgroups of 64, K read by the MMAs from
//               shared memory, 4 Q stages), 128-query steps over the G query heads: S^T = K Q^T
//               (m64n128k16, A = K, B = Q K-major), p = exp2(s log2e/sqrt(D) - LSE log2e) summed per
//               key in registers. The producer also stages each step's log2-scaled LSE (+inf for rows
//               that do not contribute), fetched by cp.async three steps ahead. Each colsum and
//               colsum_kv element is written once, by the CTA owning its key: no atomics, no
//               dependence on launch order. The consumer warpgroups take turns issuing their MMAs
//               (ping-pong, turn_wait), so that one's exps run under another's MMAs.
//   packed      need_out=0 with the G heads' window rows in one 128-query tile: the tile is loaded once
//               and each CTA streams a run of its KV head's key blocks, for the LSE (lse_packed_kernel,
//               on selective_attn.cu's key splits) and for the column sums (colsum_packed_kernel).
//   The forward's and the column sums' grids run in L2-sized sections of KV heads (Order, make_order).
#include "kernels/selective_attn/selective_attn_wgmma.cuh"

namespace {

// ---- pass 1: forward (O, LSE) ----------------------------------------------------------------------

template <int D, bool CAUSAL>
__global__ void __launch_bounds__(THREADS, 1)
    fwd_wgmma_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                     const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_o, const FwdArgs a)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using S = FwdSmem<D>;
    constexpr int KSTEPS = D / 16, NCH = D / CHUNK, NO = D / 2; // k-steps of S, chunks of D, O registers
    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = aligned_smem(smem_raw);
    const uint32_t base = smem_u32(smem);
    uint64_t *bar = reinterpret_cast<uint64_t *>(smem + S::BAR);
    uint64_t *q_full = bar, *k_full = bar + 1, *v_full = k_full + FWD_STAGES, *k_empty = v_full + FWD_STAGES,
             *v_empty = k_empty + FWD_STAGES;

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    int bh, qt;
    block_tile(a.ord, bh, qt);
    const int L = a.L, bkv = bh / a.G;
    const int q0 = (a.n_qtiles - 1 - qt) * ROWS; // the longest rows first
    const int kend = CAUSAL ? min(L, q0 + ROWS) : L;
    const int n_tiles = (kend + TILE - 1) / TILE;

    if (tid == 0) {
        mbar_init(q_full, 1);
        for (int s = 0; s < FWD_STAGES; ++s) {
            mbar_init(&k_full[s], 1), mbar_init(&v_full[s], 1);
            mbar_init(&k_empty[s], CONSUMER_WARPS), mbar_init(&v_empty[s], CONSUMER_WARPS);
        }
        mbar_init_fence();
    }
    __syncthreads();

    if (warp >= PRODUCER_WARP) { // one lane issues every load; a stage is refilled once all 8 consumer warps freed it
        setmaxnreg_dec<PRODUCER_REGS>();
        if (warp == PRODUCER_WARP && lane == 0) {
            mbar_expect_tx(q_full, tile_bytes<D>(ROWS));
            for (int c = 0; c < NCH; ++c) tma_load_3d(base + S::Q + chunk_off(ROWS, c), &tm_q, c * CHUNK, q0, bh, q_full);
            for (int it = 0; it < n_tiles; ++it) {
                const int st = it % FWD_STAGES;
                const uint32_t off = st * tile_bytes<D>(TILE);
                if (it >= FWD_STAGES) mbar_wait(&k_empty[st], ((it / FWD_STAGES) + 1) & 1);
                mbar_expect_tx(&k_full[st], tile_bytes<D>(TILE));
                for (int c = 0; c < NCH; ++c)
                    tma_load_3d(base + S::K + off + chunk_off(TILE, c), &tm_k, c * CHUNK, it * TILE, bkv, &k_full[st]);
                if (it >= FWD_STAGES) mbar_wait(&v_empty[st], ((it / FWD_STAGES) + 1) & 1);
                mbar_expect_tx(&v_full[st], tile_bytes<D>(TILE));
                for (int c = 0; c < NCH; ++c)
                    tma_load_3d(base + S::V + off + chunk_off(TILE, c), &tm_v, c * CHUNK, it * TILE, bkv, &v_full[st]);
            }
        }
        return;
    }

    setmaxnreg_inc<CONSUMER_REGS>();
    const int wg = warp >> 2, wl = warp & 3, g = lane >> 2, t = lane & 3;
    const int row_w = q0 + wg * 64 + wl * 16;                 // this warp's first row
    const uint32_t q_s = base + S::Q + wg * 64 * 128;         // this warpgroup's 64 rows in each Q chunk
    float o[NO], s[64];
#pragma unroll
    for (int i = 0; i < NO; ++i) o[i] = 0.f;
    float m_r[2] = {-INFINITY, -INFINITY}, l_r[2] = {0.f, 0.f}; // rows g and g + 8; m in raw score units

    // Per tile: one wait (S of this tile and P V of the last one are done), the softmax, then P V of
    // this tile and S of the next issued back to back, so that the tensor cores have 2 x 512 cycles of
    // work queued while the other warpgroup runs its softmax.
    uint32_t qf[KSTEPS][4];    // this warp's 16 query rows as register A operands (loaded once)
    uint32_t pa[TILE / 16][4]; // P in bf16: the A fragments of the tile's 8 key k-steps (read by P V in flight)
    // The stages' descriptors as the first one plus constant offsets (the start address field, bits
    // 0-13, holds address / 16 and never carries: shared memory is below 256 KB); per MMA the
    // recomputed descriptor cost ~7 issue slots.
    const uint64_t desc_k0 = wgmma_desc_sw128(base + S::K, 16, 1024);
    const uint64_t desc_v0 = wgmma_desc_sw128(base + S::V, chunk_off(TILE, 1), 1024);
    auto issue_s = [&](int it) { issue_qk<D, FWD_STAGES>(s, qf, desc_k0, k_full, it); };
    wgmma_fence_regs(o); // the zeros are in place before any MMA is in flight
    // Q as register A operands: the S MMAs then read only K from shared memory (with both operands
    // there, the two warpgroups' MMAs and the TMA writes would ask more of shared memory than it gives)
    mbar_wait(q_full, 0);
    load_a_frags<D>(qf, q_s, ROWS, wl * 16, lane);
    issue_s(0);
    for (int it = 0;; ++it) {
        const int st = it % FWD_STAGES;
        const uint64_t dv0 = desc_v0 + (uint64_t)(st * (tile_bytes<D>(TILE) >> 4));
        const int k0 = it * TILE;

        wgmma_wait<0>(); // S = Q K^T of this tile (64 rows x 128 keys per warpgroup) and P V of the last
        wgmma_fence_regs(s);
        wgmma_fence_regs(o);
#pragma unroll
        for (int kk = 0; kk < TILE / 16; ++kk) wgmma_fence_regs(pa[kk]);
        __syncwarp();
        if (lane == 0) {
            mbar_arrive(&k_empty[st]);
            if (it > 0) mbar_arrive(&v_empty[(it - 1) % FWD_STAGES]);
        }

        if (k0 + TILE > L || (CAUSAL && k0 + TILE - 1 > row_w)) {
#pragma unroll
            for (int n = 0; n < 16; ++n)
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const int j = k0 + n * 8 + 2 * t + (e & 1), i = row_w + g + (e >> 1) * 8;
                    if (j >= L || (CAUSAL && j > i)) s[4 * n + e] = -INFINITY;
                }
        }

        // online softmax (rows g and g + 8 of the warp; a row's 128 columns are spread over its quad)
        float mx[2] = {m_r[0], m_r[1]};
#pragma unroll
        for (int n = 0; n < 16; ++n) {
            mx[0] = fmaxf(mx[0], fmaxf(s[4 * n], s[4 * n + 1]));
            mx[1] = fmaxf(mx[1], fmaxf(s[4 * n + 2], s[4 * n + 3]));
        }
        float alpha[2], msc[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            mx[r] = warp_max<1, 2>(mx[r]);
            alpha[r] = m_r[r] == -INFINITY ? 0.f : ex2((m_r[r] - mx[r]) * a.scale_log2);
            msc[r] = mx[r] == -INFINITY ? 0.f : mx[r] * a.scale_log2;
            m_r[r] = mx[r];
            l_r[r] *= alpha[r];
        }
#pragma unroll
        for (int n = 0; n < 16; ++n) {
            const float p0 = ex2(fmaf(s[4 * n], a.scale_log2, -msc[0])), p1 = ex2(fmaf(s[4 * n + 1], a.scale_log2, -msc[0]));
            const float p2 = ex2(fmaf(s[4 * n + 2], a.scale_log2, -msc[1])),
                        p3 = ex2(fmaf(s[4 * n + 3], a.scale_log2, -msc[1]));
            l_r[0] += p0 + p1;
            l_r[1] += p2 + p3;
            pa[n >> 1][(n & 1) * 2] = pack_bf16(p0, p1);
            pa[n >> 1][(n & 1) * 2 + 1] = pack_bf16(p2, p3);
        }
#pragma unroll
        for (int n = 0; n < NO / 4; ++n) {
            o[4 * n] *= alpha[0], o[4 * n + 1] *= alpha[0];
            o[4 * n + 2] *= alpha[1], o[4 * n + 3] *= alpha[1];
        }

        // O += P V, then S of the next tile
        mbar_wait(&v_full[st], (it / FWD_STAGES) & 1);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < TILE / 16; ++kk) {
            const uint64_t dv = dv0 + (kk * 16 * 128 >> 4);
            if constexpr (D == 128)
                wgmma_m64n128k16_rs_mn(o, pa[kk], dv, 1);
            else
                wgmma_m64n64k16_rs_mn(o, pa[kk], dv, 1);
        }
        wgmma_commit();
        if (it + 1 == n_tiles) break; // (the back edge always passes an issue of S: nothing keeps a copy
        issue_s(it + 1);              // of s while its MMAs are in flight)
    }
    wgmma_wait<0>();
    wgmma_fence_regs(o);

    // epilogue: LSE, then O through this warpgroup's (now unused) Q rows and one TMA store per chunk
#pragma unroll
    for (int r = 0; r < 2; ++r) l_r[r] = warp_sum<1, 2>(l_r[r]);
    if (t == 0) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int i = row_w + g + 8 * r;
            if (i < L) a.lse[(int64_t)bh * L + i] = m_r[r] * a.scale + logf(l_r[r]);
        }
    }
    const float inv[2] = {1.f / l_r[0], 1.f / l_r[1]}; // l > 0: key 0 is visible to every row
    const int r0 = wl * 16 + g;
#pragma unroll
    for (int n = 0; n < NO / 4; ++n) {
        const uint32_t at = q_s + chunk_off(ROWS, n >> 3) + (((n & 7) ^ (r0 & 7)) << 4) + 4 * t; // (r0 + 8) & 7 == r0 & 7
        sts32(at + r0 * 128, pack_bf16(o[4 * n] * inv[0], o[4 * n + 1] * inv[0]));
        sts32(at + (r0 + 8) * 128, pack_bf16(o[4 * n + 2] * inv[1], o[4 * n + 3] * inv[1]));
    }
    fence_proxy_async_smem();
    named_barrier(1 + wg, WG_THREADS);
    if (wl == 0 && lane == 0) {
        for (int c = 0; c < NCH; ++c) tma_store_3d(&tm_o, q_s + chunk_off(ROWS, c), c * CHUNK, q0 + wg * 64, bh);
        tma_store_wait_read();
    }
#endif
}

// p[4 n + e] += p[4 (n + HALF) + e] for n < HALF: one level of the column sums' tree over 8-column tiles.
template <int HALF> __device__ __forceinline__ void fold_tiles(float (&p)[64])
{
#pragma unroll
    for (int n = 0; n < HALF; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) p[4 * n + e] += p[4 * (n + HALF) + e];
}

// ---- pass 2: column sums ---------------------------------------------------------------------------

template <int D, bool CAUSAL>
__global__ void __launch_bounds__(COL_THREADS, 1)
    colsum_wgmma_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k, const ColArgs a)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using S = ColSmem<D>;
    constexpr int KSTEPS = D / 16, NCH = D / CHUNK, STAGES = COL_STAGES;
    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = aligned_smem(smem_raw);
    const uint32_t base = smem_u32(smem);
    float *lse_s = reinterpret_cast<float *>(smem + S::LSE);       // [stage][TILE] log2-scaled
    float *lse_raw = reinterpret_cast<float *>(smem + S::LSE_RAW); // [slot][TILE] as fetched
    uint64_t *bar = reinterpret_cast<uint64_t *>(smem + S::BAR);
    uint64_t *k_full = bar, *q_full = bar + 1, *q_empty = q_full + STAGES;

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int L = a.L, G = a.G, w0 = a.w0;
    int bkv, kt;
    block_tile(a.ord, bkv, kt);
    const int k0 = kt * COL_ROWS;
    const int qbeg = (max(w0, CAUSAL ? k0 : 0) / TILE) * TILE;
    const int nq = (L - qbeg + TILE - 1) / TILE, total = G * nq; // (head, query tile) steps

    if (tid == 0) {
        mbar_init(k_full, 1);
        for (int s = 0; s < STAGES; ++s) mbar_init(&q_full[s], 1 + 32), mbar_init(&q_empty[s], 32 * 4 * COL_WARPGROUPS);
        mbar_init_fence();
    }
    __syncthreads();

    // Where step `it` is, kept by increments (no division per step: the step's issue slots are the
    // pass's bound): its stage and the stage's phase, its head h and query tile qi.
    struct Pos {
        int it, st, phase, h, qi;
        __device__ void next(int nq)
        {
            ++it;
            if (++st == STAGES) st = 0, phase ^= 1;
            if (++qi == nq) qi = 0, ++h;
        }
    };

    if (warp >= COL_PRODUCER_WARP) { // lane 0 issues the TMA loads; every lane stages 4 rows' LSE and arrives
        setmaxnreg_dec<COL_PRODUCER_REGS>();
        if (warp > COL_PRODUCER_WARP) return;
        if (lane == 0) {
            mbar_expect_tx(k_full, tile_bytes<D>(COL_ROWS));
            for (int c = 0; c < NCH; ++c) tma_load_3d(base + S::K + chunk_off(COL_ROWS, c), &tm_k, c * CHUNK, k0, bkv, k_full);
        }
        // The LSE of step `it` (rows q0 + 4 lane .. + 3 of head h) is fetched by cp.async three steps
        // ahead into a staging slot, so that no global-load latency sits on the per-step path (a
        // synchronous load there took longer than the step's MMAs and exps).
        auto fetch_lse = [&](const Pos &f) {
            if (f.it < total) {
                const int q0 = qbeg + f.qi * TILE, bh = bkv * G + f.h;
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    const int q = q0 + 4 * lane + j;
                    const bool ok = q >= w0 && q < L;
                    cp_async_zfill<4>(lse_raw + (f.it % LSE_SLOTS) * TILE + 4 * lane + j,
                                      ok ? a.lse + (int64_t)bh * a.lse_len + (q - a.lse_row0) : a.lse, ok);
                }
            }
            cp_async_commit(); // one group per step, empty past the end
        };
        Pos fp = {0, 0, 0, 0, 0}, ps = fp; // the next step to fetch the LSE of, and the step staged
        for (int k = 0; k < LSE_SLOTS - 1; ++k, fp.next(nq)) fetch_lse(fp);
        for (; ps.it < total; ps.next(nq)) {
            const int it = ps.it, st = ps.st, q0 = qbeg + ps.qi * TILE, bh = bkv * G + ps.h;
            fetch_lse(fp);
            fp.next(nq);
            cp_async_wait<LSE_SLOTS - 1>(); // step it's group (this lane's own four values) has landed
            const float4 raw = *reinterpret_cast<const float4 *>(lse_raw + (it % LSE_SLOTS) * TILE + 4 * lane);
            float l4[4] = {raw.x, raw.y, raw.z, raw.w}; // log2-scaled, +inf where a row does not contribute
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const int q = q0 + 4 * lane + j;
                l4[j] = q >= w0 && q < L ? l4[j] * LOG2E : INFINITY;
            }
            if (it >= STAGES) mbar_wait(&q_empty[st], ps.phase ^ 1); // the consumers' release of the stage's last use
            if (lane == 0) {
                mbar_expect_tx(&q_full[st], tile_bytes<D>(TILE));
                for (int c = 0; c < NCH; ++c)
                    tma_load_3d(base + S::Q + st * tile_bytes<D>(TILE) + chunk_off(TILE, c), &tm_q, c * CHUNK, q0, bh,
                                &q_full[st]);
            }
            *reinterpret_cast<float4 *>(lse_s + st * TILE + 4 * lane) = make_float4(l4[0], l4[1], l4[2], l4[3]);
            mbar_arrive(&q_full[st]);
        }
        return;
    }

    setmaxnreg_inc<COL_CONSUMER_REGS>();
    const int wg = warp >> 2, wl = warp & 3, g = lane >> 2, t = lane & 3;
    const int wk0 = k0 + wg * 64 + wl * 16;            // this warp's first key
    const uint32_t k_s = base + S::K + wg * 64 * 128; // this warpgroup's 64 keys in each K chunk
    float acc[2] = {0.f, 0.f}, kvacc[2] = {0.f, 0.f};
    float s[64];                                             // S^T of the step: 64 keys x 128 queries per warpgroup
    const uint64_t desc_k0 = wgmma_desc_sw128(k_s, 16, 1024); // this warpgroup's keys, the MMAs' A operand

    // The stage's descriptors as the first one plus constant offsets (the start address field, bits
    // 0-13, holds address / 16 and never carries: shared memory is below 256 KB).
    const uint64_t desc_q0 = wgmma_desc_sw128(base + S::Q, 16, 1024);
    auto issue = [&](float(&sd)[64], const Pos &ps) {
        const uint64_t d = desc_q0 + (uint64_t)(ps.st * (tile_bytes<D>(TILE) >> 4));
        mbar_wait(&q_full[ps.st], ps.phase);
        turn_wait(wg);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < KSTEPS; ++kk) {
            const uint64_t koff = (chunk_off(TILE, kk >> 2) + (kk & 3) * 32) >> 4; // k-step kk of a Q tile
            wgmma_ss(sd, desc_k0 + ((chunk_off(COL_ROWS, kk >> 2) + (kk & 3) * 32) >> 4), d + koff, kk);
        }
        wgmma_commit();
        if (!(wg == COL_WARPGROUPS - 1 && ps.it == total - 1)) turn_pass(wg);
    };
    // Step ps.it once its S^T = K Q^T in `sc` is done: add its probabilities into the keys' sums.
    auto consume = [&](float(&sc)[64], const Pos &ps) {
        const int st = ps.st, h = ps.h, q0 = qbeg + ps.qi * TILE;
        wgmma_fence_regs(sc);
        float2 l2[16]; // the log2 LSE of this thread's query columns 8 n + 2 t, + 1
#pragma unroll
        for (int n = 0; n < 16; ++n) l2[n] = *reinterpret_cast<const float2 *>(lse_s + st * TILE + 8 * n + 2 * t);
        mbar_arrive(&q_empty[st]); // every lane: its own LSE reads are ordered before the producer's next stores

        // All 64 exps first (independent: the MUFU queue stays full), then a tree sum per key row.
        const bool mask = CAUSAL && q0 < wk0 + 15; // some query of the tile precedes some key of the warp
        float p[64];
#pragma unroll
        for (int i = 0; i < 64; ++i) p[i] = ex2(fmaf(sc[i], a.scale_log2, -((i & 1) ? l2[i >> 2].y : l2[i >> 2].x)));
        if (mask) { // (a separate pass: the unmasked steps, nearly all of them, carry no compare per element)
#pragma unroll
            for (int i = 0; i < 64; ++i)
                if (q0 + 8 * (i >> 2) + 2 * t + (i & 1) < wk0 + g + 8 * ((i >> 1) & 1)) p[i] = 0.f;
        }
        fold_tiles<8>(p); // column tile n + 8 onto n, then + 4, + 2, + 1 (element e keeps its row)
        fold_tiles<4>(p);
        fold_tiles<2>(p);
        fold_tiles<1>(p);
        acc[0] += p[0] + p[1]; // row g: e = 0, 1; row g + 8: e = 2, 3
        acc[1] += p[2] + p[3];

        if (ps.qi == nq - 1) { // head h done: reduce over the quad sharing each key, write once
            const int64_t bh = (int64_t)bkv * G + h;
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const float v = warp_sum<1, 2>(acc[r]);
                const int key = wk0 + g + 8 * r;
                if (t == 0 && key < L) a.colsum[bh * L + key] = v;
                kvacc[r] += v;
                acc[r] = 0.f;
            }
        }
    };

    // Per step: issue, wait, consume. The overlap of one warpgroup's exps with MMAs comes from the
    // other warpgroups' turns, not from a second S^T register set (112 registers leave no room for one).
    mbar_wait(k_full, 0);
    if (wg == COL_WARPGROUPS - 1 && total > 0) turn_pass(wg);
    Pos cp = {0, 0, 0, 0, 0}; // the step to consume
    for (; cp.it < total; cp.next(nq)) {
        issue(s, cp);
        wgmma_wait<0>();
        consume(s, cp);
    }
    if (a.colsum_kv && t == 0) {
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            const int key = wk0 + g + 8 * r;
            if (key < L) a.colsum_kv[(int64_t)bkv * L + key] = kvacc[r];
        }
    }
#endif
}

// ---- pass 2, packed window: column sums of few rows ------------------------------------------------
// With need_out=0 and the G heads' window rows fitting one 128-query tile (pack_rows = L - w0 rows a
// head, a multiple of 8: SnapKV++'s 32 rows at G = 4), a KV head's whole query side is one tile, the
// same for every key block. The roles of the pass above turn: the tile (head h's rows at tile rows
// h * pack_rows.., one TMA box of pack_rows rows each at a 1024-byte offset, so the 128-byte swizzle
// is the full tile's) and its log2 LSE are loaded once, into the K block's place, and the CTA streams
// its run of key blocks through two stages in the Q stages' place. One step is one key block: S^T =
// K Q^T, p = exp2(...), each head's per-key sum over its own columns, written by the one CTA that owns
// the key. A CTA per key block (one step each) could not overlap a block's load with the sums of the
// one before (NOTES.md, Tried).
constexpr int PACK_STAGES = 2; // key blocks in flight: two of 256 keys in the four Q stages' bytes

template <int D, bool CAUSAL>
__global__ void __launch_bounds__(COL_THREADS, 1)
    colsum_packed_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k, const ColArgs a)
{
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    using S = ColSmem<D>;
    static_assert(PACK_STAGES * tile_bytes<D>(COL_ROWS) <= COL_STAGES * tile_bytes<D>(TILE), "key stages in the Q stages' bytes");
    static_assert(tile_bytes<D>(TILE) <= tile_bytes<D>(COL_ROWS), "the packed tile in the K block's bytes");
    constexpr int KSTEPS = D / 16, NCH = D / CHUNK;
    constexpr uint32_t KBLOCK = tile_bytes<D>(COL_ROWS);
    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = aligned_smem(smem_raw);
    const uint32_t base = smem_u32(smem), tile_s = base + S::K, kst_s = base + S::Q; // the packed tile, the key stages
    float *lse_s = reinterpret_cast<float *>(smem + S::LSE); // [TILE] log2-scaled, +inf past the heads' rows
    uint64_t *bar = reinterpret_cast<uint64_t *>(smem + S::BAR);
    uint64_t *q_full = bar, *k_full = bar + 1, *k_empty = k_full + PACK_STAGES;

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int L = a.L, G = a.G, w0 = a.w0, PR = a.pack_rows, n_cols = G * PR;
    const int per_head = (a.kblocks + a.kblocks_per_cta - 1) / a.kblocks_per_cta; // CTAs of a KV head
    const int bkv = blockIdx.x / per_head, kb0 = (blockIdx.x - bkv * per_head) * a.kblocks_per_cta;
    const int total = min(a.kblocks_per_cta, a.kblocks - kb0); // key blocks kb0 .. kb0 + total - 1

    if (tid == 0) {
        mbar_init(q_full, 1 + 32);
        for (int s = 0; s < PACK_STAGES; ++s) mbar_init(&k_full[s], 1), mbar_init(&k_empty[s], 32 * 4 * COL_WARPGROUPS);
        mbar_init_fence();
    }
    __syncthreads();

    if (warp >= COL_PRODUCER_WARP) { // lane 0 issues the TMA loads; every lane stages 4 columns' LSE once
        setmaxnreg_dec<COL_PRODUCER_REGS>();
        if (warp > COL_PRODUCER_WARP) return;
        if (lane == 0) {
            mbar_expect_tx(q_full, tile_bytes<D>(n_cols));
            for (int c = 0; c < NCH; ++c)
                for (int h = 0; h < G; ++h) tma_load_3d(tile_s + chunk_off(TILE, c) + h * PR * 128, &tm_q, c * CHUNK, w0, bkv * G + h, q_full);
        }
        float l4[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) { // column col is row w0 + col % PR of head col / PR
            const int col = 4 * lane + j, hc = col / PR;
            l4[j] = col < n_cols ? a.lse[(int64_t)(bkv * G + hc) * a.lse_len + (w0 + col - hc * PR - a.lse_row0)] * LOG2E : INFINITY;
        }
        *reinterpret_cast<float4 *>(lse_s + 4 * lane) = make_float4(l4[0], l4[1], l4[2], l4[3]);
        mbar_arrive(q_full);
        if (lane != 0) return;
        for (int it = 0, st = 0, ph = 0; it < total; ++it) {
            if (it >= PACK_STAGES) mbar_wait(&k_empty[st], ph ^ 1); // the consumers' release of the stage's last use
            mbar_expect_tx(&k_full[st], KBLOCK);
            for (int c = 0; c < NCH; ++c)
                tma_load_3d(kst_s + st * KBLOCK + chunk_off(COL_ROWS, c), &tm_k, c * CHUNK, (kb0 + it) * COL_ROWS, bkv, &k_full[st]);
            if (++st == PACK_STAGES) st = 0, ph ^= 1;
        }
        return;
    }

    setmaxnreg_inc<COL_CONSUMER_REGS>();
    const int wg = warp >> 2, wl = warp & 3, g = lane >> 2, t = lane & 3;
    float s[64]; // S^T of the step: 64 keys x 128 queries per warpgroup
    const uint64_t desc_k0 = wgmma_desc_sw128(kst_s + wg * 64 * 128, 16, 1024); // this warpgroup's keys in stage 0
    const uint64_t desc_q = wgmma_desc_sw128(tile_s, 16, 1024);
    mbar_wait(q_full, 0);
    if (wg == COL_WARPGROUPS - 1 && total > 0) turn_pass(wg);
    for (int it = 0, st = 0, ph = 0; it < total; ++it) {
        mbar_wait(&k_full[st], ph);
        turn_wait(wg);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < KSTEPS; ++kk)
            wgmma_ss(s, desc_k0 + ((st * KBLOCK + chunk_off(COL_ROWS, kk >> 2) + (kk & 3) * 32) >> 4),
                     desc_q + ((chunk_off(TILE, kk >> 2) + (kk & 3) * 32) >> 4), kk);
        wgmma_commit();
        if (!(wg == COL_WARPGROUPS - 1 && it == total - 1)) turn_pass(wg);
        wgmma_wait<0>();
        wgmma_fence_regs(s);
        mbar_arrive(&k_empty[st]); // every lane: its MMAs that read the stage are complete

        const int wk0 = (kb0 + it) * COL_ROWS + wg * 64 + wl * 16; // this warp's first key
        float2 l2[16]; // the log2 LSE of this thread's query columns 8 n + 2 t, + 1
#pragma unroll
        for (int n = 0; n < 16; ++n) l2[n] = *reinterpret_cast<const float2 *>(lse_s + 8 * n + 2 * t);
        float p[64];
#pragma unroll
        for (int i = 0; i < 64; ++i) p[i] = ex2(fmaf(s[i], a.scale_log2, -((i & 1) ? l2[i >> 2].y : l2[i >> 2].x)));
        if (n_cols < TILE || (CAUSAL && w0 < wk0 + 15)) { // a column's position is w0 + its row in its head;
#pragma unroll                                            // columns past the heads' rows hold no query
            for (int i = 0; i < 64; ++i) {
                const int col = 8 * (i >> 2) + 2 * t + (i & 1);
                if (col >= n_cols || (CAUSAL && w0 + col % PR < wk0 + g + 8 * ((i >> 1) & 1))) p[i] = 0.f;
            }
        }
        // each head's columns: its PR / 8 column tiles, summed per key in a fixed order
        const int tiles_h = PR / 8;
        float kvsum[2] = {0.f, 0.f};
        for (int hh = 0; hh < G; ++hh) {
            float s0 = 0.f, s1 = 0.f;
#pragma unroll
            for (int n = 0; n < 16; ++n)
                if (n >= hh * tiles_h && n < (hh + 1) * tiles_h) s0 += p[4 * n] + p[4 * n + 1], s1 += p[4 * n + 2] + p[4 * n + 3];
            const float v[2] = {warp_sum<1, 2>(s0), warp_sum<1, 2>(s1)};
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int key = wk0 + g + 8 * r;
                if (t == 0 && key < L) a.colsum[((int64_t)bkv * G + hh) * L + key] = v[r];
                kvsum[r] += v[r];
            }
        }
        if (a.colsum_kv && t == 0) {
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const int key = wk0 + g + 8 * r;
                if (key < L) a.colsum_kv[(int64_t)bkv * L + key] = kvsum[r];
            }
        }
        if (++st == PACK_STAGES) st = 0, ph ^= 1;
    }
#endif
}

// ---- host side -------------------------------------------------------------------------------------

// The CTA order (Order) of `heads` CTAs' heads in groups of `group` (a KV head's query heads), each
// group streaming `group_bytes` (K and V for the forward, Q and the LSE for the column sums): a section
// holds as many groups as a third of the L2 holds, at least one (every head in one section when the
// device does not report its L2). Refused when the 1-D grid would exceed what a launch takes.
int make_order(Order *o, const char *who, int64_t heads, int group, int tiles, double group_bytes)
{
    if (heads * tiles > 0x7fffffff)
        return kvb_fail(KVB_EINVAL, "%s: heads x tiles = %lld x %d out of range [1, 2^31 - 1] (CTAs of one launch)", who,
                        (long long)heads, tiles);
    int64_t groups = heads / group;
    int dev = 0, l2 = 0;
    if (cudaGetDevice(&dev) == cudaSuccess && cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev) == cudaSuccess && l2 > 0) {
        groups = (int64_t)(l2 / 3.0 / group_bytes);
        if (groups < 1) groups = 1;
    }
    if (groups * group > heads) groups = heads / group;
    o->heads = (int)heads, o->tiles = tiles, o->hsec = (int)(groups * group);
    return KVB_OK;
}


template <int D, bool CAUSAL> int launch_fwd(const CUtensorMap *m, const FwdArgs &a, dim3 grid, cudaStream_t s)
{
    static unsigned long long optin = 0; // the devices where the attribute is set (kvb_cuda.h)
    int rc = kvb_smem_optin((const void *)fwd_wgmma_kernel<D, CAUSAL>, FwdSmem<D>::BYTES, &optin);
    if (rc) return rc;
    fwd_wgmma_kernel<D, CAUSAL><<<grid, THREADS, FwdSmem<D>::BYTES, s>>>(m[0], m[1], m[2], m[3], a);
    CUDA_TRY(cudaGetLastError());
    return KVB_OK;
}

// The column sums' kernel for a.pack_rows (colsum_packed_kernel) or the G x tiles loop (colsum_wgmma_kernel);
// each kernel's shared-memory attribute set once per device (kvb_cuda.h).
template <int D, bool CAUSAL> int launch_col(const CUtensorMap *m, const ColArgs &a, dim3 grid, cudaStream_t s)
{
    static unsigned long long optin_tiles = 0, optin_packed = 0;
    auto *kernel = a.pack_rows ? colsum_packed_kernel<D, CAUSAL> : colsum_wgmma_kernel<D, CAUSAL>;
    int rc = kvb_smem_optin((const void *)kernel, ColSmem<D>::BYTES, a.pack_rows ? &optin_packed : &optin_tiles);
    if (rc) return rc;
    kernel<<<grid, COL_THREADS, ColSmem<D>::BYTES, s>>>(m[0], m[1], a);
    CUDA_TRY(cudaGetLastError());
    return KVB_OK;
}

} // namespace

extern "C" int selective_attn_wgmma_supported(void)
{
    static int cached[64];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 0;
    if (!cached[dev]) {
        int major = 0, minor = 0;
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
        cached[dev] = major == 9 && minor == 0 && encode_fn() ? 1 : 2; // sm_90a code runs on 9.0 only
    }
    return cached[dev] == 1;
}

extern "C" int selective_attn_fwd_wgmma(const kvb_bf16 *Q, const kvb_bf16 *K, const kvb_bf16 *V, const sattn_params *p,
                                        kvb_bf16 *O, float *LSE, cudaStream_t stream)
{
    int rc = sattn_check(p, "selective_attn_fwd_wgmma");
    if (rc) return rc;
    if (!p->need_out)
        return kvb_fail(KVB_EINVAL, "selective_attn_fwd_wgmma: need_out=0 out of range [1, 1] (rows from w0 on only: the "
                                    "mma.sync forward, which splits the keys)");
    if (!Q || !K || !V || !O || !LSE) return kvb_fail(KVB_EINVAL, "selective_attn_fwd_wgmma: NULL pointer among Q, K, V, O, LSE");
    const char *who = "selective_attn_fwd_wgmma";
    if ((rc = kvb_check_aligned16(who, "Q", Q)) || (rc = kvb_check_aligned16(who, "K", K)) || (rc = kvb_check_aligned16(who, "V", V)) ||
        (rc = kvb_check_aligned16(who, "O", O)))
        return rc;
    if (!selective_attn_wgmma_supported())
        return kvb_fail(KVB_EDEVICE, "selective_attn_fwd_wgmma: needs a compute capability 9.0 device (sm_90a code)");
    const int64_t BH = (int64_t)p->B * p->Hq, n_kv = (int64_t)p->B * p->Hkv;
    CUtensorMap m[4];
    if ((rc = make_map(&m[0], Q, p->D, p->L, BH, ROWS)) || (rc = make_map(&m[1], K, p->D, p->L, n_kv, TILE)) ||
        (rc = make_map(&m[2], V, p->D, p->L, n_kv, TILE)) || (rc = make_map(&m[3], O, p->D, p->L, BH, 64)))
        return rc;
    FwdArgs a;
    a.lse = LSE, a.L = p->L, a.G = sattn_groups(p), a.n_qtiles = (p->L + ROWS - 1) / ROWS;
    a.scale = 1.f / sqrtf((float)p->D), a.scale_log2 = a.scale * LOG2E;
    if ((rc = make_order(&a.ord, who, BH, a.G, a.n_qtiles, 4.0 * p->L * p->D))) return rc; // K and V of a KV head
    const dim3 grid((unsigned)(BH * a.n_qtiles));
    if (p->D == 64) return p->causal ? launch_fwd<64, true>(m, a, grid, stream) : launch_fwd<64, false>(m, a, grid, stream);
    return p->causal ? launch_fwd<128, true>(m, a, grid, stream) : launch_fwd<128, false>(m, a, grid, stream);
}

extern "C" int selective_attn_colsum_wgmma(const kvb_bf16 *Q, const kvb_bf16 *K, const float *LSE, const sattn_params *p,
                                           float *colsum, float *colsum_kv, cudaStream_t stream)
{
    int rc = sattn_check(p, "selective_attn_colsum_wgmma");
    if (rc) return rc;
    if (!Q || !K || !LSE || !colsum || (p->group_sum && !colsum_kv))
        return kvb_fail(KVB_EINVAL, "selective_attn_colsum_wgmma: NULL pointer among Q, K, LSE, colsum, colsum_kv");
    if ((rc = kvb_check_aligned16("selective_attn_colsum_wgmma", "Q", Q)) || (rc = kvb_check_aligned16("selective_attn_colsum_wgmma", "K", K)))
        return rc;
    if (!selective_attn_wgmma_supported())
        return kvb_fail(KVB_EDEVICE, "selective_attn_colsum_wgmma: needs a compute capability 9.0 device (sm_90a code)");
    const int64_t BH = (int64_t)p->B * p->Hq, n_kv = (int64_t)p->B * p->Hkv;
    // The packed tile (as the mma.sync forward's, selective_attn.cu): need_out=0 and the G heads' rows from
    // w0 fit one 128-query tile, each head's a multiple of 8 rows (its TMA box at a 1024-byte offset)
    const int G = sattn_groups(p), rows = p->L - p->w0;
    const int pack = !p->need_out && (int64_t)G * rows <= TILE && rows % 8 == 0 ? rows : 0;
    CUtensorMap m[2];
    if ((rc = make_map(&m[0], Q, p->D, p->L, BH, pack ? pack : TILE)) || (rc = make_map(&m[1], K, p->D, p->L, n_kv, COL_ROWS)))
        return rc;
    ColArgs a;
    a.lse = LSE, a.colsum = colsum, a.colsum_kv = p->group_sum ? colsum_kv : nullptr;
    a.L = p->L, a.G = G, a.w0 = p->w0;
    a.lse_len = sattn_lse_len(p), a.lse_row0 = sattn_lse_row0(p);
    a.scale_log2 = LOG2E / sqrtf((float)p->D);
    const int kblocks = (p->L + COL_ROWS - 1) / COL_ROWS;
    if ((rc = make_order(&a.ord, "selective_attn_colsum_wgmma", n_kv, 1, kblocks, (2.0 * p->D + 4) * a.G * p->L))) // Q, LSE
        return rc;
    if (pack) {
        // A run of a KV head's key blocks a CTA, about one CTA an SM, each streaming its keys through its
        // stages. The sums do not depend on the split: each key's are computed by the one CTA that owns it.
        int dev = 0, sms = 0;
        CUDA_TRY(cudaGetDevice(&dev));
        CUDA_TRY(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
        const int64_t per = (n_kv * kblocks + sms - 1) / sms;
        a.pack_rows = pack, a.kblocks = kblocks, a.kblocks_per_cta = (int)(per < kblocks ? per : kblocks);
    } else {
        a.pack_rows = 0, a.kblocks = kblocks, a.kblocks_per_cta = 1;
    }
    const dim3 grid((unsigned)(n_kv * ((kblocks + a.kblocks_per_cta - 1) / a.kblocks_per_cta))); // <= n_kv kblocks
    if (p->D == 64) return p->causal ? launch_col<64, true>(m, a, grid, stream) : launch_col<64, false>(m, a, grid, stream);
    return p->causal ? launch_col<128, true>(m, a, grid, stream) : launch_col<128, false>(m, a, grid, stream);
}
