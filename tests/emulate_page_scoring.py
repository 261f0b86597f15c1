#!/usr/bin/env python3
"""emulate_page_scoring.py: a thread-level NumPy emulation of kernels/page_scoring/page_scoring.cu's index
math, written to check it without a GPU: the block plan (plan_blocks, WIDE / NARROW tiles), each thread's row
slot and 16-byte piece per step, its cp.async ring (a stage is read only after the copy of that step landed in
it and before the next copy overwrites it), the channel choice by the top-k rule and its ascending compaction,
the row slots' sum per tile, the per-block softmax partials and their merge in pass 2, Quest's q+ hi + q- lo,
and page_meta_build's piece / group / transposition layout and page_meta_append. It mirrors the CUDA code
statement by statement (fp32 where the kernel is fp32) and compares with a float64 evaluation of the formulas
of kernels/page_scoring/NOTES.md. Not a model of timing, races or the hardware's memory ordering.

    python3 tests/emulate_page_scoring.py      # a set of shapes; prints the largest error per shape
"""
import math
import sys

import numpy as np

THREADS, WARPS = 256, 8
WIDE, NARROW = 256, 128
HYB_STAGES, QUEST_STAGES = 8, 6
f32 = np.float32


def bf16_round(x):
    """float64 -> bf16 values (round to nearest even), returned as float32"""
    b = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    return (b.astype(np.uint32) << 16).view(np.float32)


def order_key(f):
    u = np.asarray(f, dtype=np.float32).view(np.uint32).copy()
    u[u == 0x80000000] = 0
    return np.where(u & 0x80000000, ~u, u | 0x80000000).astype(np.uint32)


def shape(tile):
    lanes = tile // 8
    sub = 32 // lanes
    return lanes, sub, WARPS * sub


def slot_and_page(tile):
    lanes, sub, _ = shape(tile)
    t = np.arange(THREADS)
    return (t // 32) * sub + (t % 32) // lanes, (t % lanes) * 8


def plan_blocks(resident, heads, tiles):
    want = max(1, min(resident // heads, tiles))
    per_block = (tiles + want - 1) // want
    return per_block, (tiles + per_block - 1) // per_block


def tile_choice(resident, heads, n_pages):
    return NARROW if heads * ((n_pages + WIDE - 1) // WIDE) < resident else WIDE


class Ring:
    """One thread's (all threads' at once) cp.async ring: stage k holds the step it was issued for."""

    def __init__(self, stages):
        self.stages, self.held = stages, {}

    def issue(self, s, data):
        self.held[s % self.stages] = (s, data)

    def read(self, s):
        step, data = self.held[s % self.stages]
        assert step == s, f"stage {s % self.stages} holds step {step}, read at step {s}"
        return data


def pieces(meta_rows, valid, page):
    """16-byte pieces: meta_rows [threads, cap] rows per thread; zero-filled where not valid"""
    out = np.zeros((THREADS, 8), dtype=np.float32)
    for t in np.nonzero(valid)[0]:
        out[t] = meta_rows[t][page[t]:page[t] + 8]
    return out


def block_sum_tile(acc_h, tile):
    """acc_h [threads, 8] -> the sum over row slots per page of the tile; thread t < tile gets page t"""
    _, _, slots = shape(tile)
    slot, first = slot_and_page(tile)
    red = np.zeros((slots, tile), dtype=np.float32)
    for t in range(THREADS):
        red[slot[t], first[t]:first[t] + 8] = acc_h[t]
    out = np.zeros(THREADS, dtype=np.float32)
    for w in range(slots):
        out[:tile] = (out[:tile] + red[w]).astype(np.float32)
    return out


def lse_merge(m, s, m2, s2):
    M = max(m, m2)
    if M == -math.inf:
        return m, s
    s = (f32(0) if m == -math.inf else f32(s * f32(math.exp(f32(m - M))))) + \
        (f32(0) if m2 == -math.inf else f32(s2 * f32(math.exp(f32(m2 - M)))))
    return M, f32(s)


def hybrid_emulated(q, kmin, kmax, B, Hkv, G, D, L, P, cap, r, resident):
    n = (L + P - 1) // P
    heads = B * Hkv
    tile = tile_choice(resident, heads, n)
    _, _, slots = shape(tile)
    tiles = (n + tile - 1) // tile
    per_block, blocks = plan_blocks(resident, heads, tiles)
    z = np.full((heads, G, cap), np.nan, dtype=np.float32)
    part = np.zeros((heads, blocks, G, 2), dtype=np.float32)
    channels = np.zeros((heads, r), dtype=np.int32)
    slot, first = slot_and_page(tile)
    for bh in range(heads):
        qg = q[bh * G:(bh + 1) * G].astype(np.float64)  # [G, D] bf16 values
        key = order_key(np.abs(qg).sum(0).astype(np.float32))  # h ascending in double, as the kernel
        use_max = qg.sum(0) > 0
        beaten = np.array([np.sum((key > key[c]) | ((key == key[c]) & (np.arange(D) < c))) for c in range(D)])
        chosen = np.nonzero(beaten < r)[0]  # the prefix count lists them ascending
        assert len(chosen) == r
        channels[bh] = chosen
        part_sum = np.abs(qg[:, chosen]).sum(1)
        all_sum = np.abs(qg).sum(1)
        inv_tau = np.where(part_sum > 0, 1.0 / np.sqrt(D * np.maximum(part_sum, 1e-300) / all_sum), 0).astype(np.float32)
        rows = [(kmax if use_max[c] else kmin)[bh, c] for c in chosen]
        qs = (qg[:, chosen].astype(np.float32) * inv_tau[:, None]).astype(np.float32)  # [G, r]
        for bx in range(blocks):
            t0 = bx * per_block
            count = min(t0 + per_block, tiles) - t0
            steps_per_tile = (r + slots - 1) // slots
            steps = count * steps_per_tile
            ring = Ring(HYB_STAGES)

            def issue(s):
                if s >= steps:
                    return
                tl = t0 + s // steps_per_tile
                i = (s % steps_per_tile) * slots + slot
                page = tl * tile + first
                valid = (i < r) & (page < n)
                ring.issue(s, pieces([rows[i[t]] if valid[t] else None for t in range(THREADS)], valid, page))

            for s in range(HYB_STAGES - 1):
                issue(s)
            run = np.tile(np.array([-math.inf, 0.0], dtype=np.float32), (G, THREADS, 1))
            acc = np.zeros((THREADS, G, 8), dtype=np.float32)
            for s in range(steps):
                group = s % steps_per_tile
                i = group * slots + slot
                if group == 0:
                    acc[:] = 0
                e = ring.read(s)
                for t in np.nonzero(i < r)[0]:
                    for h in range(G):
                        acc[t, h] = (acc[t, h] + qs[h, i[t]] * e[t]).astype(np.float32)  # fma: close enough
                issue(s + HYB_STAGES - 1)
                if group == steps_per_tile - 1:
                    j = (t0 + s // steps_per_tile) * tile + np.arange(THREADS)
                    mine = (np.arange(THREADS) < tile) & (j < n)
                    for h in range(G):
                        zz = block_sum_tile(acc[:, h], tile)
                        for t in np.nonzero(mine)[0]:
                            z[bh, h, j[t]] = zz[t]
                            nj = f32(min(P, L - j[t] * P))
                            run[h, t] = lse_merge(run[h, t, 0], run[h, t, 1], zz[t], nj)
            for h in range(G):
                m, ssum = -math.inf, f32(0)
                for t in range(THREADS):  # the warp butterflies and the slot merge: any order, same value
                    m, ssum = lse_merge(m, ssum, run[h, t, 0], run[h, t, 1])
                part[bh, bx, h] = (m, ssum)
    u = np.zeros((heads, n), dtype=np.float32)
    for bh in range(heads):
        lse = np.zeros(G, dtype=np.float32)
        for h in range(G):
            m, ssum = -math.inf, f32(0)
            for b in range(blocks):
                m, ssum = lse_merge(m, ssum, part[bh, b, h, 0], part[bh, b, h, 1])
            lse[h] = f32(m + f32(math.log(ssum)))
        for j in range(n):
            assert not np.isnan(z[bh, :, j]).any(), f"z of page {j} not written"
            u[bh, j] = sum(f32(math.exp(f32(z[bh, h, j] - lse[h]))) for h in range(G))
    return u, channels


def hybrid_formula(q, kmin, kmax, B, Hkv, G, D, L, P, r):
    """hybrid_score as kernels/page_scoring/NOTES.md defines it, in float64 (ties: np.lexsort by (-a, c))"""
    n = (L + P - 1) // P
    nj = np.array([min(P, L - j * P) for j in range(n)], dtype=np.float64)
    u = np.zeros((B * Hkv, n))
    ch = np.zeros((B * Hkv, r), dtype=np.int64)
    for bh in range(B * Hkv):
        qg = q[bh * G:(bh + 1) * G].astype(np.float64)
        a = np.abs(qg).sum(0).astype(np.float32).astype(np.float64)
        I = np.sort(np.lexsort((np.arange(D), -a))[:r])
        ch[bh] = I
        sg = qg[:, I].sum(0)
        E = np.where((sg > 0)[:, None], kmax[bh][I, :n], kmin[bh][I, :n]).astype(np.float64)
        for h in range(G):
            part, allq = np.abs(qg[h, I]).sum(), np.abs(qg[h]).sum()
            tau = math.sqrt(D * part / allq) if part > 0 else 0
            z = qg[h, I] @ E / tau if tau > 0 else np.zeros(n)
            m = z.max()
            lse = m + math.log((nj * np.exp(z - m)).sum())
            u[bh] += np.exp(z - lse)
    return u, ch


def quest_emulated(q, kmin, kmax, B, Hkv, G, D, L, P, cap, resident):
    n = (L + P - 1) // P
    heads = B * Hkv
    tile = tile_choice(resident, heads, n)
    _, _, slots = shape(tile)
    tiles = (n + tile - 1) // tile
    per_block, blocks = plan_blocks(resident, heads, tiles)
    slot, first = slot_and_page(tile)
    scores = np.full((heads, n), np.nan, dtype=np.float32)
    for bh in range(heads):
        qg = q[bh * G:(bh + 1) * G].astype(np.float32)
        qpos, qneg = np.maximum(qg, 0), np.minimum(qg, 0)
        for bx in range(blocks):
            t0 = bx * per_block
            count = min(t0 + per_block, tiles) - t0
            steps_per_tile = (D + slots - 1) // slots
            steps = count * steps_per_tile
            ring = Ring(QUEST_STAGES)

            def issue(s):
                if s >= steps:
                    return
                tl = t0 + s // steps_per_tile
                c = (s % steps_per_tile) * slots + slot
                page = tl * tile + first
                valid = (c < D) & (page < n)
                mx = pieces([kmax[bh, c[t]] if valid[t] else None for t in range(THREADS)], valid, page)
                mn = pieces([kmin[bh, c[t]] if valid[t] else None for t in range(THREADS)], valid, page)
                ring.issue(s, (mx, mn))

            for s in range(QUEST_STAGES - 1):
                issue(s)
            acc = np.zeros((THREADS, G, 8), dtype=np.float32)
            for s in range(steps):
                group = s % steps_per_tile
                c = group * slots + slot
                if group == 0:
                    acc[:] = 0
                mx, mn = ring.read(s)
                hi, lo = np.maximum(mx, mn), np.minimum(mx, mn)
                for t in np.nonzero(c < D)[0]:
                    for h in range(G):
                        acc[t, h] = (acc[t, h] + qpos[h, c[t]] * hi[t] + qneg[h, c[t]] * lo[t]).astype(np.float32)
                issue(s + QUEST_STAGES - 1)
                if group == steps_per_tile - 1:
                    j = (t0 + s // steps_per_tile) * tile + np.arange(THREADS)
                    best = np.full(THREADS, -np.inf, dtype=np.float32)
                    for h in range(G):
                        best = np.maximum(best, block_sum_tile(acc[:, h], tile))
                    for t in np.nonzero((np.arange(THREADS) < tile) & (j < n))[0]:
                        scores[bh, j[t]] = best[t]
    assert not np.isnan(scores).any(), "a page score was not written"
    return scores


def quest_formula(q, kmin, kmax, B, Hkv, G, D, L, P):
    n = (L + P - 1) // P
    out = np.zeros((B * Hkv, n))
    for bh in range(B * Hkv):
        qg = q[bh * G:(bh + 1) * G].astype(np.float64)[:, :, None]
        o = np.maximum(qg * kmax[bh][None, :, :n], qg * kmin[bh][None, :, :n]).sum(1)
        out[bh] = o.max(0)
    return out


def build_emulated(K, B, Hkv, D, L, P, cap):
    """page_meta_build_kernel: groups of D/8 threads per page, BUILD_PAGES per block, transposed writes"""
    BUILD_PAGES = 32
    n = (L + P - 1) // P
    cpr = D // 8
    groups = THREADS // cpr
    kmin = np.full((B * Hkv, D, cap), np.nan, dtype=np.float32)
    kmax = kmin.copy()
    for bh in range(B * Hkv):
        for bx in range((cap + BUILD_PAGES - 1) // BUILD_PAGES):
            j0 = bx * BUILD_PAGES
            smin = np.zeros((D, BUILD_PAGES + 2), dtype=np.float32)
            smax = smin.copy()
            for t in range(THREADS):
                g, piece = t // cpr, t % cpr
                if g >= groups:
                    continue
                for jj in range(g, BUILD_PAGES, groups):
                    j = j0 + jj
                    if j < n:
                        t0 = j * P
                        nt = min(P, L - t0)
                        lo = K[bh, t0, piece * 8:piece * 8 + 8].copy()
                        hi = lo.copy()
                        for i in range(1, nt):
                            v = K[bh, t0 + i, piece * 8:piece * 8 + 8]
                            lo = np.where(v < lo, v, lo)
                            hi = np.where(v > hi, v, hi)
                    else:
                        lo, hi = np.full(8, np.inf), np.full(8, -np.inf)
                    smin[piece * 8:piece * 8 + 8, jj] = lo
                    smax[piece * 8:piece * 8 + 8, jj] = hi
            words = BUILD_PAGES // 2
            for w in range(2 * D * words):
                tt, c, jj = w // (D * words), (w // words) % D, (w % words) * 2
                if j0 + jj >= cap:
                    continue
                src, dst = (smax, kmax) if tt else (smin, kmin)
                dst[bh, c, j0 + jj:j0 + jj + 2] = src[c, jj:jj + 2]
    assert not np.isnan(kmin).any() and not np.isnan(kmax).any(), "an entry was not written"
    return kmin, kmax


def main():
    # the pages past the last one in the last 16-byte piece hold +inf / -inf (0 * inf = nan in Quest's
    # q+ hi + q- lo): their sums are never written, as in the kernel
    np.seterr(invalid="ignore", over="ignore")
    rng = np.random.default_rng(1)
    worst = 0.0
    # (B, Hkv, G, D, L, P, r, resident): resident small to force several tiles per block, NARROW tiles, ...
    shapes = [
        (1, 2, 4, 128, 3000, 3, 81, 396),  # NARROW tiles (2 heads x 4 wide tiles < 396)
        (2, 2, 4, 128, 3000, 3, 61, 6),    # WIDE, several tiles per block
        (1, 1, 1, 24, 700, 2, 5, 3),       # MHA, D = 24, r not a multiple of the slots
        (1, 2, 8, 64, 100, 16, 64, 400),   # G = 8, one partial tile, r = D
        (1, 1, 2, 16, 1, 2, 1, 10),        # L = 1
        (1, 1, 4, 128, 2600, 1, 128, 2),   # P = 1, r = D
    ]
    for (B, Hkv, G, D, L, P, r, resident) in shapes:
        n = (L + P - 1) // P
        cap = (n + 7) // 8 * 8
        q = bf16_round(rng.standard_normal((B * Hkv * G, D)))
        q[:, rng.choice(D, size=min(8, D), replace=False)] *= 8
        q = bf16_round(q)
        x, y = bf16_round(rng.standard_normal((2, B * Hkv, D, cap)))
        kmin, kmax = np.minimum(x, y), np.maximum(x, y)
        kmin[:, :, n:], kmax[:, :, n:] = np.inf, -np.inf
        u, ch = hybrid_emulated(q, kmin, kmax, B, Hkv, G, D, L, P, cap, r, resident)
        u_ref, ch_ref = hybrid_formula(q, kmin, kmax, B, Hkv, G, D, L, P, r)
        assert (ch == ch_ref).all(), "channels differ"
        err = np.abs(u - u_ref) / (1e-5 + 1e-3 * np.abs(u_ref))
        print(f"hybrid B={B} Hkv={Hkv} G={G} D={D} L={L} P={P} r={r} resident={resident}: "
              f"{err.max() * 100:.2f}% of the tolerance")
        worst = max(worst, err.max())
        if L >= P:
            s = quest_emulated(q, kmin, kmax, B, Hkv, G, D, L, P, cap, resident)
            s_ref = quest_formula(q, kmin, kmax, B, Hkv, G, D, L, P)
            err = np.abs(s - s_ref) / (1e-5 + 1e-3 * np.abs(s_ref))
            print(f"quest  B={B} Hkv={Hkv} G={G} D={D} L={L} P={P} resident={resident}: "
                  f"{err.max() * 100:.2f}% of the tolerance")
            worst = max(worst, err.max())
    for (B, Hkv, D, L, P, cap) in [(1, 2, 128, 100, 3, 40), (2, 1, 24, 50, 5, 16), (1, 1, 256, 40, 1, 48),
                                   (1, 1, 64, 1, 16, 8)]:
        K = bf16_round(rng.standard_normal((B * Hkv, L, D)))
        kmin, kmax = build_emulated(K, B, Hkv, D, L, P, cap)
        n = (L + P - 1) // P
        for j in range(cap):
            if j < n:
                seg = K[:, j * P:min(L, (j + 1) * P)]
                assert (kmin[:, :, j] == seg.min(1)).all() and (kmax[:, :, j] == seg.max(1)).all()
            else:
                assert (kmin[:, :, j] == np.inf).all() and (kmax[:, :, j] == -np.inf).all()
        print(f"build  B={B} Hkv={Hkv} D={D} L={L} P={P} cap={cap}: exact")
    print(f"worst: {worst * 100:.2f}% of the tolerance")
    return 0 if worst <= 1 else 1


if __name__ == "__main__":
    sys.exit(main())
