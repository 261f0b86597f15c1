/* select.c: see select.h. Per row: sort the indices by (key descending, index ascending), keep the
 * first k, sort those ascending. */
#include "reference/select.h"

#include <stdlib.h>
#include <string.h>

#include "reference/kvb.h"

uint32_t topk_order_key(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if (u == 0x80000000u) u = 0; /* -0 is +0 */
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

typedef struct keyed {
    uint32_t key;
    int32_t i;
} keyed;

static int by_key_desc_then_index(const void *a, const void *b)
{
    const keyed *x = a, *y = b;
    if (x->key != y->key) return x->key < y->key ? 1 : -1;
    return (x->i > y->i) - (x->i < y->i);
}

static int ascending(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

int ref_topk(const float *scores, int rows, int64_t ld, int n, int k, int32_t *idx, int64_t ldo)
{
    if (rows < 1) return kvb_fail(KVB_EINVAL, "topk: rows=%d out of range [1, 2^31)", rows);
    if (n < 0 || n > 2097152) return kvb_fail(KVB_EINVAL, "topk: n=%d out of range [0, 2097152]", n);
    if (ld < n) return kvb_fail(KVB_EINVAL, "topk: ld=%lld out of range [n = %d, ...)", (long long)ld, n);
    if (k < 0 || k > n) return kvb_fail(KVB_EINVAL, "topk: k=%d out of range [0, n = %d]", k, n);
    if (ldo < k) return kvb_fail(KVB_EINVAL, "topk: ldo=%lld out of range [k = %d, ...)", (long long)ldo, k);
    kvb_par_error err = {0};
#pragma omp parallel for schedule(dynamic)
    for (int r = 0; r < rows; r++) {
        keyed *v = kvb_xalloc((size_t)(n ? n : 1), sizeof *v, "topk row scratch");
        if (!v) {
            kvb_par_keep(&err, KVB_ENOMEM);
            continue;
        }
        for (int i = 0; i < n; i++) v[i] = (keyed){topk_order_key(scores[(int64_t)r * ld + i]), i};
        qsort(v, (size_t)n, sizeof *v, by_key_desc_then_index);
        int32_t *out = idx + (int64_t)r * ldo;
        for (int j = 0; j < k; j++) out[j] = v[j].i;
        qsort(out, (size_t)k, sizeof *out, ascending);
        kvb_xfree(v);
    }
    return kvb_par_return(&err);
}

int ref_maxpool(const float *x, int rows, int L, int ks, float *y)
{
    const int half = ks / 2;
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (int64_t)r * L;
        float *yr = y + (int64_t)r * L;
        for (int j = 0; j < L; j++) {
            int lo = j - half < 0 ? 0 : j - half, hi = j + half >= L ? L - 1 : j + half;
            float m = xr[lo];
            for (int t = lo + 1; t <= hi; t++)
                if (xr[t] > m) m = xr[t];
            yr[j] = m;
        }
    }
    return KVB_OK;
}

int ref_gather_rows(const kvb_bf16 *X, int rows, int group, int L, int D, const int32_t *keep, int n_keep,
                    kvb_bf16 *Y)
{
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < n_keep; i++) {
            int32_t t = keep[(int64_t)r * n_keep + i];
            if (t < 0 || t >= L) return kvb_fail(KVB_EINVAL, "ref_gather_rows: keep[%d, %d]=%d out of range [0, %d]", r, i, t, L - 1);
            memcpy(Y + ((int64_t)r * n_keep + i) * D, X + ((int64_t)(r / group) * L + t) * D, sizeof(kvb_bf16) * (size_t)D);
        }
    return KVB_OK;
}
