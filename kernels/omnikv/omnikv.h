/* omnikv.h: CUDA API of OmniKV's filter-layer token selector (contract: kernels/omnikv/NOTES.md;
 * definition, layout and checks: reference/omnikv.h). The selection goes through the suite's one
 * top-k (kernels/select/select.h topk_rows).
 *
 * Every function validates its parameters before launching anything and returns KVB_OK, or KVB_EINVAL
 * with kvb_last_error() naming the parameter, its value and the allowed range. q and K must be 16-byte
 * aligned (cudaMalloc'd buffers are). Launches are asynchronous on `stream`; pointers are device
 * pointers unless named *_host.
 */
#ifndef KVB_KERNELS_OMNIKV_H
#define KVB_KERNELS_OMNIKV_H

#include <cuda_runtime_api.h>
#include <stddef.h>

#include "reference/omnikv.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Device workspace of omnikv_select for this layout: the scores [B, L] fp32 (used when the caller
 * passes scores = NULL) and topk_rows' workspace. Nothing in it needs zeroing. 0 for a layout that
 * omnikv_layout_check refuses. */
size_t omnikv_select_workspace_bytes(const omnikv_layout *s);

/* idx [B, k] int32 = ref_omnikv_select's selection: the k tokens of largest max-over-heads score, ties
 * to the lower index, ascending. scores [B, L] fp32 (or NULL: kept in the workspace): q.K / sqrt(D)
 * from bf16 tensor-core products with fp32 accumulation, max over the Hq heads, -inf past len[b].
 * `len` is the device copy of the prompt lengths and `len_host` the same values on the host: they
 * are checked (1 <= len[b] <= L, 1 <= k <= min len[b]) before the launch. */
int omnikv_select(const kvb_bf16 *q, const kvb_bf16 *K, const int32_t *len, const int32_t *len_host,
                  const omnikv_layout *s, int k, int32_t *idx, float *scores, void *workspace, size_t workspace_bytes,
                  cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
