/* batch_gemm_rotary.c: see batch_gemm_rotary.h. */
#include "reference/batch_gemm_rotary.h"

#include <math.h>
#include <stdlib.h>

int rope_table(kvb_bf16 *cos_sin, int max_pos, int D, double theta, rope_kind rope)
{
    if (max_pos < 1) return kvb_fail(KVB_EINVAL, "rope_table: max_pos=%d out of range [1, 2^31)", max_pos);
    if (D < 4 || D % 4) return kvb_fail(KVB_EINVAL, "rope_table: D=%d is not a positive multiple of 4", D);
    const int half = rope == ROPE_GLM ? D / 4 : D / 2, rot = rope == ROPE_GLM ? D / 2 : D;
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < max_pos; p++) {
        kvb_bf16 *row = cos_sin + p * D;
        for (int i = 0; i < D; i++) row[i] = 0;
        for (int i = 0; i < half; i++) {
            const double f = pow(theta, -2.0 * i / rot);
            row[i] = kvb_double_to_bf16(cos((double)p * f));
            row[half + i] = kvb_double_to_bf16(sin((double)p * f));
        }
    }
    return KVB_OK;
}

/* the shape, and the slot lists of the (b, h) rows in mask (every row without one) */
static int check_rows(const int32_t *ids, const int32_t *cnts, const gather_layout *g, int S, int r, int max_pos,
                      rope_kind rope, const uint8_t *mask, const char *who)
{
    int rc = gather_layout_check(g, who);
    if (rc) return rc;
    if (r < 1 || r > BGR_MAX_RANK) return kvb_fail(KVB_EINVAL, "%s: r=%d out of range [1, %d]", who, r, BGR_MAX_RANK);
    if (rope != ROPE_LLAMA && rope != ROPE_GLM)
        return kvb_fail(KVB_EINVAL, "%s: rope=%d out of range [0 (llama), 1 (glm)]", who, (int)rope);
    if (rope == ROPE_LLAMA && g->D % 2)
        return kvb_fail(KVB_EINVAL, "%s: D=%d is odd (rotate-half pairs i with i + D/2)", who, g->D);
    if (rope == ROPE_GLM && g->D % 4)
        return kvb_fail(KVB_EINVAL, "%s: D=%d is not a multiple of 4 (glm rotates D/2 dims in pairs)", who, g->D);
    if (S < g->c) return kvb_fail(KVB_EINVAL, "%s: S=%d out of range [c = %d, 2^31)", who, S, g->c);
    if (!ids || !cnts) return KVB_OK;
    const int n_chunks = S / g->c;
    for (int64_t bh = 0; bh < (int64_t)g->B * g->Hkv; bh++) {
        if (mask && !mask[bh]) continue;
        if (cnts[bh] < 0 || cnts[bh] > g->M)
            return kvb_fail(KVB_EINVAL, "%s: cnts[%lld]=%d out of range [0, M = %d]", who, (long long)bh, cnts[bh], g->M);
        for (int j = cnts[bh]; j < g->M; j++) {
            const int32_t id = ids[bh * g->M + j];
            if (id < 0 || id >= n_chunks)
                return kvb_fail(KVB_EINVAL, "%s: ids[%lld, %d]=%d out of range [0, S/c = %d): a chunk outside the context",
                                who, (long long)bh, j, id, n_chunks);
            if ((int64_t)id * g->c + g->c > max_pos)
                return kvb_fail(KVB_EINVAL,
                                "%s: position %lld of chunk ids[%lld, %d]=%d out of range [0, max_pos = %d): "
                                "the RoPE table is shorter than the largest position",
                                who, (long long)id * g->c + g->c - 1, (long long)bh, j, id, max_pos);
        }
    }
    return KVB_OK;
}

int batch_gemm_rotary_check(const int32_t *ids, const int32_t *cnts, const gather_layout *g, int S, int r, int max_pos,
                            rope_kind rope, const char *who)
{
    return check_rows(ids, cnts, g, S, r, max_pos, rope, NULL, who);
}

int ref_batch_gemm_rotary(const kvb_bf16 *U, const kvb_bf16 *SV, const int32_t *ids, const int32_t *cnts,
                          const kvb_bf16 *cos_sin, const gather_layout *g, int S, int r, int max_pos, rope_kind rope,
                          kvb_bf16 *Kbuf)
{
    return ref_batch_gemm_rotary_sampled(U, SV, ids, cnts, cos_sin, g, S, r, max_pos, rope, NULL, Kbuf);
}

int ref_batch_gemm_rotary_sampled(const kvb_bf16 *U, const kvb_bf16 *SV, const int32_t *ids, const int32_t *cnts,
                                  const kvb_bf16 *cos_sin, const gather_layout *g, int S, int r, int max_pos,
                                  rope_kind rope, const uint8_t *mask, kvb_bf16 *Kbuf)
{
    /* rows outside the mask are neither computed nor read (a step's reference leaves their cnts unset) */
    int rc = check_rows(ids, cnts, g, S, r, max_pos, rope, mask, "batch_gemm_rotary");
    if (rc) return rc;
    const int D = g->D, c = g->c;
    const int64_t n_bh = (int64_t)g->B * g->Hkv;
    int failed = 0;
    /* (b, h) slices are independent: one per thread */
#pragma omp parallel for schedule(dynamic, 1) reduction(| : failed)
    for (int64_t bh = 0; bh < n_bh; bh++) {
        if (mask && !mask[bh]) continue;
        double *x = kvb_xalloc((size_t)D, sizeof(double), "batch_gemm_rotary row scratch");
        if (!x) {
            failed = 1;
            continue;
        }
        const int64_t b = bh / g->Hkv;
        const kvb_bf16 *sv = SV + bh * r * D;
        for (int64_t s = (int64_t)cnts[bh] * c; s < (int64_t)g->M * c; s++) {
            const int64_t p = (int64_t)ids[bh * g->M + s / c] * c + s % c;
            const kvb_bf16 *u = U + (b * S + p) * r;
            /* x[d] = sum over k = 0, 1, ..., r-1 of u[k] * sv[k, d] (the same order for every d) */
            for (int d = 0; d < D; d++) x[d] = 0;
            for (int k = 0; k < r; k++) {
                const double uk = kvb_bf16_to_double(u[k]);
                for (int d = 0; d < D; d++) x[d] += uk * kvb_bf16_to_double(sv[(int64_t)k * D + d]);
            }
            const kvb_bf16 *cs = cos_sin + p * D;
            kvb_bf16 *out = Kbuf + (bh * g->NB + g->sparse_start + s) * D;
            if (rope == ROPE_LLAMA) {
                for (int i = 0; i < D / 2; i++) {
                    const double co = kvb_bf16_to_double(cs[i]), si = kvb_bf16_to_double(cs[D / 2 + i]);
                    out[i] = kvb_double_to_bf16(x[i] * co - x[i + D / 2] * si);
                    out[i + D / 2] = kvb_double_to_bf16(x[i + D / 2] * co + x[i] * si);
                }
            } else {
                for (int i = 0; i < D / 4; i++) {
                    const double co = kvb_bf16_to_double(cs[i]), si = kvb_bf16_to_double(cs[D / 4 + i]);
                    out[2 * i] = kvb_double_to_bf16(x[2 * i] * co - x[2 * i + 1] * si);
                    out[2 * i + 1] = kvb_double_to_bf16(x[2 * i + 1] * co + x[2 * i] * si);
                }
                for (int d = D / 2; d < D; d++) out[d] = kvb_double_to_bf16(x[d]);
            }
        }
        kvb_xfree(x);
    }
    if (failed)
        return kvb_fail(KVB_ENOMEM, "batch_gemm_rotary: out of host memory: %zu bytes of row scratch", sizeof(double) * (size_t)D);
    return KVB_OK;
}
