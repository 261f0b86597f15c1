/* page_scoring.h: CUDA API of the page-scoring family (contract: kernels/page_scoring/NOTES.md;
 * reference and layout: reference/page_scoring.h): page min/max metadata (build, append), RocketKV
 * hybrid scoring, Quest scoring. The page selections go through the suite's one top-k
 * (kernels/select/select.h topk_rows).
 *
 * Every function validates its parameters before launching anything and returns KVB_OK, or KVB_EINVAL
 * with kvb_last_error() naming the parameter, its value and the allowed range. Metadata (and K) must be
 * 16-byte aligned (cudaMalloc'd buffers are). Launches are
 * asynchronous on `stream`; pointers are device pointers unless named *_host.
 */
#ifndef KVB_KERNELS_PAGE_SCORING_H
#define KVB_KERNELS_PAGE_SCORING_H

#include <cuda_runtime_api.h>
#include <stddef.h>

#include "reference/page_scoring.h"

#ifdef __cplusplus
extern "C" {
#endif

/* kmin, kmax [B, Hkv, D, cap] from K [B, Hkv, L, D]: every entry of the cap columns is written (pages
 * past ceil(L/P): +inf / -inf). Bit-exact with ref_page_meta_build. */
int page_meta_build(const kvb_bf16 *K, const page_layout *s, kvb_bf16 *kmin, kvb_bf16 *kmax, cudaStream_t stream);

/* k [B, Hkv, D] appended at t[b] (device copy) into kmin, kmax (in place); t_host holds the same values
 * and is checked (t[b] in [0, L), page below cap) before the launch. Bit-exact with ref_page_meta_append. */
int page_meta_append(const kvb_bf16 *k, const int32_t *t, const int32_t *t_host, const page_layout *s, kvb_bf16 *kmin,
                     kvb_bf16 *kmax, cudaStream_t stream);

/* Device workspace of hybrid_score for this layout: the scaled scores z [B*Hkv, G, cap] fp32, the
 * per-block softmax partials, and topk_rows' workspace for the page selection. */
size_t hybrid_score_workspace_bytes(const page_layout *s);

/* RocketKV hybrid scoring (reference/page_scoring.h ref_hybrid_score): u [B, Hkv, ceil(L/P)] fp32 and,
 * unless pages is NULL (scoring alone), pages [B, Hkv, ceil(k/P)] int32 ascending through topk_rows.
 * channels [B, Hkv, r] int32 (or NULL): the chosen channels, ascending, equal to the reference's. */
int hybrid_score(const kvb_bf16 *q, const kvb_bf16 *kmin, const kvb_bf16 *kmax, const page_layout *s, int r, int k,
                 float *u, int32_t *pages, int32_t *channels, void *workspace, size_t workspace_bytes,
                 cudaStream_t stream);

/* What hybrid_score_append writes before it scores: the new key into the bounds of its page and, when K
 * is given, the new key and value into row t[b] of the cache (as kv_append). */
typedef struct hybrid_append {
    const kvb_bf16 *knew, *vnew; /* [B, Hkv, D]; vnew only with K */
    const int32_t *t, *t_host;   /* [B]: the position, device copy and the same values on the host */
    kvb_bf16 *kmin, *kmax;       /* the bounds the scoring reads, updated in place */
    kvb_bf16 *K, *V;             /* [B, Hkv, cache_L, D], or NULL: no cache write */
    int cache_L;                 /* rows per (b, KV head) of K, V: at least the scored length L */
} hybrid_append;

/* hybrid_score after appending knew at t[b] into kmin, kmax in place (and, with K, knew and vnew into
 * the cache), as page_meta_append (and kv_append) then hybrid_score in their launches: the scoring
 * block whose pages include t[b]'s updates that page (every channel) and writes the cache rows before
 * it reads the page. t_host is checked in [0, L) before the launch. RocketKV's decode step: one or
 * two dependent launches less. */
int hybrid_score_append(const kvb_bf16 *q, const hybrid_append *app, const page_layout *s, int r, int k, float *u,
                        int32_t *pages, int32_t *channels, void *workspace, size_t workspace_bytes,
                        cudaStream_t stream);

/* Device workspace of quest_score (topk_rows' workspace for the page selection). */
size_t quest_score_workspace_bytes(const page_layout *s);

/* Quest scoring (ref_quest_score): scores [B, Hkv, ceil(L/P)] fp32 and, unless pages is NULL (scoring
 * alone), pages [B, Hkv, budget/P] int32: budget/P - 1 chosen through topk_rows, then the last page. */
int quest_score(const kvb_bf16 *q, const kvb_bf16 *kmin, const kvb_bf16 *kmax, const page_layout *s, int budget,
                float *scores, int32_t *pages, void *workspace, size_t workspace_bytes, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
