/* shard.c: see shard.h. */
#include "harness/core/shard.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness/core/cli.h"
#include "harness/core/compare_results.h"
#include "harness/core/json_read.h"
#include "harness/core/op.h"

#ifndef KVB_GIT_REV
#define KVB_GIT_REV "unknown"
#endif

/* The estimate: KVB_COST_CASE_S per case (its fixed part: device buffers, streams, a launch, the
 * comparison's set-up), plus the op's peak host memory (kvb_op.host_bytes) at KVB_COST_SETUP_BPS (inputs
 * generated, references computed, uploaded, downloaded and compared: each a pass over host memory, so
 * its size tracks the set-up time), plus KVB_COST_TIMED_S for bench (the zeros check, the warm-up, the
 * samples, the stage-timed launches, the validation after timing). Fitted by least squares to the
 * per-case wall times of the main job of f1e8a72 on one H200 with 16 host cores
 * (results/h200/two-gpus/one-gpu: the check tier's 754 cases and the bench tier's 334 but one, a 79 s
 * CPU SVD since benched smaller): the sums come out at 150 s and 840 s as measured. Rough per case: it balances shards and scales the progress
 * line's estimate, nothing more. */
#define KVB_COST_CASE_S 0.13
#define KVB_COST_SETUP_BPS 1.7e9
#define KVB_COST_TIMED_S 1.1

double kvb_case_cost_estimate(const kvb_case *c, int timed)
{
    double bytes = c->op ? (double)kvb_case_host_bytes(c) : 0;
    if (!(bytes < 1e15)) bytes = 1e15; /* a saturated estimate (SIZE_MAX): large, but still summable */
    return KVB_COST_CASE_S + bytes / KVB_COST_SETUP_BPS + (timed ? KVB_COST_TIMED_S : 0);
}

/* ---- measured durations (--durations FILE) ---- */

typedef struct duration {
    const char *id; /* points into the parsed file */
    size_t id_len;
    double s;
} duration;

static int by_id(const void *a, const void *b)
{
    const duration *x = a, *y = b;
    const size_t n = x->id_len < y->id_len ? x->id_len : y->id_len;
    const int c = memcmp(x->id, y->id, n);
    return c ? c : (x->id_len > y->id_len) - (x->id_len < y->id_len);
}

/* A case's measured seconds: a finite, non-negative sum of its phases, or -1 when it has none. */
static double phases_sum(const kvb_jval *obj, int bench)
{
    double sum = 0;
    int seen = 0;
    for (int i = 0; i < obj->n; i++) {
        const char *k = obj->keys[i];
        const size_t len = strlen(k);
        if (bench && !(len > 7 && !strncmp(k, "wall_", 5) && !strcmp(k + len - 2, "_s"))) continue;
        if (obj->items[i].type != KVB_J_NUM || !(obj->items[i].num >= 0 && obj->items[i].num < 1e7)) return -1;
        sum += obj->items[i].num, seen = 1;
    }
    return seen ? sum : -1;
}

/* The cases of a check file (cases[]: id, wall_s {phase: s}) or a bench file (benchmarks[]: name,
 * wall_<phase>_s), each with the sum of its phases; cases without them (failed, skipped) are left out. */
static int read_durations(const kvb_jval *root, const char *path, duration **out, int *n_out)
{
    const kvb_jval *check = kvb_jget(root, "cases"), *bench = kvb_jget(root, "benchmarks");
    const kvb_jval *list = check ? check : bench;
    if (!list || list->type != KVB_J_ARR)
        return kvb_fail(KVB_EINVAL, "%s is not a kvbench check or bench result file (no cases[] or benchmarks[])", path);
    duration *d = kvb_xalloc((size_t)(list->n ? list->n : 1), sizeof *d, "the durations");
    if (!d) return KVB_ENOMEM;
    int n = 0;
    for (int i = 0; i < list->n; i++) {
        const kvb_jval *c = &list->items[i];
        const char *name = kvb_jstr(c, check ? "id" : "name");
        const kvb_jval *phases = check ? kvb_jget(c, "wall_s") : c;
        if (!name || !phases || phases->type != KVB_J_OBJ) continue;
        const double s = phases_sum(phases, !check);
        if (s < 0) continue;
        d[n++] = (duration){name, check ? strlen(name) : kvb_bench_id_len(name), s};
    }
    qsort(d, (size_t)n, sizeof *d, by_id);
    *out = d, *n_out = n;
    return KVB_OK;
}

int kvb_case_costs(const kvb_case_list *l, int timed, const char *durations, double *cost)
{
    for (int i = 0; i < l->n; i++) cost[i] = kvb_case_cost_estimate(&l->v[i], timed);
    if (!durations) return KVB_OK;
    kvb_jval root;
    int rc = kvb_json_read_file_flags(durations, &root, KVB_JSON_NONFINITE);
    if (rc != KVB_OK) return rc;
    duration *d = NULL;
    int n = 0;
    if ((rc = read_durations(&root, durations, &d, &n)) != KVB_OK) {
        kvb_json_free(&root);
        return rc;
    }
    /* measured[i]: case i's seconds in the file, or -1; the others' estimates scaled by the file's
     * measured / estimated over the cases it holds, so that both count in the same seconds */
    double *measured = kvb_xalloc((size_t)(l->n ? l->n : 1), sizeof *measured, "the measured durations");
    double sum_measured = 0, sum_estimated = 0;
    int found = 0;
    for (int i = 0; measured && i < l->n; i++) {
        const duration key = {l->v[i].id, strlen(l->v[i].id), 0};
        const duration *hit = n ? bsearch(&key, d, (size_t)n, sizeof *d, by_id) : NULL;
        measured[i] = hit ? hit->s : -1;
        if (hit) sum_measured += hit->s, sum_estimated += cost[i], found++;
    }
    if (!measured) rc = KVB_ENOMEM;
    else if (!found)
        rc = kvb_fail(KVB_EINVAL, "%s holds none of the %d selected case%s (%d case%s with wall times in it)", durations,
                      l->n, KVB_PLURAL(l->n), n, KVB_PLURAL(n));
    else {
        const double scale = sum_estimated > 0 && sum_measured > 0 ? sum_measured / sum_estimated : 1;
        for (int i = 0; i < l->n; i++) cost[i] = measured[i] >= 0 ? measured[i] : cost[i] * scale;
    }
    kvb_xfree(measured);
    kvb_xfree(d);
    kvb_json_free(&root);
    return rc;
}

const char *kvb_shard_name(int k, int n)
{
    static char buf[32];
    snprintf(buf, sizeof buf, "%d/%d", k, n);
    return buf;
}

int kvb_shard_parse(const char *s, int *k, int *n)
{
    long v[2];
    const char *p = s;
    for (int i = 0; i < 2; i++) {
        if (*p < '0' || *p > '9') return -1;
        v[i] = 0;
        for (; *p >= '0' && *p <= '9'; p++)
            if ((v[i] = v[i] * 10 + (*p - '0')) > 1000) return -1;
        if (*p != (i ? '\0' : '/')) return -1;
        p++;
    }
    if (v[0] < 1 || v[1] > KVB_SHARD_MAX || v[0] > v[1]) return -1;
    *k = (int)v[0], *n = (int)v[1];
    return 0;
}

typedef struct ranked {
    double cost;
    int index;
} ranked;

static int by_cost_desc(const void *a, const void *b)
{
    const ranked *x = a, *y = b;
    if (x->cost != y->cost) return x->cost > y->cost ? -1 : 1;
    return (x->index > y->index) - (x->index < y->index);
}

/* Cases that differ only in impl= compute the same shape: the summary states their ratio as measured in the
 * same run, so they go to one shard together. The id's impl= key is its last. */
static size_t shape_len(const char *id)
{
    const char *impl = strstr(id, " impl=");
    return impl ? (size_t)(impl - id) : strlen(id);
}

int kvb_shard_assign(const kvb_case_list *l, int n, const double *cost, int *shard_of)
{
    if (n < 1 || n > KVB_SHARD_MAX) return kvb_fail(KVB_EINVAL, "%d shards out of range [1, %d]", n, KVB_SHARD_MAX);
    ranked *r = kvb_xalloc((size_t)(l->n ? l->n : 1), sizeof *r, "the cases' costs for the shards");
    int *group = r ? kvb_xalloc((size_t)(l->n ? l->n : 1), sizeof *group, "the cases' shapes for the shards") : NULL;
    if (!group) {
        kvb_xfree(r);
        return KVB_ENOMEM;
    }
    /* group[i]: the first case of i's shape; a group's cost is its cases' sum, ranked under its first case */
    int n_groups = 0;
    for (int i = 0; i < l->n; i++) {
        const size_t len = shape_len(l->v[i].id);
        group[i] = i;
        for (int j = 0; j < i; j++)
            if (group[j] == j && shape_len(l->v[j].id) == len && !strncmp(l->v[i].id, l->v[j].id, len)) {
                group[i] = j;
                break;
            }
        const double c = cost[i];
        if (group[i] == i) r[n_groups++] = (ranked){c, i};
        else
            for (int g = 0; g < n_groups; g++)
                if (r[g].index == group[i]) r[g].cost += c;
    }
    qsort(r, (size_t)n_groups, sizeof *r, by_cost_desc);
    double load[KVB_SHARD_MAX] = {0};
    for (int g = 0; g < n_groups; g++) {
        int s = 0;
        for (int t = 1; t < n; t++)
            if (load[t] < load[s]) s = t;
        shard_of[r[g].index] = s;
        load[s] += r[g].cost;
    }
    for (int i = 0; i < l->n; i++) shard_of[i] = shard_of[group[i]]; /* a group's first case comes first */
    kvb_xfree(group);
    kvb_xfree(r);
    return KVB_OK;
}

int kvb_shard_keep(kvb_case_list *l, int k, int n, const double *cost)
{
    if (k < 1 || k > n) return kvb_fail(KVB_EINVAL, "shard %d/%d out of range", k, n);
    int *shard_of = kvb_xalloc((size_t)(l->n ? l->n : 1), sizeof *shard_of, "the cases' shards");
    if (!shard_of) return KVB_ENOMEM;
    int rc = kvb_shard_assign(l, n, cost, shard_of);
    kvb_case_list kept = {0};
    for (int i = 0; rc == KVB_OK && i < l->n; i++)
        if (shard_of[i] == k - 1) rc = kvb_cases_add(&kept, &l->v[i]);
    kvb_xfree(shard_of);
    if (rc != KVB_OK) {
        kvb_cases_free(&kept);
        return rc;
    }
    kvb_cases_free(l);
    *l = kept;
    return KVB_OK;
}

/* ---- bench of an empty shard: its files, no device needed ---- */

int kvb_bench_write_empty(const kvb_options *o)
{
    const char *shard = kvb_shard_name(o->shard_k, o->shard_n), *visible = getenv("CUDA_VISIBLE_DEVICES");
    kvb_outfile jout, sout;
    FILE *jf = NULL, *sf = NULL;
    if (o->json && !(jf = kvb_outfile_open(&jout, o->json))) {
        fprintf(stderr, "kvbench: --json %s\n", kvb_last_error());
        return 2;
    }
    if (o->summary && !(sf = kvb_outfile_open(&sout, o->summary))) {
        fprintf(stderr, "kvbench: --summary %s\n", kvb_last_error());
        if (jf) kvb_outfile_discard(&jout);
        return 2;
    }
    printf("kvbench bench: shard %s has no case: nothing timed\n", shard);
    int status = 0;
    if (jf) {
        char date[64];
        time_t now = time(NULL);
        strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
        kvb_json j;
        kvb_json_begin(&j, jf);
        kvb_json_obj(&j, "context");
        kvb_json_str(&j, "date", date);
        kvb_json_str(&j, "kvbench_git_revision", KVB_GIT_REV);
        kvb_json_str(&j, "kvbench_command_line", o->cmdline);
        kvb_json_str(&j, "shard", shard);
        if (visible) kvb_json_str(&j, "cuda_visible_devices", visible);
        if (o->timing_lock) kvb_json_str(&j, "timing_lock", o->timing_lock);
        kvb_json_close(&j);
        kvb_json_arr(&j, "benchmarks");
        kvb_json_close(&j);
        kvb_json_end(&j);
        if (kvb_outfile_commit(&jout) != KVB_OK) {
            fprintf(stderr, "kvbench: --json %s\n", kvb_last_error());
            status = 1;
        }
    }
    if (sf) {
        fprintf(sf, "| case | median us | min..max us | noise | rate | %% of ceiling | vs peers (same run) | goal |\n");
        fprintf(sf, "|---|---:|---:|---:|---:|---:|---|---|\n\nShard %s has no case: nothing was timed.\n", shard);
        if (kvb_outfile_commit(&sout) != KVB_OK) {
            fprintf(stderr, "kvbench: --summary %s\n", kvb_last_error());
            status = 1;
        }
    }
    return status;
}
