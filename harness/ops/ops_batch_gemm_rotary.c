/* ops_batch_gemm_rotary.c: ShadowKV's low-rank key reconstruction fused with RoPE in the harness
 * (kernels/batch_gemm_rotary/NOTES.md).
 *
 * Kernel: batch_gemm_rotary. Implementations (impl=): kernel, the suite's fused kernel; cublas_composed,
 * ShadowKV's own structure (a gather of the miss tokens' U rows, cuBLAS strided batched GEMM, a RoPE
 * kernel), timed in the same run so the summary shows the kernel's speedup over it.
 *
 * Inputs (seeded, counter-based):
 *   ids, cnts  one ShadowKV step: old tags (every slot valid) and new chunk ids drawn from [0, ctx/c)
 *              with round(hit * M) of the old ids picked again (kvb_make_step_ids), then the reference
 *              index_scan: cnts = hits per (b, h), ids = the chunk id each slot holds after the scan
 *              (hits first, misses ascending), as batch_gemm_rotary receives them in ShadowKV.
 *   U, SV      shaped like a rank-r SVD of pre-RoPE keys: U[b, p, k] ~ N(0, 1/ctx) (entries of orthonormal
 *              columns of length ctx) on the rows the step reads, zeros on the others (never read by a
 *              correct kernel; a wrong row shows, and the bench cases' setup stays short); SV[b, h, k, d] = sqrt(ctx) a_k g[b, h, d] N(0, 1) with singular
 *              values a_k ~ exp(-2k/r) decaying by e^2 over the rank (sum a_k^2 = 1) and channel scales
 *              g = exp(0.5 N(0, 1)) (real keys have a spread of channel magnitudes), so the keys are
 *              ~N(0, g_d^2) and a pair of RoPE dims can be much larger than the key's rms.
 *   cos_sin    rope_table(theta) for positions [0, ctx): llama rotate-half or glm partial interleaved.
 *   Kbuf       [B, Hkv, NB, D], NB = sparse_start + M*c + extra, uniform in [-2, 2) everywhere before the
 *              launch (the rows that must survive; uniform rather than normal keeps the large cases'
 *              setup short).
 *
 * Comparison. Kbuf is one tensor holding both the keys written (miss slots, the contract's tolerance
 * |out - ref| <= 1e-2 max(|ref|, rms of the key's row) per element: t->tol_mag) and rows that must come
 * back bit for bit (hit slots, local/outlier rows, decode rows: tol_mag 0, atol 0, so any change fails
 * the element). Because the rel L2 over the whole buffer would be diluted by the untouched rows, the
 * op's out_check recomputes it over the miss rows alone (bound: the tensor's l2, 4e-3) and, on EVERY
 * (b, h) slice, also those a sampled reference skips, checks the rows outside the miss slots bit for bit
 * against the initial contents. `bad` is the kernels' device-side error word (cnts or ids out of
 * range), compared exactly with 0; the host data is refused by the reference before any launch.
 * Large cases compute the reference on a deterministic sample of (b, h) slices (first and last
 * included); the note says how many.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reference/batch_gemm_rotary.h"
#include "harness/core/ceilings.h"
#include "harness/core/op.h"
#include "harness/ops/ops.h"
#if KVB_HAVE_CUDA
#include <cublas_v2.h>

#include "kernels/batch_gemm_rotary/batch_gemm_rotary.h"
#endif

#define NPARAMS(a) ((int)(sizeof(a) / sizeof((a)[0])))
#define BGR_MAX_TENSOR_BYTES 8e9 /* U, Kbuf and the peer's workspace each (host copies: Kbuf x 3) */

static const kvb_param bgr_params[] = {
    {"B", KVB_P_INT, 8, 1, 1024, NULL, "batch"},
    {"Hkv", KVB_P_INT, 8, 1, 256, NULL, "KV heads"},
    {"D", KVB_P_INT, 128, 2, 1024, NULL, "head dimension (kernel: 64, 128)"},
    {"r", KVB_P_INT, 160, 1, BGR_MAX_RANK, NULL, "rank of the low-rank keys (kernel: up to 256)"},
    {"c", KVB_P_INT, 8, 1, 4096, NULL, "tokens per chunk"},
    {"M", KVB_P_INT, 256, 1, GATHER_MAX_M, NULL, "chunk slots per (b, h) (sparse budget / c)"},
    {"ctx", KVB_P_INT, 131072, 1, 1 << 24, NULL, "context tokens S (chunk ids in [0, ctx/c), RoPE table of ctx rows)"},
    {"hit", KVB_P_FLOAT, 0, 0, 1, NULL, "fraction of the slots that are cache hits (not recomputed)"},
    {"rope", KVB_P_ENUM, 0, 0, 0, "llama|glm", "llama: rotate-half; glm: partial interleaved (first D/2 dims)"},
    {"theta", KVB_P_FLOAT, 500000, 1, 1e9, NULL, "RoPE base (llama3: 500000, glm4: 10000)"},
    {"sparse_start", KVB_P_INT, 416, 0, 1 << 20, NULL, "first buffer token of the sparse region (32 local + 48*8 outlier)"},
    {"extra", KVB_P_INT, 64, 0, 1 << 20, NULL, "buffer tokens after the sparse region (decode capacity)"},
    {"seed", KVB_P_INT, 1, 0, 1e15, NULL, "input seed"},
    {"impl", KVB_P_ENUM, 0, 0, 0, NULL, "implementation (the impl table)"},
};

enum { IMPL_KERNEL, IMPL_COMPOSED };

static rope_kind rope_of(const kvb_case *c) { return strcmp(kvb_case_enum(c, "rope"), "glm") ? ROPE_LLAMA : ROPE_GLM; }

static gather_layout layout_of(const kvb_case *c)
{
    gather_layout g;
    g.B = kvb_case_int(c, "B");
    g.Hkv = kvb_case_int(c, "Hkv");
    g.M = kvb_case_int(c, "M");
    g.c = kvb_case_int(c, "c");
    g.D = kvb_case_int(c, "D");
    g.sparse_start = kvb_case_int(c, "sparse_start");
    g.NB = (int)(g.sparse_start + (int64_t)g.M * g.c + kvb_case_i64(c, "extra")); /* < 2^25 within the keys' ranges */
    g.host_chunks = g.host_stride = kvb_case_i64(c, "ctx") / g.c; /* not used: the layout check wants them >= M */
    return g;
}

static int n_hits(const kvb_case *c) { return (int)lround(kvb_case_get(c, "hit") * kvb_case_int(c, "M")); }

static int validate_bgr(const kvb_case *c)
{
    const char *who = "batch_gemm_rotary";
    gather_layout g = layout_of(c);
    const int S = kvb_case_int(c, "ctx"), r = kvb_case_int(c, "r"), M = g.M;
    if (S < g.c) return kvb_fail(KVB_EINVAL, "%s: ctx=%d out of range [c = %d, %d]", who, S, g.c, 1 << 24);
    if (g.D % 4) return kvb_fail(KVB_EINVAL, "%s: D=%d is not a multiple of 4 (rope_table builds the table for such D)", who, g.D);
    if (M > S / g.c) /* before the layout's own check, which would name host_chunks */
        return kvb_fail(KVB_EINVAL, "%s: M=%d out of range [1, ctx/c = %d]: the slots hold distinct chunks of the context",
                        who, M, S / g.c);
    int rc = batch_gemm_rotary_check(NULL, NULL, &g, S, r, S, rope_of(c), who);
    if (rc) return rc;
    /* one step draws M old ids and M - hits new ones, all distinct chunks of the context */
    const int64_t need = 2LL * M - n_hits(c);
    if (S / g.c < need)
        return kvb_fail(KVB_EINVAL, "%s: ctx/c = %d chunks out of range [2M - hits = %lld, ...): a step's old and new chunk ids "
                        "are distinct chunks of the context", who, S / g.c, (long long)need);
    if (kvb_case_get(c, "impl") == IMPL_KERNEL) {
        if (r > BGR_KERNEL_MAX_RANK)
            return kvb_fail(KVB_EINVAL, "%s: r=%d out of range [1, %d] for impl=kernel", who, r, BGR_KERNEL_MAX_RANK);
        if (g.D != 64 && g.D != 128) return kvb_fail(KVB_EINVAL, "%s: D=%d out of range {64, 128} for impl=kernel", who, g.D);
    }
    const double u = 2.0 * g.B * S * r, kb = 2.0 * g.B * g.Hkv * g.NB * g.D;
    const double ws = (double)g.B * g.Hkv * M * g.c * (2.0 * r + 4.0 * g.D);
    if (u > BGR_MAX_TENSOR_BYTES) return kvb_fail(KVB_EINVAL, "%s: U = B*ctx*r*2 = %.3g bytes out of range [1, 8e9]", who, u);
    if (kb > BGR_MAX_TENSOR_BYTES) return kvb_fail(KVB_EINVAL, "%s: Kbuf = B*Hkv*NB*D*2 = %.3g bytes out of range [1, 8e9]", who, kb);
    if (kvb_case_get(c, "impl") == IMPL_COMPOSED && ws > BGR_MAX_TENSOR_BYTES)
        return kvb_fail(KVB_EINVAL, "%s: the composed peer's workspace B*Hkv*M*c*(2r + 4D) = %.3g bytes out of range [1, 8e9]",
                        who, ws);
    return KVB_OK;
}

/* ---- op-private state ---- */

typedef struct bgr_priv {
    gather_layout g;
    int S, r, impl;
    rope_kind rope;
    double misses;   /* miss tokens, summed over (b, h) */
    uint8_t *mask;   /* sampled reference: 1 = computed; NULL = every slice */
    double *tol_mag; /* per-element magnitude of the tolerance (0 outside the miss slots) */
    size_t ws_bytes;
    char note[160];  /* the sampling note, before out_check adds the miss-row L2 */
#if KVB_HAVE_CUDA
    cublasHandle_t cublas;
#endif
} bgr_priv;

static void teardown_bgr(kvb_run *r)
{
    bgr_priv *p = r->priv;
    if (!p) return;
#if KVB_HAVE_CUDA
    if (p->cublas) cublasDestroy(p->cublas);
#endif
    kvb_xfree(p->mask);
    r->priv = NULL;
}

/* ---- inputs ---- */

/* SV[b, h, k, d] = sqrt(S) a_k g[b, h, d] z (file comment), rounded once to bf16 */
static void fill_sv(kvb_run *run, kvb_bf16 *sv, int64_t n_bh, int r, int D, int S, uint64_t seed)
{
    double *a = kvb_run_alloc(run, sizeof(double) * (size_t)r, "singular values"), sum = 0;
    for (int k = 0; k < r; k++) a[k] = exp(-2.0 * k / r), sum += a[k] * a[k];
    for (int k = 0; k < r; k++) a[k] *= sqrt((double)S / sum);
    const uint64_t s_z = kvb_stream_of("SV"), s_g = kvb_stream_of("SV_channel");
#pragma omp parallel for schedule(static)
    for (int64_t bh = 0; bh < n_bh; bh++)
        for (int k = 0; k < r; k++)
            for (int d = 0; d < D; d++) {
                const double g = exp(0.5 * kvb_normal01(seed, s_g, (uint64_t)(bh * D + d)));
                const int64_t i = (bh * r + k) * D + d;
                sv[i] = kvb_double_to_bf16(a[k] * g * kvb_normal01(seed, s_z, (uint64_t)i));
            }
    kvb_run_free(run, a);
}

/* U[b, p, :] ~ N(0, 1/S) for the rows some (b, h) reads (its miss slots' tokens); zeros elsewhere: a
 * correct kernel never reads them, and a read of a wrong row shows. Element i is the i-th of the
 * counter-based sequence whatever the set of rows, so the values do not depend on the ids. */
static void fill_u(kvb_run *run, kvb_bf16 *U, const int32_t *ids, const int32_t *cnts, const gather_layout *g, int S,
                   int rank, uint64_t seed)
{
    const int64_t rows = (int64_t)g->B * S;
    uint8_t *used = kvb_run_alloc(run, (size_t)rows, "U rows read");
    for (int64_t bh = 0; bh < (int64_t)g->B * g->Hkv; bh++)
        for (int j = cnts[bh]; j < g->M; j++)
            for (int o = 0; o < g->c; o++) used[bh / g->Hkv * S + (int64_t)ids[bh * g->M + j] * g->c + o] = 1;
    const uint64_t stream = kvb_stream_of("U");
    const double std = 1.0 / sqrt((double)S);
#pragma omp parallel for schedule(static)
    for (int64_t row = 0; row < rows; row++) {
        kvb_bf16 *u = U + row * rank;
        for (int k = 0; k < rank; k++) /* what kvb_fill_bf16_normal(U, ..., 0, std) writes at that index */
            u[k] = used[row] ? kvb_double_to_bf16(0 + std * kvb_normal01(seed, stream, (uint64_t)(row * rank + k))) : 0;
    }
    kvb_run_free(run, used);
}

static kvb_tensor *add(kvb_run *r, const char *name, kvb_dtype dt, int ndim, int64_t a, int64_t b, int64_t c, int64_t d, int role)
{
    int64_t s[4] = {a, b, c, d};
    return kvb_run_tensor(r, name, dt, ndim, s, role);
}

static int setup_bgr(kvb_run *r)
{
    const kvb_case *c = r->c;
    bgr_priv *p = kvb_run_alloc(r, sizeof *p, "batch_gemm_rotary state");
    r->priv = p;
    gather_layout *g = &p->g;
    *g = layout_of(c);
    p->S = kvb_case_int(c, "ctx");
    p->r = kvb_case_int(c, "r");
    p->rope = rope_of(c);
    p->impl = (int)kvb_case_get(c, "impl");
    const int B = g->B, Hkv = g->Hkv, M = g->M, D = g->D, S = p->S, rank = p->r;
    const int64_t n_bh = (int64_t)B * Hkv;

    /* one step's ids in slot order and hit counts */
    kvb_tensor *ids = add(r, "ids", KVB_I32, 3, B, Hkv, M, 1, KVB_IN);
    kvb_tensor *cnts = add(r, "cnts", KVB_I32, 2, B, Hkv, 1, 1, KVB_IN);
    int32_t *fresh = kvb_run_alloc(r, sizeof(int32_t) * (size_t)ids->n, "new ids");
    int32_t *offsets = kvb_run_alloc(r, sizeof(int32_t) * (size_t)ids->n, "offsets");
    int rc = kvb_make_step_ids(r->seed, (int)n_bh, M, S / g->c, M, n_hits(c), ids->h, fresh);
    if (!rc) rc = ref_index_scan(ids->h, fresh, offsets, cnts->h, B, Hkv, M); /* ids->h: the tags after the scan */
    kvb_run_free(r, fresh), kvb_run_free(r, offsets);
    if (rc) return rc;
    const int32_t *cn = cnts->h;
    for (int64_t bh = 0; bh < n_bh; bh++) p->misses += (double)(M - cn[bh]) * g->c;

    kvb_tensor *U = add(r, "U", KVB_BF16, 3, B, S, rank, 1, KVB_IN);
    kvb_tensor *SV = add(r, "SV", KVB_BF16, 4, B, Hkv, rank, D, KVB_IN);
    kvb_tensor *tab = add(r, "cos_sin", KVB_BF16, 2, S, D, 1, 1, KVB_IN);
    kvb_tensor *K = add(r, "Kbuf", KVB_BF16, 4, B, Hkv, g->NB, D, KVB_INOUT);
    kvb_tensor *bad = add(r, "bad", KVB_I32, 1, 1, 1, 1, 1, KVB_INOUT);
    if (U->n > (1 << 26)) U->flags |= KVB_T_NO_DUMP;
    if (K->n > (1 << 26)) K->flags |= KVB_T_NO_DUMP;
    fill_u(r, U->h, ids->h, cnts->h, g, S, rank, r->seed);
    fill_sv(r, SV->h, n_bh, rank, D, S, r->seed);
    if ((rc = rope_table(tab->h, S, D, kvb_case_get(c, "theta"), p->rope))) return rc;
    kvb_fill_bf16_uniform(K->h, K->n, r->seed, kvb_stream_of("Kbuf"), 0, -2, 2); /* a canary: cheaper than normal */
    kvb_copy_parallel(K->ref, K->h, (size_t)K->n * 2);
    *(int32_t *)bad->h = 0;
    *(int32_t *)bad->ref = 0;
    bad->cmp = KVB_CMP_EXACT;

#if KVB_HAVE_CUDA
    if (p->impl == IMPL_COMPOSED) p->ws_bytes = batch_gemm_rotary_composed_workspace_bytes(g, rank);
#endif
    int64_t ws[1] = {(int64_t)(p->ws_bytes ? p->ws_bytes : 1)};
    kvb_run_tensor(r, "workspace", KVB_U8, 1, ws, KVB_SCRATCH);

    /* the reference, on a sample of (b, h) slices when the whole would pass the budget */
    int64_t chosen;
    p->mask = kvb_sample_slices(n_bh, p->misses / (double)n_bh * rank * D, KVB_REF_BUDGET, &chosen);
    K->slice_len = (int64_t)g->NB * D;
    K->slice_mask = p->mask;
    if (p->mask)
        snprintf(p->note, sizeof p->note, "reference on %lld of %lld (b, h) slices (first, last, evenly spaced)",
                 (long long)chosen, (long long)n_bh);
    snprintf(r->note, sizeof r->note, "%s", p->note);
    if ((rc = ref_batch_gemm_rotary_sampled(U->h, SV->h, ids->h, cnts->h, tab->h, g, S, rank, S, p->rope, p->mask, K->ref)))
        return rc;

    /* tolerance: 1e-2 * max(|ref|, rms of the key) on the miss rows of the computed slices, 0 elsewhere */
    p->tol_mag = kvb_run_alloc(r, (size_t)K->n * sizeof(double), "Kbuf tolerance magnitudes"); /* zero pages: cheap where nothing is written */
    const kvb_bf16 *kr = K->ref;
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t bh = 0; bh < n_bh; bh++) {
        if (p->mask && !p->mask[bh]) continue;
        for (int64_t s = (int64_t)cn[bh] * g->c; s < (int64_t)M * g->c; s++) {
            const int64_t row = (bh * g->NB + g->sparse_start + s) * D;
            double ss = 0;
            for (int d = 0; d < D; d++) ss += kvb_bf16_to_double(kr[row + d]) * kvb_bf16_to_double(kr[row + d]);
            const double rms = sqrt(ss / D);
            for (int d = 0; d < D; d++) p->tol_mag[row + d] = fmax(fabs(kvb_bf16_to_double(kr[row + d])), rms);
        }
    }
    K->tol_mag = p->tol_mag; /* with the op's atol 0 every other element must keep its value (out_check: its bits) */
    return KVB_OK;
}

/* ---- launches ---- */

#if KVB_HAVE_CUDA
static void *dev(kvb_run *r, const char *name) { return kvb_run_find(r, name)->d; }

static int gpu_setup_bgr(kvb_run *r)
{
    bgr_priv *p = r->priv;
    if (p->impl == IMPL_COMPOSED && cublasCreate(&p->cublas) != CUBLAS_STATUS_SUCCESS)
        return kvb_fail(KVB_EDEVICE, "batch_gemm_rotary: cublasCreate failed");
    return KVB_OK;
}

static int launch_kernel(kvb_run *r)
{
    bgr_priv *p = r->priv;
    return batch_gemm_rotary(dev(r, "U"), dev(r, "SV"), dev(r, "ids"), dev(r, "cnts"), dev(r, "cos_sin"), &p->g, p->S, p->r,
                             p->S, p->rope, dev(r, "Kbuf"), dev(r, "bad"), r->stream);
}

static int launch_composed(kvb_run *r)
{
    bgr_priv *p = r->priv;
    return batch_gemm_rotary_composed(p->cublas, dev(r, "U"), dev(r, "SV"), dev(r, "ids"), dev(r, "cnts"), dev(r, "cos_sin"),
                                      &p->g, p->S, p->r, p->S, p->rope, dev(r, "Kbuf"), dev(r, "bad"), dev(r, "workspace"),
                                      p->ws_bytes, r->stream);
}
#else
static int no_device(kvb_run *r) { (void)r; return KVB_EDEVICE; }
#define gpu_setup_bgr NULL
#define launch_kernel no_device
#define launch_composed no_device
#endif

/* ---- every slice: untouched rows bit for bit; the miss rows' rel L2 where the reference was computed ---- */

/* The first row of slice bh outside its miss slots that changed, or -1 (rows [0, lo) and [hi, NB) are
 * never written) */
static int64_t first_changed_row(const bgr_priv *p, const kvb_bf16 *out, const kvb_bf16 *init, int32_t cnt, int64_t bh)
{
    const gather_layout *g = &p->g;
    const int64_t base = bh * g->NB * g->D;
    const int64_t lo = g->sparse_start + (int64_t)cnt * g->c, hi = g->sparse_start + (int64_t)g->M * g->c;
    for (int64_t t = 0; t < g->NB; t++) {
        if (t == lo) t = hi;
        if (t >= g->NB) break;
        const int64_t e = base + t * g->D;
        if (memcmp(out + e, init + e, (size_t)g->D * 2)) return t;
    }
    return -1;
}

static int out_check_bgr(kvb_run *r)
{
    bgr_priv *p = r->priv;
    const gather_layout *g = &p->g;
    kvb_tensor *K = kvb_run_find(r, "Kbuf");
    if (!K->out) return KVB_OK;
    const int32_t *cn = kvb_run_find(r, "cnts")->h;
    const kvb_bf16 *out = K->out, *init = K->h, *ref = K->ref;
    const int64_t n_bh = (int64_t)g->B * g->Hkv, row = g->D;
    /* each slice in parallel: its first changed row and its miss rows' sums; then read in slice order, so
     * the failure named is the first and the rel L2 the same whatever the number of threads */
    int64_t *changed = kvb_run_alloc(r, sizeof(int64_t) * (size_t)n_bh, "the slices' first changed rows");
    double *sums = kvb_run_alloc(r, sizeof(double) * 2 * (size_t)n_bh, "the slices' miss-row sums");
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t bh = 0; bh < n_bh; bh++) {
        changed[bh] = first_changed_row(p, out, init, cn[bh], bh);
        if (changed[bh] >= 0 || (p->mask && !p->mask[bh])) continue;
        const int64_t base = bh * g->NB * row, lo = g->sparse_start + (int64_t)cn[bh] * g->c,
                      hi = g->sparse_start + (int64_t)g->M * g->c;
        double err2 = 0, ref2 = 0;
        for (int64_t e = base + lo * row; e < base + hi * row; e++) {
            const double a = kvb_bf16_to_double(out[e]), b = kvb_bf16_to_double(ref[e]);
            err2 += (a - b) * (a - b), ref2 += b * b;
        }
        sums[2 * bh] = err2, sums[2 * bh + 1] = ref2;
    }
    double err2 = 0, ref2 = 0;
    for (int64_t bh = 0; bh < n_bh; bh++) {
        const int64_t t = changed[bh];
        if (t >= 0) {
            const int64_t e = (bh * g->NB + t) * row, lo = g->sparse_start + (int64_t)cn[bh] * g->c;
            int d = 0;
            while (out[e + d] == init[e + d]) d++;
            const int rc = kvb_fail(KVB_EINVAL,
                                    "Kbuf: (b, h) slice %lld row %lld dim %d (a %s row, which must stay untouched) "
                                    "changed from 0x%04x to 0x%04x",
                                    (long long)bh, (long long)t, d,
                                    t < g->sparse_start ? "local/outlier" : t < lo ? "hit slot" : "decode", init[e + d],
                                    out[e + d]);
            kvb_run_free(r, changed), kvb_run_free(r, sums);
            return rc;
        }
        err2 += sums[2 * bh], ref2 += sums[2 * bh + 1];
    }
    kvb_run_free(r, changed), kvb_run_free(r, sums);
    const double l2 = ref2 > 0 ? sqrt(err2 / ref2) : sqrt(err2);
    snprintf(r->note, sizeof r->note, "%s%smiss rows: rel L2 %.2e (bound %.0e)", p->note, p->note[0] ? "; " : "", l2, K->tol.l2);
    if (!(l2 <= K->tol.l2))
        return kvb_fail(KVB_EINVAL, "Kbuf: rel L2 over the miss rows %.3e out of range [0, %.0e]", l2, K->tol.l2);
    return KVB_OK;
}

/* ---- bytes ---- */

/* The floor: per miss token one U row read (r*2 bytes) and one key written (D*2), plus SV once
 * per (b, h); FLOPs 2*r*D per miss token. The RoPE table rows (D*2 bytes per miss token, shared by the
 * batch and the heads, so mostly L2 hits once read) are not part of the floor; at the largest
 * contexts, whose tables (ctx*D*2 bytes) pass the L2, they add DRAM reads the floor does not count.
 * Ceiling: the device copy (cudaMemcpy D2D, read + write) of the same bytes, because the traffic is a
 * read/write mix much like a copy's (r*2 read : D*2 written per token, 320 : 256 at r=160, D=128); the
 * read-only ceiling would hold the writes to a rate they cannot reach. Goal: at most 1.25x the floor
 * at that rate; the summary also shows the speedup over cublas_composed of the same run (goal: at
 * least 10x; kernels/batch_gemm_rotary/NOTES.md). */
static void cost_bgr(const kvb_run *r, kvb_cost *c)
{
    const bgr_priv *p = r->priv;
    const gather_layout *g = &p->g;
    c->bytes_dev = p->misses * (2.0 * p->r + 2.0 * g->D) + (double)g->B * g->Hkv * p->r * g->D * 2.0;
    c->flops = 2.0 * p->r * g->D * p->misses;
    c->ceiling = KVB_CEIL_D2D;
    c->workspace_bytes = (double)p->ws_bytes;
    if (p->impl == IMPL_KERNEL && p->misses > 0 && r->ceil && r->ceil->measured) {
        c->goal_us = 1.25 * kvb_ceiling_seconds(c, r->ceil) * 1e6;
        c->goal_text = "1.25 x the floor at the device copy rate";
    }
}

/* ids, cnts, U, SV, cos_sin in; Kbuf and bad in and out; the tolerance magnitudes, the slice sample;
 * the step draw's scratch (new ids, offsets, the id permutation), U's rows read, the reference's row
 * per thread */
static size_t host_bytes_bgr(const kvb_case *c)
{
    const gather_layout g = layout_of(c);
    const double S = kvb_case_int(c, "ctx"), rank = kvb_case_int(c, "r"), rows = (double)g.B * g.Hkv;
    const double kbuf = rows * g.NB * g.D, ids = rows * g.M * 4;
    const double in = ids + rows * 4 + g.B * S * rank * 2 + rows * rank * g.D * 2 + S * g.D * 2;
    return kvb_host_bytes_sat(KVB_HOLD_IN * in + KVB_HOLD_INOUT * (kbuf * 2 + 4) + kbuf * 8 + rows + 2 * ids +
                              4 * S / g.c + 8.0 * g.M + g.B * S + 8 * rank + kvb_ref_threads() * 8.0 * g.D);
}

static const kvb_impl bgr_impls[] = {
    [IMPL_KERNEL] = {"kernel", launch_kernel, 0,
                     "fused: cp.async-gathered U rows x SV in registers on mma.sync, RoPE on the accumulators, one rounding"},
    [IMPL_COMPOSED] = {"cublas_composed", launch_composed, 0,
                       "ShadowKV's structure: gather kernel, cuBLAS strided batched GEMM (fp32 out), RoPE kernel"},
};

const kvb_op op_batch_gemm_rotary = {
    .name = "batch_gemm_rotary",
    .family = "batch_gemm_rotary",
    .summary = "ShadowKV low-rank key reconstruction (U x SV) fused with RoPE into the miss slots",
    .params = bgr_params,
    .n_params = NPARAMS(bgr_params),
    .tol = {0, 1e-2, 4e-3},
    .validate = validate_bgr,
    .host_bytes = host_bytes_bgr,
    .setup = setup_bgr,
    .gpu_setup = gpu_setup_bgr,
    KVB_IMPLS(bgr_impls),
    .cost = cost_bgr,
    .teardown = teardown_bgr,
    .out_check = out_check_bgr,
};
