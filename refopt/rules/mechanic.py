"""Mechanic (Cutkosky, Defazio & Mehta 2023, "Mechanic: A Learning Rate Tuner", Algorithm 1) in
optax.contrib.mechanize's form: a wrapper that learns the scale of its base rule's updates. The base rule steps
as it would alone; Mechanic keeps x_ref and the scale estimates, which are rule-wide (one inner product and two
norms over the whole tree, :meth:`refopt.core.Rule.reduce_tree`) and live in ``OptState.glob``."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from refopt.core import ArraySpec, Rule
from refopt.kernels import bad_leaves
from refopt.linalg.norms import fro_norm
from refopt.rules import _checks
from refopt.rules.base import Wrapper, rewrap
from refopt.rules.clip import ClipByGlobalNorm
from refopt.scalars import cast_scalar
from refopt.serialize import nested_rules


def optax_betas(num_betas: int) -> tuple:
    """optax.contrib.mechanize's betas for ``num_betas``: (1 - 0.1^1, ..., 1 - 0.1^n), computed as optax does
    (in Python float64), so (0.9, 0.99, 0.999, ...) to the last bit."""
    return tuple(1.0 - 0.1 ** i for i in range(1, num_betas + 1))


#: the paper's and optax's default beta vector (n = 6)
DEFAULT_BETAS = optax_betas(6)


class MechanicState(NamedTuple):
    """Per-array state of :class:`Mechanic`: ``x0``, the reference point x_ref (like x; the params of the first
    update), and the base rule's own per-array state."""

    x0: np.ndarray
    base: Any


class MechanicGlobal(NamedTuple):
    """Mechanic's rule-wide state: one tuple of n Python floats per field, one entry per beta (float64, also
    for float32 params): the reward ``r`` (not clipped at 0), the running maximum ``m`` of |h|, the discounted
    sum ``v`` of h^2 and the scales ``s`` (s_1 = s_init each); and ``base``, the base rule's own global state."""

    r: tuple
    m: tuple
    v: tuple
    s: tuple
    base: Any


class MechanicContext(NamedTuple):
    """One step's scalars: ``first`` (t = 1: x_ref is set to x), ``den`` = S_t + eps (Delta_t = (x - x_ref)/den),
    ``step`` = S_{t+1} (set by :meth:`Mechanic.reduce_tree`; 0 before) and the base rule's context."""

    first: bool
    den: float
    step: float
    base: Any


def _finite_tuple(v, n: int, nonnegative: bool) -> bool:
    return isinstance(v, tuple) and len(v) == n and all(
        isinstance(a, float) and math.isfinite(a) and (a >= 0 or not nonnegative) for a in v)


def _dot64(a: np.ndarray, b: np.ndarray) -> float:
    """sum(a * b) accumulated in float64 (float32 arrays widened first)."""
    return float(np.dot(np.ravel(a).astype(np.float64, copy=False), np.ravel(b).astype(np.float64, copy=False)))


@dataclass(frozen=True)
class Mechanic(Wrapper):
    r"""Mechanic (Cutkosky, Defazio & Mehta 2023, Algorithm 1) around a base rule, as optax.contrib.mechanize.

    At step t (t = 1 first) the base rule steps from x_t on g_t as it would alone; its update is
    u_t = base(x_t, g_t) - x_t. With n = len(betas), S_t = sum_i s_{t,i}, and the norms and inner product
    over the whole tree (every array of the params):

    .. math::

        x_{\mathrm{ref}} &= x_1, \qquad \Delta_t = \frac{x_t - x_{\mathrm{ref}}}{S_t + \epsilon} \\
        h_t &= \Bigl\langle \Delta_t,\ g_t + \lambda\, S_t\, \frac{\|g_t\|}{\|x_t\| + \epsilon}\, x_t
               \Bigr\rangle \\
        m_t &= \max(\beta\, m_{t-1},\ |h_t| + \epsilon), \qquad v_t = \beta^2 v_{t-1} + h_t^2 \\
        r_t &= \beta\, r_{t-1} - s_t\, \mathrm{clip}(h_t, -m_{t-1}, m_{t-1}) \\
        W_t &= \frac{s_{\mathrm{init}}}{n}\, m_t + \max(0, r_t), \qquad
        s_{t+1} = \frac{W_t}{\sqrt{v_t} + \epsilon} \\
        x_{t+1} &= x_{\mathrm{ref}} + S_{t+1}\, (\Delta_t + u_t)

    elementwise over the n betas (m_0 = v_0 = r_0 = 0, s_1 = s_init). This is optax 0.2.8's arithmetic, which
    departs from the paper's Algorithm 1 (x_ref = x_1, Delta_1 = 0, Delta_{t+1} = Delta_t + u_t,
    h_t = <Delta_t, g_t + lambda S_t ||g_t|| x_t / ||x_t||>, r_t = max(0, beta r_{t-1} - s_t h_t),
    x_{t+1} = x_ref + S_{t+1} Delta_{t+1}) in these places, each reproduced here:

    * Delta_t is recomputed from the iterate, (x_t - x_ref)/(S_t + eps) (optax's memory-efficient form: no
      stored Delta), not accumulated; it differs from the paper's sum of the u_t by the factor S_t/(S_t + eps);
    * the default s_init is 1e-6 (the paper's 1e-8); the state starts from s_1 = s_init (the paper's s_1 = 0),
      which changes no number: h_1 = 0 (Delta_1 = 0), so s_2 = s_init/n (eps/eps) either way;
    * h_t is clipped to [-m_{t-1}, m_{t-1}] in the reward ("not part of the original paper", optax's source);
    * the reward r_t is kept unclipped in the state and clipped at 0 only in the wealth W_t;
    * eps enters |h_t| + eps in m_t and ||x_t|| + eps in the decay term;
    * x_ref is the params of the first update (optax's count = 0), not those given to init (the same unless the
      params are replaced between init and the first update).

    lambda's decay term enters only h_t, never the step (it is not the base rule's weight decay). The base
    rule sees the raw gradients g_t and the iterate x_t.

    Args:
      base: a refopt rule (its whole-tree pre-pass must not change the gradients: no ClipByGlobalNorm inside;
        clip outside instead, ``ClipByGlobalNorm(Mechanic(...))``).
      weight_decay: lambda >= 0 (1e-2).
      eps: > 0 (1e-8).
      s_init: > 0 (1e-6, optax's; the paper's 1e-8).
      betas: a non-empty tuple of floats in [0, 1) (optax's num_betas = 6: (0.9, 0.99, ..., 0.999999), see
        :func:`optax_betas`).

    State: per leaf :class:`MechanicState` (``x0`` like x, the base's state); rule-wide :class:`MechanicGlobal`
    in ``OptState.glob`` (float64 Python floats, n per field, and the base's global state). Shapes/dtypes: any
    float32 / float64 arrays; Delta_t, the decay term and the step are computed in x's dtype, h_t, the norms and
    the scales in float64.

    Raises:
      ValueError: for a hyperparameter out of its range or a base that is not a refopt rule or holds a
        ClipByGlobalNorm; at a step, for a global state that is not the :class:`MechanicGlobal` init makes (n
        finite floats per field, m, v, s >= 0) or a base pre-pass that changes the gradients.
      FloatingPointError: at a step, for params that hold nan or inf (their norm enters h_t).
    """

    base: Rule
    weight_decay: float = 1e-2
    eps: float = 1e-8
    s_init: float = 1e-6
    betas: tuple = DEFAULT_BETAS

    def __post_init__(self):
        self._check_base()
        _checks.nonnegative("weight_decay", self.weight_decay)
        _checks.positive("eps", self.eps)
        _checks.positive("s_init", self.s_init)
        if not isinstance(self.betas, tuple) or not self.betas:
            raise ValueError(f"betas must be a non-empty tuple of floats in [0, 1), got {self.betas!r}")
        for b in self.betas:
            _checks.unit_interval("betas", b)
        for r in (self.base, *nested_rules(self.base)):
            if isinstance(r, ClipByGlobalNorm):
                raise ValueError("Mechanic: the base holds a ClipByGlobalNorm, whose clipped gradients Mechanic's "
                                 "inner product would not see (optax's mechanize reads the raw ones); clip outside "
                                 "instead: ClipByGlobalNorm(Mechanic(...))")

    # ---- per-array state ---------------------------------------------------------------------------
    def init_leaf(self, x, path):
        return MechanicState(np.array(x, order="C", copy=True), self.base.init_leaf(x, path))

    def leaf_spec(self, x, path):
        return MechanicState(ArraySpec.like(x), self.base.leaf_spec(x, path))

    # ---- rule-wide state -----------------------------------------------------------------------------
    def init_global(self):
        n = len(self.betas)
        return MechanicGlobal((0.0,) * n, (0.0,) * n, (0.0,) * n, (float(self.s_init),) * n,
                              self.base.init_global())

    def _check_glob(self, glob) -> None:
        n = len(self.betas)
        if not (isinstance(glob, MechanicGlobal) and _finite_tuple(glob.r, n, False)
                and all(_finite_tuple(f, n, True) for f in (glob.m, glob.v, glob.s))):
            raise ValueError(f"Mechanic: the global state must be the MechanicGlobal refopt.init makes, {n} finite "
                             f"floats per field r, m, v, s (m, v, s >= 0), got {glob!r}")

    def context(self, t, glob):
        self._check_glob(glob)
        base_ctx, base_glob = self.base.context(t, glob.base)
        ctx = MechanicContext(t == 1, sum(glob.s) + float(self.eps), 0.0, base_ctx)
        return ctx, (glob if base_glob is glob.base else glob._replace(base=base_glob))

    def squares_grads(self, s):
        return True      # ||g||^2 over the tree

    def lr_info(self, ctx):
        """The base's learning rates times the scale S_{t+1} of this step."""
        return {k: v * float(ctx.step) for k, v in self.base.lr_info(ctx.base).items()}

    def prepare(self, ctx, ss, xs, gs, paths):
        """The weights must be finite (their norm enters h_t): FloatingPointError naming the first that is not;
        then the base's pre-pass, which must hand back the gradients unchanged (Mechanic's h_t reads the raw
        ones, as optax's)."""
        bad = bad_leaves(xs, [math.inf] * len(xs))
        if bad:
            raise FloatingPointError(f"Mechanic: the weights at {paths[bad[0]]} hold nan or inf; parameters must "
                                     f"be finite")
        prepared = self.base.prepare(ctx.base, [s.base for s in ss], xs, gs, paths)
        for a, b, p in zip(prepared, gs, paths):
            if a is not b:
                raise ValueError(f"Mechanic: the base rule {type(self.base).__name__} changed the gradient at {p} "
                                 f"in its whole-tree pre-pass; Mechanic reads the raw gradients, so the base "
                                 f"would see others (apply that pre-pass outside Mechanic)")
        return gs

    def _delta(self, x, x0, den) -> np.ndarray:
        """Delta_t = (x - x_ref) / (S_t + eps) in x's dtype (``den`` cast to it)."""
        d = np.empty(x.shape, x.dtype)
        np.subtract(x, x0, out=d)
        np.divide(d, den, out=d)
        return d

    def reduce_tree(self, ctx, glob, ss, xs, gs, paths):
        base_ctx, base_glob = self.base.reduce_tree(ctx.base, glob.base, [s.base for s in ss], xs, gs, paths)
        eps, wd = float(self.eps), float(self.weight_decay)
        S = sum(glob.s)
        gn = math.hypot(*(fro_norm(g) for g in gs)) if gs else 0.0
        xn = math.hypot(*(fro_norm(x) for x in xs)) if xs else 0.0
        c = wd * S * gn / (xn + eps)
        h = 0.0
        for s, x, g in zip(ss, xs, gs):
            dt = x.dtype
            d = self._delta(x, x if ctx.first else s.x0, cast_scalar(ctx.den, dt, "Mechanic S_t + eps"))
            a = np.add(g, np.multiply(x, cast_scalar(c, dt, "Mechanic decay coefficient", allow_underflow=True)))
            h += _dot64(a, d)
        n = len(self.betas)
        w0 = float(self.s_init) / n
        r, m, v, s = [], [], [], []
        for b, r0, m0, v0, s0 in zip(self.betas, glob.r, glob.m, glob.v, glob.s):
            b = float(b)
            hc = min(max(h, -m0), m0)                 # clip(h_t, -m_{t-1}, m_{t-1})
            m1 = max(b * m0, abs(h) + eps)
            v1 = (b * b) * v0 + h * h
            r1 = b * r0 - hc * s0
            w = w0 * m1 + max(0.0, r1)
            r.append(r1)
            m.append(m1)
            v.append(v1)
            s.append(w / (math.sqrt(v1) + eps))
        new_glob = MechanicGlobal(tuple(r), tuple(m), tuple(v), tuple(s), base_glob)
        return ctx._replace(step=sum(s), base=base_ctx), new_glob

    def update_leaf(self, ctx, s, x, g, path):
        if ctx.first:
            s.x0[...] = x                             # x_ref = x_1
        xb = np.array(x, order="C", copy=True)
        xb, sb = self.base.update_leaf(ctx.base, s.base, xb, g, path)
        d = self._delta(x, s.x0, ctx.den)             # Delta_t
        np.add(d, np.subtract(xb, x), out=d)          # Delta_t + u_t
        np.multiply(d, ctx.step, out=d)
        np.add(s.x0, d, out=x)                        # x_ref + S_{t+1} (Delta_t + u_t)
        return x, rewrap(s, sb)
