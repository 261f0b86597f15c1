/* batch_gemm_rotary.h: CUDA API of ShadowKV's low-rank key reconstruction fused with RoPE (the contract:
 * kernels/batch_gemm_rotary/NOTES.md; reference: reference/batch_gemm_rotary.h, the same arguments).
 *
 * For every (b, h) and miss slot token s (chunk slot s / c >= cnts[b, h]):
 *   Kbuf[b, h, sparse_start + s, :] = bf16(rope(U[b, p, :] x SV[b, h], p)),  p = ids[b, h, s / c] * c + s % c
 * with the product accumulated in fp32 and one rounding at the end; hit slots and every other buffer
 * row are left untouched.
 *
 * Validation. Everything the host can see is checked before anything is launched (KVB_EINVAL naming
 * the parameter, its value and the range; batch_gemm_rotary_check of the reference plus the kernel's
 * own limits below). ids and cnts are device data the API does not copy back: callers holding host
 * copies check them with batch_gemm_rotary_check (the harness does, in its reference, before any
 * launch). On the device the kernels never read outside U or the table: a cnts[b, h] outside [0, M]
 * skips that (b, h) and ORs 1 into *bad, a miss slot's id outside [0, S / c) skips the slot's tokens
 * (their rows keep their contents) and ORs 2 into *bad. `bad` is a device int32 the caller zeroes
 * (NULL: not reported). Positions are < (S / c) * c, so max_pos >= (S / c) * c is required up front.
 *
 * Layouts (bf16 unless said): U [B, S, r], SV [B, Hkv, r, D], cos_sin [max_pos, D] (rope_table),
 * ids [B, Hkv, M] int32 in slot order, cnts [B, Hkv] int32, Kbuf [B, Hkv, NB, D] (gather_layout g;
 * g->host_chunks and host_stride are not used here beyond gather_layout_check). U, SV, cos_sin and Kbuf
 * 16-byte aligned. Launches are asynchronous on `stream`.
 */
#ifndef KVB_KERNELS_BATCH_GEMM_ROTARY_H
#define KVB_KERNELS_BATCH_GEMM_ROTARY_H

#include <cuda_runtime_api.h>
#include <stddef.h>

#include "reference/batch_gemm_rotary.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The kernel's limits (the reference takes r up to BGR_MAX_RANK and any even D): r in [1,
 * BGR_KERNEL_MAX_RANK] (padded with zeros to the next of 16, 32, 64, 96, 128, 160, 192, 256), D in {64, 128}. */

/* The fused kernel: tensor-core products (mma.sync bf16, fp32 accumulate) of gathered U rows with SV
 * held in registers, RoPE in registers, one bf16 rounding, one write per key. */
int batch_gemm_rotary(const kvb_bf16 *U, const kvb_bf16 *SV, const int32_t *ids, const int32_t *cnts,
                      const kvb_bf16 *cos_sin, const gather_layout *g, int S, int r, int max_pos, rope_kind rope,
                      kvb_bf16 *Kbuf, int32_t *bad, cudaStream_t stream);

/* *bad = 0 by a one-thread kernel on `stream`: in a CUDA graph a memset node held the kernel node after
 * it 12-53 us on the H200 (kernels/step/NOTES.md), a kernel node does not. bad must not be NULL. */
int batch_gemm_rotary_clear_bad(int32_t *bad, cudaStream_t stream);

/* The composed peer (ShadowKV's own structure): a kernel gathers the miss tokens' U rows into a
 * contiguous buffer (M*c rows per (b, h)), cuBLAS multiplies each (b, h) batch with its SV
 * (cublasGemmStridedBatchedEx: bf16 in, fp32 compute, fp32 out so that the keys are rounded once, as
 * the contract asks), and a second kernel applies RoPE and writes the miss slots. Any D the
 * reference takes (D <= 1024), r in [1, BGR_MAX_RANK]. `cublas_handle` is a cublasHandle_t; the
 * call binds it to `stream`. workspace: batch_gemm_rotary_composed_workspace_bytes(g, r) bytes. */
size_t batch_gemm_rotary_composed_workspace_bytes(const gather_layout *g, int r);
int batch_gemm_rotary_composed(void *cublas_handle, const kvb_bf16 *U, const kvb_bf16 *SV, const int32_t *ids,
                               const int32_t *cnts, const kvb_bf16 *cos_sin, const gather_layout *g, int S, int r,
                               int max_pos, rope_kind rope, kvb_bf16 *Kbuf, int32_t *bad, void *workspace,
                               size_t workspace_bytes, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
