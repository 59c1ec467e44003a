"""Yogi (Zaheer, Reddi, Sachan, Kale & Kumar 2018): Adam whose second moment moves towards g^2 by an additive,
sign-controlled step, in optax.yogi's form (both moments start at 1e-6, bias corrections, eps after the root)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import numba
import numpy as np

from refopt.kernels import Elementwise
from refopt.rules import _checks
from refopt.rules.base import ElementwiseRule, lr_at


class YogiState(NamedTuple):
    """Per-array state, each like x: the first moment ``m`` and the second moment ``v`` (both
    ``initial_accumulator_value`` at init)."""

    m: np.ndarray
    v: np.ndarray


class YogiContext(NamedTuple):
    lr_t: float
    decay: float      # 1 (no decay)
    step: float       # lr_t
    u_scale: float    # 1
    beta1: float
    omb1: float
    omb2: float       # 1 - beta2
    eps: float
    eps_root: float
    bc1: float        # 1 - beta1^t
    bc2: float        # 1 - beta2^t


@numba.njit
def _yogi(x, g, s, i, c):
    m = c.beta1 * s.m[i] + c.omb1 * g
    g2 = g * g
    v = s.v[i] - c.omb2 * np.sign(s.v[i] - g2) * g2
    s.m[i] = m
    s.v[i] = v
    return (m / c.bc1) / (np.sqrt(v / c.bc2 + c.eps_root) + c.eps)


_YOGI = Elementwise(_yogi, "yogi")


@dataclass(frozen=True)
class Yogi(ElementwiseRule):
    r"""Yogi as optax.yogi (Zaheer et al. 2018, Algorithm 2). At step t (t = 1 first), gamma_t = schedule(t):

    .. math::

        m_t &= \beta_1 m_{t-1} + (1 - \beta_1)\, g_t \\
        v_t &= v_{t-1} - (1 - \beta_2)\, \mathrm{sign}(v_{t-1} - g_t^2)\, g_t^2 \\
        x_t &= x_{t-1} - \mathrm{lr}\, \gamma_t\, \frac{m_t / (1 - \beta_1^t)}
        {\sqrt{v_t / (1 - \beta_2^t) + \epsilon_{root}} + \epsilon}

    from m_0 = v_0 = initial_accumulator_value (optax: 1e-6 for both). Adam's v_t - v_{t-1} is
    (1 - beta2)(g^2 - v_{t-1}), proportional to the gap; Yogi's is (1 - beta2) g^2 with the gap's sign, so v
    grows at most additively and shrinks slowly when gradients become small.

    Args:
      lr: >= 0 (1e-2, the paper's suggestion).
      beta1, beta2: in [0, 1) (0.9, 0.999).
      eps: > 0 (optax 1e-3).
      eps_root: >= 0, inside the square root (0; optax.yogi does not expose it).
      initial_accumulator_value: >= 0, m_0 = v_0 (1e-6; optax.yogi does not expose it).
      schedule: t -> gamma_t.

    Shapes/dtypes: any float32 / float64 array; ``m``, ``v`` like x.

    Raises:
      ValueError: for a hyperparameter out of its range or a non-callable schedule.
    """

    lr: float = 1e-2
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-3
    eps_root: float = 0.0
    initial_accumulator_value: float = 1e-6
    schedule: Callable[[int], float] | None = None

    State = YogiState

    def __post_init__(self):
        _checks.nonnegative("lr", self.lr)
        _checks.unit_interval("beta1", self.beta1)
        _checks.unit_interval("beta2", self.beta2)
        _checks.positive("eps", self.eps)
        _checks.nonnegative("eps_root", self.eps_root)
        _checks.nonnegative("initial_accumulator_value", self.initial_accumulator_value)
        _checks.schedule(self.schedule)

    def init_leaf(self, x, path):
        return YogiState(np.full_like(x, self.initial_accumulator_value),
                         np.full_like(x, self.initial_accumulator_value))

    def squares_grads(self, s):
        return True

    def context(self, t, glob):
        lr_t, b1, b2 = lr_at(self, t), float(self.beta1), float(self.beta2)
        return YogiContext(lr_t, 1.0, lr_t, 1.0, b1, 1.0 - b1, 1.0 - b2, float(self.eps), float(self.eps_root),
                           1.0 - b1 ** t, 1.0 - b2 ** t), glob

    def kernel(self):
        return _YOGI
