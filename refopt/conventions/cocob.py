"""COCOB (refopt/rules/cocob.py) to optax.contrib.cocob: COCOB-Backprop's per-entry bet from the params at init
x_1, the maximum scale L starting at eps (eps enters nowhere else), the floor alpha L of the denominator, the reward
clipped at 0, the learning rate multiplying the gradient (scale_by_learning_rate chained before the bet) and
weight decay as L2 on the gradient (add_decayed_weights chained first), the multiply-adds fused as XLA compiles
the jitted step. torch.optim ships no COCOB."""
from __future__ import annotations

import numpy as np

from refopt.conventions._spec import (
    NO_MASK, CliName, Conventions, Example, Oracle, PeerMapping, Preset, gamma, scalar)
from refopt.golden import GoldenCase
from refopt.rules.cocob import COCOB


class COCOBOracle(Oracle):
    """COCOB-Backprop from Algorithm 2 of the paper and the rule's docstring. Switches: ``scale`` 'max' (the
    running maximum L_t = max(L_{t-1}, |g_t|), the rule's) | 'current' (max(eps, |g_t|), this step's alone);
    ``eps_mode`` 'scale' (L_0 = eps, the rule's) | 'denominator' (the paper's L_0 = 0, eps added to
    L max(G + L, alpha L)); ``floor`` 'alpha' (max(G + L, alpha L), the rule's) | 'none' (G + L); ``reward``
    'clipped' (max(Reward, 0), the rule's) | 'unclipped'; ``lr_on`` 'grad' (lr_t multiplies the gradient, the
    rule's) | 'step' (lr_t multiplies the bet x_{t+1} - x_1, the gradient unscaled). Every product is rounded
    (numpy has no fused multiply-add): with the rule's ``fma=True`` the two differ by an ulp per multiply-add."""

    def init_leaf(self, x, path):
        L0 = 0.0 if self.switches.get("eps_mode", "scale") == "denominator" else self.rule.eps
        return {"x0": x.copy(), "theta": np.zeros_like(x), "scale": np.full_like(x, scalar(L0, x.dtype)),
                "abs_sum": np.zeros_like(x), "reward": np.zeros_like(x)}

    def step_leaf(self, t, s, x, g, path):
        r, d, sw = self.rule, x.dtype, self.switches
        if r.weight_decay != 0:
            g = g + scalar(r.weight_decay, d) * x
        lr = scalar(r.lr * gamma(r.schedule, t), d)
        on_step = sw.get("lr_on", "grad") == "step"
        if not on_step:
            g = lr * g
        ag = np.abs(g)
        if sw.get("scale", "max") == "current":
            s["scale"] = np.maximum(np.full_like(x, scalar(r.eps, d)), ag)
        else:
            s["scale"] = np.maximum(s["scale"], ag)
        s["abs_sum"] = s["abs_sum"] + ag
        reward = s["reward"] - g * (x - s["x0"])
        s["reward"] = reward if sw.get("reward", "clipped") == "unclipped" else np.maximum(reward, scalar(0.0, d))
        s["theta"] = s["theta"] - g
        L = s["scale"]
        m = s["abs_sum"] + L
        if sw.get("floor", "alpha") == "alpha":
            m = np.maximum(m, scalar(r.alpha, d) * L)
        den = L * m
        if sw.get("eps_mode", "scale") == "denominator":
            den = den + scalar(r.eps, d)
        bet = s["theta"] / den * (L + s["reward"])
        return s["x0"] + (lr * bet if on_step else bet)


def variants(rule):
    from refopt.conventions._variants import oracle_variant as v
    out = [v(rule, "no running maximum of |g|", "L_t = max(eps, |g_t|) of this step in place of the running "
             "maximum max(L_{t-1}, |g_t|)", scale="current"),
           v(rule, "eps in the denominator", "the paper's L_0 = 0 with eps added to L max(G + L, alpha L) in place "
             "of optax's L_0 = eps", eps_mode="denominator"),
           v(rule, "no alpha floor", "L (G + L) in place of L max(G + L, alpha L) (no warm-up floor)", floor="none"),
           v(rule, "reward not clipped at 0", "Reward_t = Reward_{t-1} - g_t (x_t - x_1) in place of its maximum "
             "with 0", reward="unclipped")]
    if rule.lr != 1 or rule.schedule is not None:
        out.append(v(rule, "lr on the step", "lr_t multiplies the bet x_{t+1} - x_1 in place of the gradient "
                     "(optax's scale_by_learning_rate chained before the bet)", lr_on="step"))
    return out


def facts(rule, of):
    """The bet theta / (L max(G + L, alpha L)) (L + Reward) has degree 0 in the gradient (theta, G, L and Reward
    all scale with it) as eps -> 0, without L2 decay (g + mu x does not scale with g); per entry."""
    return {"grad_scale": rule.weight_decay == 0, "step_scale_free": False, "elementwise": True}


def _match(rule):
    if type(rule) is not COCOB or rule.schedule is not None or not rule.fma:
        return None
    return dict(learning_rate=rule.lr, alpha=rule.alpha, eps=rule.eps, weight_decay=rule.weight_decay)


OPTAX = PeerMapping("optax.contrib.cocob", "optax", "contrib.cocob",
                    dict(learning_rate=1.0, alpha=100.0, eps=1e-8, weight_decay=0.0, mask=None),
                    lambda learning_rate, alpha, eps, weight_decay: COCOB(
                        lr=learning_rate, alpha=alpha, eps=eps, weight_decay=weight_decay),
                    "cocob",
                    refuse={"learning_rate": (lambda v: not callable(v),
                                              "pass a constant learning_rate and the schedule as COCOB's "
                                              "schedule= (refopt reads it at t = k + 1, optax at its count k)"),
                            "weight_decay": (lambda v: not callable(v), "refopt takes a constant weight_decay"),
                            "eps": (lambda v: not callable(v) and v > 0,
                                    "refopt's COCOB needs eps > 0 (with L_0 = 0 an entry whose gradients are 0 "
                                    "gives 0/0)"),
                            "mask": NO_MASK},
                    state={"x0": "init_particles", "theta": "cumulative_gradients", "scale": "scale",
                           "abs_sum": "subgradients", "reward": "reward"}, match=_match)

_KW = dict(learning_rate=0.5, alpha=50.0, eps=1e-6, weight_decay=0.01)

CONVENTIONS = Conventions(
    rules=(COCOB,),
    final="x = x_1 + theta / (L max(G + L, alpha L)) (L + Reward): the anchor x_1, the running maximum L, the "
          "alpha floor, where eps enters, or the reward's clip at 0",
    per_step="lr_t, multiplying the gradient before the bet",
    mappings=(OPTAX,),
    no_peer={"torch": "torch.optim ships no COCOB",
             "schedulefree": "schedulefree ships the Schedule-Free optimizers only"},
    presets=(
        OPTAX.preset("optax.contrib.cocob", dict(learning_rate=1.0), "L_0 = eps = 1e-8; x = x_1 + theta / "
                     "(L max(G + L, 100 L)) (L + Reward)"),
        OPTAX.preset("optax.contrib.cocob(alpha,eps,wd)", _KW, "alpha 50, L_0 = eps = 1e-6; lr 0.5 and L2 decay "
                     "0.01 on g before the bet"),
    ),
    wrong=(Preset("WRONG decay: optax.contrib.cocob(weight_decay=0.1) vs refopt COCOB without decay", "optax",
                  "cocob", ("contrib.cocob", dict(learning_rate=1.0, weight_decay=0.1)),
                  lambda: COCOB(),
                  "optax's L2 decay 0.1 enters theta, G, L and Reward; the rule without it bets on g alone",
                  state={"theta": "cumulative_gradients", "reward": "reward"}, expect_fail=True),),
    oracle=COCOBOracle,
    variants=variants,
    facts=facts,
    golden=(GoldenCase("cocob", lambda: COCOB(), "optax.contrib.cocob's defaults",
                       ("theta", "scale", "abs_sum", "reward")),
            GoldenCase("cocob_wd", lambda: COCOB(lr=0.5, alpha=50.0, eps=1e-6, weight_decay=0.01),
                       "COCOB alpha 50, eps 1e-6, lr 0.5, L2 decay 0.01", ("theta", "scale", "abs_sum", "reward"))),
    examples=(Example("cocob", lambda: COCOB()),
              Example("cocob_wd", lambda: COCOB(lr=0.5, alpha=20.0, eps=1e-6, weight_decay=1e-3))),
    cli=(CliName("cocob", COCOB, {"mlp": 1.0, "gpt": 1.0}, "COCOB-Backprop (optax.contrib semantics; --lr "
                 "multiplies the gradient): --eps (the initial scale L_0), --weight-decay (L2)",
                 {"eps": "eps", "weight_decay": "weight_decay"}),),
)
