/* test_case.c: the case parser: canonical ids, defaults, and every kind of bad input. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness/core/case.h"
#include "harness/core/op.h"
#include "tests/testlib.h"

static kvb_case c;

static int parse(const char *line) { return kvb_case_parse(line, "test", &c); }

static void test_canonical_id_fills_defaults_in_fixed_order(void **state)
{
    (void)state;
    assert_int_equal(parse("gather_copy hit=0.6 B=8 tier=bench"), KVB_OK);
    assert_string_equal(c.id, "gather_copy B=8 Hkv=8 M=256 c=8 D=128 ctx=131072 host_stride=0 sparse_start=416 "
                              "extra=64 hit=0.6 empty=0 seed=1 impl=kernel");
    assert_int_equal(c.tier, KVB_TIER_BENCH);
    char first[KVB_ID_MAX];
    snprintf(first, sizeof first, "%s", c.id);
    /* another spelling of the same case: same id; tier and tolerances are not part of it */
    assert_int_equal(parse("gather_copy  B=8\thit=0.60 ctx=128K impl=kernel atol=0.5 tier=check # comment"), KVB_OK);
    assert_string_equal(c.id, first);
    assert_true(c.atol == 0.5);
    /* the id is itself a case line that parses to the same id */
    assert_int_equal(parse(first), KVB_OK);
    assert_string_equal(c.id, first);
}

static void test_values_and_suffixes(void **state)
{
    (void)state;
    assert_int_equal(parse("packed_load T=32K k=2K layers=12 impl=cpu_gather"), KVB_OK);
    assert_int_equal(kvb_case_int(&c, "T"), 32768);
    assert_int_equal(kvb_case_int(&c, "k"), 2048);
    assert_string_equal(kvb_case_enum(&c, "impl"), "cpu_gather");
    assert_int_equal(parse("   # only a comment"), KVB_CASE_BLANK);
    assert_int_equal(parse(""), KVB_CASE_BLANK);
}

static void test_unknown_kernel(void **state)
{
    (void)state;
    assert_int_equal(parse("gather_cpy B=1"), KVB_EINVAL);
    assert_error_mentions("test:", "unknown kernel 'gather_cpy'", "gather_copy");
}

static void test_malformed_tokens(void **state)
{
    (void)state;
    assert_int_equal(parse("gather_copy B8"), KVB_EINVAL);
    assert_error_mentions("malformed token 'B8'", "key=value");
    assert_int_equal(parse("gather_copy B="), KVB_EINVAL);
    assert_error_mentions("malformed token 'B='");
    assert_int_equal(parse("gather_copy =3"), KVB_EINVAL);
    assert_int_equal(parse("B=1 gather_copy"), KVB_EINVAL);
    assert_error_mentions("starts with a kernel name");
}

static void test_unknown_and_duplicate_keys(void **state)
{
    (void)state;
    assert_int_equal(parse("gather_copy Q=3"), KVB_EINVAL);
    assert_error_mentions("unknown key 'Q'", "keys: B, Hkv, M");
    assert_int_equal(parse("gather_copy B=1 B=2"), KVB_EINVAL);
    assert_error_mentions("'B' given twice");
}

static void test_bad_values(void **state)
{
    (void)state;
    assert_int_equal(parse("gather_copy B=abc"), KVB_EINVAL);
    assert_error_mentions("B=abc is not an integer");
    assert_int_equal(parse("gather_copy B=1.5"), KVB_EINVAL);
    assert_int_equal(parse("gather_copy hit=x"), KVB_EINVAL);
    assert_error_mentions("hit=x is not a number");
    assert_int_equal(parse("gather_copy hit=1.5"), KVB_EINVAL);
    assert_error_mentions("hit=1.5 out of range [0, 1]");
    assert_int_equal(parse("gather_copy impl=gpu"), KVB_EINVAL);
    assert_error_mentions("impl=gpu is not one of kernel|memcpy_chunks|cpu_gather");
    assert_int_equal(parse("gather_copy tier=fast"), KVB_EINVAL);
    assert_error_mentions("tier=fast");
    assert_int_equal(parse("gather_copy atol=-1"), KVB_EINVAL);
}

/* An int key that allows only some values (a kernel's head dimensions, INT2's group sizes) says which,
 * in the range text `kvbench kernels` prints and in the refusal. */
static void test_int_choices(void **state)
{
    (void)state;
    assert_int_equal(parse("decode_attn D=64"), KVB_OK);
    assert_int_equal(parse("decode_attn D=96"), KVB_EINVAL);
    assert_error_mentions("decode_attn: D=96 is not one of {64, 128}");
    assert_int_equal(parse("int2_decode_attn gs=24"), KVB_EINVAL);
    assert_error_mentions("gs=24 is not one of {16, 32, 64, 128}");
    assert_int_equal(parse("int2_decode_attn D=2048"), KVB_EINVAL); /* past the range too: the list says it */
    assert_error_mentions("D=2048 is not one of {64, 128}");
    assert_int_equal(parse("decode_attn D=64K"), KVB_EINVAL); /* a suffix: the value as written */
    assert_error_mentions("D=64K is not one of {64, 128}");
    const kvb_op *op = kvb_op_find("int2_decode_attn");
    assert_non_null(op);
    char text[128];
    for (int i = 0; i < op->n_params; i++)
        if (!strcmp(op->params[i].name, "gs")) kvb_param_range_text(op, &op->params[i], text, sizeof text);
    assert_string_equal(text, "{16, 32, 64, 128}");
}

/* A key read only with some values of an enum key (kvb_op.scopes): declared as "key=a|b" over another
 * enum key of the same kernel and values it lists; its default accepted everywhere, another value refused
 * where the enum key's value does not read it, naming both, and accepted where it does. */
static void test_keys_read_only_with(void **state)
{
    (void)state;
    int declared = 0;
    for (int i = 0; i < kvb_op_count(); i++) {
        const kvb_op *op = kvb_op_at(i);
        for (int k = 0; k < op->n_scopes; k++) { /* each scope names a key of the kernel */
            int known = 0;
            for (int m = 0; m < op->n_params; m++) known |= !strcmp(op->params[m].name, op->scopes[k].key);
            if (!known) fail_msg("%s: a scope of the unknown key %s", op->name, op->scopes[k].key);
        }
        for (int k = 0; k < op->n_params; k++) {
            const char *w = kvb_param_only_with(op, &op->params[k]);
            if (!w) continue;
            declared++;
            const char *eq = strchr(w, '=');
            if (!eq || !eq[1]) fail_msg("%s %s: only_with '%s' is not key=a|b", op->name, op->params[k].name, w);
            const kvb_param *cond = NULL;
            for (int m = 0; m < op->n_params; m++)
                if (strlen(op->params[m].name) == (size_t)(eq - w) && !strncmp(op->params[m].name, w, (size_t)(eq - w)))
                    cond = &op->params[m];
            if (!cond || cond->type != KVB_P_ENUM || !cond->choices || cond == &op->params[k])
                fail_msg("%s %s: only_with '%s' names no other enum key with listed values", op->name, op->params[k].name, w);
            for (const char *v = eq + 1; v; v = strchr(v, '|') ? strchr(v, '|') + 1 : NULL) {
                const size_t n = strcspn(v, "|");
                int listed = 0;
                for (const char *x = cond->choices; x; x = strchr(x, '|') ? strchr(x, '|') + 1 : NULL)
                    listed |= strcspn(x, "|") == n && !strncmp(x, v, n);
                if (!listed) fail_msg("%s %s: only_with '%s': %.*s is not a value of %s", op->name, op->params[k].name, w,
                                      (int)n, v, cond->name);
            }
        }
    }
    assert_true(declared >= 4); /* decode_step's role, budget, rank, hit */
    assert_int_equal(parse("decode_step method=minikv model=tiny ctx=100 budget=64"), KVB_EINVAL);
    assert_error_mentions("decode_step method=minikv: budget=64 out of range [2048, 2048]",
                          "method=minikv does not read budget (rocketkv, shadowkv, omnikv do)", "leave it at its default");
    assert_int_equal(parse("decode_step method=omnikv model=tiny ctx=1000 budget=64 hit=1"), KVB_EINVAL);
    assert_error_mentions("hit=1 out of range [0.6, 0.6]: method=omnikv does not read hit (shadowkv does)");
    assert_int_equal(parse("decode_step method=omnikv model=tiny ctx=1000 budget=64 role=filter"), KVB_OK);
    assert_int_equal(parse("decode_step method=shadowkv model=tiny ctx=1000 budget=64 rank=32 hit=0.5"), KVB_OK);
    assert_int_equal(parse("decode_step method=dense model=tiny ctx=100 budget=2048 hit=0.6 role=sparse"), KVB_OK);
}

/* Every kernel's declared keys agree with themselves: each default inside its range, an int key's
 * choices inside its range and its default one of them, so that a line of defaults always parses; and
 * each listed value is accepted with the other keys at their defaults (a list is what the kernel takes). */
static void test_declared_defaults_are_allowed(void **state)
{
    (void)state;
    for (int i = 0; i < kvb_op_count(); i++) {
        const kvb_op *op = kvb_op_at(i);
        for (int k = 0; k < op->n_params; k++) {
            const kvb_param *p = &op->params[k];
            if (p->type == KVB_P_ENUM) continue;
            if (p->def < p->lo || p->def > p->hi) fail_msg("%s %s: default %g outside [%g, %g]", op->name, p->name, p->def, p->lo, p->hi);
            if (p->type != KVB_P_INT || !p->choices) continue;
            int def_listed = 0;
            for (const char *v = p->choices; v; v = strchr(v, '|') ? strchr(v, '|') + 1 : NULL) {
                const double x = strtod(v, NULL);
                if (x < p->lo || x > p->hi) fail_msg("%s %s: choice %g outside [%g, %g]", op->name, p->name, x, p->lo, p->hi);
                def_listed |= x == p->def;
                char line[160];
                snprintf(line, sizeof line, "%s %s=%.0f", op->name, p->name, x);
                if (parse(line) != KVB_OK) fail_msg("%s: refused: %s", line, kvb_last_error());
            }
            if (!def_listed) fail_msg("%s %s: default %g is not one of %s", op->name, p->name, p->def, p->choices);
        }
    }
}

/* Sizes out of range: M above 4096, a chunk not a multiple of 16 bytes, chunk ids outside the host
 * range, a negative size. */
static void test_out_of_range_sizes(void **state)
{
    (void)state;
    assert_int_equal(parse("gather_copy M=4097"), KVB_EINVAL);
    assert_error_mentions("M=4097 out of range [1, 4096]");
    assert_int_equal(parse("index_scan M=5000"), KVB_EINVAL);
    assert_error_mentions("M=5000 out of range [1, 4096]");
    assert_int_equal(parse("gather_copy c=1 D=4"), KVB_EINVAL); /* 8-byte chunks */
    assert_error_mentions("chunk bytes c*D*2 = 1*4*2 = 8", "multiple of 16");
    assert_int_equal(parse("gather_copy_all c=3 D=40"), KVB_OK); /* 240-byte chunks are fine */
    assert_int_equal(parse("gather_copy_all c=8 D=1 sparse_start=1"), KVB_EINVAL); /* slots not 16-byte aligned */
    assert_error_mentions("sparse_start*D*2 = 2", "multiples of 16");
    assert_int_equal(parse("gather_copy B=-1"), KVB_EINVAL);
    assert_error_mentions("B=-1 out of range [1, 1024]");
    assert_int_equal(parse("packed_load k=-5"), KVB_EINVAL);
    assert_error_mentions("k=-5 out of range");
    assert_int_equal(parse("gather_copy ctx=1000 M=256 c=8"), KVB_EINVAL); /* 125 host chunks */
    assert_error_mentions("M=256 out of range [1, ctx/c = 125]", "host range");
    assert_int_equal(parse("gather_copy ctx=2048 M=256 hit=0"), KVB_EINVAL); /* 256 old + 256 new > 256 */
    assert_error_mentions("ctx/c = 256", "need >= 512");
    assert_int_equal(parse("gather_copy ctx=8192 host_stride=100"), KVB_EINVAL);
    assert_error_mentions("host_stride=100 out of range [host_chunks = 1024");
    assert_int_equal(parse("packed_load T=100 k=200"), KVB_EINVAL);
    assert_error_mentions("k=200 out of range [1, 100]");
}

/* Integers past 64 bits, with or without a suffix, are refused by name with the key's range (never a
 * wrapped value: 17592186044417M = 2^64 + 2^20 wraps to exactly L's maximum, 1048576). */
static void test_integer_overflow(void **state)
{
    (void)state;
    /* with a suffix: digits that fit, a product that does not */
    assert_int_equal(parse("selective_attn L=17592186044417M"), KVB_EINVAL);
    assert_error_mentions("L=17592186044417M out of range [1, 1048576]", "64-bit");
    assert_int_equal(parse("selective_attn L=18014398509481985K"), KVB_EINVAL); /* 2^54 + 1 times 2^10 */
    assert_error_mentions("L=18014398509481985K out of range [1, 1048576]");
    assert_int_equal(parse("gather_copy ctx=-17592186044416M"), KVB_EINVAL); /* -2^64: wraps to 0 */
    assert_error_mentions("ctx=-17592186044416M out of range");
    /* without a suffix: digits past int64 */
    assert_int_equal(parse("gather_copy B=99999999999999999999"), KVB_EINVAL);
    assert_error_mentions("B=99999999999999999999 out of range [1, 1024]");
    assert_int_equal(parse("gather_copy B=18446744073709551617"), KVB_EINVAL); /* 2^64 + 1 */
    assert_error_mentions("B=18446744073709551617 out of range [1, 1024]");
    /* INT64 edges: the largest and smallest int64 are integers, past the key's range; one past them overflows */
    assert_int_equal(parse("decode_attn seed=9223372036854775807"), KVB_EINVAL);
    assert_error_mentions("seed=9223372036854775807 out of range [0, 1000000000000000]");
    assert_int_equal(parse("decode_attn seed=9223372036854775808"), KVB_EINVAL);
    assert_error_mentions("seed=9223372036854775808 out of range [0, 1000000000000000]", "64-bit");
    assert_int_equal(parse("decode_attn seed=-9223372036854775808"), KVB_EINVAL);
    assert_error_mentions("seed=-9223372036854775808 out of range [0, 1000000000000000]");
    assert_int_equal(parse("decode_attn seed=-9223372036854775809"), KVB_EINVAL);
    assert_error_mentions("seed=-9223372036854775809 out of range", "64-bit");
    assert_int_equal(parse("decode_attn seed=8796093022207M"), KVB_EINVAL); /* 2^63 - 2^20: fits, past the max */
    assert_error_mentions("seed=8796093022207M (= 9223372036853727232) out of range [0, 1000000000000000]");
    assert_int_equal(parse("decode_attn seed=8796093022208M"), KVB_EINVAL); /* 2^63: one past */
    assert_error_mentions("seed=8796093022208M out of range", "64-bit");
    assert_int_equal(parse("decode_attn seed=1000000000000000"), KVB_OK); /* the declared maximum itself */
    assert_true(kvb_case_get(&c, "seed") == 1e15);
    assert_int_equal(parse("decode_attn L=1M"), KVB_OK); /* L's maximum with a suffix */
    assert_int_equal(kvb_case_int(&c, "L"), 1048576);
    assert_int_equal(parse("decode_attn L=1025K"), KVB_EINVAL); /* just past it */
    assert_error_mentions("L=1025K (= 1049600) out of range [1, 1048576]");
    /* negative where the key does not allow it, with and without a suffix */
    assert_int_equal(parse("selective_attn L=-1K"), KVB_EINVAL);
    assert_error_mentions("L=-1K (= -1024) out of range [1, 1048576]");
    assert_int_equal(parse("decode_attn seed=-1"), KVB_EINVAL);
    assert_error_mentions("seed=-1 out of range [0, 1000000000000000]");
    /* a suffix alone or doubled is not an integer */
    assert_int_equal(parse("decode_attn L=K"), KVB_EINVAL);
    assert_error_mentions("L=K is not an integer");
    assert_int_equal(parse("decode_attn L=1KK"), KVB_EINVAL);
    assert_error_mentions("L=1KK is not an integer");
}

static void test_case_files(void **state)
{
    (void)state;
    mkdir("build", 0755);
    mkdir("build", 0755); /* there already in a source tree; not in a bundle's root */
    mkdir("build/test_cases", 0755);
    remove("build/test_cases/a.cases"); /* leftovers of an interrupted run */
    remove("build/test_cases/b.cases");
    FILE *f = fopen("build/test_cases/a.cases", "w");
    fprintf(f, "# comment\n\nindex_scan M=7 tier=smoke\ngather_copy_all B=2 tier=check\n");
    fclose(f);
    kvb_case_list list = {0};
    assert_int_equal(kvb_cases_load(&list, "build/test_cases"), KVB_OK);
    assert_int_equal(list.n, 2);
    assert_string_equal(list.v[0].where, "build/test_cases/a.cases:3");
    kvb_cases_free(&list);
    f = fopen("build/test_cases/b.cases", "w");
    fprintf(f, "index_scan M=7 tier=smoke\ngather_copy M=0 tier=check\n");
    fclose(f);
    assert_int_equal(kvb_cases_load(&list, "build/test_cases"), KVB_EINVAL); /* a duplicate, then a bad line */
    assert_error_mentions("build/test_cases/b.cases:1", "duplicate case", "a.cases:3");
    kvb_cases_free(&list);
    f = fopen("build/test_cases/b.cases", "w");
    fprintf(f, "gather_copy M=0 tier=check\n");
    fclose(f);
    assert_int_equal(kvb_cases_load(&list, "build/test_cases"), KVB_EINVAL);
    assert_error_mentions("build/test_cases/b.cases:1", "M=0 out of range");
    kvb_cases_free(&list);
    remove("build/test_cases/a.cases");
    remove("build/test_cases/b.cases");
}

static void test_case_text_and_long_lines(void **state)
{
    (void)state;
    kvb_case_list list = {0};
    assert_int_equal(kvb_cases_parse_text(&list, "# c\r\nindex_scan M=7\r\n\ntopk k=1 # x\n", "t"), KVB_OK);
    assert_int_equal(list.n, 2);
    assert_string_equal(list.v[1].where, "t:4");
    kvb_cases_free(&list);
    /* a line past the parser's buffer is refused whole, never cut into another value or line */
    char line[5000];
    snprintf(line, sizeof line, "topk k=1%*s n=100", 4100, "");
    assert_int_equal(parse(line), KVB_EINVAL);
    assert_error_mentions("case line of 4114 characters out of range [0, 4095]");
    memset(line, '#', sizeof line - 1); /* a long comment is still a comment */
    line[sizeof line - 1] = '\0';
    assert_int_equal(parse(line), KVB_CASE_BLANK);
    mkdir("build", 0755);
    FILE *f = fopen("build/test_long.cases", "w");
    fprintf(f, "topk k=1%*s n=100\n", 4100, "");
    fclose(f);
    assert_int_equal(kvb_cases_load(&list, "build/test_long.cases"), KVB_EINVAL);
    assert_error_mentions("build/test_long.cases:1: case line of 4114 characters");
    kvb_cases_free(&list);
    f = fopen("build/test_long.cases", "w");
    fprintf(f, "topk k=1\n%c\ntopk k=2\n", '\0');
    fclose(f);
    assert_int_equal(kvb_cases_load(&list, "build/test_long.cases"), KVB_EINVAL);
    assert_error_mentions("a NUL byte at offset 9");
    kvb_cases_free(&list);
    remove("build/test_long.cases");
}

/* Line ends: LF, CRLF and a lone CR (old Mac files) all end a line; none loses a line. */
static void test_line_ends(void **state)
{
    (void)state;
    kvb_case_list list = {0};
    assert_int_equal(kvb_cases_parse_text(&list, "topk k=1\rtopk k=2\r\rtopk k=3 # c\rtopk k=4", "cr"), KVB_OK);
    assert_int_equal(list.n, 4);
    assert_string_equal(list.v[2].where, "cr:4");
    assert_string_equal(list.v[3].where, "cr:5");
    kvb_cases_free(&list);
    assert_int_equal(kvb_cases_parse_text(&list, "topk k=1\r\ntopk k=2\r\n\r\ntopk k=3\n\rtopk k=4\r\n", "crlf"), KVB_OK);
    assert_int_equal(list.n, 4);
    assert_string_equal(list.v[2].where, "crlf:4");
    assert_string_equal(list.v[3].where, "crlf:6"); /* "\n\r": a line end, then an empty line */
    kvb_cases_free(&list);
    assert_int_equal(kvb_cases_parse_text(&list, "topk k=1\rtopk k=0", "cr"), KVB_EINVAL); /* the 2nd line is read */
    assert_error_mentions("cr:2", "k=0 out of range");
    kvb_cases_free(&list);
}

/* Case text that is not UTF-8 is refused, naming the line and the byte (it would reach JSON files). */
static void test_non_utf8_line_refused(void **state)
{
    (void)state;
    kvb_case_list list = {0};
    assert_int_equal(kvb_cases_parse_text(&list, "topk k=1\ntopk k=2 # caf\xe9\n", "latin1.cases"), KVB_EINVAL);
    assert_error_mentions("latin1.cases:2", "not valid UTF-8", "0xe9", "column 15");
    kvb_cases_free(&list);
    assert_int_equal(kvb_cases_parse_text(&list, "topk k=1 # caf\xc3\xa9\n", "utf8.cases"), KVB_OK);
    kvb_cases_free(&list);
}

/* Every kernel is named when one is unknown (the list is longer than the old 512-byte message). */
static void test_unknown_kernel_lists_every_kernel(void **state)
{
    (void)state;
    assert_int_equal(parse("zzzz B=1"), KVB_EINVAL);
    assert_error_mentions("unknown kernel 'zzzz'; kernels: ");
    for (int i = 0; i < kvb_op_count(); i++) {
        char name[80];
        snprintf(name, sizeof name, " %s%s", kvb_op_at(i)->name, i + 1 < kvb_op_count() ? "," : "");
        assert_error_mentions(name);
    }
}

/* A directory of more case files than the old fixed 256 is read whole. */
static void test_many_case_files(void **state)
{
    (void)state;
    mkdir("build", 0755);
    mkdir("build/test_many_cases", 0755);
    char name[128];
    for (int i = 0; i < 300; i++) {
        snprintf(name, sizeof name, "build/test_many_cases/f%03d.cases", i);
        FILE *f = fopen(name, "w");
        assert_non_null(f);
        fprintf(f, "topk rows=1 n=1000 k=%d tier=check\n", i + 1);
        fclose(f);
    }
    kvb_case_list list = {0};
    assert_int_equal(kvb_cases_load(&list, "build/test_many_cases"), KVB_OK);
    assert_int_equal(list.n, 300);
    assert_string_equal(list.v[299].where, "build/test_many_cases/f299.cases:1");
    kvb_cases_free(&list);
    for (int i = 0; i < 300; i++) {
        snprintf(name, sizeof name, "build/test_many_cases/f%03d.cases", i);
        remove(name);
    }
    rmdir("build/test_many_cases");
}

/* A case file may be a pipe; a directory given as a file is read as a directory of case files. */
static void test_case_file_from_a_pipe(void **state)
{
    (void)state;
    int fd[2];
    assert_int_equal(pipe(fd), 0);
    const char text[] = "topk k=1 tier=check\ntopk k=2 tier=check\n";
    assert_int_equal(write(fd[1], text, sizeof text - 1), (ssize_t)(sizeof text - 1));
    close(fd[1]);
    char name[64];
    snprintf(name, sizeof name, "/dev/fd/%d", fd[0]);
    kvb_case_list list = {0};
    assert_int_equal(kvb_cases_load(&list, name), KVB_OK);
    assert_int_equal(list.n, 2);
    kvb_cases_free(&list);
    close(fd[0]);
}

static void test_shipped_case_files_parse(void **state)
{
    (void)state;
    kvb_case_list list = {0};
    assert_int_equal(kvb_cases_load(&list, kvb_test_cases_dir()), KVB_OK);
    int tiers = 0;
    for (int i = 0; i < list.n; i++) tiers |= list.v[i].tier;
    assert_int_equal(tiers, KVB_TIER_ALL);
    for (int i = 0; i < list.n; i++) assert_true(list.v[i].tier != 0); /* every shipped case has a tier */
    kvb_cases_free(&list);
}

/* The sanitizer tier covers every kernel and every one of its impls (make sanitize runs the tier): a
 * kernel or impl added without a sanitize case fails here, naming it. */
static void test_sanitize_tier_covers_every_kernel_and_impl(void **state)
{
    (void)state;
    kvb_case_list list = {0};
    assert_int_equal(kvb_cases_load(&list, kvb_test_cases_dir()), KVB_OK);
    int missing = 0;
    for (int k = 0; k < kvb_op_count(); k++) {
        const kvb_op *op = kvb_op_at(k);
        const int n_impls = op->impls ? op->n_impls : 1;
        for (int j = 0; j < n_impls; j++) {
            const char *impl = op->impls ? op->impls[j].name : NULL;
            int found = 0;
            for (int i = 0; i < list.n && !found; i++) {
                const kvb_case *c = &list.v[i];
                if (c->tier != KVB_TIER_SANITIZE || c->op != op) continue;
                found = !impl || !strcmp(kvb_case_enum(c, "impl"), impl);
            }
            if (!found) {
                print_error("no tier=sanitize case for %s%s%s\n", op->name, impl ? " impl=" : "", impl ? impl : "");
                missing++;
            }
        }
    }
    kvb_cases_free(&list);
    assert_int_equal(missing, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_canonical_id_fills_defaults_in_fixed_order),
        cmocka_unit_test(test_values_and_suffixes),
        cmocka_unit_test(test_unknown_kernel),
        cmocka_unit_test(test_malformed_tokens),
        cmocka_unit_test(test_unknown_and_duplicate_keys),
        cmocka_unit_test(test_bad_values),
        cmocka_unit_test(test_int_choices),
        cmocka_unit_test(test_keys_read_only_with),
        cmocka_unit_test(test_declared_defaults_are_allowed),
        cmocka_unit_test(test_out_of_range_sizes),
        cmocka_unit_test(test_integer_overflow),
        cmocka_unit_test(test_case_files),
        cmocka_unit_test(test_case_text_and_long_lines),
        cmocka_unit_test(test_line_ends),
        cmocka_unit_test(test_non_utf8_line_refused),
        cmocka_unit_test(test_unknown_kernel_lists_every_kernel),
        cmocka_unit_test(test_many_case_files),
        cmocka_unit_test(test_case_file_from_a_pipe),
        cmocka_unit_test(test_shipped_case_files_parse),
        cmocka_unit_test(test_sanitize_tier_covers_every_kernel_and_impl),
    };
    return cmocka_run_group_tests_name("case parser", tests, NULL, NULL);
}
