#!/usr/bin/env python3
"""emulate_int2_v2.py: a lane-level NumPy emulation of int2_decode_attn_v2 (kernels/int2/int2_decode_v2.cu)
for one KV head (tiles of 256 quantized tokens and the bf16 residual), written to check the kernel's index math
without a GPU: shared-memory layouts (cp.async placement, the in-place metadata transposition and its
swizzles), the PRMT/LOP3 code extraction into fp16 subnormals (or 1024 + c), the MMA fragment layouts
(attn_device.h), movmatrix, the hi/lo split of q s_g, the value zeros' MMA, the deposit. It mirrors the
CUDA code statement by statement and compares the output with float64 attention over the dequantized
cache. Not a model of timing, races or the tensor cores' accumulation order.

    python3 tests/emulate_int2_v2.py            # a set of shapes; prints max error per shape
"""
import sys

import numpy as np

TILE, WARPS = 256, 4
LOG2E = 1.4426950408889634


def f16_bits(x):
    return np.asarray(x, dtype=np.float16).view(np.uint16).astype(np.uint32)


def bits_f16(b):
    return np.uint16(b & 0xFFFF).view(np.float16).astype(np.float64)


def bits_bf16(b):
    return float(np.uint32((int(b) & 0xFFFF) << 16).view(np.float32))


def bf16_round(x):  # float -> bf16 value (round to nearest even), as float
    u = np.float32(x).view(np.uint32)
    u = (int(u) + 0x7FFF + ((int(u) >> 16) & 1)) & 0xFFFF0000
    return float(np.uint32(u).view(np.float32))


def bf16_bits(x):
    return (int(np.float32(bf16_round(x)).view(np.uint32)) >> 16) & 0xFFFF


def pack(lo, hi):
    return (int(lo) & 0xFFFF) | ((int(hi) & 0xFFFF) << 16)


def half_lo(w):
    return w & 0xFFFF


def half_hi(w):
    return (w >> 16) & 0xFFFF


def prmt(x, y, s):
    b = [(x >> (8 * i)) & 0xFF for i in range(4)] + [(y >> (8 * i)) & 0xFF for i in range(4)]
    r = 0
    for i in range(4):
        r |= b[(s >> (4 * i)) & 7] << (8 * i)
    return r


def f16v(w):  # (lo, hi) values of a 32-bit pair of fp16
    return bits_f16(half_lo(w)), bits_f16(half_hi(w))


def f16pair(a, b):
    return pack(f16_bits(a), f16_bits(b))


def hmul2(a, b):
    a0, a1 = f16v(a)
    b0, b1 = f16v(b)
    return f16pair(np.float16(a0 * b0), np.float16(a1 * b1))


def hfms2(a, b, c):  # a*b - c, one rounding
    a0, a1 = f16v(a)
    b0, b1 = f16v(b)
    c0, c1 = f16v(c)
    return f16pair(np.float16(a0 * b0 - c0), np.float16(a1 * b1 - c1))


def hsub2(a, b):
    a0, a1 = f16v(a)
    b0, b1 = f16v(b)
    return f16pair(np.float16(a0 - b0), np.float16(a1 - b1))


# ---- warp-level collectives over 32 lanes (lists indexed by lane) ----
def mma(C, A, B, conv):
    """C[lane] = [c0..c3] += A . B; A[lane] = [a0..a3], B[lane] = [b0, b1] (32-bit registers of 16-bit pairs)."""
    Am = np.zeros((16, 16))
    Bm = np.zeros((16, 8))
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        a = A[lane]
        for (r, k0), w in zip([(g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8), (g + 8, 2 * t + 8)], a):
            Am[r, k0] = conv(half_lo(w))
            Am[r, k0 + 1] = conv(half_hi(w))
        b = B[lane]
        for k0, w in zip([2 * t, 2 * t + 8], b):
            Bm[k0, g] = conv(half_lo(w))
            Bm[k0 + 1, g] = conv(half_hi(w))
    P = Am @ Bm
    out = []
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        c = C[lane]
        out.append([c[0] + P[g, 2 * t], c[1] + P[g, 2 * t + 1], c[2] + P[g + 8, 2 * t], c[3] + P[g + 8, 2 * t + 1]])
    return out


def movmatrix(X):
    M = np.zeros((8, 8), dtype=np.int64)
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        M[g, 2 * t] = half_lo(X[lane])
        M[g, 2 * t + 1] = half_hi(X[lane])
    out = []
    for lane in range(32):
        g, t = lane >> 2, lane & 3
        out.append(pack(M[2 * t, g], M[2 * t + 1, g]))
    return out


def shfl(vals, src):
    return [vals[src[l]] for l in range(32)]


# ---- the cache ----
def quantize_group(x):
    mn, mx = float(np.min(x)), float(np.max(x))
    s = np.float16((np.float32(mx) - np.float32(mn)) / np.float32(3.0))
    z = np.float16(mn)
    sf, zf = np.float32(s), np.float32(z)
    if sf == 0:
        c = np.zeros(len(x), dtype=np.int64)
    else:
        c = np.clip(np.rint((np.float32(x) - zf) / sf), 0, 3).astype(np.int64)
    return c, s, z


class Head:
    """One (b, kv head): K, V sources, the packed cache (T quantized, R residual), q."""

    def __init__(self, D, GS, G, T, R, rng, dist="normal"):
        self.D, self.GS, self.G, self.T, self.R = D, GS, G, T, R
        self.Tcap = (T + 255) // 256 * 256 if T else 256
        n = T + R
        K = rng.standard_normal((n, D))
        V = rng.standard_normal((n, D))
        if dist in ("outlier", "spiky"):
            K[:, ::8] = 8 * K[:, ::8] + 4
            V[::16, :] *= 6
        if dist == "spiky":
            K[rng.random((n, D)) < 1 / 512] *= 16
            V[rng.random((n, D)) < 1 / 512] *= 16
        K = np.vectorize(bf16_round)(K)
        V = np.vectorize(bf16_round)(V)
        q = np.vectorize(bf16_round)(rng.standard_normal((G, D)) * (3 if dist == "peaked" else 1))
        self.q = q
        Tc = self.Tcap
        # codes as integers, metadata as fp16 (cache past T: NaN metadata, all-ones codes, as the harness does)
        self.kc = np.full((D, Tc), 3, dtype=np.int64)
        self.ks = np.full((D, Tc // GS), np.nan, dtype=np.float16)
        self.kz = np.full((D, Tc // GS), np.nan, dtype=np.float16)
        self.vc = np.full((Tc, D), 3, dtype=np.int64)
        self.vs = np.full((Tc, D // GS), np.nan, dtype=np.float16)
        self.vz = np.full((Tc, D // GS), np.nan, dtype=np.float16)
        for d in range(D):
            for g0 in range(0, T, GS):
                c, s, z = quantize_group(K[g0:g0 + GS, d])
                self.kc[d, g0:g0 + GS], self.ks[d, g0 // GS], self.kz[d, g0 // GS] = c, s, z
        for tk in range(T):
            for g0 in range(0, D, GS):
                c, s, z = quantize_group(V[tk, g0:g0 + GS])
                self.vc[tk, g0:g0 + GS], self.vs[tk, g0 // GS], self.vz[tk, g0 // GS] = c, s, z
        self.Kr, self.Vr = K[T:], V[T:]
        # packed words
        self.Kq = np.zeros((D, Tc // 16), dtype=np.int64)
        for d in range(D):
            for w in range(Tc // 16):
                self.Kq[d, w] = sum(int(self.kc[d, 16 * w + i]) << (2 * i) for i in range(16))
        self.Vq = np.zeros((Tc, D // 16), dtype=np.int64)
        for tk in range(Tc):
            for w in range(D // 16):
                self.Vq[tk, w] = sum(int(self.vc[tk, 16 * w + i]) << (2 * i) for i in range(16))

    def reference(self):
        D, GS, T = self.D, self.GS, self.T
        kd = self.kc[:, :T] * np.repeat(self.ks[:, :T // GS].astype(np.float64), GS, axis=1) + np.repeat(
            self.kz[:, :T // GS].astype(np.float64), GS, axis=1)
        vd = self.vc[:T] * np.repeat(self.vs[:T].astype(np.float64), GS, axis=1) + np.repeat(
            self.vz[:T].astype(np.float64), GS, axis=1)
        Kall = np.concatenate([kd.T, self.Kr], axis=0)
        Vall = np.concatenate([vd, self.Vr], axis=0)
        s = self.q @ Kall.T / np.sqrt(D)
        p = np.exp(s - s.max(axis=1, keepdims=True))
        return (p @ Vall) / p.sum(axis=1, keepdims=True), np.abs(s).max()


# ---- the kernel ----
class Smem:
    def __init__(self, n):
        self.b = bytearray(n)

    def put(self, off, data: bytes):
        self.b[off:off + len(data)] = data

    def u32(self, off):
        return int.from_bytes(self.b[off:off + 4], "little")

    def put32(self, off, v):
        self.b[off:off + 4] = int(v & 0xFFFFFFFF).to_bytes(4, "little")


def u16bytes(arr):
    return np.asarray(arr, dtype=np.float16).tobytes()


def u32bytes(words):
    return b"".join(int(w & 0xFFFFFFFF).to_bytes(4, "little") for w in words)


class Lay:
    def __init__(self, D, GS):
        self.NGK, self.NGV, self.VW = TILE // GS, D // GS, D // 16
        self.NGS = 1 if GS >= 64 else 64 // GS
        self.KQ = 0
        self.KS = self.KQ + D * 64
        self.KZ = self.KS + self.NGK * D * 2
        self.VQ = self.KZ + self.NGK * D * 2
        self.VS = self.VQ + TILE * self.VW * 4
        self.VZ = self.VS + self.NGV * TILE * 2
        self.BYTES = self.VZ + self.NGV * TILE * 2
        self.PG = max(2, self.NGK * D // 256)
        self.KITEMS = (D // 2) * (self.NGK // self.PG)
        assert self.KITEMS <= 128


def kpos(c):
    return 32 * (c >> 5) + 8 * ((c >> 2) & 3) + 4 * ((c >> 4) & 1) + (c & 3)


def vpos(tau):
    return 64 * (tau >> 6) + 32 * ((tau >> 5) & 1) + 8 * ((tau >> 2) & 3) + 4 * ((tau >> 4) & 1) + (((tau & 1) << 1) | ((tau >> 1) & 1))


def rho(tau):
    return (tau & ~15) | ((tau & 3) << 2) | ((tau >> 2) & 3)


def load_tile(h, L, sm, tile):
    D, GS, T, Tc = h.D, h.GS, h.T, h.Tcap
    tok0 = tile * TILE
    own = {}  # tid -> list of (region, byte offset, nbytes) it copied (for the pass)
    for i in range(D * 4):
        d, ch = i >> 2, i & 3
        sm.put(L.KQ + d * 64 + 16 * (ch ^ ((d >> 2) & 3)), u32bytes(h.Kq[d, tok0 // 16 + 4 * ch: tok0 // 16 + 4 * ch + 4]))
    for tid in range(128):
        if tid < L.KITEMS:
            npp = L.NGK // L.PG
            pair, part = tid // npp, tid % npp
            c0 = 2 * pair
            for a, src in ((0, h.ks), (1, h.kz)):
                dst = (L.KZ if a else L.KS) + (c0 * L.NGK + part * L.PG) * 2
                g0 = tok0 // GS + part * L.PG
                sm.put(dst, u16bytes(src[c0, g0:g0 + L.PG]))
                sm.put(dst + L.NGK * 2, u16bytes(src[c0 + 1, g0:g0 + L.PG]))
    cpr = D // 64
    for i in range(TILE * cpr):
        tau, ch = i // cpr, i % cpr
        words = h.Vq[tok0 + tau, 4 * ch:4 * ch + 4] if tok0 + tau < T else [0, 0, 0, 0]
        sm.put(L.VQ + rho(tau) * (D // 4) + 16 * ch, u32bytes(words))
    for a, src in ((0, h.vs), (1, h.vz)):
        dst = L.VZ if a else L.VS
        for tid in range(128):
            if L.NGV >= 2:
                t0 = 4 * (tid >> 1) + (tid & 1)
                for tk in (t0, t0 + 2):
                    row = src[tok0 + tk] if tok0 + tk < T else np.zeros(L.NGV, dtype=np.float16)
                    sm.put(dst + tk * 2 * L.NGV, u16bytes(row))
            elif tid < TILE // 4:
                rows = [src[tok0 + 4 * tid + e] if tok0 + 4 * tid < T else np.zeros(1, dtype=np.float16) for e in range(4)]
                sm.put(dst + 8 * tid, u16bytes(np.concatenate(rows)))


def pass_transpose(h, L, sm):
    D = h.D
    regs = {}
    for tid in range(128):  # pass_read
        r = {"k": [[], []], "v": [[], []]}
        if tid < L.KITEMS:
            npp = L.NGK // L.PG
            pair, part = tid // npp, tid % npp
            c0 = 2 * pair
            for a in range(2):
                x = (L.KZ if a else L.KS) + (c0 * L.NGK + part * L.PG) * 2
                for k in range(L.PG // 2):
                    w0, w1 = sm.u32(x + 4 * k), sm.u32(x + L.NGK * 2 + 4 * k)
                    r["k"][a] += [prmt(w0, w1, 0x5410), prmt(w0, w1, 0x7632)]
        for a in range(2):
            x = L.VZ if a else L.VS
            if L.NGV >= 2:
                t0 = 4 * (tid >> 1) + (tid & 1)
                for k in range(L.NGV // 2):
                    w0, w1 = sm.u32(x + t0 * 2 * L.NGV + 4 * k), sm.u32(x + (t0 + 2) * 2 * L.NGV + 4 * k)
                    r["v"][a] += [prmt(w0, w1, 0x5410), prmt(w0, w1, 0x7632)]
            elif tid < TILE // 4:
                w0, w1 = sm.u32(x + 8 * tid), sm.u32(x + 8 * tid + 4)
                r["v"][a] = [prmt(w0, w1, 0x5410), prmt(w0, w1, 0x7632)]
        regs[tid] = r
    for tid in range(128):  # pass_write (after a barrier)
        r = regs[tid]
        if tid < L.KITEMS:
            npp = L.NGK // L.PG
            pair, part = tid // npp, tid % npp
            c0 = 2 * pair
            for a in range(2):
                for k in range(L.PG):
                    g = part * L.PG + k
                    sm.put32((L.KZ if a else L.KS) + 2 * (g * D + (kpos(c0) ^ (32 * (g & 1)))), r["k"][a][k])
        for a in range(2):
            x = L.VZ if a else L.VS
            if L.NGV >= 2:
                t0 = 4 * (tid >> 1) + (tid & 1)
                for g in range(L.NGV):
                    sm.put32(x + 2 * (g * TILE + (vpos(t0) ^ (32 * (g & 1)))), r["v"][a][g])
            elif tid < TILE // 4:
                sm.put32(x + 2 * (0 * TILE + vpos(4 * tid)), r["v"][a][0])
                sm.put32(x + 2 * (0 * TILE + vpos(4 * tid + 1)), r["v"][a][1])


def consts(lane, magic):
    g = lane >> 2
    b, sh = g >> 1, 4 * (g & 1)
    sel = b | (b << 4) | ((b + 4) << 8) | ((b + 4) << 12)
    m0, m1 = 0x00030003 << sh, 0x000C000C << sh
    base = 0 if magic else 24
    return dict(sel=sel, m0=m0, m1=m1, rf=[2.0 ** (base - sh), 2.0 ** (base - sh - 2)])


def code2(m, mask, magic):
    if magic:
        x = (m & mask) | 0x64006400
        return hsub2(x, 0x64006400)
    return m & mask


def word_of(v, i):
    return v[i]


class State:
    def __init__(self, MT):
        self.m = [[-np.inf, -np.inf] for _ in range(32)]
        self.l = [[0.0, 0.0] for _ in range(32)]
        self.o = [[[0.0] * 4 for _ in range(MT)] for _ in range(32)]
        self.z = [[0.0] * 4 for _ in range(32)]


def softmax(st, s, f16, add_sum=True):
    """s[lane][i][4] -> pb[lane][i][2] (mirrors v2::softmax; add_sum = its SUM)."""
    NT = len(s[0])
    mx = [[max(max(s[l][i][0], s[l][i][2]) for i in range(NT)), max(max(s[l][i][1], s[l][i][3]) for i in range(NT))] for l in range(32)]
    for off in (4, 8, 16):
        mx = [[max(mx[l][0], mx[l ^ off][0]), max(mx[l][1], mx[l ^ off][1])] for l in range(32)]
    pre = []
    for l in range(32):
        n = [max(st.m[l][c], mx[l][c]) for c in range(2)]
        base = [0.0 if n[c] == -np.inf else n[c] for c in range(2)]
        a = [2.0 ** (st.m[l][c] - base[c]) for c in range(2)]
        st.m[l] = n
        st.l[l] = [st.l[l][c] * a[c] for c in range(2)]
        for row in st.o[l]:
            row[0] *= a[0]; row[1] *= a[1]; row[2] *= a[0]; row[3] *= a[1]
        zz = st.z[l]
        zz[0] *= a[0]; zz[1] *= a[1]; zz[2] *= a[0]; zz[3] *= a[1]
        pre.append(base)
    pb = [[[0, 0] for _ in range(NT)] for _ in range(32)]
    for i in range(NT):
        x0, x1 = [], []
        for l in range(32):
            b0, b1 = pre[l]
            p = [2.0 ** (s[l][i][0] - b0), 2.0 ** (s[l][i][1] - b1), 2.0 ** (s[l][i][2] - b0), 2.0 ** (s[l][i][3] - b1)]
            if add_sum:
                st.l[l][0] += p[0] + p[2]
                st.l[l][1] += p[1] + p[3]
            if f16:
                x0.append(f16pair(p[0], p[1])); x1.append(f16pair(p[2], p[3]))
            else:
                x0.append(pack(bf16_bits(p[0]), bf16_bits(p[1]))); x1.append(pack(bf16_bits(p[2]), bf16_bits(p[3])))
        y0, y1 = movmatrix(x0), movmatrix(x1)
        for l in range(32):
            pb[l][i] = [y0[l], y1[l]]
    return pb


def quant_step(h, L, sm, st, qf, w, tok, magic, lo, uf_all):
    D, GS, T = h.D, h.GS, h.T
    MT = D // 16
    K = [consts(l, magic) for l in range(32)]
    acc = [[[0.0] * 4 for _ in range(4)] for _ in range(32)]
    bacc = [[0.0] * 4 for _ in range(32)]
    gk0 = (64 * w) // GS
    f16 = lambda b: bits_f16(b)
    for j in range(MT):
        wv, A_bias = {}, []
        qj = [qf[j][l] for l in range(32)]
        for l in range(32):
            g, t = l >> 2, l & 3
            kq = L.KQ + (4 * t) * 64 + 16 * (w ^ t)
            wv[l] = [[sm.u32(kq + j * 1024 + e * 64 + 4 * i) for i in range(4)] for e in range(4)]
            jo = 2 * (32 * ((j >> 1) & ~1) + 4 * (j & 1))
            zk = (0, 0)
            if g < L.NGS:
                pz = (gk0 + g) & 1
                b = L.KZ + 2 * ((gk0 + g) * D + 8 * t)
                kz_b = [b + 64 * pz, b + 64 * (1 - pz)]
                off = kz_b[(j >> 1) & 1] + jo
                zk = (sm.u32(off), sm.u32(off + 4))
            A_bias.append([zk[0], 0, zk[1], 0])
        bacc = mma(bacc, A_bias, qj, f16)
        bh, bl = [None] * 32, [None] * 32
        for i in range(4):
            if i == 0 or (GS < 64 and (16 * i) % GS == 0):
                for l in range(32):
                    g, t = l >> 2, l & 3
                    jo = 2 * (32 * ((j >> 1) & ~1) + 4 * (j & 1))
                    r = 0 if GS >= 64 else (16 * i) // GS
                    pk = (gk0 & 1) if GS >= 64 else 0
                    par = ((j >> 1) & 1) ^ ((pk if GS >= 64 else r) & 1)
                    off = L.KS + 2 * (gk0 * D + 8 * t) + 2 * r * D + 64 * par + jo
                    sk = (sm.u32(off), sm.u32(off + 4))
                    bh[l] = [hmul2(qj[l][0], sk[0]), hmul2(qj[l][1], sk[1])]
                    bl[l] = [hfms2(qj[l][0], sk[0], bh[l][0]), hfms2(qj[l][1], sk[1], bh[l][1])]
            A = []
            for l in range(32):
                k = K[l]
                m01 = prmt(wv[l][0][i], wv[l][1][i], k["sel"])
                m23 = prmt(wv[l][2][i], wv[l][3][i], k["sel"])
                A.append([code2(m01, k["m0"], magic), code2(m01, k["m1"], magic), code2(m23, k["m0"], magic), code2(m23, k["m1"], magic)])
            res = mma([acc[l][i] for l in range(32)], A, bh, f16)
            if lo:
                res = mma(res, A, bl, f16)
            for l in range(32):
                acc[l][i] = res[l]
    s = [[None] * 4 for _ in range(32)]
    for l in range(32):
        g, t = l >> 2, l & 3
        uf = uf_all[l]
        k = K[l]
        bz = []
        for r in range(L.NGS):
            src = 4 * r + t
            bz.append([bacc[src][0] * uf[0], bacc[src][1] * uf[1]])
        for i in range(4):
            r = 0 if GS >= 64 else (16 * i) // GS
            v = tok + 16 * i < T
            a = acc[l][i]
            s[l][i] = [a[0] * k["rf"][0] * uf[0] + bz[r][0], a[1] * k["rf"][0] * uf[1] + bz[r][1],
                       a[2] * k["rf"][1] * uf[0] + bz[r][0], a[3] * k["rf"][1] * uf[1] + bz[r][1]] if v else [-np.inf] * 4
    pb = softmax(st, s, True, add_sum=False)
    zs = [[0.0] * 4 for _ in range(32)]  # this step's Z (and row 8: the sum of p), added to the state after
    for i in range(4):
        Az = []
        for l in range(32):
            g, t = l >> 2, l & 3
            zv = (0, 0)
            if g < L.NGV:
                b = L.VZ + 2 * (g * TILE + 64 * w + 8 * t)
                vz_b = [b + 64 * (g & 1), b + 64 * (1 - (g & 1))]
                off = vz_b[i >> 1] + 8 * (i & 1)
                zv = (sm.u32(off), sm.u32(off + 4))
            one8 = 0x3C003C00 if g == 0 else 0
            Az.append([zv[0], one8, zv[1], one8])
        zs = mma(zs, Az, [pb[l][i] for l in range(32)], f16)
    for l in range(32):
        st.z[l] = [st.z[l][e] + zs[l][e] for e in range(4)]
    for ch in range(D // 64):
        os_ = [[[0.0] * 4 for _ in range(4)] for _ in range(32)]  # this step's O^T of m-tiles 4ch..4ch+3
        for i in range(4):
            wvv = {}
            for l in range(32):
                t = l & 3
                vq = L.VQ + (64 * w + t) * (D // 4)
                wvv[l] = [[sm.u32(vq + (16 * i + 4 * b) * (D // 4) + 16 * ch + 4 * e) for e in range(4)] for b in range(4)]
            pp = [None] * 32
            for mm in range(4):
                mv = 4 * ch + mm
                gv = (16 * mv) // GS
                if mm == 0 or (16 * mv) % GS == 0:
                    for l in range(32):
                        t = l & 3
                        off = L.VS + 2 * (64 * w + 8 * t) + 2 * gv * TILE + 64 * ((i >> 1) ^ (gv & 1)) + 8 * (i & 1)
                        sv = (sm.u32(off), sm.u32(off + 4))
                        pp[l] = [hmul2(pb[l][i][0], sv[0]), hmul2(pb[l][i][1], sv[1])]
                A = []
                for l in range(32):
                    k = K[l]
                    m02 = prmt(wvv[l][0][mm], wvv[l][2][mm], k["sel"])
                    m13 = prmt(wvv[l][1][mm], wvv[l][3][mm], k["sel"])
                    A.append([code2(m02, k["m0"], magic), code2(m02, k["m1"], magic), code2(m13, k["m0"], magic), code2(m13, k["m1"], magic)])
                res = mma([os_[l][mm] for l in range(32)], A, pp, f16)
                for l in range(32):
                    os_[l][mm] = res[l]
        for l in range(32):
            for mm in range(4):
                st.o[l][4 * ch + mm] = [st.o[l][4 * ch + mm][e] + os_[l][mm][e] for e in range(4)]


def dense_step(h, st, s_idx, G, magic):
    D, R = h.D, h.R
    MT = D // 16
    nv = min(16, R - 16 * s_idx)
    tok0 = 16 * s_idx
    K = [consts(l, magic) for l in range(32)]
    Kr = lambda tk, c: h.Kr[tok0 + tk, c] if tk < nv else 0.0
    Vr = lambda tk, c: h.Vr[tok0 + tk, c] if tk < nv else 0.0
    bf = lambda b: bits_bf16(b)
    sacc = [[0.0] * 4 for _ in range(32)]
    for j in range(D // 16):  # the dense K mapping (attn_device.h): thread t channels t*D/4 + 4j + {0,1},{2,3}
        A, B = [], []
        for l in range(32):
            g, t = l >> 2, l & 3
            c = t * (D // 4) + 4 * j
            A.append([pack(bf16_bits(Kr(g, c)), bf16_bits(Kr(g, c + 1))), pack(bf16_bits(Kr(g + 8, c)), bf16_bits(Kr(g + 8, c + 1))),
                      pack(bf16_bits(Kr(g, c + 2)), bf16_bits(Kr(g, c + 3))), pack(bf16_bits(Kr(g + 8, c + 2)), bf16_bits(Kr(g + 8, c + 3)))])
            qq = h.q[g] if g < G else np.zeros(D)
            B.append([pack(bf16_bits(qq[c]), bf16_bits(qq[c + 1])), pack(bf16_bits(qq[c + 2]), bf16_bits(qq[c + 3]))])
        sacc = mma(sacc, A, B, bf)
    scale = LOG2E / np.sqrt(D)
    s = []
    for l in range(32):
        g = l >> 2
        a = sacc[l]
        s.append([[a[0] * scale if g < nv else -np.inf, a[1] * scale if g < nv else -np.inf,
                   a[2] * scale if g + 8 < nv else -np.inf, a[3] * scale if g + 8 < nv else -np.inf]])
    pb = softmax(st, s, False)
    for mv in range(MT):
        A = []
        for l in range(32):
            g, t = l >> 2, l & 3
            k = K[l]
            v = {}
            for q in range(4):
                tk = 2 * t + (q & 1) + 8 * (q >> 1)
                v[q] = pack(bf16_bits(Vr(tk, 16 * mv + 2 * g)), bf16_bits(Vr(tk, 16 * mv + 2 * g + 1)))
            f0, f1 = 1.0 / k["rf"][0], 1.0 / k["rf"][1]

            def sc(w, f):
                return pack(bf16_bits(bits_bf16(half_lo(w)) * f), bf16_bits(bits_bf16(half_hi(w)) * f))
            A.append([sc(prmt(v[0], v[1], 0x5410), f0), sc(prmt(v[0], v[1], 0x7632), f1),
                      sc(prmt(v[2], v[3], 0x5410), f0), sc(prmt(v[2], v[3], 0x7632), f1)])
        res = mma([st.o[l][mv] for l in range(32)], A, [pb[l][0] for l in range(32)], bf)
        for l in range(32):
            st.o[l][mv] = res[l]


def run(D, GS, G, T, R, magic=False, lo=True, seed=1, dist="normal"):
    rng = np.random.default_rng(seed)
    h = Head(D, GS, G, T, R, rng, dist)
    L = Lay(D, GS)
    MT = D // 16
    nr, nq = (R + 15) // 16, (T + 63) // 64
    # stage_q: per head, max |q| into [1, 2)
    f = np.zeros(8)
    u = np.zeros(8)
    for hh in range(G):
        mx = np.abs(h.q[hh]).max()
        E = int(np.frexp(mx)[1])
        f[hh], u[hh] = 2.0 ** (1 - E), 2.0 ** (E - 1)
    qf = [[None] * 32 for _ in range(MT)]
    for j in range(MT):
        for l in range(32):
            g, t = l >> 2, l & 3
            if g < G:
                r = h.q[g, 16 * j + 4 * t: 16 * j + 4 * t + 4] * f[g]
                qf[j][l] = [f16pair(r[0], r[1]), f16pair(r[2], r[3])]
            else:
                qf[j][l] = [0, 0]
    scale = LOG2E / np.sqrt(D)
    uf = [[scale * u[2 * (l & 3)] if 2 * (l & 3) < G else 0.0, scale * u[2 * (l & 3) + 1] if 2 * (l & 3) + 1 < G else 0.0] for l in range(32)]
    states = [State(MT) for _ in range(WARPS)]
    for s_idx in range(nr):  # residual steps: warp s % 4
        dense_step(h, states[s_idx % WARPS], s_idx, G, magic)
    if nq:
        for tile in range((nq - 1) // 4 + 1):
            sm = Smem(L.BYTES)
            load_tile(h, L, sm, tile)
            pass_transpose(h, L, sm)
            for w in range(WARPS):
                step = tile * 4 + w
                if step < nq:
                    quant_step(h, L, sm, states[w], qf, w, step * 64, magic, lo, uf)
    # deposit + block combine
    O = np.zeros((WARPS, 8, D))
    Mx = np.full((WARPS, 8), -np.inf)
    Ls = np.zeros((WARPS, 8))
    for w in range(WARPS):
        st = states[w]
        for l in range(32):
            g, t = l >> 2, l & 3
            k = consts(l, magic)
            Mx[w, 2 * t], Mx[w, 2 * t + 1] = st.m[l]
            Ls[w, 2 * t] += st.l[l][0] + (st.z[l][2] if g == 0 else 0.0)
            Ls[w, 2 * t + 1] += st.l[l][1] + (st.z[l][3] if g == 0 else 0.0)
            for mv in range(MT):
                c = 16 * mv + 2 * g
                O[w, 2 * t, c] = st.o[l][mv][0] * k["rf"][0]
                O[w, 2 * t + 1, c] = st.o[l][mv][1] * k["rf"][0]
                O[w, 2 * t, c + 1] = st.o[l][mv][2] * k["rf"][1]
                O[w, 2 * t + 1, c + 1] = st.o[l][mv][3] * k["rf"][1]
        for l in range(32):
            g, t = l >> 2, l & 3
            if g < D // GS:
                O[w, 2 * t, g * GS:(g + 1) * GS] += st.z[l][0]
                O[w, 2 * t + 1, g * GS:(g + 1) * GS] += st.z[l][1]
    out = np.zeros((G, D))
    for hh in range(G):
        M = Mx[:, hh].max()
        a = 2.0 ** (Mx[:, hh] - M)
        a[np.isnan(a)] = 0
        out[hh] = (a[:, None] * O[:, hh]).sum(0) / (a * Ls[:, hh]).sum()
    ref, smax = h.reference()
    out_bf = np.vectorize(bf16_round)(out)
    err = np.abs(out_bf - ref)
    tol = 1e-2 + 2e-2 * np.abs(ref)
    return (err / tol).max(), np.abs(out - ref).max(), smax


if __name__ == "__main__":
    shapes = [
        dict(D=128, GS=16, G=4, T=512, R=5),
        dict(D=128, GS=16, G=4, T=272, R=0),
        dict(D=128, GS=32, G=1, T=256, R=17),
        dict(D=128, GS=64, G=8, T=320, R=3),
        dict(D=128, GS=128, G=4, T=384, R=33),
        dict(D=64, GS=16, G=4, T=256, R=9),
        dict(D=64, GS=64, G=8, T=192, R=0),
        dict(D=64, GS=32, G=2, T=0, R=40),
        dict(D=128, GS=16, G=4, T=256, R=16, magic=True),
        dict(D=128, GS=16, G=4, T=256, R=16, lo=False),
        dict(D=64, GS=16, G=4, T=512, R=33, dist="spiky"),
        dict(D=64, GS=16, G=4, T=512, R=33, dist="spiky", lo=False),
    ]
    if len(sys.argv) > 1:
        shapes = shapes[:int(sys.argv[1])]
    worst = 0
    for sh in shapes:
        r, e, smax = run(**sh)
        worst = max(worst, r)
        print(f"{sh}: {100 * r:.1f}% of tolerance, max |err| {e:.3g}, max |score| {smax:.1f}", flush=True)
    print("worst", f"{100 * worst:.1f}%")
    sys.exit(0 if worst <= 1 else 1)
