/* test_compare_results.c: `kvbench compare` as a gate, on hand-made bench files: every verdict, the
 * noise of both medians, and every kind of unusable file. No device needed. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness/core/compare_results.h"
#include "harness/core/json_read.h"
#include "reference/kvb.h"
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

/* A case 30% slower with 16% noise per sample must not be "same". With the sample counts
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

/* A case id twice in one file is refused: which timing is meant is not known. */
static void test_duplicate_ids_refused(void **state)
{
    (void)state;
    char a[512], b[512], both[1100];
    snprintf(both, sizeof both, "%s, %s", entry(a, sizeof a, "x B=1", 100, 1, 100), entry(b, sizeof b, "x B=1", 50, 1, 100));
    const char *good = file_of("good.json", entry(a, sizeof a, "x B=1", 100, 1, 100));
    assert_int_equal(gate(file_of("dup.json", both), good, 0.05), 2);
    assert_int_equal(gate(good, file_of("dup.json", both), 0.05), 2);
}

/* Every timing field a case that ran must have, sound: refused (2) by field, never "noisy" or "same". */
static void test_unsound_timings_refused(void **state)
{
    (void)state;
    char a[512];
    const char *good = file_of("good.json", entry(a, sizeof a, "x B=1", 100, 1, 100));
    static const char *const bad[] = {
        /* samples: missing, not a number, negative, below 3, not an integer */
        "\"median_us\": 100, \"noise_pct\": 1",
        "\"median_us\": 100, \"noise_pct\": 1, \"samples\": \"many\"",
        "\"median_us\": 100, \"noise_pct\": 1, \"samples\": -5",
        "\"median_us\": 100, \"noise_pct\": 1, \"samples\": 2",
        "\"median_us\": 100, \"noise_pct\": 1, \"samples\": 3.5",
        "\"median_us\": 100, \"noise_pct\": 1, \"samples\": NaN",
        /* noise_pct: missing, negative, beyond what n positive samples allow, not finite */
        "\"median_us\": 100, \"samples\": 100",
        "\"median_us\": 100, \"noise_pct\": -1, \"samples\": 100",
        "\"median_us\": 100, \"noise_pct\": 1e300, \"samples\": 100",
        "\"median_us\": 100, \"noise_pct\": 1001, \"samples\": 100",
        "\"median_us\": 100, \"noise_pct\": Infinity, \"samples\": 100",
        /* median_us: missing, zero, negative, absurdly large, not finite, a string */
        "\"noise_pct\": 1, \"samples\": 100",
        "\"median_us\": 0, \"noise_pct\": 1, \"samples\": 100",
        "\"median_us\": -3, \"noise_pct\": 1, \"samples\": 100",
        "\"median_us\": 1.7e308, \"noise_pct\": 1, \"samples\": 100",
        "\"median_us\": NaN, \"noise_pct\": 1, \"samples\": 100",
        "\"median_us\": \"100\", \"noise_pct\": 1, \"samples\": 100",
        /* not JSON numbers at all */
        "\"median_us\": 0x64, \"noise_pct\": 1, \"samples\": 100",
        "\"median_us\": +100, \"noise_pct\": 1, \"samples\": 100",
        "\"median_us\": 0100, \"noise_pct\": 1, \"samples\": 100",
        "\"median_us\": 100, \"noise_pct\": 1, \"samples\": 100, \"error_occurred\": 1",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char text[600];
        snprintf(text, sizeof text, "{\"name\": \"x B=1/manual_time\", \"run_type\": \"iteration\", %s}", bad[i]);
        const char *f = file_of("bad.json", text);
        if (gate(good, f, 0.05) != 2) print_error("not refused: %s\n", bad[i]);
        assert_int_equal(gate(good, f, 0.05), 2);
        assert_int_equal(gate(f, good, 0.05), 2);
    }
    /* the bounds themselves are accepted; NaN in a field compare does not read is Google Benchmark's */
    const char *edge = file_of("edge.json", "{\"name\": \"x B=1/manual_time\", \"median_us\": 0.001, \"noise_pct\": 0, "
                                            "\"samples\": 3, \"cv\": NaN}");
    assert_int_equal(gate(edge, edge, 0.05), 0);
    edge = file_of("edge.json", "{\"name\": \"x B=1/manual_time\", \"median_us\": 1e12, \"noise_pct\": 1000, "
                                "\"samples\": 100}");
    assert_int_equal(gate(edge, edge, 0.05), 0);
}

/* A directory, a pipe, /dev/stdin-like streams: a directory refused with a message, a stream read. */
static void test_file_kinds(void **state)
{
    (void)state;
    char a[512];
    const char *good = file_of("good.json", entry(a, sizeof a, "x B=1", 100, 1, 100));
    assert_int_equal(gate(good, dir, 0.05), 2);
    assert_int_equal(gate(dir, good, 0.05), 2);
    char fifo[300];
    snprintf(fifo, sizeof fifo, "%s/fifo.json", dir);
    assert_int_equal(mkfifo(fifo, 0600), 0);
    pid_t pid = fork();
    if (pid == 0) { /* the writer: the whole file, through the pipe */
        FILE *in = fopen(good, "r"), *out = fopen(fifo, "w");
        int ch;
        while ((ch = fgetc(in)) != EOF) fputc(ch, out);
        fclose(out);
        _exit(0);
    }
    assert_int_equal(gate(good, fifo, 0.05), 0);
    waitpid(pid, NULL, 0);
    unlink(fifo);
}

/* --json over BASE or NEW is refused before anything is written; an unwritable --json is refused. */
static void test_json_output_never_clobbers_an_input(void **state)
{
    (void)state;
    char a[512];
    const char *base = file_of("base.json", entry(a, sizeof a, "x B=1", 100, 1, 100));
    char *keep = strdup(base);
    FILE *devnull = fopen("/dev/null", "w");
    assert_int_equal(kvb_compare_files(keep, keep, 0.05, keep, devnull), 2);
    kvb_jval v;
    assert_int_equal(kvb_json_read_file(keep, &v), KVB_OK); /* still the bench file */
    assert_non_null(kvb_jget(&v, "benchmarks"));
    kvb_json_free(&v);
    assert_int_equal(kvb_compare_files(keep, keep, 0.05, dir, devnull), 2); /* a directory */
    /* the verdicts file: valid JSON, ids escaped */
    char out[300];
    snprintf(out, sizeof out, "%s/verdicts.json", dir);
    const char *odd = file_of("odd.json", entry(a, sizeof a, "x \\\"q\\\" \\u0001 B=1", 100, 1, 100));
    assert_int_equal(kvb_compare_files(odd, odd, 0.05, out, devnull), 0);
    assert_int_equal(kvb_json_read_file(out, &v), KVB_OK);
    assert_string_equal(kvb_jstr(&kvb_jget(&v, "cases")->items[0], "id"), "x \"q\" \x01 B=1");
    kvb_json_free(&v);
    fclose(devnull);
    free(keep);
}

/* Matching by id is n log n: 100k cases on each side are read, matched and reported in well under a
 * second (a quadratic match, 5e9 string comparisons, takes minutes). */
static void test_100k_cases_compare_fast(void **state)
{
    (void)state;
    enum { N = 100000 };
    char base[300], cur[300];
    snprintf(base, sizeof base, "%s/big_base.json", dir);
    snprintf(cur, sizeof cur, "%s/big_new.json", dir);
    for (int side = 0; side < 2; side++) {
        FILE *f = fopen(side ? cur : base, "w");
        fprintf(f, "{\"context\": {\"kvbench_git_revision\": \"abc1234\"}, \"benchmarks\": [");
        for (int i = 0; i < N; i++) { /* NEW in the reverse order: every lookup a real search */
            const int k = side ? N - 1 - i : i;
            fprintf(f, "%s\n{\"name\": \"case B=%d/manual_time\", \"median_us\": %d, \"noise_pct\": 1, \"samples\": 100}",
                    i ? "," : "", k, 100 + k % 7);
        }
        fprintf(f, "]}\n");
        fclose(f);
    }
    /* the process's CPU time: other work on a shared machine does not count */
    struct timespec t0, t1;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t0);
    FILE *devnull = fopen("/dev/null", "w");
    int rc = kvb_compare_files(base, cur, 0.05, NULL, devnull);
    fclose(devnull);
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t1);
    const double s = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
    print_message("100k cases compared in %.3f s of CPU time (reading, matching, the report)\n", s);
    assert_int_equal(rc, 0);
    assert_true(s < 1.0);
}

static kvb_goal goal_of_x(const char *id, void *ctx)
{
    (void)ctx;
    if (!strcmp(id, "x B=1")) return (kvb_goal){"80% of the \"read\" rate", 90};
    if (!strcmp(id, "z B=3")) return (kvb_goal){"20x faster than impl=dense", 12.5};
    if (!strcmp(id, "w B=4")) return (kvb_goal){"(goal: 1.50x torch_sdpa; peer not measured)", 0};
    return (kvb_goal){NULL, 0};
}

/* bench: each case gets its goal's words (escaped, read back as written) and its goal's time where no
 * counter held it; nothing is dropped without a prefix */
static void test_goal_text_added(void **state)
{
    (void)state;
    char a[512], b[512], c[512], all[1800];
    snprintf(all, sizeof all, "%s, %s, %s", entry(a, sizeof a, "x B=1", 100, 1, 100),
             entry(b, sizeof b, "z B=3", 7.25, 0.5, 40), entry(c, sizeof c, "w B=4", 3, 0.5, 40));
    char *f = strdup(file_of("goals.json", all));
    assert_int_equal(kvb_bench_json_finish(f, NULL, goal_of_x, NULL), KVB_OK);
    kvb_jval v;
    assert_int_equal(kvb_json_read_file(f, &v), KVB_OK);
    const kvb_jval *arr = kvb_jget(&v, "benchmarks");
    assert_int_equal(arr->n, 3);
    assert_string_equal(kvb_jstr(&arr->items[2], "goal_text"), "(goal: 1.50x torch_sdpa; peer not measured)");
    assert_null(kvb_jget(&arr->items[2], "goal_us")); /* an unmeasured goal has no time */
    assert_string_equal(kvb_jstr(&arr->items[0], "goal_text"), "80% of the \"read\" rate");
    assert_string_equal(kvb_jstr(&arr->items[1], "goal_text"), "20x faster than impl=dense");
    assert_true(kvb_jnum(&arr->items[1], "goal_us", 0) == 12.5); /* no counter had it */
    assert_true(kvb_jnum(&arr->items[0], "median_us", 0) == 100);
    kvb_json_free(&v);
    assert_int_equal(kvb_bench_json_finish(f, NULL, goal_of_x, NULL), KVB_OK); /* again: not added twice */
    assert_int_equal(kvb_json_read_file(f, &v), KVB_OK);
    kvb_json_free(&v);
    assert_int_equal(gate(f, f, 0.05), 0); /* and compare reads it */
    free(f);
}

/* bench, interrupted: the cases not run leave the file, the others stay as they were. */
static void test_drop_interrupted_cases(void **state)
{
    (void)state;
    char a[512], b[512], all[1600];
    snprintf(all, sizeof all, "%s, {\"name\": \"y B=2/manual_time\", \"error_occurred\": true, \"error_message\": "
                              "\"interrupted: not run\"}, %s",
             entry(a, sizeof a, "x B=1", 100, 1, 100), entry(b, sizeof b, "z B=3", 7.25, 0.5, 40));
    char *f = strdup(file_of("interrupted.json", all));
    assert_int_equal(kvb_bench_json_drop_errors(f, "interrupted"), KVB_OK);
    kvb_jval v;
    assert_int_equal(kvb_json_read_file(f, &v), KVB_OK);
    const kvb_jval *arr = kvb_jget(&v, "benchmarks");
    assert_int_equal(arr->n, 2);
    assert_string_equal(kvb_jstr(&arr->items[1], "name"), "z B=3/manual_time");
    assert_true(kvb_jnum(&arr->items[1], "median_us", 0) == 7.25);
    assert_string_equal(kvb_jstr(kvb_jget(&v, "context"), "kvbench_git_revision"), "abc1234");
    kvb_json_free(&v);
    assert_int_equal(gate(f, f, 0.05), 0); /* and compare reads it */
    free(f);
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
    char *v6[] = {fa, "--threshold", "abc", fa};
    assert_int_equal(kvb_compare_main(4, v6), 2);
    char *v4[] = {fa, fa, "--frobnicate", "1"};
    assert_int_equal(kvb_compare_main(4, v4), 2);
    char *v5[] = {fa};
    assert_int_equal(kvb_compare_main(1, v5), 2);
    free(fa);
}

/* machines that differ are said before the verdicts (GPU, timing floor beyond 0.5 us, host CPUs);
 * the same machine says nothing; the verdicts stay the same */
static void test_machine_notes(void **state)
{
    (void)state;
    char a[512], text[1024], out[8192];
    entry(a, sizeof a, "x B=1", 100, 1, 100);
    snprintf(text, sizeof text,
             "{\"context\": {\"kvbench_git_revision\": \"abc1234\", \"gpu\": \"NVIDIA H200\", \"timing_floor_us\": "
             "\"2.72\", \"num_cpus\": 16}, \"benchmarks\": [%s]}",
             a);
    char *base = strdup(raw_file("m_base.json", text));
    snprintf(text, sizeof text,
             "{\"context\": {\"kvbench_git_revision\": \"abc1234\", \"gpu\": \"NVIDIA H200\", \"timing_floor_us\": "
             "\"2.90\", \"num_cpus\": 16}, \"benchmarks\": [%s]}",
             a);
    char *near = strdup(raw_file("m_near.json", text));
    snprintf(text, sizeof text,
             "{\"context\": {\"kvbench_git_revision\": \"def5678\", \"gpu\": \"NVIDIA H100\", \"timing_floor_us\": "
             "\"4.32\", \"num_cpus\": 32}, \"benchmarks\": [%s]}",
             a);
    char *far = strdup(raw_file("m_far.json", text));
    for (int k = 0; k < 2; k++) {
        FILE *f = tmpfile();
        assert_non_null(f);
        assert_int_equal(kvb_compare_files(base, k ? far : near, 0.05, NULL, f), 0);
        rewind(f);
        const size_t n = fread(out, 1, sizeof out - 1, f);
        out[n] = 0;
        fclose(f);
        if (!k) assert_null(strstr(out, "note:"));
        else {
            assert_non_null(strstr(out, "note: BASE ran on NVIDIA H200, NEW on NVIDIA H100"));
            assert_non_null(strstr(out, "note: timing floors (an empty launch) 2.72 us in BASE, 4.32 us in NEW"));
            assert_non_null(strstr(out, "note: BASE's host has 16 CPUs, NEW's 32"));
        }
    }
    free(base), free(near), free(far);
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
        cmocka_unit_test(test_duplicate_ids_refused),
        cmocka_unit_test(test_unsound_timings_refused),
        cmocka_unit_test(test_file_kinds),
        cmocka_unit_test(test_json_output_never_clobbers_an_input),
        cmocka_unit_test(test_100k_cases_compare_fast),
        cmocka_unit_test(test_drop_interrupted_cases),
        cmocka_unit_test(test_goal_text_added),
        cmocka_unit_test(test_machine_notes),
    };
    int rc = cmocka_run_group_tests_name("compare_results", tests, NULL, NULL);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) rc = rc ? rc : 0;
    return rc;
}
