"""muP learning rates per layer type (post 001, "muP derivation for z = Wx"), as a refopt Partition.

For a network whose hidden width n grows, with a base width n0 at which lr was tuned (ratio m = n/n0),
post 001 derives the learning rate of each layer type so that every layer's output changes by Theta(1)
per step:

    layer type                       SGD            Adam
    first  (fixed -> n)              lr * m         lr
    hidden (n -> n)                  lr             lr / m
    last   (n -> fixed)              lr / m         lr / m

Vectors (biases, gains: a fixed fan-in of 1) scale like the first layer. At n = n0 every group gets lr,
so the parametrization only changes how the rates move with width. Initialisation is separate (seed
001: hidden sigma^2 = Theta(1/n), last layer O(1/n^2); post 003: sigma = sqrt(d_out/d_in)/(sqrt(d_in) +
sqrt(d_out))); see :func:`mup_sigma`.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from refopt import tree as T
from refopt.rules import _checks
from refopt.rules.adam import Adam, AdamW
from refopt.rules.partition import Partition
from refopt.rules.sgd import SGD

FIRST, HIDDEN, LAST = "first", "hidden", "last"
_MULT = {"sgd": {FIRST: 1, HIDDEN: 0, LAST: -1}, "adam": {FIRST: 0, HIDDEN: -1, LAST: -1}}


def layer_types(params: Any) -> Any:
    """A labels tree shaped like ``params``: the first 2-D leaf in flatten order is ``'first'``, the last
    ``'last'``, the other 2-D leaves ``'hidden'``, every leaf with ndim != 2 ``'first'`` (vector-like).
    For refopt's MLP (``{"layers": [{"w", "b"}, ...]}``) flatten order is layer order.
    Raises ValueError for fewer than two 2-D leaves."""
    xs, _, td = T.flatten(params)
    mats = [i for i, x in enumerate(xs) if np.ndim(x) == 2]
    if len(mats) < 2:
        raise ValueError("layer_types needs at least two weight matrices (a first and a last layer)")
    labels = [FIRST] * len(xs)
    for i in mats[1:-1]:
        labels[i] = HIDDEN
    labels[mats[-1]] = LAST
    return T.unflatten(td, labels)


def mup_lrs(lr: float, width: int, base_width: int, optimizer: str = "adam") -> dict[str, float]:
    """``{'first', 'hidden', 'last'}`` -> learning rate, from the table of the module docstring.
    optimizer: 'sgd' or 'adam' (Adam and AdamW). Raises ValueError for lr < 0, widths < 1 or an unknown
    optimizer."""
    _checks.nonnegative("lr", lr)
    _checks.one_of("optimizer", optimizer, set(_MULT))
    for name, v in (("width", width), ("base_width", base_width)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")
    m = width / base_width
    return {k: float(lr) * m ** p for k, p in _MULT[optimizer].items()}


def mup_partition(params: Any, lr: float, width: int, base_width: int, optimizer: str = "adam",
                  **hyper) -> Partition:
    """A :class:`~refopt.rules.partition.Partition` with post 001's muP learning rate per layer type
    (:func:`mup_lrs`, labels from :func:`layer_types`). optimizer: 'sgd' (refopt.SGD), 'adam'
    (refopt.Adam) or 'adamw' (refopt.AdamW; its weight_decay keeps torch's lr coupling unless
    ``wd_mode='independent'``); ``hyper`` goes to every group's rule (momentum, betas, schedule, ...)."""
    _checks.one_of("optimizer", optimizer, {"sgd", "adam", "adamw"})
    lrs = mup_lrs(lr, width, base_width, "sgd" if optimizer == "sgd" else "adam")
    cls = {"sgd": SGD, "adam": Adam, "adamw": AdamW}[optimizer]
    return Partition(rules={k: cls(lr=v, **hyper) for k, v in lrs.items()}, labels=layer_types(params))


def mup_sigma(d_in: int, d_out: int) -> float:
    """Post 003's init standard deviation sigma = sqrt(d_out/d_in) / (sqrt(d_in) + sqrt(d_out)): a
    standard normal d_in x d_out matrix has ||W||_2 about sqrt(d_in) + sqrt(d_out), so sigma*W has
    RMS->RMS operator norm about 1."""
    if min(d_in, d_out) < 1:
        raise ValueError(f"d_in and d_out must be >= 1, got {d_in}, {d_out}")
    return math.sqrt(d_out / d_in) / (math.sqrt(d_in) + math.sqrt(d_out))
