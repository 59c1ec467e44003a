"""The optimizer API and the one tree walk behind it.

A *rule* is an immutable record of hyperparameters (a frozen dataclass deriving from :class:`Rule`).
The public functions are pure, in the style of Optimisers.jl and optax::

    state = refopt.init(rule, params)                                  # OptState(t=0, glob, leaves)
    params, state = refopt.update(rule, state, params, grads)           # new arrays; inputs untouched
    params, state = refopt.update_(rule, state, params, grads)          # in place (Julia's update!)
    u, state = refopt.direction(rule, state, params, grads)            # the direction u of x - lr*gamma_t*u
    x_eval = refopt.eval_params(rule, state, params)                   # weights to evaluate

``params`` and ``grads`` are pytrees (:mod:`refopt.tree`) with floating ndarray leaves; a bare ndarray is
a tree of one leaf. The state is an :class:`OptState` NamedTuple: the step count ``t`` (a Python int,
the number of updates applied so far, so ``t = 1`` during the first update), the rule's global state
``glob`` (scalars shared by all leaves, e.g. Schedule-Free's weight sum) and ``leaves``, a tree shaped
like ``params`` whose leaves are per-array state NamedTuples.

How a rule plugs in (the only contract between this walk and the rule math):

* ``rule.init_leaf(x, path) -> NamedTuple``: the state of one array.
* ``rule.init_global() -> Any``: the rule-wide state (``None`` by default).
* ``rule.context(t, glob) -> (ctx, new_glob)``: once per step, the step's scalars (``lr * gamma_t``,
  bias corrections, ...), computed in Python float64 before any array is touched.
* ``rule.update_leaf(ctx, s, x, g, path) -> (x, s)``: the step for one array. It **writes into** ``x``
  and the arrays of ``s`` and must not write ``g``. :func:`update` hands it fresh copies and
  :func:`update_` the caller's own arrays, so both run the very same code and give bit-identical numbers.
* ``rule.direction_leaf(ctx, s, x, g, path) -> (u, s)``: rules of the form ``x <- x - lr*gamma_t*u``
  return ``u`` (a new array; the state arrays are written in place). Wrapper rules (Hyperball,
  Covariant) build on it.
* ``rule.eval_leaf(s, x, path) -> array``: the weights to evaluate (``x`` by default).

Errors: params/grads trees that differ in structure, shape or dtype raise ``ValueError`` naming the
leaf path (``layers[1].w``); a non-finite gradient raises ``FloatingPointError`` naming the leaf before
anything is written; :func:`update_` on a read-only or non-contiguous array raises ``ValueError``.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, NamedTuple

import numpy as np

from refopt import tree as T
from refopt.kernels import all_finite


class OptState(NamedTuple):
    """Optimizer state: ``t`` updates applied so far, rule-wide ``glob``, per-array ``leaves``."""

    t: int
    glob: Any
    leaves: Any


@dataclass(frozen=True)
class Rule:
    """Base class of every rule: a frozen record of hyperparameters plus the per-array hooks above."""

    def init_leaf(self, x: np.ndarray, path: str) -> NamedTuple:  # pragma: no cover - abstract
        raise NotImplementedError

    def init_global(self) -> Any:
        return None

    def check_params(self, paths: list[str]) -> None:
        """Whole-tree check before the per-leaf init (default: nothing; Partition checks its labels)."""

    def context(self, t: int, glob: Any) -> tuple[Any, Any]:
        return t, glob

    def update_leaf(self, ctx: Any, s: Any, x: np.ndarray, g: np.ndarray, path: str):  # pragma: no cover
        raise NotImplementedError

    def direction_leaf(self, ctx: Any, s: Any, x: np.ndarray, g: np.ndarray, path: str):
        raise NotImplementedError(f"{type(self).__name__} has no additive direction u")

    def eval_leaf(self, s: Any, x: np.ndarray, path: str) -> np.ndarray:
        return x

    def hyperparameters(self) -> dict:
        """The rule's fields as a dict (sub-rules and schedules stay objects)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _pairs(rule: Rule, state: OptState, params: Any, grads: Any | None):
    """Flatten params (and grads, checked against them) and pair each leaf with its state."""
    if not isinstance(rule, Rule):
        raise TypeError(f"expected a refopt rule, got {type(rule).__name__}")
    if not isinstance(state, OptState):
        raise TypeError(f"expected an OptState from refopt.init, got {type(state).__name__}")
    if grads is not None:
        xs, gs, paths, td = T.check_like(params, grads)
    else:
        xs, paths, td = T.flatten(params)
        gs = None
    t = state.t
    if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 0:
        raise ValueError(f"state.t must be an int >= 0 (the number of updates applied), got {t!r}")
    ss = T.flatten_up_to(td, state.leaves, name="state.leaves")
    for s, x, p in zip(ss, xs, paths):
        _check_leaf_state(rule, s, x, p)
    return xs, gs, ss, paths, td


try:  # numpy >= 2
    from numpy.lib.array_utils import byte_bounds as _byte_bounds
except ImportError:  # pragma: no cover - numpy 1.x
    _byte_bounds = np.byte_bounds

_TEMPLATES: dict = {}


def _template(rule: Rule, x: np.ndarray, path: str):
    """What ``rule.init_leaf`` makes for ``x`` at ``path``, as (treedef, [(shape, dtype) of each array, or
    the value of each string]); built once per rule, path, dtype and shape, then cached (the rule is kept
    alive with it; the arrays themselves are not kept)."""
    key = (id(rule), path, x.dtype.str, x.shape)
    hit = _TEMPLATES.get(key)
    if hit is None or hit[0] is not rule:
        if len(_TEMPLATES) > 4096:
            _TEMPLATES.clear()
        try:
            tl, _, td = T.flatten(rule.init_leaf(x if x.flags.c_contiguous else np.array(x, order="C"), path),
                                  with_paths=False)
            spec = [(a.shape, a.dtype) if isinstance(a, np.ndarray) else (a if isinstance(a, str) else None)
                    for a in tl]
        except Exception:  # the rule cannot rebuild a state for the current x: skip the check for this leaf
            spec, td = None, None
        hit = _TEMPLATES[key] = (rule, spec, td)
    return hit[1:]


def _check_leaf_state(rule: Rule, s: Any, x: np.ndarray, path: str) -> None:
    """The per-array state ``s`` must be what ``rule.init_leaf`` makes for ``x``: the same NamedTuple
    types, arrays of the same shapes (x's, or the fixed shape of e.g. a 0-d radius) and dtypes. Otherwise
    a kernel would index past an array, so this raises ``ValueError`` naming the path."""
    if not (isinstance(s, tuple) and hasattr(type(s), "_fields")):
        raise ValueError(f"state.leaves at {path} is a {type(s).__name__}, not the per-array state of "
                         f"{type(rule).__name__}; was the state made for other params?")
    spec, td = _template(rule, x, path)
    if td is None:
        return
    sl, _, sd = T.flatten(s, with_paths=False)
    if sd != td:
        raise ValueError(f"the state at {path} ({T.first_difference(td, sd)}) is not the state "
                         f"{type(rule).__name__} makes; was it made by another rule?")
    for want, a_s in zip(spec, sl):
        if isinstance(want, tuple):
            shape, dtype = want
            if not isinstance(a_s, np.ndarray) or a_s.shape != shape or a_s.dtype != dtype:
                got = f"{a_s.dtype} {a_s.shape}" if isinstance(a_s, np.ndarray) else type(a_s).__name__
                raise ValueError(f"state array at {path} is {got}, expected {dtype} {shape} for params "
                                 f"{x.dtype} {x.shape}; was the state made for other params?")
        elif isinstance(want, str) and a_s != want:
            raise ValueError(f"state at {path} holds {a_s!r} where {type(rule).__name__} expects {want!r}")


def _check_no_aliasing(xs: list, paths: list[str]) -> None:
    """update_ writes every params leaf once: two leaves sharing memory would be written twice."""
    spans = sorted((_byte_bounds(x) + (p,)) for x, p in zip(xs, paths) if x.size)
    for (lo1, hi1, p1), (lo2, hi2, p2) in zip(spans, spans[1:]):
        if lo2 < hi1:
            raise ValueError(f"params {p1} and {p2} share memory; update_ would update it twice (tie weights "
                             f"by using one leaf twice in the model instead)")


def _check_finite(gs: list, paths: list[str]) -> None:
    for g, p in zip(gs, paths):
        if not all_finite(g):
            raise FloatingPointError(f"non-finite gradient (nan or inf) at {p}")


def init(rule: Rule, params: Any) -> OptState:
    """The initial state of ``rule`` for ``params`` (t = 0). Does not modify ``params``.

    Raises:
      TypeError: a leaf is not a floating-point ndarray.
      ValueError: the rule cannot take a leaf (e.g. Muon on a 1-D array); the message names the path.
    """
    xs, _, paths, td = T.check_like(params, params, names=("params", "params"))
    rule.check_params(paths)
    # rules see C-contiguous arrays, so the state arrays they create are C-contiguous too
    leaves = [rule.init_leaf(x if x.flags.c_contiguous else np.array(x, order="C"), p) for x, p in zip(xs, paths)]
    return OptState(0, rule.init_global(), T.unflatten(td, leaves))


def _step(rule: Rule, state: OptState, td: T.TreeDef, xs: list, gs: list, ss: list, paths: list[str], leaf_fn):
    """The step loop shared by update, update_ and direction: the step's context once, then
    ``leaf_fn(ctx, s, x, g, path) -> (array, s)`` on every leaf (the callers decide what may be written)."""
    t = state.t + 1
    ctx, glob = rule.context(t, state.glob)
    out, new_s = [], []
    for x, g, s, p in zip(xs, gs, ss, paths):
        a, sn = leaf_fn(ctx, s, x, g, p)
        out.append(a)
        new_s.append(sn)
    return T.unflatten(td, out), OptState(t, glob, T.unflatten(td, new_s))


def update(rule: Rule, state: OptState, params: Any, grads: Any) -> tuple[Any, OptState]:
    """One step of ``rule``: returns ``(new_params, new_state)`` as new arrays.

    Pure: ``state``, ``params`` and ``grads`` are never written (read-only arrays are fine). The numbers
    are bit-identical to :func:`update_`, which runs the same kernels on the caller's arrays.

    Raises:
      ValueError: params and grads differ in structure, shape or dtype, or the state was not made by
        ``refopt.init(rule, params)`` for arrays like these (the message names the leaf path).
      TypeError: a leaf is not a float32 / float64 ndarray.
      FloatingPointError: a gradient holds nan or inf (the message names the leaf path).
    """
    xs, gs, ss, paths, td = _pairs(rule, state, params, grads)
    _check_finite(gs, paths)
    return _step(rule, state, td, [np.array(x, order="C", copy=True) for x in xs], gs, [T.copy(s) for s in ss],
                 paths, rule.update_leaf)


def update_(rule: Rule, state: OptState, params: Any, grads: Any,
            check_finite: bool = True) -> tuple[Any, OptState]:
    """In-place twin of :func:`update` (Julia's ``update!``): writes into the arrays of ``params`` and
    ``state`` and returns them (with the new step count). Bit-identical to :func:`update`.

    ``check_finite=False`` skips the pass that rejects non-finite gradients (a speed knob; a NaN then
    propagates into the params).

    Raises:
      ValueError: a params or state array is read-only or not C-contiguous (it could not be updated in
        place), two params leaves share memory, or the trees differ (the message names the leaf path).
      FloatingPointError: a gradient leaf holds nan or inf (nothing has been written then).
    """
    xs, gs, ss, paths, td = _pairs(rule, state, params, grads)
    for x, s, p in zip(xs, ss, paths):
        for a in [x, *(v for v in T.leaves(s) if isinstance(v, np.ndarray))]:
            if not a.flags.writeable:
                raise ValueError(f"update_ needs writable arrays; the array at {p} is read-only")
            if not a.flags.c_contiguous:
                raise ValueError(f"update_ needs C-contiguous arrays; the array at {p} is not")
    _check_no_aliasing(xs, paths)
    if check_finite:
        _check_finite(gs, paths)
    return _step(rule, state, td, xs, gs, ss, paths, rule.update_leaf)


def direction(rule: Rule, state: OptState, params: Any, grads: Any) -> tuple[Any, OptState]:
    """The base direction ``u`` of a rule of the form ``x <- x - lr*gamma_t*u`` (e.g. Adam's
    ``mhat/(sqrt(vhat)+eps)``; SGD's momentum buffer), and the state advanced by one step. Decoupled
    weight decay is not part of ``u``. Pure, like :func:`update`.

    Raises: as :func:`update`, and ``NotImplementedError`` for rules that are not of that form
    (Hyperball, Average, EMA, Schedule-Free, Partition)."""
    xs, gs, ss, paths, td = _pairs(rule, state, params, grads)
    _check_finite(gs, paths)
    return _step(rule, state, td, xs, gs, [T.copy(s) for s in ss], paths, rule.direction_leaf)


def eval_params(rule: Rule, state: OptState, params: Any) -> Any:
    """The weights to evaluate: the running average for averaging rules, Schedule-Free's ``x``, and
    ``params`` itself (the same arrays, not copies) for plain rules.

    Raises: ValueError when the state does not belong to ``params`` (as :func:`update`)."""
    xs, _, ss, paths, td = _pairs(rule, state, params, None)
    return T.unflatten(td, [rule.eval_leaf(s, x, p) for x, s, p in zip(xs, ss, paths)])
