/* test_gpu_selective_attn.c: the CUDA selective_attn and heavy_hitters families (selective_attn,
 * heavy_hitters, snapkv) against the C references, one test per check-tier case of their case files
 * (skipped, and counted as skipped, without a device); each case is validated twice on the same device
 * state (outputs poisoned before each launch). The API-rejection tests need no device: a bad parameter
 * must be refused, with a message naming it, before any CUDA call. */
#include <stdio.h>
#include <stdlib.h>

#include "harness/core/op.h"
#include "tests/testlib.h"
#if KVB_HAVE_CUDA
#include "kernels/heavy_hitters/heavy_hitters.h"
#include "kernels/selective_attn/selective_attn.h"
#endif

#if KVB_HAVE_CUDA
static void test_api_rejects_before_launch(void **state)
{
    (void)state;
    /* dummy non-NULL pointers: nothing may be dereferenced or launched before the checks */
    kvb_bf16 *b = (kvb_bf16 *)(uintptr_t)0x1000;
    float *f = (float *)(uintptr_t)0x1000;
    int32_t *i = (int32_t *)(uintptr_t)0x1000;
    sattn_params good = {1, 8, 2, 1000, 128, 1, 0, 1, 1}, p;
    p = good, p.D = 96;
    assert_int_equal(selective_attn(b, b, b, &p, b, f, f, f, f, 0, 0), KVB_EINVAL);
    assert_error_mentions("selective_attn: D=96 is not supported (supported head dimensions: 64, 128)");
    p = good, p.Hq = 6, p.Hkv = 4;
    assert_int_equal(selective_attn(b, b, b, &p, b, f, f, f, f, 0, 0), KVB_EINVAL);
    assert_error_mentions("Hq=6 is not a multiple of Hkv=4");
    p = good, p.L = 0;
    assert_int_equal(selective_attn_fwd(b, b, b, &p, b, f, 0), KVB_EINVAL);
    assert_error_mentions("selective_attn_fwd: L=0 out of range [1, 1048576]");
    p = good, p.w0 = 1000;
    assert_int_equal(selective_attn_colsum(b, b, f, &p, f, f, 0), KVB_EINVAL);
    assert_error_mentions("selective_attn_colsum: w0=1000 out of range [0, L-1 = 999]");
    p = good, p.need_out = 0;
    assert_int_equal(selective_attn_fwd(b, b, b, &p, b, f, 0), KVB_EINVAL);
    assert_error_mentions("need_out=0 out of range [1, 1]");
    p = good, p.need_out = 0, p.w0 = 999; /* splits the keys: needs a workspace */
    assert_int_equal(selective_attn(b, b, b, &p, NULL, f, f, f, NULL, 0, 0), KVB_EINVAL);
    assert_error_mentions("workspace_bytes=0 out of range");
    assert_int_equal(selective_attn(b, b, b, &good, NULL, f, f, f, NULL, 0, 0), KVB_EINVAL);
    assert_error_mentions("NULL output");
    /* the Hopper passes: their own shape limits and TMA's 16-byte alignment, refused on any machine */
    p = good, p.need_out = 0;
    assert_int_equal(selective_attn_fwd_wgmma(b, b, b, &p, b, f, 0), KVB_EINVAL);
    assert_error_mentions("selective_attn_fwd_wgmma: need_out=0 out of range [1, 1]");
    assert_int_equal(selective_attn_fwd_wgmma(b, b, (kvb_bf16 *)(uintptr_t)0x1008, &good, b, f, 0), KVB_EINVAL);
    assert_error_mentions("selective_attn_fwd_wgmma: V=0x1008 is not 16-byte aligned");
    assert_int_equal(selective_attn_colsum_wgmma((kvb_bf16 *)(uintptr_t)0x1004, b, f, &good, f, f, 0), KVB_EINVAL);
    assert_error_mentions("selective_attn_colsum_wgmma: Q=0x1004 is not 16-byte aligned");
    p = good, p.D = 80;
    assert_int_equal(selective_attn_colsum_wgmma(b, b, f, &p, f, f, 0), KVB_EINVAL);
    assert_error_mentions("D=80 is not supported");
    assert_int_equal(selective_attn_lse_packed_wgmma(b, b, &good, 1, 1000, f, NULL, NULL, 0), KVB_EINVAL);
    assert_error_mentions("selective_attn_lse_packed_wgmma: need_out=1, G*(L-w0)=4000, L-w0=1000 out of range");
    p = good, p.need_out = 0, p.w0 = 990; /* G = 4 heads of 10 rows: packed, but not a multiple of 8 */
    assert_int_equal(selective_attn_lse_packed_wgmma(b, b, &p, 1, 1000, f, NULL, NULL, 0), KVB_EINVAL);
    assert_error_mentions("L-w0=10 out of range");
    p.w0 = 992; /* 8 rows a head; the splits must cover L and each start below it */
    assert_int_equal(selective_attn_lse_packed_wgmma(b, b, &p, 2, 400, NULL, f, f, 0), KVB_EINVAL);
    assert_error_mentions("splits=2 split_keys=400 out of range");
    assert_int_equal(selective_attn_lse_packed_wgmma(b, b, &p, 4, 400, NULL, f, f, 0), KVB_EINVAL);
    assert_error_mentions("splits=4 split_keys=400 out of range");
    assert_int_equal(selective_attn_lse_packed_wgmma(b, b, &p, 3, 400, NULL, NULL, f, 0), KVB_EINVAL);
    assert_error_mentions("NULL pointer among Q, K and LSE (one split) or part_m, part_l (several)");
    p = good, p.L = 65536, p.Hq = 16;
    size_t bytes;
    assert_int_equal(selective_attn_materialized_workspace_bytes(&p, &bytes), KVB_EINVAL);
    assert_error_mentions("L=65536 out of range for the cuBLAS peer");
    /* selections */
    assert_int_equal(maxpool_rows(f, 4, 1000, 64, f, 0), KVB_EINVAL);
    assert_error_mentions("maxpool_rows: ks=64 is not an odd pooling kernel in [1, 8191]");
    assert_int_equal(topk_rows(f, 4, 1000, 1000, 1001, 0, 0, i, 1001, NULL, 0), KVB_EINVAL);
    assert_error_mentions("topk_rows: k=1001 out of range [0, n = 1000]");
    assert_int_equal(heavy_hitters_keep(f, 4, 1000, 1001, 0, i, NULL, 0), KVB_EINVAL);
    assert_error_mentions("heavy_hitters_keep: n_hh=1001 out of range [0, L = 1000]");
    assert_int_equal(heavy_hitters_keep(f, 4, 0, 0, 0, i, NULL, 0), KVB_EINVAL);
    assert_error_mentions("L=0 out of range");
    assert_int_equal(snapkv_keep(f, 4, 1000, 32, 31, i, NULL, 0), KVB_EINVAL);
    assert_error_mentions("snapkv_keep: n_keep=31 out of range [W = 32, L = 1000]");
    assert_int_equal(gather_rows(b, 8, 3, 1000, 128, i, 10, b, 0), KVB_EINVAL);
    assert_error_mentions("gather_rows: group=3 does not divide rows=8");
    assert_int_equal(gather_rows(b, 8, 4, 1000, 12, i, 10, b, 0), KVB_EINVAL);
    assert_error_mentions("gather_rows: D=12 is not a positive multiple of 8");
    assert_int_equal(gather_rows_pair(b, NULL, 8, 4, 1000, 128, i, 10, b, b, 0), KVB_EINVAL);
    assert_error_mentions("gather_rows_pair: NULL pointer");
    assert_int_equal(gather_rows_pair(b, b, 8, 3, 1000, 128, i, 10, b, b, 0), KVB_EINVAL);
    assert_error_mentions("gather_rows_pair: group=3 does not divide rows=8");
    /* 1024 16-byte chunks a block: 2^41 of them pass grid.x's 2^31 - 1 blocks (refused, not truncated) */
    assert_int_equal(gather_rows(b, 1 << 20, 1, 1 << 20, 16, i, 1 << 20, b, 0), KVB_EINVAL);
    assert_error_mentions("gather_rows: rows*n_keep*D/8 = 2199023255552 out of range [1, 2199023254528]");
}
#endif

int main(void)
{
    static const char *const families[] = {"selective_attn", "heavy_hitters", NULL};
#if KVB_HAVE_CUDA
    const struct CMUnitTest fixed[] = {
        cmocka_unit_test(test_api_rejects_before_launch),
    };
    return kvb_test_run_gpu_cases("gpu selective_attn", fixed, (int)(sizeof fixed / sizeof fixed[0]), families, 2);
#else
    return kvb_test_run_gpu_cases("gpu selective_attn", NULL, 0, families, 2);
#endif
}
