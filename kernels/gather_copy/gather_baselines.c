/* gather_baselines.c: see gather_baselines.h. Plain C over the CUDA runtime: copies only. */
#include "kernels/gather_copy/gather_baselines.h"

#include <string.h>

#include "kernels/common/kvb_cuda.h"

static kvb_bf16 *slot_of(kvb_bf16 *buf, const gather_layout *g, int64_t row, int64_t slot)
{
    return buf + (row * g->NB + g->sparse_start + slot * g->c) * g->D;
}

static const kvb_bf16 *host_chunk(const kvb_bf16 *Vh, const gather_layout *g, int64_t row, int64_t id)
{
    return Vh + (row * g->host_stride + id) * gather_chunk_elems(g);
}

int gather_memcpy_chunks(kvb_bf16 *buf, const kvb_bf16 *Vh, const int32_t *offsets, const int32_t *cnts,
                         const gather_layout *g, int with_misses, cudaStream_t stream)
{
    size_t chunk = (size_t)gather_chunk_bytes(g);
    for (int64_t row = 0; row < (int64_t)g->B * g->Hkv; row++) {
        const int32_t *o = offsets + row * g->M;
        for (int i = 0; i < cnts[row]; i++)
            if (o[i] != i)
                CUDA_TRY(cudaMemcpyAsync(slot_of(buf, g, row, i), slot_of(buf, g, row, o[i]), chunk,
                                         cudaMemcpyDeviceToDevice, stream));
        if (with_misses)
            for (int i = cnts[row]; i < g->M; i++)
                CUDA_TRY(cudaMemcpyAsync(slot_of(buf, g, row, i), host_chunk(Vh, g, row, o[i]), chunk,
                                         cudaMemcpyHostToDevice, stream));
    }
    return KVB_OK;
}

size_t gather_cpu_staging_bytes(const gather_layout *g)
{
    return (size_t)gather_chunk_bytes(g) * (size_t)g->B * g->Hkv * g->M;
}

int gather_cpu_misses(kvb_bf16 *Vbuf, const kvb_bf16 *Vh, const int32_t *offsets, const int32_t *cnts,
                      const gather_layout *g, void *staging, cudaStream_t stream)
{
    size_t chunk = (size_t)gather_chunk_bytes(g);
    int64_t rows = (int64_t)g->B * g->Hkv;
    char *st = staging;
    for (int64_t row = 0; row < rows; row++)
        for (int i = cnts[row]; i < g->M; i++)
            memcpy(st + (row * g->M + i) * chunk, host_chunk(Vh, g, row, offsets[row * g->M + i]), chunk);
    for (int64_t row = 0; row < rows; row++)
        if (cnts[row] < g->M)
            CUDA_TRY(cudaMemcpyAsync(slot_of(Vbuf, g, row, cnts[row]), st + (row * g->M + cnts[row]) * chunk,
                                     chunk * (size_t)(g->M - cnts[row]), cudaMemcpyHostToDevice, stream));
    return KVB_OK;
}

int gather_all_memcpy_chunks(kvb_bf16 *Vbuf, const kvb_bf16 *Vh, const int32_t *ids, const gather_layout *g,
                             cudaStream_t stream)
{
    size_t chunk = (size_t)gather_chunk_bytes(g);
    for (int64_t row = 0; row < (int64_t)g->B * g->Hkv; row++)
        for (int i = 0; i < g->M; i++)
            CUDA_TRY(cudaMemcpyAsync(slot_of(Vbuf, g, row, i), host_chunk(Vh, g, row, ids[row * g->M + i]), chunk,
                                     cudaMemcpyHostToDevice, stream));
    return KVB_OK;
}

int gather_all_ce_batch(kvb_bf16 *Vbuf, const kvb_bf16 *Vh, const int32_t *ids, const gather_layout *g,
                        void **batch_dst, void **batch_src, size_t *batch_size, cudaStream_t stream)
{
    size_t chunk = (size_t)gather_chunk_bytes(g), n = (size_t)g->B * g->Hkv * g->M;
    for (int64_t row = 0; row < (int64_t)g->B * g->Hkv; row++)
        for (int i = 0; i < g->M; i++) {
            size_t k = (size_t)row * g->M + i;
            batch_dst[k] = slot_of(Vbuf, g, row, i);
            batch_src[k] = (void *)host_chunk(Vh, g, row, ids[k]);
            batch_size[k] = chunk;
        }
    struct cudaMemcpyAttributes attr;
    memset(&attr, 0, sizeof attr);
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
    size_t attr_idx = 0;
    CUDA_TRY(cudaMemcpyBatchAsync(batch_dst, (const void *const *)batch_src, batch_size, n, &attr, &attr_idx, 1,
                                  stream));
    return KVB_OK;
}

int gather_all_cpu(kvb_bf16 *Vbuf, const kvb_bf16 *Vh, const int32_t *ids, const gather_layout *g, void *staging,
                   cudaStream_t stream)
{
    size_t chunk = (size_t)gather_chunk_bytes(g);
    int64_t rows = (int64_t)g->B * g->Hkv;
    char *st = staging;
    for (int64_t row = 0; row < rows; row++)
        for (int i = 0; i < g->M; i++)
            memcpy(st + (row * g->M + i) * chunk, host_chunk(Vh, g, row, ids[row * g->M + i]), chunk);
    CUDA_TRY(cudaMemcpy2DAsync(slot_of(Vbuf, g, 0, 0), (size_t)g->NB * g->D * 2, st, chunk * g->M, chunk * g->M,
                               (size_t)rows, cudaMemcpyHostToDevice, stream));
    return KVB_OK;
}

int packed_load_memcpy_rows(const kvb_bf16 *const *KVh, kvb_bf16 *const *KVg, const int32_t *idx,
                            const packed_layout *p, cudaStream_t stream)
{
    int64_t row = packed_row_elems(p);
    for (int l = 0; l < p->layers; l++)
        for (int64_t b = 0; b < p->B; b++)
            for (int i = 0; i < p->k; i++)
                CUDA_TRY(cudaMemcpyAsync(KVg[l] + (b * p->k + i) * row, KVh[l] + (b * p->T + idx[b * p->k + i]) * row,
                                         (size_t)row * 2, cudaMemcpyHostToDevice, stream));
    return KVB_OK;
}

size_t packed_cpu_staging_bytes(const packed_layout *p)
{
    return (size_t)packed_row_elems(p) * 2 * (size_t)p->layers * p->B * p->k;
}

int packed_load_cpu(const kvb_bf16 *const *KVh, kvb_bf16 *const *KVg, const int32_t *idx, const packed_layout *p,
                    void *staging, cudaStream_t stream)
{
    int64_t row = packed_row_elems(p);
    kvb_bf16 *st = staging;
    for (int l = 0; l < p->layers; l++)
        for (int64_t b = 0; b < p->B; b++)
            for (int i = 0; i < p->k; i++)
                memcpy(st + (((int64_t)l * p->B + b) * p->k + i) * row, KVh[l] + (b * p->T + idx[b * p->k + i]) * row,
                       (size_t)row * 2);
    CUDA_TRY(cudaMemcpyAsync(KVg[0], st, packed_cpu_staging_bytes(p), cudaMemcpyHostToDevice, stream));
    return KVB_OK;
}
