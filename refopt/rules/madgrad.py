"""MADGRAD (Defazio & Jelassi 2021, "Adaptivity without Compromise", Algorithm 1): dual averaging from the
initial point x_0 with weights lr sqrt(k + 1), a cube-root denominator and momentum by averaging the
iterates, in optax.contrib.madgrad's form (eps added to the lr, lambda in float32, L2 decay on g)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, NamedTuple

import numba
import numpy as np

from refopt.core import Rule
from refopt.kernels import Elementwise
from refopt.rules import _checks
from refopt.rules.base import ElementwiseRule, lr_at

#: the precisions of lambda_k (:class:`MADGRAD`'s ``lam_dtype``)
LAM_DTYPES = ("float32", "float64")


class MADGRADState(NamedTuple):
    """Per-array state, each like x: the weighted gradient sum ``s``, the weighted sum of squares ``nu``
    (both 0 at init) and the initial point ``x0`` (a copy of x at init)."""

    s: np.ndarray
    nu: np.ndarray
    x0: np.ndarray


class MADGRADContext(NamedTuple):
    lr_t: float
    decay: float      # momentum
    step: float       # 1 - momentum (the weight c of z)
    u_scale: float    # 1 (unused: no additive direction)
    lam: float        # lambda_k
    eps: float
    use_wd: bool      # weight_decay != 0
    wd: float


@numba.njit
def _madgrad(x, g, s, i, c):
    if c.use_wd:
        g = g + c.wd * x
    sk = s.s[i] + c.lam * g
    nu = s.nu[i] + c.lam * (g * g)
    s.s[i] = sk
    s.nu[i] = nu
    # a = -z with z = x0 - s / (cbrt(nu) + eps), so that decay*x - step*a = momentum x + (1 - momentum) z
    return sk / (np.cbrt(nu) + c.eps) - s.x0[i]


_MADGRAD = Elementwise(_madgrad, "madgrad")


def lam_at(lr_t: float, eps: float, t: int, eps_in_lr: bool, lam_dtype: str) -> float:
    """lambda_k at step t = k + 1: (lr_t + eps) sqrt(t) (lr_t sqrt(t) without ``eps_in_lr``), in float64 or as
    optax computes it in float32 (``lam_dtype``): fl32(fl32(lr_t + eps) * fl32(sqrt(t)))."""
    base = lr_t + eps if eps_in_lr else lr_t
    if lam_dtype == "float32":
        return float(np.float32(base) * np.sqrt(np.float32(t)))
    return base * math.sqrt(t)


@dataclass(frozen=True)
class MADGRAD(ElementwiseRule):
    r"""MADGRAD as optax.contrib.madgrad (Defazio & Jelassi 2021, Algorithm 1). At step t = k + 1 (t = 1
    first), lr_t = lr schedule(t), g_k the gradient at x_k:

    .. math::

        g_k &\leftarrow g_k + \mu\, x_k \qquad \text{(L2 decay, only when } \mu \ne 0\text{)} \\
        \lambda_k &= (\mathrm{lr}_t + \epsilon) \sqrt{k + 1} \\
        s_{k+1} &= s_k + \lambda_k\, g_k, \qquad \nu_{k+1} = \nu_k + \lambda_k\, g_k^2 \\
        z_{k+1} &= x_0 - \frac{s_{k+1}}{\nu_{k+1}^{1/3} + \epsilon} \\
        x_{k+1} &= \beta\, x_k + (1 - \beta)\, z_{k+1}

    from s_0 = nu_0 = 0 and x_0 the params at init (beta the momentum; the paper's c_{k+1} = 1 - beta).
    The step is not x - lr u: x moves towards the dual-averaging point z, which is anchored at x_0, so the
    rule has no additive direction (:func:`refopt.direction` raises NotImplementedError).

    optax's conventions that the paper does not have (the defaults here):

    * ``eps_in_lr=True``: lambda_k = (lr + eps) sqrt(k + 1), eps added to the lr (as the facebookresearch
      code); the paper's lambda_k = lr sqrt(k + 1) is ``eps_in_lr=False``;
    * ``lam_dtype='float32'``: optax computes lambda_k in float32 (its int32 step count gives a float32
      sqrt(k + 1), and the lr is a weakly typed Python float), fl32(fl32(lr + eps) fl32(sqrt(k + 1))), even
      for float64 params; ``'float64'`` computes it in float64 (the paper's exact value, cast to the array
      dtype);
    * ``weight_decay``: optax chains ``add_decayed_weights`` before the rule, so the decay is L2 on the
      gradient and enters s and nu; the paper has no decay;
    * the momentum is a constant (the paper allows a sequence c_k).

    A schedule: optax evaluates a callable learning_rate at its count k = t - 1; refopt's schedule at t.

    Args:
      lr: >= 0 (1e-2; optax has no default).
      momentum: beta in [0, 1) (0.9).
      eps: > 0 (1e-6), added to cbrt(nu) and, with ``eps_in_lr``, to the lr.
      weight_decay: mu >= 0 (0), L2 added to the gradient.
      eps_in_lr: bool (True, optax's); False: the paper's lambda_k.
      lam_dtype: 'float32' (optax's) or 'float64'.
      schedule: t -> the multiplier of lr.

    Shapes/dtypes: any float32 / float64 array; ``s``, ``nu``, ``x0`` like x (nu grows with the sum of
    lambda_k g^2, so |g| must stay below sqrt(max)/2 of the dtype).

    Raises:
      ValueError: for a hyperparameter out of its range, a non-bool eps_in_lr, a lam_dtype other than
        'float32' / 'float64' or a non-callable schedule.
    """

    lr: float = 1e-2
    momentum: float = 0.9
    eps: float = 1e-6
    weight_decay: float = 0.0
    eps_in_lr: bool = True
    lam_dtype: str = "float32"
    schedule: Callable[[int], float] | None = None

    State = MADGRADState

    def __post_init__(self):
        _checks.nonnegative("lr", self.lr)
        _checks.unit_interval("momentum", self.momentum)
        _checks.positive("eps", self.eps)
        _checks.nonnegative("weight_decay", self.weight_decay)
        _checks.boolean("eps_in_lr", self.eps_in_lr)
        _checks.one_of("lam_dtype", self.lam_dtype, LAM_DTYPES)
        _checks.schedule(self.schedule)

    def init_leaf(self, x, path):
        return MADGRADState(np.zeros_like(x), np.zeros_like(x), np.array(x, order="C", copy=True))

    def squares_grads(self, s):
        return True

    def context(self, t, glob):
        lr_t, m, eps, wd = lr_at(self, t), float(self.momentum), float(self.eps), float(self.weight_decay)
        lam = lam_at(lr_t, eps, t, self.eps_in_lr, self.lam_dtype)
        return MADGRADContext(lr_t, m, 1.0 - m, 1.0, lam, eps, wd != 0, wd), glob

    def kernel(self):
        return _MADGRAD

    #: no additive direction u (the step averages x with z, anchored at x_0)
    direction_leaf = Rule.direction_leaf
