"""Rprop (Riedmiller & Braun 1993) without weight backtracking (iRprop-, Igel & Huesken 2000): a per-entry step
size grown by eta_plus while the gradient keeps its sign and shrunk by eta_minus when it flips, the move being
-sign(g) step; in torch.optim.Rprop's form and optax.rprop's (whose update is the previous step's)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numba
import numpy as np

from refopt.kernels import Elementwise
from refopt.rules import _checks
from refopt.rules.base import ElementwiseRule


class RpropState(NamedTuple):
    """Per-array state, each like x: the previous effective gradient ``prev`` (0 where its sign flipped) and
    the step size ``step_size`` (``lr`` at init)."""

    prev: np.ndarray
    step_size: np.ndarray


class RpropContext(NamedTuple):
    lr_t: float           # lr (the initial step size; Rprop has no schedule)
    decay: float          # 1
    step: float           # 1 (the step size is per entry, in the state)
    u_scale: float        # 1
    eta_minus: float
    eta_plus: float
    step_size_min: float
    step_size_max: float
    delayed: bool         # optax: the update is the previous step's


@numba.njit
def _rprop(x, g, s, i, c):
    prev, st = s.prev[i], s.step_size[i]
    p = g * prev
    u_old = st * np.sign(prev)             # the previous step's update (optax's prev_updates)
    if p > 0:
        st = min(max(st * c.eta_plus, c.step_size_min), c.step_size_max)
    elif p < 0:
        st = min(max(st * c.eta_minus, c.step_size_min), c.step_size_max)
    elif not c.delayed:                    # torch clamps the unchanged step size too
        st = min(max(st, c.step_size_min), c.step_size_max)
    if p < 0:
        g = g * 0.0
    s.prev[i] = g
    s.step_size[i] = st
    if c.delayed:
        return u_old * 0.0 if p < 0 else u_old
    return np.sign(g) * st


_RPROP = Elementwise(_rprop, "rprop")


@dataclass(frozen=True)
class Rprop(ElementwiseRule):
    r"""Rprop as torch.optim.Rprop (``form='torch'``) or optax.rprop (``'optax'``). At step t (t = 1 first),
    with p_t = g_t g'_{t-1} (g' the effective gradient, g'_0 = 0) and s_0 = lr:

    .. math::

        s_t &= \mathrm{clip}\big(s_{t-1} \cdot \{\eta_+ \text{ if } p_t > 0;\ \eta_- \text{ if } p_t < 0;\
        1 \text{ if } p_t = 0\},\ s_{\min}, s_{\max}\big) \\
        g'_t &= 0 \text{ where } p_t < 0, \text{ else } g_t \\
        x_t &= x_{t-1} - \mathrm{sign}(g'_t)\, s_t \qquad \text{(torch)} \\
        x_t &= x_{t-1} - [p_t \ge 0]\, \mathrm{sign}(g'_{t-1})\, s_{t-1} \qquad \text{(optax: the previous
        step's update)}

    optax leaves s unclipped where p_t = 0 (the same unless lr is outside [s_min, s_max]) and applies at step t
    the update it computed at step t - 1 (none at step 1), zeroed where the sign flips at t; measured in the
    divergence atlas (rprop-lag). torch's form is iRprop- (Igel & Huesken 2000): on a sign flip the step size
    shrinks and the entry does not move, with no backtracking of the last move.

    Args:
      lr: > 0, the initial step size s_0 (torch 1e-2).
      eta_minus: in (0, 1) (0.5); eta_plus: > 1 (1.2) (torch's ``etas``).
      step_size_min: >= 0 (1e-6); step_size_max: >= step_size_min (50) (torch's ``step_sizes``).
      form: 'torch' or 'optax'.

    Shapes/dtypes: any float32 / float64 array; ``prev``, ``step_size`` like x.

    Raises:
      ValueError: for a hyperparameter out of its range or an unknown form.
    """

    lr: float = 1e-2
    eta_minus: float = 0.5
    eta_plus: float = 1.2
    step_size_min: float = 1e-6
    step_size_max: float = 50.0
    form: str = "torch"

    State = RpropState

    def __post_init__(self):
        if not _checks.finite_number("lr", self.lr) > 0:
            raise ValueError(f"lr (the initial step size) must be > 0, got {self.lr!r}")
        if not 0 < _checks.finite_number("eta_minus", self.eta_minus) < 1:
            raise ValueError(f"eta_minus must be in (0, 1), got {self.eta_minus!r}")
        if not _checks.finite_number("eta_plus", self.eta_plus) > 1:
            raise ValueError(f"eta_plus must be > 1, got {self.eta_plus!r}")
        _checks.nonnegative("step_size_min", self.step_size_min)
        if not _checks.finite_number("step_size_max", self.step_size_max) >= self.step_size_min:
            raise ValueError(f"step_size_max must be >= step_size_min, got {self.step_size_max!r} < "
                             f"{self.step_size_min!r}")
        _checks.one_of("form", self.form, {"torch", "optax"})

    def init_leaf(self, x, path):
        return RpropState(np.zeros_like(x), np.full_like(x, self.lr))

    def context(self, t, glob):
        return RpropContext(float(self.lr), 1.0, 1.0, 1.0, float(self.eta_minus), float(self.eta_plus),
                            float(self.step_size_min), float(self.step_size_max), self.form == "optax"), glob

    def kernel(self):
        return _RPROP
