/* test_gpu_landmark_score.c: landmark scoring (kernels/landmark_score/landmark_score.h), both implementations, against
 * the reference: one test per check-tier case of cases/landmark_score.cases (edges, odd sizes, G = 1
 * to 8, ties, long rows of many blocks, sampled reference), each validated twice on one
 * workspace (skipped without a device); and the API's refusals, which need no device. */
#include <stdio.h>
#include <stdlib.h>

#include "harness/core/op.h"
#include "tests/testlib.h"
#if KVB_HAVE_CUDA
#include "kernels/landmark_score/landmark_score.h"
#endif

#if KVB_HAVE_CUDA
static void test_api_rejects_before_launch(void **state)
{
    (void)state;
    const lms_shape ok = {2, 8, 2, 128, 1000, 64};
    lms_shape s = ok;
    assert_int_equal(landmark_score_check(&s, "t"), KVB_OK);
    s.D = 96;
    assert_int_equal(landmark_score_check(&s, "t"), KVB_EINVAL);
    assert_error_mentions("D=96 out of range {64, 128}");
    s = ok, s.Hq = 18, s.Hkv = 2;
    assert_int_equal(landmark_score_check(&s, "t"), KVB_EINVAL);
    assert_error_mentions("G = Hq/Hkv = 18/2 = 9 out of range [1, 8]");
    s = ok, s.Hq = 7;
    assert_int_equal(landmark_score_check(&s, "t"), KVB_EINVAL);
    assert_error_mentions("Hq=7 is not a multiple of Hkv=2");
    s = ok, s.M = 1001;
    assert_int_equal(landmark_score_check(&s, "t"), KVB_EINVAL);
    assert_error_mentions("M=1001 out of range [1, 1000]");
    s = ok, s.Lm = LMS_MAX_LM + 1, s.M = 1;
    assert_int_equal(landmark_score_check(&s, "t"), KVB_EINVAL);
    assert_error_mentions("Lm=2097153 out of range [1, 2097152]");

    /* the calls refuse before enqueueing anything: no pointer below is dereferenced */
    void *p = (void *)(uintptr_t)0x1000;
    lms_args a = {p, p, p, p, p, p, 1u << 30};
    s = ok;
    a.m = NULL;
    assert_int_equal(landmark_score(&s, &a, 0), KVB_EINVAL);
    assert_error_mentions("landmark_score: NULL pointer");
    a.m = p;
    s.D = 256;
    assert_int_equal(landmark_score(&s, &a, 0), KVB_EINVAL);
    assert_error_mentions("landmark_score: D=256 out of range");
    s = ok;
    size_t need = 0;
    assert_int_equal(landmark_score_cublas_workspace_bytes(&s, &need), KVB_OK);
    a.workspace_bytes = need - 1;
    assert_int_equal(landmark_score_cublas(p, &s, &a, 0), KVB_EINVAL);
    assert_error_mentions("landmark_score_cublas: workspace_bytes=", "too small");
    a.workspace_bytes = need;
    assert_int_equal(landmark_score_cublas(NULL, &s, &a, 0), KVB_EINVAL);
    assert_error_mentions("cublas_handle is NULL");
    landmark_score_plan plan;
    assert_int_equal(landmark_score_plan_make(&plan, "t", LMS_CUBLAS, NULL, &s, &a, 0, 0), KVB_EINVAL);
    assert_error_mentions("cublas_handle is NULL");
    landmark_score_plan_destroy(&plan);
}
#endif

int main(void)
{
    static const char *const families[] = {"landmark_score", NULL};
#if KVB_HAVE_CUDA
    const struct CMUnitTest fixed[] = {cmocka_unit_test(test_api_rejects_before_launch)};
    return kvb_test_run_gpu_cases("gpu landmark_score", fixed, (int)(sizeof fixed / sizeof fixed[0]), families, 2);
#else
    return kvb_test_run_gpu_cases("gpu landmark_score", NULL, 0, families, 2);
#endif
}
