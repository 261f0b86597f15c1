/* test_gpu_step_rocketkv.c: RocketKV's decode-time path on the GPU (kernels/step/step_rocketkv.h) against its
 * reference, one test per check-tier case of cases/rocketkv.cases (t = 0 and 1, t around page
 * boundaries for P = 2, 3, 4, 16, r = 1 and r = D, MHA, every token, budgets 256 to 4096 after 32K and
 * 128K prompts, the graph, the eager stages and the dense baseline), each validated twice on the same
 * state (the graph replayed, the workspaces reused); and the refusals, which need no device: the plan
 * and kv_append return KVB_EINVAL before anything is created or launched (the pointers below are never
 * dereferenced). */
#include <stdio.h>
#include <stdlib.h>

#include "harness/core/op.h"
#include "tests/testlib.h"
#if KVB_HAVE_CUDA
#include "kernels/step/step_rocketkv.h"
#endif

#if KVB_HAVE_CUDA
#define FAKE(T) ((T *)(uintptr_t)0x10000)

static void test_kv_append_refusals(void **state)
{
    (void)state;
    decode_layout d = {2, 32, 8, 128, 100};
    int32_t t[2] = {99, 100};
    assert_int_equal(kv_append(FAKE(kvb_bf16), FAKE(kvb_bf16), FAKE(int32_t), t, FAKE(kvb_bf16), FAKE(kvb_bf16), &d, 0),
                     KVB_EINVAL);
    assert_error_mentions("kv_append: t[1]=100 out of range [0, L = 100)");
    t[1] = -1;
    assert_int_equal(kv_append(FAKE(kvb_bf16), FAKE(kvb_bf16), FAKE(int32_t), t, FAKE(kvb_bf16), FAKE(kvb_bf16), &d, 0),
                     KVB_EINVAL);
    assert_error_mentions("kv_append: t[1]=-1 out of range");
    t[1] = 5;
    assert_int_equal(kv_append(FAKE(kvb_bf16), NULL, FAKE(int32_t), t, FAKE(kvb_bf16), FAKE(kvb_bf16), &d, 0), KVB_EINVAL);
    assert_error_mentions("kv_append: a pointer is NULL");
    assert_int_equal(kv_append(FAKE(kvb_bf16), (kvb_bf16 *)(uintptr_t)0x10008, FAKE(int32_t), t, FAKE(kvb_bf16),
                               FAKE(kvb_bf16), &d, 0),
                     KVB_EINVAL);
    assert_error_mentions("kv_append: vnew=", "is not 16-byte aligned");
    d.D = 96;
    assert_int_equal(kv_append(FAKE(kvb_bf16), FAKE(kvb_bf16), FAKE(int32_t), t, FAKE(kvb_bf16), FAKE(kvb_bf16), &d, 0),
                     KVB_EINVAL);
    assert_error_mentions("kv_append: D=96 is not one of {64, 128}");
}

static void test_plan_refusals(void **state)
{
    (void)state;
    const rocketkv_shape ok = {2, 32, 8, 128, 1000, 900, 3, 62, 256, page_cap_default(1000, 3)};
    int32_t t[2] = {900, 900}, len[2] = {901, 901}, cnt[2] = {86, 86};
    rocketkv_buffers b = {.t = FAKE(int32_t), .t_host = t, .len = FAKE(int32_t), .len_host = len, .cnt = FAKE(int32_t),
                          .cnt_host = cnt};
    rocketkv_step_plan p;
    rocketkv_shape s = ok;
    s.P = 0;
    assert_int_equal(rocketkv_step_plan_make(&p, "x", &s, &b, 0, 0, 0), KVB_EINVAL);
    assert_error_mentions("rocketkv_step: P=0 out of range [1, 4096]");
    s = ok, s.r = 129;
    assert_int_equal(rocketkv_step_plan_make(&p, "x", &s, &b, 0, 0, 0), KVB_EINVAL);
    assert_error_mentions("rocketkv_step: r=129 out of range [1, 128]");
    s = ok, s.k = 902;
    assert_int_equal(rocketkv_step_plan_make(&p, "x", &s, &b, 0, 0, 0), KVB_EINVAL);
    assert_error_mentions("k=902 tokens to attend out of range [1, L = 901]");
    s = ok, s.cap_pages = 320;
    assert_int_equal(rocketkv_step_plan_make(&p, "x", &s, &b, 0, 0, 0), KVB_EINVAL);
    assert_error_mentions("cap=320 out of range");
    t[1] = 899; /* the host copies must say what the plan assumes */
    assert_int_equal(rocketkv_step_plan_make(&p, "x", &ok, &b, 0, 0, 0), KVB_EINVAL);
    assert_error_mentions("rocketkv_step: t[1]=899 out of range [900, 900]");
    t[1] = 900, len[0] = 900;
    assert_int_equal(rocketkv_step_plan_make(&p, "x", &ok, &b, 0, 0, 0), KVB_EINVAL);
    assert_error_mentions("rocketkv_step: len[0]=900 out of range [901, 901]");
    len[0] = 901, cnt[1] = 87;
    assert_int_equal(rocketkv_step_plan_make(&p, "x", &ok, &b, 0, 0, 0), KVB_EINVAL);
    assert_error_mentions("rocketkv_step: cnt[1]=87 out of range [86, 86]");
}
#endif

int main(void)
{
    static const char *const families[] = {"step_rocketkv", NULL};
#if KVB_HAVE_CUDA
    const struct CMUnitTest fixed[] = {
        cmocka_unit_test(test_kv_append_refusals),
        cmocka_unit_test(test_plan_refusals),
    };
    return kvb_test_run_gpu_cases("gpu step_rocketkv", fixed, (int)(sizeof fixed / sizeof fixed[0]), families, 2);
#else
    return kvb_test_run_gpu_cases("gpu step_rocketkv", NULL, 0, families, 2);
#endif
}
