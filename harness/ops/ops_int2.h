/* ops_int2.h: what the two int2 ops files share (internal to harness/ops): ops_int2.c (quantize, append,
 * the native layout, the dequant-matmuls) and ops_int2_decode.c (int2_decode_attn and its peers). The
 * case keys, the layout a case describes, the seeded inputs, the cache as run tensors. The family's
 * contract: kernels/int2/NOTES.md.
 *
 * Inputs: K, V source tokens [B, Hkv, T (+R), D] bf16, seeded, by dist:
 *   normal    N(0, 1)
 *   peaked    N(0, 1), and q with std 3 (a concentrated softmax)
 *   outlier   keys: every 8th channel x8 and shifted by +4; values: every 16th token x6 (KIVI's observation:
 *             key outliers by channel)
 *   spiky     outlier, and one value in 512 x16 on top (groups with extreme ranges; scores up to ~60).
 *             For the quantizer (bit-exact), the dot products (tolerance relative to sum |a_k| (|c_k s_k| + |z_k|)) and
 *             decode attention v3 and v2 (exact codes, q s_g as two fp16 halves). v1, which rounds the
 *             dequantized keys to fp16, exceeds the attention tolerance there: its attention cases use
 *             outlier (dequant_dense, judged against its own bf16 cache in ops_int2_decode.c, passes spiky)
 *   grid      multiples of 1/2 in [0, 3] (so groups spanning [0, 3] have scale 1 and exact ties at .5,
 *             rounded to even), every 7th key channel and value token constant (scale 0)
 *   nonfinite normal with one NaN key and one Inf value planted: the quantizer rejects it (bad input)
 */
#ifndef KVB_OPS_INT2_H
#define KVB_OPS_INT2_H

#include "reference/decode.h"
#include "reference/int2.h"
#include "harness/core/op.h"

#define NPARAMS(a) ((int)(sizeof(a) / sizeof((a)[0])))

#define K_B {"B", KVB_P_INT, 8, 1, 1024, NULL, "batch"}
#define K_HQ {"Hq", KVB_P_INT, 32, 1, 2048, NULL, "query heads (G = Hq/Hkv in [1, 8])"}
#define K_HKV {"Hkv", KVB_P_INT, 8, 1, 256, NULL, "KV heads"}
#define K_D {"D", KVB_P_INT, 128, 1, 1024, "64|128", "head dimension"}
#define K_GS {"gs", KVB_P_INT, 16, 1, 1024, "16|32|64|128", "quantization group size"}
#define K_T {"T", KVB_P_INT, 32768, 0, INT2_MAX_TCAP, NULL, "quantized tokens (a multiple of gs)"}
#define K_R {"R", KVB_P_INT, 64, 0, 1024, NULL, "residual bf16 tokens (< 128 + gs)"}
#define K_DIST {"dist", KVB_P_ENUM, 0, 0, 0, "normal|peaked|outlier|spiky|grid|nonfinite", "input distribution"}
#define K_SEED {"seed", KVB_P_INT, 1, 0, 1e15, NULL, "input seed"}

enum { DIST_NORMAL, DIST_PEAKED, DIST_OUTLIER, DIST_SPIKY, DIST_GRID, DIST_NONFINITE };

/* A run's private state. */
typedef struct int2_priv {
    int2_layout l;
    uint8_t *mask; /* the slice sample (kvb_sample_slices; NULL: every slice), freed by int2_op_teardown */
    double *mag;   /* int2_qk / int2_av: the per-element magnitude of the tolerance (the run's) */
    int64_t T_after;
    int R_after;
    decode_layout dense; /* the peers' dense layout: L = T + R */
    int32_t *dense_len;
} int2_priv;

/* The case's dist= as DIST_*. */
int int2_op_dist(const kvb_case *c);
/* The layout a case describes (Tcap and Rcap as the op allocates them). */
int2_layout int2_op_layout(const kvb_case *c);
/* x [heads, n, D], token-major, from the distribution. `key`: keys (channel outliers) or values (token outliers). */
void int2_op_fill_kv(kvb_bf16 *x, int64_t heads, int64_t n, int D, int dist, uint64_t seed, const char *name, int key);
/* q: N(0, 1), std 3 for dist=peaked. */
void int2_op_fill_q(kvb_tensor *q, const kvb_case *c, uint64_t seed);
/* Why two launches of int2_decode_attn (v3) may differ in bits (kvb_run.nondeterministic): its warps claim
 * a segment's 64-token steps from a shared counter, so which warp sums which steps, and so the order of the
 * fp32 sums, changes from launch to launch. v1 and v2 split the steps statically and are bitwise stable. */
extern const char int2_v3_bits_vary[];
/* The run's int2_priv (r->priv, a block of the run), with the case's layout. */
int2_priv *int2_op_priv_new(kvb_run *r);
/* Kq, Ks, Kz (keys), Vq, Vs, Vz (values) with the given role, and the residual Kr, Vr when with_res; the fp16
 * metadata outputs compared bit-exact. */
void int2_op_add_cache(kvb_run *r, const int2_layout *l, int role, int keys, int values, int with_res);
/* Host bytes of the interchange cache of l (kvb_op.host_bytes, in double): the codes and fp16 metadata of the keys
 * and of the values, the bf16 residual (with_res). */
double int2_op_cache_host_bytes(const int2_layout *l, int keys, int values, int with_res);
/* The cache's pointers: the host inputs, the reference copies (ref = 1), or the device buffers. */
int2_cache int2_op_cache(kvb_run *r, int device, int ref);
/* Quantize tokens [0, T) of the sources (stride n_src tokens) into the host cache c with the reference
 * quantizer; the cache past T gets NaN metadata and all-ones codes (a read there that is not masked fails). */
int int2_op_quantize_into(int2_cache *c, const int2_layout *l, const kvb_bf16 *Ksrc, const kvb_bf16 *Vsrc, int64_t n_src);
/* Residual slots [0, R) <- source tokens [T, T + R); the rest of the buffer random. */
void int2_op_fill_residual(int2_cache *c, const int2_layout *l, const kvb_bf16 *Ksrc, const kvb_bf16 *Vsrc,
                           int64_t n_src, uint64_t seed);
/* Sampled reference slices: mask on (b, kv head), the named tensors' slice lengths, and the note. */
void int2_op_sample_slices(kvb_run *r, int2_priv *p, double work_per_slice, const char **names, int n_names,
                           const int64_t *slice_lens);
/* The cache's kernel-native copy (inputs Rec, Km) by the reference converter (bit-exact, tested). */
int int2_op_add_native_copy(kvb_run *r, const int2_layout *l);
/* Frees the slice sample (the int2_priv and its buffers are the run's: kvb_run_alloc). */
void int2_op_teardown(kvb_run *r);

#endif
