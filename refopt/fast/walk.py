"""The fast tree walk: :func:`refopt.core._step` with the same checks and the same bits, faster.

What it adds to the reading path (and why each keeps the bits):

* **the identity cache** (:class:`_Walked`): per rule object, the params and per-leaf state objects of its
  last step. Handed the very same objects again (by identity, with the same shapes and dtypes: the
  training loop of :func:`refopt.update_`, or the arrays the last :func:`refopt.update` returned), the walk
  skips the state validation, which nothing can have changed; the gradients, new every step, are always
  checked; the leaf specs (:meth:`~refopt.core.Rule.leaf_spec`) are cached per rule, path, shape and dtype;
* **the packing**: the gradients of the small leaves (below :data:`refopt.kernels.PARALLEL_MIN_SIZE`
  elements) are copied into one flat buffer per dtype (reused from step to step), so the gradient gate is
  one compiled pass per buffer and per large leaf (:func:`refopt.fast.many.bad_leaves`) and an elementwise
  rule steps all its small leaves in one compiled call (:class:`refopt.fast.many.StepMany`);
* **the batched steps** (:func:`step_leaves`): elementwise rules over the packed buffers, a Partition's
  labels each as a group, a clipped rule through its base, Muon's matrices orthogonalised on parallel
  threads in chunks. A user subclass that overrides a per-leaf hook of these rules goes leaf by leaf
  (:func:`overrides`), so its own step is never bypassed.

Every step writes what :func:`refopt.core.step_each` writes: the same per-element loops on the same
values, only grouped differently (``tests/test_fast_layer.py`` runs the whole rule catalog both ways).
"""
from __future__ import annotations

import itertools
import operator
from typing import Any, NamedTuple

import numpy as np

from refopt import core as C
from refopt import tree as T
from refopt.core import OptState, Rule
from refopt.fast.many import StepMany, bad_leaves
from refopt.kernels import AXPBY, PARALLEL_MIN_SIZE, reject_bad_grads
from refopt.linalg._msign import newton_schulz_many
from refopt.rules.base import ElementwiseRule, rewrap
from refopt.rules.clip import ClipByGlobalNorm
from refopt.rules.muon import _MOMENTUM, Muon, matrix_shape
from refopt.rules.partition import Partition, PartitionLeaf
from refopt.serialize import nested_rules


# --- the identity cache ------------------------------------------------------------------------------

class _Walked:
    """What the walk remembers of the last step of one rule: the params and per-leaf state objects it
    validated (or made), their layouts, and the rules' :attr:`Walk.cache`. A call handed the very same
    objects (checked by identity; they are kept alive here, so an id cannot be reused) with the same
    shapes and dtypes skips the state validation; the gradients, new every step, are always checked."""

    __slots__ = ("td", "paths", "xs", "layout", "ss", "arrays", "arrays_layout", "cache", "layout_cache")

    def __init__(self, td, paths, xs, ss, layout=None, layout_cache=None):
        self.td, self.paths, self.xs, self.ss = td, paths, xs, ss
        self.layout = _layout_of(xs) if layout is None else layout
        # the state arrays (the NamedTuples holding them are immutable, so these are the arrays of any
        # state objects identical to ss) and their layouts, which in-place assignments can change
        self.arrays = _state_arrays(ss)
        self.arrays_layout = _layout_of(self.arrays)
        self.cache: dict = {}                  # tied to these objects
        self.layout_cache: dict = {} if layout_cache is None else layout_cache   # to their layout only


#: id(rule) -> _Walked (:func:`refopt.core._set_per_rule`): at most one tree per live rule object is kept alive
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
    steps return states of the right layout by construction (``tests/test_walk.py``); cached in ``lc``."""
    trusted = lc.get("trusted")
    if trusted is None:
        trusted = lc["trusted"] = all(type(r).__module__.startswith("refopt.") for r in (rule, *nested_rules(rule)))
    return trusted


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


#: id(rule) -> {(path, dtype, shape): (treedef, leaves)}
_SPECS: dict = {}


def _spec(rule: Rule, x: np.ndarray, path: str):
    """(treedef, leaves) of ``rule.leaf_spec`` for an array like ``x`` at ``path``; cached per rule object
    (without keeping it alive), path, dtype and shape."""
    specs = _SPECS.get(id(rule))
    if specs is None:
        specs = {}
        C._set_per_rule(_SPECS, rule, specs)
    key = (path, x.dtype.str, x.shape)
    hit = specs.get(key)
    if hit is None:
        if len(specs) > 8192:
            specs.clear()
        hit = specs[key] = C.leaf_spec_leaves(rule, x, path)
    return hit


def _state_leaves(rule: Rule, state: Any, xs: list, paths: list[str], td: T.TreeDef) -> list:
    """:func:`refopt.core.state_leaves` with the leaf specs cached (:func:`_spec`)."""
    ss = T.flatten_up_to(td, state.leaves, name="state.leaves")
    for s, x, p in zip(ss, xs, paths):
        C.check_leaf_state(rule, s, x, p, _spec(rule, x, p))
    return ss


def _pairs(rule: Rule, state: OptState, params: Any, grads: Any):
    """Flatten params and grads (checked against each other) and pair each leaf with its checked state.
    Returns (xs, gs, ss, paths, td, walked): ``walked`` is the cache entry valid for these objects."""
    C.check_rule_state(rule, state)
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


# --- the packing ----------------------------------------------------------------------------------

class Walk(NamedTuple):
    """What the fast walk hands a batched step (:func:`step_leaves`) besides the leaves.

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
      :meth:`grad`, which a batched step reading the caller's gradients calls before writing."""

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
        handed it, as :func:`refopt.update` does (:func:`refopt.core.read_as_handed`, one leaf). A batched
        step that reads a caller's gradient after writing any array passes every gradient through here
        before writing anything."""
        return g if self.written is None or not self.written.overlaps(g) else g.copy()


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
    """The gradient check (:func:`refopt.kernels.reject_bad_grads`) in one compiled pass per dtype over the packed
    buffers (each with its group's smallest bound) and the large leaves
    (:func:`refopt.fast.many.bad_leaves`); the leaf is named by the per-leaf check, run only when that pass
    finds something."""
    items = [(buf, min(bounds[k] for k in idx), idx) for _, idx, _, buf in pack.groups]
    items += [(gs[k], bounds[k], [k]) for k, pk in enumerate(pack.packed) if pk is None]
    flagged = [k for i in bad_leaves([a for a, _, _ in items], [b for _, b, _ in items]) for k in items[i][2]]
    if flagged:   # the first bad leaf in tree order is named, whatever the dtype groups' order
        idx = sorted(flagged)
        reject_bad_grads([gs[k] for k in idx], [paths[k] for k in idx], [bounds[k] for k in idx],
                         [type(rule).__name__] * len(idx))


def _bounds(rule: Rule, lc: dict, xs: list, ss: list) -> list:
    """Per leaf, the |g| the check accepts (:func:`refopt.kernels.square_bound` for second-moment rules),
    cached in the layout cache ``lc``."""
    bounds = lc.get("bounds")
    if bounds is None:
        bounds = lc["bounds"] = C.grad_bounds(rule, xs, ss)
    return bounds


def step(rule: Rule, state: OptState, params: Any, grads: Any, inplace: bool, info: dict | None,
         check: bool = True, inputs: dict | None = None):
    """:func:`refopt.core._step` with the same checks and bits, faster (module docstring). Nothing is written
    before :func:`step_leaves`."""
    xs, gs, ss, paths, td, w = _pairs(rule, state, params, grads)
    inputs = C.bind_inputs(rule, inputs or {}, td, paths)
    if inplace:
        C.check_not_stale(rule, state, ss)
        # flags can change in place between calls (x.flags.writeable = False), so they are read every call
        if w.cache.get("writable") is not True or not (all(map(_CARRAY, xs)) and all(map(_CARRAY, w.arrays))):
            C.check_writable(xs, ss, paths)
            w.cache["written"] = C.check_no_aliasing(xs, ss, paths)
            w.cache["writable"] = True
    t, ctx, glob, casts = C.step_context(rule, state, xs)
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
        C.check_prepared(rule, new_gs, gs, xs, paths)
        _fill_pack(pack, new_gs)
    ctx, glob, casts = C.reduced_context(rule, ctx, glob, casts, ss, xs, new_gs, paths, inputs)
    walk = Walk(inplace, pack.packed, w.cache.setdefault("rule", {}) if inplace else None,
                lc.setdefault("rule", {}), w.cache["written"] if inplace else None)
    out_x, out_s = step_leaves(rule, casts, ss, xs, new_gs, paths, walk)
    if info is not None:
        info["t"] = t
        info["lr"] = rule.lr_info(ctx)
    C.note_step(rule, state, ss, out_s, inplace)
    same_x = inplace and all(map(operator.is_, out_x, xs))
    same_s = inplace and all(map(operator.is_, out_s, ss))
    if same_x and same_s:
        C._set_per_rule(_WALKED, rule, w)
    elif _trusted(rule, lc):   # refopt's own rules make valid states: the next call is checked against them
        C._set_per_rule(_WALKED, rule, _Walked(td, paths, out_x, out_s, w.layout, lc))
    else:                  # a state made by a user's rule is validated when it comes back
        _WALKED.pop(id(rule), None)
    new_params = params if same_x else T.unflatten(td, out_x)
    new_leaves = state.leaves if same_s else T.unflatten(td, out_s)
    return new_params, C.OptState(t, glob, new_leaves)


# --- the batched steps -------------------------------------------------------------------------------

def step_leaves(rule: Rule, casts: dict, ss: list, xs: list, gs: list, paths: list, walk: Walk) -> tuple[list, list]:
    """Step every leaf (item 7 of :func:`refopt.core._step`): the batched step of ``rule``'s class when it
    has one and the class keeps that batch's per-leaf hooks, else :func:`refopt.core.step_each` (gradients
    first read as handed). With ``walk.inplace`` it writes into ``xs`` and the arrays of ``ss``; otherwise
    it leaves them untouched. Returns the new params and per-leaf states (lists)."""
    for cls, hooks, batched in _BATCHED:
        if isinstance(rule, cls):
            if not overrides(rule, cls, *hooks):
                return batched(rule, casts, ss, xs, gs, paths, walk)
            break
    return C.step_each(rule, casts, ss, xs, [walk.grad(g) for g in gs], paths, walk.inplace)


def _partition_leaves(self: Partition, casts, ss, xs, gs, paths, walk):
    """Each label's leaves handed to its rule's :func:`step_leaves` together (so that an elementwise rule
    steps its small leaves in one call); the same arithmetic as :meth:`Partition.update_leaf`."""
    groups = walk.layout_cache.get("labels")
    if groups is None:
        groups = {}
        for k, (s, p) in enumerate(zip(ss, paths)):
            self._rule(s, p)
            groups.setdefault(s.label, []).append(k)
        walk.layout_cache["labels"] = groups
    out_x, out_s = list(xs), list(ss)
    if walk.written is not None:   # a later group may read a gradient an earlier one writes: all made
        gs = [walk.grad(g) for g in gs]   # safe here, once, so the sub-rules need not check again
        walk = walk._replace(written=None)
    for label, idx in groups.items():
        nx, ns = step_leaves(self.rules[label], {dt: c[label] for dt, c in casts.items()}, [ss[k].inner for k in idx],
                             [xs[k] for k in idx], [gs[k] for k in idx], [paths[k] for k in idx], walk.sub(label, idx))
        for k, x, inner in zip(idx, nx, ns):
            s = ss[k]
            out_x[k], out_s[k] = x, (s if inner is s.inner else PartitionLeaf(label, inner))
    return out_x, out_s


def _clip_leaves(self: ClipByGlobalNorm, casts, ss, xs, gs, paths, walk):
    """The base rule's :func:`step_leaves` on the gradients clipped by :meth:`ClipByGlobalNorm.prepare`."""
    nx, ns = step_leaves(self.base, {dt: c.base for dt, c in casts.items()}, [s.base for s in ss], xs, gs, paths, walk)
    return nx, [rewrap(s, b) for s, b in zip(ss, ns)]


#: the most matrix elements :func:`_muon_leaves` orthogonalises at once (its extra memory is about three
#: copies of them: 96 MiB in float32); the reference GPT's hidden matrices (0.8M elements) are one chunk
CHUNK_ELEMENTS = 1 << 23


def _muon_leaves(self: Muon, casts, ss, xs, gs, paths, walk):
    """Muon's matrices in three passes over each chunk of leaves (consecutive leaves of at most
    :data:`CHUNK_ELEMENTS` elements in all, or one larger leaf): the momenta m_t and inputs
    M_t of the chunk (into new arrays), msign of all its M_t at once
    (:func:`refopt.linalg._msign.newton_schulz_many`: the matrices on parallel threads, one BLAS thread
    each), then the writes (m_t into the state, x_t). The chunks bound the extra memory to about three copies
    of a chunk. The same arithmetic as :meth:`Muon.update_leaf` per leaf with a single-threaded BLAS (a
    multi-threaded BLAS may round a product differently in the last bit, so a matrix stepped alone can
    differ there); nothing of a chunk is written when one of its Newton-Schulz results is not finite.
    msign='svd' and msign_backend='cuda' go leaf by leaf."""
    if self.msign == "svd" or self.msign_backend == "cuda" or len(xs) < 2:
        return C.step_each(self, casts, ss, xs, [walk.grad(g) for g in gs], paths, walk.inplace)
    gs = [walk.grad(g) for g in gs]   # before anything is written (a later chunk reads its own after)
    out_x, out_s = [], []
    start = 0
    while start < len(xs):
        stop, size = start + 1, xs[start].size
        while stop < len(xs) and size + xs[stop].size <= CHUNK_ELEMENTS:
            size += xs[stop].size
            stop += 1
        ms, Ms = [], []
        for x, g, s in zip(xs[start:stop], gs[start:stop], ss[start:stop]):
            m = s._replace(m=np.array(s.m, order="C", copy=True))
            M = np.empty(g.shape, g.dtype)
            _MOMENTUM.direction(M, x, g, m, casts[x.dtype])
            ms.append(m)
            Ms.append(M.reshape(matrix_shape(g.shape)))
        Os = newton_schulz_many(Ms, self._rows, self.eps_mode, self.norm_eps, self.norm_factor)
        del Ms
        for x, s, m, O in zip(xs[start:stop], ss[start:stop], ms, Os):
            if walk.inplace:
                np.copyto(s.m, m.m)
            else:
                x, s = np.array(x, order="C", copy=True), m
            AXPBY.step(x, O, (), self._step_scalars(casts[x.dtype], x))
            out_x.append(x)
            out_s.append(s)
        start = stop
    return out_x, out_s


def _elementwise_leaves(self: ElementwiseRule, casts, ss, xs, gs, paths, walk):
    """All leaves of an elementwise rule at once: the small ones (packed gradients, :class:`Walk`) in one
    compiled call per dtype, over the caller's arrays in place (:class:`refopt.fast.many.StepMany`, prepared
    on the second call with the same arrays and kept in the walk's cache; the first runs them one by one)
    or, for the pure update, over fresh flat copies of params and state whose slices become the new leaves;
    the large ones one by one (:meth:`~refopt.rules.base.ElementwiseRule.update_leaf`). Same arithmetic,
    same bits."""
    groups, big = _plan(walk)
    big_gs = [walk.grad(gs[k]) for k in big]   # read in place: before the small leaves are written
    out_x, out_s = list(xs), list(ss)
    kernel = self.kernel()
    for gi, (idx, starts) in enumerate(groups):
        buf = walk.packed[idx[0]][0]
        c = casts[buf.dtype]
        if not walk.inplace:
            _step_copies(self, kernel, c, buf, idx, starts, ss, xs, gs, out_x, out_s)
            continue
        many = walk.cache.get(("many", gi)) if walk.cache is not None else None
        if many is None and walk.cache is not None and walk.cache.get(("seen", gi)):
            many = walk.cache[("many", gi)] = StepMany(
                kernel, [xs[k] for k in idx], buf, starts, [self.kernel_state(ss[k]) for k in idx])
        if many is not None and many.g is buf:
            many(c)
        else:   # the first call with these arrays: leaf by leaf
            for k, o in zip(idx, starts.tolist()):
                kernel.step(xs[k], buf[o:o + xs[k].size], self.kernel_state(ss[k]), c)
            if walk.cache is not None:
                walk.cache[("seen", gi)] = True
    if big:   # one by one, as the plain walk (their gradients were made safe to read above)
        bx, bs = C.step_each(self, casts, [ss[k] for k in big], [xs[k] for k in big], big_gs,
                             [paths[k] for k in big], walk.inplace)
        for k, x, s in zip(big, bx, bs):
            out_x[k], out_s[k] = x, s
    return out_x, out_s


def _plan(walk):
    """([(leaf indices, starts)] per packed buffer, indices of the unpacked leaves), cached per layout."""
    plan = walk.layout_cache.get("plan")
    if plan is None:
        groups, big = {}, []
        for k, pk in enumerate(walk.packed):
            if pk is None:
                big.append(k)
            else:
                entry = groups.setdefault(id(pk[0]), ([], []))
                entry[0].append(k)
                entry[1].append(pk[1])
        plan = walk.layout_cache["plan"] = (
            [(idx, np.array(st, dtype=np.int64)) for idx, st in groups.values()], big)
    return plan


def _step_copies(self, kernel, c, buf, idx, starts, ss, xs, gs, out_x, out_s):
    """The pure step of the leaves ``idx``: one flat copy per params / state field, one kernel call, the
    new leaves are slices of the copies."""
    sizes = [xs[k].size for k in idx]
    ends = np.cumsum(sizes).tolist()
    spans = list(zip([0] + ends[:-1], ends))
    if int(starts[0]) == 0 and ends[-1] == buf.size and np.array_equal(starts[1:], ends[:-1]):
        g = buf
    else:
        g = np.concatenate([gs[k] for k in idx], axis=None)
    x = np.concatenate([xs[k] for k in idx], axis=None)
    State = type(ss[idx[0]])
    fields = [np.concatenate([ss[k][j] for k in idx], axis=None) for j in range(len(State._fields))]
    kernel.step(x, g, self.kernel_state(State(*fields)), c)
    shapes = [xs[k].shape for k in idx]
    new_x = _split(x, spans, shapes)
    parts = []
    for j, f in enumerate(fields):
        if all(ss[k][j].shape == shp for k, shp in zip(idx, shapes)):   # a field shaped like x
            parts.append(_split(f, spans, shapes))
        else:                     # e.g. SGD's empty buffer without momentum
            parts.append([np.array(ss[k][j], copy=True) for k in idx])
    for k, nx, ns in zip(idx, new_x, map(State, *parts) if parts else [State()] * len(idx)):
        out_x[k], out_s[k] = nx, ns


def _split(flat: np.ndarray, spans: list, shapes: list) -> list:
    """Views of ``flat`` cut at ``spans`` [(start, end)] and shaped as ``shapes``."""
    views = [flat[a:b] for a, b in spans]
    return [v if len(s) == 1 else v.reshape(s) for v, s in zip(views, shapes)]


def overrides(rule: Rule, cls: type, *hooks: str) -> bool:
    """True when ``rule``'s class redefines one of ``hooks`` of ``cls`` (a user subclass changing the per-leaf
    step: the batched step of ``cls`` must then not bypass it)."""
    t = type(rule)
    return any(getattr(t, h) is not getattr(cls, h) for h in hooks)


#: (class, its per-leaf hooks that the batch reproduces, the batched step), most specific first
_BATCHED = [
    (Partition, ("update_leaf",), _partition_leaves),
    (ClipByGlobalNorm, ("update_leaf",), _clip_leaves),
    (Muon, ("update_leaf", "_update", "_orthogonalised"), _muon_leaves),
    (ElementwiseRule, ("update_leaf", "kernel_state"), _elementwise_leaves),
]
