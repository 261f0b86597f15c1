/* main.c: the kvbench driver.
 *
 *   kvbench list     [FILTER...]                 case ids (all tiers unless --tier)
 *   kvbench check    [FILTER...] [--json F] [--dump DIR]   CUDA vs reference, exit 1 on a failure
 *   kvbench bench    [FILTER...] [--json F] [--summary F] [--benchmark_*...]   Google Benchmark
 *   kvbench ceilings [--json F]                  this device's copy bandwidths and matrix rate
 *   kvbench profile  CASE                        validate, warm up, then exactly one profiled launch
 *   kvbench compare  BASE.json NEW.json [--threshold PCT]   regressions between two bench runs
 *
 * FILTER is a case line (`kernel key=value ...`, run as given) or a substring of case ids.
 * Common options: --tier smoke|check|bench|all, --cases PATH (default: cases/ beside the binary's
 * repository or ./cases).
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ceilings.h"
#include "compare.h"
#include "gbench_shim.h"
#include "json.h"
#include "op.h"
#include "timing.h"

#if KVB_HAVE_CUDA
#include <cuda_profiler_api.h>
#endif

#ifndef KVB_GIT_REV
#define KVB_GIT_REV "unknown"
#endif

int kvb_compare_main(int argc, char **argv); /* compare_results.c */

/* ---- options ---- */

typedef struct options {
    const char *cmd;
    const char *cases_path;
    int tier; /* bitmask of kvb_tier; 0 = the command's default */
    const char *json, *dump, *summary;
    const char *filters[64];
    int n_filters;
    char *gb_argv[64];
    int gb_argc;
    char cmdline[2048];
} options;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvbench <command> [FILTER...] [options]\n"
            "  list     [FILTER...]                      list case ids\n"
            "  check    [FILTER...] [--json F] [--dump DIR]\n"
            "                                            run CUDA and the C reference, compare; exit 1 on a failure\n"
            "  bench    [FILTER...] [--json F] [--summary F] [--benchmark_<flag>=...]\n"
            "                                            validate, then time through Google Benchmark\n"
            "  ceilings [--json F]                       measure copy bandwidths and the bf16 matrix rate\n"
            "  profile  CASE                             one launch of CASE between cudaProfilerStart/Stop\n"
            "  compare  BASE.json NEW.json [--threshold PCT]\n"
            "                                            per case faster/slower beyond noise; exit 1 on a regression\n"
            "FILTER: a case line in quotes (\"gather_copy B=8 hit=0.6\") or a substring of case ids\n"
            "options: --tier smoke|check|bench|all   --cases FILE_OR_DIR (default ./cases)\n");
}

static int parse_options(int argc, char **argv, options *o)
{
    memset(o, 0, sizeof *o);
    o->cases_path = "cases";
    o->gb_argv[o->gb_argc++] = argv[0];
    size_t len = 0;
    for (int i = 0; i < argc && len < sizeof o->cmdline; i++)
        len += (size_t)snprintf(o->cmdline + len, sizeof o->cmdline - len, i ? " '%s'" : "%s", argv[i]);
    if (argc < 2) return -1;
    o->cmd = argv[1];
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        const char *next = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strncmp(a, "--benchmark_", 12)) {
            if (o->gb_argc < 63) o->gb_argv[o->gb_argc++] = argv[i];
        } else if (!strcmp(a, "--tier") && next) {
            i++;
            if (!strcmp(next, "all")) o->tier = KVB_TIER_SMOKE | KVB_TIER_CHECK | KVB_TIER_BENCH;
            else if (!(o->tier = kvb_tier_parse(next))) {
                fprintf(stderr, "kvbench: --tier %s is not one of smoke|check|bench|all\n", next);
                return 2;
            }
        } else if (!strcmp(a, "--cases") && next) o->cases_path = argv[++i];
        else if (!strcmp(a, "--json") && next) o->json = argv[++i];
        else if (!strcmp(a, "--dump") && next) o->dump = argv[++i];
        else if (!strcmp(a, "--summary") && next) o->summary = argv[++i];
        else if (a[0] == '-' && a[1] == '-') {
            fprintf(stderr, "kvbench: unknown option %s\n", a);
            return 2;
        } else if (o->n_filters < 64) o->filters[o->n_filters++] = a;
    }
    return 0;
}

/* ---- case selection: load every case file first, so a malformed line stops everything ---- */

/* A case line starts with a kernel name followed by key=value tokens ("gather_copy B=8"); anything
 * else ("impl=tma", "gather_copy", "B=8 Hkv") filters case ids by substring. A first word that is
 * not a kernel but is followed by key=value tokens is a mistyped case line, reported as such. */
static int is_case_line(const char *arg)
{
    char first[64];
    size_t n = strcspn(arg, " \t");
    if (n == 0 || n >= sizeof first || !arg[n]) return 0; /* one word: a filter */
    memcpy(first, arg, n);
    first[n] = '\0';
    return strchr(first, '=') == NULL; /* "kernel key=..." is a case line, even with a bad kernel */
}

static int select_cases(const options *o, int default_tier, kvb_case_list *out)
{
    kvb_case_list all = {0};
    memset(out, 0, sizeof *out);
    int tier = o->tier ? o->tier : default_tier;
    int from_files = 0;
    for (int i = 0; i < o->n_filters; i++) from_files |= !is_case_line(o->filters[i]);
    if (o->n_filters == 0 || from_files) {
        if (kvb_cases_load(&all, o->cases_path)) {
            fprintf(stderr, "kvbench: %s\n", kvb_last_error());
            return 2;
        }
    }
    for (int i = 0; i < o->n_filters; i++) { /* case lines given on the command line */
        if (!is_case_line(o->filters[i])) continue;
        kvb_case c;
        int rc = kvb_case_parse(o->filters[i], "command line", &c);
        if (rc != KVB_OK) {
            fprintf(stderr, "kvbench: %s\n", rc == KVB_CASE_BLANK ? "empty case line on the command line" : kvb_last_error());
            kvb_cases_free(&all);
            return 2;
        }
        kvb_cases_add(out, &c);
    }
    for (int i = 0; i < all.n; i++) {
        const kvb_case *c = &all.v[i];
        if (!(c->tier & tier)) continue;
        int match = o->n_filters == 0;
        for (int f = 0; f < o->n_filters && !match; f++)
            match = !is_case_line(o->filters[f]) && strstr(c->id, o->filters[f]) != NULL;
        if (match) kvb_cases_add(out, c);
    }
    kvb_cases_free(&all);
    return 0;
}

/* ---- context for results ---- */

static void write_context_json(kvb_json *j, const options *o, const kvb_ceilings *ceil)
{
    kvb_json_obj(j, "context");
    char date[64];
    time_t now = time(NULL);
    strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    kvb_json_str(j, "date", date);
    kvb_json_str(j, "git_revision", KVB_GIT_REV);
    kvb_json_str(j, "command_line", o->cmdline);
    kvb_device_info d;
    if (kvb_gpu_info(&d) == KVB_OK) {
        kvb_json_str(j, "gpu", d.name);
        kvb_json_int(j, "sm_count", d.sm_count);
        kvb_json_int(j, "l2_bytes", (long long)d.l2_bytes);
        kvb_json_int(j, "memory_bytes", (long long)d.mem_bytes);
        kvb_json_str(j, "driver", d.driver);
        kvb_json_int(j, "cuda_runtime", d.runtime_version);
        kvb_json_int(j, "cuda_driver_api", d.driver_version);
        kvb_json_str(j, "clocks", d.clocks);
    } else {
        kvb_json_str(j, "gpu", "none");
        kvb_json_str(j, "gpu_unavailable", kvb_gpu_unavailable_reason());
    }
    if (ceil) kvb_ceilings_json(ceil, j);
    kvb_json_close(j);
}

/* ---- validation of one run (check, and bench before and after timing) ---- */

static void unravel(const kvb_tensor *t, int64_t index, char *buf, size_t n)
{
    int64_t coord[KVB_MAX_DIMS];
    for (int d = t->ndim - 1; d >= 0; d--) {
        coord[d] = index % t->shape[d];
        index /= t->shape[d];
    }
    size_t len = (size_t)snprintf(buf, n, "[");
    for (int d = 0; d < t->ndim && len < n; d++) len += (size_t)snprintf(buf + len, n - len, d ? ",%lld" : "%lld", (long long)coord[d]);
    if (len < n) snprintf(buf + len, n - len, "]");
}

static void print_verdict(kvb_run *r, const kvb_verdict *v)
{
    for (int i = 0; i < v->n; i++) {
        const kvb_cmp_result *c = &v->res[i];
        static const char *kinds[] = KVB_CMP_KIND_NAMES;
        printf("      %-12s %-8s n=%-11lld bad=%-8lld nonfinite=%-5lld max_abs=%-10.3g tol=%6.1f%% relL2=%-10.3g %s\n",
               v->name[i], kinds[c->kind], (long long)c->n_checked, (long long)c->n_bad, (long long)c->n_nonfinite,
               c->max_abs, 100.0 * c->tol_used, c->rel_l2, c->pass ? "ok" : "FAIL");
        const kvb_tensor *t = kvb_run_find(r, v->name[i]);
        for (int k = 0; k < c->n_first && k < 4; k++) {
            char at[96];
            unravel(t, c->first[k].index, at, sizeof at);
            printf("        mismatch %s%s: got %.9g, expected %.9g\n", v->name[i], at, c->first[k].out, c->first[k].ref);
        }
    }
}

static void verdict_json(kvb_json *j, kvb_run *r, const kvb_verdict *v)
{
    kvb_json_arr(j, "outputs");
    for (int i = 0; i < v->n; i++) {
        const kvb_cmp_result *c = &v->res[i];
        static const char *kinds[] = KVB_CMP_KIND_NAMES;
        kvb_json_obj(j, NULL);
        kvb_json_str(j, "name", v->name[i]);
        kvb_json_str(j, "compare", kinds[c->kind]);
        kvb_json_int(j, "n_checked", c->n_checked);
        kvb_json_int(j, "n_bad", c->n_bad);
        kvb_json_int(j, "n_nonfinite", c->n_nonfinite);
        kvb_json_num(j, "max_abs", c->max_abs);
        kvb_json_num(j, "tol_used_pct", 100.0 * c->tol_used);
        kvb_json_num(j, "rel_l2", c->rel_l2);
        kvb_json_bool(j, "pass", c->pass);
        kvb_json_arr(j, "first_mismatches");
        const kvb_tensor *t = kvb_run_find(r, v->name[i]);
        for (int k = 0; k < c->n_first; k++) {
            char at[96];
            unravel(t, c->first[k].index, at, sizeof at);
            kvb_json_obj(j, NULL);
            kvb_json_str(j, "at", at);
            kvb_json_num(j, "out", c->first[k].out);
            kvb_json_num(j, "ref", c->first[k].ref);
            kvb_json_close(j);
        }
        kvb_json_close(j);
        kvb_json_close(j);
    }
    kvb_json_close(j);
}

/* ---- --dump ---- */

static void dump_run(const char *dir, kvb_run *r)
{
    char sub[1024], path[1200];
    size_t len = (size_t)snprintf(sub, sizeof sub, "%s/", dir);
    for (const char *p = r->c->id; *p && len + 1 < sizeof sub; p++) sub[len++] = *p == ' ' ? '_' : *p;
    sub[len] = '\0';
    mkdir(dir, 0755);
    if (mkdir(sub, 0755) != 0 && errno != EEXIST) {
        fprintf(stderr, "kvbench: cannot create %s\n", sub);
        return;
    }
    for (int i = 0; i < r->nt; i++) {
        kvb_tensor *t = &r->t[i];
        if (t->flags & KVB_T_NO_DUMP || t->role == KVB_SCRATCH) continue;
        if (t->h) {
            snprintf(path, sizeof path, "%s/%s.npy", sub, t->name);
            kvb_npy_write(path, t->dtype, t->ndim, t->shape, t->h);
        }
        if (t->ref) {
            snprintf(path, sizeof path, "%s/%s.ref.npy", sub, t->name);
            kvb_npy_write(path, t->dtype, t->ndim, t->shape, t->ref);
        }
        if (t->out) {
            snprintf(path, sizeof path, "%s/%s.out.npy", sub, t->name);
            kvb_npy_write(path, t->dtype, t->ndim, t->shape, t->out);
        }
    }
    printf("      dumped to %s/\n", sub);
}

/* ---- host pool: allocate the largest need once ---- */

static void reserve_host_pool(const kvb_case_list *cases)
{
    size_t most = 0;
    for (int i = 0; i < cases->n; i++)
        if (cases->v[i].op->host_pool_bytes) {
            size_t b = cases->v[i].op->host_pool_bytes(&cases->v[i]);
            if (b > most) most = b;
        }
    if (most) {
        size_t valid;
        kvb_host_pool(most, "", 0, &valid);
    }
}

/* ---- check ---- */

static int cmd_check(const options *o)
{
    kvb_case_list cases;
    int rc = select_cases(o, KVB_TIER_CHECK, &cases);
    if (rc) return rc;
    if (cases.n == 0) {
        fprintf(stderr, "kvbench: no case matches\n");
        return 2;
    }
    int gpu = kvb_gpu_available();
    FILE *jf = NULL;
    kvb_json j;
    if (o->json) {
        if (!(jf = fopen(o->json, "w"))) {
            fprintf(stderr, "kvbench: cannot write %s\n", o->json);
            return 2;
        }
        kvb_json_begin(&j, jf);
        write_context_json(&j, o, NULL);
        kvb_json_arr(&j, "cases");
    }
    reserve_host_pool(&cases);
    int passed = 0, failed = 0, skipped = 0;
    for (int i = 0; i < cases.n; i++) {
        const kvb_case *c = &cases.v[i];
        kvb_run r;
        kvb_verdict v = {0};
        const char *status = "PASS", *why = "";
        char msg[600] = "";
        kvb_nvtx_push(c->id);
        if (kvb_run_setup(&r, c, NULL) != KVB_OK) {
            status = "FAIL", why = "setup or reference failed";
            snprintf(msg, sizeof msg, "%s", kvb_last_error());
        } else if (r.op->ref_check && r.op->ref_check(&r) != KVB_OK) {
            status = "FAIL", why = "reference invariant violated";
            snprintf(msg, sizeof msg, "%s", kvb_last_error());
        } else if (!gpu) {
            status = "SKIP", why = "no CUDA device: reference computed, GPU run skipped";
        } else {
            kvb_run_gpu_setup(&r);
            if (kvb_run_validate(&r, &v) != KVB_OK) {
                status = "FAIL", why = "launch rejected";
                snprintf(msg, sizeof msg, "%s", kvb_last_error());
            } else if (!v.pass) {
                status = "FAIL", why = "output differs from the reference";
            }
        }
        kvb_nvtx_pop();
        printf("%-4s  %s\n", status, c->id);
        if (*why && strcmp(status, "PASS")) printf("      %s%s%s\n", why, *msg ? ": " : "", msg);
        if (r.note[0]) printf("      note: %s\n", r.note);
        print_verdict(&r, &v);
        if (!strcmp(status, "FAIL")) printf("      reproduce: kvbench check \"%s\"\n", c->id);
        if (o->dump && r.op) dump_run(o->dump, &r);
        if (jf) {
            kvb_json_obj(&j, NULL);
            kvb_json_str(&j, "id", c->id);
            kvb_json_str(&j, "where", c->where);
            kvb_json_str(&j, "tier", kvb_tier_name(c->tier));
            kvb_json_str(&j, "status", status);
            kvb_json_str(&j, "reason", *msg ? msg : why);
            kvb_json_str(&j, "note", r.note);
            verdict_json(&j, &r, &v);
            kvb_json_close(&j);
        }
        if (!strcmp(status, "PASS")) passed++;
        else if (!strcmp(status, "SKIP")) skipped++;
        else failed++;
        kvb_run_teardown(&r);
        fflush(stdout);
    }
    if (jf) {
        kvb_json_close(&j);
        kvb_json_obj(&j, "summary");
        kvb_json_int(&j, "passed", passed);
        kvb_json_int(&j, "failed", failed);
        kvb_json_int(&j, "skipped", skipped);
        kvb_json_close(&j);
        kvb_json_end(&j);
        fclose(jf);
    }
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    kvb_host_pool_release();
    kvb_cases_free(&cases);
    return failed ? 1 : 0;
}

/* ---- bench ---- */

typedef struct bench_ctx {
    const kvb_case *c;
    const kvb_ceilings *ceil;
    kvb_run run;
    kvb_timed timed;
    kvb_cost cost;
    double ceiling_s; /* contiguous copy of the same bytes, this run */
    int live;
    /* the reported loop, for the summary */
    kvb_sample_stats st;
    int done, failed;
    char error[300];
} bench_ctx;

static void bench_reset(void *p)
{
    bench_ctx *b = p;
    kvb_run_reset(&b->run);
}

static void bench_work(void *p)
{
    bench_ctx *b = p;
    if (kvb_run_launch(&b->run) != KVB_OK) {
        fprintf(stderr, "kvbench: launch failed during timing: %s\n", kvb_last_error());
        exit(3);
    }
}

static int bench_fail(bench_ctx *b, const char *what)
{
    snprintf(b->error, sizeof b->error, "%s", what);
    b->failed = 1;
    return kvb_fail(KVB_EINVAL, "%s", what);
}

static int bench_prepare(void *p)
{
    bench_ctx *b = p;
    kvb_nvtx_push(b->c->id);
    if (kvb_run_setup(&b->run, b->c, b->ceil)) {
        char m[300];
        snprintf(m, sizeof m, "setup failed: %s", kvb_last_error());
        return bench_fail(b, m);
    }
    b->live = 1;
    if (b->run.op->ref_check && b->run.op->ref_check(&b->run)) return bench_fail(b, "reference invariant violated");
    kvb_run_gpu_setup(&b->run);
    kvb_verdict v;
    if (kvb_run_validate(&b->run, &v) || !v.pass) {
        print_verdict(&b->run, &v);
        return bench_fail(b, "validation before timing failed");
    }
    b->timed = (kvb_timed){bench_reset, bench_work, b, b->run.stream, kvb_run_wall_timed(&b->run)};
    for (int i = 0; i < 3; i++) kvb_time_once(&b->timed); /* warm-up */
    memset(&b->cost, 0, sizeof b->cost);
    b->run.op->cost(&b->run, &b->cost);
    b->ceiling_s = 0;
    if (b->cost.ceiling == KVB_CEIL_H2D && b->cost.bytes_h2d > 0)
        b->ceiling_s = kvb_h2d_contiguous_seconds((size_t)b->cost.bytes_h2d);
    else if (b->cost.ceiling == KVB_CEIL_D2D && b->cost.bytes_dev >= 32)
        b->ceiling_s = kvb_d2d_contiguous_seconds((size_t)(b->cost.bytes_dev / 2) & ~(size_t)15);
    else if (b->cost.ceiling == KVB_CEIL_MMA && b->cost.flops > 0 && b->ceil->bf16_mma_TFLOPs > 0)
        b->ceiling_s = b->cost.flops / (b->ceil->bf16_mma_TFLOPs * 1e12); /* at the measured matrix rate */
    return 0;
}

static double bench_iterate(void *p) { return kvb_time_once(&((bench_ctx *)p)->timed); }

static void add_counter(kvb_counter *out, int *n, const char *name, double v)
{
    if (*n >= KVB_MAX_COUNTERS || !isfinite(v)) return;
    snprintf(out[*n].name, sizeof out[*n].name, "%s", name);
    out[*n].value = v;
    (*n)++;
}

static int bench_finish(void *p, const double *samples, int n, kvb_counter *out, int *n_out)
{
    bench_ctx *b = p;
    kvb_verdict v;
    if (kvb_run_validate(&b->run, &v) || !v.pass) {
        print_verdict(&b->run, &v);
        return bench_fail(b, "validation after timing failed");
    }
    kvb_stats(samples, n, &b->st);
    b->done = 1;
    double t = b->st.median;
    *n_out = 0;
    add_counter(out, n_out, "median_us", t * 1e6);
    add_counter(out, n_out, "min_us", b->st.min * 1e6);
    add_counter(out, n_out, "max_us", b->st.max * 1e6);
    add_counter(out, n_out, "noise_pct", 100.0 * b->st.noise);
    add_counter(out, n_out, "samples", n);
    if (b->cost.bytes_h2d > 0) add_counter(out, n_out, "h2d_GBps", b->cost.bytes_h2d / t * 1e-9);
    if (b->cost.bytes_dev > 0) add_counter(out, n_out, "dev_GBps", b->cost.bytes_dev / t * 1e-9);
    if (b->cost.flops > 0) add_counter(out, n_out, "TFLOPs", b->cost.flops / t * 1e-12);
    if (b->ceiling_s > 0) {
        add_counter(out, n_out, "ceiling_us", b->ceiling_s * 1e6);
        add_counter(out, n_out, "pct_of_ceiling", 100.0 * b->ceiling_s / t);
    }
    if (b->cost.workspace_bytes > 0) add_counter(out, n_out, "workspace_bytes", b->cost.workspace_bytes);
    if (b->cost.goal_us > 0) {
        add_counter(out, n_out, "goal_us", b->cost.goal_us);
        add_counter(out, n_out, "time_over_goal", t * 1e6 / b->cost.goal_us);
    }
    return 0;
}

static void bench_release(void *p)
{
    bench_ctx *b = p;
    if (b->live) kvb_run_teardown(&b->run);
    b->live = 0;
    kvb_nvtx_pop();
}

/* id without its impl= key: cases that differ only in implementation compute the same thing */
static void shape_key(const char *id, char *out, size_t n)
{
    snprintf(out, n, "%s", id);
    char *p = strstr(out, " impl=");
    if (p) *p = '\0';
}

static void print_summary(FILE *f, bench_ctx *b, int n, const kvb_ceilings *ceil, const char *gpu)
{
    fprintf(f, "| case | median us | min..max us | noise | rate | %% of ceiling | vs baselines | goal |\n");
    fprintf(f, "|---|---:|---:|---:|---:|---:|---|---|\n");
    for (int i = 0; i < n; i++) {
        bench_ctx *x = &b[i];
        if (!x->done) {
            fprintf(f, "| `%s` | %s | | | | | | |\n", x->c->id, x->failed ? x->error : "not run");
            continue;
        }
        double t = x->st.median;
        double gbps = x->cost.bytes_h2d > 0 ? x->cost.bytes_h2d / t * 1e-9 : x->cost.bytes_dev / t * 1e-9;
        char rate[48], ceil_s[32] = "", vs[256] = "", goal[96] = "";
        if (x->cost.ceiling == KVB_CEIL_MMA) snprintf(rate, sizeof rate, "%.1f TFLOP/s", x->cost.flops / t * 1e-12);
        else snprintf(rate, sizeof rate, "%.1f GB/s", gbps);
        if (x->ceiling_s > 0) snprintf(ceil_s, sizeof ceil_s, "%.1f%%", 100.0 * x->ceiling_s / t);
        /* speedups over the baselines of the same shape, measured in this run */
        if (!strstr(x->c->id, " impl=") || strstr(x->c->id, " impl=kernel")) {
            char key[KVB_ID_MAX], other[KVB_ID_MAX];
            shape_key(x->c->id, key, sizeof key);
            size_t len = 0;
            for (int k = 0; k < n; k++) {
                if (k == i || !b[k].done) continue;
                shape_key(b[k].c->id, other, sizeof other);
                if (strcmp(key, other)) continue;
                const char *impl = strstr(b[k].c->id, " impl=") + 6;
                len += (size_t)snprintf(vs + len, sizeof vs - len, "%s%.1fx vs %s", len ? ", " : "", b[k].st.median / t, impl);
            }
        }
        if (x->cost.goal_us > 0)
            snprintf(goal, sizeof goal, "%.2fx of %.1f us (%s)", t * 1e6 / x->cost.goal_us, x->cost.goal_us,
                     x->cost.goal_text ? x->cost.goal_text : "goal");
        fprintf(f, "| `%s` | %.2f | %.2f..%.2f | %.1f%% | %s | %s | %s | %s |\n", x->c->id, t * 1e6, x->st.min * 1e6,
                x->st.max * 1e6, 100 * x->st.noise, rate, ceil_s, vs, goal);
    }
    if (ceil->measured)
        fprintf(f, "\n%s. Ceilings this run: H2D pinned memcpy %.1f GB/s, zero-copy kernel %.1f GB/s, D2D memcpy %.0f GB/s "
                   "(read+write), copy kernel %.0f GB/s, bf16 GEMM %.0f TFLOP/s, timing floor (empty kernel) %.2f us. %% of ceiling: the ceiling's time for "
                   "the same work over the case's median: one contiguous copy of the same bytes (H2D pinned for host "
                   "reads, D2D for device traffic), or the FLOPs at the measured bf16 GEMM rate.\n",
                gpu, ceil->h2d_memcpy_GBps, ceil->h2d_zero_copy_GBps, ceil->d2d_memcpy_GBps, ceil->d2d_kernel_GBps,
                ceil->bf16_mma_TFLOPs, ceil->launch_floor_us);
}

static int cmd_bench(const options *o)
{
    kvb_case_list cases;
    int rc = select_cases(o, KVB_TIER_BENCH, &cases);
    if (rc) return rc;
    if (cases.n == 0) {
        fprintf(stderr, "kvbench: no case matches\n");
        return 2;
    }
    if (!kvb_gpu_available()) {
        printf("kvbench bench: %s; nothing was timed (%d cases selected). `kvbench check --tier smoke` runs the "
               "CPU references.\n", kvb_gpu_unavailable_reason(), cases.n);
        kvb_cases_free(&cases);
        return 0;
    }
    static kvb_ceilings ceil;
    kvb_ceilings_measure(&ceil);
    kvb_ceilings_print(&ceil);
    kvb_device_info d;
    kvb_gpu_info(&d);
    char buf[256];
    kvb_gbench_context("kvbench_git_revision", KVB_GIT_REV);
    kvb_gbench_context("kvbench_command_line", o->cmdline);
    kvb_gbench_context("gpu", d.name);
    kvb_gbench_context("gpu_driver", d.driver);
    kvb_gbench_context("gpu_clocks", d.clocks);
    snprintf(buf, sizeof buf, "%d", d.runtime_version);
    kvb_gbench_context("cuda_runtime", buf);
    snprintf(buf, sizeof buf, "%.1f", ceil.h2d_memcpy_GBps);
    kvb_gbench_context("ceiling_h2d_memcpy_GBps", buf);
    snprintf(buf, sizeof buf, "%.1f", ceil.h2d_zero_copy_GBps);
    kvb_gbench_context("ceiling_h2d_zero_copy_GBps", buf);
    snprintf(buf, sizeof buf, "%.1f", ceil.d2d_memcpy_GBps);
    kvb_gbench_context("ceiling_d2d_memcpy_GBps", buf);
    snprintf(buf, sizeof buf, "%.1f", ceil.d2d_kernel_GBps);
    kvb_gbench_context("ceiling_d2d_kernel_GBps", buf);
    snprintf(buf, sizeof buf, "%.1f", ceil.bf16_mma_TFLOPs);
    kvb_gbench_context("ceiling_bf16_mma_TFLOPs", buf);
    snprintf(buf, sizeof buf, "%.2f", ceil.launch_floor_us);
    kvb_gbench_context("timing_floor_us", buf);

    reserve_host_pool(&cases);
    bench_ctx *b = calloc((size_t)cases.n, sizeof *b);
    for (int i = 0; i < cases.n; i++) {
        b[i].c = &cases.v[i];
        b[i].ceil = &ceil;
        kvb_bench gb = {cases.v[i].id, &b[i], bench_prepare, bench_iterate, bench_finish, bench_release};
        kvb_gbench_add(&gb);
    }
    /* Google Benchmark flags: JSON output as asked, and a shorter default minimum time */
    options gbo = *o;
    char out_flag[1100], fmt_flag[] = "--benchmark_out_format=json", min_flag[] = "--benchmark_min_time=0.2";
    int has_min = 0;
    for (int i = 1; i < gbo.gb_argc; i++) has_min |= !strncmp(gbo.gb_argv[i], "--benchmark_min_time", 20);
    if (!has_min) gbo.gb_argv[gbo.gb_argc++] = min_flag;
    if (o->json) {
        snprintf(out_flag, sizeof out_flag, "--benchmark_out=%s", o->json);
        gbo.gb_argv[gbo.gb_argc++] = out_flag;
        gbo.gb_argv[gbo.gb_argc++] = fmt_flag;
    }
    int errors = kvb_gbench_run(gbo.gb_argc, gbo.gb_argv);

    printf("\n");
    print_summary(stdout, b, cases.n, &ceil, d.name);
    if (o->summary) {
        FILE *f = fopen(o->summary, "w");
        if (f) {
            print_summary(f, b, cases.n, &ceil, d.name);
            fclose(f);
        }
    }
    int failed = 0;
    for (int i = 0; i < cases.n; i++) failed += b[i].failed;
    printf("%d benchmarked, %d failed validation or setup\n", cases.n - failed, failed);
    free(b);
    kvb_host_pool_release();
    kvb_cases_free(&cases);
    return errors || failed ? 1 : 0;
}

/* ---- ceilings, list, profile ---- */

static int cmd_ceilings(const options *o)
{
    if (!kvb_gpu_available()) {
        printf("kvbench ceilings: %s; nothing measured\n", kvb_gpu_unavailable_reason());
        return 0;
    }
    kvb_ceilings c;
    kvb_ceilings_measure(&c);
    kvb_ceilings_print(&c);
    if (o->json) {
        FILE *f = fopen(o->json, "w");
        if (!f) return 2;
        kvb_json j;
        kvb_json_begin(&j, f);
        write_context_json(&j, o, &c);
        kvb_json_end(&j);
        fclose(f);
    }
    return 0;
}

static int cmd_list(const options *o)
{
    kvb_case_list cases;
    int rc = select_cases(o, KVB_TIER_SMOKE | KVB_TIER_CHECK | KVB_TIER_BENCH, &cases);
    if (rc) return rc;
    for (int i = 0; i < cases.n; i++) printf("%-5s  %s\n", kvb_tier_name(cases.v[i].tier), cases.v[i].id);
    kvb_cases_free(&cases);
    return 0;
}

static int cmd_profile(const options *o)
{
    if (o->n_filters != 1 || !is_case_line(o->filters[0])) {
        fprintf(stderr, "kvbench profile: give exactly one case (its id, in quotes)\n");
        return 2;
    }
    kvb_case_list cases;
    int rc = select_cases(o, 0, &cases);
    if (rc) return rc;
    const kvb_case *c = &cases.v[0];
    if (!kvb_gpu_available()) {
        printf("kvbench profile: %s\n", kvb_gpu_unavailable_reason());
        kvb_cases_free(&cases);
        return 0;
    }
    kvb_run r;
    kvb_verdict v;
    reserve_host_pool(&cases);
    if (kvb_run_setup(&r, c, NULL) || (kvb_run_gpu_setup(&r), kvb_run_validate(&r, &v)) || !v.pass) {
        printf("FAIL  %s: %s\n", c->id, kvb_last_error());
        print_verdict(&r, &v);
        return 1;
    }
    for (int i = 0; i < 2; i++) { /* warm-up */
        kvb_run_reset(&r);
        kvb_run_launch(&r);
    }
    kvb_run_reset(&r);
    kvb_sync(r.stream);
#if KVB_HAVE_CUDA
    KVB_CUDA(cudaDeviceSynchronize());
    KVB_CUDA(cudaProfilerStart());
    kvb_nvtx_push(c->id);
    kvb_run_launch(&r);
    kvb_sync(r.stream);
    kvb_sync(r.stream2);
    kvb_nvtx_pop();
    KVB_CUDA(cudaProfilerStop());
#endif
    kvb_run_download(&r);
    kvb_run_compare(&r, &v);
    printf("%s  %s (one profiled launch in NVTX domain \"kvbench\", range \"%s\")\n", v.pass ? "PASS" : "FAIL", c->id, c->id);
    print_verdict(&r, &v);
    kvb_run_teardown(&r);
    kvb_host_pool_release();
    kvb_cases_free(&cases);
    return v.pass ? 0 : 1;
}

int main(int argc, char **argv)
{
    options o;
    int rc = parse_options(argc, argv, &o);
    if (rc < 0 || !o.cmd || !strcmp(o.cmd, "help") || !strcmp(o.cmd, "--help") || !strcmp(o.cmd, "-h")) {
        usage(rc < 0 ? stderr : stdout);
        return rc < 0 ? 2 : 0;
    }
    if (!strcmp(o.cmd, "compare")) return kvb_compare_main(argc - 2, argv + 2);
    if (rc) return rc;
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!strcmp(o.cmd, "list")) return cmd_list(&o);
    if (!strcmp(o.cmd, "check")) return cmd_check(&o);
    if (!strcmp(o.cmd, "bench")) return cmd_bench(&o);
    if (!strcmp(o.cmd, "ceilings")) return cmd_ceilings(&o);
    if (!strcmp(o.cmd, "profile")) return cmd_profile(&o);
    fprintf(stderr, "kvbench: unknown command '%s'\n", o.cmd);
    usage(stderr);
    return 2;
}
