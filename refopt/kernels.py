"""Shared numba plumbing for the per-array arithmetic of the rules.

A rule writes its per-element arithmetic once, as a small ``numba.njit`` function::

    elem(x, g, s, i, c) -> a

``x`` and ``g`` are the element's weight and gradient, ``s`` the rule's per-array state (a NamedTuple of flat
arrays that ``elem`` reads and writes at index ``i``), ``c`` the step's scalars (a NamedTuple already cast to
the array dtype by the tree walk, :mod:`refopt.core`). ``elem`` must not be compiled with numba's
``inline="always"``: numba's parallel loops then lose writes to arrays held in a tuple (numba 0.68); as a
normal call LLVM still inlines it. :class:`Elementwise` compiles it into the loops the walk
needs, each once serially and once with ``parallel=True`` (``prange``; elementwise loops have no reductions,
so both give bit-identical results, and the serial one avoids thread start-up on small arrays):

* ``step``: ``x[i] <- c.decay * x[i] - c.step * a`` (the rules of the form x <- decay*x - lr*u);
* ``direction``: ``u[i] <- c.u_scale * a`` (the direction u of :func:`refopt.direction`; x is only read);
* ``replace``: ``x[i] <- a`` (rules whose new weight is not of that form, e.g. Schedule-Free's y).

The loops are reached only through :class:`Elementwise`'s methods, which check that every array has the
same number of elements and dtype (and that written arrays are writable and C-contiguous) before any loop
runs, so no loop can index past an array. No ``fastmath`` anywhere (it reorders floating point).

:meth:`Elementwise.many` prepares the multi-tensor form of ``step`` (torch's ``_foreach`` idea): the
step of many arrays in one compiled call, their gradients packed in one flat buffer, the arrays reached
by address, the leaves spread over numba's threads.

Also here: :func:`check_grads` (the walk's fused pass rejecting non-finite gradients and, for second-moment
rules, gradients whose square overflows) and :func:`triad` (``c = a + s*b``, the bandwidth yardstick of
``benchmarks/``).
"""
from __future__ import annotations

import hashlib
import inspect
import types
from typing import NamedTuple

import numba
import numpy as np
from numba import types as nb_types
from numba.core import cgutils
from numba.extending import intrinsic, overload

#: arrays with at least this many elements use the multi-threaded kernel (below it, thread start-up and,
#: on a busy machine, waiting for the worker threads to be scheduled cost more than the loop)
PARALLEL_MIN_SIZE = 1 << 16


def _twin(fn, name: str, glob: dict | None = None):
    """A copy of ``fn`` under another name (and optionally other globals). numba names its on-disk cache
    after the function and ignores the ``parallel`` flag and the globals, so each variant needs its own name."""
    twin = types.FunctionType(fn.__code__, fn.__globals__ if glob is None else glob, name, fn.__defaults__,
                              fn.__closure__)
    twin.__qualname__ = name
    return twin


def elementwise(fn):
    """Compile ``fn`` (a loop over ``numba.prange``) serially and in parallel; call the right one.

    The returned dispatcher takes the same arguments; its first argument must be an array whose size
    decides the version. Both versions run identical arithmetic per element.
    """
    serial = numba.njit(cache=True)(fn)
    parallel = numba.njit(cache=True, parallel=True)(_twin(fn, fn.__name__ + "_parallel"))

    def call(first, *args):
        kernel = parallel if first.size >= PARALLEL_MIN_SIZE else serial
        return kernel(first, *args)

    call.serial, call.parallel, call.py_func = serial, parallel, fn
    call.__name__, call.__doc__ = fn.__name__, fn.__doc__
    return call


# --- the three loops, written once; ``elem`` is bound per rule by :class:`Elementwise` ------------------

def _step_loop(x, g, s, c):
    for i in numba.prange(x.size):
        a = elem(x[i], g[i], s, i, c)  # noqa: F821 (bound per rule)
        x[i] = c.decay * x[i] - c.step * a


def _direction_loop(u, x, g, s, c):
    for i in numba.prange(u.size):
        u[i] = c.u_scale * elem(x[i], g[i], s, i, c)  # noqa: F821


def _replace_loop(x, g, s, c):
    for i in numba.prange(x.size):
        x[i] = elem(x[i], g[i], s, i, c)  # noqa: F821


# the multi-tensor form of ``step`` (torch's ``_foreach`` idea): one call over many arrays. Leaf k is the array of
# sizes[k] elements at address xptr[k] (its state arrays at sptr[:, k], of the types of ``proto``, the state of
# leaf 0), its gradient g[start[k]:start[k] + sizes[k]] of one packed buffer. Each leaf runs the serial step loop;
# the leaves are independent, so the parallel form (threads across leaves) gives the same bits. The arrays are
# reached by address (numba.carray) rather than through numba typed lists, whose methods compile anew in every
# process; the addresses are taken by :class:`StepMany`, which keeps the arrays alive.

@intrinsic
def _voidptr(typingctx, addr):
    """The integer ``addr`` as a ``void*``."""
    if not isinstance(addr, nb_types.Integer):
        return None

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], cgutils.voidptr_t)
    return nb_types.voidptr(addr), codegen


@numba.njit(cache=True)
def _at(addr, n, like):
    """The ``n`` elements at ``addr`` as a 1-d array of ``like``'s dtype."""
    return numba.carray(_voidptr(addr), n, like.dtype)


def _state_at(proto, sptr, k, n):  # pragma: no cover - replaced by the overload below in compiled code
    raise NotImplementedError


@overload(_state_at)
def _state_at_impl(proto, sptr, k, n):
    """``type(proto)(*arrays at sptr[:, k])``: the state of leaf k, for state NamedTuples of up to 4 arrays."""
    fields = len(proto.types) if isinstance(proto, nb_types.BaseTuple) else -1
    make = getattr(proto, "instance_class", None)
    if fields == 0:
        return lambda proto, sptr, k, n: proto
    if make is None or fields > 4:
        return None
    if fields == 1:
        return lambda proto, sptr, k, n: make(_at(sptr[0, k], n, proto[0]))
    if fields == 2:
        return lambda proto, sptr, k, n: make(_at(sptr[0, k], n, proto[0]), _at(sptr[1, k], n, proto[1]))
    if fields == 3:
        return lambda proto, sptr, k, n: make(_at(sptr[0, k], n, proto[0]), _at(sptr[1, k], n, proto[1]),
                                              _at(sptr[2, k], n, proto[2]))
    return lambda proto, sptr, k, n: make(_at(sptr[0, k], n, proto[0]), _at(sptr[1, k], n, proto[1]),
                                          _at(sptr[2, k], n, proto[2]), _at(sptr[3, k], n, proto[3]))


def _step_many_loop(xptr, sizes, g, start, sptr, proto, c):
    for k in numba.prange(xptr.size):
        j = np.int64(k)
        n = sizes[j]
        step_one(_at(xptr[j], n, g), g[start[j]:start[j] + n], _state_at(proto, sptr, j, n), c)  # noqa: F821


def _flat(a: np.ndarray, n: int, dtype, what: str, write: bool) -> np.ndarray:
    if not isinstance(a, np.ndarray) or a.size != n or a.dtype != dtype:
        got = f"{a.dtype} of {a.size} elements" if isinstance(a, np.ndarray) else type(a).__name__
        raise ValueError(f"kernel: {what} is {got}, expected {dtype} of {n} elements")
    if write and not (a.flags.writeable and a.flags.c_contiguous):
        raise ValueError(f"kernel: {what} must be writable and C-contiguous")
    return a.reshape(-1) if a.flags.c_contiguous else np.ascontiguousarray(a).reshape(-1)


class Elementwise:
    """The loops of one rule's per-element arithmetic ``elem(x, g, s, i, c) -> a`` (module docstring).

    ``name`` names the compiled loops (and their numba cache files, together with a hash of the source file
    of ``elem``, so an edited rule never meets a stale cache). Each method takes arrays of any shape with the
    same number of elements and dtype, and a state NamedTuple (or ``()``) of such arrays; it raises
    ``ValueError`` before running anything if they differ, or if an array it writes is read-only or not
    C-contiguous."""

    def __init__(self, elem, name: str):
        self.elem, self.name = elem, name
        py = getattr(elem, "py_func", elem)
        module = inspect.getmodule(py)   # the whole file: an edited helper of elem also changes the name
        try:
            src = inspect.getsource(module) if module is not None else inspect.getsource(py)
        except (OSError, TypeError):     # no source shipped (e.g. a zipped install): the bytecode names it
            src = repr(py.__code__.co_code) + repr(py.__code__.co_consts)
        tag = f"{name}_{hashlib.sha1(src.encode()).hexdigest()[:10]}"
        glob = dict(_step_loop.__globals__, elem=elem)
        self._loops = {}
        for kind, fn in (("step", _step_loop), ("direction", _direction_loop), ("replace", _replace_loop)):
            serial = numba.njit(cache=True)(_twin(fn, f"{kind}_{tag}", glob))
            parallel = numba.njit(cache=True, parallel=True)(_twin(fn, f"{kind}_{tag}_parallel", glob))
            self._loops[kind] = (serial, parallel)
        many = dict(glob, step_one=self._loops["step"][0])
        serial = numba.njit(cache=True)(_twin(_step_many_loop, f"step_many_{tag}", many))
        parallel = numba.njit(cache=True, parallel=True)(_twin(_step_many_loop, f"step_many_{tag}_parallel", many))
        self._loops["step_many"] = (serial, parallel)

    def _run(self, kind: str, arrays: list, s, c) -> None:
        """Check ``arrays`` [(array, name, written?)] and the state arrays, then run the loop ``kind``."""
        n, dtype = arrays[0][0].size, arrays[0][0].dtype
        flat = [_flat(a, n, dtype, what, write) for a, what, write in arrays]
        names = getattr(type(s), "_fields", None) or range(len(s))
        items = [_flat(a, n, dtype, f"state.{f}", True) for a, f in zip(s, names)]
        fs = type(s)(*items) if hasattr(type(s), "_fields") else tuple(items)
        serial, parallel = self._loops[kind]
        (parallel if n >= PARALLEL_MIN_SIZE else serial)(*flat, fs, c)

    def step(self, x: np.ndarray, g: np.ndarray, s, c) -> None:
        """x <- c.decay * x - c.step * elem(x, g, s, c), elementwise, in place (s written in place)."""
        self._run("step", [(x, "x", True), (g, "g", False)], s, c)

    def direction(self, u: np.ndarray, x: np.ndarray, g: np.ndarray, s, c) -> None:
        """u <- c.u_scale * elem(x, g, s, c) (u written, x and g only read, s written in place)."""
        self._run("direction", [(u, "u", True), (x, "x", False), (g, "g", False)], s, c)

    def replace(self, x: np.ndarray, g: np.ndarray, s, c) -> None:
        """x <- elem(x, g, s, c), elementwise, in place (s written in place)."""
        self._run("replace", [(x, "x", True), (g, "g", False)], s, c)

    def many(self, xs: list, g: np.ndarray, start: list, ss: list) -> "StepMany":
        """The :meth:`step` of many arrays at once, prepared for repeated calls (:class:`StepMany`): leaf k is
        ``xs[k]`` (written in place), its gradient ``g[start[k]:start[k] + xs[k].size]`` of the flat buffer
        ``g`` (rewritten by the caller between calls), its state ``ss[k]`` (all of one NamedTuple type of at
        most 4 arrays, or all ``()``). Checks every size, dtype and type now (ValueError, as :meth:`step`)."""
        return StepMany(self, xs, g, start, ss)


class StepMany:
    """:meth:`Elementwise.many`: the arrays of many leaves checked once, their addresses tabled, so that a
    step over all of them is one compiled call (``self(c)``). It holds the arrays (so their memory stays
    theirs: numpy refuses to resize an array referenced elsewhere); the leaves run on numba's threads when
    they hold at least :data:`PARALLEL_MIN_SIZE` elements together."""

    def __init__(self, ew: Elementwise, xs: list, g: np.ndarray, start: list, ss: list):
        if not (isinstance(g, np.ndarray) and g.ndim == 1 and g.flags.c_contiguous):
            raise ValueError("kernel: the packed gradient buffer must be a flat C-contiguous array")
        dtype, kind = g.dtype, type(ss[0]) if ss else tuple
        if len(ss) != len(xs) or len(start) != len(xs):
            raise ValueError("kernel: one state and one gradient start per array")
        fields = len(ss[0]) if ss else 0
        if fields > 4 or (fields and not hasattr(kind, "_fields")):
            raise ValueError("kernel: a multi-array state must be a NamedTuple of at most 4 arrays")
        flat_x, flat_s = [], []
        for k, x in enumerate(xs):
            n, o = x.size, int(start[k])
            if not 0 <= o <= g.size - n:
                raise ValueError(f"kernel: gradient {k} [{o}, {o + n}) lies outside the packed buffer of {g.size}")
            if type(ss[k]) is not kind or len(ss[k]) != fields:
                raise ValueError(f"kernel: state {k} is a {type(ss[k]).__name__}, expected {kind.__name__}")
            flat_x.append(_flat(x, n, dtype, f"x[{k}]", True))
            flat_s.append([_flat(a, n, dtype, f"state[{k}][{f}]", True) for f, a in enumerate(ss[k])])
        self._keep = (xs, ss, flat_x, flat_s)          # the tabled memory stays alive with this object
        self.g, self.size = g, sum(x.size for x in flat_x)
        self.start = np.asarray(start, dtype=np.int64).copy()
        self.sizes = np.array([x.size for x in flat_x], dtype=np.int64)
        self.xptr = np.array([x.ctypes.data for x in flat_x], dtype=np.int64)
        self.sptr = np.array([[s[f].ctypes.data for s in flat_s] for f in range(fields)],
                             dtype=np.int64).reshape(fields, len(flat_x))
        self.proto = (kind(*flat_s[0]) if fields else ()) if flat_s else ()
        serial, parallel = ew._loops["step_many"]
        self._loop = parallel if (self.size >= PARALLEL_MIN_SIZE and len(flat_x) > 1) else serial

    def __call__(self, c) -> None:
        """x_k <- c.decay*x_k - c.step*elem(x_k, g_k, s_k, c) for every leaf k, in place."""
        if self.sizes.size:
            self._loop(self.xptr, self.sizes, self.g, self.start, self.sptr, self.proto, c)


@numba.njit
def _second(x, g, s, i, c):
    return g


class Axpby(NamedTuple):
    """The scalars of :data:`AXPBY`: x <- decay*x - step*g."""

    decay: float
    step: float


#: x <- c.decay * x - c.step * g over two arrays (``AXPBY.step(x, g, (), Axpby(decay, step))``, scalars of
#: x's dtype): Muon's step and the scaled updates of the norm wrappers
AXPBY = Elementwise(_second, "axpby")


# --- the gradient check ---------------------------------------------------------------------------

@numba.njit(cache=True)
def _count_bad(a, bound):
    # branch-free so that LLVM vectorizes it: not (|a| < bound) is true for nan, for inf when bound = inf,
    # and for |a| >= bound
    bad = 0
    for i in range(a.size):
        bad += not (abs(a[i]) < bound)
    return bad


#: elements per work item of the parallel check (4 MB of float32): each is counted by the vectorized serial
#: loop (a reduction written directly in a parallel loop is not vectorized by numba)
COUNT_CHUNK = 1 << 20


@numba.njit(cache=True, parallel=True)
def _count_bad_parallel(a, bound):
    n = a.size
    chunks = (n + COUNT_CHUNK - 1) // COUNT_CHUNK
    counts = np.zeros(chunks, np.int64)
    for j in numba.prange(chunks):
        lo = j * COUNT_CHUNK
        counts[j] = _count_bad(a[lo:min(n, lo + COUNT_CHUNK)], bound)
    return counts.sum()


def count_bad(a: np.ndarray, bound: float = np.inf) -> int:
    """Number of elements of the floating array ``a`` that are nan, inf, or of magnitude >= ``bound``."""
    if a.size == 0:
        return 0
    flat = a.reshape(-1) if a.flags.c_contiguous else np.ascontiguousarray(a).reshape(-1)
    b = a.dtype.type(bound)
    return int((_count_bad_parallel if flat.size >= PARALLEL_MIN_SIZE else _count_bad)(flat, b))


@numba.njit(cache=True)
def _any_bad(a, bound):
    # an AND over the array, branch-free and without an early exit, so that LLVM vectorizes it (about twice
    # the rate of the count's int64 sum), over four quarters at once: four read streams per thread keep more
    # loads in flight on a memory-bound pass
    q = a.size // 4
    ok0 = ok1 = ok2 = ok3 = True
    for i in range(q):
        ok0 &= abs(a[i]) < bound
        ok1 &= abs(a[q + i]) < bound
        ok2 &= abs(a[2 * q + i]) < bound
        ok3 &= abs(a[3 * q + i]) < bound
    ok = ok0 & ok1 & ok2 & ok3
    for i in range(4 * q, a.size):
        ok &= abs(a[i]) < bound
    return not ok


@numba.njit(cache=True)
def _any_bad_chunk(ptrs, which, lo, hi, bounds, like, out, j):
    out[j] = _any_bad(_at(ptrs[which[j]] + lo[j] * like.itemsize, hi[j] - lo[j], like), bounds[which[j]])


def _any_bad_chunks(ptrs, which, lo, hi, bounds, like):
    out = np.zeros(lo.size, np.bool_)
    for j in numba.prange(lo.size):
        _any_bad_chunk(ptrs, which, lo, hi, bounds, like, out, np.int64(j))
    return out


_ANY_BAD_CHUNKS = (numba.njit(cache=True)(_any_bad_chunks),
                   numba.njit(cache=True, parallel=True)(_twin(_any_bad_chunks, "_any_bad_chunks_parallel")))


def any_bad_many(arrays: list, bounds: list) -> list[bool]:
    """[count_bad(a, b) > 0 for a, b in zip(arrays, bounds)] for floating arrays of one dtype, in one compiled
    call: the arrays are cut into chunks of :data:`COUNT_CHUNK` elements, read on numba's threads when they
    hold at least :data:`PARALLEL_MIN_SIZE` elements together (one parallel region for the whole tree, not
    one per array)."""
    if not arrays:
        return []
    dtype = arrays[0].dtype
    flats = [a.reshape(-1) if a.flags.c_contiguous else np.ascontiguousarray(a).reshape(-1) for a in arrays]
    if any(f.dtype != dtype for f in flats):
        raise ValueError("any_bad_many: the arrays must share one dtype")
    sizes = np.array([f.size for f in flats], dtype=np.int64)
    per = (sizes + COUNT_CHUNK - 1) // COUNT_CHUNK
    which = np.repeat(np.arange(len(flats), dtype=np.int64), per)
    first = np.repeat(np.cumsum(per) - per, per)
    lo = (np.arange(which.size, dtype=np.int64) - first) * COUNT_CHUNK
    hi = np.minimum(lo + COUNT_CHUNK, sizes[which])
    ptrs = np.array([f.ctypes.data for f in flats], dtype=np.int64)
    serial, parallel = _ANY_BAD_CHUNKS
    bad = (parallel if sizes.sum() >= PARALLEL_MIN_SIZE and which.size > 1 else serial)(
        ptrs, which, lo, hi, np.array(bounds, dtype=dtype), flats[0][:0])
    out = np.zeros(len(flats), np.bool_)
    np.logical_or.at(out, which, bad)
    return out.tolist()


def all_finite(a: np.ndarray) -> bool:
    """True when every element of the floating array ``a`` is finite (no nan, no inf)."""
    return count_bad(a) == 0


def square_bound(dtype) -> float:
    r"""The largest ``|g|`` a second-moment rule accepts in ``dtype``: ``sqrt(max)/2``, so that
    :math:`g^2 \le \max/4` and the moment EMA :math:`v = \beta_2 v + (1 - \beta_2)\, g^2`, its bias
    correction :math:`v / (1 - \beta_2^t) \le \max_k g_k^2` and :math:`\sqrt{v}` stay finite (3.7e19 in
    float64's sqrt range is 6.7e153; float32: 9.2e18)."""
    return float(np.sqrt(np.finfo(dtype).max)) / 2.0


def bad_leaves(arrays: list, bounds: list) -> list[int]:
    """The indices k (ascending) of the floating ``arrays`` that hold nan, inf or an element of magnitude
    >= ``bounds[k]``: one :func:`any_bad_many` pass per dtype over the whole list."""
    groups: dict = {}
    for k, a in enumerate(arrays):
        groups.setdefault(a.dtype, []).append(k)
    bad = []
    for idx in groups.values():
        found = any_bad_many([arrays[k] for k in idx], [bounds[k] for k in idx])
        bad += [k for k, f in zip(idx, found) if f]
    return sorted(bad)


def check_grads(gs: list, paths: list[str], bounds: list[float], owners: list[str]) -> None:
    """Raise ``FloatingPointError`` naming the first leaf whose gradient holds nan or inf, or an element of
    magnitude >= its bound (``square_bound`` for second-moment rules, inf otherwise). Writes nothing. The
    whole list is read in one pass per dtype (:func:`bad_leaves`); the message is built for the first leaf
    that pass flags."""
    bad = bad_leaves(gs, bounds)
    if bad:
        k = bad[0]
        g, p, b, o = gs[k], paths[k], bounds[k], owners[k]
        if count_bad(g):
            raise FloatingPointError(f"non-finite gradient (nan or inf) at {p}")
        big = float(np.max(np.abs(g)))
        raise FloatingPointError(
            f"gradient at {p} has |g| = {big:.3g}, whose square overflows {g.dtype} in the second moment of "
            f"{o} (|g| must be below {b:.3g}); scale the loss down or use float64")


def _triad(c, a, b, s):
    for i in numba.prange(c.size):
        c[i] = a[i] + s * b[i]


triad = elementwise(_triad)
triad.__doc__ = "c[:] = a + s*b over flat arrays (``s`` of the arrays' dtype): the bandwidth yardstick."
