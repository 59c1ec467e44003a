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

One step of the walk, in this order (nothing is written before the last item):

1. validate: params and grads alike (structure, shapes, dtypes); the state exactly what the rule makes for
   these params (:meth:`Rule.leaf_spec`: NamedTuple types, every array's shape and dtype). The walk
   remembers, per rule object, the params and per-leaf state objects of its last step; handed the very same
   objects again (by identity, with the same shapes and dtypes: the training loop of :func:`update_`, or
   the arrays the last :func:`update` returned) it skips the state check, which nothing can have changed;
   the gradients, new every step, are always checked;
2. ``ctx, glob = rule.context(t, glob)``: the step's scalars in Python float64;
3. cast every float of ``ctx`` to each array dtype present, checked (:func:`cast_context`: a value that
   overflows, or is non-zero and rounds to 0, raises ``ValueError`` naming it; a step size that rounds to
   0 is a zero step);
4. the gradients of the small leaves (below :data:`refopt.kernels.PARALLEL_MIN_SIZE` elements) are copied
   into one flat buffer per dtype (reused from step to step), then the gradient check
   (:func:`refopt.kernels.check_grads`, one pass per buffer and one per large leaf): nan/inf, and for
   second-moment rules a magnitude whose square overflows, raise ``FloatingPointError`` naming the leaf;
5. ``grads = rule.prepare(ctx, states, params, grads, paths)``: a whole-tree pre-pass (e.g. clipping by
   the global norm) returning new gradient arrays, never writing the caller's;
6. ``rule.update_leaves(casts, states, params, grads, paths, walk)``: by default, per leaf,
   ``rule.update_leaf(c, s, x, g, path)`` with ``c`` the cast context of x's dtype; elementwise rules step
   all their small leaves in one compiled call over the packed gradients (:class:`Walk`).

How a rule plugs in (the contract between this walk and the rule math; :class:`Rule` has the defaults):

* ``init_leaf(x, path) -> NamedTuple`` and ``leaf_spec(x, path)``: the state of one array, and what it
  must look like (a tree like the state with :class:`ArraySpec` leaves for arrays and literal values).
* ``init_global()``, ``check_params(paths)``, ``after_init(leaves, paths)``,
  ``context(t, glob) -> (ctx, glob)``, ``prepare(...)``.
* ``update_leaf(c, s, x, g, path) -> (x, s)`` **writes into** ``x`` and the arrays of ``s`` and must not
  write ``g``. :func:`update` hands it fresh copies and :func:`update_` the caller's own arrays, so both run
  the very same code and give bit-identical numbers.
* ``direction_leaf(c, s, x, g, path) -> (u, s)``, ``eval_leaf(s, x, path) -> array``.
* ``squares_grads(s) -> bool`` (second-moment rules), ``decoupled_decay() -> bool`` (decay acting on x, not
  on u; direction wrappers reject it), ``lr_info(ctx) -> {group: lr_t}`` (what :func:`update` reports).

Errors: params/grads trees that differ in structure, shape or dtype raise ``ValueError`` naming the
leaf path (``layers[1].w``); a non-finite gradient raises ``FloatingPointError`` naming the leaf before
anything is written; :func:`update_` on a read-only or non-contiguous array raises ``ValueError``.
"""
from __future__ import annotations

import bisect
import itertools
import math
import operator
import weakref
from dataclasses import dataclass, fields
from typing import Any, NamedTuple

import numpy as np

from refopt import tree as T
from refopt.kernels import PARALLEL_MIN_SIZE, bad_leaves, check_grads, square_bound


class OptState(NamedTuple):
    """Optimizer state: ``t`` updates applied so far, rule-wide ``glob``, per-array ``leaves``."""

    t: int
    glob: Any
    leaves: Any


class ArraySpec:
    """What one state array must be: its ``shape`` and ``dtype`` (a leaf of :meth:`Rule.leaf_spec`)."""

    __slots__ = ("shape", "dtype")

    def __init__(self, shape: tuple, dtype):
        self.shape, self.dtype = tuple(shape), np.dtype(dtype)

    def __repr__(self) -> str:
        return f"{self.dtype} {self.shape}"

    @classmethod
    def like(cls, x: np.ndarray) -> "ArraySpec":
        return cls(x.shape, x.dtype)


@dataclass(frozen=True)
class Rule:
    """Base class of every rule: a frozen record of hyperparameters plus the per-array hooks above."""

    def init_leaf(self, x: np.ndarray, path: str) -> NamedTuple:  # pragma: no cover - abstract
        raise NotImplementedError

    def leaf_spec(self, x: np.ndarray, path: str) -> Any:
        """The state of ``x`` as :class:`ArraySpec` leaves (default: read off ``init_leaf(x, path)``; its
        exceptions propagate). Rules whose ``init_leaf`` refuses some arrays override it."""
        s = self.init_leaf(x, path)
        return T.tree_map(lambda a: ArraySpec.like(a) if isinstance(a, np.ndarray) else a, s)

    def init_global(self) -> Any:
        return None

    def check_params(self, paths: list[str]) -> None:
        """Whole-tree check before the per-leaf init (default: nothing; Partition checks its labels)."""

    def after_init(self, leaves: list, paths: list[str]) -> None:
        """Whole-tree look at the per-leaf states :func:`init` made (default: nothing; Partition warns
        when one of its rules got no parameter)."""

    def context(self, t: int, glob: Any) -> tuple[Any, Any]:
        return t, glob

    def prepare(self, ctx: Any, ss: list, xs: list, gs: list, paths: list[str]) -> list:
        """Whole-tree pre-pass over the gradients before any leaf is stepped (float64 ``ctx``); returns the
        gradients the leaves see. Must not write ``gs`` (return new arrays). Default: ``gs`` unchanged."""
        return gs

    def squares_grads(self, s: Any) -> bool:
        """True when the leaf's step squares the gradient (a second moment), so ``|g|`` must stay below
        :func:`refopt.kernels.square_bound` (checked before anything is written)."""
        return False

    def decoupled_decay(self) -> bool:
        """True when the rule decays x outside its direction u (AdamW's, Muon's, Lion's weight_decay > 0)."""
        return False

    def lr_info(self, ctx: Any) -> dict:
        """The learning rate this step applied, per parameter group: ``{"all": lr_t}`` (or ``{}``)."""
        lr_t = getattr(ctx, "lr_t", None)
        return {} if lr_t is None else {"all": float(lr_t)}

    def update_leaf(self, ctx: Any, s: Any, x: np.ndarray, g: np.ndarray, path: str):  # pragma: no cover
        raise NotImplementedError

    def update_leaves(self, casts: dict, ss: list, xs: list, gs: list, paths: list, walk: "Walk") -> tuple[list, list]:
        """Step every leaf: ``casts`` maps each dtype to the cast step context; returns the new params and
        per-leaf states (lists). With ``walk.inplace`` it writes into ``xs`` and the arrays of ``ss``;
        otherwise it must leave them untouched. Default: :meth:`update_leaf` per leaf, on fresh copies when
        not in place. Rules override it to run many leaves in one compiled call (:class:`Walk`)."""
        out_x, out_s = [], []
        gs = [walk.grad(g) for g in gs]   # before anything is written
        for x, g, s, p in zip(xs, gs, ss, paths):
            if not walk.inplace:
                x, s = np.array(x, order="C", copy=True), T.copy(s)
            x, s = self.update_leaf(casts[x.dtype], s, x, g, p)
            out_x.append(x)
            out_s.append(s)
        return out_x, out_s

    def direction_leaf(self, ctx: Any, s: Any, x: np.ndarray, g: np.ndarray, path: str):
        raise NotImplementedError(f"{type(self).__name__} has no additive direction u")

    def eval_leaf(self, s: Any, x: np.ndarray, path: str) -> np.ndarray:
        return x

    def hyperparameters(self) -> dict:
        """The rule's fields as a dict (sub-rules and schedules stay objects)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


class Walk(NamedTuple):
    """What the tree walk hands :meth:`Rule.update_leaves` besides the leaves.

    * ``inplace``: write into the params and state arrays (:func:`update_`), or leave them untouched and
      return new arrays (:func:`update`);
    * ``packed``: per leaf, ``(buffer, offset)`` when its gradient was copied into a flat buffer of its
      dtype (``buffer[offset:offset + g.size]``, holding the same values as ``g``, flattened in C order;
      small leaves only), else None;
    * ``cache``: a dict the rule may keep derived data in (e.g. compiled lists of its arrays) from one call
      to the next; the walk empties it whenever the params or state objects differ from the last call's
      (:data:`None`: keep nothing);
    * ``layout_cache``: the same for data that depends only on the shapes and dtypes of the leaves and on
      the rule (e.g. how the leaves are grouped); kept while they stay the same;
    * ``written``: in place, the byte spans of the arrays the step writes (None for the pure update), for
      :meth:`grad`, which an ``update_leaves`` reading the caller's gradients calls before writing."""

    inplace: bool
    packed: list
    cache: dict | None
    layout_cache: dict
    written: Any = None

    def sub(self, key: Any, idx: list[int]) -> "Walk":
        """The walk of the leaves ``idx`` handed to a sub-rule (its caches: the entries ``key`` of these)."""
        cache = None if self.cache is None else self.cache.setdefault(("sub", key), {})
        return Walk(self.inplace, [self.packed[i] for i in idx], cache,
                    self.layout_cache.setdefault(("sub", key), {}), self.written)

    def grad(self, g: np.ndarray) -> np.ndarray:
        """``g``, or a copy of it when it shares memory with an array this in-place step writes (``written``:
        the byte spans of the params and state arrays), so that the step reads the gradient as the caller
        handed it, as :func:`update` does. An ``update_leaves`` that reads a caller's gradient after writing
        any array passes every gradient through here before writing anything (the default one does)."""
        return g if self.written is None or not self.written.overlaps(g) else g.copy()


class _Spans:
    """The sorted, disjoint byte spans [lo, hi) of the arrays an in-place step writes (made and checked
    disjoint by :func:`_check_no_aliasing`), for :meth:`Walk.grad`."""

    __slots__ = ("lo", "hi")

    def __init__(self, spans: list):
        self.lo, self.hi = [s[0] for s in spans], [s[1] for s in spans]

    def overlaps(self, a: np.ndarray) -> bool:
        if not a.size:
            return False
        lo, hi = _byte_bounds(a)
        j = bisect.bisect_right(self.hi, lo)       # the first span ending after lo (the his are sorted too)
        return j < len(self.lo) and self.lo[j] < hi


# --- the checked cast of the step scalars ----------------------------------------------------------

#: step sizes (fields of a step context): one that rounds to 0 in the dtype is a zero step (PITFALLS B06:
#: the params stay, nothing becomes nan), not an error; they still must not overflow
STEP_SIZES = frozenset({"lr_t", "step", "lr", "neg_lr", "lr_wd"})


def cast_scalar(value: float, dtype, name: str, allow_underflow: bool = False):
    """``value`` as a scalar of ``dtype``; ``ValueError`` naming it when it is not finite, overflows, or
    (unless ``allow_underflow``) is non-zero and rounds to 0 in ``dtype``."""
    with np.errstate(over="ignore", under="ignore"):
        v = np.dtype(dtype).type(value)
    if not math.isfinite(value) or not np.isfinite(v) or (value != 0 and v == 0 and not allow_underflow):
        what = "is 0 (it underflows)" if np.isfinite(v) else "is not finite (it overflows)"
        raise ValueError(f"{name} = {value!r} {what.replace(' (', f' in {np.dtype(dtype)} (')}; choose "
                         f"hyperparameters that {np.dtype(dtype)} can represent")
    return v


def cast_context(ctx: Any, dtype, name: str) -> Any:
    """``ctx`` with every Python/numpy float cast by :func:`cast_scalar` (named ``name.field``; the fields
    in :data:`STEP_SIZES` may underflow to 0); ints, bools, strings and None kept; NamedTuples, tuples and
    dicts rebuilt recursively."""
    if isinstance(ctx, (bool, np.bool_, int, np.integer, str)) or ctx is None:
        return ctx
    if isinstance(ctx, (float, np.floating)):
        return cast_scalar(float(ctx), dtype, name, allow_underflow=name.rsplit(".", 1)[-1] in STEP_SIZES)
    if isinstance(ctx, dict):
        return {k: cast_context(v, dtype, f"{name}[{k!r}]") for k, v in ctx.items()}
    if isinstance(ctx, tuple):
        names = getattr(type(ctx), "_fields", None)
        vals = [cast_context(v, dtype, f"{name}.{names[i]}" if names else f"{name}[{i}]")
                for i, v in enumerate(ctx)]
        return type(ctx)(*vals) if names else tuple(vals)
    return ctx


# --- validation -----------------------------------------------------------------------------------

def _set_per_rule(table: dict, rule: Rule, value: Any) -> None:
    """``table[id(rule)] = value`` for as long as ``rule`` lives (the entry leaves with it, by
    weakref.finalize, so the table never keeps a rule alive and an id is never reused while cached); a rule
    class without weak references gets no entry."""
    key = id(rule)
    if key not in table:
        try:
            weakref.finalize(rule, table.pop, key, None)
        except TypeError:
            return
    table[key] = value


#: id(rule) -> {(path, dtype, shape): (treedef, leaves)}
_SPECS: dict = {}


def _spec(rule: Rule, x: np.ndarray, path: str):
    """(treedef, leaves) of ``rule.leaf_spec`` for an array like ``x`` at ``path``; cached per rule object
    (without keeping it alive), path, dtype and shape."""
    specs = _SPECS.get(id(rule))
    if specs is None:
        specs = {}
        _set_per_rule(_SPECS, rule, specs)
    key = (path, x.dtype.str, x.shape)
    hit = specs.get(key)
    if hit is None:
        if len(specs) > 8192:
            specs.clear()
        lv, _, td = T.flatten(rule.leaf_spec(x, path), with_paths=False)
        hit = specs[key] = (td, lv)
    return hit


def check_leaf_state(rule: Rule, s: Any, x: np.ndarray, path: str) -> None:
    """The per-array state ``s`` must be exactly what ``rule`` makes for ``x`` (:meth:`Rule.leaf_spec`): the
    same NamedTuple types, arrays of the same shapes and dtypes, the same fixed values. Otherwise a kernel
    could index past an array, so this raises ``ValueError`` naming the path."""
    td, spec = _spec(rule, x, path)
    if td.kind == "namedtuple" and type(s) is td.meta and all(c is T._LEAF for c in td.children):
        sl, sd = list(s), td          # a flat NamedTuple (the common case): its fields are the leaves
    else:
        sl, _, sd = T.flatten(s, with_paths=False)
    if sd != td:
        raise ValueError(f"the state at {path} ({T.first_difference(td, sd)}) is not the state "
                         f"{type(rule).__name__} makes for it; was it made by another rule or for other params?")
    for want, a in zip(spec, sl):
        if isinstance(want, ArraySpec):
            if not isinstance(a, np.ndarray) or a.shape != want.shape or a.dtype != want.dtype:
                got = f"{a.dtype} {a.shape}" if isinstance(a, np.ndarray) else type(a).__name__
                raise ValueError(f"state array at {path} is {got}, expected {want} for params {x.dtype} "
                                 f"{x.shape}; was the state made for other params?")
        elif type(a) is not type(want) or a != want:
            raise ValueError(f"state at {path} holds {a!r} where {type(rule).__name__} expects {want!r}")


def check_state(rule: Rule, state: Any, params: Any) -> tuple[list, list, list, T.TreeDef]:
    """Validate ``state`` against ``rule`` and ``params`` (all of it; see :func:`check_leaf_state`).
    Returns (param leaves, state leaves, paths, treedef)."""
    xs, _, paths, td = T.check_like(params, params, names=("params", "params"))
    return xs, _state_leaves(rule, state, xs, paths, td), paths, td


def _state_leaves(rule: Rule, state: Any, xs: list, paths: list[str], td: T.TreeDef) -> list:
    """The per-array states of ``state`` for the already flattened params, each checked."""
    _check_rule_state(rule, state)
    ss = T.flatten_up_to(td, state.leaves, name="state.leaves")
    for s, x, p in zip(ss, xs, paths):
        check_leaf_state(rule, s, x, p)
    return ss


def _check_rule_state(rule: Rule, state: Any) -> None:
    if not isinstance(rule, Rule):
        raise TypeError(f"expected a refopt rule, got {type(rule).__name__}")
    if not isinstance(state, OptState):
        raise TypeError(f"expected an OptState from refopt.init, got {type(state).__name__}")
    t = state.t
    if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 0:
        raise ValueError(f"state.t must be an int >= 0 (the number of updates applied), got {t!r}")


class _Walked:
    """What the walk remembers of the last step of one rule: the params and per-leaf state objects it
    validated (or made), their layouts, and the rules' :attr:`Walk.cache`. A call handed the very same
    objects (checked by identity; they are kept alive here, so an id cannot be reused) with the same
    shapes and dtypes skips the state validation; the gradients, new every step, are always checked."""

    __slots__ = ("td", "paths", "xs", "layout", "ss", "arrays", "arrays_layout", "cache", "layout_cache", "t_in")

    def __init__(self, td, paths, xs, ss, layout=None, layout_cache=None):
        self.td, self.paths, self.xs, self.ss = td, paths, xs, ss
        self.t_in = None   # state.t of the last update_ that advanced these very objects in place
        self.layout = _layout_of(xs) if layout is None else layout
        # the state arrays (the NamedTuples holding them are immutable, so these are the arrays of any
        # state objects identical to ss) and their layouts, which in-place assignments can change
        self.arrays = _state_arrays(ss)
        self.arrays_layout = _layout_of(self.arrays)
        self.cache: dict = {}                  # tied to these objects
        self.layout_cache: dict = {} if layout_cache is None else layout_cache   # to their layout only


#: id(rule) -> _Walked (:func:`_set_per_rule`): at most one tree per live rule object is kept alive
_WALKED: dict[int, _Walked] = {}


def _state_arrays(ss: list) -> list:
    """The arrays of the per-leaf states ``ss``, in order."""
    ndarray, out = np.ndarray, []
    for s in ss:
        if all(type(a) is ndarray for a in s):    # a flat NamedTuple of arrays (the common case)
            out.extend(s)
        else:
            out.extend(a for a in T.leaves(s) if isinstance(a, np.ndarray))
    return out


def _trusted(rule: Rule, lc: dict) -> bool:
    """True when ``rule`` and every rule nested in it are refopt's own classes (not user subclasses), whose
    steps return states of the right layout by construction (tests/test_walk.py); cached in ``lc``."""
    trusted = lc.get("trusted")
    if trusted is None:
        from refopt.serialize import nested_rules

        trusted = lc["trusted"] = all(type(r).__module__.startswith("refopt.") for r in (rule, *nested_rules(rule)))
    return trusted


def _check_prepared(rule: Rule, new_gs: list, gs: list, xs: list, paths: list[str]) -> None:
    """``rule.prepare`` must return gradients of the params' shapes and dtypes (ValueError naming the leaf)."""
    for g2, g, x, p in zip(new_gs, gs, xs, paths):
        if g2 is not g and (not isinstance(g2, np.ndarray) or g2.shape != x.shape or g2.dtype != x.dtype):
            got = f"{g2.dtype} {g2.shape}" if isinstance(g2, np.ndarray) else type(g2).__name__
            raise ValueError(f"{type(rule).__name__}.prepare returned a gradient of {got} at {p}, expected "
                             f"{x.dtype} {x.shape}")


_SHAPE, _DTYPE, _CARRAY = (operator.attrgetter(a) for a in ("shape", "dtype", "flags.carray"))


def _layout_of(arrays: list) -> tuple[list, list]:
    """(shapes, dtypes) of the ndarrays ``arrays``."""
    return list(map(_SHAPE, arrays)), list(map(_DTYPE, arrays))


def _same_layout(arrays: list, layout: tuple[list, list]) -> bool:
    """True when ``arrays`` are exact ndarrays of the shapes and dtypes of ``layout`` (compared element by
    element in C, no list built)."""
    shapes, dtypes = layout
    return (len(arrays) == len(shapes) and all(map(operator.is_, map(type, arrays), itertools.repeat(np.ndarray)))
            and all(map(operator.eq, map(_SHAPE, arrays), shapes))
            and all(map(operator.eq, map(_DTYPE, arrays), dtypes)))


def _pairs(rule: Rule, state: OptState, params: Any, grads: Any):
    """Flatten params and grads (checked against each other) and pair each leaf with its checked state.
    Returns (xs, gs, ss, paths, td, walked): ``walked`` is the cache entry valid for these objects."""
    _check_rule_state(rule, state)
    xs, _, td = T.flatten(params, with_paths=False)
    w = _WALKED.get(id(rule))
    if w is not None and w.td == td and len(xs) == len(w.xs) and all(map(operator.is_, xs, w.xs)):
        try:
            gs = T.flatten_up_to(td, grads, name="grads")
        except ValueError:
            gs = None
        if gs is not None and _same_layout(gs, w.layout) and _same_layout(xs, w.layout):
            ss = T.flatten_up_to(td, state.leaves, name="state.leaves")
            if all(map(operator.is_, ss, w.ss)) and _same_layout(w.arrays, w.arrays_layout):
                return xs, gs, ss, w.paths, td, w
    xs, gs, paths, td = T.check_like(params, grads)
    ss = _state_leaves(rule, state, xs, paths, td)
    return xs, gs, ss, paths, td, _Walked(td, paths, xs, ss)


try:  # numpy >= 2
    from numpy.lib.array_utils import byte_bounds as _byte_bounds
except ImportError:  # pragma: no cover - numpy 1.x
    _byte_bounds = np.byte_bounds


def _check_no_aliasing(xs: list, ss: list, paths: list[str]) -> _Spans:
    """update_ writes every params leaf and state array once: two sharing memory would be written twice.
    Returns their (disjoint) byte spans."""
    spans = sorted((_byte_bounds(x) + (f"params {p}",)) for x, p in zip(xs, paths) if x.size)
    for (lo1, hi1, p1), (lo2, hi2, p2) in zip(spans, spans[1:]):
        if lo2 < hi1:
            raise ValueError(f"{p1} and {p2.split(' ', 1)[1]} share memory; update_ would update it twice (tie "
                             f"weights by using one leaf twice in the model instead)")
    spans = sorted(spans + [(_byte_bounds(a) + (f"the state at {p}",)) for s, p in zip(ss, paths)
                            for a in T.leaves(s) if isinstance(a, np.ndarray) and a.size])
    for (lo1, hi1, p1), (lo2, hi2, p2) in zip(spans, spans[1:]):
        if lo2 < hi1:
            raise ValueError(f"{p1} and {p2} share memory; update_ would update it twice (was one state "
                             f"object placed at two paths?)")
    return _Spans(spans)


def _check_writable(xs: list, ss: list, paths: list[str]) -> None:
    for x, s, p in zip(xs, ss, paths):
        for a in [x, *(v for v in T.leaves(s) if isinstance(v, np.ndarray))]:
            if not a.flags.writeable:
                raise ValueError(f"update_ needs writable arrays; the array at {p} is read-only")
            if not a.flags.c_contiguous:
                raise ValueError(f"update_ needs C-contiguous arrays; the array at {p} is not")


# --- the API --------------------------------------------------------------------------------------

def init(rule: Rule, params: Any) -> OptState:
    """The initial state of ``rule`` for ``params`` (t = 0). Does not modify ``params``.

    Raises:
      TypeError: a leaf is not a floating-point ndarray.
      ValueError: the rule cannot take a leaf (e.g. Muon on a 1-D array); the message names the path.
    """
    if not isinstance(rule, Rule):
        raise TypeError(f"expected a refopt rule, got {type(rule).__name__}")
    xs, _, paths, td = T.check_like(params, params, names=("params", "params"))
    rule.check_params(paths)
    # rules see C-contiguous arrays, so the state arrays they create are C-contiguous too
    xs = [x if x.flags.c_contiguous else np.array(x, order="C") for x in xs]
    leaves = [rule.init_leaf(x, p) for x, p in zip(xs, paths)]
    for s, x, p in zip(leaves, xs, paths):
        check_leaf_state(rule, s, x, p)
    rule.after_init(leaves, paths)
    return OptState(0, rule.init_global(), T.unflatten(td, leaves))


class _Pack(NamedTuple):
    """Where the small gradients go: per dtype, the leaves (in order) and one flat buffer for them."""

    groups: list      # [(dtype, idx, starts, buffer)]
    packed: list      # per leaf: (buffer, offset) or None


def _pack_layout(xs: list) -> list:
    """The packing of the gradients of the leaves below :data:`PARALLEL_MIN_SIZE` elements, per dtype:
    [(dtype, leaf indices, their starts, total size)]."""
    by_dtype: dict = {}
    for k, x in enumerate(xs):
        if x.size < PARALLEL_MIN_SIZE:
            by_dtype.setdefault(x.dtype, []).append(k)
    layout = []
    for dt, idx in by_dtype.items():
        sizes = [xs[k].size for k in idx]
        starts = np.cumsum([0] + sizes[:-1]).astype(np.int64)
        layout.append((dt, idx, starts, int(sum(sizes))))
    return layout


def _new_pack(layout: list, n: int) -> _Pack:
    """Buffers for the packing ``layout`` of ``n`` leaves."""
    groups, packed = [], [None] * n
    for dt, idx, starts, size in layout:
        buf = np.empty(size, dt)
        for k, o in zip(idx, starts.tolist()):
            packed[k] = (buf, o)
        groups.append((dt, idx, starts, buf))
    return _Pack(groups, packed)


def _fill_pack(pack: _Pack, gs: list) -> None:
    for _, idx, _, buf in pack.groups:
        np.concatenate([gs[k] for k in idx], axis=None, out=buf)


def _check_packed(rule: Rule, pack: _Pack, gs: list, paths: list[str], bounds: list) -> None:
    """The gradient check (:func:`refopt.kernels.check_grads`) in one compiled pass per dtype over the packed
    buffers (each with its group's smallest bound) and the large leaves
    (:func:`refopt.kernels.bad_leaves`); the leaf is named by the per-leaf check, run only when that pass
    finds something."""
    items = [(buf, min(bounds[k] for k in idx), idx) for _, idx, _, buf in pack.groups]
    items += [(gs[k], bounds[k], [k]) for k, pk in enumerate(pack.packed) if pk is None]
    flagged = [k for i in bad_leaves([a for a, _, _ in items], [b for _, b, _ in items]) for k in items[i][2]]
    if flagged:   # the first bad leaf in tree order is named, whatever the dtype groups' order
        idx = sorted(flagged)
        check_grads([gs[k] for k in idx], [paths[k] for k in idx], [bounds[k] for k in idx],
                    [type(rule).__name__] * len(idx))


def _context(rule: Rule, state: OptState, xs: list):
    """Items 2-3 of the step: (t, ctx, new glob, {dtype: ctx cast to it})."""
    t = state.t + 1
    ctx, glob = rule.context(t, state.glob)
    name = type(rule).__name__
    return t, ctx, glob, {dt: cast_context(ctx, dt, name) for dt in {x.dtype for x in xs}}


def _bounds(rule: Rule, lc: dict, xs: list, ss: list) -> list:
    """Per leaf, the |g| the check accepts (:func:`refopt.kernels.square_bound` for second-moment rules),
    cached in the layout cache ``lc``."""
    bounds = lc.get("bounds")
    if bounds is None:
        sb = {dt: square_bound(dt) for dt in {x.dtype for x in xs}}
        bounds = lc["bounds"] = [sb[x.dtype] if rule.squares_grads(s) else math.inf for x, s in zip(xs, ss)]
    return bounds


def _step(rule: Rule, state: OptState, params: Any, grads: Any, inplace: bool, info: dict | None,
          check: bool = True):
    """The step shared by update and update_ (module docstring, items 1-6). Nothing is written before the
    rule's update_leaves."""
    if info is not None and not isinstance(info, dict):
        raise TypeError(f"info must be None or a dict the step records into, got {type(info).__name__}")
    xs, gs, ss, paths, td, w = _pairs(rule, state, params, grads)
    if inplace:
        if w.t_in is not None and state.t == w.t_in:
            raise ValueError(f"this state (t = {state.t}) is the one the last update_ of this rule advanced in place "
                             f"and returned with t = {state.t + 1}: rebind what update_ returns, `params, state = "
                             f"refopt.update_(rule, state, params, grads)` (a stale t would redo step "
                             f"{state.t + 1}'s schedule and bias corrections); to redo a step on purpose (arrays "
                             f"restored, t reset), hand a copy, refopt.tree.copy(state), or use refopt.update")
        # flags can change in place between calls (x.flags.writeable = False), so they are read every call
        if w.cache.get("writable") is not True or not (all(map(_CARRAY, xs)) and all(map(_CARRAY, w.arrays))):
            _check_writable(xs, ss, paths)
            w.cache["written"] = _check_no_aliasing(xs, ss, paths)
            w.cache["writable"] = True
    t, ctx, glob, casts = _context(rule, state, xs)
    lc = w.layout_cache
    layout = lc.get("pack_layout")
    if layout is None:
        layout = lc["pack_layout"] = _pack_layout(xs)
    if inplace:       # buffers reused from call to call
        pack = w.cache.get("pack")
        if pack is None:
            pack = w.cache["pack"] = _new_pack(layout, len(xs))
    else:             # the pure update may run in several threads on the same inputs: buffers of its own
        pack = _new_pack(layout, len(xs))
    _fill_pack(pack, gs)
    if check:
        _check_packed(rule, pack, gs, paths, _bounds(rule, lc, xs, ss))
    new_gs = rule.prepare(ctx, ss, xs, gs, paths)
    if any(map(operator.is_not, new_gs, gs)):
        _check_prepared(rule, new_gs, gs, xs, paths)
        _fill_pack(pack, new_gs)
    walk = Walk(inplace, pack.packed, w.cache.setdefault("rule", {}) if inplace else None,
                lc.setdefault("rule", {}), w.cache["written"] if inplace else None)
    out_x, out_s = rule.update_leaves(casts, ss, xs, new_gs, paths, walk)
    if info is not None:
        info["t"] = t
        info["lr"] = rule.lr_info(ctx)
    same_x = inplace and all(map(operator.is_, out_x, xs))
    same_s = inplace and all(map(operator.is_, out_s, ss))
    if same_x and same_s:
        w.t_in = state.t
        _set_per_rule(_WALKED, rule, w)
    elif _trusted(rule, lc):   # refopt's own rules make valid states: the next call is checked against them
        _set_per_rule(_WALKED, rule, _Walked(td, paths, out_x, out_s, w.layout, lc))
    else:                  # a state made by a user's rule is validated when it comes back
        _WALKED.pop(id(rule), None)
    new_params = params if same_x else T.unflatten(td, out_x)
    new_leaves = state.leaves if same_s else T.unflatten(td, out_s)
    return new_params, OptState(t, glob, new_leaves)


def update(rule: Rule, state: OptState, params: Any, grads: Any, info: dict | None = None) -> tuple[Any, OptState]:
    """One step of ``rule``: returns ``(new_params, new_state)`` as new arrays.

    Pure: ``state``, ``params`` and ``grads`` are never written (read-only arrays are fine). The numbers
    are bit-identical to :func:`update_`, which runs the same kernels on the caller's arrays. When ``info``
    is a dict, the step records what it did there: ``info["t"]`` (the step number) and ``info["lr"]``, the
    learning rate lr*gamma_t applied per parameter group (``{"all": lr_t}``, or one entry per label of a
    :class:`~refopt.rules.partition.Partition`).

    Raises:
      ValueError: params and grads differ in structure, shape or dtype, the state was not made by
        ``refopt.init(rule, params)`` for arrays like these (the message names the leaf path), or a step
        scalar does not fit the dtype (the message names it).
      TypeError: a leaf is not a float32 / float64 ndarray.
      FloatingPointError: a gradient holds nan or inf, or (second-moment rules) |g| whose square overflows
        (the message names the leaf path).
    """
    return _step(rule, state, params, grads, False, info)


def update_(rule: Rule, state: OptState, params: Any, grads: Any, check_finite: bool = True,
            info: dict | None = None) -> tuple[Any, OptState]:
    """In-place twin of :func:`update` (Julia's ``update!``): writes into the arrays of ``params`` and
    ``state`` and returns them (the same containers, with the new step count). Bit-identical to
    :func:`update`.

    ``check_finite=False`` skips the pass that rejects non-finite gradients (a speed knob; a NaN then
    propagates into the params). ``info`` as :func:`update`.

    A call handed the same params and state objects as the previous call of this rule (the usual training
    loop) validates only what can have changed: the gradients, and the params' shapes, dtypes and
    writability; the state arrays are checked when the state objects change (a new ``init``, a loaded
    checkpoint).

    The returned state must replace the one handed in (``params, state = update_(...)``): the arrays are
    advanced in place, but ``t`` lives in the immutable :class:`OptState`. A gradient may share memory with
    the params or state: it is read as handed (copied first), as :func:`update` reads it.

    Raises:
      ValueError: a params or state array is read-only or not C-contiguous (it could not be updated in
        place), two params leaves share memory, the trees differ (the message names the leaf path), or the
        state is the one the last ``update_`` of this rule advanced, handed back with its old ``t`` (a guard
        against not rebinding; older states, or states of another rule object, are not recognised).
      FloatingPointError: a gradient leaf holds nan or inf (nothing has been written then).
    """
    return _step(rule, state, params, grads, True, info, check=bool(check_finite))


def direction(rule: Rule, state: OptState, params: Any, grads: Any) -> tuple[Any, OptState]:
    """The base direction ``u`` of a rule of the form ``x <- x - lr*gamma_t*u`` (e.g. Adam's
    ``mhat/(sqrt(vhat)+eps)``; SGD's momentum buffer), and the state advanced by one step. Decoupled
    weight decay is not part of ``u``. Pure, like :func:`update`.

    Raises: as :func:`update`, and ``NotImplementedError`` for rules that are not of that form
    (Hyperball, Average, EMA, Schedule-Free, Partition)."""
    xs, gs, ss, paths, td, w = _pairs(rule, state, params, grads)
    t, ctx, glob, casts = _context(rule, state, xs)
    check_grads(gs, paths, _bounds(rule, w.layout_cache, xs, ss), [type(rule).__name__] * len(gs))
    gs = rule.prepare(ctx, ss, xs, gs, paths)
    out, new_s = [], []
    for x, g, s, p in zip(xs, gs, ss, paths):
        u, sn = rule.direction_leaf(casts[x.dtype], T.copy(s), x, g, p)
        out.append(u)
        new_s.append(sn)
    return T.unflatten(td, out), OptState(t, glob, T.unflatten(td, new_s))


def eval_params(rule: Rule, state: OptState, params: Any) -> Any:
    """The weights to evaluate: the running average for averaging rules, Schedule-Free's ``x``, and
    ``params`` itself (the same arrays, not copies) for plain rules.

    Raises: ValueError when the state does not belong to ``params`` (as :func:`update`)."""
    xs, ss, paths, td = check_state(rule, state, params)
    return T.unflatten(td, [rule.eval_leaf(s, x, p) for x, s, p in zip(xs, ss, paths)])
