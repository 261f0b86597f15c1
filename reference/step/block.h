/* block.h: one transformer block decoding one token for B sequences (kernels/step/NOTES.md), the dense
 * method, and the stages it is made of:
 *
 *   x -> RMSNorm -> QKV projection -> RoPE(q, k at pos) -> K, V row pos <- k, v -> decode attention
 *     -> output projection -> + x = h -> RMSNorm -> down(SiLU(gate(z)) * up(z)) -> + h = y
 *
 * Every stage reads bf16 and writes bf16, rounded once from double here (fp32 on the GPU), so the
 * reference and the kernels round at the same places. Weights are row-major [out, in] (nn.Linear's
 * layout), seeded normal scaled by 1/sqrt(in) in the harness; the norms' weights are 1 + small noise.
 */
#ifndef REF_BLOCK_H
#define REF_BLOCK_H

#include <stdint.h>

#include "reference/decode.h"
#include "reference/kvb.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct block_preset {
    const char *name;
    int hidden, Hq, Hkv, D, ffn, layers;
    double theta, eps; /* RoPE base (llama rotate-half), RMSNorm epsilon */
} block_preset;

/* "tiny" (hidden 256, Hq 4, Hkv 2, D 64, ffn 512, 2 layers: the CPU reference of the whole step),
 * "llama3-8b" (4096, 32, 8, 128, 14336, 32 layers, theta 500000), "llama2-7b" (4096, 32, 32, 128, 11008,
 * 32 layers, theta 10000). NULL for another name. */
const block_preset *block_preset_find(const char *name);
/* The preset names, "|"-separated (for a case key's choices). */
#define BLOCK_PRESETS "tiny|llama3-8b|llama2-7b"

typedef struct block_weights {
    const kvb_bf16 *norm1, *norm2; /* [hidden] */
    const kvb_bf16 *qkv;           /* [(Hq + 2 Hkv) D, hidden]: q rows, then k, then v */
    const kvb_bf16 *o;             /* [hidden, Hq D] */
    const kvb_bf16 *gate_up;       /* [2 ffn, hidden]: gate rows, then up rows */
    const kvb_bf16 *down;          /* [hidden, ffn] */
} block_weights;

/* Weight elements of one block (the bytes a step reads: 2 x this). */
int64_t block_weight_elems(const block_preset *m);

/* ---- stages ---- */

/* y[r] = bf16(x[r] / sqrt(mean_i x[r][i]^2 + eps) * w), rows of n. */
void ref_rmsnorm(const kvb_bf16 *x, const kvb_bf16 *w, int rows, int n, double eps, kvb_bf16 *y);
/* y[r] = bf16(W x[r] (+ add[r])), W [out, in]; add may be NULL. KVB_OK, or KVB_ENOMEM (its scratch). */
int ref_linear(const kvb_bf16 *x, const kvb_bf16 *W, const kvb_bf16 *add, int rows, int in, int out, kvb_bf16 *y);
/* From qkv [B, (Hq + 2 Hkv) D]: q [B, Hq, D] and knew [B, Hkv, D] rotated (llama rotate-half with row pos[b]
 * of the bf16 table cos_sin [max_pos, D]: cos in [0, D/2), sin in [D/2, D)), vnew [B, Hkv, D] copied. */
void ref_rope_split(const kvb_bf16 *qkv, const kvb_bf16 *cos_sin, const int32_t *pos, int B, int Hq, int Hkv, int D,
                    kvb_bf16 *q, kvb_bf16 *knew, kvb_bf16 *vnew);
/* y[r][i] = bf16(silu(g) * u), g = gate_up[r][i], u = gate_up[r][ffn + i], silu(g) = g / (1 + exp(-g)). */
void ref_silu_mul(const kvb_bf16 *gate_up, int rows, int ffn, kvb_bf16 *y);

/* Shape checks shared with the CUDA API: the preset's heads as decode_attn accepts them (decode_layout_check
 * with L), B in [1, 1024], hidden and ffn multiples of 8 in [8, 65536], each pos[b] in [0, L) and below
 * max_pos (pos may be NULL: shapes only). Messages name the parameter, its value and the range. */
int block_check(const block_preset *m, int B, int64_t L, int max_pos, const int32_t *pos, const char *who);

/* The block's halves around the attention path, shared by every method:
 *   pre:  z = rmsnorm(x) * norm1, qkv = W_qkv z, q, knew, vnew = ref_rope_split(qkv) at pos (every sequence:
 *         each sequence's new k and v go to its cache)
 *   post: h = x + W_o att, y = h + W_down (silu(W_gate z2) * W_up z2), z2 = rmsnorm(h) * norm2, for the
 *         sequences of `seqs` (NULL: all; else one byte per sequence, 1 = compute its y)
 * q, att [B, Hq, D]; knew, vnew [B, Hkv, D]. */
int ref_block_pre(const kvb_bf16 *x, const block_weights *w, const block_preset *m, int B, const int32_t *pos,
                  const kvb_bf16 *cos_sin, int max_pos, kvb_bf16 *q, kvb_bf16 *knew, kvb_bf16 *vnew);
int ref_block_post(const kvb_bf16 *x, const block_weights *w, const block_preset *m, int B, const kvb_bf16 *att,
                   const uint8_t *seqs, kvb_bf16 *y);

/* The dense block for B sequences at positions pos[b] (the cache holds tokens [0, pos[b]) and the step
 * writes row pos[b]; attention over pos[b] + 1 tokens): x [B, hidden] -> y [B, hidden]; K, V [B, Hkv, L, D]
 * updated in place. `seqs` as in ref_block_post (K, V rows are written for every sequence). */
int ref_decode_block_dense(const kvb_bf16 *x, const block_weights *w, const block_preset *m, int B, const int32_t *pos,
                           kvb_bf16 *K, kvb_bf16 *V, int64_t L, const kvb_bf16 *cos_sin, int max_pos,
                           const uint8_t *seqs, kvb_bf16 *y);

#ifdef __cplusplus
}
#endif
#endif
