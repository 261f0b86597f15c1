/* testlib.c: see testlib.h. */
#include "tests/testlib.h"

#include <stdio.h>
#include <stdlib.h>

#include "harness/core/cli.h"
#include "harness/core/op.h"
#include "reference/kvb.h"

void kvb_test_error_mentions(const char *file, int line, ...)
{
    va_list ap;
    va_start(ap, line);
    const char *msg = kvb_last_error(), *frag;
    while ((frag = va_arg(ap, const char *))) {
        if (!strstr(msg, frag)) {
            print_error("error message \"%s\" does not mention \"%s\"\n", msg, frag);
            va_end(ap);
            _fail(file, line);
        }
    }
    va_end(ap);
}

const char *kvb_test_cases_dir(void)
{
    const char *d = getenv("KVB_CASES");
    return d ? d : "cases";
}

static int g_rounds = 1;
static int g_cases_elsewhere; /* KVB_TEST_GPU_CASES=0: the round's `kvbench check --determinism` runs them */

static void run_gpu_case(void **state)
{
    const kvb_case *c = *state;
    if (!kvb_gpu_available() || g_cases_elsewhere) skip();
    kvb_run r;
    if (kvb_run_setup(&r, c, NULL) != KVB_OK) fail_msg("%s: setup: %s", c->id, kvb_last_error());
    /* a failure is reported after the teardown: cmocka's fail_msg jumps out, and a run left set up keeps
     * its device memory and host pool from every later case */
    char why[1024] = "";
    if (kvb_run_gpu_setup(&r) != KVB_OK) snprintf(why, sizeof why, "%s: GPU setup: %s", c->id, kvb_last_error());
    for (int round = 0; round < g_rounds && !why[0]; round++) {
        kvb_verdict v;
        if (kvb_run_validate(&r, &v) != KVB_OK) {
            snprintf(why, sizeof why, "%s: launch: %s", c->id, kvb_last_error());
            break;
        }
        for (int i = 0; i < v.n && !why[0]; i++)
            if (!v.res[i].pass)
                snprintf(why, sizeof why, "%s (round %d): %s has %lld bad elements (first at %lld: %g vs %g), rel L2 %g",
                         c->id, round, v.name[i], (long long)v.res[i].n_bad,
                         (long long)(v.res[i].n_first ? v.res[i].first[0].index : -1),
                         v.res[i].n_first ? v.res[i].first[0].out : 0.0, v.res[i].n_first ? v.res[i].first[0].ref : 0.0,
                         v.res[i].rel_l2);
    }
    kvb_run_teardown(&r);
    if (why[0]) fail_msg("%s", why);
}

int kvb_test_run_gpu_cases(const char *group, const struct CMUnitTest *fixed, int n_fixed,
                           const char *const *families, int rounds)
{
    kvb_case_list all = {0};
    if (kvb_cases_load(&all, kvb_test_cases_dir()) != KVB_OK) {
        fprintf(stderr, "%s\n", kvb_last_error());
        return 1;
    }
    g_rounds = rounds;
    const char *env = getenv("KVB_TEST_GPU_CASES");
    g_cases_elsewhere = env && !strcmp(env, "0");
    if (g_cases_elsewhere)
        printf("%s: KVB_TEST_GPU_CASES=0: the check-tier cases are skipped here (left to `kvbench check "
               "--determinism`)\n", group);
    struct CMUnitTest *tests = calloc((size_t)(all.n + n_fixed), sizeof *tests);
    int n = 0;
    for (int i = 0; i < n_fixed; i++) tests[n++] = fixed[i];
    for (int i = 0; i < all.n; i++) {
        const kvb_case *c = &all.v[i];
        int mine = 0;
        for (const char *const *f = families; *f && !mine; f++) mine = !strcmp(c->op->family, *f);
        if (c->tier != KVB_TIER_CHECK || !mine) continue;
        tests[n].name = c->id;
        tests[n].test_func = run_gpu_case;
        tests[n].initial_state = (void *)c;
        n++;
    }
    int rc = _cmocka_run_group_tests(group, tests, (size_t)n, NULL, NULL);
    free(tests);
    kvb_host_pool_release();
    kvb_cases_free(&all);
    return rc;
}

int kvb_test_parse_line(struct kvb_options *o, const char *line)
{
    static char buf[2048];
    static char *argv[64];
    snprintf(buf, sizeof buf, "kvbench|%s", line);
    int argc = 0;
    for (char *p = buf, *bar;; p = bar + 1) {
        argv[argc++] = p;
        if (!(bar = strchr(p, '|')) || argc == 64) break;
        *bar = '\0';
    }
    return kvb_parse_options(argc, argv, o);
}
