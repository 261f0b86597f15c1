/* test_ref_select.c: the reference top-k (reference/select.c) against a brute force written from the
 * definition in kernels/select/NOTES.md (index i is selected when fewer than k indices beat it: a larger
 * score, or an equal score at a lower index), on random, tie-heavy and special inputs; the order key;
 * rejections. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "reference/kvb.h"
#include "reference/select.h"
#include "tests/testlib.h"

/* i beats j: a larger key, or the same key at a lower index */
static int beats(const float *x, int i, int j)
{
    uint32_t a = topk_order_key(x[i]), b = topk_order_key(x[j]);
    return a > b || (a == b && i < j);
}

static void brute_force(const float *x, int n, int k, int32_t *out)
{
    int m = 0;
    for (int i = 0; i < n; i++) {
        int better = 0;
        for (int j = 0; j < n && better < k; j++) better += j != i && beats(x, j, i);
        if (better < k) out[m++] = i;
    }
    assert_int_equal(m, k);
}

static void check_against_brute_force(const float *x, int rows, int n, int k)
{
    int32_t *got = malloc(sizeof(int32_t) * (size_t)rows * k), *want = malloc(sizeof(int32_t) * (size_t)k);
    assert_int_equal(ref_topk(x, rows, n, n, k, got, k), KVB_OK);
    for (int r = 0; r < rows; r++) {
        brute_force(x + (size_t)r * n, n, k, want);
        for (int j = 0; j < k; j++) assert_int_equal(got[(size_t)r * k + j], want[j]);
        for (int j = 1; j < k; j++) assert_true(got[(size_t)r * k + j - 1] < got[(size_t)r * k + j]);
    }
    free(got), free(want);
}

static float uniform(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((*s >> 40) * (1.0 / 16777216.0)) - 0.5f;
}

static void test_random_rows(void **state)
{
    (void)state;
    uint64_t seed = 7;
    float x[4 * 300];
    for (int i = 0; i < 4 * 300; i++) x[i] = uniform(&seed);
    const int ks[] = {1, 2, 17, 150, 299, 300};
    for (size_t t = 0; t < sizeof ks / sizeof ks[0]; t++) check_against_brute_force(x, 4, 300, ks[t]);
}

/* Rows already in order, either way, and a row of one value: the selection's partitions at their
 * most uneven. */
static void test_sorted_rows(void **state)
{
    (void)state;
    float x[3 * 1000];
    for (int i = 0; i < 1000; i++) x[i] = (float)i, x[1000 + i] = (float)(1000 - i), x[2000 + i] = 2.5f;
    const int ks[] = {1, 3, 500, 999, 1000};
    for (size_t t = 0; t < sizeof ks / sizeof ks[0]; t++) check_against_brute_force(x, 3, 1000, ks[t]);
}

static void test_ties_go_to_the_lower_index(void **state)
{
    (void)state;
    uint64_t seed = 11;
    float x[3 * 257];
    for (int i = 0; i < 3 * 257; i++) x[i] = floorf(4.f * uniform(&seed)) / 4.f; /* 4 distinct values */
    for (int k = 1; k <= 257; k += 32) check_against_brute_force(x, 3, 257, k);
    const float s[7] = {5, 1, 5, 3, 5, 0, 3};
    int32_t idx[4];
    assert_int_equal(ref_topk(s, 1, 7, 7, 4, idx, 4), KVB_OK);
    assert_int_equal(idx[0], 0), assert_int_equal(idx[1], 2), assert_int_equal(idx[2], 3), assert_int_equal(idx[3], 4);
    float eq[100];
    for (int i = 0; i < 100; i++) eq[i] = 0.75f;
    int32_t first[10];
    assert_int_equal(ref_topk(eq, 1, 100, 100, 10, first, 10), KVB_OK);
    for (int i = 0; i < 10; i++) assert_int_equal(first[i], i);
}

/* -0 equals +0; +inf above every finite value; a NaN ranks by its bits (+NaN above +inf). */
static void test_order_key(void **state)
{
    (void)state;
    assert_int_equal(topk_order_key(-0.0f), topk_order_key(0.0f));
    assert_true(topk_order_key(1.0f) > topk_order_key(0.5f));
    assert_true(topk_order_key(-0.5f) > topk_order_key(-1.0f));
    assert_true(topk_order_key(INFINITY) > topk_order_key(3.4e38f));
    assert_true(topk_order_key(-INFINITY) < topk_order_key(-3.4e38f));
    assert_true(topk_order_key(NAN) > topk_order_key(INFINITY));
    assert_true(topk_order_key(-NAN) < topk_order_key(-INFINITY));
    const float s[6] = {-0.0f, 0.0f, -1.0f, INFINITY, -INFINITY, 2.0f};
    int32_t idx[3];
    assert_int_equal(ref_topk(s, 1, 6, 6, 3, idx, 3), KVB_OK);
    assert_int_equal(idx[0], 0), assert_int_equal(idx[1], 3), assert_int_equal(idx[2], 5);
}

static void test_strides_and_edges(void **state)
{
    (void)state;
    const float s[2][5] = {{1, 2, 3, 9, 9}, {3, 2, 1, 9, 9}}; /* ld 5, n 3: the 9s are outside the rows */
    int32_t idx[2][4] = {{-1, -1, -1, -1}, {-1, -1, -1, -1}};
    assert_int_equal(ref_topk(&s[0][0], 2, 5, 3, 2, &idx[0][0], 4), KVB_OK);
    assert_int_equal(idx[0][0], 1), assert_int_equal(idx[0][1], 2), assert_int_equal(idx[0][2], -1);
    assert_int_equal(idx[1][0], 0), assert_int_equal(idx[1][1], 1);
    assert_int_equal(ref_topk(&s[0][0], 1, 5, 0, 0, &idx[0][0], 0), KVB_OK); /* n = k = 0 */
}

static void test_rejections(void **state)
{
    (void)state;
    float s[8] = {0};
    int32_t idx[8];
    assert_int_equal(ref_topk(s, 1, 7, 7, 8, idx, 8), KVB_EINVAL);
    assert_error_mentions("k=8 out of range [0, n = 7]");
    assert_int_equal(ref_topk(s, 0, 7, 7, 1, idx, 1), KVB_EINVAL);
    assert_error_mentions("rows=0 out of range");
    assert_int_equal(ref_topk(s, 1, 2097153, 2097153, 1, idx, 1), KVB_EINVAL);
    assert_error_mentions("n=2097153 out of range [0, 2097152]");
    assert_int_equal(ref_topk(s, 1, 6, 7, 1, idx, 1), KVB_EINVAL);
    assert_error_mentions("ld=6 out of range");
    assert_int_equal(ref_topk(s, 1, 7, 7, 3, idx, 2), KVB_EINVAL);
    assert_error_mentions("ldo=2 out of range");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_rows),        cmocka_unit_test(test_ties_go_to_the_lower_index),
        cmocka_unit_test(test_order_key),          cmocka_unit_test(test_strides_and_edges),
        cmocka_unit_test(test_rejections),         cmocka_unit_test(test_sorted_rows),
    };
    return cmocka_run_group_tests_name("reference select", tests, NULL, NULL);
}
