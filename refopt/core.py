"""The optimizer API and the one tree walk behind it (the reading path).

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

One step of the walk (:func:`_step`), in this order; nothing is written before the last item:

1. validate: params and grads alike (structure, shapes, dtypes); the state exactly what the rule makes for
   these params (:meth:`Rule.leaf_spec`: NamedTuple types, every array's shape and dtype); in place, every
   array writable, C-contiguous and written once;
2. ``ctx, glob = rule.context(t, glob)``: the step's scalars in Python float64;
3. cast every float of ``ctx`` to each array dtype present, checked (:func:`cast_context`: a value that
   overflows, or is non-zero and rounds to 0, raises ``ValueError`` naming it; a step size that rounds to
   0 is a zero step);
4. the gradient gate (:func:`refopt.kernels.reject_bad_grads`): nan/inf, and for second-moment rules a
   magnitude whose square overflows, raise ``FloatingPointError`` naming the leaf;
5. ``grads = rule.prepare(ctx, states, params, grads, paths)``: a whole-tree pre-pass (e.g. clipping by
   the global norm) returning new gradient arrays, never writing the caller's;
6. ``ctx, glob = rule.reduce_tree(ctx, glob, states, params, grads, paths)``: the step's scalars that need
   the whole tree (DoG's distance and gradient sums, in float64), reading and writing nothing but the
   rule-wide state; a changed ``ctx`` is cast again as in item 3;
7. per leaf, ``rule.update_leaf(c, s, x, g, path)`` with ``c`` the cast context of x's dtype.

**Inputs beyond the gradient.** A rule that needs more than the gradient declares it in ``inputs`` (a tuple of
names) and the step takes those as keyword arguments: ``refopt.update(rule, state, params, grads, value=f)``,
as optax's extra arguments. The names and what each must be are in :data:`INPUTS`; ``value`` is the loss at
``params`` (the point the gradients were taken at), ``closure`` a function that evaluates the loss and its
gradients at other params (L-BFGS's line search; the rule calls it on lists of leaves, :class:`Closure`). They are validated in item 1 (:func:`check_inputs`: a
missing or unexpected one raises ``TypeError``, a non-finite value ``FloatingPointError``) and reach the rule
in item 6, after ``reduce_tree``: ``ctx, glob = rule.reduce_inputs(ctx, glob, inputs, ...)``.

The speed layer (:mod:`refopt.fast`) replaces this walk by one with the same checks and the same bits that
remembers what it validated, packs the small gradients and steps many leaves in one compiled call;
``with refopt.fast.reading_path():`` runs the plain walk below instead.

How a rule plugs in (the contract between this walk and the rule math; :class:`Rule` has the defaults):

* ``init_leaf(x, path) -> NamedTuple`` and ``leaf_spec(x, path)``: the state of one array, and what it
  must look like (a tree like the state with :class:`ArraySpec` leaves for arrays and literal values).
* ``init_global()``, ``check_params(paths)``, ``after_init(leaves, paths)``,
  ``context(t, glob) -> (ctx, glob)``, ``prepare(...)``, ``reduce_tree(...)``.
* ``update_leaf(c, s, x, g, path) -> (x, s)`` **writes into** ``x`` and the arrays of ``s`` and must not
  write ``g``. :func:`update` hands it fresh copies and :func:`update_` the caller's own arrays, so both run
  the very same code and give bit-identical numbers.
* ``direction_leaf(c, s, x, g, path) -> (u, s)``, ``eval_leaf(s, x, path) -> array``.
* ``inputs`` and ``reduce_inputs(ctx, glob, inputs, ss, xs, gs, paths)``: the inputs beyond the gradient (above).
* ``squares_grads(s) -> bool`` (second-moment rules), ``decoupled_decay() -> bool`` (decay acting on x, not
  on u; direction wrappers reject it), ``lr_info(ctx) -> {group: lr_t}`` (what :func:`update` reports).

Errors: params/grads trees that differ in structure, shape or dtype raise ``ValueError`` naming the
leaf path (``layers[1].w``); a non-finite gradient raises ``FloatingPointError`` naming the leaf before
anything is written; :func:`update_` on a read-only or non-contiguous array raises ``ValueError``.
"""
from __future__ import annotations

import bisect
import math
import operator
import weakref
from dataclasses import dataclass, fields
from typing import Any, Callable, ClassVar, NamedTuple

import numpy as np

from refopt import tree as T
from refopt.kernels import reject_bad_grads, square_bound
from refopt.scalars import STEP_SIZES, cast_context, cast_scalar  # noqa: F401 (part of the walk's API)


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


#: the inputs a step can take beyond the gradients (keyword arguments of :func:`update`, :func:`update_` and
#: :func:`direction`), for the rules that declare them in ``Rule.inputs``: name -> what it must be
INPUTS = {
    "value": "the loss f(params) at the params the gradients were taken at, a finite real number (e.g. the "
             "first result of refopt.value_and_grad)",
    "closure": "a function closure(params) -> (value, grads) giving the loss and its gradients at other params "
               "(a tree like params; the same data as this step), e.g. lambda p: refopt.value_and_grad(loss)(p, "
               "*batch)",
}


@dataclass(frozen=True)
class Rule:
    """Base class of every rule: a frozen record of hyperparameters plus the per-array hooks above."""

    #: the step's inputs beyond the gradients that this rule needs (names of :data:`INPUTS`)
    inputs: ClassVar[tuple] = ()

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

    def reduce_tree(self, ctx: Any, glob: Any, ss: list, xs: list, gs: list, paths: list[str]) -> tuple[Any, Any]:
        """Whole-tree reductions of the step (after :meth:`prepare`, before any leaf is stepped): returns the
        step context and the rule-wide state (DoG's max distance and gradient sum). Reads ``ss``, ``xs``,
        ``gs`` (the prepared gradients) and writes none of them. Default: ``(ctx, glob)`` unchanged."""
        return ctx, glob

    def reduce_inputs(self, ctx: Any, glob: Any, inputs: dict, ss: list, xs: list, gs: list,
                      paths: list[str]) -> tuple[Any, Any]:
        """What the step's inputs beyond the gradients (``inputs``: {name: value} for the names in
        ``self.inputs``, validated by :func:`check_inputs`) make of the step context and the rule-wide state,
        after :meth:`reduce_tree`; as :meth:`reduce_tree`, it writes nothing. Default: unchanged."""
        return ctx, glob

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

    def direction_leaf(self, ctx: Any, s: Any, x: np.ndarray, g: np.ndarray, path: str):
        raise NotImplementedError(f"{type(self).__name__} has no additive direction u")

    def eval_leaf(self, s: Any, x: np.ndarray, path: str) -> np.ndarray:
        return x

    def hyperparameters(self) -> dict:
        """The rule's fields as a dict (sub-rules and schedules stay objects)."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


class Spans:
    """The sorted, disjoint byte spans [lo, hi) of the arrays an in-place step writes (made and checked
    disjoint by :func:`check_no_aliasing`), for :func:`read_as_handed`."""

    __slots__ = ("lo", "hi")

    def __init__(self, spans: list):
        self.lo, self.hi = [s[0] for s in spans], [s[1] for s in spans]

    def overlaps(self, a: np.ndarray) -> bool:
        if not a.size:
            return False
        lo, hi = _byte_bounds(a)
        j = bisect.bisect_right(self.hi, lo)       # the first span ending after lo (the his are sorted too)
        return j < len(self.lo) and self.lo[j] < hi


def read_as_handed(gs: list, written: Spans | None) -> list:
    """The gradients as the caller handed them: a copy of each one that shares memory with an array an
    in-place step writes (``written``, the spans of :func:`check_no_aliasing`; None: the pure update), so
    that the step reads what :func:`update` reads. Called before anything is written."""
    return gs if written is None else [g.copy() if written.overlaps(g) else g for g in gs]


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


def leaf_spec_leaves(rule: Rule, x: np.ndarray, path: str) -> tuple:
    """(treedef, leaves) of ``rule.leaf_spec(x, path)``."""
    lv, _, td = T.flatten(rule.leaf_spec(x, path), with_paths=False)
    return td, lv


def check_leaf_state(rule: Rule, s: Any, x: np.ndarray, path: str, spec: tuple | None = None) -> None:
    """The per-array state ``s`` must be exactly what ``rule`` makes for ``x`` (:meth:`Rule.leaf_spec`; or
    ``spec``, its :func:`leaf_spec_leaves`): the same NamedTuple types, arrays of the same shapes and dtypes,
    the same fixed values. Otherwise a kernel could index past an array, so this raises ``ValueError``
    naming the path."""
    td, spec = leaf_spec_leaves(rule, x, path) if spec is None else spec
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
    return xs, state_leaves(rule, state, xs, paths, td), paths, td


def state_leaves(rule: Rule, state: Any, xs: list, paths: list[str], td: T.TreeDef) -> list:
    """The per-array states of ``state`` for the already flattened params, each checked."""
    check_rule_state(rule, state)
    ss = T.flatten_up_to(td, state.leaves, name="state.leaves")
    for s, x, p in zip(ss, xs, paths):
        check_leaf_state(rule, s, x, p)
    return ss


def check_rule_state(rule: Rule, state: Any) -> None:
    if not isinstance(rule, Rule):
        raise TypeError(f"expected a refopt rule, got {type(rule).__name__}")
    if not isinstance(state, OptState):
        raise TypeError(f"expected an OptState from refopt.init, got {type(state).__name__}")
    t = state.t
    if isinstance(t, bool) or not isinstance(t, (int, np.integer)) or t < 0:
        raise ValueError(f"state.t must be an int >= 0 (the number of updates applied), got {t!r}")


def check_prepared(rule: Rule, new_gs: list, gs: list, xs: list, paths: list[str]) -> None:
    """``rule.prepare`` must return gradients of the params' shapes and dtypes (ValueError naming the leaf)."""
    for g2, g, x, p in zip(new_gs, gs, xs, paths):
        if g2 is not g and (not isinstance(g2, np.ndarray) or g2.shape != x.shape or g2.dtype != x.dtype):
            got = f"{g2.dtype} {g2.shape}" if isinstance(g2, np.ndarray) else type(g2).__name__
            raise ValueError(f"{type(rule).__name__}.prepare returned a gradient of {got} at {p}, expected "
                             f"{x.dtype} {x.shape}")


def check_inputs(rule: Rule, inputs: dict) -> dict:
    """The step's inputs beyond the gradients, checked against what ``rule`` declares (``rule.inputs``) and
    :data:`INPUTS`: ``{name: value}`` with ``value`` a Python float and ``closure`` the caller's function (made a
    :class:`Closure` on the leaves by :func:`bind_inputs`). Raises ``TypeError`` for an input the rule does not
    take or one it needs and did not get, a value that is not a real number (a bool, an array of more than one
    element) or a closure that is not callable; ``FloatingPointError`` for a value that is nan or inf. Called
    before anything is written."""
    name, wanted = type(rule).__name__, tuple(rule.inputs)
    for k in inputs:
        if k not in wanted:
            takes = f"it takes {', '.join(wanted)}" if wanted else "it takes the gradients only"
            raise TypeError(f"{name} takes no input {k!r} ({takes}; the inputs refopt knows: {', '.join(INPUTS)})")
    out = {}
    for k in wanted:
        if k not in inputs or inputs[k] is None:
            raise TypeError(f"{name} needs the input {k}= at every step: {INPUTS[k]}")
        v = inputs[k]
        if k == "closure":
            if not callable(v):
                raise TypeError(f"{name}: closure must be callable ({INPUTS[k]}), got {type(v).__name__}")
            out[k] = v
            continue
        out[k] = real_number(v, f"{name}: {k}", f" ({INPUTS[k]})")
    return out


def real_number(v: Any, what: str, about: str = "") -> float:
    """``v`` (a Python or numpy number, or an array of one element and ndim <= 1) as a finite Python float;
    ``TypeError`` naming ``what`` for anything else (a bool, a string, a larger array), ``FloatingPointError`` for
    nan or inf. ``about``: what the number is, added to the TypeError."""
    a = np.asarray(v)
    if isinstance(v, (bool, np.bool_)) or a.dtype.kind not in "iuf" or a.size != 1 or a.ndim > 1:
        raise TypeError(f"{what} must be a real number{about}, got {type(v).__name__} {a.dtype} {a.shape}")
    f = float(a.reshape(()))
    if not math.isfinite(f):
        raise FloatingPointError(f"{what} = {f} is not finite; nothing was written")
    return f


class Closure:
    """The step's ``closure`` on lists of leaves, as the rules call it: ``closure(leaves) -> (value, grads)`` with
    ``leaves`` one array per params leaf (in the tree's order; each handed to the caller's function as a fresh
    copy inside a tree like params), ``value`` a Python float and ``grads`` a list of arrays. What the caller's
    function returns is checked before the rule reads it: a pair (value, grads) (``TypeError``), grads a tree like
    params, leaf by leaf of the same shapes and dtypes (``ValueError`` naming the leaf), a finite value and finite
    gradients (``FloatingPointError`` naming the leaf)."""

    def __init__(self, fn: Callable, td: Any, paths: list[str], name: str):
        self.fn, self.td, self.paths, self.name = fn, td, paths, name

    def __call__(self, leaves: list) -> tuple[float, list]:
        tree = T.unflatten(self.td, [np.array(a, order="C", copy=True) for a in leaves])
        out = self.fn(tree)
        if not isinstance(out, tuple) or len(out) != 2:
            raise TypeError(f"{self.name}: closure(params) must return a pair (value, grads), got "
                            f"{type(out).__name__}")
        value, grads = out
        f = real_number(value, f"{self.name}: the closure's value")
        _, gs, _, _ = T.check_like(tree, grads, names=("params", "closure's grads"))
        reject_bad_grads(gs, self.paths, [math.inf] * len(gs), [self.name] * len(gs))
        return f, gs


def bind_inputs(rule: Rule, inputs: dict, td: Any, paths: list[str]) -> dict:
    """``inputs`` (as :func:`check_inputs` returns them) with the caller's ``closure`` made a :class:`Closure` on
    the leaves of the tree ``td``."""
    if "closure" not in inputs:
        return inputs
    return {**inputs, "closure": Closure(inputs["closure"], td, paths, type(rule).__name__)}


try:  # numpy >= 2
    from numpy.lib.array_utils import byte_bounds as _byte_bounds
except ImportError:  # pragma: no cover - numpy 1.x
    _byte_bounds = np.byte_bounds


def check_no_aliasing(xs: list, ss: list, paths: list[str]) -> "Spans":
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
            raise ValueError(f"{p1} and {p2} share memory; update_ would update it twice (is one state "
                             f"object placed at two paths?)")
    return Spans(spans)


def check_writable(xs: list, ss: list, paths: list[str]) -> None:
    for x, s, p in zip(xs, ss, paths):
        for a in [x, *(v for v in T.leaves(s) if isinstance(v, np.ndarray))]:
            if not a.flags.writeable:
                raise ValueError(f"update_ needs writable arrays; the array at {p} is read-only")
            if not a.flags.c_contiguous:
                raise ValueError(f"update_ needs C-contiguous arrays; the array at {p} is not")


#: id(rule) -> (per-leaf states, t) of the last update_ of that rule that advanced its states in place
_ADVANCED: dict = {}


def check_not_stale(rule: Rule, state: OptState, ss: list) -> None:
    """``ValueError`` when ``state`` holds the very per-leaf state objects the last :func:`update_` of
    ``rule`` advanced in place, with that call's old ``t`` (the caller did not rebind what update_
    returned)."""
    last = _ADVANCED.get(id(rule))
    if last is not None and state.t == last[1] and len(ss) == len(last[0]) and all(map(operator.is_, ss, last[0])):
        raise ValueError(f"this state (t = {state.t}) is the one the last update_ of this rule advanced in place "
                         f"and returned with t = {state.t + 1}: rebind what update_ returns, `params, state = "
                         f"refopt.update_(rule, state, params, grads)` (a stale t would redo step "
                         f"{state.t + 1}'s schedule and bias corrections); to redo a step on purpose (arrays "
                         f"restored, t reset), hand a copy, refopt.tree.copy(state), or use refopt.update")


def note_step(rule: Rule, state: OptState, ss: list, out_s: list, inplace: bool) -> None:
    """Remember, for :func:`check_not_stale`, the states an in-place step advanced (or forget them)."""
    if inplace and all(map(operator.is_, out_s, ss)):
        _set_per_rule(_ADVANCED, rule, (ss, state.t))
    else:
        _ADVANCED.pop(id(rule), None)


def step_context(rule: Rule, state: OptState, xs: list):
    """Items 2-3 of the step: (t, ctx, new glob, {dtype: ctx cast to it})."""
    t = state.t + 1
    ctx, glob = rule.context(t, state.glob)
    name = type(rule).__name__
    return t, ctx, glob, {dt: cast_context(ctx, dt, name) for dt in {x.dtype for x in xs}}


def reduced_context(rule: Rule, ctx: Any, glob: Any, casts: dict, ss: list, xs: list, gs: list, paths: list,
                    inputs: dict | None = None):
    """Item 6 of the step: (ctx, glob, casts) after ``rule.reduce_tree`` and, for a rule that takes inputs
    beyond the gradients, ``rule.reduce_inputs`` (``inputs`` as :func:`check_inputs` returns them); the casts
    made again when they changed the context."""
    new_ctx, glob = rule.reduce_tree(ctx, glob, ss, xs, gs, paths)
    if rule.inputs:
        new_ctx, glob = rule.reduce_inputs(new_ctx, glob, inputs or {}, ss, xs, gs, paths)
    if new_ctx is not ctx:
        name = type(rule).__name__
        casts = {dt: cast_context(new_ctx, dt, name) for dt in casts}
    return new_ctx, glob, casts


def grad_bounds(rule: Rule, xs: list, ss: list) -> list:
    """Per leaf, the |g| the gate accepts (:func:`refopt.kernels.square_bound` for second-moment rules)."""
    sb = {dt: square_bound(dt) for dt in {x.dtype for x in xs}}
    return [sb[x.dtype] if rule.squares_grads(s) else math.inf for x, s in zip(xs, ss)]


def step_each(rule: Rule, casts: dict, ss: list, xs: list, gs: list, paths: list, inplace: bool) -> tuple[list, list]:
    """Item 7: ``rule.update_leaf`` per leaf, on the caller's arrays (``inplace``) or on fresh copies."""
    out_x, out_s = [], []
    for x, g, s, p in zip(xs, gs, ss, paths):
        if not inplace:
            x, s = np.array(x, order="C", copy=True), T.copy(s)
        x, s = rule.update_leaf(casts[x.dtype], s, x, g, p)
        out_x.append(x)
        out_s.append(s)
    return out_x, out_s


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


#: the speed layer's step (:func:`refopt.fast.walk.step`, installed by ``import refopt``), or None: the plain
#: walk of :func:`_step` (``refopt.fast.reading_path()`` switches it off for a block)
fast_step: Callable | None = None


def _step(rule: Rule, state: OptState, params: Any, grads: Any, inplace: bool, info: dict | None,
          check: bool = True, inputs: dict | None = None):
    """The step shared by update and update_ (module docstring, items 1-7). Nothing is written before the
    rule's update_leaf."""
    if info is not None and not isinstance(info, dict):
        raise TypeError(f"info must be None or a dict the step records into, got {type(info).__name__}")
    check_rule_state(rule, state)
    inputs = check_inputs(rule, inputs or {})
    if fast_step is not None:
        return fast_step(rule, state, params, grads, inplace, info, check, inputs)
    xs, gs, paths, td = T.check_like(params, grads)
    inputs = bind_inputs(rule, inputs, td, paths)
    ss = state_leaves(rule, state, xs, paths, td)
    written = None
    if inplace:
        check_not_stale(rule, state, ss)
        check_writable(xs, ss, paths)
        written = check_no_aliasing(xs, ss, paths)
    t, ctx, glob, casts = step_context(rule, state, xs)
    if check:
        reject_bad_grads(gs, paths, grad_bounds(rule, xs, ss), [type(rule).__name__] * len(gs))
    new_gs = rule.prepare(ctx, ss, xs, gs, paths)
    check_prepared(rule, new_gs, gs, xs, paths)
    ctx, glob, casts = reduced_context(rule, ctx, glob, casts, ss, xs, new_gs, paths, inputs)
    out_x, out_s = step_each(rule, casts, ss, xs, read_as_handed(new_gs, written), paths, inplace)
    if info is not None:
        info["t"] = t
        info["lr"] = rule.lr_info(ctx)
    note_step(rule, state, ss, out_s, inplace)
    same_x = inplace and all(map(operator.is_, out_x, xs))
    same_s = inplace and all(map(operator.is_, out_s, ss))
    new_params = params if same_x else T.unflatten(td, out_x)
    new_leaves = state.leaves if same_s else T.unflatten(td, out_s)
    return new_params, OptState(t, glob, new_leaves)


def update(rule: Rule, state: OptState, params: Any, grads: Any, info: dict | None = None,
           **inputs) -> tuple[Any, OptState]:
    """One step of ``rule``: returns ``(new_params, new_state)`` as new arrays.

    Pure: ``state``, ``params`` and ``grads`` are never written (read-only arrays are fine). The numbers
    are bit-identical to :func:`update_`, which runs the same kernels on the caller's arrays. When ``info``
    is a dict, the step records what it did there: ``info["t"]`` (the step number) and ``info["lr"]``, the
    learning rate lr*gamma_t applied per parameter group (``{"all": lr_t}``, or one entry per label of a
    :class:`~refopt.rules.partition.Partition`). ``inputs``: what a rule needs beyond the gradients
    (``rule.inputs``, e.g. ``value=`` the loss at ``params`` for Polyak SGD and Momo; ``closure=`` a function
    giving the loss and gradients at other params for L-BFGS; :data:`INPUTS`).

    Raises:
      ValueError: params and grads differ in structure, shape or dtype, the state was not made by
        ``refopt.init(rule, params)`` for arrays like these (the message names the leaf path), or a step
        scalar does not fit the dtype (the message names it).
      TypeError: a leaf is not a float32 / float64 ndarray.
      FloatingPointError: a gradient holds nan or inf, or (second-moment rules) |g| whose square overflows
        (the message names the leaf path); an input (``value``) is nan or inf.
      TypeError: (also) an input the rule needs is missing, or one it does not take is given.
    """
    return _step(rule, state, params, grads, False, info, inputs=inputs)


def update_(rule: Rule, state: OptState, params: Any, grads: Any, check_finite: bool = True,
            info: dict | None = None, **inputs) -> tuple[Any, OptState]:
    """In-place twin of :func:`update` (Julia's ``update!``): writes into the arrays of ``params`` and
    ``state`` and returns them (the same containers, with the new step count). Bit-identical to
    :func:`update`.

    ``check_finite=False`` skips the pass that rejects non-finite gradients (a speed knob; a NaN then
    propagates into the params). ``info`` and ``inputs`` as :func:`update`.

    The fast walk (:mod:`refopt.fast.walk`) handed the same params and state objects as the previous call of
    this rule (the usual training loop) validates only what can have changed: the gradients, and the
    params' shapes, dtypes and writability; the state arrays are checked when the state objects change (a
    new ``init``, a loaded checkpoint).

    The returned state must replace the one handed in (``params, state = update_(...)``): the arrays are
    advanced in place, but ``t`` lives in the immutable :class:`OptState`. A gradient may share memory with
    the params or state: it is read as handed (copied first), as :func:`update` reads it.

    Raises:
      ValueError: a params or state array is read-only or not C-contiguous (it could not be updated in
        place), two params leaves share memory, the trees differ (the message names the leaf path), or the
        state is the one the last ``update_`` of this rule advanced, handed back with its old ``t`` (a guard
        against not rebinding; older states, or states of another rule object, are not recognised).
      FloatingPointError: a gradient leaf holds nan or inf (nothing has been written then).
      TypeError: an input is missing or not taken (as :func:`update`).
    """
    return _step(rule, state, params, grads, True, info, check=bool(check_finite), inputs=inputs)


def direction(rule: Rule, state: OptState, params: Any, grads: Any, **inputs) -> tuple[Any, OptState]:
    """The base direction ``u`` of a rule of the form ``x <- x - lr*gamma_t*u`` (e.g. Adam's
    ``mhat/(sqrt(vhat)+eps)``; SGD's momentum buffer), and the state advanced by one step. Decoupled
    weight decay is not part of ``u``. Pure, like :func:`update`.

    Raises: as :func:`update`, and ``NotImplementedError`` for rules that are not of that form
    (Hyperball, Average, EMA, Schedule-Free, Partition). ``inputs`` as :func:`update`."""
    check_rule_state(rule, state)
    inputs = check_inputs(rule, inputs)
    xs, gs, paths, td = T.check_like(params, grads)
    inputs = bind_inputs(rule, inputs, td, paths)
    ss = state_leaves(rule, state, xs, paths, td)
    t, ctx, glob, casts = step_context(rule, state, xs)
    reject_bad_grads(gs, paths, grad_bounds(rule, xs, ss), [type(rule).__name__] * len(gs))
    gs = rule.prepare(ctx, ss, xs, gs, paths)
    ctx, glob, casts = reduced_context(rule, ctx, glob, casts, ss, xs, gs, paths, inputs)
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
