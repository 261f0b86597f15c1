/* step_shadowkv.c: see step_shadowkv.h. */
#include "kernels/step/step_shadowkv.h"

#include <stdio.h>
#include <string.h>

#include "kernels/batch_gemm_rotary/batch_gemm_rotary.h"
#include "kernels/decode/decode.h"
#include "kernels/gather_copy/gather_copy.h"
#include "kernels/landmark_score/landmark_score.h"

static const char *WHO = "shadowkv_step";

static lms_shape score_shape(const shadowkv_step_shape *sh)
{
    return (lms_shape){sh->B, sh->Hq, sh->Hkv, sh->D, sh->L.Lm, sh->L.g.M};
}

static int chunk_count(int B) { return B < SHADOWKV_MAX_CHUNKS ? B : SHADOWKV_MAX_CHUNKS; }

/* Chunk j of n: sequences [j*B/n, (j+1)*B/n), sizes differing by at most one. */
static int chunk_first(int B, int n, int j) { return (int)((int64_t)j * B / n); }

static gather_layout chunk_layout(const shadowkv_step_shape *sh, int n, int j)
{
    gather_layout g = sh->L.g;
    g.B = chunk_first(sh->B, n, j + 1) - chunk_first(sh->B, n, j);
    return g;
}

/* A chunk's slice of a workspace, rounded so that every slice starts 256-byte aligned. */
static size_t slice_bytes(size_t n) { return (n + 255) & ~(size_t)255; }
static size_t chunk_ws_bytes(const gather_layout *g) { return slice_bytes(gather_copy_workspace_bytes(g)); }

static decode_layout chunk_decode_layout(const shadowkv_step_shape *sh, const gather_layout *g)
{
    return (decode_layout){g->B, sh->Hq, sh->Hkv, sh->D, g->NB};
}

int shadowkv_workspace_bytes(const shadowkv_step_shape *sh, size_t *score_bytes, size_t *gather_bytes,
                             size_t *attn_bytes)
{
    const lms_shape ls = score_shape(sh);
    const decode_layout d = {sh->B, sh->Hq, sh->Hkv, sh->D, sh->L.g.NB};
    /* V's compaction and attention take a slice per chunk, K's compaction the whole layout: for the
     * compactions the larger serves both */
    const int n = chunk_count(sh->B);
    size_t slices = 0, attn = 0;
    for (int j = 0; j < n; j++) {
        const gather_layout g = chunk_layout(sh, n, j);
        const decode_layout dc = chunk_decode_layout(sh, &g);
        slices += chunk_ws_bytes(&g);
        attn += slice_bytes(decode_attn_workspace_bytes(&dc));
    }
    const size_t whole = gather_copy_workspace_bytes(&sh->L.g), whole_attn = decode_attn_workspace_bytes(&d);
    *gather_bytes = slices > whole ? slices : whole;
    *attn_bytes = attn > whole_attn ? attn : whole_attn;
    return landmark_score_workspace_bytes(&ls, score_bytes);
}

/* The chunks' shapes, checked, and their slices of ws_v and ws_attn. */
static int plan_chunks(shadowkv_path *p)
{
    const shadowkv_step_shape *sh = &p->sh;
    p->n_chunks = chunk_count(sh->B);
    char *ws_v = p->b.ws_v, *ws_attn = p->b.ws_attn;
    for (int j = 0; j < p->n_chunks; j++) {
        shadowkv_chunk *c = &p->chunk[j];
        c->p = p;
        c->b0 = chunk_first(sh->B, p->n_chunks, j);
        c->g = chunk_layout(sh, p->n_chunks, j);
        c->ls = score_shape(sh);
        c->ls.B = c->g.B;
        c->d = chunk_decode_layout(sh, &c->g);
        c->ws_v = ws_v, c->ws_attn = ws_attn;
        ws_v += chunk_ws_bytes(&c->g);
        ws_attn += slice_bytes(decode_attn_workspace_bytes(&c->d));
        int rc = landmark_score_check(&c->ls, WHO);
        if (rc || (rc = gather_layout_check(&c->g, WHO)) || (rc = decode_layout_check(&c->d, WHO))) return rc;
    }
    return KVB_OK;
}

int shadowkv_path_prepare(shadowkv_path *p, const shadowkv_step_shape *sh, const shadowkv_buffers *b)
{
    memset(p, 0, sizeof *p);
    const lms_shape ls = score_shape(sh);
    int rc = landmark_score_check(&ls, WHO);
    if (rc || (rc = gather_layout_check(&sh->L.g, WHO))) return rc;
    p->buf = (decode_layout){sh->B, sh->Hq, sh->Hkv, sh->D, sh->L.g.NB};
    if ((rc = decode_layout_check(&p->buf, WHO))) return rc;
    if (sh->r > BGR_KERNEL_MAX_RANK)
        return kvb_fail(KVB_EINVAL, "%s: rank=%d out of range [1, %d]: batch_gemm_rotary's limit", WHO, sh->r,
                        BGR_KERNEL_MAX_RANK);
    if (!b->slot_host || !b->len_host)
        return kvb_fail(KVB_EINVAL, "%s: a host copy is NULL (slot_host=%p len_host=%p)", WHO,
                        (const void *)b->slot_host, (const void *)b->len_host);
    const int slot = sh->L.decode_start + sh->gen;
    for (int i = 0; i < sh->B; i++)
        if (b->slot_host[i] != slot || b->len_host[i] != slot + 1)
            return kvb_fail(KVB_EINVAL, "%s: slot[%d]=%d, len[%d]=%d out of range [%d, %d]: every sequence appends at "
                            "decode_start + gen and attends over one more row", WHO, i, b->slot_host[i], i,
                            b->len_host[i], slot, slot + 1);
    if ((rc = decode_positions_check(&p->buf, b->slot_host, WHO)) || (rc = decode_lengths_check(&p->buf, b->len_host, WHO)))
        return rc;
    if ((rc = landmark_score_workspace_bytes(&ls, &p->ws_score_bytes))) return rc;
    p->sh = *sh;
    p->b = *b;
    return plan_chunks(p);
}

/* ---- per chunk: the selection and the hits' compaction on stream 0, the misses' fetch on stream 1 ---- */

static int stage_score(void *ctx, cudaStream_t s)
{
    const shadowkv_chunk *c = ctx;
    const shadowkv_path *p = c->p;
    const shadowkv_step_shape *sh = &p->sh;
    const int64_t b0 = c->b0, lm_rows = b0 * sh->Hkv * sh->L.Lm;
    /* bad collects this step's flags (batch_gemm_rotary's); zeroed before the first chunk's scoring, ahead
     * of any fetch, by a kernel: a memset node held the graph's next kernel 12-53 us */
    int rc = b0 == 0 ? batch_gemm_rotary_clear_bad(p->b.bad, s) : KVB_OK;
    if (rc) return rc;
    /* the chunks run in order on stream 0, so they share the scoring workspace */
    const lms_args a = {p->q + b0 * sh->Hq * sh->D, p->b.landmarks + lm_rows * sh->D, p->b.landmark_idx + lm_rows,
                        p->b.chunks + b0 * sh->Hkv * sh->L.g.M, p->b.m + lm_rows, p->b.ws_score, p->ws_score_bytes};
    return landmark_score(&c->ls, &a, s);
}

static int stage_index_scan(void *ctx, cudaStream_t s)
{
    const shadowkv_chunk *c = ctx;
    const shadowkv_buffers *b = &c->p->b;
    const gather_layout *g = &c->g;
    const int64_t ids = (int64_t)c->b0 * g->Hkv * g->M;
    return index_scan(b->cached_ids + ids, b->chunks + ids, b->offsets + ids, b->cnts + (int64_t)c->b0 * g->Hkv,
                      g->B, g->Hkv, g->M, s);
}

static kvb_bf16 *chunk_buffer(const shadowkv_chunk *c, kvb_bf16 *buf)
{
    return buf + (int64_t)c->b0 * c->g.Hkv * c->g.NB * c->g.D;
}

static int stage_values_moved(void *ctx, cudaStream_t s)
{
    const shadowkv_chunk *c = ctx;
    const shadowkv_buffers *b = &c->p->b;
    const int64_t ids = (int64_t)c->b0 * c->g.Hkv * c->g.M;
    return gather_copy_d2d(chunk_buffer(c, b->Vbuf), b->offsets + ids, b->cnts + (int64_t)c->b0 * c->g.Hkv, &c->g,
                           c->ws_v, s);
}

static int stage_values_fetched(void *ctx, cudaStream_t s)
{
    const shadowkv_chunk *c = ctx;
    const shadowkv_buffers *b = &c->p->b;
    const gather_layout *g = &c->g;
    const int64_t ids = (int64_t)c->b0 * g->Hkv * g->M;
    const kvb_bf16 *Vh = b->Vh + (int64_t)c->b0 * g->Hkv * g->host_stride * gather_chunk_elems(g);
    return gather_copy_misses(Vh, chunk_buffer(c, b->Vbuf), b->offsets + ids, b->cnts + (int64_t)c->b0 * g->Hkv, g,
                              SHADOWKV_FETCH_BLOCKS, s);
}

/* One chunk (B = 1): nothing to overlap the fetch with, so the hits and misses move in one launch. */
static int stage_values(void *ctx, cudaStream_t s)
{
    const shadowkv_chunk *c = ctx;
    const shadowkv_buffers *b = &c->p->b;
    return gather_copy(b->Vh, b->Vbuf, b->offsets, b->cnts, &c->g, c->ws_v, s);
}

/* ---- over the whole batch, on stream 0 ---- */

static int stage_keys_moved(void *ctx, cudaStream_t s)
{
    shadowkv_path *p = ctx;
    return gather_copy_d2d(p->b.Kbuf, p->b.offsets, p->b.cnts, &p->sh.L.g, p->b.ws_k, s);
}

static int stage_keys_rebuilt(void *ctx, cudaStream_t s)
{
    shadowkv_path *p = ctx;
    /* the slot tags after index_scan are the chunk ids in slot order; bad was zeroed by stage_score */
    return batch_gemm_rotary(p->b.U, p->b.SV, p->b.cached_ids, p->b.cnts, p->b.cos_sin, &p->sh.L.g, p->sh.S, p->sh.r,
                             p->sh.max_pos, ROPE_LLAMA, p->b.Kbuf, p->b.bad, s);
}

static int stage_append(void *ctx, cudaStream_t s)
{
    shadowkv_path *p = ctx;
    return kv_append(p->knew, p->vnew, p->b.slot, p->b.slot_host, p->b.Kbuf, p->b.Vbuf, &p->buf, s);
}

/* ---- per chunk, on stream 0, once the chunk's values arrived ---- */

static int stage_attend(void *ctx, cudaStream_t s)
{
    const shadowkv_chunk *c = ctx;
    const shadowkv_path *p = c->p;
    const int64_t q0 = (int64_t)c->b0 * p->sh.Hq * p->sh.D;
    return decode_attn(p->q + q0, chunk_buffer(c, p->b.Kbuf), chunk_buffer(c, p->b.Vbuf), p->b.len + c->b0,
                       p->b.len_host + c->b0, p->o + q0, &c->d, c->ws_attn, s);
}

/* Adds a stage named "<name>_c<j>"; its index, or a negative error. */
static int add_chunk_stage(kvb_step *step, const char *name, int j, int stream, int after, kvb_stage_fn fn,
                           shadowkv_chunk *c)
{
    char full[48];
    snprintf(full, sizeof full, "%s_c%d", name, j);
    return kvb_step_add(step, full, stream, after, fn, c);
}

int shadowkv_block_add_stages(void *ctx, kvb_step *step, const kvb_bf16 *q, const kvb_bf16 *knew,
                              const kvb_bf16 *vnew, kvb_bf16 *att)
{
    shadowkv_path *p = ctx;
    p->q = q, p->knew = knew, p->vnew = vnew, p->o = att;
    int fetched[SHADOWKV_MAX_CHUNKS]; /* each chunk's fetch, which its attention waits for */
    if (p->n_chunks == 1) {
        shadowkv_chunk *c = &p->chunk[0];
        const int scan = kvb_step_add(step, "landmark_score", 0, -1, stage_score, c) < 0
                             ? -1
                             : kvb_step_add(step, "index_scan", 0, -1, stage_index_scan, c);
        fetched[0] = scan < 0 ? -1 : kvb_step_add(step, "gather_copy_V", 1, scan, stage_values, c);
        if (fetched[0] < 0) return KVB_EINVAL;
    }
    for (int j = 0; j < p->n_chunks && p->n_chunks > 1; j++) {
        shadowkv_chunk *c = &p->chunk[j];
        if (add_chunk_stage(step, "landmark_score", j, 0, -1, stage_score, c) < 0 ||
            add_chunk_stage(step, "index_scan", j, 0, -1, stage_index_scan, c) < 0)
            return KVB_EINVAL;
        const int moved = add_chunk_stage(step, "gather_copy_d2d_V", j, 0, -1, stage_values_moved, c);
        /* the fetches alternate between the two side streams, so that a chunk's fetch starts as soon as its
         * hits moved, beside the previous fetch's last blocks, and the link does not idle between them */
        fetched[j] = moved < 0 ? -1
                               : add_chunk_stage(step, "gather_copy_misses", j, 1 + (j & 1), moved,
                                                 stage_values_fetched, c);
        if (fetched[j] < 0) return KVB_EINVAL;
    }
    if (kvb_step_add(step, "gather_copy_d2d_K", 0, -1, stage_keys_moved, p) < 0 ||
        kvb_step_add(step, "batch_gemm_rotary", 0, -1, stage_keys_rebuilt, p) < 0 ||
        kvb_step_add(step, "kv_append", 0, -1, stage_append, p) < 0)
        return KVB_EINVAL;
    if (p->n_chunks == 1) return kvb_step_add(step, "decode_attn", 0, fetched[0], stage_attend, &p->chunk[0]) < 0 ? KVB_EINVAL : KVB_OK;
    /* each chunk's attention as soon as its values arrived: only the last chunk's follows the last fetch */
    for (int j = 0; j < p->n_chunks; j++)
        if (add_chunk_stage(step, "decode_attn", j, 0, fetched[j], stage_attend, &p->chunk[j]) < 0) return KVB_EINVAL;
    return KVB_OK;
}
