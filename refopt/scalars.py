"""The checked cast of a step's scalars to the array dtype (item 3 of the walk, :mod:`refopt.core`).

A rule's ``context`` computes its step scalars in Python float64; the walk casts them to each array dtype
present. A value that overflows there, or that is non-zero and rounds to 0, would silently make the step
wrong, so the cast raises ``ValueError`` naming it; a step size that rounds to 0 is a zero step instead
(PITFALLS B06: the params stay, nothing becomes nan).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

#: step sizes (fields of a step context): one that rounds to 0 in the dtype is a zero step (PITFALLS B06:
#: the params stay, nothing becomes nan), not an error; they still must not overflow
STEP_SIZES = frozenset({"lr_t", "step", "lr", "neg_lr", "lr_wd"})


def cast_scalar(value: float, dtype, name: str, allow_underflow: bool = False):
    """``value`` as a scalar of ``dtype``; ``ValueError`` naming it when it is not finite, overflows, or
    (unless ``allow_underflow``) is non-zero and rounds to 0 in ``dtype``."""
    with np.errstate(over="ignore", under="ignore"):
        v = np.dtype(dtype).type(value)
    if not math.isfinite(value) or not np.isfinite(v) or (value != 0 and v == 0 and not allow_underflow):
        what = "is 0 (it underflows)" if np.isfinite(v) else "is not finite (it overflows)"
        raise ValueError(f"{name} = {value!r} {what.replace(' (', f' in {np.dtype(dtype)} (')}; choose "
                         f"hyperparameters that {np.dtype(dtype)} can represent")
    return v


def cast_context(ctx: Any, dtype, name: str) -> Any:
    """``ctx`` with every Python/numpy float cast by :func:`cast_scalar` (named ``name.field``; the fields
    in :data:`STEP_SIZES` may underflow to 0); ints, bools, strings and None kept; NamedTuples, tuples and
    dicts rebuilt recursively."""
    if isinstance(ctx, (bool, np.bool_, int, np.integer, str)) or ctx is None:
        return ctx
    if isinstance(ctx, (float, np.floating)):
        return cast_scalar(float(ctx), dtype, name, allow_underflow=name.rsplit(".", 1)[-1] in STEP_SIZES)
    if isinstance(ctx, dict):
        return {k: cast_context(v, dtype, f"{name}[{k!r}]") for k, v in ctx.items()}
    if isinstance(ctx, tuple):
        names = getattr(type(ctx), "_fields", None)
        vals = [cast_context(v, dtype, f"{name}.{names[i]}" if names else f"{name}[{i}]")
                for i, v in enumerate(ctx)]
        return type(ctx)(*vals) if names else tuple(vals)
    return ctx
