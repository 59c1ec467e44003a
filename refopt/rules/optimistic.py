"""Optimistic gradient descent (Daskalakis, Ilyas, Syrgkanis & Zeng 2018; Mokhtari, Ozdaglar & Pattathil 2020):
the step extrapolates with the last gradient, u_t = (alpha + beta) g_t - beta g_{t-1}, in optax's form (g_0 := g_1)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import numba
import numpy as np

from refopt.kernels import Elementwise
from refopt.rules import _checks
from refopt.rules.base import ElementwiseRule, lr_at


class OptimisticState(NamedTuple):
    """Per-array state: the previous gradient ``prev`` (like x)."""

    prev: np.ndarray


class OptimisticContext(NamedTuple):
    lr_t: float
    decay: float      # 1
    step: float       # lr_t
    u_scale: float    # 1
    alpha: float
    beta: float
    ab: float         # alpha + beta
    first: bool       # t = 1: g_0 := g_1


@numba.njit
def _optimistic(x, g, s, i, c):
    prev = g if c.first else s.prev[i]
    s.prev[i] = g
    return c.ab * g - c.beta * prev


_OPTIMISTIC = Elementwise(_optimistic, "optimistic")


@dataclass(frozen=True)
class OptimisticGradientDescent(ElementwiseRule):
    r"""Optimistic gradient descent as optax.optimistic_gradient_descent. At step t (t = 1 first),
    gamma_t = schedule(t):

    .. math::

        u_t &= (\alpha + \beta)\, g_t - \beta\, g_{t-1}, \qquad g_0 := g_1 \ (\text{so } u_1 = \alpha g_1) \\
        x_t &= x_{t-1} - \mathrm{lr}\, \gamma_t\, u_t

    With alpha = beta = 1 this is optimistic mirror descent, x_{t+1} = x_t - lr (2 g_t - g_{t-1}) (Daskalakis
    et al. 2018, eq. (4)), which converges on bilinear games where gradient descent-ascent cycles; beta
    is the optimism. The first step uses g_0 = g_1 (optax issue 1082); with g_0 = 0 it would be
    (alpha + beta) g_1.

    Args:
      lr: >= 0 (optax has no default; 1e-2 here).
      alpha: >= 0 (1.0), the weight of the gradient.
      beta: >= 0 (1.0), the optimism.
      schedule: t -> gamma_t.

    Shapes/dtypes: any float32 / float64 array; ``prev`` like x.

    Raises:
      ValueError: for a hyperparameter out of its range or a non-callable schedule.
    """

    lr: float = 1e-2
    alpha: float = 1.0
    beta: float = 1.0
    schedule: Callable[[int], float] | None = None

    State = OptimisticState

    def __post_init__(self):
        _checks.nonnegative("lr", self.lr)
        _checks.nonnegative("alpha", self.alpha)
        _checks.nonnegative("beta", self.beta)
        _checks.schedule(self.schedule)

    def context(self, t, glob):
        lr_t, a, b = lr_at(self, t), float(self.alpha), float(self.beta)
        return OptimisticContext(lr_t, 1.0, lr_t, 1.0, a, b, a + b, t == 1), glob

    def kernel(self):
        return _OPTIMISTIC
