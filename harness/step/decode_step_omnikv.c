/* decode_step_omnikv.c: decode_step method=omnikv (decode_step.h; the paths: kernels/step/step_omnikv.h;
 * the layer roles: reference/omnikv.h), without offload: every layer keeps K, V [B, Hkv, pos + 1, D] of
 * every token on the device (the paper's "without offload" setting). The cache's first pos rows are
 * seeded normal activations, as dense's. Key role:
 *
 *   role=filter  a filter layer: kv_append, decode_attn over pos + 1 tokens (dense's path), and beside
 *                it on the side stream the selector: omnikv_select of the step's own q over the ctx
 *                prompt rows, k = budget -> idx [B, k] (compared tie-tolerantly against its scores,
 *                which are an output too, as in ops_omnikv.c)
 *   role=sparse  a sparse layer: kv_append, sparse_attn_idx over idx [B, Hkv, n], n = k + gen + 1: the
 *                k prompt tokens a filter layer selected, then the decoded tokens ctx .. pos (this
 *                step's included). The selection is the prefill state: omnikv_select of a seeded
 *                query q_filter over this layer's prompt rows, on the device (ref_omnikv_select on the
 *                host where there is no GPU), downloaded into the host's idx so that the reference
 *                decodes exactly what the device decodes. The selector itself is held to its
 *                reference by the omnikv_select cases (cases/omnikv.cases) and the filter layer's.
 *
 * all=1 (role=sparse): k = ctx, every prompt token selected: the reference must equal dense attention
 * over the pos + 1 tokens bit for bit (both are attend_rows of reference/decode.c over the same rows in
 * the same order).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness/step/decode_step.h"
#include "harness/ops/ops.h"
#if KVB_HAVE_CUDA
#include "kernels/step/step_omnikv.h"
#endif

static const char *WHO = "decode_step method=omnikv";

typedef struct ok_state {
    double *mag;         /* filter: the scores' magnitudes [B, L] (the float comparison's scale) */
    uint8_t *score_mask; /* filter, sampled reference: per score, its sequence sampled or past the prompt */
#if KVB_HAVE_CUDA
    omnikv_path path[2]; /* per block plan */
#endif
} ok_state;

static int filter_role(const step_case *s) { return s->role == OMNIKV_ROLE_FILTER; }

static int shape_ok(const kvb_case *c, step_case *s)
{
    (void)c;
    if (s->all && filter_role(s))
        return kvb_fail(KVB_EINVAL, "%s role=filter: all=1 out of range [0, 0]: the filter layer attends every token "
                        "already", WHO);
    if (s->all && s->ctx < 1)
        return kvb_fail(KVB_EINVAL, "%s all=1: ctx=%d out of range [1, %d]: all=1 selects every prompt token", WHO,
                        s->ctx, DECODE_MAX_L - 1);
    s->ok_k = s->all ? s->ctx : s->budget;
    if (s->ok_k < 1 || s->ok_k > s->ctx)
        return kvb_fail(KVB_EINVAL, "%s: budget=%d out of range [1, ctx = %d]: %s", WHO, s->budget, s->ctx,
                        s->ok_k > s->ctx ? "a budget larger than the context" : "at least one prompt token selected");
    s->ok_n = s->ok_k + s->gen + 1;
    /* the suite's cap, as dense's: the host holds the cache three times (input, reference, the device's copy) */
    const double per_seq = 4.0 * s->m->Hkv * s->m->D * (double)s->L;
    if (per_seq * s->B > 24e9)
        return kvb_fail(KVB_EINVAL, "%s: K and V take %.1f GB at B=%d, out of range [0, 24 GB]: at most B=%d fits at "
                        "ctx=%d", WHO, per_seq * s->B * 1e-9, s->B, (int)(24e9 / per_seq), s->ctx);
    const omnikv_layout l = {s->B, s->m->Hq, s->m->Hkv, s->m->D, (int)s->L};
    return omnikv_layout_check(&l, WHO);
}

static omnikv_layout select_layout(const step_case *s)
{
    return (omnikv_layout){s->B, s->m->Hq, s->m->Hkv, s->m->D, (int)s->L};
}

/* The sparse layer's lists from a selection sel [B, k]: per (b, kv head) the k selected prompt tokens
 * (ascending, below ctx) then the decoded tokens ctx .. pos, so each list is ascending. */
static void build_lists(const step_case *s, const int32_t *sel, int32_t *idx)
{
    const int k = s->ok_k, n = s->ok_n, H = s->m->Hkv;
    for (int b = 0; b < s->B; b++)
        for (int h = 0; h < H; h++) {
            int32_t *l = idx + ((int64_t)b * H + h) * n;
            memcpy(l, sel + (int64_t)b * k, sizeof(int32_t) * (size_t)k);
            for (int j = 0; j <= s->gen; j++) l[k + j] = s->ctx + j;
        }
}

static int setup_ok(kvb_run *r, step_priv *p)
{
    const step_case *s = &p->s;
    const block_preset *m = s->m;
    const int B = s->B;
    ok_state *st = kvb_run_alloc(r, sizeof *st, "omnikv method state");
    p->ms = st;
    step_fill_ints(step_tensor(r, "len", KVB_I32, 1, B, 0, 0, 0, KVB_IN), (int)s->L);
    step_fill_ints(step_tensor(r, "prompt", KVB_I32, 1, B, 0, 0, 0, KVB_IN), s->ctx);
    kvb_tensor *K = step_tensor(r, "K", KVB_BF16, 4, B, m->Hkv, s->L, m->D, KVB_INOUT);
    kvb_tensor *V = step_tensor(r, "V", KVB_BF16, 4, B, m->Hkv, s->L, m->D, KVB_INOUT);
    K->flags |= KVB_T_NO_DUMP, V->flags |= KVB_T_NO_DUMP;
    K->cmp = V->cmp = KVB_CMP_EXACT; /* the append of the device's own knew, vnew */
    kvb_fill_bf16_normal(K->h, K->n, r->seed, kvb_stream_of("K"), 0, 0, 1);
    kvb_fill_bf16_normal(V->h, V->n, r->seed, kvb_stream_of("V"), 0, 0, 1);
    const omnikv_layout l = select_layout(s);
    size_t ws_attn = 1, ws_select = 1;
#if KVB_HAVE_CUDA
    const omnikv_step_shape sh = {filter_role(s), {B, m->Hq, m->Hkv, m->D, s->L}, s->ctx, s->ok_k, s->ok_n};
    if (kvb_gpu_available()) {
        ws_attn = omnikv_attn_workspace_bytes(&sh);
        if (filter_role(s)) ws_select = omnikv_select_workspace_bytes(&l);
    }
#endif
    step_tensor(r, "attn_ws", KVB_U8, 1, (int64_t)ws_attn, 0, 0, 0, KVB_SCRATCH);

    if (filter_role(s)) {
        snprintf(r->note, sizeof r->note, "filter layer: dense over %lld tokens, and the top %d of %d prompt tokens "
                 "selected", (long long)s->L, s->ok_k, s->ctx);
        step_tensor(r, "select_ws", KVB_U8, 1, (int64_t)ws_select, 0, 0, 0, KVB_SCRATCH);
        kvb_tensor *idx = step_tensor(r, "idx", KVB_I32, 2, B, s->ok_k, 0, 0, KVB_OUT);
        kvb_tensor *sc = step_tensor(r, "scores", KVB_FP32, 2, B, s->L, 0, 0, KVB_OUT);
        /* the selector's tolerance (ops_omnikv.c says why): rtol x the terms' magnitude */
        if (r->c->atol < 0 && r->c->rtol < 0) sc->tol = (kvb_tol){0, 1e-4, 1e-4};
        st->mag = kvb_run_alloc(r, sizeof(double) * (size_t)sc->n, "omnikv score magnitudes");
        memset(st->mag, 0, sizeof(double) * (size_t)sc->n); /* rows a sampled reference skips stay 0 */
        sc->tol_mag = st->mag;
        idx->cmp = KVB_CMP_INDEXSET;
        idx->scores = sc->ref;
        idx->scores_dtype = KVB_FP32;
        idx->scores_n = s->L;
        return KVB_OK;
    }

    snprintf(r->note, sizeof r->note, "sparse layer: %d selected prompt tokens of %d + %d decoded%s", s->ok_k, s->ctx,
             s->gen + 1, s->all ? " (every prompt token)" : "");
    kvb_tensor *qf = step_tensor(r, "q_filter", KVB_BF16, 3, B, m->Hq, m->D, 0, KVB_IN);
    kvb_fill_bf16_normal(qf->h, qf->n, r->seed, kvb_stream_of("q_filter"), 0, 0, 1);
    step_fill_ints(step_tensor(r, "cnt", KVB_I32, 1, B, 0, 0, 0, KVB_IN), s->ok_n);
    kvb_tensor *idx = step_tensor(r, "idx", KVB_I32, 3, B, m->Hkv, s->ok_n, 0, KVB_IN);
    int32_t *sel = kvb_run_alloc(r, sizeof(int32_t) * (size_t)B * s->ok_k, "the filter layer's selection");
    int rc = KVB_OK;
    if (kvb_gpu_available()) {
        /* gpu_prefill replaces it with omnikv_select's before anything is compared: the first k prompt
         * tokens meanwhile (a valid list for the setup-time reference) */
        for (int64_t i = 0; i < (int64_t)B * s->ok_k; i++) sel[i] = (int32_t)(i % s->ok_k);
    } else {
        float *scores = kvb_run_alloc(r, sizeof(float) * (size_t)B * s->L, "the filter layer's scores");
        rc = ref_omnikv_select(qf->h, K->h, kvb_run_find(r, "prompt")->h, &l, s->ok_k, scores, sel, NULL, NULL);
        kvb_run_free(r, scores);
    }
    if (!rc) build_lists(s, sel, idx->h);
    kvb_run_free(r, sel);
    return rc;
}

/* all=1: every prompt token selected, so the lists are 0 .. pos and the sparse reference computes dense
 * decode over the same rows in the same order: equal bit for bit */
static int dense_invariant(kvb_run *r, const decode_layout *d, const kvb_bf16 *q, const kvb_bf16 *K, const kvb_bf16 *V,
                           const int32_t *len, const kvb_bf16 *att, const uint8_t *slices)
{
    const int64_t n = (int64_t)d->B * d->Hq * d->D, per_slice = (int64_t)(d->Hq / d->Hkv) * d->D;
    kvb_bf16 *dense = kvb_run_alloc(r, sizeof(kvb_bf16) * (size_t)n, "dense attention (all=1)");
    int rc = ref_decode_attn(q, K, V, len, dense, d, slices);
    for (int64_t i = 0; !rc && i < n; i++)
        if ((!slices || slices[i / per_slice]) && dense[i] != att[i])
            rc = kvb_fail(KVB_EINVAL, "%s all=1: the sparse layer's attention differs from dense attention over every "
                          "token at element %lld: %g vs %g", WHO, (long long)i, kvb_bf16_to_double(att[i]),
                          kvb_bf16_to_double(dense[i]));
    kvb_run_free(r, dense);
    return rc;
}

/* The filter layer's selection from q over the prompt rows of K: scores, idx and their tolerances. A
 * sampled reference computes the sampled sequences' rows; the others' scores past the prompt are -inf
 * and compared too (the screen of skipped elements would refuse a non-finite value). */
static int ref_select_filter(kvb_run *r, step_priv *p, const kvb_bf16 *q, const kvb_bf16 *K)
{
    const step_case *s = &p->s;
    ok_state *st = p->ms;
    kvb_tensor *idx = kvb_run_find(r, "idx"), *sc = kvb_run_find(r, "scores");
    const omnikv_layout l = select_layout(s);
    int rc = ref_omnikv_select(q, K, kvb_run_find(r, "prompt")->h, &l, s->ok_k, sc->ref, idx->ref, st->mag, p->seqs);
    if (rc) return rc;
    float *ref = sc->ref;
    if (p->seqs) {
        if (!st->score_mask) st->score_mask = kvb_run_alloc(r, (size_t)sc->n, "omnikv score mask");
        for (int b = 0; b < s->B; b++)
            for (int64_t t = 0; t < s->L; t++) {
                const int64_t i = (int64_t)b * s->L + t;
                st->score_mask[i] = p->seqs[b] || t >= s->ctx;
                if (!p->seqs[b] && t >= s->ctx) ref[i] = -INFINITY, st->mag[i] = 0;
            }
        sc->slice_len = 1, sc->slice_mask = st->score_mask;
    }
    idx->slice_len = s->ok_k, idx->slice_mask = p->seqs;
    double mag_max = 0;
    for (int b = 0; b < s->B; b++)
        for (int t = 0; (!p->seqs || p->seqs[b]) && t < s->ctx; t++) mag_max = fmax(mag_max, st->mag[(int64_t)b * s->L + t]);
    idx->set_tol = 2 * (sc->tol.atol + sc->tol.rtol * mag_max); /* two scores off by the bound, swapped */
    return KVB_OK;
}

static int ref_attend_ok(kvb_run *r, step_priv *p, const kvb_bf16 *q, const kvb_bf16 *knew, const kvb_bf16 *vnew,
                         kvb_bf16 *att)
{
    const step_case *s = &p->s;
    const block_preset *m = s->m;
    const decode_layout d = {s->B, m->Hq, m->Hkv, m->D, s->L};
    kvb_tensor *K = kvb_run_find(r, "K"), *V = kvb_run_find(r, "V");
    const int32_t *len = kvb_run_find(r, "len")->h;
    step_ref_reset(K), step_ref_reset(V);
    int rc = ref_kv_append(knew, vnew, kvb_run_find(r, "pos")->h, K->ref, V->ref, &d);
    if (rc) return rc;
    if (filter_role(s)) {
        if ((rc = ref_decode_attn(q, K->ref, V->ref, len, att, &d, p->kv_slices))) return rc;
        return ref_select_filter(r, p, q, K->ref);
    }
    const sparse_layout sl = {d, s->ok_n, 1};
    rc = ref_sparse_attn_idx(q, K->ref, V->ref, len, kvb_run_find(r, "idx")->h, kvb_run_find(r, "cnt")->h, att, &sl,
                             p->kv_slices);
    if (!rc && s->all) rc = dense_invariant(r, &d, q, K->ref, V->ref, len, att, p->kv_slices);
    return rc;
}

#if KVB_HAVE_CUDA
/* The sparse layer's prefill state on the device: omnikv_select of q_filter over the prompt rows of the
 * cache's initial device copy, made into the lists on the host (k selected + the decoded tokens) and
 * uploaded; the host's idx is then the device's selection, which the reference decodes. */
static int gpu_prefill_ok(kvb_run *r, step_priv *p)
{
    const step_case *s = &p->s;
    if (filter_role(s)) return KVB_OK;
    const omnikv_layout l = select_layout(s);
    const size_t ws_bytes = omnikv_select_workspace_bytes(&l), sel_bytes = sizeof(int32_t) * (size_t)s->B * s->ok_k;
    const kvb_tensor *prompt = kvb_run_find(r, "prompt");
    kvb_tensor *idx = kvb_run_find(r, "idx");
    int32_t *sel = kvb_run_alloc(r, sel_bytes, "the filter layer's selection");
    void *ws = kvb_dmalloc(ws_bytes);
    int32_t *sel_d = kvb_dmalloc(sel_bytes);
    int rc = omnikv_select(kvb_run_find(r, "q_filter")->d, kvb_run_find(r, "K")->d_init, prompt->d, prompt->h, &l,
                           s->ok_k, sel_d, NULL, ws, ws_bytes, r->stream);
    if (!rc) {
        kvb_d2h(sel, sel_d, sel_bytes, r->stream);
        kvb_sync(r->stream);
        build_lists(s, sel, idx->h);
        kvb_h2d(idx->d, idx->h, sizeof(int32_t) * (size_t)idx->n, r->stream);
    }
    kvb_sync(r->stream);
    kvb_dfree(ws);
    kvb_dfree(sel_d);
    kvb_run_free(r, sel);
    return rc;
}

static int attention_ok(kvb_run *r, step_priv *p, int which, block_attention *a)
{
    const step_case *s = &p->s;
    const block_preset *m = s->m;
    ok_state *st = p->ms;
    const omnikv_step_shape sh = {filter_role(s), {s->B, m->Hq, m->Hkv, m->D, s->L}, s->ctx, s->ok_k, s->ok_n};
    omnikv_buffers b = {
        .pos = step_dev(r, "pos"), .pos_host = kvb_run_find(r, "pos")->h,
        .len = step_dev(r, "len"), .len_host = kvb_run_find(r, "len")->h,
        .K = step_dev(r, "K"), .V = step_dev(r, "V"), .attn_ws = step_dev(r, "attn_ws"),
    };
    if (sh.filter) {
        b.prompt = step_dev(r, "prompt"), b.prompt_host = kvb_run_find(r, "prompt")->h;
        b.sel = step_dev(r, "idx"), b.scores = step_dev(r, "scores");
        b.select_ws = step_dev(r, "select_ws"), b.select_ws_bytes = (size_t)kvb_run_find(r, "select_ws")->n;
    } else {
        b.idx = step_dev(r, "idx"), b.idx_host = kvb_run_find(r, "idx")->h;
        b.cnt = step_dev(r, "cnt"), b.cnt_host = kvb_run_find(r, "cnt")->h;
    }
    *a = (block_attention){omnikv_block_add_stages, &st->path[which], 0, 0};
    return omnikv_path_prepare(&st->path[which], &sh, &b);
}
#endif

/* Device bytes, each read or written once. Filter: dense's (every row read, the new one written), the
 * selector's read of the prompt K, its scores written and read back by the top-k, idx written. Sparse:
 * the n listed K and V rows per (b, kv head), the lists, the new row written. */
static void bytes_ok(const kvb_run *r, const step_priv *p, double *dev, double *host, double *flops)
{
    (void)r;
    const step_case *s = &p->s;
    const block_preset *m = s->m;
    const double B = s->B, Hkv = m->Hkv, Hq = m->Hq, D = m->D;
    if (filter_role(s)) {
        *dev = 2.0 * 2.0 * B * Hkv * D * (double)s->L + 2.0 * B * Hkv * s->ctx * D + 2.0 * 4.0 * B * (double)s->L +
               4.0 * B * s->ok_k;
        *flops = 4.0 * B * Hq * D * (double)s->L + 2.0 * B * Hq * D * s->ctx;
    } else {
        *dev = 2.0 * 2.0 * B * Hkv * D * s->ok_n + 4.0 * B * Hkv * s->ok_n + 2.0 * 2.0 * B * Hkv * D;
        *flops = 4.0 * B * Hq * D * s->ok_n;
    }
    *host = 0;
}

/* Without offload every layer keeps K, V of every token on the device, whatever its role. */
static void state_ok(const step_case *s, double *dev, double *host)
{
    *dev = 2.0 * 2.0 * s->m->Hkv * s->m->D * (double)s->L;
    *host = 0;
}

/* len, prompt, q_filter, cnt, idx in; K, V in and out; filter: idx, scores out and their magnitudes and
 * mask; the selection and its scores; the references' scratch (a query row set in double, a thread's
 * scores, the sparse lists' rows) */
static double host_bytes_ok(const step_case *s)
{
    const block_preset *m = s->m;
    const double B = s->B, L = (double)s->L, kv = B * m->Hkv * L * m->D * 2;
    double bytes = 8 * B + KVB_HOLD_INOUT * 2 * kv + 8.0 * m->Hq * m->D + kvb_ref_threads() * 8 * (2 * L + s->ok_n);
    if (filter_role(s)) bytes += KVB_HOLD_OUT * (B * s->ok_k * 4 + B * L * 4) + B * L * 9;
    else bytes += KVB_HOLD_IN * (B * m->Hq * m->D * 2 + 4 * B + B * m->Hkv * s->ok_n * 4) + B * s->ok_k * 4 + B * L * 4 +
                  (s->all ? B * m->Hq * m->D * 2 : 0);
    return bytes;
}

const step_method step_method_omnikv = {
    .name = "omnikv",
    .about = "K, V of every token on the device; filter layer: kv_append, decode_attn | omnikv_select; sparse layer: "
             "kv_append, sparse_attn_idx over the selected prompt tokens and the decoded ones",
    .shape = shape_ok,
    .setup = setup_ok,
    .ref_attend = ref_attend_ok,
#if KVB_HAVE_CUDA
    .gpu_prefill = gpu_prefill_ok,
    .attention = attention_ok,
#endif
    .bytes = bytes_ok,
    .state_bytes = state_ok,
    .host_bytes = host_bytes_ok,
};
