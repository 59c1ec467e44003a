"""numba-CUDA kernels of :mod:`refopt.fast.msign_cuda` (imported only when ``backend='cuda'`` runs).

Kept in their own module so that ``numba.cuda`` is a module global here, as the CUDA simulator needs.
Every shared array is declared on its own source line (the simulator keys shared arrays by line).
"""
import math

import numpy as np
from numba import cuda, float32, float64
from numba.core import config

#: device functions are inlined into the kernels at the NVVM level (register-resident accumulators,
#: shared-memory loads kept as such); the simulator has no such option
_DEVICE = {"device": True} if config.ENABLE_CUDASIM else {"device": True, "forceinline": True}


def build(dtype_name: str, BM: int, BK: int, TM: int, RED: int) -> dict:
    """The kernels for one dtype ('float32' / 'float64') and launch geometry (see ``msign_cuda.Tiles``:
    BM x BM output tiles, BK-deep shared slabs, TM x TM register blocks, RED-thread reductions)."""
    ty_ = float32 if dtype_name == "float32" else float64
    S = BM // TM                  # threads along a tile side; thread (ty, tx) owns rows ty + S*i, cols tx + S*j
    NT = S * S                    # threads per product block
    PAD = BM + 1                  # padded shared rows: the transposed stores of a slab do not conflict
    FMAX = float(np.finfo(dtype_name).max)

    @cuda.jit(**_DEVICE)
    def _mac(As, Bs, acc):
        """acc[i, j] += sum_kk As[kk, ty + S i] Bs[kk, tx + S j] (one shared slab)."""
        tid = cuda.threadIdx.x
        ty = tid // S
        tx = tid % S
        a = cuda.local.array(TM, ty_)
        b = cuda.local.array(TM, ty_)
        for kk in range(BK):
            for i in range(TM):
                a[i] = As[kk, ty + S * i]
            for j in range(TM):
                b[j] = Bs[kk, tx + S * j]
            for i in range(TM):
                for j in range(TM):
                    acc[i, j] += a[i] * b[j]

    @cuda.jit(**_DEVICE)
    def _load_rows(As, X, b, r0, k0, m, k):
        """As[kk, i] = X[b, r0 + i, k0 + kk] (zero outside): a BM-row slab, read along X's rows."""
        for e in range(cuda.threadIdx.x, BK * BM, NT):
            i = e // BK
            kk = e % BK
            r = r0 + i
            c = k0 + kk
            if r < m and c < k:
                As[kk, i] = X[b, r, c]
            else:
                As[kk, i] = 0

    @cuda.jit
    def syrk(X, C, D, alpha, beta, diag, log):
        """C[b] = alpha X[b] X[b]^T + beta D[b] + diag I on the tiles (bi <= bj), mirrored to (bj, bi).
        X (B, m, k); C, D (B, m, m), D symmetric (not read when beta == 0); grid (T (T+1)/2, B).
        log: (T, T) int32 counts of the tiles computed (for the tests), or shape (0, 0) for none."""
        b = cuda.blockIdx.y
        m = X.shape[1]
        k = X.shape[2]
        T = (m + BM - 1) // BM
        bi = 0
        rest = cuda.blockIdx.x
        while rest >= T - bi:     # the blockIdx.x-th tile of the upper triangle, row by row
            rest -= T - bi
            bi += 1
        bj = bi + rest
        As = cuda.shared.array((BK, PAD), ty_)
        Bs = cuda.shared.array((BK, PAD), ty_)
        acc = cuda.local.array((TM, TM), ty_)
        for i in range(TM):
            for j in range(TM):
                acc[i, j] = 0
        for k0 in range(0, k, BK):
            _load_rows(As, X, b, bi * BM, k0, m, k)
            _load_rows(Bs, X, b, bj * BM, k0, m, k)
            cuda.syncthreads()
            _mac(As, Bs, acc)
            cuda.syncthreads()
        tid = cuda.threadIdx.x
        ty = tid // S
        tx = tid % S
        for i in range(TM):
            r = bi * BM + ty + S * i
            for j in range(TM):
                c = bj * BM + tx + S * j
                if r < m and c < m:
                    v = alpha * acc[i, j]
                    if beta != 0:
                        v += beta * D[b, r, c]
                    if r == c:
                        v += diag
                    C[b, r, c] = v
                    if bi != bj:
                        C[b, c, r] = v
        if tid == 0 and b == 0 and log.shape[0] > 0:
            cuda.atomic.add(log, (bi, bj), 1)

    @cuda.jit
    def gemm(P, X, Y):
        """Y[b] = P[b] X[b]; P (B, m, k), X (B, k, n), Y (B, m, n); grid (ceil(n/BM), ceil(m/BM), B)."""
        b = cuda.blockIdx.z
        m = P.shape[1]
        k = P.shape[2]
        n = X.shape[2]
        r0 = cuda.blockIdx.y * BM
        c0 = cuda.blockIdx.x * BM
        As = cuda.shared.array((BK, PAD), ty_)
        Bs = cuda.shared.array((BK, PAD), ty_)
        acc = cuda.local.array((TM, TM), ty_)
        for i in range(TM):
            for j in range(TM):
                acc[i, j] = 0
        for k0 in range(0, k, BK):
            _load_rows(As, P, b, r0, k0, m, k)
            for e in range(cuda.threadIdx.x, BK * BM, NT):      # Bs[kk, j] = X[b, k0 + kk, c0 + j]
                kk = e // BM
                j = e % BM
                if k0 + kk < k and c0 + j < n:
                    Bs[kk, j] = X[b, k0 + kk, c0 + j]
                else:
                    Bs[kk, j] = 0
            cuda.syncthreads()
            _mac(As, Bs, acc)
            cuda.syncthreads()
        tid = cuda.threadIdx.x
        ty = tid // S
        tx = tid % S
        for i in range(TM):
            r = r0 + ty + S * i
            for j in range(TM):
                c = c0 + tx + S * j
                if r < m and c < n:
                    Y[b, r, c] = acc[i, j]

    @cuda.jit(**_DEVICE)
    def _block_reduce(sh, v, op_max):
        """Tree reduction of v over the block (max if op_max else sum); the result is in sh[0]."""
        tid = cuda.threadIdx.x
        sh[tid] = v
        cuda.syncthreads()
        s = RED // 2
        while s > 0:
            if tid < s:
                if op_max:
                    sh[tid] = max(sh[tid], sh[tid + s])
                else:
                    sh[tid] += sh[tid + s]
            cuda.syncthreads()
            s //= 2

    @cuda.jit
    def absmax_partial(G, part, bad):
        """part[b, blk] = max |G[b]| over this block's share of entries; bad[b] = 1 on nan / inf."""
        b = cuda.blockIdx.y
        c = G.shape[2]
        size = G.shape[1] * c
        v = ty_(0)
        for e in range(cuda.blockIdx.x * RED + cuda.threadIdx.x, size, cuda.gridDim.x * RED):
            x = abs(G[b, e // c, e % c])
            if x <= FMAX:
                v = max(v, x)
            else:
                bad[b] = 1
        sh = cuda.shared.array(RED, ty_)
        _block_reduce(sh, v, True)
        if cuda.threadIdx.x == 0:
            part[b, cuda.blockIdx.x] = sh[0]

    @cuda.jit
    def sumsq_partial(G, amax, part):
        """part[b, blk] = sum (G[b] / amax[b])^2 over this block's share (0 when amax[b] = 0)."""
        b = cuda.blockIdx.y
        c = G.shape[2]
        size = G.shape[1] * c
        v = ty_(0)
        s1 = amax[b]
        if s1 > 0:
            for e in range(cuda.blockIdx.x * RED + cuda.threadIdx.x, size, cuda.gridDim.x * RED):
                y = G[b, e // c, e % c] / s1
                v += y * y
        sh = cuda.shared.array(RED, ty_)
        _block_reduce(sh, v, False)
        if cuda.threadIdx.x == 0:
            part[b, cuda.blockIdx.x] = sh[0]

    @cuda.jit
    def reduce_final(part, out, op_max):
        """out[b] = max or sum of part[b, :]; one block per matrix (grid (B,))."""
        b = cuda.blockIdx.x
        v = ty_(0)
        for e in range(cuda.threadIdx.x, part.shape[1], RED):
            if op_max:
                v = max(v, part[b, e])
            else:
                v += part[b, e]
        sh = cuda.shared.array(RED, ty_)
        _block_reduce(sh, v, op_max)
        if cuda.threadIdx.x == 0:
            out[b] = sh[0]

    @cuda.jit
    def denominators(amax, sumsq, s1, s2, mode, eps, f):
        """X_0 = (G / s1) / s2 with, per matrix, nrm = sqrt(sumsq) = ||G / amax||_F:
        mode 0 ('none'): s1 = amax, s2 = f nrm; 1 ('add'): s1 = f (nrm amax) + eps, s2 = 1;
        2 ('clamp'): s1 = max(f (nrm amax), eps), s2 = 1. s1 = 0 marks a zero matrix."""
        b = cuda.grid(1)
        if b < amax.shape[0]:
            a = amax[b]
            nrm = math.sqrt(sumsq[b])
            if a == 0:
                s1[b] = 0
                s2[b] = 1
            elif mode == 0:
                s1[b] = a
                s2[b] = f * nrm
            else:
                fro = f * (nrm * a)
                s1[b] = fro + eps if mode == 1 else max(fro, eps)
                s2[b] = 1

    @cuda.jit
    def scale(G, s1, s2, X, tall):
        """X[b] = (G[b] / s1[b]) / s2[b], transposed when tall; zeros where s1[b] = 0. grid over G."""
        j, i = cuda.grid(2)
        b = cuda.blockIdx.z
        if i < G.shape[1] and j < G.shape[2]:
            v = ty_(0)
            if s1[b] != 0:
                v = (G[b, i, j] / s1[b]) / s2[b]
            if tall:
                X[b, j, i] = v
            else:
                X[b, i, j] = v

    @cuda.jit
    def transpose(X, Y):
        """Y[b] = X[b]^T; grid over X."""
        j, i = cuda.grid(2)
        b = cuda.blockIdx.z
        if i < X.shape[1] and j < X.shape[2]:
            Y[b, j, i] = X[b, i, j]

    @cuda.jit
    def nonfinite(X, bad):
        """bad[0] = 1 when X holds a nan or inf."""
        j, i = cuda.grid(2)
        b = cuda.blockIdx.z
        if i < X.shape[1] and j < X.shape[2]:
            if not abs(X[b, i, j]) <= FMAX:
                bad[0] = 1

    return {"syrk": syrk, "gemm": gemm, "absmax_partial": absmax_partial, "sumsq_partial": sumsq_partial,
            "reduce_final": reduce_final, "denominators": denominators, "scale": scale,
            "transpose": transpose, "nonfinite": nonfinite}
