/* step_gather.c: see step_gather.h. */
#include "kernels/step/step_gather.h"

#include <string.h>

static int stage_index_scan(void *ctx, cudaStream_t s)
{
    gather_step_plan *p = ctx;
    return index_scan(p->cached_ids, p->new_ids, p->offsets, p->cnts, p->g.B, p->g.Hkv, p->g.M, s);
}

static int stage_keys(void *ctx, cudaStream_t s)
{
    gather_step_plan *p = ctx;
    return gather_copy_d2d(p->Kbuf, p->offsets, p->cnts, &p->g, p->ws_k, s);
}

static int stage_values(void *ctx, cudaStream_t s)
{
    gather_step_plan *p = ctx;
    return gather_copy(p->Vh, p->Vbuf, p->offsets, p->cnts, &p->g, p->ws_v, s);
}

int gather_step_plan_make(gather_step_plan *p, const char *name, const gather_layout *g, int32_t *cached_ids,
                          const int32_t *new_ids, int32_t *offsets, int32_t *cnts, const kvb_bf16 *Vh, kvb_bf16 *Vbuf,
                          kvb_bf16 *Kbuf, void *ws_v, void *ws_k, cudaStream_t s0, cudaStream_t s1, int timing)
{
    int rc = gather_layout_check(g, "gather_step");
    if (rc) return rc;
    memset(p, 0, sizeof *p);
    p->g = *g;
    p->cached_ids = cached_ids, p->new_ids = new_ids, p->offsets = offsets, p->cnts = cnts;
    p->Vh = Vh, p->Vbuf = Vbuf, p->Kbuf = Kbuf, p->ws_v = ws_v, p->ws_k = ws_k;
    kvb_step_init(&p->step, name, s0, s1);
    int scan = kvb_step_add(&p->step, "index_scan", 0, -1, stage_index_scan, p);
    if (scan < 0 || kvb_step_add(&p->step, "gather_copy_d2d_K", 1, scan, stage_keys, p) < 0 ||
        kvb_step_add(&p->step, "gather_copy_V", 0, -1, stage_values, p) < 0)
        return KVB_EINVAL;
    return kvb_step_finalize(&p->step, timing);
}

int gather_step_enqueue(gather_step_plan *p) { return kvb_step_enqueue(&p->step); }

void gather_step_plan_destroy(gather_step_plan *p) { kvb_step_destroy(&p->step); }
