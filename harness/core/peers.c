/* peers.c: see peers.h. */
#include "harness/core/peers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reference/kvb.h"
#include "harness/core/json_read.h"
#include "harness/core/op.h"

static int bad_entry(const char *path, int i, const char *what)
{
    return kvb_fail(KVB_EINVAL, "%s: peers[%d]: %s", path, i, what);
}

int kvb_peers_load(const char *path, kvb_peers *p)
{
    memset(p, 0, sizeof *p);
    kvb_jval root;
    int rc = kvb_json_read_file(path, &root);
    if (rc) return rc;
    const kvb_jval *arr = kvb_jget(&root, "peers");
    if (!arr || arr->type != KVB_J_ARR) {
        kvb_json_free(&root);
        return kvb_fail(KVB_EINVAL, "%s: no \"peers\" array: not a peers file (harness/scripts/torch_peers.py writes one)", path);
    }
    const kvb_jval *ctx = kvb_jget(&root, "context");
    snprintf(p->source, sizeof p->source, "%s (%s, %s)", path, kvb_jstr(ctx, "torch") ? kvb_jstr(ctx, "torch") : "?",
             kvb_jstr(ctx, "gpu") ? kvb_jstr(ctx, "gpu") : "?");
    p->v = kvb_xalloc((size_t)(arr->n ? arr->n : 1), sizeof *p->v, "the peers' entries");
    if (!p->v) {
        kvb_json_free(&root);
        return KVB_ENOMEM;
    }
    for (int i = 0; i < arr->n; i++) {
        const kvb_jval *e = &arr->items[i];
        const kvb_jval *m = kvb_jget(e, "match");
        const char *kernel = kvb_jstr(e, "kernel"), *name = kvb_jstr(e, "peer");
        kvb_peer *q = &p->v[p->n];
        if (!kernel || !name || !m || m->type != KVB_J_OBJ || m->n > 16) rc = bad_entry(path, i, "needs kernel, peer and match (at most 16 keys)");
        else if (!(kvb_jnum(e, "median_us", -1) > 0)) rc = bad_entry(path, i, "median_us missing or not positive");
        if (rc) break;
        snprintf(q->kernel, sizeof q->kernel, "%s", kernel);
        snprintf(q->name, sizeof q->name, "%s", name);
        for (int k = 0; k < m->n; k++) {
            snprintf(q->keys[k], sizeof q->keys[k], "%s", m->keys[k]);
            q->vals[k] = m->items[k].num;
            if (m->items[k].type == KVB_J_STR) snprintf(q->strs[k], sizeof q->strs[k], "%s", m->items[k].str);
        }
        q->n_keys = m->n;
        q->median_us = kvb_jnum(e, "median_us", 0);
        q->min_us = kvb_jnum(e, "min_us", q->median_us);
        q->max_us = kvb_jnum(e, "max_us", q->median_us);
        q->noise_pct = kvb_jnum(e, "noise_pct", 0);
        q->samples = (int)kvb_jnum(e, "samples", 0);
        p->n++;
    }
    kvb_json_free(&root);
    if (rc) kvb_peers_free(p);
    return rc;
}

void kvb_peers_free(kvb_peers *p)
{
    kvb_xfree(p->v);
    memset(p, 0, sizeof *p);
}

static const kvb_param *param_of(const kvb_op *op, const char *name)
{
    for (int i = 0; i < op->n_params; i++)
        if (!strcmp(op->params[i].name, name)) return &op->params[i];
    return NULL;
}

static int matches(const kvb_peer *q, const kvb_case *c)
{
    if (strcmp(q->kernel, c->op->name)) return 0;
    for (int k = 0; k < q->n_keys; k++) {
        const kvb_param *par = param_of(c->op, q->keys[k]);
        if (!par) return 0;
        if (q->strs[k][0]) { /* a name matches an enumerated key only */
            if (par->type != KVB_P_ENUM || strcmp(kvb_case_enum(c, q->keys[k]), q->strs[k])) return 0;
        } else if (kvb_case_get(c, q->keys[k]) != q->vals[k])
            return 0;
    }
    return 1;
}

const kvb_peer *kvb_peer_match(const kvb_peers *p, const kvb_case *c, int i)
{
    for (int k = 0; p && k < p->n; k++)
        if (matches(&p->v[k], c) && i-- == 0) return &p->v[k];
    return NULL;
}

const kvb_peer *kvb_peer_find(const kvb_peers *p, const kvb_case *c, const char *name)
{
    const kvb_peer *q;
    for (int i = 0; (q = kvb_peer_match(p, c, i)); i++)
        if (!strcmp(q->name, name)) return q;
    return NULL;
}
