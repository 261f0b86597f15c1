/* select.h: CUDA API of the selection family (contract: kernels/select/NOTES.md): the suite's one
 * top-k, used by heavy hitters and SnapKV++ (heavy_hitters.h) and by every later selection.
 *
 * Order: scores compare by an order-preserving 32-bit key of the fp32 bits (-0 equals +0; a NaN ranks
 * by its bits: +NaN above +inf, -NaN below -inf); ties go to the lower index; the output lists the
 * selected indices ascending. Deterministic: the same input gives the same output bits.
 *
 * Also the selections' row operations: max-pooling along a row, and the gather of kept rows.
 *
 * Algorithm: a radix select of the k-th largest key, 11 + 11 + 10 bits from the top, then an ordered
 * compaction (indices with a larger key, then the lowest-indexed equal ones, in index order).
 *   many rows: one block per row, everything in one kernel (the row is read from DRAM once, then from
 *              L1/L2);
 *   few rows:  a row split over several blocks so the whole GPU works on it: per pass a histogram
 *              kernel whose last block picks the digit, then a count and an ordered write;
 *   short rows (n <= 8192): the row's keys held in shared memory, one block per row, one launch.
 */
#ifndef KVB_KERNELS_SELECT_H
#define KVB_KERNELS_SELECT_H

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "reference/kvb.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TOPK_MAX_N 2097152 /* 2M */
#define TOPK_MAX_K 8192 /* the topk op's range; selections may take more (k <= n) */

/* Workspace for the plans that share a row among several blocks: the split plan's histograms and counts,
 * or a token 256 bytes for the cluster plan, which uses none (0 when one block per row is the plan). */
size_t topk_workspace_bytes(int rows, int n);

/* The blocks a row that topk_rows' cluster plan gives `rows` rows of n keys when a workspace is passed
 * (1 where that plan does not take them): a kernel that produces such rows can select them itself as
 * clusters of that size (kernels/page_scoring's normalization with its page top-k). */
int topk_cluster_blocks(int rows, int n);

/* idx[r, 0:k] (row stride ldo) = the k largest of scores[r, 0:n] (row stride ld), ascending; then
 * idx[r, k + i] = tail_first + i for i < tail_n (a window kept whole, as heavy hitters keep the recent
 * tokens). rows >= 1; 0 <= k <= n (k = n: every index); n <= TOPK_MAX_N;
 * ld >= n; ldo >= k + tail_n. workspace: topk_workspace_bytes(rows, n) bytes of device memory, or
 * NULL to use one block per row whatever the shape. */
int topk_rows(const float *scores, int rows, int64_t ld, int n, int k, int tail_first, int tail_n, int32_t *idx,
              int64_t ldo, void *workspace, cudaStream_t stream);

/* y[r, j] = max of x[r, j - ks/2 .. j + ks/2] clipped to [0, L); odd ks in [1, MAXPOOL_MAX_KS]. */
#define MAXPOOL_MAX_KS 8191
int maxpool_rows(const float *x, int rows, int L, int ks, float *y, cudaStream_t stream);

/* Y[r, i, :] = X[r / group, keep[r, i], :]; X [rows / group, L, D], D a multiple of 8. An index outside
 * [0, L) leaves its row unwritten. */
int gather_rows(const kvb_bf16 *X, int rows, int group, int L, int D, const int32_t *keep, int n_keep, kvb_bf16 *Y,
                cudaStream_t stream);
/* The same for two tensors gathered by one list (K and V), in one launch. */
int gather_rows_pair(const kvb_bf16 *X0, const kvb_bf16 *X1, int rows, int group, int L, int D, const int32_t *keep, int n_keep,
                     kvb_bf16 *Y0, kvb_bf16 *Y1, cudaStream_t stream);

/* KVB_EINVAL naming `who` unless rows >= 1 and L >= 1 (the selections' common check). */
int select_check_rows(const char *who, int rows, int L);

#ifdef __cplusplus
}
#endif
#endif
