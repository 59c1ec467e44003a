"""SM3 (Anil, Gupta, Koren & Singer 2019, "Memory-Efficient Adaptive Optimization"): Adagrad whose sum of squared
gradients is kept by covers of the array (one accumulator per index of each axis), in optax.sm3's form."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np

from refopt.core import ArraySpec, Rule
from refopt.rules import _checks
from refopt.rules.base import lr_at


class SM3State(NamedTuple):
    """Per-array state: the momentum ``m`` (like x) and the cover accumulators ``v``: for an array of k >= 2
    axes of sizes n_1 .. n_k, the k accumulators (one entry per row, per column, ...) concatenated axis by axis
    (shape (n_1 + ... + n_k,)); for a vector or a scalar the full sum of squares (like x)."""

    m: np.ndarray
    v: np.ndarray


class SM3Context(NamedTuple):
    lr_t: float
    momentum: float
    eps: float


def _cover_size(shape) -> tuple:
    return (sum(shape),) if len(shape) >= 2 else tuple(shape)


def covers(v: np.ndarray, shape: tuple) -> list[np.ndarray]:
    """The k per-axis accumulators of a state ``v`` of an array of ``shape`` (k >= 2), each shaped to
    broadcast against the array (n_i on axis i, 1 elsewhere): views of v."""
    out, lo = [], 0
    for i, n in enumerate(shape):
        out.append(v[lo:lo + n].reshape([1] * i + [n] + [1] * (len(shape) - i - 1)))
        lo += n
    return out


@dataclass(frozen=True)
class SM3(Rule):
    r"""SM3-II with momentum as optax.sm3 (Anil et al. 2019, Algorithm 2 (SM3-II); the momentum of the scaled
    gradient as in their experiments). For an array of k >= 2 axes, at step t, with mu_{t-1}^{(i)} the
    accumulator of axis i (one entry per index of that axis):

    .. math::

        \nu_t(j) &= \min_{i} \mu_{t-1}^{(i)}(j_i) + g_t(j)^2, \qquad
        \mu_t^{(i)}(r) = \max_{j:\, j_i = r} \nu_t(j) \\
        m_t &= \beta\, m_{t-1} + (1 - \beta)\, \frac{g_t}{\sqrt{\nu_t + \epsilon}} \quad (0 \text{ where }
        \nu_t = 0), \qquad x_t = x_{t-1} - \mathrm{lr}\, \gamma_t\, m_t

    For a vector (or a scalar) nu_t = nu_{t-1} + g_t^2 is kept whole: Adagrad's sum. nu_t bounds the sum of
    squares of every entry from above, with sum(n_i) numbers per array in place of prod(n_i). optax adds its
    eps (1e-8) inside the square root and has no bias correction for the momentum.

    Args:
      lr: >= 0 (optax has no default; 1e-2 here).
      momentum: in [0, 1) (0.9, optax's).
      eps: >= 0 (1e-8, optax's fixed value).
      schedule: t -> gamma_t.

    Shapes/dtypes: any float32 / float64 array; ``m`` like x, ``v`` of shape (n_1 + ... + n_k,) (k >= 2 axes)
    or like x.

    Raises:
      ValueError: for a hyperparameter out of its range or a non-callable schedule.
    """

    lr: float = 1e-2
    momentum: float = 0.9
    eps: float = 1e-8
    schedule: Callable[[int], float] | None = None

    State = SM3State

    def __post_init__(self):
        _checks.nonnegative("lr", self.lr)
        _checks.unit_interval("momentum", self.momentum)
        _checks.nonnegative("eps", self.eps)
        _checks.schedule(self.schedule)

    def init_leaf(self, x, path):
        return SM3State(np.zeros_like(x), np.zeros(_cover_size(x.shape), x.dtype))

    def leaf_spec(self, x, path):
        return SM3State(ArraySpec.like(x), ArraySpec(_cover_size(x.shape), x.dtype))

    def squares_grads(self, s):
        return True

    def context(self, t, glob):
        return SM3Context(lr_at(self, t), float(self.momentum), float(self.eps)), glob

    def _momentum(self, ctx, s, x, g):
        """Write the covers (or the full sum) and m of this step into s (x is read only)."""
        d = x.dtype.type
        if x.ndim >= 2:
            cs = covers(s.v, x.shape)
            nu = g * g + np.minimum.reduce(np.broadcast_arrays(*cs))
            for i, c in enumerate(cs):
                c[...] = np.max(nu, axis=tuple(a for a in range(x.ndim) if a != i), keepdims=True)
        else:
            nu = g * g + s.v
            s.v[...] = nu
        with np.errstate(divide="ignore"):
            scaled = np.where(nu > 0, g / np.sqrt(nu + d(ctx.eps)), d(0))
        s.m[...] = d(1.0 - ctx.momentum) * scaled + d(ctx.momentum) * s.m

    def update_leaf(self, ctx, s, x, g, path):
        self._momentum(ctx, s, x, g)
        x -= x.dtype.type(ctx.lr_t) * s.m
        return x, s

    def direction_leaf(self, ctx, s, x, g, path):
        self._momentum(ctx, s, x, g)
        return s.m.copy(), s
