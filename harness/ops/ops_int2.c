/* ops_int2.c: the INT2 KV cache in the harness: quantize, append, the kernel-native layout and the two
 * dequant-matmuls (int2_decode_attn: ops_int2_decode.c; shared helpers and the input distributions:
 * ops_int2.h; the contract: kernels/int2/NOTES.md).
 *
 * Kernels:
 *   int2_quantize     keys and values of a T-token prompt into a fresh cache (Tcap = T); codes and fp16
 *                     metadata compared bit-exact
 *   int2_append       one decode step's append to the residual, with the flush (quantize 128 tokens
 *                     and append them) when the residual reaches 128 tokens; the whole cache compared
 *                     bit-exact after the step
 *   int2_qk, int2_av  the two dequant-matmuls; tolerance |out - ref| <= 1e-3 * sum_k |a_k| (|c_k s_k| + |z_k|) + 1e-5
 *                     per element (the reference returns the magnitude), rel L2 1e-3
 *   int2_qk_native, int2_av_native  the two over the kernel-native layout (Rec, Km converted by the
 *                     reference from the interchange cache), against the same references and tolerances
 *   int2_native       the cache in int2_decode_attn's kernel-native layout, written on the device from
 *                     the interchange cache (int2_to_native), bit-exact against ref_int2_to_native
 *   int2_quantize_native  keys and values of a T-token prompt quantized straight into the native layout
 *                     (int2_quantize_native; Tcap = T, a multiple of max(64, gs)), bit-exact against
 *                     ref_int2_quantize_keys/values then ref_int2_to_native
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness/core/ceilings.h"
#include "harness/ops/ops.h"
#include "harness/ops/ops_int2.h"
#include "harness/core/progress.h"
#if KVB_HAVE_CUDA
#include "kernels/int2/int2.h"
#endif

static const kvb_param quantize_params[] = {K_B, K_HKV, K_D, K_GS, K_T, K_DIST, K_SEED};
static const kvb_param append_params[] = {
    K_B, K_HKV, K_D, K_GS, {"T", KVB_P_INT, 1024, 0, INT2_MAX_TCAP, NULL, "quantized tokens before the step"},
    {"R", KVB_P_INT, 127, 0, 1024, NULL, "residual tokens before the step (the step flushes at R + 1 = 128)"},
    K_DIST, K_SEED,
};
static const kvb_param matmul_params[] = {K_B, K_HQ, K_HKV, K_D, K_GS, K_T, K_DIST, K_SEED};

int int2_op_dist(const kvb_case *c)
{
    static const char *names[] = {"normal", "peaked", "outlier", "spiky", "grid", "nonfinite"};
    const char *d = kvb_case_enum(c, "dist");
    for (int i = 0; i < 6; i++)
        if (!strcmp(d, names[i])) return i;
    return DIST_NORMAL;
}

static int has_key(const kvb_case *c, const char *name)
{
    for (int i = 0; i < c->op->n_params; i++)
        if (!strcmp(c->op->params[i].name, name)) return 1;
    return 0;
}

static int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

int2_layout int2_op_layout(const kvb_case *c)
{
    int2_layout l;
    memset(&l, 0, sizeof l);
    l.B = kvb_case_int(c, "B");
    l.Hkv = kvb_case_int(c, "Hkv");
    l.Hq = has_key(c, "Hq") ? kvb_case_int(c, "Hq") : l.Hkv;
    l.D = kvb_case_int(c, "D");
    l.gs = kvb_case_int(c, "gs");
    l.T = kvb_case_i64(c, "T");
    l.R = has_key(c, "R") ? kvb_case_int(c, "R") : 0;
    const char *op = c->op->name;
    if (!strcmp(op, "int2_quantize") || !strcmp(op, "int2_quantize_native")) l.Tcap = l.T, l.Rcap = 0;
    else if (!strcmp(op, "int2_append")) l.Tcap = l.T + INT2_FLUSH, l.Rcap = INT2_FLUSH + l.gs - 1;
    else l.Tcap = round_up(l.T, 256), l.Rcap = l.R > 0 ? l.R : 1;
    return l;
}

static int need_tokens(const int2_layout *l, const char *who)
{
    if (l->T < 1)
        return kvb_fail(KVB_EINVAL, "%s: T=%lld out of range [gs = %d, %d]: no tokens to quantize", who,
                        (long long)l->T, l->gs, INT2_MAX_TCAP);
    return KVB_OK;
}

static int validate_quantize(const kvb_case *c)
{
    int2_layout l = int2_op_layout(c);
    int rc = int2_layout_check(&l, c->op->name);
    return rc ? rc : need_tokens(&l, c->op->name);
}

static int validate_quantize_native(const kvb_case *c)
{
    int rc = validate_quantize(c);
    if (rc) return rc;
    int2_layout l = int2_op_layout(c);
    const int64_t ch = l.gs > 64 ? l.gs : 64;
    if (l.T % ch)
        return kvb_fail(KVB_EINVAL, "%s: T=%lld is not a multiple of max(64, gs) = %lld (whole native steps and key groups)",
                        c->op->name, (long long)l.T, (long long)ch);
    return KVB_OK;
}

static int validate_append(const kvb_case *c)
{
    int2_layout l = int2_op_layout(c);
    return int2_append_check(&l, c->op->name);
}

static int validate_matmul(const kvb_case *c)
{
    int2_layout l = int2_op_layout(c);
    int rc = int2_attn_check(&l, c->op->name);
    return rc ? rc : need_tokens(&l, c->op->name);
}

/* ---- inputs ---- */

/* Element i of a K or V fill from its normal z (unused by the grid dist). */
static kvb_bf16 kv_element(int64_t i, double z, int64_t n, int D, int dist, uint64_t seed, uint64_t st, int key)
{
    const int64_t d = i % D, t = (i / D) % n;
    double v;
    if (dist == DIST_GRID) {
        if ((key ? d : t) % 7 == 3) v = 1.0;
        else v = 0.5 * floor(7.0 * kvb_uniform01(seed, st, (uint64_t)i));
    } else {
        v = z;
        if (dist == DIST_OUTLIER || dist == DIST_SPIKY) {
            if (key && kvb_hash64(seed ^ (0xC0FFEEull + (uint64_t)d)) % 8 == 0) v = 8.0 * v + 4.0;
            if (!key && kvb_hash64(seed ^ (0xBEEFull + (uint64_t)t)) % 16 == 0) v = 6.0 * v;
        }
        if (dist == DIST_SPIKY && kvb_uniform01(seed, st + 1, (uint64_t)i) < 1.0 / 512) v *= 16.0;
    }
    return kvb_double_to_bf16(v);
}

void int2_op_fill_kv(kvb_bf16 *x, int64_t heads, int64_t n, int D, int dist, uint64_t seed, const char *name, int key)
{
    const uint64_t st = kvb_stream_of(name), k = kvb_sequence_key(seed, st);
    const int64_t total = heads * n * D;
    const double t0 = kvb_wall_now();
    const uint64_t args[7] = {(uint64_t)heads, (uint64_t)n, (uint64_t)D, (uint64_t)dist, seed, st, (uint64_t)key};
    const size_t bytes = sizeof *x * (size_t)total;
    if (!kvb_fill_memo_fetch("int2 kv", args, 7, x, bytes)) { /* a case of the same cache drew it: a copy */
        /* a pair of normals at a time (kvb_normal_pair: element i's normal is kvb_normal01(seed, st, i)) */
#pragma omp parallel for schedule(static)
        for (int64_t j = 0; j < (total + 1) / 2; j++) {
            float z[2];
            kvb_normal_pair(k, (uint64_t)j, &z[0], &z[1]);
            for (int e = 0; e < 2 && 2 * j + e < total; e++)
                x[2 * j + e] = kv_element(2 * j + e, z[e], n, D, dist, seed, st, key);
        }
        if (dist == DIST_NONFINITE && total > 7) x[key ? 5 : 7] = key ? (kvb_bf16)0x7FC0 : (kvb_bf16)0x7F80;
        kvb_fill_memo_keep("int2 kv", args, 7, x, bytes);
    }
    kvb_fill_seconds_add(kvb_wall_now() - t0); /* the case's inputs phase */
}

void int2_op_fill_q(kvb_tensor *q, const kvb_case *c, uint64_t seed)
{
    kvb_fill_bf16_normal(q->h, q->n, seed, kvb_stream_of("q"), 0, 0, int2_op_dist(c) == DIST_PEAKED ? 3.0 : 1.0);
}

/* ---- the cache as tensors ---- */

int2_priv *int2_op_priv_new(kvb_run *r)
{
    int2_priv *p = kvb_run_alloc(r, sizeof *p, "the int2 op's state");
    r->priv = p;
    p->l = int2_op_layout(r->c);
    return p;
}

void int2_op_add_cache(kvb_run *r, const int2_layout *l, int role, int keys, int values, int with_res)
{
    int64_t s[4];
    if (keys) {
        s[0] = l->B, s[1] = l->Hkv, s[2] = l->D, s[3] = l->Tcap / 16;
        kvb_run_tensor(r, "Kq", KVB_U32, 4, s, role)->flags |= KVB_T_ANY_BITS; /* sixteen 2-bit codes a word */
        s[3] = l->Tcap / l->gs;
        kvb_run_tensor(r, "Ks", KVB_FP16, 4, s, role);
        kvb_run_tensor(r, "Kz", KVB_FP16, 4, s, role);
    }
    if (values) {
        s[0] = l->B, s[1] = l->Hkv, s[2] = l->Tcap, s[3] = l->D / 16;
        kvb_run_tensor(r, "Vq", KVB_U32, 4, s, role)->flags |= KVB_T_ANY_BITS;
        s[3] = l->D / l->gs;
        kvb_run_tensor(r, "Vs", KVB_FP16, 4, s, role);
        kvb_run_tensor(r, "Vz", KVB_FP16, 4, s, role);
    }
    if (with_res) {
        s[0] = l->B, s[1] = l->Hkv, s[2] = l->Rcap, s[3] = l->D;
        kvb_run_tensor(r, "Kr", KVB_BF16, 4, s, role);
        kvb_run_tensor(r, "Vr", KVB_BF16, 4, s, role);
    }
    static const char *meta[] = {"Ks", "Kz", "Vs", "Vz"};
    for (int i = 0; i < 4; i++) { /* fp16 metadata is compared bit-exact */
        kvb_tensor *t = kvb_run_find(r, meta[i]);
        if (t && (role == KVB_OUT || role == KVB_INOUT)) t->cmp = KVB_CMP_EXACT;
    }
}

double int2_op_cache_host_bytes(const int2_layout *l, int keys, int values, int with_res)
{
    return (keys ? int2_key_array_bytes(l) : 0) + (values ? int2_value_array_bytes(l) : 0) +
           (with_res ? int2_res_array_bytes(l) : 0);
}

static void *ptr_of(kvb_run *r, const char *name, int device, int ref)
{
    kvb_tensor *t = kvb_run_find(r, name);
    if (!t) return NULL;
    return device ? t->d : ref && t->ref ? t->ref : t->h;
}

int2_cache int2_op_cache(kvb_run *r, int device, int ref)
{
    int2_cache c;
    c.Kq = ptr_of(r, "Kq", device, ref), c.Ks = ptr_of(r, "Ks", device, ref), c.Kz = ptr_of(r, "Kz", device, ref);
    c.Vq = ptr_of(r, "Vq", device, ref), c.Vs = ptr_of(r, "Vs", device, ref), c.Vz = ptr_of(r, "Vz", device, ref);
    c.Kr = ptr_of(r, "Kr", device, ref), c.Vr = ptr_of(r, "Vr", device, ref);
    return c;
}

/* The cache past T: NaN metadata and all-ones codes (a read there that is not masked fails). */
static void poison_tail(int2_cache *c, const int2_layout *l)
{
    const int64_t heads = (int64_t)l->B * l->Hkv;
    for (int64_t h = 0; h < heads; h++) {
        if (c->Kq)
            for (int d = 0; d < l->D; d++) {
                int64_t row = h * l->D + d;
                for (int64_t w = l->T / 16; w < l->Tcap / 16; w++) c->Kq[row * (l->Tcap / 16) + w] = 0xFFFFFFFFu;
                for (int64_t g = l->T / l->gs; g < l->Tcap / l->gs; g++)
                    c->Ks[row * (l->Tcap / l->gs) + g] = c->Kz[row * (l->Tcap / l->gs) + g] = 0x7E00;
            }
        if (c->Vq)
            for (int64_t t = l->T; t < l->Tcap; t++) {
                int64_t row = h * l->Tcap + t;
                for (int w = 0; w < l->D / 16; w++) c->Vq[row * (l->D / 16) + w] = 0xFFFFFFFFu;
                for (int g = 0; g < l->D / l->gs; g++) c->Vs[row * (l->D / l->gs) + g] = c->Vz[row * (l->D / l->gs) + g] = 0x7E00;
            }
    }
}

int int2_op_quantize_into(int2_cache *c, const int2_layout *l, const kvb_bf16 *Ksrc, const kvb_bf16 *Vsrc, int64_t n_src)
{
    int rc = KVB_OK;
    if (c->Kq && (rc = ref_int2_quantize_keys(Ksrc, n_src, l->T, 0, c->Kq, c->Ks, c->Kz, l))) return rc;
    if (c->Vq && (rc = ref_int2_quantize_values(Vsrc, n_src, l->T, 0, c->Vq, c->Vs, c->Vz, l))) return rc;
    poison_tail(c, l);
    return KVB_OK;
}

void int2_op_fill_residual(int2_cache *c, const int2_layout *l, const kvb_bf16 *Ksrc, const kvb_bf16 *Vsrc,
                           int64_t n_src, uint64_t seed)
{
    const int64_t heads = (int64_t)l->B * l->Hkv;
    kvb_fill_bf16_normal(c->Kr, heads * l->Rcap * l->D, seed, kvb_stream_of("Kr_spare"), 0, 0, 1);
    kvb_fill_bf16_normal(c->Vr, heads * l->Rcap * l->D, seed, kvb_stream_of("Vr_spare"), 0, 0, 1);
    for (int64_t h = 0; h < heads; h++)
        for (int t = 0; t < l->R; t++) {
            memcpy(c->Kr + (h * l->Rcap + t) * l->D, Ksrc + (h * n_src + l->T + t) * l->D, sizeof(kvb_bf16) * (size_t)l->D);
            memcpy(c->Vr + (h * l->Rcap + t) * l->D, Vsrc + (h * n_src + l->T + t) * l->D, sizeof(kvb_bf16) * (size_t)l->D);
        }
}

void int2_op_sample_slices(kvb_run *r, int2_priv *p, double work_per_slice, const char **names, int n_names,
                           const int64_t *slice_lens)
{
    int64_t chosen, n = (int64_t)p->l.B * p->l.Hkv;
    p->mask = kvb_sample_slices(n, work_per_slice, KVB_REF_BUDGET, &chosen);
    for (int i = 0; i < n_names; i++) {
        kvb_tensor *t = kvb_run_find(r, names[i]);
        t->slice_len = slice_lens[i];
        t->slice_mask = p->mask;
    }
    if (p->mask)
        snprintf(r->note, sizeof r->note, "reference on %lld of %lld (b, kv head) slices (first, last, evenly spaced)",
                 (long long)chosen, (long long)n);
}

/* ---- int2_quantize ---- */

/* The prompt's keys and values, inputs K, V [B, Hkv, T, D] bf16 from the case's distribution. */
static void add_prompt(kvb_run *r, const int2_layout *l, kvb_tensor **K, kvb_tensor **V)
{
    int64_t s[4] = {l->B, l->Hkv, l->T, l->D};
    *K = kvb_run_tensor(r, "K", KVB_BF16, 4, s, KVB_IN);
    *V = kvb_run_tensor(r, "V", KVB_BF16, 4, s, KVB_IN);
    const int dist = int2_op_dist(r->c);
    int2_op_fill_kv((*K)->h, (int64_t)l->B * l->Hkv, l->T, l->D, dist, r->seed, "K", 1);
    int2_op_fill_kv((*V)->h, (int64_t)l->B * l->Hkv, l->T, l->D, dist, r->seed, "V", 0);
}

static int setup_quantize(kvb_run *r)
{
    int2_priv *p = int2_op_priv_new(r);
    const int2_layout *l = &p->l;
    kvb_tensor *K, *V;
    add_prompt(r, l, &K, &V);
    int2_op_add_cache(r, l, KVB_OUT, 1, 1, 0);
    const char *names[6] = {"Kq", "Ks", "Kz", "Vq", "Vs", "Vz"};
    const int64_t lens[6] = {l->D * (l->T / 16), l->D * (l->T / l->gs), l->D * (l->T / l->gs), l->T * (l->D / 16),
                             l->T * (l->D / l->gs), l->T * (l->D / l->gs)};
    int2_op_sample_slices(r, p, 2.0 * (double)l->T * l->D * 4, names, 6, lens);
    int2_cache c = int2_op_cache(r, 0, 1);
    if (!p->mask) { /* every slice: one call (a call a slice would start the threads once a slice) */
        int rc = ref_int2_quantize_keys(K->h, l->T, l->T, 0, c.Kq, c.Ks, c.Kz, l);
        return rc ? rc : ref_int2_quantize_values(V->h, l->T, l->T, 0, c.Vq, c.Vs, c.Vz, l);
    }
    /* the reference on each chosen (b, h) slice: a one-head layout over that slice's arrays */
    int2_layout one = *l;
    one.B = one.Hkv = 1;
    for (int64_t h = 0; h < (int64_t)l->B * l->Hkv; h++) {
        if (!p->mask[h]) continue;
        const kvb_bf16 *ks = (const kvb_bf16 *)K->h + h * l->T * l->D, *vs = (const kvb_bf16 *)V->h + h * l->T * l->D;
        int rc = ref_int2_quantize_keys(ks, l->T, l->T, 0, c.Kq + h * lens[0], c.Ks + h * lens[1], c.Kz + h * lens[2], &one);
        if (!rc) rc = ref_int2_quantize_values(vs, l->T, l->T, 0, c.Vq + h * lens[3], c.Vs + h * lens[4], c.Vz + h * lens[5], &one);
        if (rc) {
            if (l->B * l->Hkv > 1) { /* name the (b, h) of the whole tensor */
                char msg[512];
                snprintf(msg, sizeof msg, "%s (in (b, h) = (%lld, %lld))", kvb_last_error(), (long long)(h / l->Hkv),
                         (long long)(h % l->Hkv));
                return kvb_fail(rc, "%s", msg);
            }
            return rc;
        }
    }
    return KVB_OK;
}

static int launch_quantize(kvb_run *r)
{
#if KVB_HAVE_CUDA
    const int2_layout *l = &((int2_priv *)r->priv)->l;
    int2_cache c = int2_op_cache(r, 1, 0);
    int rc = int2_quantize_keys(kvb_run_find(r, "K")->d, l->T, l->T, 0, &c, l, r->stream);
    return rc ? rc : int2_quantize_values(kvb_run_find(r, "V")->d, l->T, l->T, 0, &c, l, r->stream);
#else
    (void)r;
    return KVB_EDEVICE;
#endif
}

/* Goal (kernels/int2/NOTES.md): >= 70% of the device copy rate on bf16 in + codes and metadata out. */
static void cost_quantize(const kvb_run *r, kvb_cost *c)
{
    const int2_layout *l = &((const int2_priv *)r->priv)->l;
    const double heads = (double)l->B * l->Hkv, el = heads * (double)l->T * l->D;
    c->bytes_dev = 2.0 * (2.0 * el + el / 4.0 + 2.0 * 2.0 * el / l->gs);
    c->ceiling = KVB_CEIL_D2D;
    if (r->ceil && r->ceil->measured) {
        c->goal_us = kvb_d2d_contiguous_seconds((size_t)(c->bytes_dev / 2) & ~(size_t)15) * 1e6 / 0.7;
        c->goal_text = "70% of the device copy rate";
    }
}

/* ---- int2_append ---- */

static int setup_append(kvb_run *r)
{
    int2_priv *p = int2_op_priv_new(r);
    const int2_layout *l = &p->l;
    const int64_t heads = (int64_t)l->B * l->Hkv, n_src = l->T + l->R;
    const int dist = int2_op_dist(r->c);
    int2_op_add_cache(r, l, KVB_INOUT, 1, 1, 1);
    int64_t s[3] = {l->B, l->Hkv, l->D};
    kvb_tensor *kn = kvb_run_tensor(r, "knew", KVB_BF16, 3, s, KVB_IN);
    kvb_tensor *vn = kvb_run_tensor(r, "vnew", KVB_BF16, 3, s, KVB_IN);
    const size_t src_bytes = sizeof(kvb_bf16) * (size_t)(heads * (n_src + 1) * l->D);
    kvb_bf16 *Ksrc = kvb_run_alloc(r, src_bytes, "the source keys");
    kvb_bf16 *Vsrc = kvb_run_alloc(r, src_bytes, "the source values");
    int2_op_fill_kv(Ksrc, heads, n_src + 1, l->D, dist, r->seed, "K", 1);
    int2_op_fill_kv(Vsrc, heads, n_src + 1, l->D, dist, r->seed, "V", 0);
    for (int64_t h = 0; h < heads; h++) { /* the new token: source token T + R */
        memcpy((kvb_bf16 *)kn->h + h * l->D, Ksrc + (h * (n_src + 1) + n_src) * l->D, sizeof(kvb_bf16) * (size_t)l->D);
        memcpy((kvb_bf16 *)vn->h + h * l->D, Vsrc + (h * (n_src + 1) + n_src) * l->D, sizeof(kvb_bf16) * (size_t)l->D);
    }
    int2_cache c = int2_op_cache(r, 0, 0);
    int rc = int2_op_quantize_into(&c, l, Ksrc, Vsrc, n_src + 1);
    if (!rc) int2_op_fill_residual(&c, l, Ksrc, Vsrc, n_src + 1, r->seed);
    kvb_run_free(r, Ksrc), kvb_run_free(r, Vsrc);
    if (rc) return rc;
    for (int i = 0; i < r->nt; i++) /* reference = the state before the step, then the step */
        if (r->t[i].role == KVB_INOUT) memcpy(r->t[i].ref, r->t[i].h, (size_t)r->t[i].n * kvb_dtype_size(r->t[i].dtype));
    int2_cache cr = int2_op_cache(r, 0, 1);
    if ((rc = ref_int2_append(&cr, kn->h, vn->h, l, &p->T_after, &p->R_after))) return rc;
    snprintf(r->note, sizeof r->note, "T %lld -> %lld, R %d -> %d%s", (long long)l->T, (long long)p->T_after, l->R,
             p->R_after, p->T_after != l->T ? " (flush: 128 tokens quantized and appended)" : "");
    return KVB_OK;
}

static int launch_append(kvb_run *r)
{
#if KVB_HAVE_CUDA
    int2_cache c = int2_op_cache(r, 1, 0);
    return int2_append(&c, kvb_run_find(r, "knew")->d, kvb_run_find(r, "vnew")->d, &((int2_priv *)r->priv)->l, r->stream);
#else
    (void)r;
    return KVB_EDEVICE;
#endif
}

static void cost_append(const kvb_run *r, kvb_cost *c)
{
    const int2_priv *p = r->priv;
    const int2_layout *l = &p->l;
    const double heads = (double)l->B * l->Hkv;
    c->bytes_dev = heads * 4.0 * l->D * 2.0; /* the new K and V rows: read, written into the residual */
    if (p->T_after != l->T) {                 /* flush: 128 rows read, codes and metadata written, rest moved */
        const double el = heads * INT2_FLUSH * l->D;
        c->bytes_dev += 2.0 * (2.0 * el + el / 4.0 + 2.0 * 2.0 * el / l->gs) + heads * 2.0 * 2.0 * 2.0 * p->R_after * l->D;
    }
    c->ceiling = KVB_CEIL_D2D;
}

/* ---- int2_qk, int2_av (and over the native layout) ---- */

int int2_op_add_native_copy(kvb_run *r, const int2_layout *l)
{
    int64_t s1[1] = {int2_native_rec_elems(l)};
    int2_native n;
    n.Rec = kvb_run_tensor(r, "Rec", KVB_U32, 1, s1, KVB_IN)->h;
    s1[0] = int2_native_km_elems(l);
    n.Km = kvb_run_tensor(r, "Km", KVB_FP16, 1, s1, KVB_IN)->h;
    int2_cache c = int2_op_cache(r, 0, 0); /* the tensor table may have moved */
    return ref_int2_to_native(&c, &n, l);
}

/* A cache of T quantized tokens (and nothing in the residual) from seeded sources. */
static int setup_cache_only(kvb_run *r, int2_priv *p, int keys, int values)
{
    const int2_layout *l = &p->l;
    const int64_t heads = (int64_t)l->B * l->Hkv;
    int2_op_add_cache(r, l, KVB_IN, keys, values, 0);
    kvb_bf16 *src = kvb_run_alloc(r, sizeof(kvb_bf16) * (size_t)(heads * l->T * l->D),
                                  keys ? "the source keys" : "the source values");
    int2_op_fill_kv(src, heads, l->T, l->D, int2_op_dist(r->c), r->seed, keys ? "K" : "V", keys);
    int2_cache c = int2_op_cache(r, 0, 0);
    int rc = int2_op_quantize_into(&c, l, src, src, l->T);
    kvb_run_free(r, src);
    return rc;
}

/* native: the converter needs both halves of the cache (the keys' source fills both) */
static int setup_qk_of(kvb_run *r, int native)
{
    int2_priv *p = int2_op_priv_new(r);
    const int2_layout *l = &p->l;
    const int G = l->Hq / l->Hkv;
    int rc = setup_cache_only(r, p, 1, native);
    if (rc) return rc;
    int64_t sq[3] = {l->B, l->Hq, l->D}, ss[3] = {l->B, l->Hq, l->T};
    kvb_tensor *q = kvb_run_tensor(r, "q", KVB_BF16, 3, sq, KVB_IN);
    kvb_tensor *sc = kvb_run_tensor(r, "scores", KVB_FP32, 3, ss, KVB_OUT);
    int2_op_fill_q(q, r->c, r->seed);
    p->mag = kvb_run_alloc(r, sizeof(double) * (size_t)sc->n, "the scores' tolerance magnitudes");
    sc->tol_mag = p->mag;
    const char *names[1] = {"scores"};
    const int64_t lens[1] = {(int64_t)G * l->T};
    int2_op_sample_slices(r, p, (double)G * l->T * l->D * 4, names, 1, lens);
    if (native && (rc = int2_op_add_native_copy(r, l))) return rc;
    int2_cache c = int2_op_cache(r, 0, 0);
    q = kvb_run_find(r, "q"), sc = kvb_run_find(r, "scores"); /* the tensor table may have moved */
    return ref_int2_qk(q->h, &c, sc->ref, p->mag, l, p->mask);
}
static int setup_qk(kvb_run *r) { return setup_qk_of(r, 0); }
static int setup_qk_native(kvb_run *r) { return setup_qk_of(r, 1); }

static int launch_qk(kvb_run *r)
{
#if KVB_HAVE_CUDA
    int2_cache c = int2_op_cache(r, 1, 0);
    return int2_qk(kvb_run_find(r, "q")->d, &c, kvb_run_find(r, "scores")->d, &((int2_priv *)r->priv)->l, r->stream);
#else
    (void)r;
    return KVB_EDEVICE;
#endif
}

static int launch_qk_native(kvb_run *r)
{
#if KVB_HAVE_CUDA
    int2_native n = {kvb_run_find(r, "Rec")->d, kvb_run_find(r, "Km")->d};
    return int2_qk_native(kvb_run_find(r, "q")->d, &n, kvb_run_find(r, "scores")->d, &((int2_priv *)r->priv)->l,
                          r->stream);
#else
    (void)r;
    return KVB_EDEVICE;
#endif
}

static void cost_qk(const kvb_run *r, kvb_cost *c)
{
    const int2_layout *l = &((const int2_priv *)r->priv)->l;
    const double heads = (double)l->B * l->Hkv, el = heads * (double)l->T * l->D;
    c->bytes_dev = el / 4.0 + 2.0 * 2.0 * el / l->gs + 2.0 * l->B * l->Hq * l->D + 4.0 * l->B * l->Hq * (double)l->T;
    c->flops = 2.0 * l->B * l->Hq * (double)l->T * l->D;
    c->ceiling = KVB_CEIL_READ; /* read-mostly: the scores written are a third of the bytes */
}

static int setup_av_of(kvb_run *r, int native)
{
    int2_priv *p = int2_op_priv_new(r);
    const int2_layout *l = &p->l;
    const int G = l->Hq / l->Hkv;
    int rc = setup_cache_only(r, p, native, 1);
    if (rc) return rc;
    int64_t sp[3] = {l->B, l->Hq, l->T}, so[3] = {l->B, l->Hq, l->D};
    kvb_tensor *pt = kvb_run_tensor(r, "p", KVB_FP32, 3, sp, KVB_IN);
    kvb_tensor *out = kvb_run_tensor(r, "out", KVB_FP32, 3, so, KVB_OUT);
    /* p: a softmax over T of seeded logits (std 1, or 3 for dist=peaked) per query head */
    kvb_fill_f32_normal(pt->h, pt->n, r->seed, kvb_stream_of("logits"), 0, 0, int2_op_dist(r->c) == DIST_PEAKED ? 3.0 : 1.0);
    const int64_t rows = (int64_t)l->B * l->Hq;
#pragma omp parallel for schedule(static)
    for (int64_t row = 0; row < rows; row++) {
        float *x = (float *)pt->h + row * l->T;
        double m = -INFINITY, sum = 0;
        for (int64_t t = 0; t < l->T; t++) m = x[t] > m ? x[t] : m;
        for (int64_t t = 0; t < l->T; t++) sum += exp(x[t] - m);
        for (int64_t t = 0; t < l->T; t++) x[t] = (float)(exp(x[t] - m) / sum);
    }
    p->mag = kvb_run_alloc(r, sizeof(double) * (size_t)out->n, "the outputs' tolerance magnitudes");
    out->tol_mag = p->mag;
    const char *names[1] = {"out"};
    const int64_t lens[1] = {(int64_t)G * l->D};
    int2_op_sample_slices(r, p, (double)G * l->T * l->D * 4, names, 1, lens);
    int64_t ws[1] = {1};
#if KVB_HAVE_CUDA
    if (kvb_gpu_available()) ws[0] = (int64_t)int2_av_workspace_bytes(l);
#endif
    kvb_run_tensor(r, "workspace", KVB_U8, 1, ws, KVB_SCRATCH);
    if (native && (rc = int2_op_add_native_copy(r, l))) return rc;
    int2_cache c = int2_op_cache(r, 0, 0);
    pt = kvb_run_find(r, "p"), out = kvb_run_find(r, "out"); /* the tensor table may have moved */
    return ref_int2_av(pt->h, &c, out->ref, p->mag, l, p->mask);
}
static int setup_av(kvb_run *r) { return setup_av_of(r, 0); }
static int setup_av_native(kvb_run *r) { return setup_av_of(r, 1); }

static int launch_av(kvb_run *r)
{
#if KVB_HAVE_CUDA
    int2_cache c = int2_op_cache(r, 1, 0);
    return int2_av(kvb_run_find(r, "p")->d, &c, kvb_run_find(r, "out")->d, &((int2_priv *)r->priv)->l,
                   kvb_run_find(r, "workspace")->d, r->stream);
#else
    (void)r;
    return KVB_EDEVICE;
#endif
}

static int launch_av_native(kvb_run *r)
{
#if KVB_HAVE_CUDA
    int2_native n = {kvb_run_find(r, "Rec")->d, kvb_run_find(r, "Km")->d};
    return int2_av_native(kvb_run_find(r, "p")->d, &n, kvb_run_find(r, "out")->d, &((int2_priv *)r->priv)->l,
                          kvb_run_find(r, "workspace")->d, r->stream);
#else
    (void)r;
    return KVB_EDEVICE;
#endif
}

static void cost_av(const kvb_run *r, kvb_cost *c)
{
    const int2_layout *l = &((const int2_priv *)r->priv)->l;
    const double heads = (double)l->B * l->Hkv, el = heads * (double)l->T * l->D;
    c->bytes_dev = el / 4.0 + 2.0 * 2.0 * el / l->gs + 4.0 * l->B * l->Hq * (double)l->T + 4.0 * l->B * l->Hq * l->D;
    c->flops = 2.0 * l->B * l->Hq * (double)l->T * l->D;
    c->ceiling = KVB_CEIL_READ;
}

void int2_op_teardown(kvb_run *r)
{
    int2_priv *p = r->priv;
    if (!p) return;
    kvb_xfree(p->mask); /* kvb_sample_slices' block; the state and mag are the run's */
    r->priv = NULL;
}

/* ---- int2_native: the interchange cache written in the kernel-native layout on the device ---- */

static int setup_native(kvb_run *r)
{
    int2_priv *p = int2_op_priv_new(r);
    int rc = setup_cache_only(r, p, 1, 1); /* keys and values, tokens past T poisoned (copied as they are) */
    if (rc) return rc;
    const int2_layout *l = &p->l;
    int64_t s1[1] = {int2_native_rec_elems(l)};
    kvb_tensor *rec = kvb_run_tensor(r, "Rec", KVB_U32, 1, s1, KVB_OUT);
    s1[0] = int2_native_km_elems(l);
    kvb_tensor *km = kvb_run_tensor(r, "Km", KVB_FP16, 1, s1, KVB_OUT);
    km->cmp = KVB_CMP_EXACT; /* fp16 metadata, NaN poison included: bit for bit */
    int2_native n = {rec->ref, km->ref};
    int2_cache c = int2_op_cache(r, 0, 0);
    return ref_int2_to_native(&c, &n, l);
}

static int launch_native(kvb_run *r)
{
#if KVB_HAVE_CUDA
    const int2_layout *l = &((int2_priv *)r->priv)->l;
    int2_cache c = int2_op_cache(r, 1, 0);
    int2_native n = {kvb_run_find(r, "Rec")->d, kvb_run_find(r, "Km")->d};
    return int2_to_native(&c, &n, l, 0, l->Tcap, r->stream);
#else
    (void)r;
    return KVB_EDEVICE;
#endif
}

/* A one-time pass per quantize or flush: the interchange bytes read and the native bytes written. */
static void cost_native(const kvb_run *r, kvb_cost *c)
{
    const int2_layout *l = &((const int2_priv *)r->priv)->l;
    c->bytes_dev = 2.0 * (4.0 * int2_native_rec_elems(l) + 2.0 * int2_native_km_elems(l));
    c->ceiling = KVB_CEIL_D2D;
}

/* ---- int2_quantize_native: a prompt quantized straight into the native layout ---- */

static int setup_quantize_native(kvb_run *r)
{
    int2_priv *p = int2_op_priv_new(r);
    const int2_layout *l = &p->l;
    kvb_tensor *K, *V;
    add_prompt(r, l, &K, &V);
    int64_t s1[1] = {int2_native_rec_elems(l)};
    kvb_tensor *rec = kvb_run_tensor(r, "Rec", KVB_U32, 1, s1, KVB_OUT);
    s1[0] = int2_native_km_elems(l);
    kvb_tensor *km = kvb_run_tensor(r, "Km", KVB_FP16, 1, s1, KVB_OUT);
    km->cmp = KVB_CMP_EXACT; /* fp16 metadata: bit for bit */
    /* the reference: the interchange cache of the whole prompt, then its native layout */
    int2_cache c;
    memset(&c, 0, sizeof c);
    c.Kq = kvb_run_alloc(r, sizeof(uint32_t) * (size_t)int2_kq_elems(l), "the reference cache's key codes");
    c.Ks = kvb_run_alloc(r, sizeof(kvb_fp16) * (size_t)int2_kmeta_elems(l), "the reference cache's key scales");
    c.Kz = kvb_run_alloc(r, sizeof(kvb_fp16) * (size_t)int2_kmeta_elems(l), "the reference cache's key zeros");
    c.Vq = kvb_run_alloc(r, sizeof(uint32_t) * (size_t)int2_vq_elems(l), "the reference cache's value codes");
    c.Vs = kvb_run_alloc(r, sizeof(kvb_fp16) * (size_t)int2_vmeta_elems(l), "the reference cache's value scales");
    c.Vz = kvb_run_alloc(r, sizeof(kvb_fp16) * (size_t)int2_vmeta_elems(l), "the reference cache's value zeros");
    int rc = int2_op_quantize_into(&c, l, K->h, V->h, l->T);
    if (!rc) {
        int2_native n = {rec->ref, km->ref};
        rc = ref_int2_to_native(&c, &n, l);
    }
    kvb_run_free(r, c.Kq), kvb_run_free(r, c.Ks), kvb_run_free(r, c.Kz);
    kvb_run_free(r, c.Vq), kvb_run_free(r, c.Vs), kvb_run_free(r, c.Vz);
    return rc;
}

static int launch_quantize_native(kvb_run *r)
{
#if KVB_HAVE_CUDA
    const int2_layout *l = &((int2_priv *)r->priv)->l;
    int2_native n = {kvb_run_find(r, "Rec")->d, kvb_run_find(r, "Km")->d};
    return int2_quantize_native(kvb_run_find(r, "K")->d, kvb_run_find(r, "V")->d, l->T, l->T, 0, &n, l, r->stream);
#else
    (void)r;
    return KVB_EDEVICE;
#endif
}

/* bf16 keys and values in, the native words out; the family's quantize/pack goal (>= 70% of the
 * device bandwidth) holds for the quantizer the decode path uses, so it is stated here as for int2_quantize */
static void cost_quantize_native(const kvb_run *r, kvb_cost *c)
{
    const int2_layout *l = &((const int2_priv *)r->priv)->l;
    c->bytes_dev = 2.0 * 2.0 * (double)l->B * l->Hkv * (double)l->T * l->D + 4.0 * int2_native_rec_elems(l) +
                   2.0 * int2_native_km_elems(l);
    c->ceiling = KVB_CEIL_D2D;
    if (r->ceil && r->ceil->measured) {
        c->goal_us = kvb_d2d_contiguous_seconds((size_t)(c->bytes_dev / 2) & ~(size_t)15) * 1e6 / 0.7;
        c->goal_text = "70% of the device copy rate";
    }
}

/* ---- host memory (kvb_op.host_bytes) ----
 * From the keys alone, in double: the caches' bytes (int2_op_cache_host_bytes, int2_native_array_bytes) held
 * as their role says (KVB_HOLD_*), the seeded sources the set-up quantizes from, the tolerance magnitudes, the
 * slice sample (a byte per (b, kv head)). */

static double prompt_bytes(const int2_layout *l) { return 2.0 * l->B * l->Hkv * (double)l->T * l->D * 2; }

/* K, V in; the cache out (codes and metadata); the slice sample */
static size_t host_bytes_quantize(const kvb_case *c)
{
    const int2_layout l = int2_op_layout(c);
    return kvb_host_bytes_sat(KVB_HOLD_IN * prompt_bytes(&l) + KVB_HOLD_OUT * int2_op_cache_host_bytes(&l, 1, 1, 0) +
                              (double)l.B * l.Hkv);
}

/* K, V in; Rec, Km out; the reference's interchange cache of the prompt */
static size_t host_bytes_quantize_native(const kvb_case *c)
{
    const int2_layout l = int2_op_layout(c);
    return kvb_host_bytes_sat(KVB_HOLD_IN * prompt_bytes(&l) + KVB_HOLD_OUT * int2_native_array_bytes(&l) +
                              int2_op_cache_host_bytes(&l, 1, 1, 0));
}

/* the interchange cache in; Rec, Km out; the source its keys and values are quantized from (one tensor's) */
static size_t host_bytes_native(const kvb_case *c)
{
    const int2_layout l = int2_op_layout(c);
    return kvb_host_bytes_sat(KVB_HOLD_IN * int2_op_cache_host_bytes(&l, 1, 1, 0) +
                              KVB_HOLD_OUT * int2_native_array_bytes(&l) + prompt_bytes(&l) / 2);
}

/* the cache with its residual in and out; knew, vnew in; the sources of T + R + 1 tokens */
static size_t host_bytes_append(const kvb_case *c)
{
    const int2_layout l = int2_op_layout(c);
    const double heads = (double)l.B * l.Hkv;
    return kvb_host_bytes_sat(KVB_HOLD_INOUT * int2_op_cache_host_bytes(&l, 1, 1, 1) +
                              KVB_HOLD_IN * 2 * heads * l.D * 2 + 2 * heads * (double)(l.T + l.R + 1) * l.D * 2);
}

/* the keys (and the values, for the native copy) in; the source; q in; scores out and their magnitudes;
 * Rec, Km in (native); the slice sample */
static double host_bytes_qk_of(const kvb_case *c, int native)
{
    const int2_layout l = int2_op_layout(c);
    const double scores = (double)l.B * l.Hq * (double)l.T;
    return KVB_HOLD_IN * (int2_op_cache_host_bytes(&l, 1, native, 0) + 2.0 * l.B * l.Hq * l.D) + prompt_bytes(&l) / 2 +
           KVB_HOLD_OUT * 4 * scores + 8 * scores + (native ? KVB_HOLD_IN * int2_native_array_bytes(&l) : 0) +
           (double)l.B * l.Hkv;
}
static size_t host_bytes_qk(const kvb_case *c) { return kvb_host_bytes_sat(host_bytes_qk_of(c, 0)); }
static size_t host_bytes_qk_native(const kvb_case *c) { return kvb_host_bytes_sat(host_bytes_qk_of(c, 1)); }

/* the values (and the keys, for the native copy) in; the source; p in; out out and its magnitudes; Rec, Km
 * in (native); the slice sample */
static double host_bytes_av_of(const kvb_case *c, int native)
{
    const int2_layout l = int2_op_layout(c);
    const double out = (double)l.B * l.Hq * l.D;
    return KVB_HOLD_IN * (int2_op_cache_host_bytes(&l, native, 1, 0) + 4.0 * l.B * l.Hq * (double)l.T) +
           prompt_bytes(&l) / 2 + KVB_HOLD_OUT * 4 * out + 8 * out +
           (native ? KVB_HOLD_IN * int2_native_array_bytes(&l) : 0) + (double)l.B * l.Hkv;
}
static size_t host_bytes_av(const kvb_case *c) { return kvb_host_bytes_sat(host_bytes_av_of(c, 0)); }
static size_t host_bytes_av_native(const kvb_case *c) { return kvb_host_bytes_sat(host_bytes_av_of(c, 1)); }

/* ---- registry entries ---- */

const kvb_op op_int2_quantize = {
    .name = "int2_quantize",
    .family = "int2",
    .summary = "INT2 quantize/pack of a prompt: keys per channel, values per token (bit-exact)",
    .params = quantize_params,
    .n_params = NPARAMS(quantize_params),
    .validate = validate_quantize,
    .host_bytes = host_bytes_quantize,
    .setup = setup_quantize,
    .launch = launch_quantize,
    .cost = cost_quantize,
    .teardown = int2_op_teardown,
};

const kvb_op op_int2_native = {
    .name = "int2_native",
    .family = "int2",
    .summary = "the INT2 cache in the kernel-native layout of int2_decode_attn v3, written on the device (bit-exact)",
    .params = quantize_params,
    .n_params = NPARAMS(quantize_params),
    .validate = validate_quantize,
    .host_bytes = host_bytes_native,
    .setup = setup_native,
    .launch = launch_native,
    .cost = cost_native,
    .teardown = int2_op_teardown,
};

const kvb_op op_int2_quantize_native = {
    .name = "int2_quantize_native",
    .family = "int2",
    .summary = "INT2 quantize/pack of a prompt straight into the kernel-native layout of int2_decode_attn v3 (bit-exact)",
    .params = quantize_params,
    .n_params = NPARAMS(quantize_params),
    .validate = validate_quantize_native,
    .host_bytes = host_bytes_quantize_native,
    .setup = setup_quantize_native,
    .launch = launch_quantize_native,
    .cost = cost_quantize_native,
    .teardown = int2_op_teardown,
};

const kvb_op op_int2_append = {
    .name = "int2_append",
    .family = "int2",
    .summary = "INT2 decode-step append to the bf16 residual, flush every 128 tokens (bit-exact)",
    .params = append_params,
    .n_params = NPARAMS(append_params),
    .validate = validate_append,
    .host_bytes = host_bytes_append,
    .setup = setup_append,
    .launch = launch_append,
    .cost = cost_append,
    .teardown = int2_op_teardown,
};

const kvb_op op_int2_qk = {
    .name = "int2_qk",
    .family = "int2",
    .summary = "fused dequant-matmul q . dequant(K) over the INT2 keys (fp32 scores)",
    .params = matmul_params,
    .n_params = NPARAMS(matmul_params),
    .tol = {1e-5, 1e-3, 1e-3},
    .validate = validate_matmul,
    .host_bytes = host_bytes_qk,
    .setup = setup_qk,
    .launch = launch_qk,
    .cost = cost_qk,
    .teardown = int2_op_teardown,
};

const kvb_op op_int2_qk_native = {
    .name = "int2_qk_native",
    .family = "int2",
    .summary = "int2_qk over the kernel-native layout (v3's step scores; the reference's tolerance)",
    .params = matmul_params,
    .n_params = NPARAMS(matmul_params),
    .tol = {1e-5, 1e-3, 1e-3},
    .validate = validate_matmul,
    .host_bytes = host_bytes_qk_native,
    .setup = setup_qk_native,
    .launch = launch_qk_native,
    .cost = cost_qk,
    .teardown = int2_op_teardown,
};

const kvb_op op_int2_av_native = {
    .name = "int2_av_native",
    .family = "int2",
    .summary = "int2_av over the kernel-native layout (v3's step value sums; the reference's tolerance)",
    .params = matmul_params,
    .n_params = NPARAMS(matmul_params),
    .tol = {1e-5, 1e-3, 1e-3},
    .validate = validate_matmul,
    .host_bytes = host_bytes_av_native,
    .setup = setup_av_native,
    .launch = launch_av_native,
    .cost = cost_av,
    .teardown = int2_op_teardown,
};

const kvb_op op_int2_av = {
    .name = "int2_av",
    .family = "int2",
    .summary = "fused dequant-matmul p . dequant(V) over the INT2 values (fp32 out)",
    .params = matmul_params,
    .n_params = NPARAMS(matmul_params),
    .tol = {1e-5, 1e-3, 1e-3},
    .validate = validate_matmul,
    .host_bytes = host_bytes_av,
    .setup = setup_av,
    .launch = launch_av,
    .cost = cost_av,
    .teardown = int2_op_teardown,
};

