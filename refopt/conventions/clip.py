"""ClipByGlobalNorm (refopt/rules/clip.py) to optax.clip_by_global_norm (eps 0) and torch's
clip_grad_norm_ (eps 1e-6) before a base optimizer (CONVENTIONS.md 1, 2)."""
from __future__ import annotations

import math

import numpy as np

from refopt.conventions._spec import Conventions, Example, Oracle, PeerMapping, norm64, scalar
from refopt.golden import GoldenCase
from refopt.rules.adam import Adam
from refopt.rules.clip import ClipByGlobalNorm
from refopt.rules.sgd import SGD


class ClipOracle(Oracle):
    """g <- g min(1, max_norm/(N + eps)), N = sqrt(sum ||g||_F^2) over the whole tree in float64 (c = 1 when
    N + eps = 0), then the base rule's oracle. Switches: ``eps`` overriding the rule's (the other peer's);
    ``per_leaf`` the norm and factor of each array on its own (a clip per tensor, not global)."""

    def __init__(self, rule, name=None, **sw):
        from refopt.conventions import oracle
        super().__init__(rule, name, **sw)
        self.base, self.eps = sw.get("base") or oracle(rule.base), sw.get("eps", rule.eps)
        self.per_leaf = sw.get("per_leaf", False)

    def init_leaf(self, x, path):
        return self.base.init_leaf(x, path)

    def prepare(self, t, xs, gs):
        if self.per_leaf:
            return [self._clip([g])[0] for g in gs]
        return self._clip(gs)

    def _clip(self, gs):
        n = math.sqrt(sum(norm64(g) ** 2 for g in gs))
        den = n + self.eps
        c = 1.0 if den == 0.0 else min(1.0, self.rule.max_norm / den)
        return [g if c == 1.0 else np.multiply(g, scalar(c, g.dtype)) for g in gs]

    def step_leaf(self, t, s, x, g, path):
        return self.base.step_leaf(t, s, x, g, path)

    def direction_leaf(self, t, s, x, g, path):
        return self.base.direction_leaf(t, s, x, g, path)


def variants(rule):
    from refopt.conventions._variants import base_variants, oracle_variant as v

    other = 1e-6 if rule.eps == 0 else 0.0
    return [v(rule, f"clipping eps {other:g}", "N + 1e-6 in the factor (torch's clip_grad_norm_) vs N (optax)",
              eps=other),
            v(rule, "clip per leaf", "each array clipped by its own norm, min(1, max_norm/||g_i||), not by the "
              "global norm of the whole tree", per_leaf=True)] + base_variants(rule)


def facts(rule, of):
    """g_t min(1, M/(N_t + eps)) is active or not per step depending on c: the base must ignore a separate
    scale of each step's gradient; ||U G V^T||_F = ||G||_F and ||P g|| = ||g||: one scalar factor."""
    b = of(rule.base)
    return {"grad_scale": b["step_scale_free"], "step_scale_free": b["step_scale_free"],
            "orthogonal": b["orthogonal"], "elementwise": b["elementwise"]}


def _chain(learning_rate, max_norm, **base):
    return ClipByGlobalNorm(Adam(lr=learning_rate, beta1=base["b1"], beta2=base["b2"], eps=base["eps"]),
                            max_norm=max_norm)


OPTAX = PeerMapping("optax.chain(clip_by_global_norm, adam)", "optax", "chain:clip_by_global_norm+adam",
                    dict(b1=0.9, b2=0.999, eps=1e-8), _chain, "clip", required=("max_norm", "learning_rate"),
                    state={"base.m": "mu", "base.v": "nu"})
TORCH = PeerMapping("torch.nn.utils.clip_grad_norm_ + torch.optim.SGD", "torch", "clip_grad_norm_+SGD",
                    dict(lr=1e-3, momentum=0.0), lambda max_norm, lr, momentum: ClipByGlobalNorm(
                        SGD(lr=lr, momentum=momentum), max_norm=max_norm, eps=1e-6),
                    "clip", required=("max_norm",))


# ---- the divergence-atlas entries about the rule (refopt/crosscheck/divergences.py runs them) ----------
def atlas_clip():
    from refopt.crosscheck.atlas import Entry, Pair, _p, _rules, _torch_clipped, peer_side

    R = _rules()
    tp = _p("torch.SGD", "torch", "SGD", dict(lr=0.1), lambda: R.ClipByGlobalNorm(R.SGD(lr=0.1), max_norm=1.0,
                                                                                    eps=1e-6))

    def chain(optax, max_norm, learning_rate):
        return optax.chain(optax.clip_by_global_norm(max_norm), optax.sgd(learning_rate))
    op = _p("optax.chain(clip_by_global_norm, sgd)", "optax", chain, dict(max_norm=1.0, learning_rate=0.1),
            lambda: R.ClipByGlobalNorm(R.SGD(lr=0.1), max_norm=1.0))
    return Entry(
        "clip-eps", "Clipping by the global norm: torch's clip_grad_norm_ adds 1e-6 to the norm, "
        "optax.clip_by_global_norm does not",
        (peer_side("torch", tp, impl="torch.nn.utils.clip_grad_norm_(params, 1.0) before torch.optim.SGD(lr=0.1)",
                   make_peer=_torch_clipped(tp, 1.0), source="factor max_norm / (N + 1e-6), clamped to 1"),
         peer_side("optax", op, impl="optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(0.1))",
                   source="g kept when N < max_norm, else g max_norm / N")),
        (Pair("torch", "optax", "step", 1e-8, what="per-step update (median): about 1e-6/N"),),
        "no paper: torch's 1e-6 guards the division at N = 0; optax handles N = 0 with a select instead.",
        "CONVENTIONS.md 1, 2; torch.nn.utils.clip_grad_norm_")


CONVENTIONS = Conventions(
    rules=(ClipByGlobalNorm,),
    final="the base's step",
    per_step="the clipping factor min(1, max_norm/(N + eps)), N = sqrt(sum of ||g_i||^2) over the whole tree",
    mappings=(OPTAX, TORCH),
    no_peer={"schedulefree": "schedulefree has no clipping (its optimizers take the gradients as given)"},
    presets=(OPTAX.preset("optax.clip_by_global_norm+adam", dict(max_norm=0.5, learning_rate=1e-2),
                          "g <- g when ||g|| < max_norm, else (g/||g||) max_norm (no eps), over the whole tree, "
                          "then Adam", state={}),),
    oracle=ClipOracle,
    variants=variants,
    facts=facts,
    golden=(GoldenCase("clip_adam", lambda: ClipByGlobalNorm(Adam(lr=1e-2), max_norm=0.5),
                       "optax.chain(clip_by_global_norm(0.5), adam(0.01))", ("base.m", "base.v")),),
    examples=(
        Example("clip_adam", lambda: ClipByGlobalNorm(Adam(lr=0.05), max_norm=0.5),
                extra={"not_leafwise": "clipping by the global norm couples the leaves (each leaf alone has its "
                                       "own norm)"}),
        Example("clip_sgd_torch", lambda: ClipByGlobalNorm(SGD(lr=0.05, momentum=0.9), max_norm=0.5, eps=1e-6),
                extra={"not_leafwise": "clipping by the global norm couples the leaves (each leaf alone has its "
                                       "own norm)"}),
    ),
    atlas=(atlas_clip,),
)
