/* ops_selective_attn.c: the selective_attn family in the harness (contract, tolerances and goals:
 * kernels/selective_attn/NOTES.md).
 *
 * Kernels:
 *   selective_attn  O, LSE and column sums (per query head; colsum_kv per KV head with group_sum=1).
 *                   impl=kernel (both passes), fwd_only (the suite's forward alone: O, LSE),
 *                   colsum_only (the column-sum pass alone, from an LSE the kernel computed once
 *                   before timing), cublas (materialized: Q K^T GEMM, softmax, column sums, P V GEMM).
 *                   kernel, fwd_only and colsum_only run the Hopper (wgmma) passes on a compute
 *                   capability 9.0 device; kernel_mma, fwd_only_mma and colsum_only_mma always the
 *                   mma.sync ones, for A/B in the same run.
 *   heavy_hitters   MiniKV's selection from given column sums: top-k plus the recent window (pyramid
 *                   budgets over layers), per query head or per KV head, and the gather of the kept
 *                   K, V rows. The scores are inputs (seeded, with many exact ties), identical for the
 *                   kernel and the reference, so the kept set must equal the reference's exactly
 *                   (the tie rule included) and the gathered rows are compared bit for bit.
 *   snapkv          RocketKV's SnapKV++ stage from Q, K, V: column sums of the last W = min(32, L) rows
 *                   per KV group, max-pooling, top-k plus the window, gather. The scores come from the
 *                   kernel here, so the kept set is compared tie-tolerantly (index set against the
 *                   reference's pooled scores) and the gathered rows against K, V at the kernel's own
 *                   indices.
 *
 * Inputs (seeded, counter-based; never all zeros), `input=`:
 *   normal  Q, K, V ~ N(0, 1): logits q.k/sqrt(D) ~ N(0, 1), nearly flat column sums
 *   peaked  Q ~ N(0, 6^2): logits ~ N(0, 36), so the few largest keys of each row take most of its mass
 *   sink    per (b, KV head) a direction u (entries +-1/2); its query heads get Q = N(0, 1) + u and key 0
 *           is c*u with q.k0/sqrt(D) ~ ln(L) + 2, so key 0 takes ~80% of every row's mass
 * Large cases compute the reference on a deterministic sample of (b, KV head) groups (all G query heads
 * of each, so colsum_kv is complete) that includes the first and the last; the note says how many.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reference/heavy_hitters.h"
#include "reference/selective_attn.h"
#include "harness/core/ceilings.h"
#include "harness/core/op.h"
#include "harness/ops/ops.h"
#if KVB_HAVE_CUDA
#include <cublas_v2.h>

#include "kernels/heavy_hitters/heavy_hitters.h"
#include "kernels/selective_attn/selective_attn.h"
#endif

/* ---- keys ---- */

#define K_B {"B", KVB_P_INT, 1, 1, 1024, NULL, "batch"}
#define K_HQ {"Hq", KVB_P_INT, 32, 1, 1024, NULL, "query heads"}
#define K_HKV {"Hkv", KVB_P_INT, 8, 1, 256, NULL, "KV heads (Hq = G * Hkv)"}
#define K_L {"L", KVB_P_INT, 4096, 1, SATTN_MAX_L, NULL, "tokens (queries = keys)"}
#define K_D {"D", KVB_P_INT, 128, 1, 1024, "64|128", "head dimension"}
#define K_D_ANY {"D", KVB_P_INT, 128, 1, 1024, NULL, "head dimension"}
#define K_INPUT {"input", KVB_P_ENUM, 0, 0, 0, "normal|peaked|sink", "input distribution (see ops_selective_attn.c)"}
#define K_SAMPLE {"sample", KVB_P_INT, 0, 0, 1 << 20, NULL, "reference on this many (b, KV head) groups; 0: all when cheap, else a sample"}
#define K_SEED {"seed", KVB_P_INT, 1, 0, 1e15, NULL, "input seed"}

static const kvb_param attn_params[] = {
    K_B, K_HQ, K_HKV, K_L, K_D,
    {"causal", KVB_P_INT, 1, 0, 1, NULL, "1: key j visible to query i only when j <= i"},
    {"w0", KVB_P_INT, 0, 0, SATTN_MAX_L, NULL, "first query row that contributes to the column sums"},
    {"need_out", KVB_P_INT, 1, 0, 1, NULL, "1: O and LSE of every row; 0: LSE of rows w0.. only, no O"},
    {"group_sum", KVB_P_INT, 0, 0, 1, NULL, "1: also colsum_kv, summed over the G query heads of each KV head"},
    K_INPUT, K_SAMPLE, K_SEED,
    {"impl", KVB_P_ENUM, 0, 0, 0, NULL, "implementation (the impl table)"},
};
static const kvb_param hh_params[] = {
    K_B, K_HQ, K_HKV, K_L, K_D_ANY,
    {"heavy", KVB_P_FLOAT, 0.25, 0, 1, NULL, "heavy-hitter ratio (MiniKV: 0.25)"},
    {"recent", KVB_P_FLOAT, 0.25, 0, 1, NULL, "recent-window ratio (MiniKV: 0.25)"},
    {"layer", KVB_P_INT, 0, 0, 1024, NULL, "layer index for the pyramid schedule"},
    {"layers", KVB_P_INT, 1, 1, 1024, NULL, "layers of the pyramid schedule (1: the uniform ratio)"},
    {"select_per", KVB_P_ENUM, 0, 0, 0, "q|kv", "one selection per query head, or per KV head (from colsum_kv)"},
    K_SEED,
};
static const kvb_param snap_params[] = {
    K_B, K_HQ, K_HKV, K_L, K_D,
    {"budget", KVB_P_INT, 1024, 0, SATTN_MAX_L, NULL, "tokens kept per KV head (window included); >= L keeps all"},
    {"ks", KVB_P_INT, 0, 0, SNAPKV_MAX_KS, NULL, "odd max-pooling kernel; 0: 63 below 48K tokens, 511 at or above"},
    K_INPUT, K_SEED,
};

#define NPARAMS(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* The cuBLAS peer materializes S (fp32) and P (bf16) of one KV head's G query heads at least. */
#define MATERIALIZED_MAX_BYTES (40.0 * (1ull << 30))

/* Reference budget: (query, key) pairs times D, summed over the computed heads. About 4 s on the H200
 * host's 16 cores (the reference runs about 3.5e10 of them a second there: 5.5e11 took 17.7 s). */
#define REF_BUDGET 1.5e11

static sattn_params attn_of(const kvb_case *c)
{
    sattn_params p;
    p.B = kvb_case_int(c, "B");
    p.Hq = kvb_case_int(c, "Hq");
    p.Hkv = kvb_case_int(c, "Hkv");
    p.L = kvb_case_int(c, "L");
    p.D = kvb_case_int(c, "D");
    p.causal = kvb_case_int(c, "causal");
    p.w0 = kvb_case_int(c, "w0");
    p.need_out = kvb_case_int(c, "need_out");
    p.group_sum = kvb_case_int(c, "group_sum");
    return p;
}

/* SnapKV++'s attention: causal, the last W rows, no O, summed per group */
static sattn_params snap_attn_of(const kvb_case *c, int W)
{
    sattn_params p;
    p.B = kvb_case_int(c, "B");
    p.Hq = kvb_case_int(c, "Hq");
    p.Hkv = kvb_case_int(c, "Hkv");
    p.L = kvb_case_int(c, "L");
    p.D = kvb_case_int(c, "D");
    p.causal = 1;
    p.w0 = p.L - W;
    p.need_out = 0;
    p.group_sum = 1;
    return p;
}

/* The implementations, in the order of the impl table (attn_impls below): impl= is its index. */
enum { IMPL_KERNEL, IMPL_FWD_ONLY, IMPL_COLSUM_ONLY, IMPL_CUBLAS, IMPL_KERNEL_MMA, IMPL_FWD_ONLY_MMA, IMPL_COLSUM_ONLY_MMA };

/* What an implementation computes (the *_mma impls compute what their counterparts do, on the
 * mma.sync kernels): IMPL_KERNEL, IMPL_FWD_ONLY, IMPL_COLSUM_ONLY or IMPL_CUBLAS. */
static int pass_of(int impl)
{
    switch (impl) {
    case IMPL_KERNEL_MMA: return IMPL_KERNEL;
    case IMPL_FWD_ONLY_MMA: return IMPL_FWD_ONLY;
    case IMPL_COLSUM_ONLY_MMA: return IMPL_COLSUM_ONLY;
    default: return impl;
    }
}

static int impl_index(const kvb_case *c) { return (int)kvb_case_get(c, "impl"); }

static int validate_attn(const kvb_case *c)
{
    sattn_params p = attn_of(c);
    int rc = sattn_check(&p, "selective_attn");
    if (rc) return rc;
    const int impl = pass_of(impl_index(c));
    if (impl == IMPL_FWD_ONLY && !p.need_out)
        return kvb_fail(KVB_EINVAL, "selective_attn: need_out=0 out of range [1, 1] for impl=fwd_only and fwd_only_mma (the "
                                    "forward produces O)");
    if (impl == IMPL_CUBLAS) {
        double R = p.need_out ? p.L : p.L - p.w0, G = sattn_groups(&p);
        double bytes = G * R * p.L * 6.0;
        if (bytes > MATERIALIZED_MAX_BYTES)
            return kvb_fail(KVB_EINVAL,
                            "selective_attn: L=%d out of range for impl=cublas: one KV head's G=%d query heads need G*R*L*6 = "
                            "%.1f GB of S and P (at most %.0f GB)",
                            p.L, (int)G, bytes * 1e-9, MATERIALIZED_MAX_BYTES * 1e-9);
    }
    return KVB_OK;
}

static int hh_counts(const kvb_case *c, int *n_hh, int *n_rw, int *n_keep)
{
    double r;
    int rc = hh_pyramid_ratio(kvb_case_get(c, "heavy"), kvb_case_int(c, "layer"), kvb_case_int(c, "layers"), &r,
                              "heavy_hitters");
    if (rc) return rc;
    return hh_budget(kvb_case_int(c, "L"), r, kvb_case_get(c, "recent"), n_hh, n_rw, n_keep, "heavy_hitters");
}


static int check_heads(const kvb_case *c, const char *who)
{
    int Hq = kvb_case_int(c, "Hq"), Hkv = kvb_case_int(c, "Hkv"), D = kvb_case_int(c, "D");
    if (Hq % Hkv) return kvb_fail(KVB_EINVAL, "%s: Hq=%d is not a multiple of Hkv=%d (GQA: Hq = G * Hkv)", who, Hq, Hkv);
    if (D % 8) return kvb_fail(KVB_EINVAL, "%s: D=%d is not a multiple of 8 (rows are gathered in 16-byte pieces)", who, D);
    return KVB_OK;
}

static int validate_hh(const kvb_case *c)
{
    int rc = check_heads(c, "heavy_hitters"), n_hh, n_rw, n_keep;
    if (rc || (rc = hh_counts(c, &n_hh, &n_rw, &n_keep))) return rc;
    if (n_keep < 1)
        return kvb_fail(KVB_EINVAL, "heavy_hitters: floor(L*heavy) + floor(L*recent) = 0 tokens kept (L=%d): nothing to select",
                        kvb_case_int(c, "L"));
    return KVB_OK;
}

static int validate_snap(const kvb_case *c)
{
    int L = kvb_case_int(c, "L"), W, n_keep, ks;
    int rc = snapkv_budget(L, kvb_case_int(c, "budget"), &W, &n_keep, "snapkv");
    if (rc || (rc = snapkv_pool_size(L, kvb_case_int(c, "ks"), &ks, "snapkv"))) return rc;
    sattn_params p = snap_attn_of(c, W);
    return sattn_check(&p, "snapkv");
}

/* ---- op-private state ---- */

typedef struct sattn_priv {
    sattn_params p;
    int impl;
    uint8_t *kv_mask, *bh_mask; /* sampled reference: 1 = computed; NULL = all */
    size_t ws_bytes;
    size_t topk_ws; /* heavy_hitters, snapkv: the top-k's workspace (its split plans) */
    int rows, group, n_hh, n_rw, n_keep, W, ks; /* heavy_hitters, snapkv */
#if KVB_HAVE_CUDA
    cublasHandle_t cublas;
#endif
} sattn_priv;

static sattn_priv *priv_new(kvb_run *r)
{
    sattn_priv *p = kvb_run_alloc(r, sizeof *p, "selective_attn state");
    r->priv = p;
    return p;
}

static void teardown_sattn(kvb_run *r)
{
    sattn_priv *p = r->priv;
    if (!p) return;
#if KVB_HAVE_CUDA
    if (p->cublas) cublasDestroy(p->cublas);
#endif
    r->priv = NULL;
}

/* ---- inputs ---- */

static kvb_tensor *add4(kvb_run *r, const char *name, kvb_dtype dt, int64_t a, int64_t b, int64_t c, int64_t d, int role)
{
    int64_t s[4] = {a, b, c, d};
    return kvb_run_tensor(r, name, dt, 4, s, role);
}

static kvb_tensor *add3(kvb_run *r, const char *name, kvb_dtype dt, int64_t a, int64_t b, int64_t c, int role)
{
    int64_t s[3] = {a, b, c};
    return kvb_run_tensor(r, name, dt, 3, s, role);
}

static kvb_tensor *add_scratch(kvb_run *r, const char *name, size_t bytes)
{
    int64_t s[1] = {(int64_t)(bytes ? bytes : 1)};
    return kvb_run_tensor(r, name, KVB_U8, 1, s, KVB_SCRATCH);
}

/* Q, K, V of one of the input distributions (file comment). */
static void make_qkv(kvb_run *r, const sattn_params *p, const char *input, kvb_tensor *q, kvb_tensor *k, kvb_tensor *v)
{
    const uint64_t seed = r->seed;
    const int64_t LD = (int64_t)p->L * p->D;
    const int G = sattn_groups(p);
    kvb_fill_bf16_normal(k->h, k->n, seed, kvb_stream_of("K"), 0, 0, 1);
    kvb_fill_bf16_normal(v->h, v->n, seed, kvb_stream_of("V"), 0, 0, 1);
    kvb_fill_bf16_normal(q->h, q->n, seed, kvb_stream_of("Q"), 0, 0, strcmp(input, "peaked") ? 1.0 : 6.0);
    if (strcmp(input, "sink")) return;
    /* u entries +-1/2: |u|^2 = D/4; q = n + u gives q.(c u) / sqrt(D) ~ c sqrt(D) / 4 */
    const double c = (log((double)p->L) + 2.0) / (sqrt((double)p->D) / 4.0);
    double *u = kvb_run_alloc(r, sizeof(double) * (size_t)p->D, "the sink direction");
    for (int64_t bk = 0; bk < (int64_t)p->B * p->Hkv; bk++) {
        for (int d = 0; d < p->D; d++)
            u[d] = kvb_uniform01(seed, kvb_stream_of("sink_u"), (uint64_t)(bk * p->D + d)) < 0.5 ? -0.5 : 0.5;
        kvb_bf16 *k0 = (kvb_bf16 *)k->h + bk * LD;
        for (int d = 0; d < p->D; d++) k0[d] = kvb_double_to_bf16(c * u[d]);
        for (int g = 0; g < G; g++) {
            kvb_bf16 *qh = (kvb_bf16 *)q->h + (bk * G + g) * LD;
#pragma omp parallel for schedule(static)
            for (int64_t i = 0; i < LD; i++) qh[i] = kvb_double_to_bf16(kvb_bf16_to_double(qh[i]) + u[i % p->D]);
        }
    }
    kvb_run_free(r, u);
}

/* Which (b, KV head) groups the reference computes: all when the work fits REF_BUDGET (or `sample`
 * says how many), else evenly spaced ones including the first and the last. Returns the count;
 * *mask is NULL when all are computed. */
static int64_t choose_sample(kvb_run *r, const sattn_params *p, int sample, uint8_t **mask)
{
    const int64_t n_kv = (int64_t)p->B * p->Hkv;
    const double per = sattn_groups(p) * sattn_pairs(p, p->need_out ? 0 : p->w0) * p->D;
    int64_t n = sample > 0 ? sample : (per * n_kv <= REF_BUDGET ? n_kv : (int64_t)(REF_BUDGET / per));
    if (n < 2) n = 2;
    *mask = NULL;
    if (n >= n_kv) return n_kv;
    uint8_t *m = kvb_run_alloc(r, (size_t)n_kv, "the reference's group sample");
    for (int64_t i = 0; i < n; i++) m[(int64_t)llround((double)i * (n_kv - 1) / (n - 1))] = 1;
    int64_t count = 0;
    for (int64_t i = 0; i < n_kv; i++) count += m[i];
    *mask = m;
    return count;
}

static void set_tol(const kvb_run *r, kvb_tensor *t, double atol, double rtol, double l2)
{
    const kvb_case *c = r->c;
    t->tol.atol = c->atol >= 0 ? c->atol : atol;
    t->tol.rtol = c->rtol >= 0 ? c->rtol : rtol;
    t->tol.l2 = c->l2 >= 0 ? c->l2 : l2;
}

/* LSE and column sums: atol 1e-3, rtol 1e-3, rel L2 1e-3 (NOTES.md says why) */
static void stat_tol(const kvb_run *r, kvb_tensor *t) { set_tol(r, t, 1e-3, 1e-3, 1e-3); }

static void mask_slices(kvb_tensor *t, int64_t slice_len, const uint8_t *mask)
{
    t->slice_len = slice_len;
    t->slice_mask = mask;
}

/* ---- selective_attn ---- */

static size_t ws_bytes_of(const sattn_priv *pv)
{
#if KVB_HAVE_CUDA
    if (pv->impl == IMPL_CUBLAS) {
        size_t b = 0;
        return selective_attn_materialized_workspace_bytes(&pv->p, &b) == KVB_OK ? b : 0;
    }
    return selective_attn_workspace_bytes(&pv->p);
#else
    (void)pv;
    return 0;
#endif
}

/* ---- the reference memo ----
 * The check cases come in families on the same inputs (Q, K, V of one shape, input kind and seed):
 * implementations, and a window w0 = 0 beside w0 = L - 32. O and every row's LSE do not depend on w0, so
 * the last reference with O (need_out=1) is kept: a case on the same inputs and the same sample takes its
 * O and LSE, and its column sums as well when w0 is the same; otherwise the reference runs on the rows
 * >= w0 alone (need_out=0), whose column sums are the whole reference's to the bit (reference/
 * selective_attn.c: the contributing rows' parts do not depend on need_out). Held outside the run's
 * accounting (plain realloc) and only up to ATTN_MEMO_MAX_BYTES; a failed allocation keeps nothing. */
enum { ATTN_MEMO_MAX_BYTES = 256 << 20 };
static struct {
    int valid, B, Hq, Hkv, L, D, causal, w0, has_csk;
    char input[32];
    uint64_t seed;
    uint8_t *kv_mask; /* NULL: every group */
    kvb_bf16 *O;
    float *LSE, *colsum, *colsum_kv;
} g_attn_memo;

static int attn_memo_matches(const sattn_params *p, const char *input, uint64_t seed, const uint8_t *kv_mask)
{
    const int64_t n_kv = (int64_t)p->B * p->Hkv;
    return g_attn_memo.valid && g_attn_memo.B == p->B && g_attn_memo.Hq == p->Hq && g_attn_memo.Hkv == p->Hkv &&
           g_attn_memo.L == p->L && g_attn_memo.D == p->D && g_attn_memo.causal == p->causal &&
           !strcmp(g_attn_memo.input, input) && g_attn_memo.seed == seed && !g_attn_memo.kv_mask == !kv_mask &&
           (!kv_mask || !memcmp(g_attn_memo.kv_mask, kv_mask, (size_t)n_kv));
}

static void *memo_copy(void *old, const void *src, size_t bytes)
{
    void *p = realloc(old, bytes ? bytes : 1);
    if (p) memcpy(p, src, bytes);
    return p;
}

static void attn_memo_keep(const sattn_params *p, const char *input, uint64_t seed, const uint8_t *kv_mask,
                           const kvb_bf16 *O, const float *LSE, const float *colsum, const float *colsum_kv)
{
    const size_t n_q = (size_t)p->B * p->Hq * p->L, n_kv = (size_t)p->B * p->Hkv;
    g_attn_memo.valid = 0;
    if (n_q * p->D * 2 > ATTN_MEMO_MAX_BYTES || strlen(input) >= sizeof g_attn_memo.input) return;
    if (!(g_attn_memo.O = memo_copy(g_attn_memo.O, O, n_q * p->D * 2)) ||
        !(g_attn_memo.LSE = memo_copy(g_attn_memo.LSE, LSE, n_q * 4)) ||
        !(g_attn_memo.colsum = memo_copy(g_attn_memo.colsum, colsum, n_q * 4)) ||
        (colsum_kv && !(g_attn_memo.colsum_kv = memo_copy(g_attn_memo.colsum_kv, colsum_kv, n_kv * p->L * 4))) ||
        (kv_mask && !(g_attn_memo.kv_mask = memo_copy(g_attn_memo.kv_mask, kv_mask, n_kv))))
        return; /* what was copied stays allocated for the next keep; valid stays 0 */
    if (!kv_mask) free(g_attn_memo.kv_mask), g_attn_memo.kv_mask = NULL;
    snprintf(g_attn_memo.input, sizeof g_attn_memo.input, "%s", input);
    g_attn_memo.B = p->B, g_attn_memo.Hq = p->Hq, g_attn_memo.Hkv = p->Hkv, g_attn_memo.L = p->L;
    g_attn_memo.D = p->D, g_attn_memo.causal = p->causal, g_attn_memo.w0 = p->w0, g_attn_memo.seed = seed;
    g_attn_memo.has_csk = colsum_kv != NULL;
    g_attn_memo.valid = 1;
}

/* ref_selective_attn through the memo (above); the note says when the memo served */
static int attn_reference(kvb_run *r, const sattn_priv *pv, const char *input, const kvb_tensor *q,
                          const kvb_tensor *k, const kvb_tensor *v, kvb_bf16 *O, float *LSE, float *colsum,
                          float *colsum_kv)
{
    const sattn_params *p = &pv->p;
    if (!p->need_out) return ref_selective_attn(q->h, k->h, v->h, p, pv->kv_mask, O, LSE, colsum, colsum_kv);
    const size_t n_q = (size_t)p->B * p->Hq * p->L, n_kv = (size_t)p->B * p->Hkv;
    if (!attn_memo_matches(p, input, r->seed, pv->kv_mask)) {
        const int rc = ref_selective_attn(q->h, k->h, v->h, p, pv->kv_mask, O, LSE, colsum, colsum_kv);
        if (rc == KVB_OK) attn_memo_keep(p, input, r->seed, pv->kv_mask, O, LSE, colsum, colsum_kv);
        return rc;
    }
    memcpy(O, g_attn_memo.O, n_q * p->D * 2);
    memcpy(LSE, g_attn_memo.LSE, n_q * 4);
    int rc = KVB_OK;
    const int sums_kept = g_attn_memo.w0 == p->w0 && (g_attn_memo.has_csk || !colsum_kv);
    if (sums_kept) {
        memcpy(colsum, g_attn_memo.colsum, n_q * 4);
        if (colsum_kv) memcpy(colsum_kv, g_attn_memo.colsum_kv, n_kv * p->L * 4);
    } else { /* the column sums from the rows >= w0 alone */
        sattn_params rows = *p;
        rows.need_out = 0;
        float *lse_rows = kvb_run_alloc(r, sizeof(float) * (size_t)p->B * p->Hq * (size_t)sattn_lse_len(&rows),
                                        "the window rows' LSE");
        rc = ref_selective_attn(q->h, k->h, v->h, &rows, pv->kv_mask, NULL, lse_rows, colsum, colsum_kv);
        kvb_run_free(r, lse_rows);
    }
    const size_t used = strlen(r->note);
    snprintf(r->note + used, sizeof r->note - used, "%sO and LSE%s from an earlier case's identical inputs",
             used ? "; " : "", sums_kept ? ", column sums" : "");
    return rc;
}

static int setup_attn(kvb_run *r)
{
    const kvb_case *c = r->c;
    sattn_priv *pv = priv_new(r);
    sattn_params *p = &pv->p;
    *p = attn_of(c);
    pv->impl = impl_index(c);
    const int B = p->B, Hq = p->Hq, Hkv = p->Hkv, L = p->L, D = p->D, lse_len = sattn_lse_len(p);
    kvb_tensor *q = add4(r, "Q", KVB_BF16, B, Hq, L, D, KVB_IN);
    kvb_tensor *k = add4(r, "K", KVB_BF16, B, Hkv, L, D, KVB_IN);
    kvb_tensor *v = add4(r, "V", KVB_BF16, B, Hkv, L, D, KVB_IN);
    make_qkv(r, p, kvb_case_enum(c, "input"), q, k, v);

    /* outputs of this implementation; the reference fills every one (others into scratch buffers) */
    const int pass = pass_of(pv->impl);
    const int has_o = p->need_out && pass != IMPL_COLSUM_ONLY;
    const int has_lse = pass != IMPL_COLSUM_ONLY;
    const int has_cs = pass != IMPL_FWD_ONLY;
    kvb_tensor *o = has_o ? add4(r, "O", KVB_BF16, B, Hq, L, D, KVB_OUT) : NULL;
    kvb_tensor *lse = has_lse ? add3(r, "LSE", KVB_FP32, B, Hq, lse_len, KVB_OUT) : NULL;
    kvb_tensor *cs = has_cs ? add3(r, "colsum", KVB_FP32, B, Hq, L, KVB_OUT) : NULL;
    kvb_tensor *csk = has_cs && p->group_sum ? add3(r, "colsum_kv", KVB_FP32, B, Hkv, L, KVB_OUT) : NULL;
    if (pass == IMPL_COLSUM_ONLY) { /* the LSE the colsum pass reads, computed by the kernel in gpu_setup */
        if (p->need_out) add4(r, "O_before", KVB_BF16, B, Hq, L, D, KVB_SCRATCH);
        add3(r, "LSE_before", KVB_FP32, B, Hq, lse_len, KVB_SCRATCH);
        add3(r, "colsum_before", KVB_FP32, B, Hq, L, KVB_SCRATCH);
        if (p->group_sum) add3(r, "colsum_kv_before", KVB_FP32, B, Hkv, L, KVB_SCRATCH);
    }
    pv->ws_bytes = ws_bytes_of(pv);
    add_scratch(r, "workspace", pv->ws_bytes);
    if (lse) stat_tol(r, lse);
    if (cs) stat_tol(r, cs);
    if (csk) stat_tol(r, csk);

    const int64_t n_kv = (int64_t)B * Hkv, n_kv_sampled = choose_sample(r, p, kvb_case_int(c, "sample"), &pv->kv_mask);
    const int G = sattn_groups(p);
    if (pv->kv_mask) {
        pv->bh_mask = kvb_run_alloc(r, (size_t)B * Hq, "the reference's head sample");
        for (int64_t bh = 0; bh < (int64_t)B * Hq; bh++) pv->bh_mask[bh] = pv->kv_mask[bh / G];
        if (o) mask_slices(o, (int64_t)L * D, pv->bh_mask);
        if (lse) mask_slices(lse, lse_len, pv->bh_mask);
        if (cs) mask_slices(cs, L, pv->bh_mask);
        if (csk) mask_slices(csk, L, pv->kv_mask);
        snprintf(r->note, sizeof r->note,
                 "reference on %lld of %lld (b, KV head) groups (G=%d query heads each), the first and the last included",
                 (long long)n_kv_sampled, (long long)n_kv, G);
    }
    /* the reference: outputs this implementation does not produce go to temporary buffers */
    const int64_t n_q = (int64_t)B * Hq * L;
    const char *tmp = "a reference output this implementation does not produce";
    kvb_bf16 *o_ref = o ? o->ref : (p->need_out ? kvb_run_alloc(r, (size_t)(n_q * D) * 2, tmp) : NULL);
    float *lse_ref = lse ? lse->ref : kvb_run_alloc(r, (size_t)((int64_t)B * Hq * lse_len) * 4, tmp);
    float *cs_ref = cs ? cs->ref : kvb_run_alloc(r, (size_t)n_q * 4, tmp);
    float *csk_ref = csk ? csk->ref : (p->group_sum ? kvb_run_alloc(r, (size_t)(n_kv * L) * 4, tmp) : NULL);
    if (pv->kv_mask) { /* slices the sample skips hold zeros, not garbage, in dumps */
        if (o) memset(o->ref, 0, (size_t)o->n * 2);
        if (lse) memset(lse->ref, 0, (size_t)lse->n * 4);
        if (cs) memset(cs->ref, 0, (size_t)cs->n * 4);
        if (csk) memset(csk->ref, 0, (size_t)csk->n * 4);
    }
    int rc = attn_reference(r, pv, kvb_case_enum(c, "input"), q, k, v, o_ref, lse_ref, cs_ref, csk_ref);
    if (!o) kvb_run_free(r, o_ref);
    if (!lse) kvb_run_free(r, lse_ref);
    if (!cs) kvb_run_free(r, cs_ref);
    if (!csk) kvb_run_free(r, csk_ref);
    return rc;
}

/* Invariant: over each computed head, sum_j colsum[j] = number of contributing rows, L - w0
 * (each row's probabilities sum to 1); over each KV head, sum_j colsum_kv[j] = G (L - w0). */
static int check_colsum_rows(const float *cs, int64_t heads, int L, const uint8_t *mask, double rows, const char *what)
{
    for (int64_t h = 0; h < heads; h++) {
        if (mask && !mask[h]) continue;
        double s = 0;
        for (int j = 0; j < L; j++) s += cs[h * L + j];
        if (!(fabs(s - rows) <= 1e-5 * rows))
            return kvb_fail(KVB_EINVAL, "%s of head %lld sums to %.9g, expected the %g contributing rows", what, (long long)h, s,
                            rows);
    }
    return KVB_OK;
}

static int ref_check_attn(kvb_run *r)
{
    sattn_priv *pv = r->priv;
    const sattn_params *p = &pv->p;
    const kvb_tensor *cs = kvb_run_find(r, "colsum"), *csk = kvb_run_find(r, "colsum_kv");
    const double rows = p->L - p->w0;
    if (cs) {
        int rc = check_colsum_rows(cs->ref, (int64_t)p->B * p->Hq, p->L, pv->bh_mask, rows, "colsum");
        if (rc) return rc;
    }
    if (csk) return check_colsum_rows(csk->ref, (int64_t)p->B * p->Hkv, p->L, pv->kv_mask, rows * sattn_groups(p), "colsum_kv");
    return KVB_OK;
}

#if KVB_HAVE_CUDA
static void *dev(kvb_run *r, const char *name)
{
    kvb_tensor *t = kvb_run_find(r, name);
    return t ? t->d : NULL;
}

static int gpu_setup_attn(kvb_run *r)
{
    sattn_priv *pv = r->priv;
    if (pv->impl == IMPL_CUBLAS) {
        if (cublasCreate(&pv->cublas) != CUBLAS_STATUS_SUCCESS) return kvb_fail(KVB_EDEVICE, "selective_attn: cublasCreate failed");
        return KVB_OK;
    }
    if (pass_of(pv->impl) != IMPL_COLSUM_ONLY) return KVB_OK;
    int rc = selective_attn(dev(r, "Q"), dev(r, "K"), dev(r, "V"), &pv->p, dev(r, "O_before"), dev(r, "LSE_before"),
                            dev(r, "colsum_before"), dev(r, "colsum_kv_before"), dev(r, "workspace"), pv->ws_bytes, r->stream);
    kvb_sync(r->stream);
    return rc;
}

/* One launch of each implementation (the impl table's launch entries). */
static int launch_kernel(kvb_run *r)
{
    sattn_priv *pv = r->priv;
    return selective_attn(dev(r, "Q"), dev(r, "K"), dev(r, "V"), &pv->p, dev(r, "O"), dev(r, "LSE"), dev(r, "colsum"),
                          dev(r, "colsum_kv"), dev(r, "workspace"), pv->ws_bytes, r->stream);
}

static int launch_fwd_only(kvb_run *r)
{
    sattn_priv *pv = r->priv;
    return selective_attn_fwd(dev(r, "Q"), dev(r, "K"), dev(r, "V"), &pv->p, dev(r, "O"), dev(r, "LSE"), r->stream);
}

static int launch_colsum_only(kvb_run *r)
{
    sattn_priv *pv = r->priv;
    return selective_attn_colsum(dev(r, "Q"), dev(r, "K"), dev(r, "LSE_before"), &pv->p, dev(r, "colsum"),
                                 dev(r, "colsum_kv"), r->stream);
}

static int launch_kernel_mma(kvb_run *r)
{
    sattn_priv *pv = r->priv;
    return selective_attn_mma(dev(r, "Q"), dev(r, "K"), dev(r, "V"), &pv->p, dev(r, "O"), dev(r, "LSE"), dev(r, "colsum"),
                              dev(r, "colsum_kv"), dev(r, "workspace"), pv->ws_bytes, r->stream);
}

static int launch_fwd_only_mma(kvb_run *r)
{
    sattn_priv *pv = r->priv;
    return selective_attn_fwd_mma(dev(r, "Q"), dev(r, "K"), dev(r, "V"), &pv->p, dev(r, "O"), dev(r, "LSE"), r->stream);
}

static int launch_colsum_only_mma(kvb_run *r)
{
    sattn_priv *pv = r->priv;
    return selective_attn_colsum_mma(dev(r, "Q"), dev(r, "K"), dev(r, "LSE_before"), &pv->p, dev(r, "colsum"),
                                     dev(r, "colsum_kv"), r->stream);
}

static int launch_cublas(kvb_run *r)
{
    sattn_priv *pv = r->priv;
    return selective_attn_materialized(pv->cublas, dev(r, "Q"), dev(r, "K"), dev(r, "V"), &pv->p, dev(r, "O"),
                                       dev(r, "LSE"), dev(r, "colsum"), dev(r, "colsum_kv"), dev(r, "workspace"),
                                       pv->ws_bytes, r->stream);
}
#else
static int no_device(kvb_run *r) { (void)r; return KVB_EDEVICE; }
#define gpu_setup_attn NULL
#define launch_kernel no_device
#define launch_fwd_only no_device
#define launch_colsum_only no_device
#define launch_cublas no_device
#define launch_kernel_mma no_device
#define launch_fwd_only_mma no_device
#define launch_colsum_only_mma no_device
#endif

static void cost_attn(const kvb_run *r, kvb_cost *c)
{
    const sattn_priv *pv = r->priv;
    const sattn_params *p = &pv->p;
    const double BH = (double)p->B * p->Hq, n_kv = (double)p->B * p->Hkv, D = p->D, L = p->L;
    const double fwd = BH * (p->need_out ? 4 : 2) * D * sattn_pairs(p, p->need_out ? 0 : p->w0);
    const double col = BH * 2 * D * sattn_pairs(p, p->w0);
    const double qkv = (BH + 2 * n_kv) * L * D * 2, o = p->need_out ? BH * L * D * 2 : 0;
    const double stats = BH * sattn_lse_len(p) * 4 + BH * L * 4 + (p->group_sum ? n_kv * L * 4 : 0);
    switch (pass_of(pv->impl)) {
    case IMPL_FWD_ONLY:
        c->flops = fwd;
        c->bytes_dev = qkv + o + BH * L * 4;
        break;
    case IMPL_COLSUM_ONLY:
        c->flops = col;
        c->bytes_dev = (BH + n_kv) * L * D * 2 + stats;
        c->workspace_bytes = stats;
        break;
    default:
        c->flops = fwd + col;
        c->bytes_dev = qkv + o + stats;
        c->workspace_bytes = stats + (double)pv->ws_bytes; /* beyond Q, K, V, O: O(B * Hq * L) for the kernel */
    }
    c->ceiling = KVB_CEIL_MMA;
    /* Goals against PyTorch SDPA's cuDNN causal forward, timed in the same round (bench --peers;
     * harness/scripts/torch_peers.py): O+LSE+colsum within 1.5x of it, the forward alone within 1.1x.
     * Without the peer there is no goal: nothing is typed in. */
    if (pv->impl == IMPL_KERNEL || pv->impl == IMPL_FWD_ONLY) {
        c->goal_peer = "torch_sdpa_cudnn_fwd";
        c->goal_peer_ratio = pv->impl == IMPL_KERNEL ? 1.5 : 1.1;
        c->goal_text = pv->impl == IMPL_KERNEL ? "1.5 x the cuDNN forward, same run" : "1.1 x the cuDNN forward, same run";
    }
}

/* ---- heavy_hitters ---- */

static int setup_hh(kvb_run *r)
{
    const kvb_case *c = r->c;
    sattn_priv *pv = priv_new(r);
    int rc = hh_counts(c, &pv->n_hh, &pv->n_rw, &pv->n_keep);
    if (rc) return rc;
    const int B = kvb_case_int(c, "B"), Hq = kvb_case_int(c, "Hq"), Hkv = kvb_case_int(c, "Hkv"), L = kvb_case_int(c, "L"),
              D = kvb_case_int(c, "D");
    const int per_q = !strcmp(kvb_case_enum(c, "select_per"), "q"), Hs = per_q ? Hq : Hkv;
    pv->rows = B * Hs;
    pv->group = per_q ? Hq / Hkv : 1;
    /* colsum-like scores with many exact ties: floor(8 exp(1.5 z)) / 8, z ~ N(0, 1) */
    kvb_tensor *sc = add3(r, "scores", KVB_FP32, B, Hs, L, KVB_IN);
    float *s = sc->h;
    for (int64_t i = 0; i < sc->n; i++)
        s[i] = (float)(floor(8.0 * exp(1.5 * kvb_normal01(r->seed, kvb_stream_of("scores"), (uint64_t)i))) / 8.0);
    kvb_tensor *k = add4(r, "K", KVB_BF16, B, Hkv, L, D, KVB_IN), *v = add4(r, "V", KVB_BF16, B, Hkv, L, D, KVB_IN);
    kvb_fill_bf16_normal(k->h, k->n, r->seed, kvb_stream_of("K"), 0, 0, 1);
    kvb_fill_bf16_normal(v->h, v->n, r->seed, kvb_stream_of("V"), 0, 0, 1);
    /* identical scores on both sides: the kept set (tie rule included) must match exactly */
#if KVB_HAVE_CUDA
    pv->topk_ws = heavy_hitters_keep_workspace_bytes(pv->rows, L, pv->n_hh, pv->n_rw);
#endif
    add_scratch(r, "topk_workspace", pv->topk_ws);
    kvb_tensor *keep = add3(r, "keep", KVB_I32, B, Hs, pv->n_keep, KVB_OUT);
    kvb_tensor *kc = add4(r, "Kc", KVB_BF16, B, Hs, pv->n_keep, D, KVB_OUT);
    kvb_tensor *vc = add4(r, "Vc", KVB_BF16, B, Hs, pv->n_keep, D, KVB_OUT);
    kc->cmp = vc->cmp = KVB_CMP_EXACT;
    if ((rc = ref_heavy_hitters(s, pv->rows, L, pv->n_hh, pv->n_rw, keep->ref))) return rc;
    if ((rc = ref_gather_rows(k->h, pv->rows, pv->group, L, D, keep->ref, pv->n_keep, kc->ref))) return rc;
    return ref_gather_rows(v->h, pv->rows, pv->group, L, D, keep->ref, pv->n_keep, vc->ref);
}

#if KVB_HAVE_CUDA
static int launch_hh(kvb_run *r)
{
    sattn_priv *pv = r->priv;
    const int L = kvb_case_int(r->c, "L"), D = kvb_case_int(r->c, "D");
    int rc = heavy_hitters_keep(dev(r, "scores"), pv->rows, L, pv->n_hh, pv->n_rw, dev(r, "keep"),
                                pv->topk_ws ? dev(r, "topk_workspace") : NULL, r->stream);
    if (rc) return rc;
    return gather_rows_pair(dev(r, "K"), dev(r, "V"), pv->rows, pv->group, L, D, dev(r, "keep"), pv->n_keep, dev(r, "Kc"),
                            dev(r, "Vc"), r->stream);
}
#else
#define launch_hh no_device
#endif

static void cost_hh(const kvb_run *r, kvb_cost *c)
{
    const sattn_priv *pv = r->priv;
    const double L = kvb_case_int(r->c, "L"), D = kvb_case_int(r->c, "D"), kept = (double)pv->rows * pv->n_keep;
    /* each byte once, read or written (as decode_attn states its bytes): the scores read once, the kept
     * indices written, the kept K and V rows read and written. Stated against the read-only ceiling like
     * the other read-mostly kernels: the scores and the row reads are at least half the bytes, and a
     * streaming read is the faster, so the stricter, ceiling for such a mix (above 100% of it is a
     * wrong ceiling, not a great kernel). */
    c->bytes_dev = pv->rows * L * 4 + kept * 4 + 2 * 2 * kept * D * 2;
    c->ceiling = KVB_CEIL_READ;
    c->workspace_bytes = (double)pv->topk_ws;
}

/* ---- snapkv ---- */

static int setup_snap(kvb_run *r)
{
    const kvb_case *c = r->c;
    sattn_priv *pv = priv_new(r);
    const int L = kvb_case_int(c, "L");
    int rc = snapkv_budget(L, kvb_case_int(c, "budget"), &pv->W, &pv->n_keep, "snapkv");
    if (rc || (rc = snapkv_pool_size(L, kvb_case_int(c, "ks"), &pv->ks, "snapkv"))) return rc;
    sattn_params *p = &pv->p;
    *p = snap_attn_of(c, pv->W);
    const int B = p->B, Hq = p->Hq, Hkv = p->Hkv, D = p->D, W = pv->W, n_keep = pv->n_keep;
    pv->rows = B * Hkv;
    pv->group = 1;
    kvb_tensor *q = add4(r, "Q", KVB_BF16, B, Hq, L, D, KVB_IN);
    kvb_tensor *k = add4(r, "K", KVB_BF16, B, Hkv, L, D, KVB_IN);
    kvb_tensor *v = add4(r, "V", KVB_BF16, B, Hkv, L, D, KVB_IN);
    make_qkv(r, p, kvb_case_enum(c, "input"), q, k, v);
    add3(r, "LSE_window", KVB_FP32, B, Hq, W, KVB_SCRATCH);
    add3(r, "colsum_heads", KVB_FP32, B, Hq, L, KVB_SCRATCH);
#if KVB_HAVE_CUDA
    pv->ws_bytes = selective_attn_workspace_bytes(p);
    pv->topk_ws = snapkv_keep_workspace_bytes(pv->rows, L, W, n_keep);
#endif
    add_scratch(r, "workspace", pv->ws_bytes);
    add_scratch(r, "topk_workspace", pv->topk_ws);
    kvb_tensor *csk = add3(r, "colsum_kv", KVB_FP32, B, Hkv, L, KVB_OUT);
    kvb_tensor *pooled = add3(r, "pooled", KVB_FP32, B, Hkv, L, KVB_OUT);
    kvb_tensor *keep = add3(r, "keep", KVB_I32, B, Hkv, n_keep, KVB_OUT);
    kvb_tensor *kc = add4(r, "Kc", KVB_BF16, B, Hkv, n_keep, D, KVB_OUT);
    kvb_tensor *vc = add4(r, "Vc", KVB_BF16, B, Hkv, n_keep, D, KVB_OUT);
    stat_tol(r, csk);
    stat_tol(r, pooled);

    float *lse = kvb_run_alloc(r, sizeof(float) * (size_t)B * Hq * W, "the window's LSE");
    float *cs = kvb_run_alloc(r, sizeof(float) * (size_t)B * Hq * L, "the heads' column sums");
    rc = ref_selective_attn(q->h, k->h, v->h, p, NULL, NULL, lse, cs, csk->ref);
    kvb_run_free(r, lse), kvb_run_free(r, cs);
    if (rc || (rc = ref_maxpool(csk->ref, pv->rows, L, pv->ks, pooled->ref))) return rc;
    if ((rc = ref_snapkv_keep(pooled->ref, pv->rows, L, W, n_keep, keep->ref))) return rc;
    /* the kernel's scores differ from the reference's by rounding: its kept set is judged tie-tolerantly
     * against the reference's pooled scores, within 1e-3 of the smallest k-th score of any row */
    keep->cmp = KVB_CMP_INDEXSET;
    keep->scores = pooled->ref;
    keep->scores_dtype = KVB_FP32;
    keep->scores_n = L;
    double kth = INFINITY;
    const int k_top = n_keep < L ? n_keep - W : 0;
    for (int row = 0; row < pv->rows && k_top > 0; row++)
        for (int i = 0; i < k_top; i++) {
            double sv = ((const float *)pooled->ref)[(int64_t)row * L + ((const int32_t *)keep->ref)[(int64_t)row * n_keep + i]];
            if (sv < kth) kth = sv;
        }
    keep->set_tol = k_top > 0 ? 1e-3 * kth : 0;
    /* the gathered rows: K, V at the kernel's own kept indices */
    kc->cmp = vc->cmp = KVB_CMP_GATHER;
    snprintf(kc->gather_src, sizeof kc->gather_src, "K");
    snprintf(vc->gather_src, sizeof vc->gather_src, "V");
    snprintf(kc->gather_idx, sizeof kc->gather_idx, "keep");
    snprintf(vc->gather_idx, sizeof vc->gather_idx, "keep");
    kc->gather_group = vc->gather_group = 1;
    if ((rc = ref_gather_rows(k->h, pv->rows, 1, L, D, keep->ref, n_keep, kc->ref))) return rc; /* for dumps */
    return ref_gather_rows(v->h, pv->rows, 1, L, D, keep->ref, n_keep, vc->ref);
}

static int ref_check_snap(kvb_run *r)
{
    sattn_priv *pv = r->priv;
    const sattn_params *p = &pv->p;
    return check_colsum_rows(kvb_run_find(r, "colsum_kv")->ref, (int64_t)p->B * p->Hkv, p->L, NULL,
                             (double)pv->W * sattn_groups(p), "colsum_kv");
}

#if KVB_HAVE_CUDA
static int launch_snap(kvb_run *r)
{
    sattn_priv *pv = r->priv;
    const sattn_params *p = &pv->p;
    int rc = selective_attn(dev(r, "Q"), dev(r, "K"), dev(r, "V"), p, NULL, dev(r, "LSE_window"), dev(r, "colsum_heads"),
                            dev(r, "colsum_kv"), dev(r, "workspace"), pv->ws_bytes, r->stream);
    if (rc || (rc = maxpool_rows(dev(r, "colsum_kv"), pv->rows, p->L, pv->ks, dev(r, "pooled"), r->stream))) return rc;
    if ((rc = snapkv_keep(dev(r, "pooled"), pv->rows, p->L, pv->W, pv->n_keep, dev(r, "keep"),
                          pv->topk_ws ? dev(r, "topk_workspace") : NULL, r->stream)))
        return rc;
    return gather_rows_pair(dev(r, "K"), dev(r, "V"), pv->rows, 1, p->L, p->D, dev(r, "keep"), pv->n_keep, dev(r, "Kc"), dev(r, "Vc"),
                            r->stream);
}
#else
#define launch_snap no_device
#endif

static void cost_snap(const kvb_run *r, kvb_cost *c)
{
    const sattn_priv *pv = r->priv;
    const sattn_params *p = &pv->p;
    const double BH = (double)p->B * p->Hq, n_kv = (double)p->B * p->Hkv, L = p->L, D = p->D, kept = n_kv * pv->n_keep;
    /* LSE and column sums of the window rows (Q K^T twice), the rest is bandwidth: K read (once, the
     * floor), the window's Q, the scores, the kept rows of K and V read and written */
    c->flops = BH * 4 * D * sattn_pairs(p, p->w0);
    c->bytes_dev = n_kv * L * D * 2 + BH * pv->W * D * 2 + 3 * n_kv * L * 4 + kept * 4 + 2 * 2 * kept * D * 2;
    c->ceiling = KVB_CEIL_READ; /* read-mostly: K streamed once dominates; stated like decode_attn */
    c->workspace_bytes = BH * pv->W * 4 + BH * L * 4 + (double)pv->ws_bytes + (double)pv->topk_ws;
}

/* ---- host memory (kvb_op.host_bytes) ---- */

/* ref_selective_attn's scratch: K, V, Q of a head in fp32, its part and group column sums, a block of
 * scores and outputs per thread */
static double sattn_ref_scratch(double L, double D)
{
    return 3 * L * D * 4 + (64 + 1) * L * 8 + kvb_ref_threads() * 4 * (L + D) * 8;
}

/* Q, K, V in; O, LSE, colsum (colsum_kv) out, or the reference's own buffers for those the impl does
 * not produce; the samples; the reference's scratch */
static size_t host_bytes_attn(const kvb_case *c)
{
    const sattn_params p = attn_of(c);
    const double BH = (double)p.B * p.Hq, n_kv = (double)p.B * p.Hkv, L = p.L, D = p.D;
    const double out = (p.need_out ? BH * L * D * 2 : 0) + BH * sattn_lse_len(&p) * 4 + BH * L * 4 +
                       (p.group_sum ? n_kv * L * 4 : 0);
    return kvb_host_bytes_sat(KVB_HOLD_IN * (BH + 2 * n_kv) * L * D * 2 + KVB_HOLD_OUT * out + n_kv + BH + 8 * D +
                              sattn_ref_scratch(L, D));
}

/* scores, K, V in; keep, Kc, Vc out; the top-k's pairs per thread */
static size_t host_bytes_hh(const kvb_case *c)
{
    int n_hh, n_rw, n_keep;
    if (hh_counts(c, &n_hh, &n_rw, &n_keep)) return 0;
    const double B = kvb_case_int(c, "B"), Hkv = kvb_case_int(c, "Hkv"), L = kvb_case_int(c, "L"), D = kvb_case_int(c, "D");
    const double Hs = !strcmp(kvb_case_enum(c, "select_per"), "q") ? kvb_case_int(c, "Hq") : Hkv;
    return kvb_host_bytes_sat(KVB_HOLD_IN * (B * Hs * L * 4 + 2 * B * Hkv * L * D * 2) +
                              KVB_HOLD_OUT * B * Hs * n_keep * (4 + 2 * D * 2) + kvb_ref_threads() * 8 * L);
}

/* Q, K, V in; colsum_kv, pooled, keep, Kc, Vc out; the window's LSE and the heads' column sums; the
 * references' scratch */
static size_t host_bytes_snap(const kvb_case *c)
{
    const int L = kvb_case_int(c, "L");
    int W, n_keep;
    if (snapkv_budget(L, kvb_case_int(c, "budget"), &W, &n_keep, "snapkv")) return 0;
    const double B = kvb_case_int(c, "B"), Hq = kvb_case_int(c, "Hq"), Hkv = kvb_case_int(c, "Hkv"), D = kvb_case_int(c, "D");
    return kvb_host_bytes_sat(KVB_HOLD_IN * (B * Hq + 2 * B * Hkv) * L * D * 2 +
                              KVB_HOLD_OUT * B * Hkv * (2.0 * L * 4 + n_keep * (4 + 2 * D * 2)) + B * Hq * (W + L) * 4.0 +
                              8 * D + sattn_ref_scratch(L, D) + kvb_ref_threads() * 8.0 * L);
}

/* ---- registry entries ---- */

/* Invariant on EVERY (b, head) slice of the device's column sums, also those the sampled reference
 * skips: each contributing row's probabilities sum to 1, so a head's column sums add up to the number
 * of contributing rows, L - w0 (a KV head's: G times that). Bound: the per-element rtol of the column
 * sums (1e-3), applied to the total. */
static int colsum_total_check(const kvb_tensor *t, int64_t slices, int64_t L, double rows)
{
    if (!t || !t->out) return KVB_OK;
    const float *cs = t->out;
    for (int64_t s = 0; s < slices; s++) {
        double sum = 0;
        for (int64_t j = 0; j < L; j++) sum += cs[s * L + j];
        if (!(fabs(sum - rows) <= 1e-3 * rows + 1e-3))
            return kvb_fail(KVB_EINVAL, "%s: slice %lld (b*heads + h) sums to %.6g, not the %.0f contributing rows",
                            t->name, (long long)s, sum, rows);
    }
    return KVB_OK;
}

static int out_check_attn(kvb_run *r)
{
    const sattn_priv *pv = r->priv;
    const sattn_params *p = &pv->p;
    const double rows = p->L - p->w0;
    int rc = colsum_total_check(kvb_run_find(r, "colsum"), (int64_t)p->B * p->Hq, p->L, rows);
    if (rc) return rc;
    return colsum_total_check(kvb_run_find(r, "colsum_kv"), (int64_t)p->B * p->Hkv, p->L, rows * sattn_groups(p));
}

/* Implementations (impl=), indexed by the IMPL_* enum: none includes host work (cuBLAS and the kernels
 * are enqueued asynchronously), so every one is timed behind a blocking kernel with CUDA events. */
static const kvb_impl attn_impls[] = {
    [IMPL_KERNEL] = {"kernel", launch_kernel, 0, "both passes: the flash forward (O, LSE), then the column-sum pass"},
    [IMPL_FWD_ONLY] = {"fwd_only", launch_fwd_only, 0, "the suite's flash-attention forward alone (O, LSE)"},
    [IMPL_COLSUM_ONLY] = {"colsum_only", launch_colsum_only, 0,
                          "the column-sum pass alone, from an LSE the kernel computed before timing"},
    [IMPL_CUBLAS] = {"cublas", launch_cublas, 0,
                     "materialized peer: Q K^T (cuBLAS GEMM), softmax, column sums, P V (GEMM), per chunk of KV heads"},
    [IMPL_KERNEL_MMA] = {"kernel_mma", launch_kernel_mma, 0, "impl=kernel on the mma.sync kernels (A/B with the Hopper ones)"},
    [IMPL_FWD_ONLY_MMA] = {"fwd_only_mma", launch_fwd_only_mma, 0, "the mma.sync forward alone (O, LSE)"},
    [IMPL_COLSUM_ONLY_MMA] = {"colsum_only_mma", launch_colsum_only_mma, 0, "the mma.sync column-sum pass alone"},
};

const kvb_op op_selective_attn = {
    .name = "selective_attn",
    .family = "selective_attn",
    .summary = "flash attention that also returns exact column sums of the probabilities",
    .params = attn_params,
    .n_params = NPARAMS(attn_params),
    .tol = {1e-2, 2e-2, 1e-2},
    .validate = validate_attn,
    .host_bytes = host_bytes_attn,
    .setup = setup_attn,
    .ref_check = ref_check_attn,
    .gpu_setup = gpu_setup_attn,
    KVB_IMPLS(attn_impls),
    .cost = cost_attn,
    .teardown = teardown_sattn,
    .out_check = out_check_attn,
};

const kvb_op op_heavy_hitters = {
    .name = "heavy_hitters",
    .family = "heavy_hitters",
    .summary = "MiniKV heavy hitters from column sums (top-k + recent window, pyramid), gather of K, V",
    .params = hh_params,
    .n_params = NPARAMS(hh_params),
    .validate = validate_hh,
    .host_bytes = host_bytes_hh,
    .setup = setup_hh,
    .launch = launch_hh,
    .cost = cost_hh,
    .teardown = teardown_sattn,
};

const kvb_op op_snapkv = {
    .name = "snapkv",
    .family = "heavy_hitters",
    .summary = "RocketKV SnapKV++: window column sums per KV group, max-pooling, top-k + window, gather",
    .params = snap_params,
    .n_params = NPARAMS(snap_params),
    .tol = {1e-3, 1e-3, 1e-3},
    .validate = validate_snap,
    .host_bytes = host_bytes_snap,
    .setup = setup_snap,
    .ref_check = ref_check_snap,
    .launch = launch_snap,
    .cost = cost_snap,
    .teardown = teardown_sattn,
};
