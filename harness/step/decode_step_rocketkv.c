/* decode_step_rocketkv.c: decode_step method=rocketkv (decode_step.h; the path:
 * kernels/step/step_rocketkv.h, reference/step/step_rocketkv.h). After a prompt of ctx tokens SnapKV++
 * kept C of them (rocketkv_budget with T = budget and room for M = 50 generated tokens): the kept cache
 * K, V [B, Hkv, C, D] holds t = C - 50 + gen tokens (seeded normal activations; which prompt tokens
 * SnapKV++ kept does not change the step's work), and their page min/max metadata, built on the device
 * by page_meta_build (the host's by its reference). The step: the scoring with the page metadata's
 * and the cache's append (hybrid_score_append) and the page top-k, then sparse_attn_pages. all=1 attends every kept token: the reference
 * must then equal dense attention over the t + 1 kept tokens, bit for bit.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness/step/decode_step.h"
#include "harness/ops/ops.h"
#if KVB_HAVE_CUDA
#include "kernels/page_scoring/page_scoring.h"
#include "kernels/step/step_rocketkv.h"
#endif

enum { RK_M = 50 }; /* generated tokens the kept cache has room for */

static int shape_rk(const kvb_case *c, step_case *s)
{
    const char *who = "decode_step method=rocketkv";
    if (s->budget < 2 || s->budget > s->ctx)
        return kvb_fail(KVB_EINVAL, "%s: budget=%d out of range [2, ctx = %d]%s", who,
                        s->budget, s->ctx, s->budget > s->ctx ? ": a budget larger than the context" : "");
    rocketkv_knobs kn;
    int rc = rocketkv_budget(s->budget, s->ctx, s->m->D, RK_M, &kn);
    if (rc) {
        char why[300];
        snprintf(why, sizeof why, "%s", kvb_last_error());
        return kvb_fail(rc, "%s: %s", who, why);
    }
    if (!s->all && kn.k > kn.prompt + s->gen + 1) /* the kept cache holds fewer tokens than k: name the case's keys */
        return kvb_fail(KVB_EINVAL,
                        "%s: budget=%d: k = budget/2 = %d tokens to attend out of range [1, %d]: at ctx=%d the kept "
                        "cache holds %d prompt tokens (C = %d less room for %d generated) and gen + 1 = %d: a smaller "
                        "budget or a longer context", who, s->budget, kn.k, kn.prompt + s->gen + 1, s->ctx, kn.prompt,
                        kn.C, RK_M, s->gen + 1);
    (void)c;
    rocketkv_shape *sh = &s->rk;
    *sh = (rocketkv_shape){.B = s->B, .Hq = s->m->Hq, .Hkv = s->m->Hkv, .D = s->m->D, .cap_tokens = kn.C,
                           .t = kn.prompt + s->gen, .P = kn.P, .r = kn.r,
                           .k = s->all ? kn.prompt + s->gen + 1 : kn.k};
    sh->cap_pages = page_cap_default(sh->cap_tokens, sh->P);
    return rocketkv_shape_check(sh);
}

static int setup_rk(kvb_run *r, step_priv *p)
{
    const rocketkv_shape *sh = &p->s.rk;
    const int npg = page_count(sh->t + 1, sh->P), n_sel = hybrid_selected_pages(sh->k, sh->P);
    snprintf(r->note, sizeof r->note, "C=%d t=%d P=%d r=%d k=%d: %d of %d pages%s", sh->cap_tokens, sh->t, sh->P, sh->r,
             sh->k, n_sel, npg, p->s.all ? " (every kept token)" : "");
    step_fill_ints(step_tensor(r, "t", KVB_I32, 1, sh->B, 0, 0, 0, KVB_IN), sh->t);
    step_fill_ints(step_tensor(r, "len", KVB_I32, 1, sh->B, 0, 0, 0, KVB_IN), sh->t + 1);
    step_fill_ints(step_tensor(r, "cnt", KVB_I32, 1, sh->B, 0, 0, 0, KVB_IN), n_sel);
    kvb_tensor *K = step_tensor(r, "K", KVB_BF16, 4, sh->B, sh->Hkv, sh->cap_tokens, sh->D, KVB_INOUT);
    kvb_tensor *V = step_tensor(r, "V", KVB_BF16, 4, sh->B, sh->Hkv, sh->cap_tokens, sh->D, KVB_INOUT);
    kvb_tensor *mn = step_tensor(r, "kmin", KVB_BF16, 4, sh->B, sh->Hkv, sh->D, sh->cap_pages, KVB_INOUT);
    kvb_tensor *mx = step_tensor(r, "kmax", KVB_BF16, 4, sh->B, sh->Hkv, sh->D, sh->cap_pages, KVB_INOUT);
    kvb_tensor *u = step_tensor(r, "u", KVB_FP32, 3, sh->B, sh->Hkv, npg, 0, KVB_OUT);
    kvb_tensor *pages = step_tensor(r, "pages", KVB_I32, 3, sh->B, sh->Hkv, n_sel, 0, KVB_OUT);
    size_t ws_score = 1, ws_attn = 1;
#if KVB_HAVE_CUDA
    if (kvb_gpu_available()) rocketkv_workspace_bytes(sh, &ws_score, &ws_attn);
#endif
    step_tensor(r, "ws_score", KVB_U8, 1, (int64_t)ws_score, 0, 0, 0, KVB_SCRATCH);
    step_tensor(r, "ws_attn", KVB_U8, 1, (int64_t)ws_attn, 0, 0, 0, KVB_SCRATCH);
    /* the state appended from the device's own knew, and scored from its own q: exact */
    K->cmp = V->cmp = mn->cmp = mx->cmp = KVB_CMP_EXACT;
    K->flags |= KVB_T_NO_DUMP, V->flags |= KVB_T_NO_DUMP;
    if (r->c->atol < 0 && r->c->rtol < 0) u->tol = (kvb_tol){1e-5, 1e-3, 1e-3}; /* hybrid_score's own */
    kvb_fill_bf16_normal(K->h, K->n, r->seed, kvb_stream_of("K"), 0, 0, 1);
    kvb_fill_bf16_normal(V->h, V->n, r->seed, kvb_stream_of("V"), 0, 0, 1);
    pages->cmp = KVB_CMP_INDEXSET;
    pages->scores = u->ref;
    pages->scores_dtype = KVB_FP32;
    pages->scores_n = npg;
    return ref_rocketkv_meta_prefix(sh, K->h, mn->h, mx->h);
}

/* all=1: the sparse reference over every page computes dense decode in the same order: equal bit for bit */
static int dense_invariant(kvb_run *r, const rocketkv_shape *sh, const kvb_bf16 *q, const kvb_bf16 *K, const kvb_bf16 *V,
                           const kvb_bf16 *att, const uint8_t *slices)
{
    const decode_layout d = {sh->B, sh->Hq, sh->Hkv, sh->D, sh->cap_tokens};
    const int64_t n = (int64_t)sh->B * sh->Hq * sh->D, per_slice = (int64_t)(sh->Hq / sh->Hkv) * sh->D;
    kvb_bf16 *dense = kvb_run_alloc(r, sizeof(kvb_bf16) * (size_t)n, "dense attention (all=1)");
    int32_t *len = kvb_run_alloc(r, sizeof(int32_t) * (size_t)sh->B, "dense attention lengths");
    for (int b = 0; b < sh->B; b++) len[b] = sh->t + 1;
    int rc = ref_decode_attn(q, K, V, len, dense, &d, slices);
    for (int64_t i = 0; !rc && i < n; i++)
        if ((!slices || slices[i / per_slice]) && dense[i] != att[i])
            rc = kvb_fail(KVB_EINVAL, "decode_step method=rocketkv all=1: the path's attention differs from dense "
                          "attention over the kept tokens at element %lld: %g vs %g", (long long)i,
                          kvb_bf16_to_double(att[i]), kvb_bf16_to_double(dense[i]));
    kvb_run_free(r, dense);
    kvb_run_free(r, len);
    return rc;
}

static int ref_attend_rk(kvb_run *r, step_priv *p, const kvb_bf16 *q, const kvb_bf16 *knew, const kvb_bf16 *vnew,
                         kvb_bf16 *att)
{
    const rocketkv_shape *sh = &p->s.rk;
    kvb_tensor *K = kvb_run_find(r, "K"), *V = kvb_run_find(r, "V"), *mn = kvb_run_find(r, "kmin"),
               *mx = kvb_run_find(r, "kmax"), *u = kvb_run_find(r, "u"), *pages = kvb_run_find(r, "pages");
    step_ref_reset(K), step_ref_reset(V), step_ref_reset(mn), step_ref_reset(mx);
    int rc = ref_rocketkv_step(q, knew, vnew, K->ref, V->ref, mn->ref, mx->ref, sh, u->ref, pages->ref, att,
                               p->kv_slices);
    if (rc) return rc;
    const int npg = page_count(sh->t + 1, sh->P), n_sel = hybrid_selected_pages(sh->k, sh->P);
    pages->set_tol = kvb_selection_tol(&u->tol, u->ref, (int64_t)sh->B * sh->Hkv, npg, pages->ref, n_sel);
    if (p->s.all && (rc = dense_invariant(r, sh, q, K->ref, V->ref, att, p->kv_slices))) return rc;
    if (!p->from_device) return KVB_OK;
    /* the device chose its pages within the selection's tolerance (compared against u in the same
     * verdict): att is exact attention over the pages it chose */
    page_layout meta, score;
    sparse_layout al;
    decode_layout cache;
    rocketkv_layouts(sh, &meta, &score, &al, &cache);
    const int32_t *len = kvb_run_find(r, "len")->h, *cnt = kvb_run_find(r, "cnt")->h;
    if ((rc = sparse_lists_check(&al, len, pages->out, cnt, 1, "decode_step method=rocketkv: the device's pages")))
        return rc;
    return ref_sparse_attn_pages(q, K->ref, V->ref, len, pages->out, cnt, att, &al, p->kv_slices);
}

#if KVB_HAVE_CUDA
/* The metadata of the t kept prompt rows, built by the suite's kernel into the state's initial device
 * copy (the comparison then holds it to the host's reference build). */
static int gpu_prefill_rk(kvb_run *r, step_priv *p)
{
    const rocketkv_shape *sh = &p->s.rk;
    if (sh->t == 0) return KVB_OK; /* nothing to build: the uploaded empty entries */
    const kvb_tensor *K = kvb_run_find(r, "K");
    const size_t row = sizeof(kvb_bf16) * (size_t)sh->D, heads = (size_t)sh->B * sh->Hkv;
    kvb_bf16 *prefix = kvb_dmalloc(heads * sh->t * row);
    /* the first t rows of each head, contiguous: page_meta_build's K [B, Hkv, t, D] */
    kvb_d2d_2d(prefix, sh->t * row, K->d_init, (size_t)sh->cap_tokens * row, sh->t * row, heads, r->stream);
    const page_layout built = {sh->B, sh->Hq, sh->Hkv, sh->D, sh->t, sh->P, sh->cap_pages};
    int rc = page_meta_build(prefix, &built, kvb_run_find(r, "kmin")->d_init, kvb_run_find(r, "kmax")->d_init,
                             r->stream);
    kvb_sync(r->stream);
    kvb_dfree(prefix);
    return rc;
}

static int attention_rk(kvb_run *r, step_priv *p, int which, block_attention *a)
{
    rocketkv_step_plan *plans = p->ms;
    if (!plans) p->ms = plans = kvb_run_alloc(r, 2 * sizeof *plans, "rocketkv step plans");
    const rocketkv_buffers b = {
        .t = step_dev(r, "t"), .t_host = kvb_run_find(r, "t")->h,
        .len = step_dev(r, "len"), .len_host = kvb_run_find(r, "len")->h,
        .cnt = step_dev(r, "cnt"), .cnt_host = kvb_run_find(r, "cnt")->h,
        .K = step_dev(r, "K"), .V = step_dev(r, "V"), .kmin = step_dev(r, "kmin"), .kmax = step_dev(r, "kmax"),
        .u = step_dev(r, "u"), .pages = step_dev(r, "pages"),
        .ws_score = step_dev(r, "ws_score"), .ws_attn = step_dev(r, "ws_attn"),
    };
    /* at B = 1 the path is ~30 us of dependent kernels over ~9 MB: o_proj's weights read into L2 beside it
     * (measured faster there, slower at B = 8: kernels/step/NOTES.md) */
    *a = (block_attention){rocketkv_block_add_stages, &plans[which], p->s.rk.B == 1, 0};
    return rocketkv_path_prepare(&plans[which], &p->s.rk, &b);
}
#endif

static void bytes_rk(const kvb_run *r, const step_priv *p, double *dev, double *host, double *flops)
{
    rocketkv_step_bytes(&p->s.rk, kvb_run_find((kvb_run *)r, "pages")->ref, dev, flops);
    *host = 0;
}

static void state_rk(const step_case *s, double *dev, double *host)
{
    const rocketkv_shape *sh = &s->rk;
    *dev = 2.0 * 2.0 * sh->Hkv * sh->D * ((double)sh->cap_tokens + sh->cap_pages);
    *host = 0;
}

/* t, len, cnt in; K, V, kmin, kmax in and out; u, pages out; the references' scratch (the prompt's rows
 * for the metadata, a head's scoring scratch and the page rows per thread), dense attention for all=1 */
static double host_bytes_rk(const step_case *s)
{
    const rocketkv_shape *sh = &s->rk;
    const double heads = (double)sh->B * sh->Hkv, npg = page_count(sh->t + 1, sh->P), n_sel = hybrid_selected_pages(sh->k, sh->P);
    const double G = sh->Hq / sh->Hkv;
    return 12.0 * sh->B + KVB_HOLD_INOUT * heads * sh->D * 2 * 2 * ((double)sh->cap_tokens + sh->cap_pages) +
           KVB_HOLD_OUT * heads * (npg + n_sel) * 4 + heads * sh->t * sh->D * 2 +
           kvb_ref_threads() * (12.0 * sh->D + 16.0 * sh->r + 16 * G + 8 * G * npg + 8 * npg + 8.0 * n_sel * sh->P +
                                8.0 * sh->cap_tokens) +
           (s->all ? (double)sh->B * sh->Hq * sh->D * 2 + 4.0 * sh->B : 0);
}

const step_method step_method_rocketkv = {
    .name = "rocketkv",
    .about = "SnapKV++-kept K, V and page min/max; hybrid_score with the metadata and cache append + page "
             "top-k, sparse_attn_pages",
    .device_choice = "pages",
    .shape = shape_rk,
    .setup = setup_rk,
    .ref_attend = ref_attend_rk,
#if KVB_HAVE_CUDA
    .gpu_prefill = gpu_prefill_rk,
    .attention = attention_rk,
#endif
    .bytes = bytes_rk,
    .state_bytes = state_rk,
    .host_bytes = host_bytes_rk,
};
