"""AdaBelief (Zhuang et al. 2020): Adam with the second moment of the gradient's deviation from its EMA (the
"belief"), in optax.adabelief's form (eps_root added to s every step, bias corrections, optional Nesterov)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import numba
import numpy as np

from refopt.kernels import Elementwise
from refopt.rules import _checks
from refopt.rules._adam_step import m_hat
from refopt.rules.base import ElementwiseRule, lr_at


class AdaBeliefState(NamedTuple):
    """Per-array state, each like x: the first moment ``m`` and the belief ``s`` (EMA of (g - m)^2 + eps_root)."""

    m: np.ndarray
    s: np.ndarray


class AdaBeliefContext(NamedTuple):
    lr_t: float
    decay: float      # 1 (no decay)
    step: float       # lr_t
    u_scale: float    # 1
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


@numba.njit
def _adabelief(x, g, s, i, c):
    m = c.beta1 * s.m[i] + c.omb1 * g
    d = g - m
    v = c.beta2 * s.s[i] + c.omb2 * (d * d) + c.eps_root
    s.m[i] = m
    s.s[i] = v
    return m_hat(m, g, c) / (np.sqrt(v / c.bc2) + c.eps)


_ADABELIEF = Elementwise(_adabelief, "adabelief")


@dataclass(frozen=True)
class AdaBelief(ElementwiseRule):
    r"""AdaBelief as optax.adabelief (Zhuang et al. 2020, Algorithm 2). At step t (t = 1 first),
    gamma_t = schedule(t):

    .. math::

        m_t &= \beta_1 m_{t-1} + (1 - \beta_1)\, g_t \\
        s_t &= \beta_2 s_{t-1} + (1 - \beta_2)\, (g_t - m_t)^2 + \epsilon_{root} \\
        \hat m_t &= \frac{m_t}{1 - \beta_1^t}, \text{ or with Nesterov }
        \beta_1 \frac{m_t}{1 - \beta_1^{t+1}} + (1 - \beta_1) \frac{g_t}{1 - \beta_1^t} \\
        x_t &= x_{t-1} - \mathrm{lr}\, \gamma_t\, \frac{\hat m_t}{\sqrt{s_t / (1 - \beta_2^t)} + \epsilon}

    from m_0 = s_0 = 0. eps_root is added to the stored s every step (the paper's "+ eps" inside s_t);
    the deviation g - m is taken from the *updated* m_t.

    Args:
      lr: >= 0 (1e-3).
      beta1, beta2: in [0, 1) (0.9, 0.999).
      eps: > 0, added after the square root (optax 1e-16).
      eps_root: >= 0, added to s every step (optax 1e-16).
      nesterov: optax's Nesterov form of m_hat.
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
    nesterov: bool = False
    schedule: Callable[[int], float] | None = None

    State = AdaBeliefState

    def __post_init__(self):
        _checks.nonnegative("lr", self.lr)
        _checks.unit_interval("beta1", self.beta1)
        _checks.unit_interval("beta2", self.beta2)
        _checks.positive("eps", self.eps)
        _checks.nonnegative("eps_root", self.eps_root)
        _checks.boolean("nesterov", self.nesterov)
        _checks.schedule(self.schedule)

    def squares_grads(self, s):
        return True

    def context(self, t, glob):
        lr_t, b1, b2 = lr_at(self, t), float(self.beta1), float(self.beta2)
        return AdaBeliefContext(lr_t, 1.0, lr_t, 1.0, b1, 1.0 - b1, b2, 1.0 - b2, float(self.eps),
                                float(self.eps_root), 1.0 - b1 ** t, 1.0 - b1 ** (t + 1), 1.0 - b2 ** t,
                                self.nesterov), glob

    def kernel(self):
        return _ADABELIEF
