/* test_gpu_batch_gemm_rotary.c: the fused kernel and the composed cuBLAS peer (kernels/batch_gemm_rotary/batch_gemm_rotary.h)
 * against the reference, one test per check-tier case of cases/batch_gemm_rotary.cases, each validated
 * twice (skipped without a device); the API's refusals, which need no device (every one is made
 * before anything touches the GPU); and, on a device, the kernels' guard against device data the
 * API cannot see: a cnts value or a chunk id out of range is skipped and reported in `bad`, nothing
 * is read outside U or the table, and the rows it would have written keep their contents. */
#include <stdio.h>
#include <stdlib.h>

#include "harness/core/op.h"
#include "tests/testlib.h"
#if KVB_HAVE_CUDA
#include <cublas_v2.h>

#include "kernels/batch_gemm_rotary/batch_gemm_rotary.h"
#endif

#if KVB_HAVE_CUDA
enum { B = 2, HKV = 2, M = 4, C = 8, D = 128, R = 160, S = 64, NB = 40, SPARSE = 8 };

static gather_layout layout(void)
{
    gather_layout g = {B, HKV, M, C, D, NB, SPARSE, S / C, S / C};
    return g;
}

/* Aligned stand-ins for device pointers: every refusal below comes before any use of them. */
#define FAKE(T) ((T *)(uintptr_t)0x10000)

static int call(const gather_layout *g, int Sx, int r, int max_pos, rope_kind rope)
{
    return batch_gemm_rotary(FAKE(const kvb_bf16), FAKE(const kvb_bf16), FAKE(const int32_t), FAKE(const int32_t),
                             FAKE(const kvb_bf16), g, Sx, r, max_pos, rope, FAKE(kvb_bf16), NULL, 0);
}

static void test_api_rejects_before_launch(void **state)
{
    (void)state;
    assert_int_equal(batch_gemm_rotary_clear_bad(NULL, 0), KVB_EINVAL);
    assert_error_mentions("batch_gemm_rotary_clear_bad: bad is NULL");
    gather_layout g = layout();
    assert_int_equal(call(&g, S, 0, S, ROPE_LLAMA), KVB_EINVAL);
    assert_error_mentions("batch_gemm_rotary: r=0 out of range [1, 1024]");
    assert_int_equal(call(&g, S, BGR_MAX_RANK + 1, S, ROPE_LLAMA), KVB_EINVAL);
    assert_error_mentions("r=1025 out of range [1, 1024]");
    assert_int_equal(call(&g, S, 257, S, ROPE_LLAMA), KVB_EINVAL);
    assert_error_mentions("r=257 out of range [1, 256] for the kernel");
    assert_int_equal(call(&g, S, R, S, (rope_kind)2), KVB_EINVAL);
    assert_error_mentions("rope=2 out of range [0 (llama), 1 (glm)]");
    assert_int_equal(call(&g, C - 1, R, S, ROPE_LLAMA), KVB_EINVAL);
    assert_error_mentions("S=7 out of range [c = 8");
    /* positions reach (S/c)*c - 1: the table needs that many rows, whatever the ids */
    assert_int_equal(call(&g, S + 5, R, S - 1, ROPE_LLAMA), KVB_EINVAL);
    assert_error_mentions("max_pos=63 out of range [(S/c)*c = 64", "RoPE table");
    g.D = 96;
    assert_int_equal(call(&g, S, R, S, ROPE_LLAMA), KVB_EINVAL);
    assert_error_mentions("D=96 out of range {64, 128} for the kernel");
    g.D = 130; /* glm pairs: the op's refusal (D a multiple of 4) comes before the kernel's */
    g.c = 16, g.NB = 80;
    assert_int_equal(call(&g, S, R, S, ROPE_GLM), KVB_EINVAL);
    assert_error_mentions("D=130 is not a multiple of 4");
    g = layout();
    g.M = 0;
    assert_int_equal(call(&g, S, R, S, ROPE_LLAMA), KVB_EINVAL);
    assert_error_mentions("M=0 out of range [1, 4096]");
    g = layout();
    g.NB = SPARSE + M * C - 1;
    assert_int_equal(call(&g, S, R, S, ROPE_LLAMA), KVB_EINVAL);
    assert_error_mentions("NB=39 out of range [sparse_start + M*c = 40");
    g = layout();
    assert_int_equal(batch_gemm_rotary(NULL, FAKE(const kvb_bf16), FAKE(const int32_t), FAKE(const int32_t),
                                       FAKE(const kvb_bf16), &g, S, R, S, ROPE_LLAMA, FAKE(kvb_bf16), NULL, 0),
                     KVB_EINVAL);
    assert_error_mentions("U is NULL");
    assert_int_equal(batch_gemm_rotary(FAKE(const kvb_bf16), (const kvb_bf16 *)(uintptr_t)0x10008, FAKE(const int32_t),
                                       FAKE(const int32_t), FAKE(const kvb_bf16), &g, S, R, S, ROPE_LLAMA, FAKE(kvb_bf16),
                                       NULL, 0),
                     KVB_EINVAL);
    assert_error_mentions("SV=", "is not 16-byte aligned");
    assert_int_equal(batch_gemm_rotary(FAKE(const kvb_bf16), FAKE(const kvb_bf16), FAKE(const int32_t), FAKE(const int32_t),
                                       FAKE(const kvb_bf16), NULL, S, R, S, ROPE_LLAMA, FAKE(kvb_bf16), NULL, 0),
                     KVB_EINVAL);
    assert_error_mentions("layout g is NULL");
}

static void test_composed_rejects_before_launch(void **state)
{
    (void)state;
    gather_layout g = layout();
    const size_t need = batch_gemm_rotary_composed_workspace_bytes(&g, R);
    assert_true(need >= (size_t)B * HKV * M * C * (R * 2 + D * 4));
    void *h = FAKE(void), *ws = FAKE(void);
#define COMPOSED(handle, gp, r, bytes)                                                                                   \
    batch_gemm_rotary_composed(handle, FAKE(const kvb_bf16), FAKE(const kvb_bf16), FAKE(const int32_t),                 \
                               FAKE(const int32_t), FAKE(const kvb_bf16), gp, S, r, S, ROPE_LLAMA, FAKE(kvb_bf16), NULL, \
                               ws, bytes, 0)
    assert_int_equal(COMPOSED(h, &g, R, need - 1), KVB_EINVAL);
    assert_error_mentions("batch_gemm_rotary_composed: workspace_bytes=", "out of range");
    assert_int_equal(COMPOSED(NULL, &g, R, need), KVB_EINVAL);
    assert_error_mentions("cublas_handle is NULL");
    assert_int_equal(COMPOSED(h, &g, 0, need), KVB_EINVAL);
    assert_error_mentions("r=0 out of range [1, 1024]");
    g.D = 2000;
    assert_int_equal(COMPOSED(h, &g, R, need), KVB_EINVAL);
    assert_error_mentions("D=2000 out of range [1, 1024]");
#undef COMPOSED
}

/* The device data the API does not copy back: a caller with host copies checks them with
 * batch_gemm_rotary_check (the harness's reference does, before any launch). */
static void test_host_data_check(void **state)
{
    (void)state;
    gather_layout g = layout();
    int32_t ids[B * HKV * M], cnts[B * HKV] = {0, 1, 4, 2};
    for (int i = 0; i < B * HKV * M; i++) ids[i] = i % (S / C);
    assert_int_equal(batch_gemm_rotary_check(ids, cnts, &g, S, R, S, ROPE_LLAMA, "caller"), KVB_OK);
    cnts[1] = M + 1;
    assert_int_equal(batch_gemm_rotary_check(ids, cnts, &g, S, R, S, ROPE_LLAMA, "caller"), KVB_EINVAL);
    assert_error_mentions("caller: cnts[1]=5 out of range [0, M = 4]");
    cnts[1] = 1;
    ids[3 * M + 2] = S / C; /* a miss slot of (1, 1) */
    assert_int_equal(batch_gemm_rotary_check(ids, cnts, &g, S, R, S, ROPE_LLAMA, "caller"), KVB_EINVAL);
    assert_error_mentions("ids[3, 2]=8 out of range [0, S/c = 8)");
    ids[3 * M + 2] = 0;
    ids[3 * M + 1] = -1; /* a hit slot (cnts[3] = 2): not read */
    assert_int_equal(batch_gemm_rotary_check(ids, cnts, &g, S, R, S, ROPE_LLAMA, "caller"), KVB_OK);
}

/* On a device: bad cnts and bad ids are skipped, reported in `bad`, and leave their rows untouched;
 * the good slots of the same launch are written. Both implementations. */
static void test_device_guard(void **state)
{
    (void)state;
    if (!kvb_gpu_available()) skip();
    gather_layout g = layout();
    const size_t nu = (size_t)B * S * R, nsv = (size_t)B * HKV * R * D, nt = (size_t)S * D, nk = (size_t)B * HKV * NB * D;
    kvb_bf16 *hu = malloc(nu * 2), *hsv = malloc(nsv * 2), *ht = malloc(nt * 2), *hk = malloc(nk * 2), *ko = malloc(nk * 2);
    for (size_t i = 0; i < nu; i++) hu[i] = kvb_double_to_bf16(((int)(i % 7) - 3) * 0.125);
    for (size_t i = 0; i < nsv; i++) hsv[i] = kvb_double_to_bf16(((int)(i % 5) - 2) * 0.25);
    assert_int_equal(rope_table(ht, S, D, 10000.0, ROPE_LLAMA), KVB_OK);
    for (size_t i = 0; i < nk; i++) hk[i] = 0x7FC1; /* a NaN pattern neither kernel writes */
    /* (0,0): all misses, slot 1 has an id past the context; (0,1): cnts out of range; (1,0), (1,1) fine */
    int32_t ids[B * HKV * M], cnts[B * HKV] = {0, M + 3, 1, 0}, bad = 0;
    for (int i = 0; i < B * HKV * M; i++) ids[i] = (i * 3) % (S / C);
    ids[1] = S / C + 100;
    kvb_bf16 *du = kvb_dmalloc(nu * 2), *dsv = kvb_dmalloc(nsv * 2), *dt = kvb_dmalloc(nt * 2), *dk = kvb_dmalloc(nk * 2);
    int32_t *dids = kvb_dmalloc(sizeof ids), *dcnts = kvb_dmalloc(sizeof cnts), *dbad = kvb_dmalloc(4);
    const size_t ws_bytes = batch_gemm_rotary_composed_workspace_bytes(&g, R);
    void *ws = kvb_dmalloc(ws_bytes), *cublas = NULL;
    cudaStream_t s = kvb_stream_create();
    kvb_h2d(du, hu, nu * 2, s), kvb_h2d(dsv, hsv, nsv * 2, s), kvb_h2d(dt, ht, nt * 2, s);
    kvb_h2d(dids, ids, sizeof ids, s), kvb_h2d(dcnts, cnts, sizeof cnts, s);
    assert_int_equal(cublasCreate((cublasHandle_t *)&cublas), CUBLAS_STATUS_SUCCESS);
    for (int impl = 0; impl < 2; impl++) {
        kvb_h2d(dk, hk, nk * 2, s), kvb_h2d(dbad, &bad, 4, s);
        int rc = impl ? batch_gemm_rotary_composed(cublas, du, dsv, dids, dcnts, dt, &g, S, R, S, ROPE_LLAMA, dk, dbad, ws,
                                                   ws_bytes, s)
                      : batch_gemm_rotary(du, dsv, dids, dcnts, dt, &g, S, R, S, ROPE_LLAMA, dk, dbad, s);
        assert_int_equal(rc, KVB_OK);
        int32_t got = 0;
        kvb_d2h(&got, dbad, 4, s), kvb_d2h(ko, dk, nk * 2, s);
        kvb_sync(s);
        assert_int_equal(got, 3); /* 1: a cnts value, 2: an id */
        for (int bh = 0; bh < B * HKV; bh++)
            for (int t = 0; t < NB; t++) {
                const int slot = (t - SPARSE) / C, miss = t >= SPARSE && t < SPARSE + M * C && slot >= cnts[bh];
                const int written = miss && cnts[bh] <= M && !(bh == 0 && slot == 1);
                const kvb_bf16 *row = ko + ((size_t)bh * NB + t) * D;
                for (int d = 0; d < D; d++) {
                    if (written) assert_int_not_equal(row[d], 0x7FC1);
                    else assert_int_equal(row[d], 0x7FC1);
                }
            }
    }
    cublasDestroy((cublasHandle_t)cublas);
    kvb_dfree(du), kvb_dfree(dsv), kvb_dfree(dt), kvb_dfree(dk), kvb_dfree(dids), kvb_dfree(dcnts), kvb_dfree(dbad), kvb_dfree(ws);
    kvb_stream_destroy(s);
    free(hu), free(hsv), free(ht), free(hk), free(ko);
}
#endif

int main(void)
{
    static const char *const families[] = {"batch_gemm_rotary", NULL};
    const char *filter = getenv("KVB_TEST_FILTER"); /* e.g. 'test_*': the fixed tests without the check cases */
    if (filter) cmocka_set_test_filter(filter);
#if KVB_HAVE_CUDA
    const struct CMUnitTest fixed[] = {
        cmocka_unit_test(test_api_rejects_before_launch),
        cmocka_unit_test(test_composed_rejects_before_launch),
        cmocka_unit_test(test_host_data_check),
        cmocka_unit_test(test_device_guard),
    };
    return kvb_test_run_gpu_cases("gpu batch_gemm_rotary", fixed, (int)(sizeof fixed / sizeof fixed[0]), families, 2);
#else
    return kvb_test_run_gpu_cases("gpu batch_gemm_rotary", NULL, 0, families, 2);
#endif
}
