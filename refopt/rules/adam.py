"""Adam (L2 decay) and AdamW (decoupled or lr-independent decay) in torch.optim's conventions, with
AMSGrad (torch's or optax's form) and NAdam (optax's constant-beta1 form or torch's momentum decay). The
step's arithmetic, shared by both, is in ``refopt/rules/_adam_step.py``."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np

from refopt.rules import _adam_step as _step, _checks
from refopt.rules._adam_step import ADAM as _ADAM, AMSGRAD as _AMSGRAD, NADAM as _NADAM, AdamContext  # noqa: F401
from refopt.rules.base import ElementwiseRule


class AdamState(NamedTuple):
    """Per-array Adam state: first moment ``m`` and second moment ``v`` (shape and dtype of x)."""

    m: np.ndarray
    v: np.ndarray


class AMSGradState(NamedTuple):
    """Per-array AMSGrad state: ``m``, ``v`` and the running maximum ``v_max`` (of v, or of v/(1-beta2**t))."""

    m: np.ndarray
    v: np.ndarray
    v_max: np.ndarray


class NAdamGlobal(NamedTuple):
    """Rule-wide state of torch's NAdam (``momentum_decay`` set): mu_product = prod_{k <= t} mu_k."""

    mu_product: float


@dataclass(frozen=True)
class _AdamBase(ElementwiseRule):
    lr: float = 1e-3
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    schedule: Callable[[int], float] | None = None
    nesterov: bool = False
    amsgrad: bool | str = False
    momentum_decay: float | None = None

    def __post_init__(self):
        _checks.nonnegative("lr", self.lr)
        _checks.unit_interval("beta1", self.beta1)
        _checks.unit_interval("beta2", self.beta2)
        _checks.positive("eps", self.eps)
        _checks.nonnegative("weight_decay", self.weight_decay)
        _checks.schedule(self.schedule)
        _checks.boolean("nesterov", self.nesterov)
        _checks.one_of("amsgrad", self.amsgrad, {False, True, "bias_corrected"})
        if self.amsgrad and self.nesterov:
            raise ValueError("amsgrad and nesterov cannot be combined (no peer defines it)")
        if self.momentum_decay is not None:
            _checks.positive("momentum_decay", self.momentum_decay)
            if not self.nesterov:
                raise ValueError("momentum_decay (torch's NAdam) needs nesterov=True")

    @property
    def State(self):
        return AMSGradState if self.amsgrad else AdamState

    def init_global(self):
        return None if self.momentum_decay is None else NAdamGlobal(1.0)

    def squares_grads(self, s):
        return True

    def prepare(self, ctx, ss, xs, gs, paths):
        _step.check_l2(type(self).__name__, float(ctx.l2), xs, paths)
        return super().prepare(ctx, ss, xs, gs, paths)

    def _decay_and_l2(self, gamma: float, lr_t: float) -> tuple[float, float]:
        return 1.0, float(self.weight_decay)

    def context(self, t, glob):
        gamma = _checks.schedule_multiplier(self.schedule, t)
        lr_t = float(self.lr) * gamma
        decay, l2 = self._decay_and_l2(gamma, lr_t)
        prod = None if self.momentum_decay is None else NAdamGlobal(*glob).mu_product
        ctx, prod = _step.context(self, t, lr_t, decay, l2, prod)
        return ctx, glob if prod is None else NAdamGlobal(prod)

    def kernel(self):
        return _NADAM if self.nesterov else (_AMSGRAD if self.amsgrad else _ADAM)


@dataclass(frozen=True)
class Adam(_AdamBase):
    r"""Adam (Kingma & Ba 2015, Alg. 1) with L2 weight decay, as torch.optim.Adam (CONVENTIONS.md 1.2).

    At step t (t = 1 first), gamma_t = schedule(t):

    .. math::

        g_t &\leftarrow g_t + \lambda\, x_{t-1} \qquad \text{(L2, coupled)} \\
        m_t &= \beta_1 m_{t-1} + (1 - \beta_1)\, g_t \\
        v_t &= \beta_2 v_{t-1} + (1 - \beta_2)\, g_t^2 \\
        x_t &= x_{t-1} - \frac{\mathrm{lr}\,\gamma_t}{1 - \beta_1^t} \,
        \frac{m_t}{\sqrt{v_t} / \sqrt{1 - \beta_2^t} + \epsilon}

    eps is added after the square root of the bias-corrected v (placement "E1" of CONVENTIONS.md 0,
    torch and optax; not TensorFlow's eps-hat). The bias corrections (and NAdam's coefficients below) use the
    integer t and are computed in float64, then cast (PITFALLS B01). The direction (:func:`refopt.direction`) is
    :math:`u_t = \hat m_t / (\sqrt{\hat v_t} + \epsilon)` with :math:`\hat m_t = m_t / (1 - \beta_1^t)`,
    :math:`\hat v_t = v_t / (1 - \beta_2^t)`.

    ``amsgrad`` (Reddi et al. 2018): ``True`` is torch's form, the maximum of the raw second moment,
    then its bias correction: :math:`v^{\max}_t = \max(v^{\max}_{t-1}, v_t)`, denominator
    :math:`\sqrt{v^{\max}_t} / \sqrt{1 - \beta_2^t} + \epsilon`. ``"bias_corrected"`` is ``optax.amsgrad``'s:
    the maximum of the bias-corrected moment, :math:`v^{\max}_t = \max(v^{\max}_{t-1}, v_t / (1 - \beta_2^t))`,
    denominator :math:`\sqrt{v^{\max}_t} + \epsilon`. They differ while 1-beta2**t grows (a large early
    v_t/(1-beta2**t) is remembered by optax's, not by torch's).

    ``nesterov=True`` (NAdam, Dozat 2016) replaces the bias-corrected first moment by a look-ahead mix of
    m_t and the (L2-augmented) g_t, with the same moments and denominator:

    .. math::

        x_t = x_{t-1} - \mathrm{lr}\,\gamma_t \,
        \frac{c_{m,t}\, m_t + c_{g,t}\, g_t}{\sqrt{v_t} / \sqrt{1 - \beta_2^t} + \epsilon}

    * ``momentum_decay=None`` (optax.nadam, CONVENTIONS.md 2.3; constant beta1):
      :math:`c_{m,t} = \beta_1 / (1 - \beta_1^{t+1})`, :math:`c_{g,t} = (1 - \beta_1) / (1 - \beta_1^t)`.
    * ``momentum_decay=psi`` (torch.optim.NAdam, default psi = 4e-3; Dozat's momentum schedule):
      :math:`\mu_t = \beta_1 (1 - 0.96^{t \psi} / 2)`, :math:`P_t = \mu_1 \cdots \mu_t` (kept in the global
      state), :math:`c_{m,t} = \mu_{t+1} / (1 - P_t \mu_{t+1})`, :math:`c_{g,t} = (1 - \mu_t) / (1 - P_t)`.
      The moments still use beta1. psi -> infinity gives mu_t = beta1, i.e. optax's coefficients.

    The direction is :math:`u_t = (c_{m,t}\, m_t + c_{g,t}\, g_t) / (\sqrt{\hat v_t} + \epsilon)`.

    Args:
      lr: peak learning rate eta >= 0 (units of x: the step is about lr per coordinate).
      beta1, beta2: EMA rates in [0, 1).
      eps: > 0, in units of the gradient.
      weight_decay: L2 coefficient lambda >= 0.
      schedule: optional t -> gamma_t >= 0.
      nesterov: bool, default False (plain Adam); True: NAdam (above).
      amsgrad: False (default), True (torch) or "bias_corrected" (optax); not with nesterov.
      momentum_decay: None (default) or psi > 0 (torch's NAdam; needs nesterov=True).

    Shapes/dtypes: any float32 / float64 array; m, v (and v_max) like x; hyperparameters cast to x's dtype.
    A gradient with ``|g| >= sqrt(max of the dtype)/2`` (9.2e18 in float32) raises FloatingPointError before
    anything is written: its square would make v infinite and freeze the parameter; so does an L2 term
    weight_decay * |x| that large (it is added to g before the square).

    Raises:
      ValueError: for lr < 0, betas outside [0, 1), eps <= 0, weight_decay < 0, non-bool nesterov,
        an unknown amsgrad, amsgrad with nesterov, momentum_decay <= 0 or without nesterov.
      FloatingPointError: for a gradient or an L2 term too large to square (above), naming the array.
    """


@dataclass(frozen=True)
class AdamW(_AdamBase):
    r"""AdamW: Adam with decay outside the moments (Loshchilov & Hutter 2019, arXiv:1711.05101).

    Same moments, eps placement, ``amsgrad``, ``nesterov`` and ``momentum_decay`` as :class:`Adam` (no L2
    term in g). The decay uses the pre-update x_{t-1} (PITFALLS B05):

    .. math::

        x_t &= (1 - \mathrm{lr}\,\gamma_t \lambda)\, x_{t-1} - \mathrm{lr}\,\gamma_t\, u_t'
        \qquad \text{('decoupled': torch AdamW)} \\
        x_t &= (1 - \gamma_t \lambda)\, x_{t-1} - \mathrm{lr}\,\gamma_t\, u_t'
        \qquad \text{('independent': post 001; arXiv:2405.13698, "independent weight decay")}

    where lr*gamma_t*u_t' is Adam's step above. In 'independent' mode lambda is a rate per step (the EMA
    time constant is 1/(gamma_t*lambda) steps), so it transfers across learning rates.
    ``AdamW(nesterov=True)`` in decoupled mode is ``optax.nadamw``; with ``momentum_decay=psi`` it is
    ``torch.optim.NAdam(decoupled_weight_decay=True)``. The arguments not listed below are :class:`Adam`'s.

    Args:
      weight_decay: lambda >= 0 (default 0.01, torch's AdamW default; <= 1 in 'independent' mode).
      wd_mode: ``'decoupled'`` or ``'independent'``.

    Raises:
      ValueError: as Adam, or for an unknown wd_mode.
    """

    weight_decay: float = 0.01
    wd_mode: str = "decoupled"

    def __post_init__(self):
        super().__post_init__()
        _checks.one_of("wd_mode", self.wd_mode, {"decoupled", "independent"})
        if self.wd_mode == "independent" and self.weight_decay > 1:
            raise ValueError(f"independent weight_decay is a per-step rate and must be <= 1, got {self.weight_decay}")

    def decoupled_decay(self):
        return self.weight_decay > 0

    def _decay_and_l2(self, gamma, lr_t):
        rate = lr_t if self.wd_mode == "decoupled" else gamma
        return 1.0 - rate * self.weight_decay, 0.0
