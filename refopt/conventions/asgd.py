"""ASGD (refopt/rules/asgd.py) to torch.optim.ASGD: eta_t = lr / (1 + lambd lr (t - 1))^alpha, the shrinkage
x (1 - lambd eta_t), L2 weight_decay in g, and the average ax from step t0 + 2 (mu_t = 1 / max(1, t - 1 - t0));
optax ships no ASGD."""
from __future__ import annotations

import numpy as np

from refopt.conventions._spec import NO_MAXIMIZE, Conventions, Example, Oracle, PeerMapping, Preset, counted, scalar
from refopt.golden import GoldenCase
from refopt.rules.asgd import ASGD


class ASGDOracle(Oracle):
    """ASGD from the rule's docstring. Switch ``counter`` {'eta' | 'mu': 'next' | 'prev' | 'frozen'}: the step
    counter the step size or the averaging weight reads."""

    def init_leaf(self, x, path):
        return {"ax": x.copy()}

    def _eta_mu(self, t):
        r, c = self.rule, self.switches.get("counter", {})
        te, tm = counted(t, c.get("eta")), counted(t, c.get("mu"))
        return r.lr / (1 + r.lambd * r.lr * (te - 1)) ** r.alpha, 1.0 / max(1.0, (tm - 1) - r.t0)

    def direction_leaf(self, t, s, x, g, path):
        r, d = self.rule, x.dtype
        return g + scalar(r.weight_decay, d) * x if r.weight_decay else g

    def step_leaf(self, t, s, x, g, path):
        r, d = self.rule, x.dtype
        eta, mu = self._eta_mu(t)
        x_new = scalar(1 - r.lambd * eta, d) * x - scalar(eta, d) * self.direction_leaf(t, s, x, g, path)
        s["ax"] = x_new.copy() if mu == 1 else s["ax"] + (x_new - s["ax"]) * scalar(mu, d)
        return x_new


def variants(rule):
    return []


def facts(rule, of):
    """The step is linear in g (degree 1) and commutes with orthogonal maps (the shrinkage and the average are
    scalar multiples); per entry; the average is of the iterates."""
    return {"homogeneous": rule.weight_decay == 0, "orthogonal": True, "elementwise": True}


def _match(rule):
    if type(rule) is not ASGD:
        return None
    return dict(lr=rule.lr, lambd=rule.lambd, alpha=rule.alpha, t0=rule.t0, weight_decay=rule.weight_decay)


TORCH = PeerMapping("torch.optim.ASGD", "torch", "ASGD",
                    dict(lr=1e-2, lambd=1e-4, alpha=0.75, t0=1e6, weight_decay=0.0, maximize=False),
                    lambda lr, lambd, alpha, t0, weight_decay: ASGD(lr=lr, lambd=lambd, alpha=alpha, t0=t0,
                                                                    weight_decay=weight_decay),
                    "asgd", refuse={"maximize": NO_MAXIMIZE},
                    ignore=("foreach", "capturable", "differentiable"), state={"ax": "ax"}, match=_match)

CONVENTIONS = Conventions(
    rules=(ASGD,),
    final="(1 - lambd eta_t) x - eta_t g with eta_t = lr/(1 + lambd lr (t-1))^alpha: the decay of the step "
          "size, its counter, the shrinkage; the average's start t0 and weight 1/(t - 1 - t0)",
    per_step="the step size eta_t and the averaging weight mu_t",
    counters=(("eta", "the step size lr / (1 + lambd lr (t - 1))^alpha"),
              ("mu", "the averaging weight 1 / max(1, t - 1 - t0)")),
    mappings=(TORCH,),
    no_peer={"optax": "optax ships no ASGD (optax.contrib has no averaged SGD with this step size)",
             "schedulefree": "schedulefree ships the Schedule-Free optimizers only"},
    presets=(
        TORCH.preset("torch.ASGD", dict(lr=1e-2), "eta_t = lr/(1 + 1e-4 lr (t-1))^0.75; t0 = 1e6: ax = x"),
        TORCH.preset("torch.ASGD(lambd,alpha,t0,wd)", dict(lr=5e-2, lambd=0.05, alpha=0.6, t0=10.0, weight_decay=1e-2),
                     "shrinkage 1 - lambd eta; L2 in g; the average from step 12 (mu = 1/(t - 11))"),
    ),
    wrong=(Preset("WRONG average start: torch.ASGD(t0=10) vs refopt ASGD(t0=9)", "torch", "asgd",
                  ("ASGD", dict(lr=5e-2, lambd=0.05, alpha=0.6, t0=10.0)),
                  lambda: ASGD(lr=5e-2, lambd=0.05, alpha=0.6, t0=9.0),
                  "the average starts one step early", state={"ax": "ax"}, expect_fail=True),),
    oracle=ASGDOracle,
    variants=variants,
    facts=facts,
    golden=(GoldenCase("asgd", lambda: ASGD(lr=5e-2, lambd=0.05, alpha=0.6, t0=1.0, weight_decay=1e-2),
                       "torch.optim.ASGD lambd 0.05, alpha 0.6, t0 1, L2 1e-2", ("ax",)),),
    examples=(Example("asgd", lambda: ASGD(lr=0.05, t0=5.0)),
              Example("asgd_wd", lambda: ASGD(lr=0.05, lambd=0.01, t0=0.0, weight_decay=1e-3))),
)
