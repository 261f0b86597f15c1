/* omnikv.c: see omnikv.h. Plain C, line by line with the definition there: each dot product in
 * double over the bf16 values, one rounding to float at the end, then the suite's reference top-k. */
#include "reference/omnikv.h"

#include <math.h>
#include <stdlib.h>

#include "reference/select.h"

int omnikv_layout_check(const omnikv_layout *s, const char *who)
{
    KVB_CHECK_RANGE(who, "B", s->B, 1, OMNIKV_MAX_B);
    KVB_CHECK_RANGE(who, "Hkv", s->Hkv, 1, OMNIKV_MAX_HKV);
    if (s->Hq < 1 || s->Hq % s->Hkv)
        return kvb_fail(KVB_EINVAL, "%s: Hq=%d is not a multiple of Hkv=%d (GQA: Hq = G * Hkv)", who, s->Hq, s->Hkv);
    const int G = s->Hq / s->Hkv;
    if (G > OMNIKV_MAX_G)
        return kvb_fail(KVB_EINVAL, "%s: G = Hq/Hkv = %d/%d = %d out of range [1, %d] (query heads per KV head: the "
                        "kernel's MMA has 8 query-head columns)", who, s->Hq, s->Hkv, G, OMNIKV_MAX_G);
    if (s->D != 64 && s->D != 128) return kvb_fail(KVB_EINVAL, "%s: D=%d is not one of {64, 128}", who, s->D);
    KVB_CHECK_RANGE(who, "L", s->L, 1, OMNIKV_MAX_L);
    return KVB_OK;
}

int omnikv_select_check(const omnikv_layout *s, const int32_t *len, int k, const char *who)
{
    int min_len = s->L;
    for (int b = 0; b < s->B; b++) {
        if (len[b] < 1 || len[b] > s->L)
            return kvb_fail(KVB_EINVAL, "%s: len[%d]=%d out of range [1, L = %d]: a prompt holds at least one token and "
                            "no more than the allocated cache", who, b, len[b], s->L);
        if (len[b] < min_len) min_len = len[b];
    }
    if (k < 1 || k > min_len)
        return kvb_fail(KVB_EINVAL, "%s: k=%d out of range [1, min over b of len[b] = %d]", who, k, min_len);
    return KVB_OK;
}

int ref_omnikv_select(const kvb_bf16 *q, const kvb_bf16 *K, const int32_t *len, const omnikv_layout *s, int k,
                      float *scores, int32_t *idx, double *mag, const uint8_t *rows)
{
    int rc = omnikv_layout_check(s, "ref_omnikv_select");
    if (rc || (rc = omnikv_select_check(s, len, k, "ref_omnikv_select"))) return rc;
    const int G = s->Hq / s->Hkv, D = s->D;
    const double sqrt_d = sqrt((double)D);
    double *qd = kvb_xalloc((size_t)s->Hq * D, sizeof(double), "ref_omnikv_select query rows"); /* one sequence's q rows as doubles */
    if (!qd) return KVB_ENOMEM;
    for (int b = 0; b < s->B; b++) {
        if (rows && !rows[b]) continue;
        float *sc = scores + (int64_t)b * s->L;
        for (int i = 0; i < s->Hq * D; i++) qd[i] = kvb_bf16_to_double(q[(int64_t)b * s->Hq * D + i]);
#pragma omp parallel for schedule(static)
        for (int t = 0; t < s->L; t++) {
            double best = -INFINITY, best_mag = 0;
            for (int h = 0; t < len[b] && h < s->Hq; h++) { /* query head h reads KV head h / G */
                const double *qh = qd + (int64_t)h * D;
                const kvb_bf16 *kt = K + (((int64_t)b * s->Hkv + h / G) * s->L + t) * D;
                double dot = 0, abs_sum = 0;
                for (int c = 0; c < D; c++) {
                    const double p = qh[c] * kvb_bf16_to_double(kt[c]);
                    dot += p;
                    abs_sum += fabs(p);
                }
                if (dot / sqrt_d > best) best = dot / sqrt_d;
                if (abs_sum / sqrt_d > best_mag) best_mag = abs_sum / sqrt_d;
            }
            sc[t] = (float)best; /* -inf past len[b] */
            if (mag) mag[(int64_t)b * s->L + t] = best_mag;
        }
        if ((rc = ref_topk(sc, 1, s->L, s->L, k, idx + (int64_t)b * k, k))) break;
    }
    kvb_xfree(qd);
    return rc;
}

/* ---- layer roles (kernels/omnikv/NOTES.md: for 32 layers, filters {2, 8, 18}; layers 0-1 and the
 * layer after each filter dense; the rest sparse) ---- */

static const int FILTER_LAYERS[] = {2, 8, 18};
enum { N_FILTERS = (int)(sizeof FILTER_LAYERS / sizeof FILTER_LAYERS[0]) };

static int layers_check(int layers, const char *who)
{
    if (layers != OMNIKV_LAYERS)
        return kvb_fail(KVB_EINVAL, "%s: layers=%d out of range [%d, %d]: OmniKV's layer roles are defined for %d "
                        "layers", who, layers, OMNIKV_LAYERS, OMNIKV_LAYERS, OMNIKV_LAYERS);
    return KVB_OK;
}

int omnikv_layer_role(int layer, int layers)
{
    const char *who = "omnikv_layer_role";
    if (layers_check(layers, who)) return -1;
    if (layer < 0 || layer >= layers) {
        kvb_fail(KVB_EINVAL, "%s: layer=%d out of range [0, %d]", who, layer, layers - 1);
        return -1;
    }
    if (layer < 2) return OMNIKV_ROLE_DENSE;
    for (int i = 0; i < N_FILTERS; i++) {
        if (layer == FILTER_LAYERS[i]) return OMNIKV_ROLE_FILTER;
        if (layer == FILTER_LAYERS[i] + 1) return OMNIKV_ROLE_DENSE;
    }
    return OMNIKV_ROLE_SPARSE;
}

int omnikv_role_counts(int layers, int *dense, int *filter, int *sparse)
{
    int rc = layers_check(layers, "omnikv_role_counts");
    if (rc) return rc;
    int n[3] = {0, 0, 0};
    for (int l = 0; l < layers; l++) n[omnikv_layer_role(l, layers)]++;
    *dense = n[OMNIKV_ROLE_DENSE], *filter = n[OMNIKV_ROLE_FILTER], *sparse = n[OMNIKV_ROLE_SPARSE];
    return KVB_OK;
}
