/* gather_baselines.h: the obvious ways to do gather_copy's work without the suite's kernels, kept
 * beside the kernels as the baselines their goals are stated against (kernels/gather_copy/NOTES.md).
 *
 * Each enqueues copies on `stream` and returns KVB_OK, or KVB_EDEVICE with kvb_last_error() naming
 * the failed CUDA call. Ids, offsets and counts are HOST arrays (such a baseline has to read them on
 * the host); Vh / KVh are pinned host memory; buffers are device memory. `staging` is pinned host
 * memory of at least the bytes the *_staging_bytes function gives (planned by the caller, so nothing
 * is allocated here); the CPU writes it before the copy is enqueued, so the caller must not reuse
 * it until the stream has passed the copy.
 */
#ifndef KVB_KERNELS_GATHER_BASELINES_H
#define KVB_KERNELS_GATHER_BASELINES_H

#include <cuda_runtime_api.h>

#include "reference/gather_copy.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The update of one step, chunk by chunk: each hit that moves is one D2D copy (ascending slot order,
 * so the stream keeps a move from overwriting a chunk still to be moved), then, when with_misses,
 * each miss one H2D copy from Vh (Vh may be NULL when with_misses is 0). */
int gather_memcpy_chunks(kvb_bf16 *buf, const kvb_bf16 *Vh, const int32_t *offsets, const int32_t *cnts,
                         const gather_layout *g, int with_misses, cudaStream_t stream);

size_t gather_cpu_staging_bytes(const gather_layout *g);
/* The misses gathered by the CPU into staging, then one H2D copy per (b, h) row (a row's misses fill
 * its slots cnt .. M-1). The hits must have been moved already (gather_copy_d2d on the same stream). */
int gather_cpu_misses(kvb_bf16 *Vbuf, const kvb_bf16 *Vh, const int32_t *offsets, const int32_t *cnts,
                      const gather_layout *g, void *staging, cudaStream_t stream);

/* Fetch of every selected chunk (ids [B*Hkv, M]) from Vh: */
/* one cudaMemcpyAsync per chunk; */
int gather_all_memcpy_chunks(kvb_bf16 *Vbuf, const kvb_bf16 *Vh, const int32_t *ids, const gather_layout *g,
                             cudaStream_t stream);
/* the copy engines, one cudaMemcpyBatchAsync of per-chunk copies; the three arrays of
 * B*Hkv*M entries are the batch's descriptors, filled here (host memory owned by the caller); */
int gather_all_ce_batch(kvb_bf16 *Vbuf, const kvb_bf16 *Vh, const int32_t *ids, const gather_layout *g,
                        void **batch_dst, void **batch_src, size_t *batch_size, cudaStream_t stream);
/* the CPU packs every row's chunks in staging, then one 2D copy into the sparse regions. */
int gather_all_cpu(kvb_bf16 *Vbuf, const kvb_bf16 *Vh, const int32_t *ids, const gather_layout *g, void *staging,
                   cudaStream_t stream);

/* packed_load without the kernel (idx [B, k] on the host): */
/* one cudaMemcpyAsync per selected row and layer; */
int packed_load_memcpy_rows(const kvb_bf16 *const *KVh, kvb_bf16 *const *KVg, const int32_t *idx,
                            const packed_layout *p, cudaStream_t stream);
size_t packed_cpu_staging_bytes(const packed_layout *p);
/* every layer's rows packed by the CPU in KVg's layout (KVg[l] = KVg[0] + l*B*k rows), then one copy. */
int packed_load_cpu(const kvb_bf16 *const *KVh, kvb_bf16 *const *KVg, const int32_t *idx, const packed_layout *p,
                    void *staging, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif
