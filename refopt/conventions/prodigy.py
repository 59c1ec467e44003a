"""Prodigy (refopt/rules/prodigy.py) to prodigyopt.Prodigy, optax.contrib.prodigy and pytorch_optimizer.Prodigy:
one estimate d over the whole tree (OptState.glob), the moments of d g, eps times the next estimate d_{t+1}.
optax always bias-corrects and has no growth rate; prodigyopt and pytorch_optimizer correct only on request; the
L2 decay of pytorch_optimizer (weight_decouple=False) is added to the gradient after every sum has read it, so
it never changes the step. torch.optim ships no Prodigy."""
from __future__ import annotations

import math

import numpy as np

from refopt.conventions._spec import BETAS2, Conventions, Example, Oracle, PeerMapping, Preset, gamma, scalar
from refopt.golden import GoldenCase
from refopt.rules.prodigy import Prodigy
from refopt.rules.sgd import SGD


class ProdigyOracle(Oracle):
    """Prodigy from its docstring; the oracle's state is (t, leaves, (d, d_max, r)). Switches: ``per_leaf``
    True estimates d per array; ``eps_current`` True puts eps d_t in the denominator where the rule puts
    eps d_{t+1} (and the reverse for ``eps_at='current'``); ``flip_bias`` True toggles the bias correction;
    ``flip_safeguard`` toggles the safeguard warmup; ``moments_of_g`` True keeps the moments of g (not d g)."""

    def init_leaf(self, x, path):
        z = np.zeros_like(x)
        return {"m": z, "v": z.copy(), "s": z.copy(), "x0": np.array(x, copy=True)}

    def init(self, params):
        t, leaves = super().init(params)
        return (t, leaves, None)

    def _estimate(self, t, glob, leaves, xs, gs, lr_t):
        """(dlr, d_t, the next (d, d_max, r), eps d, new s per leaf, a per leaf) for the leaves given."""
        r, sw = self.rule, self.switches
        d, d_max, num = (r.d0, r.d0, 0.0) if glob is None else glob
        b1, b2 = r.beta1, r.beta2
        b3 = math.sqrt(b2) if r.beta3 is None else r.beta3
        bias = r.bias_correction != bool(sw.get("flip_bias"))
        safeguard = r.safeguard_warmup != bool(sw.get("flip_safeguard"))
        bc = math.sqrt(1 - b2 ** t) / (1 - b1 ** t) if bias else 1.0
        dlr = d * lr_t * bc
        wd = 0.0 if r.decoupled else r.weight_decay
        a = [g.astype(np.float64) + wd * x.astype(np.float64) for x, g in zip(xs, gs)]
        w = (d / r.d0) * (d if safeguard else dlr)
        s_new = [b3 * s["s"].astype(np.float64) + w * ai for s, ai in zip(leaves, a)]
        inner = sum(float(np.sum(ai * (s["x0"].astype(np.float64) - x.astype(np.float64))))
                    for s, x, ai in zip(leaves, xs, a))
        num = b3 * num + (d / r.d0) * dlr * inner
        l1 = sum(float(np.sum(np.abs(si))) for si in s_new)
        d_next = d
        if l1 > 0:
            d_hat = r.d_coef * num / l1
            d_prime = max(d, d_hat) if d == r.d0 else d
            d_max = max(d_max, d_hat)
            d_next = min(d_max, d_prime * r.growth_rate)
        current = (r.eps_at == "current") != bool(sw.get("eps_current"))
        return dlr, d, (d_next, d_max, num), r.eps * (d if current else d_next), s_new, a

    def step(self, state, params, grads):
        from refopt import tree as T
        t, leaves, glob = state
        t += 1
        xs, gs, paths, td = T.check_like(params, grads)
        xs, gs = [np.asarray(x) for x in xs], [np.asarray(g) for g in gs]
        lr_t = self.rule.lr * gamma(self.rule.schedule, t)
        if lr_t == 0:
            return T.unflatten(td, [np.array(x, copy=True) for x in xs]), (t, [dict(s) for s in leaves], glob)
        if self.switches.get("per_leaf"):
            parts = [self._estimate(t, None if glob is None else glob[i], [s], [x], [g], lr_t)
                     for i, (s, x, g) in enumerate(zip(leaves, xs, gs))]
            new_glob = [p[2] for p in parts]
        else:
            one = self._estimate(t, glob, leaves, xs, gs, lr_t)
            parts = [(one[0], one[1], one[2], one[3], [si], [ai]) for si, ai in zip(one[4], one[5])]
            new_glob = one[2]
        r = self.rule
        out, new_leaves = [], []
        for x, s, (dlr, d, _, eps_d, (s_new,), (a,)) in zip(xs, leaves, parts):
            dt = x.dtype
            dg = a if self.switches.get("moments_of_g") else d * a
            m = scalar(r.beta1, dt) * s["m"] + scalar(1 - r.beta1, dt) * dg.astype(dt)
            v = scalar(r.beta2, dt) * s["v"] + scalar(1 - r.beta2, dt) * (dg * dg).astype(dt)
            decay = r.weight_decay * dlr if r.decoupled else 0.0
            out.append(x - scalar(decay, dt) * x - scalar(dlr, dt) * (m / (np.sqrt(v) + scalar(eps_d, dt))))
            new_leaves.append({"m": m, "v": v, "s": s_new.astype(dt), "x0": s["x0"]})
        return T.unflatten(td, out), (t, new_leaves, new_glob)


def variants(rule):
    from refopt.conventions._variants import oracle_variant as v
    return [v(rule, "per-array estimate", "d estimated per array (each leaf its own r and s) in place of one d over "
              "the whole tree", per_leaf=True),
            v(rule, "eps times the other estimate", "eps d_t in the denominator where the rule has eps d_{t+1} (or "
              "the reverse)", eps_current=True),
            v(rule, "bias correction toggled", "sqrt(1 - beta2^t) / (1 - beta1^t) in dlr " +
              ("left out" if rule.bias_correction else "applied"), flip_bias=True),
            v(rule, "safeguard warmup toggled", "s weighted by (d/d0) d in place of (d/d0) dlr, or the reverse",
              flip_safeguard=True),
            v(rule, "moments of g", "m and v of g in place of d g", moments_of_g=True)]


def facts(rule, of):
    """d is a ratio of sums that are both of degree 1 in g (r and s are linear in g), and m / (sqrt(v) + eps d)
    has degree 0 (eps -> 0): the step is gradient-scale free without coupled decay. The l1 norm of s is not
    orthogonally invariant; permutations keep it."""
    return {"grad_scale": rule.weight_decay == 0 or rule.decoupled, "step_scale_free": False, "orthogonal": False,
            "elementwise": True}


_LR = (lambda v: not callable(v), "refopt takes a constant multiplier here (a schedule goes on the rule's "
                                  "schedule=)")
_FALSE = (lambda v: v is False, "refopt reproduces the single-process step only")


def _prodigyopt(lr, betas, beta3, eps, weight_decay, decouple, use_bias_correction, safeguard_warmup, d0, d_coef,
                growth_rate):
    return Prodigy(lr=lr, beta1=betas[0], beta2=betas[1], beta3=beta3, eps=eps, d0=d0, d_coef=d_coef,
                   growth_rate=growth_rate, weight_decay=weight_decay, decoupled=decouple,
                   bias_correction=use_bias_correction, safeguard_warmup=safeguard_warmup)


def _optax(learning_rate, betas, beta3, eps, estim_lr0, estim_lr_coef, weight_decay, safeguard_warmup):
    return Prodigy(lr=learning_rate, beta1=betas[0], beta2=betas[1], beta3=beta3, eps=eps, d0=estim_lr0,
                   d_coef=estim_lr_coef, weight_decay=weight_decay, bias_correction=True,
                   safeguard_warmup=safeguard_warmup)


def _pytorch_optimizer(lr, betas, beta3, d0, d_coef, growth_rate, weight_decay, weight_decouple, bias_correction,
                       safeguard_warmup, eps):
    # weight_decouple=False adds weight_decay x to p.grad after m, v, s and r have read it: no effect
    return Prodigy(lr=lr, beta1=betas[0], beta2=betas[1], beta3=beta3, eps=eps, d0=d0, d_coef=d_coef,
                   growth_rate=growth_rate, weight_decay=weight_decay if weight_decouple else 0.0,
                   bias_correction=bias_correction, safeguard_warmup=safeguard_warmup)


def _common(rule) -> bool:
    return type(rule) is Prodigy and rule.schedule is None and rule.eps_at == "next"


def _match_optax(rule):
    if not _common(rule) or not rule.bias_correction or not rule.decoupled or rule.growth_rate != math.inf:
        return None
    return dict(learning_rate=rule.lr, betas=(rule.beta1, rule.beta2), beta3=rule.beta3, eps=rule.eps,
                estim_lr0=rule.d0, estim_lr_coef=rule.d_coef, weight_decay=rule.weight_decay,
                safeguard_warmup=rule.safeguard_warmup)


def _match_prodigyopt(rule):
    if not _common(rule):
        return None
    return dict(lr=rule.lr, betas=(rule.beta1, rule.beta2), beta3=rule.beta3, eps=rule.eps,
                weight_decay=rule.weight_decay, decouple=rule.decoupled, use_bias_correction=rule.bias_correction,
                safeguard_warmup=rule.safeguard_warmup, d0=rule.d0, d_coef=rule.d_coef, growth_rate=rule.growth_rate)


def _match_pytorch_optimizer(rule):
    if not _common(rule) or not (rule.decoupled or rule.weight_decay == 0):
        return None
    return dict(lr=rule.lr, betas=(rule.beta1, rule.beta2), beta3=rule.beta3, d0=rule.d0, d_coef=rule.d_coef,
                growth_rate=rule.growth_rate, weight_decay=rule.weight_decay, bias_correction=rule.bias_correction,
                safeguard_warmup=rule.safeguard_warmup, eps=rule.eps)


_TORCH_STATE = {"m": "exp_avg", "v": "exp_avg_sq", "s": "s", "x0": "p0"}

OPTAX = PeerMapping("optax.contrib.prodigy", "optax", "contrib.prodigy",
                    dict(learning_rate=1.0, betas=(0.9, 0.999), beta3=None, eps=1e-8, estim_lr0=1e-6,
                         estim_lr_coef=1.0, weight_decay=0.0, safeguard_warmup=False), _optax, "prodigy",
                    refuse={"betas": BETAS2, "learning_rate": _LR},
                    state={"m": "exp_avg", "v": "exp_avg_sq", "s": "grad_sum", "x0": "params0"}, match=_match_optax)

PRODIGYOPT = PeerMapping("prodigyopt.Prodigy", "prodigyopt", "Prodigy",
                         dict(lr=1.0, betas=(0.9, 0.999), beta3=None, eps=1e-8, weight_decay=0.0, decouple=True,
                              use_bias_correction=False, safeguard_warmup=False, d0=1e-6, d_coef=1.0,
                              growth_rate=math.inf), _prodigyopt, "prodigy",
                         refuse={"betas": BETAS2, "fsdp_in_use": _FALSE,
                                 "slice_p": (lambda v: v == 1, "slice_p > 1 estimates d from every slice_p-th "
                                                               "entry; refopt reads every entry (slice_p=1)")},
                         state=_TORCH_STATE, match=_match_prodigyopt)

PYTORCH_OPTIMIZER = PeerMapping(
    "pytorch_optimizer.Prodigy", "pytorch_optimizer", "Prodigy",
    dict(lr=1.0, betas=(0.9, 0.999), beta3=None, d0=1e-6, d_coef=1.0, growth_rate=math.inf, weight_decay=0.0,
         weight_decouple=True, bias_correction=False, safeguard_warmup=False, eps=1e-8), _pytorch_optimizer,
    "prodigy", ignore=("foreach",),
    refuse={"betas": BETAS2, "maximize": _FALSE,
            "fixed_decay": (lambda v: v is False, "fixed_decay=True decays by weight_decay x, without dlr"),
            "eps": (lambda v: v is not None, "eps=None replaces m / (sqrt(v) + eps d) by atan2(m, sqrt(v))")},
    state=_TORCH_STATE, match=_match_pytorch_optimizer)


def atlas_prodigy():
    from refopt.crosscheck.atlas import Entry, Pair, peer_side, restated_side

    o = OPTAX.preset("optax.contrib.prodigy", dict(learning_rate=1.0), "atlas")
    p = PRODIGYOPT.preset("prodigyopt.Prodigy", dict(lr=1.0), "atlas")
    t = PYTORCH_OPTIMIZER.preset("pytorch_optimizer.Prodigy(L2)", dict(lr=1.0, weight_decay=0.1,
                                                                       weight_decouple=False), "atlas")
    p_l2 = PRODIGYOPT.preset("prodigyopt.Prodigy(L2)", dict(lr=1.0, weight_decay=0.1, decouple=False), "atlas")
    paper = Prodigy(eps_at="current")
    return Entry(
        "prodigy-bias-correction-decay",
        "optax.contrib.prodigy (always bias-corrected) vs prodigyopt.Prodigy (not by default); pytorch_optimizer's "
        "L2 decay (weight_decouple=False) never reaches the step; the paper's eps d_t vs the packages' eps d_{t+1}",
        (peer_side("optax", o, source="optax 0.2.8: dlr = d lr sqrt(1 - beta2^t) / (1 - beta1^t), no growth rate"),
         peer_side("prodigyopt", p, source="prodigyopt 1.1.2: use_bias_correction=False by default"),
         peer_side("prodigyopt-L2", p_l2, source="prodigyopt 1.1.2, decouple=False: g + 0.1 x enters m, v, s, r"),
         peer_side("pytorch_optimizer-L2", t, source="pytorch_optimizer 4.1.0, weight_decouple=False: "
                                                      "apply_weight_decay adds 0.1 x to p.grad after the sums"),
         restated_side("paper", "Mishchenko & Defazio 2024, Algorithm 3: sqrt(v_t) + d_t eps", lambda: paper,
                       oracle=lambda: ProdigyOracle(paper), source="the paper's Adam version")),
        (Pair("optax", "prodigyopt", "final", 1e-3, what="params after 50 steps: bias-corrected dlr or not"),
         Pair("prodigyopt", "pytorch_optimizer-L2", "final", 1e-12, kind="max",
              what="pytorch_optimizer with L2 decay 0.1 steps exactly as prodigyopt without decay"),
         Pair("prodigyopt-L2", "pytorch_optimizer-L2", "final", 1e-3,
              what="the same weight_decay=0.1 as L2 in both packages"),
         Pair("prodigyopt", "paper", "final", 1e-6, what="eps d_{t+1} vs eps d_t in the denominator")),
        "The paper's Algorithm 3 has no bias correction and weights eps by d_t; prodigyopt and pytorch_optimizer "
        "follow it on the bias correction by default (optax always applies Adam's correction) and all three "
        "weight eps by the next estimate d_{t+1}. pytorch_optimizer's coupled decay is a no-op: its "
        "apply_weight_decay adds weight_decay x to p.grad in the second loop, after m, v, s and r have read the "
        "gradient, so weight_decay with weight_decouple=False does nothing.",
        "Mishchenko & Defazio 2024 (ICML), Algorithm 3; prodigyopt 1.1.2; optax.contrib.prodigy 0.2.8; "
        "pytorch_optimizer 4.1.0")


_NOT_LEAFWISE = {"not_leafwise": "the estimate d is one number over the whole tree (each leaf alone gets its own)"}

CONVENTIONS = Conventions(
    rules=(Prodigy,),
    final="dlr_t m_t / (sqrt(v_t) + eps d_{t+1}) with d from the whole tree's weighted sums: where d enters "
          "eps, the moments of d g, the bias correction, the safeguard or per-array estimates",
    per_step="the step size dlr_t = d_t lr_t bc_t and the estimate d_{t+1} = max(d_t, r_t / ||s_t||_1)",
    mappings=(OPTAX, PRODIGYOPT, PYTORCH_OPTIMIZER),
    no_peer={"torch": "torch.optim ships no Prodigy",
             "schedulefree": "schedulefree ships the Schedule-Free optimizers only"},
    presets=(
        OPTAX.preset("optax.contrib.prodigy", dict(learning_rate=1.0), "bias-corrected dlr, d = max(d, r / |s|_1)"),
        OPTAX.preset("optax.contrib.prodigy(betas,wd,safeguard)",
                     dict(learning_rate=0.5, betas=(0.95, 0.99), beta3=0.98, eps=1e-6, estim_lr0=1e-4,
                          estim_lr_coef=0.8, weight_decay=0.01, safeguard_warmup=True),
                     "non-default betas and beta3, d_0 1e-4, c_d 0.8, decoupled decay 0.01, the safeguard"),
        PRODIGYOPT.preset("prodigyopt.Prodigy", dict(lr=1.0), "no bias correction, d = max(d, r / |s|_1)"),
        PRODIGYOPT.preset("prodigyopt.Prodigy(bc,growth,L2)",
                          dict(lr=0.5, betas=(0.95, 0.99), beta3=0.98, eps=1e-6, weight_decay=0.01, decouple=False,
                               use_bias_correction=True, d0=1e-4, d_coef=0.8, growth_rate=1.05),
                          "bias correction, growth rate 1.05, L2 decay 0.01 in every sum"),
        PRODIGYOPT.preset("prodigyopt.Prodigy(safeguard,wd)",
                          dict(lr=1.0, weight_decay=0.05, safeguard_warmup=True, d0=1e-4),
                          "the safeguard warmup, decoupled decay 0.05"),
        PYTORCH_OPTIMIZER.preset("pytorch_optimizer.Prodigy(bc,growth,wd)",
                                 dict(lr=0.5, betas=(0.95, 0.99), beta3=0.98, d0=1e-4, d_coef=0.8, growth_rate=1.05,
                                      weight_decay=0.01, bias_correction=True, eps=1e-6),
                                 "bias correction, growth rate 1.05, decoupled decay 0.01"),
        PYTORCH_OPTIMIZER.preset("pytorch_optimizer.Prodigy(L2)", dict(lr=1.0, weight_decay=0.1,
                                                                       weight_decouple=False),
                                 "weight_decouple=False: the L2 term is added to p.grad after every sum, a no-op"),
    ),
    wrong=(Preset("WRONG bias correction: optax.contrib.prodigy vs refopt Prodigy without it", "optax", "prodigy",
                  ("contrib.prodigy", dict(learning_rate=1.0)), lambda: Prodigy(lr=1.0, bias_correction=False),
                  "bias correction left out: dlr without sqrt(1 - beta2^t) / (1 - beta1^t)",
                  state={"m": "exp_avg", "v": "exp_avg_sq"}, expect_fail=True),
           Preset("WRONG step size: prodigyopt.Prodigy vs refopt SGD", "prodigyopt", "prodigy",
                  ("Prodigy", dict(lr=1.0)), lambda: SGD(lr=1e-3), "a constant lr vs the estimate d", state={},
                  expect_fail=True)),
    oracle=ProdigyOracle,
    atlas=(atlas_prodigy,),
    variants=variants,
    facts=facts,
    golden=(GoldenCase("prodigy", lambda: Prodigy(), "prodigyopt.Prodigy's defaults", ("m", "v", "s", "x0")),
            GoldenCase("prodigy_optax", lambda: Prodigy(beta1=0.95, beta2=0.99, beta3=0.98, eps=1e-6, d0=1e-4,
                                                        d_coef=0.8, weight_decay=0.01, bias_correction=True,
                                                        safeguard_warmup=True),
                       "optax.contrib.prodigy with non-default betas, d_0, c_d, decay and the safeguard",
                       ("m", "v", "s", "x0")),
            GoldenCase("prodigy_growth_l2", lambda: Prodigy(lr=0.5, d0=1e-4, growth_rate=1.05, weight_decay=0.01,
                                                            decoupled=False, bias_correction=True),
                       "prodigyopt with a growth rate 1.05 and L2 decay", ("m", "v", "s", "x0"))),
    examples=(Example("prodigy", lambda: Prodigy(d0=1e-3), extra=_NOT_LEAFWISE),
              Example("prodigy_bc_wd", lambda: Prodigy(d0=1e-3, bias_correction=True, weight_decay=1e-3,
                                                       growth_rate=1.1), extra=_NOT_LEAFWISE),
              Example("prodigy_paper_eps", lambda: Prodigy(d0=1e-3, eps_at="current", safeguard_warmup=True,
                                                           decoupled=False, weight_decay=1e-3),
                      extra=_NOT_LEAFWISE)),
)
