/* test_cli.c: what CI relies on around the cases: the options and case selection (empty filters, a
 * filter that selects nothing, a case given twice, where the cases are found, result files that are
 * also inputs), the files (read whole from a pipe, a directory refused, result files replaced only
 * when complete), the JSON reader's strictness and the writer's escaping, exact float formatting, and
 * the interrupt flag. No device needed. */
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness/core/cli.h"
#include "harness/core/json_read.h"
#include "tests/testlib.h"

static char dir[] = "/tmp/kvb_cli_XXXXXX";

static const char *path_in(const char *name)
{
    static char p[8][512];
    static int next;
    char *s = p[next++ % 8];
    snprintf(s, 512, "%s/%s", dir, name);
    return s;
}

static void write_text(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static char *read_text(const char *path)
{
    char *t;
    size_t n;
    assert_int_equal(kvb_read_file(path, &t, &n), KVB_OK);
    return t;
}

/* ---- options and selection ---- */

static void test_empty_filter_refused(void **state)
{
    (void)state;
    kvb_options o;
    assert_int_equal(kvb_test_parse_line(&o, "check|"), 2);
    assert_int_equal(kvb_test_parse_line(&o, "check|   "), 2);
    assert_int_equal(kvb_test_parse_line(&o, "check|\t"), 2);
    assert_int_equal(kvb_test_parse_line(&o, "check|--json|"), 2); /* an option's value may not be empty either */
    assert_int_equal(kvb_test_parse_line(&o, "bench|--benchmark_out=x.json"), 2); /* --json is the one way to write results */
    assert_int_equal(kvb_test_parse_line(&o, "check|topk"), 0);
    assert_int_equal(o.n_filters, 1);
}

/* a round's headline selection (about 70 case lines) fits; one filter past the limit is refused */
static void test_filter_count_limit(void **state)
{
    (void)state;
    static char name[] = "kvbench", cmd[] = "check", filter[] = "topk";
    static char *argv[KVB_MAX_FILTERS + 3];
    argv[0] = name, argv[1] = cmd;
    for (int i = 0; i <= KVB_MAX_FILTERS; i++) argv[2 + i] = filter;
    kvb_options o;
    assert_int_equal(kvb_parse_options(2 + KVB_MAX_FILTERS, argv, &o), 0);
    assert_int_equal(o.n_filters, KVB_MAX_FILTERS);
    assert_int_equal(kvb_parse_options(3 + KVB_MAX_FILTERS, argv, &o), 2);
}

static void test_filter_selecting_nothing_refused(void **state)
{
    (void)state;
    const char *cases = path_in("sel.cases");
    write_text(cases, "topk rows=1 n=8 k=2 tier=smoke\ntopk rows=2 n=8 k=2 tier=check\nindex_scan M=7 tier=check\n");
    kvb_options o;
    kvb_case_list l;
    assert_int_equal(kvb_test_parse_line(&o, "list|zzzz"), 0);
    o.cases_path = cases;
    assert_int_equal(kvb_select_cases(&o, KVB_TIER_ALL, &l), 2);
    assert_int_equal(l.n, 0);
    /* one filter of two selects nothing: refused too, never silently ignored */
    assert_int_equal(kvb_test_parse_line(&o, "list|topk|zzzz"), 0);
    o.cases_path = cases;
    assert_int_equal(kvb_select_cases(&o, KVB_TIER_ALL, &l), 2);
    /* a kernel whose cases are all of another tier */
    assert_int_equal(kvb_test_parse_line(&o, "check|index_scan|--tier|smoke"), 0);
    o.cases_path = cases;
    assert_int_equal(kvb_select_cases(&o, KVB_TIER_CHECK, &l), 2);
    assert_int_equal(kvb_test_parse_line(&o, "list|topk"), 0);
    o.cases_path = cases;
    assert_int_equal(kvb_select_cases(&o, KVB_TIER_ALL, &l), 0);
    assert_int_equal(l.n, 2);
    kvb_cases_free(&l);
}

static void test_case_given_twice_runs_once(void **state)
{
    (void)state;
    const char *cases = path_in("twice.cases");
    write_text(cases, "topk rows=1 n=8 k=2 tier=check\ntopk rows=2 n=8 k=2 tier=check\n");
    kvb_options o;
    kvb_case_list l;
    /* the same case line twice, in two spellings */
    assert_int_equal(kvb_test_parse_line(&o, "check|topk rows=1 n=8 k=2|topk  k=2 n=8 rows=1"), 0);
    o.cases_path = cases;
    assert_int_equal(kvb_select_cases(&o, KVB_TIER_CHECK, &l), 0);
    assert_int_equal(l.n, 1);
    kvb_cases_free(&l);
    /* a case line that is also a selected file case: kept once, as given on the command line */
    assert_int_equal(kvb_test_parse_line(&o, "check|topk rows=1 n=8 k=2 atol=0.5|topk"), 0);
    o.cases_path = cases;
    assert_int_equal(kvb_select_cases(&o, KVB_TIER_CHECK, &l), 0);
    assert_int_equal(l.n, 2);
    assert_string_equal(l.v[0].where, "command line");
    assert_true(l.v[0].atol == 0.5);
    assert_int_equal(kvb_cases_find(&l, l.v[1].id), 1);
    kvb_cases_free(&l);
}

static void test_cases_path(void **state)
{
    (void)state;
    kvb_options o;
    assert_int_equal(kvb_test_parse_line(&o, "list|--cases|/x/y.cases"), 0);
    assert_string_equal(kvb_cases_path(&o), "/x/y.cases");
    assert_int_equal(kvb_test_parse_line(&o, "list"), 0);
    const char *saved = getenv("KVB_CASES");
    char keep[1024] = "";
    if (saved) snprintf(keep, sizeof keep, "%s", saved);
    setenv("KVB_CASES", "/from/env", 1);
    assert_string_equal(kvb_cases_path(&o), "/from/env");
    unsetenv("KVB_CASES");
    /* this test program is in build/bin: the tree's cases/ (the shorter "cases" from the repository root) */
    const char *p = kvb_cases_path(&o);
    assert_non_null(p);
    struct stat st;
    assert_int_equal(stat(p, &st), 0);
    assert_true(S_ISDIR(st.st_mode));
    if (saved) setenv("KVB_CASES", keep, 1);
}

static void test_result_file_that_is_an_input_refused(void **state)
{
    (void)state;
    char cases[512], peers[512];
    snprintf(cases, sizeof cases, "%s", path_in("in.cases"));
    snprintf(peers, sizeof peers, "%s", path_in("peers.json"));
    write_text(cases, "topk rows=1 n=8 k=2 tier=check\n");
    write_text(peers, "{\"peers\": []}\n");
    mkdir(path_in("casedir"), 0755);
    write_text(path_in("casedir/a.cases"), "topk rows=1 n=8 k=2 tier=check\n");
    symlink(cases, path_in("link.json"));
    kvb_options o;
    char line[2048]; /* three paths of up to 512 bytes and the words between */
    snprintf(line, sizeof line, "check|--cases|%s|--json|%s", cases, cases);
    assert_int_equal(kvb_test_parse_line(&o, line), 0);
    assert_int_equal(kvb_check_paths(&o), 2);
    snprintf(line, sizeof line, "check|--cases|%s|--json|%s", cases, path_in("link.json")); /* through a link */
    assert_int_equal(kvb_test_parse_line(&o, line), 0);
    assert_int_equal(kvb_check_paths(&o), 2);
    snprintf(line, sizeof line, "check|--cases|%s|--json|%s/./a.cases", path_in("casedir"), path_in("casedir"));
    assert_int_equal(kvb_test_parse_line(&o, line), 0);
    assert_int_equal(kvb_check_paths(&o), 2);
    snprintf(line, sizeof line, "bench|--cases|%s|--peers|%s|--summary|%s", cases, peers, peers);
    assert_int_equal(kvb_test_parse_line(&o, line), 0);
    assert_int_equal(kvb_check_paths(&o), 2);
    snprintf(line, sizeof line, "bench|--cases|%s|--json|%s|--summary|%s", cases, path_in("r.json"), path_in("r.json"));
    assert_int_equal(kvb_test_parse_line(&o, line), 0);
    assert_int_equal(kvb_check_paths(&o), 2);
    snprintf(line, sizeof line, "bench|--cases|%s|--json|%s|--summary|%s", cases, path_in("r.json"), path_in("r.md"));
    assert_int_equal(kvb_test_parse_line(&o, line), 0);
    assert_int_equal(kvb_check_paths(&o), 0);
    char *text = read_text(cases);
    assert_string_equal(text, "topk rows=1 n=8 k=2 tier=check\n"); /* untouched */
    free(text);
}

/* ---- files ---- */

static void test_read_file_kinds(void **state)
{
    (void)state;
    char *t;
    size_t n;
    assert_int_equal(kvb_read_file(dir, &t, &n), KVB_EINVAL); /* a directory: refused by name, no crash */
    assert_error_mentions(dir, "is a directory");
    assert_int_equal(kvb_read_file(path_in("absent"), &t, &n), KVB_EIO);
    assert_error_mentions("absent", "cannot read");
    /* a pipe: no size known in advance, read in chunks to its end */
    int fd[2];
    assert_int_equal(pipe(fd), 0);
    pid_t pid = fork();
    if (pid == 0) {
        close(fd[0]);
        char chunk[1000];
        memset(chunk, 'a', sizeof chunk);
        for (int i = 0; i < 300; i++)
            if (write(fd[1], chunk, sizeof chunk) != (ssize_t)sizeof chunk) _exit(1);
        _exit(0);
    }
    close(fd[1]);
    char name[64];
    snprintf(name, sizeof name, "/dev/fd/%d", fd[0]);
    assert_int_equal(kvb_read_file(name, &t, &n), KVB_OK);
    assert_int_equal(n, 300000);
    assert_int_equal(t[n - 1], 'a');
    free(t);
    close(fd[0]);
    waitpid(pid, NULL, 0);
}

static void test_outfile_replaces_only_when_complete(void **state)
{
    (void)state;
    const char *target = path_in("result.json");
    write_text(target, "old\n");
    chmod(target, 0640);
    kvb_outfile o;
    FILE *f = kvb_outfile_open(&o, target);
    assert_non_null(f);
    fputs("new, half written", f);
    fflush(f);
    char *text = read_text(target);
    assert_string_equal(text, "old\n"); /* a reader sees the old file until the commit */
    free(text);
    kvb_outfile_discard(&o);
    text = read_text(target);
    assert_string_equal(text, "old\n"); /* discarded: untouched, no temporary left */
    free(text);
    assert_non_null(f = kvb_outfile_open(&o, target));
    fputs("new\n", f);
    assert_int_equal(kvb_outfile_commit(&o), KVB_OK);
    text = read_text(target);
    assert_string_equal(text, "new\n");
    free(text);
    struct stat st;
    assert_int_equal(stat(target, &st), 0);
    assert_int_equal(st.st_mode & 0777, 0640); /* its permissions kept */
    /* a directory is refused; a missing directory too */
    assert_null(kvb_outfile_open(&o, dir));
    assert_error_mentions("is a directory");
    assert_null(kvb_outfile_open(&o, path_in("no/such/dir/x.json")));
    assert_error_mentions("cannot write");
    /* through a symbolic link: the link's target is replaced, the link stays */
    symlink(target, path_in("via.json"));
    assert_non_null(f = kvb_outfile_open(&o, path_in("via.json")));
    fputs("linked\n", f);
    assert_int_equal(kvb_outfile_commit(&o), KVB_OK);
    text = read_text(target);
    assert_string_equal(text, "linked\n");
    free(text);
    assert_int_equal(lstat(path_in("via.json"), &st), 0);
    assert_true(S_ISLNK(st.st_mode));
    /* nothing else left in the directory: no temporaries */
    char cmd[600];
    snprintf(cmd, sizeof cmd, "ls -A %s | grep -q '\\.tmp\\.'", dir);
    assert_int_not_equal(system(cmd), 0);
}

static void test_utf8(void **state)
{
    (void)state;
    assert_int_equal(kvb_utf8_invalid_at("abc", 3), 3);
    assert_int_equal(kvb_utf8_invalid_at("h\xc3\xa9", 3), 3);             /* é */
    assert_int_equal(kvb_utf8_invalid_at("\xf0\x9f\x98\x80", 4), 4);      /* an emoji, 4 bytes */
    assert_int_equal(kvb_utf8_invalid_at("ab\xff", 3), 2);                /* never valid */
    assert_int_equal(kvb_utf8_invalid_at("\xc0\xaf", 2), 0);              /* overlong '/' */
    assert_int_equal(kvb_utf8_invalid_at("\xed\xa0\x80", 3), 0);          /* a surrogate */
    assert_int_equal(kvb_utf8_invalid_at("x\xe2\x82", 3), 1);             /* cut short */
    assert_int_equal(kvb_utf8_invalid_at("\xf4\x90\x80\x80", 4), 0);      /* past U+10FFFF */
    char *argv[] = {"kvbench", "check", "topk\xff"};
    assert_int_equal(kvb_args_utf8(3, argv), 2);
    argv[2] = "topk k=1";
    assert_int_equal(kvb_args_utf8(3, argv), 0);
}

/* ---- JSON ---- */

static int reads(const char *text) { kvb_jval v; int rc = kvb_json_read_text(text, "t", &v); kvb_json_free(&v); return rc; }

static void test_json_reader_is_strict(void **state)
{
    (void)state;
    assert_int_equal(reads("{\"a\": [1, -0.5, 2e3, 0, -0, 1E-2, true, false, null, \"x\"]}"), KVB_OK);
    static const char *const bad[] = {
        "{\"a\": NaN}", "{\"a\": Infinity}", "{\"a\": -Infinity}", "{\"a\": 0x10}", "{\"a\": +1}", "{\"a\": 012}",
        "{\"a\": .5}", "{\"a\": 5.}", "{\"a\": 1e}", "{\"a\": 1e999}", "{\"a\": inf}", "{\"a\": nan}",
        "{\"a\": 1, \"a\": 2}", "{\"a\": \"\xff\"}", "{\"a\": \"\\ud800\"}", "{\"a\": \"\\u00\"}", "{\"a\": \"x\ty\"}",
        "{\"a\": 1} x", "[1, 2,]", "{\"a\" 1}", "", "   ", "{", "\"unterminated",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        if (reads(bad[i]) == KVB_OK) print_error("accepted: %s\n", bad[i]);
        assert_int_equal(reads(bad[i]), KVB_EINVAL);
    }
    assert_int_equal(reads("{\"a\": 0x10}"), KVB_EINVAL);
    assert_error_mentions("hexadecimal", "line 1, column 8");
    assert_int_equal(reads("{\"a\": NaN}"), KVB_EINVAL);
    assert_error_mentions("NaN and Infinity are not JSON");
    /* Google Benchmark's non-finite doubles, only when asked */
    kvb_jval v;
    assert_int_equal(kvb_json_read_text_flags("{\"a\": NaN, \"b\": -Infinity}", "t", &v, KVB_JSON_NONFINITE), KVB_OK);
    assert_true(isnan(kvb_jnum(&v, "a", 0)));
    assert_true(isinf(kvb_jnum(&v, "b", 0)) && kvb_jnum(&v, "b", 0) < 0);
    kvb_json_free(&v);
    /* \u escapes become UTF-8, a surrogate pair one code point */
    assert_int_equal(kvb_json_read_text("{\"s\": \"\\u00e9\\ud83d\\ude00\"}", "t", &v), KVB_OK);
    assert_string_equal(kvb_jstr(&v, "s"), "\xc3\xa9\xf0\x9f\x98\x80");
    kvb_json_free(&v);
}

static void test_json_writer_escapes(void **state)
{
    (void)state;
    const char *p = path_in("w.json");
    FILE *f = fopen(p, "w");
    kvb_json j;
    kvb_json_begin(&j, f);
    kvb_json_str(&j, "s", "quote \" backslash \\ bell \a nl \n del \x7f e \xc3\xa9 bad \xff end");
    kvb_json_num(&j, "x", 0.1);
    kvb_json_num(&j, "inf", INFINITY);
    kvb_json_end(&j);
    fclose(f);
    char *text = read_text(p);
    assert_non_null(strstr(text, "\\u0007"));
    assert_non_null(strstr(text, "\\u007f"));
    assert_non_null(strstr(text, "\\ufffd"));
    assert_non_null(strstr(text, "\"x\": 0.1,"));
    free(text);
    kvb_jval v;
    assert_int_equal(kvb_json_read_file(p, &v), KVB_OK); /* what the writer writes, the strict reader reads */
    assert_string_equal(kvb_jstr(&v, "s"), "quote \" backslash \\ bell \a nl \n del \x7f e \xc3\xa9 bad \xef\xbf\xbd end");
    assert_int_equal(kvb_jget(&v, "inf")->type, KVB_J_NULL);
    kvb_json_free(&v);
}

static void test_shortest_exact_floats(void **state)
{
    (void)state;
    char buf[32];
    static const double values[] = {0.6, 0.1, 0.30000000000000004, 1e-5, 1.0 / 3, 123456789.123456789, 5e-324,
                                    1.7976931348623157e308, 0.25, 100, 1e21};
    for (size_t i = 0; i < sizeof values / sizeof *values; i++) {
        kvb_format_double(buf, sizeof buf, values[i]);
        assert_true(strtod(buf, NULL) == values[i]);
    }
    kvb_format_double(buf, sizeof buf, 0.6);
    assert_string_equal(buf, "0.6");
    kvb_format_double(buf, sizeof buf, 0.30000000000000004);
    assert_string_equal(buf, "0.30000000000000004");
    kvb_format_double(buf, sizeof buf, 100);
    assert_string_equal(buf, "100");
    /* two values that %.10g printed alike have two ids */
    kvb_case a, b;
    assert_int_equal(kvb_case_parse("gather_copy hit=0.6", "t", &a), KVB_OK);
    assert_int_equal(kvb_case_parse("gather_copy hit=0.60000000001", "t", &b), KVB_OK);
    assert_string_not_equal(a.id, b.id);
    assert_non_null(strstr(b.id, " hit=0.60000000001 "));
    kvb_case again;
    assert_int_equal(kvb_case_parse(b.id, "t", &again), KVB_OK); /* the id is the case */
    assert_true(kvb_case_get(&again, "hit") == kvb_case_get(&b, "hit"));
    /* -0 is 0: one id */
    assert_int_equal(kvb_case_parse("gather_copy hit=-0", "t", &b), KVB_OK);
    assert_int_equal(kvb_case_parse("gather_copy hit=0", "t", &a), KVB_OK);
    assert_string_equal(a.id, b.id);
}

static void test_interrupt_flag(void **state)
{
    (void)state;
    assert_int_equal(kvb_interrupted(), 0);
    assert_int_equal(kvb_interrupt_exit_code(), 0);
    kvb_interrupt_install();
    raise(SIGTERM); /* caught: the flag is set, the process goes on */
    assert_int_equal(kvb_interrupted(), SIGTERM);
    assert_int_equal(kvb_interrupt_exit_code(), 143);
    kvb_interrupt_raise(SIGINT);
    assert_int_equal(kvb_interrupt_exit_code(), 130);
    kvb_interrupt_raise(0);
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
}

int main(void)
{
    if (!mkdtemp(dir)) return 1;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_empty_filter_refused),
        cmocka_unit_test(test_filter_count_limit),
        cmocka_unit_test(test_filter_selecting_nothing_refused),
        cmocka_unit_test(test_case_given_twice_runs_once),
        cmocka_unit_test(test_cases_path),
        cmocka_unit_test(test_result_file_that_is_an_input_refused),
        cmocka_unit_test(test_read_file_kinds),
        cmocka_unit_test(test_outfile_replaces_only_when_complete),
        cmocka_unit_test(test_utf8),
        cmocka_unit_test(test_json_reader_is_strict),
        cmocka_unit_test(test_json_writer_escapes),
        cmocka_unit_test(test_shortest_exact_floats),
        cmocka_unit_test(test_interrupt_flag),
    };
    int rc = cmocka_run_group_tests_name("cli, files, json", tests, NULL, NULL);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) rc = rc ? rc : 1;
    return rc;
}
