"""Covariant (refopt/rules/covariant.py, post 000 eq. (elr-u)) against optax.lamb(weight_decay=0)
(Covariant(Adam)) and optax.lars(momentum=0, trust_coefficient=1) (Covariant(SGD)), which refopt's LAMB and
LARS reproduce exactly (refopt/conventions/trust_ratio.py); known gap: optax's trust ratio is 1 at a zero
norm where Covariant makes no step (PITFALLS B11)."""
from __future__ import annotations

import numpy as np

from refopt.conventions._spec import Conventions, Example, Oracle, Preset, gamma, norm64, scalar
from refopt.golden import GoldenCase
from refopt.rules.adam import Adam
from refopt.rules.covariant import Covariant
from refopt.rules.muon import Muon
from refopt.rules.sgd import SGD
from refopt.conventions.trust_ratio import LAMB_OPTAX, LARS_OPTAX


def _norm(rule, a) -> float:
    if rule.norm == "fro":
        return norm64(a)
    if rule.norm == "rms":
        return norm64(a) / np.sqrt(a.size) if a.size else 0.0
    return float(rule.norm(a))


class CovariantOracle(Oracle):
    """W <- W - lr gamma_t ||W|| u/||u|| with u the base rule's direction (its oracle), norms in float64; no
    step when ||W|| = 0 or ||u|| = 0. Switches: ``zero_ratio_one`` (optax's scale_by_trust_ratio: ratio 1,
    a step -lr u, at a zero norm); ``base`` (another base oracle)."""

    def __init__(self, rule, name=None, **sw):
        from refopt.conventions import oracle
        super().__init__(rule, name, **sw)
        self.base, self.zero_one = sw.get("base") or oracle(rule.base), sw.get("zero_ratio_one", False)

    def init_leaf(self, x, path):
        return {"base": self.base.init_leaf(x, path)}

    def step_leaf(self, t, s, x, g, path):
        u = self.base.direction_leaf(t, s["base"], x, g, path)
        lr = self.rule.lr * gamma(self.rule.schedule, t)
        nw, nu = _norm(self.rule, x), _norm(self.rule, u)
        if nw == 0.0 or nu == 0.0:
            return x - scalar(lr, x.dtype) * u if self.zero_one else x
        return x - scalar(lr * nw / nu, x.dtype) * u


class TrustRatioThenMomentum(Oracle):
    """optax.lars's order: u = ||x|| / ||g_base|| g_base (trust ratio, coefficient 1, ratio 1 at a zero norm),
    then momentum on u (trace b = u + mu b), x -= lr b; g_base = g (+ wd x)."""

    def __init__(self, rule, name="momentum after the trust ratio", **sw):
        super().__init__(rule, name, **sw)

    def init_leaf(self, x, path):
        return {"b": np.zeros_like(x)}

    def step_leaf(self, t, s, x, g, path):
        b = self.rule.base
        d = x.dtype
        g = g + scalar(b.weight_decay, d) * x if b.weight_decay else g
        wn, gn = norm64(x), norm64(g)
        ratio = wn / gn if wn > 0 and gn > 0 else 1.0
        s["b"] = scalar(b.momentum, d) * s["b"] + scalar(ratio, d) * g
        return x - scalar(self.rule.lr, d) * s["b"]


def TrustRatioOneAtZero(rule):
    """Covariant with optax's zero-norm convention (:class:`CovariantOracle` with ``zero_ratio_one``): the step
    is -lr ratio u with ratio = ||x||/||u||, and 1 when either norm is 0."""
    from refopt.conventions import oracle
    return oracle(rule, name="trust ratio 1 at a zero norm", zero_ratio_one=True)


def variants(rule):
    from refopt.conventions._variants import Variant, base_variants, oracle_variant as v

    out = base_variants(rule)
    if rule.schedule is None and rule.norm == "fro":
        out.append(v(rule, "trust ratio 1 at a zero norm", "at ||x|| = 0 or ||u|| = 0 the step is -lr u (optax's "
                     "scale_by_trust_ratio: LAMB, LARS) where refopt's Covariant makes no step", zero_ratio_one=True))
    if isinstance(rule.base, SGD) and rule.base.momentum > 0 and rule.schedule is None:
        out.append(Variant("momentum after the trust ratio", "u = ||x||/||g|| g, then b = mu b + u, x -= lr b "
                           "(optax.lars order) in place of the trust ratio of the momentum direction",
                           lambda: TrustRatioThenMomentum(rule)))
    return out


def facts(rule, of):
    """u/||u|| removes any scale of u that is homogeneous in g: covariant (eq. phi) for such a base; the norms
    are orthogonally ('fro', 'rms') and permutation invariant, so the base's equivariances carry over."""
    b = of(rule.base)
    norm_ok = b["grad_scale"] or b["homogeneous"]
    return {"grad_scale": norm_ok, "step_scale_free": b["step_scale_free"] or b["plain_direction"],
            "orthogonal": rule.norm in ("fro", "rms") and b["orthogonal"], "elementwise": b["elementwise"],
            "covariant": norm_ok, "exact_scale_free": b["exact_scale_free"]}


# optax.lamb / optax.lars are reproduced exactly by refopt's LAMB and LARS (refopt/conventions/trust_ratio.py);
# the rows below check where Covariant, the ELR form, agrees with them.
LAMB, LARS = LAMB_OPTAX, LARS_OPTAX

_ZERO_WHY = ("the MLP and GPT have zero-initialised biases: at a zero norm optax's trust ratio is 1 (step -lr*u) "
             "while refopt's Covariant makes no step (the known gap, preset 'optax.lamb/lars at a zero norm')")

# ---- the divergence-atlas entries about the rule (refopt/crosscheck/divergences.py runs them) ----------
def atlas_lamb_zero():
    import numpy as np
    from refopt.crosscheck.atlas import Entry, Pair, SEED, STEPS, _p, _rules, peer_side, restated_side
    from refopt.crosscheck.problems import make_problem

    R = _rules()

    def leaves():
        prob = make_problem("stream", np.float64, SEED)
        x0 = [a.copy() for a in prob.leaves]
        i = prob.paths.index("b")
        x0[i] = np.zeros_like(x0[i])                 # a zero-initialised bias
        return prob.paths, x0, [prob.grad(x0, t) for t in range(1, STEPS + 1)]
    lamb = _p("optax.lamb", "optax", "lamb", dict(learning_rate=1e-2, weight_decay=0.0),
              lambda: R.Covariant(R.Adam(eps=1e-6), lr=1e-2), state={"base.m": "mu", "base.v": "nu"})
    lars = _p("optax.lars", "optax", "lars", dict(learning_rate=1e-2, momentum=0.0, trust_coefficient=1.0,
                                                  weight_decay=1e-3),
              lambda: R.Covariant(R.SGD(weight_decay=1e-3), lr=1e-2))
    cov_l = lambda: R.Covariant(R.Adam(eps=1e-6), lr=1e-2)
    cov_s = lambda: R.Covariant(R.SGD(weight_decay=1e-3), lr=1e-2)
    return Entry(
        "trust-ratio-zero-norm", "LAMB / LARS at a zero norm: optax's trust ratio is 1 (a zero array moves by "
        "-lr u); refopt's Covariant makes no step",
        (peer_side("optax.lamb", lamb, refopt="variants.TrustRatioOneAtZero(Covariant(Adam(eps=1e-6), lr=0.01))",
                   make_refopt=lambda: TrustRatioOneAtZero(cov_l()), source="You et al. 2019 code: ratio 1 at 0"),
         peer_side("optax.lars", lars, refopt="variants.TrustRatioOneAtZero(Covariant(SGD(weight_decay=0.001), "
                   "lr=0.01))", make_refopt=lambda: TrustRatioOneAtZero(cov_s()), source="ratio 1 at 0"),
         restated_side("Covariant(Adam)", "the ELR form (post 000, eq. elr-u): a zero weight has ELR 0", cov_l,
                       source="post 000"),
         restated_side("Covariant(SGD)", "the ELR form (post 000, eq. elr-g)", cov_s, source="post 000")),
        (Pair("optax.lamb", "Covariant(Adam)", "abs", 1e-3, what="the zero-initialised bias (abs: refopt's stays 0)"),
         Pair("optax.lars", "Covariant(SGD)", "abs", 1e-3, what="the zero-initialised bias")),
        "the papers (LARS: You et al. 2017; LAMB: You et al. 2019) define the ratio ||x||/||u||, 0 for x = 0; "
        "optax's 1 is an implementation choice that lets zero-initialised arrays move (PITFALLS B11).",
        "post 000 eq. (elr-u); PITFALLS B11; optax scale_by_trust_ratio", leaves=leaves)


CONVENTIONS = Conventions(
    rules=(Covariant,),
    final="the trust ratio ||x||/||u|| (the norm, its zero case) or the base's direction",
    per_step="the trust ratio ||x||/||u||",
    no_peer={"torch": "torch.optim 2.13 has no LAMB or LARS", "schedulefree": "schedulefree has no trust ratio",
             "optax": "optax's trust-ratio rules are refopt's LAMB and LARS (like('optax.lamb'), like('optax.lars')); "
                      "Covariant equals them on non-zero arrays without decay or momentum (the rows below)"},
    presets=(
        LAMB.preset("optax.lamb(weight_decay=0)", dict(learning_rate=1e-2, weight_decay=0.0),
                    "LAMB = scale_by_adam (eps 1e-6, optax.lamb's default) then the trust ratio ||x||/||u|| then -lr: "
                    "refopt Covariant(Adam) (post 000, eq. elr-u). Known gap at a zero norm: optax's ratio is 1 "
                    "(step -lr*u), refopt makes no step; the problems have no zero arrays",
                    problems=("stream", "quadratic"), problems_why=_ZERO_WHY, family="covariant",
                    make_rule=lambda: Covariant(Adam(eps=1e-6), lr=1e-2), state={"base.m": "mu", "base.v": "nu"}),
        LARS.preset("optax.lars(momentum=0,trust_coefficient=1)", dict(learning_rate=1e-2, momentum=0.0,
                                                                        trust_coefficient=1.0, weight_decay=1e-3),
                    "LARS without momentum: g + wd*x (L2, as SGD's), trust ratio ||x||/||g + wd x||, -lr: refopt "
                    "Covariant(SGD) (eq. elr-g); same zero-norm gap as LAMB", problems=("stream", "quadratic"),
                    problems_why=_ZERO_WHY, family="covariant",
                    make_rule=lambda: Covariant(SGD(weight_decay=1e-3), lr=1e-2)),
    ),
    wrong=(Preset("WRONG momentum order: optax.lars(momentum=0.9) vs refopt Covariant(SGD(momentum=0.9))", "optax",
                  "covariant", ("lars", dict(learning_rate=1e-2, momentum=0.9, trust_coefficient=1.0)),
                  lambda: Covariant(SGD(momentum=0.9), lr=1e-2),
                  "optax.lars applies momentum to the trust-ratio-scaled steps; Covariant normalises the momentum "
                  "direction (LARS with momentum is not Covariant(SGD(momentum)))", expect_fail=True),),
    gaps=(Preset("optax.lamb/lars at a zero norm", "optax", "covariant", ("lamb", dict(learning_rate=1e-2)), None,
                 "trust ratio at ||x|| = 0 or ||u|| = 0",
                 gap="optax's scale_by_trust_ratio uses ratio 1 when either norm is 0, so a zero array (e.g. a "
                     "zero-initialised bias) moves by -lr*u; refopt's Covariant makes no step there (PITFALLS B11: "
                     "a zero weight has ELR 0). Give such arrays another rule with refopt.Partition."),),
    oracle=CovariantOracle,
    variants=variants,
    facts=facts,
    golden=(
        GoldenCase("covariant_adam", lambda: Covariant(Adam(eps=1e-6), lr=1e-2),
                   "Covariant(Adam): W - lr ||W|| u/||u|| (post 000, eq. elr-u) = optax.lamb(weight_decay=0)",
                   ("base.m", "base.v")),
        GoldenCase("covariant_sgd", lambda: Covariant(SGD(weight_decay=1e-3), lr=1e-2),
                   "Covariant(SGD) with L2 in g (eq. elr-g) = optax.lars(momentum=0, trust_coefficient=1)"),
    ),
    examples=(
        Example("covariant_sgd", lambda: Covariant(SGD(momentum=0.9), lr=0.1, schedule=_cosine(0))),
        Example("covariant_adam_rms", lambda: Covariant(Adam(), lr=0.05, norm="rms", schedule=_cosine(5))),
        Example("covariant_muon", lambda: Covariant(Muon(msign="svd"), lr=0.05, schedule=_cosine(0)), "matrix"),
    ),
    atlas=(atlas_lamb_zero,),
)


def _cosine(warmup):
    from refopt.schedules import warmup_cosine
    return warmup_cosine(warmup, 300, 0.0)
