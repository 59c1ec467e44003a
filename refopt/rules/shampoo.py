"""Shampoo (Gupta, Koren & Singer 2018, "Shampoo: Preconditioned Stochastic Tensor Optimization",
arXiv:1802.09568): one Kronecker factor per axis, the sum of the gradients' outer products along that axis, and the
step preconditioned by each factor's inverse 2k-th root."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np

from refopt.core import ArraySpec, Rule
from refopt.rules import _checks
from refopt.rules.soap import axis_gram


class ShampooState(NamedTuple):
    """Per-array state: ``b`` (like x), the previous step's preconditioned update (the momentum's input), and per
    axis i its statistic ``H[i]`` (n_i x n_i, eps I at init) and inverse root ``root[i]`` (n_i x n_i)."""

    b: np.ndarray
    H: tuple
    root: tuple


class ShampooContext(NamedTuple):
    """The scalars of one step (Python float64, cast by the walk)."""

    first: bool        # t = 1: b_0 = g_1
    recompute: bool    # the roots recomputed this step
    lr_t: float
    decay: float       # 1 - lr_t * weight_decay (decoupled), else 1
    l2: float          # weight_decay (L2), else 0
    momentum: float


def inverse_root(H: np.ndarray, p: int, floor: float) -> np.ndarray:
    """H^(-1/p) of the symmetric H = eps I + (a sum of outer products): V diag(max(w, floor)^(-1/p)) V^T from
    ``numpy.linalg.eigh`` (LAPACK ``?syevd``) in float64, cast to H's dtype. In exact arithmetic every eigenvalue
    is >= eps; ``floor`` = eps raises the ones rounding pushed below it (an eps far below ||H|| u). A matrix
    function is unique, so it does not depend on the basis the solver picks for a repeated eigenvalue.

    Raises:
      ValueError: floor <= 0."""
    if not floor > 0:
        raise ValueError(f"inverse_root needs floor > 0, got {floor!r}")
    w, V = np.linalg.eigh(H.astype(np.float64))
    return ((V * np.maximum(w, floor) ** (-1.0 / p)) @ V.T).astype(H.dtype)


def mode_product(a: np.ndarray, M: np.ndarray, i: int) -> np.ndarray:
    """a x_i M: axis i of a multiplied by the n_i x n_i matrix M (sum_j M[k, j] a[..., j, ...]), a new array."""
    return np.moveaxis(np.tensordot(M, a, axes=([1], [i])), 0, i)


@dataclass(frozen=True)
class Shampoo(Rule):
    r"""Shampoo (Gupta et al. 2018, arXiv:1802.09568, Algorithm 2 for an order-k tensor) with
    pytorch_optimizer's momentum and weight decay.

    At step t (t = 1 first), gamma_t = schedule(t), mu = momentum, k = x.ndim, G_(i) the unfolding of a tensor
    along axis i (n_i x prod of the other axes), b_0 = g_1:

    .. math::

        \hat g_t &= g_t + \mu\, (b_{t-1} - g_t) \; (+\, \lambda x_{t-1} \text{ without } \texttt{decoupled}) \\
        H_{i,t} &= H_{i,t-1} + \hat g_{t(i)} \hat g_{t(i)}^\top \qquad (H_{i,0} = \epsilon I) \\
        b_t &= \hat g_t \times_1 H_{1,t}^{-1/2k} \times_2 \cdots \times_k H_{k,t}^{-1/2k} \\
        x_t &= x_{t-1}\,(1 - \mathrm{lr}\,\gamma_t\,\lambda \text{ with } \texttt{decoupled}) - \mathrm{lr}\,
               \gamma_t\, b_t

    For a matrix, b_t = L_t^{-1/4} hat g_t R_t^{-1/4}; a vector gets full-matrix AdaGrad, H^{-1/2} hat g; a scalar
    steps by hat g. Axes longer than ``max_precond_dim`` get no statistic (an n x n matrix each) and k counts the
    preconditioned axes only; an array with none steps by hat g. The roots (:func:`inverse_root`, eigenvalues
    floored at eps, their exact lower bound) are recomputed at t = 1 and then whenever (t - 1) is a multiple of
    ``precondition_frequency``; between, the last roots are used. The paper's Shampoo is momentum 0. The momentum
    mixes g_t with the previous *preconditioned* update b_{t-1} (pytorch_optimizer's form), not with the previous
    gradients; b has degree 0 in g, so near a minimum hat g -> mu b does not vanish (it can diverge on a quadratic).
    The direction (:func:`refopt.direction`) is u_t = b_t.

    Shapes/dtypes: float32 / float64 arrays of any ndim; b like x, the statistics and roots n_i x n_i in x's
    dtype (per preconditioned axis); the roots by an eigendecomposition in float64 (cast to x's dtype).

    Args:
      lr: learning rate >= 0 (1e-3).
      momentum: mu in [0, 1) (0).
      eps: > 0, the statistics' start eps I (1e-6, pytorch_optimizer's ``matrix_eps``).
      weight_decay: lambda >= 0 (0).
      decoupled: the decay on x (x (1 - lr lambda)) in place of L2 on hat g (False).
      precondition_frequency: the roots' recomputation period f >= 1 (1: every step).
      max_precond_dim: axes longer than this (>= 1) are not preconditioned (10000); None preconditions every axis
        (pytorch_optimizer's Shampoo).
      schedule: optional t -> gamma_t >= 0.

    Presets: ``refopt.like("pytorch_optimizer.Shampoo", ...)`` (refopt/conventions/shampoo.py).

    Raises:
      ValueError: for bad hyperparameters (naming the field).
    """

    lr: float = 1e-3
    momentum: float = 0.0
    eps: float = 1e-6
    weight_decay: float = 0.0
    decoupled: bool = False
    precondition_frequency: int = 1
    max_precond_dim: int | None = 10000
    schedule: Callable[[int], float] | None = None

    def __post_init__(self):
        _checks.nonnegative("lr", self.lr)
        _checks.unit_interval("momentum", self.momentum)
        _checks.positive("eps", self.eps)
        _checks.nonnegative("weight_decay", self.weight_decay)
        _checks.boolean("decoupled", self.decoupled)
        object.__setattr__(self, "precondition_frequency",
                           _checks.positive_int("precondition_frequency", self.precondition_frequency))
        if self.max_precond_dim is not None:
            object.__setattr__(self, "max_precond_dim", _checks.positive_int("max_precond_dim", self.max_precond_dim))
        _checks.schedule(self.schedule)

    def _axes(self, x) -> tuple[int, ...]:
        """The preconditioned axes: those of size <= max_precond_dim (all with None)."""
        m = self.max_precond_dim
        return tuple(i for i, n in enumerate(x.shape) if m is None or n <= m)

    def init_leaf(self, x, path):
        axes = self._axes(x)
        return ShampooState(np.zeros_like(x), tuple(float(self.eps) * np.eye(x.shape[i], dtype=x.dtype) for i in axes),
                            tuple(np.zeros((x.shape[i], x.shape[i]), x.dtype) for i in axes))

    def leaf_spec(self, x, path):
        sq = tuple(ArraySpec((x.shape[i], x.shape[i]), x.dtype) for i in self._axes(x))
        return ShampooState(ArraySpec.like(x), sq, sq)

    def decoupled_decay(self):
        return self.decoupled and self.weight_decay > 0

    def squares_grads(self, s):
        return True

    def context(self, t, glob):
        lr_t = float(self.lr) * _checks.schedule_multiplier(self.schedule, t)
        wd, mu = float(self.weight_decay), float(self.momentum)
        return ShampooContext(t == 1, (t - 1) % self.precondition_frequency == 0, lr_t,
                              1.0 - lr_t * wd if self.decoupled else 1.0, 0.0 if self.decoupled else wd,
                              mu), glob

    def prepare(self, ctx, ss, xs, gs, paths):
        """Before any array is written: where hat g_t could overflow a statistic (its entries grow by at most
        max|hat g|^2 size / n_i) or the preconditioned update (at most sqrt(size) max|hat g| eps^(-1/2)), raise
        FloatingPointError naming the array. max|hat g| is bounded by |g| + mu (|b| + |g|) + lambda |x|."""
        for s, x, g, path in zip(ss, xs, gs, paths):
            if not g.size:
                continue
            top = float(np.finfo(g.dtype).max)
            amax = lambda a: float(np.max(np.abs(a)))      # noqa: E731
            gmax = amax(g)
            gh = gmax + ctx.momentum * ((0.0 if ctx.first else amax(s.b)) + gmax) + ctx.l2 * amax(x)
            stats = max((amax(H) + gh * gh * (g.size / H.shape[0]) for H in s.H), default=0.0)
            step = np.sqrt(g.size) * gh * float(self.eps) ** -0.5
            if not (stats < top and step < top):
                raise FloatingPointError(
                    f"gradient at {path} has |g| = {gmax:.3g}: Shampoo's statistics or its preconditioned update "
                    f"would overflow {g.dtype} (bounds {stats:.3g}, {step:.3g}); scale the loss down or raise eps")
        return gs

    def _direction(self, c: ShampooContext, s: ShampooState, x: np.ndarray, g: np.ndarray) -> np.ndarray:
        """Advance the state in place; return b_t (a new array)."""
        if c.first:
            s.b[...] = g
        gh = g + c.momentum * (s.b - g)
        if c.l2:
            gh = gh + c.l2 * x
        axes = self._axes(x)
        p = 2 * len(axes)
        u = gh
        for i, H, R in zip(axes, s.H, s.root):
            H += axis_gram(gh, i)
            if c.recompute:
                R[...] = inverse_root(H, p, self.eps)
            u = mode_product(u, R, i)
        u = np.ascontiguousarray(u).reshape(x.shape)
        s.b[...] = u
        return u

    def update_leaf(self, ctx, s, x, g, path):
        u = self._direction(ctx, s, x, g)
        if ctx.decay != 1:
            x *= ctx.decay
        x -= ctx.lr_t * u
        return x, s

    def direction_leaf(self, ctx, s, x, g, path):
        return self._direction(ctx, s, x, g).copy(), s
