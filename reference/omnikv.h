/* omnikv.h: OmniKV's filter-layer token selector (contract: kernels/omnikv/NOTES.md): the max over
 * the query heads of q.k/sqrt(D) for each prompt token, then a top-k.
 *
 *   q [B, Hq, D] bf16, K [B, Hkv, L, D] bf16 (token-major rows of D per KV head, the layout of
 *   decode_attn), prompt lengths len [B] int32 (1 <= len[b] <= L), G = Hq / Hkv in [1, 8],
 *   D in {64, 128}:
 *
 *   score[b, t] = max over all Hq query heads h of (q[b, h] . K[b, h/G, t]) / sqrt(D)   (t < len[b])
 *   score[b, t] = -inf                                                                 (t >= len[b])
 *   idx[b, 0:k] = the k largest score[b, 0:len[b]], ties to the lower index, ascending (the suite's
 *                 one top-k: ref_topk here, topk_rows in the kernel), one set shared by all heads.
 *
 *   k in [1, min over b of len[b]]: every sequence has k prompt tokens to choose from.
 *
 * The layout and its checks live here, in the reference, because they are the contract; the CUDA API
 * (kernels/omnikv/omnikv.h) runs the same checks before it launches anything.
 */
#ifndef REF_OMNIKV_H
#define REF_OMNIKV_H

#include <stdint.h>

#include "reference/kvb.h"

#ifdef __cplusplus
extern "C" {
#endif

#define OMNIKV_MAX_B 1024
#define OMNIKV_MAX_HKV 256
#define OMNIKV_MAX_G 8 /* query heads per KV head: the kernel's MMA has 8 query-head columns */
#define OMNIKV_MAX_L 2097152 /* 2M tokens: the longest row the suite's top-k takes */

typedef struct omnikv_layout {
    int B, Hq, Hkv, D;
    int L; /* allocated tokens per sequence: K is [B, Hkv, L, D], the scores [B, L] */
} omnikv_layout;

/* Every field against its range: B in [1, 1024]; Hkv in [1, 256]; Hq a multiple of Hkv with
 * G = Hq/Hkv in [1, 8]; D in {64, 128}; L in [1, 2^21]. Messages name the field, its value and
 * the range, prefixed with `who`. */
int omnikv_layout_check(const omnikv_layout *s, const char *who);

/* Each len[b] in [1, L], and k in [1, min over b of len[b]]. */
int omnikv_select_check(const omnikv_layout *s, const int32_t *len, int k, const char *who);

/* The reference: each dot product accumulated in double over the bf16 values, divided by sqrt(D),
 * the max over the Hq heads rounded once to float -> scores [B, L] (-inf past len[b]); then
 * idx [B, k] through ref_topk over the L scores of the row.
 * mag [B, L] (or NULL): max over the heads of sum_c |q[c] K[t, c]| / sqrt(D) (0 past len[b]), the
 * magnitude a float comparison of the scores scales its tolerance with.
 * rows: NULL (every sequence) or one byte per sequence: 1 = compute its scores, mag and indices,
 * 0 = leave them untouched (sampled references of large cases). */
int ref_omnikv_select(const kvb_bf16 *q, const kvb_bf16 *K, const int32_t *len, const omnikv_layout *s, int k,
                      float *scores, int32_t *idx, double *mag, const uint8_t *rows);

/* OmniKV's layer roles (kernels/omnikv/NOTES.md: for 32 layers, filters {2, 8, 18}; layers 0-1 and
 * the layer after each filter dense; the rest sparse). A filter layer attends densely and selects the
 * prompt tokens the sparse layers after it attend (with the decoded tokens); a dense layer attends
 * densely and selects nothing. The roles are defined for 32 layers only. */
enum { OMNIKV_ROLE_DENSE = 0, OMNIKV_ROLE_FILTER = 1, OMNIKV_ROLE_SPARSE = 2 };
#define OMNIKV_LAYERS 32

/* The role of layer `layer` of a model of `layers` layers; -1 (kvb_last_error() says why) for layers
 * other than 32 or a layer outside [0, layers). */
int omnikv_layer_role(int layer, int layers);

/* How many layers take each role (32 layers: 5 dense, 3 filter, 24 sparse); KVB_EINVAL for layers
 * other than 32. */
int omnikv_role_counts(int layers, int *dense, int *filter, int *sparse);

#ifdef __cplusplus
}
#endif
#endif
