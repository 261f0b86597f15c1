/* shadowkv.h: ShadowKV's prefill, plain C reference (kernels/shadowkv/NOTES.md, steps 1-5).
 *
 * Per layer and batch element, from pre-RoPE keys Kpre [S, Hkv*D], post-RoPE keys K [Hkv, S, D]
 * and values V [Hkv, S, D]:
 *   1. low-rank keys: SVD of Kpre; U = left singular vectors [:, :r] ([S, r], shared by the heads),
 *      SV = diag(s[:r]) * Vt[:r, :] reshaped to [Hkv, r, D]                   ref_shadowkv_lowrank
 *   2. chunks: n_chunks = floor(S/c) - local_chunks; tokens [n_chunks*c, S) are the local window
 *   3. landmarks: the mean of each chunk's c post-RoPE keys, per KV head
 *   4. outliers: per head, the outlier_chunks chunks with the smallest min over their keys of
 *      cosine(key, chunk mean) (ties: lower chunk id), ascending; the other Lm = n_chunks -
 *      outlier_chunks chunks keep their landmark, in ascending chunk order, landmark_idx = chunk id
 *                                                                               ref_shadowkv_chunks
 *   5. values to pinned host memory, chunk-major                                ref_shadowkv_host_values
 *      (the layout of kernels/gather_copy/NOTES.md)
 * and the GPU buffer [Hkv, NB, D]: local tokens | outlier chunks | M sparse chunk slots | decode
 * tokens (shadowkv_layout_make), its local and outlier regions filled by ref_shadowkv_fill_buffer.
 *
 * Singular vectors are defined up to sign (and up to rotation inside a repeated singular value):
 * compare reconstructions U*SV, never U or SV alone. A GPU factorization passes when
 * ref_shadowkv_lowrank_error(its U, SV) <= 1.02 * shadowkv_optimal_error(s, r) (Eckart-Young).
 */
#ifndef REF_SHADOWKV_H
#define REF_SHADOWKV_H

#include "reference/gather_copy.h"
#include "reference/kvb.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SHADOWKV_MAX_S (1 << 24)  /* tokens per sequence */
#define SHADOWKV_MAX_HKV 256
#define SHADOWKV_MAX_D 1024
#define SHADOWKV_MAX_C 4096

/* ---- step 1: low-rank pre-RoPE keys ------------------------------------------------------------ */

/* SVD of Kpre [S, N = Hkv*D] (fp32, row-major) with LAPACKE, in double (the QR factorization, dgeqrf,
 * then the SVD of R, dgesdd job 'S', and Q applied to R's first r left vectors, dormqr):
 *   U  [S, r]      = u[:, :r]                                   (fp32, rounded once from double)
 *   SV [Hkv, r, D] : SV[h, j, d] = s[j] * vt[j, h*D + d]        (fp32, rounded once from double)
 *   s  [min(S, N)] every singular value, descending, in double (NULL: not wanted)
 * so that Kpre[t, h*D + d] ~ sum_j U[t, j] * SV[h, j, d]. r in [1, min(S, N)]; S*N <= INT32_MAX
 * (LAPACK's 32-bit indices); every Kpre element finite. */
int ref_shadowkv_lowrank(const float *Kpre, int S, int Hkv, int D, int r, float *U, float *SV, double *s);

/* The optimal rank-r error ||Kpre - K_r||_F = sqrt(sum_{i >= r} s_i^2) from the n_s singular
 * values s (descending, as ref_shadowkv_lowrank returns them); 0 when r >= n_s. */
double shadowkv_optimal_error(const double *s, int n_s, int r);

/* ||Kpre - U*SV||_F for any factors U [S, r], SV [Hkv, r, D] (fp32; bf16 factors convert exactly),
 * accumulated in double. Fails (naming it) on a non-finite Kpre, U or SV element. */
int ref_shadowkv_lowrank_error(const float *Kpre, int S, int Hkv, int D, int r, const float *U,
                               const float *SV, double *err);

/* y[i] = bf16(x[i]), round to nearest even: the factors as the GPU stores them (it computes in fp32
 * and rounds once to bf16, as this does). */
void shadowkv_round_bf16(const float *x, int64_t n, kvb_bf16 *y);

/* ---- steps 2-4: chunks, landmarks, outliers ---------------------------------------------------- */

/* n_chunks = floor(S/c) - local_chunks and Lm = n_chunks - outlier_chunks, after checking
 * S in [c*(local_chunks+1), SHADOWKV_MAX_S] (at least one chunk before the local window), c in
 * [1, SHADOWKV_MAX_C], local_chunks >= 0 and outlier_chunks in [0, n_chunks]. `who` prefixes the
 * message. */
int shadowkv_chunk_counts(int S, int c, int local_chunks, int outlier_chunks, int *n_chunks, int *Lm,
                          const char *who);

/* Post-RoPE keys K [Hkv, S, D] bf16 (what the GPU holds), computed in double:
 *   mean[h, k, :] = (1/c) sum_{i<c} K[h, k*c + i, :]                            k < n_chunks
 *   min_cos[h, k] = min_{i<c} cosine(K[h, k*c + i, :], mean[h, k, :])
 *                   (cosine := 0 where the key or the mean is the zero vector)
 *   outliers[h, 0:outlier_chunks]  the chunks with the smallest min_cos, ties to the lower chunk
 *                                  id, ascending
 *   landmark_idx[h, 0:Lm]          the other chunk ids, ascending
 *   landmarks[h, l, :]             = bf16(mean[h, landmark_idx[h, l], :])   (rounded once)
 *   min_cos                        [Hkv, n_chunks] fp32, or NULL (for a tie-tolerant comparison of
 *                                  a GPU's outlier set)
 * A non-finite key anywhere in K (the local window included) is an error naming its position. */
int ref_shadowkv_chunks(const kvb_bf16 *K, int Hkv, int S, int D, int c, int local_chunks,
                        int outlier_chunks, kvb_bf16 *landmarks, int32_t *landmark_idx,
                        int32_t *outliers, float *min_cos);

/* Post-RoPE bf16 keys K [Hkv, S, D] of one prompt from Kpre [S, Hkv*D] with a rotate-half table
 * cos_sin [S, D] (rope_table: cos in [0, D/2), sin in [D/2, D)), in double with one rounding: the keys a
 * prefill would have cached, the input of steps 2-4. */
void ref_shadowkv_rope_keys(const float *Kpre, const kvb_bf16 *cos_sin, int S, int Hkv, int D, kvb_bf16 *K);

/* ---- the GPU buffer and the host values ------------------------------------------------------- */

/* The buffer [B, Hkv, NB, D] of one layer, in token order:
 *   [0, n_local)                       local window: tokens [n_chunks*c, S) of the prompt
 *                                      (n_local = S - n_chunks*c = local_chunks*c + S mod c)
 *   [outlier_start, sparse_start)      the outlier chunks, ascending chunk id, c tokens each
 *   [sparse_start, decode_start)       M chunk slots (gather_copy, batch_gemm_rotary)
 *   [decode_start, NB)                 decode_capacity tokens generated during decode
 * and the host values: per (b, h) a run of host_chunks = n_chunks chunks (every chunk before the
 * local window, chunk id = position in the run), host_stride = n_chunks. `g` is the gather_layout
 * of gather_copy.h with exactly these values. */
typedef struct shadowkv_layout {
    int S, c, local_chunks, outlier_chunks;
    int n_chunks;        /* floor(S/c) - local_chunks */
    int Lm;              /* n_chunks - outlier_chunks landmarks per head */
    int n_local;         /* S - n_chunks*c local tokens */
    int outlier_start;   /* = n_local */
    int decode_start;    /* = g.sparse_start + M*c */
    int decode_capacity; /* tokens after the sparse region */
    gather_layout g;     /* B, Hkv, M, c, D, NB, sparse_start, host_chunks, host_stride */
} shadowkv_layout;

/* Fill *L. Checks the chunk counts (shadowkv_chunk_counts), M in [1, min(GATHER_MAX_M, Lm)] (the
 * sparse slots hold distinct landmark chunks), decode_capacity >= 0, and the gather_layout
 * (gather_layout_check: chunk bytes and slot alignment, B, Hkv, D ranges). */
int shadowkv_layout_make(shadowkv_layout *L, int B, int Hkv, int D, int S, int c, int local_chunks,
                         int outlier_chunks, int M, int decode_capacity);

/* One batch element: X [Hkv, S, D] (post-RoPE keys, or values) into buf [Hkv, NB, D]:
 *   buf[h, j, :]                          = X[h, n_chunks*c + j, :]             j < n_local
 *   buf[h, outlier_start + o*c + i, :]    = X[h, outliers[h, o]*c + i, :]       o < outlier_chunks
 * The sparse and decode regions are left untouched. outliers [Hkv, outlier_chunks] as
 * ref_shadowkv_chunks returns them (each id in [0, n_chunks), ascending, no repeats). */
int ref_shadowkv_fill_buffer(const kvb_bf16 *X, const int32_t *outliers, const shadowkv_layout *L,
                             kvb_bf16 *buf);

/* One batch element: V [Hkv, S, D] into Vh [Hkv, host_stride, c, D], chunk-major:
 *   Vh[h, k, i, :] = V[h, k*c + i, :]        k < n_chunks, i < c */
int ref_shadowkv_host_values(const kvb_bf16 *V, const shadowkv_layout *L, kvb_bf16 *Vh);

#ifdef __cplusplus
}
#endif
#endif
