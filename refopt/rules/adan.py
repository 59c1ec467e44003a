"""Adan (Xie, Zhou, Li, Lin & Yan 2022, Algorithm 1): Nesterov momentum estimated from gradient differences,
in optax.adan's form (betas as weights of the old averages, bias corrections, decay added to the update)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import numba
import numpy as np

from refopt.kernels import Elementwise
from refopt.rules import _checks
from refopt.rules.base import ElementwiseRule, lr_at


class AdanState(NamedTuple):
    """Per-array state, each like x: the gradient average ``m``, the gradient-difference average ``v``, the
    second moment ``n`` of g + (1 - beta2) (g - g_prev), and the previous gradient ``prev``."""

    m: np.ndarray
    v: np.ndarray
    n: np.ndarray
    prev: np.ndarray


class AdanContext(NamedTuple):
    lr_t: float
    decay: float      # 1 - lr_t weight_decay
    step: float       # lr_t
    u_scale: float    # 1
    beta1: float
    omb1: float
    beta2: float
    omb2: float
    beta3: float
    omb3: float
    eps: float
    eps_root: float
    bc1: float
    bc2: float
    bc3: float
    first: bool       # t = 1: no gradient difference yet


@numba.njit
def _adan(x, g, s, i, c):
    diff = g * 0.0 if c.first else g - s.prev[i]
    m = c.beta1 * s.m[i] + c.omb1 * g
    v = c.beta2 * s.v[i] + c.omb2 * diff
    sq = g + c.omb2 * diff
    n = c.beta3 * s.n[i] + c.omb3 * (sq * sq)
    s.m[i] = m
    s.v[i] = v
    s.n[i] = n
    s.prev[i] = g
    return (m / c.bc1 + c.omb2 * (v / c.bc2)) / (np.sqrt(n / c.bc3 + c.eps_root) + c.eps)


_ADAN = Elementwise(_adan, "adan")


@dataclass(frozen=True)
class Adan(ElementwiseRule):
    r"""Adan as optax.adan. At step t (t = 1 first), gamma_t = schedule(t), lr_t = lr gamma_t, d_t = g_t -
    g_{t-1} (d_1 = 0):

    .. math::

        m_t &= \beta_1 m_{t-1} + (1 - \beta_1)\, g_t, \qquad v_t = \beta_2 v_{t-1} + (1 - \beta_2)\, d_t \\
        n_t &= \beta_3 n_{t-1} + (1 - \beta_3)\, (g_t + (1 - \beta_2) d_t)^2 \\
        u_t &= \frac{\hat m_t + (1 - \beta_2)\, \hat v_t}{\sqrt{\hat n_t + \epsilon_{root}} + \epsilon},
        \qquad \hat\cdot = \cdot / (1 - \beta^t) \\
        x_t &= x_{t-1} - \mathrm{lr}_t\, (u_t + \lambda\, x_{t-1})

    The betas weigh the old averages (optax's convention; the paper's beta_k are 1 - these: 0.02, 0.08, 0.01).
    The paper's decay is proximal, x_t = (x_{t-1} - lr u_t) / (1 + lr lambda); optax adds lambda x to the
    update (the two agree to first order in lr lambda).

    Args:
      lr: >= 0 (1e-3).
      beta1, beta2, beta3: in [0, 1) (0.98, 0.92, 0.99).
      eps: > 0 (1e-8); eps_root: >= 0 (optax.adan's 1e-8).
      weight_decay: >= 0.
      schedule: t -> gamma_t.

    Shapes/dtypes: any float32 / float64 array; ``m``, ``v``, ``n``, ``prev`` like x.

    Raises:
      ValueError: for a hyperparameter out of its range or a non-callable schedule.
    """

    lr: float = 1e-3
    beta1: float = 0.98
    beta2: float = 0.92
    beta3: float = 0.99
    eps: float = 1e-8
    eps_root: float = 1e-8
    weight_decay: float = 0.0
    schedule: Callable[[int], float] | None = None

    State = AdanState

    def __post_init__(self):
        _checks.nonnegative("lr", self.lr)
        for name in ("beta1", "beta2", "beta3"):
            _checks.unit_interval(name, getattr(self, name))
        _checks.positive("eps", self.eps)
        _checks.nonnegative("eps_root", self.eps_root)
        _checks.nonnegative("weight_decay", self.weight_decay)
        _checks.schedule(self.schedule)

    def squares_grads(self, s):
        return True

    def decoupled_decay(self):
        return self.weight_decay > 0

    def context(self, t, glob):
        lr_t = lr_at(self, t)
        b1, b2, b3 = float(self.beta1), float(self.beta2), float(self.beta3)
        return AdanContext(lr_t, 1.0 - lr_t * float(self.weight_decay), lr_t, 1.0, b1, 1.0 - b1, b2, 1.0 - b2,
                           b3, 1.0 - b3, float(self.eps), float(self.eps_root), 1.0 - b1 ** t, 1.0 - b2 ** t,
                           1.0 - b3 ** t, t == 1), glob

    def kernel(self):
        return _ADAN
