/* heavy_hitters.h: CUDA API of the token selections at the end of prefill (spec: selective_attn.md;
 * semantics and budgets in reference/heavy_hitters.h): MiniKV heavy hitters, SnapKV++ pooling and
 * selection (both through the suite's top-k, select.h), and the gather of the kept K, V rows.
 *
 * Every function validates its parameters before launching anything and returns KVB_OK, or
 * KVB_EINVAL with kvb_last_error() naming the parameter, its value and the allowed range. Launches
 * are asynchronous on `stream`; pointers are device pointers.
 */
#ifndef KVB_KERNELS_HEAVY_HITTERS_H
#define KVB_KERNELS_HEAVY_HITTERS_H

#include <cuda_runtime_api.h>

#include "../reference/heavy_hitters.h"
#include "select.h"

#ifdef __cplusplus
extern "C" {
#endif

/* keep [rows, n_keep] (hh_budget) from scores [rows, L]. */
int heavy_hitters_keep(const float *scores, int rows, int L, int n_hh, int n_rw, int32_t *keep, cudaStream_t stream);

/* y[r, j] = max of x[r, j - ks/2 .. j + ks/2] clipped to [0, L); odd ks in [1, SNAPKV_MAX_KS]. */
int maxpool_rows(const float *x, int rows, int L, int ks, float *y, cudaStream_t stream);

/* keep [rows, n_keep] (snapkv_budget) from pooled [rows, L]. */
int snapkv_keep(const float *pooled, int rows, int L, int W, int n_keep, int32_t *keep, cudaStream_t stream);

/* Y[r, i, :] = X[r / group, keep[r, i], :]; X [rows / group, L, D], D a multiple of 8. An index outside
 * [0, L) leaves its row unwritten. */
int gather_rows(const kvb_bf16 *X, int rows, int group, int L, int D, const int32_t *keep, int n_keep, kvb_bf16 *Y,
                cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
