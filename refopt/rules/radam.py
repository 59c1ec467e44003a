"""RAdam (Liu et al. 2020, "On the Variance of the Adaptive Learning Rate and Beyond"): Adam whose adaptive
step is rectified by r_t while the length rho_t of the approximated simple moving average is above a threshold,
and the bias-corrected momentum alone before; in torch.optim.RAdam's form (eps on sqrt(v), L2 or decoupled
decay) and optax.radam's (eps on sqrt(v_hat), eps_root, threshold, Nesterov)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, NamedTuple

import numba
import numpy as np

from refopt.kernels import Elementwise
from refopt.rules import _checks
from refopt.rules._adam_step import _moments, m_hat
from refopt.rules.base import ElementwiseRule, lr_at


class RAdamState(NamedTuple):
    """Per-array state, each like x: the first moment ``m`` and the second moment ``v``."""

    m: np.ndarray
    v: np.ndarray


class RAdamContext(NamedTuple):
    lr_t: float
    decay: float       # 1 - lr_t weight_decay (decoupled), else 1
    step: float        # lr_t
    u_scale: float     # 1
    l2: float          # weight_decay when coupled (L2), else 0
    beta1: float
    omb1: float
    beta2: float
    omb2: float
    eps: float
    eps_root: float
    bc1: float         # 1 - beta1^t
    bc1_next: float    # 1 - beta1^(t+1) (Nesterov)
    bc2: float         # 1 - beta2^t
    sqrt_bc2: float
    rect: float        # r_t, or 0 when rho_t <= threshold (the momentum step)
    adaptive: bool     # rho_t > threshold
    corrected: bool    # eps on sqrt(v_hat) (optax) rather than on sqrt(v) (torch)
    nesterov: bool


@numba.njit
def _radam(x, g, s, i, c):
    g, m, v = _moments(x, g, s, i, c)
    mh = m_hat(m, g, c)
    if not c.adaptive:
        return mh
    if c.corrected:
        return c.rect * mh / (np.sqrt(v / c.bc2 + c.eps_root) + c.eps)
    return mh * (c.sqrt_bc2 / (np.sqrt(v + c.eps_root) + c.eps)) * c.rect


_RADAM = Elementwise(_radam, "radam")


def sma_length(beta2: float, t: int) -> tuple[float, float]:
    """(rho_t, rho_inf) of Liu et al. (2020), eq. (6)-(7): rho_inf = 2/(1 - beta2) - 1 and
    rho_t = rho_inf - 2 t beta2^t / (1 - beta2^t), in float64."""
    rho_inf = 2.0 / (1.0 - beta2) - 1.0
    b2t = beta2 ** t
    return rho_inf - 2.0 * t * b2t / (1.0 - b2t), rho_inf


def rectification(beta2: float, t: int) -> float:
    """r_t = sqrt((rho_t - 4)(rho_t - 2) rho_inf / ((rho_inf - 4)(rho_inf - 2) rho_t)) (Liu et al. 2020,
    Algorithm 2); defined for rho_t > 4."""
    rho, rho_inf = sma_length(beta2, t)
    return math.sqrt((rho - 4.0) * (rho - 2.0) * rho_inf / ((rho_inf - 4.0) * (rho_inf - 2.0) * rho))


@dataclass(frozen=True)
class RAdam(ElementwiseRule):
    r"""RAdam as torch.optim.RAdam (the defaults) or optax.radam (``eps_mode='corrected'``). At step t (t = 1
    first), gamma_t = schedule(t), lr_t = lr gamma_t:

    .. math::

        g_t &\leftarrow g_t + \lambda\, x_{t-1} \qquad \text{(L2 only)} \\
        m_t &= \beta_1 m_{t-1} + (1 - \beta_1)\, g_t, \qquad v_t = \beta_2 v_{t-1} + (1 - \beta_2)\, g_t^2 \\
        \hat m_t &= m_t / (1 - \beta_1^t) \quad \text{(Nesterov: } \beta_1 m_t / (1 - \beta_1^{t+1}) +
        (1 - \beta_1)\, g_t / (1 - \beta_1^t)) \\
        \rho_\infty &= \frac{2}{1 - \beta_2} - 1, \qquad \rho_t = \rho_\infty - \frac{2 t \beta_2^t}{1 - \beta_2^t},
        \qquad r_t = \sqrt{\frac{(\rho_t - 4)(\rho_t - 2)\rho_\infty}{(\rho_\infty - 4)(\rho_\infty - 2)\rho_t}} \\
        u_t &= \begin{cases} r_t\, \hat m_t\, \dfrac{\sqrt{1 - \beta_2^t}}{\sqrt{v_t + \epsilon_r} + \epsilon}
        & \rho_t > \text{threshold, uncorrected (torch)} \\
        r_t\, \hat m_t / \left(\sqrt{v_t / (1 - \beta_2^t) + \epsilon_r} + \epsilon\right)
        & \rho_t > \text{threshold, corrected (optax)} \\
        \hat m_t & \text{otherwise} \end{cases} \\
        x_t &= (1 - \mathrm{lr}_t \lambda)^{[\text{decoupled}]}\, x_{t-1} - \mathrm{lr}_t\, u_t

    The paper's threshold is rho_t > 4 (where the variance of the adaptive lr is finite); torch and optax use 5
    (for beta2 = 0.999 the first 5 steps are momentum steps). optax compares rho_t >= threshold, refopt and
    torch rho_t > threshold: they differ only where rho_t equals the threshold exactly.

    Args:
      lr: >= 0 (1e-3).
      beta1, beta2: in [0, 1) (0.9, 0.999).
      eps: >= 0 (1e-8).
      weight_decay: >= 0 (L2, or decoupled: torch's ``decoupled_weight_decay``).
      decoupled_weight_decay: x (1 - lr_t wd) in place of the L2 term.
      eps_mode: 'uncorrected' (eps on sqrt(v), torch) or 'corrected' (eps on sqrt(v_hat), optax).
      eps_root: >= 0, inside the square root (optax's; torch 0).
      threshold: > 4, the rho_t above which the rectified step is taken (5).
      nesterov: optax's Nesterov form of m_hat.
      schedule: t -> gamma_t.

    Shapes/dtypes: any float32 / float64 array; ``m``, ``v`` like x.

    Raises:
      ValueError: for a hyperparameter out of its range, an unknown eps_mode, eps = eps_root = 0 or a
        non-callable schedule.
    """

    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    decoupled_weight_decay: bool = False
    eps_mode: str = "uncorrected"
    eps_root: float = 0.0
    threshold: float = 5.0
    nesterov: bool = False
    schedule: Callable[[int], float] | None = None

    State = RAdamState

    def __post_init__(self):
        _checks.nonnegative("lr", self.lr)
        _checks.unit_interval("beta1", self.beta1)
        _checks.unit_interval("beta2", self.beta2)
        _checks.nonnegative("eps", self.eps)
        _checks.nonnegative("weight_decay", self.weight_decay)
        _checks.boolean("decoupled_weight_decay", self.decoupled_weight_decay)
        _checks.one_of("eps_mode", self.eps_mode, {"uncorrected", "corrected"})
        _checks.nonnegative("eps_root", self.eps_root)
        if self.eps == 0 and self.eps_root == 0:
            raise ValueError("RAdam needs eps > 0 or eps_root > 0 (else a zero second moment gives 0/0)")
        if not _checks.finite_number("threshold", self.threshold) > 4.0:
            raise ValueError(f"threshold must be > 4 (r_t is defined for rho_t > 4), got {self.threshold!r}")
        _checks.boolean("nesterov", self.nesterov)
        _checks.schedule(self.schedule)

    def squares_grads(self, s):
        return True

    def decoupled_decay(self):
        return self.decoupled_weight_decay and self.weight_decay > 0

    def context(self, t, glob):
        lr_t, b1, b2, wd = lr_at(self, t), float(self.beta1), float(self.beta2), float(self.weight_decay)
        decay, l2 = (1.0 - lr_t * wd, 0.0) if self.decoupled_weight_decay else (1.0, wd)
        bc2 = 1.0 - b2 ** t
        adaptive = sma_length(b2, t)[0] > float(self.threshold)
        return RAdamContext(lr_t, decay, lr_t, 1.0, l2, b1, 1.0 - b1, b2, 1.0 - b2, float(self.eps),
                            float(self.eps_root), 1.0 - b1 ** t, 1.0 - b1 ** (t + 1), bc2, math.sqrt(bc2),
                            rectification(b2, t) if adaptive else 0.0, adaptive, self.eps_mode == "corrected",
                            self.nesterov), glob

    def kernel(self):
        return _RADAM
