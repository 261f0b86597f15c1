// int2_decode.cu: int2_decode_attn (v3), the production fused decode step, over the kernel-native layout
// (reference/int2.h: int2_native) with warp-owned bulk-copy pipelines. Design and budget:
// kernels/int2/NOTES.md.
//
// Per 64-token warp step of one KV head (D=128, gs=16, G=4): 8 KB of records (key codes 2 KB, value
// codes 2 KB, key scales/zeros 2 KB, value scales/zeros 2 KB). The codes are stored in fragment order:
// per key k-step one LDS.64, 2 SHF and 16 LOP3 (one AND per A register: the 2-bit code at bits 2(2i + h)
// of each half, or of the word shifted right by 8 where that position is above 8, an exact fp16
// subnormal; see code_reg), per value k-step one LDS.128, 4 SHF and 32 LOP3; metadata group-major (no
// transposition pass). A step is two contiguous runs (its Rec run: codes and value metadata; its
// key-metadata rows, shared by two steps at gs=128), so two bulk copies per step. With G <= 4 the hi and
// lo halves of q s_g share one MMA as the two halves of its 8 columns (PAIR): 76 MMAs per step.
//
// Structure: one block of NW = 12 warps per SM; each warp owns a ring of S step records in shared memory
// and its own mbarriers; its lane 0 claims the segment's next step from a shared counter and bulk-copies
// (cp.async.bulk, complete_tx on the slot's mbarrier) its two runs S - 1 steps ahead. No block barrier
// inside the token loop. The stream-K line of each head is its residual (bf16) steps, each weighing
// RESIDUAL_WEIGHT units, then its 64-token steps; the grid is a multiple of the heads (one segment per
// block); where that gives a head 2 to 8 blocks they form a cluster and merge through distributed shared
// memory (cluster_merge), else through global partials and an arrival counter (finish_head).
#include <cooperative_groups.h>

#include "kernels/int2/int2_step.cuh"

// KVB_INT2_TRACE=1 (`make KVB_TRACE=1`, a build of its own): the kernel's per-block trace (TRACE below).
// Production builds leave it 0 and carry no trace code.
#ifndef KVB_INT2_TRACE
#define KVB_INT2_TRACE 0
#endif

namespace {
namespace v3 {

struct Params {
    AttnParams a; // q, the residual (a.c.Kr, a.c.Vr), shapes, the stream-K line, the merge workspace
    NativePtrs n;
    int cluster;     // > 1: launched as clusters of this many blocks, one cluster per head (cluster_merge)
    int q_warp0;     // 1 (q 16-byte aligned): warp 0 takes q with one bulk copy and makes the fragments alone
                     // (q_rows_*); 0: the block stages q, then warp 0 stores the fragments
    int slots_apart; // 1 (clusters): the merger's partial slots lie past the rings (dynamic shared memory from
                     // smem_bytes() on), where the device's opt-in shared memory takes them; 0: over the rings
};

// The weight of a residual (16-token bf16) step in the stream-K split, in units of 64-token steps: its
// loads are not pipelined, so one costs a block several steps' time, and the block holding a head's
// residual steps gets fewer 64-token steps. At most 4: a segment spans 4 units or more (grid <= N / 8
// rounded up, or the head-aligned grid with 8 or more per block), so one inside a head's residual part
// starts a residual step and no segment is empty.
constexpr int RESIDUAL_WEIGHT = 4;

// Where the two runs (Rec, Km) of step `step` of head `head` lie.
template <int D, int GS>
struct RecSrc {
    const uint32_t *rec;
    const __half *km;
    __device__ __forceinline__ RecSrc(const NativePtrs &n, int64_t head, int64_t step, int64_t Tcap)
        : rec(n.Rec + (head * (Tcap / 64) + step) * (Rec<D, GS>::REC / 4)),
          km(n.Km + (head * (Tcap / GS) + (step * 64) / GS) * (2 * D))
    {
    }
};

// Lane 0: the record at `src` into the ring slot at shared address `dst`, completing on the mbarrier at
// shared address `bar`. The fence orders this warp's earlier generic accesses to the slot (its reads,
// the tail zeroing) before the copy. (tr: the trace's clock after the expected bytes.)
template <int D, int GS>
__device__ __forceinline__ void issue_step(uint32_t dst, uint32_t bar, const RecSrc<D, GS> &src, long long *tr = nullptr)
{
    using R = Rec<D, GS>;
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    mbar_expect_tx(bar, R::BYTES);
    if (tr) *tr = clock64(); // (the trace)
    bulk_copy(dst, src.rec, R::REC, bar);
    bulk_copy(dst + R::KM, src.km, R::KMB, bar);
}

// Warp 0's q (P.q_warp0): lane 0 requests the G rows of the KV head (contiguous, G D bf16) with one bulk
// copy into qraw_s, completing on `bar`, before the block's first barrier, so that q's latency runs
// alongside the prologue's and ahead of the records' queue (no registers held: a load into registers
// was spilled, and the spill waited for q).
__device__ __forceinline__ void q_rows_issue(__nv_bfloat16 *qraw_s, const __nv_bfloat16 *qh, unsigned bytes, uint64_t *bar)
{
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); // warp 0's earlier reads of qraw_s first
    mbar_expect_tx(bar, bytes);
    bulk_copy(qraw_s, qh, bytes, bar);
}

// From warp 0's q (qraw_s, landed): what stage_q (top = 1) and q_frags_store(_pair) write, bit for bit:
// q's rows in fp32 (q_s, for the residual steps), the powers of two f_s and u_s, the fp16 fragments qf_s
// (and qm_s, PAIR). Lane (g, t) takes head h = g & 3 (PAIR) or g at channels 16j + 4t .. + 3, j < D / 16
// (zeros past G). One warp, and no block barrier between q's arrival and the fragments.
template <int D>
__device__ __forceinline__ void q_rows_finish(const __nv_bfloat16 *qraw_s, float *q_s, float *f_s, float *u_s, uint2 *qf_s,
                                              uint2 *qm_s, int G, bool pair, int lane)
{
    const int g = lane >> 2, t = lane & 3, h = pair ? g & 3 : g;
    uint2 qr[D / 16];
#pragma unroll
    for (int j = 0; j < D / 16; j++)
        qr[j] = h < G ? *reinterpret_cast<const uint2 *>(qraw_s + h * D + 16 * j + 4 * t) : make_uint2(0u, 0u);
    float mx = 0.f;
#pragma unroll
    for (int j = 0; j < D / 16; j++)
        mx = fmaxf(fmaxf(mx, fmaxf(fabsf(bf16_lo(qr[j].x)), fabsf(bf16_hi(qr[j].x)))),
                   fmaxf(fabsf(bf16_lo(qr[j].y)), fabsf(bf16_hi(qr[j].y))));
    mx = warp_max<1, 2>(mx); // the 4 lanes t of a row hold its D channels
    const int e = q_scale_exp(mx, 1);  // stage_q's scale at top = 1
    const bool own = h < G && h == g; // the lanes that write head h's row (PAIR: rows g < 4)
    if (own && t == 0) f_s[h] = ldexpf(1.f, e), u_s[h] = ldexpf(1.f, -e);
    const float f = h < G ? ldexpf(1.f, e) : 0.f, fm = pair && g >= 4 ? -f : 0.f;
#pragma unroll
    for (int j = 0; j < D / 16; j++) {
        const float r0 = bf16_lo(qr[j].x), r1 = bf16_hi(qr[j].x), r2 = bf16_lo(qr[j].y), r3 = bf16_hi(qr[j].y);
        if (own) *reinterpret_cast<float4 *>(q_s + h * D + 16 * j + 4 * t) = make_float4(r0, r1, r2, r3);
        qf_s[32 * j + lane] = make_uint2(pack_f16(r0 * f, r1 * f), pack_f16(r2 * f, r3 * f));
        if (pair) qm_s[32 * j + lane] = make_uint2(pack_f16(r0 * fm, r1 * fm), pack_f16(r2 * fm, r3 * fm));
    }
}

// One 64-token step of the fused decode: scores, the online softmax, values.
template <int D, int GS, bool PAIR>
__device__ __forceinline__ void step(State<D / 16> &st, const unsigned char *rec, const uint2 *qf_s, const uint2 *qm_s,
                                     const float (&uf)[2], int lane, int64_t tok, int64_t T)
{
    float s[4][4];
    step_scores<D, GS, PAIR>(s, rec, qf_s, qm_s, uf, lane, tok, T);
    uint32_t pb[4][2];
    v2::softmax<4, D / 16, true, false>(st, s, pb);
    step_values<D, GS>(st.o, st.z, rec, pb, lane);
}

// The NW warps of the block take the residual steps s0, s0 + 1, ... in turn.
template <int D, int NW>
__device__ __noinline__ State<D / 16> residual_steps(const float *q_s, int G, const __nv_bfloat16 *Kr,
                                                     const __nv_bfloat16 *Vr, int64_t s0, int64_t r_end, int R,
                                                     float scale, int warp, int lane)
{
    State<D / 16> st;
    st.init();
    uint32_t qb[D / 16][2];
    q_frags_bf16<D>(qb, q_s, G, lane);
    for (int64_t s = s0 + warp; s < r_end; s += NW) {
        v2::Dense<D> r;
        const int nv = (int)min((int64_t)16, R - s * 16);
        v2::dense_load_v2<D>(r, Kr, Vr, s * 16, nv, lane);
        // v2's residual step with v3's row units: V rows of m-tile mv scaled by 2^(code_sh(4(mv % 4)) - 24)
        // and 2^(code_sh(4(mv % 4) + 2) - 24)
        v2::dense_step<D>(st, qb, r, nv, scale, lane, [](int mv, __nv_bfloat162 &f0, __nv_bfloat162 &f1) {
            f0 = __float2bfloat162_rn(exp2f((float)(code_sh(4 * (mv % 4)) - 24)));
            f1 = __float2bfloat162_rn(exp2f((float)(code_sh(4 * (mv % 4) + 2) - 24)));
        });
    }
    return st;
}

// Every warp deposits its state: O^T rows back to channels and true units, plus Z (as v2, v3's units).
template <int D, int GS, int NW>
__device__ __forceinline__ void deposit(MergeSmem<D, NW> &ms, const State<D / 16> &st, int warp, int lane)
{
    const int g = lane >> 2, t = lane & 3;
    float l0 = st.l[0] + (g == 0 ? st.z[2] : 0.f), l1 = st.l[1] + (g == 0 ? st.z[3] : 0.f);
    warp_sum<4, 16>(l0, l1);
    if (g == 0) {
        ms.m[warp][2 * t] = st.m[0], ms.m[warp][2 * t + 1] = st.m[1];
        ms.l[warp][2 * t] = l0, ms.l[warp][2 * t + 1] = l1;
    }
    // the zeros' term of channel c is Z of its value group c / GS, held by lane 4 (c / GS) + t: the same
    // group for a whole m-tile (GS >= 16), so two shuffles per m-tile instead of a loop over a group's
    // channels in lanes g < D / GS (GS iterations of two shared-memory updates)
#pragma unroll
    for (int mv = 0; mv < D / 16; mv++) {
        const int c = 16 * mv + 2 * g, gv = (16 * mv) / GS;
        const float z0 = __shfl_sync(0xffffffffu, st.z[0], 4 * gv + t), z1 = __shfl_sync(0xffffffffu, st.z[1], 4 * gv + t);
        const float r0 = exp2f((float)(24 - code_sh(4 * (mv % 4)))), r1 = exp2f((float)(24 - code_sh(4 * (mv % 4) + 2)));
        ms.o[warp][2 * t][c] = st.o[mv][0] * r0 + z0; // r0, r1: powers of two, the product exact
        ms.o[warp][2 * t + 1][c] = st.o[mv][1] * r0 + z1;
        ms.o[warp][2 * t][c + 1] = st.o[mv][2] * r1 + z0;
        ms.o[warp][2 * t + 1][c + 1] = st.o[mv][3] * r1 + z1;
    }
}

// One block of NW = 12 warps per SM (168 registers each). Its warps take the segment's 64-token steps
// from a shared counter as they go, so that they finish together (with fixed shares per warp, an SM's
// blocks finished far apart, the SM running on fewer warps meanwhile). (4 blocks of 4 warps per SM need
// 128 registers: spills at D=128.)
constexpr int NW = 12, NT = 32 * NW;

// Stages per warp: as many records as fit in 192 KB, 2 to 4: 1-3 steps (8-24 KB at gs=16... 5 KB at
// gs=128) in flight per warp.
template <int D, int GS>
__host__ __device__ constexpr int stages()
{
    return 196608 / (NW * Rec<D, GS>::BYTES) >= 4 ? 4 : 196608 / (NW * Rec<D, GS>::BYTES) >= 2 ? 196608 / (NW * Rec<D, GS>::BYTES) : 2;
}

// The rings; once drained, the merge buffer and then the block's partial (cluster_merge).
template <int D, int GS>
__host__ __device__ constexpr size_t ring_bytes()
{
    const size_t ring = (size_t)stages<D, GS>() * NW * Rec<D, GS>::BYTES;
    const size_t merge = sizeof(MergeSmem<D, NW>) + sizeof(float) * 8 * MAXG * (D + 2); // + cluster_merge's 8 slots
    return ring > merge ? ring : merge;
}

template <int D>
__device__ __noinline__ void finish(const MergeSmem<D, NW> &ms, int G, int64_t head, int64_t first, int64_t last, int64_t k,
                                    float *parts, int *counters, __nv_bfloat16 *out, int *flag_s, int tid)
{
    finish_head<D, NW>(ms, G, head, first, last, k, parts, counters, out, flag_s, tid);
}

template <int D, int GS>
__host__ __device__ constexpr size_t smem_bytes()
{
    return ring_bytes<D, GS>() + sizeof(float) * (MAXG * D + 64 * MAXG + 2 * MAXG) + sizeof(__nv_bfloat16) * MAXG * D;
}

// TRACE (KVB_INT2_TRACE=1: the diagnostic build, make KVB_TRACE=1): thread 0 of each block prints its
// segment, warp 0's count of steps, when the segment starts and ends (globaltimer, ns), and the SM
// clocks from the start to 20 points of the prologue, warp 0's first steps, the end of the steps and
// the merge (tr[i]; profiles/int2_v3_trace.py names them and prints their medians).
__device__ __forceinline__ uint64_t global_ns()
{
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}


template <int D, int GS, bool TRACE = KVB_INT2_TRACE != 0>
__global__ void __launch_bounds__(NT, 1) attn_kernel(Params P)
{
    constexpr int MT = D / 16, S = stages<D, GS>(), BYTES = Rec<D, GS>::BYTES;
    // the trace's clocks in shared memory: a local array would add spills (and their latency) to the
    // prologue it measures
    // (tr[29]: the globaltimer at the start; in shared memory too, not a register held through the kernel)
    __shared__ long long tr[TRACE ? 30 : 1];
    if (TRACE && threadIdx.x == 0) {
        for (int i = 1; i < 29; i++) tr[i] = 0;
        tr[29] = (long long)global_ns(), tr[0] = clock64();
    }
    const AttnParams &p = P.a;
    extern __shared__ __align__(128) unsigned char smem[];
    MergeSmem<D, NW> &ms = *reinterpret_cast<MergeSmem<D, NW> *>(smem); // aliases the rings once drained
    float *q_s = reinterpret_cast<float *>(smem + ring_bytes<D, GS>());
    float *qf_area = q_s + MAXG * D, *f_s = qf_area + 64 * MAXG, *u_s = f_s + MAXG;
    __nv_bfloat16 *qraw_s = reinterpret_cast<__nv_bfloat16 *>(u_s + MAXG); // q as loaded (P.q_warp0)
    __shared__ int flag_s;
    __shared__ int next_s;             // the segment's next unclaimed 64-token step
    __shared__ __align__(8) uint64_t qbar; // qraw_s's bulk copy (P.q_warp0), one phase a segment
    __shared__ int slot_step_s[NW][S]; // the step a ring slot holds (-1: none; the segment's steps ran out)
    __shared__ __align__(8) uint64_t bars[NW * S];

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, t = lane & 3;
    const int G = p.G;
    unsigned char *ring = smem + (size_t)warp * S * BYTES;
    uint64_t *bar = bars + warp * S;
    if (lane == 0)
        for (int s = 0; s < S; s++) mbar_init(bar + s, 1);
    if (tid == 0) mbar_init(&qbar, 1);
    mbar_init_fence();
    __syncwarp();
    // P.slots_apart: the cluster barrier's first phase at the start. The merger's partial slots lie apart
    // from its rings, so the other blocks need not wait for its rings to drain, only for it to have
    // started (distributed shared memory's rule); they write their partials as soon as they are done.
    if (P.cluster > 1 && P.slots_apart) cluster_arrive_relaxed();
    const bool wait_early = P.cluster > 1 && P.slots_apart;
    if (TRACE && tid == 0) tr[13] = clock64();
    // this warp's ring, as shared addresses: the slot of the next record to issue, the slot and phase
    // parity of the next to use (every lane keeps them; the ring carries over from segment to segment)
    const uint32_t ring_a = smem_u32(ring), bar_a = smem_u32(bar);
    int issue_slot = 0, use_slot = 0;
    uint32_t use_phase = 0, q_phase = 0;
    auto next_slot = [](int slot) { return slot + 1 == S ? 0 : slot + 1; };

    // A head's line: its residual steps, RESIDUAL_WEIGHT units each, then its nq 64-token steps, one unit
    // each. (a head's line is below 2^31 units: int2_decode_attn bounds T; the heads, B Hkv, are ints)
    const int W = RESIDUAL_WEIGHT, nrw = p.nr * W, per_head = nrw + (int)p.nq;
    const int64_t N = p.heads * per_head, grid = gridDim.x, kb = blockIdx.x;
    // clusters (P.cluster = C > 1): one segment a block, the head kb / C's units [r per_head / C,
    // (r + 1) per_head / C) for rank r = kb % C, as part_begin's split; in 32 bits (the host keeps C
    // per_head below 2^31), so the start runs no 64-bit division: its subroutine lies apart from the
    // kernel's code, a cold fetch of its own after the bench's L2 flush, before the first request
    const int C = P.cluster > 1 ? P.cluster : 1;
    const int chead = (int)blockIdx.x / C, crank = (int)blockIdx.x - chead * C;
    int64_t u, u1;
    if (C > 1) {
        u = (int64_t)chead * per_head + crank * per_head / C;
        u1 = (int64_t)chead * per_head + (crank + 1) * per_head / C;
    } else {
        u = part_begin(kb, N, grid), u1 = part_begin(kb + 1, N, grid);
    }
    // Clusters: q and the first fill requested first thing, before the block's first barrier, with no more
    // arithmetic than their addresses take (the loop's first segment then skips them), each warp's k-th
    // record step qa + k NW + warp (what the shared counter would hand out, in another order; it then
    // starts past them).
    // The first fill, the records a warp requests before its first step: 1 where the segment [qa, qe) is
    // at most 8 steps a warp (T = 8K at B = 8), else S - 1. A short first fill leaves shorter memory queues
    // for the cold start's own requests (q, the kernel's code and parameters), which delay a short
    // segment's first step; a long segment keeps the ring full from the start.
    auto fill_count = [&](int qa, int qe) { return qe - qa <= 8 * NW ? 1 : S - 1; };
    int fill_first = 0; // records a warp requested here
    if (C > 1) {
        const int qa = max(crank * per_head / C, nrw) - nrw, qe = (crank + 1) * per_head / C - nrw;
        if (qa < qe) {
            fill_first = fill_count(qa, qe);
            if (P.q_warp0 && tid == 0) q_rows_issue(qraw_s, p.q + (int64_t)chead * G * D, (unsigned)(G * D * 2), &qbar);
            if (lane == 0)
                for (int k = 0; k < fill_first; k++) {
                    const int got = qa + k * NW + warp;
                    slot_step_s[warp][k] = got < qe ? got : -1;
                    if (got < qe) issue_step<D, GS>(ring_a + k * BYTES, bar_a + k * 8, RecSrc<D, GS>(P.n, chead, got, p.Tcap));
                }
            issue_slot = fill_first; // < S
        }
    }
    if (TRACE && tid == 0) tr[14] = clock64();
    while (u < u1) {
        // (clusters: the head again, not held through the steps of the segment before: registers)
        const int64_t head = C > 1 ? (int64_t)(blockIdx.x / (unsigned)P.cluster) : u / per_head, hoff = head * per_head;
        const int s0 = (int)(u - hoff), s1 = (int)(min(u1, hoff + per_head) - hoff);
        const int b = (int)head / p.Hkv, kvh = (int)head - b * p.Hkv;
        // the segment's 64-token steps [qa, qe), claimed one at a time by the warps (lane 0 claims the
        // step, records it for the slot and issues its copy)
        const int qa = max(s0, nrw) - nrw, qe = s1 - nrw;
        if (TRACE && tid == 0) tr[15] = clock64();
        const __nv_bfloat16 *qh = p.q + ((int64_t)b * p.Hq + (int64_t)kvh * G) * D;
        const bool pair = G <= 4; // the PAIR step
        const bool instant = fill_first > 0; // the first segment: q and the first fill requested above
        if (P.q_warp0 && tid == 0 && !instant) q_rows_issue(qraw_s, qh, (unsigned)(G * D * 2), &qbar);
        const int fill_n = instant ? fill_first : fill_count(qa, qe);
        fill_first = 0;
        if (tid == 0) next_s = qa + (instant ? fill_n * NW : 0); // nobody claims before the barrier: the
                                                                // previous segment is done
        __syncthreads(); // the previous segment is done with shared memory
        if (TRACE && tid == 0) tr[12] = clock64();
        bool tr_claim = false; // (the trace: tid 0's second claim in the step loop, timed in parts)
        auto claim = [&]() {
            if (lane == 0) {
                const int got = qa < qe ? atomicAdd(&next_s, 1) : qe;
                slot_step_s[warp][issue_slot] = got < qe ? got : -1;
                if (TRACE && tr_claim) tr[25] = clock64();
                if (got < qe)
                    issue_step<D, GS>(ring_a + issue_slot * BYTES, bar_a + issue_slot * 8, RecSrc<D, GS>(P.n, head, got, p.Tcap),
                                      TRACE && tr_claim ? &tr[26] : nullptr);
            }
            issue_slot = next_slot(issue_slot);
        };
        if (TRACE && tid == 0 && tr[5] != 0) tr[29] = (long long)global_ns(), tr[0] = clock64(); // a later segment
        // the block-staged q (not 16-byte aligned): its lines requested into L2 ahead of the records, so
        // that its loads wait for q alone, not behind the records' queue
        if (!P.q_warp0 && tid < (G * D * 2 + 127) / 128) prefetch_l2(qh + tid * 64);
        // the first fill (fill_n records a warp) before q is staged and the residual read, so that the
        // first records' latency overlaps them instead of following them (a segment is only ~5 steps per
        // warp at T = 8K); the rest of the ring follows once q is staged, before the first step
        int ramp = S - 1 - fill_n;
        if (!instant) {
#pragma unroll 1 // a cold start fetches every byte of code it runs: the loop, not 4 copies of it
            for (int k = 0; k < fill_n; k++) claim();
        }
        if (TRACE && tid == 0) tr[6] = clock64();
        uint2 *qf_s = reinterpret_cast<uint2 *>(qf_area); // the fragments of q (64 x MAXG floats of room)
        // PAIR (G <= 4): -q of the lo columns in q_s's rows 4..7 (unused: q_s holds G rows)
        uint2 *qm_s = reinterpret_cast<uint2 *>(q_s + 4 * D);
        if (P.q_warp0) {
            // warp 0 turns q into the fragments while the others request the rest of their first fill;
            // then one block barrier (the residual steps read q_s, the quantized steps qf_s, qm_s and
            // u_s). (With warp 0 arriving on a named barrier without waiting, compute-sanitizer's
            // racecheck reported hazards between the merge's accesses: kernels/int2/NOTES.md.)
            if (warp == 0) {
                mbar_wait(&qbar, q_phase);
                q_rows_finish<D>(qraw_s, q_s, f_s, u_s, qf_s, qm_s, G, pair, lane);
                if (TRACE && tid == 0) tr[7] = tr[16] = clock64();
            } else if (qa < qe) {
                if (TRACE && tid == 32) tr[21] = clock64();
#pragma unroll 1
                for (int k = 0; k < ramp; k++) claim();
                ramp = 0;
                if (TRACE && tid == 32) tr[22] = clock64();
            }
            __syncthreads();
            if (TRACE && tid == 32) tr[23] = clock64();
        } else {
            stage_q<NT>(q_s, f_s, u_s, qh, G, D, tid, 1);
            if (TRACE && tid == 0) tr[7] = clock64();
            // the quantized steps' q fragments, before the residual steps: the warps without residual
            // steps then start on the quantized ones at once instead of waiting at a block barrier behind them
            if (qa < qe) { // block-uniform
                if (warp == 0) {
                    if (pair) q_frags_store_pair<D>(qf_s, qm_s, q_s, f_s, G, lane);
                    else v2::q_frags_store<D>(qf_s, q_s, f_s, G, lane);
                    if (TRACE && tid == 0) tr[16] = clock64();
                }
                __syncthreads();
            }
        }
        // residual step r belongs to the segment holding its first unit r W
        const int r_beg = (s0 + W - 1) / W, r_end = min((s1 + W - 1) / W, (int)p.nr);
        if (TRACE && tid == 0) tr[1] = clock64();
        // With the slots apart, the first phase (every block arrived at its start) is waited here, where a block
        // waits for its first records anyway, instead of at the merge: its acquire (the SM's L1
        // invalidation, CCTL.IVALL) then lies off the end of the kernel. Every thread passes here once (a
        // cluster block has one segment).
        if (wait_early) {
            __syncwarp();
            cluster_wait();
        }
        State<MT> st;
        st.init();
        if (r_beg < r_end)
            st = residual_steps<D, NW>(q_s, G, p.c.Kr + head * p.Rcap * D, p.c.Vr + head * p.Rcap * D, r_beg, r_end, p.R,
                                       p.scale, warp, lane);
        int steps = 0; // this warp's 64-token steps in the segment (the trace)
        if (qa < qe) { // block-uniform
            const float uf[2] = {2 * t < G ? p.scale * u_s[2 * t] : 0.f, 2 * t + 1 < G ? p.scale * u_s[2 * t + 1] : 0.f};
            // the rest of a short first fill, now that q is staged: the ring's S - 1 ahead before the
            // first step (not in the step loop: its code stays as it was)
#pragma unroll 1
            for (; ramp > 0; ramp--) claim();
            __syncwarp(); // lane 0's slot_step_s entries
            for (;; steps++) {
                const int cur = slot_step_s[warp][use_slot];
                if (cur < 0) break; // and every later claim of the segment came back empty
                if (TRACE && tid == 0 && steps == 1) tr[24] = clock64(), tr_claim = true;
                claim();             // into the slot the previous step freed
                if (TRACE && tid == 0 && steps == 1) tr[27] = clock64(), tr_claim = false;
                unsigned char *rec = ring + use_slot * BYTES;
                mbar_wait(bar_a + use_slot * 8, use_phase);
                if (TRACE && tid == 0 && steps < 3) tr[steps == 0 ? 2 : 7 + steps] = clock64();
                if (TRACE && tid == 32 && steps == 0) tr[28] = clock64();
                const int64_t tok = (int64_t)cur * 64;
                if (tok + 64 > p.T) { // value scales and zeros past T may be anything (NaN), and 0 * NaN is NaN
                    constexpr int BLKW = Rec<D, GS>::NGV * 16;   // words of one 16-token block's scales and zeros
                    uint32_t *vm = reinterpret_cast<uint32_t *>(rec + Rec<D, GS>::VM);
                    for (int o = lane; o < 4 * BLKW; o += 32)
                        if (tok + 16 * (o / BLKW) >= p.T) vm[o] = 0u;
                    __syncwarp();
                }
                if (pair) step<D, GS, true>(st, rec, qf_s, qm_s, uf, lane, tok, p.T);
                else step<D, GS, false>(st, rec, qf_s, qm_s, uf, lane, tok, p.T);
                __syncwarp(); // every lane is done with the record before it is refilled
                use_slot = next_slot(use_slot), use_phase ^= use_slot == 0;
            }
            // the slots from use_slot on were claimed empty and never issued: the next segment fills
            // them in order
            issue_slot = use_slot;
            if (TRACE && tid == 0) tr[3] = clock64();
        }
        __syncthreads(); // the merge buffer aliases the rings
        if (P.cluster > 1 && !P.slots_apart) cluster_arrive(); // this block's rings may now take the cluster's partials
        if (TRACE && tid == 0) tr[4] = clock64();
        deposit<D, GS, NW>(ms, st, warp, lane);
        __syncthreads();
        if (TRACE && tid == 0) tr[11] = clock64();
        if (P.cluster > 1) { // one segment per block, the head's blocks one cluster
            float *parts_s = reinterpret_cast<float *>(smem + (P.slots_apart ? smem_bytes<D, GS>() : sizeof(MergeSmem<D, NW>)));
            __nv_bfloat16 *out = p.o + ((int64_t)b * p.Hq + (int64_t)kvh * G) * D;
            cluster_merge<D, NW>(ms, parts_s, G, out, tid, wait_early, TRACE ? tr : nullptr);
        } else {
            const int64_t first = block_of(hoff, N, grid), last = block_of(hoff + per_head - 1, N, grid);
            finish<D>(ms, G, head, first, last, kb, p.parts, p.counters, p.o + ((int64_t)b * p.Hq + (int64_t)kvh * G) * D,
                      &flag_s, tid);
        }
        if (TRACE && tid == 0) {
            unsigned smid;
            asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
            tr[5] = clock64();
            // TR3 kb smid head s0 s1 steps g0 gend, then tr[1..20] - tr[0] (-1: not reached); one printf,
            // so that the blocks' lines do not interleave
            auto d = [&](int i) { return tr[i] ? tr[i] - tr[0] : -1LL; };
            printf("TR3 %d %u %lld %lld %lld %d %llu %llu "
                   "%lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld\n",
                   (int)kb, smid, (long long)head, (long long)s0, (long long)s1, steps, (unsigned long long)tr[29],
                   (unsigned long long)global_ns(), d(1), d(2), d(3), d(4), d(5), d(6), d(7), d(8), d(9), d(10), d(11),
                   d(12), d(13), d(14), d(15), d(16), d(17), d(18), d(19), d(20));
            // TR3X kb, then tr[21..28] - tr[0]: warp 1's ramp (before, after, past q's wait), warp 0's
            // second claim in the step loop (before, after the counter, after the expected bytes, after
            // the copies), warp 1's first step
            printf("TR3X %d %lld %lld %lld %lld %lld %lld %lld %lld\n", (int)kb, d(21), d(22), d(23), d(24), d(25), d(26),
                   d(27), d(28));
        }
        // a cluster block's one segment: exit here, without reloading the loop's state (spilled) to find
        // that no segment follows
        if (C > 1) return;
        q_phase ^= 1u;
        u = hoff + s1;
    }
}

} // namespace v3

int capacity(const int2_layout *l, int *cap)
{
    return with_cfg(l->D, l->gs, [&](auto dc, auto gc) -> int {
        constexpr int D = decltype(dc)::value, GS = decltype(gc)::value;
        return resident_blocks(v3::attn_kernel<D, GS>, v3::NT, v3::smem_bytes<D, GS>(), cap);
    });
}
} // namespace

const int2_internal::DecodeVersion int2_internal::decode_v3 = {"v3", capacity};

// The workspace serves every version: counters and the partials of up to `cap` blocks, the largest
// resident grid of any version.
extern "C" size_t int2_decode_attn_workspace_bytes(const int2_layout *l)
{
    using namespace int2_internal;
    if (int2_attn_check(l, "int2_decode_attn_workspace_bytes")) return 0;
    int cap = 0;
    for (const DecodeVersion *v : {&decode_v2, &decode_v1, &decode_v3}) {
        int c = 0;
        if (v->capacity(l, &c)) return 0;
        cap = c > cap ? c : cap;
    }
    size_t off;
    return attn_workspace(l, cap, &off);
}

extern "C" int int2_decode_attn(const kvb_bf16 *q, const int2_cache *c, const int2_native *nat, kvb_bf16 *o,
                                const int2_layout *l, void *workspace, cudaStream_t stream)
{
    const char *who = "int2_decode_attn";
    int rc = check_fused(l, who);
    if (rc) return rc;
    if (!c) return kvb_fail(KVB_EINVAL, "%s: the cache (for its residual Kr, Vr) is NULL", who);
    if (l->T > 0 && (!nat || !nat->Rec || !nat->Km))
        return kvb_fail(KVB_EINVAL, "%s: a native cache pointer (Rec, Km) is NULL", who);
    if (l->T / 64 + 64 >= ((int64_t)1 << 31)) // v3 counts a head's steps in 32 bits
        return kvb_fail(KVB_EINVAL, "%s: T=%lld: v3 takes T < 64 (2^31 - 64) tokens", who, (long long)l->T);
    if ((rc = decode_check(who, q, c, o, l, workspace))) return rc;
    int cap = 0, grid = 0;
    if ((rc = capacity(l, &cap))) return rc;
    const AttnParams p = decode_params(q, c, o, l, workspace, cap, &grid);
    // head-aligned: a multiple of the heads, so that every block's part of the stream-K line lies in
    // one head (one segment: one q staging, one merge) instead of straddling two
    if (grid == cap && p.heads <= cap) grid = (int)(p.heads * (cap / p.heads));
    return with_cfg(l->D, l->gs, [&](auto dc, auto gc) -> int {
        constexpr int D = decltype(dc)::value, GS = decltype(gc)::value;
        v3::Params P;
        P.a = p;
        P.n.Rec = nat ? nat->Rec : nullptr, P.n.Km = nat ? reinterpret_cast<const __half *>(nat->Km) : nullptr;
        P.q_warp0 = (uintptr_t)q % 16 == 0; // a bulk copy: 16-byte aligned
        P.cluster = 0, P.slots_apart = 0;
        void (*kernel)(v3::Params) = v3::attn_kernel<D, GS>;
        const size_t smem = v3::smem_bytes<D, GS>();
        CUDA_TRY(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3((unsigned)grid);
        cfg.blockDim = dim3(v3::NT);
        cfg.dynamicSmemBytes = smem;
        cfg.stream = stream;
        cudaLaunchAttribute attr[1];
        // a cluster per head: the head-aligned grid with 2 to 8 blocks per head (one segment each), if
        // that many clusters can be resident at once (one wave, as the stream-K grid assumes)
        const int64_t bph = grid % p.heads == 0 ? grid / p.heads : 0;
        // (the kernel splits a head among its cluster in 32 bits: bph (nr RESIDUAL_WEIGHT + nq) < 2^31)
        const int64_t per_head = p.nr * v3::RESIDUAL_WEIGHT + p.nq;
        if (bph >= 2 && bph <= 8 && per_head >= bph && bph * per_head < ((int64_t)1 << 31)) {
            attr[0].id = cudaLaunchAttributeClusterDimension;
            attr[0].val.clusterDim.x = (unsigned)bph, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
            cfg.attrs = attr, cfg.numAttrs = 1;
            // the partial slots past the rings where the block's shared memory takes them (the device's
            // opt-in limit refuses the attribute otherwise: then over the rings)
            const size_t apart = smem + sizeof(float) * (size_t)bph * p.G * (D + 2);
            if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)apart) == cudaSuccess)
                cfg.dynamicSmemBytes = apart, P.slots_apart = 1;
            else
                (void)cudaGetLastError();
            // resident clusters of this instance, size and shared memory on this device (asked once a shape)
            int n = 0;
            CUDA_TRY(resident_clusters_of(kernel, (int)cfg.blockDim.x, cfg.dynamicSmemBytes, (int)bph, &n));
            if ((int64_t)n * bph >= grid) {
                P.cluster = (int)bph;
            } else {
                cfg.attrs = nullptr, cfg.numAttrs = 0, cfg.dynamicSmemBytes = smem, P.slots_apart = 0;
            }
        }
        CUDA_TRY(cudaLaunchKernelEx(&cfg, kernel, P));
        return KVB_OK;
    });
}
