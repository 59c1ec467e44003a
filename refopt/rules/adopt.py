"""ADOPT (Taniguchi, Harada, Minegishi, Oshima, Jeong, Nagahara, Iiyama, Suzuki, Iwasawa & Matsuo 2024): Adam
with the gradient normalised by the *previous* second moment before it enters the momentum, in
optax.contrib.adopt's form (the first gradient only fills v; the normalised gradient clipped at t^(1/4))."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import numba
import numpy as np

from refopt.kernels import Elementwise
from refopt.rules import _checks
from refopt.rules.base import ElementwiseRule, lr_at


class ADOPTState(NamedTuple):
    """Per-array state, each like x: the momentum ``m`` of the normalised gradients and the second moment
    ``v`` (zero at init; v = g_1^2 after the first step)."""

    m: np.ndarray
    v: np.ndarray


class ADOPTContext(NamedTuple):
    lr_t: float
    decay: float      # 1 (no decay)
    step: float       # lr_t
    u_scale: float    # 1
    first: bool       # t = 1: v = g^2, no step
    beta1: float
    omb1: float
    beta2: float
    omb2: float
    eps: float
    clip: bool
    clip_value: float  # (t - 1)^clip_exponent
    nesterov: bool    # the step beta1 m + (1 - beta1) a in place of m


@numba.njit
def _adopt(x, g, s, i, c):
    g2 = g * g
    if c.first:
        s.v[i] = g2
        return 0.0
    a = g / max(np.sqrt(s.v[i]), c.eps)
    if c.clip:
        a = min(max(a, -c.clip_value), c.clip_value)
    m = c.beta1 * s.m[i] + c.omb1 * a
    s.m[i] = m
    s.v[i] = c.beta2 * s.v[i] + c.omb2 * g2
    if c.nesterov:
        return c.beta1 * m + c.omb1 * a
    return m


_ADOPT = Elementwise(_adopt, "adopt")


@dataclass(frozen=True)
class ADOPT(ElementwiseRule):
    r"""ADOPT as optax.contrib.adopt (Taniguchi et al. 2024, Algorithm 2 with the clipped variant of its
    Section 4). The first step (t = 1) only sets :math:`v_1 = g_1^2` and leaves x; for t >= 2, with
    gamma_t = schedule(t) and :math:`c_t = (t - 1)^{p}` (p = clip_exponent):

    .. math::

        a_t &= \mathrm{clip}\Big(\frac{g_t}{\max(\sqrt{v_{t-1}}, \epsilon)}, -c_t, c_t\Big) \\
        m_t &= \beta_1 m_{t-1} + (1 - \beta_1)\, a_t \\
        v_t &= \beta_2 v_{t-1} + (1 - \beta_2)\, g_t^2 \\
        x_t &= x_{t-1} - \mathrm{lr}\, \gamma_t\, m_t
        \quad (\text{Nesterov: } \beta_1 m_t + (1 - \beta_1)\, a_t \text{ in place of } m_t)

    The paper counts its steps from 0 with :math:`v_0 = g_0^2`, so its step k is t = k + 1 here and its clip
    value :math:`k^{1/4}` is :math:`(t - 1)^{1/4}`. Unlike Adam, g_t is normalised by :math:`v_{t-1}`, which does
    not contain g_t, and the momentum averages normalised gradients: no bias correction, and the paper's
    convergence holds for any beta2.

    Args:
      lr: >= 0 (optax: required; the paper 1e-3).
      beta1: in [0, 1) (0.9); beta2: in [0, 1) (0.9999).
      eps: > 0, the floor of sqrt(v) (1e-6).
      clip: clip the normalised gradient at c_t (True, optax's ``use_clipping``).
      clip_exponent: p >= 0 of c_t = (t - 1)^p (0.25: optax's default ``clip_value_fn``).
      nesterov: the Nesterov form of the step (False).
      schedule: t -> gamma_t.

    Shapes/dtypes: any float32 / float64 array; ``m``, ``v`` like x.

    Raises:
      ValueError: for a hyperparameter out of its range or a non-callable schedule.
    """

    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.9999
    eps: float = 1e-6
    clip: bool = True
    clip_exponent: float = 0.25
    nesterov: bool = False
    schedule: Callable[[int], float] | None = None

    State = ADOPTState

    def __post_init__(self):
        _checks.nonnegative("lr", self.lr)
        _checks.unit_interval("beta1", self.beta1)
        _checks.unit_interval("beta2", self.beta2)
        _checks.positive("eps", self.eps)
        _checks.boolean("clip", self.clip)
        _checks.nonnegative("clip_exponent", self.clip_exponent)
        _checks.boolean("nesterov", self.nesterov)
        _checks.schedule(self.schedule)

    def squares_grads(self, s):
        return True

    def context(self, t, glob):
        lr_t, b1, b2 = lr_at(self, t), float(self.beta1), float(self.beta2)
        clip_value = float(t - 1) ** float(self.clip_exponent) if t > 1 else 0.0
        return ADOPTContext(lr_t, 1.0, lr_t, 1.0, t == 1, b1, 1.0 - b1, b2, 1.0 - b2, float(self.eps),
                            bool(self.clip), clip_value, bool(self.nesterov)), glob

    def kernel(self):
        return _ADOPT
