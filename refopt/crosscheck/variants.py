r"""Convention variants: the known ways an implementation of a rule can differ, each runnable.

When an implementation does not reproduce a refopt rule, :func:`variants` lists the convention variants of
that rule, each as an :class:`~refopt.testing.adapters.Adapter`; the plug-in cross-check
(:mod:`refopt.crosscheck.plugin`) runs them all on the same inputs and names the one that reproduces the
implementation's numbers. A rule's variants come from its conventions file (:mod:`refopt.conventions`):
either the rule's plain-numpy oracle with one convention switched (:func:`oracle_variant`: eps inside the
square root, the bias correction off by one, the decay after the update, ...) or the refopt rule with
other hyperparameters (:func:`rule_variant`: Muon's scales, Nesterov modes, ...). A wrapper's variants
include its base rule's (:func:`base_variants`, named "... (base)"). Any rule with ``weight_decay`` > 0 or
a ``schedule`` also gets the generic variants: ``no weight decay on vectors`` (decay on arrays of ndim >= 2
only: the usual torch parameter groups), ``schedule counted from 0`` (gamma(t - 1) at step t) and
``schedule one step ahead`` (gamma(t + 1)).

Variants that equal the rule for its hyperparameters are left out.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np

from refopt import tree as T
from refopt.testing.adapters import Adapter, RuleAdapter

__all__ = ["Variant", "variants", "oracle_variant", "rule_variant", "base_variants", "TransposedRule",
           "ConventionAdam", "ConventionSGD", "TrustRatioThenMomentum", "TrustRatioOneAtZero", "try_replace"]


@dataclass(frozen=True)
class Variant:
    """A named convention variant: ``make()`` returns its adapter; ``rule`` is the refopt rule it runs (a
    rule variant) or ``switches`` the oracle's switched conventions (an oracle variant)."""

    name: str
    detail: str
    make: Callable[[], Adapter]
    rule: Any = None
    switches: dict | None = None


def oracle_variant(rule, name: str, detail: str, **switches) -> Variant:
    """The rule's plain-numpy oracle (:func:`refopt.conventions.oracle`) with ``switches``."""
    from refopt.conventions import oracle
    return Variant(name, detail, lambda: oracle(rule, name=name, **switches), switches=switches)


def rule_variant(name: str, detail: str, rule) -> Variant | None:
    """The refopt ``rule`` (another configuration) as a variant; None when ``rule`` is None."""
    return None if rule is None else Variant(name, detail, lambda r=rule: RuleAdapter(r), rule=rule)


def base_variants(rule) -> list[Variant]:
    """A wrapper's variants from its base rule's: the wrapper around each base variant."""
    from refopt.conventions import oracle

    out = []
    for v in variants(rule.base):
        if v.rule is not None:
            try:
                wrapped = replace(rule, base=v.rule)
            except (TypeError, ValueError):   # e.g. a direction wrapper refuses the variant's schedule
                continue
            out.append(rule_variant(f"{v.name} (base)", v.detail, wrapped))
        elif v.switches is not None:
            out.append(Variant(f"{v.name} (base)", v.detail,
                               lambda v=v: oracle(rule, name=f"{v.name} (base)", base=oracle(rule.base, **v.switches)),
                               switches={"base": v.switches}))
    return out


class TransposedRule(RuleAdapter):
    """A refopt rule run on the transposes (torch's layout) of the matrices."""

    def __init__(self, rule):
        super().__init__(rule)
        self.name = f"{type(rule).__name__} on W^T"

    def _t(self, tree):
        from refopt.testing.adapters import to_layout
        xs, _, td = T.flatten(tree)
        return T.unflatten(td, [to_layout(np.asarray(x), "torch") for x in xs])

    def _b(self, tree):
        from refopt.testing.adapters import from_layout
        xs, _, td = T.flatten(tree)
        return T.unflatten(td, [from_layout(np.asarray(x), "torch") for x in xs])

    def init(self, params):
        return super().init(self._t(params))

    def step(self, state, params, grads):
        x, state = super().step(state, self._t(params), self._t(grads))
        return self._b(x), state

    def state_arrays(self, state) -> dict:
        return {k: [None if a is None else self._b([a])[0] for a in v] for k, v in super().state_arrays(state).items()}


# ---- the generic variants ---------------------------------------------------------------------------------
def try_replace(rule, **changes):
    """``replace(rule, **changes)``, or None when the rule refuses the changes or they change nothing."""
    try:
        new = replace(rule, **changes)
    except (TypeError, ValueError):
        return None
    return None if new == rule else new


def _decayed_labels(path: str, x) -> str:
    """'decayed' for arrays of ndim >= 2, 'not_decayed' for vectors and scalars (biases, gains)."""
    return "decayed" if np.ndim(x) >= 2 else "not_decayed"


def _shifted(schedule, shift: int):
    def gamma(t):
        return schedule(t + shift)
    return gamma


def _generic(rule) -> list[Variant]:
    """Weight decay on matrices only (the usual torch parameter groups: no decay on biases and gains), and
    the schedule read one step early or late (a torch LR scheduler stepped before the optimizer, or counted
    from 0: docs/divergences.md)."""
    from refopt.rules.partition import Partition

    out = []
    if (getattr(rule, "weight_decay", 0) or 0) > 0:
        no_wd = try_replace(rule, weight_decay=0.0)
        if no_wd is not None:
            out.append(rule_variant("no weight decay on vectors", "weight decay on arrays of ndim >= 2 only: "
                                    "biases and gains in a parameter group without decay (torch, nanoGPT, "
                                    "timm practice)", Partition({"decayed": rule, "not_decayed": no_wd},
                                                                labels=_decayed_labels)))
    sched = getattr(rule, "schedule", None)
    if callable(sched):
        for name, detail, shift in (("schedule counted from 0", "gamma(t - 1) at step t: t counted from 0, "
                                     "or a torch LR scheduler stepped before the optimizer", -1),
                                    ("schedule one step ahead", "gamma(t + 1) at step t", 1)):
            out.append(rule_variant(name, detail, try_replace(rule, schedule=_shifted(sched, shift))))
    return [v for v in out if v is not None]


def _unique(vs: list) -> list[Variant]:
    seen, out = set(), []
    for v in vs:
        if v is not None and v.name not in seen:
            seen.add(v.name)
            out.append(v)
    return out


def variants(rule) -> list[Variant]:
    """The convention variants of ``rule`` (see the module docstring); [] for a rule with none known."""
    from refopt.conventions import for_rule

    conv = for_rule(rule)
    own = conv.variants(rule) if conv is not None and conv.variants is not None else []
    return _unique(list(own) + _generic(rule))


# ---- the names the divergence atlas builds its restated sides with ----------------------------------------
def ConventionAdam(lr, beta1, beta2, eps, weight_decay=0.0, decay="none", eps_mode="outside", bias="standard",
                   nesterov=False, schedule=None, name="adam variant"):
    """Adam with switched conventions (:class:`refopt.conventions.adam.AdamOracle`)."""
    from refopt.conventions.adam import AdamOracle
    from refopt.rules.adam import Adam
    rule = Adam(lr=lr, beta1=beta1, beta2=beta2, eps=eps, schedule=schedule)
    return AdamOracle(rule, name=name, weight_decay=weight_decay, decay=decay if weight_decay else "none",
                      eps_mode=eps_mode, bias=bias, nesterov=nesterov)


def ConventionSGD(lr, momentum=0.0, dampening=0.0, nesterov="none", weight_decay=0.0, decay="none",
                  dampen_first=False, schedule=None, name="sgd variant"):
    """SGD with switched conventions (:class:`refopt.conventions.sgd.SGDOracle`)."""
    from refopt.conventions.sgd import SGDOracle
    from refopt.rules.sgd import SGD
    rule = SGD(lr=lr, schedule=schedule)
    return SGDOracle(rule, name=name, momentum=momentum, dampening=dampening, nesterov=nesterov,
                     weight_decay=weight_decay, decay=decay, dampen_first=dampen_first)


def TrustRatioThenMomentum(lr, momentum, weight_decay=0.0, name="trust ratio, then momentum"):
    """optax.lars's order (:class:`refopt.conventions.covariant.TrustRatioThenMomentum`)."""
    from refopt.conventions import covariant
    from refopt.rules.covariant import Covariant
    from refopt.rules.sgd import SGD
    return covariant.TrustRatioThenMomentum(Covariant(SGD(momentum=momentum, weight_decay=weight_decay), lr=lr),
                                            name=name)


def TrustRatioOneAtZero(rule):
    """Covariant with optax's zero-norm convention (:class:`refopt.conventions.covariant.CovariantOracle` with
    ``zero_ratio_one``): the step is -lr ratio u with ratio = ||x||/||u||, and 1 when either norm is 0."""
    from refopt.conventions import oracle
    return oracle(rule, name="trust ratio 1 at a zero norm", zero_ratio_one=True)
