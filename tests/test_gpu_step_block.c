/* test_gpu_step_block.c: the dense decode step on the GPU (kernels/step_block.h) against the reference
 * of the whole block, one test per check-tier case of cases/decode_step.cases (tiny at ctx 0 and 1000,
 * Llama-3-8B at 4K and 32K, MHA llama2-7b; the graph and the eager stages), each validated twice on
 * one state (the graph replayed); and the stages' refusals, which need no device. */
#include <stdio.h>
#include <stdlib.h>

#include "../harness/op.h"
#include "testlib.h"
#if KVB_HAVE_CUDA
#include "../kernels/block.h"
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
}
#endif

int main(void)
{
    static const char *const families[] = {"step_block", NULL};
#if KVB_HAVE_CUDA
    const struct CMUnitTest fixed[] = {
        cmocka_unit_test(test_refusals),
    };
    return kvb_test_run_gpu_cases("gpu step_block", fixed, 1, families, 2);
#else
    return kvb_test_run_gpu_cases("gpu step_block", NULL, 0, families, 2);
#endif
}
