"""Adafactor (Shazeer & Stern 2018): a second moment kept as row and column factors for matrices (a full one
for vectors), an update clipped by its RMS and a step relative to the parameters' RMS; in torch.optim.Adafactor's
form and optax.adafactor's.

One rule with a ``form`` field, not two rules: both peers ship the paper's Algorithms 4/5 skeleton under the
same name (factored EMA of g^2 with the decay 1 - t^-0.8, update clipping by RMS(U)/d, a step proportional to
max(eps2, RMS(x))), and differ by conventions the form switches together, as Rprop's does: where eps1 enters
(torch clamps the estimate, optax adds it to g^2 as the paper does), the step size (torch's relative step
min(lr, 1/sqrt(t)); optax's constant lr, the parameter scale optional), where the decay enters, which two axes
are factored (torch: the last two of its (out, in, ...) layout; optax: the two largest, when both have at least
``min_dim_size_to_factor`` entries), optax's optional momentum, and the state's shapes (each peer's own). The
options that mean the same in both forms (lr, beta2_decay, eps2, d, weight_decay, factored,
min_dim_size_to_factor, decay_offset, multiply_by_parameter_scale) are shared fields; torch's and optax's
argument names map onto them in refopt/conventions/adafactor.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np

from refopt.core import ArraySpec, Rule
from refopt.linalg.norms import fro_norm
from refopt.rules import _checks
from refopt.rules.base import lr_at

FORMS = ("torch", "optax")
MOMENTUM_DTYPES = (None, "float32", "float64")


class AdafactorState(NamedTuple):
    """Per-array state. A factored array keeps ``v_row`` and ``v_col`` (``v`` empty); any other keeps the full
    second moment ``v`` like x (``v_row``, ``v_col`` empty); ``m`` is the momentum (optax form with beta1; else
    empty). Shapes of the factors, by form (x a matrix (n_in, n_out) in refopt's layout):

    * torch: keepdims, ``v_row`` (n_in, 1) the mean over the columns (torch's ``col_var`` transposed),
      ``v_col`` (1, n_out) the mean over the rows (torch's ``row_var``); for ndim > 2 the two axes that are
      the last two of torch's (out, in, k_1, ...) layout.
    * optax: optax's, the factored axis removed: ``v_row`` the mean over the largest axis, ``v_col`` over the
      second largest.
    """

    v_row: np.ndarray
    v_col: np.ndarray
    v: np.ndarray
    m: np.ndarray


class AdafactorContext(NamedTuple):
    t: int
    lr_t: float       # lr * gamma_t
    w: float          # torch: 1 - beta2_t = (t - offset)^beta2_decay (torch's lerp weight)
    beta2_t: float    # optax: 1 - (t - offset)^beta2_decay, evaluated in float32 as optax does
    omb2_t: float     # optax: 1 - beta2_t in float32


def torch_axes(ndim: int) -> tuple[int, int]:
    """(a, b): the refopt axes that are the last two, -2 and -1, of torch's layout (out, in, k_1, ...) of an
    array of refopt shape (k_1, ..., fan_in, fan_out): the axes torch.optim.Adafactor factors."""
    perm = (ndim - 1, ndim - 2, *range(ndim - 2))
    return perm[ndim - 2], perm[ndim - 1]


def optax_axes(shape: tuple) -> tuple[int, int]:
    """(d1, d0): the second largest and the largest axis (a stable sort of the sizes), optax's factored axes."""
    order = np.argsort(np.asarray(shape), kind="stable")
    return int(order[-2]), int(order[-1])


def _mean(a: np.ndarray, axis: int, keepdims: bool) -> np.ndarray:
    """The mean over ``axis`` accumulated in float64, rounded to a's dtype."""
    return (np.sum(a, axis=axis, keepdims=keepdims, dtype=np.float64) / a.shape[axis]).astype(a.dtype)


def _rms(a: np.ndarray) -> float:
    """sqrt(mean(a^2)) in float64 of a's dtype-rounded norm."""
    return float(a.dtype.type(fro_norm(a))) / (a.size ** 0.5) if a.size else 0.0


def _lerp(a: np.ndarray, b: np.ndarray, w) -> np.ndarray:
    """a + w (b - a), in torch's two-sided form: b - (b - a)(1 - w) for |w| >= 1/2 (exactly b at w = 1)."""
    if abs(w) < 0.5:
        return a + w * (b - a)
    return b - (b - a) * (w.dtype.type(1) - w)


@dataclass(frozen=True)
class Adafactor(Rule):
    r"""Adafactor as torch.optim.Adafactor (``form='torch'``) or optax.adafactor (``'optax'``). At step t (t = 1
    first), G = g_t, lr_t = lr gamma_t, and a factored array (a matrix G of n rows, m columns; for other
    shapes see the factored axes below):

    .. math::

        \hat\beta_{2,t} &= 1 - (t - t_0)^{\tau} \qquad (\tau = \text{beta2\_decay} \le 0,\ t_0 =
        \text{decay\_offset};\ \hat\beta_{2,1} = 0) \\
        R_t &= \hat\beta_{2,t} R_{t-1} + (1 - \hat\beta_{2,t})\, \mathrm{mean}_{cols}(G^2 [+ \epsilon_1]),
        \quad C_t = \hat\beta_{2,t} C_{t-1} + (1 - \hat\beta_{2,t})\, \mathrm{mean}_{rows}(G^2 [+ \epsilon_1]) \\
        \hat V_t &= R_t C_t / \mathrm{mean}(R_t) \qquad (\text{unfactored: } \hat V_t = \hat\beta_{2,t}
        \hat V_{t-1} + (1 - \hat\beta_{2,t})(G^2 [+ \epsilon_1])) \\
        U_t &= G / \sqrt{\hat V_t}, \qquad \hat U_t = U_t / \max(1, \mathrm{RMS}(U_t)/d) \\
        \text{torch:}\ x_t &= (1 - \mathrm{lr}_t\lambda)\, x_{t-1} - \max(\epsilon_2, \mathrm{RMS}(x_{t-1}))
        \min(\mathrm{lr}_t, 1/\sqrt t)\, \hat U_t \\
        \text{optax:}\ u_t &= \mathrm{lr}_t \max(\epsilon_2, \mathrm{RMS}(x_{t-1}))\, \hat U_t, \quad
        m_t = \beta_1 m_{t-1} + (1 - \beta_1) u_t \ (\text{if } \beta_1), \quad x_t = x_{t-1} - (m_t
        + \lambda x_{t-1})

    The paper's (Shazeer & Stern 2018, Algorithms 4 and 5 with update clipping, relative step size rho_t =
    min(1e-2, 1/sqrt t) and parameter scale max(eps2, RMS(x))) is torch's form with lr = 1e-2, except for
    eps1: the paper adds eps1 to G^2 (optax's placement, the [+ eps1] above); torch instead clamps
    mean(R_t) and \hat V_t from below, max(mean(R_t), eps1) and max(\hat V_t, eps1^2), with R_t, C_t computed
    from G^2 alone. optax's step is lr_t times the parameter scale (no relative step, lr = None meaning 1), the
    scale optional (``multiply_by_parameter_scale``), and its decay is added to the update unscaled by lr;
    torch's decay is decoupled, lr_t lambda x. optax evaluates beta2_t in float32 whatever the dtype (its step
    count is a float32 array), and so does this rule in that form. Update clipping is the same in both.

    Factored axes: ``factored`` and ndim >= 2, and both factored axes of at least ``min_dim_size_to_factor``
    entries; torch: the last two axes of torch's layout (out, in, k_1, ...), i.e. both axes of a matrix
    (torch.optim.Adafactor factors every array of ndim >= 2: ``min_dim_size_to_factor`` 0), and for a filter
    (k_1, ..., fan_in, fan_out) the two trailing kernel axes (refopt axes :func:`torch_axes`); optax: the
    largest and second largest axes (its default 128 leaves small matrices unfactored). 0-d and 1-D arrays
    keep the full v in both forms. torch's lerp weight 1 - beta2_t is applied as torch's lerp does
    (b - (b - a)(1 - w) for w >= 1/2); torch's row mean is ||G||^2 / n through the norm, as torch computes it.

    Args:
      lr: >= 0 (torch 1e-2). torch: the cap of the relative step and the decay's factor; optax: the step.
      beta2_decay: <= 0, the exponent tau of 1 - beta2_t = (t - t0)^tau (torch's -0.8; optax's decay_rate
        0.8 is -tau).
      eps1: > 0 or None (torch's eps[0]: None = the dtype's machine epsilon; optax's eps 1e-30; None in the
        optax form = 1e-30).
      eps2: >= 0, the floor of the parameter scale (torch's eps[1] 1e-3; optax's fixed 1e-3).
      d: > 0 or None (no clipping), the clipping threshold (torch's d 1.0, optax's clipping_threshold 1.0).
      weight_decay: >= 0 (torch weight_decay, optax weight_decay_rate; 0).
      multiply_by_parameter_scale: True (the step scales with max(eps2, RMS(x))) or False.
      factored: True (factor the arrays that qualify) or False (a full v everywhere).
      min_dim_size_to_factor: int >= 0 (0: any size; optax's default 128).
      decay_offset: int t0 (optax's decay_offset, 0); t - t0 must be >= 1 at every step.
      beta1: None or in [0, 1): optax's momentum (optax form only).
      momentum_dtype: None (x's dtype), 'float32' or 'float64': the dtype m is stored in (optax's
        dtype_momentum, default float32; the step uses m before the cast, as optax's ema does).
      schedule: t -> gamma_t, the lr multiplier (a torch LR scheduler, an optax schedule).
      form: 'torch' or 'optax'.

    Shapes/dtypes: any float32 / float64 array, 0-d included; the factors as :class:`AdafactorState` says, of
    x's dtype; ``m`` like x in ``momentum_dtype``. Means and norms are accumulated in float64 and rounded to
    x's dtype; the step's scalars are in float64 (torch's alpha, the clipping denominator) and cast to x's
    dtype where the peer casts them.

    Raises:
      ValueError: for a hyperparameter out of its range, beta1 / momentum_dtype in the torch form or
      momentum_dtype without beta1, an unknown form; at a step where t - decay_offset < 1 (the decay
      schedule is undefined there; optax gives NaN).
    """

    lr: float = 1e-2
    beta2_decay: float = -0.8
    eps1: float | None = None
    eps2: float = 1e-3
    d: float | None = 1.0
    weight_decay: float = 0.0
    multiply_by_parameter_scale: bool = True
    factored: bool = True
    min_dim_size_to_factor: int = 0
    decay_offset: int = 0
    beta1: float | None = None
    momentum_dtype: str | None = None
    schedule: Callable[[int], float] | None = None
    form: str = "torch"

    State = AdafactorState

    def __post_init__(self):
        _checks.one_of("form", self.form, set(FORMS))
        _checks.nonnegative("lr", self.lr)
        if _checks.finite_number("beta2_decay", self.beta2_decay) > 0:
            raise ValueError(f"beta2_decay must be <= 0, got {self.beta2_decay!r}")
        if self.eps1 is not None:
            _checks.positive("eps1", self.eps1)
        _checks.nonnegative("eps2", self.eps2)
        if self.d is not None:
            _checks.positive("d", self.d)
        _checks.nonnegative("weight_decay", self.weight_decay)
        _checks.boolean("multiply_by_parameter_scale", self.multiply_by_parameter_scale)
        _checks.boolean("factored", self.factored)
        _checks.nonnegative_int("min_dim_size_to_factor", self.min_dim_size_to_factor)
        if isinstance(self.decay_offset, bool) or not isinstance(self.decay_offset, int):
            raise ValueError(f"decay_offset must be an integer, got {self.decay_offset!r}")
        if self.beta1 is not None:
            _checks.unit_interval("beta1", self.beta1)
            if self.form != "optax":
                raise ValueError("beta1 (momentum) is optax.adafactor's option: it needs form='optax' "
                                 "(torch.optim.Adafactor has no momentum)")
        _checks.one_of("momentum_dtype", self.momentum_dtype, set(MOMENTUM_DTYPES))
        if self.momentum_dtype is not None and self.beta1 is None:
            raise ValueError(f"momentum_dtype={self.momentum_dtype!r} needs a momentum (beta1)")
        _checks.schedule(self.schedule)

    # ---- which axes -----------------------------------------------------------------------------------
    def factored_axes(self, shape: tuple) -> tuple[int, int] | None:
        """None (a full v) or the two axes (a, b) factored: torch form (torch's axes -2, -1), optax form
        (the second largest, the largest)."""
        if not self.factored or len(shape) < 2:
            return None
        a, b = torch_axes(len(shape)) if self.form == "torch" else optax_axes(shape)
        if min(shape[a], shape[b]) < self.min_dim_size_to_factor:
            return None
        return a, b

    def _factor_shapes(self, shape: tuple):
        ax = self.factored_axes(shape)
        if ax is None:
            return None
        a, b = ax
        if self.form == "torch":      # keepdims: v_row reduces axis a (torch's -2), v_col axis b (torch's -1)
            return (tuple(1 if i == a else n for i, n in enumerate(shape)),
                    tuple(1 if i == b else n for i, n in enumerate(shape)))
        # optax: v_row without the largest axis b, v_col without the second largest a
        return (tuple(n for i, n in enumerate(shape) if i != b), tuple(n for i, n in enumerate(shape) if i != a))

    def _m_dtype(self, x):
        return np.dtype(self.momentum_dtype) if self.momentum_dtype is not None else x.dtype

    def leaf_spec(self, x, path):
        dt, fs = x.dtype, self._factor_shapes(x.shape)
        empty = ArraySpec((0,), dt)
        m = ArraySpec(x.shape, self._m_dtype(x)) if self.beta1 is not None else empty
        if fs is None:
            return AdafactorState(empty, empty, ArraySpec.like(x), m)
        return AdafactorState(ArraySpec(fs[0], dt), ArraySpec(fs[1], dt), empty, m)

    def init_leaf(self, x, path):
        return AdafactorState(*(np.zeros(a.shape, a.dtype) for a in self.leaf_spec(x, path)))

    def squares_grads(self, s):
        return True

    def decoupled_decay(self):
        return self.weight_decay > 0

    def context(self, t, glob):
        k = t - self.decay_offset
        if k < 1:
            raise ValueError(f"step {t} with decay_offset={self.decay_offset}: t - decay_offset = {k} < 1, where "
                             f"the decay 1 - (t - decay_offset)^beta2_decay is undefined")
        if self.form == "torch":
            return AdafactorContext(t, lr_at(self, t), float(k) ** float(self.beta2_decay), 0.0, 0.0), glob
        b32 = np.float32(1.0) - np.float32(k) ** np.float32(self.beta2_decay)
        return AdafactorContext(t, lr_at(self, t), 0.0, float(b32), float(np.float32(1.0) - b32)), glob

    # ---- the step -------------------------------------------------------------------------------------
    def update_leaf(self, ctx, s, x, g, path):
        if self.form == "torch":
            self._torch_step(ctx, s, x, g)
        else:
            self._optax_step(ctx, s, x, g)
        return x, s

    def _torch_step(self, c, s, x, g):
        d = x.dtype.type
        lr_t = lr_at(self, c.t)                           # float64, as torch's group["lr"]
        rho = min(lr_t, 1.0 / (c.t ** 0.5))
        alpha = (max(float(self.eps2), _rms(x)) if self.multiply_by_parameter_scale else 1.0) * rho
        if self.weight_decay != 0:
            x *= d(1.0 - lr_t * float(self.weight_decay))
        eps1 = float(self.eps1) if self.eps1 is not None else float(np.finfo(x.dtype).eps)
        ax = self.factored_axes(x.shape)
        if ax is not None:
            a, b = ax
            for v, axis in ((s.v_row, a), (s.v_col, b)):   # mean of g^2 through the norm: ||g||^2 / n
                nrm = np.sqrt(np.sum(np.square(g, dtype=np.float64), axis=axis, keepdims=True)).astype(x.dtype)
                v[...] = _lerp(v, nrm * nrm / d(g.shape[axis]), c.w)
            vhat = s.v_col * s.v_row / np.maximum(_mean(s.v_col, a, True), d(eps1))
        else:
            s.v[...] = _lerp(s.v, g * g, c.w)
            vhat = s.v.copy()
        u = (d(1.0) / np.sqrt(np.maximum(vhat, d(eps1 * eps1)))) * g
        den = 1.0 if self.d is None else max(1.0, _rms(u) / float(self.d))
        x += d(-alpha / den) * u

    def _optax_step(self, c, s, x, g):
        d = x.dtype.type
        g2 = g * g + d(1e-30 if self.eps1 is None else self.eps1)
        ax = self.factored_axes(x.shape)
        if ax is not None:
            d1, d0 = ax
            s.v_row[...] = c.beta2_t * s.v_row + c.omb2_t * _mean(g2, d0, False)
            s.v_col[...] = c.beta2_t * s.v_col + c.omb2_t * _mean(g2, d1, False)
            r = s.v_row / _mean(s.v_row, d1 - 1 if d1 > d0 else d1, True)
            u = g * np.expand_dims(d(1.0) / np.sqrt(r), d0) * np.expand_dims(d(1.0) / np.sqrt(s.v_col), d1)
        else:
            s.v[...] = c.beta2_t * s.v + c.omb2_t * g2
            u = g * (d(1.0) / np.sqrt(s.v))
        if self.d is not None:
            u = u / np.maximum(d(1.0), d(_rms(u)) / d(self.d))
        u = c.lr_t * u
        if self.multiply_by_parameter_scale:
            u = u * max(d(_rms(x)), d(self.eps2))
        if self.beta1 is not None:
            u = d(1.0 - self.beta1) * u + s.m.dtype.type(self.beta1) * s.m    # promoted, as optax's ema
            s.m[...] = u
        if self.weight_decay != 0:
            u = u + d(self.weight_decay) * x
        x[...] = x - u
