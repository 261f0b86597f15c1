// read_ceiling_variants.cu: the read ceiling's kernel (harness/core/gpu_util.cu, read16_kernel) beside
// other ways to stream device memory, each timed at 16 MiB to 4 GiB (median and fastest of 20 after
// three warm-ups, twice), to tell whether the ceiling kernel is the fastest read this suite knows.
// Variants: grid-stride (the ceiling's pattern) or a contiguous chunk a block; __ldcs or
// ld.global.nc.L2::256B; 8 or 16 loads in flight; 4 x 512 or 8 x 256 threads an SM.
// Build and run on the GPU machine:
//   nvcc -O3 -arch=sm_90a -o read_ceiling_variants profiles/read_ceiling_variants.cu && ./read_ceiling_variants
// H200 figures: results/h200/ab/read-ceiling-variants/readbench.log.
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define CK(x)                                                                                  \
    do {                                                                                       \
        cudaError_t e = (x);                                                                   \
        if (e) {                                                                               \
            printf("CUDA error %s at line %d\n", cudaGetErrorString(e), __LINE__);             \
            return 1;                                                                          \
        }                                                                                      \
    } while (0)

__device__ __forceinline__ uint4 load_l2_256(const uint4 *p)
{
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

// XOR of the 16-byte words i, i + stride, ... below end, U loads in flight
template <int U, bool L2_256>
__device__ uint32_t stream_xor(const uint4 *__restrict__ src, size_t i, size_t end, size_t stride)
{
    uint32_t acc = 0;
    for (; i + (U - 1) * stride < end; i += U * stride) {
        uint4 v[U];
#pragma unroll
        for (int u = 0; u < U; u++) v[u] = L2_256 ? load_l2_256(src + i + u * stride) : __ldcs(src + i + u * stride);
#pragma unroll
        for (int u = 0; u < U; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (; i < end; i += stride) {
        uint4 v = __ldcs(src + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    return acc;
}

// the ceiling's pattern: the whole grid strides over the buffer
template <int U, bool L2_256>
__global__ void __launch_bounds__(512) grid_stride(const uint4 *__restrict__ src, size_t n16, uint32_t *sink)
{
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    uint32_t acc = stream_xor<U, L2_256>(src, (size_t)blockIdx.x * blockDim.x + threadIdx.x, n16, stride);
    if (acc == 0x12345678u) sink[blockIdx.x] = acc; // a store the compiler cannot drop
}

// each block streams one contiguous chunk
template <int U, bool L2_256>
__global__ void __launch_bounds__(512) block_chunk(const uint4 *__restrict__ src, size_t n16, uint32_t *sink)
{
    const size_t per = (n16 + gridDim.x - 1) / gridDim.x, begin = blockIdx.x * per;
    const size_t end = begin + per < n16 ? begin + per : n16;
    uint32_t acc = stream_xor<U, L2_256>(src, begin + threadIdx.x, end, blockDim.x);
    if (acc == 0x12345678u) sink[blockIdx.x] = acc;
}

typedef void (*read_fn)(const uint4 *, size_t, uint32_t *);

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

int main(void)
{
    int sms;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const size_t max_bytes = (size_t)4400 << 20;
    char *buf;
    uint32_t *sink;
    CK(cudaMalloc(&buf, max_bytes));
    CK(cudaMemset(buf, 0x3C, max_bytes)); // not zeros
    CK(cudaMalloc(&sink, 4096 * 4 * 8));
    struct variant {
        const char *name;
        read_fn fn;
        int blocks_per_sm, threads;
    } variants[] = {
        {"grid_ldcs_u8_4x512 (current)", grid_stride<8, false>, 4, 512},
        {"grid_ldcs_u16_4x512", grid_stride<16, false>, 4, 512},
        {"grid_l2_256B_u8_4x512", grid_stride<8, true>, 4, 512},
        {"grid_ldcs_u8_8x256", grid_stride<8, false>, 8, 256},
        {"chunk_ldcs_u8_4x512", block_chunk<8, false>, 4, 512},
        {"chunk_l2_256B_u8_4x512", block_chunk<8, true>, 4, 512},
        {"chunk_ldcs_u8_8x256", block_chunk<8, false>, 8, 256},
        {"chunk_ldcs_u4_16x128", block_chunk<4, false>, 16, 128},
    };
    const size_t sizes[] = {(size_t)2 << 30, (size_t)4 << 30, (size_t)256 << 20, (size_t)64 << 20, (size_t)16 << 20};
    const int n_variants = sizeof variants / sizeof variants[0], n_sizes = sizeof sizes / sizeof sizes[0];
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int pass = 0; pass < 2; pass++)
        for (int si = 0; si < n_sizes; si++) {
            const size_t bytes = sizes[si], n16 = bytes / 16;
            for (int vi = 0; vi < n_variants; vi++) {
                const struct variant v = variants[vi];
                size_t blocks = (n16 + v.threads * 8 - 1) / (v.threads * 8);
                if (blocks > (size_t)sms * v.blocks_per_sm) blocks = (size_t)sms * v.blocks_per_sm;
                for (int w = 0; w < 3; w++) v.fn<<<blocks, v.threads>>>((const uint4 *)buf, n16, sink);
                float ms[20];
                for (int r = 0; r < 20; r++) {
                    CK(cudaEventRecord(e0));
                    v.fn<<<blocks, v.threads>>>((const uint4 *)buf, n16, sink);
                    CK(cudaEventRecord(e1));
                    CK(cudaEventSynchronize(e1));
                    CK(cudaEventElapsedTime(&ms[r], e0, e1));
                }
                CK(cudaGetLastError());
                qsort(ms, 20, sizeof(float), cmp_float);
                const double median = ms[10] * 1e-3, best = ms[0] * 1e-3;
                printf("rep%d %11zu %-30s %9.2f us %7.1f GB/s (min %7.1f)\n", pass, bytes, v.name, median * 1e6,
                       bytes / median * 1e-9, bytes / best * 1e-9);
            }
        }
    return 0;
}
