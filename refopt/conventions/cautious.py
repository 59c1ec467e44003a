"""Cautious (refopt/rules/cautious.py) to pytorch_optimizer.Lion(cautious=True): the base's direction u kept where
u g > 0 and rescaled by n / (k + 1); heavyball's caution (same sign bit, n / max(k, 1)) is the rule's
mask='signbit'. torch.optim and optax ship no cautious mask."""
from __future__ import annotations

import numpy as np

from refopt.conventions._spec import (
    Conventions, Example, Oracle, PeerMapping, Preset, decoupled_decay_only, gamma, scalar)
from refopt.golden import GoldenCase
from refopt.rules.adam import Adam
from refopt.rules.cautious import Cautious
from refopt.rules.lion import Lion


class CautiousOracle(Oracle):
    """The masked step from the rule's docstring over the base rule's oracle direction. Switches: ``form``
    overriding the rule's mask ('product' | 'signbit'); ``rescale`` False drops the factor n / (k + 1)."""

    def __init__(self, rule, name=None, **sw):
        from refopt.conventions import oracle
        super().__init__(rule, name, **sw)
        self.base = oracle(rule.base)

    def init_leaf(self, x, path):
        return {"base": self.base.init_leaf(x, path)}

    def _masked(self, u, g):
        form, n = self.switches.get("form", self.rule.mask), u.size
        if form == "product":
            keep = (u * g > 0).astype(u.dtype)
            f = n / (keep.sum() + 1)
        else:
            keep = (np.signbit(u) == np.signbit(g)).astype(u.dtype)
            f = n / max(keep.sum(), 1)
        if self.switches.get("rescale", True) is False:
            f = 1.0
        return u * keep * scalar(f, u.dtype)

    def direction_leaf(self, t, s, x, g, path):
        return self._masked(self.base.direction_leaf(t, s["base"], x, g, path), g)

    def step_leaf(self, t, s, x, g, path):
        lr = self.rule.lr * gamma(self.rule.schedule, t)
        u = self.direction_leaf(t, s, x, g, path)
        return scalar(1.0 - lr * self.rule.weight_decay, x.dtype) * x - scalar(lr, x.dtype) * u


def variants(rule):
    from refopt.conventions._variants import base_variants, oracle_variant as v
    other = "signbit" if rule.mask == "product" else "product"
    return [v(rule, f"the {other} mask", f"the {other} mask in place of the {rule.mask} one (the kept entries at "
              "zeros and the rescale n / (k + 1) vs n / max(k, 1))", form=other),
            v(rule, "no rescale", "the masked direction without the factor n / (k + 1)", rescale=False)] \
        + base_variants(rule)


def facts(rule, of):
    """The mask reads only signs and the count of kept entries: it keeps the base's gradient-scale
    invariance; it is taken per entry with one factor from a count over the array (which permutations keep),
    and is not orthogonally invariant."""
    b = of(rule.base)
    return {"grad_scale": b["grad_scale"], "step_scale_free": b["step_scale_free"], "orthogonal": False,
            "elementwise": b["elementwise"]}


def _lion(lr, betas, weight_decay, weight_decouple, fixed_decay, cautious):
    decoupled_decay_only("Cautious", weight_decay > 0, weight_decouple, fixed_decay)
    return Cautious(Lion(beta1=betas[0], beta2=betas[1]), lr=lr, weight_decay=weight_decay)


def _match_lion(rule):
    if type(rule) is not Cautious or type(rule.base) is not Lion or rule.mask != "product" \
            or rule.schedule is not None or rule.base.schedule is not None:
        return None
    return dict(lr=rule.lr, betas=(rule.base.beta1, rule.base.beta2), weight_decay=rule.weight_decay,
                weight_decouple=True, fixed_decay=False, cautious=True)


_OFF = (lambda v: not v, "an option refopt's Lion does not have")

PYTORCH_OPTIMIZER_LION = PeerMapping(
    "pytorch_optimizer.Lion", "pytorch_optimizer", "Lion",
    dict(lr=1e-4, betas=(0.9, 0.99), weight_decay=0.0, weight_decouple=True, fixed_decay=False, cautious=False),
    _lion, "cautious", ignore=("foreach",),
    refuse={"cautious": (lambda v: v is True, "without cautious=True pytorch_optimizer.Lion is refopt.Lion "
                                              "(like('optax.lion', ...) with weight_decay given)"),
            "maximize": (lambda v: v is False, "maximize=True ascends: negate the loss"),
            "use_gc": _OFF, "adanorm": _OFF},
    state={"base.m": "exp_avg"}, match=_match_lion)

_KW = dict(lr=3e-3, betas=(0.8, 0.95), weight_decay=0.1, cautious=True)


def atlas_cautious_masks():
    from dataclasses import replace
    from refopt.conventions.ademamix import HEAVYBALL
    from refopt.crosscheck.atlas import Entry, Pair, peer_side, restated_side

    po = PYTORCH_OPTIMIZER_LION.preset("pytorch_optimizer.Lion(cautious)", _KW, "atlas")
    hb = HEAVYBALL.preset("heavyball.AdEMAMix(caution)", dict(lr=1e-2, weight_decay=0.05, storage_dtype="float64",
                                                              caution=True), "atlas")
    lion_signbit = replace(po.make_rule(), mask="signbit")
    ademamix_product = replace(hb.make_rule(), mask="product")
    return Entry(
        "cautious-mask-forms",
        "the cautious mask of pytorch_optimizer (u g > 0, rescale n / (k + 1)) vs heavyball's caution (the same sign "
        "bit, rescale n / max(k, 1)), each on its package's own base",
        (peer_side("pytorch_optimizer", po, source="pytorch_optimizer 4.1.0 apply_cautious: (u g > 0) n / (k + 1)"),
         restated_side("Lion, sign-bit mask", "the same Lion under heavyball's mask", lambda: lion_signbit,
                       oracle=lambda: CautiousOracle(lion_signbit), source="heavyball 3.2.1's caution, restated"),
         peer_side("heavyball", hb, source="heavyball 3.2.1 caution: signbit(u) == signbit(g), n / max(k, 1)"),
         restated_side("AdEMAMix, product mask", "the same AdEMAMix under pytorch_optimizer's mask",
                       lambda: ademamix_product, oracle=lambda: CautiousOracle(ademamix_product),
                       source="pytorch_optimizer's apply_cautious, restated")),
        (Pair("pytorch_optimizer", "Lion, sign-bit mask", "final", 1e-4,
              what="params after 50 steps: n / (k + 1) vs n / max(k, 1) on Lion's sign steps"),
         Pair("heavyball", "AdEMAMix, product mask", "final", 1e-4,
              what="params after 50 steps: the two masks on AdEMAMix")),
        "The paper (Liang et al. 2024) and its code keep the entries with u g > 0 and rescale by n / (k + 1); "
        "pytorch_optimizer follows it. heavyball compares sign bits, so an exact zero of u or g counts by its sign, "
        "and rescales by n / max(k, 1): with k of n kept, the two rescales differ by a factor (k + 1) / k.",
        "Liang, Chen, Liu & Liu 2024 (arXiv:2411.16085), Algorithm 1; pytorch_optimizer 4.1.0; heavyball 3.2.1")


CONVENTIONS = Conventions(
    rules=(Cautious,),
    final="(1 - lr lambda) x - lr u phi n / (k + 1): which entries phi keeps (u g > 0 or the same sign bit) and "
          "the rescale by the kept count",
    per_step="lr_t",
    mappings=(PYTORCH_OPTIMIZER_LION,),
    no_peer={"torch": "torch.optim ships no cautious mask", "optax": "optax 0.2.8 ships no cautious mask",
             "schedulefree": "schedulefree ships the Schedule-Free optimizers only"},
    presets=(
        PYTORCH_OPTIMIZER_LION.preset("pytorch_optimizer.Lion(cautious)", dict(lr=1e-3, cautious=True),
                                      "sign((1 - b1) g + b1 m) kept where it agrees with g, times n / (k + 1)"),
        PYTORCH_OPTIMIZER_LION.preset("pytorch_optimizer.Lion(cautious,betas,wd)", _KW,
                                      "betas (0.8, 0.95), decoupled decay 0.1"),
    ),
    wrong=(Preset("WRONG mask: pytorch_optimizer.Lion(cautious) vs refopt Lion", "pytorch_optimizer", "cautious",
                  ("Lion", _KW), lambda: Lion(lr=3e-3, beta1=0.8, beta2=0.95, weight_decay=0.1),
                  "Lion's step without the cautious mask", state={}, expect_fail=True),),
    atlas=(atlas_cautious_masks,),
    oracle=CautiousOracle,
    variants=variants,
    facts=facts,
    golden=(GoldenCase("cautious_lion", lambda: Cautious(Lion(beta1=0.8, beta2=0.95), lr=3e-3, weight_decay=0.1),
                       "pytorch_optimizer.Lion(cautious=True), betas (0.8, 0.95), decay 0.1", ("base.m",)),
            GoldenCase("cautious_adam_signbit", lambda: Cautious(Adam(), lr=1e-2, mask="signbit"),
                       "Adam's direction under heavyball's caution mask", ("base.m", "base.v"))),
    examples=(Example("cautious_lion", lambda: Cautious(Lion(), lr=1e-3), converges=False,
                      note="constant lr: each kept sign step has size about lr, so Lion orbits the minimum"),
              Example("cautious_adam_signbit", lambda: Cautious(Adam(beta2=0.99), lr=1e-2, mask="signbit",
                                                                weight_decay=1e-3))),
)
