/* step_omnikv.h: OmniKV's decode-time attention paths without offload (every layer's K, V on the device,
 * the paper's "without offload" setting) as stages of a composition (compose.h; kernels/step/NOTES.md,
 * the omnikv method and its layer roles; roles: reference/omnikv.h):
 *
 *   filter layer:  main stream  kv_append        the new token's k, v into row pos of K, V
 *                               decode_attn      over the pos + 1 tokens
 *                  side stream  omnikv_select    waits for the main stream's last stage before the path
 *                                                (in the block: rope_split, which writes q); the top-k
 *                                                prompt tokens by max over query heads of q.k/sqrt(D)
 *                                                over the ctx prompt rows of K -> idx [B, k], for the
 *                                                sparse layers after it
 *   sparse layer:  main stream  kv_append, then sparse_attn_idx over idx [B, Hkv, n]: the filter's k
 *                               prompt tokens followed by the decoded tokens ctx .. pos
 *
 * Planned once on the host (every check of every stage runs here, so a bad shape or list is refused
 * before anything is launched); each step then only enqueues, eagerly or as one captured CUDA graph.
 * Every sequence of the batch is at the same position pos. References: ref_kv_append, ref_decode_attn,
 * ref_omnikv_select, ref_sparse_attn_idx.
 */
#ifndef KVB_KERNELS_STEP_OMNIKV_H
#define KVB_KERNELS_STEP_OMNIKV_H

#include "kernels/step/compose.h"
#include "kernels/decode/decode.h"
#include "kernels/omnikv/omnikv.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct omnikv_step_shape {
    int filter;          /* 1: the filter layer; 0: a sparse layer */
    decode_layout cache; /* K, V [B, Hkv, L, D], L = pos + 1: every token, this step's included */
    int ctx;             /* prompt tokens: the selector's rows */
    int k;               /* prompt tokens selected (OmniKV's budget) */
    int n;               /* sparse layer: entries per list, k + L - ctx */
} omnikv_step_shape;

typedef struct omnikv_buffers { /* device pointers; *_host: host copies of the same values */
    const kvb_bf16 *q;                   /* [B, Hq, D] */
    const kvb_bf16 *knew, *vnew;         /* [B, Hkv, D] */
    const int32_t *pos, *pos_host;       /* [B]: L - 1 in every entry, the row written */
    const int32_t *len, *len_host;       /* [B]: L */
    kvb_bf16 *K, *V;                     /* [B, Hkv, L, D] */
    kvb_bf16 *o;                         /* [B, Hq, D] */
    void *attn_ws;                       /* omnikv_attn_workspace_bytes, zeroed once */
    /* filter layer */
    const int32_t *prompt, *prompt_host; /* [B]: ctx, the selector's lengths */
    int32_t *sel;                        /* [B, k] */
    float *scores;                       /* [B, L] (or NULL: kept in select_ws) */
    void *select_ws;                     /* omnikv_select_workspace_bytes */
    size_t select_ws_bytes;
    /* sparse layer */
    const int32_t *idx, *idx_host;       /* [B, Hkv, n] */
    const int32_t *cnt, *cnt_host;       /* [B]: n */
} omnikv_buffers;

typedef struct omnikv_path {
    omnikv_step_shape sh;
    omnikv_buffers buf;
    omnikv_layout select; /* the selector over K (L rows allocated, ctx of them the prompt) */
    sparse_layout att;    /* the sparse layer's lists */
} omnikv_path;

/* Workspace of the attention stage: decode_attn's (filter layer) or sparse_attn_idx's (sparse layer). */
size_t omnikv_attn_workspace_bytes(const omnikv_step_shape *sh);

/* Every check of the path's stages, against the host copies: the layouts, pos = L - 1 and len = L in
 * every entry; filter: prompt = ctx, k in [1, ctx], the selector's workspace; sparse: cnt = n and every
 * list entry inside the cache (sparse_lists_check). */
int omnikv_path_prepare(omnikv_path *p, const omnikv_step_shape *sh, const omnikv_buffers *buf);
/* As a block_attention's add_stages (kernels/step/step_block.h; ctx: a prepared path): q, knew, vnew, o
 * taken from the block's buffers. */
int omnikv_block_add_stages(void *ctx, kvb_step *step, const kvb_bf16 *q, const kvb_bf16 *knew, const kvb_bf16 *vnew,
                            kvb_bf16 *att);

#ifdef __cplusplus
}
#endif
#endif
