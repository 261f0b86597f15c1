/* block.h: CUDA API of the transformer block's stages (reference/step/block.h; kernels/step/NOTES.md):
 * RMSNorm, RoPE with the q/k/v split, SiLU-gated product, and the projections through cuBLAS (bf16 in
 * and out, fp32 accumulation). Each validates its parameters before launching anything and returns
 * KVB_OK or KVB_EINVAL naming the parameter; launches are asynchronous on `stream`. */
#ifndef KVB_KERNELS_BLOCK_H
#define KVB_KERNELS_BLOCK_H

#include <cuda_runtime_api.h>

#include "reference/step/block.h"

#ifdef __cplusplus
extern "C" {
#endif

/* y = rmsnorm(x) * w (ref_rmsnorm), rows of n (a multiple of 8, at most 65536); copy: NULL, or a second
 * output receiving x itself (the residual the next projection adds to, in the same pass). */
int block_rmsnorm(const kvb_bf16 *x, const kvb_bf16 *w, int rows, int n, double eps, kvb_bf16 *y, kvb_bf16 *copy,
                  cudaStream_t stream);

/* ref_rope_split: q, knew rotated at their sequence's position (pos: device copy; pos_host checked
 * against max_pos), vnew copied. D even, at most 256. */
int block_rope_split(const kvb_bf16 *qkv, const kvb_bf16 *cos_sin, const int32_t *pos, const int32_t *pos_host,
                     int max_pos, int B, int Hq, int Hkv, int D, kvb_bf16 *q, kvb_bf16 *knew, kvb_bf16 *vnew,
                     cudaStream_t stream);

/* ref_silu_mul over rows x ffn. */
int block_silu_mul(const kvb_bf16 *gate_up, int rows, int ffn, kvb_bf16 *y, cudaStream_t stream);

/* y[r] = W x[r] (+ y[r] when accumulate), W [out, in] row-major bf16: one cuBLAS GEMM (fp32 compute). The
 * handle is the caller's (block_cublas_create: a handle with its own workspace, so a CUDA graph can
 * capture it). */
int block_linear(void *cublas, const kvb_bf16 *x, const kvb_bf16 *W, int rows, int in, int out, int accumulate,
                 kvb_bf16 *y, cudaStream_t stream);
int block_cublas_create(void **cublas, void **workspace);
void block_cublas_destroy(void *cublas, void *workspace);

/* [p, p + bytes) read once through L2 ahead of its reader (loads whose values are dropped): p 16-byte
 * aligned, bytes a multiple of 16. A hint: the reader is correct whether or not the lines are there. */
int block_prefetch_l2(const void *p, size_t bytes, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
