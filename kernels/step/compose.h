/* compose.h: compositions of the suite's kernels (decode steps and their parts), in plain C over
 * the kernels' headers. FlashInfer's shape: plan on the host (validate, size workspaces, fix the stages),
 * then enqueue only. A composition is a list of stages, each enqueued on one of up to three streams (the
 * main one and two side ones); a stage may wait for an earlier stage of another stream (fork/join
 * through events). Per-stage
 * device times (events around each stage, only when asked, so the timed loop pays nothing) and an
 * NVTX range per stage named `<name>/<stage>` (the case id, in the suite's domain).
 *
 * The stages' kernels keep their own validation: kvb_step_enqueue returns the first stage's error
 * (KVB_EINVAL naming the parameter, or KVB_EDEVICE) and enqueues nothing after it.
 */
#ifndef KVB_KERNELS_COMPOSE_H
#define KVB_KERNELS_COMPOSE_H

#include <cuda_runtime_api.h>

#include "reference/kvb.h"

#ifdef __cplusplus
extern "C" {
#endif

#define KVB_STEP_MAX_STAGES 32 /* the ShadowKV block has 31 at B >= 4 */
#define KVB_STEP_STREAMS 3      /* the main stream and two side streams */
#define KVB_STAGE_NAME_MAX 30  /* a stage name's characters: the bench counter stage_us_<name> keeps 30 */

typedef int (*kvb_stage_fn)(void *ctx, cudaStream_t stream); /* enqueue the stage's work; KVB_OK or an error */

typedef struct kvb_stage {
    char name[48];
    int stream;  /* 0: the step's main stream, 1 and 2: the side streams */
    int after;   /* index of an earlier stage on another stream this one waits for, or -1 */
    kvb_stage_fn fn;
    void *ctx;
} kvb_stage;

typedef struct kvb_step {
    char name[512]; /* NVTX prefix: ranges are "<name>/<stage>" */
    int n;
    kvb_stage st[KVB_STEP_MAX_STAGES];
    cudaStream_t s[KVB_STEP_STREAMS];
    cudaEvent_t done[KVB_STEP_MAX_STAGES];  /* fork/join: recorded after a stage another waits for */
    cudaEvent_t t0[KVB_STEP_MAX_STAGES], t1[KVB_STEP_MAX_STAGES]; /* stage times, when timing */
    cudaEvent_t fork;
    int timing, needs_done[KVB_STEP_MAX_STAGES];
    cudaGraphExec_t graph; /* kvb_step_capture: the whole step as one CUDA graph */
} kvb_step;

/* Planning (host only, no device work): a step on streams s0 (main) and s1 (side; may equal s0). The
 * second side stream is s1 unless kvb_step_set_side2 names another. */
int kvb_step_init(kvb_step *p, const char *name, cudaStream_t s0, cudaStream_t s1);
/* The second side stream (stream 2 of kvb_step_add): s2, or the first side stream when NULL. */
void kvb_step_set_side2(kvb_step *p, cudaStream_t s2);
/* Add a stage on stream 0, 1 or 2; returns its index, or a negative error (too many stages, a stream
 * out of range, `after` not earlier or on the same stream). */
int kvb_step_add(kvb_step *p, const char *name, int stream, int after, kvb_stage_fn fn, void *ctx);
/* Create the events (once, after the last kvb_step_add); timing=1 also records per-stage times. */
int kvb_step_finalize(kvb_step *p, int timing);
/* Enqueue every stage: the side streams first wait for the main stream's work before the step, and
 * the main stream waits for each side stream's last stage at the end (the step is one unit on s0). */
int kvb_step_enqueue(kvb_step *p);
/* Capture the step (every stage, every stream, the fork and join) into a CUDA graph, once, after
 * kvb_step_finalize with timing=0: the stages' host checks run at capture; a replay only launches.
 * The graph holds the stages' launch parameters as they were at capture (shapes, pointers), so a
 * step whose shapes change (a longer context, more pages) is captured again. */
int kvb_step_capture(kvb_step *p);
/* Launch the captured graph on the main stream (one NVTX range "<name>/graph"). */
int kvb_step_launch_graph(kvb_step *p);
/* After the step completed: each stage's device time in milliseconds (needs timing=1). */
int kvb_step_stage_ms(kvb_step *p, double *ms);
void kvb_step_destroy(kvb_step *p);

#ifdef __cplusplus
}
#endif
#endif
