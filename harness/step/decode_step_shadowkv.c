/* decode_step_shadowkv.c: decode_step method=shadowkv (decode_step.h; the path:
 * kernels/step/step_shadowkv.h, reference/step/step_shadowkv.h; kernels/step/NOTES.md; the prefill:
 * kernels/shadowkv/NOTES.md).
 *
 * The prompt's activations: pre-RoPE keys Kpre [S, Hkv*D] (fp32, seeded normal) and their post-RoPE
 * bf16 keys (the block's RoPE table), values from the suite's pinned host pool. Sequence b's keys are
 * those of prompt b mod 2 (the host draws 2 prompts whatever B: drawing 48 x 60K x 1024 normals per case
 * would take minutes), its values its own. The prefill state is built by the suite's prefill kernels
 * on the device (shadowkv_lowrank per distinct prompt: U, SV; shadowkv_landmarks: landmarks, their
 * chunk ids, the outliers) and downloaded as the host's copy, so the reference decodes exactly the
 * state the device decodes; the prefill kernels are held to their references (the 1.02 Eckart-Young
 * bound, the landmarks) by the shadowkv_lowrank and shadowkv_landmarks cases. On a machine without a
 * device the references build it (LAPACKE's SVD, ref_shadowkv_chunks).
 *
 * The buffer before the step: the local window and the outlier chunks (exact K, V), the M sparse slots
 * holding the chunks of the previous step (exact post-RoPE keys, their values), gen generated tokens
 * (seeded normal). The previous step's chunks are drawn so that `hit` of the M chunks this step picks
 * (landmark scoring of the host's q) are cached (ShadowKV reports about 60%), the rest other landmark
 * chunks: the step fetches the others' values from the host and rebuilds their keys.
 *
 * all=1: every landmark chunk selected (M = Lm) at full rank (r = Hkv*D): the reference must equal dense
 * attention over every token (exact keys), within the op's tolerance (the keys are rebuilt from bf16
 * factors).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reference/step/step_shadowkv.h"
#include "harness/core/compare.h"
#include "harness/step/decode_step.h"
#include "harness/ops/ops.h"
#if KVB_HAVE_CUDA
#include "kernels/landmark_score/landmark_score.h"
#include "kernels/shadowkv/shadowkv.h"
#include "kernels/step/step_shadowkv.h"
#endif

enum { SKV_PROMPTS = 2 }; /* distinct prompts drawn; sequence b has prompt b mod 2 */

typedef struct skv_priv {
    int P;              /* distinct prompts: min(B, SKV_PROMPTS) */
    kvb_bf16 *Vlocal;   /* [B, Hkv, n_local, D]: the local window's values */
    int32_t *outliers;  /* [B, Hkv, outlier_chunks] */
    float *chunk_scores; /* [B*Hkv, n_chunks]: the reference m at each landmark's chunk id, -inf elsewhere */
    double *tol_mag;    /* Kbuf: the rebuilt keys' tolerance magnitude, 0 elsewhere */
#if KVB_HAVE_CUDA
    shadowkv_path path[2];
#endif
} skv_priv;

static int shape_skv(const kvb_case *c, step_case *s)
{
    const block_preset *m = s->m;
    int budget = s->budget, r = kvb_case_int(c, "rank");
    if (s->all) { /* every landmark chunk at full rank */
        int n_chunks, Lm;
        if (shadowkv_chunk_counts(s->ctx, SKV_CHUNK, SKV_LOCAL_CHUNKS, SKV_OUTLIER_CHUNKS, &n_chunks, &Lm,
                                  "decode_step method=shadowkv"))
            return KVB_EINVAL;
        if (Lm > GATHER_MAX_M) /* named here: the layout's check would name M, derived from all */
            return kvb_fail(KVB_EINVAL, "decode_step method=shadowkv: all=1 at ctx=%lld selects every landmark chunk, "
                            "%d of them, past the %d sparse slots a step fetches: all=1 needs ctx <= %d",
                            (long long)s->ctx, Lm, GATHER_MAX_M,
                            (GATHER_MAX_M + SKV_LOCAL_CHUNKS + SKV_OUTLIER_CHUNKS + 1) * SKV_CHUNK - 1);
        budget = Lm * SKV_CHUNK, r = m->Hkv * m->D;
    }
    /* the CUDA step rebuilds keys with batch_gemm_rotary's kernel (the rank key's range is its limit) */
    if (s->all && r > BGR_KERNEL_MAX_RANK)
        return kvb_fail(KVB_EINVAL, "decode_step method=shadowkv: all=1 takes the full rank Hkv*D = %d, past the %d "
                        "batch_gemm_rotary's kernel takes: all=1 needs a model with Hkv*D <= %d (model=tiny)", r,
                        BGR_KERNEL_MAX_RANK, BGR_KERNEL_MAX_RANK);
    return shadowkv_step_shape_make(&s->skv, s->B, m->Hq, m->Hkv, m->D, s->ctx, budget, r, kvb_case_get(c, "hit"),
                                    s->gen, (int)s->L);
}

/* ---- the activations ---- */

static int setup_skv(kvb_run *r, step_priv *p)
{
    const shadowkv_step_shape *sh = &p->s.skv;
    const shadowkv_layout *L = &sh->L;
    const gather_layout *g = &L->g;
    const int B = sh->B, Hkv = sh->Hkv, D = sh->D, S = sh->S, M = g->M;
    skv_priv *q = kvb_run_alloc(r, sizeof *q, "shadowkv method state");
    p->ms = q;
    q->P = B < SKV_PROMPTS ? B : SKV_PROMPTS;
    snprintf(r->note, sizeof r->note, "M=%d chunks (of Lm=%d), %d cached, r=%d, NB=%d%s", M, L->Lm, sh->n_hit, sh->r,
             g->NB, p->s.all ? " (every chunk, full rank)" : "");

    /* activations: Kpre (the SVD's input) and the post-RoPE keys of the distinct prompts */
    kvb_tensor *kpre = step_tensor(r, "Kpre", KVB_FP32, 3, q->P, S, (int64_t)Hkv * D, 0, KVB_IN);
    kvb_tensor *kpost = step_tensor(r, "K_prompt", KVB_BF16, 4, q->P, Hkv, S, D, KVB_IN);
    kpre->flags |= KVB_T_NO_DUMP, kpost->flags |= KVB_T_NO_DUMP;
    kvb_fill_f32_normal(kpre->h, kpre->n, r->seed, kvb_stream_of("Kpre"), 0, 0, 1);
    const kvb_bf16 *cs = kvb_run_find(r, "cos_sin")->h;
    for (int j = 0; j < q->P; j++)
        ref_shadowkv_rope_keys((const float *)kpre->h + (int64_t)j * S * Hkv * D, cs, S, Hkv, D,
                               (kvb_bf16 *)kpost->h + (int64_t)j * Hkv * S * D);
    /* values: every chunk before the local window in pinned host memory (the pool), the window's own */
    int64_t vs[5] = {B, Hkv, L->n_chunks, L->c, D};
    kvb_tensor *vh = kvb_run_tensor(r, "Vh", KVB_BF16, 5, vs, 0); /* role 0: no host copy allocated */
    vh->role = KVB_IN;
    vh->flags = KVB_T_HOST_MAPPED | KVB_T_NO_DUMP;
    size_t valid, bytes = (size_t)vh->n * 2;
    vh->h = kvb_host_pool(bytes, "host_kv", r->seed, &valid);
    if (valid / 2 < (size_t)vh->n)
        kvb_fill_bf16_normal((kvb_bf16 *)vh->h + valid / 2, vh->n - (int64_t)(valid / 2), r->seed,
                             kvb_stream_of("host_kv"), (int64_t)(valid / 2), 0, 1);
    kvb_host_pool_set_valid(bytes);
    q->Vlocal = kvb_run_alloc(r, sizeof(kvb_bf16) * (size_t)B * Hkv * L->n_local * D, "local values");
    kvb_fill_bf16_normal(q->Vlocal, (int64_t)B * Hkv * L->n_local * D, r->seed, kvb_stream_of("V_local"), 0, 0, 1);
    q->outliers = kvb_run_alloc(r, sizeof(int32_t) * (size_t)B * Hkv * L->outlier_chunks + 4, "outliers");

    /* the state the prefill builds */
    kvb_tensor *U = step_tensor(r, "U", KVB_BF16, 3, B, S, sh->r, 0, KVB_IN);
    step_tensor(r, "SV", KVB_BF16, 4, B, Hkv, sh->r, D, KVB_IN);
    kvb_tensor *lm = step_tensor(r, "landmarks", KVB_BF16, 4, B, Hkv, L->Lm, D, KVB_IN);
    step_tensor(r, "landmark_idx", KVB_I32, 3, B, Hkv, L->Lm, 0, KVB_IN);
    U->flags |= KVB_T_NO_DUMP, lm->flags |= KVB_T_NO_DUMP;
    /* the buffer and its slot tags (built after the prefill: they depend on the outliers and the chunks) */
    kvb_tensor *ci = step_tensor(r, "cached_ids", KVB_I32, 3, B, Hkv, M, 0, KVB_INOUT);
    kvb_tensor *kb = step_tensor(r, "Kbuf", KVB_BF16, 4, B, Hkv, g->NB, D, KVB_INOUT);
    kvb_tensor *vb = step_tensor(r, "Vbuf", KVB_BF16, 4, B, Hkv, g->NB, D, KVB_INOUT);
    kb->flags |= KVB_T_NO_DUMP, vb->flags |= KVB_T_NO_DUMP;
    ci->cmp = vb->cmp = KVB_CMP_EXACT;
    kb->tol = (kvb_tol){0, 1e-2, 4e-3}; /* batch_gemm_rotary's; 0 (bit-exact) outside the rebuilt keys */
    /* the step's outputs besides att */
    kvb_tensor *ch = step_tensor(r, "chunks", KVB_I32, 3, B, Hkv, M, 0, KVB_OUT);
    kvb_tensor *m = step_tensor(r, "m", KVB_FP32, 3, B, Hkv, L->Lm, 0, KVB_OUT);
    kvb_tensor *off = step_tensor(r, "offsets", KVB_I32, 3, B, Hkv, M, 0, KVB_OUT);
    kvb_tensor *cn = step_tensor(r, "cnts", KVB_I32, 2, B, Hkv, 0, 0, KVB_OUT);
    kvb_tensor *bad = step_tensor(r, "bad", KVB_I32, 1, 1, 0, 0, 0, KVB_OUT);
    ch->cmp = KVB_CMP_INDEXSET;
    m->tol = (kvb_tol){1e-9, 1e-3, 1e-4}; /* landmark_score's */
    off->cmp = cn->cmp = bad->cmp = KVB_CMP_EXACT;
    ch->slice_len = M, m->slice_len = L->Lm, off->slice_len = M, cn->slice_len = 1, ci->slice_len = M;
    kb->slice_len = vb->slice_len = (int64_t)g->NB * D;
    q->chunk_scores = kvb_run_alloc(r, sizeof(float) * (size_t)B * Hkv * L->n_chunks, "chunk scores");
    q->tol_mag = kvb_run_alloc(r, sizeof(double) * (size_t)kb->n, "Kbuf tolerance magnitudes");
    const int slot = L->decode_start + sh->gen;
    step_fill_ints(step_tensor(r, "slot", KVB_I32, 1, B, 0, 0, 0, KVB_IN), slot);
    step_fill_ints(step_tensor(r, "len", KVB_I32, 1, B, 0, 0, 0, KVB_IN), slot + 1);
    size_t ws_score = 1, ws_gather = 1, ws_attn = 1;
#if KVB_HAVE_CUDA
    if (kvb_gpu_available()) {
        int rc = shadowkv_workspace_bytes(sh, &ws_score, &ws_gather, &ws_attn);
        if (rc) return rc;
    }
#endif
    step_tensor(r, "ws_score", KVB_U8, 1, (int64_t)ws_score, 0, 0, 0, KVB_SCRATCH);
    step_tensor(r, "ws_v", KVB_U8, 1, (int64_t)ws_gather, 0, 0, 0, KVB_SCRATCH);
    step_tensor(r, "ws_k", KVB_U8, 1, (int64_t)ws_gather, 0, 0, 0, KVB_SCRATCH);
    step_tensor(r, "ws_attn", KVB_U8, 1, (int64_t)ws_attn, 0, 0, 0, KVB_SCRATCH);
    return KVB_OK;
}

/* ---- the buffer before the step ---- */

/* The previous step's chunks per row: n_hit of this step's selection sel [M] and M - n_hit other
 * landmark chunks (-1, an empty slot, where the row has too few), in seeded random slot order. */
static void previous_chunks(const shadowkv_step_shape *sh, const int32_t *sel, const int32_t *landmark_idx,
                            kvb_rng *rng, int32_t *perm, int32_t *pick, int32_t *out)
{
    const int M = sh->L.g.M, Lm = sh->L.Lm, n_hit = sh->n_hit;
    kvb_draw_distinct(rng, perm, M, n_hit, pick);
    int n = 0;
    for (int i = 0; i < n_hit; i++) out[n++] = sel[pick[i]];
    /* the landmark chunks the step does not pick (both lists ascending) */
    int others = 0;
    for (int l = 0, i = 0; l < Lm; l++) {
        while (i < M && sel[i] < landmark_idx[l]) i++;
        if (i == M || sel[i] != landmark_idx[l]) perm[others++] = landmark_idx[l];
    }
    const int want = M - n_hit < others ? M - n_hit : others;
    for (int i = 0; i < want; i++) { /* partial Fisher-Yates over the others */
        const int j = i + (int)kvb_rng_below(rng, (uint64_t)(others - i));
        const int32_t t = perm[i];
        perm[i] = perm[j], perm[j] = t;
        out[n++] = perm[i];
    }
    while (n < M) out[n++] = -1;
    kvb_shuffle_i32(rng, out, M);
}

/* Kbuf, Vbuf and cached_ids before the step, from the activations, the outliers and this step's chunks
 * (sel [B, Hkv, M], chosen by the host's q). */
static int build_buffer(kvb_run *r, step_priv *p, const int32_t *sel)
{
    const shadowkv_step_shape *sh = &p->s.skv;
    const shadowkv_layout *L = &sh->L;
    const gather_layout *g = &L->g;
    skv_priv *q = p->ms;
    const int Hkv = sh->Hkv, D = sh->D, S = sh->S, M = g->M, NB = g->NB, c = L->c;
    const size_t row = sizeof(kvb_bf16) * (size_t)D;
    kvb_tensor *kb = kvb_run_find(r, "Kbuf"), *vb = kvb_run_find(r, "Vbuf"), *ci = kvb_run_find(r, "cached_ids");
    const kvb_bf16 *kpost = kvb_run_find(r, "K_prompt")->h, *vh = kvb_run_find(r, "Vh")->h;
    const int32_t *lidx = kvb_run_find(r, "landmark_idx")->h;
    memset(kb->h, 0, (size_t)kb->n * 2), memset(vb->h, 0, (size_t)vb->n * 2);
    int32_t *perm = kvb_run_alloc(r, sizeof(int32_t) * (size_t)(L->Lm + M), "the previous chunks' draw");
    int32_t *pick = kvb_run_alloc(r, sizeof(int32_t) * (size_t)M, "the previous chunks' hits");
    for (int64_t bh = 0; bh < (int64_t)sh->B * Hkv; bh++) {
        const int b = (int)(bh / Hkv), h = (int)(bh % Hkv);
        const kvb_bf16 *kp = kpost + ((int64_t)(b % q->P) * Hkv + h) * S * D; /* [S, D] */
        const kvb_bf16 *vc = vh + bh * L->n_chunks * c * D;                    /* [n_chunks * c, D] */
        kvb_bf16 *kr = (kvb_bf16 *)kb->h + bh * NB * D, *vr = (kvb_bf16 *)vb->h + bh * NB * D;
        /* the local window */
        memcpy(kr, kp + (int64_t)L->n_chunks * c * D, row * L->n_local);
        memcpy(vr, q->Vlocal + bh * L->n_local * D, row * L->n_local);
        /* the outliers */
        for (int o = 0; o < L->outlier_chunks; o++) {
            const int64_t k = q->outliers[bh * L->outlier_chunks + o];
            memcpy(kr + ((int64_t)L->outlier_start + o * c) * D, kp + k * c * D, row * c);
            memcpy(vr + ((int64_t)L->outlier_start + o * c) * D, vc + k * c * D, row * c);
        }
        /* the sparse slots: the previous step's chunks */
        kvb_rng rng = kvb_rng_make(r->seed, kvb_stream_of("cached_ids") + (uint64_t)bh);
        int32_t *tags = (int32_t *)ci->h + bh * M;
        previous_chunks(sh, sel + bh * M, lidx + bh * L->Lm, &rng, perm, pick, tags);
        for (int i = 0; i < M; i++)
            if (tags[i] >= 0) {
                memcpy(kr + ((int64_t)g->sparse_start + i * c) * D, kp + (int64_t)tags[i] * c * D, row * c);
                memcpy(vr + ((int64_t)g->sparse_start + i * c) * D, vc + (int64_t)tags[i] * c * D, row * c);
            }
        /* the tokens generated since the prompt */
        const uint64_t first = (uint64_t)bh * SKV_DECODE_CAPACITY * D;
        kvb_fill_bf16_normal(kr + (int64_t)L->decode_start * D, (int64_t)sh->gen * D, r->seed, kvb_stream_of("K_gen"),
                             (int64_t)first, 0, 1);
        kvb_fill_bf16_normal(vr + (int64_t)L->decode_start * D, (int64_t)sh->gen * D, r->seed, kvb_stream_of("V_gen"),
                             (int64_t)first, 0, 1);
    }
    kvb_run_free(r, perm), kvb_run_free(r, pick);
    return KVB_OK;
}

/* Without a device: the prefill by the references, then the buffer from the host's q. */
static int host_prefill_skv(kvb_run *r, step_priv *p, const kvb_bf16 *q_host)
{
    const shadowkv_step_shape *sh = &p->s.skv;
    const shadowkv_layout *L = &sh->L;
    skv_priv *q = p->ms;
    const int B = sh->B, Hkv = sh->Hkv, D = sh->D, S = sh->S, R = sh->r, N = Hkv * D;
    kvb_tensor *U = kvb_run_find(r, "U"), *SV = kvb_run_find(r, "SV"), *lm = kvb_run_find(r, "landmarks"),
               *li = kvb_run_find(r, "landmark_idx");
    const float *kpre = kvb_run_find(r, "Kpre")->h;
    const kvb_bf16 *kpost = kvb_run_find(r, "K_prompt")->h;
    float *u = kvb_run_alloc(r, sizeof(float) * (size_t)S * R, "the prefill's U"), *sv = kvb_run_alloc(r, sizeof(float) * (size_t)N * R, "the prefill's SV");
    const int64_t lm_per = (int64_t)Hkv * L->Lm, out_per = (int64_t)Hkv * L->outlier_chunks;
    int rc = KVB_OK;
    for (int j = 0; j < q->P && !rc; j++) {
        rc = ref_shadowkv_lowrank(kpre + (int64_t)j * S * N, S, Hkv, D, R, u, sv, NULL);
        if (rc) break;
        shadowkv_round_bf16(u, (int64_t)S * R, (kvb_bf16 *)U->h + (int64_t)j * S * R);
        shadowkv_round_bf16(sv, (int64_t)N * R, (kvb_bf16 *)SV->h + (int64_t)j * N * R);
        rc = ref_shadowkv_chunks(kpost + (int64_t)j * Hkv * S * D, Hkv, S, D, L->c, L->local_chunks, L->outlier_chunks,
                                 (kvb_bf16 *)lm->h + j * lm_per * D, (int32_t *)li->h + j * lm_per,
                                 q->outliers + j * out_per, NULL);
    }
    kvb_run_free(r, u), kvb_run_free(r, sv);
    if (rc) return rc;
    for (int b = q->P; b < B; b++) { /* the other sequences share their prompt's prefill */
        const int j = b % q->P;
        memcpy((kvb_bf16 *)U->h + (int64_t)b * S * R, (kvb_bf16 *)U->h + (int64_t)j * S * R, 2 * (size_t)S * R);
        memcpy((kvb_bf16 *)SV->h + (int64_t)b * N * R, (kvb_bf16 *)SV->h + (int64_t)j * N * R, 2 * (size_t)N * R);
        memcpy((kvb_bf16 *)lm->h + b * lm_per * D, (kvb_bf16 *)lm->h + j * lm_per * D, 2 * (size_t)(lm_per * D));
        memcpy((int32_t *)li->h + b * lm_per, (int32_t *)li->h + j * lm_per, 4 * (size_t)lm_per);
        memcpy(q->outliers + b * out_per, q->outliers + j * out_per, 4 * (size_t)out_per);
    }
    /* this step's chunks, as the host's q picks them */
    const lms_shape ls = {B, sh->Hq, Hkv, D, L->Lm, L->g.M};
    int32_t *sel = kvb_run_alloc(r, sizeof(int32_t) * (size_t)B * Hkv * L->g.M, "this step's chunks");
    float *m = kvb_run_alloc(r, sizeof(float) * (size_t)B * Hkv * L->Lm, "this step's chunk scores");
    rc = ref_landmark_score(q_host, lm->h, li->h, &ls, L->n_chunks, NULL, sel, m);
    if (!rc) rc = build_buffer(r, p, sel);
    kvb_run_free(r, sel), kvb_run_free(r, m);
    return rc;
}

/* ---- the reference of the path ---- */

/* all=1: dense attention over every token (the prompt's exact keys and values, the generated ones, the
 * new one) must equal the path's, within the op's tolerance */
static int dense_invariant(kvb_run *r, step_priv *p, const kvb_bf16 *q_in, const kvb_bf16 *knew, const kvb_bf16 *vnew,
                           const kvb_bf16 *att)
{
    const shadowkv_step_shape *sh = &p->s.skv;
    const shadowkv_layout *L = &sh->L;
    skv_priv *q = p->ms;
    const int B = sh->B, Hkv = sh->Hkv, D = sh->D, S = sh->S, c = L->c, n = S + sh->gen + 1;
    const decode_layout d = {B, sh->Hq, Hkv, D, n};
    kvb_bf16 *K = kvb_run_alloc(r, 2 * (size_t)B * Hkv * n * D, "dense keys (all=1)");
    kvb_bf16 *V = kvb_run_alloc(r, 2 * (size_t)B * Hkv * n * D, "dense values (all=1)");
    kvb_bf16 *o = kvb_run_alloc(r, 2 * (size_t)B * sh->Hq * D, "dense attention (all=1)");
    int32_t *len = kvb_run_alloc(r, sizeof(int32_t) * (size_t)B, "dense lengths (all=1)");
    const kvb_bf16 *kpost = kvb_run_find(r, "K_prompt")->h, *vh = kvb_run_find(r, "Vh")->h;
    const kvb_bf16 *kb = kvb_run_find(r, "Kbuf")->h, *vb = kvb_run_find(r, "Vbuf")->h;
    const size_t row = 2 * (size_t)D;
    for (int64_t bh = 0; bh < (int64_t)B * Hkv; bh++) {
        const int b = (int)(bh / Hkv), h = (int)(bh % Hkv);
        kvb_bf16 *kr = K + bh * n * D, *vr = V + bh * n * D;
        memcpy(kr, kpost + ((int64_t)(b % q->P) * Hkv + h) * S * D, row * S);
        memcpy(vr, vh + bh * L->n_chunks * c * D, row * L->n_chunks * c);
        memcpy(vr + (int64_t)L->n_chunks * c * D, q->Vlocal + bh * L->n_local * D, row * L->n_local);
        memcpy(kr + (int64_t)S * D, kb + (bh * L->g.NB + L->decode_start) * D, row * sh->gen);
        memcpy(vr + (int64_t)S * D, vb + (bh * L->g.NB + L->decode_start) * D, row * sh->gen);
        memcpy(kr + (int64_t)(n - 1) * D, knew + bh * D, row);
        memcpy(vr + (int64_t)(n - 1) * D, vnew + bh * D, row);
    }
    for (int b = 0; b < B; b++) len[b] = n;
    int rc = ref_decode_attn(q_in, K, V, len, o, &d, p->kv_slices);
    const kvb_tol tol = r->op->tol;
    const int64_t per_slice = (int64_t)(sh->Hq / Hkv) * D;
    for (int64_t i = 0; !rc && i < (int64_t)B * sh->Hq * D; i++) {
        if (p->kv_slices && !p->kv_slices[i / per_slice]) continue;
        const double x = kvb_bf16_to_double(att[i]), y = kvb_bf16_to_double(o[i]);
        if (!(fabs(x - y) <= tol.atol + tol.rtol * fabs(y)))
            rc = kvb_fail(KVB_EINVAL, "decode_step method=shadowkv all=1: the path's attention differs from dense "
                          "attention over every token at element %lld: %g vs %g (tolerance atol %g, rtol %g)",
                          (long long)i, x, y, tol.atol, tol.rtol);
    }
    kvb_run_free(r, K), kvb_run_free(r, V), kvb_run_free(r, o), kvb_run_free(r, len);
    return rc;
}

static int ref_attend_skv(kvb_run *r, step_priv *p, const kvb_bf16 *q_in, const kvb_bf16 *knew, const kvb_bf16 *vnew,
                          kvb_bf16 *att)
{
    const shadowkv_step_shape *sh = &p->s.skv;
    const shadowkv_layout *L = &sh->L;
    const gather_layout *g = &L->g;
    skv_priv *q = p->ms;
    kvb_tensor *ci = kvb_run_find(r, "cached_ids"), *kb = kvb_run_find(r, "Kbuf"), *vb = kvb_run_find(r, "Vbuf"),
               *ch = kvb_run_find(r, "chunks"), *m = kvb_run_find(r, "m"), *off = kvb_run_find(r, "offsets"),
               *cn = kvb_run_find(r, "cnts"), *lidx = kvb_run_find(r, "landmark_idx");
    step_ref_reset(ci), step_ref_reset(kb), step_ref_reset(vb);
    *(int32_t *)kvb_run_find(r, "bad")->ref = 0;
    shadowkv_state st = {kvb_run_find(r, "landmarks")->h, lidx->h, kvb_run_find(r, "U")->h,
                         kvb_run_find(r, "SV")->h, kvb_run_find(r, "cos_sin")->h, kvb_run_find(r, "Vh")->h,
                         ci->ref, kb->ref, vb->ref};
    const int32_t *use = p->from_device ? ch->out : NULL;
    int rc = ref_shadowkv_step(sh, &st, q_in, knew, vnew, use, ch->ref, m->ref, off->ref, cn->ref, att, p->kv_slices);
    if (rc) return rc;
    /* the slices compared */
    const uint8_t *rows = p->kv_slices;
    ch->slice_mask = m->slice_mask = off->slice_mask = cn->slice_mask = ci->slice_mask = rows;
    kb->slice_mask = vb->slice_mask = rows;
    /* chunks are judged as index sets by the reference's score of each chunk id (an outlier chunk has no
     * landmark: -inf), tolerance 1e-3 of the smallest M-th score of a compared row (landmark_score's) */
    const int64_t n_rows = (int64_t)sh->B * sh->Hkv;
    double kth = INFINITY;
    for (int64_t row = 0; row < n_rows; row++) {
        if (rows && !rows[row]) continue;
        float *cs = q->chunk_scores + row * L->n_chunks;
        const float *mr = (const float *)m->ref + row * L->Lm;
        const int32_t *ir = (const int32_t *)lidx->h + row * L->Lm, *sel = (const int32_t *)ch->ref + row * g->M;
        for (int64_t k = 0; k < L->n_chunks; k++) cs[k] = -INFINITY;
        for (int l = 0; l < L->Lm; l++) cs[ir[l]] = mr[l];
        for (int i = 0; i < g->M; i++)
            if (cs[sel[i]] < kth) kth = cs[sel[i]];
    }
    ch->scores = q->chunk_scores, ch->scores_dtype = KVB_FP32, ch->scores_n = L->n_chunks;
    ch->set_tol = 1e-3 * kth;
    /* Kbuf: the rebuilt keys (miss slots of the compared rows) within batch_gemm_rotary's tolerance,
     * 1e-2 max(|ref|, rms of the key); every other element bit for bit */
    memset(q->tol_mag, 0, sizeof(double) * (size_t)kb->n);
    const kvb_bf16 *kr = kb->ref;
    const int32_t *cnts = cn->ref;
    for (int64_t bh = 0; bh < n_rows; bh++) {
        if (rows && !rows[bh]) continue;
        for (int64_t s = (int64_t)cnts[bh] * g->c; s < (int64_t)g->M * g->c; s++) {
            const int64_t at = (bh * g->NB + g->sparse_start + s) * sh->D;
            double ss = 0;
            for (int d = 0; d < sh->D; d++) ss += kvb_bf16_to_double(kr[at + d]) * kvb_bf16_to_double(kr[at + d]);
            const double rms = sqrt(ss / sh->D);
            for (int d = 0; d < sh->D; d++) q->tol_mag[at + d] = fmax(fabs(kvb_bf16_to_double(kr[at + d])), rms);
        }
    }
    kb->tol_mag = q->tol_mag;
    return p->s.all ? dense_invariant(r, p, q_in, knew, vnew, att) : KVB_OK;
}

#if KVB_HAVE_CUDA
/* The prefill on the device, by the suite's kernels, downloaded as the host's state; then the buffer
 * from the host's q (its chunks scored on the device by landmark_score). */
static int gpu_prefill_skv(kvb_run *r, step_priv *p, const kvb_bf16 *q_host)
{
    const shadowkv_step_shape *sh = &p->s.skv;
    const shadowkv_layout *L = &sh->L;
    skv_priv *q = p->ms;
    const int B = sh->B, Hkv = sh->Hkv, D = sh->D, S = sh->S, R = sh->r, N = Hkv * D, P = q->P;
    kvb_tensor *U = kvb_run_find(r, "U"), *SV = kvb_run_find(r, "SV"), *lm = kvb_run_find(r, "landmarks"),
               *li = kvb_run_find(r, "landmark_idx");
    /* 1. the low-rank factors of each distinct prompt */
    shadowkv_lowrank_plan plan;
    int rc = shadowkv_lowrank_plan_make(&plan, S, Hkv, D, R, SHADOWKV_EIG_RANDOMIZED, r->stream);
    if (rc) return rc;
    void *ws = kvb_dmalloc(plan.workspace_bytes ? plan.workspace_bytes : 1);
    float *u = kvb_dmalloc(sizeof(float) * (size_t)S * R), *sv = kvb_dmalloc(sizeof(float) * (size_t)N * R);
    int *info = kvb_dmalloc(sizeof(int) * (size_t)P);
    const float *kpre = kvb_run_find(r, "Kpre")->d;
    for (int j = 0; j < P && !rc; j++)
        rc = shadowkv_lowrank(&plan, kpre + (int64_t)j * S * N, u, sv, (kvb_bf16 *)U->d + (int64_t)j * S * R,
                              (kvb_bf16 *)SV->d + (int64_t)j * N * R, info + j, ws, NULL, NULL, r->stream);
    int info_h[SKV_PROMPTS] = {0};
    kvb_d2h(info_h, info, sizeof(int) * (size_t)P, r->stream);
    kvb_sync(r->stream);
    shadowkv_lowrank_plan_free(&plan);
    kvb_dfree(ws), kvb_dfree(u), kvb_dfree(sv), kvb_dfree(info);
    if (rc) return rc;
    for (int j = 0; j < P; j++)
        if (info_h[j]) return kvb_fail(KVB_EDEVICE, "decode_step method=shadowkv: the eigensolver of prompt %d did not "
                                       "converge (info %d)", j, info_h[j]);
    /* 2. landmarks and outliers of the distinct prompts */
    const size_t lws = shadowkv_landmarks_workspace_bytes(P, Hkv, L->n_chunks, D);
    void *lw = kvb_dmalloc(lws ? lws : 1);
    int32_t *outl = kvb_dmalloc(sizeof(int32_t) * (size_t)P * Hkv * L->outlier_chunks + 4);
    float *min_cos = kvb_dmalloc(sizeof(float) * (size_t)P * Hkv * L->n_chunks);
    rc = shadowkv_landmarks(kvb_run_find(r, "K_prompt")->d, P, Hkv, S, D, L->c, L->local_chunks, L->outlier_chunks,
                            lm->d, li->d, outl, min_cos, lw, r->stream);
    kvb_d2h(q->outliers, outl, sizeof(int32_t) * (size_t)P * Hkv * L->outlier_chunks, r->stream);
    kvb_sync(r->stream);
    kvb_dfree(lw), kvb_dfree(outl), kvb_dfree(min_cos);
    if (rc) return rc;
    /* 3. the other sequences share their prompt's prefill; the host's copy is the device's */
    const int64_t lm_per = (int64_t)Hkv * L->Lm, out_per = (int64_t)Hkv * L->outlier_chunks;
    for (int b = P; b < B; b++) {
        const int j = b % P;
        kvb_d2d((kvb_bf16 *)U->d + (int64_t)b * S * R, (kvb_bf16 *)U->d + (int64_t)j * S * R, 2 * (size_t)S * R, r->stream);
        kvb_d2d((kvb_bf16 *)SV->d + (int64_t)b * N * R, (kvb_bf16 *)SV->d + (int64_t)j * N * R, 2 * (size_t)N * R,
                r->stream);
        kvb_d2d((kvb_bf16 *)lm->d + b * lm_per * D, (kvb_bf16 *)lm->d + j * lm_per * D, 2 * (size_t)(lm_per * D),
                r->stream);
        kvb_d2d((int32_t *)li->d + b * lm_per, (int32_t *)li->d + j * lm_per, 4 * (size_t)lm_per, r->stream);
        memcpy(q->outliers + b * out_per, q->outliers + j * out_per, 4 * (size_t)out_per);
    }
    kvb_d2h(U->h, U->d, 2 * (size_t)U->n, r->stream);
    kvb_d2h(SV->h, SV->d, 2 * (size_t)SV->n, r->stream);
    kvb_d2h(lm->h, lm->d, 2 * (size_t)lm->n, r->stream);
    kvb_d2h(li->h, li->d, 4 * (size_t)li->n, r->stream);
    /* 4. this step's chunks as the host's q picks them, scored by the suite's kernel */
    const lms_shape ls = {B, sh->Hq, Hkv, D, L->Lm, L->g.M};
    kvb_bf16 *qd = kvb_dmalloc(2 * (size_t)B * sh->Hq * D);
    kvb_h2d(qd, q_host, 2 * (size_t)B * sh->Hq * D, r->stream);
    kvb_tensor *ch = kvb_run_find(r, "chunks");
    size_t sws;
    if ((rc = landmark_score_workspace_bytes(&ls, &sws))) return rc;
    const lms_args a = {qd, lm->d, li->d, ch->d, kvb_run_find(r, "m")->d, kvb_run_find(r, "ws_score")->d, sws};
    rc = landmark_score(&ls, &a, r->stream);
    int32_t *sel = kvb_run_alloc(r, sizeof(int32_t) * (size_t)ch->n, "this step's chunks");
    kvb_d2h(sel, ch->d, sizeof(int32_t) * (size_t)ch->n, r->stream);
    kvb_sync(r->stream);
    kvb_dfree(qd);
    if (!rc && (rc = lms_landmark_idx_check(li->h, (int64_t)B * Hkv, L->Lm, L->n_chunks, "decode_step method=shadowkv")))
        rc = kvb_fail(KVB_EINVAL, "decode_step method=shadowkv: the device's landmark_idx: %s", kvb_last_error());
    if (!rc) rc = build_buffer(r, p, sel);
    kvb_run_free(r, sel);
    if (rc) return rc;
    /* 5. the buffer's initial device copies */
    const char *names[3] = {"cached_ids", "Kbuf", "Vbuf"};
    for (int i = 0; i < 3; i++) {
        kvb_tensor *t = kvb_run_find(r, names[i]);
        kvb_h2d(t->d_init, t->h, (size_t)t->n * kvb_dtype_size(t->dtype), r->stream);
    }
    kvb_sync(r->stream);
    return KVB_OK;
}

static int attention_skv(kvb_run *r, step_priv *p, int which, block_attention *a)
{
    skv_priv *q = p->ms;
    const shadowkv_buffers b = {
        .landmarks = step_dev(r, "landmarks"), .landmark_idx = step_dev(r, "landmark_idx"),
        .U = step_dev(r, "U"), .SV = step_dev(r, "SV"), .cos_sin = step_dev(r, "cos_sin"), .Vh = step_dev(r, "Vh"),
        .cached_ids = step_dev(r, "cached_ids"), .Kbuf = step_dev(r, "Kbuf"), .Vbuf = step_dev(r, "Vbuf"),
        .chunks = step_dev(r, "chunks"), .offsets = step_dev(r, "offsets"), .cnts = step_dev(r, "cnts"),
        .m = step_dev(r, "m"), .slot = step_dev(r, "slot"), .len = step_dev(r, "len"),
        .slot_host = kvb_run_find(r, "slot")->h, .len_host = kvb_run_find(r, "len")->h, .bad = step_dev(r, "bad"),
        .ws_score = step_dev(r, "ws_score"), .ws_v = step_dev(r, "ws_v"), .ws_k = step_dev(r, "ws_k"),
        .ws_attn = step_dev(r, "ws_attn"),
    };
    *a = (block_attention){shadowkv_block_add_stages, &q->path[which], 0, 1};
    return shadowkv_path_prepare(&q->path[which], &p->s.skv, &b);
}
#endif

static void bytes_skv(const kvb_run *r, const step_priv *p, double *dev, double *host, double *flops)
{
    (void)r;
    shadowkv_step_bytes(&p->s.skv, dev, host, flops);
}

static void state_skv(const step_case *s, double *dev, double *host) { shadowkv_state_bytes(&s->skv, dev, host); }

/* The activations (Kpre, the post-RoPE keys of the distinct prompts), the pool for the values, the local
 * values and the outliers; the prefill's state (U, SV, landmarks and their ids) in; the buffer and its
 * tags in and out; chunks, m, offsets, cnts, bad out; the chunk scores and Kbuf's tolerance magnitudes;
 * slot, len in; the prefill by the references without a device (LAPACKE's copy, factors and workspace,
 * the chunk means, this step's chunks and scores); the step's reference's scratch; dense K, V for all=1 */
static double host_bytes_skv(const step_case *s)
{
    const shadowkv_step_shape *sh = &s->skv;
    const shadowkv_layout *L = &sh->L;
    const gather_layout *g = &L->g;
    const double B = sh->B, Hkv = sh->Hkv, D = sh->D, S = sh->S, R = sh->r, N = Hkv * D, rows = B * Hkv;
    const double P = B < SKV_PROMPTS ? B : SKV_PROMPTS, k = S < N ? S : N, mx = S > N ? S : N, M = g->M;
    const double activations = P * S * N * 4 + P * Hkv * S * D * 2, pool = rows * L->n_chunks * L->c * D * 2;
    const double state = B * S * R * 2 + rows * R * D * 2 + rows * L->Lm * (D * 2 + 4);
    const double buffer = rows * M * 4 + 2 * rows * g->NB * D * 2;
    const double outs = rows * (M * 4 + L->Lm * 4 + M * 4 + 4) + 4;
    const double prefill = (S + N) * R * 4 + 8 * (S * N + k + S * k + k * N) + 8 * (7 * k * k + mx + 4 * k) + 32 * k +
                           L->n_chunks * (D * 8 + 17) + rows * (M + L->Lm) * 4 + (L->Lm + 2 * M) * 4;
    const double n = S + sh->gen + 1, ref = 12 * M + (double)gather_chunk_bytes(g) * M +
                                                kvb_ref_threads() * 8.0 * (D + g->NB + n + 3 * L->Lm + M);
    return activations + pool + rows * (L->n_local * D * 2 + L->outlier_chunks * 4) + KVB_HOLD_IN * state +
           KVB_HOLD_INOUT * buffer + KVB_HOLD_OUT * outs + rows * L->n_chunks * 4 + rows * g->NB * D * 8 + 8 * B +
           prefill + ref + (s->all ? 2 * rows * n * D * 2 + B * sh->Hq * D * 2 + 4 * B : 0);
}

const step_method step_method_shadowkv = {
    .name = "shadowkv",
    .about = "low-rank keys, landmarks, outliers and a chunk buffer on the device, values in pinned host memory; "
             "per chunk of the batch landmark_score, index_scan, gather_copy_d2d V | gather_copy_misses V; then "
             "gather_copy_d2d K + batch_gemm_rotary, kv_append; per chunk decode_attn",
    .device_choice = "chunks",
    .shape = shape_skv,
    .setup = setup_skv,
    .host_prefill = host_prefill_skv,
    .ref_attend = ref_attend_skv,
#if KVB_HAVE_CUDA
    .gpu_prefill_q = gpu_prefill_skv,
    .attention = attention_skv,
#endif
    .bytes = bytes_skv,
    .state_bytes = state_skv,
    .host_bytes = host_bytes_skv,
};
