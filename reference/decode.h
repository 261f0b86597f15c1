/* decode.h: dense decode attention (spec: decode.md, "Dense decode attention").
 *
 *   q [B, Hq, D], K, V [B, Hkv, L, D] bf16, per-sequence lengths len [B] (1 <= len[b] <= L)
 *   -> o [B, Hq, D] bf16:  o[b,h] = softmax_t(q[b,h] . K[b,h/G,t] / sqrt(D)) . V[b,h/G,t],  t < len[b]
 *
 * G = Hq / Hkv query heads share one KV head (GQA). The layout and its checks live here, in the
 * reference, because they are the spec; the CUDA API in kernels/decode.h runs the same checks before
 * it launches anything.
 */
#ifndef REF_DECODE_H
#define REF_DECODE_H

#include "kvb.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DECODE_MAX_B 1024
#define DECODE_MAX_HKV 256
#define DECODE_MAX_G 8          /* the kernels serve up to 8 query heads per KV head (one MMA column each) */
#define DECODE_MAX_L (1 << 20)  /* tokens per sequence: any L from 1 to 1M */

typedef struct decode_layout {
    int B, Hq, Hkv, D;
    int64_t L; /* allocated tokens per sequence: K, V are [B, Hkv, L, D] */
} decode_layout;

/* Every field against its supported range: B in [1, 1024], Hkv in [1, 256], Hq a multiple of Hkv
 * with G = Hq/Hkv in [1, 8], D in {64, 128}, L in [1, 2^20]. The message names the field, its value
 * and the range (kvb_last_error()); `who` prefixes it. */
int decode_layout_check(const decode_layout *d, const char *who);

/* Each len[b] in [1, L]: a length beyond the allocated cache (or an empty sequence) is rejected. */
int decode_lengths_check(const decode_layout *d, const int32_t *len, const char *who);

/* The reference, in double from the bf16 inputs, rounded once to bf16. `slices` is NULL (every
 * (b, kv head) slice) or one byte per (b, kvh) slice, b-major: 1 = compute the G output rows of that
 * KV head, 0 = leave them untouched (sampled references of large cases). */
int ref_decode_attn(const kvb_bf16 *q, const kvb_bf16 *K, const kvb_bf16 *V, const int32_t *len, kvb_bf16 *o,
                    const decode_layout *d, const uint8_t *slices);

#ifdef __cplusplus
}
#endif
#endif
