/* test_ref_batch_gemm_rotary.c: the reference of batch_gemm_rotary (reference/batch_gemm_rotary.c) against
 * the formula of kernels/batch_gemm_rotary/NOTES.md written another way (x * cos + rotate(x) * sin), on tiny
 * inputs for both RoPE kinds; hit slots and rows outside the sparse region untouched; the sampled variant;
 * the table; every rejection. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "reference/batch_gemm_rotary.h"
#include "tests/testlib.h"

enum { B = 2, HKV = 2, M = 3, C = 2, D = 8, R = 3, S = 16, NB = 16, SPARSE = 4, MAXPOS = 16 };
#define POISON 0x7FC1 /* a NaN pattern the reference never writes */

static kvb_bf16 U[B * S * R], SV[B * HKV * R * D], table[MAXPOS * D], K[B * HKV * NB * D];
static int32_t ids[B * HKV * M], cnts[B * HKV];

static gather_layout layout(void)
{
    gather_layout g = {B, HKV, M, C, D, NB, SPARSE, S / C, S / C};
    return g;
}

static void inputs(rope_kind rope)
{
    uint64_t s = 5;
    for (size_t i = 0; i < sizeof U / sizeof U[0]; i++) s = s * 6364136223846793005ULL + 1, U[i] = kvb_double_to_bf16((double)(s >> 40) / (1 << 24) - 0.5);
    for (size_t i = 0; i < sizeof SV / sizeof SV[0]; i++) s = s * 6364136223846793005ULL + 1, SV[i] = kvb_double_to_bf16((double)(s >> 40) / (1 << 22) - 2);
    for (int bh = 0; bh < B * HKV; bh++) {
        cnts[bh] = bh % 3; /* 0, 1, 2, 0 hits */
        for (int j = 0; j < M; j++) ids[bh * M + j] = (bh * 3 + j * 2) % (S / C);
    }
    assert_int_equal(rope_table(table, MAXPOS, D, 10000.0, rope), KVB_OK);
    for (size_t i = 0; i < sizeof K / sizeof K[0]; i++) K[i] = POISON;
}

/* y = x * cos + rotate(x) * sin, rotate-half: [-x2, x1]; glm: pairs (2i, 2i+1) -> (-x_{2i+1}, x_{2i}) */
static void expect_row(int b, int h, int s, rope_kind rope, kvb_bf16 *want)
{
    const int bh = b * HKV + h, p = ids[bh * M + s / C] * C + s % C;
    double x[D], rot[D], co[D], si[D];
    for (int d = 0; d < D; d++) {
        x[d] = 0;
        for (int k = 0; k < R; k++) x[d] += kvb_bf16_to_double(U[(b * S + p) * R + k]) * kvb_bf16_to_double(SV[(bh * R + k) * D + d]);
    }
    for (int d = 0; d < D; d++) {
        if (rope == ROPE_LLAMA) {
            rot[d] = d < D / 2 ? -x[d + D / 2] : x[d - D / 2];
            co[d] = kvb_bf16_to_double(table[p * D + d % (D / 2)]);
            si[d] = kvb_bf16_to_double(table[p * D + D / 2 + d % (D / 2)]);
        } else if (d < D / 2) {
            rot[d] = d % 2 ? x[d - 1] : -x[d + 1];
            co[d] = kvb_bf16_to_double(table[p * D + d / 2]);
            si[d] = kvb_bf16_to_double(table[p * D + D / 4 + d / 2]);
        } else {
            rot[d] = 0, co[d] = 1, si[d] = 0;
        }
        want[d] = kvb_double_to_bf16(x[d] * co[d] + rot[d] * si[d]);
    }
}

static void run_and_compare(rope_kind rope)
{
    inputs(rope);
    gather_layout g = layout();
    assert_int_equal(ref_batch_gemm_rotary(U, SV, ids, cnts, table, &g, S, R, MAXPOS, rope, K), KVB_OK);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < HKV; h++) {
            const int bh = b * HKV + h;
            for (int t = 0; t < NB; t++) {
                const kvb_bf16 *row = K + ((int64_t)bh * NB + t) * D;
                const int s = t - SPARSE;
                if (s >= cnts[bh] * C && s < M * C) {
                    kvb_bf16 want[D];
                    expect_row(b, h, s, rope, want);
                    for (int d = 0; d < D; d++) assert_int_equal(row[d], want[d]);
                } else { /* hit slots, local/outlier rows and decode rows: untouched */
                    for (int d = 0; d < D; d++) assert_int_equal(row[d], POISON);
                }
            }
        }
}

static void test_llama_rotate_half(void **state) { (void)state; run_and_compare(ROPE_LLAMA); }
static void test_glm_partial_interleaved(void **state) { (void)state; run_and_compare(ROPE_GLM); }

/* A sampled run computes exactly the chosen slices, bit for bit as the whole run does, and leaves the
 * others untouched */
static void test_sampled_slices(void **state)
{
    (void)state;
    static kvb_bf16 full[sizeof K / sizeof K[0]];
    inputs(ROPE_LLAMA);
    gather_layout g = layout();
    assert_int_equal(ref_batch_gemm_rotary(U, SV, ids, cnts, table, &g, S, R, MAXPOS, ROPE_LLAMA, K), KVB_OK);
    memcpy(full, K, sizeof K);
    for (size_t i = 0; i < sizeof K / sizeof K[0]; i++) K[i] = POISON;
    const uint8_t mask[B * HKV] = {1, 0, 0, 1};
    assert_int_equal(ref_batch_gemm_rotary_sampled(U, SV, ids, cnts, table, &g, S, R, MAXPOS, ROPE_LLAMA, mask, K), KVB_OK);
    for (int bh = 0; bh < B * HKV; bh++)
        for (int i = 0; i < NB * D; i++)
            assert_int_equal(K[bh * NB * D + i], mask[bh] ? full[bh * NB * D + i] : POISON);
}

/* cos^2 + sin^2 = 1 within bf16 rounding; position 0 is the identity */
static void test_table(void **state)
{
    (void)state;
    kvb_bf16 t[64 * 128];
    for (int rope = 0; rope < 2; rope++) {
        assert_int_equal(rope_table(t, 64, 128, 500000.0, (rope_kind)rope), KVB_OK);
        const int half = rope ? 32 : 64;
        for (int p = 0; p < 64; p++)
            for (int i = 0; i < half; i++) {
                double c = kvb_bf16_to_double(t[p * 128 + i]), s = kvb_bf16_to_double(t[p * 128 + half + i]);
                assert_true(fabs(c * c + s * s - 1) < 2e-2);
                if (p == 0) assert_true(c == 1 && s == 0);
            }
    }
    assert_int_equal(rope_table(t, 0, 128, 1e4, ROPE_LLAMA), KVB_EINVAL);
    assert_error_mentions("max_pos=0 out of range");
}

static void test_rejections(void **state)
{
    (void)state;
    inputs(ROPE_LLAMA);
    gather_layout g = layout();
    assert_int_equal(ref_batch_gemm_rotary(U, SV, ids, cnts, table, &g, S, 0, MAXPOS, ROPE_LLAMA, K), KVB_EINVAL);
    assert_error_mentions("r=0 out of range [1, 1024]");
    ids[M - 1] = S / C; /* slot M-1 of (0, 0) is a miss (cnts[0] = 0) */
    assert_int_equal(ref_batch_gemm_rotary(U, SV, ids, cnts, table, &g, S, R, MAXPOS, ROPE_LLAMA, K), KVB_EINVAL);
    assert_error_mentions("ids[0, 2]=8 out of range [0, S/c = 8)", "outside the context");
    ids[M - 1] = 7;
    assert_int_equal(ref_batch_gemm_rotary(U, SV, ids, cnts, table, &g, S, R, 14, ROPE_LLAMA, K), KVB_EINVAL);
    assert_error_mentions("max_pos = 14", "RoPE table is shorter");
    cnts[1] = M + 1;
    assert_int_equal(ref_batch_gemm_rotary(U, SV, ids, cnts, table, &g, S, R, MAXPOS, ROPE_LLAMA, K), KVB_EINVAL);
    assert_error_mentions("cnts[1]=4 out of range [0, M = 3]");
    cnts[1] = 1;
    assert_int_equal(ref_batch_gemm_rotary(U, SV, ids, cnts, table, &g, S, R, MAXPOS, (rope_kind)2, K), KVB_EINVAL);
    assert_error_mentions("rope=2 out of range [0 (llama), 1 (glm)]");
    assert_int_equal(batch_gemm_rotary_check(NULL, NULL, &g, S, R, MAXPOS, ROPE_LLAMA, "who"), KVB_OK); /* no data: parameters only */
    g.D = 6;
    assert_int_equal(ref_batch_gemm_rotary(U, SV, ids, cnts, table, &g, S, R, MAXPOS, ROPE_GLM, K), KVB_EINVAL);
    assert_error_mentions("c*D*2 = 2*6*2 = 24"); /* refused by the layout rule before the RoPE rule */
    for (size_t i = 0; i < sizeof K / sizeof K[0]; i++) assert_int_equal(K[i], POISON); /* nothing written */
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama_rotate_half),
        cmocka_unit_test(test_glm_partial_interleaved),
        cmocka_unit_test(test_sampled_slices),
        cmocka_unit_test(test_table),
        cmocka_unit_test(test_rejections),
    };
    return cmocka_run_group_tests_name("reference batch_gemm_rotary", tests, NULL, NULL);
}
