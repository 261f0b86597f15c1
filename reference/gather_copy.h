/* gather_copy.h: ShadowKV's cache-aware value fetch and OmniKV's packed load
 * (kernels/gather_copy/NOTES.md).
 *
 * The layouts and their validation live here, in the C reference, because they are the contract; the
 * CUDA API in kernels/gather_copy/gather_copy.h takes the same structs and runs the same checks before
 * it launches anything.
 */
#ifndef REF_GATHER_COPY_H
#define REF_GATHER_COPY_H

#include "reference/kvb.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GATHER_MAX_M 4096
#define GATHER_MAX_CHUNK_BYTES (192 * 1024) /* one chunk must fit a block's shared memory */

/* Value chunks in pinned host memory and the GPU buffer they are fetched into.
 *   Vh   : per (b, h) a run of chunks, chunk = c*D bf16 token-major; run (b, h) starts at chunk
 *          (b*Hkv + h) * host_stride; valid chunk ids are [0, host_chunks).
 *   Vbuf : [B, Hkv, NB, D] bf16 (Kbuf the same); sparse slot i = tokens sparse_start + i*c ... + c-1. */
typedef struct gather_layout {
    int B, Hkv;          /* batch, KV heads */
    int M;               /* chunk slots per (b, h), 1..4096 */
    int c, D;            /* tokens per chunk, head dimension */
    int NB;              /* tokens per (b, h) in the GPU buffer */
    int sparse_start;    /* first token of the sparse region */
    int64_t host_chunks; /* chunks stored per (b, h) on the host */
    int64_t host_stride; /* chunks between consecutive (b, h) runs on the host, >= host_chunks */
} gather_layout;

static inline int64_t gather_chunk_elems(const gather_layout *g) { return (int64_t)g->c * g->D; }
static inline int64_t gather_chunk_bytes(const gather_layout *g) { return gather_chunk_elems(g) * 2; }

/* Check every field against its allowed range; on failure the message names the field, its value
 * and the range (kvb_last_error()). `who` prefixes the message (the function or kernel name). */
int gather_layout_check(const gather_layout *g, const char *who);

/* OmniKV packed load: per layer l, host rows KVh[l] [B, T, 2*Hkv*D] (K heads | V heads), device
 * rows KVg[l] [B, k, 2*Hkv*D]; idx [B, k] ascending token positions in [0, T). */
typedef struct packed_layout {
    int B;      /* batch */
    int layers; /* layers in the segment, 1..64 */
    int T;      /* prompt tokens per sequence on the host */
    int k;      /* selected tokens */
    int Hkv, D;
} packed_layout;

#define PACKED_MAX_LAYERS 64

static inline int64_t packed_row_elems(const packed_layout *p) { return 2LL * p->Hkv * p->D; }
int packed_layout_check(const packed_layout *p, const char *who);

/* index_scan: per (b, h), old = cached_ids[b,h,:] (unique, -1 = empty), new = new_ids[b,h,:]
 * (unique, >= 0). Hits (k in new and old) sorted by old slot, then misses sorted ascending:
 *   cnts[b,h] = #hits; offsets[b,h,i] = old slot of hit i (i < cnt), chunk id (i >= cnt);
 *   cached_ids[b,h,i] = the chunk id now held by slot i.
 * Rejects duplicate ids and negative new ids. */
int ref_index_scan(int32_t *cached_ids, const int32_t *new_ids, int32_t *offsets, int32_t *cnts,
                   int B, int Hkv, int M);

/* Vbuf[slot i] = i < cnt ? Vbuf_before[slot offsets[i]] : Vh[chunk offsets[i]], in place. */
int ref_gather_copy(const kvb_bf16 *Vh, kvb_bf16 *Vbuf, const int32_t *offsets, const int32_t *cnts,
                    const gather_layout *g);

/* Kbuf[slot i] = Kbuf_before[slot offsets[i]] for i < cnt; other slots untouched. */
int ref_gather_copy_d2d(kvb_bf16 *Kbuf, const int32_t *offsets, const int32_t *cnts,
                        const gather_layout *g);

/* No cache: Vbuf[slot i] = Vh[chunk ids[b,h,i]] for every slot. */
int ref_gather_copy_all(const kvb_bf16 *Vh, kvb_bf16 *Vbuf, const int32_t *ids, const gather_layout *g);

/* KVg[l][b, i, :] = KVh[l][b, idx[b, i], :] for every layer l of the segment. */
int ref_packed_load(const kvb_bf16 *const *KVh, kvb_bf16 *const *KVg, const int32_t *idx,
                    const packed_layout *p);

#ifdef __cplusplus
}
#endif
#endif
