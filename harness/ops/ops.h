/* ops.h: helpers shared by the ops files and the tests (harness/ops/inputs.c): no ops file exports to
 * another. */
#ifndef KVB_OPS_H
#define KVB_OPS_H

#include <stdint.h>

#include "harness/core/compare.h"
#include "harness/core/tensor.h"

/* Seeded chunk ids of one ShadowKV step for `rows` (b, h) rows: old tags (n_old valid ids, the
 * rest -1, shuffled) and new ids (n_hit of the valid old ids plus M - n_hit ids not in old,
 * shuffled), all drawn from [0, n_ids). KVB_OK, or KVB_ENOMEM (its scratch). */
int kvb_make_step_ids(uint64_t seed, int rows, int M, int64_t n_ids, int n_old, int n_hit, int32_t *old_ids,
                      int32_t *new_ids);

/* n distinct values drawn from [0, range) into out (perm: scratch of `range` int32). */
void kvb_draw_distinct(kvb_rng *rng, int32_t *perm, int64_t range, int n, int32_t *out);

/* Check what index_scan promises (kernels/gather_copy/NOTES.md), independently of how it is
 * computed: hits are exactly the old ids found in new, listed by strictly ascending old slot with
 * offsets[i] >= i; misses are exactly the new ids not in old, strictly ascending; cached_after[i] is
 * the id held by slot i. Returns KVB_OK or KVB_EINVAL naming the first violation. */
int kvb_index_scan_properties(const int32_t *old_ids, const int32_t *new_ids, const int32_t *cached_after,
                              const int32_t *offsets, const int32_t *cnts, int rows, int M);

/* A deterministic sample of n slices for a reference too large to compute whole (about 2 s at
 * most): NULL (every slice) when n * work_per_slice <= budget, otherwise a mask of n bytes
 * holding the first and the last slice and evenly spaced ones between them, as many as the budget
 * allows (at least 2). *chosen receives the count. The caller frees the mask (kvb_xfree). Its allocation
 * failing fails the case through the case guard (gpu.h). */
uint8_t *kvb_sample_slices(int64_t n, double work_per_slice, double budget, int64_t *chosen);

/* The tie tolerance of a selection of k of n scores per row (idx [rows, k], scores [rows, n]): the
 * scores' own tolerance at the largest k-th reference score of any row (an entry within that of the
 * k-th may take its place). */
double kvb_selection_tol(const kvb_tol *tol, const float *scores, int64_t rows, int n, const int32_t *idx, int k);

/* The threads a reference runs on (OpenMP's maximum; 1 without OpenMP): host_bytes counts their scratch. */
int kvb_ref_threads(void);

/* Reference budget in multiply-adds per case (a couple of seconds with OpenMP). */
#define KVB_REF_BUDGET 6e8

#endif
