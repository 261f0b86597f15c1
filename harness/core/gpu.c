/* gpu.c: see gpu.h. */
#include "harness/core/gpu.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness/core/tensor.h"
#include "reference/kvb.h"

static int g_state = -1; /* -1 unknown, 0 none, 1 usable */
static char g_reason[256];

const char *kvb_gpu_unavailable_reason(void) { return g_reason; }

/* ---- case guards ---- */
static jmp_buf *g_guard;
static int g_broken;
static char g_broken_reason[400];

jmp_buf *kvb_guard_enter(jmp_buf *jb)
{
    g_guard = jb;
    return jb;
}

void kvb_guard_leave(void) { g_guard = NULL; }

void kvb_guard_fail(void)
{
    jmp_buf *jb = g_guard;
    g_guard = NULL;
    if (jb) longjmp(*jb, 1);
    fprintf(stderr, "kvbench: %s\n", kvb_last_error());
    exit(1); /* a failure, not exit status 3 (nothing measured: exitcode.h) */
}

int kvb_device_broken(void) { return g_broken; }
const char *kvb_device_broken_reason(void) { return g_broken_reason; }

#if KVB_HAVE_CUDA

#include <dlfcn.h>
#include <nvtx3/nvToolsExt.h>

void kvb_cuda_fatal(int err, const char *what, const char *file, int line)
{
    kvb_fail(KVB_EDEVICE, "CUDA error %d (%s: %s) in %s at %s:%d", err, cudaGetErrorName((cudaError_t)err),
             cudaGetErrorString((cudaError_t)err), what, file, line);
    /* A sticky error (illegal address, launch failure) is returned by every later call too: then
     * nothing more can run on this device in this process. */
    cudaError_t again = cudaDeviceSynchronize();
    (void)cudaGetLastError();
    if (again != cudaSuccess && !g_broken) {
        g_broken = 1;
        snprintf(g_broken_reason, sizeof g_broken_reason, "%s", kvb_last_error());
    }
    kvb_guard_fail();
}

int kvb_cuda_runtime_version(void)
{
    int v = 0;
    return cudaRuntimeGetVersion(&v) == cudaSuccess ? v : CUDART_VERSION;
}

/* Why cudaGetDeviceCount failed, in words: the runtime says "driver version is insufficient" both
 * when there is no driver at all and when it is too old; whether libcuda.so.1 loads tells them apart. */
static void no_device_reason(cudaError_t e, int n)
{
    const int rt = kvb_cuda_runtime_version();
    if (e == cudaSuccess && n == 0) {
        snprintf(g_reason, sizeof g_reason, "no CUDA device found");
    } else if (e == cudaErrorNoDevice) {
        snprintf(g_reason, sizeof g_reason, "no CUDA device found (the NVIDIA driver sees none)");
    } else if (e == cudaErrorInsufficientDriver) {
        void *libcuda = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
        if (!libcuda) {
            snprintf(g_reason, sizeof g_reason, "no CUDA device: no NVIDIA driver found (libcuda.so.1 not loadable)");
        } else {
            int drv = 0;
            (void)cudaDriverGetVersion(&drv);
            dlclose(libcuda);
            snprintf(g_reason, sizeof g_reason,
                     "no CUDA device: the NVIDIA driver supports CUDA %d.%d, older than this build's CUDA runtime %d.%d",
                     drv / 1000, drv % 1000 / 10, rt / 1000, rt % 1000 / 10);
        }
    } else {
        snprintf(g_reason, sizeof g_reason, "no CUDA device: cudaGetDeviceCount failed: %s (%s)", cudaGetErrorName(e),
                 cudaGetErrorString(e));
    }
}

int kvb_gpu_available(void)
{
    if (g_state >= 0) return g_state;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
        no_device_reason(e, n);
        (void)cudaGetLastError();
        fprintf(stderr, "kvbench: %s: GPU work is skipped\n", g_reason);
        return g_state = 0;
    }
    int major = 0;
    KVB_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0));
    if (major < 9) {
        snprintf(g_reason, sizeof g_reason,
                 "device 0 has compute capability %d.x; this build targets sm_90 (Hopper)", major);
        fprintf(stderr, "kvbench: %s: GPU work is skipped\n", g_reason);
        return g_state = 0;
    }
    KVB_CUDA(cudaSetDevice(0));
    return g_state = 1;
}

static void run_nvidia_smi(const char *bus, const char *query, char *out, size_t n)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "nvidia-smi -i %s --query-gpu=%s --format=csv,noheader 2>/dev/null", bus, query);
    out[0] = '\0';
    FILE *p = popen(cmd, "r");
    if (!p) return;
    if (fgets(out, (int)n, p)) out[strcspn(out, "\n")] = '\0';
    pclose(p);
}

int kvb_gpu_info(kvb_device_info *info)
{
    memset(info, 0, sizeof *info);
    if (!kvb_gpu_available()) return KVB_EDEVICE;
    struct cudaDeviceProp p;
    KVB_CUDA(cudaGetDeviceProperties(&p, 0));
    snprintf(info->name, sizeof info->name, "%s", p.name);
    info->sm_count = p.multiProcessorCount;
    info->cc_major = p.major;
    info->cc_minor = p.minor;
    info->l2_bytes = (size_t)p.l2CacheSize;
    info->mem_bytes = p.totalGlobalMem;
    KVB_CUDA(cudaRuntimeGetVersion(&info->runtime_version));
    KVB_CUDA(cudaDriverGetVersion(&info->driver_version));
    char bus[32];
    KVB_CUDA(cudaDeviceGetPCIBusId(bus, sizeof bus, 0));
    run_nvidia_smi(bus, "driver_version", info->driver, sizeof info->driver);
    char raw[128];
    run_nvidia_smi(bus, "clocks.sm,clocks.max.sm,clocks.mem,clocks.max.mem", raw, sizeof raw);
    if (raw[0]) {
        char sm[32] = "", smx[32] = "", mem[32] = "", memx[32] = "";
        sscanf(raw, " %31[^,], %31[^,], %31[^,], %31[^\n]", sm, smx, mem, memx);
        snprintf(info->clocks, sizeof info->clocks, "sm %s (max %s), mem %s (max %s)", sm, smx, mem, memx);
    } else {
        snprintf(info->clocks, sizeof info->clocks, "unknown (nvidia-smi not available)");
    }
    if (!info->driver[0]) snprintf(info->driver, sizeof info->driver, "CUDA driver API %d", info->driver_version);
    return KVB_OK;
}

void *kvb_dmalloc(size_t bytes)
{
    void *p = NULL;
    KVB_CUDA(cudaMalloc(&p, bytes ? bytes : 16));
    return p;
}

void kvb_dfree(void *p)
{
    if (p) KVB_CUDA(cudaFree(p));
}

void *kvb_pinned_alloc(size_t bytes)
{
    void *p = NULL;
    KVB_CUDA(cudaHostAlloc(&p, bytes ? bytes : 16, cudaHostAllocMapped | cudaHostAllocPortable));
    return p;
}

void kvb_pinned_free(void *p)
{
    if (p) KVB_CUDA(cudaFreeHost(p));
}

void *kvb_pinned_try_alloc(size_t bytes)
{
    void *p = NULL;
    const cudaError_t err = cudaHostAlloc(&p, bytes ? bytes : 16, cudaHostAllocMapped | cudaHostAllocPortable);
    if (err == cudaSuccess) return p;
    (void)cudaGetLastError();
    kvb_fail(KVB_ENOMEM, "out of pinned host memory: %zu bytes (%.2f GiB) for the host pool (%s)", bytes,
             bytes / 1073741824.0, cudaGetErrorName(err));
    return NULL;
}

cudaStream_t kvb_stream_create(void)
{
    cudaStream_t s;
    KVB_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    return s;
}

void kvb_stream_destroy(cudaStream_t s)
{
    if (s) KVB_CUDA(cudaStreamDestroy(s));
}

/* ---- copies of pageable host memory through pinned staging ----
 * The driver copies pageable memory through its own staging at 6.4 GB/s to the device and 10.3 GB/s back
 * on the H200 host, against 45-51 GB/s through two pinned buffers of 64 MiB filled and emptied by the
 * OpenMP threads, one chunk crossing the bus while the threads copy the other (profiles/host_copy_probe.cu,
 * results/h200/staged-copies/run.txt). A copy of at least STAGE_MIN bytes whose host side CUDA does not
 * know as pinned takes that path, with the semantics of cudaMemcpyAsync on pageable memory: to the device
 * it returns once src has been read (its last chunks may still be in flight from the buffers, which the
 * next staged copy waits for), back once dst holds the data. Where the buffers cannot be had, the
 * driver's path. */
enum { STAGE_CHUNK = 64 << 20, STAGE_MIN = 8 << 20 };
static char *g_stage[2];
static cudaEvent_t g_stage_done[2]; /* the buffer's last copy has finished */
static int g_stage_state;           /* 0 not set up, 1 ready, -1 unavailable */

void kvb_stage_release(void)
{
    for (int k = 0; k < 2; k++) {
        if (g_stage_done[k]) {
            (void)cudaEventSynchronize(g_stage_done[k]);
            (void)cudaEventDestroy(g_stage_done[k]);
        }
        if (g_stage[k]) (void)cudaFreeHost(g_stage[k]);
        g_stage[k] = NULL, g_stage_done[k] = NULL;
    }
    (void)cudaGetLastError();
    g_stage_state = 0;
}

static int stage_ready(void)
{
    if (g_stage_state) return g_stage_state > 0;
    for (int k = 0; k < 2; k++)
        if (cudaMallocHost((void **)&g_stage[k], STAGE_CHUNK) != cudaSuccess ||
            cudaEventCreateWithFlags(&g_stage_done[k], cudaEventDisableTiming) != cudaSuccess) {
            kvb_stage_release();
            g_stage_state = -1;
            return 0;
        }
    g_stage_state = 1;
    return 1;
}

static int staged(const void *host, size_t n)
{
    if (n < STAGE_MIN) return 0;
    struct cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, host) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return a.type == cudaMemoryTypeUnregistered && stage_ready();
}

static size_t chunk_len(size_t n, size_t at) { return n - at < STAGE_CHUNK ? n - at : STAGE_CHUNK; }

void kvb_h2d(void *dst, const void *src, size_t n, cudaStream_t s)
{
    if (!staged(src, n)) {
        KVB_CUDA(cudaMemcpyAsync(dst, src, n, cudaMemcpyHostToDevice, s));
        return;
    }
    for (size_t at = 0, k = 0; at < n; at += STAGE_CHUNK, k ^= 1) {
        KVB_CUDA(cudaEventSynchronize(g_stage_done[k]));
        kvb_copy_parallel(g_stage[k], (const char *)src + at, chunk_len(n, at));
        KVB_CUDA(cudaMemcpyAsync((char *)dst + at, g_stage[k], chunk_len(n, at), cudaMemcpyHostToDevice, s));
        KVB_CUDA(cudaEventRecord(g_stage_done[k], s));
    }
}

void kvb_d2h(void *dst, const void *src, size_t n, cudaStream_t s)
{
    if (!staged(dst, n)) {
        KVB_CUDA(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, s));
        return;
    }
    /* chunk c + 1 crosses the bus into one buffer while the threads copy chunk c out of the other */
    KVB_CUDA(cudaEventSynchronize(g_stage_done[0]));
    KVB_CUDA(cudaEventSynchronize(g_stage_done[1]));
    KVB_CUDA(cudaMemcpyAsync(g_stage[0], src, chunk_len(n, 0), cudaMemcpyDeviceToHost, s));
    KVB_CUDA(cudaEventRecord(g_stage_done[0], s));
    for (size_t at = 0, k = 0; at < n; at += STAGE_CHUNK, k ^= 1) {
        const size_t next = at + STAGE_CHUNK;
        if (next < n) {
            KVB_CUDA(cudaMemcpyAsync(g_stage[k ^ 1], (const char *)src + next, chunk_len(n, next),
                                     cudaMemcpyDeviceToHost, s));
            KVB_CUDA(cudaEventRecord(g_stage_done[k ^ 1], s));
        }
        KVB_CUDA(cudaEventSynchronize(g_stage_done[k]));
        kvb_copy_parallel((char *)dst + at, g_stage[k], chunk_len(n, at));
    }
}

void kvb_d2d(void *dst, const void *src, size_t n, cudaStream_t s) { KVB_CUDA(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToDevice, s)); }
void kvb_d2d_2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t rows, cudaStream_t s)
{
    KVB_CUDA(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, rows, cudaMemcpyDeviceToDevice, s));
}
void kvb_dmemset(void *dst, int byte, size_t n, cudaStream_t s) { KVB_CUDA(cudaMemsetAsync(dst, byte, n, s)); }
void kvb_sync(cudaStream_t s) { KVB_CUDA(cudaStreamSynchronize(s)); }

struct kvb_timer {
    cudaEvent_t start, stop;
};

kvb_timer *kvb_timer_create(void)
{
    kvb_timer *t = kvb_xalloc(1, sizeof *t, "a CUDA event timer");
    if (!t) kvb_guard_fail();
    KVB_CUDA(cudaEventCreate(&t->start));
    KVB_CUDA(cudaEventCreate(&t->stop));
    return t;
}

void kvb_timer_destroy(kvb_timer *t)
{
    if (!t) return;
    KVB_CUDA(cudaEventDestroy(t->start));
    KVB_CUDA(cudaEventDestroy(t->stop));
    kvb_xfree(t);
}

void kvb_timer_start(kvb_timer *t, cudaStream_t s) { KVB_CUDA(cudaEventRecord(t->start, s)); }
void kvb_timer_stop(kvb_timer *t, cudaStream_t s) { KVB_CUDA(cudaEventRecord(t->stop, s)); }

double kvb_timer_seconds(kvb_timer *t)
{
    float ms = 0;
    KVB_CUDA(cudaEventSynchronize(t->stop));
    KVB_CUDA(cudaEventElapsedTime(&ms, t->start, t->stop));
    return ms * 1e-3;
}

static nvtxDomainHandle_t nvtx_domain(void)
{
    static nvtxDomainHandle_t d;
    if (!d) d = nvtxDomainCreateA("kvbench");
    return d;
}

void kvb_nvtx_push(const char *name)
{
    nvtxEventAttributes_t a;
    memset(&a, 0, sizeof a);
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.messageType = NVTX_MESSAGE_TYPE_ASCII;
    a.message.ascii = name;
    nvtxDomainRangePushEx(nvtx_domain(), &a);
}

void kvb_nvtx_pop(void) { nvtxDomainRangePop(nvtx_domain()); }

#else /* no CUDA toolkit: the same interface, and never a device */

int kvb_gpu_available(void)
{
    if (g_state < 0) {
        snprintf(g_reason, sizeof g_reason, "no CUDA device: built without CUDA (no nvcc at build time, or make KVB_CPU_ONLY=1)");
        fprintf(stderr, "kvbench: %s: GPU work is skipped\n", g_reason);
        g_state = 0;
    }
    return 0;
}

static void no_cuda(const char *what)
{
    fprintf(stderr, "kvbench: %s called in a build without CUDA\n", what);
    abort();
}

int kvb_gpu_info(kvb_device_info *info) { memset(info, 0, sizeof *info); return KVB_EDEVICE; }
int kvb_cuda_runtime_version(void) { return 0; }
void *kvb_dmalloc(size_t b) { (void)b; no_cuda("kvb_dmalloc"); return NULL; }
void kvb_dfree(void *p) { (void)p; }
void *kvb_pinned_alloc(size_t b) { (void)b; no_cuda("kvb_pinned_alloc"); return NULL; }
void *kvb_pinned_try_alloc(size_t b) { (void)b; no_cuda("kvb_pinned_try_alloc"); return NULL; }
void kvb_pinned_free(void *p) { (void)p; }
cudaStream_t kvb_stream_create(void) { no_cuda("kvb_stream_create"); return NULL; }
void kvb_stream_destroy(cudaStream_t s) { (void)s; }
void kvb_h2d(void *d, const void *s, size_t n, cudaStream_t st) { (void)d, (void)s, (void)n, (void)st; no_cuda("kvb_h2d"); }
void kvb_stage_release(void) {}
void kvb_d2h(void *d, const void *s, size_t n, cudaStream_t st) { (void)d, (void)s, (void)n, (void)st; no_cuda("kvb_d2h"); }
void kvb_d2d(void *d, const void *s, size_t n, cudaStream_t st) { (void)d, (void)s, (void)n, (void)st; no_cuda("kvb_d2d"); }
void kvb_d2d_2d(void *d, size_t dp, const void *s, size_t sp, size_t w, size_t n, cudaStream_t st)
{
    (void)d, (void)dp, (void)s, (void)sp, (void)w, (void)n, (void)st;
    no_cuda("kvb_d2d_2d");
}
void kvb_dmemset(void *d, int b, size_t n, cudaStream_t st) { (void)d, (void)b, (void)n, (void)st; no_cuda("kvb_dmemset"); }
void kvb_sync(cudaStream_t s) { (void)s; }
void kvb_l2_flush(cudaStream_t s) { (void)s; no_cuda("kvb_l2_flush"); }
void kvb_stream_block(cudaStream_t s) { (void)s; no_cuda("kvb_stream_block"); }
void kvb_stream_release(void) {}
kvb_timer *kvb_timer_create(void) { no_cuda("kvb_timer_create"); return NULL; }
void kvb_timer_destroy(kvb_timer *t) { (void)t; }
void kvb_timer_start(kvb_timer *t, cudaStream_t s) { (void)t, (void)s; }
void kvb_timer_stop(kvb_timer *t, cudaStream_t s) { (void)t, (void)s; }
double kvb_timer_seconds(kvb_timer *t) { (void)t; return 0; }
void kvb_copy_kernel(void *d, const void *s, size_t n, cudaStream_t st) { (void)d, (void)s, (void)n, (void)st; no_cuda("kvb_copy_kernel"); }
void kvb_read_host_kernel(void *d, const void *s, size_t n, cudaStream_t st) { (void)d, (void)s, (void)n, (void)st; no_cuda("kvb_read_host_kernel"); }
void kvb_null_kernel(cudaStream_t s) { (void)s; no_cuda("kvb_null_kernel"); }
void kvb_read_kernel(const void *src, size_t n, cudaStream_t st) { (void)src, (void)n, (void)st; no_cuda("kvb_read_kernel"); }
void kvb_nvtx_push(const char *name) { (void)name; }
void kvb_nvtx_pop(void) {}

#endif
