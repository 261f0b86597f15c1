/* test_gpu_page_scoring.c: the page-scoring kernels (kernels/page_scoring/page_scoring.h) against the references, one
 * test per check-tier case of cases/page_scoring.cases (build, append, hybrid and Quest scoring; odd
 * lengths and page sizes; B*Hkv beyond grid.y), each validated twice on one workspace (skipped without
 * a device); and the API's refusals, which need no device: each returns KVB_EINVAL before anything is
 * launched (the pointers below are never dereferenced). */
#include <stdio.h>
#include <stdlib.h>

#include "harness/core/op.h"
#include "tests/testlib.h"
#if KVB_HAVE_CUDA
#include "kernels/page_scoring/page_scoring.h"
#endif

#if KVB_HAVE_CUDA
#define FAKE(T) ((T *)(uintptr_t)0x10000)

static page_layout llama(int L, int P)
{
    page_layout s = {1, 32, 8, 128, L, P, page_cap_default(L, P)};
    return s;
}

static void test_metadata_api_refusals(void **state)
{
    (void)state;
    page_layout s = llama(1000, 0);
    s.cap = 1000;
    assert_int_equal(page_meta_build(FAKE(kvb_bf16), &s, FAKE(kvb_bf16), FAKE(kvb_bf16), 0), KVB_EINVAL);
    assert_error_mentions("page_meta_build: P=0 out of range [1, 4096]");
    s = llama(1000, 16);
    s.cap = 56; /* ceil(1000/16) = 63 */
    assert_int_equal(page_meta_build(FAKE(kvb_bf16), &s, FAKE(kvb_bf16), FAKE(kvb_bf16), 0), KVB_EINVAL);
    assert_error_mentions("page_meta_build: cap=56 out of range", "ceil(L/P) = ceil(1000/16) = 63");
    s = llama(1000, 16);
    assert_int_equal(page_meta_build(FAKE(kvb_bf16), &s, (kvb_bf16 *)(uintptr_t)0x10002, FAKE(kvb_bf16), 0), KVB_EINVAL);
    assert_error_mentions("kmin=", "is not 16-byte aligned");
    assert_int_equal(page_meta_build(NULL, &s, FAKE(kvb_bf16), FAKE(kvb_bf16), 0), KVB_EINVAL);
    assert_error_mentions("NULL");
    int32_t t[2] = {999, 1000};
    s.B = 2;
    assert_int_equal(page_meta_append(FAKE(kvb_bf16), FAKE(int32_t), t, &s, FAKE(kvb_bf16), FAKE(kvb_bf16), 0), KVB_EINVAL);
    assert_error_mentions("page_meta_append: t[1]=1000 out of range [0, L-1 = 999]");
    t[1] = -1;
    assert_int_equal(page_meta_append(FAKE(kvb_bf16), FAKE(int32_t), t, &s, FAKE(kvb_bf16), FAKE(kvb_bf16), 0), KVB_EINVAL);
    assert_error_mentions("t[1]=-1 out of range");
}

static void test_hybrid_api_refusals(void **state)
{
    (void)state;
    page_layout s = llama(32768, 3);
    void *ws = FAKE(void);
    const size_t big = (size_t)1 << 40;
    assert_int_equal(hybrid_score(FAKE(kvb_bf16), FAKE(kvb_bf16), FAKE(kvb_bf16), &s, 0, 1024, FAKE(float), FAKE(int32_t),
                                  NULL, ws, big, 0), KVB_EINVAL);
    assert_error_mentions("hybrid_score: r=0 out of range [1, 128]");
    assert_int_equal(hybrid_score(FAKE(kvb_bf16), FAKE(kvb_bf16), FAKE(kvb_bf16), &s, 129, 1024, FAKE(float),
                                  FAKE(int32_t), NULL, ws, big, 0), KVB_EINVAL);
    assert_error_mentions("hybrid_score: r=129 out of range [1, 128]");
    assert_int_equal(hybrid_score(FAKE(kvb_bf16), FAKE(kvb_bf16), FAKE(kvb_bf16), &s, 81, 0, FAKE(float), FAKE(int32_t),
                                  NULL, ws, big, 0), KVB_EINVAL);
    assert_error_mentions("hybrid_score: k=0 tokens to attend out of range [1, L = 32768]");
    assert_int_equal(hybrid_score(FAKE(kvb_bf16), FAKE(kvb_bf16), FAKE(kvb_bf16), &s, 81, 40000, FAKE(float),
                                  FAKE(int32_t), NULL, ws, big, 0), KVB_EINVAL);
    assert_error_mentions("hybrid_score: k=40000 tokens to attend out of range [1, L = 32768]");
    s.cap = 10920; /* ceil(32768/3) = 10923 */
    assert_int_equal(hybrid_score(FAKE(kvb_bf16), FAKE(kvb_bf16), FAKE(kvb_bf16), &s, 81, 1024, FAKE(float),
                                  FAKE(int32_t), NULL, ws, big, 0), KVB_EINVAL);
    assert_error_mentions("hybrid_score: cap=10920 out of range", "= 10923 pages");
    s = llama(32768, 0);
    s.cap = 32768;
    assert_int_equal(hybrid_score(FAKE(kvb_bf16), FAKE(kvb_bf16), FAKE(kvb_bf16), &s, 81, 1024, FAKE(float),
                                  FAKE(int32_t), NULL, ws, big, 0), KVB_EINVAL);
    assert_error_mentions("hybrid_score: P=0 out of range [1, 4096]");
    s = llama(32768, 3);
    s.Hq = 72;
    assert_int_equal(hybrid_score(FAKE(kvb_bf16), FAKE(kvb_bf16), FAKE(kvb_bf16), &s, 81, 1024, FAKE(float),
                                  FAKE(int32_t), NULL, ws, big, 0), KVB_EINVAL);
    assert_error_mentions("hybrid_score: G = Hq/Hkv = 72/8 = 9 out of range [1, 8]");
    s = llama(32768, 3);
    assert_int_equal(hybrid_score(FAKE(kvb_bf16), FAKE(kvb_bf16), FAKE(kvb_bf16), &s, 81, 1024, FAKE(float),
                                  FAKE(int32_t), NULL, NULL, 0, 0), KVB_EINVAL);
    assert_error_mentions("hybrid_score: workspace_bytes=0 out of range");
    assert_int_equal(hybrid_score(FAKE(kvb_bf16), FAKE(kvb_bf16), NULL, &s, 81, 1024, FAKE(float), FAKE(int32_t), NULL, ws,
                                  big, 0), KVB_EINVAL);
    assert_error_mentions("NULL");
    /* hybrid_score_append: the same checks, then its own: the position must be inside the scored length,
     * a cache write needs V, vnew and rows for position t */
    int32_t t[1] = {32768};
    hybrid_append app = {FAKE(kvb_bf16), NULL, FAKE(int32_t), t, FAKE(kvb_bf16), FAKE(kvb_bf16), NULL, NULL, 0};
    assert_int_equal(hybrid_score_append(FAKE(kvb_bf16), &app, &s, 81, 1024, FAKE(float), FAKE(int32_t), NULL, ws, big, 0),
                     KVB_EINVAL);
    assert_error_mentions("hybrid_score_append: t[0]=32768 out of range [0, L-1 = 32767]");
    t[0] = 100;
    app.knew = NULL;
    assert_int_equal(hybrid_score_append(FAKE(kvb_bf16), &app, &s, 81, 1024, FAKE(float), FAKE(int32_t), NULL, ws, big, 0),
                     KVB_EINVAL);
    assert_error_mentions("hybrid_score_append: knew, t, t_host, kmin or kmax is NULL");
    app.knew = FAKE(kvb_bf16);
    assert_int_equal(hybrid_score_append(FAKE(kvb_bf16), &app, &s, 0, 1024, FAKE(float), FAKE(int32_t), NULL, ws, big, 0),
                     KVB_EINVAL);
    assert_error_mentions("hybrid_score_append: r=0 out of range [1, 128]");
    app.K = FAKE(kvb_bf16);
    assert_int_equal(hybrid_score_append(FAKE(kvb_bf16), &app, &s, 81, 1024, FAKE(float), FAKE(int32_t), NULL, ws, big, 0),
                     KVB_EINVAL);
    assert_error_mentions("hybrid_score_append: K is given but V or vnew is NULL");
    app.V = FAKE(kvb_bf16), app.vnew = FAKE(kvb_bf16), app.cache_L = 32767;
    assert_int_equal(hybrid_score_append(FAKE(kvb_bf16), &app, &s, 81, 1024, FAKE(float), FAKE(int32_t), NULL, ws, big, 0),
                     KVB_EINVAL);
    assert_error_mentions("hybrid_score_append: cache_L=32767 out of range [L = 32768, 2147483647]");
    assert_int_equal(hybrid_score_append(FAKE(kvb_bf16), NULL, &s, 81, 1024, FAKE(float), FAKE(int32_t), NULL, ws, big, 0),
                     KVB_EINVAL);
    assert_error_mentions("hybrid_score_append: app is NULL");
}

static void test_quest_api_refusals(void **state)
{
    (void)state;
    page_layout s = llama(32768, 16);
    void *ws = FAKE(void);
    const size_t big = (size_t)1 << 40;
    assert_int_equal(quest_score(FAKE(kvb_bf16), FAKE(kvb_bf16), FAKE(kvb_bf16), &s, 8, FAKE(float), FAKE(int32_t), ws,
                                 big, 0), KVB_EINVAL);
    assert_error_mentions("quest_score: budget=8 tokens out of range [P = 16, L = 32768]");
    assert_int_equal(quest_score(FAKE(kvb_bf16), FAKE(kvb_bf16), FAKE(kvb_bf16), &s, 40000, FAKE(float), FAKE(int32_t),
                                 ws, big, 0), KVB_EINVAL);
    assert_error_mentions("quest_score: budget=40000 tokens out of range [P = 16, L = 32768]");
    s.cap = 2040; /* 2048 pages */
    assert_int_equal(quest_score(FAKE(kvb_bf16), FAKE(kvb_bf16), FAKE(kvb_bf16), &s, 2048, FAKE(float), FAKE(int32_t), ws,
                                 big, 0), KVB_EINVAL);
    assert_error_mentions("quest_score: cap=2040 out of range", "= 2048 pages");
    s = llama(32768, 16);
    s.D = 12;
    assert_int_equal(quest_score(FAKE(kvb_bf16), FAKE(kvb_bf16), FAKE(kvb_bf16), &s, 2048, FAKE(float), FAKE(int32_t), ws,
                                 big, 0), KVB_EINVAL);
    assert_error_mentions("quest_score: D=12 out of range: a multiple of 8 in [8, 256]");
}
#endif

int main(void)
{
    static const char *const families[] = {"page_scoring", NULL};
#if KVB_HAVE_CUDA
    const struct CMUnitTest fixed[] = {
        cmocka_unit_test(test_metadata_api_refusals),
        cmocka_unit_test(test_hybrid_api_refusals),
        cmocka_unit_test(test_quest_api_refusals),
    };
    return kvb_test_run_gpu_cases("gpu page_scoring", fixed, (int)(sizeof fixed / sizeof fixed[0]), families, 2);
#else
    return kvb_test_run_gpu_cases("gpu page_scoring", NULL, 0, families, 2);
#endif
}
