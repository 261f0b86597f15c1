/* test_ref_gather_copy.c: the C references of gather_copy (kernels/gather_copy/NOTES.md), on hand-checked
 * cases and on the properties that note states, plus the property checker itself (it must catch
 * violations). */
#include <stdio.h>
#include <stdlib.h>

#include "harness/ops/ops.h"
#include "harness/core/tensor.h"
#include "reference/gather_copy.h"
#include "tests/testlib.h"

/* Worked by hand: old slots [7, -1, 3, 9, 12, 5], new [5, 20, 3, 1, 12, 30].
 * Hits (old ids in new) by old slot: slot 2 (3), slot 4 (12), slot 5 (5)  -> cnt 3.
 * Misses (new ids not in old), ascending: 1, 20, 30. */
static void test_index_scan_by_hand(void **state)
{
    (void)state;
    int32_t cached[6] = {7, -1, 3, 9, 12, 5}, fresh[6] = {5, 20, 3, 1, 12, 30}, offsets[6], cnts[1];
    assert_int_equal(ref_index_scan(cached, fresh, offsets, cnts, 1, 1, 6), KVB_OK);
    int32_t want_off[6] = {2, 4, 5, 1, 20, 30}, want_cached[6] = {3, 12, 5, 1, 20, 30};
    assert_int_equal(cnts[0], 3);
    assert_memory_equal(offsets, want_off, sizeof want_off);
    assert_memory_equal(cached, want_cached, sizeof want_cached);
}

static void test_index_scan_first_step_and_full_hit(void **state)
{
    (void)state;
    int32_t cached[4] = {-1, -1, -1, -1}, fresh[4] = {9, 2, 7, 4}, offsets[4], cnts[1];
    assert_int_equal(ref_index_scan(cached, fresh, offsets, cnts, 1, 1, 4), KVB_OK);
    int32_t want[4] = {2, 4, 7, 9};
    assert_int_equal(cnts[0], 0);
    assert_memory_equal(offsets, want, sizeof want);
    assert_memory_equal(cached, want, sizeof want);
    /* the same ids again: all hits, each slot onto itself */
    int32_t again[4] = {4, 9, 2, 7};
    assert_int_equal(ref_index_scan(cached, again, offsets, cnts, 1, 1, 4), KVB_OK);
    int32_t self[4] = {0, 1, 2, 3};
    assert_int_equal(cnts[0], 4);
    assert_memory_equal(offsets, self, sizeof self);
    assert_memory_equal(cached, want, sizeof want);
}

static void test_index_scan_properties_over_shapes(void **state)
{
    (void)state;
    const int Ms[] = {1, 7, 128, 256, 1000, 1024, 4096};
    const double hits[] = {0.0, 0.6, 1.0};
    const double empties[] = {0.0, 0.25};
    for (size_t mi = 0; mi < sizeof Ms / sizeof Ms[0]; mi++)
        for (int hi = 0; hi < 3; hi++)
            for (int ei = 0; ei < 2; ei++) {
                int M = Ms[mi], rows = M >= 1024 ? 1 : 3;
                int n_old = M - (int)(empties[ei] * M + 0.5), n_hit = (int)(hits[hi] * n_old + 0.5);
                size_t n = (size_t)rows * M;
                int32_t *old = malloc(n * 4), *fresh = malloc(n * 4), *cached = malloc(n * 4), *off = malloc(n * 4);
                int32_t cnts[3];
                kvb_make_step_ids(1000 + M, rows, M, 3 * (int64_t)M + 5, n_old, n_hit, old, fresh);
                memcpy(cached, old, n * 4);
                assert_int_equal(ref_index_scan(cached, fresh, off, cnts, rows, 1, M), KVB_OK);
                if (kvb_index_scan_properties(old, fresh, cached, off, cnts, rows, M) != KVB_OK)
                    fail_msg("M=%d hit=%.1f empty=%.2f: %s", M, hits[hi], empties[ei], kvb_last_error());
                for (int r = 0; r < rows; r++) assert_int_equal(cnts[r], n_hit); /* the hit rate asked for */
                free(old), free(fresh), free(cached), free(off);
            }
}

/* The checker must catch what it claims to check. */
static void test_properties_checker_catches_violations(void **state)
{
    (void)state;
    int32_t old[6] = {7, -1, 3, 9, 12, 5}, fresh[6] = {5, 20, 3, 1, 12, 30};
    int32_t good_off[6] = {2, 4, 5, 1, 20, 30}, good_cached[6] = {3, 12, 5, 1, 20, 30}, cnt[1] = {3};
    int32_t off[6], cached[6];
    assert_int_equal(kvb_index_scan_properties(old, fresh, good_cached, good_off, cnt, 1, 6), KVB_OK);
    memcpy(off, good_off, sizeof off), memcpy(cached, good_cached, sizeof cached);
    off[0] = 4, off[1] = 2, cached[0] = 12, cached[1] = 3; /* hits out of old-slot order */
    assert_int_equal(kvb_index_scan_properties(old, fresh, cached, off, cnt, 1, 6), KVB_EINVAL);
    assert_error_mentions("not sorted by old slot");
    memcpy(off, good_off, sizeof off), memcpy(cached, good_cached, sizeof cached);
    off[3] = 20, off[4] = 1, cached[3] = 20, cached[4] = 1; /* misses not ascending */
    assert_int_equal(kvb_index_scan_properties(old, fresh, cached, off, cnt, 1, 6), KVB_EINVAL);
    assert_error_mentions("misses not ascending");
    int32_t cnt2[1] = {2};
    assert_int_equal(kvb_index_scan_properties(old, fresh, good_cached, good_off, cnt2, 1, 6), KVB_EINVAL);
    assert_error_mentions("cnt=2");
    memcpy(cached, good_cached, sizeof cached);
    cached[5] = 31;
    assert_int_equal(kvb_index_scan_properties(old, fresh, cached, good_off, cnt, 1, 6), KVB_EINVAL);
    /* offsets[i] >= i: old [3, 5, -1], new [5, 3, 8] gives hits at slots 0, 1; a checker fed offsets
     * [1, 0] (a later slot first) must object */
    int32_t o3[3] = {3, 5, -1}, f3[3] = {5, 3, 8}, bad_off[3] = {1, 0, 8}, c3[3] = {5, 3, 8}, n3[1] = {2};
    assert_int_equal(kvb_index_scan_properties(o3, f3, c3, bad_off, n3, 1, 3), KVB_EINVAL);
}

static void test_index_scan_rejects_bad_ids(void **state)
{
    (void)state;
    int32_t cached[3] = {1, 2, 3}, dup[3] = {4, 4, 5}, neg[3] = {4, -2, 5}, off[3], cnts[1];
    assert_int_equal(ref_index_scan(cached, dup, off, cnts, 1, 1, 3), KVB_EINVAL);
    assert_error_mentions("not unique");
    assert_int_equal(ref_index_scan(cached, neg, off, cnts, 1, 1, 3), KVB_EINVAL);
    assert_error_mentions("new_ids[0][1]=-2");
    assert_int_equal(ref_index_scan(cached, dup, off, cnts, 1, 1, 4097), KVB_EINVAL);
    assert_error_mentions("M=4097 out of range [1, 4096]");
}

/* a tiny layout: 1 row, M=3 slots of c=1 token, D=8 (16-byte chunks), one token before and after
 * the sparse region, 4 host chunks */
static gather_layout tiny(void)
{
    gather_layout g = {1, 1, 3, 1, 8, 5, 1, 4, 4};
    return g;
}

static void fill_pattern(kvb_bf16 *x, int n, int base)
{
    for (int i = 0; i < n; i++) x[i] = kvb_double_to_bf16(base + i);
}

static void test_gather_copy_by_hand(void **state)
{
    (void)state;
    gather_layout g = tiny();
    kvb_bf16 vh[4 * 8], buf[5 * 8], before[5 * 8];
    fill_pattern(vh, 32, 1000);
    fill_pattern(buf, 40, 0);
    memcpy(before, buf, sizeof buf);
    int32_t offsets[3] = {2, 3, 1}, cnts[1] = {1}; /* slot 0 <- old slot 2; slots 1, 2 <- host 3, 1 */
    assert_int_equal(ref_gather_copy(vh, buf, offsets, cnts, &g), KVB_OK);
    assert_memory_equal(buf + 0, before + 0, 16);         /* token 0: before the sparse region */
    assert_memory_equal(buf + 8, before + 3 * 8, 16);     /* slot 0 = old slot 2 (token 3) */
    assert_memory_equal(buf + 16, vh + 3 * 8, 16);        /* slot 1 = host chunk 3 */
    assert_memory_equal(buf + 24, vh + 1 * 8, 16);        /* slot 2 = host chunk 1 */
    assert_memory_equal(buf + 32, before + 32, 16);       /* token 4: after it */
    memcpy(buf, before, sizeof buf);
    assert_int_equal(ref_gather_copy_d2d(buf, offsets, cnts, &g), KVB_OK);
    assert_memory_equal(buf + 8, before + 24, 16);
    assert_memory_equal(buf + 16, before + 16, 32); /* miss slots and the rest untouched */
    memcpy(buf, before, sizeof buf);
    int32_t ids[3] = {0, 2, 3};
    assert_int_equal(ref_gather_copy_all(vh, buf, ids, &g), KVB_OK);
    assert_memory_equal(buf + 8, vh, 16);
    assert_memory_equal(buf + 16, vh + 16, 16);
    assert_memory_equal(buf + 24, vh + 24, 16);
}

/* The kernels rely on this: with hits sorted by old slot (offsets[i] >= i), moving hits in place in
 * ascending order reads every source before it is overwritten, so it equals the "Vbuf_before" semantics of
 * kernels/gather_copy/NOTES.md. Checked here on many random steps. */
static void test_in_place_ascending_equals_spec(void **state)
{
    (void)state;
    gather_layout g = {2, 2, 64, 2, 8, 64 * 2 + 8, 4, 1000, 1000};
    int rows = g.B * g.Hkv;
    size_t nbuf = (size_t)rows * g.NB * g.D;
    kvb_bf16 *vh = malloc(2 * (size_t)rows * 1000 * 16), *a = malloc(2 * nbuf), *b = malloc(2 * nbuf);
    kvb_fill_bf16_normal(vh, (int64_t)rows * 1000 * 16, 3, 1, 0, 0, 1);
    int32_t old[256], fresh[256], off[256], cnts[4];
    for (int trial = 0; trial < 50; trial++) {
        kvb_make_step_ids(trial, rows, g.M, 1000, g.M - trial % 5, (trial * 7) % (g.M - trial % 5 + 1), old, fresh);
        assert_int_equal(ref_index_scan(old, fresh, off, cnts, g.B, g.Hkv, g.M), KVB_OK);
        kvb_fill_bf16_normal(a, (int64_t)nbuf, trial, 2, 0, 0, 1);
        memcpy(b, a, 2 * nbuf);
        assert_int_equal(ref_gather_copy(vh, a, off, cnts, &g), KVB_OK);
        size_t chunk = 2 * (size_t)g.c * g.D;
        for (int r = 0; r < rows; r++) { /* in place, ascending, no copy of the old contents */
            kvb_bf16 *row = b + ((size_t)r * g.NB + g.sparse_start) * g.D;
            for (int i = 0; i < g.M; i++) {
                const void *src = i < cnts[r] ? (const void *)(row + (size_t)off[r * g.M + i] * g.c * g.D)
                                              : (const void *)(vh + ((size_t)r * 1000 + off[r * g.M + i]) * g.c * g.D);
                memmove(row + (size_t)i * g.c * g.D, src, chunk);
            }
        }
        assert_memory_equal(a, b, 2 * nbuf);
    }
    free(vh), free(a), free(b);
}

static void test_gather_rejects_bad_input(void **state)
{
    (void)state;
    gather_layout g = tiny();
    kvb_bf16 vh[32] = {0}, buf[40] = {0};
    int32_t cnts[1] = {1};
    int32_t bad_hit[3] = {3, 0, 1}; /* old slot 3 of M=3 */
    assert_int_equal(ref_gather_copy(vh, buf, bad_hit, cnts, &g), KVB_EINVAL);
    assert_error_mentions("offsets[0][0]=3 out of range [0, 3)", "hit");
    int32_t bad_miss[3] = {0, 4, 1}; /* host chunk 4 of 4 */
    assert_int_equal(ref_gather_copy(vh, buf, bad_miss, cnts, &g), KVB_EINVAL);
    assert_error_mentions("offsets[0][1]=4 out of range [0, 4)", "host chunk id");
    int32_t ids[3] = {0, 1, 9};
    assert_int_equal(ref_gather_copy_all(vh, buf, ids, &g), KVB_EINVAL);
    assert_error_mentions("ids[0][2]=9 out of range [0, host_chunks=4)");
    int32_t too_many[1] = {4};
    int32_t ok_off[3] = {0, 1, 2};
    assert_int_equal(ref_gather_copy(vh, buf, ok_off, too_many, &g), KVB_EINVAL);
    assert_error_mentions("cnts[0]=4 out of range [0, M=3]");
    gather_layout odd = g;
    odd.D = 4; /* 8-byte chunks */
    assert_int_equal(ref_gather_copy(vh, buf, ok_off, cnts, &odd), KVB_EINVAL);
    assert_error_mentions("chunk bytes", "multiple of 16");
    gather_layout small = g;
    small.NB = 3;
    assert_int_equal(ref_gather_copy_d2d(buf, ok_off, cnts, &small), KVB_EINVAL);
    assert_error_mentions("NB=3 out of range [sparse_start + M*c = 4");
}

static void test_packed_load_by_hand(void **state)
{
    (void)state;
    packed_layout p = {2, 2, 5, 2, 1, 8}; /* rows of 2*1*8 = 16 bf16 */
    kvb_bf16 h0[2 * 5 * 16], h1[2 * 5 * 16], g0[2 * 2 * 16], g1[2 * 2 * 16];
    fill_pattern(h0, 160, 0);
    fill_pattern(h1, 160, 500);
    const kvb_bf16 *src[2] = {h0, h1};
    kvb_bf16 *dst[2] = {g0, g1};
    int32_t idx[4] = {1, 4, 0, 3}; /* batch 0 takes rows 1, 4; batch 1 rows 0, 3 */
    assert_int_equal(ref_packed_load(src, dst, idx, &p), KVB_OK);
    assert_memory_equal(g0 + 0, h0 + 1 * 16, 32);
    assert_memory_equal(g0 + 16, h0 + 4 * 16, 32);
    assert_memory_equal(g0 + 32, h0 + (5 + 0) * 16, 32);
    assert_memory_equal(g1 + 48, h1 + (5 + 3) * 16, 32);
    int32_t bad[4] = {1, 5, 0, 3};
    assert_int_equal(ref_packed_load(src, dst, bad, &p), KVB_EINVAL);
    assert_error_mentions("idx[0][1]=5 out of range [0, T=5)");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_index_scan_by_hand),
        cmocka_unit_test(test_index_scan_first_step_and_full_hit),
        cmocka_unit_test(test_index_scan_properties_over_shapes),
        cmocka_unit_test(test_properties_checker_catches_violations),
        cmocka_unit_test(test_index_scan_rejects_bad_ids),
        cmocka_unit_test(test_gather_copy_by_hand),
        cmocka_unit_test(test_in_place_ascending_equals_spec),
        cmocka_unit_test(test_gather_rejects_bad_input),
        cmocka_unit_test(test_packed_load_by_hand),
    };
    return cmocka_run_group_tests_name("reference gather_copy", tests, NULL, NULL);
}
