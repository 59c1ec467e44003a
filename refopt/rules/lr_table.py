"""LRTable: a base rule's direction with a recorded learning rate per array and per step."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, NamedTuple

from refopt.core import cast_scalar
from refopt.linalg.norms import fro_norm, sub_scaled
from refopt.rules import _checks
from refopt.rules.base import DirectionWrapper, rewrap


class LRTableState(NamedTuple):
    """Per-array LRTable state: only the base rule's per-array state."""

    base: Any


class LRTableContext(NamedTuple):
    """The step number t (to read the table) and the base rule's context."""

    t: int
    base: Any


@dataclass(frozen=True)
class LRTable(DirectionWrapper):
    r"""Give each array its own learning rate at every step, read from a recorded table (post 002's
    experiment "weight decay only sets the learning rate": replay MuonWD's ``eta_t/||W_t||_F`` with Muon
    without decay).

    At step t (t = 1 first), for an array at path p with u_t the base rule's direction:

    .. math::

        x_t = \begin{cases} x_{t-1} - \mathrm{lr}_t[p]\, u_t & \text{if } p \text{ is in lrs} \\
        \text{base step} & \text{otherwise (the base rule's own lr)} \end{cases}

    with ``lr_t[p] = lrs[p][t-1]``, or ``lr_t[p] = lrs[p][t-1] * ||x_{t-1}||_F`` when ``relative`` (the
    table then holds post 002's ``eta_eff = lr/||W||_F``, replayed on this run's own weight norm).

    Args:
      base: a refopt rule with a direction (Muon, SGD, Adam, ...; see
        :meth:`~refopt.rules.base.DirectionWrapper.check_base`: no schedule, no decoupled decay).
      lrs: ``{path: (lr_1, lr_2, ..., lr_T)}``, paths as :mod:`refopt.tree` writes them
        (``layers[1].w``); every lr finite and >= 0. Stored in the rule (a dict of tuples of Python
        floats), so it is saved by :func:`refopt.save` and restored exactly by :func:`refopt.load`.
      relative: False (the table holds learning rates) or True (rates per unit of ``||x_{t-1}||_F``).

    Shapes/dtypes: what the base accepts; lr is cast to x's dtype. :func:`refopt.update`'s ``info["lr"]``
    reports the base rule's lr (the arrays without a row).

    Raises:
      ValueError: at construction for a bad base, an empty table, a non-string path, an empty row or a
        negative / non-finite lr (naming the path); at :func:`refopt.init` for a table path params lacks;
        before a step writes anything, naming the path when the table has no entry for step t or its lr
        does not fit x's dtype.
    """

    lrs: Mapping[str, tuple] = None
    relative: bool = False

    def __post_init__(self):
        self.check_base()
        _checks.boolean("relative", self.relative)
        if not isinstance(self.lrs, Mapping) or not self.lrs:
            raise ValueError(f"lrs must be a non-empty dict {{path: (lr_1, ..., lr_T)}}, got {self.lrs!r}")
        table = {}
        for p, row in self.lrs.items():
            if not isinstance(p, str) or not p:
                raise ValueError(f"lrs: paths must be non-empty strings, got {p!r}")
            try:
                row = tuple(_checks.finite_number(f"lrs[{p!r}][{i}]", v) for i, v in enumerate(row))
            except TypeError:
                raise ValueError(f"lrs[{p!r}] must be a sequence of learning rates, got {row!r}") from None
            if not row or min(row) < 0:
                raise ValueError(f"lrs[{p!r}] must be a non-empty sequence of learning rates >= 0")
            table[p] = row
        object.__setattr__(self, "lrs", _checks.FrozenDict(table))

    def check_params(self, paths):
        extra = sorted(set(self.lrs) - set(paths))
        if extra:
            raise ValueError(f"LRTable: the table has rows for {extra[0]}, which params lacks")
        self.base.check_params(paths)

    def init_leaf(self, x, path):
        return LRTableState(self.base.init_leaf(x, path))

    def leaf_spec(self, x, path):
        return LRTableState(self.base.leaf_spec(x, path))

    def wrap_context(self, t, base_ctx):
        return LRTableContext(t, base_ctx)

    def lr_info(self, ctx):
        return self.base.lr_info(ctx.base)

    def _lr(self, t: int, x, path: str):
        """lr_t[path] cast to x's dtype (None without a row); ValueError when the row has no step t."""
        row = self.lrs.get(path)
        if row is None:
            return None
        if t > len(row):
            raise ValueError(f"LRTable: the table for {path} has {len(row)} steps, step {t} was asked for")
        lr = row[t - 1] * fro_norm(x) if self.relative else row[t - 1]
        return cast_scalar(lr, x.dtype, f"LRTable.lrs[{path!r}][{t - 1}]", allow_underflow=True)

    def prepare(self, ctx, ss, xs, gs, paths):
        for x, p in zip(xs, paths):   # every row read and cast before any array is written
            self._lr(ctx.t, x, p)
        return super().prepare(ctx, ss, xs, gs, paths)

    def update_leaf(self, ctx, s, x, g, path):
        lr = self._lr(ctx.t, x, path)
        if lr is None:
            x, sb = self.base.update_leaf(ctx.base, s.base, x, g, path)
            return x, rewrap(s, sb)
        u, sb = self.base_direction(ctx, s, x, g, path)
        sub_scaled(x.reshape(-1), u.reshape(-1), lr)
        return x, rewrap(s, sb)

    def lr_at(self, path: str, t: int) -> float:
        """The learning rate of step t (1-based) for ``path`` (math.nan when the table has no row)."""
        row = self.lrs.get(path)
        return row[t - 1] if row is not None and 1 <= t <= len(row) else math.nan
