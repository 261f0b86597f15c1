/* step_block.h: one transformer block decoding one token for B sequences, the dense method, as a
 * composition (compose.h; reference: ref_decode_block_dense; spec: decode.md, "End-to-end decode
 * steps"). Stages, all on the main stream:
 *
 *   rmsnorm1 (h <- x)  qkv (cuBLAS)  rope_split  kv_append  attention (decode_attn over pos + 1 tokens)
 *   o_proj (h += o W_o^T, cuBLAS)  rmsnorm2 (y <- h)  gate_up (cuBLAS)  silu_mul  down (y += ..., cuBLAS)
 *
 * Planned once on the host (every check of every stage runs at plan time), then enqueued eagerly or
 * replayed as one captured CUDA graph (kvb_step_capture on plan->step).
 */
#ifndef KVB_KERNELS_STEP_BLOCK_H
#define KVB_KERNELS_STEP_BLOCK_H

#include "block.h"
#include "compose.h"
#include "decode.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct block_buffers { /* device pointers unless *_host */
    const kvb_bf16 *x;                 /* [B, hidden] */
    block_weights w;                   /* device copies of the weights */
    const kvb_bf16 *cos_sin;           /* [max_pos, D] */
    const int32_t *pos, *pos_host;     /* [B] */
    const int32_t *len, *len_host;     /* [B]: pos + 1 */
    kvb_bf16 *K, *V;                   /* [B, Hkv, L, D] */
    kvb_bf16 *y;                       /* [B, hidden] */
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
    kvb_step step;
} block_step_plan;

int block_step_plan_make(block_step_plan *p, const char *name, const block_preset *m, int B, int64_t L, int max_pos,
                         const block_buffers *buf, cudaStream_t stream, int timing);
int block_step_enqueue(block_step_plan *p);
void block_step_plan_destroy(block_step_plan *p);

#ifdef __cplusplus
}
#endif
#endif
