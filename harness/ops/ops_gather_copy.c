/* ops_gather_copy.c: the gather_copy family in the harness (kernels/gather_copy/NOTES.md).
 *
 * Kernels: index_scan, gather_copy, gather_copy_d2d, gather_copy_all, packed_load, and gather_step
 * (index_scan, then gather_copy of V on one stream beside gather_copy_d2d of K on another: ShadowKV's
 * fetch step, timed whole).
 *
 * Implementations (impl=): kernel, the suite's CUDA kernel; memcpy_chunks / memcpy_rows, one
 * cudaMemcpyAsync per chunk or row; cpu_gather, the CPU gathers into a pinned staging buffer, then
 * one copy; gather_copy_all also tma (the SM's bulk-copy engine reading pinned memory) and ce_batch
 * (one cudaMemcpyBatchAsync of per-chunk copies). Baselines are validated like the kernels and timed
 * with their host work included.
 *
 * Inputs: chunk ids are drawn per (b, h) row from [0, ctx/c) with a seeded generator; `hit` of the
 * non-empty old slots reappear among the new ids; old tags are unsorted, `empty` of them are -1.
 * Host values, buffers and rows are seeded normal bf16 (a pure function of seed and index).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reference/gather_copy.h"
#include "harness/core/ceilings.h"
#include "harness/core/op.h"
#include "harness/ops/ops.h"
#if KVB_HAVE_CUDA
#include "kernels/gather_copy/gather_baselines.h"
#include "kernels/gather_copy/gather_copy.h"
#include "kernels/step/step_gather.h"
#endif

/* ---- keys ---- */

#define K_BATCH {"B", KVB_P_INT, 1, 1, 1024, NULL, "batch"}
#define K_HKV {"Hkv", KVB_P_INT, 8, 1, 256, NULL, "KV heads"}
#define K_M {"M", KVB_P_INT, 256, 1, GATHER_MAX_M, NULL, "chunk slots per (b, h)"}
#define K_C {"c", KVB_P_INT, 8, 1, 4096, NULL, "tokens per chunk"}
#define K_D {"D", KVB_P_INT, 128, 1, 1024, NULL, "head dimension"}
#define K_CTX {"ctx", KVB_P_INT, 131072, 1, 1 << 24, NULL, "context tokens per sequence on the host (ids in [0, ctx/c))"}
#define K_STRIDE {"host_stride", KVB_P_INT, 0, 0, 1 << 30, NULL, "chunks between (b, h) runs on the host; 0: ctx/c"}
#define K_SPARSE {"sparse_start", KVB_P_INT, 416, 0, 1 << 20, NULL, "first buffer token of the sparse region (ShadowKV: 32 local + 384 outlier)"}
#define K_EXTRA {"extra", KVB_P_INT, 64, 0, 1 << 20, NULL, "buffer tokens after the sparse region"}
#define K_HIT {"hit", KVB_P_FLOAT, 0.6, 0, 1, NULL, "fraction of the old chunks picked again"}
#define K_EMPTY {"empty", KVB_P_FLOAT, 0, 0, 1, NULL, "fraction of old slots that are empty (-1)"}
#define K_SEED {"seed", KVB_P_INT, 1, 0, 1e15, NULL, "input seed"}

static const kvb_param index_scan_params[] = {
    K_BATCH, K_HKV, K_M,
    {"ids", KVB_P_INT, 16384, 1, 1 << 30, NULL, "chunk ids are drawn from [0, ids)"},
    K_HIT, K_EMPTY, K_SEED,
};
static const kvb_param gather_copy_params[] = {
    K_BATCH, K_HKV, K_M, K_C, K_D, K_CTX, K_STRIDE, K_SPARSE, K_EXTRA, K_HIT, K_EMPTY, K_SEED,
    {"impl", KVB_P_ENUM, 0, 0, 0, NULL, "implementation (the impl table)"},
};
static const kvb_param gather_d2d_params[] = {
    K_BATCH, K_HKV, K_M, K_C, K_D, K_CTX, K_SPARSE, K_EXTRA, K_HIT, K_EMPTY, K_SEED,
    {"impl", KVB_P_ENUM, 0, 0, 0, NULL, "implementation (the impl table)"},
};
static const kvb_param gather_all_params[] = {
    K_BATCH, K_HKV, K_M, K_C, K_D, K_CTX, K_STRIDE, K_SPARSE, K_EXTRA, K_SEED,
    {"impl", KVB_P_ENUM, 0, 0, 0, NULL, "implementation (the impl table)"},
};
static const kvb_param gather_step_params[] = {
    K_BATCH, K_HKV, K_M, K_C, K_D, K_CTX, K_SPARSE, K_EXTRA, K_HIT, K_EMPTY, K_SEED,
};
static const kvb_param packed_load_params[] = {
    K_BATCH,
    {"layers", KVB_P_INT, 8, 1, PACKED_MAX_LAYERS, NULL, "sparse layers loaded in one launch"},
    {"T", KVB_P_INT, 131072, 1, 1 << 24, NULL, "prompt tokens per sequence on the host"},
    {"k", KVB_P_INT, 2048, 1, 1 << 24, NULL, "selected tokens"},
    K_HKV, K_D, K_SEED,
    {"impl", KVB_P_ENUM, 0, 0, 0, NULL, "implementation (the impl table)"},
};

#define NPARAMS(a) ((int)(sizeof(a) / sizeof((a)[0])))

/* ---- layouts and validation ---- */

static int has_key(const kvb_case *c, const char *name)
{
    for (int i = 0; i < c->op->n_params; i++)
        if (!strcmp(c->op->params[i].name, name)) return 1;
    return 0;
}

static gather_layout layout_of(const kvb_case *c)
{
    gather_layout g;
    g.B = kvb_case_int(c, "B");
    g.Hkv = kvb_case_int(c, "Hkv");
    g.M = kvb_case_int(c, "M");
    g.c = kvb_case_int(c, "c");
    g.D = kvb_case_int(c, "D");
    g.sparse_start = kvb_case_int(c, "sparse_start");
    g.NB = (int)(g.sparse_start + (int64_t)g.M * g.c + kvb_case_i64(c, "extra"));
    g.host_chunks = kvb_case_i64(c, "ctx") / g.c;
    int64_t stride = has_key(c, "host_stride") ? kvb_case_i64(c, "host_stride") : 0;
    g.host_stride = stride ? stride : g.host_chunks;
    return g;
}

/* How many old ids are valid, how many new ids are hits, for one row. */
static void step_counts(const kvb_case *c, int M, int *n_old, int *n_hit)
{
    double hit = has_key(c, "hit") ? kvb_case_get(c, "hit") : 0;
    double empty = has_key(c, "empty") ? kvb_case_get(c, "empty") : 1;
    *n_old = M - (int)lround(empty * M);
    *n_hit = (int)lround(hit * *n_old);
}

static int check_id_room(const kvb_case *c, int M, int64_t n_ids, const char *range)
{
    int n_old, n_hit;
    step_counts(c, M, &n_old, &n_hit);
    if (M > n_ids)
        return kvb_fail(KVB_EINVAL, "%s: M=%d out of range [1, %s = %lld]: a step's chunk ids are distinct chunks of the host range",
                        c->op->name, M, range, (long long)n_ids);
    int64_t need = (int64_t)n_old + (M - n_hit);
    if (need > n_ids)
        return kvb_fail(KVB_EINVAL, "%s: %s = %lld chunk ids cannot hold %d old and %d new chunks with %d hits: need >= %lld",
                        c->op->name, range, (long long)n_ids, n_old, M, n_hit, (long long)need);
    return KVB_OK;
}

static int validate_gather(const kvb_case *c)
{
    gather_layout g = layout_of(c);
    if (kvb_case_i64(c, "ctx") < g.c)
        return kvb_fail(KVB_EINVAL, "%s: ctx=%lld out of range [c = %d, %d]: the host holds at least one chunk", c->op->name,
                        (long long)kvb_case_i64(c, "ctx"), g.c, 1 << 24);
    if (check_id_room(c, g.M, g.host_chunks, "ctx/c")) return KVB_EINVAL;
    return gather_layout_check(&g, c->op->name);
}

static int validate_index_scan(const kvb_case *c)
{
    return check_id_room(c, kvb_case_int(c, "M"), kvb_case_i64(c, "ids"), "ids");
}

static int validate_packed(const kvb_case *c)
{
    packed_layout p = {kvb_case_int(c, "B"), kvb_case_int(c, "layers"), kvb_case_int(c, "T"), kvb_case_int(c, "k"),
                       kvb_case_int(c, "Hkv"), kvb_case_int(c, "D")};
    return packed_layout_check(&p, "packed_load");
}

/* the host pool: Vh (gather_copy, gather_copy_all, gather_step), KVh (packed_load) */
static size_t pool_bytes_gather(const kvb_case *c)
{
    gather_layout g = layout_of(c);
    return kvb_host_bytes_sat((double)g.B * g.Hkv * (double)g.host_stride * (double)gather_chunk_bytes(&g));
}

static size_t pool_bytes_packed(const kvb_case *c)
{
    return kvb_host_bytes_sat((double)kvb_case_i64(c, "layers") * kvb_case_i64(c, "B") * kvb_case_i64(c, "T") * 4 *
                              kvb_case_i64(c, "Hkv") * kvb_case_i64(c, "D"));
}

/* ---- inputs ---- */

/* Draw `n` distinct ids from [0, range) (partial Fisher-Yates over a scratch permutation). */
static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Pinned host values: element i of the pool is normal(seed, "host_kv", i); fill what is not valid. */
static kvb_bf16 *host_values(uint64_t seed, size_t bytes)
{
    size_t valid;
    kvb_bf16 *p = kvb_host_pool(bytes, "host_kv", seed, &valid);
    size_t first = valid / 2, n = bytes / 2;
    if (first < n) kvb_fill_bf16_normal(p + first, (int64_t)(n - first), seed, kvb_stream_of("host_kv"), (int64_t)first, 0, 1);
    kvb_host_pool_set_valid(bytes);
    return p;
}

static void fill_normal(kvb_tensor *t, uint64_t seed)
{
    kvb_fill_bf16_normal(t->h, t->n, seed, kvb_stream_of(t->name), 0, 0, 1);
}

/* ---- op-private state ---- */

typedef struct gather_priv {
    gather_layout g;
    packed_layout p;
    int n_hit, n_moved, n_miss; /* summed over rows */
    kvb_bf16 *staging;          /* cpu_gather: pinned */
    size_t staging_bytes;
    void **batch_dst, **batch_src; /* ce_batch */
    size_t *batch_size;
#if KVB_HAVE_CUDA
    gather_step_plan plan, plan_timed; /* gather_step: planned once, then only enqueued */
    int planned;
#endif
} gather_priv;

static gather_priv *priv_new(kvb_run *r)
{
    gather_priv *p = kvb_run_alloc(r, sizeof *p, "gather state");
    r->priv = p;
    return p;
}

static void count_moves(gather_priv *p, const int32_t *offsets, const int32_t *cnts, int rows, int M)
{
    p->n_hit = p->n_moved = p->n_miss = 0;
    for (int r = 0; r < rows; r++) {
        p->n_hit += cnts[r];
        p->n_miss += M - cnts[r];
        for (int i = 0; i < cnts[r]; i++) p->n_moved += offsets[(int64_t)r * M + i] != i;
    }
}

static int64_t dims5(int64_t *s, int64_t a, int64_t b, int64_t c, int64_t d, int64_t e)
{
    s[0] = a, s[1] = b, s[2] = c, s[3] = d, s[4] = e;
    return a * b * c * d * e;
}

/* Vh as a host-mapped tensor (no device copy; too large to dump in the bench tier). */
static kvb_tensor *add_host_values(kvb_run *r, const gather_layout *g)
{
    int64_t s[5];
    dims5(s, g->B, g->Hkv, g->host_stride, g->c, g->D);
    kvb_tensor *vh = kvb_run_tensor(r, "Vh", KVB_BF16, 5, s, 0);
    vh->role = KVB_IN;
    vh->flags = KVB_T_HOST_MAPPED | KVB_T_NO_DUMP;
    vh->h = host_values(r->seed, (size_t)vh->n * 2);
    return vh;
}

/* ---- index_scan ---- */

static int setup_index_scan(kvb_run *r)
{
    const kvb_case *c = r->c;
    int B = kvb_case_int(c, "B"), H = kvb_case_int(c, "Hkv"), M = kvb_case_int(c, "M"), n_old, n_hit;
    step_counts(c, M, &n_old, &n_hit);
    int64_t s[3] = {B, H, M};
    kvb_tensor *cached = kvb_run_tensor(r, "cached_ids", KVB_I32, 3, s, KVB_INOUT);
    kvb_tensor *fresh = kvb_run_tensor(r, "new_ids", KVB_I32, 3, s, KVB_IN);
    kvb_tensor *off = kvb_run_tensor(r, "offsets", KVB_I32, 3, s, KVB_OUT);
    kvb_tensor *cnts = kvb_run_tensor(r, "cnts", KVB_I32, 2, s, KVB_OUT);
    int rc = kvb_make_step_ids(r->seed, B * H, M, kvb_case_i64(c, "ids"), n_old, n_hit, cached->h, fresh->h);
    if (rc) return rc;
    memcpy(cached->ref, cached->h, sizeof(int32_t) * (size_t)cached->n);
    return ref_index_scan(cached->ref, fresh->h, off->ref, cnts->ref, B, H, M);
}

static int ref_check_index_scan(kvb_run *r)
{
    kvb_tensor *cached = kvb_run_find(r, "cached_ids"), *fresh = kvb_run_find(r, "new_ids");
    return kvb_index_scan_properties(cached->h, fresh->h, cached->ref, kvb_run_find(r, "offsets")->ref,
                                     kvb_run_find(r, "cnts")->ref, (int)(cached->n / cached->shape[2]),
                                     (int)cached->shape[2]);
}

static int launch_index_scan(kvb_run *r)
{
#if KVB_HAVE_CUDA
    int64_t *s = kvb_run_find(r, "cached_ids")->shape;
    return index_scan(kvb_run_find(r, "cached_ids")->d, kvb_run_find(r, "new_ids")->d, kvb_run_find(r, "offsets")->d,
                      kvb_run_find(r, "cnts")->d, (int)s[0], (int)s[1], (int)s[2], r->stream);
#else
    (void)r;
    return KVB_EDEVICE;
#endif
}

static void cost_index_scan(const kvb_run *r, kvb_cost *c)
{
    int64_t n = kvb_run_find((kvb_run *)r, "cached_ids")->n;
    c->bytes_dev = 16.0 * n; /* read old and new ids, write offsets and new tags */
    c->ceiling = KVB_CEIL_D2D;
}

/* ---- gather_copy / gather_copy_d2d / gather_step: shared setup ---- */

/* Inputs of one step: old and new ids, and the reference index_scan result. */
static int step_inputs(kvb_run *r, const gather_layout *g, int32_t *old_ids, int32_t *new_ids, int32_t *offsets,
                       int32_t *cnts)
{
    int n_old, n_hit;
    step_counts(r->c, g->M, &n_old, &n_hit);
    int rc = kvb_make_step_ids(r->seed, g->B * g->Hkv, g->M, g->host_chunks, n_old, n_hit, old_ids, new_ids);
    return rc ? rc : ref_index_scan(old_ids, new_ids, offsets, cnts, g->B, g->Hkv, g->M); /* old_ids: the new tags */
}

static kvb_tensor *add_buffer(kvb_run *r, const char *name, const gather_layout *g)
{
    int64_t s[4] = {g->B, g->Hkv, g->NB, g->D};
    kvb_tensor *t = kvb_run_tensor(r, name, KVB_BF16, 4, s, KVB_INOUT);
    t->cmp = KVB_CMP_EXACT;
    fill_normal(t, r->seed);
    kvb_copy_parallel(t->ref, t->h, (size_t)t->n * 2);
    return t;
}

/* The ordering workspace of gather_copy / gather_copy_d2d, zeroed once (a SCRATCH tensor). */
static void add_workspace(kvb_run *r, const char *name, const gather_layout *g)
{
    int64_t bytes[1] = {1};
#if KVB_HAVE_CUDA
    bytes[0] = (int64_t)gather_copy_workspace_bytes(g);
#else
    (void)g;
#endif
    kvb_run_tensor(r, name, KVB_U8, 1, bytes, KVB_SCRATCH);
}

/* Layout, then the inputs gather_copy and gather_copy_d2d share: offsets and cnts of one step, as
 * the reference index_scan computes them. */
static int setup_compaction(kvb_run *r, gather_priv **pp, kvb_tensor **off, kvb_tensor **cnts)
{
    gather_priv *p = *pp = priv_new(r);
    gather_layout *g = &p->g;
    *g = layout_of(r->c);
    int64_t s[3] = {g->B, g->Hkv, g->M};
    *off = kvb_run_tensor(r, "offsets", KVB_I32, 3, s, KVB_IN);
    *cnts = kvb_run_tensor(r, "cnts", KVB_I32, 2, s, KVB_IN);
    int32_t *old = kvb_run_alloc(r, sizeof(int32_t) * (size_t)(*off)->n, "old chunk ids");
    int32_t *fresh = kvb_run_alloc(r, sizeof(int32_t) * (size_t)(*off)->n, "new chunk ids");
    int rc = step_inputs(r, g, old, fresh, (*off)->h, (*cnts)->h);
    kvb_run_free(r, old), kvb_run_free(r, fresh);
    if (rc) return rc;
    count_moves(p, (*off)->h, (*cnts)->h, g->B * g->Hkv, g->M);
    add_workspace(r, "workspace", g);
    return KVB_OK;
}

static int setup_gather_copy(kvb_run *r)
{
    kvb_tensor *off, *cnts;
    gather_priv *p;
    int rc = setup_compaction(r, &p, &off, &cnts);
    if (rc) return rc;
    kvb_tensor *vh = add_host_values(r, &p->g);
    kvb_tensor *vbuf = add_buffer(r, "Vbuf", &p->g);
    return ref_gather_copy(vh->h, vbuf->ref, off->h, cnts->h, &p->g);
}

static int setup_gather_d2d(kvb_run *r)
{
    kvb_tensor *off, *cnts;
    gather_priv *p;
    int rc = setup_compaction(r, &p, &off, &cnts);
    if (rc) return rc;
    kvb_tensor *kbuf = add_buffer(r, "Kbuf", &p->g);
    return ref_gather_copy_d2d(kbuf->ref, off->h, cnts->h, &p->g);
}

static int setup_gather_all(kvb_run *r)
{
    gather_priv *p = priv_new(r);
    gather_layout *g = &p->g;
    *g = layout_of(r->c);
    int64_t s[3] = {g->B, g->Hkv, g->M};
    kvb_tensor *ids = kvb_run_tensor(r, "ids", KVB_I32, 3, s, KVB_IN);
    int32_t *perm = kvb_run_alloc(r, sizeof(int32_t) * (size_t)g->host_chunks, "chunk id permutation");
    for (int row = 0; row < g->B * g->Hkv; row++) { /* ascending, as top-k returns them */
        kvb_rng rng = kvb_rng_make(r->seed, kvb_stream_of("ids") + (uint64_t)row);
        int32_t *out = (int32_t *)ids->h + (int64_t)row * g->M;
        kvb_draw_distinct(&rng, perm, g->host_chunks, g->M, out);
        qsort(out, (size_t)g->M, sizeof(int32_t), cmp_i32);
    }
    kvb_run_free(r, perm);
    p->n_miss = g->B * g->Hkv * g->M;
    kvb_tensor *vh = add_host_values(r, g);
    kvb_tensor *vbuf = add_buffer(r, "Vbuf", g);
    return ref_gather_copy_all(vh->h, vbuf->ref, ids->h, g);
}

static int setup_gather_step(kvb_run *r)
{
    gather_priv *p = priv_new(r);
    gather_layout *g = &p->g;
    *g = layout_of(r->c);
    int64_t s[3] = {g->B, g->Hkv, g->M};
    kvb_tensor *cached = kvb_run_tensor(r, "cached_ids", KVB_I32, 3, s, KVB_INOUT);
    kvb_tensor *fresh = kvb_run_tensor(r, "new_ids", KVB_I32, 3, s, KVB_IN);
    kvb_tensor *off = kvb_run_tensor(r, "offsets", KVB_I32, 3, s, KVB_OUT);
    kvb_tensor *cnts = kvb_run_tensor(r, "cnts", KVB_I32, 2, s, KVB_OUT);
    int n_old, n_hit;
    step_counts(r->c, g->M, &n_old, &n_hit);
    int rc = kvb_make_step_ids(r->seed, g->B * g->Hkv, g->M, g->host_chunks, n_old, n_hit, cached->h, fresh->h);
    if (rc) return rc;
    memcpy(cached->ref, cached->h, sizeof(int32_t) * (size_t)cached->n);
    rc = ref_index_scan(cached->ref, fresh->h, off->ref, cnts->ref, g->B, g->Hkv, g->M);
    if (rc) return rc;
    count_moves(p, off->ref, cnts->ref, g->B * g->Hkv, g->M);
    kvb_tensor *vh = add_host_values(r, g);
    kvb_tensor *vbuf = add_buffer(r, "Vbuf", g), *kbuf = add_buffer(r, "Kbuf", g);
    add_workspace(r, "workspace_v", g);
    add_workspace(r, "workspace_k", g);
    if ((rc = ref_gather_copy(vh->h, vbuf->ref, off->ref, cnts->ref, g))) return rc;
    return ref_gather_copy_d2d(kbuf->ref, off->ref, cnts->ref, g);
}

static int setup_packed(kvb_run *r)
{
    gather_priv *pr = priv_new(r);
    packed_layout *p = &pr->p;
    const kvb_case *c = r->c;
    *p = (packed_layout){kvb_case_int(c, "B"), kvb_case_int(c, "layers"), kvb_case_int(c, "T"), kvb_case_int(c, "k"),
                         kvb_case_int(c, "Hkv"), kvb_case_int(c, "D")};
    int64_t row = packed_row_elems(p);
    int64_t si[2] = {p->B, p->k};
    kvb_tensor *idx = kvb_run_tensor(r, "idx", KVB_I32, 2, si, KVB_IN);
    int32_t *perm = kvb_run_alloc(r, sizeof(int32_t) * (size_t)p->T, "token permutation");
    for (int b = 0; b < p->B; b++) { /* ascending token positions, shared by all heads */
        kvb_rng rng = kvb_rng_make(r->seed, kvb_stream_of("idx") + (uint64_t)b);
        int32_t *out = (int32_t *)idx->h + (int64_t)b * p->k;
        kvb_draw_distinct(&rng, perm, p->T, p->k, out);
        qsort(out, (size_t)p->k, sizeof(int32_t), cmp_i32);
    }
    kvb_run_free(r, perm);
    int64_t sh[4] = {p->layers, p->B, p->T, row}, sg[4] = {p->layers, p->B, p->k, row};
    kvb_tensor *kvh = kvb_run_tensor(r, "KVh", KVB_BF16, 4, sh, 0);
    kvh->role = KVB_IN;
    kvh->flags = KVB_T_HOST_MAPPED | KVB_T_NO_DUMP;
    kvh->h = host_values(r->seed, (size_t)kvh->n * 2);
    kvb_tensor *kvg = kvb_run_tensor(r, "KVg", KVB_BF16, 4, sg, KVB_OUT);
    kvg->cmp = KVB_CMP_EXACT;
    const kvb_bf16 *src[PACKED_MAX_LAYERS];
    kvb_bf16 *dst[PACKED_MAX_LAYERS];
    for (int l = 0; l < p->layers; l++) {
        src[l] = (const kvb_bf16 *)kvh->h + (int64_t)l * p->B * p->T * row;
        dst[l] = (kvb_bf16 *)kvg->ref + (int64_t)l * p->B * p->k * row;
    }
    return ref_packed_load(src, dst, idx->h, p);
}

/* ---- launches ---- */

#if KVB_HAVE_CUDA
/* Pinned staging for the cpu_gather baselines, sized once from the layout (the first launch is a
 * warm-up, outside the timed loop). */
static void *staging(gather_priv *p, size_t bytes)
{
    if (p->staging_bytes < bytes) {
        kvb_pinned_free(p->staging);
        p->staging = kvb_pinned_alloc(bytes);
        p->staging_bytes = bytes;
    }
    return p->staging;
}

static int launch_gather_copy(kvb_run *r)
{
    gather_priv *p = r->priv;
    const gather_layout *g = &p->g;
    kvb_tensor *vh = kvb_run_find(r, "Vh"), *vbuf = kvb_run_find(r, "Vbuf"), *off = kvb_run_find(r, "offsets"),
               *cnts = kvb_run_find(r, "cnts"), *ws = kvb_run_find(r, "workspace");
    const char *impl = kvb_run_impl(r);
    if (!strcmp(impl, "kernel")) return gather_copy(vh->d, vbuf->d, off->d, cnts->d, g, ws->d, r->stream);
    if (!strcmp(impl, "memcpy_chunks")) return gather_memcpy_chunks(vbuf->d, vh->h, off->h, cnts->h, g, 1, r->stream);
    /* cpu_gather: hits by the suite's d2d kernel while the CPU gathers the misses */
    int rc = gather_copy_d2d(vbuf->d, off->d, cnts->d, g, ws->d, r->stream);
    if (rc) return rc;
    return gather_cpu_misses(vbuf->d, vh->h, off->h, cnts->h, g, staging(p, gather_cpu_staging_bytes(g)), r->stream);
}

static int launch_gather_d2d(kvb_run *r)
{
    gather_priv *p = r->priv;
    kvb_tensor *kbuf = kvb_run_find(r, "Kbuf"), *off = kvb_run_find(r, "offsets"), *cnts = kvb_run_find(r, "cnts");
    if (!strcmp(kvb_run_impl(r), "memcpy_chunks"))
        return gather_memcpy_chunks(kbuf->d, NULL, off->h, cnts->h, &p->g, 0, r->stream);
    return gather_copy_d2d(kbuf->d, off->d, cnts->d, &p->g, kvb_run_find(r, "workspace")->d, r->stream);
}

static int launch_gather_all(kvb_run *r)
{
    gather_priv *p = r->priv;
    const gather_layout *g = &p->g;
    kvb_tensor *vh = kvb_run_find(r, "Vh"), *vbuf = kvb_run_find(r, "Vbuf"), *ids = kvb_run_find(r, "ids");
    const char *impl = kvb_run_impl(r);
    if (!strcmp(impl, "kernel")) return gather_copy_all(vh->d, vbuf->d, ids->d, g, r->stream);
    if (!strcmp(impl, "tma")) return gather_copy_all_tma(vh->d, vbuf->d, ids->d, g, r->stream);
    if (!strcmp(impl, "ce_batch")) {
        if (!p->batch_dst) {
            size_t n = (size_t)g->B * g->Hkv * g->M;
            p->batch_dst = kvb_run_alloc(r, n * sizeof(void *), "ce_batch descriptors");
            p->batch_src = kvb_run_alloc(r, n * sizeof(void *), "ce_batch descriptors");
            p->batch_size = kvb_run_alloc(r, n * sizeof(size_t), "ce_batch descriptors");
        }
        return gather_all_ce_batch(vbuf->d, vh->h, ids->h, g, p->batch_dst, p->batch_src, p->batch_size, r->stream);
    }
    if (!strcmp(impl, "memcpy_chunks")) return gather_all_memcpy_chunks(vbuf->d, vh->h, ids->h, g, r->stream);
    return gather_all_cpu(vbuf->d, vh->h, ids->h, g, staging(p, gather_cpu_staging_bytes(g)), r->stream);
}

/* gather_step is a composition (kernels/step/step_gather.h): planned here once, enqueued by each launch;
 * a second plan records per-stage times for the report, outside the timed loop. */
static int gpu_setup_step(kvb_run *r)
{
    gather_priv *p = r->priv;
    kvb_tensor *cached = kvb_run_find(r, "cached_ids"), *fresh = kvb_run_find(r, "new_ids"),
               *off = kvb_run_find(r, "offsets"), *cnts = kvb_run_find(r, "cnts");
    for (int timed = 0; timed < 2; timed++) {
        int rc = gather_step_plan_make(timed ? &p->plan_timed : &p->plan, r->c->id, &p->g, cached->d, fresh->d, off->d,
                                       cnts->d, kvb_run_find(r, "Vh")->d, kvb_run_find(r, "Vbuf")->d,
                                       kvb_run_find(r, "Kbuf")->d, kvb_run_find(r, "workspace_v")->d,
                                       kvb_run_find(r, "workspace_k")->d, r->stream, r->stream2, timed);
        if (rc) return rc;
    }
    p->planned = 1;
    return KVB_OK;
}

static int launch_gather_step(kvb_run *r)
{
    gather_priv *p = r->priv;
    return gather_step_enqueue(r->stage_timing ? &p->plan_timed : &p->plan);
}

static int stage_times_step(kvb_run *r)
{
    gather_priv *p = r->priv;
    return kvb_run_stage_times(r, &p->plan_timed.step);
}

static int launch_packed(kvb_run *r)
{
    gather_priv *pr = r->priv;
    const packed_layout *p = &pr->p;
    kvb_tensor *kvh = kvb_run_find(r, "KVh"), *kvg = kvb_run_find(r, "KVg"), *idx = kvb_run_find(r, "idx");
    int64_t row = packed_row_elems(p);
    const kvb_bf16 *src[PACKED_MAX_LAYERS];
    kvb_bf16 *dst[PACKED_MAX_LAYERS];
    for (int l = 0; l < p->layers; l++) {
        src[l] = (const kvb_bf16 *)kvh->h + (int64_t)l * p->B * p->T * row;
        dst[l] = (kvb_bf16 *)kvg->d + (int64_t)l * p->B * p->k * row;
    }
    const char *impl = kvb_run_impl(r);
    if (!strcmp(impl, "kernel")) return packed_load(src, dst, idx->d, p, r->stream);
    if (!strcmp(impl, "memcpy_rows")) return packed_load_memcpy_rows(src, dst, idx->h, p, r->stream);
    return packed_load_cpu(src, dst, idx->h, p, staging(pr, packed_cpu_staging_bytes(p)), r->stream);
}
#else
static int no_device(kvb_run *r) { (void)r; return KVB_EDEVICE; }
#define launch_gather_copy no_device
#define launch_gather_d2d no_device
#define launch_gather_all no_device
#define launch_gather_step no_device
#define launch_packed no_device
#define gpu_setup_step NULL
#define stage_times_step NULL
#endif

static void teardown_gather(kvb_run *r)
{
    gather_priv *p = r->priv;
    if (!p) return;
#if KVB_HAVE_CUDA
    if (p->staging) kvb_pinned_free(p->staging);
    if (p->planned) {
        gather_step_plan_destroy(&p->plan);
        gather_step_plan_destroy(&p->plan_timed);
    }
#endif
    r->priv = NULL;
}

/* ---- host memory (kvb_op.host_bytes) ---- */

/* index_scan: cached_ids in and out, new_ids in, offsets and cnts out; the id draw's and the
 * reference's scratch */
static size_t host_bytes_index_scan(const kvb_case *c)
{
    const double rows = (double)kvb_case_int(c, "B") * kvb_case_int(c, "Hkv"), M = kvb_case_int(c, "M");
    return kvb_host_bytes_sat(rows * M * 4 * (KVB_HOLD_INOUT + KVB_HOLD_IN + KVB_HOLD_OUT) + KVB_HOLD_OUT * rows * 4 +
                              4.0 * kvb_case_i64(c, "ids") + 8 * M + 12 * M);
}

/* The ShadowKV step cases: ids, offsets and cnts (inputs, or outputs and in-out for gather_step), the
 * buffers in and out (Vbuf; Kbuf for d2d and the step), the pool for the host values, the id draw's
 * scratch, the references' copy of a row's slots, the ce_batch descriptors */
static size_t host_bytes_gather(const kvb_case *c)
{
    const gather_layout g = layout_of(c);
    const double rows = (double)g.B * g.Hkv, ids = rows * g.M * 4, chunk = (double)gather_chunk_bytes(&g);
    const double buffer = rows * g.NB * g.D * 2;
    const int step = !strcmp(c->op->name, "gather_step"), d2d = !strcmp(c->op->name, "gather_copy_d2d");
    double bytes = 4.0 * (double)g.host_chunks + 8.0 * g.M + chunk * g.M + 3 * 8 * rows * g.M;
    if (step) bytes += ids * (KVB_HOLD_INOUT + KVB_HOLD_IN + KVB_HOLD_OUT) + KVB_HOLD_OUT * rows * 4 + 2 * KVB_HOLD_INOUT * buffer;
    else bytes += 3 * ids + KVB_HOLD_IN * rows * 4 + KVB_HOLD_INOUT * buffer;
    if (!d2d) bytes += (double)pool_bytes_gather(c);
    return kvb_host_bytes_sat(bytes);
}

/* packed_load: idx in, KVg out, the token permutation, the pool for KVh */
static size_t host_bytes_packed(const kvb_case *c)
{
    const double B = kvb_case_int(c, "B"), layers = kvb_case_int(c, "layers"), T = kvb_case_int(c, "T"),
                 k = kvb_case_int(c, "k"), row = 2.0 * kvb_case_int(c, "Hkv") * kvb_case_int(c, "D");
    return kvb_host_bytes_sat(KVB_HOLD_IN * B * k * 4 + KVB_HOLD_OUT * layers * B * k * row * 2 + 4 * T +
                              (double)pool_bytes_packed(c));
}

/* ---- bytes ---- */

static double chunk_bytes_of(const kvb_run *r) { return (double)gather_chunk_bytes(&((gather_priv *)r->priv)->g); }

/* Goal (kernels/gather_copy/NOTES.md, Budget) of the suite's host-reading kernels (impl=kernel; the
 * baselines are compared, not held to it): the host bytes at >= 95% of the contiguous pinned copy of as
 * many bytes, measured in this run. gather_copy's hit moves run on the device beside its misses and
 * are not in the goal's time. */
static void set_h2d_goal(const kvb_run *r, kvb_cost *c)
{
    if (c->bytes_h2d <= 0 || !r->ceil || !r->ceil->measured || strcmp(kvb_run_impl(r), "kernel")) return;
    c->goal_us = kvb_h2d_contiguous_seconds((size_t)c->bytes_h2d) * 1e6 / 0.95;
    c->goal_text = "95% of the pinned H2D copy rate";
}

static void cost_gather_copy(const kvb_run *r, kvb_cost *c)
{
    gather_priv *p = r->priv;
    double chunk = chunk_bytes_of(r);
    c->bytes_h2d = p->n_miss * chunk;
    c->bytes_dev = (2.0 * p->n_moved + p->n_miss) * chunk; /* hit moves read + write; misses written */
    c->ceiling = KVB_CEIL_H2D;
    set_h2d_goal(r, c);
}

static void cost_gather_d2d(const kvb_run *r, kvb_cost *c)
{
    gather_priv *p = r->priv;
    c->bytes_dev = 2.0 * p->n_moved * chunk_bytes_of(r);
    c->ceiling = KVB_CEIL_D2D;
}

static void cost_gather_all(const kvb_run *r, kvb_cost *c)
{
    gather_priv *p = r->priv;
    c->bytes_h2d = p->n_miss * chunk_bytes_of(r);
    c->bytes_dev = c->bytes_h2d;
    c->ceiling = KVB_CEIL_H2D;
    set_h2d_goal(r, c);
}

/* Goal (kernels/gather_copy/NOTES.md, Budget): step <= 1.1 x (miss bytes / host bw + 2 x hit bytes / device bw) + 10 us, with the
 * bandwidths measured in this run (contiguous pinned H2D copy of the miss bytes; cudaMemcpy D2D).
 * Hit bytes count the hit chunks of both V and K, which the step moves. */
static void cost_gather_step(const kvb_run *r, kvb_cost *c)
{
    gather_priv *p = r->priv;
    double chunk = chunk_bytes_of(r);
    double miss = p->n_miss * chunk, hit = 2.0 * p->n_hit * chunk;
    c->bytes_h2d = miss;
    c->bytes_dev = 2.0 * 2.0 * p->n_moved * chunk + miss + 16.0 * p->g.B * p->g.Hkv * p->g.M;
    c->ceiling = KVB_CEIL_H2D;
    const kvb_ceilings *ce = r->ceil;
    if (ce && ce->measured) {
        double host_s = miss > 0 ? kvb_h2d_contiguous_seconds((size_t)miss) : 0;
        c->goal_us = 1.1 * (host_s * 1e6 + 2.0 * hit / (ce->d2d_memcpy_GBps * 1e9) * 1e6) + 10.0;
        c->goal_text = "1.1 x (miss/host_bw + 2 x hit/dev_bw) + 10 us";
    }
}

static void cost_packed(const kvb_run *r, kvb_cost *c)
{
    const packed_layout *p = &((gather_priv *)r->priv)->p;
    c->bytes_h2d = (double)p->layers * p->B * p->k * packed_row_elems(p) * 2;
    c->bytes_dev = c->bytes_h2d;
    c->ceiling = KVB_CEIL_H2D;
    set_h2d_goal(r, c);
}

/* ---- registry entries ---- */

/* ---- implementations (the impl= choices; baselines are timed with their host work included) ---- */

#define IMPL_KERNEL {"kernel", NULL, 0, "the suite's CUDA kernel"}
#define IMPL_MEMCPY_CHUNKS {"memcpy_chunks", NULL, 1, "one cudaMemcpyAsync per chunk"}
#define IMPL_CPU_GATHER {"cpu_gather", NULL, 1, "the CPU gathers into a pinned staging buffer, then one copy"}
static const kvb_impl gather_copy_impls[] = {IMPL_KERNEL, IMPL_MEMCPY_CHUNKS, IMPL_CPU_GATHER};
static const kvb_impl gather_d2d_impls[] = {IMPL_KERNEL, IMPL_MEMCPY_CHUNKS};
static const kvb_impl gather_all_impls[] = {
    IMPL_KERNEL,
    {"tma", NULL, 0, "the SM's bulk-copy engine (cp.async.bulk) reading pinned host memory"},
    {"ce_batch", NULL, 1, "the copy engines: one cudaMemcpyBatchAsync over the chunks"},
    IMPL_MEMCPY_CHUNKS,
    IMPL_CPU_GATHER,
};
static const kvb_impl packed_impls[] = {
    IMPL_KERNEL,
    {"memcpy_rows", NULL, 1, "one cudaMemcpyAsync per row"},
    IMPL_CPU_GATHER,
};

const kvb_op op_index_scan = {
    .name = "index_scan",
    .family = "gather_copy",
    .summary = "ShadowKV cache lookup: hits by old slot, misses ascending",
    .params = index_scan_params,
    .n_params = NPARAMS(index_scan_params),
    .validate = validate_index_scan,
    .host_bytes = host_bytes_index_scan,
    .setup = setup_index_scan,
    .ref_check = ref_check_index_scan,
    .launch = launch_index_scan,
    .cost = cost_index_scan,
    .teardown = teardown_gather,
};

const kvb_op op_gather_copy = {
    .name = "gather_copy",
    .family = "gather_copy",
    .summary = "ShadowKV value fetch: hits moved in the buffer, misses from pinned host memory",
    .params = gather_copy_params,
    .n_params = NPARAMS(gather_copy_params),
    KVB_IMPLS(gather_copy_impls),
    .validate = validate_gather,
    .host_bytes = host_bytes_gather,
    .host_pool_bytes = pool_bytes_gather,
    .setup = setup_gather_copy,
    .launch = launch_gather_copy,
    .cost = cost_gather_copy,
    .teardown = teardown_gather,
};

const kvb_op op_gather_copy_d2d = {
    .name = "gather_copy_d2d",
    .family = "gather_copy",
    .summary = "ShadowKV key compaction: hits moved in the buffer",
    .params = gather_d2d_params,
    .n_params = NPARAMS(gather_d2d_params),
    KVB_IMPLS(gather_d2d_impls),
    .validate = validate_gather,
    .host_bytes = host_bytes_gather,
    .setup = setup_gather_d2d,
    .launch = launch_gather_d2d,
    .cost = cost_gather_d2d,
    .teardown = teardown_gather,
};

const kvb_op op_gather_copy_all = {
    .name = "gather_copy_all",
    .family = "gather_copy",
    .summary = "value fetch without a cache: every slot from pinned host memory",
    .params = gather_all_params,
    .n_params = NPARAMS(gather_all_params),
    KVB_IMPLS(gather_all_impls),
    .validate = validate_gather,
    .host_bytes = host_bytes_gather,
    .host_pool_bytes = pool_bytes_gather,
    .setup = setup_gather_all,
    .launch = launch_gather_all,
    .cost = cost_gather_all,
    .teardown = teardown_gather,
};

const kvb_op op_gather_step = {
    .name = "gather_step",
    .family = "gather_copy",
    .summary = "ShadowKV fetch step: index_scan, then gather_copy (V) beside gather_copy_d2d (K)",
    .params = gather_step_params,
    .n_params = NPARAMS(gather_step_params),
    .validate = validate_gather,
    .host_bytes = host_bytes_gather,
    .host_pool_bytes = pool_bytes_gather,
    .setup = setup_gather_step,
    .ref_check = ref_check_index_scan,
    .gpu_setup = gpu_setup_step,
    .launch = launch_gather_step,
    .cost = cost_gather_step,
    .teardown = teardown_gather,
    .stage_times = stage_times_step,
};

const kvb_op op_packed_load = {
    .name = "packed_load",
    .family = "gather_copy",
    .summary = "OmniKV packed load: selected prompt rows of a segment of layers from the host",
    .params = packed_load_params,
    .n_params = NPARAMS(packed_load_params),
    KVB_IMPLS(packed_impls),
    .validate = validate_packed,
    .host_bytes = host_bytes_packed,
    .host_pool_bytes = pool_bytes_packed,
    .setup = setup_packed,
    .launch = launch_packed,
    .cost = cost_packed,
    .teardown = teardown_gather,
};
