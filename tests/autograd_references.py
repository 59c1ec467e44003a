"""NumPy references of the autograd's numba kernels (refopt.fast.autograd_kernels): the specification each
kernel is checked against in float32 and float64 (tests/test_autograd.py::test_kernels_match_references)."""
from __future__ import annotations

import numpy as np


def causal_softmax_reference(S: np.ndarray, scale: float) -> np.ndarray:
    """P = softmax(scale * S) over keys j <= i, 0 for j > i (S (..., T, T))."""
    T = S.shape[-1]
    Z = S * S.dtype.type(scale)
    Z = np.where(np.triu(np.ones((T, T), bool), 1), -np.inf, Z)
    E = np.exp(Z - Z.max(-1, keepdims=True))
    return E / E.sum(-1, keepdims=True)


def causal_softmax_vjp_reference(P, dP, scale):
    """dS = scale * P * (dP - rowsum(dP * P))."""
    return P.dtype.type(scale) * P * (dP - np.sum(dP * P, axis=-1, keepdims=True))


def swiglu_reference(a, u):
    """(h, sigma(a)) with h = silu(a) * u."""
    from scipy.special import expit
    s = expit(a)
    return a * s * u, s


def swiglu_vjp_reference(g, a, u, sig):
    """(da, du) of h = silu(a) * u."""
    return g * u * (sig * (1 + a * (1 - sig))), g * a * sig


def rms_norm_reference(x, gain, eps):
    """(y, xhat, r): r = 1/sqrt(mean(x^2) + eps) per row in float64, xhat = x r, y = xhat * gain."""
    r = 1 / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=-1, keepdims=True) + eps)
    xhat = (x * r).astype(x.dtype)
    return xhat * gain, xhat, r.reshape(-1)


def rms_norm_vjp_reference(g, gain, xhat, r):
    """dx of rms_norm: r (h - xhat mean(h xhat)), h = g gain."""
    h = g * gain
    mu = np.mean(h.astype(np.float64) * xhat, axis=-1, keepdims=True)
    return (r.reshape(xhat.shape[:-1] + (1,)) * (h - xhat * mu)).astype(g.dtype)
