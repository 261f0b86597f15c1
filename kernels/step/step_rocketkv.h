/* step_rocketkv.h: RocketKV's decode-time attention path as a composition (compose.h;
 * kernels/step/NOTES.md, the rocketkv method: page metadata append -> hybrid scoring -> page top-k ->
 * sparse attention), over the C tokens SnapKV++ kept from the prompt:
 *
 *   hybrid_score_append  k into the min/max of its page (t / P) and k, v into row t of the kept cache
 *                        K, V, done by the scoring block that reads that page; u over the
 *                        ceil((t+1)/P) pages, then the page top-k
 *   sparse_attn_pages    attends over the chosen pages (len = t+1)
 *
 * both on the main stream.
 *
 * Planned once on the host (every check of every stage runs here, so a bad shape is refused before
 * anything is launched); each step then only enqueues, eagerly or as one captured CUDA graph.
 * Every sequence of the batch is at the same position t (hybrid_score scores one context length).
 */
#ifndef KVB_KERNELS_STEP_ROCKETKV_H
#define KVB_KERNELS_STEP_ROCKETKV_H

#include "kernels/step/compose.h"
#include "kernels/decode/decode.h"
#include "kernels/page_scoring/page_scoring.h"
#include "reference/step/step_rocketkv.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rocketkv_buffers { /* device pointers; *_host: host copies of the same values */
    const kvb_bf16 *q;                 /* [B, Hq, D] */
    const kvb_bf16 *knew, *vnew;       /* [B, Hkv, D] */
    const int32_t *t, *t_host;         /* [B]: t in every entry */
    const int32_t *len, *len_host;     /* [B]: t + 1 */
    const int32_t *cnt, *cnt_host;     /* [B]: ceil(k / P) pages attended */
    kvb_bf16 *K, *V;                   /* [B, Hkv, C, D], row t written */
    kvb_bf16 *kmin, *kmax;             /* [B, Hkv, D, cap_pages], page t / P updated */
    float *u;                          /* [B, Hkv, ceil((t+1)/P)] */
    int32_t *pages;                    /* [B, Hkv, ceil(k / P)] */
    kvb_bf16 *o;                       /* [B, Hq, D] */
    void *ws_score, *ws_attn;          /* rocketkv_workspace_bytes: ws_attn zeroed once */
} rocketkv_buffers;

typedef struct rocketkv_step_plan {
    rocketkv_shape sh;
    rocketkv_buffers buf;
    page_layout meta, score; /* append (L = C) and scoring (L = t + 1) layouts */
    sparse_layout att;
    decode_layout cache;
    kvb_step step;
} rocketkv_step_plan;

/* Device workspaces of the scoring (hybrid_score) and attention (sparse_attn_pages) stages. */
void rocketkv_workspace_bytes(const rocketkv_shape *sh, size_t *score_bytes, size_t *attn_bytes);

/* The path's checks and layouts without a step of its own (rocketkv_step_plan_make = this, then the
 * stages added to p->step); then rocketkv_add_stages adds the two stages to any step (the decode
 * block's), on its main stream. */
int rocketkv_path_prepare(rocketkv_step_plan *p, const rocketkv_shape *sh, const rocketkv_buffers *buf);
int rocketkv_add_stages(rocketkv_step_plan *p, kvb_step *step);
/* As a block_attention's add_stages (kernels/step/step_block.h; ctx: a prepared plan): q, knew, vnew, o
 * taken from the block's buffers. */
int rocketkv_block_add_stages(void *ctx, kvb_step *step, const kvb_bf16 *q, const kvb_bf16 *knew, const kvb_bf16 *vnew,
                              kvb_bf16 *att);

/* Plan the three stages on s0 (main) and s1 (side; may equal s0). timing: per-stage device times. */
int rocketkv_step_plan_make(rocketkv_step_plan *p, const char *name, const rocketkv_shape *sh,
                            const rocketkv_buffers *buf, cudaStream_t s0, cudaStream_t s1, int timing);
int rocketkv_step_enqueue(rocketkv_step_plan *p);
void rocketkv_step_plan_destroy(rocketkv_step_plan *p);

#ifdef __cplusplus
}
#endif
#endif
