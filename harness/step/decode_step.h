/* decode_step.h: the decode_step op's methods (harness/step/ops_decode_step.c holds the block around
 * them; kernels/step/NOTES.md). One file per method: harness/step/decode_step_<method>.c.
 *
 * The block is the same for every method: ref_block_pre (norm, QKV, RoPE) gives q, knew, vnew; the
 * method's attention path turns them into att on its own state; ref_block_post finishes y. A method
 * brings its state (tensors of the run, built from seeded random activations by the suite's prefill
 * kernels on the device, by their references on the host), the reference of its attention path, its
 * stages on the GPU (a block_attention), and its bytes.
 *
 * The reference of the attention path: without a device, at setup from the host's q, knew, vnew (the
 * whole step on a CPU); with one, before each comparison from the device's own q, knew, vnew once they
 * pass their comparison with the host's: the state and att are then judged with the kernels' own
 * tolerances, and a selection near a tie is judged where it is made. The same device outputs as at the
 * last comparison (the launch after timing) reuse the reference computed then.
 */
#ifndef KVB_HARNESS_DECODE_STEP_H
#define KVB_HARNESS_DECODE_STEP_H

#include "reference/step/block.h"
#include "reference/int2.h"
#include "reference/omnikv.h"
#include "reference/step/step_rocketkv.h"
#include "reference/step/step_shadowkv.h"
#include "harness/core/op.h"
#if KVB_HAVE_CUDA
#include "kernels/step/step_block.h"
#endif

typedef struct step_case {
    const block_preset *m;
    int method; /* index in step_methods */
    int B, ctx; /* the prompt: ctx tokens */
    int gen;    /* tokens generated before this step: it decodes the token at position pos = ctx + gen */
    int budget; /* the sparse methods' token budget (rocketkv: T) */
    int all;    /* 1: the method's budget covers every token (the invariant: equals dense) */
    int64_t L;  /* pos + 1: dense's cache rows, the RoPE table's */
    rocketkv_shape rk; /* rocketkv: the kept cache and its knobs (rocketkv_budget) */
    int2_layout mk;    /* minikv: the cache before the step's append */
    int64_t mk_kept;   /* minikv: prompt tokens kept (heavy hitters and the recent window); the cache
                          holds mk_kept + gen */
    shadowkv_step_shape skv; /* shadowkv: the chunks, the buffer, the rank, the hits */
    int role;          /* omnikv: OMNIKV_ROLE_FILTER or OMNIKV_ROLE_SPARSE (reference/omnikv.h) */
    int ok_k;          /* omnikv: prompt tokens selected (budget; ctx with all=1) */
    int ok_n;          /* omnikv sparse: tokens attended, ok_k + gen + 1 (the decoded ones, this step's included) */
} step_case;

typedef struct step_method step_method;

typedef struct step_priv {
    step_case s;
    const step_method *method;
    uint8_t *seqs;       /* sampled reference: the sequences whose y is computed (NULL: all) */
    uint8_t *kv_slices;  /* the same per (b, kv head), for the attention references */
    kvb_bf16 *att;       /* [B, Hq, D]: the reference attention output */
    void *ms;            /* the method's private state */
    int from_device;     /* ref_attend called with the device's q, knew, vnew (its outputs downloaded) */
    char *last_inputs;   /* the device outputs the last reference was computed from (reference_inputs) */
    int last_valid;      /* 1: the references in the run are that one's */
#if KVB_HAVE_CUDA
    block_step_plan plan, plan_timed;
    block_attention attn[2];
    int planned;
    void *cublas, *cublas_ws;
#endif
} step_priv;

struct step_method {
    const char *name;
    const char *about; /* one line: the state and the attention path */
    /* The output (beside q, knew, vnew) that ref_attend reads from the device when p->from_device, e.g.
     * the pages it chose; NULL: none. */
    const char *device_choice;
    /* The method's keys into s (after the block's): refusals name the key and its range. */
    int (*shape)(const kvb_case *c, step_case *s);
    /* Its state tensors and their host contents (the prefill's result); p->ms may be set. */
    int (*setup)(kvb_run *r, step_priv *p);
    /* The attention path's reference from q, knew, vnew: the INOUT state's t->ref recomputed from t->h,
     * att [B, Hq, D] for the sampled sequences (p->kv_slices). Also checks the method's invariant
     * (a budget covering every token equals dense) where the case asks for it. */
    int (*ref_attend)(kvb_run *r, step_priv *p, const kvb_bf16 *q, const kvb_bf16 *knew, const kvb_bf16 *vnew,
                      kvb_bf16 *att);
    /* Optional, for a state that depends on the step's own q (shadowkv: which chunks are cached): built
     * from the host's q once ref_block_pre has it, by the references on a machine without a device
     * (host_prefill), by the device's prefill kernels otherwise (gpu_prefill_q, at GPU setup); the
     * step's reference is computed after it. */
    int (*host_prefill)(kvb_run *r, step_priv *p, const kvb_bf16 *q);
#if KVB_HAVE_CUDA
    int (*gpu_prefill_q)(kvb_run *r, step_priv *p, const kvb_bf16 *q);
    /* Device prefill (once): the state's initial device contents (t->d_init of its INOUT tensors) built
     * by the suite's prefill kernels from the activations. NULL: the uploaded host state is used. */
    int (*gpu_prefill)(kvb_run *r, step_priv *p);
    /* Plan the attention path for block plan `which` (0: replayed/eager, 1: stage-timed) into *a;
     * NULL: dense (the block's own kv_append and decode_attn). */
    int (*attention)(kvb_run *r, step_priv *p, int which, block_attention *a);
    void (*destroy)(step_priv *p);
#endif
    /* Bytes one step moves for attention, each once: device (state and metadata read or written) and
     * host (offload); flops of the path. */
    void (*bytes)(const kvb_run *r, const step_priv *p, double *dev, double *host, double *flops);
    /* The state one sequence keeps for this layer: device bytes and host bytes (pinned). */
    void (*state_bytes)(const step_case *s, double *dev, double *host);
    /* Host memory of the method's part of a case (its tensors by role as kvb_op.host_bytes counts them,
     * its buffers, its references' scratch, the host pool), from the shape alone. NULL: not estimated
     * (the case is then not checked against the machine's memory). */
    double (*host_bytes)(const step_case *s);
    void (*teardown)(step_priv *p);
};

extern const step_method step_method_dense, step_method_rocketkv, step_method_minikv, step_method_shadowkv,
    step_method_omnikv;

/* Shared by the methods' files. */
kvb_tensor *step_tensor(kvb_run *r, const char *name, kvb_dtype dt, int ndim, int64_t a, int64_t b, int64_t c,
                        int64_t d, int role);
void step_fill_ints(kvb_tensor *t, int v);
void step_ref_reset(kvb_tensor *t); /* t->ref = t->h: an INOUT tensor's reference starts from its initial value */
#if KVB_HAVE_CUDA
void *step_dev(kvb_run *r, const char *name);
#endif

#endif
