/* test_ref_int2.c: the INT2 references (kernels/int2/NOTES.md) on hand-checked groups, the packing, the
 * flush, the dequant-matmuls against direct sums, and every kind of bad input. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "reference/decode.h"
#include "reference/int2.h"
#include "tests/testlib.h"

static kvb_bf16 bf(double x) { return kvb_double_to_bf16(x); }

/* Worked by hand: x = 0, .5, 1, 1.5, 2, 2.5, 3 (and 3s): mn 0, mx 3, scale = fp16(1) = 1, zero 0;
 * codes rint(x): 0, 0 (tie to even), 1, 2 (tie to even), 2, 2 (tie to even), 3. */
static void test_group_ties_round_to_even(void **state)
{
    (void)state;
    float x[16] = {0, 0.5f, 1, 1.5f, 2, 2.5f, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3};
    uint8_t codes[16];
    kvb_fp16 s, z;
    int2_quantize_group(x, 16, codes, &s, &z);
    assert_int_equal(s, 0x3C00); /* 1.0 */
    assert_int_equal(z, 0x0000);
    const uint8_t want[7] = {0, 0, 1, 2, 2, 2, 3};
    assert_memory_equal(codes, want, 7);
}

/* mn = -1, mx = 1: (mx - mn) / 3 = 0.6666667 in fp32, fp16 0.66650390625 (0x3955); zero = -1 (0xBC00).
 * x = 0: (0 + 1) / 0.6665039 = 1.5004 -> 2; x = -0.5: 0.7502 -> 1; x = 0.5: 2.2506 -> 2; x = 1: 3.0007 -> 3. */
static void test_group_inexact_scale(void **state)
{
    (void)state;
    float x[16] = {-1, 1, 0, -0.5f, 0.5f, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
    uint8_t codes[16];
    kvb_fp16 s, z;
    int2_quantize_group(x, 16, codes, &s, &z);
    assert_int_equal(s, 0x3955);
    assert_true(kvb_fp16_to_float(s) == 0.66650390625f);
    assert_int_equal(z, 0xBC00);
    const uint8_t want[6] = {0, 3, 2, 1, 2, 3};
    assert_memory_equal(codes, want, 6);
}

/* scale == 0 (a constant group, or a range too small for fp16): every code 0, zero = the value. */
static void test_group_scale_zero(void **state)
{
    (void)state;
    float x[16];
    uint8_t codes[16];
    kvb_fp16 s, z;
    for (int i = 0; i < 16; i++) x[i] = 2.5f;
    int2_quantize_group(x, 16, codes, &s, &z);
    assert_int_equal(s, 0);
    assert_int_equal(z, kvb_float_to_fp16(2.5f));
    for (int i = 0; i < 16; i++) assert_int_equal(codes[i], 0);
    x[3] = 2.5f + 0x1p-30f; /* range / 3 underflows fp16 */
    int2_quantize_group(x, 16, codes, &s, &z);
    assert_int_equal(s, 0);
    for (int i = 0; i < 16; i++) assert_int_equal(codes[i], 0);
}

/* Packing and layouts: code i of a word in bits [2i, 2i+1]; keys per channel along tokens, values per
 * token along channels, quantized into the middle of a larger cache (t0). */
static void test_packing_and_layouts(void **state)
{
    (void)state;
    enum { D = 64, T = 32, TCAP = 64, T0 = 16 };
    int2_layout l = {1, 1, 1, D, 16, TCAP, 0, 0, 0};
    kvb_bf16 K[T * D];
    for (int t = 0; t < T; t++)
        for (int d = 0; d < D; d++) K[t * D + d] = bf((t + d) % 4); /* group of 16 tokens: 0..3, codes = values */
    uint32_t Kq[D * TCAP / 16] = {0}, Vq[TCAP * D / 16] = {0};
    kvb_fp16 Ks[D * TCAP / 16], Kz[D * TCAP / 16], Vs[TCAP * D / 16], Vz[TCAP * D / 16];
    assert_int_equal(ref_int2_quantize_keys(K, T, T, T0, Kq, Ks, Kz, &l), KVB_OK);
    assert_int_equal(ref_int2_quantize_values(K, T, T, T0, Vq, Vs, Vz, &l), KVB_OK);
    for (int d = 0; d < D; d++)
        for (int t = 0; t < T; t++) {
            int tc = T0 + t;
            uint32_t kcode = (Kq[d * (TCAP / 16) + tc / 16] >> (2 * (tc % 16))) & 3;
            uint32_t vcode = (Vq[tc * (D / 16) + d / 16] >> (2 * (d % 16))) & 3;
            assert_int_equal(kcode, (uint32_t)((t + d) % 4));
            assert_int_equal(vcode, (uint32_t)((t + d) % 4));
            assert_int_equal(Ks[d * (TCAP / 16) + tc / 16], 0x3C00);
            assert_int_equal(Vs[tc * (D / 16) + d / 16], 0x3C00);
        }
    assert_int_equal(Kq[0], 0u); /* tokens before t0 untouched */
    /* word of channel 0, tokens 16..31 (t = 0..15): codes t % 4 -> 0b11100100 repeated */
    assert_int_equal(Kq[1], 0xE4E4E4E4u);
}

static void test_bad_layouts(void **state)
{
    (void)state;
    int2_layout l = {2, 8, 32, 128, 24, 1024, 1024, 128, 64};
    assert_int_equal(int2_layout_check(&l, "int2_quantize"), KVB_EINVAL);
    assert_error_mentions("int2_quantize: gs=24 is not one of {16, 32, 64, 128}");
    l.gs = 128, l.D = 64;
    assert_int_equal(int2_layout_check(&l, "int2_decode_attn"), KVB_EINVAL);
    assert_error_mentions("D=64 is not a multiple of gs=128");
    l.gs = 16, l.D = 128, l.T = 100, l.Tcap = 1024;
    assert_int_equal(int2_layout_check(&l, "int2_qk"), KVB_EINVAL);
    assert_error_mentions("T=100 is not a multiple of gs=16");
    l.T = 1040;
    assert_int_equal(int2_layout_check(&l, "int2_qk"), KVB_EINVAL);
    assert_error_mentions("T=1040 out of range [0, 1024]");
    l.T = 1024, l.R = 144;
    assert_int_equal(int2_layout_check(&l, "int2_decode_attn"), KVB_EINVAL);
    assert_error_mentions("R=144 out of range [0, min(Rcap = 128, 128 + gs - 1 = 143)]");
    l.R = 64, l.Hq = 72;
    assert_int_equal(int2_attn_check(&l, "int2_decode_attn"), KVB_EINVAL);
    assert_error_mentions("Hq=72 out of range [8, 64]");
    l.Hq = 32, l.T = 0, l.R = 0;
    assert_int_equal(int2_attn_check(&l, "int2_decode_attn"), KVB_EINVAL);
    assert_error_mentions("T + R = 0");
    l.T = 1024;
    assert_int_equal(int2_span_check(&l, 64, 40, 0, "int2_quantize_keys"), KVB_EINVAL);
    assert_error_mentions("n=40 tokens to quantize is not a non-negative multiple of gs=16");
    assert_int_equal(int2_span_check(&l, 64, 64, 1008, "int2_quantize_keys"), KVB_EINVAL);
    assert_error_mentions("t0 + n = 1072 out of range [0, Tcap = 1024]");
}

/* Non-finite or out-of-range inputs are rejected, naming the element, before anything is written. */
static void test_bad_inputs(void **state)
{
    (void)state;
    enum { D = 64, T = 16 };
    int2_layout l = {1, 2, 2, D, 16, T, 0, 0, 0};
    kvb_bf16 K[2 * T * D];
    for (int i = 0; i < 2 * T * D; i++) K[i] = bf(0.5);
    uint32_t q[2 * D * T / 16];
    kvb_fp16 s[2 * D], z[2 * D];
    memset(q, 0xAB, sizeof q);
    K[(1 * T + 3) * D + 17] = 0x7FC0; /* NaN at (b=0, h=1, t=3, d=17) */
    assert_int_equal(ref_int2_quantize_keys(K, T, T, 0, q, s, z, &l), KVB_EINVAL);
    assert_error_mentions("int2_quantize_keys: K[0,1,3,17]=nan out of range [-32768, 32768]", "finite");
    assert_int_equal(q[0], 0xABABABABu);
    K[(1 * T + 3) * D + 17] = 0xFF80; /* -inf */
    assert_int_equal(ref_int2_quantize_values(K, T, T, 0, q, s, z, &l), KVB_EINVAL);
    assert_error_mentions("int2_quantize_values: V[0,1,3,17]=-inf out of range");
    K[(1 * T + 3) * D + 17] = bf(65536.0);
    assert_int_equal(ref_int2_quantize_keys(K, T, T, 0, q, s, z, &l), KVB_EINVAL);
    assert_error_mentions("K[0,1,3,17]=65536 out of range [-32768, 32768]");
    K[(1 * T + 3) * D + 17] = bf(32768.0); /* the bound itself is supported */
    assert_int_equal(ref_int2_quantize_keys(K, T, T, 0, q, s, z, &l), KVB_OK);
    /* two offending elements: the first in (b, h, t, d) order is named, whatever the threads found first */
    K[(1 * T + 0) * D + 2] = 0x7FC0, K[(0 * T + 15) * D + 63] = bf(-65536.0);
    assert_int_equal(ref_int2_quantize_keys(K, T, T, 0, q, s, z, &l), KVB_EINVAL);
    assert_error_mentions("K[0,0,15,63]=-65536 out of range");
}

/* The flush: R + 1 = 128 quantizes the residual's 128 tokens into cache tokens [T, T + 128) exactly as a
 * direct quantization would, and empties the residual; R + 1 < 128 only appends; a residual above 128
 * keeps the remainder at the front. */
static void test_append_and_flush(void **state)
{
    (void)state;
    enum { D = 64, GS = 16, T = 32, TCAP = T + 128, RCAP = 128 + GS - 1 };
    const int64_t kq_n = D * TCAP / 16, km_n = D * TCAP / GS, vq_n = TCAP * D / 16, vm_n = TCAP * D / GS;
    int2_cache c;
    c.Kq = calloc(kq_n, 4), c.Vq = calloc(vq_n, 4);
    c.Ks = calloc(km_n, 2), c.Kz = calloc(km_n, 2), c.Vs = calloc(vm_n, 2), c.Vz = calloc(vm_n, 2);
    c.Kr = calloc(RCAP * D, 2), c.Vr = calloc(RCAP * D, 2);
    kvb_bf16 knew[D], vnew[D];
    for (int i = 0; i < RCAP * D; i++) c.Kr[i] = bf((i * 7 % 23) * 0.25 - 2), c.Vr[i] = bf((i * 5 % 19) * 0.5 - 4);
    for (int d = 0; d < D; d++) knew[d] = bf(d * 0.125), vnew[d] = bf(-d * 0.25);
    int64_t Ta;
    int Ra;
    int2_layout l = {1, 1, 1, D, GS, TCAP, T, RCAP, 126};
    assert_int_equal(ref_int2_append(&c, knew, vnew, &l, &Ta, &Ra), KVB_OK); /* just below a flush */
    assert_int_equal(Ta, T);
    assert_int_equal(Ra, 127);
    assert_memory_equal(c.Kr + 126 * D, knew, sizeof knew);
    /* at the flush: compare with a direct quantization of the 128 residual tokens */
    l.R = 127;
    uint32_t Kq2[D * TCAP / 16], Vq2[TCAP * D / 16];
    kvb_fp16 Ks2[D * TCAP / GS], Kz2[D * TCAP / GS], Vs2[TCAP * D / GS], Vz2[TCAP * D / GS];
    memcpy(c.Kr + 127 * D, knew, sizeof knew), memcpy(c.Vr + 127 * D, vnew, sizeof vnew);
    assert_int_equal(ref_int2_quantize_keys(c.Kr, RCAP, 128, T, Kq2, Ks2, Kz2, &l), KVB_OK);
    assert_int_equal(ref_int2_quantize_values(c.Vr, RCAP, 128, T, Vq2, Vs2, Vz2, &l), KVB_OK);
    assert_int_equal(ref_int2_append(&c, knew, vnew, &l, &Ta, &Ra), KVB_OK);
    assert_int_equal(Ta, T + 128);
    assert_int_equal(Ra, 0);
    for (int d = 0; d < D; d++)
        for (int w = T / 16; w < TCAP / 16; w++) assert_int_equal(c.Kq[d * (TCAP / 16) + w], Kq2[d * (TCAP / 16) + w]);
    for (int t = T; t < TCAP; t++)
        for (int w = 0; w < D / 16; w++) assert_int_equal(c.Vq[t * (D / 16) + w], Vq2[t * (D / 16) + w]);
    assert_int_equal(c.Ks[0 * (TCAP / GS) + T / GS], Ks2[0 * (TCAP / GS) + T / GS]);
    assert_int_equal(c.Vz[T * (D / GS)], Vz2[T * (D / GS)]);
    /* above 128: R = 130 -> flush 128, the 3 left (slots 128, 129, and the new token at 130) move to 0..2 */
    l.T = 0, l.R = 130;
    kvb_bf16 keep[2 * D];
    memcpy(keep, c.Kr + 128 * D, sizeof keep);
    assert_int_equal(ref_int2_append(&c, knew, vnew, &l, &Ta, &Ra), KVB_OK);
    assert_int_equal(Ta, 128);
    assert_int_equal(Ra, 3);
    assert_memory_equal(c.Kr, keep, sizeof keep);
    assert_memory_equal(c.Kr + 2 * D, knew, sizeof knew);
    /* bad: a full residual, no room to flush */
    l.R = RCAP;
    assert_int_equal(ref_int2_append(&c, knew, vnew, &l, &Ta, &Ra), KVB_EINVAL);
    assert_error_mentions("R + 1 = 144 out of range [1, Rcap = 143]", "residual buffer is full");
    l.R = 127, l.T = TCAP - 112;
    assert_int_equal(ref_int2_append(&c, knew, vnew, &l, &Ta, &Ra), KVB_EINVAL);
    assert_error_mentions("T + 128 = 176 out of range [0, Tcap = 160]", "no room to flush");
    free(c.Kq), free(c.Vq), free(c.Ks), free(c.Kz), free(c.Vs), free(c.Vz), free(c.Kr), free(c.Vr);
}

/* int2_qk and int2_av against sums written out here from the codes and metadata. */
static void test_matmuls_against_direct_sums(void **state)
{
    (void)state;
    enum { D = 64, T = 32, GS = 32, HQ = 2 };
    int2_layout l = {1, 1, HQ, D, GS, T, T, 1, 0};
    uint32_t Kq[D * T / 16], Vq[T * D / 16];
    kvb_fp16 Ks[D * T / GS], Kz[D * T / GS], Vs[T * D / GS], Vz[T * D / GS];
    for (int i = 0; i < D * T / 16; i++) Kq[i] = 0x9E3779B9u * (i + 1), Vq[i] = 0x85EBCA6Bu * (i + 3);
    for (int i = 0; i < D * T / GS; i++) {
        Ks[i] = kvb_float_to_fp16(0.125f * (i % 5 + 1)), Kz[i] = kvb_float_to_fp16(-0.5f * (i % 3));
        Vs[i] = kvb_float_to_fp16(0.25f * (i % 3 + 1)), Vz[i] = kvb_float_to_fp16(0.75f - (i % 4));
    }
    int2_cache c = {Kq, Ks, Kz, Vq, Vs, Vz, NULL, NULL};
    kvb_bf16 q[HQ * D];
    float p[HQ * T], scores[HQ * T], out[HQ * D];
    double mag_s[HQ * T], mag_o[HQ * D];
    for (int i = 0; i < HQ * D; i++) q[i] = bf(0.1 * ((i * 37) % 17) - 0.8);
    for (int i = 0; i < HQ * T; i++) p[i] = (float)((i % 7) + 1) / 100.0f;
    assert_int_equal(ref_int2_qk(q, &c, scores, mag_s, &l, NULL), KVB_OK);
    assert_int_equal(ref_int2_av(p, &c, out, mag_o, &l, NULL), KVB_OK);
    for (int h = 0; h < HQ; h++) {
        for (int t = 0; t < T; t++) {
            double s = 0, a = 0;
            for (int d = 0; d < D; d++) {
                unsigned code = (Kq[d * (T / 16) + t / 16] >> (2 * (t % 16))) & 3;
                double cs = code * (double)kvb_fp16_to_float(Ks[d * (T / GS) + t / GS]), z = kvb_fp16_to_float(Kz[d * (T / GS) + t / GS]);
                s += kvb_bf16_to_double(q[h * D + d]) * (cs + z);
                a += fabs(kvb_bf16_to_double(q[h * D + d])) * (fabs(cs) + fabs(z)); /* the scale/zero form's size */
            }
            assert_true(scores[h * T + t] == (float)s);
            assert_true(fabs(mag_s[h * T + t] - a) <= 1e-12 * a);
        }
        for (int d = 0; d < D; d++) {
            double s = 0, a = 0;
            for (int t = 0; t < T; t++) {
                unsigned code = (Vq[t * (D / 16) + d / 16] >> (2 * (d % 16))) & 3;
                double cs = code * (double)kvb_fp16_to_float(Vs[t * (D / GS) + d / GS]), z = kvb_fp16_to_float(Vz[t * (D / GS) + d / GS]);
                s += (double)p[h * T + t] * (cs + z);
                a += fabs((double)p[h * T + t]) * (fabs(cs) + fabs(z));
            }
            assert_true(out[h * D + d] == (float)s);
            assert_true(fabs(mag_o[h * D + d] - a) <= 1e-12 * a);
        }
    }
}

/* A cache of B = 1 holding K, V [Hkv, T + R, D]: the first T tokens quantized, the last R as the residual
 * (its capacity R). */
static int2_cache cache_of(const kvb_bf16 *K, const kvb_bf16 *V, const int2_layout *l)
{
    const int HKV = l->Hkv, D = l->D, GS = l->gs, T = l->T, R = l->R, N = T + R;
    int2_cache c;
    c.Kq = malloc(4 * HKV * D * T / 16), c.Vq = malloc(4 * HKV * T * D / 16);
    c.Ks = malloc(2 * HKV * D * T / GS), c.Kz = malloc(2 * HKV * D * T / GS);
    c.Vs = malloc(2 * HKV * T * D / GS), c.Vz = malloc(2 * HKV * T * D / GS);
    c.Kr = malloc(2 * HKV * R * D), c.Vr = malloc(2 * HKV * R * D);
    assert_int_equal(ref_int2_quantize_keys(K, N, T, 0, c.Kq, c.Ks, c.Kz, l), KVB_OK);
    assert_int_equal(ref_int2_quantize_values(V, N, T, 0, c.Vq, c.Vs, c.Vz, l), KVB_OK);
    for (int h = 0; h < HKV; h++) {
        memcpy(c.Kr + h * R * D, K + (h * N + T) * D, 2 * R * D);
        memcpy(c.Vr + h * R * D, V + (h * N + T) * D, 2 * R * D);
    }
    return c;
}

static void cache_free(int2_cache *c)
{
    free(c->Kq), free(c->Vq), free(c->Ks), free(c->Kz), free(c->Vs), free(c->Vz), free(c->Kr), free(c->Vr);
}

/* With data the quantizer reproduces exactly (each group spans [0, 3] in steps of 1: scale 1, zero 0),
 * INT2 attention over [quantized ; residual] equals dense attention over the same tokens: the two
 * references agree bit for bit. */
static void test_attention_exact_data_matches_dense(void **state)
{
    (void)state;
    enum { B = 1, HKV = 2, HQ = 8, D = 64, GS = 16, T = 64, R = 5, N = T + R };
    kvb_bf16 *K = malloc(sizeof(kvb_bf16) * HKV * N * D), *V = malloc(sizeof(kvb_bf16) * HKV * N * D);
    for (int h = 0; h < HKV; h++)
        for (int t = 0; t < N; t++)
            for (int d = 0; d < D; d++) {
                int i = (h * N + t) * D + d;
                /* per 16-token key group of a channel and per 16-channel value group: 0 and 3 present */
                K[i] = bf(t % 16 == 0 ? 0 : t % 16 == 1 ? 3 : (t * 7 + d * 3 + h) % 4);
                V[i] = bf(d % 16 == 0 ? 0 : d % 16 == 1 ? 3 : (t * 5 + d + h) % 4);
            }
    int2_layout l = {B, HKV, HQ, D, GS, T, T, R, R};
    int2_cache c = cache_of(K, V, &l);
    kvb_bf16 q[HQ * D], o_int2[HQ * D], o_dense[HQ * D];
    for (int i = 0; i < HQ * D; i++) q[i] = bf(0.05 * ((i * 29) % 23) - 0.5);
    assert_int_equal(ref_int2_decode_attn(q, &c, o_int2, &l, NULL), KVB_OK);
    decode_layout dl = {B, HQ, HKV, D, N};
    int32_t len[1] = {N};
    assert_int_equal(ref_decode_attn(q, K, V, len, o_dense, &dl, NULL), KVB_OK);
    assert_memory_equal(o_int2, o_dense, sizeof o_int2);
    /* the cache as bf16 rows (dequant_dense's reference): these codes are exact, so the rows are K and V,
     * the residual copied behind the quantized tokens; rows past T + R are left as they were */
    enum { L = N + 3 };
    kvb_bf16 *Kd = malloc(sizeof(kvb_bf16) * HKV * L * D), *Vd = malloc(sizeof(kvb_bf16) * HKV * L * D);
    memset(Kd, 0x7f, sizeof(kvb_bf16) * HKV * L * D), memset(Vd, 0x7f, sizeof(kvb_bf16) * HKV * L * D);
    assert_int_equal(ref_int2_dequantize(&c, Kd, Vd, L, &l), KVB_OK);
    for (int h = 0; h < HKV; h++) {
        assert_memory_equal(Kd + h * L * D, K + h * N * D, sizeof(kvb_bf16) * N * D);
        assert_memory_equal(Vd + h * L * D, V + h * N * D, sizeof(kvb_bf16) * N * D);
        assert_int_equal(Kd[(h * L + N) * D], 0x7f7f);
    }
    assert_int_equal(ref_int2_dequantize(&c, Kd, Vd, N - 1, &l), KVB_EINVAL);
    assert_error_mentions("ref_int2_dequantize: L=68 out of range [T + R = 69, inf)");
    free(Kd), free(Vd);
    free(K), free(V), cache_free(&c);
}

/* The attention reference spreads its threads over the slices when there are enough of them and over
 * one slice's tokens and channels when there are not (a sampled case keeps few slices): the same slice
 * gives the same bits either way, and the slices not chosen are not written. */
static void test_attention_same_for_any_threads(void **state)
{
    (void)state;
    enum { B = 1, HKV = 4, HQ = 16, G = HQ / HKV, D = 64, GS = 16, T = 256, R = 5, N = T + R };
    kvb_bf16 *K = malloc(sizeof(kvb_bf16) * HKV * N * D), *V = malloc(sizeof(kvb_bf16) * HKV * N * D);
    uint64_t s = 11;
    for (int i = 0; i < HKV * N * D; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        K[i] = bf((double)(s >> 40) / 4194304.0 - 2.0);
        V[i] = bf((double)((s >> 16) & 0xFFFFFF) / 4194304.0 - 2.0);
    }
    int2_layout l = {B, HKV, HQ, D, GS, T, T, R, R};
    int2_cache c = cache_of(K, V, &l);
    kvb_bf16 q[HQ * D], o_all[HQ * D], o_one[HQ * D];
    for (int i = 0; i < HQ * D; i++) q[i] = bf(0.07 * ((i * 37) % 29) - 1.0);
    memset(o_one, 0x7f, sizeof o_one);
    const uint8_t one_slice[HKV] = {0, 0, 1, 0};
#ifdef _OPENMP
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1); /* four slices, one thread: the threads take whole slices */
#endif
    assert_int_equal(ref_int2_decode_attn(q, &c, o_all, &l, NULL), KVB_OK);
#ifdef _OPENMP
    omp_set_num_threads(3); /* one slice, three threads: they share its tokens and channels */
#endif
    assert_int_equal(ref_int2_decode_attn(q, &c, o_one, &l, one_slice), KVB_OK);
#ifdef _OPENMP
    omp_set_num_threads(threads);
#endif
    assert_memory_equal(o_one + 2 * G * D, o_all + 2 * G * D, sizeof(kvb_bf16) * G * D);
    for (int i = 0; i < HQ * D; i++)
        if (i / (G * D) != 2) assert_int_equal(o_one[i], 0x7f7f);
    free(K), free(V), cache_free(&c);
}

/* The kernel-native layout (int2.h): every code and metadata value lands once (the round trip through
 * to_native and from_native restores random caches bit for bit, for every D and gs), one documented
 * position is checked by hand, and a capacity that is not a multiple of 64 is refused by name. */
static void test_native_layout_round_trip(void **state)
{
    (void)state;
    const int Ds[2] = {64, 128}, gss[4] = {16, 32, 64, 128};
    uint32_t x = 12345u;
    for (int a = 0; a < 2; a++)
        for (int b = 0; b < 4; b++) {
            if (gss[b] > Ds[a]) continue;
            int2_layout l = {.B = 2, .Hkv = 3, .Hq = 6, .D = Ds[a], .gs = gss[b], .Tcap = 256, .T = 256, .Rcap = 0, .R = 0};
            const int64_t nkq = int2_kq_elems(&l), nkm = int2_kmeta_elems(&l), nvq = int2_vq_elems(&l),
                          nvm = int2_vmeta_elems(&l);
            int2_cache c = {0}, back = {0};
            int2_native n = {0};
            c.Kq = malloc(4 * nkq), c.Vq = malloc(4 * nvq), back.Kq = calloc(nkq, 4), back.Vq = calloc(nvq, 4);
            n.Rec = calloc(int2_native_rec_elems(&l), 4), n.Km = calloc(int2_native_km_elems(&l), 2);
            assert_int_equal(4 * int2_native_rec_elems(&l) + 2 * int2_native_km_elems(&l),
                             4 * (nkq + nvq) + 2 * (2 * nkm + 2 * nvm)); /* the same bytes as the interchange arrays */
            c.Ks = malloc(2 * nkm), c.Kz = malloc(2 * nkm), c.Vs = malloc(2 * nvm), c.Vz = malloc(2 * nvm);
            back.Ks = calloc(nkm, 2), back.Kz = calloc(nkm, 2), back.Vs = calloc(nvm, 2), back.Vz = calloc(nvm, 2);
            for (int64_t i = 0; i < nkq; i++) c.Kq[i] = (x = x * 1664525u + 1013904223u);
            for (int64_t i = 0; i < nvq; i++) c.Vq[i] = (x = x * 1664525u + 1013904223u);
            for (int64_t i = 0; i < nkm; i++) c.Ks[i] = (kvb_fp16)(x = x * 1664525u + 1013904223u), c.Kz[i] = (kvb_fp16)(x >> 16);
            for (int64_t i = 0; i < nvm; i++) c.Vs[i] = (kvb_fp16)(x = x * 1664525u + 1013904223u), c.Vz[i] = (kvb_fp16)(x >> 16);
            assert_int_equal(ref_int2_to_native(&c, &n, &l), KVB_OK);
            assert_int_equal(ref_int2_from_native(&n, &back, &l), KVB_OK);
            assert_memory_equal(c.Kq, back.Kq, 4 * nkq);
            assert_memory_equal(c.Vq, back.Vq, 4 * nvq);
            assert_memory_equal(c.Ks, back.Ks, 2 * nkm);
            assert_memory_equal(c.Kz, back.Kz, 2 * nkm);
            assert_memory_equal(c.Vs, back.Vs, 2 * nvm);
            assert_memory_equal(c.Vz, back.Vz, 2 * nvm);
            if (l.D == 128 && l.gs == 16) {
                /* key channel 5 = 16j + 4t + 2p + hb with j=0, t=1, p=0, hb=1; token 64 + 43 of head 1:
                 * step 1, i = 2, token 16i + g + 8h with g = 3, h = 1: lane 13, bits 16 + 2(2i + h) = 26 */
                const int64_t bh = 1, d = 5, tok = 64 + 43;
                const unsigned want = (c.Kq[(bh * 128 + d) * (256 / 16) + tok / 16] >> (2 * (tok % 16))) & 3u;
                const int64_t rw = 8 * 128 + 64 * 8, word = (bh * 4 + 1) * rw + 0 * 64 + 2 * 13 + 0;
                assert_int_equal((n.Rec[word] >> 26) & 3u, want);
                /* value channel 37 = 16(4mh + m) + 2g + h with mh=0, m=2, g=2, h=1; token 64 + 16 + 11 =
                 * 64s + 16i + 2t + 8p + hb with s=1, i=1, t=1, p=1, hb=1: lane 9, word 2mh + p = 1,
                 * bits 16 + 2(2m + h) = 26 */
                const int64_t vt = 64 + 16 + 11, vd = 37;
                const unsigned vwant = (c.Vq[(bh * 256 + vt) * 8 + vd / 16] >> (2 * (vd % 16))) & 3u;
                const int64_t vword = (bh * 4 + 1) * rw + 4 * 128 + 1 * 128 + 9 * 4 + 1;
                assert_int_equal((n.Rec[vword] >> 26) & 3u, vwant);
            }
            free(c.Kq), free(c.Vq), free(c.Ks), free(c.Kz), free(c.Vs), free(c.Vz);
            free(back.Kq), free(back.Vq), free(back.Ks), free(back.Kz), free(back.Vs), free(back.Vz);
            free(n.Rec), free(n.Km);
        }
    int2_layout bad = {.B = 1, .Hkv = 1, .Hq = 1, .D = 64, .gs = 16, .Tcap = 96, .T = 96};
    int2_cache c = {0};
    int2_native n = {0};
    assert_int_equal(ref_int2_to_native(&c, &n, &bad), KVB_EINVAL);
    assert_non_null(strstr(kvb_last_error(), "Tcap=96"));
}

/* The CUDA quantizers compute (x - zero) / scale without a division: r = RN(1/s), q0 = RN(a r),
 * rem = fma(-q0, s, a), q1 = RN(q0 + rem r) is the IEEE quotient (Markstein). Checked here over random,
 * tie-heavy (halves in [0, 3]) and narrow-range groups in the supported input range. */
static void test_division_free_quotient_is_ieee(void **state)
{
    (void)state;
    uint64_t st = 88172645463325252ull;
    long n = 0, ties = 0;
    for (long g = 0; g < 200000; g++) {
        float x[16];
        int kind = (int)(g % 4);
        st ^= st << 13, st ^= st >> 7, st ^= st << 17;
        double scale = ldexp(1.0, (int)(st % 30) - 15), off = ((double)(st % 2001) - 1000) / 100.0 * scale;
        for (int i = 0; i < 16; i++) {
            st ^= st << 13, st ^= st >> 7, st ^= st << 17;
            double u = (double)(st % 1000000) / 1e6;
            double v = kind == 0 ? off + scale * (u * 6 - 3) : kind == 1 ? 0.5 * (double)(st % 7)
                     : kind == 2 ? scale * ((double)(st % 13) - 6) : off + scale * 1e-3 * u;
            x[i] = kvb_bf16_to_float(bf(v));
        }
        int skip = 0; /* inside the supported input range only */
        for (int i = 0; i < 16; i++) skip |= fabsf(x[i]) > (float)INT2_MAX_ABS;
        if (skip) continue;
        uint8_t codes[16];
        kvb_fp16 sh, zh;
        int2_quantize_group(x, 16, codes, &sh, &zh);
        float s = kvb_fp16_to_float(sh), z = kvb_fp16_to_float(zh);
        if (s == 0.0f) continue;
        volatile float r = 1.0f / s;
        for (int i = 0; i < 16; i++) {
            volatile float a = x[i] - z, q0 = a * r, q_ieee = a / s;
            volatile float rem = fmaf(-q0, s, a);
            volatile float q1 = fmaf(rem, r, q0);
            float c = rintf(q1);
            c = c < 0 ? 0 : c > 3 ? 3 : c;
            n++, ties += q_ieee - floorf(q_ieee) == 0.5f;
            if (q1 != q_ieee || (uint8_t)c != codes[i])
                fail_msg("x=%.9g zero=%.9g scale=%.9g: IEEE %.9g, division-free %.9g", x[i], z, s, q_ieee, q1);
        }
    }
    assert_true(n > 1500000 && ties > 100000);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_group_ties_round_to_even),
        cmocka_unit_test(test_group_inexact_scale),
        cmocka_unit_test(test_group_scale_zero),
        cmocka_unit_test(test_packing_and_layouts),
        cmocka_unit_test(test_bad_layouts),
        cmocka_unit_test(test_bad_inputs),
        cmocka_unit_test(test_append_and_flush),
        cmocka_unit_test(test_matmuls_against_direct_sums),
        cmocka_unit_test(test_attention_exact_data_matches_dense),
        cmocka_unit_test(test_attention_same_for_any_threads),
        cmocka_unit_test(test_division_free_quotient_is_ieee),
        cmocka_unit_test(test_native_layout_round_trip),
    };
    return cmocka_run_group_tests_name("int2 reference", tests, NULL, NULL);
}
