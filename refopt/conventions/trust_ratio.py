"""LARS, LAMB and Fromage (refopt/rules/trust_ratio.py) to optax.lars, optax.lamb and optax.fromage: the
direction, its trust ratio ||x||/||u|| (1 at a zero norm), for LARS the momentum of the ratio-scaled steps,
for Fromage the shrink 1/sqrt(1 + lr^2). torch.optim 2.13 ships none of them. refopt's Covariant (post 000, eq. elr-u) is the same ratio around a base direction: its rows for
optax.lamb/lars and the atlas entries ``trust-ratio-zero-norm`` and ``lars-momentum-order`` say where the two
agree."""
from __future__ import annotations

import numpy as np

from refopt.conventions._spec import CONSTANT, CliName, Conventions, Example, Oracle, PeerMapping, Preset, counted, gamma, \
    norm64, scalar
from refopt.golden import GoldenCase
from refopt.rules.covariant import Covariant
from refopt.rules.sgd import SGD
from refopt.rules.trust_ratio import LAMB, LARS, Fromage


class TrustRatioOracle(Oracle):
    """LARS and LAMB from the rules' docstrings, norms in float64. Switches: ``zero`` 'one' (ratio 1 at a zero
    norm, optax's) | 'none' (no step there, Covariant's); LARS: ``ratio`` 'optax' (eta ||x||/(||g + wd x|| +
    eps)) | 'paper' (eta ||x||/(||g|| + wd ||x||)), ``order`` 'ratio_first' (momentum of the ratio-scaled
    steps) | 'momentum_first' (the ratio of the momentum, as Covariant(SGD(momentum))) | 'momentum_first_ratio_of_u'
    (the momentum of g + wd x scaled by the ratio of g + wd x); LAMB: ``decay``
    'before_ratio' | 'after_ratio' (wd x added after the ratio, AdamW-like) | 'ratio_without_decay' (the ratio
    of the Adam direction alone applied to u_adam + wd x), ``counter`` {'bc1' | 'bc2': ...}."""

    def init_leaf(self, x, path):
        if isinstance(self.rule, Fromage):
            return {}
        if isinstance(self.rule, LARS):
            return {"b": np.zeros_like(x)}
        return {"m": np.zeros_like(x), "v": np.zeros_like(x)}

    def _ratio(self, x, u, coef=1.0, eps=0.0, den=None):
        nx, nu = norm64(x), norm64(u)
        if nx == 0.0 or nu == 0.0:
            return None if self.switches.get("zero", "one") == "none" else 1.0
        return coef * nx / ((nu if den is None else den) + eps)

    def step_leaf(self, t, s, x, g, path):
        r, d, sw = self.rule, x.dtype, self.switches
        lr = r.lr * gamma(r.schedule, t)
        if isinstance(r, Fromage):
            n0 = r.min_norm
            nx, ng = max(norm64(x), n0), max(norm64(g), n0)
            a = 1.0 if nx == 0 or ng == 0 else nx / ng
            if sw.get("zero", "one") == "none" and (nx == 0 or ng == 0):
                a = 0.0
            shrink = 1.0 if sw.get("fromage") == "no_shrink" else 1.0 / np.sqrt(1.0 + lr * lr)
            return scalar(shrink, d) * (x - scalar(lr * a, d) * g)
        if isinstance(r, LARS):
            u = g + scalar(r.weight_decay, d) * x
            den = norm64(g) + r.weight_decay * norm64(x) if sw.get("ratio") == "paper" else None
            mu = scalar(r.momentum, d)
            if sw.get("order") in ("momentum_first", "momentum_first_ratio_of_u"):
                s["b"] = mu * s["b"] + u
                a = (self._ratio(x, s["b"], r.trust_coefficient, r.eps) if sw["order"] == "momentum_first"
                     else self._ratio(x, u, r.trust_coefficient, r.eps, den))
                return x if a is None else x - scalar(lr * a, d) * s["b"]
            a = self._ratio(x, u, r.trust_coefficient, r.eps, den)
            step = scalar(lr * (0.0 if a is None else a), d) * u
            s["b"] = mu * s["b"] + step
            return x - (step + mu * s["b"] if r.nesterov else s["b"])
        s["m"] = scalar(r.beta1, d) * s["m"] + scalar(1 - r.beta1, d) * g
        s["v"] = scalar(r.beta2, d) * s["v"] + scalar(1 - r.beta2, d) * (g * g)
        c = sw.get("counter", {})
        bc1, bc2 = 1 - r.beta1 ** counted(t, c.get("bc1")), 1 - r.beta2 ** counted(t, c.get("bc2"))
        u = (s["m"] / scalar(bc1, d)) / (np.sqrt(s["v"] / scalar(bc2, d) + scalar(r.eps_root, d)) + scalar(r.eps, d))
        if sw.get("decay") == "after_ratio":
            a = self._ratio(x, u)
            return x - scalar(lr * (0.0 if a is None else a), d) * u - scalar(lr * r.weight_decay, d) * x
        a = self._ratio(x, u) if sw.get("decay") == "ratio_without_decay" else None
        u = u + scalar(r.weight_decay, d) * x
        if sw.get("decay") != "ratio_without_decay":
            a = self._ratio(x, u)
        return x if a is None else x - scalar(lr * a, d) * u


def variants(rule):
    from refopt.conventions._variants import oracle_variant as v
    out = [v(rule, "no step at a zero norm", "ratio 0 (Covariant's, PITFALLS B11) where optax's is 1 when ||x|| "
             "or ||u|| is 0", zero="none")]
    if isinstance(rule, Fromage):
        out.append(v(rule, "no 1/sqrt(1 + lr^2)", "x - lr r g without the shrink that keeps ||x|| from growing",
                     fromage="no_shrink"))
    elif isinstance(rule, LARS):
        out += [v(rule, "the paper's ratio", "eta ||x|| / (||g|| + wd ||x||) (You et al. 2017) in place of "
                  "eta ||x|| / (||g + wd x|| + eps)", ratio="paper"),
                v(rule, "the ratio of the momentum", "b = mu b + u, x -= lr r(b) b (Covariant(SGD(momentum))) in "
                  "place of the momentum of the ratio-scaled steps", order="momentum_first"),
                v(rule, "the momentum of the raw update", "b = mu b + u, x -= lr r(u) b (the ratio of this step's "
                  "update g + wd x scaling the buffer) in place of the momentum of the ratio-scaled steps",
                  order="momentum_first_ratio_of_u")]
    else:
        out.extend((v(rule, "decay after the ratio", "x -= lr (r u_adam + wd x) (AdamW-like) in place of the "
                     "ratio of u_adam + wd x", decay="after_ratio"),
                    v(rule, "the ratio of the Adam direction alone", "r = ||x||/||u_adam|| (taken before wd x is "
                      "added) applied to u_adam + wd x, in place of the ratio of u_adam + wd x",
                      decay="ratio_without_decay")))
    return out


def facts(rule, of):
    """u/||u|| (Frobenius, permutation and orthogonally invariant) removes the scale of a direction that is
    homogeneous in g: LARS without decay or eps (u = g, linear; its L2 term wd x does not scale with g);
    LAMB's Adam direction has degree 0 in g (eps -> 0), taken per entry, and its wd x involves no g. The step
    is ||x|| times a g-scale-free direction: covariant (post 000, eq. phi) when the decay is 0 (wd x does
    not scale with x the way the ratio does)."""
    if isinstance(rule, Fromage):
        free = rule.min_norm == 0        # the floor breaks both scalings below it
        return {"grad_scale": free, "orthogonal": True, "elementwise": True, "covariant": free}
    if isinstance(rule, LARS):
        free = rule.weight_decay == 0 and rule.eps == 0
        return {"grad_scale": free, "orthogonal": True, "elementwise": True, "covariant": free,
                "exact_scale_free": free}
    return {"grad_scale": True, "elementwise": True, "covariant": rule.weight_decay == 0}


def _lars_match(rule):
    if type(rule) is not LARS or rule.schedule is not None:
        return None
    return dict(learning_rate=rule.lr, weight_decay=rule.weight_decay, trust_coefficient=rule.trust_coefficient,
                eps=rule.eps, momentum=rule.momentum, nesterov=rule.nesterov)


def _lamb_match(rule):
    if type(rule) is not LAMB or rule.schedule is not None:
        return None
    return dict(learning_rate=rule.lr, b1=rule.beta1, b2=rule.beta2, eps=rule.eps, eps_root=rule.eps_root,
                weight_decay=rule.weight_decay)


def _fromage_match(rule):
    if type(rule) is not Fromage or rule.schedule is not None:
        return None
    return dict(learning_rate=rule.lr, min_norm=rule.min_norm)


FROMAGE_OPTAX = PeerMapping("optax.fromage", "optax", "fromage", dict(min_norm=1e-6),
                            lambda learning_rate, min_norm: Fromage(lr=learning_rate, min_norm=min_norm), "fromage",
                            required=("learning_rate",), refuse={"learning_rate": CONSTANT}, match=_fromage_match)

_MASK = (lambda v: v is True, "give the excluded arrays their own rule with refopt.Partition (e.g. "
         "LARS(weight_decay=0) or SGD(momentum=...))")
LARS_OPTAX = PeerMapping("optax.lars", "optax", "lars",
                         dict(weight_decay=0.0, trust_coefficient=1e-3, eps=0.0, momentum=0.9, nesterov=False,
                              weight_decay_mask=True, trust_ratio_mask=True),
                         lambda learning_rate, weight_decay, trust_coefficient, eps, momentum, nesterov: LARS(
                             lr=learning_rate, momentum=momentum, weight_decay=weight_decay,
                             trust_coefficient=trust_coefficient, eps=eps, nesterov=nesterov),
                         "lars", required=("learning_rate",),
                         refuse={"weight_decay_mask": _MASK, "trust_ratio_mask": _MASK, "learning_rate": CONSTANT,
                                 "weight_decay": CONSTANT},
                         match=_lars_match)
LAMB_OPTAX = PeerMapping("optax.lamb", "optax", "lamb",
                         dict(b1=0.9, b2=0.999, eps=1e-6, eps_root=0.0, weight_decay=0.0, mask=None),
                         lambda learning_rate, b1, b2, eps, eps_root, weight_decay: LAMB(
                             lr=learning_rate, beta1=b1, beta2=b2, eps=eps, eps_root=eps_root,
                             weight_decay=weight_decay),
                         "lamb", required=("learning_rate",),
                         refuse={"mask": (lambda v: v is None, "give the undecayed arrays LAMB(weight_decay=0) "
                                          "with refopt.Partition"), "learning_rate": CONSTANT,
                                 "weight_decay": CONSTANT},
                         state={"m": "mu", "v": "nu"}, match=_lamb_match)


# ---- the divergence-atlas entry about the rule (refopt/crosscheck/divergences.py runs it) --------------
def atlas_lars_momentum():
    from refopt.crosscheck.atlas import Entry, Pair, _p, peer_side, restated_side

    kw = dict(learning_rate=1e-2, momentum=0.9, trust_coefficient=1.0)
    lars = _p("optax.lars(momentum=0.9)", "optax", "lars", kw, lambda: LARS_OPTAX.rule(**kw))
    cov = lambda: Covariant(SGD(momentum=0.9), lr=1e-2)
    return Entry(
        "lars-momentum-order", "LARS with momentum: optax (and the paper) take the momentum of the ratio-scaled "
        "steps; refopt's Covariant(SGD(momentum)) scales the momentum direction by its own ratio",
        (peer_side("optax.lars", lars, refopt="LARS(lr=0.01, momentum=0.9, trust_coefficient=1.0)",
                   source="You et al. 2017, Algorithm 1: v = m v + lr lambda (g + beta w)"),
         restated_side("Covariant(SGD(momentum=0.9))", "the ELR form (post 000, eq. elr-u) of SGD's momentum "
                       "direction: ||x_t - x_{t-1}|| = lr ||x_{t-1}|| every step", cov, source="post 000")),
        (Pair("optax.lars", "Covariant(SGD(momentum=0.9))", "final", 1e-2, what="params after 50 steps, lr 0.01"),
         Pair("optax.lars", "Covariant(SGD(momentum=0.9))", "step", 0.1,
              what="per-step update (median over steps)")),
        "the LARS paper (You et al. 2017, Algorithm 1) accumulates the ratio-scaled steps (optax, refopt's LARS); "
        "Covariant's step has relative size lr exactly every step (post 000), which the momentum of scaled steps "
        "does not: with momentum mu the relative step grows towards lr/(1 - mu) on a steady gradient.",
        "You et al. 2017 Algorithm 1; post 000 eq. (elr-u); optax.lars")


CONVENTIONS = Conventions(
    rules=(LARS, LAMB, Fromage),
    final="the trust ratio ||x||/(||u|| + eps) of the direction (its zero-norm case, its denominator), the "
          "decay's place (before the ratio), or, for LARS, the momentum of the ratio-scaled steps",
    per_step="the trust ratio ||x||/||u|| (LAMB: and the bias corrections 1 - beta1^t, 1 - beta2^t)",
    counters=lambda rule: (() if not isinstance(rule, LAMB) else
                           (("bc1", "the bias correction of m (1 - beta1^t)"),
                            ("bc2", "the bias correction of v (1 - beta2^t)"))),
    mappings=(LARS_OPTAX, LAMB_OPTAX, FROMAGE_OPTAX),
    no_peer={"torch": "torch.optim 2.13 has no LAMB, LARS or Fromage", "schedulefree": "schedulefree has no trust ratio"},
    presets=(
        LARS_OPTAX.preset("optax.lars", dict(learning_rate=1e-2),
                          "u = g, r = 1e-3 ||x||/||u|| (1 at a zero norm), trace b = 0.9 b + lr r u"),
        LARS_OPTAX.preset("optax.lars(wd,tc,eps,momentum,nesterov)",
                          dict(learning_rate=0.1, weight_decay=1e-2, trust_coefficient=0.02, eps=1e-3, momentum=0.8,
                               nesterov=True), "L2 before the ratio; eps in its denominator; Nesterov trace"),
        LAMB_OPTAX.preset("optax.lamb", dict(learning_rate=1e-2),
                          "scale_by_adam (eps 1e-6) then the ratio ||x||/||u|| (1 at a zero norm) then -lr"),
        FROMAGE_OPTAX.preset("optax.fromage", dict(learning_rate=1e-2),
                             "x (1/sqrt(1 + lr^2)) - lr (||x||/||g||) g, norms floored at 1e-6"),
        FROMAGE_OPTAX.preset("optax.fromage(lr=0.3,min_norm)", dict(learning_rate=0.3, min_norm=0.5),
                             "a large lr (the shrink 1/sqrt(1.09)); min_norm 0.5 floors the small leaves' norms"),
        LAMB_OPTAX.preset("optax.lamb(betas,eps,eps_root,wd)", dict(learning_rate=1e-2, b1=0.8, b2=0.95, eps=1e-4,
                                                                    eps_root=1e-8, weight_decay=0.05),
                          "the decay added to Adam's direction before the ratio"),
    ),
    wrong=(Preset("WRONG decay: optax.lamb(weight_decay=0.1) vs refopt LAMB(weight_decay=0)", "optax", "lamb",
                  ("lamb", dict(learning_rate=1e-2, weight_decay=0.1)),
                  lambda: LAMB(lr=1e-2, weight_decay=0.0), "the decay left out of the ratio's direction",
                  state={"m": "mu", "v": "nu"}, expect_fail=True),
           Preset("WRONG shrink: optax.fromage vs refopt LARS(momentum=0, trust_coefficient=1)", "optax", "fromage",
                  ("fromage", dict(learning_rate=0.3)), lambda: LARS(lr=0.3, momentum=0.0, trust_coefficient=1.0),
                  "the ratio-scaled step without Fromage's 1/sqrt(1 + lr^2)", expect_fail=True),
           Preset("WRONG momentum: optax.lars(momentum=0.9) vs refopt LARS(momentum=0)", "optax", "lars",
                  ("lars", dict(learning_rate=1e-2, momentum=0.9)), lambda: LARS(lr=1e-2, momentum=0.0),
                  "no momentum", expect_fail=True)),
    oracle=TrustRatioOracle,
    variants=variants,
    facts=facts,
    golden=(GoldenCase("lars", lambda: LARS(lr=0.1, weight_decay=1e-2, trust_coefficient=0.02, eps=1e-3,
                                            momentum=0.8, nesterov=True),
                       "optax.lars(0.1, weight_decay=1e-2, trust_coefficient=0.02, eps=1e-3, momentum=0.8, "
                       "nesterov=True)", ("b",)),
            GoldenCase("lamb_wd", lambda: LAMB(lr=1e-2, beta1=0.8, beta2=0.95, eps=1e-4, eps_root=1e-8,
                                               weight_decay=0.05),
                       "optax.lamb(1e-2, b1=0.8, b2=0.95, eps=1e-4, eps_root=1e-8, weight_decay=0.05)",
                       ("m", "v")),
            GoldenCase("fromage", lambda: Fromage(lr=0.3, min_norm=0.5), "optax.fromage(0.3, min_norm=0.5)", ())),
    examples=(Example("fromage", lambda: Fromage(lr=0.05)),
              Example("lars", lambda: LARS(lr=0.1, trust_coefficient=0.01)),
              Example("lars_nesterov", lambda: LARS(lr=0.1, weight_decay=1e-3, trust_coefficient=0.01,
                                                    nesterov=True)),
              Example("lamb", lambda: LAMB(lr=0.01)),
              Example("lamb_wd", lambda: LAMB(lr=0.01, weight_decay=0.01))),
    atlas=(atlas_lars_momentum,),
    cli=(CliName("lamb", LAMB, {"mlp": 1e-2, "gpt": 1e-2}, "LAMB (optax semantics): Adam's direction + wd x scaled "
                 "by the trust ratio ||x||/||u||: --beta1, --beta2, --eps, --weight-decay",
                 {"beta1": "beta1", "beta2": "beta2", "eps": "eps", "weight_decay": "weight_decay"}),),
)
