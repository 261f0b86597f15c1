/* test_host_mem.c: host memory, no device needed. Every op estimates a case's host memory from its keys
 * (kvb_op.host_bytes), honestly: on every case of the smoke tier the bytes the set-up allocates through
 * the checked allocator stay within 1.5x of the estimate. A case above the machine's memory (or the
 * --host-mem-limit) is refused by name before anything is allocated. A host allocation that fails (one
 * injected at each site in turn) fails its case by name and size, and the run goes on; the host pool
 * grows inside the case that needs it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "harness/core/cli.h"
#include "harness/ops/ops.h"
#include "tests/testlib.h"

#define SLACK (64u << 10) /* bookkeeping no estimate counts: the run's list, a state struct, malloc's rounding */

static kvb_case parse(const char *line)
{
    kvb_case c;
    if (kvb_case_parse(line, "test", &c) != KVB_OK) fail_msg("%s: %s", line, kvb_last_error());
    return c;
}

/* Set c up inside a case guard; KVB_OK, or the failure (an allocation's jump included). The run is left
 * for kvb_run_teardown either way. */
static int guarded_setup(kvb_run *r, const kvb_case *c)
{
    jmp_buf jb;
    if (setjmp(*kvb_guard_enter(&jb))) {
        kvb_guard_leave();
        return KVB_ENOMEM;
    }
    int rc = kvb_run_setup(r, c, NULL);
    if (!rc && r->op->ref_check) rc = r->op->ref_check(r);
    kvb_guard_leave();
    return rc;
}

/* Every op has an estimate */
static void test_every_op_estimates(void **state)
{
    (void)state;
    for (int i = 0; i < kvb_op_count(); i++) {
        const kvb_op *op = kvb_op_at(i);
        if (!op->host_bytes) fail_msg("%s has no host_bytes estimate (kvb_op.host_bytes)", op->name);
    }
}

/* Estimate against what the set-up and the reference's checks allocate on the CPU path, plus what the GPU
 * path adds for the outputs (the download and the zeros check's copy). */
static void test_estimates_honest(void **state)
{
    (void)state;
    kvb_case_list all = {0};
    assert_int_equal(kvb_cases_load(&all, kvb_test_cases_dir()), KVB_OK);
    int checked = 0, unestimated = 0, bad = 0;
    double worst_over = 0, worst_under = 0;
    char worst_id[KVB_ID_MAX] = "";
    for (int i = 0; i < all.n; i++) {
        const kvb_case *c = &all.v[i];
        if (!(c->tier & KVB_TIER_SMOKE)) continue;
        const size_t est = kvb_case_host_bytes(c);
        if (!est) {
            unestimated++;
            continue;
        }
        kvb_host_pool_release(); /* its pool counts as this case's */
        const size_t live = kvb_host_bytes_live();
        kvb_host_bytes_peak_reset();
        kvb_run r;
        const int rc = guarded_setup(&r, c);
        double actual = (double)(kvb_host_bytes_peak() - live);
        for (int t = 0; t < r.nt; t++)
            if (r.t[t].role == KVB_OUT || r.t[t].role == KVB_INOUT)
                actual += 2.0 * (double)r.t[t].n * kvb_dtype_size(r.t[t].dtype);
        char why[600];
        snprintf(why, sizeof why, "%s", kvb_last_error());
        kvb_run_teardown(&r);
        if (rc) fail_msg("%s: set-up failed: %s", c->id, why);
        checked++;
        const double over = actual / (1.5 * (double)est + SLACK), under = (double)est / (4.0 * actual + 16.0 * SLACK);
        if (over > worst_over) worst_over = over, snprintf(worst_id, sizeof worst_id, "%s", c->id);
        if (under > worst_under) worst_under = under;
        if (over > 1 || under > 1) {
            print_error("%s: estimate %zu bytes, allocated %.0f (with the GPU path's output copies): %s\n", c->id, est,
                        actual, over > 1 ? "more than 1.5x the estimate" : "the estimate is above 4x what it takes");
            bad++;
        }
    }
    kvb_host_pool_release();
    kvb_cases_free(&all);
    print_message("      %d smoke cases checked (%d of an op or method without an estimate); worst allocated / (1.5 x "
                  "estimate + 64 KiB) = %.2f (%s); worst estimate / (4 x allocated + 1 MiB) = %.2f\n", checked,
                  unestimated, worst_over, worst_id, worst_under);
    assert_true(checked > 0);
    assert_int_equal(bad, 0);
}

/* 64 TiB of K: refused by name with the estimate and the limit, nothing allocated */
static void test_refused_before_setup(void **state)
{
    (void)state;
    kvb_case c = parse("decode_attn B=1024 Hq=2048 Hkv=256 L=1048576");
    const size_t live = kvb_host_bytes_live();
    kvb_run r;
    kvb_clear_error();
    assert_int_equal(guarded_setup(&r, &c), KVB_ENOMEM);
    assert_error_mentions("decode_attn B=1024 Hq=2048 Hkv=256", "refused before set-up", "128.0 TiB", "--host-mem-limit");
    assert_int_equal(kvb_xalloc_count(), 0);
    assert_int_equal(kvb_host_bytes_live(), live);
    kvb_run_teardown(&r);
    assert_int_equal(kvb_host_bytes_live(), live);
}

/* --host-mem-limit: a small case above it is refused, naming the limit; without it the case runs */
static void test_limit_option(void **state)
{
    (void)state;
    kvb_options o;
    char *argv[] = {"kvbench", "check", "--host-mem-limit", "0.0001", NULL};
    assert_int_equal(kvb_parse_options(4, argv, &o), 0);
    assert_true(o.host_mem_limit_gb == 0.0001);
    char *bad[] = {"kvbench", "check", "--host-mem-limit", "-1", NULL};
    assert_int_equal(kvb_parse_options(4, bad, &o), 2);
    kvb_case c = parse("decode_attn B=1 Hq=8 Hkv=8 L=4096");
    kvb_run r;
    kvb_set_host_mem_limit(0.0001 * 1073741824.0);
    assert_int_equal(guarded_setup(&r, &c), KVB_ENOMEM);
    assert_error_mentions("decode_attn B=1", "refused before set-up", "set by --host-mem-limit");
    kvb_run_teardown(&r);
    kvb_set_host_mem_limit(0);
    assert_int_equal(guarded_setup(&r, &c), KVB_OK);
    kvb_run_teardown(&r);
}

static void test_saturation(void **state)
{
    (void)state;
    assert_true(kvb_host_bytes_sat(1e30) == SIZE_MAX);
    assert_true(kvb_host_bytes_sat(NAN) == SIZE_MAX);
    assert_true(kvb_host_bytes_sat(18446744073709551616.0) == SIZE_MAX);
    assert_true(kvb_host_bytes_sat(-5) == 0);
    assert_true(kvb_host_bytes_sat(12345.0) == 12345);
    /* n x size overflowing is an allocation failure, named */
    kvb_clear_error();
    assert_null(kvb_xalloc(SIZE_MAX / 2, 4, "an overflowing product"));
    assert_error_mentions("out of host memory", "an overflowing product");
}

typedef struct trace {
    long pool_at; /* the number of the host pool's allocation, or 0 */
} trace;

static void find_pool(void *ctx, long n, size_t bytes, const char *what)
{
    (void)bytes;
    trace *t = ctx;
    if (!t->pool_at && !strcmp(what, "the host pool")) t->pool_at = n;
}

/* Each allocation of a case fails in turn: the case fails by name, the message names the allocation, and
 * nothing of the run is left behind. */
static void test_injected_failures(void **state)
{
    (void)state;
    const char *lines[] = {
        "decode_attn B=2 Hq=8 Hkv=2 D=64 L=300 vary=1",
        "sparse_attn_pages B=2 Hq=8 Hkv=2 D=64 L=300 budget=64 P=16",
        "landmark_score B=1 Hq=8 Hkv=2 D=64 Lm=64 M=8 outliers=4",
        "shadowkv_landmarks B=1 Hkv=2 S=512 D=64 c=8 local_chunks=2 outlier_chunks=4",
        "shadowkv_prefill S=203 Hkv=2 D=32 r=8 c=8 local_chunks=2 outlier_chunks=3",
    };
    int injected = 0;
    for (size_t l = 0; l < sizeof lines / sizeof lines[0]; l++) {
        kvb_case c = parse(lines[l]);
        kvb_run r;
        unsetenv("KVB_FAIL_ALLOC_AT");
        assert_int_equal(guarded_setup(&r, &c), KVB_OK);
        kvb_run_teardown(&r);
        const long n = kvb_xalloc_count();
        assert_true(n > 0);
        for (long at = 1; at <= n; at++) {
            char v[32];
            snprintf(v, sizeof v, "%ld", at);
            setenv("KVB_FAIL_ALLOC_AT", v, 1);
            const size_t live = kvb_host_bytes_live();
            kvb_clear_error();
            const int rc = guarded_setup(&r, &c);
            char why[600];
            snprintf(why, sizeof why, "%s", kvb_last_error());
            kvb_run_teardown(&r);
            if (!kvb_xalloc_fault_fired()) continue; /* fewer allocations this time (threads) */
            injected++;
            if (rc == KVB_OK) fail_msg("%s: allocation %ld failed and the set-up succeeded", c.id, at);
            if (!strstr(why, "out of host memory") || !strstr(why, "(failure injected)"))
                fail_msg("%s: allocation %ld: the failure does not name the allocation: %s", c.id, at, why);
            if (kvb_host_bytes_live() != live) fail_msg("%s: allocation %ld: %zu bytes left behind", c.id, at, kvb_host_bytes_live() - live);
        }
    }
    unsetenv("KVB_FAIL_ALLOC_AT");
    print_message("      %d injected failures, each caught\n", injected);
    assert_true(injected > 0);
}

/* The host pool grows inside the case that needs it: its failure fails that case by name and size, and
 * the next case gets the pool. */
static void test_pool_failure_fails_the_case(void **state)
{
    (void)state;
    if (kvb_gpu_available()) {
        /* with a GPU the pool is pinned memory (cudaHostAlloc), outside the host allocator's trace and
         * failure injection; the failure's handling (fail_case) is the same code on both paths */
        print_message("      skipped: the pool is pinned here, out of reach of the allocator's injection\n");
        skip();
    }
    kvb_case c = parse("gather_copy_all B=1 Hkv=2 M=4 c=8 D=64 ctx=4096 sparse_start=32 extra=8");
    kvb_host_pool_release();
    trace t = {0};
    kvb_xalloc_trace(find_pool, &t);
    kvb_run r;
    assert_int_equal(guarded_setup(&r, &c), KVB_OK);
    kvb_run_teardown(&r);
    kvb_xalloc_trace(NULL, NULL);
    assert_true(t.pool_at > 0);
    assert_true(kvb_host_pool_held() > 0);
    kvb_host_pool_release();
    char v[32];
    snprintf(v, sizeof v, "%ld", t.pool_at);
    setenv("KVB_FAIL_ALLOC_AT", v, 1);
    kvb_clear_error();
    assert_int_equal(guarded_setup(&r, &c), KVB_ENOMEM);
    assert_error_mentions(c.id, "out of host memory", "bytes", "for the host pool");
    kvb_run_teardown(&r);
    assert_true(kvb_host_pool_held() == 0);
    unsetenv("KVB_FAIL_ALLOC_AT");
    assert_int_equal(guarded_setup(&r, &c), KVB_OK); /* the next case: the pool is there */
    assert_true(kvb_host_pool_held() > 0);
    kvb_run_teardown(&r);
    kvb_host_pool_release();
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_op_estimates),
        cmocka_unit_test(test_estimates_honest),
        cmocka_unit_test(test_refused_before_setup),
        cmocka_unit_test(test_limit_option),
        cmocka_unit_test(test_saturation),
        cmocka_unit_test(test_injected_failures),
        cmocka_unit_test(test_pool_failure_fails_the_case),
    };
    return cmocka_run_group_tests_name("host_mem", tests, NULL, NULL);
}
