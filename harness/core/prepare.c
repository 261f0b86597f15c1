/* prepare.c: the one path from a case to a validated, live run (cli.h), shared by check, bench and
 * profile, with the case guard that turns a failed CUDA call or host allocation into this case's
 * failure. */
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness/core/cli.h"
#include "harness/core/progress.h"

static kvb_status fail(kvb_outcome *o, const char *why)
{
    o->status = KVB_FAIL;
    o->why = why;
    snprintf(o->msg, sizeof o->msg, "%s", kvb_last_error());
    return o->status;
}

/* One validating launch plus the op's invariants on every slice. */
static kvb_status validate(kvb_run *r, kvb_outcome *o)
{
    if (kvb_run_validate(r, &o->v) != KVB_OK) return fail(o, "launch rejected");
    if (r->op->out_check) {
        o->v.invariants_checked = 1;
        kvb_clear_error();
        if (r->op->out_check(r) != KVB_OK) {
            snprintf(o->v.invariant_error, sizeof o->v.invariant_error, "%s", kvb_last_error());
            o->v.pass = 0;
        }
    }
    if (!o->v.pass) {
        o->status = KVB_FAIL;
        o->why = o->v.invariant_error[0] ? "output violates an invariant" : "output differs from the reference";
        snprintf(o->msg, sizeof o->msg, "%s", o->v.invariant_error);
        return o->status;
    }
    o->status = KVB_PASS;
    return o->status;
}

kvb_status kvb_case_prepare(kvb_run *r, const kvb_case *c, const kvb_ceilings *ceil, kvb_outcome *o)
{
    memset(o, 0, sizeof *o);
    memset(r, 0, sizeof *r);
    o->status = KVB_PASS;
    o->why = "";
    if (kvb_device_broken()) {
        o->status = KVB_FAIL;
        o->why = "not run: the device failed in an earlier case";
        snprintf(o->msg, sizeof o->msg, "%s", kvb_device_broken_reason());
        return o->status;
    }
    jmp_buf jb;
    if (setjmp(*kvb_guard_enter(&jb))) {
        kvb_guard_leave();
        return fail(o, "aborted");
    }
    kvb_status st = KVB_PASS;
    if (kvb_run_setup(r, c, ceil) != KVB_OK) st = fail(o, "setup or reference failed");
    else if (r->op->ref_check) { /* the reference's invariants: part of the reference phase */
        const double t = kvb_wall_now();
        const int rc = r->op->ref_check(r);
        r->wall_s[KVB_PH_REFERENCE] += kvb_wall_now() - t;
        if (rc != KVB_OK) st = fail(o, "reference invariant violated");
    }
    if (st == KVB_FAIL) {
        /* nothing more runs */
    } else if (!kvb_gpu_available()) {
        o->status = st = KVB_SKIP;
        o->why = "no CUDA device: reference computed, GPU run skipped";
    } else {
        double t = kvb_wall_now();
        const int rc = kvb_run_gpu_setup(r);
        r->wall_s[KVB_PH_UPLOAD] = kvb_wall_now() - t;
        if (rc != KVB_OK) st = fail(o, "GPU setup failed");
        else {
            t = kvb_wall_now();
            st = validate(r, o);
            r->wall_s[KVB_PH_VALIDATE] += kvb_wall_now() - t;
        }
    }
    kvb_guard_leave();
    return st;
}

/* Compare outputs of zeros with the reference and run the op's invariants: 1 when that fails (the
 * fault would be caught). */
static int zeros_fail(kvb_run *r, kvb_verdict *v, int verdict_only)
{
    kvb_run_compare_verdict_only(verdict_only);
    kvb_run_compare(r, v);
    kvb_run_compare_verdict_only(0);
    if (r->op->out_check && !(verdict_only && !v->pass)) {
        v->invariants_checked = 1;
        kvb_clear_error();
        if (r->op->out_check(r) != KVB_OK) {
            snprintf(v->invariant_error, sizeof v->invariant_error, "%s", kvb_last_error());
            v->pass = 0;
        }
    }
    return !v->pass;
}

/* Every output (OUT, INOUT) pointed at one buffer of zeros as large as the largest: calloc'd, never
 * written (the comparisons and invariants only read outputs), so a large case's zeros cost no memset
 * and no memory touched beyond what the comparison reads. Returns the buffer (kvb_run_free it). */
static void *zero_outputs(kvb_run *r)
{
    size_t largest = 1;
    for (int i = 0; i < r->nt; i++) {
        const kvb_tensor *t = &r->t[i];
        const size_t bytes = (size_t)t->n * kvb_dtype_size(t->dtype);
        if ((t->role == KVB_OUT || t->role == KVB_INOUT) && bytes > largest) largest = bytes;
    }
    void *zeros = kvb_run_alloc(r, largest, "the outputs of zeros"); /* calloc: zeros */
    for (int i = 0; i < r->nt; i++)
        if (r->t[i].role == KVB_OUT || r->t[i].role == KVB_INOUT) r->t[i].out = zeros;
    return zeros;
}

int kvb_run_zeros_caught(kvb_run *r)
{
    void *saved[KVB_MAX_TENSORS] = {0};
    for (int i = 0; i < r->nt; i++) saved[i] = r->t[i].out; /* restored however this ends */
    jmp_buf jb;
    if (setjmp(*kvb_guard_enter(&jb))) { /* a host allocation failed (kvb_last_error() names it) */
        kvb_guard_leave();
        kvb_run_compare_verdict_only(0);
        for (int i = 0; i < r->nt; i++) r->t[i].out = saved[i];
        return -1;
    }
    void *zeros = zero_outputs(r);
    kvb_verdict v;
    int caught = zeros_fail(r, &v, 1); /* whether caught, not where: the first failure settles it */
    kvb_guard_leave();
    kvb_run_free(r, zeros);
    for (int i = 0; i < r->nt; i++) r->t[i].out = saved[i];
    return caught;
}

kvb_status kvb_case_validate_zeros(kvb_run *r, const kvb_case *c, kvb_outcome *o)
{
    memset(o, 0, sizeof *o);
    memset(r, 0, sizeof *r);
    o->why = "";
    jmp_buf jb;
    if (setjmp(*kvb_guard_enter(&jb))) {
        kvb_guard_leave();
        return fail(o, "aborted");
    }
    kvb_status st = KVB_PASS;
    if (kvb_run_setup(r, c, NULL) != KVB_OK) st = fail(o, "setup or reference failed");
    else {
        zero_outputs(r); /* freed with the run */
        zeros_fail(r, &o->v, 0);
        o->status = st = o->v.pass ? KVB_PASS : KVB_FAIL;
        o->why = o->v.pass ? "outputs of zeros PASSED validation: the check is blind to this fault" : "zeros caught";
    }
    kvb_guard_leave();
    return st;
}

kvb_status kvb_case_revalidate(kvb_run *r, kvb_outcome *o)
{
    memset(o, 0, sizeof *o);
    o->why = "";
    jmp_buf jb;
    if (setjmp(*kvb_guard_enter(&jb))) {
        kvb_guard_leave();
        return fail(o, "aborted");
    }
    const double t = kvb_wall_now();
    kvb_status st = validate(r, o);
    r->wall_s[KVB_PH_REVALIDATE] += kvb_wall_now() - t;
    kvb_guard_leave();
    return st;
}
