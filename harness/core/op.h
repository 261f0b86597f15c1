/* op.h: what a kernel brings to the harness (one kvb_op, registered in registry.c), and the state of
 * one case while it runs (kvb_run).
 *
 * An op declares its keys and its implementations, builds its inputs and reference outputs as named
 * tensors (setup), and enqueues one launch of the chosen implementation (launch). Everything else is
 * generic: device buffers, uploads, poisoning, restoring in-place state before every launch,
 * comparison, .npy dumps, timing, JSON, NVTX.
 */
#ifndef KVB_OP_H
#define KVB_OP_H

#include "harness/core/case.h"
#include "harness/core/compare.h"
#include "harness/core/gpu.h"
#include "harness/core/tensor.h"

#define KVB_MAX_TENSORS 48
#define KVB_MAX_DIMS 6

typedef enum {
    KVB_IN = 1,      /* uploaded once, read by the launch */
    KVB_OUT = 2,     /* poisoned before every launch, compared with t->ref */
    KVB_INOUT = 3,   /* restored from t->h before every launch, compared with t->ref */
    KVB_SCRATCH = 4, /* device-only workspace, zeroed once, never compared */
} kvb_role;

enum {
    KVB_T_HOST_MAPPED = 1, /* IN tensor read by the kernel in place from pinned host memory */
    KVB_T_NO_DUMP = 2,     /* too large or uninteresting for --dump */
    KVB_T_NO_REF = 4,      /* OUT tensor without a reference: judged by another rule (the op's out_check), so
                              t->ref is never computed, never compared and never dumped */
    KVB_T_ANY_BITS = 8,    /* integer OUT tensor whose every bit pattern is a value (packed 2-bit codes: sixteen
                              3s are 0xFFFFFFFF, the poison), so a slice a sampled reference skipped cannot be
                              screened for the poison; the metadata written beside it still is */
};

typedef struct kvb_tensor {
    char name[32];
    kvb_dtype dtype;
    int ndim;
    int64_t shape[KVB_MAX_DIMS];
    int64_t n; /* elements */
    int role, flags;
    void *h;      /* host: the input, or the initial contents of an INOUT tensor */
    void *ref;    /* host: the reference result (OUT, INOUT) */
    void *out;    /* host: what the device produced, downloaded for comparison */
    void *d;      /* device buffer (the mapped host pointer for KVB_T_HOST_MAPPED) */
    void *d_init; /* INOUT: device copy of h, restored before each launch */
    kvb_cmp_kind cmp;
    kvb_tol tol;
    int64_t slice_len;         /* elements per slice, for a sampled reference */
    const uint8_t *slice_mask; /* NULL: the reference covers every element */
    const double *tol_mag;     /* KVB_CMP_FLOAT: per-element magnitude that rtol multiplies (NULL: |ref|) */
    /* KVB_CMP_INDEXSET: the tensor is [rows, k] int32 indices; scores [rows, scores_n] are the
     * reference scores the selection is judged by (tie-tolerant, compare.h), set_tol its tolerance */
    const void *scores;
    kvb_dtype scores_dtype;
    int64_t scores_n;
    double set_tol;
    /* KVB_CMP_GATHER: the tensor is [rows, k, width] rows of the tensor named gather_src ([rows /
     * gather_group, n, width], its host copy) at the indices the run wrote into gather_idx [rows, k] */
    char gather_src[32], gather_idx[32];
    int64_t gather_group;
} kvb_tensor;

/* Bytes and FLOPs of one launch, and what bounds it. */
/* H2D: host reads against a contiguous pinned copy; D2D: copies (as many bytes written as read)
 * against a device copy; READ: read-mostly kernels (attention, scoring, top-k) against a kernel that
 * only streams and reduces the same bytes; MMA: FLOPs at the measured bf16 matrix rate. */
/* KVB_CEIL_READ_H2D: bytes_dev_serial read first, then the rest of bytes_dev read while bytes_h2d cross
 * from pinned host memory (an offloading decode step: the weights, then its device and host bytes
 * overlapped) */
typedef enum { KVB_CEIL_NONE, KVB_CEIL_H2D, KVB_CEIL_D2D, KVB_CEIL_MMA, KVB_CEIL_READ, KVB_CEIL_READ_H2D } kvb_ceiling_kind;

typedef struct kvb_cost {
    double bytes_h2d;  /* bytes that must cross from host memory */
    double bytes_dev;  /* device-memory bytes read + written, each once (the floor) */
    double bytes_dev_serial; /* KVB_CEIL_READ_H2D: the part of bytes_dev read before the overlap */
    double flops;
    kvb_ceiling_kind ceiling; /* the ceiling the time is stated against */
    double goal_us;    /* the goal for this case, if it has one (<= 0: none) */
    const char *goal_text;
    /* a goal stated against an external peer of the same run (bench --peers): goal_us becomes
     * goal_peer_ratio x that peer's median when the peer was measured, and no goal otherwise */
    const char *goal_peer;
    double goal_peer_ratio;
    /* a goal stated against another implementation of the same shape in the same run (its case listed
     * earlier in the run): goal_us becomes that impl's median / goal_impl_speedup once it was measured */
    const char *goal_impl;
    double goal_impl_speedup;
    double workspace_bytes; /* extra device memory the implementation needs beyond inputs/outputs */
    /* A step that stands for one of `layers` like it (decode_step: one transformer block), making
     * `tokens` tokens: the JSON adds tokens_per_s = tokens / (median x layers), projected to the model */
    double tokens, layers;
    /* Further figures of the case, written as JSON counters under these names */
    int n_extra;
    char extra_name[8][32];
    double extra_value[8];
} kvb_cost;

typedef struct kvb_ceilings kvb_ceilings; /* measured device ceilings (ceilings.h) */

/* Where a case's wall time goes: inputs (the seeded fills), reference (the rest of the op's set-up: the C
 * reference and its invariants), upload (device buffers and copies), validate (the launch before timing,
 * its comparison and the zeros check), timing (warm-up, the timed loop and the stage-timed launches),
 * revalidate (the launch after timing, compared with the same reference). */
typedef enum { KVB_PH_INPUTS, KVB_PH_REFERENCE, KVB_PH_UPLOAD, KVB_PH_VALIDATE, KVB_PH_TIMING, KVB_PH_REVALIDATE,
               KVB_N_PHASES } kvb_phase;
const char *kvb_phase_name(kvb_phase p);

/* Stage times a run reports: the most stages of a composition (kernels/step/compose.h's
 * KVB_STEP_MAX_STAGES). */
#define KVB_RUN_MAX_STAGES 32

typedef struct kvb_run {
    const kvb_case *c;
    const struct kvb_op *op;
    uint64_t seed;
    kvb_tensor t[KVB_MAX_TENSORS];
    int nt;
    void *priv;        /* op-private state */
    int on_gpu;        /* device buffers exist */
    cudaStream_t stream, stream2;
    const kvb_ceilings *ceil;
    char note[384];    /* shown with the result, e.g. "reference on 2 of 8 (b,h) slices" */
    const char *nondeterministic; /* set by the op's setup where two launches may differ in bits, saying why
                                     (`check --determinism` then demands that the relaunch validate) */
    int ref_ready;     /* the op's setup returned KVB_OK: every input and reference holds computed data (a
                          sampled reference on the slices it covers); 0 after a setup that failed part way */
    int out_ready;     /* t->out holds a finished download of every output */
    int ref_from_device; /* the op's ref_from_out recomputed references from the device's outputs: 1 done,
                            -1 failed part way (those references are no longer anything's), 0 not run */
    /* compositions (kernels/step/compose.h): a launch with stage_timing set records per-stage device
     * times, which the op's stage_times() copies here */
    int stage_timing, n_stages;
    char stage_name[KVB_RUN_MAX_STAGES][48];
    double stage_ms[KVB_RUN_MAX_STAGES];
    /* wall seconds of each phase of the case (kvb_phase), for the JSON and the progress estimate */
    double wall_s[KVB_N_PHASES];
    /* host memory the run owns (tensors' h, ref, out and kvb_run_alloc's blocks): freed at teardown */
    void **allocs;
    int n_allocs, cap_allocs;
} kvb_run;

/* One implementation of an op: the suite's kernel or a baseline. An op's table of these gives the
 * `impl=` choices (a key {"impl", KVB_P_ENUM, ..., choices NULL} takes its choices from the table,
 * the first entry being the default), which launch runs, and which are wall-timed. */
typedef struct kvb_impl {
    const char *name;
    int (*launch)(kvb_run *r); /* enqueue one launch on r->stream (NULL: the op's launch) */
    int wall_timed;            /* its cost includes host work: timed on the wall clock of an idle stream
                                  rather than behind a blocking kernel */
    const char *about;         /* one line for `kvbench kernels` */
} kvb_impl;

/* A key read only where an enum key of the same kernel has some values: elsewhere it must stay at its
 * default (another value would be a second id for the same case), which the parser holds. */
typedef struct kvb_key_scope {
    const char *key;
    const char *only_with; /* "method=rocketkv|shadowkv|omnikv" */
} kvb_key_scope;

typedef struct kvb_op {
    const char *name;    /* the kernel name in case lines */
    const char *family;  /* kernels/<family>/, reference/<family>.c */
    const char *summary;
    const kvb_param *params;
    int n_params;
    const kvb_key_scope *scopes;  /* keys read only with some values of another key (or NULL) */
    int n_scopes;
    const kvb_impl *impls;        /* the implementations (NULL: one, "kernel", through launch) */
    int n_impls;
    kvb_tol tol;                  /* default tolerances for floating outputs */
    int (*validate)(const kvb_case *c);               /* cross-key checks, via kvb_fail */
    size_t (*host_pool_bytes)(const kvb_case *c);     /* pinned host pool this case needs (or NULL) */
    /* Host memory the case takes at its peak, from its keys alone (nothing allocated): inputs, references,
     * the downloaded outputs and a second copy of them (the zeros check, --determinism), the op's own
     * buffers and the references' scratch, the host pool. The run refuses a case whose estimate exceeds
     * the machine's free memory before setting it up (kvb_host_mem_check). Computed in double, so that
     * no product of keys wraps (kvb_host_bytes_sat). */
    size_t (*host_bytes)(const kvb_case *c);
    int (*setup)(kvb_run *r);                         /* host inputs, tensors, reference outputs */
    int (*ref_check)(kvb_run *r);                     /* invariants of the reference result (or NULL) */
    int (*gpu_setup)(kvb_run *r);                     /* op-private device state (or NULL) */
    int (*launch)(kvb_run *r);                        /* enqueue one launch on r->stream, for impls
                                                         without a launch of their own */
    void (*cost)(const kvb_run *r, kvb_cost *cost);
    void (*teardown)(kvb_run *r);                     /* free op-private state (or NULL) */
    /* Invariants of the device's outputs checked on EVERY slice, also those a sampled reference
     * skips (for example: column sums of a head add up to its number of contributing rows). Reads
     * t->out after a download; KVB_OK, or an error naming the first violation. NULL: none. */
    int (*out_check)(kvb_run *r);
    /* References that depend on a choice the device made within tolerance (the pages of a tie-tolerant
     * selection): recomputed from the downloaded outputs (t->out) before every comparison, while the
     * choice itself is compared with its own reference in the same verdict. KVB_OK, or an error that
     * fails the comparison (for example a choice outside the cache). NULL: none. */
    int (*ref_from_out)(kvb_run *r);
    /* Compositions: after a launch made with r->stage_timing = 1, fill r->n_stages, r->stage_name and
     * r->stage_ms (NULL for single kernels). */
    int (*stage_times)(kvb_run *r);
} kvb_op;

/* registry.c */
const kvb_op *kvb_op_find(const char *name);
int kvb_op_count(void);
const kvb_op *kvb_op_at(int i);
#define KVB_IMPLS(table) .impls = (table), .n_impls = (int)(sizeof(table) / sizeof((table)[0]))
#define KVB_SCOPES(table) .scopes = (table), .n_scopes = (int)(sizeof(table) / sizeof((table)[0]))

/* run.c: tensors and the generic device lifecycle */
kvb_tensor *kvb_run_tensor(kvb_run *r, const char *name, kvb_dtype dt, int ndim, const int64_t *shape,
                           int role);
kvb_tensor *kvb_run_find(kvb_run *r, const char *name);
/* Host memory for an op's own buffers, zeroed and owned by the run: freed at kvb_run_teardown, or
 * earlier by kvb_run_free (never free()). A failure fails the case by name and size through the case
 * guard (no NULL returned): never call it inside an OpenMP parallel region. */
void *kvb_run_alloc(kvb_run *r, size_t bytes, const char *what);
void kvb_run_free(kvb_run *r, void *p);
int kvb_run_setup(kvb_run *r, const kvb_case *c, const kvb_ceilings *ceil);
int kvb_run_gpu_setup(kvb_run *r);  /* allocate, upload, op gpu_setup */
/* After a validation: launch again from the same inputs and compare every output bitwise with the
 * first launch's. Returns the number of differing elements (0: deterministic), naming the first
 * tensor that differs in `name`; -1 when the launch or a host allocation failed (kvb_last_error()).
 * Guarded itself: call it outside a case guard. */
int64_t kvb_run_repeat_differs(kvb_run *r, char *name, size_t name_n);
int kvb_run_reset(kvb_run *r);      /* restore INOUT, poison OUT (async on r->stream) */
int kvb_run_launch(kvb_run *r);     /* op launch + launch-error check */
int kvb_run_download(kvb_run *r);   /* sync, then copy OUT/INOUT tensors into t->out */
void kvb_run_teardown(kvb_run *r);
const char *kvb_run_impl(const kvb_run *r); /* the case's impl= value, or "kernel" */

/* The comparison of every OUT / INOUT tensor of a run with its reference. */
typedef struct kvb_verdict {
    int n;
    char name[KVB_MAX_TENSORS][32];
    kvb_cmp_result res[KVB_MAX_TENSORS];
    int invariants_checked; /* the op's out_check ran on every slice */
    char invariant_error[300]; /* its violation, "" when none */
    int pass;
} kvb_verdict;
void kvb_run_compare(kvb_run *r, kvb_verdict *v);  /* compare the downloaded outputs */
/* compare one output (t->out) with its reference by its rule (t->cmp), as kvb_run_compare does */
void kvb_run_compare_tensor(kvb_run *r, const kvb_tensor *t, kvb_cmp_result *res);
/* 1: kvb_run_compare stops at the first tensor that fails, each tensor at its first failing element (the
 * zeros check: whether a fault is caught, not where) */
void kvb_run_compare_verdict_only(int on);
int kvb_run_validate(kvb_run *r, kvb_verdict *v); /* reset, launch once, download, compare */
int kvb_run_wall_timed(const kvb_run *r);
/* Compositions (kernels/step/compose.h): copy a finished step's per-stage device times into r (an op's
 * stage_times hook). Defined only with CUDA, where the ops that compose kernels call it. */
struct kvb_step;
int kvb_run_stage_times(kvb_run *r, struct kvb_step *st);

/* A pinned host buffer reused across cases (the host-resident KV of the gather cases is gigabytes).
 * Contents are a pure function of (tag, seed, byte offset), so a later case with the same tag and
 * seed finds its first *valid bytes already filled and fills only the rest, then calls
 * kvb_host_pool_set_valid(). Without a device it is ordinary host memory.
 * It grows inside the case that needs it (a failure fails that case by name and size, and the run goes
 * on): to the largest need of the run's cases (kvb_host_pool_plan, before the case loop; nothing is
 * allocated there) when that leaves the case its own memory, else to the case's own need. */
void *kvb_host_pool(size_t bytes, const char *tag, uint64_t seed, size_t *valid);
void kvb_host_pool_set_valid(size_t bytes);
void kvb_host_pool_release(void);
void kvb_host_pool_plan(const kvb_case_list *cases);
size_t kvb_host_pool_held(void); /* bytes the pool holds now */

/* ---- host memory per case (run.c) ----
 * Before a case is set up, kvb_run_setup compares the op's estimate (kvb_op.host_bytes) with the host
 * memory the case may take: by default what the machine has free (MemAvailable of /proc/meminfo, or the
 * cgroup's headroom when that is smaller) plus what the pool already holds and the case reuses; or a
 * limit set with kvb_set_host_mem_limit (kvbench --host-mem-limit GB). A case above it fails, by name,
 * with the estimate and the limit, before anything is allocated. */
int kvb_host_mem_check(const kvb_case *c);
void kvb_set_host_mem_limit(double bytes); /* <= 0: the machine's free memory */
double kvb_host_mem_available(void);      /* bytes free now (MemAvailable, cgroup headroom); 0 if unknown */
/* The estimate of case c (its op's host_bytes; 0 when the op has none), SIZE_MAX when it saturates. */
size_t kvb_case_host_bytes(const kvb_case *c);
/* A double byte count as size_t, SIZE_MAX at or above 2^64 (and for NaN): host_bytes' last step. */
size_t kvb_host_bytes_sat(double bytes);
/* host_bytes' count of a tensor's host copies by its role: an IN tensor is held once (h); an OUT three
 * times (its reference, the download, the second copy of the zeros check or --determinism); an INOUT
 * four (its initial contents too). A SCRATCH tensor has no host copy. */
#define KVB_HOLD_IN 1.0
#define KVB_HOLD_OUT 3.0
#define KVB_HOLD_INOUT 4.0

#endif
