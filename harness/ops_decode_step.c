/* ops_decode_step.c: one transformer block decoding one token, end to end (spec: decode.md, "End-to-end
 * decode steps"; kernels/step_block.h; reference/block.h).
 *
 * Kernel name: decode_step. Keys: method (dense so far), model (a preset of reference/block.h), B, ctx
 * (tokens in each sequence's cache before the step: the step writes row ctx and attends over ctx + 1),
 * seed. Implementations: kernel (the step captured once as a CUDA graph and replayed), eager (its ten
 * stages enqueued one by one).
 *
 * Inputs: x normal; weights normal scaled by 1/sqrt(fan_in), the norms' weights 1 + 0.1 normal; the
 * cache K, V random for its ctx rows (and the rest); the bf16 RoPE table of rows 0..ctx. Outputs: y
 * against ref_decode_block_dense (on a sample of the sequences when the reference would take long:
 * the first and the last), and K, V (the new row written, every other row unchanged) with the same
 * tolerance (the new k is a GEMM output rounded to bf16 on both sides).
 *
 * Bound (decode.md): weight bytes and the K, V rows read once at the device read rate: the read ceiling
 * of the step's bytes; goal: within 1.2x of it.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../reference/batch_gemm_rotary.h"
#include "../reference/block.h"
#include "ceilings.h"
#include "op.h"
#include "ops.h"
#if KVB_HAVE_CUDA
#include "../kernels/step_block.h"
#endif

#define NPARAMS(a) ((int)(sizeof(a) / sizeof((a)[0])))

static const kvb_param step_params[] = {
    {"method", KVB_P_ENUM, 0, 0, 0, "dense", "attention path (dense: decode attention over the whole cache)"},
    {"model", KVB_P_ENUM, 0, 0, 0, BLOCK_PRESETS, "model preset (reference/block.h)"},
    {"B", KVB_P_INT, 1, 1, DECODE_MAX_B, NULL, "batch"},
    {"ctx", KVB_P_INT, 32768, 0, DECODE_MAX_L - 1, NULL, "tokens cached before the step (the new one is row ctx)"},
    {"seed", KVB_P_INT, 1, 0, 1e15, NULL, "input seed"},
    {"impl", KVB_P_ENUM, 0, 0, 0, NULL, "implementation (the impl table)"},
};

typedef struct step_case {
    const block_preset *m;
    int B, ctx;
    int64_t L; /* cache rows: ctx + 1 */
} step_case;

static int case_of(const kvb_case *c, step_case *s)
{
    s->m = block_preset_find(kvb_case_enum(c, "model"));
    s->B = kvb_case_int(c, "B"), s->ctx = kvb_case_int(c, "ctx"), s->L = (int64_t)s->ctx + 1;
    int rc = block_check(s->m, s->B, s->L, s->ctx + 1, NULL, "decode_step");
    if (rc) return rc;
    const double kv = 4.0 * s->B * s->m->Hkv * s->m->D * (double)s->L;
    if (kv > 24e9)
        return kvb_fail(KVB_EINVAL, "decode_step: K and V take %.1f GB, out of range [0, 24 GB]", kv * 1e-9);
    return KVB_OK;
}

static int validate_step(const kvb_case *c)
{
    step_case s;
    return case_of(c, &s);
}

typedef struct step_priv {
    step_case s;
    uint8_t *seqs; /* sampled reference: the sequences computed */
#if KVB_HAVE_CUDA
    block_step_plan plan, plan_timed;
    int planned;
    void *cublas, *cublas_ws;
#endif
} step_priv;

static kvb_tensor *add(kvb_run *r, const char *name, kvb_dtype dt, int ndim, int64_t a, int64_t b, int64_t c, int64_t d,
                       int role)
{
    int64_t sh[4] = {a, b, c, d};
    return kvb_run_tensor(r, name, dt, ndim, sh, role);
}

static kvb_tensor *weight(kvb_run *r, const char *name, int64_t out, int64_t in)
{
    kvb_tensor *t = add(r, name, KVB_BF16, 2, out, in, 0, 0, KVB_IN);
    kvb_fill_bf16_normal(t->h, t->n, r->seed, kvb_stream_of(name), 0, 0, 1.0 / sqrt((double)in));
    t->flags |= KVB_T_NO_DUMP;
    return t;
}

static int setup_step(kvb_run *r)
{
    step_priv *p = calloc(1, sizeof *p);
    r->priv = p;
    int rc = case_of(r->c, &p->s);
    if (rc) return rc;
    const block_preset *m = p->s.m;
    const int B = p->s.B, H = m->hidden, max_pos = p->s.ctx + 1;
    kvb_tensor *x = add(r, "x", KVB_BF16, 2, B, H, 0, 0, KVB_IN);
    kvb_fill_bf16_normal(x->h, x->n, r->seed, kvb_stream_of("x"), 0, 0, 1);
    kvb_tensor *n1 = add(r, "norm1", KVB_BF16, 1, H, 0, 0, 0, KVB_IN), *n2 = add(r, "norm2", KVB_BF16, 1, H, 0, 0, 0, KVB_IN);
    kvb_fill_bf16_normal(n1->h, H, r->seed, kvb_stream_of("norm1"), 0, 1, 0.1);
    kvb_fill_bf16_normal(n2->h, H, r->seed, kvb_stream_of("norm2"), 0, 1, 0.1);
    kvb_tensor *wqkv = weight(r, "w_qkv", (int64_t)(m->Hq + 2 * m->Hkv) * m->D, H);
    kvb_tensor *wo = weight(r, "w_o", H, (int64_t)m->Hq * m->D);
    kvb_tensor *wgu = weight(r, "w_gate_up", 2 * (int64_t)m->ffn, H);
    kvb_tensor *wd = weight(r, "w_down", H, m->ffn);
    kvb_tensor *cs = add(r, "cos_sin", KVB_BF16, 2, max_pos, m->D, 0, 0, KVB_IN);
    cs->flags |= KVB_T_NO_DUMP;
    if ((rc = rope_table(cs->h, max_pos, m->D, m->theta, ROPE_LLAMA))) return rc;
    kvb_tensor *pos = add(r, "pos", KVB_I32, 1, B, 0, 0, 0, KVB_IN), *len = add(r, "len", KVB_I32, 1, B, 0, 0, 0, KVB_IN);
    for (int b = 0; b < B; b++) ((int32_t *)pos->h)[b] = p->s.ctx, ((int32_t *)len->h)[b] = p->s.ctx + 1;
    kvb_tensor *K = add(r, "K", KVB_BF16, 4, B, m->Hkv, p->s.L, m->D, KVB_INOUT);
    kvb_tensor *V = add(r, "V", KVB_BF16, 4, B, m->Hkv, p->s.L, m->D, KVB_INOUT);
    K->flags |= KVB_T_NO_DUMP, V->flags |= KVB_T_NO_DUMP;
    kvb_fill_bf16_normal(K->h, K->n, r->seed, kvb_stream_of("K"), 0, 0, 1);
    kvb_fill_bf16_normal(V->h, V->n, r->seed, kvb_stream_of("V"), 0, 0, 1);
    kvb_tensor *y = add(r, "y", KVB_BF16, 2, B, H, 0, 0, KVB_OUT);
    size_t scratch = 1, attn_ws = 1;
#if KVB_HAVE_CUDA
    if (kvb_gpu_available()) {
        const decode_layout d = {B, m->Hq, m->Hkv, m->D, p->s.L};
        scratch = block_scratch_bytes(m, B), attn_ws = decode_attn_workspace_bytes(&d);
    }
#endif
    add(r, "scratch", KVB_U8, 1, (int64_t)scratch, 0, 0, 0, KVB_SCRATCH);
    add(r, "attn_ws", KVB_U8, 1, (int64_t)attn_ws, 0, 0, 0, KVB_SCRATCH);

    /* a sequence's reference: its weights' multiply-adds and its attention over ctx + 1 tokens */
    const double per_seq = (double)block_weight_elems(m) + 2.0 * m->Hq * m->D * (double)p->s.L;
    int64_t chosen;
    p->seqs = kvb_sample_slices(B, per_seq, 2 * KVB_REF_BUDGET, &chosen);
    y->slice_len = H;
    y->slice_mask = p->seqs;
    if (p->seqs)
        snprintf(r->note, sizeof r->note, "reference on %lld of %d sequences (first, last, evenly spaced)",
                 (long long)chosen, B);
    memcpy(K->ref, K->h, sizeof(kvb_bf16) * (size_t)K->n);
    memcpy(V->ref, V->h, sizeof(kvb_bf16) * (size_t)V->n);
    const block_weights w = {n1->h, n2->h, wqkv->h, wo->h, wgu->h, wd->h};
    return ref_decode_block_dense(x->h, &w, m, B, pos->h, K->ref, V->ref, p->s.L, cs->h, max_pos, p->seqs, y->ref);
}

#if KVB_HAVE_CUDA
static void *dev(kvb_run *r, const char *name) { return kvb_run_find(r, name)->d; }

static int gpu_setup_step(kvb_run *r)
{
    step_priv *p = r->priv;
    int rc = block_cublas_create(&p->cublas, &p->cublas_ws);
    if (rc) return rc;
    block_buffers b = {
        .x = dev(r, "x"),
        .w = {dev(r, "norm1"), dev(r, "norm2"), dev(r, "w_qkv"), dev(r, "w_o"), dev(r, "w_gate_up"), dev(r, "w_down")},
        .cos_sin = dev(r, "cos_sin"),
        .pos = dev(r, "pos"), .pos_host = kvb_run_find(r, "pos")->h,
        .len = dev(r, "len"), .len_host = kvb_run_find(r, "len")->h,
        .K = dev(r, "K"), .V = dev(r, "V"), .y = dev(r, "y"),
        .scratch = dev(r, "scratch"), .attn_ws = dev(r, "attn_ws"), .cublas = p->cublas,
    };
    for (int timed = 0; timed < 2; timed++) {
        rc = block_step_plan_make(timed ? &p->plan_timed : &p->plan, r->c->id, p->s.m, p->s.B, p->s.L, p->s.ctx + 1, &b,
                                  r->stream, timed);
        p->planned |= timed + 1;
        if (rc) return rc;
    }
    return strcmp(kvb_run_impl(r), "kernel") ? KVB_OK : kvb_step_capture(&p->plan.step);
}

static int launch_step(kvb_run *r)
{
    step_priv *p = r->priv;
    if (r->stage_timing) return block_step_enqueue(&p->plan_timed);
    return strcmp(kvb_run_impl(r), "kernel") ? block_step_enqueue(&p->plan) : kvb_step_launch_graph(&p->plan.step);
}

static int stage_times_step(kvb_run *r)
{
    step_priv *p = r->priv;
    return kvb_run_stage_times(r, &p->plan_timed.step);
}
#else
static int launch_step(kvb_run *r)
{
    (void)r;
    return KVB_EDEVICE;
}
#define gpu_setup_step NULL
#define stage_times_step NULL
#endif

/* The bound of decode.md: the weights and the K, V rows each read once, at the read ceiling (x, y and
 * the intermediates are a few hundred KB). Goal: the step within 1.2x of it. */
static void cost_step(const kvb_run *r, kvb_cost *c)
{
    const step_priv *p = r->priv;
    const block_preset *m = p->s.m;
    const double weights = 2.0 * (double)block_weight_elems(m);
    const double kv = 2.0 * 2.0 * p->s.B * m->Hkv * m->D * (double)p->s.L;
    c->bytes_dev = weights + kv + 2.0 * 2.0 * p->s.B * m->hidden;
    c->flops = 2.0 * p->s.B * (double)block_weight_elems(m) + 4.0 * p->s.B * m->Hq * m->D * (double)p->s.L;
    c->ceiling = KVB_CEIL_READ;
    if (r->ceil && r->ceil->measured) {
        c->goal_us = 1.2 * kvb_read_contiguous_seconds((size_t)c->bytes_dev) * 1e6;
        c->goal_text = "1.2x the bound";
    }
}

static void teardown_step(kvb_run *r)
{
    step_priv *p = r->priv;
    if (!p) return;
#if KVB_HAVE_CUDA
    if (p->planned & 1) block_step_plan_destroy(&p->plan);
    if (p->planned & 2) block_step_plan_destroy(&p->plan_timed);
    block_cublas_destroy(p->cublas, p->cublas_ws);
#endif
    free(p->seqs);
    free(p);
    r->priv = NULL;
}

static const kvb_impl step_impls[] = {
    {"kernel", NULL, 0, "the block's ten stages captured once as a CUDA graph and replayed"},
    {"eager", NULL, 0, "the same stages enqueued one by one"},
};

const kvb_op op_decode_step = {
    .name = "decode_step",
    .family = "step_block",
    .summary = "one transformer block decoding one token for B sequences, end to end (dense so far)",
    .params = step_params,
    .n_params = NPARAMS(step_params),
    .tol = {2e-2, 2e-2, 1e-2},
    .validate = validate_step,
    .setup = setup_step,
    .gpu_setup = gpu_setup_step,
    .launch = launch_step,
    KVB_IMPLS(step_impls),
    .cost = cost_step,
    .teardown = teardown_step,
    .stage_times = stage_times_step,
};
