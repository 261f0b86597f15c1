/* test_ref_decode.c: the dense decode attention reference (kernels/decode/NOTES.md) on hand-checked cases,
 * its checks of bad input, and the sampled-reference helper. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "harness/ops/ops.h"
#include "reference/decode.h"
#include "tests/testlib.h"

static kvb_bf16 bf(double x) { return kvb_double_to_bf16(x); }

/* q = 0: every score is 0, the softmax is uniform, o = mean of V over the first len[b] tokens (the
 * tokens past len[b] hold huge values that must not count). GQA: heads 0, 1 read KV head 0, heads
 * 2, 3 read KV head 1. */
static void test_uniform_softmax_is_the_mean(void **state)
{
    (void)state;
    enum { B = 2, Hq = 4, Hkv = 2, D = 64, L = 5 };
    decode_layout d = {B, Hq, Hkv, D, L};
    kvb_bf16 q[B * Hq * D], K[B * Hkv * L * D], V[B * Hkv * L * D], o[B * Hq * D];
    int32_t len[B] = {3, 5};
    for (int i = 0; i < B * Hq * D; i++) q[i] = bf(0);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < Hkv; h++)
            for (int t = 0; t < L; t++)
                for (int c = 0; c < D; c++) {
                    int64_t i = (((int64_t)b * Hkv + h) * L + t) * D + c;
                    K[i] = bf(c % 7 - 3);
                    V[i] = bf(t < len[b] ? (double)(t + 1) * (h + 1) + 0.25 * c : 1000.0);
                }
    assert_int_equal(ref_decode_attn(q, K, V, len, o, &d, NULL), KVB_OK);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < Hq; h++) {
            int kvh = h / 2;
            for (int c = 0; c < D; c++) {
                double mean = 0; /* (1 + ... + len) / len * (kvh + 1) + 0.25 c */
                for (int t = 0; t < len[b]; t++) mean += (double)(t + 1) * (kvh + 1) + 0.25 * c;
                mean /= len[b];
                assert_int_equal(o[((int64_t)b * Hq + h) * D + c], bf(mean));
            }
        }
}

/* One key matches q: s = [0, 8, 0] (q . K_1 = 8 sqrt(D), scaled by 1/sqrt(D)), so
 * o = (e^8 V_1 + V_0 + V_2) / (e^8 + 2). */
static void test_one_token_dominates(void **state)
{
    (void)state;
    enum { D = 128, L = 3 };
    decode_layout d = {1, 1, 1, D, L};
    kvb_bf16 q[D], K[L * D], V[L * D], o[D];
    int32_t len[1] = {3};
    double sq = sqrt((double)D);
    for (int c = 0; c < D; c++) {
        q[c] = bf(c == 0 ? 8.0 * sq / 16.0 : 0); /* 8 sqrt(D) / 16 ... */
        for (int t = 0; t < L; t++) {
            K[t * D + c] = bf(c == 0 && t == 1 ? 16.0 : 0); /* ... times 16 */
            V[t * D + c] = bf(t == 1 ? 2.0 : (t == 0 ? -1.0 : 0.5) + c / 256.0);
        }
    }
    assert_int_equal(ref_decode_attn(q, K, V, len, o, &d, NULL), KVB_OK);
    double qk = kvb_bf16_to_double(q[0]) * 16.0 / sq; /* the score of token 1 as the reference sees it */
    double w = exp(qk);
    for (int c = 0; c < D; c++) {
        double v0 = kvb_bf16_to_double(V[c]), v1 = kvb_bf16_to_double(V[D + c]), v2 = kvb_bf16_to_double(V[2 * D + c]);
        assert_int_equal(o[c], bf((w * v1 + v0 + v2) / (w + 2.0)));
    }
}

static void test_bad_layouts_and_lengths(void **state)
{
    (void)state;
    decode_layout d = {2, 32, 8, 96, 1024};
    assert_int_equal(decode_layout_check(&d, "decode_attn"), KVB_EINVAL);
    assert_error_mentions("decode_attn: D=96 is not one of {64, 128}");
    d.D = 128, d.Hq = 30;
    assert_int_equal(decode_layout_check(&d, "decode_attn"), KVB_EINVAL);
    assert_error_mentions("Hq=30 is not a multiple of Hkv=8");
    d.Hq = 72;
    assert_int_equal(decode_layout_check(&d, "decode_attn"), KVB_EINVAL);
    assert_error_mentions("Hq=72 out of range [8, 64]");
    d.Hq = 32, d.L = (1 << 20) + 1;
    assert_int_equal(decode_layout_check(&d, "decode_attn"), KVB_EINVAL);
    assert_error_mentions("L=1048577 out of range [1, 1048576]");
    d.L = 1024;
    assert_int_equal(decode_layout_check(&d, "decode_attn"), KVB_OK);
    int32_t len[2] = {1024, 1025};
    assert_int_equal(decode_lengths_check(&d, len, "decode_attn"), KVB_EINVAL);
    assert_error_mentions("len[1]=1025 out of range [1, L = 1024]", "allocated cache");
    len[1] = 0;
    assert_int_equal(decode_lengths_check(&d, len, "decode_attn"), KVB_EINVAL);
    assert_error_mentions("len[1]=0 out of range");
    kvb_bf16 x[1];
    assert_int_equal(ref_decode_attn(x, x, x, len, x, &d, NULL), KVB_EINVAL); /* checked before any read */
}

/* A sampled reference leaves the other slices untouched. */
static void test_slices_mask(void **state)
{
    (void)state;
    enum { B = 2, Hq = 2, Hkv = 2, D = 64, L = 4 };
    decode_layout d = {B, Hq, Hkv, D, L};
    kvb_bf16 q[B * Hq * D], K[B * Hkv * L * D], V[B * Hkv * L * D], o[B * Hq * D];
    int32_t len[B] = {4, 2};
    for (int i = 0; i < B * Hq * D; i++) q[i] = bf(0.01 * (i % 13)), o[i] = KVB_BF16_NAN;
    for (int i = 0; i < B * Hkv * L * D; i++) K[i] = bf(0.1 * (i % 5)), V[i] = bf(i % 9);
    uint8_t mask[B * Hkv] = {1, 0, 0, 1};
    assert_int_equal(ref_decode_attn(q, K, V, len, o, &d, mask), KVB_OK);
    for (int sl = 0; sl < B * Hkv; sl++)
        for (int c = 0; c < D; c++) /* G = 1: slice sl is output row sl */
            assert_true(mask[sl] ? o[sl * D + c] != KVB_BF16_NAN : o[sl * D + c] == KVB_BF16_NAN);
}

static void test_sample_slices(void **state)
{
    (void)state;
    int64_t chosen;
    assert_null(kvb_sample_slices(10, 1.0, 100.0, &chosen));
    assert_int_equal(chosen, 10);
    uint8_t *m = kvb_sample_slices(64, 1e8, 6e8, &chosen);
    assert_non_null(m);
    assert_int_equal(chosen, 6);
    assert_true(m[0] && m[63]);
    int n = 0;
    for (int i = 0; i < 64; i++) n += m[i];
    assert_int_equal(n, 6);
    free(m);
    m = kvb_sample_slices(64, 1e12, 6e8, &chosen); /* at least the first and the last */
    assert_int_equal(chosen, 2);
    assert_true(m[0] && m[63]);
    free(m);
}

/* ---- sparse decode attention ---- */

/* q = 0: uniform softmax over the listed tokens, o = mean of V over them. Token lists {1, 3} and
 * {0}; page lists of P = 2 over len = 5: pages {0, 2} hold tokens {0, 1, 4} (page 2 is partial:
 * token 5 is past len and must not count, though the cache holds it). */
static void test_sparse_means(void **state)
{
    (void)state;
    enum { B = 2, Hq = 2, Hkv = 1, D = 64, L = 6 };
    sparse_layout s = {{B, Hq, Hkv, D, L}, 3, 1};
    kvb_bf16 q[B * Hq * D], K[B * Hkv * L * D], V[B * Hkv * L * D], o[B * Hq * D];
    int32_t len[B] = {4, 5}, idx[B * 3] = {1, 3, -1, 0, -1, -1}, cnt[B] = {2, 1};
    for (int i = 0; i < B * Hq * D; i++) q[i] = bf(0);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < L; t++)
            for (int c = 0; c < D; c++) {
                K[((int64_t)b * L + t) * D + c] = bf(c % 5 - 2);
                V[((int64_t)b * L + t) * D + c] = bf(t < len[b] ? 10.0 * b + t + c / 64.0 : 1000.0);
            }
#define VAL(b, t, c) kvb_bf16_to_double(V[((int64_t)(b) * L + (t)) * D + (c)])
    assert_int_equal(ref_sparse_attn_idx(q, K, V, len, idx, cnt, o, &s, NULL), KVB_OK);
    for (int h = 0; h < Hq; h++)
        for (int c = 0; c < D; c++) {
            assert_int_equal(o[(int64_t)h * D + c], bf((VAL(0, 1, c) + VAL(0, 3, c)) / 2));
            assert_int_equal(o[((int64_t)Hq + h) * D + c], bf(VAL(1, 0, c)));
        }
    int32_t pages[B * 3] = {0, 1, -1, 0, 2, -1}, pcnt[B] = {2, 2};
    s.P = 2;
    assert_int_equal(ref_sparse_attn_pages(q, K, V, len, pages, pcnt, o, &s, NULL), KVB_OK);
    for (int h = 0; h < Hq; h++)
        for (int c = 0; c < D; c++) {
            assert_int_equal(o[(int64_t)h * D + c], bf((VAL(0, 0, c) + VAL(0, 1, c) + VAL(0, 2, c) + VAL(0, 3, c)) / 4));
            assert_int_equal(o[((int64_t)Hq + h) * D + c], bf((VAL(1, 0, c) + VAL(1, 1, c) + VAL(1, 4, c)) / 3));
        }
#undef VAL
}

/* Lists of every token, ascending, give the dense reference to the bit. */
static void test_sparse_all_tokens_is_dense(void **state)
{
    (void)state;
    enum { B = 2, Hq = 8, Hkv = 2, D = 128, L = 37, P = 4 };
    decode_layout d = {B, Hq, Hkv, D, L};
    sparse_layout s = {d, L, 1};
    kvb_bf16 *q = malloc(sizeof(kvb_bf16) * B * Hq * D), *K = malloc(sizeof(kvb_bf16) * B * Hkv * L * D),
             *V = malloc(sizeof(kvb_bf16) * B * Hkv * L * D), o1[B * Hq * D], o2[B * Hq * D], o3[B * Hq * D];
    kvb_fill_bf16_normal(q, B * Hq * D, 3, 1, 0, 0, 2.0);
    kvb_fill_bf16_normal(K, B * Hkv * L * D, 3, 2, 0, 0, 1.0);
    kvb_fill_bf16_normal(V, B * Hkv * L * D, 3, 3, 0, 0, 1.0);
    int32_t len[B] = {L, 30}, idx[B * Hkv * L], cnt[B] = {L, 30}, pcnt[B] = {10, 8};
    for (int r = 0; r < B * Hkv; r++)
        for (int j = 0; j < L; j++) idx[r * L + j] = j;
    assert_int_equal(ref_decode_attn(q, K, V, len, o1, &d, NULL), KVB_OK);
    assert_int_equal(ref_sparse_attn_idx(q, K, V, len, idx, cnt, o2, &s, NULL), KVB_OK);
    s.P = P, s.n = L / P + 1;
    int32_t pg[B * Hkv * (L / P + 1)];
    for (int r = 0; r < B * Hkv; r++)
        for (int j = 0; j < s.n; j++) pg[r * s.n + j] = j;
    assert_int_equal(ref_sparse_attn_pages(q, K, V, len, pg, pcnt, o3, &s, NULL), KVB_OK);
    assert_memory_equal(o1, o2, sizeof o1);
    assert_memory_equal(o1, o3, sizeof o1);
    free(q), free(K), free(V);
}

static void test_sparse_bad_lists(void **state)
{
    (void)state;
    sparse_layout s = {{2, 8, 2, 128, 100}, 10, 1};
    int32_t len[2] = {100, 50}, cnt[2] = {10, 10}, l[2 * 2 * 10];
    for (int i = 0; i < 40; i++) l[i] = i % 10;
    assert_int_equal(sparse_lists_check(&s, len, l, cnt, 0, "sparse_attn_idx"), KVB_OK);
    l[3 * 10 + 7] = 50; /* b = 1, kv head 1, entry 7: token 50 of a 50-token sequence */
    assert_int_equal(sparse_lists_check(&s, len, l, cnt, 0, "sparse_attn_idx"), KVB_EINVAL);
    assert_error_mentions("sparse_attn_idx: idx[b=1, kv head=1, entry 7]=50 out of range [0, 50)", "outside the cache");
    l[3 * 10 + 7] = -1;
    assert_int_equal(sparse_lists_check(&s, len, l, cnt, 0, "sparse_attn_idx"), KVB_EINVAL);
    assert_error_mentions("=-1 out of range [0, 50)");
    l[3 * 10 + 7] = 7, cnt[0] = 0;
    assert_int_equal(sparse_lists_check(&s, len, l, cnt, 0, "sparse_attn_idx"), KVB_EINVAL);
    assert_error_mentions("cnt[0]=0 out of range [1, n = 10]");
    cnt[0] = 11;
    assert_int_equal(sparse_lists_check(&s, len, l, cnt, 0, "sparse_attn_idx"), KVB_EINVAL);
    assert_error_mentions("cnt[0]=11 out of range [1, n = 10]");
    cnt[0] = 7, s.P = 16; /* pages: sequence 0 holds 7 pages, sequence 1 ceil(50 / 16) = 4 */
    s.n = 10;
    l[3 * 10 + 7] = 4;
    assert_int_equal(sparse_lists_check(&s, len, l, cnt, 1, "sparse_attn_pages"), KVB_EINVAL);
    assert_error_mentions("pages[b=1, kv head=0, entry 4]=4 out of range [0, 4)", "page outside the cache");
    s.P = 0;
    assert_int_equal(sparse_layout_check(&s, "sparse_attn_pages"), KVB_EINVAL);
    assert_error_mentions("P=0 out of range [1, 4096]");
    s.P = 16, s.n = 8;
    assert_int_equal(sparse_layout_check(&s, "sparse_attn_pages"), KVB_EINVAL);
    assert_error_mentions("n=8 out of range [1, 7]");
    s.P = 3, s.n = 3;
    kvb_bf16 x[1];
    assert_int_equal(ref_sparse_attn_idx(x, x, x, len, l, cnt, x, &s, NULL), KVB_EINVAL);
    assert_error_mentions("P=3 out of range [1, 1]: token lists have no pages");
}

/* kv_append writes row t[b] of every KV head of sequence b and nothing else; t outside [0, L) is refused. */
static void test_kv_append(void **state)
{
    (void)state;
    const decode_layout d = {2, 4, 2, 64, 5};
    kvb_bf16 K[2 * 2 * 5 * 64], V[2 * 2 * 5 * 64], kn[2 * 2 * 64], vn[2 * 2 * 64];
    for (int i = 0; i < 2 * 2 * 5 * 64; i++) K[i] = kvb_double_to_bf16(i % 7), V[i] = kvb_double_to_bf16(-(i % 5));
    for (int i = 0; i < 2 * 2 * 64; i++) kn[i] = kvb_double_to_bf16(100 + i), vn[i] = kvb_double_to_bf16(-100 - i);
    int32_t t[2] = {4, 0};
    assert_int_equal(ref_kv_append(kn, vn, t, K, V, &d), KVB_OK);
    for (int b = 0; b < 2; b++)
        for (int h = 0; h < 2; h++)
            for (int row = 0; row < 5; row++)
                for (int c = 0; c < 64; c++) {
                    const int i = ((b * 2 + h) * 5 + row) * 64 + c, n = (b * 2 + h) * 64 + c;
                    assert_int_equal(K[i], row == t[b] ? kn[n] : kvb_double_to_bf16(i % 7));
                    assert_int_equal(V[i], row == t[b] ? vn[n] : kvb_double_to_bf16(-(i % 5)));
                }
    t[1] = 5;
    assert_int_equal(ref_kv_append(kn, vn, t, K, V, &d), KVB_EINVAL);
    assert_error_mentions("ref_kv_append: t[1]=5 out of range [0, L = 5)");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_uniform_softmax_is_the_mean), cmocka_unit_test(test_one_token_dominates),
        cmocka_unit_test(test_bad_layouts_and_lengths),     cmocka_unit_test(test_slices_mask),
        cmocka_unit_test(test_sample_slices),
        cmocka_unit_test(test_sparse_means),         cmocka_unit_test(test_sparse_all_tokens_is_dense),
        cmocka_unit_test(test_sparse_bad_lists),
        cmocka_unit_test(test_kv_append),
    };
    return cmocka_run_group_tests_name("decode reference", tests, NULL, NULL);
}
