/* timing.h: how every time in kvbench is taken.
 *
 * One sample: enqueue the untimed preparation (restore in-place inputs, poison outputs), flush L2
 * (by reading a buffer twice its size, so it holds only clean lines),
 * wait for the device to go idle, then time the work with CUDA events. Device work is enqueued
 * behind a blocking kernel, so the events bracket only the device's execution, not the host's
 * launch latency (nvbench's method). Work whose cost is partly on the host (a CPU gather, one API
 * call per chunk) is timed on an idle stream without the blocking kernel, so its host time counts.
 */
#ifndef KVB_TIMING_H
#define KVB_TIMING_H

#include "harness/core/gpu.h"

typedef struct kvb_timed {
    void (*prepare)(void *ctx); /* untimed, enqueued on `stream` before each sample; may be NULL */
    void (*work)(void *ctx);    /* the timed work, enqueued on `stream` */
    void *ctx;
    cudaStream_t stream;
    int wall;                   /* 1: host time is part of the cost (no blocking kernel) */
} kvb_timed;

typedef struct kvb_sample_stats {
    int n;
    double median, min, max, mean, stddev; /* seconds */
    double noise;                          /* stddev / mean */
} kvb_sample_stats;

double kvb_time_once(const kvb_timed *t); /* seconds */
void kvb_time_samples(const kvb_timed *t, int n, double *samples);
void kvb_stats(const double *samples, int n, kvb_sample_stats *st);
double kvb_time_median(const kvb_timed *t, int n);
/* The fastest of n samples: for the ceilings, which bound what a case can reach, so that noise in the
 * ceiling's own run cannot put a case above it. */
double kvb_time_best(const kvb_timed *t, int n);

#endif
