/* block.c: the plain C reference of one decoding transformer block (block.h), stage by stage; each
 * stage in double from its bf16 inputs, rounded once to bf16 at its output. */
#include "reference/step/block.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const block_preset PRESETS[] = {
    {"tiny", 256, 4, 2, 64, 512, 2, 10000.0, 1e-5},
    {"llama3-8b", 4096, 32, 8, 128, 14336, 32, 500000.0, 1e-5},
    {"llama2-7b", 4096, 32, 32, 128, 11008, 32, 10000.0, 1e-5},
};

const block_preset *block_preset_find(const char *name)
{
    for (size_t i = 0; name && i < sizeof PRESETS / sizeof PRESETS[0]; i++)
        if (!strcmp(PRESETS[i].name, name)) return &PRESETS[i];
    return NULL;
}

int64_t block_weight_elems(const block_preset *m)
{
    const int64_t h = m->hidden, qkv = (int64_t)(m->Hq + 2 * m->Hkv) * m->D;
    return 2 * h + qkv * h + h * (int64_t)m->Hq * m->D + 2 * (int64_t)m->ffn * h + h * m->ffn;
}

void ref_rmsnorm(const kvb_bf16 *x, const kvb_bf16 *w, int rows, int n, double eps, kvb_bf16 *y)
{
    for (int r = 0; r < rows; r++) {
        const kvb_bf16 *xr = x + (int64_t)r * n;
        double ss = 0;
        for (int i = 0; i < n; i++) ss += kvb_bf16_to_double(xr[i]) * kvb_bf16_to_double(xr[i]);
        const double inv = 1.0 / sqrt(ss / n + eps);
        for (int i = 0; i < n; i++)
            y[(int64_t)r * n + i] = kvb_double_to_bf16(kvb_bf16_to_double(xr[i]) * inv * kvb_bf16_to_double(w[i]));
    }
}

int ref_linear(const kvb_bf16 *x, const kvb_bf16 *W, const kvb_bf16 *add, int rows, int in, int out, kvb_bf16 *y)
{
    double *xd = kvb_xalloc((size_t)in, sizeof(double), "ref_linear input row");
    if (!xd) return KVB_ENOMEM;
    for (int r = 0; r < rows; r++) {
        for (int i = 0; i < in; i++) xd[i] = kvb_bf16_to_double(x[(int64_t)r * in + i]);
#pragma omp parallel for schedule(static)
        for (int o = 0; o < out; o++) {
            const kvb_bf16 *wo = W + (int64_t)o * in;
            double acc = add ? kvb_bf16_to_double(add[(int64_t)r * out + o]) : 0.0;
            for (int i = 0; i < in; i++) acc += xd[i] * kvb_bf16_to_double(wo[i]);
            y[(int64_t)r * out + o] = kvb_double_to_bf16(acc);
        }
    }
    kvb_xfree(xd);
    return KVB_OK;
}

/* rotate-half of one head's D values at table row cs */
static void rope_head(const kvb_bf16 *x, const kvb_bf16 *cs, int D, kvb_bf16 *y)
{
    for (int i = 0; i < D / 2; i++) {
        const double c = kvb_bf16_to_double(cs[i]), s = kvb_bf16_to_double(cs[D / 2 + i]);
        const double a = kvb_bf16_to_double(x[i]), b = kvb_bf16_to_double(x[i + D / 2]);
        y[i] = kvb_double_to_bf16(a * c - b * s);
        y[i + D / 2] = kvb_double_to_bf16(b * c + a * s);
    }
}

void ref_rope_split(const kvb_bf16 *qkv, const kvb_bf16 *cos_sin, const int32_t *pos, int B, int Hq, int Hkv, int D,
                    kvb_bf16 *q, kvb_bf16 *knew, kvb_bf16 *vnew)
{
    const int64_t row = (int64_t)(Hq + 2 * Hkv) * D;
    for (int b = 0; b < B; b++) {
        const kvb_bf16 *src = qkv + b * row, *cs = cos_sin + (int64_t)pos[b] * D;
        for (int h = 0; h < Hq; h++) rope_head(src + (int64_t)h * D, cs, D, q + ((int64_t)b * Hq + h) * D);
        for (int h = 0; h < Hkv; h++) {
            rope_head(src + (int64_t)(Hq + h) * D, cs, D, knew + ((int64_t)b * Hkv + h) * D);
            memcpy(vnew + ((int64_t)b * Hkv + h) * D, src + (int64_t)(Hq + Hkv + h) * D, sizeof(kvb_bf16) * (size_t)D);
        }
    }
}

void ref_silu_mul(const kvb_bf16 *gate_up, int rows, int ffn, kvb_bf16 *y)
{
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < ffn; i++) {
            const double g = kvb_bf16_to_double(gate_up[(int64_t)r * 2 * ffn + i]);
            const double u = kvb_bf16_to_double(gate_up[(int64_t)r * 2 * ffn + ffn + i]);
            y[(int64_t)r * ffn + i] = kvb_double_to_bf16(g / (1.0 + exp(-g)) * u);
        }
}

int block_check(const block_preset *m, int B, int64_t L, int max_pos, const int32_t *pos, const char *who)
{
    if (!m) return kvb_fail(KVB_EINVAL, "%s: model is not one of {%s}", who, BLOCK_PRESETS);
    const decode_layout d = {B, m->Hq, m->Hkv, m->D, L};
    int rc = decode_layout_check(&d, who);
    if (rc) return rc;
    if (m->hidden % 8 || m->hidden < 8 || m->hidden > 65536)
        return kvb_fail(KVB_EINVAL, "%s: hidden=%d is not a multiple of 8 in [8, 65536]", who, m->hidden);
    if (m->ffn % 8 || m->ffn < 8 || m->ffn > 65536)
        return kvb_fail(KVB_EINVAL, "%s: ffn=%d is not a multiple of 8 in [8, 65536]", who, m->ffn);
    KVB_CHECK_RANGE(who, "max_pos", max_pos, 1, 1 << 30);
    for (int b = 0; pos && b < B; b++) {
        const int64_t hi = (L < max_pos ? L : max_pos) - 1;
        if (pos[b] < 0 || pos[b] > hi)
            return kvb_fail(KVB_EINVAL, "%s: pos[%d]=%d out of range [0, %lld]: the new token's row lies inside the cache "
                            "(L = %lld) and the RoPE table (max_pos = %d)", who, b, pos[b], (long long)hi, (long long)L,
                            max_pos);
    }
    return KVB_OK;
}

int ref_block_pre(const kvb_bf16 *x, const block_weights *w, const block_preset *m, int B, const int32_t *pos,
                  const kvb_bf16 *cos_sin, int max_pos, kvb_bf16 *q, kvb_bf16 *knew, kvb_bf16 *vnew)
{
    int rc = block_check(m, B, max_pos, max_pos, pos, "ref_block_pre");
    if (rc) return rc;
    const int H = m->hidden, nqkv = (m->Hq + 2 * m->Hkv) * m->D;
    kvb_bf16 *z = kvb_xalloc((size_t)B * H, sizeof(kvb_bf16), "ref_block_pre normed rows");
    kvb_bf16 *qkv = z ? kvb_xalloc((size_t)B * nqkv, sizeof(kvb_bf16), "ref_block_pre qkv") : NULL;
    if (!qkv) {
        kvb_xfree(z);
        return KVB_ENOMEM;
    }
    ref_rmsnorm(x, w->norm1, B, H, m->eps, z);
    for (int b = 0; b < B && !rc; b++) rc = ref_linear(z + (int64_t)b * H, w->qkv, NULL, 1, H, nqkv, qkv + (int64_t)b * nqkv);
    if (!rc) ref_rope_split(qkv, cos_sin, pos, B, m->Hq, m->Hkv, m->D, q, knew, vnew);
    kvb_xfree(z), kvb_xfree(qkv);
    return rc;
}

int ref_block_post(const kvb_bf16 *x, const block_weights *w, const block_preset *m, int B, const kvb_bf16 *att,
                   const uint8_t *seqs, kvb_bf16 *y)
{
    const int H = m->hidden, F = m->ffn, qd = m->Hq * m->D;
    /* h [H], z [H], gate_up [2F], act [F] of one sequence */
    kvb_bf16 *h = kvb_xalloc(2 * (size_t)H + 3 * (size_t)F, sizeof(kvb_bf16), "ref_block_post rows");
    if (!h) return KVB_ENOMEM;
    kvb_bf16 *z = h + H, *gu = z + H, *act = gu + 2 * (size_t)F;
    int rc = KVB_OK;
    for (int b = 0; b < B && !rc; b++) {
        if (seqs && !seqs[b]) continue;
        const int64_t xb = (int64_t)b * H;
        if ((rc = ref_linear(att + (int64_t)b * qd, w->o, x + xb, 1, qd, H, h))) break;
        ref_rmsnorm(h, w->norm2, 1, H, m->eps, z);
        if ((rc = ref_linear(z, w->gate_up, NULL, 1, H, 2 * F, gu))) break;
        ref_silu_mul(gu, 1, F, act);
        rc = ref_linear(act, w->down, h, 1, F, H, y + xb);
    }
    kvb_xfree(h);
    return rc;
}

int ref_decode_block_dense(const kvb_bf16 *x, const block_weights *w, const block_preset *m, int B, const int32_t *pos,
                           kvb_bf16 *K, kvb_bf16 *V, int64_t L, const kvb_bf16 *cos_sin, int max_pos,
                           const uint8_t *seqs, kvb_bf16 *y)
{
    int rc = block_check(m, B, L, max_pos, pos, "ref_decode_block_dense");
    if (rc) return rc;
    const int Hq = m->Hq, Hkv = m->Hkv, D = m->D;
    const decode_layout d = {B, Hq, Hkv, D, L};
    const char *what = "ref_decode_block_dense activations";
    kvb_bf16 *q = kvb_xalloc((size_t)B * Hq * D, sizeof(kvb_bf16), what), *kn = kvb_xalloc((size_t)B * Hkv * D, sizeof(kvb_bf16), what),
             *vn = kvb_xalloc((size_t)B * Hkv * D, sizeof(kvb_bf16), what), *att = kvb_xalloc((size_t)B * Hq * D, sizeof(kvb_bf16), what);
    int32_t *len = kvb_xalloc((size_t)B, sizeof(int32_t), what);
    uint8_t *slices = seqs ? kvb_xalloc((size_t)B * Hkv, 1, what) : NULL;
    if (!q || !kn || !vn || !att || !len || (seqs && !slices)) rc = KVB_ENOMEM;
    for (int b = 0; !rc && b < B; b++) len[b] = pos[b] + 1;
    for (int i = 0; !rc && slices && i < B * Hkv; i++) slices[i] = seqs[i / Hkv];
    if (!rc && !(rc = ref_block_pre(x, w, m, B, pos, cos_sin, max_pos, q, kn, vn)) && !(rc = ref_kv_append(kn, vn, pos, K, V, &d)) &&
        !(rc = ref_decode_attn(q, K, V, len, att, &d, slices)))
        rc = ref_block_post(x, w, m, B, att, seqs, y);
    kvb_xfree(q), kvb_xfree(kn), kvb_xfree(vn), kvb_xfree(att), kvb_xfree(len), kvb_xfree(slices);
    return rc;
}
