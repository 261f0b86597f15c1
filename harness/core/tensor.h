/* tensor.h: dtypes, seeded input distributions, and .npy output.
 *
 * Random inputs are counter-based: element i of a tensor is a pure function of (seed, stream, i),
 * where stream is a hash of the tensor's name. A tensor's contents therefore do not depend on the
 * order in which tensors are filled, on threading, or on the size of the run (a larger batch holds
 * the smaller one as a prefix), and every value can be recomputed from its index.
 *
 * Distributions (all seeded; none is all zeros):
 *   normal   N(mean, std^2) by Box-Muller in single precision: one hash gives two uniforms, the pair
 *            two normals (elements 2j and 2j + 1)
 *   uniform  U[lo, hi)
 * Kernel families build their peaked / sink / outlier inputs on top of these (see their ops file).
 */
#ifndef KVB_TENSOR_H
#define KVB_TENSOR_H

#include <stddef.h>
#include <stdint.h>

#include "reference/kvb.h"

typedef enum { KVB_BF16, KVB_FP16, KVB_FP32, KVB_FP64, KVB_I32, KVB_U32, KVB_U8 } kvb_dtype;

size_t kvb_dtype_size(kvb_dtype t);
const char *kvb_dtype_name(kvb_dtype t);
int kvb_dtype_is_float(kvb_dtype t);
double kvb_load_as_double(const void *p, kvb_dtype t, int64_t i); /* element i as a double */
/* memcpy by the OpenMP threads, a MiB a piece: the host's buffers of gigabytes (caches, their references) */
void kvb_copy_parallel(void *dst, const void *src, size_t bytes);

/* ---- deterministic random numbers ---- */
uint64_t kvb_hash64(uint64_t x);                       /* splitmix64 finalizer */
uint64_t kvb_stream_of(const char *name);              /* FNV-1a of a tensor name */
double kvb_uniform01(uint64_t seed, uint64_t stream, uint64_t i); /* in (0, 1) */
double kvb_normal01(uint64_t seed, uint64_t stream, uint64_t i);  /* N(0, 1) */
/* The same normals a pair at a time, for fills with their own per-element rules: kvb_normal01(seed, stream,
 * 2j) and (.., 2j + 1) are *z0 and *z1 of kvb_normal_pair(kvb_sequence_key(seed, stream), j, ..). */
uint64_t kvb_sequence_key(uint64_t seed, uint64_t stream);
void kvb_normal_pair(uint64_t key, uint64_t j, float *z0, float *z1);
/* kvb_uniform01(seed, stream, i) from the sequence's key (one hash where kvb_uniform01 takes three) */
double kvb_sequence_uniform01(uint64_t key, uint64_t i);

/* Sequential generator for shuffles and choices. */
typedef struct kvb_rng { uint64_t state; } kvb_rng;
kvb_rng kvb_rng_make(uint64_t seed, uint64_t stream);
uint64_t kvb_rng_next(kvb_rng *r);
uint64_t kvb_rng_below(kvb_rng *r, uint64_t n); /* uniform in [0, n), n > 0, unbiased */
void kvb_shuffle_i32(kvb_rng *r, int32_t *v, int64_t n);

/* Fill x[0:n] with element i taken from index first + i of the (seed, stream) sequence. */
void kvb_fill_bf16_normal(kvb_bf16 *x, int64_t n, uint64_t seed, uint64_t stream, int64_t first,
                          double mean, double std);
void kvb_fill_bf16_uniform(kvb_bf16 *x, int64_t n, uint64_t seed, uint64_t stream, int64_t first,
                           double lo, double hi);
void kvb_fill_f32_normal(float *x, int64_t n, uint64_t seed, uint64_t stream, int64_t first,
                         double mean, double std);
/* The fills above keep their large results (32 MiB and up) in a memo, the least recently used dropped first:
 * a fill with the same arguments later is a copy, the same bits. kvb_fill_memo_limit caps the bytes it holds
 * (KVB_FILL_MEMO_MAX unless set; dropping what is over at once; kvb_host_mem_check sets it before each case
 * to what the case leaves free), kvb_fill_memo_held says how many it holds, and kvb_fill_memo_release frees
 * them all. */
#define KVB_FILL_MEMO_MAX ((size_t)8 << 30) /* K and V of the INT2 bench cache at B=8, 128K tokens: 2.1 GB each */
void kvb_fill_memo_limit(size_t bytes);
/* An op's own fill (per-element rules of its own) through the same memo: `kind` names the fill and its rules
 * (a string literal), args[0 .. n_args - 1] (n_args <= 8) are every number its values depend on.
 * kvb_fill_memo_fetch is 1 when x now holds a kept fill of these arguments; else the op draws x, then hands
 * it to kvb_fill_memo_keep. Fills under 32 MiB are neither kept nor looked up. */
int kvb_fill_memo_fetch(const char *kind, const uint64_t *args, int n_args, void *x, size_t bytes);
void kvb_fill_memo_keep(const char *kind, const uint64_t *args, int n_args, const void *x, size_t bytes);
size_t kvb_fill_memo_held(void);
void kvb_fill_memo_release(void);
/* Wall seconds spent in the fills above since the process started (a case's "inputs" phase). */
double kvb_fill_seconds(void);
/* A fill of its own (an op's input with per-element rules) adds its wall time here, outside any parallel region. */
void kvb_fill_seconds_add(double s);

/* The element written where a sampled reference was not computed: NaN for the floating dtypes, every
 * bit set for the integers (-1 as int32). */
void kvb_dtype_uncomputed(kvb_dtype t, void *elem);

/* Write a numpy .npy file (format 1.0). bf16 has no numpy dtype: it is written as '<u2' bit
 * patterns (view with ml_dtypes.bfloat16 or shift into float32). Every write is checked: KVB_OK, or
 * KVB_EIO with kvb_last_error() naming the path and the system's reason (what was written of a
 * regular file is removed). */
int kvb_npy_write(const char *path, kvb_dtype t, int ndim, const int64_t *shape, const void *data);
/* The same for data computed only on the slices of slice_len elements that mask marks (one byte a
 * slice; NULL: every slice): the other slices are written as kvb_dtype_uncomputed(). */
int kvb_npy_write_sampled(const char *path, kvb_dtype t, int ndim, const int64_t *shape, const void *data,
                          int64_t slice_len, const uint8_t *mask);
/* Which elements such data holds: uint8 of the same shape, 1 where computed (mask[i / slice_len]). */
int kvb_npy_write_mask(const char *path, int ndim, const int64_t *shape, int64_t slice_len, const uint8_t *mask);

#endif
