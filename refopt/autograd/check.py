"""Gradient checking by the dot-product (VJP) test against central finite differences, in float64.

For a scalar f and a random unit direction v in params space (as HIPS/autograd's ``check_vjp``):

    analytic  = <grad f(p), v>
    numeric   = (f(p + eps v) - f(p - eps v)) / (2 eps)
    rel_error = |analytic - numeric| / max(|analytic|, |numeric|)

One comparison covers the whole Jacobian in expectation; the per-leaf variant moves one leaf at a time
so that a failure names the leaf path.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .. import tree as _tree
from .core import value, value_and_grad


def _as_float64(params: Any) -> tuple[list, list[str], Any]:
    leaves, paths, treedef = _tree.flatten(params)
    out = []
    for path, leaf in zip(paths, leaves):
        a = np.asarray(leaf)
        if a.dtype.kind != "f":
            raise TypeError(f"check_grads: params leaf {path} has dtype {a.dtype}; expected floating")
        out.append(a.astype(np.float64))
    return out, paths, treedef


def _scalar(f: Callable, treedef, leaves: list, args, kwargs) -> float:
    return float(np.asarray(value(f(_tree.unflatten(treedef, leaves), *args, **kwargs))).reshape(()))


def _compare(f, treedef, leaves, grads, direction, eps, args, kwargs) -> tuple[float, float, float]:
    analytic = float(sum(np.vdot(g, d) for g, d in zip(grads, direction)))
    plus = [p + eps * d for p, d in zip(leaves, direction)]
    minus = [p - eps * d for p, d in zip(leaves, direction)]
    numeric = (_scalar(f, treedef, plus, args, kwargs) - _scalar(f, treedef, minus, args, kwargs)) / (2 * eps)
    if not (np.isfinite(analytic) and np.isfinite(numeric)):
        return float("nan"), analytic, numeric            # a NaN or inf anywhere is a failure, never 0
    scale = max(abs(analytic), abs(numeric))
    return (abs(analytic - numeric) / scale if scale > 0 else 0.0), analytic, numeric


def _unit_direction(rng: np.random.Generator, leaves: list, mask: list[bool] | None = None) -> list:
    d = [rng.standard_normal(p.shape) * (1.0 if mask is None or mask[i] else 0.0) for i, p in enumerate(leaves)]
    norm = np.sqrt(sum(float(np.vdot(x, x)) for x in d))
    return [x / norm for x in d] if norm > 0 else d


def check_grads(f: Callable, params: Any, *args: Any, eps: float = 1e-6, rtol: float = 1e-6,
                seed: int = 0, **kwargs: Any) -> float:
    """Dot-product test of ``value_and_grad(f)`` against central differences, in float64.

    ``f(params, *args, **kwargs)`` must return a scalar; ``params`` is a pytree of floating arrays, cast
    to float64 copies (the inputs are not modified). The direction v is a standard normal draw from
    ``np.random.default_rng(seed)``, normalised to unit length over all leaves.

    Returns: the relative error |<g, v> - fd| / max(|<g, v>|, |fd|) (0.0 when both are 0).
    Raises: AssertionError above ``rtol``; the message gives both numbers and the worst leaf paths
    (found by a per-leaf pass). TypeError for non-floating leaves.
    """
    return _check("check_grads", f, None, params, args, kwargs, eps, rtol, seed)


def check_grad_fn(f: Callable, grad_f: Callable, params: Any, args: tuple = (), kwargs: dict | None = None,
                  eps: float = 1e-6, rtol: float = 1e-6, seed: int = 0) -> float:
    """The dot-product test of a hand-written gradient ``grad_f(params, *args, **kwargs)`` (a pytree
    shaped like ``params``) against central differences of ``f``, in float64, as :func:`check_grads`.

    ``f``'s own arguments are passed as the tuple ``args`` and the dict ``kwargs`` (not as keywords of
    this function), so every keyword name stays free for ``f``; ``f`` may be plain NumPy (no tracing).
    Returns the relative error; raises AssertionError above ``rtol`` naming the worst leaves, TypeError
    for non-floating leaves, ValueError if ``grad_f`` returns a tree of another structure or shapes.
    """
    return _check("check_grad_fn", f, grad_f, params, tuple(args), dict(kwargs or {}), eps, rtol, seed)


def _gradient(f, grad_f, treedef, leaves, paths, args, kwargs) -> list:
    params = _tree.unflatten(treedef, leaves)
    if grad_f is None:
        return _tree.leaves(value_and_grad(f)(params, *args, **kwargs)[1])
    g_tree = grad_f(params, *args, **kwargs)
    _tree.check_same_structure(params, g_tree, names=("params", "grad_f(params)"))
    grads = [np.asarray(g, dtype=np.float64) for g in _tree.leaves(g_tree)]
    for g, x, p in zip(grads, leaves, paths):
        if g.shape != x.shape:
            raise ValueError(f"check_grad_fn: grad_f gives shape {g.shape} at {p}, the params leaf has {x.shape}")
    return grads


def _check(name, f, grad_f, params, args, kwargs, eps, rtol, seed) -> float:
    leaves, paths, treedef = _as_float64(params)
    grads = _gradient(f, grad_f, treedef, leaves, paths, args, kwargs)
    rng = np.random.default_rng(seed)
    err, a, n = _compare(f, treedef, leaves, grads, _unit_direction(rng, leaves), eps, args, kwargs)
    if not err <= rtol:                   # a NaN error (NaN gradient or value) fails too
        per_leaf = _per_leaf(f, grad_f, params, args, kwargs, eps, seed)
        worst = sorted(per_leaf.items(), key=lambda kv: -kv[1])[:3]
        names = ", ".join(f"{p} ({e:.2e})" for p, e in worst)
        raise AssertionError(f"{name}: relative error {err:.3e} > rtol {rtol:.1e} "
                             f"(<grad, v> = {a!r}, finite difference = {n!r}); worst leaves: {names}")
    return err


def _per_leaf(f, grad_f, params, args, kwargs, eps, seed) -> dict[str, float]:
    leaves, paths, treedef = _as_float64(params)
    grads = _gradient(f, grad_f, treedef, leaves, paths, args, kwargs)
    rng = np.random.default_rng(seed)
    errors = {}
    for i, path in enumerate(paths):
        mask = [j == i for j in range(len(leaves))]
        errors[path] = _compare(f, treedef, leaves, grads, _unit_direction(rng, leaves, mask), eps, args, kwargs)[0]
    return errors


def check_grads_per_leaf(f: Callable, params: Any, *args: Any, eps: float = 1e-6, rtol: float = 1e-6,
                         seed: int = 0, **kwargs: Any) -> dict[str, float]:
    """The dot-product test run once per leaf (the direction v is zero outside that leaf).

    Returns: ``{leaf path: relative error}``. Raises: AssertionError naming every leaf above ``rtol``.
    """
    errors = _per_leaf(f, None, params, args, kwargs, eps, seed)
    bad = {p: e for p, e in errors.items() if not e <= rtol}
    if bad:
        raise AssertionError("check_grads_per_leaf: relative error above rtol "
                             f"{rtol:.1e} at " + ", ".join(f"{p} ({e:.2e})" for p, e in bad.items()))
    return errors
