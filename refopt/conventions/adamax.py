"""Adamax (refopt/rules/adamax.py) to torch.optim.Adamax, optax.adamax and optax.adamaxw: both peers put eps
inside the maximum, u = max(beta2 u, |g| + eps), and bias-correct m only; torch's weight_decay is an L2 term in
g, optax.adamaxw's a decoupled decay multiplied by the lr (x (1 - lr wd)), optax.adamax has none."""
from __future__ import annotations

import numpy as np

from refopt.conventions._spec import (
    NO_MASK, NO_MAXIMIZE, CliName, Conventions, Example, Oracle, PeerMapping, Preset, counted, gamma, scalar)
from refopt.golden import GoldenCase
from refopt.rules.adamax import Adamax


class AdamaxOracle(Oracle):
    """Adamax from the rule's docstring. Switches: ``eps_mode`` 'inside' (max(beta2 u, |g| + eps), the
    peers') | 'outside' (m / (max(beta2 u, |g|) + eps)); ``bias`` 'standard' | 'none'; ``decay`` 'l2' |
    'decoupled' overriding the rule's; ``counter`` {'bc1': 'next' | 'prev' | 'frozen'}."""

    def init_leaf(self, x, path):
        return {"m": np.zeros_like(x), "u": np.zeros_like(x)}

    def _decay(self):
        r = self.rule
        return self.switches.get("decay", "decoupled" if r.decoupled_weight_decay else "l2")

    def _ratio(self, t, s, x, g):
        """(m_t / u_t, 1 - beta1^t) of step t; m, u updated."""
        r, d = self.rule, x.dtype
        if r.weight_decay != 0 and self._decay() == "l2":
            g = g + scalar(r.weight_decay, d) * x
        s["m"] = scalar(r.beta1, d) * s["m"] + scalar(1.0 - r.beta1, d) * g
        m = s["m"]
        if self.switches.get("eps_mode", "inside") == "inside":
            s["u"] = np.maximum(scalar(r.beta2, d) * s["u"], np.abs(g) + scalar(r.eps, d))
            u = s["u"]
        else:
            s["u"] = np.maximum(scalar(r.beta2, d) * s["u"], np.abs(g))
            u = s["u"] + scalar(r.eps, d)
        tc = counted(t, self.switches.get("counter", {}).get("bc1"))
        return m / u, (1.0 - r.beta1 ** tc if self.switches.get("bias", "standard") == "standard" else 1.0)

    def direction_leaf(self, t, s, x, g, path):
        ratio, bc1 = self._ratio(t, s, x, g)
        return scalar(1.0 / bc1, x.dtype) * ratio

    def step_leaf(self, t, s, x, g, path):
        r, d = self.rule, x.dtype
        lr = r.lr * gamma(r.schedule, t)
        ratio, bc1 = self._ratio(t, s, x, g)
        decay = 1.0 - lr * r.weight_decay if r.weight_decay != 0 and self._decay() == "decoupled" else 1.0
        return scalar(decay, d) * x - scalar(lr / bc1, d) * ratio


def variants(rule):
    from refopt.conventions._variants import oracle_variant as v
    out = [v(rule, "eps outside the maximum", "m / (max(beta2 u, |g|) + eps) in place of max(beta2 u, |g| + eps)",
             eps_mode="outside"),
           v(rule, "no bias correction", "m / u without the 1/(1 - beta1^t)", bias="none")]
    if rule.weight_decay:
        other = "l2" if rule.decoupled_weight_decay else "decoupled"
        out.append(v(rule, "decoupled_weight_decay flipped", f"the decay as {'an L2 term in g' if other == 'l2' else 'x (1 - lr wd)'}",
                     decay=other))
    return out


def facts(rule, of):
    """m/max(beta2 u, |g| + eps) has degree 0 in g (eps -> 0) without L2 (a decoupled decay does not involve g);
    the maximum is taken per entry."""
    return {"grad_scale": rule.weight_decay == 0 or rule.decoupled_weight_decay, "step_scale_free": False,
            "elementwise": True}


def _torch_match(rule):
    if type(rule) is not Adamax or rule.schedule is not None or rule.decoupled_weight_decay:
        return None
    return dict(lr=rule.lr, betas=(rule.beta1, rule.beta2), eps=rule.eps, weight_decay=rule.weight_decay)


def _optax_match(decayed):
    def match(rule):
        if type(rule) is not Adamax or rule.schedule is not None or (rule.weight_decay and not rule.decoupled_weight_decay):
            return None
        if not decayed and rule.weight_decay:
            return None
        kw = dict(learning_rate=rule.lr, b1=rule.beta1, b2=rule.beta2, eps=rule.eps)
        return {**kw, "weight_decay": rule.weight_decay} if decayed else kw
    return match


def _torch(lr, betas, eps, weight_decay):
    return Adamax(lr=lr, beta1=betas[0], beta2=betas[1], eps=eps, weight_decay=weight_decay)


def _optax(learning_rate, b1, b2, eps, weight_decay=0.0):
    return Adamax(lr=learning_rate, beta1=b1, beta2=b2, eps=eps, weight_decay=weight_decay,
                  decoupled_weight_decay=True)


_STATE = {"m": "exp_avg", "u": "exp_inf"}
_OSTATE = {"m": "mu", "u": "nu"}
TORCH = PeerMapping("torch.optim.Adamax", "torch", "Adamax",
                    dict(lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, maximize=False), _torch, "adamax",
                    refuse={"maximize": NO_MAXIMIZE},
                    ignore=("foreach", "differentiable", "capturable"), state=_STATE, match=_torch_match)
OPTAX = PeerMapping("optax.adamax", "optax", "adamax", dict(b1=0.9, b2=0.999, eps=1e-8), _optax, "adamax",
                    required=("learning_rate",), state=_OSTATE, match=_optax_match(False))
OPTAX_W = PeerMapping("optax.adamaxw", "optax", "adamaxw", dict(b1=0.9, b2=0.999, eps=1e-8, weight_decay=1e-4,
                                                                mask=None),
                      _optax, "adamax", required=("learning_rate",), refuse={"mask": NO_MASK}, state=_OSTATE,
                      match=_optax_match(True))

CONVENTIONS = Conventions(
    rules=(Adamax,),
    final="lr/(1 - beta1^t) m/u with u = max(beta2 u, |g| + eps): eps inside or outside the maximum, the bias "
          "correction of m (u has none), or the decay",
    per_step="the bias correction 1 - beta1^t",
    counters=(("bc1", "the bias correction of m (1 - beta1^t)"),),
    mappings=(TORCH, OPTAX, OPTAX_W),
    no_peer={"schedulefree": "schedulefree ships the Schedule-Free optimizers only"},
    presets=(
        TORCH.preset("torch.Adamax", dict(lr=2e-2), "u = max(beta2 u, |g| + eps); lr/(1 - beta1^t) m/u"),
        TORCH.preset("torch.Adamax(betas,eps,wd)", dict(lr=2e-2, betas=(0.8, 0.95), eps=1e-3, weight_decay=1e-2),
                     "L2 in g; eps 1e-3 inside the maximum"),
        OPTAX.preset("optax.adamax", dict(learning_rate=2e-2, b1=0.8, b2=0.95, eps=1e-3),
                     "mu/(1 - b1^t) / max(b2 nu, |g| + eps)"),
        OPTAX_W.preset("optax.adamaxw", dict(learning_rate=2e-2, b1=0.8, b2=0.95, eps=1e-3, weight_decay=0.1),
                       "decoupled decay lr wd x added to the Adamax step"),
    ),
    wrong=(Preset("WRONG decay: torch.Adamax(wd) vs refopt Adamax(decoupled)", "torch", "adamax",
                  ("Adamax", dict(lr=2e-2, weight_decay=0.1)),
                  lambda: Adamax(lr=2e-2, weight_decay=0.1, decoupled_weight_decay=True),
                  "L2 in g vs x (1 - lr wd): the decay convention is swapped", state=_STATE, expect_fail=True),),
    oracle=AdamaxOracle,
    variants=variants,
    facts=facts,
    golden=(GoldenCase("adamax", lambda: Adamax(lr=2e-2), "torch.optim.Adamax's defaults (lr 2e-2)", ("m", "u")),
            GoldenCase("adamax_l2", lambda: Adamax(lr=2e-2, beta1=0.8, beta2=0.95, eps=1e-3, weight_decay=1e-2),
                       "Adamax, L2 1e-2 in g, eps 1e-3 inside the maximum", ("m", "u")),
            GoldenCase("adamaxw", lambda: Adamax(lr=2e-2, beta1=0.8, beta2=0.95, eps=1e-3, weight_decay=0.1,
                                                 decoupled_weight_decay=True),
                       "optax.adamaxw: decoupled decay 0.1", ("m", "u"))),
    examples=(Example("adamax", lambda: Adamax(lr=0.05)),
              Example("adamaxw", lambda: Adamax(lr=0.05, beta1=0.8, beta2=0.95, eps=1e-3, weight_decay=1e-2,
                                                decoupled_weight_decay=True))),
    cli=(CliName("adamax", Adamax, {"mlp": 2e-3, "gpt": 2e-3}, "Adamax (torch semantics): --beta1, --beta2, --eps, "
                 "--weight-decay (L2)", {"beta1": "beta1", "beta2": "beta2", "eps": "eps"}),),
)
