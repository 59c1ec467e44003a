"""Averaged SGD (Polyak & Juditsky 1992), in torch.optim.ASGD's form: Bottou's decreasing step
eta_t = lr / (1 + lambd lr (t - 1))^alpha with the shrinkage x (1 - lambd eta_t), and the average of the
iterates from step t0 on (Xu 2011), which :func:`refopt.eval_params` returns."""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numba
import numpy as np

from refopt.kernels import Elementwise
from refopt.rules import _checks
from refopt.rules.base import ElementwiseRule


class ASGDState(NamedTuple):
    """Per-array state: the averaged iterate ``ax`` (like x; x_0 at init, as if averaged from the start)."""

    ax: np.ndarray


class ASGDContext(NamedTuple):
    lr_t: float         # eta_t
    decay: float        # 1 - lambd eta_t
    step: float         # eta_t
    u_scale: float      # 1
    weight_decay: float
    mu: float           # the averaging weight 1 / max(1, t - 1 - t0)


@numba.njit
def _asgd(x, g, s, i, c):
    if c.weight_decay != 0:
        g = g + c.weight_decay * x
    x_new = c.decay * x - c.step * g          # what the step loop writes (the same expression)
    if c.mu == 1.0:
        s.ax[i] = x_new
    else:
        s.ax[i] = s.ax[i] + (x_new - s.ax[i]) * c.mu
    return g


_ASGD = Elementwise(_asgd, "asgd")


@dataclass(frozen=True)
class ASGD(ElementwiseRule):
    r"""ASGD as torch.optim.ASGD. At step t (t = 1 first):

    .. math::

        \eta_t &= \mathrm{lr} / (1 + \lambda_d\, \mathrm{lr}\, (t - 1))^{\alpha}, \qquad
        \mu_t = 1 / \max(1,\ t - 1 - t_0) \\
        g_t &\leftarrow g_t + \lambda\, x_{t-1} \qquad \text{(L2, weight\_decay)} \\
        x_t &= (1 - \lambda_d \eta_t)\, x_{t-1} - \eta_t\, g_t \\
        \bar x_t &= \bar x_{t-1} + \mu_t\, (x_t - \bar x_{t-1}) \qquad (\bar x_t = x_t \text{ while } \mu_t = 1)

    so the average starts at step t0 + 2 (torch's default t0 = 1e6: never, in practice); eval_params returns
    x-bar. The step size is Bottou's (2012) eta_0 (1 + lambda eta_0 t)^(-alpha) with the shrinkage
    (1 - lambd eta) of an L2 term lambd/2 |x|^2; the average is Polyak & Juditsky's (1992), which with
    alpha in (1/2, 1) reaches the optimal asymptotic rate.

    Args:
      lr: > 0 (1e-2).
      lambd: >= 0, the decay term (1e-4).
      alpha: >= 0, the power of the step decay (0.75).
      t0: >= 0, the step after which averaging starts (1e6).
      weight_decay: >= 0 (L2 in g).

    Shapes/dtypes: any float32 / float64 array; ``ax`` like x.

    Raises:
      ValueError: for a hyperparameter out of its range.
    """

    lr: float = 1e-2
    lambd: float = 1e-4
    alpha: float = 0.75
    t0: float = 1e6
    weight_decay: float = 0.0

    State = ASGDState

    def __post_init__(self):
        if not _checks.finite_number("lr", self.lr) > 0:
            raise ValueError(f"lr must be > 0, got {self.lr!r}")
        _checks.nonnegative("lambd", self.lambd)
        _checks.nonnegative("alpha", self.alpha)
        _checks.nonnegative("t0", self.t0)
        _checks.nonnegative("weight_decay", self.weight_decay)

    def init_leaf(self, x, path):
        return ASGDState(np.array(x, order="C", copy=True))

    def eval_leaf(self, s, x, path):
        return s.ax.copy()

    def eta(self, t: int) -> float:
        """eta_t = lr / (1 + lambd lr (t - 1))^alpha in float64."""
        lr = float(self.lr)
        return lr / ((1.0 + float(self.lambd) * lr * (t - 1)) ** float(self.alpha))

    def context(self, t, glob):
        eta = self.eta(t)
        mu = 1.0 / max(1.0, (t - 1) - float(self.t0))
        return ASGDContext(eta, 1.0 - float(self.lambd) * eta, eta, 1.0, float(self.weight_decay), mu), glob

    def kernel(self):
        return _ASGD
