/* compare_results.h: `kvbench compare BASE.json NEW.json`, the regression gate over two files
 * written by `kvbench bench --json` (Google Benchmark JSON with the suite's counters).
 *
 * Per case id (the benchmark name without "/manual_time"):
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
 * exceeds 3 x sqrt(SE_base^2 + SE_new^2). With fewer than 3 samples on either side (slow baselines
 * take 1 or 2) there is no estimate of the noise and a change beyond the threshold is only "noisy".
 * Exit status: 0 the gate passes, 1 it fails, 2 a file is unusable (unreadable, empty, not JSON, not
 * a kvbench bench file, no cases) or the command line is wrong.
 */
#ifndef KVB_COMPARE_RESULTS_H
#define KVB_COMPARE_RESULTS_H

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

#define KVB_COMPARE_Z 3.0
#define KVB_COMPARE_SE_MEDIAN 1.2533 /* sqrt(pi/2): SE of a median over SE of a mean, normal samples */

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

#endif
