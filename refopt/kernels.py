"""Shared numba plumbing for the per-array kernels.

Rule kernels live next to their rule (``refopt/rules/*.py``), each with a plain-numpy reference. This
module holds what they share:

* :func:`elementwise` compiles one elementwise loop twice, serial and ``parallel=True`` (``prange``), and
  picks by size. Elementwise loops have no reductions, so both versions give bit-identical results;
  the serial one avoids thread start-up cost on small arrays. No ``fastmath`` anywhere (it reorders
  floating point).
* :func:`all_finite`: the non-finite-gradient check of the tree walk.
* :func:`triad`: ``c = a + s*b``, the memory-bandwidth yardstick of ``benchmarks/``.
"""
from __future__ import annotations

import types

import numba
import numpy as np

#: arrays with at least this many elements use the multi-threaded kernel (below it, thread start-up and,
#: on a busy machine, waiting for the worker threads to be scheduled cost more than the loop)
PARALLEL_MIN_SIZE = 1 << 16


def elementwise(fn):
    """Compile ``fn`` (a loop over ``numba.prange``) serially and in parallel; call the right one.

    The returned dispatcher takes the same arguments; its first argument must be an array whose size
    decides the version. Both versions run identical arithmetic per element.
    """
    serial = numba.njit(cache=True)(fn)
    # numba names its on-disk cache after the function and ignores the ``parallel`` flag, so the parallel
    # version is compiled from a renamed copy; otherwise whichever compiled first would serve both.
    twin = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__ + "_parallel", fn.__defaults__,
                              fn.__closure__)
    twin.__qualname__ = fn.__qualname__ + "_parallel"
    parallel = numba.njit(cache=True, parallel=True)(twin)

    def call(first, *args):
        kernel = parallel if first.size >= PARALLEL_MIN_SIZE else serial
        return kernel(first, *args)

    call.serial, call.parallel, call.py_func = serial, parallel, fn
    call.__name__, call.__doc__ = fn.__name__, fn.__doc__
    return call


@numba.njit(cache=True)
def _count_nonfinite(a):
    # branch-free so that LLVM vectorizes it: a - a is 0 for finite a, nan for inf and nan
    bad = 0
    for i in range(a.size):
        d = a[i] - a[i]
        bad += d != d
    return bad


def all_finite(a: np.ndarray) -> bool:
    """True when every element of the floating array ``a`` is finite (no nan, no inf)."""
    if a.size == 0:
        return True
    return bool(_count_nonfinite(a.reshape(-1)) == 0)


def _triad(c, a, b, s):
    for i in numba.prange(c.size):
        c[i] = a[i] + s * b[i]


triad = elementwise(_triad)
triad.__doc__ = "c[:] = a + s*b over flat arrays (``s`` of the arrays' dtype): the bandwidth yardstick."
