"""AdEMAMix and Simplified AdEMAMix (refopt/rules/ademamix.py) to optax.contrib.ademamix and
optax.contrib.simplified_ademamix: AdEMAMix adds alpha times a slow, uncorrected EMA m2 to Adam's m_hat; the
simplified form keeps one momentum that sums (no 1 - beta1) and adds alpha g. Both decay by lr * weight_decay.
optax takes alpha and beta3 as constants or as schedules of its count (from 0 at the first step); refopt takes
constants or the paper's warmup over T steps. torch.optim ships neither."""
from __future__ import annotations

import numpy as np

from refopt.conventions._spec import CONSTANT, HEAVYBALL_IGNORE, HEAVYBALL_REFUSE, NO_DTYPE, NO_MASK, CliName, \
    Conventions, Example, Oracle, PeerMapping, Preset, counted, decoupled_decay_only, gamma, scalar
from refopt.golden import GoldenCase
from refopt.rules.adam import AdamW
from refopt.rules.ademamix import AdEMAMix, SimplifiedAdEMAMix, alpha_warmup, beta3_warmup
from refopt.rules.cautious import Cautious


class AdEMAMixOracle(Oracle):
    """Both rules from their docstrings. Switches: ``slow_bc`` True bias-corrects m2 by 1 - beta3^t (AdEMAMix);
    ``average`` True makes the simplified m an average (1 - beta1) g; ``m_bc`` True bias-corrects the simplified
    m; ``counter`` {'bc1' | 'bc2' | 'warmup': 'next' | 'prev' | 'frozen'}."""

    def init_leaf(self, x, path):
        if isinstance(self.rule, SimplifiedAdEMAMix):
            return {"m": np.zeros_like(x), "v": np.zeros_like(x)}
        return {"m1": np.zeros_like(x), "m2": np.zeros_like(x), "v": np.zeros_like(x)}

    def direction_leaf(self, t, s, x, g, path):
        r, d, sw = self.rule, x.dtype, self.switches
        c = sw.get("counter", {})
        s["v"] = scalar(r.beta2, d) * s["v"] + scalar(1.0 - r.beta2, d) * (g * g)
        v_hat = s["v"] / scalar(1.0 - r.beta2 ** counted(t, c.get("bc2")), d)
        root = np.sqrt(v_hat + scalar(r.eps_root, d))
        if getattr(r, "eps_form", "add") == "max":
            den = np.maximum(root, scalar(r.eps, d))
        else:
            den = root + scalar(r.eps, d)
        if isinstance(r, SimplifiedAdEMAMix):
            w = 1.0 - r.beta1 if sw.get("average") else 1.0
            s["m"] = scalar(r.beta1, d) * s["m"] + scalar(w, d) * g
            m = s["m"] / scalar(1.0 - r.beta1 ** t, d) if sw.get("m_bc") else s["m"]
            return (m + scalar(r.alpha, d) * g) / den
        tw = counted(t, c.get("warmup"))
        b3 = beta3_warmup(tw, r.beta1, r.beta3, r.warmup, r.warmup_form)
        s["m1"] = scalar(r.beta1, d) * s["m1"] + scalar(1.0 - r.beta1, d) * g
        s["m2"] = scalar(b3, d) * s["m2"] + scalar(1.0 - b3, d) * g
        m1_hat = s["m1"] / scalar(1.0 - r.beta1 ** counted(t, c.get("bc1")), d)
        m2 = s["m2"] / scalar(1.0 - r.beta3 ** t, d) if sw.get("slow_bc") else s["m2"]
        return (m1_hat + scalar(alpha_warmup(tw, r.alpha, r.warmup), d) * m2) / den

    def step_leaf(self, t, s, x, g, path):
        r = self.rule
        lr = r.lr * gamma(r.schedule, t)
        u = self.direction_leaf(t, s, x, g, path)
        return x - scalar(lr, x.dtype) * (u + scalar(r.weight_decay, x.dtype) * x)


def variants(rule):
    from refopt.conventions._variants import oracle_variant as v
    if isinstance(rule, SimplifiedAdEMAMix):
        return [v(rule, "momentum as an average", "m = b1 m + (1 - b1) g in place of the sum m = b1 m + g",
                  average=True),
                v(rule, "m bias-corrected", "m / (1 - beta1^t) in the numerator", m_bc=True)]
    return [v(rule, "slow EMA bias-corrected", "m2 / (1 - beta3^t) in place of the uncorrected m2", slow_bc=True)]


def facts(rule, of):
    """(m1_hat + alpha m2) / sqrt(v_hat) has degree 0 in g (eps -> 0), without decay; per entry. Not step scale
    free: the numerator mixes EMAs of different lengths."""
    return {"grad_scale": rule.weight_decay == 0, "step_scale_free": False, "elementwise": True}


def _match(rule):
    if type(rule) is not AdEMAMix or rule.schedule is not None or rule.warmup is not None:
        return None
    return dict(learning_rate=rule.lr, b1=rule.beta1, b2=rule.beta2, b3=rule.beta3, alpha=rule.alpha, eps=rule.eps,
                eps_root=rule.eps_root, weight_decay=rule.weight_decay)


def _match_simplified(rule):
    if type(rule) is not SimplifiedAdEMAMix or rule.schedule is not None:
        return None
    return dict(learning_rate=rule.lr, b1=rule.beta1, b2=rule.beta2, alpha=rule.alpha, eps=rule.eps,
                eps_root=rule.eps_root, weight_decay=rule.weight_decay)


_SCHEDULED = (lambda v: not callable(v), "refopt takes a constant here, or the paper's warmup over T steps "
                                         "(AdEMAMix(warmup=T)); optax reads a schedule at its count t - 1")

OPTAX = PeerMapping("optax.contrib.ademamix", "optax", "contrib.ademamix",
                    dict(b1=0.9, b2=0.999, b3=0.9999, alpha=5.0, eps=1e-8, eps_root=0.0, mu_dtype=None,
                         weight_decay=0.0, mask=None),
                    lambda learning_rate, b1, b2, b3, alpha, eps, eps_root, weight_decay: AdEMAMix(
                        lr=learning_rate, beta1=b1, beta2=b2, beta3=b3, alpha=alpha, eps=eps, eps_root=eps_root,
                        weight_decay=weight_decay),
                    "ademamix", required=("learning_rate",),
                    refuse={"b3": _SCHEDULED, "alpha": _SCHEDULED, "mu_dtype": NO_DTYPE, "mask": NO_MASK,
                            "weight_decay": CONSTANT},
                    state={"m1": "m1", "m2": "m2", "v": "nu"}, match=_match)

OPTAX_SIMPLIFIED = PeerMapping(
    "optax.contrib.simplified_ademamix", "optax", "contrib.simplified_ademamix",
    dict(b1=0.99, b2=0.95, alpha=0.0, eps=1e-8, eps_root=0.0, weight_decay=0.0, mask=None),
    lambda learning_rate, b1, b2, alpha, eps, eps_root, weight_decay: SimplifiedAdEMAMix(
        lr=learning_rate, beta1=b1, beta2=b2, alpha=alpha, eps=eps, eps_root=eps_root, weight_decay=weight_decay),
    "ademamix", required=("learning_rate",), refuse={"alpha": CONSTANT, "mask": NO_MASK, "weight_decay": CONSTANT},
    state={"m": "m", "v": "n"}, match=_match_simplified)

def _warmup_steps(t):
    """pytorch_optimizer's ``t_alpha_beta3`` as the rule's integer ``warmup``."""
    if t is None:
        return None
    if isinstance(t, bool) or float(t) != int(t) or t < 1:
        raise ValueError(f"t_alpha_beta3={t!r}: refopt's warmup takes a whole number of steps >= 1")
    return int(t)


def _pytorch_optimizer(lr, betas, weight_decay, weight_decouple, fixed_decay, alpha, t_alpha_beta3, eps):
    decoupled_decay_only("AdEMAMix", weight_decay > 0, weight_decouple, fixed_decay, "before the EMAs")
    b1, b2, b3 = betas
    warmup = _warmup_steps(t_alpha_beta3)
    if warmup is not None and b1 <= 0.0:
        raise ValueError("betas[0]=0 with t_alpha_beta3: pytorch_optimizer takes log(0); refopt keeps beta3")
    return AdEMAMix(lr=lr, beta1=b1, beta2=b2, beta3=b3, alpha=alpha, eps=eps, weight_decay=weight_decay,
                    warmup=warmup)


def _match_pytorch_optimizer(rule):
    if type(rule) is not AdEMAMix or rule.schedule is not None or rule.eps_root != 0.0:
        return None
    if rule.warmup is not None and rule.beta1 <= 0.0:
        return None
    return dict(lr=rule.lr, betas=(rule.beta1, rule.beta2, rule.beta3), weight_decay=rule.weight_decay,
                weight_decouple=True, alpha=rule.alpha, t_alpha_beta3=rule.warmup, eps=rule.eps)


PYTORCH_OPTIMIZER = PeerMapping(
    "pytorch_optimizer.AdEMAMix", "pytorch_optimizer", "AdEMAMix",
    dict(lr=1e-3, betas=(0.9, 0.999, 0.9999), weight_decay=0.0, weight_decouple=False, fixed_decay=False, alpha=5.0,
         t_alpha_beta3=None, eps=1e-8), _pytorch_optimizer, "ademamix", ignore=("foreach",),
    refuse={"maximize": (lambda v: v is False, "maximize=True ascends: negate the loss"),
            "cautious": (lambda v: not v, "cautious=True masks the fast EMA where its sign differs from g"),
            "stable_adamw": (lambda v: not v, "stable_adamw=True divides the step by an RMS of g^2 / v")},
    state={"m1": "exp_avg", "m2": "exp_avg_slow", "v": "exp_avg_sq"}, match=_match_pytorch_optimizer)

def _heavyball(lr, betas, eps, weight_decay, alpha, beta3_warmup, alpha_warmup, storage_dtype, caution):
    b3w = None if beta3_warmup is None or beta3_warmup <= 0 else beta3_warmup
    aw = None if alpha_warmup is None or alpha_warmup <= 0 else alpha_warmup
    if b3w != aw:
        raise ValueError(f"beta3_warmup={beta3_warmup!r} and alpha_warmup={alpha_warmup!r} differ; refopt's "
                         "AdEMAMix warms alpha and beta3 up over one T (pass the same steps to both)")
    b1, b2, b3 = betas
    rule = AdEMAMix(lr=lr, beta1=b1, beta2=b2, beta3=b3, alpha=alpha, eps=eps,
                    weight_decay=0.0 if caution else weight_decay, warmup=None if aw is None else int(aw),
                    warmup_form="heavyball", eps_form="max")
    if caution:   # heavyball's caution: the sign-bit mask, rescaled by n / max(k, 1)
        return Cautious(rule, lr=lr, weight_decay=weight_decay, mask="signbit")
    return rule


def _match_heavyball(rule):
    if type(rule) is Cautious and rule.mask == "signbit" and rule.schedule is None:
        base = _match_heavyball(rule.base)
        return None if base is None else {**base, "lr": rule.lr, "weight_decay": rule.weight_decay, "caution": True}
    if type(rule) is not AdEMAMix or rule.schedule is not None or rule.eps_root != 0.0 \
            or rule.eps_form != "max" or (rule.warmup is not None and rule.warmup_form != "heavyball"):
        return None
    return dict(lr=rule.lr, betas=(rule.beta1, rule.beta2, rule.beta3), eps=rule.eps,
                weight_decay=rule.weight_decay, alpha=rule.alpha, beta3_warmup=rule.warmup, alpha_warmup=rule.warmup,
                storage_dtype="float64", caution=False)


_OFF = (lambda v: not v, "an option refopt's AdEMAMix does not have (cautious decay, MARS)")

HEAVYBALL = PeerMapping(
    "heavyball.AdEMAMix", "heavyball", "AdEMAMix",
    dict(lr=1e-3, betas=(0.9, 0.999, 0.9999), eps=1e-8, weight_decay=0.0, alpha=2.0, beta3_warmup=None,
         alpha_warmup=None, storage_dtype="float32", caution=False), _heavyball, "ademamix",
    ignore=HEAVYBALL_IGNORE, refuse={**HEAVYBALL_REFUSE, "cautious_weight_decay": _OFF, "mars": _OFF},
    state={}, match=_match_heavyball)   # heavyball nests its state (state[p][0][...]): compared through x

def atlas_ademamix():
    from refopt.crosscheck.atlas import Entry, Pair, peer_side, restated_side

    kw = dict(lr=1e-2, betas=(0.8, 0.95, 0.99), alpha=3.0, eps=1e-6)
    o = OPTAX.preset("optax.contrib.ademamix", dict(learning_rate=1e-2, b1=0.8, b2=0.95, b3=0.99, alpha=3.0,
                                                    eps=1e-6), "atlas")
    po = PYTORCH_OPTIMIZER.preset("pytorch_optimizer.AdEMAMix(warmup)", dict(kw, t_alpha_beta3=20), "atlas")
    hb = HEAVYBALL.preset("heavyball.AdEMAMix(warmup)", dict(kw, beta3_warmup=20, alpha_warmup=20,
                                                            storage_dtype="float64"), "atlas")
    po_def = PYTORCH_OPTIMIZER.preset("pytorch_optimizer.AdEMAMix", dict(lr=1e-2), "atlas")
    hb_def = HEAVYBALL.preset("heavyball.AdEMAMix", dict(lr=1e-2, storage_dtype="float64"), "atlas")
    paper = AdEMAMix(lr=1e-2, beta1=0.8, beta2=0.95, beta3=0.99, alpha=3.0, eps=1e-6, warmup=20)
    return Entry(
        "ademamix-warmup-alpha",
        "AdEMAMix's alpha and beta3 warmups and default alpha across optax.contrib, pytorch_optimizer and heavyball",
        (peer_side("optax", o, source="optax 0.2.8: alpha and b3 constants unless the caller passes schedules"),
         peer_side("pytorch_optimizer-warmup", po, source="pytorch_optimizer 4.1.0, t_alpha_beta3=20: the paper's "
                                                          "schedulers"),
         peer_side("heavyball-warmup", hb, source="heavyball 3.2.1, beta3_warmup=alpha_warmup=20: ln(b + 1e-8) in "
                                                  "the beta3 warmup, max(sqrt(v_hat), eps)"),
         peer_side("pytorch_optimizer", po_def, source="pytorch_optimizer 4.1.0 defaults: alpha 5"),
         peer_side("heavyball", hb_def, source="heavyball 3.2.1 defaults: alpha 2"),
         restated_side("paper", "Pagliardini et al. 2024, Sec. 3: alpha_t = min(t alpha / T, alpha), beta3_t linear "
                       "in the half-life", lambda: paper, oracle=lambda: AdEMAMixOracle(paper),
                       source="the paper's schedulers over T = 20 steps")),
        (Pair("optax", "pytorch_optimizer-warmup", "final", 1e-3,
              what="params after 50 steps: constant alpha and beta3 vs the 20-step warmups"),
         Pair("pytorch_optimizer-warmup", "paper", "final", 1e-12, kind="max",
              what="pytorch_optimizer's schedulers are the paper's"),
         Pair("pytorch_optimizer-warmup", "heavyball-warmup", "final", 1e-6,
              what="heavyball's 1e-8 inside the logs of the beta3 warmup and its max(sqrt(v_hat), eps)"),
         Pair("pytorch_optimizer", "heavyball", "final", 1e-3, what="the default alpha: 5 vs 2")),
        "The paper (Pagliardini et al. 2024) warms alpha up linearly and beta3 linearly in the half-life over T "
        "steps; pytorch_optimizer's t_alpha_beta3 follows it to rounding. optax.contrib.ademamix has no warmup of "
        "its own (alpha and b3 take schedules from the caller; constants by default). heavyball adds 1e-8 to "
        "beta1 and beta3 inside the logs of the beta3 warmup, clips it below 1 - 1e-8, and takes "
        "max(sqrt(v_hat), eps) in place of sqrt(v_hat) + eps; its default alpha is 2 where optax and pytorch_optimizer take 5.",
        "Pagliardini, Ablin & Grangier 2024, Sec. 3; optax.contrib.ademamix 0.2.8; pytorch_optimizer 4.1.0; "
        "heavyball 3.2.1")


_KW = dict(learning_rate=1e-2, b1=0.8, b2=0.95, b3=0.99, alpha=3.0, eps=1e-6, eps_root=1e-10, weight_decay=0.05)
_KW_PO = dict(lr=1e-2, betas=(0.8, 0.95, 0.99), alpha=3.0, t_alpha_beta3=7, eps=1e-6, weight_decay=0.05,
              weight_decouple=True)
_KW_HB = dict(lr=1e-2, betas=(0.8, 0.95, 0.99), alpha=3.0, beta3_warmup=7, alpha_warmup=7, eps=1e-6,
              weight_decay=0.05, storage_dtype="float64")
_KW_S = dict(learning_rate=1e-3, b1=0.9, b2=0.99, alpha=2.0, eps=1e-6, eps_root=1e-10, weight_decay=0.05)

CONVENTIONS = Conventions(
    rules=(AdEMAMix, SimplifiedAdEMAMix),
    final="(m1_hat + alpha m2) / (sqrt(v_hat) + eps) (simplified: (m + alpha g) / (sqrt(v_hat) + eps)): whether m2 "
          "or m is bias-corrected, the weight alpha, or where eps_root is added",
    per_step="the bias corrections 1 - beta1^t and 1 - beta2^t, and the warmups of alpha and beta3",
    counters=(("bc1", "the bias correction of m1 (1 - beta1^t)"), ("bc2", "the bias correction of v (1 - beta2^t)"),
              ("warmup", "the step of the alpha and beta3 warmups")),
    mappings=(OPTAX, OPTAX_SIMPLIFIED, PYTORCH_OPTIMIZER, HEAVYBALL),
    no_peer={"torch": "torch.optim ships no AdEMAMix",
             "schedulefree": "schedulefree ships the Schedule-Free optimizers only"},
    presets=(
        OPTAX.preset("optax.contrib.ademamix", dict(learning_rate=1e-3), "(m1_hat + 5 m2) / (sqrt(v_hat) + eps), "
                     "m2 the uncorrected EMA with beta3 0.9999"),
        OPTAX.preset("optax.contrib.ademamix(betas,alpha,wd)", _KW, "betas (0.8, 0.95, 0.99), alpha 3, eps_root "
                     "1e-10, decay lr * 0.05 x"),
        OPTAX_SIMPLIFIED.preset("optax.contrib.simplified_ademamix", dict(learning_rate=1e-4),
                                "m = 0.99 m + g; alpha 0: m / (sqrt(v_hat) + eps)"),
        OPTAX_SIMPLIFIED.preset("optax.contrib.simplified_ademamix(alpha,wd)", _KW_S,
                                "(m + 2 g) / (sqrt(v_hat) + eps), decay lr * 0.05 x"),
        PYTORCH_OPTIMIZER.preset("pytorch_optimizer.AdEMAMix", dict(lr=1e-3), "optax's arithmetic, alpha 5"),
        PYTORCH_OPTIMIZER.preset("pytorch_optimizer.AdEMAMix(betas,warmup,wd)", _KW_PO,
                                 "the paper's warmups over 7 steps, decoupled decay lr * 0.05 x"),
        HEAVYBALL.preset("heavyball.AdEMAMix(float64)", dict(lr=1e-3, storage_dtype="float64"),
                         "alpha 2, max(sqrt(v_hat), eps), float64 state"),
        HEAVYBALL.preset("heavyball.AdEMAMix(betas,warmup,wd)", _KW_HB,
                         "heavyball's beta3 warmup (1e-8 inside the logs) over 7 steps, decay lr * 0.05 x"),
        HEAVYBALL.preset("heavyball.AdEMAMix(caution,betas,wd)", dict(_KW_HB, caution=True),
                         "caution: the update kept where its sign bit is g's, times n / max(k, 1); decay lr * 0.05 x"),
    ),
    wrong=(Preset("WRONG slow EMA: optax.contrib.ademamix vs refopt AdamW", "optax", "ademamix",
                  ("contrib.ademamix", _KW),
                  lambda: AdamW(lr=1e-2, beta1=0.8, beta2=0.95, eps=1e-6, weight_decay=0.05),
                  "AdamW's m_hat alone vs m1_hat + alpha m2", state={}, expect_fail=True),
           Preset("WRONG mask: heavyball.AdEMAMix(caution) vs refopt's product mask", "heavyball", "ademamix",
                  ("AdEMAMix", dict(_KW_HB, caution=True)),
                  lambda: Cautious(AdEMAMix(beta1=0.8, beta2=0.95, beta3=0.99, alpha=3.0, eps=1e-6, warmup=7,
                                            warmup_form="heavyball", eps_form="max"), lr=1e-2, weight_decay=0.05),
                  "u g > 0 and n / (k + 1) vs the sign bits and n / max(k, 1)", state={}, expect_fail=True),
           Preset("WRONG warmup form: heavyball.AdEMAMix vs the paper's beta3 warmup", "heavyball", "ademamix",
                  ("AdEMAMix", _KW_HB),
                  lambda: AdEMAMix(lr=1e-2, beta1=0.8, beta2=0.95, beta3=0.99, alpha=3.0, eps=1e-6,
                                   weight_decay=0.05, warmup=7, eps_form="max"),
                  "ln(b + 1e-8) vs ln b in the beta3 warmup", state={}, expect_fail=True),),
    oracle=AdEMAMixOracle,
    atlas=(atlas_ademamix,),
    variants=variants,
    facts=facts,
    golden=(GoldenCase("ademamix", lambda: AdEMAMix(lr=1e-3), "optax.contrib.ademamix's defaults", ("m1", "m2", "v")),
            GoldenCase("ademamix_warmup", lambda: AdEMAMix(lr=1e-2, beta1=0.8, beta2=0.95, beta3=0.99, alpha=3.0,
                                                           weight_decay=0.05, warmup=4),
                       "AdEMAMix with the paper's alpha and beta3 warmups over 4 steps, decay 0.05",
                       ("m1", "m2", "v")),
            GoldenCase("simplified_ademamix", lambda: SimplifiedAdEMAMix(lr=1e-3, alpha=2.0),
                       "Simplified AdEMAMix, alpha 2", ("m", "v"))),
    examples=(Example("ademamix", lambda: AdEMAMix(lr=0.01)),
              Example("ademamix_warmup_wd", lambda: AdEMAMix(lr=0.01, beta3=0.99, weight_decay=0.1, warmup=3)),
              Example("simplified_ademamix", lambda: SimplifiedAdEMAMix(lr=1e-3, beta1=0.9, alpha=1.0))),
    cli=(CliName("ademamix", AdEMAMix, {"mlp": 1e-3, "gpt": 1e-3}, "AdEMAMix (optax.contrib semantics): --beta1, "
                 "--beta2, --eps, --weight-decay", {"beta1": "beta1", "beta2": "beta2", "eps": "eps",
                                                    "weight_decay": "weight_decay"}),),
)
