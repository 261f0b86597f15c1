/* ops_page_scoring.c: the page_scoring family in the harness (contract and budget:
 * kernels/page_scoring/NOTES.md).
 *
 * Kernels:
 *   page_meta_build   K [B, Hkv, L, D] -> kmin, kmax [B, Hkv, D, cap], bit-exact.
 *   page_meta_append  k [B, Hkv, D] at per-sequence positions t [B] into kmin, kmax (in place), bit-exact.
 *   hybrid_score      RocketKV hybrid scoring: u [B, Hkv, ceil(L/P)] (atol 1e-5, rtol 1e-3:
 *                     kernels/page_scoring/NOTES.md says why), the chosen channels [B, Hkv, r]
 *                     (bit-exact: the kernel chooses them by the top-k rule from the same fp32
 *                     channel scores), and pages [B, Hkv, ceil(k/P)] tie-tolerant against the
 *                     reference u. impl=kernel (scoring + page top-k),
 *                     score_only (u and channels).
 *   quest_score       Quest (the in-suite peer): scores [B, Hkv, ceil(L/P)] and pages [B, Hkv, budget/P]
 *                     (budget/P - 1 chosen, then the last page). impl=kernel, score_only.
 *
 * Keys: P, r, k of hybrid_score are 0 by default: the RocketKV knobs (rocketkv_budget) from the token
 * budget T = `budget` at prompt length Lmax (0: L), with k = T/2 tokens attended; a non-zero key
 * overrides its knob. cap = 0: ceil(L/P) rounded up to a multiple of 64 (128-byte rows).
 *
 * Inputs (seeded, counter-based; never all zeros), `input=`:
 *   outlier (default)  q ~ N(0, 1), and per (b, KV head) 8 channels (seeded) where all G query heads are
 *                      8 N(0, 1): real queries carry a few large channels, which top-r must find
 *   normal             q ~ N(0, 1)
 *   ties               q and metadata on a grid of halves in [-2, 2] (round(2 z)/2, clipped): channel
 *                      scores tie (the lower-channel rule decides), sg == 0 occurs (kmin is taken), pages tie
 * Metadata of the scoring ops: per (page, channel) two N(0, 1) draws, kmin the smaller and kmax the larger
 * (the extrema of a 2-token page; the scoring reads them as given); pages past ceil(L/P) hold +inf / -inf.
 * build: K ~ N(0, 1). append: t[0] starts a page (t % P == 0), t[1] = L - 1, the others seeded in
 * [L - 4P, L); the page being appended to holds the extrema of its earlier tokens (K ~ N(0, 1), k the key
 * of token t), or, where t starts it, stale values (even b: a finite pair; odd b: +inf / -inf) that the
 * kernel must overwrite; earlier pages hold drawn pairs, later ones +inf / -inf.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reference/page_scoring.h"
#include "harness/core/ceilings.h"
#include "harness/core/op.h"
#include "harness/ops/ops.h"
#if KVB_HAVE_CUDA
#include "kernels/page_scoring/page_scoring.h"
#include "kernels/select/select.h"
#endif

#define NPARAMS(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* ---- keys ---- */

#define K_B {"B", KVB_P_INT, 1, 1, PAGE_MAX_B, NULL, "batch"}
#define K_HQ {"Hq", KVB_P_INT, 32, 1, 1024, NULL, "query heads"}
#define K_HKV {"Hkv", KVB_P_INT, 8, 1, PAGE_MAX_HKV, NULL, "KV heads (Hq = G * Hkv, G in [1, 8])"}
#define K_D {"D", KVB_P_INT, 128, 1, PAGE_MAX_D, NULL, "head dimension (a multiple of 8)"}
#define K_L {"L", KVB_P_INT, 32768, 1, PAGE_MAX_L, NULL, "tokens in the cache"}
#define K_CAP {"cap", KVB_P_INT, 0, 0, PAGE_MAX_PAGES + 8, NULL, "metadata capacity in pages (row stride); 0: ceil(L/P) rounded up to 64"}
#define K_INPUT {"input", KVB_P_ENUM, 0, 0, 0, "outlier|normal|ties", "input distribution (see ops_page_scoring.c)"}
#define K_SEED {"seed", KVB_P_INT, 1, 0, 1e15, NULL, "input seed"}

static const kvb_param build_params[] = {
    K_B, K_HKV, K_D, K_L,
    {"P", KVB_P_INT, 16, 0, PAGE_MAX_P, NULL, "tokens per page"},
    K_CAP, K_SEED,
};
static const kvb_param append_params[] = {
    K_B, K_HKV, K_D,
    {"L", KVB_P_INT, 32768, 1, PAGE_MAX_L, NULL, "cache capacity in tokens (positions t[b] < L, near the end)"},
    {"P", KVB_P_INT, 16, 0, PAGE_MAX_P, NULL, "tokens per page"},
    K_CAP, K_SEED,
};
static const kvb_param hybrid_params[] = {
    K_B, K_HQ, K_HKV, K_D, K_L,
    {"budget", KVB_P_INT, 2048, 1, PAGE_MAX_L, NULL, "RocketKV token budget T (knobs: P, r, k = T/2)"},
    {"Lmax", KVB_P_INT, 0, 0, PAGE_MAX_L, NULL, "prompt length the knobs are computed for; 0: L"},
    {"P", KVB_P_INT, 0, 0, PAGE_MAX_P, NULL, "tokens per page; 0: the knob"},
    {"r", KVB_P_INT, 0, 0, PAGE_MAX_D, NULL, "channels scored; 0: the knob"},
    {"k", KVB_P_INT, 0, 0, PAGE_MAX_L, NULL, "tokens attended (ceil(k/P) pages chosen); 0: T/2"},
    K_CAP, K_INPUT, K_SEED,
    {"impl", KVB_P_ENUM, 0, 0, 0, NULL, "implementation (the impl table)"},
};
static const kvb_param quest_params[] = {
    K_B, K_HQ, K_HKV, K_D, K_L,
    {"P", KVB_P_INT, 16, 0, PAGE_MAX_P, NULL, "tokens per page (Quest: 16)"},
    {"budget", KVB_P_INT, 2048, 0, PAGE_MAX_L, NULL, "tokens attended: budget/P pages, the last one included"},
    K_CAP, K_INPUT, K_SEED,
    {"impl", KVB_P_ENUM, 0, 0, 0, NULL, "implementation (the impl table)"},
};

enum { IMPL_KERNEL, IMPL_SCORE_ONLY };

/* ---- layouts from the keys ---- */

static int cap_of(const kvb_case *c, int L, int P)
{
    const int cap = kvb_case_int(c, "cap");
    return cap ? cap : page_cap_default(L, P);
}

/* P = 0 is refused by name before it divides anything (page_layout_check says the same) */
static int check_P(int P, const char *who)
{
    if (P < 1) return kvb_fail(KVB_EINVAL, "%s: P=%d out of range [1, %d]", who, P, PAGE_MAX_P);
    return KVB_OK;
}

static int meta_layout(const kvb_case *c, const char *who, page_layout *s)
{
    s->B = kvb_case_int(c, "B");
    s->Hkv = kvb_case_int(c, "Hkv");
    s->Hq = s->Hkv; /* the metadata ops have no query heads */
    s->D = kvb_case_int(c, "D");
    s->L = kvb_case_int(c, "L");
    s->P = kvb_case_int(c, "P");
    int rc = check_P(s->P, who);
    if (rc) return rc;
    s->cap = cap_of(c, s->L, s->P);
    return page_layout_check(s, who);
}

/* The hybrid case: layout, r and k, from the keys and the RocketKV knobs. */
typedef struct hybrid_setup {
    page_layout s;
    int r, k, n_sel;
} hybrid_setup;

static int hybrid_of(const kvb_case *c, hybrid_setup *h)
{
    const char *who = "hybrid_score";
    page_layout *s = &h->s;
    s->B = kvb_case_int(c, "B");
    s->Hq = kvb_case_int(c, "Hq");
    s->Hkv = kvb_case_int(c, "Hkv");
    s->D = kvb_case_int(c, "D");
    s->L = kvb_case_int(c, "L");
    const int T = kvb_case_int(c, "budget"), Lmax = kvb_case_int(c, "Lmax") ? kvb_case_int(c, "Lmax") : s->L;
    int P = kvb_case_int(c, "P"), r = kvb_case_int(c, "r"), k = kvb_case_int(c, "k");
    if (!P || !r || !k) {
        rocketkv_knobs kn;
        if (s->D < 1 || s->D > PAGE_MAX_D) /* the knobs need D; the layout check names it below otherwise */
            return kvb_fail(KVB_EINVAL, "%s: D=%d out of range: a multiple of 8 in [8, %d]", who, s->D, PAGE_MAX_D);
        int rc = rocketkv_budget(T, Lmax, s->D, 0, &kn);
        if (rc) {
            char why[256];
            snprintf(why, sizeof why, "%s", kvb_last_error());
            return kvb_fail(rc, "%s: budget=%d: %s", who, T, why);
        }
        if (!k && kn.k > s->L)
            return kvb_fail(KVB_EINVAL, "%s: k = budget/2 = %d tokens to attend out of range [1, L = %d] (a token budget "
                            "above the context)", who, kn.k, s->L);
        P = P ? P : kn.P, r = r ? r : kn.r, k = k ? k : kn.k;
    }
    s->P = P;
    s->cap = cap_of(c, s->L, P);
    h->r = r, h->k = k, h->n_sel = hybrid_selected_pages(k, P);
    int rc = page_layout_check(s, who);
    return rc ? rc : hybrid_params_check(s, r, k, who);
}

static int quest_of(const kvb_case *c, page_layout *s, int *budget)
{
    const char *who = "quest_score";
    s->B = kvb_case_int(c, "B");
    s->Hq = kvb_case_int(c, "Hq");
    s->Hkv = kvb_case_int(c, "Hkv");
    s->D = kvb_case_int(c, "D");
    s->L = kvb_case_int(c, "L");
    s->P = kvb_case_int(c, "P");
    int rc = check_P(s->P, who);
    if (rc) return rc;
    s->cap = cap_of(c, s->L, s->P);
    *budget = kvb_case_int(c, "budget");
    if ((rc = page_layout_check(s, who))) return rc;
    return quest_params_check(s, *budget, who);
}

/* Inputs of one case stay well inside a GPU's memory and the reference's time. */
static int check_bytes(const char *who, const char *formula, double bytes)
{
    if (bytes > 16e9)
        return kvb_fail(KVB_EINVAL, "%s: the case's tensors, %s, take %.1f GB, out of range [0, 16 GB]", who, formula,
                        bytes * 1e-9);
    return KVB_OK;
}

static double meta_bytes(const page_layout *s) { return 2.0 * 2 * s->B * s->Hkv * (double)s->D * s->cap; }

static int validate_build(const kvb_case *c)
{
    page_layout s;
    int rc = meta_layout(c, "page_meta_build", &s);
    return rc ? rc : check_bytes("page_meta_build", "min/max 2*2*B*Hkv*D*cap + keys 2*B*Hkv*L*D bytes",
                                 meta_bytes(&s) + 2.0 * s.B * s.Hkv * (double)s.L * s.D);
}

static int validate_append(const kvb_case *c)
{
    page_layout s;
    int rc = meta_layout(c, "page_meta_append", &s);
    return rc ? rc : check_bytes("page_meta_append", "min/max in and out 2*2*2*B*Hkv*D*cap bytes", 2 * meta_bytes(&s));
}

static int validate_hybrid(const kvb_case *c)
{
    hybrid_setup h;
    int rc = hybrid_of(c, &h);
    if (rc) return rc;
    const int G = h.s.Hq / h.s.Hkv;
    return check_bytes("hybrid_score", "min/max 2*2*B*Hkv*D*cap + scores 4*B*Hkv*G*cap bytes",
                       meta_bytes(&h.s) + 4.0 * h.s.B * h.s.Hkv * (double)G * h.s.cap);
}

static int validate_quest(const kvb_case *c)
{
    page_layout s;
    int budget, rc = quest_of(c, &s, &budget);
    return rc ? rc : check_bytes("quest_score", "min/max 2*2*B*Hkv*D*cap bytes", meta_bytes(&s));
}

/* ---- inputs ---- */

static kvb_tensor *add(kvb_run *r, const char *name, kvb_dtype dt, int ndim, int64_t a, int64_t b, int64_t c, int64_t d,
                       int role)
{
    int64_t s[4] = {a, b, c, d};
    return kvb_run_tensor(r, name, dt, ndim, s, role);
}

static kvb_tensor *add_scratch(kvb_run *r, const char *name, size_t bytes)
{
    int64_t s[1] = {(int64_t)(bytes ? bytes : 1)};
    return kvb_run_tensor(r, name, KVB_U8, 1, s, KVB_SCRATCH);
}

enum { IN_OUTLIER, IN_NORMAL, IN_TIES };

static int input_of(const kvb_case *c)
{
    const char *in = kvb_case_enum(c, "input");
    return !strcmp(in, "ties") ? IN_TIES : !strcmp(in, "normal") ? IN_NORMAL : IN_OUTLIER;
}

/* a value on the grid of halves in [-2, 2] */
static double halves(double z)
{
    /* round(v) inline, a library call otherwise on hundreds of millions of draws: v's integer part t
     * and fraction v - t are exact, a fraction of at least one half in size goes away from zero, and a
     * zero keeps v's sign, as round() keeps it */
    const double v = 2.0 * z < -4 ? -4 : 2.0 * z > 4 ? 4 : 2.0 * z, t = (double)(int)v, f = v - t;
    return copysign((t + (f >= 0.5) - (f <= -0.5)) / 2.0, v);
}

/* Both Box-Muller normals of draw i of the sequence of `key` (kvb_sequence_key(seed, stream)). */
static void normal_pair(uint64_t key, uint64_t i, double *x, double *y)
{
    const double u1 = kvb_sequence_uniform01(key, 2 * i), u2 = kvb_sequence_uniform01(key, 2 * i + 1);
    const double rad = sqrt(-2.0 * log(u1)), ang = 6.283185307179586 * u2;
    *x = rad * cos(ang), *y = rad * sin(ang);
}

/* One drawn (kmin, kmax) pair: two normals (or halves), the smaller and the larger as bf16. */
static void draw_pair(uint64_t key, uint64_t i, int ties, kvb_bf16 *lo, kvb_bf16 *hi)
{
    double x, y;
    normal_pair(key, i, &x, &y);
    if (ties) x = halves(x), y = halves(y);
    const kvb_bf16 a = kvb_double_to_bf16(x), b = kvb_double_to_bf16(y);
    const int a_first = kvb_bf16_to_float(a) <= kvb_bf16_to_float(b);
    *lo = a_first ? a : b, *hi = a_first ? b : a;
}

/* Scoring metadata: drawn pairs for pages < ceil(L/P), +inf / -inf after. */
static void fill_meta(const kvb_run *r, const page_layout *s, int ties, kvb_bf16 *kmin, kvb_bf16 *kmax)
{
    const int n = page_count(s->L, s->P);
    const int64_t rows = (int64_t)s->B * s->Hkv * s->D;
    const uint64_t key = kvb_sequence_key(r->seed, kvb_stream_of("kminmax"));
#pragma omp parallel for schedule(static)
    for (int64_t row = 0; row < rows; row++)
        for (int j = 0; j < s->cap; j++) {
            const int64_t i = row * s->cap + j;
            if (j < n) draw_pair(key, (uint64_t)i, ties, kmin + i, kmax + i);
            else kmin[i] = BF16_POS_INF, kmax[i] = BF16_NEG_INF;
        }
}

/* q [B, Hq, D] of the input distribution (file comment). */
static void fill_q(kvb_run *r, const page_layout *s, int input, kvb_bf16 *q)
{
    const int G = s->Hq / s->Hkv, D = s->D;
    const uint64_t stream = kvb_stream_of("q");
    const int64_t n = (int64_t)s->B * s->Hq * D;
    for (int64_t i = 0; i < n; i++) {
        const double z = kvb_normal01(r->seed, stream, (uint64_t)i);
        q[i] = kvb_double_to_bf16(input == IN_TIES ? halves(z) : z);
    }
    if (input != IN_OUTLIER) return;
    int32_t *perm = kvb_run_alloc(r, sizeof(int32_t) * (size_t)D, "q outlier channels"), chosen[8];
    const int n_out = D < 8 ? D : 8;
    for (int64_t bh = 0; bh < (int64_t)s->B * s->Hkv; bh++) {
        kvb_rng rng = kvb_rng_make(r->seed, kvb_stream_of("q_outliers") + (uint64_t)bh);
        kvb_draw_distinct(&rng, perm, D, n_out, chosen);
        for (int h = 0; h < G; h++)
            for (int i = 0; i < n_out; i++) {
                kvb_bf16 *v = q + (bh * G + h) * D + chosen[i];
                *v = kvb_double_to_bf16(8.0 * kvb_bf16_to_double(*v));
            }
    }
    kvb_run_free(r, perm);
}

/* ---- page_meta_build ---- */

static int setup_build(kvb_run *r)
{
    page_layout s;
    int rc = meta_layout(r->c, "page_meta_build", &s);
    if (rc) return rc;
    kvb_tensor *K = add(r, "K", KVB_BF16, 4, s.B, s.Hkv, s.L, s.D, KVB_IN);
    kvb_fill_bf16_normal(K->h, K->n, r->seed, kvb_stream_of("K"), 0, 0, 1);
    kvb_tensor *mn = add(r, "kmin", KVB_BF16, 4, s.B, s.Hkv, s.D, s.cap, KVB_OUT);
    kvb_tensor *mx = add(r, "kmax", KVB_BF16, 4, s.B, s.Hkv, s.D, s.cap, KVB_OUT);
    mn->cmp = mx->cmp = KVB_CMP_EXACT;
    if (K->n > (1 << 26)) K->flags |= KVB_T_NO_DUMP;
    return ref_page_meta_build(K->h, &s, mn->ref, mx->ref);
}

#if KVB_HAVE_CUDA
static void *dev(kvb_run *r, const char *name)
{
    kvb_tensor *t = kvb_run_find(r, name);
    return t ? t->d : NULL;
}

static int launch_build(kvb_run *r)
{
    page_layout s;
    int rc = meta_layout(r->c, "page_meta_build", &s);
    return rc ? rc : page_meta_build(dev(r, "K"), &s, dev(r, "kmin"), dev(r, "kmax"), r->stream);
}
#else
static int no_device(kvb_run *r) { (void)r; return KVB_EDEVICE; }
#define launch_build no_device
#endif

/* K read once, both metadata tensors written in full (cap columns): a transform, stated against the
 * device copy (as many bytes read as written would be its best case; here reads dominate for P > 2). */
static void cost_build(const kvb_run *r, kvb_cost *c)
{
    page_layout s;
    if (meta_layout(r->c, "page_meta_build", &s)) return;
    c->bytes_dev = 2.0 * s.B * s.Hkv * (double)s.L * s.D + meta_bytes(&s);
    c->ceiling = KVB_CEIL_D2D;
}

/* ---- page_meta_append ---- */

/* Token i of sequence (b, KV head) bh, channel c: the K stream the append case draws from. */
static kvb_bf16 token_key(uint64_t seed, const page_layout *s, int64_t bh, int64_t t, int c)
{
    return kvb_double_to_bf16(kvb_normal01(seed, kvb_stream_of("K"), (uint64_t)((bh * s->L + t) * s->D + c)));
}

static void append_positions(const kvb_run *r, const page_layout *s, int32_t *t)
{
    kvb_rng rng = kvb_rng_make(r->seed, kvb_stream_of("t"));
    const int span = s->L < 4 * s->P ? s->L : 4 * s->P;
    for (int b = 0; b < s->B; b++) {
        if (b == 0) t[b] = (s->L - 1) / s->P * s->P; /* starts a page */
        else if (b == 1) t[b] = s->L - 1;
        else t[b] = s->L - 1 - (int)kvb_rng_below(&rng, (uint64_t)span);
    }
}

static int setup_append(kvb_run *r)
{
    page_layout s;
    int rc = meta_layout(r->c, "page_meta_append", &s);
    if (rc) return rc;
    const uint64_t seed = r->seed;
    kvb_tensor *k = add(r, "k", KVB_BF16, 3, s.B, s.Hkv, s.D, 0, KVB_IN);
    int64_t tb[1] = {s.B};
    kvb_tensor *t = kvb_run_tensor(r, "t", KVB_I32, 1, tb, KVB_IN);
    kvb_tensor *mn = add(r, "kmin", KVB_BF16, 4, s.B, s.Hkv, s.D, s.cap, KVB_INOUT);
    kvb_tensor *mx = add(r, "kmax", KVB_BF16, 4, s.B, s.Hkv, s.D, s.cap, KVB_INOUT);
    mn->cmp = mx->cmp = KVB_CMP_EXACT;
    if (mn->n > (1 << 26)) mn->flags |= KVB_T_NO_DUMP, mx->flags |= KVB_T_NO_DUMP;
    int32_t *pos = t->h;
    append_positions(r, &s, pos);
    kvb_bf16 *lo = mn->h, *hi = mx->h;
    const uint64_t key = kvb_sequence_key(seed, kvb_stream_of("kminmax"));
#pragma omp parallel for schedule(static)
    for (int64_t bh = 0; bh < (int64_t)s.B * s.Hkv; bh++) {
        const int b = (int)(bh / s.Hkv), j = pos[b] / s.P, t0 = j * s.P;
        for (int c = 0; c < s.D; c++) {
            const int64_t row = (bh * s.D + c) * s.cap;
            for (int p = 0; p < s.cap; p++) {
                if (p < j) draw_pair(key, (uint64_t)(row + p), 0, lo + row + p, hi + row + p);
                else lo[row + p] = BF16_POS_INF, hi[row + p] = BF16_NEG_INF;
            }
            if (pos[b] == t0) { /* the page starts at t: stale contents (even b) or empty (odd b) */
                if (b % 2 == 0) draw_pair(key, (uint64_t)(row + j), 0, lo + row + j, hi + row + j);
                continue;
            }
            kvb_bf16 m = token_key(seed, &s, bh, t0, c), M = m; /* the page's earlier tokens t0 .. t-1 */
            for (int64_t i = t0 + 1; i < pos[b]; i++) {
                const kvb_bf16 v = token_key(seed, &s, bh, i, c);
                if (kvb_bf16_to_float(v) < kvb_bf16_to_float(m)) m = v;
                if (kvb_bf16_to_float(v) > kvb_bf16_to_float(M)) M = v;
            }
            lo[row + j] = m, hi[row + j] = M;
        }
        for (int c = 0; c < s.D; c++) ((kvb_bf16 *)k->h)[bh * s.D + c] = token_key(seed, &s, bh, pos[b], c);
    }
    memcpy(mn->ref, mn->h, sizeof(kvb_bf16) * (size_t)mn->n);
    memcpy(mx->ref, mx->h, sizeof(kvb_bf16) * (size_t)mx->n);
    return ref_page_meta_append(k->h, pos, &s, mn->ref, mx->ref);
}

/* The reference's appended page equals the extrema of the page's tokens jP .. t (build's definition),
 * recomputed here from the drawn tokens; every other entry is unchanged. */
static int ref_check_append(kvb_run *r)
{
    page_layout s;
    int rc = meta_layout(r->c, "page_meta_append", &s);
    if (rc) return rc;
    const kvb_tensor *mn = kvb_run_find(r, "kmin"), *mx = kvb_run_find(r, "kmax");
    const int32_t *pos = kvb_run_find(r, "t")->h;
    const kvb_bf16 *lo = mn->ref, *hi = mx->ref, *lo0 = mn->h, *hi0 = mx->h;
    for (int64_t bh = 0; bh < (int64_t)s.B * s.Hkv; bh++) {
        const int b = (int)(bh / s.Hkv), j = pos[b] / s.P;
        for (int c = 0; c < s.D; c++) {
            const int64_t row = (bh * s.D + c) * s.cap;
            kvb_bf16 m = token_key(r->seed, &s, bh, (int64_t)j * s.P, c), M = m;
            for (int64_t i = (int64_t)j * s.P + 1; i <= pos[b]; i++) {
                const kvb_bf16 v = token_key(r->seed, &s, bh, i, c);
                if (kvb_bf16_to_float(v) < kvb_bf16_to_float(m)) m = v;
                if (kvb_bf16_to_float(v) > kvb_bf16_to_float(M)) M = v;
            }
            if (lo[row + j] != m || hi[row + j] != M)
                return kvb_fail(KVB_EINVAL, "page_meta_append: reference page %d of (b*Hkv + h) = %lld, channel %d is not the "
                                "extrema of its tokens", j, (long long)bh, c);
            for (int p = 0; p < s.cap; p++)
                if (p != j && (lo[row + p] != lo0[row + p] || hi[row + p] != hi0[row + p]))
                    return kvb_fail(KVB_EINVAL, "page_meta_append: reference changed page %d of (b*Hkv + h) = %lld besides "
                                    "page %d", p, (long long)bh, j);
        }
    }
    return KVB_OK;
}

#if KVB_HAVE_CUDA
static int launch_append(kvb_run *r)
{
    page_layout s;
    int rc = meta_layout(r->c, "page_meta_append", &s);
    return rc ? rc
              : page_meta_append(dev(r, "k"), dev(r, "t"), kvb_run_find(r, "t")->h, &s, dev(r, "kmin"), dev(r, "kmax"),
                                 r->stream);
}
#else
#define launch_append no_device
#endif

/* k and t read, one entry of each tensor per channel read and written: a few KB of scattered 2-byte
 * accesses, so the time is the launch; stated against the device copy of those bytes. */
static void cost_append(const kvb_run *r, kvb_cost *c)
{
    page_layout s;
    if (meta_layout(r->c, "page_meta_append", &s)) return;
    const double entries = (double)s.B * s.Hkv * s.D;
    c->bytes_dev = entries * 2 + s.B * 4.0 + 2 * entries * 2 * 2;
    c->ceiling = KVB_CEIL_D2D;
}

/* ---- hybrid_score ---- */

typedef struct score_priv {
    hybrid_setup h; /* hybrid_score */
    page_layout s;  /* quest_score */
    int budget, impl;
    size_t ws_bytes;
    float *cmp_scores; /* quest: the scores the page selection is judged by (the last page ranked first) */
} score_priv;

static void teardown_score(kvb_run *r)
{
    score_priv *p = r->priv;
    if (!p) return;
    r->priv = NULL;
}

static int setup_hybrid(kvb_run *r)
{
    score_priv *p = kvb_run_alloc(r, sizeof *p, "hybrid_score state");
    r->priv = p;
    int rc = hybrid_of(r->c, &p->h);
    if (rc) return rc;
    p->impl = (int)kvb_case_get(r->c, "impl");
    const page_layout *s = &p->h.s;
    const int n = page_count(s->L, s->P), input = input_of(r->c);
    snprintf(r->note, sizeof r->note, "P=%d r=%d k=%d (%s): %d of %d pages chosen", s->P, p->h.r, p->h.k,
             kvb_case_int(r->c, "P") && kvb_case_int(r->c, "r") && kvb_case_int(r->c, "k") ? "given" : "RocketKV knobs",
             p->h.n_sel, n);
    kvb_tensor *q = add(r, "q", KVB_BF16, 3, s->B, s->Hq, s->D, 0, KVB_IN);
    kvb_tensor *mn = add(r, "kmin", KVB_BF16, 4, s->B, s->Hkv, s->D, s->cap, KVB_IN);
    kvb_tensor *mx = add(r, "kmax", KVB_BF16, 4, s->B, s->Hkv, s->D, s->cap, KVB_IN);
    if (mn->n > (1 << 26)) mn->flags |= KVB_T_NO_DUMP, mx->flags |= KVB_T_NO_DUMP;
    fill_q(r, s, input, q->h);
    fill_meta(r, s, input == IN_TIES, mn->h, mx->h);
    kvb_tensor *u = add(r, "u", KVB_FP32, 3, s->B, s->Hkv, n, 0, KVB_OUT);
    kvb_tensor *ch = add(r, "channels", KVB_I32, 3, s->B, s->Hkv, p->h.r, 0, KVB_OUT);
    kvb_tensor *pages = p->impl == IMPL_KERNEL ? add(r, "pages", KVB_I32, 3, s->B, s->Hkv, p->h.n_sel, 0, KVB_OUT) : NULL;
#if KVB_HAVE_CUDA
    if (kvb_gpu_available()) p->ws_bytes = hybrid_score_workspace_bytes(s);
#endif
    add_scratch(r, "workspace", p->ws_bytes);
    int32_t *pages_ref = pages ? pages->ref : NULL;
    if ((rc = ref_hybrid_score(q->h, mn->h, mx->h, s, p->h.r, p->h.k, u->ref, pages_ref, ch->ref))) return rc;
    if (pages) {
        pages->cmp = KVB_CMP_INDEXSET;
        pages->scores = u->ref;
        pages->scores_dtype = KVB_FP32;
        pages->scores_n = n;
        pages->set_tol = kvb_selection_tol(&u->tol, u->ref, (int64_t)s->B * s->Hkv, n, pages->ref, p->h.n_sel);
    }
    return KVB_OK;
}

/* Each KV head's softmax masses sum to one per query head: sum_j n_j u[j] = G. Bound: the per-element
 * rtol of u applied to the total. */
static int u_mass_check(const kvb_run *r, const float *u, const char *what)
{
    const score_priv *p = r->priv;
    const page_layout *s = &p->h.s;
    const int n = page_count(s->L, s->P), G = s->Hq / s->Hkv;
    const kvb_tensor *t = kvb_run_find((kvb_run *)r, "u");
    for (int64_t bh = 0; bh < (int64_t)s->B * s->Hkv; bh++) {
        double sum = 0;
        for (int j = 0; j < n; j++) sum += page_tokens(s, j) * (double)u[bh * n + j];
        if (!(fabs(sum - G) <= t->tol.rtol * G))
            return kvb_fail(KVB_EINVAL, "hybrid_score: %s u of (b*Hkv + h) = %lld: sum_j n_j u[j] = %.7g, not G = %d", what,
                            (long long)bh, sum, G);
    }
    return KVB_OK;
}

static int ref_check_hybrid(kvb_run *r) { return u_mass_check(r, kvb_run_find(r, "u")->ref, "reference"); }
static int out_check_hybrid(kvb_run *r)
{
    const kvb_tensor *u = kvb_run_find(r, "u");
    return u && u->out ? u_mass_check(r, u->out, "device") : KVB_OK;
}

#if KVB_HAVE_CUDA
static int launch_hybrid_with(kvb_run *r, int with_pages)
{
    score_priv *p = r->priv;
    return hybrid_score(dev(r, "q"), dev(r, "kmin"), dev(r, "kmax"), &p->h.s, p->h.r, p->h.k, dev(r, "u"),
                        with_pages ? dev(r, "pages") : NULL, dev(r, "channels"), dev(r, "workspace"), p->ws_bytes,
                        r->stream);
}
static int launch_hybrid(kvb_run *r) { return launch_hybrid_with(r, 1); }
static int launch_hybrid_score_only(kvb_run *r) { return launch_hybrid_with(r, 0); }
#else
#define launch_hybrid no_device
#define launch_hybrid_score_only no_device
#endif

/* The floor: r of the D rows of one extrema tensor per KV head, q, and u written once. Goals, both
 * from the same run's read ceiling: scoring alone (impl=score_only) at >= 80% of the read rate on those
 * bytes; scoring with its page top-k (impl=kernel) at >= 60% of the read rate on its bytes (the floor and
 * the list written) at B >= 2 and >= 45% at B = 1 (kernels/page_scoring/NOTES.md, Budget). */
static void cost_hybrid(const kvb_run *r, kvb_cost *c)
{
    const score_priv *p = r->priv;
    const page_layout *s = &p->h.s;
    const double heads = (double)s->B * s->Hkv, n = page_count(s->L, s->P), G = s->Hq / s->Hkv;
    const double floor = heads * (p->h.r * n * 2 + G * s->D * 2 + n * 4 + p->h.r * 4);
    c->bytes_dev = floor + (p->impl == IMPL_KERNEL ? heads * p->h.n_sel * 4 : 0);
    c->flops = heads * G * p->h.r * n * 2;
    c->ceiling = KVB_CEIL_READ;
    c->workspace_bytes = (double)p->ws_bytes;
    if (r->ceil && r->ceil->measured) {
        const double frac = p->impl != IMPL_KERNEL ? 0.8 : s->B == 1 ? 0.45 : 0.6;
        c->goal_us = kvb_read_contiguous_seconds((size_t)c->bytes_dev) * 1e6 / frac;
        c->goal_text = p->impl != IMPL_KERNEL ? "80% of the read rate"
                       : s->B == 1            ? "45% of the read rate with the page top-k"
                                              : "60% of the read rate with the page top-k";
    }
}

/* ---- quest_score ---- */

static int setup_quest(kvb_run *r)
{
    score_priv *p = kvb_run_alloc(r, sizeof *p, "quest_score state");
    r->priv = p;
    int rc = quest_of(r->c, &p->s, &p->budget);
    if (rc) return rc;
    p->impl = (int)kvb_case_get(r->c, "impl");
    const page_layout *s = &p->s;
    const int n = page_count(s->L, s->P), input = input_of(r->c), n_sel = quest_selected_pages(p->budget, s->P);
    const int64_t rows = (int64_t)s->B * s->Hkv;
    kvb_tensor *q = add(r, "q", KVB_BF16, 3, s->B, s->Hq, s->D, 0, KVB_IN);
    kvb_tensor *mn = add(r, "kmin", KVB_BF16, 4, s->B, s->Hkv, s->D, s->cap, KVB_IN);
    kvb_tensor *mx = add(r, "kmax", KVB_BF16, 4, s->B, s->Hkv, s->D, s->cap, KVB_IN);
    if (mn->n > (1 << 26)) mn->flags |= KVB_T_NO_DUMP, mx->flags |= KVB_T_NO_DUMP;
    fill_q(r, s, input, q->h);
    fill_meta(r, s, input == IN_TIES, mn->h, mx->h);
    kvb_tensor *sc = add(r, "scores", KVB_FP32, 3, s->B, s->Hkv, n, 0, KVB_OUT);
    kvb_tensor *pages = p->impl == IMPL_KERNEL ? add(r, "pages", KVB_I32, 3, s->B, s->Hkv, n_sel, 0, KVB_OUT) : NULL;
#if KVB_HAVE_CUDA
    if (kvb_gpu_available()) p->ws_bytes = quest_score_workspace_bytes(s);
#endif
    add_scratch(r, "workspace", p->ws_bytes);
    if ((rc = ref_quest_score(q->h, mn->h, mx->h, s, p->budget, sc->ref, pages ? pages->ref : NULL))) return rc;
    if (!pages) return KVB_OK;
    /* judged by the reference scores, the last page (always listed) ranked above every other, so that the
     * k-th score is that of the chosen pages; out_check_quest holds the last page in place on every row */
    p->cmp_scores = kvb_run_alloc(r, sizeof(float) * (size_t)sc->n, "quest comparison scores");
    memcpy(p->cmp_scores, sc->ref, sizeof(float) * (size_t)sc->n);
    for (int64_t row = 0; row < rows; row++) {
        float top = p->cmp_scores[row * n + n - 1];
        for (int j = 0; j < n - 1; j++) top = fmaxf(top, p->cmp_scores[row * n + j]);
        p->cmp_scores[row * n + n - 1] = top;
    }
    pages->cmp = KVB_CMP_INDEXSET;
    pages->scores = p->cmp_scores;
    pages->scores_dtype = KVB_FP32;
    pages->scores_n = n;
    pages->set_tol = kvb_selection_tol(&sc->tol, p->cmp_scores, rows, n, pages->ref, n_sel);
    return KVB_OK;
}

/* On every row: the last entry is the last page. */
static int out_check_quest(kvb_run *r)
{
    const score_priv *p = r->priv;
    const kvb_tensor *pages = kvb_run_find(r, "pages");
    if (!pages || !pages->out) return KVB_OK;
    const int n = page_count(p->s.L, p->s.P), n_sel = quest_selected_pages(p->budget, p->s.P);
    const int32_t *o = pages->out;
    for (int64_t row = 0; row < (int64_t)p->s.B * p->s.Hkv; row++)
        if (o[row * n_sel + n_sel - 1] != n - 1)
            return kvb_fail(KVB_EINVAL, "quest_score: row %lld lists %d last, not the last page %d", (long long)row,
                            o[row * n_sel + n_sel - 1], n - 1);
    return KVB_OK;
}

#if KVB_HAVE_CUDA
static int launch_quest_with(kvb_run *r, int with_pages)
{
    score_priv *p = r->priv;
    return quest_score(dev(r, "q"), dev(r, "kmin"), dev(r, "kmax"), &p->s, p->budget, dev(r, "scores"),
                       with_pages ? dev(r, "pages") : NULL, dev(r, "workspace"), p->ws_bytes, r->stream);
}
static int launch_quest(kvb_run *r) { return launch_quest_with(r, 1); }
static int launch_quest_score_only(kvb_run *r) { return launch_quest_with(r, 0); }
#else
#define launch_quest no_device
#define launch_quest_score_only no_device
#endif

/* Floor: both extrema tensors in full over the context's pages, q, the scores written. Goals: scoring
 * alone at >= 80% of the read rate, scoring with its page top-k at >= 70% (on its bytes, the list too). */
static void cost_quest(const kvb_run *r, kvb_cost *c)
{
    const score_priv *p = r->priv;
    const page_layout *s = &p->s;
    const double heads = (double)s->B * s->Hkv, n = page_count(s->L, s->P), G = s->Hq / s->Hkv;
    const double floor = heads * (2.0 * s->D * n * 2 + G * s->D * 2 + n * 4);
    c->bytes_dev = floor + (p->impl == IMPL_KERNEL ? heads * quest_selected_pages(p->budget, s->P) * 4.0 : 0);
    c->flops = heads * G * s->D * n * 4;
    c->ceiling = KVB_CEIL_READ;
    c->workspace_bytes = (double)p->ws_bytes;
    if (r->ceil && r->ceil->measured) {
        const double frac = p->impl == IMPL_KERNEL ? 0.7 : 0.8;
        c->goal_us = kvb_read_contiguous_seconds((size_t)c->bytes_dev) * 1e6 / frac;
        c->goal_text = p->impl == IMPL_KERNEL ? "70% of the read rate with the page top-k" : "80% of the read rate";
    }
}

/* ---- host memory (kvb_op.host_bytes) ---- */

static double meta_elems(const page_layout *s) { return (double)s->B * s->Hkv * s->D * s->cap; }

/* K in; kmin, kmax out */
static size_t host_bytes_build(const kvb_case *c)
{
    page_layout s;
    if (meta_layout(c, "page_meta_build", &s)) return 0;
    return kvb_host_bytes_sat(KVB_HOLD_IN * 2.0 * s.B * s.Hkv * (double)s.L * s.D + KVB_HOLD_OUT * 2 * 2 * meta_elems(&s));
}

/* k, t in; kmin, kmax in and out */
static size_t host_bytes_append(const kvb_case *c)
{
    page_layout s;
    if (meta_layout(c, "page_meta_append", &s)) return 0;
    return kvb_host_bytes_sat(KVB_HOLD_IN * (2.0 * s.B * s.Hkv * s.D + 4.0 * s.B) + KVB_HOLD_INOUT * 2 * 2 * meta_elems(&s));
}

/* q, kmin, kmax in; u, channels, pages out; the reference's scratch per thread (a KV head's channel
 * scores and z [G, pages]; the page top-k's pairs) */
static size_t host_bytes_hybrid(const kvb_case *c)
{
    hybrid_setup h;
    if (hybrid_of(c, &h)) return 0;
    const page_layout *s = &h.s;
    const double heads = (double)s->B * s->Hkv, n = page_count(s->L, s->P), G = s->Hq / s->Hkv;
    const double in = (double)s->B * s->Hq * s->D * 2 + 2 * 2 * meta_elems(s);
    const double out = heads * (n + h.r + h.n_sel) * 4;
    return kvb_host_bytes_sat(KVB_HOLD_IN * in + KVB_HOLD_OUT * out + 4.0 * s->D +
                              kvb_ref_threads() * (12.0 * s->D + 16.0 * h.r + 16 * G + 8 * G * n + 8 * n));
}

/* q, kmin, kmax in; scores, pages out; the comparison scores; the page top-k's pairs per thread */
static size_t host_bytes_quest(const kvb_case *c)
{
    page_layout s;
    int budget;
    if (quest_of(c, &s, &budget)) return 0;
    const double heads = (double)s.B * s.Hkv, n = page_count(s.L, s.P), n_sel = quest_selected_pages(budget, s.P);
    const double in = (double)s.B * s.Hq * s.D * 2 + 2 * 2 * meta_elems(&s);
    return kvb_host_bytes_sat(KVB_HOLD_IN * in + KVB_HOLD_OUT * heads * (n + n_sel) * 4 + heads * n * 4 + 4.0 * s.D +
                              kvb_ref_threads() * 8 * n);
}

/* ---- registry entries ---- */

static const kvb_impl hybrid_impls[] = {
    [IMPL_KERNEL] = {"kernel", launch_hybrid, 0, "channel choice + z (pass 1), u (pass 2), page top-k (topk_rows)"},
    [IMPL_SCORE_ONLY] = {"score_only", launch_hybrid_score_only, 0, "the scoring alone: channels and u, no page top-k"},
};
static const kvb_impl quest_impls[] = {
    [IMPL_KERNEL] = {"kernel", launch_quest, 0, "page scores, then budget/P - 1 pages (topk_rows) + the last page"},
    [IMPL_SCORE_ONLY] = {"score_only", launch_quest_score_only, 0, "the page scores alone, no page top-k"},
};

const kvb_op op_page_meta_build = {
    .name = "page_meta_build",
    .family = "page_scoring",
    .summary = "page min/max metadata from token-major K: kmin, kmax [B, Hkv, D, cap] channel-major",
    .params = build_params,
    .n_params = NPARAMS(build_params),
    .validate = validate_build,
    .host_bytes = host_bytes_build,
    .setup = setup_build,
    .launch = launch_build,
    .cost = cost_build,
};

const kvb_op op_page_meta_append = {
    .name = "page_meta_append",
    .family = "page_scoring",
    .summary = "append one key per sequence at t[b] into the page min/max metadata (in place)",
    .params = append_params,
    .n_params = NPARAMS(append_params),
    .validate = validate_append,
    .host_bytes = host_bytes_append,
    .setup = setup_append,
    .ref_check = ref_check_append,
    .launch = launch_append,
    .cost = cost_append,
};

const kvb_op op_hybrid_score = {
    .name = "hybrid_score",
    .family = "page_scoring",
    .summary = "RocketKV hybrid page scoring: top-r channels by |q|, signed extrema, softmax mass u, page top-k",
    .params = hybrid_params,
    .n_params = NPARAMS(hybrid_params),
    .tol = {1e-5, 1e-3, 1e-3},
    .validate = validate_hybrid,
    .host_bytes = host_bytes_hybrid,
    .setup = setup_hybrid,
    .ref_check = ref_check_hybrid,
    KVB_IMPLS(hybrid_impls),
    .cost = cost_hybrid,
    .teardown = teardown_score,
    .out_check = out_check_hybrid,
};

const kvb_op op_quest_score = {
    .name = "quest_score",
    .family = "page_scoring",
    .summary = "Quest page scoring (upper bound of q.k per page, max over the group's heads) and page selection",
    .params = quest_params,
    .n_params = NPARAMS(quest_params),
    .tol = {1e-5, 1e-3, 1e-3},
    .validate = validate_quest,
    .host_bytes = host_bytes_quest,
    .setup = setup_quest,
    KVB_IMPLS(quest_impls),
    .cost = cost_quest,
    .teardown = teardown_score,
    .out_check = out_check_quest,
};
