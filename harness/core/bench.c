/* bench.c: `kvbench bench`: Google Benchmark through the C shim (gbench_shim.h), one benchmark per
 * case, manual time from CUDA events (timing.h), every case validated before and after its timing
 * loop, counters stated against the ceiling measured in the same run and against the peers of the
 * same run (in-suite impls of the same shape; external ones from --peers), and the clocks, temperature,
 * power and clock-event reasons each loop ran under (nvml_probe.h), sampled just outside it. */
#include <math.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness/core/cli.h"
#include "harness/core/compare_results.h"
#include "harness/core/gbench_shim.h"
#include "harness/core/json_read.h"
#include "harness/core/peers.h"
#include "harness/core/progress.h"
#include "harness/core/shard.h"
#include "harness/core/timing.h"
#include "harness/core/timing_lock.h"

#ifndef KVB_GIT_REV
#define KVB_GIT_REV "unknown"
#endif

typedef struct bench_ctx {
    const kvb_case *c;
    const kvb_ceilings *ceil;
    const kvb_peers *peers;
    kvb_run run;
    kvb_timed timed;
    kvb_cost cost;
    double ceiling_s; /* the ceiling's time for the same work, this run */
    int live;
    double cost_est;    /* kvb_selection_costs: the progress line's estimate */
    double timing_from; /* kvb_wall_now() when the warm-up began: the timing phase runs to bench_finish */
    kvb_sample_stats st; /* the reported loop, for the summary */
    kvb_clock_record clocks; /* the last loop's */
    int done, failed;
    int lock_mode; /* --timing-lock: what this case's timing holds (timing_lock.h), until bench_release */
    char error[1600];
    char label[2048]; /* the case's note, then "; stages: " and each stage in run order */
    struct bench_ctx *all; /* every case of the run, for goals against another impl */
    int n_all;
} bench_ctx;

static void shape_key(const char *id, char *out, size_t n);

/* A goal against another impl of the same shape (kvb_cost.goal_impl): its measured median over the
 * speedup asked for; no goal while that impl has no result. */
static void resolve_impl_goal(bench_ctx *b)
{
    if (!b->cost.goal_impl) return;
    char key[KVB_ID_MAX], other[KVB_ID_MAX], want[80];
    shape_key(b->c->id, key, sizeof key);
    snprintf(want, sizeof want, " impl=%s", b->cost.goal_impl);
    b->cost.goal_us = 0;
    for (int k = 0; k < b->n_all; k++) {
        const bench_ctx *x = &b->all[k];
        const char *impl = strstr(x->c->id, " impl=");
        if (x == b || !x->done || !impl || strcmp(impl, want)) continue;
        shape_key(x->c->id, other, sizeof other);
        if (!strcmp(key, other)) b->cost.goal_us = x->st.median * 1e6 / b->cost.goal_impl_speedup;
    }
}

static void bench_reset(void *p) { kvb_run_reset(&((bench_ctx *)p)->run); }

/* KVB_BENCH_REPEAT=n launches each case n times per timed iteration: a deliberate slowdown, for the
 * regression gate's self-test (harness/scripts/gate.sh). Never set in a real round; the JSON context records it. */
static int bench_repeat(void)
{
    static int n = -1;
    if (n < 0) {
        const char *env = getenv("KVB_BENCH_REPEAT");
        n = env && *env ? atoi(env) : 1;
        if (n < 1 || n > 100) {
            fprintf(stderr, "kvbench bench: KVB_BENCH_REPEAT=%s out of range [1, 100]: using 1\n", env);
            n = 1;
        }
    }
    return n;
}

static void bench_work(void *p)
{
    bench_ctx *b = p;
    for (int i = 0; i < bench_repeat(); i++)
        if (kvb_run_launch(&b->run) != KVB_OK) kvb_guard_fail(); /* kvb_last_error() names the rejection */
}

static int bench_fail(bench_ctx *b, const char *what, const char *detail)
{
    char repro[KVB_ID_MAX + 128];
    kvb_case_repro(b->c, repro, sizeof repro); /* with its tolerance overrides: the verdict's own line */
    snprintf(b->error, sizeof b->error, "%s%s%s (reproduce: kvbench check \"%s\")", what, detail && *detail ? ": " : "",
             detail ? detail : "", repro);
    b->failed = 1;
    return kvb_fail(KVB_EINVAL, "%s", b->error);
}

static int prepare_case(bench_ctx *b);

/* set-up and validation are most of a large case's wall time: the progress line covers them and is
 * gone before Google Benchmark prints the case's line */
#define NOT_RUN_INTERRUPTED "interrupted: not run"

static int bench_prepare(void *p)
{
    bench_ctx *b = p;
    /* SIGINT / SIGTERM: the cases after it are not run (and dropped from the JSON: kvb_cmd_bench) */
    if (kvb_interrupted()) {
        kvb_nvtx_push(b->c->id); /* bench_release pops it */
        return kvb_fail(KVB_EINVAL, NOT_RUN_INTERRUPTED);
    }
    const int index = (int)(b - b->all);
    double done = 0, total = 0; /* the progress line's estimate of what is left */
    for (int k = 0; k < b->n_all; k++) total += b->all[k].cost_est, done += k < index ? b->all[k].cost_est : 0;
    kvb_progress_cost("bench", index + 1, b->n_all, b->c->id, done, total);
    int rc = prepare_case(b);
    kvb_progress_clear();
    return rc;
}

static int prepare_case(bench_ctx *b)
{
    kvb_nvtx_push(b->c->id);
    kvb_outcome out;
    kvb_status st = kvb_case_prepare(&b->run, b->c, b->ceil, &out);
    b->live = 1;
    if (kvb_interrupted()) return kvb_fail(KVB_EINVAL, NOT_RUN_INTERRUPTED); /* not timed: dropped like the rest */
    kvb_bench_label(b->c, b->run.note, b->label, sizeof b->label);
    if (st != KVB_PASS) {
        kvb_print_verdict(&b->run, &out.v);
        return bench_fail(b, st == KVB_SKIP ? "skipped" : "validation before timing failed", *out.msg ? out.msg : out.why);
    }
    /* The validation must be able to fail: outputs of zeros checked against the same reference
     * (every bench case, no second reference computed) */
    const double t0 = kvb_wall_now();
    const int zeros = kvb_run_zeros_caught(&b->run);
    b->run.wall_s[KVB_PH_VALIDATE] += kvb_wall_now() - t0;
    if (zeros < 0) return bench_fail(b, "the zeros check failed", kvb_last_error());
    if (!zeros) return bench_fail(b, "validation is blind", "outputs of zeros pass this case's comparison");
    const int lock = kvb_timing_lock_acquire(kvb_run_timing_exclusive(&b->run), &b->lock_mode);
    if (lock > 0) return kvb_fail(KVB_EINVAL, NOT_RUN_INTERRUPTED);
    if (lock < 0) return bench_fail(b, "the timing lock failed", kvb_last_error());
    jmp_buf jb;
    if (setjmp(*kvb_guard_enter(&jb))) {
        kvb_guard_leave();
        char m[600];
        snprintf(m, sizeof m, "%s", kvb_last_error());
        return bench_fail(b, "warm-up failed", m);
    }
    b->timed = (kvb_timed){bench_reset, bench_work, b, b->run.stream, kvb_run_wall_timed(&b->run)};
    b->timing_from = kvb_wall_now();
    for (int i = 0; i < 3; i++) kvb_time_once(&b->timed); /* warm-up */
    memset(&b->cost, 0, sizeof b->cost);
    b->run.op->cost(&b->run, &b->cost);
    b->ceiling_s = kvb_ceiling_seconds(&b->cost, b->ceil);
    if (b->cost.goal_peer) { /* a goal against an external peer exists only when that peer ran */
        const kvb_peer *q = kvb_peer_find(b->peers, b->c, b->cost.goal_peer);
        b->cost.goal_us = q ? b->cost.goal_peer_ratio * q->median_us : 0;
    }
    kvb_guard_leave();
    return 0;
}

static double g_sm_max_mhz = -1; /* the device's, once per run */

static void bench_loop_begin(void *p) { kvb_nvml_sample(&((bench_ctx *)p)->clocks.start); }

static double bench_iterate(void *p)
{
    bench_ctx *b = p;
    jmp_buf jb;
    if (setjmp(*kvb_guard_enter(&jb))) {
        kvb_guard_leave();
        char m[600];
        snprintf(m, sizeof m, "%s", kvb_last_error());
        bench_fail(b, "failed during timing", m);
        return -1;
    }
    double t = kvb_time_once(&b->timed);
    kvb_guard_leave();
    return t;
}

/* A counter for the JSON; a non-finite value (a rate of an empty case) is left out. A full table is
 * said on stderr, never dropped silently. */
static void add_counter(kvb_counter *out, int *n, const char *name, double v)
{
    if (!isfinite(v)) return;
    if (*n >= KVB_MAX_COUNTERS) {
        fprintf(stderr, "kvbench bench: counter %s left out: the table holds %d (KVB_MAX_COUNTERS)\n", name,
                KVB_MAX_COUNTERS);
        return;
    }
    snprintf(out[*n].name, sizeof out[*n].name, "%s", name);
    out[*n].value = v;
    (*n)++;
}

/* a clock reading as a counter: absent where NVML could not read it */
static void add_clock_counter(kvb_counter *out, int *n, const char *name, double v)
{
    if (v >= 0) add_counter(out, n, name, v);
}

static void add_clock_counters(kvb_counter *out, int *n, const kvb_clock_record *c)
{
    const kvb_clock_sample *s[2] = {&c->start, &c->end};
    const char *when[2] = {"start", "end"};
    char name[40];
    for (int i = 0; i < 2; i++) {
        if (!s[i]->valid) continue;
#define CLOCK_COUNTER(what, v) (snprintf(name, sizeof name, what "_%s", when[i]), add_clock_counter(out, n, name, v))
        CLOCK_COUNTER("clock_sm_mhz", s[i]->sm_mhz);
        CLOCK_COUNTER("clock_mem_mhz", s[i]->mem_mhz);
        CLOCK_COUNTER("gpu_temp_c", s[i]->temp_c);
        CLOCK_COUNTER("gpu_power_w", s[i]->power_w);
        if (s[i]->have_reasons) CLOCK_COUNTER("clock_event_reasons", (double)s[i]->reasons);
#undef CLOCK_COUNTER
    }
    if (c->start.valid && c->end.valid) add_counter(out, n, "clock_flagged", kvb_clock_flag(c, NULL, 0));
}

static int bench_finish(void *p, const double *samples, int n, kvb_counter *out, int *n_out)
{
    bench_ctx *b = p;
    kvb_nvml_sample(&b->clocks.end); /* first: right after the loop's last sample */
    b->clocks.sm_max_mhz = g_sm_max_mhz;
    b->run.wall_s[KVB_PH_TIMING] = kvb_wall_now() - b->timing_from;
    kvb_outcome o;
    if (kvb_case_revalidate(&b->run, &o) != KVB_PASS) {
        kvb_print_verdict(&b->run, &o.v);
        return bench_fail(b, "validation after timing failed", *o.msg ? o.msg : o.why);
    }
    kvb_stats(samples, n, &b->st);
    b->done = 1;
    resolve_impl_goal(b);
    /* compositions: more launches, outside the timed loop, recording each stage's device time; the
     * median of STAGE_RUNS per stage (the first launch of the stage-timed plan alone can be several
     * times slower in its GEMMs) */
    b->run.n_stages = 0;
    if (b->run.op->stage_times) {
        enum { STAGE_RUNS = 7 };
        const double stages_from = kvb_wall_now();
        double ms[STAGE_RUNS][KVB_RUN_MAX_STAGES];
        volatile int runs = 0; /* read after a longjmp */
        jmp_buf jb;
        if (setjmp(*kvb_guard_enter(&jb))) {
            kvb_guard_leave();
            runs = 0;
        } else {
            b->run.stage_timing = 1;
            for (; runs < STAGE_RUNS; runs++) {
                kvb_run_reset(&b->run);
                if (kvb_run_launch(&b->run) != KVB_OK) break;
                kvb_sync(b->run.stream);
                if (b->run.op->stage_times(&b->run) != KVB_OK) break;
                memcpy(ms[runs], b->run.stage_ms, sizeof ms[runs]);
            }
            b->run.stage_timing = 0;
            kvb_guard_leave();
        }
        if (runs < STAGE_RUNS) b->run.n_stages = 0;
        b->run.wall_s[KVB_PH_TIMING] += kvb_wall_now() - stages_from;
        for (int i = 0; i < b->run.n_stages; i++) {
            double v[STAGE_RUNS];
            for (int k = 0; k < runs; k++) v[k] = ms[k][i];
            kvb_sample_stats st;
            kvb_stats(v, runs, &st);
            b->run.stage_ms[i] = st.median;
        }
    }
    double t = b->st.median;
    *n_out = 0;
    add_counter(out, n_out, "median_us", t * 1e6);
    add_counter(out, n_out, "min_us", b->st.min * 1e6);
    add_counter(out, n_out, "max_us", b->st.max * 1e6);
    add_counter(out, n_out, "noise_pct", 100.0 * b->st.noise);
    add_counter(out, n_out, "samples", n);
    if (b->lock_mode) add_counter(out, n_out, "timed_exclusive", b->lock_mode == KVB_LOCK_EXCLUSIVE);
    add_clock_counters(out, n_out, &b->clocks);
    if (b->cost.bytes_h2d > 0) add_counter(out, n_out, "h2d_GBps", b->cost.bytes_h2d / t * 1e-9);
    if (b->cost.bytes_dev > 0) add_counter(out, n_out, "dev_GBps", b->cost.bytes_dev / t * 1e-9);
    if (b->cost.flops > 0) add_counter(out, n_out, "TFLOPs", b->cost.flops / t * 1e-12);
    if (b->ceiling_s > 0) {
        add_counter(out, n_out, "ceiling_us", b->ceiling_s * 1e6);
        add_counter(out, n_out, "pct_of_ceiling", 100.0 * b->ceiling_s / t);
        add_counter(out, n_out, "ceiling_kind", (double)b->cost.ceiling); /* op.h kvb_ceiling_kind */
    }
    if (b->cost.workspace_bytes > 0) add_counter(out, n_out, "workspace_bytes", b->cost.workspace_bytes);
    if (b->cost.tokens > 0 && b->cost.layers > 0)
        add_counter(out, n_out, "tokens_per_s", b->cost.tokens / (t * b->cost.layers));
    for (int i = 0; i < b->cost.n_extra && i < 8; i++) add_counter(out, n_out, b->cost.extra_name[i], b->cost.extra_value[i]);
    for (int i = 0; i < KVB_N_PHASES; i++) { /* where the case's wall time went (op.h kvb_phase) */
        char name[40];
        snprintf(name, sizeof name, "wall_%s_s", kvb_phase_name((kvb_phase)i));
        add_counter(out, n_out, name, b->run.wall_s[i]);
    }
    if (b->cost.goal_us > 0) {
        add_counter(out, n_out, "goal_us", b->cost.goal_us);
        add_counter(out, n_out, "time_over_goal", t * 1e6 / b->cost.goal_us);
    }
    char *old_stages = strstr(b->label, "; stages: "); /* Google Benchmark may finish a case more than once */
    if (old_stages) *old_stages = 0;
    size_t ll = strlen(b->label);
    for (int i = 0; i < b->run.n_stages; i++) {
        char name[40];
        snprintf(name, sizeof name, "stage_us_%.30s", b->run.stage_name[i]); /* KVB_STAGE_NAME_MAX: never cut */
        add_counter(out, n_out, name, b->run.stage_ms[i] * 1e3);
        if (ll < sizeof b->label)
            ll += (size_t)snprintf(b->label + ll, sizeof b->label - ll, "%s%s %.1f us", i ? ", " : "; stages: ",
                                   b->run.stage_name[i], b->run.stage_ms[i] * 1e3);
    }
    const kvb_peer *q;
    for (int i = 0; (q = kvb_peer_match(b->peers, b->c, i)); i++) {
        char name[40]; /* counter names are at most 39 characters */
        snprintf(name, sizeof name, "peer_us_%.31s", q->name);
        add_counter(out, n_out, name, q->median_us);
    }
    return 0;
}

static const char *bench_label(void *p) { return ((bench_ctx *)p)->label; }

static void bench_release(void *p)
{
    bench_ctx *b = p;
    kvb_timing_lock_release();
    if (b->live) kvb_run_teardown(&b->run);
    b->live = 0;
    kvb_nvtx_pop();
}

/* ---- the summary table ---- */

/* id without its impl= key: cases that differ only in implementation compute the same thing */
static void shape_key(const char *id, char *out, size_t n)
{
    snprintf(out, n, "%s", id);
    char *p = strstr(out, " impl=");
    if (p) *p = '\0';
}

int kvb_ceiling_suspect(double pct) { return pct > 100.0; }

void kvb_bench_summary_row(FILE *f, const kvb_bench_result *x, const kvb_bench_result *all, int n, const kvb_peers *peers)
{
    if (!x->done) {
        fprintf(f, "| `%s` | %s | | | | | | |\n", x->c->id, x->failed ? x->error : "not run");
        return;
    }
    double t = x->median_s;
    const kvb_cost *cost = &x->cost;
    double gbps = cost->bytes_h2d > 0 ? cost->bytes_h2d / t * 1e-9 : cost->bytes_dev / t * 1e-9;
    char rate[48], ceil_s[96] = "", vs[400] = "", goal[128] = "";
    if (cost->ceiling == KVB_CEIL_MMA) snprintf(rate, sizeof rate, "%.1f TFLOP/s", cost->flops / t * 1e-12);
    else snprintf(rate, sizeof rate, "%.1f GB/s", gbps);
    if (x->ceiling_s > 0) {
        double pct = 100.0 * x->ceiling_s / t;
        snprintf(ceil_s, sizeof ceil_s, "%.1f%% of %s%s", pct, kvb_ceiling_name(cost->ceiling),
                 kvb_ceiling_suspect(pct) ? " **CEILING ERROR: above 100%, the ceiling is wrong**" : "");
    }
    size_t len = 0;
    /* speedups over the in-suite baselines of the same shape, measured in this run */
    if (!strstr(x->c->id, " impl=") || strstr(x->c->id, " impl=kernel ") || !strcmp(strstr(x->c->id, " impl="), " impl=kernel")) {
        char key[KVB_ID_MAX], other[KVB_ID_MAX];
        shape_key(x->c->id, key, sizeof key);
        for (int k = 0; k < n; k++) {
            if (&all[k] == x || !all[k].done) continue;
            shape_key(all[k].c->id, other, sizeof other);
            if (strcmp(key, other)) continue;
            const char *impl = strstr(all[k].c->id, " impl=") + 6;
            len += (size_t)snprintf(vs + len, sizeof vs - len, "%s%.2fx vs %s", len ? ", " : "", all[k].median_s / t, impl);
        }
    }
    const kvb_peer *q;
    for (int i = 0; (q = kvb_peer_match(peers, x->c, i)) && len < sizeof vs; i++)
        len += (size_t)snprintf(vs + len, sizeof vs - len, "%s%.2fx vs %s (%.1f us, same run)", len ? ", " : "",
                                q->median_us * 1e-6 / t, q->name, q->median_us);
    if (cost->goal_us > 0)
        snprintf(goal, sizeof goal, "%.2fx of %.1f us (%s)", t * 1e6 / cost->goal_us, cost->goal_us,
                 cost->goal_text ? cost->goal_text : "goal");
    else if (cost->goal_peer)
        snprintf(goal, sizeof goal, "(goal: %.2fx %s; peer not measured)", cost->goal_peer_ratio, cost->goal_peer);
    else if (cost->goal_impl)
        snprintf(goal, sizeof goal, "(goal: %.0fx faster than impl=%s; not measured)", cost->goal_impl_speedup,
                 cost->goal_impl);
    else if (cost->goal_text) /* merge: an unmeasured goal as the case's own run stated it */
        snprintf(goal, sizeof goal, "%s", cost->goal_text);
    fprintf(f, "| `%s` | %.2f | %.2f..%.2f | %.1f%% | %s | %s | %s | %s |\n", x->c->id, t * 1e6, x->min_s * 1e6,
            x->max_s * 1e6, 100 * x->noise, rate, ceil_s, vs, goal);
}

static void clock_cell(char *buf, size_t n, double a, double z)
{
    char x[16] = "?", y[16] = "?";
    if (a >= 0) snprintf(x, sizeof x, "%.0f", a);
    if (z >= 0) snprintf(y, sizeof y, "%.0f", z);
    snprintf(buf, n, "%s -> %s", x, y);
}

int kvb_bench_clock_summary(FILE *f, const kvb_bench_result *res, int n, const char *nvml_unavailable,
                            double power_limit_w)
{
    if (nvml_unavailable) {
        fprintf(f, "\nClocks per case: NVML not available (%s).\n", nvml_unavailable);
        return 0;
    }
    int timed = 0, flagged = 0;
    double sm_max = -1;
    for (int i = 0; i < n; i++)
        if (res[i].done && res[i].clocks.start.valid && res[i].clocks.end.valid) timed++, sm_max = res[i].clocks.sm_max_mhz;
    if (!timed) return 0;
    char lim[96] = "max SM clock unknown";
    size_t len = sm_max > 0 ? (size_t)snprintf(lim, sizeof lim, "max SM clock %.0f MHz", sm_max) : strlen(lim);
    if (power_limit_w > 0) snprintf(lim + len, sizeof lim - len, ", power limit %.0f W", power_limit_w);
    fprintf(f, "\nClocks per case (NVML, sampled just before and just after each case's timing loop: start -> end; "
               "%s). Flagged: the SM clock fell by more than %.0f%% during the loop, ended below %.0f%% of the max, or "
               "a clock-event reason other than GPU idle or an applications clocks setting was active.\n\n",
            lim, KVB_CLOCK_DROP_PCT, KVB_CLOCK_MIN_PCT_OF_MAX);
    fprintf(f, "| case | SM MHz | memory MHz | temperature C | power W | clock-event reasons | flag |\n");
    fprintf(f, "|---|---:|---:|---:|---:|---|---|\n");
    for (int i = 0; i < n; i++) {
        const kvb_clock_record *c = &res[i].clocks;
        if (!res[i].done || !c->start.valid || !c->end.valid) continue;
        char sm[40], mem[40], temp[40], pw[40], ra[200] = "?", rz[200] = "?", note[600];
        clock_cell(sm, sizeof sm, c->start.sm_mhz, c->end.sm_mhz);
        clock_cell(mem, sizeof mem, c->start.mem_mhz, c->end.mem_mhz);
        clock_cell(temp, sizeof temp, c->start.temp_c, c->end.temp_c);
        clock_cell(pw, sizeof pw, c->start.power_w, c->end.power_w);
        if (c->start.have_reasons) kvb_clock_reason_names(c->start.reasons, ra, sizeof ra);
        if (c->end.have_reasons) kvb_clock_reason_names(c->end.reasons, rz, sizeof rz);
        const int flag = kvb_clock_flag(c, note, sizeof note);
        flagged += flag;
        fprintf(f, "| `%s` | %s | %s | %s | %s | %s -> %s | %s%s |\n", res[i].c->id, sm, mem, temp, pw, ra, rz,
                flag ? "**CLOCKS**: " : "", note);
    }
    if (flagged)
        fprintf(f, "\n**%d case(s) timed under a falling or limited clock (CLOCKS above): their times may be slower "
                   "than this GPU at its own clocks.**\n", flagged);
    return flagged;
}

static const char *g_nvml_missing; /* NULL when NVML answers: the reason otherwise */

static void print_summary(FILE *f, bench_ctx *b, int n, const kvb_ceilings *ceil, const char *gpu, const kvb_peers *peers)
{
    kvb_bench_result *res = kvb_xalloc((size_t)n, sizeof *res, "the summary's rows");
    if (!res) {
        fprintf(f, "no summary: %s\n", kvb_last_error());
        return;
    }
    for (int i = 0; i < n; i++) resolve_impl_goal(&b[i]); /* also against impls listed after the case */
    for (int i = 0; i < n; i++)
        res[i] = (kvb_bench_result){b[i].c, b[i].cost, b[i].ceiling_s, b[i].st.median, b[i].st.min, b[i].st.max,
                                    b[i].st.noise, b[i].done, b[i].failed, b[i].error, b[i].clocks};
    fprintf(f, "| case | median us | min..max us | noise | rate | %% of ceiling | vs peers (same run) | goal |\n");
    fprintf(f, "|---|---:|---:|---:|---:|---:|---|---|\n");
    int suspect = 0;
    for (int i = 0; i < n; i++) {
        kvb_bench_summary_row(f, &res[i], res, n, peers);
        suspect += res[i].done && res[i].ceiling_s > 0 && kvb_ceiling_suspect(100.0 * res[i].ceiling_s / res[i].median_s);
    }
    fprintf(f, "\n");
    for (int i = 0; i < n; i++)
        if (b[i].done && b[i].label[0]) fprintf(f, "- `%s`: %s\n", b[i].c->id, b[i].label);
    if (suspect)
        fprintf(f, "\n**%d case%s above 100%% of their ceiling: CEILING ERROR (the ceiling, not the kernel, is wrong).**\n",
                suspect, KVB_PLURAL(suspect));
    if (ceil->measured)
        fprintf(f, "\n%s. Ceilings this run: H2D pinned memcpy %.1f GB/s, zero-copy kernel %.1f GB/s, D2D memcpy %.0f GB/s "
                   "(read+write), copy kernel %.0f GB/s, read kernel %.0f GB/s (read only), bf16 GEMM %.0f TFLOP/s, timing "
                   "floor (empty kernel) %.2f us. %% of ceiling: the ceiling's fastest time (of its repeats) for the same "
                   "work over the case's median, timed the same way at the same size: one contiguous pinned copy of the "
                   "host bytes, one device copy of the device bytes (copies), one streaming read of the device bytes "
                   "(read-mostly kernels), or the FLOPs at the measured bf16 GEMM rate.\n",
                gpu, ceil->h2d_memcpy_GBps, ceil->h2d_zero_copy_GBps, ceil->d2d_memcpy_GBps, ceil->d2d_kernel_GBps,
                ceil->read_GBps, ceil->bf16_mma_TFLOPs, ceil->launch_floor_us);
    if (peers && peers->n) fprintf(f, "\nExternal peers from %s, timed on this GPU in this round.\n", peers->source);
    kvb_bench_clock_summary(f, res, n, g_nvml_missing, kvb_nvml_power_limit_w());
    kvb_xfree(res);
}

static void context_num(const char *key, const char *fmt, double v)
{
    char buf[64];
    snprintf(buf, sizeof buf, fmt, v);
    kvb_gbench_context(key, buf);
}

/* The goal of a timed case, by id, for the JSON (kvb_bench_json_finish): as the summary states it */
typedef struct goal_cases {
    const bench_ctx *b;
    int n;
} goal_cases;

static kvb_goal goal_of_case(const char *id, void *ctx)
{
    static char unmeasured[200]; /* copied into the JSON before the next call */
    const goal_cases *g = ctx;
    for (int i = 0; i < g->n; i++) {
        const kvb_cost *c = &g->b[i].cost;
        if (!g->b[i].done || g->b[i].failed || strcmp(g->b[i].c->id, id)) continue;
        if (c->goal_us > 0) return (kvb_goal){c->goal_text ? c->goal_text : "goal", c->goal_us};
        /* a goal against a peer or impl that did not run: the summary's words for it */
        if (c->goal_peer)
            snprintf(unmeasured, sizeof unmeasured, "(goal: %.2fx %s; peer not measured)", c->goal_peer_ratio,
                     c->goal_peer);
        else if (c->goal_impl)
            snprintf(unmeasured, sizeof unmeasured, "(goal: %.0fx faster than impl=%s; not measured)",
                     c->goal_impl_speedup, c->goal_impl);
        else
            return (kvb_goal){NULL, 0};
        return (kvb_goal){unmeasured, 0};
    }
    return (kvb_goal){NULL, 0};
}

int kvb_cmd_bench(const kvb_options *o)
{
    kvb_case_list cases;
    int rc = kvb_select_cases(o, KVB_TIER_BENCH, &cases);
    if (rc) return rc;
    if (cases.n == 0 && o->shard_n) { /* an empty shard: result files of no case */
        kvb_cases_free(&cases);
        return kvb_bench_write_empty(o);
    }
    if (cases.n == 0) {
        fprintf(stderr, "kvbench: no case matches\n");
        return 2;
    }
    static kvb_peers peers;
    if (o->peers && kvb_peers_load(o->peers, &peers) != KVB_OK) {
        fprintf(stderr, "kvbench: --peers %s\n", kvb_last_error());
        kvb_cases_free(&cases);
        return 2;
    }
    if (!kvb_gpu_available()) {
        printf("kvbench bench: %s; nothing was timed (%d case%s selected). `kvbench check --tier smoke` runs the "
               "CPU references.\n", kvb_gpu_unavailable_reason(), cases.n, KVB_PLURAL(cases.n));
        kvb_peers_free(&peers);
        kvb_cases_free(&cases);
        return KVB_EXIT_NOTHING_MEASURED;
    }
    /* the result files: temporaries beside them, renamed over them when complete */
    kvb_outfile jout, sout;
    if (o->json && !kvb_outfile_open(&jout, o->json)) {
        fprintf(stderr, "kvbench: --json %s\n", kvb_last_error());
        kvb_peers_free(&peers);
        kvb_cases_free(&cases);
        return 2;
    }
    if (o->json) fclose(jout.f), jout.f = NULL; /* Google Benchmark writes it by name */
    if (o->summary && !kvb_outfile_open(&sout, o->summary)) {
        fprintf(stderr, "kvbench: --summary %s\n", kvb_last_error());
        if (o->json) kvb_outfile_discard(&jout);
        kvb_peers_free(&peers);
        kvb_cases_free(&cases);
        return 2;
    }
    static kvb_ceilings ceil;
    int ceil_lock; /* its pinned copies read host memory: measured alone (no lock: measured anyway) */
    kvb_timing_lock_acquire(1, &ceil_lock);
    kvb_ceilings_measure(&ceil);
    kvb_timing_lock_release();
    kvb_ceilings_print(&ceil);
    kvb_device_info d;
    kvb_gpu_info(&d);
    kvb_gbench_context("kvbench_git_revision", KVB_GIT_REV);
    kvb_gbench_context("kvbench_command_line", o->cmdline);
    char sample_time[32];
    snprintf(sample_time, sizeof sample_time, "%g", o->sample_time_s > 0 ? o->sample_time_s : KVB_SAMPLE_TIME_DEFAULT_S);
    kvb_gbench_context("sample_time_s", sample_time); /* each case's wall-time budget of samples */
    kvb_gbench_context("gpu", d.name);
    kvb_gbench_context("gpu_driver", d.driver);
    kvb_gbench_context("gpu_clocks", d.clocks);
    if (o->shard_n) kvb_gbench_context("shard", kvb_shard_name(o->shard_k, o->shard_n));
    if (getenv("CUDA_VISIBLE_DEVICES")) kvb_gbench_context("cuda_visible_devices", getenv("CUDA_VISIBLE_DEVICES"));
    if (o->timing_lock) kvb_gbench_context("timing_lock", o->timing_lock);
    if (o->durations) kvb_gbench_context("shard_durations", o->durations);
    /* the clocks per case: NVML, when the driver has it */
    g_nvml_missing = kvb_nvml_open(0) ? NULL : kvb_nvml_unavailable_reason();
    kvb_gbench_context("nvml", g_nvml_missing ? g_nvml_missing : "available: clocks, temperature, power and clock-event "
                                                                  "reasons per case, at the start and the end of its loop");
    g_sm_max_mhz = kvb_nvml_max_sm_mhz();
    if (g_sm_max_mhz > 0) context_num("clock_sm_max_mhz", "%.0f", g_sm_max_mhz);
    if (kvb_nvml_power_limit_w() > 0) context_num("gpu_power_limit_w", "%.0f", kvb_nvml_power_limit_w());
    context_num("cuda_runtime", "%.0f", d.runtime_version);
    context_num("ceiling_h2d_memcpy_GBps", "%.1f", ceil.h2d_memcpy_GBps);
    context_num("ceiling_h2d_zero_copy_GBps", "%.1f", ceil.h2d_zero_copy_GBps);
    context_num("ceiling_d2d_memcpy_GBps", "%.1f", ceil.d2d_memcpy_GBps);
    context_num("ceiling_d2d_kernel_GBps", "%.1f", ceil.d2d_kernel_GBps);
    context_num("ceiling_read_GBps", "%.1f", ceil.read_GBps);
    context_num("ceiling_bf16_mma_TFLOPs", "%.1f", ceil.bf16_mma_TFLOPs);
    context_num("timing_floor_us", "%.2f", ceil.launch_floor_us);
    if (bench_repeat() > 1) context_num("bench_repeat_launch", "%.0f", bench_repeat()); /* a slowed self-test */
    if (peers.n) kvb_gbench_context("peers", peers.source);

    kvb_set_host_mem_limit(o->host_mem_limit_gb * 1073741824.0);
    kvb_host_pool_plan(&cases);
    bench_ctx *b = kvb_xalloc((size_t)cases.n, sizeof *b, "the benchmarks' state");
    double *cost = b ? kvb_selection_costs(o, &cases) : NULL; /* --durations' wall times when given */
    if (!b || !cost) {
        if (!b) fprintf(stderr, "kvbench: %s\n", kvb_last_error());
        kvb_xfree(b);
        if (o->json) kvb_outfile_discard(&jout);
        if (o->summary) kvb_outfile_discard(&sout);
        kvb_peers_free(&peers);
        kvb_cases_free(&cases);
        return 2;
    }
    for (int i = 0; i < cases.n; i++) {
        b[i].c = &cases.v[i];
        b[i].ceil = &ceil;
        b[i].peers = &peers;
        b[i].all = b;
        b[i].n_all = cases.n;
        b[i].cost_est = cost[i];
        kvb_bench gb = {.name = cases.v[i].id, .ctx = &b[i], .prepare = bench_prepare, .loop_begin = bench_loop_begin,
                        .iterate = bench_iterate, .finish = bench_finish, .release = bench_release, .label = bench_label};
        kvb_gbench_add(&gb);
    }
    kvb_xfree(cost);
    /* Google Benchmark flags: JSON output as asked; the samples are the shim's (--sample-time) */
    kvb_options gbo = *o;
    char out_flag[4200], fmt_flag[] = "--benchmark_out_format=json";
    kvb_gbench_set_sample_time(o->sample_time_s > 0 ? o->sample_time_s : KVB_SAMPLE_TIME_DEFAULT_S);
    if (o->json) {
        snprintf(out_flag, sizeof out_flag, "--benchmark_out=%s", jout.tmp);
        gbo.gb_argv[gbo.gb_argc++] = out_flag;
        gbo.gb_argv[gbo.gb_argc++] = fmt_flag;
    }
    int errors = kvb_gbench_run(gbo.gb_argc, gbo.gb_argv);

    const int interrupted = kvb_interrupted();
    int status = KVB_EXIT_OK, done = 0;
    for (int i = 0; i < cases.n; i++) done += b[i].done || b[i].failed;
    printf("\n");
    print_summary(stdout, b, cases.n, &ceil, d.name, &peers);
    if (o->summary) {
        print_summary(sout.f, b, cases.n, &ceil, d.name, &peers);
        if (kvb_outfile_commit(&sout) != KVB_OK) {
            fprintf(stderr, "kvbench: --summary %s\n", kvb_last_error());
            status = KVB_EXIT_FAILED;
        }
    }
    if (o->json) {
        /* read back once and rewritten whole: each timed case gets its goal's words (merge's summary
         * shows them), and interrupted, the cases not run leave the file, which holds those that finished */
        goal_cases gc = {b, cases.n};
        int rc = kvb_bench_json_finish(jout.tmp, interrupted ? NOT_RUN_INTERRUPTED : NULL, goal_of_case, &gc);
        if (rc == KVB_OK) rc = kvb_outfile_commit(&jout);
        else kvb_outfile_discard(&jout);
        if (rc != KVB_OK) {
            fprintf(stderr, "kvbench: --json %s: %s\n", o->json, kvb_last_error());
            status = KVB_EXIT_FAILED;
        }
    }
    int failed = 0, timed = 0;
    for (int i = 0; i < cases.n; i++) failed += b[i].failed, timed += b[i].done && !b[i].failed;
    printf("%d benchmarked, %d failed validation or setup\n", timed, failed);
    if (status == KVB_EXIT_OK && (errors || failed)) status = KVB_EXIT_FAILED;
    if (interrupted) {
        fprintf(stderr, "kvbench: interrupted: %d of %d case%s done%s%s%s%s%s\n", done, cases.n, KVB_PLURAL(cases.n),
                o->json || o->summary ? "; " : "", o->json ? o->json : "", o->json && o->summary ? " and " : "",
                o->summary ? o->summary : "", o->json && o->summary ? " hold them" : o->json || o->summary ? " holds them" : "");
        status = kvb_interrupt_exit_code();
    }
    kvb_xfree(b);
    kvb_nvml_close();
    kvb_peers_free(&peers);
    kvb_host_pool_release();
    kvb_fill_memo_release();
    kvb_stage_release();
    kvb_cases_free(&cases);
    return status;
}
