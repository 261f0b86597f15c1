/* heavy_hitters.h: token selection at the end of prefill (contract: kernels/heavy_hitters/NOTES.md).
 *
 * MiniKV heavy hitters, per head (a query head's colsum, or a KV head's colsum_kv):
 *   n_hh = floor(L * heavy); n_rw = floor(L * recent)
 *   if n_hh + n_rw >= L: keep all L tokens
 *   keep = topk(colsum[0 : L - n_rw], n_hh)  U  [L - n_rw, L)               ascending
 * with the pyramid budget schedule over m layers (depth 7): r_last = heavy / 7,
 * r_first = 2*heavy - r_last, r_l = r_first + (r_last - r_first) * l / (m - 1) used as the heavy ratio.
 *
 * SnapKV++ (RocketKV stage 1), per KV head: W = min(32, L); scores = colsum_kv over the last W rows
 * (selective_attn with w0 = L - W); pooled = max-pool of the scores along tokens with an odd kernel
 * ks, stride 1, centred, the window clipped at the sequence edges [0, L) (a decision, in
 * kernels/heavy_hitters/NOTES.md: the pooling runs over all L tokens and the top-k reads
 * pooled[0 : L - W]; SnapKV's own code pools the prefix only, which differs for the ks/2 tokens just
 * before the window);
 *   keep = topk(pooled[0 : L - W], budget - W)  U  [L - W, L)       (budget >= L: keep all)
 * ks = 63 below 48K tokens and 511 at or above (the paper's rule) unless given.
 *
 * Top-k everywhere: the k largest, ties to the lower index, the list ascending.
 * The compressed cache: K'[r, i] = K[r / group, keep[r, i]] (group = G for per-query-head selection,
 * 1 per KV head), the same for V.
 */
#ifndef REF_HEAVY_HITTERS_H
#define REF_HEAVY_HITTERS_H

#include "reference/kvb.h"
#include "reference/select.h" /* ref_topk, ref_maxpool, ref_gather_rows: the selection family */

#ifdef __cplusplus
extern "C" {
#endif

#define HH_PYRAMID_DEPTH 7
#define SNAPKV_WINDOW 32
#define SNAPKV_KS_THRESHOLD 49152 /* 48K tokens */
#define SNAPKV_MAX_KS 8191

/* n_hh, n_rw and the kept count (L when n_hh + n_rw >= L). heavy, recent in [0, 1]. */
int hh_budget(int L, double heavy, double recent, int *n_hh, int *n_rw, int *n_keep, const char *who);

/* The heavy ratio of layer `layer` of `layers` under the pyramid schedule (layers = 1: heavy).
 * Fails when heavy is outside [0, 1], the layer outside [0, layers - 1], or the schedule's ratio
 * for this layer outside [0, 1]. */
int hh_pyramid_ratio(double heavy, int layer, int layers, double *ratio, const char *who);

/* W and the kept count for a budget (budget >= W; budget >= L keeps all). */
int snapkv_budget(int L, int budget, int *W, int *n_keep, const char *who);

/* The pooling kernel: ks as given (odd, 1..SNAPKV_MAX_KS), or the paper's rule when ks == 0. */
int snapkv_pool_size(int L, int ks, int *out, const char *who);


/* keep [rows, n_keep] from scores [rows, L] (n_keep as hh_budget returns it). */
int ref_heavy_hitters(const float *scores, int rows, int L, int n_hh, int n_rw, int32_t *keep);

/* keep [rows, n_keep] from pooled [rows, L] (n_keep as snapkv_budget returns it). */
int ref_snapkv_keep(const float *pooled, int rows, int L, int W, int n_keep, int32_t *keep);


#ifdef __cplusplus
}
#endif
#endif
