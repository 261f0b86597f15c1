/* test_numerics.c: bf16 / fp16 conversions (round to nearest even), and the seeded generators.
 *
 * The oracle for double -> bf16 / fp16 is independent of the code under test: a sorted table of
 * every non-negative finite value of the format (plus infinity), a binary search for the two
 * neighbours of x, the nearer one, ties to the even bit pattern. fp16 is also checked against the
 * compiler's _Float16 conversions.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "harness/core/tensor.h"
#include "tests/testlib.h"

/* table[i] = value of bit pattern i, for i in [0, n) (finite non-negative). table[n] is the
 * infinity pattern's place in rounding: the power of two one ulp past the largest finite value
 * (IEEE rounds to infinity from there, and from half an ulp below it). */
static double *make_table(int fp16, int *n)
{
    int count = fp16 ? 0x7C00 : 0x7F80; /* first infinity pattern */
    double *t = malloc(sizeof(double) * (size_t)(count + 1));
    for (int i = 0; i < count; i++) t[i] = fp16 ? kvb_fp16_to_float((uint16_t)i) : kvb_bf16_to_float((uint16_t)i);
    t[count] = fp16 ? 65536.0 : 0x1p128;
    *n = count;
    return t;
}

static uint16_t oracle(const double *t, int n, double x)
{
    uint16_t sign = signbit(x) ? 0x8000 : 0;
    double a = fabs(x);
    int lo = 0, hi = n; /* find largest i with t[i] <= a */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (t[mid] <= a) lo = mid;
        else hi = mid - 1;
    }
    if (a >= t[n]) return sign | (uint16_t)n;
    if (t[lo] == a) return sign | (uint16_t)lo;
    double dlo = a - t[lo], dhi = t[lo + 1] - a;
    int pick = dlo < dhi ? lo : dhi < dlo ? lo + 1 : (lo % 2 == 0 ? lo : lo + 1);
    return sign | (uint16_t)pick;
}

static double random_double(kvb_rng *r, int emin, int emax)
{
    double m = 1.0 + (double)(kvb_rng_next(r) >> 11) * 0x1p-53;
    int e = emin + (int)kvb_rng_below(r, (uint64_t)(emax - emin + 1));
    double x = ldexp(m, e);
    return kvb_rng_next(r) & 1 ? -x : x;
}

static void test_bf16_roundtrip_all_patterns(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 0x10000; h++) {
        float f = kvb_bf16_to_float((uint16_t)h);
        if (isnan(f)) {
            assert_true(isnan(kvb_bf16_to_float(kvb_float_to_bf16(f))));
            assert_true(isnan(kvb_bf16_to_float(kvb_double_to_bf16(f))));
            continue;
        }
        assert_int_equal(kvb_float_to_bf16(f), h);
        assert_int_equal(kvb_double_to_bf16((double)f), h);
    }
}

static void test_bf16_rounding_against_table(void **state)
{
    (void)state;
    int n;
    double *t = make_table(0, &n);
    kvb_rng r = kvb_rng_make(7, 1);
    for (int i = 0; i < 1000000; i++) {
        double x = random_double(&r, -140, 128);
        assert_int_equal(kvb_double_to_bf16(x), oracle(t, n, x));
        float f = (float)x; /* float input: the fast path must agree with the double path */
        assert_int_equal(kvb_float_to_bf16(f), oracle(t, n, (double)f));
    }
    /* every exact midpoint between neighbours rounds to the even pattern */
    for (int i = 0; i + 1 <= n; i += 7) {
        double mid = 0.5 * (t[i] + t[i + 1]);
        uint16_t want = (uint16_t)(i % 2 == 0 ? i : i + 1);
        assert_int_equal(kvb_double_to_bf16(mid), want);
        if ((double)(float)mid == mid) assert_int_equal(kvb_float_to_bf16((float)mid), want);
    }
    free(t);
}

static void test_bf16_specials(void **state)
{
    (void)state;
    assert_int_equal(kvb_double_to_bf16(0.0), 0x0000);
    assert_int_equal(kvb_double_to_bf16(-0.0), 0x8000);
    assert_int_equal(kvb_double_to_bf16(INFINITY), 0x7F80);
    assert_int_equal(kvb_double_to_bf16(-INFINITY), 0xFF80);
    assert_int_equal(kvb_double_to_bf16(1e39), 0x7F80);             /* overflow */
    assert_int_equal(kvb_double_to_bf16(1.0 + 0x1p-8), 0x3F80);      /* tie: 1.0 is even */
    assert_int_equal(kvb_double_to_bf16(1.0 + 0x1p-8 + 0x1p-30), 0x3F81); /* just above the tie */
    assert_int_equal(kvb_double_to_bf16(0x1p-133), 0x0001);          /* smallest subnormal */
    assert_true(isnan(kvb_bf16_to_float(kvb_double_to_bf16(NAN))));
    /* one rounding from double: x just above a bf16 tie, but float(x) lands exactly on the tie */
    double x = 1.0 + 0x1p-8 + 0x1p-40;
    assert_int_equal(kvb_double_to_bf16(x), 0x3F81);
    assert_int_equal(kvb_float_to_bf16((float)x), 0x3F80); /* the double rounding the numerics rule forbids (reference/kvb.h) */
}

static void test_fp16_all_patterns_and_compiler(void **state)
{
    (void)state;
    for (uint32_t h = 0; h < 0x10000; h++) {
        _Float16 c;
        uint16_t bits = (uint16_t)h;
        memcpy(&c, &bits, 2);
        float f = kvb_fp16_to_float(bits);
        if (isnan((float)c)) {
            assert_true(isnan(f));
            continue;
        }
        assert_true(f == (float)c);
        assert_int_equal(kvb_float_to_fp16(f), h);
    }
    kvb_rng r = kvb_rng_make(11, 2);
    for (int i = 0; i < 1000000; i++) {
        double x = random_double(&r, -28, 17);
        _Float16 c = (_Float16)x;
        uint16_t want;
        memcpy(&want, &c, 2);
        assert_int_equal(kvb_double_to_fp16(x), want);
        float f = (float)x;
        c = (_Float16)f;
        memcpy(&want, &c, 2);
        assert_int_equal(kvb_float_to_fp16(f), want);
    }
}

static void test_fp16_rounding_against_table(void **state)
{
    (void)state;
    int n;
    double *t = make_table(1, &n);
    kvb_rng r = kvb_rng_make(5, 3);
    for (int i = 0; i < 300000; i++) {
        double x = random_double(&r, -30, 17);
        assert_int_equal(kvb_double_to_fp16(x), oracle(t, n, x));
    }
    for (int i = 0; i + 1 <= n; i++) {
        double mid = 0.5 * (t[i] + t[i + 1]);
        assert_int_equal(kvb_double_to_fp16(mid), (uint16_t)(i % 2 == 0 ? i : i + 1));
    }
    assert_int_equal(kvb_double_to_fp16(65519.99), 0x7BFF);
    assert_int_equal(kvb_double_to_fp16(65520.0), 0x7C00); /* the tie above the largest rounds to inf */
    assert_int_equal(kvb_double_to_fp16(0x1p-24), 0x0001);
    assert_int_equal(kvb_double_to_fp16(0x1p-25), 0x0000); /* tie with 0: even */
    free(t);
}

static void test_generators_are_pure_functions_of_index(void **state)
{
    (void)state;
    kvb_bf16 a[1000], b[500];
    kvb_fill_bf16_normal(a, 1000, 42, kvb_stream_of("x"), 0, 0, 1);
    kvb_fill_bf16_normal(b, 500, 42, kvb_stream_of("x"), 500, 0, 1);
    assert_memory_equal(a + 500, b, sizeof b); /* element i depends on i only */
    double sum = 0, sq = 0;
    int zeros = 0;
    for (int i = 0; i < 1000; i++) {
        double v = kvb_bf16_to_float(a[i]);
        sum += v, sq += v * v, zeros += v == 0;
    }
    assert_true(fabs(sum / 1000) < 0.15);         /* N(0,1): mean ~ 0 */
    assert_true(fabs(sq / 1000 - 1.0) < 0.2);     /* variance ~ 1 */
    assert_true(zeros < 5);                        /* never all zeros */
    kvb_fill_bf16_normal(b, 500, 43, kvb_stream_of("x"), 500, 0, 1);
    assert_memory_not_equal(a + 500, b, sizeof b); /* another seed, other values */
    kvb_rng r = kvb_rng_make(1, 1);
    int hist[7] = {0};
    for (int i = 0; i < 70000; i++) hist[kvb_rng_below(&r, 7)]++;
    for (int i = 0; i < 7; i++) assert_true(hist[i] > 9500 && hist[i] < 10500);
}

/* The fill memo: a large fill again with the same arguments is a copy of the first, the same bits as a draw
 * with nothing kept; other arguments draw anew; the limit drops the least recently used. */
static void test_fill_memo(void **state)
{
    (void)state;
    const int64_t n = 20 << 20; /* 40 MiB of bf16: above the memo's 32 MiB threshold */
    const size_t bytes = sizeof(kvb_bf16) * (size_t)n;
    kvb_bf16 *a = malloc(bytes), *b = malloc(bytes), *c = malloc(bytes);
    assert_true(a && b && c);
    kvb_fill_memo_release();
    kvb_fill_bf16_normal(a, n, 7, kvb_stream_of("K"), 3, 0, 1); /* drawn, then kept */
    assert_int_equal(kvb_fill_memo_held(), bytes);
    memset(b, 0, bytes);
    kvb_fill_bf16_normal(b, n, 7, kvb_stream_of("K"), 3, 0, 1); /* the copy */
    assert_memory_equal(a, b, bytes);
    assert_int_equal(kvb_fill_memo_held(), bytes);
    kvb_fill_bf16_normal(c, n, 7, kvb_stream_of("K"), 4, 0, 1); /* another first index: drawn */
    assert_memory_equal(a + 1, c, bytes - sizeof(kvb_bf16));
    assert_int_equal(kvb_fill_memo_held(), 2 * bytes);
    kvb_fill_bf16_normal(c, n, 7, kvb_stream_of("K"), 3, 0, 2); /* another std: drawn */
    assert_memory_not_equal(a, c, bytes);
    kvb_fill_memo_limit(2 * bytes); /* the oldest of the three goes: the first */
    assert_int_equal(kvb_fill_memo_held(), 2 * bytes);
    kvb_fill_memo_release();
    assert_int_equal(kvb_fill_memo_held(), 0);
    kvb_fill_bf16_normal(b, n, 7, kvb_stream_of("K"), 3, 0, 1); /* drawn with nothing kept: as the copy */
    assert_memory_equal(a, b, bytes);
    kvb_fill_memo_limit(bytes / 2); /* below one fill: none is kept */
    assert_int_equal(kvb_fill_memo_held(), 0);
    kvb_fill_bf16_normal(b, n, 7, kvb_stream_of("K"), 3, 0, 1);
    assert_int_equal(kvb_fill_memo_held(), 0);
    assert_memory_equal(a, b, bytes);
    kvb_fill_memo_limit(KVB_FILL_MEMO_MAX);
    /* an op's own fill: kept under its kind and arguments, found by the same, not by others */
    const uint64_t args[3] = {1, 2, 3}, other[3] = {1, 2, 4};
    kvb_fill_memo_keep("test fill", args, 3, a, bytes);
    memset(b, 0, bytes);
    assert_int_equal(kvb_fill_memo_fetch("test fill", args, 3, b, bytes), 1);
    assert_memory_equal(a, b, bytes);
    assert_int_equal(kvb_fill_memo_fetch("test fill", other, 3, b, bytes), 0);
    assert_int_equal(kvb_fill_memo_fetch("other fill", args, 3, b, bytes), 0);
    assert_int_equal(kvb_fill_memo_fetch("test fill", args, 2, b, bytes), 0);
    kvb_fill_memo_release();
    free(a), free(b), free(c);
}

static void test_npy_header(void **state)
{
    (void)state;
    mkdir("build", 0755); /* there already in a source tree; not in a bundle's root */
    const char *path = "build/test_npy_header.npy";
    int32_t data[6] = {1, 2, 3, 4, 5, 6};
    int64_t shape[2] = {2, 3};
    assert_int_equal(kvb_npy_write(path, KVB_I32, 2, shape, data), KVB_OK);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    unsigned char buf[256];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    assert_memory_equal(buf, "\x93NUMPY\x01\x00", 8);
    size_t hlen = buf[8] | (buf[9] << 8);
    assert_int_equal((10 + hlen) % 64, 0); /* data aligned as numpy expects */
    assert_int_equal(buf[10 + hlen - 1], '\n');
    assert_non_null(strstr((char *)buf + 10, "'descr': '<i4'"));
    assert_non_null(strstr((char *)buf + 10, "'shape': (2, 3)"));
    assert_int_equal(n, 10 + hlen + sizeof data);
    assert_memory_equal(buf + 10 + hlen, data, sizeof data);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16_roundtrip_all_patterns),
        cmocka_unit_test(test_bf16_rounding_against_table),
        cmocka_unit_test(test_bf16_specials),
        cmocka_unit_test(test_fp16_all_patterns_and_compiler),
        cmocka_unit_test(test_fp16_rounding_against_table),
        cmocka_unit_test(test_generators_are_pure_functions_of_index),
        cmocka_unit_test(test_fill_memo),
        cmocka_unit_test(test_npy_header),
    };
    return cmocka_run_group_tests_name("numerics", tests, NULL, NULL);
}
