/* test_gpu_gather_copy.c: the CUDA gather_copy family against the C reference, one test per
 * check-tier case of cases/gather_copy.cases (skipped, and counted as skipped, without a device);
 * each case is validated three times on the same device state, so the in-place ordering workspace
 * is reused across launches. The API-rejection tests need no device: a bad parameter must be
 * refused before any CUDA call. */
#include <stdio.h>
#include <stdlib.h>

#include "harness/core/op.h"
#include "tests/testlib.h"
#if KVB_HAVE_CUDA
#include "kernels/gather_copy/gather_copy.h"
#endif

#if KVB_HAVE_CUDA
static void test_api_rejects_before_launch(void **state)
{
    (void)state;
    /* dummy non-NULL pointers: nothing may be dereferenced or launched before the checks */
    int32_t *p = (int32_t *)(uintptr_t)0x1000;
    kvb_bf16 *b = (kvb_bf16 *)(uintptr_t)0x1000;
    assert_int_equal(index_scan(p, p, p, p, 1, 8, 5000, 0), KVB_EINVAL);
    assert_error_mentions("index_scan: M=5000 out of range [1, 4096]");
    assert_int_equal(index_scan(p, p, p, p, -3, 8, 256, 0), KVB_EINVAL);
    assert_error_mentions("B=-3 out of range");
    gather_layout g = {1, 8, 256, 8, 128, 416 + 2048, 416, 16384, 16384};
    gather_layout bad = g;
    bad.M = 4097;
    assert_int_equal(gather_copy(b, b, p, p, &bad, p, 0), KVB_EINVAL);
    assert_error_mentions("gather_copy: M=4097 out of range [1, 4096]");
    bad = g;
    bad.c = 1, bad.D = 4;
    assert_int_equal(gather_copy_d2d(b, p, p, &bad, p, 0), KVB_EINVAL);
    assert_error_mentions("gather_copy_d2d: chunk bytes c*D*2 = 1*4*2 = 8");
    bad = g;
    bad.host_stride = 100;
    assert_int_equal(gather_copy_all(b, b, p, &bad, 0), KVB_EINVAL);
    assert_error_mentions("host_stride=100");
    assert_int_equal(gather_copy(b, b, p, p, &g, NULL, 0), KVB_EINVAL);
    assert_error_mentions("NULL");
    packed_layout pk = {1, 65, 1024, 16, 8, 128};
    const kvb_bf16 *src[1] = {b};
    kvb_bf16 *dst[1] = {b};
    assert_int_equal(packed_load(src, dst, p, &pk, 0), KVB_EINVAL);
    assert_error_mentions("layers=65 out of range [1, 64]");
}
#endif

int main(void)
{
    static const char *const families[] = {"gather_copy", NULL};
#if KVB_HAVE_CUDA
    const struct CMUnitTest fixed[] = {
        cmocka_unit_test(test_api_rejects_before_launch),
    };
    return kvb_test_run_gpu_cases("gpu gather_copy", fixed, (int)(sizeof fixed / sizeof fixed[0]), families, 3);
#else
    return kvb_test_run_gpu_cases("gpu gather_copy", NULL, 0, families, 3);
#endif
}
