/* tensor.c: see tensor.h. */
#include "harness/core/tensor.h"

#include <math.h>
#include <stdio.h>

size_t kvb_dtype_size(kvb_dtype t)
{
    switch (t) {
    case KVB_BF16: case KVB_FP16: return 2;
    case KVB_FP32: case KVB_I32: case KVB_U32: return 4;
    case KVB_FP64: return 8;
    case KVB_U8: return 1;
    }
    return 0;
}

const char *kvb_dtype_name(kvb_dtype t)
{
    static const char *names[] = {"bf16", "fp16", "fp32", "fp64", "int32", "uint32", "uint8"};
    return names[t];
}

int kvb_dtype_is_float(kvb_dtype t) { return t == KVB_BF16 || t == KVB_FP16 || t == KVB_FP32 || t == KVB_FP64; }

double kvb_load_as_double(const void *p, kvb_dtype t, int64_t i)
{
    switch (t) {
    case KVB_BF16: return kvb_bf16_to_float(((const uint16_t *)p)[i]);
    case KVB_FP16: return kvb_fp16_to_float(((const uint16_t *)p)[i]);
    case KVB_FP32: return ((const float *)p)[i];
    case KVB_FP64: return ((const double *)p)[i];
    case KVB_I32: return ((const int32_t *)p)[i];
    case KVB_U32: return ((const uint32_t *)p)[i];
    case KVB_U8: return ((const uint8_t *)p)[i];
    }
    return NAN;
}

uint64_t kvb_hash64(uint64_t x)
{
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

uint64_t kvb_stream_of(const char *name)
{
    uint64_t h = 0xCBF29CE484222325ull;
    for (; *name; name++) h = (h ^ (uint8_t)*name) * 0x100000001B3ull;
    return h;
}

static uint64_t mix3(uint64_t seed, uint64_t stream, uint64_t i)
{
    return kvb_hash64(kvb_hash64(seed ^ kvb_hash64(stream)) + i);
}

double kvb_uniform01(uint64_t seed, uint64_t stream, uint64_t i)
{
    return ((double)(mix3(seed, stream, i) >> 11) + 0.5) * 0x1p-53;
}

double kvb_normal01(uint64_t seed, uint64_t stream, uint64_t i)
{
    double u1 = kvb_uniform01(seed, stream, 2 * i), u2 = kvb_uniform01(seed, stream, 2 * i + 1);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

kvb_rng kvb_rng_make(uint64_t seed, uint64_t stream)
{
    kvb_rng r = {kvb_hash64(seed ^ kvb_hash64(stream))};
    return r;
}

uint64_t kvb_rng_next(kvb_rng *r)
{
    r->state += 0x9E3779B97F4A7C15ull;
    return kvb_hash64(r->state);
}

uint64_t kvb_rng_below(kvb_rng *r, uint64_t n)
{
    uint64_t limit = UINT64_MAX - UINT64_MAX % n; /* reject the incomplete last bucket */
    uint64_t x;
    do x = kvb_rng_next(r);
    while (x >= limit);
    return x % n;
}

void kvb_shuffle_i32(kvb_rng *r, int32_t *v, int64_t n)
{
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)kvb_rng_below(r, (uint64_t)i + 1);
        int32_t t = v[i];
        v[i] = v[j];
        v[j] = t;
    }
}

/* The fills are embarrassingly parallel and can be gigabytes (host-resident KV): OpenMP when the
 * build has it; the values do not depend on it. */
void kvb_fill_bf16_normal(kvb_bf16 *x, int64_t n, uint64_t seed, uint64_t stream, int64_t first,
                          double mean, double std)
{
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        x[i] = kvb_double_to_bf16(mean + std * kvb_normal01(seed, stream, (uint64_t)(first + i)));
}

void kvb_fill_bf16_uniform(kvb_bf16 *x, int64_t n, uint64_t seed, uint64_t stream, int64_t first,
                           double lo, double hi)
{
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        x[i] = kvb_double_to_bf16(lo + (hi - lo) * kvb_uniform01(seed, stream, (uint64_t)(first + i)));
}

void kvb_fill_f32_normal(float *x, int64_t n, uint64_t seed, uint64_t stream, int64_t first,
                         double mean, double std)
{
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)(mean + std * kvb_normal01(seed, stream, (uint64_t)(first + i)));
}

int kvb_npy_write(const char *path, kvb_dtype t, int ndim, const int64_t *shape, const void *data)
{
    static const char *descr[] = {"<u2", "<f2", "<f4", "<f8", "<i4", "<u4", "|u1"};
    char header[512], dims[256] = "";
    int64_t n = 1;
    size_t len = 0;
    for (int i = 0; i < ndim; i++) {
        len += (size_t)snprintf(dims + len, sizeof dims - len, "%lld%s", (long long)shape[i],
                                ndim == 1 ? "," : (i + 1 < ndim ? ", " : ""));
        n *= shape[i];
    }
    int h = snprintf(header, sizeof header, "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }",
                     descr[t], dims);
    /* magic (6) + version (2) + header length (2) + header, padded with spaces to a multiple of 64,
     * ending in '\n' */
    int total = 10 + h + 1;
    int pad = (64 - total % 64) % 64;
    FILE *f = fopen(path, "wb");
    if (!f) return kvb_fail(KVB_EIO, "cannot write %s", path);
    uint16_t hlen = (uint16_t)(h + pad + 1);
    fwrite("\x93NUMPY\x01\x00", 1, 8, f);
    fputc(hlen & 0xFF, f);
    fputc(hlen >> 8, f);
    fwrite(header, 1, (size_t)h, f);
    for (int i = 0; i < pad; i++) fputc(' ', f);
    fputc('\n', f);
    size_t bytes = (size_t)n * kvb_dtype_size(t);
    int ok = fwrite(data, 1, bytes, f) == bytes;
    ok &= fclose(f) == 0;
    return ok ? KVB_OK : kvb_fail(KVB_EIO, "short write to %s", path);
}
