r"""The diagnosis variants of a rule: the known ways an implementation of it can differ, each runnable.

A conventions file's ``variants`` (:class:`~refopt.conventions._spec.Conventions`) lists its rule's
variants with these: :func:`oracle_variant` (the rule's plain-numpy oracle with one convention switched),
:func:`rule_variant` (the refopt rule with other hyperparameters), :func:`base_variants` (a wrapper around
each of its base rule's variants). :func:`variants` gathers a rule's named variants and the generated ones
(:mod:`refopt.conventions._generated`: every option changed, pairs swapped, counters shifted, scopes widened); :mod:`refopt.crosscheck.variants`
describes them and is where the plug-in cross-check reads them. The module imports only the registry
(:mod:`refopt.conventions`), no conventions file and no cross-check module, so that the conventions files can
import it.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

import numpy as np

from refopt import tree as T
from refopt.testing.adapters import Adapter, RuleAdapter, from_layout, to_layout

__all__ = ["Variant", "variants", "oracle_variant", "rule_variant", "base_variants", "TransposedRule", "WholeTreeRule",
           "try_replace"]


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
        elif v.switches is not None and "reads" not in v.switches:   # read orders: the wrapper's own ('base.m')
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
        xs, _, td = T.flatten(tree)
        return T.unflatten(td, [to_layout(np.asarray(x), "torch") for x in xs])

    def _b(self, tree):
        xs, _, td = T.flatten(tree)
        return T.unflatten(td, [from_layout(np.asarray(x), "torch") for x in xs])

    def init(self, params):
        return super().init(self._t(params))

    def step(self, state, params, grads, **inputs):
        x, state = super().step(state, self._t(params), self._t(grads), **inputs)
        return self._b(x), state

    def state_arrays(self, state) -> dict:
        return {k: [None if a is None else self._b([a])[0] for a in v] for k, v in super().state_arrays(state).items()}


class WholeTreeRule(RuleAdapter):
    """A refopt rule run on one vector: every array of the tree raveled and concatenated, so that each norm
    or statistic the rule takes per array is taken over the whole tree (a global trust ratio or layer
    norm in place of per-array ones)."""

    def __init__(self, rule):
        super().__init__(rule)
        self.name = f"{type(rule).__name__} on the whole tree as one array"

    def _cat(self, tree):
        xs, _, td = T.flatten(tree)
        self._shapes, self._td = [np.shape(x) for x in xs], td
        return [np.concatenate([np.ravel(np.asarray(x)) for x in xs])]

    def _split(self, v):
        out, i = [], 0
        for shape in self._shapes:
            n = int(np.prod(shape, dtype=np.int64))
            out.append(np.asarray(v)[i:i + n].reshape(shape))
            i += n
        return out

    def init(self, params):
        return super().init(self._cat(params))

    def step(self, state, params, grads, **inputs):
        x, state = super().step(state, self._cat(params), self._cat(grads), **inputs)
        return T.unflatten(self._td, self._split(x[0])), state

    def state_arrays(self, state) -> dict:
        total = sum(int(np.prod(s, dtype=np.int64)) for s in self._shapes)
        return {k: self._split(v[0]) for k, v in super().state_arrays(state).items()
                if v and v[0] is not None and np.size(v[0]) == total}


# ---- the generic variants ---------------------------------------------------------------------------------
def shape_scale_variants(rule) -> list:
    """The matrix rule (Muon, NorMuon, Dion) with each of the other shape scales of its ``scale`` field
    (refopt.rules.muon_shape.muon_scale) as rule variants."""
    return [v for sc in ("spectral", "jordan", "rms_match", "none")
            for v in [rule_variant(f"scale='{sc}'", "the shape scale of the step: spectral sqrt(fan_out/fan_in), "
                                   "jordan sqrt(max(1, fan_out/fan_in)), rms_match 0.2 sqrt(max(fan_in, fan_out)), "
                                   "none 1", try_replace(rule, scale=sc))] if v is not None]


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


def _generic(rule) -> list[Variant]:
    """Weight decay on matrices only (the usual torch parameter groups: no decay on biases and gains)."""
    from refopt.rules.partition import Partition

    if not (getattr(rule, "weight_decay", 0) or 0) > 0:
        return []
    no_wd = try_replace(rule, weight_decay=0.0)
    return [] if no_wd is None else [rule_variant(
        "no weight decay on vectors", "weight decay on arrays of ndim >= 2 only: biases and gains in a parameter "
        "group without decay (torch, nanoGPT, timm practice)",
        Partition({"decayed": rule, "not_decayed": no_wd}, labels=_decayed_labels))]


def _unique(rule, vs: list) -> list[Variant]:
    """The variants without repeats: one per name, one per rule (the first, a conventions file's named one,
    is kept), none equal to ``rule`` itself."""
    names, rules, out = set(), [rule], []
    for v in vs:
        if v is None or v.name in names or (v.rule is not None and any(v.rule == r for r in rules)):
            continue
        names.add(v.name)
        if v.rule is not None:
            rules.append(v.rule)
        out.append(v)
    return out


def variants(rule) -> list[Variant]:
    """The diagnosis variants of ``rule``: its conventions file's named ones first, then the generated ones
    (:func:`refopt.conventions._generated.generated`) and weight decay on matrices only."""
    from refopt.conventions import for_rule
    from refopt.conventions._generated import generated

    conv = for_rule(rule)
    own = conv.variants(rule) if conv is not None and conv.variants is not None else []
    return _unique(rule, list(own) + _generic(rule) + generated(rule))
