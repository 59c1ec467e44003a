"""What Schedule-Free SGD and AdamW (:mod:`refopt.rules.schedule_free`) share, written once: the checks of
the common fields, the step size and averaging weight (the reference's param-group bookkeeping), the step's
scalars in float64 (cast to the array dtype by the walk) and the per-element kernels."""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numba
import numpy as np

from refopt.core import ArraySpec, Rule
from refopt.kernels import Elementwise
from refopt.rules import _checks


def _warm(t: int, warmup_steps: int) -> float:
    return t / warmup_steps if t <= warmup_steps else 1.0


def _warm_lagged(t: int, warmup_steps: int) -> float:
    """optax <= 0.2.8's inner warmup at update t: warm_{t-1} (0 at t = 1); 1 without warmup."""
    return _warm(t - 1, warmup_steps) if warmup_steps > 0 else 1.0


class SFContext(NamedTuple):
    """The scalars of one step (:meth:`ScheduleFreeBase._context`)."""

    lr_t: float         # the z step size (logged as the lr of the step)
    lr: float           # the z step size: gamma_t = (lr * schedule(t)) * warm_t (warm_{t-1} with warmup_lag)
    c: float            # averaging coefficient c_t (0 when weight_sum = 0)
    omc: float          # 1 - c_t
    beta: float         # interpolation beta (SGD) / beta1 (AdamW)
    ombeta: float       # 1 - beta
    use_wd: bool        # weight_decay != 0
    weight_decay: float  # lambda (SGD's L2 at y)
    lr_wd: float        # gamma_t * lambda (AdamW's decoupled decay)
    decay_at_z: bool
    beta2: float        # AdamW only (0 for SGD)
    omb2: float
    bc2: float          # 1 - beta2**t (AdamW only; 1 for SGD)
    eps: float
    neg_lr: float       # -gamma_t


@dataclass(frozen=True)
class ScheduleFreeBase(Rule):
    """The hooks the Schedule-Free rules share. A subclass sets ``State`` (its per-array state, z and x
    first), ``Global`` (the rule-wide state k, weight_sum, lr_max) and ``kernel()`` (its :class:`Elementwise`,
    run with ``replace``: the kernel returns the new params y)."""

    State = Global = None

    def kernel(self) -> Elementwise:  # pragma: no cover - abstract
        raise NotImplementedError

    def _check_common(self):
        _checks.nonnegative("lr", self.lr)
        _checks.nonnegative_int("warmup_steps", self.warmup_steps)
        _checks.nonnegative("r", self.r)
        _checks.nonnegative("weight_lr_power", self.weight_lr_power)
        _checks.nonnegative("weight_decay", self.weight_decay)
        _checks.schedule(self.schedule)
        _checks.boolean("warmup_lag", self.warmup_lag)

    def init_global(self):
        return self.Global(0, 0.0, -1.0)

    def _averaging(self, t: int, glob) -> tuple[float, float, tuple]:
        """(z step size, c_t, new global state): the reference's step-size, lr_max and weight bookkeeping.
        The z step size is gamma_t, or with ``warmup_lag`` (lr * schedule(t)) * warm_{t-1}."""
        if not isinstance(glob, self.Global):
            glob = self.Global(*glob)  # e.g. a plain tuple/list from a checkpoint
        scaled = self.lr * _checks.schedule_multiplier(self.schedule, t)
        lr = scaled * _warm(t, self.warmup_steps)
        lr_max = max(lr, glob.lr_max)
        weight = (t ** self.r) * (lr_max ** self.weight_lr_power)
        weight_sum = glob.weight_sum + weight
        c = weight / weight_sum if weight_sum != 0 else 0.0
        z_lr = scaled * _warm_lagged(t, self.warmup_steps) if self.warmup_lag else lr
        return z_lr, c, self.Global(t, weight_sum, lr_max)

    def _context(self, lr, c, beta, beta2, omb2, bc2, eps) -> SFContext:
        wd = float(self.weight_decay)
        return SFContext(lr, lr, c, 1.0 - c, beta, 1.0 - beta, wd != 0, wd, lr * wd,
                         bool(getattr(self, "decay_at_z", False)), beta2, omb2, bc2, eps, -lr)

    def init_leaf(self, x, path):
        """z = x = y0 (C-ordered copies of the params); the further state arrays (AdamW's v) zeros."""
        z, avg = (np.array(x, order="C", copy=True) for _ in range(2))
        return self.State(z, avg, *(np.zeros(x.shape, x.dtype) for _ in self.State._fields[2:]))

    def leaf_spec(self, x, path):
        return self.State(*(ArraySpec.like(x) for _ in self.State._fields))

    def update_leaf(self, ctx, s, x, g, path):
        self.kernel().replace(x, g, s, ctx)
        return x, s

    def lr_info(self, ctx):
        return {"all": float(ctx.lr)}

    def eval_leaf(self, s, x, path):
        """The stored average x (a read-only view of the state array; not recomputed from y and z)."""
        view = s.x.view()
        view.flags.writeable = False
        return view


# The per-element arithmetic (y is the params element; the new y is returned). The operation order is the
# reference's torch calls: sub_(g, alpha=lr) -> z - lr*g; mul_(1-c).add_(z, alpha=c) -> x*(1-c) + c*z; ...

@numba.njit
def _sf_sgd(y, g, s, i, c):
    if c.use_wd:
        g = g + c.weight_decay * y
    z = s.z[i] - c.lr * g
    x = s.x[i] * c.omc + c.c * z
    s.z[i] = z
    s.x[i] = x
    return x * c.beta + c.ombeta * z


@numba.njit
def _sf_adamw(y, g, s, i, c):
    z = s.z[i]
    if c.use_wd:
        z = z - c.lr_wd * (z if c.decay_at_z else y)
    v = s.v[i] * c.beta2 + c.omb2 * g * g
    z = z + c.neg_lr * g / (np.sqrt(v / c.bc2) + c.eps)
    x = s.x[i] * c.omc + c.c * z
    s.v[i] = v
    s.z[i] = z
    s.x[i] = x
    return x * c.beta + c.ombeta * z


SF_SGD, SF_ADAMW = Elementwise(_sf_sgd, "sf_sgd"), Elementwise(_sf_adamw, "sf_adamw")
