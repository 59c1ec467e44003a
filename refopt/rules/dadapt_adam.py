"""D-Adaptation Adam (Defazio & Mishchenko 2023, "Learning-Rate-Free Learning by D-Adaptation", the Adam
version): Adam whose step size d is a lower bound on the distance to the solution, estimated from the whole
tree's weighted gradient sum s and the inner products of the gradients with it, in the forms of
dadaptation.DAdaptAdam and optax.contrib.dadapt_adamw. The estimate is rule-wide (one d over the tree,
:meth:`refopt.core.Rule.reduce_tree`), kept in ``OptState.glob``."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, NamedTuple

import numba
import numpy as np

from refopt.kernels import Elementwise
from refopt.rules import _checks
from refopt.rules.base import ElementwiseRule, lr_at


class DAdaptAdamState(NamedTuple):
    """Per-array state, each like x (0 at init): the first moment ``m`` of dlr g, the second moment ``v`` of
    g and the weighted gradient sum ``s``."""

    m: np.ndarray
    v: np.ndarray
    s: np.ndarray


class DAdaptAdamGlobal(NamedTuple):
    """D-Adaptation's rule-wide state (Python floats): the estimate ``d`` (d_0 at init) and the weighted
    numerator ``numerator`` r_t (0 at init)."""

    d: float
    numerator: float


class DAdaptAdamContext(NamedTuple):
    lr_t: float
    decay: float      # 1 - weight_decay dlr (decoupled), else 1
    step: float       # 1: m already carries dlr
    u_scale: float    # 1 / lr_t (the direction u = a / lr_t)
    beta1: float
    beta2: float
    sqrt_beta2: float
    dlr: float        # d_t lr_t bc_t
    m_scale: float    # (1 - beta1) dlr
    s_scale: float    # (1 - sqrt(beta2)) dlr
    eps: float
    coupled: bool     # L2: g + weight_decay x enters every sum
    wd: float
    frozen: bool      # lr_t = 0: nothing moves (dadaptation's group with lr 0)


@numba.njit
def _dadapt_adam(x, g, s, i, c):
    if c.frozen:
        return 0.0
    if c.coupled:
        g = g + c.wd * x
    m = c.beta1 * s.m[i] + c.m_scale * g
    v = c.beta2 * s.v[i] + (1.0 - c.beta2) * g * g
    s.m[i] = m
    s.v[i] = v
    s.s[i] = c.sqrt_beta2 * s.s[i] + c.s_scale * g
    return m / (np.sqrt(v) + c.eps)


_DADAPT_ADAM = Elementwise(_dadapt_adam, "dadapt_adam")


def _check_glob(glob) -> None:
    ok = isinstance(glob, DAdaptAdamGlobal) and all(isinstance(v, float) and math.isfinite(v) for v in glob) \
        and glob.d > 0
    if not ok:
        raise ValueError("DAdaptAdam: the global state must be a DAdaptAdamGlobal of finite floats (d > 0) made by "
                         f"refopt.init, got {glob!r}")


def _f64(a) -> np.ndarray:
    return np.asarray(a, np.float64)


@dataclass(frozen=True)
class DAdaptAdam(ElementwiseRule):
    r"""D-Adaptation Adam (Defazio & Mishchenko 2023, the Adam version), as dadaptation.DAdaptAdam and
    optax.contrib.dadapt_adamw. At step t (t = 1 first), lr_t = lr gamma_t, a_t = g_t (+ lambda x_{t-1} when
    ``decoupled`` is False), bc_t = sqrt(1 - beta2^t) / (1 - beta1^t) with ``bias_correction`` (else 1),
    dlr_t = d_t lr_t bc_t, the inner product and the l1 norm over the whole tree:

    .. math::

        r_t &= \sqrt{\beta_2}\, r_{t-1} + (1 - \sqrt{\beta_2})\, \mathrm{dlr}_t
               \Big\langle a_t, \frac{s_{t-1}}{\sqrt{v_{t-1}} + \epsilon} \Big\rangle \\
        m_t &= \beta_1 m_{t-1} + (1 - \beta_1)\, \mathrm{dlr}_t\, a_t, \qquad
        v_t = \beta_2 v_{t-1} + (1 - \beta_2)\, a_t^2, \qquad
        s_t = \sqrt{\beta_2}\, s_{t-1} + (1 - \sqrt{\beta_2})\, \mathrm{dlr}_t\, a_t \\
        \hat d_t &= \frac{r_t}{(1 - \sqrt{\beta_2}) \|s_t\|_1}, \qquad
        d_{t+1} = \max\big(d_t, \min(\hat d_t, \rho\, d_t)\big) \\
        x_t &= x_{t-1} - \frac{m_t}{\sqrt{v_t} + \epsilon} - \mathrm{dlr}_t\, \lambda\, x_{t-1}

    (rho = growth_rate; rho = inf gives d_{t+1} = max(d_t, hat d_t), the paper's and optax's); the decay term
    only when ``decoupled``. The inner product reads s and v before this step's update. m carries dlr, so the
    step is m / (sqrt(v) + eps) with eps not scaled by d. When ||s_t||_1 = 0 (every gradient so far zero) d
    and r are kept (dadaptation then skips the rest of the step, optax's estimate is 0/0); when lr_t = 0
    nothing moves (dadaptation's group with lr 0). A schedule: optax evaluates a callable learning_rate at its
    count k = t - 1; refopt's schedule at t.

    Args:
      lr: >= 0, a multiplier of the estimated step (1.0).
      beta1: [0, 1) (0.9); beta2: [0, 1) (0.999).
      eps: > 0 (1e-8), added to sqrt(v) (in the inner product too).
      d0: > 0, the initial estimate d_0 (1e-6).
      growth_rate: rho >= 1 (inf), the bound d_{t+1} <= rho d_t.
      weight_decay: lambda >= 0 (0); decoupled: False (L2 in a_t, dadaptation's default) or True (AdamW's
        dlr lambda x, optax's only form).
      bias_correction: bool (False, dadaptation's default; optax always corrects).
      schedule: t -> gamma_t.

    State: per leaf :class:`DAdaptAdamState`; rule-wide :class:`DAdaptAdamGlobal` in ``OptState.glob``
    (float64 sums, also for float32 params). Shapes/dtypes: any float32 / float64 arrays.

    Raises:
      ValueError: for a hyperparameter out of its range; at a step, for a global state that is not a
      :class:`DAdaptAdamGlobal` made by :func:`refopt.init`.
    """

    lr: float = 1.0
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    d0: float = 1e-6
    growth_rate: float = math.inf
    weight_decay: float = 0.0
    decoupled: bool = False
    bias_correction: bool = False
    schedule: Callable[[int], float] | None = None

    State = DAdaptAdamState

    def __post_init__(self):
        _checks.nonnegative("lr", self.lr)
        _checks.unit_interval("beta1", self.beta1)
        _checks.unit_interval("beta2", self.beta2)
        _checks.positive("eps", self.eps)
        _checks.positive("d0", self.d0)
        _checks.growth_rate(self.growth_rate)
        _checks.nonnegative("weight_decay", self.weight_decay)
        _checks.boolean("decoupled", self.decoupled)
        _checks.boolean("bias_correction", self.bias_correction)
        _checks.schedule(self.schedule)

    def init_leaf(self, x, path):
        z = np.zeros_like(x)
        return DAdaptAdamState(z, z.copy(), z.copy())

    def init_global(self):
        return DAdaptAdamGlobal(float(self.d0), 0.0)

    def squares_grads(self, s):
        return True

    def decoupled_decay(self):
        return self.decoupled and self.weight_decay > 0

    def context(self, t, glob):
        _check_glob(glob)
        lr_t, wd = lr_at(self, t), float(self.weight_decay)
        b1, b2 = float(self.beta1), float(self.beta2)
        sb2 = b2 ** 0.5
        bc = ((1.0 - b2 ** t) ** 0.5) / (1.0 - b1 ** t) if self.bias_correction else 1.0
        dlr = glob.d * lr_t * bc
        decay = 1.0 - wd * dlr if self.decoupled else 1.0
        return DAdaptAdamContext(lr_t, decay, 1.0, 1.0 / lr_t if lr_t else 0.0, b1, b2, sb2, dlr, (1.0 - b1) * dlr,
                                 (1.0 - sb2) * dlr, float(self.eps), not self.decoupled and wd != 0, wd,
                                 lr_t == 0), glob

    def reduce_tree(self, ctx, glob, ss, xs, gs, paths):
        if ctx.frozen:
            return ctx, glob
        wd = ctx.wd if ctx.coupled else 0.0
        inner, l1 = 0.0, 0.0
        for s, x, g in zip(ss, xs, gs):
            a = _f64(g) + wd * _f64(x) if wd else _f64(g)
            inner += float(np.dot(np.ravel(a), np.ravel(_f64(s.s) / (np.sqrt(_f64(s.v)) + ctx.eps))))
            l1 += float(np.sum(np.abs(ctx.sqrt_beta2 * _f64(s.s) + ctx.s_scale * a)))
        if not l1 > 0:
            return ctx, glob
        sb2 = ctx.sqrt_beta2
        r = sb2 * glob.numerator + (1.0 - sb2) * ctx.dlr * inner
        d_hat = r / ((1.0 - sb2) * l1)
        d = max(glob.d, min(d_hat, glob.d * self.growth_rate))
        return ctx, DAdaptAdamGlobal(float(d), float(r))

    def kernel(self):
        return _DADAPT_ADAM
