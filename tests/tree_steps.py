"""A rule stepped over a list of gradient trees through the pure API, shared by the rule tests."""
from __future__ import annotations

import refopt


def run(rule, x0, gs):
    """(params, state) after ``refopt.update`` on each gradient of ``gs``, from ``refopt.init(rule, x0)``."""
    x, s = x0, refopt.init(rule, x0)
    for g in gs:
        x, s = refopt.update(rule, s, x, g)
    return x, s


def last_params(adapter, x0, gs):
    """The single array's params after stepping ``adapter`` (an Adapter's init/step over a list of one array)
    through the gradients ``gs``."""
    s, x = adapter.init([x0]), [x0]
    for g in gs:
        x, s = adapter.step(s, x, [g])
    return x[0]
