/* int2.h: CUDA API of the INT2 KV cache (kernels/int2/NOTES.md; reference and layouts: reference/int2.h).
 *
 * Every function validates its parameters before launching anything and returns KVB_OK, or
 * KVB_EINVAL with kvb_last_error() naming the parameter, its value and the allowed range. Launches
 * are asynchronous on `stream`; the cache pointers are device pointers.
 *
 * Quantizer inputs are device data, so their range (finite, |x| <= 32768) cannot be checked before
 * the launch: the harness checks them with the reference first. A group that holds a value outside
 * the range is not silently quantized: its scale and zero are written as fp16 NaN (and its codes 0).
 */
#ifndef KVB_KERNELS_INT2_H
#define KVB_KERNELS_INT2_H

#include <cuda_runtime_api.h>

#include "reference/int2.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The fused kernels read the cache in tiles of 256 tokens: they need Tcap to be a multiple of 256
 * (a cache allocated in 256-token granules; T itself is any multiple of gs). */
#define INT2_TCAP_GRANULE 256

/* Quantize tokens [0, n) of K [B, Hkv, src_len, D] (bf16) into cache tokens [t0, t0 + n) of c->Kq, Ks,
 * Kz; n, t0 multiples of gs, t0 + n <= Tcap (see ref_int2_quantize_keys). */
int int2_quantize_keys(const kvb_bf16 *K, int64_t src_len, int64_t n, int64_t t0, const int2_cache *c,
                       const int2_layout *l, cudaStream_t stream);

/* The same for values: c->Vq, Vs, Vz. */
int int2_quantize_values(const kvb_bf16 *V, int64_t src_len, int64_t n, int64_t t0, const int2_cache *c,
                         const int2_layout *l, cudaStream_t stream);

/* One decode step's append (see ref_int2_append): knew, vnew [B, Hkv, D] go to residual slot l->R;
 * when the residual then holds 128 tokens, its first 128 are quantized into cache tokens
 * [T, T + 128) and the rest move to the front. The caller advances T and R as ref_int2_append says. */
int int2_append(const int2_cache *c, const kvb_bf16 *knew, const kvb_bf16 *vnew, const int2_layout *l,
                cudaStream_t stream);
/* The same, keeping a native copy n of the cache in step: a flush also quantizes its 128 tokens into
 * n (int2_quantize_native), so the native cache needs no mirror from c. A flushing append needs T a
 * multiple of max(64, gs). */
int int2_append_native(const int2_cache *c, const int2_native *n, const kvb_bf16 *knew, const kvb_bf16 *vnew,
                       const int2_layout *l, cudaStream_t stream);

/* scores [B, Hq, T] fp32 = q . dequant(K) (no 1/sqrt(D)); fp16 tensor-core products of the exactly
 * rounded dequantized keys and of q scaled by a power of two per head, fp32 accumulation. */
int int2_qk(const kvb_bf16 *q, const int2_cache *c, float *scores, const int2_layout *l, cudaStream_t stream);

/* out [B, Hq, D] fp32 = p [B, Hq, T] . dequant(V). Split over tokens, partial sums merged in a fixed
 * order by the last block of each KV head (deterministic); needs int2_av_workspace_bytes(l) of
 * device workspace, zeroed once and reusable. */
size_t int2_av_workspace_bytes(const int2_layout *l);
int int2_av(const float *p, const int2_cache *c, float *out, const int2_layout *l, void *workspace,
            cudaStream_t stream);

/* The fused decode step: o [B, Hq, D] bf16 = softmax([q . dequant(K) ; q . Kr] / sqrt(D)) . [dequant(V) ; Vr].
 * One read of the packed cache and the residual per KV head, split along tokens with a log-sum-exp
 * merge. Workspace: int2_decode_attn_workspace_bytes(l), enough for every version below, zeroed once
 * and reusable. The versions' designs: kernels/int2/NOTES.md.
 *
 * int2_decode_attn (v3, the production version) reads the quantized tokens from the kernel-native layout
 * n (reference/int2.h: int2_native; written by int2_quantize_native, int2_append_native or
 * int2_to_native) and only the residual (Kr, Vr) from c: each warp bulk-copies its own 64-token step
 * records into a ring of shared memory (cp.async.bulk + mbarrier), no block barrier in the token loop.
 * n may be NULL when T = 0. T < 64 (2^31 - 64). */
size_t int2_decode_attn_workspace_bytes(const int2_layout *l);
int int2_decode_attn(const kvb_bf16 *q, const int2_cache *c, const int2_native *n, kvb_bf16 *o, const int2_layout *l,
                     void *workspace, cudaStream_t stream);
/* The earlier versions over the interchange cache c, kept as same-run peers: v2 feeds the 2-bit codes to
 * the tensor cores as exact small integers, the scales and zeros folded into q and p per quantization
 * group; v1 dequantizes every code to an fp16 value before its MMA. */
int int2_decode_attn_v2(const kvb_bf16 *q, const int2_cache *c, kvb_bf16 *o, const int2_layout *l, void *workspace,
                        cudaStream_t stream);
int int2_decode_attn_v1(const kvb_bf16 *q, const int2_cache *c, kvb_bf16 *o, const int2_layout *l, void *workspace,
                        cudaStream_t stream);
/* The native layout of tokens [t0, t1) (whole 64-token steps: every step the range touches) written from
 * the interchange cache c on the device, bit for bit as ref_int2_to_native: after a quantize (t0 = 0,
 * t1 = T) or an append's flush (t0 = T, t1 = T + 128). Needs Tcap a multiple of 64 and 0 <= t0 <= t1 <=
 * Tcap; tokens of those steps past T are copied as they are in c. */
int int2_to_native(const int2_cache *c, const int2_native *n, const int2_layout *l, int64_t t0, int64_t t1,
                   cudaStream_t stream);
/* Tokens [0, n) of K, V [B, Hkv, src_len, D] (bf16) quantized straight into the native layout's cache
 * tokens [t0, t0 + n), bit for bit as ref_int2_quantize_keys/values followed by ref_int2_to_native:
 * the prompt (t0 = 0) or an append's flush, with no interchange copy. n and t0 are multiples of
 * max(64, gs) (whole steps and whole key groups); Tcap a multiple of 64. */
int int2_quantize_native(const kvb_bf16 *K, const kvb_bf16 *V, int64_t src_len, int64_t n, int64_t t0,
                         const int2_native *nat, const int2_layout *l, cudaStream_t stream);
/* int2_qk and int2_av over the native layout (n; c is not read): the same results within the same
 * tolerance, from v3's step code (scores: the products of the codes with q s_g in fp16 hi and lo halves
 * plus q . z_g, fp32 accumulation; values: p scaled by a power of two per head below 2 in fp16, times
 * s_g, against the codes, plus Z . p). Tcap a multiple of 64; int2_av_native takes int2_av's workspace. */
int int2_qk_native(const kvb_bf16 *q, const int2_native *n, float *scores, const int2_layout *l, cudaStream_t stream);
int int2_av_native(const float *p, const int2_native *n, float *out, const int2_layout *l, void *workspace,
                   cudaStream_t stream);
/* Host self-test of int2_decode_attn_v2's per-thread copy plans against its shared-memory layout
 * formulas (no device needed): the number of violations, 0 when every copy and store lands once where
 * the layout puts it. */
long int2_v2_plan_selftest(void);

/* Write the dequantized cache as bf16 rows: K, V [B, Hkv, L, D] with tokens [0, T) dequantized
 * (code * scale + zero in fp32, rounded to bf16) and [T, T + R) copied from the residual; L >= T + R.
 * The first half of the in-suite peer "dequantize, then dense decode attention". */
int int2_dequantize(const int2_cache *c, kvb_bf16 *K, kvb_bf16 *V, int64_t L, const int2_layout *l,
                    cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
