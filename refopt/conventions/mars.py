"""MARS (refopt/rules/mars.py) to pytorch_optimizer.MARS 4.1.0: the corrected gradient c_t = g_t + gamma beta1 /
(1 - beta1) (g_t - g_{t-1}) with g_0 = 0, clipped to unit norm per array, then AdamW with pytorch_optimizer's
denominator (sqrt(v + 1e-15) + eps) / sqrt(1 - beta2^t) or a sign step; arrays of one dimension (optimize_1d=False,
the default) take plain AdamW with their own lr_1d, betas_1d and weight_decay_1d (a Partition by ndim >= 2).
torch.optim and optax ship no MARS."""
from __future__ import annotations

import numpy as np

from refopt.conventions._spec import (
    BETAS2, HEAVYBALL_IGNORE, HEAVYBALL_REFUSE, NO_MAXIMIZE, CliName, Conventions, Example, Oracle, PeerMapping, Preset,
    counted, decoupled_decay_only, gamma, scalar)
from refopt.golden import GoldenCase
from refopt.rules.cautious import Cautious
from refopt.rules.mars import MARS
from refopt.rules.partition import Partition, at_least_2d_labels

#: pytorch_optimizer's ``exp_avg_sq_eps``, inside the square root of v
PYTORCH_OPTIMIZER_EPS_ROOT = 1e-15


class MARSOracle(Oracle):
    """MARS from the rule's docstring, array by array in numpy. Switches: ``clip`` False (c_t not clipped);
    ``v_of`` 'c' (v of the clipped c_t, the rule's) | 'g' (v of the raw gradient); ``k_form`` 'ratio'
    (gamma beta1 / (1 - beta1), the rule's) | 'gamma' (gamma alone); ``first_step`` overriding the rule's;
    ``eps_form`` overriding the rule's; ``keep`` overriding the rule's ``previous``: 'g' (g_prev = g_t) | 'c'
    (g_prev = c_t);
    ``counter`` {'bc1' | 'bc2': 'next' | 'prev' | 'frozen'}."""

    def init_leaf(self, x, path):
        return {"m": np.zeros_like(x), "v": np.zeros_like(x), "g_prev": np.zeros_like(x)}

    def direction_leaf(self, t, s, x, g, path):
        r, d, sw = self.rule, x.dtype, self.switches
        c = sw.get("counter", {})
        first = sw.get("first_step", r.first_step)
        k = r.gamma if sw.get("k_form", "ratio") == "gamma" else r.gamma * (r.beta1 / (1.0 - r.beta1))
        if t == 1 and first == "g1":
            k = 0.0
        ct = g + scalar(k, d) * (g - s["g_prev"])
        n = float(np.sqrt(np.sum(ct.astype(np.float64) ** 2)))
        if sw.get("clip", True) and r.max_norm is not None and n > r.max_norm:
            ct = ct * scalar(r.max_norm / n, d)
        s["g_prev"] = ct.copy() if sw.get("keep", r.previous) == "c" else g.copy()
        s["m"] = scalar(r.beta1, d) * s["m"] + scalar(1.0 - r.beta1, d) * ct
        if r.kind == "lion":
            return np.sign(s["m"])
        sq = g if sw.get("v_of", "c") == "g" else ct
        s["v"] = scalar(r.beta2, d) * s["v"] + scalar(1.0 - r.beta2, d) * (sq * sq)
        bc1 = 1.0 - r.beta1 ** counted(t, c.get("bc1"))
        bc2 = 1.0 - r.beta2 ** counted(t, c.get("bc2"))
        form = sw.get("eps_form", r.eps_form)
        if form == "raw":
            den = (np.sqrt(s["v"] + scalar(r.eps_root, d)) + scalar(r.eps, d)) / scalar(np.sqrt(bc2), d)
        elif form == "max":
            den = np.maximum(np.sqrt(s["v"] / scalar(bc2, d) + scalar(r.eps_root, d)), scalar(r.eps, d))
        else:
            den = np.sqrt(s["v"] / scalar(bc2, d) + scalar(r.eps_root, d)) + scalar(r.eps, d)
        return s["m"] / scalar(bc1, d) / den

    def step_leaf(self, t, s, x, g, path):
        r = self.rule
        lr = r.lr * gamma(r.schedule, t)
        u = self.direction_leaf(t, s, x, g, path)
        return scalar(1.0 - lr * r.weight_decay, x.dtype) * x - scalar(lr, x.dtype) * u


def variants(rule):
    from refopt.conventions._variants import oracle_variant as v
    other = "c" if rule.previous == "g" else "g"
    say = {"g": "g_t", "c": "this step's corrected c_t"}
    out = [v(rule, f"g_prev holds {other}", f"the stored previous gradient is {say[other]} in place of "
             f"{say[rule.previous]}", keep=other),
           v(rule, "k without beta1 / (1 - beta1)", "c_t = g_t + gamma (g_t - g_{t-1}) in place of "
             "g_t + gamma beta1 / (1 - beta1) (g_t - g_{t-1})", k_form="gamma")]
    if rule.max_norm is not None:
        out.append(v(rule, "no clip", "c_t unclipped in place of c_t max_norm / ||c_t|| where ||c_t|| > max_norm",
                     clip=False))
    if rule.gamma > 0:
        other = "g1" if rule.first_step == "zero" else "zero"
        say = {"g1": "c_1 = g_1 (the paper's x_1 = x_0)", "zero": "g_0 = 0, c_1 = (1 + k) g_1"}
        out.append(v(rule, f"first step {other}", f"{say[other]} in place of {say[rule.first_step]}",
                     first_step=other))
    if rule.kind == "adamw":
        other = "raw" if rule.eps_form == "hat" else "hat"
        say = {"hat": "sqrt(v_hat) + eps", "raw": "(sqrt(v) + eps) / sqrt(1 - beta2^t)", "max": "max(sqrt(v_hat), eps)"}
        out += [v(rule, "v of the raw gradient", "v_t from g_t^2 in place of the clipped c_t^2", v_of="g"),
                v(rule, f"eps form {other}", f"{say[other]} in place of {say[rule.eps_form]}", eps_form=other)]
    return out


def counters(rule):
    return () if rule.kind == "lion" else (("bc1", "1 - beta1^t"), ("bc2", "1 - beta2^t"))


def facts(rule, of):
    """Without the clip, m_hat / sqrt(v_hat) ('adamw', eps -> 0) and sign(m) ('lion') have degree 0 in g (c_t
    is linear in the gradients; the decoupled decay does not read g); the clip makes the step depend on ||c_t||
    where it switches. The norm is over the whole array, which permutations keep (``elementwise``)."""
    return {"grad_scale": rule.max_norm is None, "step_scale_free": False, "elementwise": True}


def _match_hidden(rule):
    if type(rule) is not MARS or rule.schedule is not None or rule.eps_form != "raw" or rule.first_step != "zero" \
            or rule.previous != "g" \
            or rule.eps_root != PYTORCH_OPTIMIZER_EPS_ROOT or rule.max_norm != 1.0:
        return None
    return dict(lr=rule.lr, betas=(rule.beta1, rule.beta2), gamma=rule.gamma, mars_type=rule.kind, optimize_1d=True,
                weight_decay=rule.weight_decay, weight_decouple=True, eps=rule.eps)


def _match(rule):
    """pytorch_optimizer.MARS(optimize_1d=True) for a bare MARS; ``optimize_1d=False`` for the Partition the
    mapping builds (the 'other' group plain AdamW: gamma 0, no clip, the same eps)."""
    if not isinstance(rule, Partition):
        return _match_hidden(rule)
    if set(rule.rules) != {"hidden", "other"} or rule.labels is not at_least_2d_labels:
        return None
    h, o = _match_hidden(rule.rules["hidden"]), rule.rules["other"]
    if h is None or type(o) is not MARS or o.schedule is not None or o.gamma != 0 or o.max_norm is not None \
            or o.kind != "adamw" or o.eps_form != "raw" or o.eps_root != PYTORCH_OPTIMIZER_EPS_ROOT \
            or o.eps != h["eps"] or o.previous != "g":
        return None
    return {**h, "optimize_1d": False, "lr_1d": o.lr, "betas_1d": (o.beta1, o.beta2), "weight_decay_1d": o.weight_decay}


def _pytorch_optimizer(lr, betas, gamma, mars_type, optimize_1d, lr_1d, betas_1d, weight_decay, weight_decay_1d,
                       weight_decouple, fixed_decay, cautious, eps):
    decoupled_decay_only("MARS", weight_decay > 0 or (weight_decay_1d > 0 and not optimize_1d), weight_decouple,
                         fixed_decay, "before c_t")
    if cautious and mars_type == "lion":
        raise ValueError("cautious=True with mars_type='lion': pytorch_optimizer takes the sign after the mask, "
                         "which drops the mask's rescale n / (k + 1); refopt's Cautious keeps it")

    def group(b1, b2, k_gamma, lr_g, wd, **kw):
        own = {} if cautious else dict(lr=lr_g, weight_decay=wd)   # Cautious decays and steps itself
        rule = MARS(beta1=b1, beta2=b2, gamma=k_gamma, eps=eps, eps_root=PYTORCH_OPTIMIZER_EPS_ROOT, eps_form="raw",
                    **own, **kw)
        return Cautious(rule, lr=lr_g, weight_decay=wd) if cautious else rule

    hidden = group(betas[0], betas[1], gamma, lr, weight_decay, kind=mars_type)
    if optimize_1d:
        return hidden
    # pytorch_optimizer steps the 1-D arrays by lr (lr_1d / lr), its lr_1d_factor
    other = group(betas_1d[0], betas_1d[1], 0.0, lr * (lr_1d / lr), weight_decay_1d, max_norm=None)
    return Partition(rules={"hidden": hidden, "other": other}, labels=at_least_2d_labels)


PYTORCH_OPTIMIZER = PeerMapping(
    "pytorch_optimizer.MARS", "pytorch_optimizer", "MARS",
    dict(lr=3e-3, betas=(0.95, 0.99), gamma=0.025, mars_type="adamw", optimize_1d=False, lr_1d=3e-3,
         betas_1d=(0.9, 0.95), weight_decay=0.0, weight_decay_1d=0.1, weight_decouple=True, fixed_decay=False,
         ams_bound=False, cautious=False, eps=1e-8),
    _pytorch_optimizer, "mars", ignore=("foreach",),
    refuse={"mars_type": (lambda v: v in ("adamw", "lion"),
                          "mars_type='shampoo' runs Newton-Schulz in bfloat16 on the momentum; refopt's MARS "
                          "covers 'adamw' and 'lion'"),
            "ams_bound": (lambda v: v is False, "ams_bound=True bounds by the running maximum of v; refopt's MARS "
                                                "has no AMSGrad bound"),
            "lr": (lambda v: v > 0, "pytorch_optimizer divides lr_1d by lr (its lr_1d_factor): lr must be > 0"),
            "betas": BETAS2, "betas_1d": BETAS2,
            "maximize": NO_MAXIMIZE},
    state={"m": "exp_avg", "v": "exp_avg_sq", "g_prev": "last_grad"}, match=_match)


def heavyball_gamma(mars_gamma: float, beta1: float) -> float:
    """The refopt ``gamma`` of heavyball 3.2.1's ``mars_gamma``: heavyball calls ``mars_correction(g, old_g,
    beta1, gamma)`` with (mars_gamma, beta1) in that order, so its factor is beta1 gamma / (1 - gamma) in place of
    gamma beta1 / (1 - beta1); refopt's k = gamma beta1 / (1 - beta1) equals it at gamma (1 - beta1) / (1 - gamma)."""
    return mars_gamma * (1.0 - beta1) / (1.0 - mars_gamma)


def _heavyball(lr, betas, eps, weight_decay, mars, mars_gamma, storage_dtype):
    b1, b2 = betas
    return MARS(lr=lr, beta1=b1, beta2=b2, gamma=heavyball_gamma(mars_gamma, b1), eps=eps, weight_decay=weight_decay,
                max_norm=None, eps_form="max", previous="c")


def _match_heavyball(rule):
    m = rule
    if type(m) is not MARS or m.schedule is not None or m.max_norm is not None or m.eps_form != "max" \
            or m.eps_root != 0.0 or m.first_step != "zero" or m.kind != "adamw" or m.previous != "c":
        return None
    k = m.gamma * (m.beta1 / (1.0 - m.beta1))        # = beta1 g / (1 - g) for heavyball's mars_gamma g
    return dict(lr=m.lr, betas=(m.beta1, m.beta2), eps=m.eps, weight_decay=m.weight_decay, mars=True,
                mars_gamma=k / (m.beta1 + k) if m.beta1 + k > 0 else 0.0, storage_dtype="float64")


_HB_OFF = (lambda v: not v, "an option refopt's MARS does not have")

HEAVYBALL = PeerMapping(
    "heavyball.AdamW", "heavyball", "AdamW",
    dict(lr=0.0025, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.0, mars=False, mars_gamma=0.0025,
         storage_dtype="float32"), _heavyball, "mars", ignore=HEAVYBALL_IGNORE,
    refuse={"mars": (lambda v: v is True, "refopt maps heavyball.AdamW's MARS form (mars=True): the corrected "
                                          "gradient without a clip, max(sqrt(v_hat), eps)"),
            "mars_gamma": (lambda v: 0.0 <= v < 1.0, "mars_gamma must be in [0, 1): heavyball divides by "
                                                     "1 - mars_gamma"),
            "betas": BETAS2,
            "caution": (lambda v: not v, "with mars=True heavyball writes c_t into the gradient, so its caution "
                                         "compares the update with c_t; refopt's Cautious compares it with g"),
            "cautious_weight_decay": _HB_OFF, "palm": (lambda v: v is not True, "palm=True schedules beta2"),
            **HEAVYBALL_REFUSE},
    state={}, match=_match_heavyball)   # heavyball nests its state (state[p][0][...]): compared through x


def atlas_mars_heavyball():
    from refopt.crosscheck.atlas import Entry, Pair, peer_side, restated_side

    kw = dict(lr=3e-3, betas=(0.95, 0.99), mars=True, mars_gamma=0.025, storage_dtype="float64")
    hb = HEAVYBALL.preset("heavyball.AdamW(mars)", kw, "atlas")
    same = dict(lr=3e-3, max_norm=None, eps_form="max")
    factor = MARS(gamma=0.025, previous="c", **same)                         # the paper's k, heavyball's c_{t-1}
    recursion = MARS(gamma=heavyball_gamma(0.025, 0.95), **same)             # heavyball's k, the paper's g_{t-1}
    paper = MARS(lr=3e-3, gamma=0.025)
    return Entry(
        "mars-heavyball-correction",
        "heavyball's MARS (AdamW(mars=True)): the factor beta1 gamma / (1 - gamma) in place of the paper's gamma "
        "beta1 / (1 - beta1), the previous corrected c_{t-1} in place of g_{t-1}, and no clip",
        (peer_side("heavyball", hb, source="heavyball 3.2.1: mars_correction(g, old_g, mars_gamma, beta1) against "
                                           "its signature (g, old_g, beta1, gamma); old_g holds c; no clip"),
         restated_side("paper's factor", "heavyball's step with the paper's k = gamma beta1 / (1 - beta1)",
                       lambda: factor, oracle=lambda: MARSOracle(factor), source="Yuan et al. 2024, the c_t of "
                                                                                "Algorithm 1"),
         restated_side("paper's g_prev", "heavyball's step with the paper's g_{t-1} in the correction",
                       lambda: recursion, oracle=lambda: MARSOracle(recursion), source="Yuan et al. 2024, the "
                                                                                     "c_t of Algorithm 1"),
         restated_side("paper", "Yuan et al. 2024, Algorithm 2 (MARS-AdamW, approximate): the factor, g_{t-1} and "
                       "Clip(c, 1)", lambda: paper, oracle=lambda: MARSOracle(paper), source="arXiv:2411.10438")),
        (Pair("heavyball", "paper's factor", "final", 1e-4,
              what="params after 50 steps, gamma 0.025, beta1 0.95: k = 0.024 vs 0.475"),
         Pair("heavyball", "paper's g_prev", "final", 1e-6,
              what="params after 50 steps: c_t = g_t + k (g_t - c_{t-1}) vs g_t + k (g_t - g_{t-1})"),
         Pair("paper's factor", "paper", "final", 1e-4, what="params after 50 steps: c_{t-1}, the clip, eps")),
        "The paper's corrected gradient is c_t = g_t + gamma beta1 / (1 - beta1) (g_t - g_{t-1}), clipped to unit "
        "norm. heavyball passes mars_gamma and beta1 to mars_correction in the opposite order of its parameters, "
        "so its factor is beta1 gamma / (1 - gamma) (about (1 - beta1) / (1 - gamma) of the paper's); it keeps "
        "the corrected c_{t-1} as the previous gradient and does not clip. like('heavyball.AdamW', mars=True, ...) "
        "reproduces it: MARS(gamma=gamma (1 - beta1) / (1 - gamma), previous='c', max_norm=None, eps_form='max').",
        "Yuan et al. 2024 (arXiv:2411.10438), Algorithms 1-2; heavyball 3.2.1 (chainable.mars, "
        "utils.mars_correction)")


def atlas_mars():
    from refopt.crosscheck.atlas import Entry, Pair, peer_side, restated_side

    p = PYTORCH_OPTIMIZER.preset("pytorch_optimizer.MARS", dict(lr=3e-3, optimize_1d=True), "atlas")
    authors = MARS(lr=3e-3)
    paper = MARS(lr=3e-3, first_step="g1")
    return Entry(
        "mars-first-step-eps",
        "MARS's first corrected gradient (g_0 = 0 in the code, c_1 = g_1 in the paper's x_1 = x_0) and where "
        "pytorch_optimizer adds eps",
        (peer_side("pytorch_optimizer", p, source="pytorch_optimizer 4.1.0: last_grad = 0 at init, denominator "
                                                  "(sqrt(v + 1e-15) + eps) / sqrt(1 - beta2^t)"),
         restated_side("authors' code", "AGI-Arena/MARS mars.py (approximate form): last_grad = 0 at init, "
                       "m_hat / (sqrt(v_hat) + eps)", lambda: authors, oracle=lambda: MARSOracle(authors),
                       source="the authors' code (Yuan et al. 2024)"),
         restated_side("paper", "Yuan et al. 2024, Algorithm 1: x_1 = x_0, so c_1 = g_1 (no correction at t = 1)",
                       lambda: paper, oracle=lambda: MARSOracle(paper), source="arXiv:2411.10438, Algorithm 1")),
        (Pair("pytorch_optimizer", "authors' code", "final", 1e-4, what="params after 50 steps: where eps enters"),
         Pair("authors' code", "paper", "final", 1e-4, what="params after 50 steps: the first step's correction")),
        "The paper sets x_1 = x_0, so its exact form has no correction at t = 1; the authors' code and "
        "pytorch_optimizer start from a zero previous gradient, so c_1 = (1 + gamma beta1 / (1 - beta1)) g_1 "
        "(its clip then bounds the difference). The paper and the authors' code add eps to sqrt(v_hat); "
        "pytorch_optimizer adds it (and 1e-15 inside the root) before dividing by sqrt(1 - beta2^t).",
        "Yuan et al. 2024 (arXiv:2411.10438), Algorithms 1-2; AGI-Arena/MARS; pytorch_optimizer 4.1.0")


_KW = dict(lr=1e-2, betas=(0.9, 0.95), gamma=0.05, weight_decay=0.05, eps=1e-6, optimize_1d=True)
_KW_1D = dict(lr=2e-3, betas=(0.9, 0.98), gamma=0.1, weight_decay=0.02, lr_1d=5e-3, betas_1d=(0.8, 0.9),
              weight_decay_1d=0.01, eps=1e-7)
_KW_LION = dict(lr=1e-3, mars_type="lion", betas=(0.9, 0.99), gamma=0.1, weight_decay=0.1, lr_1d=2e-3,
                betas_1d=(0.85, 0.9), weight_decay_1d=0.01)
_KW_HB = dict(lr=5e-3, betas=(0.95, 0.98), mars=True, mars_gamma=0.05, eps=1e-6, weight_decay=0.05,
              storage_dtype="float64")
_KW_CAUTIOUS = dict(lr=5e-3, betas=(0.9, 0.95), gamma=0.05, weight_decay=0.05, cautious=True, optimize_1d=True)

CONVENTIONS = Conventions(
    rules=(MARS,),
    final="m_hat / (sqrt(v_hat) + eps) (or sign(m)) of the corrected, clipped c_t: the correction's factor, the "
          "clip, the first step's g_0, what v squares or where eps enters",
    per_step="lr_t and the bias corrections 1 - beta1^t, 1 - beta2^t",
    mappings=(PYTORCH_OPTIMIZER, HEAVYBALL),
    no_peer={"torch": "torch.optim ships no MARS", "optax": "optax 0.2.8 ships no MARS",
             "schedulefree": "schedulefree ships the Schedule-Free optimizers only"},
    presets=(
        PYTORCH_OPTIMIZER.preset("pytorch_optimizer.MARS", dict(lr=3e-3),
                                 "MARS-AdamW on ndim >= 2, AdamW (betas_1d, weight_decay_1d 0.1) on vectors"),
        PYTORCH_OPTIMIZER.preset("pytorch_optimizer.MARS(betas,gamma,wd,eps,1d)", _KW,
                                 "every array MARS-AdamW: betas (0.9, 0.95), gamma 0.05, decay 0.05, eps 1e-6"),
        PYTORCH_OPTIMIZER.preset("pytorch_optimizer.MARS(lr_1d,betas_1d,wd_1d)", _KW_1D,
                                 "vectors by AdamW with lr_1d 5e-3, betas_1d (0.8, 0.9), weight_decay_1d 0.01"),
        PYTORCH_OPTIMIZER.preset("pytorch_optimizer.MARS(lion)", _KW_LION,
                                 "MARS-Lion: sign(m) of the clipped c_t, decay 0.1; vectors by AdamW"),
        PYTORCH_OPTIMIZER.preset("pytorch_optimizer.MARS(cautious)", _KW_CAUTIOUS,
                                 "the cautious mask on m_hat / den (product mask, rescale n / (k + 1))"),
        HEAVYBALL.preset("heavyball.AdamW(mars)", dict(lr=3e-3, mars=True, storage_dtype="float64"),
                         "c_t with heavyball's factor beta1 gamma / (1 - gamma), no clip; max(sqrt(v_hat), eps)"),
        HEAVYBALL.preset("heavyball.AdamW(mars,betas,gamma,wd,eps)", _KW_HB,
                         "betas (0.95, 0.98), mars_gamma 0.05, eps 1e-6, decay lr * 0.05 x"),
    ),
    wrong=(Preset("WRONG first step: pytorch_optimizer.MARS vs refopt MARS(first_step='g1')", "pytorch_optimizer",
                  "mars", ("MARS", dict(lr=1e-2, gamma=0.5, optimize_1d=True)),
                  lambda: MARS(lr=1e-2, gamma=0.5, eps_form="raw", eps_root=PYTORCH_OPTIMIZER_EPS_ROOT,
                               first_step="g1"),
                  "c_1 = g_1 (the paper's x_1 = x_0) against pytorch_optimizer's g_0 = 0",
                  state={"v": "exp_avg_sq"}, expect_fail=True),
           Preset("WRONG factor: heavyball.AdamW(mars) vs the paper's gamma beta1 / (1 - beta1)", "heavyball", "mars",
                  ("AdamW", _KW_HB),
                  lambda: MARS(lr=5e-3, beta1=0.95, beta2=0.98, gamma=0.05, eps=1e-6, weight_decay=0.05,
                               max_norm=None, eps_form="max"),
                  "the paper's factor against heavyball's swapped one", state={}, expect_fail=True)),
    oracle=MARSOracle,
    variants=variants,
    facts=facts,
    counters=counters,
    atlas=(atlas_mars, atlas_mars_heavyball),
    golden=(GoldenCase("mars", lambda: MARS(), "MARS-AdamW, the authors' defaults", ("m", "v", "g_prev")),
            GoldenCase("mars_lion_g1", lambda: MARS(lr=1e-3, kind="lion", gamma=0.1, weight_decay=0.1,
                                                     first_step="g1"),
                       "MARS-Lion, gamma 0.1, decay 0.1, the paper's c_1 = g_1", ("m", "g_prev")),
            GoldenCase("mars_pytorch_optimizer", lambda: PYTORCH_OPTIMIZER.rule(**_KW),
                       "like('pytorch_optimizer.MARS', betas (0.9, 0.95), gamma 0.05, wd 0.05, eps 1e-6, "
                       "optimize_1d)", ("m", "v", "g_prev"))),
    examples=(Example("mars", lambda: MARS(lr=1e-2)),
              Example("mars_unclipped", lambda: MARS(lr=1e-2, max_norm=None, gamma=0.1, eps_form="raw")),
              Example("mars_lion", lambda: MARS(lr=1e-3, kind="lion", weight_decay=1e-3), converges=False,
                      note="constant lr: each sign step has size about lr, so MARS-Lion orbits the minimum")),
    cli=(CliName("mars", MARS, {"mlp": 3e-3, "gpt": 3e-3}, "MARS-AdamW (the authors' form: gamma 0.025, the "
                 "corrected gradient clipped to unit norm per array): --beta1, --beta2, --eps, --weight-decay",
                 {"beta1": "beta1", "beta2": "beta2", "eps": "eps", "weight_decay": "weight_decay"}),),
)
