/* shadowkv.c: plain C reference of ShadowKV's prefill, written to be read against its contract
 * (kernels/shadowkv/NOTES.md, "What it computes"); the step numbers below are the note's. */
#include "reference/shadowkv.h"

#include <cblas.h>
#include <lapacke.h>
#include <stdlib.h>

/* ---- step 1: low-rank pre-RoPE keys ------------------------------------------------------------ */

static int check_factor_shape(const char *who, int S, int Hkv, int D)
{
    KVB_CHECK_RANGE(who, "S", S, 1, SHADOWKV_MAX_S);
    KVB_CHECK_RANGE(who, "Hkv", Hkv, 1, SHADOWKV_MAX_HKV);
    KVB_CHECK_RANGE(who, "D", D, 1, SHADOWKV_MAX_D);
    int64_t elems = (int64_t)S * Hkv * D;
    if (elems > INT32_MAX)
        return kvb_fail(KVB_EINVAL,
                        "%s: S*Hkv*D = %d*%d*%d = %lld out of range [1, %d] (LAPACK indexes with 32-bit integers)",
                        who, S, Hkv, D, (long long)elems, INT32_MAX);
    return KVB_OK;
}

static int check_rank(const char *who, int r, int S, int N)
{
    int k = S < N ? S : N;
    if (r < 1 || r > k)
        return kvb_fail(KVB_EINVAL, "%s: r=%d out of range [1, min(S, Hkv*D) = min(%d, %d) = %d]", who, r, S, N, k);
    return KVB_OK;
}

/* The first non-finite element of x [rows, cols], named as who: name[row, col]. */
static int check_finite_f32(const char *who, const char *name, const float *x, int rows, int cols)
{
    for (int64_t i = 0; i < (int64_t)rows * cols; i++)
        if (!isfinite(x[i]))
            return kvb_fail(KVB_EINVAL, "%s: %s[%lld, %lld] = %g is not finite", who, name,
                            (long long)(i / cols), (long long)(i % cols), (double)x[i]);
    return KVB_OK;
}

/* Why dgesdd and not sgesdd: the reference's job is the denominator of the GPU bound
 * ||Kpre - U*SV|| <= 1.02 * sqrt(sum_{i>=r} s_i^2). sgesdd's singular values carry absolute errors of
 * order eps_f32 * s_max * p(n) (1e-7 .. 1e-5 of s_max); with the decaying spectra of pre-RoPE keys
 * the tail values sit orders of magnitude below s_max, so in fp32 the tail norm itself could be off
 * by a share comparable to the 2% slack. dgesdd's errors (about 1e-16 of s_max) leave the whole slack
 * to the GPU. It also follows the suite's rule that the reference reads the stored inputs and
 * computes in double. The price is time: dgesdd is about twice sgesdd on the CPU, so the goal "20x
 * faster than the LAPACKE reference" is stated against dgesdd. gesdd (divide and conquer) rather
 * than gesvd: the same accuracy class, several times faster on tall matrices.
 * The tall matrix is first reduced by its QR factorization, Kpre = Q R (dgeqrf; R is k x N), as dgesdd
 * itself does for S >> N; the SVD is then R's, R = ur s vt (dgesdd), and only the r columns of U that are
 * kept are formed, U = Q [ur[:, :r]; 0] (dormqr), where dgesdd on Kpre forms all k of them: half the time
 * at S=32768, N=1024, the same singular values. Column-major throughout (LAPACK's own order). */
int ref_shadowkv_lowrank(const float *Kpre, int S, int Hkv, int D, int r, float *U, float *SV, double *s_out)
{
    const char *who = "ref_shadowkv_lowrank";
    if (check_factor_shape(who, S, Hkv, D)) return KVB_EINVAL;
    const int N = Hkv * D, k = S < N ? S : N;
    if (check_rank(who, r, S, N)) return KVB_EINVAL;
    if (check_finite_f32(who, "Kpre", Kpre, S, N)) return KVB_EINVAL;

    const char *what = "ref_shadowkv_lowrank scratch";
    double *a = kvb_xalloc((size_t)S * N, sizeof(double), what);      /* Kpre, then Q's reflectors and R */
    double *tau = kvb_xalloc((size_t)k, sizeof(double), what);        /* Q's reflector scales */
    double *rk = kvb_xalloc((size_t)k * N, sizeof(double), what);     /* R [k, N] */
    double *s = kvb_xalloc((size_t)k, sizeof(double), what);          /* singular values */
    double *ur = kvb_xalloc((size_t)k * k, sizeof(double), what);     /* R's left vectors [k, k] */
    double *vt = kvb_xalloc((size_t)k * N, sizeof(double), what);     /* right vectors [k, N] */
    double *u = kvb_xalloc((size_t)S * r, sizeof(double), what);      /* U [S, r] */
    if (!a || !tau || !rk || !s || !ur || !vt || !u) {
        kvb_xfree(a), kvb_xfree(tau), kvb_xfree(rk), kvb_xfree(s), kvb_xfree(ur), kvb_xfree(vt), kvb_xfree(u);
        return KVB_ENOMEM;
    }
    for (int64_t t = 0; t < S; t++)
        for (int n = 0; n < N; n++) a[t + (int64_t)S * n] = Kpre[t * N + n];
    lapack_int info = LAPACKE_dgeqrf(LAPACK_COL_MAJOR, S, N, a, S, tau);
    const char *failed = "LAPACKE_dgeqrf";
    if (info == 0) { /* R: the upper triangle (trapezoid when S < N) of a's first k rows */
        for (int n = 0; n < N; n++)
            for (int i = 0; i < k; i++) rk[i + (int64_t)k * n] = i <= n ? a[i + (int64_t)S * n] : 0.0;
        info = LAPACKE_dgesdd(LAPACK_COL_MAJOR, 'S', k, N, rk, k, s, ur, k, vt, k);
        failed = "LAPACKE_dgesdd";
    }
    if (info == 0) { /* u = Q [ur[:, :r]; 0] */
        for (int j = 0; j < r; j++)
            for (int64_t t = 0; t < S; t++) u[t + (int64_t)S * j] = t < k ? ur[t + (int64_t)k * j] : 0.0;
        info = LAPACKE_dormqr(LAPACK_COL_MAJOR, 'L', 'N', S, r, k, a, S, tau, u, S);
        failed = "LAPACKE_dormqr";
    }
    if (info != 0) {
        kvb_xfree(a), kvb_xfree(tau), kvb_xfree(rk), kvb_xfree(s), kvb_xfree(ur), kvb_xfree(vt), kvb_xfree(u);
        return kvb_fail(KVB_EINVAL, "%s: %s failed (info=%d: %s) on S=%d, Hkv*D=%d", who, failed, (int)info,
                        info < 0 ? "an argument was invalid" : "the divide-and-conquer iteration did not converge",
                        S, N);
    }
    for (int64_t t = 0; t < S; t++)
        for (int j = 0; j < r; j++) U[t * r + j] = (float)u[t + (int64_t)S * j];
    /* SV[h, j, d] = s[j] * vt[j, h*D + d] */
    for (int h = 0; h < Hkv; h++)
        for (int j = 0; j < r; j++)
            for (int d = 0; d < D; d++)
                SV[((int64_t)h * r + j) * D + d] = (float)(s[j] * vt[j + (int64_t)k * (h * D + d)]);
    if (s_out) memcpy(s_out, s, sizeof(double) * (size_t)k);
    kvb_xfree(a), kvb_xfree(tau), kvb_xfree(rk), kvb_xfree(s), kvb_xfree(ur), kvb_xfree(vt), kvb_xfree(u);
    return KVB_OK;
}

double shadowkv_optimal_error(const double *s, int n_s, int r)
{
    double sum = 0.0;
    for (int i = n_s - 1; i >= r && i >= 0; i--) sum += s[i] * s[i]; /* smallest first */
    return sqrt(sum);
}

int ref_shadowkv_lowrank_error(const float *Kpre, int S, int Hkv, int D, int r, const float *U,
                               const float *SV, double *err)
{
    const char *who = "ref_shadowkv_lowrank_error";
    if (check_factor_shape(who, S, Hkv, D)) return KVB_EINVAL;
    const int N = Hkv * D;
    if (check_rank(who, r, S, N)) return KVB_EINVAL;
    if (check_finite_f32(who, "Kpre", Kpre, S, N) || check_finite_f32(who, "U", U, S, r) ||
        check_finite_f32(who, "SV", SV, Hkv * r, D))
        return KVB_EINVAL;
    /* The product U * SV is a matrix product (S x r by r x N, 10.7 GFLOP at S=32768, N=1024, r=160):
     * cblas_dgemm in double, on ERROR_ROWS rows at a time. sv [r, N] is SV with its heads side by side
     * (sv[j][h*D + d] = SV[h, j, d]); x starts as the block's rows of Kpre and leaves as Kpre - U * SV.
     * The squares are summed row by row in column order, the rows in order, on one thread: the same sum
     * for any thread count (dgemm does not split the r-long dot products between threads). */
    enum { ERROR_ROWS = 2048 };
    const int rows = S < ERROR_ROWS ? S : ERROR_ROWS;
    double *sv = kvb_xalloc((size_t)r * N, sizeof(double), "ref_shadowkv_lowrank_error SV");
    double *u = sv ? kvb_xalloc((size_t)rows * r, sizeof(double), "ref_shadowkv_lowrank_error U rows") : NULL;
    double *x = u ? kvb_xalloc((size_t)rows * N, sizeof(double), "ref_shadowkv_lowrank_error residual rows") : NULL;
    if (!x) {
        kvb_xfree(sv), kvb_xfree(u);
        return KVB_ENOMEM;
    }
    for (int h = 0; h < Hkv; h++)
        for (int j = 0; j < r; j++)
            for (int d = 0; d < D; d++) sv[(int64_t)j * N + h * D + d] = SV[((int64_t)h * r + j) * D + d];
    double sum = 0.0;
    for (int t0 = 0; t0 < S; t0 += rows) {
        const int nt = S - t0 < rows ? S - t0 : rows;
        for (int64_t i = 0; i < (int64_t)nt * r; i++) u[i] = U[(int64_t)t0 * r + i];
        for (int64_t i = 0; i < (int64_t)nt * N; i++) x[i] = Kpre[(int64_t)t0 * N + i];
        /* x = -1 * u * sv + 1 * x */
        cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, nt, N, r, -1.0, u, r, sv, N, 1.0, x, N);
        for (int64_t i = 0; i < (int64_t)nt * N; i++) sum += x[i] * x[i];
    }
    kvb_xfree(sv), kvb_xfree(u), kvb_xfree(x);
    *err = sqrt(sum);
    return KVB_OK;
}

void shadowkv_round_bf16(const float *x, int64_t n, kvb_bf16 *y)
{
    for (int64_t i = 0; i < n; i++) y[i] = kvb_float_to_bf16(x[i]);
}

/* ---- steps 2-4: chunks, landmarks, outliers ---------------------------------------------------- */

int shadowkv_chunk_counts(int S, int c, int local_chunks, int outlier_chunks, int *n_chunks, int *Lm,
                          const char *who)
{
    KVB_CHECK_RANGE(who, "c", c, 1, SHADOWKV_MAX_C);
    KVB_CHECK_RANGE(who, "local_chunks", local_chunks, 0, SHADOWKV_MAX_S);
    int64_t min_S = (int64_t)c * (local_chunks + 1);
    if (S < min_S || S > SHADOWKV_MAX_S)
        return kvb_fail(KVB_EINVAL,
                        "%s: S=%d out of range [c*(local_chunks+1) = %d*%d = %lld, %d]: at least one chunk "
                        "before the local window",
                        who, S, c, local_chunks + 1, (long long)min_S, SHADOWKV_MAX_S);
    int n = S / c - local_chunks;
    if (outlier_chunks < 0 || outlier_chunks > n)
        return kvb_fail(KVB_EINVAL, "%s: outlier_chunks=%d out of range [0, n_chunks = floor(S/c) - local_chunks = "
                        "floor(%d/%d) - %d = %d]", who, outlier_chunks, S, c, local_chunks, n);
    *n_chunks = n;
    *Lm = n - outlier_chunks;
    return KVB_OK;
}

typedef struct chunk_score {
    double min_cos;
    int32_t chunk;
} chunk_score;

/* The outlier rule: smallest min_cos first; ties go to the lower chunk id. */
static int by_min_cos_then_chunk(const void *a, const void *b)
{
    const chunk_score *x = a, *y = b;
    if (x->min_cos != y->min_cos) return x->min_cos < y->min_cos ? -1 : 1;
    return (x->chunk > y->chunk) - (x->chunk < y->chunk);
}

static int by_int32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* cosine(a, b) in double; 0 where either vector is zero. The rule for the zero vector is PyTorch's:
 * ShadowKV calls torch.nn.functional.cosine_similarity, which divides by max(|a|*|b|, eps) and so
 * returns 0 there. It also reads right: a zero mean carries nothing about the chunk's keys, and a
 * zero key is not represented by a nonzero mean, so the chunk ranks as poorly represented (below
 * every chunk whose keys all point along their mean), not as perfectly represented (1). */
static double cosine(const double *a, const double *b, int D)
{
    double dot = 0.0, na = 0.0, nb = 0.0;
    for (int d = 0; d < D; d++) {
        dot += a[d] * b[d];
        na += a[d] * a[d];
        nb += b[d] * b[d];
    }
    if (na == 0.0 || nb == 0.0) return 0.0;
    return dot / (sqrt(na) * sqrt(nb));
}

/* Input: bf16 post-RoPE keys, the tensor the GPU holds after RoPE and the one its landmark kernel
 * reads (a GPU kernel accumulates in fp32; this reference in double, rounding the landmarks once).
 * The cosine is taken against the exact (double) mean, not the bf16-rounded landmark; a GPU that
 * uses its fp32 mean agrees up to rounding, so its outlier set is compared tie-tolerantly against
 * min_cos. */
int ref_shadowkv_chunks(const kvb_bf16 *K, int Hkv, int S, int D, int c, int local_chunks,
                        int outlier_chunks, kvb_bf16 *landmarks, int32_t *landmark_idx,
                        int32_t *outliers, float *min_cos)
{
    const char *who = "ref_shadowkv_chunks";
    KVB_CHECK_RANGE(who, "Hkv", Hkv, 1, SHADOWKV_MAX_HKV);
    KVB_CHECK_RANGE(who, "D", D, 1, SHADOWKV_MAX_D);
    int n_chunks, Lm;
    if (shadowkv_chunk_counts(S, c, local_chunks, outlier_chunks, &n_chunks, &Lm, who)) return KVB_EINVAL;
    for (int h = 0; h < Hkv; h++)
        for (int t = 0; t < S; t++)
            for (int d = 0; d < D; d++) {
                kvb_bf16 v = K[((int64_t)h * S + t) * D + d];
                if (!isfinite(kvb_bf16_to_float(v)))
                    return kvb_fail(KVB_EINVAL, "%s: K[h=%d, t=%d, d=%d] is not finite (bf16 0x%04x)", who, h, t,
                                    d, (unsigned)v);
            }

    double *mean = kvb_xalloc((size_t)n_chunks * D, sizeof(double), "ref_shadowkv_chunks means");
    double *key = mean ? kvb_xalloc((size_t)D, sizeof(double), "ref_shadowkv_chunks key") : NULL;
    chunk_score *score = key ? kvb_xalloc((size_t)n_chunks, sizeof(chunk_score), "ref_shadowkv_chunks scores") : NULL;
    unsigned char *is_outlier = score ? kvb_xalloc((size_t)n_chunks, 1, "ref_shadowkv_chunks outlier flags") : NULL;
    if (!is_outlier) {
        kvb_xfree(mean), kvb_xfree(key), kvb_xfree(score);
        return KVB_ENOMEM;
    }
    for (int h = 0; h < Hkv; h++) {
        const kvb_bf16 *Kh = K + (int64_t)h * S * D;
        for (int k = 0; k < n_chunks; k++) {
            /* step 3: the chunk's mean key */
            double *m = mean + (int64_t)k * D;
            for (int d = 0; d < D; d++) m[d] = 0.0;
            for (int i = 0; i < c; i++)
                for (int d = 0; d < D; d++) m[d] += kvb_bf16_to_double(Kh[((int64_t)k * c + i) * D + d]);
            for (int d = 0; d < D; d++) m[d] /= c;
            /* step 4: the smallest cosine of a key of the chunk with the mean */
            double lo = 0.0;
            for (int i = 0; i < c; i++) {
                for (int d = 0; d < D; d++) key[d] = kvb_bf16_to_double(Kh[((int64_t)k * c + i) * D + d]);
                double cs = cosine(key, m, D);
                if (i == 0 || cs < lo) lo = cs;
            }
            score[k] = (chunk_score){lo, k};
            if (min_cos) min_cos[(int64_t)h * n_chunks + k] = (float)lo;
        }
        /* outliers: sort by (min_cos ascending, chunk id ascending), take the first outlier_chunks,
         * return them in ascending chunk order */
        qsort(score, (size_t)n_chunks, sizeof *score, by_min_cos_then_chunk);
        int32_t *out_h = outliers + (int64_t)h * outlier_chunks;
        for (int o = 0; o < outlier_chunks; o++) out_h[o] = score[o].chunk;
        qsort(out_h, (size_t)outlier_chunks, sizeof *out_h, by_int32);
        /* the other chunks keep their landmark, in ascending chunk order */
        memset(is_outlier, 0, (size_t)n_chunks);
        for (int o = 0; o < outlier_chunks; o++) is_outlier[out_h[o]] = 1;
        int l = 0;
        for (int k = 0; k < n_chunks; k++) {
            if (is_outlier[k]) continue;
            landmark_idx[(int64_t)h * Lm + l] = k;
            for (int d = 0; d < D; d++)
                landmarks[((int64_t)h * Lm + l) * D + d] = kvb_double_to_bf16(mean[(int64_t)k * D + d]);
            l++;
        }
    }
    kvb_xfree(mean), kvb_xfree(key), kvb_xfree(score), kvb_xfree(is_outlier);
    return KVB_OK;
}

/* ---- the GPU buffer and the host values ------------------------------------------------------- */

int shadowkv_layout_make(shadowkv_layout *L, int B, int Hkv, int D, int S, int c, int local_chunks,
                         int outlier_chunks, int M, int decode_capacity)
{
    const char *who = "shadowkv_layout";
    int n_chunks, Lm;
    if (shadowkv_chunk_counts(S, c, local_chunks, outlier_chunks, &n_chunks, &Lm, who)) return KVB_EINVAL;
    int max_M = Lm < GATHER_MAX_M ? Lm : GATHER_MAX_M;
    if (M < 1 || M > max_M)
        return kvb_fail(KVB_EINVAL,
                        "%s: M=%d out of range [1, min(%d, Lm = n_chunks - outlier_chunks = %d - %d = %d)]: the sparse "
                        "slots hold distinct landmark chunks",
                        who, M, GATHER_MAX_M, n_chunks, outlier_chunks, Lm);
    if (decode_capacity < 0)
        return kvb_fail(KVB_EINVAL, "%s: decode_capacity=%d out of range [0, %d]", who, decode_capacity, INT32_MAX);
    shadowkv_layout l = {0};
    l.S = S, l.c = c, l.local_chunks = local_chunks, l.outlier_chunks = outlier_chunks;
    l.n_chunks = n_chunks, l.Lm = Lm;
    l.n_local = S - n_chunks * c;
    l.outlier_start = l.n_local;
    int64_t sparse_start = (int64_t)l.outlier_start + (int64_t)outlier_chunks * c;
    int64_t decode_start = sparse_start + (int64_t)M * c, NB = decode_start + decode_capacity;
    if (NB > INT32_MAX)
        return kvb_fail(KVB_EINVAL, "%s: NB = n_local + (outlier_chunks + M)*c + decode_capacity = %lld out of range "
                        "[1, %d]", who, (long long)NB, INT32_MAX);
    l.decode_start = (int)decode_start;
    l.decode_capacity = decode_capacity;
    l.g = (gather_layout){.B = B, .Hkv = Hkv, .M = M, .c = c, .D = D, .NB = (int)NB,
                          .sparse_start = (int)sparse_start, .host_chunks = n_chunks, .host_stride = n_chunks};
    if (gather_layout_check(&l.g, who)) return KVB_EINVAL;
    *L = l;
    return KVB_OK;
}

int ref_shadowkv_fill_buffer(const kvb_bf16 *X, const int32_t *outliers, const shadowkv_layout *L,
                             kvb_bf16 *buf)
{
    const char *who = "ref_shadowkv_fill_buffer";
    const int S = L->S, c = L->c, D = L->g.D, NB = L->g.NB, n_out = L->outlier_chunks;
    const size_t row = sizeof(kvb_bf16) * (size_t)D;
    if (gather_layout_check(&L->g, who)) return KVB_EINVAL;
    for (int h = 0; h < L->g.Hkv; h++) {
        const int32_t *out_h = outliers + (int64_t)h * n_out;
        for (int o = 0; o < n_out; o++)
            if (out_h[o] < 0 || out_h[o] >= L->n_chunks || (o > 0 && out_h[o] <= out_h[o - 1]))
                return kvb_fail(KVB_EINVAL, "%s: outliers[%d][%d]=%d out of range: ids in [0, n_chunks = %d), "
                                "strictly ascending", who, h, o, out_h[o], L->n_chunks);
    }
    for (int h = 0; h < L->g.Hkv; h++) {
        const kvb_bf16 *Xh = X + (int64_t)h * S * D;
        kvb_bf16 *bh = buf + (int64_t)h * NB * D;
        /* the local window: the last n_local prompt tokens, first in the buffer */
        memcpy(bh, Xh + (int64_t)L->n_chunks * c * D, row * (size_t)L->n_local);
        /* the outlier chunks' exact rows, ascending chunk id */
        for (int o = 0; o < n_out; o++)
            memcpy(bh + ((int64_t)L->outlier_start + (int64_t)o * c) * D,
                   Xh + (int64_t)outliers[(int64_t)h * n_out + o] * c * D, row * (size_t)c);
    }
    return KVB_OK;
}

int ref_shadowkv_host_values(const kvb_bf16 *V, const shadowkv_layout *L, kvb_bf16 *Vh)
{
    const int S = L->S, c = L->c, D = L->g.D;
    const int64_t chunk = (int64_t)c * D;
    if (gather_layout_check(&L->g, "ref_shadowkv_host_values")) return KVB_EINVAL;
    for (int h = 0; h < L->g.Hkv; h++)
        for (int k = 0; k < L->n_chunks; k++)
            memcpy(Vh + ((int64_t)h * L->g.host_stride + k) * chunk, V + (int64_t)h * S * D + (int64_t)k * chunk,
                   sizeof(kvb_bf16) * (size_t)chunk);
    return KVB_OK;
}

void ref_shadowkv_rope_keys(const float *Kpre, const kvb_bf16 *cos_sin, int S, int Hkv, int D, kvb_bf16 *K)
{
    const int half = D / 2;
#pragma omp parallel for schedule(static)
    for (int s = 0; s < S; s++)
        for (int h = 0; h < Hkv; h++) {
            const float *x = Kpre + ((int64_t)s * Hkv + h) * D;
            const kvb_bf16 *cs = cos_sin + (int64_t)s * D;
            kvb_bf16 *y = K + ((int64_t)h * S + s) * D;
            for (int i = 0; i < half; i++) {
                const double co = kvb_bf16_to_double(cs[i]), si = kvb_bf16_to_double(cs[half + i]);
                y[i] = kvb_double_to_bf16(x[i] * co - x[i + half] * si);
                y[i + half] = kvb_double_to_bf16(x[i + half] * co + x[i] * si);
            }
        }
}
