/* test_ref_selective_attn.c: the C references of selective_attn (kernels/selective_attn/NOTES.md):
 * hand-checked small cases, the row-sum invariant, agreement with a naive materialized computation
 * (the L x L matrix in double), determinism under sampling and thread counts, every parameter check;
 * and the selections (top-k with ties, heavy hitters with the pyramid schedule, SnapKV++ pooling and
 * keep, gather). */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include "harness/core/tensor.h"
#include "reference/heavy_hitters.h"
#include "reference/selective_attn.h"
#include "tests/testlib.h"

static sattn_params prm(int B, int Hq, int Hkv, int L, int D, int causal, int w0, int need_out, int group_sum)
{
    sattn_params p = {B, Hq, Hkv, L, D, causal, w0, need_out, group_sum};
    return p;
}

typedef struct attn_bufs {
    kvb_bf16 *q, *k, *v, *o;
    float *lse, *cs, *csk;
} attn_bufs;

static attn_bufs bufs_new(const sattn_params *p, uint64_t seed, double qstd)
{
    attn_bufs b;
    int64_t nq = (int64_t)p->B * p->Hq * p->L, nkv = (int64_t)p->B * p->Hkv * p->L;
    b.q = malloc(2 * (size_t)(nq * p->D));
    b.k = malloc(2 * (size_t)(nkv * p->D));
    b.v = malloc(2 * (size_t)(nkv * p->D));
    b.o = malloc(2 * (size_t)(nq * p->D));
    b.lse = malloc(4 * (size_t)nq);
    b.cs = malloc(4 * (size_t)nq);
    b.csk = malloc(4 * (size_t)nkv);
    kvb_fill_bf16_normal(b.q, nq * p->D, seed, 1, 0, 0, qstd);
    kvb_fill_bf16_normal(b.k, nkv * p->D, seed, 2, 0, 0, 1);
    kvb_fill_bf16_normal(b.v, nkv * p->D, seed, 3, 0, 0, 1);
    return b;
}

static void bufs_free(attn_bufs *b) { free(b->q), free(b->k), free(b->v), free(b->o), free(b->lse), free(b->cs), free(b->csk); }

/* D = 64, every entry of q_i zero except entry 0 = 8 x_i, of k_j entry 0 = y_j: s_ij = x_i y_j (1/sqrt(64) = 1/8) */
static void set_rank1(kvb_bf16 *q, kvb_bf16 *k, const double *x, const double *y, int L)
{
    memset(q, 0, 2 * (size_t)L * 64);
    memset(k, 0, 2 * (size_t)L * 64);
    for (int i = 0; i < L; i++) q[i * 64] = kvb_double_to_bf16(8 * x[i]), k[i * 64] = kvb_double_to_bf16(y[i]);
}

/* Q = 0: every visible key is equally likely. Causal, L = 3: P rows [1], [1/2 1/2], [1/3 1/3 1/3];
 * LSE_i = log(i + 1); with v_j = j + 1 everywhere, O_i = (i + 2) / 2; colsum (w0 = 0) = [11/6, 5/6, 1/3],
 * with w0 = 1: [5/6, 5/6, 1/3]. Not causal: every row [1/3 1/3 1/3], LSE = log 3, colsum = [1, 1, 1]. */
static void test_uniform_by_hand(void **state)
{
    (void)state;
    const int L = 3, D = 64;
    kvb_bf16 q[3 * 64] = {0}, k[3 * 64], v[3 * 64], o[3 * 64];
    float lse[3], cs[3];
    for (int i = 0; i < L * D; i++) k[i] = kvb_double_to_bf16(0.5 * (i % 7) - 1), v[i] = kvb_double_to_bf16(i / D + 1);
    sattn_params p = prm(1, 1, 1, L, D, 1, 0, 1, 0);
    assert_int_equal(ref_selective_attn(q, k, v, &p, NULL, o, lse, cs, NULL), KVB_OK);
    const double want_cs[3] = {11.0 / 6, 5.0 / 6, 1.0 / 3};
    for (int i = 0; i < L; i++) {
        assert_float_equal(lse[i], (float)log(i + 1.0), 1e-7);
        assert_float_equal(cs[i], (float)want_cs[i], 1e-7);
        for (int d = 0; d < D; d++) assert_int_equal(o[i * D + d], kvb_double_to_bf16((i + 2) / 2.0));
    }
    p.w0 = 1;
    assert_int_equal(ref_selective_attn(q, k, v, &p, NULL, o, lse, cs, NULL), KVB_OK);
    assert_float_equal(cs[0], (float)(5.0 / 6), 1e-7);
    assert_float_equal(cs[1], (float)(5.0 / 6), 1e-7);
    assert_float_equal(cs[2], (float)(1.0 / 3), 1e-7);
    p = prm(1, 1, 1, L, D, 0, 0, 1, 0);
    assert_int_equal(ref_selective_attn(q, k, v, &p, NULL, o, lse, cs, NULL), KVB_OK);
    for (int i = 0; i < L; i++) {
        assert_float_equal(lse[i], (float)log(3.0), 1e-7);
        assert_float_equal(cs[i], 1.0f, 1e-7);
        for (int d = 0; d < D; d++) assert_int_equal(o[i * D + d], kvb_double_to_bf16(2.0));
    }
}

/* Rank-one scores s_ij = x_i y_j, x = [0, 1, 2], y = [2, 0, -1], causal:
 *   row 0: [1];  row 1: s = [2, 0] -> P = [e^2, 1] / (e^2 + 1);  row 2: s = [4, 0, -2] -> P ~ [e^4, 1, e^-2]
 * colsum_kv with G = 2 identical heads is twice colsum; need_out = 0 with w0 = 1 gives LSE of rows 1, 2. */
static void test_rank_one_by_hand(void **state)
{
    (void)state;
    const int L = 3, D = 64;
    const double x[3] = {0, 1, 2}, y[3] = {2, 0, -1};
    kvb_bf16 q[2 * 3 * 64], k[3 * 64], v[3 * 64], o[2 * 3 * 64];
    float lse[6], cs[6], csk[3];
    set_rank1(q, k, x, y, L);
    memcpy(q + L * D, q, 2 * (size_t)L * D); /* head 1 = head 0 */
    for (int i = 0; i < L * D; i++) v[i] = kvb_double_to_bf16(i < D ? 1 : i < 2 * D ? -1 : 4);
    sattn_params p = prm(1, 2, 1, L, D, 1, 0, 1, 1);
    assert_int_equal(ref_selective_attn(q, k, v, &p, NULL, o, lse, cs, csk), KVB_OK);
    const double e2 = exp(2), z1 = e2 + 1, z2 = exp(4) + 1 + exp(-2);
    const double want_lse[3] = {0 * 2.0, log(z1), log(z2)};
    const double want_cs[3] = {1 + e2 / z1 + exp(4) / z2, 1 / z1 + 1 / z2, exp(-2) / z2};
    const double want_o[3] = {1, (e2 - 1) / z1, (exp(4) - 1 + 4 * exp(-2)) / z2};
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < L; i++) {
            assert_float_equal(lse[h * L + i], (float)want_lse[i], 1e-6);
            assert_float_equal(cs[h * L + i], (float)want_cs[i], 1e-6);
            assert_int_equal(o[(h * L + i) * D + 5], kvb_double_to_bf16(want_o[i]));
        }
    for (int i = 0; i < L; i++) assert_float_equal(csk[i], (float)(2 * want_cs[i]), 2e-6);
    p = prm(1, 2, 1, L, D, 1, 1, 0, 1); /* LSE [B, Hq, L - w0] holds rows 1 and 2 */
    assert_int_equal(ref_selective_attn(q, k, v, &p, NULL, NULL, lse, cs, csk), KVB_OK);
    assert_float_equal(lse[0], (float)log(z1), 1e-6);
    assert_float_equal(lse[1], (float)log(z2), 1e-6);
    assert_float_equal(lse[2], (float)log(z1), 1e-6);
    assert_float_equal(cs[0], (float)(e2 / z1 + exp(4) / z2), 1e-6);
    assert_float_equal(csk[2], (float)(2 * exp(-2) / z2), 1e-6);
}

/* The naive way: the whole score matrix of a head in double, softmax per row, O = P V, column sums. */
static void naive(const kvb_bf16 *q, const kvb_bf16 *k, const kvb_bf16 *v, int L, int D, int causal, int w0, double *o,
                  double *lse, double *cs)
{
    double *s = malloc(sizeof(double) * (size_t)L * L);
    for (int j = 0; j < L; j++) cs[j] = 0;
    for (int i = 0; i < L; i++) {
        double m = -INFINITY, z = 0;
        for (int j = 0; j < L; j++) {
            double acc = 0;
            for (int d = 0; d < D; d++) acc += kvb_bf16_to_double(q[i * D + d]) * kvb_bf16_to_double(k[j * D + d]);
            s[(int64_t)i * L + j] = causal && j > i ? -INFINITY : acc / sqrt((double)D);
            if (s[(int64_t)i * L + j] > m) m = s[(int64_t)i * L + j];
        }
        for (int j = 0; j < L; j++) z += exp(s[(int64_t)i * L + j] - m);
        lse[i] = m + log(z);
        for (int d = 0; d < D; d++) o[i * D + d] = 0;
        for (int j = 0; j < L; j++) {
            double pij = exp(s[(int64_t)i * L + j] - lse[i]);
            for (int d = 0; d < D; d++) o[i * D + d] += pij * kvb_bf16_to_double(v[j * D + d]);
            if (i >= w0) cs[j] += pij;
        }
    }
    free(s);
}

static void test_matches_naive_materialized(void **state)
{
    (void)state;
    const struct { int Hq, Hkv, L, D, causal, w0, need_out; double qstd; } cases[] = {
        {2, 1, 37, 64, 1, 0, 1, 1.0}, {4, 2, 50, 128, 0, 18, 1, 1.0}, {2, 2, 33, 64, 1, 1, 0, 6.0}, {8, 1, 20, 64, 0, 0, 1, 3.0},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        sattn_params p = prm(1, cases[c].Hq, cases[c].Hkv, cases[c].L, cases[c].D, cases[c].causal, cases[c].w0,
                             cases[c].need_out, 1);
        attn_bufs b = bufs_new(&p, 100 + c, cases[c].qstd);
        assert_int_equal(ref_selective_attn(b.q, b.k, b.v, &p, NULL, p.need_out ? b.o : NULL, b.lse, b.cs, b.csk), KVB_OK);
        const int L = p.L, D = p.D, G = p.Hq / p.Hkv, lse_len = sattn_lse_len(&p), r0 = sattn_lse_row0(&p);
        double *o = malloc(sizeof(double) * L * D), *lse = malloc(sizeof(double) * L), *cs = malloc(sizeof(double) * L);
        double *grp = calloc((size_t)L, sizeof(double));
        for (int h = 0; h < p.Hq; h++) {
            naive(b.q + (int64_t)h * L * D, b.k + (int64_t)(h / G) * L * D, b.v + (int64_t)(h / G) * L * D, L, D, p.causal, p.w0,
                  o, lse, cs);
            for (int i = r0; i < L; i++) assert_float_equal(b.lse[h * lse_len + i - r0], lse[i], 1e-6 * (1 + fabs(lse[i])));
            for (int j = 0; j < L; j++) {
                assert_float_equal(b.cs[h * L + j], cs[j], 1e-6 * (1 + cs[j]));
                grp[j] += cs[j];
            }
            if (p.need_out) /* one rounding each; the sums may differ in the last double bits: within one bf16 step */
                for (int i = 0; i < L * D; i++)
                    assert_float_equal(kvb_bf16_to_double(b.o[(int64_t)h * L * D + i]), o[i], fabs(o[i]) * 0x1p-8 + 1e-30);
            if (h % G == G - 1) {
                for (int j = 0; j < L; j++) {
                    assert_float_equal(b.csk[(h / G) * L + j], grp[j], 1e-6 * (1 + grp[j]));
                    grp[j] = 0;
                }
            }
        }
        free(o), free(lse), free(cs), free(grp);
        bufs_free(&b);
    }
}

/* sum_j colsum[j] = number of contributing rows (L - w0) for every head; G times that for colsum_kv */
static void test_row_sum_invariant(void **state)
{
    (void)state;
    const int Ls[] = {1, 15, 16, 17, 127, 200};
    for (size_t li = 0; li < sizeof Ls / sizeof Ls[0]; li++)
        for (int causal = 0; causal < 2; causal++)
            for (int wi = 0; wi < 2; wi++) {
                int L = Ls[li], w0 = wi ? (L > 32 ? L - 32 : L - 1) : 0;
                sattn_params p = prm(2, 4, 2, L, 64, causal, w0, wi == 0, 1);
                attn_bufs b = bufs_new(&p, 7 + li, wi ? 6.0 : 1.0);
                assert_int_equal(ref_selective_attn(b.q, b.k, b.v, &p, NULL, b.o, b.lse, b.cs, b.csk), KVB_OK);
                for (int h = 0; h < p.B * p.Hq; h++) {
                    double s = 0;
                    for (int j = 0; j < L; j++) s += b.cs[h * L + j];
                    assert_float_equal(s, L - w0, 1e-5 * (L - w0));
                }
                for (int h = 0; h < p.B * p.Hkv; h++) {
                    double s = 0;
                    for (int j = 0; j < L; j++) s += b.csk[h * L + j];
                    assert_float_equal(s, 2.0 * (L - w0), 2e-5 * (L - w0));
                }
                bufs_free(&b);
            }
}

/* A sampled reference computes exactly what the full one does on the sampled heads, leaves the others
 * alone, and neither depends on the number of threads. */
static void test_sampling_and_threads_deterministic(void **state)
{
    (void)state;
    sattn_params p = prm(2, 4, 2, 150, 64, 1, 20, 1, 1);
    attn_bufs a = bufs_new(&p, 3, 1.0), b = bufs_new(&p, 3, 1.0);
    int64_t nq = (int64_t)p.B * p.Hq * p.L;
    int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    assert_int_equal(ref_selective_attn(a.q, a.k, a.v, &p, NULL, a.o, a.lse, a.cs, a.csk), KVB_OK);
    omp_set_num_threads(threads > 1 ? threads : 3);
    const uint8_t mask[4] = {1, 0, 0, 1};
    memset(b.cs, 0x7F, 4 * (size_t)nq);
    assert_int_equal(ref_selective_attn(b.q, b.k, b.v, &p, mask, b.o, b.lse, b.cs, b.csk), KVB_OK);
    omp_set_num_threads(threads);
    const int L = p.L, G = 2;
    for (int h = 0; h < p.B * p.Hq; h++) {
        if (mask[h / G]) {
            assert_memory_equal(a.cs + h * L, b.cs + h * L, 4 * (size_t)L);
            assert_memory_equal(a.lse + h * L, b.lse + h * L, 4 * (size_t)L);
            assert_memory_equal(a.o + (int64_t)h * L * 64, b.o + (int64_t)h * L * 64, 2 * (size_t)L * 64);
        } else {
            for (int j = 0; j < L; j++) assert_int_equal(kvb_float_to_bits(b.cs[h * L + j]), 0x7F7F7F7Fu);
        }
    }
    assert_memory_equal(a.csk, b.csk, 4 * (size_t)L);
    assert_memory_equal(a.csk + 3 * L, b.csk + 3 * L, 4 * (size_t)L);
    bufs_free(&a), bufs_free(&b);
}

static void test_rejects_bad_parameters(void **state)
{
    (void)state;
    sattn_params good = prm(1, 8, 2, 100, 128, 1, 0, 1, 0), p;
    assert_int_equal(sattn_check(&good, "t"), KVB_OK);
    p = good, p.D = 96;
    assert_int_equal(sattn_check(&p, "t"), KVB_EINVAL);
    assert_error_mentions("t: D=96 is not supported", "64, 128");
    p = good, p.Hq = 6, p.Hkv = 4;
    assert_int_equal(sattn_check(&p, "t"), KVB_EINVAL);
    assert_error_mentions("Hq=6 is not a multiple of Hkv=4");
    p = good, p.L = 0;
    assert_int_equal(sattn_check(&p, "t"), KVB_EINVAL);
    assert_error_mentions("L=0 out of range [1, 1048576]");
    p = good, p.w0 = 100;
    assert_int_equal(sattn_check(&p, "t"), KVB_EINVAL);
    assert_error_mentions("w0=100 out of range [0, L-1 = 99]");
    p = good, p.w0 = -1;
    assert_int_equal(sattn_check(&p, "t"), KVB_EINVAL);
    assert_error_mentions("w0=-1 out of range");
    p = good, p.causal = 2;
    assert_int_equal(sattn_check(&p, "t"), KVB_EINVAL);
    assert_error_mentions("causal=2 out of range [0, 1]");
    kvb_bf16 x[8];
    float f[8];
    p = good, p.D = 32;
    assert_int_equal(ref_selective_attn(x, x, x, &p, NULL, x, f, f, f), KVB_EINVAL);
    assert_error_mentions("ref_selective_attn: D=32");
}

/* ---- selections ---- */

/* scores  [5, 1, 5, 3, 5, 0, 3]: top-3 = the three 5s (0, 2, 4); top-4 adds the first 3 (index 3, not 6);
 * top-1 of ties is the lowest index. */
static void test_topk_by_hand_with_ties(void **state)
{
    (void)state;
    const float s[7] = {5, 1, 5, 3, 5, 0, 3};
    int32_t idx[7];
    assert_int_equal(ref_topk(s, 1, 7, 7, 3, idx, 7), KVB_OK);
    assert_int_equal(idx[0], 0), assert_int_equal(idx[1], 2), assert_int_equal(idx[2], 4);
    assert_int_equal(ref_topk(s, 1, 7, 7, 4, idx, 7), KVB_OK);
    assert_int_equal(idx[0], 0), assert_int_equal(idx[1], 2), assert_int_equal(idx[2], 3), assert_int_equal(idx[3], 4);
    assert_int_equal(ref_topk(s, 1, 7, 7, 1, idx, 7), KVB_OK);
    assert_int_equal(idx[0], 0);
    assert_int_equal(ref_topk(s, 1, 7, 7, 7, idx, 7), KVB_OK);
    for (int i = 0; i < 7; i++) assert_int_equal(idx[i], i);
    assert_int_equal(ref_topk(s, 1, 7, 7, 8, idx, 7), KVB_EINVAL);
    assert_error_mentions("k=8 out of range [0, n = 7]");
}

/* L = 10, heavy = 0.3, recent = 0.2: n_hh = 3, n_rw = 2; keep = top-3 of scores[0:8] U {8, 9}. */
static void test_heavy_hitters_by_hand(void **state)
{
    (void)state;
    const float s[2][10] = {{0, 9, 1, 9, 2, 8, 7, 9, 100, 100}, {4, 4, 4, 4, 4, 4, 4, 4, 4, 4}};
    int n_hh, n_rw, n_keep;
    assert_int_equal(hh_budget(10, 0.3, 0.2, &n_hh, &n_rw, &n_keep, "t"), KVB_OK);
    assert_int_equal(n_hh, 3), assert_int_equal(n_rw, 2), assert_int_equal(n_keep, 5);
    int32_t keep[2][5];
    assert_int_equal(ref_heavy_hitters(&s[0][0], 2, 10, n_hh, n_rw, &keep[0][0]), KVB_OK);
    const int32_t want[2][5] = {{1, 3, 7, 8, 9}, {0, 1, 2, 8, 9}};
    assert_memory_equal(keep, want, sizeof want);
    /* n_hh + n_rw >= L keeps everything */
    assert_int_equal(hh_budget(10, 0.6, 0.4, &n_hh, &n_rw, &n_keep, "t"), KVB_OK);
    assert_int_equal(n_keep, 10);
    int32_t all[10];
    assert_int_equal(ref_heavy_hitters(&s[0][0], 1, 10, n_hh, n_rw, all), KVB_OK);
    for (int i = 0; i < 10; i++) assert_int_equal(all[i], i);
    /* floor: L = 7, heavy = recent = 0.25 -> 1 and 1 */
    assert_int_equal(hh_budget(7, 0.25, 0.25, &n_hh, &n_rw, &n_keep, "t"), KVB_OK);
    assert_int_equal(n_hh, 1), assert_int_equal(n_rw, 1), assert_int_equal(n_keep, 2);
}

static void test_pyramid_schedule(void **state)
{
    (void)state;
    double r;
    /* heavy = 0.25 over 32 layers: r_last = 0.25/7, r_first = 0.5 - 0.25/7, linear in between, mean = heavy */
    double sum = 0;
    for (int l = 0; l < 32; l++) {
        assert_int_equal(hh_pyramid_ratio(0.25, l, 32, &r, "t"), KVB_OK);
        sum += r;
        if (l == 0) assert_float_equal(r, 0.5 - 0.25 / 7, 1e-15);
        if (l == 31) assert_float_equal(r, 0.25 / 7, 1e-15);
    }
    assert_float_equal(sum / 32, 0.25, 1e-12);
    assert_int_equal(hh_pyramid_ratio(0.25, 0, 1, &r, "t"), KVB_OK);
    assert_float_equal(r, 0.25, 0);
    assert_int_equal(hh_pyramid_ratio(0.6, 0, 32, &r, "t"), KVB_EINVAL);
    assert_error_mentions("pyramid ratio of layer 0", "out of range [0, 1]");
    assert_int_equal(hh_pyramid_ratio(1.5, 0, 1, &r, "t"), KVB_EINVAL);
    assert_error_mentions("t: heavy=1.5 out of range [0, 1]");
    assert_int_equal(hh_pyramid_ratio(0.25, 32, 32, &r, "t"), KVB_EINVAL);
    assert_error_mentions("layer=32 out of range [0, layers-1 = 31]");
    int a, b, c;
    assert_int_equal(hh_budget(100, 0.25, -0.1, &a, &b, &c, "t"), KVB_EINVAL);
    assert_error_mentions("recent=-0.1 out of range [0, 1]");
    assert_int_equal(hh_budget(100, 1.01, 0.1, &a, &b, &c, "t"), KVB_EINVAL);
    assert_error_mentions("heavy=1.01 out of range [0, 1]");
}

/* ks = 3 over [1, 5, 2, 0, 0, 7]: [5, 5, 5, 2, 7, 7] (edges clipped); ks = 1 is the identity. */
static void test_maxpool_by_hand(void **state)
{
    (void)state;
    const float x[6] = {1, 5, 2, 0, 0, 7};
    float y[6];
    assert_int_equal(ref_maxpool(x, 1, 6, 3, y), KVB_OK);
    const float want[6] = {5, 5, 5, 2, 7, 7};
    assert_memory_equal(y, want, sizeof want);
    assert_int_equal(ref_maxpool(x, 1, 6, 1, y), KVB_OK);
    assert_memory_equal(y, x, sizeof x);
    assert_int_equal(ref_maxpool(x, 1, 6, 63, y), KVB_OK);
    for (int i = 0; i < 6; i++) assert_float_equal(y[i], 7, 0);
}

static void test_snapkv_budget_pool_and_keep(void **state)
{
    (void)state;
    int W, n_keep, ks;
    assert_int_equal(snapkv_budget(100, 40, &W, &n_keep, "t"), KVB_OK);
    assert_int_equal(W, 32), assert_int_equal(n_keep, 40);
    assert_int_equal(snapkv_budget(20, 25, &W, &n_keep, "t"), KVB_OK);
    assert_int_equal(W, 20), assert_int_equal(n_keep, 20);
    assert_int_equal(snapkv_budget(100, 31, &W, &n_keep, "t"), KVB_EINVAL);
    assert_error_mentions("budget=31 out of range [W = min(32, L) = 32");
    assert_int_equal(snapkv_pool_size(49151, 0, &ks, "t"), KVB_OK), assert_int_equal(ks, 63);
    assert_int_equal(snapkv_pool_size(49152, 0, &ks, "t"), KVB_OK), assert_int_equal(ks, 511);
    assert_int_equal(snapkv_pool_size(1000, 7, &ks, "t"), KVB_OK), assert_int_equal(ks, 7);
    assert_int_equal(snapkv_pool_size(1000, 64, &ks, "t"), KVB_EINVAL);
    assert_error_mentions("ks=64 is not an odd pooling kernel");
    /* L = 36, W = 32, budget 34: the 2 best of pooled[0:4] plus tokens 4..35 */
    float pooled[36] = {3, 9, 9, 1};
    for (int i = 4; i < 36; i++) pooled[i] = 1000;
    int32_t keep[34];
    assert_int_equal(ref_snapkv_keep(pooled, 1, 36, 32, 34, keep), KVB_OK);
    assert_int_equal(keep[0], 1), assert_int_equal(keep[1], 2);
    for (int i = 0; i < 32; i++) assert_int_equal(keep[2 + i], 4 + i);
}

static void test_gather_rows(void **state)
{
    (void)state;
    /* 2 source heads of 4 rows x 8; 4 output rows (group 2): row r reads head r / 2 */
    kvb_bf16 x[2 * 4 * 8], y[4 * 2 * 8];
    for (int i = 0; i < 64; i++) x[i] = (kvb_bf16)i;
    const int32_t keep[4][2] = {{0, 3}, {1, 2}, {0, 1}, {3, 3}};
    assert_int_equal(ref_gather_rows(x, 4, 2, 4, 8, &keep[0][0], 2, y), KVB_OK);
    for (int r = 0; r < 4; r++)
        for (int i = 0; i < 2; i++)
            for (int d = 0; d < 8; d++) assert_int_equal(y[(r * 2 + i) * 8 + d], ((r / 2) * 4 + keep[r][i]) * 8 + d);
    const int32_t bad[1] = {4};
    assert_int_equal(ref_gather_rows(x, 1, 1, 4, 8, bad, 1, y), KVB_EINVAL);
    assert_error_mentions("keep[0, 0]=4 out of range [0, 3]");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_uniform_by_hand),
        cmocka_unit_test(test_rank_one_by_hand),
        cmocka_unit_test(test_matches_naive_materialized),
        cmocka_unit_test(test_row_sum_invariant),
        cmocka_unit_test(test_sampling_and_threads_deterministic),
        cmocka_unit_test(test_rejects_bad_parameters),
        cmocka_unit_test(test_topk_by_hand_with_ties),
        cmocka_unit_test(test_heavy_hitters_by_hand),
        cmocka_unit_test(test_pyramid_schedule),
        cmocka_unit_test(test_maxpool_by_hand),
        cmocka_unit_test(test_snapkv_budget_pool_and_keep),
        cmocka_unit_test(test_gather_rows),
    };
    return cmocka_run_group_tests_name("reference selective_attn", tests, NULL, NULL);
}
