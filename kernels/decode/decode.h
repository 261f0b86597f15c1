/* decode.h: CUDA API of dense and sparse decode attention (contract: kernels/decode/NOTES.md;
 * reference: reference/decode.h).
 *
 * Every function validates its parameters before launching anything and returns KVB_OK, or
 * KVB_EINVAL with kvb_last_error() naming the parameter, its value and the allowed range. Launches
 * are asynchronous on `stream`; pointers are device pointers unless named *_host.
 */
#ifndef KVB_KERNELS_DECODE_H
#define KVB_KERNELS_DECODE_H

#include <cuda_runtime_api.h>

#include "reference/decode.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Device workspace of decode_attn for this layout: per-KV-head arrival counters and the partial
 * (max, sum, O) rows of the blocks that share a KV head. Zero it once; every launch leaves the
 * counters at zero again, so it can be reused by later launches with the same or a smaller layout
 * (one launch at a time). */
size_t decode_attn_workspace_bytes(const decode_layout *d);

/* o[b, h] = softmax(q[b, h] . K[b, h/G, :len[b]] / sqrt(D)) . V[b, h/G, :len[b]] (bf16 out, fp32
 * softmax and accumulation; bf16 tensor-core products). `len` is the device copy of the lengths and
 * `len_host` the same values on the host: they are checked (1 <= len[b] <= L),
 * size the grid and, where all are equal, stand for len in the kernel (so they must match it). */
int decode_attn(const kvb_bf16 *q, const kvb_bf16 *K, const kvb_bf16 *V, const int32_t *len, const int32_t *len_host,
                kvb_bf16 *o, const decode_layout *d, void *workspace, cudaStream_t stream);

/* Variants kept for comparison (same contract): `steps` = 16-token steps a warp loads before it
 * computes (1 or 2). decode_attn is decode_attn_variant(..., 1). */
int decode_attn_variant(const kvb_bf16 *q, const kvb_bf16 *K, const kvb_bf16 *V, const int32_t *len,
                        const int32_t *len_host, kvb_bf16 *o, const decode_layout *d, void *workspace, int steps,
                        cudaStream_t stream);

/* The decode step's cache write (ref_kv_append): knew, vnew [B, Hkv, D] to row t[b] of K, V. t is the
 * device copy, t_host the same values, checked (t[b] in [0, L)) before the launch. Bit-exact. */
int kv_append(const kvb_bf16 *knew, const kvb_bf16 *vnew, const int32_t *t, const int32_t *t_host, kvb_bf16 *K,
              kvb_bf16 *V, const decode_layout *d, cudaStream_t stream);

/* ---- sparse decode attention (reference/decode.h: sparse_layout, the list semantics) ----
 * The dense kernel with another token source: idx [B, Hkv, n] token lists or pages [B, Hkv, n] page
 * lists, of which the first cnt[b] entries are used (device copy cnt, host copy cnt_host: they size
 * the grid and, where all are equal, stand for cnt in the kernel). len / len_host as in decode_attn. idx_host / pages_host: the host copy of the lists,
 * checked before launch (every used entry inside its sequence's cache); NULL when the lists were made
 * on the device by the suite's producers (topk_rows, hybrid_score, quest_score), which keep them in
 * range; an entry outside the cache is then read as no token, never outside the buffers. workspace:
 * sparse_attn_workspace_bytes(), zeroed once (as for decode_attn). steps: 1 or 2, as in
 * decode_attn_variant. */
size_t sparse_attn_workspace_bytes(const sparse_layout *s);

int sparse_attn_idx(const kvb_bf16 *q, const kvb_bf16 *K, const kvb_bf16 *V, const int32_t *len, const int32_t *len_host,
                    const int32_t *idx, const int32_t *idx_host, const int32_t *cnt, const int32_t *cnt_host,
                    kvb_bf16 *o, const sparse_layout *s, void *workspace, int steps, cudaStream_t stream);

int sparse_attn_pages(const kvb_bf16 *q, const kvb_bf16 *K, const kvb_bf16 *V, const int32_t *len,
                      const int32_t *len_host, const int32_t *pages, const int32_t *pages_host, const int32_t *cnt,
                      const int32_t *cnt_host, kvb_bf16 *o, const sparse_layout *s, void *workspace, int steps,
                      cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
