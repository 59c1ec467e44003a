"""Hyperball (refopt/rules/hyperball.py; post 000 "Hyperball", post 002 MuonH): no peer ships it."""
from __future__ import annotations

import numpy as np

from refopt.conventions._spec import Conventions, Example, Oracle, gamma, norm64, scalar
from refopt.golden import GoldenCase
from refopt.rules.adam import Adam, AdamW
from refopt.rules.averaging import Average
from refopt.rules.hyperball import Hyperball
from refopt.rules.muon import Muon
from refopt.rules.sgd import SGD


class HyperballOracle(Oracle):
    """y = W - lr gamma_t R u/||u||; W <- R y/||y|| (N(0) = 0), R = ||W_0||_F (or ``radius``) kept, norms in
    float64; u the base rule's direction (its oracle; switch ``base`` for another). Switches: ``step`` 'radius' |
    'unit' (W - lr gamma_t u/||u||, the radius left out of the step); ``retract`` 'whole' | 'columns' (each
    column of y normalised to R/sqrt(fan_out) in place of the whole array to R)."""

    def __init__(self, rule, name=None, **sw):
        from refopt.conventions import oracle
        super().__init__(rule, name, **sw)
        self.base = sw.get("base") or oracle(rule.base)

    def init_leaf(self, x, path):
        r = norm64(x) if self.rule.radius is None else float(self.rule.radius)
        return {"radius": np.array(r, dtype=x.dtype), "base": self.base.init_leaf(x, path)}

    def step_leaf(self, t, s, x, g, path):
        u = self.base.direction_leaf(t, s["base"], x, g, path)
        r, lr = float(s["radius"]), self.rule.lr * gamma(self.rule.schedule, t)
        nu, sw = norm64(u), self.switches
        step = lr if sw.get("step") == "unit" else lr * r
        y = x - scalar(step / nu, x.dtype) * u if nu > 0 else x.copy()
        if sw.get("retract") == "columns" and y.ndim >= 2:
            y2 = y.reshape(-1, y.shape[-1])
            n = np.sqrt(np.sum(np.asarray(y2, np.float64) ** 2, axis=0))
            f = np.where(n > 0, r / np.sqrt(y2.shape[1]) / np.where(n > 0, n, 1.0), 1.0)
            return (y2 * f.astype(x.dtype)).reshape(y.shape)
        ny = norm64(y)
        return scalar(r / ny, x.dtype) * y if ny > 0 else y


def variants(rule):
    from refopt.conventions._variants import base_variants, oracle_variant as v
    return [v(rule, "the step without the radius", "y = W - lr N(u) in place of W - lr R N(u) (the step's length "
              "lr, not lr R, on the sphere of radius R)", step="unit"),
            v(rule, "the retraction per column", "each column of y normalised to R/sqrt(fan_out) in place of the "
              "whole array to ||y||_F = R", retract="columns")] + base_variants(rule)


def facts(rule, of):
    """Like Covariant (u/||u|| and a norm kept): covariant only with the radius of W_0 (a given radius
    fixes the scale)."""
    b = of(rule.base)
    norm_ok = b["grad_scale"] or b["homogeneous"]
    return {"grad_scale": norm_ok, "step_scale_free": b["step_scale_free"] or b["plain_direction"],
            "orthogonal": b["orthogonal"], "elementwise": b["elementwise"],
            "covariant": rule.radius is None and norm_ok, "exact_scale_free": b["exact_scale_free"]}


_SPHERE = "Hyperball stays on the sphere ||W|| = ||W_0||, which does not contain the quadratic's minimum"
CONVENTIONS = Conventions(
    rules=(Hyperball,),
    final="W - lr R N(u) then R N(y), N(v) = v/||v||_F over the whole array: the two normalisations, the radius R "
          "or the base's direction",
    per_step="the radius ratio",
    no_peer={"torch": "torch.optim 2.13 has no Hyperball", "optax": "optax 0.2.8 has no Hyperball",
             "schedulefree": "schedulefree has no Hyperball"},
    oracle=HyperballOracle,
    variants=variants,
    facts=facts,
    golden=(GoldenCase("hyperball_muon", lambda: Hyperball(Muon(lr=0.02), lr=0.05),
                       "MuonH: W <- R N(W - lr R N(u)), R = ||W_0||_F (post 000 Hyperball, post 002)", ("base.m",),
                       True),),
    examples=(
        Example("hyperball_adam", lambda: Hyperball(Adam(beta2=0.99), lr=0.05), converges=False, note=_SPHERE),
        Example("hyperball_sgd_radius_schedule", lambda: Hyperball(SGD(momentum=0.9, nesterov=True), lr=0.1,
                                                                   radius=2.0, schedule=_cosine()),
                converges=False, note=_SPHERE),
        Example("hyperball_adamw_wd0", lambda: Hyperball(AdamW(weight_decay=0.0), lr=0.02), converges=False,
                note=_SPHERE),
        Example("muonh", lambda: Hyperball(Muon(), lr=0.02), "matrix", converges=False, note=_SPHERE),
        Example("average_hyperball_adam", lambda: Average(Hyperball(Adam(), lr=0.05)), converges=False, note=_SPHERE),
    ),
)


def _cosine():
    from refopt.schedules import warmup_cosine
    return warmup_cosine(3, 300, 0.1)
