/* decode.c: the plain C reference of dense decode attention (decode.md). Read it against the spec:
 * scores in double from the bf16 inputs, scaled by 1/sqrt(D), a softmax in double, the weighted sum
 * of V in double, one rounding to bf16 at the end. */
#include "decode.h"

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

int ref_decode_attn(const kvb_bf16 *q, const kvb_bf16 *K, const kvb_bf16 *V, const int32_t *len, kvb_bf16 *o,
                    const decode_layout *d, const uint8_t *slices)
{
    int rc = decode_layout_check(d, "ref_decode_attn");
    if (rc) return rc;
    if ((rc = decode_lengths_check(d, len, "ref_decode_attn"))) return rc;
    const int G = d->Hq / d->Hkv, D = d->D;
    const double scale = 1.0 / sqrt((double)D);
    const int n_slices = d->B * d->Hkv;
#pragma omp parallel for schedule(dynamic)
    for (int sl = 0; sl < n_slices; sl++) {
        if (slices && !slices[sl]) continue;
        int b = sl / d->Hkv, kvh = sl % d->Hkv;
        int64_t n = len[b];
        const kvb_bf16 *Kh = K + ((int64_t)b * d->Hkv + kvh) * d->L * D;
        const kvb_bf16 *Vh = V + ((int64_t)b * d->Hkv + kvh) * d->L * D;
        double *s = malloc(sizeof(double) * (size_t)n), qd[128], acc[128];
        for (int g = 0; g < G; g++) {
            int h = kvh * G + g;
            const kvb_bf16 *qh = q + ((int64_t)b * d->Hq + h) * D;
            for (int i = 0; i < D; i++) qd[i] = kvb_bf16_to_double(qh[i]);
            double m = -INFINITY;
            for (int64_t t = 0; t < n; t++) { /* s_t = q . K_t / sqrt(D) */
                double dot = 0;
                for (int i = 0; i < D; i++) dot += qd[i] * kvb_bf16_to_double(Kh[t * D + i]);
                s[t] = dot * scale;
                if (s[t] > m) m = s[t];
            }
            double l = 0; /* softmax: p_t = exp(s_t - m) / sum */
            for (int i = 0; i < D; i++) acc[i] = 0;
            for (int64_t t = 0; t < n; t++) {
                double p = exp(s[t] - m);
                l += p;
                for (int i = 0; i < D; i++) acc[i] += p * kvb_bf16_to_double(Vh[t * D + i]);
            }
            kvb_bf16 *oh = o + ((int64_t)b * d->Hq + h) * D;
            for (int i = 0; i < D; i++) oh[i] = kvb_double_to_bf16(acc[i] / l);
        }
        free(s);
    }
    return KVB_OK;
}
