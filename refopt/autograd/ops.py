"""Primitives: forward and VJP side by side, one small function each.

Every primitive accepts nodes or constants. With no node among its inputs it returns the plain NumPy
result, so the same model code runs untraced. ``g`` is the output cotangent; ``unbroadcast`` sums it back
to each operand's shape (PITFALLS.md B19). A floating constant mixed with a node is cast to the node's
dtype first (NumPy 2 / NEP 50 would otherwise promote float32 to float64 for ``np.float64`` scalars and
float64 arrays).

Conventions at non-differentiable points: ``relu'(0) = 0``; those of jax.grad for the rest (tested
against it): ``|x|'(0) = 1``; ``maximum`` / ``minimum`` split the cotangent 1/2 : 1/2 between equal
operands; ``clip`` passes 1/2 of it at a bound. ``where`` gives NaN when the branch not taken has a NaN
derivative (``where(x > 0, sqrt(x), 0)`` at x <= 0), as jax.grad: guard the argument too (see where).
"""
from __future__ import annotations

import numpy as np
from scipy import special as _special

from ..fast import blas
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
        _not_on_node("power x ** y with a traced exponent y", ": the exponent must be a constant (x ** c); "
                                                             "for c ** y with c > 0 write np.exp(y * np.log(c))")
    if not isinstance(a, Node):
        return np.asarray(a) ** p
    x = a.value
    pc = x.dtype.type(p) if x.dtype.kind == "f" else p
    return Node(x ** pc, (a,), lambda g: (g * (pc * x ** (pc - 1)),))


def _mm(A, B):
    """A @ B; a stack of rows times one matrix runs as a single 2-D GEMM (faster than a batch loop)."""
    if B.ndim == 2 and A.ndim > 2:
        return blas.matmul(A.reshape(-1, A.shape[-1]), B).reshape(A.shape[:-1] + (B.shape[-1],))
    return blas.matmul(A, B)


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
                gb = blas.matmul(A.reshape(-1, A.shape[-1]).T, g2.reshape(-1, g2.shape[-1]))
            else:
                gb = _mm(np.swapaxes(A, -1, -2), g2)
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
    semantics, never ``z[idx] += g``, which drops duplicates).
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


def abs(a):  # noqa: A001 (mirrors np.abs)
    """|a|. VJP: g * sign(a), with |x|'(0) = 1 (jax.grad's convention: the right derivative)."""
    return _unary(a, np.abs, lambda x, y: np.where(x < 0, -1, 1).astype(x.dtype))


def log1p(a):
    """log(1 + a), accurate for small a (np.log1p). VJP: g / (1 + a)."""
    return _unary(a, np.log1p, lambda x, y: 1 / (1 + x))


def expm1(a):
    """exp(a) - 1, accurate for small a (np.expm1). VJP: g * exp(a) = g * (expm1(a) + 1)."""
    return _unary(a, np.expm1, lambda x, y: y + 1)


def square(a):
    """a * a. VJP: g * 2a."""
    return _unary(a, np.square, lambda x, y: 2 * x)


def where(condition, a, b):
    """np.where(condition, a, b): a where condition holds, b elsewhere (broadcasting).

    ``condition`` is a constant boolean array (e.g. ``x > 0`` on a traced x, which gives a plain boolean
    array: comparisons are not differentiable). VJP: (g where condition else 0, 0 where condition else
    g), each unbroadcast.

    NaN: the branch not taken still contributes ``0 * (its derivative)``. For ``where(x > 0, sqrt(x), 0)``
    at x < 0 that derivative is NaN, and 0 * NaN = NaN: the gradient is NaN there, as with jax.grad and
    torch (the chain rule evaluated in IEEE arithmetic; refopt does not zero it, which would also hide
    NaNs that mean something). Guard the argument as well (the double-where idiom):
    ``where(x > 0, sqrt(where(x > 0, x, 1)), 0)`` has the gradient 0 at x <= 0, no NaN.
    Raises: TypeError if condition is a traced node.
    """
    if isinstance(condition, Node):
        raise TypeError("where: the condition must be a constant boolean array (e.g. x > 0), not a traced node")
    cond = np.asarray(condition, dtype=bool)
    x, y, na, nb = _binary_values(a, b)
    out = np.where(cond, x, y)
    if not (na or nb):
        return out

    def vjp(g):
        zero = g.dtype.type(0)
        return (_fit(np.where(cond, g, zero), x) if na else None,
                _fit(np.where(cond, zero, g), y) if nb else None)

    return Node(out, (a, b), vjp)


def _select(a, b, pick_a):
    """maximum / minimum: VJP g to the operand picked, split 0.5 / 0.5 at ties (jax.grad's convention)."""
    x, y, na, nb = _binary_values(a, b)
    out = np.where(pick_a(x, y), x, y)
    if not (na or nb):
        return out
    dt = out.dtype.type

    def vjp(g):
        w = np.where(x == y, dt(0.5), pick_a(x, y).astype(out.dtype))    # the share of a
        return (_fit(g * w, x) if na else None, _fit(g * (1 - w), y) if nb else None)

    return Node(out, (a, b), vjp)


def maximum(a, b):
    """Elementwise max(a, b) (broadcasting; NaN propagates as in np.maximum). VJP: g to the larger
    operand; at a tie a == b each gets g/2 (as jax.grad; torch gives g/2 too)."""
    if not (isinstance(a, Node) or isinstance(b, Node)):
        return np.maximum(a, b)
    return _select(a, b, lambda x, y: (x > y) | np.isnan(x))


def minimum(a, b):
    """Elementwise min(a, b). VJP: g to the smaller operand; at a tie each gets g/2 (as jax.grad)."""
    if not (isinstance(a, Node) or isinstance(b, Node)):
        return np.minimum(a, b)
    return _select(a, b, lambda x, y: (x < y) | np.isnan(x))


def clip(a, lo, hi):
    """np.clip(a, lo, hi) = minimum(maximum(a, lo), hi) (lo, hi constants or nodes; None for no bound).
    VJP: g inside (lo, hi), 0 outside, g/2 exactly at a bound (the max/min tie rule, as jax.grad of
    jnp.clip). Raises ValueError if both bounds are None."""
    if lo is None and hi is None:
        raise ValueError("clip: give lo or hi (or both)")
    out = a if lo is None else maximum(a, lo)
    return out if hi is None else minimum(out, hi)


# ---- NumPy functions on traced values (Node.__array_ufunc__ / __array_function__) -----------------
#: NumPy ufuncs that act on traced nodes through a refopt primitive (np.add(x, 1), np.log1p(x) ...)
UFUNCS = {
    np.add: add, np.subtract: sub, np.multiply: mul, np.true_divide: div, np.negative: neg,
    np.power: power, np.matmul: matmul, np.exp: exp, np.log: log, np.sqrt: sqrt, np.tanh: tanh,
    np.absolute: abs, np.log1p: log1p, np.expm1: expm1, np.square: square, np.maximum: maximum,
    np.minimum: minimum, np.positive: lambda a: a,
}
#: ufuncs whose result is not differentiable (comparisons, tests): computed on the values, a plain array
CONSTANT_UFUNCS = {np.greater, np.greater_equal, np.less, np.less_equal, np.equal, np.not_equal,
                   np.isfinite, np.isnan, np.isinf, np.sign, np.signbit, np.logical_and, np.logical_or,
                   np.logical_not}


def _kw(name, kwargs, allowed):
    bad = sorted(set(kwargs) - set(allowed))
    if bad:
        raise TypeError(f"numpy.{name} on a traced value: the keyword(s) {bad} are not supported "
                        f"(refopt.autograd supports {sorted(allowed) or 'none'})")
    return kwargs


#: NumPy functions that act on traced nodes: name -> (refopt implementation, keywords it takes)
FUNCTIONS = {
    np.sum: (lambda a, axis=None, keepdims=False: sum(a, axis, keepdims), ("axis", "keepdims")),
    np.mean: (lambda a, axis=None, keepdims=False: mean(a, axis, keepdims), ("axis", "keepdims")),
    np.where: (lambda c, a, b: where(c, a, b), ()),
    np.clip: (lambda a, a_min=None, a_max=None, min=None, max=None:  # noqa: A002 (NumPy 2.1's names)
              clip(a, a_min if a_min is not None else min, a_max if a_max is not None else max),
              ("a_min", "a_max", "min", "max")),
    np.reshape: (lambda a, shape=None, newshape=None: reshape(a, shape if shape is not None else newshape),
                 ("shape", "newshape")),
    np.transpose: (lambda a, axes=None: transpose(a, axes), ("axes",)),
    np.matmul: (lambda a, b: matmul(a, b), ()),
    np.dot: (lambda a, b: matmul(a, b) if np.ndim(value_of(a)) <= 2 and np.ndim(value_of(b)) <= 2 else
             _missing("dot of arrays with more than 2 axes (use np.matmul / @)"), ()),
    np.shape: (lambda a: value_of(a).shape, ()),
    np.ndim: (lambda a: value_of(a).ndim, ()),
    np.size: (lambda a, axis=None: np.size(value_of(a), axis), ("axis",)),
}
def value_of(x):
    return x.value if isinstance(x, Node) else x


def _missing(what):
    raise TypeError(f"{what} is not a differentiable refopt.autograd operation. Differentiable: "
                    f"{', '.join(differentiable_names())}")


#: what a traced Node supports (Node's docstring), for the messages of what it does not
NODE_OPERATIONS = ("x + - * / @ c, x ** c (a constant exponent c), -x, abs(x), comparisons (plain boolean "
                   "arrays), x[idx], x.T, x.reshape, x.transpose, x.sum, x.mean, x.shape/.ndim/.dtype/.size")


def _not_on_node(what, why=""):
    raise TypeError(f"{what} on a traced Node is not supported{why}. A traced Node supports {NODE_OPERATIONS}"
                    f" and the NumPy functions {', '.join(differentiable_names())}")


def _to_number(what):
    def refuse(self, *args):
        _not_on_node(what, ": it would drop the gradient; use refopt.autograd.value(x) for the number "
                           "outside the traced math")
    return refuse


def _rpow(self, c):
    _not_on_node("c ** x (a traced exponent)", ": only constant exponents are (x ** c); for c > 0 write "
                                               "np.exp(x * np.log(c))")


def _setitem(self, idx, v):
    _not_on_node("x[idx] = v (in-place assignment)", "; build the new array instead, e.g. "
                                                     "np.where(mask, v, x)")


def _getattr(self, name):
    """Only for names Node does not have: an AttributeError (hasattr stays usable) naming what it has."""
    if name.startswith("_") or name in type(self).__slots__:
        raise AttributeError(name)
    raise AttributeError(f"a traced Node has no attribute {name!r}. It supports {NODE_OPERATIONS} and the "
                         f"NumPy functions {', '.join(differentiable_names())}")


def differentiable_names() -> list[str]:
    """The NumPy names refopt.autograd differentiates (as ufuncs or functions on traced values)."""
    return sorted({f"np.{u.__name__}" for u in UFUNCS} | {f"np.{f.__name__}" for f in FUNCTIONS
                                                          if f not in (np.shape, np.ndim, np.size)})


def array_ufunc(ufunc, method, inputs, kwargs):
    """Node.__array_ufunc__: ``ufunc(*inputs)`` through the refopt primitive, or a TypeError naming
    what is missing (a ufunc method such as ``np.add.reduce``, ``out=``, or an unsupported ufunc)."""
    if method != "__call__":
        raise TypeError(f"numpy.{ufunc.__name__}.{method} on a traced value is not supported; use "
                        f"refopt.autograd.sum / mean for reductions")
    if ufunc in CONSTANT_UFUNCS:
        if "out" in kwargs:
            raise TypeError(f"numpy.{ufunc.__name__} on a traced value: out= is not supported")
        return ufunc(*(value_of(x) for x in inputs), **kwargs)
    if ufunc not in UFUNCS:
        _missing(f"numpy.{ufunc.__name__}")
    _kw(ufunc.__name__, kwargs, ())
    return UFUNCS[ufunc](*inputs)


def array_function(func, args, kwargs):
    """Node.__array_function__: the refopt version of ``func``, or a TypeError naming what is missing."""
    if func not in FUNCTIONS:
        mod = getattr(func, "__module__", None) or "numpy"      # numpy.linalg.norm, not numpy.norm
        _missing(f"{mod if mod.startswith('numpy') else 'numpy'}.{func.__name__}")
    impl, allowed = FUNCTIONS[func]
    return impl(*args, **_kw(func.__name__, kwargs, allowed))


def _install_operators(cls) -> None:
    """Node's operators and NumPy protocol, defined here with the primitives (core does not import ops)."""
    ops = {
        "__add__": lambda self, o: add(self, o), "__radd__": lambda self, o: add(o, self),
        "__sub__": lambda self, o: sub(self, o), "__rsub__": lambda self, o: sub(o, self),
        "__mul__": lambda self, o: mul(self, o), "__rmul__": lambda self, o: mul(o, self),
        "__truediv__": lambda self, o: div(self, o), "__rtruediv__": lambda self, o: div(o, self),
        "__matmul__": lambda self, o: matmul(self, o), "__rmatmul__": lambda self, o: matmul(o, self),
        "__neg__": lambda self: neg(self), "__pow__": lambda self, p: power(self, p),
        "__abs__": lambda self: abs(self), "__getitem__": lambda self, idx: getitem(self, idx),
        "T": property(lambda self: transpose(self)),
        "transpose": lambda self, *axes: transpose(self, axes[0] if len(axes) == 1 else (axes or None)),
        "reshape": lambda self, *shape: reshape(self, shape[0] if len(shape) == 1 else shape),
        "sum": lambda self, axis=None, keepdims=False: sum(self, axis, keepdims),
        "mean": lambda self, axis=None, keepdims=False: mean(self, axis, keepdims),
        "__array_ufunc__": lambda self, ufunc, method, *inputs, **kwargs: array_ufunc(ufunc, method, inputs, kwargs),
        "__array_function__": lambda self, func, types, args, kwargs: array_function(func, args, kwargs),
        "__rpow__": _rpow, "__float__": _to_number("float(x)"), "__int__": _to_number("int(x)"),
        "__complex__": _to_number("complex(x)"), "item": _to_number("x.item()"),
        "tolist": _to_number("x.tolist()"), "__getattr__": _getattr, "__setitem__": _setitem,
    }
    for name, fn in ops.items():
        setattr(cls, name, fn)
    cls.__array_ufunc__.__doc__ = ("np.log1p(x), np.maximum(x, 0), ndarray + x ... run the refopt primitive "
                                   "(traced); comparisons give plain boolean arrays; anything else raises a "
                                   "TypeError naming the missing primitive.")
    cls.__array_function__.__doc__ = ("np.mean(x), np.where(c, x, y), np.clip(x, lo, hi) ... run the refopt "
                                      "primitive; other NumPy functions raise a TypeError listing the "
                                      "differentiable operations.")


_install_operators(Node)
