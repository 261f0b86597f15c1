/* step_rocketkv.c: see step_rocketkv.h. */
#include "kernels/step/step_rocketkv.h"

#include <string.h>

static const char *WHO = "rocketkv_step";

void rocketkv_workspace_bytes(const rocketkv_shape *sh, size_t *score_bytes, size_t *attn_bytes)
{
    page_layout meta, score;
    sparse_layout att;
    decode_layout cache;
    rocketkv_layouts(sh, &meta, &score, &att, &cache);
    *score_bytes = hybrid_score_workspace_bytes(&score);
    *attn_bytes = sparse_attn_workspace_bytes(&att);
}

/* The new key's page bounds (page_meta_append) and the new key and value's cache rows (kv_append) are
 * written by the scoring kernel's block that reads that page: two dependent launches less (the score
 * layout's L = t + 1 holds position t). */
static int stage_score(void *ctx, cudaStream_t s)
{
    rocketkv_step_plan *p = ctx;
    const rocketkv_buffers *b = &p->buf;
    size_t ws_bytes, unused;
    rocketkv_workspace_bytes(&p->sh, &ws_bytes, &unused);
    const hybrid_append app = {b->knew, b->vnew, b->t, b->t_host, b->kmin, b->kmax, b->K, b->V, p->cache.L};
    return hybrid_score_append(b->q, &app, &p->score, p->sh.r, p->sh.k, b->u, b->pages, NULL, b->ws_score, ws_bytes, s);
}

static int stage_attend(void *ctx, cudaStream_t s)
{
    rocketkv_step_plan *p = ctx;
    const rocketkv_buffers *b = &p->buf;
    /* pages_host NULL: the list is hybrid_score's, made on the device, ascending and inside the cache */
    return sparse_attn_pages(b->q, b->K, b->V, b->len, b->len_host, b->pages, NULL, b->cnt, b->cnt_host, b->o, &p->att,
                             b->ws_attn, 1, s);
}

/* The host copies must say what the plan assumes: one position t, len = t + 1, ceil(k / P) pages. */
static int host_values_check(const rocketkv_shape *sh, const rocketkv_buffers *b)
{
    if (!b->t_host || !b->len_host || !b->cnt_host)
        return kvb_fail(KVB_EINVAL, "%s: a host copy is NULL (t_host=%p len_host=%p cnt_host=%p)", WHO,
                        (const void *)b->t_host, (const void *)b->len_host, (const void *)b->cnt_host);
    const int n_sel = hybrid_selected_pages(sh->k, sh->P);
    for (int i = 0; i < sh->B; i++) {
        if (b->t_host[i] != sh->t)
            return kvb_fail(KVB_EINVAL, "%s: t[%d]=%d out of range [%d, %d]: every sequence decodes at the plan's t", WHO,
                            i, b->t_host[i], sh->t, sh->t);
        if (b->len_host[i] != sh->t + 1)
            return kvb_fail(KVB_EINVAL, "%s: len[%d]=%d out of range [%d, %d]: the step attends over t + 1 tokens", WHO,
                            i, b->len_host[i], sh->t + 1, sh->t + 1);
        if (b->cnt_host[i] != n_sel)
            return kvb_fail(KVB_EINVAL, "%s: cnt[%d]=%d out of range [%d, %d]: ceil(k / P) pages are attended", WHO, i,
                            b->cnt_host[i], n_sel, n_sel);
    }
    return KVB_OK;
}

int rocketkv_path_prepare(rocketkv_step_plan *p, const rocketkv_shape *sh, const rocketkv_buffers *buf)
{
    memset(p, 0, sizeof *p);
    int rc = rocketkv_shape_check(sh);
    if (rc || (rc = host_values_check(sh, buf))) return rc;
    p->sh = *sh;
    p->buf = *buf;
    rocketkv_layouts(sh, &p->meta, &p->score, &p->att, &p->cache);
    return KVB_OK;
}

int rocketkv_add_stages(rocketkv_step_plan *p, kvb_step *step)
{
    if (kvb_step_add(step, "append+hybrid_score+page_topk", 0, -1, stage_score, p) < 0 ||
        kvb_step_add(step, "sparse_attn_pages", 0, -1, stage_attend, p) < 0)
        return KVB_EINVAL;
    return KVB_OK;
}

int rocketkv_block_add_stages(void *ctx, kvb_step *step, const kvb_bf16 *q, const kvb_bf16 *knew, const kvb_bf16 *vnew,
                              kvb_bf16 *att)
{
    rocketkv_step_plan *p = ctx;
    p->buf.q = q, p->buf.knew = knew, p->buf.vnew = vnew, p->buf.o = att;
    return rocketkv_add_stages(p, step);
}

int rocketkv_step_plan_make(rocketkv_step_plan *p, const char *name, const rocketkv_shape *sh,
                            const rocketkv_buffers *buf, cudaStream_t s0, cudaStream_t s1, int timing)
{
    int rc = rocketkv_path_prepare(p, sh, buf);
    if (rc) return rc;
    kvb_step_init(&p->step, name, s0, s1);
    if ((rc = rocketkv_add_stages(p, &p->step))) return rc;
    return kvb_step_finalize(&p->step, timing);
}

int rocketkv_step_enqueue(rocketkv_step_plan *p) { return kvb_step_enqueue(&p->step); }

void rocketkv_step_plan_destroy(rocketkv_step_plan *p) { kvb_step_destroy(&p->step); }
