/* ops_decode_step.c: one transformer block decoding one token, end to end (kernels/step/NOTES.md;
 * kernels/step/step_block.h; reference/step/block.h; the methods: harness/step/decode_step.h).
 *
 * Kernel name: decode_step. Keys: method (dense, rocketkv, minikv, shadowkv, omnikv), role (omnikv's
 * layer role: sparse or filter; the other methods have none), model (a preset of
 * reference/step/block.h), B, ctx (the prompt), gen (tokens generated before the step: it decodes position ctx + gen), budget
 * (rocketkv's token budget T; shadowkv's sparse budget, M chunks of 8 tokens; omnikv's k, the prompt
 * tokens selected), rank and hit (shadowkv's rank and the share of the step's chunks already in its
 * buffer), all (the sparse method attends every token: must equal dense), seed. Implementations:
 * kernel (the step captured once as a CUDA graph and replayed), eager (its stages enqueued one by one).
 *
 * Inputs: x normal; weights normal scaled by 1/sqrt(fan_in), the norms' weights 1 + 0.1 normal; the
 * method's state from seeded normal activations; the bf16 RoPE table of rows 0..ctx. Outputs: q, knew,
 * vnew (the block's first half, against ref_block_pre), the method's state (the new token appended),
 * and y: its reference is ref_block_post over the method's reference attention, recomputed before each
 * comparison from the device's q, knew, vnew (decode_step.h says why), on a sample of the sequences when
 * the reference would take long (the first and the last).
 *
 * Bound (kernels/step/NOTES.md, Budget): weight bytes and the method's attention bytes read once at the
 * device read rate (the read ceiling of the step's bytes), and for an offloading method (shadowkv) the
 * weights, then the larger of its device bytes at the read ceiling and its host bytes at the pinned
 * copy ceiling; goal: within 1.2x of it. The note adds the state each sequence
 * keeps, the largest batch that fits beside the whole model's weights, and the decode throughput
 * projected to the whole model (B / (step time x layers)); for omnikv, the layers of the case's role
 * and the dense layers (the model's step is composed from the roles: harness/report/step_report.py).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "reference/batch_gemm_rotary.h"
#include "harness/core/ceilings.h"
#include "harness/step/decode_step.h"
#include "harness/ops/ops.h"

#define NPARAMS(a) ((int)(sizeof(a) / sizeof((a)[0])))

static const step_method *const METHODS[] = {&step_method_dense, &step_method_rocketkv, &step_method_minikv,
                                             &step_method_shadowkv, &step_method_omnikv};

static const kvb_param step_params[] = {
    {"method", KVB_P_ENUM, 0, 0, 0, "dense|rocketkv|minikv|shadowkv|omnikv", "attention path (harness/step/decode_step_<method>.c)"},
    {"role", KVB_P_ENUM, 0, 0, 0, "sparse|filter", "omnikv: the layer's role (reference/omnikv.h)"},
    {"model", KVB_P_ENUM, 0, 0, 0, BLOCK_PRESETS, "model preset (reference/step/block.h)"},
    {"B", KVB_P_INT, 1, 1, DECODE_MAX_B, NULL, "batch"},
    {"ctx", KVB_P_INT, 32768, 0, DECODE_MAX_L - 1, NULL, "prompt tokens"},
    {"gen", KVB_P_INT, 0, 0, 49, NULL, "tokens generated before the step (it decodes position ctx + gen)"},
    {"budget", KVB_P_INT, 2048, 1, DECODE_MAX_L, NULL,
     "rocketkv: token budget T (rocketkv_budget: C, P, r, k); shadowkv: sparse tokens (M chunks of 8); omnikv: "
     "prompt tokens selected"},
    {"all", KVB_P_INT, 0, 0, 1, NULL, "rocketkv, shadowkv, omnikv sparse: 1 = attend every token (must equal dense)"},
    {"rank", KVB_P_INT, 160, 1, BGR_KERNEL_MAX_RANK, NULL, "shadowkv: rank of the low-rank keys (batch_gemm_rotary's kernel limit)"},
    {"hit", KVB_P_FLOAT, 0.6, 0, 1, NULL, "shadowkv: fraction of the step's chunks already in the buffer"},
    {"seed", KVB_P_INT, 1, 0, 1e15, NULL, "input seed"},
    {"impl", KVB_P_ENUM, 0, 0, 0, NULL, "implementation (the impl table)"},
};

/* The keys only some methods read: elsewhere the parser holds them at their defaults. (all=1 is refused
 * with its reason by each method's shape that does not use it.) */
static const kvb_key_scope step_scopes[] = {
    {"role", "method=omnikv"},
    {"budget", "method=rocketkv|shadowkv|omnikv"},
    {"rank", "method=shadowkv"},
    {"hit", "method=shadowkv"},
};

/* ---- shared with the methods' files ---- */

kvb_tensor *step_tensor(kvb_run *r, const char *name, kvb_dtype dt, int ndim, int64_t a, int64_t b, int64_t c,
                        int64_t d, int role)
{
    int64_t sh[4] = {a, b, c, d};
    return kvb_run_tensor(r, name, dt, ndim, sh, role);
}

void step_fill_ints(kvb_tensor *t, int v)
{
    for (int64_t i = 0; i < t->n; i++) ((int32_t *)t->h)[i] = v;
}

void step_ref_reset(kvb_tensor *t) { kvb_copy_parallel(t->ref, t->h, (size_t)t->n * kvb_dtype_size(t->dtype)); }

#if KVB_HAVE_CUDA
void *step_dev(kvb_run *r, const char *name) { return kvb_run_find(r, name)->d; }
#endif

/* ---- the case ---- */

static int case_of(const kvb_case *c, step_case *s)
{
    memset(s, 0, sizeof *s);
    s->m = block_preset_find(kvb_case_enum(c, "model"));
    s->method = (int)kvb_case_get(c, "method");
    s->B = kvb_case_int(c, "B"), s->ctx = kvb_case_int(c, "ctx"), s->gen = kvb_case_int(c, "gen");
    s->L = (int64_t)s->ctx + s->gen + 1;
    s->budget = kvb_case_int(c, "budget"), s->all = kvb_case_int(c, "all");
    s->role = strcmp(kvb_case_enum(c, "role"), "filter") ? OMNIKV_ROLE_SPARSE : OMNIKV_ROLE_FILTER;
    int rc = block_check(s->m, s->B, s->L, (int)s->L, NULL, "decode_step");
    return rc ? rc : METHODS[s->method]->shape(c, s);
}

/* role, budget, rank and hit: step_scopes */
static int validate_step(const kvb_case *c)
{
    step_case s;
    return case_of(c, &s);
}

static kvb_tensor *weight(kvb_run *r, const char *name, int64_t out, int64_t in)
{
    kvb_tensor *t = step_tensor(r, name, KVB_BF16, 2, out, in, 0, 0, KVB_IN);
    kvb_fill_bf16_normal(t->h, t->n, r->seed, kvb_stream_of(name), 0, 0, 1.0 / sqrt((double)in));
    t->flags |= KVB_T_NO_DUMP;
    return t;
}

static block_weights host_weights(kvb_run *r)
{
    return (block_weights){kvb_run_find(r, "norm1")->h, kvb_run_find(r, "norm2")->h,     kvb_run_find(r, "w_qkv")->h,
                           kvb_run_find(r, "w_o")->h,   kvb_run_find(r, "w_gate_up")->h, kvb_run_find(r, "w_down")->h};
}

/* y's reference: the method's attention from q, knew, vnew, then the block's second half */
static int ref_rest(kvb_run *r, step_priv *p, const kvb_bf16 *q, const kvb_bf16 *knew, const kvb_bf16 *vnew)
{
    int rc = p->method->ref_attend(r, p, q, knew, vnew, p->att);
    if (rc) return rc;
    const block_weights w = host_weights(r);
    return ref_block_post(kvb_run_find(r, "x")->h, &w, p->s.m, p->s.B, p->att, p->seqs, kvb_run_find(r, "y")->ref);
}

static int setup_step(kvb_run *r)
{
    step_priv *p = kvb_run_alloc(r, sizeof *p, "decode_step state");
    r->priv = p;
    int rc = case_of(r->c, &p->s);
    if (rc) return rc;
    p->method = METHODS[p->s.method];
    const block_preset *m = p->s.m;
    const int B = p->s.B, H = m->hidden, max_pos = (int)p->s.L;
    kvb_tensor *x = step_tensor(r, "x", KVB_BF16, 2, B, H, 0, 0, KVB_IN);
    kvb_fill_bf16_normal(x->h, x->n, r->seed, kvb_stream_of("x"), 0, 0, 1);
    kvb_tensor *n1 = step_tensor(r, "norm1", KVB_BF16, 1, H, 0, 0, 0, KVB_IN);
    kvb_tensor *n2 = step_tensor(r, "norm2", KVB_BF16, 1, H, 0, 0, 0, KVB_IN);
    kvb_fill_bf16_normal(n1->h, H, r->seed, kvb_stream_of("norm1"), 0, 1, 0.1);
    kvb_fill_bf16_normal(n2->h, H, r->seed, kvb_stream_of("norm2"), 0, 1, 0.1);
    weight(r, "w_qkv", (int64_t)(m->Hq + 2 * m->Hkv) * m->D, H);
    weight(r, "w_o", H, (int64_t)m->Hq * m->D);
    weight(r, "w_gate_up", 2 * (int64_t)m->ffn, H);
    weight(r, "w_down", H, m->ffn);
    kvb_tensor *cs = step_tensor(r, "cos_sin", KVB_BF16, 2, max_pos, m->D, 0, 0, KVB_IN);
    cs->flags |= KVB_T_NO_DUMP;
    if ((rc = rope_table(cs->h, max_pos, m->D, m->theta, ROPE_LLAMA))) return rc;
    kvb_tensor *pos = step_tensor(r, "pos", KVB_I32, 1, B, 0, 0, 0, KVB_IN);
    step_fill_ints(pos, max_pos - 1);
    kvb_tensor *q = step_tensor(r, "q", KVB_BF16, 3, B, m->Hq, m->D, 0, KVB_OUT);
    kvb_tensor *kn = step_tensor(r, "knew", KVB_BF16, 3, B, m->Hkv, m->D, 0, KVB_OUT);
    kvb_tensor *vn = step_tensor(r, "vnew", KVB_BF16, 3, B, m->Hkv, m->D, 0, KVB_OUT);
    kvb_tensor *y = step_tensor(r, "y", KVB_BF16, 2, B, H, 0, 0, KVB_OUT);
    size_t scratch = 1;
#if KVB_HAVE_CUDA
    if (kvb_gpu_available()) scratch = block_scratch_bytes(m, B);
#endif
    step_tensor(r, "scratch", KVB_U8, 1, (int64_t)scratch, 0, 0, 0, KVB_SCRATCH);
    if ((rc = p->method->setup(r, p))) return rc;

    /* a sequence's reference: its weights' multiply-adds and its attention over at most pos + 1 tokens */
    const double per_seq = (double)block_weight_elems(m) + 2.0 * m->Hq * m->D * (double)p->s.L;
    int64_t chosen;
    p->seqs = kvb_sample_slices(B, per_seq, 2 * KVB_REF_BUDGET, &chosen);
    y->slice_len = H;
    y->slice_mask = p->seqs;
    if (p->seqs) {
        p->kv_slices = kvb_run_alloc(r, (size_t)B * m->Hkv, "the sampled sequences' kv heads");
        for (int i = 0; i < B * m->Hkv; i++) p->kv_slices[i] = p->seqs[i / m->Hkv];
        const size_t used = strlen(r->note);
        snprintf(r->note + used, sizeof r->note - used, "%sreference of y on %lld of %d sequences", used ? "; " : "",
                 (long long)chosen, B);
    }
    p->att = kvb_run_alloc(r, sizeof(kvb_bf16) * (size_t)B * m->Hq * m->D, "the reference attention");
    const block_weights w = host_weights(r);
    if ((rc = ref_block_pre(x->h, &w, m, B, pos->h, cs->h, max_pos, q->ref, kn->ref, vn->ref))) return rc;
    if (kvb_gpu_available()) {
        /* y's reference and the state's are computed before each comparison from the device's own q, knew,
         * vnew (ref_from_out_step): one from the host's here would never be read. Until then: NaN. */
        for (size_t i = 0; i < (size_t)y->n; i++) ((kvb_bf16 *)y->ref)[i] = KVB_BF16_NAN;
        return KVB_OK;
    }
    if (p->method->host_prefill && (rc = p->method->host_prefill(r, p, q->ref))) return rc;
    return ref_rest(r, p, q->ref, kn->ref, vn->ref);
}

/* The device outputs the reference is computed from (q, knew, vnew and the method's device_choice), one
 * after the other: *bytes in all, copied into buf when buf is not NULL. */
static size_t reference_inputs(kvb_run *r, const step_priv *p, char *buf)
{
    const char *names[4] = {"q", "knew", "vnew", p->method->device_choice};
    size_t at = 0;
    for (int i = 0; i < 4 && names[i]; i++) {
        const kvb_tensor *t = kvb_run_find(r, names[i]);
        const size_t bytes = (size_t)t->n * kvb_dtype_size(t->dtype);
        if (buf) memcpy(buf + at, t->out, bytes);
        at += bytes;
    }
    return at;
}

/* Before each comparison: the attention path and y from the device's own q, knew, vnew. */
static int ref_from_out_step(kvb_run *r)
{
    step_priv *p = r->priv;
    const kvb_tensor *q = kvb_run_find(r, "q"), *kn = kvb_run_find(r, "knew"), *vn = kvb_run_find(r, "vnew");
    if (!q->out) return KVB_OK;
    /* q, knew, vnew are judged against the host's (independent of the device): when one fails, so does the
     * verdict, whatever y's reference; one from them would mean nothing (and outputs of zeros cost no
     * reference) */
    const kvb_tensor *first_half[3] = {q, kn, vn};
    for (int i = 0; i < 3; i++) {
        kvb_cmp_result res;
        kvb_run_compare_tensor(r, first_half[i], &res);
        if (!res.pass)
            return kvb_fail(KVB_EINVAL, "%s differs from its reference (its comparison says where): y and the "
                            "state are not judged from it", first_half[i]->name);
    }
    /* the same device outputs as at the last comparison (the launch after timing repeats the one before
     * it): the same reference, already computed */
    const size_t bytes = reference_inputs(r, p, NULL);
    if (!p->last_inputs) p->last_inputs = kvb_run_alloc(r, bytes, "the reference's device inputs");
    char *now = kvb_run_alloc(r, bytes, "the reference's device inputs");
    reference_inputs(r, p, now);
    const int same = p->last_valid && !memcmp(now, p->last_inputs, bytes);
    memcpy(p->last_inputs, now, bytes);
    kvb_run_free(r, now);
    if (same) return KVB_OK;
    p->last_valid = 0;
    p->from_device = 1;
    const int rc = ref_rest(r, p, q->out, kn->out, vn->out);
    p->from_device = 0;
    p->last_valid = rc == KVB_OK;
    return rc;
}

#if KVB_HAVE_CUDA
static int gpu_setup_step(kvb_run *r)
{
    step_priv *p = r->priv;
    int rc = block_cublas_create(&p->cublas, &p->cublas_ws);
    if (rc || (p->method->gpu_prefill && (rc = p->method->gpu_prefill(r, p)))) return rc;
    if (p->method->gpu_prefill_q && (rc = p->method->gpu_prefill_q(r, p, kvb_run_find(r, "q")->ref))) return rc;
    block_buffers b = {
        .x = step_dev(r, "x"),
        .w = {step_dev(r, "norm1"), step_dev(r, "norm2"), step_dev(r, "w_qkv"), step_dev(r, "w_o"),
              step_dev(r, "w_gate_up"), step_dev(r, "w_down")},
        .cos_sin = step_dev(r, "cos_sin"),
        .pos = step_dev(r, "pos"), .pos_host = kvb_run_find(r, "pos")->h,
        .q = step_dev(r, "q"), .knew = step_dev(r, "knew"), .vnew = step_dev(r, "vnew"),
        .y = step_dev(r, "y"), .scratch = step_dev(r, "scratch"), .cublas = p->cublas,
    };
    if (!p->method->attention) { /* dense: the block's own stages over K, V */
        b.len = step_dev(r, "len"), b.len_host = kvb_run_find(r, "len")->h;
        b.K = step_dev(r, "K"), b.V = step_dev(r, "V"), b.attn_ws = step_dev(r, "attn_ws");
    }
    for (int timed = 0; timed < 2; timed++) {
        b.attn = NULL;
        if (p->method->attention) {
            if ((rc = p->method->attention(r, p, timed, &p->attn[timed]))) return rc;
            b.attn = &p->attn[timed];
        }
        rc = block_step_plan_make(timed ? &p->plan_timed : &p->plan, r->c->id, p->s.m, p->s.B, p->s.L, (int)p->s.L, &b,
                                  r->stream, r->stream2, timed);
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

static void extra(kvb_cost *c, const char *name, double v)
{
    if (c->n_extra >= 8) return;
    snprintf(c->extra_name[c->n_extra], sizeof c->extra_name[0], "%s", name);
    c->extra_value[c->n_extra++] = v;
}

/* The step's bound (kernels/step/NOTES.md): the weights and the method's attention bytes each read once
 * at the read ceiling (x, y and the intermediates are a few hundred KB); host bytes overlap with them.
 * Goal: the step within 1.2x of it. Also reported: the state each sequence keeps for one layer (device, host), the
 * largest batch whose state for every layer fits the device's memory beside the whole model's block
 * weights (embeddings and the LM head left out), and the decode throughput projected to the model
 * (B / (step time x layers), as the ShadowKV paper projects one measured block). */
static void cost_step(const kvb_run *r, kvb_cost *c)
{
    step_priv *p = r->priv;
    const block_preset *m = p->s.m;
    const double weights = 2.0 * (double)block_weight_elems(m);
    double dev = 0, host = 0, flops = 0;
    p->method->bytes(r, p, &dev, &host, &flops);
    c->bytes_dev = weights + dev + 2.0 * 2.0 * p->s.B * m->hidden;
    c->bytes_h2d = host;
    c->flops = 2.0 * p->s.B * (double)block_weight_elems(m) + flops;
    c->ceiling = KVB_CEIL_READ;
    if (host > 0) { /* offload: the weights, then the device's bytes and the host's overlapped */
        c->ceiling = KVB_CEIL_READ_H2D;
        c->bytes_dev_serial = weights;
    }
    if (r->ceil && r->ceil->measured) {
        c->goal_us = 1.2 * kvb_ceiling_seconds(c, r->ceil) * 1e6;
        c->goal_text = "1.2x the bound";
    }
    c->tokens = p->s.B, c->layers = m->layers;
    double state_dev = 0, state_host = 0;
    p->method->state_bytes(&p->s, &state_dev, &state_host);
    extra(c, "state_bytes_per_seq", state_dev);
    if (state_host > 0) extra(c, "host_bytes_per_seq", state_host);
    extra(c, "model_weight_bytes", weights * m->layers);
    kvb_device_info info;
    if (kvb_gpu_available() && kvb_gpu_info(&info) == KVB_OK && info.mem_bytes > 0)
        extra(c, "max_batch_device", floor(((double)info.mem_bytes - weights * m->layers) / (state_dev * m->layers)));
    const double host_mem = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGE_SIZE);
    if (state_host > 0 && host_mem > 0) extra(c, "max_batch_host", floor(host_mem / (state_host * m->layers)));
    /* omnikv: how many of the model's layers take this case's role, and how many are dense (the model's
     * step is composed from them); a model without OmniKV's roles (not 32 layers) reports none */
    int dense_layers, filter_layers, sparse_layers;
    if (p->method == &step_method_omnikv && m->layers == OMNIKV_LAYERS &&
        omnikv_role_counts(m->layers, &dense_layers, &filter_layers, &sparse_layers) == KVB_OK) {
        extra(c, "role_layers", p->s.role == OMNIKV_ROLE_FILTER ? filter_layers : sparse_layers);
        extra(c, "dense_layers", dense_layers);
    }
}

static void teardown_step(kvb_run *r)
{
    step_priv *p = r->priv;
    if (!p) return;
#if KVB_HAVE_CUDA
    if (p->planned & 1) block_step_plan_destroy(&p->plan);
    if (p->planned & 2) block_step_plan_destroy(&p->plan_timed);
    if (p->method && p->method->destroy) p->method->destroy(p);
    block_cublas_destroy(p->cublas, p->cublas_ws);
#endif
    if (p->method && p->method->teardown) p->method->teardown(p);
    kvb_xfree(p->seqs);
    r->priv = NULL;
}

/* shadowkv's values live in the suite's pinned host pool */
static size_t pool_bytes_step(const kvb_case *c)
{
    step_case s;
    if (case_of(c, &s) || METHODS[s.method] != &step_method_shadowkv) return 0;
    const gather_layout *g = &s.skv.L.g;
    return kvb_host_bytes_sat((double)g->B * g->Hkv * (double)g->host_stride * (double)gather_chunk_bytes(g));
}

/* The block: x, the norms, the weights, the RoPE table, pos in; q, knew, vnew, y out; the samples and the
 * reference attention; ref_block_pre's and ref_block_post's scratch. Then the method's share (its
 * host_bytes); a method without one is not estimated (0). */
static size_t host_bytes_step(const kvb_case *c)
{
    step_case s;
    if (case_of(c, &s) || !METHODS[s.method]->host_bytes) return 0;
    const block_preset *m = s.m;
    const double B = s.B, H = m->hidden, F = m->ffn, qd = (double)m->Hq * m->D, kvd = (double)m->Hkv * m->D;
    const double nqkv = qd + 2 * kvd, widest = H > F ? (H > qd ? H : qd) : (F > qd ? F : qd);
    const double in = B * H * 2 + 2 * H * 2 + 2.0 * (double)block_weight_elems(m) + (double)s.L * m->D * 2 + 4 * B;
    const double out = B * (qd + 2 * kvd + H) * 2;
    const double scratch = B + B * m->Hkv + B * qd * 2 + B * (H + nqkv) * 2 + (2 * H + 3 * F) * 2 + widest * 8;
    return kvb_host_bytes_sat(KVB_HOLD_IN * in + KVB_HOLD_OUT * out + scratch + METHODS[s.method]->host_bytes(&s));
}

static const kvb_impl step_impls[] = {
    {"kernel", NULL, 0, "the block's stages captured once as a CUDA graph and replayed"},
    {"eager", NULL, 0, "the same stages enqueued one by one"},
};

const kvb_op op_decode_step = {
    .name = "decode_step",
    .family = "step_block",
    .summary = "one transformer block decoding one token for B sequences, end to end, per method (dense, rocketkv, "
               "minikv, shadowkv, omnikv)",
    .params = step_params,
    .n_params = NPARAMS(step_params),
    KVB_SCOPES(step_scopes),
    .tol = {2e-2, 2e-2, 1e-2},
    .validate = validate_step,
    .host_pool_bytes = pool_bytes_step,
    .host_bytes = host_bytes_step,
    .setup = setup_step,
    .gpu_setup = gpu_setup_step,
    .launch = launch_step,
    KVB_IMPLS(step_impls),
    .cost = cost_step,
    .teardown = teardown_step,
    .ref_from_out = ref_from_out_step,
    .stage_times = stage_times_step,
};
