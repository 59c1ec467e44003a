"""Optimistic gradient descent and Optimistic Adam (refopt/rules/optimistic.py) to optax.optimistic_gradient_descent
and optax.optimistic_adam: u = (alpha + beta) d - beta d_prev of the gradient (or Adam's direction) d, with
d_prev := d at the first step; torch.optim ships neither."""
from __future__ import annotations

import numpy as np

from refopt.conventions._spec import CONSTANT, Conventions, Example, Oracle, PeerMapping, Preset, counted, gamma, \
    scalar
from refopt.golden import GoldenCase
from refopt.rules.adam import Adam
from refopt.rules.optimistic import OptimisticAdam, OptimisticGradientDescent
from refopt.rules.sgd import SGD


class OptimisticOracle(Oracle):
    """The rule's docstring. Switch ``first`` 'copy' (g_0 := g_1, optax's) | 'zero' (g_0 = 0)."""

    def init_leaf(self, x, path):
        if isinstance(self.rule, OptimisticAdam):
            return {"m": np.zeros_like(x), "v": np.zeros_like(x), "prev": np.zeros_like(x)}
        return {"prev": np.zeros_like(x)}

    def _adam(self, t, s, g):
        """Adam's direction in optax's form (scale_by_adam, Nesterov by default); ``counter`` switches."""
        r, d, c = self.rule, g.dtype, self.switches.get("counter", {})
        s["m"] = scalar(r.beta1, d) * s["m"] + scalar(1 - r.beta1, d) * g
        s["v"] = scalar(r.beta2, d) * s["v"] + scalar(1 - r.beta2, d) * (g * g)
        t1, t2 = counted(t, c.get("bc1")), counted(t, c.get("bc2"))
        if r.nesterov:
            mh = scalar(r.beta1, d) * (s["m"] / scalar(1 - r.beta1 ** (t1 + 1), d)) + \
                scalar(1 - r.beta1, d) * (g / scalar(1 - r.beta1 ** t1, d))
        else:
            mh = s["m"] / scalar(1 - r.beta1 ** t1, d)
        return mh / (np.sqrt(s["v"] / scalar(1 - r.beta2 ** t2, d) + scalar(r.eps_root, d)) + scalar(r.eps, d))

    def direction_leaf(self, t, s, x, g, path):
        r, d = self.rule, x.dtype
        prev = g if t == 1 and self.switches.get("first", "copy") == "copy" else s["prev"]
        s["prev"] = g.copy()
        return scalar(r.alpha + r.beta, d) * g - scalar(r.beta, d) * prev

    def step_leaf(self, t, s, x, g, path):
        lr = self.rule.lr * gamma(self.rule.schedule, t)
        if isinstance(self.rule, OptimisticAdam):
            u = self._adam(t, s, g)
            prev = u if t == 1 and self.switches.get("first", "copy") == "copy" else s["prev"]
            s["prev"] = u.copy()
            beta = lr if self.rule.optimism is None else self.rule.optimism
            return x - (scalar(lr + beta, x.dtype) * u - scalar(beta, x.dtype) * prev)
        return x - scalar(lr, x.dtype) * self.direction_leaf(t, s, x, g, path)


def variants(rule):
    from refopt.conventions._variants import oracle_variant as v
    return [v(rule, "g_0 = 0", "the first step (alpha + beta) g_1 in place of alpha g_1 (g_0 := g_1)", first="zero")]


def facts(rule, of):
    """u is linear in the gradients: degree 1 (homogeneous, not scale invariant), and linear maps commute with
    orthogonal and permutation transforms; per entry. Optimistic Adam extrapolates Adam's direction, which has
    degree 0 in g (eps -> 0) and is taken per entry."""
    if isinstance(rule, OptimisticAdam):
        return {"grad_scale": True, "elementwise": True}
    return {"homogeneous": True, "orthogonal": True, "elementwise": True}


def _adam_match(rule):
    if type(rule) is not OptimisticAdam or rule.schedule is not None:
        return None
    return dict(learning_rate=rule.lr, optimism=rule.optimism, b1=rule.beta1, b2=rule.beta2, eps=rule.eps,
                eps_root=rule.eps_root, nesterov=rule.nesterov)


OPTAX_ADAM = PeerMapping("optax.optimistic_adam", "optax", "optimistic_adam",
                         dict(optimism=None, b1=0.9, b2=0.999, eps=1e-8, eps_root=0.0, mu_dtype=None, nesterov=True),
                         lambda learning_rate, optimism, b1, b2, eps, eps_root, nesterov: OptimisticAdam(
                             lr=learning_rate, optimism=optimism, beta1=b1, beta2=b2, eps=eps, eps_root=eps_root,
                             nesterov=nesterov),
                         "optimistic_adam", required=("learning_rate",),
                         refuse={"learning_rate": CONSTANT, "optimism": CONSTANT,
                                 "mu_dtype": (lambda v: v is None, "refopt keeps the moments in the params' dtype")},
                         state={"m": "mu", "v": "nu", "prev": "previous_gradient"}, match=_adam_match)


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
    rules=(OptimisticGradientDescent, OptimisticAdam),
    final="(alpha + beta) d - beta d_prev of the gradient or Adam's direction d: the two weights, or the first "
          "step's d_prev",
    per_step="",
    mappings=(OPTAX, OPTAX_ADAM),
    no_peer={"torch": "torch.optim ships no optimistic method",
             "schedulefree": "schedulefree ships the Schedule-Free optimizers only"},
    presets=(
        OPTAX.preset("optax.optimistic_gradient_descent", dict(learning_rate=1e-2), "2 g - g_prev; g_prev := g at t = 1"),
        OPTAX.preset("optax.optimistic_gradient_descent(alpha,beta)", dict(learning_rate=1e-2, alpha=0.7, beta=0.4),
                     "1.1 g - 0.4 g_prev"),
        OPTAX_ADAM.preset("optax.optimistic_adam", dict(learning_rate=1e-2),
                          "(lr + lr) u - lr u_prev of Adam's Nesterov direction; u_prev := u at t = 1"),
        OPTAX_ADAM.preset("optax.optimistic_adam(optimism,betas,eps,eps_root,nesterov=False)",
                          dict(learning_rate=1e-2, optimism=5e-3, b1=0.8, b2=0.95, eps=1e-6, eps_root=1e-10,
                               nesterov=False), "0.015 u - 0.005 u_prev; m_hat = m/(1 - b1^t)"),
    ),
    wrong=(Preset("WRONG optimism: optax.optimistic_gradient_descent vs refopt SGD", "optax",
                  "optimistic", ("optimistic_gradient_descent", dict(learning_rate=1e-2)), lambda: SGD(lr=1e-2),
                  "2 g - g_prev vs g: the extrapolation is missing", state={}, expect_fail=True),
           Preset("WRONG optimism: optax.optimistic_adam vs refopt Adam(nesterov=True)", "optax", "optimistic_adam",
                  ("optimistic_adam", dict(learning_rate=1e-2)), lambda: Adam(lr=1e-2, nesterov=True),
                  "lr u vs 2 lr u - lr u_prev: the extrapolation is missing", state={"m": "mu", "v": "nu"},
                  expect_fail=True)),
    oracle=OptimisticOracle,
    variants=variants,
    facts=facts,
    golden=(GoldenCase("optimistic_gd", lambda: OptimisticGradientDescent(lr=1e-2),
                       "optax.optimistic_gradient_descent(1e-2)", ("prev",)),
            GoldenCase("optimistic_gd_alpha_beta", lambda: OptimisticGradientDescent(lr=1e-2, alpha=0.7, beta=0.4),
                       "optimistic GD alpha 0.7, beta 0.4", ("prev",)),
            GoldenCase("optimistic_adam", lambda: OptimisticAdam(lr=1e-2, optimism=5e-3, beta1=0.8, beta2=0.95,
                                                                 eps=1e-6, eps_root=1e-10, nesterov=False),
                       "optax.optimistic_adam(1e-2, optimism=5e-3, b1=0.8, b2=0.95, eps=1e-6, eps_root=1e-10, "
                       "nesterov=False)", ("m", "v", "prev"))),
    examples=(Example("optimistic_gd", lambda: OptimisticGradientDescent(lr=0.01)),
              Example("optimistic_gd_alpha_beta", lambda: OptimisticGradientDescent(lr=0.01, alpha=0.7, beta=0.4)),
              Example("optimistic_adam", lambda: OptimisticAdam(lr=0.01))),
)
