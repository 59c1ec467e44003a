"""Adadelta (refopt/rules/adadelta.py) to torch.optim.Adadelta and optax.adadelta: the two peers compute the
same arithmetic (eps inside both square roots, the lr on the ratio, L2 decay added to g). optax's default
``learning_rate=None`` skips the lr scaling and with it the sign flip, so ``optax.apply_updates`` ascends: the
mapping refuses it."""
from __future__ import annotations

import numpy as np

from refopt.conventions._spec import (
    CONSTANT, NO_MASK, NO_MAXIMIZE, CliName, Conventions, Example, Oracle, PeerMapping, Preset, gamma, scalar)
from refopt.golden import GoldenCase
from refopt.rules.adadelta import Adadelta


class AdadeltaOracle(Oracle):
    """Adadelta from the rule's docstring. Switches: ``eps_mode`` 'inside' (both square roots, the peers') |
    'outside' (sqrt(.) + eps); ``ratio`` 'standard' | 'inverted' (sqrt(E[g^2] + eps) / sqrt(E[dx^2] + eps))."""

    def init_leaf(self, x, path):
        return {"eg2": np.zeros_like(x), "edx2": np.zeros_like(x)}

    def direction_leaf(self, t, s, x, g, path):
        r, d = self.rule, x.dtype
        rho, eps = scalar(r.rho, d), scalar(r.eps, d)
        if r.weight_decay != 0:
            g = g + scalar(r.weight_decay, d) * x
        s["eg2"] = rho * s["eg2"] + scalar(1.0 - r.rho, d) * (g * g)
        if self.switches.get("eps_mode", "inside") == "inside":
            num, den = np.sqrt(s["edx2"] + eps), np.sqrt(s["eg2"] + eps)
        else:
            num, den = np.sqrt(s["edx2"]) + eps, np.sqrt(s["eg2"]) + eps
        if self.switches.get("ratio", "standard") == "inverted":
            num, den = den, num
        dx = num / den * g
        s["edx2"] = rho * s["edx2"] + scalar(1.0 - r.rho, d) * (dx * dx)
        return dx

    def step_leaf(self, t, s, x, g, path):
        lr = self.rule.lr * gamma(self.rule.schedule, t)
        return x - scalar(lr, x.dtype) * self.direction_leaf(t, s, x, g, path)


def variants(rule):
    from refopt.conventions._variants import oracle_variant as v
    return [v(rule, "eps outside the square roots", "(sqrt(E[dx^2]) + eps) / (sqrt(E[g^2]) + eps)",
              eps_mode="outside"),
            v(rule, "the ratio inverted", "sqrt(E[g^2] + eps) / sqrt(E[dx^2] + eps) g", ratio="inverted")]


def facts(rule, of):
    """dx = sqrt(E[dx^2] + eps) / sqrt(E[g^2] + eps) g: the numerator does not involve g and the denominator
    has degree 1 in g once eps << E[g^2], so the step has degree 0 in g without L2 and with a small eps
    (<= 1e-8 stated; the default 1e-6 is comparable to the E[g^2] of small gradients); per entry."""
    return {"grad_scale": rule.weight_decay == 0 and rule.eps <= 1e-8, "step_scale_free": False,
            "elementwise": True}


def _torch_match(rule):
    if type(rule) is not Adadelta or rule.schedule is not None:
        return None
    return dict(lr=rule.lr, rho=rule.rho, eps=rule.eps, weight_decay=rule.weight_decay)


def _optax_match(rule):
    if type(rule) is not Adadelta or rule.schedule is not None:
        return None
    return dict(learning_rate=rule.lr, rho=rule.rho, eps=rule.eps, weight_decay=rule.weight_decay)


_LR = (lambda v: v is not None, "optax.adadelta with learning_rate=None returns +dx (no lr scaling, so no sign "
                                "flip): optax.apply_updates then ascends; pass learning_rate=1.0 for Zeiler's "
                                "lr-free step")
_STATE = {"eg2": "square_avg", "edx2": "acc_delta"}
_OSTATE = {"eg2": "e_g", "edx2": "e_x"}
TORCH = PeerMapping("torch.optim.Adadelta", "torch", "Adadelta",
                    dict(lr=1.0, rho=0.9, eps=1e-6, weight_decay=0.0, maximize=False),
                    lambda lr, rho, eps, weight_decay: Adadelta(lr=lr, rho=rho, eps=eps, weight_decay=weight_decay),
                    "adadelta", refuse={"maximize": NO_MAXIMIZE}, ignore=("foreach", "capturable", "differentiable"),
                    state=_STATE, match=_torch_match)
OPTAX = PeerMapping("optax.adadelta", "optax", "adadelta",
                    dict(learning_rate=None, rho=0.9, eps=1e-6, weight_decay=0.0, weight_decay_mask=None),
                    lambda learning_rate, rho, eps, weight_decay: Adadelta(lr=learning_rate, rho=rho, eps=eps,
                                                                           weight_decay=weight_decay),
                    "adadelta", refuse={"learning_rate": _LR, "weight_decay": CONSTANT, "weight_decay_mask": NO_MASK},
                    state=_OSTATE, match=_optax_match)

CONVENTIONS = Conventions(
    rules=(Adadelta,),
    final="sqrt(E[dx^2] + eps) / sqrt(E[g^2] + eps) g: eps inside or outside the square roots, the ratio's "
          "orientation, or which E[dx^2] the numerator reads (the previous step's)",
    per_step="",
    mappings=(TORCH, OPTAX),
    no_peer={"schedulefree": "schedulefree ships the Schedule-Free optimizers only"},
    presets=(
        TORCH.preset("torch.Adadelta", dict(lr=1.0), "E[g^2], E[dx^2] with rho 0.9; eps 1e-6 inside both roots"),
        TORCH.preset("torch.Adadelta(lr,rho,eps,wd)", dict(lr=0.5, rho=0.8, eps=1e-4, weight_decay=1e-2),
                     "lr 0.5 on the ratio; L2 in g"),
        OPTAX.preset("optax.adadelta", dict(learning_rate=1.0), "the same arithmetic as torch (e_g, e_x)"),
        OPTAX.preset("optax.adadelta(rho,eps,wd)", dict(learning_rate=0.5, rho=0.95, eps=1e-4, weight_decay=1e-2),
                     "add_decayed_weights before the ratio: L2 in g"),
    ),
    wrong=(Preset("WRONG decay: torch.Adadelta(wd) vs refopt Adadelta()", "torch", "adadelta",
                  ("Adadelta", dict(lr=0.5, weight_decay=0.1)), lambda: Adadelta(lr=0.5),
                  "the L2 term is missing", state=_STATE, expect_fail=True),),
    oracle=AdadeltaOracle,
    variants=variants,
    facts=facts,
    golden=(GoldenCase("adadelta", lambda: Adadelta(), "torch.optim.Adadelta's defaults", ("eg2", "edx2")),
            GoldenCase("adadelta_wd", lambda: Adadelta(lr=0.5, rho=0.8, eps=1e-4, weight_decay=1e-2),
                       "Adadelta lr 0.5, rho 0.8, eps 1e-4, L2 1e-2", ("eg2", "edx2"))),
    examples=(Example("adadelta", lambda: Adadelta(lr=1.0, eps=1e-4)),
              Example("adadelta_wd", lambda: Adadelta(lr=0.5, rho=0.95, eps=1e-4, weight_decay=1e-3))),
    cli=(CliName("adadelta", Adadelta, {"mlp": 1.0, "gpt": 1.0}, "Adadelta: --eps, --weight-decay (L2)",
                 {"eps": "eps"}),),
)
