// int2_rounding_check.cu: the INT2 quantizers' branch-free roundings (kernels/int2/int2_device.cuh) against
// CUDA's correctly rounded intrinsics, bit for bit, on the GPU, over every input the quantizers give them:
//   third_rn(x) against __fdiv_rn(x, 3.0f) for every positive normal float up to 2^17 (a group's range
//   mx - mn lies in [0, 2^16]); below the normal range, the fp16 each rounds to;
//   rcp_rn_normal(s) against __frcp_rn(s) for every positive finite fp16 scale.
// Exit 0 when every one matches. Build from the repository root and run on the GPU machine:
//   nvcc -O3 -arch=sm_90a -I. -o int2_rounding_check profiles/int2_rounding_check.cu && ./int2_rounding_check
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include "kernels/int2/int2_device.cuh"

__global__ void third_check(unsigned first, unsigned count, unsigned long long *bad, unsigned *example)
{
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x) {
        const float x = __uint_as_float(first + i);
        const float a = third_rn(x), b = __fdiv_rn(x, 3.0f);
        const bool same = x >= 0x1p-126f ? __float_as_uint(a) == __float_as_uint(b)
                                          : __half_as_ushort(__float2half_rn(a)) == __half_as_ushort(__float2half_rn(b));
        if (!same && atomicAdd(bad, 1ull) == 0) *example = first + i;
    }
}

__global__ void rcp_check(unsigned long long *bad, unsigned *example)
{
    for (unsigned h = blockIdx.x * blockDim.x + threadIdx.x + 1; h < 0x7C00u; h += gridDim.x * blockDim.x) {
        const float s = __half2float(__ushort_as_half((unsigned short)h));
        if (__float_as_uint(rcp_rn_normal(s)) != __float_as_uint(__frcp_rn(s)) && atomicAdd(bad, 1ull) == 0) *example = h;
    }
}

int main()
{
    unsigned long long *bad;
    unsigned *example;
    cudaMallocManaged(&bad, 2 * sizeof *bad);
    cudaMallocManaged(&example, 2 * sizeof *example);
    bad[0] = bad[1] = 0;
    const unsigned last = 0x48000000u; // 2^17
    third_check<<<1024, 256>>>(0u, last + 1, bad, example);
    rcp_check<<<64, 256>>>(bad + 1, example + 1);
    if (cudaDeviceSynchronize() != cudaSuccess) {
        printf("int2_rounding_check: %s\n", cudaGetErrorString(cudaGetLastError()));
        return 2;
    }
    printf("third_rn: %u floats in [0, 2^17], %llu differ from __fdiv_rn(x, 3)%s", last + 1, bad[0], bad[0] ? "" : "\n");
    if (bad[0]) printf(" (first: bits 0x%08x)\n", example[0]);
    printf("rcp_rn_normal: %u fp16 scales, %llu differ from __frcp_rn%s", 0x7BFFu, bad[1], bad[1] ? "" : "\n");
    if (bad[1]) printf(" (first: fp16 0x%04x)\n", example[1]);
    return bad[0] || bad[1];
}
