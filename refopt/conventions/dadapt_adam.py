"""D-Adaptation Adam (refopt/rules/dadapt_adam.py) to dadaptation.DAdaptAdam and optax.contrib.dadapt_adamw: one
estimate d over the whole tree (OptState.glob) from the inner products of g with s / (sqrt(v) + eps) before this
step's update, m of dlr g, eps not scaled by d. optax always bias-corrects, decays decoupled and has no growth
rate; dadaptation corrects only on request, decays as L2 by default and bounds the growth of d by growth_rate.
torch.optim ships no D-Adaptation."""
from __future__ import annotations

import math

import numpy as np

from refopt.conventions._spec import BETAS2, Conventions, Example, Oracle, PeerMapping, Preset, gamma, scalar
from refopt.golden import GoldenCase
from refopt.rules.dadapt_adam import DAdaptAdam
from refopt.rules.sgd import SGD


class DAdaptAdamOracle(Oracle):
    """D-Adaptation Adam from its docstring; the oracle's state is (t, leaves, (d, r)). Switches: ``per_leaf``
    True estimates d per array; ``new_s`` True reads this step's s and v in the inner product (the rule reads
    the previous ones); ``flip_bias`` True toggles the bias correction; ``moments_of_g`` True keeps m of g (not
    dlr g) and steps by dlr m / (sqrt(v) + eps); ``no_growth`` True drops the growth bound."""

    def init_leaf(self, x, path):
        z = np.zeros_like(x)
        return {"m": z, "v": z.copy(), "s": z.copy()}

    def init(self, params):
        t, leaves = super().init(params)
        return (t, leaves, None)

    def _estimate(self, t, glob, leaves, xs, gs, lr_t):
        """(dlr, the next (d, r), new m, v, s per leaf as float64, a per leaf) for the leaves given."""
        r, sw = self.rule, self.switches
        d, num = (r.d0, 0.0) if glob is None else glob
        b1, b2 = r.beta1, r.beta2
        sb2 = math.sqrt(b2)
        bias = r.bias_correction != bool(sw.get("flip_bias"))
        bc = math.sqrt(1 - b2 ** t) / (1 - b1 ** t) if bias else 1.0
        dlr = d * lr_t * bc
        wd = 0.0 if r.decoupled else r.weight_decay
        a = [g.astype(np.float64) + wd * x.astype(np.float64) for x, g in zip(xs, gs)]
        w = 1.0 if sw.get("moments_of_g") else dlr
        m_new = [b1 * s["m"].astype(np.float64) + (1 - b1) * w * ai for s, ai in zip(leaves, a)]
        v_new = [b2 * s["v"].astype(np.float64) + (1 - b2) * ai * ai for s, ai in zip(leaves, a)]
        s_new = [sb2 * s["s"].astype(np.float64) + (1 - sb2) * dlr * ai for s, ai in zip(leaves, a)]
        if sw.get("new_s"):
            pairs = zip(s_new, v_new)
        else:
            pairs = ((s["s"].astype(np.float64), s["v"].astype(np.float64)) for s in leaves)
        inner = sum(float(np.sum(ai * si / (np.sqrt(vi) + r.eps))) for ai, (si, vi) in zip(a, pairs))
        l1 = sum(float(np.sum(np.abs(si))) for si in s_new)
        if l1 > 0:
            num = sb2 * num + (1 - sb2) * dlr * inner
            d_hat = num / ((1 - sb2) * l1)
            growth = math.inf if sw.get("no_growth") else r.growth_rate
            d = max(d, min(d_hat, d * growth))
        return dlr, (d, num), m_new, v_new, s_new

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
            new_glob = [p[1] for p in parts]
            parts = [(p[0], p[2][0], p[3][0], p[4][0]) for p in parts]
        else:
            dlr, new_glob, ms, vs, s_ = self._estimate(t, glob, leaves, xs, gs, lr_t)
            parts = [(dlr, m, v, s) for m, v, s in zip(ms, vs, s_)]
        r = self.rule
        out, new_leaves = [], []
        for x, (dlr, m, v, s_new) in zip(xs, parts):
            dt = x.dtype
            m, v = m.astype(dt), v.astype(dt)
            a = m / (np.sqrt(v) + scalar(r.eps, dt))
            if self.switches.get("moments_of_g"):
                a = scalar(dlr, dt) * a
            decay = r.weight_decay * dlr if r.decoupled else 0.0
            out.append(x - scalar(decay, dt) * x - a)
            new_leaves.append({"m": m, "v": v, "s": s_new.astype(dt)})
        return T.unflatten(td, out), (t, new_leaves, new_glob)


def variants(rule):
    from refopt.conventions._variants import oracle_variant as v
    out = [v(rule, "per-array estimate", "d estimated per array (each leaf its own r and s) in place of one d over "
             "the whole tree", per_leaf=True),
           v(rule, "inner product with this step's s", "<g, s_t / (sqrt(v_t) + eps)> after the update in place of "
             "s_{t-1} and v_{t-1} before it", new_s=True),
           v(rule, "bias correction toggled", "sqrt(1 - beta2^t) / (1 - beta1^t) in dlr " +
             ("left out" if rule.bias_correction else "applied"), flip_bias=True),
           v(rule, "moments of g", "m of g with the step dlr m / (sqrt(v) + eps) in place of m of dlr g (eps then "
             "scales with d)", moments_of_g=True)]
    if rule.growth_rate != math.inf:
        out.append(v(rule, "growth rate dropped", f"d_{{t+1}} = max(d_t, hat d_t) without the bound "
                     f"{rule.growth_rate} d_t", no_growth=True))
    return out


def facts(rule, of):
    """d is a ratio of sums of degree 1 in g (r reads g and s / sqrt(v), of degrees 1 and 0; s is linear in g),
    and m / (sqrt(v) + eps) has degree 1 in dlr and 0 in g (eps -> 0): the step is gradient-scale free without
    coupled decay. The l1 norm of s is not orthogonally invariant; permutations keep it."""
    return {"grad_scale": rule.weight_decay == 0 or rule.decoupled, "step_scale_free": False, "orthogonal": False,
            "elementwise": True}


_LR = (lambda v: not callable(v), "refopt takes a constant multiplier here (a schedule goes on the rule's "
                                  "schedule=, read at t where optax reads its count t - 1)")


def _dadaptation(lr, betas, eps, weight_decay, decouple, use_bias_correction, d0, growth_rate):
    return DAdaptAdam(lr=lr, beta1=betas[0], beta2=betas[1], eps=eps, d0=d0, growth_rate=growth_rate,
                      weight_decay=weight_decay, decoupled=decouple, bias_correction=use_bias_correction)


def _optax(learning_rate, betas, eps, estim_lr0, weight_decay):
    return DAdaptAdam(lr=learning_rate, beta1=betas[0], beta2=betas[1], eps=eps, d0=estim_lr0,
                      weight_decay=weight_decay, decoupled=True, bias_correction=True)


def _match_optax(rule):
    if type(rule) is not DAdaptAdam or rule.schedule is not None or not rule.bias_correction \
            or rule.growth_rate != math.inf or not (rule.decoupled or rule.weight_decay == 0):
        return None
    return dict(learning_rate=rule.lr, betas=(rule.beta1, rule.beta2), eps=rule.eps, estim_lr0=rule.d0,
                weight_decay=rule.weight_decay)


def _match_dadaptation(rule):
    if type(rule) is not DAdaptAdam or rule.schedule is not None:
        return None
    return dict(lr=rule.lr, betas=(rule.beta1, rule.beta2), eps=rule.eps, weight_decay=rule.weight_decay,
                decouple=rule.decoupled, use_bias_correction=rule.bias_correction, d0=rule.d0,
                growth_rate=rule.growth_rate)


OPTAX = PeerMapping("optax.contrib.dadapt_adamw", "optax", "contrib.dadapt_adamw",
                    dict(learning_rate=1.0, betas=(0.9, 0.999), eps=1e-8, estim_lr0=1e-6, weight_decay=0.0),
                    _optax, "dadapt_adam", refuse={"betas": BETAS2, "learning_rate": _LR},
                    state={"m": "exp_avg", "v": "exp_avg_sq", "s": "grad_sum"}, match=_match_optax)

DADAPTATION = PeerMapping(
    "dadaptation.DAdaptAdam", "dadaptation", "DAdaptAdam",
    dict(lr=1.0, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, decouple=False, use_bias_correction=False,
         d0=1e-6, growth_rate=math.inf), _dadaptation, "dadapt_adam", ignore=("log_every",),
    refuse={"betas": BETAS2,
            "lr": (lambda v: not callable(v) and v > 0, "dadaptation.DAdaptAdam needs lr > 0 (it raises "
                                                         "'Invalid learning rate')"),
            "fsdp_in_use": (lambda v: v is False, "refopt reproduces the single-process step only")},
    state={"m": "exp_avg", "v": "exp_avg_sq", "s": "s"}, match=_match_dadaptation)


def atlas_dadapt_adam():
    from refopt.crosscheck.atlas import Entry, Pair, peer_side, restated_side

    o = OPTAX.preset("optax.contrib.dadapt_adamw", dict(learning_rate=1.0), "atlas")
    p = DADAPTATION.preset("dadaptation.DAdaptAdam", dict(lr=1.0), "atlas")
    p_bc = DADAPTATION.preset("dadaptation.DAdaptAdam(bc)", dict(lr=1.0, use_bias_correction=True), "atlas")
    p_growth = DADAPTATION.preset("dadaptation.DAdaptAdam(growth)", dict(lr=1.0, growth_rate=1.02), "atlas")
    paper = DAdaptAdam()
    return Entry(
        "dadapt-adam-growth-bias-correction",
        "optax.contrib.dadapt_adamw (always bias-corrected, no growth bound) vs dadaptation.DAdaptAdam (not "
        "corrected by default; growth_rate bounds d_{t+1} <= rho d_t)",
        (peer_side("optax", o, source="optax 0.2.8: dlr = d lr sqrt(1 - beta2^t) / (1 - beta1^t), "
                                      "d = max(d, hat d), decoupled decay only"),
         peer_side("dadaptation", p, source="dadaptation 3.2: use_bias_correction=False, growth_rate=inf, "
                                            "decouple=False by default"),
         peer_side("dadaptation-bc", p_bc, source="dadaptation 3.2, use_bias_correction=True"),
         peer_side("dadaptation-growth", p_growth, source="dadaptation 3.2, growth_rate=1.02"),
         restated_side("paper", "Defazio & Mishchenko 2023, the Adam version: d_{k+1} = max(d_k, hat d_{k+1})",
                       lambda: paper, oracle=lambda: DAdaptAdamOracle(paper),
                       source="the paper's algorithm, without a bound on the growth of d")),
        (Pair("optax", "dadaptation", "final", 1e-3, what="params after 50 steps: bias-corrected dlr or not"),
         Pair("optax", "dadaptation-bc", "final", 1e-12, kind="max",
              what="with use_bias_correction=True dadaptation steps as optax"),
         Pair("dadaptation", "dadaptation-growth", "final", 1e-6,
              what="growth_rate 1.02 bounds how fast d may rise"),
         Pair("dadaptation", "paper", "final", 1e-12, kind="max",
              what="dadaptation's default growth_rate=inf is the paper's max(d, hat d)")),
        "The paper's Adam version sets d_{k+1} = max(d_k, hat d_{k+1}) with no bound on the growth of d; "
        "dadaptation's growth_rate (inf by default) is the packages' safeguard, and optax has none. optax "
        "always applies Adam's bias correction to dlr, dadaptation only with use_bias_correction=True; with it "
        "the two packages agree to rounding. dadaptation's weight decay is L2 (decouple=False) by default, "
        "optax's only form is AdamW's decoupled decay.",
        "Defazio & Mishchenko 2023 (ICML), the Adam version; dadaptation 3.2; optax.contrib.dadapt_adamw 0.2.8")


_NOT_LEAFWISE = {"not_leafwise": "the estimate d is one number over the whole tree (each leaf alone gets its own)"}
_STATE = ("m", "v", "s")

CONVENTIONS = Conventions(
    rules=(DAdaptAdam,),
    final="m_t / (sqrt(v_t) + eps) with m of dlr g and d from the whole tree's weighted sums: the inner product "
          "with the previous s and v, the bias correction, the growth bound or per-array estimates",
    per_step="the step size dlr_t = d_t lr_t bc_t and the estimate d_{t+1} = max(d_t, min(hat d_t, rho d_t))",
    mappings=(OPTAX, DADAPTATION),
    no_peer={"torch": "torch.optim ships no D-Adaptation",
             "schedulefree": "schedulefree ships the Schedule-Free optimizers only"},
    presets=(
        OPTAX.preset("optax.contrib.dadapt_adamw", dict(learning_rate=1.0),
                     "bias-corrected dlr, d = max(d, r / ((1 - sqrt(beta2)) |s|_1))"),
        OPTAX.preset("optax.contrib.dadapt_adamw(betas,wd)",
                     dict(learning_rate=0.5, betas=(0.95, 0.99), eps=1e-6, estim_lr0=1e-4, weight_decay=0.01),
                     "non-default betas, eps, d_0 1e-4, decoupled decay 0.01"),
        DADAPTATION.preset("dadaptation.DAdaptAdam", dict(lr=1.0), "no bias correction, d = max(d, hat d)"),
        DADAPTATION.preset("dadaptation.DAdaptAdam(bc,growth,L2)",
                           dict(lr=0.5, betas=(0.95, 0.99), eps=1e-6, weight_decay=0.01, use_bias_correction=True,
                                d0=1e-4, growth_rate=1.05),
                           "bias correction, growth rate 1.05, L2 decay 0.01 in every sum"),
        DADAPTATION.preset("dadaptation.DAdaptAdam(decouple)",
                           dict(lr=1.0, weight_decay=0.05, decouple=True, d0=1e-4),
                           "decoupled decay 0.05 times dlr"),
    ),
    wrong=(Preset("WRONG bias correction: optax.contrib.dadapt_adamw vs refopt DAdaptAdam without it", "optax",
                  "dadapt_adam", ("contrib.dadapt_adamw", dict(learning_rate=1.0)),
                  lambda: DAdaptAdam(lr=1.0, decoupled=True),
                  "bias correction left out: dlr without sqrt(1 - beta2^t) / (1 - beta1^t)",
                  state={"m": "exp_avg", "v": "exp_avg_sq"}, expect_fail=True),
           Preset("WRONG step size: dadaptation.DAdaptAdam vs refopt SGD", "dadaptation", "dadapt_adam",
                  ("DAdaptAdam", dict(lr=1.0)), lambda: SGD(lr=1e-3), "a constant lr vs the estimate d", state={},
                  expect_fail=True)),
    oracle=DAdaptAdamOracle,
    atlas=(atlas_dadapt_adam,),
    variants=variants,
    facts=facts,
    golden=(GoldenCase("dadapt_adam", lambda: DAdaptAdam(), "dadaptation.DAdaptAdam's defaults", _STATE),
            GoldenCase("dadapt_adam_optax", lambda: DAdaptAdam(lr=0.5, beta1=0.95, beta2=0.99, eps=1e-6, d0=1e-4,
                                                               weight_decay=0.01, decoupled=True,
                                                               bias_correction=True),
                       "optax.contrib.dadapt_adamw with non-default betas, eps, d_0 and decay", _STATE),
            GoldenCase("dadapt_adam_growth_l2", lambda: DAdaptAdam(lr=0.5, d0=1e-4, growth_rate=1.05,
                                                                   weight_decay=0.01, bias_correction=True),
                       "dadaptation with a growth rate 1.05 and L2 decay", _STATE)),
    examples=(Example("dadapt_adam", lambda: DAdaptAdam(d0=1e-3), extra=_NOT_LEAFWISE),
              Example("dadapt_adam_bc_wd", lambda: DAdaptAdam(d0=1e-3, bias_correction=True, weight_decay=1e-3,
                                                              decoupled=True, growth_rate=1.1),
                      extra=_NOT_LEAFWISE),
              Example("dadapt_adam_l2", lambda: DAdaptAdam(d0=1e-3, weight_decay=1e-3, growth_rate=1.5),
                      extra=_NOT_LEAFWISE)),
)
