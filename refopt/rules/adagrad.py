"""Adagrad (Duchi, Hazan & Singer 2011, diagonal form), in torch.optim.Adagrad's form (lr decay, L2, initial
accumulator, eps after the square root) and optax.adagrad's (eps inside it)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import numba
import numpy as np

from refopt.kernels import Elementwise
from refopt.rules import _checks
from refopt.rules.base import ElementwiseRule, lr_at


class AdagradState(NamedTuple):
    """Per-array state: the sum of squared gradients ``sum`` (like x, ``initial_accumulator_value`` at init)."""

    sum: np.ndarray


class AdagradContext(NamedTuple):
    lr_t: float           # lr gamma_t / (1 + (t - 1) lr_decay)
    decay: float          # 1 (the decay is L2, inside g)
    step: float           # lr_t
    u_scale: float        # 1
    weight_decay: float
    eps: float
    eps_inside: bool


@numba.njit
def _adagrad(x, g, s, i, c):
    if c.weight_decay != 0:
        g = g + c.weight_decay * x
    acc = s.sum[i] + g * g
    s.sum[i] = acc
    if c.eps_inside:       # optax: g * rsqrt(sum + eps), 0 where sum = 0
        return g * (1.0 / np.sqrt(acc + c.eps)) if acc > 0 else g * 0.0
    return g / (np.sqrt(acc) + c.eps)


_ADAGRAD = Elementwise(_adagrad, "adagrad")


@dataclass(frozen=True)
class Adagrad(ElementwiseRule):
    r"""Adagrad as torch.optim.Adagrad (``eps_mode='outside'``) or optax.adagrad (``'inside'``). At step t
    (t = 1 first), gamma_t = schedule(t):

    .. math::

        g_t &\leftarrow g_t + \lambda\, x_{t-1} \qquad \text{(L2, coupled)} \\
        s_t &= s_{t-1} + g_t^2, \qquad s_0 = \text{initial\_accumulator\_value} \\
        u_t &= \begin{cases} g_t / (\sqrt{s_t} + \epsilon) & \text{outside (torch)} \\
        g_t / \sqrt{s_t + \epsilon}\ \ (0 \text{ where } s_t = 0) & \text{inside (optax)} \end{cases} \\
        x_t &= x_{t-1} - \frac{\mathrm{lr}\, \gamma_t}{1 + (t - 1)\, \mathrm{lr\_decay}}\, u_t

    The effective step size of entry i is lr / sqrt(s_{t,i}): it only shrinks (the sum never decreases),
    which is Adagrad's regret bound for convex losses and its known weakness on long non-convex runs.

    Args:
      lr: >= 0 (torch's default 1e-2).
      lr_decay: >= 0, torch's 1/(1 + (t-1) lr_decay) (0).
      weight_decay: >= 0 (L2).
      initial_accumulator_value: s_0 >= 0 (torch 0, optax 0.1).
      eps: > 0 (torch 1e-10, optax 1e-7).
      eps_mode: 'outside' (torch) or 'inside' (optax).
      schedule: t -> gamma_t.

    Shapes/dtypes: any float32 / float64 array; ``sum`` like x.

    Raises:
      ValueError: for a hyperparameter out of its range, an unknown eps_mode or a non-callable schedule.
    """

    lr: float = 1e-2
    lr_decay: float = 0.0
    weight_decay: float = 0.0
    initial_accumulator_value: float = 0.0
    eps: float = 1e-10
    eps_mode: str = "outside"
    schedule: Callable[[int], float] | None = None

    State = AdagradState

    def __post_init__(self):
        _checks.nonnegative("lr", self.lr)
        _checks.nonnegative("lr_decay", self.lr_decay)
        _checks.nonnegative("weight_decay", self.weight_decay)
        _checks.nonnegative("initial_accumulator_value", self.initial_accumulator_value)
        _checks.positive("eps", self.eps)
        _checks.one_of("eps_mode", self.eps_mode, {"outside", "inside"})
        _checks.schedule(self.schedule)

    def init_leaf(self, x, path):
        return AdagradState(np.full_like(x, self.initial_accumulator_value))

    def squares_grads(self, s):
        return True

    def context(self, t, glob):
        lr_t = lr_at(self, t) / (1.0 + (t - 1) * float(self.lr_decay))
        return AdagradContext(lr_t, 1.0, lr_t, 1.0, float(self.weight_decay), float(self.eps),
                              self.eps_mode == "inside"), glob

    def kernel(self):
        return _ADAGRAD
