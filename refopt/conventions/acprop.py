"""ACProp (refopt/rules/acprop.py) to optax.contrib.acprop: the gradient divided by the previous step's s (bias
corrected by 1 - beta2^(t-1), taken as 1 on the first step), eps after the square root, s the EMA of
(g - m_{t-1})^2 with eps_root stored every step, the decay added to the update before the lr. torch.optim ships
no ACProp."""
from __future__ import annotations

import numpy as np

from refopt.conventions._spec import (
    CONSTANT, NO_MASK, CliName, Conventions, Example, Oracle, PeerMapping, Preset, counted, gamma, scalar)
from refopt.golden import GoldenCase
from refopt.rules.acprop import ACProp
from refopt.rules.adabelief import AdaBelief


class ACPropOracle(Oracle):
    """ACProp from the rule's docstring. Switches: ``deviation`` 'previous' (g - m_{t-1}, the rule's and optax's)
    | 'updated' (g - m_t, the paper's); ``sync`` False (the rule's: u_t reads s_{t-1}) | True (u_t reads this
    step's s_t, AdaBelief's order); ``counter`` {'bc2': 'next' | 'frozen'} (the bias correction of s_{t-1} read
    at t, or at 1, in place of t - 1)."""

    def init_leaf(self, x, path):
        return {"m": np.zeros_like(x), "s": np.zeros_like(x)}

    def direction_leaf(self, t, s, x, g, path):
        r, d, sw = self.rule, x.dtype, self.switches
        m_prev, s_prev = s["m"], s["s"]
        m_t = scalar(r.beta1, d) * m_prev + scalar(1.0 - r.beta1, d) * g
        e = g - (m_t if sw.get("deviation", "previous") == "updated" else m_prev)
        s_t = scalar(r.beta2, d) * s_prev + scalar(1.0 - r.beta2, d) * (e * e) + scalar(r.eps_root, d)
        s["m"], s["s"] = m_t, s_t
        how = sw.get("counter", {}).get("bc2")
        if sw.get("sync", False):     # this step's s_t, corrected by 1 - beta2^t
            s_read, k = s_t, counted(t, how)
        elif t == 1:                  # optax's first step: s_hat_0 taken as 1
            return g / (np.sqrt(np.ones_like(g)) + scalar(r.eps, d))
        else:                         # the previous step's s_{t-1}, corrected by 1 - beta2^(t-1)
            s_read, k = s_prev, 1 if how == "frozen" else counted(t, how) - 1
        s_hat = s_read / scalar(1.0 - r.beta2 ** k, d)
        return g / (np.sqrt(s_hat) + scalar(r.eps, d))

    def step_leaf(self, t, s, x, g, path):
        r, d = self.rule, x.dtype
        lr = r.lr * gamma(r.schedule, t)
        u = self.direction_leaf(t, s, x, g, path)
        return x - scalar(lr, d) * (u + scalar(r.weight_decay, d) * x)


def variants(rule):
    from refopt.conventions._variants import oracle_variant as v
    return [v(rule, "deviation from the updated m (the paper's)", "(g - m_t)^2 in place of optax's (g - m_{t-1})^2",
              deviation="updated"),
            v(rule, "synchronous update", "g divided by this step's s_t (AdaBelief's order) in place of the previous "
              "step's s_{t-1}", sync=True)]


def facts(rule, of):
    """Not gradient-scale invariant: the first step is lr g_1 / (1 + eps), linear in g (later steps g /
    sqrt(s_hat_{t-1}) have degree 0); the decay acts on x only; per entry."""
    return {"grad_scale": False, "step_scale_free": False, "elementwise": True}


def _match(rule):
    if type(rule) is not ACProp or rule.schedule is not None:
        return None
    return dict(learning_rate=rule.lr, b1=rule.beta1, b2=rule.beta2, eps=rule.eps, eps_root=rule.eps_root,
                weight_decay=rule.weight_decay)


OPTAX = PeerMapping("optax.contrib.acprop", "optax", "contrib.acprop",
                    dict(b1=0.9, b2=0.999, eps=1e-16, eps_root=1e-16, weight_decay=0.0, mask=None),
                    lambda learning_rate, b1, b2, eps, eps_root, weight_decay: ACProp(
                        lr=learning_rate, beta1=b1, beta2=b2, eps=eps, eps_root=eps_root, weight_decay=weight_decay),
                    "acprop", required=("learning_rate",),
                    refuse={"mask": NO_MASK, "weight_decay": CONSTANT,
                            "eps": (lambda v: v > 0, "refopt's ACProp needs eps > 0 (with eps = 0 a gradient equal "
                                                     "to its running mean gives 0/0)")},
                    state={"m": "mu", "s": "nu"}, match=_match)

_KW = dict(learning_rate=1e-2, b1=0.8, b2=0.95, eps=1e-6, eps_root=1e-10, weight_decay=0.01)

CONVENTIONS = Conventions(
    rules=(ACProp,),
    final="g / (sqrt(s_hat_{t-1}) + eps) with s the EMA of (g - m_{t-1})^2 + eps_root: which s the step reads "
          "(the previous one), which m the deviation uses, the bias correction 1 - beta2^(t-1), the first step's "
          "1 + eps, or the decay",
    per_step="the bias correction 1 - beta2^(t-1) of the previous s; the first step's denominator 1 + eps",
    counters=(("bc2", "the bias correction of s_{t-1} (1 - beta2^(t-1))"),),
    mappings=(OPTAX,),
    no_peer={"torch": "torch.optim ships no ACProp",
             "schedulefree": "schedulefree ships the Schedule-Free optimizers only"},
    presets=(
        OPTAX.preset("optax.contrib.acprop", dict(learning_rate=1e-3), "u = g / (sqrt(s_{t-1}/(1 - b2^(t-1))) + "
                     "eps), u_1 = g/(1 + eps); s = b2 s + (1-b2)(g - m_{t-1})^2 + eps_root"),
        OPTAX.preset("optax.contrib.acprop(betas,eps,wd)", _KW, "betas (0.8, 0.95), eps 1e-6, eps_root 1e-10; "
                     "lr (u + wd x): the decay added to the update"),
    ),
    wrong=(Preset("WRONG asynchrony: optax.contrib.acprop vs refopt AdaBelief", "optax", "acprop",
                  ("contrib.acprop", dict(learning_rate=1e-2, b1=0.8, b2=0.95, eps=1e-6)),
                  lambda: AdaBelief(lr=1e-2, beta1=0.8, beta2=0.95, eps=1e-6),
                  "AdaBelief's m_hat_t / sqrt(s_hat_t) vs ACProp's g_t / sqrt(s_hat_{t-1})", state={"m": "mu"},
                  expect_fail=True),),
    oracle=ACPropOracle,
    variants=variants,
    facts=facts,
    golden=(GoldenCase("acprop", lambda: ACProp(lr=1e-3), "optax.contrib.acprop's defaults", ("m", "s")),
            GoldenCase("acprop_wd", lambda: ACProp(lr=1e-2, beta1=0.8, beta2=0.95, eps=1e-6, eps_root=1e-10,
                                                   weight_decay=0.01),
                       "ACProp betas (0.8, 0.95), eps 1e-6, eps_root 1e-10, decay 0.01", ("m", "s"))),
    examples=(Example("acprop", lambda: ACProp(lr=0.01)),
              Example("acprop_wd", lambda: ACProp(lr=0.01, beta1=0.8, beta2=0.95, eps=1e-8, weight_decay=1e-3))),
    cli=(CliName("acprop", ACProp, {"mlp": 1e-3, "gpt": 1e-3}, "ACProp (optax.contrib semantics): --beta1, --beta2, "
                 "--eps, --weight-decay", {"beta1": "beta1", "beta2": "beta2", "eps": "eps",
                                           "weight_decay": "weight_decay"}),),
)
