/* selective_attn.c: the plain C reference of selective attention (the formulas in selective_attn.h;
 * kernels/selective_attn/NOTES.md), in double. Written to be read against those formulas.
 *
 * Per (b, KV head) and each of its G query heads, row by row: the scores of the visible keys, their
 * maximum, LSE = m + log(sum exp(s - m)), P = exp(s - m) / sum, O = sum P v, and P added into the
 * column sums when the row contributes (i >= w0). The contributing rows [w0, L) are split into a fixed
 * number of contiguous parts of about equal work; each part sums its own column partials and the parts
 * are added in order, so the result is the same for any number of OpenMP threads, and the same whether
 * or not O is wanted (the rows [0, w0) that only O needs are parts of their own).
 */
#include "reference/selective_attn.h"

#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

int sattn_check(const sattn_params *p, const char *who)
{
    KVB_CHECK_RANGE(who, "B", p->B, 1, 1024);
    KVB_CHECK_RANGE(who, "Hkv", p->Hkv, 1, 256);
    KVB_CHECK_RANGE(who, "Hq", p->Hq, 1, 1024);
    if (p->Hq % p->Hkv != 0)
        return kvb_fail(KVB_EINVAL, "%s: Hq=%d is not a multiple of Hkv=%d (GQA: Hq = G * Hkv)", who, p->Hq, p->Hkv);
    KVB_CHECK_RANGE(who, "L", p->L, 1, SATTN_MAX_L);
    if (p->D != 64 && p->D != 128)
        return kvb_fail(KVB_EINVAL, "%s: D=%d is not supported (supported head dimensions: 64, 128)", who, p->D);
    KVB_CHECK_RANGE(who, "causal", p->causal, 0, 1);
    if (p->w0 < 0 || p->w0 >= p->L)
        return kvb_fail(KVB_EINVAL, "%s: w0=%d out of range [0, L-1 = %d]", who, p->w0, p->L - 1);
    KVB_CHECK_RANGE(who, "need_out", p->need_out, 0, 1);
    KVB_CHECK_RANGE(who, "group_sum", p->group_sum, 0, 1);
    return KVB_OK;
}

double sattn_pairs(const sattn_params *p, int first_row)
{
    double L = p->L, r0 = first_row;
    if (!p->causal) return (L - r0) * L;
    /* rows i = r0 .. L-1 see i + 1 keys */
    return (L * (L + 1) - r0 * (r0 + 1)) / 2;
}

#define N_PARTS 64

/* Row boundaries of N_PARTS parts of about equal work: row i costs ~ i + 1 keys when causal. */
static void part_bounds(int r0, int L, int causal, int *bound)
{
    for (int k = 0; k <= N_PARTS; k++) {
        double f = (double)k / N_PARTS;
        double row = causal ? sqrt((double)r0 * r0 + f * ((double)L * L - (double)r0 * r0)) : r0 + f * (L - r0);
        bound[k] = k == N_PARTS ? L : (int)row;
        if (bound[k] < r0) bound[k] = r0;
        if (k > 0 && bound[k] < bound[k - 1]) bound[k] = bound[k - 1];
    }
}

/* bf16 -> float is exact, so the float copies hold the inputs exactly; every product and sum below is
 * in double. */
static void to_float(const kvb_bf16 *x, int64_t n, float *y)
{
    for (int64_t i = 0; i < n; i++) y[i] = kvb_bf16_to_float(x[i]);
}

/* Up to RB consecutive rows at once (they share each k_j and v_j read): for row r of the block,
 * s[r][j] = exp(q_r . k_j * scale - m_r) for j < n[r] (m_r = max of row r's scaled scores), sum[r] =
 * sum_j s[r][j], and o[r] = sum_j s[r][j] v_j when o != NULL. The hot loop of the reference, built for
 * two targets (AVX2 + FMA, and baseline x86-64) and picked at run time where the compiler can. */
#define RB 4
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 11
#define REF_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define REF_CLONES
#endif
REF_CLONES static void rows_block(const float *q, int nr, const int *n, const float *k, const float *v, int D, int L,
                                  double scale, double *s, double *o, double *m, double *sum)
{
    int nmax = 0;
    for (int r = 0; r < nr; r++) {
        m[r] = -INFINITY;
        if (n[r] > nmax) nmax = n[r];
    }
    double qd[RB * 128]; /* D <= 128 */
    for (int r = 0; r < RB; r++)
        for (int d = 0; d < D; d++) qd[r * D + d] = r < nr ? q[r * D + d] : 0;
    const double *q0 = qd, *q1 = qd + D, *q2 = qd + 2 * D, *q3 = qd + 3 * D;
    for (int j = 0; j < nmax; j++) {
        const float *kj = k + (int64_t)j * D;
        double a0 = 0, a1 = 0, a2 = 0, a3 = 0;
#pragma omp simd reduction(+ : a0, a1, a2, a3)
        for (int d = 0; d < D; d++) {
            const double kd = kj[d];
            a0 += q0[d] * kd, a1 += q1[d] * kd, a2 += q2[d] * kd, a3 += q3[d] * kd;
        }
        const double a[RB] = {a0, a1, a2, a3};
        for (int r = 0; r < nr; r++)
            if (j < n[r]) {
                double x = s[(int64_t)r * L + j] = scale * a[r];
                if (x > m[r]) m[r] = x;
            }
    }
    for (int r = 0; r < nr; r++) {
        double *sr = s + (int64_t)r * L, acc = 0;
        for (int j = 0; j < n[r]; j++) acc += (sr[j] = exp(sr[j] - m[r]));
        for (int j = n[r]; j < nmax; j++) sr[j] = 0;
        sum[r] = acc;
    }
    if (!o) return;
    for (int i = 0; i < RB * D; i++) o[i] = 0;
    for (int j = 0; j < nmax; j++) {
        const float *vj = v + (int64_t)j * D;
        const double w0 = s[j], w1 = nr > 1 ? s[L + j] : 0, w2 = nr > 2 ? s[2 * (int64_t)L + j] : 0,
                     w3 = nr > 3 ? s[3 * (int64_t)L + j] : 0;
#pragma omp simd
        for (int d = 0; d < D; d++) {
            const double vd = vj[d];
            o[d] += w0 * vd, o[D + d] += w1 * vd, o[2 * D + d] += w2 * vd, o[3 * D + d] += w3 * vd;
        }
    }
}

int ref_selective_attn(const kvb_bf16 *Q, const kvb_bf16 *K, const kvb_bf16 *V, const sattn_params *p,
                       const uint8_t *kv_mask, kvb_bf16 *O, float *LSE, float *colsum, float *colsum_kv)
{
    int rc = sattn_check(p, "ref_selective_attn");
    if (rc) return rc;
    if (!Q || !K || !V || !LSE || !colsum || (p->need_out && !O) || (p->group_sum && !colsum_kv))
        return kvb_fail(KVB_EINVAL, "ref_selective_attn: NULL tensor");
    const int L = p->L, D = p->D, G = sattn_groups(p);
    const int64_t LD = (int64_t)L * D;
    const double scale = 1.0 / sqrt((double)D);
    /* rows that need computing: the contributing ones [w0, L) in parts 0 .. N_PARTS-1, whose column
     * partials are added; for O also the rows [0, w0), in parts N_PARTS .. 2 N_PARTS - 1 */
    const int lse_len = sattn_lse_len(p), lse_row0 = sattn_lse_row0(p);
    const int n_parts = p->need_out && p->w0 > 0 ? 2 * N_PARTS : N_PARTS;
    int bound[2 * N_PARTS + 2];
    part_bounds(p->w0, L, p->causal, bound);
    part_bounds(0, p->w0, p->causal, bound + N_PARTS + 1);

#ifdef _OPENMP
    const int threads = omp_get_max_threads();
#else
    const int threads = 1;
#endif
    const char *what = "ref_selective_attn scratch";
    float *k = kvb_xalloc((size_t)LD, sizeof(float), what), *v = kvb_xalloc((size_t)LD, sizeof(float), what);
    float *q = kvb_xalloc((size_t)LD, sizeof(float), what);
    double *part = kvb_xalloc((size_t)N_PARTS * L, sizeof(double), what); /* column partials of each part */
    double *group = kvb_xalloc((size_t)L, sizeof(double), what);
    const size_t per_thread = (size_t)RB * L + (size_t)RB * D; /* a thread's block scores and outputs */
    double *rows = kvb_xalloc((size_t)threads * per_thread, sizeof(double), what);
    if (!k || !v || !q || !part || !group || !rows) {
        kvb_xfree(k), kvb_xfree(v), kvb_xfree(q), kvb_xfree(part), kvb_xfree(group), kvb_xfree(rows);
        return KVB_ENOMEM;
    }
    for (int64_t bk = 0; bk < (int64_t)p->B * p->Hkv; bk++) {
        if (kv_mask && !kv_mask[bk]) continue;
        to_float(K + bk * LD, LD, k);
        to_float(V + bk * LD, LD, v);
        for (int j = 0; j < L; j++) group[j] = 0;
        for (int g = 0; g < G; g++) {
            const int64_t bh = bk * G + g; /* (b * Hkv + hk) * G + g = b * Hq + h */
            to_float(Q + bh * LD, LD, q);
#pragma omp parallel num_threads(threads)
            {
#ifdef _OPENMP
                double *s = rows + (size_t)omp_get_thread_num() * per_thread, *o = s + (size_t)RB * L;
#else
                double *s = rows, *o = s + (size_t)RB * L;
#endif
#pragma omp for schedule(dynamic, 1)
                for (int pi = 0; pi < n_parts; pi++) {
                    const int *b = pi < N_PARTS ? bound + pi : bound + pi + 1; /* the part's rows [b[0], b[1]) */
                    double *cs = pi < N_PARTS ? part + (int64_t)pi * L : NULL; /* rows >= w0 only */
                    if (cs)
                        for (int j = 0; j < L; j++) cs[j] = 0;
                    for (int i0 = b[0]; i0 < b[1]; i0 += RB) {
                        const int nr = b[1] - i0 < RB ? b[1] - i0 : RB;
                        int n[RB];
                        double m[RB], sum[RB];
                        for (int r = 0; r < nr; r++) n[r] = p->causal ? i0 + r + 1 : L;
                        rows_block(q + (int64_t)i0 * D, nr, n, k, v, D, L, scale, s, p->need_out ? o : NULL, m, sum);
                        for (int r = 0; r < nr; r++) { /* s[r][j] = exp(s - m); P = s[r][j] / sum */
                            const int i = i0 + r;
                            const double *sr = s + (int64_t)r * L;
                            if (i >= lse_row0) LSE[bh * lse_len + (i - lse_row0)] = (float)(m[r] + log(sum[r]));
                            if (p->need_out) {
                                kvb_bf16 *oi = O + bh * LD + (int64_t)i * D;
                                for (int d = 0; d < D; d++) oi[d] = kvb_double_to_bf16(o[r * D + d] / sum[r]);
                            }
                            if (i >= p->w0) {
                                const double inv = 1.0 / sum[r];
                                for (int j = 0; j < n[r]; j++) cs[j] += sr[j] * inv;
                            }
                        }
                    }
                }
            }
            for (int j = 0; j < L; j++) {
                double c = 0;
                for (int pi = 0; pi < N_PARTS; pi++) c += part[(int64_t)pi * L + j];
                group[j] += c;
                colsum[bh * L + j] = (float)c;
            }
        }
        if (p->group_sum)
            for (int j = 0; j < L; j++) colsum_kv[bk * L + j] = (float)group[j];
    }
    kvb_xfree(k), kvb_xfree(v), kvb_xfree(q), kvb_xfree(part), kvb_xfree(group), kvb_xfree(rows);
    return KVB_OK;
}
