/* compare.c: see compare.h. */
#include "harness/core/compare.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int g_first_bad_settles; /* kvb_compare_verdict_only */

void kvb_compare_verdict_only(int on) { g_first_bad_settles = on; }

static void reset(kvb_cmp_result *r, kvb_cmp_kind kind)
{
    memset(r, 0, sizeof *r);
    r->kind = kind;
}

static void note_bad(kvb_cmp_result *r, int64_t index, double out, double ref)
{
    if (r->n_first < KVB_MAX_MISMATCHES) r->first[r->n_first++] = (kvb_mismatch){index, out, ref};
    r->n_bad++;
}

static int slice_on(const uint8_t *mask, int64_t slice_len, int64_t i)
{
    return !mask || mask[i / slice_len];
}

/* An element of a slice the sampled reference skipped: it is still screened. It fails when it is
 * non-finite (floats: the bf16/fp32 poison is a NaN) or still holds the integer poison (all bytes
 * 0xFF, what the harness writes before every launch). Returns 1 when it fails. */
static int screen_unsampled(const void *out, kvb_dtype t, int64_t i, kvb_cmp_result *r)
{
    r->n_screened++;
    if (kvb_dtype_is_float(t)) {
        double a = kvb_load_as_double(out, t, i);
        if (isfinite(a)) return 0;
        r->n_nonfinite++;
        note_bad(r, i, a, NAN);
        return 1;
    }
    size_t es = kvb_dtype_size(t);
    const uint8_t *b = (const uint8_t *)out + (size_t)i * es;
    for (size_t k = 0; k < es; k++)
        if (b[k] != 0xFF) return 0;
    note_bad(r, i, kvb_load_as_double(out, t, i), NAN);
    return 1;
}

/* A float element's bits say whether it is finite: the exponent field all ones is Inf or NaN. Vectorized
 * (GCC vectorizes these loops fully only at -O3): a cache of gigabytes is scanned at every comparison. */
#if defined(__GNUC__) && !defined(__clang__)
__attribute__((optimize("O3")))
#endif
static int64_t count_nonfinite(const void *p, kvb_dtype t, int64_t first, int64_t len)
{
    int64_t n = 0;
    if (t == KVB_BF16 || t == KVB_FP16) {
        const uint16_t *u = (const uint16_t *)p + first, e = t == KVB_BF16 ? 0x7F80 : 0x7C00;
        for (int64_t i = 0; i < len; i++) n += (uint16_t)(u[i] & e) == e;
    } else if (t == KVB_FP32) {
        const uint32_t *u = (const uint32_t *)p + first;
        for (int64_t i = 0; i < len; i++) n += (u[i] & 0x7F800000u) == 0x7F800000u;
    } else if (t == KVB_FP64) {
        const uint64_t *u = (const uint64_t *)p + first;
        for (int64_t i = 0; i < len; i++) n += (u[i] & 0x7FF0000000000000ull) == 0x7FF0000000000000ull;
    }
    return n;
}

/* The element walk of kvb_compare_exact over [start, start + len); `screen` 0: a skipped slice's
 * elements are counted, not screened (kvb_compare_exact_any_bits). */
static void exact_walk(const void *out, const void *ref, kvb_dtype t, int64_t start, int64_t len, int64_t slice_len,
                       const uint8_t *mask, int screen, kvb_cmp_result *r)
{
    const size_t es = kvb_dtype_size(t);
    const uint8_t *o = out, *f = ref;
    for (int64_t i = start; i < start + len; i++) {
        if (!slice_on(mask, slice_len, i)) {
            if (screen) screen_unsampled(out, t, i, r);
            else r->n_unscreened++;
            continue;
        }
        r->n_checked++;
        if (kvb_dtype_is_float(t) && !isfinite(kvb_load_as_double(out, t, i)) && isfinite(kvb_load_as_double(ref, t, i)))
            r->n_nonfinite++;
        if (kvb_dtype_is_float(t) && !isfinite(kvb_load_as_double(ref, t, i))) r->n_ref_nonfinite++;
        if (memcmp(o + (size_t)i * es, f + (size_t)i * es, es) != 0) {
            double a = kvb_load_as_double(out, t, i), b = kvb_load_as_double(ref, t, i);
            note_bad(r, i, a, b);
            if (isfinite(a) && isfinite(b) && fabs(a - b) > r->max_abs) r->max_abs = fabs(a - b);
        }
    }
}

static void compare_exact(const void *out, const void *ref, kvb_dtype t, int64_t n, int64_t slice_len,
                          const uint8_t *mask, int screen, kvb_cmp_result *r)
{
    reset(r, KVB_CMP_EXACT);
    const size_t es = kvb_dtype_size(t);
    const uint8_t *o = out, *f = ref;
    /* Blocks that are bitwise equal are the common case (caches of gigabytes, copies): one memcmp and a
     * scan of the reference's bits for non-finite values settle them, block by block in parallel. A block
     * that differs, or that straddles sampled and skipped slices, is walked element by element, in order
     * (the first mismatches are the first in the tensor). Groups of GROUP blocks bound the flags' memory. */
    enum { BLOCK = 4096, GROUP = 1024 };
    for (int64_t g0 = 0; g0 < n; g0 += (int64_t)BLOCK * GROUP) {
        uint8_t equal[GROUP];
        const int nb = (int)((n - g0 + BLOCK - 1) / BLOCK < GROUP ? (n - g0 + BLOCK - 1) / BLOCK : GROUP);
        int64_t checked = 0, ref_nonfinite = 0;
#pragma omp parallel for schedule(static) reduction(+ : checked, ref_nonfinite) if (nb > 16)
        for (int b = 0; b < nb; b++) {
            const int64_t start = g0 + (int64_t)b * BLOCK, len = n - start < BLOCK ? n - start : BLOCK;
            const int one_slice = !mask || start / slice_len == (start + len - 1) / slice_len;
            equal[b] = one_slice && slice_on(mask, slice_len, start) &&
                       !memcmp(o + (size_t)start * es, f + (size_t)start * es, (size_t)len * es);
            if (equal[b]) checked += len, ref_nonfinite += count_nonfinite(ref, t, start, len); /* out is the same */
        }
        r->n_checked += checked, r->n_ref_nonfinite += ref_nonfinite;
        for (int b = 0; b < nb && !(r->n_bad && g_first_bad_settles); b++) {
            const int64_t start = g0 + (int64_t)b * BLOCK;
            if (!equal[b]) exact_walk(out, ref, t, start, n - start < BLOCK ? n - start : BLOCK, slice_len, mask, screen, r);
        }
        if (r->n_bad && g_first_bad_settles) break;
    }
    r->tol_used = r->n_bad ? 1.0 : 0.0;
    r->pass = r->n_bad == 0;
}

void kvb_compare_exact(const void *out, const void *ref, kvb_dtype t, int64_t n, int64_t slice_len,
                       const uint8_t *mask, kvb_cmp_result *r)
{
    compare_exact(out, ref, t, n, slice_len, mask, 1, r);
}

void kvb_compare_exact_any_bits(const void *out, const void *ref, kvb_dtype t, int64_t n, int64_t slice_len,
                                const uint8_t *mask, kvb_cmp_result *r)
{
    compare_exact(out, ref, t, n, slice_len, mask, 0, r);
}

/* The element walk of compare_float over [start, start + len), in order, into r and the running sums.
 * Returns 1 where a mismatch settles the verdict (kvb_compare_verdict_only). */
static int float_walk(const void *out, const void *ref, kvb_dtype t, int64_t start, int64_t len, kvb_tol tol,
                      const double *mag, int64_t slice_len, const uint8_t *mask, kvb_cmp_result *r, double *err2,
                      double *ref2)
{
    for (int64_t i = start; i < start + len; i++) {
        if (!slice_on(mask, slice_len, i)) {
            screen_unsampled(out, t, i, r);
            continue;
        }
        r->n_checked++;
        double a = kvb_load_as_double(out, t, i), b = kvb_load_as_double(ref, t, i);
        if (!isfinite(a) || !isfinite(b)) {
            /* a non-finite reference must be matched exactly (same inf, or NaN for NaN) */
            int same = (isnan(a) && isnan(b)) || a == b;
            if (!isfinite(a) && isfinite(b)) r->n_nonfinite++;
            if (!isfinite(b)) r->n_ref_nonfinite++;
            if (!same) note_bad(r, i, a, b);
            if (!same && g_first_bad_settles) return 1;
            continue;
        }
        double e = fabs(a - b), lim = tol.atol + tol.rtol * (mag ? mag[i] : fabs(b));
        if (e > r->max_abs) r->max_abs = e;
        double used = lim > 0 ? e / lim : (e > 0 ? INFINITY : 0);
        if (used > r->tol_used) r->tol_used = used;
        if (e > lim) {
            note_bad(r, i, a, b);
            if (g_first_bad_settles) return 1;
        }
        *err2 += e * e;
        *ref2 += b * b;
    }
    return 0;
}

/* One block's sums where every element is clean: sampled ones finite and within tolerance, skipped ones
 * finite. Returns 0 at the first element that is not: the block is then walked in order instead. */
typedef struct float_part {
    double err2, ref2, max_abs, used;
    int64_t checked, screened;
} float_part;

static int float_block(const void *out, const void *ref, kvb_dtype t, int64_t start, int64_t len, kvb_tol tol,
                       const double *mag, int64_t slice_len, const uint8_t *mask, float_part *p)
{
    memset(p, 0, sizeof *p);
    for (int64_t i = start; i < start + len; i++) {
        double a = kvb_load_as_double(out, t, i);
        if (!isfinite(a)) return 0;
        if (!slice_on(mask, slice_len, i)) {
            p->screened++;
            continue;
        }
        double b = kvb_load_as_double(ref, t, i);
        if (!isfinite(b)) return 0;
        double e = fabs(a - b), lim = tol.atol + tol.rtol * (mag ? mag[i] : fabs(b));
        if (e > lim) return 0;
        if (e > p->max_abs) p->max_abs = e;
        double used = lim > 0 ? e / lim : 0;
        if (used > p->used) p->used = used;
        p->err2 += e * e;
        p->ref2 += b * b;
        p->checked++;
    }
    return 1;
}

/* Blocks whose elements are all clean (the common case) are summed in parallel; any other block is walked
 * in order, so the first mismatches noted are the first in the tensor. The partial sums are added in block
 * order: the same rel L2 whatever the number of threads. Groups of GROUP blocks bound the partials' memory. */
static void compare_float(const void *out, const void *ref, kvb_dtype t, int64_t n, kvb_tol tol, const double *mag,
                          int64_t slice_len, const uint8_t *mask, kvb_cmp_result *r)
{
    reset(r, KVB_CMP_FLOAT);
    enum { BLOCK = 4096, GROUP = 1024 };
    double err2 = 0, ref2 = 0;
    int stop = 0;
    for (int64_t g0 = 0; g0 < n && !stop; g0 += (int64_t)BLOCK * GROUP) {
        float_part part[GROUP];
        uint8_t clean[GROUP];
        const int nb = (int)((n - g0 + BLOCK - 1) / BLOCK < GROUP ? (n - g0 + BLOCK - 1) / BLOCK : GROUP);
#pragma omp parallel for schedule(static) if (nb > 16)
        for (int b = 0; b < nb; b++) {
            const int64_t start = g0 + (int64_t)b * BLOCK, len = n - start < BLOCK ? n - start : BLOCK;
            clean[b] = (uint8_t)float_block(out, ref, t, start, len, tol, mag, slice_len, mask, &part[b]);
        }
        for (int b = 0; b < nb && !stop; b++) {
            const int64_t start = g0 + (int64_t)b * BLOCK, len = n - start < BLOCK ? n - start : BLOCK;
            if (!clean[b]) {
                stop = float_walk(out, ref, t, start, len, tol, mag, slice_len, mask, r, &err2, &ref2);
                continue;
            }
            const float_part *p = &part[b];
            err2 += p->err2, ref2 += p->ref2;
            r->n_checked += p->checked, r->n_screened += p->screened;
            if (p->max_abs > r->max_abs) r->max_abs = p->max_abs;
            if (p->used > r->tol_used) r->tol_used = p->used;
        }
    }
    r->rel_l2 = ref2 > 0 ? sqrt(err2 / ref2) : sqrt(err2);
    r->pass = r->n_bad == 0 && r->rel_l2 <= tol.l2;
}

void kvb_compare_float(const void *out, const void *ref, kvb_dtype t, int64_t n, kvb_tol tol,
                       int64_t slice_len, const uint8_t *mask, kvb_cmp_result *r)
{
    compare_float(out, ref, t, n, tol, NULL, slice_len, mask, r);
}

void kvb_compare_float_mag(const void *out, const void *ref, kvb_dtype t, int64_t n, kvb_tol tol, const double *mag,
                           int64_t slice_len, const uint8_t *mask, kvb_cmp_result *r)
{
    compare_float(out, ref, t, n, tol, mag, slice_len, mask, r);
}

/* Strictly ascending and within [0, n); the first offending position is noted. */
static int ascending_in_range(const int32_t *o, const int32_t *f, int64_t row, int64_t n, int64_t k,
                              kvb_cmp_result *r)
{
    for (int64_t i = 0; i < k; i++)
        if (o[i] < 0 || o[i] >= n || (i > 0 && o[i] <= o[i - 1])) {
            note_bad(r, row, o[i], f ? f[i] : NAN);
            return 0;
        }
    return 1;
}

void kvb_compare_indexset_sampled(const int32_t *out_idx, const int32_t *ref_idx, const void *scores,
                                  kvb_dtype score_type, int64_t rows, int64_t n, int64_t k, double tol,
                                  int64_t slice_rows, const uint8_t *mask, kvb_cmp_result *r)
{
    reset(r, KVB_CMP_INDEXSET);
    for (int64_t row = 0; row < rows; row++) {
        const int32_t *o = out_idx + row * k, *f = ref_idx + row * k;
        if (!slice_on(mask, slice_rows, row)) { /* no reference here: screened */
            r->n_screened += k;
            ascending_in_range(o, NULL, row, n, k, r);
            continue;
        }
        r->n_checked += k;
        if (!ascending_in_range(o, f, row, n, k, r)) continue;
        if (memcmp(o, f, sizeof(int32_t) * (size_t)k) == 0) continue; /* equal sets */
        /* tie-tolerant: k-th reference score (the smallest of the k chosen) and sums */
        int ok = 1;
        double ref_sum = 0, out_sum = 0, kth = INFINITY;
        for (int64_t i = 0; i < k; i++) {
            const double v = kvb_load_as_double(scores, score_type, row * n + f[i]);
            ref_sum += v;
            if (v < kth) kth = v;
        }
        for (int64_t i = 0; i < k; i++) {
            double s = kvb_load_as_double(scores, score_type, row * n + o[i]);
            out_sum += s;
            if (!(s >= kth - tol)) ok = 0;
        }
        if (!(fabs(out_sum - ref_sum) <= tol)) ok = 0;
        double d = fabs(out_sum - ref_sum);
        if (d > r->max_abs) r->max_abs = d;
        if (tol > 0 && d / tol > r->tol_used) r->tol_used = d / tol;
        if (!ok) note_bad(r, row, out_sum, ref_sum);
    }
    r->pass = r->n_bad == 0;
}

void kvb_compare_indexset(const int32_t *out_idx, const int32_t *ref_idx, const void *scores,
                          kvb_dtype score_type, int64_t rows, int64_t n, int64_t k, double tol,
                          kvb_cmp_result *r)
{
    kvb_compare_indexset_sampled(out_idx, ref_idx, scores, score_type, rows, n, k, tol, 1, NULL, r);
}

void kvb_compare_gather(const void *out, const void *src, const int32_t *idx, kvb_dtype t, int64_t rows, int64_t k,
                        int64_t width, int64_t n_src, int64_t group, kvb_cmp_result *r)
{
    reset(r, KVB_CMP_GATHER);
    size_t es = kvb_dtype_size(t), row_bytes = es * (size_t)width;
    const uint8_t *o = out, *s = src;
    for (int64_t row = 0; row < rows; row++)
        for (int64_t i = 0; i < k; i++) {
            int64_t at = (row * k + i) * width;
            int32_t j = idx[row * k + i];
            r->n_checked += width;
            if (j < 0 || j >= n_src) {
                note_bad(r, at, j, NAN);
                continue;
            }
            const uint8_t *want = s + (size_t)(((row / group) * n_src + j) * width) * es;
            if (memcmp(o + (size_t)at * es, want, row_bytes) == 0) continue;
            for (int64_t d = 0; d < width; d++)
                if (memcmp(o + (size_t)(at + d) * es, want + (size_t)d * es, es) != 0) {
                    double a = kvb_load_as_double(o, t, at + d), b = kvb_load_as_double(want, t, d);
                    note_bad(r, at + d, a, b);
                    if (kvb_dtype_is_float(t) && !isfinite(a) && isfinite(b)) r->n_nonfinite++;
                    if (isfinite(a) && isfinite(b) && fabs(a - b) > r->max_abs) r->max_abs = fabs(a - b);
                }
        }
    r->tol_used = r->n_bad ? 1.0 : 0.0;
    r->pass = r->n_bad == 0;
}
