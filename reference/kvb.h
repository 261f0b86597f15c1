/* kvb.h: the base layer every part of kvbench includes (kernels, references, harness, tests).
 *
 * - status codes and one thread-local error message, so that a rejected parameter says which
 *   parameter, its value and the allowed range, wherever it was caught;
 * - storage-dtype conversions: bf16 and fp16 are stored as uint16_t bit patterns and converted
 *   with round-to-nearest-even. Conversions from double round once, directly to the target
 *   format (no double -> float -> bf16 double rounding).
 *
 * Plain C11; also compiles as C++ (nvcc) so kernels/ can share the declarations.
 */
#ifndef KVB_H
#define KVB_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status ------------------------------------------------------------------------------- */

enum {
    KVB_OK = 0,
    KVB_EINVAL = 1,   /* a parameter or input outside the supported range */
    KVB_ENOMEM = 2,   /* an allocation failed */
    KVB_EDEVICE = 3,  /* no CUDA device, or a CUDA call failed */
    KVB_EIO = 4,      /* a file could not be read or written */
};

/* Record a message (printf-style) for the calling thread and return `code`. Typical use:
 *   if (M < 1 || M > 4096) return kvb_fail(KVB_EINVAL, "gather_copy: M=%d out of range [1, 4096]", M);
 */
int kvb_fail(int code, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;
const char *kvb_last_error(void); /* "" when nothing failed since kvb_clear_error() */

/* Return KVB_EINVAL from the calling function, with "who: name=v out of range [lo, hi]", unless
 * lo <= v <= hi (integers). */
#define KVB_CHECK_RANGE(who, name, v, lo, hi)                                                        \
    do {                                                                                             \
        if ((int64_t)(v) < (int64_t)(lo) || (int64_t)(v) > (int64_t)(hi))                           \
            return kvb_fail(KVB_EINVAL, "%s: %s=%lld out of range [%lld, %lld]", who, name,          \
                            (long long)(v), (long long)(lo), (long long)(hi));                       \
    } while (0)
void kvb_clear_error(void);

/* ---- host memory ---------------------------------------------------------------------------- */

/* The suite's one checked host allocation: n x size bytes, zeroed; NULL after
 * kvb_fail(KVB_ENOMEM, "out of host memory: N bytes (G GiB) for <what>") when the memory cannot be
 * had (n x size overflowing included). Release with kvb_xfree (free() releases it too, but the
 * counts below then keep it). Every block is counted: kvb_host_bytes_live/peak. */
void *kvb_xalloc(size_t n, size_t size, const char *what);
void kvb_xfree(void *p);
size_t kvb_host_bytes_live(void); /* bytes held through kvb_xalloc now */
size_t kvb_host_bytes_peak(void); /* the most held at once since kvb_host_bytes_peak_reset() */
void kvb_host_bytes_peak_reset(void);
/* Fault injection (tests/alloc_fault.sh): the n-th kvb_xalloc from this call on fails as if the memory
 * were not there, once (n <= 0: none). kvb_xalloc_count(): calls since the last kvb_xalloc_fail_at. */
void kvb_xalloc_fail_at(long n);
long kvb_xalloc_count(void);
int kvb_xalloc_fault_fired(void); /* the injected failure happened */
/* Called with every kvb_xalloc (its number since kvb_xalloc_fail_at, size and what; from any thread), or
 * NULL: the allocation sites a fault-injection run goes through. */
void kvb_xalloc_trace(void (*fn)(void *ctx, long n, size_t bytes, const char *what), void *ctx);

/* An error inside an OpenMP parallel region: kvb_fail's message belongs to the failing thread, so
 * the region keeps the first one (kvb_par_keep, from the failing thread, after its kvb_fail) and the
 * thread that returns raises it again (kvb_par_return: KVB_OK when nothing failed). */
typedef struct kvb_par_error {
    int code;
    char msg[512];
} kvb_par_error;
void kvb_par_keep(kvb_par_error *e, int code);
int kvb_par_return(const kvb_par_error *e);

/* ---- bf16 / fp16 ---------------------------------------------------------------------------- */

typedef uint16_t kvb_bf16; /* bfloat16 bit pattern: 1 sign, 8 exponent, 7 mantissa bits */
typedef uint16_t kvb_fp16; /* IEEE binary16 bit pattern: 1 sign, 5 exponent, 10 mantissa bits */

#define KVB_BF16_NAN ((kvb_bf16)0x7FC0)

static inline float kvb_bits_to_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t kvb_float_to_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static inline float kvb_bf16_to_float(kvb_bf16 h) { return kvb_bits_to_float((uint32_t)h << 16); }

/* float -> bf16, round to nearest even; NaN stays a (quiet) NaN, overflow goes to infinity. */
static inline kvb_bf16 kvb_float_to_bf16(float f)
{
    uint32_t u = kvb_float_to_bits(f);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (kvb_bf16)((u >> 16) | 0x0040u);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (kvb_bf16)(u >> 16);
}

/* fp16 -> float, exact (every fp16 value, subnormals included, is a float). */
static inline float kvb_fp16_to_float(kvb_fp16 h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
    if (exp == 0x1F) return kvb_bits_to_float(sign | 0x7F800000u | (man << 13)); /* inf, NaN */
    if (exp == 0) {                                                             /* 0, subnormal */
        float v = ldexpf((float)man, -24);
        return sign ? -v : v;
    }
    return kvb_bits_to_float(sign | ((exp + 112u) << 23) | (man << 13));
}

/* Round |x| (finite, > 0) to a grid of `mant_bits` mantissa bits whose smallest normal exponent is
 * `emin` (subnormals below it keep the spacing 2^(emin - mant_bits)). Round half to even
 * (nearbyint in the default rounding mode). Exact: the scaling is by powers of two. */
static inline double kvb_round_to_format(double a, int mant_bits, int emin)
{
    int e;
    frexp(a, &e); /* a = m * 2^e, m in [0.5, 1): the leading bit has weight 2^(e-1) */
    int lead = e - 1 < emin ? emin : e - 1;
    double quantum = ldexp(1.0, lead - mant_bits);
    return nearbyint(a / quantum) * quantum;
}

/* double -> bf16, one rounding (RNE), overflow to infinity. */
static inline kvb_bf16 kvb_double_to_bf16(double x)
{
    /* Normal bf16 range, [2^-126, 2^127): round the double's 52-bit fraction to bf16's 7 bits on its bit
     * pattern (add half an ulp less one, plus the kept last bit for ties to even; a carry into the exponent
     * is the right result); the rounded value is a bf16, so it converts to float exactly. The fills of the
     * inputs convert billions of values: integer operations here, frexp and scalbn in the general path. */
    uint64_t bits;
    memcpy(&bits, &x, sizeof bits);
    const uint64_t mag = bits & 0x7FFFFFFFFFFFFFFFull;
    if (mag >= 0x3810000000000000ull && mag < 0x47E0000000000000ull) { /* 2^-126 <= |x| < 2^127 */
        const uint64_t drop = 52 - 7, rounded = (mag + ((1ull << (drop - 1)) - 1) + ((mag >> drop) & 1)) >> drop << drop;
        double r;
        memcpy(&r, &rounded, sizeof r);
        return (kvb_bf16)((bits >> 48 & 0x8000u) | (kvb_float_to_bits((float)r) >> 16));
    }
    if (isnan(x)) return KVB_BF16_NAN;
    uint16_t sign = signbit(x) ? 0x8000u : 0;
    double a = fabs(x);
    if (a == 0.0) return sign;
    double r = isinf(a) ? INFINITY : kvb_round_to_format(a, 7, -126);
    if (r >= 0x1p128) return (kvb_bf16)(sign | 0x7F80u);
    /* r is exactly representable as a bf16, so the float's upper half is exact */
    return (kvb_bf16)(sign | (kvb_float_to_bits((float)r) >> 16));
}

/* double -> fp16, one rounding (RNE), overflow to infinity, subnormals kept. */
static inline kvb_fp16 kvb_double_to_fp16(double x)
{
    if (isnan(x)) return (kvb_fp16)0x7E00u;
    uint16_t sign = signbit(x) ? 0x8000u : 0;
    double a = fabs(x);
    if (a == 0.0) return sign;
    double r = isinf(a) ? INFINITY : kvb_round_to_format(a, 10, -14);
    if (r >= 65536.0) return (kvb_fp16)(sign | 0x7C00u);
    if (r < 0x1p-14) return (kvb_fp16)(sign | (uint16_t)(r * 0x1p24)); /* subnormal: r = man*2^-24 */
    int e;
    double m = frexp(r, &e); /* r = m * 2^e, m in [0.5, 1) */
    uint16_t man = (uint16_t)((m * 2.0 - 1.0) * 1024.0);
    return (kvb_fp16)(sign | (uint16_t)((e - 1 + 15) << 10) | man);
}

static inline kvb_fp16 kvb_float_to_fp16(float f) { return kvb_double_to_fp16((double)f); }
static inline double kvb_bf16_to_double(kvb_bf16 h) { return (double)kvb_bf16_to_float(h); }

#ifdef __cplusplus
}
#endif
#endif /* KVB_H */
