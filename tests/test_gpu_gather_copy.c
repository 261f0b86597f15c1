/* test_gpu_gather_copy.c: the CUDA gather_copy family against the C reference, one test per
 * check-tier case of cases/gather_copy.cases (skipped, and counted as skipped, without a device);
 * each case is validated three times on the same device state, so the in-place ordering workspace
 * is reused across launches. The API-rejection tests need no device: a bad parameter must be
 * refused before any CUDA call. On a device, the split fetch (gather_copy_d2d, then
 * gather_copy_misses on a capped grid) against gather_copy, bit for bit. */
#include <stdio.h>
#include <stdlib.h>

#include "harness/core/op.h"
#include "harness/ops/ops.h"
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
    assert_int_equal(gather_copy_misses(b, b, p, p, &g, 0, 0), KVB_EINVAL);
    assert_error_mentions("gather_copy_misses: max_blocks=0 out of range [1, 65535]");
    assert_int_equal(gather_copy_misses(b, b, p, p, &g, 65536, 0), KVB_EINVAL);
    assert_error_mentions("max_blocks=65536 out of range [1, 65535]");
    bad = g;
    bad.sparse_start = -1;
    assert_int_equal(gather_copy_misses(b, b, p, p, &bad, 64, 0), KVB_EINVAL);
    assert_error_mentions("gather_copy_misses: sparse_start=-1");
    assert_int_equal(gather_copy_misses(b, b, p, NULL, &g, 64, 0), KVB_EINVAL);
    assert_error_mentions("NULL");
}

/* A deterministic bit pattern (no value is special: the buffers are compared bit for bit). */
static void fill_bits(kvb_bf16 *x, size_t n, uint32_t salt)
{
    for (size_t i = 0; i < n; i++) x[i] = (kvb_bf16)(((uint32_t)i * 2654435761u + salt) >> 16);
}

/* ShadowKV's shapes (c=8, D=128, M=256, 60% hits) on a small batch: gather_copy_d2d, then
 * gather_copy_misses on 64 blocks (several ranges per block), leave the buffer bit-identical to
 * gather_copy's, and both equal the reference. */
static void test_misses_after_d2d_match_gather_copy(void **state)
{
    (void)state;
    if (!kvb_gpu_available()) skip();
    enum { B = 3, HKV = 4, M = 256, C = 8, D = 128, CHUNKS = 2048, SPARSE = 416, NB = SPARSE + M * C + 64 };
    const gather_layout g = {B, HKV, M, C, D, NB, SPARSE, CHUNKS, CHUNKS};
    const int rows = B * HKV;
    const size_t nbuf = (size_t)rows * NB * D, nh = (size_t)rows * CHUNKS * C * D;
    int32_t *old_ids = malloc(sizeof(int32_t) * rows * M), *new_ids = malloc(sizeof(int32_t) * rows * M);
    int32_t *offsets = malloc(sizeof(int32_t) * rows * M), cnts[B * HKV];
    assert_int_equal(kvb_make_step_ids(7, rows, M, CHUNKS, M, (int)(0.6 * M + 0.5), old_ids, new_ids), KVB_OK);
    assert_int_equal(ref_index_scan(old_ids, new_ids, offsets, cnts, B, HKV, M), KVB_OK);
    kvb_bf16 *vh = kvb_pinned_alloc(nh * 2), *buf = malloc(nbuf * 2), *whole = malloc(nbuf * 2),
             *split = malloc(nbuf * 2);
    fill_bits(vh, nh, 1);
    fill_bits(buf, nbuf, 2);
    const size_t ws_bytes = gather_copy_workspace_bytes(&g);
    kvb_bf16 *d_whole = kvb_dmalloc(nbuf * 2), *d_split = kvb_dmalloc(nbuf * 2);
    int32_t *d_off = kvb_dmalloc(sizeof(int32_t) * rows * M), *d_cnts = kvb_dmalloc(sizeof cnts);
    void *ws_whole = kvb_dmalloc(ws_bytes), *ws_split = kvb_dmalloc(ws_bytes);
    cudaStream_t s = kvb_stream_create();
    kvb_h2d(d_whole, buf, nbuf * 2, s), kvb_h2d(d_split, buf, nbuf * 2, s);
    kvb_h2d(d_off, offsets, sizeof(int32_t) * rows * M, s), kvb_h2d(d_cnts, cnts, sizeof cnts, s);
    kvb_dmemset(ws_whole, 0, ws_bytes, s), kvb_dmemset(ws_split, 0, ws_bytes, s);
    assert_int_equal(gather_copy(vh, d_whole, d_off, d_cnts, &g, ws_whole, s), KVB_OK);
    assert_int_equal(gather_copy_d2d(d_split, d_off, d_cnts, &g, ws_split, s), KVB_OK);
    assert_int_equal(gather_copy_misses(vh, d_split, d_off, d_cnts, &g, 64, s), KVB_OK);
    kvb_d2h(whole, d_whole, nbuf * 2, s), kvb_d2h(split, d_split, nbuf * 2, s);
    kvb_sync(s);
    assert_int_equal(ref_gather_copy(vh, buf, offsets, cnts, &g), KVB_OK);
    assert_memory_equal(split, whole, nbuf * 2);
    assert_memory_equal(whole, buf, nbuf * 2);
    kvb_dfree(d_whole), kvb_dfree(d_split), kvb_dfree(d_off), kvb_dfree(d_cnts), kvb_dfree(ws_whole), kvb_dfree(ws_split);
    kvb_stream_destroy(s);
    kvb_pinned_free(vh);
    free(old_ids), free(new_ids), free(offsets), free(buf), free(whole), free(split);
}
#endif

int main(void)
{
    static const char *const families[] = {"gather_copy", NULL};
#if KVB_HAVE_CUDA
    const struct CMUnitTest fixed[] = {
        cmocka_unit_test(test_api_rejects_before_launch),
        cmocka_unit_test(test_misses_after_d2d_match_gather_copy),
    };
    return kvb_test_run_gpu_cases("gpu gather_copy", fixed, (int)(sizeof fixed / sizeof fixed[0]), families, 3);
#else
    return kvb_test_run_gpu_cases("gpu gather_copy", NULL, 0, families, 3);
#endif
}
