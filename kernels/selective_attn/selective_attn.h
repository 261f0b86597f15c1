/* selective_attn.h: CUDA API of selective flash attention (the semantics, layouts and parameter
 * checks are those of reference/selective_attn.h; contract, budget and design notes:
 * kernels/selective_attn/NOTES.md).
 *
 * Every function validates its parameters before launching anything and returns KVB_OK, or
 * KVB_EINVAL with kvb_last_error() naming the parameter, its value and the allowed range. Launches
 * are asynchronous on `stream`; pointers are device pointers.
 *
 * Two implementations of the two passes below. On a compute capability 9.0 device (H100, H200) the
 * entry points without a suffix run the Hopper kernels of selective_attn_wgmma.cu and
 * selective_attn_lse_packed.cu (wgmma, TMA, a
 * producer warpgroup and consumer warpgroups; design in that file) for the column sums and, with
 * need_out=1, for the forward; the forward with need_out=0 (a few rows from w0 on, keys split over
 * CTAs) runs the Hopper LSE pass when the G heads' rows fit one packed tile with a multiple of 8 rows
 * a head, else the mma.sync kernels, as every other device does. The *_mma entry points always run the
 * mma.sync kernels and the *_wgmma ones always the Hopper kernels (KVB_EDEVICE elsewhere): A/B.
 *
 * Design of the mma.sync passes (mma.sync m16n8k16 bf16 -> fp32, ldmatrix):
 *   1. forward, query-block-major: one CTA per 128 query rows of one head, online softmax over
 *      64-key tiles (cp.async, 3 stages), O and LSE written once. With need_out=0 only the rows
 *      w0..L-1 are computed and V is not read; when the G query heads of a KV head have at most 128
 *      such rows together, one CTA's tile holds them all (the packed tile: a KV head's keys are
 *      read once for its G heads); when the CTAs are too few to fill the device, the keys are split
 *      over several CTAs whose partial (max, sum) a second small kernel merges in a fixed order
 *      (workspace O(B * Hq * rows)).
 *   2. column sums, key-block-major: one CTA per 128 keys of one KV head keeps those keys in
 *      registers, loops over the G query heads of the KV head and their query tiles from w0 on,
 *      recomputes q.k and adds exp(s - LSE[i]) per key in registers. Each colsum element (and each
 *      colsum_kv element) is written once, by the CTA that owns its key: no atomics, the result is
 *      independent of launch order.
 */
#ifndef KVB_KERNELS_SELECTIVE_ATTN_H
#define KVB_KERNELS_SELECTIVE_ATTN_H

#include <cuda_runtime_api.h>

#include "reference/selective_attn.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Device workspace selective_attn needs for `p` (0 with need_out=1; the split partials otherwise). */
size_t selective_attn_workspace_bytes(const sattn_params *p);

/* O (need_out=1, else may be NULL), LSE, colsum, colsum_kv (group_sum=1, else may be NULL). */
int selective_attn(const kvb_bf16 *Q, const kvb_bf16 *K, const kvb_bf16 *V, const sattn_params *p, kvb_bf16 *O,
                   float *LSE, float *colsum, float *colsum_kv, void *workspace, size_t workspace_bytes,
                   cudaStream_t stream);

/* Pass 1 alone: the suite's flash-attention forward, O and LSE, no column sums (need_out=1). */
int selective_attn_fwd(const kvb_bf16 *Q, const kvb_bf16 *K, const kvb_bf16 *V, const sattn_params *p, kvb_bf16 *O,
                       float *LSE, cudaStream_t stream);

/* Pass 2 alone: column sums from a given LSE (laid out as p->need_out says). */
int selective_attn_colsum(const kvb_bf16 *Q, const kvb_bf16 *K, const float *LSE, const sattn_params *p, float *colsum,
                          float *colsum_kv, cudaStream_t stream);

/* The same three, always on the mma.sync kernels (any sm_80+ device). */
int selective_attn_mma(const kvb_bf16 *Q, const kvb_bf16 *K, const kvb_bf16 *V, const sattn_params *p, kvb_bf16 *O,
                       float *LSE, float *colsum, float *colsum_kv, void *workspace, size_t workspace_bytes,
                       cudaStream_t stream);
int selective_attn_fwd_mma(const kvb_bf16 *Q, const kvb_bf16 *K, const kvb_bf16 *V, const sattn_params *p, kvb_bf16 *O,
                           float *LSE, cudaStream_t stream);
int selective_attn_colsum_mma(const kvb_bf16 *Q, const kvb_bf16 *K, const float *LSE, const sattn_params *p, float *colsum,
                              float *colsum_kv, cudaStream_t stream);

/* The Hopper passes (selective_attn_wgmma.cu). selective_attn_wgmma_supported: 1 when the current
 * device runs them (compute capability 9.0 and the driver's tensor-map encoder), else 0.
 * selective_attn_fwd_wgmma needs need_out=1. */
int selective_attn_wgmma_supported(void);
int selective_attn_fwd_wgmma(const kvb_bf16 *Q, const kvb_bf16 *K, const kvb_bf16 *V, const sattn_params *p, kvb_bf16 *O,
                             float *LSE, cudaStream_t stream);
int selective_attn_colsum_wgmma(const kvb_bf16 *Q, const kvb_bf16 *K, const float *LSE, const sattn_params *p,
                                float *colsum, float *colsum_kv, cudaStream_t stream);
/* The need_out=0 LSE of a packed window (G*(L-w0) <= 128, L-w0 a multiple of 8) over `splits` ranges of
 * split_keys keys: LSE with one split, else each split's partial (max in log2 units, sum) per row in
 * part_m, part_l as selective_attn.cu's merge expects them. selective_attn runs it with its own plan. */
int selective_attn_lse_packed_wgmma(const kvb_bf16 *Q, const kvb_bf16 *K, const sattn_params *p, int splits, int split_keys,
                                    float *LSE, float *part_m, float *part_l, cudaStream_t stream);

/* The materialized peer a user would write with cuBLAS: per chunk of KV heads, S = Q K^T (strided
 * batched GEMM, fp32), a softmax kernel (LSE, P in fp32 and bf16), a column-sum kernel over P (fp32,
 * double accumulation), O = P V (GEMM). `cublas_handle` is a cublasHandle_t bound to `stream`.
 * materialized_workspace_bytes: the S and P buffers of one chunk (KVB_EINVAL when one KV head's G
 * query heads alone need more than SATTN_MATERIALIZED_MAX_BYTES). */
#define SATTN_MATERIALIZED_MAX_BYTES (40ull << 30)
int selective_attn_materialized_workspace_bytes(const sattn_params *p, size_t *bytes);
int selective_attn_materialized(void *cublas_handle, const kvb_bf16 *Q, const kvb_bf16 *K, const kvb_bf16 *V,
                                const sattn_params *p, kvb_bf16 *O, float *LSE, float *colsum, float *colsum_kv,
                                void *workspace, size_t workspace_bytes, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
