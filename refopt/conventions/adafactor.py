"""Adafactor (refopt/rules/adafactor.py) to torch.optim.Adafactor (``form='torch'``: relative step min(lr, 1/sqrt t),
eps1 clamping the estimate, decoupled decay lr*wd, every matrix factored) and optax.adafactor (``form='optax'``:
eps added to g^2 as in the paper, a constant lr times the parameter scale, float32 decay schedule, the two
largest axes factored only from 128 entries, optional momentum, decay added to the update)."""
from __future__ import annotations

import numpy as np

from refopt.conventions._spec import (CONSTANT, NO_MASK, NO_MAXIMIZE, CliName, Conventions, Example, Oracle,
                                      PeerMapping, Preset, gamma, scalar)
from refopt.golden import GoldenCase
from refopt.rules.adafactor import Adafactor


def _rms64(a) -> float:
    return float(np.sqrt(np.mean(np.asarray(a, np.float64) ** 2))) if a.size else 0.0


class AdafactorOracle(Oracle):
    """Adafactor from the rule's docstring (the paper's equations in each peer's placement), written on its own
    terms: the torch form steps the array in torch's (out, in, k...) layout along its last two axes, the optax
    form reduces the two largest axes. Switches: ``eps`` 'clamp' (torch's) | 'add' (the paper's, optax's)
    overriding the form's placement; ``relative_step`` True | False (rho_t = min(lr, 1/sqrt t) or lr) overriding
    the form's; ``factored`` False (a full second moment everywhere); ``decay32`` True | False (beta2_t in
    float32 as optax, or in float64 as torch) overriding the form's; ``norm`` 'mean' | 'sum' (V = R C / sum(R):
    the paper's normalisation of row and column sums applied to factors kept as means)."""

    def _torch_perm(self, n):
        return (n - 1, n - 2, *range(n - 2))

    def _factored(self, x):
        r = self.rule
        if not (r.factored and self.switches.get("factored", True)) or x.ndim < 2:
            return None
        if r.form == "torch":
            tshape = np.transpose(x, self._torch_perm(x.ndim)).shape
            ok = min(tshape[-1], tshape[-2]) >= r.min_dim_size_to_factor
            return ("torch",) if ok else None
        big = sorted(range(x.ndim), key=lambda i: (x.shape[i], i))
        return ("optax", big[-1], big[-2]) if x.shape[big[-2]] >= r.min_dim_size_to_factor else None

    def init_leaf(self, x, path):
        f, d = self._factored(x), x.dtype
        s = {"v_row": np.zeros(0, d), "v_col": np.zeros(0, d), "v": np.zeros(0, d)}
        if f is None:
            s["v"] = np.zeros_like(x)
        elif f[0] == "torch":
            p = self._torch_perm(x.ndim)
            xt = np.transpose(x, p)
            inv = np.argsort(p)
            s["v_row"] = np.transpose(np.zeros(xt.shape[:-2] + (1, xt.shape[-1]), d), inv)   # torch's col_var
            s["v_col"] = np.transpose(np.zeros(xt.shape[:-1] + (1,), d), inv)                # torch's row_var
        else:
            _, d0, d1 = f
            s["v_row"] = np.zeros(np.delete(x.shape, d0), d)
            s["v_col"] = np.zeros(np.delete(x.shape, d1), d)
        if self.rule.beta1 is not None:
            s["m"] = np.zeros(x.shape, self.rule.momentum_dtype or d)
        return s

    def _beta2(self, t, d):
        r, k = self.rule, t - self.rule.decay_offset
        if self.switches.get("decay32", r.form == "optax"):
            b = np.float32(1) - np.float32(k) ** np.float32(r.beta2_decay)
            return scalar(float(b), d), scalar(float(np.float32(1) - b), d)
        w = float(k) ** r.beta2_decay
        return scalar(1.0 - w, d), scalar(w, d)

    def step_leaf(self, t, s, x, g, path):
        r, d = self.rule, x.dtype
        sw = self.switches
        lr = r.lr * gamma(r.schedule, t)
        add = sw.get("eps", "clamp" if r.form == "torch" else "add") == "add"
        eps1 = r.eps1 if r.eps1 is not None else (float(np.finfo(d).eps) if r.form == "torch" else 1e-30)
        b2, omb2 = self._beta2(t, d)
        g2 = g * g + (scalar(eps1, d) if add else scalar(0.0, d))
        f = self._factored(x)
        if f is None:
            s["v"] = b2 * s["v"] + omb2 * g2
            vhat = s["v"]
        elif f[0] == "torch":
            p = self._torch_perm(x.ndim)
            inv = np.argsort(p)
            gt = np.transpose(g2, p)
            row = np.transpose(s["v_col"], p)            # torch's row_var (..., n_out, 1)
            col = np.transpose(s["v_row"], p)            # torch's col_var (..., 1, n_in)
            row = b2 * row + omb2 * np.mean(gt, axis=-1, keepdims=True)
            col = b2 * col + omb2 * np.mean(gt, axis=-2, keepdims=True)
            s["v_col"], s["v_row"] = np.transpose(row, inv), np.transpose(col, inv)
            norm = np.mean(row, axis=-2, keepdims=True) * (row.shape[-2] if self.switches.get("norm") == "sum" else 1)
            if not add:
                norm = np.maximum(norm, scalar(eps1, d))
            vhat = np.transpose(row * col / norm, inv)
        else:
            _, d0, d1 = f
            s["v_row"] = b2 * s["v_row"] + omb2 * np.mean(g2, axis=d0)
            s["v_col"] = b2 * s["v_col"] + omb2 * np.mean(g2, axis=d1)
            vr = np.expand_dims(s["v_row"], d0)
            vc = np.expand_dims(s["v_col"], d1)
            norm = np.mean(vr, axis=d1, keepdims=True) * (vr.shape[d1] if self.switches.get("norm") == "sum" else 1)
            if not add:
                norm = np.maximum(norm, scalar(eps1, d))
            vhat = vr * vc / norm
        if not add:
            vhat = np.maximum(vhat, scalar(eps1 * eps1, d))
        u = g / np.sqrt(vhat)
        if r.d is not None:
            u = u / scalar(max(1.0, _rms64(u) / r.d), d)
        scale = max(r.eps2, _rms64(x)) if r.multiply_by_parameter_scale else 1.0
        if sw.get("relative_step", r.form == "torch"):
            step = scale * min(lr, 1.0 / np.sqrt(t))
        else:
            step = scale * lr
        if r.form == "torch":
            if r.weight_decay:
                x = x * scalar(1.0 - lr * r.weight_decay, d)
            return x - scalar(step, d) * u
        u = scalar(step, d) * u
        if r.beta1 is not None:
            m = scalar(r.beta1, s["m"].dtype) * s["m"] + scalar(1.0 - r.beta1, d) * u
            s["m"] = m.astype(s["m"].dtype)
            u = m
        if r.weight_decay:
            u = u + scalar(r.weight_decay, d) * x
        return (x - u).astype(d)


def variants(rule):
    from refopt.conventions._variants import oracle_variant as v
    torch = rule.form == "torch"
    out = [v(rule, "eps1 added to g^2" if torch else "eps1 as a clamp",
             "eps1 added to every g^2 before the factors (the paper's, optax's)" if torch else
             "max(mean(R), eps1) and max(V, eps1^2) in place of g^2 + eps1 (torch's)",
             eps="add" if torch else "clamp"),
           v(rule, "no relative step" if torch else "relative step",
             "rho_t = lr in place of min(lr, 1/sqrt t)" if torch else "rho_t = min(lr, 1/sqrt t) (torch's)",
             relative_step=not torch),
           v(rule, "beta2_t in float64" if not torch else "beta2_t in float32",
             "1 - (t - t0)^tau evaluated in " + ("float64 (torch's)" if not torch else "float32 (optax's)"),
             decay32=torch)]
    if rule.factored:
        out += [v(rule, "unfactored second moment", "a full v per entry in place of the row/column factors",
                  factored=False),
                v(rule, "the factored V divided by the sum of R", "V = R C / sum(R) with R and C kept as means (the "
                  "paper's normalisation for sums): V too small by the number of rows", norm="sum")]
    return out


def facts(rule, of):
    """U = g/sqrt(V) with V an average of g^2 (factored or not) is of degree 0 in g (eps1 -> 0), clipped by its
    own RMS and scaled by the params' RMS; the decay (either form's) does not involve g: gradient-scale
    invariant. Not orthogonally equivariant (V is taken per entry or per row/column). Permutations: the
    factored V = R C / mean(R) commutes with permutations of the rows and of the columns of a matrix (R and C
    are permuted with them, mean(R) is unchanged), but a permutation of the entries in general mixes rows and
    columns and breaks the factorisation: ``elementwise`` (permutation equivariance of all entries, as the
    generic property tests it) holds only unfactored (factored=False); RMS(U) and RMS(x) are
    permutation-invariant, so the unfactored rule is equivariant. With the parameter scale the step is
    max(eps2, RMS(x)) times a degree-0 function of g, and both decays are linear in x: parameter-scale covariant
    (the paper's point of the relative step) while RMS(x) >= eps2, so not exactly (eps1, eps2 floors)."""
    return {"grad_scale": True, "orthogonal": False, "elementwise": not rule.factored,
            "covariant": rule.multiply_by_parameter_scale, "exact_scale_free": False}


# ---- the peers ------------------------------------------------------------------------------------------
def _dtype_name(v):
    try:
        return np.dtype(v).name
    except TypeError:
        return repr(v)


def _torch(lr, beta2_decay, eps, d, weight_decay):
    return Adafactor(lr=lr, beta2_decay=beta2_decay, eps1=eps[0], eps2=eps[1], d=d, weight_decay=weight_decay)


def _optax(learning_rate, min_dim_size_to_factor, decay_rate, decay_offset, multiply_by_parameter_scale,
           clipping_threshold, momentum, dtype_momentum, weight_decay_rate, eps, factored):
    return Adafactor(lr=1.0 if learning_rate is None else learning_rate, beta2_decay=-decay_rate, eps1=eps,
                     eps2=1e-3, d=clipping_threshold, weight_decay=0.0 if weight_decay_rate is None else weight_decay_rate,
                     multiply_by_parameter_scale=multiply_by_parameter_scale, factored=factored,
                     min_dim_size_to_factor=min_dim_size_to_factor, decay_offset=decay_offset, beta1=momentum,
                     momentum_dtype=None if momentum is None else _dtype_name(dtype_momentum), form="optax")


def _torch_match(rule):
    if type(rule) is not Adafactor or rule.form != "torch" or rule.schedule is not None or rule.d is None \
            or rule.d < 1 or not rule.multiply_by_parameter_scale or not rule.factored \
            or rule.min_dim_size_to_factor != 0 or rule.decay_offset != 0:
        return None
    return dict(lr=rule.lr, beta2_decay=rule.beta2_decay, eps=(rule.eps1, rule.eps2), d=rule.d,
                weight_decay=rule.weight_decay)


def _optax_match(rule):
    if type(rule) is not Adafactor or rule.form != "optax" or rule.schedule is not None or rule.eps2 != 1e-3 \
            or (rule.beta1 is not None and rule.momentum_dtype is None):
        return None
    return dict(learning_rate=rule.lr, min_dim_size_to_factor=rule.min_dim_size_to_factor,
                decay_rate=-rule.beta2_decay, decay_offset=rule.decay_offset,
                multiply_by_parameter_scale=rule.multiply_by_parameter_scale, clipping_threshold=rule.d,
                momentum=rule.beta1, dtype_momentum=rule.momentum_dtype or "float32",
                weight_decay_rate=rule.weight_decay or None, eps=1e-30 if rule.eps1 is None else rule.eps1,
                factored=rule.factored)


#: torch keeps row_var (the mean over its last axis, `in`: refopt's columns' factor) and col_var; refopt names
#: the factors by refopt's (fan_in, fan_out) layout
_TSTATE = {"v_row": "col_var", "v_col": "row_var", "v": "variance"}


def _ostate(args):
    return {"v_row": "v_row", "v_col": "v_col", "v": "v", **({"m": "ema"} if args["momentum"] is not None else {})}


TORCH = PeerMapping("torch.optim.Adafactor", "torch", "Adafactor",
                    dict(lr=1e-2, beta2_decay=-0.8, eps=(None, 1e-3), d=1.0, weight_decay=0.0, maximize=False),
                    _torch, "adafactor",
                    refuse={"maximize": NO_MAXIMIZE,
                            "d": (lambda v: v >= 1, "torch.optim.Adafactor requires d >= 1 (refopt's rule takes "
                                                    "d > 0 in the optax form)")},
                    ignore=("foreach",), state=_TSTATE, layout="transpose", match=_torch_match)
OPTAX = PeerMapping("optax.adafactor", "optax", "adafactor",
                    dict(learning_rate=None, min_dim_size_to_factor=128, decay_rate=0.8, decay_offset=0,
                         multiply_by_parameter_scale=True, clipping_threshold=1.0, momentum=None,
                         dtype_momentum="float32", weight_decay_rate=None, eps=1e-30, factored=True,
                         weight_decay_mask=None),
                    _optax, "adafactor",
                    refuse={"learning_rate": CONSTANT, "weight_decay_rate": CONSTANT, "weight_decay_mask": NO_MASK,
                            "dtype_momentum": (lambda v: _dtype_name(v) in ("float32", "float64"),
                                               "refopt keeps the momentum in float32 or float64")},
                    state=_ostate, match=_optax_match)


def atlas_adafactor():
    from refopt.crosscheck.atlas import Entry, Pair, _p, _rules, peer_side

    R = _rules()
    t = _p("torch.Adafactor(lr=1e-2)", "torch", "Adafactor", dict(lr=1e-2), lambda: R.Adafactor(lr=1e-2),
           state=_TSTATE, layout="transpose")
    o = _p("optax.adafactor(1e-2, min_dim_size_to_factor=1)", "optax", "adafactor",
           dict(learning_rate=1e-2, min_dim_size_to_factor=1),
           lambda: R.Adafactor(lr=1e-2, min_dim_size_to_factor=1, eps1=1e-30, form="optax"),
           state=_ostate(dict(momentum=None)))
    o128 = _p("optax.adafactor(1e-2)", "optax", "adafactor", dict(learning_rate=1e-2),
              lambda: R.Adafactor(lr=1e-2, min_dim_size_to_factor=128, eps1=1e-30, form="optax"),
              state=_ostate(dict(momentum=None)))
    return Entry(
        "adafactor-eps-factoring", "torch.optim.Adafactor (eps1 clamps mean(R) and V; every matrix factored) vs "
        "optax.adafactor (eps added to g^2; matrices factored from 128 entries per axis)",
        (peer_side("torch", t, source="torch 2.13: rho_t = min(lr, 1/sqrt t), max(mean(R), eps1), max(V, eps1^2), "
                                      "eps1 = machine eps"),
         peer_side("optax", o, source="optax 0.2.8: scale_by_factored_rms adds eps = 1e-30 to g^2 (the paper's "
                                      "eps1 placement), beta2_t in float32"),
         peer_side("optax-128", o128, source="optax 0.2.8 defaults: min_dim_size_to_factor=128, so the stream's "
                                             "small matrices keep a full v")),
        (Pair("torch", "optax", "final", 1e-3, what="params after 50 steps, both factored: the eps placement on "
                                                    "the stream's leaf of gradients 1e-8 (mean(R) ~ 1e-16 < eps1)"),
         Pair("torch", "optax-128", "final", 1e-2, what="params after 50 steps: factored vs optax's full v"),
         Pair("torch", "optax-128", "step", 0.1, what="per-step update (median over steps)")),
        "optax follows the paper (Shazeer & Stern 2018, Alg. 4/5) on eps1: R, C and V are built from g^2 + eps1 "
        "(1e-30); torch clamps max(mean(R), eps1) and max(V, eps1^2) with eps1 = the dtype's machine epsilon "
        "(2.2e-16), which changes V wherever the mean g^2 is below it (the stream's leaf of gradients 1e-8). The "
        "relative step rho_t = min(1e-2, 1/sqrt t) and the parameter scale max(eps2, RMS(x)) are the paper's in "
        "torch (lr = the 1e-2 cap); optax's constant lr = 1e-2 times max(1e-3, RMS(x)) is the same for t <= 10^4. "
        "The paper factors every matrix; optax's default min_dim_size_to_factor=128 (from tensor2tensor) keeps a "
        "full second moment for smaller ones.",
        "Shazeer & Stern 2018 (ICML), Algorithms 4 and 5; torch.optim.Adafactor; optax.adafactor")


CONVENTIONS = Conventions(
    rules=(Adafactor,),
    final="the step U/max(1, RMS(U)/d) with U = g/sqrt(V), V = R C/mean(R) (factored) or the EMA of g^2: the "
          "eps1 placement, the factored axes, the relative step min(lr, 1/sqrt t), the parameter scale, or where "
          "the decay enters",
    per_step="the decay schedule beta2_t = 1 - t^beta2_decay and the relative step min(lr, 1/sqrt t)",
    mappings=(TORCH, OPTAX),
    no_peer={"schedulefree": "schedulefree ships the Schedule-Free optimizers only"},
    presets=(
        TORCH.preset("torch.Adafactor", dict(lr=1e-2), "every matrix factored; rho = min(lr, 1/sqrt t); eps1 = "
                                                      "machine eps clamps mean(R) and V"),
        TORCH.preset("torch.Adafactor(beta2_decay,eps,d,wd)",
                     dict(lr=0.05, beta2_decay=-0.6, eps=(1e-10, 1e-2), d=1.5, weight_decay=0.1),
                     "1 - beta2_t = t^-0.6, eps1 1e-10, eps2 1e-2, d 1.5, x(1 - lr wd)"),
        OPTAX.preset("optax.adafactor", dict(learning_rate=1e-2),
                     "min_dim_size_to_factor 128: the problems' arrays keep a full v; g^2 + 1e-30"),
        OPTAX.preset("optax.adafactor(min_dim_size_to_factor=4)", dict(learning_rate=1e-2, min_dim_size_to_factor=4),
                     "the two largest axes factored, v_row/v_col without that axis"),
        OPTAX.preset("optax.adafactor(all)",
                     dict(learning_rate=3e-2, min_dim_size_to_factor=5, decay_rate=0.7, decay_offset=-3,
                          multiply_by_parameter_scale=False, clipping_threshold=2.0, momentum=0.9,
                          dtype_momentum="float64", weight_decay_rate=1e-3, eps=1e-20),
                     "beta2_t = 1 - (t + 3)^-0.7 in float32, no parameter scale, d 2, float64 momentum 0.9, "
                     "decay 1e-3 added to the update; the (4, 5) leaf stays unfactored"),
        OPTAX.preset("optax.adafactor(momentum, float32 momentum)",
                     dict(learning_rate=1e-2, min_dim_size_to_factor=4, momentum=0.8),
                     "optax's default dtype_momentum float32: m stored in float32, the step uses it before the "
                     "cast (float64 runs too)"),
        OPTAX.preset("optax.adafactor(factored=False)",
                     dict(learning_rate=None, factored=False, min_dim_size_to_factor=4, clipping_threshold=None,
                          multiply_by_parameter_scale=False),
                     "learning_rate None (no scaling: lr 1), a full v, no clipping, no parameter scale"),
    ),
    wrong=(Preset("WRONG factoring: optax.adafactor(min_dim_size_to_factor=4) vs refopt Adafactor(factored=False)",
                  "optax", "adafactor", ("adafactor", dict(learning_rate=1e-2, min_dim_size_to_factor=4)),
                  lambda: Adafactor(lr=1e-2, eps1=1e-30, factored=False, form="optax"),
                  "row/column factors vs a full second moment", state={"v": "v"}, expect_fail=True),),
    oracle=AdafactorOracle,
    variants=variants,
    facts=facts,
    golden=(GoldenCase("adafactor", lambda: Adafactor(), "torch.optim.Adafactor's defaults",
                       ("v_row", "v_col", "v")),
            GoldenCase("adafactor_optax", lambda: Adafactor(lr=3e-2, min_dim_size_to_factor=5, beta2_decay=-0.7,
                                                            decay_offset=-3, d=2.0, beta1=0.9,
                                                            momentum_dtype="float64", weight_decay=1e-3,
                                                            eps1=1e-20, form="optax"),
                       "optax.adafactor, factored from 5, decay 0.7 offset -3, d 2, momentum 0.9 (float64), "
                       "decay 1e-3, eps 1e-20", ("v_row", "v_col", "v", "m"))),
    examples=(Example("adafactor", lambda: Adafactor(lr=0.1)),
              Example("adafactor_optax", lambda: Adafactor(lr=0.05, beta1=0.9, min_dim_size_to_factor=2,
                                                           weight_decay=1e-3, form="optax")),
              Example("adafactor_unfactored", lambda: Adafactor(lr=1.0, factored=False))),   # rho_t = 1/sqrt t
    atlas=(atlas_adafactor,),
    cli=(CliName("adafactor", Adafactor, {"mlp": 1e-2, "gpt": 1e-2},
                 "Adafactor (torch.optim.Adafactor semantics: step max(1e-3, RMS(x)) min(lr, 1/sqrt t) times the "
                 "clipped factored update): --eps (eps1)", {"eps1": "eps"}),),
)
