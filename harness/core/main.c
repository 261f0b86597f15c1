/* main.c: the kvbench command line: options, case selection, `list`, and dispatch to the
 * subcommands (check.c, bench.c, compare_results.c; cli.h says which file holds what).
 *
 *   kvbench list     [FILTER...] [--costs]       case ids (all tiers unless --tier), with the shards' cost estimate
 *   kvbench kernels  [KERNEL|FAMILY...] [--json F]   each kernel's keys (range, default) and implementations
 *   kvbench check    [FILTER...] [--json F] [--dump DIR]   CUDA vs reference, exit 1 on a failure
 *   kvbench bench    [FILTER...] [--json F] [--summary F] [--peers F] [--benchmark_*...]
 *   kvbench ceilings [--json F]                  this device's copy and read bandwidths, matrix rate
 *   kvbench profile  CASE                        validate, warm up, then exactly one profiled launch
 *   kvbench compare  BASE.json NEW.json [--threshold PCT] [--subset]   the regression gate
 *   kvbench merge    OUT.json IN.json... [--summary F]   result files of shards (--shard K/N) into one
 *
 *   kvbench --version                            the revision and the CUDA runtime it was built with
 *
 * FILTER is a case line (`kernel key=value ...`, run as given), a kernel name (that kernel's cases)
 * or a substring of case ids.
 * Common options: --tier smoke|check|bench|sanitize|all, --cases PATH (default: kvb_cases_path, cli.h),
 * --host-mem-limit GB, --shard K/N (shard.h). Exit statuses: exitcode.h.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness/core/cli.h"
#include "harness/core/compare_results.h"
#include "harness/core/shard.h"
#include "harness/core/timing_lock.h"

#ifndef KVB_GIT_REV
#define KVB_GIT_REV "unknown"
#endif

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvbench <command> [FILTER...] [options]\n"
            "  list     [FILTER...] [--costs]            list case ids; --costs: each case's cost in seconds, as\n"
            "                                            --shard balances it (bench's with --tier bench, else\n"
            "                                            check's), and its host memory estimate in MB\n"
            "           --lines FILE                     each line of FILE on its own: its id, or 'refused' and why\n"
            "  kernels  [KERNEL|FAMILY...] [--json F]    each kernel's keys (range or values, default) and its\n"
            "                                            implementations (all kernels without a name); --json: as data\n"
            "  check    [FILTER...] [--json F] [--dump DIR] [--determinism]\n"
            "                                            run CUDA and the C reference, compare; exit 1 on a failure\n"
            "           --fault zeros                    fault injection, no device needed: validate outputs of\n"
            "                                            zeros; exit 0 only when every case catches them\n"
            "           --determinism                    launch each validated case again: its outputs must be\n"
            "                                            bitwise equal to the first launch's (where the kernel\n"
            "                                            says why its bits vary: validate)\n"
            "  bench    [FILTER...] [--json F] [--summary F] [--peers F] [--sample-time S] [--benchmark_<flag>=...]\n"
            "                                            validate, time through Google Benchmark, validate again;\n"
            "                                            samples for S s of wall time a case (default 0.25, >= 10)\n"
            "                                            --peers: external peers timed in the same round\n"
            "                                            (harness/scripts/torch_peers.py)\n"
            "           --timing-lock FILE               each case's timing holds flock(2) on FILE: exclusive when it\n"
            "                                            reads pinned host memory, else shared (processes timing on\n"
            "                                            several GPUs of one host: host-bound cases are timed alone)\n"
            "  ceilings [--json F]                       measure copy and read bandwidths and the bf16 matrix rate\n"
            "  profile  CASE                             one launch of CASE between cudaProfilerStart/Stop\n"
            "  compare  BASE.json NEW.json [--threshold PCT] [--json F] [--subset]\n"
            "                                            the regression gate: per case SLOWER/FASTER (beyond the\n"
            "                                            threshold, default 5%%, and 3 standard errors of the medians),\n"
            "                                            MISSING, FAILED, NEW; exit 1 on a regression, a missing or a\n"
            "                                            failed case, 2 on an unusable file; --subset: NEW ran part\n"
            "                                            of BASE on purpose, BASE's other cases are left out\n"
            "  merge    OUT.json IN.json [IN.json ...] [--summary F]\n"
            "                                            result files of one kind (check or bench) and revision, of\n"
            "                                            disjoint cases (the shards of a run), into one; bench:\n"
            "                                            --summary F, the summary table; exit 2 on a refused input\n"
            "  --version                                 the git revision and the CUDA runtime of this build\n"
            "FILTER: a case line in quotes (\"gather_copy B=8 hit=0.6\"), a kernel name (its cases only)\n"
            "        or a substring of case ids; a filter that selects no case is refused; a case given twice\n"
            "        on the command line (or also in a case file) runs once; one id twice in the case files is\n"
            "        refused\n"
            "options: --tier smoke|check|bench|sanitize|all\n"
            "         --cases FILE_OR_DIR   default: $KVB_CASES, else the cases/ of this binary's tree\n"
            "                               (<bin>/../cases, <bin>/../../cases), else ./cases\n"
            "         --host-mem-limit GB   host memory a case may take (default: what the machine has free);\n"
            "                               a case estimated above it fails before anything is allocated\n"
            "         --shard K/N           (list, check, bench) only shard K of N of the selected cases, split\n"
            "                               by estimated cost (1 <= K <= N <= 64); a shard may get none (exit 0);\n"
            "                               list splits as check does, or with --tier bench as bench does\n"
            "         --durations FILE      (check, bench; list with --shard or --costs) each case's cost is its\n"
            "                               wall time in an earlier run's result file (check or bench JSON,\n"
            "                               merged or not; a case it lacks: its estimate scaled to the file's\n"
            "                               seconds): --shard's split and the progress line's estimate\n"
            "result files (--json, --summary) are written whole or not at all (a temporary renamed over them),\n"
            "and never over an input of the same command\n"
            "exit status: 0    everything ran and passed (compare: the gate passes)\n"
            "             1    a case failed (compare: a regression, a missing or a failed case)\n"
            "             2    usage or input refused (options, case lines, case files, result files): nothing ran\n"
            "             3    nothing was measured: no usable CUDA device (every case skipped)\n"
            "             130  interrupted by SIGINT (143: SIGTERM) between cases: the result files hold the\n"
            "                  cases finished\n");
}

static int cmd_version(void)
{
    const int v = kvb_cuda_runtime_version();
    char cuda[32];
    if (v > 0) snprintf(cuda, sizeof cuda, "%d.%d", v / 1000, v % 1000 / 10);
    else snprintf(cuda, sizeof cuda, "not built");
    printf("kvbench %s (CUDA %s)\n", KVB_GIT_REV, cuda);
    return 0;
}

static int cmd_ceilings(const kvb_options *o)
{
    if (!kvb_gpu_available()) {
        printf("kvbench ceilings: %s; nothing measured\n", kvb_gpu_unavailable_reason());
        return KVB_EXIT_NOTHING_MEASURED;
    }
    kvb_outfile out;
    FILE *f = NULL;
    if (o->json && !(f = kvb_outfile_open(&out, o->json))) {
        fprintf(stderr, "kvbench: --json %s\n", kvb_last_error());
        return 2;
    }
    kvb_ceilings c;
    kvb_ceilings_measure(&c);
    kvb_ceilings_print(&c);
    if (f) {
        kvb_json j;
        kvb_json_begin(&j, f);
        kvb_context_json(&j, o, &c);
        kvb_json_end(&j);
        if (kvb_outfile_commit(&out) != KVB_OK) {
            fprintf(stderr, "kvbench: --json %s\n", kvb_last_error());
            return 1;
        }
    }
    return 0;
}

/* list --lines FILE: each line of FILE parsed on its own, the suite's case files not loaded: "N  TIER  ID"
 * (with --costs "N  TIER  COST  MB  ID", as list prints them) for an accepted line, "N  refused  MESSAGE"
 * for a refused one (N: the line number; blank and comment lines print nothing). Exit 0 when every line
 * is accepted, 2 when one is refused or the file cannot be read. One process judges many drawn lines
 * (tests/fuzz/gpu_sweep.py). */
static int list_lines(const kvb_options *o)
{
    char *text;
    size_t len;
    if (kvb_read_file(o->lines, &text, &len) != KVB_OK) {
        fprintf(stderr, "kvbench: --lines %s\n", kvb_last_error());
        return 2;
    }
    int refused = 0, lineno = 0;
    const int timed = kvb_selection_timed(o);
    for (const char *line = text, *next; *line; line = next) {
        size_t n;
        next = kvb_line_next(line, &n);
        lineno++;
        char where[64];
        snprintf(where, sizeof where, "line %d", lineno);
        kvb_case c;
        const size_t bad = kvb_utf8_invalid_at(line, n);
        int rc = bad < n ? kvb_fail(KVB_EINVAL, "%s: not valid UTF-8 (byte 0x%02x at column %zu)", where,
                                    (unsigned char)line[bad], bad + 1)
                         : kvb_case_parse(line, where, &c);
        if (rc == KVB_CASE_BLANK) continue;
        if (rc != KVB_OK) {
            const char *msg = kvb_last_error();
            if (!strncmp(msg, where, strlen(where)) && !strncmp(msg + strlen(where), ": ", 2)) msg += strlen(where) + 2;
            printf("%d  refused  %s\n", lineno, msg); /* the line number once, not "line N:" again */
            refused++;
            continue;
        }
        char repro[KVB_ID_MAX + 128];
        kvb_case_repro(&c, repro, sizeof repro);
        if (o->costs)
            printf("%d  %-5s  %8.2f  %10.1f  %s\n", lineno, kvb_tier_name(c.tier), kvb_case_cost_estimate(&c, timed),
                   (double)kvb_case_host_bytes(&c) / 1e6, repro);
        else printf("%d  %-5s  %s\n", lineno, kvb_tier_name(c.tier), repro);
    }
    free(text);
    return refused ? 2 : 0;
}

static int cmd_list(const kvb_options *o)
{
    if (o->lines) return list_lines(o);
    kvb_case_list cases;
    int rc = kvb_select_cases(o, KVB_TIER_ALL, &cases);
    if (rc) return rc;
    if (cases.n == 0 && o->shard_n) return 0; /* an empty shard, said so */
    if (cases.n == 0) {
        fprintf(stderr, "kvbench: no case matches\n");
        return 2;
    }
    double *cost = o->costs ? kvb_selection_costs(o, &cases) : NULL;
    if (o->costs && !cost) {
        kvb_cases_free(&cases);
        return 2;
    }
    for (int i = 0; i < cases.n; i++) { /* the id, and the tolerance overrides a case line gave */
        char repro[KVB_ID_MAX + 128];
        const kvb_case *c = &cases.v[i];
        kvb_case_repro(c, repro, sizeof repro);
        if (cost) printf("%-5s  %8.2f  %10.1f  %s\n", kvb_tier_name(c->tier), cost[i], (double)kvb_case_host_bytes(c) / 1e6, repro);
        else printf("%-5s  %s\n", kvb_tier_name(c->tier), repro);
    }
    kvb_xfree(cost);
    kvb_cases_free(&cases);
    return 0;
}

/* Whether op is named by a filter of kernels: its kernel name or its family. */
static int kernel_selected(const kvb_op *op, const kvb_options *o)
{
    if (!o->n_filters) return 1;
    for (int f = 0; f < o->n_filters; f++)
        if (!strcmp(o->filters[f], op->name) || !strcmp(o->filters[f], op->family)) return 1;
    return 0;
}

static void kernel_json(kvb_json *j, const kvb_op *op)
{
    kvb_json_obj(j, NULL);
    kvb_json_str(j, "name", op->name);
    kvb_json_str(j, "family", op->family);
    kvb_json_str(j, "summary", op->summary);
    kvb_json_arr(j, "keys");
    for (int k = 0; k < op->n_params; k++) {
        const kvb_param *p = &op->params[k];
        char text[512];
        kvb_json_obj(j, NULL);
        kvb_json_str(j, "name", p->name);
        kvb_json_str(j, "type", p->type == KVB_P_INT ? "int" : p->type == KVB_P_FLOAT ? "float" : "enum");
        if (p->type == KVB_P_ENUM) {
            kvb_param_range_text(op, p, text, sizeof text);
            kvb_json_str(j, "choices", text);
        } else {
            kvb_json_num(j, "lo", p->lo);
            kvb_json_num(j, "hi", p->hi);
            if (p->choices) kvb_json_str(j, "choices", p->choices); /* an int key's only values, "64|128" */
        }
        kvb_param_value_text(op, p, p->def, text, sizeof text);
        kvb_json_str(j, "default", text);
        kvb_json_str(j, "help", p->help ? p->help : "");
        const char *only_with = kvb_param_only_with(op, p);
        if (only_with) kvb_json_str(j, "only_with", only_with); /* read only there; elsewhere the default */
        kvb_json_close(j);
    }
    kvb_json_close(j);
    kvb_json_arr(j, "impls");
    for (int k = 0; k < op->n_impls; k++) {
        kvb_json_obj(j, NULL);
        kvb_json_str(j, "name", op->impls[k].name);
        kvb_json_str(j, "about", op->impls[k].about);
        kvb_json_bool(j, "wall_timed", op->impls[k].wall_timed);
        kvb_json_close(j);
    }
    kvb_json_close(j);
    kvb_json_close(j);
}

/* kvbench kernels [KERNEL|FAMILY...] [--json F]: each kernel's keys with their ranges (or listed values)
 * and defaults, and its implementations; --json writes the same as data (tests/fuzz/gpu_sweep.py draws
 * cases from it). */
static int cmd_kernels(const kvb_options *o)
{
    const char *stray = o->tier ? "--tier" : o->cases_path ? "--cases" : o->dump ? "--dump" : o->summary ? "--summary"
                      : o->peers ? "--peers" : o->fault_zeros ? "--fault" : o->determinism ? "--determinism"
                      : o->sample_time_s > 0 ? "--sample-time" : o->host_mem_limit_gb > 0 ? "--host-mem-limit"
                      : o->gb_argc > 1 ? o->gb_argv[1] : NULL;
    if (stray) {
        fprintf(stderr, "kvbench: %s is not an option of kernels (it takes kernel or family names and --json F)\n",
                stray);
        return 2;
    }
    for (int f = 0; f < o->n_filters; f++) {
        int known = 0;
        for (int i = 0; i < kvb_op_count() && !known; i++)
            known = !strcmp(o->filters[f], kvb_op_at(i)->name) || !strcmp(o->filters[f], kvb_op_at(i)->family);
        if (!known) {
            char names[4096];
            kvb_list_kernels(names, sizeof names);
            fprintf(stderr, "kvbench: kernels %s: not a kernel or a family; kernels: %s\n", o->filters[f], names);
            return 2;
        }
    }
    kvb_outfile out;
    FILE *f = NULL;
    if (o->json && !(f = kvb_outfile_open(&out, o->json))) {
        fprintf(stderr, "kvbench: --json %s\n", kvb_last_error());
        return 2;
    }
    kvb_json j;
    if (f) {
        kvb_json_begin(&j, f);
        kvb_json_arr(&j, "kernels");
    }
    for (int i = 0; i < kvb_op_count(); i++) {
        const kvb_op *op = kvb_op_at(i);
        if (!kernel_selected(op, o)) continue;
        if (f) kernel_json(&j, op);
        printf("%s (%s): %s\n", op->name, op->family, op->summary);
        for (int k = 0; k < op->n_params; k++) {
            const kvb_param *p = &op->params[k];
            char range[512], def[64];
            kvb_param_range_text(op, p, range, sizeof range);
            kvb_param_value_text(op, p, p->def, def, sizeof def);
            const char *only_with = kvb_param_only_with(op, p);
            printf("  %-14s %-24s default %-10s %s%s%s%s\n", p->name, range, def, p->help ? p->help : "",
                   only_with ? " [read only with " : "", only_with ? only_with : "", only_with ? "]" : "");
        }
        for (int k = 0; k < op->n_impls; k++)
            printf("  impl=%-14s %s%s\n", op->impls[k].name, op->impls[k].about,
                   op->impls[k].wall_timed ? " [wall-timed: includes host work]" : "");
    }
    if (f) {
        kvb_json_close(&j);
        kvb_json_end(&j);
        if (kvb_outfile_commit(&out) != KVB_OK) {
            fprintf(stderr, "kvbench: --json %s\n", kvb_last_error());
            return 1;
        }
    }
    return 0;
}

int main(int argc, char **argv)
{
    /* arguments reach messages and JSON files: valid UTF-8 only */
    if (kvb_args_utf8(argc, argv)) return 2;
    /* compare and merge have options of their own: they parse their arguments themselves */
    if (argc >= 2 && !strcmp(argv[1], "compare")) return kvb_compare_main(argc - 2, argv + 2);
    if (argc >= 2 && !strcmp(argv[1], "merge")) return kvb_merge_main(argc - 2, argv + 2);
    if (argc >= 2 && (!strcmp(argv[1], "--version") || !strcmp(argv[1], "version"))) return cmd_version();
    kvb_options o;
    int rc = kvb_parse_options(argc, argv, &o);
    if (rc < 0 || !o.cmd || !strcmp(o.cmd, "help") || !strcmp(o.cmd, "--help") || !strcmp(o.cmd, "-h")) {
        usage(rc < 0 ? stderr : stdout);
        return rc < 0 ? 2 : 0;
    }
    if (rc) return rc;
    if ((rc = kvb_check_paths(&o))) return rc;
    if (o.timing_lock && kvb_timing_lock_open(o.timing_lock) != KVB_OK) {
        fprintf(stderr, "kvbench: --timing-lock %s\n", kvb_last_error());
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (!strcmp(o.cmd, "list")) return cmd_list(&o);
    if (!strcmp(o.cmd, "kernels")) return cmd_kernels(&o);
    /* SIGINT / SIGTERM end check and bench at the next case, with their result files written */
    if (!strcmp(o.cmd, "check") || !strcmp(o.cmd, "bench")) kvb_interrupt_install();
    if (!strcmp(o.cmd, "check")) return kvb_cmd_check(&o);
    if (!strcmp(o.cmd, "bench")) return kvb_cmd_bench(&o);
    if (!strcmp(o.cmd, "ceilings")) return cmd_ceilings(&o);
    if (!strcmp(o.cmd, "profile")) return kvb_cmd_profile(&o);
    fprintf(stderr, "kvbench: unknown command '%s'\n", o.cmd);
    usage(stderr);
    return 2;
}
