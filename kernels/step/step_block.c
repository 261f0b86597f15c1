/* step_block.c: see step_block.h. */
#include "kernels/step/step_block.h"

#include <string.h>

static size_t al(size_t b) { return (b + 255) & ~(size_t)255; }

/* the scratch buffers' element counts, in carving order */
static void sizes(const block_preset *m, int B, int64_t n[9])
{
    const int64_t H = m->hidden, qd = (int64_t)m->Hq * m->D, kd = (int64_t)m->Hkv * m->D;
    const int64_t v[9] = {B * H, B * (qd + 2 * kd), B * qd, B * kd, B * kd, B * qd, B * H, B * 2 * (int64_t)m->ffn,
                          B * (int64_t)m->ffn};
    memcpy(n, v, sizeof v);
}

size_t block_scratch_bytes(const block_preset *m, int B)
{
    int64_t n[9];
    sizes(m, B, n);
    size_t total = 0;
    for (int i = 0; i < 9; i++) total += al(sizeof(kvb_bf16) * (size_t)n[i]);
    return total;
}

#define P ((block_step_plan *)ctx)
static int st_norm1(void *ctx, cudaStream_t s)
{
    return block_rmsnorm(P->buf.x, P->buf.w.norm1, P->B, P->m->hidden, P->m->eps, P->z, P->h, s);
}
static int st_qkv(void *ctx, cudaStream_t s)
{
    return block_linear(P->buf.cublas, P->z, P->buf.w.qkv, P->B, P->m->hidden, (P->m->Hq + 2 * P->m->Hkv) * P->m->D, 0,
                        P->qkv, s);
}
static int st_rope(void *ctx, cudaStream_t s)
{
    return block_rope_split(P->qkv, P->buf.cos_sin, P->buf.pos, P->buf.pos_host, P->max_pos, P->B, P->m->Hq, P->m->Hkv,
                            P->m->D, P->q, P->knew, P->vnew, s);
}
static int st_append(void *ctx, cudaStream_t s)
{
    return kv_append(P->knew, P->vnew, P->buf.pos, P->buf.pos_host, P->buf.K, P->buf.V, &P->d, s);
}
static int st_attend(void *ctx, cudaStream_t s)
{
    return decode_attn(P->q, P->buf.K, P->buf.V, P->buf.len, P->buf.len_host, P->att, &P->d, P->buf.attn_ws, s);
}
static int st_prefetch_o(void *ctx, cudaStream_t s) { return block_prefetch_l2(P->buf.w.o, P->o_prefetch_bytes, s); }
static int st_oproj(void *ctx, cudaStream_t s)
{
    return block_linear(P->buf.cublas, P->att, P->buf.w.o, P->B, P->m->Hq * P->m->D, P->m->hidden, 1, P->h, s);
}
static int st_norm2(void *ctx, cudaStream_t s)
{
    return block_rmsnorm(P->h, P->buf.w.norm2, P->B, P->m->hidden, P->m->eps, P->z, P->buf.y, s);
}
static int st_gate_up(void *ctx, cudaStream_t s)
{
    return block_linear(P->buf.cublas, P->z, P->buf.w.gate_up, P->B, P->m->hidden, 2 * P->m->ffn, 0, P->gu, s);
}
static int st_silu(void *ctx, cudaStream_t s) { return block_silu_mul(P->gu, P->B, P->m->ffn, P->act, s); }
static int st_down(void *ctx, cudaStream_t s)
{
    return block_linear(P->buf.cublas, P->act, P->buf.w.down, P->B, P->m->ffn, P->m->hidden, 1, P->buf.y, s);
}
#undef P

int block_step_plan_make(block_step_plan *p, const char *name, const block_preset *m, int B, int64_t L, int max_pos,
                         const block_buffers *buf, cudaStream_t s0, cudaStream_t s1, int timing)
{
    memset(p, 0, sizeof *p);
    const char *who = "decode_step";
    if (buf->attn) L = max_pos; /* the method's own cache: pos only has to lie in the RoPE table */
    int rc = block_check(m, B, L, max_pos, buf->pos_host, who);
    if (rc) return rc;
    if (!buf->attn && !buf->len_host) return kvb_fail(KVB_EINVAL, "%s: len_host is NULL", who);
    for (int b = 0; !buf->attn && b < B; b++)
        if (buf->len_host[b] != buf->pos_host[b] + 1)
            return kvb_fail(KVB_EINVAL, "%s: len[%d]=%d out of range [%d, %d]: the step attends over pos + 1 tokens", who,
                            b, buf->len_host[b], buf->pos_host[b] + 1, buf->pos_host[b] + 1);
    p->m = m, p->B = B, p->max_pos = max_pos, p->buf = *buf;
    p->d = (decode_layout){B, m->Hq, m->Hkv, m->D, L};
    int64_t n[9];
    sizes(m, B, n);
    kvb_bf16 **dst[9] = {&p->z, &p->qkv, &p->q, &p->knew, &p->vnew, &p->att, &p->h, &p->gu, &p->act};
    char *at = buf->scratch;
    for (int i = 0; i < 9; i++) {
        *dst[i] = (kvb_bf16 *)at;
        at += al(sizeof(kvb_bf16) * (size_t)n[i]);
    }
    if (buf->q) p->q = buf->q;
    if (buf->knew) p->knew = buf->knew;
    if (buf->vnew) p->vnew = buf->vnew;
    if (buf->attn && buf->attn->side_first && s1 != s0) { /* captured, the nodes keep the priority (compose.c) */
        int least = 0, greatest = 0;
        cudaError_t e = cudaDeviceGetStreamPriorityRange(&least, &greatest);
        for (int k = 0; k < 2 && e == cudaSuccess; k++)
            e = cudaStreamCreateWithPriority(&p->side[k], cudaStreamNonBlocking, greatest);
        if (e != cudaSuccess)
            return kvb_fail(KVB_EDEVICE, "%s: the side streams of the greatest priority: %s", who, cudaGetErrorString(e));
        s1 = p->side[0];
    }
    kvb_step_init(&p->step, name, s0, s1);
    kvb_step_set_side2(&p->step, p->side[1]);
    typedef struct { const char *name; kvb_stage_fn fn; } stage;
    static const stage before[] = {{"rmsnorm1", st_norm1}, {"qkv_proj", st_qkv}, {"rope", st_rope}};
    static const stage dense[] = {{"kv_append", st_append}, {"attention", st_attend}};
    static const stage after[] = {{"o_proj", st_oproj},         {"rmsnorm2", st_norm2}, {"gate_up_proj", st_gate_up},
                                  {"silu_mul", st_silu},        {"down_proj", st_down}};
    int last_before = -1;
    for (size_t i = 0; i < sizeof before / sizeof before[0]; i++)
        if ((last_before = kvb_step_add(&p->step, before[i].name, 0, -1, before[i].fn, p)) < 0) return KVB_EINVAL;
    /* where the path asks: o_proj's weights into L2 on the side stream while the path runs, up to 3/4 of
     * the L2 */
    int dev = 0, l2 = 0;
    if (buf->attn && buf->attn->prefetch_o && cudaGetDevice(&dev) == cudaSuccess &&
        cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev) == cudaSuccess && l2 > 0) {
        const size_t o_bytes = sizeof(kvb_bf16) * (size_t)m->Hq * m->D * m->hidden, cap = (size_t)l2 / 4 * 3;
        p->o_prefetch_bytes = (o_bytes < cap ? o_bytes : cap) & ~(size_t)15;
        if (p->o_prefetch_bytes &&
            kvb_step_add(&p->step, "o_weights_to_l2", 1, last_before, st_prefetch_o, p) < 0)
            return KVB_EINVAL;
    }
    if (buf->attn) {
        if ((rc = buf->attn->add_stages(buf->attn->ctx, &p->step, p->q, p->knew, p->vnew, p->att))) return rc;
    } else {
        for (size_t i = 0; i < sizeof dense / sizeof dense[0]; i++)
            if (kvb_step_add(&p->step, dense[i].name, 0, -1, dense[i].fn, p) < 0) return KVB_EINVAL;
    }
    for (size_t i = 0; i < sizeof after / sizeof after[0]; i++)
        if (kvb_step_add(&p->step, after[i].name, 0, -1, after[i].fn, p) < 0) return KVB_EINVAL;
    return kvb_step_finalize(&p->step, timing);
}

int block_step_enqueue(block_step_plan *p) { return kvb_step_enqueue(&p->step); }

void block_step_plan_destroy(block_step_plan *p)
{
    kvb_step_destroy(&p->step);
    for (int k = 0; k < 2; k++) {
        if (p->side[k]) cudaStreamDestroy(p->side[k]);
        p->side[k] = NULL;
    }
}
