"""Numba twins of the hot pointwise / row-wise pieces of the transformer primitives (``refopt.autograd.nn``).

The specification of each kernel is a NumPy reference in ``tests/autograd_references.py``;
``tests/test_autograd.py::test_kernels_match_references`` checks kernel == reference in float32 and float64.
Kernels are compiled lazily per dtype (``cache=True``; the first call in a fresh install compiles, several
seconds), without fastmath. The row-wise kernels here are serial; the model-level ones below run in
parallel only when the matrix products share their OpenMP thread pool (MKL, ``refopt.fast.blas``).
They exist for speed only: the default GPT step spends most of its non-GEMM time in the causal softmax,
the SwiGLU gate and RMSNorm.

dtypes: outputs have the input dtype. The softmax and SwiGLU loops compute in that dtype (constants are
passed in typed, since a bare literal would promote float32 to float64); the RMSNorm row sums accumulate
in float64 (PITFALLS B26).
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange


# ---- causal softmax of attention scores -------------------------------------------------------------
@njit(cache=True)
def _causal_softmax_(S, scale, one):  # S (R, T, T) scores, overwritten with P; one = 1 in S's dtype
    R, T, _ = S.shape
    zero = one - one
    for r in range(R):
        for i in range(T):
            row = S[r, i]
            m = row[0] * scale
            for j in range(1, i + 1):
                v = row[j] * scale
                if v > m:
                    m = v
            s = zero
            for j in range(i + 1):
                e = math.exp(row[j] * scale - m)
                row[j] = e
                s += e
            inv = one / s
            for j in range(i + 1):
                row[j] *= inv
            for j in range(i + 1, T):
                row[j] = zero


def causal_softmax_(S: np.ndarray, scale: float) -> np.ndarray:
    """In place: S (..., T, T) raw scores q k^T -> P = softmax(scale * S) over keys j <= i, P = 0 for
    j > i (the future). Returns S. Contiguous float32 / float64 input required."""
    if not S.flags.c_contiguous:
        raise ValueError("causal_softmax_: S must be C-contiguous (it is overwritten in place)")
    T = S.shape[-1]
    _causal_softmax_(S.reshape(-1, T, T), S.dtype.type(scale), S.dtype.type(1))
    return S


@njit(cache=True)
def _causal_softmax_vjp_(P, dP, scale):  # dP (R, T, T) overwritten with dS = scale * P (dP - <dP, P>)
    R, T, _ = P.shape
    zero = scale - scale
    for r in prange(R):   # a plain range here; parallel over the slices r in _causal_softmax_vjp_par_
        for i in range(T):
            p, d = P[r, i], dP[r, i]
            dot = p[0] * d[0]
            for j in range(1, i + 1):
                dot += p[j] * d[j]
            for j in range(i + 1):
                d[j] = scale * p[j] * (d[j] - dot)
            for j in range(i + 1, T):
                d[j] = zero


def causal_softmax_vjp_(P: np.ndarray, dP: np.ndarray, scale: float) -> np.ndarray:
    """In place on dP: the cotangent of the raw scores, dS = scale * P * (dP - rowsum(dP * P)), 0 above
    the diagonal. Returns dP."""
    if not (dP.flags.c_contiguous and P.flags.c_contiguous) or dP.dtype != P.dtype:
        raise ValueError("causal_softmax_vjp_: P and dP must be C-contiguous and of one dtype")
    T = P.shape[-1]
    _causal_softmax_vjp_(P.reshape(-1, T, T), dP.reshape(-1, T, T), P.dtype.type(scale))
    return dP


# ---- SwiGLU gate: h = silu(a) * u ------------------------------------------------------------------
@njit(cache=True)
def _swiglu(a, u, h, sig, one):  # one = 1 in the arrays' dtype (a bare literal would promote to float64)
    for i in range(a.shape[0]):
        x = a[i]
        s = one / (one + math.exp(-x))  # exp(-x) = inf for very negative x gives s = 0, never NaN
        sig[i] = s
        h[i] = x * s * u[i]


def swiglu(a: np.ndarray, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """h = silu(a) * u = a * sigma(a) * u and sigma(a) (kept for the VJP). Same shapes, contiguous."""
    a, u = np.ascontiguousarray(a), np.ascontiguousarray(u)
    h, sig = np.empty_like(a), np.empty_like(a)
    _swiglu(a.reshape(-1), u.reshape(-1), h.reshape(-1), sig.reshape(-1), a.dtype.type(1))
    return h, sig


@njit(cache=True)
def _swiglu_vjp(g, a, u, sig, da, du, one):
    for i in range(a.shape[0]):
        s, x = sig[i], a[i]
        du[i] = g[i] * x * s
        da[i] = g[i] * u[i] * (s * (one + x * (one - s)))


def swiglu_vjp(g, a, u, sig) -> tuple[np.ndarray, np.ndarray]:
    """(da, du) for h = silu(a) * u: da = g u sigma(a) (1 + a (1 - sigma(a))), du = g a sigma(a)."""
    g = np.ascontiguousarray(g)
    da, du = np.empty_like(a), np.empty_like(a)
    _swiglu_vjp(g.reshape(-1), a.reshape(-1), u.reshape(-1), sig.reshape(-1), da.reshape(-1), du.reshape(-1),
                a.dtype.type(1))
    return da, du


# ---- RMSNorm over the last axis ---------------------------------------------------------------------
@njit(cache=True)
def _rms_norm(x, gain, eps, y, xhat, r):  # x (N, C); r (N,) float64; gain (C,)
    N, C = x.shape
    for i in range(N):
        acc = 0.0
        for j in range(C):
            acc += float(x[i, j]) * float(x[i, j])
        ri = 1.0 / np.sqrt(acc / C + eps)
        r[i] = ri
        for j in range(C):
            xh = x[i, j] * ri
            xhat[i, j] = xh
            y[i, j] = xh * gain[j]


def rms_norm(x: np.ndarray, gain: np.ndarray, eps: float):
    """y = gain * x * r, r = 1/sqrt(mean(x^2) + eps) per row (sum of squares accumulated in float64).
    Returns (y, xhat, r) with y, xhat like x and r (N,) float64 for the VJP. x (..., C), gain (C,)."""
    C = x.shape[-1]
    x2 = np.ascontiguousarray(x).reshape(-1, C)
    y, xhat = np.empty_like(x2), np.empty_like(x2)
    r = np.empty(x2.shape[0], np.float64)
    _rms_norm(x2, np.ascontiguousarray(gain, dtype=x.dtype), float(eps), y, xhat, r)
    return y.reshape(x.shape), xhat.reshape(x.shape), r


@njit(cache=True)
def _rms_norm_vjp(g, gain, xhat, r, dx):  # dx = r (h - xhat mean(h xhat)), h = g gain
    N, C = g.shape
    for i in range(N):
        acc = 0.0
        for j in range(C):
            acc += float(g[i, j] * gain[j]) * float(xhat[i, j])
        mu = acc / C
        for j in range(C):
            dx[i, j] = r[i] * (float(g[i, j] * gain[j]) - float(xhat[i, j]) * mu)


def rms_norm_vjp(g, gain, xhat, r):
    """dx for :func:`rms_norm` (dgain = sum of g * xhat over rows is left to NumPy)."""
    C = g.shape[-1]
    g2 = np.ascontiguousarray(g).reshape(-1, C)
    dx = np.empty_like(g2)
    _rms_norm_vjp(g2, np.ascontiguousarray(gain, dtype=g2.dtype), xhat.reshape(-1, C), r, dx)
    return dx.reshape(g.shape)


# =====================================================================================================
# Model-level fused kernels (the GPT's hot path; ``nn.self_attention``, ``nn.ffn_activation``,
# ``nn.rms_norm``, ``nn.cross_entropy``, ``nn.embedding``). Written with ``prange`` over independent rows /
# (batch, head) slices: each output element is written by one iteration, in a fixed order, and every
# reduction over rows (gains' gradients) goes through per-chunk partials of a fixed chunk size summed
# afterwards in chunk order, so results do not depend on the number of threads. No atomics, no fastmath.
#
# Each is built twice, both cached and each compiled on its first call: serial (``prange`` runs as
# ``range``) and parallel. The parallel build runs only when the matrix products go to MKL on the same
# OpenMP thread pool (``refopt.fast.blas``): next to NumPy's OpenBLAS, whose threads keep spinning after each
# product, numba's second pool only competes with them (a 2-core step is ~1.8x slower). The two builds
# give the same bits (tests/test_fused.py).
# =====================================================================================================
from refopt.fast import blas  # noqa: E402
from refopt.kernels import twin  # noqa: E402

#: error_model="numpy": a float division follows IEEE 754 (x / 0 = inf) instead of numba's default Python
#: check (raise ZeroDivisionError), whose branch in every iteration keeps the SwiGLU loop from being
#: vectorised (2x slower). Same bits wherever the divisor is not 0, which it never is in the softmax and SwiGLU loops
#: (a row sum that includes exp(0) = 1; 1 + exp(-a) >= 1); RMSNorm's root is 0 only for an all-zero row with
#: eps = 0, which gives the documented inf / NaN rather than a ZeroDivisionError from inside the kernel.
#: Not fastmath: the order of every operation is unchanged.
_FLAGS = dict(cache=True, error_model="numpy")

#: which build of the fused kernels runs: None (default) the parallel one exactly when the products run on
#: MKL's OpenMP threads (``refopt.fast.blas.one_pool()``); True / False forces it (tests, benchmarks)
parallel_builds: bool | None = None


def _fused(fn, name: str | None = None):
    """``fn`` (a loop over ``prange``) compiled serially and in parallel, each cached under its own name;
    the returned function runs the parallel build when the products run on MKL's OpenMP pool."""
    name = name or fn.__name__
    serial = njit(**_FLAGS)(twin(fn, name))
    parallel = njit(parallel=True, **_FLAGS)(twin(fn, name + "_parallel"))

    def call(*args):
        par = blas.one_pool() if parallel_builds is None else parallel_builds
        return (parallel if par else serial)(*args)

    call.serial, call.parallel, call.py_func = serial, parallel, fn
    call.__name__, call.__qualname__, call.__doc__ = name, name, fn.__doc__
    return call


#: rows per partial sum of a gain gradient (fixed, so the summation order is independent of threads)
ROW_CHUNK = 64


@_fused
def _rms_norm_fwd(x, gain, eps, y, xhat, r):  # x (N, C); r (N,) float64; sum of squares in float64
    N, C = x.shape
    for i in prange(N):
        acc = 0.0
        for j in range(C):
            acc += float(x[i, j]) * float(x[i, j])
        ri = 1.0 / np.sqrt(acc / C + eps)
        r[i] = ri
        for j in range(C):
            xh = x[i, j] * ri
            xhat[i, j] = xh
            y[i, j] = xhat[i, j] * gain[j]


@_fused
def _rms_norm_bwd(g, gain, xhat, r, dx, dgain_part, with_dgain, n_chunks):
    # dx = r (h - xhat mean(h xhat)), h = g gain; dgain_part[c] = sum over chunk c's rows of g xhat
    N, C = g.shape
    for c in prange(n_chunks):
        for i in range(c * ROW_CHUNK, min(N, (c + 1) * ROW_CHUNK)):
            acc = 0.0
            for j in range(C):
                acc += float(g[i, j] * gain[j]) * float(xhat[i, j])
            mu = acc / C
            for j in range(C):
                dx[i, j] = r[i] * (float(g[i, j] * gain[j]) - float(xhat[i, j]) * mu)
            if with_dgain:
                for j in range(C):
                    dgain_part[c, j] += g[i, j] * xhat[i, j]


def rms_norm_fused(x: np.ndarray, gain: np.ndarray, eps: float):
    """Parallel :func:`rms_norm`: (y, xhat, r) for x (..., C) (float64 sums of squares), y, xhat like x."""
    C = x.shape[-1]
    x2 = np.ascontiguousarray(x).reshape(-1, C)
    y, xhat = np.empty_like(x2), np.empty_like(x2)
    r = np.empty(x2.shape[0], np.float64)
    _rms_norm_fwd(x2, np.ascontiguousarray(gain, dtype=x.dtype), float(eps), y, xhat, r)
    return y.reshape(x.shape), xhat.reshape(x.shape), r


def rms_norm_fused_vjp(g, gain, xhat, r, with_dgain: bool):
    """(dx, dgain or None) of :func:`rms_norm_fused`; dgain = sum over rows of g * xhat, summed per
    chunk of ``ROW_CHUNK`` rows and then over chunks in order (deterministic)."""
    C = g.shape[-1]
    g2 = np.ascontiguousarray(g).reshape(-1, C)
    dx = np.empty_like(g2)
    n_chunks = -(-g2.shape[0] // ROW_CHUNK)
    part = np.zeros((n_chunks if with_dgain else 1, C), g2.dtype)
    _rms_norm_bwd(g2, np.ascontiguousarray(gain, dtype=g2.dtype), xhat.reshape(-1, C), r, dx, part, with_dgain,
                  n_chunks)
    return dx.reshape(g.shape), (part.sum(axis=0) if with_dgain else None)


# ---- causal softmax, parallel over the (batch, head) slices (the products around it stay in BLAS) -----
@_fused
def _causal_shift_(S, scale, neg_inf):
    # row i of each slice: S_ij <- scale S_ij - max_{j' <= i} scale S_ij' for j <= i, -inf for j > i
    R, T, _ = S.shape
    for r in prange(R):
        for i in range(T):
            row = S[r, i]
            m = row[0] * scale
            for j in range(1, i + 1):
                v = row[j] * scale
                if v > m:
                    m = v
            for j in range(i + 1):
                row[j] = row[j] * scale - m
            for j in range(i + 1, T):
                row[j] = neg_inf


@_fused
def _causal_normalize_(E, one):  # E = exp(shifted S) (0 for j > i): each row divided by its sum over j <= i
    R, T, _ = E.shape
    zero = one - one
    for r in prange(R):
        for i in range(T):
            row = E[r, i]
            s = zero
            for j in range(i + 1):
                s += row[j]
            inv = one / s
            for j in range(i + 1):
                row[j] *= inv


#: the same loop as _causal_softmax_vjp_, built with the fused kernels' flags (each slice r by one iteration)
_causal_softmax_vjp_par_ = _fused(_causal_softmax_vjp_.py_func, "_causal_softmax_vjp_rows")


def causal_softmax_par_(S: np.ndarray, scale: float) -> np.ndarray:
    """:func:`causal_softmax_` in three passes: shift by the row max and mask (numba, parallel over the
    leading axes), exp (NumPy's SIMD exp, about 10x numba's scalar one; exp(-inf) = 0 exactly above the
    diagonal), normalise by the row sum in index order (numba, parallel). Identical results for any
    thread count. S (..., T, T) C-contiguous, overwritten with P and returned."""
    T = S.shape[-1]
    S3 = S.reshape(-1, T, T)
    dt = S.dtype.type
    _causal_shift_(S3, dt(scale), dt(-np.inf))
    with np.errstate(under="ignore"):   # a vanishing weight underflows to 0, as it should
        np.exp(S3, out=S3)
    _causal_normalize_(S3, dt(1))
    return S


def causal_softmax_vjp_par_(P: np.ndarray, dP: np.ndarray, scale: float) -> np.ndarray:
    """:func:`causal_softmax_vjp_` parallel over the leading axes; in place on dP, returned."""
    T = P.shape[-1]
    _causal_softmax_vjp_par_(P.reshape(-1, T, T), dP.reshape(-1, T, T), P.dtype.type(scale))
    return dP


# ---- feed-forward activations, row-parallel ----------------------------------------------------------
@_fused
def _neg_gate(z, out):  # out (N, F) = -a of z (N, 2F) = [a | u]: the input of SwiGLU's exp(-a), in parallel
    N, F = out.shape
    for i in prange(N):
        for j in range(F):
            out[i, j] = -z[i, j]


@_fused
def _swiglu_fwd(z, h, sig, one):
    # z (N, 2F) = [a | u] -> h = a sigma(a) u (N, F); on entry sig holds exp(-a) (NumPy's SIMD exp, ~10x
    # numba's scalar one), on exit sigma(a) = 1 / (1 + exp(-a)) (exp(-a) = inf gives 0, never NaN)
    N, F = h.shape
    for i in prange(N):
        for j in range(F):
            s = one / (one + sig[i, j])
            sig[i, j] = s
            h[i, j] = z[i, j] * s * z[i, F + j]


@_fused
def _swiglu_bwd(g, z, sig, dz, one):
    N, F = g.shape
    for i in prange(N):
        for j in range(F):
            s, x, u = sig[i, j], z[i, j], z[i, F + j]
            dz[i, j] = g[i, j] * u * (s * (one + x * (one - s)))
            dz[i, F + j] = g[i, j] * x * s


@_fused
def _reglu_fwd(z, h):  # h = relu(a) u
    N, F = h.shape
    zero = z[0, 0] - z[0, 0]
    for i in prange(N):
        for j in range(F):
            a = z[i, j]
            h[i, j] = (a if a > zero else zero) * z[i, F + j]


@_fused
def _reglu_bwd(g, z, dz):  # da = g u [a > 0] (relu'(0) = 0), du = g relu(a)
    N, F = g.shape
    zero = z[0, 0] - z[0, 0]
    for i in prange(N):
        for j in range(F):
            a, u = z[i, j], z[i, F + j]
            if a > zero:
                dz[i, j] = g[i, j] * u
                dz[i, F + j] = g[i, j] * a
            else:
                dz[i, j] = zero
                dz[i, F + j] = zero


@_fused
def _gelu_fwd(z, h, cdf, neg_sqrt_half, half):  # h = z Phi(z), Phi(z) = erfc(-z / sqrt 2) / 2
    N, F = h.shape
    for i in prange(N):
        for j in range(F):
            x = z[i, j]
            c = half * math.erfc(x * neg_sqrt_half)
            cdf[i, j] = c
            h[i, j] = x * c


@_fused
def _gelu_bwd(g, z, cdf, dz, inv_sqrt_2pi, half):  # dz = g (Phi(z) + z phi(z))
    N, F = g.shape
    for i in prange(N):
        for j in range(F):
            x = z[i, j]
            dz[i, j] = g[i, j] * (cdf[i, j] + x * (inv_sqrt_2pi * math.exp(-half * x * x)))


# ---- cross-entropy with log-softmax, row-parallel ------------------------------------------------------
@_fused
def _xent_rows(e, z, t, valid, m, lse, per_row):
    """Per row i, from e_ij = exp(z_ij - m_i) (NumPy's SIMD exp, 2x to 5x numba's scalar one) and
    m_i = max_j z_ij: lse_i = log sum_j e_ij (summed in float64, in index order) and per_row_i =
    lse_i - (z_{i,t_i} - m_i) on valid rows, 0 on ignored ones."""
    N, V = e.shape
    for i in prange(N):
        acc = 0.0
        for j in range(V):
            acc += float(e[i, j])
        li = math.log(acc)
        lse[i] = li
        per_row[i] = li - float(z[i, t[i]] - m[i]) if valid[i] else 0.0


# ---- embedding scatter-add (serial: one pass over the tokens, in order) --------------------------------
@njit(cache=True)
def _scatter_add_rows(ids, g, out):  # out[ids[i]] += g[i], tokens in order (repeated ids accumulate)
    N, C = g.shape
    for i in range(N):
        r = ids[i]
        for c in range(C):
            out[r, c] += g[i, c]
