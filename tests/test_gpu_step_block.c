/* test_gpu_step_block.c: the dense decode step on the GPU (kernels/step/step_block.h) against the reference
 * of the whole block, one test per check-tier case of cases/decode_step.cases (tiny at ctx 0 and 1000,
 * Llama-3-8B at 4K and 32K, MHA llama2-7b; the graph and the eager stages), each validated twice on
 * one state (the graph replayed; omnikv's filter and sparse layers too); and the stages' refusals and
 * omnikv's path plan's, which need no device (the pointers are never dereferenced). */
#include <stdio.h>
#include <stdlib.h>

#include "harness/core/gpu.h"
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

/* kvb_step_add refuses a stream outside [0, 2] and an `after` on the stage's own stream */
static void test_stage_stream_refused(void **state)
{
    (void)state;
    static kvb_step step;
    snprintf(step.name, sizeof step.name, "case");
    assert_int_equal(kvb_step_add(&step, "a", 2, -1, no_stage, NULL), 0);
    assert_true(kvb_step_add(&step, "b", 3, -1, no_stage, NULL) < 0);
    assert_error_mentions("case: stage b: stream=3 out of range [0, 2]");
    assert_true(kvb_step_add(&step, "c", 2, 0, no_stage, NULL) < 0);
    assert_error_mentions("case: stage c: after=0 must be an earlier stage on another stream");
    assert_int_equal(kvb_step_add(&step, "d", 1, 0, no_stage, NULL), 1);
    assert_int_equal(step.n, 2);
}

/* Stage i of the three-stream test copies word i - 1 into word i, then sets byte i of word i: word i
 * holds bytes 0 .. i set only if the stage it waits for had written its word first */
typedef struct { int *word, *before; int byte; } order_stage;

static int set_after(void *ctx, cudaStream_t s)
{
    const order_stage *o = ctx;
    if (o->before && cudaMemcpyAsync(o->word, o->before, sizeof *o->word, cudaMemcpyDeviceToDevice, s) != cudaSuccess)
        return KVB_EDEVICE;
    return cudaMemsetAsync((char *)o->word + o->byte, 1, 1, s) == cudaSuccess ? KVB_OK : KVB_EDEVICE;
}

/* A step on the main stream and two side streams, eager and captured: each side stream forks from the
 * main one and joins it at the end, and a stage's `after` orders it behind another stream's stage; the
 * second side stream left unset runs its stages on the first */
static void test_three_streams(void **state)
{
    (void)state;
    if (!kvb_gpu_available()) skip();
    for (int distinct = 0; distinct < 2; distinct++) {
        cudaStream_t s[3];
        for (int k = 0; k < 3; k++) assert_int_equal(cudaStreamCreateWithFlags(&s[k], cudaStreamNonBlocking), cudaSuccess);
        int *w = NULL;
        assert_int_equal(cudaMalloc((void **)&w, 4 * sizeof *w), cudaSuccess);
        /* stage 0 on stream 0; 1 on side 1 after it; 2 on side 2 after 1; 3 on stream 0 after 2 */
        order_stage o[4] = {{w, NULL, 0}, {w + 1, w, 1}, {w + 2, w + 1, 2}, {w + 3, w + 2, 3}};
        static kvb_step step;
        for (int captured = 0; captured < 2; captured++) {
            kvb_step_init(&step, "three", s[0], s[1]);
            if (distinct) kvb_step_set_side2(&step, s[2]);
            assert_int_equal(kvb_step_add(&step, "zero", 0, -1, set_after, &o[0]), 0);
            assert_int_equal(kvb_step_add(&step, "one", 1, 0, set_after, &o[1]), 1);
            assert_int_equal(kvb_step_add(&step, "two", 2, 1, set_after, &o[2]), 2);
            assert_int_equal(kvb_step_add(&step, "three", 0, 2, set_after, &o[3]), 3);
            assert_int_equal(kvb_step_finalize(&step, 0), KVB_OK);
            assert_int_equal(cudaMemset(w, 0, 4 * sizeof *w), cudaSuccess);
            assert_int_equal(captured ? kvb_step_capture(&step) : KVB_OK, KVB_OK);
            assert_int_equal(captured ? kvb_step_launch_graph(&step) : kvb_step_enqueue(&step), KVB_OK);
            assert_int_equal(cudaStreamSynchronize(s[0]), cudaSuccess); /* the join: s[0] waits for both sides */
            int h[4];
            assert_int_equal(cudaMemcpy(h, w, sizeof h, cudaMemcpyDeviceToHost), cudaSuccess);
            const int expect[4] = {0x1, 0x101, 0x10101, 0x1010101};
            for (int i = 0; i < 4; i++) assert_int_equal(h[i], expect[i]);
            kvb_step_destroy(&step);
        }
        cudaFree(w);
        for (int k = 0; k < 3; k++) cudaStreamDestroy(s[k]);
    }
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
        cmocka_unit_test(test_stage_stream_refused),
        cmocka_unit_test(test_three_streams),
    };
    return kvb_test_run_gpu_cases("gpu step_block", fixed, (int)(sizeof fixed / sizeof fixed[0]), families, 2);
#else
    return kvb_test_run_gpu_cases("gpu step_block", NULL, 0, families, 2);
#endif
}
