"""ScheduleFreeSGD and ScheduleFreeAdamW (refopt/rules/schedule_free.py) to facebookresearch's
``*Reference`` classes (schedulefree) and optax.contrib's wrappers, whose warmup lags one step
(CONVENTIONS.md 2.5, 5; optax#1744)."""
from __future__ import annotations

import numpy as np

from refopt.conventions._spec import (OPTAX_F32_WARMUP, Conventions, Example, Oracle, PeerMapping, Preset,
                                      gamma, scalar)
from refopt.golden import GoldenCase
from refopt.rules.schedule_free import ScheduleFreeAdamW, ScheduleFreeSGD


def _warm(k: int, W: int) -> float:
    return k / W if k <= W else 1.0


class ScheduleFreeOracle(Oracle):
    """Schedule-Free SGD / AdamW from the module docstring of refopt/rules/schedule_free.py: at step t,
    gamma_t = lr schedule(t) min(1, t/W); lr_max_t = max(lr_max_{t-1}, gamma_t); weight w_t = t^r lr_max_t^p;
    c_t = w_t / sum_{k <= t} w_k; z <- z - gamma_t g (SGD: g + lambda y; AdamW: decoupled decay, then
    g/(sqrt(v/bc2) + eps)); x <- (1 - c_t) x + c_t z; y <- beta x + (1 - beta) z. Switches:
    ``warmup_lag`` (the z step uses min(1, (t-1)/W): optax), ``decay_at_z``; ``decay_at`` 'x' (AdamW's decay
    taken at the average x, neither at y nor at z)."""

    def __init__(self, rule, name=None, **sw):
        super().__init__(rule, name, **sw)
        self.lag = sw.get("warmup_lag", rule.warmup_lag)
        self.at_z = sw.get("decay_at_z", getattr(rule, "decay_at_z", False))
        self.adamw = isinstance(rule, ScheduleFreeAdamW)

    def init_leaf(self, x, path):
        s = {"z": np.array(x, copy=True), "x": np.array(x, copy=True)}
        if self.adamw:
            s["v"] = np.zeros_like(x)
        return s

    def _scalars(self, t):
        r = self.rule
        W = r.warmup_steps
        lr_max, wsum = -1.0, 0.0
        for k in range(1, t + 1):
            scaled = r.lr * gamma(r.schedule, k)
            lr_k = scaled * _warm(k, W)
            lr_max = max(lr_k, lr_max)
            w = (k ** r.r) * (lr_max ** r.weight_lr_power)
            wsum = wsum + w
        c = w / wsum if wsum != 0 else 0.0
        z_lr = scaled * (_warm(t - 1, W) if W > 0 else 1.0) if self.lag else lr_k
        return z_lr, c

    def step_leaf(self, t, s, y, g, path):
        r, d = self.rule, y.dtype
        lr, c = self._scalars(t)
        z, x = s["z"], s["x"]
        if self.adamw:
            if r.weight_decay != 0:
                at = self.switches.get("decay_at", "z" if self.at_z else "y")
                z = z - scalar(lr * r.weight_decay, d) * {"z": z, "y": y, "x": x}[at]
            s["v"] = s["v"] * scalar(r.beta2, d) + scalar(1.0 - r.beta2, d) * g * g
            v = s["v"]
            z = z + scalar(-lr, d) * g / (np.sqrt(v / scalar(1.0 - r.beta2 ** t, d)) + scalar(r.eps, d))
            beta = r.beta1
        else:
            if r.weight_decay != 0:
                g = g + scalar(r.weight_decay, d) * y
            z = z - scalar(lr, d) * g
            beta = r.beta
        s["z"] = z
        s["x"] = x * scalar(1.0 - c, d) + scalar(c, d) * s["z"]
        return s["x"] * scalar(beta, d) + scalar(1.0 - beta, d) * s["z"]


def variants(rule):
    from refopt.conventions._variants import oracle_variant as v

    out = [v(rule, "warmup lag flipped", "the z step uses the warmup of the previous step (optax#1744) or not",
             warmup_lag=not rule.warmup_lag)] if rule.warmup_steps else []
    if isinstance(rule, ScheduleFreeAdamW) and rule.weight_decay:
        out += [v(rule, "decay_at_z flipped", "decoupled decay at z vs at y", decay_at_z=not rule.decay_at_z),
                v(rule, "decay at the average x", "z <- z - lr wd x (the average) in place of the decay at "
                  f"{'z' if rule.decay_at_z else 'the params y'}", decay_at="x")]
    return out


def facts(rule, of):
    """Schedule-Free SGD is linear in g (orthogonal and permutation equivariant); AdamW's ratio
    g/sqrt(v) is scale free without decay and taken per entry; with a constant lr, no warmup and r = 0 the
    averaging weights are 1/t (post 004, eqs. (2), (18))."""
    avg = True if (rule.schedule is None and not rule.warmup_steps and rule.r == 0
                   and rule.weight_lr_power in (0.0, 2.0)) else None
    if isinstance(rule, ScheduleFreeAdamW):
        return {"grad_scale": rule.weight_decay == 0, "elementwise": True, "averaging": avg}
    return {"orthogonal": True, "elementwise": True, "averaging": avg}


# ---- the peers ------------------------------------------------------------------------------------------
def _plain(rule):
    return rule.schedule is None and not rule.warmup_lag


def _fb_sgd_match(rule):
    if not isinstance(rule, ScheduleFreeSGD) or not _plain(rule):
        return None
    return dict(lr=rule.lr, momentum=rule.beta, weight_decay=rule.weight_decay, warmup_steps=rule.warmup_steps,
                r=rule.r, weight_lr_power=rule.weight_lr_power)


def _fb_adamw_match(rule):
    if not isinstance(rule, ScheduleFreeAdamW) or not _plain(rule):
        return None
    return dict(lr=rule.lr, betas=(rule.beta1, rule.beta2), eps=rule.eps, weight_decay=rule.weight_decay,
                warmup_steps=rule.warmup_steps, r=rule.r, weight_lr_power=rule.weight_lr_power,
                decay_at_z=rule.decay_at_z)


FB_SGD = PeerMapping("schedulefree.SGDScheduleFreeReference", "schedulefree", "SGDScheduleFreeReference",
                     dict(momentum=0.9, weight_decay=0.0, warmup_steps=0, r=0.0, weight_lr_power=2.0),
                     lambda lr, momentum, weight_decay, warmup_steps, r, weight_lr_power: ScheduleFreeSGD(
                         lr=lr, beta=momentum, weight_decay=weight_decay, warmup_steps=warmup_steps, r=r,
                         weight_lr_power=weight_lr_power),
                     "sf_sgd", required=("lr",), ignore=("foreach",), state={"z": "z", "x": "x"}, match=_fb_sgd_match)
FB_ADAMW = PeerMapping("schedulefree.AdamWScheduleFreeReference", "schedulefree", "AdamWScheduleFreeReference",
                       dict(lr=0.0025, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, warmup_steps=0, r=0.0,
                            weight_lr_power=2.0, decay_at_z=False),
                       lambda lr, betas, eps, weight_decay, warmup_steps, r, weight_lr_power, decay_at_z:
                       ScheduleFreeAdamW(lr=lr, beta1=betas[0], beta2=betas[1], eps=eps, weight_decay=weight_decay,
                                         warmup_steps=warmup_steps, r=r, weight_lr_power=weight_lr_power,
                                         decay_at_z=decay_at_z),
                       "sf_adamw", ignore=("foreach",), state={"z": "z", "x": "x", "v": "exp_avg_sq"},
                       match=_fb_adamw_match)
_NO_DTYPE = (lambda v: v is None, "refopt keeps z in the params' dtype")
OPTAX_SGD = PeerMapping("optax.contrib.schedule_free_sgd", "optax", "contrib.schedule_free_sgd",
                        dict(learning_rate=1.0, warmup_steps=None, b1=0.9, weight_decay=None, weight_lr_power=2.0,
                             state_dtype=None),
                        lambda learning_rate, warmup_steps, b1, weight_decay, weight_lr_power: ScheduleFreeSGD(
                            lr=learning_rate, beta=b1, weight_decay=weight_decay or 0.0,
                            warmup_steps=warmup_steps or 0, weight_lr_power=weight_lr_power,
                            warmup_lag=bool(warmup_steps)),
                        "sf_sgd", refuse={"state_dtype": _NO_DTYPE}, state={"z": "z"})
OPTAX_ADAMW = PeerMapping("optax.contrib.schedule_free_adamw", "optax", "contrib.schedule_free_adamw",
                          dict(learning_rate=0.0025, warmup_steps=None, b1=0.9, b2=0.999, eps=1e-8,
                               weight_decay=0.0, weight_lr_power=2.0, state_dtype=None),
                          lambda learning_rate, warmup_steps, b1, b2, eps, weight_decay, weight_lr_power:
                          ScheduleFreeAdamW(lr=learning_rate, beta1=b1, beta2=b2, eps=eps, weight_decay=weight_decay,
                                            warmup_steps=warmup_steps or 0, weight_lr_power=weight_lr_power,
                                            warmup_lag=bool(warmup_steps)),
                          "sf_adamw", refuse={"state_dtype": _NO_DTYPE}, state={"z": "z"})
_F64 = {"float64_warmup": True}
_SGD, _ADAMW = ("z", "x"), ("z", "x", "v")

# ---- the divergence-atlas entries about the rule (refopt/crosscheck/divergences.py runs them) ----------
def atlas_sf_warmup():
    from refopt.crosscheck.atlas import Entry, Pair, _p, _preset, _rules, peer_side

    R = _rules()
    o = _preset("optax.contrib.schedule_free_sgd(warmup)")
    o64 = _p("optax.contrib.schedule_free_sgd(warmup64)", "optax", "contrib.schedule_free_sgd",
             dict(learning_rate=0.5, warmup_steps=5, float64_warmup=True),
             lambda: R.ScheduleFreeSGD(lr=0.5, warmup_steps=5, warmup_lag=True), state={"z": "z"})
    fb = _p("schedulefree.SGDScheduleFreeReference(warmup)", "schedulefree", "SGDScheduleFreeReference",
            dict(lr=0.5, momentum=0.9, warmup_steps=5), lambda: R.ScheduleFreeSGD(lr=0.5, beta=0.9, warmup_steps=5),
            state={"z": "z", "x": "x"})
    return Entry(
        "schedule-free-warmup", "Schedule-Free warmup: optax.contrib (one step of lag, float32 warmup) vs the "
        "facebookresearch reference",
        (peer_side("optax", o, tol=OPTAX_F32_WARMUP, tol_name="OPTAX_F32_WARMUP",
                   source="optax 0.2.8: inner lr counts from 0, weights from 1 (optax#1744)"),
         peer_side("optax float64 warmup", o64, source="the same call with the warmup evaluated in float64"),
         peer_side("schedulefree", fb, source="Defazio et al. 2024, the authors' reference code")),
        (Pair("optax", "schedulefree", "final", 0.05, what="the one-step lag of the z-step warmup"),
         Pair("optax", "optax float64 warmup", "params", 1e-9, what="optax's float32 warmup (lower bound: still "
              "float32)"),
         Pair("optax", "optax float64 warmup", "params", 1e-6, "max", what="... and only float32 rounding")),
        "the schedulefree reference (the authors' code, Defazio et al. 2024) uses lr (k+1)/W for the z step and the "
        "weights alike; optax's z step lags one step (a bug report: optax#1744).",
        "Defazio et al. 2024, 'The Road Less Scheduled'; optax#1744; CONVENTIONS.md 2.5, 5.1, 10.8")


def atlas_sf_adamw_decay():
    from refopt.crosscheck.atlas import Entry, Pair, _p, _preset, _rules, peer_side

    R = _rules()
    fb = _p("schedulefree.AdamWScheduleFreeReference(wd)", "schedulefree", "AdamWScheduleFreeReference",
            dict(lr=0.05, weight_decay=1e-2), lambda: R.ScheduleFreeAdamW(lr=0.05, weight_decay=1e-2),
            state={"z": "z", "x": "x", "v": "exp_avg_sq"})
    fbz = _p("schedulefree.AdamWScheduleFreeReference(wd,decay_at_z)", "schedulefree", "AdamWScheduleFreeReference",
             dict(lr=0.05, weight_decay=1e-2, decay_at_z=True),
             lambda: R.ScheduleFreeAdamW(lr=0.05, weight_decay=1e-2, decay_at_z=True),
             state={"z": "z", "x": "x", "v": "exp_avg_sq"})
    return Entry(
        "schedule-free-decay-point", "Schedule-Free AdamW's weight decay: at y (the reference default, optax) "
        "or at z (the reference's decay_at_z=True)",
        (peer_side("schedulefree at y", fb, source="the reference default: the decay term lr wd y joins the z step"),
         peer_side("schedulefree at z", fbz, source="decay_at_z=True: z <- z - lr wd z"),
         peer_side("optax", _preset("optax.contrib.schedule_free_adamw"), source="lr wd y, as the reference")),
        (Pair("schedulefree at y", "schedulefree at z", "final", 1e-6, what="params after 50 steps"),
         Pair("optax", "schedulefree at y", "params", 1e-12, "max", what="optax = the reference default")),
        "Defazio et al. (2024) apply the decay at y (the gradient point); decay_at_z is the later option of the "
        "same code for the primal-averaging view (decay of the iterate that is averaged).",
        "Defazio et al. 2024; CONVENTIONS.md 2.5, 5.2")


CONVENTIONS = Conventions(
    rules=(ScheduleFreeSGD, ScheduleFreeAdamW),
    final="y = (1 - beta) z + beta x from the updated z and x, x = (1 - c_t) x + c_t z with c_t = w_t/sum w "
          "(w_t = t^r lr_max^weight_lr_power), or the z step",
    per_step="the averaging weight c_t and the warmup",
    mappings=(FB_SGD, FB_ADAMW, OPTAX_SGD, OPTAX_ADAMW),
    no_peer={"torch": "torch.optim 2.13 has no Schedule-Free optimizer (schedulefree's classes are torch "
                      "optimizers: the schedulefree mappings)"},
    presets=(
        OPTAX_SGD.preset("optax.contrib.schedule_free_sgd", dict(learning_rate=0.5, b1=0.9),
                         "constant lr: identical to the FB reference; params = y, z stored, x recomputed (2.5)"),
        OPTAX_SGD.preset("optax.contrib.schedule_free_sgd(wd)", dict(learning_rate=0.5, b1=0.8, weight_decay=1e-2),
                         "L2 add_decayed_weights before sgd, evaluated at y (2.5)"),
        OPTAX_ADAMW.preset("optax.contrib.schedule_free_adamw", dict(learning_rate=0.05, weight_decay=1e-2),
                           "scale_by_rms(bias_correction, eps outside) = sqrt(v/bc2) + eps; wd lr-coupled at y (2.5)"),
        OPTAX_SGD.preset("optax.contrib.schedule_free_sgd(warmup)", dict(learning_rate=0.5, warmup_steps=5),
                         "warmup: optax's inner scale_by_learning_rate counts from 0 (z step lr*(t-1)/W) while its "
                         "averaging weights count from 1 (lr*t/W) = refopt warmup_lag=True (CONVENTIONS 2.5, "
                         "optax#1744); optax computes the warmup in float32 (OPTAX_F32_WARMUP)", tol=OPTAX_F32_WARMUP),
        OPTAX_SGD.preset("optax.contrib.schedule_free_sgd(warmup64,wd)", dict(learning_rate=0.5, warmup_steps=5, b1=0.8,
                                                                              weight_decay=1e-2),
                         "the lagged warmup (warmup_lag=True, 2.5) with the schedule evaluated in float64; L2 at y "
                         "rides on the lagged z step", adapter_options=_F64),
        OPTAX_ADAMW.preset("optax.contrib.schedule_free_adamw(warmup)", dict(learning_rate=0.05, warmup_steps=5,
                                                                             weight_decay=1e-2),
                           "lagged z-step warmup (warmup_lag=True, 2.5, optax#1744); the decoupled decay is scaled by "
                           "the lagged lr; float32 warmup (OPTAX_F32_WARMUP)", tol=OPTAX_F32_WARMUP),
        OPTAX_ADAMW.preset("optax.contrib.schedule_free_adamw(warmup64,wd)", dict(learning_rate=0.05, warmup_steps=4,
                                                                                  b1=0.8, b2=0.99, weight_decay=0.05),
                           "the lagged warmup with the schedule evaluated in float64 (2.5)", adapter_options=_F64),
        FB_SGD.preset("schedulefree.SGDScheduleFreeReference", dict(lr=0.5, momentum=0.9), "5.1, constant lr"),
        FB_SGD.preset("schedulefree.SGDScheduleFreeReference(warmup,r,wd)",
                      dict(lr=0.5, momentum=0.8, weight_decay=1e-2, warmup_steps=5, r=0.5, weight_lr_power=1.0),
                      "warmup (k+1)/W for the z step and the weights alike; L2 at y (5.1)"),
        FB_ADAMW.preset("schedulefree.AdamWScheduleFreeReference", dict(lr=0.05), "5.2 (HEAD: no sqrt(bc2) in the lr)"),
        FB_ADAMW.preset("schedulefree.AdamWScheduleFreeReference(warmup,wd,decay_at_z)",
                        dict(lr=0.05, betas=(0.8, 0.99), weight_decay=0.05, warmup_steps=4, decay_at_z=True, r=1.0),
                        "decoupled decay z <- z - lr*wd*z before the moment update (5.2)"),
    ),
    wrong=(Preset("WRONG warmup offset: optax schedule_free_sgd(warmup) vs refopt", "optax", "sf_sgd",
                  ("contrib.schedule_free_sgd", dict(learning_rate=0.5, warmup_steps=5)),
                  lambda: ScheduleFreeSGD(lr=0.5, warmup_steps=5),
                  "the one-step warmup offset of the released optax (CONVENTIONS 2.5)", state={"z": "z"},
                  expect_fail=True),),
    oracle=ScheduleFreeOracle,
    variants=variants,
    facts=facts,
    golden=(
        GoldenCase("sf_sgd", lambda: ScheduleFreeSGD(lr=0.5, beta=0.9), "Schedule-Free SGD (FB reference)", _SGD),
        GoldenCase("sf_sgd_wd", lambda: ScheduleFreeSGD(lr=0.5, beta=0.8, weight_decay=1e-2),
                   "Schedule-Free SGD with L2 at y", _SGD),
        GoldenCase("sf_sgd_warmup_r_wd", lambda: ScheduleFreeSGD(lr=0.5, beta=0.8, weight_decay=1e-2, warmup_steps=5,
                                                                 r=0.5, weight_lr_power=1.0),
                   "Schedule-Free SGD, warmup (k+1)/W, r, weight_lr_power", _SGD),
        GoldenCase("sf_adamw", lambda: ScheduleFreeAdamW(lr=0.05), "Schedule-Free AdamW (FB reference HEAD)", _ADAMW),
        GoldenCase("sf_adamw_wd", lambda: ScheduleFreeAdamW(lr=0.05, weight_decay=1e-2), "Schedule-Free AdamW, wd at y",
                   _ADAMW),
        GoldenCase("sf_adamw_warmup_decay_at_z", lambda: ScheduleFreeAdamW(lr=0.05, beta1=0.8, beta2=0.99,
                                                                          weight_decay=0.05, warmup_steps=4,
                                                                          decay_at_z=True, r=1.0),
                   "Schedule-Free AdamW, decay at z, warmup, r", _ADAMW),
    ),
    examples=(
        Example("sf_sgd", lambda: ScheduleFreeSGD(lr=0.1)),
        Example("sf_sgd_warmup_r_wd", lambda: ScheduleFreeSGD(lr=0.1, beta=0.8, warmup_steps=5, r=0.5,
                                                              weight_lr_power=1.0, weight_decay=1e-3)),
        Example("sf_sgd_schedule", lambda: ScheduleFreeSGD(lr=0.1, schedule=_schedule("wsd"))),
        Example("sf_sgd_warmup_lag", lambda: ScheduleFreeSGD(lr=0.1, warmup_steps=5, weight_decay=1e-3,
                                                             warmup_lag=True)),
        Example("sf_adamw", lambda: ScheduleFreeAdamW(lr=0.05)),
        Example("sf_adamw_warmup_lag", lambda: ScheduleFreeAdamW(lr=0.05, warmup_steps=5, weight_decay=0.01,
                                                                 warmup_lag=True)),
        Example("sf_adamw_warmup_r_wd", lambda: ScheduleFreeAdamW(lr=0.05, warmup_steps=5, r=1.0, weight_decay=0.01)),
        Example("sf_adamw_decay_at_z_schedule", lambda: ScheduleFreeAdamW(lr=0.05, weight_decay=0.01, decay_at_z=True,
                                                                          schedule=_schedule("cosine"))),
    ),
    atlas=(atlas_sf_warmup, atlas_sf_adamw_decay,),
)


def _schedule(kind):
    from refopt.schedules import WSD, warmup_cosine
    return WSD(2, 100, 300) if kind == "wsd" else warmup_cosine(3, 300, 0.1)
