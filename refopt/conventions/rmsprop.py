"""RMSprop (refopt/rules/rmsprop.py) to torch.optim.RMSprop and optax.rmsprop: torch adds eps after the square
root and decays v with alpha 0.99; optax adds eps inside it (``eps_in_sqrt=True``) with decay 0.9, and has a start
value of v (``initial_scale``), a bias correction and Nesterov momentum; torch has an L2 term, optax none
(CONVENTIONS.md 1, 2)."""
from __future__ import annotations

import numpy as np

from refopt.conventions._spec import (
    NO_MAXIMIZE, CliName, Conventions, Example, Oracle, PeerMapping, Preset, gamma, scalar)
from refopt.golden import GoldenCase
from refopt.rules.rmsprop import RMSprop


class RMSpropOracle(Oracle):
    """RMSprop from the rule's docstring; switch ``eps_mode`` 'outside' | 'inside' (sqrt(v + eps)) overrides the
    rule's."""

    def init_leaf(self, x, path):
        return {"v": np.full_like(x, self.rule.initial_scale), "g_avg": np.zeros_like(x), "b": np.zeros_like(x)}

    def direction_leaf(self, t, s, x, g, path):
        r, d = self.rule, x.dtype
        if r.weight_decay != 0:
            g = g + scalar(r.weight_decay, d) * x
        s["v"] = scalar(r.alpha, d) * s["v"] + scalar(1.0 - r.alpha, d) * (g * g)
        v = s["v"]
        bc = scalar(1.0 - r.alpha ** t, d) if r.bias_correction else None
        if bc is not None:
            v = v / bc
        if r.centered:
            s["g_avg"] = s["g_avg"] + scalar(1.0 - r.alpha, d) * (g - s["g_avg"])
            a = s["g_avg"]
            v = v - (a / bc if bc is not None else a) ** 2
        eps = scalar(r.eps, d)
        den = np.sqrt(v + eps) if self.switches.get("eps_mode", r.eps_mode) == "inside" else np.sqrt(v) + eps
        if r.momentum > 0:
            s["b"] = scalar(r.momentum, d) * s["b"] + g / den
            return g / den + scalar(r.momentum, d) * s["b"] if r.nesterov else s["b"].copy()
        return g / den

    def step_leaf(self, t, s, x, g, path):
        lr = self.rule.lr * gamma(self.rule.schedule, t)
        return x - scalar(lr, x.dtype) * self.direction_leaf(t, s, x, g, path)


def variants(rule):
    from refopt.conventions._variants import oracle_variant as v
    other = "inside" if rule.eps_mode == "outside" else "outside"
    return [v(rule, f"eps {other} the sqrt", "g / sqrt(v + eps) (optax, TensorFlow)" if other == "inside"
              else "g / (sqrt(v) + eps) (torch)", eps_mode=other)]


def facts(rule, of):
    """g/sqrt(v) has degree 0 in g (eps -> 0) without L2 and with v_0 = 0; sqrt(v) is taken per entry."""
    free = rule.weight_decay == 0 and rule.initial_scale == 0
    return {"grad_scale": free,
            "step_scale_free": free and rule.alpha == 0 and rule.momentum == 0 and not rule.centered,
            "elementwise": True}


def _state(a):
    out = {"v": "square_avg"}
    if a["centered"]:
        out["g_avg"] = "grad_avg"
    if a["momentum"]:
        out["b"] = "momentum_buffer"
    return out


def _ostate(a):
    # optax's trace holds the lr-scaled step (-lr b), so b is compared through the params only
    return {"v": "nu", **({"g_avg": "mu"} if a["centered"] else {})}


def _match(rule):
    if type(rule) is not RMSprop or rule.schedule is not None or rule.eps_mode != "outside" or rule.initial_scale \
            or rule.bias_correction or rule.nesterov:
        return None
    return dict(lr=rule.lr, alpha=rule.alpha, eps=rule.eps, weight_decay=rule.weight_decay, momentum=rule.momentum,
                centered=rule.centered)


def _optax_match(rule):
    if type(rule) is not RMSprop or rule.schedule is not None or rule.weight_decay:
        return None
    return dict(learning_rate=rule.lr, decay=rule.alpha, eps=rule.eps, initial_scale=rule.initial_scale,
                eps_in_sqrt=rule.eps_mode == "inside", centered=rule.centered,
                momentum=rule.momentum or None, nesterov=rule.nesterov, bias_correction=rule.bias_correction)


def _optax(learning_rate, decay, eps, initial_scale, eps_in_sqrt, centered, momentum, nesterov, bias_correction):
    mu = float(momentum or 0.0)
    return RMSprop(lr=learning_rate, alpha=decay, eps=eps, momentum=mu, centered=centered,
                   eps_mode="inside" if eps_in_sqrt else "outside", initial_scale=initial_scale,
                   bias_correction=bias_correction, nesterov=bool(nesterov) and mu > 0)


TORCH = PeerMapping("torch.optim.RMSprop", "torch", "RMSprop",
                    dict(lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0.0, momentum=0.0, centered=False, maximize=False),
                    RMSprop, "rmsprop", refuse={"maximize": NO_MAXIMIZE},
                    ignore=("foreach", "capturable", "differentiable"), state=_state, match=_match)
OPTAX = PeerMapping("optax.rmsprop", "optax", "rmsprop",
                    dict(decay=0.9, eps=1e-8, initial_scale=0.0, eps_in_sqrt=True, centered=False, momentum=None,
                         nesterov=False, bias_correction=False),
                    _optax, "rmsprop", required=("learning_rate",), state=_ostate, match=_optax_match)


def atlas_rmsprop():
    from refopt.crosscheck.atlas import Entry, Pair, _p, _rules, peer_side

    R = _rules()
    t = _p("torch.RMSprop(lr=1e-2)", "torch", "RMSprop", dict(lr=1e-2), lambda: R.RMSprop(lr=1e-2),
           state={"v": "square_avg"})
    o = _p("optax.rmsprop(1e-2)", "optax", "rmsprop", dict(learning_rate=1e-2),
           lambda: R.RMSprop(lr=1e-2, alpha=0.9, eps_mode="inside"), state={"v": "nu"})
    t9 = _p("torch.RMSprop(lr=1e-2, alpha=0.9, eps=1e-30)", "torch", "RMSprop", dict(lr=1e-2, alpha=0.9, eps=1e-30),
            lambda: R.RMSprop(lr=1e-2, alpha=0.9, eps=1e-30), state={"v": "square_avg"})
    o9 = _p("optax.rmsprop(1e-2, eps=1e-30)", "optax", "rmsprop", dict(learning_rate=1e-2, eps=1e-30),
            lambda: R.RMSprop(lr=1e-2, alpha=0.9, eps=1e-30, eps_mode="inside"), state={"v": "nu"})
    return Entry(
        "rmsprop-decay-eps", "torch.optim.RMSprop (alpha 0.99, eps 1e-8 after the sqrt) vs optax.rmsprop (decay "
        "0.9, eps 1e-8 inside the sqrt)",
        (peer_side("torch", t, source="torch defaults: alpha 0.99, g / (sqrt(v) + eps)"),
         peer_side("optax", o, source="Tieleman & Hinton's decay 0.9; g rsqrt(v + eps)"),
         peer_side("torch alpha 0.9 eps 1e-30", t9, source="torch with optax's decay and a negligible eps"),
         peer_side("optax eps 1e-30", o9, source="optax with a negligible eps")),
        (Pair("torch", "optax", "step", 0.1, what="per-step update (median over steps), defaults"),
         Pair("torch", "optax", "final", 1e-2, what="params after 50 steps, defaults"),
         Pair("torch alpha 0.9 eps 1e-30", "optax eps 1e-30", "final", 1e-9, "max",
              what="the same decay and eps 1e-30 on both sides: decay and eps are the whole difference")),
        "optax's decay 0.9 is the lecture's (MeanSquare = 0.9 MeanSquare + 0.1 g^2); the lecture has no eps, so "
        "neither placement is the source's. The decay is the larger part of the difference: with alpha 0.99 "
        "v_t is (1 - 0.99^t) E[g^2] for the first tens of steps, and the step is up to sqrt(10) larger.",
        "Tieleman & Hinton 2012, Neural Networks for Machine Learning, lecture 6.5; torch.optim.RMSprop; "
        "optax.rmsprop")


CONVENTIONS = Conventions(
    rules=(RMSprop,),
    final="g/(sqrt(v) + eps): the square root, eps inside or outside, v's start value or bias correction, the "
          "centered variance v - a^2, or the (Nesterov) momentum of that ratio",
    per_step="",
    mappings=(TORCH, OPTAX),
    no_peer={"schedulefree": "schedulefree ships the Schedule-Free optimizers only"},
    presets=(
        TORCH.preset("torch.RMSprop", dict(lr=1e-2), "v = alpha v + (1-alpha) g^2; g/(sqrt(v) + eps); no bias correction"),
        TORCH.preset("torch.RMSprop(centered,momentum,wd)", dict(lr=1e-2, alpha=0.9, eps=1e-6, weight_decay=1e-2,
                                                                  momentum=0.9, centered=True),
                     "centered: sqrt(v - a^2) + eps with a the lerp-averaged gradient; momentum on g/d; L2 in g"),
        OPTAX.preset("optax.rmsprop", dict(learning_rate=1e-2), "decay 0.9; g rsqrt(v + eps), eps 1e-8 inside"),
        OPTAX.preset("optax.rmsprop(centered,momentum,nesterov,init)",
                     dict(learning_rate=1e-2, decay=0.8, eps=1e-6, initial_scale=0.05, centered=True, momentum=0.9,
                          nesterov=True),
                     "v_0 = 0.05; rsqrt(v - a^2 + eps); Nesterov trace of the lr-scaled step"),
        OPTAX.preset("optax.rmsprop(eps_in_sqrt=False,bias_correction,momentum)",
                     dict(learning_rate=1e-2, decay=0.95, eps=1e-4, eps_in_sqrt=False, momentum=0.5,
                          bias_correction=True),
                     "1/(sqrt(v / (1 - decay^t)) + eps): torch's eps placement with a bias correction; momentum 0.5"),
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
                       "RMSprop centered, momentum 0.9, L2 1e-2", ("v", "g_avg", "b")),
            GoldenCase("rmsprop_optax", lambda: RMSprop(lr=1e-2, alpha=0.8, eps=1e-6, momentum=0.9, centered=True,
                                                        eps_mode="inside", initial_scale=0.05, bias_correction=True,
                                                        nesterov=True),
                       "optax.rmsprop: eps inside, v_0 0.05, bias correction, centered, Nesterov 0.9",
                       ("v", "g_avg", "b"))),
    examples=(Example("rmsprop", lambda: RMSprop(lr=0.01)),
              Example("rmsprop_centered_momentum_wd", lambda: RMSprop(lr=0.01, momentum=0.9, centered=True,
                                                                      weight_decay=1e-3)),
              Example("rmsprop_optax_nesterov_bc", lambda: RMSprop(lr=0.01, alpha=0.9, momentum=0.9, nesterov=True,
                                                                   eps_mode="inside", initial_scale=0.1,
                                                                   bias_correction=True))),
    atlas=(atlas_rmsprop,),
    cli=(CliName("rmsprop", RMSprop, {"mlp": 1e-3, "gpt": 1e-3}, "RMSprop (torch semantics): --momentum, --eps, "
                 "--weight-decay (L2)", {"momentum": "momentum", "eps": "eps"}),),
)
