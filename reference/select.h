/* select.h: the reference selection family: top-k (contract: kernels/select/NOTES.md; the order of
 * kernels/select/select.h), max-pooling along rows, the gather of kept rows. */
#ifndef KVB_REF_SELECT_H
#define KVB_REF_SELECT_H

#include <stdint.h>

#include "reference/kvb.h"

/* Order-preserving key of a float: larger float, larger key; -0 and +0 equal; NaN by its bits. */
uint32_t topk_order_key(float f);

/* idx[r, 0:k] (row stride ldo) = the k largest of scores[r, 0:n] (row stride ld), ties to the lower
 * index, ascending. KVB_EINVAL naming the parameter when k is outside [0, n], n outside [0, 2^21],
 * rows < 1, ld < n or ldo < k. (The topk kernel of the suite is specified for k up to 8192; the
 * selections of heavy hitters take more.) */
int ref_topk(const float *scores, int rows, int64_t ld, int n, int k, int32_t *idx, int64_t ldo);

/* y[r, j] = max of x[r, j - ks/2 .. j + ks/2] clipped to [0, L). */
int ref_maxpool(const float *x, int rows, int L, int ks, float *y);

/* Y[r, i, :] = X[r / group, keep[r, i], :] for r < rows, i < n_keep; X [rows / group, L, D]. */
int ref_gather_rows(const kvb_bf16 *X, int rows, int group, int L, int D, const int32_t *keep, int n_keep,
                    kvb_bf16 *Y);

#endif
