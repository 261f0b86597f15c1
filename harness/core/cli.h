/* cli.h: what the kvbench subcommands share: parsed options, case selection, and the one path that
 * sets up and validates a case (check, bench and profile all go through kvb_case_prepare).
 *
 *   main.c     usage, list, ceilings, dispatch
 *   cli.c      options, case selection
 *   prepare.c  kvb_case_prepare: the one setup-and-validate path
 *   check.c    check and profile
 *   bench.c    bench (Google Benchmark through gbench_shim.h), peers, the summary with its clocks
 *   report.c   verdict tables, JSON of verdicts and context, reproduce lines
 *   dump.c     check --dump: .npy files and meta.json per case
 */
#ifndef KVB_CLI_H
#define KVB_CLI_H

#include <stdio.h>

#include "harness/core/ceilings.h"
#include "harness/core/exitcode.h"
#include "harness/core/files.h"
#include "harness/core/json.h"
#include "harness/core/nvml_probe.h"
#include "harness/core/op.h"

#define KVB_SAMPLE_TIME_DEFAULT_S 0.25

/* filters on one command line: a round's headline selection is ~70 case lines; a case file takes any number */
#define KVB_MAX_FILTERS 256

typedef struct kvb_options {
    const char *cmd;
    const char *cases_path; /* --cases; NULL: the default (kvb_cases_path) */
    int tier; /* bitmask of kvb_tier; 0 = the command's default */
    const char *json, *dump, *summary, *peers;
    int fault_zeros; /* check --fault zeros: validate outputs of zeros instead of launching (every case must fail) */
    int costs;       /* list --costs: each case's cost (kvb_selection_costs) and host bytes */
    const char *lines; /* list --lines FILE: each line of FILE judged on its own (accepted or refused) */
    const char *durations; /* --durations FILE: an earlier run's result file, whose wall times are the cases' costs
                              (--shard's split, the progress estimate; shard.h) */
    int determinism; /* check --determinism: launch each validated case again, outputs must be bitwise equal */
    double sample_time_s;     /* bench --sample-time: wall seconds of samples per case (0: KVB_SAMPLE_TIME_DEFAULT_S) */
    double host_mem_limit_gb; /* --host-mem-limit: the host memory a case may take (0: what the machine has free) */
    int shard_k, shard_n; /* --shard K/N (list, check, bench): run shard K of N of the selected cases (shard.h); 0: all */
    const char *timing_lock; /* bench --timing-lock FILE: each case's timing holds flock(2) on FILE (timing_lock.h) */
    const char *filters[KVB_MAX_FILTERS];
    int n_filters;
    char *gb_argv[64];
    int gb_argc;
    char cmdline[2048];
} kvb_options;

/* Whether the selection is costed as bench's (timed: timing loops included): bench, and list of the
 * bench tier alone (what bench selects by default); check's otherwise. */
int kvb_selection_timed(const kvb_options *o);
/* The cost of each case of l that --shard balances (kvb_case_costs with o->durations), or NULL after a
 * message naming the problem (an unusable --durations file). Free with kvb_xfree. */
double *kvb_selection_costs(const kvb_options *o, const kvb_case_list *l);

/* The options of argv (argv[1] the command); pointers into argv are kept. 0, -1 without a command
 * (usage), or 2 after a message on stderr. Parses only: nothing is loaded or run. */
int kvb_parse_options(int argc, char **argv, kvb_options *o);
/* 2 after a message naming the argument when an argument is not valid UTF-8, else 0. */
int kvb_args_utf8(int argc, char **argv);
/* The case file or directory: --cases, else $KVB_CASES, else the cases/ of this binary's tree
 * (<bin>/../cases in a bundle, <bin>/../../cases in the build tree), else ./cases. NULL, with
 * kvb_last_error() naming every place looked at, when there is none. */
const char *kvb_cases_path(const kvb_options *o);
/* 2 after a message naming both when a result file (--json, --summary) is also an input of the command
 * (a case file, --peers) or the other result file; else 0. */
int kvb_check_paths(const kvb_options *o);
/* The cases the command runs: the case lines given (in order), then the case files' cases of the tier
 * (default_tier unless --tier) that a filter selects (all of them without a filter). Refused (2, a
 * message on stderr): a bad case line or case file, a filter that selects no case. A case given twice
 * (the same case line twice, or a case line that is also a selected file case) is kept once, the first
 * given, and said so on stderr. With --shard K/N, then only shard K's cases (shard.h), split by bench's
 * estimate for bench (and for list --tier bench), by check's otherwise; a shard that gets none is
 * said so on stderr and returns 0 with out->n == 0. */
int kvb_select_cases(const kvb_options *o, int default_tier, kvb_case_list *out);
int kvb_is_case_line(const char *arg);

/* ---- the one setup-and-validate path ---- */
typedef enum { KVB_PASS, KVB_FAIL, KVB_SKIP } kvb_status;

typedef struct kvb_outcome {
    kvb_status status;
    const char *why;  /* short: "output differs from the reference", "launch rejected", ... */
    char msg[600];    /* the error, when there is one */
    kvb_verdict v;    /* the comparison of the validating launch */
} kvb_outcome;

/* Set up case c (inputs, reference, its invariants), then, when a device is usable, allocate, upload,
 * run the op's GPU setup and validate one launch: every output compared with the reference (and, on
 * slices a sampled reference skips, screened for non-finite or poison values and the op's
 * invariants). Guarded: a failed CUDA call or host allocation fails this case by name. Returns the
 * status; r stays live (kvb_run_teardown) unless the setup itself failed. */
kvb_status kvb_case_prepare(kvb_run *r, const kvb_case *c, const kvb_ceilings *ceil, kvb_outcome *o);
/* Fault injection: set up case c and validate outputs that are all zeros (what a kernel that writes
 * nothing useful leaves), through the same comparison and invariants as a real launch, no device
 * needed. KVB_FAIL is the expected outcome (the fault was caught); KVB_PASS means validation is blind
 * to it. */
kvb_status kvb_case_validate_zeros(kvb_run *r, const kvb_case *c, kvb_outcome *o);
/* The same on a live, validated run (bench, before timing), with no second reference: 1 when outputs
 * of zeros would fail this case's validation; -1 when its host memory could not be had (kvb_last_error()).
 * Guarded itself: call it outside a case guard. */
int kvb_run_zeros_caught(kvb_run *r);
/* Validate again (bench: after timing), guarded. */
kvb_status kvb_case_revalidate(kvb_run *r, kvb_outcome *o);

/* ---- report.c ---- */
void kvb_case_overrides(const kvb_case *c, char *buf, size_t n); /* "atol=.. rtol=.. l2=..", those given */
void kvb_case_repro(const kvb_case *c, char *buf, size_t n);     /* id plus any tolerance overrides */
/* A benchmark's label (its JSON "label"; the benchmark's name is the id, which has no overrides): the
 * run's note, the zeros check, and the tolerance overrides with the line that reproduces the verdict. */
void kvb_bench_label(const kvb_case *c, const char *note, char *buf, size_t n);
void kvb_print_verdict(kvb_run *r, const kvb_verdict *v);
void kvb_verdict_json(kvb_json *j, kvb_run *r, const kvb_verdict *v);
void kvb_tolerance_json(kvb_json *j, const kvb_case *c);
void kvb_context_json(kvb_json *j, const kvb_options *o, const kvb_ceilings *ceil);

/* ---- dump.c: check --dump DIR ---- */
/* Create DIR (and its missing parents) and prove it writable, before any case runs: KVB_OK, or KVB_EIO
 * with kvb_last_error() naming the path. */
int kvb_dump_prepare(const char *dir);
/* Write r's arrays into DIR/<case id, spaces as '_'>/ with meta.json (what each file holds: role,
 * dtype, shape, whether the reference is computed, sampled (its skipped slices NaN or -1, and a
 * <name>.ref_mask.npy) or absent). Only computed data: no input or reference after a setup that
 * failed part way, no .ref.npy for an output without a reference (KVB_T_NO_REF), no .out.npy before a
 * finished download; files of an earlier dump that this one does not write are removed. KVB_OK, or
 * KVB_EIO naming the file that could not be written. */
int kvb_dump_run(const char *dir, kvb_run *r);

/* ---- bench.c: one row of the summary, and its clocks section (exported for tests) ---- */
struct kvb_peers;
typedef struct kvb_bench_result {
    const kvb_case *c;
    kvb_cost cost;
    double ceiling_s, median_s, min_s, max_s, noise;
    int done, failed;
    const char *error;
    kvb_clock_record clocks; /* the reported loop's (nvml_probe.h) */
} kvb_bench_result;
int kvb_ceiling_suspect(double pct_of_ceiling); /* above 100%: the ceiling is wrong */
void kvb_bench_summary_row(FILE *f, const kvb_bench_result *x, const kvb_bench_result *all, int n,
                           const struct kvb_peers *peers);
/* The clocks each timed case ran under, start -> end of its loop, with the flagged ones' reasons;
 * `nvml_unavailable` non-NULL: one line saying so instead. Returns the number of cases flagged. */
int kvb_bench_clock_summary(FILE *f, const kvb_bench_result *res, int n, const char *nvml_unavailable,
                            double power_limit_w);

int kvb_cmd_check(const kvb_options *o);
int kvb_cmd_profile(const kvb_options *o);
int kvb_cmd_bench(const kvb_options *o);
/* bench of an empty shard (shard.c): --json a bench file of no case (its context, "benchmarks": []),
 * --summary a table of no row; no device needed. 0, or 1 when a file could not be written. */
int kvb_bench_write_empty(const kvb_options *o);
/* merge.c: `kvbench merge OUT.json IN.json...`, the arguments after "merge" */
int kvb_merge_main(int argc, char **argv);
/* kvb_compare_main: compare_results.h */

#endif
