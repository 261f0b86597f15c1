/* inputs.c: case inputs and output properties shared by ops files and tests (ops.h): ShadowKV step
 * ids, the index_scan properties, and the deterministic slice sample of a reference too large to
 * compute whole. No ops file is a library for another: what two of them need lives here. */
#include <math.h>
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "reference/kvb.h"
#include "harness/ops/ops.h"
#include "harness/core/gpu.h"
#include "harness/core/tensor.h"

/* ---- ShadowKV step ids (ops.h) ---- */

void kvb_draw_distinct(kvb_rng *rng, int32_t *perm, int64_t range, int n, int32_t *out)
{
    for (int64_t i = 0; i < range; i++) perm[i] = (int32_t)i;
    for (int i = 0; i < n; i++) {
        int64_t j = i + (int64_t)kvb_rng_below(rng, (uint64_t)(range - i));
        int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
        out[i] = perm[i];
    }
}

int kvb_make_step_ids(uint64_t seed, int rows, int M, int64_t n_ids, int n_old, int n_hit, int32_t *old_ids,
                      int32_t *new_ids)
{
    int32_t *perm = kvb_xalloc((size_t)n_ids, sizeof(int32_t), "step ids permutation");
    int32_t *drawn = perm ? kvb_xalloc((size_t)(n_old + M), sizeof(int32_t), "step ids drawn") : NULL;
    if (!drawn) {
        kvb_xfree(perm);
        return KVB_ENOMEM;
    }
    for (int r = 0; r < rows; r++) {
        kvb_rng rng = kvb_rng_make(seed, kvb_stream_of("step_ids") + (uint64_t)r);
        int32_t *old = old_ids + (int64_t)r * M, *now = new_ids + (int64_t)r * M;
        kvb_draw_distinct(&rng, perm, n_ids, n_old + (M - n_hit), drawn);
        for (int i = 0; i < M; i++) old[i] = i < n_old ? drawn[i] : -1;
        /* the hits: a random n_hit of the old ids (drawn[0:n_old] is already in random order) */
        for (int i = 0; i < n_hit; i++) now[i] = drawn[i];
        for (int i = n_hit; i < M; i++) now[i] = drawn[n_old + (i - n_hit)];
        kvb_shuffle_i32(&rng, old, M); /* unsorted tags, empties anywhere */
        kvb_shuffle_i32(&rng, now, M);
    }
    kvb_xfree(perm);
    kvb_xfree(drawn);
    return KVB_OK;
}

int kvb_ref_threads(void)
{
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

/* ---- slice sampling (ops.h) ---- */

uint8_t *kvb_sample_slices(int64_t n, double work_per_slice, double budget, int64_t *chosen)
{
    if (n <= 2 || n * work_per_slice <= budget) {
        *chosen = n;
        return NULL;
    }
    int64_t k = (int64_t)(budget / (work_per_slice > 0 ? work_per_slice : 1));
    if (k < 2) k = 2;
    if (k > n) k = n;
    uint8_t *mask = kvb_xalloc((size_t)n, 1, "the reference's slice sample");
    if (!mask) kvb_guard_fail(); /* the case fails by name (inside its guard) */
    for (int64_t i = 0; i < k; i++) mask[i * (n - 1) / (k - 1)] = 1; /* 0 and n-1 included */
    int64_t count = 0;
    for (int64_t i = 0; i < n; i++) count += mask[i];
    *chosen = count;
    return mask;
}

/* ---- index_scan properties (ops.h) ---- */

static int row_has(const int32_t *ids, int M, int32_t k)
{
    for (int i = 0; i < M; i++)
        if (ids[i] == k) return 1;
    return 0;
}

int kvb_index_scan_properties(const int32_t *old_ids, const int32_t *new_ids, const int32_t *cached_after,
                              const int32_t *offsets, const int32_t *cnts, int rows, int M)
{
    for (int r = 0; r < rows; r++) {
        const int32_t *old = old_ids + (int64_t)r * M, *now = new_ids + (int64_t)r * M;
        const int32_t *off = offsets + (int64_t)r * M, *after = cached_after + (int64_t)r * M;
        int cnt = cnts[r], expect_hits = 0;
        for (int j = 0; j < M; j++) expect_hits += old[j] >= 0 && row_has(now, M, old[j]);
        if (cnt != expect_hits)
            return kvb_fail(KVB_EINVAL, "row %d: cnt=%d but %d old ids are among the new ones", r, cnt, expect_hits);
        for (int i = 0; i < cnt; i++) {
            int s = off[i];
            if (s < 0 || s >= M) return kvb_fail(KVB_EINVAL, "row %d: hit %d has old slot %d outside [0, %d)", r, i, s, M);
            if (i > 0 && s <= off[i - 1])
                return kvb_fail(KVB_EINVAL, "row %d: hits not sorted by old slot (offsets[%d]=%d after %d)", r, i, s, off[i - 1]);
            if (s < i) return kvb_fail(KVB_EINVAL, "row %d: offsets[%d]=%d < %d for a hit", r, i, s, i);
            if (old[s] < 0 || !row_has(now, M, old[s]))
                return kvb_fail(KVB_EINVAL, "row %d: hit %d points at old slot %d (id %d), not a new id", r, i, s, old[s]);
            if (after[i] != old[s]) return kvb_fail(KVB_EINVAL, "row %d: slot %d holds %d, expected %d", r, i, after[i], old[s]);
        }
        for (int i = cnt; i < M; i++) {
            int32_t k = off[i];
            if (!row_has(now, M, k) || row_has(old, M, k))
                return kvb_fail(KVB_EINVAL, "row %d: miss %d is id %d, which is not a new id missing from old", r, i, k);
            if (i > cnt && k <= off[i - 1])
                return kvb_fail(KVB_EINVAL, "row %d: misses not ascending (offsets[%d]=%d after %d)", r, i, k, off[i - 1]);
            if (after[i] != k) return kvb_fail(KVB_EINVAL, "row %d: slot %d holds %d, expected %d", r, i, after[i], k);
        }
    }
    return KVB_OK;
}

/* ---- the tie tolerance of a selection (ops.h) ---- */

double kvb_selection_tol(const kvb_tol *tol, const float *scores, int64_t rows, int n, const int32_t *idx, int k)
{
    double kth_max = 0;
    for (int64_t row = 0; row < rows; row++) {
        double kth = INFINITY;
        for (int i = 0; i < k; i++) kth = fmin(kth, scores[row * n + idx[row * k + i]]);
        if (k > 0 && fabs(kth) > kth_max) kth_max = fabs(kth);
    }
    return tol->atol + tol->rtol * kth_max;
}
