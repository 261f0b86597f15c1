/* test_compare_results.c: `kvbench compare` as a gate, on hand-made bench files: every verdict, the
 * noise of both medians, and every kind of unusable file. No device needed. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "harness/core/compare_results.h"
#include "tests/testlib.h"

static char dir[] = "/tmp/kvb_compare_XXXXXX";

/* One bench file of kvbench's shape; `cases` is the text inside "benchmarks": [...]. */
static const char *file_of(const char *name, const char *cases)
{
    static char path[8][256];
    static int next;
    char *p = path[next++ % 8];
    snprintf(p, 256, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    assert_non_null(f);
    fprintf(f, "{\"context\": {\"kvbench_git_revision\": \"abc1234\", \"gpu\": \"test\"},\n \"benchmarks\": [%s]}\n",
            cases);
    fclose(f);
    return p;
}

static const char *raw_file(const char *name, const char *text)
{
    static char p[256];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    fputs(text, f);
    fclose(f);
    return p;
}

/* a case entry: median (us), noise (%), samples */
static char *entry(char *buf, size_t n, const char *id, double median, double noise_pct, int samples)
{
    snprintf(buf, n,
             "{\"name\": \"%s/manual_time\", \"run_type\": \"iteration\", \"real_time\": %g, \"time_unit\": \"us\", "
             "\"median_us\": %g, \"noise_pct\": %g, \"samples\": %d}",
             id, median, median, noise_pct, samples);
    return buf;
}

static int gate(const char *base, const char *cur, double threshold)
{
    FILE *devnull = fopen("/dev/null", "w");
    int rc = kvb_compare_files(base, cur, threshold, NULL, devnull);
    fclose(devnull);
    return rc;
}

static void test_identical_files_pass(void **state)
{
    (void)state;
    char a[512], b[512], both[1100];
    snprintf(both, sizeof both, "%s, %s", entry(a, sizeof a, "x B=1", 100, 1, 200), entry(b, sizeof b, "y B=2", 50, 3, 200));
    const char *f = file_of("same.json", both);
    assert_int_equal(gate(f, f, 0.05), 0);
}

/* The case: 30% slower with 16% noise per sample must not be "same". With the sample counts
 * a bench takes (tens to hundreds; the longest bench cases take about 20) it is a regression; from
 * only 10 samples it cannot be resolved at z = 3 and is reported as noisy, never as same. */
static void test_30_percent_slower_with_16_percent_noise_is_slower(void **state)
{
    (void)state;
    char a[512], b[512];
    const char *base = file_of("b.json", entry(a, sizeof a, "x B=1", 100, 16, 20));
    const char *cur = file_of("c.json", entry(b, sizeof b, "x B=1", 130, 16, 20));
    double change, z;
    kvb_case_timing t0 = {1, 0, 100, 0.16, 20}, t1 = {1, 0, 130, 0.16, 20};
    assert_int_equal(kvb_compare_case(&t0, &t1, 0.05, &change, &z), KVB_V_SLOWER);
    assert_true(fabs(change - 0.30) < 1e-12);
    assert_true(z > 3);
    assert_int_equal(gate(base, cur, 0.05), 1);
    t0.n = t1.n = 10;
    assert_int_equal(kvb_compare_case(&t0, &t1, 0.05, &change, &z), KVB_V_NOISY);
    t0.n = 2, t0.noise = 0; /* one side without a noise estimate */
    assert_int_equal(kvb_compare_case(&t0, &t1, 0.05, &change, &z), KVB_V_NOISY);
}

static void test_small_change_is_same(void **state)
{
    (void)state;
    char a[512], b[512];
    const char *base = file_of("b.json", entry(a, sizeof a, "x B=1", 100, 0.5, 500));
    const char *cur = file_of("c.json", entry(b, sizeof b, "x B=1", 103, 0.5, 500));
    assert_int_equal(gate(base, cur, 0.05), 0);
}

/* A large change that the noise cannot resolve (3 samples, 40% noise) is "noisy", not a regression;
 * the same change measured precisely is one. */
static void test_change_within_the_noise_is_noisy(void **state)
{
    (void)state;
    double change, z;
    kvb_case_timing t0 = {1, 0, 100, 0.40, 3}, t1 = {1, 0, 130, 0.40, 3};
    assert_int_equal(kvb_compare_case(&t0, &t1, 0.05, &change, &z), KVB_V_NOISY);
    t0.noise = t1.noise = 0.01;
    assert_int_equal(kvb_compare_case(&t0, &t1, 0.05, &change, &z), KVB_V_SLOWER);
    char a[512], b[512];
    assert_int_equal(gate(file_of("b.json", entry(a, sizeof a, "x B=1", 100, 40, 3)),
                          file_of("c.json", entry(b, sizeof b, "x B=1", 130, 40, 3)), 0.05),
                     0);
}

static void test_faster_passes(void **state)
{
    (void)state;
    char a[512], b[512];
    double change, z;
    kvb_case_timing t0 = {1, 0, 100, 0.01, 100}, t1 = {1, 0, 70, 0.01, 100};
    assert_int_equal(kvb_compare_case(&t0, &t1, 0.05, &change, &z), KVB_V_FASTER);
    assert_int_equal(gate(file_of("b.json", entry(a, sizeof a, "x B=1", 100, 1, 100)),
                          file_of("c.json", entry(b, sizeof b, "x B=1", 70, 1, 100)), 0.05),
                     0);
}

static void test_missing_case_fails(void **state)
{
    (void)state;
    char a[512], b[512], both[1100];
    snprintf(both, sizeof both, "%s, %s", entry(a, sizeof a, "x B=1", 100, 1, 100), entry(b, sizeof b, "y B=2", 50, 1, 100));
    const char *base = file_of("b.json", both);
    const char *cur = file_of("c.json", entry(a, sizeof a, "x B=1", 100, 1, 100));
    assert_int_equal(gate(base, cur, 0.05), 1);
}

static void test_new_case_passes(void **state)
{
    (void)state;
    char a[512], b[512], both[1100];
    const char *base = file_of("b.json", entry(a, sizeof a, "x B=1", 100, 1, 100));
    snprintf(both, sizeof both, "%s, %s", entry(a, sizeof a, "x B=1", 100, 1, 100), entry(b, sizeof b, "y B=2", 50, 1, 100));
    assert_int_equal(gate(base, file_of("c.json", both), 0.05), 0);
}

static void test_failed_case_fails(void **state)
{
    (void)state;
    char a[512];
    const char *base = file_of("b.json", entry(a, sizeof a, "x B=1", 100, 1, 100));
    const char *cur = file_of("c.json", "{\"name\": \"x B=1/manual_time\", \"run_type\": \"iteration\", "
                                        "\"error_occurred\": true, \"error_message\": \"validation after timing failed\"}");
    assert_int_equal(gate(base, cur, 0.05), 1);
}

static void test_unusable_files(void **state)
{
    (void)state;
    char a[512];
    const char *good = file_of("good.json", entry(a, sizeof a, "x B=1", 100, 1, 100));
    assert_int_equal(gate(good, raw_file("empty.json", ""), 0.05), 2);
    assert_int_equal(gate(good, raw_file("foreign.json", "{\"foo\": 1}"), 0.05), 2);
    assert_int_equal(gate(good, raw_file("text.json", "index_scan M=7 tier=smoke\n"), 0.05), 2);
    assert_int_equal(gate(good, raw_file("gbench.json", "{\"context\": {}, \"benchmarks\": []}"), 0.05), 2);
    assert_int_equal(gate(good, file_of("nocases.json", ""), 0.05), 2);
    assert_int_equal(gate(good, "/nonexistent/kvb.json", 0.05), 2);
    assert_int_equal(gate(raw_file("empty.json", ""), good, 0.05), 2);
}

/* Options anywhere, a bad threshold and an unknown option refused. */
static void test_command_line(void **state)
{
    (void)state;
    char a[512];
    const char *f = file_of("cl.json", entry(a, sizeof a, "x B=1", 100, 1, 100));
    char *fa = strdup(f), out[300];
    snprintf(out, sizeof out, "%s/verdicts.json", dir);
    char *v1[] = {"--threshold", "10", fa, fa};
    assert_int_equal(kvb_compare_main(4, v1), 0);
    char *v2[] = {fa, fa, "--threshold=10", "--json", out};
    assert_int_equal(kvb_compare_main(5, v2), 0);
    assert_int_equal(access(out, R_OK), 0);
    char *v3[] = {fa, "--threshold", "0", fa};
    assert_int_equal(kvb_compare_main(4, v3), 2);
    char *v4[] = {fa, fa, "--frobnicate", "1"};
    assert_int_equal(kvb_compare_main(4, v4), 2);
    char *v5[] = {fa};
    assert_int_equal(kvb_compare_main(1, v5), 2);
    free(fa);
}

int main(void)
{
    if (!mkdtemp(dir)) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_identical_files_pass),
        cmocka_unit_test(test_30_percent_slower_with_16_percent_noise_is_slower),
        cmocka_unit_test(test_small_change_is_same),
        cmocka_unit_test(test_change_within_the_noise_is_noisy),
        cmocka_unit_test(test_faster_passes),
        cmocka_unit_test(test_missing_case_fails),
        cmocka_unit_test(test_new_case_passes),
        cmocka_unit_test(test_failed_case_fails),
        cmocka_unit_test(test_unusable_files),
        cmocka_unit_test(test_command_line),
    };
    int rc = cmocka_run_group_tests_name("compare_results", tests, NULL, NULL);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) rc = rc ? rc : 0;
    return rc;
}
