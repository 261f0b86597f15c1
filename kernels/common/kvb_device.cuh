// kvb_device.cuh: the one copy of the small device helpers the kernels share (CUDA C++ only): PTX
// wrappers (cp.async, ldmatrix, mma.sync, movmatrix, ex2), 16-bit packing, warp reductions, and the
// launch of kernels chained on a stream.
// Kernel-specific building blocks live with their kernels (attn_device.h: the flash-decoding state
// and steps shared by decode.cu and int2.cu).
//
// Fragment layouts of mma.sync m16n8k16 (row.col; lane = 4 g + t):
//   A 16x16: a0 = (row g, k 2t..2t+1), a1 = (row g+8, k 2t..), a2 = (row g, k 2t+8..), a3 = (row g+8, k 2t+8..)
//   B 16x8:  b0 = (k 2t..2t+1, col g), b1 = (k 2t+8..2t+9, col g)
//   C 16x8:  c0, c1 = (row g, cols 2t, 2t+1), c2, c3 = (row g+8, cols 2t, 2t+1)
#ifndef KVB_KERNELS_DEVICE_CUH
#define KVB_KERNELS_DEVICE_CUH
#ifndef __CUDACC__
#error "kvb_device.cuh is CUDA C++ (kernels/*/*.cu only)"
#endif

#include <cstdint>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace kvb_dev {

// ---- shared memory and cp.async ----

// The 32-bit shared-memory address of a generic pointer into shared memory.
__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

// The first 128-byte line of a dynamic shared-memory region that starts after a kernel's static shared
// memory (its launch asks SMEM_LINE more bytes). A cp.async ring must start on such a line: where a
// 16-byte copy lands across a 32-byte boundary of shared memory, the L2 serves its sector twice (ncu on
// an H200: twice the sector requests and half of them hits; kernels/page_scoring/NOTES.md).
constexpr int SMEM_LINE = 128;
__device__ __forceinline__ unsigned char *smem_line_start(unsigned char *p)
{
    return p + ((0u - smem_u32(p)) & (unsigned)(SMEM_LINE - 1));
}

// 4 bytes to, 16 bytes from a shared-memory address (smem_u32), where the address arithmetic (a swizzle)
// is done on the 32-bit shared window.
__device__ __forceinline__ void sts32(uint32_t addr, uint32_t v) { asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v)); }
__device__ __forceinline__ uint4 lds128(uint32_t addr)
{
    uint4 x;
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n" : "=r"(x.x), "=r"(x.y), "=r"(x.z), "=r"(x.w) : "r"(addr));
    return x;
}

// cp.async of N bytes (4, 8 or 16) global -> shared. 16 bytes bypass L1 (.cg); 4 and 8 go through it
// (.ca, the only form for them). cp_async_zfill: with `valid` false nothing is read and the N bytes are
// zero-filled (the source pointer must still be a valid address).
template <int N>
__device__ __forceinline__ void cp_async_zfill(uint32_t dst, const void *src, bool valid)
{
    static_assert(N == 4 || N == 8 || N == 16, "cp.async copies 4, 8 or 16 bytes");
    if constexpr (N == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(dst), "l"(src), "n"(N), "r"(valid ? N : 0));
}

template <int N>
__device__ __forceinline__ void cp_async_zfill(void *dst, const void *src, bool valid)
{
    cp_async_zfill<N>(smem_u32(dst), src, valid);
}

// cp.async of N bytes (4 or 8) that always reads (no fill operand).
template <int N>
__device__ __forceinline__ void cp_async(void *dst, const void *src)
{
    static_assert(N == 4 || N == 8, "cp_async: 4 or 8 bytes (16: cp_async_zfill<16>)");
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2;\n" ::"r"(smem_u32(dst)), "l"(src), "n"(N));
}

// 16 bytes, zero-filled when !valid (the common case of the tile loaders).
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, bool valid) { cp_async_zfill<16>(dst, src, valid); }
__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool valid) { cp_async_zfill<16>(dst, src, valid); }

// An L2 policy that evicts first: for data streamed once (page metadata), so that what is written and
// read back soon (the scoring pass's intermediate scores) keeps its place in L2.
__device__ __forceinline__ uint64_t l2_evict_first_policy()
{
    uint64_t p;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(p));
    return p;
}

// cp_async16 with an L2 cache policy (l2_evict_first_policy), zero-filled when !valid.
__device__ __forceinline__ void cp_async16_hint(uint32_t dst, const void *src, bool valid, uint64_t policy)
{
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst), "l"(src),
                 "r"(valid ? 16 : 0), "l"(policy));
}

// Close the group of the cp.async copies issued since the last commit.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Wait until at most N groups are pending. The "memory" clobber keeps the compiler from moving shared-
// memory accesses across the wait (the copies' data is only there after it).
template <int N>
__device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// ---- ldmatrix, mma.sync, movmatrix ----

// Four 8x8 matrices of 16-bit elements from shared memory; lanes 8i..8i+7 give the row addresses of matrix i.
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// The same, each matrix transposed.
__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

// c += a * b (m16n8k16, bf16 inputs, fp32 accumulators)
__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                         uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    mma_bf16(c, a[0], a[1], a[2], a[3], b0, b1);
}

// c += a * b (m16n8k16, fp16 inputs, fp32 accumulators)
__device__ __forceinline__ void mma_f16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                        uint32_t b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Transpose an 8x8 matrix of 16-bit values held one row-pair per thread (movmatrix layout = C/A layout).
__device__ __forceinline__ uint32_t movmatrix_t(uint32_t x)
{
    uint32_t y;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
    return y;
}

// ---- fast math ----

__device__ __forceinline__ float ex2(float x) // 2^x on the SFU (flush-to-zero); ex2(-inf) = 0
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// ---- 16-bit pairs ----

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) // round to nearest even; lo in the low half
{
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

__device__ __forceinline__ uint32_t pack_f16(float lo, float hi)
{
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

// A bf16 as a float, exactly: from its 16 bits, or the low / high half of a 32-bit pair.
__device__ __forceinline__ float bf16_bits_to_float(uint16_t v) { return __uint_as_float((uint32_t)v << 16); }
__device__ __forceinline__ float bf16_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t w) { return __uint_as_float(w & 0xFFFF0000u); }

// Eight bf16 (one 16-byte load) as floats, exactly: element 2i in the low half of word i.
__device__ __forceinline__ void unpack_bf16x8(const uint4 &v, float (&f)[8])
{
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) f[2 * i] = bf16_lo(w[i]), f[2 * i + 1] = bf16_hi(w[i]);
}

__device__ __forceinline__ uint32_t bits_of(__nv_bfloat162 v) { return *reinterpret_cast<uint32_t *>(&v); }
__device__ __forceinline__ __nv_bfloat162 bf2_of(uint32_t u) { return *reinterpret_cast<__nv_bfloat162 *>(&u); }

// ---- global loads ----

__device__ __forceinline__ uint4 ldg16(const void *p) { return __ldg(reinterpret_cast<const uint4 *>(p)); }

// ---- ordering ----

// The order-preserving 32-bit key of a float that the suite's top-k ranks by (reference/select.h
// topk_order_key): larger float, larger key; -0 equals +0; a NaN ranks by its bits.
__device__ __forceinline__ uint32_t order_key(float f)
{
    uint32_t u = __float_as_uint(f);
    if (u == 0x80000000u) u = 0; // -0 is +0
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// ---- kernels chained on one stream (programmatic dependent launch, sm_90) ----

// A kernel launched by launch_chained may become resident while the kernel before it on the stream is
// still running: its blocks wait in chain_wait() until that kernel has ended and its writes are
// visible. Every such kernel calls chain_wait() before it touches global memory (a no-op when the
// kernel was launched without the attribute), and chain_release(), which lets the next chained kernel
// be scheduled: its launch and block start-up overlap this kernel's work instead of following its end.
// A short kernel releases right after its wait; a kernel that streams releases after its reads, so
// that the next kernel's waiting blocks do not sit beside it (kernels/page_scoring/NOTES.md, Tried).
__device__ __forceinline__ void chain_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__device__ __forceinline__ void chain_release() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }

// ---- the cluster barrier (thread block clusters, sm_90; every thread of every block arrives) ----
__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory"); }
// (an arrival that orders nothing: it only tells the others that this block runs)
__device__ __forceinline__ void cluster_arrive_relaxed() { asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }

// Launch `kernel` on `stream` with `n` launch attributes (cudaLaunchKernelEx).
template <typename... Params, typename... Args>
cudaError_t launch_with_attrs(const cudaLaunchAttribute *attrs, int n, void (*kernel)(Params...), dim3 grid, dim3 block,
                              size_t smem, cudaStream_t stream, Args... args)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = const_cast<cudaLaunchAttribute *>(attrs);
    cfg.numAttrs = (unsigned)n;
    return cudaLaunchKernelEx(&cfg, kernel, static_cast<Params>(args)...);
}

// Launch `kernel` on `stream` with one launch attribute.
template <typename... Params, typename... Args>
cudaError_t launch_with(cudaLaunchAttribute attr, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                        cudaStream_t stream, Args... args)
{
    return launch_with_attrs(&attr, 1, kernel, grid, block, smem, stream, args...);
}

// Launch `kernel` on `stream` with programmatic stream serialization (the kernel must call chain_wait()
// first, see above). Captured into a CUDA graph, the dependency becomes a programmatic edge.
template <typename... Params, typename... Args>
cudaError_t launch_chained(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                           Args... args)
{
    cudaLaunchAttribute attr = {};
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    return launch_with(attr, kernel, grid, block, smem, stream, args...);
}

// Launch `kernel` on `stream` as clusters of `cluster` blocks along x (grid a multiple of it), plainly
// ordered after the kernel before: a chained cluster launch measured 8 us slower after a 1408-block kernel
// (kernels/select/NOTES.md, Tried).
template <typename... Params, typename... Args>
cudaError_t launch_cluster(void (*kernel)(Params...), unsigned grid, int cluster, dim3 block, size_t smem,
                           cudaStream_t stream, Args... args)
{
    cudaLaunchAttribute attr = {};
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = (unsigned)cluster, attr.val.clusterDim.y = 1, attr.val.clusterDim.z = 1;
    return launch_with(attr, kernel, dim3(grid), block, smem, stream, args...);
}

// launch_cluster's clusters, launched chained as launch_chained does (both attributes).
template <typename... Params, typename... Args>
cudaError_t launch_chained_cluster(void (*kernel)(Params...), unsigned grid, int cluster, dim3 block, size_t smem,
                                   cudaStream_t stream, Args... args)
{
    cudaLaunchAttribute attr[2] = {};
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = (unsigned)cluster, attr[0].val.clusterDim.y = 1, attr[0].val.clusterDim.z = 1;
    attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[1].val.programmaticStreamSerializationAllowed = 1;
    return launch_with_attrs(attr, 2, kernel, dim3(grid), block, smem, stream, args...);
}

// How many clusters of `cluster` blocks of `kernel` (blocks of `threads`, `smem` bytes of dynamic shared
// memory, the kernel's attributes as set) can be resident at once on the current device: asked once a
// device, kernel, block, shared memory and cluster size (the first 32 such of each kernel signature, then
// at every call), not on every launch.
template <typename... Params>
cudaError_t resident_clusters_of(void (*kernel)(Params...), int threads, size_t smem, int cluster, int *n)
{
    struct Known { int dev; void (*kernel)(Params...); int threads; size_t smem; int cluster, n; };
    static Known known[32];
    static int n_known = 0;
    int dev = 0;
    cudaError_t e = cudaGetDevice(&dev);
    if (e != cudaSuccess) return e;
    for (int i = 0; i < n_known; i++)
        if (known[i].dev == dev && known[i].kernel == kernel && known[i].threads == threads && known[i].smem == smem &&
            known[i].cluster == cluster)
            return *n = known[i].n, cudaSuccess;
    int sms = 0; // a grid of a cluster a SM (the count does not depend on it; it must be a multiple of the cluster)
    if ((e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev)) != cudaSuccess) return e;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)(cluster * sms)), cfg.blockDim = dim3((unsigned)threads), cfg.dynamicSmemBytes = smem;
    cudaLaunchAttribute attr = {};
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = (unsigned)cluster, attr.val.clusterDim.y = 1, attr.val.clusterDim.z = 1;
    cfg.attrs = &attr, cfg.numAttrs = 1;
    if ((e = cudaOccupancyMaxActiveClusters(n, kernel, &cfg)) != cudaSuccess) return e;
    if (n_known < 32) known[n_known++] = Known{dev, kernel, threads, smem, cluster, *n};
    return cudaSuccess;
}

// ---- warp reductions ----
// Butterfly (xor) steps FIRST, 2 FIRST, ..., LAST when FIRST <= LAST, or FIRST, FIRST / 2, ..., LAST
// when FIRST > LAST (powers of two): x combined over the lanes whose ids differ only in those bits,
// every lane ending with its group's result. <1, 2>: the 4 lanes of a quad (a row of an MMA fragment);
// <4, 16>: the 8 row groups g (a column); <16, 1>: the whole warp. The step order fixes the rounding of
// a sum, so each call site keeps the order it was validated with.

template <int FIRST, int LAST, typename T, typename Op>
__device__ __forceinline__ T warp_reduce(T x, Op op)
{
    static_assert(FIRST > 0 && LAST > 0 && FIRST < 32 && LAST < 32, "xor offsets in [1, 16]");
    if constexpr (FIRST <= LAST) {
#pragma unroll
        for (int o = FIRST; o <= LAST; o <<= 1) x = op(x, __shfl_xor_sync(0xffffffffu, x, o));
    } else {
#pragma unroll
        for (int o = FIRST; o >= LAST; o >>= 1) x = op(x, __shfl_xor_sync(0xffffffffu, x, o));
    }
    return x;
}

struct ReduceMax {
    template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return fmax(a, b); }
};
struct ReduceMin {
    template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return fmin(a, b); }
};
struct ReduceSum {
    template <typename T> __device__ __forceinline__ T operator()(T a, T b) const { return a + b; }
};

template <int FIRST, int LAST, typename T> __device__ __forceinline__ T warp_max(T x)
{
    return warp_reduce<FIRST, LAST>(x, ReduceMax());
}
template <int FIRST, int LAST, typename T> __device__ __forceinline__ T warp_min(T x)
{
    return warp_reduce<FIRST, LAST>(x, ReduceMin());
}
template <int FIRST, int LAST, typename T> __device__ __forceinline__ T warp_sum(T x)
{
    return warp_reduce<FIRST, LAST>(x, ReduceSum());
}

// Two values reduced in lockstep (step by step, alternating): the instruction order of two interleaved
// reductions, which the register allocation of the hot loops was tuned with.
template <int FIRST, int LAST>
__device__ __forceinline__ void warp_max(float &x, float &y)
{
    static_assert(FIRST > 0 && FIRST <= LAST && LAST < 32, "ascending xor offsets in [1, 16]");
#pragma unroll
    for (int o = FIRST; o <= LAST; o <<= 1) {
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
        y = fmaxf(y, __shfl_xor_sync(0xffffffffu, y, o));
    }
}

template <int FIRST, int LAST>
__device__ __forceinline__ void warp_sum(float &x, float &y)
{
    static_assert(FIRST > 0 && FIRST <= LAST && LAST < 32, "ascending xor offsets in [1, 16]");
#pragma unroll
    for (int o = FIRST; o <= LAST; o <<= 1) {
        x += __shfl_xor_sync(0xffffffffu, x, o);
        y += __shfl_xor_sync(0xffffffffu, y, o);
    }
}

// The 128-byte line holding p into L2 (no register written, nothing to wait for).
__device__ __forceinline__ void prefetch_l2(const void *p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

// ---- mbarriers and bulk copies (sm_90) ----

// An mbarrier in shared memory expecting `count` arrivals; mbar_init_fence makes the inits visible to
// the bulk-copy engine (after every init, before the first copy).
__device__ __forceinline__ void mbar_init(uint64_t *bar, unsigned count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_init_fence() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }

// Arrive once and expect `bytes` of bulk copies to complete on the barrier (at shared address `bar`).
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, unsigned bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t *bar, unsigned bytes) { mbar_expect_tx(smem_u32(bar), bytes); }

// Spin until the barrier's (at shared address `b`) phase of the given parity completes.
__device__ __forceinline__ void mbar_wait(uint32_t b, unsigned parity)
{
    uint32_t done = 0;
    do {
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
                     : "=r"(done)
                     : "r"(b), "r"(parity)
                     : "memory");
    } while (!done);
}
__device__ __forceinline__ void mbar_wait(uint64_t *bar, unsigned parity) { mbar_wait(smem_u32(bar), parity); }

// cp.async.bulk of `bytes` (a multiple of 16, 16-byte aligned) global -> shared, completing on `bar`
// (`dst` and `bar` as shared addresses).
__device__ __forceinline__ void bulk_copy(uint32_t dst, const void *src, unsigned bytes, uint32_t bar)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(dst),
                 "l"(src), "r"(bytes), "r"(bar)
                 : "memory");
}
__device__ __forceinline__ void bulk_copy(void *dst, const void *src, unsigned bytes, uint64_t *bar)
{
    bulk_copy(smem_u32(dst), src, bytes, smem_u32(bar));
}


// Arrive once on the barrier (no transaction bytes).
__device__ __forceinline__ void mbar_arrive(uint64_t *bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}

// ---- TMA (cp.async.bulk.tensor, sm_90) ----
// `map` is a CUtensorMap kernel parameter (__grid_constant__), passed by its generic address.

// The box at coordinates (c0, c1, c2) of a 3-D tensor map into shared memory, completing on `bar`.
__device__ __forceinline__ void tma_load_3d(uint32_t dst, const void *map, int c0, int c1, int c2, uint64_t *bar)
{
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];" ::"r"(
                     dst),
                 "l"(map), "r"(c0), "r"(c1), "r"(c2), "r"(smem_u32(bar))
                 : "memory");
}

// Shared memory into the box at (c0, c1, c2) (elements outside the tensor are not written), in the
// thread's bulk group; tma_store_wait_read: until the thread's stores have read their shared memory.
__device__ __forceinline__ void tma_store_3d(const void *map, uint32_t src, int c0, int c1, int c2)
{
    asm volatile("cp.async.bulk.tensor.3d.global.shared::cta.tile.bulk_group [%0, {%1, %2, %3}], [%4];" ::"l"(map), "r"(c0),
                 "r"(c1), "r"(c2), "r"(src)
                 : "memory");
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}
__device__ __forceinline__ void tma_store_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); }

// Generic-proxy writes to shared memory made visible to the async proxy (before a TMA store reads them).
__device__ __forceinline__ void fence_proxy_async_smem() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// A block's arrival on a count at GPU scope, by one thread after a __syncthreads: release (cumulative,
// so it covers the writes the barrier ordered before it) and acquire (the next __syncthreads orders the
// block's later reads after the earlier arrivals' writes), as cooperative groups' grid sync and
// CUTLASS's semaphore do, instead of a sequentially consistent fence (__threadfence) in every thread.
__device__ __forceinline__ int arrive_acq_rel_gpu(int *count)
{
    int old;
    asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;" : "=r"(old) : "l"(count) : "memory");
    return old;
}

// A barrier among `threads` threads (a multiple of 32) on hardware barrier `id` (1..15; 0 is __syncthreads).
__device__ __forceinline__ void named_barrier(int id, int threads)
{
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// Arrive on hardware barrier `id` without waiting: the producer half of a bar.sync among `threads`.
__device__ __forceinline__ void named_barrier_arrive(int id, int threads)
{
    asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// ---- wgmma (sm_90a) ----
// A warpgroup is 4 consecutive warps (the first a multiple of 4). Accumulator layout of m64nNk16, per
// warp w of the group and lane 4 g + t: d[4 n + e] = (row 16 w + g + 8 (e >> 1), column 8 n + 2 t + (e & 1)),
// i.e. the mma.sync C fragment of each 8-column tile n. The register A operand is the mma.sync A
// fragment of the warp's 16 rows.

// Shared-memory matrix descriptor of a 128-byte-swizzled operand (the layout TMA writes with
// CU_TENSOR_MAP_SWIZZLE_128B into 1024-byte-aligned tiles of 128-byte rows). K-major: `lbo` unused,
// `sbo` = 1024 (8 rows); MN-major: `lbo` = bytes between 64-element column blocks, `sbo` = 1024.
__device__ __forceinline__ uint64_t wgmma_desc_sw128(uint32_t smem_addr, uint32_t lbo, uint32_t sbo)
{
    return (uint64_t)((smem_addr & 0x3FFFFu) >> 4) | ((uint64_t)((lbo >> 4) & 0x3FFFu) << 16) |
           ((uint64_t)((sbo >> 4) & 0x3FFFu) << 32) | (1ull << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory"); }

// Accumulator registers are written asynchronously until wgmma_wait: this pins every access to them
// on the right side of the wait (the compiler may not move reads or writes across it).
template <int N> __device__ __forceinline__ void wgmma_fence_regs(float (&d)[N])
{
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
template <int N> __device__ __forceinline__ void wgmma_fence_regs(uint32_t (&d)[N])
{
#pragma unroll
    for (int i = 0; i < N; ++i) asm volatile("" : "+r"(d[i])::"memory");
}

#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
// Register budget of the calling warpgroup (all its warps execute it): a producer hands registers
// back (dec) so that consumer warpgroups of the same CTA can take them (inc). N: 24..256, step 8.
template <int N> __device__ __forceinline__ void setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N)); }
template <int N> __device__ __forceinline__ void setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N)); }

// D (64 x 128, fp32) = A B^T (ACCUMULATE: D += A B^T), A 64 x 16 and B 128 x 16 both K-major in shared
// memory. Without ACCUMULATE, D is output only, so the compiler never keeps (or moves) its old value
// while the MMA is in flight.
template <bool ACCUMULATE>
__device__ __forceinline__ void wgmma_m64n128k16_ss(float (&d)[64], uint64_t desc_a, uint64_t desc_b)
{
    if constexpr (ACCUMULATE)
        asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, 1, 1, 1, 0, 0;\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                     : "l"(desc_a), "l"(desc_b));
    else
        asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, 0, 1, 1, 0, 0;\n"
                     : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]), "=f"(d[7]), "=f"(d[8]), "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]), "=f"(d[14]), "=f"(d[15]), "=f"(d[16]), "=f"(d[17]), "=f"(d[18]), "=f"(d[19]), "=f"(d[20]), "=f"(d[21]), "=f"(d[22]), "=f"(d[23]), "=f"(d[24]), "=f"(d[25]), "=f"(d[26]), "=f"(d[27]), "=f"(d[28]), "=f"(d[29]), "=f"(d[30]), "=f"(d[31]), "=f"(d[32]), "=f"(d[33]), "=f"(d[34]), "=f"(d[35]), "=f"(d[36]), "=f"(d[37]), "=f"(d[38]), "=f"(d[39]), "=f"(d[40]), "=f"(d[41]), "=f"(d[42]), "=f"(d[43]), "=f"(d[44]), "=f"(d[45]), "=f"(d[46]), "=f"(d[47]), "=f"(d[48]), "=f"(d[49]), "=f"(d[50]), "=f"(d[51]), "=f"(d[52]), "=f"(d[53]), "=f"(d[54]), "=f"(d[55]), "=f"(d[56]), "=f"(d[57]), "=f"(d[58]), "=f"(d[59]), "=f"(d[60]), "=f"(d[61]), "=f"(d[62]), "=f"(d[63])
                     : "l"(desc_a), "l"(desc_b));
}

// D (64 x 128, fp32) = A B (+ D when `accumulate`): A 64 x 16 bf16 in registers (each warp the mma.sync A
// fragment of its 16 rows), B 16 x 128 N-major (MN-major) in shared memory
__device__ __forceinline__ void wgmma_m64n128k16_rs_mn(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b, int accumulate)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}

// D (64 x 64, fp32) = A B (+ D when `accumulate`): A 64 x 16 bf16 in registers (each warp the mma.sync A
// fragment of its 16 rows), B 16 x 64 N-major in shared memory
__device__ __forceinline__ void wgmma_m64n64k16_rs_mn(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b, int accumulate)
{
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}
// D (64 x 128, fp32) = A B^T (ACCUMULATE: D += A B^T), A 64 x 16 bf16 in registers (each warp the
// mma.sync A fragment of its 16 rows), B 128 x 16 K-major in shared memory. Without ACCUMULATE, D is
// output only.
template <bool ACCUMULATE>
__device__ __forceinline__ void wgmma_m64n128k16_rs(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b)
{
    if constexpr (ACCUMULATE)
        asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, 1, 1, 1, 0;\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
    else
        asm volatile("wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, {%64, %65, %66, %67}, %68, 0, 1, 1, 0;\n"
                     : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]), "=f"(d[7]), "=f"(d[8]), "=f"(d[9]), "=f"(d[10]), "=f"(d[11]), "=f"(d[12]), "=f"(d[13]), "=f"(d[14]), "=f"(d[15]), "=f"(d[16]), "=f"(d[17]), "=f"(d[18]), "=f"(d[19]), "=f"(d[20]), "=f"(d[21]), "=f"(d[22]), "=f"(d[23]), "=f"(d[24]), "=f"(d[25]), "=f"(d[26]), "=f"(d[27]), "=f"(d[28]), "=f"(d[29]), "=f"(d[30]), "=f"(d[31]), "=f"(d[32]), "=f"(d[33]), "=f"(d[34]), "=f"(d[35]), "=f"(d[36]), "=f"(d[37]), "=f"(d[38]), "=f"(d[39]), "=f"(d[40]), "=f"(d[41]), "=f"(d[42]), "=f"(d[43]), "=f"(d[44]), "=f"(d[45]), "=f"(d[46]), "=f"(d[47]), "=f"(d[48]), "=f"(d[49]), "=f"(d[50]), "=f"(d[51]), "=f"(d[52]), "=f"(d[53]), "=f"(d[54]), "=f"(d[55]), "=f"(d[56]), "=f"(d[57]), "=f"(d[58]), "=f"(d[59]), "=f"(d[60]), "=f"(d[61]), "=f"(d[62]), "=f"(d[63])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
}

#endif // sm_90a

} // namespace kvb_dev

#endif
