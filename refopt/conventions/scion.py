"""Scion (refopt/rules/scion.py) to pytorch_optimizer.SCION 4.1.0: torch's (out, in) layout (refopt's oracles on
the transposes), ``momentum`` the weight of the new gradient (torch's lerp), the oracle times ``scale``, the
decoupled decay before the average and only without ``constraint``, Newton-Schulz normalised by
max(||d||_F, 1e-7) with Jordan's coefficients.

pytorch_optimizer runs that Newton-Schulz in bfloat16 (``zero_power_via_newton_schulz_5``'s default ``dtype``):
:func:`pytorch_optimizer_scion` runs the package with the iteration in the parameters' dtype (the module's
function wrapped during each step), docs/factories/scion.py drives it from ``refopt crosscheck --impl``. The
package's ``init()`` (re-initialising the parameters) is not part of the step and is not mapped. heavyball's Scion
re-initialises the parameters at its first step from a torch generator: a documented known gap.
torch.optim and optax ship no Scion."""
from __future__ import annotations

import numpy as np

from refopt.conventions._spec import (NO_MAXIMIZE, Conventions, Example, Oracle, PeerMapping, Preset, gamma, is_number,
                                      patched, scalar)
from refopt.golden import GoldenCase
from refopt.rules.scion import Scion

#: pytorch_optimizer's LMONorm values refopt maps
_NORMS = {1: "auto", 2: "spectral", 4: "sign", 5: "bias_rms"}


class ScionOracle(Oracle):
    """Scion from the rule's docstring, array by array in numpy. Switches: ``alpha_of`` 'new' (momentum weighs the
    new gradient, the rule's) | 'old' (it weighs the average: d = momentum d + (1 - momentum) g); ``shape_scale``
    False (no sqrt(fan_out / fan_in) on the spectral oracle); ``decay`` 'before' (the rule's) | 'after' (on
    x_t); ``layout`` 'refopt' | 'transposed' (the spectral scale read from the other layout)."""

    def init_leaf(self, x, path):
        return {"d": np.zeros_like(x)}

    def _lmo(self, d):
        from refopt.linalg._msign import _msign_svd, newton_schulz, ns_coefficients

        r, sw, dt = self.rule, self.switches, d.dtype
        kind = r.lmo if r.lmo != "auto" else ("bias_rms" if d.ndim <= 1 else "spectral")
        if kind == "bias_rms":
            return d / scalar(float(np.sqrt(np.mean(d.astype(np.float64) ** 2))) + r.eps, dt)
        fan_in, fan_out = d.shape
        if sw.get("layout", "refopt") == "transposed":
            fan_in, fan_out = fan_out, fan_in
        if kind == "sign":
            return np.sign(d) / scalar(fan_in, dt) if r.sign_normalize else np.sign(d)
        if r.msign == "svd":
            O = _msign_svd(d, None)
        else:
            O = newton_schulz(d, ns_coefficients(r.ns_coeffs, r.ns_steps), r.eps_mode, r.norm_eps, 1.0)
        s = np.sqrt(fan_out / fan_in) if r.spectral_scale == "fan_ratio" else np.sqrt(fan_out)
        if r.max_scale:
            s = max(1.0, s)
        return O * scalar(s if sw.get("shape_scale", True) else 1.0, dt)

    def direction_leaf(self, t, s, x, g, path):
        r, d = self.rule, x.dtype
        a = r.momentum if self.switches.get("alpha_of", "new") == "new" else 1.0 - r.momentum
        s["d"] = s["d"] + scalar(a, d) * (g - s["d"]) if a < 0.5 else g - (g - s["d"]) * scalar(1.0 - a, d)
        return scalar(r.scale, d) * self._lmo(s["d"])

    def step_leaf(self, t, s, x, g, path):
        r = self.rule
        lr = r.lr * gamma(r.schedule, t)
        keep = scalar(1.0 - lr * r.weight_decay, x.dtype)
        after = self.switches.get("decay", "before") == "after"
        if not after:
            x = keep * x
        u = self.direction_leaf(t, s, x, g, path)
        if r.constraint:
            x = scalar(1.0 - lr, x.dtype) * x
        x = x - scalar(lr, x.dtype) * u
        return keep * x if after else x


def variants(rule):
    from refopt.conventions._variants import oracle_variant as v

    out = [v(rule, "momentum weighs the average", "d_t = momentum d_{t-1} + (1 - momentum) g_t in place of momentum "
             "weighing the new gradient (pytorch_optimizer's momentum is 1 - the usual one)", alpha_of="old")]
    if rule.lmo in ("auto", "spectral"):
        out += [v(rule, "no spectral shape scale", "msign(d) in place of msign(d) sqrt(fan_out / fan_in)",
                  shape_scale=False),
                v(rule, "layout transposed", "the oracle's fan_in and fan_out read from torch's (out, in) layout as "
                  "refopt's (in, out)", layout="transposed")]
    if rule.weight_decay > 0:
        out.append(v(rule, "decay after the step", "x_t (1 - lr lambda) in place of the decay of x_{t-1} before the "
                     "step", decay="after"))
    return out


def facts(rule, of):
    """The oracles are of degree 0 in d (eps -> 0; Newton-Schulz normalises by ||d||_F), so the step has degree 0
    in g; msign follows rotations (U d V^T -> U msign(d) V^T, the shape scale fixed), sign and the RMS act per
    entry or on the whole array. With the exact msign, radius 1 and the fan_ratio scale, one step from 0 has
    spectral norm lr sqrt(fan_out / fan_in): muP's step size."""
    spectral = rule.lmo in ("auto", "spectral")
    mup = spectral and rule.msign == "svd" and rule.scale == 1.0 and rule.spectral_scale == "fan_ratio" \
        and not rule.max_scale
    return {"grad_scale": True, "step_scale_free": False, "orthogonal": spectral, "elementwise": rule.lmo == "sign",
            "exact_scale_free": rule.msign == "svd" or not spectral, "mup": mup}


# ---- pytorch_optimizer -----------------------------------------------------------------------------------
def pytorch_optimizer_scion(params, newton_schulz_dtype: str = "params", **kwargs):
    """``pytorch_optimizer.SCION(params, **kwargs)``. ``newton_schulz_dtype``: 'params' runs Newton-Schulz in each
    matrix's dtype (the module's ``zero_power_via_newton_schulz_5`` wrapped during each step), 'bfloat16' is the
    package as it ships."""
    import pytorch_optimizer.optimizer.scion as module
    from pytorch_optimizer import SCION

    if newton_schulz_dtype not in ("params", "bfloat16"):
        raise ValueError(f"newton_schulz_dtype must be 'params' or 'bfloat16', got {newton_schulz_dtype!r}")
    if newton_schulz_dtype == "bfloat16":
        return SCION(params, **kwargs)

    class SCIONParamsDtype(SCION):
        def step(self, closure=None):
            package = module.zero_power_via_newton_schulz_5

            def in_params_dtype(g, num_steps=5, **kw):
                return package(g, num_steps, **{**kw, "dtype": g.dtype})
            with patched(module, zero_power_via_newton_schulz_5=in_params_dtype):
                return super().step(closure)

    return SCIONParamsDtype(params, **kwargs)


def _pytorch_optimizer(lr, momentum, constraint, norm_type, norm_kwargs, scale, weight_decay, weight_decouple):
    kw = dict(norm_kwargs or {})
    lmo = _NORMS[int(norm_type)]
    fields = {}
    if lmo == "spectral":
        fields = dict(spectral_scale="fan_ratio" if kw.pop("normalize", True) else "fan_out",
                      max_scale=bool(kw.pop("max_scale", False)), ns_steps=int(kw.pop("num_steps", 5)))
    elif lmo == "sign":
        kw.pop("zero_init", None)          # the package's init() only
        fields = dict(sign_normalize=bool(kw.pop("normalize", True)))
    if kw and lmo != "auto":               # Auto() and BiasRMS() take no options
        raise ValueError(f"like('pytorch_optimizer.SCION'): norm_kwargs {sorted(kw)} of the {lmo} oracle cannot be "
                         f"reproduced by refopt")
    return Scion(lr=lr, momentum=momentum, scale=scale, constraint=constraint,
                 weight_decay=0.0 if constraint else weight_decay, lmo=lmo, **fields)


def _match(rule):
    if type(rule) is not Scion or rule.schedule is not None or rule.msign != "newton_schulz" \
            or rule.ns_coeffs != "jordan" or rule.eps_mode != "clamp" or rule.norm_eps != 1e-7 or rule.eps != 1e-8:
        return None
    norm = {v: k for k, v in _NORMS.items()}[rule.lmo]
    kw = {}
    if rule.lmo == "spectral":
        kw = dict(normalize=rule.spectral_scale == "fan_ratio", max_scale=rule.max_scale, num_steps=rule.ns_steps)
    elif rule.lmo == "sign":
        kw = dict(normalize=rule.sign_normalize)
    elif rule.ns_steps != 5 or rule.spectral_scale != "fan_ratio" or rule.max_scale:
        return None
    return dict(lr=rule.lr, momentum=rule.momentum, constraint=rule.constraint, norm_type=norm, norm_kwargs=kw,
                scale=rule.scale, weight_decay=rule.weight_decay, weight_decouple=True)


PYTORCH_OPTIMIZER = PeerMapping(
    "pytorch_optimizer.SCION", "pytorch_optimizer", "SCION",
    dict(lr=1e-3, momentum=0.1, constraint=False, norm_type=1, norm_kwargs=None, scale=1.0, weight_decay=0.0,
         weight_decouple=True, maximize=False),
    _pytorch_optimizer, "scion", ignore=("foreach",),
    refuse={"norm_type": (lambda v: isinstance(v, (int, np.integer)) and int(v) in _NORMS,
                          "refopt's Scion maps LMONorm AUTO (1), SPECTRAL (2), SIGN (4) and BIAS (5); SPECTRALCONV, "
                          "COL, ROW and NONE it does not reproduce"),
            "norm_kwargs": (lambda v: v is None or isinstance(v, dict), "norm_kwargs must be a dict or None"),
            "weight_decouple": (lambda v: v is True, "weight_decouple=False adds L2 to the gradient; refopt's Scion "
                                                     "decays decoupled"),
            "momentum": (lambda v: is_number(v) and 0 < v <= 1, "momentum must be a number in (0, 1]"),
            "scale": (lambda v: is_number(v) and v > 0, "scale must be a number > 0"),
            "constraint": (lambda v: isinstance(v, bool), "constraint must be True or False"),
            "maximize": NO_MAXIMIZE},
    state={"d": "d"}, layout="transpose", match=_match, factory=pytorch_optimizer_scion)

_F = dict(factory=pytorch_optimizer_scion)
_KW = dict(lr=0.02, momentum=0.3, scale=2.0, weight_decay=0.1)

CONVENTIONS = Conventions(
    rules=(Scion,),
    final="rho lmo(d_t) of the averaged gradient: which weight the momentum is, the oracle (msign and its shape "
          "scale, sign / fan_in, d / RMS(d)), the Frank-Wolfe shrink, the decay's place",
    per_step="lr_t",
    mappings=(PYTORCH_OPTIMIZER,),
    presets=(
        PYTORCH_OPTIMIZER.preset("pytorch_optimizer.SCION", dict(lr=0.01), "norm_type AUTO: msign sqrt(out/in) on "
                                 "matrices, d / RMS on vectors; Newton-Schulz in the params' dtype", **_F),
        PYTORCH_OPTIMIZER.preset("pytorch_optimizer.SCION(momentum,scale,wd)", _KW,
                                 "momentum 0.3 (of the new gradient), radius 2, decoupled decay 0.1", **_F),
        PYTORCH_OPTIMIZER.preset("pytorch_optimizer.SCION(constraint)",
                                 dict(lr=0.05, momentum=0.6, constraint=True, scale=3.0),
                                 "the Frank-Wolfe step (1 - lr) x - lr rho lmo(d), momentum 0.6 (lerp's second "
                                 "form)", **_F),
        PYTORCH_OPTIMIZER.preset("pytorch_optimizer.SCION(spectral,fan_out)",
                                 dict(lr=0.01, norm_type=2, norm_kwargs=dict(normalize=False, max_scale=True,
                                                                             num_steps=6)),
                                 "SPECTRAL with sqrt(out) and max(1, s), 6 Newton-Schulz steps", matrix_only=True,
                                 **_F),
        PYTORCH_OPTIMIZER.preset("pytorch_optimizer.SCION(sign)", dict(lr=0.01, norm_type=4, scale=5.0),
                                 "SIGN: sign(d) / fan_in", matrix_only=True, **_F)),
    wrong=(Preset("WRONG momentum: pytorch_optimizer.SCION(momentum=0.3) vs refopt Scion(momentum=0.7)",
                  "pytorch_optimizer", "scion", ("SCION", dict(lr=0.01, momentum=0.3)),
                  lambda: PYTORCH_OPTIMIZER.rule(lr=0.01, momentum=0.7),
                  "the usual momentum 0.7 for the package's weight 0.3 of the new gradient", layout="transpose",
                  expect_fail=True, **_F),),
    gaps=(Preset("heavyball.Scion", "heavyball", "scion", ("Scion", dict(lr=0.0025, storage_dtype="float64")), None,
                 "heavyball 3.2.1's Scion",
                 gap="heavyball re-initialises every parameter at its first step (scion_auto_init_param_: matrices "
                     "by torch.nn.init.orthogonal_ from a torch generator seeded by the parameter's index, times "
                     "sqrt(out/in) scale; vectors to zero), so its trajectory starts from params refopt is not "
                     "given; refopt's Scion steps from the params it is handed"),),
    no_peer={"torch": "torch.optim ships no Scion", "optax": "optax 0.2.8 ships no Scion",
             "schedulefree": "schedulefree ships the Schedule-Free optimizers only"},
    oracle=ScionOracle,
    variants=variants,
    facts=facts,
    golden=(GoldenCase("scion", lambda: Scion(lr=0.02, momentum=0.3, scale=2.0, msign="svd"),
                       "Scion (uScion), the auto oracles with the exact msign", ("d",)),
            GoldenCase("scion_pytorch_optimizer_constraint",
                       lambda: PYTORCH_OPTIMIZER.rule(lr=0.05, momentum=0.6, constraint=True, scale=3.0),
                       "like('pytorch_optimizer.SCION', constraint=True, momentum 0.6, scale 3): Frank-Wolfe",
                       ("d",), tolerance=1e-10)),     # Newton-Schulz's matmuls, as Muon's golden files
    examples=(Example("scion", lambda: Scion(lr=0.01, momentum=0.3, weight_decay=0.01), converges=False,
                      note="each step has the fixed size lr rho of the oracle, so at constant lr Scion orbits the "
                           "minimum"),
              Example("scion_sign", lambda: Scion(lr=0.01, lmo="sign", constraint=True, scale=2.0),
                      params="matrix", converges=False,
                      note="the Frank-Wolfe step keeps x in the ball of radius rho, where the minimum need not lie")),
)
