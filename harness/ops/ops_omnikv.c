/* ops_omnikv.c: OmniKV's filter-layer token selector in the harness (contract and budget:
 * kernels/omnikv/NOTES.md; definition: reference/omnikv.h).
 *
 * Kernel: omnikv_select. Implementation (impl=): kernel, the suite's CUDA kernel (max-over-heads
 * scores on the tensor cores, then topk_rows).
 *
 * Inputs: q [B, Hq, D], K [B, Hkv, L, D] seeded normal bf16, the whole allocated cache random (a read
 * past a prompt's length changes the scores). dist=ties: each KV head's token rows repeat with period
 * 13 (K[t] = K[t mod 13]), so every score is tied with those of the same residue, bit for bit, and the
 * lower-index rule decides the selection. Lengths: len (0 = L) for every sequence, or with vary=1 for
 * sequence 0 only while the others draw seeded lengths in [k, len] (every prompt keeps k tokens to
 * choose from).
 *
 * Comparison: scores per element within rtol x mag, mag = max over the heads of sum_c |q_c K_c| / sqrt(D)
 * (the reference's magnitude of the terms; -inf past len[b] must match exactly). The op's rtol 1e-4
 * is ~6x the worst case of D fp32 additions each off by one ulp (D * 2^-23 = 1.5e-5 at D = 128).
 * idx: tie-tolerant index sets against the reference scores, with twice that bound of one score's
 * error as the tolerance; on every row (also those a sampled reference skips) strictly ascending
 * and below len[b], and the scores past len[b] are -inf (out_check).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reference/omnikv.h"
#include "harness/core/ceilings.h"
#include "harness/core/op.h"
#include "harness/ops/ops.h"
#if KVB_HAVE_CUDA
#include "kernels/omnikv/omnikv.h"
#endif

#define NPARAMS(a) ((int)(sizeof(a) / sizeof((a)[0])))
#define TIES_PERIOD 13

static const kvb_param omnikv_params[] = {
    {"B", KVB_P_INT, 1, 1, OMNIKV_MAX_B, NULL, "batch"},
    {"Hq", KVB_P_INT, 32, 1, 2048, NULL, "query heads"},
    {"Hkv", KVB_P_INT, 8, 1, OMNIKV_MAX_HKV, NULL, "KV heads (G = Hq/Hkv in [1, 8])"},
    {"D", KVB_P_INT, 128, 1, 1024, "64|128", "head dimension"},
    {"L", KVB_P_INT, 32768, 1, OMNIKV_MAX_L, NULL, "allocated tokens per sequence"},
    {"len", KVB_P_INT, 0, 0, OMNIKV_MAX_L, NULL, "prompt tokens of the longest sequence (0: L)"},
    {"vary", KVB_P_INT, 0, 0, 1, NULL, "1: sequences 1..B-1 get seeded lengths in [k, len]"},
    {"k", KVB_P_INT, 2048, 1, OMNIKV_MAX_L, NULL, "tokens selected (OmniKV's budget: 2048)"},
    {"dist", KVB_P_ENUM, 0, 0, 0, "normal|ties", "K: normal, or ties (token rows repeat with period 13)"},
    {"seed", KVB_P_INT, 1, 0, 1e15, NULL, "input seed"},
    {"impl", KVB_P_ENUM, 0, 0, 0, NULL, "implementation (the impl table)"},
};

static omnikv_layout layout_of(const kvb_case *c)
{
    omnikv_layout s = {kvb_case_int(c, "B"), kvb_case_int(c, "Hq"), kvb_case_int(c, "Hkv"), kvb_case_int(c, "D"),
                       kvb_case_int(c, "L")};
    return s;
}

static int longest_of(const kvb_case *c) { return kvb_case_int(c, "len") ? kvb_case_int(c, "len") : kvb_case_int(c, "L"); }

static int validate_omnikv(const kvb_case *c)
{
    const omnikv_layout s = layout_of(c);
    int rc = omnikv_layout_check(&s, "omnikv_select");
    if (rc) return rc;
    const int len = kvb_case_int(c, "len"), k = kvb_case_int(c, "k");
    if (len > s.L)
        return kvb_fail(KVB_EINVAL, "omnikv_select: len=%d out of range [0, L = %d]: a prompt beyond the allocated cache (0: L)",
                        len, s.L);
    if (k > longest_of(c))
        return kvb_fail(KVB_EINVAL, "omnikv_select: k=%d out of range [1, len = %d] (tokens of the prompt to choose "
                        "from)", k, longest_of(c));
    return KVB_OK;
}

/* ---- setup ---- */

typedef struct omnikv_priv {
    omnikv_layout s;
    int k;
    uint8_t *mask;       /* sequences of the sampled reference (NULL: all) */
    uint8_t *score_mask; /* per score: its sequence sampled, or past its prompt */
    double *mag;
    double prompt_tokens; /* sum over sequences of len[b] */
    size_t ws_bytes;
} omnikv_priv;

static int setup_omnikv(kvb_run *r)
{
    const kvb_case *c = r->c;
    omnikv_priv *p = kvb_run_alloc(r, sizeof *p, "omnikv_select state");
    r->priv = p;
    omnikv_layout *s = &p->s;
    *s = layout_of(c);
    p->k = kvb_case_int(c, "k");
    int64_t sq[3] = {s->B, s->Hq, s->D}, skv[4] = {s->B, s->Hkv, s->L, s->D}, sl[1] = {s->B};
    int64_t ss[2] = {s->B, s->L}, si[2] = {s->B, p->k};
    kvb_tensor *q = kvb_run_tensor(r, "q", KVB_BF16, 3, sq, KVB_IN);
    kvb_tensor *K = kvb_run_tensor(r, "K", KVB_BF16, 4, skv, KVB_IN);
    kvb_tensor *len = kvb_run_tensor(r, "len", KVB_I32, 1, sl, KVB_IN);
    kvb_tensor *idx = kvb_run_tensor(r, "idx", KVB_I32, 2, si, KVB_OUT);
    kvb_tensor *sc = kvb_run_tensor(r, "scores", KVB_FP32, 2, ss, KVB_OUT);
    if (K->n > (1 << 26)) K->flags |= KVB_T_NO_DUMP;
#if KVB_HAVE_CUDA
    if (kvb_gpu_available()) p->ws_bytes = omnikv_select_workspace_bytes(s);
#endif
    int64_t ws[1] = {p->ws_bytes ? (int64_t)p->ws_bytes : 1};
    kvb_run_tensor(r, "workspace", KVB_U8, 1, ws, KVB_SCRATCH);

    int32_t *lens = len->h;
    const int lmax = longest_of(c);
    kvb_rng rng = kvb_rng_make(r->seed, kvb_stream_of("len"));
    for (int b = 0; b < s->B; b++)
        lens[b] = b == 0 || !kvb_case_int(c, "vary") ? lmax
                                                      : p->k + (int32_t)kvb_rng_below(&rng, (uint64_t)(lmax - p->k + 1));
    for (int b = 0; b < s->B; b++) p->prompt_tokens += lens[b];
    kvb_fill_bf16_normal(q->h, q->n, r->seed, kvb_stream_of("q"), 0, 0, 1);
    kvb_fill_bf16_normal(K->h, K->n, r->seed, kvb_stream_of("K"), 0, 0, 1);
    if (!strcmp(kvb_case_enum(c, "dist"), "ties")) {
        kvb_bf16 *k = K->h;
        for (int64_t head = 0; head < (int64_t)s->B * s->Hkv; head++)
            for (int64_t t = TIES_PERIOD; t < s->L; t++)
                memcpy(k + (head * s->L + t) * s->D, k + (head * s->L + t % TIES_PERIOD) * s->D,
                       sizeof(kvb_bf16) * (size_t)s->D);
    }

    /* a sampled reference: whole sequences (a selection needs its whole row) */
    int64_t chosen;
    p->mask = kvb_sample_slices(s->B, (double)s->Hq * lmax * s->D, KVB_REF_BUDGET, &chosen);
    idx->slice_len = p->k, idx->slice_mask = p->mask;
    p->mag = kvb_run_alloc(r, sizeof(double) * (size_t)sc->n, "omnikv score magnitudes");
    int rc = ref_omnikv_select(q->h, K->h, lens, s, p->k, sc->ref, idx->ref, p->mag, p->mask);
    if (rc) return rc;
    if (p->mask) {
        snprintf(r->note, sizeof r->note, "reference on %lld of %d sequences (first, last, evenly spaced)",
                 (long long)chosen, s->B);
        /* the scores past a prompt are -inf on every row, also the skipped ones: compared there too
         * (element slices), where the screen of unsampled elements would refuse a non-finite value */
        p->score_mask = kvb_run_alloc(r, (size_t)sc->n, "omnikv score mask");
        float *ref = sc->ref;
        for (int b = 0; b < s->B; b++)
            for (int t = 0; t < s->L; t++) {
                const int64_t i = (int64_t)b * s->L + t;
                p->score_mask[i] = p->mask[b] || t >= lens[b];
                if (!p->mask[b] && t >= lens[b]) ref[i] = -INFINITY, p->mag[i] = 0;
            }
        sc->slice_len = 1, sc->slice_mask = p->score_mask;
    }
    sc->tol_mag = p->mag;
    double mag_max = 0;
    for (int b = 0; b < s->B; b++)
        for (int t = 0; (!p->mask || p->mask[b]) && t < lens[b]; t++) mag_max = fmax(mag_max, p->mag[(int64_t)b * s->L + t]);
    idx->cmp = KVB_CMP_INDEXSET;
    idx->scores = sc->ref;
    idx->scores_dtype = KVB_FP32;
    idx->scores_n = s->L;
    idx->set_tol = 2 * (sc->tol.atol + sc->tol.rtol * mag_max); /* two scores off by the bound, swapped */
    return KVB_OK;
}

/* On every row: indices strictly ascending and inside the prompt; scores past the prompt -inf. */
static int out_check_omnikv(kvb_run *r)
{
    const omnikv_priv *p = r->priv;
    const kvb_tensor *idx = kvb_run_find(r, "idx"), *sc = kvb_run_find(r, "scores"), *len = kvb_run_find(r, "len");
    if (!idx->out || !sc->out) return KVB_OK;
    const int32_t *o = idx->out, *lens = len->h;
    const float *so = sc->out;
    for (int b = 0; b < p->s.B; b++) {
        for (int i = 0; i < p->k; i++) {
            const int32_t v = o[(int64_t)b * p->k + i];
            if (v < 0 || v >= lens[b] || (i > 0 && v <= o[(int64_t)b * p->k + i - 1]))
                return kvb_fail(KVB_EINVAL, "omnikv_select: idx[%d, %d]=%d is not strictly ascending in [0, len[%d] = %d)",
                                b, i, v, b, lens[b]);
        }
        for (int t = lens[b]; t < p->s.L; t++)
            if (!(isinf(so[(int64_t)b * p->s.L + t]) && so[(int64_t)b * p->s.L + t] < 0))
                return kvb_fail(KVB_EINVAL, "omnikv_select: scores[%d, %d]=%g past len[%d] = %d, not -inf", b, t,
                                so[(int64_t)b * p->s.L + t], b, lens[b]);
    }
    return KVB_OK;
}

#if KVB_HAVE_CUDA
static int launch_omnikv(kvb_run *r)
{
    omnikv_priv *p = r->priv;
    kvb_tensor *len = kvb_run_find(r, "len");
    return omnikv_select(kvb_run_find(r, "q")->d, kvb_run_find(r, "K")->d, len->d, len->h, &p->s, p->k,
                         kvb_run_find(r, "idx")->d, kvb_run_find(r, "scores")->d, kvb_run_find(r, "workspace")->d,
                         p->ws_bytes, r->stream);
}
#else
static int launch_omnikv(kvb_run *r) { (void)r; return KVB_EDEVICE; }
#endif

/* Bytes: K of every prompt token read once, q read, the scores written and read back by the top-k,
 * idx written: a read-mostly kernel, stated against the read ceiling. No goal for the selector alone
 * (its goal is the end-to-end step's: kernels/omnikv/NOTES.md, Budget). */
static void cost_omnikv(const kvb_run *r, kvb_cost *c)
{
    const omnikv_priv *p = r->priv;
    const omnikv_layout *s = &p->s;
    c->bytes_dev = p->prompt_tokens * s->Hkv * s->D * 2.0 + (double)s->B * s->Hq * s->D * 2.0 +
                   2.0 * s->B * (double)s->L * 4.0 + (double)s->B * p->k * 4.0;
    c->flops = 2.0 * p->prompt_tokens * s->Hq * s->D;
    c->ceiling = KVB_CEIL_READ;
    c->goal_us = 0;
    c->workspace_bytes = (double)p->ws_bytes;
}

static void teardown_omnikv(kvb_run *r)
{
    omnikv_priv *p = r->priv;
    if (!p) return;
    kvb_xfree(p->mask);
    r->priv = NULL;
}

/* q, K, len in; idx, scores out; the scores' magnitudes and mask, the sequence sample; the reference's
 * query rows in double */
static size_t host_bytes_omnikv(const kvb_case *c)
{
    const omnikv_layout s = layout_of(c);
    const double k = kvb_case_int(c, "k"), scores = (double)s.B * s.L;
    const double in = (double)s.B * s.Hq * s.D * 2 + (double)s.B * s.Hkv * s.L * s.D * 2 + 4.0 * s.B;
    return kvb_host_bytes_sat(KVB_HOLD_IN * in + KVB_HOLD_OUT * (s.B * k * 4 + scores * 4) + scores * 9 + s.B +
                              8.0 * s.Hq * s.D + kvb_ref_threads() * 8.0 * s.L);
}

static const kvb_impl omnikv_impls[] = {
    {"kernel", launch_omnikv, 0, "max-over-heads scores on the tensor cores (one K read per KV head), then topk_rows"},
};

const kvb_op op_omnikv_select = {
    .name = "omnikv_select",
    .family = "omnikv",
    .summary = "OmniKV filter-layer selector: max over query heads of q.k/sqrt(D) per prompt token, top-k shared by all heads",
    .params = omnikv_params,
    .n_params = NPARAMS(omnikv_params),
    .tol = {0, 1e-4, 1e-4},
    .validate = validate_omnikv,
    .host_bytes = host_bytes_omnikv,
    .setup = setup_omnikv,
    KVB_IMPLS(omnikv_impls),
    .cost = cost_omnikv,
    .teardown = teardown_omnikv,
    .out_check = out_check_omnikv,
};
