/* selective_attn.h: prefill attention that also returns column sums (kernels/selective_attn/NOTES.md).
 *
 *   s[i,j]    = q_i . k_j / sqrt(D)                  j <= i when causal
 *   LSE[i]    = log sum_j exp(s[i,j])                fp32
 *   P[i,j]    = exp(s[i,j] - LSE[i])                 the normalized probability
 *   O[i]      = sum_j P[i,j] v_j                     bf16 (need_out=1)
 *   colsum[j] = sum over rows i >= w0 (and i >= j when causal) of P[i,j]      fp32
 *   colsum_kv = the sum of colsum over the G = Hq/Hkv query heads of each KV head (group_sum=1)
 *
 * Layouts (row-major): Q [B, Hq, L, D]; K, V [B, Hkv, L, D]; O [B, Hq, L, D]; colsum [B, Hq, L];
 * colsum_kv [B, Hkv, L]. LSE is [B, Hq, L] with need_out=1; with need_out=0 only the rows that
 * contribute to the column sums are computed, and LSE is [B, Hq, L - w0] (row w0 + r at r).
 * Query head h reads KV head h / G.
 *
 * The parameter checks live here, in the C reference, because they define the op; the CUDA API in
 * kernels/selective_attn/selective_attn.h runs the same checks before it launches anything.
 */
#ifndef REF_SELECTIVE_ATTN_H
#define REF_SELECTIVE_ATTN_H

#include "reference/kvb.h"

#ifdef __cplusplus
extern "C" {
#endif

#define SATTN_MAX_L (1 << 20)

typedef struct sattn_params {
    int B, Hq, Hkv; /* batch, query heads, KV heads (Hq a multiple of Hkv) */
    int L;          /* tokens (queries = keys), 1..SATTN_MAX_L */
    int D;          /* head dimension: 64 or 128 */
    int causal;     /* 1: key j is visible to query i only when j <= i */
    int w0;         /* first query row that contributes to the column sums, 0..L-1 */
    int need_out;   /* 1: O and LSE of every row; 0: only LSE of rows w0..L-1, no O */
    int group_sum;  /* 1: also colsum_kv */
} sattn_params;

/* Check every field; on failure kvb_last_error() names the field, its value and the allowed range,
 * prefixed by `who`. */
int sattn_check(const sattn_params *p, const char *who);

static inline int sattn_groups(const sattn_params *p) { return p->Hq / p->Hkv; }
/* LSE rows per (b, h) and the first of them */
static inline int sattn_lse_len(const sattn_params *p) { return p->need_out ? p->L : p->L - p->w0; }
static inline int sattn_lse_row0(const sattn_params *p) { return p->need_out ? 0 : p->w0; }
/* (query, key) pairs per query head: all of them for O and LSE, and those of rows >= w0 for the
 * column sums (used for FLOP counts and the row-sum invariant) */
double sattn_pairs(const sattn_params *p, int first_row);

/* The reference, in double, rounding once to the output type. kv_mask: NULL (every head), or one
 * byte per (b, KV head), 1 = compute that KV head's G query heads (a sampled reference); outputs of
 * the other heads are left untouched. O may be NULL when need_out=0; colsum_kv may be NULL when
 * group_sum=0. Parallel over rows with OpenMP; the result does not depend on the thread count. */
int ref_selective_attn(const kvb_bf16 *Q, const kvb_bf16 *K, const kvb_bf16 *V, const sattn_params *p,
                       const uint8_t *kv_mask, kvb_bf16 *O, float *LSE, float *colsum, float *colsum_kv);

#ifdef __cplusplus
}
#endif
#endif
