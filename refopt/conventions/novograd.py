"""NovoGrad (refopt/rules/novograd.py) to optax.novograd: one second moment per leaf (||g||_F^2, its first
value taken whole), momentum without (1 - b1) over g/(sqrt(v) + eps) + wd x; torch.optim ships none."""
from __future__ import annotations

import numpy as np

from refopt.conventions._spec import CONSTANT, Conventions, Example, Oracle, PeerMapping, Preset, gamma, scalar
from refopt.golden import GoldenCase
from refopt.rules.adam import Adam
from refopt.rules.novograd import NovoGrad


class NovoGradOracle(Oracle):
    """NovoGrad from the rule's docstring. Switches: ``v1`` 'whole' (v_1 = ||g_1||^2, optax's) | 'ema'
    (v_1 = (1 - b2)||g_1||^2); ``momentum`` 'sum' (b1 m + u, the paper's) | 'ema' (b1 m + (1 - b1) u)."""

    def init_leaf(self, x, path):
        return {"m": np.zeros_like(x), "v": np.zeros((), x.dtype)}

    def direction_leaf(self, t, s, x, g, path):
        r, d, sw = self.rule, x.dtype, self.switches
        n2 = scalar(float(np.sqrt(np.sum(g.astype(np.float64) ** 2))) ** 2, d)
        first_whole = t == 1 and sw.get("v1", "whole") == "whole"
        s["v"] = np.asarray(n2 if first_whole else scalar(r.beta2, d) * s["v"] + scalar(1 - r.beta2, d) * n2, d)
        u = g / (np.sqrt(s["v"] + scalar(r.eps_root, d)) + scalar(r.eps, d))
        if r.weight_decay:
            u = u + scalar(r.weight_decay, d) * x
        keep = scalar(1 - r.beta1, d) if sw.get("momentum", "sum") == "ema" else scalar(1.0, d)
        s["m"] = u if t == 1 and keep == 1 else scalar(r.beta1, d) * s["m"] + keep * u
        return s["m"].copy()

    def step_leaf(self, t, s, x, g, path):
        lr = self.rule.lr * gamma(self.rule.schedule, t)
        return x - scalar(lr, x.dtype) * self.direction_leaf(t, s, x, g, path)


def variants(rule):
    from refopt.conventions._variants import oracle_variant as v
    return [v(rule, "v_1 as an EMA from 0", "v_1 = (1 - b2) ||g_1||^2 in place of ||g_1||^2", v1="ema"),
            v(rule, "momentum as an EMA", "m = b1 m + (1 - b1) u in place of b1 m + u", momentum="ema")]


def facts(rule, of):
    """g/||g||_F per leaf: degree 0 in g without decay (eps -> 0); the Frobenius norm is invariant under
    orthogonal maps and permutations, so the step commutes with both (``elementwise``, the fact permutation
    equivariance reads, holds though v is one number per leaf)."""
    return {"grad_scale": rule.weight_decay == 0, "orthogonal": True, "elementwise": True}


def _match(rule):
    if type(rule) is not NovoGrad or rule.schedule is not None:
        return None
    return dict(learning_rate=rule.lr, b1=rule.beta1, b2=rule.beta2, eps=rule.eps, eps_root=rule.eps_root,
                weight_decay=rule.weight_decay)


OPTAX = PeerMapping("optax.novograd", "optax", "novograd",
                    dict(b1=0.9, b2=0.25, eps=1e-6, eps_root=0.0, weight_decay=0.0),
                    lambda learning_rate, b1, b2, eps, eps_root, weight_decay: NovoGrad(
                        lr=learning_rate, beta1=b1, beta2=b2, eps=eps, eps_root=eps_root, weight_decay=weight_decay),
                    "novograd", required=("learning_rate",), refuse={"weight_decay": CONSTANT},
                    state={"m": "mu", "v": "nu"}, match=_match)

CONVENTIONS = Conventions(
    rules=(NovoGrad,),
    final="b1 m + g/(sqrt(v) + eps) + wd x with v = EMA of ||g||_F^2 per leaf: the norm's scope (leaf, not "
          "entry), v's first value, the momentum's (1 - b1), or where the decay enters",
    per_step="the first step's v_1 = ||g_1||^2",
    mappings=(OPTAX,),
    no_peer={"torch": "torch.optim ships no NovoGrad",
             "schedulefree": "schedulefree ships the Schedule-Free optimizers only"},
    presets=(
        OPTAX.preset("optax.novograd", dict(learning_rate=1e-2), "v per leaf; m = 0.9 m + g/(sqrt(v) + 1e-6)"),
        OPTAX.preset("optax.novograd(betas,eps,wd)", dict(learning_rate=1e-2, b1=0.8, b2=0.5, eps=1e-4,
                                                          eps_root=1e-8, weight_decay=1e-2),
                     "decay inside the momentum"),
    ),
    wrong=(Preset("WRONG scope: optax.novograd vs refopt Adam (per-entry moments)", "optax", "novograd",
                  ("novograd", dict(learning_rate=1e-2)), lambda: Adam(lr=1e-2, beta2=0.25, eps=1e-6),
                  "per-leaf ||g||^2 vs per-entry g^2", state={}, expect_fail=True),),
    oracle=NovoGradOracle,
    variants=variants,
    facts=facts,
    golden=(GoldenCase("novograd", lambda: NovoGrad(lr=1e-2), "optax.novograd(1e-2)", ("m", "v")),
            GoldenCase("novograd_wd", lambda: NovoGrad(lr=1e-2, beta1=0.8, beta2=0.5, eps=1e-4, eps_root=1e-8,
                                                       weight_decay=1e-2),
                       "NovoGrad betas (0.8, 0.5), eps 1e-4, eps_root 1e-8, decay 1e-2", ("m", "v"))),
    examples=(Example("novograd", lambda: NovoGrad(lr=0.01)),
              Example("novograd_wd", lambda: NovoGrad(lr=0.01, weight_decay=1e-3))),
)
