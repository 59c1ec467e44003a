r"""Convention variants: the known ways an implementation of a rule can differ, each runnable.

When an implementation does not reproduce a refopt rule, :func:`variants` lists the convention variants of
that rule, each as an :class:`~refopt.testing.adapters.Adapter`; the plug-in cross-check
(:mod:`refopt.crosscheck.plugin`) runs them all on the same inputs and names the one that reproduces the
implementation's numbers. A rule's variants come from its conventions file (:mod:`refopt.conventions`):
either the rule's plain-numpy oracle with one convention switched (:func:`oracle_variant`: eps inside the
square root, the bias correction off by one, the decay after the update, ...) or the refopt rule with
other hyperparameters (:func:`rule_variant`: Muon's scales, Nesterov modes, ...). Every rule also gets
the variants generated from its record (:mod:`refopt.conventions._generated`: every option changed, pairs
of hyperparameters swapped, step counters shifted or frozen per place, the schedule read at t - 1, t + 1 or
frozen, a wrapper's base variants, each Partition group's variants and its rule on every leaf), and a rule
with ``weight_decay`` > 0 ``no weight decay on vectors`` (decay on arrays of ndim >= 2 only: the usual
torch parameter groups).

Variants that equal the rule, or an earlier variant, are left out.

The variants' vocabulary is :mod:`refopt.conventions._variants` (the conventions files build their variants
with it); the convention oracles the divergence atlas restates sides with live in their rules' conventions
files (:func:`ConventionAdam` in :mod:`refopt.conventions.adam`, :func:`ConventionSGD` in
:mod:`refopt.conventions.sgd`, :func:`TrustRatioOneAtZero` in :mod:`refopt.conventions.covariant`). This
module gathers them in one place and imports the conventions files, which never import it.
"""
from __future__ import annotations

from refopt.conventions._variants import (TransposedRule, Variant, base_variants, oracle_variant, rule_variant,
                                         try_replace, variants)
from refopt.conventions.adam import ConventionAdam
from refopt.conventions.covariant import TrustRatioOneAtZero
from refopt.conventions.sgd import ConventionSGD

__all__ = ["Variant", "variants", "oracle_variant", "rule_variant", "base_variants", "TransposedRule",
           "ConventionAdam", "ConventionSGD", "TrustRatioThenMomentum", "TrustRatioOneAtZero", "try_replace"]


# ---- the names the divergence atlas builds its restated sides with ----------------------------------------
def TrustRatioThenMomentum(lr, momentum, weight_decay=0.0, name="trust ratio, then momentum"):
    """optax.lars's order (:class:`refopt.conventions.covariant.TrustRatioThenMomentum`)."""
    from refopt.conventions import covariant
    from refopt.rules.covariant import Covariant
    from refopt.rules.sgd import SGD
    return covariant.TrustRatioThenMomentum(Covariant(SGD(momentum=momentum, weight_decay=weight_decay), lr=lr),
                                            name=name)
