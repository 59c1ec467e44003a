"""Adan (refopt/rules/adan.py) to optax.adan: betas weigh the old averages, the gradient difference is 0 at the
first step, all three averages are bias-corrected, eps_root 1e-8 inside the root, the decay added to the update
before the lr; torch.optim ships no Adan."""
from __future__ import annotations

import numpy as np

from refopt.conventions._spec import (
    CONSTANT, NO_MASK, Conventions, Example, Oracle, PeerMapping, Preset, counted, gamma, scalar)
from refopt.golden import GoldenCase
from refopt.rules.adam import Adam
from refopt.rules.adan import Adan


class AdanOracle(Oracle):
    """Adan from the rule's docstring. Switches: ``decay`` 'added' (optax's) | 'proximal' (the paper's
    (x - lr u)/(1 + lr wd)); ``first_diff`` 'zero' (d_1 = 0, the paper's and optax's) | 'from_zero' (the previous
    gradient initialised to 0, so d_1 = g_1); ``counter`` {'bc1' | 'bc2' | 'bc3': 'next' | 'prev' | 'frozen'}."""

    def init_leaf(self, x, path):
        return {k: np.zeros_like(x) for k in ("m", "v", "n", "prev")}

    def direction_leaf(self, t, s, x, g, path):
        r, d = self.rule, x.dtype
        first_zero = t == 1 and self.switches.get("first_diff") != "from_zero"
        diff = np.zeros_like(g) if first_zero else g - s["prev"]
        s["prev"] = g.copy()
        s["m"] = scalar(r.beta1, d) * s["m"] + scalar(1 - r.beta1, d) * g
        s["v"] = scalar(r.beta2, d) * s["v"] + scalar(1 - r.beta2, d) * diff
        sq = g + scalar(1 - r.beta2, d) * diff
        s["n"] = scalar(r.beta3, d) * s["n"] + scalar(1 - r.beta3, d) * (sq * sq)
        c = self.switches.get("counter", {})
        bc = [scalar(1.0 - b ** counted(t, c.get(k)), d) for b, k in ((r.beta1, "bc1"), (r.beta2, "bc2"), (r.beta3, "bc3"))]
        return (s["m"] / bc[0] + scalar(1 - r.beta2, d) * (s["v"] / bc[1])) / \
            (np.sqrt(s["n"] / bc[2] + scalar(r.eps_root, d)) + scalar(r.eps, d))

    def step_leaf(self, t, s, x, g, path):
        r, d = self.rule, x.dtype
        lr = r.lr * gamma(r.schedule, t)
        u = self.direction_leaf(t, s, x, g, path)
        if self.switches.get("decay") == "proximal":
            return (x - scalar(lr, d) * u) / scalar(1 + lr * r.weight_decay, d)
        return scalar(1 - lr * r.weight_decay, d) * x - scalar(lr, d) * u


def variants(rule):
    from refopt.conventions._variants import oracle_variant as v
    out = [v(rule, "the first gradient difference g_1 - 0", "d_1 = g_1 (the previous gradient initialised to 0) in "
             "place of d_1 = 0", first_diff="from_zero")]
    if rule.weight_decay:
        out.append(v(rule, "the paper's proximal decay", "(x - lr u)/(1 + lr wd) in place of x - lr (u + wd x)",
                     decay="proximal"))
    return out


def facts(rule, of):
    """(m_hat + (1 - b2) v_hat)/sqrt(n_hat) has degree 0 in g (eps, eps_root -> 0); the decay acts on x only;
    per entry."""
    return {"grad_scale": True, "step_scale_free": False, "elementwise": True}


def _match(rule):
    if type(rule) is not Adan or rule.schedule is not None:
        return None
    return dict(learning_rate=rule.lr, b1=rule.beta1, b2=rule.beta2, b3=rule.beta3, eps=rule.eps,
                eps_root=rule.eps_root, weight_decay=rule.weight_decay)


OPTAX = PeerMapping("optax.adan", "optax", "adan",
                    dict(b1=0.98, b2=0.92, b3=0.99, eps=1e-8, eps_root=1e-8, weight_decay=0.0, mask=None),
                    lambda learning_rate, b1, b2, b3, eps, eps_root, weight_decay: Adan(
                        lr=learning_rate, beta1=b1, beta2=b2, beta3=b3, eps=eps, eps_root=eps_root,
                        weight_decay=weight_decay),
                    "adan", required=("learning_rate",), refuse={"mask": NO_MASK, "weight_decay": CONSTANT},
                    state={"m": "m", "v": "v", "n": "n", "prev": "g"}, match=_match)

CONVENTIONS = Conventions(
    rules=(Adan,),
    final="(m_hat + (1 - b2) v_hat) / (sqrt(n_hat + eps_root) + eps): the gradient difference and its first "
          "step, the three bias corrections, the betas' convention (weight of the old average), or the decay",
    per_step="the bias corrections 1 - beta_k^t; the first step's zero difference",
    counters=(("bc1", "the bias correction of m"), ("bc2", "the bias correction of v"),
              ("bc3", "the bias correction of n")),
    mappings=(OPTAX,),
    no_peer={"torch": "torch.optim ships no Adan",
             "schedulefree": "schedulefree ships the Schedule-Free optimizers only"},
    presets=(
        OPTAX.preset("optax.adan", dict(learning_rate=1e-2), "betas (0.98, 0.92, 0.99); d_1 = 0; eps_root 1e-8"),
        OPTAX.preset("optax.adan(betas,eps,wd)", dict(learning_rate=1e-2, b1=0.9, b2=0.8, b3=0.95, eps=1e-6,
                                                      eps_root=0.0, weight_decay=0.05),
                     "lr (u + wd x): the decay added to the update"),
    ),
    wrong=(Preset("WRONG difference term: optax.adan vs refopt Adam", "optax", "adan",
                  ("adan", dict(learning_rate=1e-2, b1=0.9, b2=0.8, b3=0.95, eps=1e-6, eps_root=0.0)),
                  lambda: Adam(lr=1e-2, beta1=0.9, beta2=0.95, eps=1e-6),
                  "Adan's gradient-difference terms missing", state={"m": "m"}, expect_fail=True),),
    oracle=AdanOracle,
    variants=variants,
    facts=facts,
    golden=(GoldenCase("adan", lambda: Adan(lr=1e-2), "optax.adan(1e-2)", ("m", "v", "n", "prev")),
            GoldenCase("adan_wd", lambda: Adan(lr=1e-2, beta1=0.9, beta2=0.8, beta3=0.95, eps=1e-6, eps_root=0.0,
                                               weight_decay=0.05),
                       "Adan betas (0.9, 0.8, 0.95), decay 0.05", ("m", "v", "n", "prev"))),
    examples=(Example("adan", lambda: Adan(lr=0.01)),
              Example("adan_wd", lambda: Adan(lr=0.01, weight_decay=1e-3))),
)
