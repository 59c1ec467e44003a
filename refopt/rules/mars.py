"""MARS (Yuan, Liu, Wu, Zhou & Gu 2024, "MARS: Unleashing the Power of Variance Reduction for Training Large
Models", arXiv:2411.10438): a variance-reduced gradient c_t = g_t + gamma beta1 / (1 - beta1) (g_t - g_{t-1}),
clipped to unit norm per array, fed to AdamW (MARS-AdamW) or to a sign step (MARS-Lion). The approximate form
(MARS-approx, the one its authors' code and pytorch_optimizer ship): g_{t-1} is the previous step's gradient,
taken on another batch."""
from __future__ import annotations

import math
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, NamedTuple

import numba
import numpy as np

from refopt.core import Rule
from refopt.kernels import Elementwise
from refopt.linalg.norms import fro_norm
from refopt.rules import _checks
from refopt.rules.base import lr_at

KINDS = ("adamw", "lion")
EPS_FORMS = ("hat", "raw", "max")
FIRST_STEPS = ("zero", "g1")
PREVIOUS = ("g", "c")


class MARSState(NamedTuple):
    """Per-array state, each like x: the first moment ``m`` and second moment ``v`` of the clipped c (``v``
    stays 0 for kind 'lion'), and the previous gradient ``g_prev`` (0 before the first step; the previous
    clipped c with ``previous='c'``)."""

    m: np.ndarray
    v: np.ndarray
    g_prev: np.ndarray


class MARSKernelContext(NamedTuple):
    lr_t: float
    decay: float      # 1 - lr_t weight_decay
    step: float       # lr_t
    u_scale: float    # 1
    k: float          # gamma beta1 / (1 - beta1); 0 at t = 1 with first_step='g1'
    clip_div: float   # ||c_t|| / max_norm where the clip acts, else 1 (set per array)
    beta1: float
    omb1: float
    beta2: float
    omb2: float
    eps: float
    eps_root: float
    bc1: float        # 1 - beta1^t
    bc2: float        # 1 - beta2^t
    sqrt_bc2: float
    raw: bool         # eps_form == 'raw'
    eps_max: bool     # eps_form == 'max'
    lion: bool        # kind == 'lion'
    keep_c: bool      # previous == 'c'


class MARSContext(NamedTuple):
    """One step's scalars (``kernel``) and, after the whole-tree pass, ||c_t||_F of every array by path."""

    lr_t: float
    kernel: MARSKernelContext
    norms: Any        # None before reduce_tree; then a read-only {path: ||c_t||_F} (float64)


@numba.njit
def correction(g, g_prev, k):
    """c_t = (g_t - g_{t-1}) k + g_t, in the order of operations of the authors' code."""
    return (g - g_prev) * k + g


@numba.njit
def _mars(x, g, s, i, c):
    ct = correction(g, s.g_prev[i], c.k) / c.clip_div
    s.g_prev[i] = ct if c.keep_c else g
    m = c.beta1 * s.m[i] + c.omb1 * ct
    s.m[i] = m
    if c.lion:
        return np.sign(m)
    v = c.beta2 * s.v[i] + c.omb2 * (ct * ct)
    s.v[i] = v
    if c.raw:
        den = (np.sqrt(v + c.eps_root) + c.eps) / c.sqrt_bc2
    elif c.eps_max:
        den = max(np.sqrt(v / c.bc2 + c.eps_root), c.eps)
    else:
        den = np.sqrt(v / c.bc2 + c.eps_root) + c.eps
    return (m / c.bc1) / den


_MARS = Elementwise(_mars, "mars")


@dataclass(frozen=True)
class MARS(Rule):
    r"""MARS-AdamW and MARS-Lion (Yuan et al. 2024, Algorithms 1-2, the approximate form). Per array, at step t
    (t = 1 first), lr_t = lr schedule(t), k = gamma beta1 / (1 - beta1):

    .. math::

        c_t &= g_t + k\,(g_t - g_{t-1}), \qquad
        \tilde c_t = \begin{cases} c_t\, \rho / \|c_t\|_F & \|c_t\|_F > \rho \\ c_t & \text{else} \end{cases} \\
        m_t &= \beta_1 m_{t-1} + (1 - \beta_1)\, \tilde c_t, \qquad
        v_t = \beta_2 v_{t-1} + (1 - \beta_2)\, \tilde c_t^2 \\
        u_t &= \frac{m_t / (1 - \beta_1^t)}{\sqrt{v_t / (1 - \beta_2^t) + \epsilon_{root}} + \epsilon}
        \quad (\text{'adamw'}), \qquad u_t = \mathrm{sign}(m_t) \quad (\text{'lion'}) \\
        x_t &= (1 - \mathrm{lr}_t \lambda)\, x_{t-1} - \mathrm{lr}_t\, u_t

    with rho = ``max_norm`` (the paper's Clip(c, 1); None: no clip) and the norm over the whole array
    (accumulated in float64, :func:`refopt.linalg.norms.fro_norm`). g_0 = 0 (``first_step='zero'``: the
    authors' code and pytorch_optimizer, so c_1 = (1 + k) g_1) or g_0 = g_1 (``'g1'``: c_1 = g_1, the
    paper's x_1 = x_0 in its exact form). ``previous='c'`` stores the clipped c_t in place of g_t, so that
    c_t = g_t + k (g_t - c_{t-1}) (heavyball 3.2.1's recursion). ``eps_form='raw'`` is pytorch_optimizer
    4.1.0's denominator (sqrt(v_t + eps_root) + eps) / sqrt(1 - beta2^t), with its eps_root 1e-15 (eps then
    acts as eps / sqrt(1 - beta2^t) on the corrected scale); ``'max'`` is heavyball 3.2.1's
    max(sqrt(v_hat + eps_root), eps). With gamma = 0 and no clip, MARS-AdamW is AdamW.

    The exact form evaluates g_{t-1} on this step's batch (a second gradient per step); refopt takes the
    previous step's gradient, as the packages do. The third instance, MARS-Shampoo, is not covered.

    Args:
      lr: >= 0 (3e-3, the authors'); beta1, beta2: in [0, 1) (0.95, 0.99).
      gamma: >= 0 (0.025), the strength of the correction.
      eps: > 0 (1e-8); eps_root: >= 0 (0).
      weight_decay: lambda >= 0 (0), decoupled, multiplied by lr_t.
      max_norm: None or > 0 (1.0), rho of the clip.
      kind: 'adamw' or 'lion'.
      eps_form: 'hat' (the paper's: eps added to sqrt(v_hat)), 'raw' (pytorch_optimizer's) or 'max'
        (heavyball's).
      first_step: 'zero' or 'g1', the g_0 of c_1.
      previous: 'g' (the paper's g_{t-1}) or 'c' (heavyball's c_{t-1}).
      schedule: t -> gamma_t.

    State: :class:`MARSState`. Shapes/dtypes: any float32 / float64 array; the state like x.

    Raises:
      ValueError: for a hyperparameter out of its range or a non-callable schedule. FloatingPointError at a
        step, before anything is written, where c_t is not finite (naming the array).
    """

    lr: float = 3e-3
    beta1: float = 0.95
    beta2: float = 0.99
    gamma: float = 0.025
    eps: float = 1e-8
    eps_root: float = 0.0
    weight_decay: float = 0.0
    max_norm: float | None = 1.0
    kind: str = "adamw"
    eps_form: str = "hat"
    first_step: str = "zero"
    previous: str = "g"
    schedule: Callable[[int], float] | None = None

    State = MARSState

    def __post_init__(self):
        _checks.nonnegative("lr", self.lr)
        _checks.unit_interval("beta1", self.beta1)
        _checks.unit_interval("beta2", self.beta2)
        _checks.nonnegative("gamma", self.gamma)
        _checks.positive("eps", self.eps)
        _checks.nonnegative("eps_root", self.eps_root)
        _checks.nonnegative("weight_decay", self.weight_decay)
        if self.max_norm is not None:
            _checks.positive("max_norm", self.max_norm)
        _checks.one_of("kind", self.kind, KINDS)
        _checks.one_of("eps_form", self.eps_form, EPS_FORMS)
        _checks.one_of("first_step", self.first_step, FIRST_STEPS)
        _checks.one_of("previous", self.previous, PREVIOUS)
        _checks.schedule(self.schedule)

    def init_leaf(self, x, path):
        return MARSState(np.zeros_like(x), np.zeros_like(x), np.zeros_like(x))

    def squares_grads(self, s):
        return self.kind == "adamw"

    def decoupled_decay(self):
        return self.weight_decay > 0

    def context(self, t, glob):
        lr_t, b1, b2 = lr_at(self, t), float(self.beta1), float(self.beta2)
        k = 0.0 if (t == 1 and self.first_step == "g1") else float(self.gamma) * (b1 / (1.0 - b1))
        bc2 = 1.0 - b2 ** t
        kern = MARSKernelContext(lr_t, 1.0 - lr_t * float(self.weight_decay), lr_t, 1.0, k, 1.0, b1, 1.0 - b1, b2,
                                 1.0 - b2, float(self.eps), float(self.eps_root), 1.0 - b1 ** t, bc2,
                                 math.sqrt(bc2), self.eps_form == "raw", self.eps_form == "max",
                                 self.kind == "lion", self.previous == "c")
        return MARSContext(lr_t, kern, None), glob

    def reduce_tree(self, ctx, glob, ss, xs, gs, paths):
        """||c_t||_F of every array (c_t from this step's g and the stored g_{t-1}); FloatingPointError naming
        the first array where it is not finite, before anything is written."""
        norms = {}
        for s, x, g, p in zip(ss, xs, gs, paths):
            n = fro_norm(correction(np.ravel(g), np.ravel(s.g_prev), x.dtype.type(ctx.kernel.k)))
            if not math.isfinite(n):
                raise FloatingPointError(f"MARS: the corrected gradient c = g + k (g - g_prev) at {p} is not "
                                         f"finite (k = {ctx.kernel.k:.3g}); gradients must be finite and "
                                         f"k |g - g_prev| must stay within {x.dtype}")
            norms[p] = n
        return ctx._replace(norms=MappingProxyType(norms)), glob

    def _leaf_context(self, ctx, x, path):
        n = ctx.norms[path]
        rho = self.max_norm
        div = n / float(rho) if rho is not None and n > rho else 1.0
        return ctx.kernel._replace(clip_div=x.dtype.type(div))

    def update_leaf(self, ctx, s, x, g, path):
        _MARS.step(x, g, s, self._leaf_context(ctx, x, path))
        return x, s

    def direction_leaf(self, ctx, s, x, g, path):
        u = np.empty(x.shape, x.dtype)
        _MARS.direction(u, x, g, s, self._leaf_context(ctx, x, path))
        return u, s
