/* ops_decode.c: dense decode attention in the harness (contract and budget: kernels/decode/NOTES.md).
 *
 * Kernel: decode_attn. Implementations (impl=): kernel, the suite's CUDA kernel (one 16-token step
 * per warp in flight); steps2, the same kernel with two steps per warp in flight (kept to compare).
 *
 * Inputs: q [B, Hq, D], K, V [B, Hkv, L, D] seeded normal bf16 (dist=peaked: q with std 3, so that the
 * softmax concentrates on few tokens and the output is O(1), which makes the per-element tolerance
 * bite; normal: q with std 1, a flat softmax). Lengths: len (0 = L) for every sequence, or with vary=1
 * for sequence 0 only while the others draw seeded lengths in [1, len]. The whole allocated cache is
 * random, also past len[b], so that a read beyond a sequence's length changes the result.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reference/decode.h"
#include "harness/core/ceilings.h"
#include "harness/core/op.h"
#include "harness/ops/ops.h"
#if KVB_HAVE_CUDA
#include "kernels/decode/decode.h"
#endif

#define NPARAMS(a) ((int)(sizeof(a) / sizeof((a)[0])))

static const kvb_param decode_params[] = {
    {"B", KVB_P_INT, 8, 1, DECODE_MAX_B, NULL, "batch"},
    {"Hq", KVB_P_INT, 32, 1, 2048, NULL, "query heads"},
    {"Hkv", KVB_P_INT, 8, 1, DECODE_MAX_HKV, NULL, "KV heads (G = Hq/Hkv in [1, 8])"},
    {"D", KVB_P_INT, 128, 1, 1024, "64|128", "head dimension"},
    {"L", KVB_P_INT, 32768, 1, DECODE_MAX_L, NULL, "allocated tokens per sequence"},
    {"len", KVB_P_INT, 0, 0, DECODE_MAX_L, NULL, "tokens of the longest sequence (0: L)"},
    {"vary", KVB_P_INT, 0, 0, 1, NULL, "1: sequences 1..B-1 get seeded lengths in [1, len]"},
    {"dist", KVB_P_ENUM, 0, 0, 0, "normal|peaked", "inputs: normal, or peaked (q with std 3)"},
    {"seed", KVB_P_INT, 1, 0, 1e15, NULL, "input seed"},
    {"impl", KVB_P_ENUM, 0, 0, 0, NULL, "implementation (the impl table)"},
};

static decode_layout layout_of(const kvb_case *c)
{
    decode_layout d = {kvb_case_int(c, "B"), kvb_case_int(c, "Hq"), kvb_case_int(c, "Hkv"), kvb_case_int(c, "D"),
                       kvb_case_i64(c, "L")};
    return d;
}

static int validate_decode(const kvb_case *c)
{
    decode_layout d = layout_of(c);
    int rc = decode_layout_check(&d, "decode_attn");
    if (rc) return rc;
    int64_t len = kvb_case_i64(c, "len");
    if (len > d.L)
        return kvb_fail(KVB_EINVAL, "decode_attn: len=%lld out of range [0, L = %lld]: a length beyond the allocated cache (0: L)",
                        (long long)len, (long long)d.L);
    return KVB_OK;
}

/* ---- setup ---- */

typedef struct decode_priv {
    decode_layout d;
    uint8_t *mask;
    double kv_tokens; /* sum over sequences of len[b] */
} decode_priv;

static int setup_decode(kvb_run *r)
{
    const kvb_case *c = r->c;
    decode_priv *p = kvb_run_alloc(r, sizeof *p, "decode_attn state");
    r->priv = p;
    decode_layout *d = &p->d;
    *d = layout_of(c);
    const int G = d->Hq / d->Hkv;
    int64_t sq[3] = {d->B, d->Hq, d->D}, skv[4] = {d->B, d->Hkv, d->L, d->D}, sl[1] = {d->B};
    kvb_tensor *q = kvb_run_tensor(r, "q", KVB_BF16, 3, sq, KVB_IN);
    kvb_tensor *K = kvb_run_tensor(r, "K", KVB_BF16, 4, skv, KVB_IN);
    kvb_tensor *V = kvb_run_tensor(r, "V", KVB_BF16, 4, skv, KVB_IN);
    kvb_tensor *len = kvb_run_tensor(r, "len", KVB_I32, 1, sl, KVB_IN);
    kvb_tensor *o = kvb_run_tensor(r, "o", KVB_BF16, 3, sq, KVB_OUT);
    if (K->n > (1 << 26)) K->flags |= KVB_T_NO_DUMP, V->flags |= KVB_T_NO_DUMP;
    int64_t ws[1] = {1};
#if KVB_HAVE_CUDA
    if (kvb_gpu_available()) ws[0] = (int64_t)decode_attn_workspace_bytes(d);
#endif
    kvb_run_tensor(r, "workspace", KVB_U8, 1, ws, KVB_SCRATCH);

    int32_t *lens = len->h;
    int64_t lmax = kvb_case_i64(c, "len") ? kvb_case_i64(c, "len") : d->L;
    kvb_rng rng = kvb_rng_make(r->seed, kvb_stream_of("len"));
    for (int b = 0; b < d->B; b++)
        lens[b] = (int32_t)(b == 0 || !kvb_case_int(c, "vary") ? lmax : 1 + (int64_t)kvb_rng_below(&rng, (uint64_t)lmax));
    double qstd = !strcmp(kvb_case_enum(c, "dist"), "peaked") ? 3.0 : 1.0;
    kvb_fill_bf16_normal(q->h, q->n, r->seed, kvb_stream_of("q"), 0, 0, qstd);
    kvb_fill_bf16_normal(K->h, K->n, r->seed, kvb_stream_of("K"), 0, 0, 1);
    kvb_fill_bf16_normal(V->h, V->n, r->seed, kvb_stream_of("V"), 0, 0, 1);
    for (int b = 0; b < d->B; b++) p->kv_tokens += lens[b];

    int64_t chosen, n_slices = (int64_t)d->B * d->Hkv;
    p->mask = kvb_sample_slices(n_slices, 2.0 * G * (double)lmax * d->D, KVB_REF_BUDGET, &chosen);
    o->slice_len = (int64_t)G * d->D;
    o->slice_mask = p->mask;
    if (p->mask)
        snprintf(r->note, sizeof r->note, "reference on %lld of %lld (b, kv head) slices (first, last, evenly spaced)",
                 (long long)chosen, (long long)n_slices);
    return ref_decode_attn(q->h, K->h, V->h, lens, o->ref, d, p->mask);
}

static int launch_decode(kvb_run *r)
{
#if KVB_HAVE_CUDA
    decode_priv *p = r->priv;
    kvb_tensor *len = kvb_run_find(r, "len");
    int steps = !strcmp(kvb_run_impl(r), "steps2") ? 2 : 1;
    return decode_attn_variant(kvb_run_find(r, "q")->d, kvb_run_find(r, "K")->d, kvb_run_find(r, "V")->d, len->d,
                               len->h, kvb_run_find(r, "o")->d, &p->d, kvb_run_find(r, "workspace")->d, steps,
                               r->stream);
#else
    (void)r;
    return KVB_EDEVICE;
#endif
}

/* Bytes: K and V of every sequence's len[b] tokens, read once; q read, o written: a read-mostly kernel,
 * stated against the read ceiling. Goals (kernels/decode/NOTES.md, Budget): K+V at >= 90% of the
 * measured device read bandwidth for L >= 32K at B=8, >= 85% at B=1. */
static void cost_decode(const kvb_run *r, kvb_cost *c)
{
    const decode_priv *p = r->priv;
    const decode_layout *d = &p->d;
    const double kv = 2.0 * p->kv_tokens * d->Hkv * d->D * 2.0;
    c->bytes_dev = kv + 2.0 * d->B * d->Hq * d->D * 2.0 + 4.0 * d->B;
    c->flops = 4.0 * p->kv_tokens * d->Hq * d->D;
    c->ceiling = KVB_CEIL_READ;
    int64_t lmax = kvb_case_i64(r->c, "len") ? kvb_case_i64(r->c, "len") : d->L;
    if (lmax >= 32768 && r->ceil && r->ceil->measured) {
        const double frac = d->B == 1 ? 0.85 : 0.9;
        c->goal_us = kvb_read_contiguous_seconds((size_t)c->bytes_dev) * 1e6 / frac;
        c->goal_text = d->B == 1 ? "85% of the device read rate" : "90% of the device read rate";
    }
}

static void teardown_decode(kvb_run *r)
{
    decode_priv *p = r->priv;
    if (!p) return;
    kvb_xfree(p->mask);
    r->priv = NULL;
}

/* q, K, V, len in; o out; the slice sample; the reference's scores (a thread's row of L doubles) */
static size_t host_bytes_decode(const kvb_case *c)
{
    const decode_layout d = layout_of(c);
    const double q = (double)d.B * d.Hq * d.D * 2, kv = 2.0 * d.B * d.Hkv * (double)d.L * d.D * 2;
    return kvb_host_bytes_sat(KVB_HOLD_IN * (q + kv + 4.0 * d.B) + KVB_HOLD_OUT * q + (double)d.B * d.Hkv +
                              kvb_ref_threads() * 8.0 * (double)d.L);
}

static const kvb_impl decode_impls[] = {
    {"kernel", NULL, 0, "flash decoding, one 16-token step per warp in flight"},
    {"steps2", NULL, 0, "the same kernel with two steps per warp in flight (kept to compare)"},
};

const kvb_op op_decode_attn = {
    .name = "decode_attn",
    .family = "decode",
    .summary = "dense decode attention: GQA, per-sequence lengths, flash decoding",
    .params = decode_params,
    .n_params = NPARAMS(decode_params),
    .tol = {1e-2, 2e-2, 1e-2},
    .validate = validate_decode,
    .host_bytes = host_bytes_decode,
    .setup = setup_decode,
    .launch = launch_decode,
    KVB_IMPLS(decode_impls),
    .cost = cost_decode,
    .teardown = teardown_decode,
};
