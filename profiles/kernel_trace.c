/* kernel_trace.c: a timeline of every kernel, copy and memset on the device, for machines without Nsight
 * Systems (the lent GPU machines have none). The CUDA driver loads it at initialization through
 * CUDA_INJECTION64_PATH; CUPTI's activity API records each kernel's start and end on the GPU (concurrent
 * kernels stay concurrent, CUDA graph nodes included), and the times of cuProfilerStart and cuProfilerStop,
 * between which `kvbench profile CASE` runs exactly one launch. Written as CSV lines to $KERNEL_TRACE_OUT
 * (default kernel_trace.csv), timestamps in ns on CUPTI's clock:
 *   profiler_start,T / profiler_stop,T
 *   kernel,START,END,STREAM,BLOCKS,THREADS,NAME
 *   memcpy,START,END,STREAM,BYTES,KIND / memset,START,END,STREAM,BYTES,0
 * profiles/kernel_trace.py prints the window between the two profiler marks per stream. CUPTI's tracing
 * adds a little time to each kernel launch; read the timeline's shape, time the case with `kvbench bench`.
 * Build (here, no GPU needed):
 *   cc -O2 -shared -fPIC -I/usr/local/cuda/include -o kernel_trace.so profiles/kernel_trace.c \
 *      -L/usr/local/cuda/lib64 -lcupti
 * Run on the GPU machine:
 *   CUDA_INJECTION64_PATH=$PWD/kernel_trace.so KERNEL_TRACE_OUT=trace.csv bin/kvbench profile "CASE" */
#include <cupti.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

enum { TRACE_BUFFER_BYTES = 8 << 20 };

static FILE *trace_out;

#define CUPTI_OR_SAY(call)                                                                                     \
    do {                                                                                                       \
        CUptiResult r_ = (call);                                                                               \
        if (r_ != CUPTI_SUCCESS) {                                                                             \
            const char *s_ = "?";                                                                              \
            cuptiGetResultString(r_, &s_);                                                                     \
            fprintf(stderr, "kernel_trace: %s: %s\n", #call, s_);                                             \
        }                                                                                                      \
    } while (0)

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records)
{
    *buffer = aligned_alloc(8, TRACE_BUFFER_BYTES);
    *size = *buffer ? TRACE_BUFFER_BYTES : 0;
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream_id, uint8_t *buffer, size_t size, size_t valid)
{
    (void)ctx, (void)stream_id, (void)size;
    CUpti_Activity *rec = NULL;
    while (cuptiActivityGetNextRecord(buffer, valid, &rec) == CUPTI_SUCCESS) {
        if (rec->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || rec->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
            const CUpti_ActivityKernel10 *k = (const CUpti_ActivityKernel10 *)rec;
            fprintf(trace_out, "kernel,%llu,%llu,%u,%lld,%d,%s\n", (unsigned long long)k->start,
                    (unsigned long long)k->end, k->streamId, (long long)k->gridX * k->gridY * k->gridZ,
                    k->blockX * k->blockY * k->blockZ, k->name);
        } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            const CUpti_ActivityMemcpy6 *m = (const CUpti_ActivityMemcpy6 *)rec;
            fprintf(trace_out, "memcpy,%llu,%llu,%u,%llu,%u\n", (unsigned long long)m->start,
                    (unsigned long long)m->end, m->streamId, (unsigned long long)m->bytes, m->copyKind);
        } else if (rec->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
            const CUpti_ActivityMemset4 *m = (const CUpti_ActivityMemset4 *)rec;
            fprintf(trace_out, "memset,%llu,%llu,%u,%llu,0\n", (unsigned long long)m->start,
                    (unsigned long long)m->end, m->streamId, (unsigned long long)m->bytes);
        }
    }
    size_t dropped = 0;
    if (cuptiActivityGetNumDroppedRecords(ctx, stream_id, &dropped) == CUPTI_SUCCESS && dropped)
        fprintf(trace_out, "dropped,%zu\n", dropped);
    free(buffer);
}

/* The profiler marks, at the exit of the driver's calls. */
static void CUPTIAPI on_driver_call(void *userdata, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                                    const void *data)
{
    (void)userdata;
    const CUpti_CallbackData *d = (const CUpti_CallbackData *)data;
    if (domain != CUPTI_CB_DOMAIN_DRIVER_API || d->callbackSite != CUPTI_API_EXIT) return;
    uint64_t t = 0;
    cuptiGetTimestamp(&t);
    fprintf(trace_out, "%s,%llu\n", cbid == CUPTI_DRIVER_TRACE_CBID_cuProfilerStart ? "profiler_start" : "profiler_stop",
            (unsigned long long)t);
}

static void flush_at_exit(void)
{
    cuptiActivityFlushAll(1);
    fclose(trace_out);
}

int InitializeInjection(void)
{
    const char *path = getenv("KERNEL_TRACE_OUT");
    trace_out = fopen(path ? path : "kernel_trace.csv", "w");
    if (!trace_out) {
        perror("kernel_trace: KERNEL_TRACE_OUT");
        return 0;
    }
    CUPTI_OR_SAY(cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed));
    CUPTI_OR_SAY(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL));
    CUPTI_OR_SAY(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY));
    CUPTI_OR_SAY(cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET));
    CUpti_SubscriberHandle subscriber;
    CUPTI_OR_SAY(cuptiSubscribe(&subscriber, on_driver_call, NULL));
    CUPTI_OR_SAY(cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuProfilerStart));
    CUPTI_OR_SAY(cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_DRIVER_API, CUPTI_DRIVER_TRACE_CBID_cuProfilerStop));
    atexit(flush_at_exit);
    return 1;
}
