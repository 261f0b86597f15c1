/* test_ref_block.c: the reference of the transformer block's stages (reference/step/block.c) on hand-worked
 * values, and its refusals:
 *   - RMSNorm of (3, 4) with unit weights is (3, 4) / sqrt(12.5 + eps);
 *   - a linear layer with a residual is W x + add;
 *   - RoPE at position 0 is the identity (cos 1, sin 0), at position p it rotates each pair (i, i + D/2)
 *     by p f_i, and v is copied;
 *   - SiLU(g) * u at g = 0 is 0 and at large g is u * g;
 *   - the dense block's K, V rows: row pos written for every sequence, the others unchanged;
 *   - unknown presets and positions outside the cache are refused by name. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "reference/batch_gemm_rotary.h"
#include "reference/step/block.h"
#include "harness/core/case.h"
#include "tests/testlib.h"

static kvb_bf16 bf(double x) { return kvb_double_to_bf16(x); }
static double db(kvb_bf16 x) { return kvb_bf16_to_double(x); }

static void test_rmsnorm(void **st)
{
    (void)st;
    kvb_bf16 x[8] = {bf(3), bf(4), bf(0), bf(0), bf(0), bf(0), bf(0), bf(0)}, w[8], y[8];
    for (int i = 0; i < 8; i++) w[i] = bf(1);
    w[1] = bf(2);
    ref_rmsnorm(x, w, 1, 8, 1e-5, y);
    const double inv = 1 / sqrt(25.0 / 8 + 1e-5);
    assert_true(y[0] == bf(3 * inv));
    assert_true(y[1] == bf(8 * inv));
    assert_true(db(y[2]) == 0);
}

static void test_linear_with_residual(void **st)
{
    (void)st;
    kvb_bf16 x[2] = {bf(1), bf(2)}, W[6] = {bf(1), bf(0), bf(0), bf(1), bf(1), bf(1)}, add[3] = {bf(10), bf(20), bf(30)}, y[3];
    ref_linear(x, W, add, 1, 2, 3, y);
    assert_true(db(y[0]) == 11 && db(y[1]) == 22 && db(y[2]) == 33);
    ref_linear(x, W, NULL, 1, 2, 3, y);
    assert_true(db(y[0]) == 1 && db(y[1]) == 2 && db(y[2]) == 3);
}

static void test_rope_split(void **st)
{
    (void)st;
    enum { D = 8, Hq = 2, Hkv = 1, ROW = (Hq + 2 * Hkv) * D };
    kvb_bf16 qkv[ROW], cs[4 * D], q[Hq * D], k[D], v[D];
    for (int i = 0; i < ROW; i++) qkv[i] = bf(i + 1);
    assert_int_equal(rope_table(cs, 4, D, 10000.0, ROPE_LLAMA), KVB_OK);
    int32_t pos[1] = {0};
    ref_rope_split(qkv, cs, pos, 1, Hq, Hkv, D, q, k, v);
    for (int i = 0; i < Hq * D; i++) assert_true(q[i] == qkv[i]);
    for (int i = 0; i < D; i++) assert_true(k[i] == qkv[Hq * D + i] && v[i] == qkv[(Hq + 1) * D + i]);
    pos[0] = 3;
    ref_rope_split(qkv, cs, pos, 1, Hq, Hkv, D, q, k, v);
    for (int i = 0; i < D / 2; i++) { /* pair (i, i + D/2) of head 0 rotated with row 3's bf16 cos, sin */
        const double c = db(cs[3 * D + i]), s = db(cs[3 * D + D / 2 + i]), a = i + 1, b = i + 1 + D / 2;
        assert_true(q[i] == bf(a * c - b * s));
        assert_true(q[i + D / 2] == bf(b * c + a * s));
    }
    for (int i = 0; i < D; i++) assert_true(v[i] == qkv[(Hq + 1) * D + i]);
}

static void test_silu_mul(void **st)
{
    (void)st;
    kvb_bf16 gu[4] = {bf(0), bf(20), bf(5), bf(3)}, y[2];
    ref_silu_mul(gu, 1, 2, y);
    assert_true(db(y[0]) == 0);
    assert_true(y[1] == bf(20 / (1 + exp(-20.0)) * 3));
}

static void test_block_cache_rows(void **st)
{
    (void)st;
    const block_preset *m = block_preset_find("tiny");
    assert_non_null(m);
    const int B = 2, H = m->hidden;
    const int64_t L = 6, kv = (int64_t)B * m->Hkv * L * m->D;
    kvb_bf16 *K = malloc(2 * kv), *V = malloc(2 * kv), *K0 = malloc(2 * kv), *x = malloc(2 * (size_t)B * H),
             *y = malloc(2 * (size_t)B * H), *cs = malloc(2 * (size_t)L * m->D);
    const int64_t nw = block_weight_elems(m);
    kvb_bf16 *wbuf = malloc(2 * (size_t)nw);
    uint64_t s = 7;
    for (int64_t i = 0; i < nw; i++) s = s * 6364136223846793005ULL + 1, wbuf[i] = bf(((double)(s >> 11) / 9007199254740992.0 - 0.5) / 8);
    for (int64_t i = 0; i < kv; i++) K[i] = V[i] = K0[i] = bf((double)(i % 13) / 13);
    for (int i = 0; i < B * H; i++) x[i] = bf((double)(i % 7) - 3);
    assert_int_equal(rope_table(cs, (int)L, m->D, m->theta, ROPE_LLAMA), KVB_OK);
    const int64_t qkv = (int64_t)(m->Hq + 2 * m->Hkv) * m->D * H, o = (int64_t)H * m->Hq * m->D, gu = 2LL * m->ffn * H;
    const block_weights w = {wbuf, wbuf + H, wbuf + 2 * H, wbuf + 2 * H + qkv, wbuf + 2 * H + qkv + o, wbuf + 2 * H + qkv + o + gu};
    int32_t pos[2] = {5, 2};
    assert_int_equal(ref_decode_block_dense(x, &w, m, B, pos, K, V, L, cs, (int)L, NULL, y), KVB_OK);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < m->Hkv; h++)
            for (int64_t t = 0; t < L; t++) {
                const int64_t row = ((int64_t)(b * m->Hkv + h) * L + t) * m->D;
                int same = 1;
                for (int i = 0; i < m->D; i++) same &= K[row + i] == K0[row + i];
                assert_int_equal(same, t != pos[b]);
            }
    for (int i = 0; i < B * H; i++) assert_true(isfinite(db(y[i])));
    pos[1] = 6;
    assert_int_equal(ref_decode_block_dense(x, &w, m, B, pos, K, V, L, cs, (int)L, NULL, y), KVB_EINVAL);
    assert_error_mentions("pos[1]=6 out of range [0, 5]");
    assert_int_equal(block_check(block_preset_find("gpt-5"), 1, 10, 10, NULL, "decode_step"), KVB_EINVAL);
    assert_error_mentions("decode_step: model is not one of {tiny|llama3-8b|llama2-7b}");
    free(K), free(V), free(K0), free(x), free(y), free(cs), free(wbuf);
}

/* decode_step's bad input: each refused when the case is read, before anything is allocated,
 * naming the key, its value and the range (and, for a batch too large, the largest that fits) */
static void test_decode_step_refusals(void **state)
{
    (void)state;
    kvb_case c;
    assert_int_equal(kvb_case_parse("decode_step method=rocketkv model=tiny B=1 ctx=1000 budget=4096", "t", &c),
                     KVB_EINVAL);
    assert_error_mentions("budget=4096 out of range [2, ctx = 1000]");
    assert_int_equal(kvb_case_parse("decode_step method=dense model=llama3-8b B=64 ctx=131072", "t", &c), KVB_EINVAL);
    assert_error_mentions("at B=64, out of range [0, 24 GB]: at most B=44 fits at ctx=131072");
    assert_int_equal(kvb_case_parse("decode_step method=minikv model=llama3-8b B=64 ctx=131072", "t", &c), KVB_EINVAL);
    assert_error_mentions("at most B=29 fits");
    assert_int_equal(kvb_case_parse("decode_step method=minikv model=tiny B=1 ctx=10 all=1", "t", &c), KVB_EINVAL);
    assert_error_mentions("method=minikv: all=1 out of range [0, 0]");
    assert_int_equal(kvb_case_parse("decode_step method=dense model=tiny B=1 ctx=10 all=1", "t", &c), KVB_EINVAL);
    assert_error_mentions("method=dense: all=1 out of range [0, 0]");
    assert_int_equal(kvb_case_parse("decode_step method=shadow model=tiny B=1 ctx=10", "t", &c), KVB_EINVAL);
    assert_error_mentions("method=shadow is not one of dense|rocketkv|minikv|shadowkv|omnikv");
    assert_int_equal(kvb_case_parse("decode_step method=dense model=gpt B=1 ctx=10", "t", &c), KVB_EINVAL);
    assert_error_mentions("model=gpt is not one of");
    assert_int_equal(kvb_case_parse("decode_step method=rocketkv model=tiny B=1 ctx=1000 budget=256 gen=50", "t", &c),
                     KVB_EINVAL);
    assert_error_mentions("gen=50");
    assert_int_equal(kvb_case_parse("decode_step method=rocketkv model=tiny B=1 ctx=1000 budget=1", "t", &c), KVB_EINVAL);
    assert_error_mentions("method=rocketkv: budget=1 out of range [2, ctx = 1000]");
    /* shadowkv: the budget in whole chunks within the context, the rank within the keys' columns, the hit
     * rate a fraction, the host's values counted in the batch that fits */
    assert_int_equal(kvb_case_parse("decode_step method=shadowkv model=tiny B=1 ctx=1000 budget=2048 rank=32", "t", &c),
                     KVB_EINVAL);
    assert_error_mentions("budget=2048 out of range [8, ctx = 1000]: a budget larger than the context");
    assert_int_equal(kvb_case_parse("decode_step method=shadowkv model=tiny B=1 ctx=1000 budget=100 rank=32", "t", &c),
                     KVB_EINVAL);
    assert_error_mentions("budget=100 out of range [8, ...], a multiple of the chunk (8 tokens)");
    assert_int_equal(kvb_case_parse("decode_step method=shadowkv model=tiny B=1 ctx=1000 budget=256", "t", &c),
                     KVB_EINVAL);
    assert_error_mentions("rank=160 out of range [1, min(ctx, Hkv*D) = 128]");
    assert_int_equal(kvb_case_parse("decode_step method=shadowkv model=tiny B=1 ctx=1000 budget=256 rank=8 hit=1.5",
                                    "t", &c), KVB_EINVAL);
    assert_error_mentions("hit=1.5");
    assert_int_equal(kvb_case_parse("decode_step method=shadowkv model=tiny B=1 ctx=1000 budget=640 rank=8", "t", &c),
                     KVB_EINVAL);
    assert_error_mentions("budget=640 out of range [8, 8 * min(4096, landmark chunks 73) = 584]");
    /* omnikv: k = budget prompt tokens selected, roles only for omnikv, all=1 only for its sparse layer */
    assert_int_equal(kvb_case_parse("decode_step method=omnikv model=tiny B=1 ctx=1000 budget=1001", "t", &c),
                     KVB_EINVAL);
    assert_error_mentions("method=omnikv: budget=1001 out of range [1, ctx = 1000]: a budget larger than the context");
    assert_int_equal(kvb_case_parse("decode_step method=omnikv role=filter model=tiny B=1 ctx=1000 budget=1001", "t",
                                    &c), KVB_EINVAL);
    assert_error_mentions("budget=1001 out of range [1, ctx = 1000]");
    assert_int_equal(kvb_case_parse("decode_step method=omnikv model=tiny B=1 ctx=1000 budget=0", "t", &c), KVB_EINVAL);
    assert_error_mentions("budget=0 out of range [1, ");
    assert_int_equal(kvb_case_parse("decode_step method=omnikv model=tiny B=1 ctx=0 budget=1", "t", &c), KVB_EINVAL);
    assert_error_mentions("budget=1 out of range [1, ctx = 0]: a budget larger than the context");
    assert_int_equal(kvb_case_parse("decode_step method=omnikv model=tiny B=1 ctx=0 all=1", "t", &c), KVB_EINVAL);
    assert_error_mentions("method=omnikv all=1: ctx=0 out of range [1, ");
    assert_int_equal(kvb_case_parse("decode_step method=dense role=filter model=tiny B=1 ctx=10", "t", &c), KVB_EINVAL);
    assert_error_mentions("method=dense: role=filter is not one of {sparse}: method=dense does not read role (omnikv does)");
    assert_int_equal(kvb_case_parse("decode_step method=rocketkv role=filter model=tiny B=1 ctx=1000 budget=256", "t",
                                    &c), KVB_EINVAL);
    assert_error_mentions("method=rocketkv: role=filter is not one of {sparse}: method=rocketkv does not read role (omnikv does)");
    assert_int_equal(kvb_case_parse("decode_step method=omnikv role=filter model=tiny B=1 ctx=100 budget=10 all=1", "t",
                                    &c), KVB_EINVAL);
    assert_error_mentions("method=omnikv role=filter: all=1 out of range [0, 0]");
    assert_int_equal(kvb_case_parse("decode_step method=omnikv role=mixed model=tiny B=1 ctx=100 budget=10", "t", &c),
                     KVB_EINVAL);
    assert_error_mentions("role=mixed is not one of sparse|filter");
    assert_int_equal(kvb_case_parse("decode_step method=omnikv model=llama3-8b B=64 ctx=131072", "t", &c), KVB_EINVAL);
    assert_error_mentions("method=omnikv: K and V take");
    assert_error_mentions("at most B=44 fits at ctx=131072");
    /* RocketKV's k = budget/2 past the tokens its kept cache holds: refused naming budget and ctx */
    assert_int_equal(kvb_case_parse("decode_step method=rocketkv model=llama3-8b B=1 ctx=97 budget=16", "t", &c),
                     KVB_EINVAL);
    assert_error_mentions("method=rocketkv: budget=16: k = budget/2 = 8 tokens to attend out of range [1, 2]",
                          "at ctx=97 the kept cache holds 1 prompt tokens");
    /* a key the method does not read is refused unless at its default: it would name a second id for the
     * same case */
    assert_int_equal(kvb_case_parse("decode_step method=dense model=tiny B=1 ctx=10 budget=256", "t", &c), KVB_EINVAL);
    assert_error_mentions("method=dense: budget=256 out of range [2048, 2048]: method=dense does not read budget",
                          "rocketkv, shadowkv, omnikv do");
    assert_int_equal(kvb_case_parse("decode_step method=dense model=tiny B=1 ctx=10 rank=32", "t", &c), KVB_EINVAL);
    assert_error_mentions("rank=32", "(shadowkv does)");
    assert_int_equal(kvb_case_parse("decode_step method=dense model=tiny B=1 ctx=10 hit=0.5", "t", &c), KVB_EINVAL);
    assert_error_mentions("hit=0.5 out of range [0.6, 0.6]");
    assert_int_equal(kvb_case_parse("decode_step method=minikv model=tiny B=1 ctx=100 budget=64", "t", &c), KVB_EINVAL);
    assert_error_mentions("method=minikv does not read budget");
    assert_int_equal(kvb_case_parse("decode_step method=rocketkv model=tiny B=1 ctx=1000 budget=256 rank=8", "t", &c),
                     KVB_EINVAL);
    assert_error_mentions("method=rocketkv does not read rank");
    assert_int_equal(kvb_case_parse("decode_step method=omnikv model=tiny B=1 ctx=1000 budget=64 hit=1", "t", &c),
                     KVB_EINVAL);
    assert_error_mentions("method=omnikv does not read hit");
    /* at its default, spelled out: the same case, the same id */
    kvb_case d;
    assert_int_equal(kvb_case_parse("decode_step method=dense model=tiny B=1 ctx=10 budget=2048 rank=160 hit=0.6", "t",
                                    &c), KVB_OK);
    assert_int_equal(kvb_case_parse("decode_step method=dense model=tiny B=1 ctx=10", "t", &d), KVB_OK);
    assert_string_equal(c.id, d.id);
    /* accepted: the default role for any method; all=1 on the sparse layer ignores budget (k = ctx) */
    assert_int_equal(kvb_case_parse("decode_step method=dense role=sparse model=tiny B=1 ctx=10", "t", &c), KVB_OK);
    assert_int_equal(kvb_case_parse("decode_step method=omnikv model=tiny B=1 ctx=100 all=1", "t", &c), KVB_OK);
    assert_int_equal(kvb_case_parse("decode_step method=omnikv role=filter model=tiny B=1 ctx=100 budget=100", "t", &c),
                     KVB_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rmsnorm),     cmocka_unit_test(test_linear_with_residual), cmocka_unit_test(test_rope_split),
        cmocka_unit_test(test_silu_mul),    cmocka_unit_test(test_block_cache_rows),
        cmocka_unit_test(test_decode_step_refusals),
    };
    return cmocka_run_group_tests_name("ref block", tests, NULL, NULL);
}
