r"""Schedule-Free SGD and AdamW (Defazio et al. 2024, "The Road Less Scheduled", arXiv:2405.15682).

Post 004, eq. (18), in the paper's letters: the gradient is taken at the interpolation y, the base
iterate z takes the plain step, and x (the weights to evaluate) is an online weighted average of z:

.. math::

    y_t &= (1 - \beta)\, z_t + \beta\, x_t \\
    z_{t+1} &= z_t - \gamma_t \cdot (\text{step direction at } y_t) \\
    x_{t+1} &= (1 - c_{t+1})\, x_t + c_{t+1}\, z_{t+1}

refopt follows the facebookresearch reference classes ``SGDScheduleFreeReference`` and
``AdamWScheduleFreeReference`` (schedulefree 1.4.1 = facebookresearch/schedule_free HEAD; CONVENTIONS.md
section 5) operation for operation, so float64 agrees with them to rounding (~1e-15 relative). What the
two rules share is written once in ``refopt/rules/_schedule_free_step.py``.

* The params the user holds (and passes to ``update``) are **y**; the per-array state holds **z** and
  **x** (and AdamW's second moment **v**); ``refopt.eval_params`` returns the stored x, never one recomputed
  from (y, z) (PITFALLS B14: (y - (1-beta) z)/beta loses ~1e-7 in float32). There is no train/eval mode:
  y stays in the params, x in the state, so "eval -> train -> eval" is bit-identical and a checkpoint of
  (params, state) resumes exactly in either "mode".
* The step size and averaging weight of step t, as the reference's param group (:class:`SFGlobal`):
  gamma_t = (lr * schedule(t)) * warm_t, lr_max = max(lr_max, gamma_t), w_t = t**r * lr_max**weight_lr_power,
  weight_sum += w_t and c_t = w_t / weight_sum, with **c_t = 0 when weight_sum = 0** (a step with lr = 0
  before any non-zero step: the reference's ZeroDivisionError branch; PITFALLS B12). Warmup is built in:
  warm_t = t / warmup_steps for t <= warmup_steps, else 1 (the reference's (k+1)/warmup_steps, k = t - 1).
* ``schedule`` (refopt extension, default None, i.e. 1) is what the reference computes when a torch LR
  scheduler sets the group's ``lr`` to lr * schedule(t) before step t (e.g.
  ``LambdaLR(opt, lambda e: schedule(e + 1))``): it drives the z step *and* lr_max / the averaging weights.
  B12's lr sequence [0, 0.1, 0.1] is lr = 0.1 with schedule [0, 1, 1].
* ``warmup_lag`` (refopt option, default False) reproduces released optax <= 0.2.8's one-step-late inner
  warmup (optax#1744, CONVENTIONS.md 2.5): ``optax.contrib.schedule_free_sgd/adamw(lr, warmup_steps=W)`` is
  ``ScheduleFreeSGD/AdamW(lr, warmup_steps=W, warmup_lag=True)``. The z step (optax's inner
  ``scale_by_learning_rate``, counting from 0) uses (lr * schedule(t)) * warm_{t-1}, warm_0 = 0 (the first
  z step is 0), and so does AdamW's decoupled decay gamma_t*lambda (``add_decayed_weights`` comes before
  that scaling; SGD's L2 term rides on the z step); lr_max, the weights and c_t (the outer ``step_count``
  counts from 1) keep warm_t. ``schedule`` is not lagged (optax's wrappers take none). Without warmup
  (warmup_steps = 0) it has no effect, and optax agrees with the reference.

Not implemented: the memory-efficient non-reference classes (which keep y and z only and differ in
rounding), ``AdamWScheduleFreeReference``'s ignored ``foreach``, HEAD's ``inner_momentum`` (default 0;
absent from the 1.4.1 release), ScheduleFree+ (CONVENTIONS 5.3).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np

from refopt.rules import _checks, _schedule_free_step as _step
from refopt.rules._schedule_free_step import SF_ADAMW as _SF_ADAMW, SF_SGD as _SF_SGD, SFContext  # noqa: F401


class SFGlobal(NamedTuple):
    """Rule-wide Schedule-Free state (Python floats; the reference's param-group entries):
    ``k`` steps taken, ``weight_sum`` = sum of the averaging weights w, ``lr_max`` (-1 before step 1)."""

    k: int
    weight_sum: float
    lr_max: float


class SFSGDState(NamedTuple):
    """Per-array Schedule-Free SGD state: base iterate ``z`` and average ``x`` (shape/dtype of params)."""

    z: np.ndarray
    x: np.ndarray


class SFAdamWState(NamedTuple):
    """Per-array Schedule-Free AdamW state: ``z``, ``x`` and the second moment ``v`` (exp_avg_sq)."""

    z: np.ndarray
    x: np.ndarray
    v: np.ndarray


@dataclass(frozen=True)
class ScheduleFreeSGD(_step.ScheduleFreeBase):
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
      warmup_lag: bool, default False (the reference); True: optax <= 0.2.8's lagged warmup (module docstring).

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

    State, Global = SFSGDState, SFGlobal

    def __post_init__(self):
        self._check_common()
        b = _checks.finite_number("beta", self.beta)
        if not 0.0 < b < 1.0:
            raise ValueError(f"beta must be in (0, 1) (as SGDScheduleFreeReference), got {self.beta!r}")

    def context(self, t, glob):
        lr, c, glob = self._averaging(t, glob)
        return self._context(lr, c, float(self.beta), 0.0, 0.0, 1.0, 1.0), glob

    def kernel(self):
        return _SF_SGD


@dataclass(frozen=True)
class ScheduleFreeAdamW(_step.ScheduleFreeBase):
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
      warmup_steps, r, weight_lr_power, schedule, warmup_lag: as :class:`ScheduleFreeSGD` (warmup_lag also
        lags the decay: module docstring).
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

    State, Global = SFAdamWState, SFGlobal

    def __post_init__(self):
        self._check_common()
        b1 = _checks.finite_number("beta1", self.beta1)
        if not 0.0 <= b1 <= 1.0:
            raise ValueError(f"beta1 must be in [0, 1], got {self.beta1!r}")
        _checks.unit_interval("beta2", self.beta2)
        _checks.positive("eps", self.eps)
        _checks.boolean("decay_at_z", self.decay_at_z)

    def squares_grads(self, s):
        return True

    def context(self, t, glob):
        lr, c, glob = self._averaging(t, glob)
        b2 = float(self.beta2)
        return self._context(lr, c, float(self.beta1), b2, 1.0 - b2, 1.0 - b2 ** t, float(self.eps)), glob

    def kernel(self):
        return _SF_ADAMW
