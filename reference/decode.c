/* decode.c: the plain C reference of dense and sparse decode attention (contract:
 * kernels/decode/NOTES.md). Read it against the contract there: scores in double from the bf16
 * inputs, scaled by 1/sqrt(D), a softmax in double, the weighted sum of V in double, one rounding to
 * bf16 at the end. */
#include "reference/decode.h"

#include <math.h>
#include <stdlib.h>

int decode_layout_check(const decode_layout *d, const char *who)
{
    KVB_CHECK_RANGE(who, "B", d->B, 1, DECODE_MAX_B);
    KVB_CHECK_RANGE(who, "Hkv", d->Hkv, 1, DECODE_MAX_HKV);
    KVB_CHECK_RANGE(who, "Hq", d->Hq, d->Hkv, (int64_t)d->Hkv * DECODE_MAX_G);
    if (d->Hq % d->Hkv != 0)
        return kvb_fail(KVB_EINVAL, "%s: Hq=%d is not a multiple of Hkv=%d (GQA: G = Hq/Hkv query heads per KV head)",
                        who, d->Hq, d->Hkv);
    if (d->D != 64 && d->D != 128)
        return kvb_fail(KVB_EINVAL, "%s: D=%d is not one of {64, 128}", who, d->D);
    KVB_CHECK_RANGE(who, "L", d->L, 1, DECODE_MAX_L);
    return KVB_OK;
}

int decode_lengths_check(const decode_layout *d, const int32_t *len, const char *who)
{
    for (int b = 0; b < d->B; b++)
        if (len[b] < 1 || len[b] > d->L)
            return kvb_fail(KVB_EINVAL, "%s: len[%d]=%d out of range [1, L = %lld]: a sequence holds at least one token "
                            "and no more than the allocated cache", who, b, len[b], (long long)d->L);
    return KVB_OK;
}

int decode_positions_check(const decode_layout *d, const int32_t *t, const char *who)
{
    for (int b = 0; b < d->B; b++)
        if (t[b] < 0 || t[b] >= d->L)
            return kvb_fail(KVB_EINVAL, "%s: t[%d]=%d out of range [0, L = %lld): the new token's row must lie inside "
                            "the allocated cache", who, b, t[b], (long long)d->L);
    return KVB_OK;
}

int ref_kv_append(const kvb_bf16 *knew, const kvb_bf16 *vnew, const int32_t *t, kvb_bf16 *K, kvb_bf16 *V,
                  const decode_layout *d)
{
    int rc = decode_layout_check(d, "ref_kv_append");
    if (rc || (rc = decode_positions_check(d, t, "ref_kv_append"))) return rc;
    for (int b = 0; b < d->B; b++)
        for (int h = 0; h < d->Hkv; h++) {
            const int64_t bh = (int64_t)b * d->Hkv + h, row = (bh * d->L + t[b]) * d->D;
            for (int i = 0; i < d->D; i++) {
                K[row + i] = knew[bh * d->D + i];
                V[row + i] = vnew[bh * d->D + i];
            }
        }
    return KVB_OK;
}

/* o rows of the G query heads of one KV head: softmax over the n tokens rows[0..n) (rows == NULL:
 * tokens 0..n-1) of s_t = q . K_t / sqrt(D), weighted sum of V_t; double throughout, bf16 once. */
static int attend_rows(const kvb_bf16 *q, const kvb_bf16 *Kh, const kvb_bf16 *Vh, const int64_t *rows, int64_t n,
                       int G, int D, kvb_bf16 *o)
{
    const double scale = 1.0 / sqrt((double)D);
    double *s = kvb_xalloc((size_t)n, sizeof(double), "decode reference scores"), qd[128], acc[128];
    if (!s) return KVB_ENOMEM;
    for (int g = 0; g < G; g++) {
        const kvb_bf16 *qh = q + (int64_t)g * D;
        for (int i = 0; i < D; i++) qd[i] = kvb_bf16_to_double(qh[i]);
        double m = -INFINITY;
        for (int64_t j = 0; j < n; j++) { /* s_t = q . K_t / sqrt(D) */
            const int64_t t = rows ? rows[j] : j;
            double dot = 0;
            for (int i = 0; i < D; i++) dot += qd[i] * kvb_bf16_to_double(Kh[t * D + i]);
            s[j] = dot * scale;
            if (s[j] > m) m = s[j];
        }
        double l = 0; /* softmax: p_t = exp(s_t - m) / sum */
        for (int i = 0; i < D; i++) acc[i] = 0;
        for (int64_t j = 0; j < n; j++) {
            const int64_t t = rows ? rows[j] : j;
            double p = exp(s[j] - m);
            l += p;
            for (int i = 0; i < D; i++) acc[i] += p * kvb_bf16_to_double(Vh[t * D + i]);
        }
        kvb_bf16 *oh = o + (int64_t)g * D;
        for (int i = 0; i < D; i++) oh[i] = kvb_double_to_bf16(acc[i] / l);
    }
    kvb_xfree(s);
    return KVB_OK;
}

int ref_decode_attn(const kvb_bf16 *q, const kvb_bf16 *K, const kvb_bf16 *V, const int32_t *len, kvb_bf16 *o,
                    const decode_layout *d, const uint8_t *slices)
{
    int rc = decode_layout_check(d, "ref_decode_attn");
    if (rc) return rc;
    if ((rc = decode_lengths_check(d, len, "ref_decode_attn"))) return rc;
    const int G = d->Hq / d->Hkv, D = d->D;
    const int n_slices = d->B * d->Hkv;
    kvb_par_error err = {0};
#pragma omp parallel for schedule(dynamic)
    for (int sl = 0; sl < n_slices; sl++) {
        if (slices && !slices[sl]) continue;
        const int b = sl / d->Hkv, kvh = sl % d->Hkv;
        const int64_t kv_off = ((int64_t)b * d->Hkv + kvh) * d->L * D, qo_off = ((int64_t)b * d->Hq + kvh * G) * D;
        const int st = attend_rows(q + qo_off, K + kv_off, V + kv_off, NULL, len[b], G, D, o + qo_off);
        if (st) kvb_par_keep(&err, st);
    }
    return kvb_par_return(&err);
}

/* ---- sparse decode attention ---- */

int sparse_layout_check(const sparse_layout *s, const char *who)
{
    int rc = decode_layout_check(&s->kv, who);
    if (rc) return rc;
    KVB_CHECK_RANGE(who, "P", s->P, 1, SPARSE_MAX_P);
    KVB_CHECK_RANGE(who, "n", s->n, 1, (s->kv.L + s->P - 1) / s->P);
    return KVB_OK;
}

int sparse_lists_check(const sparse_layout *s, const int32_t *len, const int32_t *list, const int32_t *cnt, int pages,
                       const char *who)
{
    int rc = decode_lengths_check(&s->kv, len, who);
    if (rc) return rc;
    const char *what = pages ? "pages" : "idx";
    for (int b = 0; b < s->kv.B; b++) {
        if (cnt[b] < 1 || cnt[b] > s->n)
            return kvb_fail(KVB_EINVAL, "%s: cnt[%d]=%d out of range [1, n = %d]: entries used of sequence %d's lists",
                            who, b, cnt[b], s->n, b);
        const int64_t hi = pages ? ((int64_t)len[b] + s->P - 1) / s->P : len[b];
        for (int h = 0; h < s->kv.Hkv; h++) {
            const int32_t *l = list + ((int64_t)b * s->kv.Hkv + h) * s->n;
            for (int j = 0; j < cnt[b]; j++)
                if (l[j] < 0 || l[j] >= hi)
                    return kvb_fail(KVB_EINVAL, "%s: %s[b=%d, kv head=%d, entry %d]=%d out of range [0, %lld): %s of "
                                    "sequence %d (len %d%s)", who, what, b, h, j, l[j], (long long)hi,
                                    pages ? "a page outside the cache" : "a token outside the cache", b, len[b],
                                    pages ? ", pages of P tokens" : "");
        }
    }
    return KVB_OK;
}

/* tokens of one list: the entries themselves, or each page's tokens below len */
static int64_t list_rows(const int32_t *l, int cnt, int P, int pages, int len, int64_t *rows)
{
    int64_t n = 0;
    for (int j = 0; j < cnt; j++) {
        if (!pages) {
            rows[n++] = l[j];
            continue;
        }
        for (int i = 0; i < P; i++) {
            const int64_t t = (int64_t)l[j] * P + i;
            if (t < len) rows[n++] = t;
        }
    }
    return n;
}

static int ref_sparse(const kvb_bf16 *q, const kvb_bf16 *K, const kvb_bf16 *V, const int32_t *len, const int32_t *list,
                      const int32_t *cnt, kvb_bf16 *o, const sparse_layout *s, const uint8_t *slices, int pages,
                      const char *who)
{
    int rc = sparse_layout_check(s, who);
    if (rc) return rc;
    if (!pages && s->P != 1) return kvb_fail(KVB_EINVAL, "%s: P=%d out of range [1, 1]: token lists have no pages", who, s->P);
    if ((rc = sparse_lists_check(s, len, list, cnt, pages, who))) return rc;
    const decode_layout *d = &s->kv;
    const int G = d->Hq / d->Hkv, D = d->D, P = pages ? s->P : 1;
    const int n_slices = d->B * d->Hkv;
    kvb_par_error err = {0};
#pragma omp parallel for schedule(dynamic)
    for (int sl = 0; sl < n_slices; sl++) {
        if (slices && !slices[sl]) continue;
        const int b = sl / d->Hkv, kvh = sl % d->Hkv;
        int64_t *rows = kvb_xalloc((size_t)cnt[b] * (size_t)P, sizeof(int64_t), "sparse reference rows");
        if (!rows) {
            kvb_par_keep(&err, KVB_ENOMEM);
            continue;
        }
        const int64_t n = list_rows(list + (int64_t)sl * s->n, cnt[b], P, pages, len[b], rows);
        const int64_t kv_off = (int64_t)sl * d->L * D, qo_off = ((int64_t)b * d->Hq + kvh * G) * D;
        const int st = attend_rows(q + qo_off, K + kv_off, V + kv_off, rows, n, G, D, o + qo_off);
        if (st) kvb_par_keep(&err, st);
        kvb_xfree(rows);
    }
    return kvb_par_return(&err);
}

int ref_sparse_attn_idx(const kvb_bf16 *q, const kvb_bf16 *K, const kvb_bf16 *V, const int32_t *len, const int32_t *idx,
                        const int32_t *cnt, kvb_bf16 *o, const sparse_layout *s, const uint8_t *slices)
{
    return ref_sparse(q, K, V, len, idx, cnt, o, s, slices, 0, "ref_sparse_attn_idx");
}

int ref_sparse_attn_pages(const kvb_bf16 *q, const kvb_bf16 *K, const kvb_bf16 *V, const int32_t *len,
                          const int32_t *pages, const int32_t *cnt, kvb_bf16 *o, const sparse_layout *s,
                          const uint8_t *slices)
{
    return ref_sparse(q, K, V, len, pages, cnt, o, s, slices, 1, "ref_sparse_attn_pages");
}
