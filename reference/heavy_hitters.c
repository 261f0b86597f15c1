/* heavy_hitters.c: plain C references for the token selections at the end of prefill (MiniKV heavy
 * hitters with the pyramid schedule, SnapKV++'s selection from pooled scores; the pooling and the
 * gather of the kept rows are reference/select.c's). Written to be read against the contract in
 * kernels/heavy_hitters/NOTES.md. */
#include "reference/heavy_hitters.h"

#include <stdlib.h>

static int ratio_ok(double r) { return r >= 0.0 && r <= 1.0; }

int hh_budget(int L, double heavy, double recent, int *n_hh, int *n_rw, int *n_keep, const char *who)
{
    if (L < 1) return kvb_fail(KVB_EINVAL, "%s: L=%d out of range [1, inf)", who, L);
    if (!ratio_ok(heavy)) return kvb_fail(KVB_EINVAL, "%s: heavy=%g out of range [0, 1]", who, heavy);
    if (!ratio_ok(recent)) return kvb_fail(KVB_EINVAL, "%s: recent=%g out of range [0, 1]", who, recent);
    *n_hh = (int)floor((double)L * heavy);
    *n_rw = (int)floor((double)L * recent);
    *n_keep = (int64_t)*n_hh + *n_rw >= L ? L : *n_hh + *n_rw;
    return KVB_OK;
}

int hh_pyramid_ratio(double heavy, int layer, int layers, double *ratio, const char *who)
{
    if (!ratio_ok(heavy)) return kvb_fail(KVB_EINVAL, "%s: heavy=%g out of range [0, 1]", who, heavy);
    if (layers < 1) return kvb_fail(KVB_EINVAL, "%s: layers=%d out of range [1, inf)", who, layers);
    if (layer < 0 || layer >= layers)
        return kvb_fail(KVB_EINVAL, "%s: layer=%d out of range [0, layers-1 = %d]", who, layer, layers - 1);
    if (layers == 1) {
        *ratio = heavy;
        return KVB_OK;
    }
    double r_last = heavy / HH_PYRAMID_DEPTH, r_first = 2.0 * heavy - r_last;
    double r = r_first + (r_last - r_first) * layer / (layers - 1);
    if (!ratio_ok(r))
        return kvb_fail(KVB_EINVAL,
                        "%s: pyramid ratio of layer %d = %g out of range [0, 1] (heavy=%g: r_first = 2*heavy - heavy/%d "
                        "must be <= 1, so heavy <= %.4f)",
                        who, layer, r, heavy, HH_PYRAMID_DEPTH, (double)HH_PYRAMID_DEPTH / (2 * HH_PYRAMID_DEPTH - 1));
    *ratio = r;
    return KVB_OK;
}

int snapkv_budget(int L, int budget, int *W, int *n_keep, const char *who)
{
    if (L < 1) return kvb_fail(KVB_EINVAL, "%s: L=%d out of range [1, inf)", who, L);
    int w = L < SNAPKV_WINDOW ? L : SNAPKV_WINDOW;
    if (budget < w)
        return kvb_fail(KVB_EINVAL, "%s: budget=%d out of range [W = min(32, L) = %d, inf): the window is always kept",
                        who, budget, w);
    *W = w;
    *n_keep = budget < L ? budget : L;
    return KVB_OK;
}

int snapkv_pool_size(int L, int ks, int *out, const char *who)
{
    if (ks == 0) {
        *out = L < SNAPKV_KS_THRESHOLD ? 63 : 511;
        return KVB_OK;
    }
    if (ks < 1 || ks > SNAPKV_MAX_KS || ks % 2 == 0)
        return kvb_fail(KVB_EINVAL, "%s: ks=%d is not an odd pooling kernel in [1, %d] (0: 63 below 48K tokens, 511 at or above)",
                        who, ks, SNAPKV_MAX_KS);
    *out = ks;
    return KVB_OK;
}

int ref_heavy_hitters(const float *scores, int rows, int L, int n_hh, int n_rw, int32_t *keep)
{
    if ((int64_t)n_hh + n_rw >= L) {
        for (int r = 0; r < rows; r++)
            for (int j = 0; j < L; j++) keep[(int64_t)r * L + j] = j;
        return KVB_OK;
    }
    const int n_keep = n_hh + n_rw, first_recent = L - n_rw;
    int rc = ref_topk(scores, rows, L, first_recent, n_hh, keep, n_keep);
    if (rc) return rc;
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < n_rw; j++) keep[(int64_t)r * n_keep + n_hh + j] = first_recent + j;
    return KVB_OK;
}

int ref_snapkv_keep(const float *pooled, int rows, int L, int W, int n_keep, int32_t *keep)
{
    if (n_keep >= L) {
        for (int r = 0; r < rows; r++)
            for (int j = 0; j < L; j++) keep[(int64_t)r * L + j] = j;
        return KVB_OK;
    }
    const int k = n_keep - W, first_window = L - W;
    int rc = ref_topk(pooled, rows, L, first_window, k, keep, n_keep);
    if (rc) return rc;
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < W; j++) keep[(int64_t)r * n_keep + k + j] = first_window + j;
    return KVB_OK;
}
