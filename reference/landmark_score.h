/* landmark_score.h: ShadowKV's decode-time chunk selection (kernels/landmark_score/NOTES.md), the
 * reference and the shape both implementations check.
 *
 *   q [B, Hq, D] bf16 (RoPE applied), landmarks [B, Hkv, Lm, D] bf16, landmark_idx [B, Hkv, Lm] int32
 *   (each row strictly ascending chunk ids), G = Hq / Hkv:
 *     s[b,h,l]  = softmax over l of (q[b,h] . landmarks[b,h/G,l] / sqrt(D))
 *     m[b,hk,l] = max over the G query heads h of group hk of s[b,h,l]                 fp32
 *     chunks    = landmark_idx[b,hk, topk(m[b,hk,:], M)], ascending                    [B, Hkv, M] int32
 * topk is the suite's (ref_topk: ties to the lower landmark index). landmark_idx ascending makes the
 * mapped list ascending as it comes out of the top-k, and makes "lower landmark index" and "lower
 * chunk id" the same tie rule.
 */
#ifndef REF_LANDMARK_SCORE_H
#define REF_LANDMARK_SCORE_H

#include "reference/kvb.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LMS_MAX_B 1024
#define LMS_MAX_HKV 256
#define LMS_MAX_HQ 2048
#define LMS_MAX_LM 2097152 /* the suite's top-k takes rows of up to 2^21 scores */

typedef struct lms_shape {
    int B, Hq, Hkv, D;
    int Lm; /* landmarks per (b, kv head) */
    int M;  /* chunks selected per (b, kv head) */
} lms_shape;

/* The contract's ranges: B in [1, 1024], Hkv in [1, 256], Hq in [1, 2048] a multiple of Hkv (G = Hq/Hkv
 * an integer), D >= 1, Lm in [1, 2^21], M in [1, Lm]. KVB_EINVAL naming the field, its value and the
 * range; `who` prefixes the message. */
int lms_shape_check(const lms_shape *s, const char *who);

/* Each row of landmark_idx ([B*Hkv, Lm]) strictly ascending and within [0, n_chunks). */
int lms_landmark_idx_check(const int32_t *landmark_idx, int64_t rows, int Lm, int64_t n_chunks, const char *who);

/* The reference, in double from the bf16 inputs: m rounded once to fp32, the selection ref_topk over
 * those fp32 scores. `slices`: NULL (every (b, kv head) slice) or one byte per slice, b-major: 1 =
 * compute m and chunks of that slice, 0 = leave them untouched (sampled references of large cases).
 * Refuses (KVB_EINVAL, nothing written) a shape outside lms_shape_check, n_chunks < Lm, or a
 * landmark_idx row that is not strictly ascending within [0, n_chunks). */
int ref_landmark_score(const kvb_bf16 *q, const kvb_bf16 *landmarks, const int32_t *landmark_idx, const lms_shape *s,
                       int64_t n_chunks, const uint8_t *slices, int32_t *chunks, float *m);

#ifdef __cplusplus
}
#endif
#endif
