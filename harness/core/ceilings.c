/* ceilings.c: see ceilings.h. */
#include "harness/core/ceilings.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness/core/timing.h"

#if KVB_HAVE_CUDA
#include <cublas_v2.h>

#define CUBLAS_CHECK(call)                                                                  \
    do {                                                                                    \
        cublasStatus_t s_ = (call);                                                         \
        if (s_ != CUBLAS_STATUS_SUCCESS) {                                                  \
            fprintf(stderr, "kvbench: cuBLAS error %d in %s at %s:%d\n", (int)s_, #call,    \
                    __FILE__, __LINE__);                                                    \
            exit(3);                                                                        \
        }                                                                                   \
    } while (0)

typedef struct copy_ctx {
    void *dst;
    const void *src;
    size_t bytes;
    cudaStream_t s;
    int kind; /* 0 memcpy, 1 copy kernel, 2 read kernel (dst unused) */
} copy_ctx;

static void copy_work(void *p)
{
    copy_ctx *c = p;
    if (c->kind == 0) KVB_CUDA(cudaMemcpyAsync(c->dst, c->src, c->bytes, cudaMemcpyDefault, c->s));
    else if (c->kind == 1) kvb_copy_kernel(c->dst, c->src, c->bytes, c->s);
    else kvb_read_kernel(c->src, c->bytes, c->s);
}

static void null_work(void *p) { kvb_null_kernel(*(cudaStream_t *)p); }

static double time_copy(void *dst, const void *src, size_t bytes, int kind, cudaStream_t s, int n)
{
    copy_ctx c = {dst, src, bytes, s, kind};
    kvb_timed t = {NULL, copy_work, &c, s, 0};
    return kvb_time_best(&t, n);
}

typedef struct gemm_ctx {
    cublasHandle_t h;
    int n;
    void *a, *b, *c;
} gemm_ctx;

static void gemm_work(void *p)
{
    gemm_ctx *g = p;
    float one = 1.0f, zero = 0.0f;
    CUBLAS_CHECK(cublasGemmEx(g->h, CUBLAS_OP_N, CUBLAS_OP_N, g->n, g->n, g->n, &one, g->a, CUDA_R_16BF, g->n,
                              g->b, CUDA_R_16BF, g->n, &zero, g->c, CUDA_R_16BF, g->n, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT));
}

int kvb_ceilings_measure(kvb_ceilings *c)
{
    memset(c, 0, sizeof *c);
    if (!kvb_gpu_available()) return KVB_EDEVICE;
    cudaStream_t s = kvb_stream_create();
    kvb_nvtx_push("ceilings");
    kvb_timed tn = {NULL, null_work, &s, s, 0};
    kvb_time_median(&tn, 5); /* warm-up */
    c->launch_floor_us = kvb_time_median(&tn, 50) * 1e6;

    c->d2d_bytes = (size_t)1 << 30; /* 1 GiB: far past L2 */
    /* a holds 2 GiB so that the read ceiling streams as many bytes as the copy moves (read + write) */
    char *a = kvb_dmalloc(2 * c->d2d_bytes), *b = kvb_dmalloc(c->d2d_bytes);
    kvb_dmemset(a, 0x3C, 2 * c->d2d_bytes, s);
    double t = time_copy(b, a, c->d2d_bytes, 0, s, 20);
    c->d2d_memcpy_GBps = 2.0 * c->d2d_bytes / t * 1e-9;
    t = time_copy(b, a, c->d2d_bytes, 1, s, 20);
    c->d2d_kernel_GBps = 2.0 * c->d2d_bytes / t * 1e-9;
    t = time_copy(NULL, a, 2 * c->d2d_bytes, 2, s, 20) /* as many bytes as the copy moves */;
    c->read_GBps = 2.0 * c->d2d_bytes / t * 1e-9;

    c->h2d_bytes = (size_t)256 << 20;
    void *h = kvb_pinned_alloc(c->h2d_bytes);
    memset(h, 0x3C, c->h2d_bytes);
    t = time_copy(a, h, c->h2d_bytes, 0, s, 10);
    c->h2d_memcpy_GBps = c->h2d_bytes / t * 1e-9;
    t = time_copy(a, h, c->h2d_bytes, 1, s, 10);
    c->h2d_zero_copy_GBps = c->h2d_bytes / t * 1e-9;
    t = time_copy(h, a, c->h2d_bytes, 0, s, 10);
    c->d2h_memcpy_GBps = c->h2d_bytes / t * 1e-9;
    kvb_pinned_free(h);
    kvb_dfree(a);
    kvb_dfree(b);

    /* bf16 GEMM on random (not zero) data: zeros run faster than real data */
    gemm_ctx g = {0};
    g.n = c->gemm_n = 8192;
    size_t elems = (size_t)g.n * g.n;
    kvb_bf16 *hb = kvb_xalloc(elems, 2, "the matrix-rate ceiling's input");
    if (!hb) kvb_guard_fail();
    kvb_fill_bf16_uniform(hb, (int64_t)elems, 1, kvb_stream_of("gemm"), 0, -1.0, 1.0);
    g.a = kvb_dmalloc(elems * 2);
    g.b = kvb_dmalloc(elems * 2);
    g.c = kvb_dmalloc(elems * 2);
    kvb_h2d(g.a, hb, elems * 2, s);
    kvb_h2d(g.b, hb, elems * 2, s);
    kvb_sync(s);
    kvb_xfree(hb);
    CUBLAS_CHECK(cublasCreate(&g.h));
    CUBLAS_CHECK(cublasSetStream(g.h, s));
    gemm_work(&g); /* warm-up: heuristics, kernel load */
    kvb_sync(s);
    kvb_timed tg = {NULL, gemm_work, &g, s, 0};
    t = kvb_time_best(&tg, 10);
    c->bf16_mma_TFLOPs = 2.0 * g.n * (double)g.n * g.n / t * 1e-12;
    CUBLAS_CHECK(cublasDestroy(g.h));
    kvb_dfree(g.a), kvb_dfree(g.b), kvb_dfree(g.c);

    kvb_nvtx_pop();
    kvb_stream_destroy(s);
    c->measured = 1;
    return KVB_OK;
}

/* a pinned source, a device source and a device destination, each grown as needed (only those the
 * measurement uses: a read ceiling of gigabytes needs no pinned copy of them) */
static void *g_src, *g_dst, *g_dsrc;
static size_t g_cap_src, g_cap_dst, g_cap_dsrc;
static struct { size_t bytes; double h2d, d2d, read; } g_cache[64];
static int g_ncache;

static void grow(void **p, size_t *cap, size_t bytes, int pinned)
{
    if (bytes <= *cap) return;
    if (pinned) kvb_pinned_free(*p);
    else kvb_dfree(*p);
    *p = pinned ? kvb_pinned_alloc(bytes) : kvb_dmalloc(bytes);
    if (pinned) memset(*p, 0x3C, bytes);
    else kvb_dmemset(*p, 0x3C, bytes, 0); /* not zeros: never measure on zeros */
    *cap = bytes;
}

static void ensure_buffers(size_t bytes, int kind)
{
    if (kind == 0) grow(&g_src, &g_cap_src, bytes, 1);
    if (kind == 1 || kind == 2) grow(&g_dsrc, &g_cap_dsrc, bytes, 0);
    if (kind == 0 || kind == 1) grow(&g_dst, &g_cap_dst, bytes, 0);
    KVB_CUDA(cudaDeviceSynchronize());
}

/* kind: 0 pinned host to device, 1 device to device, 2 device read kernel */
static double *cache_slot(size_t bytes, int kind)
{
    int i = 0;
    while (i < g_ncache && g_cache[i].bytes != bytes) i++;
    if (i == g_ncache) {
        if (g_ncache == 64) { /* full: start over (sizes repeat within a family) */
            g_ncache = 0;
            i = 0;
        }
        g_cache[g_ncache++] = (typeof(g_cache[0])){bytes, 0, 0, 0};
    }
    return kind == 0 ? &g_cache[i].h2d : kind == 1 ? &g_cache[i].d2d : &g_cache[i].read;
}

static double contiguous(size_t bytes, int kind)
{
    bytes &= ~(size_t)15;
    if (bytes < 16) bytes = 16;
    double *slot = cache_slot(bytes, kind);
    if (*slot > 0) return *slot;
    ensure_buffers(bytes, kind);
    cudaStream_t s = kvb_stream_create();
    double t = kind == 2 ? time_copy(NULL, g_dsrc, bytes, 2, s, 20)
                         : time_copy(g_dst, kind == 1 ? g_dsrc : g_src, bytes, 0, s, 20);
    kvb_stream_destroy(s);
    *slot = t;
    return t;
}

double kvb_h2d_contiguous_seconds(size_t bytes) { return contiguous(bytes, 0); }
double kvb_d2d_contiguous_seconds(size_t bytes) { return contiguous(bytes, 1); }
double kvb_read_contiguous_seconds(size_t bytes) { return contiguous(bytes, 2); }

#else
int kvb_ceilings_measure(kvb_ceilings *c) { memset(c, 0, sizeof *c); return KVB_EDEVICE; }
double kvb_h2d_contiguous_seconds(size_t bytes) { (void)bytes; return 0; }
double kvb_d2d_contiguous_seconds(size_t bytes) { (void)bytes; return 0; }
double kvb_read_contiguous_seconds(size_t bytes) { (void)bytes; return 0; }
#endif

double kvb_ceiling_seconds(const kvb_cost *cost, const kvb_ceilings *c)
{
    switch (cost->ceiling) {
    case KVB_CEIL_H2D: return cost->bytes_h2d > 0 ? kvb_h2d_contiguous_seconds((size_t)cost->bytes_h2d) : 0;
    case KVB_CEIL_D2D: /* a copy of bytes_dev / 2 moves bytes_dev (read + write) */
        return cost->bytes_dev >= 32 ? kvb_d2d_contiguous_seconds((size_t)(cost->bytes_dev / 2)) : 0;
    case KVB_CEIL_READ: return cost->bytes_dev >= 16 ? kvb_read_contiguous_seconds((size_t)cost->bytes_dev) : 0;
    case KVB_CEIL_READ_H2D: {
        const double serial = cost->bytes_dev_serial >= 16 ? kvb_read_contiguous_seconds((size_t)cost->bytes_dev_serial) : 0;
        const double rest = cost->bytes_dev - cost->bytes_dev_serial;
        const double dev = rest >= 16 ? kvb_read_contiguous_seconds((size_t)rest) : 0;
        const double host = cost->bytes_h2d > 0 ? kvb_h2d_contiguous_seconds((size_t)cost->bytes_h2d) : 0;
        return serial + (dev > host ? dev : host);
    }
    case KVB_CEIL_MMA: return cost->flops > 0 && c && c->bf16_mma_TFLOPs > 0 ? cost->flops / (c->bf16_mma_TFLOPs * 1e12) : 0;
    case KVB_CEIL_NONE: break;
    }
    return 0;
}

const char *kvb_ceiling_name(kvb_ceiling_kind k)
{
    switch (k) {
    case KVB_CEIL_H2D: return "pinned H2D copy";
    case KVB_CEIL_D2D: return "device copy";
    case KVB_CEIL_READ: return "device read";
    case KVB_CEIL_READ_H2D: return "device read, pinned H2D overlapped";
    case KVB_CEIL_MMA: return "bf16 matrix rate";
    case KVB_CEIL_NONE: break;
    }
    return "none";
}

void kvb_ceilings_print(const kvb_ceilings *c)
{
    if (!c->measured) {
        printf("ceilings: not measured (no device)\n");
        return;
    }
    printf("ceilings (this device, this run):\n");
    printf("  device copy, cudaMemcpy D2D (%zu MiB, read+write) %8.1f GB/s\n", c->d2d_bytes >> 20, c->d2d_memcpy_GBps);
    printf("  device copy, 16-byte copy kernel (read+write)    %8.1f GB/s\n", c->d2d_kernel_GBps);
    printf("  device read, streaming reduce kernel (read only)  %8.1f GB/s\n", c->read_GBps);
    printf("  host to device, cudaMemcpy pinned (%zu MiB)       %8.1f GB/s\n", c->h2d_bytes >> 20, c->h2d_memcpy_GBps);
    printf("  host to device, kernel reading pinned (zero-copy)  %8.1f GB/s\n", c->h2d_zero_copy_GBps);
    printf("  device to host, cudaMemcpy pinned                  %8.1f GB/s\n", c->d2h_memcpy_GBps);
    printf("  bf16 GEMM, cuBLAS %dx%dx%d, fp32 accumulate      %8.1f TFLOP/s\n", c->gemm_n, c->gemm_n, c->gemm_n,
           c->bf16_mma_TFLOPs);
    printf("  timing floor: an empty kernel, timed like the cases %8.2f us\n", c->launch_floor_us);
}

void kvb_ceilings_json(const kvb_ceilings *c, kvb_json *j)
{
    kvb_json_obj(j, "ceilings");
    kvb_json_bool(j, "measured", c->measured);
    kvb_json_num(j, "d2d_memcpy_GBps", c->d2d_memcpy_GBps);
    kvb_json_num(j, "d2d_kernel_GBps", c->d2d_kernel_GBps);
    kvb_json_num(j, "read_GBps", c->read_GBps);
    kvb_json_num(j, "h2d_memcpy_GBps", c->h2d_memcpy_GBps);
    kvb_json_num(j, "h2d_zero_copy_GBps", c->h2d_zero_copy_GBps);
    kvb_json_num(j, "d2h_memcpy_GBps", c->d2h_memcpy_GBps);
    kvb_json_num(j, "bf16_mma_TFLOPs", c->bf16_mma_TFLOPs);
    kvb_json_num(j, "launch_floor_us", c->launch_floor_us);
    kvb_json_int(j, "d2d_bytes", (long long)c->d2d_bytes);
    kvb_json_int(j, "h2d_bytes", (long long)c->h2d_bytes);
    kvb_json_int(j, "gemm_n", c->gemm_n);
    kvb_json_close(j);
}
