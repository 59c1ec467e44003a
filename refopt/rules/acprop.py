"""ACProp (Zhuang, Ding, Tang, Dvornek, Tatikonda & Duncan 2021): the gradient divided by the *previous* step's
centered second moment (the EMA of (g - m)^2, as AdaBelief's), in optax.contrib.acprop's form (the deviation from
the previous m, eps_root stored in s, s bias-corrected, the first step's denominator 1 + eps, the decay added to
the update before the lr)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import numba
import numpy as np

from refopt.kernels import Elementwise
from refopt.rules import _checks
from refopt.rules.base import ElementwiseRule, lr_at


class ACPropState(NamedTuple):
    """Per-array state, each like x: the first moment ``m`` and the centered second moment ``s`` (EMA of
    (g - m_{t-1})^2 + eps_root)."""

    m: np.ndarray
    s: np.ndarray


class ACPropContext(NamedTuple):
    lr_t: float
    decay: float      # 1 - lr_t weight_decay
    step: float       # lr_t
    u_scale: float    # 1
    beta1: float
    omb1: float
    beta2: float
    omb2: float
    eps: float
    eps_root: float
    bc2_prev: float   # 1 - beta2^(t-1) (1 at t = 1, unused there)
    first_den: float  # 1 + eps: the denominator of the first step (s_hat_0 taken as 1)
    first: bool       # t = 1


@numba.njit
def _acprop(x, g, s, i, c):
    m_prev = s.m[i]
    s_prev = s.s[i]
    d = g - m_prev
    s.m[i] = c.beta1 * m_prev + c.omb1 * g
    s.s[i] = c.beta2 * s_prev + c.omb2 * (d * d) + c.eps_root
    if c.first:
        return g / c.first_den
    return g / (np.sqrt(s_prev / c.bc2_prev) + c.eps)


_ACPROP = Elementwise(_acprop, "acprop")


@dataclass(frozen=True)
class ACProp(ElementwiseRule):
    r"""ACProp as optax.contrib.acprop (Zhuang et al. 2021, "Momentum Centering and Asynchronous Update for
    Adaptive Gradient Methods", the ACProp algorithm). At step t (t = 1 first), gamma_t = schedule(t),
    lr_t = lr gamma_t:

    .. math::

        u_t &= \frac{g_t}{\sqrt{s_{t-1} / (1 - \beta_2^{t-1})} + \epsilon} \quad (t \ge 2), \qquad
        u_1 = \frac{g_1}{1 + \epsilon} \\
        m_t &= \beta_1 m_{t-1} + (1 - \beta_1)\, g_t \\
        s_t &= \beta_2 s_{t-1} + (1 - \beta_2)\, (g_t - m_{t-1})^2 + \epsilon_{root} \\
        x_t &= x_{t-1} - \mathrm{lr}_t\, (u_t + \lambda\, x_{t-1})

    from m_0 = s_0 = 0. The update is asynchronous: u_t divides the current gradient by the second moment of
    the previous step, s_{t-1}; m serves only to center s. Where optax departs from the paper:

    * the paper centers on the updated first moment, (g_t - m_t)^2; optax on the previous one, (g_t - m_{t-1})^2;
    * the paper divides by sqrt(s_{t-1}) with its eps only inside s (eps_root here); optax bias-corrects
      s_{t-1} by 1 - beta2^(t-1), adds eps after the root, and takes s_hat_0 = 1 on the first step;
    * the paper has no weight decay; optax adds lambda x to the update before the lr (decoupled, scaled by
      lr_t).

    Args:
      lr: >= 0 (1e-3).
      beta1, beta2: in [0, 1) (0.9, 0.999).
      eps: > 0, added after the square root (optax 1e-16).
      eps_root: >= 0, added to s every step (optax 1e-16).
      weight_decay: lambda >= 0 (0).
      schedule: t -> gamma_t.

    Shapes/dtypes: any float32 / float64 array; ``m``, ``s`` like x.

    Raises:
      ValueError: for a hyperparameter out of its range or a non-callable schedule.
    """

    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-16
    eps_root: float = 1e-16
    weight_decay: float = 0.0
    schedule: Callable[[int], float] | None = None

    State = ACPropState

    def __post_init__(self):
        _checks.nonnegative("lr", self.lr)
        _checks.unit_interval("beta1", self.beta1)
        _checks.unit_interval("beta2", self.beta2)
        _checks.positive("eps", self.eps)
        _checks.nonnegative("eps_root", self.eps_root)
        _checks.nonnegative("weight_decay", self.weight_decay)
        _checks.schedule(self.schedule)

    def squares_grads(self, s):
        return True

    def decoupled_decay(self):
        return self.weight_decay > 0

    def context(self, t, glob):
        lr_t, b1, b2, eps = lr_at(self, t), float(self.beta1), float(self.beta2), float(self.eps)
        first = t == 1
        return ACPropContext(lr_t, 1.0 - lr_t * float(self.weight_decay), lr_t, 1.0, b1, 1.0 - b1, b2, 1.0 - b2,
                             eps, float(self.eps_root), 1.0 if first else 1.0 - b2 ** (t - 1), 1.0 + eps,
                             first), glob

    def kernel(self):
        return _ACPROP
