/* gather_copy.c: plain C references of the gather_copy family, written to be read against its contract
 * (kernels/gather_copy/NOTES.md, "What it computes"). */
#include "reference/gather_copy.h"

#include <stdlib.h>

int gather_layout_check(const gather_layout *g, const char *who)
{
    KVB_CHECK_RANGE(who, "B", g->B, 1, 1024);
    KVB_CHECK_RANGE(who, "Hkv", g->Hkv, 1, 256);
    KVB_CHECK_RANGE(who, "M", g->M, 1, GATHER_MAX_M);
    KVB_CHECK_RANGE(who, "c", g->c, 1, 4096);
    KVB_CHECK_RANGE(who, "D", g->D, 1, 1024);
    int64_t bytes = gather_chunk_bytes(g);
    if (bytes % 16 != 0 || bytes > GATHER_MAX_CHUNK_BYTES)
        return kvb_fail(KVB_EINVAL,
                        "%s: chunk bytes c*D*2 = %d*%d*2 = %lld must be a multiple of 16 in [16, %d]",
                        who, g->c, g->D, (long long)bytes, GATHER_MAX_CHUNK_BYTES);
    KVB_CHECK_RANGE(who, "sparse_start", g->sparse_start, 0, INT32_MAX);
    int64_t need = (int64_t)g->sparse_start + (int64_t)g->M * g->c;
    if (need > INT32_MAX || g->NB < need)
        return kvb_fail(KVB_EINVAL, "%s: NB=%d out of range [sparse_start + M*c = %lld, %d]", who,
                        g->NB, (long long)need, INT32_MAX);
    if (((int64_t)g->sparse_start * g->D * 2) % 16 || ((int64_t)g->NB * g->D * 2) % 16)
        return kvb_fail(KVB_EINVAL,
                        "%s: sparse_start*D*2 = %lld and NB*D*2 = %lld must be multiples of 16 (slots start "
                        "16-byte aligned)", who, (long long)g->sparse_start * g->D * 2, (long long)g->NB * g->D * 2);
    KVB_CHECK_RANGE(who, "host_chunks", g->host_chunks, g->M, INT32_MAX);
    if (g->host_stride < g->host_chunks)
        return kvb_fail(KVB_EINVAL, "%s: host_stride=%lld out of range [host_chunks = %lld, inf)",
                        who, (long long)g->host_stride, (long long)g->host_chunks);
    return KVB_OK;
}

int packed_layout_check(const packed_layout *p, const char *who)
{
    KVB_CHECK_RANGE(who, "B", p->B, 1, 1024);
    KVB_CHECK_RANGE(who, "layers", p->layers, 1, PACKED_MAX_LAYERS);
    KVB_CHECK_RANGE(who, "T", p->T, 1, 1 << 24);
    KVB_CHECK_RANGE(who, "k", p->k, 1, p->T);
    KVB_CHECK_RANGE(who, "Hkv", p->Hkv, 1, 256);
    KVB_CHECK_RANGE(who, "D", p->D, 1, 1024);
    if ((packed_row_elems(p) * 2) % 16 != 0)
        return kvb_fail(KVB_EINVAL, "%s: row bytes 2*Hkv*D*2 = %lld must be a multiple of 16", who,
                        (long long)packed_row_elems(p) * 2);
    return KVB_OK;
}

static int contains(const int32_t *ids, int n, int32_t k)
{
    for (int i = 0; i < n; i++)
        if (ids[i] == k) return 1;
    return 0;
}

static int cmp_int32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* Unique ids in a row (ignoring -1 when allow_empty); returns the index of a repeat, or -1. */
static int first_repeat(const int32_t *ids, int n, int allow_empty)
{
    for (int i = 0; i < n; i++) {
        if (allow_empty && ids[i] == -1) continue;
        for (int j = 0; j < i; j++)
            if (ids[j] == ids[i]) return i;
    }
    return -1;
}

int ref_index_scan(int32_t *cached_ids, const int32_t *new_ids, int32_t *offsets, int32_t *cnts,
                   int B, int Hkv, int M)
{
    KVB_CHECK_RANGE("ref_index_scan", "B", B, 1, 1024);
    KVB_CHECK_RANGE("ref_index_scan", "Hkv", Hkv, 1, 256);
    KVB_CHECK_RANGE("ref_index_scan", "M", M, 1, GATHER_MAX_M);
    int32_t *hit_slot = kvb_xalloc((size_t)M, sizeof(int32_t), "ref_index_scan hits");
    int32_t *hit_id = hit_slot ? kvb_xalloc((size_t)M, sizeof(int32_t), "ref_index_scan hits") : NULL;
    int32_t *miss = hit_id ? kvb_xalloc((size_t)M, sizeof(int32_t), "ref_index_scan misses") : NULL;
    if (!miss) {
        kvb_xfree(hit_slot), kvb_xfree(hit_id);
        return KVB_ENOMEM;
    }
    int rc = KVB_OK;
    for (int64_t bh = 0; bh < (int64_t)B * Hkv && rc == KVB_OK; bh++) {
        int32_t *old = cached_ids + bh * M;
        const int32_t *now = new_ids + bh * M;
        int r;
        for (int i = 0; i < M; i++)
            if (now[i] < 0) {
                rc = kvb_fail(KVB_EINVAL, "ref_index_scan: new_ids[%lld][%d]=%d is negative",
                              (long long)bh, i, now[i]);
                break;
            }
        if (rc) break;
        if ((r = first_repeat(now, M, 0)) >= 0 || (r = first_repeat(old, M, 1)) >= 0) {
            rc = kvb_fail(KVB_EINVAL, "ref_index_scan: ids of (b,h) row %lld are not unique (slot %d)",
                          (long long)bh, r);
            break;
        }
        /* hits, in ascending old-slot order */
        int cnt = 0;
        for (int j = 0; j < M; j++)
            if (old[j] >= 0 && contains(now, M, old[j])) {
                hit_slot[cnt] = j;
                hit_id[cnt] = old[j];
                cnt++;
            }
        /* misses, ascending by chunk id */
        int n_miss = 0;
        for (int i = 0; i < M; i++)
            if (!contains(old, M, now[i])) miss[n_miss++] = now[i];
        qsort(miss, (size_t)n_miss, sizeof(int32_t), cmp_int32);

        cnts[bh] = cnt;
        for (int i = 0; i < cnt; i++) {
            offsets[bh * M + i] = hit_slot[i];
            old[i] = hit_id[i]; /* safe in place: hit_id holds copies */
        }
        for (int i = 0; i < n_miss; i++) {
            offsets[bh * M + cnt + i] = miss[i];
            old[cnt + i] = miss[i];
        }
    }
    kvb_xfree(hit_slot), kvb_xfree(hit_id), kvb_xfree(miss);
    return rc;
}

static kvb_bf16 *slot_ptr(kvb_bf16 *buf, const gather_layout *g, int64_t bh, int64_t slot)
{
    return buf + (bh * g->NB + g->sparse_start + slot * g->c) * g->D;
}

static const kvb_bf16 *host_chunk_ptr(const kvb_bf16 *Vh, const gather_layout *g, int64_t bh, int64_t id)
{
    return Vh + (bh * g->host_stride + id) * gather_chunk_elems(g);
}

/* Shared by gather_copy (with_misses = 1) and gather_copy_d2d (0): a copy of the sparse region
 * taken first makes "Vbuf_before" literal. */
static int compact(const kvb_bf16 *Vh, kvb_bf16 *buf, const int32_t *offsets, const int32_t *cnts,
                   const gather_layout *g, const char *who, int with_misses)
{
    if (gather_layout_check(g, who)) return KVB_EINVAL;
    size_t chunk = (size_t)gather_chunk_bytes(g);
    kvb_bf16 *before = kvb_xalloc(chunk, (size_t)g->M, who);
    if (!before) return KVB_ENOMEM;
    for (int64_t bh = 0; bh < (int64_t)g->B * g->Hkv; bh++) {
        const int32_t *off = offsets + bh * g->M;
        int cnt = cnts[bh];
        if (cnt < 0 || cnt > g->M) {
            kvb_xfree(before);
            return kvb_fail(KVB_EINVAL, "%s: cnts[%lld]=%d out of range [0, M=%d]", who, (long long)bh,
                            cnt, g->M);
        }
        memcpy(before, slot_ptr(buf, g, bh, 0), chunk * g->M);
        for (int i = 0; i < g->M; i++) {
            int64_t lim = i < cnt ? g->M : g->host_chunks;
            if (i >= cnt && !with_misses) break;
            if (off[i] < 0 || off[i] >= lim) {
                kvb_xfree(before);
                return kvb_fail(KVB_EINVAL, "%s: offsets[%lld][%d]=%d out of range [0, %lld) (%s)", who,
                                (long long)bh, i, off[i], (long long)lim,
                                i < cnt ? "hit: an old slot" : "miss: a host chunk id");
            }
            const kvb_bf16 *src = i < cnt ? before + (size_t)off[i] * gather_chunk_elems(g)
                                          : host_chunk_ptr(Vh, g, bh, off[i]);
            memcpy(slot_ptr(buf, g, bh, i), src, chunk);
        }
    }
    kvb_xfree(before);
    return KVB_OK;
}

int ref_gather_copy(const kvb_bf16 *Vh, kvb_bf16 *Vbuf, const int32_t *offsets, const int32_t *cnts,
                    const gather_layout *g)
{
    return compact(Vh, Vbuf, offsets, cnts, g, "ref_gather_copy", 1);
}

int ref_gather_copy_d2d(kvb_bf16 *Kbuf, const int32_t *offsets, const int32_t *cnts,
                        const gather_layout *g)
{
    return compact(NULL, Kbuf, offsets, cnts, g, "ref_gather_copy_d2d", 0);
}

int ref_gather_copy_all(const kvb_bf16 *Vh, kvb_bf16 *Vbuf, const int32_t *ids, const gather_layout *g)
{
    if (gather_layout_check(g, "ref_gather_copy_all")) return KVB_EINVAL;
    for (int64_t bh = 0; bh < (int64_t)g->B * g->Hkv; bh++)
        for (int i = 0; i < g->M; i++) {
            int32_t id = ids[bh * g->M + i];
            if (id < 0 || id >= g->host_chunks)
                return kvb_fail(KVB_EINVAL,
                                "ref_gather_copy_all: ids[%lld][%d]=%d out of range [0, host_chunks=%lld)",
                                (long long)bh, i, id, (long long)g->host_chunks);
            memcpy(slot_ptr(Vbuf, g, bh, i), host_chunk_ptr(Vh, g, bh, id), (size_t)gather_chunk_bytes(g));
        }
    return KVB_OK;
}

int ref_packed_load(const kvb_bf16 *const *KVh, kvb_bf16 *const *KVg, const int32_t *idx,
                    const packed_layout *p)
{
    if (packed_layout_check(p, "ref_packed_load")) return KVB_EINVAL;
    int64_t row = packed_row_elems(p);
    for (int b = 0; b < p->B; b++)
        for (int i = 0; i < p->k; i++) {
            int32_t t = idx[(int64_t)b * p->k + i];
            if (t < 0 || t >= p->T)
                return kvb_fail(KVB_EINVAL, "ref_packed_load: idx[%d][%d]=%d out of range [0, T=%d)", b,
                                i, t, p->T);
            for (int l = 0; l < p->layers; l++)
                memcpy(KVg[l] + ((int64_t)b * p->k + i) * row, KVh[l] + ((int64_t)b * p->T + t) * row,
                       (size_t)row * 2);
        }
    return KVB_OK;
}
