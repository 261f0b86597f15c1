/* test_compare.c: the comparison rules (exact, float with tolerances, tie-tolerant index sets). */
#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include "harness/core/compare.h"
#include "tests/testlib.h"

static void test_exact(void **state)
{
    (void)state;
    int32_t ref[6] = {1, 2, 3, 4, 5, 6}, out[6] = {1, 2, 3, 4, 5, 6};
    kvb_cmp_result r;
    kvb_compare_exact(out, ref, KVB_I32, 6, 6, NULL, &r);
    assert_true(r.pass);
    assert_int_equal(r.n_checked, 6);
    out[4] = -1; /* the integer poison pattern 0xFFFFFFFF */
    kvb_compare_exact(out, ref, KVB_I32, 6, 6, NULL, &r);
    assert_false(r.pass);
    assert_int_equal(r.n_bad, 1);
    assert_int_equal(r.first[0].index, 4);
    assert_true(r.first[0].out == -1 && r.first[0].ref == 5);
    /* bf16: an unwritten (poisoned, NaN) element fails and counts as non-finite */
    kvb_bf16 rb[3] = {0x3F80, 0x4000, 0x4040}, ob[3] = {0x3F80, 0xFFFF, 0x4040};
    kvb_compare_exact(ob, rb, KVB_BF16, 3, 3, NULL, &r);
    assert_false(r.pass);
    assert_int_equal(r.n_nonfinite, 1);
    /* a mask restricts the comparison to sampled slices: slice 1 (elements 3..5) is skipped */
    int32_t o2[6] = {1, 2, 3, 0, 0, 0};
    uint8_t mask[2] = {1, 0};
    kvb_compare_exact(o2, ref, KVB_I32, 6, 3, mask, &r);
    assert_true(r.pass);
    assert_int_equal(r.n_checked, 3);
}

/* Packed codes: a skipped slice's word of all ones is the poison to kvb_compare_exact, and may be a
 * true result (sixteen 2-bit codes of 3): kvb_compare_exact_any_bits counts it, unjudged; the sampled
 * slice is still compared bit for bit. */
static void test_exact_any_bits(void **state)
{
    (void)state;
    uint32_t ref[6] = {1, 0xFFFFFFFFu, 3, 4, 5, 6}, out[6] = {1, 0xFFFFFFFFu, 3, 0xFFFFFFFFu, 0xFFFFFFFFu, 0};
    uint8_t mask[2] = {1, 0};
    kvb_cmp_result r;
    kvb_compare_exact(out, ref, KVB_U32, 6, 3, mask, &r);
    assert_false(r.pass);
    assert_int_equal(r.n_bad, 2);
    kvb_compare_exact_any_bits(out, ref, KVB_U32, 6, 3, mask, &r);
    assert_true(r.pass);
    assert_int_equal(r.n_checked, 3), assert_int_equal(r.n_screened, 0), assert_int_equal(r.n_unscreened, 3);
    out[2] = 7;
    kvb_compare_exact_any_bits(out, ref, KVB_U32, 6, 3, mask, &r);
    assert_false(r.pass);
    assert_int_equal(r.n_bad, 1);
}

/* Long tensors go block by block (equal blocks by memcmp): the counts must be those of the element walk,
 * across block edges, with sampled and skipped slices that straddle blocks, and with non-finite refs. */
static void test_exact_long_blocks(void **state)
{
    (void)state;
    enum { N = 3 * 4096 + 77, SLICE = 1000 };
    static uint16_t ref[N], out[N];
    for (int i = 0; i < N; i++) ref[i] = out[i] = kvb_float_to_bf16((float)(i % 97) - 48.f);
    ref[10] = out[10] = 0x7FC0;   /* a NaN in both: the reference's, counted once, not a failure */
    ref[9000] = out[9000] = 0x7F80; /* +Inf in both */
    kvb_cmp_result r;
    kvb_compare_exact(out, ref, KVB_BF16, N, N, NULL, &r);
    assert_true(r.pass);
    assert_int_equal(r.n_checked, N);
    assert_int_equal(r.n_ref_nonfinite, 2);
    assert_int_equal(r.n_nonfinite, 0);
    out[4096] ^= 1, out[N - 1] ^= 1; /* the first element of the second block, the last of the tail */
    kvb_compare_exact(out, ref, KVB_BF16, N, N, NULL, &r);
    assert_false(r.pass);
    assert_int_equal(r.n_bad, 2);
    assert_int_equal(r.first[0].index, 4096);
    assert_int_equal(r.first[1].index, N - 1);
    /* a sample of slices (every other one): the mismatch in a skipped slice is not counted, its poison is */
    uint8_t mask[N / SLICE + 1];
    for (int k = 0; k <= N / SLICE; k++) mask[k] = k % 2 == 0;
    out[4096] = ref[4096];              /* slice 4: sampled */
    out[1500] ^= 1;                     /* slice 1: skipped, a finite value: screened, passes */
    out[3500] = 0x7FC0;                 /* slice 3: skipped, NaN: fails the screen */
    kvb_compare_exact(out, ref, KVB_BF16, N, SLICE, mask, &r);
    assert_false(r.pass);
    /* the screened NaN, the +Inf at 9000 (slice 9, skipped: a non-finite output fails the screen) and the
     * tail's mismatch (slice 12: sampled) */
    assert_int_equal(r.n_bad, 3);
    int64_t sampled = 0;
    for (int i = 0; i < N; i++) sampled += mask[i / SLICE];
    assert_int_equal(r.n_checked, sampled);
    assert_int_equal(r.n_screened, N - sampled);
    /* verdict only: the first failure settles it */
    kvb_compare_verdict_only(1);
    kvb_compare_exact(out, ref, KVB_BF16, N, N, NULL, &r);
    kvb_compare_verdict_only(0);
    assert_false(r.pass);
    assert_true(r.n_bad >= 1);
}

/* Long enough for the parallel blocks and more than one group of them: clean blocks summed apart, the others
 * walked in order; the same sums whatever the number of threads. */
static void test_float_long_blocks(void **state)
{
    (void)state;
    const int64_t N = 4096 * 1024 + 4096 * 3 + 77, SLICE = 5000;
    float *ref = malloc(sizeof(float) * (size_t)N), *out = malloc(sizeof(float) * (size_t)N);
    assert_non_null(ref);
    assert_non_null(out);
    double err2 = 0, ref2 = 0;
    for (int64_t i = 0; i < N; i++) {
        ref[i] = (float)(i % 997) - 498.f;
        out[i] = ref[i] + (i % 3 == 0 ? 1e-3f : 0.f);
        const double e = (double)out[i] - ref[i];
        err2 += e * e, ref2 += (double)ref[i] * ref[i];
    }
    const kvb_tol tol = {.atol = 1e-2, .rtol = 0, .l2 = 1e-3};
    kvb_cmp_result r, one;
    kvb_compare_float(out, ref, KVB_FP32, N, tol, N, NULL, &r);
    assert_true(r.pass);
    assert_int_equal(r.n_checked, N);
    assert_true(fabs(r.rel_l2 - sqrt(err2 / ref2)) <= 1e-12 * sqrt(err2 / ref2));
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    kvb_compare_float(out, ref, KVB_FP32, N, tol, N, NULL, &one);
    omp_set_num_threads(threads);
    assert_true(one.rel_l2 == r.rel_l2 && one.max_abs == r.max_abs && one.tol_used == r.tol_used);
    /* mismatches in the first block, a middle one and the second group's tail: noted first to last */
    out[5] += 1, out[4096 * 20 + 3] -= 1, out[N - 1] += 1;
    kvb_compare_float(out, ref, KVB_FP32, N, tol, N, NULL, &r);
    assert_false(r.pass);
    assert_int_equal(r.n_bad, 3);
    assert_int_equal(r.first[0].index, 5);
    assert_int_equal(r.first[1].index, 4096 * 20 + 3);
    assert_int_equal(r.first[2].index, N - 1);
    assert_int_equal(r.n_checked, N);
    /* a sample of slices (every other one): a skipped slice's mismatch is screened, its NaN fails */
    const int64_t n_slices = (N + SLICE - 1) / SLICE;
    uint8_t *mask = malloc((size_t)n_slices);
    assert_non_null(mask);
    for (int64_t k = 0; k < n_slices; k++) mask[k] = k % 2 == 0;
    out[5] = ref[5], out[4096 * 20 + 3] = ref[4096 * 20 + 3], out[N - 1] = ref[N - 1];
    out[SLICE + 7] += 1;  /* slice 1: skipped, finite: passes the screen */
    out[3 * SLICE] = NAN; /* slice 3: skipped, NaN: fails it */
    kvb_compare_float(out, ref, KVB_FP32, N, tol, SLICE, mask, &r);
    assert_false(r.pass);
    assert_int_equal(r.n_bad, 1);
    assert_int_equal(r.first[0].index, 3 * SLICE);
    int64_t sampled = 0;
    for (int64_t i = 0; i < N; i++) sampled += mask[i / SLICE];
    assert_int_equal(r.n_checked, sampled);
    assert_int_equal(r.n_screened, N - sampled);
    /* verdict only: the first failure settles it */
    out[7] += 1;
    kvb_compare_verdict_only(1);
    kvb_compare_float(out, ref, KVB_FP32, N, tol, N, NULL, &r);
    kvb_compare_verdict_only(0);
    assert_false(r.pass);
    assert_int_equal(r.n_bad, 1);
    assert_int_equal(r.first[0].index, 7);
    free(mask), free(out), free(ref);
}

static void test_float_tolerances(void **state)
{
    (void)state;
    float ref[4] = {1.0f, -2.0f, 100.0f, 0.0f}, out[4] = {1.005f, -2.0f, 101.0f, 0.0001f};
    kvb_tol tol = {0.01, 0.02, 0.1};
    kvb_cmp_result r;
    kvb_compare_float(out, ref, KVB_FP32, 4, tol, 4, NULL, &r);
    assert_true(r.pass); /* 1.0 vs 1.005: 0.005 <= 0.01 + 0.02; 100 vs 101: 1 <= 0.01 + 2 */
    assert_true(fabs(r.max_abs - 1.0) < 1e-6);
    assert_true(fabs(r.tol_used - 1.0 / 2.01) < 1e-6); /* largest fraction of tolerance: at 100 */
    out[1] = -2.1f;                                      /* 0.1 > 0.01 + 0.04 */
    kvb_compare_float(out, ref, KVB_FP32, 4, tol, 4, NULL, &r);
    assert_false(r.pass);
    assert_int_equal(r.first[0].index, 1);
    assert_true(r.tol_used > 1.0);
    /* elementwise fine but relative L2 above its bound */
    out[1] = -2.0f;
    kvb_tol tight_l2 = {0.01, 0.02, 1e-4};
    kvb_compare_float(out, ref, KVB_FP32, 4, tight_l2, 4, NULL, &r);
    assert_int_equal(r.n_bad, 0);
    assert_false(r.pass);
    assert_true(r.rel_l2 > 1e-4);
}

static void test_float_nonfinite(void **state)
{
    (void)state;
    float ref[3] = {1.0f, INFINITY, NAN}, out[3] = {NAN, INFINITY, NAN};
    kvb_tol tol = {1, 1, 1};
    kvb_cmp_result r;
    kvb_compare_float(out, ref, KVB_FP32, 3, tol, 3, NULL, &r);
    assert_false(r.pass); /* NaN where the reference is finite fails, whatever the tolerance */
    assert_int_equal(r.n_nonfinite, 1);
    assert_int_equal(r.n_bad, 1);
    out[0] = 1.0f;
    kvb_compare_float(out, ref, KVB_FP32, 3, tol, 3, NULL, &r);
    assert_true(r.pass); /* matching inf and NaN where the reference has them */
    assert_int_equal(r.n_ref_nonfinite, 2); /* and counted, for the verdict line and the JSON */
    out[1] = -INFINITY;
    kvb_compare_float(out, ref, KVB_FP32, 3, tol, 3, NULL, &r);
    assert_false(r.pass);
}

static void test_indexset_tie_tolerant(void **state)
{
    (void)state;
    /* one row, n = 6, k = 3; scores with a tie at the k-th place (indices 2 and 4) */
    float scores[6] = {0.9f, 0.1f, 0.5f, 0.8f, 0.5f, 0.2f};
    int32_t ref[3] = {0, 2, 3};
    int32_t same[3] = {0, 2, 3}, tie[3] = {0, 3, 4}, wrong[3] = {0, 1, 3}, unsorted[3] = {3, 0, 2}, dup[3] = {0, 3, 3};
    kvb_cmp_result r;
    kvb_compare_indexset(same, ref, scores, KVB_FP32, 1, 6, 3, 1e-6, &r);
    assert_true(r.pass);
    kvb_compare_indexset(tie, ref, scores, KVB_FP32, 1, 6, 3, 1e-6, &r);
    assert_true(r.pass); /* the other side of the tie is as good */
    kvb_compare_indexset(wrong, ref, scores, KVB_FP32, 1, 6, 3, 1e-6, &r);
    assert_false(r.pass); /* 0.1 is below the k-th score 0.5 */
    kvb_compare_indexset(wrong, ref, scores, KVB_FP32, 1, 6, 3, 0.5, &r);
    assert_true(r.pass); /* ... unless the tolerance covers the gap and the sums */
    kvb_compare_indexset(unsorted, ref, scores, KVB_FP32, 1, 6, 3, 1, &r);
    assert_false(r.pass); /* lists are ascending */
    kvb_compare_indexset(dup, ref, scores, KVB_FP32, 1, 6, 3, 1, &r);
    assert_false(r.pass);
    /* two rows: the second wrong */
    float s2[12] = {0.9f, 0.1f, 0.5f, 0.8f, 0.5f, 0.2f, 1, 2, 3, 4, 5, 6};
    int32_t ref2[6] = {0, 2, 3, 3, 4, 5}, out2[6] = {0, 2, 3, 0, 4, 5};
    kvb_compare_indexset(out2, ref2, s2, KVB_FP32, 2, 6, 3, 1e-3, &r);
    assert_false(r.pass);
    assert_int_equal(r.first[0].index, 1);
}

/* A bound relative to a per-element magnitude (kernels/int2/NOTES.md: 1e-3 * sum |a_k| (|c_k s_k| + |z_k|) + 1e-5): an error
 * that |ref| would forbid passes when the magnitude allows it, and the reverse. */
static void test_float_magnitude(void **state)
{
    (void)state;
    kvb_cmp_result r;
    float ref[3] = {0.0f, 1.0f, 100.0f}, out[3] = {0.009f, 1.0f, 100.0f};
    double mag[3] = {10.0, 1.0, 100.0};
    kvb_tol tol = {1e-5, 1e-3, 1.0};
    kvb_compare_float_mag(out, ref, KVB_FP32, 3, tol, mag, 3, NULL, &r); /* 0.009 <= 1e-5 + 1e-3 * 10 */
    assert_true(r.pass);
    kvb_compare_float(out, ref, KVB_FP32, 3, tol, 3, NULL, &r); /* against |ref| = 0 it fails */
    assert_false(r.pass);
    out[0] = 0.011f; /* > 1e-5 + 1e-2 */
    kvb_compare_float_mag(out, ref, KVB_FP32, 3, tol, mag, 3, NULL, &r);
    assert_false(r.pass);
    assert_int_equal(r.first[0].index, 0);
    assert_true(r.tol_used > 1.0);
}

/* A sampled reference: rows of the unmarked slices are only screened (ascending, in range), so a
 * wrong but well-formed row there passes and a poisoned one fails; marked slices are compared. */
static void test_indexset_sampled(void **state)
{
    (void)state;
    float s[12] = {0.9f, 0.1f, 0.5f, 0.8f, 0.5f, 0.2f, 1, 2, 3, 4, 5, 6};
    int32_t ref[6] = {0, 2, 3, 3, 4, 5}, other[6] = {0, 2, 3, 0, 1, 2}, poisoned[6] = {0, 2, 3, -1, -1, -1};
    const uint8_t second_skipped[2] = {1, 0}, first_skipped[2] = {0, 1};
    kvb_cmp_result r;
    kvb_compare_indexset_sampled(other, ref, s, KVB_FP32, 2, 6, 3, 1e-3, 1, second_skipped, &r);
    assert_true(r.pass);
    assert_int_equal(r.n_checked, 3), assert_int_equal(r.n_screened, 3);
    kvb_compare_indexset_sampled(poisoned, ref, s, KVB_FP32, 2, 6, 3, 1e-3, 1, second_skipped, &r);
    assert_false(r.pass);
    assert_int_equal(r.first[0].index, 1);
    kvb_compare_indexset_sampled(other, ref, s, KVB_FP32, 2, 6, 3, 1e-3, 1, first_skipped, &r);
    assert_false(r.pass); /* the second row is compared: {0, 1, 2} is not a top-3 of 1..6 */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_float_magnitude),
        cmocka_unit_test(test_exact),
        cmocka_unit_test(test_exact_long_blocks),
        cmocka_unit_test(test_exact_any_bits),
        cmocka_unit_test(test_float_tolerances),
        cmocka_unit_test(test_float_long_blocks),
        cmocka_unit_test(test_float_nonfinite),
        cmocka_unit_test(test_indexset_tie_tolerant),
        cmocka_unit_test(test_indexset_sampled),
    };
    return cmocka_run_group_tests_name("compare", tests, NULL, NULL);
}
