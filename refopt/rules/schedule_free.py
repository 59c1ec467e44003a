r"""Schedule-Free SGD and AdamW (Defazio et al. 2024, "The Road Less Scheduled", arXiv:2405.15682).

Post 004, eq. (18), in the paper's letters: the gradient is taken at the interpolation y, the base
iterate z takes the plain step, and x (the weights to evaluate) is an online weighted average of z:

.. math::

    y_t &= (1 - \beta)\, z_t + \beta\, x_t \\
    z_{t+1} &= z_t - \gamma_t \cdot (\text{step direction at } y_t) \\
    x_{t+1} &= (1 - c_{t+1})\, x_t + c_{t+1}\, z_{t+1}

refopt follows the facebookresearch reference classes ``SGDScheduleFreeReference`` and
``AdamWScheduleFreeReference`` (schedulefree 1.4.1 = facebookresearch/schedule_free HEAD; CONVENTIONS.md
section 5) operation for operation, so float64 agrees with them to rounding (~1e-15 relative):

* The params the user holds (and passes to ``update``) are **y**; the per-array state holds **z** and
  **x** (and AdamW's second moment **v**); ``refopt.eval_params`` returns the stored x, never a value
  recomputed from (y, z) (PITFALLS B14: (y - (1-beta) z)/beta loses ~1e-7 in float32). There is no
  train/eval mode to switch: y stays in the params, x in the state, so "eval -> train -> eval" is
  bit-identical and a checkpoint of (params, state) resumes exactly in either "mode".
* The rule-wide state :class:`SFGlobal` holds ``k`` (steps taken), ``weight_sum`` and ``lr_max`` (-1
  before the first step), as the reference's param group.
* The averaging weight of step t: gamma_t = lr * warm_t (times the optional schedule, below),
  lr_max = max(lr_max, gamma_t), w_t = t**r * lr_max**weight_lr_power, weight_sum += w_t and
  c_t = w_t / weight_sum, with **c_t = 0 when weight_sum = 0** (a step with lr = 0 before any non-zero
  step: the reference's ZeroDivisionError branch; PITFALLS B12).
* Warmup (built in, as the reference): warm_t = t / warmup_steps for t <= warmup_steps, else 1
  (the reference's (k+1)/warmup_steps with k = t - 1).
* ``warmup_lag`` (refopt option, default False) reproduces released optax <= 0.2.8's one-step-late inner
  warmup (optax#1744, CONVENTIONS.md 2.5): ``optax.contrib.schedule_free_sgd/adamw(warmup_steps=W)`` evaluate
  the warmup of the z step (the inner ``scale_by_learning_rate``, whose count starts at 0) one step late,
  lr * warm_{t-1} with warm_0 = 0 (so the first z step is 0), while the averaging weights (outer
  ``step_count``, from 1) use lr * warm_t as the reference. With ``warmup_lag=True`` the z step (and with
  it AdamW's decoupled decay gamma_t*lambda; SGD's L2 term rides on the z step) uses
  (lr * schedule(t)) * warm_{t-1}; lr_max, the weights and c_t keep warm_t. ``schedule`` is not lagged
  (optax's wrappers take no schedule). No effect when warmup_steps = 0.
* ``schedule`` (refopt extension, default None): gamma_t = (lr * schedule(t)) * warm_t. This is exactly what
  the reference computes when a torch LR scheduler sets the group's ``lr`` to lr * schedule(t) before step
  t (e.g. ``LambdaLR(opt, lambda e: schedule(e + 1))``): the scheduled value drives the z step *and*
  lr_max / the averaging weights. B12's lr sequence [0, 0.1, 0.1] is lr = 0.1 with schedule [0, 1, 1].

Not implemented: the memory-efficient non-reference classes (which keep y and z only and differ in
rounding), ``AdamWScheduleFreeReference``'s ignored ``foreach``, HEAD's ``inner_momentum`` (default 0;
absent from the 1.4.1 release), ScheduleFree+ (CONVENTIONS 5.3). optax's ``contrib.schedule_free``
agrees with this reference at constant lr; with warmup it needs ``warmup_lag=True`` (above).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import numba
import numpy as np

from refopt.core import ArraySpec, Rule
from refopt.kernels import Elementwise
from refopt.rules import _checks


class SFGlobal(NamedTuple):
    """Rule-wide Schedule-Free state (Python floats; the reference's param-group entries):
    ``k`` steps taken, ``weight_sum`` = sum of the averaging weights w, ``lr_max`` (-1 before step 1)."""

    k: int
    weight_sum: float
    lr_max: float


class SFContext(NamedTuple):
    """The scalars of one step, in float64 (cast to the array dtype by the walk)."""

    lr_t: float         # the z step size (logged as the lr of the step)
    lr: float           # the z step size: gamma_t = (lr * schedule(t)) * warm_t (warm_{t-1} with warmup_lag)
    c: float            # averaging coefficient c_t (0 when weight_sum = 0)
    omc: float          # 1 - c_t
    beta: float         # interpolation beta (SGD) / beta1 (AdamW)
    ombeta: float       # 1 - beta
    use_wd: bool        # weight_decay != 0
    weight_decay: float  # lambda (SGD's L2 at y)
    lr_wd: float        # gamma_t * lambda (AdamW's decoupled decay)
    decay_at_z: bool
    beta2: float        # AdamW only (0 for SGD)
    omb2: float
    bc2: float          # 1 - beta2**t (AdamW only; 1 for SGD)
    eps: float
    neg_lr: float       # -gamma_t


class SFSGDState(NamedTuple):
    """Per-array Schedule-Free SGD state: base iterate ``z`` and average ``x`` (shape/dtype of params)."""

    z: np.ndarray
    x: np.ndarray


class SFAdamWState(NamedTuple):
    """Per-array Schedule-Free AdamW state: ``z``, ``x`` and the second moment ``v`` (exp_avg_sq)."""

    z: np.ndarray
    x: np.ndarray
    v: np.ndarray


def _warm(t: int, warmup_steps: int) -> float:
    return t / warmup_steps if t <= warmup_steps else 1.0


def _warm_lagged(t: int, warmup_steps: int) -> float:
    """optax <= 0.2.8's inner warmup at update t: warm_{t-1} (0 at t = 1); 1 without warmup."""
    return _warm(t - 1, warmup_steps) if warmup_steps > 0 else 1.0


@dataclass(frozen=True)
class _SFBase(Rule):
    def _check_common(self):
        _checks.nonnegative("lr", self.lr)
        if isinstance(self.warmup_steps, bool) or not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be an integer >= 0, got {self.warmup_steps!r}")
        _checks.nonnegative("r", self.r)
        _checks.nonnegative("weight_lr_power", self.weight_lr_power)
        _checks.nonnegative("weight_decay", self.weight_decay)
        _checks.schedule(self.schedule)
        _checks.boolean("warmup_lag", self.warmup_lag)

    def init_global(self) -> SFGlobal:
        return SFGlobal(0, 0.0, -1.0)

    def _averaging(self, t: int, glob: SFGlobal) -> tuple[float, float, SFGlobal]:
        """(z step size, c_t, new global state): the reference's step-size, lr_max and weight bookkeeping.
        The z step size is gamma_t, or with ``warmup_lag`` (lr * schedule(t)) * warm_{t-1}."""
        if not isinstance(glob, SFGlobal):
            glob = SFGlobal(*glob)  # e.g. a plain tuple/list from a checkpoint
        scaled = self.lr * _checks.schedule_multiplier(self.schedule, t)
        lr = scaled * _warm(t, self.warmup_steps)
        lr_max = max(lr, glob.lr_max)
        weight = (t ** self.r) * (lr_max ** self.weight_lr_power)
        weight_sum = glob.weight_sum + weight
        c = weight / weight_sum if weight_sum != 0 else 0.0
        z_lr = scaled * _warm_lagged(t, self.warmup_steps) if self.warmup_lag else lr
        return z_lr, c, SFGlobal(t, weight_sum, lr_max)

    def _context(self, lr, c, beta, beta2, omb2, bc2, eps) -> SFContext:
        wd = float(self.weight_decay)
        return SFContext(lr, lr, c, 1.0 - c, beta, 1.0 - beta, wd != 0, wd, lr * wd,
                         bool(getattr(self, "decay_at_z", False)), beta2, omb2, bc2, eps, -lr)

    def lr_info(self, ctx):
        return {"all": float(ctx.lr)}

    def eval_leaf(self, s, x, path):
        """The stored average x (a read-only view of the state array; not recomputed from y and z)."""
        view = s.x.view()
        view.flags.writeable = False
        return view


@dataclass(frozen=True)
class ScheduleFreeSGD(_SFBase):
    r"""Schedule-Free SGD, as ``schedulefree.SGDScheduleFreeReference`` (CONVENTIONS.md 5.1).

    At step t (t = 1 first), with y the params, g the gradient at y, gamma_t and c_t from the module
    docstring (warmup, lr_max, weights):

    .. math::

        g &\leftarrow g + \lambda\, y
        \qquad \text{(L2 decay at } y \text{, coupled; only when } \lambda \ne 0\text{)} \\
        z &\leftarrow z - \gamma_t\, g \\
        x &\leftarrow (1 - c_t)\, x + c_t\, z \\
        y &\leftarrow \beta\, x + (1 - \beta)\, z \qquad \text{(the new params)}

    Args:
      lr: >= 0 (reference default 1.0).
      beta: the interpolation ("momentum") beta in (0, 1), as the reference requires.
      warmup_steps: integer >= 0; linear warmup t/W of the step size (and, through lr_max, of the weights).
      r: >= 0, polynomial weighting t**r of the average.
      weight_lr_power: >= 0, weights lr_max**power (0: no lr weighting; 0.0**0 = 1 as in Python).
      weight_decay: lambda >= 0, L2 added to the gradient at y.
      schedule: optional t -> multiplier of lr (see the module docstring); None = constant.
      warmup_lag: bool, default False (the reference). True reproduces released optax <= 0.2.8's
        one-step-late inner warmup (optax#1744): the z step uses warm_{t-1}, the weights warm_t
        (module docstring); ``optax.contrib.schedule_free_sgd(lr, warmup_steps=W)`` =
        ``ScheduleFreeSGD(lr, warmup_steps=W, warmup_lag=True)``.

    State: z, x like the params (z = x = y0 at init); global :class:`SFGlobal`. float32 stays float32:
    every scalar is computed in float64 and cast to the params' dtype.

    Raises:
      ValueError: for lr, r, weight_lr_power or weight_decay < 0 (or non-finite), beta outside
        (0, 1), a non-integer or negative warmup_steps, a non-callable schedule or a non-bool warmup_lag.
    """

    lr: float = 1.0
    beta: float = 0.9
    warmup_steps: int = 0
    r: float = 0.0
    weight_lr_power: float = 2.0
    weight_decay: float = 0.0
    schedule: Callable[[int], float] | None = None
    warmup_lag: bool = False

    def __post_init__(self):
        self._check_common()
        b = _checks.finite_number("beta", self.beta)
        if not 0.0 < b < 1.0:
            raise ValueError(f"beta must be in (0, 1) (as SGDScheduleFreeReference), got {self.beta!r}")

    def init_leaf(self, x, path):
        return SFSGDState(np.array(x, order="C", copy=True), np.array(x, order="C", copy=True))

    def leaf_spec(self, x, path):
        return SFSGDState(ArraySpec.like(x), ArraySpec.like(x))

    def context(self, t, glob):
        lr, c, glob = self._averaging(t, glob)
        return self._context(lr, c, float(self.beta), 0.0, 0.0, 1.0, 1.0), glob

    def update_leaf(self, ctx, s, x, g, path):
        _SF_SGD.replace(x, g, s, ctx)
        return x, s


@dataclass(frozen=True)
class ScheduleFreeAdamW(_SFBase):
    r"""Schedule-Free AdamW, as ``schedulefree.AdamWScheduleFreeReference`` at HEAD (CONVENTIONS.md 5.2).

    At step t (t = 1 first), y the params, g the gradient at y, gamma_t and c_t from the module
    docstring, bc2 = 1 - beta2**t (float64):

    .. math::

        z &\leftarrow z - (\gamma_t \lambda) \cdot \begin{cases} z & \text{if } \mathtt{decay\_at\_z} \\ y &
        \text{otherwise} \end{cases} \qquad \text{(decoupled decay; only if } \lambda \ne 0\text{)} \\
        v &\leftarrow \beta_2\, v + (1 - \beta_2)\, g^2 \\
        z &\leftarrow z - \gamma_t\, \frac{g}{\sqrt{v / \mathrm{bc2}} + \epsilon} \qquad
        \text{(eps after the sqrt: "E1")} \\
        x &\leftarrow (1 - c_t)\, x + c_t\, z \\
        y &\leftarrow \beta_1\, x + (1 - \beta_1)\, z \qquad \text{(the new params)}

    HEAD convention (since schedulefree 1.3, Nov 2024): no first moment; the bias correction divides v, and
    the step size is *not* multiplied by ``sqrt(bc2)`` (the <= 1.2 releases and ``AdamWScheduleFreePaper``
    did, which also shrank the decay and the averaging weights early on).

    Args:
      lr: >= 0 (reference default 0.0025).
      beta1: interpolation beta in [0, 1] (beta1 = 0: y = z; 1: y = x).
      beta2: second-moment EMA rate in [0, 1).
      eps: > 0, added after the square root.
      warmup_steps, r, weight_lr_power, schedule, warmup_lag: as :class:`ScheduleFreeSGD`
        (``optax.contrib.schedule_free_adamw(lr, warmup_steps=W, ...)`` needs ``warmup_lag=True``; the lagged
        z step size also scales the decoupled decay, as optax's ``add_decayed_weights`` sits before its
        lagged ``scale_by_learning_rate``).
      weight_decay: lambda >= 0, decoupled, scaled by gamma_t, taken at y (or at z with decay_at_z=True).

    State: z, x (= y0 at init), v (zeros) like the params; global :class:`SFGlobal`. float32 stays float32.

    Raises:
      ValueError: for negative or non-finite lr, r, weight_lr_power, weight_decay, eps <= 0, beta1
        outside [0, 1], beta2 outside [0, 1), a bad warmup_steps, schedule or warmup_lag.
    """

    lr: float = 0.0025
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    warmup_steps: int = 0
    r: float = 0.0
    weight_lr_power: float = 2.0
    weight_decay: float = 0.0
    decay_at_z: bool = False
    schedule: Callable[[int], float] | None = None
    warmup_lag: bool = False

    def __post_init__(self):
        self._check_common()
        b1 = _checks.finite_number("beta1", self.beta1)
        if not 0.0 <= b1 <= 1.0:
            raise ValueError(f"beta1 must be in [0, 1], got {self.beta1!r}")
        _checks.unit_interval("beta2", self.beta2)
        _checks.positive("eps", self.eps)
        _checks.boolean("decay_at_z", self.decay_at_z)

    def init_leaf(self, x, path):
        return SFAdamWState(np.array(x, order="C", copy=True), np.array(x, order="C", copy=True),
                            np.zeros(x.shape, x.dtype))

    def leaf_spec(self, x, path):
        return SFAdamWState(ArraySpec.like(x), ArraySpec.like(x), ArraySpec.like(x))

    def squares_grads(self, s):
        return True

    def context(self, t, glob):
        lr, c, glob = self._averaging(t, glob)
        b2 = float(self.beta2)
        return self._context(lr, c, float(self.beta1), b2, 1.0 - b2, 1.0 - b2 ** t, float(self.eps)), glob

    def update_leaf(self, ctx, s, x, g, path):
        _SF_ADAMW.replace(x, g, s, ctx)
        return x, s


# ---------------------------------------------------------------------------------------------------------
# The per-element arithmetic (y is the params element; the new y is returned). The operation order is the
# reference's torch calls: sub_(g, alpha=lr) -> z - lr*g; mul_(1-c).add_(z, alpha=c) -> x*(1-c) + c*z; ...

@numba.njit
def _sf_sgd(y, g, s, i, c):
    if c.use_wd:
        g = g + c.weight_decay * y
    z = s.z[i] - c.lr * g
    x = s.x[i] * c.omc + c.c * z
    s.z[i] = z
    s.x[i] = x
    return x * c.beta + c.ombeta * z


@numba.njit
def _sf_adamw(y, g, s, i, c):
    z = s.z[i]
    if c.use_wd:
        z = z - c.lr_wd * (z if c.decay_at_z else y)
    v = s.v[i] * c.beta2 + c.omb2 * g * g
    z = z + c.neg_lr * g / (np.sqrt(v / c.bc2) + c.eps)
    x = s.x[i] * c.omc + c.c * z
    s.v[i] = v
    s.z[i] = z
    s.x[i] = x
    return x * c.beta + c.ombeta * z


_SF_SGD, _SF_ADAMW = Elementwise(_sf_sgd, "sf_sgd"), Elementwise(_sf_adamw, "sf_adamw")
