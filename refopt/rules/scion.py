"""Scion (Pethick, Xie, Erdogan, Antonakopoulos, Silveti-Falls & Cevher 2025, "Training Deep Learning Models with
Norm-Constrained LMOs", arXiv:2502.07529): momentum averaged with weight alpha on the new gradient, and the step
the linear minimization oracle (LMO) of a norm ball of radius rho at that average, unconstrained (uScion) or as a
conditional-gradient (Frank-Wolfe) step (Scion)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import numpy as np

from refopt.core import ArraySpec, Rule
from refopt.rules import _checks
from refopt.rules.muon import Muon
from refopt.rules.muon_shape import matrix_shape

LMOS = ("auto", "spectral", "sign", "bias_rms")


class ScionState(NamedTuple):
    """Per-array state: the averaged gradient ``d`` (shape and dtype of x)."""

    d: np.ndarray


class ScionContext(NamedTuple):
    """The scalars of one step (Python float64, cast by the walk)."""

    lr_t: float
    decay: float       # 1 - lr_t * weight_decay (before the average), 1 without decay
    shrink: float      # 1 - lr_t with constraint (Frank-Wolfe), else 1
    alpha: float
    rho: float


@dataclass(frozen=True)
class Scion(Rule):
    r"""Scion (Pethick et al. 2025, arXiv:2502.07529) in pytorch_optimizer's form (``SCION``).

    At step t (t = 1 first), gamma_t = schedule(t), lr_t = lr gamma_t, alpha = momentum (the weight of the new
    gradient), rho = scale:

    .. math::

        d_t &= d_{t-1} + \alpha\, (g_t - d_{t-1}) \qquad (d_0 = 0;\ \text{for } \alpha \ge 0.5 \text{ computed as }
        g_t - (1 - \alpha)(g_t - d_{t-1}), \text{ torch's lerp}) \\
        x_t &= c_t\, (1 - \mathrm{lr}_t \lambda)\, x_{t-1} - \mathrm{lr}_t\, \rho\, \mathrm{lmo}(d_t),
        \qquad c_t = 1 - \mathrm{lr}_t \text{ with } \texttt{constraint}, \text{ else } 1

    with the decay lambda only without ``constraint`` (the Frank-Wolfe step x_t = (1 - lr_t) x_{t-1} - lr_t rho
    lmo(d_t) keeps x in the ball of radius rho; there the package ignores its weight_decay and refopt refuses one).
    The oracles, each the negative of the paper's argmin direction (the step subtracts it), on refopt's
    (fan_in, fan_out) layout:

    * ``'spectral'`` (2-D): msign(d) s with s = sqrt(fan_out / fan_in) (``spectral_scale='fan_ratio'``, the
      paper's) or sqrt(fan_out) (``'fan_out'``, the package's ``normalize=False`` for input layers), and
      ``max_scale``: max(1, s). msign by :func:`refopt.msign` (Newton-Schulz with the package's Jordan
      coefficients and max(||d||_F, 1e-7) normalisation by default, or 'svd').
    * ``'sign'`` (2-D): sign(d) / fan_in (``sign_normalize``; else sign(d)).
    * ``'bias_rms'`` (0-D, 1-D): d / (RMS(d) + eps).
    * ``'auto'``: 'bias_rms' for ndim <= 1, 'spectral' for matrices.

    The direction (:func:`refopt.direction`) is u_t = rho lmo(d_t).

    Shapes/dtypes: float32 / float64; d like x; 'spectral' and 'sign' take 2-D arrays, 'bias_rms' 0-D and 1-D
    (ValueError at :func:`refopt.init` naming the path otherwise).

    Args:
      lr: >= 0 (1e-3); momentum: alpha in (0, 1] (0.1); scale: rho > 0 (1); constraint: the Frank-Wolfe step
        (False: uScion); weight_decay: lambda >= 0, decoupled, only without constraint (0); lmo: one of
        :data:`LMOS` ('auto'); spectral_scale: 'fan_ratio' | 'fan_out'; max_scale: bool; sign_normalize: bool;
        eps: > 0, the RMS's (1e-8); msign, ns_coeffs, ns_steps, eps_mode, norm_eps: as :class:`refopt.Muon`
        (defaults: pytorch_optimizer's Newton-Schulz); schedule: optional t -> gamma_t.

    Presets: ``refopt.like("pytorch_optimizer.SCION", ...)`` (refopt/conventions/scion.py).

    Raises:
      ValueError: for bad hyperparameters (naming the field), weight_decay > 0 with constraint, and at
        :func:`refopt.init` an array the oracle does not take (naming its path).
    """

    lr: float = 1e-3
    momentum: float = 0.1
    scale: float = 1.0
    constraint: bool = False
    weight_decay: float = 0.0
    lmo: str = "auto"
    spectral_scale: str = "fan_ratio"
    max_scale: bool = False
    sign_normalize: bool = True
    eps: float = 1e-8
    msign: str = "newton_schulz"
    ns_coeffs: Any = "jordan"
    ns_steps: int = 5
    eps_mode: str = "clamp"
    norm_eps: float = 1e-7
    schedule: Callable[[int], float] | None = None

    def __post_init__(self):
        _checks.nonnegative("lr", self.lr)
        a = _checks.finite_number("momentum", self.momentum)
        if not 0.0 < a <= 1.0:
            raise ValueError(f"momentum must be in (0, 1] (the weight of the new gradient), got {self.momentum!r}")
        _checks.positive("scale", self.scale)
        _checks.boolean("constraint", self.constraint)
        _checks.nonnegative("weight_decay", self.weight_decay)
        if self.constraint and self.weight_decay > 0:
            raise ValueError("weight_decay must be 0 with constraint=True: the Frank-Wolfe step shrinks x by "
                             "(1 - lr) itself (pytorch_optimizer ignores its weight_decay there)")
        _checks.one_of("lmo", self.lmo, set(LMOS))
        _checks.one_of("spectral_scale", self.spectral_scale, {"fan_ratio", "fan_out"})
        _checks.boolean("max_scale", self.max_scale)
        _checks.boolean("sign_normalize", self.sign_normalize)
        _checks.positive("eps", self.eps)
        muon = Muon(lr=1.0, momentum=0.0, nesterov=False, msign=self.msign, ns_coeffs=self.ns_coeffs,
                    ns_steps=self.ns_steps, eps_mode=self.eps_mode, norm_eps=self.norm_eps, scale="none")
        object.__setattr__(self, "ns_coeffs", muon.ns_coeffs)
        object.__setattr__(self, "_rows", muon._rows)
        _checks.schedule(self.schedule)

    def _kind(self, x) -> str:
        if self.lmo != "auto":
            return self.lmo
        return "bias_rms" if x.ndim <= 1 else "spectral"

    def init_leaf(self, x, path):
        kind = self._kind(x)
        if (kind == "bias_rms") != (x.ndim <= 1) or x.ndim > 2:
            takes = "0-D and 1-D arrays" if kind == "bias_rms" else "matrices"
            raise ValueError(f"Scion's '{kind}' oracle takes {takes}; the parameter at {path} has shape {x.shape}. "
                             f"Give it another oracle (lmo=...) with refopt.Partition.")
        return ScionState(np.zeros_like(x))

    def leaf_spec(self, x, path):
        return ScionState(ArraySpec.like(x))

    def decoupled_decay(self):
        return self.weight_decay > 0 or self.constraint

    def context(self, t, glob):
        lr_t = float(self.lr) * _checks.schedule_multiplier(self.schedule, t)
        return ScionContext(lr_t, 1.0 - lr_t * float(self.weight_decay), 1.0 - lr_t if self.constraint else 1.0,
                            float(self.momentum), float(self.scale)), glob

    def _oracle(self, d: np.ndarray) -> np.ndarray:
        """lmo(d) (the package's sign convention: the step subtracts it), a new array."""
        from refopt.linalg._msign import _msign_svd, newton_schulz

        kind = self._kind(d)
        if kind == "bias_rms":
            rms = math.sqrt(float(np.mean(d.astype(np.float64) ** 2))) if d.size else 0.0
            return d / d.dtype.type(rms + self.eps)
        fan_in, fan_out = matrix_shape(d.shape)
        if kind == "sign":
            return np.sign(d) / d.dtype.type(fan_in) if self.sign_normalize else np.sign(d)
        O = _msign_svd(d, None) if self.msign == "svd" else newton_schulz(d, self._rows, self.eps_mode,
                                                                           self.norm_eps, 1.0)
        s = math.sqrt(fan_out / fan_in) if self.spectral_scale == "fan_ratio" else math.sqrt(fan_out)
        if self.max_scale:
            s = max(1.0, s)
        return O * d.dtype.type(s)

    def _direction(self, c: ScionContext, s: ScionState, g: np.ndarray) -> np.ndarray:
        if c.alpha < 0.5:               # torch's lerp: the two forms round differently
            s.d[...] = s.d + c.alpha * (g - s.d)
        else:
            s.d[...] = g - (g - s.d) * (1.0 - c.alpha)
        return c.rho * self._oracle(s.d)

    def update_leaf(self, ctx, s, x, g, path):
        if ctx.decay != 1:
            x *= ctx.decay
        u = self._direction(ctx, s, g)
        if ctx.shrink != 1:
            x *= ctx.shrink
        x -= ctx.lr_t * u
        return x, s

    def direction_leaf(self, ctx, s, x, g, path):
        return self._direction(ctx, s, g), s
