"""One list of every rule configuration, for the generic tests (``test_rules_generic.py``).

Each rule's conventions file (refopt/conventions/<rule>.py) lists its configurations as ``examples``
(:class:`refopt.conventions.Example`); this module gathers them all from the registry, so adding a rule never
means editing a shared file.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from refopt.conventions._spec import example_params


def mixed_params(dtype=np.float64, seed=0) -> dict:
    """A small tree with matrices of both orientations, a vector and a nested list."""
    return example_params("mixed", dtype, seed)


def matrix_params(dtype=np.float64, seed=0) -> dict:
    """Only 2-D leaves (for rules such as Muon that take matrices only)."""
    return example_params("matrix", dtype, seed)


@dataclass
class Case:
    """A rule configuration under test.

    name: unique id; make_rule: () -> rule; make_params: (dtype, seed) -> params tree the rule accepts;
    converges: whether the quadratic-convergence test applies (False for rules whose fixed lr keeps
    them from settling, with the reason in ``note``); quad_steps: steps for that test.
    """

    name: str
    make_rule: Callable[[], Any]
    make_params: Callable[..., Any] = mixed_params
    converges: bool = True
    quad_steps: int = 300
    note: str = ""
    extra: dict = field(default_factory=dict)


def all_cases() -> list[Case]:
    from refopt.conventions import registry

    cases = [Case(e.name, e.make_rule, functools.partial(example_params, e.params), e.converges, e.quad_steps, e.note,
                  dict(e.extra)) for c in registry().values() for e in c.examples]
    names = [c.name for c in cases]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ValueError(f"duplicate case names in the catalog: {sorted(dup)}")
    return cases
