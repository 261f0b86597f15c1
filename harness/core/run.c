/* run.c: tensors of a case and the generic device lifecycle (see op.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness/core/op.h"
#if KVB_HAVE_CUDA
#include "kernels/step/compose.h"
#endif

static const char *g_case_id = ""; /* the case being set up, for allocation failures */

/* A host allocation that fails fails its case by name (through the case guard, gpu.h), not the run. */
static void *xmalloc(size_t n, const char *what)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        kvb_fail(KVB_ENOMEM, "%s: out of host memory allocating %zu bytes (%.2f GiB) for %s", g_case_id, n,
                 n / 1073741824.0, what);
        kvb_guard_fail();
    }
    return p;
}

void *kvb_run_alloc(kvb_run *r, size_t bytes, const char *what)
{
    g_case_id = r->c ? r->c->id : "";
    return xmalloc(bytes, what);
}

static size_t tensor_bytes(const kvb_tensor *t) { return (size_t)t->n * kvb_dtype_size(t->dtype); }

kvb_tensor *kvb_run_tensor(kvb_run *r, const char *name, kvb_dtype dt, int ndim, const int64_t *shape,
                           int role)
{
    if (r->nt >= KVB_MAX_TENSORS || ndim > KVB_MAX_DIMS) {
        kvb_fail(KVB_EINVAL, "%s: internal error: more than %d tensors or %d dimensions", r->op->name,
                 KVB_MAX_TENSORS, KVB_MAX_DIMS);
        kvb_guard_fail();
    }
    g_case_id = r->c->id;
    kvb_tensor *t = &r->t[r->nt++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = dt;
    t->ndim = ndim;
    t->n = 1;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i], t->n *= shape[i];
    t->role = role;
    if (role == KVB_IN || role == KVB_INOUT) {
        t->h = xmalloc(tensor_bytes(t), name);
        t->host_owned = 1;
    }
    if (role == KVB_OUT || role == KVB_INOUT) {
        t->ref = xmalloc(tensor_bytes(t), name);
        t->cmp = kvb_dtype_is_float(dt) ? KVB_CMP_FLOAT : KVB_CMP_EXACT;
    }
    const kvb_case *c = r->c;
    t->tol.atol = c->atol >= 0 ? c->atol : r->op->tol.atol;
    t->tol.rtol = c->rtol >= 0 ? c->rtol : r->op->tol.rtol;
    t->tol.l2 = c->l2 >= 0 ? c->l2 : r->op->tol.l2;
    t->slice_len = t->n;
    return t;
}

kvb_tensor *kvb_run_find(kvb_run *r, const char *name)
{
    for (int i = 0; i < r->nt; i++)
        if (!strcmp(r->t[i].name, name)) return &r->t[i];
    return NULL;
}

static int op_has_param(const kvb_op *op, const char *name)
{
    for (int i = 0; i < op->n_params; i++)
        if (!strcmp(op->params[i].name, name)) return 1;
    return 0;
}

const char *kvb_run_impl(const kvb_run *r)
{
    return op_has_param(r->op, "impl") ? kvb_case_enum(r->c, "impl") : "kernel";
}

/* The op's table entry for the case's impl= (NULL for an op without a table). */
static const kvb_impl *run_impl_entry(const kvb_run *r)
{
    const char *name = kvb_run_impl(r);
    for (int i = 0; i < r->op->n_impls; i++)
        if (!strcmp(r->op->impls[i].name, name)) return &r->op->impls[i];
    return NULL;
}

int kvb_run_wall_timed(const kvb_run *r)
{
    const kvb_impl *e = run_impl_entry(r);
    return e && e->wall_timed;
}

int kvb_run_setup(kvb_run *r, const kvb_case *c, const kvb_ceilings *ceil)
{
    memset(r, 0, sizeof *r);
    r->c = c;
    r->op = c->op;
    r->ceil = ceil;
    r->seed = op_has_param(c->op, "seed") ? (uint64_t)kvb_case_get(c, "seed") : 1;
    kvb_clear_error();
    int rc = r->op->setup(r); /* a failed allocation jumps past this: ref_ready stays 0 */
    r->ref_ready = rc == KVB_OK;
    return rc;
}

int kvb_run_gpu_setup(kvb_run *r)
{
    r->stream = kvb_stream_create();
    r->stream2 = kvb_stream_create();
    for (int i = 0; i < r->nt; i++) {
        kvb_tensor *t = &r->t[i];
        size_t bytes = tensor_bytes(t);
        if (t->flags & KVB_T_HOST_MAPPED) {
            t->d = t->h; /* pinned + mapped: with unified addressing the host pointer is the device one */
            continue;
        }
        t->d = kvb_dmalloc(bytes);
        if (t->role == KVB_IN) kvb_h2d(t->d, t->h, bytes, r->stream);
        if (t->role == KVB_INOUT) {
            t->d_init = kvb_dmalloc(bytes);
            kvb_h2d(t->d_init, t->h, bytes, r->stream);
        }
        if (t->role == KVB_SCRATCH) kvb_dmemset(t->d, 0, bytes, r->stream);
    }
    r->on_gpu = 1;
    int rc = r->op->gpu_setup ? r->op->gpu_setup(r) : KVB_OK;
    kvb_sync(r->stream);
    return rc;
}

int kvb_run_reset(kvb_run *r)
{
    for (int i = 0; i < r->nt; i++) {
        kvb_tensor *t = &r->t[i];
        if (t->role == KVB_INOUT) kvb_d2d(t->d, t->d_init, tensor_bytes(t), r->stream);
        if (t->role == KVB_OUT) kvb_dmemset(t->d, 0xFF, tensor_bytes(t), r->stream); /* poison */
    }
    return KVB_OK;
}

int kvb_run_launch(kvb_run *r)
{
    const kvb_impl *e = run_impl_entry(r);
    int rc = e && e->launch ? e->launch(r) : r->op->launch(r);
#if KVB_HAVE_CUDA
    KVB_CUDA_LAUNCHED();
#endif
    return rc;
}

int kvb_run_download(kvb_run *r)
{
    r->out_ready = 0; /* until every output has arrived */
    kvb_sync(r->stream);
    kvb_sync(r->stream2);
    for (int i = 0; i < r->nt; i++) {
        kvb_tensor *t = &r->t[i];
        if (t->role != KVB_OUT && t->role != KVB_INOUT) continue;
        if (!t->out) t->out = xmalloc(tensor_bytes(t), t->name);
        kvb_d2h(t->out, t->d, tensor_bytes(t), r->stream);
    }
    kvb_sync(r->stream);
    r->out_ready = 1;
    return KVB_OK;
}

void kvb_run_compare(kvb_run *r, kvb_verdict *v)
{
    memset(v, 0, sizeof *v);
    v->pass = 1;
    if (r->op->ref_from_out) {
        kvb_clear_error();
        const int rc = r->op->ref_from_out(r);
        r->ref_from_device = rc == KVB_OK ? 1 : -1;
        if (rc != KVB_OK) {
            v->invariants_checked = 1;
            snprintf(v->invariant_error, sizeof v->invariant_error, "reference from the device's choice: %s",
                     kvb_last_error());
            v->pass = 0;
        }
    }
    for (int i = 0; i < r->nt; i++) {
        kvb_tensor *t = &r->t[i];
        if ((t->role != KVB_OUT && t->role != KVB_INOUT) || t->cmp == KVB_CMP_NONE || (t->flags & KVB_T_NO_REF)) continue;
        kvb_cmp_result *res = &v->res[v->n];
        snprintf(v->name[v->n], sizeof v->name[v->n], "%s", t->name);
        if (t->cmp == KVB_CMP_EXACT)
            kvb_compare_exact(t->out, t->ref, t->dtype, t->n, t->slice_len, t->slice_mask, res);
        else if (t->cmp == KVB_CMP_FLOAT && t->tol_mag)
            kvb_compare_float_mag(t->out, t->ref, t->dtype, t->n, t->tol, t->tol_mag, t->slice_len, t->slice_mask, res);
        else if (t->cmp == KVB_CMP_FLOAT)
            kvb_compare_float(t->out, t->ref, t->dtype, t->n, t->tol, t->slice_len, t->slice_mask, res);
        else if (t->cmp == KVB_CMP_INDEXSET) {
            int64_t k = t->shape[t->ndim - 1], slice_rows = t->slice_mask ? t->slice_len / k : 1;
            kvb_compare_indexset_sampled(t->out, t->ref, t->scores, t->scores_dtype, t->n / k, t->scores_n, k,
                                         t->set_tol, slice_rows, t->slice_mask, res);
        } else if (t->cmp == KVB_CMP_GATHER) {
            const kvb_tensor *src = kvb_run_find(r, t->gather_src), *idx = kvb_run_find(r, t->gather_idx);
            int64_t width = t->shape[t->ndim - 1], k = t->shape[t->ndim - 2];
            int64_t n_src = src->shape[src->ndim - 2];
            kvb_compare_gather(t->out, src->h, idx->out, t->dtype, t->n / (k * width), k, width, n_src, t->gather_group, res);
        }
        v->pass &= res->pass;
        v->n++;
    }
}

int kvb_run_validate(kvb_run *r, kvb_verdict *v)
{
    memset(v, 0, sizeof *v);
    kvb_run_reset(r);
    int rc = kvb_run_launch(r);
    if (rc) return rc;
    kvb_run_download(r);
    kvb_run_compare(r, v);
    return KVB_OK;
}

int64_t kvb_run_repeat_differs(kvb_run *r, char *name, size_t name_n)
{
    void *first[KVB_MAX_TENSORS] = {0};
    for (int i = 0; i < r->nt; i++) {
        kvb_tensor *t = &r->t[i];
        if (!t->out || (t->role != KVB_OUT && t->role != KVB_INOUT)) continue;
        first[i] = xmalloc(tensor_bytes(t), t->name);
        memcpy(first[i], t->out, tensor_bytes(t));
    }
    int64_t differ = 0;
    kvb_run_reset(r);
    int rc = kvb_run_launch(r);
    if (!rc) {
        kvb_run_download(r);
        for (int i = 0; i < r->nt; i++) {
            kvb_tensor *t = &r->t[i];
            if (!first[i]) continue;
            const size_t es = kvb_dtype_size(t->dtype);
            int64_t here = 0;
            for (int64_t e = 0; e < t->n; e++)
                here += memcmp((const char *)first[i] + (size_t)e * es, (const char *)t->out + (size_t)e * es, es) != 0;
            if (here && !differ) snprintf(name, name_n, "%s", t->name);
            differ += here;
        }
    }
    for (int i = 0; i < r->nt; i++) free(first[i]);
    return rc ? -1 : differ;
}

void kvb_run_teardown(kvb_run *r)
{
    /* after a sticky CUDA error every call fails: leak the device memory rather than exit */
    const int dev = r->on_gpu && !kvb_device_broken();
    if (r->op && r->op->teardown && (!r->on_gpu || dev)) r->op->teardown(r);
    for (int i = 0; i < r->nt; i++) {
        kvb_tensor *t = &r->t[i];
        if (dev) {
            if (!(t->flags & KVB_T_HOST_MAPPED)) kvb_dfree(t->d);
            kvb_dfree(t->d_init);
        }
        if (t->host_owned) free(t->h);
        free(t->ref);
        free(t->out);
    }
    if (dev) {
        kvb_stream_destroy(r->stream);
        kvb_stream_destroy(r->stream2);
    }
    memset(r, 0, sizeof *r);
}

/* ---- the pinned host pool ---- */
static struct {
    void *p;
    size_t bytes, valid;
    char tag[64];
    uint64_t seed;
} g_pool;

void *kvb_host_pool(size_t bytes, const char *tag, uint64_t seed, size_t *valid)
{
    if (!g_pool.p || g_pool.bytes < bytes) {
        kvb_host_pool_release();
        g_pool.p = kvb_gpu_available() ? kvb_pinned_alloc(bytes) : xmalloc(bytes, "host pool");
        g_pool.bytes = bytes;
    }
    if (strcmp(g_pool.tag, tag) != 0 || g_pool.seed != seed) {
        snprintf(g_pool.tag, sizeof g_pool.tag, "%s", tag);
        g_pool.seed = seed;
        g_pool.valid = 0;
    }
    *valid = g_pool.valid < bytes ? g_pool.valid : bytes;
    return g_pool.p;
}

void kvb_host_pool_set_valid(size_t bytes)
{
    if (bytes > g_pool.valid) g_pool.valid = bytes;
}

void kvb_host_pool_release(void)
{
    if (g_pool.p) {
        if (kvb_gpu_available()) kvb_pinned_free(g_pool.p);
        else free(g_pool.p);
    }
    memset(&g_pool, 0, sizeof g_pool);
}

#if KVB_HAVE_CUDA
int kvb_run_stage_times(kvb_run *r, kvb_step *st)
{
    const int cap = (int)(sizeof r->stage_ms / sizeof r->stage_ms[0]);
    if (st->n > cap) return kvb_fail(KVB_EINVAL, "%s: %d stages, out of range [0, %d] for the report", st->name, st->n, cap);
    double ms[KVB_STEP_MAX_STAGES];
    int rc = kvb_step_stage_ms(st, ms);
    if (rc) return rc;
    r->n_stages = st->n;
    for (int i = 0; i < st->n; i++) {
        r->stage_ms[i] = ms[i];
        snprintf(r->stage_name[i], sizeof r->stage_name[i], "%s", st->st[i].name);
    }
    return KVB_OK;
}
#endif
