/* tensor.c: see tensor.h. */
#include "harness/core/tensor.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#ifdef _OPENMP
#include <omp.h>
#else
static int omp_in_parallel(void) { return 0; }
#endif

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

double kvb_sequence_uniform01(uint64_t key, uint64_t i) { return ((double)(kvb_hash64(key + i) >> 11) + 0.5) * 0x1p-53; }

/* The key of a (seed, stream) sequence: element i hashes key + i (mix3), so a fill hashes once an element. */
static uint64_t sequence_key(uint64_t seed, uint64_t stream) { return kvb_hash64(seed ^ kvb_hash64(stream)); }

uint64_t kvb_sequence_key(uint64_t seed, uint64_t stream) { return sequence_key(seed, stream); }

/* Box-Muller on pair j of the sequence: one hash gives both uniforms (23 bits each, odd multiples of
 * 2^-24: never 0 or 1, exact in float), and the pair gives two normals, the cosine one at index 2j and
 * the sine one at 2j + 1. Single precision is ample for inputs stored as bf16 or fp32, and one log and
 * one sincos serve two elements: the fills of a long-context case are gigabytes, and they were most of
 * its set-up in double precision. |z| <= sqrt(2 ln 2^24) = 5.77. */
void kvb_normal_pair(uint64_t key, uint64_t j, float *z0, float *z1)
{
    const uint64_t h = kvb_hash64(key + j);
    const float u1 = (float)(2 * (h >> 41) + 1) * 0x1p-24f, u2 = (float)(2 * (h & 0x7FFFFF) + 1) * 0x1p-24f;
    const float r = sqrtf(-2.0f * logf(u1)), a = 6.28318530717958647692f * u2;
    *z0 = r * cosf(a);
    *z1 = r * sinf(a);
}

double kvb_normal01(uint64_t seed, uint64_t stream, uint64_t i)
{
    float z0, z1;
    kvb_normal_pair(sequence_key(seed, stream), i >> 1, &z0, &z1);
    return i & 1 ? z1 : z0;
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
 * build has it; the values do not depend on it. Each fill adds its wall time to the run's "inputs" phase
 * (kvb_fill_seconds). */
static double g_fill_s;

double kvb_fill_seconds(void) { return g_fill_s; }

void kvb_fill_seconds_add(double s) { g_fill_s += s; }

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Element i of x is normal index first + i: whole pairs in the loop, a lone first or last element alone. */
#define FILL_NORMAL(x, n, seed, stream, first, convert)                                                        \
    do {                                                                                                      \
        const uint64_t key_ = sequence_key(seed, stream);                                                     \
        const int64_t lead_ = (first) & 1, pairs_ = ((n) - lead_) / 2;                                        \
        float z0_, z1_;                                                                                       \
        if (lead_ && (n) > 0) {                                                                               \
            kvb_normal_pair(key_, (uint64_t)(first) >> 1, &z0_, &z1_);                                            \
            x[0] = convert(z1_);                                                                              \
        }                                                                                                     \
        _Pragma("omp parallel for schedule(static) private(z0_, z1_)")                                        \
        for (int64_t p_ = 0; p_ < pairs_; p_++) {                                                             \
            kvb_normal_pair(key_, (uint64_t)((first) + lead_) / 2 + (uint64_t)p_, &z0_, &z1_);                    \
            x[lead_ + 2 * p_] = convert(z0_);                                                                 \
            x[lead_ + 2 * p_ + 1] = convert(z1_);                                                             \
        }                                                                                                     \
        if ((n) > lead_ + 2 * pairs_) {                                                                       \
            kvb_normal_pair(key_, (uint64_t)((first) + (n) - 1) >> 1, &z0_, &z1_);                                \
            x[(n) - 1] = convert(z0_);                                                                        \
        }                                                                                                     \
    } while (0)

/* ---- the fill memo ----
 * A long-context case draws gigabytes of normals (K, V, a block's weights), and the cases of one shape
 * (implementations, budgets, variants) draw the same ones from the same arguments: a fill of at least
 * MEMO_MIN_BYTES is kept, and a later fill with the same arguments is a copy of it (a copy runs at memory
 * speed, about 20x the draw's rate). A fill is a function of its arguments, so the copy is the draw to the
 * bit. The least recently used fill goes first, to hold the memo within its limit (kvb_fill_memo_limit).
 * Its blocks are outside the run's host-memory accounting (plain malloc): a failed one is not kept. */
enum { MEMO_SLOTS = 32, MEMO_MIN_BYTES = 32 << 20, MEMO_ARGS = 8 };
typedef struct fill_args {
    const char *kind; /* which fill, and so which rules */
    uint64_t v[MEMO_ARGS]; /* every number its values depend on, the rest 0 */
} fill_args;
static struct {
    fill_args args;
    void *copy; /* NULL: a free slot */
    size_t bytes;
    uint64_t used; /* the memo's clock at the last use */
} g_memo[MEMO_SLOTS];
static size_t g_memo_held, g_memo_limit = KVB_FILL_MEMO_MAX;
static uint64_t g_memo_clock;

static void memo_drop(int i)
{
    free(g_memo[i].copy);
    g_memo_held -= g_memo[i].bytes;
    memset(&g_memo[i], 0, sizeof g_memo[i]);
}

static int memo_oldest(void)
{
    int oldest = -1;
    for (int i = 0; i < MEMO_SLOTS; i++)
        if (g_memo[i].copy && (oldest < 0 || g_memo[i].used < g_memo[oldest].used)) oldest = i;
    return oldest;
}

/* the least recently used fills go until `bytes` more fit the limit and a slot is free: its index */
static int memo_make_room(size_t bytes)
{
    for (;;) {
        int free_slot = -1;
        for (int i = 0; i < MEMO_SLOTS && free_slot < 0; i++)
            if (!g_memo[i].copy) free_slot = i;
        if (free_slot >= 0 && g_memo_held + bytes <= g_memo_limit) return free_slot;
        memo_drop(memo_oldest()); /* bytes <= g_memo_limit: an empty memo has room */
    }
}

static int args_equal(const fill_args *x, const fill_args *y)
{
    return !strcmp(x->kind, y->kind) && !memcmp(x->v, y->v, sizeof x->v);
}

/* the arguments of a fill: its kind (a string that outlives the run: a literal) and up to MEMO_ARGS numbers */
static int args_make(fill_args *a, const char *kind, const uint64_t *v, int n)
{
    if (n > MEMO_ARGS) return 0;
    memset(a, 0, sizeof *a);
    a->kind = kind;
    memcpy(a->v, v, sizeof *v * (size_t)n);
    return 1;
}

static uint64_t bits_of(double x)
{
    uint64_t b;
    memcpy(&b, &x, sizeof b);
    return b;
}

void kvb_copy_parallel(void *dst, const void *src, size_t bytes)
{
    const size_t chunk = 1 << 20;
    const int64_t n = (int64_t)((bytes + chunk - 1) / chunk);
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < n; c++) {
        const size_t at = (size_t)c * chunk;
        memcpy((char *)dst + at, (const char *)src + at, bytes - at < chunk ? bytes - at : chunk);
    }
}

/* 1 when x now holds a kept fill of these arguments */
static int memo_fetch(const fill_args *args, void *x, size_t bytes)
{
    if (bytes < MEMO_MIN_BYTES || omp_in_parallel()) return 0;
    for (int i = 0; i < MEMO_SLOTS; i++)
        if (g_memo[i].copy && args_equal(&g_memo[i].args, args)) {
            kvb_copy_parallel(x, g_memo[i].copy, bytes);
            g_memo[i].used = ++g_memo_clock;
            return 1;
        }
    return 0;
}

static void memo_keep(const fill_args *args, const void *x, size_t bytes)
{
    if (bytes < MEMO_MIN_BYTES || bytes > g_memo_limit || omp_in_parallel()) return;
    const int i = memo_make_room(bytes);
    if (i < 0 || !(g_memo[i].copy = malloc(bytes))) return;
    kvb_copy_parallel(g_memo[i].copy, x, bytes);
    g_memo[i].args = *args, g_memo[i].bytes = bytes, g_memo[i].used = ++g_memo_clock;
    g_memo_held += bytes;
}

int kvb_fill_memo_fetch(const char *kind, const uint64_t *args, int n_args, void *x, size_t bytes)
{
    fill_args a;
    return args_make(&a, kind, args, n_args) && memo_fetch(&a, x, bytes);
}

void kvb_fill_memo_keep(const char *kind, const uint64_t *args, int n_args, const void *x, size_t bytes)
{
    fill_args a;
    if (args_make(&a, kind, args, n_args)) memo_keep(&a, x, bytes);
}

void kvb_fill_memo_limit(size_t bytes)
{
    g_memo_limit = bytes;
    while (g_memo_held > g_memo_limit) memo_drop(memo_oldest());
}

size_t kvb_fill_memo_held(void) { return g_memo_held; }

void kvb_fill_memo_release(void)
{
    for (int i = 0; i < MEMO_SLOTS; i++)
        if (g_memo[i].copy) memo_drop(i);
}

void kvb_fill_bf16_normal(kvb_bf16 *x, int64_t n, uint64_t seed, uint64_t stream, int64_t first,
                          double mean, double std)
{
    const double t0 = now_s();
    const fill_args args = {"bf16 normal", {(uint64_t)n, (uint64_t)first, seed, stream, bits_of(mean), bits_of(std)}};
    const size_t bytes = sizeof *x * (size_t)n;
    if (!memo_fetch(&args, x, bytes)) {
#define TO_BF16(z) kvb_double_to_bf16(mean + std * (double)(z))
        FILL_NORMAL(x, n, seed, stream, first, TO_BF16);
#undef TO_BF16
        memo_keep(&args, x, bytes);
    }
    g_fill_s += now_s() - t0;
}

void kvb_fill_bf16_uniform(kvb_bf16 *x, int64_t n, uint64_t seed, uint64_t stream, int64_t first,
                           double lo, double hi)
{
    const double t0 = now_s();
    const fill_args args = {"bf16 uniform", {(uint64_t)n, (uint64_t)first, seed, stream, bits_of(lo), bits_of(hi)}};
    const size_t bytes = sizeof *x * (size_t)n;
    if (!memo_fetch(&args, x, bytes)) {
        const uint64_t key = sequence_key(seed, stream);
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < n; i++) {
            x[i] = kvb_double_to_bf16(lo + (hi - lo) * kvb_sequence_uniform01(key, (uint64_t)(first + i)));
        }
        memo_keep(&args, x, bytes);
    }
    g_fill_s += now_s() - t0;
}

void kvb_fill_f32_normal(float *x, int64_t n, uint64_t seed, uint64_t stream, int64_t first,
                         double mean, double std)
{
    const double t0 = now_s();
    const fill_args args = {"f32 normal", {(uint64_t)n, (uint64_t)first, seed, stream, bits_of(mean), bits_of(std)}};
    const size_t bytes = sizeof *x * (size_t)n;
    if (!memo_fetch(&args, x, bytes)) {
#define TO_F32(z) (float)(mean + std * (double)(z))
        FILL_NORMAL(x, n, seed, stream, first, TO_F32);
#undef TO_F32
        memo_keep(&args, x, bytes);
    }
    g_fill_s += now_s() - t0;
}

void kvb_dtype_uncomputed(kvb_dtype t, void *elem)
{
    switch (t) {
    case KVB_BF16: *(uint16_t *)elem = KVB_BF16_NAN; break;
    case KVB_FP16: *(uint16_t *)elem = 0x7E00; break; /* quiet NaN */
    case KVB_FP32: *(float *)elem = NAN; break;
    case KVB_FP64: *(double *)elem = NAN; break;
    default: memset(elem, 0xFF, kvb_dtype_size(t)); break; /* -1 as a signed integer */
    }
}

/* ---- .npy files ---- */

typedef struct npy_file {
    FILE *f;
    const char *path;
    int err; /* errno of the first failed write */
} npy_file;

static void npy_put(npy_file *w, const void *p, size_t bytes)
{
    if (!w->err && bytes && fwrite(p, 1, bytes, w->f) != bytes) w->err = errno ? errno : EIO;
}

/* `count` copies of one element of `size` bytes */
static void npy_repeat(npy_file *w, const void *elem, size_t size, int64_t count)
{
    uint8_t buf[4096];
    const int64_t per = (int64_t)(sizeof buf / size);
    for (int64_t i = 0; i < per; i++) memcpy(buf + i * size, elem, size);
    for (int64_t done = 0; done < count && !w->err; done += per)
        npy_put(w, buf, (size_t)((count - done < per ? count - done : per) * (int64_t)size));
}

static int npy_open(npy_file *w, const char *path, kvb_dtype t, int ndim, const int64_t *shape)
{
    static const char *descr[] = {"<u2", "<f2", "<f4", "<f8", "<i4", "<u4", "|u1"};
    char header[512], dims[256] = "";
    size_t len = 0;
    for (int i = 0; i < ndim; i++)
        len += (size_t)snprintf(dims + len, sizeof dims - len, "%lld%s", (long long)shape[i],
                                ndim == 1 ? "," : (i + 1 < ndim ? ", " : ""));
    int h = snprintf(header, sizeof header, "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }",
                     descr[t], dims);
    *w = (npy_file){fopen(path, "wb"), path, 0};
    if (!w->f) return kvb_fail(KVB_EIO, "cannot write %s: %s", path, strerror(errno));
    /* magic (6) + version (2) + header length (2) + header, padded with spaces to a multiple of 64,
     * ending in '\n' */
    int total = 10 + h + 1;
    int pad = (64 - total % 64) % 64;
    uint16_t hlen = (uint16_t)(h + pad + 1);
    uint8_t hl[2] = {(uint8_t)(hlen & 0xFF), (uint8_t)(hlen >> 8)};
    npy_put(w, "\x93NUMPY\x01\x00", 8);
    npy_put(w, hl, 2);
    npy_put(w, header, (size_t)h);
    npy_repeat(w, " ", 1, pad);
    npy_put(w, "\n", 1);
    return KVB_OK;
}

/* Closes the file; on any failed write or close, removes what was written (a regular file only) and
 * fails naming the path and the system's reason. */
static int npy_close(npy_file *w)
{
    if (fflush(w->f) != 0 && !w->err) w->err = errno ? errno : EIO;
    if (fclose(w->f) != 0 && !w->err) w->err = errno ? errno : EIO;
    if (!w->err) return KVB_OK;
    struct stat st;
    if (stat(w->path, &st) == 0 && S_ISREG(st.st_mode)) remove(w->path);
    return kvb_fail(KVB_EIO, "cannot write %s: %s", w->path, strerror(w->err));
}

static int64_t elements_of(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= shape[i];
    return n;
}

/* The body of a sampled tensor, run by run of slices with the same mask value: the data where the
 * mask is set and `skipped` (one element) elsewhere; `data` NULL writes `kept` (one element) instead
 * of the data. */
static void npy_put_sampled(npy_file *w, size_t es, int64_t n, const void *data, const void *kept, const void *skipped,
                            int64_t slice_len, const uint8_t *mask)
{
    for (int64_t i = 0; i < n && !w->err;) {
        const int on = !mask || mask[i / slice_len];
        int64_t end = (i / slice_len + 1) * slice_len;
        while (mask && end < n && !mask[end / slice_len] == !on) end += slice_len;
        if (!mask || end > n) end = n;
        if (on && data) npy_put(w, (const uint8_t *)data + (size_t)i * es, (size_t)(end - i) * es);
        else npy_repeat(w, on ? kept : skipped, es, end - i);
        i = end;
    }
}

int kvb_npy_write(const char *path, kvb_dtype t, int ndim, const int64_t *shape, const void *data)
{
    return kvb_npy_write_sampled(path, t, ndim, shape, data, 1, NULL);
}

int kvb_npy_write_sampled(const char *path, kvb_dtype t, int ndim, const int64_t *shape, const void *data,
                          int64_t slice_len, const uint8_t *mask)
{
    if (mask && slice_len < 1) return kvb_fail(KVB_EINVAL, "%s: slice_len=%lld out of range [1, n]", path, (long long)slice_len);
    npy_file w;
    if (npy_open(&w, path, t, ndim, shape) != KVB_OK) return KVB_EIO;
    uint8_t skipped[8];
    kvb_dtype_uncomputed(t, skipped);
    npy_put_sampled(&w, kvb_dtype_size(t), elements_of(ndim, shape), data, NULL, skipped, slice_len, mask);
    return npy_close(&w);
}

int kvb_npy_write_mask(const char *path, int ndim, const int64_t *shape, int64_t slice_len, const uint8_t *mask)
{
    if (mask && slice_len < 1) return kvb_fail(KVB_EINVAL, "%s: slice_len=%lld out of range [1, n]", path, (long long)slice_len);
    npy_file w;
    if (npy_open(&w, path, KVB_U8, ndim, shape) != KVB_OK) return KVB_EIO;
    const uint8_t one = 1, zero = 0;
    npy_put_sampled(&w, 1, elements_of(ndim, shape), NULL, &one, &zero, slice_len, mask);
    return npy_close(&w);
}
