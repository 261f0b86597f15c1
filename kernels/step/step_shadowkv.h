/* step_shadowkv.h: ShadowKV's decode-time attention path as stages of a composition (compose.h;
 * kernels/step/NOTES.md, the shadowkv method; reference: reference/step/step_shadowkv.h, the same steps).
 * The batch is split into min(4, B) chunks of consecutive sequences (sizes as equal as possible); for
 * each chunk j in order:
 *
 *   stream 0  landmark_score_cj (q . landmarks, softmax, max over the group, top-M, map to chunk ids)
 *   stream 0  index_scan_cj (hits and misses against the chunks the buffer holds)
 *   stream 0  gather_copy_d2d_V_cj (the hits moved inside the value buffer, the whole grid)
 *   stream 1 + (j & 1)  gather_copy_misses_cj, after the chunk's compaction: its misses read from
 *             pinned host memory (PCIe) by a grid of SHADOWKV_FETCH_BLOCKS blocks; the two side
 *             streams let a fetch start beside the previous one's last blocks
 *
 * then, over the whole batch:
 *
 *   stream 0  gather_copy_d2d_K (hits), batch_gemm_rotary (misses: U x SV with RoPE), kv_append
 *
 * and per chunk j in order:
 *
 *   stream 0  decode_attn_cj over the chunk's valid rows, after its values arrived (a join per chunk)
 *
 * so the next chunk's selection runs on the SMs the capped fetch leaves free, the fetch overlaps the
 * key compaction and reconstruction, as ShadowKV does, and the first chunks' attention overlaps the
 * last fetches: only the last chunk's attention follows the last fetch. At B = 1 (one chunk) there is
 * no next chunk to overlap: landmark_score, index_scan, then gather_copy_V on stream 1 (hits and misses
 * in one launch, gather_copy), and decode_attn after it. Planned once on the host: every stage's
 * checks run at plan time.
 */
#ifndef KVB_KERNELS_STEP_SHADOWKV_H
#define KVB_KERNELS_STEP_SHADOWKV_H

#include "reference/decode.h"
#include "reference/step/step_shadowkv.h"
#include "kernels/step/compose.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct shadowkv_buffers { /* device pointers unless *_host */
    const kvb_bf16 *landmarks;   /* [B, Hkv, Lm, D] */
    const int32_t *landmark_idx; /* [B, Hkv, Lm] */
    const kvb_bf16 *U, *SV;      /* [B, S, r], [B, Hkv, r, D] */
    const kvb_bf16 *cos_sin;     /* [max_pos, D] */
    const kvb_bf16 *Vh;          /* pinned host values, mapped: [B, Hkv, n_chunks, c, D] */
    int32_t *cached_ids;         /* [B, Hkv, M] */
    kvb_bf16 *Kbuf, *Vbuf;       /* [B, Hkv, NB, D] */
    int32_t *chunks, *offsets, *cnts; /* [B, Hkv, M], [B, Hkv, M], [B, Hkv] */
    float *m;                    /* [B, Hkv, Lm] */
    int32_t *slot, *len;         /* [B]: decode_start + gen, and one more */
    const int32_t *slot_host, *len_host;
    int32_t *bad;                /* batch_gemm_rotary's error word (zeroed each step), or NULL */
    void *ws_score;              /* shadowkv_workspace_bytes: score */
    void *ws_v, *ws_k;           /* shadowkv_workspace_bytes: gather each, zeroed once */
    void *ws_attn;               /* shadowkv_workspace_bytes: attn (a slice per chunk), zeroed once */
} shadowkv_buffers;

#define SHADOWKV_MAX_CHUNKS 4   /* chunks of the batch: min(4, B) */
#define SHADOWKV_FETCH_BLOCKS 64 /* the misses' grid: the host reads keep the link's rate on it */

struct shadowkv_path;

/* One chunk of the batch: sequences b0 .. b0 + ls.B - 1, its shapes and its pointers (offset to b0). */
typedef struct shadowkv_chunk {
    struct shadowkv_path *p;
    int b0;
    lms_shape ls;       /* landmark scoring over the chunk's sequences */
    gather_layout g;    /* the chunk's rows of the buffer and the host values */
    decode_layout d;    /* the chunk's rows of the buffer as decode_attn sees them */
    void *ws_v;         /* the chunk's own slice of ws_v: its compaction's row state persists per chunk */
    void *ws_attn;      /* the chunk's own slice of ws_attn */
} shadowkv_chunk;

typedef struct shadowkv_path {
    shadowkv_step_shape sh;
    shadowkv_buffers b;
    decode_layout buf;    /* the buffer as decode_attn and kv_append see it: L = NB */
    size_t ws_score_bytes;
    int n_chunks;
    shadowkv_chunk chunk[SHADOWKV_MAX_CHUNKS];
    const kvb_bf16 *q, *knew, *vnew;
    kvb_bf16 *o;
} shadowkv_path;

/* Workspaces: landmark scoring's, the compactions' (V's and K's each: gather_bytes, which holds a
 * slice per chunk for V), and attention's (a slice per chunk). */
int shadowkv_workspace_bytes(const shadowkv_step_shape *sh, size_t *score_bytes, size_t *gather_bytes,
                             size_t *attn_bytes);
/* Checks every stage's shape and the host copies (slot = decode_start + gen, len = slot + 1). */
int shadowkv_path_prepare(shadowkv_path *p, const shadowkv_step_shape *sh, const shadowkv_buffers *b);
/* As a block_attention's add_stages (kernels/step/step_block.h; ctx: a prepared path). */
int shadowkv_block_add_stages(void *ctx, kvb_step *step, const kvb_bf16 *q, const kvb_bf16 *knew,
                              const kvb_bf16 *vnew, kvb_bf16 *att);

#ifdef __cplusplus
}
#endif
#endif
