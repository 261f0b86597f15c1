// host_link_contention.cu: what slows the SMs' zero-copy fetch from pinned host memory when other kernels
// run beside it (ShadowKV's decode step fetches its missed value chunks while the next chunk of the batch
// is selected: kernels/step/NOTES.md, Open). One fetch kernel gathers 2 KiB chunks of a 256 MiB mapped
// pinned buffer in a shuffled order into device memory (16-byte loads, 8 in flight a thread, as
// gather_copy's kernels do) on a stream of the device's greatest priority; beside it, on a default-priority
// stream, a kernel of R blocks of 256 threads runs until the fetch ends:
//   read  streams a 4 GiB device buffer (16-byte loads, 4 in flight a thread): DRAM reads, as landmark
//         scoring's;
//   copy  the same, each vector also written to a second buffer: DRAM reads and writes, as the hits' moves;
//   spin  dependent FMAs on registers only: SM slots and issue, no memory traffic.
// Each line: the fetch's time and rate, and the beside kernel's DRAM rate over its own time (median of 3).
// If the fetch slows with the DRAM traffic beside it and not with the spin, the host link's rate depends on
// the device's memory traffic, not on the SMs the fetch is given. Build and run on the GPU machine:
//   nvcc -O3 -arch=sm_90a -o host_link_contention profiles/host_link_contention.cu && ./host_link_contention
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "probe_check.h"

enum { CHUNK_VECS = 128 }; // 2 KiB chunks of 16-byte vectors: ShadowKV's 8 tokens x 128 channels in bf16
enum { BESIDE_NONE, BESIDE_READ, BESIDE_COPY, BESIDE_SPIN };
static const char *beside_name[] = {"none", "read", "copy", "spin"};

// A warp copies two chunks at a time: 8 vectors a lane, all loads issued before any store. The last block
// to finish raises *stop for the kernel beside it.
__global__ void __launch_bounds__(256) fetch_kernel(const uint4 *host, uint4 *dev, const int *order, int nchunks,
                                                    unsigned *done, volatile int *stop)
{
    const int lane = threadIdx.x & 31;
    const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, warps = (gridDim.x * blockDim.x) >> 5;
    for (int c = 2 * warp; c < nchunks; c += 2 * warps) {
        uint4 v[8];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int chunk = c + (i >> 2);
            if (chunk < nchunks) v[i] = host[(size_t)order[chunk] * CHUNK_VECS + (i & 3) * 32 + lane];
        }
#pragma unroll
        for (int i = 0; i < 8; i++) {
            const int chunk = c + (i >> 2);
            if (chunk < nchunks) dev[(size_t)chunk * CHUNK_VECS + (i & 3) * 32 + lane] = v[i];
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        if (atomicAdd(done, 1u) == gridDim.x - 1) *stop = 1;
    }
}

// Runs until *stop: reads (and for COPY writes) the buffer's vectors 4 a thread in flight, wrapping at its
// end (nvec a power of two); adds the bytes it moved to *moved.
template <int KIND>
__global__ void __launch_bounds__(256) beside_kernel(const uint4 *src, uint4 *dst, size_t nvec, volatile int *stop,
                                                     unsigned long long *moved, float *sink)
{
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned long long bytes = 0;
    uint32_t acc = 0;
    float f = threadIdx.x;
    for (int round = 0; !*stop && round < (1 << 22); round++) {
        if (KIND == BESIDE_SPIN) {
#pragma unroll 16
            for (int k = 0; k < 256; k++) f = fmaf(f, 0.999f, 1e-3f);
            continue;
        }
#pragma unroll 4
        for (int k = 0; k < 16; k++) {
            uint4 v[4];
#pragma unroll
            for (int j = 0; j < 4; j++) v[j] = src[(i + j * stride) & (nvec - 1)];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                acc ^= v[j].x ^ v[j].w;
                if (KIND == BESIDE_COPY) dst[(i + j * stride) & (nvec - 1)] = v[j];
            }
            i = (i + 4 * stride) & (nvec - 1);
            bytes += (KIND == BESIDE_COPY ? 2 : 1) * 4 * sizeof(uint4);
        }
    }
    if (acc == 0x12345678u || f == 0.5f) sink[0] = (float)acc + f; // keep the loads and FMAs
    atomicAdd(moved, bytes);
}

struct Result {
    float fetch_ms, beside_ms;
    unsigned long long moved;
};

static int cmp_float(const void *a, const void *b)
{
    const float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

int main(void)
{
    const int nchunks = 131072; // 256 MiB
    const size_t host_bytes = (size_t)nchunks * CHUNK_VECS * sizeof(uint4);
    const size_t beside_bytes = (size_t)4 << 30, beside_vec = beside_bytes / sizeof(uint4);
    cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    printf("device %s, %d SMs\n", prop.name, prop.multiProcessorCount);

    uint4 *host, *host_dev, *dev, *bsrc, *bdst;
    int *order_h = (int *)malloc(nchunks * sizeof(int)), *order;
    CHECK(cudaHostAlloc((void **)&host, host_bytes, cudaHostAllocMapped));
    CHECK(cudaHostGetDevicePointer((void **)&host_dev, host, 0));
    for (size_t i = 0; i < host_bytes / sizeof(uint32_t); i++) ((uint32_t *)host)[i] = (uint32_t)i;
    srand(1);
    for (int i = 0; i < nchunks; i++) order_h[i] = i;
    for (int i = nchunks - 1; i > 0; i--) {
        const int j = rand() % (i + 1), t = order_h[i];
        order_h[i] = order_h[j], order_h[j] = t;
    }
    CHECK(cudaMalloc(&order, nchunks * sizeof(int)));
    CHECK(cudaMemcpy(order, order_h, nchunks * sizeof(int), cudaMemcpyHostToDevice));
    CHECK(cudaMalloc(&dev, host_bytes));
    CHECK(cudaMalloc(&bsrc, beside_bytes));
    CHECK(cudaMalloc(&bdst, beside_bytes));
    CHECK(cudaMemset(bsrc, 1, beside_bytes));
    unsigned *done;
    int *stop;
    unsigned long long *moved;
    float *sink;
    CHECK(cudaMalloc(&done, sizeof(unsigned)));
    CHECK(cudaMalloc(&stop, sizeof(int)));
    CHECK(cudaMalloc(&moved, sizeof(unsigned long long)));
    CHECK(cudaMalloc(&sink, sizeof(float)));

    int lo, hi;
    CHECK(cudaDeviceGetStreamPriorityRange(&lo, &hi));
    cudaStream_t sf, sb;
    CHECK(cudaStreamCreateWithPriority(&sf, cudaStreamNonBlocking, hi));
    CHECK(cudaStreamCreateWithPriority(&sb, cudaStreamNonBlocking, lo));
    cudaEvent_t f0, f1, b0, b1;
    CHECK(cudaEventCreate(&f0));
    CHECK(cudaEventCreate(&f1));
    CHECK(cudaEventCreate(&b0));
    CHECK(cudaEventCreate(&b1));

    const int fetch_grids[] = {64, 132};
    const int beside_grids[] = {8, 16, 33, 66, 132, 264, 528};
    const int kinds[] = {BESIDE_READ, BESIDE_COPY, BESIDE_SPIN};
    for (int fg = 0; fg < 2; fg++) {
        const int F = fetch_grids[fg];
        for (int kk = -1; kk < 3; kk++) {
            const int kind = kk < 0 ? BESIDE_NONE : kinds[kk];
            for (int rg = 0; rg < (kind == BESIDE_NONE ? 1 : 7); rg++) {
                const int R = kind == BESIDE_NONE ? 0 : beside_grids[rg];
                float fms[3], bms[3], gbs[3];
                for (int rep = 0; rep < 3; rep++) {
                    CHECK(cudaMemset(done, 0, sizeof(unsigned)));
                    CHECK(cudaMemset(stop, 0, sizeof(int)));
                    CHECK(cudaMemset(moved, 0, sizeof(unsigned long long)));
                    CHECK(cudaDeviceSynchronize());
                    CHECK(cudaEventRecord(f0, sf));
                    fetch_kernel<<<F, 256, 0, sf>>>(host_dev, dev, order, nchunks, done, stop);
                    CHECK(cudaEventRecord(f1, sf));
                    CHECK(cudaEventRecord(b0, sb));
                    if (kind == BESIDE_READ)
                        beside_kernel<BESIDE_READ><<<R, 256, 0, sb>>>(bsrc, bdst, beside_vec, stop, moved, sink);
                    if (kind == BESIDE_COPY)
                        beside_kernel<BESIDE_COPY><<<R, 256, 0, sb>>>(bsrc, bdst, beside_vec, stop, moved, sink);
                    if (kind == BESIDE_SPIN)
                        beside_kernel<BESIDE_SPIN><<<R, 256, 0, sb>>>(bsrc, bdst, beside_vec, stop, moved, sink);
                    CHECK(cudaEventRecord(b1, sb));
                    CHECK(cudaGetLastError());
                    CHECK(cudaDeviceSynchronize());
                    unsigned long long m = 0;
                    CHECK(cudaMemcpy(&m, moved, sizeof(m), cudaMemcpyDeviceToHost));
                    CHECK(cudaEventElapsedTime(&fms[rep], f0, f1));
                    CHECK(cudaEventElapsedTime(&bms[rep], b0, b1));
                    gbs[rep] = kind == BESIDE_NONE || kind == BESIDE_SPIN ? 0.f : (float)(m / (bms[rep] * 1e6));
                }
                qsort(fms, 3, sizeof(float), cmp_float);
                qsort(bms, 3, sizeof(float), cmp_float);
                qsort(gbs, 3, sizeof(float), cmp_float);
                printf("fetch %3d blocks, beside %-4s %3d blocks: fetch %7.3f ms %5.1f GB/s (%.3f-%.3f ms); beside "
                       "%7.3f ms, DRAM %6.0f GB/s\n",
                       F, beside_name[kind], R, fms[1], host_bytes / (fms[1] * 1e6), fms[0], fms[2], bms[1], gbs[1]);
                fflush(stdout);
            }
        }
    }
    // The fetch's output against the host's chunks, once (the last run's).
    uint4 *check = (uint4 *)malloc(host_bytes);
    CHECK(cudaMemcpy(check, dev, host_bytes, cudaMemcpyDeviceToHost));
    size_t bad = 0;
    for (int c = 0; c < nchunks; c++)
        for (int v = 0; v < CHUNK_VECS; v++) {
            const uint4 a = check[(size_t)c * CHUNK_VECS + v], b = host[(size_t)order_h[c] * CHUNK_VECS + v];
            bad += a.x != b.x || a.y != b.y || a.z != b.z || a.w != b.w;
        }
    printf("fetch output: %zu of %zu vectors differ from the host's chunks\n", bad, host_bytes / sizeof(uint4));
    return bad != 0;
}
