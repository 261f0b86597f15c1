/* page_scoring.h: page min/max metadata, RocketKV hybrid scoring, Quest scoring (contract:
 * kernels/page_scoring/NOTES.md).
 *
 * Pages: page j holds tokens [jP, jP + P); pages start at token 0; the last page of a context of L
 * tokens may be partial. n_pages = ceil(L / P).
 *
 * Metadata layout (decided here, used by the kernels too): kmin, kmax [B, Hkv, D, cap] bf16,
 * channel-major, where cap >= ceil(L / P) is the capacity in pages of the buffer (the row stride): a
 * decode loop allocates it once for the longest context and appends into it. Entries of pages that
 * hold no token yet are +inf (kmin) and -inf (kmax), as page_meta_build writes them. cap must be a
 * multiple of 8 (16-byte rows: the kernels read 8 pages per load).
 *
 * Queries q [B, Hq, D] bf16; GQA: query head h reads KV head h / G, G = Hq / Hkv.
 *
 * The layout and its checks live here, in the reference, because they are the contract; the CUDA API
 * (kernels/page_scoring/page_scoring.h) runs the same checks before it launches anything.
 */
#ifndef REF_PAGE_SCORING_H
#define REF_PAGE_SCORING_H

#include <stdint.h>

#include "reference/kvb.h"

#ifdef __cplusplus
extern "C" {
#endif

#define PAGE_MAX_B 1024
#define PAGE_MAX_HKV 256
#define PAGE_MAX_G 8            /* query heads per KV head: the scoring kernels give each one a warp of 8 */
#define PAGE_MAX_D 256          /* channels: a multiple of 8 in [8, 256] */
#define PAGE_MAX_P 4096         /* tokens per page */
#define PAGE_MAX_L (1 << 24)    /* tokens per sequence */
#define PAGE_MAX_PAGES 2097152  /* pages per sequence: the suite's top-k handles rows of up to 2M */

/* The entries of empty pages: kmin +inf, kmax -inf (bf16 bits). */
#define BF16_POS_INF ((kvb_bf16)0x7F80)
#define BF16_NEG_INF ((kvb_bf16)0xFF80)

typedef struct page_layout {
    int B, Hq, Hkv, D;
    int L;   /* tokens in the cache (scoring, build); for append: the cache capacity in tokens */
    int P;   /* tokens per page */
    int cap; /* pages per metadata row (row stride), >= ceil(L / P), a multiple of 8 */
} page_layout;

static inline int page_count(int L, int P) { return (int)(((int64_t)L + P - 1) / P); }
/* the default capacity: ceil(L / P) rounded up to a multiple of 64, so that every bf16 row starts on a
 * 128-byte line (the scoring kernels' row copies then touch no line more than their bytes need) */
static inline int page_cap_default(int L, int P) { return (page_count(L, P) + 63) / 64 * 64; }
/* tokens of page j (the last one may be partial) */
static inline int page_tokens(const page_layout *s, int j)
{
    const int64_t left = (int64_t)s->L - (int64_t)j * s->P;
    return left < s->P ? (int)left : s->P;
}

/* Every field against its range: B in [1, 1024]; Hkv in [1, 256]; Hq a multiple of Hkv with G = Hq/Hkv
 * in [1, 8]; D a multiple of 8 in [8, 256]; L in [1, 2^24]; P in [1, 4096]; ceil(L/P) at most 2^21;
 * cap >= ceil(L/P) and a multiple of 8. Messages name the field, its value and the range, prefixed
 * with `who`. */
int page_layout_check(const page_layout *s, const char *who);

/* ---- metadata ---- */

/* kmin, kmax [B, Hkv, D, cap] from K [B, Hkv, L, D] (token-major): extrema over the valid tokens of each
 * page (m = v < m ? v : m in token order, so the result is a bf16 value of the page, bit for bit);
 * entries of pages >= ceil(L/P) are +inf / -inf. */
int ref_page_meta_build(const kvb_bf16 *K, const page_layout *s, kvb_bf16 *kmin, kvb_bf16 *kmax);

/* Append k [B, Hkv, D] at position t[b] of sequence b: page j = t[b] / P; when t[b] % P == 0 the entry
 * becomes k (whatever it held), else element-wise min / max with k. t[b] in [0, L) (L: the capacity in
 * tokens; the page must lie inside cap). kmin, kmax are updated in place. */
int ref_page_meta_append(const kvb_bf16 *k, const int32_t *t, const page_layout *s, kvb_bf16 *kmin, kvb_bf16 *kmax);

/* Each t[b] in [0, L) and its page below cap. */
int page_positions_check(const page_layout *s, const int32_t *t, const char *who);

/* ---- RocketKV hybrid scoring ---- */

/* r in [1, D]; k (tokens to attend) in [1, L]. */
int hybrid_params_check(const page_layout *s, int r, int k, const char *who);

/* Pages selected per KV head: ceil(k / P). */
static inline int hybrid_selected_pages(int k, int P) { return (int)(((int64_t)k + P - 1) / P); }

/* Per KV head and its G query heads:
 *   a[c] = sum_h |q[h][c]| (double, h ascending, rounded once to fp32: the channel scores)
 *   I = the r largest a (ties to the lower channel; ref_topk), ascending -> channels [B, Hkv, r] (or NULL)
 *   sg[c] = sum_h q[h][c] (double, h ascending); E[c][j] = sg[c] > 0 ? kmax[c][j] : kmin[c][j]
 *   tau_h = sqrt(D * sum_{c in I} |q[h][c]| / sum_c |q[h][c]|)
 *   z[h][j] = sum_{c in I} q[h][c] E[c][j] / tau_h   (tau_h = 0, i.e. q[h] is 0 on every channel of I:
 *             z[h][j] = 0 for every page, where the formula reads 0/0: such a head weighs all tokens alike)
 *   lse_h = log sum_j n_j exp(z[h][j]);  u[j] = sum_h exp(z[h][j] - lse_h)   -> u [B, Hkv, ceil(L/P)] fp32
 *   pages = the ceil(k/P) largest u (ties to the lower page), ascending -> pages [B, Hkv, ceil(k/P)] int32
 * Double throughout, u rounded once to fp32; the page selection ranks the fp32 u (what a kernel outputs). */
int ref_hybrid_score(const kvb_bf16 *q, const kvb_bf16 *kmin, const kvb_bf16 *kmax, const page_layout *s, int r, int k,
                     float *u, int32_t *pages, int32_t *channels);

/* ---- Quest ---- */

/* budget (tokens) in [P, L]: budget / P pages are attended, one of them the last. */
int quest_params_check(const page_layout *s, int budget, const char *who);

/* Pages listed per KV head: budget / P (budget / P - 1 chosen, then the last page). */
static inline int quest_selected_pages(int budget, int P) { return budget / P; }

/* o[h][j] = sum_c max(q[h][c] kmax[c][j], q[h][c] kmin[c][j]) (double); scores[b, kvh, j] = max over the G
 * query heads of the KV head of o[h][j], rounded once to fp32, for every page j < ceil(L/P) (the last
 * page's score is written too; the selection does not use it). pages [B, Hkv, budget/P]: the budget/P - 1
 * largest scores among pages 0 .. ceil(L/P) - 2 (ties to the lower page, ascending), then the last page. */
int ref_quest_score(const kvb_bf16 *q, const kvb_bf16 *kmin, const kvb_bf16 *kmax, const page_layout *s, int budget,
                    float *scores, int32_t *pages);

/* ---- RocketKV budget knobs ---- */

typedef struct rocketkv_knobs {
    double c, alpha, c2; /* compression ratio, SnapKV++ exponent, the ratio left for hybrid attention */
    int C;               /* tokens SnapKV++ keeps: floor(Lmax / c^alpha) */
    int prompt;          /* its prompt budget C - M */
    int P, r, k;         /* page size, channels, tokens attended (T / 2) */
} rocketkv_knobs;

/* From a token budget T (a traffic budget: K of T tokens for scoring, K+V of T/2 for attention), prompt
 * length Lmax, head dim D and M tokens to generate (kernels/page_scoring/NOTES.md, hybrid_score):
 *   c = max(1, Lmax/T), alpha = min(0.2 + 0.06 log2 c, 0.8), C = floor(Lmax / c^alpha),
 *   c2 = max(1, C/T), P = min(floor(c2), ceil(sqrt(c2))), r = clamp(round(D P / c2), 1, D), k = T/2.
 * T in [2, 2^24] (k >= 1), Lmax in [1, 2^24], D in [1, 1024], M in [0, C]. round() is half away from
 * zero (no half occurs at the table's rows). RocketKV's knob table (Lmax = 32K, M = 50) is reproduced
 * with 32K = 32768: C = 1618, P = 3, r = 61 at T = 256; C = 9674, P = 3, r = 81 at T = 2048; P = 2, r = 71 at
 * T = 4096 (tests/test_ref_page_scoring.c). Read as 32000 the formulas give other values (C = 1619 at
 * T = 256; C = 9601 and r = 82 at T = 2048), so the table's 32K is 32768. */
int rocketkv_budget(int T, int Lmax, int D, int M, rocketkv_knobs *out);

#ifdef __cplusplus
}
#endif
#endif
