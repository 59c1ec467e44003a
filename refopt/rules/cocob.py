"""COCOB-Backprop (Orabona & Tommasi 2017, "Training Deep Networks without Learning Rates Through Coin Betting",
Algorithm 2): per entry, a bettor whose wealth is the reward of the moves away from the params at init x_1 bets
a fraction of it on the sum of the negative gradients, with no learning rate to tune, in optax.contrib.cocob's
form (the maximum scale L starts at eps; lr and L2 decay act on the gradient before the bet; the multiply-adds
fused as XLA compiles the jitted step)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import numba
import numpy as np
from numba import types as nb_types
from numba.extending import intrinsic

from refopt.core import Rule
from refopt.kernels import Elementwise
from refopt.rules import _checks
from refopt.rules.base import ElementwiseRule, lr_at


class COCOBState(NamedTuple):
    """Per-array state, each like x: the initial point ``x0`` (a copy of x at init), the sum of the negative
    gradients ``theta``, the maximum observed scale ``scale`` (L, eps at init), the sum of the absolute values of
    the gradients ``abs_sum`` (G) and the wealth ``reward`` (theta, G and reward 0 at init)."""

    x0: np.ndarray
    theta: np.ndarray
    scale: np.ndarray
    abs_sum: np.ndarray
    reward: np.ndarray


class COCOBContext(NamedTuple):
    lr_t: float       # lr * gamma_t, the multiplier of the gradient
    alpha: float
    use_wd: bool      # weight_decay != 0
    wd: float
    zero: float       # 0 in the array dtype (the reward's floor; a literal 0.0 would widen float32 in numba)
    fma: bool         # the four multiply-adds fused (rounded once)


@intrinsic
def _fused(typingctx, a, b, d):
    """a * b + d rounded once (LLVM's llvm.fma: correctly rounded, by the FMA instruction or libm's fma)."""
    if not (isinstance(a, nb_types.Float) and a == b == d):
        return None

    def codegen(context, builder, signature, args):
        return builder.fma(*args)
    return a(a, b, d), codegen


@numba.njit
def _madd(a, b, d, fused):
    """a * b + d: rounded once (``fused``) or the product rounded first."""
    if fused:
        return _fused(a, b, d)
    return a * b + d


@numba.njit
def _cocob(x, g, s, i, c):
    u = _madd(c.wd, x, g, c.fma) if c.use_wd else g
    gt = c.lr_t * u
    x0 = s.x0[i]
    ag = abs(gt)
    L = s.scale[i]
    if ag > L:
        L = ag
    G = s.abs_sum[i] + ag
    r = _madd(-gt, x - x0, s.reward[i], c.fma)
    if r < c.zero:
        r = c.zero
    theta = _madd(-c.lr_t, u, s.theta[i], c.fma)
    s.scale[i] = L
    s.abs_sum[i] = G
    s.reward[i] = r
    s.theta[i] = theta
    floor = c.alpha * L
    m = G + L
    if floor > m:
        m = floor
    w = _madd(theta / (L * m), L + r, x0, c.fma)
    return x + (w - x)      # optax's x + (-x + x_{t+1}), bit for bit


_COCOB = Elementwise(_cocob, "cocob")


@dataclass(frozen=True)
class COCOB(ElementwiseRule):
    r"""COCOB-Backprop as optax.contrib.cocob (Orabona & Tommasi 2017, Algorithm 2). At step t (t = 1 first),
    per entry, with g_t the gradient at x_t (the paper's subgradient is the negative gradient -g_t) and
    lr_t = lr schedule(t):

    .. math::

        \tilde g_t &= \mathrm{lr}_t\, (g_t + \mu\, x_t) \qquad \text{(L2 decay only when } \mu \ne 0\text{)} \\
        L_t &= \max(L_{t-1}, |\tilde g_t|), \qquad G_t = G_{t-1} + |\tilde g_t| \\
        \mathrm{Reward}_t &= \max(\mathrm{Reward}_{t-1} - \tilde g_t\, (x_t - x_1), 0), \qquad
        \theta_t = \theta_{t-1} - \tilde g_t \\
        x_{t+1} &= x_1 + \frac{\theta_t}{L_t \max(G_t + L_t, \alpha L_t)}\, (L_t + \mathrm{Reward}_t)

    from x_1 the params at init (the state ``x0``), L_0 = eps and G_0 = Reward_0 = theta_0 = 0. The first step
    (Reward_1 = 0) moves each entry by -sign(g_1) / alpha where |lr g_1| > eps and alpha >= 2. The step is not
    x - lr u: x is the bet placed from x_1, so the rule has no additive direction (:func:`refopt.direction`
    raises NotImplementedError). optax computes the update -x_t + x_{t+1} and adds it to x_t; refopt forms the same
    bits.

    optax's conventions that the paper does not have (reproduced here):

    * eps is the initial maximum scale, L_0 = eps (as in the authors' PyTorch code, bremen79/parameterfree),
      and nowhere else; the paper starts from L_0 = 0, where an entry whose gradients are all 0 so far gives
      0/0. With |lr g| > eps the two agree;
    * ``lr``: optax chains ``scale_by_learning_rate(learning_rate, flip_sign=False)`` before the bet, so lr_t
      multiplies the gradient, not the step; the paper has no learning rate. The bet is of degree 0 in the
      gradient (theta, G, L and Reward all scale with it), so lr_t changes the step only against eps;
    * ``weight_decay``: optax chains ``add_decayed_weights`` first, so the decay is L2 on the gradient and
      enters every sum; the paper has no decay;
    * ``fma``: under ``jax.jit`` XLA compiles the four multiply-adds of the step, u = g + mu x,
      Reward - g~ (x - x_1), theta - lr_t u and x_1 + q (L + Reward) (q the fraction), into fused
      multiply-adds, each rounded once (measured on CPU: bit for bit over 50 steps, where the unfused
      arithmetic differs by an ulp from the first step). Where the L2 term drives x_{t+1} = x_1 + bet far
      below x_1 (the cancellation loses the digits of x_1), an ulp of x_1 is a large part of x, so only the
      fused form reproduces jitted optax at 1e-12. ``fma=False`` rounds every product (optax run op by op
      without jit, bit for bit; the paper's formulas as written, up to optax's x + (-x + x_{t+1})); the two
      differ by an ulp per multiply-add.

    A schedule: optax evaluates a callable learning_rate at its count k = t - 1; refopt's schedule at t.

    Args:
      lr: >= 0 (1.0, optax's), the multiplier of the gradient.
      alpha: > 0 (100.0), the floor alpha L of the denominator (about the steps of warm-up).
      eps: > 0 (1e-8), the initial maximum scale L_0.
      weight_decay: mu >= 0 (0), L2 added to the gradient.
      fma: bool (True, optax's as jax.jit compiles it); False: every product rounded.
      schedule: t -> the multiplier of lr.

    State: ``x0``, ``theta``, ``scale``, ``abs_sum``, ``reward`` (:class:`COCOBState`), each like x.
    Shapes/dtypes: any float32 / float64 array, computed in its dtype. L max(G + L, alpha L) grows like
    max(t, alpha) g^2, so |g| must stay below sqrt(max)/2 of the dtype (checked) and, for the entries whose
    gradients are all 0, eps max(eps, alpha eps) must not underflow (checked at init).

    Raises:
      ValueError: for a hyperparameter out of its range, a non-bool fma or a non-callable schedule; at init,
        for an eps with eps max(eps, alpha eps) = 0 in the params' dtype.
    """

    lr: float = 1.0
    alpha: float = 100.0
    eps: float = 1e-8
    weight_decay: float = 0.0
    fma: bool = True
    schedule: Callable[[int], float] | None = None

    State = COCOBState

    def __post_init__(self):
        _checks.nonnegative("lr", self.lr)
        _checks.positive("alpha", self.alpha)
        _checks.positive("eps", self.eps)
        _checks.nonnegative("weight_decay", self.weight_decay)
        _checks.boolean("fma", self.fma)
        _checks.schedule(self.schedule)

    def init_leaf(self, x, path):
        d = x.dtype.type
        with np.errstate(under="ignore", over="ignore"):
            eps, alpha = d(self.eps), d(self.alpha)
            den = eps * max(eps, alpha * eps)
        if not (den > 0 and np.isfinite(den)):
            raise ValueError(f"COCOB: eps={self.eps!r} gives eps * max(eps, alpha eps) = {den!r} in {x.dtype} at "
                             f"{path or 'the params'} (an entry whose gradients are 0 would give 0/0); choose a "
                             f"larger eps")
        return COCOBState(np.array(x, order="C", copy=True), np.zeros_like(x), np.full_like(x, eps),
                          np.zeros_like(x), np.zeros_like(x))

    def squares_grads(self, s):
        return True

    def context(self, t, glob):
        wd = float(self.weight_decay)
        return COCOBContext(lr_at(self, t), float(self.alpha), wd != 0, wd, 0.0, self.fma), glob

    def kernel(self):
        return _COCOB

    def update_leaf(self, ctx, s, x, g, path):
        """x <- x_{t+1} in place (the kernel's replace loop: five state arrays, one more than the batched step
        of :mod:`refopt.fast` takes, so the leaves step one by one)."""
        self.kernel().replace(x, g, s, ctx)
        return x, s

    #: no additive direction u (x_{t+1} is the bet placed from x_1)
    direction_leaf = Rule.direction_leaf
