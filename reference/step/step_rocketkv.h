/* step_rocketkv.h: RocketKV's decode-time attention path, composed from the references of its stages
 * (kernels/step/NOTES.md, the rocketkv method; kernels/page_scoring/NOTES.md;
 * kernels/step/step_rocketkv.h runs the same path on the GPU):
 *
 *   K[b, h, t] = knew[b, h], V[b, h, t] = vnew[b, h]              ref_kv_append
 *   page t / P of kmin, kmax takes knew                           ref_page_meta_append
 *   u, pages = hybrid scoring of q over the t + 1 tokens           ref_hybrid_score (r channels, k tokens)
 *   o = attention of q over the tokens of the chosen pages         ref_sparse_attn_pages (len = t + 1)
 *
 * The kept cache holds C tokens (SnapKV++'s C of rocketkv_budget); every sequence decodes at t.
 */
#ifndef REF_STEP_ROCKETKV_H
#define REF_STEP_ROCKETKV_H

#include "reference/decode.h"
#include "reference/page_scoring.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rocketkv_shape {
    int B, Hq, Hkv, D;
    int cap_tokens; /* C: tokens the kept cache holds (K, V [B, Hkv, C, D]); t < C */
    int t;          /* position of the token being decoded (the same in every sequence) */
    int P, r, k;    /* page size, channels, tokens attended (rocketkv_budget) */
    int cap_pages;  /* metadata row stride: page_cap_default(C, P) or more, a multiple of 8 */
} rocketkv_shape;

/* The stages' layouts: the cache (L = C), the metadata append (L = C), the scoring (L = t + 1) and the
 * attention (n = ceil(k / P) pages of P tokens). */
void rocketkv_layouts(const rocketkv_shape *sh, page_layout *meta, page_layout *score, sparse_layout *att,
                      decode_layout *cache);

/* Every check of every stage: B, Hq, Hkv, D as decode_attn and hybrid_score accept them; C in [1, 2^20];
 * t in [0, C); P in [1, 4096]; r in [1, D]; k in [1, t + 1]; cap_pages >= ceil(C / P), a multiple of 8.
 * Messages name the parameter, its value and the range. */
int rocketkv_shape_check(const rocketkv_shape *sh);

/* The whole path, in place on K, V, kmin, kmax; u [B, Hkv, ceil((t+1)/P)] fp32, pages [B, Hkv, ceil(k/P)],
 * o [B, Hq, D]. `slices` as in ref_decode_attn, for the attention. */
int ref_rocketkv_step(const kvb_bf16 *q, const kvb_bf16 *knew, const kvb_bf16 *vnew, kvb_bf16 *K, kvb_bf16 *V,
                      kvb_bf16 *kmin, kvb_bf16 *kmax, const rocketkv_shape *sh, float *u, int32_t *pages, kvb_bf16 *o,
                      const uint8_t *slices);

/* The kept cache's metadata before the step: ref_page_meta_build over the first t rows of each head of
 * K [B, Hkv, C, D] (t = 0: every entry empty, +inf / -inf). */
int ref_rocketkv_meta_prefix(const rocketkv_shape *sh, const kvb_bf16 *K, kvb_bf16 *kmin, kvb_bf16 *kmax);

/* Bytes of one step, each read or written once: the append (knew, vnew read; the K, V rows and one
 * metadata entry per channel written, the entry read too), the scoring floor (r of D rows of one
 * extrema tensor per KV head, q, u written; the page top-k reads u and writes the pages), and the
 * attention (K, V rows of the chosen pages `pages` [B, Hkv, ceil(k/P)], q, o, the lists); flops of the
 * scoring and the attention. */
void rocketkv_step_bytes(const rocketkv_shape *sh, const int32_t *pages, double *bytes, double *flops);

#ifdef __cplusplus
}
#endif
#endif
