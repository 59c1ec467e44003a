"""Adam (L2 decay) and AdamW (decoupled or lr-independent decay), in torch.optim's conventions."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, NamedTuple

import numba
import numpy as np

from refopt.core import Rule
from refopt.kernels import elementwise
from refopt.rules import _checks


class AdamState(NamedTuple):
    """Per-array Adam state: first moment ``m`` and second moment ``v`` (shape and dtype of x)."""

    m: np.ndarray
    v: np.ndarray


class AdamContext(NamedTuple):
    """The scalars of one step, computed in float64 (PITFALLS B01) before the cast to x's dtype."""

    t: int
    lr_t: float        # lr * gamma_t
    step_size: float   # lr_t / (1 - beta1**t)
    sqrt_bc2: float    # sqrt(1 - beta2**t)
    decay: float       # multiplier of x_{t-1} from decoupled / independent weight decay (1 for none)
    l2: float          # L2 coefficient added to g (Adam's weight_decay; 0 for AdamW)


@dataclass(frozen=True)
class _AdamBase(Rule):
    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    schedule: Callable[[int], float] | None = None

    def __post_init__(self):
        _checks.nonnegative("lr", self.lr)
        _checks.unit_interval("beta1", self.beta1)
        _checks.unit_interval("beta2", self.beta2)
        _checks.positive("eps", self.eps)
        _checks.nonnegative("weight_decay", self.weight_decay)
        _checks.schedule(self.schedule)

    def init_leaf(self, x, path):
        return AdamState(np.zeros_like(x), np.zeros_like(x))

    def _decay_and_l2(self, gamma: float, lr_t: float) -> tuple[float, float]:
        return 1.0, self.weight_decay

    def context(self, t, glob):
        gamma = _checks.schedule_multiplier(self.schedule, t)
        lr_t = self.lr * gamma
        decay, l2 = self._decay_and_l2(gamma, lr_t)
        bc1 = 1.0 - self.beta1 ** t
        bc2 = 1.0 - self.beta2 ** t
        return AdamContext(t, lr_t, lr_t / bc1, math.sqrt(bc2), decay, l2), glob

    def _scalars(self, c: AdamContext, d):
        return (d(self.beta1), d(1.0 - self.beta1), d(self.beta2), d(1.0 - self.beta2), d(self.eps),
                d(c.sqrt_bc2), d(c.l2))

    def update_leaf(self, ctx, s, x, g, path):
        d = x.dtype.type
        _adam_step(x.reshape(-1), np.ascontiguousarray(g).reshape(-1), s.m.reshape(-1), s.v.reshape(-1),
                   *self._scalars(ctx, d), d(ctx.step_size), d(ctx.decay))
        return x, s

    def direction_leaf(self, ctx, s, x, g, path):
        d = x.dtype.type
        u = np.empty(x.shape, x.dtype)
        _adam_direction(u.reshape(-1), np.ascontiguousarray(x).reshape(-1), np.ascontiguousarray(g).reshape(-1),
                        s.m.reshape(-1), s.v.reshape(-1), *self._scalars(ctx, d),
                        d(1.0 / (1.0 - self.beta1 ** ctx.t)))
        return u, s


@dataclass(frozen=True)
class Adam(_AdamBase):
    r"""Adam (Kingma & Ba 2015, Alg. 1) with L2 weight decay, as torch.optim.Adam (CONVENTIONS.md 1.2).

    At step t (t = 1 first), gamma_t = schedule(t)::

        g_t <- g_t + lambda * x_{t-1}                                (L2, coupled)
        m_t  = beta1 * m_{t-1} + (1 - beta1) * g_t
        v_t  = beta2 * v_{t-1} + (1 - beta2) * g_t**2
        x_t  = x_{t-1} - (lr*gamma_t / (1 - beta1**t)) * m_t / (sqrt(v_t) / sqrt(1 - beta2**t) + eps)

    eps is added after the square root of the bias-corrected v (placement "E1" of CONVENTIONS.md 0,
    torch and optax; not TensorFlow's eps-hat). The bias corrections use the integer t and are computed in
    float64, then cast (PITFALLS B01). The direction (:func:`refopt.direction`) is
    u_t = mhat_t / (sqrt(vhat_t) + eps) with mhat_t = m_t/(1-beta1**t), vhat_t = v_t/(1-beta2**t).

    Args:
      lr: peak learning rate eta >= 0 (units of x: the step is about lr per coordinate).
      beta1, beta2: EMA rates in [0, 1).
      eps: > 0, in units of the gradient.
      weight_decay: L2 coefficient lambda >= 0.
      schedule: optional t -> gamma_t >= 0.

    Shapes/dtypes: any float32 / float64 array; m, v like x; hyperparameters cast to x's dtype.
    Raises: ValueError for lr < 0, betas outside [0, 1), eps <= 0, weight_decay < 0.
    """


@dataclass(frozen=True)
class AdamW(_AdamBase):
    r"""AdamW: Adam with decay outside the moments (Loshchilov & Hutter 2019, arXiv:1711.05101).

    Same moments and eps placement as :class:`Adam` (no L2 term in g). The decay uses the pre-update
    x_{t-1} (PITFALLS B05)::

        'decoupled'   (torch AdamW):  x_t = (1 - lr*gamma_t*lambda) * x_{t-1} - lr*gamma_t * u_t'
        'independent' (seed 001; arXiv:2405.13698, "independent weight decay"):
                                      x_t = (1 - gamma_t*lambda) * x_{t-1}    - lr*gamma_t * u_t'

    where lr*gamma_t*u_t' is Adam's step above. In 'independent' mode lambda is a rate per step (the EMA
    time constant is 1/(gamma_t*lambda) steps), so it transfers across learning rates.

    Args: as :class:`Adam`; ``weight_decay`` lambda >= 0 (default 0.01, torch's AdamW default; in
      'independent' mode lambda must be <= 1); ``wd_mode`` 'decoupled' | 'independent'.
    Raises: ValueError as Adam, or for an unknown wd_mode.
    """

    weight_decay: float = 0.01
    wd_mode: str = "decoupled"

    def __post_init__(self):
        super().__post_init__()
        _checks.one_of("wd_mode", self.wd_mode, {"decoupled", "independent"})
        if self.wd_mode == "independent" and self.weight_decay > 1:
            raise ValueError(f"independent weight_decay is a per-step rate and must be <= 1, got {self.weight_decay}")

    def _decay_and_l2(self, gamma, lr_t):
        rate = lr_t if self.wd_mode == "decoupled" else gamma
        return 1.0 - rate * self.weight_decay, 0.0


@numba.njit(inline="always")
def _moments(xi, gi, mi, vi, b1, omb1, b2, omb2, eps, sqrt_bc2, l2):
    """Adam's per-element moment update: returns (m_t, v_t, sqrt(v_t)/sqrt(1 - beta2**t) + eps)."""
    gi = gi + l2 * xi
    mi = b1 * mi + omb1 * gi
    vi = b2 * vi + omb2 * (gi * gi)
    return mi, vi, np.sqrt(vi) / sqrt_bc2 + eps


def _step(x, g, m, v, b1, omb1, b2, omb2, eps, sqrt_bc2, l2, step_size, decay):
    """One Adam step over flat arrays in torch's operation order:
    x <- decay * x - step_size * m_t / (sqrt(v_t)/sqrt(bc2) + eps), with step_size = lr_t / bc1."""
    for i in numba.prange(x.size):
        xi = x[i]
        mi, vi, denom = _moments(xi, g[i], m[i], v[i], b1, omb1, b2, omb2, eps, sqrt_bc2, l2)
        m[i] = mi
        v[i] = vi
        x[i] = xi * decay - step_size * (mi / denom)


def _direction(u, x, g, m, v, b1, omb1, b2, omb2, eps, sqrt_bc2, l2, inv_bc1):
    """Adam's direction u = (m_t / bc1) / (sqrt(v_t)/sqrt(bc2) + eps) into ``u``; x is only read."""
    for i in numba.prange(u.size):
        mi, vi, denom = _moments(x[i], g[i], m[i], v[i], b1, omb1, b2, omb2, eps, sqrt_bc2, l2)
        m[i] = mi
        v[i] = vi
        u[i] = (mi * inv_bc1) / denom


_adam_step = elementwise(_step)
_adam_direction = elementwise(_direction)


def adam_reference(x, g, m, v, t, rule: _AdamBase):
    """Plain-numpy twin of the kernel (its spec). Returns (x_new, m_new, v_new)."""
    d = x.dtype.type
    c, _ = rule.context(t, None)
    g = g + d(c.l2) * x
    m = d(rule.beta1) * m + d(1.0 - rule.beta1) * g
    v = d(rule.beta2) * v + d(1.0 - rule.beta2) * (g * g)
    denom = np.sqrt(v) / d(c.sqrt_bc2) + d(rule.eps)
    return x * d(c.decay) - d(c.step_size) * (m / denom), m, v
