/* decode.h: dense decode attention (contract: kernels/decode/NOTES.md, "What it computes").
 *
 *   q [B, Hq, D], K, V [B, Hkv, L, D] bf16, per-sequence lengths len [B] (1 <= len[b] <= L)
 *   -> o [B, Hq, D] bf16:  o[b,h] = softmax_t(q[b,h] . K[b,h/G,t] / sqrt(D)) . V[b,h/G,t],  t < len[b]
 *
 * G = Hq / Hkv query heads share one KV head (GQA). The layout and its checks live here, in the
 * reference, because they are the contract; the CUDA API in kernels/decode/decode.h runs the same
 * checks before it launches anything.
 */
#ifndef REF_DECODE_H
#define REF_DECODE_H

#include "reference/kvb.h"

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

/* One decode step's cache write: knew, vnew [B, Hkv, D] become row t[b] of K, V [B, Hkv, L, D] for
 * every KV head of sequence b (t[b] in [0, L): the position of the token being decoded; the caller
 * attends over len[b] = t[b] + 1 tokens afterwards). Rewriting the same row with the same values
 * leaves the cache unchanged. */
int decode_positions_check(const decode_layout *d, const int32_t *t, const char *who);
int ref_kv_append(const kvb_bf16 *knew, const kvb_bf16 *vnew, const int32_t *t, kvb_bf16 *K, kvb_bf16 *V,
                  const decode_layout *d);

/* ---- sparse decode attention (kernels/decode/NOTES.md, "sparse_attn_idx, sparse_attn_pages") ----
 *
 * The same attention over a subset of each KV head's tokens, one list per (b, kv head):
 *   sparse_attn_idx:   idx [B, Hkv, n] token indices into K, V [B, Hkv, L, D]; the first cnt[b] entries
 *                      of sequence b's lists are used; each in [0, len[b]).
 *   sparse_attn_pages: pages [B, Hkv, n] page ids (page j = tokens [jP, jP + P)); the first cnt[b]
 *                      entries are used; each in [0, ceil(len[b] / P)); tokens of the last page at or
 *                      past len[b] are not part of it.
 * o[b, h] = softmax over the listed tokens t of (q[b,h] . K[b,h/G,t] / sqrt(D)) . V[b,h/G,t]. A list is
 * a multiset (a repeated entry counts twice); the suite's producers (topk_rows, hybrid_score,
 * quest_score) give ascending lists without repeats. Lists covering every token give decode_attn. */
#define SPARSE_MAX_P 4096 /* tokens per page */

typedef struct sparse_layout {
    decode_layout kv; /* q, K, V and len as in dense decode */
    int n;            /* entries per list: idx or pages [B, Hkv, n] */
    int P;            /* tokens per page (sparse_attn_pages); 1 for token lists */
} sparse_layout;

/* decode_layout_check; P in [1, 4096]; n in [1, ceil(L / P)] (a list without repeats holds at most
 * every token, or every page, of the cache). */
int sparse_layout_check(const sparse_layout *s, const char *who);

/* len[b] in [1, L]; cnt[b] in [1, n]; every used entry of every list inside sequence b's cache: token
 * lists (P = 0 here: `pages` = 0) in [0, len[b]), page lists in [0, ceil(len[b] / P)). The message names
 * the list entry (b, kv head, position), its value and the range. */
int sparse_lists_check(const sparse_layout *s, const int32_t *len, const int32_t *list, const int32_t *cnt, int pages,
                       const char *who);

/* References in double from the bf16 inputs, rounded once to bf16; `slices` as in ref_decode_attn. */
int ref_sparse_attn_idx(const kvb_bf16 *q, const kvb_bf16 *K, const kvb_bf16 *V, const int32_t *len, const int32_t *idx,
                        const int32_t *cnt, kvb_bf16 *o, const sparse_layout *s, const uint8_t *slices);
int ref_sparse_attn_pages(const kvb_bf16 *q, const kvb_bf16 *K, const kvb_bf16 *V, const int32_t *len,
                          const int32_t *pages, const int32_t *cnt, kvb_bf16 *o, const sparse_layout *s,
                          const uint8_t *slices);

#ifdef __cplusplus
}
#endif
#endif
