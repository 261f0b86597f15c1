// small_eig.cu: the r largest eigenpairs of a small symmetric matrix (small_eig.h; the method and its
// measurements in kernels/shadowkv/NOTES.md). A library solver reduces a 240 x 240 matrix in a chain of
// panel launches of a few blocks each (~1.6 ms on an H200); here the whole reduction runs in one block
// with the matrix resident in shared memory, and the tridiagonal eigenproblem one warp an eigenpair.
#include <cfloat>
#include <cstdint>

#include "kernels/common/kvb_cuda.h"
#include "kernels/common/kvb_device.cuh"
#include "kernels/shadowkv/small_eig.h"

using namespace kvb_dev;

namespace {

constexpr int KMAX = SMALL_EIG_MAX_K;
constexpr int ROWS = KMAX / 32;           // a lane's rows: i = 32 c + lane, c < ROWS
constexpr int TB = 32, TLD = 33;          // the reduction's tiles: 32 x 32, columns padded to 33 floats
constexpr int NBMAX = KMAX / TB;          // tile rows
constexpr int NTMAX = NBMAX * (NBMAX + 1) / 2;
constexpr int TILE = TB * TLD;
constexpr int TRI_THREADS = 1024;         // warp 0 forms the reflections; warps 1.. own the tiles
constexpr int TRI_WARPS = TRI_THREADS / 32;
constexpr int EIG_WARPS = 2;              // warps a block of the tridiagonal solver
constexpr int BISECT_ROUNDS = 8;          // 33 intervals a round: 33^8 = 1.4e12, then inverse iteration
constexpr int INVIT_ITERS = 3;            // inverse iterations from a shift within ~1e-12 ||T||
constexpr int BACK_WARPS = 16;            // eigenvectors a block of the back-transformation
constexpr int CHECK_THREADS = 256;
static_assert(TRI_THREADS / 4 >= KMAX, "the row sums take 4 threads a row");
static_assert(sizeof(float) * (NTMAX * (TILE + 2 * TB) + 4 * KMAX) <= 227 * 1024, "the tiles fit one SM's shared memory");

// Start of column l of the packed lower triangle (columns stored one after another, rows l..k-1)
__host__ __device__ __forceinline__ int packed_col(int l, int k) { return l * k - (l * (l - 1)) / 2; }
__host__ __device__ __forceinline__ int packed_floats(int k) { return ((k * (k + 1) / 2) + 3) & ~3; }
__host__ __device__ __forceinline__ int tile_index(int I, int L) { return I * (I + 1) / 2 + L; }

size_t tridiag_smem_bytes(int k)
{
    const int nb = (k + TB - 1) / TB, nt = nb * (nb + 1) / 2;
    return sizeof(float) * ((size_t)nt * TILE + 2 * (size_t)nt * TB + 4 * KMAX);
}

// Element (i, l) of the tiled matrix (the diagonal tiles hold both triangles; below them, i >= l)
__device__ __forceinline__ float *tile_at(float *tiles, int i, int l)
{
    return tiles + tile_index(i / TB, l / TB) * TILE + (l % TB) * TLD + i % TB;
}

// The reflection H = I - tau v v^T that zeroes column jj below its subdiagonal (LAPACK's slarfg), by
// warp 0 from the column's current entries x[c] (rows 32 c + lane; rows jj + 2..k-1 are read) and its
// diagonal and subdiagonal entries: v (0 up to jj, 1 at jj + 1) into vbuf and, below the subdiagonal,
// into the packed reflections (refl, global: the back-transformation reads them there); d_jj, e_jj
// (fp64) and tau_jj. The sum of squares in fp64 (no overflow for any fp32 matrix); tau and v are fp32,
// as stored.
__device__ __forceinline__ void householder(int k, int jj, const float (&x)[NBMAX], float diag, float alpha, float *vbuf,
                                            float *tau, float *refl, double *d, double *e, int lane)
{
    double sig = 0.0;
#pragma unroll
    for (int c = 0; c < NBMAX; c++) {
        const int i = 32 * c + lane;
        if (i > jj + 1 && i < k) sig += (double)x[c] * x[c];
    }
    sig = warp_sum<16, 1>(sig);
    float beta = alpha, t = 0.f, scale = 0.f; // sig = 0: the column is reduced already, H = I
    if (sig > 0.0) {
        const float norm = (float)sqrt((double)alpha * alpha + sig);
        beta = alpha >= 0.f ? -norm : norm;
        t = (beta - alpha) / beta;
        scale = 1.f / (alpha - beta); // no cancellation: alpha and -beta have one sign
    }
    float *col = refl + packed_col(jj, k) - jj;
#pragma unroll
    for (int c = 0; c < NBMAX; c++) {
        const int i = 32 * c + lane;
        float vi = 0.f;
        if (i == jj + 1) {
            vi = 1.f;
        } else if (i > jj + 1 && i < k) {
            vi = x[c] * scale;
            col[i] = vi;
        }
        vbuf[i] = vi;
    }
    if (lane == 0) *tau = t, d[jj] = diag, e[jj] = beta;
}

// Householder tridiagonalization of T's lower triangle, one block, the matrix resident in shared
// memory as 32 x 32 tiles (lower ones; the diagonal tiles whole). Step j, over the trailing block
// (rows and columns j+1..k-1; v and p are 0 outside it, so the tiles that straddle it need no masks):
//   1. p = A v: a warp a tile, its row sums (lanes = rows) and, below the diagonal, its column sums
//      (lanes = columns: the tile is also read transposed, conflict-free with the 33-float columns);
//   2. p_i = tau (the sums of row i's tiles), 4 threads a row; warp 0 then reads column j + 1;
//   3. w = p - (tau/2)(p.v) v, A -= v w^T + w v^T, each tile by its warp, while warp 0 updates its
//      copy of column j + 1 in registers and forms the next reflection from it (into the other v
//      buffer): one barrier a phase, three a step.
// Warp 0 owns no tile (the reflection is the step's longest path). Outputs: d [k], e [k-1] (fp64),
// the reflections packed by columns (refl: v below each column's subdiagonal) and tau [k-2].
__global__ void __launch_bounds__(TRI_THREADS, 1)
    tridiag_kernel(const float *__restrict__ T, int k, float *__restrict__ refl, float *__restrict__ tau_out,
                   double *__restrict__ d, double *__restrict__ e)
{
    extern __shared__ float4 smem4[];
    const int nb = (k + TB - 1) / TB, nt = nb * (nb + 1) / 2;
    float *tiles = (float *)smem4;
    float *yrow = tiles + nt * TILE, *ycol = yrow + nt * TB; // a tile's row and column sums
    float *vbufs = ycol + nt * TB;                           // two of KMAX
    float *p = vbufs + 2 * KMAX;
    float *tau = p + KMAX;
    __shared__ unsigned char tile_row[NTMAX], tile_col[NTMAX]; // the t-th tile of a triangle of tiles
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (threadIdx.x < NTMAX) {
        int I = 0;
        while ((I + 1) * (I + 2) / 2 <= (int)threadIdx.x) I++;
        tile_row[threadIdx.x] = (unsigned char)I, tile_col[threadIdx.x] = (unsigned char)(threadIdx.x - I * (I + 1) / 2);
    }
    // T's lower triangle into the tiles (zero past k; the diagonal tiles mirrored)
    for (int t = warp; t < nt; t += TRI_WARPS) {
        int I = 0;
        while ((I + 1) * (I + 2) / 2 <= t) I++;
        const int L = t - I * (I + 1) / 2, i = TB * I + lane;
        float *tile = tiles + t * TILE;
        for (int c = 0; c < TB; c++) {
            const int l = TB * L + c;
            float a = 0.f;
            if (i < k && l < k) a = i >= l ? T[(size_t)l * k + i] : T[(size_t)i * k + l];
            tile[c * TLD + lane] = a;
        }
    }
    for (int i = threadIdx.x; i < 4 * KMAX; i += TRI_THREADS) vbufs[i] = 0.f; // v, v', p, tau
    __syncthreads();
    const int steps = k - 2; // reflections j = 0 .. k-3
    if (warp == 0 && steps > 0) {
        float x[NBMAX];
#pragma unroll
        for (int c = 0; c < NBMAX; c++) x[c] = 32 * c + lane < k ? *tile_at(tiles, 32 * c + lane, 0) : 0.f;
        householder(k, 0, x, *tile_at(tiles, 0, 0), *tile_at(tiles, 1, 0), vbufs, &tau[0], refl, d, e, lane);
    }
    __syncthreads();
    for (int j = 0; j < steps; j++) {
        const float *v = vbufs + (j & 1) * KMAX;
        const float4 *v4 = (const float4 *)v, *p4 = (const float4 *)p;
        const float tj = tau[j];
        const int J0 = (j + 1) / TB, nbt = nb - J0, nat = nbt * (nbt + 1) / 2; // the trailing tiles
        // 1. the tiles' row and column sums of A v
        for (int t = warp - 1; warp > 0 && t < nat; t += TRI_WARPS - 1) {
            const int I = J0 + tile_row[t], L = J0 + tile_col[t], ti = tile_index(I, L);
            const float *tile = tiles + ti * TILE;
            float a0 = 0.f, a1 = 0.f;
#pragma unroll
            for (int c4 = 0; c4 < TB / 4; c4++) {
                const float4 vv = v4[(TB * L) / 4 + c4];
                a0 = fmaf(tile[(4 * c4 + 0) * TLD + lane], vv.x, a0);
                a1 = fmaf(tile[(4 * c4 + 1) * TLD + lane], vv.y, a1);
                a0 = fmaf(tile[(4 * c4 + 2) * TLD + lane], vv.z, a0);
                a1 = fmaf(tile[(4 * c4 + 3) * TLD + lane], vv.w, a1);
            }
            yrow[ti * TB + lane] = a0 + a1;
            if (I > L) {
                float b0 = 0.f, b1 = 0.f;
#pragma unroll
                for (int r4 = 0; r4 < TB / 4; r4++) {
                    const float4 vv = v4[(TB * I) / 4 + r4];
                    b0 = fmaf(tile[lane * TLD + 4 * r4 + 0], vv.x, b0);
                    b1 = fmaf(tile[lane * TLD + 4 * r4 + 1], vv.y, b1);
                    b0 = fmaf(tile[lane * TLD + 4 * r4 + 2], vv.z, b0);
                    b1 = fmaf(tile[lane * TLD + 4 * r4 + 3], vv.w, b1);
                }
                ycol[ti * TB + lane] = b0 + b1;
            }
        }
        __syncthreads();
        // 2. p_i = tau_j (row i's tile sums: its tile row from J0 to the diagonal, and the column sums
        //    of the tiles below that diagonal tile), 4 threads a row; 0 outside the trailing rows
        {
            const int i = threadIdx.x >> 2, q = threadIdx.x & 3, I = i / TB, rl = i % TB;
            float y = 0.f;
            if (i < KMAX && I >= J0 && I < nb)
                for (int term = q; term < nb - J0; term += 4) {
                    const int L = J0 + term;
                    y += L <= I ? yrow[tile_index(I, L) * TB + rl] : ycol[tile_index(L, I) * TB + rl];
                }
            y = warp_sum<1, 2>(y);
            if (q == 0 && i < KMAX) p[i] = i > j && i < k ? tj * y : 0.f;
        }
        // warp 0: column j + 1 as it is before this step's update (no tile changes until barrier 2)
        const int jn = j + 1;
        float x[NBMAX], diag = 0.f, alpha = 0.f;
        if (warp == 0) {
#pragma unroll
            for (int c = 0; c < NBMAX; c++) {
                const int i = 32 * c + lane;
                x[c] = i > jn && i < k ? *tile_at(tiles, i, jn) : 0.f;
            }
            diag = *tile_at(tiles, jn, jn);
            if (jn + 1 < k) alpha = *tile_at(tiles, jn + 1, jn);
        }
        __syncthreads();
        // 3. w = p + K v; the rank-2 update
        float pv = 0.f;
#pragma unroll
        for (int c = 0; c < NBMAX; c++) pv = fmaf(p[32 * c + lane], v[32 * c + lane], pv);
        const float K = -0.5f * tj * warp_sum<16, 1>(pv);
        if (warp == 0 && jn < steps) { // column j + 1 updated in registers, then its reflection
            const float vn = v[jn], wn = fmaf(K, vn, p[jn]);
#pragma unroll
            for (int c = 0; c < NBMAX; c++) {
                const int i = 32 * c + lane;
                if (i > jn && i < k) {
                    const float vi = v[i], wi = fmaf(K, vi, p[i]);
                    x[c] = fmaf(-wi, vn, fmaf(-vi, wn, x[c]));
                }
            }
            diag = fmaf(-wn, vn, fmaf(-vn, wn, diag));
            const float va = v[jn + 1], wa = fmaf(K, va, p[jn + 1]);
            alpha = fmaf(-wa, vn, fmaf(-va, wn, alpha));
            householder(k, jn, x, diag, alpha, vbufs + (jn & 1) * KMAX, &tau[jn], refl, d, e, lane);
        }
        for (int t = warp - 1; warp > 0 && t < nat; t += TRI_WARPS - 1) {
            const int I = J0 + tile_row[t], L = J0 + tile_col[t];
            float *tile = tiles + tile_index(I, L) * TILE;
            const float vr = v[TB * I + lane], wr = fmaf(K, vr, p[TB * I + lane]);
#pragma unroll
            for (int c4 = 0; c4 < TB / 4; c4++) {
                const float4 vv = v4[(TB * L) / 4 + c4], pp = p4[(TB * L) / 4 + c4];
                float *a = tile + 4 * c4 * TLD + lane;
                a[0] = fmaf(-wr, vv.x, fmaf(-vr, fmaf(K, vv.x, pp.x), a[0]));
                a[TLD] = fmaf(-wr, vv.y, fmaf(-vr, fmaf(K, vv.y, pp.y), a[TLD]));
                a[2 * TLD] = fmaf(-wr, vv.z, fmaf(-vr, fmaf(K, vv.z, pp.z), a[2 * TLD]));
                a[3 * TLD] = fmaf(-wr, vv.w, fmaf(-vr, fmaf(K, vv.w, pp.w), a[3 * TLD]));
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        if (k >= 2) d[k - 2] = *tile_at(tiles, k - 2, k - 2), e[k - 2] = *tile_at(tiles, k - 1, k - 2);
        d[k - 1] = *tile_at(tiles, k - 1, k - 1);
    }
    for (int i = threadIdx.x; i < steps; i += TRI_THREADS) tau_out[i] = tau[i];
}

// Eigenvalues of the tridiagonal S below x: the sign changes of the leading minors' characteristic
// polynomials p_i = (d_i - x) p_{i-1} - e_{i-1}^2 p_{i-2} (Sturm), a zero taking the sign opposite its
// predecessor's. One FMA a step on the chain (the LDL^T form LAPACK uses divides a step, ~10x the
// latency); d, e2 are scaled to ||S|| ~ 1 by the caller, so |p| grows or shrinks by at most ~3^8 in 8
// steps, and the pair is rescaled every 8 steps to stay in range.
__device__ __forceinline__ int sturm_count(const double *d, const double *e2, int k, double x)
{
    double p0 = 1.0, p1 = d[0] - x;
    bool neg = p1 < 0.0;
    int count = neg;
#pragma unroll 8
    for (int i = 1; i < k; i++) {
        const double p2 = fma(d[i] - x, p1, -e2[i - 1] * p0);
        const bool n = p2 != 0.0 ? p2 < 0.0 : !neg;
        count += n != neg;
        neg = n, p0 = p1, p1 = p2;
        if ((i & 7) == 0) {
            const double a = fabs(p1) + fabs(p0);
            const double f = a > 0x1p200 ? 0x1p-200 : (a < 0x1p-200 ? 0x1p200 : 1.0);
            p0 *= f, p1 *= f;
        }
    }
    return count;
}

// One warp a wanted eigenpair (ascending index q = k - r + j) of the tridiagonal S (d, e):
// multisection by Sturm counts (32 points a round, each lane one), then inverse iteration with the
// midpoint as shift: S - sigma I = P L U with partial pivoting by lane 0 (U has two superdiagonals;
// pivots below eps ||S|| raised to it, as LAPACK's dlagts does), INVIT_ITERS solves from a seeded
// start, each normalized by the warp; lambda is the Rayleigh quotient of the result.
__global__ void __launch_bounds__(EIG_WARPS * 32)
    tridiag_eig_kernel(const double *__restrict__ d_in, const double *__restrict__ e_in, int k, int r,
                       double *__restrict__ Zs, double *__restrict__ lam)
{
    __shared__ double d[KMAX], e[KMAX], e2[KMAX];
    __shared__ double U0[EIG_WARPS][KMAX], U1[EIG_WARPS][KMAX], U2[EIG_WARPS][KMAX], LM[EIG_WARPS][KMAX];
    __shared__ double zs[EIG_WARPS][KMAX];
    __shared__ unsigned char piv[EIG_WARPS][KMAX];
    for (int i = threadIdx.x; i < KMAX; i += blockDim.x) {
        const double ei = i < k - 1 ? e_in[i] : 0.0;
        d[i] = i < k ? d_in[i] : 0.0, e[i] = ei, e2[i] = ei * ei;
    }
    __syncthreads();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int j = blockIdx.x * EIG_WARPS + warp;
    if (j >= r) return;
    const int q = k - r + j;
    double lo = DBL_MAX, hi = -DBL_MAX, emax2 = 0.0;
    for (int i = lane; i < k; i += 32) {
        const double rad = (i > 0 ? fabs(e[i - 1]) : 0.0) + fabs(e[i]);
        lo = fmin(lo, d[i] - rad), hi = fmax(hi, d[i] + rad), emax2 = fmax(emax2, e2[i]);
    }
    lo = warp_min<16, 1>(lo), hi = warp_max<16, 1>(hi), emax2 = warp_max<16, 1>(emax2);
    const double tnorm = fmax(fabs(lo), fabs(hi));
    const double pivmin = DBL_MIN * fmax(1.0, emax2);
    // the Sturm counts on S / tnorm (scaled copies in this warp's rows of the LU arrays, free until the
    // inverse iteration)
    const double sc = tnorm > 0.0 ? 1.0 / tnorm : 1.0;
    double *ds = U0[warp], *e2s = U1[warp];
    for (int i = lane; i < k; i += 32) ds[i] = d[i] * sc, e2s[i] = e2[i] * sc * sc;
    __syncwarp();
    const double widen = 2.0 * DBL_EPSILON * k + 2.0 * pivmin * sc;
    double a = lo * sc - widen, b = hi * sc + widen; // count(a) <= q < count(b)
    for (int round = 0; round < BISECT_ROUNDS; round++) {
        if (b - a <= 2.0 * DBL_EPSILON * fmax(fabs(a), fabs(b))) break;
        const double step = (b - a) / 33.0;
        const unsigned above = __ballot_sync(0xffffffffu, sturm_count(ds, e2s, k, a + step * (lane + 1)) > q);
        if (above == 0u) {
            a = a + step * 32;
        } else {
            const int L = __ffs(above) - 1;
            b = a + step * (L + 1), a = a + step * L;
        }
    }
    const double sigma = 0.5 * (a + b) * tnorm;
    __syncwarp(); // every lane's last count read ds, e2s
    double *u0 = U0[warp], *u1 = U1[warp], *u2 = U2[warp], *lm = LM[warp], *z = zs[warp];
    unsigned char *pv = piv[warp];
    if (lane == 0) {
        const double floor_ = fmax(DBL_EPSILON * tnorm, pivmin);
        double c0 = d[0] - sigma, c1 = k > 1 ? e[0] : 0.0; // the row being reduced: columns i, i + 1
        for (int i = 0; i < k - 1; i++) {
            const double n0 = e[i], n1 = d[i + 1] - sigma, n2 = i + 2 < k ? e[i + 1] : 0.0;
            if (fabs(c0) >= fabs(n0)) {
                const double m = c0 != 0.0 ? n0 / c0 : 0.0;
                u0[i] = c0, u1[i] = c1, u2[i] = 0.0, pv[i] = 0, lm[i] = m;
                c0 = n1 - m * c1, c1 = n2;
            } else {
                const double m = c0 / n0;
                u0[i] = n0, u1[i] = n1, u2[i] = n2, pv[i] = 1, lm[i] = m;
                c0 = c1 - m * n1, c1 = -m * n2;
            }
        }
        u0[k - 1] = c0;
        for (int i = 0; i < k; i++) { // the reciprocal pivots, tiny ones raised to the floor
            const double u = u0[i];
            u0[i] = 1.0 / (fabs(u) >= floor_ ? u : (u >= 0.0 ? floor_ : -floor_));
        }
    }
    for (int i = lane; i < k; i += 32) { // a seeded start in [-1, 1) (splitmix64 of the row and the index)
        uint64_t h = ((uint64_t)q << 32 | (uint64_t)i) * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
        h = (h ^ (h >> 30)) * 0xBF58476D1CE4E5B9ull;
        h = (h ^ (h >> 27)) * 0x94D049BB133111EBull;
        h ^= h >> 31;
        z[i] = (double)(h >> 11) * (2.0 / 9007199254740992.0) - 1.0;
    }
    __syncwarp();
    for (int it = 0; it < INVIT_ITERS; it++) {
        if (lane == 0) {
            double cy = z[0];
#pragma unroll 4
            for (int i = 0; i < k - 1; i++) {
                const double ny = z[i + 1];
                if (!pv[i])
                    z[i] = cy, cy = ny - lm[i] * cy;
                else
                    z[i] = ny, cy = cy - lm[i] * ny;
            }
            z[k - 1] = cy * u0[k - 1];
            if (k >= 2) z[k - 2] = (z[k - 2] - u1[k - 2] * z[k - 1]) * u0[k - 2];
#pragma unroll 4
            for (int i = k - 3; i >= 0; i--) z[i] = (z[i] - u1[i] * z[i + 1] - u2[i] * z[i + 2]) * u0[i];
        }
        __syncwarp();
        double mx = 0.0; // scaled by the largest entry first: a solve near a pivot floor can reach 1e300
        for (int i = lane; i < k; i += 32) mx = fmax(mx, fabs(z[i]));
        mx = warp_max<16, 1>(mx);
        const double inv_mx = mx > 0.0 ? 1.0 / mx : 1.0;
        double ss = 0.0;
        for (int i = lane; i < k; i += 32) {
            const double x = z[i] * inv_mx;
            ss += x * x;
        }
        ss = warp_sum<16, 1>(ss);
        const double scale = inv_mx / sqrt(ss > 0.0 ? ss : 1.0);
        for (int i = lane; i < k; i += 32) z[i] *= scale;
        __syncwarp();
    }
    double rq = 0.0;
    for (int i = lane; i < k; i += 32) {
        rq += d[i] * z[i] * z[i];
        if (i + 1 < k) rq += 2.0 * e[i] * z[i] * z[i + 1];
        Zs[(size_t)j * k + i] = z[i];
    }
    rq = warp_sum<16, 1>(rq);
    if (lane == 0) lam[j] = rq;
}

// z = H_0 H_1 ... H_{k-3} z_S for each wanted eigenvector, one warp each, the sums in fp64; the block
// first copies the reflections (packed columns) and tau into shared memory, since every step of every
// warp reads one column of them
__global__ void __launch_bounds__(BACK_WARPS * 32, 1)
    tridiag_back_kernel(const float *__restrict__ refl, const float *__restrict__ tau_in, const double *__restrict__ Zs,
                        const double *__restrict__ lam, int k, int r, float *__restrict__ Z, float *__restrict__ W)
{
    extern __shared__ float4 smem4[];
    float *R = (float *)smem4, *tau = R + packed_floats(k);
    const int steps = k - 2;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (int l = warp; l < steps; l += BACK_WARPS) // the stored entries only: column l's rows l + 2..k-1
        for (int i = l + 2 + lane; i < k; i += 32) R[packed_col(l, k) + i - l] = refl[packed_col(l, k) + i - l];
    for (int i = threadIdx.x; i < steps; i += blockDim.x) tau[i] = tau_in[i];
    __syncthreads();
    const int j = blockIdx.x * BACK_WARPS + warp;
    if (j >= r) return;
    double z[ROWS];
#pragma unroll
    for (int c = 0; c < ROWS; c++) z[c] = 32 * c + lane < k ? Zs[(size_t)j * k + 32 * c + lane] : 0.0;
    for (int s = steps - 1; s >= 0; s--) {
        const double ts = tau[s];
        if (ts == 0.0) continue;
        const float *col = R + packed_col(s, k) - s; // col[i] = v_i for i >= s + 2, v_{s+1} = 1
        float v[ROWS];
        double dot = 0.0;
#pragma unroll
        for (int c = 0; c < ROWS; c++) {
            const int i = 32 * c + lane;
            v[c] = i == s + 1 ? 1.f : (i > s + 1 && i < k ? col[i] : 0.f);
            dot += (double)v[c] * z[c];
        }
        const double f = ts * warp_sum<16, 1>(dot);
#pragma unroll
        for (int c = 0; c < ROWS; c++) z[c] -= f * v[c];
    }
#pragma unroll
    for (int c = 0; c < ROWS; c++)
        if (32 * c + lane < k) Z[(size_t)j * k + 32 * c + lane] = (float)z[c];
    if (lane == 0) W[j] = (float)lam[j];
}

__device__ __forceinline__ float nan_as_inf(float x) { return x == x ? x : INFINITY; }

// Block j: |T z_j - lambda_j z_j| over the rows (T symmetric from its lower triangle, fp64 sums) and
// |z_j . z_m - [j = m]| for m >= j; the block's largest of each, and |lambda_j|, by atomicMax on the
// float's bits (non-negative; NaN counted as infinity).
__global__ void __launch_bounds__(CHECK_THREADS)
    eig_check_kernel(const float *__restrict__ T, const float *__restrict__ Z, const float *__restrict__ W, int k,
                     int r, float *__restrict__ check)
{
    __shared__ float zj[KMAX];
    __shared__ float red[2][CHECK_THREADS / 32];
    const int j = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int i = threadIdx.x; i < k; i += CHECK_THREADS) zj[i] = Z[(size_t)j * k + i];
    __syncthreads();
    const float lj = W[j];
    float res = 0.f, orth = 0.f;
    for (int i = threadIdx.x; i < k; i += CHECK_THREADS) {
        double s = 0.0;
#pragma unroll 8
        for (int l = 0; l <= i; l++) s += (double)T[(size_t)l * k + i] * zj[l]; // row i, lower part
#pragma unroll 8
        for (int l = i + 1; l < k; l++) s += (double)T[(size_t)i * k + l] * zj[l]; // column i below
        res = fmaxf(res, nan_as_inf(fabsf((float)(s - (double)lj * zj[i]))));
    }
    for (int m = j + warp; m < r; m += CHECK_THREADS / 32) {
        double s = 0.0;
        for (int i = lane; i < k; i += 32) s += (double)zj[i] * Z[(size_t)m * k + i];
        s = warp_sum<16, 1>(s);
        orth = fmaxf(orth, nan_as_inf(fabsf((float)(s - (m == j ? 1.0 : 0.0)))));
    }
    res = warp_max<16, 1>(res), orth = warp_max<16, 1>(orth);
    if (lane == 0) red[0][warp] = orth, red[1][warp] = res;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < CHECK_THREADS / 32; w++) orth = fmaxf(orth, red[0][w]), res = fmaxf(res, red[1][w]);
        atomicMax((unsigned *)&check[SMALL_EIG_CHECK_ORTH], __float_as_uint(orth));
        atomicMax((unsigned *)&check[SMALL_EIG_CHECK_RESID], __float_as_uint(res));
        atomicMax((unsigned *)&check[SMALL_EIG_CHECK_NORM], __float_as_uint(nan_as_inf(fabsf(lj))));
    }
}

size_t align256(size_t x) { return (x + 255) & ~(size_t)255; }

struct SmallEigWs {
    float *refl, *tau;
    double *d, *e, *Zs, *lam;
};

SmallEigWs carve(void *ws, int k, int r, size_t *bytes)
{
    char *b = (char *)ws;
    auto take = [&](size_t n) {
        void *at = b;
        b += align256(n);
        return at;
    };
    SmallEigWs w;
    w.refl = (float *)take(sizeof(float) * packed_floats(k));
    w.tau = (float *)take(sizeof(float) * k);
    w.d = (double *)take(sizeof(double) * k);
    w.e = (double *)take(sizeof(double) * k);
    w.Zs = (double *)take(sizeof(double) * k * (size_t)r);
    w.lam = (double *)take(sizeof(double) * r);
    *bytes = (size_t)(b - (char *)ws);
    return w;
}

} // namespace

extern "C" size_t small_eig_workspace_bytes(int k, int r)
{
    size_t bytes = 0;
    if (k >= 1 && k <= KMAX && r >= 1 && r <= k) carve(NULL, k, r, &bytes);
    return bytes;
}

extern "C" int small_eig_top(const float *T, int k, int r, float *W, float *Z, float *check, void *workspace,
                             cudaStream_t stream)
{
    if (k < 1 || k > KMAX) return kvb_fail(KVB_EINVAL, "small_eig_top: k=%d out of range [1, %d]", k, KMAX);
    if (r < 1 || r > k) return kvb_fail(KVB_EINVAL, "small_eig_top: r=%d out of range [1, k=%d]", r, k);
    if (!T || !W || !Z || !check || !workspace)
        return kvb_fail(KVB_EINVAL, "small_eig_top: a NULL pointer (T, W, Z, check, workspace)");
    size_t bytes;
    const SmallEigWs w = carve(workspace, k, r, &bytes);
    const size_t smem = tridiag_smem_bytes(k);
    CUDA_TRY(cudaFuncSetAttribute(tridiag_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    tridiag_kernel<<<1, TRI_THREADS, smem, stream>>>(T, k, w.refl, w.tau, w.d, w.e);
    CUDA_TRY(cudaGetLastError());
    tridiag_eig_kernel<<<(r + EIG_WARPS - 1) / EIG_WARPS, EIG_WARPS * 32, 0, stream>>>(w.d, w.e, k, r, w.Zs, w.lam);
    CUDA_TRY(cudaGetLastError());
    const size_t back_smem = sizeof(float) * ((size_t)packed_floats(k) + KMAX);
    CUDA_TRY(cudaFuncSetAttribute(tridiag_back_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)back_smem));
    tridiag_back_kernel<<<(r + BACK_WARPS - 1) / BACK_WARPS, BACK_WARPS * 32, back_smem, stream>>>(
        w.refl, w.tau, w.Zs, w.lam, k, r, Z, W);
    CUDA_TRY(cudaGetLastError());
    CUDA_TRY(cudaMemsetAsync(check, 0, SMALL_EIG_CHECK_N * sizeof(float), stream));
    eig_check_kernel<<<r, CHECK_THREADS, 0, stream>>>(T, Z, W, k, r, check);
    CUDA_TRY(cudaGetLastError());
    return KVB_OK;
}

extern "C" int small_eig_accept(const float *check)
{
    const float bound = SMALL_EIG_CHECK_BOUND;
    return check[SMALL_EIG_CHECK_ORTH] <= bound && check[SMALL_EIG_CHECK_RESID] <= bound * check[SMALL_EIG_CHECK_NORM];
}
