/* test_gpu_shadowkv.c: ShadowKV's prefill on the GPU (kernels/shadowkv/shadowkv.h) against the reference, one
 * test per check-tier case of cases/shadowkv.cases (factorization bound, landmarks and outliers), each
 * validated twice on one workspace (skipped without a device); the small eigensolver of its
 * Rayleigh-Ritz step on matrices with known eigenpairs (small_eig.h, on a device); and the APIs'
 * refusals, which come before any handle or launch and need no device. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "harness/core/op.h"
#include "tests/testlib.h"
#if KVB_HAVE_CUDA
#include "harness/core/gpu.h"
#include "kernels/shadowkv/shadowkv.h"
#include "kernels/shadowkv/small_eig.h"
#include "reference/shadowkv.h"
#endif

#if KVB_HAVE_CUDA
static void test_lowrank_plan_refuses(void **state)
{
    (void)state;
    shadowkv_lowrank_plan p;
    assert_int_equal(shadowkv_lowrank_plan_make(&p, 100, 1, 16, 17, SHADOWKV_EIG_TOP_R, 0), KVB_EINVAL);
    assert_error_mentions("r=17 out of range [1, 16]");
    assert_int_equal(shadowkv_lowrank_plan_make(&p, 10, 2, 16, 11, SHADOWKV_EIG_TOP_R, 0), KVB_EINVAL);
    assert_error_mentions("r=11 out of range [1, 10]");
    assert_int_equal(shadowkv_lowrank_plan_make(&p, 100, 2, 16, 0, SHADOWKV_EIG_TOP_R, 0), KVB_EINVAL);
    assert_error_mentions("r=0 out of range");
    assert_int_equal(shadowkv_lowrank_plan_make(&p, 100000, 64, 256, 160, SHADOWKV_EIG_TOP_R, 0), KVB_EINVAL);
    assert_error_mentions("Hkv*D=16384 out of range [1, 8192]");
    assert_int_equal(shadowkv_lowrank(&p, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0), KVB_EINVAL);
    assert_error_mentions("the plan was not made");
}

static void test_small_eig_refuses(void **state)
{
    (void)state;
    float *f = (float *)(uintptr_t)0x1000;
    assert_int_equal(small_eig_top(f, 0, 1, f, f, f, f, 0), KVB_EINVAL);
    assert_error_mentions("k=0 out of range [1, 256]");
    assert_int_equal(small_eig_top(f, 257, 1, f, f, f, f, 0), KVB_EINVAL);
    assert_error_mentions("k=257 out of range [1, 256]");
    assert_int_equal(small_eig_top(f, 8, 9, f, f, f, f, 0), KVB_EINVAL);
    assert_error_mentions("r=9 out of range [1, k=8]");
    assert_int_equal(small_eig_top(NULL, 8, 2, f, f, f, f, 0), KVB_EINVAL);
    assert_error_mentions("NULL");
}

/* T (k x k, column-major) -> the r largest eigenpairs, their check copied back */
static void small_eig_run(const float *T, int k, int r, float *W, float *Z, float *check)
{
    float *dT = kvb_dmalloc(sizeof(float) * (size_t)k * k), *dW = kvb_dmalloc(sizeof(float) * (size_t)r);
    float *dZ = kvb_dmalloc(sizeof(float) * (size_t)k * r), *dc = kvb_dmalloc(sizeof(float) * SMALL_EIG_CHECK_N);
    void *ws = kvb_dmalloc(small_eig_workspace_bytes(k, r));
    cudaStream_t s = kvb_stream_create();
    kvb_h2d(dT, T, sizeof(float) * (size_t)k * k, s);
    assert_int_equal(small_eig_top(dT, k, r, dW, dZ, dc, ws, s), KVB_OK);
    kvb_d2h(W, dW, sizeof(float) * (size_t)r, s), kvb_d2h(Z, dZ, sizeof(float) * (size_t)k * r, s);
    kvb_d2h(check, dc, sizeof(float) * SMALL_EIG_CHECK_N, s);
    kvb_sync(s);
    kvb_stream_destroy(s);
    kvb_dfree(dT), kvb_dfree(dW), kvb_dfree(dZ), kvb_dfree(dc), kvb_dfree(ws);
}

/* The path tridiagonal Laplacian rotated by a Householder reflection (a dense T with the known,
 * distinct eigenvalues 2 - 2 cos(pi m / (k + 1))): the check passes and the eigenvalues are within
 * fp32's backward error; the identity (every eigenvalue 1, which inverse iteration cannot separate): the check fails,
 * as the caller's syevd fallback needs it to. */
static void test_small_eig_known(void **state)
{
    (void)state;
    if (!kvb_gpu_available()) skip();
    const int ks[] = {1, 2, 3, 33, 240, 256};
    for (int t = 0; t < (int)(sizeof ks / sizeof ks[0]); t++) {
        const int k = ks[t], r = k > 160 ? 160 : k;
        float *T = calloc((size_t)k * k, sizeof *T), *W = malloc(sizeof *W * r), *Z = malloc(sizeof *Z * (size_t)k * r);
        double *L = calloc((size_t)k * k, sizeof *L), *u = malloc(sizeof *u * k), un = 0;
        for (int i = 0; i < k; i++) {
            L[(size_t)i * k + i] = 2;
            if (i + 1 < k) L[(size_t)i * k + i + 1] = L[(size_t)(i + 1) * k + i] = -1;
            u[i] = 1.0 + 0.37 * i, un += u[i] * u[i];
        }
        /* T = H L H, H = I - beta u u^T, beta = 2 / u^T u: L - beta (u (Lu)^T + (Lu) u^T) + beta^2 (u^T L u) u u^T */
        const double beta = 2 / un;
        double *Lu = calloc((size_t)k, sizeof *Lu), uLu = 0;
        for (int i = 0; i < k; i++) {
            for (int l = 0; l < k; l++) Lu[i] += L[(size_t)l * k + i] * u[l];
            uLu += u[i] * Lu[i];
        }
        for (int i = 0; i < k; i++)
            for (int l = 0; l < k; l++)
                T[(size_t)l * k + i] = (float)(L[(size_t)l * k + i] - beta * (u[i] * Lu[l] + Lu[i] * u[l]) +
                                               beta * beta * uLu * u[i] * u[l]);
        free(Lu);
        float check[SMALL_EIG_CHECK_N];
        small_eig_run(T, k, r, W, Z, check);
        if (!small_eig_accept(check))
            fail_msg("k=%d: check orth %g resid %g norm %g", k, check[0], check[1], check[2]);
        for (int j = 0; j < r; j++) {
            const int m = k - r + j + 1; /* ascending: the (k - r + j)-th smallest */
            const double want = 2 - 2 * cos(M_PI * m / (k + 1));
            /* fp32 data and a backward-stable reduction: within k u ||T||_2 (u = 2^-24, ||T||_2 < 4) */
            if (fabs(W[j] - want) > k * 0x1p-24 * 4) fail_msg("k=%d: W[%d] = %.8g, want %.8g", k, j, W[j], want);
        }
        free(T), free(W), free(Z), free(L), free(u);
    }
    const int k = 48, r = 16;
    float *I = calloc((size_t)k * k, sizeof *I), W[16], *Z = malloc(sizeof *Z * (size_t)k * r), check[SMALL_EIG_CHECK_N];
    for (int i = 0; i < k; i++) I[(size_t)i * k + i] = 1;
    small_eig_run(I, k, r, W, Z, check);
    assert_false(small_eig_accept(check));
    free(I), free(Z);
}

/* A cut below fp32's resolution of the Gram matrix: Kpre = A diag(s) B with 32 singular values of 1 and 32
 * from 2e-3 down to 1e-3 (lambda_r / lambda_1 ~ 2e-6 at r = 48, under SHADOWKV_FP32_RESOLVED), A the first
 * N columns of an S x S Householder reflection and B an N x N one. Every Gram path must take the fp64
 * fallback there and meet the bound; a cut inside the large ones (r = 16) must not take it. */
static void test_lowrank_fp64_cut(void **state)
{
    (void)state;
    if (!kvb_gpu_available()) skip();
    enum { S = 512, HKV = 1, D = 64, N = HKV * D };
    static float K[S * N], Uref[S * N], SVref[N * N];
    double u[S], v[N], sig[N], sref[N], un = 0, vn = 0, norm = 0;
    for (int i = 0; i < S; i++) u[i] = 1.0 + 0.013 * i, un += u[i] * u[i];
    for (int i = 0; i < N; i++) v[i] = 1.0 - 0.021 * i, vn += v[i] * v[i];
    for (int j = 0; j < N; j++) sig[j] = j < 32 ? 1.0 : 2e-3 - 1e-3 * (j - 32) / 31.0;
    for (int t = 0; t < S; t++)
        for (int n = 0; n < N; n++) {
            double acc = 0;
            for (int j = 0; j < N; j++)
                acc += ((t == j) - 2 * u[t] * u[j] / un) * sig[j] * ((j == n) - 2 * v[j] * v[n] / vn);
            K[(size_t)t * N + n] = (float)acc, norm += acc * acc;
        }
    norm = sqrt(norm);
    assert_int_equal(ref_shadowkv_lowrank(K, S, HKV, D, 1, Uref, SVref, sref), KVB_OK);
    const struct { shadowkv_eig eig; int r, fp64; } runs[] = {{SHADOWKV_EIG_TOP_R, 48, 1}, {SHADOWKV_EIG_ALL, 48, 1},
                                                             {SHADOWKV_EIG_RANDOMIZED, 48, 1},
                                                             {SHADOWKV_EIG_RANDOMIZED, 16, 0}, {SHADOWKV_EIG_TOP_R, 16, 0}};
    for (int i = 0; i < (int)(sizeof runs / sizeof runs[0]); i++) {
        const int r = runs[i].r;
        cudaStream_t st = kvb_stream_create();
        shadowkv_lowrank_plan p;
        assert_int_equal(shadowkv_lowrank_plan_make(&p, S, HKV, D, r, runs[i].eig, st), KVB_OK);
        float *dK = kvb_dmalloc(sizeof K), *dU = kvb_dmalloc(sizeof(float) * S * r), *dSV = kvb_dmalloc(sizeof(float) * N * r);
        kvb_bf16 *dU16 = kvb_dmalloc(sizeof(kvb_bf16) * S * r), *dSV16 = kvb_dmalloc(sizeof(kvb_bf16) * N * r);
        int *dinfo = kvb_dmalloc(sizeof(int)), fallbacks = 0;
        void *ws = kvb_dmalloc(p.workspace_bytes);
        kvb_h2d(dK, K, sizeof K, st);
        assert_int_equal(shadowkv_lowrank(&p, dK, dU, dSV, dU16, dSV16, dinfo, ws, &fallbacks, NULL, st), KVB_OK);
        kvb_d2h(Uref, dU, sizeof(float) * S * r, st), kvb_d2h(SVref, dSV, sizeof(float) * N * r, st);
        kvb_sync(st);
        double err;
        assert_int_equal(ref_shadowkv_lowrank_error(K, S, HKV, D, r, Uref, SVref, &err), KVB_OK);
        const double opt = shadowkv_optimal_error(sref, N, r);
        if (err > 1.02 * opt + 1e-5 * norm)
            fail_msg("eig=%d r=%d: error %.6g above 1.02 x optimal %.6g + 1e-5 x %.6g (fallbacks %d)", (int)runs[i].eig, r,
                     err, opt, norm, fallbacks);
        if (!!(fallbacks & SHADOWKV_FALLBACK_FP64) != runs[i].fp64)
            fail_msg("eig=%d r=%d: fallbacks %d, the fp64 one expected %s", (int)runs[i].eig, r, fallbacks,
                     runs[i].fp64 ? "taken" : "not taken");
        kvb_dfree(dK), kvb_dfree(dU), kvb_dfree(dSV), kvb_dfree(dU16), kvb_dfree(dSV16), kvb_dfree(dinfo), kvb_dfree(ws);
        shadowkv_lowrank_plan_free(&p);
        kvb_stream_destroy(st);
    }
}

static void test_landmarks_refuse(void **state)
{
    (void)state;
    const kvb_bf16 *K = (const kvb_bf16 *)(uintptr_t)0x1000;
    kvb_bf16 *lm = (kvb_bf16 *)(uintptr_t)0x1000;
    int32_t *i = (int32_t *)(uintptr_t)0x1000;
    float *f = (float *)(uintptr_t)0x1000;
    void *ws = (void *)(uintptr_t)0x1000;
    /* S=100, c=8: 12 chunks, 4 local -> 8 chunks: 9 outliers are more than there are */
    assert_int_equal(shadowkv_landmarks(K, 1, 2, 100, 16, 8, 4, 9, lm, i, i, f, ws, 0), KVB_EINVAL);
    assert_error_mentions("outlier_chunks=9 out of range [0, n_chunks = floor(S/c) - local_chunks = floor(100/8) - 4 = 8]");
    assert_int_equal(shadowkv_landmarks(K, 1, 2, 100, 16, 0, 4, 1, lm, i, i, f, ws, 0), KVB_EINVAL);
    assert_error_mentions("c=0 out of range");
    assert_int_equal(shadowkv_landmarks(K, 1, 2, 100, 2000, 8, 4, 1, lm, i, i, f, ws, 0), KVB_EINVAL);
    assert_error_mentions("D=2000 out of range [1, 1024]");
    assert_int_equal(shadowkv_landmarks(NULL, 1, 2, 100, 16, 8, 4, 1, lm, i, i, f, ws, 0), KVB_EINVAL);
    assert_error_mentions("NULL");
}
#endif

int main(void)
{
    static const char *const families[] = {"shadowkv", NULL};
#if KVB_HAVE_CUDA
    const struct CMUnitTest fixed[] = {cmocka_unit_test(test_lowrank_plan_refuses), cmocka_unit_test(test_landmarks_refuse),
                                       cmocka_unit_test(test_small_eig_refuses), cmocka_unit_test(test_small_eig_known),
                                       cmocka_unit_test(test_lowrank_fp64_cut)};
    return kvb_test_run_gpu_cases("gpu shadowkv", fixed, (int)(sizeof fixed / sizeof fixed[0]), families, 2);
#else
    return kvb_test_run_gpu_cases("gpu shadowkv", NULL, 0, families, 2);
#endif
}
