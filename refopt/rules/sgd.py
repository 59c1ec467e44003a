"""SGD with momentum, dampening, Nesterov and L2 weight decay, in torch.optim.SGD's conventions."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import numba
import numpy as np

from refopt.core import ArraySpec
from refopt.kernels import Elementwise
from refopt.rules import _checks
from refopt.rules.base import ElementwiseRule, lr_at


class SGDState(NamedTuple):
    """Per-array SGD state: the momentum buffer ``b`` (shape and dtype of x; size 0 without momentum)."""

    b: np.ndarray


class SGDContext(NamedTuple):
    """One step's scalars (float64 here; cast to the array dtype by the walk)."""

    lr_t: float          # lr * gamma_t
    decay: float         # 1 (SGD's decay is L2, inside g)
    step: float          # lr_t
    u_scale: float       # 1
    weight_decay: float  # lambda
    momentum: float      # mu
    keep_g: float        # 1 - tau, or 1 on step 1 (b_1 = g_1)
    keep_b: float        # mu, or 0 on step 1
    nesterov: bool


@numba.njit
def _plain(x, g, s, i, c):
    return g + c.weight_decay * x if c.weight_decay != 0 else g   # no 0 * x (NaN for an infinite x), as torch


@numba.njit
def _momentum(x, g, s, i, c):
    if c.weight_decay != 0:
        g = g + c.weight_decay * x
    b = c.keep_b * s.b[i] + c.keep_g * g
    s.b[i] = b
    return g + c.momentum * b if c.nesterov else b


_PLAIN, _MOMENTUM = Elementwise(_plain, "sgd"), Elementwise(_momentum, "sgd_momentum")


@dataclass(frozen=True)
class SGD(ElementwiseRule):
    r"""Stochastic gradient descent, torch.optim.SGD semantics (CONVENTIONS.md 1.1).

    At step t (t = 1 for the first update), with gamma_t = schedule(t) (1 without a schedule):

    .. math::

        g_t &\leftarrow g_t + \lambda\, x_{t-1} \qquad \text{(L2 decay, coupled: it enters the momentum)} \\
        b_1 &= g_1, \quad b_t = \mu\, b_{t-1} + (1 - \tau)\, g_t \qquad \text{(no dampening on step 1, as torch)} \\
        u_t &= g_t + \mu\, b_t \ \text{if nesterov, else } b_t \qquad (u_t = g_t \text{ when } \mu = 0) \\
        x_t &= x_{t-1} - \mathrm{lr}\, \gamma_t\, u_t

    Args:
      lr: peak learning rate eta >= 0 (units of x per unit of gradient).
      momentum: mu in [0, 1).
      dampening: tau in [0, 1); the first buffer is undampened (torch).
      nesterov: Nesterov's look-ahead; needs momentum > 0 and dampening = 0 (as torch).
      weight_decay: L2 coefficient lambda >= 0 added to the gradient.
      schedule: optional pure function t -> gamma_t >= 0 multiplying lr.

    Shapes/dtypes: any float32 / float64 array; the state has x's shape and dtype; every
    hyperparameter is cast to x's dtype, so float32 stays float32.

    Raises:
      ValueError: for lr < 0, momentum or dampening outside [0, 1), weight_decay < 0, or nesterov
        without momentum or with dampening.
    """

    lr: float = 1e-3
    momentum: float = 0.0
    dampening: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0
    schedule: Callable[[int], float] | None = None

    State = SGDState

    def __post_init__(self):
        _checks.nonnegative("lr", self.lr)
        _checks.unit_interval("momentum", self.momentum)
        _checks.unit_interval("dampening", self.dampening)
        _checks.nonnegative("weight_decay", self.weight_decay)
        _checks.schedule(self.schedule)
        _checks.boolean("nesterov", self.nesterov)
        if self.nesterov and (self.momentum <= 0 or self.dampening != 0):
            raise ValueError("nesterov=True needs momentum > 0 and dampening = 0")

    def init_leaf(self, x, path):
        return SGDState(np.zeros_like(x) if self.momentum > 0 else np.zeros(0, x.dtype))

    def leaf_spec(self, x, path):
        return SGDState(ArraySpec(x.shape if self.momentum > 0 else (0,), x.dtype))

    def context(self, t, glob):
        lr_t, mu, first = lr_at(self, t), float(self.momentum), t == 1
        return SGDContext(lr_t, 1.0, lr_t, 1.0, float(self.weight_decay), mu, 1.0 if first else 1.0 - self.dampening,
                          0.0 if first else mu, self.nesterov), glob

    def kernel(self):
        return _MOMENTUM if self.momentum > 0 else _PLAIN

    def kernel_state(self, s):
        return s if self.momentum > 0 else ()
