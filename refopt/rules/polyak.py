r"""Polyak-type step sizes, computed from the loss value f(x) the step is given (``value=``, see
:data:`refopt.core.INPUTS`): SGD with the Polyak step (Loizou, Vaswani, Laradji & Lacoste-Julien 2021, SPS_max;
Garrigos, Gower & Schaipp 2023, SPS+) and MoMo, the momentum model of the loss (Schaipp, Ohana, Eickenberg,
Defazio & Gower 2023, "MoMo: Momentum Models for Adaptive Learning Rates", Algorithms 1 and 2, with weight
decay as the paper's proximal step). The step sizes are rule-wide: norms and inner products over the whole
tree in float64 (:meth:`refopt.core.Rule.reduce_inputs`); MoMo's running averages of the loss and of
<g, x> live in ``OptState.glob``.

Notation: t = 1 for the first update, lr_t = lr gamma_t, <a, b> and ||a|| over all leaves, eps_64 =
2.22e-16 (float64's machine epsilon: below it a squared norm counts as 0 and the step is 0, as optax)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, NamedTuple

import numba
import numpy as np

from refopt.kernels import Elementwise
from refopt.rules import _checks
from refopt.rules.base import ElementwiseRule, lr_at

EPS_64 = float(np.finfo(np.float64).eps)

_VARIANTS = ("sps", "sps+")
_DECAY_FORMS = ("prox", "x", "adamw")


def dot(a, b) -> float:
    """<a, b> over one array pair, in float64 (float32 arrays widened first)."""
    return float(np.dot(np.ravel(a).astype(np.float64, copy=False), np.ravel(b).astype(np.float64, copy=False)))


def _f(dtype, v: float):
    return np.dtype(dtype).type(v)


class NoState(NamedTuple):
    """Polyak SGD keeps no per-array state."""


class PolyakContext(NamedTuple):
    lr_t: float
    decay: float      # 1
    step: float       # lr_t s_t (0 until reduce_inputs sets s_t)
    u_scale: float    # s_t


@numba.njit
def _plain(x, g, s, i, c):
    return g


_PLAIN = Elementwise(_plain, "polyak_sgd")


@dataclass(frozen=True)
class PolyakSGD(ElementwiseRule):
    r"""SGD with the Polyak step size, SPS_max (Loizou et al. 2021, eq. (7)) and SPS+ (Garrigos et al. 2023),
    as optax.polyak_sgd documents it. At step t, with f_t = f(x_{t-1}) the loss the step is given:

    .. math::

        s_t = \min\left(\frac{f_t - f^\star}{\|g_t\|^2 + \epsilon},\ s_{\max}\right), \qquad
        x_t = x_{t-1} - \mathrm{lr}_t\, s_t\, g_t

    and s_t = 0 where ||g_t||^2 + eps <= eps_64 (a stationary point: no step). ``variant='sps+'`` uses the
    gap's positive part max(f_t - f*, 0) (a loss below the guess f* gives no step instead of a step uphill).

    Args:
      lr: >= 0, the multiplier of the Polyak step (optax's ``scaling``; 1.0).
      max_lr: > 0, s_max, the largest step (optax's ``max_learning_rate``; 1.0).
      f_min: f*, a guess of the minimum of f, finite (0.0).
      eps: >= 0, added to ||g||^2 (0.0).
      variant: 'sps' | 'sps+' ('sps').
      schedule: t -> gamma_t.

    Inputs: ``value``, the loss at x_{t-1} (``refopt.update(rule, state, params, grads, value=f)``).
    State: none per array. Shapes/dtypes: any float32 / float64 arrays; ||g||^2 in float64.

    Raises:
      ValueError: for a hyperparameter out of its range.
      TypeError: at a step, when ``value`` is missing (see :func:`refopt.update`).
    """

    lr: float = 1.0
    max_lr: float = 1.0
    f_min: float = 0.0
    eps: float = 0.0
    variant: str = "sps"
    schedule: Callable[[int], float] | None = None

    inputs = ("value",)
    State = NoState

    def __post_init__(self):
        _checks.nonnegative("lr", self.lr)
        _checks.positive("max_lr", self.max_lr)
        _checks.finite_number("f_min", self.f_min)
        _checks.nonnegative("eps", self.eps)
        _checks.one_of("variant", self.variant, _VARIANTS)
        _checks.schedule(self.schedule)

    def kernel(self):
        return _PLAIN

    def context(self, t, glob):
        return PolyakContext(lr_at(self, t), 1.0, 0.0, 0.0), glob

    def step_size(self, value: float, g2: float) -> float:
        """s_t from the loss f_t and ||g_t||^2 (both float64)."""
        gap = value - float(self.f_min)
        if self.variant == "sps+":
            gap = max(gap, 0.0)
        den = g2 + float(self.eps)
        return 0.0 if den <= EPS_64 else min(gap / den, float(self.max_lr))

    def reduce_inputs(self, ctx, glob, inputs, ss, xs, gs, paths):
        s_t = self.step_size(inputs["value"], sum(dot(g, g) for g in gs))
        return ctx._replace(step=ctx.lr_t * s_t, u_scale=s_t), glob


# ---- MoMo ------------------------------------------------------------------------------------------------
class MomoState(NamedTuple):
    """Per-array state of :class:`Momo`: the momentum ``d`` (the average of the gradients; like x, 0 at init)."""

    d: np.ndarray


class MomoAdamState(NamedTuple):
    """Per-array state of :class:`MomoAdam`: the first and second moments ``m`` and ``v`` (like x, 0 at init)."""

    m: np.ndarray
    v: np.ndarray


class MomoGlobal(NamedTuple):
    """MoMo's rule-wide state (Python floats): ``f_avg`` (fbar, the running average of the loss), ``gx_avg``
    (gamma, the running average of <g_s, x_{s-1}>) and ``lb`` (the lower bound f*_t of the loss: ``lower_bound``
    at init; it moves only with ``adapt_lower_bound``)."""

    f_avg: float
    gx_avg: float
    lb: float


class MomoContext(NamedTuple):
    lr_t: float
    decay: float      # 1 / (1 + lr_t lambda) ('prox', 'x') or 1 - lr_t lambda ('adamw')
    step: float       # tau_t / (1 + lr_t lambda) ('prox') or tau_t: set by reduce_inputs
    u_scale: float    # tau_t / lr_t
    keep: float       # beta (0 at t = 1 for Momo: the averages start at the first values)
    new: float        # 1 - keep
    keep2: float      # beta2 (MomoAdam)
    new2: float       # 1 - beta2
    bc1: float        # 1 - beta1^t (MomoAdam; 1 for Momo)
    bc2: float        # 1 - beta2^t (MomoAdam; 1 for Momo)
    eps: float


@numba.njit
def _momo(x, g, s, i, c):
    d = c.keep * s.d[i] + c.new * g
    s.d[i] = d
    return d


@numba.njit
def _momo_adam(x, g, s, i, c):
    m = c.keep * s.m[i] + c.new * g
    v = c.keep2 * s.v[i] + c.new2 * (g * g)
    s.m[i] = m
    s.v[i] = v
    return m / (math.sqrt(v / c.bc2) + c.eps)


_MOMO, _MOMO_ADAM = Elementwise(_momo, "momo"), Elementwise(_momo_adam, "momo_adam")


def _check_glob(name: str, glob) -> None:
    if not isinstance(glob, MomoGlobal) or not all(isinstance(v, float) and math.isfinite(v) for v in glob):
        raise ValueError(f"{name}: the global state must be a MomoGlobal of finite floats made by refopt.init, "
                         f"got {glob!r}")


@dataclass(frozen=True)
class _MomoBase(ElementwiseRule):
    r"""What Momo and MomoAdam share: the model's step size tau_t from the loss, its averages and the lower
    bound (:meth:`tau`), and the three forms of weight decay."""

    inputs = ("value",)

    def _check_common(self):
        _checks.nonnegative("lr", self.lr)
        _checks.finite_number("lower_bound", self.lower_bound)
        _checks.nonnegative("weight_decay", self.weight_decay)
        _checks.boolean("adapt_lower_bound", self.adapt_lower_bound)
        _checks.one_of("decay_form", self.decay_form, _DECAY_FORMS)
        _checks.schedule(self.schedule)

    def init_global(self):
        return MomoGlobal(0.0, 0.0, float(self.lower_bound))

    def decoupled_decay(self):
        return self.weight_decay > 0

    def squares_grads(self, s):
        return isinstance(s, MomoAdamState)

    def _context(self, t, glob, keep, keep2, bc1, bc2, eps):
        _check_glob(type(self).__name__, glob)
        lr_t, lam = lr_at(self, t), float(self.weight_decay)
        decay = 1.0 - lr_t * lam if self.decay_form == "adamw" else 1.0 / (1.0 + lr_t * lam)
        return MomoContext(lr_t, decay, 0.0, 0.0, keep, 1.0 - keep, keep2, 1.0 - keep2, bc1, bc2, eps), glob

    def tau(self, ctx, glob, value: float, norm: float, dx: float, gx: float) -> tuple[float, MomoGlobal]:
        """tau_t and the new rule-wide state from the loss f_t = ``value``, ``norm`` = <d_t, D_t^{-1} d_t>,
        ``dx`` = <d_t, x_{t-1}> and ``gx`` = <g_t, x_{t-1}> (float64), as :class:`Momo`'s docstring."""
        k, n, rho = ctx.keep, ctx.new, ctx.bc1
        f_avg = k * glob.f_avg + n * value
        gx_avg = k * glob.gx_avg + n * gx
        a = ctx.lr_t
        c = 1.0 + a * float(self.weight_decay)
        lb, lb0 = glob.lb, float(self.lower_bound)
        if self.adapt_lower_bound:
            cap = c * (f_avg - gx_avg) + dx
            if cap < c * rho * lb:
                lb = max(cap / (2.0 * rho * c), lb0)
        t1 = 0.0 if norm <= EPS_64 else max(c * (f_avg - rho * lb - gx_avg) + dx, 0.0) / norm
        tau = min(a / rho, t1)
        if self.adapt_lower_bound:
            lb = max((f_avg + dx - gx_avg - 0.5 * tau * norm) / rho, lb0)
        return tau, MomoGlobal(f_avg, gx_avg, lb)

    def _with_tau(self, ctx, tau: float):
        c = 1.0 + ctx.lr_t * float(self.weight_decay)
        step = tau / c if self.decay_form == "prox" else tau
        return ctx._replace(step=step, u_scale=tau / ctx.lr_t if ctx.lr_t > 0 else 0.0)


@dataclass(frozen=True)
class Momo(_MomoBase):
    r"""MoMo (Schaipp et al. 2023, Algorithm 1; weight decay as its proximal step, Algorithm 3): SGD with
    momentum whose step size tau_t is the largest one, up to lr_t, that the momentum model of the loss allows.
    At step t, with f_t the loss at x_{t-1} and beta_1 = 0 (the averages start at the first values), beta_t =
    beta after:

    .. math::

        \bar f_t &= \beta_t \bar f_{t-1} + (1 - \beta_t) f_t, \qquad
        d_t = \beta_t d_{t-1} + (1 - \beta_t) g_t, \qquad
        \gamma_t = \beta_t \gamma_{t-1} + (1 - \beta_t) \langle g_t, x_{t-1} \rangle \\
        \tau_t &= \min\left(\mathrm{lr}_t,\ \frac{\big[(1 + \mathrm{lr}_t \lambda)(\bar f_t - f^\star_t -
        \gamma_t) + \langle d_t, x_{t-1} \rangle\big]_+}{\|d_t\|^2}\right) \\
        x_t &= \frac{x_{t-1} - \tau_t d_t}{1 + \mathrm{lr}_t \lambda}

    (tau_t = 0 where ||d_t||^2 <= eps_64). f*_t = ``lower_bound``; with
    ``adapt_lower_bound`` (Algorithm 2's online estimate), with h = fbar_t + <d_t, x_{t-1}> - gamma_t and c =
    1 + lr_t lambda: before the step f*_t = max(cap / (2c), f*_0) when cap = c (fbar_t - gamma_t) + <d_t,
    x_{t-1}> < c f*_{t-1} (else f*_{t-1}), after it f*_{t+1} = max(h - tau_t ||d_t||^2 / 2, f*_0).

    ``decay_form``: 'prox' (x_t above; the authors' momo-opt), 'x' (x_t = x_{t-1} / (1 + lr_t lambda) -
    tau_t d_t, optax.contrib.momo: the step tau_t d_t is not shrunk), 'adamw' (x_t = (1 - lr_t lambda) x_{t-1}
    - tau_t d_t).

    Args:
      lr: >= 0, the largest step size (1.0).
      beta: in [0, 1), the averaging of f, g and <g, x> (0.9).
      lower_bound: f*_0, a lower bound of the loss, finite (0.0).
      weight_decay: lambda >= 0 (0.0).
      adapt_lower_bound: bool (False).
      decay_form: 'prox' | 'x' | 'adamw' ('prox').
      schedule: t -> gamma_t.

    Inputs: ``value``, the loss at x_{t-1}. State: per leaf ``d`` like x; rule-wide :class:`MomoGlobal`
    (float64, also for float32 params). Shapes/dtypes: any float32 / float64 arrays.

    Raises:
      ValueError: for a hyperparameter out of its range; at a step, for a global state that is not a
      :class:`MomoGlobal` of finite floats.
      TypeError: at a step, when ``value`` is missing.
    """

    lr: float = 1.0
    beta: float = 0.9
    lower_bound: float = 0.0
    weight_decay: float = 0.0
    adapt_lower_bound: bool = False
    decay_form: str = "prox"
    schedule: Callable[[int], float] | None = None

    State = MomoState

    def __post_init__(self):
        self._check_common()
        _checks.unit_interval("beta", self.beta)

    def kernel(self):
        return _MOMO

    def context(self, t, glob):
        return self._context(t, glob, 0.0 if t == 1 else float(self.beta), 0.0, 1.0, 1.0, 0.0)

    def reduce_inputs(self, ctx, glob, inputs, ss, xs, gs, paths):
        norm = dx = gx = 0.0
        for s, x, g in zip(ss, xs, gs):
            dt = x.dtype
            d = _f(dt, ctx.keep) * s.d + _f(dt, ctx.new) * g      # d_t as the kernel computes it
            norm, dx, gx = norm + dot(d, d), dx + dot(d, x), gx + dot(g, x)
        tau, glob = self.tau(ctx, glob, inputs["value"], norm, dx, gx)
        return self._with_tau(ctx, tau), glob


@dataclass(frozen=True)
class MomoAdam(_MomoBase):
    r"""MoMo-Adam (Schaipp et al. 2023, Algorithm 4; weight decay as its proximal step): Adam's moments with
    MoMo's step size in the geometry of D_t = diag(sqrt(v_t / (1 - beta2^t)) + eps). At step t, with f_t the
    loss at x_{t-1}, rho_t = 1 - beta1^t and c = 1 + lr_t lambda:

    .. math::

        \bar f_t &= \beta_1 \bar f_{t-1} + (1 - \beta_1) f_t, \qquad
        \gamma_t = \beta_1 \gamma_{t-1} + (1 - \beta_1) \langle g_t, x_{t-1} \rangle \\
        m_t &= \beta_1 m_{t-1} + (1 - \beta_1) g_t, \qquad v_t = \beta_2 v_{t-1} + (1 - \beta_2) g_t^2 \\
        \tau_t &= \min\left(\frac{\mathrm{lr}_t}{\rho_t},\ \frac{\big[c(\bar f_t - \rho_t f^\star_t -
        \gamma_t) + \langle m_t, x_{t-1} \rangle\big]_+}{\langle m_t, D_t^{-1} m_t \rangle}\right), \qquad
        x_t = \frac{x_{t-1} - \tau_t D_t^{-1} m_t}{c}

    from fbar_0 = gamma_0 = 0 (tau_t = 0 where <m_t, D_t^{-1} m_t> <= eps_64). ``adapt_lower_bound`` and
    ``decay_form`` as :class:`Momo`, with the bounds divided by rho_t: f*_t = max(cap / (2 rho_t c), f*_0) when
    cap < c rho_t f*_{t-1}, f*_{t+1} = max((h - tau_t <m_t, D_t^{-1} m_t> / 2) / rho_t, f*_0). 'prox' is the
    authors' momo-opt MomoAdam (divide=True), 'adamw' its divide=False, 'x' optax.contrib.momo_adam.

    Args:
      lr: >= 0 (1e-2).
      beta1: in [0, 1) (0.9).
      beta2: in [0, 1) (0.999).
      eps: > 0, added to sqrt(v_t / (1 - beta2^t)) (1e-8).
      lower_bound, weight_decay, adapt_lower_bound, decay_form, schedule: as :class:`Momo`.

    Inputs: ``value``. State: per leaf ``m``, ``v`` like x; rule-wide :class:`MomoGlobal`. Shapes/dtypes: any
    float32 / float64 arrays.

    Raises: as :class:`Momo`.
    """

    lr: float = 1e-2
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    lower_bound: float = 0.0
    weight_decay: float = 0.0
    adapt_lower_bound: bool = False
    decay_form: str = "prox"
    schedule: Callable[[int], float] | None = None

    State = MomoAdamState

    def __post_init__(self):
        self._check_common()
        _checks.unit_interval("beta1", self.beta1)
        _checks.unit_interval("beta2", self.beta2)
        _checks.positive("eps", self.eps)

    def kernel(self):
        return _MOMO_ADAM

    def context(self, t, glob):
        b1, b2 = float(self.beta1), float(self.beta2)
        return self._context(t, glob, b1, b2, 1.0 - b1 ** t, 1.0 - b2 ** t, float(self.eps))

    def reduce_inputs(self, ctx, glob, inputs, ss, xs, gs, paths):
        norm = dx = gx = 0.0
        for s, x, g in zip(ss, xs, gs):
            dt = x.dtype
            m = _f(dt, ctx.keep) * s.m + _f(dt, ctx.new) * g                 # m_t, v_t, D_t as the kernel
            v = _f(dt, ctx.keep2) * s.v + _f(dt, ctx.new2) * (g * g)
            u = m / (np.sqrt(v / _f(dt, ctx.bc2)) + _f(dt, ctx.eps))
            norm, dx, gx = norm + dot(m, u), dx + dot(m, x), gx + dot(g, x)
        tau, glob = self.tau(ctx, glob, inputs["value"], norm, dx, gx)
        return self._with_tau(ctx, tau), glob
