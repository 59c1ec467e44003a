"""PSGD Kron (Li 2018, "Preconditioner on Matrix Lie Group for SGD", arXiv:1809.10232, with the Kronecker-product
preconditioner of Li's psgd_torch): momentum preconditioned by P = Q^T Q with Q = Q_1 (x) Q_2, each Q_i an upper
triangular (or diagonal) factor fitted on the fly by a step on the Lie group from a Hessian-free pair (v, h), in
kron_torch's form (Evan Walters): h is the debiased momentum plus a small multiple of the probe v."""
from __future__ import annotations

import math
import zlib
from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np

from refopt.core import ArraySpec, Rule
from refopt.rules import _checks
from refopt.rules.base import lr_at

MEMORY_SAVE_MODES = (None, "one_diag", "smart_one_diag", "all_diag")

#: float32's machine epsilon: the probe's weight sqrt(eps) mean|h| whatever the dtype (kron_torch's)
EPS32 = float(np.finfo(np.float32).eps)

_BALANCE_DRAWS: dict = {}


def balance_draws(seed: int, n: int) -> list:
    """The first ``n`` values of Python's ``random.Random(seed).random()`` (kron_torch draws one per step and
    balances the factors where it is below 0.01), cached per seed."""
    import random

    have = _BALANCE_DRAWS.setdefault(seed, [random.Random(seed), []])
    while len(have[1]) < n:
        have[1].append(have[0].random())
    return have[1][:n]


class PSGDKronState(NamedTuple):
    """Per-array state: the momentum ``m`` (like x) and the factors ``q``, one per axis: an (n_i, n_i) upper
    triangular matrix, or a length-n_i vector for a diagonal factor."""

    m: np.ndarray
    q: tuple


class PSGDKronGlobal(NamedTuple):
    """Rule-wide state: the steps since the last preconditioner update (``counter``)."""

    counter: int


class PSGDKronContext(NamedTuple):
    lr_t: float
    t: int
    beta1: float
    omb1: float
    bc1: float            # 1 - beta1**t
    update: bool          # fit the factors this step
    balance: bool         # rescale the factors to a common max |entry| first
    precond_lr: float
    weight_decay: float
    probe_weight: float   # sqrt(float32 eps)


def diagonal_axes(rule, shape: tuple) -> list:
    """Which axes of an array of ``shape`` (refopt's layout) get a diagonal factor."""
    n = len(shape)
    mode = rule.memory_save_mode
    diag = [False] * n
    if mode == "all_diag":
        diag = [True] * n
    elif mode == "one_diag" and n:
        big = max(shape)
        diag[shape.index(big)] = True           # the first largest axis (torch's last: kron_torch's argsort)
    elif mode == "smart_one_diag" and n > 1:
        order = sorted(shape)
        if order[-1] > order[-2]:
            diag[shape.index(order[-1])] = True
    return [d or size == 1 or size > rule.max_size_triangular or n < rule.min_ndim_triangular
            for d, size in zip(diag, shape)]


def mode_apply(factors: tuple, a: np.ndarray, transpose: bool = False) -> np.ndarray:
    """a with each factor applied along its axis: Q_i a along axis i (Q_i^T with ``transpose``); a vector factor
    scales its axis."""
    for i, q in enumerate(factors):
        if q.ndim == 1:
            a = a * q.reshape((-1,) + (1,) * (a.ndim - 1 - i))
        else:
            a = np.moveaxis(np.tensordot(q.T if transpose else q, a, axes=([1], [i])), 0, i)
    return a


def mode_solve(factors: tuple, v: np.ndarray) -> np.ndarray:
    """v with Q_i^{-T} applied along each axis i (a triangular solve; a vector factor divides its axis)."""
    import scipy.linalg

    for i, q in enumerate(factors):
        if q.ndim == 1:
            v = v / q.reshape((-1,) + (1,) * (v.ndim - 1 - i))
        else:
            w = np.moveaxis(v, i, 0)
            w = scipy.linalg.solve_triangular(q, w.reshape(w.shape[0], -1), trans="T", lower=False)
            v = np.moveaxis(w.reshape(np.moveaxis(v, i, 0).shape), 0, i)
    return v


def gram(a: np.ndarray, i: int, diagonal: bool) -> np.ndarray:
    """The unfolding of a along axis i times its transpose (its diagonal for a diagonal factor)."""
    w = np.moveaxis(a, i, 0).reshape(a.shape[i], -1)
    return np.einsum("ij,ij->i", w, w) if diagonal else w @ w.T


def spectral_lower_bound(s: np.ndarray, max_abs) -> float:
    """kron_torch's cheap lower bound of ||s||_2 (s symmetric): the column x of s / max|s| with the largest norm,
    y = x s / ||x s||, the bound ||s y|| max|s|."""
    a = s / max_abs
    x = a[:, int(np.argmax(np.einsum("ij,ij->j", a, a)))]
    x = x @ a
    x = x / np.linalg.norm(x)
    return np.linalg.norm(a @ x) * max_abs


@dataclass(frozen=True)
class PSGDKron(Rule):
    r"""PSGD with Kronecker-factored preconditioners in kron_torch's form (Li 2018, arXiv:1809.10232; Li's psgd_torch
    Kron). At step t (t = 1 first), lr_t = lr gamma_t, for an array with factors Q_i (one per axis, Q = Q_1 (x) Q_2,
    P = Q^T Q):

    .. math::

        m_t &= \beta_1 m_{t-1} + (1 - \beta_1)\, g_t, \qquad \hat m_t = m_t / (1 - \beta_1^t) \\
        h &= \hat m_t + \sqrt{\epsilon_{32}}\ \mathrm{mean}|\hat m_t|\ v, \qquad v \sim N(0, I)
        \quad (\text{at a preconditioner update; } \hat m_t \leftarrow h) \\
        A &= Q h, \qquad \bar B = Q^{-T} v \qquad (\text{each factor along its axis}) \\
        Q_i &\leftarrow Q_i - \frac{\mathrm{lr}_P}{\mathrm{lb}(A_{(i)} A_{(i)}^T + \bar B_{(i)} \bar B_{(i)}^T)}
        \mathrm{triu}\big(A_{(i)} A_{(i)}^T - \bar B_{(i)} \bar B_{(i)}^T\big)\, Q_i \\
        u &= P \hat m_t\ \min\big(1, 1.1 / (\mathrm{RMS}(P \hat m_t) + 10^{-12})\big) + \lambda x_{t-1}
        \ (\text{arrays of ndim} \ge 2), \qquad x_t = x_{t-1} - \mathrm{lr}_t\, u

    with X_(i) the unfolding along axis i and lb(S) a lower bound of ||S||_2 (:func:`spectral_lower_bound`, at least
    the smallest normal float). A diagonal factor q_i takes the diagonals: q_i <- q_i - lr_P (d_A - d_B) q_i /
    max|d_A + d_B|. The factors start at precond_init_scale^(1/ndim) I. kron_torch (and this rule, as it) feeds the
    perturbed h to the step as well as to the fit, weighs the probe by float32's eps in any dtype, adds the decay
    after the preconditioning, and rescales the factors to their geometric-mean max|entry| where Python's
    ``random.Random(balance_seed).random()`` of the step is below 0.01 (at an update).

    The probe v is drawn by refopt: ``numpy.random.default_rng([probe_seed, t, crc32(path)]).standard_normal``
    (float64, cast to x's dtype) in refopt's layout, so two runs draw the same v; a cross-check hands the same v to
    the peer (docs/factories/psgd_kron.py).

    Args:
      lr: >= 0 (3e-4); beta1: in [0, 1) (0.9); weight_decay: lambda >= 0 (0).
      update_probability: in (0, 1], or a function n -> probability of the n-th step (n = t - 1): the factors are
        fitted when the steps since the last fit reach 1 / probability (kron_torch's counter), 1 (every step).
      max_size_triangular: positive int (8192); min_ndim_triangular: positive int (2); memory_save_mode: None,
        'one_diag', 'smart_one_diag' or 'all_diag' (which axes get a diagonal factor, :func:`diagonal_axes`).
      precond_lr: > 0 (0.1); precond_init_scale: > 0 (1); balance_seed: int or None (42; None: never balance);
      probe_seed: int (0); schedule: t -> gamma_t.

    Shapes/dtypes: float32 / float64 arrays of 1 or 2 axes (ValueError naming the path at :func:`refopt.init`
    otherwise); ``m`` like x, the factors in x's dtype.

    Raises:
      ValueError: for a hyperparameter out of its range or of the wrong kind; at init, an array of 0 or > 2 axes.
    """

    lr: float = 3e-4
    beta1: float = 0.9
    weight_decay: float = 0.0
    update_probability: float | Callable[[int], float] = 1.0
    max_size_triangular: int = 8192
    min_ndim_triangular: int = 2
    memory_save_mode: str | None = None
    precond_lr: float = 0.1
    precond_init_scale: float = 1.0
    balance_seed: int | None = 42
    probe_seed: int = 0
    schedule: Callable[[int], float] | None = None

    State = PSGDKronState

    def __post_init__(self):
        _checks.nonnegative("lr", self.lr)
        _checks.unit_interval("beta1", self.beta1)
        _checks.nonnegative("weight_decay", self.weight_decay)
        if not callable(self.update_probability):
            _checks.positive("update_probability", self.update_probability)
            if self.update_probability > 1:
                raise ValueError(f"update_probability must be in (0, 1], got {self.update_probability!r}")
        _checks.positive_int("max_size_triangular", self.max_size_triangular)
        _checks.positive_int("min_ndim_triangular", self.min_ndim_triangular)
        _checks.one_of("memory_save_mode", self.memory_save_mode, MEMORY_SAVE_MODES)
        _checks.positive("precond_lr", self.precond_lr)
        _checks.positive("precond_init_scale", self.precond_init_scale)
        if self.balance_seed is not None:
            _checks.nonnegative_int("balance_seed", self.balance_seed)
        _checks.nonnegative_int("probe_seed", self.probe_seed)
        _checks.schedule(self.schedule)

    def _factors(self, x, path):
        if x.ndim not in (1, 2):
            raise ValueError(f"PSGDKron takes arrays of 1 or 2 axes; the parameter at {path} has shape {x.shape}")
        scale = float(self.precond_init_scale) ** (1.0 / x.ndim)
        return tuple(np.full(n, scale, x.dtype) if d else scale * np.eye(n, dtype=x.dtype)
                     for n, d in zip(x.shape, diagonal_axes(self, x.shape)))

    def init_leaf(self, x, path):
        return PSGDKronState(np.zeros_like(x), self._factors(x, path))

    def leaf_spec(self, x, path):
        return PSGDKronState(ArraySpec.like(x), tuple(ArraySpec.like(q) for q in self._factors(x, path)))

    def init_global(self):
        return PSGDKronGlobal(0)

    def decoupled_decay(self):
        return False

    def context(self, t, glob):
        b1 = float(self.beta1)
        p = self.update_probability
        p = p(t - 1) if callable(p) else float(p)     # a float32 schedule keeps its float32 reciprocal
        counter = glob.counter + 1
        update = counter >= 1.0 / p
        balance = update and self.balance_seed is not None and balance_draws(self.balance_seed, t)[t - 1] < 0.01
        ctx = PSGDKronContext(lr_at(self, t), t, b1, 1.0 - b1, 1.0 - b1 ** t, bool(update), bool(balance),
                              float(self.precond_lr), float(self.weight_decay), math.sqrt(EPS32))
        return ctx, PSGDKronGlobal(0 if update else counter)

    def probe(self, t: int, path: str, shape: tuple, dtype) -> np.ndarray:
        """The probe v of step t for the array at ``path`` (refopt's layout)."""
        rng = np.random.default_rng([int(self.probe_seed), int(t), zlib.crc32(path.encode())])
        return rng.standard_normal(shape).astype(dtype)

    def _fit(self, c, qs, h, v):
        """One step of every factor on the pair (v, h), written into the factors ``qs``."""
        d = h.dtype.type
        tiny = np.finfo(h.dtype).tiny
        a, b = mode_apply(qs, h), mode_solve(qs, v)
        for i, q in enumerate(qs):
            ga, gb = gram(a, i, q.ndim == 1), gram(b, i, q.ndim == 1)
            diff, total = d(c.precond_lr) * (ga - gb), ga + gb
            norm = np.max(np.abs(total))
            if q.ndim == 1:
                q -= diff * (q / max(norm, tiny))
            else:
                lb = spectral_lower_bound(total, norm) if norm > 0 else d(0)
                q -= (np.triu(diff) / max(lb, tiny)) @ q

    def _direction(self, c, s, x, g, path):
        d = x.dtype.type
        s.m[...] = d(c.beta1) * s.m + d(c.omb1) * g
        mhat = s.m / d(c.bc1)
        qs = s.q
        if c.balance and x.ndim > 1:
            norms = np.array([np.max(np.abs(q)) for q in qs])
            mean = np.exp(np.mean(np.log(norms)))
            for q, n in zip(qs, norms):
                q *= d(mean / n)
        if c.update:
            v = self.probe(c.t, path, x.shape, x.dtype)
            mhat = mhat + d(c.probe_weight) * np.mean(np.abs(mhat)) * v
            self._fit(c, qs, mhat, v)
        u = mode_apply(qs, mode_apply(qs, mhat), transpose=True)
        u = u * min(d(1), d(1.1) / (np.sqrt(np.mean(u * u)) + d(1e-12)))
        if c.weight_decay != 0 and x.ndim >= 2:
            u = u + d(c.weight_decay) * x
        return u

    def update_leaf(self, c, s, x, g, path):
        u = self._direction(c, s, x, g, path)
        x -= x.dtype.type(c.lr_t) * u
        return x, s

    def direction_leaf(self, c, s, x, g, path):
        return self._direction(c, s, x, g, path), s
