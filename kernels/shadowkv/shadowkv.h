/* shadowkv.h: CUDA API of ShadowKV's prefill (the contract: kernels/shadowkv/NOTES.md; reference/shadowkv.h
 * is the plain C version, step by step).
 *
 * Low-rank pre-RoPE keys (step 1), planned on the host, then only enqueued:
 *   G  = Kpre^T Kpre                      [N, N], N = Hkv*D: 3xTF32 GEMMs (Kpre = hi + lo, fp32-like
 *                                         error); the exact paths: cublasSsyrk in fp32, no TF32
 *   G  ~ V diag(lambda) V^T               the r largest eigenpairs: subspace iteration on G (k = max(r +
 *                                         32, 3r/2) columns, 3 products, each QR'd) and the exact eigenpairs of
 *                                         Q^T G Q (small_eig.h: one block's tridiagonal reduction, bisection
 *                                         and inverse iteration, checked; syevd where the check fails or
 *                                         k > 256); or cuSOLVER syevdx of the r largest (the exact path),
 *                                         or syevd of all of them, kept to compare
 *   s_j = sqrt(lambda_j), v_j             j < r, descending
 *   U  = Kpre [v_0/s_0 .. v_{r-1}/s_{r-1}]          [S, r]  (one GEMM; a column with s_j = 0 is 0)
 *   SV[h, j, d] = s_j v_j[h*D + d]                  [Hkv, r, D]
 * so U*SV = Kpre V_r V_r^T, the projection on the top-r right singular subspace, which is the optimal
 * rank-r approximation when V_r is exact (Eckart-Young). Why the Gram matrix: S >> N (32K x 1024),
 * so one pass over Kpre (34 GFLOP) reduces the problem to an N x N eigenproblem; its fp32 rounding
 * (about eps * lambda_max per eigenvalue) moves the subspace only at second order in the error while
 * the r-th singular value is well above sqrt(eps) * s_max (~3.5e-4); a cut below that is not resolved
 * (kernels/shadowkv/NOTES.md, Open).
 * Outputs fp32 (the 1.02x bound is judged on them) and bf16 (as stored).
 *
 * Chunks, landmarks and outliers (steps 2-4), per (b, h):
 *   mean[k]      = (1/c) sum_i K[k*c + i]                (fp32)                  k < n_chunks
 *   min_cos[k]   = min_i cosine(K[k*c + i], mean[k])     (0 where either is the zero vector)
 *   outliers     = the suite's top-k (kernels/select/select.h) of -min_cos, outlier_chunks of them
 *                  (the smallest min_cos, ties to the lower chunk, ascending)
 *   landmark_idx = the other chunks, ascending; landmarks[l] = bf16(mean[landmark_idx[l]])
 */
#ifndef KVB_KERNELS_SHADOWKV_H
#define KVB_KERNELS_SHADOWKV_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#include "reference/kvb.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SHADOWKV_GPU_MAX_N 8192 /* Hkv*D: the Gram matrix is N*N fp32 (256 MB at the limit) */

/* How the top-r eigenpairs of the Gram matrix are found: syevdx of the r largest, syevd of all, or
 * randomized subspace iteration on G (k = min(N, max(r + SHADOWKV_RR_OVERSAMPLE, 3r/2)) columns, SHADOWKV_RR_ITERS products
 * by G, each followed by a CholeskyQR2 in fp64; where G times the subspace is rank-
 * deficient, the iteration again with Householder QR) and the exact eigenpairs of the small projected
 * matrix.
 * GESVDR: no Gram matrix; cuSOLVER's randomized SVD (cusolverDnXgesvdr) of Kpre itself, with the same
 * oversampling and power iterations, as the library peer of RANDOMIZED. */
typedef enum {
    SHADOWKV_EIG_TOP_R = 0,
    SHADOWKV_EIG_ALL = 1,
    SHADOWKV_EIG_RANDOMIZED = 2,
    SHADOWKV_EIG_GESVDR = 3
} shadowkv_eig;
#define SHADOWKV_RR_OVERSAMPLE 32 /* extra columns at least; r/2 at least from r = 64 up */
#define SHADOWKV_RR_ITERS 3
#define SHADOWKV_FALLBACK_QR 1  /* shadowkv_lowrank's *fallbacks bits */
#define SHADOWKV_FALLBACK_EIG 2
#define SHADOWKV_FALLBACK_FP64 4
/* The Gram paths' cut that fp32 resolves: lambda_r / lambda_1 above this (sigma_r / sigma_1 above ~3.2e-3,
 * some 85 eps of fp32 in lambda). Below it fp32's rounding of G (about eps * lambda_1 per entry) is of
 * the size of the eigenvalues at the cut, which it can then neither order nor keep (a random-shape
 * input measured 1.117x of the optimal error through syevdx, 1.387x through the randomized path), and
 * the factorization runs again from a fp64 Gram matrix with a fp64 eigensolver. */
#define SHADOWKV_FP32_RESOLVED 1e-5

/* Host plan of one factorization shape: handles bound to `stream`, the eigensolver's workspace size. */
typedef struct shadowkv_lowrank_plan {
    int S, Hkv, D, r, N;
    shadowkv_eig eig;
    void *cublas, *cusolver; /* cublasHandle_t, cusolverDnHandle_t */
    int eig_lwork;           /* floats of the eigensolver's workspace (randomized: the largest of the small
                                eigensolver's and the fallback QR's) */
    int chol_lwork;          /* randomized: doubles of the QR's Cholesky factorization's workspace (potrf) */
    int k;                   /* randomized, gesvdr: columns of the subspace, min(r + oversampling, N) */
    void *svd_params;        /* gesvdr: cusolverDnParams_t */
    void *svd_host_work;     /* gesvdr: its host workspace (malloc'd by the plan) */
    size_t svd_host_bytes, svd_dev_bytes;
    int d_eig_lwork;         /* Gram paths: doubles of the fp64 fallback's eigensolver (Dsyevdx) */
    int chunk;               /* Gram paths: rows of Kpre the fp64 fallback converts per update of G */
    size_t workspace_bytes;  /* device workspace the launch needs */
} shadowkv_lowrank_plan;

/* Checks S in [1, 2^24], Hkv*D in [1, SHADOWKV_GPU_MAX_N], r in [1, min(S, Hkv*D)] (each refusal
 * names the parameter and its range), creates the handles and queries the eigensolver's workspace. */
int shadowkv_lowrank_plan_make(shadowkv_lowrank_plan *p, int S, int Hkv, int D, int r, shadowkv_eig eig,
                               cudaStream_t stream);
void shadowkv_lowrank_plan_free(shadowkv_lowrank_plan *p);

/* Device time of each phase of shadowkv_lowrank (ms), from events between them on the stream, the
 * host's waits inside the call included (cuSOLVER's solvers synchronize): gram, the Gram matrix; iterate,
 * the randomized path's products and QRs with its fallback (0 on the other paths); eig, the eigenpairs
 * (the Rayleigh-Ritz step, syevdx, syevd, or gesvdr with its transpose); factors, Vs, SV, U and the
 * bf16 copies. */
typedef struct shadowkv_lowrank_stages {
    float gram_ms, iterate_ms, eig_ms, factors_ms;
} shadowkv_lowrank_stages;

/* Enqueue the factorization of Kpre [S, Hkv*D] fp32 (finite: the caller checks, as the reference does)
 * into U [S, r], SV [Hkv, r, D] (fp32) and their bf16 copies U16, SV16; *info (device int) receives the
 * eigensolver's status (0: converged). workspace: p->workspace_bytes of device memory. *fallbacks (may
 * be NULL) receives the fallbacks taken (0: none): on the randomized path SHADOWKV_FALLBACK_QR where its
 * Cholesky QR met a rank-deficient product and the iteration ran again with Householder QR;
 * SHADOWKV_FALLBACK_EIG where the small eigensolver's check failed and syevd solved the projected matrix;
 * on every Gram path, SHADOWKV_FALLBACK_FP64 where lambda_r / lambda_1 was not above
 * SHADOWKV_FP32_RESOLVED and the factors came from the fp64 Gram matrix and eigensolver. *stages (may be
 * NULL) receives the phases' device times (the fp64 fallback in eig_ms); the call then also waits for its
 * last phase. */
int shadowkv_lowrank(const shadowkv_lowrank_plan *p, const float *Kpre, float *U, float *SV, kvb_bf16 *U16,
                     kvb_bf16 *SV16, int *info, void *workspace, int *fallbacks, shadowkv_lowrank_stages *stages,
                     cudaStream_t stream);

/* Workspace of shadowkv_landmarks: the chunk means (bf16), the selection keys, the top-k's own. */
size_t shadowkv_landmarks_workspace_bytes(int B, int Hkv, int n_chunks, int D);

/* K [B, Hkv, S, D] bf16 (post-RoPE) -> landmarks [B, Hkv, Lm, D] bf16, landmark_idx [B, Hkv, Lm],
 * outliers [B, Hkv, outlier_chunks] (ascending) int32, min_cos [B, Hkv, n_chunks] fp32, with
 * n_chunks = floor(S/c) - local_chunks and Lm = n_chunks - outlier_chunks (shadowkv_chunk_counts of
 * reference/shadowkv.h checks them: each refusal names the parameter). D in [1, 1024], B*Hkv <= 2^24. */
int shadowkv_landmarks(const kvb_bf16 *K, int B, int Hkv, int S, int D, int c, int local_chunks, int outlier_chunks,
                       kvb_bf16 *landmarks, int32_t *landmark_idx, int32_t *outliers, float *min_cos,
                       void *workspace, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
