/* step_block.h: one transformer block decoding one token for B sequences as a composition (compose.h;
 * reference: ref_block_pre / ref_block_post around the method's attention; kernels/step/NOTES.md). Stages:
 *
 *   rmsnorm1 (h <- x)  qkv (cuBLAS)  rope_split
 *   the attention path: dense (kv_append, decode_attn over pos + 1 tokens), or a method's stages
 *     (block_attention: they may use the side stream)
 *   o_proj (h += o W_o^T, cuBLAS)  rmsnorm2 (y <- h)  gate_up (cuBLAS)  silu_mul  down (y += ..., cuBLAS)
 *
 * Planned once on the host (every check of every stage runs at plan time), then enqueued eagerly or
 * replayed as one captured CUDA graph (kvb_step_capture on plan->step).
 */
#ifndef KVB_KERNELS_STEP_BLOCK_H
#define KVB_KERNELS_STEP_BLOCK_H

#include "kernels/step/block.h"
#include "kernels/step/compose.h"
#include "kernels/decode/decode.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A method's attention path inside the block: add_stages adds its stages to the block's step (after
 * rope_split, before o_proj; kvb_step_add, stream 0 or 1). They read q [B, Hq, D] and the new token's
 * knew, vnew [B, Hkv, D] (rotated), and write att [B, Hq, D] in a stage of stream 0 (o_proj follows it
 * there). Every check runs inside add_stages (plan time), so a bad shape is refused before anything is
 * launched. */
typedef struct block_attention {
    int (*add_stages)(void *ctx, kvb_step *step, const kvb_bf16 *q, const kvb_bf16 *knew, const kvb_bf16 *vnew,
                      kvb_bf16 *att);
    void *ctx;
    /* 1: o_proj's weights are read into L2 on the side stream while this path runs (a path of long
     * latency-bound chains over few bytes, where the DRAM idles; kernels/step/NOTES.md says where) */
    int prefetch_o;
    /* 1: the side streams' stages are scheduled ahead of the main stream's (the block's plan makes its own
     * two side streams of the greatest priority): ShadowKV, whose side streams hold the misses' fetches
     * over the host link, the step's critical path, while the next chunk's selection fills the SMs */
    int side_first;
} block_attention;

typedef struct block_buffers { /* device pointers unless *_host */
    const kvb_bf16 *x;                 /* [B, hidden] */
    block_weights w;                   /* device copies of the weights */
    const kvb_bf16 *cos_sin;           /* [max_pos, D] */
    const int32_t *pos, *pos_host;     /* [B] */
    const block_attention *attn;       /* NULL: dense, over K, V (the next three fields); else unused */
    const int32_t *len, *len_host;     /* [B]: pos + 1 */
    kvb_bf16 *K, *V;                   /* [B, Hkv, L, D] */
    kvb_bf16 *y;                       /* [B, hidden] */
    kvb_bf16 *q, *knew, *vnew;         /* rope_split's outputs [B, Hq | Hkv, D]: NULL = in the scratch */
    void *scratch;                     /* block_scratch_bytes */
    void *attn_ws;                     /* decode_attn_workspace_bytes, zeroed once */
    void *cublas;                      /* block_cublas_create */
} block_buffers;

/* Device scratch of the step's intermediates (z, qkv, q, knew, vnew, attention out, h, gate_up, act). */
size_t block_scratch_bytes(const block_preset *m, int B);

typedef struct block_step_plan {
    const block_preset *m;
    int B, max_pos;
    decode_layout d;
    block_buffers buf;
    kvb_bf16 *z, *qkv, *q, *knew, *vnew, *att, *h, *gu, *act; /* carved from scratch */
    size_t o_prefetch_bytes; /* o_proj's weights read into L2 beside the attention path (0: not) */
    cudaStream_t side[2];    /* the side streams of the greatest priority (block_attention.side_first), or NULL */
    kvb_step step;
} block_step_plan;

/* L: the dense cache's rows (with buf->attn: unused, pass max_pos). s1: the side stream (may equal s0). */
int block_step_plan_make(block_step_plan *p, const char *name, const block_preset *m, int B, int64_t L, int max_pos,
                         const block_buffers *buf, cudaStream_t s0, cudaStream_t s1, int timing);
int block_step_enqueue(block_step_plan *p);
void block_step_plan_destroy(block_step_plan *p);

#ifdef __cplusplus
}
#endif
#endif
