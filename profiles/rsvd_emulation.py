#!/usr/bin/env python3
"""rsvd_emulation.py: randomized SVDs in fp32 (numpy, CPU) on shadowkv_lowrank's dist=lowrank law, to
tell which orthonormalization would fail where cuSOLVER's gesvdr (impl=gesvdr) misses the error bound.

The law as the suite draws it (harness/ops/ops_shadowkv.c, other random numbers): Kpre = sum_{i<192}
4 exp(-i/40) a_i b_i^T + 0.02 E, S=32768 x N=384. Each variant samples k = r + 32 columns, runs three
power products, takes the top r right singular vectors V of Q^T Kpre, and prints
||Kpre - Kpre V^T V||_F over the optimum (the exact SVD's tail, fp64). Variants:
  householder   Householder QR after every product (numpy's qr in fp32)
  cholqr        Cholesky QR in fp32 after every product (R from chol(Y^T Y)); numpy refuses a Gram
                matrix that is not positive definite in fp32 and the line says so
  no_reorth     the products without orthonormalization, one QR at the end (householder or cholqr)
  lu            the products normalized by the L of an LU with partial pivoting, Householder QR at the end
Results: results/h200/ab/gesvdr-rank-sweep/emulation.log. Runs in a few minutes on two cores.
"""
import numpy as np

rng = np.random.default_rng(1)
S, N, SIGNAL = 32768, 384, 192
ITERS, OVERSAMPLE = 3, 32
sig = 4 * np.exp(-np.arange(SIGNAL) / 40)
K = ((rng.standard_normal((S, SIGNAL)) * sig) @ rng.standard_normal((SIGNAL, N))
     + 0.02 * rng.standard_normal((S, N))).astype(np.float32)
Kd = K.astype(np.float64)
s_exact = np.linalg.svd(Kd, compute_uv=False)


def householder(Y):
    return np.linalg.qr(Y)[0]


def cholqr(Y):
    L = np.linalg.cholesky((Y.T @ Y).astype(np.float32))
    return np.linalg.solve(L, Y.T).T.astype(np.float32)


def lu_l(Y):
    """L of P Y = L U (partial pivoting), its rows in Y's order"""
    A = Y.astype(np.float32).copy()
    m, k = A.shape
    perm = np.arange(m)
    for j in range(k):
        p = j + np.argmax(np.abs(A[j:, j]))
        A[[j, p]] = A[[p, j]]
        perm[[j, p]] = perm[[p, j]]
        A[j + 1:, j] /= A[j, j]
        A[j + 1:, j + 1:] -= np.outer(A[j + 1:, j], A[j, j + 1:])
    L = np.tril(A[:, :k], -1)
    L[np.arange(k), np.arange(k)] = 1
    out = np.empty_like(L)
    out[perm] = L
    return out


def top_right_vectors(r, normalize, final):
    k = min(r + OVERSAMPLE, N)
    Y = K @ rng.standard_normal((N, k)).astype(np.float32)
    for _ in range(ITERS):
        Y = K @ normalize(K.T @ normalize(Y))
    Q = final(Y)
    return np.linalg.svd(Q.T @ K, full_matrices=False)[2][:r].astype(np.float64)


VARIANTS = [
    ("householder", householder, householder),
    ("cholqr", cholqr, cholqr),
    ("no_reorth householder", lambda Y: Y, householder),
    ("no_reorth cholqr", lambda Y: Y, cholqr),
    ("lu", lu_l, householder),
]
for r in (128, 160, 200, 278):
    optimum = np.sqrt((s_exact[r:] ** 2).sum())
    for name, normalize, final in VARIANTS:
        try:
            V = top_right_vectors(r, normalize, final)
            ratio = np.linalg.norm(Kd - (Kd @ V.T) @ V) / optimum
            print("r=%d %-22s %.5f" % (r, name, ratio), flush=True)
        except np.linalg.LinAlgError as e:
            print("r=%d %-22s refused: %s" % (r, name, e), flush=True)
