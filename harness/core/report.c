/* report.c: how results are shown: verdict tables and their JSON, the run's context, reproduce
 * lines (cli.h). The .npy dumps: dump.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness/core/cli.h"
#include "harness/core/shard.h"

#ifndef KVB_GIT_REV
#define KVB_GIT_REV "unknown"
#endif

void kvb_case_overrides(const kvb_case *c, char *buf, size_t n)
{
    /* each value in its shortest exact form: the reproduce line runs the same tolerance */
    static const char *const names[3] = {"atol", "rtol", "l2"};
    const double v[3] = {c->atol, c->rtol, c->l2};
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < 3 && len < n; i++) {
        if (v[i] < 0) continue;
        char num[32];
        kvb_format_double(num, sizeof num, v[i]);
        len += (size_t)snprintf(buf + len, n - len, "%s%s=%s", len ? " " : "", names[i], num);
    }
}

void kvb_case_repro(const kvb_case *c, char *buf, size_t n)
{
    /* tolerance overrides are not part of the id but change the verdict: the reproduce line has them */
    char ov[128];
    kvb_case_overrides(c, ov, sizeof ov);
    snprintf(buf, n, "%s%s%s", c->id, ov[0] ? " " : "", ov);
}

void kvb_bench_label(const kvb_case *c, const char *note, char *buf, size_t n)
{
    char ov[128], repro[KVB_ID_MAX + 128];
    kvb_case_overrides(c, ov, sizeof ov);
    size_t len = (size_t)snprintf(buf, n, "%s%soutputs of zeros caught by validation", note, note[0] ? "; " : "");
    if (!ov[0] || len >= n) return;
    kvb_case_repro(c, repro, sizeof repro);
    snprintf(buf + len, n - len, "; validated with tolerance overrides %s (reproduce: kvbench check \"%s\")", ov, repro);
}

void kvb_tolerance_json(kvb_json *j, const kvb_case *c)
{
    kvb_json_obj(j, "tolerance");
    const kvb_tol d = c->op->tol;
    kvb_json_num(j, "atol", c->atol >= 0 ? c->atol : d.atol);
    kvb_json_num(j, "rtol", c->rtol >= 0 ? c->rtol : d.rtol);
    kvb_json_num(j, "l2", c->l2 >= 0 ? c->l2 : d.l2);
    kvb_json_bool(j, "overridden", c->atol >= 0 || c->rtol >= 0 || c->l2 >= 0);
    kvb_json_str(j, "note", "op defaults; an op may set its own per output (shown per output)");
    kvb_json_close(j);
}

void kvb_context_json(kvb_json *j, const kvb_options *o, const kvb_ceilings *ceil)
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
    if (o->shard_n) kvb_json_str(j, "shard", kvb_shard_name(o->shard_k, o->shard_n));
    if (o->durations) kvb_json_str(j, "shard_durations", o->durations);
    const char *visible = getenv("CUDA_VISIBLE_DEVICES"); /* with a process per GPU, the device index */
    if (visible) kvb_json_str(j, "cuda_visible_devices", visible);
    if (ceil) kvb_ceilings_json(ceil, j);
    kvb_json_close(j);
}

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

static const char *const g_kinds[] = KVB_CMP_KIND_NAMES;

void kvb_print_verdict(kvb_run *r, const kvb_verdict *v)
{
    for (int i = 0; i < v->n; i++) {
        const kvb_cmp_result *c = &v->res[i];
        printf("      %-12s %-8s n=%-11lld bad=%-8lld nonfinite=%-5lld max_abs=%-10.3g tol=%6.1f%% relL2=%-10.3g %s",
               v->name[i], g_kinds[c->kind], (long long)c->n_checked, (long long)c->n_bad, (long long)c->n_nonfinite,
               c->max_abs, 100.0 * c->tol_used, c->rel_l2, c->pass ? "ok" : "FAIL");
        if (c->n_screened) printf("  (+%lld screened: finite, not poison)", (long long)c->n_screened);
        if (c->n_unscreened)
            printf("  (+%lld not screened: any bit pattern is a value)", (long long)c->n_unscreened);
        if (c->n_ref_nonfinite)
            printf("  (reference has %lld inf/NaN, matched exactly: non-finite inputs?)", (long long)c->n_ref_nonfinite);
        printf("\n");
        const kvb_tensor *t = kvb_run_find(r, v->name[i]);
        for (int k = 0; k < c->n_first && k < 4 && t; k++) {
            char at[96];
            unravel(t, c->first[k].index, at, sizeof at);
            printf("        mismatch %s%s: got %.9g, expected %.9g\n", v->name[i], at, c->first[k].out, c->first[k].ref);
        }
    }
    if (v->invariants_checked)
        printf("      invariants on every slice: %s\n", v->invariant_error[0] ? v->invariant_error : "ok");
}

void kvb_verdict_json(kvb_json *j, kvb_run *r, const kvb_verdict *v)
{
    kvb_json_arr(j, "outputs");
    for (int i = 0; i < v->n; i++) {
        const kvb_cmp_result *c = &v->res[i];
        const kvb_tensor *t = kvb_run_find(r, v->name[i]);
        kvb_json_obj(j, NULL);
        kvb_json_str(j, "name", v->name[i]);
        kvb_json_str(j, "compare", g_kinds[c->kind]);
        if (t && c->kind == KVB_CMP_FLOAT) {
            kvb_json_num(j, "atol", t->tol.atol);
            kvb_json_num(j, "rtol", t->tol.rtol);
            kvb_json_num(j, "l2", t->tol.l2);
        }
        kvb_json_int(j, "n_checked", c->n_checked);
        kvb_json_int(j, "n_screened", c->n_screened);
        kvb_json_int(j, "n_unscreened", c->n_unscreened);
        kvb_json_int(j, "n_bad", c->n_bad);
        kvb_json_int(j, "n_nonfinite", c->n_nonfinite);
        kvb_json_int(j, "n_ref_nonfinite", c->n_ref_nonfinite);
        kvb_json_num(j, "max_abs", c->max_abs);
        kvb_json_num(j, "tol_used_pct", 100.0 * c->tol_used);
        kvb_json_num(j, "rel_l2", c->rel_l2);
        kvb_json_bool(j, "pass", c->pass);
        kvb_json_arr(j, "first_mismatches");
        for (int k = 0; k < c->n_first && t; k++) {
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
    kvb_json_bool(j, "invariants_checked", v->invariants_checked);
    kvb_json_str(j, "invariant_error", v->invariant_error);
}
