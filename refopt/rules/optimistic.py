"""Optimistic gradient descent (Daskalakis, Ilyas, Syrgkanis & Zeng 2018; Mokhtari, Ozdaglar & Pattathil 2020):
the step extrapolates with the last gradient, u_t = (alpha + beta) g_t - beta g_{t-1}, in optax's form (g_0 := g_1);
and Optimistic Adam (Daskalakis et al. 2018, Algorithm 1), the same extrapolation of Adam's direction."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import numba
import numpy as np

from refopt.kernels import Elementwise
from refopt.rules import _checks
from refopt.rules._adam_step import _moments, m_hat
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


class OptimisticAdamState(NamedTuple):
    """Per-array state, each like x: Adam's moments ``m``, ``v`` and the previous direction ``prev``."""

    m: np.ndarray
    v: np.ndarray
    prev: np.ndarray


class OptimisticAdamContext(NamedTuple):
    lr_t: float
    decay: float      # 1
    step: float       # 1 (the lr is alpha)
    u_scale: float    # 1
    l2: float         # 0
    beta1: float
    omb1: float
    beta2: float
    omb2: float
    eps: float
    eps_root: float
    bc1: float        # 1 - beta1^t
    bc1_next: float   # 1 - beta1^(t+1) (Nesterov)
    bc2: float        # 1 - beta2^t
    nesterov: bool
    beta: float       # the optimism
    ab: float         # lr_t + optimism
    first: bool


@numba.njit
def _optimistic_adam(x, g, s, i, c):
    g, m, v = _moments(x, g, s, i, c)
    u = m_hat(m, g, c) / (np.sqrt(v / c.bc2 + c.eps_root) + c.eps)
    prev = u if c.first else s.prev[i]
    s.prev[i] = u
    return c.ab * u - c.beta * prev


_OPTIMISTIC_ADAM = Elementwise(_optimistic_adam, "optimistic_adam")


@dataclass(frozen=True)
class OptimisticAdam(ElementwiseRule):
    r"""Optimistic Adam as optax.optimistic_adam (Daskalakis et al. 2018, "Training GANs with Optimism",
    Algorithm 1, in optax's form). At step t (t = 1 first), gamma_t = schedule(t), lr_t = lr gamma_t,
    beta the optimism (lr_t when None):

    .. math::

        m_t &= \beta_1 m_{t-1} + (1 - \beta_1) g_t, \qquad v_t = \beta_2 v_{t-1} + (1 - \beta_2) g_t^2 \\
        \hat m_t &= m_t / (1 - \beta_1^t) \quad \text{(Nesterov, optax's default: } \beta_1 m_t /
        (1 - \beta_1^{t+1}) + (1 - \beta_1) g_t / (1 - \beta_1^t)) \\
        u_t &= \hat m_t / (\sqrt{v_t / (1 - \beta_2^t) + \epsilon_{root}} + \epsilon) \\
        x_t &= x_{t-1} - ((\mathrm{lr}_t + \beta)\, u_t - \beta\, u_{t-1}), \qquad u_0 := u_1

    With beta = lr this is the paper's x - 2 lr u_t + lr u_{t-1}. optax deprecates the alias for
    ``optimistic_adam_v2`` (the same arithmetic with schedules); refopt reproduces the alias.

    Args:
      lr: >= 0 (optax has no default; 1e-3 here).
      optimism: >= 0 or None (lr_t).
      beta1, beta2: in [0, 1) (0.9, 0.999); eps: >= 0 (1e-8); eps_root: >= 0 (0).
      nesterov: optax's Nesterov m_hat (True, optax's default).
      schedule: t -> gamma_t (the lr inside the extrapolation; a constant optimism stays constant).

    Shapes/dtypes: any float32 / float64 array; ``m``, ``v``, ``prev`` like x.

    Raises:
      ValueError: for a hyperparameter out of its range, eps = eps_root = 0 or a non-callable schedule.
    """

    lr: float = 1e-3
    optimism: float | None = None
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    eps_root: float = 0.0
    nesterov: bool = True
    schedule: Callable[[int], float] | None = None

    State = OptimisticAdamState

    def __post_init__(self):
        _checks.nonnegative("lr", self.lr)
        if self.optimism is not None:
            _checks.nonnegative("optimism", self.optimism)
        _checks.unit_interval("beta1", self.beta1)
        _checks.unit_interval("beta2", self.beta2)
        _checks.nonnegative("eps", self.eps)
        _checks.nonnegative("eps_root", self.eps_root)
        if self.eps == 0 and self.eps_root == 0:
            raise ValueError("OptimisticAdam needs eps > 0 or eps_root > 0 (else a zero second moment gives 0/0)")
        _checks.boolean("nesterov", self.nesterov)
        _checks.schedule(self.schedule)

    def squares_grads(self, s):
        return True

    def context(self, t, glob):
        lr_t, b1, b2 = lr_at(self, t), float(self.beta1), float(self.beta2)
        beta = lr_t if self.optimism is None else float(self.optimism)
        return OptimisticAdamContext(lr_t, 1.0, 1.0, 1.0, 0.0, b1, 1.0 - b1, b2, 1.0 - b2, float(self.eps),
                                     float(self.eps_root), 1.0 - b1 ** t, 1.0 - b1 ** (t + 1), 1.0 - b2 ** t,
                                     self.nesterov, beta, lr_t + beta, t == 1), glob

    def kernel(self):
        return _OPTIMISTIC_ADAM

    def direction_leaf(self, ctx, s, x, g, path):
        raise NotImplementedError("OptimisticAdam has no additive direction u: its lr weighs u_t and u_{t-1} "
                                  "differently ((lr + optimism) u_t - optimism u_{t-1})")
