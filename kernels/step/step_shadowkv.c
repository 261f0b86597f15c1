/* step_shadowkv.c: see step_shadowkv.h. */
#include "kernels/step/step_shadowkv.h"

#include <string.h>

#include "kernels/batch_gemm_rotary/batch_gemm_rotary.h"
#include "kernels/decode/decode.h"
#include "kernels/gather_copy/gather_copy.h"
#include "kernels/landmark_score/landmark_score.h"

static const char *WHO = "shadowkv_step";

static lms_shape score_shape(const shadowkv_step_shape *sh)
{
    return (lms_shape){sh->B, sh->Hq, sh->Hkv, sh->D, sh->L.Lm, sh->L.g.M};
}

int shadowkv_workspace_bytes(const shadowkv_step_shape *sh, size_t *score_bytes, size_t *gather_bytes,
                             size_t *attn_bytes)
{
    const lms_shape ls = score_shape(sh);
    const decode_layout d = {sh->B, sh->Hq, sh->Hkv, sh->D, sh->L.g.NB};
    *gather_bytes = gather_copy_workspace_bytes(&sh->L.g);
    *attn_bytes = decode_attn_workspace_bytes(&d);
    return landmark_score_workspace_bytes(&ls, score_bytes);
}

int shadowkv_path_prepare(shadowkv_path *p, const shadowkv_step_shape *sh, const shadowkv_buffers *b)
{
    memset(p, 0, sizeof *p);
    const lms_shape ls = score_shape(sh);
    int rc = landmark_score_check(&ls, WHO);
    if (rc || (rc = gather_layout_check(&sh->L.g, WHO))) return rc;
    p->buf = (decode_layout){sh->B, sh->Hq, sh->Hkv, sh->D, sh->L.g.NB};
    if ((rc = decode_layout_check(&p->buf, WHO))) return rc;
    if (sh->r > BGR_KERNEL_MAX_RANK)
        return kvb_fail(KVB_EINVAL, "%s: rank=%d out of range [1, %d]: batch_gemm_rotary's limit", WHO, sh->r,
                        BGR_KERNEL_MAX_RANK);
    if (!b->slot_host || !b->len_host)
        return kvb_fail(KVB_EINVAL, "%s: a host copy is NULL (slot_host=%p len_host=%p)", WHO,
                        (const void *)b->slot_host, (const void *)b->len_host);
    const int slot = sh->L.decode_start + sh->gen;
    for (int i = 0; i < sh->B; i++)
        if (b->slot_host[i] != slot || b->len_host[i] != slot + 1)
            return kvb_fail(KVB_EINVAL, "%s: slot[%d]=%d, len[%d]=%d out of range [%d, %d]: every sequence appends at "
                            "decode_start + gen and attends over one more row", WHO, i, b->slot_host[i], i,
                            b->len_host[i], slot, slot + 1);
    if ((rc = decode_positions_check(&p->buf, b->slot_host, WHO)) || (rc = decode_lengths_check(&p->buf, b->len_host, WHO)))
        return rc;
    if ((rc = landmark_score_workspace_bytes(&ls, &p->ws_score_bytes))) return rc;
    p->sh = *sh;
    p->b = *b;
    return KVB_OK;
}

static int stage_score(void *ctx, cudaStream_t s)
{
    shadowkv_path *p = ctx;
    const lms_shape ls = score_shape(&p->sh);
    const lms_args a = {p->q, p->b.landmarks, p->b.landmark_idx, p->b.chunks, p->b.m, p->b.ws_score, p->ws_score_bytes};
    return landmark_score(&ls, &a, s);
}

static int stage_index_scan(void *ctx, cudaStream_t s)
{
    shadowkv_path *p = ctx;
    const gather_layout *g = &p->sh.L.g;
    return index_scan(p->b.cached_ids, p->b.chunks, p->b.offsets, p->b.cnts, g->B, g->Hkv, g->M, s);
}

static int stage_values(void *ctx, cudaStream_t s)
{
    shadowkv_path *p = ctx;
    return gather_copy(p->b.Vh, p->b.Vbuf, p->b.offsets, p->b.cnts, &p->sh.L.g, p->b.ws_v, s);
}

static int stage_keys_moved(void *ctx, cudaStream_t s)
{
    shadowkv_path *p = ctx;
    return gather_copy_d2d(p->b.Kbuf, p->b.offsets, p->b.cnts, &p->sh.L.g, p->b.ws_k, s);
}

static int stage_keys_rebuilt(void *ctx, cudaStream_t s)
{
    shadowkv_path *p = ctx;
    /* the slot tags after index_scan are the chunk ids in slot order; bad collects this step's flags */
    if (cudaMemsetAsync(p->b.bad, 0, sizeof *p->b.bad, s) != cudaSuccess)
        return kvb_fail(KVB_EDEVICE, "shadowkv step: zeroing the bad-id flag: %s", cudaGetErrorString(cudaGetLastError()));
    return batch_gemm_rotary(p->b.U, p->b.SV, p->b.cached_ids, p->b.cnts, p->b.cos_sin, &p->sh.L.g, p->sh.S, p->sh.r,
                             p->sh.max_pos, ROPE_LLAMA, p->b.Kbuf, p->b.bad, s);
}

static int stage_append(void *ctx, cudaStream_t s)
{
    shadowkv_path *p = ctx;
    return kv_append(p->knew, p->vnew, p->b.slot, p->b.slot_host, p->b.Kbuf, p->b.Vbuf, &p->buf, s);
}

static int stage_attend(void *ctx, cudaStream_t s)
{
    shadowkv_path *p = ctx;
    return decode_attn(p->q, p->b.Kbuf, p->b.Vbuf, p->b.len, p->b.len_host, p->o, &p->buf, p->b.ws_attn, s);
}

int shadowkv_block_add_stages(void *ctx, kvb_step *step, const kvb_bf16 *q, const kvb_bf16 *knew,
                              const kvb_bf16 *vnew, kvb_bf16 *att)
{
    shadowkv_path *p = ctx;
    p->q = q, p->knew = knew, p->vnew = vnew, p->o = att;
    const int scan = (kvb_step_add(step, "landmark_score", 0, -1, stage_score, p) < 0)
                         ? -1
                         : kvb_step_add(step, "index_scan", 0, -1, stage_index_scan, p);
    const int values = scan < 0 ? -1 : kvb_step_add(step, "gather_copy_V", 1, scan, stage_values, p);
    if (values < 0 || kvb_step_add(step, "gather_copy_d2d_K", 0, -1, stage_keys_moved, p) < 0 ||
        kvb_step_add(step, "batch_gemm_rotary", 0, -1, stage_keys_rebuilt, p) < 0 ||
        kvb_step_add(step, "kv_append", 0, -1, stage_append, p) < 0 ||
        kvb_step_add(step, "decode_attn", 0, values, stage_attend, p) < 0)
        return KVB_EINVAL;
    return KVB_OK;
}
