"""Diagnostics: the quantities the theory of the source documents is about, as pure numpy functions.

Array functions take arrays (float32 or float64, any shape; matrices in refopt's layout (fan_in, fan_out),
``x @ W``, ndim > 2 flattened as :func:`refopt.rules.muon.matrix_shape`); group functions take pytrees.
Every norm is accumulated in float64 (also for float32 input) and returned as a Python float. Nothing
here modifies its inputs.

Step convention (as the posts write it): step t takes the weights w_t *before* the step, the update
direction u_t and the step's learning rate lr_t, w_{t+1} = w_t - lr_t u_t (plus decay, projection...).

Zero norms never give nan. With N(v) = v/||v|| and N(0) = 0 (Hyperball's convention):
  * ``elr`` and ``aus_first_order`` are 0.0 when the step is 0 (lr*||u|| = 0) or when ||w|| = 0 (the
    relative step of a zero array is undefined; it is reported as 0, as Covariant leaves a zero array
    unmoved);
  * ``aus`` is ||N(w_next) - N(w_prev)||, so 0 when both are zero and 1 when exactly one is;
  * ``rms`` of an empty array is 0.0.

Non-floating arrays raise TypeError; mismatched shapes and lr < 0 raise ValueError.

Functions: :func:`rms`, :func:`elr`, :func:`eta_eff`, :func:`aus`, :func:`aus_first_order`,
:func:`rms_operator_norm`, :func:`linear_stability`, :func:`empirical_stability`,
:func:`coordinate_check`, and the group-level :func:`group_labels`, :func:`group_metrics`.
"""
from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import numpy as np

from refopt import tree as T
from refopt.rules.muon import matrix_shape


def _f64(a) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype.kind != "f":
        raise TypeError(f"expected a floating-point array, got dtype {a.dtype}")
    return a.astype(np.float64, copy=False)


def _norm(a) -> float:
    a = _f64(a)
    return float(np.linalg.norm(a.reshape(-1))) if a.size else 0.0


def _unit(a) -> np.ndarray:
    """N(a) = a/||a|| in float64 (flat), N(0) = 0."""
    a = _f64(a).reshape(-1)
    n = _norm(a)
    return a / n if n > 0 else np.zeros_like(a)


def rms(a) -> float:
    r""":math:`\lVert a \rVert_{\text{RMS}} = \lVert a \rVert_F / \sqrt{\text{size}}` (0.0 for an empty array).
    Post 000's update and weight RMS."""
    a = _f64(a)
    return _norm(a) / math.sqrt(a.size) if a.size else 0.0


def elr(w, u, lr: float) -> float:
    r"""Effective learning rate (relative update size), post 000:
    :math:`\mathrm{ELR} = \mathrm{lr}\, \lVert u \rVert_F / \lVert w \rVert_F`.

    w: the weights before the step; u: the update direction (w_next = w - lr*u); lr >= 0 a float.
    Returns 0.0 when ``lr*||u|| = 0`` or ``||w|| = 0`` (see the module docstring). Raises ValueError for lr < 0
    or shapes that differ."""
    if not lr >= 0:
        raise ValueError(f"lr must be >= 0, got {lr!r}")
    if np.shape(w) != np.shape(u):
        raise ValueError(f"w and u have different shapes {np.shape(w)} and {np.shape(u)}")
    nw, nu = _norm(w), _norm(u)
    return float(lr) * nu / nw if nw > 0 and nu > 0 else 0.0


def eta_eff(w, lr: float) -> float:
    r"""Post 002's effective learning rate of Muon: :math:`\eta_{\text{eff}} = \mathrm{lr} / \lVert w \rVert_F`
    (no ``||u||`` factor: Muon's update norm is fixed by the shape). 0.0 for ``||w|| = 0``."""
    if not lr >= 0:
        raise ValueError(f"lr must be >= 0, got {lr!r}")
    nw = _norm(w)
    return float(lr) / nw if nw > 0 else 0.0


def aus(w_prev, w_next) -> float:
    r"""Angular update size, post 000:

    .. math::

        \mathrm{AUS} = \left\lVert \frac{w_{\text{next}}}{\lVert w_{\text{next}} \rVert}
        - \frac{w_{\text{prev}}}{\lVert w_{\text{prev}} \rVert} \right\rVert_F,

    the chord between the directions before and after the step (2 sin(theta/2) for the angle theta
    turned). Range [0, 2]; N(0) = 0, so 0 when both are zero and 1 when exactly one is."""
    if np.shape(w_prev) != np.shape(w_next):
        raise ValueError(f"w_prev and w_next have different shapes {np.shape(w_prev)} and {np.shape(w_next)}")
    return float(np.linalg.norm(_unit(w_next) - _unit(w_prev)))


def aus_first_order(w, u, lr: float, tangent: bool = True) -> float:
    r"""First-order AUS of the step w -> w - lr*u, post 000:

    .. math::

        \text{tangent=True:} \quad &\mathrm{lr}\,
        \lVert u - \tilde w \langle \tilde w, u \rangle \rVert_F / \lVert w \rVert_F
        \qquad (\tilde w = w / \lVert w \rVert\text{; the part of } u \text{ along } w \text{ does not turn } w) \\
        \text{tangent=False:} \quad &\mathrm{lr}\, \lVert u \rVert_F / \lVert w \rVert_F = \mathrm{elr}
        \qquad \text{(post 000's "if } u \text{ is orthogonal to } w\text{")}

    (the tangent=False value is :func:`elr`). Both agree with :func:`aus` to O(lr^2) when u is orthogonal to
    w. 0.0 when ``||w|| = 0`` or ``lr*||u|| = 0``."""
    if not tangent:
        return elr(w, u, lr)
    if not lr >= 0:
        raise ValueError(f"lr must be >= 0, got {lr!r}")
    if np.shape(w) != np.shape(u):
        raise ValueError(f"w and u have different shapes {np.shape(w)} and {np.shape(u)}")
    nw = _norm(w)
    if nw == 0 or lr == 0:
        return 0.0
    wt, uf = _unit(w), _f64(u).reshape(-1)
    return float(lr) * float(np.linalg.norm(uf - wt * float(wt @ uf))) / nw


def _matrix(W) -> np.ndarray:
    W = _f64(W)
    if W.ndim < 2:
        raise ValueError(f"expected a matrix (ndim >= 2, layout (fan_in, fan_out)), got shape {W.shape}")
    return W.reshape(matrix_shape(W.shape))


def rms_operator_norm(W) -> float:
    r""":math:`\lVert W \rVert_{\text{RMS} \to \text{RMS}} = \sqrt{\mathrm{fan\_in} / \mathrm{fan\_out}}\,
    \lVert W \rVert_2` (posts 001 and 003), for the layout x @ W with W (fan_in, fan_out): the largest
    ``||x W||_RMS`` over inputs with ``||x||_RMS = 1``. ``||W||_2`` is the largest singular value (LAPACK
    SVD, float64). 0.0 for an empty matrix. Raises ValueError for ndim < 2."""
    M = _matrix(W)
    if M.size == 0:
        return 0.0
    return math.sqrt(M.shape[0] / M.shape[1]) * float(np.linalg.norm(M, 2))


class Stability(NamedTuple):
    """Post 003's three stability metrics (each should be Theta(1)): ``forward`` max_x ||f(x)||_RMS,
    ``dependency`` max_{x1,x2} ||f(x1) - f(x2)||_RMS, ``update`` max_x ||f(x; w + dw) - f(x; w)||_RMS."""

    forward: float
    dependency: float
    update: float


def linear_stability(W, dW=None) -> Stability:
    r"""The three metrics of post 003 in closed form for a linear layer f(x; W) = x W with an input norm
    (``||x||_RMS = 1``), W of shape (d_in, d_out):

    .. math::

        \text{forward} &= \sqrt{d_{\text{in}} / d_{\text{out}}}\, \lVert W \rVert_2, \quad
        \text{dependency} = 2 \sqrt{d_{\text{in}} / d_{\text{out}}}\, \lVert W \rVert_2, \\
        \text{update} &= \sqrt{d_{\text{in}} / d_{\text{out}}}\, \lVert dW \rVert_2 \qquad \text{(0.0 when dW is None)}

    These are suprema over the RMS-1 sphere; x = sqrt(d_in) times the top left singular vector attains
    them (and -x for the dependency). Raises ValueError for ndim < 2 or dW of another shape."""
    f = rms_operator_norm(W)
    if dW is not None and np.shape(dW) != np.shape(W):
        raise ValueError(f"dW has shape {np.shape(dW)}, W has {np.shape(W)}")
    return Stability(f, 2.0 * f, 0.0 if dW is None else rms_operator_norm(dW))


def _rows(y) -> np.ndarray:
    y = _f64(y)
    return y.reshape(y.shape[0], -1)


def empirical_stability(f: Callable[[Any, np.ndarray], np.ndarray], params, x, dparams=None) -> Stability:
    r"""Post 003's three metrics measured for any function f(params, x) (a layer, a block, a model) over a
    batch of inputs x (N, ...): f must return one output row per input, shape (N, ...).

    .. math::

        \text{forward} &= \max_i \lVert f(x_i) \rVert_{\text{RMS}} \\
        \text{dependency} &= \max_{i,j} \lVert f(x_i) - f(x_j) \rVert_{\text{RMS}}
        \qquad \text{(all } N^2 \text{ pairs)} \\
        \text{update} &= \max_i
        \lVert f(x_i; \text{params} + \text{dparams}) - f(x_i; \text{params}) \rVert_{\text{RMS}}
        \qquad \text{(0.0 when dparams is None)}

    The maxima are over the batch, hence lower bounds of the suprema of :func:`linear_stability`.
    params and dparams are pytrees of the same structure (or arrays). Raises ValueError for an output
    whose first axis is not N."""
    n = len(x)
    y = _rows(f(params, x))
    if y.shape[0] != n:
        raise ValueError(f"f returned {y.shape[0]} rows for {n} inputs; it must map each input to one row")
    fwd = max((rms(r) for r in y), default=0.0)
    sq = np.sum(y * y, axis=1)
    d2 = np.maximum(sq[:, None] + sq[None, :] - 2.0 * (y @ y.T), 0.0)
    dep = math.sqrt(float(d2.max()) / y.shape[1]) if n and y.shape[1] else 0.0
    upd = 0.0
    if dparams is not None:
        moved = T.tree_map(lambda p, d: p + d, params, dparams)
        diff = _rows(f(moved, x)) - y
        upd = max((rms(r) for r in diff), default=0.0)
    return Stability(fwd, dep, upd)


def coordinate_check(widths, init: Callable[[int], Any], rule: Callable[[int], Any], loss: Callable,
                     features: Callable[[Any, np.ndarray], dict], batches, x_probe) -> dict:
    """A muP coordinate check (post 001; Yang et al. 2021): train for k = len(batches) steps at each width
    and record, per layer, the RMS of the activations and of their change, and the RMS of each weight's
    change, on a fixed probe batch.

    widths: the hidden widths n; init(n) -> params; rule(n) -> a refopt rule (e.g. from
    :func:`refopt.mup.mup_partition`); loss(params, x, y) differentiable with refopt.autograd;
    features(params, x) -> {layer name: activations (N, ...)} (plain numpy); batches: a list of (x, y);
    x_probe: the inputs the activations are measured on.

    Returns ``{n: {"act[L]": ||h_L(k)||_RMS, "dact[L]": ||h_L(k) - h_L(0)||_RMS, "dw[path]": ||W_k - W_0||_RMS}}``.
    Under muP every entry is Theta(1) in n (flat curves on a log-log plot); a parametrization that is wrong
    for a layer shows a slope."""
    from refopt import core
    from refopt.autograd import value_and_grad

    vg = value_and_grad(loss)
    out = {}
    for n in widths:
        params = init(n)
        r = rule(n)
        p0 = T.copy(params)
        h0 = {k: _f64(v).copy() for k, v in features(params, x_probe).items()}
        state = core.init(r, params)
        for xb, yb in batches:
            _, g = vg(params, xb, yb)
            params, state = core.update(r, state, params, g)
        row = {}
        for k, v in features(params, x_probe).items():
            row[f"act[{k}]"] = rms(v)
            row[f"dact[{k}]"] = rms(_f64(v) - h0[k])
        for a, b, p in zip(T.leaves(params), T.leaves(p0), T.paths(params)):
            row[f"dw[{p}]"] = rms(_f64(a) - _f64(b))
        out[n] = row
    return out


# ---- group level (pytrees) ----------------------------------------------------------------------------

def group_labels(state, params) -> dict[str, str]:
    """``{leaf path: group}`` for ``refopt.init(rule, params)``'s state: the Partition label of each leaf,
    or ``'all'`` for a rule that is not a Partition."""
    from refopt.rules.partition import PartitionLeaf

    _, paths, td = T.flatten(params)
    ss = T.flatten_up_to(td, state.leaves, name="state.leaves")
    return {p: (s.label if isinstance(s, PartitionLeaf) else "all") for p, s in zip(paths, ss)}


def group_metrics(w_prev, w_next, lrs: dict[str, float], labels: dict[str, str]) -> dict[str, float]:
    r"""Per-group diagnostics of one step w_prev -> w_next (pytrees of the same structure), over each
    group's arrays taken together (concatenated, float64):

    .. math::

        \mathrm{elr}[G] &= \mathrm{lr}_t \lVert U \rVert_F / \lVert W \rVert_F
        = \lVert w_{\text{next}} - w_{\text{prev}} \rVert_F / \lVert w_{\text{prev}} \rVert_F
        \qquad (U = \text{step} / \mathrm{lr}_t) \\
        \mathrm{aus}[G] &= \lVert N(w_{\text{next}}) - N(w_{\text{prev}}) \rVert_F \qquad (N(0) = 0) \\
        \mathrm{w\_rms}[G] &= \lVert w_{\text{prev}} \rVert_{\text{RMS}}, \quad
        \mathrm{u\_rms}[G] = \lVert U \rVert_{\text{RMS}}
        = \lVert w_{\text{next}} - w_{\text{prev}} \rVert_{\text{RMS}} / \mathrm{lr}_t

    lrs: ``{group: lr_t}`` (the step's learning rate of each group); labels: ``{path: group}`` (see
    :func:`group_labels`). The step includes everything the rule does (decay, projection), so a
    Covariant group has elr = its lr exactly (to rounding). Zero norms: elr 0.0 for ``||W|| = 0``; u_rms 0.0
    for lr_t = 0. Returns ``{"elr[G]": ..., "aus[G]": ..., "w_rms[G]": ..., "u_rms[G]": ...}`` for every
    group of ``labels`` (sorted). Raises ValueError for a group without an lr."""
    a, paths, _ = T.flatten(w_prev)
    b, _, _ = T.flatten(w_next)
    groups: dict[str, list[int]] = {}
    for i, p in enumerate(paths):
        groups.setdefault(labels[p], []).append(i)
    out = {}
    for g in sorted(groups):
        if g not in lrs:
            raise ValueError(f"no learning rate for group {g!r} (have {sorted(lrs)})")
        wp = np.concatenate([_f64(a[i]).reshape(-1) for i in groups[g]])
        wn = np.concatenate([_f64(b[i]).reshape(-1) for i in groups[g]])
        step = wn - wp
        lr = float(lrs[g])
        nw, ns = _norm(wp), _norm(step)
        out[f"elr[{g}]"] = ns / nw if nw > 0 else 0.0
        out[f"aus[{g}]"] = aus(wp, wn)
        out[f"w_rms[{g}]"] = rms(wp)
        out[f"u_rms[{g}]"] = rms(step) / lr if lr > 0 else 0.0
    return out
