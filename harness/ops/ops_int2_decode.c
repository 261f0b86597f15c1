/* ops_int2_decode.c: int2_decode_attn in the harness, the fused INT2 decode step (the contract:
 * kernels/int2/NOTES.md; helpers and input distributions: ops_int2.h).
 *
 * impl=kernel (the default) is int2_decode_attn (v3) over the kernel-native layout, which setup converts
 * from the interchange cache with the reference converter; v2 and v1 are the earlier fused versions over
 * the interchange layout, kept as same-run peers; dequant_dense (dequantize into a bf16 buffer, then the
 * suite's dense decode attention; validated against dense attention over that buffer's reference,
 * dequant_dense_reference) and dense_bf16 (dense decode attention over the same tokens
 * unquantized, validated against the dense reference) are the in-suite peers. The summary's speedups
 * compare these at equal shapes.
 *
 * The cases quantize the first T source tokens with the reference quantizer; the next R stay in the bf16
 * residual. Cache capacity Tcap = T rounded up to 256 (the fused kernels' granule); the cache past T
 * holds NaN metadata and all-ones codes, so that a read past T that is not masked fails.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness/core/ceilings.h"
#include "harness/ops/ops.h"
#include "harness/ops/ops_int2.h"
#if KVB_HAVE_CUDA
#include "kernels/decode/decode.h"
#include "kernels/int2/int2.h"
#endif

static const kvb_param attn_params[] = {
    K_B, K_HQ, K_HKV, K_D, K_GS, K_T, K_R, K_DIST, K_SEED,
    {"impl", KVB_P_ENUM, 0, 0, 0, NULL, "implementation (the impl table)"},
};

static int validate_attn(const kvb_case *c)
{
    int2_layout l = int2_op_layout(c);
    return int2_attn_check(&l, c->op->name);
}

/* ---- int2_decode_attn and its peers ---- */

/* One launch of each implementation (the impl table's launch entries). */
#if KVB_HAVE_CUDA
static void *dev_of(kvb_run *r, const char *name) { return kvb_run_find(r, name)->d; }

static int launch_attn(kvb_run *r)
{
    int2_priv *p = r->priv;
    int2_cache c = int2_op_cache(r, 1, 0);
    int2_native n = {dev_of(r, "Rec"), dev_of(r, "Km")};
    return int2_decode_attn(dev_of(r, "q"), &c, &n, dev_of(r, "o"), &p->l, dev_of(r, "workspace"), r->stream);
}

static int launch_attn_v2(kvb_run *r)
{
    int2_priv *p = r->priv;
    int2_cache c = int2_op_cache(r, 1, 0);
    return int2_decode_attn_v2(dev_of(r, "q"), &c, dev_of(r, "o"), &p->l, dev_of(r, "workspace"), r->stream);
}

static int launch_attn_v1(kvb_run *r)
{
    int2_priv *p = r->priv;
    int2_cache c = int2_op_cache(r, 1, 0);
    return int2_decode_attn_v1(dev_of(r, "q"), &c, dev_of(r, "o"), &p->l, dev_of(r, "workspace"), r->stream);
}

static int launch_dequant_dense(kvb_run *r)
{
    int2_priv *p = r->priv;
    int2_cache c = int2_op_cache(r, 1, 0);
    kvb_tensor *len = kvb_run_find(r, "len");
    void *Kd = dev_of(r, "Kd"), *Vd = dev_of(r, "Vd");
    int rc = int2_dequantize(&c, Kd, Vd, p->dense.L, &p->l, r->stream);
    return rc ? rc
              : decode_attn(dev_of(r, "q"), Kd, Vd, len->d, len->h, dev_of(r, "o"), &p->dense, dev_of(r, "dense_workspace"),
                            r->stream);
}

static int launch_dense_bf16(kvb_run *r)
{
    int2_priv *p = r->priv;
    kvb_tensor *len = kvb_run_find(r, "len");
    return decode_attn(dev_of(r, "q"), dev_of(r, "K"), dev_of(r, "V"), len->d, len->h, dev_of(r, "o"), &p->dense,
                       dev_of(r, "dense_workspace"), r->stream);
}
#else
/* one function each (the impl table tells the implementations apart by their launch) */
#define NO_DEVICE(fn)                                                                                              \
    static int fn(kvb_run *r)                                                                                      \
    {                                                                                                              \
        (void)r;                                                                                                   \
        return KVB_EDEVICE;                                                                                        \
    }
NO_DEVICE(launch_attn)
NO_DEVICE(launch_attn_v2)
NO_DEVICE(launch_attn_v1)
NO_DEVICE(launch_dequant_dense)
NO_DEVICE(launch_dense_bf16)
#endif

/* Implementations (impl=), the production kernel first (the default). None includes host work: each is
 * timed behind a blocking kernel with CUDA events (dequant_dense's two launches are both on the stream).
 * A version of the fused kernel is one row here, its kernel file and its cases. */
static const kvb_impl attn_impls[] = {
    {"kernel", launch_attn, 0,
     "int2_decode_attn (v3): the kernel-native layout, warp-owned bulk-copy rings, no block barrier per step"},
    {"v2", launch_attn_v2, 0, "int2_decode_attn_v2: codes as exact integers on the tensor cores, scales folded into q and p"},
    {"v1", launch_attn_v1, 0, "int2_decode_attn_v1: the first version, codes dequantized to fp16 before each MMA"},
    {"dequant_dense", launch_dequant_dense, 0, "peer: dequantize into bf16 K, V (int2_dequantize), then dense decode attention"},
    {"dense_bf16", launch_dense_bf16, 0, "peer: dense decode attention over the same tokens unquantized (dense reference)"},
};

/* The launch of the case's impl= (by name, through the table). */
static int (*attn_launch(const kvb_case *c))(kvb_run *)
{
    const char *name = kvb_case_enum(c, "impl");
    for (int i = 0; i < NPARAMS(attn_impls); i++)
        if (!strcmp(attn_impls[i].name, name)) return attn_impls[i].launch;
    return attn_impls[0].launch;
}

const char int2_v3_bits_vary[] = "int2_decode_attn v3's warps claim their 64-token steps from a shared counter, "
                                 "so the order of its fp32 sums varies between launches";

/* dequant_dense's reference: dense attention over the bf16 cache that its first launch writes
 * (ref_int2_dequantize), so that its check judges what its two launches compute. Rounding the dequantized
 * keys to bf16 moves the scores by up to 2^-9 of each key's size, more than the attention tolerance allows
 * where keys are large (dist=outlier at small T and D); how far it lands from the exact INT2 attention
 * (o_ref on entry) goes to the case's note. */
static int dequant_dense_reference(kvb_run *r, const kvb_bf16 *q, const int2_cache *c, kvb_bf16 *o_ref)
{
    int2_priv *p = r->priv;
    const int2_layout *l = &p->l;
    const int G = l->Hq / l->Hkv;
    const int64_t slices = (int64_t)l->B * l->Hkv, slice_len = (int64_t)G * l->D;
    const size_t kv_bytes = sizeof(kvb_bf16) * (size_t)(slices * p->dense.L * l->D);
    const size_t o_bytes = sizeof(kvb_bf16) * (size_t)(slices * slice_len);
    kvb_bf16 *Kd = kvb_run_alloc(r, kv_bytes, "the dequantized keys"), *Vd = kvb_run_alloc(r, kv_bytes, "the dequantized values");
    kvb_bf16 *exact = kvb_run_alloc(r, o_bytes, "the exact INT2 attention");
    memcpy(exact, o_ref, o_bytes);
    int rc = ref_int2_dequantize(c, Kd, Vd, p->dense.L, l);
    if (!rc) rc = ref_decode_attn(q, Kd, Vd, p->dense_len, o_ref, &p->dense, p->mask);
    if (!rc) {
        double diff2 = 0, ref2 = 0, max_abs = 0;
        for (int64_t sl = 0; sl < slices; sl++) {
            if (p->mask && !p->mask[sl]) continue;
            for (int64_t i = sl * slice_len; i < (sl + 1) * slice_len; i++) {
                const double e = kvb_bf16_to_double(exact[i]), d = kvb_bf16_to_double(o_ref[i]) - e;
                diff2 += d * d, ref2 += e * e;
                if (fabs(d) > max_abs) max_abs = fabs(d);
            }
        }
        const size_t used = strlen(r->note);
        snprintf(r->note + used, sizeof r->note - used, "%sreference over the bf16 cache it builds; from the exact INT2 "
                 "attention: rel L2 %.3g, max abs %.3g", used ? "; " : "", ref2 > 0 ? sqrt(diff2 / ref2) : sqrt(diff2),
                 max_abs);
    }
    kvb_run_free(r, Kd), kvb_run_free(r, Vd), kvb_run_free(r, exact);
    return rc;
}

static int setup_attn(kvb_run *r)
{
    int2_priv *p = int2_op_priv_new(r);
    const int2_layout *l = &p->l;
    const int G = l->Hq / l->Hkv;
    const int64_t heads = (int64_t)l->B * l->Hkv, n_src = l->T + l->R;
    int (*const launch)(kvb_run *) = attn_launch(r->c);
    const int dense = launch == launch_dense_bf16, dequant = launch == launch_dequant_dense;
    if (launch == launch_attn) r->nondeterministic = int2_v3_bits_vary;
    const int dist = int2_op_dist(r->c);
    int64_t sq[3] = {l->B, l->Hq, l->D}, skv[4] = {l->B, l->Hkv, n_src, l->D}, sl[1] = {l->B};
    kvb_tensor *q = kvb_run_tensor(r, "q", KVB_BF16, 3, sq, KVB_IN);
    int2_op_fill_q(q, r->c, r->seed);
    p->dense = (decode_layout){l->B, l->Hq, l->Hkv, l->D, n_src};
    kvb_bf16 *Ksrc, *Vsrc;
    kvb_tensor *Kt = NULL, *Vt = NULL;
    if (dense) { /* the sources are the inputs */
        Kt = kvb_run_tensor(r, "K", KVB_BF16, 4, skv, KVB_IN);
        Vt = kvb_run_tensor(r, "V", KVB_BF16, 4, skv, KVB_IN);
        Ksrc = Kt->h, Vsrc = Vt->h;
    } else {
        const size_t src_bytes = sizeof(kvb_bf16) * (size_t)(heads * n_src * l->D);
        Ksrc = kvb_run_alloc(r, src_bytes, "the source keys");
        Vsrc = kvb_run_alloc(r, src_bytes, "the source values");
    }
    int2_op_fill_kv(Ksrc, heads, n_src, l->D, dist, r->seed, "K", 1);
    int2_op_fill_kv(Vsrc, heads, n_src, l->D, dist, r->seed, "V", 0);
    if (dense || dequant) {
        kvb_tensor *len = kvb_run_tensor(r, "len", KVB_I32, 1, sl, KVB_IN);
        for (int b = 0; b < l->B; b++) ((int32_t *)len->h)[b] = (int32_t)n_src;
        p->dense_len = len->h;
    }
    int64_t ws[1] = {1}, dws[1] = {1};
#if KVB_HAVE_CUDA
    if (kvb_gpu_available()) {
        if (!dense) ws[0] = (int64_t)int2_decode_attn_workspace_bytes(l);
        if (dense || dequant) dws[0] = (int64_t)decode_attn_workspace_bytes(&p->dense);
    }
#endif
    if (!dense) kvb_run_tensor(r, "workspace", KVB_U8, 1, ws, KVB_SCRATCH);
    if (dense || dequant) kvb_run_tensor(r, "dense_workspace", KVB_U8, 1, dws, KVB_SCRATCH);
    if (dequant) {
        kvb_run_tensor(r, "Kd", KVB_BF16, 4, skv, KVB_SCRATCH);
        kvb_run_tensor(r, "Vd", KVB_BF16, 4, skv, KVB_SCRATCH);
    }
    kvb_tensor *o = kvb_run_tensor(r, "o", KVB_BF16, 3, sq, KVB_OUT);
    if (Kt && Kt->n > (1 << 26)) Kt->flags |= KVB_T_NO_DUMP, Vt->flags |= KVB_T_NO_DUMP;
    const char *names[1] = {"o"};
    const int64_t lens[1] = {(int64_t)G * l->D};
    int2_op_sample_slices(r, p, 2.0 * G * (double)n_src * l->D, names, 1, lens);
    int rc;
    if (dense) {
        rc = ref_decode_attn(q->h, Ksrc, Vsrc, p->dense_len, o->ref, &p->dense, p->mask);
    } else {
        int2_op_add_cache(r, l, KVB_IN, 1, 1, 1);
        int2_cache c = int2_op_cache(r, 0, 0);
        rc = int2_op_quantize_into(&c, l, Ksrc, Vsrc, n_src);
        if (!rc) {
            int2_op_fill_residual(&c, l, Ksrc, Vsrc, n_src, r->seed);
            rc = ref_int2_decode_attn(q->h, &c, o->ref, l, p->mask);
            if (!rc && dequant) rc = dequant_dense_reference(r, q->h, &c, o->ref);
        }
        if (!rc && launch == launch_attn) rc = int2_op_add_native_copy(r, l); /* the same cache, kernel-native */
        kvb_run_free(r, Ksrc), kvb_run_free(r, Vsrc);
    }
    return rc;
}

/* Bytes: the packed cache (2-bit codes, fp16 scale and zero) and the bf16 residual, q, o; for the
 * dense peer the bf16 K and V of the same tokens. Goal (kernels/int2/NOTES.md): every fused version at
 * >= 80% of the device read rate (the read-only ceiling) on its bytes from T = 8K on, and >= 3x faster
 * than dense_bf16 at the same shape (the summary's speedups). */
static void cost_attn(const kvb_run *r, kvb_cost *c)
{
    const int2_priv *p = r->priv;
    const int2_layout *l = &p->l;
    int (*const launch)(kvb_run *) = attn_launch(r->c);
    const int peer = launch == launch_dense_bf16 || launch == launch_dequant_dense;
    const double qo = 2.0 * 2.0 * l->B * l->Hq * l->D;
    if (launch == launch_dense_bf16) c->bytes_dev = 2.0 * 2.0 * l->B * l->Hkv * (double)(l->T + l->R) * l->D + qo;
    else c->bytes_dev = int2_cache_bytes(l) + qo;
    c->flops = 4.0 * l->B * l->Hq * (double)(l->T + l->R) * l->D;
    c->ceiling = KVB_CEIL_READ;
    if (!peer && l->T >= 8192 && r->ceil && r->ceil->measured) {
        c->goal_us = kvb_read_contiguous_seconds((size_t)c->bytes_dev) * 1e6 / 0.8;
        c->goal_text = "80% of the device read rate";
    }
}

/* q in; o out; the slice sample. dense_bf16: K, V and len in, the dense reference's scores per thread (a row
 * of T + R). The others: the sources (K and V of T + R tokens), the cache with its residual in, the
 * reference's scores per thread (G rows of T + R); len in (dequant_dense); Rec, Km in (the kernel). */
static size_t host_bytes_attn(const kvb_case *c)
{
    const int2_layout l = int2_op_layout(c);
    int (*const launch)(kvb_run *) = attn_launch(c);
    const double heads = (double)l.B * l.Hkv, n = (double)(l.T + l.R), G = l.Hq / l.Hkv;
    const double qo = 2.0 * l.B * l.Hq * l.D, kv = 2 * heads * n * l.D * 2;
    double bytes = KVB_HOLD_IN * qo + KVB_HOLD_OUT * qo + heads;
    if (launch == launch_dense_bf16)
        return kvb_host_bytes_sat(bytes + KVB_HOLD_IN * (kv + 4.0 * l.B) + kvb_ref_threads() * 8 * n);
    bytes += kv + KVB_HOLD_IN * int2_op_cache_host_bytes(&l, 1, 1, 1) + kvb_ref_threads() * 8 * G * n;
    if (launch == launch_dequant_dense) bytes += KVB_HOLD_IN * 4.0 * l.B;
    if (launch == launch_attn) bytes += KVB_HOLD_IN * int2_native_array_bytes(&l);
    return kvb_host_bytes_sat(bytes);
}

const kvb_op op_int2_decode_attn = {
    .name = "int2_decode_attn",
    .family = "int2",
    .summary = "fused INT2 decode attention (quantized tokens + bf16 residual), with peers",
    .params = attn_params,
    .n_params = NPARAMS(attn_params),
    .tol = {1e-2, 2e-2, 1e-2},
    .validate = validate_attn,
    .host_bytes = host_bytes_attn,
    .setup = setup_attn,
    KVB_IMPLS(attn_impls),
    .cost = cost_attn,
    .teardown = int2_op_teardown,
};
