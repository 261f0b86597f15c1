// host_copy_probe.cu: why the harness stages large host <-> device copies (harness/core/gpu.c, kvb_h2d and
// kvb_d2h). A 2 GiB pageable buffer (pages touched first) copied to the device and back by cudaMemcpyAsync,
// the driver's pageable path; the same through two pinned 64 MiB buffers that the OpenMP threads fill and
// empty while the other buffer's chunk crosses the bus; and cudaHostRegister of the whole buffer. Each
// copy twice. Build and run on the GPU machine:
//   nvcc -O2 -arch=sm_90a -Xcompiler -fopenmp -o host_copy_probe profiles/host_copy_probe.cu -lgomp && ./host_copy_probe
// H200 figures: results/h200/staged-copies/run.txt.
#include <cuda_runtime.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "probe_check.h"

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}

static void copy_threads(char *dst, const char *src, size_t n)
{
    const int parts = omp_get_max_threads();
#pragma omp parallel for
    for (int k = 0; k < parts; k++) {
        const size_t at = n / parts * k, len = k == parts - 1 ? n - at : n / parts;
        memcpy(dst + at, src + at, len);
    }
}

int main(void)
{
    const size_t n = (size_t)2 << 30, chunk = (size_t)64 << 20, chunks = n / chunk;
    char *host = (char *)malloc(n), *back = (char *)malloc(n), *dev, *pin[2];
    if (!host || !back) return 1;
#pragma omp parallel for
    for (size_t i = 0; i < n; i += 4096) host[i] = 1, back[i] = 2;
    CHECK(cudaMalloc(&dev, n));
    CHECK(cudaMallocHost(&pin[0], chunk));
    CHECK(cudaMallocHost(&pin[1], chunk));
    cudaStream_t s;
    cudaEvent_t done[2];
    CHECK(cudaStreamCreate(&s));
    CHECK(cudaEventCreate(&done[0]));
    CHECK(cudaEventCreate(&done[1]));
    for (int rep = 0; rep < 2; rep++) {
        double t0 = now_s();
        CHECK(cudaMemcpyAsync(dev, host, n, cudaMemcpyHostToDevice, s));
        CHECK(cudaStreamSynchronize(s));
        double t1 = now_s();
        CHECK(cudaMemcpyAsync(back, dev, n, cudaMemcpyDeviceToHost, s));
        CHECK(cudaStreamSynchronize(s));
        double t2 = now_s();
        printf("pageable: H2D %.2f GB/s, D2H %.2f GB/s\n", n / (t1 - t0) * 1e-9, n / (t2 - t1) * 1e-9);
    }
    for (int rep = 0; rep < 2; rep++) {
        double t0 = now_s();
        for (size_t c = 0; c < chunks; c++) {
            if (c >= 2) CHECK(cudaEventSynchronize(done[c & 1]));
            copy_threads(pin[c & 1], host + c * chunk, chunk);
            CHECK(cudaMemcpyAsync(dev + c * chunk, pin[c & 1], chunk, cudaMemcpyHostToDevice, s));
            CHECK(cudaEventRecord(done[c & 1], s));
        }
        CHECK(cudaStreamSynchronize(s));
        double t1 = now_s();
        CHECK(cudaMemcpyAsync(pin[0], dev, chunk, cudaMemcpyDeviceToHost, s));
        CHECK(cudaEventRecord(done[0], s));
        for (size_t c = 0; c < chunks; c++) {
            if (c + 1 < chunks) {
                CHECK(cudaMemcpyAsync(pin[(c + 1) & 1], dev + (c + 1) * chunk, chunk, cudaMemcpyDeviceToHost, s));
                CHECK(cudaEventRecord(done[(c + 1) & 1], s));
            }
            CHECK(cudaEventSynchronize(done[c & 1]));
            copy_threads(back + c * chunk, pin[c & 1], chunk);
        }
        double t2 = now_s();
        printf("staged, two pinned 64 MiB buffers, %d threads: H2D %.2f GB/s, D2H %.2f GB/s%s\n",
               omp_get_max_threads(), n / (t1 - t0) * 1e-9, n / (t2 - t1) * 1e-9,
               memcmp(host, back, n) ? " (the data differ!)" : "");
    }
    double t0 = now_s();
    CHECK(cudaHostRegister(host, n, 0));
    double t1 = now_s();
    CHECK(cudaMemcpyAsync(dev, host, n, cudaMemcpyHostToDevice, s));
    CHECK(cudaStreamSynchronize(s));
    double t2 = now_s();
    CHECK(cudaHostUnregister(host));
    printf("cudaHostRegister of the 2 GiB %.3f s, then H2D %.2f GB/s\n", t1 - t0, n / (t2 - t1) * 1e-9);
    return 0;
}
