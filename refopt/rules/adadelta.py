"""Adadelta (Zeiler 2012), in the form torch.optim.Adadelta and optax.adadelta share: eps inside both square
roots, an lr multiplying the unit-correcting ratio, L2 decay in g."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import numba
import numpy as np

from refopt.kernels import Elementwise
from refopt.rules import _checks
from refopt.rules.base import ElementwiseRule, lr_at


class AdadeltaState(NamedTuple):
    """Per-array state, each like x: the average squared gradient ``eg2`` (E[g^2]) and the average squared
    update ``edx2`` (E[dx^2])."""

    eg2: np.ndarray
    edx2: np.ndarray


class AdadeltaContext(NamedTuple):
    lr_t: float
    decay: float          # 1 (the decay is L2, inside g)
    step: float           # lr_t
    u_scale: float        # 1
    weight_decay: float
    rho: float
    omr: float            # 1 - rho
    eps: float


@numba.njit
def _adadelta(x, g, s, i, c):
    if c.weight_decay != 0:
        g = g + c.weight_decay * x
    eg2 = c.rho * s.eg2[i] + c.omr * (g * g)
    s.eg2[i] = eg2
    dx = np.sqrt(s.edx2[i] + c.eps) / np.sqrt(eg2 + c.eps) * g
    s.edx2[i] = c.rho * s.edx2[i] + c.omr * (dx * dx)
    return dx


_ADADELTA = Elementwise(_adadelta, "adadelta")


@dataclass(frozen=True)
class Adadelta(ElementwiseRule):
    r"""Adadelta as torch.optim.Adadelta and optax.adadelta (Zeiler 2012, Algorithm 1, with an lr). At step t
    (t = 1 first), gamma_t = schedule(t):

    .. math::

        g_t &\leftarrow g_t + \lambda\, x_{t-1} \qquad \text{(L2, coupled)} \\
        E[g^2]_t &= \rho\, E[g^2]_{t-1} + (1 - \rho)\, g_t^2 \\
        \Delta_t &= \frac{\sqrt{E[\Delta^2]_{t-1} + \epsilon}}{\sqrt{E[g^2]_t + \epsilon}}\, g_t \\
        E[\Delta^2]_t &= \rho\, E[\Delta^2]_{t-1} + (1 - \rho)\, \Delta_t^2 \\
        x_t &= x_{t-1} - \mathrm{lr}\, \gamma_t\, \Delta_t

    from E[g^2]_0 = E[Delta^2]_0 = 0. The numerator carries the units of x (Zeiler's "correct units"), so the
    paper has no lr (lr = 1, torch's default); the first step is sqrt(eps) g / sqrt((1 - rho) g^2 + eps).

    Args:
      lr: >= 0 (torch's default 1.0).
      rho: in [0, 1) (0.9).
      eps: > 0 (1e-6); it sets the size of the first steps.
      weight_decay: >= 0 (L2).
      schedule: t -> gamma_t.

    Shapes/dtypes: any float32 / float64 array; ``eg2``, ``edx2`` like x.

    Raises:
      ValueError: for a hyperparameter out of its range or a non-callable schedule.
    """

    lr: float = 1.0
    rho: float = 0.9
    eps: float = 1e-6
    weight_decay: float = 0.0
    schedule: Callable[[int], float] | None = None

    State = AdadeltaState

    def __post_init__(self):
        _checks.nonnegative("lr", self.lr)
        _checks.unit_interval("rho", self.rho)
        _checks.positive("eps", self.eps)
        _checks.nonnegative("weight_decay", self.weight_decay)
        _checks.schedule(self.schedule)

    def squares_grads(self, s):
        return True

    def context(self, t, glob):
        lr_t, rho = lr_at(self, t), float(self.rho)
        return AdadeltaContext(lr_t, 1.0, lr_t, 1.0, float(self.weight_decay), rho, 1.0 - rho,
                               float(self.eps)), glob

    def kernel(self):
        return _ADADELTA
