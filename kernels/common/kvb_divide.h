/* kvb_divide.h: division by a divisor fixed for a launch, in C for the host (and its tests) and CUDA for
 * the kernels: one multiply-high, an add and a shift instead of the ~20 instructions of a division by a
 * runtime value (sparse_attn_pages' page of a position, kernels/decode/NOTES.md).
 *
 * Granlund and Montgomery's round-up method: with l = ceil(log2 d) and m = floor(2^32 (2^l - d) / d) + 1,
 * n / d = (mulhi(n, m) + n) >> l for every 32-bit n, the add taken in 64 bits. d = 1 gives m = 1, l = 0.
 * tests/test_divide.c checks it against the division for every d up to 4096 and at the edges of the
 * 32-bit range. */
#ifndef KVB_KERNELS_DIVIDE_H
#define KVB_KERNELS_DIVIDE_H

#include <stdint.h>

#ifdef __CUDACC__
#define KVB_DIVIDE_FN static __host__ __device__ __forceinline__
#else
#define KVB_DIVIDE_FN static inline
#endif

typedef struct {
    uint32_t mul, shift;
} kvb_divisor;

/* The divisor d (d >= 1; the caller checks its range) made once, on the host. */
KVB_DIVIDE_FN kvb_divisor kvb_divisor_of(uint32_t d)
{
    uint32_t l = 0;
    while (l < 32 && ((uint64_t)1 << l) < d) l++;
    kvb_divisor f;
    f.mul = (uint32_t)(((((uint64_t)1 << l) - d) << 32) / d + 1);
    f.shift = l;
    return f;
}

/* n / the divisor of f */
KVB_DIVIDE_FN uint32_t kvb_divide(const kvb_divisor *f, uint32_t n)
{
#ifdef __CUDA_ARCH__
    const uint32_t hi = __umulhi(n, f->mul);
#else
    const uint32_t hi = (uint32_t)(((uint64_t)n * f->mul) >> 32);
#endif
    return (uint32_t)(((uint64_t)hi + n) >> f->shift);
}

#endif
