/* test_ref_landmark_score.c: the reference landmark scoring (reference/landmark_score.c) on hand-made
 * inputs whose answer follows by hand from the formulas of kernels/landmark_score/NOTES.md (softmax per
 * query head deciding against the raw dot products, an exact tie between two heads of a group, M = 1,
 * M = Lm), on seeded inputs against those formulas written out here once more (m to 1e-12 relative, and
 * the selection a top-M of m), on a slice mask, and its refusals. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "reference/kvb.h"
#include "reference/landmark_score.h"
#include "tests/testlib.h"

static kvb_bf16 bf(double x) { return kvb_double_to_bf16(x); }

/* Two query heads (G = 2) over D = 2: head 0 reads dimension 0 of each landmark, head 1 dimension 1,
 * so a[l] and b[l] are the raw dot products of the two heads (times sqrt(2)). */
static void two_head_inputs(const double *a, const double *b, int Lm, kvb_bf16 *q, kvb_bf16 *lm)
{
    q[0] = bf(1), q[1] = bf(0), q[2] = bf(0), q[3] = bf(1);
    for (int l = 0; l < Lm; l++) lm[2 * l] = bf(a[l]), lm[2 * l + 1] = bf(b[l]);
}

/* Head 0 spreads its mass over four nearly equal large logits (each s near 1/4); head 1 has one
 * moderate logit far above its others (s near 0.87). The largest raw dot product is head 0's at
 * landmark 2; the largest softmax score is head 1's at landmark 3, which the formulas select. */
static void test_softmax_per_head_decides(void **state)
{
    (void)state;
    const double a[4] = {14.0, 14.125, 14.25, 13.875}, b[4] = {0, 0, 0, 4.25}; /* exact in bf16 */
    kvb_bf16 q[4], lm[8];
    two_head_inputs(a, b, 4, q, lm);
    const int32_t idx[4] = {2, 5, 6, 11};
    lms_shape s = {1, 2, 1, 2, 4, 1};
    int32_t chunks[1];
    float m[4];
    assert_int_equal(ref_landmark_score(q, lm, idx, &s, 12, NULL, chunks, m), KVB_OK);
    int raw_best = 0; /* what a max over raw dot products would pick */
    for (int l = 1; l < 4; l++)
        if (fmax(a[l], b[l]) > fmax(a[raw_best], b[raw_best])) raw_best = l;
    assert_int_equal(raw_best, 2);
    assert_int_equal(chunks[0], idx[3]);
    /* head 1 at landmark 3: e^(4.25/sqrt 2) / (3 + e^(4.25/sqrt 2)) */
    const double e = exp(4.25 / sqrt(2.0));
    assert_true(fabs(m[3] - e / (3 + e)) <= 1e-7 * m[3]);
    /* M = 2 adds head 0's best (landmark 2); the list is ascending chunk ids */
    s.M = 2;
    int32_t two[2];
    assert_int_equal(ref_landmark_score(q, lm, idx, &s, 12, NULL, two, m), KVB_OK);
    assert_int_equal(two[0], idx[2]), assert_int_equal(two[1], idx[3]);
}

/* Landmark 0 is head 0's peak, landmark 1 head 1's, with the same two logits swapped: both softmax
 * rows have the same two terms (a sum of two terms does not depend on their order), so m[0] == m[1]
 * exactly, a tie made by two different heads of the group: the lower landmark index wins. */
static void test_tie_across_the_group(void **state)
{
    (void)state;
    const double a[2] = {3.5, 0.5}, b[2] = {0.5, 3.5};
    kvb_bf16 q[4], lm[4];
    two_head_inputs(a, b, 2, q, lm);
    const int32_t idx[2] = {7, 9};
    lms_shape s = {1, 2, 1, 2, 2, 1};
    int32_t chunks[1];
    float m[2];
    assert_int_equal(ref_landmark_score(q, lm, idx, &s, 10, NULL, chunks, m), KVB_OK);
    assert_true(m[0] == m[1]);
    assert_int_equal(chunks[0], 7);
}

/* M = Lm selects every landmark: the chunk ids are landmark_idx itself; M = 1 the best one. */
static void test_all_and_one(void **state)
{
    (void)state;
    enum { Lm = 9, D = 4 };
    kvb_bf16 q[D], lm[Lm * D];
    for (int d = 0; d < D; d++) q[d] = bf(d == 1 ? 2.0 : 0.25);
    for (int l = 0; l < Lm; l++)
        for (int d = 0; d < D; d++) lm[l * D + d] = bf(d == 1 ? (l == 6 ? 3.0 : 0.5 * (l % 4)) : -0.125 * d);
    const int32_t idx[Lm] = {0, 1, 3, 4, 8, 9, 10, 12, 20};
    lms_shape s = {1, 1, 1, D, Lm, Lm};
    int32_t chunks[Lm];
    float m[Lm];
    assert_int_equal(ref_landmark_score(q, lm, idx, &s, 21, NULL, chunks, m), KVB_OK);
    for (int l = 0; l < Lm; l++) assert_int_equal(chunks[l], idx[l]);
    double sum = 0; /* one head: m is its softmax */
    for (int l = 0; l < Lm; l++) sum += m[l];
    assert_true(fabs(sum - 1) < 1e-6);
    s.M = 1;
    assert_int_equal(ref_landmark_score(q, lm, idx, &s, 21, NULL, chunks, m), KVB_OK);
    assert_int_equal(chunks[0], 10); /* landmark 6, the largest q . k (5.84; the others at most 2.84) */
}

static double uniform(uint64_t *st)
{
    *st = *st * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(*st >> 11) * 0x1p-53 - 0.5;
}

/* Seeded inputs, B = 2, Hkv = 3, G = 3: m against the formula written out over (b, h, l), and the
 * selection: M ascending chunk ids of the row, whose m are each >= every unselected m. */
static void test_seeded_against_the_formula(void **state)
{
    (void)state;
    enum { B = 2, Hkv = 3, G = 3, Hq = Hkv * G, D = 8, Lm = 37, M = 5, n_chunks = 50 };
    uint64_t st = 3;
    kvb_bf16 *q = malloc(sizeof(kvb_bf16) * B * Hq * D), *lm = malloc(sizeof(kvb_bf16) * B * Hkv * Lm * D);
    for (int i = 0; i < B * Hq * D; i++) q[i] = bf(4 * uniform(&st));
    for (int i = 0; i < B * Hkv * Lm * D; i++) lm[i] = bf(4 * uniform(&st));
    int32_t idx[B * Hkv * Lm];
    for (int r = 0; r < B * Hkv; r++) /* chunk ids skipping 13 of 50, differently per row */
        for (int l = 0, c = 0; l < Lm; c++)
            if ((c * 7 + r) % 50 >= 13) idx[r * Lm + l++] = c;
    lms_shape s = {B, Hq, Hkv, D, Lm, M};
    int32_t chunks[B * Hkv * M];
    float m[B * Hkv * Lm];
    assert_int_equal(ref_landmark_score(q, lm, idx, &s, n_chunks, NULL, chunks, m), KVB_OK);
    for (int b = 0; b < B; b++)
        for (int hk = 0; hk < Hkv; hk++) {
            const int r = b * Hkv + hk;
            double want[Lm];
            for (int l = 0; l < Lm; l++) want[l] = 0;
            for (int h = hk * G; h < hk * G + G; h++) {
                double x[Lm], mx = -INFINITY, sum = 0;
                for (int l = 0; l < Lm; l++) {
                    x[l] = 0;
                    for (int d = 0; d < D; d++)
                        x[l] += kvb_bf16_to_double(q[(b * Hq + h) * D + d]) *
                                kvb_bf16_to_double(lm[((b * Hkv + h / G) * Lm + l) * D + d]);
                    x[l] /= sqrt((double)D);
                    mx = fmax(mx, x[l]);
                }
                for (int l = 0; l < Lm; l++) sum += exp(x[l] - mx);
                for (int l = 0; l < Lm; l++) want[l] = fmax(want[l], exp(x[l] - mx) / sum);
            }
            for (int l = 0; l < Lm; l++) assert_true(fabs(m[r * Lm + l] - want[l]) <= 1e-7 * want[l]);
            /* the selection: ascending chunk ids of this row, each selected m >= each unselected m */
            int chosen[Lm] = {0};
            for (int i = 0; i < M; i++) {
                int32_t c = chunks[r * M + i];
                if (i) assert_true(c > chunks[r * M + i - 1]);
                int l = 0;
                while (l < Lm && idx[r * Lm + l] != c) l++;
                assert_true(l < Lm);
                chosen[l] = 1;
            }
            for (int i = 0; i < Lm; i++)
                for (int j = 0; j < Lm; j++)
                    if (chosen[i] && !chosen[j]) assert_true(m[r * Lm + i] >= m[r * Lm + j]);
        }
    /* a slice mask computes the marked slices alike and leaves the others untouched */
    const uint8_t slices[B * Hkv] = {1, 0, 0, 0, 1, 1};
    int32_t c2[B * Hkv * M];
    float m2[B * Hkv * Lm];
    for (int i = 0; i < B * Hkv * M; i++) c2[i] = -7;
    for (int i = 0; i < B * Hkv * Lm; i++) m2[i] = -7.0f;
    assert_int_equal(ref_landmark_score(q, lm, idx, &s, n_chunks, slices, c2, m2), KVB_OK);
    for (int r = 0; r < B * Hkv; r++) {
        for (int i = 0; i < M; i++) assert_int_equal(c2[r * M + i], slices[r] ? chunks[r * M + i] : -7);
        for (int l = 0; l < Lm; l++) assert_true(m2[r * Lm + l] == (slices[r] ? m[r * Lm + l] : -7.0f));
    }
    free(q), free(lm);
}

static void test_rejections(void **state)
{
    (void)state;
    kvb_bf16 q[8] = {0}, lm[3 * 4] = {0};
    int32_t idx[3] = {1, 4, 6}, chunks[3];
    float m[3];
    lms_shape s = {1, 2, 1, 4, 3, 2};
    assert_int_equal(ref_landmark_score(q, lm, idx, &s, 7, NULL, chunks, m), KVB_OK);
    s.M = 0;
    assert_int_equal(ref_landmark_score(q, lm, idx, &s, 7, NULL, chunks, m), KVB_EINVAL);
    assert_error_mentions("M=0 out of range [1, 3]");
    s.M = 4;
    assert_int_equal(ref_landmark_score(q, lm, idx, &s, 7, NULL, chunks, m), KVB_EINVAL);
    assert_error_mentions("M=4 out of range [1, 3]");
    s.M = 1, s.Lm = 0;
    assert_int_equal(ref_landmark_score(q, lm, idx, &s, 7, NULL, chunks, m), KVB_EINVAL);
    assert_error_mentions("Lm=0 out of range");
    s.Lm = 3, s.Hq = 3, s.Hkv = 2;
    assert_int_equal(ref_landmark_score(q, lm, idx, &s, 7, NULL, chunks, m), KVB_EINVAL);
    assert_error_mentions("Hq=3 is not a multiple of Hkv=2");
    s.Hq = 2, s.Hkv = 1;
    assert_int_equal(ref_landmark_score(q, lm, idx, &s, 2, NULL, chunks, m), KVB_EINVAL);
    assert_error_mentions("n_chunks=2 out of range [Lm = 3");
    assert_int_equal(ref_landmark_score(q, lm, idx, &s, 6, NULL, chunks, m), KVB_EINVAL);
    assert_error_mentions("landmark_idx[0, 2]=6 out of range [0, n_chunks = 6)");
    const int32_t equal[3] = {1, 4, 4}, descending[3] = {4, 1, 6}, negative[3] = {-1, 4, 6};
    assert_int_equal(ref_landmark_score(q, lm, equal, &s, 7, NULL, chunks, m), KVB_EINVAL);
    assert_error_mentions("not strictly ascending", "[2]=4 after [1]=4");
    assert_int_equal(ref_landmark_score(q, lm, descending, &s, 7, NULL, chunks, m), KVB_EINVAL);
    assert_error_mentions("not strictly ascending", "[1]=1 after [0]=4");
    assert_int_equal(ref_landmark_score(q, lm, negative, &s, 7, NULL, chunks, m), KVB_EINVAL);
    assert_error_mentions("landmark_idx[0, 0]=-1 out of range");
    assert_int_equal(ref_landmark_score(q, NULL, idx, &s, 7, NULL, chunks, m), KVB_EINVAL);
    assert_error_mentions("NULL");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_softmax_per_head_decides), cmocka_unit_test(test_tie_across_the_group),
        cmocka_unit_test(test_all_and_one),              cmocka_unit_test(test_seeded_against_the_formula),
        cmocka_unit_test(test_rejections),
    };
    return cmocka_run_group_tests_name("reference landmark_score", tests, NULL, NULL);
}
