"""Adam (L2 decay) and AdamW (decoupled or lr-independent decay), in torch.optim's conventions, with an
optional Nesterov first moment in optax's NAdam form (``nesterov=True``)."""
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
    nest_m: float = 0.0   # NAdam (nesterov=True only): beta1 / (1 - beta1**(t+1)), coefficient of m_t
    nest_g: float = 0.0   # NAdam (nesterov=True only): (1 - beta1) / (1 - beta1**t), coefficient of g_t


@dataclass(frozen=True)
class _AdamBase(Rule):
    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    schedule: Callable[[int], float] | None = None
    nesterov: bool = False

    def __post_init__(self):
        _checks.nonnegative("lr", self.lr)
        _checks.unit_interval("beta1", self.beta1)
        _checks.unit_interval("beta2", self.beta2)
        _checks.positive("eps", self.eps)
        _checks.nonnegative("weight_decay", self.weight_decay)
        _checks.schedule(self.schedule)
        _checks.boolean("nesterov", self.nesterov)

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
        if not self.nesterov:
            return AdamContext(t, lr_t, lr_t / bc1, math.sqrt(bc2), decay, l2), glob
        nest_m = self.beta1 / (1.0 - self.beta1 ** (t + 1))
        nest_g = (1.0 - self.beta1) / bc1
        return AdamContext(t, lr_t, lr_t / bc1, math.sqrt(bc2), decay, l2, nest_m, nest_g), glob

    def _scalars(self, c: AdamContext, d):
        eps = _checks.cast(np.dtype(d), "eps", self.eps, positive=True)
        _checks.cast(np.dtype(d), "lr * schedule(t) / (1 - beta1**t)", c.step_size)
        return (d(self.beta1), d(1.0 - self.beta1), d(self.beta2), d(1.0 - self.beta2), eps,
                d(c.sqrt_bc2), d(c.l2))

    def update_leaf(self, ctx, s, x, g, path):
        d = x.dtype.type
        if self.nesterov:
            _nadam_step(x.reshape(-1), np.ascontiguousarray(g).reshape(-1), s.m.reshape(-1), s.v.reshape(-1),
                        *self._scalars(ctx, d), d(ctx.nest_m), d(ctx.nest_g), d(ctx.lr_t), d(ctx.decay))
            return x, s
        _adam_step(x.reshape(-1), np.ascontiguousarray(g).reshape(-1), s.m.reshape(-1), s.v.reshape(-1),
                   *self._scalars(ctx, d), d(ctx.step_size), d(ctx.decay))
        return x, s

    def direction_leaf(self, ctx, s, x, g, path):
        d = x.dtype.type
        u = np.empty(x.shape, x.dtype)
        if self.nesterov:
            _nadam_direction(u.reshape(-1), np.ascontiguousarray(x).reshape(-1),
                             np.ascontiguousarray(g).reshape(-1), s.m.reshape(-1), s.v.reshape(-1),
                             *self._scalars(ctx, d), d(ctx.nest_m), d(ctx.nest_g))
            return u, s
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

    ``nesterov=True`` (NAdam, Dozat 2016, "Incorporating Nesterov Momentum into Adam", in optax's form:
    ``optax.nadam`` = ``scale_by_adam(nesterov=True)``, CONVENTIONS.md 2.3) replaces the bias-corrected
    first moment by a look-ahead mix of m_t and the (L2-augmented) g_t, with the same moments and the same
    denominator::

        mhat_t = beta1 * m_t / (1 - beta1**(t+1)) + (1 - beta1) * g_t / (1 - beta1**t)
        x_t    = x_{t-1} - lr*gamma_t * mhat_t / (sqrt(v_t) / sqrt(1 - beta2**t) + eps)

    and the direction is u_t = mhat_t / (sqrt(vhat_t) + eps). As optax (and unlike Dozat's Alg. 2), vhat_t
    has no extra beta2 factor and beta1 is constant (no momentum-decay schedule mu_t as in
    torch.optim.NAdam, which therefore differs). The two coefficients beta1/(1 - beta1**(t+1)) and
    (1 - beta1)/(1 - beta1**t) are computed in float64 and cast (B01).

    Args:
      lr: peak learning rate eta >= 0 (units of x: the step is about lr per coordinate).
      beta1, beta2: EMA rates in [0, 1).
      eps: > 0, in units of the gradient.
      weight_decay: L2 coefficient lambda >= 0.
      schedule: optional t -> gamma_t >= 0.
      nesterov: bool, default False (plain Adam); True: NAdam as optax.nadam (above).

    Shapes/dtypes: any float32 / float64 array; m, v like x; hyperparameters cast to x's dtype.
    Raises: ValueError for lr < 0, betas outside [0, 1), eps <= 0, weight_decay < 0, non-bool nesterov.
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

    ``nesterov=True`` uses :class:`Adam`'s NAdam first moment in u_t' (decoupled mode = ``optax.nadamw``:
    x_t = x_{t-1} - lr*gamma_t*(u_t' + lambda*x_{t-1}), here in torch's order x*(1 - lr*gamma_t*lambda) - ...).

    Args: as :class:`Adam`; ``weight_decay`` lambda >= 0 (default 0.01, torch's AdamW default; in
      'independent' mode lambda must be <= 1); ``wd_mode`` 'decoupled' | 'independent'; ``nesterov`` as Adam.
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


@numba.njit(inline="always")
def _nadam_moments(xi, gi, mi, vi, b1, omb1, b2, omb2, eps, sqrt_bc2, l2, nest_m, nest_g):
    """NAdam: Adam's moments, then returns (m_t, v_t, denominator, mhat_t = nest_m*m_t + nest_g*g_t)."""
    gi = gi + l2 * xi
    mi = b1 * mi + omb1 * gi
    vi = b2 * vi + omb2 * (gi * gi)
    return mi, vi, np.sqrt(vi) / sqrt_bc2 + eps, nest_m * mi + nest_g * gi


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


def _nstep(x, g, m, v, b1, omb1, b2, omb2, eps, sqrt_bc2, l2, nest_m, nest_g, lr_t, decay):
    """One NAdam step over flat arrays: x <- decay * x - lr_t * mhat_t / (sqrt(v_t)/sqrt(bc2) + eps)."""
    for i in numba.prange(x.size):
        xi = x[i]
        mi, vi, denom, mhat = _nadam_moments(xi, g[i], m[i], v[i], b1, omb1, b2, omb2, eps, sqrt_bc2, l2,
                                             nest_m, nest_g)
        m[i] = mi
        v[i] = vi
        x[i] = xi * decay - lr_t * (mhat / denom)


def _ndirection(u, x, g, m, v, b1, omb1, b2, omb2, eps, sqrt_bc2, l2, nest_m, nest_g):
    """NAdam's direction u = mhat_t / (sqrt(v_t)/sqrt(bc2) + eps) into ``u``; x is only read."""
    for i in numba.prange(u.size):
        mi, vi, denom, mhat = _nadam_moments(x[i], g[i], m[i], v[i], b1, omb1, b2, omb2, eps, sqrt_bc2, l2,
                                             nest_m, nest_g)
        m[i] = mi
        v[i] = vi
        u[i] = mhat / denom


_adam_step = elementwise(_step)
_adam_direction = elementwise(_direction)
_nadam_step = elementwise(_nstep)
_nadam_direction = elementwise(_ndirection)


def adam_reference(x, g, m, v, t, rule: _AdamBase):
    """Plain-numpy twin of the kernels (their spec; NAdam when ``rule.nesterov``).
    Returns (x_new, m_new, v_new)."""
    d = x.dtype.type
    c, _ = rule.context(t, None)
    g = g + d(c.l2) * x
    m = d(rule.beta1) * m + d(1.0 - rule.beta1) * g
    v = d(rule.beta2) * v + d(1.0 - rule.beta2) * (g * g)
    denom = np.sqrt(v) / d(c.sqrt_bc2) + d(rule.eps)
    if rule.nesterov:
        mhat = d(c.nest_m) * m + d(c.nest_g) * g
        return x * d(c.decay) - d(c.lr_t) * (mhat / denom), m, v
    return x * d(c.decay) - d(c.step_size) * (m / denom), m, v
