"""Hyperball (MuonH, AdamH): a relative step along a base rule's direction, then back onto a sphere.

Also home of what the direction wrappers share (:class:`Hyperball` here, :class:`~refopt.rules.covariant.
Covariant`): the float64 Frobenius norm :func:`fro_norm`, the base-rule checks and the step context.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Callable, NamedTuple

import numba
import numpy as np

from refopt.core import Rule
from refopt.kernels import elementwise
from refopt.rules import _checks

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
    (as :func:`fro_norm`, fused into the same pass)."""
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


def _sub_scaled(x, u, a):
    """x <- x - a*u (``a`` of x's dtype)."""
    for i in numba.prange(x.size):
        x[i] = x[i] - a * u[i]


def _scale(x, b):
    """x <- b*x (``b`` of x's dtype)."""
    for i in numba.prange(x.size):
        x[i] = b * x[i]


#: elementwise kernels of the wrappers over flat arrays (plain-numpy twins: ``x - a*u``, ``b*x``)
sub_scaled = elementwise(_sub_scaled)
scale = elementwise(_scale)


# ---------------------------------------------------------------------------------------------------
# What the direction wrappers share.

class WrapperContext(NamedTuple):
    """One step's scalars of a direction wrapper: its own ``lr * gamma_t`` and the base rule's context."""

    lr_t: float
    base: Any


#: wd_mode values whose weight decay is L2 (inside the gradient, hence inside the direction u)
_COUPLED_WD_MODES = frozenset({"l2", "coupled"})


def _nested_rules(rule: Rule):
    """The rules inside ``rule``'s fields (a wrapper's base, a Partition's rules), depth first."""
    for f in fields(rule):
        stack = [getattr(rule, f.name)]
        while stack:
            v = stack.pop()
            if isinstance(v, Rule):
                yield v
                yield from _nested_rules(v)
            elif isinstance(v, dict):
                stack.extend(v.values())
            elif isinstance(v, (list, tuple)):
                stack.extend(v)


def check_direction_base(owner: str, base: Any) -> None:
    """Validate the base rule of a direction wrapper (Hyperball, Covariant).

    Raises ValueError when ``base`` is not a refopt rule, has no additive direction (no
    ``direction_leaf``, e.g. an averaging wrapper), or when it or a rule nested in it (a Partition's
    rules, an inner wrapper's base) carries its own ``schedule`` (only directions are used, so it would
    be ignored: pass the schedule to the wrapper) or decoupled / lr-independent weight decay > 0 (AdamW,
    Muon with ``weight_decay``: such a decay acts on x, not on u, so it would be silently dropped).
    L2 decay (SGD's and Adam's ``weight_decay``) is part of the gradient, so of u, and is kept.
    """
    if not isinstance(base, Rule):
        raise ValueError(f"{owner}: base must be a refopt rule, got {type(base).__name__}")
    if type(base).direction_leaf is Rule.direction_leaf:
        raise ValueError(f"{owner}: base rule {type(base).__name__} has no additive direction "
                         f"(it defines no direction_leaf), so it cannot be wrapped")
    for r in (base, *_nested_rules(base)):
        name = type(r).__name__
        if getattr(r, "schedule", None) is not None:
            raise ValueError(f"{owner}: the schedule of the base rule {name} would be ignored (only its "
                             f"direction is used); pass schedule= to {owner} instead")
        wd_mode = getattr(r, "wd_mode", None)
        if wd_mode is not None and wd_mode not in _COUPLED_WD_MODES and getattr(r, "weight_decay", 0) > 0:
            raise ValueError(f"{owner}: the base rule {name} has {wd_mode} weight_decay={r.weight_decay}, which "
                             f"acts on the weights, not on the direction, so {owner} would drop it; set it to 0 "
                             f"(the norm control of {owner} replaces weight decay)")


def base_direction(base: Rule, ctx: Any, s: Any, x: np.ndarray, g: np.ndarray, path: str):
    """The base rule's direction u for one array (a C-contiguous array like x) and its new state."""
    u, sb = base.direction_leaf(ctx, s, x, g, path)
    if not isinstance(u, np.ndarray) or u.shape != x.shape or u.dtype != x.dtype:
        raise ValueError(f"{type(base).__name__}.direction_leaf returned a direction that is not an array of "
                         f"x's shape {x.shape} and dtype {x.dtype} at {path}")
    return np.ascontiguousarray(u), sb


# ---------------------------------------------------------------------------------------------------

class HyperballState(NamedTuple):
    """Per-array Hyperball state: the radius R (a 0-d array of x's dtype, fixed at init) and the base
    rule's own per-array state."""

    radius: np.ndarray
    base: Any


@dataclass(frozen=True)
class Hyperball(Rule):
    r"""Hyperball: a relative step of angle about lr along a base direction, then projection back onto
    the sphere of radius R (seed 000 "Hyperball"; seed 002 MuonH; Wen, Dang, Lyu, Ma, Liang 2026,
    arXiv:2606.16899; CONVENTIONS.md 6).

    At step t (t = 1 first), gamma_t = schedule(t), u_t the base rule's direction for this array::

        y_t = W_{t-1} - lr * gamma_t * R * N(u_t)
        W_t = R * N(y_t)                 with N(v) = v / ||v||_F, and N(0) = 0

    ||.||_F is the Frobenius norm over the whole array (any ndim), accumulated in float64 (:func:`fro_norm`).
    With u_t orthogonal to W the angle turned is atan(lr * gamma_t); ||W_t||_F = R after every step
    (to rounding; no drift, since R is stored, not re-read from W). ``Hyperball(Muon(...))`` is MuonH,
    ``Hyperball(Adam(...))`` is AdamH (the base's eps placement, betas, momentum... are kept).

    Conventions:
      * R = ||W_0||_F of each array, taken at :func:`refopt.init` and kept in the state (so it survives
        a checkpoint), or ``radius`` for every array when given (NVIDIA Emerging-Optimizers' single
        radius, but refopt does not require ||W_0|| = radius: the first step projects onto the sphere).
      * Zero norms (PITFALLS B11), via N(0) = 0, always finite: u_t = 0 gives W_t = R N(W_{t-1}), i.e.
        W unchanged when it is on the sphere; y_t = 0 (only when W_{t-1} = lr*gamma_t*R*N(u_t), e.g.
        W = 0 with lr*gamma_t = 0) gives W_t = 0, and the next non-zero step lands on the sphere again;
        W_{t-1} = 0 with lr*gamma_t > 0 gives W_t = -R N(u_t). MNG's ``max(||u||, eps)`` and NVEO's exact
        zero for a zero update agree with this for exact zeros.
      * The base rule contributes only its direction (``direction_leaf``): its ``lr`` is ignored, a base
        ``schedule`` is rejected (use Hyperball's), and decoupled weight decay in the base is rejected
        (the sphere replaces weight decay; NVEO's MuonHyperball default WD 0.01 is not reproduced).
        L2 weight decay of SGD/Adam enters u and is kept. Rule-wide state is the base's (passed through).

    Args:
      base: a refopt rule with a direction (SGD, Adam, AdamW with weight_decay=0, Muon, Covariant, ...).
        It may restrict the arrays it takes (Muon: matrices).
      lr: relative step lr >= 0 (an angle in radians for small lr; MNG used 0.014-0.018 for MuonH).
      radius: None (R = ||W_0||_F per array) or R > 0 for every array.
      schedule: optional t -> gamma_t >= 0 multiplying lr.

    Shapes/dtypes: any float32 / float64 array the base accepts; the state holds R (0-d, x's dtype) and
    the base state; scalars are computed in float64 and cast, so float32 stays float32.
    Raises: ValueError for a bad base (see :func:`check_direction_base`), lr < 0, radius <= 0 or not
      finite; at :func:`refopt.init`, ValueError naming the array when radius is None and the array is
      all zero (its sphere would be the single point 0 and it could never move: give ``radius`` or
      partition it to another rule), or when the array holds nan or inf; during a step,
      FloatingPointError naming the array when the weights or the base direction hold nan or inf.
      A tiny (even subnormal) or huge non-zero u is rescaled by 1/max|u| before its norm is taken, so
      the step is lr*gamma_t*R*N(u) whatever the magnitude of u.
    """

    base: Rule
    lr: float = 0.01
    radius: float | None = None
    schedule: Callable[[int], float] | None = None

    def __post_init__(self):
        check_direction_base("Hyperball", self.base)
        _checks.nonnegative("lr", self.lr)
        if self.radius is not None:
            _checks.positive("radius", self.radius)
        _checks.schedule(self.schedule)

    def init_leaf(self, x, path):
        if not np.isfinite(x).all():
            raise ValueError(f"Hyperball: the array at {path} holds nan or inf; parameters must be finite")
        r = fro_norm(x) if self.radius is None else float(self.radius)
        if r == 0.0:
            raise ValueError(f"Hyperball: the array at {path} is all zero, so its radius ||W_0||_F is 0 and it "
                             f"could never move; pass radius=, initialize it non-zero, or give it another rule "
                             f"(refopt.Partition)")
        radius = np.array(r, dtype=x.dtype)
        if not np.isfinite(radius):
            raise ValueError(f"Hyperball: the radius {r!r} of the array at {path} is not finite in {x.dtype}")
        return HyperballState(radius, self.base.init_leaf(x, path))

    def check_params(self, paths):
        self.base.check_params(paths)

    def init_global(self):
        return self.base.init_global()

    def context(self, t, glob):
        base_ctx, glob = self.base.context(t, glob)
        return WrapperContext(self.lr * _checks.schedule_multiplier(self.schedule, t), base_ctx), glob

    def update_leaf(self, ctx, s, x, g, path):
        u, sb = base_direction(self.base, ctx.base, s.base, x, g, path)
        d = x.dtype.type
        r = float(s.radius)
        nu = fro_norm(u)
        if not math.isfinite(nu):
            if not np.isfinite(x).all():
                raise FloatingPointError(f"Hyperball: the weights at {path} hold nan or inf: parameters must be "
                                         f"finite")
            raise FloatingPointError(f"Hyperball: the direction of the base rule {type(self.base).__name__} at "
                                     f"{path} holds nan or inf (||u||_F = {nu!r})")
        flat = x.reshape(-1)
        if nu > 0.0:                                                     # y = W - lr_t*R*u/||u||
            a = ctx.lr_t * r / nu
            if not safe_factor(a, x.dtype):                              # tiny or huge u: use u/max|u|
                u, _ = unit_scaled(u)
                a = ctx.lr_t * r / fro_norm(u)
            ny = sub_scaled_norm(flat, u.reshape(-1), d(a))
        else:
            ny = fro_norm(flat)
        if not math.isfinite(ny):
            raise FloatingPointError(f"Hyperball: the weights at {path} hold nan or inf (||y||_F = {ny!r}): "
                                     f"parameters must be finite")
        if ny > 0.0:
            scale(flat, d(r / ny))                                       # W = R*y/||y||
        return x, HyperballState(s.radius, sb)


def hyperball_reference(x, u, radius, lr_t):
    """Plain-numpy twin of one Hyperball step given the base direction u (float64 norms)."""
    d = x.dtype.type
    nu = float(np.linalg.norm(u.astype(np.float64)))
    y = x - d(lr_t * radius / nu) * u if nu > 0 else x.copy()
    ny = float(np.linalg.norm(y.astype(np.float64)))
    return d(radius / ny) * y if ny > 0 else y
