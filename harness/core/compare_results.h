/* compare_results.h: `kvbench compare BASE.json NEW.json`, the regression gate over two files
 * written by `kvbench bench --json` (Google Benchmark JSON with the suite's counters).
 *
 * Per case id (the benchmark name without Google Benchmark's "/..." suffixes):
 *   MISSING   in BASE, not in NEW                                       fails the gate
 *   FAILED    NEW reports an error (setup, validation before or after timing)   fails the gate
 *   SLOWER    median up by more than the threshold, and significant     fails the gate
 *   FASTER    median down by more than the threshold, and significant
 *   noisy     a change beyond the threshold that the noise does not make significant
 *   same      within the threshold
 *   NEW       only in NEW; fixed: failed in BASE, runs in NEW
 * Significance: each file stores per case the median m, the relative standard deviation s of its
 * samples (noise_pct) and their number n. The standard error of a median of n samples is about
 * sqrt(pi/2) * s * m / sqrt(n) = 1.2533 s m / sqrt(n); a difference of medians is significant when it
 * exceeds 3 x sqrt(SE_base^2 + SE_new^2). Files are read with at least 3 samples per case (below);
 * kvb_compare_case itself, given fewer, reports a change beyond the threshold as "noisy".
 * Before the verdicts, a "note:" line for each way the two files' machines differ (the GPU, the timing
 * floor by more than 0.5 us, the host's CPUs): the verdicts stay as they are, but between machines
 * they measure the machines too.
 * Exit status: 0 the gate passes, 1 it fails, 2 a file is unusable or the command line is wrong.
 *
 * A file is unusable (refused whole, naming the file, the case and the field) when it cannot be read
 * (missing, a directory), is not strict JSON (json_read.h), is not written by kvbench bench, holds no
 * case, holds a case id twice, or a case that ran lacks a sound timing:
 *   median_us  a number in [KVB_COMPARE_MEDIAN_MIN_US, KVB_COMPARE_MEDIAN_MAX_US] (1 ns .. 11.6 days)
 *   samples    an integer in [3, 1e12]: fewer than 3 give no estimate of the noise, and a change the
 *              gate cannot test is refused rather than passed (bench a slow case long enough:
 *              --benchmark_min_time)
 *   noise_pct  a number in [0, 100 sqrt(samples)]: the relative standard deviation of n positive
 *              samples is at most sqrt(n)
 * A case that failed (error_occurred true) carries no timing.
 * Matching BASE and NEW by id sorts both: n log n in the number of cases.
 */
#ifndef KVB_COMPARE_RESULTS_H
#define KVB_COMPARE_RESULTS_H

#include <stddef.h>
#include <stdio.h>

typedef enum {
    KVB_V_SAME, KVB_V_NOISY, KVB_V_FASTER, KVB_V_SLOWER, KVB_V_MISSING, KVB_V_FAILED, KVB_V_NEW, KVB_V_FIXED
} kvb_gate_verdict;
#define KVB_VERDICT_NAMES {"same", "noisy", "FASTER", "SLOWER", "MISSING", "FAILED", "NEW", "fixed"}

typedef struct kvb_case_timing {
    int present, failed;
    double median_us, noise; /* noise: relative standard deviation of the samples (fraction) */
    double n;                /* samples */
} kvb_case_timing;

/* The case id in a bench file's benchmark name: the name up to Google Benchmark's suffixes
 * ("/manual_time", "/iterations:1/manual_time"); a case id holds no '/' (its values are numbers and
 * words). Its length in name. */
size_t kvb_bench_id_len(const char *name);

#define KVB_COMPARE_Z 3.0
#define KVB_COMPARE_SE_MEDIAN 1.2533 /* sqrt(pi/2): SE of a median over SE of a mean, normal samples */

#define KVB_COMPARE_MEDIAN_MIN_US 1e-3
#define KVB_COMPARE_MEDIAN_MAX_US 1e12
#define KVB_COMPARE_MIN_SAMPLES 3

/* One case: the verdict, and the relative change of medians and its z score (where both ran). */
kvb_gate_verdict kvb_compare_case(const kvb_case_timing *base, const kvb_case_timing *cur, double threshold,
                             double *change, double *z);
/* Whole files; threshold a fraction (0.05 = 5%); json_out NULL or a path for the verdicts; the
 * report goes to `report`. Returns the exit status above. */
int kvb_compare_files(const char *base, const char *cur, double threshold, const char *json_out, FILE *report);
/* the same; subset: NEW ran a chosen part of BASE (a filter), and BASE's cases absent from NEW are left
 * out (counted) instead of failing as MISSING */
int kvb_compare_files_subset(const char *base, const char *cur, double threshold, int subset, const char *json_out,
                             FILE *report);
int kvb_compare_main(int argc, char **argv); /* arguments after "compare" */

/* bench, interrupted: rewrite the Google Benchmark JSON at path without the benchmarks whose
 * error_message starts with `prefix` (the cases not run), so that it holds the cases that finished.
 * KVB_OK, or an error with kvb_last_error() set. */
int kvb_bench_json_drop_errors(const char *path, const char *prefix);
/* bench: rewrite the Google Benchmark JSON at path: without the benchmarks whose error_message starts
 * with drop_prefix (NULL: none dropped), and with each case's goal as goal_of(its case id, ctx) gives it:
 * "goal_text", the goal's words (the counters hold numbers only), and "goal_us" where no counter has it
 * (a goal against another impl, known once that impl ran): merge's summary shows both. KVB_OK, or an
 * error with kvb_last_error() set. */
typedef struct kvb_goal {
    const char *text; /* NULL: no goal */
    double us;        /* > 0: the goal's time */
} kvb_goal;
typedef kvb_goal (*kvb_goal_fn)(const char *id, void *ctx);
int kvb_bench_json_finish(const char *path, const char *drop_prefix, kvb_goal_fn goal_of, void *ctx);

#endif
