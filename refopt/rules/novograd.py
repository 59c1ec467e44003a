"""NovoGrad (Ginsburg et al. 2019): a second moment per layer (per leaf), the squared norm of its gradient, and
a momentum of the normalised gradient plus the decay, in optax.novograd's form."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np

from refopt.core import ArraySpec, Rule
from refopt.linalg.norms import fro_norm
from refopt.rules import _checks
from refopt.rules.base import lr_at


class NovoGradState(NamedTuple):
    """Per-array state: the momentum ``m`` (like x) and the leaf's second moment ``v`` (a 0-d array of x's
    dtype: an EMA of ||g||_F^2)."""

    m: np.ndarray
    v: np.ndarray


class NovoGradContext(NamedTuple):
    lr_t: float
    beta1: float
    beta2: float
    omb2: float
    eps: float
    eps_root: float
    weight_decay: float
    first: bool       # t = 1: v_1 = ||g||^2, m_1 = the normalised gradient


@dataclass(frozen=True)
class NovoGrad(Rule):
    r"""NovoGrad as optax.novograd (Ginsburg et al. 2019, Algorithm 1). Per leaf (layer) l, at step t (t = 1
    first), gamma_t = schedule(t):

    .. math::

        v_t &= \beta_2 v_{t-1} + (1 - \beta_2)\, \|g_t\|_F^2, \qquad v_1 = \|g_1\|_F^2 \\
        m_t &= \beta_1 m_{t-1} + \frac{g_t}{\sqrt{v_t + \epsilon_{root}} + \epsilon} + \lambda\, x_{t-1},
        \qquad m_0 = 0 \\
        x_t &= x_{t-1} - \mathrm{lr}\, \gamma_t\, m_t

    v is one number per leaf, so the step of a leaf is invariant to the scale of its own gradient and the
    leaves are normalised separately; the momentum has no (1 - beta1) factor and no bias correction.

    Args:
      lr: >= 0 (optax has no default; 1e-2 here).
      beta1: in [0, 1) (0.9); beta2: in [0, 1) (0.25).
      eps: > 0 (optax.novograd's 1e-6); eps_root: >= 0 (0).
      weight_decay: >= 0, added to the normalised gradient inside the momentum.
      schedule: t -> gamma_t.

    Shapes/dtypes: any float32 / float64 array; ``m`` like x, ``v`` 0-d of x's dtype. ||g||_F^2 is
    accumulated in float64 (:func:`refopt.linalg.norms.fro_norm`) and rounded to x's dtype.

    Raises:
      ValueError: for a hyperparameter out of its range or a non-callable schedule.
    """

    lr: float = 1e-2
    beta1: float = 0.9
    beta2: float = 0.25
    eps: float = 1e-6
    eps_root: float = 0.0
    weight_decay: float = 0.0
    schedule: Callable[[int], float] | None = None

    State = NovoGradState

    def __post_init__(self):
        _checks.nonnegative("lr", self.lr)
        _checks.unit_interval("beta1", self.beta1)
        _checks.unit_interval("beta2", self.beta2)
        _checks.positive("eps", self.eps)
        _checks.nonnegative("eps_root", self.eps_root)
        _checks.nonnegative("weight_decay", self.weight_decay)
        _checks.schedule(self.schedule)

    def init_leaf(self, x, path):
        return NovoGradState(np.zeros_like(x), np.zeros((), x.dtype))

    def leaf_spec(self, x, path):
        return NovoGradState(ArraySpec.like(x), ArraySpec((), x.dtype))

    def squares_grads(self, s):
        return True

    def context(self, t, glob):
        b2 = float(self.beta2)
        return NovoGradContext(lr_at(self, t), float(self.beta1), b2, 1.0 - b2, float(self.eps),
                               float(self.eps_root), float(self.weight_decay), t == 1), glob

    def _moments(self, c, s, x, g):
        """Write v and m of this step into s (x is read only)."""
        d = x.dtype.type
        n2 = d(fro_norm(g) ** 2)
        v = n2 if c.first else d(c.beta2) * s.v[()] + d(c.omb2) * n2
        s.v[()] = v
        u = g / (np.sqrt(v + d(c.eps_root)) + d(c.eps))
        if c.weight_decay != 0:
            u = u + d(c.weight_decay) * x
        if c.first:
            s.m[...] = u
        else:
            s.m[...] = d(c.beta1) * s.m + u

    def update_leaf(self, ctx, s, x, g, path):
        self._moments(ctx, s, x, g)
        x -= x.dtype.type(ctx.lr_t) * s.m
        return x, s

    def direction_leaf(self, ctx, s, x, g, path):
        self._moments(ctx, s, x, g)
        return s.m.copy(), s
