"""Hyperparameter validation shared by the rules: every check raises ``ValueError`` naming the field."""
from __future__ import annotations

import math
import numbers
from typing import Callable

import numpy as np


def finite_number(name: str, value) -> float:
    """``value`` as a float; Python and numpy real scalars are accepted, bools are not."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def nonnegative(name: str, value) -> None:
    if finite_number(name, value) < 0:
        raise ValueError(f"{name} must be >= 0, got {value!r}")


def positive(name: str, value) -> None:
    if finite_number(name, value) <= 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")

def nonnegative_int(name: str, value) -> None:
    """A Python int >= 0 (not a bool, not a numpy integer: rules are stored as JSON in checkpoints)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")


def positive_int(name: str, value) -> int:
    """An integer >= 1 (a Python or numpy integer, not a bool), returned as a Python int (rules are stored as
    JSON in checkpoints)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")
    return int(value)


def unit_interval(name: str, value) -> None:
    """value in [0, 1)."""
    v = finite_number(name, value)
    if not 0.0 <= v < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {value!r}")


class FrozenDict(dict):
    """A dict that refuses changes: the table fields of a frozen rule (Partition.rules, LRTable.lrs), which
    the walk validates once and must not change under a live state. Copies (copy, deepcopy, pickle) stay
    frozen; ``dict(d)`` gives a mutable copy."""

    def _refuse(self, *args, **kwargs):
        raise TypeError("this table belongs to a frozen rule and cannot be changed; build a new rule "
                        "(dataclasses.replace(rule, field=new_dict))")

    __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = __ior__ = _refuse

    def __reduce__(self):
        return type(self), (dict(self),)

    def __repr__(self):
        return repr(dict(self))


class ChoiceError(ValueError):
    """The ValueError of :func:`one_of`; ``field`` and ``allowed`` (its choices, sorted by repr) let the
    diagnosis enumerate a categorical option's values (:mod:`refopt.conventions._generated`)."""

    def __init__(self, message: str, field: str, allowed: list):
        super().__init__(message)
        self.field, self.allowed = field, allowed


def one_of(name: str, value, allowed) -> None:
    """``value`` must be one of ``allowed`` (None, bools, strings), by kind as well as by value: 1, 1.0, 1+0j or
    numpy's True (equal to True) are not taken for True, and an unhashable value (a list) is a ValueError too
    (:class:`ChoiceError`)."""
    if not any(_same_kind(value, a) for a in allowed):
        choices = sorted(allowed, key=repr)
        raise ChoiceError(f"{name} must be one of {choices}, got {value!r}", name, choices)


def _same_kind(value, a) -> bool:
    if a is None:
        return value is None
    if isinstance(a, bool):   # a Python bool, as boolean() wants (rules are stored as JSON in checkpoints)
        return isinstance(value, bool) and value == a
    if isinstance(a, str):
        return isinstance(value, str) and value == a
    return type(value) is type(a) and value == a


def schedule(value) -> None:
    if value is not None and not callable(value):
        raise ValueError(f"schedule must be None or a function t -> multiplier, got {value!r}")


def schedule_multiplier(sched: Callable[[int], float] | None, t: int) -> float:
    """gamma_t = sched(t) (1.0 without a schedule); must be finite and >= 0."""
    if sched is None:
        return 1.0
    gamma = float(sched(t))
    if not math.isfinite(gamma) or gamma < 0:
        raise ValueError(f"schedule({t}) = {gamma!r}; a schedule multiplier must be finite and >= 0")
    return gamma


def boolean(name: str, value) -> None:
    """A Python bool (not a numpy bool: rules are stored as JSON in checkpoints)."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")


def growth_rate(value) -> None:
    """A number >= 1 (math.inf: unbounded), the bound d_{t+1} <= rho d_t of a step-size estimate."""
    if not (isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 1):
        raise ValueError(f"growth_rate must be a number >= 1 (math.inf: unbounded), got {value!r}")
