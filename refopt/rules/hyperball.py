"""Hyperball (MuonH, AdamH): a relative step along a base rule's direction, then back onto a sphere."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import numpy as np

from refopt.core import ArraySpec
from refopt.linalg.norms import fro_norm, safe_factor, scale, sub_scaled_norm, unit_scaled
from refopt.rules import _checks
from refopt.rules.base import DirectionWrapper, rewrap


class HyperballState(NamedTuple):
    """Per-array Hyperball state: the radius R (a 0-d array of x's dtype, fixed at init) and the base
    rule's own per-array state."""

    radius: np.ndarray
    base: Any


@dataclass(frozen=True)
class Hyperball(DirectionWrapper):
    r"""Hyperball: a relative step of angle about lr along a base direction, then projection back onto
    the sphere of radius R (post 000 "Hyperball"; post 002 MuonH; Wen, Dang, Lyu, Ma, Liang 2026,
    arXiv:2606.16899; CONVENTIONS.md 6).

    At step t (t = 1 first), gamma_t = schedule(t), u_t the base rule's direction for this array:

    .. math::

        y_t &= W_{t-1} - \mathrm{lr}\, \gamma_t\, R\, N(u_t) \\
        W_t &= R\, N(y_t) \qquad \text{with } N(v) = v / \lVert v \rVert_F, \text{ and } N(0) = 0

    ``||.||_F`` is the Frobenius norm over the whole array (any ndim), accumulated in float64 (:func:`fro_norm`).
    With u_t orthogonal to W the angle turned is atan(lr * gamma_t); ``||W_t||_F = R`` after every step
    (to rounding; no drift, since R is stored, not re-read from W). ``Hyperball(Muon(...))`` is MuonH,
    ``Hyperball(Adam(...))`` is AdamH (the base's eps placement, betas, momentum... are kept).

    Conventions:
      * ``R = ||W_0||_F`` of each array, taken at :func:`refopt.init` and kept in the state (so it survives
        a checkpoint), or ``radius`` for every array when given (NVIDIA Emerging-Optimizers' single
        radius, but refopt does not require ``||W_0|| = radius``: the first step projects onto the sphere).
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
      base: a refopt rule with a direction (SGD, Adam, AdamW with weight_decay=0, Muon, Lion, Covariant,
        ...). It may restrict the arrays it takes (Muon: matrices).
      lr: relative step lr >= 0 (an angle in radians for small lr; MNG used 0.014-0.018 for MuonH).
      radius: None (``R = ||W_0||_F`` per array) or R > 0 for every array.
      schedule: optional t -> gamma_t >= 0 multiplying lr.

    Shapes/dtypes: any float32 / float64 array the base accepts; the state holds R (0-d, x's dtype) and
    the base state; scalars are computed in float64 and cast, so float32 stays float32.
    A tiny (even subnormal) or huge non-zero u is rescaled by ``1/max|u|`` before its norm is taken, so
    the step is lr*gamma_t*R*N(u) whatever the magnitude of u.

    Raises:
      ValueError: for a bad base (see :meth:`~refopt.rules.base.DirectionWrapper.check_base`), lr < 0,
        radius <= 0 or not finite; at :func:`refopt.init`, naming the array when radius is None and the
        array is all zero (its sphere would be the single point 0 and it could never move: give
        ``radius`` or partition it to another rule), or when the array holds nan or inf.
      FloatingPointError: during a step, naming the array when the weights or the base direction hold
        nan or inf.
    """

    lr: float = 0.01
    radius: float | None = None
    schedule: Callable[[int], float] | None = None

    def __post_init__(self):
        self.check_base()
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

    def leaf_spec(self, x, path):
        return HyperballState(ArraySpec((), x.dtype), self.base.leaf_spec(x, path))

    def update_leaf(self, ctx, s, x, g, path):
        u, sb = self.base_direction(ctx, s, x, g, path)
        d = x.dtype.type
        r = float(s.radius)
        nu = fro_norm(u)
        if not math.isfinite(nu):
            if not np.isfinite(u).all():
                raise FloatingPointError(f"Hyperball: the direction of the base rule {type(self.base).__name__} "
                                         f"at {path} holds nan or inf (||u||_F = {nu!r})")
            u, _ = unit_scaled(u)          # a finite u whose norm overflows: N(u) = N(u / max|u|)
            nu = fro_norm(u)
        flat = x.reshape(-1)
        if nu > 0.0:                                                     # y = W - lr_t*R*u/||u||
            a = float(ctx.lr_t) * r / nu
            if not safe_factor(a, x.dtype):                              # tiny or huge u: use u/max|u|
                u, _ = unit_scaled(u)
                a = float(ctx.lr_t) * r / fro_norm(u)
            ny = sub_scaled_norm(flat, u.reshape(-1), d(a))
        else:
            ny = fro_norm(flat)
        if not math.isfinite(ny):
            raise FloatingPointError(f"Hyperball: the weights at {path} hold nan or inf (||y||_F = {ny!r}): "
                                     f"parameters must be finite")
        if ny > 0.0:
            scale(flat, d(r / ny))                                       # W = R*y/||y||
        return x, rewrap(s, sb)
