"""RMSprop (Tieleman & Hinton 2012, lecture 6.5), in torch.optim.RMSprop's form: centered, momentum, L2."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import numba
import numpy as np

from refopt.kernels import Elementwise
from refopt.rules import _checks
from refopt.rules.base import ElementwiseRule, lr_at


class RMSpropState(NamedTuple):
    """Per-array state, each like x: the square average ``v``, the gradient average ``g_avg`` (read when
    centered) and the momentum buffer ``b`` (read when momentum > 0); unused ones stay 0."""

    v: np.ndarray
    g_avg: np.ndarray
    b: np.ndarray


class RMSpropContext(NamedTuple):
    lr_t: float
    decay: float          # 1 (the decay is L2, inside g)
    step: float           # lr_t
    u_scale: float        # 1
    weight_decay: float
    alpha: float
    oma: float            # 1 - alpha
    eps: float
    momentum: float
    centered: bool
    use_momentum: bool


@numba.njit
def _rmsprop(x, g, s, i, c):
    if c.weight_decay != 0:
        g = g + c.weight_decay * x
    v = c.alpha * s.v[i] + c.oma * (g * g)
    s.v[i] = v
    if c.centered:
        a = s.g_avg[i] + c.oma * (g - s.g_avg[i])
        s.g_avg[i] = a
        den = np.sqrt(v - a * a) + c.eps
    else:
        den = np.sqrt(v) + c.eps
    if c.use_momentum:
        b = c.momentum * s.b[i] + g / den
        s.b[i] = b
        return b
    return g / den


_RMSPROP = Elementwise(_rmsprop, "rmsprop")


@dataclass(frozen=True)
class RMSprop(ElementwiseRule):
    r"""RMSprop as torch.optim.RMSprop (CONVENTIONS.md 1). At step t (t = 1 first), gamma_t = schedule(t):

    .. math::

        g_t &\leftarrow g_t + \lambda\, x_{t-1} \qquad \text{(L2, coupled)} \\
        v_t &= \alpha\, v_{t-1} + (1 - \alpha)\, g_t^2 \\
        a_t &= a_{t-1} + (1 - \alpha)\, (g_t - a_{t-1}) \qquad \text{(centered only)} \\
        d_t &= \begin{cases} \sqrt{v_t - a_t^2} + \epsilon & \text{if centered} \\ \sqrt{v_t} + \epsilon &
        \text{otherwise} \end{cases} \\
        b_t &= \mu\, b_{t-1} + g_t / d_t; \quad u_t = b_t \qquad (u_t = g_t / d_t \text{ when } \mu = 0) \\
        x_t &= x_{t-1} - \mathrm{lr}\, \gamma_t\, u_t

    from v_0 = a_0 = b_0 = 0; eps is added after the square root, and there is no bias correction.

    Args:
      lr: >= 0 (torch's default 1e-2).
      alpha: in [0, 1) (0.99).
      eps: > 0 (1e-8).
      weight_decay: >= 0 (L2).
      momentum: mu in [0, 1).
      centered: subtract the squared gradient average.
      schedule: t -> gamma_t.

    Shapes/dtypes: any float32 / float64 array; v, a, b like x (a, b stay 0 when unused).

    Raises:
      ValueError: for a hyperparameter out of its range or a non-callable schedule.
    """

    lr: float = 1e-2
    alpha: float = 0.99
    eps: float = 1e-8
    weight_decay: float = 0.0
    momentum: float = 0.0
    centered: bool = False
    schedule: Callable[[int], float] | None = None

    State = RMSpropState

    def __post_init__(self):
        _checks.nonnegative("lr", self.lr)
        _checks.unit_interval("alpha", self.alpha)
        _checks.positive("eps", self.eps)
        _checks.nonnegative("weight_decay", self.weight_decay)
        _checks.unit_interval("momentum", self.momentum)
        _checks.boolean("centered", self.centered)
        _checks.schedule(self.schedule)

    def squares_grads(self, s):
        return True

    def context(self, t, glob):
        lr_t, a = lr_at(self, t), float(self.alpha)
        return RMSpropContext(lr_t, 1.0, lr_t, 1.0, float(self.weight_decay), a, 1.0 - a, float(self.eps),
                              float(self.momentum), self.centered, self.momentum > 0), glob

    def kernel(self):
        return _RMSPROP
