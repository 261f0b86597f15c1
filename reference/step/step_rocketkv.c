/* step_rocketkv.c: the reference of RocketKV's decode-time path, its stages' references in order. */
#include "reference/step/step_rocketkv.h"

#include <stdlib.h>
#include <string.h>

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
    int32_t *t = kvb_xalloc((size_t)sh->B * 3, sizeof(int32_t), "ref_rocketkv_step positions");
    if (!t) return KVB_ENOMEM;
    int32_t *len = t + sh->B, *cnt = len + sh->B;
    for (int b = 0; b < sh->B; b++) t[b] = sh->t, len[b] = sh->t + 1, cnt[b] = att.n;
    if (!(rc = ref_kv_append(knew, vnew, t, K, V, &cache)) && !(rc = ref_page_meta_append(knew, t, &meta, kmin, kmax)) &&
        !(rc = ref_hybrid_score(q, kmin, kmax, &score, sh->r, sh->k, u, pages, NULL)))
        rc = ref_sparse_attn_pages(q, K, V, len, pages, cnt, o, &att, slices);
    kvb_xfree(t);
    return rc;
}

void rocketkv_step_bytes(const rocketkv_shape *sh, const int32_t *pages, double *bytes, double *flops)
{
    const double heads = (double)sh->B * sh->Hkv, G = sh->Hq / sh->Hkv, D = sh->D;
    const double qo = 2.0 * sh->B * sh->Hq * D * 2, append = heads * D * 2 * 4;
    const double npg = page_count(sh->t + 1, sh->P), n_sel = hybrid_selected_pages(sh->k, sh->P);
    double rows = 0; /* tokens of the chosen pages: the last page may be partial, and chosen */
    for (int64_t i = 0; i < (int64_t)heads * (int64_t)n_sel; i++) {
        const double left = (double)sh->t + 1 - (double)pages[i] * sh->P;
        rows += left < sh->P ? left : sh->P;
    }
    const double meta = heads * (D * 2 * 2 * 2), score = heads * (sh->r * npg * 2 + npg * 4 + sh->r * 4),
                 topk = heads * (npg * 4 + n_sel * 4), attend = rows * D * 2 * 2 + heads * n_sel * 4;
    *bytes = append + meta + score + topk + attend + qo;
    *flops = heads * G * sh->r * npg * 2 + 4.0 * rows * G * D;
}

int ref_rocketkv_meta_prefix(const rocketkv_shape *sh, const kvb_bf16 *K, kvb_bf16 *kmin, kvb_bf16 *kmax)
{
    const int64_t heads = (int64_t)sh->B * sh->Hkv, cells = heads * sh->D * sh->cap_pages;
    if (sh->t == 0) { /* nothing cached yet: every entry empty */
        for (int64_t i = 0; i < cells; i++) kmin[i] = BF16_POS_INF, kmax[i] = BF16_NEG_INF;
        return KVB_OK;
    }
    kvb_bf16 *prefix = kvb_xalloc((size_t)(heads * sh->t * sh->D), sizeof(kvb_bf16), "ref_rocketkv_meta_prefix rows");
    if (!prefix) return KVB_ENOMEM;
    for (int64_t bh = 0; bh < heads; bh++)
        memcpy(prefix + bh * sh->t * sh->D, K + bh * sh->cap_tokens * sh->D, sizeof(kvb_bf16) * (size_t)sh->t * sh->D);
    page_layout built = {sh->B, sh->Hq, sh->Hkv, sh->D, sh->t, sh->P, sh->cap_pages};
    int rc = ref_page_meta_build(prefix, &built, kmin, kmax);
    kvb_xfree(prefix);
    return rc;
}
