/* test_ref_step_rocketkv.c: the reference of RocketKV's decode-time path (reference/step/step_rocketkv.c):
 *   - the step writes the new token's row t of K and V and nothing else, and updates only page t / P of
 *     the metadata, to the extrema of that page's tokens;
 *   - with every page chosen (k = t + 1) its output is dense decode over t + 1 tokens, bit for bit;
 *   - with fewer pages, its output is the sparse attention over the pages its own scoring chose, and
 *     those pages are the top ceil(k / P) of u;
 *   - both at GQA groups outside {1, 2, 4, 8} too (G = 3, and 7: Qwen2-7B's 28 query heads on 4 KV
 *     heads); and a group of G copies of one query head decodes as that head alone (G = 1): the same
 *     cache, metadata and pages, u times G, and each copy's output row bit for bit the single head's;
 *   - every refusal (P = 0, r outside [1, D], k = 0, a budget above the context, t outside the cache,
 *     metadata shorter than the cache) names the parameter, its value and the range. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "reference/kvb.h"
#include "reference/step/step_rocketkv.h"
#include "tests/testlib.h"

static double uniform(uint64_t *s)
{
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (double)(*s >> 11) * (1.0 / 9007199254740992.0) - 0.5;
}

static kvb_bf16 *random_bf16(int64_t n, uint64_t seed)
{
    kvb_bf16 *x = malloc(sizeof(kvb_bf16) * (size_t)n);
    for (int64_t i = 0; i < n; i++) x[i] = kvb_double_to_bf16(4 * uniform(&seed));
    return x;
}

typedef struct state {
    rocketkv_shape sh;
    kvb_bf16 *q, *knew, *vnew, *K, *V, *kmin, *kmax, *K0, *V0, *kmin0, *kmax0, *o;
    float *u;
    int32_t *pages;
    int npg, n_sel;
} state;

/* Random inputs; the metadata is built from K's first t rows (the state before the step). */
static void make(state *s, int B, int G, int Hkv, int C, int t, int P, int r, int k)
{
    memset(s, 0, sizeof *s);
    rocketkv_shape sh = {B, G * Hkv, Hkv, 64, C, t, P, r, k, page_cap_default(C, P)};
    s->sh = sh;
    const int64_t heads = (int64_t)B * Hkv, kv = heads * C * 64, meta = heads * 64 * sh.cap_pages;
    s->q = random_bf16((int64_t)B * sh.Hq * 64, 1);
    s->knew = random_bf16(heads * 64, 2);
    s->vnew = random_bf16(heads * 64, 3);
    s->K = random_bf16(kv, 4);
    s->V = random_bf16(kv, 5);
    s->kmin = malloc(sizeof(kvb_bf16) * (size_t)meta);
    s->kmax = malloc(sizeof(kvb_bf16) * (size_t)meta);
    kvb_bf16 *prefix = malloc(sizeof(kvb_bf16) * (size_t)(heads * (t ? t : 1) * 64));
    for (int64_t bh = 0; bh < heads; bh++) memcpy(prefix + bh * t * 64, s->K + bh * C * 64, sizeof(kvb_bf16) * (size_t)t * 64);
    page_layout built = {B, sh.Hq, Hkv, 64, t, P, sh.cap_pages};
    assert_int_equal(ref_page_meta_build(prefix, &built, s->kmin, s->kmax), KVB_OK);
    free(prefix);
    s->K0 = malloc(sizeof(kvb_bf16) * (size_t)kv), s->V0 = malloc(sizeof(kvb_bf16) * (size_t)kv);
    s->kmin0 = malloc(sizeof(kvb_bf16) * (size_t)meta), s->kmax0 = malloc(sizeof(kvb_bf16) * (size_t)meta);
    memcpy(s->K0, s->K, sizeof(kvb_bf16) * (size_t)kv), memcpy(s->V0, s->V, sizeof(kvb_bf16) * (size_t)kv);
    memcpy(s->kmin0, s->kmin, sizeof(kvb_bf16) * (size_t)meta), memcpy(s->kmax0, s->kmax, sizeof(kvb_bf16) * (size_t)meta);
    s->npg = page_count(t + 1, P), s->n_sel = hybrid_selected_pages(k, P);
    s->u = malloc(sizeof(float) * (size_t)(heads * s->npg));
    s->pages = malloc(sizeof(int32_t) * (size_t)(heads * s->n_sel));
    s->o = malloc(sizeof(kvb_bf16) * (size_t)B * sh.Hq * 64);
}

static void release(state *s)
{
    void *p[] = {s->q, s->knew, s->vnew, s->K, s->V, s->kmin, s->kmax, s->K0, s->V0, s->kmin0, s->kmax0, s->o, s->u, s->pages};
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++) free(p[i]);
}

static int step(state *s)
{
    return ref_rocketkv_step(s->q, s->knew, s->vnew, s->K, s->V, s->kmin, s->kmax, &s->sh, s->u, s->pages, s->o, NULL);
}

static void test_writes_row_t_and_page_t_over_P(void **st)
{
    (void)st;
    state s;
    make(&s, 2, 4, 2, 40, 29, 4, 16, 8); /* t = 29: the third token of page 7 */
    assert_int_equal(step(&s), KVB_OK);
    const rocketkv_shape *sh = &s.sh;
    for (int64_t bh = 0; bh < 4; bh++) {
        for (int row = 0; row < sh->cap_tokens; row++)
            for (int c = 0; c < 64; c++) {
                const int64_t i = (bh * sh->cap_tokens + row) * 64 + c;
                assert_int_equal(s.K[i], row == sh->t ? s.knew[bh * 64 + c] : s.K0[i]);
                assert_int_equal(s.V[i], row == sh->t ? s.vnew[bh * 64 + c] : s.V0[i]);
            }
        for (int c = 0; c < 64; c++)
            for (int j = 0; j < sh->cap_pages; j++) {
                const int64_t i = (bh * 64 + c) * sh->cap_pages + j;
                if (j != sh->t / sh->P) {
                    assert_int_equal(s.kmin[i], s.kmin0[i]);
                    assert_int_equal(s.kmax[i], s.kmax0[i]);
                    continue;
                }
                float lo = INFINITY, hi = -INFINITY; /* the page's tokens 28, 29 after the step */
                for (int tok = j * sh->P; tok <= sh->t; tok++) {
                    const float v = kvb_bf16_to_float(s.K[(bh * sh->cap_tokens + tok) * 64 + c]);
                    lo = fminf(lo, v), hi = fmaxf(hi, v);
                }
                assert_true(kvb_bf16_to_float(s.kmin[i]) == lo);
                assert_true(kvb_bf16_to_float(s.kmax[i]) == hi);
            }
    }
    release(&s);
}

/* B = 2 sequences, G query heads on Hkv KV heads */
static void check_every_page_is_dense_decode(int G, int Hkv)
{
    state s;
    make(&s, 2, G, Hkv, 50, 32, 3, 20, 33); /* t = 32 starts page 10 (partial: one token); k = t + 1 */
    assert_int_equal(step(&s), KVB_OK);
    const decode_layout d = {2, G * Hkv, Hkv, 64, 50};
    int32_t len[2] = {33, 33};
    kvb_bf16 *dense = malloc(sizeof(kvb_bf16) * 2 * G * Hkv * 64);
    assert_int_equal(ref_decode_attn(s.q, s.K, s.V, len, dense, &d, NULL), KVB_OK);
    for (int i = 0; i < 2 * G * Hkv * 64; i++) assert_int_equal(s.o[i], dense[i]);
    for (int i = 0; i < 2 * Hkv * s.n_sel; i++) assert_int_equal(s.pages[i], i % s.n_sel); /* all 11 pages, ascending */
    free(dense);
    release(&s);
}

static void test_every_page_is_dense_decode(void **st)
{
    (void)st;
    check_every_page_is_dense_decode(8, 1);
}

/* B = 1 sequence, G query heads on Hkv KV heads */
static void check_sparse_over_its_own_top_pages(int G, int Hkv)
{
    state s;
    make(&s, 1, G, Hkv, 64, 47, 4, 8, 10); /* ceil(10 / 4) = 3 of 12 pages */
    assert_int_equal(step(&s), KVB_OK);
    sparse_layout att = {{1, G * Hkv, Hkv, 64, 64}, s.n_sel, 4};
    int32_t len[1] = {48}, cnt[1] = {s.n_sel};
    kvb_bf16 *sparse = malloc(sizeof(kvb_bf16) * G * Hkv * 64);
    assert_int_equal(ref_sparse_attn_pages(s.q, s.K, s.V, len, s.pages, cnt, sparse, &att, NULL), KVB_OK);
    for (int i = 0; i < G * Hkv * 64; i++) assert_int_equal(s.o[i], sparse[i]);
    free(sparse);
    for (int h = 0; h < Hkv; h++) { /* ascending, and no page outside the list scores above one inside */
        const int32_t *p = s.pages + h * s.n_sel;
        const float *u = s.u + h * s.npg;
        float lowest = INFINITY;
        for (int i = 0; i < s.n_sel; i++) {
            if (i) assert_true(p[i] > p[i - 1]);
            lowest = fminf(lowest, u[p[i]]);
        }
        for (int j = 0; j < s.npg; j++) {
            int listed = 0;
            for (int i = 0; i < s.n_sel; i++) listed |= p[i] == j;
            if (!listed) assert_true(u[j] <= lowest);
        }
    }
    release(&s);
}

static void test_sparse_over_its_own_top_pages(void **st)
{
    (void)st;
    check_sparse_over_its_own_top_pages(2, 2);
}

/* The two properties above at G = 3 and G = 7 (Qwen2-7B: Hq = 28, Hkv = 4). */
static void test_odd_gqa_groups(void **st)
{
    (void)st;
    check_every_page_is_dense_decode(7, 2);
    check_every_page_is_dense_decode(3, 4);
    check_sparse_over_its_own_top_pages(7, 4);
    check_sparse_over_its_own_top_pages(3, 2);
}

/* Each KV head's G query heads all carry the query of the single-head step (G = 1, the same cache and
 * new rows): the channel scores, signs and tau are G times / equal to the single head's, so the same
 * pages are chosen, u is G times the single head's (within a few fp32 ulp), and each of the G output
 * rows is the single head's row, bit for bit. */
static void test_repeated_heads_are_one_head(void **st)
{
    (void)st;
    const int B = 2, Hkv = 4, G = 7;
    state one, grp;
    make(&one, B, 1, Hkv, 64, 47, 4, 8, 10);
    make(&grp, B, G, Hkv, 64, 47, 4, 8, 10);
    for (int bh = 0; bh < B * Hkv; bh++)
        for (int h = 0; h < G; h++) memcpy(grp.q + ((int64_t)bh * G + h) * 64, one.q + (int64_t)bh * 64, sizeof(kvb_bf16) * 64);
    assert_int_equal(step(&one), KVB_OK);
    assert_int_equal(step(&grp), KVB_OK);
    const int64_t kv = (int64_t)B * Hkv * 64 * 64, meta = (int64_t)B * Hkv * 64 * one.sh.cap_pages;
    assert_memory_equal(grp.K, one.K, sizeof(kvb_bf16) * kv), assert_memory_equal(grp.V, one.V, sizeof(kvb_bf16) * kv);
    assert_memory_equal(grp.kmin, one.kmin, sizeof(kvb_bf16) * meta);
    assert_memory_equal(grp.kmax, one.kmax, sizeof(kvb_bf16) * meta);
    assert_memory_equal(grp.pages, one.pages, sizeof(int32_t) * B * Hkv * one.n_sel);
    for (int i = 0; i < B * Hkv * one.npg; i++) assert_true(fabs(grp.u[i] - (double)G * one.u[i]) <= 1e-6 * G * one.u[i]);
    for (int bh = 0; bh < B * Hkv; bh++)
        for (int h = 0; h < G; h++)
            assert_memory_equal(grp.o + ((int64_t)bh * G + h) * 64, one.o + (int64_t)bh * 64, sizeof(kvb_bf16) * 64);
    release(&one);
    release(&grp);
}

static void test_refusals(void **st)
{
    (void)st;
    const rocketkv_shape ok = {2, 32, 8, 128, 12765, 12715, 3, 62, 1024, page_cap_default(12765, 3)};
    assert_int_equal(rocketkv_shape_check(&ok), KVB_OK);
    rocketkv_shape s = ok;
    s.P = 0;
    assert_int_equal(rocketkv_shape_check(&s), KVB_EINVAL);
    assert_error_mentions("rocketkv_step: P=0 out of range [1, 4096]");
    s = ok, s.r = 0;
    assert_int_equal(rocketkv_shape_check(&s), KVB_EINVAL);
    assert_error_mentions("rocketkv_step: r=0 out of range [1, 128]");
    s = ok, s.r = 129;
    assert_int_equal(rocketkv_shape_check(&s), KVB_EINVAL);
    assert_error_mentions("rocketkv_step: r=129 out of range [1, 128]");
    s = ok, s.k = 0;
    assert_int_equal(rocketkv_shape_check(&s), KVB_EINVAL);
    assert_error_mentions("rocketkv_step: k=0 tokens to attend out of range [1, L = 12716]");
    s = ok, s.k = 12717; /* a token budget above the context */
    assert_int_equal(rocketkv_shape_check(&s), KVB_EINVAL);
    assert_error_mentions("k=12717", "[1, L = 12716]");
    s = ok, s.t = 12765;
    assert_int_equal(rocketkv_shape_check(&s), KVB_EINVAL);
    assert_error_mentions("rocketkv_step: t=12765 out of range [0, 12764]");
    s = ok, s.cap_pages = 4248; /* ceil(12765 / 3) = 4255 pages: metadata shorter than the cache */
    assert_int_equal(rocketkv_shape_check(&s), KVB_EINVAL);
    assert_error_mentions("cap=4248 out of range", "4255");
    for (int G = 1; G <= 8; G++) { /* every GQA group the stages take */
        s = ok, s.Hq = 8 * G;
        assert_int_equal(rocketkv_shape_check(&s), KVB_OK);
    }
    s = ok, s.Hq = 72;
    assert_int_equal(rocketkv_shape_check(&s), KVB_EINVAL);
    assert_error_mentions("rocketkv_step: Hq=72 out of range [8, 64]");
    s = ok, s.cap_tokens = 0;
    assert_int_equal(rocketkv_shape_check(&s), KVB_EINVAL);
    assert_error_mentions("rocketkv_step: C=0 out of range [1, 1048576]");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_writes_row_t_and_page_t_over_P),
        cmocka_unit_test(test_every_page_is_dense_decode),
        cmocka_unit_test(test_sparse_over_its_own_top_pages),
        cmocka_unit_test(test_odd_gqa_groups),
        cmocka_unit_test(test_repeated_heads_are_one_head),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests_name("ref step_rocketkv", tests, NULL, NULL);
}
