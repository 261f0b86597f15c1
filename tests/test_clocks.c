/* test_clocks.c: what a timing was taken under (nvml_probe.h, the bench summary's clocks section):
 * NVML's clock-event reason bits named, the rule that flags a loop timed under a falling or limited
 * clock, and the summary's rows and its one line without NVML; and the samples' statistics (timing.h:
 * the cases' median, the ceilings' fastest repeat). Pure functions: no device, no NVML. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "harness/core/cli.h"
#include "harness/core/timing.h"
#include "tests/testlib.h"

static void test_reason_names(void **state)
{
    (void)state;
    char buf[300];
    assert_string_equal(kvb_clock_reason_names(0, buf, sizeof buf), "none");
    assert_string_equal(kvb_clock_reason_names(0x1, buf, sizeof buf), "GPU idle");
    assert_string_equal(kvb_clock_reason_names(0x2, buf, sizeof buf), "applications clocks setting");
    assert_string_equal(kvb_clock_reason_names(0x4 | 0x8, buf, sizeof buf), "SW power cap, HW slowdown");
    assert_string_equal(kvb_clock_reason_names(0x10 | 0x20 | 0x40 | 0x80, buf, sizeof buf),
                        "sync boost, SW thermal slowdown, HW thermal slowdown, HW power brake slowdown");
    assert_string_equal(kvb_clock_reason_names(0x100 | 0x200 | 0x400, buf, sizeof buf),
                        "display clock setting, board limit, reliability");
    /* a bit this build has no name for is shown, not dropped */
    assert_string_equal(kvb_clock_reason_names(0x1000 | 0x4, buf, sizeof buf), "SW power cap, reason 0x1000");
    /* a short buffer is cut, never overrun */
    char small[8];
    kvb_clock_reason_names(0x4 | 0x8, small, sizeof small);
    assert_int_equal(strlen(small), sizeof small - 1);
}

static kvb_clock_sample sample(double sm, unsigned long long reasons)
{
    return (kvb_clock_sample){.valid = 1, .sm_mhz = sm, .mem_mhz = 2619, .temp_c = 40, .power_w = 300,
                              .have_reasons = 1, .reasons = reasons};
}

static int flag(double sm0, unsigned long long r0, double sm1, unsigned long long r1, char *note, size_t n)
{
    kvb_clock_record c = {sample(sm0, r0), sample(sm1, r1), 1980};
    return kvb_clock_flag(&c, note, n);
}

static void test_flag_rule(void **state)
{
    (void)state;
    char note[400];
    /* steady at the max, idle between loops: nothing to say */
    assert_int_equal(flag(1980, KVB_CLOCKS_GPU_IDLE, 1980, 0, note, sizeof note), 0);
    assert_string_equal(note, "");
    /* clocks the operator set (applications clocks) are not a throttle */
    assert_int_equal(flag(1980, KVB_CLOCKS_APPLICATIONS_SETTING, 1980, KVB_CLOCKS_APPLICATIONS_SETTING, note, sizeof note), 0);
    /* a fall of 2.5% during the loop is flagged; 1.5% is not */
    assert_int_equal(flag(1980, 0, 1930, 0, note, sizeof note), 1);
    assert_non_null(strstr(note, "SM clock fell from 1980 to 1930 MHz during the loop (-2.5%)"));
    assert_int_equal(flag(1980, 0, 1950, 0, note, sizeof note), 0);
    /* rising from an idle clock at the start is not a fall */
    assert_int_equal(flag(345, KVB_CLOCKS_GPU_IDLE, 1980, 0, note, sizeof note), 0);
    /* ending below 80% of the max is flagged even without a fall: 1500 of 1980 (75.8%), not 1600 (80.8%) */
    assert_int_equal(flag(1500, 0, 1500, 0, note, sizeof note), 1);
    assert_non_null(strstr(note, "SM clock 1500 MHz at the end, below 80% of its max 1980 MHz"));
    assert_int_equal(flag(1600, 0, 1600, 0, note, sizeof note), 0);
    /* a throttle reason, named, at the end, at the start, or both */
    assert_int_equal(flag(1980, 0, 1980, KVB_CLOCKS_SW_POWER_CAP | KVB_CLOCKS_GPU_IDLE, note, sizeof note), 1);
    assert_string_equal(note, "clocks limited at the end: SW power cap");
    assert_int_equal(flag(1980, KVB_CLOCKS_HW_SLOWDOWN, 1980, 0, note, sizeof note), 1);
    assert_string_equal(note, "clocks limited at the start: HW slowdown");
    assert_int_equal(flag(1980, KVB_CLOCKS_SW_THERMAL, 1980, KVB_CLOCKS_SW_THERMAL, note, sizeof note), 1);
    assert_string_equal(note, "clocks limited at the start and the end: SW thermal slowdown");
    assert_int_equal(flag(1980, KVB_CLOCKS_SYNC_BOOST, 1980, KVB_CLOCKS_HW_THERMAL, note, sizeof note), 1);
    assert_string_equal(note, "clocks limited at the start: sync boost; clocks limited at the end: HW thermal slowdown");
    /* every cause at once, in one note */
    assert_int_equal(flag(1980, 0, 1400, KVB_CLOCKS_HW_POWER_BRAKE, note, sizeof note), 1);
    assert_non_null(strstr(note, "fell from 1980 to 1400"));
    assert_non_null(strstr(note, "; SM clock 1400 MHz at the end, below 80%"));
    assert_non_null(strstr(note, "; clocks limited at the end: HW power brake slowdown"));
    /* without both samples, or without the reasons, nothing is claimed from them */
    kvb_clock_record c = {sample(1980, 0), sample(1000, KVB_CLOCKS_HW_SLOWDOWN), 1980};
    c.end.valid = 0;
    assert_int_equal(kvb_clock_flag(&c, note, sizeof note), 0);
    c.end.valid = 1, c.end.sm_mhz = 1980, c.end.have_reasons = 0;
    assert_int_equal(kvb_clock_flag(&c, NULL, 0), 0);
    /* an unknown max: the fall and the reasons still count */
    c = (kvb_clock_record){sample(1980, 0), sample(1000, 0), -1};
    assert_int_equal(kvb_clock_flag(&c, note, sizeof note), 1);
    assert_null(strstr(note, "of its max"));
}

static char *summary(const kvb_bench_result *res, int n, const char *unavailable, int *flagged)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    *flagged = kvb_bench_clock_summary(f, res, n, unavailable, 700);
    fclose(f);
    return buf;
}

static void test_summary_section(void **state)
{
    (void)state;
    kvb_case c1, c2, c3;
    assert_int_equal(kvb_case_parse("decode_attn B=8 L=32768", "test", &c1), KVB_OK);
    assert_int_equal(kvb_case_parse("decode_attn B=8 L=131072", "test", &c2), KVB_OK);
    assert_int_equal(kvb_case_parse("decode_attn B=1 L=131072", "test", &c3), KVB_OK);
    kvb_bench_result res[3] = {
        {.c = &c1, .done = 1, .clocks = {sample(1980, KVB_CLOCKS_GPU_IDLE), sample(1980, 0), 1980}},
        {.c = &c2, .done = 1, .clocks = {sample(1980, 0), sample(1755, KVB_CLOCKS_SW_POWER_CAP), 1980}},
        {.c = &c3, .failed = 1, .error = "validation failed"}, /* not timed: no row */
    };
    res[0].clocks.end.power_w = -1; /* a reading NVML could not give */
    int flagged;
    char *s = summary(res, 3, NULL, &flagged);
    assert_int_equal(flagged, 1);
    assert_non_null(strstr(s, "Clocks per case (NVML, sampled just before and just after each case's timing loop: "
                              "start -> end; max SM clock 1980 MHz, power limit 700 W)"));
    assert_non_null(strstr(s, "| case | SM MHz | memory MHz | temperature C | power W | clock-event reasons | flag |"));
    char row[KVB_ID_MAX + 200];
    snprintf(row, sizeof row, "| `%s` | 1980 -> 1980 | 2619 -> 2619 | 40 -> 40 | 300 -> ? | GPU idle -> none |  |", c1.id);
    assert_non_null(strstr(s, row));
    snprintf(row, sizeof row,
             "| `%s` | 1980 -> 1755 | 2619 -> 2619 | 40 -> 40 | 300 -> 300 | none -> SW power cap | **CLOCKS**: SM clock "
             "fell from 1980 to 1755 MHz during the loop (-11.4%%); clocks limited at the end: SW power cap |",
             c2.id);
    assert_non_null(strstr(s, row));
    assert_null(strstr(s, c3.id));
    assert_non_null(strstr(s, "**1 case(s) timed under a falling or limited clock"));
    free(s);
    /* without NVML: one line, no table */
    s = summary(res, 3, "libnvidia-ml.so.1 not found (it comes with the NVIDIA driver)", &flagged);
    assert_int_equal(flagged, 0);
    assert_string_equal(s, "\nClocks per case: NVML not available (libnvidia-ml.so.1 not found (it comes with the NVIDIA "
                           "driver)).\n");
    free(s);
}

/* on this machine (no driver, or a driver without a device for this build): the probe says why, and
 * its samples are invalid rather than made up */
static void test_probe_without_device(void **state)
{
    (void)state;
    if (kvb_gpu_available()) skip(); /* a machine with a device: the lead's GPU round covers it */
    assert_int_equal(kvb_nvml_open(0), 0);
    assert_string_not_equal(kvb_nvml_unavailable_reason(), "");
    kvb_clock_sample s;
    kvb_nvml_sample(&s);
    assert_false(s.valid);
    assert_true(kvb_nvml_max_sm_mhz() <= 0);
    kvb_nvml_close();
}

/* the statistics of a timing loop's samples: the order they came in does not matter, an even count's
 * median is the mean of the middle two, and min is the fastest sample (what a ceiling reports) */
static void test_sample_stats(void **state)
{
    (void)state;
    const double odd[] = {3e-6, 1e-6, 5e-6, 2e-6, 4e-6};
    kvb_sample_stats st;
    kvb_stats(odd, 5, &st);
    assert_int_equal(st.n, 5);
    assert_true(st.min == 1e-6 && st.max == 5e-6 && st.median == 3e-6);
    assert_true(fabs(st.mean - 3e-6) < 1e-18);
    assert_true(fabs(st.stddev - sqrt(2.5) * 1e-6) < 1e-15); /* sample stddev: sum of squares 10e-12 over n - 1 */
    assert_true(fabs(st.noise - st.stddev / st.mean) < 1e-12);
    const double even[] = {8.0, 2.0, 6.0, 4.0};
    kvb_stats(even, 4, &st);
    assert_true(st.median == 5.0 && st.min == 2.0 && st.max == 8.0);
    const double one = 7.0;
    kvb_stats(&one, 1, &st);
    assert_true(st.median == 7.0 && st.min == 7.0 && st.stddev == 0 && st.noise == 0);
    kvb_stats(NULL, 0, &st); /* no samples: all zero, not a read past the end */
    assert_int_equal(st.n, 0);
    assert_true(st.median == 0 && st.min == 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reason_names),
        cmocka_unit_test(test_flag_rule),
        cmocka_unit_test(test_summary_section),
        cmocka_unit_test(test_probe_without_device),
        cmocka_unit_test(test_sample_stats),
    };
    return cmocka_run_group_tests_name("clocks", tests, NULL, NULL);
}
