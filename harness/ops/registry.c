/* registry.c: every kernel the harness knows. Adding a kernel: one file in kernels/, one in
 * reference/, one ops file here with its kvb_op, one line below, one case file. */
#include <string.h>

#include "harness/core/op.h"

extern const kvb_op op_index_scan, op_gather_copy, op_gather_copy_d2d, op_gather_copy_all, op_gather_step,
    op_packed_load;
extern const kvb_op op_selective_attn, op_heavy_hitters, op_snapkv;
extern const kvb_op op_decode_attn, op_sparse_attn_idx, op_sparse_attn_pages;
extern const kvb_op op_topk;
extern const kvb_op op_shadowkv_lowrank, op_shadowkv_landmarks, op_shadowkv_prefill;
extern const kvb_op op_landmark_score;
extern const kvb_op op_batch_gemm_rotary;
extern const kvb_op op_int2_quantize, op_int2_quantize_native, op_int2_native, op_int2_append, op_int2_qk, op_int2_av,
    op_int2_qk_native, op_int2_av_native, op_int2_decode_attn;
extern const kvb_op op_page_meta_build, op_page_meta_append, op_hybrid_score, op_quest_score;
extern const kvb_op op_omnikv_select;
extern const kvb_op op_rocketkv_decode;
extern const kvb_op op_block_linear, op_decode_step;

static const kvb_op *const g_ops[] = {
    &op_index_scan, &op_gather_copy, &op_gather_copy_d2d, &op_gather_copy_all, &op_gather_step, &op_packed_load,
    &op_selective_attn, &op_heavy_hitters, &op_snapkv,
    &op_decode_attn,
    &op_sparse_attn_idx,
    &op_sparse_attn_pages,
    &op_topk,
    &op_shadowkv_lowrank, &op_shadowkv_landmarks, &op_shadowkv_prefill,
    &op_landmark_score,
    &op_batch_gemm_rotary,
    &op_int2_quantize, &op_int2_quantize_native, &op_int2_native, &op_int2_append, &op_int2_qk, &op_int2_av,
    &op_int2_qk_native, &op_int2_av_native, &op_int2_decode_attn,
    &op_page_meta_build, &op_page_meta_append, &op_hybrid_score, &op_quest_score,
    &op_omnikv_select,
    &op_rocketkv_decode,
    &op_block_linear,
    &op_decode_step,
};

int kvb_op_count(void) { return (int)(sizeof g_ops / sizeof g_ops[0]); }
const kvb_op *kvb_op_at(int i) { return g_ops[i]; }

const kvb_op *kvb_op_find(const char *name)
{
    for (int i = 0; i < kvb_op_count(); i++)
        if (!strcmp(g_ops[i]->name, name)) return g_ops[i];
    return NULL;
}
