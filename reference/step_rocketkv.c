/* step_rocketkv.c: the reference of RocketKV's decode-time path, its stages' references in order. */
#include "step_rocketkv.h"

#include <stdlib.h>

static const char *WHO = "rocketkv_step";

void rocketkv_layouts(const rocketkv_shape *sh, page_layout *meta, page_layout *score, sparse_layout *att,
                      decode_layout *cache)
{
    *cache = (decode_layout){sh->B, sh->Hq, sh->Hkv, sh->D, sh->cap_tokens};
    *meta = (page_layout){sh->B, sh->Hq, sh->Hkv, sh->D, sh->cap_tokens, sh->P, sh->cap_pages};
    *score = *meta;
    score->L = sh->t + 1;
    *att = (sparse_layout){*cache, hybrid_selected_pages(sh->k, sh->P), sh->P};
}

int rocketkv_shape_check(const rocketkv_shape *sh)
{
    KVB_CHECK_RANGE(WHO, "C", sh->cap_tokens, 1, DECODE_MAX_L);
    KVB_CHECK_RANGE(WHO, "t", sh->t, 0, (int64_t)sh->cap_tokens - 1);
    KVB_CHECK_RANGE(WHO, "P", sh->P, 1, SPARSE_MAX_P);
    page_layout meta, score;
    sparse_layout att;
    decode_layout cache;
    rocketkv_layouts(sh, &meta, &score, &att, &cache);
    int rc = decode_layout_check(&cache, WHO);
    if (rc || (rc = page_layout_check(&meta, WHO)) || (rc = hybrid_params_check(&score, sh->r, sh->k, WHO))) return rc;
    return sparse_layout_check(&att, WHO);
}

int ref_rocketkv_step(const kvb_bf16 *q, const kvb_bf16 *knew, const kvb_bf16 *vnew, kvb_bf16 *K, kvb_bf16 *V,
                      kvb_bf16 *kmin, kvb_bf16 *kmax, const rocketkv_shape *sh, float *u, int32_t *pages, kvb_bf16 *o,
                      const uint8_t *slices)
{
    int rc = rocketkv_shape_check(sh);
    if (rc) return rc;
    page_layout meta, score;
    sparse_layout att;
    decode_layout cache;
    rocketkv_layouts(sh, &meta, &score, &att, &cache);
    int32_t *t = malloc(sizeof(int32_t) * (size_t)sh->B * 3), *len = t + sh->B, *cnt = len + sh->B;
    if (!t) return kvb_fail(KVB_EINVAL, "%s: out of host memory", WHO);
    for (int b = 0; b < sh->B; b++) t[b] = sh->t, len[b] = sh->t + 1, cnt[b] = att.n;
    if (!(rc = ref_kv_append(knew, vnew, t, K, V, &cache)) && !(rc = ref_page_meta_append(knew, t, &meta, kmin, kmax)) &&
        !(rc = ref_hybrid_score(q, kmin, kmax, &score, sh->r, sh->k, u, pages, NULL)))
        rc = ref_sparse_attn_pages(q, K, V, len, pages, cnt, o, &att, slices);
    free(t);
    return rc;
}
