/* ops_block_linear.c: one projection of the transformer block alone (kernels/step/NOTES.md, block.h):
 * y[b] = W x[b] (+ add[b]), x [B, in], W [out, in] row-major, y [B, out], bf16 in and out, fp32
 * accumulation. The decode step runs four of these per layer (qkv, o, gate_up, down); here each is
 * timed at its own shape, so a replacement can be judged against the weights' read time alone.
 *
 * Implementations (impl=): kernel, block_linear as the step uses it (cuBLAS cublasGemmEx, fp32 compute).
 * accumulate=1 adds the residual as the step's o and down projections do: the launch first copies the
 * input `add` into y (the copy's bytes are counted), then y += W x.
 *
 * Inputs: x N(0, 1); W N(0, 1/in), so that every output is O(1) whatever `in`; add N(0, 1).
 * Reference: ref_linear in double, on sampled rows of y when the batch is large (the op's note says).
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "reference/step/block.h"
#include "harness/core/ceilings.h"
#include "harness/core/op.h"
#include "harness/ops/ops.h"
#if KVB_HAVE_CUDA
#include "harness/core/gpu.h"
#include "kernels/step/block.h"
#endif

#define NPARAMS(a) ((int)(sizeof(a) / sizeof((a)[0])))

static const kvb_param linear_params[] = {
    {"B", KVB_P_INT, 1, 1, 1024, NULL, "rows of x and y (the batch)"},
    {"in", KVB_P_INT, 4096, 8, 65536, NULL, "input features (a multiple of 8)"},
    {"out", KVB_P_INT, 4096, 8, 65536, NULL, "output features (a multiple of 8)"},
    {"accumulate", KVB_P_INT, 0, 0, 1, NULL, "1: y = add + W x (the residual), else y = W x"},
    {"seed", KVB_P_INT, 1, 0, 1e15, NULL, "input seed"},
    {"impl", KVB_P_ENUM, 0, 0, 0, NULL, "implementation (the impl table)"},
};

static int validate_linear(const kvb_case *c)
{
    const int in = kvb_case_int(c, "in"), out = kvb_case_int(c, "out");
    if (in % 8) return kvb_fail(KVB_EINVAL, "block_linear: in=%d is not a multiple of 8 in [8, 65536]", in);
    if (out % 8) return kvb_fail(KVB_EINVAL, "block_linear: out=%d is not a multiple of 8 in [8, 65536]", out);
    return KVB_OK;
}

typedef struct linear_priv {
    int B, in, out, accumulate;
    uint8_t *mask; /* sampled reference rows (NULL: every row) */
#if KVB_HAVE_CUDA
    void *cublas, *cublas_ws;
#endif
} linear_priv;

static void teardown_linear(kvb_run *r)
{
    linear_priv *p = r->priv;
    if (!p) return;
#if KVB_HAVE_CUDA
    block_cublas_destroy(p->cublas, p->cublas_ws);
    p->cublas = p->cublas_ws = NULL;
#endif
    kvb_xfree(p->mask);
    r->priv = NULL;
}

static int setup_linear(kvb_run *r)
{
    const kvb_case *c = r->c;
    linear_priv *p = kvb_run_alloc(r, sizeof *p, "block_linear state");
    r->priv = p;
    p->B = kvb_case_int(c, "B"), p->in = kvb_case_int(c, "in"), p->out = kvb_case_int(c, "out");
    p->accumulate = kvb_case_int(c, "accumulate");
    int64_t sx[2] = {p->B, p->in}, sw[2] = {p->out, p->in}, sy[2] = {p->B, p->out}, one[2] = {1, 1};
    kvb_tensor *x = kvb_run_tensor(r, "x", KVB_BF16, 2, sx, KVB_IN);
    kvb_tensor *W = kvb_run_tensor(r, "W", KVB_BF16, 2, sw, KVB_IN);
    kvb_tensor *add = kvb_run_tensor(r, "add", KVB_BF16, 2, p->accumulate ? sy : one, KVB_IN);
    kvb_tensor *y = kvb_run_tensor(r, "y", KVB_BF16, 2, sy, KVB_OUT);
    if (W->n > (1 << 26)) W->flags |= KVB_T_NO_DUMP;
    kvb_fill_bf16_normal(x->h, x->n, r->seed, kvb_stream_of("x"), 0, 0, 1);
    kvb_fill_bf16_normal(W->h, W->n, r->seed, kvb_stream_of("W"), 0, 0, 1 / sqrt((double)p->in));
    kvb_fill_bf16_normal(add->h, add->n, r->seed, kvb_stream_of("add"), 0, 0, 1);

    int64_t chosen;
    p->mask = kvb_sample_slices(p->B, (double)p->in * p->out, KVB_REF_BUDGET, &chosen);
    y->slice_len = p->out;
    y->slice_mask = p->mask;
    if (p->mask)
        snprintf(r->note, sizeof r->note, "reference on %lld of %d rows (first, last, evenly spaced)", (long long)chosen,
                 p->B);
    for (int b = 0; b < p->B; b++) {
        if (p->mask && !p->mask[b]) continue;
        const kvb_bf16 *addb = p->accumulate ? (const kvb_bf16 *)add->h + (int64_t)b * p->out : NULL;
        int rc = ref_linear((const kvb_bf16 *)x->h + (int64_t)b * p->in, W->h, addb, 1, p->in, p->out,
                            (kvb_bf16 *)y->ref + (int64_t)b * p->out);
        if (rc) return rc;
    }
    return KVB_OK;
}

#if KVB_HAVE_CUDA
static int gpu_setup_linear(kvb_run *r)
{
    linear_priv *p = r->priv;
    return block_cublas_create(&p->cublas, &p->cublas_ws);
}
#endif

static int launch_linear(kvb_run *r)
{
#if KVB_HAVE_CUDA
    linear_priv *p = r->priv;
    kvb_tensor *y = kvb_run_find(r, "y");
    if (p->accumulate) kvb_d2d(y->d, kvb_run_find(r, "add")->d, (size_t)p->B * p->out * 2, r->stream);
    return block_linear(p->cublas, kvb_run_find(r, "x")->d, kvb_run_find(r, "W")->d, p->B, p->in, p->out, p->accumulate,
                        y->d, r->stream);
#else
    (void)r;
    return KVB_EDEVICE;
#endif
}

/* Bytes: W read once (the floor at small B: 2 * in * out), x read, y written; with accumulate the
 * residual copied into y (read and written) and read again by the GEMM. Ceiling: the device read rate
 * (the weights are almost all of it). Goal (kernels/step/NOTES.md): every projection at >= 90% of the
 * read rate. */
static void cost_linear(const kvb_run *r, kvb_cost *c)
{
    const linear_priv *p = r->priv;
    const double yb = 2.0 * p->B * p->out;
    c->bytes_dev = 2.0 * p->in * p->out + 2.0 * p->B * p->in + yb + (p->accumulate ? 3.0 * yb : 0);
    c->flops = 2.0 * p->B * p->in * p->out;
    c->ceiling = KVB_CEIL_READ;
    if (r->ceil && r->ceil->measured) {
        c->goal_us = kvb_read_contiguous_seconds((size_t)c->bytes_dev) * 1e6 / 0.9;
        c->goal_text = "90% of the device read rate";
    }
}

/* x, W, add in; y out (and its copy); the row sample; the reference's row of doubles */
static size_t host_bytes_linear(const kvb_case *c)
{
    const double B = kvb_case_int(c, "B"), in = kvb_case_int(c, "in"), out = kvb_case_int(c, "out");
    const double add = kvb_case_int(c, "accumulate") ? B * out * 2 : 2;
    return kvb_host_bytes_sat(KVB_HOLD_IN * (B * in * 2 + in * out * 2 + add) + KVB_HOLD_OUT * B * out * 2 + B + 8.0 * in);
}

static const kvb_impl linear_impls[] = {
    {"kernel", NULL, 0, "block_linear as the decode step runs it: cublasGemmEx, bf16 in and out, fp32 compute"},
};

const kvb_op op_block_linear = {
    .name = "block_linear",
    .family = "step",
    .summary = "one projection of the transformer block, y = W x (+ residual), at the step's shapes",
    .params = linear_params,
    .n_params = NPARAMS(linear_params),
    .tol = {1e-2, 2e-2, 1e-2},
    .validate = validate_linear,
    .host_bytes = host_bytes_linear,
    .setup = setup_linear,
#if KVB_HAVE_CUDA
    .gpu_setup = gpu_setup_linear,
#endif
    .launch = launch_linear,
    KVB_IMPLS(linear_impls),
    .cost = cost_linear,
    .teardown = teardown_linear,
};
