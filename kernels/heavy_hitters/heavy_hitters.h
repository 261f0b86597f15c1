/* heavy_hitters.h: CUDA API of the token selections at the end of prefill (contract:
 * kernels/heavy_hitters/NOTES.md; semantics and budgets in reference/heavy_hitters.h): MiniKV heavy
 * hitters and SnapKV++'s selection, composed from the selection family (select.h: top-k, max-pooling,
 * the gather of kept K, V rows).
 *
 * Every function validates its parameters before launching anything and returns KVB_OK, or
 * KVB_EINVAL with kvb_last_error() naming the parameter, its value and the allowed range. Launches
 * are asynchronous on `stream`; pointers are device pointers.
 */
#ifndef KVB_KERNELS_HEAVY_HITTERS_H
#define KVB_KERNELS_HEAVY_HITTERS_H

#include <cuda_runtime_api.h>

#include "reference/heavy_hitters.h"
#include "kernels/select/select.h"

#ifdef __cplusplus
extern "C" {
#endif

/* keep [rows, n_keep] (hh_budget) from scores [rows, L]. workspace: heavy_hitters_keep_workspace_bytes
 * of device memory for the top-k's plans that share a row among blocks, or NULL for one block a row. */
size_t heavy_hitters_keep_workspace_bytes(int rows, int L, int n_hh, int n_rw);
int heavy_hitters_keep(const float *scores, int rows, int L, int n_hh, int n_rw, int32_t *keep, void *workspace,
                       cudaStream_t stream);

/* keep [rows, n_keep] (snapkv_budget) from pooled [rows, L]; workspace as above. */
size_t snapkv_keep_workspace_bytes(int rows, int L, int W, int n_keep);
int snapkv_keep(const float *pooled, int rows, int L, int W, int n_keep, int32_t *keep, void *workspace,
                cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
