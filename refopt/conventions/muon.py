"""Muon (refopt/rules/muon.py) to torch.optim.Muon (torch's (out, in) layout: the rule on the transposes;
Newton-Schulz in bfloat16 there) and optax.contrib.muon (CONVENTIONS.md 1.3, 2.4, 3.1).

Moonlight's SGD-sum momentum g + mu*b equals the standard Nesterov input divided by (1 - mu), so it agrees
with eps_mode='none' exactly in direction."""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from refopt.conventions._spec import (EXACT, MUON_OPTAX, MUON_TORCH_BF16, Conventions, Example, Oracle,
                                      PeerMapping, Preset, gamma, scalar)
from refopt.golden import GoldenCase
from refopt.rules.muon import Muon

_KJ = (3.4445, -4.775, 2.0315)


class MuonOracle(Oracle):
    """One Muon step from its equations (refopt.Muon's docstring): EMA momentum m = mu m + (1-mu) g; the
    Newton-Schulz input of ``nesterov_mode`` ('standard': (1-mu) g + mu m; 'bias_corrected': optax's
    NAdam mix; m alone without Nesterov); msign (Newton-Schulz with the rule's coefficients, normalisation and
    steps, or the exact polar factor); the shape scale; decoupled or lr-independent decay. The arrays of
    ndim > 2 are flattened to (prod(shape[:-1]), shape[-1])."""

    def init_leaf(self, x, path):
        return {"m": np.zeros_like(x)}

    def direction_leaf(self, t, s, x, g, path):
        from refopt.rules.muon import muon_scale
        return scalar(muon_scale(x.shape, self.rule.scale), x.dtype) * self._orthogonalised(t, s, x, g)

    def _orthogonalised(self, t, s, x, g):
        """msign of the Newton-Schulz input, shaped like x; the momentum m updated."""
        from refopt.linalg._msign import _msign_svd, newton_schulz, ns_coefficients
        from refopt.rules.muon import matrix_shape

        r, d = self.rule, x.dtype
        mu = r.momentum
        if r.nesterov_mode == "standard":
            w_m, w_g = (mu, 1.0 - mu) if r.nesterov else (1.0, 0.0)
        elif r.nesterov:
            w_m, w_g = mu / (1.0 - mu ** (t + 1)), (1.0 - mu) / (1.0 - mu ** t)
        else:
            w_m, w_g = 1.0 / (1.0 - mu ** t), 0.0
        s["m"] = scalar(mu, d) * s["m"] + scalar(1.0 - mu, d) * g
        m = s["m"]
        M = (scalar(w_m, d) * m + scalar(w_g, d) * g).reshape(matrix_shape(x.shape))
        if r.msign == "svd":
            O = _msign_svd(M, None)
        else:
            O = newton_schulz(M, ns_coefficients(r.ns_coeffs, r.ns_steps), r.eps_mode, r.norm_eps, r.norm_factor)
        return O.reshape(x.shape)

    def step_leaf(self, t, s, x, g, path):
        from refopt.rules.muon import muon_scale

        r, d = self.rule, x.dtype
        g_t = gamma(r.schedule, t)
        lr_t = r.lr * g_t
        decay = 1.0 - (lr_t if r.wd_mode == "decoupled" else g_t) * r.weight_decay
        u = self._orthogonalised(t, s, x, g)
        return scalar(decay, d) * x - scalar(lr_t * muon_scale(x.shape, r.scale), d) * u


def variants(rule):
    from refopt.conventions._variants import (TransposedRule, Variant, rule_variant as rv, shape_scale_variants,
                                              try_replace as _try)

    out = [Variant("layout transposed", "the rule applied to W^T: torch's (out, in) layout read as refopt's "
                   "(in, out) or the reverse (the shape scale flips on non-square matrices)",
                   lambda: TransposedRule(rule))]
    out += shape_scale_variants(rule)
    out.append(rv("nesterov flipped", "Nesterov input (1-mu) g + mu m vs plain momentum m",
                  _try(rule, nesterov=not rule.nesterov)))
    for nm in ("standard", "bias_corrected"):
        out.append(rv(f"nesterov_mode='{nm}'", "standard (KJ, torch) (1-mu) g + mu m vs optax's bias-corrected NAdam "
                      "mix", _try(rule, nesterov_mode=nm)))
    for mode, eps, label in (("none", 0.0, "none"), ("add", 1e-7, "add 1e-7 (KJ)"), ("add", 1e-8, "add 1e-8 (optax)"),
                             ("clamp", 1e-7, "clamp 1e-7 (torch)")):
        out.append(rv(f"NS normalisation eps {label}", "X / (||X|| + eps) (add), X / max(||X||, eps) (clamp) or "
                      "X / ||X|| (none) before Newton-Schulz", _try(rule, eps_mode=mode, norm_eps=eps)))
    out.append(rv("exact msign (svd)", "the exact polar factor in place of Newton-Schulz", _try(rule, msign="svd")))
    from refopt.linalg._msign import NS_PRESETS
    for name in NS_PRESETS:
        out.append(rv(f"ns_coeffs='{name}'", f"the Newton-Schulz coefficients '{name}' (refopt.linalg.NS_PRESETS)",
                      _try(rule, ns_coeffs=name)))
    if rule.weight_decay > 0:
        out.append(rv("weight_decay 0", "the decay is missing", _try(rule, weight_decay=0.0)))
        if rule.weight_decay <= 1:
            other = "independent" if rule.wd_mode == "decoupled" else "decoupled"
            out.append(rv(f"wd_mode='{other}'", "decay lr-coupled (decoupled) vs lr-free (independent)",
                          _try(rule, wd_mode=other)))
    if rule.weight_decay != 0.1:
        out.append(rv("weight_decay 0.1 (torch Muon default)", "torch.optim.Muon's default weight_decay 0.1, not "
                      "given", _try(rule, weight_decay=0.1)))
    return [v for v in out if v is not None]


def facts(rule, of):
    """msign(c M) = msign(M) and msign(U G V^T) = U msign(G) V^T (the decay multiplies x, not g); momentum 0:
    a step sees only msign(g_t); exact without the normalisation eps; the muP step size with the exact
    msign and the spectral scale."""
    return {"grad_scale": True, "step_scale_free": rule.momentum == 0, "orthogonal": True,
            "exact_scale_free": rule.eps_mode == "none", "mup": rule.msign == "svd" and rule.scale == "spectral"}


# ---- the peers ------------------------------------------------------------------------------------------
def _torch(lr, weight_decay, momentum, nesterov, ns_coefficients, eps, ns_steps, adjust_lr_fn):
    return Muon(lr=lr, momentum=momentum, nesterov=nesterov, ns_coeffs=tuple(ns_coefficients), ns_steps=ns_steps,
                scale="rms_match" if adjust_lr_fn == "match_rms_adamw" else "jordan", weight_decay=weight_decay,
                wd_mode="decoupled", nesterov_mode="standard", eps_mode="clamp", norm_eps=eps)


def _optax(learning_rate, ns_coeffs, ns_steps, beta, eps, weight_decay, nesterov, consistent_rms):
    names = {"standard": "jordan", "dion": "you"}
    ns = names.get(ns_coeffs, ns_coeffs) if isinstance(ns_coeffs, str) else ns_coeffs
    return Muon(lr=learning_rate, momentum=beta, nesterov=nesterov, ns_coeffs=ns, ns_steps=ns_steps,
                scale="jordan" if consistent_rms is None else "rms_match", weight_decay=weight_decay,
                wd_mode="decoupled", nesterov_mode="bias_corrected", eps_mode="add", norm_eps=eps)


def _coeffs(rule):
    c = _KJ if rule.ns_coeffs == "jordan" else rule.ns_coeffs
    return None if isinstance(c, str) or len(c) != 3 or isinstance(c[0], tuple) else tuple(c)


def _torch_match(rule):
    if (rule.schedule is not None or rule.msign != "newton_schulz" or rule.nesterov_mode != "standard"
            or rule.eps_mode != "clamp" or rule.norm_factor != 1.0 or rule.wd_mode != "decoupled"
            or rule.scale not in ("jordan", "rms_match") or _coeffs(rule) is None):
        return None
    return dict(lr=rule.lr, weight_decay=rule.weight_decay, momentum=rule.momentum, nesterov=rule.nesterov,
                ns_coefficients=_coeffs(rule), eps=rule.norm_eps, ns_steps=rule.ns_steps,
                adjust_lr_fn="match_rms_adamw" if rule.scale == "rms_match" else None)


def _optax_match(rule):
    if (rule.schedule is not None or rule.msign != "newton_schulz" or rule.nesterov_mode != "bias_corrected"
            or rule.eps_mode != "add" or rule.norm_factor != 1.0 or rule.scale not in ("jordan", "rms_match")
            or rule.wd_mode != "decoupled"):
        return None
    c = rule.ns_coeffs
    if c == "jordan":
        c = _KJ
    if isinstance(c, str):
        c = "dion" if c == "you" else None
    if c is None:
        return None
    return dict(learning_rate=rule.lr, ns_coeffs=c, ns_steps=rule.ns_steps, beta=rule.momentum, eps=rule.norm_eps,
                weight_decay=rule.weight_decay, nesterov=rule.nesterov,
                consistent_rms=0.2 if rule.scale == "rms_match" else None)


_ADJUST = (lambda v: v in (None, "original", "match_rms_adamw"), "torch.optim.Muon's adjust_lr_fn is None, 'original' "
                                                                 "or 'match_rms_adamw'")
TORCH = PeerMapping("torch.optim.Muon", "torch", "Muon",
                    dict(lr=1e-3, weight_decay=0.1, momentum=0.95, nesterov=True, ns_coefficients=_KJ, eps=1e-7,
                         ns_steps=5, adjust_lr_fn=None),
                    _torch, "muon", refuse={"adjust_lr_fn": _ADJUST}, state={"m": "momentum_buffer"},
                    layout="transpose", matrix_only=True, tol=MUON_TORCH_BF16, match=_torch_match)
OPTAX = PeerMapping("optax.contrib.muon", "optax", "contrib.muon",
                    dict(ns_coeffs=_KJ, ns_steps=5, beta=0.95, eps=1e-8, weight_decay=0.0, nesterov=True,
                         consistent_rms=None),
                    _optax, "muon", required=("learning_rate",),
                    refuse={"consistent_rms": (lambda v: v in (None, 0.2), "refopt's 'rms_match' scale is "
                                               "consistent_rms=0.2; other values are not supported")},
                    state={"m": "mu"}, matrix_only=True, tol=MUON_OPTAX, match=_optax_match)


def _like_torch(**kw):
    return TORCH.rule(**kw)


def _wrong(name, peer, call, make_rule, why, **kw):
    return Preset(name, peer, "muon", call, make_rule, why, expect_fail=True, **kw)


_T = dict(layout="transpose", matrix_only=True, state={"m": "momentum_buffer"}, tol=MUON_TORCH_BF16)
_M = ("m",)

# ---- the divergence-atlas entries about the rule (refopt/crosscheck/divergences.py runs them) ----------
def atlas_muon_4d():
    import math
    import numpy as np
    from refopt.crosscheck.atlas import Entry, Pair, SEED, STEPS, _rules, restated_side

    R = _rules()
    # refopt's (kh, kw, fan_in, fan_out); torch (out, in, kh, kw): (6, 2, 5, 3) and PITFALLS B07's (64, 1, 3, 3)
    shapes = [(5, 3, 2, 6), (3, 3, 1, 64)]
    kj = [math.sqrt(max(1.0, kh / kw)) for kh, kw, _, _ in shapes]   # KellerJordan: of (out, in, kh, kw)[-2:]
    flat = [math.sqrt(max(1.0, fo / (kh * kw * fi))) for kh, kw, fi, fo in shapes]
    lr = 0.02

    def leaves():
        rng = np.random.default_rng(SEED)
        x0 = [rng.standard_normal(s) for s in shapes]
        grng = np.random.default_rng(SEED + 1)
        return ["conv_a", "conv_b"], x0, [[grng.standard_normal(s) for s in shapes] for _ in range(STEPS)]

    def oracle():
        """KellerJordan's scale applied by hand: Muon without a shape scale at lr * kj, per filter."""
        from refopt.testing.adapters import RuleAdapter
        return RuleAdapter(R.Partition(rules={f"f{i}": R.Muon(lr=lr * k, scale="none", msign="svd")
                                              for i, k in enumerate(kj)}, labels=["f0", "f1"]))
    torch_shapes = [(fo, fi, kh, kw) for kh, kw, fi, fo in shapes]
    return Entry(
        "muon-conv-scale", "Muon on 4-D conv filters: KellerJordan's scale of the 4-D shape vs the scale of the "
        "flattened matrix",
        (restated_side("KellerJordan", f"KellerJordan/Muon on torch (out, in, kh, kw) filters {torch_shapes}: scale "
                       f"max(1, kh/kw)**0.5 = {', '.join(f'{k:.4f}' for k in kj)}",
                       lambda: R.Muon(lr=lr, scale="jordan_4d", msign="svd"), oracle=oracle,
                       source="KellerJordan/Muon muon_update (the original author's code)"),
         restated_side("flattened 'jordan'", "the same rule on the flattened (out, in kh kw) matrices: scale "
                       f"max(1, out/(in kh kw))**0.5 = {', '.join(f'{k:.4f}' for k in flat)} (torch.optim.Muon and "
                       "optax.contrib.muon take 2-D arrays only)",
                       lambda: R.Muon(lr=lr, scale="jordan", msign="svd"),
                       source="PITFALLS B07: the scale of the flattened 2-D shape")),
        (Pair("KellerJordan", "flattened 'jordan'", "update", 0.1, what="per-step update, worst filter"),),
        "the flattened shape: the scale is a property of the linear map (out x in kh kw) that Newton-Schulz "
        "orthogonalises (post 003); KellerJordan's code reads the 4-D tensor's last two dims, a quirk reported "
        "downstream as a bug (PITFALLS B07: updates up to 2.7x too small for a (64, 1, 3, 3) filter).",
        "CONVENTIONS.md 3.1; PITFALLS B07; post 003", leaves=leaves)


def atlas_muon_bf16():
    from refopt.crosscheck.atlas import Entry, Pair, _preset, peer_side, restated_side

    t = _preset("torch.Muon")
    t_state = replace(t, name="torch.Muon(state)")
    return Entry(
        "muon-bf16", "torch.optim.Muon runs Newton-Schulz in bfloat16; a float64 iteration differs by percents in "
        "the step while the momentum stays exact",
        (peer_side("torch", t, tol=MUON_TORCH_BF16, tol_name="MUON_TORCH_BF16",
                   source="torch.optim.Muon (as KellerJordan's code: Newton-Schulz in bfloat16)"),
         peer_side("torch momentum", t_state, observe="m", tol=EXACT, tol_name="EXACT",
                   source="the momentum buffer, in the param dtype"),
         restated_side("float64 Newton-Schulz", "the same Muon with Newton-Schulz in float64", t.make_rule),
         restated_side("float64 momentum", "its momentum buffer", t.make_rule, observe="m")),
        (Pair("torch", "float64 Newton-Schulz", "update", 1e-3, what="per-step update, max over steps and arrays"),
         Pair("torch", "float64 Newton-Schulz", "step", 1e-3, what="per-step update, median over steps"),
         Pair("torch momentum", "float64 momentum", "params", 1e-12, "max", what="the momentum buffers agree")),
        "KellerJordan's code and torch run the iteration in bfloat16 for speed; the iteration approximates msign "
        "(the polar factor) whatever the precision, so a float64 iteration is the same method, more accurate.",
        "KellerJordan/Muon; torch.optim.Muon; CONVENTIONS.md 1.3, 3.1, 10.3", matrix_only=True)


def atlas_muon_scale():
    import math
    from dataclasses import replace
    from refopt.crosscheck.atlas import Entry, Pair, _p, _preset, _rules, peer_side, restated_side

    R = _rules()
    t_orig = _p("torch.Muon(original)", "torch", "Muon", dict(lr=0.02, weight_decay=0.0),
                lambda: R.Muon.like_torch(lr=0.02, weight_decay=0.0), layout="transpose", matrix_only=True)
    t_rms = _p("torch.Muon(match_rms_adamw)", "torch", "Muon", dict(lr=0.02, weight_decay=0.0,
                                                                      adjust_lr_fn="match_rms_adamw"),
               lambda: R.Muon.like_torch(lr=0.02, weight_decay=0.0, adjust_lr_fn="match_rms_adamw"),
               layout="transpose", matrix_only=True)
    o_def = _preset("optax.contrib.muon")
    o_rms = _p("optax.contrib.muon(consistent_rms)", "optax", "contrib.muon",
               dict(learning_rate=0.02, consistent_rms=0.2), lambda: R.Muon.like_optax(0.02, consistent_rms=0.2),
               matrix_only=True)
    from refopt.crosscheck.presets import MUON_OPTAX

    def spectral_oracle():      # no shape scale, lr * sqrt(fan_out/fan_in) per matrix of the stream
        from refopt.testing.adapters import RuleAdapter
        base = R.Muon.like_optax(0.02)
        shapes = {"w": (6, 12), "v": (12, 6), "tiny": (4, 5)}
        return RuleAdapter(R.Partition(
            rules={k: replace(base, lr=0.02 * math.sqrt(fo / fi), scale="none") for k, (fi, fo) in shapes.items()},
            labels=list(shapes)))
    return Entry(
        "muon-scale", "Muon's shape scale: KellerJordan/torch 'original' sqrt(max(1, out/in)), torch "
        "'match_rms_adamw' and optax consistent_rms 0.2 sqrt(max(out, in)), muP spectral sqrt(fan_out/fan_in)",
        (peer_side("torch original", t_orig, tol=MUON_TORCH_BF16, tol_name="MUON_TORCH_BF16",
                   source="KellerJordan's scale sqrt(max(1, A/B)) on torch's (out, in)"),
         peer_side("torch match_rms_adamw", t_rms, tol=MUON_TORCH_BF16, tol_name="MUON_TORCH_BF16",
                   source="Moonshot (Liu et al. 2025): 0.2 sqrt(max(A, B)), the RMS of AdamW's update"),
         peer_side("optax", o_def, tol=MUON_OPTAX, tol_name="MUON_OPTAX", source="sqrt(max(1, fan_out/fan_in))"),
         peer_side("optax consistent_rms", o_rms, tol=MUON_OPTAX, tol_name="MUON_OPTAX",
                   source="0.2 sqrt(max(fan_in, fan_out))"),
         restated_side("spectral (muP)", "the spectral condition's sqrt(fan_out/fan_in) (post 003)",
                       lambda: replace(R.Muon.like_optax(0.02), scale="spectral"), oracle=spectral_oracle,
                       source="post 003")),
        (Pair("torch original", "torch match_rms_adamw", "step", 0.1, what="per-step update (median)"),
         Pair("optax", "optax consistent_rms", "step", 0.1, what="per-step update (median)"),
         Pair("spectral (muP)", "optax", "step", 0.1, what="per-step update (median; differs on tall matrices)")),
        "the muP spectral condition (post 003) gives sqrt(fan_out/fan_in); KellerJordan's code clips it at 1 "
        "(never shrinks); 'match_rms_adamw' (Moonshot) targets AdamW's update RMS so AdamW's lr and decay transfer.",
        "post 003; KellerJordan/Muon; Liu et al. 2025 (arXiv:2502.16982); CONVENTIONS.md 1.3, 2.4, 10.1",
        matrix_only=True)


def atlas_muon_nesterov():
    from dataclasses import replace
    from refopt.crosscheck.atlas import Entry, Pair, _preset, _rules, peer_side, restated_side

    R = _rules()
    from refopt.crosscheck.presets import MUON_OPTAX
    o = _preset("optax.contrib.muon")
    std = lambda: replace(R.Muon.like_optax(0.02), nesterov_mode="standard")
    return Entry(
        "muon-nesterov-mix", "Muon's Nesterov input: optax mixes like NAdam (bias-corrected); KellerJordan and "
        "torch use (1 - mu) g + mu m",
        (peer_side("optax", o, tol=MUON_OPTAX, tol_name="MUON_OPTAX",
                   source="b m/(1 - b^(t+1)) + (1 - b) g/(1 - b^t), as optax.nadam"),
         restated_side("standard mix", "the same call with KellerJordan's / torch's Nesterov input "
                       "(1 - mu) g + mu m (float64; torch's own run adds bfloat16 noise)", std,
                       source="KellerJordan/Muon muon_update; torch.optim.Muon")),
        (Pair("optax", "standard mix", "step", 1e-3, what="per-step update (median)"),
         Pair("optax", "standard mix", "update", 0.05, what="per-step update (max: the first steps)")),
        "KellerJordan's code (the original Muon) uses the plain lerp (1 - mu) g + mu m; optax borrows NAdam's "
        "bias correction, which changes the first steps most (after msign only the direction counts).",
        "CONVENTIONS.md 2.4, 3.1, 10.2", matrix_only=True)


CONVENTIONS = Conventions(
    rules=(Muon,),
    final="msign of the momentum (Newton-Schulz: its coefficients, its number of iterations, the normalisation before it), the Nesterov mix or the shape scale",
    per_step="a Nesterov bias correction",
    mappings=(TORCH, OPTAX),
    no_peer={"schedulefree": "schedulefree ships the Schedule-Free optimizers only"},
    presets=(
        TORCH.preset("torch.Muon", dict(lr=0.02), "torch (out, in) layout -> transpose; 'original' scale "
                     "sqrt(max(1, A/B)) on (out, in) = refopt 'jordan' on (in, out); EMA momentum + standard Nesterov "
                     "(1-mu)g + mu*m; X/max(||X||, 1e-7); decoupled wd 0.1 with the unadjusted lr; Newton-Schulz in "
                     "bfloat16 (1.3)"),
        TORCH.preset("torch.Muon(match_rms_adamw)", dict(lr=0.02, weight_decay=0.05, adjust_lr_fn="match_rms_adamw"),
                     "'match_rms_adamw' = 0.2*sqrt(max(A, B)) = refopt 'rms_match' (symmetric, layout-free) (1.3)"),
        TORCH.preset("torch.Muon(nesterov=False)", dict(lr=0.02, momentum=0.9, nesterov=False, weight_decay=0.0),
                     "plain EMA momentum into Newton-Schulz (1.3)"),
        OPTAX.preset("optax.contrib.muon", dict(learning_rate=0.02), "(in, out) layout = refopt's; EMA + "
                     "bias-corrected (NAdam) Nesterov; X/(||X||_F + 1e-8); scale_by_shape sqrt(max(1, fan_out/fan_in)) "
                     "= refopt 'jordan'; native dtype (2.4)"),
        OPTAX.preset("optax.contrib.muon(wd,consistent_rms)", dict(learning_rate=0.02, beta=0.9, weight_decay=0.1,
                                                                   consistent_rms=0.2),
                     "consistent_rms=0.2 = refopt 'rms_match'; weight decay lr-coupled, not shape-scaled (2.4)"),
        OPTAX.preset("optax.contrib.muon(nesterov=False,dion)", dict(learning_rate=0.02, nesterov=False,
                                                                     ns_coeffs="dion"),
                     "non-Nesterov input m/(1-beta^t); optax 'dion' = You's five quintics = refopt 'you' (2.4, 4)"),
    ),
    wrong=(
        _wrong("WRONG layout: torch.Muon fed refopt's (in, out) arrays untransposed", "torch", ("Muon", dict(lr=0.02)),
               lambda: _like_torch(lr=0.02), "torch reads shape[:2] as (out, in): the 'original' scale flips on "
               "non-square matrices", **{**_T, "layout": "same"}),
        _wrong("WRONG scale: torch.Muon vs refopt Muon scale='spectral'", "torch", ("Muon", dict(lr=0.02)),
               lambda: replace(_like_torch(lr=0.02), scale="spectral"), "sqrt(fan_out/fan_in) vs sqrt(max(1, A/B))",
               problems=("stream", "mlp", "gpt"),
               problems_why="the quadratic's only matrix is wide (5, 8) (fan_out > fan_in), where 'spectral' and "
                            "'jordan' are the same number sqrt(8/5): nothing is wrong there", **_T),
        _wrong("WRONG sign: torch.Muon fed -g", "torch", ("Muon", dict(lr=0.02)), lambda: _like_torch(lr=0.02),
               "a sign error in the gradient convention (the peer is fed -g)", negate_peer_grads=True,
               **{**_T, "state": {}}),
        _wrong("WRONG momentum: torch.Muon vs refopt Muon(nesterov=False)", "torch", ("Muon", dict(lr=0.02)),
               lambda: _like_torch(lr=0.02, nesterov=False), "standard Nesterov input (1-mu)g + mu*m vs m",
               problems=("stream", "mlp", "gpt"),
               problems_why="on the deterministic quadratic the gradient turns slowly, so m and (1-mu)g + mu*m "
                            "point alike (measured 0.052 < 0.06): below torch's bf16 resolution", **_T),
        _wrong("WRONG Nesterov mix: optax.contrib.muon vs refopt nesterov_mode='standard'", "optax",
               ("contrib.muon", dict(learning_rate=0.02)),
               lambda: replace(OPTAX.rule(learning_rate=0.02), nesterov_mode="standard"),
               "optax's bias-corrected NAdam mix vs KJ/torch (1-mu)g + mu*m (CONVENTIONS 10.2)",
               matrix_only=True, state={"m": "mu"}, tol=MUON_OPTAX, problems=("stream", "mlp", "gpt"),
               problems_why="on the deterministic quadratic the gradient turns slowly, so both mixes point alike "
                            "after msign (float32: 1.3e-4 < 2e-4; float64 catches it)"),
    ),
    oracle=MuonOracle,
    variants=variants,
    facts=facts,
    golden=(
        GoldenCase("muon_torch", lambda: _like_torch(lr=0.02), "torch.optim.Muon conventions (on the transposed "
                   "arrays), Newton-Schulz in the param dtype", _M, True),
        GoldenCase("muon_torch_rms", lambda: _like_torch(lr=0.02, weight_decay=0.05, adjust_lr_fn="match_rms_adamw"),
                   "torch Muon match_rms_adamw = rms_match", _M, True),
        GoldenCase("muon_optax", lambda: OPTAX.rule(learning_rate=0.02), "optax.contrib.muon conventions", _M, True),
        GoldenCase("muon_optax_wd_rms", lambda: OPTAX.rule(learning_rate=0.02, beta=0.9, weight_decay=0.1,
                                                           consistent_rms=0.2),
                   "optax muon consistent_rms=0.2, wd 0.1", _M, True),
        GoldenCase("muon_spectral", lambda: Muon(lr=0.02), "refopt default Muon: spectral scale, exact normalisation",
                   _M, True),
        GoldenCase("muon_svd", lambda: Muon(lr=0.02, msign="svd", weight_decay=0.01), "exact msign by SVD", _M, True),
        GoldenCase("muon_polar_express", lambda: Muon(lr=0.02, ns_coeffs="polar_express", ns_steps=8),
                   "Polar Express coefficients", _M, True),
    ),
    examples=(
        Example("muon_jordan_4d_conv", lambda: Muon(lr=0.05, scale="jordan_4d"), "conv", converges=False,
                note="constant lr: the msign step keeps spectral norm lr*s, so Muon orbits the minimum at radius ~lr"),
        *(Example(n, f, "matrix", converges=False, note="constant lr: the msign step keeps spectral norm lr*s, so "
                  "Muon orbits the minimum at radius ~lr") for n, f in (
            ("muon", lambda: Muon(lr=0.05)),
            ("muon_jordan_wd", lambda: Muon(lr=0.05, scale="jordan", weight_decay=0.01)),
            ("muon_rms_match_independent_wd", lambda: Muon(lr=0.05, scale="rms_match", weight_decay=1e-3,
                                                           wd_mode="independent")),
            ("muon_plain_momentum_svd", lambda: Muon(lr=0.05, nesterov=False, msign="svd", scale="none")),
            ("muon_polar_express", lambda: Muon(lr=0.05, ns_coeffs="polar_express", ns_steps=8)),
            ("muon_like_torch", lambda: _like_torch(lr=0.05)),
            ("muon_like_optax", lambda: OPTAX.rule(learning_rate=0.05, ns_coeffs="dion")))),
        Example("muon_cosine", lambda: Muon(lr=0.1, schedule=_cosine(5)), "matrix"),
        Example("muon_svd_cosine_wd", lambda: Muon(lr=0.1, msign="svd", weight_decay=1e-3, schedule=_cosine(0)),
                "matrix"),
    ),
    atlas=(atlas_muon_4d, atlas_muon_bf16, atlas_muon_scale, atlas_muon_nesterov,),
)


def _cosine(warmup):
    from refopt.schedules import warmup_cosine
    return warmup_cosine(warmup, 300, 0.0)
