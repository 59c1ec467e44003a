"""Covariant optimizer: any base direction, rescaled to a step relative to the weight's own norm."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import numpy as np

from refopt.linalg.norms import fro_norm, safe_factor, scale, sub_scaled, unit_scaled
from refopt.rules import _checks
from refopt.rules.base import DirectionWrapper, rewrap


class CovariantState(NamedTuple):
    """Per-array Covariant state: only the base rule's per-array state."""

    base: Any


def _rms(a: np.ndarray) -> float:
    return fro_norm(a) / math.sqrt(a.size) if a.size else 0.0


_NAMED_NORMS = {"fro": fro_norm, "rms": _rms}

#: probe for validating a user norm: a fixed 4x3 float64 matrix of mixed signs and magnitudes
_PROBE = np.array([[0.5, -1.25, 2.0], [3.0, 0.0, -0.75], [-1.5, 4.0, 0.25], [1.0, -2.5, 0.125]])


def _check_norm(norm) -> None:
    if isinstance(norm, str):
        _checks.one_of("norm", norm, set(_NAMED_NORMS))
        return
    if not callable(norm):
        raise ValueError(f"norm must be 'fro', 'rms' or a function array -> float, got {norm!r}")
    try:
        vals = [float(norm(c * _PROBE)) for c in (1.0, 2.5, 1e-3, 0.0)]
    except Exception as e:  # the user's function failed on the probe: report it as a bad hyperparameter
        raise ValueError(f"norm: the function failed on a 4x3 float64 probe matrix ({e!r})") from e
    n1, n25, nsmall, n0 = vals
    if not (math.isfinite(n1) and n1 > 0):
        raise ValueError(f"norm: a norm must be finite and > 0 on a non-zero array, got {n1!r} on the probe")
    if n0 != 0.0 or abs(n25 - 2.5 * n1) > 1e-9 * 2.5 * n1 or abs(nsmall - 1e-3 * n1) > 1e-9 * 1e-3 * n1:
        raise ValueError("norm: the function is not positively homogeneous (norm(c*a) = c*norm(a) for c >= 0 "
                         f"failed on the probe: c=1 -> {n1!r}, c=2.5 -> {n25!r}, c=1e-3 -> {nsmall!r}, "
                         f"c=0 -> {n0!r})")


@dataclass(frozen=True)
class Covariant(DirectionWrapper):
    r"""The covariant version of a base optimizer: a step of relative size lr along the base direction
    (post 000, eq. (elr-u); with SGD as the base, eq. (elr-g)).

    At step t (t = 1 first), gamma_t = schedule(t), u_t the base rule's direction for this array:

    .. math::

        W_t = W_{t-1} - \mathrm{lr}\, \gamma_t\, \lVert W_{t-1} \rVert \, \frac{u_t}{\lVert u_t \rVert}

    so ``||W_t - W_{t-1}|| / ||W_{t-1}|| = lr * gamma_t`` exactly: lr*gamma_t IS the effective learning rate
    (ELR). The update phi(W, g) satisfies phi(c1 W, c2 g) = c1 phi(W, g) for all c1, c2 > 0 (post 000,
    eq. (phi)) whenever the base direction is invariant to the gradient scale: SGD with or without
    momentum (the buffer scales with g) and without L2 weight decay (lambda*x does not scale with g),
    Adam in the limit eps -> 0 (eps breaks it by ``O(eps/|g|)``), Muon with eps_mode='none' (otherwise up to
    its normalisation eps). ``norm`` is the same for W and u, so it only needs to be positively
    homogeneous; 'fro' and 'rms' give the same step (the sqrt(size) cancels) up to rounding.

    Conventions:
      * Zero norms (PITFALLS B11): u_t = 0 gives no step; ``||W_{t-1}|| = 0`` gives no step (a zero weight has
        ELR 0 under eq. (elr-u), so a zero-initialised array never moves: initialise it non-zero or give
        it another rule). The base state still advances.
      * The base rule contributes only its direction (``direction_leaf``): its ``lr`` is ignored, a base
        ``schedule`` is rejected (use Covariant's), and decoupled weight decay in the base is rejected.
        L2 weight decay of SGD/Adam enters u and is kept. Rule-wide state is the base's (passed through).
      * :func:`refopt.direction` of Covariant is ``||W|| u/||u||`` (zero in the cases above), so Covariant
        can itself be a base (e.g. of :class:`~refopt.rules.hyperball.Hyperball`, where it is the same as
        the bare base since Hyperball normalises u).

    Args:
      base: a refopt rule with a direction (SGD, Adam, AdamW with weight_decay=0, Muon, ...).
      lr: the effective learning rate, lr >= 0 (a relative step; e.g. 1e-3 to 1e-2).
      norm: 'fro' (Frobenius over the whole array, accumulated in float64), 'rms' (Frobenius/sqrt(size)),
        or a function array -> float that is positively homogeneous (norm(c*a) = c*norm(a), c >= 0) and
        > 0 on non-zero arrays (e.g. ``lambda a: np.abs(a).max()``). It is checked on a fixed 4x3 float64
        probe at construction, and its value (finite, >= 0) on every array at every step.
      schedule: optional t -> gamma_t >= 0 multiplying lr.

    Shapes/dtypes: any float32 / float64 array the base accepts; the state is the base state; the
    scalar ``lr*gamma_t*||W||/||u||`` is computed in float64, then cast, so float32 stays float32.
    A tiny (even subnormal) or huge non-zero u is divided by ``max|u|`` before its norm is taken, so the
    step has relative size lr*gamma_t whatever the magnitude of u (the scalar ``lr*gamma_t*||W||/||u||``
    is never formed where it would overflow).

    Raises:
      ValueError: for a bad base (see :meth:`~refopt.rules.base.DirectionWrapper.check_base`), lr < 0, an
        unknown or non-homogeneous norm; during a step, naming the array when a user norm returns a
        negative or non-finite value.
      FloatingPointError: during a step, naming the array when the weights or the base direction hold nan
        or inf ('fro', 'rms').
    """

    lr: float = 1e-3
    norm: str | Callable[[np.ndarray], float] = "fro"
    schedule: Callable[[int], float] | None = None

    def __post_init__(self):
        self.check_base()
        _checks.nonnegative("lr", self.lr)
        _check_norm(self.norm)
        _checks.schedule(self.schedule)

    def _norm(self, a: np.ndarray, what: str, path: str) -> float:
        if isinstance(self.norm, str):
            v = _NAMED_NORMS[self.norm](a)
            if v == math.inf and what == "u" and np.isfinite(a).all():
                return v               # a finite u whose norm overflows: _ratio rescales it
            if not math.isfinite(v):
                held = "weights" if what == "W" else f"direction of the base rule {type(self.base).__name__}"
                raise FloatingPointError(f"Covariant: the {held} at {path} hold nan or inf (||{what}|| = {v!r})")
            return v
        with np.errstate(over="ignore"):   # an overflowing norm of a finite u is handled just below
            v = float(self.norm(a))
        if v == math.inf and what == "u" and np.isfinite(a).all():
            return v                   # a user norm is positively homogeneous too: _ratio rescales u
        if not (math.isfinite(v) and v >= 0):
            raise ValueError(f"Covariant: norm({what}) = {v!r} at {path}; a norm must be finite and >= 0")
        return v

    def init_leaf(self, x, path):
        return CovariantState(self.base.init_leaf(x, path))

    def leaf_spec(self, x, path):
        return CovariantState(self.base.leaf_spec(x, path))

    def _ratio(self, s, x, g, path, ctx, lr_t):
        """(v, a, new state) with a*v = lr_t*||W|| u/||u|| (0 when a norm is 0): v = u when the scalar
        a = lr_t*||W||/||u|| is a safe factor of x's dtype, else v = u/max|u| (a new array) and
        a = lr_t*||W||/||v||, so that a tiny (subnormal) or huge u never makes the scalar overflow."""
        u, sb = self.base_direction(ctx, s, x, g, path)
        nw = self._norm(x, "W", path)
        nu = self._norm(u, "u", path)
        if nu == math.inf:                 # ||u|| / max|u| is finite: the ratio below is taken on u / max|u|
            u, _ = unit_scaled(u)
            nu = self._norm(u, "u", path)
        if not (nw > 0.0 and nu > 0.0):
            return u, 0.0, rewrap(s, sb)
        a = lr_t * (nw / nu)
        if not safe_factor(a, x.dtype):
            u, _ = unit_scaled(u)
            a = lr_t * (nw / self._norm(u, "u", path))
        return u, a, rewrap(s, sb)

    def update_leaf(self, ctx, s, x, g, path):
        u, a, s = self._ratio(s, x, g, path, ctx, float(ctx.lr_t))
        if a > 0.0:
            sub_scaled(x.reshape(-1), u.reshape(-1), x.dtype.type(a))
        return x, s

    def direction_leaf(self, ctx, s, x, g, path):
        u, a, s = self._ratio(s, x, g, path, ctx, 1.0)
        scale(u.reshape(-1), x.dtype.type(a))
        return u, s
