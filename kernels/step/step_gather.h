/* step_gather.h: ShadowKV's fetch step as a composition (compose.h): index_scan, then the value fetch
 * (gather_copy: hits moved in device memory, misses read from pinned host memory, PCIe-bound) on the
 * main stream beside the key compaction (gather_copy_d2d) on the side stream, joined at the end. The
 * plan is made once on the host; each step only enqueues. */
#ifndef KVB_KERNELS_STEP_GATHER_H
#define KVB_KERNELS_STEP_GATHER_H

#include "kernels/step/compose.h"
#include "kernels/gather_copy/gather_copy.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct gather_step_plan {
    gather_layout g;
    int32_t *cached_ids;
    const int32_t *new_ids;
    int32_t *offsets, *cnts;
    const kvb_bf16 *Vh;
    kvb_bf16 *Vbuf, *Kbuf;
    void *ws_v, *ws_k; /* gather_copy_workspace_bytes(g) each, zeroed once */
    kvb_step step;
} gather_step_plan;

/* Validates the layout (nothing is launched on a bad one) and plans the three stages. name: the NVTX
 * prefix (the case id). timing: record per-stage device times (kvb_step_stage_ms). */
int gather_step_plan_make(gather_step_plan *p, const char *name, const gather_layout *g, int32_t *cached_ids,
                          const int32_t *new_ids, int32_t *offsets, int32_t *cnts, const kvb_bf16 *Vh, kvb_bf16 *Vbuf,
                          kvb_bf16 *Kbuf, void *ws_v, void *ws_k, cudaStream_t s0, cudaStream_t s1, int timing);
int gather_step_enqueue(gather_step_plan *p);
void gather_step_plan_destroy(gather_step_plan *p);

#ifdef __cplusplus
}
#endif
#endif
