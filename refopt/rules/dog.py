"""DoG (Ivgi, Hinder & Carmon 2023) and DoWG (Khaled, Mishchenko & Jin 2023): SGD whose step size is
estimated from the distance travelled from the initial point and the gradients seen so far, with no learning
rate to tune, in optax.contrib.dog's and optax.contrib.dowg's forms. The estimates are rule-wide: one distance
and one gradient sum over the whole tree (:meth:`refopt.core.Rule.reduce_tree`), kept in ``OptState.glob``."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, NamedTuple

import numba
import numpy as np

from refopt.kernels import Elementwise
from refopt.rules import _checks
from refopt.rules.base import ElementwiseRule, lr_at


def sum_sq(a: np.ndarray) -> float:
    """sum(a^2) in float64 (a float32 array is widened first)."""
    a = np.ravel(a).astype(np.float64, copy=False)
    return float(np.dot(a, a))


class InitialPoint(NamedTuple):
    """Per-array state of DoG and DoWG: ``x0``, the parameters at init (like x)."""

    x0: np.ndarray


class DoGGlobal(NamedTuple):
    """DoG's rule-wide state (Python floats): ``max_dist`` r_t = max(r_eps, max_s ||x_s - x_0||) and ``sum_sq``
    G_t = sum_s ||g_s||^2, both over the whole tree (0 before the first step)."""

    max_dist: float
    sum_sq: float


class DoWGGlobal(NamedTuple):
    """DoWG's rule-wide state (Python floats): ``sq_dist`` rbar_t^2 = max(rbar_0^2, max_s ||x_s - x_0||^2) and
    ``weighted_sum`` v_t = sum_s rbar_s^2 ||g_s||^2, over the whole tree."""

    sq_dist: float
    weighted_sum: float


class DistanceContext(NamedTuple):
    lr_t: float
    decay: float      # 1
    step: float       # lr_t eta_t (0 until reduce_tree sets eta_t)
    u_scale: float    # eta_t
    first: bool       # t = 1
    weight_decay: float


@numba.njit
def _l2_grad(x, g, s, i, c):
    return g + c.weight_decay * x


_L2_GRAD = Elementwise(_l2_grad, "l2_grad")


def _check_glob(name: str, glob, kind) -> None:
    if not isinstance(glob, kind) or not all(isinstance(v, float) and math.isfinite(v) and v >= 0 for v in glob):
        raise ValueError(f"{name}: the global state must be a {kind.__name__} of finite floats >= 0 made by "
                         f"refopt.init, got {glob!r}")


@dataclass(frozen=True)
class _DistanceRule(ElementwiseRule):
    """What DoG and DoWG share: x0 per leaf, x <- x - lr_t eta_t (g + weight_decay x), eta_t from
    whole-tree sums computed by :meth:`reduce_tree`."""

    State = InitialPoint

    def init_leaf(self, x, path):
        return InitialPoint(np.array(x, order="C", copy=True))

    def squares_grads(self, s):
        return True

    def kernel(self):
        return _L2_GRAD

    def context(self, t, glob):
        _check_glob(type(self).__name__, glob, type(self.init_global()))
        return DistanceContext(lr_at(self, t), 1.0, 0.0, 0.0, t == 1, float(self.weight_decay)), glob

    def _sums(self, ss, xs, gs):
        """(||x - x0||^2, ||g + weight_decay x||^2, ||x0||^2) over the tree, in float64."""
        wd = float(self.weight_decay)
        d2 = sum(sum_sq(np.asarray(s.x0, np.float64) - np.asarray(x, np.float64)) for s, x in zip(ss, xs))
        g2 = sum(sum_sq(np.asarray(g, np.float64) + wd * np.asarray(x, np.float64)) if wd else sum_sq(g)
                 for x, g in zip(xs, gs))
        return d2, g2, sum(sum_sq(s.x0) for s in ss)

    def _with_eta(self, ctx, eta: float):
        return ctx._replace(step=ctx.lr_t * eta, u_scale=eta)


_INIT_STEPS = ("heuristic", "distance", "learning_rate")


@dataclass(frozen=True)
class DoG(_DistanceRule):
    r"""DoG, Distance over Gradients (Ivgi et al. 2023, Algorithm 1), as optax.contrib.dog. At step t
    (t = 1 first), with a_t = g_t + lambda x_{t-1} and norms over the whole tree:

    .. math::

        r_t &= \max(r_{t-1}, \|x_{t-1} - x_0\|), \qquad r_0 = r_\epsilon \\
        G_t &= G_{t-1} + \|a_t\|^2 \\
        \eta_t &= \frac{r_t}{\sqrt{G_t + \epsilon}}, \qquad x_t = x_{t-1} - \mathrm{lr}\, \gamma_t\, \eta_t\, a_t

    r_eps by ``init_step``: 'heuristic' r_eps = init_value (1 + ||x_0||) (the paper's 1e-6 (1 + ||x_0||)),
    'distance' r_eps = init_value, 'learning_rate' eta_1 = init_value (and r_eps = 0). The paper's
    eta_t = r_t / sqrt(G_t) has no eps; optax adds it inside the root. lr multiplies eta_t (1: the paper's DoG).

    Args:
      lr: >= 0, a multiplier of the estimated step (1.0).
      init_step: 'heuristic' | 'distance' | 'learning_rate' ('heuristic').
      init_value: > 0 (1e-6).
      eps: > 0, inside the square root (1e-8).
      weight_decay: lambda >= 0, L2: added to g before the sums (0; optax's None).
      schedule: t -> gamma_t.

    State: per leaf ``x0`` like x; rule-wide :class:`DoGGlobal` in ``OptState.glob`` (float64 sums, also for
    float32 params). Shapes/dtypes: any float32 / float64 arrays.

    Raises:
      ValueError: for a hyperparameter out of its range; at a step, for a global state that is not a
      :class:`DoGGlobal` of finite floats >= 0.
    """

    lr: float = 1.0
    init_step: str = "heuristic"
    init_value: float = 1e-6
    eps: float = 1e-8
    weight_decay: float = 0.0
    schedule: Callable[[int], float] | None = None

    def __post_init__(self):
        _checks.nonnegative("lr", self.lr)
        _checks.one_of("init_step", self.init_step, _INIT_STEPS)
        _checks.positive("init_value", self.init_value)
        _checks.positive("eps", self.eps)
        _checks.nonnegative("weight_decay", self.weight_decay)
        _checks.schedule(self.schedule)

    def init_global(self):
        return DoGGlobal(0.0, 0.0)

    def reduce_tree(self, ctx, glob, ss, xs, gs, paths):
        d2, g2, x02 = self._sums(ss, xs, gs)
        v = float(self.init_value)
        if ctx.first:
            r_prev = {"heuristic": v * (1.0 + math.sqrt(x02)), "distance": v, "learning_rate": 0.0}[self.init_step]
        else:
            r_prev = glob.max_dist
        r = max(r_prev, math.sqrt(d2))
        G = glob.sum_sq + g2
        eta = v if (ctx.first and self.init_step == "learning_rate") else r / math.sqrt(G + float(self.eps))
        return self._with_eta(ctx, eta), DoGGlobal(r, G)


@dataclass(frozen=True)
class DoWG(_DistanceRule):
    r"""DoWG, Distance over Weighted Gradients (Khaled et al. 2023, Algorithm 1), as optax.contrib.dowg. At
    step t (t = 1 first), with a_t = g_t + lambda x_{t-1} and norms over the whole tree:

    .. math::

        \bar r_t^2 &= \max(\bar r_{t-1}^2, \|x_{t-1} - x_0\|^2) \\
        v_t &= v_{t-1} + \bar r_t^2 \|a_t\|^2 \\
        \eta_t &= \frac{\bar r_t^2}{\sqrt{v_t} + \epsilon}, \qquad x_t = x_{t-1} - \mathrm{lr}\, \gamma_t\,
        \eta_t\, a_t

    from rbar_0^2 = init_sq_dist (eps when None, optax's default) and v_0 = 0. The paper's eta_t = rbar_t^2 /
    sqrt(v_t) has no eps; optax adds it after the root.

    Args:
      lr: >= 0, a multiplier of the estimated step (1.0).
      init_sq_dist: None or > 0, rbar_0^2 (None: eps).
      eps: > 0, after the square root (1e-4).
      weight_decay: lambda >= 0, L2 (0).
      schedule: t -> gamma_t.

    State: per leaf ``x0`` like x; rule-wide :class:`DoWGGlobal`. Shapes/dtypes: any float32 / float64 arrays.

    Raises:
      ValueError: for a hyperparameter out of its range; at a step, for a global state that is not a
      :class:`DoWGGlobal` of finite floats >= 0.
    """

    lr: float = 1.0
    init_sq_dist: float | None = None
    eps: float = 1e-4
    weight_decay: float = 0.0
    schedule: Callable[[int], float] | None = None

    def __post_init__(self):
        _checks.nonnegative("lr", self.lr)
        if self.init_sq_dist is not None:
            _checks.positive("init_sq_dist", self.init_sq_dist)
        _checks.positive("eps", self.eps)
        _checks.nonnegative("weight_decay", self.weight_decay)
        _checks.schedule(self.schedule)

    def init_global(self):
        r2 = self.eps if self.init_sq_dist is None else self.init_sq_dist
        return DoWGGlobal(float(r2), 0.0)

    def reduce_tree(self, ctx, glob, ss, xs, gs, paths):
        d2, g2, _ = self._sums(ss, xs, gs)
        r2 = max(glob.sq_dist, d2)
        v = glob.weighted_sum + r2 * g2
        return self._with_eta(ctx, r2 / (math.sqrt(v) + float(self.eps))), DoWGGlobal(r2, v)
