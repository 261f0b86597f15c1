/* ops_select.c: the selection family in the harness (contract and budget: kernels/select/NOTES.md).
 *
 * Kernel: topk. Implementations (impl=): kernel (rows split over several blocks when there are few,
 * so one row uses the whole GPU), one_block (one block per row whatever the shape, to compare).
 *
 * Inputs: scores [rows, n] fp32, seeded: normal, N(0, 1) as the external peer draws them; ties,
 * floor(4 z) / 4 (a few dozen distinct values, so the k-th value is tied many times and the
 * lower-index rule decides); equal, one value everywhere (every key ties). The rule is exact and
 * deterministic, so the indices are compared bit for bit with the reference (reference/select.c).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reference/select.h"
#include "harness/core/ceilings.h"
#include "harness/core/op.h"
#include "harness/ops/ops.h"
#if KVB_HAVE_CUDA
#include "kernels/select/select.h"
#endif

#define NPARAMS(a) ((int)(sizeof(a) / sizeof((a)[0])))
#define SELECT_MAX_N 2097152
#define SELECT_MAX_K 8192

static const kvb_param topk_params[] = {
    {"rows", KVB_P_INT, 1, 1, 1 << 24, NULL, "rows, each selected on its own"},
    {"n", KVB_P_INT, 131072, 1, SELECT_MAX_N, NULL, "scores per row (up to 2M)"},
    {"k", KVB_P_INT, 2048, 1, SELECT_MAX_K, NULL, "selected per row (up to 8192, at most n)"},
    {"dist", KVB_P_ENUM, 0, 0, 0, "normal|ties|equal", "scores: normal, ties (floor(4z)/4), equal (one value)"},
    {"seed", KVB_P_INT, 1, 0, 1e15, NULL, "input seed"},
    {"impl", KVB_P_ENUM, 0, 0, 0, NULL, "implementation (the impl table)"},
};

static int validate_topk(const kvb_case *c)
{
    const int n = kvb_case_int(c, "n"), k = kvb_case_int(c, "k");
    if (k > n) return kvb_fail(KVB_EINVAL, "topk: k=%d out of range [1, n = %d]", k, n);
    const double bytes = 4.0 * kvb_case_int(c, "rows") * n;
    if (bytes > 16e9) /* inputs of one case stay far below the GPU's memory and the reference's time */
        return kvb_fail(KVB_EINVAL, "topk: rows*n = %.0f scores out of range [1, 4e9] (16 GB)", bytes / 4);
    return KVB_OK;
}

static int setup_topk(kvb_run *r)
{
    const kvb_case *c = r->c;
    const int rows = kvb_case_int(c, "rows"), n = kvb_case_int(c, "n"), k = kvb_case_int(c, "k");
    int64_t ss[2] = {rows, n}, si[2] = {rows, k};
    kvb_tensor *s = kvb_run_tensor(r, "scores", KVB_FP32, 2, ss, KVB_IN);
    kvb_tensor *idx = kvb_run_tensor(r, "idx", KVB_I32, 2, si, KVB_OUT);
    idx->cmp = KVB_CMP_EXACT;
    if (s->n > (1 << 26)) s->flags |= KVB_T_NO_DUMP;
    int64_t ws[1] = {1};
#if KVB_HAVE_CUDA
    if (kvb_gpu_available()) ws[0] = (int64_t)topk_workspace_bytes(rows, n) + 1;
#endif
    kvb_run_tensor(r, "workspace", KVB_U8, 1, ws, KVB_SCRATCH);
    const char *dist = kvb_case_enum(c, "dist");
    float *x = s->h;
    const uint64_t stream = kvb_stream_of("scores");
    if (!strcmp(dist, "equal"))
        for (int64_t i = 0; i < s->n; i++) x[i] = 0.75f;
    else if (!strcmp(dist, "ties"))
        for (int64_t i = 0; i < s->n; i++) x[i] = (float)(floor(4.0 * kvb_normal01(r->seed, stream, (uint64_t)i)) / 4.0);
    else
        for (int64_t i = 0; i < s->n; i++) x[i] = (float)kvb_normal01(r->seed, stream, (uint64_t)i);
    return ref_topk(x, rows, n, n, k, idx->ref, k);
}

#if KVB_HAVE_CUDA
static int launch_topk(kvb_run *r)
{
    const kvb_case *c = r->c;
    const int n = kvb_case_int(c, "n"), k = kvb_case_int(c, "k");
    void *ws = strcmp(kvb_run_impl(r), "one_block") ? kvb_run_find(r, "workspace")->d : NULL;
    return topk_rows(kvb_run_find(r, "scores")->d, kvb_case_int(c, "rows"), n, n, k, 0, 0,
                     kvb_run_find(r, "idx")->d, k, ws, r->stream);
}
#else
static int launch_topk(kvb_run *r) { (void)r; return KVB_EDEVICE; }
#endif

/* Bytes: the scores read once, the indices written. Goal (kernels/select/NOTES.md): at most 3 reads of
 * the scores at the measured read rate plus 10 us; torch.topk of the same run is in the summary's peer
 * column. */
static void cost_topk(const kvb_run *r, kvb_cost *c)
{
    const double rows = kvb_case_int(r->c, "rows"), n = kvb_case_int(r->c, "n"), k = kvb_case_int(r->c, "k");
    c->bytes_dev = 4.0 * rows * n + 4.0 * rows * k;
    c->ceiling = KVB_CEIL_READ;
    if (r->ceil && r->ceil->measured) {
        c->goal_us = 3.0 * kvb_read_contiguous_seconds((size_t)(4.0 * rows * n)) * 1e6 + 10.0;
        c->goal_text = "3 reads of the scores + 10 us";
    }
}

/* scores in, idx out, the reference's row of (key, index) pairs per thread that has a row (a thread per row
 * at most: with 16 threads and one row, one such buffer, not 16) */
static size_t host_bytes_topk(const kvb_case *c)
{
    const double rows = kvb_case_int(c, "rows"), n = kvb_case_int(c, "n"), k = kvb_case_int(c, "k");
    const double threads = kvb_ref_threads() < rows ? kvb_ref_threads() : rows;
    return kvb_host_bytes_sat(KVB_HOLD_IN * 4 * rows * n + KVB_HOLD_OUT * 4 * rows * k + threads * 8.0 * n);
}

static const kvb_impl topk_impls[] = {
    {"kernel", NULL, 0, "radix select 11+11+10 bits, ordered compaction; few rows split over blocks"},
    {"one_block", NULL, 0, "the same, one block per row whatever the shape (kept to compare)"},
};

const kvb_op op_topk = {
    .name = "topk",
    .family = "select",
    .summary = "the suite's top-k: k largest per row, ties to the lower index, ascending indices",
    .params = topk_params,
    .n_params = NPARAMS(topk_params),
    .validate = validate_topk,
    .host_bytes = host_bytes_topk,
    .setup = setup_topk,
    .launch = launch_topk,
    KVB_IMPLS(topk_impls),
    .cost = cost_topk,
};
