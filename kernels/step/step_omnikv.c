/* step_omnikv.c: see step_omnikv.h. */
#include "kernels/step/step_omnikv.h"

#include <string.h>

static const char *WHO = "omnikv_step";

static sparse_layout lists_layout(const omnikv_step_shape *sh) { return (sparse_layout){sh->cache, sh->n, 1}; }

size_t omnikv_attn_workspace_bytes(const omnikv_step_shape *sh)
{
    if (sh->filter) return decode_attn_workspace_bytes(&sh->cache);
    const sparse_layout s = lists_layout(sh);
    return sparse_attn_workspace_bytes(&s);
}

static int stage_append(void *ctx, cudaStream_t s)
{
    const omnikv_path *p = ctx;
    const omnikv_buffers *b = &p->buf;
    return kv_append(b->knew, b->vnew, b->pos, b->pos_host, b->K, b->V, &p->sh.cache, s);
}

static int stage_decode(void *ctx, cudaStream_t s)
{
    const omnikv_path *p = ctx;
    const omnikv_buffers *b = &p->buf;
    return decode_attn(b->q, b->K, b->V, b->len, b->len_host, b->o, &p->sh.cache, b->attn_ws, s);
}

static int stage_select(void *ctx, cudaStream_t s)
{
    const omnikv_path *p = ctx;
    const omnikv_buffers *b = &p->buf;
    /* the prompt rows only (len = ctx): the row kv_append writes on the other stream (pos >= ctx) is
     * not read */
    return omnikv_select(b->q, b->K, b->prompt, b->prompt_host, &p->select, p->sh.k, b->sel, b->scores, b->select_ws,
                         b->select_ws_bytes, s);
}

static int stage_sparse(void *ctx, cudaStream_t s)
{
    const omnikv_path *p = ctx;
    const omnikv_buffers *b = &p->buf;
    return sparse_attn_idx(b->q, b->K, b->V, b->len, b->len_host, b->idx, b->idx_host, b->cnt, b->cnt_host, b->o,
                           &p->att, b->attn_ws, 1, s);
}

/* One value in every entry of a host copy: what the plan assumes. */
static int host_all(const int32_t *v, int B, int want, const char *name, const char *why)
{
    if (!v) return kvb_fail(KVB_EINVAL, "%s: %s_host is NULL", WHO, name);
    for (int b = 0; b < B; b++)
        if (v[b] != want)
            return kvb_fail(KVB_EINVAL, "%s: %s[%d]=%d out of range [%d, %d]: %s", WHO, name, b, v[b], want, want, why);
    return KVB_OK;
}

int omnikv_path_prepare(omnikv_path *p, const omnikv_step_shape *sh, const omnikv_buffers *buf)
{
    memset(p, 0, sizeof *p);
    const decode_layout *d = &sh->cache;
    int rc = decode_layout_check(d, WHO);
    if (rc) return rc;
    KVB_CHECK_RANGE(WHO, "ctx", sh->ctx, 1, d->L - 1);
    const int L = (int)d->L;
    if ((rc = host_all(buf->pos_host, d->B, L - 1, "pos", "every sequence decodes the plan's last cache row")) ||
        (rc = host_all(buf->len_host, d->B, L, "len", "the step's attention covers pos + 1 tokens")))
        return rc;
    p->sh = *sh;
    p->buf = *buf;
    if (sh->filter) {
        p->select = (omnikv_layout){d->B, d->Hq, d->Hkv, d->D, L};
        if ((rc = omnikv_layout_check(&p->select, WHO)) ||
            (rc = host_all(buf->prompt_host, d->B, sh->ctx, "prompt", "the selector reads the ctx prompt rows")) ||
            (rc = omnikv_select_check(&p->select, buf->prompt_host, sh->k, WHO)))
            return rc;
        const size_t need = omnikv_select_workspace_bytes(&p->select);
        if (!buf->select_ws || buf->select_ws_bytes < need)
            return kvb_fail(KVB_EINVAL, "%s: select_ws_bytes=%zu out of range [%zu, ...) (or select_ws is NULL)", WHO,
                            buf->select_ws ? buf->select_ws_bytes : (size_t)0, need);
        return KVB_OK;
    }
    KVB_CHECK_RANGE(WHO, "n", sh->n, 1, L);
    p->att = lists_layout(sh);
    if ((rc = sparse_layout_check(&p->att, WHO)) ||
        (rc = host_all(buf->cnt_host, d->B, sh->n, "cnt", "every list's n entries are attended")))
        return rc;
    if (!buf->idx_host) return kvb_fail(KVB_EINVAL, "%s: idx_host is NULL (the lists are checked before launch)", WHO);
    return sparse_lists_check(&p->att, buf->len_host, buf->idx_host, buf->cnt_host, 0, WHO);
}

int omnikv_block_add_stages(void *ctx, kvb_step *step, const kvb_bf16 *q, const kvb_bf16 *knew, const kvb_bf16 *vnew,
                            kvb_bf16 *att)
{
    omnikv_path *p = ctx;
    p->buf.q = q, p->buf.knew = knew, p->buf.vnew = vnew, p->buf.o = att;
    if (!p->sh.filter) {
        if (kvb_step_add(step, "kv_append", 0, -1, stage_append, p) < 0 ||
            kvb_step_add(step, "sparse_attn_idx", 0, -1, stage_sparse, p) < 0)
            return KVB_EINVAL;
        return KVB_OK;
    }
    /* the selector waits for the main stream's last stage so far (in the block: rope_split, which
     * writes q); first in a step of its own, it waits for nothing but the step's fork */
    int producer = -1;
    for (int i = 0; i < step->n; i++)
        if (step->st[i].stream == 0) producer = i;
    if (kvb_step_add(step, "omnikv_select", 1, producer, stage_select, p) < 0 ||
        kvb_step_add(step, "kv_append", 0, -1, stage_append, p) < 0 ||
        kvb_step_add(step, "decode_attn", 0, -1, stage_decode, p) < 0)
        return KVB_EINVAL;
    return KVB_OK;
}
