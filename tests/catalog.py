"""One list of every rule configuration, for the generic tests (``test_rules_generic.py``).

Each rule family contributes a module ``tests/catalog_<family>.py`` defining ``CASES``, a list of
:class:`Case`. This module gathers them all, so adding a rule never means editing a shared file.
"""
from __future__ import annotations

import glob
import importlib
import os
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np


def mixed_params(dtype=np.float64, seed=0) -> dict:
    """A small tree with matrices of both orientations, a vector and a nested list."""
    rng = np.random.default_rng(seed)
    return {
        "layers": [
            {"w": rng.standard_normal((5, 3)).astype(dtype), "b": rng.standard_normal(3).astype(dtype)},
            {"w": rng.standard_normal((3, 4)).astype(dtype), "b": rng.standard_normal(4).astype(dtype)},
        ],
        "scale": rng.standard_normal((2, 2)).astype(dtype),
    }


def matrix_params(dtype=np.float64, seed=0) -> dict:
    """Only 2-D leaves (for rules such as Muon that take matrices only)."""
    rng = np.random.default_rng(seed)
    return {"w1": rng.standard_normal((6, 4)).astype(dtype), "w2": rng.standard_normal((4, 7)).astype(dtype)}


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
    here = os.path.dirname(__file__)
    cases: list[Case] = []
    for path in sorted(glob.glob(os.path.join(here, "catalog_*.py"))):
        mod = importlib.import_module(os.path.splitext(os.path.basename(path))[0])
        cases.extend(mod.CASES)
    names = [c.name for c in cases]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ValueError(f"duplicate case names in the catalog: {sorted(dup)}")
    return cases
