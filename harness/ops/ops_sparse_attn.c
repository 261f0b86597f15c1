/* ops_sparse_attn.c: sparse decode attention in the harness (contract and budget:
 * kernels/decode/NOTES.md).
 *
 * Kernels: sparse_attn_idx (token lists: H2O, RocketKV, OmniKV) and sparse_attn_pages (page lists:
 * Quest, RocketKV's page top-k). Implementations (impl=): kernel (one 16-token step per warp in
 * flight), steps2 (two), as for decode_attn, whose kernel they share.
 *
 * Inputs: q, K, V, len as in ops_decode.c (dist, vary). Lists: `budget` tokens per head (0: every
 * token: the invariant case, whose result must equal dense decode attention; its reference is then
 * ref_decode_attn itself, and ref_check holds the sparse reference to it). Token lists hold
 * min(budget, len[b]) distinct tokens of [0, len[b]), ascending, drawn per (b, kv head); page lists
 * min(ceil(budget / P), ceil(len[b] / P)) distinct pages, so that a sequence's last, partial page is
 * often among them. cnt[b] = the entries used in sequence b; n = the list row length. The unused
 * tail of a list holds -1 (never read: a read of it would show as a wrong result).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reference/decode.h"
#include "harness/core/ceilings.h"
#include "harness/core/op.h"
#include "harness/ops/ops.h"
#if KVB_HAVE_CUDA
#include "kernels/decode/decode.h"
#endif

#define NPARAMS(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* the keys of both ops; sparse_attn_pages adds P (kept last but one, before impl, in its table) */
#define SPARSE_KEYS                                                                                            \
    {"B", KVB_P_INT, 8, 1, DECODE_MAX_B, NULL, "batch"},                                                       \
        {"Hq", KVB_P_INT, 32, 1, 2048, NULL, "query heads"},                                                   \
        {"Hkv", KVB_P_INT, 8, 1, DECODE_MAX_HKV, NULL, "KV heads (G = Hq/Hkv in [1, 8])"},                     \
        {"D", KVB_P_INT, 128, 1, 1024, "64|128", "head dimension"},                                            \
        {"L", KVB_P_INT, 32768, 1, DECODE_MAX_L, NULL, "allocated tokens per sequence"},                       \
        {"len", KVB_P_INT, 0, 0, DECODE_MAX_L, NULL, "tokens of the longest sequence (0: L)"},                 \
        {"vary", KVB_P_INT, 0, 0, 1, NULL, "1: sequences 1..B-1 get seeded lengths in [1, len]"},              \
        {"budget", KVB_P_INT, 2048, 0, DECODE_MAX_L, NULL, "tokens selected per head (0: every token)"},      \
        {"dist", KVB_P_ENUM, 0, 0, 0, "normal|peaked", "inputs: normal, or peaked (q with std 3)"},            \
        {"seed", KVB_P_INT, 1, 0, 1e15, NULL, "input seed"}

static const kvb_param idx_params[] = {
    SPARSE_KEYS,
    {"impl", KVB_P_ENUM, 0, 0, 0, NULL, "implementation (the impl table)"},
};

static const kvb_param pages_params[] = {
    SPARSE_KEYS,
    {"P", KVB_P_INT, 16, 1, SPARSE_MAX_P, NULL, "tokens per page"},
    {"impl", KVB_P_ENUM, 0, 0, 0, NULL, "implementation (the impl table)"},
};

static int is_pages(const kvb_case *c) { return !strcmp(c->op->name, "sparse_attn_pages"); }

static int64_t lmax_of(const kvb_case *c)
{
    return kvb_case_i64(c, "len") ? kvb_case_i64(c, "len") : kvb_case_i64(c, "L");
}

/* entries per list row: every token (page) of the longest sequence, or the budget's worth */
static sparse_layout layout_of(const kvb_case *c)
{
    sparse_layout s;
    s.kv = (decode_layout){kvb_case_int(c, "B"), kvb_case_int(c, "Hq"), kvb_case_int(c, "Hkv"), kvb_case_int(c, "D"),
                           kvb_case_i64(c, "L")};
    s.P = is_pages(c) ? kvb_case_int(c, "P") : 1;
    const int64_t budget = kvb_case_i64(c, "budget"), lmax = lmax_of(c), P = s.P > 0 ? s.P : 1;
    const int64_t want = budget ? (budget + P - 1) / P : (lmax + P - 1) / P, have = (lmax + P - 1) / P;
    s.n = (int)(want < have ? want : have);
    return s;
}

static int validate_sparse(const kvb_case *c)
{
    const char *who = c->op->name;
    sparse_layout s = layout_of(c);
    const int64_t len = kvb_case_i64(c, "len"), budget = kvb_case_i64(c, "budget");
    /* before the layout's check: the list width n it checks is derived from len */
    if (len > s.kv.L)
        return kvb_fail(KVB_EINVAL, "%s: len=%lld out of range [0, L = %lld]: a length beyond the allocated cache (0: L)",
                        who, (long long)len, (long long)s.kv.L);
    int rc = sparse_layout_check(&s, who);
    if (rc) return rc;
    if (budget > lmax_of(c))
        return kvb_fail(KVB_EINVAL, "%s: budget=%lld out of range [0, %lld]: more tokens than the context holds (0: all)",
                        who, (long long)budget, (long long)lmax_of(c));
    return KVB_OK;
}

/* ---- setup ---- */

typedef struct sparse_priv {
    sparse_layout s;
    int pages;
    uint8_t *mask;
    double rows_read; /* K (and V) rows the selection covers, over all heads */
    double entries;   /* list entries used */
} sparse_priv;

/* `need` distinct values of [0, range), ascending (selection sampling: each value is taken with
 * probability still-needed / still-left) */
static void draw_ascending(kvb_rng *rng, int64_t range, int need, int32_t *out)
{
    int got = 0;
    for (int64_t v = 0; v < range && got < need; v++)
        if ((int64_t)kvb_rng_below(rng, (uint64_t)(range - v)) < need - got) out[got++] = (int32_t)v;
}

static int setup_sparse(kvb_run *r)
{
    const kvb_case *c = r->c;
    sparse_priv *p = kvb_run_alloc(r, sizeof *p, "sparse attention state");
    r->priv = p;
    p->pages = is_pages(c);
    p->s = layout_of(c);
    const sparse_layout *s = &p->s;
    const decode_layout *d = &s->kv;
    const int G = d->Hq / d->Hkv, P = s->P;
    int64_t sq[3] = {d->B, d->Hq, d->D}, skv[4] = {d->B, d->Hkv, d->L, d->D}, sl[1] = {d->B},
            sli[3] = {d->B, d->Hkv, s->n};
    kvb_tensor *q = kvb_run_tensor(r, "q", KVB_BF16, 3, sq, KVB_IN);
    kvb_tensor *K = kvb_run_tensor(r, "K", KVB_BF16, 4, skv, KVB_IN);
    kvb_tensor *V = kvb_run_tensor(r, "V", KVB_BF16, 4, skv, KVB_IN);
    kvb_tensor *len = kvb_run_tensor(r, "len", KVB_I32, 1, sl, KVB_IN);
    kvb_tensor *list = kvb_run_tensor(r, p->pages ? "pages" : "idx", KVB_I32, 3, sli, KVB_IN);
    kvb_tensor *cnt = kvb_run_tensor(r, "cnt", KVB_I32, 1, sl, KVB_IN);
    kvb_tensor *o = kvb_run_tensor(r, "o", KVB_BF16, 3, sq, KVB_OUT);
    if (K->n > (1 << 26)) K->flags |= KVB_T_NO_DUMP, V->flags |= KVB_T_NO_DUMP;
    int64_t ws[1] = {1};
#if KVB_HAVE_CUDA
    if (kvb_gpu_available()) ws[0] = (int64_t)sparse_attn_workspace_bytes(s);
#endif
    kvb_run_tensor(r, "workspace", KVB_U8, 1, ws, KVB_SCRATCH);

    int32_t *lens = len->h, *cnts = cnt->h, *lists = list->h;
    const int64_t lmax = lmax_of(c), budget = kvb_case_i64(c, "budget");
    kvb_rng rng = kvb_rng_make(r->seed, kvb_stream_of("len"));
    for (int b = 0; b < d->B; b++)
        lens[b] = (int32_t)(b == 0 || !kvb_case_int(c, "vary") ? lmax : 1 + (int64_t)kvb_rng_below(&rng, (uint64_t)lmax));
    const double qstd = !strcmp(kvb_case_enum(c, "dist"), "peaked") ? 3.0 : 1.0;
    kvb_fill_bf16_normal(q->h, q->n, r->seed, kvb_stream_of("q"), 0, 0, qstd);
    kvb_fill_bf16_normal(K->h, K->n, r->seed, kvb_stream_of("K"), 0, 0, 1);
    kvb_fill_bf16_normal(V->h, V->n, r->seed, kvb_stream_of("V"), 0, 0, 1);

    double max_rows = 0;
    for (int b = 0; b < d->B; b++) {
        const int64_t avail = p->pages ? ((int64_t)lens[b] + P - 1) / P : lens[b];
        const int64_t want = budget ? (budget + P - 1) / P : avail;
        cnts[b] = (int32_t)(want < avail ? want : avail);
        for (int h = 0; h < d->Hkv; h++) {
            int32_t *l = lists + ((int64_t)b * d->Hkv + h) * s->n;
            for (int j = 0; j < s->n; j++) l[j] = -1;
            kvb_rng lr = kvb_rng_make(r->seed, kvb_stream_of("lists") + (uint64_t)b * d->Hkv + (uint64_t)h);
            draw_ascending(&lr, avail, cnts[b], l);
            int64_t rows = cnts[b];
            if (p->pages) { /* the last page of the sequence may be partial */
                rows = 0;
                for (int j = 0; j < cnts[b]; j++) {
                    const int64_t left = (int64_t)lens[b] - (int64_t)l[j] * P;
                    rows += left < P ? left : P;
                }
            }
            p->rows_read += (double)rows;
            if ((double)rows > max_rows) max_rows = (double)rows;
        }
        p->entries += (double)cnts[b] * d->Hkv;
    }

    int64_t chosen, n_slices = (int64_t)d->B * d->Hkv;
    p->mask = kvb_sample_slices(n_slices, 2.0 * G * max_rows * d->D, KVB_REF_BUDGET, &chosen);
    o->slice_len = (int64_t)G * d->D;
    o->slice_mask = p->mask;
    if (p->mask)
        snprintf(r->note, sizeof r->note, "reference on %lld of %lld (b, kv head) slices (first, last, evenly spaced)",
                 (long long)chosen, (long long)n_slices);
    if (!budget) /* every token: the result must be dense decode attention */
        return ref_decode_attn(q->h, K->h, V->h, lens, o->ref, d, p->mask);
    return p->pages ? ref_sparse_attn_pages(q->h, K->h, V->h, lens, lists, cnts, o->ref, s, p->mask)
                    : ref_sparse_attn_idx(q->h, K->h, V->h, lens, lists, cnts, o->ref, s, p->mask);
}

/* budget=0: the sparse reference over ascending lists of every token makes the dense reference's
 * computation in the same order, so the two agree to the bit. */
static int ref_check_sparse(kvb_run *r)
{
    const sparse_priv *p = r->priv;
    if (kvb_case_i64(r->c, "budget")) return KVB_OK;
    kvb_tensor *o = kvb_run_find(r, "o");
    kvb_bf16 *alt = kvb_run_alloc(r, sizeof(kvb_bf16) * (size_t)o->n, "the sparse reference over every token");
    memcpy(alt, o->ref, sizeof(kvb_bf16) * (size_t)o->n);
    const kvb_tensor *q = kvb_run_find(r, "q"), *K = kvb_run_find(r, "K"), *V = kvb_run_find(r, "V");
    const int32_t *lens = kvb_run_find(r, "len")->h, *cnts = kvb_run_find(r, "cnt")->h;
    const int32_t *lists = kvb_run_find(r, p->pages ? "pages" : "idx")->h;
    int rc = p->pages ? ref_sparse_attn_pages(q->h, K->h, V->h, lens, lists, cnts, alt, &p->s, p->mask)
                      : ref_sparse_attn_idx(q->h, K->h, V->h, lens, lists, cnts, alt, &p->s, p->mask);
    const kvb_bf16 *ref = o->ref;
    for (int64_t i = 0; !rc && i < o->n; i++) {
        if (p->mask && !p->mask[i / o->slice_len]) continue;
        if (alt[i] != ref[i])
            rc = kvb_fail(KVB_EINVAL, "%s: the reference over lists of every token differs from dense decode at "
                          "element %lld: %g vs %g", r->op->name, (long long)i, kvb_bf16_to_double(alt[i]),
                          kvb_bf16_to_double(ref[i]));
    }
    kvb_run_free(r, alt);
    return rc;
}

static int launch_sparse(kvb_run *r)
{
#if KVB_HAVE_CUDA
    sparse_priv *p = r->priv;
    kvb_tensor *len = kvb_run_find(r, "len"), *cnt = kvb_run_find(r, "cnt");
    kvb_tensor *list = kvb_run_find(r, p->pages ? "pages" : "idx");
    const int steps = !strcmp(kvb_run_impl(r), "steps2") ? 2 : 1;
    const kvb_bf16 *q = kvb_run_find(r, "q")->d, *K = kvb_run_find(r, "K")->d, *V = kvb_run_find(r, "V")->d;
    kvb_bf16 *o = kvb_run_find(r, "o")->d;
    void *ws = kvb_run_find(r, "workspace")->d;
    return p->pages ? sparse_attn_pages(q, K, V, len->d, len->h, list->d, list->h, cnt->d, cnt->h, o, &p->s, ws, steps,
                                        r->stream)
                    : sparse_attn_idx(q, K, V, len->d, len->h, list->d, list->h, cnt->d, cnt->h, o, &p->s, ws, steps,
                                      r->stream);
#else
    (void)r;
    return KVB_EDEVICE;
#endif
}

/* Bytes: the K and V rows the lists cover, each read once (a row is D contiguous bf16: whole 32-byte
 * sectors), the used list entries, q read and o written: against the read ceiling. Goal
 * (kernels/decode/NOTES.md, Budget): at token budgets >= 1024, >= 65% of the device read bandwidth on
 * these bytes at B = 1 (a few MB, near one launch's latency) and >= 80% at every larger batch. */
static void cost_sparse(const kvb_run *r, kvb_cost *c)
{
    const sparse_priv *p = r->priv;
    const decode_layout *d = &p->s.kv;
    c->bytes_dev = 2.0 * p->rows_read * d->D * 2.0 + 4.0 * p->entries + 2.0 * d->B * d->Hq * d->D * 2.0 + 8.0 * d->B;
    c->flops = 4.0 * p->rows_read * (d->Hq / d->Hkv) * d->D;
    c->ceiling = KVB_CEIL_READ;
    const int64_t budget = kvb_case_i64(r->c, "budget");
    if (budget >= 1024 && r->ceil && r->ceil->measured) {
        const int single = d->B == 1;
        c->goal_us = kvb_read_contiguous_seconds((size_t)c->bytes_dev) * 1e6 / (single ? 0.65 : 0.8);
        c->goal_text = single ? "65% of the device read rate" : "80% of the device read rate";
    }
}

static void teardown_sparse(kvb_run *r)
{
    sparse_priv *p = r->priv;
    if (!p) return;
    kvb_xfree(p->mask);
    r->priv = NULL;
}

/* q, K, V, len, cnt, the lists in; o out, and its copy for the budget=0 check; the slice sample; the
 * references' scratch (a thread's rows and scores) */
static size_t host_bytes_sparse(const kvb_case *c)
{
    const sparse_layout s = layout_of(c);
    const decode_layout *d = &s.kv;
    const double q = (double)d->B * d->Hq * d->D * 2, kv = 2.0 * d->B * d->Hkv * (double)d->L * d->D * 2;
    const double lists = (double)d->B * d->Hkv * s.n * 4;
    return kvb_host_bytes_sat(KVB_HOLD_IN * (q + kv + 8.0 * d->B + lists) + (KVB_HOLD_OUT + 1) * q + (double)d->B * d->Hkv +
                              kvb_ref_threads() * 8.0 * ((double)s.n * s.P + (double)d->L));
}

static const kvb_impl sparse_impls[] = {
    {"kernel", NULL, 0, "decode_attn's kernel gathering listed rows, one 16-token step per warp in flight"},
    {"steps2", NULL, 0, "the same with two steps per warp in flight"},
};

const kvb_op op_sparse_attn_idx = {
    .name = "sparse_attn_idx",
    .family = "decode",
    .summary = "sparse decode attention over token index lists: GQA, per-sequence lengths and counts",
    .params = idx_params,
    .n_params = NPARAMS(idx_params),
    .tol = {1e-2, 2e-2, 1e-2},
    .validate = validate_sparse,
    .host_bytes = host_bytes_sparse,
    .setup = setup_sparse,
    .ref_check = ref_check_sparse,
    .launch = launch_sparse,
    KVB_IMPLS(sparse_impls),
    .cost = cost_sparse,
    .teardown = teardown_sparse,
};

const kvb_op op_sparse_attn_pages = {
    .name = "sparse_attn_pages",
    .family = "decode",
    .summary = "sparse decode attention over page lists (P tokens a page, the last one partial)",
    .params = pages_params,
    .n_params = NPARAMS(pages_params),
    .tol = {1e-2, 2e-2, 1e-2},
    .validate = validate_sparse,
    .host_bytes = host_bytes_sparse,
    .setup = setup_sparse,
    .ref_check = ref_check_sparse,
    .launch = launch_sparse,
    KVB_IMPLS(sparse_impls),
    .cost = cost_sparse,
    .teardown = teardown_sparse,
};
