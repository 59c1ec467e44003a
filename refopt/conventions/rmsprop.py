"""RMSprop (refopt/rules/rmsprop.py) to torch.optim.RMSprop and optax.rmsprop: eps after the square root, no
bias correction, L2 decay in g; optax's rmsprop has eps 1e-8 outside its sqrt too (CONVENTIONS.md 1, 2)."""
from __future__ import annotations

import numpy as np

from refopt.conventions._spec import CliName, Conventions, Example, Oracle, PeerMapping, Preset, gamma, scalar
from refopt.golden import GoldenCase
from refopt.rules.rmsprop import RMSprop


class RMSpropOracle(Oracle):
    """RMSprop from the rule's docstring; switch ``eps_mode`` 'outside' | 'inside' (sqrt(v + eps))."""

    def init_leaf(self, x, path):
        return {"v": np.zeros_like(x), "g_avg": np.zeros_like(x), "b": np.zeros_like(x)}

    def direction_leaf(self, t, s, x, g, path):
        r, d = self.rule, x.dtype
        if r.weight_decay != 0:
            g = g + scalar(r.weight_decay, d) * x
        v = s["v"] = scalar(r.alpha, d) * s["v"] + scalar(1.0 - r.alpha, d) * (g * g)
        if r.centered:
            a = s["g_avg"] = s["g_avg"] + scalar(1.0 - r.alpha, d) * (g - s["g_avg"])
            v = v - a * a
        den = np.sqrt(v + scalar(r.eps, d)) if self.switches.get("eps_mode") == "inside" else np.sqrt(v) + scalar(r.eps, d)
        if r.momentum > 0:
            s["b"] = scalar(r.momentum, d) * s["b"] + g / den
            return s["b"].copy()
        return g / den

    def step_leaf(self, t, s, x, g, path):
        lr = self.rule.lr * gamma(self.rule.schedule, t)
        return x - scalar(lr, x.dtype) * self.direction_leaf(t, s, x, g, path)


def variants(rule):
    from refopt.conventions._variants import oracle_variant as v
    return [v(rule, "eps inside the sqrt", "g / sqrt(v + eps) (TensorFlow's RMSprop)", eps_mode="inside")]


def facts(rule, of):
    """g/sqrt(v) has degree 0 in g (eps -> 0) without L2; sqrt(v) is taken per entry."""
    return {"grad_scale": rule.weight_decay == 0,
            "step_scale_free": rule.weight_decay == 0 and rule.alpha == 0 and rule.momentum == 0 and not rule.centered,
            "elementwise": True}


def _state(a):
    out = {"v": "square_avg"}
    if a["centered"]:
        out["g_avg"] = "grad_avg"
    if a["momentum"]:
        out["b"] = "momentum_buffer"
    return out


def _match(rule):
    if rule.schedule is not None:
        return None
    return dict(lr=rule.lr, alpha=rule.alpha, eps=rule.eps, weight_decay=rule.weight_decay, momentum=rule.momentum,
                centered=rule.centered)


TORCH = PeerMapping("torch.optim.RMSprop", "torch", "RMSprop",
                    dict(lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0, centered=False, maximize=False),
                    RMSprop, "rmsprop", refuse={"maximize": (lambda v: not v, "refopt minimises; feed -g")},
                    ignore=("foreach", "capturable", "differentiable"), state=_state, match=_match)

CONVENTIONS = Conventions(
    rules=(RMSprop,),
    final="g/(sqrt(v) + eps): the square root, eps inside or outside, the centered variance v - a^2, or the momentum of that ratio",
    per_step="",
    mappings=(TORCH,),
    no_peer={"optax": "optax.rmsprop adds eps inside its square root by default: a mapping is future work",
             "schedulefree": "schedulefree ships the Schedule-Free optimizers only"},
    presets=(
        TORCH.preset("torch.RMSprop", dict(lr=1e-2), "v = alpha v + (1-alpha) g^2; g/(sqrt(v) + eps); no bias correction"),
        TORCH.preset("torch.RMSprop(centered,momentum,wd)", dict(lr=1e-2, alpha=0.9, eps=1e-6, weight_decay=1e-2,
                                                                  momentum=0.9, centered=True),
                     "centered: sqrt(v - a^2) + eps with a the lerp-averaged gradient; momentum on g/d; L2 in g"),
    ),
    wrong=(Preset("WRONG centered: torch.RMSprop(centered=True) vs refopt RMSprop()", "torch", "rmsprop",
                  ("RMSprop", dict(lr=1e-2, centered=True)), lambda: RMSprop(lr=1e-2),
                  "sqrt(v - a^2) vs sqrt(v): the centered denominator is missing", state={"v": "square_avg"},
                  expect_fail=True),),
    oracle=RMSpropOracle,
    variants=variants,
    facts=facts,
    golden=(GoldenCase("rmsprop", lambda: RMSprop(lr=1e-2), "torch.optim.RMSprop's defaults", ("v",)),
            GoldenCase("rmsprop_centered_momentum_wd", lambda: RMSprop(lr=1e-2, alpha=0.9, eps=1e-6, weight_decay=1e-2,
                                                                       momentum=0.9, centered=True),
                       "RMSprop centered, momentum 0.9, L2 1e-2", ("v", "g_avg", "b"))),
    examples=(Example("rmsprop", lambda: RMSprop(lr=0.01)),
              Example("rmsprop_centered_momentum_wd", lambda: RMSprop(lr=0.01, momentum=0.9, centered=True,
                                                                      weight_decay=1e-3))),
    cli=(CliName("rmsprop", RMSprop, {"mlp": 1e-3, "gpt": 1e-3}, "RMSprop (torch semantics): --momentum, --eps, "
                 "--weight-decay (L2)", {"momentum": "momentum", "eps": "eps"}),),
)
