r"""Check your own optimizer: invariance properties and adapters for any torch, JAX or numpy optimizer.

* :mod:`refopt.testing.adapters` -- any optimizer as one pure step over numpy pytrees (refopt rule,
  ``torch.optim.Optimizer``, ``optax.GradientTransformation``, a numpy ``init``/``step`` pair).
* :mod:`refopt.testing.strategies` -- hypothesis strategies (pytrees, matrices, orthogonal matrices,
  positive scales, gradient streams, rule configurations).
* :mod:`refopt.testing.properties` -- the invariance properties of the theory (posts 000, 003, 004), each
  a function that runs hypothesis and returns a :class:`~refopt.testing.properties.Outcome` with the
  shrunk counterexample; :func:`invariants` runs them all on an implementation next to the refopt rule
  and prints the expected-outcome table (:mod:`refopt.testing.expected`).

The strategies and properties need hypothesis (``pip install "refopt[testing]"``); the adapters do not.
"""
from __future__ import annotations

import importlib

from refopt.testing.adapters import (Adapter, NumpyAdapter, OptaxAdapter, RuleAdapter, TorchAdapter, UserCodeError,
                                     load_impl, make_adapter)

_NEEDS_HYPOTHESIS = {"strategies": "refopt.testing.strategies", "properties": "refopt.testing.properties",
                     "expected": "refopt.testing.expected"}
_FROM_PROPERTIES = ("PROPERTIES", "Outcome", "invariants", "invariants_table", "InvariantsReport")

__all__ = ["Adapter", "RuleAdapter", "TorchAdapter", "OptaxAdapter", "NumpyAdapter", "UserCodeError", "make_adapter",
           "load_impl", "strategies", "properties", "expected", *_FROM_PROPERTIES]


def _require_hypothesis():
    try:
        import hypothesis  # noqa: F401
    except ImportError:
        raise ImportError("refopt.testing's strategies and properties need hypothesis: "
                          "pip install \"refopt[testing]\" (or pip install hypothesis)") from None


def __getattr__(name):
    if name in _NEEDS_HYPOTHESIS:
        _require_hypothesis()
        return importlib.import_module(_NEEDS_HYPOTHESIS[name])
    if name in _FROM_PROPERTIES:
        _require_hypothesis()
        return getattr(importlib.import_module("refopt.testing.properties"), name)
    raise AttributeError(f"module 'refopt.testing' has no attribute {name!r}")
