/* page_scoring.c: see page_scoring.h. Plain C, line by line with the formulas there (and in
 * kernels/page_scoring/NOTES.md); double arithmetic, one rounding at the end. */
#include "reference/page_scoring.h"

#include <math.h>
#include <stdlib.h>

#include "reference/select.h"


int page_layout_check(const page_layout *s, const char *who)
{
    KVB_CHECK_RANGE(who, "B", s->B, 1, PAGE_MAX_B);
    KVB_CHECK_RANGE(who, "Hkv", s->Hkv, 1, PAGE_MAX_HKV);
    if (s->Hq < 1 || s->Hq % s->Hkv)
        return kvb_fail(KVB_EINVAL, "%s: Hq=%d is not a multiple of Hkv=%d (GQA: Hq = G * Hkv)", who, s->Hq, s->Hkv);
    const int G = s->Hq / s->Hkv;
    if (G > PAGE_MAX_G)
        return kvb_fail(KVB_EINVAL, "%s: G = Hq/Hkv = %d/%d = %d out of range [1, %d] (query heads per KV head: the "
                        "scoring kernels take one warp of 8 per query head)", who, s->Hq, s->Hkv, G, PAGE_MAX_G);
    if (s->D < 8 || s->D > PAGE_MAX_D || s->D % 8)
        return kvb_fail(KVB_EINVAL, "%s: D=%d out of range: a multiple of 8 in [8, %d]", who, s->D, PAGE_MAX_D);
    KVB_CHECK_RANGE(who, "L", s->L, 1, PAGE_MAX_L);
    KVB_CHECK_RANGE(who, "P", s->P, 1, PAGE_MAX_P);
    const int n = page_count(s->L, s->P);
    if (n > PAGE_MAX_PAGES)
        return kvb_fail(KVB_EINVAL, "%s: ceil(L/P) = ceil(%d/%d) = %d pages out of range [1, %d]", who, s->L, s->P, n,
                        PAGE_MAX_PAGES);
    if (s->cap < n || s->cap % 8)
        return kvb_fail(KVB_EINVAL, "%s: cap=%d out of range: metadata rows hold at least ceil(L/P) = ceil(%d/%d) = %d "
                        "pages, a multiple of 8", who, s->cap, s->L, s->P, n);
    return KVB_OK;
}

/* ---- metadata ---- */

static inline int64_t meta_row(const page_layout *s, int64_t bh, int c) { return (bh * s->D + c) * (int64_t)s->cap; }

int ref_page_meta_build(const kvb_bf16 *K, const page_layout *s, kvb_bf16 *kmin, kvb_bf16 *kmax)
{
    int rc = page_layout_check(s, "ref_page_meta_build");
    if (rc) return rc;
    const int64_t heads = (int64_t)s->B * s->Hkv;
    const int n = page_count(s->L, s->P);
#pragma omp parallel for schedule(static)
    for (int64_t bh = 0; bh < heads; bh++) {
        const kvb_bf16 *Kh = K + bh * s->L * (int64_t)s->D;
        for (int c = 0; c < s->D; c++) {
            kvb_bf16 *mn = kmin + meta_row(s, bh, c), *mx = kmax + meta_row(s, bh, c);
            for (int j = 0; j < s->cap; j++) {
                if (j >= n) { /* no token yet */
                    mn[j] = BF16_POS_INF, mx[j] = BF16_NEG_INF;
                    continue;
                }
                const int64_t t0 = (int64_t)j * s->P;
                kvb_bf16 lo = Kh[t0 * s->D + c], hi = lo;
                for (int i = 1; i < page_tokens(s, j); i++) {
                    const kvb_bf16 v = Kh[(t0 + i) * s->D + c];
                    if (kvb_bf16_to_float(v) < kvb_bf16_to_float(lo)) lo = v;
                    if (kvb_bf16_to_float(v) > kvb_bf16_to_float(hi)) hi = v;
                }
                mn[j] = lo, mx[j] = hi;
            }
        }
    }
    return KVB_OK;
}

int page_positions_check(const page_layout *s, const int32_t *t, const char *who)
{
    for (int b = 0; b < s->B; b++)
        if (t[b] < 0 || t[b] >= s->L)
            return kvb_fail(KVB_EINVAL, "%s: t[%d]=%d out of range [0, L-1 = %d]", who, b, t[b], s->L - 1);
    return KVB_OK; /* page t/P < ceil(L/P) <= cap (page_layout_check) */
}

int ref_page_meta_append(const kvb_bf16 *k, const int32_t *t, const page_layout *s, kvb_bf16 *kmin, kvb_bf16 *kmax)
{
    int rc = page_layout_check(s, "ref_page_meta_append");
    if (rc || (rc = page_positions_check(s, t, "ref_page_meta_append"))) return rc;
    for (int b = 0; b < s->B; b++) {
        const int j = t[b] / s->P, first = t[b] % s->P == 0;
        for (int h = 0; h < s->Hkv; h++) {
            const int64_t bh = (int64_t)b * s->Hkv + h;
            for (int c = 0; c < s->D; c++) {
                const kvb_bf16 v = k[bh * s->D + c];
                kvb_bf16 *mn = kmin + meta_row(s, bh, c) + j, *mx = kmax + meta_row(s, bh, c) + j;
                if (first) {
                    *mn = v, *mx = v;
                    continue;
                }
                if (kvb_bf16_to_float(v) < kvb_bf16_to_float(*mn)) *mn = v;
                if (kvb_bf16_to_float(v) > kvb_bf16_to_float(*mx)) *mx = v;
            }
        }
    }
    return KVB_OK;
}

/* ---- RocketKV hybrid scoring ---- */

int hybrid_params_check(const page_layout *s, int r, int k, const char *who)
{
    KVB_CHECK_RANGE(who, "r", r, 1, s->D);
    if (k < 1 || k > s->L)
        return kvb_fail(KVB_EINVAL, "%s: k=%d tokens to attend out of range [1, L = %d]", who, k, s->L);
    return KVB_OK;
}

int ref_hybrid_score(const kvb_bf16 *q, const kvb_bf16 *kmin, const kvb_bf16 *kmax, const page_layout *s, int r, int k,
                     float *u, int32_t *pages, int32_t *channels)
{
    int rc = page_layout_check(s, "ref_hybrid_score");
    if (rc || (rc = hybrid_params_check(s, r, k, "ref_hybrid_score"))) return rc;
    const int D = s->D, G = s->Hq / s->Hkv, n = page_count(s->L, s->P);
    const int64_t heads = (int64_t)s->B * s->Hkv;
    kvb_par_error err = {0};
#pragma omp parallel for schedule(dynamic)
    for (int64_t bh = 0; bh < heads; bh++) {
        const kvb_bf16 *qg = q + bh * G * D; /* the G query heads of KV head bh, consecutive */
        const char *what = "ref_hybrid_score head scratch";
        float *a = kvb_xalloc((size_t)D, sizeof(float), what);
        int32_t *I = kvb_xalloc((size_t)r, sizeof(int32_t), what);
        double *tau = kvb_xalloc((size_t)G, sizeof(double), what), *z = kvb_xalloc((size_t)G * n, sizeof(double), what);
        double *lse = kvb_xalloc((size_t)G, sizeof(double), what);
        const kvb_bf16 **E = kvb_xalloc((size_t)r, sizeof(*E), what);
        if (!a || !I || !tau || !z || !lse || !E) {
            kvb_par_keep(&err, KVB_ENOMEM);
            kvb_xfree(a), kvb_xfree(I), kvb_xfree(tau), kvb_xfree(z), kvb_xfree(lse), kvb_xfree((void *)E);
            continue;
        }
        /* a[c] = sum_h |q[h][c]|; I = topk(a, r) */
        for (int c = 0; c < D; c++) {
            double sum = 0;
            for (int h = 0; h < G; h++) sum += fabs(kvb_bf16_to_double(qg[h * D + c]));
            a[c] = (float)sum;
        }
        const int st = ref_topk(a, 1, D, D, r, I, r);
        if (st) {
            kvb_par_keep(&err, st);
            kvb_xfree(a), kvb_xfree(I), kvb_xfree(tau), kvb_xfree(z), kvb_xfree(lse), kvb_xfree((void *)E);
            continue;
        }
        if (channels)
            for (int i = 0; i < r; i++) channels[bh * r + i] = I[i];
        /* sg[c] = sum_h q[h][c]; E[c] = sg > 0 ? kmax[c] : kmin[c] */
        for (int i = 0; i < r; i++) {
            double sg = 0;
            for (int h = 0; h < G; h++) sg += kvb_bf16_to_double(qg[h * D + I[i]]);
            E[i] = (sg > 0 ? kmax : kmin) + meta_row(s, bh, I[i]);
        }
        /* tau_h = sqrt(D * sum_{c in I} |q[h][c]| / sum_c |q[h][c]|) */
        for (int h = 0; h < G; h++) {
            double part = 0, all = 0;
            for (int i = 0; i < r; i++) part += fabs(kvb_bf16_to_double(qg[h * D + I[i]]));
            for (int c = 0; c < D; c++) all += fabs(kvb_bf16_to_double(qg[h * D + c]));
            tau[h] = part > 0 ? sqrt(D * part / all) : 0;
        }
        /* z[h][j] = sum_{c in I} q[h][c] E[c][j] / tau_h; lse_h = log sum_j n_j exp(z[h][j]) */
        for (int h = 0; h < G; h++) {
            double m = -INFINITY;
            for (int j = 0; j < n; j++) {
                double dot = 0;
                for (int i = 0; i < r; i++) dot += kvb_bf16_to_double(qg[h * D + I[i]]) * kvb_bf16_to_double(E[i][j]);
                z[(int64_t)h * n + j] = tau[h] > 0 ? dot / tau[h] : 0;
                if (z[(int64_t)h * n + j] > m) m = z[(int64_t)h * n + j];
            }
            double sum = 0;
            for (int j = 0; j < n; j++) sum += page_tokens(s, j) * exp(z[(int64_t)h * n + j] - m);
            lse[h] = m + log(sum);
        }
        /* u[j] = sum_h exp(z[h][j] - lse_h) */
        for (int j = 0; j < n; j++) {
            double sum = 0;
            for (int h = 0; h < G; h++) sum += exp(z[(int64_t)h * n + j] - lse[h]);
            u[bh * n + j] = (float)sum;
        }
        kvb_xfree(a), kvb_xfree(I), kvb_xfree(tau), kvb_xfree(z), kvb_xfree(lse), kvb_xfree((void *)E);
    }
    if ((rc = kvb_par_return(&err)) || !pages) return rc;
    /* pages = topk(u, ceil(k/P)), ascending */
    const int n_sel = hybrid_selected_pages(k, s->P);
    return ref_topk(u, (int)heads, n, n, n_sel, pages, n_sel);
}

/* ---- Quest ---- */

int quest_params_check(const page_layout *s, int budget, const char *who)
{
    if (budget < s->P || budget > s->L)
        return kvb_fail(KVB_EINVAL, "%s: budget=%d tokens out of range [P = %d, L = %d] (budget/P pages, the last "
                        "one included)", who, budget, s->P, s->L);
    return KVB_OK;
}

int ref_quest_score(const kvb_bf16 *q, const kvb_bf16 *kmin, const kvb_bf16 *kmax, const page_layout *s, int budget,
                    float *scores, int32_t *pages)
{
    int rc = page_layout_check(s, "ref_quest_score");
    if (rc || (rc = quest_params_check(s, budget, "ref_quest_score"))) return rc;
    const int D = s->D, G = s->Hq / s->Hkv, n = page_count(s->L, s->P);
    const int64_t heads = (int64_t)s->B * s->Hkv;
#pragma omp parallel for schedule(static)
    for (int64_t bh = 0; bh < heads; bh++) {
        const kvb_bf16 *qg = q + bh * G * D;
        for (int j = 0; j < n; j++) {
            double best = -INFINITY;
            for (int h = 0; h < G; h++) {
                double o = 0;
                for (int c = 0; c < D; c++) {
                    const double qc = kvb_bf16_to_double(qg[h * D + c]);
                    const double hi = qc * kvb_bf16_to_double(kmax[meta_row(s, bh, c) + j]);
                    const double lo = qc * kvb_bf16_to_double(kmin[meta_row(s, bh, c) + j]);
                    o += hi > lo ? hi : lo;
                }
                if (o > best) best = o;
            }
            scores[bh * n + j] = (float)best;
        }
    }
    if (!pages) return KVB_OK;
    /* budget/P - 1 pages among the first n - 1, then the last page */
    const int n_sel = quest_selected_pages(budget, s->P);
    for (int64_t bh = 0; bh < heads; bh++) {
        if ((rc = ref_topk(scores + bh * n, 1, n, n - 1, n_sel - 1, pages + bh * n_sel, n_sel))) return rc;
        pages[bh * n_sel + n_sel - 1] = n - 1;
    }
    return KVB_OK;
}

/* ---- RocketKV budget knobs ---- */

int rocketkv_budget(int T, int Lmax, int D, int M, rocketkv_knobs *o)
{
    if (T < 2 || T > PAGE_MAX_L)
        return kvb_fail(KVB_EINVAL, "rocketkv_budget: T=%d out of range [2, %d] (k = T/2 tokens attended, at least 1)", T,
                        PAGE_MAX_L);
    KVB_CHECK_RANGE("rocketkv_budget", "Lmax", Lmax, 1, PAGE_MAX_L);
    KVB_CHECK_RANGE("rocketkv_budget", "D", D, 1, 1024);
    o->c = fmax(1.0, (double)Lmax / T);
    o->alpha = fmin(0.2 + 0.06 * log2(o->c), 0.8);
    o->C = (int)floor(Lmax / pow(o->c, o->alpha));
    if (M < 0 || M > o->C)
        return kvb_fail(KVB_EINVAL, "rocketkv_budget: M=%d out of range [0, C = %d] (prompt budget C - M)", M, o->C);
    o->prompt = o->C - M;
    o->c2 = fmax(1.0, (double)o->C / T);
    const int p_floor = (int)floor(o->c2), p_sqrt = (int)ceil(sqrt(o->c2));
    o->P = p_floor < p_sqrt ? p_floor : p_sqrt;
    const double r = round(D * o->P / o->c2);
    o->r = r < 1 ? 1 : r > D ? D : (int)r;
    o->k = T / 2;
    return KVB_OK;
}
