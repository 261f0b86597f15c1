/* compare_results.c: see compare_results.h (the rules and the exit status). */
#include "harness/core/compare_results.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "reference/kvb.h"
#include "harness/core/files.h"
#include "harness/core/json.h"
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
    int index; /* in the file's benchmarks array */
    kvb_case_timing t;
} entry;

typedef struct bench_file {
    kvb_jval root;
    entry *e;
    int n;
    entry **by_id; /* e sorted by id: lookups by binary search */
} bench_file;

static int unusable(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int unusable(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("kvbench compare: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 2;
}

size_t kvb_bench_id_len(const char *name) { return strcspn(name, "/"); }

static char *case_id(const char *name)
{
    char *id = strdup(name);
    if (!id) return NULL;
    id[kvb_bench_id_len(id)] = 0;
    return id;
}

/* One timing field of a case that ran: present, a finite number in [lo, hi], an integer when asked. */
static int timing_field(const char *path, const char *id, const kvb_jval *b, const char *key, double lo, double hi,
                        int integer, const char *why, double *out)
{
    const kvb_jval *v = kvb_jget(b, key);
    char val[32], los[32], his[32];
    if (!v) return unusable("%s: case '%s': no %s (a kvbench bench result has median_us, noise_pct and samples)", path, id, key);
    if (v->type != KVB_J_NUM) return unusable("%s: case '%s': %s is not a number", path, id, key);
    const int finite = isfinite(v->num), whole = !integer || v->num == floor(v->num), in_range = v->num >= lo && v->num <= hi;
    if (finite && whole && in_range) {
        *out = v->num;
        return 0;
    }
    kvb_format_double(val, sizeof val, v->num); /* only for the message: formatting is not free */
    if (!finite) return unusable("%s: case '%s': %s=%s is not a finite number", path, id, key, isnan(v->num) ? "NaN" : val);
    if (!whole) return unusable("%s: case '%s': %s=%s is not an integer", path, id, key, val);
    {
        kvb_format_double(los, sizeof los, lo);
        kvb_format_double(his, sizeof his, hi);
        return unusable("%s: case '%s': %s=%s out of range [%s, %s]: %s", path, id, key, val, los, his, why);
    }
}

static int cmp_entry(const void *a, const void *b)
{
    const entry *x = *(entry *const *)a, *y = *(entry *const *)b;
    int c = strcmp(x->id, y->id);
    return c ? c : (x->index > y->index) - (x->index < y->index);
}

static int load(const char *path, bench_file *f)
{
    memset(f, 0, sizeof *f);
    if (kvb_json_read_file_flags(path, &f->root, KVB_JSON_NONFINITE)) return unusable("%s", kvb_last_error());
    const kvb_jval *ctx = kvb_jget(&f->root, "context"), *arr = kvb_jget(&f->root, "benchmarks");
    if (!ctx || ctx->type != KVB_J_OBJ || !arr || arr->type != KVB_J_ARR)
        return unusable("%s: not a Google Benchmark JSON file (no context object or benchmarks array)", path);
    if (!kvb_jstr(ctx, "kvbench_git_revision"))
        return unusable("%s: not written by kvbench bench (no kvbench_git_revision in its context)", path);
    f->e = calloc((size_t)arr->n + 1, sizeof *f->e);
    if (!f->e) return unusable("%s: out of memory for %d benchmarks", path, arr->n);
    for (int i = 0; i < arr->n; i++) {
        const kvb_jval *b = &arr->items[i];
        if (b->type != KVB_J_OBJ) return unusable("%s: benchmarks[%d] is not an object", path, i);
        const char *name = kvb_jstr(b, "name"), *type = kvb_jstr(b, "run_type");
        if (!name) return unusable("%s: benchmarks[%d] has no name", path, i);
        if (type && !strcmp(type, "aggregate")) continue; /* repetitions' summaries: the runs are there */
        entry *e = &f->e[f->n];
        if (!(e->id = case_id(name))) return unusable("%s: out of memory", path);
        f->n++;
        e->index = i;
        e->t.present = 1;
        const kvb_jval *err = kvb_jget(b, "error_occurred");
        if (err && err->type != KVB_J_BOOL)
            return unusable("%s: case '%s': error_occurred is not true or false", path, e->id);
        e->t.failed = err && err->num != 0;
        if (e->t.failed) continue;
        if (timing_field(path, e->id, b, "median_us", KVB_COMPARE_MEDIAN_MIN_US, KVB_COMPARE_MEDIAN_MAX_US, 0,
                         "a median time between 1 ns and 11.6 days", &e->t.median_us) ||
            timing_field(path, e->id, b, "samples", KVB_COMPARE_MIN_SAMPLES, 1e12, 1,
                         "fewer than 3 samples give no estimate of the noise, so the gate could not test a change "
                         "(bench this case longer: --sample-time)", &e->t.n))
            return 2;
        double noise_pct;
        if (timing_field(path, e->id, b, "noise_pct", 0, 100 * sqrt(e->t.n), 0,
                         "the relative standard deviation of n positive samples is at most sqrt(n), 100 sqrt(samples) %",
                         &noise_pct))
            return 2;
        e->t.noise = noise_pct / 100.0;
    }
    if (f->n == 0) return unusable("%s: no benchmark results in it", path);
    if (!(f->by_id = malloc(sizeof *f->by_id * (size_t)f->n))) return unusable("%s: out of memory", path);
    for (int i = 0; i < f->n; i++) f->by_id[i] = &f->e[i];
    qsort(f->by_id, (size_t)f->n, sizeof *f->by_id, cmp_entry);
    for (int i = 1; i < f->n; i++) {
        const entry *a = f->by_id[i - 1], *b = f->by_id[i];
        if (strcmp(a->id, b->id)) continue;
        const int reps = (int)kvb_jnum(&arr->items[b->index], "repetitions", 1);
        return unusable("%s: case '%s' appears twice (benchmarks[%d] and benchmarks[%d])%s", path, b->id, a->index,
                        b->index,
                        reps > 1 ? ": --benchmark_repetitions is not supported (each case's samples give its "
                                   "median and noise)"
                                 : "");
    }
    return 0;
}

static void release(bench_file *f)
{
    for (int i = 0; i < f->n; i++) free(f->e[i].id);
    free(f->e);
    free(f->by_id);
    kvb_json_free(&f->root);
}

static const entry *find(const bench_file *f, const char *id)
{
    int lo = 0, hi = f->n - 1;
    while (lo <= hi) {
        const int mid = lo + (hi - lo) / 2;
        const int c = strcmp(f->by_id[mid]->id, id);
        if (!c) return f->by_id[mid];
        if (c < 0) lo = mid + 1;
        else hi = mid - 1;
    }
    return NULL;
}

/* v with `decimals` (1 or 2) digits after the point, into buf[32], as "%.*f" prints it but without
 * printf's cost (the report of 100k cases formats half a million numbers); |v| < 1e15 (medians are at
 * most 1e12 us, changes at most 1e17 %: beyond, printf) */
static void fixed(char *buf, double v, int decimals, const char *sign, const char *unit)
{
    const double scale = decimals == 1 ? 10 : 100;
    if (!(fabs(v) < 1e15)) {
        snprintf(buf, 32, "%s%.*f%s", sign, decimals, v, unit);
        return;
    }
    long long r = llround(fabs(v) * scale);
    const int neg = v < 0 && r != 0;
    char digits[24];
    int n = 0;
    for (int k = 0; k <= decimals || r; k++, r /= 10) { /* least significant first, at least d+1 digits */
        if (k == decimals && k) digits[n++] = '.';
        digits[n++] = (char)('0' + r % 10);
    }
    int len = 0;
    for (const char *p = neg ? "-" : sign; *p;) buf[len++] = *p++;
    while (n) buf[len++] = digits[--n];
    for (const char *p = unit; *p;) buf[len++] = *p++;
    buf[len] = '\0';
}

/* A context value as a number (Google Benchmark writes its own as numbers, kvbench its as strings); NAN
 * when absent or not a number. */
static double context_number(const kvb_jval *ctx, const char *key)
{
    const kvb_jval *v = kvb_jget(ctx, key);
    if (v && v->type == KVB_J_NUM) return v->num;
    if (!v || v->type != KVB_J_STR) return NAN;
    char *end;
    const double x = strtod(v->str, &end);
    return end != v->str && !*end ? x : NAN;
}

/* Where the two files' machines differ, said before the verdicts (which stay as they are): a gate
 * between two machines also measures the machines. The timing floor (an empty launch, measured in each
 * run) moves by up to 0.22 us between runs on one host (results/h200) and by 1.6 us between two H200
 * hosts (results/h200/two-gpus): KVB_COMPARE_FLOOR_NOTE_US lies between. */
#define KVB_COMPARE_FLOOR_NOTE_US 0.5
static void machine_notes(FILE *report, const bench_file *base, const bench_file *cur)
{
    const kvb_jval *a = kvb_jget(&base->root, "context"), *b = kvb_jget(&cur->root, "context");
    const char *gpu_a = kvb_jstr(a, "gpu"), *gpu_b = kvb_jstr(b, "gpu");
    if (gpu_a && gpu_b && strcmp(gpu_a, gpu_b))
        fprintf(report, "note: BASE ran on %s, NEW on %s: their times are not comparable\n", gpu_a, gpu_b);
    const double floor_a = context_number(a, "timing_floor_us"), floor_b = context_number(b, "timing_floor_us");
    if (fabs(floor_a - floor_b) > KVB_COMPARE_FLOOR_NOTE_US) /* false when either is NAN */
        fprintf(report,
                "note: timing floors (an empty launch) %.2f us in BASE, %.2f us in NEW: short cases move by about "
                "the difference\n",
                floor_a, floor_b);
    const double cpus_a = context_number(a, "num_cpus"), cpus_b = context_number(b, "num_cpus");
    if (cpus_a != cpus_b && isfinite(cpus_a) && isfinite(cpus_b))
        fprintf(report, "note: BASE's host has %.0f CPUs, NEW's %.0f: cases timed with host work depend on the host\n",
                cpus_a, cpus_b);
}

int kvb_compare_files(const char *base_path, const char *cur_path, double threshold, const char *json_out,
                      FILE *report)
{
    return kvb_compare_files_subset(base_path, cur_path, threshold, 0, json_out, report);
}

int kvb_compare_files_subset(const char *base_path, const char *cur_path, double threshold, int subset,
                             const char *json_out, FILE *report)
{
    if (json_out && (kvb_same_file(json_out, base_path) || kvb_same_file(json_out, cur_path)))
        return unusable("--json %s is the same file as %s %s: it would be overwritten", json_out,
                        kvb_same_file(json_out, base_path) ? "BASE" : "NEW",
                        kvb_same_file(json_out, base_path) ? base_path : cur_path);
    bench_file base, cur;
    memset(&cur, 0, sizeof cur);
    int rc = load(base_path, &base);
    if (rc || (rc = load(cur_path, &cur))) {
        release(&base), release(&cur);
        return rc;
    }
    kvb_outfile out;
    FILE *js = NULL;
    if (json_out && !(js = kvb_outfile_open(&out, json_out))) {
        unusable("--json %s", kvb_last_error());
        release(&base), release(&cur);
        return 2;
    }
    machine_notes(report, &base, &cur);
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
            if (tb->present && !tb->failed) fixed(t0, tb->median_us, 2, "", "");
            if (tc->present && !tc->failed) fixed(t1, tc->median_us, 2, "", "");
            if (isfinite(change)) {
                fixed(ch, 100 * change, 1, change >= 0 ? "+" : "", "%");
                fixed(nz, 100 * fmax(tb->noise, tc->noise), 1, "", "%");
                if (isfinite(z)) fixed(zs, z, 1, "", "");
                else snprintf(zs, sizeof zs, "inf");
            }
            fprintf(report, "%-8s %11s %11s %8s %6s %6s  %s\n", names[v], t0, t1, ch, nz, zs, f->e[i].id);
            if (js) {
                fprintf(js, "%s\n  {\"id\": ", first ? "" : ",");
                kvb_json_put_string(js, f->e[i].id);
                fprintf(js, ", \"verdict\": \"%s\", \"base_us\": ", names[v]);
                kvb_json_put_number(js, tb->present && !tb->failed ? tb->median_us : NAN);
                fputs(", \"new_us\": ", js);
                kvb_json_put_number(js, tc->present && !tc->failed ? tc->median_us : NAN);
                fputs(", \"change\": ", js);
                kvb_json_put_number(js, change);
                fputs(", \"z\": ", js);
                kvb_json_put_number(js, z);
                fputc('}', js);
                first = 0;
            }
        }
    }
    const int fail = count[KVB_V_SLOWER] + count[KVB_V_MISSING] + count[KVB_V_FAILED];
    if (subset) fprintf(report, "compare --subset: %d case%s of BASE not in NEW, left out\n", not_run, not_run == 1 ? "" : "s");
    fprintf(report,
            "compare: %d slower, %d faster, %d same, %d noisy, %d missing, %d failed, %d new, %d fixed "
            "(threshold %.1f%%, z > %.0f): %s\n",
            count[KVB_V_SLOWER], count[KVB_V_FASTER], count[KVB_V_SAME], count[KVB_V_NOISY], count[KVB_V_MISSING],
            count[KVB_V_FAILED], count[KVB_V_NEW], count[KVB_V_FIXED], 100 * threshold, KVB_COMPARE_Z,
            fail ? "FAIL" : "pass");
    int status = fail ? 1 : 0;
    if (js) {
        fprintf(js, "\n], \"pass\": %s}\n", fail ? "false" : "true");
        if (kvb_outfile_commit(&out) != KVB_OK) status = unusable("--json %s", kvb_last_error());
    }
    release(&base), release(&cur);
    return status;
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
                errno = 0;
                threshold_pct = strtod(val, &end);
                if (end == val || *end || errno == ERANGE || !isfinite(threshold_pct)) {
                    fprintf(stderr, "kvbench compare: --threshold %s is not a number (a percentage in (0, 1000))\n", val);
                    return 2;
                }
                if (!(threshold_pct > 0 && threshold_pct < 1000)) {
                    fprintf(stderr, "kvbench compare: --threshold %s out of range (0, 1000) percent\n", val);
                    return 2;
                }
            } else if (len == 6 && !strncmp(a, "--json", len)) {
                if (!*val) {
                    fprintf(stderr, "kvbench compare: --json needs a file name\n");
                    return 2;
                }
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

/* Appends key: value to the object v (allocated as the reader allocates: kvb_json_free frees it); a
 * string value is copied. */
static int json_add(kvb_jval *v, const char *key, kvb_jval value)
{
    kvb_jval *items = realloc(v->items, sizeof *items * (size_t)(v->n + 1));
    if (items) v->items = items;
    char **keys = items ? realloc(v->keys, sizeof *keys * (size_t)(v->n + 1)) : NULL;
    if (keys) v->keys = keys;
    char *k = keys ? strdup(key) : NULL, *t = k && value.type == KVB_J_STR ? strdup(value.str) : NULL;
    if (!k || (value.type == KVB_J_STR && !t)) {
        free(k);
        return kvb_fail(KVB_ENOMEM, "out of memory adding %s to a result", key);
    }
    if (t) value.str = t;
    v->keys[v->n] = k;
    v->items[v->n] = value;
    v->n++;
    return KVB_OK;
}

int kvb_bench_json_finish(const char *path, const char *drop_prefix, kvb_goal_fn goal_of, void *ctx)
{
    kvb_jval root;
    int rc = kvb_json_read_file_flags(path, &root, KVB_JSON_NONFINITE);
    if (rc) return rc;
    kvb_jval *arr = NULL;
    for (int i = 0; root.type == KVB_J_OBJ && i < root.n; i++)
        if (!strcmp(root.keys[i], "benchmarks") && root.items[i].type == KVB_J_ARR) arr = &root.items[i];
    if (!arr) {
        kvb_json_free(&root);
        return kvb_fail(KVB_EINVAL, "%s: no benchmarks array", path);
    }
    int kept = 0;
    for (int i = 0; i < arr->n; i++) {
        const char *msg = kvb_jstr(&arr->items[i], "error_message");
        if (drop_prefix && msg && !strncmp(msg, drop_prefix, strlen(drop_prefix))) kvb_json_free(&arr->items[i]);
        else arr->items[kept++] = arr->items[i];
    }
    arr->n = kept;
    for (int i = 0; goal_of && rc == KVB_OK && i < arr->n; i++) {
        kvb_jval *b = &arr->items[i];
        const char *name = kvb_jstr(b, "name");
        if (b->type != KVB_J_OBJ || !name || kvb_jget(b, "goal_text")) continue;
        char id[1024]; /* a case id (case.h KVB_ID_MAX) */
        snprintf(id, sizeof id, "%.*s", (int)strcspn(name, "/"), name);
        const kvb_goal g = goal_of(id, ctx);
        if (g.text) rc = json_add(b, "goal_text", (kvb_jval){.type = KVB_J_STR, .str = (char *)g.text});
        if (!rc && g.us > 0 && !kvb_jget(b, "goal_us"))
            rc = json_add(b, "goal_us", (kvb_jval){.type = KVB_J_NUM, .num = g.us});
    }
    kvb_outfile out;
    FILE *f = rc ? NULL : kvb_outfile_open(&out, path);
    if (!rc && !f) rc = KVB_EIO;
    else if (f) {
        kvb_json_write_tree(f, &root);
        rc = kvb_outfile_commit(&out);
    }
    kvb_json_free(&root);
    return rc;
}

int kvb_bench_json_drop_errors(const char *path, const char *prefix)
{
    return kvb_bench_json_finish(path, prefix, NULL, NULL);
}
