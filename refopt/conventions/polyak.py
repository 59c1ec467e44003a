"""Polyak SGD, Momo and MomoAdam (refopt/rules/polyak.py) to optax.polyak_sgd, optax.contrib.momo and
optax.contrib.momo_adam, and Momo and MomoAdam to the authors' momo-opt (``momo.Momo``, ``momo.MomoAdam``, torch):
step sizes from the loss value each step is given (``value=``, optax's extra argument; torch's step(closure)),
over the whole tree in float64; a squared norm at or below float64's eps gives no step. optax applies the Polyak
step to the update scaled by ``scaling`` (its norm squared grows with scaling^2), so only scaling = 1 is the
documented s min(...) and refopt maps that alone. optax's momo and momo_adam divide x, not the step, by
1 + lr weight_decay (refopt's decay_form 'x'); the authors divide x - tau d (the paper's proximal step, 'prox'),
or, MomoAdam with divide=False, decay x by 1 - lr weight_decay ('adamw'). torch.optim ships none."""
from __future__ import annotations

import numpy as np

from refopt.conventions._spec import CliName, Conventions, Oracle, PeerMapping, Preset, gamma, scalar
from refopt.golden import GoldenCase
from refopt.rules.polyak import EPS_64, Momo, MomoAdam, PolyakSGD

LOSS_PROBLEMS = ("quadratic", "mlp", "gpt")


def _dot(a, b) -> float:
    return float(np.sum(np.asarray(a, np.float64) * np.asarray(b, np.float64)))


class PolyakOracle(Oracle):
    """SGD with the Polyak step from PolyakSGD's docstring. Switches: ``scaled`` True (the step computed on
    lr g, optax's polyak_sgd with scaling != 1); ``cap`` False (no s_max); ``gap`` 'signed' | 'clipped' (in place
    of the variant's); ``per_leaf`` True (a step per array, each its own ||g||^2)."""

    def init_leaf(self, x, path):
        return {}

    def _s(self, f, g2):
        r, sw = self.rule, self.switches
        gap = f - r.f_min
        if sw.get("gap", "clipped" if r.variant == "sps+" else "signed") == "clipped":
            gap = max(gap, 0.0)
        den = g2 + r.eps
        if den <= EPS_64:
            return 0.0
        return gap / den if sw.get("cap") is False else min(gap / den, r.max_lr)

    def step(self, state, params, grads, value=None):
        from refopt import tree as T
        t, leaves = state
        t += 1
        xs, gs, _, td = T.check_like(params, grads)
        lr = self.rule.lr * gamma(self.rule.schedule, t)
        c2 = lr * lr if self.switches.get("scaled") else 1.0
        g2s = [c2 * _dot(g, g) for g in gs]
        steps = [self._s(value, g2) for g2 in g2s] if self.switches.get("per_leaf") else \
            [self._s(value, sum(g2s))] * len(xs)
        out = [np.asarray(x) - scalar(lr * s, x.dtype) * np.asarray(g) for x, g, s in zip(xs, gs, steps)]
        return T.unflatten(td, out), (t, leaves)


class MomoOracle(Oracle):
    """Momo and MomoAdam from their docstrings; the oracle's state is (t, leaves, (fbar, gamma, lb)).
    Switches: ``decay_form`` (in place of the rule's); ``per_leaf`` True (tau per array, each with its own
    inner products, averages and bound); ``warm_start`` False (Momo: the averages start from 0 with beta at
    step 1, in place of the first values)."""

    def init_leaf(self, x, path):
        s = {"d": np.zeros_like(x)} if isinstance(self.rule, Momo) else {"m": np.zeros_like(x), "v": np.zeros_like(x)}
        return s

    def init(self, params):
        t, leaves = super().init(params)
        lb = float(self.rule.lower_bound)
        return (t, leaves, (0.0, 0.0, lb) if not self.switches.get("per_leaf") else [(0.0, 0.0, lb)] * len(leaves))

    def _tau(self, t, glob, f, norm, dx, gx):
        r = self.rule
        adam = isinstance(r, MomoAdam)
        b = r.beta1 if adam else (0.0 if t == 1 and self.switches.get("warm_start", True) else r.beta)
        rho = 1.0 - r.beta1 ** t if adam else 1.0
        fbar, gam, lb = glob
        fbar, gam = b * fbar + (1 - b) * f, b * gam + (1 - b) * gx
        a = r.lr * gamma(r.schedule, t)
        c = 1.0 + a * r.weight_decay
        if r.adapt_lower_bound:
            cap = c * (fbar - gam) + dx
            if cap < c * rho * lb:
                lb = max(cap / (2 * c * rho), r.lower_bound)
        t1 = 0.0 if norm <= EPS_64 else max(c * (fbar - rho * lb - gam) + dx, 0.0) / norm
        tau = min(a / rho, t1)
        if r.adapt_lower_bound:
            lb = max((fbar + dx - gam - tau * norm / 2) / rho, r.lower_bound)
        return tau, (fbar, gam, lb)

    def step(self, state, params, grads, value=None):
        from refopt import tree as T
        r, sw = self.rule, self.switches
        t, leaves, glob = state
        t += 1
        xs, gs, _, td = T.check_like(params, grads)
        adam = isinstance(r, MomoAdam)
        new_s, dirs, sums = [], [], []
        for x, g, s in zip(xs, gs, leaves):
            x, g, dt = np.asarray(x), np.asarray(g), x.dtype
            if adam:
                m = scalar(r.beta1, dt) * s["m"] + scalar(1 - r.beta1, dt) * g
                v = scalar(r.beta2, dt) * s["v"] + scalar(1 - r.beta2, dt) * (g * g)
                u = m / (np.sqrt(v / scalar(1 - r.beta2 ** t, dt)) + scalar(r.eps, dt))
                new_s.append({"m": m, "v": v})
                d = m
            else:
                b = 0.0 if t == 1 and sw.get("warm_start", True) else r.beta
                d = scalar(b, dt) * s["d"] + scalar(1 - b, dt) * g
                u = d
                new_s.append({"d": d})
            dirs.append(u)
            sums.append((_dot(d, u), _dot(d, x), _dot(g, x)))
        if sw.get("per_leaf"):
            taus, glob = zip(*(self._tau(t, gl, value, *sm) for gl, sm in zip(glob, sums)))
            glob = list(glob)
        else:
            tau, glob = self._tau(t, glob, value, *(sum(c) for c in zip(*sums)))
            taus = [tau] * len(xs)
        a = r.lr * gamma(r.schedule, t)
        lam = r.weight_decay
        form = sw.get("decay_form", r.decay_form)
        out = []
        for x, u, tau in zip(xs, dirs, taus):
            x, dt = np.asarray(x), x.dtype
            if form == "prox":
                out.append((x - scalar(tau, dt) * u) / scalar(1 + a * lam, dt))
            elif form == "x":
                out.append(x / scalar(1 + a * lam, dt) - scalar(tau, dt) * u)
            else:
                out.append(scalar(1 - a * lam, dt) * x - scalar(tau, dt) * u)
        return T.unflatten(td, out), (t, new_s, glob)

    def state_arrays(self, state) -> dict:
        leaves = state[1]
        return {k: [s[k] for s in leaves] for k in (leaves[0] if leaves else {})}


def _oracle(rule):
    return PolyakOracle if isinstance(rule, PolyakSGD) else MomoOracle


def oracle(rule, name=None, **switches):
    return _oracle(rule)(rule, name, **switches)


def variants(rule):
    from refopt.conventions._variants import oracle_variant as v
    if isinstance(rule, PolyakSGD):
        out = [v(rule, "no step cap", "s_t = (f_t - f*) / (||g_t||^2 + eps) without the cap s_max", cap=False),
               v(rule, "per-array Polyak step", "s_t from each array's own ||g||^2 in place of the whole tree's",
                 per_leaf=True)]
        if rule.variant == "sps":
            out.append(v(rule, "gap clipped at 0 (SPS+)", "max(f_t - f*, 0) in place of f_t - f*", gap="clipped"))
        else:
            out.append(v(rule, "gap not clipped (SPS)", "f_t - f* in place of max(f_t - f*, 0)", gap="signed"))
        if rule.lr != 1 or rule.schedule is not None:
            out.append(v(rule, "Polyak step of the scaled update", "s_t computed on lr_t g_t (||lr_t g_t||^2 in the "
                         "denominator: optax.polyak_sgd's chain of sgd(scaling) and scale_by_polyak)", scaled=True))
        return out
    out = [v(rule, "per-array step size", "tau_t, the averages and the bound per array in place of the whole "
             "tree's", per_leaf=True)]
    if rule.weight_decay > 0:
        words = {"prox": "(x - tau d) / (1 + lr wd), the paper's proximal step",
                 "x": "x / (1 + lr wd) - tau d (the step not shrunk; optax.contrib.momo's)",
                 "adamw": "(1 - lr wd) x - tau d (AdamW's decay)"}
        out += [v(rule, f"weight decay as {f}", f"x_t = {words[f]} in place of {words[rule.decay_form]}",
                  decay_form=f) for f in ("prox", "x", "adamw") if f != rule.decay_form]
    if isinstance(rule, Momo):
        out.append(v(rule, "averages from 0", "fbar, d and gamma averaged from 0 with beta at step 1 in place of "
                     "starting at the first values", warm_start=False))
    return out


def facts(rule, of):
    """The loss scaled by c (value and gradients alike) divides the uncapped step size by c and leaves the step,
    but the caps (s_max, lr) do not scale: invariance holds only where they do not bind, so it is not stated;
    the whole-tree norms and inner products <g, x> are orthogonally invariant (Polyak SGD, Momo; not MomoAdam's
    per-entry D_t) and permutation invariant."""
    return {"grad_scale": None, "step_scale_free": False, "orthogonal": not isinstance(rule, MomoAdam),
            "elementwise": True}


_CONST = (lambda v: not callable(v), "refopt takes a constant here (pass the schedule as the rule's schedule=; "
                                     "refopt reads it at t = k + 1, optax at its count k)")


def _polyak(max_learning_rate, scaling, f_min, eps, variant):
    return PolyakSGD(lr=scaling, max_lr=max_learning_rate, f_min=f_min, eps=eps, variant=variant)


def _match_polyak(rule):
    if type(rule) is not PolyakSGD or rule.schedule is not None or rule.lr != 1:
        return None
    return dict(max_learning_rate=rule.max_lr, scaling=1.0, f_min=rule.f_min, eps=rule.eps, variant=rule.variant)


POLYAK = PeerMapping("optax.polyak_sgd", "optax", "polyak_sgd",
                     dict(max_learning_rate=1.0, scaling=1.0, f_min=0.0, eps=0.0, variant="sps"), _polyak,
                     "polyak_sgd",
                     refuse={"scaling": (lambda v: not callable(v) and v == 1,
                                         "optax computes the Polyak step on the update scaled by scaling (its norm "
                                         "squared grows with scaling^2), so scaling != 1 gives min(gap / (scaling^2 "
                                         "||g||^2), max) scaling, not the documented scaling min(gap / ||g||^2, max); "
                                         "refopt reproduces scaling = 1 (PolyakSGD(lr=...) is the documented form)"),
                             "max_learning_rate": _CONST, "f_min": _CONST, "eps": _CONST},
                     match=_match_polyak)


def _momo(learning_rate, beta, lower_bound, weight_decay, adapt_lower_bound):
    return Momo(lr=learning_rate, beta=beta, lower_bound=lower_bound, weight_decay=weight_decay,
                adapt_lower_bound=adapt_lower_bound, decay_form="x" if weight_decay else "prox")


def _momo_adam(learning_rate, b1, b2, eps, lower_bound, weight_decay, adapt_lower_bound):
    return MomoAdam(lr=learning_rate, beta1=b1, beta2=b2, eps=eps, lower_bound=lower_bound,
                    weight_decay=weight_decay, adapt_lower_bound=adapt_lower_bound,
                    decay_form="x" if weight_decay else "prox")


def _form_ok(rule):
    return rule.schedule is None and (rule.weight_decay == 0 or rule.decay_form == "x")


def _match_momo(rule):
    if type(rule) is not Momo or not _form_ok(rule):
        return None
    return dict(learning_rate=rule.lr, beta=rule.beta, lower_bound=rule.lower_bound, weight_decay=rule.weight_decay,
                adapt_lower_bound=rule.adapt_lower_bound)


def _match_momo_adam(rule):
    if type(rule) is not MomoAdam or not _form_ok(rule):
        return None
    return dict(learning_rate=rule.lr, b1=rule.beta1, b2=rule.beta2, eps=rule.eps, lower_bound=rule.lower_bound,
                weight_decay=rule.weight_decay, adapt_lower_bound=rule.adapt_lower_bound)


_MOMO_REFUSE = {"learning_rate": _CONST, "weight_decay": _CONST, "lower_bound": _CONST}

MOMO = PeerMapping("optax.contrib.momo", "optax", "contrib.momo",
                   dict(learning_rate=1.0, beta=0.9, lower_bound=0.0, weight_decay=0.0, adapt_lower_bound=False),
                   _momo, "momo", refuse=_MOMO_REFUSE, state={"d": "exp_avg"}, match=_match_momo)
MOMO_ADAM = PeerMapping("optax.contrib.momo_adam", "optax", "contrib.momo_adam",
                        dict(learning_rate=1e-2, b1=0.9, b2=0.999, eps=1e-8, lower_bound=0.0, weight_decay=0.0,
                             adapt_lower_bound=False),
                        _momo_adam, "momo_adam", refuse=_MOMO_REFUSE, state={"m": "exp_avg", "v": "exp_avg_sq"},
                        match=_match_momo_adam)

# ---- the authors' momo-opt (torch): the paper's proximal decay -----------------------------------------------
def _momo_opt(lr, weight_decay, beta, lb, bias_correction, use_fstar):
    return Momo(lr=lr, beta=beta, lower_bound=lb, weight_decay=weight_decay, adapt_lower_bound=use_fstar)


def _momo_adam_opt(lr, betas, eps, weight_decay, lb, divide, use_fstar):
    return MomoAdam(lr=lr, beta1=betas[0], beta2=betas[1], eps=eps, lower_bound=lb, weight_decay=weight_decay,
                    adapt_lower_bound=use_fstar, decay_form="prox" if divide or not weight_decay else "adamw")


def _match_momo_opt(rule):
    if type(rule) is not Momo or rule.schedule is not None or (rule.weight_decay and rule.decay_form != "prox"):
        return None
    return dict(lr=rule.lr, weight_decay=rule.weight_decay, beta=rule.beta, lb=rule.lower_bound,
                bias_correction=False, use_fstar=rule.adapt_lower_bound)


def _match_momo_adam_opt(rule):
    if type(rule) is not MomoAdam or rule.schedule is not None or (rule.weight_decay and rule.decay_form == "x"):
        return None
    return dict(lr=rule.lr, betas=(rule.beta1, rule.beta2), eps=rule.eps, weight_decay=rule.weight_decay,
                lb=rule.lower_bound, divide=rule.decay_form == "prox", use_fstar=rule.adapt_lower_bound)


_BETAS = (lambda v: isinstance(v, (tuple, list)) and len(v) == 2, "betas must be a pair (beta1, beta2)")
MOMO_OPT = PeerMapping("momo.Momo", "momo", "Momo",
                       dict(lr=1.0, weight_decay=0.0, beta=0.9, lb=0.0, bias_correction=False, use_fstar=False),
                       _momo_opt, "momo",
                       refuse={"bias_correction": (lambda v: v is False, "bias_correction=True averages from 0 with "
                                                   "rho_t = 1 - beta^t; refopt's Momo starts the averages at the first "
                                                   "values (the package's default and optax's)")},
                       state={"d": "grad_avg"}, layout="transpose", match=_match_momo_opt)
MOMO_ADAM_OPT = PeerMapping("momo.MomoAdam", "momo", "MomoAdam",
                            dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, lb=0.0, divide=True,
                                 use_fstar=False),
                            _momo_adam_opt, "momo_adam", refuse={"betas": _BETAS},
                            state={"m": "grad_avg", "v": "grad_avg_sq"}, layout="transpose",
                            match=_match_momo_adam_opt)

_NO_TORCH = "torch.optim ships no Polyak-type step size (the authors' momo-opt package is a torch one)"

_NO_SF = "schedulefree ships the Schedule-Free optimizers only"
_LOSS = "the loss value is recorded along refopt's run on the problems with a loss and handed to optax as value="
#: the presets run where there is a loss (the stream has none)
_ON_LOSS = dict(problems=LOSS_PROBLEMS, problems_why="the step size needs the loss value; the stream has no loss")

CONVENTIONS = Conventions(
    rules=(PolyakSGD, Momo, MomoAdam),
    final="x = x - lr s_t g (Polyak) or the momentum model's tau_t d_t with weight decay (Momo): the step size from "
          "the loss value, the whole tree's squared norm and inner products <d, x>, <g, x>, the cap and the bound",
    per_step="the step size s_t or tau_t, one number per step from the loss value and the whole tree",
    mappings=(POLYAK, MOMO, MOMO_ADAM, MOMO_OPT, MOMO_ADAM_OPT),
    no_peer={"torch": _NO_TORCH, "schedulefree": _NO_SF},
    presets=(
        POLYAK.preset("optax.polyak_sgd", {}, f"s_t = min(f_t / ||g_t||^2, 1); {_LOSS}", **_ON_LOSS),
        POLYAK.preset("optax.polyak_sgd(max_lr,f_min,eps)", dict(max_learning_rate=0.3, f_min=0.05, eps=1e-3),
                      "s_t = min((f_t - 0.05) / (||g_t||^2 + 1e-3), 0.3)", **_ON_LOSS),
        POLYAK.preset("optax.polyak_sgd(sps+)", dict(f_min=0.5, variant="sps+"),
                      "s_t = min(max(f_t - 0.5, 0) / ||g_t||^2, 1): no step below the guess f* = 0.5", **_ON_LOSS),
        MOMO.preset("optax.contrib.momo", {}, f"tau_t = min(1, [fbar - gamma + <d, x>]_+ / ||d||^2); {_LOSS}",
                    state={"d": "exp_avg"}, **_ON_LOSS),
        MOMO.preset("optax.contrib.momo(wd,adapt)", dict(learning_rate=0.5, beta=0.8, weight_decay=0.05,
                                                         adapt_lower_bound=True, lower_bound=0.01),
                    "decay_form 'x' (x / (1 + lr wd) - tau d); the lower bound estimated online from 0.01",
                    state={"d": "exp_avg"}, **_ON_LOSS),
        MOMO_ADAM.preset("optax.contrib.momo_adam", {}, "tau_t = min(lr / rho_t, [fbar - gamma + <m, x>]_+ / "
                         "<m, D^-1 m>), D = sqrt(v / (1 - b2^t)) + eps", state={"m": "exp_avg", "v": "exp_avg_sq"},
                         **_ON_LOSS),
        MOMO_ADAM.preset("optax.contrib.momo_adam(wd,adapt)", dict(learning_rate=0.05, weight_decay=0.1,
                                                                   adapt_lower_bound=True),
                         "decay_form 'x'; the bound estimated online and divided by rho_t",
                         state={"m": "exp_avg", "v": "exp_avg_sq"}, **_ON_LOSS),
        MOMO_OPT.preset("momo.Momo", {}, "the authors' Momo (momo-opt 0.1.0): the averages start at the first "
                        "values (bias_correction=False); the loss handed through step(closure)",
                        state={"d": "grad_avg"}, **_ON_LOSS),
        MOMO_OPT.preset("momo.Momo(wd,use_fstar)", dict(lr=0.5, beta=0.8, weight_decay=0.05, use_fstar=True, lb=0.01),
                        "the paper's proximal decay (x - tau d) / (1 + lr wd); the bound estimated online",
                        state={"d": "grad_avg"}, **_ON_LOSS),
        MOMO_ADAM_OPT.preset("momo.MomoAdam", {}, "the authors' MomoAdam: D = sqrt(v / (1 - b2^t)) + eps",
                             state={"m": "grad_avg", "v": "grad_avg_sq"}, **_ON_LOSS),
        MOMO_ADAM_OPT.preset("momo.MomoAdam(wd,divide)", dict(lr=0.05, weight_decay=0.1, use_fstar=True),
                             "divide=True: the proximal decay (x - tau D^-1 m) / (1 + lr wd)",
                             state={"m": "grad_avg", "v": "grad_avg_sq"}, **_ON_LOSS),
        MOMO_ADAM_OPT.preset("momo.MomoAdam(wd,no divide)", dict(lr=0.05, weight_decay=0.1, divide=False),
                             "divide=False: AdamW's decay (1 - lr wd) x - tau D^-1 m (decay_form 'adamw')",
                             state={"m": "grad_avg", "v": "grad_avg_sq"}, **_ON_LOSS),
    ),
    wrong=(Preset("WRONG decay: optax.contrib.momo(weight_decay=0.1) vs refopt Momo's proximal step", "optax", "momo",
                  ("contrib.momo", dict(weight_decay=0.1)), lambda: Momo(weight_decay=0.1),
                  "optax divides x alone by 1 + lr wd; the paper's prox step divides x - tau d", expect_fail=True,
                  **_ON_LOSS),
           Preset("WRONG cap: optax.polyak_sgd(max_learning_rate=0.05) vs refopt PolyakSGD(max_lr=1)", "optax",
                  "polyak_sgd", ("polyak_sgd", dict(max_learning_rate=0.05)), lambda: PolyakSGD(),
                  "the cap 0.05 binds where refopt's 1 does not", expect_fail=True, **_ON_LOSS),
           Preset("WRONG decay: momo.MomoAdam(weight_decay=0.1, divide=False) vs refopt MomoAdam's proximal step",
                  "momo", "momo_adam", ("MomoAdam", dict(lr=0.05, weight_decay=0.1, divide=False)),
                  lambda: MomoAdam(lr=0.05, weight_decay=0.1), "divide=False decays x by 1 - lr wd (AdamW's); the "
                  "rule divides x - tau D^-1 m by 1 + lr wd", layout="transpose", expect_fail=True, **_ON_LOSS)),
    oracle=oracle,
    variants=variants,
    facts=facts,
    golden=(GoldenCase("polyak_sgd", lambda: PolyakSGD(max_lr=0.5, f_min=0.05), "optax.polyak_sgd("
                       "max_learning_rate=0.5, f_min=0.05)", (), problems=LOSS_PROBLEMS),
            GoldenCase("momo", lambda: Momo(), "optax.contrib.momo's defaults", ("d",), problems=LOSS_PROBLEMS),
            GoldenCase("momo_adam_wd", lambda: MomoAdam(lr=0.05, weight_decay=0.1, adapt_lower_bound=True),
                       "MomoAdam lr 0.05, the paper's proximal decay 0.1, the lower bound estimated online",
                       ("m", "v"), problems=LOSS_PROBLEMS)),
    cli=(),
)
