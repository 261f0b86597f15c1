/* ops_rocketkv.c: RocketKV's decode-time attention path in the harness (kernels/step/NOTES.md, the
 * rocketkv method; kernels/page_scoring/NOTES.md, the budget knobs; kernels/step/step_rocketkv.h,
 * reference/step/step_rocketkv.h).
 *
 * Kernel name: rocketkv_decode. One decode step of one layer's attention, B sequences, after a prompt
 * of Lmax tokens: SnapKV++ kept C of them (C, P, r, k from rocketkv_budget(T, Lmax, D, M)); the kept
 * cache has room for C tokens, C - M of the prompt and M generated; this step decodes the token at
 * t = C - M + gen. Implementations (impl=):
 *   kernel  the two stages captured once as a CUDA graph, each launch replays it
 *   eager   the same stages enqueued one by one
 *   dense   what RocketKV replaces: kv_append and decode_attn over the whole uncompressed context,
 *           Lmax + gen + 1 tokens (the baseline of the goal, timed in the same run)
 *
 * Inputs: seeded normal q, knew, vnew, and a kept cache K, V of C rows per head (the rows at and past t
 * too, so that a read past t + 1 tokens shows). The page metadata is the extrema of K's first t rows
 * (page_meta_build's definition). Outputs compared: K, V, kmin, kmax bit for bit (the append), u with
 * the scoring's tolerance, the pages tie-tolerantly against u, and o against the reference attention
 * over the pages the device chose (recomputed from them before each comparison: a page swapped for
 * one of equal score within tolerance is a correct selection, and o must be exact attention over it).
 * all=1 attends every token (k = t + 1): o must then equal dense decode over t + 1 tokens, which
 * ref_check holds the reference to, bit for bit.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reference/step/step_rocketkv.h"
#include "harness/core/ceilings.h"
#include "harness/core/op.h"
#include "harness/ops/ops.h"
#if KVB_HAVE_CUDA
#include "kernels/step/step_rocketkv.h"
#endif

#define NPARAMS(a) ((int)(sizeof(a) / sizeof((a)[0])))

static const kvb_param rk_params[] = {
    {"B", KVB_P_INT, 8, 1, DECODE_MAX_B, NULL, "batch"},
    {"Hq", KVB_P_INT, 32, 1, 2048, NULL, "query heads"},
    {"Hkv", KVB_P_INT, 8, 1, DECODE_MAX_HKV, NULL, "KV heads (G = Hq/Hkv in [1, 8])"},
    {"D", KVB_P_INT, 128, 1, 1024, "64|128", "head dimension"},
    {"Lmax", KVB_P_INT, 131072, 1, DECODE_MAX_L, NULL, "prompt tokens (SnapKV++ keeps C of them)"},
    {"T", KVB_P_INT, 2048, 2, DECODE_MAX_L, NULL, "token budget (rocketkv_budget: C, P, r, k)"},
    {"M", KVB_P_INT, 50, 1, 4096, NULL, "tokens to generate: room in the kept cache (prompt budget C - M)"},
    {"gen", KVB_P_INT, 0, 0, 4095, NULL, "tokens generated before this step (t = C - M + gen)"},
    {"P", KVB_P_INT, 0, 0, SPARSE_MAX_P, NULL, "tokens per page (0: the budget's)"},
    {"r", KVB_P_INT, 0, 0, PAGE_MAX_D, NULL, "scoring channels (0: the budget's)"},
    {"k", KVB_P_INT, 0, 0, DECODE_MAX_L, NULL, "tokens attended (0: the budget's T/2)"},
    {"all", KVB_P_INT, 0, 0, 1, NULL, "1: attend every token (k = t + 1): must equal dense decode"},
    {"seed", KVB_P_INT, 1, 0, 1e15, NULL, "input seed"},
    {"impl", KVB_P_ENUM, 0, 0, 0, NULL, "implementation (the impl table)"},
};

enum { IMPL_GRAPH, IMPL_EAGER, IMPL_DENSE };

typedef struct rk_case {
    rocketkv_shape sh;
    rocketkv_knobs kn;
    int impl;
    int64_t dense_L; /* impl=dense: the whole context's capacity, Lmax + M */
    int dense_t;     /* impl=dense: the token's position in it, Lmax + gen */
} rk_case;

static int case_of(const kvb_case *c, rk_case *x)
{
    const char *who = "rocketkv_decode";
    memset(x, 0, sizeof *x);
    rocketkv_shape *sh = &x->sh;
    sh->B = kvb_case_int(c, "B"), sh->Hq = kvb_case_int(c, "Hq"), sh->Hkv = kvb_case_int(c, "Hkv");
    sh->D = kvb_case_int(c, "D");
    const int T = kvb_case_int(c, "T"), Lmax = kvb_case_int(c, "Lmax"), M = kvb_case_int(c, "M"),
              gen = kvb_case_int(c, "gen");
    x->impl = (int)kvb_case_get(c, "impl");
    int rc = rocketkv_budget(T, Lmax, sh->D, M, &x->kn);
    if (rc) {
        char why[300];
        snprintf(why, sizeof why, "%s", kvb_last_error());
        return kvb_fail(rc, "%s: %s", who, why);
    }
    if (gen >= M)
        return kvb_fail(KVB_EINVAL, "%s: gen=%d out of range [0, M - 1 = %d]: the kept cache has room for M tokens", who,
                        gen, M - 1);
    sh->cap_tokens = x->kn.C;
    sh->t = x->kn.prompt + gen;
    sh->P = kvb_case_int(c, "P") ? kvb_case_int(c, "P") : x->kn.P;
    sh->r = kvb_case_int(c, "r") ? kvb_case_int(c, "r") : x->kn.r;
    sh->k = kvb_case_int(c, "all") ? sh->t + 1 : kvb_case_int(c, "k") ? kvb_case_int(c, "k") : x->kn.k;
    sh->cap_pages = sh->P >= 1 ? page_cap_default(sh->cap_tokens, sh->P) : 8;
    x->dense_L = (int64_t)Lmax + M;
    x->dense_t = Lmax + gen;
    if ((rc = rocketkv_shape_check(sh))) return rc;
    if (x->impl == IMPL_DENSE) {
        decode_layout d = {sh->B, sh->Hq, sh->Hkv, sh->D, x->dense_L};
        if ((rc = decode_layout_check(&d, "rocketkv_decode impl=dense (Lmax + M tokens)"))) return rc;
    }
    const double kv_bytes = 4.0 * sh->B * sh->Hkv * sh->D * (x->impl == IMPL_DENSE ? (double)x->dense_L : sh->cap_tokens);
    if (kv_bytes > 16e9)
        return kvb_fail(KVB_EINVAL, "%s: K and V, 4*B*Hkv*D*%s bytes at B=%d, take %.1f GB, out of range [0, 16 GB]",
                        who, x->impl == IMPL_DENSE ? "(Lmax + M)" : "(the cache's tokens)", sh->B, kv_bytes * 1e-9);
    return KVB_OK;
}

static int validate_rk(const kvb_case *c)
{
    rk_case x;
    return case_of(c, &x);
}

/* ---- setup ---- */

typedef struct rk_priv {
    rk_case x;
    uint8_t *mask; /* impl=dense: the sampled reference's slices */
#if KVB_HAVE_CUDA
    rocketkv_step_plan plan, plan_timed;
    int planned, captured;
#endif
} rk_priv;

static kvb_tensor *add(kvb_run *r, const char *name, kvb_dtype dt, int ndim, int64_t a, int64_t b, int64_t c, int64_t d,
                       int role)
{
    int64_t s[4] = {a, b, c, d};
    return kvb_run_tensor(r, name, dt, ndim, s, role);
}

static void fill_ints(kvb_tensor *t, int v)
{
    for (int64_t i = 0; i < t->n; i++) ((int32_t *)t->h)[i] = v;
}

static int setup_step(kvb_run *r, rk_priv *p)
{
    const rocketkv_shape *sh = &p->x.sh;
    const int npg = page_count(sh->t + 1, sh->P), n_sel = hybrid_selected_pages(sh->k, sh->P);
    snprintf(r->note, sizeof r->note, "C=%d t=%d P=%d r=%d k=%d: %d of %d pages%s", sh->cap_tokens, sh->t, sh->P, sh->r,
             sh->k, n_sel, npg, kvb_case_int(r->c, "all") ? " (every token)" : "");
    kvb_tensor *q = add(r, "q", KVB_BF16, 3, sh->B, sh->Hq, sh->D, 0, KVB_IN);
    kvb_tensor *kn = add(r, "knew", KVB_BF16, 3, sh->B, sh->Hkv, sh->D, 0, KVB_IN);
    kvb_tensor *vn = add(r, "vnew", KVB_BF16, 3, sh->B, sh->Hkv, sh->D, 0, KVB_IN);
    kvb_tensor *t = add(r, "t", KVB_I32, 1, sh->B, 0, 0, 0, KVB_IN);
    kvb_tensor *len = add(r, "len", KVB_I32, 1, sh->B, 0, 0, 0, KVB_IN);
    kvb_tensor *cnt = add(r, "cnt", KVB_I32, 1, sh->B, 0, 0, 0, KVB_IN);
    kvb_tensor *K = add(r, "K", KVB_BF16, 4, sh->B, sh->Hkv, sh->cap_tokens, sh->D, KVB_INOUT);
    kvb_tensor *V = add(r, "V", KVB_BF16, 4, sh->B, sh->Hkv, sh->cap_tokens, sh->D, KVB_INOUT);
    kvb_tensor *mn = add(r, "kmin", KVB_BF16, 4, sh->B, sh->Hkv, sh->D, sh->cap_pages, KVB_INOUT);
    kvb_tensor *mx = add(r, "kmax", KVB_BF16, 4, sh->B, sh->Hkv, sh->D, sh->cap_pages, KVB_INOUT);
    kvb_tensor *u = add(r, "u", KVB_FP32, 3, sh->B, sh->Hkv, npg, 0, KVB_OUT);
    kvb_tensor *pages = add(r, "pages", KVB_I32, 3, sh->B, sh->Hkv, n_sel, 0, KVB_OUT);
    kvb_tensor *o = add(r, "o", KVB_BF16, 3, sh->B, sh->Hq, sh->D, 0, KVB_OUT);
    size_t ws_score = 1, ws_attn = 1;
#if KVB_HAVE_CUDA
    if (kvb_gpu_available()) rocketkv_workspace_bytes(sh, &ws_score, &ws_attn);
#endif
    add(r, "ws_score", KVB_U8, 1, (int64_t)ws_score, 0, 0, 0, KVB_SCRATCH);
    add(r, "ws_attn", KVB_U8, 1, (int64_t)ws_attn, 0, 0, 0, KVB_SCRATCH);
    K->cmp = V->cmp = mn->cmp = mx->cmp = KVB_CMP_EXACT;
    K->flags |= KVB_T_NO_DUMP, V->flags |= KVB_T_NO_DUMP;
    if (r->c->atol < 0 && r->c->rtol < 0) u->tol = (kvb_tol){1e-5, 1e-3, 1e-3}; /* hybrid_score's own */

    kvb_fill_bf16_normal(q->h, q->n, r->seed, kvb_stream_of("q"), 0, 0, 1);
    kvb_fill_bf16_normal(kn->h, kn->n, r->seed, kvb_stream_of("knew"), 0, 0, 1);
    kvb_fill_bf16_normal(vn->h, vn->n, r->seed, kvb_stream_of("vnew"), 0, 0, 1);
    kvb_fill_bf16_normal(K->h, K->n, r->seed, kvb_stream_of("K"), 0, 0, 1);
    kvb_fill_bf16_normal(V->h, V->n, r->seed, kvb_stream_of("V"), 0, 0, 1);
    fill_ints(t, sh->t), fill_ints(len, sh->t + 1), fill_ints(cnt, n_sel);
    int rc = ref_rocketkv_meta_prefix(sh, K->h, mn->h, mx->h);
    if (rc) return rc;
    kvb_copy_parallel(K->ref, K->h, sizeof(kvb_bf16) * (size_t)K->n);
    kvb_copy_parallel(V->ref, V->h, sizeof(kvb_bf16) * (size_t)V->n);
    kvb_copy_parallel(mn->ref, mn->h, sizeof(kvb_bf16) * (size_t)mn->n);
    kvb_copy_parallel(mx->ref, mx->h, sizeof(kvb_bf16) * (size_t)mx->n);
    if ((rc = ref_rocketkv_step(q->h, kn->h, vn->h, K->ref, V->ref, mn->ref, mx->ref, sh, u->ref, pages->ref, o->ref,
                                NULL)))
        return rc;
    pages->cmp = KVB_CMP_INDEXSET;
    pages->scores = u->ref;
    pages->scores_dtype = KVB_FP32;
    pages->scores_n = npg;
    pages->set_tol = kvb_selection_tol(&u->tol, u->ref, (int64_t)sh->B * sh->Hkv, npg, pages->ref, n_sel);
    return KVB_OK;
}

static int setup_dense(kvb_run *r, rk_priv *p)
{
    const rocketkv_shape *sh = &p->x.sh;
    const decode_layout d = {sh->B, sh->Hq, sh->Hkv, sh->D, p->x.dense_L};
    const int G = sh->Hq / sh->Hkv, tpos = p->x.dense_t;
    snprintf(r->note, sizeof r->note, "dense baseline: decode_attn over %d tokens (RocketKV's C=%d)", tpos + 1,
             sh->cap_tokens);
    kvb_tensor *q = add(r, "q", KVB_BF16, 3, sh->B, sh->Hq, sh->D, 0, KVB_IN);
    kvb_tensor *kn = add(r, "knew", KVB_BF16, 3, sh->B, sh->Hkv, sh->D, 0, KVB_IN);
    kvb_tensor *vn = add(r, "vnew", KVB_BF16, 3, sh->B, sh->Hkv, sh->D, 0, KVB_IN);
    kvb_tensor *t = add(r, "t", KVB_I32, 1, sh->B, 0, 0, 0, KVB_IN);
    kvb_tensor *len = add(r, "len", KVB_I32, 1, sh->B, 0, 0, 0, KVB_IN);
    /* K, V of the whole context are inputs that already hold the new row: the launch's kv_append writes
     * the same bytes again, so the gigabytes need no restore between launches (the append is checked
     * bit for bit by the kernel and eager impls) */
    kvb_tensor *K = add(r, "K", KVB_BF16, 4, sh->B, sh->Hkv, d.L, sh->D, KVB_IN);
    kvb_tensor *V = add(r, "V", KVB_BF16, 4, sh->B, sh->Hkv, d.L, sh->D, KVB_IN);
    kvb_tensor *o = add(r, "o", KVB_BF16, 3, sh->B, sh->Hq, sh->D, 0, KVB_OUT);
    size_t ws = 1;
#if KVB_HAVE_CUDA
    if (kvb_gpu_available()) ws = decode_attn_workspace_bytes(&d);
#endif
    add(r, "ws_attn", KVB_U8, 1, (int64_t)ws, 0, 0, 0, KVB_SCRATCH);
    K->flags |= KVB_T_NO_DUMP, V->flags |= KVB_T_NO_DUMP;
    kvb_fill_bf16_normal(q->h, q->n, r->seed, kvb_stream_of("q"), 0, 0, 1);
    kvb_fill_bf16_normal(kn->h, kn->n, r->seed, kvb_stream_of("knew"), 0, 0, 1);
    kvb_fill_bf16_normal(vn->h, vn->n, r->seed, kvb_stream_of("vnew"), 0, 0, 1);
    kvb_fill_bf16_normal(K->h, K->n, r->seed, kvb_stream_of("K"), 0, 0, 1);
    kvb_fill_bf16_normal(V->h, V->n, r->seed, kvb_stream_of("V"), 0, 0, 1);
    fill_ints(t, tpos), fill_ints(len, tpos + 1);
    int rc = ref_kv_append(kn->h, vn->h, t->h, K->h, V->h, &d);
    if (rc) return rc;
    int64_t chosen, n_slices = (int64_t)sh->B * sh->Hkv;
    p->mask = kvb_sample_slices(n_slices, 2.0 * G * (tpos + 1.0) * sh->D, KVB_REF_BUDGET, &chosen);
    o->slice_len = (int64_t)G * sh->D;
    o->slice_mask = p->mask;
    if (p->mask) {
        const size_t used = strlen(r->note);
        snprintf(r->note + used, sizeof r->note - used, "; reference on %lld of %lld (b, kv head) slices",
                 (long long)chosen, (long long)n_slices);
    }
    return ref_decode_attn(q->h, K->h, V->h, len->h, o->ref, &d, p->mask);
}

static int setup_rk(kvb_run *r)
{
    rk_priv *p = kvb_run_alloc(r, sizeof *p, "rocketkv_decode state");
    r->priv = p;
    int rc = case_of(r->c, &p->x);
    if (rc) return rc;
    return p->x.impl == IMPL_DENSE ? setup_dense(r, p) : setup_step(r, p);
}

/* all=1: the sparse reference over every page makes dense decode's computation in the same order, so
 * the two agree to the bit. */
static int ref_check_rk(kvb_run *r)
{
    const rk_priv *p = r->priv;
    if (p->x.impl == IMPL_DENSE || !kvb_case_int(r->c, "all")) return KVB_OK;
    const rocketkv_shape *sh = &p->x.sh;
    const decode_layout d = {sh->B, sh->Hq, sh->Hkv, sh->D, sh->cap_tokens};
    const kvb_tensor *o = kvb_run_find(r, "o");
    kvb_bf16 *dense = kvb_run_alloc(r, sizeof(kvb_bf16) * (size_t)o->n, "dense decode (all=1)");
    int32_t *len = kvb_run_alloc(r, sizeof(int32_t) * (size_t)sh->B, "dense decode lengths (all=1)");
    for (int b = 0; b < sh->B; b++) len[b] = sh->t + 1;
    int rc = ref_decode_attn(kvb_run_find(r, "q")->h, kvb_run_find(r, "K")->ref, kvb_run_find(r, "V")->ref, len, dense,
                             &d, NULL);
    const kvb_bf16 *ref = o->ref;
    for (int64_t i = 0; !rc && i < o->n; i++)
        if (dense[i] != ref[i])
            rc = kvb_fail(KVB_EINVAL, "rocketkv_decode: with every page chosen, the reference differs from dense decode at "
                          "element %lld: %g vs %g", (long long)i, kvb_bf16_to_double(ref[i]), kvb_bf16_to_double(dense[i]));
    kvb_run_free(r, dense);
    kvb_run_free(r, len);
    return rc;
}

/* o's reference over the pages the device chose (the pages themselves are compared with theirs). */
static int ref_from_out_rk(kvb_run *r)
{
    const rk_priv *p = r->priv;
    if (p->x.impl == IMPL_DENSE) return KVB_OK;
    const rocketkv_shape *sh = &p->x.sh;
    page_layout meta, score;
    sparse_layout att;
    decode_layout cache;
    rocketkv_layouts(sh, &meta, &score, &att, &cache);
    kvb_tensor *o = kvb_run_find(r, "o");
    const kvb_tensor *pages = kvb_run_find(r, "pages");
    const int32_t *len = kvb_run_find(r, "len")->h, *cnt = kvb_run_find(r, "cnt")->h;
    int rc = sparse_lists_check(&att, len, pages->out, cnt, 1, "rocketkv_decode pages");
    return rc ? rc
              : ref_sparse_attn_pages(kvb_run_find(r, "q")->h, kvb_run_find(r, "K")->ref, kvb_run_find(r, "V")->ref, len,
                                      pages->out, cnt, o->ref, &att, NULL);
}

/* Each KV head's softmax masses sum to one per query head: sum_j n_j u[j] = G (as hybrid_score's). */
static int out_check_rk(kvb_run *r)
{
    const rk_priv *p = r->priv;
    if (p->x.impl == IMPL_DENSE) return KVB_OK;
    const rocketkv_shape *sh = &p->x.sh;
    const kvb_tensor *u = kvb_run_find(r, "u");
    const int npg = page_count(sh->t + 1, sh->P), G = sh->Hq / sh->Hkv;
    const float *v = u->out;
    for (int64_t bh = 0; bh < (int64_t)sh->B * sh->Hkv; bh++) {
        double sum = 0;
        for (int j = 0; j < npg; j++) {
            const int64_t left = (int64_t)sh->t + 1 - (int64_t)j * sh->P;
            sum += (double)(left < sh->P ? left : sh->P) * v[bh * npg + j];
        }
        if (!(fabs(sum - G) <= u->tol.rtol * G))
            return kvb_fail(KVB_EINVAL, "rocketkv_decode: device u of (b*Hkv + h) = %lld: sum_j n_j u[j] = %.7g, not G = %d",
                            (long long)bh, sum, G);
    }
    return KVB_OK;
}

#if KVB_HAVE_CUDA
static void *dev(kvb_run *r, const char *name) { return kvb_run_find(r, name)->d; }
static const int32_t *host_i32(kvb_run *r, const char *name) { return kvb_run_find(r, name)->h; }

/* The step is planned once (and a second plan records per-stage times for the report, outside the
 * timed loop); impl=kernel captures the first plan into a CUDA graph here, so launches only replay. */
static int gpu_setup_rk(kvb_run *r)
{
    rk_priv *p = r->priv;
    if (p->x.impl == IMPL_DENSE) return KVB_OK;
    rocketkv_buffers b = {
        .q = dev(r, "q"), .knew = dev(r, "knew"), .vnew = dev(r, "vnew"),
        .t = dev(r, "t"), .t_host = host_i32(r, "t"), .len = dev(r, "len"), .len_host = host_i32(r, "len"),
        .cnt = dev(r, "cnt"), .cnt_host = host_i32(r, "cnt"),
        .K = dev(r, "K"), .V = dev(r, "V"), .kmin = dev(r, "kmin"), .kmax = dev(r, "kmax"),
        .u = dev(r, "u"), .pages = dev(r, "pages"), .o = dev(r, "o"),
        .ws_score = dev(r, "ws_score"), .ws_attn = dev(r, "ws_attn"),
    };
    for (int timed = 0; timed < 2; timed++) {
        int rc = rocketkv_step_plan_make(timed ? &p->plan_timed : &p->plan, r->c->id, &p->x.sh, &b, r->stream,
                                         r->stream2, timed);
        p->planned |= timed + 1;
        if (rc) return rc;
    }
    if (p->x.impl == IMPL_GRAPH) {
        int rc = kvb_step_capture(&p->plan.step);
        if (rc) return rc;
    }
    return KVB_OK;
}

static int launch_rk(kvb_run *r)
{
    rk_priv *p = r->priv;
    if (p->x.impl == IMPL_DENSE) {
        const rocketkv_shape *sh = &p->x.sh;
        const decode_layout d = {sh->B, sh->Hq, sh->Hkv, sh->D, p->x.dense_L};
        kvb_tensor *len = kvb_run_find(r, "len"), *t = kvb_run_find(r, "t");
        int rc = kv_append(dev(r, "knew"), dev(r, "vnew"), t->d, t->h, dev(r, "K"), dev(r, "V"), &d, r->stream);
        return rc ? rc
                  : decode_attn(dev(r, "q"), dev(r, "K"), dev(r, "V"), len->d, len->h, dev(r, "o"), &d, dev(r, "ws_attn"),
                                r->stream);
    }
    if (r->stage_timing) return rocketkv_step_enqueue(&p->plan_timed);
    return p->x.impl == IMPL_GRAPH ? kvb_step_launch_graph(&p->plan.step) : rocketkv_step_enqueue(&p->plan);
}

static int stage_times_rk(kvb_run *r)
{
    rk_priv *p = r->priv;
    if (p->x.impl == IMPL_DENSE) return KVB_OK;
    return kvb_run_stage_times(r, &p->plan_timed.step);
}
#else
static int launch_rk(kvb_run *r)
{
    (void)r;
    return KVB_EDEVICE;
}
#define gpu_setup_rk NULL
#define stage_times_rk NULL
#endif

/* Bytes, each read or written once (rocketkv_step_bytes); impl=dense: the append and every K, V row of
 * the context. Against the read ceiling. Goal (kernels/step/NOTES.md): at T=2048 after a 128K prompt,
 * the graph at least 18x faster than impl=dense at B >= 8 and 6x at B=1, both timed in the same run. */
static void cost_rk(const kvb_run *r, kvb_cost *c)
{
    const rk_priv *p = r->priv;
    const rocketkv_shape *sh = &p->x.sh;
    const double heads = (double)sh->B * sh->Hkv, G = sh->Hq / sh->Hkv, D = sh->D;
    const double qo = 2.0 * sh->B * sh->Hq * D * 2, append = heads * D * 2 * 4;
    c->ceiling = KVB_CEIL_READ;
    if (p->x.impl == IMPL_DENSE) {
        const double rows = heads * (p->x.dense_t + 1.0);
        c->bytes_dev = append + rows * D * 2 * 2 + qo;
        c->flops = 4.0 * rows * G * D;
        return;
    }
    rocketkv_step_bytes(sh, kvb_run_find((kvb_run *)r, "pages")->ref, &c->bytes_dev, &c->flops);
    if (p->x.impl == IMPL_GRAPH && kvb_case_int(r->c, "T") == 2048 && kvb_case_int(r->c, "Lmax") == 131072 &&
        !kvb_case_int(r->c, "all") && !kvb_case_int(r->c, "P") && !kvb_case_int(r->c, "r") && !kvb_case_int(r->c, "k")) {
        c->goal_impl = "dense";
        c->goal_impl_speedup = sh->B >= 8 ? 18.0 : sh->B == 1 ? 6.0 : 0;
        if (c->goal_impl_speedup <= 0) c->goal_impl = NULL;
        c->goal_text = sh->B >= 8 ? "18x faster than impl=dense" : "6x faster than impl=dense";
    }
}

static void teardown_rk(kvb_run *r)
{
    rk_priv *p = r->priv;
    if (!p) return;
#if KVB_HAVE_CUDA
    if (p->planned & 1) rocketkv_step_plan_destroy(&p->plan);
    if (p->planned & 2) rocketkv_step_plan_destroy(&p->plan_timed);
#endif
    kvb_xfree(p->mask);
    r->priv = NULL;
}

/* The step: q, knew, vnew, t, len, cnt in; K, V, kmin, kmax in and out; u, pages, o out; the prompt's
 * rows for the metadata, the references' scratch per thread, dense decode for all=1. The dense
 * baseline: q, knew, vnew, t, len, K, V in; o out; the slice sample, the reference's scores per thread. */
static size_t host_bytes_rk(const kvb_case *c)
{
    rk_case x;
    if (case_of(c, &x)) return 0;
    const rocketkv_shape *sh = &x.sh;
    const double B = sh->B, heads = B * sh->Hkv, D = sh->D, qo = B * sh->Hq * D * 2, G = sh->Hq / sh->Hkv;
    if (x.impl == IMPL_DENSE)
        return kvb_host_bytes_sat(KVB_HOLD_IN * (qo + 2 * heads * D * 2 + 8 * B + 2 * heads * (double)x.dense_L * D * 2) +
                                  KVB_HOLD_OUT * qo + heads + kvb_ref_threads() * 8.0 * (double)x.dense_L);
    const double npg = page_count(sh->t + 1, sh->P), n_sel = hybrid_selected_pages(sh->k, sh->P);
    return kvb_host_bytes_sat(KVB_HOLD_IN * (qo + 2 * heads * D * 2 + 12 * B) +
                              KVB_HOLD_INOUT * heads * D * 2 * 2 * ((double)sh->cap_tokens + sh->cap_pages) +
                              KVB_HOLD_OUT * (heads * (npg + n_sel) * 4 + qo) + heads * sh->t * D * 2 + 12 * B +
                              kvb_ref_threads() * (12.0 * D + 16.0 * sh->r + 16 * G + 8 * G * npg + 8 * npg +
                                                   8.0 * n_sel * sh->P + 8.0 * sh->cap_tokens) +
                              (kvb_case_int(c, "all") ? qo + 4 * B : 0));
}

static const kvb_impl rk_impls[] = {
    {"kernel", NULL, 0, "the two stages (hybrid_score with the metadata and cache append + page top-k, "
                        "sparse_attn_pages) replayed as one CUDA graph"},
    {"eager", NULL, 0, "the same stages enqueued one by one"},
    {"dense", NULL, 0, "baseline: kv_append and decode_attn over the whole uncompressed context"},
};

const kvb_op op_rocketkv_decode = {
    .name = "rocketkv_decode",
    .family = "step_rocketkv",
    .summary = "RocketKV's decode-time path: append, hybrid page scoring, page top-k, sparse attention (vs dense)",
    .params = rk_params,
    .n_params = NPARAMS(rk_params),
    .tol = {1e-2, 2e-2, 1e-2},
    .validate = validate_rk,
    .host_bytes = host_bytes_rk,
    .setup = setup_rk,
    .ref_check = ref_check_rk,
    .gpu_setup = gpu_setup_rk,
    .launch = launch_rk,
    KVB_IMPLS(rk_impls),
    .cost = cost_rk,
    .teardown = teardown_rk,
    .out_check = out_check_rk,
    .ref_from_out = ref_from_out_rk,
    .stage_times = stage_times_rk,
};
