"""SOAP (Vyas et al. 2024, "SOAP: Improving and Stabilizing Shampoo using Adam", arXiv:2409.11321): Adam run in
the eigenbasis of Shampoo's Kronecker factors, the eigenbasis refreshed every few steps by one power iteration and
a QR decomposition."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np

from refopt.core import ArraySpec, Rule
from refopt.linalg.eigen import CLUSTER_ULPS, complete_basis, eigh_descending, zero_rows
from refopt.rules import _checks


class SOAPState(NamedTuple):
    """Per-array state: the first moment ``m`` in the parameter's own basis and the second moment ``v`` in the
    eigenbasis (each like x), and per preconditioned axis i (:func:`soap_axes`) its Kronecker factor
    ``GG[i]`` (n_i x n_i, the EMA of G_(i) G_(i)^T) and eigenbasis ``Q[i]`` (n_i x n_i, columns in descending
    order of eigenvalue). Axes that are not preconditioned have no entry."""

    m: np.ndarray
    v: np.ndarray
    GG: tuple
    Q: tuple


class SOAPContext(NamedTuple):
    """The scalars of one step (Python float64, cast by the walk)."""

    first: bool        # t = 1: the factors and the eigenbasis from g_1, no step
    refresh: bool      # the eigenbasis refreshed after this step
    lr_t: float
    decay: float       # 1 - lr_t * weight_decay, applied after the step
    step: float        # lr_t sqrt(1 - beta2^k) / (1 - beta1^k), k = t - 1 (lr_t without bias correction)
    u_scale: float     # step / lr_t
    beta1: float
    omb1: float
    beta2: float
    omb2: float
    shampoo_beta: float
    omsb: float
    eps: float


def soap_axes(shape: tuple, max_precond_dim: int, precondition_1d: bool) -> tuple[int, ...]:
    """The axes of an array of this shape that SOAP preconditions: every axis of size <= max_precond_dim of an
    array with ndim >= 2; of a 1-D array only with ``precondition_1d``; none of a 0-d array."""
    if len(shape) == 1 and not precondition_1d:
        return ()
    return tuple(i for i, n in enumerate(shape) if n <= max_precond_dim)


def project(a: np.ndarray, Q: tuple, axes: tuple, back: bool = False) -> np.ndarray:
    """a with each preconditioned axis i rotated into the eigenbasis, a x_i Q_i^T (``back``: out of it,
    a x_i Q_i), a new array."""
    shape = a.shape
    for i, q in zip(axes, Q):
        a = np.moveaxis(np.tensordot(a, q.T if back else q, axes=([i], [0])), -1, i)
    return np.ascontiguousarray(a).reshape(shape)


def axis_gram(g: np.ndarray, i: int) -> np.ndarray:
    """G_(i) G_(i)^T: the products of g's slices along axis i, summed over all other axes (n_i x n_i)."""
    n = g.shape[i]
    gi = np.moveaxis(g, i, 0).reshape(n, g.size // n if n else 0)
    return gi @ gi.T


def _power_qr(GG: np.ndarray, Q: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """The refresh of :func:`refresh_basis` on float64 arrays without zero rows."""
    P = GG @ Q
    order = np.argsort(-np.sum(Q * P, axis=0), kind="stable")
    Qn, R = np.linalg.qr(P[:, order])
    d = np.diag(R)
    Qn = Qn * np.where(d < 0, -1.0, 1.0)
    tol = CLUSTER_ULPS * d.size * eps * (float(np.max(np.abs(d))) if d.size else 0.0)
    small = np.flatnonzero(np.abs(d) <= tol)
    if small.size:
        Qn = complete_basis(Qn, int(small[0]))
    return Qn, order


def refresh_basis(GG: np.ndarray, Q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One power iteration on the factor from the current basis, orthonormalised (the paper's refresh): the
    columns of GG Q sorted by the estimated eigenvalues q_j^T GG q_j, descending (a stable sort), then the Q
    factor of their Householder QR (``numpy.linalg.qr``) with every column signed so that diag(R) >= 0. Where
    the sorted columns are rank deficient (|R_jj| <= CLUSTER_ULPS n eps max|R_ii| from column k on) columns k:
    are the canonical basis of the rest (:func:`refopt.linalg.eigen.complete_basis`). The exactly zero rows Z
    of GG keep their unit vectors e_j (last, in index order, as :func:`refopt.linalg.eigen.eigh_descending`
    puts them) and the refresh runs on the other rows, when Q has that form (the columns that vanish off Z are
    as many as Z). float64 arithmetic. Returns (the new basis in GG's dtype, the order: column j of the new
    basis takes the entries of v of the old column order[j])."""
    eps = float(np.finfo(GG.dtype).eps)
    G64, Q64 = GG.astype(np.float64), Q.astype(np.float64)
    n = G64.shape[0]
    Z = zero_rows(G64)
    keep = np.setdiff1d(np.arange(n), Z)
    on_z = np.flatnonzero(~np.any(Q64[keep] != 0, axis=0)) if Z.size else Z
    if Z.size == 0 or on_z.size != Z.size:
        Qn, order = _power_qr(G64, Q64, eps)
        return Qn.astype(GG.dtype), order
    on_z = on_z[np.argsort(np.argmax(np.abs(Q64[:, on_z]), axis=0), kind="stable")]   # e_j in index order
    rest = np.setdiff1d(np.arange(n), on_z)
    Qs, sub_order = _power_qr(G64[np.ix_(keep, keep)], Q64[np.ix_(keep, rest)], eps)
    Qn = np.zeros((n, n))
    Qn[np.ix_(keep, np.arange(keep.size))] = Qs
    Qn[Z, keep.size + np.arange(Z.size)] = 1.0
    return Qn.astype(GG.dtype), np.concatenate([rest[sub_order], on_z])


@dataclass(frozen=True)
class SOAP(Rule):
    r"""SOAP (Vyas et al. 2024, arXiv:2409.11321): Adam in the eigenbasis of Shampoo's Kronecker
    factors, refreshed by a power iteration.

    For an m x n gradient G (each further axis alike: one factor per preconditioned axis, :func:`soap_axes`),
    with beta_s = shampoo_beta (beta2 when None), the factors L = EMA of G G^T and R = EMA of G^T G and their
    eigenbases Q_L, Q_R (columns in descending order of eigenvalue). At step t = 1 the factors are set from
    g_1, L_1 = (1 - beta_s) G_1 G_1^T (R alike), their eigenbases computed by
    :func:`refopt.linalg.eigen.eigh_descending`, and x is left unchanged. At step t >= 2, with k = t - 1 and
    gamma_t = schedule(t):

    .. math::

        G'_t &= Q_L^\top G_t\, Q_R \\
        m_t &= \beta_1 m_{t-1} + (1 - \beta_1)\, G_t \qquad \text{(in the parameter's basis)} \\
        v_t &= \beta_2 v_{t-1} + (1 - \beta_2)\, G'^{\,2}_t \qquad \text{(in the eigenbasis)} \\
        N_t &= Q_L\, \big[(Q_L^\top m_t Q_R) \,/\, (\sqrt{v_t} + \epsilon)\big]\, Q_R^\top \\
        x_t &= (1 - \mathrm{lr}\,\gamma_t\,\lambda)\,\big(x_{t-1} - \mathrm{lr}\,\gamma_t\,
               \tfrac{\sqrt{1 - \beta_2^k}}{1 - \beta_1^k}\, N_t\big) \\
        L_t &= \beta_s L_{t-1} + (1 - \beta_s)\, G_t G_t^\top, \quad
        R_t = \beta_s R_{t-1} + (1 - \beta_s)\, G_t^\top G_t

    and, when k is a multiple of ``precondition_frequency``, each basis is refreshed by one power iteration
    (:func:`refresh_basis`), the entries of v permuted along that axis by the new order. Without
    ``bias_correction`` the step is lr gamma_t N_t. The weight decay multiplies the updated x (as the authors'
    code). The direction (:func:`refopt.direction`) is u_t = sqrt(1 - beta2^k) / (1 - beta1^k) N_t (0 at t = 1).

    Eigenbases. Rank-deficient factors (the first G G^T of an m x n gradient with m > n + 1) have a repeated
    eigenvalue whose eigenvectors any solver picks from rounding noise; refopt picks a canonical basis that
    depends on the factor only (:mod:`refopt.linalg.eigen`), and so steps the same on any BLAS. Peers that call
    their own solver agree with it only where the factors' eigenvalues are distinct (docs/divergences.md,
    soap-eigenbasis).

    Shapes/dtypes: float32 / float64 arrays of any ndim; m, v like x, the factors and bases in x's dtype; the
    projections and moments in x's dtype, the eigendecompositions and QR in float64 (cast to x's dtype).

    Args:
      lr: peak learning rate >= 0 (3e-3, the paper's).
      beta1, beta2: Adam's EMA weights in [0, 1) (0.95, 0.95).
      shampoo_beta: the factors' EMA weight in [0, 1), or None for beta2.
      eps: > 0, added to sqrt(v) (1e-8).
      weight_decay: lambda >= 0 (0.01), decoupled, applied after the step.
      precondition_frequency: the refresh period f >= 1 in Adam steps (10).
      max_precond_dim: axes longer than this (>= 1) are not preconditioned (10000).
      precondition_1d: precondition 1-D arrays too (False: they take Adam).
      bias_correction: Adam's bias correction of the step (True).
      schedule: optional t -> gamma_t >= 0.

    Presets: ``refopt.like("pytorch_optimizer.SOAP", ...)`` (refopt/conventions/soap.py).

    Raises:
      ValueError: for bad hyperparameters (naming the field).
    """

    lr: float = 3e-3
    beta1: float = 0.95
    beta2: float = 0.95
    shampoo_beta: float | None = None
    eps: float = 1e-8
    weight_decay: float = 0.01
    precondition_frequency: int = 10
    max_precond_dim: int = 10000
    precondition_1d: bool = False
    bias_correction: bool = True
    schedule: Callable[[int], float] | None = None

    def __post_init__(self):
        _checks.nonnegative("lr", self.lr)
        _checks.unit_interval("beta1", self.beta1)
        _checks.unit_interval("beta2", self.beta2)
        if self.shampoo_beta is not None:
            _checks.unit_interval("shampoo_beta", self.shampoo_beta)
        _checks.positive("eps", self.eps)
        _checks.nonnegative("weight_decay", self.weight_decay)
        for name in ("precondition_frequency", "max_precond_dim"):
            object.__setattr__(self, name, _checks.positive_int(name, getattr(self, name)))
        _checks.boolean("precondition_1d", self.precondition_1d)
        _checks.boolean("bias_correction", self.bias_correction)
        _checks.schedule(self.schedule)

    def _axes(self, x):
        return soap_axes(x.shape, self.max_precond_dim, self.precondition_1d)

    def init_leaf(self, x, path):
        axes = self._axes(x)
        eye = tuple(np.eye(x.shape[i], dtype=x.dtype) for i in axes)
        return SOAPState(np.zeros_like(x), np.zeros_like(x),
                         tuple(np.zeros((x.shape[i], x.shape[i]), x.dtype) for i in axes), eye)

    def leaf_spec(self, x, path):
        sq = tuple(ArraySpec((x.shape[i], x.shape[i]), x.dtype) for i in self._axes(x))
        return SOAPState(ArraySpec.like(x), ArraySpec.like(x), sq, sq)

    def decoupled_decay(self):
        return self.weight_decay > 0

    def squares_grads(self, s):
        return True

    def context(self, t, glob):
        lr_t = float(self.lr) * _checks.schedule_multiplier(self.schedule, t)
        b1, b2 = float(self.beta1), float(self.beta2)
        sb = b2 if self.shampoo_beta is None else float(self.shampoo_beta)
        k = t - 1
        ratio = math.sqrt(1.0 - b2 ** k) / (1.0 - b1 ** k) if self.bias_correction and k >= 1 else 1.0
        refresh = k >= 1 and k % self.precondition_frequency == 0
        return SOAPContext(t == 1, refresh, lr_t, 1.0 - lr_t * float(self.weight_decay), lr_t * ratio,
                           ratio if k >= 1 else 0.0, b1, 1.0 - b1, b2, 1.0 - b2, sb, 1.0 - sb,
                           float(self.eps)), glob

    def prepare(self, ctx, ss, xs, gs, paths):
        """Before any array is written: a gradient whose factors or second moment would overflow (each entry of
        G_(i) G_(i)^T and of G'^2 is at most ||G||_F^2 <= size max|g|^2) raises FloatingPointError naming it."""
        for g, path in zip(gs, paths):
            if g.size:
                big = float(np.max(np.abs(g)))
                if big * big * g.size >= float(np.finfo(g.dtype).max):
                    bound = np.sqrt(np.finfo(g.dtype).max / g.size)
                    raise FloatingPointError(
                        f"gradient at {path} has |g| = {big:.3g}: its {g.size} squares summed in SOAP's Kronecker "
                        f"factors overflow {g.dtype} (|g| must be below {bound:.3g}); scale the loss down")
        return gs

    def _factors(self, c, s, g, axes):
        for i, f in zip(axes, s.GG):
            f[...] = c.shampoo_beta * f + c.omsb * axis_gram(g, i)

    def _direction(self, c: SOAPContext, s: SOAPState, x: np.ndarray, g: np.ndarray) -> np.ndarray | None:
        """Advance the state in place; return N_t (None at t = 1)."""
        axes = self._axes(x)
        if c.first:
            self._factors(c, s, g, axes)
            for f, q in zip(s.GG, s.Q):
                q[...] = eigh_descending(f)[1]
            return None
        gp = project(g, s.Q, axes)
        s.m[...] = c.beta1 * s.m + c.omb1 * g
        s.v[...] = c.beta2 * s.v + c.omb2 * (gp * gp)
        N = project(project(s.m, s.Q, axes) / (np.sqrt(s.v) + c.eps), s.Q, axes, back=True)
        self._factors(c, s, g, axes)
        if c.refresh:
            for i, f, q in zip(axes, s.GG, s.Q):
                q[...], order = refresh_basis(f, q)
                s.v[...] = np.take(s.v, order, axis=i)
        return N

    def update_leaf(self, ctx, s, x, g, path):
        N = self._direction(ctx, s, x, g)
        if N is not None:
            x -= ctx.step * N
            x *= ctx.decay
        return x, s

    def direction_leaf(self, ctx, s, x, g, path):
        N = self._direction(ctx, s, x, g)
        return (np.zeros_like(x) if N is None else ctx.u_scale * N), s
