/* decode_step_minikv.c: decode_step method=minikv (decode_step.h; the path: kernels/step/step_minikv.h). At
 * the end of prefill MiniKV keeps the heavy hitters and the recent window, floor(ctx / 4) tokens each (its
 * setting heavy = recent = 0.25; the mean layer of its pyramid), and stores them in 2 bits
 * (kernels/int2/NOTES.md, gs = 16). With the gen tokens decoded since, the cache holds n = N + gen tokens:
 * the first T = n - n mod 128 quantized, the last n mod 128 in the bf16 residual (a flush every 128). The
 * kept tokens are seeded normal activations (which prompt tokens were kept does not change the step's
 * work); the device's cache is quantized from them by the suite's int2_quantize kernels, the host's by
 * their references, and the comparison holds the one to the other.
 * The step: int2_append_native (a flush when the residual reaches 128, into both the interchange and
 * the native cache), int2_decode_attn (v3) over the native cache.
 *
 * Invariant: with fewer than 128 tokens cached the cache is all residual, and the path must equal dense
 * attention over those bf16 rows (within one bf16 rounding: the two references sum in different orders).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness/step/decode_step.h"
#include "harness/ops/ops.h"
#include "harness/ops/ops_int2.h"
#if KVB_HAVE_CUDA
#include "kernels/step/step_minikv.h"
#endif

enum { MK_GS = 16, MK_RCAP = INT2_FLUSH + MK_GS, MK_TCAP_GRANULE = 256 };

static int shape_mk(const kvb_case *c, step_case *s)
{
    (void)c;
    if (s->all)
        return kvb_fail(KVB_EINVAL, "decode_step method=minikv: all=1 out of range [0, 0]: the invariant is the "
                        "residual-only cache (fewer than 128 tokens cached: ctx / 4 * 2 + gen < 128)");
    s->mk_kept = 2 * (int64_t)(s->ctx / 4);
    const int64_t n = s->mk_kept + s->gen, T = n - n % INT2_FLUSH;
    /* room for the flush, in the fused kernels' 256-token tiles */
    const int64_t Tcap = (T + INT2_FLUSH + MK_TCAP_GRANULE - 1) / MK_TCAP_GRANULE * MK_TCAP_GRANULE;
    s->mk = (int2_layout){.B = s->B, .Hkv = s->m->Hkv, .Hq = s->m->Hq, .D = s->m->D, .gs = MK_GS, .Tcap = Tcap, .T = T,
                          .Rcap = MK_RCAP, .R = (int)(n - T)};
    int rc = int2_append_check(&s->mk, "decode_step method=minikv");
    if (rc) return rc;
    const double per_seq = 4.0 * s->m->Hkv * s->m->D * (double)n;
    if (per_seq * s->B > 8e9)
        return kvb_fail(KVB_EINVAL, "decode_step method=minikv: the kept activations take %.1f GB at B=%d, out of "
                        "range [0, 8 GB]: at most B=%d fits at ctx=%d", per_seq * s->B * 1e-9, s->B,
                        (int)(8e9 / per_seq), s->ctx);
    return KVB_OK;
}

static kvb_tensor *cache_tensor(kvb_run *r, const char *name, kvb_dtype dt, int64_t a, int64_t b, int64_t c, int64_t d)
{
    kvb_tensor *t = step_tensor(r, name, dt, 4, a, b, c, d, KVB_INOUT);
    t->cmp = KVB_CMP_EXACT; /* quantized from the same bf16 values, appended from the device's own k, v */
    t->flags |= KVB_T_NO_DUMP;
    return t;
}

static int2_cache host_cache(kvb_run *r, int ref)
{
#define A(name) (ref ? kvb_run_find(r, name)->ref : kvb_run_find(r, name)->h)
    return (int2_cache){A("Kq"), A("Ks"), A("Kz"), A("Vq"), A("Vs"), A("Vz"), A("Kr"), A("Vr")};
#undef A
}

static int setup_mk(kvb_run *r, step_priv *p)
{
    const int2_layout *l = &p->s.mk;
    const int2_layout after = int2_after_append(l);
    r->nondeterministic = int2_v3_bits_vary; /* every impl's attention is int2_decode_attn v3 */
    snprintf(r->note, sizeof r->note, "kept %lld of %d tokens, %d generated: %lld in 2 bits + %d bf16, then %lld + %d "
             "after the append%s", (long long)p->s.mk_kept, p->s.ctx, p->s.gen, (long long)l->T, l->R, (long long)after.T, after.R,
             after.T > l->T ? " (a flush)" : "");
    const int B = l->B, H = l->Hkv, D = l->D;
    const int64_t N = p->s.mk_kept + p->s.gen; /* the activations of every cached token */
    kvb_tensor *Ka = step_tensor(r, "K_kept", KVB_BF16, 4, B, H, N > 0 ? N : 1, D, KVB_IN);
    kvb_tensor *Va = step_tensor(r, "V_kept", KVB_BF16, 4, B, H, N > 0 ? N : 1, D, KVB_IN);
    Ka->flags |= KVB_T_NO_DUMP, Va->flags |= KVB_T_NO_DUMP;
    kvb_fill_bf16_normal(Ka->h, Ka->n, r->seed, kvb_stream_of("K_kept"), 0, 0, 1);
    kvb_fill_bf16_normal(Va->h, Va->n, r->seed, kvb_stream_of("V_kept"), 0, 0, 1);
    cache_tensor(r, "Kq", KVB_U32, B, H, D, l->Tcap / 16);
    cache_tensor(r, "Ks", KVB_FP16, B, H, D, l->Tcap / l->gs);
    cache_tensor(r, "Kz", KVB_FP16, B, H, D, l->Tcap / l->gs);
    cache_tensor(r, "Vq", KVB_U32, B, H, l->Tcap, D / 16);
    cache_tensor(r, "Vs", KVB_FP16, B, H, l->Tcap, D / l->gs);
    cache_tensor(r, "Vz", KVB_FP16, B, H, l->Tcap, D / l->gs);
    cache_tensor(r, "Kr", KVB_BF16, B, H, l->Rcap, D);
    cache_tensor(r, "Vr", KVB_BF16, B, H, l->Rcap, D);
    size_t ws = 1;
#if KVB_HAVE_CUDA
    if (kvb_gpu_available()) ws = minikv_workspace_bytes(l);
#endif
    step_tensor(r, "attn_ws", KVB_U8, 1, (int64_t)ws, 0, 0, 0, KVB_SCRATCH);
    /* the cache in v3's native layout: quantized from the kept activations at the prefill
     * (gpu_prefill_mk), flushed into by the step's append; device-only state, read by the attention */
    step_tensor(r, "native_rec", KVB_U32, 1, int2_native_rec_elems(l), 0, 0, 0, KVB_SCRATCH);
    step_tensor(r, "native_km", KVB_FP16, 1, int2_native_km_elems(l), 0, 0, 0, KVB_SCRATCH);

    /* the prefill's result on the host: the first T kept tokens quantized, the rest in the residual */
    const int2_cache c = host_cache(r, 0);
    int rc;
    if (l->T > 0 && ((rc = ref_int2_quantize_keys(Ka->h, N, l->T, 0, c.Kq, c.Ks, c.Kz, l)) ||
                     (rc = ref_int2_quantize_values(Va->h, N, l->T, 0, c.Vq, c.Vs, c.Vz, l))))
        return rc;
    const size_t row = sizeof(kvb_bf16) * (size_t)D;
    for (int64_t bh = 0; bh < (int64_t)B * H; bh++) {
        memcpy(c.Kr + bh * l->Rcap * D, (const kvb_bf16 *)Ka->h + (bh * N + l->T) * D, row * (size_t)l->R);
        memcpy(c.Vr + bh * l->Rcap * D, (const kvb_bf16 *)Va->h + (bh * N + l->T) * D, row * (size_t)l->R);
    }
    return KVB_OK;
}

/* T = 0: attention over the bf16 residual rows equals dense decode over them (one bf16 rounding apart) */
static int residual_invariant(kvb_run *r, const int2_layout *a, const int2_cache *c, const kvb_bf16 *q,
                              const kvb_bf16 *att, const uint8_t *slices)
{
    const decode_layout d = {a->B, a->Hq, a->Hkv, a->D, a->Rcap};
    const int64_t n = (int64_t)a->B * a->Hq * a->D, per_slice = (int64_t)(a->Hq / a->Hkv) * a->D;
    kvb_bf16 *dense = kvb_run_alloc(r, sizeof(kvb_bf16) * (size_t)n, "dense attention over the residual");
    int32_t *len = kvb_run_alloc(r, sizeof(int32_t) * (size_t)a->B, "dense attention lengths");
    for (int b = 0; b < a->B; b++) len[b] = a->R;
    int rc = ref_decode_attn(q, c->Kr, c->Vr, len, dense, &d, slices);
    for (int64_t i = 0; !rc && i < n; i++) {
        const double x = kvb_bf16_to_double(att[i]), y = kvb_bf16_to_double(dense[i]);
        if ((!slices || slices[i / per_slice]) && !(fabs(x - y) <= ldexp(fabs(y), -8)))
            rc = kvb_fail(KVB_EINVAL, "decode_step method=minikv: with every kept token in the residual, the path's "
                          "attention differs from dense attention over it at element %lld: %g vs %g", (long long)i, x, y);
    }
    kvb_run_free(r, dense);
    kvb_run_free(r, len);
    return rc;
}

static int ref_attend_mk(kvb_run *r, step_priv *p, const kvb_bf16 *q, const kvb_bf16 *knew, const kvb_bf16 *vnew,
                         kvb_bf16 *att)
{
    static const char *const names[] = {"Kq", "Ks", "Kz", "Vq", "Vs", "Vz", "Kr", "Vr"};
    for (int i = 0; i < 8; i++) step_ref_reset(kvb_run_find(r, names[i]));
    int2_cache c = host_cache(r, 1);
    int2_layout a = p->s.mk;
    int64_t T;
    int R;
    int rc = ref_int2_append(&c, knew, vnew, &p->s.mk, &T, &R);
    if (rc) return rc;
    a.T = T, a.R = R; /* int2_after_append's counts */
    if ((rc = ref_int2_decode_attn(q, &c, att, &a, p->kv_slices))) return rc;
    return a.T == 0 && !p->from_device ? residual_invariant(r, &a, &c, q, att, p->kv_slices) : KVB_OK;
}

#if KVB_HAVE_CUDA
static int2_cache device_cache(kvb_run *r, int init)
{
#define A(name) (init ? kvb_run_find(r, name)->d_init : kvb_run_find(r, name)->d)
    return (int2_cache){A("Kq"), A("Ks"), A("Kz"), A("Vq"), A("Vs"), A("Vz"), A("Kr"), A("Vr")};
#undef A
}

/* The prefill on the device: the suite's quantize kernels write the cache's initial device copy from
 * the kept activations; the residual rows are a strided copy. */
static int gpu_prefill_mk(kvb_run *r, step_priv *p)
{
    const int2_layout *l = &p->s.mk;
    const int2_cache c = device_cache(r, 1);
    const kvb_tensor *Ka = kvb_run_find(r, "K_kept"), *Va = kvb_run_find(r, "V_kept");
    const int64_t N = p->s.mk_kept + p->s.gen;
    int rc;
    if (l->T > 0 && ((rc = int2_quantize_keys(Ka->d, N, l->T, 0, &c, l, r->stream)) ||
                     (rc = int2_quantize_values(Va->d, N, l->T, 0, &c, l, r->stream))))
        return rc;
    /* the native copy quantized from the same activations (bit for bit the mirror of c); its flushes
     * are the append's (int2_append_native) */
    const int2_native n = {step_dev(r, "native_rec"), step_dev(r, "native_km")};
    if (l->T > 0 && (rc = int2_quantize_native(Ka->d, Va->d, N, l->T, 0, &n, l, r->stream))) return rc;
    const size_t row = sizeof(kvb_bf16) * (size_t)l->D, heads = (size_t)l->B * l->Hkv;
    if (l->R > 0) {
        kvb_d2d_2d(c.Kr, l->Rcap * row, (const kvb_bf16 *)Ka->d + l->T * l->D, N * row, l->R * row, heads, r->stream);
        kvb_d2d_2d(c.Vr, l->Rcap * row, (const kvb_bf16 *)Va->d + l->T * l->D, N * row, l->R * row, heads, r->stream);
    }
    kvb_sync(r->stream);
    return KVB_OK;
}

static int attention_mk(kvb_run *r, step_priv *p, int which, block_attention *a)
{
    minikv_path *paths = p->ms;
    if (!paths) p->ms = paths = kvb_run_alloc(r, 2 * sizeof *paths, "minikv step plans");
    const int2_cache c = device_cache(r, 0);
    *a = (block_attention){minikv_block_add_stages, &paths[which], 0, 0};
    const int2_native n = {step_dev(r, "native_rec"), step_dev(r, "native_km")};
    return minikv_path_prepare(&paths[which], &p->s.mk, &c, &n, step_dev(r, "attn_ws"));
}
#endif

/* The append (the new row, and a flush's 128 tokens read and quantized into both caches), and one read of the cache
 * after it: codes, scales and zeros of T' tokens, R' residual rows (int2_cache_bytes). */
static void bytes_mk(const kvb_run *r, const step_priv *p, double *dev, double *host, double *flops)
{
    (void)r;
    const int2_layout *l = &p->s.mk, a = int2_after_append(l);
    double append = 2.0 * 2.0 * l->B * l->Hkv * l->D * 2;
    if (a.T > l->T) {
        int2_layout f = *l;
        f.T = INT2_FLUSH, f.R = INT2_FLUSH;
        append += int2_cache_bytes(&f); /* the residual read, its codes and metadata written */
        f.R = 0;
        append += int2_cache_bytes(&f); /* and written again in the native layout (int2_append_native) */
    }
    *dev = append + int2_cache_bytes(&a) + 2.0 * 2.0 * l->B * l->Hq * l->D;
    *host = 0;
    *flops = 4.0 * l->B * l->Hq * l->D * (double)(a.T + a.R);
}

/* What a sequence keeps after prefill: the T quantized tokens' codes and metadata, the R residual rows */
static void state_mk(const step_case *s, double *dev, double *host)
{
    int2_layout one = s->mk;
    one.B = 1;
    *dev = int2_cache_bytes(&one);
    *host = 0;
}

/* K_kept, V_kept in; the cache (codes, metadata, residual) in and out; the reference's scores per thread (G rows
 * of the tokens after the append); with every token in the residual, the invariant's dense attention and its
 * reference's scores per thread (a row of Rcap) */
static double host_bytes_mk(const step_case *s)
{
    const int2_layout *l = &s->mk, a = int2_after_append(l);
    const double heads = (double)l->B * l->Hkv, N = (double)(s->mk_kept + s->gen), G = l->Hq / l->Hkv;
    const double cache = int2_key_array_bytes(l) + int2_value_array_bytes(l) + int2_res_array_bytes(l);
    double bytes = KVB_HOLD_IN * 2 * heads * (N > 0 ? N : 1) * l->D * 2 + KVB_HOLD_INOUT * cache +
                   kvb_ref_threads() * 8 * G * (double)(a.T + a.R);
    if (a.T == 0) bytes += 2.0 * l->B * l->Hq * l->D + 4.0 * l->B + kvb_ref_threads() * 8.0 * l->Rcap;
    return bytes;
}

const step_method step_method_minikv = {
    .name = "minikv",
    .about = "INT2 K, V of the heavy hitters and the recent window + bf16 residual; int2_append_native (a flush "
             "quantizes into the interchange and the native cache), int2_decode_attn v3",
    .shape = shape_mk,
    .setup = setup_mk,
    .ref_attend = ref_attend_mk,
#if KVB_HAVE_CUDA
    .gpu_prefill = gpu_prefill_mk,
    .attention = attention_mk,
#endif
    .bytes = bytes_mk,
    .state_bytes = state_mk,
    .host_bytes = host_bytes_mk,
};
