"""The layer-wise trust-ratio rules LARS (You et al. 2017), LAMB (You et al. 2020) and Fromage (Bernstein et
al. 2020) in optax's forms: a direction u per leaf, scaled by the leaf's ratio ||x|| / ||u|| (1 when either
norm is 0), then the lr.
refopt's :class:`~refopt.rules.covariant.Covariant` is the same ratio as a wrapper of any base direction
(post 000, eq. (elr-u)); it makes no step at a zero norm and normalises a momentum direction, where LARS
takes the momentum of the ratio-scaled steps (the divergence atlas, ``lars-momentum-order``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import numba
import numpy as np

from refopt.core import Rule
from refopt.kernels import Elementwise
from refopt.linalg.norms import fro_norm
from refopt.rules import _checks
from refopt.rules._adam_step import _moments
from refopt.rules.base import lr_at


def trust_ratio(x: np.ndarray, u: np.ndarray, trust_coefficient: float = 1.0, eps: float = 0.0,
                min_norm: float = 0.0) -> float:
    """optax's scale_by_trust_ratio factor ``trust_coefficient ||x||_F / (||u||_F + eps)``, each norm raised to
    ``min_norm`` where it is at most that, and 1 when a norm is then 0 (norms accumulated in float64,
    :func:`refopt.linalg.norms.fro_norm`)."""
    nx, nu = max(fro_norm(x), min_norm), max(fro_norm(u), min_norm)
    if nx == 0.0 or nu == 0.0:
        return 1.0
    return trust_coefficient * nx / (nu + eps)


# ---- LARS ------------------------------------------------------------------------------------------------
class LARSState(NamedTuple):
    """Per-array state: the momentum ``b`` (like x), the sum of the lr-scaled steps (the paper's v)."""

    b: np.ndarray


class LARSContext(NamedTuple):
    lr_t: float
    momentum: float
    weight_decay: float
    trust_coefficient: float
    eps: float


@dataclass(frozen=True)
class LARS(Rule):
    r"""LARS as optax.lars (You et al. 2017, "Large Batch Training of Convolutional Networks", Algorithm 1).
    Per leaf, at step t (t = 1 first), gamma_t = schedule(t):

    .. math::

        u_t &= g_t + \lambda\, x_{t-1} \\
        r_t &= \eta\, \frac{\lVert x_{t-1} \rVert_F}{\lVert u_t \rVert_F + \epsilon}
        \quad (1 \text{ when either norm is } 0) \\
        b_t &= \mu\, b_{t-1} + \mathrm{lr}\, \gamma_t\, r_t\, u_t, \qquad b_0 = 0 \\
        x_t &= x_{t-1} - b_t \qquad \text{(Nesterov: } x_{t-1} - (\mathrm{lr}\, \gamma_t\, r_t\, u_t + \mu\, b_t))

    The momentum accumulates the ratio-scaled steps, as the paper's v (optax's ``trace`` holds -b). The
    paper's ratio is eta ||x|| / (||g|| + lambda ||x||); optax's (this rule's) is eta ||x|| / (||g + lambda x||
    + eps), and optax's ratio is 1 at a zero norm, so a zero-initialised bias moves by -lr u.

    Args:
      lr: >= 0 (optax has no default; 1e-2 here).
      momentum: in [0, 1) (0.9); nesterov: optax's Nesterov form (False).
      weight_decay: >= 0 (0), added to g before the ratio (L2).
      trust_coefficient: > 0 (1e-3, optax's eta); eps: >= 0 (0), in the ratio's denominator.
      schedule: t -> gamma_t.

    Shapes/dtypes: any float32 / float64 array; ``b`` like x. The norms are accumulated in float64, the
    ratio cast to x's dtype. b holds lr-scaled steps, so LARS has no lr-free direction
    (:func:`refopt.direction` raises NotImplementedError).

    Raises:
      ValueError: for a hyperparameter out of its range or a non-callable schedule.
    """

    lr: float = 1e-2
    momentum: float = 0.9
    weight_decay: float = 0.0
    trust_coefficient: float = 1e-3
    eps: float = 0.0
    nesterov: bool = False
    schedule: Callable[[int], float] | None = None

    State = LARSState

    def __post_init__(self):
        _checks.nonnegative("lr", self.lr)
        _checks.unit_interval("momentum", self.momentum)
        _checks.nonnegative("weight_decay", self.weight_decay)
        _checks.positive("trust_coefficient", self.trust_coefficient)
        _checks.nonnegative("eps", self.eps)
        _checks.boolean("nesterov", self.nesterov)
        _checks.schedule(self.schedule)

    def init_leaf(self, x, path):
        return LARSState(np.zeros_like(x))

    def context(self, t, glob):
        return LARSContext(lr_at(self, t), float(self.momentum), float(self.weight_decay),
                           float(self.trust_coefficient), float(self.eps)), glob

    def _step(self, c, s, x, g):
        """The ratio-scaled step lr_t r_t u_t; b written into s (x is read only)."""
        d = x.dtype.type
        u = g + d(c.weight_decay) * x if c.weight_decay != 0 else g
        step = (u * d(trust_ratio(x, u, c.trust_coefficient, c.eps))) * d(c.lr_t)
        s.b[...] = d(c.momentum) * s.b + step
        return step + d(c.momentum) * s.b if self.nesterov else s.b

    def update_leaf(self, ctx, s, x, g, path):
        x -= self._step(ctx, s, x, g)
        return x, s



# ---- LAMB ------------------------------------------------------------------------------------------------
class LAMBState(NamedTuple):
    """Per-array state, each like x: Adam's first moment ``m`` and second moment ``v``."""

    m: np.ndarray
    v: np.ndarray


class LAMBContext(NamedTuple):
    lr_t: float
    u_scale: float    # 1
    l2: float         # 0 (the decay enters after Adam's direction)
    beta1: float
    omb1: float
    beta2: float
    omb2: float
    eps: float
    eps_root: float
    bc1: float        # 1 - beta1^t
    bc2: float        # 1 - beta2^t
    weight_decay: float


@numba.njit
def _lamb(x, g, s, i, c):
    g, m, v = _moments(x, g, s, i, c)
    u = (m / c.bc1) / (np.sqrt(v / c.bc2 + c.eps_root) + c.eps)
    if c.weight_decay != 0:
        u = u + c.weight_decay * x
    return u


_LAMB = Elementwise(_lamb, "lamb")


@dataclass(frozen=True)
class LAMB(Rule):
    r"""LAMB as optax.lamb (You et al. 2020, "Large Batch Optimization for Deep Learning: Training BERT in 76
    minutes", Algorithm 2 with phi the identity). Per leaf, at step t (t = 1 first), gamma_t = schedule(t):

    .. math::

        m_t &= \beta_1 m_{t-1} + (1 - \beta_1) g_t, \qquad v_t = \beta_2 v_{t-1} + (1 - \beta_2) g_t^2 \\
        u_t &= \frac{m_t / (1 - \beta_1^t)}{\sqrt{v_t / (1 - \beta_2^t) + \epsilon_{root}} + \epsilon}
        + \lambda\, x_{t-1} \\
        x_t &= x_{t-1} - \mathrm{lr}\, \gamma_t\, \frac{\lVert x_{t-1} \rVert_F}{\lVert u_t \rVert_F}\, u_t
        \quad (\text{ratio } 1 \text{ when either norm is } 0)

    With weight_decay = 0 it is refopt's ``Covariant(Adam(eps=...))`` (post 000, eq. (elr-u)) except at a
    zero norm, where Covariant makes no step (the atlas entry ``trust-ratio-zero-norm``).

    Args:
      lr: >= 0 (optax has no default; 1e-3 here).
      beta1, beta2: in [0, 1) (0.9, 0.999).
      eps: >= 0 (1e-6, optax.lamb's); eps_root: >= 0 (0), inside the square root.
      weight_decay: >= 0 (0), added to Adam's direction before the ratio.
      schedule: t -> gamma_t.

    Shapes/dtypes: any float32 / float64 array; ``m``, ``v`` like x. The norms are accumulated in float64.

    Raises:
      ValueError: for a hyperparameter out of its range, eps = eps_root = 0 (0/0 on a zero second moment)
        or a non-callable schedule.
    """

    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-6
    eps_root: float = 0.0
    weight_decay: float = 0.0
    schedule: Callable[[int], float] | None = None

    State = LAMBState

    def __post_init__(self):
        _checks.nonnegative("lr", self.lr)
        _checks.unit_interval("beta1", self.beta1)
        _checks.unit_interval("beta2", self.beta2)
        _checks.nonnegative("eps", self.eps)
        _checks.nonnegative("eps_root", self.eps_root)
        if self.eps == 0 and self.eps_root == 0:
            raise ValueError("LAMB needs eps > 0 or eps_root > 0 (else a zero second moment gives 0/0)")
        _checks.nonnegative("weight_decay", self.weight_decay)
        _checks.schedule(self.schedule)

    def init_leaf(self, x, path):
        return LAMBState(np.zeros_like(x), np.zeros_like(x))

    def squares_grads(self, s):
        return True

    def context(self, t, glob):
        b1, b2 = float(self.beta1), float(self.beta2)
        return LAMBContext(lr_at(self, t), 1.0, 0.0, b1, 1.0 - b1, b2, 1.0 - b2, float(self.eps),
                           float(self.eps_root), 1.0 - b1 ** t, 1.0 - b2 ** t, float(self.weight_decay)), glob

    def _direction(self, c, s, x, g):
        u = np.empty_like(x)
        _LAMB.direction(u, x, g, s, c)
        return u

    def update_leaf(self, ctx, s, x, g, path):
        u = self._direction(ctx, s, x, g)
        x -= (u * x.dtype.type(trust_ratio(x, u))) * x.dtype.type(ctx.lr_t)
        return x, s

    def direction_leaf(self, ctx, s, x, g, path):
        u = self._direction(ctx, s, x, g)
        u *= x.dtype.type(trust_ratio(x, u))
        return u, s


# ---- Fromage ---------------------------------------------------------------------------------------------
class FromageState(NamedTuple):
    """Fromage keeps no state."""


class FromageContext(NamedTuple):
    lr_t: float
    mult: float       # 1 / sqrt(1 + lr_t^2)
    min_norm: float


@dataclass(frozen=True)
class Fromage(Rule):
    r"""Fromage as optax.fromage (Bernstein, Vahdat, Yue & Liu 2020, "On the distance between two neural
    networks and the stability of learning", Algorithm 1). Per leaf, at step t, gamma_t = schedule(t),
    lr_t = lr gamma_t:

    .. math::

        x_t = rac{1}{\sqrt{1 + \mathrm{lr}_t^2}} \left( x_{t-1} - \mathrm{lr}_t\,
        rac{\max(\lVert x_{t-1} 
Vert_F, n_0)}{\max(\lVert g_t 
Vert_F, n_0)}\, g_t 
ight)

    with n_0 = min_norm (a ratio 1 when a norm is 0 and min_norm = 0, optax's scale_by_trust_ratio). The step
    has relative size lr_t (the paper's "relative trust region"), and the factor 1/sqrt(1 + lr_t^2) keeps
    ||x|| from growing: for g orthogonal to x, ||x_t|| = ||x_{t-1}|| exactly. optax writes the factor as the
    decay (mult - 1) x added to the update; refopt in the same order, x + ((-lr_t mult) r g + (mult - 1) x).

    Args:
      lr: >= 0 (optax has no default; 1e-2 here).
      min_norm: >= 0 (1e-6), the floor of both norms.
      schedule: t -> gamma_t.

    Shapes/dtypes: any float32 / float64 array; no state. Norms accumulated in float64.

    Raises:
      ValueError: for a hyperparameter out of its range or a non-callable schedule.
    """

    lr: float = 1e-2
    min_norm: float = 1e-6
    schedule: Callable[[int], float] | None = None

    State = FromageState

    def __post_init__(self):
        _checks.nonnegative("lr", self.lr)
        _checks.nonnegative("min_norm", self.min_norm)
        _checks.schedule(self.schedule)

    def init_leaf(self, x, path):
        return FromageState()

    def context(self, t, glob):
        lr_t = lr_at(self, t)
        return FromageContext(lr_t, 1.0 / (1.0 + lr_t ** 2) ** 0.5, float(self.min_norm)), glob

    def update_leaf(self, ctx, s, x, g, path):
        d = x.dtype.type
        r = trust_ratio(x, g, min_norm=ctx.min_norm)
        x += (g * d(r)) * d(-ctx.lr_t * ctx.mult) + d(ctx.mult - 1.0) * x
        return x, s
