/* step_shadowkv.c: see step_shadowkv.h. */
#include "reference/step/step_shadowkv.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "reference/decode.h"

int shadowkv_step_shape_make(shadowkv_step_shape *sh, int B, int Hq, int Hkv, int D, int S, int budget, int r,
                             double hit, int gen, int max_pos)
{
    const char *who = "decode_step method=shadowkv";
    memset(sh, 0, sizeof *sh);
    if (budget < SKV_CHUNK || budget % SKV_CHUNK)
        return kvb_fail(KVB_EINVAL, "%s: budget=%d out of range [%d, ...], a multiple of the chunk (%d tokens)", who,
                        budget, SKV_CHUNK, SKV_CHUNK);
    if (budget > S)
        return kvb_fail(KVB_EINVAL, "%s: budget=%d out of range [%d, ctx = %d]: a budget larger than the context", who,
                        budget, SKV_CHUNK, S);
    const int max_r = S < Hkv * D ? S : Hkv * D;
    if (r < 1 || r > max_r)
        return kvb_fail(KVB_EINVAL, "%s: rank=%d out of range [1, min(ctx, Hkv*D) = %d]", who, r, max_r);
    if (!(hit >= 0 && hit <= 1)) return kvb_fail(KVB_EINVAL, "%s: hit=%g out of range [0, 1]", who, hit);
    if (gen < 0 || gen >= SKV_DECODE_CAPACITY)
        return kvb_fail(KVB_EINVAL, "%s: gen=%d out of range [0, %d]: the buffer's room for generated tokens", who, gen,
                        SKV_DECODE_CAPACITY - 1);
    if (max_pos < S + gen + 1)
        return kvb_fail(KVB_EINVAL, "%s: max_pos=%d out of range [ctx + gen + 1 = %d, ...]: the RoPE table", who,
                        max_pos, S + gen + 1);
    /* the layout's own checks name its derived sizes (outlier_chunks, M): the keys that set them first */
    const int min_S = (SKV_LOCAL_CHUNKS + SKV_OUTLIER_CHUNKS + 1) * SKV_CHUNK;
    if (S < min_S)
        return kvb_fail(KVB_EINVAL, "%s: ctx=%d out of range [(local + outlier + 1 chunks) * %d = %d, ...]: the prompt "
                        "keeps %d local and %d outlier chunks of %d tokens and at least one landmark chunk", who, S,
                        SKV_CHUNK, min_S, SKV_LOCAL_CHUNKS, SKV_OUTLIER_CHUNKS, SKV_CHUNK);
    const int Lm = S / SKV_CHUNK - SKV_LOCAL_CHUNKS - SKV_OUTLIER_CHUNKS;
    const int max_M = Lm < GATHER_MAX_M ? Lm : GATHER_MAX_M;
    if (budget / SKV_CHUNK > max_M)
        return kvb_fail(KVB_EINVAL, "%s: budget=%d out of range [%d, %d * min(%d, landmark chunks %d) = %d]: the sparse "
                        "slots hold distinct landmark chunks", who, budget, SKV_CHUNK, SKV_CHUNK, GATHER_MAX_M, Lm,
                        SKV_CHUNK * max_M);
    int rc = shadowkv_layout_make(&sh->L, B, Hkv, D, S, SKV_CHUNK, SKV_LOCAL_CHUNKS, SKV_OUTLIER_CHUNKS,
                                  budget / SKV_CHUNK, SKV_DECODE_CAPACITY);
    if (rc) return rc;
    /* the step finds n_hit of its M chunks cached; the other slots hold other landmark chunks (or none) */
    sh->n_hit = (int)lround(hit * sh->L.g.M);
    sh->B = B, sh->Hq = Hq, sh->Hkv = Hkv, sh->D = D, sh->S = S, sh->r = r, sh->gen = gen, sh->max_pos = max_pos;
    return KVB_OK;
}

/* Each row of a selection made elsewhere: M strictly ascending ids of the row's landmarks. */
static int selection_check(const shadowkv_step_shape *sh, const int32_t *landmark_idx, const int32_t *use,
                           const uint8_t *rows)
{
    const int M = sh->L.g.M, Lm = sh->L.Lm;
    for (int64_t row = 0; row < (int64_t)sh->B * sh->Hkv; row++) {
        if (rows && !rows[row]) continue;
        const int32_t *sel = use + row * M, *ids = landmark_idx + row * Lm;
        int l = 0;
        for (int i = 0; i < M; i++) {
            while (l < Lm && ids[l] < sel[i]) l++;
            if (l == Lm || ids[l] != sel[i] || (i > 0 && sel[i] <= sel[i - 1]))
                return kvb_fail(KVB_EINVAL, "shadowkv step: chunks[%lld][%d]=%d is not a strictly ascending landmark "
                                "chunk of its row", (long long)row, i, sel[i]);
        }
    }
    return KVB_OK;
}

int ref_shadowkv_step(const shadowkv_step_shape *sh, shadowkv_state *st, const kvb_bf16 *q, const kvb_bf16 *knew,
                      const kvb_bf16 *vnew, const int32_t *use, int32_t *chunks, float *m, int32_t *offsets,
                      int32_t *cnts, kvb_bf16 *att, const uint8_t *rows)
{
    const shadowkv_layout *L = &sh->L;
    const gather_layout *g = &L->g;
    const int B = sh->B, Hkv = sh->Hkv, D = sh->D, M = g->M, NB = g->NB;
    const lms_shape ls = {B, sh->Hq, Hkv, D, L->Lm, M};
    /* 1. landmark scoring (always: its scores judge a selection made elsewhere) */
    int rc = ref_landmark_score(q, st->landmarks, st->landmark_idx, &ls, L->n_chunks, rows, chunks, m);
    if (rc) return rc;
    if (use && (rc = selection_check(sh, st->landmark_idx, use, rows))) return rc;
    const int32_t *sel = use ? use : chunks;
    /* 2. per row: index_scan, values fetched, hit keys moved (a 1 x 1 layout over the row's memory) */
    gather_layout one = *g;
    one.B = 1, one.Hkv = 1;
    const int64_t chunk = (int64_t)g->c * D;
    for (int64_t row = 0; row < (int64_t)B * Hkv && !rc; row++) {
        if (rows && !rows[row]) continue;
        int32_t *cached = st->cached_ids + row * M, *off = offsets + row * M;
        kvb_bf16 *kb = st->Kbuf + row * NB * D, *vb = st->Vbuf + row * NB * D;
        rc = ref_index_scan(cached, sel + row * M, off, cnts + row, 1, 1, M);
        if (!rc) rc = ref_gather_copy(st->Vh + row * g->host_stride * chunk, vb, off, cnts + row, &one);
        if (!rc) rc = ref_gather_copy_d2d(kb, off, cnts + row, &one);
    }
    if (rc) return rc;
    /* 3. the missed keys rebuilt from the low-rank factors, with RoPE at their positions */
    rc = ref_batch_gemm_rotary_sampled(st->U, st->SV, st->cached_ids, cnts, st->cos_sin, g, sh->S, sh->r, sh->max_pos,
                                       ROPE_LLAMA, rows, st->Kbuf);
    if (rc) return rc;
    /* 4. the new token appended after the generated ones, 5. attention over the valid rows */
    const decode_layout d = {B, sh->Hq, Hkv, D, NB};
    int32_t *slot = kvb_xalloc(2 * (size_t)B, sizeof(int32_t), "ref_shadowkv_step positions");
    if (!slot) return KVB_ENOMEM;
    int32_t *len = slot + B;
    for (int b = 0; b < B; b++) slot[b] = L->decode_start + sh->gen, len[b] = slot[b] + 1;
    rc = ref_kv_append(knew, vnew, slot, st->Kbuf, st->Vbuf, &d);
    if (!rc) rc = ref_decode_attn(q, st->Kbuf, st->Vbuf, len, att, &d, rows);
    kvb_xfree(slot);
    return rc;
}

void shadowkv_step_bytes(const shadowkv_step_shape *sh, double *dev, double *host, double *flops)
{
    const shadowkv_layout *L = &sh->L;
    const double rows = (double)sh->B * sh->Hkv, D = sh->D, M = L->g.M, c = L->c, r = sh->r;
    const double hit_tok = sh->n_hit * c, miss_tok = (M - sh->n_hit) * c, key = 2.0 * D;
    const double n_valid = L->decode_start + sh->gen + 1.0;
    double bytes = 0;
    bytes += rows * L->Lm * (key + 4.0 + 4.0);          /* landmarks and their ids read, the scores m written */
    bytes += rows * M * 4.0 * 4.0;                      /* index_scan: tags read and written, offsets, chunks */
    bytes += rows * hit_tok * 2.0 * key * 2.0;          /* hit keys and values moved: read + write */
    bytes += rows * (miss_tok * (2.0 * r + key) + r * key); /* rebuild: a U row per miss token, the key written, SV */
    bytes += rows * miss_tok * key;                     /* the fetched values written */
    bytes += rows * n_valid * 2.0 * key;                /* attention reads K and V of the valid rows */
    bytes += rows * 2.0 * key;                          /* the append */
    *dev = bytes;
    *host = rows * miss_tok * key; /* the missed value chunks over PCIe */
    *flops = 2.0 * sh->B * sh->Hq * L->Lm * D + rows * miss_tok * 2.0 * r * D + 4.0 * sh->B * sh->Hq * n_valid * D;
}

void shadowkv_state_bytes(const shadowkv_step_shape *sh, double *dev, double *host)
{
    const shadowkv_layout *L = &sh->L;
    const double Hkv = sh->Hkv, D = sh->D;
    *dev = 2.0 * sh->S * sh->r + 2.0 * Hkv * sh->r * D             /* U, SV */
           + Hkv * L->Lm * (2.0 * D + 4.0)                          /* landmarks, their chunk ids */
           + 2.0 * 2.0 * Hkv * L->g.NB * D + 4.0 * Hkv * L->g.M;   /* the buffer's K and V, the slot tags */
    *host = 2.0 * Hkv * (double)L->n_chunks * L->c * D;            /* the values of every chunk */
}
