/* test_ref_omnikv.c: the OmniKV selector's reference (reference/omnikv.c) against hand-worked examples
 * and a brute force written from the definition in reference/omnikv.h (per query head its scores, then
 * the max over heads, then: token t is selected when fewer than k tokens beat it, a larger score or an
 * equal one at a lower index):
 *   - a hand-computed instance (scores, magnitudes and the selection);
 *   - GQA: query head h reads KV head h / G, and the max runs over all Hq heads of the sequence (G = 2
 *     and G = 7, Qwen2-7B's group);
 *   - ties go to the lower index; tokens past len[b] are never selected and score -inf;
 *   - random inputs at every G in [1, 8] and D = 64, 128 against the brute force;
 *   - every refusal names the parameter, its value and the range;
 *   - the layer roles of a 32-layer model, written out from kernels/omnikv/NOTES.md, and their counts
 *     (5, 3, 24). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reference/kvb.h"
#include "reference/omnikv.h"
#include "tests/testlib.h"

static kvb_bf16 bf(double x) { return kvb_double_to_bf16(x); }

static double uniform(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(*s >> 11) * (1.0 / 9007199254740992.0) - 0.5;
}

/* q [B, Hq, D], K [B, Hkv, L, D] zeroed */
static void alloc_inputs(const omnikv_layout *s, kvb_bf16 **q, kvb_bf16 **K)
{
    *q = calloc((size_t)s->B * s->Hq * s->D, sizeof(kvb_bf16));
    *K = calloc((size_t)s->B * s->Hkv * s->L * s->D, sizeof(kvb_bf16));
    assert_non_null(*q);
    assert_non_null(*K);
}

static kvb_bf16 *qat(kvb_bf16 *q, const omnikv_layout *s, int b, int h) { return q + ((size_t)b * s->Hq + h) * s->D; }
static kvb_bf16 *kat(kvb_bf16 *K, const omnikv_layout *s, int b, int kvh, int t)
{
    return K + (((size_t)b * s->Hkv + kvh) * s->L + t) * s->D;
}

static void test_hand_example(void **state)
{
    (void)state;
    /* B=1, Hq=2, Hkv=1 (G=2), D=64, L=4: q0 = e0, q1 = 2 e1; 1/sqrt(64) = 1/8 */
    omnikv_layout s = {1, 2, 1, 64, 4};
    kvb_bf16 *q, *K;
    alloc_inputs(&s, &q, &K);
    qat(q, &s, 0, 0)[0] = bf(1), qat(q, &s, 0, 1)[1] = bf(2);
    const double k01[4][2] = {{1, 0}, {0, 1}, {-1, -1}, {3, 0.5}};
    for (int t = 0; t < 4; t++) kat(K, &s, 0, 0, t)[0] = bf(k01[t][0]), kat(K, &s, 0, 0, t)[1] = bf(k01[t][1]);
    /* head dots: t0 (1, 0) t1 (0, 2) t2 (-1, -2) t3 (3, 1): max / 8 = 0.125, 0.25, -0.125, 0.375 */
    const float want[4] = {0.125f, 0.25f, -0.125f, 0.375f};
    /* magnitudes: max_h sum |q k| / 8 = the same absolute dots: 1/8, 2/8, 2/8, 3/8 */
    const double want_mag[4] = {0.125, 0.25, 0.25, 0.375};
    float sc[4];
    double mag[4];
    int32_t idx[2], len[1] = {4};
    assert_int_equal(ref_omnikv_select(q, K, len, &s, 2, sc, idx, mag, NULL), KVB_OK);
    for (int t = 0; t < 4; t++) {
        assert_true(sc[t] == want[t]);
        assert_true(mag[t] == want_mag[t]);
    }
    assert_int_equal(idx[0], 1); /* 0.25 */
    assert_int_equal(idx[1], 3); /* 0.375 */
    /* k = len: every token, ascending */
    int32_t all[4];
    assert_int_equal(ref_omnikv_select(q, K, len, &s, 4, sc, all, NULL, NULL), KVB_OK);
    for (int t = 0; t < 4; t++) assert_int_equal(all[t], t);
    free(q), free(K);
}

static void test_gqa_head_mapping(void **state)
{
    (void)state;
    /* Hq=4, Hkv=2 (G=2), D=128, L=3. Only query head 3 is nonzero (channel 5 = 1); it reads KV head 1.
     * KV head 0 holds a large value at token 0 (read by heads 0, 1 only: their dots are 0), KV head 1
     * holds 4 at token 2 and -4 at token 1. Scores: t0 max(0, 0, 0, 0) = 0, t1 max(0, 0, 0, -4/sqrt(128)) = 0,
     * t2 = 4/sqrt(128). */
    omnikv_layout s = {1, 4, 2, 128, 3};
    kvb_bf16 *q, *K;
    alloc_inputs(&s, &q, &K);
    qat(q, &s, 0, 3)[5] = bf(1);
    kat(K, &s, 0, 0, 0)[5] = bf(100);
    kat(K, &s, 0, 1, 1)[5] = bf(-4);
    kat(K, &s, 0, 1, 2)[5] = bf(4);
    float sc[3];
    int32_t idx[1], len[1] = {3};
    assert_int_equal(ref_omnikv_select(q, K, len, &s, 1, sc, idx, NULL, NULL), KVB_OK);
    assert_true(sc[0] == 0.0f);
    assert_true(sc[1] == 0.0f);
    assert_true(sc[2] == (float)(4.0 / sqrt(128.0)));
    assert_int_equal(idx[0], 2);
    free(q), free(K);
}

static void test_gqa_head_mapping_group_of_seven(void **state)
{
    (void)state;
    /* Hq=14, Hkv=2 (G=7), D=64, L=4: query heads 0..6 read KV head 0, 7..13 KV head 1. Only heads 6 (the
     * last of group 0) and 7 (the first of group 1) are nonzero, on channel 3 (= 1) and 9 (= 2). KV head 0
     * holds 8 at token 0 on channel 3 and KV head 1 holds 8 at token 1 on channel 9; each KV head also
     * holds 100 at token 2 on the other head's channel, which its own group's nonzero head never reads.
     * Scores (x 1/8): t0 = 8, t1 = 16, t2 = t3 = 0. */
    omnikv_layout s = {1, 14, 2, 64, 4};
    kvb_bf16 *q, *K;
    alloc_inputs(&s, &q, &K);
    qat(q, &s, 0, 6)[3] = bf(1);
    qat(q, &s, 0, 7)[9] = bf(2);
    kat(K, &s, 0, 0, 0)[3] = bf(8);
    kat(K, &s, 0, 1, 1)[9] = bf(8);
    kat(K, &s, 0, 0, 2)[9] = bf(100);
    kat(K, &s, 0, 1, 2)[3] = bf(100);
    float sc[4];
    int32_t idx[2], len[1] = {4};
    assert_int_equal(ref_omnikv_select(q, K, len, &s, 2, sc, idx, NULL, NULL), KVB_OK);
    assert_true(sc[0] == 1.0f);
    assert_true(sc[1] == 2.0f);
    assert_true(sc[2] == 0.0f);
    assert_true(sc[3] == 0.0f);
    assert_int_equal(idx[0], 0);
    assert_int_equal(idx[1], 1);
    free(q), free(K);
}

static void test_ties_and_length_mask(void **state)
{
    (void)state;
    /* B=2, L=8: every prompt token of a sequence scores the same (identical K rows); tokens past the
     * prompt (len = {5, 3}) have K rows that would win by far. k=3: {0, 1, 2} on both rows; scores past
     * the prompt are -inf. */
    omnikv_layout s = {2, 8, 8, 64, 8};
    kvb_bf16 *q, *K;
    alloc_inputs(&s, &q, &K);
    int32_t len[2] = {5, 3};
    for (int b = 0; b < 2; b++)
        for (int h = 0; h < 8; h++) {
            qat(q, &s, b, h)[h] = bf(1);
            for (int t = 0; t < 8; t++) kat(K, &s, b, h, t)[h] = bf(t < len[b] ? 0.5 : 50);
        }
    float sc[16];
    int32_t idx[6];
    assert_int_equal(ref_omnikv_select(q, K, len, &s, 3, sc, idx, NULL, NULL), KVB_OK);
    for (int b = 0; b < 2; b++) {
        for (int i = 0; i < 3; i++) assert_int_equal(idx[b * 3 + i], i);
        for (int t = 0; t < 8; t++) {
            if (t < len[b]) assert_true(sc[b * 8 + t] == (float)(0.5 / 8));
            else assert_true(isinf(sc[b * 8 + t]) && sc[b * 8 + t] < 0);
        }
    }
    /* a unique larger score at the last prompt token joins the lowest tied ones */
    for (int h = 0; h < 8; h++) kat(K, &s, 1, h, 2)[h] = bf(0.75);
    assert_int_equal(ref_omnikv_select(q, K, len, &s, 2, sc, idx, NULL, NULL), KVB_OK);
    assert_int_equal(idx[2], 0);
    assert_int_equal(idx[3], 2);
    free(q), free(K);
}

/* ---- random inputs against the brute force ---- */

static void brute_force(const kvb_bf16 *q, const kvb_bf16 *K, const int32_t *len, const omnikv_layout *s, int k,
                        double *score, int32_t *idx)
{
    const int G = s->Hq / s->Hkv;
    for (int b = 0; b < s->B; b++) {
        double *row = score + (size_t)b * s->L;
        for (int t = 0; t < s->L; t++) row[t] = -INFINITY;
        for (int h = 0; h < s->Hq; h++) /* per head all tokens, then the max */
            for (int t = 0; t < len[b]; t++) {
                double dot = 0;
                for (int c = 0; c < s->D; c++)
                    dot += kvb_bf16_to_double(q[((size_t)b * s->Hq + h) * s->D + c]) *
                           kvb_bf16_to_double(K[(((size_t)b * s->Hkv + h / G) * s->L + t) * s->D + c]);
                row[t] = fmax(row[t], dot / sqrt((double)s->D));
            }
        int m = 0;
        for (int t = 0; t < len[b]; t++) {
            int better = 0;
            const float ft = (float)row[t];
            for (int u = 0; u < len[b]; u++) {
                const float fu = (float)row[u];
                better += fu > ft || (fu == ft && u < t);
            }
            if (better < k) idx[(size_t)b * k + m++] = t;
        }
        assert_int_equal(m, k);
    }
}

static void check_random(int B, int Hq, int Hkv, int D, int L, int k, uint64_t seed)
{
    omnikv_layout s = {B, Hq, Hkv, D, L};
    kvb_bf16 *q, *K;
    alloc_inputs(&s, &q, &K);
    for (size_t i = 0; i < (size_t)B * Hq * D; i++) q[i] = bf(4 * uniform(&seed));
    for (size_t i = 0; i < (size_t)B * Hkv * L * D; i++) K[i] = bf(4 * uniform(&seed));
    int32_t *len = malloc(sizeof(int32_t) * (size_t)B), *idx = malloc(sizeof(int32_t) * (size_t)B * k);
    int32_t *want = malloc(sizeof(int32_t) * (size_t)B * k);
    float *sc = malloc(sizeof(float) * (size_t)B * L);
    double *score = malloc(sizeof(double) * (size_t)B * L);
    for (int b = 0; b < B; b++) len[b] = b == 0 ? L : k + (int)((uniform(&seed) + 0.5) * (L - k + 1)) % (L - k + 1);
    assert_int_equal(ref_omnikv_select(q, K, len, &s, k, sc, idx, NULL, NULL), KVB_OK);
    brute_force(q, K, len, &s, k, score, want);
    for (size_t i = 0; i < (size_t)B * L; i++)
        assert_true(sc[i] == (float)score[i]); /* -inf past len[b] too */
    for (size_t i = 0; i < (size_t)B * k; i++) assert_int_equal(idx[i], want[i]);
    free(q), free(K), free(len), free(idx), free(want), free(sc), free(score);
}

static void test_random_against_brute_force(void **state)
{
    (void)state;
    check_random(3, 8, 8, 64, 50, 7, 1);     /* G = 1 */
    check_random(2, 8, 4, 128, 33, 33, 2);   /* G = 2, k = L on sequence 0 */
    check_random(2, 32, 8, 128, 40, 1, 3);   /* G = 4, k = 1 */
    check_random(4, 16, 2, 64, 70, 20, 4);   /* G = 8 */
    check_random(1, 8, 1, 64, 1, 1, 5);      /* L = 1 */
    check_random(3, 24, 8, 64, 30, 5, 6);    /* G = 3 */
    check_random(2, 5, 1, 128, 20, 3, 7);    /* G = 5 */
    check_random(2, 12, 2, 64, 40, 40, 8);   /* G = 6, k = L on sequence 0 */
    check_random(2, 28, 4, 128, 45, 9, 9);   /* G = 7: Qwen2-7B's heads */
    check_random(3, 14, 2, 64, 33, 1, 10);   /* G = 7, k = 1 */
}

/* ---- refusals ---- */

static void test_refusals(void **state)
{
    (void)state;
    omnikv_layout s = {2, 32, 8, 128, 100};
    kvb_bf16 q[1] = {0}, K[1] = {0};
    float sc[1];
    int32_t idx[1], len[2] = {100, 40};
    assert_int_equal(ref_omnikv_select(q, K, len, &s, 0, sc, idx, NULL, NULL), KVB_EINVAL);
    assert_error_mentions("ref_omnikv_select: k=0 out of range [1, min over b of len[b] = 40]");
    assert_int_equal(ref_omnikv_select(q, K, len, &s, 41, sc, idx, NULL, NULL), KVB_EINVAL);
    assert_error_mentions("ref_omnikv_select: k=41 out of range [1, min over b of len[b] = 40]");
    len[1] = 0;
    assert_int_equal(ref_omnikv_select(q, K, len, &s, 1, sc, idx, NULL, NULL), KVB_EINVAL);
    assert_error_mentions("len[1]=0 out of range [1, L = 100]");
    len[1] = 101;
    assert_int_equal(omnikv_select_check(&s, len, 1, "who"), KVB_EINVAL);
    assert_error_mentions("who: len[1]=101 out of range [1, L = 100]");
    for (int G = 1; G <= 8; G++) { /* every group size the kernel takes */
        s.Hq = 8 * G;
        assert_int_equal(omnikv_layout_check(&s, "who"), KVB_OK);
    }
    s.Hq = 72;
    assert_int_equal(omnikv_layout_check(&s, "who"), KVB_EINVAL);
    assert_error_mentions("who: G = Hq/Hkv = 72/8 = 9 out of range [1, 8]");
    s.Hq = 128;
    assert_int_equal(omnikv_layout_check(&s, "who"), KVB_EINVAL);
    assert_error_mentions("G = Hq/Hkv = 128/8 = 16 out of range [1, 8]");
    s.Hq = 12;
    assert_int_equal(omnikv_layout_check(&s, "who"), KVB_EINVAL);
    assert_error_mentions("who: Hq=12 is not a multiple of Hkv=8");
    s.Hq = 32, s.D = 96;
    assert_int_equal(omnikv_layout_check(&s, "who"), KVB_EINVAL);
    assert_error_mentions("who: D=96 is not one of {64, 128}");
    s.D = 128, s.L = 0;
    assert_int_equal(omnikv_layout_check(&s, "who"), KVB_EINVAL);
    assert_error_mentions("who: L=0 out of range [1, 2097152]");
    s.L = 100, s.B = 0;
    assert_int_equal(omnikv_layout_check(&s, "who"), KVB_EINVAL);
    assert_error_mentions("who: B=0 out of range [1, 1024]");
    s.B = 2, s.Hkv = 300, s.Hq = 300;
    assert_int_equal(omnikv_layout_check(&s, "who"), KVB_EINVAL);
    assert_error_mentions("who: Hkv=300 out of range [1, 256]");
}

/* OmniKV's layer roles, written out from kernels/omnikv/NOTES.md (for 32 layers, filters {2, 8, 18};
 * layers 0-1 and the layer after each filter dense; the rest sparse): D = dense, F = filter, S = sparse */
static void test_layer_roles(void **state)
{
    (void)state;
    const char *want = "DDFD" "SSSS" "FD" "SSSSSSSS" "FD" "SSSSSSSSSSSS";
    assert_int_equal((int)strlen(want), 32);
    for (int l = 0; l < 32; l++) {
        const int role = omnikv_layer_role(l, 32);
        const int expect = want[l] == 'D' ? OMNIKV_ROLE_DENSE : want[l] == 'F' ? OMNIKV_ROLE_FILTER : OMNIKV_ROLE_SPARSE;
        if (role != expect) fail_msg("layer %d: role %d, expected %c", l, role, want[l]);
    }
    int dense = -1, filter = -1, sparse = -1;
    assert_int_equal(omnikv_role_counts(32, &dense, &filter, &sparse), KVB_OK);
    assert_int_equal(dense, 5);
    assert_int_equal(filter, 3);
    assert_int_equal(sparse, 24);
    /* refusals: the roles are defined for 32 layers only */
    assert_int_equal(omnikv_layer_role(0, 2), -1);
    assert_error_mentions("omnikv_layer_role: layers=2 out of range [32, 32]");
    assert_int_equal(omnikv_layer_role(32, 32), -1);
    assert_error_mentions("omnikv_layer_role: layer=32 out of range [0, 31]");
    assert_int_equal(omnikv_layer_role(-1, 32), -1);
    assert_error_mentions("layer=-1 out of range [0, 31]");
    assert_int_equal(omnikv_role_counts(40, &dense, &filter, &sparse), KVB_EINVAL);
    assert_error_mentions("omnikv_role_counts: layers=40 out of range [32, 32]");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hand_example),
        cmocka_unit_test(test_gqa_head_mapping),
        cmocka_unit_test(test_gqa_head_mapping_group_of_seven),
        cmocka_unit_test(test_ties_and_length_mask),
        cmocka_unit_test(test_random_against_brute_force),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_layer_roles),
    };
    return cmocka_run_group_tests_name("ref omnikv", tests, NULL, NULL);
}
