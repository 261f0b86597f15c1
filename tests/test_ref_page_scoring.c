/* test_ref_page_scoring.c: the page-scoring references (reference/page_scoring.c) against hand-worked
 * examples and properties that follow from kernels/page_scoring/NOTES.md independently of how the code
 * computes them:
 *   - RocketKV's budget knobs against the values that note lists;
 *   - build: extrema of hand-made pages (partial last page, +inf/-inf past it, -0/+0 kept in token order);
 *     append(build(t tokens), key t) == build(t + 1 tokens) across page boundaries; a page start
 *     overwrites whatever the entry held;
 *   - hybrid: a hand-computed instance of the formula; ties among channel scores go to the lower channel;
 *     sg == 0 reads kmin; with P = 1 and r = D it is the exact attention softmax summed over the group;
 *     the masses sum to G; a zero query weighs every token alike; k = L selects every page;
 *   - GQA groups G in [1, 8] (Qwen2's G = 7, and 3, 5, 6): the attention and mass identities above; a
 *     group of G copies of one query head scores as that head alone (hybrid: u x G, the same channels
 *     and pages; Quest: the same scores and pages); Quest's score is the max of its heads' own scores;
 *   - Quest: a score bounds q . k of every key of its page from above; the last page is always listed;
 *   - every refusal names the parameter, its value and the range. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "reference/kvb.h"
#include "reference/page_scoring.h"
#include "tests/testlib.h"

#define PINF ((kvb_bf16)0x7F80)
#define NINF ((kvb_bf16)0xFF80)

static kvb_bf16 bf(double x) { return kvb_double_to_bf16(x); }

static double normal(uint64_t *s)
{
    double u[2];
    for (int i = 0; i < 2; i++) {
        *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
        u[i] = ((*s >> 11) + 0.5) * (1.0 / 9007199254740992.0);
    }
    return sqrt(-2 * log(u[0])) * cos(6.283185307179586 * u[1]);
}

static void fill_normal(kvb_bf16 *x, int64_t n, uint64_t seed)
{
    for (int64_t i = 0; i < n; i++) x[i] = bf(normal(&seed));
}

static page_layout layout(int B, int Hq, int Hkv, int D, int L, int P)
{
    page_layout s = {B, Hq, Hkv, D, L, P, page_cap_default(L, P)};
    return s;
}

static int64_t meta_n(const page_layout *s) { return (int64_t)s->B * s->Hkv * s->D * s->cap; }

/* ---- budget knobs ---- */

static void test_budget_table(void **state)
{
    (void)state;
    rocketkv_knobs k;
    /* the values of kernels/page_scoring/NOTES.md at Lmax = 32K; M = 50 */
    assert_int_equal(rocketkv_budget(256, 32768, 128, 50, &k), KVB_OK);
    assert_int_equal(k.C, 1618), assert_int_equal(k.P, 3), assert_int_equal(k.r, 61);
    assert_int_equal(k.k, 128), assert_int_equal(k.prompt, 1618 - 50);
    assert_int_equal(rocketkv_budget(2048, 32768, 128, 50, &k), KVB_OK);
    assert_int_equal(k.C, 9674), assert_int_equal(k.P, 3), assert_int_equal(k.r, 81), assert_int_equal(k.k, 1024);
    assert_int_equal(rocketkv_budget(4096, 32768, 128, 50, &k), KVB_OK);
    assert_int_equal(k.P, 2), assert_int_equal(k.r, 71), assert_int_equal(k.k, 2048);
    /* intermediate values of the formula at T = 256: c = 128, alpha = 0.2 + 0.06 * 7 */
    assert_true(fabs(k.c - 8.0) < 1e-12); /* T = 4096: c = 32768 / 4096 */
    assert_int_equal(rocketkv_budget(256, 32768, 128, 50, &k), KVB_OK);
    assert_true(fabs(k.c - 128.0) < 1e-12), assert_true(fabs(k.alpha - 0.62) < 1e-12);
    /* no compression: T >= Lmax gives c = 1, alpha = 0.2, C = Lmax, P = 1, r = D */
    assert_int_equal(rocketkv_budget(4096, 1000, 128, 0, &k), KVB_OK);
    assert_int_equal(k.C, 1000), assert_int_equal(k.P, 1), assert_int_equal(k.r, 128);
    /* the large-compression end: alpha is capped at 0.8 (c = 2^11: 0.2 + 0.66 > 0.8) */
    assert_int_equal(rocketkv_budget(64, 131072, 128, 0, &k), KVB_OK);
    assert_true(fabs(k.alpha - 0.8) < 1e-12);
    assert_true(k.r >= 1 && k.r <= 128 && k.P >= 1);
}

static void test_budget_refusals(void **state)
{
    (void)state;
    rocketkv_knobs k;
    assert_int_equal(rocketkv_budget(1, 32768, 128, 0, &k), KVB_EINVAL);
    assert_error_mentions("T=1 out of range [2, ");
    assert_int_equal(rocketkv_budget(0, 32768, 128, 0, &k), KVB_EINVAL);
    assert_error_mentions("T=0 out of range");
    assert_int_equal(rocketkv_budget(256, 0, 128, 0, &k), KVB_EINVAL);
    assert_error_mentions("Lmax=0 out of range");
    assert_int_equal(rocketkv_budget(256, 32768, 128, 1619, &k), KVB_EINVAL);
    assert_error_mentions("M=1619 out of range [0, C = 1618]");
}

/* ---- layout refusals ---- */

static void test_layout_refusals(void **state)
{
    (void)state;
    page_layout s = layout(1, 32, 8, 128, 1000, 3);
    assert_int_equal(page_layout_check(&s, "t"), KVB_OK);
    s.P = 0;
    assert_int_equal(page_layout_check(&s, "t"), KVB_EINVAL);
    assert_error_mentions("t: P=0 out of range [1, 4096]");
    s = layout(1, 32, 8, 128, 1000, 3);
    s.cap = 328; /* ceil(1000/3) = 334 */
    assert_int_equal(page_layout_check(&s, "t"), KVB_EINVAL);
    assert_error_mentions("cap=328 out of range", "ceil(L/P) = ceil(1000/3) = 334");
    s.cap = 340; /* enough, not a multiple of 8 */
    assert_int_equal(page_layout_check(&s, "t"), KVB_EINVAL);
    assert_error_mentions("cap=340 out of range", "a multiple of 8");
    for (int G = 1; G <= 8; G++) { /* every group size the kernels take */
        s = layout(1, 8 * G, 8, 128, 1000, 3);
        assert_int_equal(page_layout_check(&s, "t"), KVB_OK);
    }
    s = layout(1, 72, 8, 128, 1000, 3);
    assert_int_equal(page_layout_check(&s, "t"), KVB_EINVAL);
    assert_error_mentions("t: G = Hq/Hkv = 72/8 = 9 out of range [1, 8]");
    s = layout(1, 32, 8, 100, 1000, 3);
    assert_int_equal(page_layout_check(&s, "t"), KVB_EINVAL);
    assert_error_mentions("D=100 out of range: a multiple of 8 in [8, 256]");
    s = layout(1, 30, 8, 128, 1000, 3);
    assert_int_equal(page_layout_check(&s, "t"), KVB_EINVAL);
    assert_error_mentions("Hq=30 is not a multiple of Hkv=8");
    s = layout(1, 32, 8, 128, 8000000, 2); /* 4M pages */
    assert_int_equal(page_layout_check(&s, "t"), KVB_EINVAL);
    assert_error_mentions("ceil(L/P) = ceil(8000000/2) = 4000000 pages out of range [1, 2097152]");
}

/* ---- build and append ---- */

/* One head, D = 8, L = 5, P = 2: K[t][c] = (t + 1) * (c even ? 1 : -1) + c / 4. Pages {0, 1}, {2, 3},
 * {4} (partial); cap 8: pages 3..7 empty. */
static void test_build_by_hand(void **state)
{
    (void)state;
    page_layout s = {1, 1, 1, 8, 5, 2, 8};
    kvb_bf16 K[5 * 8], mn[8 * 8], mx[8 * 8];
    for (int t = 0; t < 5; t++)
        for (int c = 0; c < 8; c++) K[t * 8 + c] = bf((t + 1) * (c % 2 ? -1 : 1) + c / 4);
    assert_int_equal(ref_page_meta_build(K, &s, mn, mx), KVB_OK);
    const int first[3] = {0, 2, 4}, last[3] = {1, 3, 4};
    for (int c = 0; c < 8; c++) {
        const double sign = c % 2 ? -1 : 1, off = c / 4;
        for (int j = 0; j < 3; j++) {
            const double a = (first[j] + 1) * sign + off, b = (last[j] + 1) * sign + off;
            assert_true(kvb_bf16_to_double(mn[c * 8 + j]) == fmin(a, b));
            assert_true(kvb_bf16_to_double(mx[c * 8 + j]) == fmax(a, b));
        }
        for (int j = 3; j < 8; j++) assert_int_equal(mn[c * 8 + j], PINF), assert_int_equal(mx[c * 8 + j], NINF);
    }
    /* -0 and +0 compare equal: the first token's zero is kept, bit for bit */
    page_layout z = {1, 1, 1, 8, 2, 2, 8};
    kvb_bf16 K2[2 * 8], mn2[64], mx2[64];
    for (int c = 0; c < 8; c++) K2[c] = c % 2 ? 0x8000 : 0x0000, K2[8 + c] = c % 2 ? 0x0000 : 0x8000;
    assert_int_equal(ref_page_meta_build(K2, &z, mn2, mx2), KVB_OK);
    for (int c = 0; c < 8; c++) assert_int_equal(mn2[c * 8], K2[c]), assert_int_equal(mx2[c * 8], K2[c]);
}

/* append(build(t), K[t]) == build(t + 1), for every t of a context with P = 3 (B = 2, Hkv = 2). */
static void test_append_equals_build(void **state)
{
    (void)state;
    const int L = 14, P = 3, D = 16, B = 2, Hkv = 2;
    kvb_bf16 *K = malloc(sizeof(kvb_bf16) * B * Hkv * L * D);
    fill_normal(K, (int64_t)B * Hkv * L * D, 5);
    const int cap = page_cap_default(L, P);
    const int64_t n = (int64_t)B * Hkv * D * cap;
    kvb_bf16 *mn = malloc(2 * n), *mx = malloc(2 * n), *mn1 = malloc(2 * n), *mx1 = malloc(2 * n);
    kvb_bf16 *Kt = malloc(sizeof(kvb_bf16) * B * Hkv * L * D), *k = malloc(sizeof(kvb_bf16) * B * Hkv * D);
    for (int t = 1; t < L; t++) {
        /* the first t tokens of every sequence, as a cache of t tokens */
        for (int bh = 0; bh < B * Hkv; bh++)
            memcpy(Kt + (int64_t)bh * t * D, K + (int64_t)bh * L * D, sizeof(kvb_bf16) * t * D);
        page_layout st = {B, Hkv, Hkv, D, t, P, cap}, st1 = {B, Hkv, Hkv, D, t + 1, P, cap};
        assert_int_equal(ref_page_meta_build(Kt, &st, mn, mx), KVB_OK);
        for (int bh = 0; bh < B * Hkv; bh++) memcpy(k + bh * D, K + ((int64_t)bh * L + t) * D, sizeof(kvb_bf16) * D);
        const int32_t pos[2] = {t, t};
        page_layout sa = {B, Hkv, Hkv, D, L, P, cap};
        assert_int_equal(ref_page_meta_append(k, pos, &sa, mn, mx), KVB_OK);
        for (int bh = 0; bh < B * Hkv; bh++)
            memcpy(Kt + (int64_t)bh * (t + 1) * D, K + (int64_t)bh * L * D, sizeof(kvb_bf16) * (t + 1) * D);
        assert_int_equal(ref_page_meta_build(Kt, &st1, mn1, mx1), KVB_OK);
        assert_memory_equal(mn, mn1, 2 * n);
        assert_memory_equal(mx, mx1, 2 * n);
    }
    free(K), free(mn), free(mx), free(mn1), free(mx1), free(Kt), free(k);
}

/* t % P == 0: the entry becomes k, whatever it held (a stale pair smaller and larger than k). */
static void test_append_overwrites_at_page_start(void **state)
{
    (void)state;
    page_layout s = {2, 1, 1, 8, 32, 4, 8};
    kvb_bf16 mn[2 * 8 * 8], mx[2 * 8 * 8], k[2 * 8];
    for (int i = 0; i < 2 * 8 * 8; i++) mn[i] = bf(-100), mx[i] = bf(100);
    for (int i = 0; i < 16; i++) k[i] = bf(i - 3);
    const int32_t t[2] = {8, 9}; /* b = 0 starts page 2; b = 1 extends it */
    assert_int_equal(ref_page_meta_append(k, t, &s, mn, mx), KVB_OK);
    for (int c = 0; c < 8; c++) {
        assert_int_equal(mn[c * 8 + 2], k[c]), assert_int_equal(mx[c * 8 + 2], k[c]);
        assert_int_equal(mn[64 + c * 8 + 2], bf(-100)), assert_int_equal(mx[64 + c * 8 + 2], bf(100));
        for (int j = 0; j < 8; j++)
            if (j != 2) assert_int_equal(mn[c * 8 + j], bf(-100));
    }
    const int32_t bad[2] = {8, 32};
    assert_int_equal(ref_page_meta_append(k, bad, &s, mn, mx), KVB_EINVAL);
    assert_error_mentions("t[1]=32 out of range [0, L-1 = 31]");
}

/* ---- hybrid ---- */

/* G = 1, D = 8, L = 4, P = 2, r = 1: q = (1, -3, 0.5, 0, ...). a = |q|: channel 1; sg = -3 < 0: kmin row 1
 * = (-1, 2); tau = sqrt(8 * 3 / 4.5); z_j = -3 kmin[1][j] / tau; n_j = 2; u_j = exp(z_j) / sum 2 exp(z). */
static void test_hybrid_by_hand(void **state)
{
    (void)state;
    page_layout s = {1, 1, 1, 8, 4, 2, 8};
    kvb_bf16 q[8] = {0}, mn[64], mx[64];
    q[0] = bf(1), q[1] = bf(-3), q[2] = bf(0.5);
    for (int i = 0; i < 64; i++) mn[i] = bf(-7), mx[i] = bf(9); /* rows the formula must not read */
    mn[8 + 0] = bf(-1), mn[8 + 1] = bf(2);
    float u[2];
    int32_t pages[1], ch[1];
    assert_int_equal(ref_hybrid_score(q, mn, mx, &s, 1, 2, u, pages, ch), KVB_OK);
    assert_int_equal(ch[0], 1);
    const double tau = sqrt(8.0 * 3.0 / 4.5), z0 = 3.0 / tau, z1 = -6.0 / tau;
    const double sum = 2 * exp(z0) + 2 * exp(z1);
    assert_true(fabs(u[0] - exp(z0) / sum) < 1e-7 * (exp(z0) / sum));
    assert_true(fabs(u[1] - exp(z1) / sum) < 1e-7 * (exp(z1) / sum));
    assert_int_equal(pages[0], 0); /* ceil(2 / 2) = 1 page: the larger u */
    /* r = 2: channels 0 and 1 (a = 1, 3); sg(0) = 1 > 0: kmax row 0 */
    mx[0] = bf(0.5), mx[1] = bf(-0.25);
    int32_t ch2[2];
    assert_int_equal(ref_hybrid_score(q, mn, mx, &s, 2, 4, u, NULL, ch2), KVB_OK);
    assert_int_equal(ch2[0], 0), assert_int_equal(ch2[1], 1);
    const double tau2 = sqrt(8.0 * 4.0 / 4.5), y0 = (0.5 + 3.0) / tau2, y1 = (-0.25 - 6.0) / tau2;
    const double sum2 = 2 * exp(y0) + 2 * exp(y1);
    assert_true(fabs(u[0] - exp(y0) / sum2) < 1e-7 * (exp(y0) / sum2));
    assert_true(fabs(u[1] - exp(y1) / sum2) < 1e-7 * (exp(y1) / sum2));
}

/* Equal channel scores: the lower channels are chosen. sg == 0 (q of the two heads cancel): kmin is read,
 * kmax is not. */
static void test_hybrid_ties_and_zero_sign(void **state)
{
    (void)state;
    page_layout s = {1, 2, 1, 16, 10, 2, 8};
    kvb_bf16 q[32], mn[16 * 8], mx[16 * 8];
    for (int c = 0; c < 16; c++) q[c] = bf(c % 2 ? 0.5 : -0.5), q[16 + c] = bf(c % 3 ? 0.5 : -0.5);
    fill_normal(mn, 16 * 8, 3);
    for (int i = 0; i < 16 * 8; i++) mx[i] = bf(kvb_bf16_to_double(mn[i]) + 1);
    float u[5], u2[5];
    int32_t ch[5];
    assert_int_equal(ref_hybrid_score(q, mn, mx, &s, 5, 4, u, NULL, ch), KVB_OK);
    for (int i = 0; i < 5; i++) assert_int_equal(ch[i], i); /* |q| sums all 1: ties everywhere */
    /* channels where sg = 0: c % 2 != (c % 3 != 0), e.g. c = 0 (-0.5, -0.5: sg < 0), c = 1 (0.5, 0.5),
     * c = 2 (-0.5 + 0.5 = 0), c = 3 (0.5 - 0.5 = 0): changing kmax on 2 and 3 changes nothing */
    for (int j = 0; j < 8; j++) mx[2 * 8 + j] = bf(50), mx[3 * 8 + j] = bf(-50);
    assert_int_equal(ref_hybrid_score(q, mn, mx, &s, 5, 4, u2, NULL, ch), KVB_OK);
    assert_memory_equal(u, u2, sizeof u);
    mn[2 * 8 + 1] = bf(kvb_bf16_to_double(mn[2 * 8 + 1]) + 4); /* but kmin is read there */
    assert_int_equal(ref_hybrid_score(q, mn, mx, &s, 5, 4, u2, NULL, ch), KVB_OK);
    assert_true(u2[1] != u[1]);
}

/* P = 1, r = D: kmin = kmax = K, tau = sqrt(D), so z is the attention logit q . k / sqrt(D) and u[j] is the
 * sum over the group's heads of the exact attention probabilities of token j. */
static void check_hybrid_attention_at_page_one(int G)
{
    const int B = 2, Hkv = 2, D = 32, L = 37;
    page_layout s = layout(B, G * Hkv, Hkv, D, L, 1);
    kvb_bf16 *q = malloc(2 * B * G * Hkv * D), *K = malloc(2 * B * Hkv * L * D);
    fill_normal(q, B * G * Hkv * D, 1);
    fill_normal(K, B * Hkv * L * D, 2);
    kvb_bf16 *mn = malloc(2 * meta_n(&s)), *mx = malloc(2 * meta_n(&s));
    assert_int_equal(ref_page_meta_build(K, &s, mn, mx), KVB_OK);
    float *u = malloc(sizeof(float) * B * Hkv * L);
    int32_t *ch = malloc(sizeof(int32_t) * B * Hkv * D);
    assert_int_equal(ref_hybrid_score(q, mn, mx, &s, D, L, u, NULL, ch), KVB_OK);
    for (int bh = 0; bh < B * Hkv; bh++) {
        double want[37] = {0};
        for (int h = 0; h < G; h++) {
            double logit[37], m = -INFINITY, sum = 0;
            for (int t = 0; t < L; t++) {
                double dot = 0;
                for (int c = 0; c < D; c++)
                    dot += kvb_bf16_to_double(q[(bh * G + h) * D + c]) * kvb_bf16_to_double(K[((int64_t)bh * L + t) * D + c]);
                logit[t] = dot / sqrt((double)D);
                m = fmax(m, logit[t]);
            }
            for (int t = 0; t < L; t++) sum += exp(logit[t] - m);
            for (int t = 0; t < L; t++) want[t] += exp(logit[t] - m) / sum;
        }
        for (int t = 0; t < L; t++) assert_true(fabs(u[bh * L + t] - want[t]) <= 1e-6 * want[t] + 1e-12);
        for (int c = 0; c < D; c++) assert_int_equal(ch[bh * D + c], c);
    }
    free(q), free(K), free(mn), free(mx), free(u), free(ch);
}

static void test_hybrid_is_attention_at_page_one(void **state)
{
    (void)state;
    check_hybrid_attention_at_page_one(4);
}

/* Random metadata: per KV head sum_j n_j u[j] = G; k = L lists every page; a zero query gives every
 * token the same mass, u[j] = G / L. */
static void check_hybrid_mass_and_edges(int G)
{
    const int B = 2, Hkv = 3, D = 24, L = 29, P = 4, n = 8;
    page_layout s = layout(B, G * Hkv, Hkv, D, L, P);
    kvb_bf16 *q = malloc(2 * B * G * Hkv * D), *mn = malloc(2 * meta_n(&s)), *mx = malloc(2 * meta_n(&s));
    fill_normal(q, B * G * Hkv * D, 7);
    fill_normal(mn, meta_n(&s), 8);
    for (int64_t i = 0; i < meta_n(&s); i++) mx[i] = bf(kvb_bf16_to_double(mn[i]) + 0.75);
    float u[2 * 3 * 8];
    int32_t pages[2 * 3 * 8];
    assert_int_equal(ref_hybrid_score(q, mn, mx, &s, 7, L, u, pages, NULL), KVB_OK);
    for (int bh = 0; bh < B * Hkv; bh++) {
        double mass = 0;
        for (int j = 0; j < n; j++) mass += page_tokens(&s, j) * (double)u[bh * n + j];
        assert_true(fabs(mass - G) < 1e-6);
        for (int j = 0; j < n; j++) assert_int_equal(pages[bh * n + j], j);
    }
    for (int i = 0; i < B * G * Hkv * D; i++) q[i] = 0;
    assert_int_equal(ref_hybrid_score(q, mn, mx, &s, 7, 8, u, NULL, NULL), KVB_OK);
    for (int i = 0; i < B * Hkv * n; i++) assert_true(fabs(u[i] - (double)G / L) < 1e-7);
    free(q), free(mn), free(mx);
}

static void test_hybrid_mass_and_edges(void **state)
{
    (void)state;
    check_hybrid_mass_and_edges(2);
}

/* G outside {1, 2, 4, 8}: the identities above at G = 3, 5, 6, 7 (Qwen2-7B: 28 query heads on 4 KV heads). */
static void test_hybrid_identities_at_odd_groups(void **state)
{
    (void)state;
    const int groups[] = {3, 5, 6, 7};
    for (int i = 0; i < 4; i++) {
        check_hybrid_attention_at_page_one(groups[i]);
        check_hybrid_mass_and_edges(groups[i]);
    }
}

/* q of each KV head's group repeated (the same query row in each of its G heads): a = G |q|, sg = G q
 * and every tau_h, z_h and lse_h are the single head's, so the channels and pages are those of the group
 * of one (G = 1, the same metadata) and u = G times its u (each rounded once to fp32: within a few ulp). */
static void test_hybrid_repeated_heads_are_one_head(void **state)
{
    (void)state;
    const int B = 2, Hkv = 4, D = 32, L = 100, P = 3, r = 9, k = 20, n = 34, n_sel = 7;
    page_layout s1 = layout(B, Hkv, Hkv, D, L, P);
    kvb_bf16 *q1 = malloc(2 * B * Hkv * D), *mn = malloc(2 * meta_n(&s1)), *mx = malloc(2 * meta_n(&s1));
    fill_normal(q1, B * Hkv * D, 21);
    fill_normal(mn, meta_n(&s1), 22);
    for (int64_t i = 0; i < meta_n(&s1); i++) mx[i] = bf(kvb_bf16_to_double(mn[i]) + 0.5);
    float u1[2 * 4 * 34], uG[2 * 4 * 34];
    int32_t p1[2 * 4 * 7], pG[2 * 4 * 7], c1[2 * 4 * 9], cG[2 * 4 * 9];
    assert_int_equal(ref_hybrid_score(q1, mn, mx, &s1, r, k, u1, p1, c1), KVB_OK);
    for (int G = 2; G <= 8; G++) {
        page_layout sG = layout(B, G * Hkv, Hkv, D, L, P);
        kvb_bf16 *qG = malloc(2 * B * G * Hkv * D);
        for (int bh = 0; bh < B * Hkv; bh++)
            for (int h = 0; h < G; h++) memcpy(qG + (bh * G + h) * D, q1 + bh * D, 2 * D);
        assert_int_equal(ref_hybrid_score(qG, mn, mx, &sG, r, k, uG, pG, cG), KVB_OK);
        assert_memory_equal(cG, c1, sizeof c1);
        assert_memory_equal(pG, p1, sizeof(int32_t) * B * Hkv * n_sel);
        for (int i = 0; i < B * Hkv * n; i++) assert_true(fabs(uG[i] - (double)G * u1[i]) <= 1e-6 * G * u1[i]);
        free(qG);
    }
    free(q1), free(mn), free(mx);
}

static void test_hybrid_refusals(void **state)
{
    (void)state;
    page_layout s = layout(1, 4, 1, 16, 100, 4);
    kvb_bf16 q[64] = {0}, mn[16 * 32] = {0}, mx[16 * 32] = {0};
    float u[25];
    int32_t p[25];
    assert_int_equal(ref_hybrid_score(q, mn, mx, &s, 0, 10, u, p, NULL), KVB_EINVAL);
    assert_error_mentions("r=0 out of range [1, 16]");
    assert_int_equal(ref_hybrid_score(q, mn, mx, &s, 17, 10, u, p, NULL), KVB_EINVAL);
    assert_error_mentions("r=17 out of range [1, 16]");
    assert_int_equal(ref_hybrid_score(q, mn, mx, &s, 4, 0, u, p, NULL), KVB_EINVAL);
    assert_error_mentions("k=0 tokens to attend out of range [1, L = 100]");
    assert_int_equal(ref_hybrid_score(q, mn, mx, &s, 4, 101, u, p, NULL), KVB_EINVAL);
    assert_error_mentions("k=101 tokens to attend out of range [1, L = 100]");
    s.P = 0;
    assert_int_equal(ref_hybrid_score(q, mn, mx, &s, 4, 10, u, p, NULL), KVB_EINVAL);
    assert_error_mentions("ref_hybrid_score: P=0 out of range");
    s = layout(1, 4, 1, 16, 100, 4);
    s.cap = 24; /* 25 pages */
    assert_int_equal(ref_hybrid_score(q, mn, mx, &s, 4, 10, u, p, NULL), KVB_EINVAL);
    assert_error_mentions("cap=24 out of range", "ceil(L/P) = ceil(100/4) = 25");
}

/* ---- Quest ---- */

/* Every page score bounds q . k of every key of the page, for every head of the group, from above; and
 * for a page of one token it is exactly max_h q . k. The last page is always listed. */
static void check_quest_bounds_and_last_page(int G)
{
    const int B = 2, Hkv = 2, D = 16, L = 45, P = 4, n = 12, budget = 20;
    page_layout s = layout(B, G * Hkv, Hkv, D, L, P);
    kvb_bf16 *q = malloc(2 * B * G * Hkv * D), *K = malloc(2 * B * Hkv * L * D);
    fill_normal(q, B * G * Hkv * D, 11);
    fill_normal(K, B * Hkv * L * D, 12);
    kvb_bf16 *mn = malloc(2 * meta_n(&s)), *mx = malloc(2 * meta_n(&s));
    assert_int_equal(ref_page_meta_build(K, &s, mn, mx), KVB_OK);
    float sc[2 * 2 * 12];
    int32_t pages[2 * 2 * 5];
    assert_int_equal(ref_quest_score(q, mn, mx, &s, budget, sc, pages), KVB_OK);
    for (int bh = 0; bh < B * Hkv; bh++) {
        for (int t = 0; t < L; t++)
            for (int h = 0; h < G; h++) {
                double dot = 0;
                for (int c = 0; c < D; c++)
                    dot += kvb_bf16_to_double(q[(bh * G + h) * D + c]) * kvb_bf16_to_double(K[((int64_t)bh * L + t) * D + c]);
                assert_true(sc[bh * n + t / P] >= dot - 1e-4 * fabs(dot));
                if (t == L - 1) { /* the last page holds one token */
                    double best = -INFINITY;
                    for (int h2 = 0; h2 < G; h2++) {
                        double d2 = 0;
                        for (int c = 0; c < D; c++)
                            d2 += kvb_bf16_to_double(q[(bh * G + h2) * D + c]) *
                                  kvb_bf16_to_double(K[((int64_t)bh * L + t) * D + c]);
                        best = fmax(best, d2);
                    }
                    assert_true(fabs(sc[bh * n + n - 1] - best) <= 1e-6 * fabs(best) + 1e-6);
                }
            }
        /* budget / P = 5 pages: the 4 best of pages 0..10, then page 11 */
        assert_int_equal(pages[bh * 5 + 4], n - 1);
        for (int i = 0; i < 4; i++) {
            int beaten_by = 0;
            const int j = pages[bh * 5 + i];
            assert_true(j >= 0 && j < n - 1);
            if (i) assert_true(pages[bh * 5 + i - 1] < j);
            for (int o = 0; o < n - 1; o++) beaten_by += sc[bh * n + o] > sc[bh * n + j];
            assert_true(beaten_by < 4);
        }
    }
    free(q), free(K), free(mn), free(mx);
}

static void test_quest_bounds_and_last_page(void **state)
{
    (void)state;
    check_quest_bounds_and_last_page(4);
    check_quest_bounds_and_last_page(7);
}

/* Quest's score of a group is the max over its heads of each head's own score (G = 1 on the same
 * metadata, with that head's query), bit for bit (both round the same doubles once), at every G in
 * [2, 8]; and a group of G copies of one head scores and selects as that head alone. */
static void test_quest_group_is_max_of_its_heads(void **state)
{
    (void)state;
    const int B = 2, Hkv = 3, D = 24, L = 70, P = 4, n = 18, budget = 24, n_sel = 6;
    page_layout s1 = layout(B, Hkv, Hkv, D, L, P);
    kvb_bf16 *mn = malloc(2 * meta_n(&s1)), *mx = malloc(2 * meta_n(&s1)), *q1 = malloc(2 * B * Hkv * D);
    fill_normal(mn, meta_n(&s1), 31);
    for (int64_t i = 0; i < meta_n(&s1); i++) mx[i] = bf(kvb_bf16_to_double(mn[i]) + 0.5);
    float scG[2 * 3 * 18], sc1[2 * 3 * 18], best[2 * 3 * 18];
    int32_t pG[2 * 3 * 6], p1[2 * 3 * 6];
    for (int G = 2; G <= 8; G++) {
        page_layout sG = layout(B, G * Hkv, Hkv, D, L, P);
        kvb_bf16 *qG = malloc(2 * B * G * Hkv * D);
        fill_normal(qG, B * G * Hkv * D, 32 + G);
        assert_int_equal(ref_quest_score(qG, mn, mx, &sG, budget, scG, pG), KVB_OK);
        for (int i = 0; i < B * Hkv * n; i++) best[i] = -INFINITY;
        for (int h = 0; h < G; h++) {
            for (int bh = 0; bh < B * Hkv; bh++) memcpy(q1 + bh * D, qG + (bh * G + h) * D, 2 * D);
            assert_int_equal(ref_quest_score(q1, mn, mx, &s1, budget, sc1, NULL), KVB_OK);
            for (int i = 0; i < B * Hkv * n; i++) best[i] = fmaxf(best[i], sc1[i]);
        }
        assert_memory_equal(scG, best, sizeof best);
        /* repeated heads: head 0's query in all G */
        for (int bh = 0; bh < B * Hkv; bh++)
            for (int h = 0; h < G; h++) memcpy(qG + (bh * G + h) * D, qG + bh * G * D, 2 * D);
        for (int bh = 0; bh < B * Hkv; bh++) memcpy(q1 + bh * D, qG + bh * G * D, 2 * D);
        assert_int_equal(ref_quest_score(qG, mn, mx, &sG, budget, scG, pG), KVB_OK);
        assert_int_equal(ref_quest_score(q1, mn, mx, &s1, budget, sc1, p1), KVB_OK);
        assert_memory_equal(scG, sc1, sizeof sc1);
        assert_memory_equal(pG, p1, sizeof(int32_t) * B * Hkv * n_sel);
        free(qG);
    }
    free(mn), free(mx), free(q1);
}

/* Quest by hand: G = 1, D = 8, q = (2, -1, 0, ...): o_j = 2 kmax[0][j] - kmin[1][j]. */
static void test_quest_by_hand(void **state)
{
    (void)state;
    page_layout s = {1, 1, 1, 8, 6, 2, 8};
    kvb_bf16 q[8] = {0}, mn[64], mx[64];
    q[0] = bf(2), q[1] = bf(-1);
    for (int i = 0; i < 64; i++) mn[i] = bf(-1), mx[i] = bf(1);
    mx[0] = bf(3), mx[1] = bf(-2), mx[2] = bf(0.5);   /* channel 0 */
    mn[1] = bf(-3);                                   /* kmin <= kmax on page 1 */
    mn[8] = bf(-4), mn[9] = bf(1), mn[10] = bf(0.25); /* channel 1 */
    float sc[3];
    int32_t pages[2];
    assert_int_equal(ref_quest_score(q, mn, mx, &s, 4, sc, pages), KVB_OK);
    assert_true(sc[0] == 2 * 3 + 4), assert_true(sc[1] == 2 * -2 - 1), assert_true(sc[2] == 2 * 0.5 - 0.25);
    assert_int_equal(pages[0], 0), assert_int_equal(pages[1], 2);
    assert_int_equal(ref_quest_score(q, mn, mx, &s, 1, sc, pages), KVB_EINVAL);
    assert_error_mentions("budget=1 tokens out of range [P = 2, L = 6]");
    assert_int_equal(ref_quest_score(q, mn, mx, &s, 7, sc, pages), KVB_EINVAL);
    assert_error_mentions("budget=7 tokens out of range [P = 2, L = 6]");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_budget_table),
        cmocka_unit_test(test_budget_refusals),
        cmocka_unit_test(test_layout_refusals),
        cmocka_unit_test(test_build_by_hand),
        cmocka_unit_test(test_append_equals_build),
        cmocka_unit_test(test_append_overwrites_at_page_start),
        cmocka_unit_test(test_hybrid_by_hand),
        cmocka_unit_test(test_hybrid_ties_and_zero_sign),
        cmocka_unit_test(test_hybrid_is_attention_at_page_one),
        cmocka_unit_test(test_hybrid_mass_and_edges),
        cmocka_unit_test(test_hybrid_identities_at_odd_groups),
        cmocka_unit_test(test_hybrid_repeated_heads_are_one_head),
        cmocka_unit_test(test_hybrid_refusals),
        cmocka_unit_test(test_quest_bounds_and_last_page),
        cmocka_unit_test(test_quest_group_is_max_of_its_heads),
        cmocka_unit_test(test_quest_by_hand),
    };
    return cmocka_run_group_tests_name("reference page scoring", tests, NULL, NULL);
}
