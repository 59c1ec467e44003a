"""Weight averaging beside training (post 004, eq. (2)): uniform (Polyak) average and EMA.

Both are one recursion with different weights c_t; the average lives in the state and the training
trajectory is the base rule's, bit for bit.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import numba
import numpy as np

from refopt.core import ArraySpec
from refopt.kernels import Elementwise
from refopt.rules import _checks
from refopt.rules.base import Wrapper, rewrap


class AverageState(NamedTuple):
    """Per-array averaging state: the running average ``mu`` (shape and dtype of x) and the base rule's
    own per-array state."""

    mu: np.ndarray
    base: Any


class AverageContext(NamedTuple):
    """One step's averaging weights (float64): mu_t = (p * mu_{t-1} + q * x_t) / r, i.e. eq. (2) with
    c_t = q/r and 1 - c_t = p/r; and the base rule's context."""

    p: float
    q: float
    r: float
    base: Any


class _Weights(NamedTuple):
    p: float
    q: float
    r: float


@numba.njit
def _average(mu, x, s, i, c):
    """mu <- (p*mu + q*x) / r (eq. (2) of post 004 with c_t = q/r)."""
    return (c.p * mu + c.q * x) / c.r


_AVERAGE = Elementwise(_average, "average")


@dataclass(frozen=True)
class _Averaging(Wrapper):
    """The recursion shared by :class:`Average` and :class:`EMA`; subclasses give c_t."""

    def _weights(self, t: int) -> tuple[float, float, float]:  # pragma: no cover - abstract
        """(p, q, r) with c_t = q/r, 1 - c_t = p/r."""
        raise NotImplementedError

    def init_leaf(self, x, path):
        sb = self.base.init_leaf(x, path)
        return AverageState(np.array(self.base.eval_leaf(sb, x, path), order="C", copy=True), sb)

    def leaf_spec(self, x, path):
        return AverageState(ArraySpec.like(x), self.base.leaf_spec(x, path))

    def wrap_context(self, t, base_ctx):
        return AverageContext(*self._weights(t), base_ctx)

    def update_leaf(self, ctx, s, x, g, path):
        x, sb = self.base.update_leaf(ctx.base, s.base, x, g, path)
        xe = self.base.eval_leaf(sb, x, path)
        _AVERAGE.replace(s.mu, xe, (), _Weights(ctx.p, ctx.q, ctx.r))
        return x, rewrap(s, sb)

    def eval_leaf(self, s, x, path):
        return s.mu.copy()


@dataclass(frozen=True)
class Average(_Averaging):
    r"""Uniform (Polyak-Ruppert) average of the iterates beside a base rule (post 004, eq. (2) with
    c_t = 1/t).

    The base rule runs unchanged (its params, state and numbers are bit-identical to running it alone);
    after its step t (t = 1 first) the state's average becomes

    .. math::

        \mu_t = \Bigl(1 - \frac{1}{t}\Bigr) \mu_{t-1} + \frac{1}{t}\, x_t = \frac{x_1 + \dots + x_t}{t}

    (evaluated as ``((t-1) * mu_{t-1} + x_t) / t`` in x's dtype, so equal iterates give their value back
    only to rounding: a few units of roundoff per step, accumulating),
    the mean of the iterates after each update; the initial x_0 is not included (PITFALLS B16: 1/t, not
    1/(t+1); mu_0 = x_0 is only what :func:`refopt.eval_params` returns before any step).
    :func:`refopt.eval_params` returns the average (fresh copies); the params stay the training iterate.

    Composition: ``x_t`` above is the base's evaluation weights ``base.eval_leaf`` (x_t itself for every
    plain rule), so averaging a rule that has its own evaluation weights (Schedule-Free, another average)
    averages those. Average has no additive direction, so it cannot be the base of Hyperball/Covariant;
    put those inside instead (``Average(Hyperball(...))``).

    Args:
      base: any refopt rule.

    Shapes/dtypes: mu has x's shape and dtype; the weights are computed in float64 and cast.

    Raises:
      ValueError: if base is not a refopt rule.
    """

    base: Rule

    def __post_init__(self):
        self._check_base()

    def _weights(self, t):
        return float(t - 1), 1.0, float(t)     # ((t-1) mu + x) / t


@dataclass(frozen=True)
class EMA(_Averaging):
    r"""Exponential moving average of the iterates beside a base rule (post 004, eq. (2) with c_t
    -> 1 - decay), the "good in practice" average.

    The base rule runs unchanged (bit-identical trajectory). After its step t (t = 1 first), with
    beta = ``decay``:

    * ``debias=True`` (default; zero-init EMA divided by 1 - beta**t, as ``optax.ema(debias=True)``):

      .. math::

          e_t = \beta\, e_{t-1} + (1 - \beta)\, x_t, \quad e_0 = 0; \qquad \mu_t = \frac{e_t}{1 - \beta^t}

      computed as eq. (2) with :math:`c_t = (1 - \beta) / (1 - \beta^t)`:
      :math:`\mu_t = (1 - c_t)\, \mu_{t-1} + c_t\, x_t`
      (c_1 = 1, so mu_1 = x_1 exactly; the exponent is the number of updates t including this one,
      PITFALLS B16: x = [10, 10, 4], beta = 0.9 -> 10, 10, 7.7859778597785985).
    * ``debias=False`` (param-init EMA, timm's ModelEmaV2: the average starts as a copy of the params):

      .. math::

          \mu_t = \beta\, \mu_{t-1} + (1 - \beta)\, x_t, \quad \mu_0 = x_0

      (c_t = 1 - beta for every t; B16 with x_0 = 10: 10, 10, 9.4).
    * ``start="after_first_step"`` (with debias=False; torch.optim.swa_utils.AveragedModel with
      ``get_ema_multi_avg_fn(decay)``: the first average is a copy of the weights after step 1):

      .. math::

          \mu_1 = x_1; \qquad \mu_t = \beta\, \mu_{t-1} + (1 - \beta)\, x_t \ \text{ for } t \ge 2

      (c_1 = 1, then 1 - beta).

    Both are weighted means of the iterates: debiased, weight proportional to beta**(t-k) on x_1..x_t
    (x_0 excluded; the weights sum to 1 exactly in exact arithmetic); param-init, weight beta**t on x_0.
    :func:`refopt.eval_params` returns mu (fresh copies). As :class:`Average`, x_t is the base's
    evaluation weights, and EMA has no additive direction.

    Args:
      base: any refopt rule.
      decay: beta in [0, 1) (a window of about 1/(1 - beta) steps; beta = 0 gives mu_t = x_t).
      debias: see above.
      start: None (default: what ``debias`` says), "x0" (the param-init EMA; needs debias=False) or
        "after_first_step" (torch's AveragedModel EMA; needs debias=False).

    Shapes/dtypes: mu has x's shape and dtype; the weights are computed in float64 and cast.

    Raises:
      ValueError: if base is not a refopt rule, decay is outside [0, 1), debias is not a bool, or start
        is unknown or given with debias=True.
    """

    base: Rule
    decay: float = 0.999
    debias: bool = True
    start: str | None = None

    def __post_init__(self):
        self._check_base()
        _checks.unit_interval("decay", self.decay)
        _checks.boolean("debias", self.debias)
        _checks.one_of("start", self.start, {None, "x0", "after_first_step"})
        if self.start is not None and self.debias:
            raise ValueError(f"EMA: start={self.start!r} needs debias=False (debias=True starts from zero)")

    def _weights(self, t):
        b = float(self.decay)
        if self.start == "after_first_step":
            return (0.0, 1.0, 1.0) if t == 1 else (b, 1.0 - b, 1.0)
        if not self.debias:
            return b, 1.0 - b, 1.0
        bt = b ** t
        return (b - bt) / (1.0 - bt), (1.0 - b) / (1.0 - bt), 1.0     # c_1 = 1 exactly
