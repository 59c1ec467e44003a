"""SGD with momentum, dampening, Nesterov and L2 weight decay, in torch.optim.SGD's conventions."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import numba
import numpy as np

from refopt.core import Rule
from refopt.kernels import elementwise
from refopt.rules import _checks


class SGDState(NamedTuple):
    """Per-array SGD state: the momentum buffer ``b`` (shape and dtype of x; size 0 without momentum)."""

    b: np.ndarray


@dataclass(frozen=True)
class SGD(Rule):
    r"""Stochastic gradient descent, torch.optim.SGD semantics (CONVENTIONS.md 1.1).

    At step t (t = 1 for the first update), with gamma_t = schedule(t) (1 without a schedule)::

        g_t <- g_t + lambda * x_{t-1}                          (L2 decay, coupled: it enters the momentum)
        b_1  = g_1;   b_t = mu * b_{t-1} + (1 - tau) * g_t     (no dampening on step 1, as torch)
        u_t  = g_t + mu * b_t   if nesterov   else   b_t       (u_t = g_t when mu = 0)
        x_t  = x_{t-1} - lr * gamma_t * u_t

    Args:
      lr: peak learning rate eta >= 0 (units of x per unit of gradient).
      momentum: mu in [0, 1).
      dampening: tau in [0, 1); the first buffer is undampened (torch).
      nesterov: Nesterov's look-ahead; needs momentum > 0 and dampening = 0 (as torch).
      weight_decay: L2 coefficient lambda >= 0 added to the gradient.
      schedule: optional pure function t -> gamma_t >= 0 multiplying lr.

    Shapes/dtypes: any float32 / float64 array; the state has x's shape and dtype; every
    hyperparameter is cast to x's dtype, so float32 stays float32.
    Raises: ValueError for lr < 0, momentum or dampening outside [0, 1), weight_decay < 0, or nesterov
      without momentum or with dampening.
    """

    lr: float = 1e-3
    momentum: float = 0.0
    dampening: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0
    schedule: Callable[[int], float] | None = None

    def __post_init__(self):
        _checks.nonnegative("lr", self.lr)
        _checks.unit_interval("momentum", self.momentum)
        _checks.unit_interval("dampening", self.dampening)
        _checks.nonnegative("weight_decay", self.weight_decay)
        _checks.schedule(self.schedule)
        _checks.boolean("nesterov", self.nesterov)
        if self.nesterov and (self.momentum <= 0 or self.dampening != 0):
            raise ValueError("nesterov=True needs momentum > 0 and dampening = 0")

    def init_leaf(self, x, path):
        return SGDState(np.zeros_like(x) if self.momentum > 0 else np.zeros(0, x.dtype))

    def context(self, t, glob):
        return (t, self.lr * _checks.schedule_multiplier(self.schedule, t)), glob

    def _scalars(self, ctx, d):
        t, lr_t = ctx
        first = t == 1
        mu = self.momentum
        return (d(self.weight_decay), d(mu), d(1.0 if first else 1.0 - self.dampening), d(0.0 if first else mu),
                mu > 0, self.nesterov)

    def update_leaf(self, ctx, s, x, g, path):
        d = x.dtype.type
        _sgd_step(x.reshape(-1), np.ascontiguousarray(g).reshape(-1), s.b.reshape(-1),
                  _checks.cast(x.dtype, "lr * schedule(t)", ctx[1]),
                  *self._scalars(ctx, d))
        return x, s

    def direction_leaf(self, ctx, s, x, g, path):
        d = x.dtype.type
        u = np.empty(x.shape, x.dtype)
        _sgd_direction(u.reshape(-1), np.ascontiguousarray(x).reshape(-1), np.ascontiguousarray(g).reshape(-1),
                       s.b.reshape(-1), *self._scalars(ctx, d))
        return u, s


@numba.njit(inline="always")
def _direction_elem(xi, gi, b, i, wd, mu, keep_g, keep_b, use_momentum, nesterov):
    """u_i of one element; writes the momentum buffer b[i]. ``keep_b``/``keep_g`` are mu and (1 - tau),
    except on the first step where they are 0 and 1 (b_1 = g_1)."""
    gi = gi + wd * xi
    if not use_momentum:
        return gi
    bi = keep_b * b[i] + keep_g * gi
    b[i] = bi
    return gi + mu * bi if nesterov else bi


def _step(x, g, b, lr, wd, mu, keep_g, keep_b, use_momentum, nesterov):
    """x <- x - lr * u over flat arrays."""
    for i in numba.prange(x.size):
        x[i] = x[i] - lr * _direction_elem(x[i], g[i], b, i, wd, mu, keep_g, keep_b, use_momentum, nesterov)


def _direction(u, x, g, b, wd, mu, keep_g, keep_b, use_momentum, nesterov):
    """u <- the SGD direction over flat arrays; x is only read."""
    for i in numba.prange(u.size):
        u[i] = _direction_elem(x[i], g[i], b, i, wd, mu, keep_g, keep_b, use_momentum, nesterov)


_sgd_step = elementwise(_step)
_sgd_direction = elementwise(_direction)


def sgd_reference(x, g, b, t, rule: SGD):
    """Plain-numpy twin of the kernel (the spec it is tested against). Returns (x_new, b_new)."""
    d = x.dtype.type
    lr = d(rule.lr * _checks.schedule_multiplier(rule.schedule, t))
    g = g + d(rule.weight_decay) * x
    u = g
    if rule.momentum > 0:
        b = g.copy() if t == 1 else d(rule.momentum) * b + d(1.0 - rule.dampening) * g
        u = g + d(rule.momentum) * b if rule.nesterov else b
    return x - lr * u, b
