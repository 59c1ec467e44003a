"""Yogi (refopt/rules/yogi.py) to optax.yogi: both moments start at 1e-6, v moves by (1 - b2) g^2 with the sign
of g^2 - v, both are bias-corrected, eps 1e-3 after the square root. torch.optim ships no Yogi."""
from __future__ import annotations

import numpy as np

from refopt.conventions._spec import CliName, Conventions, Example, Oracle, PeerMapping, Preset, counted, gamma, \
    scalar
from refopt.golden import GoldenCase
from refopt.rules.adam import Adam
from refopt.rules.yogi import Yogi


class YogiOracle(Oracle):
    """Yogi from the rule's docstring. Switches: ``second`` 'yogi' (the rule's) | 'adam' (v = b2 v + (1-b2)
    g^2); ``counter`` {'bc1' | 'bc2': 'next' | 'prev' | 'frozen'}."""

    def init_leaf(self, x, path):
        a = self.rule.initial_accumulator_value
        return {"m": np.full_like(x, a), "v": np.full_like(x, a)}

    def direction_leaf(self, t, s, x, g, path):
        r, d, sw = self.rule, x.dtype, self.switches
        s["m"] = scalar(r.beta1, d) * s["m"] + scalar(1.0 - r.beta1, d) * g
        g2 = g * g
        if sw.get("second", "yogi") == "adam":
            s["v"] = scalar(r.beta2, d) * s["v"] + scalar(1.0 - r.beta2, d) * g2
        else:
            s["v"] = s["v"] - scalar(1.0 - r.beta2, d) * np.sign(s["v"] - g2) * g2
        c = sw.get("counter", {})
        bc1 = scalar(1.0 - r.beta1 ** counted(t, c.get("bc1")), d)
        bc2 = scalar(1.0 - r.beta2 ** counted(t, c.get("bc2")), d)
        return (s["m"] / bc1) / (np.sqrt(s["v"] / bc2 + scalar(r.eps_root, d)) + scalar(r.eps, d))

    def step_leaf(self, t, s, x, g, path):
        lr = self.rule.lr * gamma(self.rule.schedule, t)
        return x - scalar(lr, x.dtype) * self.direction_leaf(t, s, x, g, path)


def variants(rule):
    from refopt.conventions._variants import oracle_variant as v
    return [v(rule, "Adam's second moment", "v = b2 v + (1 - b2) g^2 in place of Yogi's additive sign step",
              second="adam")]


def facts(rule, of):
    """Not scale invariant: v_0 = 1e-6 and eps = 1e-3 are absolute constants next to g^2 and sqrt(v), and the
    additive step (1 - b2) g^2 takes a scale-dependent number of steps to forget v_0; per entry."""
    return {"grad_scale": False, "step_scale_free": False, "elementwise": True}


def _match(rule):
    if type(rule) is not Yogi or rule.schedule is not None or rule.eps_root or rule.initial_accumulator_value != 1e-6:
        return None
    return dict(learning_rate=rule.lr, b1=rule.beta1, b2=rule.beta2, eps=rule.eps)


OPTAX = PeerMapping("optax.yogi", "optax", "yogi", dict(b1=0.9, b2=0.999, eps=1e-3),
                    lambda learning_rate, b1, b2, eps: Yogi(lr=learning_rate, beta1=b1, beta2=b2, eps=eps),
                    "yogi", required=("learning_rate",), state={"m": "mu", "v": "nu"}, match=_match)

CONVENTIONS = Conventions(
    rules=(Yogi,),
    final="m_hat / (sqrt(v_hat) + eps) with v moved by (1 - b2) g^2 sign(g^2 - v): the sign rule, the start "
          "value 1e-6 of both moments, or the two bias corrections",
    per_step="the bias corrections 1 - beta1^t and 1 - beta2^t",
    counters=(("bc1", "the bias correction of m (1 - beta1^t)"), ("bc2", "the bias correction of v (1 - beta2^t)")),
    mappings=(OPTAX,),
    no_peer={"torch": "torch.optim ships no Yogi",
             "schedulefree": "schedulefree ships the Schedule-Free optimizers only"},
    presets=(
        OPTAX.preset("optax.yogi", dict(learning_rate=1e-2), "v = v - (1-b2) sign(v - g^2) g^2 from 1e-6; eps 1e-3"),
        OPTAX.preset("optax.yogi(betas,eps)", dict(learning_rate=5e-3, b1=0.8, b2=0.95, eps=1e-4),
                     "betas (0.8, 0.95), eps 1e-4"),
    ),
    wrong=(Preset("WRONG second moment: optax.yogi vs refopt Adam", "optax", "yogi",
                  ("yogi", dict(learning_rate=5e-3, b1=0.8, b2=0.95, eps=1e-4)),
                  lambda: Adam(lr=5e-3, beta1=0.8, beta2=0.95, eps=1e-4),
                  "Adam's v = b2 v + (1-b2) g^2 vs Yogi's sign step (and m_0 = v_0 = 1e-6)", state={},
                  expect_fail=True),),
    oracle=YogiOracle,
    variants=variants,
    facts=facts,
    golden=(GoldenCase("yogi", lambda: Yogi(lr=1e-2), "optax.yogi(1e-2)", ("m", "v")),
            GoldenCase("yogi_betas_eps", lambda: Yogi(lr=5e-3, beta1=0.8, beta2=0.95, eps=1e-4),
                       "Yogi betas (0.8, 0.95), eps 1e-4", ("m", "v"))),
    examples=(Example("yogi", lambda: Yogi(lr=0.01)),
              Example("yogi_betas_eps", lambda: Yogi(lr=0.01, beta1=0.8, beta2=0.95, eps=1e-4, eps_root=1e-8))),
    cli=(CliName("yogi", Yogi, {"mlp": 1e-2, "gpt": 1e-3}, "Yogi (optax semantics): --beta1, --beta2, --eps",
                 {"beta1": "beta1", "beta2": "beta2", "eps": "eps"}),),
)
