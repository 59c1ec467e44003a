"""AdEMAMix (Pagliardini, Ablin & Grangier 2024): Adam whose numerator adds alpha times a second, slow EMA of
the gradients (beta3 close to 1), with the paper's warmups of alpha and beta3; and Simplified AdEMAMix (Morwani,
Vyas, Brandfonbrener, Shapira, Kakade et al. 2025): one un-normalised momentum plus alpha times g."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, NamedTuple

import numba
import numpy as np

from refopt.kernels import Elementwise
from refopt.rules import _checks
from refopt.rules.base import ElementwiseRule, lr_at


def alpha_warmup(t: int, alpha: float, warmup: int | None) -> float:
    r"""The paper's alpha scheduler (Pagliardini et al. 2024, Sec. 3): :math:`\alpha_t = \min(t \alpha / T, \alpha)`
    (``alpha`` itself without a warmup T)."""
    return float(alpha) if warmup is None else min(t * float(alpha) / warmup, float(alpha))


def beta3_warmup(t: int, beta1: float, beta3: float, warmup: int | None, form: str = "paper") -> float:
    r"""The paper's beta3 scheduler (Sec. 3), linear in the half-life :math:`\ln(1/2) / \ln\beta` from beta1 to
    beta3 over T steps:

    .. math:: \beta_{3,t} = \min\Big(\exp\Big(\frac{\ln\beta_1 \ln\beta_3}{(1 - t/T)\ln\beta_3 + (t/T)\ln\beta_1}
              \Big), \beta_3\Big)

    (``beta3`` itself without a warmup; beta1 = 0 or beta3 = 0 has no half-life: beta3 itself). ``form``
    "heavyball" is heavyball 3.2.1's ``linear_hl_warmup_scheduler``: the same expression with beta1 + 1e-8 and
    beta3 + 1e-8 inside the logs, clipped to [0, 1 - 1e-8] for t < T, and beta3 itself for t >= T."""
    if warmup is None or beta1 <= 0.0 or beta3 <= 0.0:
        return float(beta3)
    if form == "heavyball":
        if t >= warmup:
            return float(beta3)
        lb1, lb3 = math.log(beta1 + 1e-8), math.log(beta3 + 1e-8)
        f = t / float(warmup)
        return min(max(math.exp(lb1 * lb3 / ((1.0 - f) * lb3 + f * lb1)), 0.0), 1.0 - 1e-8)
    lb1, lb3 = math.log(beta1), math.log(beta3)
    f = t / warmup
    return min(math.exp(lb1 * lb3 / ((1.0 - f) * lb3 + f * lb1)), float(beta3))


class AdEMAMixState(NamedTuple):
    """Per-array state, each like x: the fast EMA ``m1``, the slow EMA ``m2`` and the second moment ``v``."""

    m1: np.ndarray
    m2: np.ndarray
    v: np.ndarray


class AdEMAMixContext(NamedTuple):
    lr_t: float
    decay: float      # 1 - lr_t weight_decay
    step: float       # lr_t
    u_scale: float    # 1
    beta1: float
    omb1: float
    beta2: float
    omb2: float
    beta3: float      # beta3_t
    omb3: float
    alpha: float      # alpha_t
    eps: float
    eps_root: float
    bc1: float        # 1 - beta1^t
    bc2: float        # 1 - beta2^t
    eps_max: bool     # eps_form == "max"


@numba.njit
def _ademamix(x, g, s, i, c):
    m1 = c.beta1 * s.m1[i] + c.omb1 * g
    m2 = c.beta3 * s.m2[i] + c.omb3 * g
    v = c.beta2 * s.v[i] + c.omb2 * (g * g)
    s.m1[i] = m1
    s.m2[i] = m2
    s.v[i] = v
    r = np.sqrt(v / c.bc2 + c.eps_root)
    den = max(r, c.eps) if c.eps_max else r + c.eps
    return (m1 / c.bc1 + c.alpha * m2) / den


_ADEMAMIX = Elementwise(_ademamix, "ademamix")


@dataclass(frozen=True)
class AdEMAMix(ElementwiseRule):
    r"""AdEMAMix (Pagliardini et al. 2024, Algorithm 1), as optax.contrib.ademamix with constant alpha and beta3.
    At step t (t = 1 first), gamma_t = schedule(t), lr_t = lr gamma_t, alpha_t and beta3_t from the warmups
    (:func:`alpha_warmup`, :func:`beta3_warmup`; constants without ``warmup``):

    .. math::

        m_{1,t} &= \beta_1 m_{1,t-1} + (1 - \beta_1)\, g_t, \qquad
        m_{2,t} = \beta_{3,t}\, m_{2,t-1} + (1 - \beta_{3,t})\, g_t \\
        v_t &= \beta_2 v_{t-1} + (1 - \beta_2)\, g_t^2 \\
        x_t &= x_{t-1} - \mathrm{lr}_t \Big(\frac{m_{1,t} / (1 - \beta_1^t) + \alpha_t\, m_{2,t}}
        {\sqrt{v_t / (1 - \beta_2^t) + \epsilon_{root}} + \epsilon} + \lambda\, x_{t-1}\Big)

    The slow EMA m2 is not bias-corrected (the paper's choice: it starts at 0 and alpha_t warms up instead);
    the decay lambda is multiplied by lr_t (AdamW's form, optax's ``add_decayed_weights`` before
    ``scale_by_learning_rate``).

    Args:
      lr: >= 0 (optax: required).
      beta1, beta2: in [0, 1) (0.9, 0.999); beta3: in [0, 1) (0.9999), the slow EMA's.
      alpha: >= 0, the slow EMA's weight (5.0, optax's; the paper sweeps 4-10).
      eps: > 0 (1e-8); eps_root: >= 0, inside the square root (0).
      weight_decay: lambda >= 0 (0).
      warmup: None or T >= 1, the paper's ``T_alpha_beta3`` warmup of alpha and beta3 (None).
      warmup_form: "paper" (the paper's beta3 warmup) or "heavyball" (heavyball 3.2.1's: 1e-8 added to beta1 and
        beta3 inside the logs; see :func:`beta3_warmup`); alpha's warmup is the same in both.
      eps_form: "add" (sqrt(v_hat + eps_root) + eps) or "max" (max(sqrt(v_hat + eps_root), eps), heavyball's
        ``eps_sqrt``).
      schedule: t -> gamma_t.

    Shapes/dtypes: any float32 / float64 array; ``m1``, ``m2``, ``v`` like x.

    Raises:
      ValueError: for a hyperparameter out of its range or a non-callable schedule.
    """

    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.999
    beta3: float = 0.9999
    alpha: float = 5.0
    eps: float = 1e-8
    eps_root: float = 0.0
    weight_decay: float = 0.0
    warmup: int | None = None
    warmup_form: str = "paper"
    eps_form: str = "add"
    schedule: Callable[[int], float] | None = None

    State = AdEMAMixState

    def __post_init__(self):
        _checks.nonnegative("lr", self.lr)
        for name in ("beta1", "beta2", "beta3"):
            _checks.unit_interval(name, getattr(self, name))
        _checks.nonnegative("alpha", self.alpha)
        _checks.positive("eps", self.eps)
        _checks.nonnegative("eps_root", self.eps_root)
        _checks.nonnegative("weight_decay", self.weight_decay)
        if self.warmup is not None and (isinstance(self.warmup, bool) or not isinstance(self.warmup, int)
                                        or self.warmup < 1):
            raise ValueError(f"warmup must be None or an integer >= 1 (the steps T), got {self.warmup!r}")
        if self.warmup_form not in ("paper", "heavyball"):
            raise ValueError(f"warmup_form must be 'paper' or 'heavyball', got {self.warmup_form!r}")
        if self.eps_form not in ("add", "max"):
            raise ValueError(f"eps_form must be 'add' or 'max', got {self.eps_form!r}")
        _checks.schedule(self.schedule)

    def squares_grads(self, s):
        return True

    def decoupled_decay(self):
        return self.weight_decay > 0

    def context(self, t, glob):
        lr_t, b1, b2 = lr_at(self, t), float(self.beta1), float(self.beta2)
        b3 = beta3_warmup(t, b1, float(self.beta3), self.warmup, self.warmup_form)
        return AdEMAMixContext(lr_t, 1.0 - lr_t * float(self.weight_decay), lr_t, 1.0, b1, 1.0 - b1, b2, 1.0 - b2,
                               b3, 1.0 - b3, alpha_warmup(t, self.alpha, self.warmup), float(self.eps),
                               float(self.eps_root), 1.0 - b1 ** t, 1.0 - b2 ** t,
                               self.eps_form == "max"), glob

    def kernel(self):
        return _ADEMAMIX


class SimplifiedAdEMAMixState(NamedTuple):
    """Per-array state, each like x: the un-normalised momentum ``m`` (a sum, not an average) and the second
    moment ``v``."""

    m: np.ndarray
    v: np.ndarray


class SimplifiedAdEMAMixContext(NamedTuple):
    lr_t: float
    decay: float      # 1 - lr_t weight_decay
    step: float       # lr_t
    u_scale: float    # 1
    beta1: float
    beta2: float
    omb2: float
    alpha: float
    eps: float
    eps_root: float
    bc2: float        # 1 - beta2^t


@numba.njit
def _simplified_ademamix(x, g, s, i, c):
    m = c.beta1 * s.m[i] + g
    v = c.beta2 * s.v[i] + c.omb2 * (g * g)
    s.m[i] = m
    s.v[i] = v
    return (m + c.alpha * g) / (np.sqrt(v / c.bc2 + c.eps_root) + c.eps)


_SIMPLIFIED_ADEMAMIX = Elementwise(_simplified_ademamix, "simplified_ademamix")


@dataclass(frozen=True)
class SimplifiedAdEMAMix(ElementwiseRule):
    r"""Simplified AdEMAMix (Morwani et al. 2025, Algorithm "Simplified-AdEMAMix"), as
    optax.contrib.simplified_ademamix. At step t (t = 1 first), lr_t = lr schedule(t):

    .. math::

        m_t &= \beta_1 m_{t-1} + g_t \qquad (\text{a sum: no } 1 - \beta_1) \\
        v_t &= \beta_2 v_{t-1} + (1 - \beta_2)\, g_t^2 \\
        x_t &= x_{t-1} - \mathrm{lr}_t \Big(\frac{m_t + \alpha\, g_t}
        {\sqrt{v_t / (1 - \beta_2^t) + \epsilon_{root}} + \epsilon} + \lambda\, x_{t-1}\Big)

    One momentum replaces AdEMAMix's two: m has weight 1/(1 - beta1) at equilibrium, so the lr is about
    (1 - beta1) times AdEMAMix's; alpha = 0 is Adam with an un-normalised m and no bias correction of m.

    Args:
      lr: >= 0 (optax: required).
      beta1: in [0, 1) (0.99); beta2: in [0, 1) (0.95).
      alpha: >= 0, the weight of g_t (0.0).
      eps: > 0 (1e-8); eps_root: >= 0 (0).
      weight_decay: lambda >= 0 (0), multiplied by lr_t.
      schedule: t -> gamma_t.

    Shapes/dtypes: any float32 / float64 array; ``m``, ``v`` like x.

    Raises:
      ValueError: for a hyperparameter out of its range or a non-callable schedule.
    """

    lr: float = 1e-4
    beta1: float = 0.99
    beta2: float = 0.95
    alpha: float = 0.0
    eps: float = 1e-8
    eps_root: float = 0.0
    weight_decay: float = 0.0
    schedule: Callable[[int], float] | None = None

    State = SimplifiedAdEMAMixState

    def __post_init__(self):
        _checks.nonnegative("lr", self.lr)
        _checks.unit_interval("beta1", self.beta1)
        _checks.unit_interval("beta2", self.beta2)
        _checks.nonnegative("alpha", self.alpha)
        _checks.positive("eps", self.eps)
        _checks.nonnegative("eps_root", self.eps_root)
        _checks.nonnegative("weight_decay", self.weight_decay)
        _checks.schedule(self.schedule)

    def squares_grads(self, s):
        return True

    def decoupled_decay(self):
        return self.weight_decay > 0

    def context(self, t, glob):
        lr_t, b2 = lr_at(self, t), float(self.beta2)
        return SimplifiedAdEMAMixContext(lr_t, 1.0 - lr_t * float(self.weight_decay), lr_t, 1.0, float(self.beta1),
                                         b2, 1.0 - b2, float(self.alpha), float(self.eps), float(self.eps_root),
                                         1.0 - b2 ** t), glob

    def kernel(self):
        return _SIMPLIFIED_ADEMAMIX
