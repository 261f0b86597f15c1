/* step_shadowkv.h: ShadowKV's decode-time attention path, the reference (kernels/step/NOTES.md, the
 * shadowkv method; kernels/landmark_score/NOTES.md, kernels/batch_gemm_rotary/NOTES.md,
 * kernels/gather_copy/NOTES.md). One layer, one step, the state of ShadowKV's prefill
 * (kernels/shadowkv/NOTES.md):
 *
 *   chunks   = landmark_score(q, landmarks, landmark_idx), M per (b, kv head), ascending
 *   index_scan(cached_ids, chunks) -> offsets, cnts; cached_ids = the chunk each sparse slot now holds
 *   Vbuf     : hits moved inside the buffer, misses fetched from the host values Vh (gather_copy)
 *   Kbuf     : hits moved (gather_copy_d2d), misses rebuilt from U x SV with RoPE (batch_gemm_rotary)
 *   knew, vnew appended at slot decode_start + gen (kv_append)
 *   att      = decode attention over the buffer's n_valid = decode_start + gen + 1 tokens:
 *              local window | outlier chunks | M sparse chunks | generated tokens
 *
 * The composition of the suite's references, each row (b, kv head) on its own so that a sampled
 * reference computes only the rows it compares.
 */
#ifndef REF_STEP_SHADOWKV_H
#define REF_STEP_SHADOWKV_H

#include "reference/batch_gemm_rotary.h"
#include "reference/landmark_score.h"
#include "reference/shadowkv.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ShadowKV's settings (chunk 8, 4 local chunks, 48 outlier chunks) and the room for
 * tokens generated during decode. */
enum { SKV_CHUNK = 8, SKV_LOCAL_CHUNKS = 4, SKV_OUTLIER_CHUNKS = 48, SKV_DECODE_CAPACITY = 64 };

typedef struct shadowkv_step_shape {
    int B, Hq, Hkv, D;
    int S;       /* prompt tokens */
    int r;       /* rank of the low-rank keys */
    int gen;     /* tokens generated before the step: the new token goes to slot decode_start + gen */
    int max_pos; /* rows of the RoPE table (>= S + gen + 1) */
    int n_hit;   /* chunks per (b, kv head) the step finds in its cache, by construction of the state */
    shadowkv_layout L; /* chunks, buffer [B, Hkv, NB, D] and host values (L.g) */
} shadowkv_step_shape;

/* Fill *sh from the model's heads and the step: budget tokens = M chunks of SKV_CHUNK (budget a
 * multiple of it), rank r in [1, min(S, Hkv*D)], hit in [0, 1], gen in [0, SKV_DECODE_CAPACITY).
 * Each refusal names the parameter and its range. */
int shadowkv_step_shape_make(shadowkv_step_shape *sh, int B, int Hq, int Hkv, int D, int S, int budget, int r,
                             double hit, int gen, int max_pos);

/* The layer's state: host arrays. */
typedef struct shadowkv_state {
    const kvb_bf16 *landmarks;    /* [B, Hkv, Lm, D] */
    const int32_t *landmark_idx;  /* [B, Hkv, Lm], each row strictly ascending */
    const kvb_bf16 *U, *SV;       /* [B, S, r], [B, Hkv, r, D] */
    const kvb_bf16 *cos_sin;      /* [max_pos, D] */
    const kvb_bf16 *Vh;           /* [B, Hkv, n_chunks, c, D]: the values of every chunk before the local window */
    int32_t *cached_ids;          /* [B, Hkv, M]: the chunk each sparse slot holds (in, out) */
    kvb_bf16 *Kbuf, *Vbuf;        /* [B, Hkv, NB, D] (in, out) */
} shadowkv_state;

/* The step's attention path on the rows (b, kv head) with rows[b * Hkv + h] != 0 (rows NULL: all):
 * chunks [B, Hkv, M] and m [B, Hkv, Lm] from landmark scoring; then index_scan, the buffer's fetch and
 * rebuild, the append and attention, from `use` (NULL: chunks; else a selection made elsewhere, the
 * device's, checked here: each row strictly ascending ids of the row's landmarks). offsets [B, Hkv, M],
 * cnts [B, Hkv]: index_scan's. att [B, Hq, D]. Rows not computed are left untouched, except that the
 * new token is appended in every row. */
int ref_shadowkv_step(const shadowkv_step_shape *sh, shadowkv_state *st, const kvb_bf16 *q, const kvb_bf16 *knew,
                      const kvb_bf16 *vnew, const int32_t *use, int32_t *chunks, float *m, int32_t *offsets,
                      int32_t *cnts, kvb_bf16 *att, const uint8_t *rows);

/* Bytes one step moves, each once (the step's bound, kernels/step/NOTES.md): device bytes read or
 * written (landmarks, their ids and scores, the index scan, hits moved in the buffer, U rows and SV for
 * the misses, the keys and values written, the buffer's n_valid rows read by attention, the append) and
 * host bytes (the missed value chunks); flops (scoring, the rebuild, attention). The hit count is n_hit
 * per row. */
void shadowkv_step_bytes(const shadowkv_step_shape *sh, double *dev, double *host, double *flops);

/* The state one sequence keeps for one layer: device (U, SV, landmarks and ids, the buffer's K and V,
 * the slot tags) and host (the values of every chunk). */
void shadowkv_state_bytes(const shadowkv_step_shape *sh, double *dev, double *host);

#ifdef __cplusplus
}
#endif
#endif
