"""RMSprop (Tieleman & Hinton 2012, lecture 6.5), in torch.optim.RMSprop's form (centered, momentum, L2) and
optax.rmsprop's (eps inside the square root, a start value of v, bias correction, Nesterov momentum)."""
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
    eps_inside: bool
    bc: float             # 1 - alpha^t with bias_correction, else 1
    nesterov: bool


@numba.njit
def _rmsprop(x, g, s, i, c):
    if c.weight_decay != 0:
        g = g + c.weight_decay * x
    v = c.alpha * s.v[i] + c.oma * (g * g)
    s.v[i] = v
    if c.bc != 1.0:
        v = v / c.bc
    if c.centered:
        a = s.g_avg[i] + c.oma * (g - s.g_avg[i])
        s.g_avg[i] = a
        if c.bc != 1.0:
            a = a / c.bc
        v = v - a * a
    if c.eps_inside:
        den = np.sqrt(v + c.eps)
    else:
        den = np.sqrt(v) + c.eps
    if c.use_momentum:
        b = c.momentum * s.b[i] + g / den
        s.b[i] = b
        if c.nesterov:
            return g / den + c.momentum * b
        return b
    return g / den


_RMSPROP = Elementwise(_rmsprop, "rmsprop")


@dataclass(frozen=True)
class RMSprop(ElementwiseRule):
    r"""RMSprop as torch.optim.RMSprop (the defaults, CONVENTIONS.md 1) or optax.rmsprop (``eps_mode='inside'``,
    ``initial_scale``, ``bias_correction``, ``nesterov``). At step t (t = 1 first), gamma_t = schedule(t):

    .. math::

        g_t &\leftarrow g_t + \lambda\, x_{t-1} \qquad \text{(L2, coupled)} \\
        v_t &= \alpha\, v_{t-1} + (1 - \alpha)\, g_t^2, \qquad v_0 = \text{initial\_scale} \\
        a_t &= a_{t-1} + (1 - \alpha)\, (g_t - a_{t-1}) \qquad \text{(centered only)} \\
        \hat v_t, \hat a_t &= v_t / c_t,\ a_t / c_t, \qquad c_t = 1 - \alpha^t \text{ with bias correction,
        else } 1 \\
        w_t &= \hat v_t - \hat a_t^2 \text{ if centered, else } \hat v_t \\
        d_t &= \sqrt{w_t} + \epsilon \ \text{(outside, torch)} \quad \text{or} \quad \sqrt{w_t + \epsilon}
        \ \text{(inside, optax)} \\
        b_t &= \mu\, b_{t-1} + g_t / d_t; \quad u_t = b_t, \text{ or } g_t / d_t + \mu\, b_t
        \text{ (Nesterov)} \qquad (u_t = g_t / d_t \text{ when } \mu = 0) \\
        x_t &= x_{t-1} - \mathrm{lr}\, \gamma_t\, u_t

    from a_0 = b_0 = 0. torch's form: eps after the square root, v_0 = 0, no bias correction, no Nesterov.
    (optax keeps its momentum trace on the lr-scaled step; with a constant lr that is -lr b_t.)

    Args:
      lr: >= 0 (torch's default 1e-2).
      alpha: in [0, 1) (0.99).
      eps: > 0 (1e-8).
      weight_decay: >= 0 (L2).
      momentum: mu in [0, 1).
      centered: subtract the squared gradient average.
      eps_mode: 'outside' (torch) or 'inside' (optax's ``eps_in_sqrt=True``).
      initial_scale: v_0 >= 0 (optax's name; torch 0).
      bias_correction: divide v (and a) by 1 - alpha^t (optax's option).
      nesterov: u = g/d + mu b; needs momentum > 0 (optax's option).
      schedule: t -> gamma_t.

    Shapes/dtypes: any float32 / float64 array; v, a, b like x (a, b stay 0 when unused).

    Raises:
      ValueError: for a hyperparameter out of its range, an unknown eps_mode, nesterov without momentum or a
        non-callable schedule.
    """

    lr: float = 1e-2
    alpha: float = 0.99
    eps: float = 1e-8
    weight_decay: float = 0.0
    momentum: float = 0.0
    centered: bool = False
    eps_mode: str = "outside"
    initial_scale: float = 0.0
    bias_correction: bool = False
    nesterov: bool = False
    schedule: Callable[[int], float] | None = None

    State = RMSpropState

    def __post_init__(self):
        _checks.nonnegative("lr", self.lr)
        _checks.unit_interval("alpha", self.alpha)
        _checks.positive("eps", self.eps)
        _checks.nonnegative("weight_decay", self.weight_decay)
        _checks.unit_interval("momentum", self.momentum)
        _checks.boolean("centered", self.centered)
        _checks.one_of("eps_mode", self.eps_mode, {"outside", "inside"})
        _checks.nonnegative("initial_scale", self.initial_scale)
        _checks.boolean("bias_correction", self.bias_correction)
        _checks.boolean("nesterov", self.nesterov)
        if self.nesterov and self.momentum <= 0:
            raise ValueError("nesterov=True needs momentum > 0")
        _checks.schedule(self.schedule)

    def init_leaf(self, x, path):
        z = np.zeros_like(x)
        return RMSpropState(np.full_like(x, self.initial_scale), z, z.copy())

    def squares_grads(self, s):
        return True

    def context(self, t, glob):
        lr_t, a = lr_at(self, t), float(self.alpha)
        return RMSpropContext(lr_t, 1.0, lr_t, 1.0, float(self.weight_decay), a, 1.0 - a, float(self.eps),
                              float(self.momentum), self.centered, self.momentum > 0, self.eps_mode == "inside",
                              1.0 - a ** t if self.bias_correction else 1.0, self.nesterov), glob

    def kernel(self):
        return _RMSPROP
