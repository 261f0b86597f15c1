// int2_decode_v1.cu: int2_decode_attn v1, the first fused version (int2_decode_attn_v1): codes dequantized
// to fp16 values before each MMA.
//
// v1 design (int2_decode_attn_v1; int2_qk and int2_av reuse its halves):
// - Transposed MMAs as in decode.cu (attn_device.h): S^T = dequant(K)^T . q^T with the G <= 8 query
//   heads as the 8 columns, O^T += dequant(V)^T . P^T.
// - The packed cache is read in tiles of 256 tokens into shared memory with cp.async, double buffered,
//   4 warps x 64 tokens per tile. Token order inside a warp's 64 tokens: row r of S^T m-tile i is token
//   8*(r%8) + 2i + (r>=8), so a thread owns 8 consecutive tokens = one half of a key code word, and the
//   QK contraction index of thread t is channel t + 4y, so that its 4 code words per k-step sit in
//   different banks. For AV, row r of O^T m-tile i is channel 16*(r%8) + 2i + (r>=8): a thread owns one
//   value code word per token. Two code words (two channels, or two tokens) are merged with one PRMT,
//   then each fp16 pair of the A fragment is SHF + LOP3 + HSUB2 + HFMA2.
// - q is scaled per head by a power of two into [2^14, 2^15) before it becomes fp16 (exact for bf16
//   inputs), and the scale is undone on the scores; P is in [0, 1] and goes to fp16 as is.
// - The bf16 residual is processed with decode.cu's dense step (bf16 MMA) into the same flash state.
// - Split along tokens stream-K style over one line of steps (per head: ceil(R/16) residual steps of
//   16 tokens, then ceil(T/64) quantized steps of 64 tokens, both ~8 KB at gs=16), one resident wave of
//   blocks, log-sum-exp merge by the last block of each head (attn_device.h).
#include "kernels/int2/int2_tile.cuh"

namespace {

template <int D, int GS>
__host__ __device__ constexpr size_t attn_tiles_bytes()
{
    return 2 * (size_t)Tile<D, GS>::BYTES > sizeof(MergeSmem<D>) ? 2 * (size_t)Tile<D, GS>::BYTES : sizeof(MergeSmem<D>);
}

template <int D, int GS>
constexpr size_t attn_smem_bytes()
{
    return attn_tiles_bytes<D, GS>() + sizeof(float) * (MAXG * D + 2 * MAXG);
}

template <int D, int GS>
__global__ void __launch_bounds__(THREADS) int2_attn_kernel(AttnParams p)
{
    constexpr int MT = D / 16;
    constexpr int BUF = Tile<D, GS>::BYTES;
    extern __shared__ __align__(16) unsigned char smem[];
    MergeSmem<D> &ms = *reinterpret_cast<MergeSmem<D> *>(smem); // aliases the tile buffers once drained
    float *q_s = reinterpret_cast<float *>(smem + attn_tiles_bytes<D, GS>());
    float *f_s = q_s + MAXG * D, *u_s = f_s + MAXG;
    __shared__ int flag_s;

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int G = p.G;
    const int64_t per_head = p.nr + p.nq, N = p.heads * per_head, grid = gridDim.x, k = blockIdx.x;
    int64_t u = part_begin(k, N, grid);
    const int64_t u1 = part_begin(k + 1, N, grid);
    while (u < u1) {
        const int64_t head = u / per_head, hoff = head * per_head;
        const int64_t s0 = u - hoff, s1 = min(u1, hoff + per_head) - hoff;
        const int64_t b = head / p.Hkv;
        const int kvh = (int)(head % p.Hkv);
        __syncthreads(); // the previous segment is done with shared memory
        stage_q(q_s, f_s, u_s, p.q + (b * p.Hq + (int64_t)kvh * G) * D, G, D, tid);
        WarpState<MT> st;
        st.init();

        // the bf16 residual: steps [s0, min(s1, nr)) of 16 tokens, bf16 MMA
        const int64_t r_end = min(s1, p.nr);
        if (s0 < r_end) {
            uint32_t qb[D / 16][2];
            q_frags_bf16<D>(qb, q_s, G, lane);
            const __nv_bfloat16 *Kr = p.c.Kr + head * p.Rcap * D, *Vr = p.c.Vr + head * p.Rcap * D;
            for (int64_t s = s0 + warp; s < r_end; s += WARPS) {
                DenseRegs<D> r;
                const int nv = (int)min((int64_t)16, p.R - s * 16);
                dense_load<D, VMAP_WORD>(r, Kr, Vr, s * 16, nv, lane);
                dense_compute<D>(st, qb, r, nv, p.scale, lane);
            }
        }

        // the quantized tokens: steps [qa, qe) of 64 tokens, tiles of 4 steps, double buffered
        const int qa = (int)(max(s0, p.nr) - p.nr), qe = (int)(s1 - p.nr);
        if (qa < qe) {
            uint32_t qh[D / 16][2];
            q_frags_f16<D>(qh, q_s, f_s, G, lane);
            const float sc0 = 2 * t < G ? p.scale * u_s[2 * t] : 0.f;
            const float sc1 = 2 * t + 1 < G ? p.scale * u_s[2 * t + 1] : 0.f;
            const int ta0 = qa >> 2, ta1 = (qe - 1) >> 2;
            load_tile<D, GS>(smem, p.c, head, ta0, p.T, p.Tcap, true, true, tid);
            cp_async_commit();
            for (int tile = ta0; tile <= ta1; tile++) {
                const unsigned char *buf = smem + ((tile - ta0) & 1) * BUF;
                if (tile < ta1) {
                    load_tile<D, GS>(smem + ((tile - ta0 + 1) & 1) * BUF, p.c, head, tile + 1, p.T, p.Tcap, true, true, tid);
                    cp_async_commit();
                    cp_async_wait<1>();
                } else {
                    cp_async_wait<0>();
                }
                __syncthreads();
                const int step = tile * 4 + warp;
                if (step >= qa && step < qe) {
                    float s[4][4];
                    qk_tile<D, GS>(s, buf, qh, warp, lane);
                    const int64_t tok = (int64_t)tile * TILE + 64 * warp + 8 * g;
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        const bool v0 = tok + 2 * i < p.T, v1 = tok + 2 * i + 1 < p.T;
                        s[i][0] = v0 ? s[i][0] * sc0 : -INFINITY;
                        s[i][1] = v0 ? s[i][1] * sc1 : -INFINITY;
                        s[i][2] = v1 ? s[i][2] * sc0 : -INFINITY;
                        s[i][3] = v1 ? s[i][3] * sc1 : -INFINITY;
                    }
                    uint32_t pb[4][2];
                    softmax_update<4, MT, true>(st, s, pb);
                    av_tile<D, GS>(st.o, buf, pb, warp, lane);
                }
                __syncthreads(); // the buffer is refilled in the next iteration
            }
        }

        warp_deposit<D, VMAP_WORD>(ms, st, warp, lane);
        __syncthreads();
        const int64_t first = block_of(hoff, N, grid), last = block_of(hoff + per_head - 1, N, grid);
        finish_head<D>(ms, G, head, first, last, k, p.parts, p.counters, p.o + (b * p.Hq + (int64_t)kvh * G) * D,
                       &flag_s, tid);
        u = hoff + s1;
    }
}

int capacity(const int2_layout *l, int *cap)
{
    return with_cfg(l->D, l->gs, [&](auto dc, auto gc) -> int {
        constexpr int D = decltype(dc)::value, GS = decltype(gc)::value;
        return resident_blocks(int2_attn_kernel<D, GS>, THREADS, attn_smem_bytes<D, GS>(), cap);
    });
}
} // namespace

const int2_internal::DecodeVersion int2_internal::decode_v1 = {"v1", capacity};

extern "C" int int2_decode_attn_v1(const kvb_bf16 *q, const int2_cache *c, kvb_bf16 *o, const int2_layout *l,
                                   void *workspace, cudaStream_t stream)
{
    const char *who = "int2_decode_attn_v1";
    int rc = check_fused(l, who);
    if (rc) return rc;
    if (l->T > 0 && ((rc = check_keys_present(c, who)) || (rc = check_values_present(c, who)))) return rc;
    if ((rc = decode_check(who, q, c, o, l, workspace))) return rc;
    int cap = 0, grid = 0;
    if ((rc = capacity(l, &cap))) return rc;
    const AttnParams p = decode_params(q, c, o, l, workspace, cap, &grid);
    return with_cfg(l->D, l->gs, [&](auto dc, auto gc) -> int {
        constexpr int D = decltype(dc)::value, GS = decltype(gc)::value;
        int2_attn_kernel<D, GS><<<grid, THREADS, attn_smem_bytes<D, GS>(), stream>>>(p);
        CUDA_TRY(cudaGetLastError());
        return KVB_OK;
    });
}
