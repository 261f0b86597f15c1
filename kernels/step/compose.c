/* compose.c: see compose.h. */
#include "kernels/step/compose.h"

#include <stdio.h>
#include <string.h>

#include <nvtx3/nvToolsExt.h>

#define TRY(call)                                                                                         \
    do {                                                                                                  \
        cudaError_t e_ = (call);                                                                          \
        if (e_ != cudaSuccess)                                                                            \
            return kvb_fail(KVB_EDEVICE, "%s failed: %s (%s:%d)", #call, cudaGetErrorString(e_), __FILE__, \
                            __LINE__);                                                                    \
    } while (0)

int kvb_step_init(kvb_step *p, const char *name, cudaStream_t s0, cudaStream_t s1)
{
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    p->s[0] = s0;
    p->s[1] = s1 ? s1 : s0;
    p->s[2] = p->s[1];
    return KVB_OK;
}

void kvb_step_set_side2(kvb_step *p, cudaStream_t s2) { p->s[2] = s2 ? s2 : p->s[1]; }

/* Whether a stage runs on stream s (a side stream may serve both side indices). */
static int stream_used(const kvb_step *p, cudaStream_t s)
{
    for (int i = 0; i < p->n; i++)
        if (p->s[p->st[i].stream] == s) return 1;
    return 0;
}

/* The last stage on stream index k, or -1. */
static int last_on(const kvb_step *p, int k)
{
    int last = -1;
    for (int i = 0; i < p->n; i++)
        if (p->st[i].stream == k) last = i;
    return last;
}

int kvb_step_add(kvb_step *p, const char *name, int stream, int after, kvb_stage_fn fn, void *ctx)
{
    if (p->n >= KVB_STEP_MAX_STAGES)
        return -kvb_fail(KVB_EINVAL, "%s: stage %s: more than %d stages", p->name, name, KVB_STEP_MAX_STAGES);
    if (strlen(name) > KVB_STAGE_NAME_MAX)
        return -kvb_fail(KVB_EINVAL, "%s: stage %s: name of %zu characters, at most %d", p->name, name, strlen(name),
                         KVB_STAGE_NAME_MAX);
    if (stream < 0 || stream >= KVB_STEP_STREAMS)
        return -kvb_fail(KVB_EINVAL, "%s: stage %s: stream=%d out of range [0, %d]", p->name, name, stream,
                         KVB_STEP_STREAMS - 1);
    if (after >= p->n || (after >= 0 && p->st[after].stream == stream))
        return -kvb_fail(KVB_EINVAL, "%s: stage %s: after=%d must be an earlier stage on another stream", p->name,
                         name, after);
    kvb_stage *s = &p->st[p->n];
    snprintf(s->name, sizeof s->name, "%s", name);
    s->stream = stream;
    s->after = after;
    s->fn = fn;
    s->ctx = ctx;
    if (after >= 0) p->needs_done[after] = 1;
    return p->n++;
}

int kvb_step_finalize(kvb_step *p, int timing)
{
    p->timing = timing;
    TRY(cudaEventCreateWithFlags(&p->fork, cudaEventDisableTiming));
    /* the last stage of each side stream is joined into the main stream at the end */
    for (int k = 1; k < KVB_STEP_STREAMS; k++)
        if (last_on(p, k) >= 0) p->needs_done[last_on(p, k)] = 1;
    for (int i = 0; i < p->n; i++) {
        if (p->needs_done[i]) TRY(cudaEventCreateWithFlags(&p->done[i], cudaEventDisableTiming));
        if (timing) {
            TRY(cudaEventCreate(&p->t0[i]));
            TRY(cudaEventCreate(&p->t1[i]));
        }
    }
    return KVB_OK;
}

static nvtxDomainHandle_t domain(void)
{
    static nvtxDomainHandle_t d;
    if (!d) d = nvtxDomainCreateA("kvbench");
    return d;
}

static void range_push(const char *step, const char *stage)
{
    char name[600];
    snprintf(name, sizeof name, "%s/%s", step, stage);
    nvtxEventAttributes_t a;
    memset(&a, 0, sizeof a);
    a.version = NVTX_VERSION;
    a.size = NVTX_EVENT_ATTRIB_STRUCT_SIZE;
    a.messageType = NVTX_MESSAGE_TYPE_ASCII;
    a.message.ascii = name;
    nvtxDomainRangePushEx(domain(), &a);
}

int kvb_step_enqueue(kvb_step *p)
{
    /* the side streams start after what the main stream had before the step */
    const int two = p->s[1] != p->s[0] || p->s[2] != p->s[0];
    if (two) TRY(cudaEventRecord(p->fork, p->s[0]));
    for (int k = 1; k < KVB_STEP_STREAMS; k++) /* each side stream a stage uses, once (a capture joins them all) */
        if (p->s[k] != p->s[0] && !(k == 2 && p->s[2] == p->s[1]) && stream_used(p, p->s[k]))
            TRY(cudaStreamWaitEvent(p->s[k], p->fork, 0));
    for (int i = 0; i < p->n; i++) {
        kvb_stage *s = &p->st[i];
        cudaStream_t st = p->s[s->stream];
        if (s->after >= 0 && st != p->s[p->st[s->after].stream]) TRY(cudaStreamWaitEvent(st, p->done[s->after], 0));
        range_push(p->name, s->name);
        if (p->timing) TRY(cudaEventRecord(p->t0[i], st));
        int rc = s->fn(s->ctx, st);
        if (p->timing) TRY(cudaEventRecord(p->t1[i], st));
        nvtxDomainRangePop(domain());
        if (rc) return rc;
        if (p->needs_done[i] && two) TRY(cudaEventRecord(p->done[i], st));
    }
    for (int k = 1; k < KVB_STEP_STREAMS; k++) {
        const int last = last_on(p, k);
        if (last >= 0 && p->s[k] != p->s[0]) TRY(cudaStreamWaitEvent(p->s[0], p->done[last], 0));
    }
    return KVB_OK;
}

int kvb_step_capture(kvb_step *p)
{
    if (p->timing) return kvb_fail(KVB_EINVAL, "%s: a captured step records no stage times (timing=1)", p->name);
    if (p->graph) return KVB_OK;
    TRY(cudaStreamBeginCapture(p->s[0], cudaStreamCaptureModeThreadLocal));
    int rc = kvb_step_enqueue(p);
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(p->s[0], &g); /* ends the capture also after a failed stage */
    if (rc) {
        if (g) cudaGraphDestroy(g);
        return rc;
    }
    if (e != cudaSuccess)
        return kvb_fail(KVB_EDEVICE, "%s: cudaStreamEndCapture failed: %s (a stage made a call a graph cannot hold)",
                        p->name, cudaGetErrorString(e));
    /* the kernel nodes run at the priorities of the streams they were captured from (a side stream of the
     * greatest priority, block_attention.side_first), not all at the launch stream's */
    e = cudaGraphInstantiateWithFlags(&p->graph, g, cudaGraphInstantiateFlagUseNodePriority);
    cudaGraphDestroy(g);
    if (e != cudaSuccess) {
        p->graph = NULL;
        return kvb_fail(KVB_EDEVICE, "%s: cudaGraphInstantiate failed: %s", p->name, cudaGetErrorString(e));
    }
    return KVB_OK;
}

int kvb_step_launch_graph(kvb_step *p)
{
    if (!p->graph) return kvb_fail(KVB_EINVAL, "%s: no captured graph (kvb_step_capture first)", p->name);
    range_push(p->name, "graph");
    cudaError_t e = cudaGraphLaunch(p->graph, p->s[0]);
    nvtxDomainRangePop(domain());
    if (e != cudaSuccess)
        return kvb_fail(KVB_EDEVICE, "%s: cudaGraphLaunch failed: %s", p->name, cudaGetErrorString(e));
    return KVB_OK;
}

int kvb_step_stage_ms(kvb_step *p, double *ms)
{
    if (!p->timing) return kvb_fail(KVB_EINVAL, "%s: stage times need kvb_step_finalize(timing=1)", p->name);
    for (int i = 0; i < p->n; i++) {
        float t = 0;
        TRY(cudaEventSynchronize(p->t1[i]));
        TRY(cudaEventElapsedTime(&t, p->t0[i], p->t1[i]));
        ms[i] = t;
    }
    return KVB_OK;
}

void kvb_step_destroy(kvb_step *p)
{
    if (p->graph) cudaGraphExecDestroy(p->graph);
    if (p->fork) cudaEventDestroy(p->fork);
    for (int i = 0; i < p->n; i++) {
        if (p->done[i]) cudaEventDestroy(p->done[i]);
        if (p->t0[i]) cudaEventDestroy(p->t0[i]);
        if (p->t1[i]) cudaEventDestroy(p->t1[i]);
    }
    memset(p, 0, sizeof *p);
}
