"""Numba twins of the hot pointwise / row-wise pieces of the transformer primitives.

Each kernel has a NumPy reference (``*_reference``) that is the specification; ``tests/test_autograd_kernels.py``
checks kernel == reference on both float32 and float64. Kernels are compiled lazily per dtype (``cache=True``),
without fastmath, and parallelised over rows with ``prange``. They exist for speed only: the default GPT
step spends most of its non-GEMM time in the causal softmax and the SwiGLU gate.

Row loops keep the input dtype: float32 in, float32 arithmetic (as NumPy would do), float64 in, float64.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange


# ---- causal softmax of attention scores -------------------------------------------------------------
@njit(cache=True, parallel=True)
def _causal_softmax_(S, scale, one):  # S (R, T, T) scores, overwritten with P; one = 1 in S's dtype
    R, T, _ = S.shape
    zero = one - one
    for r in prange(R):
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
    T = S.shape[-1]
    _causal_softmax_(S.reshape(-1, T, T), S.dtype.type(scale), S.dtype.type(1))
    return S


def causal_softmax_reference(S: np.ndarray, scale: float) -> np.ndarray:
    T = S.shape[-1]
    Z = S * S.dtype.type(scale)
    Z = np.where(np.triu(np.ones((T, T), bool), 1), -np.inf, Z)
    E = np.exp(Z - Z.max(-1, keepdims=True))
    return E / E.sum(-1, keepdims=True)


@njit(cache=True, parallel=True)
def _causal_softmax_vjp_(P, dP, scale):  # dP (R, T, T) overwritten with dS = scale * P (dP - <dP, P>)
    R, T, _ = P.shape
    zero = scale - scale
    for r in prange(R):
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
    T = P.shape[-1]
    _causal_softmax_vjp_(P.reshape(-1, T, T), dP.reshape(-1, T, T), P.dtype.type(scale))
    return dP


def causal_softmax_vjp_reference(P, dP, scale):
    return P.dtype.type(scale) * P * (dP - np.sum(dP * P, axis=-1, keepdims=True))


# ---- SwiGLU gate: h = silu(a) * u ------------------------------------------------------------------
@njit(cache=True, parallel=True)
def _swiglu(a, u, h, sig, one):  # one = 1 in the arrays' dtype (a bare literal would promote to float64)
    for i in prange(a.shape[0]):
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


def swiglu_reference(a, u):
    from scipy.special import expit
    s = expit(a)
    return a * s * u, s


@njit(cache=True, parallel=True)
def _swiglu_vjp(g, a, u, sig, da, du, one):
    for i in prange(a.shape[0]):
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


def swiglu_vjp_reference(g, a, u, sig):
    return g * u * (sig * (1 + a * (1 - sig))), g * a * sig
