/* test_ref_shadowkv.c: the C reference of ShadowKV's prefill (kernels/shadowkv/NOTES.md, steps 1-5): the
 * SVD factors against Eckart-Young on matrices with known singular values, landmarks and outliers on inputs
 * worked by hand (ties, zero vectors, S not a multiple of c), the buffer and host layouts, and every
 * rejection naming its parameter. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "harness/core/tensor.h"
#include "reference/shadowkv.h"
#include "tests/testlib.h"

/* ---- helpers ---------------------------------------------------------------------------------- */

static double frobenius(const float *x, int64_t n)
{
    double s = 0.0;
    for (int64_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return sqrt(s);
}

/* q [rows, cols] (row-major, rows >= cols) with orthonormal columns: modified Gram-Schmidt, run
 * twice ("twice is enough") on normal samples, in double. */
static void orthonormal_columns(double *q, int rows, int cols, uint64_t seed)
{
    for (int64_t i = 0; i < (int64_t)rows * cols; i++) q[i] = kvb_normal01(seed, 7, (uint64_t)i);
    for (int pass = 0; pass < 2; pass++)
        for (int j = 0; j < cols; j++) {
            for (int p = 0; p < j; p++) {
                double dot = 0.0;
                for (int i = 0; i < rows; i++) dot += q[(int64_t)i * cols + p] * q[(int64_t)i * cols + j];
                for (int i = 0; i < rows; i++) q[(int64_t)i * cols + j] -= dot * q[(int64_t)i * cols + p];
            }
            double norm = 0.0;
            for (int i = 0; i < rows; i++) norm += q[(int64_t)i * cols + j] * q[(int64_t)i * cols + j];
            norm = sqrt(norm);
            for (int i = 0; i < rows; i++) q[(int64_t)i * cols + j] /= norm;
        }
}

/* A [S, N] = Q1 diag(sigma) Q2^T with Q1 [S, k], Q2 [N, k] orthonormal, k = min(S, N): a matrix whose
 * singular values are sigma (up to the fp32 rounding of A). */
static void matrix_with_spectrum(float *A, int S, int N, const double *sigma, uint64_t seed)
{
    int k = S < N ? S : N;
    double *q1 = malloc(sizeof(double) * (size_t)S * k), *q2 = malloc(sizeof(double) * (size_t)N * k);
    orthonormal_columns(q1, S, k, seed);
    orthonormal_columns(q2, N, k, seed + 1);
    for (int t = 0; t < S; t++)
        for (int n = 0; n < N; n++) {
            double a = 0.0;
            for (int j = 0; j < k; j++) a += q1[(int64_t)t * k + j] * sigma[j] * q2[(int64_t)n * k + j];
            A[(int64_t)t * N + n] = (float)a;
        }
    free(q1), free(q2);
}

typedef struct factors {
    float *U, *SV;
    double *s;
    double err, opt;
} factors;

/* Factor Kpre at rank r; measure the reconstruction error and the optimal one. */
static factors factor(const float *Kpre, int S, int Hkv, int D, int r)
{
    int N = Hkv * D, k = S < N ? S : N;
    factors f = {malloc(sizeof(float) * (size_t)S * r), malloc(sizeof(float) * (size_t)Hkv * r * D),
                 malloc(sizeof(double) * (size_t)k), 0, 0};
    if (ref_shadowkv_lowrank(Kpre, S, Hkv, D, r, f.U, f.SV, f.s) != KVB_OK) fail_msg("lowrank: %s", kvb_last_error());
    if (ref_shadowkv_lowrank_error(Kpre, S, Hkv, D, r, f.U, f.SV, &f.err) != KVB_OK)
        fail_msg("lowrank_error: %s", kvb_last_error());
    f.opt = shadowkv_optimal_error(f.s, k, r);
    return f;
}

static void factors_free(factors *f) { free(f->U), free(f->SV), free(f->s); }

/* ---- step 1: SVD ------------------------------------------------------------------------------ */

/* r = min(S, Hkv*D) reproduces Kpre: tall (S > N) and wide (S < N) */
static void test_full_rank_reconstructs(void **state)
{
    (void)state;
    const int shapes[][3] = {{200, 2, 32}, {40, 2, 32}, {64, 1, 64}}; /* S, Hkv, D */
    for (int i = 0; i < 3; i++) {
        int S = shapes[i][0], Hkv = shapes[i][1], D = shapes[i][2], N = Hkv * D, r = S < N ? S : N;
        float *K = malloc(sizeof(float) * (size_t)S * N);
        kvb_fill_f32_normal(K, (int64_t)S * N, 11 + i, 1, 0, 0.0, 1.0);
        factors f = factor(K, S, Hkv, D, r);
        double rel = f.err / frobenius(K, (int64_t)S * N);
        if (!(rel <= 1e-5)) fail_msg("S=%d N=%d r=%d: relative error %g > 1e-5", S, N, r, rel);
        assert_true(f.opt == 0.0);
        /* the singular values of a full-rank factorization hold the whole norm */
        double ss = 0.0;
        for (int j = 0; j < r; j++) ss += f.s[j] * f.s[j];
        assert_true(fabs(sqrt(ss) / frobenius(K, (int64_t)S * N) - 1.0) < 1e-12);
        factors_free(&f);
        free(K);
    }
}

/* Eckart-Young on a normal matrix (a flat spectrum): the truncated SVD's error is the tail norm */
static void test_eckart_young_random(void **state)
{
    (void)state;
    const int S = 300, Hkv = 2, D = 32, N = Hkv * D;
    float *K = malloc(sizeof(float) * (size_t)S * N);
    kvb_fill_f32_normal(K, (int64_t)S * N, 5, 2, 0, 0.0, 1.0);
    const int ranks[] = {1, 16, 40, 63};
    for (int i = 0; i < 4; i++) {
        factors f = factor(K, S, Hkv, D, ranks[i]);
        for (int j = 1; j < N; j++) assert_true(f.s[j] <= f.s[j - 1]); /* descending */
        if (!(fabs(f.err / f.opt - 1.0) <= 1e-4))
            fail_msg("r=%d: ||K - U*SV|| = %.9g vs tail norm %.9g", ranks[i], f.err, f.opt);
        factors_free(&f);
    }
    free(K);
}

/* Low rank plus noise, the shape the ShadowKV paper shows for pre-RoPE keys: sigma_j = 50 e^{-j/4}
 * + 0.1, built from known orthogonal factors. The computed singular values are sigma's; the error at
 * rank r is the tail norm of sigma; and the bf16-rounded factors (as stored) are reported against
 * the optimum. */
static void test_eckart_young_low_rank_plus_noise(void **state)
{
    (void)state;
    const int S = 512, Hkv = 2, D = 64, N = Hkv * D;
    double sigma[128];
    for (int j = 0; j < N; j++) sigma[j] = 50.0 * exp(-j / 4.0) + 0.1;
    float *K = malloc(sizeof(float) * (size_t)S * N);
    matrix_with_spectrum(K, S, N, sigma, 42);
    const int ranks[] = {4, 16, 32};
    for (int i = 0; i < 3; i++) {
        int r = ranks[i];
        factors f = factor(K, S, Hkv, D, r);
        for (int j = 0; j < N; j++)
            if (!(fabs(f.s[j] - sigma[j]) <= 1e-5 * sigma[0]))
                fail_msg("s[%d] = %.9g, built with %.9g", j, f.s[j], sigma[j]);
        double known_tail = shadowkv_optimal_error(sigma, N, r);
        if (!(fabs(f.opt / known_tail - 1.0) <= 1e-4)) fail_msg("r=%d: tail %.9g vs known %.9g", r, f.opt, known_tail);
        if (!(fabs(f.err / f.opt - 1.0) <= 1e-4)) fail_msg("r=%d: ||K - U*SV|| = %.9g vs tail norm %.9g", r, f.err, f.opt);
        /* the factors as stored (bf16), converted back exactly */
        kvb_bf16 *u16 = malloc(2 * (size_t)S * r), *sv16 = malloc(2 * (size_t)Hkv * r * D);
        float *u = malloc(4 * (size_t)S * r), *sv = malloc(4 * (size_t)Hkv * r * D);
        shadowkv_round_bf16(f.U, (int64_t)S * r, u16);
        shadowkv_round_bf16(f.SV, (int64_t)Hkv * r * D, sv16);
        for (int64_t j = 0; j < (int64_t)S * r; j++) u[j] = kvb_bf16_to_float(u16[j]);
        for (int64_t j = 0; j < (int64_t)Hkv * r * D; j++) sv[j] = kvb_bf16_to_float(sv16[j]);
        double err16;
        assert_int_equal(ref_shadowkv_lowrank_error(K, S, Hkv, D, r, u, sv, &err16), KVB_OK);
        print_message("low rank + noise, S=%d N=%d r=%d: optimum %.6g, fp32 factors x%.6f, bf16 factors x%.6f\n", S,
                      N, r, f.opt, f.err / f.opt, err16 / f.opt);
        assert_true(err16 >= f.opt * (1.0 - 1e-9)); /* nothing beats the optimum */
        free(u16), free(sv16), free(u), free(sv);
        factors_free(&f);
    }
    free(K);
}

/* the error of other factors: a zero U leaves ||K||, a perturbed SV does worse than the optimum */
static void test_lowrank_error_of_other_factors(void **state)
{
    (void)state;
    const int S = 50, Hkv = 1, D = 16, r = 4;
    float *K = malloc(sizeof(float) * S * D);
    kvb_fill_f32_normal(K, S * D, 9, 3, 0, 0.0, 1.0);
    factors f = factor(K, S, Hkv, D, r);
    float *zero = calloc((size_t)S * r, sizeof(float));
    double e;
    assert_int_equal(ref_shadowkv_lowrank_error(K, S, Hkv, D, r, zero, f.SV, &e), KVB_OK);
    assert_true(fabs(e / frobenius(K, S * D) - 1.0) < 1e-12);
    f.SV[3] += 5.0f; /* adds 5 U[:, 0] e_3^T, orthogonal to the residual: err^2 = opt^2 + 25 */
    assert_int_equal(ref_shadowkv_lowrank_error(K, S, Hkv, D, r, f.U, f.SV, &e), KVB_OK);
    if (!(fabs(e / sqrt(f.opt * f.opt + 25.0) - 1.0) < 1e-5)) fail_msg("err %.9g, opt %.9g", e, f.opt);
    free(zero), free(K);
    factors_free(&f);
}

static void test_lowrank_rejects_bad_input(void **state)
{
    (void)state;
    const int S = 10, Hkv = 2, D = 4; /* min(S, Hkv*D) = 8 */
    float K[80], U[80] = {0}, SV[80] = {0};
    kvb_fill_f32_normal(K, 80, 1, 1, 0, 0.0, 1.0);
    assert_int_equal(ref_shadowkv_lowrank(K, S, Hkv, D, 0, U, SV, NULL), KVB_EINVAL);
    assert_error_mentions("ref_shadowkv_lowrank", "r=0 out of range [1, min(S, Hkv*D) = min(10, 8) = 8]");
    assert_int_equal(ref_shadowkv_lowrank(K, S, Hkv, D, 9, U, SV, NULL), KVB_EINVAL);
    assert_error_mentions("r=9 out of range [1, min(S, Hkv*D) = min(10, 8) = 8]");
    assert_int_equal(ref_shadowkv_lowrank(K, 4, Hkv, D, 5, U, SV, NULL), KVB_EINVAL); /* wide: min is S */
    assert_error_mentions("r=5 out of range [1, min(S, Hkv*D) = min(4, 8) = 4]");
    assert_int_equal(ref_shadowkv_lowrank(K, S, 0, D, 1, U, SV, NULL), KVB_EINVAL);
    assert_error_mentions("Hkv=0 out of range");
    assert_int_equal(ref_shadowkv_lowrank(K, S, Hkv, 2048, 1, U, SV, NULL), KVB_EINVAL);
    assert_error_mentions("D=2048 out of range [1, 1024]");
    assert_int_equal(ref_shadowkv_lowrank(K, 0, Hkv, D, 1, U, SV, NULL), KVB_EINVAL);
    assert_error_mentions("S=0 out of range");
    assert_int_equal(ref_shadowkv_lowrank(K, 1 << 22, 8, 128, 160, U, SV, NULL), KVB_EINVAL);
    assert_error_mentions("S*Hkv*D", "32-bit");
    K[3 * 8 + 5] = NAN;
    assert_int_equal(ref_shadowkv_lowrank(K, S, Hkv, D, 2, U, SV, NULL), KVB_EINVAL);
    assert_error_mentions("Kpre[3, 5]", "not finite");
    K[3 * 8 + 5] = INFINITY;
    assert_int_equal(ref_shadowkv_lowrank(K, S, Hkv, D, 2, U, SV, NULL), KVB_EINVAL);
    assert_error_mentions("Kpre[3, 5] = inf is not finite");
    K[3 * 8 + 5] = 0.0f;
    U[7] = NAN;
    double e;
    assert_int_equal(ref_shadowkv_lowrank_error(K, S, Hkv, D, 2, U, SV, &e), KVB_EINVAL);
    assert_error_mentions("ref_shadowkv_lowrank_error", "U[3, 1]", "not finite");
    assert_int_equal(ref_shadowkv_lowrank_error(K, S, Hkv, D, 9, U, SV, &e), KVB_EINVAL);
    assert_error_mentions("r=9 out of range");
}

/* ---- steps 2-4: landmarks and outliers -------------------------------------------------------- */

/* Hkv=2, D=2, c=3, local_chunks=1, S=20 (not a multiple of c): n_chunks = floor(20/3) - 1 = 5,
 * local window = tokens 15..19 (n_local = 5 = 1 chunk + 20 mod 3), outlier_chunks = 2, Lm = 3.
 * Head 0, min cosine with the chunk mean:
 *   ch0 (1,0)(1,0)(1,0)      mean (1,0)     1
 *   ch1 (1,1)(1,-1)(1,0)     mean (1,0)     1/sqrt2
 *   ch2 (1,2)(1,-2)(1,0)     mean (1,0)     1/sqrt5          smallest
 *   ch3 (2,0)(2,2)(2,-2)     mean (2,0)     1/sqrt2          ties ch1: ch1 (lower id) is the outlier
 *   ch4 (3,1)(3,1)(3,2)      mean (3,4/3)   cos((3,2), mean) = 0.9856223
 *   -> outliers [1, 2], landmark_idx [0, 3, 4]
 * Head 1 (zero vectors: cosine 0):
 *   ch0 (0,0)(1,0)(-1,0)     mean (0,0)     0  (zero mean)
 *   ch1 (1,0)(0,0)(2,0)      mean (1,0)     0  (zero key)    ties ch0: ch0 is the outlier
 *   ch2 (1,1)(1,1)(1,1)      mean (1,1)     1
 *   ch3 (1,-1)(-1,1)(1,-1)   mean (1/3,-1/3) -1              smallest
 *   ch4 (1,0)(1,0)(1,0)      mean (1,0)     1
 *   -> outliers [0, 3], landmark_idx [1, 2, 4] */
static const double hand_keys[2][15][2] = {
    {{1, 0}, {1, 0}, {1, 0}, {1, 1}, {1, -1}, {1, 0}, {1, 2}, {1, -2}, {1, 0}, {2, 0}, {2, 2}, {2, -2}, {3, 1}, {3, 1}, {3, 2}},
    {{0, 0}, {1, 0}, {-1, 0}, {1, 0}, {0, 0}, {2, 0}, {1, 1}, {1, 1}, {1, 1}, {1, -1}, {-1, 1}, {1, -1}, {1, 0}, {1, 0}, {1, 0}},
};

static void hand_input(kvb_bf16 *K /* [2, 20, 2] */)
{
    for (int h = 0; h < 2; h++)
        for (int t = 0; t < 20; t++)
            for (int d = 0; d < 2; d++) {
                /* the local window (tokens 15..19) gets values that would be outliers if it were scored */
                double v = t < 15 ? hand_keys[h][t][d] : (d == 0 ? -100.0 : 50.0 * t);
                K[(h * 20 + t) * 2 + d] = kvb_double_to_bf16(v);
            }
}

static void test_chunks_by_hand(void **state)
{
    (void)state;
    kvb_bf16 K[2 * 20 * 2], lm[2 * 3 * 2];
    int32_t idx[2 * 3], out[2 * 2];
    float mc[2 * 5];
    hand_input(K);
    int n_chunks, Lm;
    assert_int_equal(shadowkv_chunk_counts(20, 3, 1, 2, &n_chunks, &Lm, "t"), KVB_OK);
    assert_int_equal(n_chunks, 5);
    assert_int_equal(Lm, 3);
    assert_int_equal(ref_shadowkv_chunks(K, 2, 20, 2, 3, 1, 2, lm, idx, out, mc), KVB_OK);
    int32_t want_out[4] = {1, 2, 0, 3}, want_idx[6] = {0, 3, 4, 1, 2, 4};
    assert_memory_equal(out, want_out, sizeof want_out);
    assert_memory_equal(idx, want_idx, sizeof want_idx);
    /* the landmarks: the means of chunks 0, 3, 4 (head 0) and 1, 2, 4 (head 1), bf16 */
    const double want_lm[2][3][2] = {{{1, 0}, {2, 0}, {3, 4.0 / 3.0}}, {{1, 0}, {1, 1}, {1, 0}}};
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 3; l++)
            for (int d = 0; d < 2; d++) assert_int_equal(lm[(h * 3 + l) * 2 + d], kvb_double_to_bf16(want_lm[h][l][d]));
    assert_int_equal(lm[2 * 2 + 1], 0x3FAB); /* 4/3 rounded once: 1.3359375 */
    /* the scores */
    const double want_mc[2][5] = {{1, 1 / sqrt(2.0), 1 / sqrt(5.0), 1 / sqrt(2.0), -1}, {0, 0, 1, -1, 1}};
    for (int h = 0; h < 2; h++)
        for (int k = 0; k < 5; k++) {
            if (h == 0 && k == 4) {
                assert_true(fabs(mc[4] - 0.9856223) < 1e-6);
                continue;
            }
            if (!(fabs(mc[h * 5 + k] - want_mc[h][k]) <= 1e-6)) fail_msg("min_cos[%d][%d] = %.9g, want %.9g", h, k, mc[h * 5 + k], want_mc[h][k]);
        }
    assert_true(mc[1] == mc[3]); /* an exact tie, settled by the chunk id */
    /* min_cos is optional */
    assert_int_equal(ref_shadowkv_chunks(K, 2, 20, 2, 3, 1, 2, lm, idx, out, NULL), KVB_OK);
    assert_memory_equal(out, want_out, sizeof want_out);
}

/* The tie rule alone: within a chunk every key is m*(3, 4, 0, 0) (m = chunk id + 1), so every
 * min cosine is exactly 25m^2 / (5m * 5m) = 1: the outliers are the lowest chunk ids. And the edges: no outliers (Lm = n_chunks), every chunk an outlier (Lm = 0). */
static void test_chunks_ties_and_edges(void **state)
{
    (void)state;
    enum { S = 40, D = 4, c = 4 };
    kvb_bf16 K[S * D], lm[10 * D];
    int32_t idx[10], out[10];
    for (int t = 0; t < S; t++)
        for (int d = 0; d < D; d++) K[t * D + d] = kvb_double_to_bf16(d == 0 ? 3.0 * (1 + t / c) : d == 1 ? 4.0 * (1 + t / c) : 0.0);
    /* local_chunks = 2: n_chunks = 8; S multiple of c: n_local = 8 */
    assert_int_equal(ref_shadowkv_chunks(K, 1, S, D, c, 2, 3, lm, idx, out, NULL), KVB_OK);
    int32_t want_out[3] = {0, 1, 2}, want_idx[5] = {3, 4, 5, 6, 7};
    assert_memory_equal(out, want_out, sizeof want_out);
    assert_memory_equal(idx, want_idx, sizeof want_idx);
    for (int l = 0; l < 5; l++) assert_int_equal(lm[l * D + 1], kvb_double_to_bf16(4.0 * (1 + 3 + l)));
    assert_int_equal(ref_shadowkv_chunks(K, 1, S, D, c, 2, 0, lm, idx, out, NULL), KVB_OK);
    for (int l = 0; l < 8; l++) assert_int_equal(idx[l], l);
    assert_int_equal(ref_shadowkv_chunks(K, 1, S, D, c, 2, 8, lm, idx, out, NULL), KVB_OK);
    for (int o = 0; o < 8; o++) assert_int_equal(out[o], o);
    /* local_chunks = 0, S = c: a single chunk, no local window */
    assert_int_equal(ref_shadowkv_chunks(K, 1, c, D, c, 0, 0, lm, idx, out, NULL), KVB_OK);
    assert_int_equal(idx[0], 0);
}

/* On random keys: the outliers are exactly the outlier_chunks smallest min_cos (a brute-force count),
 * both lists ascending, together a partition of the chunks */
static void test_chunks_properties_random(void **state)
{
    (void)state;
    enum { Hkv = 3, S = 1003, D = 16, c = 8, local = 4, n_out = 20 };
    const int n_chunks = S / c - local, Lm = n_chunks - n_out;
    kvb_bf16 *K = malloc(2 * (size_t)Hkv * S * D), *lm = malloc(2 * (size_t)Hkv * Lm * D);
    int32_t *idx = malloc(4 * (size_t)Hkv * Lm), *out = malloc(4 * (size_t)Hkv * n_out);
    float *mc = malloc(4 * (size_t)Hkv * n_chunks);
    kvb_fill_bf16_normal(K, (int64_t)Hkv * S * D, 3, 4, 0, 0.0, 1.0);
    assert_int_equal(ref_shadowkv_chunks(K, Hkv, S, D, c, local, n_out, lm, idx, out, mc), KVB_OK);
    for (int h = 0; h < Hkv; h++) {
        char seen[200] = {0};
        for (int o = 0; o < n_out; o++) {
            int k = out[h * n_out + o];
            assert_true(k >= 0 && k < n_chunks && !seen[k]);
            if (o) assert_true(k > out[h * n_out + o - 1]);
            seen[k] = 1;
            int below = 0; /* chunks strictly worse than an outlier: all must be outliers too */
            for (int j = 0; j < n_chunks; j++) below += mc[h * n_chunks + j] < mc[h * n_chunks + k];
            assert_true(below < n_out);
        }
        for (int l = 0; l < Lm; l++) {
            int k = idx[h * Lm + l];
            assert_true(k >= 0 && k < n_chunks && !seen[k]);
            if (l) assert_true(k > idx[h * Lm + l - 1]);
            seen[k] = 2;
            /* landmark = the chunk's mean, recomputed here */
            for (int d = 0; d < D; d++) {
                double m = 0.0;
                for (int i = 0; i < c; i++) m += kvb_bf16_to_double(K[((int64_t)h * S + k * c + i) * D + d]);
                assert_int_equal(lm[((int64_t)h * Lm + l) * D + d], kvb_double_to_bf16(m / c));
            }
        }
    }
    free(K), free(lm), free(idx), free(out), free(mc);
}

static void test_chunks_rejects_bad_input(void **state)
{
    (void)state;
    kvb_bf16 K[2 * 20 * 2], lm[64];
    int32_t idx[64], out[64];
    hand_input(K);
    /* n_chunks = 5: 6 outliers are too many */
    assert_int_equal(ref_shadowkv_chunks(K, 2, 20, 2, 3, 1, 6, lm, idx, out, NULL), KVB_EINVAL);
    assert_error_mentions("ref_shadowkv_chunks", "outlier_chunks=6 out of range [0, n_chunks", "= 5]");
    assert_int_equal(ref_shadowkv_chunks(K, 2, 20, 2, 3, 1, -1, lm, idx, out, NULL), KVB_EINVAL);
    assert_error_mentions("outlier_chunks=-1 out of range");
    /* S < c*(local_chunks+1): 20 < 3*7 */
    assert_int_equal(ref_shadowkv_chunks(K, 2, 20, 2, 3, 6, 0, lm, idx, out, NULL), KVB_EINVAL);
    assert_error_mentions("S=20 out of range [c*(local_chunks+1) = 3*7 = 21");
    assert_int_equal(ref_shadowkv_chunks(K, 2, 20, 2, 0, 1, 0, lm, idx, out, NULL), KVB_EINVAL);
    assert_error_mentions("c=0 out of range [1, 4096]");
    assert_int_equal(ref_shadowkv_chunks(K, 2, 20, 2, 3, -1, 0, lm, idx, out, NULL), KVB_EINVAL);
    assert_error_mentions("local_chunks=-1 out of range");
    assert_int_equal(ref_shadowkv_chunks(K, 0, 20, 2, 3, 1, 0, lm, idx, out, NULL), KVB_EINVAL);
    assert_error_mentions("Hkv=0 out of range [1, 256]");
    /* a non-finite key, also in the local window */
    K[(1 * 20 + 7) * 2 + 1] = 0x7FC0; /* NaN at h=1, t=7, d=1 */
    assert_int_equal(ref_shadowkv_chunks(K, 2, 20, 2, 3, 1, 2, lm, idx, out, NULL), KVB_EINVAL);
    assert_error_mentions("K[h=1, t=7, d=1] is not finite");
    hand_input(K);
    K[(0 * 20 + 18) * 2 + 0] = 0xFF80; /* -inf at h=0, t=18 (local window) */
    assert_int_equal(ref_shadowkv_chunks(K, 2, 20, 2, 3, 1, 2, lm, idx, out, NULL), KVB_EINVAL);
    assert_error_mentions("K[h=0, t=18, d=0] is not finite (bf16 0xff80)");
}

/* ---- the GPU buffer and the host values ------------------------------------------------------- */

static void test_layout_and_fill(void **state)
{
    (void)state;
    /* S=20, c=3, local 1, outliers 2 (n_chunks 5, n_local 5), M=3, 4 decode tokens, D=8 */
    enum { Hkv = 2, S = 20, D = 8, c = 3 };
    shadowkv_layout L;
    assert_int_equal(shadowkv_layout_make(&L, 4, Hkv, D, S, c, 1, 2, 3, 4), KVB_OK);
    assert_int_equal(L.n_chunks, 5);
    assert_int_equal(L.Lm, 3);
    assert_int_equal(L.n_local, 5);
    assert_int_equal(L.outlier_start, 5);
    assert_int_equal(L.g.sparse_start, 11);
    assert_int_equal(L.decode_start, 20);
    assert_int_equal(L.g.NB, 24);
    assert_int_equal(L.g.B, 4);
    assert_int_equal(L.g.M, 3);
    assert_int_equal(L.g.host_chunks, 5);
    assert_int_equal(L.g.host_stride, 5);
    assert_int_equal(gather_layout_check(&L.g, "t"), KVB_OK);
    /* ShadowKV's defaults at 128K (Llama-3-8B): 32 local + 384 outlier tokens before the sparse region */
    shadowkv_layout big;
    assert_int_equal(shadowkv_layout_make(&big, 1, 8, 128, 131072, 8, 4, 48, 256, 1024), KVB_OK);
    assert_int_equal(big.g.sparse_start, 416);
    assert_int_equal(big.g.NB, 416 + 2048 + 1024);
    assert_int_equal(big.Lm, 16384 - 4 - 48);

    /* X[h, t, d] = 100*h + t + d/4 (rounded to bf16); outliers from the hand case above */
    kvb_bf16 X[Hkv * S * D], buf[Hkv * 24 * D], Vh[Hkv * 5 * c * D];
    for (int h = 0; h < Hkv; h++)
        for (int t = 0; t < S; t++)
            for (int d = 0; d < D; d++) X[(h * S + t) * D + d] = kvb_double_to_bf16(100 * h + t + 0.25 * d);
    for (int i = 0; i < Hkv * 24 * D; i++) buf[i] = KVB_BF16_NAN;
    int32_t outliers[4] = {1, 2, 0, 3};
    assert_int_equal(ref_shadowkv_fill_buffer(X, outliers, &L, buf), KVB_OK);
    for (int h = 0; h < Hkv; h++) {
        int want_tok[11] = {15, 16, 17, 18, 19}; /* local window, then the outlier chunks' tokens */
        for (int o = 0; o < 2; o++)
            for (int i = 0; i < c; i++) want_tok[5 + o * c + i] = outliers[h * 2 + o] * c + i;
        for (int j = 0; j < 11; j++)
            assert_memory_equal(buf + (h * 24 + j) * D, X + (h * S + want_tok[j]) * D, 2 * D);
        for (int j = 11; j < 24; j++) /* sparse and decode regions untouched */
            for (int d = 0; d < D; d++) assert_int_equal(buf[(h * 24 + j) * D + d], KVB_BF16_NAN);
    }
    assert_int_equal(ref_shadowkv_host_values(X, &L, Vh), KVB_OK);
    for (int h = 0; h < Hkv; h++)
        for (int k = 0; k < 5; k++) /* chunk k of head h: tokens k*c .. k*c + c - 1 */
            assert_memory_equal(Vh + (h * 5 + k) * c * D, X + (h * S + k * c) * D, 2 * c * D);
    /* bad outlier lists */
    int32_t bad[4] = {1, 5, 0, 3};
    assert_int_equal(ref_shadowkv_fill_buffer(X, bad, &L, buf), KVB_EINVAL);
    assert_error_mentions("outliers[0][1]=5 out of range", "n_chunks = 5");
    int32_t unsorted[4] = {1, 2, 3, 0};
    assert_int_equal(ref_shadowkv_fill_buffer(X, unsorted, &L, buf), KVB_EINVAL);
    assert_error_mentions("outliers[1][1]=0", "strictly ascending");
}

static void test_layout_rejects_bad_input(void **state)
{
    (void)state;
    shadowkv_layout L;
    /* M above Lm = 3 */
    assert_int_equal(shadowkv_layout_make(&L, 1, 2, 8, 20, 3, 1, 2, 4, 0), KVB_EINVAL);
    assert_error_mentions("shadowkv_layout", "M=4 out of range [1, min(4096, Lm", "= 3)]");
    assert_int_equal(shadowkv_layout_make(&L, 1, 2, 8, 20, 3, 1, 2, 0, 0), KVB_EINVAL);
    assert_error_mentions("M=0 out of range");
    assert_int_equal(shadowkv_layout_make(&L, 1, 2, 8, 20, 3, 1, 6, 1, 0), KVB_EINVAL);
    assert_error_mentions("outlier_chunks=6 out of range [0, n_chunks");
    assert_int_equal(shadowkv_layout_make(&L, 1, 2, 8, 5, 3, 1, 0, 1, 0), KVB_EINVAL);
    assert_error_mentions("S=5 out of range [c*(local_chunks+1) = 3*2 = 6");
    assert_int_equal(shadowkv_layout_make(&L, 1, 2, 8, 20, 3, 1, 2, 1, -1), KVB_EINVAL);
    assert_error_mentions("decode_capacity=-1 out of range");
    /* the gather_layout's own rules: chunk bytes c*D*2 = 3*4*2 = 24 not a multiple of 16 */
    assert_int_equal(shadowkv_layout_make(&L, 1, 2, 4, 20, 3, 1, 2, 1, 0), KVB_EINVAL);
    assert_error_mentions("shadowkv_layout", "chunk bytes");
    assert_int_equal(shadowkv_layout_make(&L, 0, 2, 8, 20, 3, 1, 2, 1, 0), KVB_EINVAL);
    assert_error_mentions("B=0 out of range");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_full_rank_reconstructs),
        cmocka_unit_test(test_eckart_young_random),
        cmocka_unit_test(test_eckart_young_low_rank_plus_noise),
        cmocka_unit_test(test_lowrank_error_of_other_factors),
        cmocka_unit_test(test_lowrank_rejects_bad_input),
        cmocka_unit_test(test_chunks_by_hand),
        cmocka_unit_test(test_chunks_ties_and_edges),
        cmocka_unit_test(test_chunks_properties_random),
        cmocka_unit_test(test_chunks_rejects_bad_input),
        cmocka_unit_test(test_layout_and_fill),
        cmocka_unit_test(test_layout_rejects_bad_input),
    };
    return cmocka_run_group_tests_name("reference shadowkv", tests, NULL, NULL);
}
