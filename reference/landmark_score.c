/* landmark_score.c: see landmark_score.h. Per (b, kv head) slice, line by line with the contract
 * (kernels/landmark_score/NOTES.md): the G query heads' logits and softmax in double, m = their maximum
 * rounded once to fp32, then ref_topk on m and the map through landmark_idx. */
#include "reference/landmark_score.h"

#include <math.h>
#include <stdlib.h>

#include "reference/select.h"

int lms_shape_check(const lms_shape *s, const char *who)
{
    KVB_CHECK_RANGE(who, "B", s->B, 1, LMS_MAX_B);
    KVB_CHECK_RANGE(who, "Hkv", s->Hkv, 1, LMS_MAX_HKV);
    KVB_CHECK_RANGE(who, "Hq", s->Hq, 1, LMS_MAX_HQ);
    if (s->Hq % s->Hkv)
        return kvb_fail(KVB_EINVAL, "%s: Hq=%d is not a multiple of Hkv=%d (G = Hq/Hkv query heads per KV head)", who,
                        s->Hq, s->Hkv);
    KVB_CHECK_RANGE(who, "D", s->D, 1, 1 << 20);
    KVB_CHECK_RANGE(who, "Lm", s->Lm, 1, LMS_MAX_LM);
    KVB_CHECK_RANGE(who, "M", s->M, 1, s->Lm);
    return KVB_OK;
}

int lms_landmark_idx_check(const int32_t *landmark_idx, int64_t rows, int Lm, int64_t n_chunks, const char *who)
{
    for (int64_t r = 0; r < rows; r++) {
        const int32_t *x = landmark_idx + r * Lm;
        for (int l = 0; l < Lm; l++) {
            if (x[l] < 0 || x[l] >= n_chunks)
                return kvb_fail(KVB_EINVAL, "%s: landmark_idx[%lld, %d]=%d out of range [0, n_chunks = %lld)", who,
                                (long long)r, l, x[l], (long long)n_chunks);
            if (l > 0 && x[l] <= x[l - 1])
                return kvb_fail(KVB_EINVAL, "%s: landmark_idx row %lld is not strictly ascending: [%d]=%d after [%d]=%d",
                                who, (long long)r, l, x[l], l - 1, x[l - 1]);
        }
    }
    return KVB_OK;
}

/* m[l] for one (b, kv head) slice: q holds its G query rows, lm its Lm landmarks. x, best: scratch [Lm]. */
static void slice_scores(const kvb_bf16 *q, const kvb_bf16 *lm, int G, int D, int Lm, double *x, double *best, float *m)
{
    const double scale = 1.0 / sqrt((double)D);
    for (int l = 0; l < Lm; l++) best[l] = 0; /* every s >= 0 */
    for (int g = 0; g < G; g++) {
        const kvb_bf16 *qh = q + (int64_t)g * D;
        /* x[l] = q[b,h] . landmarks[b,hk,l] / sqrt(D) */
        for (int l = 0; l < Lm; l++) {
            double dot = 0;
            for (int d = 0; d < D; d++) dot += kvb_bf16_to_double(qh[d]) * kvb_bf16_to_double(lm[(int64_t)l * D + d]);
            x[l] = dot * scale;
        }
        /* s = softmax over l of x */
        double mx = x[0], sum = 0;
        for (int l = 1; l < Lm; l++) mx = x[l] > mx ? x[l] : mx;
        for (int l = 0; l < Lm; l++) sum += exp(x[l] - mx);
        /* m = max over the group's heads of s */
        for (int l = 0; l < Lm; l++) {
            double s = exp(x[l] - mx) / sum;
            if (s > best[l]) best[l] = s;
        }
    }
    for (int l = 0; l < Lm; l++) m[l] = (float)best[l];
}

int ref_landmark_score(const kvb_bf16 *q, const kvb_bf16 *landmarks, const int32_t *landmark_idx, const lms_shape *s,
                       int64_t n_chunks, const uint8_t *slices, int32_t *chunks, float *m)
{
    int rc = lms_shape_check(s, "ref_landmark_score");
    if (rc) return rc;
    if (n_chunks < s->Lm)
        return kvb_fail(KVB_EINVAL, "ref_landmark_score: n_chunks=%lld out of range [Lm = %d, ...): Lm distinct chunk ids",
                        (long long)n_chunks, s->Lm);
    if (!q || !landmarks || !landmark_idx || !chunks || !m)
        return kvb_fail(KVB_EINVAL, "ref_landmark_score: NULL pointer among q, landmarks, landmark_idx, chunks, m");
    const int64_t rows = (int64_t)s->B * s->Hkv;
    if ((rc = lms_landmark_idx_check(landmark_idx, rows, s->Lm, n_chunks, "ref_landmark_score"))) return rc;
    const int G = s->Hq / s->Hkv, D = s->D, Lm = s->Lm, M = s->M;
    kvb_par_error err = {0};
#pragma omp parallel for schedule(dynamic)
    for (int64_t r = 0; r < rows; r++) {
        if (slices && !slices[r]) continue;
        double *x = kvb_xalloc(2 * (size_t)Lm, sizeof(double), "ref_landmark_score slice scratch");
        int32_t *sel = x ? kvb_xalloc((size_t)M, sizeof(int32_t), "ref_landmark_score slice selection") : NULL;
        if (!sel) {
            kvb_par_keep(&err, KVB_ENOMEM);
            kvb_xfree(x);
            continue;
        }
        /* row r = (b, hk): its query heads are h = hk*G .. hk*G + G-1 of batch b, q row b*Hq + h = r*G + g */
        float *mr = m + r * Lm;
        slice_scores(q + r * G * D, landmarks + r * Lm * D, G, D, Lm, x, x + Lm, mr);
        /* chunks = landmark_idx[topk(m, M)]: ascending landmark positions map to ascending chunk ids */
        const int st = ref_topk(mr, 1, Lm, Lm, M, sel, M);
        if (st) kvb_par_keep(&err, st);
        else
            for (int i = 0; i < M; i++) chunks[r * M + i] = landmark_idx[r * Lm + sel[i]];
        kvb_xfree(x), kvb_xfree(sel);
    }
    return kvb_par_return(&err);
}
