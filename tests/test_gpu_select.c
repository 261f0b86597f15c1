/* test_gpu_select.c: the suite's top-k (kernels/select/select.h) against the reference, one test per
 * check-tier case of cases/select.cases (both plans: rows split over blocks, one block per row; ties;
 * rows beyond grid.y), each validated twice on one workspace (skipped without a device); and the
 * API's rejections, which need no device. */
#include <stdio.h>
#include <stdlib.h>

#include "harness/core/op.h"
#include "tests/testlib.h"
#if KVB_HAVE_CUDA
#include "kernels/select/select.h"
#endif

#if KVB_HAVE_CUDA
static void test_topk_api_rejects_before_launch(void **state)
{
    (void)state;
    float *f = (float *)(uintptr_t)0x1000;
    int32_t *i = (int32_t *)(uintptr_t)0x1000;
    assert_int_equal(topk_rows(f, 0, 10, 10, 1, 0, 0, i, 1, NULL, 0), KVB_EINVAL);
    assert_error_mentions("topk_rows: rows=0 out of range");
    assert_int_equal(topk_rows(f, 1, TOPK_MAX_N + 1, TOPK_MAX_N + 1, 1, 0, 0, i, 1, NULL, 0), KVB_EINVAL);
    assert_error_mentions("n=2097153 out of range [0, 2097152]");
    assert_int_equal(topk_rows(f, 1, 10, 10, 11, 0, 0, i, 11, NULL, 0), KVB_EINVAL);
    assert_error_mentions("k=11 out of range [0, n = 10]");
    assert_int_equal(topk_rows(f, 1, 9, 10, 1, 0, 0, i, 1, NULL, 0), KVB_EINVAL);
    assert_error_mentions("ld=9 out of range");
    assert_int_equal(topk_rows(f, 1, 10, 10, 4, 0, 2, i, 5, NULL, 0), KVB_EINVAL);
    assert_error_mentions("k + tail_n = 6 out of range [0, ldo = 5]");
    assert_int_equal(topk_rows(NULL, 1, 10, 10, 4, 0, 0, i, 4, NULL, 0), KVB_EINVAL);
    assert_error_mentions("NULL");
}
#endif

int main(void)
{
    static const char *const families[] = {"select", NULL};
#if KVB_HAVE_CUDA
    const struct CMUnitTest fixed[] = {cmocka_unit_test(test_topk_api_rejects_before_launch)};
    return kvb_test_run_gpu_cases("gpu select", fixed, (int)(sizeof fixed / sizeof fixed[0]), families, 2);
#else
    return kvb_test_run_gpu_cases("gpu select", NULL, 0, families, 2);
#endif
}
