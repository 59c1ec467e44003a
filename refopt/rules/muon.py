"""Muon: momentum orthogonalised by msign, with muP / Jordan / Moonlight shape scales (post 003)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, NamedTuple

import numba
import numpy as np

from refopt.core import ArraySpec, Rule
from refopt.kernels import Elementwise
from refopt.linalg._msign import (_check_norm_options, _msign_svd, check_bounded_schedule, newton_schulz,
                                  ns_coefficients)
from refopt.rules import _checks
from refopt.rules.muon_shape import _SCALES, ShapeScaledStep, matrix_shape, muon_scale  # noqa: F401 (re-exported)


class MuonState(NamedTuple):
    """Per-array Muon state: the EMA momentum ``m`` (shape and dtype of x)."""

    m: np.ndarray


class MuonContext(NamedTuple):
    """The scalars of one step (Python float64, cast by the walk): lr*gamma_t, the decay multiplier of
    x_{t-1}, the momentum EMA weights, and the weights of m_t and g_t in the msign input."""

    lr_t: float
    decay: float
    momentum: float
    omm: float       # 1 - momentum
    w_m: float
    w_g: float
    u_scale: float   # 1 (the momentum kernel's output is M_t itself)


@numba.njit
def _momentum(x, g, s, i, c):
    """m_t = mu m_{t-1} + (1 - mu) g_t (written); returns the msign input M_t = w_m m_t + w_g g_t."""
    m = c.momentum * s.m[i] + c.omm * g
    s.m[i] = m
    return c.w_m * m + c.w_g * g


_MOMENTUM = Elementwise(_momentum, "muon_momentum")


@dataclass(frozen=True)
class Muon(ShapeScaledStep, Rule):
    r"""Muon (Jordan et al. 2024; post 003): msign of the momentum, scaled by the layer shape.

    At step t (t = 1 first), gamma_t = schedule(t), mu = momentum, s = :func:`muon_scale`:

    .. math::

        m_t &= \mu\, m_{t-1} + (1 - \mu)\, g_t \qquad \text{(EMA momentum, } m_0 = 0\text{)} \\
        M_t &= \begin{cases} (1 - \mu)\, g_t + \mu\, m_t & \text{if nesterov} \\ m_t & \text{otherwise} \end{cases}
        \qquad \text{(standard)} \\
        M_t &= \begin{cases} \dfrac{\mu\, m_t}{1 - \mu^{t+1}} + \dfrac{(1 - \mu)\, g_t}{1 - \mu^t} &
        \text{if nesterov} \\ \dfrac{m_t}{1 - \mu^t} & \text{otherwise} \end{cases} \qquad \text{(bias-corrected)} \\
        O_t &= \mathrm{msign}(M_t) \\
        x_t &= (1 - r_t \lambda)\, x_{t-1} - \mathrm{lr}\, \gamma_t\, s\, O_t

    where the first M_t is nesterov_mode='standard' (KJ, torch) and the second
    nesterov_mode='bias_corrected' (optax), msign is taken on the 2-D view (fan_in, fan_out) of
    :func:`matrix_shape`, and
    r_t = lr*gamma_t ('decoupled', MuonWD / torch AdamW convention, x_{t-1} pre-update) or
    r_t = gamma_t ('independent', lambda a per-step rate). The weight decay is not multiplied by s
    (as torch, KJ, Moonlight and optax). The direction (:func:`refopt.direction`) is u_t = s * O_t (the
    scale s is included in u; Hyperball and Covariant normalise u, so it cancels there).

    Layout: (fan_in, fan_out) (``x @ W``), as optax; ndim > 2 is stepped on its 2-D view and returned in
    its shape (PITFALLS B07). torch's (out, in) weight is the transpose, and msign(G^T) = msign(G)^T.
    The momentum EMA and the step are numba elementwise kernels; msign is BLAS matmuls in x's dtype.

    Args:
      lr: peak learning rate eta >= 0 (with scale='spectral', the spectral norm of the step is lr*s).
      momentum: mu in [0, 1).
      nesterov: use the Nesterov input M_t above (default True, as all peers).
      msign: 'newton_schulz' (default) or 'svd' (exact polar factor, rank-aware; see refopt.msign).
      ns_coeffs, ns_steps: Newton-Schulz schedule: a preset ('jordan', 'polar_express', 'you',
        'classic'), one (a, b, c) row or a list of rows (truncated to ns_steps rows or last row repeated);
        ns_steps an int in [1, 100).
      scale: 'spectral' (default), 'jordan', 'jordan_4d' (KellerJordan's conv-filter scale from the 4-D
        shape), 'rms_match' or 'none' (see :func:`muon_scale`).
      weight_decay: lambda >= 0 (<= 1 in 'independent' mode).
      wd_mode: 'decoupled' or 'independent'.
      nesterov_mode: 'standard' (KJ, torch, NVIDIA) or 'bias_corrected' (optax.contrib.muon).
      eps_mode, norm_eps, norm_factor: Newton-Schulz pre-normalisation (refopt.msign): 'none' (exact,
        scale invariant, default), 'add' (``X/(f||X||_F + eps)``: KJ 1e-7, optax 1e-8) or 'clamp'
        (``X/max(f||X||_F, eps)``: torch 1e-7).
      schedule: optional t -> gamma_t >= 0.
      msign_backend: 'cpu' (default) or 'cuda' (the numba-CUDA Newton-Schulz of :func:`refopt.msign`;
        needs ``pip install "refopt[cuda]"`` and a GPU; the rest of the step stays on the CPU).

    Presets: :meth:`like_torch`, :meth:`like_optax` (refopt/conventions/muon.py).

    Shapes/dtypes: float32 / float64 arrays with ndim >= 2; m like x; all arithmetic in x's dtype.

    Raises:
      ValueError: for bad hyperparameters (naming the field) and, at :func:`refopt.init`, for a
        parameter with ndim < 2 (naming its path; route vectors to AdamW with refopt.Partition).
    """

    lr: float = 0.02
    momentum: float = 0.95
    nesterov: bool = True
    msign: str = "newton_schulz"
    ns_coeffs: Any = "jordan"
    ns_steps: int = 5
    scale: str = "spectral"
    weight_decay: float = 0.0
    wd_mode: str = "decoupled"
    nesterov_mode: str = "standard"
    eps_mode: str = "none"
    norm_eps: float = 0.0
    norm_factor: float = 1.0
    schedule: Callable[[int], float] | None = None
    msign_backend: str = "cpu"

    def __post_init__(self):
        _checks.nonnegative("lr", self.lr)
        _checks.one_of("msign_backend", self.msign_backend, {"cpu", "cuda"})
        if self.msign_backend == "cuda" and self.msign == "svd":
            raise ValueError("msign_backend='cuda' runs Newton-Schulz only; msign='svd' runs on the CPU")
        _checks.unit_interval("momentum", self.momentum)
        _checks.boolean("nesterov", self.nesterov)
        _checks.one_of("msign", self.msign, {"newton_schulz", "svd"})
        if isinstance(self.ns_steps, bool) or not isinstance(self.ns_steps, int) or not 1 <= self.ns_steps < 100:
            raise ValueError(f"ns_steps must be an int in [1, 100), got {self.ns_steps!r}")
        try:  # the per-step rows, resolved once (not per leaf per step)
            object.__setattr__(self, "_rows", ns_coefficients(self.ns_coeffs, self.ns_steps))
        except ValueError as e:
            raise ValueError(f"ns_coeffs: {e}") from None
        check_bounded_schedule(self._rows)
        if not isinstance(self.ns_coeffs, str):     # store rows as tuples: hashable, JSON-friendly
            c = self.ns_coeffs
            c = tuple(float(v) for v in c) if len(c) == 3 and not hasattr(c[0], "__len__") else \
                tuple(tuple(float(v) for v in r) for r in c)
            object.__setattr__(self, "ns_coeffs", c)
        _checks.one_of("scale", self.scale, set(_SCALES))
        _checks.nonnegative("weight_decay", self.weight_decay)
        _checks.one_of("wd_mode", self.wd_mode, {"decoupled", "independent"})
        if self.wd_mode == "independent" and self.weight_decay > 1:
            raise ValueError(f"independent weight_decay is a per-step rate and must be <= 1, got {self.weight_decay}")
        _checks.one_of("nesterov_mode", self.nesterov_mode, {"standard", "bias_corrected"})
        _check_norm_options(self.eps_mode, self.norm_eps, self.norm_factor)
        _checks.schedule(self.schedule)

    # ---- presets reproducing the peers -------------------------------------------------------------
    @classmethod
    def like_torch(cls, lr: float = 1e-3, **kw) -> "Muon":
        """``refopt.like("torch.optim.Muon", lr=lr, ...)`` (torch's argument names and defaults; the mapping
        is in refopt/conventions/muon.py); refopt fields (e.g. ``schedule``) may be given too. Apply it to
        the TRANSPOSES of torch's (out, in) arrays; torch runs Newton-Schulz in bfloat16, refopt in the
        parameter dtype."""
        return cls._like("torch.optim.Muon", dict(lr=lr, **kw))

    @classmethod
    def like_optax(cls, learning_rate: float, **kw) -> "Muon":
        """``refopt.like("optax.contrib.muon", learning_rate=..., ...)`` (optax's argument names and
        defaults; refopt/conventions/muon.py); refopt fields (e.g. ``schedule``) may be given too."""
        return cls._like("optax.contrib.muon", dict(learning_rate=learning_rate, **kw))

    @classmethod
    def _like(cls, peer: str, kw: dict) -> "Muon":
        from refopt.conventions import peers
        mapping = peers()[peer]
        own = {k: kw.pop(k) for k in list(kw) if k in cls.__dataclass_fields__ and k not in mapping.defaults
               and k not in mapping.required}
        rule = mapping.rule(**kw)
        return replace(rule, **own) if own else rule

    # ---- hooks ----------------------------------------------------------------------------------------
    def init_leaf(self, x, path):
        if x.ndim < 2:
            raise ValueError(f"Muon takes matrices (ndim >= 2); the parameter at {path} has shape {x.shape}. "
                             f"Route vectors and scalars (biases, gains) to AdamW with refopt.Partition.")
        muon_scale(x.shape, self.scale)   # raises for shapes the scale does not take ('jordan_4d')
        return MuonState(np.zeros_like(x))

    def leaf_spec(self, x, path):
        return MuonState(ArraySpec.like(x))

    def decoupled_decay(self):
        return self.weight_decay > 0

    def context(self, t, glob):
        gamma = _checks.schedule_multiplier(self.schedule, t)
        lr_t = float(self.lr) * gamma
        decay = 1.0 - (lr_t if self.wd_mode == "decoupled" else gamma) * self.weight_decay
        mu = float(self.momentum)
        if self.nesterov_mode == "standard":
            w_m, w_g = (mu, 1.0 - mu) if self.nesterov else (1.0, 0.0)
        elif self.nesterov:
            w_m, w_g = mu / (1.0 - mu ** (t + 1)), (1.0 - mu) / (1.0 - mu ** t)
        else:
            w_m, w_g = 1.0 / (1.0 - mu ** t), 0.0
        return MuonContext(lr_t, decay, mu, 1.0 - mu, w_m, w_g, 1.0), glob

    def prepare(self, ctx, ss, xs, gs, paths):
        gs = super().prepare(ctx, ss, xs, gs, paths)   # the per-array step scalars, before any array is written
        self._check_msign_backend(xs)
        return gs

    def _check_msign_backend(self, xs) -> None:
        """With msign_backend='cuda': numba-cuda and a GPU are there (raises before anything is written)."""
        if self.msign_backend == "cuda" and self.msign != "svd" and xs:
            from refopt.fast import msign_cuda
            msign_cuda._cuda()

    def _orthogonalised(self, c: MuonContext, s: MuonState, x: np.ndarray, g: np.ndarray) -> np.ndarray:
        """Advance m in place and return O_t = msign(M_t) on the 2-D view, as a new (fan_in, fan_out) array."""
        M = np.empty(g.shape, g.dtype)
        _MOMENTUM.direction(M, x, g, s, c)
        M = M.reshape(matrix_shape(g.shape))
        if self.msign == "svd":
            return _msign_svd(M, None)
        if self.msign_backend == "cuda":
            return newton_schulz(M, self._rows, self.eps_mode, self.norm_eps, self.norm_factor, backend="cuda")
        return newton_schulz(M, self._rows, self.eps_mode, self.norm_eps, self.norm_factor)

    def _update(self, c, s, x, g):
        return self._orthogonalised(c, s, x, g)
