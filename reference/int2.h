/* int2.h: the INT2 KV cache of MiniKV/KIVI (kernels/int2/NOTES.md): quantize and pack, the bf16 residual
 * buffer with its flush every 128 tokens, and the fused dequant-matmuls of decode.
 *
 * Group of gs values (gs in {16, 32, 64, 128}) along the quantized axis:
 *   mn, mx = min, max of the group        from the bf16 inputs, in fp32
 *   scale  = fp16((mx - mn) / 3),  zero = fp16(mn)                     the stored metadata
 *   code   = scale == 0 ? 0 : clamp(rint((x - zero) / scale), 0, 3)    in fp32 from the stored
 *            fp16 scale and zero; rint rounds half to even
 *   dequant(code) = code * scale + zero
 * Packing: 16 codes per uint32, code i of the 16 in bits [2i, 2i+1].
 *
 * Layouts (Tcap = token capacity of the quantized cache, Rcap = of the residual buffer):
 *   keys, per channel (groups run along tokens):   Kq [B, Hkv, D, Tcap/16] uint32, Ks, Kz [B, Hkv, D, Tcap/gs] fp16
 *   values, per token (groups run along channels): Vq [B, Hkv, Tcap, D/16] uint32, Vs, Vz [B, Hkv, Tcap, D/gs] fp16
 *   residual: Kr, Vr [B, Hkv, Rcap, D] bf16
 * A cache holds T quantized tokens (a multiple of gs) followed by R residual tokens, R < 128 + gs.
 *
 * Supported input range: finite values with |x| <= 32768 (2^15). The fp16 metadata and the fp16
 * tensor-core operands of the fused kernels then stay finite (a group spanning the whole fp16 range
 * would dequantize past the fp16 maximum). The references reject anything else, naming the element.
 */
#ifndef REF_INT2_H
#define REF_INT2_H

#include "reference/kvb.h"

#ifdef __cplusplus
extern "C" {
#endif

#define INT2_FLUSH 128            /* the residual is quantized and appended every 128 tokens */
#define INT2_MAX_ABS 32768.0      /* supported |x| of quantizer inputs */
#define INT2_MAX_TCAP (1 << 21)
#define INT2_MAX_G 8

typedef struct int2_layout {
    int B, Hkv, Hq, D, gs;
    int64_t Tcap; /* token capacity of the quantized cache, a multiple of gs */
    int64_t T;    /* quantized tokens held, a multiple of gs, <= Tcap */
    int Rcap;     /* token capacity of the residual buffer */
    int R;        /* residual tokens held, 0 <= R < 128 + gs, R <= Rcap */
} int2_layout;

/* Pointers of one cache (host or device). */
typedef struct int2_cache {
    uint32_t *Kq;
    kvb_fp16 *Ks, *Kz;
    uint32_t *Vq;
    kvb_fp16 *Vs, *Vz;
    kvb_bf16 *Kr, *Vr;
} int2_cache;

/* Element counts of each array of a layout. */
static inline int64_t int2_kq_elems(const int2_layout *l) { return (int64_t)l->B * l->Hkv * l->D * (l->Tcap / 16); }
static inline int64_t int2_kmeta_elems(const int2_layout *l) { return (int64_t)l->B * l->Hkv * l->D * (l->Tcap / l->gs); }
static inline int64_t int2_vq_elems(const int2_layout *l) { return (int64_t)l->B * l->Hkv * l->Tcap * (l->D / 16); }
static inline int64_t int2_vmeta_elems(const int2_layout *l) { return (int64_t)l->B * l->Hkv * l->Tcap * (l->D / l->gs); }
static inline int64_t int2_res_elems(const int2_layout *l) { return (int64_t)l->B * l->Hkv * l->Rcap * l->D; }

/* Bytes of those arrays at capacity, in double (host-memory estimates: no product of the fields wraps): the
 * keys' codes and metadata (Kq, Ks, Kz), the values' (Vq, Vs, Vz), the residual (Kr, Vr). */
static inline double int2_key_array_bytes(const int2_layout *l)
{
    return (double)l->B * l->Hkv * l->D * (4.0 * (double)(l->Tcap / 16) + 2 * 2.0 * (double)(l->Tcap / l->gs));
}
static inline double int2_value_array_bytes(const int2_layout *l)
{
    return (double)l->B * l->Hkv * (double)l->Tcap * (4.0 * (l->D / 16) + 2 * 2.0 * (l->D / l->gs));
}
static inline double int2_res_array_bytes(const int2_layout *l) { return 2 * 2.0 * l->B * l->Hkv * l->Rcap * l->D; }

/* Bytes a decode step reads from a cache of T quantized and R residual tokens per (b, kv head):
 * 2-bit codes, fp16 scale and zero, bf16 residual. */
static inline double int2_cache_bytes(const int2_layout *l)
{
    double heads = (double)l->B * l->Hkv, T = (double)l->T;
    return heads * (2.0 * T * l->D / 4.0 + 2.0 * 2.0 * 2.0 * T * l->D / l->gs + 2.0 * 2.0 * l->R * l->D);
}

/* Every field against its range: B in [1, 1024], Hkv in [1, 256], D in {64, 128}, gs in
 * {16, 32, 64, 128} with D a multiple of gs, Tcap in [0, 2^21] a multiple of gs, T in [0, Tcap] a
 * multiple of gs, Rcap >= 0, R in [0, min(Rcap, 128 + gs - 1)]. Messages name the field, its value and
 * the allowed range (kvb_last_error()). */
int int2_layout_check(const int2_layout *l, const char *who);

/* The above, plus what attention over the cache needs: Hq a multiple of Hkv with G = Hq/Hkv in
 * [1, 8], and T + R >= 1. */
int int2_attn_check(const int2_layout *l, const char *who);

/* A span of tokens to quantize: the layout, n and t0 multiples of gs, t0 + n <= Tcap, n <= src_len. */
int int2_span_check(const int2_layout *l, int64_t src_len, int64_t n, int64_t t0, const char *who);

/* Dequantizing into bf16 rows of L tokens: the layout and L >= T + R. */
int int2_dequantize_check(const int2_layout *l, int64_t L, const char *who);

/* An append: the layout, R + 1 <= Rcap, and room for a flush (T + 128 <= Tcap) when R + 1 >= 128. */
int int2_append_check(const int2_layout *l, const char *who);

/* dequant(code) = code * scale + zero, exact in double (it differs from the fp32 value by at most one
 * fp32 rounding). */
static inline double int2_dequant(unsigned code, kvb_fp16 scale, kvb_fp16 zero)
{
    return (double)code * (double)kvb_fp16_to_float(scale) + (double)kvb_fp16_to_float(zero);
}

/* Quantize one group of n values (fp32 from bf16) by the formulas above: codes[i] in 0..3, the
 * fp16 scale and zero. */
void int2_quantize_group(const float *x, int n, uint8_t *codes, kvb_fp16 *scale, kvb_fp16 *zero);

/* Quantize tokens [0, n) of K [B, Hkv, src_len, D] into cache tokens [t0, t0 + n) of Kq, Ks, Kz
 * (keys: per channel, groups of gs tokens). n and t0 are multiples of gs, t0 + n <= Tcap, n <= src_len.
 * Rejects a non-finite input or |x| > 32768, naming the element. */
int ref_int2_quantize_keys(const kvb_bf16 *K, int64_t src_len, int64_t n, int64_t t0, uint32_t *Kq, kvb_fp16 *Ks,
                           kvb_fp16 *Kz, const int2_layout *l);

/* The same for values (per token, groups of gs channels): Vq, Vs, Vz. */
int ref_int2_quantize_values(const kvb_bf16 *V, int64_t src_len, int64_t n, int64_t t0, uint32_t *Vq, kvb_fp16 *Vs,
                             kvb_fp16 *Vz, const int2_layout *l);

/* One decode step's append: token knew, vnew [B, Hkv, D] goes to residual slot R; when the residual
 * then holds 128 tokens or more, its first 128 tokens are quantized (keys and values) and appended
 * at cache token T, and the rest (fewer than gs) move to the front. Needs R + 1 <= Rcap and, for a
 * flush, T + 128 <= Tcap. *T_after and *R_after receive the new counts. */
int ref_int2_append(int2_cache *c, const kvb_bf16 *knew, const kvb_bf16 *vnew, const int2_layout *l,
                    int64_t *T_after, int *R_after);

/* The layout after one append (ref_int2_append's counts): R + 1 residual tokens, or after a flush
 * T + 128 quantized and R + 1 - 128 residual. */
static inline int2_layout int2_after_append(const int2_layout *l)
{
    int2_layout a = *l;
    a.R = l->R + 1;
    if (a.R >= INT2_FLUSH) a.T += INT2_FLUSH, a.R -= INT2_FLUSH;
    return a;
}

/* scores[b,h,t] = sum_d q[b,h,d] * dequant(K)[b,h/G,d,t] for t < T, and mag[b,h,t] = sum_d |q| (|code *
 * scale| + |zero|) (the magnitude the tolerance is relative to: a kernel rounds the scaled codes' and the
 * zeros' terms, which cancel in the sum, each relative to its own size). q [B, Hq, D] bf16; scores [B, Hq, T] fp32, mag double.
 * `slices`: NULL or one byte per (b, kv head), b-major (as in decode.h). */
int ref_int2_qk(const kvb_bf16 *q, const int2_cache *c, float *scores, double *mag, const int2_layout *l,
                const uint8_t *slices);

/* out[b,h,d] = sum_t p[b,h,t] * dequant(V)[b,h/G,t,d] for t < T, and mag = sum_t |p| (|code * scale| + |zero|).
 * p [B, Hq, T] fp32; out [B, Hq, D] fp32, mag double. */
int ref_int2_av(const float *p, const int2_cache *c, float *out, double *mag, const int2_layout *l,
                const uint8_t *slices);

/* The fused decode step: per query head, s = [q . dequant(K)[:, t] for t < T ; q . Kr[t] for t < R] / sqrt(D),
 * p = softmax(s), o = sum_t p_t dequant(V)[t] + sum_t p_{T+t} Vr[t]; double throughout, o rounded once to
 * bf16. q, o [B, Hq, D]. */
int ref_int2_decode_attn(const kvb_bf16 *q, const int2_cache *c, kvb_bf16 *o, const int2_layout *l,
                         const uint8_t *slices);

/* The cache as bf16 rows K, V [B, Hkv, L, D] (L >= T + R; rows past T + R are not written), as the
 * int2_dequantize kernel writes them: code * scale + zero rounded to fp32 (the kernel's fmaf, one rounding of
 * the exact value), then to bf16 (nearest even); the R residual tokens copied. */
int ref_int2_dequantize(const int2_cache *c, kvb_bf16 *K, kvb_bf16 *V, int64_t L, const int2_layout *l);

/* ---- the kernel-native layout of int2_decode_attn v3 (a layout of the decode kernel's own,
 * with a bit-exact converter in both directions) ----
 * The same codes and metadata, ordered so that each 64-token step of one (b, kv head) is two
 * contiguous runs the kernel bulk-copies into shared memory (its record and its key-metadata rows), and
 * every tensor-core fragment is one shared load and one AND per register (no shuffles, no
 * transposition pass). Tcap: a multiple of 64. NGV = D/gs, NGS = max(1, 64/gs).
 *   Rec [B, Hkv, Tcap/64, RW] uint32, RW = 8D + 64 NGV words per step s: key codes, value codes, value
 *   metadata. With lane = 4g + t (g < 8, t < 4) of the kernel's warp and M = 0x00030003:
 *     words [0, 4D): key code word (j, lane, p) at 64j + 2 lane + p (j < D/16, p < 2); 16-bit half hb,
 *        bits 2(2i + h): the code of key channel 16j + 4t + 2p + hb at token 64s + 16i + g + 8h (i < 4,
 *        h < 2): the A-fragment registers of the QK product (rows = tokens) are word & (M << 2(2i + h)).
 *     words [4D, 8D): value code word (i, lane, 2mh + p) at 4D + iD + lane D/32 + 2mh + p; half hb, bits
 *        2(2m + h): the code of value channel 16(4mh + m) + 2g + h at token 64s + 16i + 2t + 8p + hb.
 *     from word 8D, fp16: value scales (a = 0) and zeros (a = 1) of 16-token block i of the step,
 *        group gv, at half ((2i + a) NGV + gv) 16 + pos(tau), pos(tau) = 4((tau & 7) >> 1) + 2(tau >> 3) +
 *        (tau & 1) for token tau of the block (the four tokens 2t, 2t+1, 2t+8, 2t+9 of a B fragment
 *        side by side).
 *   Km [B, Hkv, Tcap/gs, 2, D] fp16: per key group n the scales (a = 0) then the zeros (a = 1) of every
 *     channel, channel c at 4((c/4 + 4(n % NGS)) % (D/4)) + c % 4: the rows of one step rotated by 32
 *     bytes against each other, so that lanes reading one per row hit different banks.
 * Sizes: Rec holds both codes and the value metadata, Km the key metadata: together the bytes of the
 * interchange arrays. */
typedef struct int2_native {
    uint32_t *Rec;
    kvb_fp16 *Km;
} int2_native;

static inline int64_t int2_native_rec_words(const int2_layout *l) { return 8 * (int64_t)l->D + 64 * (int64_t)(l->D / l->gs); }
static inline int64_t int2_native_rec_elems(const int2_layout *l)
{
    return (int64_t)l->B * l->Hkv * (l->Tcap / 64) * int2_native_rec_words(l);
}
static inline int64_t int2_native_km_elems(const int2_layout *l) { return 2 * int2_kmeta_elems(l); }
/* Bytes of Rec and Km, in double (as int2_key_array_bytes) */
static inline double int2_native_array_bytes(const int2_layout *l)
{
    return (double)l->B * l->Hkv * (4.0 * (double)(l->Tcap / 64) * (double)int2_native_rec_words(l) +
                                    2 * 2.0 * l->D * (double)(l->Tcap / l->gs));
}

/* Interchange cache c -> native n over the whole capacity (every token of Tcap, so that the kernel's
 * copies of a partial last step read initialized memory), and back. Both need Tcap a multiple of 64 and
 * return KVB_EINVAL otherwise (naming Tcap). Bit-exact: from_native(to_native(c)) == c. */
int ref_int2_to_native(const int2_cache *c, int2_native *n, const int2_layout *l);
int ref_int2_from_native(const int2_native *n, int2_cache *c, const int2_layout *l);

#ifdef __cplusplus
}
#endif
#endif
