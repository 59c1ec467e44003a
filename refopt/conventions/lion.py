"""Lion (refopt/rules/lion.py) to optax.lion: sign((1-b1) g + b1 m), then m <- (1-b2) g + b2 m; decoupled
lr-coupled decay, optax's default weight_decay 1e-3 (refopt's 0) (CONVENTIONS.md 9, 10.5)."""
from __future__ import annotations

import numpy as np

from refopt.conventions._spec import NO_MASK, CliName, Conventions, Example, Oracle, PeerMapping, gamma, scalar
from refopt.golden import GoldenCase
from refopt.rules.lion import Lion


class LionOracle(Oracle):
    """Lion from its equations (arXiv:2302.06675, Alg. 2; refopt.Lion's docstring). Switches: ``order``
    'interpolate' (the sign of (1-b1) g + b1 m_{t-1}) | 'momentum_first' (m_t first, then the sign of m_t);
    ``weight_decay`` overriding the rule's."""

    def __init__(self, rule, name=None, **sw):
        super().__init__(rule, name, **sw)
        self.wd, self.order = sw.get("weight_decay", rule.weight_decay), sw.get("order", "interpolate")

    def init_leaf(self, x, path):
        return {"m": np.zeros_like(x)}

    def direction_leaf(self, t, s, x, g, path):
        d, r = x.dtype, self.rule
        m_new = scalar(1.0 - r.beta2, d) * g + scalar(r.beta2, d) * s["m"]
        if self.order == "momentum_first":
            u = np.sign(m_new)
        else:
            u = np.sign(scalar(1.0 - r.beta1, d) * g + scalar(r.beta1, d) * s["m"])
        s["m"] = m_new
        return u

    def step_leaf(self, t, s, x, g, path):
        lr = self.rule.lr * gamma(self.rule.schedule, t)
        u = self.direction_leaf(t, s, x, g, path)
        return scalar(1.0 - lr * self.wd, x.dtype) * x - scalar(lr, x.dtype) * u


def variants(rule):
    from refopt.conventions._variants import oracle_variant as v

    out = [v(rule, "sign of the updated momentum", "u = sign(m_t) with m_t = b2 m + (1 - b2) g (the momentum "
             "updated before the sign: Lion's interpolation b1 missing)", order="momentum_first")]
    if rule.weight_decay != 1e-3:
        out.append(v(rule, "optax lion default decay 1e-3", "optax.lion's default weight_decay 1e-3, not given",
                     weight_decay=1e-3))
    if rule.weight_decay > 0:
        out.append(v(rule, "no weight decay", "the decay is missing", weight_decay=0.0))
    return out


def facts(rule, of):
    """sign(b1 c m + (1-b1) c g) = sign(b1 m + (1-b1) g) for c > 0 (decay acts on x only); with b1 = 0 a
    step sees only sign(g_t); sign is taken per entry."""
    return {"grad_scale": True, "step_scale_free": rule.beta1 == 0, "elementwise": True}


def _optax_match(rule):
    if rule.schedule is not None:
        return None
    return dict(learning_rate=rule.lr, b1=rule.beta1, b2=rule.beta2, weight_decay=rule.weight_decay)


OPTAX = PeerMapping("optax.lion", "optax", "lion", dict(b1=0.9, b2=0.99, mu_dtype=None, weight_decay=1e-3, mask=None),
                    lambda learning_rate, b1, b2, weight_decay: Lion(lr=learning_rate, beta1=b1, beta2=b2,
                                                                     weight_decay=weight_decay),
                    "lion", required=("learning_rate",),
                    refuse={"mu_dtype": (lambda v: v is None, "refopt keeps m in the params' dtype"), "mask": NO_MASK},
                    state={"m": "mu"}, match=_optax_match)


# ---- the divergence-atlas entries about the rule (refopt/crosscheck/divergences.py runs them) ----------
def atlas_lion_default():
    from refopt.crosscheck.atlas import Entry, Pair, _p, _preset, _rules, peer_side, restated_side

    R = _rules()
    ol = _p("optax.lion", "optax", "lion", dict(learning_rate=1e-2), lambda: R.Lion(lr=1e-2, weight_decay=1e-3))
    rl = restated_side("Lion paper / refopt default", "Lion(lr=0.01) with the paper's default weight decay 0 "
                       "(lucidrains/lion-pytorch, Google's reference)", lambda: R.Lion(lr=1e-2),
                       source="Chen et al. 2023")
    return Entry(
        "lion-default-decay", "Defaults: optax.lion decays the weights by default (1e-3), refopt's Lion and the "
        "paper's reference code do not; optax.adamw's default decay is 1e-4, torch AdamW's 1e-2",
        (peer_side("optax.lion", ol, source="optax default weight_decay=1e-3"), rl,
         peer_side("optax.adamw", _preset("optax.adamw"), source="optax default weight_decay=1e-4"),
         peer_side("torch.AdamW", _preset("torch.AdamW"), source="torch default weight_decay=1e-2")),
        (Pair("optax.lion", "Lion paper / refopt default", "final", 1e-6, what="params after 50 steps"),
         Pair("optax.adamw", "torch.AdamW", "final", 1e-6, what="both at their default decay")),
        "defaults, not equations: porting a config without its weight_decay changes the run. Chen et al. (2023) "
        "recommend a decay 3-10x larger than AdamW's for Lion, but ship none by default.",
        "CONVENTIONS.md 9, 10.5; Chen et al. 2023 (arXiv:2302.06675)")


CONVENTIONS = Conventions(
    rules=(Lion,),
    final="sign(beta1 m + (1 - beta1) g): the interpolation (which coefficient, m before or after its update) or the decay",
    per_step="",
    mappings=(OPTAX,),
    no_peer={"torch": "torch.optim 2.13 has no Lion", "schedulefree": "schedulefree ships the Schedule-Free "
                                                                        "optimizers only"},
    presets=(OPTAX.preset("optax.lion", dict(learning_rate=1e-2), "sign((1-b1) g + b1 m), then m = (1-b2) g + b2 m; "
                          "optax's default weight_decay 1e-3 (refopt's Lion defaults to 0), decoupled and lr-coupled"),),
    oracle=LionOracle,
    variants=variants,
    facts=facts,
    golden=(GoldenCase("lion", lambda: Lion(lr=1e-2, weight_decay=1e-3), "Lion, optax.lion's defaults", ("m",)),),
    examples=(Example("lion", lambda: Lion(lr=0.01, weight_decay=0.1), converges=False,
                      note="constant lr: every sign step has size lr, so Lion orbits the minimum at distance ~lr"),),
    atlas=(atlas_lion_default,),
    cli=(CliName("lion", Lion, {"mlp": 3e-4, "gpt": 3e-4}, "Lion (sign of an interpolated momentum): --beta1, "
                 "--beta2, --weight-decay (decoupled)", {"beta1": "beta1", "beta2": "beta2"}),),
)
