/* landmark_score.h: CUDA API of ShadowKV's decode-time chunk selection (the contract:
 * kernels/landmark_score/NOTES.md; the formula, the shape and its checks in reference/landmark_score.h).
 *
 * Two implementations of the same three steps (scores m, the suite's top-k, the map of the selected
 * landmarks to chunk ids), each planned on the host (shape checks, workspace size) and then only
 * enqueued:
 *   landmark_score          impl=kernel: one kernel reads each KV head's landmarks once for the G
 *                           query heads of its group (mma.sync), in independent blocks, and writes the
 *                           logits and per-block softmax partials to the workspace; a second combines
 *                           the partials per row and writes m; then topk_rows (select.h) and the map;
 *   landmark_score_cublas   ShadowKV's structure, the peer: cuBLAS strided batched GEMM (bf16 in, fp32
 *                           logits out), a softmax kernel, a max-over-the-group kernel, topk_rows, the map.
 * The chunk ids come out ascending because topk_rows lists the selected landmarks ascending and
 * landmark_idx is ascending: the caller guarantees that (the device data is not checked; the harness
 * checks its inputs, lms_landmark_idx_check).
 */
#ifndef KVB_KERNELS_LANDMARK_SCORE_H
#define KVB_KERNELS_LANDMARK_SCORE_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#include "reference/landmark_score.h"
#include "kernels/step/compose.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LMS_CUDA_MAX_G 8 /* query heads per KV head: the 8 columns of one MMA */

/* Device buffers of one call. m is an output too: the scores the top-k selected from. */
typedef struct lms_args {
    const kvb_bf16 *q;            /* [B, Hq, D] */
    const kvb_bf16 *landmarks;    /* [B, Hkv, Lm, D] */
    const int32_t *landmark_idx;  /* [B, Hkv, Lm], each row strictly ascending */
    int32_t *chunks;              /* [B, Hkv, M] out: selected chunk ids, ascending */
    float *m;                     /* [B, Hkv, Lm] out: the scores */
    void *workspace;              /* device memory, *_workspace_bytes of it, 16-byte aligned; contents need no setup */
    size_t workspace_bytes;
} lms_args;

/* The shapes the CUDA paths run: lms_shape_check, and D in {64, 128}, G = Hq/Hkv in [1, 8]. */
int landmark_score_check(const lms_shape *s, const char *who);

int landmark_score_workspace_bytes(const lms_shape *s, size_t *bytes);
int landmark_score(const lms_shape *s, const lms_args *a, cudaStream_t stream);

/* `cublas_handle`: a cublasHandle_t; it is bound to `stream` by the call. */
int landmark_score_cublas_workspace_bytes(const lms_shape *s, size_t *bytes);
int landmark_score_cublas(void *cublas_handle, const lms_shape *s, const lms_args *a, cudaStream_t stream);

/* Either implementation as a composition (compose.h) whose stages are the calls the functions above
 * enqueue, for per-stage device times and NVTX ranges "<name>/<stage>": LMS_FUSED (impl=kernel): scores,
 * normalize, topk, map; cublas: gemm, softmax, group_max, topk, map. Checks everything the direct call
 * checks, once. */
typedef enum { LMS_FUSED = 0, LMS_CUBLAS = 1 } lms_impl;

typedef struct landmark_score_plan {
    lms_impl impl;
    lms_shape s;
    lms_args a;
    void *cublas;
    kvb_step step;
} landmark_score_plan;

int landmark_score_plan_make(landmark_score_plan *p, const char *name, lms_impl impl, void *cublas_handle,
                             const lms_shape *s, const lms_args *a, cudaStream_t stream, int timing);
int landmark_score_plan_enqueue(landmark_score_plan *p);
void landmark_score_plan_destroy(landmark_score_plan *p);

#ifdef __cplusplus
}
#endif
#endif
