/* step_minikv.c: see step_minikv.h. */
#include "kernels/step/step_minikv.h"

#include <string.h>

size_t minikv_workspace_bytes(const int2_layout *before)
{
    const int2_layout a = int2_after_append(before);
    return int2_decode_attn_workspace_bytes(&a);
}

int minikv_path_prepare(minikv_path *p, const int2_layout *before, const int2_cache *c, const int2_native *n, void *ws)
{
    const char *who = "minikv_step";
    memset(p, 0, sizeof *p);
    int rc = int2_append_check(before, who);
    if (rc) return rc;
    p->before = *before;
    p->after = int2_after_append(before);
    if ((rc = int2_attn_check(&p->after, who))) return rc;
    if (before->Tcap % INT2_TCAP_GRANULE)
        return kvb_fail(KVB_EINVAL, "%s: Tcap=%lld is not a multiple of %d (the fused kernels' tile)", who,
                        (long long)before->Tcap, INT2_TCAP_GRANULE);
    p->c = *c;
    if (n) {
        if (!n->Rec || !n->Km) return kvb_fail(KVB_EINVAL, "%s: a native cache pointer (Rec, Km) is NULL", who);
        const int64_t step = before->gs > 64 ? before->gs : 64;
        if (p->after.T > before->T && before->T % step)
            return kvb_fail(KVB_EINVAL, "%s: the append flushes at T=%lld, out of range for the native cache: a "
                            "multiple of max(64, gs) = %lld", who, (long long)before->T, (long long)step);
        p->n = *n;
    }
    p->ws = ws;
    return KVB_OK;
}

static int stage_append(void *ctx, cudaStream_t s)
{
    const minikv_path *p = ctx;
    if (p->n.Rec) return int2_append_native(&p->c, &p->n, p->knew, p->vnew, &p->before, s);
    return int2_append(&p->c, p->knew, p->vnew, &p->before, s);
}

static int stage_attend(void *ctx, cudaStream_t s)
{
    const minikv_path *p = ctx;
    if (p->n.Rec) return int2_decode_attn(p->q, &p->c, &p->n, p->o, &p->after, p->ws, s);
    return int2_decode_attn_v2(p->q, &p->c, p->o, &p->after, p->ws, s);
}

int minikv_block_add_stages(void *ctx, kvb_step *step, const kvb_bf16 *q, const kvb_bf16 *knew, const kvb_bf16 *vnew,
                            kvb_bf16 *att)
{
    minikv_path *p = ctx;
    p->q = q, p->knew = knew, p->vnew = vnew, p->o = att;
    const int flush = p->after.T > p->before.T;
    const char *name = !flush ? "int2_append" : p->n.Rec ? "int2_append+flush+native" : "int2_append+flush";
    if (kvb_step_add(step, name, 0, -1, stage_append, p) < 0 ||
        kvb_step_add(step, "int2_decode_attn", 0, -1, stage_attend, p) < 0)
        return KVB_EINVAL;
    return KVB_OK;
}
