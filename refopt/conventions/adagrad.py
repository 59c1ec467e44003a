"""Adagrad (refopt/rules/adagrad.py) to torch.optim.Adagrad and optax.adagrad: torch adds eps after the square
root and starts the sum at 0 (eps 1e-10), optax adds eps inside it and starts at 0.1 (eps 1e-7); torch decays
the lr by 1/(1 + (t-1) lr_decay) and adds an L2 term to g, optax has neither."""
from __future__ import annotations

import numpy as np

from refopt.conventions._spec import (
    NO_MAXIMIZE, CliName, Conventions, Example, Oracle, PeerMapping, Preset, counted, gamma, scalar)
from refopt.golden import GoldenCase
from refopt.rules.adagrad import Adagrad


class AdagradOracle(Oracle):
    """Adagrad from the rule's docstring; switch ``eps_mode`` 'outside' | 'inside' overrides the rule's;
    ``counter`` {'lr_decay': 'next' | 'prev' | 'frozen'} the step the lr decay reads."""

    def init_leaf(self, x, path):
        return {"sum": np.full_like(x, self.rule.initial_accumulator_value)}

    def direction_leaf(self, t, s, x, g, path):
        r, d = self.rule, x.dtype
        if r.weight_decay != 0:
            g = g + scalar(r.weight_decay, d) * x
        s["sum"] = s["sum"] + g * g
        acc = s["sum"]
        if self.switches.get("eps_mode", r.eps_mode) == "inside":
            with np.errstate(divide="ignore"):
                return np.where(acc > 0, g * (1 / np.sqrt(acc + scalar(r.eps, d))), 0).astype(d)
        return g / (np.sqrt(acc) + scalar(r.eps, d))

    def step_leaf(self, t, s, x, g, path):
        r = self.rule
        tl = counted(t, self.switches.get("counter", {}).get("lr_decay"))
        lr = r.lr * gamma(r.schedule, t) / (1 + (tl - 1) * r.lr_decay)
        return x - scalar(lr, x.dtype) * self.direction_leaf(t, s, x, g, path)


def variants(rule):
    from refopt.conventions._variants import oracle_variant as v, rule_variant as rv, try_replace
    other = "inside" if rule.eps_mode == "outside" else "outside"
    out = [v(rule, f"eps {other} the sqrt", "g / sqrt(s + eps) (optax)" if other == "inside"
             else "g / (sqrt(s) + eps) (torch)", eps_mode=other)]
    if rule.lr_decay:
        out.append(rv("no lr decay", "the lr is not divided by 1 + (t - 1) lr_decay", try_replace(rule, lr_decay=0.0)))
    if rule.initial_accumulator_value:
        out.append(rv("the sum starts at 0", "s_0 = 0 (torch's default) in place of "
                      f"{rule.initial_accumulator_value:g}", try_replace(rule, initial_accumulator_value=0.0)))
    else:
        out.append(rv("the sum starts at 0.1", "s_0 = 0.1 (optax's default) in place of 0",
                      try_replace(rule, initial_accumulator_value=0.1)))
    return [o for o in out if o is not None]


def facts(rule, of):
    """g/sqrt(sum g^2) has degree 0 in g (eps -> 0 after the sqrt, s_0 = 0) without L2; the sum is taken per
    entry (eps inside the sqrt is compared with s, not with sqrt(s): not stated)."""
    scale_free = rule.weight_decay == 0 and rule.initial_accumulator_value == 0 and rule.eps_mode == "outside"
    return {"grad_scale": scale_free, "step_scale_free": False, "elementwise": True}


def _torch_match(rule):
    if type(rule) is not Adagrad or rule.schedule is not None or rule.eps_mode != "outside":
        return None
    return dict(lr=rule.lr, lr_decay=rule.lr_decay, weight_decay=rule.weight_decay,
                initial_accumulator_value=rule.initial_accumulator_value, eps=rule.eps)


def _optax_match(rule):
    if type(rule) is not Adagrad or rule.schedule is not None or rule.eps_mode != "inside" or rule.lr_decay \
            or rule.weight_decay:
        return None
    return dict(learning_rate=rule.lr, initial_accumulator_value=rule.initial_accumulator_value, eps=rule.eps)


_EPS = (lambda v: v > 0, "refopt's Adagrad needs eps > 0 (with eps = 0 a zero sum gives 0/0)")
TORCH = PeerMapping("torch.optim.Adagrad", "torch", "Adagrad",
                    dict(lr=1e-2, lr_decay=0.0, weight_decay=0.0, initial_accumulator_value=0.0, eps=1e-10,
                         maximize=False),
                    lambda lr, lr_decay, weight_decay, initial_accumulator_value, eps: Adagrad(
                        lr=lr, lr_decay=lr_decay, weight_decay=weight_decay,
                        initial_accumulator_value=initial_accumulator_value, eps=eps),
                    "adagrad", refuse={"maximize": NO_MAXIMIZE, "eps": _EPS},
                    ignore=("foreach", "differentiable", "fused"), state={"sum": "sum"}, match=_torch_match)
OPTAX = PeerMapping("optax.adagrad", "optax", "adagrad", dict(initial_accumulator_value=0.1, eps=1e-7),
                    lambda learning_rate, initial_accumulator_value, eps: Adagrad(
                        lr=learning_rate, initial_accumulator_value=initial_accumulator_value, eps=eps,
                        eps_mode="inside"),
                    "adagrad", required=("learning_rate",), refuse={"eps": _EPS}, state={"sum": "sum_of_squares"},
                    match=_optax_match)

def atlas_adagrad():
    from refopt.crosscheck.atlas import Entry, Pair, _p, _rules, peer_side

    R = _rules()
    t = _p("torch.Adagrad(lr=5e-2)", "torch", "Adagrad", dict(lr=5e-2), lambda: R.Adagrad(lr=5e-2),
           state={"sum": "sum"})
    o = _p("optax.adagrad(5e-2)", "optax", "adagrad", dict(learning_rate=5e-2),
           lambda: R.Adagrad(lr=5e-2, initial_accumulator_value=0.1, eps=1e-7, eps_mode="inside"),
           state={"sum": "sum_of_squares"})
    o0 = _p("optax.adagrad(5e-2, init 0, eps 1e-30)", "optax", "adagrad",
            dict(learning_rate=5e-2, initial_accumulator_value=0.0, eps=1e-30),
            lambda: R.Adagrad(lr=5e-2, initial_accumulator_value=0.0, eps=1e-30, eps_mode="inside"),
            state={"sum": "sum_of_squares"})
    t0 = _p("torch.Adagrad(lr=5e-2, eps=1e-30)", "torch", "Adagrad", dict(lr=5e-2, eps=1e-30),
            lambda: R.Adagrad(lr=5e-2, eps=1e-30), state={"sum": "sum"})
    return Entry(
        "adagrad-accumulator-eps", "torch.optim.Adagrad (sum from 0, eps 1e-10 after the sqrt) vs optax.adagrad "
        "(sum from 0.1, eps 1e-7 inside the sqrt)",
        (peer_side("torch", t, source="Duchi et al. 2011: delta I + diag(G_t)^(1/2), G_0 = 0"),
         peer_side("optax", o, source="optax defaults: initial_accumulator_value 0.1, eps inside the sqrt"),
         peer_side("optax init 0", o0, source="optax with s_0 = 0 and a negligible eps"),
         peer_side("torch eps 1e-30", t0, source="torch with a negligible eps")),
        (Pair("torch", "optax", "step", 0.1, what="per-step update (median over steps), defaults"),
         Pair("torch", "optax", "final", 1e-2, what="params after 50 steps, defaults"),
         Pair("torch eps 1e-30", "optax init 0", "final", 1e-9, "max",
              what="s_0 = 0 and eps 1e-30 on both sides: s_0 and eps are the whole difference")),
        "torch follows Duchi, Hazan & Singer (2011): the accumulator starts at 0 and delta is added to the square "
        "root; optax's start value 0.1 damps the first steps (a step of g/sqrt(0.1 + g^2) in place of sign(g)), "
        "which is the larger part of the difference.",
        "Duchi, Hazan & Singer 2011 (JMLR 12), eq. (1) and Figure 1; torch.optim.Adagrad; optax.adagrad")


CONVENTIONS = Conventions(
    rules=(Adagrad,),
    final="g/(sqrt(s) + eps) with s the sum of squared gradients: the square root, eps inside or outside, the "
          "sum's start value, or the lr decay 1/(1 + (t - 1) lr_decay)",
    per_step="the lr decay 1/(1 + (t - 1) lr_decay)",
    counters=lambda rule: (("lr_decay", "the lr decay 1/(1 + (t - 1) lr_decay)", ("next", "prev")),)
    if rule.lr_decay else (),
    mappings=(TORCH, OPTAX),
    no_peer={"schedulefree": "schedulefree ships the Schedule-Free optimizers only"},
    presets=(
        TORCH.preset("torch.Adagrad", dict(lr=1e-2), "s = s + g^2 from s_0 = 0; g/(sqrt(s) + eps), eps 1e-10"),
        TORCH.preset("torch.Adagrad(lr_decay,wd,init,eps)", dict(lr=5e-2, lr_decay=0.05, weight_decay=1e-2,
                                                                   initial_accumulator_value=0.3, eps=1e-6),
                     "lr/(1 + (t-1) lr_decay); L2 in g; s_0 = 0.3; eps after the sqrt"),
        OPTAX.preset("optax.adagrad", dict(learning_rate=5e-2),
                     "s_0 = 0.1; g rsqrt(s + eps), eps 1e-7 inside the sqrt"),
        OPTAX.preset("optax.adagrad(init,eps)", dict(learning_rate=5e-2, initial_accumulator_value=0.02, eps=1e-3),
                     "s_0 = 0.02; eps 1e-3 inside the sqrt"),
    ),
    wrong=(Preset("WRONG eps: optax.adagrad vs refopt Adagrad(eps outside)", "optax", "adagrad",
                  ("adagrad", dict(learning_rate=5e-2, initial_accumulator_value=0.02, eps=1e-3)),
                  lambda: Adagrad(lr=5e-2, initial_accumulator_value=0.02, eps=1e-3),
                  "sqrt(s + eps) vs sqrt(s) + eps: the eps convention is swapped", state={"sum": "sum_of_squares"},
                  expect_fail=True),),
    oracle=AdagradOracle,
    variants=variants,
    facts=facts,
    golden=(GoldenCase("adagrad", lambda: Adagrad(lr=1e-2), "torch.optim.Adagrad's defaults", ("sum",)),
            GoldenCase("adagrad_optax", lambda: Adagrad(lr=5e-2, initial_accumulator_value=0.1, eps=1e-7,
                                                        eps_mode="inside"),
                       "optax.adagrad's defaults (eps inside the sqrt, s_0 = 0.1)", ("sum",)),
            GoldenCase("adagrad_lr_decay_wd", lambda: Adagrad(lr=5e-2, lr_decay=0.05, weight_decay=1e-2,
                                                              initial_accumulator_value=0.3, eps=1e-6),
                       "Adagrad with lr decay 0.05, L2 1e-2, s_0 = 0.3, eps 1e-6", ("sum",))),
    examples=(Example("adagrad", lambda: Adagrad(lr=0.1)),
              Example("adagrad_optax_lr_decay_wd", lambda: Adagrad(lr=0.5, lr_decay=0.01, weight_decay=1e-3,
                                                                   initial_accumulator_value=0.1, eps=1e-7,
                                                                   eps_mode="inside"))),
    atlas=(atlas_adagrad,),
    cli=(CliName("adagrad", Adagrad, {"mlp": 1e-2, "gpt": 1e-2}, "Adagrad (torch semantics): --eps, "
                 "--weight-decay (L2)", {"eps": "eps"}),),
)
