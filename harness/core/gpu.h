/* gpu.h: the harness's device layer. Every CUDA call is checked: a failure names the call, the
 * file and the line. Inside a case guard (below) it fails that case and the run goes on; outside
 * one it exits.
 * A machine without a usable device is reported once, and GPU work is skipped, not failed.
 * Builds without the CUDA toolkit (KVB_HAVE_CUDA=0) keep the same interface; no device is found.
 */
#ifndef KVB_GPU_H
#define KVB_GPU_H

#include <stddef.h>
#include <stdint.h>

#ifndef KVB_HAVE_CUDA
#define KVB_HAVE_CUDA 0
#endif

#if KVB_HAVE_CUDA
#include <cuda_runtime_api.h>
void kvb_cuda_fatal(int err, const char *what, const char *file, int line);
#define KVB_CUDA(call)                                                                     \
    do {                                                                                   \
        cudaError_t kvb_e_ = (call);                                                       \
        if (kvb_e_ != cudaSuccess) kvb_cuda_fatal((int)kvb_e_, #call, __FILE__, __LINE__); \
    } while (0)
/* after a launch: catches bad configurations at once */
#define KVB_CUDA_LAUNCHED() KVB_CUDA(cudaGetLastError())
#else
typedef struct CUstream_st *cudaStream_t;
#endif

/* Case guard: a failed CUDA call or host allocation inside the harness while a guard is active jumps
 * back to the guard's setjmp with kvb_last_error() naming what failed, so one case fails by name and
 * the run (and its JSON) goes on. Use as
 *     jmp_buf jb;
 *     if (setjmp(*kvb_guard_enter(&jb))) { kvb_guard_leave(); ...the case failed... }
 *     ...work...
 *     kvb_guard_leave();
 * After such a failure kvb_device_broken() says whether the CUDA context is still usable (a sticky
 * error, such as an illegal address, poisons every later call). */
#include <setjmp.h>
jmp_buf *kvb_guard_enter(jmp_buf *jb);
void kvb_guard_leave(void);
void kvb_guard_fail(void) __attribute__((noreturn)); /* jump to the active guard, or exit(1) */
int kvb_device_broken(void);                         /* non-zero after a sticky CUDA error */
const char *kvb_device_broken_reason(void);

/* Device detection: 1 when a device is usable. The first call prints why not, once: no NVIDIA driver
 * (libcuda.so.1 cannot be loaded), a driver older than the CUDA runtime of this build, no device, a
 * device older than sm_90, or a build without CUDA. */
int kvb_gpu_available(void);
const char *kvb_gpu_unavailable_reason(void);
/* The CUDA runtime version of this build (12080 for 12.8), 0 in a build without CUDA. No device needed. */
int kvb_cuda_runtime_version(void);

typedef struct kvb_device_info {
    char name[256];
    int sm_count, cc_major, cc_minor;
    size_t l2_bytes, mem_bytes;
    int runtime_version, driver_version;
    char driver[64];  /* driver release, from nvidia-smi when available */
    char clocks[128]; /* current and max SM / memory clocks, from nvidia-smi when available */
} kvb_device_info;
int kvb_gpu_info(kvb_device_info *info);

void *kvb_dmalloc(size_t bytes);
void kvb_dfree(void *p);
void *kvb_pinned_alloc(size_t bytes); /* mapped, portable pinned host memory */
/* The same, NULL after kvb_fail(KVB_ENOMEM, ...) naming the size when it cannot be had (no case guard
 * jump): for a caller with a fallback (the host pool). */
void *kvb_pinned_try_alloc(size_t bytes);
void kvb_pinned_free(void *p);

cudaStream_t kvb_stream_create(void);
void kvb_stream_destroy(cudaStream_t s);
/* Host <-> device copies; those of at least 8 MiB of pageable memory go through two pinned 64 MiB buffers
 * (gpu.c says why), with cudaMemcpyAsync's pageable semantics: to the device, returns once src has been
 * read; back, once dst holds the data. kvb_stage_release frees the buffers (a later copy sets them up). */
void kvb_h2d(void *dst, const void *src, size_t bytes, cudaStream_t s);
void kvb_d2h(void *dst, const void *src, size_t bytes, cudaStream_t s);
void kvb_stage_release(void);
void kvb_d2d(void *dst, const void *src, size_t bytes, cudaStream_t s);
/* rows of width bytes, dst and src rows pitch bytes apart (a strided copy between device buffers) */
void kvb_d2d_2d(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width, size_t rows, cudaStream_t s);
void kvb_dmemset(void *dst, int byte, size_t bytes, cudaStream_t s);
void kvb_sync(cudaStream_t s);

/* ---- timing (gpu_util.cu) ---- */
/* Evict L2: read a buffer twice the L2 size (L2 is left holding clean lines). */
void kvb_l2_flush(cudaStream_t s);
/* Hold a stream behind a spinning kernel so that what is enqueued next (start event, work, stop
 * event) runs back to back, without the host's launch latency inside the timed region (nvbench's
 * blocking kernel). kvb_stream_release() lets it go; the kernel gives up by itself after a timeout. */
void kvb_stream_block(cudaStream_t s);
void kvb_stream_release(void);

typedef struct kvb_timer kvb_timer;
kvb_timer *kvb_timer_create(void);
void kvb_timer_destroy(kvb_timer *t);
void kvb_timer_start(kvb_timer *t, cudaStream_t s);
void kvb_timer_stop(kvb_timer *t, cudaStream_t s);
double kvb_timer_seconds(kvb_timer *t); /* waits for the stop event */

/* Simple device kernels the ceilings use (gpu_util.cu). */
void kvb_null_kernel(cudaStream_t s); /* an empty launch: the timing floor */
void kvb_copy_kernel(void *dst, const void *src, size_t bytes, cudaStream_t s);   /* 16-byte loads */
void kvb_read_host_kernel(void *dst, const void *src_pinned, size_t bytes, cudaStream_t s); /* zero-copy */
void kvb_read_kernel(const void *src, size_t bytes, cudaStream_t s); /* streams and reduces: reads only */

/* NVTX v3 ranges in the suite's own domain "kvbench". */
void kvb_nvtx_push(const char *name);
void kvb_nvtx_pop(void);

#endif
