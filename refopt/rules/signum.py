"""signSGD and Signum (Bernstein, Wang, Azizzadenesheli & Anandkumar 2018): the sign of the gradient, or of its
momentum, in optax.sign_sgd's and optax.signum's form (an undebiased EMA, sign(0) = 0)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import numba
import numpy as np

from refopt.kernels import Elementwise
from refopt.rules import _checks
from refopt.rules.base import ElementwiseRule, lr_at


class SignumState(NamedTuple):
    """Per-array state: the momentum ``m`` (like x; equal to the last g when beta = 0)."""

    m: np.ndarray


class SignumContext(NamedTuple):
    lr_t: float
    decay: float      # 1 (no decay)
    step: float       # lr_t
    u_scale: float    # 1
    beta: float
    omb: float        # 1 - beta


@numba.njit
def _signum(x, g, s, i, c):
    m = c.beta * s.m[i] + c.omb * g
    s.m[i] = m
    return np.sign(m)


_SIGNUM = Elementwise(_signum, "signum")


@dataclass(frozen=True)
class Signum(ElementwiseRule):
    r"""Signum, and signSGD at ``beta=0`` (optax.signum, optax.sign_sgd). At step t (t = 1 first),
    gamma_t = schedule(t):

    .. math::

        m_t &= \beta\, m_{t-1} + (1 - \beta)\, g_t \qquad (m_0 = 0) \\
        x_t &= x_{t-1} - \mathrm{lr}\, \gamma_t\, \mathrm{sign}(m_t)

    with sign(0) = 0. The EMA is not debiased: a positive factor does not change a sign. Every entry moves by
    exactly lr gamma_t (or 0), whatever the gradient's scale: the step is the steepest descent under the
    infinity norm (Bernstein et al. 2018, section 2).

    Args:
      lr: >= 0 (optax has no default; 1e-3 here).
      beta: in [0, 1), the momentum (optax.signum's 0.9; 0 is signSGD).
      schedule: t -> gamma_t.

    Shapes/dtypes: any float32 / float64 array; ``m`` like x.

    Raises:
      ValueError: for lr < 0, beta outside [0, 1) or a non-callable schedule.
    """

    lr: float = 1e-3
    beta: float = 0.9
    schedule: Callable[[int], float] | None = None

    State = SignumState

    def __post_init__(self):
        _checks.nonnegative("lr", self.lr)
        _checks.unit_interval("beta", self.beta)
        _checks.schedule(self.schedule)

    def context(self, t, glob):
        lr_t, b = lr_at(self, t), float(self.beta)
        return SignumContext(lr_t, 1.0, lr_t, 1.0, b, 1.0 - b), glob

    def kernel(self):
        return _SIGNUM
