"""Lion: the sign of an interpolated momentum (Chen et al. 2023, "Symbolic Discovery of Optimization
Algorithms", arXiv:2302.06675, Alg. 2), as optax.lion."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import numba
import numpy as np

from refopt.kernels import Elementwise
from refopt.rules import _checks
from refopt.rules.base import ElementwiseRule, lr_at


class LionState(NamedTuple):
    """Per-array Lion state: the momentum ``m`` (shape and dtype of x)."""

    m: np.ndarray


class LionContext(NamedTuple):
    lr_t: float
    decay: float    # 1 - lr_t * lambda (decoupled decay)
    step: float     # lr_t
    u_scale: float  # 1
    beta1: float
    omb1: float     # 1 - beta1
    beta2: float
    omb2: float     # 1 - beta2


@numba.njit
def _lion(x, g, s, i, c):
    u = np.sign(c.omb1 * g + c.beta1 * s.m[i])
    s.m[i] = c.omb2 * g + c.beta2 * s.m[i]
    return u


_LION = Elementwise(_lion, "lion")


@dataclass(frozen=True)
class Lion(ElementwiseRule):
    r"""Lion (arXiv:2302.06675, Alg. 2), in optax.lion's form.

    At step t (t = 1 first), gamma_t = schedule(t), m_0 = 0:

    .. math::

        u_t &= \operatorname{sign}\bigl((1 - \beta_1)\, g_t + \beta_1 m_{t-1}\bigr)
        \qquad (\operatorname{sign}(0) = 0) \\
        m_t &= (1 - \beta_2)\, g_t + \beta_2 m_{t-1} \\
        x_t &= (1 - \mathrm{lr}\, \gamma_t \lambda)\, x_{t-1} - \mathrm{lr}\, \gamma_t\, u_t

    The decay is decoupled and multiplied by the lr, as optax's ``add_decayed_weights`` before
    ``scale_by_learning_rate`` (there written x - lr*(u + lambda*x); the two agree to rounding). The
    direction (:func:`refopt.direction`) is u_t, entries in {-1, 0, 1}: Lion is invariant to the scale of
    the gradient (any c > 0 times every g gives the same steps).

    Defaults: ``optax.lion`` has weight_decay 1e-3; refopt's default is 0 (no decay unless asked), so
    ``Lion(lr, weight_decay=1e-3)`` is ``optax.lion(lr)``.

    Args:
      lr: peak learning rate >= 0 (the step is exactly lr per coordinate; the paper uses 3-10x smaller lr
        than AdamW).
      beta1: interpolation in [0, 1) (0.9).
      beta2: momentum EMA rate in [0, 1) (0.99).
      weight_decay: lambda >= 0, decoupled (paper: 3-10x larger than AdamW's).
      schedule: optional t -> gamma_t >= 0.

    Shapes/dtypes: any float32 / float64 array; m like x; hyperparameters cast to x's dtype.

    Raises:
      ValueError: for lr < 0, betas outside [0, 1), weight_decay < 0, a non-callable schedule.
    """

    lr: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.99
    weight_decay: float = 0.0
    schedule: Callable[[int], float] | None = None

    State = LionState

    def __post_init__(self):
        _checks.nonnegative("lr", self.lr)
        _checks.unit_interval("beta1", self.beta1)
        _checks.unit_interval("beta2", self.beta2)
        _checks.nonnegative("weight_decay", self.weight_decay)
        _checks.schedule(self.schedule)

    def decoupled_decay(self):
        return self.weight_decay > 0

    def context(self, t, glob):
        lr_t, b1, b2 = lr_at(self, t), float(self.beta1), float(self.beta2)
        return LionContext(lr_t, 1.0 - lr_t * self.weight_decay, lr_t, 1.0, b1, 1.0 - b1, b2, 1.0 - b2), glob

    def kernel(self):
        return _LION
