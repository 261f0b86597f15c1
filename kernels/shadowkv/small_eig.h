/* small_eig.h: the r largest eigenpairs of a small symmetric matrix (k <= SMALL_EIG_MAX_K) on the GPU
 * without a chain of library panels: the Rayleigh-Ritz step of shadowkv_lowrank (kernels/shadowkv/NOTES.md,
 * "Design"). Four launches, planned by k and r alone:
 *   1. one block reduces T to tridiagonal form by Householder reflections, T = H S H^T (fp32, the
 *      matrix resident in shared memory for the whole reduction; fp64 norms);
 *   2. one warp a wanted eigenvalue: bisection by Sturm counts on S in fp64 (32 points a round), then
 *      inverse iteration from the eigenvalue (tridiagonal LU with partial pivoting, fp64) and the
 *      Rayleigh quotient;
 *   3. one warp a wanted eigenvector: the reflections applied back, z = H z_S (fp64 sums);
 *   4. the result checked against T itself: max |Z^T Z - I| and max |T z_j - lambda_j z_j|.
 * The caller reads the check (SMALL_EIG_CHECK_*) and, where it fails the bounds below, solves T by a
 * library eigensolver instead: inverse iteration cannot separate eigenvalues that agree to about
 * 1e-12 of ||T|| (a matrix with multiple eigenvalues among the wanted ones). */
#ifndef KVB_KERNELS_SHADOWKV_SMALL_EIG_H
#define KVB_KERNELS_SHADOWKV_SMALL_EIG_H

#include <cuda_runtime_api.h>
#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SMALL_EIG_MAX_K 256 /* the packed lower triangle and the block's partial sums in shared memory */
/* Accepted: max |Z^T Z - I| and max |T z - lambda z| / |lambda|_max at most this (fp32 data: a
 * library solver's are about k * 2^-24, 1.5e-5 at k = 256) */
#define SMALL_EIG_CHECK_BOUND 1e-4f

enum { SMALL_EIG_CHECK_ORTH = 0, SMALL_EIG_CHECK_RESID = 1, SMALL_EIG_CHECK_NORM = 2, SMALL_EIG_CHECK_N = 3 };

/* Device workspace of small_eig_top for (k, r) */
size_t small_eig_workspace_bytes(int k, int r);

/* Enqueue: T [k, k] column-major (the lower triangle is read; T is not written), k in [1,
 * SMALL_EIG_MAX_K], r in [1, k] -> W [r] (the r largest eigenvalues, ascending) and Z [k, r] (ld k,
 * column j the eigenvector of W[j]); check [SMALL_EIG_CHECK_N] (device floats): the orthogonality error,
 * the largest residual and the largest |lambda| (then the caller's relative residual). */
int small_eig_top(const float *T, int k, int r, float *W, float *Z, float *check, void *workspace,
                  cudaStream_t stream);

/* The host's verdict on check (copied back): 1 where the eigenpairs meet SMALL_EIG_CHECK_BOUND */
int small_eig_accept(const float *check);

#ifdef __cplusplus
}
#endif
#endif
