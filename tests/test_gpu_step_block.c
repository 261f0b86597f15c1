/* test_gpu_step_block.c: the dense decode step on the GPU (kernels/step/step_block.h) against the reference
 * of the whole block, one test per check-tier case of cases/decode_step.cases (tiny at ctx 0 and 1000,
 * Llama-3-8B at 4K and 32K, MHA llama2-7b; the graph and the eager stages), each validated twice on
 * one state (the graph replayed; omnikv's filter and sparse layers too); and the stages' refusals and
 * omnikv's path plan's, which need no device (the pointers are never dereferenced). */
#include <stdio.h>
#include <stdlib.h>

#include "harness/core/op.h"
#include "tests/testlib.h"
#if KVB_HAVE_CUDA
#include "kernels/step/block.h"
#include "kernels/step/compose.h"
#include "kernels/step/step_omnikv.h"
#endif

#if KVB_HAVE_CUDA
#define FAKE(T) ((T *)(uintptr_t)0x10000)

static void test_refusals(void **state)
{
    (void)state;
    assert_int_equal(block_rmsnorm(FAKE(kvb_bf16), FAKE(kvb_bf16), 2, 12, 1e-5, FAKE(kvb_bf16), NULL, 0), KVB_EINVAL);
    assert_error_mentions("block_rmsnorm: n=12 is not a multiple of 8 in [8, 65536]");
    assert_int_equal(block_rmsnorm(FAKE(kvb_bf16), FAKE(kvb_bf16), 2, 16, 0, FAKE(kvb_bf16), NULL, 0), KVB_EINVAL);
    assert_error_mentions("block_rmsnorm: eps=0 out of range (0, 1)");
    int32_t pos[2] = {3, 10};
    assert_int_equal(block_rope_split(FAKE(kvb_bf16), FAKE(kvb_bf16), FAKE(int32_t), pos, 10, 2, 4, 2, 64, FAKE(kvb_bf16),
                                      FAKE(kvb_bf16), FAKE(kvb_bf16), 0), KVB_EINVAL);
    assert_error_mentions("block_rope_split: pos[1]=10 out of range [0, max_pos = 10)");
    assert_int_equal(block_rope_split(FAKE(kvb_bf16), FAKE(kvb_bf16), FAKE(int32_t), pos, 11, 2, 4, 2, 63, FAKE(kvb_bf16),
                                      FAKE(kvb_bf16), FAKE(kvb_bf16), 0), KVB_EINVAL);
    assert_error_mentions("block_rope_split: D=63 is not even");
    assert_int_equal(block_silu_mul(FAKE(kvb_bf16), 0, 64, FAKE(kvb_bf16), 0), KVB_EINVAL);
    assert_error_mentions("block_silu_mul: rows=0 out of range");
    assert_int_equal(block_linear(FAKE(void), FAKE(kvb_bf16), FAKE(kvb_bf16), 1, 100, 64, 0, FAKE(kvb_bf16), 0), KVB_EINVAL);
    assert_error_mentions("block_linear: in=100 is not a multiple of 8");
    assert_int_equal(block_linear(NULL, FAKE(kvb_bf16), FAKE(kvb_bf16), 1, 64, 64, 0, FAKE(kvb_bf16), 0), KVB_EINVAL);
    assert_error_mentions("block_linear: cublas, x, W or y is NULL");
    assert_int_equal(block_prefetch_l2(NULL, 64, 0), KVB_EINVAL);
    assert_error_mentions("block_prefetch_l2: p is NULL");
    assert_int_equal(block_prefetch_l2(FAKE(char) + 8, 64, 0), KVB_EINVAL);
    assert_error_mentions("block_prefetch_l2: p must be 16-byte aligned and bytes=64 a multiple of 16");
    assert_int_equal(block_prefetch_l2(FAKE(char), 40, 0), KVB_EINVAL);
    assert_error_mentions("bytes=40 a multiple of 16 in [16, 2^40]");
}

static int no_stage(void *ctx, cudaStream_t s) { (void)ctx, (void)s; return KVB_OK; }

/* kvb_step_add refuses a stage name the bench's counter would cut, before touching the step */
static void test_stage_name_refused(void **state)
{
    (void)state;
    static kvb_step step; /* zeroed: kvb_step_add writes only the stage table */
    snprintf(step.name, sizeof step.name, "case");
    assert_int_equal(kvb_step_add(&step, "hybrid_score_append+page_topk", 0, -1, no_stage, NULL), 0);
    assert_true(kvb_step_add(&step, "meta_append+hybrid_score+page_topk", 0, -1, no_stage, NULL) < 0);
    assert_error_mentions("case: stage meta_append+hybrid_score+page_topk: name of 34 characters, at most 30");
    assert_int_equal(step.n, 1);
}

/* omnikv_path_prepare: every check against the host copies, before anything is launched */
static void test_omnikv_path_refusals(void **state)
{
    (void)state;
    enum { B = 2, L = 11, CTX = 8, K = 4, N = K + L - CTX };
    int32_t pos[B] = {L - 1, L - 1}, len[B] = {L, L}, prompt[B] = {CTX, CTX}, cnt[B] = {N, N};
    int32_t idx[B * 2 * N];
    for (int l = 0; l < B * 2; l++)
        for (int j = 0; j < N; j++) idx[l * N + j] = j < K ? 2 * j : CTX + j - K; /* 0 2 4 6 8 9 10 */
    omnikv_step_shape sh = {1, {B, 4, 2, 64, L}, CTX, K, N};
    const omnikv_layout sel = {B, 4, 2, 64, L};
    omnikv_buffers b = {.pos = FAKE(int32_t), .pos_host = pos, .len = FAKE(int32_t), .len_host = len,
                        .K = FAKE(kvb_bf16), .V = FAKE(kvb_bf16), .attn_ws = FAKE(void),
                        .prompt = FAKE(int32_t), .prompt_host = prompt, .sel = FAKE(int32_t),
                        .select_ws = FAKE(void), .select_ws_bytes = omnikv_select_workspace_bytes(&sel),
                        .idx = FAKE(int32_t), .idx_host = idx, .cnt = FAKE(int32_t), .cnt_host = cnt};
    omnikv_path p;
    assert_int_equal(omnikv_path_prepare(&p, &sh, &b), KVB_OK);
    sh.filter = 0;
    assert_int_equal(omnikv_path_prepare(&p, &sh, &b), KVB_OK);
    idx[2 * N + 3] = L; /* sequence 1, kv head 0 */
    assert_int_equal(omnikv_path_prepare(&p, &sh, &b), KVB_EINVAL);
    assert_error_mentions("omnikv_step: idx[b=1, kv head=0, entry 3]=11 out of range [0, 11)");
    idx[2 * N + 3] = 6, cnt[1] = N - 1;
    assert_int_equal(omnikv_path_prepare(&p, &sh, &b), KVB_EINVAL);
    assert_error_mentions("omnikv_step: cnt[1]=6 out of range [7, 7]");
    cnt[1] = N, pos[0] = L - 2;
    assert_int_equal(omnikv_path_prepare(&p, &sh, &b), KVB_EINVAL);
    assert_error_mentions("omnikv_step: pos[0]=9 out of range [10, 10]");
    pos[0] = L - 1, sh.filter = 1, sh.k = CTX + 1;
    assert_int_equal(omnikv_path_prepare(&p, &sh, &b), KVB_EINVAL);
    assert_error_mentions("omnikv_step: k=9 out of range [1, min over b of len[b] = 8]");
    sh.k = K, b.select_ws_bytes--;
    assert_int_equal(omnikv_path_prepare(&p, &sh, &b), KVB_EINVAL);
    assert_error_mentions("omnikv_step: select_ws_bytes=");
    b.select_ws_bytes++, prompt[1] = CTX - 1;
    assert_int_equal(omnikv_path_prepare(&p, &sh, &b), KVB_EINVAL);
    assert_error_mentions("omnikv_step: prompt[1]=7 out of range [8, 8]");
    prompt[1] = CTX, sh.ctx = L;
    assert_int_equal(omnikv_path_prepare(&p, &sh, &b), KVB_EINVAL);
    assert_error_mentions("omnikv_step: ctx=11 out of range [1, 10]");
}
#endif

int main(void)
{
    static const char *const families[] = {"step_block", NULL};
#if KVB_HAVE_CUDA
    const struct CMUnitTest fixed[] = {
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_omnikv_path_refusals),
        cmocka_unit_test(test_stage_name_refused),
    };
    return kvb_test_run_gpu_cases("gpu step_block", fixed, (int)(sizeof fixed / sizeof fixed[0]), families, 2);
#else
    return kvb_test_run_gpu_cases("gpu step_block", NULL, 0, families, 2);
#endif
}
