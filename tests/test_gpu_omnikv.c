/* test_gpu_omnikv.c: the OmniKV selector kernel (kernels/omnikv/omnikv.h) against the reference, one test per
 * check-tier case of cases/omnikv.cases (lengths 1, 17, around a 64-token tile; k = 1 and k = len; G = 1,
 * 2, 4, 8 at D = 64 and 128; per-sequence lengths; ties; 32K and 128K at k = 2048), each validated twice
 * on one workspace (skipped without a device); and the API's refusals, which need no device: each returns
 * KVB_EINVAL before anything is launched (the pointers below are never dereferenced). */
#include <stdio.h>
#include <stdlib.h>

#include "harness/core/op.h"
#include "tests/testlib.h"
#if KVB_HAVE_CUDA
#include "kernels/omnikv/omnikv.h"
#endif

#if KVB_HAVE_CUDA
#define FAKE(T) ((T *)(uintptr_t)0x10000)

static void test_api_refusals(void **state)
{
    (void)state;
    omnikv_layout s = {2, 32, 8, 128, 1000};
    int32_t len[2] = {1000, 600};
    const size_t big = (size_t)1 << 40;
    assert_int_equal(omnikv_select(FAKE(kvb_bf16), FAKE(kvb_bf16), FAKE(int32_t), len, &s, 0, FAKE(int32_t), NULL,
                                   FAKE(void), big, 0), KVB_EINVAL);
    assert_error_mentions("omnikv_select: k=0 out of range [1, min over b of len[b] = 600]");
    assert_int_equal(omnikv_select(FAKE(kvb_bf16), FAKE(kvb_bf16), FAKE(int32_t), len, &s, 601, FAKE(int32_t), NULL,
                                   FAKE(void), big, 0), KVB_EINVAL);
    assert_error_mentions("omnikv_select: k=601 out of range [1, min over b of len[b] = 600]");
    len[1] = 1001;
    assert_int_equal(omnikv_select(FAKE(kvb_bf16), FAKE(kvb_bf16), FAKE(int32_t), len, &s, 10, FAKE(int32_t), NULL,
                                   FAKE(void), big, 0), KVB_EINVAL);
    assert_error_mentions("omnikv_select: len[1]=1001 out of range [1, L = 1000]");
    len[1] = 600;
    assert_int_equal(omnikv_select(FAKE(kvb_bf16), FAKE(kvb_bf16), FAKE(int32_t), len, &s, 10, FAKE(int32_t), NULL,
                                   NULL, 0, 0), KVB_EINVAL);
    assert_error_mentions("omnikv_select: workspace_bytes=0 out of range");
    assert_int_equal(omnikv_select(FAKE(kvb_bf16), FAKE(kvb_bf16), FAKE(int32_t), len, &s, 10, FAKE(int32_t), NULL,
                                   FAKE(void), 16, 0), KVB_EINVAL);
    assert_error_mentions("omnikv_select: workspace_bytes=16 out of range");
    assert_int_equal(omnikv_select((kvb_bf16 *)(uintptr_t)0x10002, FAKE(kvb_bf16), FAKE(int32_t), len, &s, 10,
                                   FAKE(int32_t), NULL, FAKE(void), big, 0), KVB_EINVAL);
    assert_error_mentions("q=", "is not 16-byte aligned");
    assert_int_equal(omnikv_select(FAKE(kvb_bf16), NULL, FAKE(int32_t), len, &s, 10, FAKE(int32_t), NULL, FAKE(void), big,
                                   0), KVB_EINVAL);
    assert_error_mentions("NULL");
    assert_int_equal(omnikv_select(FAKE(kvb_bf16), FAKE(kvb_bf16), FAKE(int32_t), NULL, &s, 10, FAKE(int32_t), NULL,
                                   FAKE(void), big, 0), KVB_EINVAL);
    assert_error_mentions("NULL");
    s.Hq = 72;
    assert_int_equal(omnikv_select(FAKE(kvb_bf16), FAKE(kvb_bf16), FAKE(int32_t), len, &s, 10, FAKE(int32_t), NULL,
                                   FAKE(void), big, 0), KVB_EINVAL);
    assert_error_mentions("omnikv_select: G = Hq/Hkv = 72/8 = 9 out of range [1, 8]");
    s.Hq = 32, s.D = 256;
    assert_int_equal(omnikv_select(FAKE(kvb_bf16), FAKE(kvb_bf16), FAKE(int32_t), len, &s, 10, FAKE(int32_t), NULL,
                                   FAKE(void), big, 0), KVB_EINVAL);
    assert_error_mentions("omnikv_select: D=256 is not one of {64, 128}");
    assert_int_equal(omnikv_select_workspace_bytes(&s), 0);
}
#endif

int main(void)
{
    static const char *const families[] = {"omnikv", NULL};
#if KVB_HAVE_CUDA
    const struct CMUnitTest fixed[] = {
        cmocka_unit_test(test_api_refusals),
    };
    return kvb_test_run_gpu_cases("gpu omnikv", fixed, (int)(sizeof fixed / sizeof fixed[0]), families, 2);
#else
    return kvb_test_run_gpu_cases("gpu omnikv", NULL, 0, families, 2);
#endif
}
