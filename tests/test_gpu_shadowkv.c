/* test_gpu_shadowkv.c: ShadowKV's prefill on the GPU (kernels/shadowkv.h) against the reference, one
 * test per check-tier case of cases/shadowkv.cases (factorization bound, landmarks and outliers), each
 * validated twice on one workspace (skipped without a device); and the API's refusals, which come
 * before any handle or launch and need no device. */
#include <stdio.h>
#include <stdlib.h>

#include "harness/core/op.h"
#include "tests/testlib.h"
#if KVB_HAVE_CUDA
#include "kernels/shadowkv/shadowkv.h"
#endif

#if KVB_HAVE_CUDA
static void test_lowrank_plan_refuses(void **state)
{
    (void)state;
    shadowkv_lowrank_plan p;
    assert_int_equal(shadowkv_lowrank_plan_make(&p, 100, 1, 16, 17, SHADOWKV_EIG_TOP_R, 0), KVB_EINVAL);
    assert_error_mentions("r=17 out of range [1, 16]");
    assert_int_equal(shadowkv_lowrank_plan_make(&p, 10, 2, 16, 11, SHADOWKV_EIG_TOP_R, 0), KVB_EINVAL);
    assert_error_mentions("r=11 out of range [1, 10]");
    assert_int_equal(shadowkv_lowrank_plan_make(&p, 100, 2, 16, 0, SHADOWKV_EIG_TOP_R, 0), KVB_EINVAL);
    assert_error_mentions("r=0 out of range");
    assert_int_equal(shadowkv_lowrank_plan_make(&p, 100000, 64, 256, 160, SHADOWKV_EIG_TOP_R, 0), KVB_EINVAL);
    assert_error_mentions("Hkv*D=16384 out of range [1, 8192]");
    assert_int_equal(shadowkv_lowrank(&p, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, 0), KVB_EINVAL);
    assert_error_mentions("the plan was not made");
}

static void test_landmarks_refuse(void **state)
{
    (void)state;
    const kvb_bf16 *K = (const kvb_bf16 *)(uintptr_t)0x1000;
    kvb_bf16 *lm = (kvb_bf16 *)(uintptr_t)0x1000;
    int32_t *i = (int32_t *)(uintptr_t)0x1000;
    float *f = (float *)(uintptr_t)0x1000;
    void *ws = (void *)(uintptr_t)0x1000;
    /* S=100, c=8: 12 chunks, 4 local -> 8 chunks: 9 outliers are more than there are */
    assert_int_equal(shadowkv_landmarks(K, 1, 2, 100, 16, 8, 4, 9, lm, i, i, f, ws, 0), KVB_EINVAL);
    assert_error_mentions("outlier_chunks=9 out of range [0, n_chunks = floor(S/c) - local_chunks = floor(100/8) - 4 = 8]");
    assert_int_equal(shadowkv_landmarks(K, 1, 2, 100, 16, 0, 4, 1, lm, i, i, f, ws, 0), KVB_EINVAL);
    assert_error_mentions("c=0 out of range");
    assert_int_equal(shadowkv_landmarks(K, 1, 2, 100, 2000, 8, 4, 1, lm, i, i, f, ws, 0), KVB_EINVAL);
    assert_error_mentions("D=2000 out of range [1, 1024]");
    assert_int_equal(shadowkv_landmarks(NULL, 1, 2, 100, 16, 8, 4, 1, lm, i, i, f, ws, 0), KVB_EINVAL);
    assert_error_mentions("NULL");
}
#endif

int main(void)
{
    static const char *const families[] = {"shadowkv", NULL};
#if KVB_HAVE_CUDA
    const struct CMUnitTest fixed[] = {cmocka_unit_test(test_lowrank_plan_refuses), cmocka_unit_test(test_landmarks_refuse)};
    return kvb_test_run_gpu_cases("gpu shadowkv", fixed, (int)(sizeof fixed / sizeof fixed[0]), families, 2);
#else
    return kvb_test_run_gpu_cases("gpu shadowkv", NULL, 0, families, 2);
#endif
}
