/* compare_results.c: see compare_results.h (the rules and the exit status). */
#include "harness/core/compare_results.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "reference/kvb.h"
#include "harness/core/json_read.h"

kvb_gate_verdict kvb_compare_case(const kvb_case_timing *base, const kvb_case_timing *cur, double threshold,
                             double *change, double *z)
{
    *change = NAN, *z = NAN;
    if (!cur->present) return KVB_V_MISSING;
    if (!base->present) return KVB_V_NEW;
    if (cur->failed) return KVB_V_FAILED;
    if (base->failed) return KVB_V_FIXED;
    const double m0 = base->median_us, m1 = cur->median_us;
    *change = (m1 - m0) / m0;
    /* fewer than 3 samples on either side: no estimate of the noise, so no change is significant */
    if (base->n < 3 || cur->n < 3) return fabs(*change) <= threshold ? KVB_V_SAME : KVB_V_NOISY;
    const double se0 = KVB_COMPARE_SE_MEDIAN * base->noise * m0 / sqrt(base->n);
    const double se1 = KVB_COMPARE_SE_MEDIAN * cur->noise * m1 / sqrt(cur->n);
    const double se = sqrt(se0 * se0 + se1 * se1);
    *z = se > 0 ? fabs(m1 - m0) / se : (m1 != m0 ? INFINITY : 0);
    if (fabs(*change) <= threshold) return KVB_V_SAME;
    if (*z <= KVB_COMPARE_Z) return KVB_V_NOISY;
    return *change > 0 ? KVB_V_SLOWER : KVB_V_FASTER;
}

/* ---- reading a bench file ---- */

typedef struct entry {
    char *id;
    kvb_case_timing t;
} entry;

typedef struct bench_file {
    kvb_jval root;
    entry *e;
    int n;
} bench_file;

static int unusable(const char *path, const char *why)
{
    fprintf(stderr, "kvbench compare: %s: %s\n", path, why);
    return 2;
}

/* The id is the benchmark name without Google Benchmark's "/manual_time" suffix. */
static char *case_id(const char *name)
{
    char *id = strdup(name);
    char *slash = strstr(id, "/manual_time");
    if (slash && !slash[12]) *slash = 0;
    return id;
}

static int load(const char *path, bench_file *f)
{
    memset(f, 0, sizeof *f);
    if (kvb_json_read_file(path, &f->root)) return unusable(path, kvb_last_error());
    const kvb_jval *ctx = kvb_jget(&f->root, "context"), *arr = kvb_jget(&f->root, "benchmarks");
    if (!ctx || ctx->type != KVB_J_OBJ || !arr || arr->type != KVB_J_ARR)
        return unusable(path, "not a Google Benchmark JSON file (no context object or benchmarks array)");
    if (!kvb_jstr(ctx, "kvbench_git_revision"))
        return unusable(path, "not written by kvbench bench (no kvbench_git_revision in its context)");
    f->e = calloc((size_t)arr->n + 1, sizeof *f->e);
    for (int i = 0; i < arr->n; i++) {
        const kvb_jval *b = &arr->items[i];
        const char *name = kvb_jstr(b, "name"), *type = kvb_jstr(b, "run_type");
        if (!name) return unusable(path, "a benchmark without a name");
        if (type && !strcmp(type, "aggregate")) continue; /* repetitions' summaries: the runs are there */
        entry *e = &f->e[f->n++];
        e->id = case_id(name);
        e->t.present = 1;
        const kvb_jval *err = kvb_jget(b, "error_occurred");
        e->t.failed = err && err->num != 0;
        if (e->t.failed) continue;
        e->t.median_us = kvb_jnum(b, "median_us", NAN);
        e->t.noise = kvb_jnum(b, "noise_pct", 0) / 100.0;
        e->t.n = kvb_jnum(b, "samples", 1);
        if (!(e->t.median_us > 0)) {
            char msg[600];
            snprintf(msg, sizeof msg, "case '%s' has no positive median_us (not a kvbench bench result)", e->id);
            return unusable(path, msg);
        }
    }
    if (f->n == 0) return unusable(path, "no benchmark results in it");
    return 0;
}

static void release(bench_file *f)
{
    for (int i = 0; i < f->n; i++) free(f->e[i].id);
    free(f->e);
    kvb_json_free(&f->root);
}

static const entry *find(const bench_file *f, const char *id)
{
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->e[i].id, id)) return &f->e[i];
    return NULL;
}

static void json_string(FILE *o, const char *s)
{
    fputc('"', o);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') fputc('\\', o);
        if ((unsigned char)*s >= 0x20) fputc(*s, o);
    }
    fputc('"', o);
}

static void json_number(FILE *o, double v)
{
    if (isfinite(v)) fprintf(o, "%.6g", v);
    else fputs("null", o);
}

int kvb_compare_files(const char *base_path, const char *cur_path, double threshold, const char *json_out,
                      FILE *report)
{
    return kvb_compare_files_subset(base_path, cur_path, threshold, 0, json_out, report);
}

int kvb_compare_files_subset(const char *base_path, const char *cur_path, double threshold, int subset,
                             const char *json_out, FILE *report)
{
    bench_file base, cur;
    memset(&cur, 0, sizeof cur);
    int rc = load(base_path, &base);
    if (rc || (rc = load(cur_path, &cur))) {
        release(&base), release(&cur);
        return rc;
    }
    FILE *js = NULL;
    if (json_out && !(js = fopen(json_out, "w"))) {
        fprintf(stderr, "kvbench compare: --json %s: %s\n", json_out, strerror(errno));
        release(&base), release(&cur);
        return 2;
    }
    static const char *names[] = KVB_VERDICT_NAMES;
    int count[8] = {0}, not_run = 0;
    if (js) fprintf(js, "{\"threshold\": %.6g, \"z\": %.1f, \"cases\": [", threshold, KVB_COMPARE_Z);
    fprintf(report, "%-8s %11s %11s %8s %6s %6s  %s\n", "verdict", "base us", "new us", "change", "noise", "z", "case");
    /* every case of BASE in its order, then the cases only NEW has */
    for (int pass = 0, first = 1; pass < 2; pass++) {
        const bench_file *f = pass ? &cur : &base;
        for (int i = 0; i < f->n; i++) {
            const entry *b = pass ? find(&base, f->e[i].id) : &f->e[i];
            const entry *c = pass ? &f->e[i] : find(&cur, f->e[i].id);
            if (pass && b) continue;
            if (!pass && !c && subset) { /* NEW ran a chosen subset of BASE: the rest was not run */
                not_run++;
                continue;
            }
            static const kvb_case_timing absent = {0};
            double change, z;
            kvb_gate_verdict v = kvb_compare_case(b ? &b->t : &absent, c ? &c->t : &absent, threshold, &change, &z);
            count[v]++;
            const kvb_case_timing *tb = b ? &b->t : &absent, *tc = c ? &c->t : &absent;
            char t0[32] = "", t1[32] = "", ch[32] = "", nz[32] = "", zs[32] = "";
            if (tb->present && !tb->failed) snprintf(t0, sizeof t0, "%.2f", tb->median_us);
            if (tc->present && !tc->failed) snprintf(t1, sizeof t1, "%.2f", tc->median_us);
            if (isfinite(change)) {
                snprintf(ch, sizeof ch, "%+.1f%%", 100 * change);
                snprintf(nz, sizeof nz, "%.1f%%", 100 * fmax(tb->noise, tc->noise));
                snprintf(zs, sizeof zs, isfinite(z) ? "%.1f" : "inf", z);
            }
            fprintf(report, "%-8s %11s %11s %8s %6s %6s  %s\n", names[v], t0, t1, ch, nz, zs, f->e[i].id);
            if (js) {
                fprintf(js, "%s\n  {\"id\": ", first ? "" : ",");
                json_string(js, f->e[i].id);
                fprintf(js, ", \"verdict\": \"%s\", \"base_us\": ", names[v]);
                json_number(js, tb->present && !tb->failed ? tb->median_us : NAN);
                fputs(", \"new_us\": ", js);
                json_number(js, tc->present && !tc->failed ? tc->median_us : NAN);
                fputs(", \"change\": ", js);
                json_number(js, change);
                fputs(", \"z\": ", js);
                json_number(js, z);
                fputc('}', js);
                first = 0;
            }
        }
    }
    const int fail = count[KVB_V_SLOWER] + count[KVB_V_MISSING] + count[KVB_V_FAILED];
    if (subset) fprintf(report, "compare --subset: %d cases of BASE not in NEW, left out\n", not_run);
    fprintf(report,
            "compare: %d slower, %d faster, %d same, %d noisy, %d missing, %d failed, %d new, %d fixed "
            "(threshold %.1f%%, z > %.0f): %s\n",
            count[KVB_V_SLOWER], count[KVB_V_FASTER], count[KVB_V_SAME], count[KVB_V_NOISY], count[KVB_V_MISSING],
            count[KVB_V_FAILED], count[KVB_V_NEW], count[KVB_V_FIXED], 100 * threshold, KVB_COMPARE_Z,
            fail ? "FAIL" : "pass");
    if (js) {
        fprintf(js, "\n], \"pass\": %s}\n", fail ? "false" : "true");
        fclose(js);
    }
    release(&base), release(&cur);
    return fail ? 1 : 0;
}

/* Options may come before, between or after the two files: --threshold PCT, --json FILE (or =),
 * --subset (no value). */
int kvb_compare_main(int argc, char **argv)
{
    const char *files[2] = {NULL, NULL}, *json_out = NULL;
    double threshold_pct = 5.0;
    int nf = 0, subset = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *val = NULL;
        size_t len = strcspn(a, "=");
        if (!strcmp(a, "--subset")) {
            subset = 1;
        } else if (!strncmp(a, "--", 2)) {
            if (a[len]) val = a + len + 1;
            else if (i + 1 < argc) val = argv[++i];
            else {
                fprintf(stderr, "kvbench compare: %s needs a value\n", a);
                return 2;
            }
            if (len == 11 && !strncmp(a, "--threshold", len)) {
                char *end;
                threshold_pct = strtod(val, &end);
                if (end == val || *end || !(threshold_pct > 0 && threshold_pct < 1000)) {
                    fprintf(stderr, "kvbench compare: --threshold %s out of range (0, 1000) percent\n", val);
                    return 2;
                }
            } else if (len == 6 && !strncmp(a, "--json", len)) {
                json_out = val;
            } else {
                fprintf(stderr, "kvbench compare: unknown option %.*s (options: --threshold PCT, --json FILE, --subset)\n",
                        (int)len, a);
                return 2;
            }
        } else if (nf < 2) {
            files[nf++] = a;
        } else {
            fprintf(stderr, "kvbench compare: unexpected argument %s (two files: BASE.json NEW.json)\n", a);
            return 2;
        }
    }
    if (nf != 2) {
        fprintf(stderr, "usage: kvbench compare BASE.json NEW.json [--threshold PCT] [--json FILE] [--subset]\n");
        return 2;
    }
    return kvb_compare_files_subset(files[0], files[1], threshold_pct / 100.0, subset, json_out, stdout);
}
