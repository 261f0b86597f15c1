/* test_gpu_copies.c: the harness's host <-> device copies (kvb_h2d, kvb_d2h; harness/core/gpu.c). Pageable
 * copies of at least 8 MiB go through two pinned 64 MiB buffers: every size around the chunk's edges, an
 * offset start, copies queued one after the other on one stream and across streams, and pinned memory (the
 * driver's path) must all arrive bit for bit. Skipped without a device. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "harness/core/gpu.h"
#include "tests/testlib.h"

#if KVB_HAVE_CUDA
#define MIB ((size_t)1 << 20)

/* byte i of a pattern that differs from one copy to the next */
static void pattern(uint8_t *p, size_t n, uint32_t salt)
{
    for (size_t i = 0; i < n; i++) p[i] = (uint8_t)((i * 2654435761u + salt) >> 13);
}

/* host -> device -> host through two device buffers, so a stale staging buffer cannot pass */
static void round_trip(size_t n, size_t offset, uint32_t salt)
{
    uint8_t *src = malloc(n + offset), *back = malloc(n + offset);
    assert_non_null(src);
    assert_non_null(back);
    pattern(src + offset, n, salt);
    memset(back, 0, n + offset);
    void *d = kvb_dmalloc(n), *d2 = kvb_dmalloc(n);
    cudaStream_t s = kvb_stream_create();
    kvb_h2d(d, src + offset, n, s);
    memset(src + offset, 0xA5, n); /* src may change once kvb_h2d returns */
    kvb_d2d(d2, d, n, s);
    kvb_d2h(back + offset, d2, n, s);
    pattern(src + offset, n, salt);
    if (memcmp(src + offset, back + offset, n)) fail_msg("round trip of %zu bytes (offset %zu) differs", n, offset);
    kvb_sync(s);
    kvb_stream_destroy(s);
    kvb_dfree(d), kvb_dfree(d2);
    free(src), free(back);
}

static void test_sizes(void **state)
{
    (void)state;
    if (!kvb_gpu_available()) skip();
    const size_t sizes[] = {1, 4097, 8 * MIB - 1, 8 * MIB, 64 * MIB - 1, 64 * MIB, 64 * MIB + 1, 128 * MIB + 12345,
                            300 * MIB + 7};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) round_trip(sizes[i], i % 2 ? 3 : 0, (uint32_t)i);
    kvb_stage_release();
    round_trip(100 * MIB + 1, 1, 99); /* set up again after a release */
    kvb_stage_release();
}

/* Several copies to the device queued back to back on two streams (the staging buffers reused while earlier
 * chunks may still be in flight), then each read back. */
static void test_queued_copies(void **state)
{
    (void)state;
    if (!kvb_gpu_available()) skip();
    enum { N = 4 };
    const size_t n = 96 * MIB + 11;
    uint8_t *src = malloc(n), *back = malloc(n);
    assert_non_null(src);
    assert_non_null(back);
    void *d[N];
    cudaStream_t s[2] = {kvb_stream_create(), kvb_stream_create()};
    for (int i = 0; i < N; i++) {
        d[i] = kvb_dmalloc(n);
        pattern(src, n, 1000u + (uint32_t)i);
        kvb_h2d(d[i], src, n, s[i % 2]);
    }
    kvb_sync(s[0]), kvb_sync(s[1]);
    for (int i = 0; i < N; i++) {
        kvb_d2h(back, d[i], n, s[(i + 1) % 2]);
        pattern(src, n, 1000u + (uint32_t)i);
        if (memcmp(src, back, n)) fail_msg("copy %d of %zu bytes differs", i, n);
        kvb_dfree(d[i]);
    }
    kvb_stream_destroy(s[0]), kvb_stream_destroy(s[1]);
    kvb_stage_release();
    free(src), free(back);
}

/* Pinned host memory takes the driver's path, with the same result */
static void test_pinned_host(void **state)
{
    (void)state;
    if (!kvb_gpu_available()) skip();
    const size_t n = 72 * MIB + 5;
    uint8_t *src = kvb_pinned_alloc(n), *back = kvb_pinned_alloc(n);
    pattern(src, n, 7);
    void *d = kvb_dmalloc(n);
    cudaStream_t s = kvb_stream_create();
    kvb_h2d(d, src, n, s);
    kvb_d2h(back, d, n, s);
    kvb_sync(s);
    if (memcmp(src, back, n)) fail_msg("pinned round trip of %zu bytes differs", n);
    kvb_stream_destroy(s);
    kvb_dfree(d);
    kvb_pinned_free(src), kvb_pinned_free(back);
}
#endif

int main(void)
{
#if KVB_HAVE_CUDA
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_queued_copies),
        cmocka_unit_test(test_pinned_host),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
#else
    return 0;
#endif
}
