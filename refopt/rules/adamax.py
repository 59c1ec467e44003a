"""Adamax (Kingma & Ba 2015, sec. 7.1: Adam with the infinity norm), in torch.optim.Adamax's form (L2 in g,
eps inside the maximum) and optax.adamax / adamaxw's (decoupled decay, multiplied by the lr)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import numba
import numpy as np

from refopt.kernels import Elementwise
from refopt.rules import _checks
from refopt.rules.base import ElementwiseRule, lr_at


class AdamaxState(NamedTuple):
    """Per-array state, each like x: the first moment ``m`` and the exponentially weighted infinity norm
    ``u``."""

    m: np.ndarray
    u: np.ndarray


class AdamaxContext(NamedTuple):
    lr_t: float           # lr gamma_t
    decay: float          # 1 - lr_t weight_decay (decoupled), else 1
    step: float           # lr_t / (1 - beta1^t)
    u_scale: float        # 1 / (1 - beta1^t)
    l2: float             # weight_decay when coupled (L2), else 0
    beta1: float
    omb1: float           # 1 - beta1
    beta2: float
    eps: float


@numba.njit
def _adamax(x, g, s, i, c):
    if c.l2 != 0:
        g = g + c.l2 * x
    m = c.beta1 * s.m[i] + c.omb1 * g
    u = max(c.beta2 * s.u[i], abs(g) + c.eps)
    s.m[i] = m
    s.u[i] = u
    return m / u


_ADAMAX = Elementwise(_adamax, "adamax")


@dataclass(frozen=True)
class Adamax(ElementwiseRule):
    r"""Adamax as torch.optim.Adamax (L2, ``decoupled_weight_decay=False``) or optax.adamax / adamaxw
    (``decoupled_weight_decay=True``). At step t (t = 1 first), gamma_t = schedule(t), lr_t = lr gamma_t:

    .. math::

        g_t &\leftarrow g_t + \lambda\, x_{t-1} \qquad \text{(L2 only)} \\
        m_t &= \beta_1 m_{t-1} + (1 - \beta_1)\, g_t \\
        u_t &= \max(\beta_2\, u_{t-1},\ |g_t| + \epsilon) \\
        x_t &= (1 - \mathrm{lr}_t \lambda)\, x_{t-1} - \frac{\mathrm{lr}_t}{1 - \beta_1^t}\, \frac{m_t}{u_t}
        \qquad (1 - \mathrm{lr}_t \lambda \text{ decoupled only, else } 1)

    from m_0 = u_0 = 0. u_t needs no bias correction: the maximum of the decayed |g_k| is not biased towards
    0 (Kingma & Ba, sec. 7.1); eps enters inside the maximum (both peers), so u_t >= eps > 0.

    Args:
      lr: >= 0 (torch's default 2e-3).
      beta1, beta2: in [0, 1) (0.9, 0.999).
      eps: > 0 (1e-8).
      weight_decay: lambda >= 0.
      decoupled_weight_decay: False: L2 in g (torch); True: x (1 - lr_t lambda) (optax.adamaxw).
      schedule: t -> gamma_t.

    Shapes/dtypes: any float32 / float64 array; m, u like x.

    Raises:
      ValueError: for a hyperparameter out of its range or a non-callable schedule.
    """

    lr: float = 2e-3
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    decoupled_weight_decay: bool = False
    schedule: Callable[[int], float] | None = None

    State = AdamaxState

    def __post_init__(self):
        _checks.nonnegative("lr", self.lr)
        _checks.unit_interval("beta1", self.beta1)
        _checks.unit_interval("beta2", self.beta2)
        _checks.positive("eps", self.eps)
        _checks.nonnegative("weight_decay", self.weight_decay)
        _checks.boolean("decoupled_weight_decay", self.decoupled_weight_decay)
        _checks.schedule(self.schedule)

    def decoupled_decay(self):
        return self.decoupled_weight_decay and self.weight_decay > 0

    def context(self, t, glob):
        lr_t, b1, wd = lr_at(self, t), float(self.beta1), float(self.weight_decay)
        bc1 = 1.0 - b1 ** t
        decay, l2 = (1.0 - lr_t * wd, 0.0) if self.decoupled_weight_decay else (1.0, wd)
        return AdamaxContext(lr_t, decay, lr_t / bc1, 1.0 / bc1, l2, b1, 1.0 - b1, float(self.beta2),
                             float(self.eps)), glob

    def kernel(self):
        return _ADAMAX
