"""The multi-leaf loops of the fast layer: many arrays in one compiled call (torch's ``_foreach`` idea).

* :class:`StepMany`: :meth:`refopt.kernels.Elementwise.step` of many leaves at once. Leaf k is the array of
  ``sizes[k]`` elements at address ``xptr[k]`` (its state arrays at ``sptr[:, k]``, of the types of
  ``proto``, the state of leaf 0), its gradient ``g[start[k]:start[k] + sizes[k]]`` of one packed buffer.
  Each leaf runs the serial step loop of the rule; the leaves are independent, so the parallel form
  (threads across leaves) gives the same bits as stepping them one by one.
* :func:`any_bad_many` / :func:`bad_leaves`: the gradient check of a whole tree in one compiled call (the
  arrays cut into chunks of :data:`COUNT_CHUNK` elements), the same answer as
  :func:`refopt.kernels.bad_leaves`.

The arrays are reached by address (``numba.carray``) rather than through numba typed lists, whose methods
compile anew in every process; the addresses are taken by the objects that keep the arrays alive.
"""
from __future__ import annotations

import numba
import numpy as np
from numba import types as nb_types
from numba.core import cgutils
from numba.extending import intrinsic, overload

from refopt.kernels import COUNT_CHUNK, PARALLEL_MIN_SIZE, Elementwise, flat_view, twin


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


#: Elementwise -> (serial, parallel) step_many loops, compiled on first use
_LOOPS: dict = {}


def _loops(ew: Elementwise):
    loops = _LOOPS.get(ew.tag)
    if loops is None:
        glob = dict(_step_many_loop.__globals__, step_one=ew.loops["step"][0])
        loops = _LOOPS[ew.tag] = (
            numba.njit(cache=True)(twin(_step_many_loop, f"step_many_{ew.tag}", glob)),
            numba.njit(cache=True, parallel=True)(twin(_step_many_loop, f"step_many_{ew.tag}_parallel", glob)))
    return loops


class StepMany:
    """The :meth:`~refopt.kernels.Elementwise.step` of many arrays, prepared for repeated calls: leaf k is
    ``xs[k]`` (written in place), its gradient ``g[start[k]:start[k] + xs[k].size]`` of the flat buffer ``g``
    (rewritten by the caller between calls), its state ``ss[k]`` (all of one NamedTuple type of at most 4
    arrays, or all ``()``). Every size, dtype and type is checked here (ValueError, as ``step``), the
    addresses tabled, so that a step over all of them is one compiled call (``self(c)``). It holds the
    arrays (so their memory stays theirs: numpy refuses to resize an array referenced elsewhere); the
    leaves run on numba's threads when they hold at least :data:`PARALLEL_MIN_SIZE` elements together."""

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
            flat_x.append(flat_view(x, n, dtype, f"x[{k}]", True))
            flat_s.append([flat_view(a, n, dtype, f"state[{k}][{f}]", True) for f, a in enumerate(ss[k])])
        self._keep = (xs, ss, flat_x, flat_s)          # the tabled memory stays alive with this object
        self.g, self.size = g, sum(x.size for x in flat_x)
        self.start = np.asarray(start, dtype=np.int64).copy()
        self.sizes = np.array([x.size for x in flat_x], dtype=np.int64)
        self.xptr = np.array([x.ctypes.data for x in flat_x], dtype=np.int64)
        self.sptr = np.array([[s[f].ctypes.data for s in flat_s] for f in range(fields)],
                             dtype=np.int64).reshape(fields, len(flat_x))
        self.proto = (kind(*flat_s[0]) if fields else ()) if flat_s else ()
        serial, parallel = _loops(ew)
        self._loop = parallel if (self.size >= PARALLEL_MIN_SIZE and len(flat_x) > 1) else serial

    def __call__(self, c) -> None:
        """x_k <- c.decay*x_k - c.step*elem(x_k, g_k, s_k, c) for every leaf k, in place."""
        if self.sizes.size:
            self._loop(self.xptr, self.sizes, self.g, self.start, self.sptr, self.proto, c)


# --- the gradient check of a whole tree ----------------------------------------------------------------

@numba.njit(cache=True)
def _any_bad(a, bound):
    # an AND over the array, branch-free and without an early exit, so that LLVM vectorizes it (about twice
    # the rate of a count's int64 sum), over four quarters at once: four read streams per thread keep more
    # loads in flight on a memory-bound pass; not (|a| < bound) is true for nan, inf and |a| >= bound
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
                   numba.njit(cache=True, parallel=True)(twin(_any_bad_chunks, "_any_bad_chunks_parallel")))


def any_bad_many(arrays: list, bounds: list) -> list[bool]:
    """[count_bad(a, b) > 0 for a, b in zip(arrays, bounds)] for floating arrays of one dtype, in one compiled
    call: the arrays are cut into chunks of :data:`COUNT_CHUNK` elements, read on numba's threads when they
    hold at least :data:`PARALLEL_MIN_SIZE` elements together (one parallel region for the whole tree)."""
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


def bad_leaves(arrays: list, bounds: list) -> list[int]:
    """:func:`refopt.kernels.bad_leaves` in one :func:`any_bad_many` pass per dtype over the whole list."""
    groups: dict = {}
    for k, a in enumerate(arrays):
        groups.setdefault(a.dtype, []).append(k)
    bad = []
    for idx in groups.values():
        found = any_bad_many([arrays[k] for k in idx], [bounds[k] for k in idx])
        bad += [k for k, f in zip(idx, found) if f]
    return sorted(bad)
