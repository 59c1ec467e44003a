"""Dion (Ahn, Xu, Abreu & Langford 2025, "Dion: Distributed Orthonormalized Updates", arXiv:2504.05295): an
orthonormal update of rank r from one power iteration per step, warm-started from the previous step's right
factor, with the part of the momentum the low-rank update did not take kept (error feedback)."""
from __future__ import annotations

import numbers
import zlib
from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np

from refopt.core import ArraySpec, Rule
from refopt.rules import _checks
from refopt.rules.muon_shape import ShapeScaledStep, matrix_shape


class DionState(NamedTuple):
    """Per-array state: the momentum ``M`` (shape and dtype of x; the transpose of the paper's m x n buffer) and
    the right factor ``Q`` of shape (fan_in, r) (the paper's n x r)."""

    M: np.ndarray
    Q: np.ndarray


class DionContext(NamedTuple):
    """The scalars of one step (Python float64, cast by the walk): lr*gamma_t, the decay multiplier of x_{t-1},
    1 - mu, eps."""

    lr_t: float
    decay: float
    omm: float
    eps: float


def dion_rank(shape: tuple, rank: int | None) -> int:
    """r = min(rank, fan_in, fan_out) of the (fan_in, fan_out) view (``rank`` None: full rank)."""
    fan_in, fan_out = matrix_shape(shape)
    return min(fan_in, fan_out) if rank is None else min(rank, fan_in, fan_out)


def initial_q(shape: tuple, rank: int | None, seed: int, path: str, dtype) -> np.ndarray:
    """Q_0: standard normal entries of shape (fan_in, r) from ``numpy.random.default_rng([seed, crc32(path)])``
    (so each array of a tree has its own draw and the draw does not depend on the other arrays), in float64,
    each column divided by its norm, cast to ``dtype``."""
    fan_in, _ = matrix_shape(shape)
    rng = np.random.default_rng([seed, zlib.crc32(path.encode())])
    q = rng.standard_normal((fan_in, dion_rank(shape, rank)))
    return (q / np.linalg.norm(q, axis=0, keepdims=True)).astype(dtype)


@dataclass(frozen=True)
class Dion(ShapeScaledStep, Rule):
    r"""Dion (Ahn et al. 2025, arXiv:2504.05295, Algorithm 1, centralized): a rank-r orthonormal update.

    The paper's matrix is the m x n = (fan_out, fan_in) weight (torch's (out, in); refopt's (fan_in, fan_out)
    view of :func:`refopt.rules.muon.matrix_shape` transposed). At step t (t = 1 first), gamma_t = schedule(t),
    with B, M, G of shape m x n and Q of shape n x r:

    .. math::

        B_t &= M_{t-1} + G_t \qquad (M_0 = 0) \\
        P_t &= \mathrm{orth}(B_t Q_{t-1}) \qquad \text{(the Q factor of a reduced QR, m x r)} \\
        R_t &= B_t^\top P_t \qquad (n \times r) \\
        M_t &= B_t - (1 - \mu)\, P_t R_t^\top \qquad \text{(error feedback)} \\
        Q_t &= R_t \,/\, (\|R_t\|_{\mathrm{col}} + \epsilon) \qquad \text{(each column to unit norm)} \\
        x_t &= (1 - \mathrm{lr}\,\gamma_t\,\lambda)\, x_{t-1} - \mathrm{lr}\,\gamma_t\, s\, P_t Q_t^\top

    with s = sqrt(m / n) = sqrt(fan_out / fan_in) (``scale='spectral'``; any :func:`refopt.rules.muon.muon_scale`).
    At r = min(m, n), P_t spans the range of B_t, so P_t R_t^T = B_t and M_t = mu B_t (momentum). The signs the QR
    picks cancel in P_t R_t^T and P_t Q_t^T. Q_0 is drawn by :func:`initial_q` from ``seed`` and the array's path.
    P_t is computed by ``numpy.linalg.qr`` (LAPACK Householder, deterministic for a given BLAS).
    The direction (:func:`refopt.direction`) is u_t = s (P_t Q_t^T) in refopt's layout.

    Shapes/dtypes: float32 / float64 arrays with ndim >= 2; M like x, Q (fan_in, r); the arithmetic in x's dtype.

    Args:
      lr: peak learning rate eta >= 0.
      momentum: mu in [0, 1).
      rank: r >= 1, capped at min(fan_in, fan_out); None (default) is full rank.
      eps: > 0, added to each column norm of R_t (default 1e-8; it keeps a zero column of R_t at 0).
      scale: the shape scale s (default 'spectral', the paper's sqrt(m/n)).
      weight_decay: lambda >= 0, decoupled.
      seed: the int that draws Q_0.
      schedule: optional t -> gamma_t >= 0.

    Raises:
      ValueError: for bad hyperparameters (naming the field) and, at :func:`refopt.init`, for a
        parameter with ndim < 2 (naming its path; route vectors to AdamW with refopt.Partition).
    """

    lr: float = 0.01
    momentum: float = 0.95
    rank: int | None = None
    eps: float = 1e-8
    scale: str = "spectral"
    weight_decay: float = 0.0
    seed: int = 0
    schedule: Callable[[int], float] | None = None

    def __post_init__(self):
        _checks.nonnegative("lr", self.lr)
        _checks.unit_interval("momentum", self.momentum)
        if self.rank is not None and (isinstance(self.rank, bool) or not isinstance(self.rank, numbers.Integral)
                                      or self.rank < 1):
            raise ValueError(f"rank must be None or an int >= 1, got {self.rank!r}")
        _checks.positive("eps", self.eps)
        _checks.one_of("scale", self.scale, {"spectral", "jordan", "rms_match", "none"})
        _checks.nonnegative("weight_decay", self.weight_decay)
        if isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral) or self.seed < 0:
            raise ValueError(f"seed must be an int >= 0, got {self.seed!r}")
        if self.rank is not None:
            object.__setattr__(self, "rank", int(self.rank))
        object.__setattr__(self, "seed", int(self.seed))
        _checks.schedule(self.schedule)

    def init_leaf(self, x, path):
        if x.ndim < 2:
            raise ValueError(f"Dion takes matrices (ndim >= 2); the parameter at {path} has shape {x.shape}. "
                             f"Route vectors and scalars (biases, gains) to AdamW with refopt.Partition.")
        return DionState(np.zeros_like(x), initial_q(x.shape, self.rank, self.seed, path, x.dtype))

    def leaf_spec(self, x, path):
        return DionState(ArraySpec.like(x), ArraySpec((matrix_shape(x.shape)[0], dion_rank(x.shape, self.rank)),
                                                      x.dtype))

    def decoupled_decay(self):
        return self.weight_decay > 0

    def squares_grads(self, s):
        """R_t's column norms square entries of order |g| / (1 - mu): the gate keeps |g| where they are finite."""
        return True

    def context(self, t, glob):
        lr_t = float(self.lr) * _checks.schedule_multiplier(self.schedule, t)
        return DionContext(lr_t, 1.0 - lr_t * self.weight_decay, 1.0 - float(self.momentum), float(self.eps)), glob

    def _update(self, c: DionContext, s: DionState, x: np.ndarray, g: np.ndarray) -> np.ndarray:
        """Advance M and Q in place; return P_t Q_t^T transposed to the (fan_in, fan_out) view, a new array."""
        view = matrix_shape(x.shape)
        B = (s.M.reshape(view) + g.reshape(view)).T          # the paper's m x n
        P, _ = np.linalg.qr(B @ s.Q)
        R = B.T @ P
        s.M.reshape(view)[...] = (B - c.omm * (P @ R.T)).T
        s.Q[...] = R / (np.linalg.norm(R, axis=0, keepdims=True) + c.eps)
        return np.ascontiguousarray((P @ s.Q.T).T)
