"""Primitives: forward and VJP side by side, one small function each (the table of STYLE.md section 3.2).

Every primitive accepts nodes or constants. With no node among its inputs it returns the plain NumPy
result, so the same model code runs untraced. ``g`` is the output cotangent; ``unbroadcast`` sums it back
to each operand's shape (PITFALLS.md B19). A floating constant mixed with a node is cast to the node's
dtype first (NumPy 2 / NEP 50 would otherwise promote float32 to float64 for ``np.float64`` scalars and
float64 arrays).

Conventions at non-differentiable points: ``relu'(0) = 0``.
"""
from __future__ import annotations

import numpy as np
from scipy import special as _special

from .core import Node, unbroadcast

_SQRT_HALF = 0.7071067811865476          # 1/sqrt(2)
_INV_SQRT_2PI = 0.3989422804014327       # 1/sqrt(2 pi)


# ---- helpers ---------------------------------------------------------------------------------------
def _raw(x, like_dtype=None):
    """Value of a node, or a constant as an ndarray cast to ``like_dtype`` when that is floating."""
    if isinstance(x, Node):
        return x.value
    x = np.asarray(x)
    if like_dtype is not None and like_dtype.kind == "f" and x.dtype != like_dtype:
        x = x.astype(like_dtype)
    return x


def _binary_values(a, b):
    na, nb = isinstance(a, Node), isinstance(b, Node)
    if na and not nb:
        return a.value, _raw(b, a.value.dtype), na, nb
    if nb and not na:
        return _raw(a, b.value.dtype), b.value, na, nb
    return _raw(a), _raw(b), na, nb


def _fit(g, x):
    """Cotangent ``g`` reduced to the shape and dtype of operand value ``x``."""
    return unbroadcast(g, x.shape, x.dtype)


def _unary(a, forward, derivative_from):
    """A pointwise primitive. ``derivative_from(x, y)`` gives dy/dx from the input and the output."""
    if not isinstance(a, Node):
        return forward(np.asarray(a))
    x = a.value
    y = forward(x)
    return Node(y, (a,), lambda g: (g * derivative_from(x, y),))


# ---- arithmetic ------------------------------------------------------------------------------------
def add(a, b):
    """a + b (broadcasting). VJP: (unbroadcast(g), unbroadcast(g))."""
    x, y, na, nb = _binary_values(a, b)
    if not (na or nb):
        return x + y
    return Node(x + y, (a, b), lambda g: (_fit(g, x) if na else None, _fit(g, y) if nb else None))


def sub(a, b):
    """a - b. VJP: (g, -g), unbroadcast."""
    x, y, na, nb = _binary_values(a, b)
    if not (na or nb):
        return x - y
    return Node(x - y, (a, b), lambda g: (_fit(g, x) if na else None, _fit(-g, y) if nb else None))


def mul(a, b):
    """a * b. VJP: (g*b, g*a), unbroadcast."""
    x, y, na, nb = _binary_values(a, b)
    if not (na or nb):
        return x * y
    return Node(x * y, (a, b), lambda g: (_fit(g * y, x) if na else None, _fit(g * x, y) if nb else None))


def div(a, b):
    """a / b. VJP: (g/b, -g*a/b**2), unbroadcast."""
    x, y, na, nb = _binary_values(a, b)
    out = x / y
    if not (na or nb):
        return out
    return Node(out, (a, b), lambda g: (_fit(g / y, x) if na else None, _fit(-g * out / y, y) if nb else None))


def neg(a):
    """-a. VJP: -g."""
    if not isinstance(a, Node):
        return -np.asarray(a)
    return Node(-a.value, (a,), lambda g: (-g,))


def power(a, p):
    """a ** p for a constant exponent p. VJP: g * p * a**(p-1).

    Raises: TypeError if p is a traced node (only constant exponents are supported).
    """
    if isinstance(p, Node):
        raise TypeError("power: the exponent must be a constant, not a traced node")
    if not isinstance(a, Node):
        return np.asarray(a) ** p
    x = a.value
    pc = x.dtype.type(p) if x.dtype.kind == "f" else p
    return Node(x ** pc, (a,), lambda g: (g * (pc * x ** (pc - 1)),))


def _mm(A, B):
    """A @ B; a stack of rows times one matrix runs as a single 2-D GEMM (faster than a batch loop)."""
    if B.ndim == 2 and A.ndim > 2:
        return (A.reshape(-1, A.shape[-1]) @ B).reshape(A.shape[:-1] + (B.shape[-1],))
    return A @ B


def matmul(a, b):
    """a @ b with NumPy semantics: 1-D operands are promoted, leading (batch) axes broadcast.

    VJP: dA = g @ B^T, dB = A^T @ g, each summed over broadcast batch axes. For the common
    ``(..., K) @ (K, N)`` layer the weight gradient is one GEMM: ``A.reshape(-1, K)^T @ g.reshape(-1, N)``.
    Shapes: a (..., M, K) or (K,), b (..., K, N) or (K,).
    """
    x, y, na, nb = _binary_values(a, b)
    A = x[None, :] if x.ndim == 1 else x
    B = y[:, None] if y.ndim == 1 else y
    out = _mm(A, B)
    if y.ndim == 1:
        out = out[..., 0]
    if x.ndim == 1:
        out = out[..., 0, :] if y.ndim > 1 else out[..., 0]
    if not (na or nb):
        return out

    def vjp(g):
        g2 = g
        if y.ndim == 1:
            g2 = g2[..., None]
        if x.ndim == 1:
            g2 = g2[..., None, :]
        ga = gb = None
        if na:
            ga = _fit(_mm(g2, np.swapaxes(B, -1, -2)), A).reshape(x.shape)
        if nb:
            if B.ndim == 2 and A.ndim > 2:
                gb = A.reshape(-1, A.shape[-1]).T @ g2.reshape(-1, g2.shape[-1])
            else:
                gb = np.swapaxes(A, -1, -2) @ g2
            gb = _fit(gb, B).reshape(y.shape)
        return ga, gb

    return Node(out, (a, b), vjp)


# ---- reductions and shape ops ----------------------------------------------------------------------
def _axes(axis, ndim):
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if np.isscalar(axis) else tuple(axis)
    return tuple(int(ax) % ndim for ax in axes)


def _expand_back(g, shape, axes, keepdims):
    """Broadcast a reduced cotangent back to ``shape``, materialised (a broadcast view is read-only)."""
    if not keepdims:
        g = np.expand_dims(g, axes)
    return np.broadcast_to(g, shape).copy()


def sum(a, axis=None, keepdims=False):  # noqa: A001 (mirrors np.sum)
    """Sum over ``axis`` (None: all). VJP: g broadcast back to a's shape."""
    if not isinstance(a, Node):
        return np.sum(a, axis=axis, keepdims=keepdims)
    x = a.value
    axes = _axes(axis, x.ndim)
    return Node(np.sum(x, axis=axes, keepdims=keepdims), (a,),
                lambda g: (_expand_back(g, x.shape, axes, keepdims),))


def mean(a, axis=None, keepdims=False):
    """Mean over ``axis`` (None: all). VJP: g / n broadcast back, n the number of reduced elements."""
    if not isinstance(a, Node):
        return np.mean(a, axis=axis, keepdims=keepdims)
    x = a.value
    axes = _axes(axis, x.ndim)
    n = int(np.prod([x.shape[ax] for ax in axes])) if axes else 1
    inv_n = x.dtype.type(1.0 / n)
    return Node(np.mean(x, axis=axes, keepdims=keepdims), (a,),
                lambda g: (_expand_back(g * inv_n, x.shape, axes, keepdims),))


def reshape(a, shape):
    """a.reshape(shape). VJP: g.reshape(a.shape)."""
    if not isinstance(a, Node):
        return np.reshape(a, shape)
    x = a.value
    return Node(x.reshape(shape), (a,), lambda g: (g.reshape(x.shape),))


def transpose(a, axes=None):
    """np.transpose(a, axes) (None reverses the axes). VJP: g transposed by the inverse permutation."""
    if not isinstance(a, Node):
        return np.transpose(a, axes)
    x = a.value
    perm = tuple(range(x.ndim))[::-1] if axes is None else tuple(int(ax) % x.ndim for ax in axes)
    inv = tuple(np.argsort(perm))
    return Node(x.transpose(perm), (a,), lambda g: (g.transpose(inv),))


def _is_advanced(idx) -> bool:
    parts = idx if isinstance(idx, tuple) else (idx,)
    return any(isinstance(p, (np.ndarray, list)) for p in parts)


def getitem(a, idx):
    """a[idx] for basic (slices, ints, None, ...) or advanced (integer / boolean array) indices.

    VJP: zeros of a's shape with g scattered back; repeated indices accumulate (``np.add.at``
    semantics, never ``z[idx] += g``, which drops duplicates; STYLE.md 3.3 item 7).
    Raises: TypeError if ``idx`` contains a traced node.
    """
    parts = idx if isinstance(idx, tuple) else (idx,)
    if any(isinstance(p, Node) for p in parts):
        raise TypeError("getitem: indices must be constants, not traced nodes")
    if not isinstance(a, Node):
        return np.asarray(a)[idx]
    x = a.value
    advanced = _is_advanced(idx)

    def vjp(g):
        z = np.zeros(x.shape, dtype=g.dtype)
        if advanced:
            np.add.at(z, idx, g)
        else:
            z[idx] = g  # basic indexing selects each element at most once
        return (z,)

    return Node(x[idx], (a,), vjp)


# ---- pointwise functions ---------------------------------------------------------------------------
def exp(a):
    """exp(a). VJP: g * exp(a)."""
    return _unary(a, np.exp, lambda x, y: y)


def log(a):
    """Natural log. VJP: g / a."""
    return _unary(a, np.log, lambda x, y: 1 / x)


def sqrt(a):
    """Square root. VJP: g / (2 sqrt(a))."""
    return _unary(a, np.sqrt, lambda x, y: 0.5 / y)


def tanh(a):
    """tanh(a). VJP: g * (1 - tanh(a)^2)."""
    return _unary(a, np.tanh, lambda x, y: 1 - y * y)


def sigmoid(a):
    """Logistic sigma(a) = 1 / (1 + exp(-a)), via scipy.special.expit. VJP: g * s * (1 - s)."""
    return _unary(a, _special.expit, lambda x, y: y * (1 - y))


def relu(a):
    """max(a, 0). VJP: g * [a > 0] (relu'(0) = 0)."""
    return _unary(a, lambda x: np.maximum(x, 0), lambda x, y: (x > 0).astype(x.dtype))


def silu(a):
    """SiLU / swish-1: a * sigma(a). VJP: g * sigma(a) * (1 + a (1 - sigma(a)))."""
    if not isinstance(a, Node):
        x = np.asarray(a)
        return x * _special.expit(x)
    x = a.value
    s = _special.expit(x)
    return Node(x * s, (a,), lambda g: (g * (s * (1 + x * (1 - s))),))


def gelu(a):
    """Exact GELU (Hendrycks & Gimpel 2016, arXiv:1606.08415, eq. 1): a * Phi(a), Phi the standard normal
    CDF, Phi(a) = erfc(-a / sqrt 2) / 2 with scipy.special.erfc (the erf form, not the tanh approximation;
    erfc keeps full relative accuracy in the negative tail where 1 + erf(.) cancels).
    VJP: g * (Phi(a) + a * phi(a)), phi(a) = exp(-a^2/2) / sqrt(2 pi)."""
    if not isinstance(a, Node):
        x = np.asarray(a)
        return x * (0.5 * _special.erfc(x * x.dtype.type(-_SQRT_HALF)))
    x = a.value
    dt = x.dtype.type
    cdf = 0.5 * _special.erfc(x * dt(-_SQRT_HALF))
    return Node(x * cdf, (a,), lambda g: (g * (cdf + x * (dt(_INV_SQRT_2PI) * np.exp(-0.5 * x * x))),))
