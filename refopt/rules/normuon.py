"""NorMuon (Li, Liu, Liang, Chen, Zhao & Chen 2025, "NorMuon: Making Muon more efficient and scalable",
arXiv:2510.05491): Muon's orthogonalised momentum O_t, each output neuron's row of O_t divided by the root of
an EMA of its mean square, then rescaled to a fixed Frobenius norm."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import numpy as np

from refopt.core import ArraySpec, Rule
from refopt.linalg.norms import fro_norm
from refopt.rules import _checks
from refopt.rules.muon import Muon, MuonState
from refopt.rules.muon_shape import ShapeScaledStep, matrix_shape

UPDATE_SCALES = ("match_rms", "preserve_norm")


class NorMuonState(NamedTuple):
    """Per-array state: the EMA momentum ``m`` (shape and dtype of x) and the per-neuron second moment ``v`` of
    shape (1, fan_out) (one entry per output neuron of the (fan_in, fan_out) view; torch's (out, 1) transposed)."""

    m: np.ndarray
    v: np.ndarray


class NorMuonContext(NamedTuple):
    """The scalars of one step (Python float64, cast by the walk): Muon's (lr*gamma_t, the decay multiplier,
    the momentum EMA weights, the weights of m_t and g_t in the msign input, u_scale 1) and beta2, 1 - beta2,
    eps."""

    lr_t: float
    decay: float
    momentum: float
    omm: float
    w_m: float
    w_g: float
    u_scale: float
    beta2: float
    omb2: float
    eps: float


@dataclass(frozen=True)
class NorMuon(ShapeScaledStep, Rule):
    r"""NorMuon (Li et al. 2025, arXiv:2510.05491, Algorithm 1): Muon with a per-neuron second moment.

    At step t (t = 1 first), gamma_t = schedule(t), mu = momentum, on the 2-D (fan_in, fan_out) view
    (:func:`refopt.rules.muon.matrix_shape`), with O_t = msign(M_t) and M_t as :class:`refopt.Muon`
    (nesterov_mode 'standard'):

    .. math::

        v_t &= \beta_2\, v_{t-1} + (1 - \beta_2)\, \tfrac{1}{\mathrm{fan\_in}} \textstyle\sum_i O_{t,ij}^2
        \qquad (v \in \mathbb{R}^{1 \times \mathrm{fan\_out}},\ v_0 = 0) \\
        \hat O_t &= O_t \,/\, (\sqrt{v_t} + \epsilon) \qquad \text{(each output neuron's entries)} \\
        \rho_t &= \begin{cases} 0.2 \sqrt{\mathrm{fan\_in}\, \mathrm{fan\_out}} \,/\, (\|\hat O_t\|_F + \epsilon)
        & \text{update\_scale='match\_rms'} \\ \|O_t\|_F \,/\, (\|\hat O_t\|_F + \epsilon)
        & \text{update\_scale='preserve\_norm'} \end{cases} \\
        x_t &= (1 - \mathrm{lr}\,\gamma_t\, \lambda)\, x_{t-1} - \mathrm{lr}\, \gamma_t\, s\, \rho_t\, \hat O_t

    with s = :func:`refopt.rules.muon.muon_scale` of ``scale``. 'match_rms' (the default, with scale 'none') is the
    paper's Algorithm 1: the update's RMS is 0.2. 'preserve_norm' with scale 'jordan' is the authors' code
    (ShizukaKuze/NorMuon) and pytorch_optimizer's default: the update keeps the Frobenius norm of O_t.
    The direction (:func:`refopt.direction`) is u_t = s rho_t hat O_t. The neuron of torch's (out, in) weight
    is its row; here it is a column of the (fan_in, fan_out) view.

    Shapes/dtypes: float32 / float64 arrays with ndim >= 2; m like x, v (1, fan_out) in x's dtype; the
    arithmetic in x's dtype, the two Frobenius norms accumulated in float64 (:func:`refopt.linalg.fro_norm`)
    and rho_t cast to x's dtype.

    Args:
      lr: peak learning rate eta >= 0.
      momentum: mu in [0, 1).
      beta2: the second moment's EMA weight in [0, 1).
      eps: > 0, added to sqrt(v_t) and to ||hat O_t||_F (default 1e-10, as the authors' code).
      update_scale: 'match_rms' or 'preserve_norm' (above).
      scale: Muon's shape scale s: 'none' (default), 'spectral', 'jordan', 'rms_match'
        (:func:`refopt.rules.muon.muon_scale`).
      weight_decay: lambda >= 0, decoupled (x_{t-1} multiplied by 1 - lr gamma_t lambda).
      nesterov, msign, ns_coeffs, ns_steps, eps_mode, norm_eps, norm_factor, msign_backend: the msign of
        M_t, as :class:`refopt.Muon`.
      schedule: optional t -> gamma_t >= 0.

    Presets: ``refopt.like("pytorch_optimizer.NorMuon", ...)`` (refopt/conventions/normuon.py).

    Raises:
      ValueError: for bad hyperparameters (naming the field) and, at :func:`refopt.init`, for a
        parameter with ndim < 2 (naming its path; route vectors to AdamW with refopt.Partition).
    """

    lr: float = 0.02
    momentum: float = 0.95
    beta2: float = 0.95
    eps: float = 1e-10
    update_scale: str = "match_rms"
    scale: str = "none"
    weight_decay: float = 0.0
    nesterov: bool = True
    msign: str = "newton_schulz"
    ns_coeffs: Any = "jordan"
    ns_steps: int = 5
    eps_mode: str = "none"
    norm_eps: float = 0.0
    norm_factor: float = 1.0
    schedule: Callable[[int], float] | None = None
    msign_backend: str = "cpu"

    def __post_init__(self):
        # Muon checks and resolves the msign fields, the shape scale, lr, momentum, decay and schedule
        muon = Muon(lr=self.lr, momentum=self.momentum, nesterov=self.nesterov, msign=self.msign,
                    ns_coeffs=self.ns_coeffs, ns_steps=self.ns_steps, scale=self.scale, weight_decay=self.weight_decay,
                    eps_mode=self.eps_mode, norm_eps=self.norm_eps, norm_factor=self.norm_factor,
                    schedule=self.schedule, msign_backend=self.msign_backend)
        object.__setattr__(self, "ns_coeffs", muon.ns_coeffs)
        object.__setattr__(self, "_muon", muon)
        _checks.unit_interval("beta2", self.beta2)
        _checks.positive("eps", self.eps)
        _checks.one_of("update_scale", self.update_scale, set(UPDATE_SCALES))

    def init_leaf(self, x, path):
        if x.ndim < 2:
            raise ValueError(f"NorMuon takes matrices (ndim >= 2); the parameter at {path} has shape {x.shape}. "
                             f"Route vectors and scalars (biases, gains) to AdamW with refopt.Partition.")
        self._muon.init_leaf(x, path)      # the shape scale's own refusals
        return NorMuonState(np.zeros_like(x), np.zeros((1, matrix_shape(x.shape)[1]), x.dtype))

    def leaf_spec(self, x, path):
        return NorMuonState(ArraySpec.like(x), ArraySpec((1, matrix_shape(x.shape)[1]), x.dtype))

    def decoupled_decay(self):
        return self.weight_decay > 0

    def context(self, t, glob):
        c, glob = self._muon.context(t, glob)
        b2 = float(self.beta2)
        return NorMuonContext(*c, b2, 1.0 - b2, float(self.eps)), glob

    def prepare(self, ctx, ss, xs, gs, paths):
        gs = super().prepare(ctx, ss, xs, gs, paths)   # the per-array step scalars, before any array is written
        self._muon._check_msign_backend(xs)
        return gs

    def _update(self, c: NorMuonContext, s: NorMuonState, x: np.ndarray, g: np.ndarray) -> np.ndarray:
        """Advance m and v in place; return rho_t hat O_t on the (fan_in, fan_out) view, a new array."""
        O = self._muon._orthogonalised(c, MuonState(s.m), x, g)
        s.v[...] = c.beta2 * s.v + c.omb2 * np.mean(O * O, axis=0, keepdims=True)
        O_hat = O / (np.sqrt(s.v) + c.eps)
        n_hat = fro_norm(O_hat) + float(self.eps)
        if self.update_scale == "match_rms":
            fan_in, fan_out = O.shape
            rho = 0.2 * math.sqrt(fan_in * fan_out) / n_hat
        else:
            rho = fro_norm(O) / n_hat
        O_hat *= x.dtype.type(rho)
        return O_hat
