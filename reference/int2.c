/* int2.c: plain C references of the INT2 KV cache (kernels/int2/NOTES.md; the formulas in int2.h).
 * The quantizer computes in fp32 exactly where the formulas say so (min, max, (mx - mn) / 3,
 * (x - zero) / scale, rint) and rounds the metadata to fp16; everything downstream (dequant,
 * products, softmax) is in double from the stored codes and fp16 metadata, rounded once at the end. */
#include "reference/int2.h"

#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#endif

int int2_layout_check(const int2_layout *l, const char *who)
{
    KVB_CHECK_RANGE(who, "B", l->B, 1, 1024);
    KVB_CHECK_RANGE(who, "Hkv", l->Hkv, 1, 256);
    if (l->D != 64 && l->D != 128) return kvb_fail(KVB_EINVAL, "%s: D=%d is not one of {64, 128}", who, l->D);
    if (l->gs != 16 && l->gs != 32 && l->gs != 64 && l->gs != 128)
        return kvb_fail(KVB_EINVAL, "%s: gs=%d is not one of {16, 32, 64, 128}", who, l->gs);
    if (l->D % l->gs != 0)
        return kvb_fail(KVB_EINVAL, "%s: D=%d is not a multiple of gs=%d (value groups run along the channels)", who,
                        l->D, l->gs);
    KVB_CHECK_RANGE(who, "Tcap", l->Tcap, 0, INT2_MAX_TCAP);
    if (l->Tcap % l->gs != 0)
        return kvb_fail(KVB_EINVAL, "%s: Tcap=%lld is not a multiple of gs=%d", who, (long long)l->Tcap, l->gs);
    KVB_CHECK_RANGE(who, "T", l->T, 0, l->Tcap);
    if (l->T % l->gs != 0)
        return kvb_fail(KVB_EINVAL, "%s: T=%lld is not a multiple of gs=%d (only whole groups are quantized; the rest "
                        "stays in the residual)", who, (long long)l->T, l->gs);
    KVB_CHECK_RANGE(who, "Rcap", l->Rcap, 0, 1 << 20);
    int rmax = INT2_FLUSH + l->gs - 1;
    if (l->R < 0 || l->R > rmax || l->R > l->Rcap)
        return kvb_fail(KVB_EINVAL, "%s: R=%d out of range [0, min(Rcap = %d, 128 + gs - 1 = %d)]", who, l->R, l->Rcap,
                        rmax);
    return KVB_OK;
}

int int2_attn_check(const int2_layout *l, const char *who)
{
    int rc = int2_layout_check(l, who);
    if (rc) return rc;
    KVB_CHECK_RANGE(who, "Hq", l->Hq, l->Hkv, (int64_t)l->Hkv * INT2_MAX_G);
    if (l->Hq % l->Hkv != 0)
        return kvb_fail(KVB_EINVAL, "%s: Hq=%d is not a multiple of Hkv=%d (GQA: G = Hq/Hkv query heads per KV head)",
                        who, l->Hq, l->Hkv);
    if (l->T + l->R < 1)
        return kvb_fail(KVB_EINVAL, "%s: T + R = 0: attention needs at least one token", who);
    return KVB_OK;
}

/* ---- quantize ---- */

void int2_quantize_group(const float *x, int n, uint8_t *codes, kvb_fp16 *scale, kvb_fp16 *zero)
{
    float mn = x[0], mx = x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < mn) mn = x[i];
        if (x[i] > mx) mx = x[i];
    }
    float range = mx - mn;   /* fp32 */
    float third = range / 3.0f; /* fp32 */
    *scale = kvb_float_to_fp16(third);
    *zero = kvb_float_to_fp16(mn);
    float s = kvb_fp16_to_float(*scale), z = kvb_fp16_to_float(*zero);
    for (int i = 0; i < n; i++) {
        if (s == 0.0f) {
            codes[i] = 0;
            continue;
        }
        float diff = x[i] - z;     /* fp32, from the stored zero */
        float ratio = diff / s;    /* fp32, by the stored scale */
        float r = rintf(ratio);    /* round half to even (default rounding mode) */
        codes[i] = (uint8_t)(r < 0.0f ? 0 : r > 3.0f ? 3 : r);
    }
}

/* Quantizer inputs are finite and within +-32768 (int2.h): tokens [0, n) of x [B, Hkv, src_len, D].
 * The first offending element in (b, h, t, d) order is named, whatever the thread count. */
static int check_inputs(const kvb_bf16 *x, int64_t src_len, int64_t n, const int2_layout *l, const char *who,
                        const char *what)
{
    const int64_t heads = (int64_t)l->B * l->Hkv, per = n * l->D, piece = 1 << 16;
    const int64_t pieces = (per + piece - 1) / piece;
    int64_t first = heads * per; /* (head, element) as head * per + element: the least offending one */
#pragma omp parallel for collapse(2) schedule(static) reduction(min : first)
    for (int64_t h = 0; h < heads; h++)
        for (int64_t k = 0; k < pieces; k++) {
            const kvb_bf16 *row = x + h * src_len * l->D;
            const int64_t end = (k + 1) * piece < per ? (k + 1) * piece : per;
            for (int64_t i = k * piece; i < end; i++) {
                float v = kvb_bf16_to_float(row[i]);
                if (!isfinite(v) || fabsf(v) > (float)INT2_MAX_ABS) {
                    if (h * per + i < first) first = h * per + i;
                    break;
                }
            }
        }
    if (first == heads * per) return KVB_OK;
    const int64_t h = first / per, i = first % per;
    return kvb_fail(KVB_EINVAL, "%s: %s[%lld,%lld,%lld,%lld]=%g out of range [-32768, 32768]: quantizer inputs must "
                    "be finite and within 2^15 (fp16 metadata and operands)", who, what, (long long)(h / l->Hkv),
                    (long long)(h % l->Hkv), (long long)(i / l->D), (long long)(i % l->D),
                    kvb_bf16_to_float(x[h * src_len * l->D + i]));
}

int int2_span_check(const int2_layout *l, int64_t src_len, int64_t n, int64_t t0, const char *who)
{
    int rc = int2_layout_check(l, who);
    if (rc) return rc;
    if (n < 0 || n % l->gs != 0)
        return kvb_fail(KVB_EINVAL, "%s: n=%lld tokens to quantize is not a non-negative multiple of gs=%d", who,
                        (long long)n, l->gs);
    if (t0 < 0 || t0 % l->gs != 0)
        return kvb_fail(KVB_EINVAL, "%s: t0=%lld is not a non-negative multiple of gs=%d", who, (long long)t0, l->gs);
    if (t0 + n > l->Tcap)
        return kvb_fail(KVB_EINVAL, "%s: t0 + n = %lld out of range [0, Tcap = %lld]: beyond the allocated cache", who,
                        (long long)(t0 + n), (long long)l->Tcap);
    if (n > src_len)
        return kvb_fail(KVB_EINVAL, "%s: n=%lld out of range [0, src_len = %lld]", who, (long long)n, (long long)src_len);
    return KVB_OK;
}

int ref_int2_quantize_keys(const kvb_bf16 *K, int64_t src_len, int64_t n, int64_t t0, uint32_t *Kq, kvb_fp16 *Ks,
                           kvb_fp16 *Kz, const int2_layout *l)
{
    const char *who = "int2_quantize_keys";
    int rc = int2_span_check(l, src_len, n, t0, who);
    if (rc) return rc;
    const int D = l->D, gs = l->gs;
    if ((rc = check_inputs(K, src_len, n, l, who, "K"))) return rc;
    const int64_t words = l->Tcap / 16, groups = l->Tcap / gs, n_groups = n / gs;
    /* group by group, then channel by channel: a group's gs tokens of D channels are read while they are in
     * the cache (channel by channel over the whole length rereads every line D times); the threads share
     * the groups of every head (a one-head call too), each group written by one */
#pragma omp parallel for collapse(3) schedule(static)
    for (int b = 0; b < l->B; b++)
        for (int h = 0; h < l->Hkv; h++)
            for (int64_t g = 0; g < n_groups; g++) {
                const kvb_bf16 *src = K + ((int64_t)b * l->Hkv + h) * src_len * D;
                float x[128];
                uint8_t codes[128];
                int64_t tg = t0 + g * gs; /* first cache token of the group */
                for (int d = 0; d < D; d++) {
                    int64_t row = ((int64_t)b * l->Hkv + h) * D + d; /* channel d of (b, h) */
                    for (int i = 0; i < gs; i++) x[i] = kvb_bf16_to_float(src[(g * gs + i) * D + d]);
                    int2_quantize_group(x, gs, codes, &Ks[row * groups + tg / gs], &Kz[row * groups + tg / gs]);
                    for (int w = 0; w < gs / 16; w++) {
                        uint32_t word = 0;
                        for (int i = 0; i < 16; i++) word |= (uint32_t)codes[w * 16 + i] << (2 * i);
                        Kq[row * words + tg / 16 + w] = word;
                    }
                }
            }
    return KVB_OK;
}

int ref_int2_quantize_values(const kvb_bf16 *V, int64_t src_len, int64_t n, int64_t t0, uint32_t *Vq, kvb_fp16 *Vs,
                             kvb_fp16 *Vz, const int2_layout *l)
{
    const char *who = "int2_quantize_values";
    int rc = int2_span_check(l, src_len, n, t0, who);
    if (rc) return rc;
    const int D = l->D, gs = l->gs;
    if ((rc = check_inputs(V, src_len, n, l, who, "V"))) return rc;
#pragma omp parallel for collapse(3) schedule(static) /* the threads share every head's tokens */
    for (int b = 0; b < l->B; b++)
        for (int h = 0; h < l->Hkv; h++)
            for (int64_t t = 0; t < n; t++) {
                float x[128];
                uint8_t codes[128];
                const kvb_bf16 *src = V + (((int64_t)b * l->Hkv + h) * src_len + t) * D;
                int64_t row = ((int64_t)b * l->Hkv + h) * l->Tcap + t0 + t; /* cache token t0 + t of (b, h) */
                for (int g = 0; g < D / gs; g++) {
                    for (int i = 0; i < gs; i++) x[i] = kvb_bf16_to_float(src[g * gs + i]);
                    int2_quantize_group(x, gs, codes, &Vs[row * (D / gs) + g], &Vz[row * (D / gs) + g]);
                    for (int w = 0; w < gs / 16; w++) {
                        uint32_t word = 0;
                        for (int i = 0; i < 16; i++) word |= (uint32_t)codes[w * 16 + i] << (2 * i);
                        Vq[row * (D / 16) + (g * gs) / 16 + w] = word;
                    }
                }
            }
    return KVB_OK;
}

/* ---- append and flush ---- */

int int2_append_check(const int2_layout *l, const char *who)
{
    int rc = int2_layout_check(l, who);
    if (rc) return rc;
    if (l->R + 1 > l->Rcap)
        return kvb_fail(KVB_EINVAL, "%s: R + 1 = %d out of range [1, Rcap = %d]: the residual buffer is full", who,
                        l->R + 1, l->Rcap);
    if (l->R + 1 >= INT2_FLUSH && l->T + INT2_FLUSH > l->Tcap)
        return kvb_fail(KVB_EINVAL, "%s: T + 128 = %lld out of range [0, Tcap = %lld]: no room to flush the residual",
                        who, (long long)(l->T + INT2_FLUSH), (long long)l->Tcap);
    return KVB_OK;
}

int ref_int2_append(int2_cache *c, const kvb_bf16 *knew, const kvb_bf16 *vnew, const int2_layout *l,
                    int64_t *T_after, int *R_after)
{
    int rc = int2_append_check(l, "int2_append");
    if (rc) return rc;
    const int D = l->D;
    const int flush = l->R + 1 >= INT2_FLUSH;
    /* the new token goes to residual slot R */
    for (int64_t bh = 0; bh < (int64_t)l->B * l->Hkv; bh++)
        for (int d = 0; d < D; d++) {
            c->Kr[(bh * l->Rcap + l->R) * D + d] = knew[bh * D + d];
            c->Vr[(bh * l->Rcap + l->R) * D + d] = vnew[bh * D + d];
        }
    int R = l->R + 1;
    int64_t T = l->T;
    if (flush) { /* quantize residual tokens [0, 128) into cache tokens [T, T + 128), keep the rest */
        if ((rc = ref_int2_quantize_keys(c->Kr, l->Rcap, INT2_FLUSH, T, c->Kq, c->Ks, c->Kz, l))) return rc;
        if ((rc = ref_int2_quantize_values(c->Vr, l->Rcap, INT2_FLUSH, T, c->Vq, c->Vs, c->Vz, l))) return rc;
        for (int64_t bh = 0; bh < (int64_t)l->B * l->Hkv; bh++)
            for (int t = INT2_FLUSH; t < R; t++)
                for (int d = 0; d < D; d++) {
                    c->Kr[(bh * l->Rcap + t - INT2_FLUSH) * D + d] = c->Kr[(bh * l->Rcap + t) * D + d];
                    c->Vr[(bh * l->Rcap + t - INT2_FLUSH) * D + d] = c->Vr[(bh * l->Rcap + t) * D + d];
                }
        T += INT2_FLUSH;
        R -= INT2_FLUSH;
    }
    *T_after = T;
    *R_after = R;
    return KVB_OK;
}

/* ---- dequantized reads ---- */

/* dequant(K)[b,h,d,t] and dequant(V)[b,h,t,d] of the cache, in double; *parts (may be NULL) receives
 * |code * scale| + |zero|, the size of the two terms a kernel rounds before they cancel */
static double dequant_parts(unsigned code, kvb_fp16 scale, kvb_fp16 zero, double *parts)
{
    if (parts) *parts = fabs((double)code * (double)kvb_fp16_to_float(scale)) + fabs((double)kvb_fp16_to_float(zero));
    return int2_dequant(code, scale, zero);
}

static double key_at(const int2_cache *c, const int2_layout *l, int64_t bh, int d, int64_t t, double *parts)
{
    int64_t row = bh * l->D + d;
    uint32_t word = c->Kq[row * (l->Tcap / 16) + t / 16];
    unsigned code = (word >> (2 * (t % 16))) & 3u;
    int64_t g = row * (l->Tcap / l->gs) + t / l->gs;
    return dequant_parts(code, c->Ks[g], c->Kz[g], parts);
}

static double value_at(const int2_cache *c, const int2_layout *l, int64_t bh, int64_t t, int d, double *parts)
{
    int64_t row = bh * l->Tcap + t;
    uint32_t word = c->Vq[row * (l->D / 16) + d / 16];
    unsigned code = (word >> (2 * (d % 16))) & 3u;
    int64_t g = row * (l->D / l->gs) + d / l->gs;
    return dequant_parts(code, c->Vs[g], c->Vz[g], parts);
}

int ref_int2_qk(const kvb_bf16 *q, const int2_cache *c, float *scores, double *mag, const int2_layout *l,
                const uint8_t *slices)
{
    int rc = int2_attn_check(l, "ref_int2_qk");
    if (rc) return rc;
    const int G = l->Hq / l->Hkv, D = l->D;
    const int n_slices = l->B * l->Hkv;
#pragma omp parallel for schedule(dynamic)
    for (int sl = 0; sl < n_slices; sl++) {
        if (slices && !slices[sl]) continue;
        int b = sl / l->Hkv;
        for (int g = 0; g < G; g++) {
            int64_t hq = (int64_t)b * l->Hq + (sl % l->Hkv) * G + g;
            for (int64_t t = 0; t < l->T; t++) {
                double s = 0, a = 0;
                for (int d = 0; d < D; d++) {
                    double parts;
                    double qd = kvb_bf16_to_double(q[hq * D + d]);
                    s += qd * key_at(c, l, sl, d, t, &parts);
                    a += fabs(qd) * parts;
                }
                scores[hq * l->T + t] = (float)s;
                mag[hq * l->T + t] = a;
            }
        }
    }
    return KVB_OK;
}

int ref_int2_av(const float *p, const int2_cache *c, float *out, double *mag, const int2_layout *l,
                const uint8_t *slices)
{
    int rc = int2_attn_check(l, "ref_int2_av");
    if (rc) return rc;
    const int G = l->Hq / l->Hkv, D = l->D;
    const int n_slices = l->B * l->Hkv;
#pragma omp parallel for schedule(dynamic)
    for (int sl = 0; sl < n_slices; sl++) {
        if (slices && !slices[sl]) continue;
        int b = sl / l->Hkv;
        for (int g = 0; g < G; g++) {
            int64_t hq = (int64_t)b * l->Hq + (sl % l->Hkv) * G + g;
            for (int d = 0; d < D; d++) {
                double s = 0, a = 0;
                for (int64_t t = 0; t < l->T; t++) {
                    double parts;
                    double pt = (double)p[hq * l->T + t];
                    s += pt * value_at(c, l, sl, t, d, &parts);
                    a += fabs(pt) * parts;
                }
                out[hq * D + d] = (float)s;
                mag[hq * D + d] = a;
            }
        }
    }
    return KVB_OK;
}

int ref_int2_decode_attn(const kvb_bf16 *q, const int2_cache *c, kvb_bf16 *o, const int2_layout *l,
                         const uint8_t *slices)
{
    int rc = int2_attn_check(l, "ref_int2_decode_attn");
    if (rc) return rc;
    const int G = l->Hq / l->Hkv, D = l->D;
    const int64_t n = l->T + l->R;
    const double scale = 1.0 / sqrt((double)D);
    const int n_slices = l->B * l->Hkv;
    /* The threads take whole slices when there are enough of them, else they share each slice's tokens
     * and channels (a sampled reference may keep two long slices only). Every sum runs in the order of
     * t either way, so the result does not depend on the threads. */
    int chosen = 0, threads = 1;
    for (int sl = 0; sl < n_slices; sl++) chosen += !slices || slices[sl];
#ifdef _OPENMP
    threads = omp_get_max_threads();
#endif
    const int by_slice = chosen >= threads;
    kvb_par_error err = {0};
#pragma omp parallel for schedule(dynamic) if (by_slice)
    for (int sl = 0; sl < n_slices; sl++) {
        if (slices && !slices[sl]) continue;
        /* p [G, n]: the slice's scores, then its unnormalized probabilities */
        double *p = kvb_xalloc((size_t)n * G, sizeof(double), "ref_int2_decode_attn scores");
        if (!p) {
            kvb_par_keep(&err, KVB_ENOMEM);
            continue;
        }
        const int64_t hq0 = (int64_t)(sl / l->Hkv) * l->Hq + (sl % l->Hkv) * G; /* the G heads of kv head sl */
        const kvb_bf16 *Kr = c->Kr + (int64_t)sl * l->Rcap * D, *Vr = c->Vr + (int64_t)sl * l->Rcap * D;
        double qd[INT2_MAX_G][128], m[INT2_MAX_G], sum[INT2_MAX_G];
        for (int g = 0; g < G; g++)
            for (int d = 0; d < D; d++) qd[g][d] = kvb_bf16_to_double(q[(hq0 + g) * D + d]);
        /* s = [q . dequant(K)[:, t] ; q . Kr[t]] / sqrt(D): the G heads share each dequantized key */
#pragma omp parallel for schedule(static) if (!by_slice)
        for (int64_t t = 0; t < n; t++) {
            double dot[INT2_MAX_G] = {0};
            for (int d = 0; d < D; d++) {
                double k = t < l->T ? key_at(c, l, sl, d, t, NULL) : kvb_bf16_to_double(Kr[(t - l->T) * D + d]);
                for (int g = 0; g < G; g++) dot[g] += qd[g][d] * k;
            }
            for (int g = 0; g < G; g++) p[(int64_t)g * n + t] = dot[g] * scale;
        }
        for (int g = 0; g < G; g++) { /* p = exp(s - max s), summed */
            double *pg = p + (int64_t)g * n;
            m[g] = -INFINITY, sum[g] = 0;
            for (int64_t t = 0; t < n; t++)
                if (pg[t] > m[g]) m[g] = pg[t];
            for (int64_t t = 0; t < n; t++) sum[g] += pg[t] = exp(pg[t] - m[g]);
        }
        /* o = sum_t p_t V_t / sum_t p_t, channel by channel: the G heads share each dequantized value */
#pragma omp parallel for schedule(static) if (!by_slice)
        for (int d = 0; d < D; d++) {
            double acc[INT2_MAX_G] = {0};
            for (int64_t t = 0; t < n; t++) {
                double v = t < l->T ? value_at(c, l, sl, t, d, NULL) : kvb_bf16_to_double(Vr[(t - l->T) * D + d]);
                for (int g = 0; g < G; g++) acc[g] += p[(int64_t)g * n + t] * v;
            }
            for (int g = 0; g < G; g++) o[(hq0 + g) * D + d] = kvb_double_to_bf16(acc[g] / sum[g]);
        }
        kvb_xfree(p);
    }
    return kvb_par_return(&err);
}

int int2_dequantize_check(const int2_layout *l, int64_t L, const char *who)
{
    int rc = int2_layout_check(l, who);
    if (rc) return rc;
    if (L < l->T + l->R)
        return kvb_fail(KVB_EINVAL, "%s: L=%lld out of range [T + R = %lld, inf)", who, (long long)L,
                        (long long)(l->T + l->R));
    return KVB_OK;
}

int ref_int2_dequantize(const int2_cache *c, kvb_bf16 *K, kvb_bf16 *V, int64_t L, const int2_layout *l)
{
    int rc = int2_dequantize_check(l, L, "ref_int2_dequantize");
    if (rc) return rc;
    const int D = l->D;
    const int64_t heads = (int64_t)l->B * l->Hkv;
#pragma omp parallel for schedule(static)
    for (int64_t bh = 0; bh < heads; bh++) {
        for (int64_t t = 0; t < l->T; t++)
            for (int d = 0; d < D; d++) { /* exact in double, then the kernel's two roundings: fp32, bf16 */
                const int64_t at = (bh * L + t) * D + d;
                K[at] = kvb_float_to_bf16((float)key_at(c, l, bh, d, t, NULL));
                V[at] = kvb_float_to_bf16((float)value_at(c, l, bh, t, d, NULL));
            }
        for (int t = 0; t < l->R; t++) {
            memcpy(K + (bh * L + l->T + t) * D, c->Kr + (bh * l->Rcap + t) * D, sizeof(kvb_bf16) * (size_t)D);
            memcpy(V + (bh * L + l->T + t) * D, c->Vr + (bh * l->Rcap + t) * D, sizeof(kvb_bf16) * (size_t)D);
        }
    }
    return KVB_OK;
}

/* ---- the kernel-native layout (int2.h) ---- */

static int native_check(const int2_layout *l, const char *who)
{
    int rc = int2_layout_check(l, who);
    if (rc) return rc;
    if (l->Tcap % 64)
        return kvb_fail(KVB_EINVAL, "%s: Tcap=%lld is not a multiple of 64 (the native layout's step)", who,
                        (long long)l->Tcap);
    return KVB_OK;
}

static unsigned code_get(const uint32_t *w, int64_t word, int pos) { return (w[word] >> (2 * pos)) & 3u; }

static void code_put(uint32_t *w, int64_t word, int pos, unsigned code)
{
    w[word] = (w[word] & ~(3u << (2 * pos))) | (code << (2 * pos));
}

/* Positions in the native arrays (int2.h). Codes: word index into Rec and 2-bit position (16 hb + 2(2i + h),
 * in units of 2 bits: 8 hb + 2i + h). */
static int64_t rec_base(const int2_layout *l, int64_t bh, int64_t tok)
{
    return (bh * (l->Tcap / 64) + tok / 64) * int2_native_rec_words(l);
}

static int64_t kc_word(const int2_layout *l, int64_t bh, int d, int64_t tok, int *pos)
{
    const int i = (int)(tok % 64) / 16, r = (int)(tok % 16), g = r % 8, h = r / 8;
    const int j = d / 16, t = (d % 16) / 4, p = (d % 4) / 2, hb = d % 2;
    *pos = 8 * hb + 2 * i + h;
    return rec_base(l, bh, tok) + 64 * j + 2 * (4 * g + t) + p;
}

static int64_t vc_word(const int2_layout *l, int64_t bh, int64_t tok, int d, int *pos)
{
    const int i = (int)(tok % 64) / 16, k = (int)(tok % 16), p = k / 8, t = (k % 8) / 2, hb = k % 2;
    const int mv = d / 16, mh = mv / 4, m = mv % 4, g = (d % 16) / 2, h = d % 2;
    *pos = 8 * hb + 2 * m + h;
    return rec_base(l, bh, tok) + 4 * l->D + (int64_t)i * l->D + (4 * g + t) * (l->D / 32) + 2 * mh + p;
}

/* value metadata (a = 0: scale, 1: zero) of token tok, group gv: an fp16 index into Rec seen as halves */
static int64_t vmeta_native(const int2_layout *l, int64_t bh, int64_t tok, int gv, int a)
{
    const int ngv = l->D / l->gs, i = (int)(tok % 64) / 16, tau = (int)(tok % 16);
    const int pos = 4 * ((tau & 7) >> 1) + 2 * (tau >> 3) + (tau & 1);
    return 2 * (rec_base(l, bh, tok) + 8 * l->D) + ((2 * i + a) * ngv + gv) * 16 + pos;
}

/* key metadata (a = 0: scale, 1: zero) of channel d, group grp: an index into Km */
static int64_t kmeta_native(const int2_layout *l, int64_t bh, int d, int64_t grp, int a)
{
    const int ngs = l->gs >= 64 ? 1 : 64 / l->gs, nq = l->D / 4;
    const int rot = (int)(grp % ngs);
    return ((bh * (l->Tcap / l->gs) + grp) * 2 + a) * l->D + 4 * ((d / 4 + 4 * rot) % nq) + d % 4;
}

/* One routine for both directions: to_native copies c into n, else n into c. */
static int native_convert(int2_cache *c, int2_native *n, const int2_layout *l, int to_native, const char *who)
{
    int rc = native_check(l, who);
    if (rc) return rc;
    const int64_t heads = (int64_t)l->B * l->Hkv, Tcap = l->Tcap;
    const int D = l->D, gs = l->gs;
    kvb_fp16 *vm = (kvb_fp16 *)n->Rec;
#pragma omp parallel for schedule(dynamic) /* heads own disjoint words */
    for (int64_t bh = 0; bh < heads; bh++) {
        /* the keys' codes a block of 64 tokens at a time, the native array's unit: each block's words are
         * written while they are in the cache (channel by channel over all tokens revisits every block D times) */
        for (int64_t tok0 = 0; tok0 < Tcap; tok0 += 64)
            for (int d = 0; d < D; d++)
                for (int64_t tok = tok0; tok < tok0 + 64 && tok < Tcap; tok++) {
                    int pos;
                    const int64_t wn = kc_word(l, bh, d, tok, &pos);
                    const int64_t wi = (bh * D + d) * (Tcap / 16) + tok / 16;
                    if (to_native) code_put(n->Rec, wn, pos, code_get(c->Kq, wi, (int)(tok % 16)));
                    else code_put(c->Kq, wi, (int)(tok % 16), code_get(n->Rec, wn, pos));
                }
        for (int d = 0; d < D; d++)
            for (int64_t grp = 0; grp < Tcap / gs; grp++) {
                const int64_t a = (bh * D + d) * (Tcap / gs) + grp;
                const int64_t bs = kmeta_native(l, bh, d, grp, 0), bz = kmeta_native(l, bh, d, grp, 1);
                if (to_native) n->Km[bs] = c->Ks[a], n->Km[bz] = c->Kz[a];
                else c->Ks[a] = n->Km[bs], c->Kz[a] = n->Km[bz];
            }
        for (int64_t tok = 0; tok < Tcap; tok++) {
            for (int d = 0; d < D; d++) {
                int pos;
                const int64_t wn = vc_word(l, bh, tok, d, &pos);
                const int64_t wi = (bh * Tcap + tok) * (D / 16) + d / 16;
                if (to_native) code_put(n->Rec, wn, pos, code_get(c->Vq, wi, d % 16));
                else code_put(c->Vq, wi, d % 16, code_get(n->Rec, wn, pos));
            }
            for (int gv = 0; gv < D / gs; gv++) {
                const int64_t a = (bh * Tcap + tok) * (D / gs) + gv;
                const int64_t bs = vmeta_native(l, bh, tok, gv, 0), bz = vmeta_native(l, bh, tok, gv, 1);
                if (to_native) vm[bs] = c->Vs[a], vm[bz] = c->Vz[a];
                else c->Vs[a] = vm[bs], c->Vz[a] = vm[bz];
            }
        }
    }
    return KVB_OK;
}

int ref_int2_to_native(const int2_cache *c, int2_native *n, const int2_layout *l)
{
    return native_convert((int2_cache *)c, n, l, 1, "ref_int2_to_native");
}

int ref_int2_from_native(const int2_native *n, int2_cache *c, const int2_layout *l)
{
    return native_convert(c, (int2_native *)n, l, 0, "ref_int2_from_native");
}
