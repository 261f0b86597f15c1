/* ceilings.h: this device's copy and read bandwidths and matrix rate, measured in the same run as the cases
 * so that every result can be stated as a fraction of a ceiling (README.md, Method, "Ceilings"). Each is the
 * fastest of its repeats (a bound: the case's median is held against the best the ceiling's own kernel did).
 * Bandwidths count bytes read plus bytes written for device copies, and bytes moved for
 * host-device copies.
 */
#ifndef KVB_CEILINGS_H
#define KVB_CEILINGS_H

#include <stddef.h>

#include "harness/core/json.h"
#include "harness/core/op.h"

struct kvb_ceilings {
    int measured;
    double d2d_memcpy_GBps;    /* cudaMemcpyAsync device to device, read + write */
    double d2d_kernel_GBps;    /* a plain 16-byte copy kernel, read + write */
    double read_GBps;          /* a kernel streaming the bytes and reducing them: reads only */
    double h2d_memcpy_GBps;    /* cudaMemcpyAsync from pinned host memory */
    double h2d_zero_copy_GBps; /* a kernel reading pinned host memory in place */
    double d2h_memcpy_GBps;    /* cudaMemcpyAsync to pinned host memory */
    double bf16_mma_TFLOPs;    /* cuBLAS bf16 GEMM, fp32 accumulate, n x n x n */
    double launch_floor_us;    /* an empty kernel timed like the cases: the smallest time a case can show */
    size_t d2d_bytes, h2d_bytes;
    int gemm_n;
};

int kvb_ceilings_measure(kvb_ceilings *c);
void kvb_ceilings_print(const kvb_ceilings *c);
void kvb_ceilings_json(const kvb_ceilings *c, kvb_json *j);

/* Fastest time of one contiguous copy of `bytes` (pinned host to device, or device to device),
 * timed like the cases. Cached by size. */
double kvb_h2d_contiguous_seconds(size_t bytes);
double kvb_d2d_contiguous_seconds(size_t bytes);
/* Fastest time of the read-only kernel streaming `bytes` of device memory (the read ceiling). */
double kvb_read_contiguous_seconds(size_t bytes);

/* The time the ceiling a cost is stated against needs for that cost's work (0 when none applies):
 * H2D: one contiguous pinned copy of bytes_h2d; D2D: one device copy moving bytes_dev (half read,
 * half written); READ: the read kernel streaming bytes_dev; MMA: flops at the measured matrix rate. */
double kvb_ceiling_seconds(const kvb_cost *cost, const kvb_ceilings *c);
const char *kvb_ceiling_name(kvb_ceiling_kind k);

#endif
