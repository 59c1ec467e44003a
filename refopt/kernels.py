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

The multi-tensor form of ``step`` (many arrays in one compiled call) belongs to the speed layer,
:mod:`refopt.fast`.

Also here: :func:`reject_bad_grads` (the walk's gate rejecting non-finite gradients and, for second-moment
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

#: arrays with at least this many elements use the multi-threaded kernel (below it, thread start-up and,
#: on a busy machine, waiting for the worker threads to be scheduled cost more than the loop)
PARALLEL_MIN_SIZE = 1 << 16


def twin(fn, name: str, glob: dict | None = None):
    """A copy of ``fn`` under another name (and optionally other globals). numba names its on-disk cache
    after the function and ignores the ``parallel`` flag and the globals, so each variant needs its own name."""
    copy = types.FunctionType(fn.__code__, fn.__globals__ if glob is None else glob, name, fn.__defaults__,
                              fn.__closure__)
    copy.__qualname__ = name
    return copy


def elementwise(fn):
    """Compile ``fn`` (a loop over ``numba.prange``) serially and in parallel; call the right one.

    The returned dispatcher takes the same arguments; its first argument must be an array whose size
    decides the version. Both versions run identical arithmetic per element.
    """
    serial = numba.njit(cache=True)(fn)
    parallel = numba.njit(cache=True, parallel=True)(twin(fn, fn.__name__ + "_parallel"))

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


def flat_view(a: np.ndarray, n: int, dtype, what: str, write: bool) -> np.ndarray:
    """``a`` as a flat C-contiguous array of ``n`` elements of ``dtype`` (a view when it is C-contiguous);
    ``ValueError`` naming ``what`` otherwise, or when it is written (``write``) but read-only or strided."""
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
        self.tag = tag = f"{name}_{hashlib.sha1(src.encode()).hexdigest()[:10]}"
        glob = dict(_step_loop.__globals__, elem=elem)
        self.loops = {}   # kind -> (serial, parallel) compiled loops
        for kind, fn in (("step", _step_loop), ("direction", _direction_loop), ("replace", _replace_loop)):
            serial = numba.njit(cache=True)(twin(fn, f"{kind}_{tag}", glob))
            parallel = numba.njit(cache=True, parallel=True)(twin(fn, f"{kind}_{tag}_parallel", glob))
            self.loops[kind] = (serial, parallel)

    def _run(self, kind: str, arrays: list, s, c) -> None:
        """Check ``arrays`` [(array, name, written?)] and the state arrays, then run the loop ``kind``."""
        n, dtype = arrays[0][0].size, arrays[0][0].dtype
        flat = [flat_view(a, n, dtype, what, write) for a, what, write in arrays]
        names = getattr(type(s), "_fields", None) or range(len(s))
        items = [flat_view(a, n, dtype, f"state.{f}", True) for a, f in zip(s, names)]
        fs = type(s)(*items) if hasattr(type(s), "_fields") else tuple(items)
        serial, parallel = self.loops[kind]
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


#: elements per work item of the parallel count (4 MB of float32): each is counted by the vectorized serial
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


def square_bound(dtype) -> float:
    r"""The largest ``|g|`` a second-moment rule accepts in ``dtype``: ``sqrt(max)/2``, so that
    :math:`g^2 \le \max/4` and the moment EMA :math:`v = \beta_2 v + (1 - \beta_2)\, g^2`, its bias
    correction :math:`v / (1 - \beta_2^t) \le \max_k g_k^2` and :math:`\sqrt{v}` stay finite (3.7e19 in
    float64's sqrt range is 6.7e153; float32: 9.2e18)."""
    return float(np.sqrt(np.finfo(dtype).max)) / 2.0


def bad_leaves(arrays: list, bounds: list) -> list[int]:
    """The indices k (ascending) of the floating ``arrays`` that hold nan, inf or an element of magnitude
    >= ``bounds[k]`` (:func:`count_bad` per array)."""
    return [k for k, (a, b) in enumerate(zip(arrays, bounds)) if count_bad(a, b)]


def reject_bad_grads(gs: list, paths: list[str], bounds: list[float], owners: list[str]) -> None:
    """Raise ``FloatingPointError`` naming the first leaf whose gradient holds nan or inf, or an element of
    magnitude >= its bound (:func:`square_bound` for the second-moment rule ``owners[k]``, inf otherwise).
    Writes nothing."""
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


def __getattr__(name: str):
    """``refopt.kernels.check_grads``: a deprecated alias of :func:`reject_bad_grads` (``refopt.check_grads``
    is the autograd's finite-difference check; one name, one meaning)."""
    if name == "check_grads":
        import warnings

        warnings.warn("refopt.kernels.check_grads is refopt.kernels.reject_bad_grads", DeprecationWarning, 2)
        return reject_bad_grads
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _triad(c, a, b, s):
    for i in numba.prange(c.size):
        c[i] = a[i] + s * b[i]


triad = elementwise(_triad)
triad.__doc__ = "c[:] = a + s*b over flat arrays (``s`` of the arrays' dtype): the bandwidth yardstick."
