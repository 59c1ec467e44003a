"""Prodigy (Mishchenko & Defazio 2024, "Prodigy: An Expeditiously Adaptive Parameter-Free Learner", the Adam
version): AdamW whose step size d is estimated from the whole tree's weighted gradient sums and distance from
x_0, in the forms of prodigyopt, optax.contrib.prodigy and pytorch_optimizer. The estimate is rule-wide (one d
over the tree, :meth:`refopt.core.Rule.reduce_tree`), kept in ``OptState.glob``."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, NamedTuple

import numba
import numpy as np

from refopt.kernels import Elementwise
from refopt.rules import _checks
from refopt.rules.base import ElementwiseRule, lr_at

#: where d enters the denominator's eps (:class:`Prodigy`'s ``eps_at``)
EPS_AT = ("next", "current")


class ProdigyState(NamedTuple):
    """Per-array state, each like x: the moments ``m`` and ``v`` of d g, the weighted gradient sum ``s``
    (all 0 at init) and the initial point ``x0`` (a copy of x at init)."""

    m: np.ndarray
    v: np.ndarray
    s: np.ndarray
    x0: np.ndarray


class ProdigyGlobal(NamedTuple):
    """Prodigy's rule-wide state (Python floats): the estimate ``d`` (d_0 at init), its running maximum
    ``d_max`` (the bound of the growth rate) and the weighted numerator ``numerator`` r_t (0 at init)."""

    d: float
    d_max: float
    numerator: float


class ProdigyContext(NamedTuple):
    lr_t: float
    decay: float      # 1 - weight_decay dlr (decoupled), else 1
    step: float       # dlr = d_t lr_t bc_t
    u_scale: float    # dlr / lr_t (the direction u = step / lr_t a)
    beta1: float
    beta2: float
    beta3: float
    d: float          # d_t, the estimate the moments are weighted with
    s_scale: float    # (d_t / d_0) dlr, or (d_t / d_0) d_t with the safeguard
    eps_d: float      # eps d_{t+1} (eps d_t with eps_at='current'); set by reduce_tree
    coupled: bool     # L2: g + weight_decay x enters every sum
    wd: float
    frozen: bool      # lr_t = 0: nothing moves (prodigyopt's group with lr 0)


@numba.njit
def _prodigy(x, g, s, i, c):
    if c.frozen:
        return 0.0
    if c.coupled:
        g = g + c.wd * x
    dg = c.d * g
    m = c.beta1 * s.m[i] + (1.0 - c.beta1) * dg
    v = c.beta2 * s.v[i] + (1.0 - c.beta2) * (dg * dg)
    s.m[i] = m
    s.v[i] = v
    s.s[i] = c.beta3 * s.s[i] + c.s_scale * g
    return m / (np.sqrt(v) + c.eps_d)


_PRODIGY = Elementwise(_prodigy, "prodigy")


def _check_glob(glob) -> None:
    ok = isinstance(glob, ProdigyGlobal) and all(isinstance(v, float) and math.isfinite(v) for v in glob) \
        and glob.d > 0 and glob.d_max >= glob.d
    if not ok:
        raise ValueError("Prodigy: the global state must be a ProdigyGlobal of finite floats (d > 0, d_max >= d) "
                         f"made by refopt.init, got {glob!r}")


def _f64(a) -> np.ndarray:
    return np.asarray(a, np.float64)


@dataclass(frozen=True)
class Prodigy(ElementwiseRule):
    r"""Prodigy, Adam version (Mishchenko & Defazio 2024, Algorithm 3), as prodigyopt.Prodigy,
    optax.contrib.prodigy and pytorch_optimizer.Prodigy. At step t (t = 1 first), lr_t = lr gamma_t, with
    a_t = g_t (+ lambda x_{t-1} when ``decoupled`` is False), bc_t = sqrt(1 - beta2^t) / (1 - beta1^t) with
    ``bias_correction`` (else 1), dlr_t = d_t lr_t bc_t, inner products and the l1 norm over the whole tree:

    .. math::

        m_t &= \beta_1 m_{t-1} + (1 - \beta_1)\, d_t a_t, \qquad
        v_t = \beta_2 v_{t-1} + (1 - \beta_2)\, d_t^2 a_t^2 \\
        r_t &= \beta_3 r_{t-1} + \tfrac{d_t}{d_0}\, \mathrm{dlr}_t \langle a_t, x_0 - x_{t-1} \rangle, \qquad
        s_t = \beta_3 s_{t-1} + \tfrac{d_t}{d_0}\, \mathrm{dlr}_t\, a_t \\
        \hat d_t &= c_d\, r_t / \|s_t\|_1, \qquad
        d_{\max} \leftarrow \max(d_{\max}, \hat d_t), \qquad
        d_{t+1} = \min(d_{\max}, \rho\, d_t') \\
        x_t &= x_{t-1} - \mathrm{dlr}_t \Big(\frac{m_t}{\sqrt{v_t} + d_{t+1} \epsilon}
        + \lambda x_{t-1}\Big)

    with d_t' = max(d_t, hat d_t) while d_t = d_0, else d_t (rho = growth_rate; rho = inf gives the paper's
    d_{t+1} = max(d_t, hat d_t)); beta3 = sqrt(beta2) by default; the decay term only when ``decoupled``.
    The paper weights r and s by (1 - beta3) d_t^2 lr_t; the packages' (d_t / d_0) dlr_t differs by a
    constant factor, which cancels in hat d_t. ``safeguard_warmup`` weights s by (d_t / d_0) d_t (no lr).
    The paper's denominator is sqrt(v_t) + d_t eps (``eps_at='current'``); the packages use d_{t+1}
    (``'next'``). When ||s_t||_1 = 0 (every gradient so far zero) d is kept (prodigyopt then skips the
    whole step, optax's estimate is 0/0); when lr_t = 0 nothing moves (prodigyopt's frozen group).

    Args:
      lr: >= 0, a multiplier of the estimated step (1.0).
      beta1: [0, 1) (0.9); beta2: [0, 1) (0.999); beta3: None (sqrt(beta2)) or [0, 1).
      eps: > 0 (1e-8), times d in the denominator.
      d0: > 0, the initial estimate d_0 (1e-6); d_coef: > 0, c_d (1.0); growth_rate: rho >= 1 (inf).
      weight_decay: lambda >= 0 (0); decoupled: True (AdamW's dlr lambda x, the packages' default) or
        False (L2 in a_t, prodigyopt's decouple=False).
      bias_correction: bool (False, prodigyopt's default; optax always corrects).
      safeguard_warmup: bool (False).
      eps_at: 'next' (the packages') or 'current' (the paper's).
      schedule: t -> gamma_t.

    State: per leaf :class:`ProdigyState`; rule-wide :class:`ProdigyGlobal` in ``OptState.glob`` (float64
    sums, also for float32 params). Shapes/dtypes: any float32 / float64 arrays.

    Raises:
      ValueError: for a hyperparameter out of its range; at a step, for a global state that is not a
      :class:`ProdigyGlobal` made by :func:`refopt.init`.
    """

    lr: float = 1.0
    beta1: float = 0.9
    beta2: float = 0.999
    beta3: float | None = None
    eps: float = 1e-8
    d0: float = 1e-6
    d_coef: float = 1.0
    growth_rate: float = math.inf
    weight_decay: float = 0.0
    decoupled: bool = True
    bias_correction: bool = False
    safeguard_warmup: bool = False
    eps_at: str = "next"
    schedule: Callable[[int], float] | None = None

    State = ProdigyState

    def __post_init__(self):
        _checks.nonnegative("lr", self.lr)
        _checks.unit_interval("beta1", self.beta1)
        _checks.unit_interval("beta2", self.beta2)
        if self.beta3 is not None:
            _checks.unit_interval("beta3", self.beta3)
        _checks.positive("eps", self.eps)
        _checks.positive("d0", self.d0)
        _checks.positive("d_coef", self.d_coef)
        _checks.growth_rate(self.growth_rate)
        _checks.nonnegative("weight_decay", self.weight_decay)
        _checks.boolean("decoupled", self.decoupled)
        _checks.boolean("bias_correction", self.bias_correction)
        _checks.boolean("safeguard_warmup", self.safeguard_warmup)
        _checks.one_of("eps_at", self.eps_at, EPS_AT)
        _checks.schedule(self.schedule)

    def init_leaf(self, x, path):
        z = np.zeros_like(x)
        return ProdigyState(z, z.copy(), z.copy(), np.array(x, order="C", copy=True))

    def init_global(self):
        return ProdigyGlobal(float(self.d0), float(self.d0), 0.0)

    def squares_grads(self, s):
        return True

    def decoupled_decay(self):
        return self.decoupled and self.weight_decay > 0

    def _beta3(self) -> float:
        return math.sqrt(self.beta2) if self.beta3 is None else float(self.beta3)

    def context(self, t, glob):
        _check_glob(glob)
        lr_t, d, wd = lr_at(self, t), glob.d, float(self.weight_decay)
        b1, b2 = float(self.beta1), float(self.beta2)
        bc = math.sqrt(1.0 - b2 ** t) / (1.0 - b1 ** t) if self.bias_correction else 1.0
        dlr = d * lr_t * bc
        decay = 1.0 - wd * dlr if self.decoupled else 1.0
        s_scale = (d / self.d0) * (d if self.safeguard_warmup else dlr)
        return ProdigyContext(lr_t, decay, dlr, dlr / lr_t if lr_t else 0.0, b1, b2, self._beta3(), d, s_scale,
                              float(self.eps) * d, not self.decoupled and wd != 0, wd, lr_t == 0), glob

    def reduce_tree(self, ctx, glob, ss, xs, gs, paths):
        if ctx.frozen:
            return ctx, glob
        wd = ctx.wd if ctx.coupled else 0.0
        num, l1 = 0.0, 0.0
        for s, x, g in zip(ss, xs, gs):
            a = _f64(g) + wd * _f64(x) if wd else _f64(g)
            num += float(np.dot(np.ravel(a), np.ravel(_f64(s.x0) - _f64(x))))
            l1 += float(np.sum(np.abs(ctx.beta3 * _f64(s.s) + ctx.s_scale * a)))
        d, d_max = glob.d, glob.d_max
        r = ctx.beta3 * glob.numerator + (d / self.d0) * ctx.step * num
        if l1 > 0:
            d_hat = self.d_coef * r / l1
            d_prime = max(d, d_hat) if d == self.d0 else d
            d_max = max(d_max, d_hat)
            d = min(d_max, d_prime * self.growth_rate)
        eps_d = float(self.eps) * (d if self.eps_at == "next" else glob.d)
        return ctx._replace(eps_d=eps_d), ProdigyGlobal(float(d), float(d_max), float(r))

    def kernel(self):
        return _PRODIGY
