"""What the rule files share: :class:`ElementwiseRule` (a rule whose arithmetic is one per-element function)
and :class:`Wrapper` (a rule built on a base rule). See :mod:`refopt.core` for the hooks."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from refopt.core import ArraySpec, Rule
from refopt.kernels import Elementwise, bad_leaves
from refopt.rules import _checks
from refopt.serialize import nested_rules


def lr_at(rule: Rule, t: int) -> float:
    """lr * gamma_t in float64 (gamma_t = rule.schedule(t), 1 without a schedule)."""
    return float(rule.lr) * _checks.schedule_multiplier(rule.schedule, t)


@dataclass(frozen=True)
class ElementwiseRule(Rule):
    """A rule of the form x <- decay*x - step*a with a = ``elem(x, g, s, i, c)`` per element
    (:class:`refopt.kernels.Elementwise`); its direction is u = u_scale*a.

    Subclasses set ``State`` (a NamedTuple of arrays shaped like x, zero at init) and implement
    ``context`` (returning a flat NamedTuple with ``lr_t``, ``decay``, ``step``, ``u_scale`` and whatever
    ``elem`` reads) and ``kernel()`` (the :class:`Elementwise` to run)."""

    State = None

    def kernel(self) -> Elementwise:  # pragma: no cover - abstract
        raise NotImplementedError

    def kernel_state(self, s):
        """The state arrays the kernel reads and writes (default: all of ``s``)."""
        return s

    def init_leaf(self, x, path):
        return self.State(*(np.zeros_like(x) for _ in self.State._fields))

    def leaf_spec(self, x, path):
        return self.State(*(ArraySpec.like(x) for _ in self.State._fields))

    def update_leaf(self, ctx, s, x, g, path):
        self.kernel().step(x, g, self.kernel_state(s), ctx)
        return x, s

    def direction_leaf(self, ctx, s, x, g, path):
        u = np.empty(x.shape, x.dtype)
        self.kernel().direction(u, x, g, self.kernel_state(s), ctx)
        return u, s


def rewrap(s: Any, base_state: Any) -> Any:
    """A wrapper's per-leaf state ``s`` (a NamedTuple with a field ``base``) holding ``base_state``: ``s``
    itself when that is already its base state (so that an in-place step keeps the state objects, which
    lets the walk reuse what it checked, :func:`refopt.update_`), else a copy with the new base."""
    return s if s.base is base_state else s._replace(base=base_state)


class WrapperContext(NamedTuple):
    """One step's scalars of a direction wrapper: its own ``lr * gamma_t`` and the base rule's context."""

    lr_t: float
    base: Any


@dataclass(frozen=True)
class Wrapper(Rule):
    """A rule built on ``base``: its per-leaf state and step context carry the base's in a field ``base``.
    The whole-tree hooks (``check_params``, ``init_global``, ``prepare``, ``reduce_tree``, ``inputs`` and
    ``reduce_inputs``, ``squares_grads``,
    ``lr_info``, ``after_init``) pass through to the base; ``context`` wraps the base's with :meth:`wrap_context`."""

    base: Rule

    def _check_base(self) -> None:
        if not isinstance(self.base, Rule):
            raise ValueError(f"{type(self).__name__}: base must be a refopt rule, got {type(self.base).__name__}")

    def wrap_context(self, t: int, base_ctx: Any) -> Any:
        """The wrapper's step context around the base's (default: :class:`WrapperContext` with lr*gamma_t)."""
        return WrapperContext(lr_at(self, t), base_ctx)

    def check_params(self, paths):
        self.base.check_params(paths)

    def init_global(self):
        return self.base.init_global()

    def context(self, t, glob):
        base_ctx, glob = self.base.context(t, glob)
        return self.wrap_context(t, base_ctx), glob

    def prepare(self, ctx, ss, xs, gs, paths):
        return self.base.prepare(ctx.base, [s.base for s in ss], xs, gs, paths)

    def reduce_tree(self, ctx, glob, ss, xs, gs, paths):
        base_ctx, glob = self.base.reduce_tree(ctx.base, glob, [s.base for s in ss], xs, gs, paths)
        return (ctx if base_ctx is ctx.base else ctx._replace(base=base_ctx)), glob

    @property
    def inputs(self):
        return self.base.inputs

    def reduce_inputs(self, ctx, glob, inputs, ss, xs, gs, paths):
        base_ctx, glob = self.base.reduce_inputs(ctx.base, glob, inputs, [s.base for s in ss], xs, gs, paths)
        return (ctx if base_ctx is ctx.base else ctx._replace(base=base_ctx)), glob

    def squares_grads(self, s):
        return self.base.squares_grads(s.base)

    def lr_info(self, ctx):
        return self.base.lr_info(ctx.base)

    def after_init(self, leaves, paths):
        self.base.after_init([s.base for s in leaves], paths)


@dataclass(frozen=True)
class DirectionWrapper(Wrapper):
    """A wrapper stepping along its base rule's direction u (``base.direction_leaf``), with its own lr and
    schedule (Hyperball, Covariant). :meth:`check_base` rejects what it would silently drop."""

    #: what replaces the base's decoupled decay, in check_base's error ({owner}: the wrapper's name)
    decay_advice = "the norm control of {owner} replaces weight decay"

    def check_base(self) -> None:
        """ValueError when ``base`` is not a refopt rule, has no additive direction (no ``direction_leaf``,
        e.g. an averaging wrapper), or when it or a rule nested in it (a Partition's rules, an inner
        wrapper's base) carries its own ``schedule`` (only directions are used, so it would be ignored:
        pass the schedule to the wrapper) or decay acting on the weights (:meth:`Rule.decoupled_decay`:
        AdamW's, Muon's or Lion's weight_decay > 0; it would be dropped). L2 decay (SGD's and Adam's
        ``weight_decay``) is part of the gradient, so of u, and is kept."""
        owner = type(self).__name__
        self._check_base()
        if type(self.base).direction_leaf is Rule.direction_leaf:
            raise ValueError(f"{owner}: base rule {type(self.base).__name__} has no additive direction "
                             f"(it defines no direction_leaf), so it cannot be wrapped")
        for r in (self.base, *nested_rules(self.base)):
            name = type(r).__name__
            if getattr(r, "schedule", None) is not None:
                raise ValueError(f"{owner}: the schedule of the base rule {name} would be ignored (only its "
                                 f"direction is used); pass schedule= to {owner} instead")
            if r.decoupled_decay():
                wd = getattr(r, "weight_decay", "?")
                raise ValueError(f"{owner}: the base rule {name} has weight_decay={wd} acting on the "
                                 f"weights, not on the direction, so {owner} would drop it; set it to 0 "
                                 f"({self.decay_advice.format(owner=owner)})")

    def lr_info(self, ctx):
        return {"all": float(ctx.lr_t)}

    def prepare(self, ctx, ss, xs, gs, paths):
        """The weights must be finite (their norm scales the step): FloatingPointError naming the first
        array that is not (one pass over the whole tree per dtype), before anything is written; then the
        base's pre-pass."""
        bad = bad_leaves(xs, [math.inf] * len(xs))
        if bad:
            raise FloatingPointError(f"{type(self).__name__}: the weights at {paths[bad[0]]} hold nan or inf; "
                                     f"parameters must be finite")
        return super().prepare(ctx, ss, xs, gs, paths)

    def base_direction(self, ctx, s, x, g, path):
        """The base rule's direction u for one array (a C-contiguous array like x) and its new state."""
        u, sb = self.base.direction_leaf(ctx.base, s.base, x, g, path)
        if not isinstance(u, np.ndarray) or u.shape != x.shape or u.dtype != x.dtype:
            raise ValueError(f"{type(self.base).__name__}.direction_leaf returned a direction that is not an array "
                             f"of x's shape {x.shape} and dtype {x.dtype} at {path}")
        return np.ascontiguousarray(u), sb
