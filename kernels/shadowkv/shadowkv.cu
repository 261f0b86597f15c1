// shadowkv.cu: ShadowKV's prefill on the GPU (kernels/shadowkv/NOTES.md; the API and the method in
// shadowkv.h): the rank-r factorization of the pre-RoPE keys with cuBLAS and cuSOLVER, and the chunk
// landmarks and outliers, whose selection goes through the suite's one top-k (select.h).
#include <cstring>
#include <type_traits>

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cusolverDn.h>

#include "reference/shadowkv.h"
#include "kernels/common/kvb_cuda.h"
#include "kernels/common/kvb_device.cuh"
#include "kernels/common/kvb_grid.h"
#include "kernels/select/select.h"
#include "kernels/shadowkv/shadowkv.h"
#include "kernels/shadowkv/small_eig.h"

#define CUSOLVER_TRY(call)                                                                         \
    do {                                                                                           \
        int s_ = (int)(call);                                                                      \
        if (s_ != 0)                                                                               \
            return kvb_fail(KVB_EDEVICE, "%s failed: cuSOLVER status %d (%s:%d)", #call, s_,       \
                            __FILE__, __LINE__);                                                   \
    } while (0)

static size_t align256(size_t x) { return (x + 255) & ~(size_t)255; }
// The CholeskyQR passes of each product's QR (subspace_cholqr2): one in every iteration but the last,
// whose Q the Rayleigh-Ritz step needs orthonormal (CholeskyQR2); one pass leaves Q well conditioned,
// which is all the next product needs, since the subspace, not the basis, carries over
constexpr int CHOLQR_PASSES_EARLY = 1, CHOLQR_PASSES_LAST = 2;
constexpr int CHOLQR_CALLS = CHOLQR_PASSES_EARLY * (SHADOWKV_RR_ITERS - 1) + CHOLQR_PASSES_LAST;

// ---- the factorization ------------------------------------------------------------------------------

// Workspace: G [N, N] (its eigenvectors after the solver), W [N], the solver's work, Vs [N, r]; randomized
// also Q and Y [N, k] (the subspace and G times it), T [k, k] (the projected matrix, then its
// eigenvectors), tau [k] (the fallback QR's reflectors), the small eigensolver's Z [k, r], its check
// and its own workspace (small_eig.h), and the QR's fp64 scratch: Yd [N, k] (Y in
// fp64), C [k, k] (its Gram matrix, then the Cholesky factor R), potrf's work, chol_info [2 * iterations]
// (each potrf's status); gesvdr At [N, S]
// (Kpre transposed: gesvdr overwrites its input), sigma [k], Vr [N, k] (the right singular vectors) and
// gesvdr's own device workspace; the Gram paths' fp64 fallback Gd [N, N] (then its eigenvectors), Wd [N],
// Kd [chunk, N] (rows of Kpre in fp64) and Dsyevdx's work.
struct lowrank_ws {
    float *G, *W, *work, *Vs, *Q, *Y, *T, *tau, *At, *sigma, *Vr, *hi, *lo, *X, *Zs, *eig_check;
    double *Yd, *C, *chol_work, *Gd, *Wd, *Kd, *dwork;
    int *chol_info;
    void *svd_work, *small_eig;
};

static lowrank_ws lowrank_carve(const shadowkv_lowrank_plan *p, void *ws, size_t *bytes)
{
    char *b = (char *)ws;
    lowrank_ws w;
    auto take_bytes = [&](size_t bytes) {
        void *at = b;
        b += align256(bytes);
        return at;
    };
    auto take = [&](size_t floats) { return (float *)take_bytes(floats * sizeof(float)); };
    const size_t N = (size_t)p->N, k = (size_t)p->k;
    w.G = take(N * N), w.W = take(N), w.work = take((size_t)p->eig_lwork), w.Vs = take(N * (size_t)p->r);
    w.Q = take(N * k), w.Y = take(N * k), w.T = take(k * k), w.tau = take(k);
    const bool rr = p->eig == SHADOWKV_EIG_RANDOMIZED;
    const bool small = rr && p->k <= SMALL_EIG_MAX_K; // the Rayleigh-Ritz step by small_eig_top
    w.Zs = take(small ? k * (size_t)p->r : 0), w.eig_check = take(small ? SMALL_EIG_CHECK_N : 0);
    w.small_eig = take_bytes(small ? small_eig_workspace_bytes(p->k, p->r) : 0);
    w.Yd = (double *)take_bytes(rr ? N * k * sizeof(double) : 0);
    const size_t sn = rr ? (size_t)p->S * N : 0; // the Gram matrix's tf32 split (randomized path)
    w.hi = take(sn), w.lo = take(sn), w.X = take(rr ? N * N : 0);
    w.C = (double *)take_bytes(rr ? k * k * sizeof(double) : 0);
    w.chol_work = (double *)take_bytes(rr ? (size_t)p->chol_lwork * sizeof(double) : 0);
    w.chol_info = (int *)take_bytes(rr ? CHOLQR_CALLS * sizeof(int) : 0);
    const size_t at = p->eig == SHADOWKV_EIG_GESVDR ? N * (size_t)p->S : 0;
    w.At = take(at), w.sigma = take(k), w.Vr = take(N * k);
    w.svd_work = take((p->svd_dev_bytes + sizeof(float) - 1) / sizeof(float));
    const bool gram = p->eig != SHADOWKV_EIG_GESVDR;
    auto take_d = [&](size_t doubles) { return (double *)take_bytes(gram ? doubles * sizeof(double) : 0); };
    w.Gd = take_d(N * N), w.Wd = take_d(N), w.Kd = take_d((size_t)p->chunk * N), w.dwork = take_d((size_t)p->d_eig_lwork);
    *bytes = (size_t)(b - (char *)ws);
    return w;
}

// The Gram matrix by 3xTF32 on the tensor cores: Kpre = hi + lo, hi = tf32(Kpre) (round to nearest), lo =
// Kpre - hi (exact in fp32, rounded to tf32 by the GEMM: 2^-11 of 2^-11 relative); G = hi hi^T + hi lo^T +
// lo hi^T, the lo lo^T term (2^-22 relative) dropped: fp32-like accuracy at the tensor cores' rate.
__global__ void tf32_split_kernel(const float *__restrict__ x, int64_t n, float *__restrict__ hi, float *__restrict__ lo)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const float v = x[i];
        uint32_t t;
        asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(t) : "f"(v));
        const float h = __uint_as_float(t);
        hi[i] = h, lo[i] = v - h;
    }
}

// G (N x N, column-major, both triangles) += X + X^T
__global__ void add_sym_kernel(float *__restrict__ G, const float *__restrict__ X, int N)
{
    const int64_t n = (int64_t)N * N;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        const int64_t r = i % N, c = i / N;
        G[i] += X[i] + X[r * N + c];
    }
}

// The subspace's start: a seeded uniform matrix in [-1, 1) (any full-rank start does; fixed for
// reproducible factors)
__global__ void start_matrix_kernel(float *__restrict__ Q, int64_t n)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
        uint64_t z = (uint64_t)i * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull; // splitmix64
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        Q[i] = (float)(z >> 40) * (2.f / 16777216.f) - 1.f;
    }
}

extern "C" int shadowkv_lowrank_plan_make(shadowkv_lowrank_plan *p, int S, int Hkv, int D, int r, shadowkv_eig eig,
                                          cudaStream_t stream)
{
    memset(p, 0, sizeof *p);
    const char *who = "shadowkv_lowrank";
    KVB_CHECK_RANGE(who, "S", S, 1, SHADOWKV_MAX_S);
    KVB_CHECK_RANGE(who, "Hkv", Hkv, 1, SHADOWKV_MAX_HKV);
    KVB_CHECK_RANGE(who, "D", D, 1, SHADOWKV_MAX_D);
    const int64_t N = (int64_t)Hkv * D;
    if (N > SHADOWKV_GPU_MAX_N)
        return kvb_fail(KVB_EINVAL, "%s: Hkv*D=%lld out of range [1, %d] (the Gram matrix is N x N)", who, (long long)N,
                        SHADOWKV_GPU_MAX_N);
    const int max_r = S < N ? S : (int)N;
    KVB_CHECK_RANGE(who, "r", r, 1, max_r);
    if (eig != SHADOWKV_EIG_TOP_R && eig != SHADOWKV_EIG_ALL && eig != SHADOWKV_EIG_RANDOMIZED &&
        eig != SHADOWKV_EIG_GESVDR)
        return kvb_fail(KVB_EINVAL, "%s: eig=%d out of range [0, 3]", who, (int)eig);
    p->S = S, p->Hkv = Hkv, p->D = D, p->r = r, p->N = (int)N, p->eig = eig;
    // the subspace's columns: r + 32 leaves too small a gap between the r-th and the k-th eigenvalue of a
    // flat spectrum once r is a large part of N (normal inputs, 3 products: 1.027x the optimum at N = 256,
    // r = 160; 1.026x at N = 1024, r = 400); half of r again holds every flat shape tried under 1.014x
    const int64_t k = r + SHADOWKV_RR_OVERSAMPLE > (3 * (int64_t)r + 1) / 2 ? r + SHADOWKV_RR_OVERSAMPLE
                                                                           : (3 * (int64_t)r + 1) / 2;
    p->k = (int)(k < N ? k : N);
    cublasHandle_t cb;
    cusolverDnHandle_t cs;
    CUBLAS_TRY(cublasCreate(&cb));
    p->cublas = cb;
    CUBLAS_TRY(cublasSetStream(cb, stream));
    CUBLAS_TRY(cublasSetMathMode(cb, CUBLAS_PEDANTIC_MATH)); // fp32 arithmetic: no TF32 inside the Gram matrix
    CUSOLVER_TRY(cusolverDnCreate(&cs));
    p->cusolver = cs;
    CUSOLVER_TRY(cusolverDnSetStream(cs, stream));
    if (eig == SHADOWKV_EIG_TOP_R)
        CUSOLVER_TRY(cusolverDnSsyevdx_bufferSize(cs, CUSOLVER_EIG_MODE_VECTOR, CUSOLVER_EIG_RANGE_I,
                                                  CUBLAS_FILL_MODE_LOWER, p->N, NULL, p->N, 0.f, 0.f, p->N - r + 1,
                                                  p->N, NULL, NULL, &p->eig_lwork));
    else if (eig == SHADOWKV_EIG_ALL)
        CUSOLVER_TRY(cusolverDnSsyevd_bufferSize(cs, CUSOLVER_EIG_MODE_VECTOR, CUBLAS_FILL_MODE_LOWER, p->N, NULL,
                                                 p->N, NULL, &p->eig_lwork));
    else if (eig == SHADOWKV_EIG_GESVDR) {
        // A = Kpre as a column-major S x N matrix (m = S >= n = N, the shapes gesvdr is made for when S
        // is the longer side; else the transposed problem would be the one to give it)
        if (S < N) return kvb_fail(KVB_EINVAL, "%s: impl=gesvdr needs S >= Hkv*D, got S=%d, Hkv*D=%lld", who, S, (long long)N);
        cusolverDnParams_t params;
        CUSOLVER_TRY(cusolverDnCreateParams(&params));
        p->svd_params = params;
        CUSOLVER_TRY(cusolverDnXgesvdr_bufferSize(cs, params, 'N', 'S', S, N, r, p->k - r, SHADOWKV_RR_ITERS, CUDA_R_32F,
                                                  NULL, S, CUDA_R_32F, NULL, CUDA_R_32F, NULL, S, CUDA_R_32F, NULL, N,
                                                  CUDA_R_32F, &p->svd_dev_bytes, &p->svd_host_bytes));
        if (p->svd_host_bytes && !(p->svd_host_work = malloc(p->svd_host_bytes)))
            return kvb_fail(KVB_ENOMEM, "%s: gesvdr's host workspace of %zu bytes", who, p->svd_host_bytes);
    } else {
        // fp32 work: the largest of the small eigensolver's and the fallback QR's (geqrf, orgqr); fp64: the
        // Cholesky factorization's
        int qr = 0, orth = 0, small = 0;
        CUSOLVER_TRY(cusolverDnSgeqrf_bufferSize(cs, p->N, p->k, NULL, p->N, &qr));
        CUSOLVER_TRY(cusolverDnSorgqr_bufferSize(cs, p->N, p->k, p->k, NULL, p->N, NULL, &orth));
        CUSOLVER_TRY(cusolverDnSsyevd_bufferSize(cs, CUSOLVER_EIG_MODE_VECTOR, CUBLAS_FILL_MODE_LOWER, p->k, NULL,
                                                 p->k, NULL, &small));
        p->eig_lwork = qr > orth ? (qr > small ? qr : small) : (orth > small ? orth : small);
        CUSOLVER_TRY(cusolverDnDpotrf_bufferSize(cs, CUBLAS_FILL_MODE_UPPER, p->k, NULL, p->k, &p->chol_lwork));
    }
    if (eig != SHADOWKV_EIG_GESVDR) {
        // the fp64 fallback (SHADOWKV_FP32_RESOLVED): Dsyevdx of the r largest, and rows of Kpre converted
        // 32 MB at a time (at least one row) for the updates of G
        CUSOLVER_TRY(cusolverDnDsyevdx_bufferSize(cs, CUSOLVER_EIG_MODE_VECTOR, CUSOLVER_EIG_RANGE_I,
                                                  CUBLAS_FILL_MODE_LOWER, p->N, NULL, p->N, 0.0, 0.0, p->N - r + 1,
                                                  p->N, NULL, NULL, &p->d_eig_lwork));
        const int64_t rows = ((int64_t)32 << 20) / ((int64_t)p->N * (int64_t)sizeof(double));
        p->chunk = (int)(rows < 1 ? 1 : rows < S ? rows : S);
    }
    lowrank_carve(p, NULL, &p->workspace_bytes);
    return KVB_OK;
}

extern "C" void shadowkv_lowrank_plan_free(shadowkv_lowrank_plan *p)
{
    if (p->cublas) cublasDestroy((cublasHandle_t)p->cublas);
    if (p->cusolver) cusolverDnDestroy((cusolverDnHandle_t)p->cusolver);
    if (p->svd_params) cusolverDnDestroyParams((cusolverDnParams_t)p->svd_params);
    free(p->svd_host_work);
    p->cublas = p->cusolver = p->svd_params = p->svd_host_work = NULL;
}

// From the m eigenpairs the solver left (ascending: W[0..m), vectors in the columns of V, ld N), the
// j-th largest (j < r) is column m-1-j: s_j = sqrt(lambda) (a negative lambda is rounding: 0),
//   Vs[n, j] = v[n] / s_j (0 when s_j = 0)   -> U = Kpre Vs in one GEMM
//   SV[h, j, d] = s_j v[h*D + d]             (fp32 and bf16)
// (T: float from the fp32 solvers, double from the fp64 fallback; the factors are fp32 either way)
template <typename T>
__global__ void lowrank_factors_kernel(const T *__restrict__ V, const T *__restrict__ W, int m, int N, int D, int r,
                                       float *__restrict__ Vs, float *__restrict__ SV, __nv_bfloat16 *__restrict__ SV16)
{
    const int64_t total = (int64_t)N * r;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int j = (int)(i / N), n = (int)(i % N);
        const int col = m - 1 - j;
        const T s = sqrt(W[col] > T(0) ? W[col] : T(0));
        const T v = V[(int64_t)col * N + n];
        Vs[(int64_t)j * N + n] = s > T(0) ? (float)(v / s) : 0.f;
        const int h = n / D, d = n % D;
        const int64_t o = ((int64_t)h * r + j) * D + d;
        SV[o] = (float)(s * v);
        SV16[o] = __float2bfloat16_rn((float)(s * v));
    }
}

// gesvdr's r singular triplets (sigma descending, right vectors in the columns of Vr, ld N) as the
// eigenpairs of the Gram matrix in the solvers' ascending order: W[r-1-j] = sigma_j^2, column r-1-j = v_j
__global__ void svd_as_eig_kernel(const float *__restrict__ sigma, const float *__restrict__ Vr, int N, int r,
                                  float *__restrict__ W, float *__restrict__ V)
{
    const int64_t total = (int64_t)N * r;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < total; i += (int64_t)gridDim.x * blockDim.x) {
        const int j = (int)(i / N), n = (int)(i % N);
        V[(int64_t)(r - 1 - j) * N + n] = Vr[i];
        if (n == 0) W[r - 1 - j] = sigma[j] * sigma[j];
    }
}

template <typename From, typename To>
__global__ void cast_kernel(const From *__restrict__ x, int64_t n, To *__restrict__ y)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = (To)x[i];
}

__global__ void to_bf16_kernel(const float *__restrict__ x, int64_t n, __nv_bfloat16 *__restrict__ y)
{
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
        y[i] = __float2bfloat16_rn(x[i]);
}

// Q (w.Q, N x k) <- an orthonormal basis of the subspace after SHADOWKV_RR_ITERS products by G from the
// seeded start. The last product's QR is CholeskyQR2 in fp64 (Yamamoto et al. 2015): two passes of
// C = X^T X, R = chol(C), X = X R^{-1}; the first leaves X well conditioned (||X^T X - I||_F 0.07-0.09,
// emulated), the second makes it orthonormal to fp64 rounding; the earlier products' QR is the first
// pass alone. It
// needs cond(Y) below about u^-1/2 = 9.5e7 (u = 2^-53): Y is fp32 data, whose rounding keeps cond(Y) near
// or under 3.5e7 even for a low-rank Kpre (emulated). Each potrf's status goes to w.chol_info (nonzero:
// not positive definite, Q not to be used: the caller runs the Householder fallback).
static int subspace_cholqr2(const shadowkv_lowrank_plan *p, const lowrank_ws &w, cudaStream_t stream)
{
    cublasHandle_t cb = (cublasHandle_t)p->cublas;
    cusolverDnHandle_t cs = (cusolverDnHandle_t)p->cusolver;
    const int N = p->N, k = p->k, threads = 256;
    const int64_t nq = (int64_t)N * k;
    const unsigned qblocks = (unsigned)((nq + threads - 1) / threads);
    const float one = 1.f, zero = 0.f;
    const double one_d = 1.0, zero_d = 0.0;
    start_matrix_kernel<<<qblocks, threads, 0, stream>>>(w.Q, nq);
    CUDA_TRY(cudaGetLastError());
    int call = 0; // potrf calls so far: the index of the next status
    for (int it = 0; it < SHADOWKV_RR_ITERS; it++) {
        CUBLAS_TRY(cublasSgemm(cb, CUBLAS_OP_N, CUBLAS_OP_N, N, k, N, &one, w.G, N, w.Q, N, &zero, w.Y, N));
        cast_kernel<float, double><<<qblocks, threads, 0, stream>>>(w.Y, nq, w.Yd);
        CUDA_TRY(cudaGetLastError());
        const int passes = it == SHADOWKV_RR_ITERS - 1 ? CHOLQR_PASSES_LAST : CHOLQR_PASSES_EARLY;
        for (int pass = 0; pass < passes; pass++, call++) {
            // C = Y^T Y whole by GEMM (fp64 tensor cores): cuBLAS's syrk of one triangle ran ~53 us a call
            // in 225 blocks of its own kernel; potrf reads C's upper triangle
            CUBLAS_TRY(cublasDgemm(cb, CUBLAS_OP_T, CUBLAS_OP_N, k, k, N, &one_d, w.Yd, N, w.Yd, N, &zero_d, w.C, k));
            CUSOLVER_TRY(cusolverDnDpotrf(cs, CUBLAS_FILL_MODE_UPPER, k, w.C, k, w.chol_work, p->chol_lwork,
                                          w.chol_info + call));
            CUBLAS_TRY(cublasDtrsm(cb, CUBLAS_SIDE_RIGHT, CUBLAS_FILL_MODE_UPPER, CUBLAS_OP_N, CUBLAS_DIAG_NON_UNIT, N,
                                   k, &one_d, w.C, k, w.Yd, N));
        }
        cast_kernel<double, float><<<qblocks, threads, 0, stream>>>(w.Yd, nq, w.Q);
        CUDA_TRY(cudaGetLastError());
    }
    return KVB_OK;
}

// The same iteration with Householder QR (geqrf + orgqr, fp32): exact for a rank-deficient G Q, slower
// (the panel steps of two factorizations per product). Q ends in w.Q.
static int subspace_householder(const shadowkv_lowrank_plan *p, const lowrank_ws &w, int *info, cudaStream_t stream)
{
    cublasHandle_t cb = (cublasHandle_t)p->cublas;
    cusolverDnHandle_t cs = (cusolverDnHandle_t)p->cusolver;
    const int N = p->N, k = p->k, threads = 256;
    const int64_t nq = (int64_t)N * k;
    const float one = 1.f, zero = 0.f;
    start_matrix_kernel<<<(unsigned)((nq + threads - 1) / threads), threads, 0, stream>>>(w.Q, nq);
    CUDA_TRY(cudaGetLastError());
    for (int it = 0; it < SHADOWKV_RR_ITERS; it++) {
        CUBLAS_TRY(cublasSgemm(cb, CUBLAS_OP_N, CUBLAS_OP_N, N, k, N, &one, w.G, N, w.Q, N, &zero, w.Y, N));
        CUSOLVER_TRY(cusolverDnSgeqrf(cs, N, k, w.Y, N, w.tau, w.work, p->eig_lwork, info));
        CUSOLVER_TRY(cusolverDnSorgqr(cs, N, k, k, w.Y, N, w.tau, w.work, p->eig_lwork, info));
        CUDA_TRY(cudaMemcpyAsync(w.Q, w.Y, (size_t)nq * sizeof(float), cudaMemcpyDeviceToDevice, stream));
    }
    return KVB_OK;
}

// Whether fp32 resolved the cut: lambda_r / lambda_1 above SHADOWKV_FP32_RESOLVED (the solvers' m values
// ascending: lambda_1 at m - 1, lambda_r at m - r; a NaN does not compare above). The two values are read
// on the host: every Gram path has synchronized with it in its eigensolver already.
static int lowrank_cut_resolved(const float *lambda, int m, int r, bool *resolved, cudaStream_t stream)
{
    float top = 0.f, cut = 0.f;
    CUDA_TRY(cudaMemcpyAsync(&top, lambda + (m - 1), sizeof top, cudaMemcpyDeviceToHost, stream));
    CUDA_TRY(cudaMemcpyAsync(&cut, lambda + (m - r), sizeof cut, cudaMemcpyDeviceToHost, stream));
    CUDA_TRY(cudaStreamSynchronize(stream));
    *resolved = cut > (float)SHADOWKV_FP32_RESOLVED * top;
    return KVB_OK;
}

// The eigenpairs again from a fp64 Gram matrix (the cut below fp32's resolution): Kpre's rows converted
// p->chunk at a time, Gd += Kd Kd^T by Dsyrk (lower triangle), then Dsyevdx of the r largest: their
// vectors in Gd's first r columns, their values in Wd, ascending.
static int lowrank_fp64(const shadowkv_lowrank_plan *p, const lowrank_ws &w, const float *Kpre, int *info,
                        cudaStream_t stream)
{
    cublasHandle_t cb = (cublasHandle_t)p->cublas;
    cusolverDnHandle_t cs = (cusolverDnHandle_t)p->cusolver;
    const int N = p->N, S = p->S, r = p->r;
    const double one = 1.0, zero = 0.0;
    for (int s0 = 0; s0 < S; s0 += p->chunk) {
        const int rows = S - s0 < p->chunk ? S - s0 : p->chunk;
        const int64_t n = (int64_t)rows * N, blocks = (n + 255) / 256;
        cast_kernel<float, double><<<(unsigned)(blocks < 65536 ? blocks : 65536), 256, 0, stream>>>(
            Kpre + (int64_t)s0 * N, n, w.Kd);
        CUDA_TRY(cudaGetLastError());
        CUBLAS_TRY(cublasDsyrk(cb, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_N, N, rows, &one, w.Kd, N, s0 ? &one : &zero,
                               w.Gd, N));
    }
    int m = 0;
    CUSOLVER_TRY(cusolverDnDsyevdx(cs, CUSOLVER_EIG_MODE_VECTOR, CUSOLVER_EIG_RANGE_I, CUBLAS_FILL_MODE_LOWER, N, w.Gd,
                                   N, 0.0, 0.0, N - r + 1, N, &m, w.Wd, w.dwork, p->d_eig_lwork, info));
    if (m != r)
        return kvb_fail(KVB_EDEVICE, "shadowkv_lowrank: the fp64 fallback's syevdx returned %d eigenpairs, asked for r=%d",
                        m, r);
    return KVB_OK;
}

// The phases' events when stage times are asked for (shadowkv_lowrank_stages): created with the call,
// destroyed on every way out of it.
struct PhaseEvents {
    cudaEvent_t e[5] = {};
    int n = 0;
    ~PhaseEvents()
    {
        for (int i = 0; i < n; i++) cudaEventDestroy(e[i]);
    }
    cudaError_t make(bool on)
    {
        if (!on) return cudaSuccess;
        for (; n < 5; n++) {
            const cudaError_t err = cudaEventCreate(&e[n]);
            if (err != cudaSuccess) return err;
        }
        return cudaSuccess;
    }
    cudaError_t mark(int i, cudaStream_t stream) { return n ? cudaEventRecord(e[i], stream) : cudaSuccess; }
    float ms(int i) const
    {
        float t = 0.f;
        cudaEventElapsedTime(&t, e[i], e[i + 1]);
        return t;
    }
};

extern "C" int shadowkv_lowrank(const shadowkv_lowrank_plan *p, const float *Kpre, float *U, float *SV, kvb_bf16 *U16,
                                kvb_bf16 *SV16, int *info, void *workspace, int *fallbacks,
                                shadowkv_lowrank_stages *stages, cudaStream_t stream)
{
    if (fallbacks) *fallbacks = 0;
    if (!p->cublas || !p->cusolver) return kvb_fail(KVB_EINVAL, "shadowkv_lowrank: the plan was not made");
    if (!Kpre || !U || !SV || !U16 || !SV16 || !info || !workspace)
        return kvb_fail(KVB_EINVAL, "shadowkv_lowrank: a NULL pointer (Kpre, U, SV, U16, SV16, info, workspace)");
    cublasHandle_t cb = (cublasHandle_t)p->cublas;
    cusolverDnHandle_t cs = (cusolverDnHandle_t)p->cusolver;
    CUBLAS_TRY(cublasSetStream(cb, stream));
    CUSOLVER_TRY(cusolverDnSetStream(cs, stream));
    size_t ws_bytes;
    const lowrank_ws w = lowrank_carve(p, workspace, &ws_bytes);
    const int N = p->N, S = p->S, r = p->r;
    // Kpre row-major [S, N] is the column-major N x S matrix A; G = A A^T (lower triangle)
    const float one = 1.f, zero = 0.f;
    PhaseEvents ev;
    CUDA_TRY(ev.make(stages != NULL));
    CUDA_TRY(ev.mark(0, stream));
    if (p->eig == SHADOWKV_EIG_RANDOMIZED) {
        // 3xTF32 (tf32_split_kernel): G = hi hi^T, X = hi lo^T, G += X + X^T; TF32 asked of this call only
        const int64_t sn = (int64_t)S * N;
        const int64_t blocks = (sn + 255) / 256;
        tf32_split_kernel<<<(unsigned)(blocks < 65536 ? blocks : 65536), 256, 0, stream>>>(Kpre, sn, w.hi, w.lo);
        CUDA_TRY(cudaGetLastError());
        CUBLAS_TRY(cublasSetMathMode(cb, CUBLAS_DEFAULT_MATH));
        const cublasStatus_t g1 = cublasGemmEx(cb, CUBLAS_OP_N, CUBLAS_OP_T, N, N, S, &one, w.hi, CUDA_R_32F, N, w.hi,
                                               CUDA_R_32F, N, &zero, w.G, CUDA_R_32F, N, CUBLAS_COMPUTE_32F_FAST_TF32,
                                               CUBLAS_GEMM_DEFAULT);
        const cublasStatus_t g2 = cublasGemmEx(cb, CUBLAS_OP_N, CUBLAS_OP_T, N, N, S, &one, w.hi, CUDA_R_32F, N, w.lo,
                                               CUDA_R_32F, N, &zero, w.X, CUDA_R_32F, N, CUBLAS_COMPUTE_32F_FAST_TF32,
                                               CUBLAS_GEMM_DEFAULT);
        CUBLAS_TRY(cublasSetMathMode(cb, CUBLAS_PEDANTIC_MATH));
        CUBLAS_TRY(g1);
        CUBLAS_TRY(g2);
        const int64_t nn = (int64_t)N * N;
        add_sym_kernel<<<(unsigned)((nn + 255) / 256), 256, 0, stream>>>(w.G, w.X, N);
        CUDA_TRY(cudaGetLastError());
    } else if (p->eig != SHADOWKV_EIG_GESVDR)
        CUBLAS_TRY(cublasSsyrk(cb, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_N, N, S, &one, Kpre, N, &zero, w.G, N));
    CUDA_TRY(ev.mark(1, stream));
    if (p->eig != SHADOWKV_EIG_RANDOMIZED) CUDA_TRY(ev.mark(2, stream)); // no iteration: iterate_ms = 0
    int m = N;
    const float *V = w.G, *lambda = w.W; // the eigenvectors (columns, ld N) and values, ascending
    if (p->eig == SHADOWKV_EIG_GESVDR) {
        // At (column-major S x N) = the transpose of A; gesvdr's right singular vectors are G's eigenvectors
        CUBLAS_TRY(cublasSgeam(cb, CUBLAS_OP_T, CUBLAS_OP_N, S, N, &one, Kpre, N, &zero, w.At, S, w.At, S));
        CUSOLVER_TRY(cusolverDnXgesvdr(cs, (cusolverDnParams_t)p->svd_params, 'N', 'S', S, N, r, p->k - r,
                                       SHADOWKV_RR_ITERS, CUDA_R_32F, w.At, S, CUDA_R_32F, w.sigma, CUDA_R_32F, NULL, S,
                                       CUDA_R_32F, w.Vr, N, CUDA_R_32F, w.svd_work, p->svd_dev_bytes, p->svd_host_work,
                                       p->svd_host_bytes, info));
        const int threads = 256;
        const int64_t nv = (int64_t)N * r;
        svd_as_eig_kernel<<<(unsigned)((nv + threads - 1) / threads), threads, 0, stream>>>(w.sigma, w.Vr, N, r, w.W,
                                                                                             w.Y);
        CUDA_TRY(cudaGetLastError());
        m = r, V = w.Y;
    } else if (p->eig == SHADOWKV_EIG_RANDOMIZED) {
        // subspace iteration: Q <- qr(G Q), SHADOWKV_RR_ITERS times from a seeded start, then the
        // Rayleigh-Ritz step: T = Q^T G Q (k x k), its eigenpairs (Z, lambda), V = Q Z. The products G Q
        // are GEMMs over the whole G, which the Gram GEMMs above wrote in both triangles: cuBLAS's symm
        // on one triangle ran as panel kernels of a few dozen blocks
        const int k = p->k;
        int rc = subspace_cholqr2(p, w, stream);
        if (rc) return rc;
        // a rank-deficient or too ill-conditioned G Q (G of rank below k: Kpre zero in enough columns, or
        // S < k; cond above ~1e8) has a Gram matrix that potrf cannot factor: then the iteration again
        // from the same start, with Householder QR. The statuses are read on the host; the solvers below
        // synchronize with it anyway.
        int status[CHOLQR_CALLS];
        CUDA_TRY(cudaMemcpyAsync(status, w.chol_info, sizeof status, cudaMemcpyDeviceToHost, stream));
        CUDA_TRY(cudaStreamSynchronize(stream));
        int failed = 0;
        for (int i = 0; i < CHOLQR_CALLS; i++) failed |= status[i] != 0;
        if (fallbacks && failed) *fallbacks |= SHADOWKV_FALLBACK_QR;
        if (failed && (rc = subspace_householder(p, w, info, stream))) return rc;
        CUDA_TRY(ev.mark(2, stream));
        float *Q = w.Q, *Y = w.Y;
        CUBLAS_TRY(cublasSgemm(cb, CUBLAS_OP_N, CUBLAS_OP_N, N, k, N, &one, w.G, N, Q, N, &zero, Y, N));
        CUBLAS_TRY(cublasSgemm(cb, CUBLAS_OP_T, CUBLAS_OP_N, k, k, N, &one, Q, N, Y, N, &zero, w.T, k));
        // T's r largest eigenpairs by the one-block reduction (small_eig.h), checked against T on the
        // device; where the check fails (eigenvalues among the wanted that agree to ~1e-12 of ||T||) or k
        // is above its limit, every eigenpair by cuSOLVER's syevd
        bool solved = false;
        if (k <= SMALL_EIG_MAX_K) {
            if ((rc = small_eig_top(w.T, k, r, w.W, w.Zs, w.eig_check, w.small_eig, stream))) return rc;
            float check[SMALL_EIG_CHECK_N];
            CUDA_TRY(cudaMemcpyAsync(check, w.eig_check, sizeof check, cudaMemcpyDeviceToHost, stream));
            CUDA_TRY(cudaStreamSynchronize(stream));
            if (small_eig_accept(check)) {
                CUDA_TRY(cudaMemsetAsync(info, 0, sizeof(int), stream));
                CUBLAS_TRY(cublasSgemm(cb, CUBLAS_OP_N, CUBLAS_OP_N, N, r, k, &one, Q, N, w.Zs, k, &zero, Y, N));
                m = r, V = Y, solved = true;
            } else if (fallbacks)
                *fallbacks |= SHADOWKV_FALLBACK_EIG;
        }
        if (!solved) {
            CUSOLVER_TRY(cusolverDnSsyevd(cs, CUSOLVER_EIG_MODE_VECTOR, CUBLAS_FILL_MODE_LOWER, k, w.T, k, w.W, w.work,
                                          p->eig_lwork, info));
            CUBLAS_TRY(cublasSgemm(cb, CUBLAS_OP_N, CUBLAS_OP_N, N, k, k, &one, Q, N, w.T, k, &zero, Y, N));
            m = k, V = Y;
        }
    } else if (p->eig == SHADOWKV_EIG_TOP_R) {
        CUSOLVER_TRY(cusolverDnSsyevdx(cs, CUSOLVER_EIG_MODE_VECTOR, CUSOLVER_EIG_RANGE_I, CUBLAS_FILL_MODE_LOWER, N, w.G,
                                       N, 0.f, 0.f, N - r + 1, N, &m, w.W, w.work, p->eig_lwork, info));
        if (m != r) return kvb_fail(KVB_EDEVICE, "shadowkv_lowrank: syevdx returned %d eigenpairs, asked for r=%d", m, r);
    } else {
        CUSOLVER_TRY(cusolverDnSsyevd(cs, CUSOLVER_EIG_MODE_VECTOR, CUBLAS_FILL_MODE_LOWER, N, w.G, N, w.W, w.work,
                                      p->eig_lwork, info));
    }
    const int threads = 256;
    const int64_t nv = (int64_t)N * r;
    const unsigned fblocks = (unsigned)((nv + threads - 1) / threads);
    bool resolved = true; // the cut, by SHADOWKV_FP32_RESOLVED (gesvdr, the peer, is taken as it is)
    if (p->eig != SHADOWKV_EIG_GESVDR) {
        const int rc = lowrank_cut_resolved(lambda, m, r, &resolved, stream);
        if (rc) return rc;
    }
    if (!resolved) {
        const int rc = lowrank_fp64(p, w, Kpre, info, stream);
        if (rc) return rc;
        if (fallbacks) *fallbacks |= SHADOWKV_FALLBACK_FP64;
        lowrank_factors_kernel<double><<<fblocks, threads, 0, stream>>>(w.Gd, w.Wd, r, N, p->D, r, w.Vs, SV,
                                                                         (__nv_bfloat16 *)SV16);
        CUDA_TRY(cudaGetLastError());
    }
    CUDA_TRY(ev.mark(3, stream));
    if (resolved)
        lowrank_factors_kernel<float><<<fblocks, threads, 0, stream>>>(V, lambda, m, N, p->D, r, w.Vs, SV,
                                                                        (__nv_bfloat16 *)SV16);
    CUDA_TRY(cudaGetLastError());
    // U^T (column-major r x S, i.e. U row-major [S, r]) = Vs^T A. The randomized path has A's tf32 split
    // from the Gram matrix: 3xTF32 as there (Vs = hi + lo into Q and Y, free once V is read; A's lo Vs_lo
    // term, 2^-22 relative, dropped); the exact paths in fp32
    if (p->eig == SHADOWKV_EIG_RANDOMIZED) {
        const int64_t nv = (int64_t)N * r;
        tf32_split_kernel<<<(unsigned)((nv + 255) / 256), 256, 0, stream>>>(w.Vs, nv, w.Q, w.Y);
        CUDA_TRY(cudaGetLastError());
        CUBLAS_TRY(cublasSetMathMode(cb, CUBLAS_DEFAULT_MATH));
        cublasStatus_t g[3];
        const float *va[3] = {w.Q, w.Q, w.Y}, *aa[3] = {w.hi, w.lo, w.hi};
        for (int t = 0; t < 3; t++)
            g[t] = cublasGemmEx(cb, CUBLAS_OP_T, CUBLAS_OP_N, r, S, N, &one, va[t], CUDA_R_32F, N, aa[t], CUDA_R_32F, N,
                                t ? &one : &zero, U, CUDA_R_32F, r, CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT);
        CUBLAS_TRY(cublasSetMathMode(cb, CUBLAS_PEDANTIC_MATH));
        for (int t = 0; t < 3; t++) CUBLAS_TRY(g[t]);
    } else
        CUBLAS_TRY(cublasSgemm(cb, CUBLAS_OP_T, CUBLAS_OP_N, r, S, N, &one, w.Vs, N, Kpre, N, &zero, U, r));
    const int64_t nu = (int64_t)S * r;
    const int64_t blocks = (nu + threads - 1) / threads;
    to_bf16_kernel<<<(unsigned)(blocks < 65536 ? blocks : 65536), threads, 0, stream>>>(U, nu, (__nv_bfloat16 *)U16);
    CUDA_TRY(cudaGetLastError());
    if (stages) {
        CUDA_TRY(ev.mark(4, stream));
        CUDA_TRY(cudaEventSynchronize(ev.e[4]));
        stages->gram_ms = ev.ms(0), stages->iterate_ms = ev.ms(1), stages->eig_ms = ev.ms(2);
        stages->factors_ms = ev.ms(3);
    }
    return KVB_OK;
}

// ---- chunks, landmarks, outliers ------------------------------------------------------------------

constexpr int kWarpsPerBlock = 8;

static size_t landmarks_means_bytes(int B, int Hkv, int n_chunks, int D)
{
    return align256((size_t)B * Hkv * n_chunks * D * sizeof(__nv_bfloat16));
}
static size_t landmarks_keys_bytes(int B, int Hkv, int n_chunks)
{
    return align256((size_t)B * Hkv * n_chunks * sizeof(float));
}

extern "C" size_t shadowkv_landmarks_workspace_bytes(int B, int Hkv, int n_chunks, int D)
{
    if (B < 1 || Hkv < 1 || n_chunks < 1 || D < 1) return 0;
    return landmarks_means_bytes(B, Hkv, n_chunks, D) + landmarks_keys_bytes(B, Hkv, n_chunks) +
           topk_workspace_bytes(B * Hkv, n_chunks);
}

// One warp per (row = b*Hkv + h, chunk k): the chunk's mean (fp32; stored bf16 for the landmarks), the
// minimum cosine of its keys with the mean, and the selection key -min_cos (+0.f turns -0 into +0, so
// equal minimums tie exactly). Lane d-stride loops: any D; the c keys are read twice (the second time
// from L1/L2).
__global__ void chunk_stats_kernel(const __nv_bfloat16 *__restrict__ K, int64_t rows, int S, int D, int c,
                                   int n_chunks, __nv_bfloat16 *__restrict__ means, float *__restrict__ min_cos,
                                   float *__restrict__ keys)
{
    const int64_t item = (int64_t)blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (item >= rows * n_chunks) return;
    const int64_t row = item / n_chunks;
    const int k = (int)(item % n_chunks);
    const __nv_bfloat16 *x = K + (row * S + (int64_t)k * c) * D;
    float mean_part[SHADOWKV_MAX_D / 32];
    float mm = 0.f;
    const float inv_c = 1.f / (float)c;
#pragma unroll
    for (int t = 0; t < SHADOWKV_MAX_D / 32; t++) {
        const int d = lane + 32 * t;
        float s = 0.f;
        if (d < D)
            for (int i = 0; i < c; i++) s += __bfloat162float(x[(int64_t)i * D + d]);
        mean_part[t] = s * inv_c;
        mm += mean_part[t] * mean_part[t];
        if (d < D) means[item * D + d] = __float2bfloat16_rn(mean_part[t]);
    }
    mm = kvb_dev::warp_sum<16, 1>(mm);
    float lo = INFINITY;
    for (int i = 0; i < c; i++) {
        float dot = 0.f, kk = 0.f;
#pragma unroll
        for (int t = 0; t < SHADOWKV_MAX_D / 32; t++) {
            const int d = lane + 32 * t;
            if (d < D) {
                const float v = __bfloat162float(x[(int64_t)i * D + d]);
                dot += v * mean_part[t];
                kk += v * v;
            }
        }
        dot = kvb_dev::warp_sum<16, 1>(dot);
        kk = kvb_dev::warp_sum<16, 1>(kk);
        const float cosv = (kk > 0.f && mm > 0.f) ? dot / sqrtf(kk * mm) : 0.f;
        lo = fminf(lo, cosv);
    }
    if (lane == 0) {
        min_cos[item] = lo;
        keys[item] = -lo + 0.f;
    }
}

// The same for D = 32*V (V = 2: D=64, V = 4: D=128) and c <= C (8 or 16): each lane holds V dims of every key
// of the chunk in registers (one vector load per key), and the 2c+1 warp sums are independent, so
// their shuffles overlap instead of forming one chain per key.
constexpr int kFastC = 16;
template <int V, int C>
__global__ void chunk_stats_fast_kernel(const __nv_bfloat16 *__restrict__ K, int64_t rows, int S, int c, int n_chunks,
                                        __nv_bfloat16 *__restrict__ means, float *__restrict__ min_cos,
                                        float *__restrict__ keys)
{
    constexpr int D = 32 * V;
    using vec = typename std::conditional<V == 4, uint2, uint32_t>::type; // V bf16
    const int64_t item = (int64_t)blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (item >= rows * n_chunks) return;
    const int64_t row = item / n_chunks;
    const int k = (int)(item % n_chunks);
    const vec *x = reinterpret_cast<const vec *>(K + (row * S + (int64_t)k * c) * D) + lane;
    float v[C][V];
#pragma unroll
    for (int i = 0; i < C; i++) {
        vec raw;
        if (i < c) raw = __ldg(x + (int64_t)i * 32);
        else memset(&raw, 0, sizeof raw);
        const __nv_bfloat16 *h = reinterpret_cast<const __nv_bfloat16 *>(&raw);
#pragma unroll
        for (int e = 0; e < V; e++) v[i][e] = __bfloat162float(h[e]);
    }
    float mean[V], mm = 0.f;
    const float inv_c = 1.f / (float)c;
#pragma unroll
    for (int e = 0; e < V; e++) {
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < C; i++) s += v[i][e]; // keys past c are 0
        mean[e] = s * inv_c;
        mm += mean[e] * mean[e];
    }
    __nv_bfloat16 m16[V];
#pragma unroll
    for (int e = 0; e < V; e++) m16[e] = __float2bfloat16_rn(mean[e]);
    reinterpret_cast<vec *>(means + item * D)[lane] = *reinterpret_cast<const vec *>(m16);
    float dot[C], kk[C];
#pragma unroll
    for (int i = 0; i < C; i++) {
        dot[i] = kk[i] = 0.f;
#pragma unroll
        for (int e = 0; e < V; e++) dot[i] += v[i][e] * mean[e], kk[i] += v[i][e] * v[i][e];
    }
#pragma unroll
    for (int o = 16; o >= 1; o >>= 1) { // the same butterfly as warp_sum<16, 1>, for every sum at once
        mm += __shfl_xor_sync(0xffffffffu, mm, o);
#pragma unroll
        for (int i = 0; i < C; i++) {
            dot[i] += __shfl_xor_sync(0xffffffffu, dot[i], o);
            kk[i] += __shfl_xor_sync(0xffffffffu, kk[i], o);
        }
    }
    float lo = INFINITY;
#pragma unroll
    for (int i = 0; i < C; i++)
        if (i < c) lo = fminf(lo, (kk[i] > 0.f && mm > 0.f) ? dot[i] / sqrtf(kk[i] * mm) : 0.f);
    if (lane == 0) {
        min_cos[item] = lo;
        keys[item] = -lo + 0.f;
    }
}

// One warp per (row, chunk k): k's rank among the row's outliers (ascending) by binary search; a
// non-outlier goes to landmark l = k - (outliers below k), in ascending chunk order by construction.
__global__ void landmarks_compact_kernel(const __nv_bfloat16 *__restrict__ means, const int32_t *__restrict__ outliers,
                                         int64_t rows, int n_chunks, int n_out, int D, __nv_bfloat16 *__restrict__ landmarks,
                                         int32_t *__restrict__ landmark_idx)
{
    const int64_t item = (int64_t)blockIdx.x * kWarpsPerBlock + threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    if (item >= rows * n_chunks) return;
    const int64_t row = item / n_chunks;
    const int k = (int)(item % n_chunks);
    const int32_t *o = outliers + row * n_out;
    int lo = 0, hi = n_out; // first outlier >= k
    while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (o[mid] < k) lo = mid + 1;
        else hi = mid;
    }
    if (lo < n_out && o[lo] == k) return;
    const int Lm = n_chunks - n_out;
    const int64_t l = row * Lm + (k - lo);
    if (lane == 0) landmark_idx[l] = k;
    if (D % 8 == 0) // 16-byte rows pieces (row starts are then 16-byte aligned too)
        for (int d = lane * 8; d < D; d += 256)
            *reinterpret_cast<uint4 *>(landmarks + l * D + d) = *reinterpret_cast<const uint4 *>(means + item * D + d);
    else
        for (int d = lane; d < D; d += 32) landmarks[l * D + d] = means[item * D + d];
}

extern "C" int shadowkv_landmarks(const kvb_bf16 *K, int B, int Hkv, int S, int D, int c, int local_chunks,
                                  int outlier_chunks, kvb_bf16 *landmarks, int32_t *landmark_idx, int32_t *outliers,
                                  float *min_cos, void *workspace, cudaStream_t stream)
{
    const char *who = "shadowkv_landmarks";
    KVB_CHECK_RANGE(who, "B", B, 1, 1 << 16);
    KVB_CHECK_RANGE(who, "Hkv", Hkv, 1, SHADOWKV_MAX_HKV);
    KVB_CHECK_RANGE(who, "D", D, 1, SHADOWKV_MAX_D);
    int n_chunks, Lm;
    int rc = shadowkv_chunk_counts(S, c, local_chunks, outlier_chunks, &n_chunks, &Lm, who);
    if (rc) return rc;
    const int64_t rows = (int64_t)B * Hkv;
    if (rows > (1 << 24)) return kvb_fail(KVB_EINVAL, "%s: B*Hkv=%lld out of range [1, 2^24]", who, (long long)rows);
    if (!K || !min_cos || !workspace || (Lm > 0 && (!landmarks || !landmark_idx)) || (outlier_chunks > 0 && !outliers))
        return kvb_fail(KVB_EINVAL, "%s: a NULL pointer (K, landmarks, landmark_idx, outliers, min_cos, workspace)", who);
    if (n_chunks > TOPK_MAX_N)
        return kvb_fail(KVB_EINVAL, "%s: n_chunks=%d out of range [1, %d] (the top-k's row length)", who, n_chunks,
                        TOPK_MAX_N);
    unsigned grid = 0;
    if ((rc = kvb_grid_x(who, "B*Hkv*n_chunks", rows * n_chunks, kWarpsPerBlock, &grid))) return rc;
    char *ws = (char *)workspace;
    __nv_bfloat16 *means = (__nv_bfloat16 *)ws;
    float *keys = (float *)(ws + landmarks_means_bytes(B, Hkv, n_chunks, D));
    void *topk_ws = ws + landmarks_means_bytes(B, Hkv, n_chunks, D) + landmarks_keys_bytes(B, Hkv, n_chunks);
    const __nv_bfloat16 *k16 = (const __nv_bfloat16 *)K;
    if (D == 128 && c <= 8)
        chunk_stats_fast_kernel<4, 8><<<grid, kWarpsPerBlock * 32, 0, stream>>>(k16, rows, S, c, n_chunks, means, min_cos, keys);
    else if (D == 128 && c <= kFastC)
        chunk_stats_fast_kernel<4, kFastC><<<grid, kWarpsPerBlock * 32, 0, stream>>>(k16, rows, S, c, n_chunks, means, min_cos, keys);
    else if (D == 64 && c <= 8)
        chunk_stats_fast_kernel<2, 8><<<grid, kWarpsPerBlock * 32, 0, stream>>>(k16, rows, S, c, n_chunks, means, min_cos, keys);
    else if (D == 64 && c <= kFastC)
        chunk_stats_fast_kernel<2, kFastC><<<grid, kWarpsPerBlock * 32, 0, stream>>>(k16, rows, S, c, n_chunks, means, min_cos, keys);
    else
        chunk_stats_kernel<<<grid, kWarpsPerBlock * 32, 0, stream>>>(k16, rows, S, D, c, n_chunks, means, min_cos, keys);
    CUDA_TRY(cudaGetLastError());
    if (outlier_chunks > 0) {
        rc = topk_rows(keys, (int)rows, n_chunks, n_chunks, outlier_chunks, 0, 0, outliers, outlier_chunks, topk_ws,
                       stream);
        if (rc) return rc;
    }
    if (Lm > 0) {
        landmarks_compact_kernel<<<grid, kWarpsPerBlock * 32, 0, stream>>>(
            means, outliers, rows, n_chunks, outlier_chunks, D, (__nv_bfloat16 *)landmarks, landmark_idx);
        CUDA_TRY(cudaGetLastError());
    }
    return KVB_OK;
}
