/* gbench_shim.h: C interface to Google Benchmark (the shim is the project's only C++).
 *
 * One benchmark per case, manual time (each sample is a CUDA-event time from timing.h), its samples
 * taken by the shim for a wall-time budget and reported as one iteration of their median. The C side
 * prepares a case once (setup, validation, warm-up) before its first timed loop, validates again
 * and computes counters after each timed loop, and releases it after its last. Counters include
 * median, min, max and noise of the samples of the reported loop; rates are computed from the
 * median, not from Google Benchmark's mean.
 */
#ifndef KVB_GBENCH_SHIM_H
#define KVB_GBENCH_SHIM_H

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvb_counter {
    char name[40];
    double value;
} kvb_counter;

#define KVB_MAX_COUNTERS 128 /* ~40 a case, one a stage (KVB_RUN_MAX_STAGES) and one a peer */

typedef struct kvb_bench {
    const char *name; /* the case id */
    void *ctx;
    int (*prepare)(void *ctx);   /* 0, or non-zero with kvb_last_error() set */
    void (*loop_begin)(void *ctx); /* just before each timed loop, outside it (or NULL) */
    double (*iterate)(void *ctx); /* one timed sample, seconds; negative: failed (kvb_last_error()) */
    int (*finish)(void *ctx, const double *samples, int n, kvb_counter *out, int *n_out);
    void (*release)(void *ctx);
    const char *(*label)(void *ctx); /* shown with the result ("reference on 4 of 64 slices"), or NULL */
} kvb_bench;

void kvb_gbench_context(const char *key, const char *value);
void kvb_gbench_add(const kvb_bench *b);
/* The wall-time budget of each case's samples (default 0.25 s; at least 10 samples, at most 100000). */
void kvb_gbench_set_sample_time(double seconds);
/* argv holds only --benchmark_* flags (and argv[0]); returns the number of benchmarks that
 * reported an error. */
int kvb_gbench_run(int argc, char **argv);

#ifdef __cplusplus
}
#endif
#endif
