/* compare.h: the comparison rules (README.md, Method; each family's tolerances in kernels/<family>/NOTES.md).
 *
 * Every comparison reports: max abs error, the largest fraction of the tolerance used at one
 * element ("% of tolerance used"), relative L2 error, the count of non-finite outputs, and the
 * first mismatches with their indices.
 *   exact    data movement: bit-exact; % of tolerance is 0 or 100
 *   float    |out - ref| <= atol + rtol*|ref| per element, and rel L2 <= l2; NaN/Inf where the
 *            reference is finite fails. Where a family states the bound relative to another
 *            magnitude (kernels/int2/NOTES.md: 1e-3 * sum |a_k| (|c_k s_k| + |z_k|) + 1e-5, a dot product with dequantized w_k = c_k s_k + z_k),
 *            the tensor carries that magnitude per element and rtol multiplies it instead of |ref|
 *   indexset top-k selections, tie-tolerant: per row the sets are equal, or every selected index
 *            scores >= (k-th reference score - tol) and the selected scores sum to within tol of
 *            the reference top-k sum; the list must be strictly ascending (rows a sampled
 *            reference skipped: strictly ascending and in range)
 *   gather   rows picked by indices the run itself produced (an index set that may differ from the
 *            reference's tie-tolerantly): bit-exact against the source rows at those indices
 * An optional slice mask restricts the comparison to the slices where the reference was computed
 * (sampled references of large cases).
 */
#ifndef KVB_COMPARE_H
#define KVB_COMPARE_H

#include <stdint.h>

#include "harness/core/tensor.h"

typedef enum { KVB_CMP_NONE, KVB_CMP_EXACT, KVB_CMP_FLOAT, KVB_CMP_INDEXSET, KVB_CMP_GATHER } kvb_cmp_kind;
#define KVB_CMP_KIND_NAMES {"none", "exact", "float", "indexset", "gather"}

typedef struct kvb_tol {
    double atol, rtol, l2;
} kvb_tol;

#define KVB_MAX_MISMATCHES 8

typedef struct kvb_mismatch {
    int64_t index; /* flat element index (indexset: row) */
    double out, ref;
} kvb_mismatch;

typedef struct kvb_cmp_result {
    kvb_cmp_kind kind;
    int64_t n_checked, n_bad, n_nonfinite;
    int64_t n_ref_nonfinite; /* inf or NaN in the reference (NaN inputs, or masked scores): matched
                              * exactly, and reported, so that they never pass unseen */
    int64_t n_screened; /* elements of slices a sampled reference skipped: checked finite and not poison */
    int64_t n_unscreened; /* such elements of a tensor whose every bit pattern is a value: not judged at all */
    double max_abs, tol_used, rel_l2; /* tol_used: max over elements of |err| / (atol + rtol|ref|) */
    int n_first;
    kvb_mismatch first[KVB_MAX_MISMATCHES];
    int pass;
} kvb_cmp_result;

/* mask: NULL, or one byte per slice of slice_len elements (1 = compare this slice with the reference;
 * 0 = screen it: every element must be finite and not the poison pattern). */
/* With on = 1, the exact and float comparisons stop at the first element that fails: the result says
 * only that the tensor fails (its counts cover the part compared). For the zeros check, which asks only
 * whether outputs of zeros are caught, not where: a cache of gigabytes otherwise takes seconds to walk. */
void kvb_compare_verdict_only(int on);
void kvb_compare_exact(const void *out, const void *ref, kvb_dtype t, int64_t n, int64_t slice_len,
                       const uint8_t *mask, kvb_cmp_result *r);
/* The same for an integer tensor whose every bit pattern is a value (KVB_T_ANY_BITS): the skipped
 * slices' elements are counted in n_unscreened, since the poison pattern there may be a true result. */
void kvb_compare_exact_any_bits(const void *out, const void *ref, kvb_dtype t, int64_t n, int64_t slice_len,
                                const uint8_t *mask, kvb_cmp_result *r);
void kvb_compare_float(const void *out, const void *ref, kvb_dtype t, int64_t n, kvb_tol tol,
                       int64_t slice_len, const uint8_t *mask, kvb_cmp_result *r);
/* The same with the element bound atol + rtol * mag[i] (mag: n non-negative magnitudes). */
void kvb_compare_float_mag(const void *out, const void *ref, kvb_dtype t, int64_t n, kvb_tol tol, const double *mag,
                           int64_t slice_len, const uint8_t *mask, kvb_cmp_result *r);

/* out_idx, ref_idx: [rows, k] int32; scores: [rows, n] reference scores (fp32 or fp64). */
void kvb_compare_indexset(const int32_t *out_idx, const int32_t *ref_idx, const void *scores,
                          kvb_dtype score_type, int64_t rows, int64_t n, int64_t k, double tol,
                          kvb_cmp_result *r);
/* The same against a sampled reference: rows come in slices of slice_rows rows, mask (one byte per
 * slice; NULL: every slice) marks those whose reference indices and scores exist. A row of the other
 * slices is screened: strictly ascending and within [0, n) (so the integer poison fails). */
void kvb_compare_indexset_sampled(const int32_t *out_idx, const int32_t *ref_idx, const void *scores,
                                  kvb_dtype score_type, int64_t rows, int64_t n, int64_t k, double tol,
                                  int64_t slice_rows, const uint8_t *mask, kvb_cmp_result *r);

/* out [rows, k, width] against src [rows / group, n_src, width] at idx [rows, k] (int32, produced by
 * the run): row (r, i) must equal src row (r / group, idx[r, i]) bit for bit; an index outside
 * [0, n_src) fails. The mismatch index is the flat element index of out. */
void kvb_compare_gather(const void *out, const void *src, const int32_t *idx, kvb_dtype t, int64_t rows, int64_t k,
                        int64_t width, int64_t n_src, int64_t group, kvb_cmp_result *r);

#endif
