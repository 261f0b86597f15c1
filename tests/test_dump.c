/* test_dump.c: `check --dump` writes only computed data and fails loudly. A sampled reference's
 * skipped slices are NaN (floats) or -1 (integers) with a mask file; an output without a reference
 * has no .ref.npy; meta.json says which is which; stale files of an earlier dump go; a file or
 * directory that cannot be written is an error naming it. And every op computes the reference of
 * every output it does not mark KVB_T_NO_REF (checked on memory filled with a known byte). No device
 * needed. */
#include <malloc.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness/core/cli.h"
#include "harness/core/json_read.h"
#include "tests/testlib.h"

static kvb_case parse(const char *line)
{
    kvb_case c;
    assert_int_equal(kvb_case_parse(line, "test", &c), KVB_OK);
    return c;
}

static char g_tmp[256];

static int make_tmp(void **state)
{
    (void)state;
    snprintf(g_tmp, sizeof g_tmp, "/tmp/kvb_test_dump_XXXXXX");
    return mkdtemp(g_tmp) ? 0 : -1;
}

static int remove_tmp(void **state)
{
    (void)state;
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
    return system(cmd) == 0 ? 0 : -1;
}

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* the case's dump directory */
static void case_dir(const kvb_case *c, char *out, size_t n)
{
    size_t len = (size_t)snprintf(out, n, "%s/", g_tmp);
    for (const char *p = c->id; *p && len + 1 < n; p++) out[len++] = *p == ' ' ? '_' : *p;
    out[len] = '\0';
}

/* A .npy file: its dtype and shape strings from the header, and its data (malloc'd). */
typedef struct npy {
    char descr[8], shape[64];
    uint8_t *data;
    size_t bytes;
} npy;

static npy read_npy(const char *dir, const char *file)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("%s: not written", path);
    uint8_t pre[10];
    assert_int_equal(fread(pre, 1, 10, f), 10);
    assert_memory_equal(pre, "\x93NUMPY\x01\x00", 8);
    const size_t hlen = (size_t)pre[8] | (size_t)pre[9] << 8;
    assert_int_equal((10 + hlen) % 64, 0);
    char header[600] = "";
    assert_true(hlen < sizeof header);
    assert_int_equal(fread(header, 1, hlen, f), hlen);
    npy x = {0};
    assert_int_equal(sscanf(header, "{'descr': '%7[^']', 'fortran_order': False, 'shape': (%63[^)]", x.descr, x.shape), 2);
    long start = ftell(f);
    fseek(f, 0, SEEK_END);
    x.bytes = (size_t)(ftell(f) - start);
    fseek(f, start, SEEK_SET);
    x.data = malloc(x.bytes + 1);
    assert_int_equal(fread(x.data, 1, x.bytes, f), x.bytes);
    fclose(f);
    return x;
}

/* meta.json's entry for a tensor */
static const kvb_jval *meta_tensor(const kvb_jval *meta, const char *name)
{
    const kvb_jval *ts = kvb_jget(meta, "tensors");
    assert_non_null(ts);
    for (int i = 0; i < ts->n; i++)
        if (!strcmp(kvb_jstr(&ts->items[i], "name"), name)) return &ts->items[i];
    return NULL;
}

static void add_tensor(kvb_run *r, const char *name, kvb_dtype dt, int64_t rows, int64_t cols, int role)
{
    kvb_tensor *t = &r->t[r->nt++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = dt, t->ndim = 2, t->shape[0] = rows, t->shape[1] = cols, t->n = rows * cols, t->role = role;
    t->slice_len = t->n;
    t->cmp = role == KVB_IN ? KVB_CMP_NONE : kvb_dtype_is_float(dt) ? KVB_CMP_FLOAT : KVB_CMP_EXACT;
}

/* A hand-made run: fp32, bf16 and int32 references sampled on some slices, an output without a
 * reference, an input, one marked not to dump, scratch; then a stale file of each kind to remove. */
static void test_sampled_reference_written_as_computed(void **state)
{
    (void)state;
    kvb_case c = parse("index_scan B=1 Hkv=1 M=7 ids=64");
    static kvb_run r;
    memset(&r, 0, sizeof r);
    r.c = &c, r.op = c.op, r.ref_ready = 1;
    static float o_ref[12];
    static kvb_bf16 b_ref[12];
    static int32_t i_ref[8];
    static float u_ref[4];
    static uint8_t x_in[5] = {1, 2, 3, 4, 5}, big_in[4];
    static const uint8_t mask4[4] = {1, 0, 0, 1}, mask_i[4] = {0, 1, 1, 0};
    for (int i = 0; i < 12; i++) o_ref[i] = (float)(i + 1), b_ref[i] = kvb_float_to_bf16((float)(i + 1));
    for (int i = 0; i < 8; i++) i_ref[i] = 100 + i;
    memset(u_ref, 0xA5, sizeof u_ref); /* never computed */
    add_tensor(&r, "o", KVB_FP32, 4, 3, KVB_OUT);
    r.t[0].ref = o_ref, r.t[0].slice_len = 3, r.t[0].slice_mask = mask4;
    add_tensor(&r, "b", KVB_BF16, 4, 3, KVB_OUT);
    r.t[1].ref = b_ref, r.t[1].slice_len = 3, r.t[1].slice_mask = mask4;
    add_tensor(&r, "idx", KVB_I32, 4, 2, KVB_OUT);
    r.t[2].ref = i_ref, r.t[2].slice_len = 2, r.t[2].slice_mask = mask_i;
    add_tensor(&r, "U", KVB_FP32, 2, 2, KVB_OUT);
    r.t[3].ref = u_ref, r.t[3].cmp = KVB_CMP_NONE, r.t[3].flags = KVB_T_NO_REF;
    add_tensor(&r, "x", KVB_U8, 1, 5, KVB_IN);
    r.t[4].h = x_in;
    add_tensor(&r, "big", KVB_U8, 2, 2, KVB_IN);
    r.t[5].h = big_in, r.t[5].flags = KVB_T_NO_DUMP;
    add_tensor(&r, "ws", KVB_U8, 1, 1, KVB_SCRATCH);

    char dir[1024], path[1200];
    case_dir(&c, dir, sizeof dir);
    assert_int_equal(mkdir(dir, 0755), 0);
    const char *stale[] = {"U.ref.npy", "x.out.npy", "big.npy", "o.out.npy", "meta.json"};
    for (int i = 0; i < 5; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, stale[i]);
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fclose(f);
    }
    assert_int_equal(kvb_dump_run(g_tmp, &r), KVB_OK);
    for (int i = 0; i < 4; i++) { /* the stale files are gone: meta.json is this dump's */
        snprintf(path, sizeof path, "%s/%s", dir, stale[i]);
        if (exists(path)) fail_msg("%s: left from an earlier dump", path);
    }

    npy o = read_npy(dir, "o.ref.npy"), om = read_npy(dir, "o.ref_mask.npy");
    assert_string_equal(o.descr, "<f4");
    assert_string_equal(o.shape, "4, 3");
    assert_int_equal(o.bytes, 12 * 4);
    assert_string_equal(om.descr, "|u1");
    assert_string_equal(om.shape, "4, 3");
    assert_int_equal(om.bytes, 12);
    for (int i = 0; i < 12; i++) {
        float v;
        memcpy(&v, o.data + 4 * i, 4);
        if (mask4[i / 3]) assert_true(v == o_ref[i]);
        else assert_true(isnan(v));
        assert_int_equal(om.data[i], mask4[i / 3]);
    }
    npy b = read_npy(dir, "b.ref.npy");
    assert_string_equal(b.descr, "<u2");
    for (int i = 0; i < 12; i++) {
        uint16_t v;
        memcpy(&v, b.data + 2 * i, 2);
        if (mask4[i / 3]) assert_int_equal(v, b_ref[i]);
        else assert_true(isnan(kvb_bf16_to_float(v)));
    }
    npy idx = read_npy(dir, "idx.ref.npy"), im = read_npy(dir, "idx.ref_mask.npy");
    assert_string_equal(idx.descr, "<i4");
    for (int i = 0; i < 8; i++) {
        int32_t v;
        memcpy(&v, idx.data + 4 * i, 4);
        assert_int_equal(v, mask_i[i / 2] ? i_ref[i] : -1);
        assert_int_equal(im.data[i], mask_i[i / 2]);
    }
    npy x = read_npy(dir, "x.npy");
    assert_string_equal(x.descr, "|u1");
    assert_string_equal(x.shape, "1, 5");
    assert_memory_equal(x.data, x_in, 5);
    snprintf(path, sizeof path, "%s/U.ref.npy", dir);
    assert_false(exists(path));
    snprintf(path, sizeof path, "%s/ws.npy", dir);
    assert_false(exists(path));

    kvb_jval meta;
    snprintf(path, sizeof path, "%s/meta.json", dir);
    assert_int_equal(kvb_json_read_file(path, &meta), KVB_OK);
    assert_string_equal(kvb_jstr(&meta, "case"), c.id);
    const kvb_jval *mo = meta_tensor(&meta, "o"), *mi = meta_tensor(&meta, "idx"), *mu = meta_tensor(&meta, "U");
    assert_string_equal(kvb_jstr(mo, "reference"), "sampled");
    assert_true(kvb_jnum(mo, "slices", 0) == 4 && kvb_jnum(mo, "slices_computed", 0) == 2 && kvb_jnum(mo, "slice_elements", 0) == 3);
    assert_string_equal(kvb_jstr(mo, "skipped_slices_hold"), "NaN");
    assert_string_equal(kvb_jstr(mo, "reference_mask_file"), "o.ref_mask.npy");
    assert_string_equal(kvb_jstr(mo, "dtype"), "fp32");
    assert_string_equal(kvb_jstr(mi, "skipped_slices_hold"), "-1 (every bit set)");
    assert_true(!strncmp(kvb_jstr(mu, "reference"), "none", 4));
    assert_null(kvb_jget(mu, "reference_file"));
    assert_null(kvb_jget(mo, "output_file")); /* no device run */
    assert_false(kvb_jget(meta_tensor(&meta, "big"), "dumped")->num);
    assert_null(meta_tensor(&meta, "ws"));
    const kvb_jval *shape = kvb_jget(mo, "shape");
    assert_true(shape && shape->n == 2 && shape->items[0].num == 4 && shape->items[1].num == 3);
    kvb_json_free(&meta);
    free(o.data), free(om.data), free(b.data), free(idx.data), free(im.data), free(x.data);

    /* after a setup that failed part way: meta.json alone, the arrays of the earlier dump removed */
    r.ref_ready = 0;
    assert_int_equal(kvb_dump_run(g_tmp, &r), KVB_OK);
    snprintf(path, sizeof path, "%s/o.ref.npy", dir);
    assert_false(exists(path));
    snprintf(path, sizeof path, "%s/x.npy", dir);
    assert_false(exists(path));
    snprintf(path, sizeof path, "%s/meta.json", dir);
    assert_int_equal(kvb_json_read_file(path, &meta), KVB_OK);
    assert_false(kvb_jget(&meta, "reference_computed")->num);
    assert_true(!strncmp(kvb_jstr(meta_tensor(&meta, "o"), "reference"), "not computed", 12));
    kvb_json_free(&meta);
}

/* shadowkv_lowrank's factors have no reference: no U.ref.npy; its info output has one */
static void test_outputs_without_reference_not_dumped(void **state)
{
    (void)state;
    kvb_case c = parse("shadowkv_lowrank S=64 Hkv=2 D=16 r=8");
    kvb_run r;
    assert_int_equal(kvb_run_setup(&r, &c, NULL), KVB_OK);
    assert_int_equal(kvb_dump_run(g_tmp, &r), KVB_OK);
    char dir[1024], path[1200];
    case_dir(&c, dir, sizeof dir);
    const char *none[] = {"U", "SV", "U_bf16", "SV_bf16"};
    kvb_jval meta;
    snprintf(path, sizeof path, "%s/meta.json", dir);
    assert_int_equal(kvb_json_read_file(path, &meta), KVB_OK);
    for (int i = 0; i < 4; i++) {
        assert_true(kvb_run_find(&r, none[i])->flags & KVB_T_NO_REF);
        snprintf(path, sizeof path, "%s/%s.ref.npy", dir, none[i]);
        if (exists(path)) fail_msg("%s written: that output has no reference", path);
        assert_true(!strncmp(kvb_jstr(meta_tensor(&meta, none[i]), "reference"), "none", 4));
    }
    assert_string_equal(kvb_jstr(meta_tensor(&meta, "info"), "reference"), "computed");
    kvb_json_free(&meta);
    npy info = read_npy(dir, "info.ref.npy");
    assert_int_equal(info.bytes, 4);
    free(info.data);
    kvb_run_teardown(&r);
}

/* a real sampled reference (selective_attn sample=1): NaN exactly where its mask says not computed */
static void test_sampled_op_dump(void **state)
{
    (void)state;
    kvb_case c = parse("selective_attn B=2 Hq=8 Hkv=2 L=256 D=64 group_sum=1 sample=1");
    kvb_run r;
    assert_int_equal(kvb_run_setup(&r, &c, NULL), KVB_OK);
    const kvb_tensor *cs = kvb_run_find(&r, "colsum");
    assert_non_null(cs->slice_mask);
    assert_int_equal(kvb_dump_run(g_tmp, &r), KVB_OK);
    char dir[1024];
    case_dir(&c, dir, sizeof dir);
    npy v = read_npy(dir, "colsum.ref.npy"), m = read_npy(dir, "colsum.ref_mask.npy");
    assert_int_equal(v.bytes, (size_t)cs->n * 4);
    assert_int_equal(m.bytes, (size_t)cs->n);
    int64_t nan = 0, kept = 0;
    for (int64_t i = 0; i < cs->n; i++) {
        float x;
        memcpy(&x, v.data + 4 * i, 4);
        assert_int_equal(m.data[i], cs->slice_mask[i / cs->slice_len]);
        if (m.data[i]) {
            assert_memory_equal(&x, (const float *)cs->ref + i, 4);
            kept++;
        } else {
            assert_true(isnan(x));
            nan++;
        }
    }
    assert_true(nan > 0 && kept > 0);
    free(v.data), free(m.data);
    kvb_run_teardown(&r);
}

/* a directory that cannot be made or a file that cannot be written is an error naming it */
static void test_dump_errors_name_the_path(void **state)
{
    (void)state;
    char file[300], path[400];
    snprintf(file, sizeof file, "%s/a_file", g_tmp);
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fclose(f);
    snprintf(path, sizeof path, "%s/sub/dir", file);
    assert_int_not_equal(kvb_dump_prepare(path), KVB_OK);
    assert_error_mentions("cannot create", file, "not a directory");
    snprintf(path, sizeof path, "%s/new/nested", g_tmp);
    assert_int_equal(kvb_dump_prepare(path), KVB_OK); /* missing parents are made */
    /* the case's own directory taken by a file */
    kvb_case c = parse("index_scan B=1 Hkv=1 M=7 ids=64");
    kvb_run r;
    assert_int_equal(kvb_run_setup(&r, &c, NULL), KVB_OK);
    char dir[1024];
    case_dir(&c, dir, sizeof dir);
    assert_non_null(f = fopen(dir, "w"));
    fclose(f);
    assert_int_not_equal(kvb_dump_run(g_tmp, &r), KVB_OK);
    assert_error_mentions(dir, "not a directory");
    kvb_run_teardown(&r);
    /* a write that fails (a full device): an error, and the device file is not removed */
    int64_t shape[1] = {1 << 20};
    void *big = calloc(1 << 20, 4);
    assert_int_equal(kvb_npy_write("/dev/full", KVB_FP32, 1, shape, big), KVB_EIO);
    assert_error_mentions("cannot write /dev/full", "No space left");
    free(big);
    struct stat st;
    assert_int_equal(stat("/dev/full", &st), 0);
    assert_true(S_ISCHR(st.st_mode));
}

/* 1 when every byte of p[0:bytes] is the fill of M_PERTURB 0x5A */
static int never_written(const uint8_t *p, int64_t bytes)
{
    int64_t j = 0;
    while (j < bytes && p[j] == 0xA5) j++;
    return j == bytes;
}

/* What a dump of one case would write, on memory malloc filled with 0xA5: every input, and every slice
 * a reference covers, of the tensors a dump writes (not KVB_T_NO_DUMP, not KVB_T_NO_REF). */
static void check_references_computed(const kvb_case *c)
{
    kvb_run r;
    if (kvb_run_setup(&r, c, NULL) != KVB_OK) fail_msg("%s: setup failed: %s", c->id, kvb_last_error());
    for (int i = 0; i < r.nt; i++) {
        const kvb_tensor *t = &r.t[i];
        if (t->flags & KVB_T_NO_DUMP) continue;
        if (t->h && (t->role == KVB_IN || t->role == KVB_INOUT) && never_written(t->h, t->n * (int64_t)kvb_dtype_size(t->dtype)))
            fail_msg("%s: input %s never written", c->id, t->name);
        if ((t->role != KVB_OUT && t->role != KVB_INOUT) || (t->flags & KVB_T_NO_REF)) continue;
        const int64_t L = t->slice_mask ? t->slice_len : t->n, es = (int64_t)kvb_dtype_size(t->dtype);
        for (int64_t s = 0; s * L < t->n; s++) {
            if (t->slice_mask && !t->slice_mask[s]) continue;
            if (never_written((const uint8_t *)t->ref + s * L * es, (s * L + L <= t->n ? L : t->n - s * L) * es))
                fail_msg("%s: reference of %s (slice %lld) never written: compute it, or mark the output "
                         "KVB_T_NO_REF", c->id, t->name, (long long)s);
        }
    }
    kvb_run_teardown(&r);
}

/* Every op computes what a dump of it writes: every smoke case (and an op's first check case when it
 * has none: the smoke tier covers each op's methods and impls) set up on memory that malloc fills
 * with 0xA5, and no input or slice a reference covers that still holds nothing else. */
static void test_every_reference_computed(void **state)
{
    (void)state;
    kvb_case_list all = {0};
    assert_int_equal(kvb_cases_load(&all, kvb_test_cases_dir()), KVB_OK);
    mallopt(M_PERTURB, 0x5A); /* malloc'd bytes start as ~0x5A = 0xA5 */
    int ops = 0;
    for (int k = 0; k < kvb_op_count(); k++) {
        const kvb_op *op = kvb_op_at(k);
        int has_smoke = 0, n_run = 0;
        for (int i = 0; i < all.n; i++) has_smoke |= all.v[i].op == op && all.v[i].tier == KVB_TIER_SMOKE;
        for (int i = 0; i < all.n; i++) {
            const kvb_case *c = &all.v[i];
            if (c->op != op || c->tier != (has_smoke ? KVB_TIER_SMOKE : KVB_TIER_CHECK) || (!has_smoke && n_run)) continue;
            n_run++;
            check_references_computed(c);
        }
        ops += n_run > 0;
    }
    mallopt(M_PERTURB, 0);
    assert_int_equal(ops, kvb_op_count());
    kvb_cases_free(&all);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_sampled_reference_written_as_computed, make_tmp, remove_tmp),
        cmocka_unit_test_setup_teardown(test_outputs_without_reference_not_dumped, make_tmp, remove_tmp),
        cmocka_unit_test_setup_teardown(test_sampled_op_dump, make_tmp, remove_tmp),
        cmocka_unit_test_setup_teardown(test_dump_errors_name_the_path, make_tmp, remove_tmp),
        cmocka_unit_test(test_every_reference_computed),
    };
    return cmocka_run_group_tests_name("dump", tests, NULL, NULL);
}
