/* test_shard.c: --shard K/N (shard.h). For several selections and every N in 1..8 the N shards cover
 * every selected case exactly once, keep the selection's order, come out the same every time, and are
 * balanced: the largest shard's estimated cost is at most the ideal share plus the largest group (the
 * cases of one shape, differing only in impl=, which share a shard).
 * Then the split's tie rules, the option's parsing, the estimate's shape, and --durations (an earlier
 * run's wall times as the costs). No device needed. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness/core/cli.h"
#include "harness/core/shard.h"
#include "tests/testlib.h"

/* the cases `line` (with " --shard K/N" appended when n > 0) selects, as its command selects them */
static void select_cases(const char *line, int k, int n, kvb_case_list *l)
{
    char full[1024];
    if (n) snprintf(full, sizeof full, "%s|--shard|%d/%d", line, k, n);
    else snprintf(full, sizeof full, "%s", line);
    kvb_options o;
    assert_int_equal(kvb_test_parse_line(&o, full), 0);
    o.cases_path = kvb_test_cases_dir();
    const int bench = !strncmp(line, "bench", 5), list = !strncmp(line, "list", 4);
    assert_int_equal(kvb_select_cases(&o, bench ? KVB_TIER_BENCH : list ? KVB_TIER_ALL : KVB_TIER_CHECK, l), 0);
}

/* the estimates of l's cases, as --shard balances them without --durations (at most 64 cases) */
static const double *costs(const kvb_case_list *l)
{
    static double c[64];
    assert_true(l->n <= 64);
    assert_int_equal(kvb_case_costs(l, 0, NULL, c), KVB_OK);
    return c;
}

/* two ids of one shape: equal up to their impl= key (the last) */
static int same_shape(const char *a, const char *b)
{
    const char *ia = strstr(a, " impl="), *ib = strstr(b, " impl=");
    const size_t la = ia ? (size_t)(ia - a) : strlen(a), lb = ib ? (size_t)(ib - b) : strlen(b);
    return la == lb && !strncmp(a, b, la);
}

static void test_shards_cover_each_case_once_in_order_balanced(void **state)
{
    (void)state;
    static const struct {
        const char *line;
        int timed;
    } sel[] = {
        {"check", 0},                                /* the check tier */
        {"bench", 1},                                /* the bench tier, split by the timed estimate */
        {"list|--tier|bench", 1},                    /* list of the bench tier: as bench splits it */
        {"check|--tier|smoke", 0},
        {"check|decode_attn|int2_decode_attn", 0},   /* kernel filters */
        {"list|impl=kernel|--tier|all", 0},          /* a substring over every tier */
        {"check|topk rows=3 n=100 k=7|gather_copy", 0}, /* a case line and a filter */
    };
    for (size_t s = 0; s < sizeof sel / sizeof *sel; s++) {
        kvb_case_list all;
        select_cases(sel[s].line, 0, 0, &all);
        assert_true(all.n > 0);
        double total = 0, largest = 0;
        for (int i = 0; i < all.n; i++) total += kvb_case_cost_estimate(&all.v[i], sel[s].timed);
        for (int i = 0; i < all.n; i++) { /* the largest group: the cases of one shape */
            double g = 0;
            for (int j = 0; j < all.n; j++)
                if (same_shape(all.v[i].id, all.v[j].id)) g += kvb_case_cost_estimate(&all.v[j], sel[s].timed);
            if (g > largest) largest = g;
        }
        int *seen = calloc((size_t)all.n, sizeof *seen), *shard_at = calloc((size_t)all.n, sizeof *shard_at);
        assert_non_null(seen);
        assert_non_null(shard_at);
        for (int n = 1; n <= 8; n++) {
            memset(seen, 0, sizeof *seen * (size_t)all.n);
            int covered = 0;
            double heaviest = 0;
            for (int k = 1; k <= n; k++) {
                kvb_case_list part, again = {0};
                select_cases(sel[s].line, k, n, &part);
                if (n == 5) { /* deterministic: the same split again */
                    select_cases(sel[s].line, k, n, &again);
                    assert_int_equal(part.n, again.n);
                }
                double cost = 0;
                int last = -1;
                for (int i = 0; i < part.n; i++) {
                    if (again.n) assert_string_equal(part.v[i].id, again.v[i].id);
                    const int at = kvb_cases_find(&all, part.v[i].id);
                    if (at < 0) fail_msg("%s: shard %d/%d has '%s', not selected", sel[s].line, k, n, part.v[i].id);
                    if (seen[at]++) fail_msg("%s: '%s' in two shards of %d", sel[s].line, part.v[i].id, n);
                    shard_at[at] = k;
                    if (at <= last) fail_msg("%s: shard %d/%d out of the selection's order", sel[s].line, k, n);
                    last = at;
                    cost += kvb_case_cost_estimate(&part.v[i], sel[s].timed);
                }
                covered += part.n;
                if (cost > heaviest) heaviest = cost;
                kvb_cases_free(&part);
                kvb_cases_free(&again);
            }
            assert_int_equal(covered, all.n);
            for (int i = 0; i < all.n; i++)
                for (int j = 0; j < i; j++)
                    if (same_shape(all.v[i].id, all.v[j].id) && shard_at[i] != shard_at[j])
                        fail_msg("%s: %d shards: '%s' and '%s' (one shape) in shards %d and %d", sel[s].line, n,
                                 all.v[j].id, all.v[i].id, shard_at[j], shard_at[i]);
            if (heaviest > total / n + largest + 1e-9 * total)
                fail_msg("%s: %d shards: the largest holds %.1f s, above the ideal %.1f s + the largest group %.1f s",
                         sel[s].line, n, heaviest, total / n, largest);
        }
        free(seen);
        free(shard_at);
        kvb_cases_free(&all);
    }
}

/* equal costs: the earlier case first, each to the lowest of the lightest shards (round robin here);
 * a heavier case first of all, and the next ones to the other shards until they catch up */
static void test_split_order_and_ties(void **state)
{
    (void)state;
    kvb_case_list l = {0};
    assert_int_equal(kvb_cases_parse_text(&l,
                                          "topk rows=1 n=1000 k=10 seed=1 tier=check\n"
                                          "topk rows=1 n=1000 k=10 seed=2 tier=check\n"
                                          "topk rows=1 n=1000 k=10 seed=3 tier=check\n"
                                          "topk rows=1 n=1000 k=10 seed=4 tier=check\n"
                                          "topk rows=1 n=1000 k=10 seed=5 tier=check\n"
                                          "topk rows=1 n=1000 k=10 seed=6 tier=check\n"
                                          "topk rows=4096 n=131072 k=4096 tier=check\n",
                                          "test"),
                     KVB_OK);
    const double small = kvb_case_cost_estimate(&l.v[0], 0), big = kvb_case_cost_estimate(&l.v[6], 0);
    assert_true(big > 3 * small);
    assert_true(kvb_case_cost_estimate(&l.v[0], 1) > small); /* timing costs more */
    int s[7];
    assert_int_equal(kvb_shard_assign(&l, 3, costs(&l), s), KVB_OK);
    /* the big case to shard 0, then the small ones to shards 1, 2, 1, 2, ... while shard 0 stays heavier */
    assert_int_equal(s[6], 0);
    const int want[6] = {1, 2, 1, 2, 1, 2};
    for (int i = 0; i < 6; i++) assert_int_equal(s[i], want[i]);
    /* without the big case: round robin in order */
    l.n = 6;
    assert_int_equal(kvb_shard_assign(&l, 4, costs(&l), s), KVB_OK);
    const int robin[6] = {0, 1, 2, 3, 0, 1};
    for (int i = 0; i < 6; i++) assert_int_equal(s[i], robin[i]);
    l.n = 7;
    /* keep: shard 1 of 3 is the big case alone; shard 2 holds seeds 1, 3, 5 in order */
    kvb_case_list copy = {0};
    for (int i = 0; i < l.n; i++) assert_int_equal(kvb_cases_add(&copy, &l.v[i]), KVB_OK);
    assert_int_equal(kvb_shard_keep(&copy, 2, 3, costs(&copy)), KVB_OK);
    assert_int_equal(copy.n, 3);
    assert_string_equal(copy.v[0].id, l.v[0].id);
    assert_string_equal(copy.v[2].id, l.v[4].id);
    assert_int_equal(kvb_cases_find(&copy, l.v[2].id), 1); /* the kept list is indexed */
    kvb_cases_free(&copy);
    /* more shards than cases: the rest are empty */
    l.n = 2;
    assert_int_equal(kvb_shard_assign(&l, 8, costs(&l), s), KVB_OK);
    assert_int_equal(s[0], 0);
    assert_int_equal(s[1], 1);
    l.n = 7;
    kvb_cases_free(&l);
}

static void test_shard_option(void **state)
{
    (void)state;
    int k, n;
    assert_int_equal(kvb_shard_parse("1/1", &k, &n), 0);
    assert_int_equal(kvb_shard_parse("64/64", &k, &n), 0);
    assert_int_equal(k, 64);
    assert_int_equal(kvb_shard_parse("3/8", &k, &n), 0);
    assert_int_equal(k * 10 + n, 38);
    static const char *const bad[] = {"0/2", "3/2", "1/65", "1/0", "/2", "1/", "1", "a/b", "1/2/3", "+1/2", "-1/2",
                                      "1 /2", "1/2 ", "01/2x", "99999999999/2", ""};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        if (kvb_shard_parse(bad[i], &k, &n) == 0) fail_msg("--shard '%s' accepted", bad[i]);
    kvb_options o;
    assert_int_equal(kvb_test_parse_line(&o, "check|--shard|2/5"), 0);
    assert_int_equal(o.shard_k, 2);
    assert_int_equal(o.shard_n, 5);
    assert_int_equal(kvb_test_parse_line(&o, "check|--shard|6/5"), 2);
    assert_int_equal(kvb_test_parse_line(&o, "check|--shard"), 2);       /* no value */
    assert_int_equal(kvb_test_parse_line(&o, "profile|--shard|1/2"), 2); /* list, check and bench only */
    assert_int_equal(kvb_test_parse_line(&o, "bench|--timing-lock|/tmp/x.lock"), 0);
    assert_int_equal(kvb_test_parse_line(&o, "check|--timing-lock|/tmp/x.lock"), 2); /* bench only */
    assert_string_equal(kvb_shard_name(3, 12), "3/12");
}

/* a result file with wall times per case: a bench file (benchmarks[]: name with Google Benchmark's
 * suffix, wall_<phase>_s) or a check file (cases[]: id, wall_s {phase: s}); case i of l gets
 * seconds(i), a negative value leaves it out */
static void write_durations(const char *path, const kvb_case_list *l, int bench, double (*seconds)(int))
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fprintf(f, bench ? "{\"context\": {}, \"benchmarks\": [" : "{\"context\": {}, \"cases\": [");
    int first = 1;
    for (int i = 0; i < l->n; i++) {
        const double s = seconds(i);
        if (s < 0) continue;
        if (bench)
            fprintf(f, "%s{\"name\": \"%s/iterations:1/manual_time\", \"wall_inputs_s\": %.17g, \"wall_timing_s\": %.17g, "
                       "\"median_us\": 3}", first ? "" : ",", l->v[i].id, s / 4, 3 * s / 4);
        else
            fprintf(f, "%s{\"id\": \"%s\", \"status\": \"PASS\", \"wall_s\": {\"inputs\": %.17g, \"reference\": %.17g}}",
                    first ? "" : ",", l->v[i].id, s / 2, s / 2);
        first = 0;
    }
    fprintf(f, "]}\n");
    fclose(f);
}

static double seconds_of(int i) { return 1 + (i * 7919 % 13); }                 /* every case */
static double every_other(int i) { return i % 2 ? -1 : 10 + i; }                 /* the even cases only */
static double none_of_them(int i) { (void)i; return -1; }

/* --durations FILE: the measured wall times are the costs; a case the file lacks costs its estimate
 * scaled by the file's measured / estimated; the shards cover every case once and balance the
 * measured costs; a file that is not a result file, or holds none of the cases, is refused */
static void test_durations(void **state)
{
    (void)state;
    char path[] = "/tmp/kvb_test_durations_XXXXXX";
    const int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    for (int bench = 0; bench < 2; bench++) {
        kvb_case_list all;
        select_cases(bench ? "bench" : "check|--tier|smoke", 0, 0, &all);
        assert_true(all.n > 8);
        double *est = calloc((size_t)all.n, sizeof *est), *cost = calloc((size_t)all.n, sizeof *cost);
        assert_non_null(est);
        assert_non_null(cost);
        assert_int_equal(kvb_case_costs(&all, bench, NULL, est), KVB_OK);
        write_durations(path, &all, bench, seconds_of);
        assert_int_equal(kvb_case_costs(&all, bench, path, cost), KVB_OK);
        for (int i = 0; i < all.n; i++) assert_true(fabs(cost[i] - seconds_of(i)) < 1e-9 * seconds_of(i));
        write_durations(path, &all, bench, every_other);
        assert_int_equal(kvb_case_costs(&all, bench, path, cost), KVB_OK);
        double measured = 0, estimated = 0;
        for (int i = 0; i < all.n; i += 2) measured += every_other(i), estimated += est[i];
        for (int i = 0; i < all.n; i++) {
            const double want = i % 2 ? est[i] * measured / estimated : every_other(i);
            if (fabs(cost[i] - want) > 1e-9 * want) fail_msg("case %d: cost %g, want %g", i, cost[i], want);
        }
        /* the shards of the selection under this file: each case once, the largest within the ideal share
         * plus the largest group of the measured costs */
        write_durations(path, &all, bench, seconds_of);
        char line[512];
        double heaviest = 0, total = 0;
        for (int i = 0; i < all.n; i++) total += seconds_of(i);
        int covered = 0;
        for (int k = 1; k <= 3; k++) {
            kvb_case_list part;
            snprintf(line, sizeof line, "%s|--durations|%s", bench ? "bench" : "check|--tier|smoke", path);
            select_cases(line, k, 3, &part);
            double sum = 0;
            for (int i = 0; i < part.n; i++) sum += seconds_of(kvb_cases_find(&all, part.v[i].id));
            if (sum > heaviest) heaviest = sum;
            covered += part.n;
            kvb_cases_free(&part);
        }
        assert_int_equal(covered, all.n);
        double largest = 0;
        for (int i = 0; i < all.n; i++) {
            double g = 0;
            for (int j = 0; j < all.n; j++)
                if (same_shape(all.v[i].id, all.v[j].id)) g += seconds_of(j);
            if (g > largest) largest = g;
        }
        if (heaviest > total / 3 + largest + 1e-9 * total)
            fail_msg("durations: the largest shard holds %.1f s, above %.1f + %.1f", heaviest, total / 3, largest);
        /* refused: none of the cases, not a result file, not JSON, no file */
        write_durations(path, &all, bench, none_of_them);
        assert_int_equal(kvb_case_costs(&all, bench, path, cost), KVB_EINVAL);
        assert_non_null(strstr(kvb_last_error(), "holds none of the"));
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fputs("{\"context\": {}}", f);
        fclose(f);
        assert_int_equal(kvb_case_costs(&all, bench, path, cost), KVB_EINVAL);
        f = fopen(path, "w");
        assert_non_null(f);
        fputs("[1, 2", f);
        fclose(f);
        assert_int_not_equal(kvb_case_costs(&all, bench, path, cost), KVB_OK);
        assert_int_not_equal(kvb_case_costs(&all, bench, "/nonexistent/durations.json", cost), KVB_OK);
        free(est);
        free(cost);
        kvb_cases_free(&all);
    }
    /* the option: check, bench, list with --shard or --costs; list alone and other commands refused; its
     * value may not be empty */
    kvb_options o;
    assert_int_equal(kvb_test_parse_line(&o, "bench|--shard|1/2|--durations|/tmp/d.json"), 0);
    assert_string_equal(o.durations, "/tmp/d.json");
    assert_int_equal(kvb_test_parse_line(&o, "list|--costs|--durations|/tmp/d.json"), 0);
    assert_int_equal(kvb_test_parse_line(&o, "list|--shard|1/3|--durations|/tmp/d.json"), 0);
    assert_int_equal(kvb_test_parse_line(&o, "bench|--durations|/tmp/d.json"), 0); /* the progress estimate */
    assert_int_equal(kvb_test_parse_line(&o, "check|--durations|/tmp/d.json"), 0);
    assert_int_equal(kvb_test_parse_line(&o, "list|--durations|/tmp/d.json"), 2);
    assert_int_equal(kvb_test_parse_line(&o, "ceilings|--durations|/tmp/d.json"), 2);
    assert_int_equal(kvb_test_parse_line(&o, "check|--shard|1/2|--durations|"), 2);
    assert_int_equal(kvb_test_parse_line(&o, "check|--costs"), 2); /* list only */
    unlink(path);
}

/* an empty shard is no error: selected, nothing in it */
static void test_empty_shard(void **state)
{
    (void)state;
    kvb_case_list l;
    select_cases("check|topk rows=3 n=100 k=7", 2, 2, &l);
    assert_int_equal(l.n, 0);
    kvb_cases_free(&l);
    select_cases("check|topk rows=3 n=100 k=7", 1, 2, &l);
    assert_int_equal(l.n, 1);
    kvb_cases_free(&l);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shards_cover_each_case_once_in_order_balanced),
        cmocka_unit_test(test_split_order_and_ties),
        cmocka_unit_test(test_shard_option),
        cmocka_unit_test(test_empty_shard),
        cmocka_unit_test(test_durations),
    };
    return cmocka_run_group_tests_name("shards", tests, NULL, NULL);
}
