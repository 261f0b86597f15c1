/* merge.c: `kvbench merge OUT.json IN.json [IN.json ...] [--summary F]`: result files of one kind (all
 * check JSON, or all bench JSON) into one that reads as if one process had run every case: the shards
 * of a run split with --shard K/N, or any runs of one revision over disjoint cases.
 *
 * Refused (exit 2, naming the file), with nothing written: a file that cannot be read or is not a
 * kvbench check or bench result file; files of both kinds; contexts of different git revisions; a case
 * id in two inputs (or twice in one); OUT or F the same file as an input, or as each other.
 * The merged context is the first input's (the first that holds a case), without its per-process fields
 * (shard, CUDA_VISIBLE_DEVICES) and of an earlier merge, plus "merged": one entry per input (its file,
 * shard, GPU, device index, date, number of cases, and the "merged" list of an input that was itself merged).
 * A check file's summary counts are the sums of the inputs'. Cases are in the order of the case files
 * (the order one process selects them in; a case line given on the command line, absent from the case
 * files, first), else the inputs' order.
 * --summary F (bench): the summary table bench writes, rebuilt from the JSON's counters (bench.c
 * kvb_bench_summary_row), the goal's words from each case's "goal_text" (a goal against an impl or peer
 * that did not run in the case's process is stated there as its summary stated it), and the external
 * peers are listed in name order.
 * Exit: 0 written, 1 OUT or F could not be written, 2 refused.
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness/core/cli.h"
#include "harness/core/compare_results.h"
#include "harness/core/json_read.h"
#include "harness/core/peers.h"
#include "harness/core/shard.h"

enum { KIND_CHECK = 1, KIND_BENCH = 2 };
static const char *const kind_name[3] = {"", "check", "bench"};

typedef struct input {
    const char *path;
    kvb_jval root;
    int kind;
    kvb_jval *ctx, *arr; /* the context; the cases (check) or benchmarks (bench) */
    const char *rev;
    int n_cases;
} input;

typedef struct item {
    kvb_jval *v;   /* the case's object in its input's tree */
    char id[KVB_ID_MAX + 64];
    const char *aggregate; /* an aggregate of repetitions: its full name, what must be unique (else the id) */
    int in, pos;     /* input, index in its array */
    long order;      /* its index in the case files, -1 when not there */
} item;

static int refuse(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int refuse(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("kvbench merge: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    return 2;
}

/* ---- nodes of the merged tree: shallow copies of the inputs' nodes, in arrays this file owns ---- */

typedef struct arena {
    void **p;
    int n, cap;
} arena;

static void *own(arena *a, size_t bytes)
{
    if (a->n == a->cap) {
        int cap = a->cap ? 2 * a->cap : 32;
        void **p = kvb_xalloc((size_t)cap, sizeof *p, "the merged JSON's nodes");
        if (!p) return NULL;
        if (a->n) memcpy(p, a->p, sizeof *p * (size_t)a->n);
        kvb_xfree(a->p);
        a->p = p, a->cap = cap;
    }
    void *m = kvb_xalloc(1, bytes ? bytes : 1, "the merged JSON");
    if (m) a->p[a->n++] = m;
    return m;
}

static void arena_free(arena *a)
{
    for (int i = 0; i < a->n; i++) kvb_xfree(a->p[i]);
    kvb_xfree(a->p);
}

/* an object or array node with room for cap members (n = 0) */
static int node(arena *a, kvb_jval *v, kvb_jtype type, int cap)
{
    memset(v, 0, sizeof *v);
    v->type = type;
    v->items = own(a, sizeof *v->items * (size_t)(cap ? cap : 1));
    if (type == KVB_J_OBJ) v->keys = own(a, sizeof *v->keys * (size_t)(cap ? cap : 1));
    return v->items && (type != KVB_J_OBJ || v->keys) ? 0 : -1;
}

static void put(kvb_jval *obj, const char *key, kvb_jval v)
{
    if (obj->keys) obj->keys[obj->n] = (char *)key;
    obj->items[obj->n++] = v;
}

static kvb_jval num(double x) { return (kvb_jval){.type = KVB_J_NUM, .num = x}; }
static kvb_jval str(const char *s) { return (kvb_jval){.type = KVB_J_STR, .str = (char *)s}; }

/* ---- reading the inputs ---- */

static const char *case_id(const char *name, char *buf, size_t n)
{
    snprintf(buf, n, "%s", name);
    buf[kvb_bench_id_len(buf)] = 0;
    return buf;
}

static int load(input *in)
{
    const char *p = in->path;
    if (kvb_json_read_file_flags(p, &in->root, KVB_JSON_NONFINITE)) return refuse("%s", kvb_last_error());
    in->ctx = (kvb_jval *)kvb_jget(&in->root, "context");
    kvb_jval *bench = (kvb_jval *)kvb_jget(&in->root, "benchmarks"), *cases = (kvb_jval *)kvb_jget(&in->root, "cases");
    const kvb_jval *summary = kvb_jget(&in->root, "summary");
    const int has_ctx = in->ctx && in->ctx->type == KVB_J_OBJ;
    if (has_ctx && bench && bench->type == KVB_J_ARR && (in->rev = kvb_jstr(in->ctx, "kvbench_git_revision")))
        in->kind = KIND_BENCH, in->arr = bench;
    else if (has_ctx && cases && cases->type == KVB_J_ARR && summary && summary->type == KVB_J_OBJ &&
             (in->rev = kvb_jstr(in->ctx, "git_revision")))
        in->kind = KIND_CHECK, in->arr = cases;
    else
        return refuse("%s: not a kvbench result file (check --json: context with git_revision, cases and summary; "
                      "bench --json: context with kvbench_git_revision, and benchmarks)", p);
    if (in->kind == KIND_CHECK) {
        static const char *const counts[] = {"passed", "failed", "skipped", "selected"};
        for (int k = 0; k < 4; k++) {
            const kvb_jval *v = kvb_jget(summary, counts[k]);
            if (!v || v->type != KVB_J_NUM || !(v->num >= 0) || v->num != floor(v->num))
                return refuse("%s: summary.%s is not a whole number", p, counts[k]);
        }
    }
    for (int i = 0; i < in->arr->n; i++) {
        const kvb_jval *c = &in->arr->items[i];
        const char *what = in->kind == KIND_CHECK ? "cases" : "benchmarks";
        if (c->type != KVB_J_OBJ) return refuse("%s: %s[%d] is not an object", p, what, i);
        if (!kvb_jstr(c, in->kind == KIND_CHECK ? "id" : "name"))
            return refuse("%s: %s[%d] has no %s", p, what, i, in->kind == KIND_CHECK ? "id" : "name");
        const char *type = kvb_jstr(c, "run_type");
        in->n_cases += !(type && !strcmp(type, "aggregate"));
    }
    return 0;
}

static const char *item_key(const item *x) { return x->aggregate ? x->aggregate : x->id; }

static int by_key(const void *a, const void *b)
{
    const item *x = a, *y = b;
    int c = strcmp(item_key(x), item_key(y));
    return c ? c : x->in != y->in ? x->in - y->in : x->pos - y->pos;
}

static int by_order(const void *a, const void *b)
{
    const item *x = a, *y = b;
    if (x->order != y->order) return x->order < y->order ? -1 : 1;
    return x->in != y->in ? x->in - y->in : x->pos - y->pos;
}

/* Each case's place in the case files (what one process's selection follows). Said so, and the inputs'
 * order kept, when there are none to read. */
static void case_file_order(item *it, int n, const char *cases_path)
{
    kvb_options o;
    memset(&o, 0, sizeof o);
    o.cases_path = cases_path;
    const char *path = kvb_cases_path(&o);
    kvb_case_list all = {0};
    if (!path || kvb_cases_load(&all, path) != KVB_OK) {
        fprintf(stderr, "kvbench merge: note: cases kept in the inputs' order (no case files to order them by: %s)\n",
                kvb_last_error());
        kvb_cases_free(&all);
        return;
    }
    for (int i = 0; i < n; i++) it[i].order = kvb_cases_find(&all, it[i].id);
    kvb_cases_free(&all);
}

/* What the inputs' shards say: a note when they are not one whole split (merging other files is fine). */
static void note_shards(const input *in, int n)
{
    int n0 = 0, seen[KVB_SHARD_MAX + 1] = {0}, mixed = 0, some = 0;
    for (int i = 0; i < n; i++) {
        const char *s = kvb_jstr(in[i].ctx, "shard");
        int k, m;
        if (!s || kvb_shard_parse(s, &k, &m)) continue;
        some = 1;
        if (!n0) n0 = m;
        if (m != n0) mixed = 1;
        else seen[k]++;
    }
    if (!some) return;
    if (mixed) {
        fprintf(stderr, "kvbench merge: note: the inputs are shards of different splits\n");
        return;
    }
    char missing[512] = "";
    size_t len = 0;
    for (int k = 1; k <= n0 && len < sizeof missing; k++)
        if (!seen[k]) len += (size_t)snprintf(missing + len, sizeof missing - len, "%s%d/%d", len ? ", " : "", k, n0);
    if (len) fprintf(stderr, "kvbench merge: note: shard%s %s not among the inputs\n", strchr(missing, ',') ? "s" : "", missing);
}

/* ---- the merged context ---- */

static int merged_context(arena *a, const input *in, int n, kvb_jval *out)
{
    static const char *const per_input[] = {"shard", "gpu", "gpu_unavailable", "cuda_visible_devices", "date", "host_name",
                                            "merged"};
    int base = 0; /* the first input that ran a case (an empty shard's context says little) */
    while (base < n - 1 && !in[base].n_cases) base++;
    const kvb_jval *first = in[base].ctx;
    if (node(a, out, KVB_J_OBJ, first->n + 1)) return -1;
    for (int i = 0; i < first->n; i++)
        if (strcmp(first->keys[i], "shard") && strcmp(first->keys[i], "cuda_visible_devices") &&
            strcmp(first->keys[i], "merged")) /* an input's own merge list goes into its entry */
            put(out, first->keys[i], first->items[i]);
    kvb_jval list;
    if (node(a, &list, KVB_J_ARR, n)) return -1;
    for (int i = 0; i < n; i++) {
        kvb_jval e;
        if (node(a, &e, KVB_J_OBJ, 2 + (int)(sizeof per_input / sizeof *per_input))) return -1;
        put(&e, "file", str(in[i].path));
        for (size_t k = 0; k < sizeof per_input / sizeof *per_input; k++) {
            const kvb_jval *v = kvb_jget(in[i].ctx, per_input[k]);
            if (v) put(&e, per_input[k], *v);
        }
        put(&e, "cases", num(in[i].n_cases));
        put(&list, NULL, e);
    }
    put(out, "merged", list);
    return 0;
}

/* ---- bench --summary, from the JSON's counters ---- */

static double counter(const kvb_jval *b, const char *key, double dflt)
{
    const kvb_jval *v = kvb_jget(b, key);
    return v && v->type == KVB_J_NUM && isfinite(v->num) ? v->num : dflt;
}

static double ctx_num(const kvb_jval *ctx, const char *key)
{
    const char *s = kvb_jstr(ctx, key); /* Google Benchmark's context holds strings */
    const kvb_jval *v = kvb_jget(ctx, key);
    return s ? strtod(s, NULL) : v && v->type == KVB_J_NUM ? v->num : -1;
}

static void clock_sample(const kvb_jval *b, const char *when, kvb_clock_sample *s)
{
    char k[5][48];
    static const char *const what[5] = {"clock_sm_mhz", "clock_mem_mhz", "gpu_temp_c", "gpu_power_w", "clock_event_reasons"};
    double v[5];
    memset(s, 0, sizeof *s);
    for (int i = 0; i < 5; i++) {
        snprintf(k[i], sizeof k[i], "%s_%s", what[i], when);
        v[i] = counter(b, k[i], -1);
        s->valid |= kvb_jget(b, k[i]) != NULL;
    }
    s->sm_mhz = v[0], s->mem_mhz = v[1], s->temp_c = v[2], s->power_w = v[3];
    s->have_reasons = v[4] >= 0;
    s->reasons = v[4] >= 0 ? (unsigned long long)v[4] : 0;
}

static void ceilings_line(FILE *f, const kvb_jval *ctx)
{
    fprintf(f, "Ceilings this run: H2D pinned memcpy %.1f GB/s, zero-copy kernel %.1f GB/s, D2D memcpy %.0f GB/s "
               "(read+write), copy kernel %.0f GB/s, read kernel %.0f GB/s (read only), bf16 GEMM %.0f TFLOP/s, timing "
               "floor (empty kernel) %.2f us.",
            ctx_num(ctx, "ceiling_h2d_memcpy_GBps"), ctx_num(ctx, "ceiling_h2d_zero_copy_GBps"),
            ctx_num(ctx, "ceiling_d2d_memcpy_GBps"), ctx_num(ctx, "ceiling_d2d_kernel_GBps"),
            ctx_num(ctx, "ceiling_read_GBps"), ctx_num(ctx, "ceiling_bf16_mma_TFLOPs"), ctx_num(ctx, "timing_floor_us"));
}

static int write_summary(FILE *f, const input *in, int n_in, const item *it, int n)
{
    kvb_bench_result *res = kvb_xalloc((size_t)(n ? n : 1), sizeof *res, "the summary's results");
    kvb_case *cs = res ? kvb_xalloc((size_t)(n ? n : 1), sizeof *cs, "the summary's cases") : NULL;
    kvb_peers *peers = cs ? kvb_xalloc((size_t)(n ? n : 1), sizeof *peers, "the summary's peers") : NULL;
    if (!peers) {
        kvb_xfree(res), kvb_xfree(cs);
        return KVB_ENOMEM;
    }
    int rows = 0;
    for (int i = 0; i < n; i++) {
        const kvb_jval *b = it[i].v;
        const char *type = kvb_jstr(b, "run_type");
        if (type && !strcmp(type, "aggregate")) continue;
        kvb_case *c = &cs[rows];
        if (kvb_case_parse(it[i].id, "merge", c) != KVB_OK) { /* another revision's kernel: no peers for it */
            memset(c, 0, sizeof *c);
            snprintf(c->id, sizeof c->id, "%s", it[i].id);
        }
        kvb_bench_result *x = &res[rows];
        const kvb_jval *err = kvb_jget(b, "error_occurred");
        x->c = c;
        x->failed = err && err->num != 0;
        x->done = !x->failed;
        x->error = kvb_jstr(b, "error_message");
        if (!x->error) x->error = "failed";
        const double t = counter(b, "median_us", 0) * 1e-6;
        x->median_s = t;
        x->min_s = counter(b, "min_us", 0) * 1e-6;
        x->max_s = counter(b, "max_us", 0) * 1e-6;
        x->noise = counter(b, "noise_pct", 0) / 100;
        x->ceiling_s = counter(b, "ceiling_us", 0) * 1e-6;
        x->cost.ceiling = (kvb_ceiling_kind)counter(b, "ceiling_kind", KVB_CEIL_NONE);
        x->cost.bytes_h2d = counter(b, "h2d_GBps", 0) * 1e9 * t;
        x->cost.bytes_dev = counter(b, "dev_GBps", 0) * 1e9 * t;
        x->cost.flops = counter(b, "TFLOPs", 0) * 1e12 * t;
        x->cost.goal_us = counter(b, "goal_us", 0);
        x->cost.goal_text = kvb_jstr(b, "goal_text"); /* bench writes the goal's words beside its counters */
        clock_sample(b, "start", &x->clocks.start);
        clock_sample(b, "end", &x->clocks.end);
        x->clocks.sm_max_mhz = ctx_num(in[it[i].in].ctx, "clock_sm_max_mhz");
        /* the external peers of the case's own run: its peer_us_<name> counters */
        kvb_peers *q = &peers[rows];
        for (int k = 0; c->op && k < b->n; k++) {
            if (strncmp(b->keys[k], "peer_us_", 8) || b->items[k].type != KVB_J_NUM) continue;
            kvb_peer *v = kvb_xalloc((size_t)(q->n + 1), sizeof *v, "the summary's peers of a case");
            if (!v) {
                for (int r = 0; r <= rows; r++) kvb_xfree(peers[r].v);
                kvb_xfree(peers), kvb_xfree(cs), kvb_xfree(res);
                return KVB_ENOMEM;
            }
            if (q->n) memcpy(v, q->v, sizeof *v * (size_t)q->n);
            kvb_xfree(q->v);
            q->v = v;
            memset(&v[q->n], 0, sizeof *v);
            snprintf(v[q->n].kernel, sizeof v[q->n].kernel, "%s", c->op->name);
            snprintf(v[q->n].name, sizeof v[q->n].name, "%s", b->keys[k] + 8);
            v[q->n++].median_us = b->items[k].num;
        }
        rows++;
    }
    fprintf(f, "| case | median us | min..max us | noise | rate | %% of ceiling | vs peers (same run) | goal |\n");
    fprintf(f, "|---|---:|---:|---:|---:|---:|---|---|\n");
    int suspect = 0;
    for (int i = 0; i < rows; i++) {
        kvb_bench_summary_row(f, &res[i], res, rows, &peers[i]);
        suspect += res[i].done && res[i].ceiling_s > 0 && kvb_ceiling_suspect(100.0 * res[i].ceiling_s / res[i].median_s);
    }
    fprintf(f, "\n");
    for (int i = 0, r = 0; i < n; i++) {
        const char *type = kvb_jstr(it[i].v, "run_type"), *label = kvb_jstr(it[i].v, "label");
        if (type && !strcmp(type, "aggregate")) continue;
        if (res[r].done && label && *label) fprintf(f, "- `%s`: %s\n", res[r].c->id, label);
        r++;
    }
    if (suspect)
        fprintf(f, "\n**%d case%s above 100%% of their ceiling: CEILING ERROR (the ceiling, not the kernel, is wrong).**\n",
                suspect, KVB_PLURAL(suspect));
    /* the ceilings: one process's sentence as bench writes it; several, one line each */
    int measured = 0;
    for (int i = 0; i < n_in; i++) measured += kvb_jget(in[i].ctx, "ceiling_read_GBps") != NULL;
    if (measured > 1) fprintf(f, "\nCeilings of each input, measured in its own run:\n\n");
    for (int i = 0; i < n_in; i++) {
        if (!kvb_jget(in[i].ctx, "ceiling_read_GBps")) continue;
        const char *gpu = kvb_jstr(in[i].ctx, "gpu"), *shard = kvb_jstr(in[i].ctx, "shard");
        const char *dev = kvb_jstr(in[i].ctx, "cuda_visible_devices");
        if (measured == 1) fprintf(f, "\n%s. ", gpu ? gpu : "GPU unknown");
        else
            fprintf(f, "- %s (%s%s%s%s%s). ", gpu ? gpu : "GPU unknown", in[i].path, shard ? ", shard " : "",
                    shard ? shard : "", dev ? ", CUDA_VISIBLE_DEVICES=" : "", dev ? dev : "");
        ceilings_line(f, in[i].ctx);
        fprintf(f, measured == 1 ? " " : "\n");
    }
    if (measured)
        fprintf(f, "%s%% of ceiling: the ceiling's fastest time (of its repeats) for the same work over the case's median, "
                   "timed the same way at "
                   "the same size: one contiguous pinned copy of the host bytes, one device copy of the device bytes "
                   "(copies), one streaming read of the device bytes (read-mostly kernels), or the FLOPs at the measured "
                   "bf16 GEMM rate%s.\n",
                measured > 1 ? "\n" : "", measured > 1 ? ", each case against the ceilings of its own input" : "");
    const char *said = NULL;
    for (int i = 0; i < n_in; i++) {
        const char *src = kvb_jstr(in[i].ctx, "peers");
        if (src && (!said || strcmp(src, said))) fprintf(f, "\nExternal peers from %s, timed on this GPU in this round.\n", src);
        if (src) said = src;
    }
    const char *nvml_missing = NULL;
    for (int i = 0; i < n_in; i++) {
        const char *s = kvb_jstr(in[i].ctx, "nvml");
        if (s && !strncmp(s, "available", 9)) {
            nvml_missing = NULL;
            break;
        }
        if (s && !nvml_missing) nvml_missing = s;
    }
    kvb_bench_clock_summary(f, res, rows, nvml_missing, n_in ? ctx_num(in[0].ctx, "gpu_power_limit_w") : -1);
    for (int i = 0; i < rows; i++) kvb_xfree(peers[i].v);
    kvb_xfree(peers), kvb_xfree(cs), kvb_xfree(res);
    return KVB_OK;
}

/* ---- the command ---- */

static int merge(const char *out_path, const char **paths, int n_in, const char *summary, const char *cases_path)
{
    input *in = calloc((size_t)n_in, sizeof *in);
    item *it = NULL;
    arena a = {0};
    int rc = 0, n = 0;
    if (!in) return refuse("out of memory");
    for (int i = 0; i < n_in && !rc; i++) {
        in[i].path = paths[i];
        rc = load(&in[i]);
    }
    for (int i = 1; i < n_in && !rc; i++) {
        if (in[i].kind != in[0].kind)
            rc = refuse("%s is a %s result file, %s a %s one: merge files of one kind", in[0].path, kind_name[in[0].kind],
                        in[i].path, kind_name[in[i].kind]);
        else if (strcmp(in[i].rev, in[0].rev))
            rc = refuse("%s ran git revision %s, %s revision %s: results of different revisions are not merged",
                        in[0].path, in[0].rev, in[i].path, in[i].rev);
    }
    if (!rc && summary && in[0].kind != KIND_BENCH)
        rc = refuse("--summary %s: the inputs are check results; only bench results have a summary table", summary);
    int total = 0;
    for (int i = 0; i < n_in && !rc; i++) total += in[i].arr->n;
    if (!rc && !(it = calloc((size_t)(total ? total : 1), sizeof *it))) rc = refuse("out of memory");
    for (int i = 0; i < n_in && !rc; i++)
        for (int k = 0; k < in[i].arr->n; k++) {
            item *x = &it[n++];
            x->v = &in[i].arr->items[k];
            x->in = i, x->pos = k;
            if (in[i].kind == KIND_CHECK) {
                snprintf(x->id, sizeof x->id, "%s", kvb_jstr(x->v, "id"));
            } else {
                const char *name = kvb_jstr(x->v, "name"), *type = kvb_jstr(x->v, "run_type");
                case_id(name, x->id, sizeof x->id);
                x->aggregate = type && !strcmp(type, "aggregate") ? name : NULL;
            }
        }
    if (!rc) {
        qsort(it, (size_t)n, sizeof *it, by_key);
        for (int i = 1; i < n && !rc; i++)
            if (!strcmp(item_key(&it[i - 1]), item_key(&it[i])))
                rc = it[i - 1].in == it[i].in
                         ? refuse("%s: case '%s' is in it twice", in[it[i].in].path, item_key(&it[i]))
                         : refuse("case '%s' is in both %s and %s: merge results of disjoint cases (the shards of one "
                                  "split)", item_key(&it[i]), in[it[i - 1].in].path, in[it[i].in].path);
    }
    kvb_outfile jout, sout;
    FILE *jf = NULL, *sf = NULL;
    if (!rc) {
        note_shards(in, n_in);
        for (int i = 0; i < n; i++) it[i].order = -1;
        case_file_order(it, n, cases_path);
        qsort(it, (size_t)n, sizeof *it, by_order);
        if (!(jf = kvb_outfile_open(&jout, out_path))) rc = refuse("%s", kvb_last_error());
        else if (summary && !(sf = kvb_outfile_open(&sout, summary))) {
            rc = refuse("--summary %s", kvb_last_error());
            kvb_outfile_discard(&jout);
        }
    }
    kvb_jval root, arr, sum;
    if (!rc) {
        if (node(&a, &root, KVB_J_OBJ, 3) || node(&a, &arr, KVB_J_ARR, n) || merged_context(&a, in, n_in, &root.items[0]))
            rc = refuse("out of memory");
    }
    if (!rc) {
        root.keys[0] = "context", root.n = 1;
        int family = -1;
        const char *last = NULL;
        for (int i = 0; i < n; i++) {
            if (in[0].kind == KIND_BENCH) { /* one process numbers its benchmarks in its order: so does the merge */
                kvb_jval *fi = (kvb_jval *)kvb_jget(it[i].v, "family_index");
                if (!last || strcmp(last, it[i].id)) family++, last = it[i].id;
                if (fi && fi->type == KVB_J_NUM) fi->num = family;
            }
            put(&arr, NULL, *it[i].v);
        }
        put(&root, in[0].kind == KIND_BENCH ? "benchmarks" : "cases", arr);
        if (in[0].kind == KIND_CHECK) {
            static const char *const counts[] = {"passed", "failed", "skipped", "not_dumped", "selected"};
            double s[5] = {0};
            int dumped = 0, interrupted = 0;
            for (int i = 0; i < n_in; i++) {
                const kvb_jval *v = kvb_jget(&in[i].root, "summary");
                for (int k = 0; k < 5; k++) s[k] += kvb_jnum(v, counts[k], 0);
                dumped |= kvb_jget(v, "not_dumped") != NULL;
                interrupted |= kvb_jnum(v, "interrupted", 0) != 0;
            }
            if (node(&a, &sum, KVB_J_OBJ, 6)) rc = refuse("out of memory");
            else {
                for (int k = 0; k < 5; k++)
                    if (k != 3 || dumped) put(&sum, counts[k], num(s[k]));
                put(&sum, "interrupted", (kvb_jval){.type = KVB_J_BOOL, .num = interrupted});
                put(&root, "summary", sum);
            }
        }
    }
    if (!rc) {
        kvb_json_write_tree(jf, &root);
        if (sf && write_summary(sf, in, n_in, it, n) != KVB_OK) fprintf(sf, "no summary: %s\n", kvb_last_error());
        if (kvb_outfile_commit(&jout) != KVB_OK) {
            fprintf(stderr, "kvbench merge: %s\n", kvb_last_error());
            rc = 1;
            if (sf) kvb_outfile_discard(&sout);
        } else if (sf && kvb_outfile_commit(&sout) != KVB_OK) {
            fprintf(stderr, "kvbench merge: --summary %s\n", kvb_last_error());
            rc = 1;
        }
        if (!rc)
            printf("kvbench merge: %d %s case%s from %d file%s into %s%s%s\n", n, kind_name[in[0].kind], KVB_PLURAL(n),
                   n_in, KVB_PLURAL(n_in), out_path, summary ? " and " : "", summary ? summary : "");
    } else {
        if (jf) kvb_outfile_discard(&jout);
        if (sf) kvb_outfile_discard(&sout);
    }
    arena_free(&a);
    free(it);
    for (int i = 0; i < n_in; i++) kvb_json_free(&in[i].root);
    free(in);
    return rc;
}

int kvb_merge_main(int argc, char **argv)
{
    const char *files[KVB_SHARD_MAX * 4 + 1], *summary = NULL, *cases = NULL;
    int nf = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const int is_summary = !strncmp(a, "--summary", 9) && (!a[9] || a[9] == '=');
        const int is_cases = !strncmp(a, "--cases", 7) && (!a[7] || a[7] == '=');
        if (is_summary || is_cases) {
            const char *eq = strchr(a, '='), *val = eq ? eq + 1 : i + 1 < argc ? argv[++i] : NULL;
            if (!val || !*val) return refuse("%s needs a file name", is_summary ? "--summary" : "--cases");
            *(is_summary ? &summary : &cases) = val;
        } else if (a[0] == '-' && a[1] == '-') {
            return refuse("unknown option %s (options: --summary FILE, --cases PATH)", a);
        } else if (!*a) {
            return refuse("argument %d is empty: give file names", i + 2);
        } else if (nf < (int)(sizeof files / sizeof *files)) {
            files[nf++] = a;
        } else {
            return refuse("more than %d files", (int)(sizeof files / sizeof *files) - 1);
        }
    }
    if (nf < 2) {
        fprintf(stderr, "usage: kvbench merge OUT.json IN.json [IN.json ...] [--summary FILE]\n");
        return 2;
    }
    /* the result files are never written over an input, nor over each other */
    for (int i = 1; i < nf; i++) {
        if (kvb_same_file(files[0], files[i]) || !strcmp(files[0], files[i]))
            return refuse("OUT %s is the same file as the input %s: it would be overwritten", files[0], files[i]);
        if (summary && (kvb_same_file(summary, files[i]) || !strcmp(summary, files[i])))
            return refuse("--summary %s is the same file as the input %s: it would be overwritten", summary, files[i]);
        for (int k = 1; k < i; k++)
            if (kvb_same_file(files[k], files[i]) || !strcmp(files[k], files[i]))
                return refuse("%s is given twice", files[i]);
    }
    if (summary && (kvb_same_file(summary, files[0]) || !strcmp(summary, files[0])))
        return refuse("--summary %s and OUT %s are the same file", summary, files[0]);
    return merge(files[0], files + 1, nf - 1, summary, cases);
}
