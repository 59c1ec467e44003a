"""Gradient clipping by the global norm, before a base rule (torch's ``clip_grad_norm_``,
``optax.clip_by_global_norm``)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from refopt.core import cast_scalar
from refopt.kernels import reject_bad_grads, square_bound
from refopt.linalg.norms import fro_norm
from refopt.rules import _checks
from refopt.rules.base import Wrapper, rewrap


class ClipState(NamedTuple):
    """Per-array state: only the base rule's."""

    base: Any


class ClipContext(NamedTuple):
    """The base rule's step context (the clipping factor is computed in the pre-pass)."""

    base: Any


@dataclass(frozen=True)
class ClipByGlobalNorm(Wrapper):
    r"""Clip all gradients by their global norm, then step the base rule on the clipped gradients.

    Before any array is stepped (the walk's pre-pass, :meth:`refopt.core.Rule.prepare`), over the arrays the
    rule owns (all of them, or its group inside a :class:`~refopt.rules.partition.Partition`):

    .. math::

        N &= \sqrt{\textstyle\sum_i \lVert g_i \rVert_F^2} \qquad \text{(float64, whatever the dtype)} \\
        c &= \min\bigl(1, \mathrm{max\_norm} / (N + \epsilon)\bigr) \qquad (c = 1 \text{ when } N + \epsilon = 0) \\
        g_i &\leftarrow c\, g_i \qquad \text{(new arrays: the caller's gradients are not written)}

    ``eps=0`` is ``optax.clip_by_global_norm(max_norm)`` (which keeps g when N < max_norm and takes
    (g/N)*max_norm otherwise: the same to rounding); ``eps=1e-6`` is torch's
    ``torch.nn.utils.clip_grad_norm_(params, max_norm)`` (factor max_norm/(N + 1e-6) clamped to 1). torch
    and optax compute N in the gradients' dtype, refopt in float64, so float32 agrees to about 1e-7.

    Args:
      base: any refopt rule.
      max_norm: > 0.
      eps: >= 0 added to N in the factor's denominator (0: optax; 1e-6: torch).

    Shapes/dtypes: the base's; c is cast to each gradient's dtype (checked). The state and the global state
    are the base's.

    Raises:
      ValueError: if base is not a refopt rule, max_norm <= 0 or eps < 0.
      FloatingPointError: (before anything is written) when a clipped gradient is still too large for a
        second-moment base.
    """

    max_norm: float = 1.0
    eps: float = 0.0

    def __post_init__(self):
        self._check_base()
        _checks.positive("max_norm", self.max_norm)
        _checks.nonnegative("eps", self.eps)

    def init_leaf(self, x, path):
        return ClipState(self.base.init_leaf(x, path))

    def leaf_spec(self, x, path):
        return ClipState(self.base.leaf_spec(x, path))

    def wrap_context(self, t, base_ctx):
        return ClipContext(base_ctx)

    def squares_grads(self, s):
        return False   # the raw gradients need only be finite; the clipped ones are checked in prepare

    def prepare(self, ctx, ss, xs, gs, paths):
        norm = math.hypot(*(fro_norm(g) for g in gs)) if gs else 0.0
        denom = norm + float(self.eps)
        c = 1.0 if denom == 0.0 else min(1.0, float(self.max_norm) / denom)
        if c < 1.0:
            gs = [np.multiply(g, cast_scalar(c, g.dtype, "ClipByGlobalNorm factor max_norm / (N + eps)"),
                              out=np.empty(g.shape, g.dtype)) for g in gs]   # arrays, 0-d ones too
        sb = [s.base for s in ss]
        bounds = [square_bound(g.dtype) if self.base.squares_grads(s) else math.inf for g, s in zip(gs, sb)]
        if any(min(norm, self.max_norm) >= b for b in bounds):
            reject_bad_grads(gs, paths, bounds, [type(self.base).__name__] * len(gs))
        return self.base.prepare(ctx.base, sb, xs, gs, paths)

    def update_leaf(self, ctx, s, x, g, path):
        x, sb = self.base.update_leaf(ctx.base, s.base, x, g, path)
        return x, rewrap(s, sb)

    def direction_leaf(self, ctx, s, x, g, path):
        u, sb = self.base.direction_leaf(ctx.base, s.base, x, g, path)
        return u, ClipState(sb)

    def eval_leaf(self, s, x, path):
        return self.base.eval_leaf(s.base, x, path)
