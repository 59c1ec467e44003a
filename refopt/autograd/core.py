"""The tape: traced array nodes, the iterative backward pass, and ``value_and_grad`` / ``grad``.

Design (after HIPS/autograd's ``backward_pass`` and micrograd's closures)
------------------------------------------------------------------------
* A :class:`Node` holds ``value`` (an ndarray), ``parents`` (the inputs of the primitive that made it:
  nodes or constants) and ``vjp``, a closure built at forward time that maps the output cotangent ``g``
  (same shape as ``value``) to a tuple of input cotangents, one per parent (``None`` for constants and
  for inputs that need no gradient).
* :func:`backward` walks the graph in reverse topological order found *iteratively* (no recursion, so a
  chain of any length works), seeds the output with 1, and sums the cotangents a node receives from its
  several consumers (fan-out) as ``acc = acc + g``: always a new array, never an in-place ``+=`` into an
  array that another node may still hold.
* Nothing is stored on the parameters: ``grad(f)(params)`` traces a fresh graph every call and returns a
  fresh pytree of gradients, so repeated calls give identical results (PITFALLS.md B18).
* Primitives (``ops.py``, ``nn.py``) return plain ndarrays when none of their inputs is a node, so model
  code written with them runs both on plain arrays and under tracing.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .. import tree as _tree


class Node:
    """A traced ndarray: the output of a primitive, or a parameter leaf being differentiated.

    Supports (installed by :mod:`refopt.autograd.ops`) the arithmetic operators (``+ - * / @ **``, unary
    ``-``, ``abs``), comparisons ``< <= > >=``
    (plain boolean arrays, not differentiable), indexing, ``.T``, ``.reshape``, ``.transpose``, ``.sum``,
    ``.mean``, the read-only attributes ``shape``, ``ndim``, ``dtype``, ``size``, and the NumPy
    functions that have a refopt primitive (``np.mean``, ``np.log1p``, ``np.where`` ...: see
    :func:`refopt.autograd.ops.differentiable_names`); other NumPy functions raise TypeError, and so do
    ``float(x)``, ``int(x)``, ``x.item()``, ``x.tolist()`` (they would drop the gradient: use
    ``refopt.autograd.value(x)``), ``c ** x`` (only constant exponents) and ``x[idx] = v``; each message
    lists what is supported. A missing attribute (``x.std``) is an AttributeError that lists it. Constants
    (Python numbers, ndarrays) mix freely; a floating constant is cast to the node's dtype so that float32
    stays float32.
    """

    __slots__ = ("value", "parents", "vjp", "__weakref__")
    __array_priority__ = 100.0

    def __array__(self, dtype=None, copy=None):
        raise TypeError("np.asarray / np.array on a traced Node would drop the gradient; use "
                        "refopt.autograd.value(x) for the number, or a refopt.autograd primitive")

    def __init__(self, value: np.ndarray, parents: tuple = (), vjp: Callable | None = None):
        self.value = value
        self.parents = parents
        self.vjp = vjp

    # ---- array-like attributes -------------------------------------------------------------------
    shape = property(lambda self: self.value.shape)
    ndim = property(lambda self: self.value.ndim)
    dtype = property(lambda self: self.value.dtype)
    size = property(lambda self: self.value.size)

    def __len__(self) -> int:
        return len(self.value)

    def __repr__(self) -> str:
        return f"Node(shape={self.value.shape}, dtype={self.value.dtype})"

    def __bool__(self):
        raise TypeError("a traced Node has no truth value; branch on .value outside the traced math")

    # ---- the arithmetic operators, ``.T``, ``.reshape`` ... and NumPy's ``__array_ufunc__`` /
    # ``__array_function__`` are installed on this class by refopt.autograd.ops (which defines the primitives),
    # so that this module does not import ops. Comparisons are not differentiable: plain boolean arrays.
    def __lt__(self, o): return self.value < value(o)
    def __le__(self, o): return self.value <= value(o)
    def __gt__(self, o): return self.value > value(o)
    def __ge__(self, o): return self.value >= value(o)


def is_node(x: Any) -> bool:
    """True if ``x`` is a traced :class:`Node`."""
    return isinstance(x, Node)


def value(x: Any) -> Any:
    """The ndarray behind ``x`` (``x`` itself when it is not a node)."""
    return x.value if isinstance(x, Node) else x


def unbroadcast(g: np.ndarray, shape: tuple, dtype: np.dtype | None = None) -> np.ndarray:
    """Sum ``g`` over the axes that broadcasting added to or stretched in an operand of ``shape``.

    Leading extra axes are summed away, then axes where ``shape`` has size 1 are summed with keepdims
    (HIPS/autograd ``unbroadcast``; PITFALLS.md B19). The result has exactly ``shape`` and, when given,
    ``dtype``.
    """
    if g.shape != shape:
        extra = g.ndim - len(shape)
        if extra:
            g = g.sum(axis=tuple(range(extra)))
        stretched = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
        if stretched:
            g = g.sum(axis=stretched, keepdims=True)
    if dtype is not None and g.dtype != dtype:
        g = g.astype(dtype)
    return g


def toposort(out: Node) -> list[Node]:
    """Nodes reachable from ``out``, each before all of its parents (reverse topological order).

    Iterative depth-first post-order with an explicit stack, so graph depth is unlimited.
    """
    order: list[Node] = []
    seen: set[int] = set()
    stack: list[tuple[Node, bool]] = [(out, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        for p in node.parents:
            if isinstance(p, Node) and id(p) not in seen:
                stack.append((p, False))
    order.reverse()
    return order


def backward(out: Node, leaves: list[Node]) -> list[np.ndarray | None]:
    """Cotangents of the scalar ``out`` with respect to each node in ``leaves`` (``None`` if unused).

    The seed is ``1`` in ``out``'s dtype. Each node's incoming cotangents are summed into a fresh array.
    """
    grads: dict[int, np.ndarray] = {id(out): np.ones(out.value.shape, dtype=out.value.dtype)}
    leaf_ids = {id(n) for n in leaves}
    found: dict[int, np.ndarray] = {}
    for node in toposort(out):
        g = grads.pop(id(node), None)
        if g is None:
            continue
        if id(node) in leaf_ids:
            found[id(node)] = g
        if node.vjp is None:
            continue
        cts = node.vjp(g)
        for p, ct in zip(node.parents, cts):
            if ct is None or not isinstance(p, Node):
                continue
            k = id(p)
            grads[k] = ct if k not in grads else grads[k] + ct  # new array: no aliasing
    return [found.get(id(n)) for n in leaves]


def _owned(g: np.ndarray, like: np.ndarray, seen: set[int]) -> np.ndarray:
    """``g`` as a C-contiguous array of ``like``'s dtype that no other returned gradient shares."""
    fresh = g.dtype == like.dtype and g.flags.owndata and g.flags.c_contiguous and id(g) not in seen
    out = g if fresh else np.array(g, dtype=like.dtype, order="C", copy=True)
    seen.add(id(out))
    return out


_SCALAR = "f must return a scalar (a 0-d or size-1 Node, e.g. ag.sum(...) or ag.mean(...))"


def _scalar_output(out: Any) -> np.ndarray:
    """The value of ``f``'s output ``out`` as an ndarray, after checking that ``out`` is a size-1 Node.

    Raises TypeError for a non-numeric output, ValueError for a non-scalar one or for a plain number /
    ndarray (the tape was dropped: the output does not depend on any traced parameter).
    """
    if isinstance(out, Node):
        v = np.asarray(out.value)
        if v.size != 1:
            raise ValueError(f"value_and_grad: {_SCALAR}; got a Node of shape {v.shape}")
        return v
    numeric = isinstance(out, (int, float, np.number, np.ndarray)) and not isinstance(out, bool)
    if not numeric or np.asarray(out).dtype.kind not in "fiu":
        what = (f"an ndarray of dtype {out.dtype}" if isinstance(out, np.ndarray)
                else f"{type(out).__name__} {out!r}"[:80])
        raise TypeError(f"value_and_grad: {_SCALAR}; got {what}")
    v = np.asarray(out)
    if v.size != 1:
        raise ValueError(f"value_and_grad: {_SCALAR}; got an ndarray of shape {v.shape}")
    raise ValueError("value_and_grad: f's output does not depend on params (did you use .value or numpy "
                     f"functions on traced nodes?); f returned a plain {type(out).__name__}, not a Node")


def value_and_grad(f: Callable) -> Callable:
    """Return ``vg(params, *args) -> (value, grads)`` for a scalar function ``f(params, *args)``.

    ``params`` is a pytree (``refopt.tree``) of floating ndarrays; ``f`` receives the same tree with
    every leaf replaced by a traced :class:`Node` and must return a scalar node (shape ``()`` or size 1).
    ``*args`` are passed through untouched (data, targets, a config ...) and are not differentiated.

    Returns ``value`` (a NumPy scalar of the output's dtype) and ``grads``: a pytree with ``params``'
    structure whose leaves are new C-contiguous ndarrays of each leaf's shape and dtype (zeros for a
    leaf that ``f`` does not use). Nothing is cached between calls.

    A Node output that some leaves do not reach gives those leaves zero gradients (an unused
    parameter). An output that is not a Node at all means no parameter reached it -- typically ``f``
    read ``.value`` or called a NumPy function on a traced node, which silently drops the tape -- and
    is an error rather than an all-zero gradient.

    Raises:
      TypeError: a leaf of ``params`` is not a floating ndarray; or ``f`` returns something that is not
        a number (None, a string, a list, a dict ...).
      ValueError: ``f`` returns a node or array that is not a scalar (size != 1); or ``f`` returns a
        plain number / ndarray instead of a Node, i.e. its output does not depend on ``params``.
    """

    def vg(params: Any, *args: Any, **kwargs: Any):
        leaves, paths, treedef = _tree.flatten(params)
        for path, leaf in zip(paths, leaves):
            if not isinstance(leaf, np.ndarray) or leaf.dtype.kind != "f":
                what = (f"an ndarray of dtype {leaf.dtype}" if isinstance(leaf, np.ndarray)
                        else f"a {type(leaf).__name__}")
                raise TypeError(f"value_and_grad: params leaf {path} is {what}; expected a floating ndarray")
        nodes = [Node(leaf) for leaf in leaves]
        out = f(_tree.unflatten(treedef, nodes), *args, **kwargs)
        out_value = _scalar_output(out)
        if out.value.shape != ():
            out = out.reshape(())
        cts = backward(out, nodes)
        seen: set[int] = set()
        grads = [np.zeros_like(leaf) if g is None else _owned(g, leaf, seen) for g, leaf in zip(cts, leaves)]
        return out_value.reshape(())[()], _tree.unflatten(treedef, grads)

    vg.__name__ = f"value_and_grad({getattr(f, '__name__', 'f')})"
    vg.__doc__ = value_and_grad.__doc__
    return vg


def grad(f: Callable) -> Callable:
    """Return ``g(params, *args) -> grads``: the gradient part of :func:`value_and_grad` ``(f)``."""
    vg = value_and_grad(f)

    def g(params: Any, *args: Any, **kwargs: Any):
        return vg(params, *args, **kwargs)[1]

    g.__name__ = f"grad({getattr(f, '__name__', 'f')})"
    return g

