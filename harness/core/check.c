/* check.c: `kvbench check` (CUDA vs reference over the selected cases) and `kvbench profile` (one
 * validated, warmed-up case, then exactly one launch between cudaProfilerStart/Stop). */
#include <setjmp.h>
#include <stdio.h>
#include <string.h>

#include "harness/core/cli.h"
#include "harness/core/progress.h"
#include "harness/core/shard.h"

#if KVB_HAVE_CUDA
#include <cuda_profiler_api.h>
#endif

static const char *status_name(kvb_status s) { return s == KVB_PASS ? "PASS" : s == KVB_SKIP ? "SKIP" : "FAIL"; }

int kvb_cmd_check(const kvb_options *o)
{
    kvb_case_list cases;
    int rc = kvb_select_cases(o, KVB_TIER_CHECK, &cases);
    if (rc) return rc;
    if (cases.n == 0 && !o->shard_n) { /* an empty shard runs nothing and writes a file of no case */
        fprintf(stderr, "kvbench: no case matches\n");
        return 2;
    }
    /* the progress line's estimate of what is left: each case's cost (--durations' wall times when given) */
    double *cost = cases.n ? kvb_selection_costs(o, &cases) : NULL;
    if (cases.n && !cost) {
        kvb_cases_free(&cases);
        return 2;
    }
    /* an output directory that cannot be made is the command line's error: nothing runs */
    if (o->dump && kvb_dump_prepare(o->dump) != KVB_OK) {
        fprintf(stderr, "kvbench: --dump: %s\n", kvb_last_error());
        kvb_xfree(cost);
        kvb_cases_free(&cases);
        return 2;
    }
    FILE *jf = NULL;
    kvb_json j;
    kvb_outfile jout; /* written to a temporary, renamed over o->json when complete */
    if (o->json) {
        if (!(jf = kvb_outfile_open(&jout, o->json))) {
            fprintf(stderr, "kvbench: --json %s\n", kvb_last_error());
            kvb_xfree(cost);
            kvb_cases_free(&cases);
            return 2;
        }
        kvb_json_begin(&j, jf);
        kvb_context_json(&j, o, NULL);
        kvb_json_arr(&j, "cases");
    }
    kvb_gpu_available(); /* says once, up front, when GPU work is skipped */
    kvb_set_host_mem_limit(o->host_mem_limit_gb * 1073741824.0);
    kvb_host_pool_plan(&cases);
    int passed = 0, failed = 0, skipped = 0, not_dumped = 0, done = 0;
    double cost_total = 0, cost_done = 0;
    for (int i = 0; i < cases.n; i++) cost_total += cost[i];
    for (int i = 0; i < cases.n && !kvb_interrupted(); i++, done++) {
        const kvb_case *c = &cases.v[i];
        kvb_run r;
        kvb_outcome out;
        kvb_progress_cost("check", i + 1, cases.n, c->id, cost_done, cost_total);
        cost_done += cost[i];
        kvb_nvtx_push(c->id);
        kvb_status st = o->fault_zeros ? kvb_case_validate_zeros(&r, c, &out) : kvb_case_prepare(&r, c, NULL, &out);
        kvb_nvtx_pop();
        kvb_progress_clear();
        char repro[KVB_ID_MAX + 96];
        kvb_case_repro(c, repro, sizeof repro);
        if (o->fault_zeros) { /* the fault must be caught: a failed validation is this mode's pass */
            st = st == KVB_FAIL && !strcmp(out.why, "zeros caught") ? KVB_PASS : KVB_FAIL;
            printf("%-6s  %s\n", st == KVB_PASS ? "CAUGHT" : "MISSED", c->id);
            if (st == KVB_FAIL) printf("      %s%s%s\n", out.why, *out.msg ? ": " : "", out.msg);
            kvb_print_verdict(&r, &out.v);
            passed += st == KVB_PASS, failed += st == KVB_FAIL;
            kvb_run_teardown(&r);
            continue;
        }
        /* --determinism: a validated case launched again must give the same bits; where the op documents
         * why its launches may differ in bits (r.nondeterministic), the relaunch must validate instead */
        char det[KVB_ID_MAX + 400] = "";
        int det_checked = 0, det_same = 0, det_ok = 0, det_relaunched = 0;
        if (o->determinism && st == KVB_PASS && r.on_gpu) {
            char name[64] = "";
            const int64_t d = kvb_run_repeat_differs(&r, name, sizeof name);
            det_checked = 1, det_same = d == 0, det_ok = det_same;
            if (d < 0) snprintf(det, sizeof det, "the second launch failed: %s", kvb_last_error());
            else if (d && r.nondeterministic) {
                kvb_outcome again;
                det_relaunched = 1;
                det_ok = kvb_case_revalidate(&r, &again) == KVB_PASS;
                snprintf(det, sizeof det, "%s differs in %lld elements between two launches, as documented (%s); "
                         "the relaunch %s", name, (long long)d, r.nondeterministic,
                         det_ok ? "validated" : "failed validation");
            } else if (d) snprintf(det, sizeof det, "%s differs in %lld elements between two launches", name, (long long)d);
            else snprintf(det, sizeof det, "two launches bitwise equal");
            if (!det_ok) {
                st = KVB_FAIL;
                out.why = det_relaunched ? "the relaunch is not valid" : "not deterministic";
                snprintf(out.msg, sizeof out.msg, "%s", det);
            }
        }
        printf("%-4s  %s\n", status_name(st), c->id);
        if (det_checked && det_ok) printf("      determinism: %s\n", det);
        if (st != KVB_PASS && *out.why) printf("      %s%s%s\n", out.why, *out.msg ? ": " : "", out.msg);
        if (r.note[0]) printf("      note: %s\n", r.note);
        kvb_print_verdict(&r, &out.v);
        if (st == KVB_FAIL) printf("      reproduce: kvbench check \"%s\"\n", repro);
        char dump_error[600] = "";
        if (o->dump && r.op && kvb_dump_run(o->dump, &r) != KVB_OK) {
            snprintf(dump_error, sizeof dump_error, "%s", kvb_last_error());
            printf("      dump failed: %s\n", dump_error);
            not_dumped++;
        }
        if (jf) {
            kvb_json_obj(&j, NULL);
            kvb_json_str(&j, "id", c->id);
            kvb_json_str(&j, "reproduce", repro);
            kvb_json_str(&j, "where", c->where);
            kvb_json_str(&j, "tier", kvb_tier_name(c->tier));
            kvb_json_str(&j, "status", status_name(st));
            kvb_json_str(&j, "reason", *out.msg ? out.msg : out.why);
            kvb_json_str(&j, "note", r.note);
            if (det_checked) kvb_json_bool(&j, "deterministic", det_same);
            if (det_checked && !det_same && det_ok) kvb_json_str(&j, "nondeterministic", r.nondeterministic);
            if (dump_error[0]) kvb_json_str(&j, "dump_error", dump_error);
            kvb_json_obj(&j, "wall_s"); /* where the case's wall time went (op.h kvb_phase) */
            for (int p = 0; p < KVB_N_PHASES; p++) kvb_json_num(&j, kvb_phase_name((kvb_phase)p), r.wall_s[p]);
            kvb_json_close(&j);
            kvb_tolerance_json(&j, c);
            kvb_verdict_json(&j, &r, &out.v);
            kvb_json_close(&j);
            fflush(jf);
        }
        passed += st == KVB_PASS, skipped += st == KVB_SKIP, failed += st == KVB_FAIL;
        kvb_run_teardown(&r);
        fflush(stdout);
    }
    const int interrupted = kvb_interrupted();
    int status = failed ? KVB_EXIT_FAILED : passed == 0 && skipped > 0 ? KVB_EXIT_NOTHING_MEASURED : KVB_EXIT_OK;
    if (jf) {
        kvb_json_close(&j);
        kvb_json_obj(&j, "summary");
        kvb_json_int(&j, "passed", passed);
        kvb_json_int(&j, "failed", failed);
        kvb_json_int(&j, "skipped", skipped);
        if (o->dump) kvb_json_int(&j, "not_dumped", not_dumped);
        kvb_json_int(&j, "selected", cases.n);
        kvb_json_bool(&j, "interrupted", interrupted != 0);
        kvb_json_close(&j);
        kvb_json_end(&j);
        if (kvb_outfile_commit(&jout) != KVB_OK) {
            fprintf(stderr, "kvbench: --json %s\n", kvb_last_error());
            status = KVB_EXIT_FAILED;
        }
    }
    if (o->fault_zeros) printf("fault injection (outputs of zeros): %d caught, %d missed\n", passed, failed);
    printf("%d passed, %d failed, %d skipped\n", passed, failed, skipped);
    if (not_dumped) {
        printf("%d case%s not dumped: a file under %s could not be written (\"dump failed\" above)\n", not_dumped,
               KVB_PLURAL(not_dumped), o->dump);
        if (status != KVB_EXIT_FAILED) status = KVB_EXIT_FAILED;
    }
    if (status == KVB_EXIT_NOTHING_MEASURED && !interrupted)
        fprintf(stderr, "kvbench check: nothing was measured: every case skipped (%s); the references and their "
                        "invariants ran (exit status 3)\n", kvb_gpu_unavailable_reason());
    if (interrupted) {
        kvb_progress_clear();
        fprintf(stderr, "kvbench: interrupted: %d of %d case%s done%s%s%s\n", done, cases.n, KVB_PLURAL(cases.n),
                o->json ? "; " : "", o->json ? o->json : "", o->json ? " holds them" : "");
        status = kvb_interrupt_exit_code();
    }
    kvb_host_pool_release();
    kvb_fill_memo_release();
    kvb_stage_release();
    kvb_xfree(cost);
    kvb_cases_free(&cases);
    return status;
}

int kvb_cmd_profile(const kvb_options *o)
{
    if (o->n_filters != 1 || !kvb_is_case_line(o->filters[0])) {
        fprintf(stderr, "kvbench profile: give exactly one case (its id, in quotes)\n");
        return 2;
    }
    kvb_case_list cases;
    int rc = kvb_select_cases(o, 0, &cases);
    if (rc) return rc;
    const kvb_case *c = &cases.v[0];
    if (!kvb_gpu_available()) {
        printf("kvbench profile: %s; nothing was profiled\n", kvb_gpu_unavailable_reason());
        kvb_cases_free(&cases);
        return KVB_EXIT_NOTHING_MEASURED;
    }
    kvb_run r;
    kvb_outcome out;
    kvb_set_host_mem_limit(o->host_mem_limit_gb * 1073741824.0);
    kvb_host_pool_plan(&cases);
    if (kvb_case_prepare(&r, c, NULL, &out) != KVB_PASS) {
        printf("FAIL  %s: %s%s%s\n", c->id, out.why, *out.msg ? ": " : "", out.msg);
        kvb_print_verdict(&r, &out.v);
        kvb_run_teardown(&r);
        kvb_cases_free(&cases);
        return 1;
    }
    jmp_buf jb;
    if (setjmp(*kvb_guard_enter(&jb))) {
        kvb_guard_leave();
        printf("FAIL  %s: %s\n", c->id, kvb_last_error());
        kvb_cases_free(&cases);
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
    kvb_run_compare(&r, &out.v);
    kvb_guard_leave();
    printf("%s  %s (one profiled launch in NVTX domain \"kvbench\", range \"%s\")\n", out.v.pass ? "PASS" : "FAIL", c->id,
           c->id);
    kvb_print_verdict(&r, &out.v);
    kvb_run_teardown(&r);
    kvb_host_pool_release();
    kvb_fill_memo_release();
    kvb_stage_release();
    kvb_cases_free(&cases);
    return out.v.pass ? 0 : 1;
}
