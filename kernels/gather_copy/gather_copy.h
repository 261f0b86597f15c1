/* gather_copy.h: CUDA API of the gather_copy family (the contract: kernels/gather_copy/NOTES.md).
 *
 * Every function validates its parameters before launching anything and returns KVB_OK, or
 * KVB_EINVAL with kvb_last_error() naming the parameter, its value and the allowed range. Launches
 * are asynchronous on `stream`. Pointers are device pointers, except Vh / KVh, which are pinned host
 * memory allocated with cudaHostAllocMapped (read in place by the kernels over PCIe, zero-copy).
 */
#ifndef KVB_KERNELS_GATHER_COPY_H
#define KVB_KERNELS_GATHER_COPY_H

#include <cuda_runtime_api.h>

#include "reference/gather_copy.h"

#ifdef __cplusplus
extern "C" {
#endif

/* index_scan: see ref_index_scan. One block per (b, h); ids are sorted in shared memory. */
int index_scan(int32_t *cached_ids, const int32_t *new_ids, int32_t *offsets, int32_t *cnts, int B,
               int Hkv, int M, cudaStream_t stream);

/* gather_copy and gather_copy_d2d order their in-place moves through a small device workspace
 * (a block ticket, a launch epoch and one flag per block). Allocate gather_copy_workspace_bytes(g),
 * zero it once, and reuse it for every later launch with the same or a smaller layout. Launches that
 * may run concurrently (say V and K on two streams) need separate workspaces. */
size_t gather_copy_workspace_bytes(const gather_layout *g);

/* Vbuf[slot i] = i < cnt ? Vbuf_before[slot offsets[i]] : Vh[chunk offsets[i]]: hits move inside
 * device memory, misses are read from pinned host memory, both in one launch. */
int gather_copy(const kvb_bf16 *Vh, kvb_bf16 *Vbuf, const int32_t *offsets, const int32_t *cnts,
                const gather_layout *g, void *workspace, cudaStream_t stream);

/* Kbuf[slot i] = Kbuf_before[slot offsets[i]] for i < cnt; the miss slots are left untouched. */
int gather_copy_d2d(kvb_bf16 *Kbuf, const int32_t *offsets, const int32_t *cnts, const gather_layout *g,
                    void *workspace, cudaStream_t stream);

/* Vbuf[slot i] = Vh[chunk offsets[i]] for i >= cnt; the hit slots are left untouched: the misses of
 * gather_copy, once gather_copy_d2d moved the hits in the same buffer (on the same stream, or ordered
 * before this launch). Nothing is read in place, so no workspace. The grid is min(ranges of slots,
 * max_blocks) blocks, max_blocks in [1, 65535], each block looping over ranges: the host reads keep
 * the link's rate on a few blocks and leave the other SMs to the kernels beside them. */
int gather_copy_misses(const kvb_bf16 *Vh, kvb_bf16 *Vbuf, const int32_t *offsets, const int32_t *cnts,
                       const gather_layout *g, int max_blocks, cudaStream_t stream);

/* Vbuf[slot i] = Vh[chunk ids[b,h,i]] for every slot (no cache). */
int gather_copy_all(const kvb_bf16 *Vh, kvb_bf16 *Vbuf, const int32_t *ids, const gather_layout *g,
                    cudaStream_t stream);

/* The same through the SM's bulk-copy (TMA) engine: an experimental variant kept for comparison. */
int gather_copy_all_tma(const kvb_bf16 *Vh, kvb_bf16 *Vbuf, const int32_t *ids, const gather_layout *g,
                        cudaStream_t stream);

/* KVg[l][b, i, :] = KVh[l][b, idx[b, i], :] for all layers of the segment, one launch.
 * KVh and KVg are host arrays of p->layers pointers (pinned host rows, device rows). */
int packed_load(const kvb_bf16 *const *KVh, kvb_bf16 *const *KVg, const int32_t *idx,
                const packed_layout *p, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
