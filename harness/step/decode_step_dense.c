/* decode_step_dense.c: decode_step method=dense (decode_step.h): the whole cache K, V [B, Hkv, pos + 1, D]
 * on the device; the new token's k, v appended at row pos = ctx + gen (kv_append), then decode attention
 * over pos + 1 tokens (decode_attn). The cache's first pos rows are seeded normal activations. */
#include <stdlib.h>
#include <string.h>

#include "harness/step/decode_step.h"
#include "harness/ops/ops.h"
#if KVB_HAVE_CUDA
#include "kernels/decode/decode.h"
#endif

static int shape_dense(const kvb_case *c, step_case *s)
{
    if (kvb_case_int(c, "all"))
        return kvb_fail(KVB_EINVAL, "decode_step method=dense: all=1 out of range [0, 0]: dense attends every token");
    /* the suite's cap: the host holds the cache three times (input, reference, the device's copy) */
    const double per_seq = 4.0 * s->m->Hkv * s->m->D * (double)s->L;
    if (per_seq * s->B > 24e9)
        return kvb_fail(KVB_EINVAL, "decode_step method=dense: K and V take %.1f GB at B=%d, out of range [0, 24 GB]: "
                        "at most B=%d fits at ctx=%d", per_seq * s->B * 1e-9, s->B, (int)(24e9 / per_seq), s->ctx);
    return KVB_OK;
}

static int setup_dense(kvb_run *r, step_priv *p)
{
    const block_preset *m = p->s.m;
    const int B = p->s.B;
    kvb_tensor *len = step_tensor(r, "len", KVB_I32, 1, B, 0, 0, 0, KVB_IN);
    step_fill_ints(len, (int)p->s.L);
    kvb_tensor *K = step_tensor(r, "K", KVB_BF16, 4, B, m->Hkv, p->s.L, m->D, KVB_INOUT);
    kvb_tensor *V = step_tensor(r, "V", KVB_BF16, 4, B, m->Hkv, p->s.L, m->D, KVB_INOUT);
    K->flags |= KVB_T_NO_DUMP, V->flags |= KVB_T_NO_DUMP;
    K->cmp = V->cmp = KVB_CMP_EXACT; /* the append of the device's own knew, vnew */
    kvb_fill_bf16_normal(K->h, K->n, r->seed, kvb_stream_of("K"), 0, 0, 1);
    kvb_fill_bf16_normal(V->h, V->n, r->seed, kvb_stream_of("V"), 0, 0, 1);
    size_t ws = 1;
#if KVB_HAVE_CUDA
    if (kvb_gpu_available()) {
        const decode_layout d = {B, m->Hq, m->Hkv, m->D, p->s.L};
        ws = decode_attn_workspace_bytes(&d);
    }
#endif
    step_tensor(r, "attn_ws", KVB_U8, 1, (int64_t)ws, 0, 0, 0, KVB_SCRATCH);
    return KVB_OK;
}

static int ref_attend_dense(kvb_run *r, step_priv *p, const kvb_bf16 *q, const kvb_bf16 *knew, const kvb_bf16 *vnew,
                            kvb_bf16 *att)
{
    const block_preset *m = p->s.m;
    const decode_layout d = {p->s.B, m->Hq, m->Hkv, m->D, p->s.L};
    kvb_tensor *K = kvb_run_find(r, "K"), *V = kvb_run_find(r, "V");
    step_ref_reset(K), step_ref_reset(V);
    int rc = ref_kv_append(knew, vnew, kvb_run_find(r, "pos")->h, K->ref, V->ref, &d);
    return rc ? rc : ref_decode_attn(q, K->ref, V->ref, kvb_run_find(r, "len")->h, att, &d, p->kv_slices);
}

/* the new row written, every row read once */
static void bytes_dense(const kvb_run *r, const step_priv *p, double *dev, double *host, double *flops)
{
    (void)r;
    const block_preset *m = p->s.m;
    *dev = 2.0 * 2.0 * p->s.B * m->Hkv * m->D * (double)p->s.L;
    *host = 0;
    *flops = 4.0 * p->s.B * m->Hq * m->D * (double)p->s.L;
}

static void state_dense(const step_case *s, double *dev, double *host)
{
    *dev = 2.0 * 2.0 * s->m->Hkv * s->m->D * (double)s->L;
    *host = 0;
}

/* len in; K, V in and out; the reference's scores per thread */
static double host_bytes_dense(const step_case *s)
{
    return 4.0 * s->B + KVB_HOLD_INOUT * 2 * 2.0 * s->B * s->m->Hkv * (double)s->L * s->m->D +
           kvb_ref_threads() * 8.0 * (double)s->L;
}

const step_method step_method_dense = {
    .name = "dense",
    .about = "K, V of every token on the device; kv_append, decode_attn",
    .shape = shape_dense,
    .setup = setup_dense,
    .ref_attend = ref_attend_dense,
    .bytes = bytes_dense,
    .state_bytes = state_dense,
    .host_bytes = host_bytes_dense,
};
