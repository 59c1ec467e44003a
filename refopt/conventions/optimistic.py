"""Optimistic gradient descent (refopt/rules/optimistic.py) to optax.optimistic_gradient_descent: u = (alpha +
beta) g - beta g_prev with g_prev := g at the first step; torch.optim ships none."""
from __future__ import annotations

import numpy as np

from refopt.conventions._spec import CONSTANT, Conventions, Example, Oracle, PeerMapping, Preset, gamma, scalar
from refopt.golden import GoldenCase
from refopt.rules.optimistic import OptimisticGradientDescent
from refopt.rules.sgd import SGD


class OptimisticOracle(Oracle):
    """The rule's docstring. Switch ``first`` 'copy' (g_0 := g_1, optax's) | 'zero' (g_0 = 0)."""

    def init_leaf(self, x, path):
        return {"prev": np.zeros_like(x)}

    def direction_leaf(self, t, s, x, g, path):
        r, d = self.rule, x.dtype
        prev = g if t == 1 and self.switches.get("first", "copy") == "copy" else s["prev"]
        s["prev"] = g.copy()
        return scalar(r.alpha + r.beta, d) * g - scalar(r.beta, d) * prev

    def step_leaf(self, t, s, x, g, path):
        lr = self.rule.lr * gamma(self.rule.schedule, t)
        return x - scalar(lr, x.dtype) * self.direction_leaf(t, s, x, g, path)


def variants(rule):
    from refopt.conventions._variants import oracle_variant as v
    return [v(rule, "g_0 = 0", "the first step (alpha + beta) g_1 in place of alpha g_1 (g_0 := g_1)", first="zero")]


def facts(rule, of):
    """u is linear in the gradients: degree 1 (homogeneous, not scale invariant), and linear maps commute with
    orthogonal and permutation transforms; per entry."""
    return {"homogeneous": True, "orthogonal": True, "elementwise": True}


def _match(rule):
    if type(rule) is not OptimisticGradientDescent or rule.schedule is not None:
        return None
    return dict(learning_rate=rule.lr, alpha=rule.alpha, beta=rule.beta)


OPTAX = PeerMapping("optax.optimistic_gradient_descent", "optax", "optimistic_gradient_descent",
                    dict(alpha=1.0, beta=1.0),
                    lambda learning_rate, alpha, beta: OptimisticGradientDescent(lr=learning_rate, alpha=alpha,
                                                                                 beta=beta),
                    "optimistic", required=("learning_rate",), refuse={"alpha": CONSTANT, "beta": CONSTANT},
                    state={"prev": "previous_gradient"}, match=_match)

CONVENTIONS = Conventions(
    rules=(OptimisticGradientDescent,),
    final="(alpha + beta) g - beta g_prev: the two weights, or the first step's g_prev",
    per_step="",
    mappings=(OPTAX,),
    no_peer={"torch": "torch.optim ships no optimistic method",
             "schedulefree": "schedulefree ships the Schedule-Free optimizers only"},
    presets=(
        OPTAX.preset("optax.optimistic_gradient_descent", dict(learning_rate=1e-2), "2 g - g_prev; g_prev := g at t = 1"),
        OPTAX.preset("optax.optimistic_gradient_descent(alpha,beta)", dict(learning_rate=1e-2, alpha=0.7, beta=0.4),
                     "1.1 g - 0.4 g_prev"),
    ),
    wrong=(Preset("WRONG optimism: optax.optimistic_gradient_descent vs refopt SGD", "optax",
                  "optimistic", ("optimistic_gradient_descent", dict(learning_rate=1e-2)), lambda: SGD(lr=1e-2),
                  "2 g - g_prev vs g: the extrapolation is missing", state={}, expect_fail=True),),
    oracle=OptimisticOracle,
    variants=variants,
    facts=facts,
    golden=(GoldenCase("optimistic_gd", lambda: OptimisticGradientDescent(lr=1e-2),
                       "optax.optimistic_gradient_descent(1e-2)", ("prev",)),
            GoldenCase("optimistic_gd_alpha_beta", lambda: OptimisticGradientDescent(lr=1e-2, alpha=0.7, beta=0.4),
                       "optimistic GD alpha 0.7, beta 0.4", ("prev",))),
    examples=(Example("optimistic_gd", lambda: OptimisticGradientDescent(lr=0.01)),
              Example("optimistic_gd_alpha_beta", lambda: OptimisticGradientDescent(lr=0.01, alpha=0.7, beta=0.4))),
)
