/* select.c: see select.h. Per row: rank the entries by (key descending, index ascending), keep the
 * first k (Hoare's selection over one 64-bit rank an entry), sort those ascending. */
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

/* An entry's rank as one number, larger first: the order key above its index's complement, so that of
 * two equal keys the lower index ranks higher. Every entry's rank is distinct. */
static uint64_t rank_of(float score, int32_t i)
{
    return (uint64_t)topk_order_key(score) << 32 | (uint32_t)~(uint32_t)i;
}

static int32_t index_of(uint64_t rank) { return (int32_t)~(uint32_t)rank; }

/* Moves the k largest of the n distinct v into v[0, k), in no order (Hoare's selection: partition
 * around a middle element, keep the side that holds position k - 1). */
static void select_largest(uint64_t *v, int n, int k)
{
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        const uint64_t pivot = v[lo + (hi - lo) / 2];
        int i = lo, j = hi;
        while (i <= j) { /* the larger ones to the left */
            while (v[i] > pivot) i++;
            while (v[j] < pivot) j--;
            if (i <= j) {
                const uint64_t t = v[i];
                v[i++] = v[j], v[j--] = t;
            }
        }
        /* v[lo, j] >= pivot >= v[i, hi], and what lies between them is the pivot */
        if (k - 1 <= j) hi = j;
        else if (k - 1 >= i) lo = i;
        else return;
    }
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
        uint64_t *v = kvb_xalloc((size_t)(n ? n : 1), sizeof *v, "topk row scratch");
        if (!v) {
            kvb_par_keep(&err, KVB_ENOMEM);
            continue;
        }
        for (int i = 0; i < n; i++) v[i] = rank_of(scores[(int64_t)r * ld + i], i);
        if (k > 0) select_largest(v, n, k);
        int32_t *out = idx + (int64_t)r * ldo;
        for (int j = 0; j < k; j++) out[j] = index_of(v[j]);
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
