/* step_minikv.h: MiniKV's decode-time attention path as stages of a composition (compose.h; the INT2
 * family: kernels/int2/NOTES.md): the INT2 cache of the kept tokens plus its bf16 residual.
 *
 *   int2_append        the new token's k, v into residual slot R; when the residual then holds 128
 *                      tokens they are quantized into cache tokens [T, T + 128) (the flush); with a
 *                      native cache, int2_append_native, whose flush also quantizes them into it
 *   int2_decode_attn   attention over the T' quantized and R' residual tokens after the append:
 *                      int2_decode_attn (v3) over the native cache when the path has one, else
 *                      int2_decode_attn_v2 over the interchange cache
 *
 * Planned once on the host: the layout after the append (T', R') is fixed at plan time, every check of
 * both stages runs there. Reference: ref_int2_append, ref_int2_decode_attn (reference/int2.h).
 */
#ifndef KVB_KERNELS_STEP_MINIKV_H
#define KVB_KERNELS_STEP_MINIKV_H

#include "kernels/step/compose.h"
#include "kernels/int2/int2.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct minikv_path {
    int2_layout before, after; /* the cache before the step's append, and the one attention reads */
    int2_cache c;              /* device arrays */
    int2_native n;             /* the same cache in v3's native layout (device), or NULLs: v2 */
    void *ws;                  /* minikv_workspace_bytes, zeroed once */
    const kvb_bf16 *q, *knew, *vnew;
    kvb_bf16 *o;
} minikv_path;

/* Workspace of the attention stage over the cache after the append. */
size_t minikv_workspace_bytes(const int2_layout *before);
/* Check both stages (int2_append_check, int2_attn_check, Tcap a multiple of INT2_TCAP_GRANULE). n: the
 * native copy of c (int2_quantize_native at the prefill), or NULL for v2 over c alone; with it, a flush
 * needs T a multiple of max(64, gs). */
int minikv_path_prepare(minikv_path *p, const int2_layout *before, const int2_cache *c, const int2_native *n, void *ws);
/* As a block_attention's add_stages (kernels/step/step_block.h; ctx: a prepared path). */
int minikv_block_add_stages(void *ctx, kvb_step *step, const kvb_bf16 *q, const kvb_bf16 *knew, const kvb_bf16 *vnew,
                            kvb_bf16 *att);

#ifdef __cplusplus
}
#endif
#endif
