/* batch_gemm_rotary.h: the reference of ShadowKV's low-rank key reconstruction fused with RoPE
 * (kernels/batch_gemm_rotary/NOTES.md), line by line:
 *
 *   for every (b, h) and sparse slot token s with chunk slot j = s / c >= cnts[b, h]
 *     p    = ids[b, h, j] * c + s % c                        absolute token position
 *     x[d] = sum_k U[b, p, k] * SV[b, h, k, d]               (double here; fp32 on the GPU)
 *     y    = rope(x, p)                                      llama: rotate-half; glm: partial interleaved
 *     Kbuf[b, h, sparse_start + s, :] = bf16(y)              one rounding, at the end
 *   hit slots (j < cnts[b, h]) are left untouched.
 *
 * Layouts: U [B, S, r], SV [B, Hkv, r, D], cos_sin [max_pos, D], all bf16; ids [B, Hkv, M] and
 * cnts [B, Hkv] int32; Kbuf [B, Hkv, NB, D] bf16 (gather_layout g: B, Hkv, M, c, D, NB, sparse_start).
 */
#ifndef KVB_REF_BATCH_GEMM_ROTARY_H
#define KVB_REF_BATCH_GEMM_ROTARY_H

#include <stdint.h>

#include "reference/gather_copy.h"
#include "reference/kvb.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { ROPE_LLAMA = 0, ROPE_GLM = 1 } rope_kind;

#define BGR_MAX_RANK 1024
/* the CUDA kernel's rank limit (kernels/batch_gemm_rotary/): cases refuse a larger rank for it before setup */
#define BGR_KERNEL_MAX_RANK 256

/* The RoPE table: row p, for llama cos(p f_i) for i < D/2 then sin(p f_i), f_i = theta^(-2i/D); for
 * glm (rotary on the first D/2 dims) cos(p g_i) for i < D/4 then sin(p g_i), g_i = theta^(-2i/(D/2)),
 * the rest of the row 0. Rounded once to bf16, as stored. */
int rope_table(kvb_bf16 *cos_sin, int max_pos, int D, double theta, rope_kind rope);

/* The contract's checks, shared by the reference and the CUDA API
 * (kernels/batch_gemm_rotary/batch_gemm_rotary.h): KVB_EINVAL, the message starting with `who` and
 * naming the parameter, when: the layout is invalid (gather_layout_check), r outside [1, BGR_MAX_RANK],
 * rope not a rope_kind, D odd (llama) or not a multiple of 4 (glm), S < c; and, when ids and cnts are
 * given (host copies; NULL skips the data checks), cnts[b, h] outside [0, M], a miss slot's chunk id
 * outside [0, S / c) (its tokens outside the context), or a position at or past max_pos. */
int batch_gemm_rotary_check(const int32_t *ids, const int32_t *cnts, const gather_layout *g, int S, int r, int max_pos,
                            rope_kind rope, const char *who);

/* The reference; refuses what batch_gemm_rotary_check refuses (who = "batch_gemm_rotary"), writing nothing. */
int ref_batch_gemm_rotary(const kvb_bf16 *U, const kvb_bf16 *SV, const int32_t *ids, const int32_t *cnts,
                          const kvb_bf16 *cos_sin, const gather_layout *g, int S, int r, int max_pos, rope_kind rope,
                          kvb_bf16 *Kbuf);

/* The same on a sample of (b, h) slices: only those with mask[b * Hkv + h] != 0 are computed (mask NULL:
 * all); the checks still cover every slice. For cases whose whole reference would take too long. */
int ref_batch_gemm_rotary_sampled(const kvb_bf16 *U, const kvb_bf16 *SV, const int32_t *ids, const int32_t *cnts,
                                  const kvb_bf16 *cos_sin, const gather_layout *g, int S, int r, int max_pos,
                                  rope_kind rope, const uint8_t *mask, kvb_bf16 *Kbuf);

#ifdef __cplusplus
}
#endif
#endif
