/* run.c: tensors of a case, the host memory it owns and may take, the generic device lifecycle and the
 * host pool (see op.h). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness/core/op.h"
#include "harness/core/progress.h"
#if KVB_HAVE_CUDA
#include "kernels/step/compose.h"
#endif

static void fault_injection_arm(void);

/* A host allocation that fails fails its case by name and size (through the case guard, gpu.h), not the
 * run: kvb_xalloc's message with the case's id in front. */
static void fail_case(const char *case_id)
{
    char msg[512];
    snprintf(msg, sizeof msg, "%s", kvb_last_error());
    kvb_fail(KVB_ENOMEM, "%s: %s", case_id, msg);
    kvb_guard_fail();
}

void *kvb_run_alloc(kvb_run *r, size_t bytes, const char *what)
{
    const char *id = r->c ? r->c->id : "";
    if (r->n_allocs == r->cap_allocs) { /* the run's list of its blocks grows by doubling */
        const int cap = r->cap_allocs ? 2 * r->cap_allocs : 64;
        void **list = kvb_xalloc((size_t)cap, sizeof *list, "the run's list of host buffers");
        if (!list) fail_case(id);
        if (r->n_allocs) memcpy(list, r->allocs, sizeof *list * (size_t)r->n_allocs);
        kvb_xfree(r->allocs);
        r->allocs = list, r->cap_allocs = cap;
    }
    void *p = kvb_xalloc(1, bytes, what);
    if (!p) fail_case(id);
    r->allocs[r->n_allocs++] = p;
    return p;
}

void kvb_run_free(kvb_run *r, void *p)
{
    if (!p) return;
    for (int i = r->n_allocs - 1; i >= 0; i--) /* the latest first: scratch is freed soon after */
        if (r->allocs[i] == p) {
            r->allocs[i] = r->allocs[--r->n_allocs];
            kvb_xfree(p);
            return;
        }
    kvb_fail(KVB_EINVAL, "kvb_run_free: %p is not a block of this run", p);
    kvb_guard_fail();
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
    kvb_tensor *t = &r->t[r->nt++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = dt;
    t->ndim = ndim;
    t->n = 1;
    for (int i = 0; i < ndim; i++) t->shape[i] = shape[i], t->n *= shape[i];
    t->role = role;
    if (role == KVB_IN || role == KVB_INOUT) t->h = kvb_run_alloc(r, tensor_bytes(t), name);
    if (role == KVB_OUT || role == KVB_INOUT) {
        t->ref = kvb_run_alloc(r, tensor_bytes(t), name);
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
    fault_injection_arm();
    int rc = kvb_host_mem_check(c);
    if (rc) return rc;
    const double t0 = kvb_wall_now(), fills0 = kvb_fill_seconds();
    rc = r->op->setup(r); /* a failed allocation jumps past this: ref_ready stays 0 */
    r->ref_ready = rc == KVB_OK;
    r->wall_s[KVB_PH_INPUTS] = kvb_fill_seconds() - fills0;
    r->wall_s[KVB_PH_REFERENCE] = kvb_wall_now() - t0 - r->wall_s[KVB_PH_INPUTS];
    return rc;
}

const char *kvb_phase_name(kvb_phase p)
{
    static const char *names[KVB_N_PHASES] = {"inputs", "reference", "upload", "validate", "timing", "revalidate"};
    return p >= 0 && p < KVB_N_PHASES ? names[p] : "?";
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
        if (!t->out) t->out = kvb_run_alloc(r, tensor_bytes(t), t->name);
        kvb_d2h(t->out, t->d, tensor_bytes(t), r->stream);
    }
    kvb_sync(r->stream);
    r->out_ready = 1;
    return KVB_OK;
}

void kvb_run_compare_tensor(kvb_run *r, const kvb_tensor *t, kvb_cmp_result *res)
{
    if (t->cmp == KVB_CMP_EXACT && (t->flags & KVB_T_ANY_BITS))
        kvb_compare_exact_any_bits(t->out, t->ref, t->dtype, t->n, t->slice_len, t->slice_mask, res);
    else if (t->cmp == KVB_CMP_EXACT)
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
    } else {
        memset(res, 0, sizeof *res);
        res->pass = 1;
    }
}

static int verdict_only; /* kvb_run_compare_verdict_only */

void kvb_run_compare_verdict_only(int on)
{
    verdict_only = on;
    kvb_compare_verdict_only(on);
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
        kvb_run_compare_tensor(r, t, res);
        v->pass &= res->pass;
        v->n++;
        if (!v->pass && verdict_only) break;
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
    jmp_buf jb;
    if (setjmp(*kvb_guard_enter(&jb))) { /* a host allocation or a CUDA call failed: kvb_last_error() */
        kvb_guard_leave();
        return -1;
    }
    for (int i = 0; i < r->nt; i++) {
        kvb_tensor *t = &r->t[i];
        if (!t->out || (t->role != KVB_OUT && t->role != KVB_INOUT)) continue;
        first[i] = kvb_run_alloc(r, tensor_bytes(t), t->name);
        kvb_copy_parallel(first[i], t->out, tensor_bytes(t));
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
    for (int i = 0; i < r->nt; i++) kvb_run_free(r, first[i]);
    kvb_guard_leave();
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
    }
    if (dev) {
        kvb_stream_destroy(r->stream);
        kvb_stream_destroy(r->stream2);
    }
    for (int i = 0; i < r->n_allocs; i++) kvb_xfree(r->allocs[i]);
    kvb_xfree(r->allocs);
    memset(r, 0, sizeof *r);
}

/* ---- the pinned host pool ---- */
static struct {
    void *p;
    size_t bytes, valid;
    char tag[64];
    uint64_t seed;
    int pinned;
} g_pool;
static size_t g_pool_planned; /* the largest need of the run's cases (kvb_host_pool_plan) */
static size_t g_pool_grow_to; /* the case being set up: the size to grow to, when the pool grows */
static const kvb_case *g_case; /* the case being set up: its id names a failure of the pool */

static void *pool_try_alloc(size_t bytes)
{
    g_pool.pinned = kvb_gpu_available();
    return g_pool.pinned ? kvb_pinned_try_alloc(bytes) : kvb_xalloc(1, bytes, "the host pool");
}

void *kvb_host_pool(size_t bytes, const char *tag, uint64_t seed, size_t *valid)
{
    if (!g_pool.p || g_pool.bytes < bytes) {
        kvb_host_pool_release();
        size_t want = g_pool_grow_to > bytes ? g_pool_grow_to : bytes;
        g_pool.p = pool_try_alloc(want);
        if (!g_pool.p && want > bytes) g_pool.p = pool_try_alloc(want = bytes); /* the case's own need */
        if (!g_pool.p) fail_case(g_case ? g_case->id : "");
        g_pool.bytes = want;
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
        if (g_pool.pinned) kvb_pinned_free(g_pool.p);
        else kvb_xfree(g_pool.p);
    }
    memset(&g_pool, 0, sizeof g_pool);
}

void kvb_host_pool_plan(const kvb_case_list *cases)
{
    g_pool_planned = 0;
    for (int i = 0; i < cases->n; i++)
        if (cases->v[i].op->host_pool_bytes) {
            const size_t b = cases->v[i].op->host_pool_bytes(&cases->v[i]);
            if (b > g_pool_planned) g_pool_planned = b;
        }
}

size_t kvb_host_pool_held(void) { return g_pool.p ? g_pool.bytes : 0; }

/* ---- host memory per case ---- */

static double g_host_limit; /* kvb_set_host_mem_limit; <= 0: the machine's free memory */

void kvb_set_host_mem_limit(double bytes) { g_host_limit = bytes; }

size_t kvb_host_bytes_sat(double bytes)
{
    if (!(bytes < 18446744073709551616.0)) return SIZE_MAX; /* 2^64, and NaN */
    return bytes > 0 ? (size_t)bytes : 0;
}

size_t kvb_case_host_bytes(const kvb_case *c) { return c->op->host_bytes ? c->op->host_bytes(c) : 0; }

/* A number after `key` in a file of "key value" lines (/proc/meminfo, memory.stat), or -1. */
static double file_value(const char *path, const char *key)
{
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char line[256];
    double v = -1;
    const size_t n = strlen(key);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, n) && (line[n] == ' ' || line[n] == ':')) {
            v = strtod(line + n + 1, NULL);
            break;
        }
    fclose(f);
    return v;
}

/* The one number a cgroup file holds ("max": no limit, INFINITY), or -1. */
static double file_number(const char *path)
{
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char buf[64] = "";
    const int ok = fgets(buf, sizeof buf, f) != NULL;
    fclose(f);
    if (!ok) return -1;
    return !strncmp(buf, "max", 3) ? INFINITY : strtod(buf, NULL);
}

/* What the process's memory cgroup may still take: its limit (the smallest of its ancestors') minus its
 * usage plus its inactive file cache (reclaimed first). INFINITY without a limit or a cgroup. Containers
 * (CI) see the host's /proc/meminfo: there the cgroup's limit is the one the OOM killer applies. */
static double cgroup_headroom(void)
{
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f) return INFINITY;
    char line[1024], v1[900] = "", v2[900] = "";
    int has_v1 = 0, has_v2 = 0;
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char *ctl = strchr(line, ':'), *path = ctl ? strchr(ctl + 1, ':') : NULL;
        if (!path) continue;
        *path++ = 0, ctl++;
        if (!strcmp(ctl, "") && line[0] == '0') has_v2 = 1, snprintf(v2, sizeof v2, "%s", path);
        for (char *tok = strtok(ctl, ","); tok; tok = strtok(NULL, ","))
            if (!strcmp(tok, "memory")) has_v1 = 1, snprintf(v1, sizeof v1, "%s", path);
    }
    fclose(f);
    double best = INFINITY;
    char dir[1100], p[1200];
    if (has_v1) { /* hierarchical_memory_limit: the smallest limit on the way to the root */
        snprintf(dir, sizeof dir, "/sys/fs/cgroup/memory%s", v1);
        snprintf(p, sizeof p, "%s/memory.stat", dir);
        if (file_value(p, "hierarchical_memory_limit") < 0) snprintf(dir, sizeof dir, "/sys/fs/cgroup/memory");
        snprintf(p, sizeof p, "%s/memory.stat", dir);
        const double limit = file_value(p, "hierarchical_memory_limit"), inactive = file_value(p, "total_inactive_file");
        snprintf(p, sizeof p, "%s/memory.usage_in_bytes", dir);
        const double usage = file_number(p);
        if (limit > 0 && limit < 0x1p62 && usage >= 0) best = limit - usage + (inactive > 0 ? inactive : 0);
    } else if (has_v2) { /* memory.max of the cgroup and of each ancestor */
        snprintf(dir, sizeof dir, "/sys/fs/cgroup%s", strcmp(v2, "/") ? v2 : "");
        for (;;) {
            snprintf(p, sizeof p, "%s/memory.max", dir);
            const double limit = file_number(p);
            snprintf(p, sizeof p, "%s/memory.current", dir);
            const double usage = file_number(p);
            snprintf(p, sizeof p, "%s/memory.stat", dir);
            const double inactive = file_value(p, "inactive_file");
            if (limit > 0 && isfinite(limit) && usage >= 0) {
                const double room = limit - usage + (inactive > 0 ? inactive : 0);
                if (room < best) best = room;
            }
            char *slash = strrchr(dir, '/');
            if (!slash || slash - dir <= (ptrdiff_t)strlen("/sys/fs/cgroup")) break;
            *slash = 0;
        }
    }
    return best < 0 ? 0 : best;
}

double kvb_host_mem_available(void)
{
    const double kib = file_value("/proc/meminfo", "MemAvailable");
    const double avail = kib < 0 ? INFINITY : kib * 1024, room = cgroup_headroom();
    const double v = avail < room ? avail : room;
    return isfinite(v) ? v : 0;
}

static void human_bytes(double b, char *buf, size_t n)
{
    static const char *unit[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    int u = 0;
    while (b >= 1024 && u < 6) b /= 1024, u++;
    snprintf(buf, n, u ? "%.1f %s" : "%.0f %s", b, unit[u]);
}

int kvb_host_mem_check(const kvb_case *c)
{
    g_case = c;
    const size_t pool_need = c->op->host_pool_bytes ? c->op->host_pool_bytes(c) : 0;
    g_pool_grow_to = pool_need;
    if (!c->op->host_bytes) return KVB_OK;
    const size_t need = c->op->host_bytes(c);
    const double held = (double)kvb_host_pool_held();
    double limit;
    char where[200];
    if (g_host_limit > 0) {
        limit = g_host_limit;
        snprintf(where, sizeof where, "set by --host-mem-limit");
    } else {
        const double avail = kvb_host_mem_available();
        if (avail <= 0) return KVB_OK; /* nothing known to compare with */
        /* the part of the pool the case reuses is held already; a pool that grows is released first; the
         * fill memo's bytes are the run's to free */
        limit = avail + (pool_need < held ? (double)pool_need : held) + (double)kvb_fill_memo_held();
        snprintf(where, sizeof where, "this machine has free now (MemAvailable, or the memory cgroup's headroom%s); "
                 "kvbench --host-mem-limit GB sets another limit", held > 0 ? ", plus the host pool the case reuses" : "");
    }
    /* a pool that grows takes the run's largest need at once when that leaves the case its own memory */
    if (g_pool_planned > pool_need && (double)need - (double)pool_need + (double)g_pool_planned <= limit)
        g_pool_grow_to = g_pool_planned;
    if ((double)need <= limit) { /* the fill memo keeps what the case and a growing pool leave */
        const double room = limit - (double)need - (double)(g_pool_grow_to > pool_need ? g_pool_grow_to - pool_need : 0);
        kvb_fill_memo_limit(room < (double)KVB_FILL_MEMO_MAX ? (size_t)(room > 0 ? room : 0) : KVB_FILL_MEMO_MAX);
        return KVB_OK;
    }
    char a[32], b[32];
    human_bytes((double)need, a, sizeof a);
    human_bytes(limit, b, sizeof b);
    return kvb_fail(KVB_ENOMEM,
                    "%s: refused before set-up: it needs about %s of host memory%s (inputs, references, outputs, "
                    "scratch, host pool), more than the %s %s",
                    c->id, a, need == SIZE_MAX ? " or more" : "", b, where);
}

/* ---- allocation-failure injection ---- */

/* KVB_FAIL_ALLOC_AT=n (tests/alloc_fault.sh): the n-th checked host allocation (kvb_xalloc: tensors,
 * kvb_run_alloc, the references' scratch, the host pool without a device) of every case fails as if the
 * memory were not there; at exit the run says on stderr whether that happened and how many checked
 * allocations its last case made. KVB_ALLOC_TRACE=1: each one is listed on stderr (its number, size and
 * what), the sites a fault-injection run goes through. Read at every case's set-up. */
static long g_fault_at;
static int g_fault_fired, g_fault_reported;

static void fault_injection_report(void)
{
    g_fault_fired |= kvb_xalloc_fault_fired();
    fprintf(stderr, "kvbench: KVB_FAIL_ALLOC_AT=%ld: %s; %ld checked host allocations in the last case\n", g_fault_at,
            g_fault_fired ? "the failure was injected" : "not reached", kvb_xalloc_count());
}

static void trace_allocation(void *ctx, long n, size_t bytes, const char *what)
{
    (void)ctx;
    fprintf(stderr, "kvbench: allocation %ld: %zu bytes for %s\n", n, bytes, what);
}

static void fault_injection_arm(void)
{
    const char *at = getenv("KVB_FAIL_ALLOC_AT"), *trace = getenv("KVB_ALLOC_TRACE");
    g_fault_fired |= kvb_xalloc_fault_fired();
    g_fault_at = at && *at ? strtol(at, NULL, 10) : 0;
    if (g_fault_at < 0) g_fault_at = 0;
    if (at && *at && !g_fault_reported) g_fault_reported = !atexit(fault_injection_report);
    if (trace && *trace && strcmp(trace, "0")) kvb_xalloc_trace(trace_allocation, NULL);
    kvb_xalloc_fail_at(g_fault_at);
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
