/* test_trust.c: the places where a verdict or a percentage could be wrong without anyone noticing:
 * a figure above its ceiling is flagged; outputs of zeros fail validation (also where the reference
 * is sampled); slices a sampled reference skips are still screened and checked against invariants;
 * a failed host allocation fails its case by name instead of crashing. No device needed. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "harness/core/cli.h"
#include "tests/testlib.h"

static kvb_case parse(const char *line)
{
    kvb_case c;
    assert_int_equal(kvb_case_parse(line, "test", &c), KVB_OK);
    return c;
}

/* hand-made bench result at 105.7% of its ceiling (dense decode against the old copy ceiling) */
static void test_ceiling_error_flagged(void **state)
{
    (void)state;
    kvb_case c = parse("decode_attn B=8 L=131072");
    kvb_bench_result x = {.c = &c, .ceiling_s = 1005.2e-6, .median_s = 951.0e-6, .min_s = 950e-6, .max_s = 960e-6,
                          .noise = 0.01, .done = 1};
    x.cost.bytes_dev = 4.3e9;
    x.cost.ceiling = KVB_CEIL_READ;
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    kvb_bench_summary_row(f, &x, &x, 1, NULL);
    fclose(f);
    assert_non_null(strstr(buf, "105.7% of device read"));
    assert_non_null(strstr(buf, "CEILING ERROR"));
    free(buf);
    /* at 99% nothing is flagged */
    x.ceiling_s = 0.99 * x.median_s;
    f = open_memstream(&buf, &len);
    kvb_bench_summary_row(f, &x, &x, 1, NULL);
    fclose(f);
    assert_null(strstr(buf, "CEILING ERROR"));
    free(buf);
    assert_true(kvb_ceiling_suspect(100.01));
    assert_false(kvb_ceiling_suspect(100.0));
}

/* A sampled decode case: L, D and dist of the bench tier's (the same output magnitudes), at G = Hq/Hkv = 8,
 * the most reference work per input element, so that a quarter of the bench case's K and V (B=4 Hkv=4)
 * already exceeds the reference budget (8 of 16 slices computed). The time goes into filling K and V,
 * not into the property. */
#define SAMPLED_DECODE "decode_attn B=4 Hq=32 Hkv=4 D=128 L=32768 dist=normal"

/* dist=normal decode outputs are small (|o| near atol for many elements): outputs of zeros must still fail
 * on the slices a sampled reference covers */
static void test_zeros_caught_on_sampled_decode(void **state)
{
    (void)state;
    kvb_case c = parse(SAMPLED_DECODE);
    kvb_run r;
    kvb_outcome o;
    kvb_status st = kvb_case_validate_zeros(&r, &c, &o);
    assert_string_not_equal(r.note, ""); /* the reference is sampled here */
    assert_int_equal(st, KVB_FAIL);
    assert_string_equal(o.why, "zeros caught");
    kvb_run_teardown(&r);
}

/* the reference on its own outputs passes; then damage only a slice the sample skipped */
static void test_unsampled_slices_screened(void **state)
{
    (void)state;
    kvb_case c = parse(SAMPLED_DECODE);
    kvb_run r;
    assert_int_equal(kvb_run_setup(&r, &c, NULL), KVB_OK);
    kvb_tensor *o = kvb_run_find(&r, "o");
    assert_non_null(o->slice_mask);
    int64_t skipped = -1;
    for (int64_t s = 0; s < o->n / o->slice_len && skipped < 0; s++)
        if (!o->slice_mask[s]) skipped = s;
    assert_true(skipped > 0);
    o->out = kvb_run_alloc(&r, (size_t)o->n * 2, "o");
    memcpy(o->out, o->ref, (size_t)o->n * 2); /* unsampled slices of ref hold zeros: finite */
    kvb_verdict v;
    kvb_run_compare(&r, &v);
    assert_true(v.pass);
    assert_true(v.res[0].n_screened > 0);
    ((kvb_bf16 *)o->out)[skipped * o->slice_len + 3] = 0xFFFF; /* poison left in a skipped slice */
    kvb_run_compare(&r, &v);
    assert_false(v.pass);
    assert_int_equal(v.res[0].n_nonfinite, 1);
    kvb_run_teardown(&r);
}

/* column sums: every slice must add up to its contributing rows, sampled or not */
static void test_colsum_invariant_every_slice(void **state)
{
    (void)state;
    kvb_case c = parse("selective_attn B=2 Hq=8 Hkv=2 L=256 D=64 group_sum=1 sample=1");
    kvb_run r;
    assert_int_equal(kvb_run_setup(&r, &c, NULL), KVB_OK);
    kvb_tensor *cs = kvb_run_find(&r, "colsum"), *csk = kvb_run_find(&r, "colsum_kv");
    assert_non_null(cs);
    for (int i = 0; i < r.nt; i++) /* device outputs = the reference, where it was computed */
        if (r.t[i].role == KVB_OUT) {
            size_t bytes = (size_t)r.t[i].n * kvb_dtype_size(r.t[i].dtype);
            r.t[i].out = kvb_run_alloc(&r, bytes, r.t[i].name);
            memcpy(r.t[i].out, r.t[i].ref, bytes);
        }
    assert_non_null(cs->slice_mask);
    /* fill the skipped slices with what a correct kernel writes there: the sampled slice 0's values */
    int64_t L = cs->slice_len, n_s = cs->n / L;
    for (int64_t s = 0; s < n_s; s++)
        if (!cs->slice_mask[s]) memcpy((float *)cs->out + s * L, cs->ref, sizeof(float) * (size_t)L);
    for (int64_t s = 0; s < csk->n / L; s++)
        if (!csk->slice_mask[s]) memcpy((float *)csk->out + s * L, csk->ref, sizeof(float) * (size_t)L);
    kvb_clear_error();
    assert_int_equal(c.op->out_check(&r), KVB_OK);
    /* halve one column sum in a skipped slice: finite, so only the invariant can see it */
    int64_t skipped = 0;
    while (cs->slice_mask[skipped]) skipped++;
    ((float *)cs->out)[skipped * L] *= 0.5f;
    ((float *)cs->out)[skipped * L + 1] += 0.5f * ((float *)cs->out)[skipped * L] + 1.0f;
    assert_int_not_equal(c.op->out_check(&r), KVB_OK);
    assert_error_mentions("colsum", "contributing rows");
    kvb_run_teardown(&r);
}

/* a host allocation that cannot be satisfied fails its case by name and size */
static void test_host_alloc_failure_names_case(void **state)
{
    (void)state;
    kvb_case c = parse("decode_attn B=1 L=16");
    kvb_run r;
    assert_int_equal(kvb_run_setup(&r, &c, NULL), KVB_OK);
    jmp_buf jb;
    volatile int jumped = 0;
    if (setjmp(*kvb_guard_enter(&jb))) {
        kvb_guard_leave();
        jumped = 1;
    } else {
        (void)kvb_run_alloc(&r, (size_t)1 << 62, "a huge tensor");
        kvb_guard_leave();
    }
    assert_true(jumped);
    assert_error_mentions("decode_attn B=1", "out of host memory", "4611686018427387904 bytes", "a huge tensor");
    kvb_run_teardown(&r);
}

/* Tolerance overrides are not part of the id, but every place that states a verdict states them: the
 * reproduce line (check output and JSON), a benchmark's label (its JSON) and its failure message. */
static void test_tolerance_overrides_reported(void **state)
{
    (void)state;
    kvb_case c;
    char buf[KVB_ID_MAX + 512];
    assert_int_equal(kvb_case_parse("index_scan B=1 Hkv=1 M=7 atol=0.5 l2=0.25", "test", &c), KVB_OK);
    assert_null(strstr(c.id, "atol"));
    kvb_case_repro(&c, buf, sizeof buf);
    assert_true(!strncmp(buf, c.id, strlen(c.id)));
    assert_string_equal(buf + strlen(c.id), " atol=0.5 l2=0.25");
    kvb_bench_label(&c, "a note", buf, sizeof buf);
    assert_non_null(strstr(buf, "a note; outputs of zeros caught"));
    assert_non_null(strstr(buf, "tolerance overrides atol=0.5 l2=0.25"));
    char repro[KVB_ID_MAX + 128];
    kvb_case_repro(&c, repro, sizeof repro);
    assert_non_null(strstr(buf, repro));
    /* a reproduce line is itself a case line with the same overrides */
    kvb_case c2;
    assert_int_equal(kvb_case_parse(repro, "test", &c2), KVB_OK);
    assert_string_equal(c2.id, c.id);
    assert_true(c2.atol == 0.5 && c2.l2 == 0.25 && c2.rtol < 0);
    /* without overrides: the id alone, and nothing about tolerances in the label */
    assert_int_equal(kvb_case_parse("index_scan B=1 Hkv=1 M=7", "test", &c), KVB_OK);
    kvb_case_repro(&c, buf, sizeof buf);
    assert_string_equal(buf, c.id);
    kvb_bench_label(&c, "", buf, sizeof buf);
    assert_string_equal(buf, "outputs of zeros caught by validation");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_ceiling_error_flagged),
        cmocka_unit_test(test_zeros_caught_on_sampled_decode),
        cmocka_unit_test(test_unsampled_slices_screened),
        cmocka_unit_test(test_colsum_invariant_every_slice),
        cmocka_unit_test(test_host_alloc_failure_names_case),
        cmocka_unit_test(test_tolerance_overrides_reported),
    };
    return cmocka_run_group_tests_name("trust", tests, NULL, NULL);
}
