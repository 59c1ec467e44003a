"""Norms of arrays for the rules: the Frobenius norm accumulated in float64 (bit-reproducible across thread
counts, overflow-safe), and the small scaled-update kernels of the norm-based wrappers (Hyperball, Covariant)."""
from __future__ import annotations

import math
import numba
import numpy as np

from refopt.kernels import AXPBY, Axpby, elementwise

# ---------------------------------------------------------------------------------------------------
# The Frobenius norm, accumulated in float64 whatever the array's dtype (PITFALLS B26).

#: elements per partial sum. The blocks are fixed, so the serial and the parallel kernel add the very
#: same numbers in the very same order: the norm is bit-reproducible whatever the thread count.
NORM_BLOCK = 1 << 14


@numba.njit(cache=True)
def _block_sumsq(a, lo, hi, m):
    """sum of (a[i]/m)**2 for lo <= i < hi, in float64, with 8 interleaved partial sums in a fixed order
    (independent chains the CPU can overlap; no reassociation by the compiler). m = 1.0: no scaling."""
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = 0.0
    i = lo
    if m == 1.0:
        while i + 8 <= hi:
            v0, v1, v2, v3 = np.float64(a[i]), np.float64(a[i + 1]), np.float64(a[i + 2]), np.float64(a[i + 3])
            v4, v5, v6, v7 = np.float64(a[i + 4]), np.float64(a[i + 5]), np.float64(a[i + 6]), np.float64(a[i + 7])
            s0 += v0 * v0
            s1 += v1 * v1
            s2 += v2 * v2
            s3 += v3 * v3
            s4 += v4 * v4
            s5 += v5 * v5
            s6 += v6 * v6
            s7 += v7 * v7
            i += 8
        while i < hi:
            v = np.float64(a[i])
            s0 += v * v
            i += 1
    else:
        while i < hi:
            v = np.float64(a[i]) / m
            s0 += v * v
            i += 1
    return ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))


def _sumsq_blocks(a, out, block, m):
    """out[k] = sum over block k of (a[i]/m)**2, in float64."""
    for k in numba.prange(out.size):
        out[k] = _block_sumsq(a, k * block, min(a.size, (k + 1) * block), m)


def _sub_scaled_sumsq_blocks(x, u, a, out, block):
    """x <- x - a*u, and out[k] = sum over block k of the new x**2 in float64 (one pass over memory)."""
    for k in numba.prange(out.size):
        lo, hi = k * block, min(x.size, (k + 1) * block)
        for i in range(lo, hi):
            x[i] = x[i] - a * u[i]
        out[k] = _block_sumsq(x, lo, hi, 1.0)


_sumsq_kernel = elementwise(_sumsq_blocks)
_sub_scaled_sumsq_kernel = elementwise(_sub_scaled_sumsq_blocks)


@numba.njit(cache=True)
def _max_abs(a):
    m = 0.0
    for i in range(a.size):
        v = abs(np.float64(a[i]))
        if v > m:
            m = v
    return m


def _fsum(out: np.ndarray) -> float:
    """math.fsum of non-negative block sums; inf (not OverflowError) when the exact sum overflows."""
    try:
        return math.fsum(out)
    except OverflowError:
        return math.inf


def _finish_norm(flat: np.ndarray, out: np.ndarray) -> float:
    """sqrt of the block sums (added exactly), or the scaled recomputation when they over/underflowed;
    nan when an element is nan (a square is nan only for a nan element, so the sum is nan then)."""
    s = _fsum(out)
    if math.isnan(s):
        return math.nan
    if 1e-280 <= s <= 1e280 or s == 0.0 and _max_abs(flat) == 0.0:
        return math.sqrt(s)
    m = _max_abs(flat)
    if not math.isfinite(m) or m == 0.0:
        return m
    _sumsq_kernel(flat, out, NORM_BLOCK, m)
    return m * math.sqrt(_fsum(out))


def _blocks(n: int) -> np.ndarray:
    return np.empty(-(-n // NORM_BLOCK), np.float64)


def fro_norm(a: np.ndarray) -> float:
    """||a||_F = sqrt(sum a_i**2) over the whole array (any shape), as a Python float.

    Squares are accumulated in float64 (also for float32 input) in fixed blocks of :data:`NORM_BLOCK`
    elements, the block sums added exactly (``math.fsum``), so the result does not depend on the thread
    count; when the plain sum of squares would overflow or lose precision to underflow (outside
    [1e-280, 1e280]) the array is first divided by its largest magnitude, as LAPACK's nrm2 scales.
    Returns 0.0 for an empty or all-zero array; nan if ``a`` holds a nan; otherwise inf if it holds an inf.
    """
    flat = np.ascontiguousarray(a).reshape(-1)
    if flat.size == 0:
        return 0.0
    out = _blocks(flat.size)
    _sumsq_kernel(flat, out, NORM_BLOCK, 1.0)
    return _finish_norm(flat, out)


def sub_scaled_norm(x: np.ndarray, u: np.ndarray, a) -> float:
    """x <- x - a*u in place (flat C-contiguous arrays, ``a`` of x's dtype); returns ||x||_F of the result
    (as :func:`fro_norm`, fused into the same pass). ValueError if the arrays differ in size or dtype."""
    if x.ndim != 1 or u.shape != x.shape or u.dtype != x.dtype or not x.flags.c_contiguous or not x.flags.writeable:
        raise ValueError(f"sub_scaled_norm: x and u must be flat writable arrays of one size and dtype, got "
                         f"{x.dtype} {x.shape} and {u.dtype} {u.shape}")
    if x.size == 0:
        return 0.0
    out = _blocks(x.size)
    _sub_scaled_sumsq_kernel(x, u, a, out, NORM_BLOCK)
    return _finish_norm(x, out)


def max_abs(a: np.ndarray) -> float:
    """max |a_i| over the whole array as a Python float (0.0 when empty; nan elements are skipped)."""
    return _max_abs(np.ascontiguousarray(a).reshape(-1)) if a.size else 0.0


def safe_factor(a: float, dtype) -> bool:
    """True when the float64 scalar ``a`` >= 0 is exactly 0 or a finite normal number of ``dtype``, so
    that multiplying an array of ``dtype`` by it neither overflows the scalar nor loses its precision."""
    fi = np.finfo(dtype)
    return a == 0.0 or float(fi.tiny) <= a <= float(fi.max)


def unit_scaled(u: np.ndarray) -> tuple[np.ndarray, float]:
    """(v, m) with m = max|u| and v = u / m (a new array of u's dtype, entries in [-1, 1]): the direction
    rescaled so that its norm is in [1, sqrt(size)], whatever the magnitude of u (tiny subnormal or huge).
    Needs m > 0 finite."""
    m = max_abs(u)
    return u / u.dtype.type(m), m


def sub_scaled(x: np.ndarray, u: np.ndarray, a) -> None:
    """x <- x - a*u in place (``a`` of x's dtype; plain-numpy twin ``x - a*u``)."""
    AXPBY.step(x, u, (), Axpby(x.dtype.type(1), a))


def scale(x: np.ndarray, b) -> None:
    """x <- b*x in place (``b`` of x's dtype; plain-numpy twin ``b*x``)."""
    AXPBY.step(x, x, (), Axpby(b, x.dtype.type(0)))
