"""NorMuon (refopt/rules/normuon.py) to pytorch_optimizer.NorMuon 4.1.0: torch's (out, in) layout (the rule on
the transposes: a torch row is a refopt column), Newton-Schulz normalised by max(||X||_F, 1e-7) (eps_mode
'clamp'), the update's Frobenius norm preserved ('preserve_norm', the authors' code) or set to 0.2 sqrt(m n)
('match_rms', the paper), lr scaled by sqrt(max(1, out/in)) or, with use_adjusted_lr, 0.2 sqrt(max(out, in)).

NorMuon takes parameter groups with a ``use_muon`` flag: :func:`pytorch_optimizer_normuon` builds them (arrays
of ndim >= 2 in the Muon group, the others in the AdamW group, pytorch_optimizer's AdamW: torch's), the split
``like("pytorch_optimizer.NorMuon", ...)`` reproduces with a Partition by :func:`refopt.at_least_2d_labels`.
docs/factories/normuon.py drives it from ``refopt crosscheck --impl``. torch.optim and optax ship no NorMuon."""
from __future__ import annotations

import numpy as np

from refopt.conventions._spec import (BETAS2, NO_MAXIMIZE, Conventions, Example, PeerMapping, Preset,
                                      ShapeScaledOracle, decoupled_decay_only, scalar)
from refopt.golden import GoldenCase
from refopt.rules.normuon import NorMuon
from refopt.rules.partition import Partition, at_least_2d_labels

_KJ = (3.4445, -4.775, 2.0315)


class NorMuonOracle(ShapeScaledOracle):
    """NorMuon from the rule's docstring, array by array in numpy, on the (fan_in, fan_out) view. Switches:
    ``axis`` 'out' (v per output neuron, the rule's) | 'in' (per input row: the neuron read from the other
    layout); ``v_of`` 'O' (the rule's) | 'M' (v of the msign input, before Newton-Schulz); ``update_scale``
    overriding the rule's; ``normalise`` False (hat O = O: Muon with NorMuon's rescale)."""

    def init_leaf(self, x, path):
        from refopt.rules.muon import matrix_shape
        fan_in, fan_out = matrix_shape(x.shape)
        return {"m": np.zeros_like(x), "v": np.zeros((1, fan_out), x.dtype), "v_in": np.zeros((fan_in, 1), x.dtype)}

    def unscaled(self, t, s, x, g, path):
        from refopt.linalg._msign import _msign_svd, newton_schulz, ns_coefficients
        from refopt.rules.muon import matrix_shape

        r, d, sw = self.rule, x.dtype, self.switches
        mu = r.momentum
        s["m"] = scalar(mu, d) * s["m"] + scalar(1.0 - mu, d) * g
        M = scalar(mu, d) * s["m"] + scalar(1.0 - mu, d) * g if r.nesterov else s["m"]
        M = M.reshape(matrix_shape(x.shape))
        if r.msign == "svd":
            O = _msign_svd(M, None)
        else:
            O = newton_schulz(M, ns_coefficients(r.ns_coeffs, r.ns_steps), r.eps_mode, r.norm_eps, r.norm_factor)
        src = M if sw.get("v_of", "O") == "M" else O
        if sw.get("axis", "out") == "in":
            key, sq = "v_in", np.mean(src * src, axis=1, keepdims=True)
        else:
            key, sq = "v", np.mean(src * src, axis=0, keepdims=True)
        s[key] = scalar(r.beta2, d) * s[key] + scalar(1.0 - r.beta2, d) * sq
        O_hat = O / (np.sqrt(s[key]) + scalar(r.eps, d)) if sw.get("normalise", True) else O.copy()
        n_hat = float(np.sqrt(np.sum(O_hat.astype(np.float64) ** 2))) + r.eps
        if sw.get("update_scale", r.update_scale) == "match_rms":
            rho = 0.2 * np.sqrt(float(O.size)) / n_hat
        else:
            rho = float(np.sqrt(np.sum(O.astype(np.float64) ** 2))) / n_hat
        return (scalar(rho, d) * O_hat).reshape(x.shape)


def variants(rule):
    from refopt.conventions._variants import (TransposedRule, Variant, oracle_variant as v, rule_variant as rv,
                                              shape_scale_variants, try_replace)

    other = "preserve_norm" if rule.update_scale == "match_rms" else "match_rms"
    say = {"match_rms": "0.2 sqrt(fan_in fan_out) / ||hat O||_F (the paper)",
           "preserve_norm": "||O||_F / ||hat O||_F (the authors' code)"}
    out = [Variant("layout transposed", "the rule applied to W^T: torch's (out, in) layout read as refopt's "
                   "(in, out) or the reverse (the neurons become the input rows)", lambda: TransposedRule(rule)),
           v(rule, "v per input row", "the second moment averaged over the output axis (one entry per fan_in "
             "row) in place of one per output neuron", axis="in"),
           v(rule, "v of the momentum", "v_t from the msign input M_t^2 in place of O_t^2", v_of="M"),
           v(rule, "no row normalisation", "hat O_t = O_t (Muon rescaled) in place of O_t / (sqrt(v_t) + eps)",
             normalise=False),
           v(rule, f"update_scale='{other}'", f"rho_t = {say[other]} in place of {say[rule.update_scale]}",
             update_scale=other),
           rv("nesterov flipped", "Nesterov input (1-mu) g + mu m vs plain momentum m",
              try_replace(rule, nesterov=not rule.nesterov))]
    return [o for o in out if o is not None] + shape_scale_variants(rule)


def facts(rule, of):
    """msign(c M) = msign(M), and the normalisation and rescale take O_t alone, so the step has degree 0 in g
    (the decoupled decay does not read g); v is per neuron, so the step is not equivariant under rotations of
    the output space (``orthogonal`` False) nor under permutations of a matrix's entries."""
    return {"grad_scale": True, "step_scale_free": False, "orthogonal": False, "elementwise": False,
            "exact_scale_free": rule.eps_mode == "none"}


# ---- pytorch_optimizer -----------------------------------------------------------------------------------
def pytorch_optimizer_groups(params) -> list:
    """NorMuon's parameter groups for the torch tensors ``params``: ``use_muon=True`` for ndim >= 2, False (its
    AdamW) for the others; empty groups left out."""
    params = list(params)
    groups = [dict(params=[p for p in params if p.ndim >= 2], use_muon=True),
              dict(params=[p for p in params if p.ndim < 2], use_muon=False)]
    return [g for g in groups if g["params"]]


def pytorch_optimizer_normuon(params, newton_schulz_dtype: str = "params", **kwargs):
    """``pytorch_optimizer.NorMuon(pytorch_optimizer_groups(params), **kwargs)``. ``newton_schulz_dtype``:
    'params' runs the Newton-Schulz iteration in each update's dtype (a subclass replacing the batched path's
    ``_orthogonalize``; ``foreach=True`` so that path is taken, and ``foreach=False`` raises ValueError),
    'bfloat16' is the package as it ships."""
    from pytorch_optimizer import NorMuon as PackageNorMuon
    from pytorch_optimizer.optimizer.utils.matrix import zero_power_via_newton_schulz_5

    if newton_schulz_dtype not in ("params", "bfloat16"):
        raise ValueError(f"newton_schulz_dtype must be 'params' or 'bfloat16', got {newton_schulz_dtype!r}")
    if newton_schulz_dtype == "bfloat16":
        return PackageNorMuon(pytorch_optimizer_groups(params), **kwargs)
    if kwargs.get("foreach", True) is False:
        raise ValueError("foreach=False takes NorMuon's unbatched path, whose Newton-Schulz stays bfloat16; drop it "
                         "(or pass newton_schulz_dtype='bfloat16' for the package as it ships)")

    class NorMuonParamsDtype(PackageNorMuon):
        @staticmethod
        def _orthogonalize(group, updates):
            return [zero_power_via_newton_schulz_5(u.reshape(u.size(0), -1), num_steps=group["ns_steps"],
                                                   weights=group["ns_coeffs"], dtype=u.dtype) for u in updates]

    return NorMuonParamsDtype(pytorch_optimizer_groups(params), **{"foreach": True, **kwargs})


def _coeffs(ns_coeffs):
    if ns_coeffs == "original":
        return "jordan"
    return ns_coeffs


def _pytorch_optimizer(lr, momentum, beta2, weight_decay, weight_decouple, nesterov, ns_steps, ns_coeffs,
                       update_scale, use_adjusted_lr, adamw_lr, adamw_betas, adamw_wd, adamw_eps, eps):
    from refopt.conventions import peers

    decoupled_decay_only("NorMuon", weight_decay > 0 or adamw_wd > 0, weight_decouple, False, "before the momentum")
    shape = ("rms_match" if use_adjusted_lr else "jordan") if update_scale == "preserve_norm" else "none"
    hidden = NorMuon(lr=lr, momentum=momentum, beta2=beta2, eps=eps, update_scale=update_scale, scale=shape,
                     weight_decay=weight_decay, nesterov=nesterov, ns_coeffs=_coeffs(ns_coeffs), ns_steps=ns_steps,
                     eps_mode="clamp", norm_eps=1e-7)
    other = peers()["torch.optim.AdamW"].rule(lr=adamw_lr, betas=tuple(adamw_betas), eps=adamw_eps,
                                             weight_decay=adamw_wd)
    return Partition(rules={"hidden": hidden, "other": other}, labels=at_least_2d_labels)


def _match(rule):
    """The pytorch_optimizer.NorMuon call of the Partition the mapping builds (a 'hidden' NorMuon, torch's
    AdamW in 'other')."""
    from refopt.conventions import peers

    if not isinstance(rule, Partition) or set(rule.rules) != {"hidden", "other"} \
            or rule.labels is not at_least_2d_labels:
        return None
    h = rule.rules["hidden"]
    a = peers()["torch.optim.AdamW"].match(rule.rules["other"])
    scales = {"match_rms": {"none": False}, "preserve_norm": {"jordan": False, "rms_match": True}}
    if type(h) is not NorMuon or h.schedule is not None or h.msign != "newton_schulz" or h.eps_mode != "clamp" \
            or h.norm_eps != 1e-7 or h.norm_factor != 1.0 or h.scale not in scales[h.update_scale] or a is None \
            or set(a) != {"lr", "betas", "eps", "weight_decay"}:
        return None
    coeffs = "original" if h.ns_coeffs in ("jordan", _KJ) else h.ns_coeffs
    if isinstance(coeffs, str) and coeffs != "original":
        return None
    return dict(lr=h.lr, momentum=h.momentum, beta2=h.beta2, weight_decay=h.weight_decay, nesterov=h.nesterov,
                ns_steps=h.ns_steps, ns_coeffs=coeffs, update_scale=h.update_scale,
                use_adjusted_lr=scales[h.update_scale][h.scale], adamw_lr=a["lr"], adamw_betas=tuple(a["betas"]),
                adamw_wd=a["weight_decay"], adamw_eps=a["eps"], eps=h.eps)


PYTORCH_OPTIMIZER = PeerMapping(
    "pytorch_optimizer.NorMuon", "pytorch_optimizer", "NorMuon",
    dict(lr=2e-2, momentum=0.95, beta2=0.95, weight_decay=0.0, weight_decouple=True, nesterov=True, ns_steps=5,
         ns_coeffs="original", update_scale="preserve_norm", use_adjusted_lr=False, adamw_lr=3e-4,
         adamw_betas=(0.9, 0.95), adamw_wd=0.0, adamw_eps=1e-10, eps=1e-10),
    _pytorch_optimizer, "normuon", ignore=("foreach",),
    refuse={"ns_coeffs": (lambda v: not isinstance(v, str) or v == "original",
                          "of pytorch_optimizer's named schedules refopt maps 'original' (Keller Jordan's); give "
                          "the others as their (a, b, c) rows"),
            "eps": (lambda v: v > 0, "refopt's NorMuon needs eps > 0 (a zero update divides 0 by 0 otherwise)"),
            "adamw_betas": BETAS2, "maximize": NO_MAXIMIZE},
    state={"m": "momentum_buffer", "v": "second_momentum_buffer"}, layout="transpose", match=_match, factory=pytorch_optimizer_normuon)


def atlas_normuon():
    from dataclasses import replace
    from functools import partial

    from refopt.conventions._spec import MUON_TORCH_BF16
    from refopt.crosscheck.atlas import Entry, Pair, peer_side, restated_side

    kw = dict(lr=0.02, momentum=0.95, beta2=0.95)
    p = PYTORCH_OPTIMIZER.preset("pytorch_optimizer.NorMuon", kw, "atlas", factory=pytorch_optimizer_normuon)
    p_bf16 = replace(p, name="pytorch_optimizer.NorMuon(bfloat16)",
                     factory=partial(pytorch_optimizer_normuon, newton_schulz_dtype="bfloat16"))
    paper = NorMuon(lr=0.02, eps_mode="clamp", norm_eps=1e-7)

    def hidden():   # the stream's arrays are matrices: the Partition's Muon group alone
        return p.make_rule().rules["hidden"]

    return Entry(
        "normuon-update-scale",
        "NorMuon's rescale of the normalised update: the Frobenius norm of O_t kept and Muon's shape scale (the "
        "authors' code, pytorch_optimizer) vs an RMS of 0.2 (the paper's Algorithm 1); bfloat16 Newton-Schulz",
        (peer_side("pytorch_optimizer", p, make_refopt=hidden,
                   source="pytorch_optimizer 4.1.0 NorMuon (update_scale='preserve_norm', the default), its "
                          "Newton-Schulz in float64 (refopt.conventions.normuon.pytorch_optimizer_normuon)"),
         peer_side("pytorch_optimizer bfloat16", p_bf16, make_refopt=hidden, tol=MUON_TORCH_BF16,
                   tol_name="MUON_TORCH_BF16", source="pytorch_optimizer 4.1.0 NorMuon as it ships (Newton-Schulz "
                                                      "in bfloat16)"),
         restated_side("paper", "Li et al. 2025, Algorithm 1: rho_t = 0.2 sqrt(m n) / ||hat O_t||_F, no shape "
                       "scale", lambda: paper, oracle=lambda: NorMuonOracle(paper),
                       source="arXiv:2510.05491, Algorithm 1")),
        (Pair("pytorch_optimizer", "paper", "final", 1e-2, what="params after 50 steps at lr 0.02: the rescale"),
         Pair("pytorch_optimizer bfloat16", "pytorch_optimizer", "update", 1e-3,
              what="per-step update, max over steps and arrays: bfloat16 vs float64 Newton-Schulz")),
        "The paper (Algorithm 1) sets the update's RMS to 0.2, so that NorMuon shares AdamW's lr; the authors' code "
        "and pytorch_optimizer's default keep ||O_t||_F and multiply lr by Muon's sqrt(max(1, out/in)), so their lr "
        "is Muon's. like('pytorch_optimizer.NorMuon', update_scale='match_rms') is the paper's.",
        "Li et al. 2025 (arXiv:2510.05491), Algorithm 1; ShizukaKuze/NorMuon normuon_update; pytorch_optimizer "
        "4.1.0", matrix_only=True)


_KW = dict(lr=0.01, momentum=0.9, beta2=0.99, weight_decay=0.05, adamw_lr=1e-3, adamw_betas=(0.85, 0.98),
           adamw_wd=0.01, adamw_eps=1e-8, eps=1e-8)

_F = dict(factory=pytorch_optimizer_normuon)

CONVENTIONS = Conventions(
    rules=(NorMuon,),
    final="rho_t (sqrt(v_t) + eps)^-1 O_t of the orthogonalised momentum: which axis v averages over (the "
          "neurons), what v squares, the rescale rho_t, the shape scale",
    per_step="lr_t",
    mappings=(PYTORCH_OPTIMIZER,),
    presets=(
        PYTORCH_OPTIMIZER.preset("pytorch_optimizer.NorMuon", dict(lr=0.02),
                                 "preserve_norm, lr sqrt(max(1, out/in)); vectors by AdamW (lr 3e-4); Newton-Schulz "
                                 "in the params' dtype (pytorch_optimizer_normuon)", **_F),
        PYTORCH_OPTIMIZER.preset("pytorch_optimizer.NorMuon(momentum,beta2,wd,adamw)", _KW,
                                 "momentum 0.9, beta2 0.99, decay 0.05, eps 1e-8; AdamW lr 1e-3, betas (0.85, 0.98), "
                                 "decay 0.01", **_F),
        PYTORCH_OPTIMIZER.preset("pytorch_optimizer.NorMuon(match_rms)",
                                 dict(lr=2e-3, update_scale="match_rms", nesterov=False, ns_steps=6),
                                 "the paper's rescale (RMS 0.2 lr), no Nesterov, 6 Newton-Schulz steps", **_F),
        PYTORCH_OPTIMIZER.preset("pytorch_optimizer.NorMuon(use_adjusted_lr)",
                                 dict(lr=3e-3, use_adjusted_lr=True, weight_decay=0.1),
                                 "lr 0.2 sqrt(max(out, in)) (Moonlight's), decay 0.1", **_F)),
    wrong=(Preset("WRONG rescale: pytorch_optimizer.NorMuon vs refopt NorMuon(update_scale='match_rms')",
                  "pytorch_optimizer", "normuon", ("NorMuon", dict(lr=0.02)),
                  lambda: PYTORCH_OPTIMIZER.rule(lr=0.02, update_scale="match_rms"),
                  "the paper's RMS 0.2 against the package's preserved norm", layout="transpose",
                  expect_fail=True, factory=pytorch_optimizer_normuon),),
    no_peer={"torch": "torch.optim ships no NorMuon", "optax": "optax 0.2.8 ships no NorMuon",
             "schedulefree": "schedulefree ships the Schedule-Free optimizers only"},
    oracle=NorMuonOracle,
    variants=variants,
    facts=facts,
    atlas=(atlas_normuon,),
    golden=(GoldenCase("normuon", lambda: NorMuon(lr=0.02, msign="svd"), "NorMuon, the paper's match_rms, "
                       "exact msign", ("m", "v"), matrix_only=True),
            GoldenCase("normuon_pytorch_optimizer", lambda: PYTORCH_OPTIMIZER.rule(**_KW).rules["hidden"],
                       "like('pytorch_optimizer.NorMuon', lr 0.01, momentum 0.9, beta2 0.99, wd 0.05, eps 1e-8)'s "
                       "Muon group: preserve_norm, the jordan scale, Newton-Schulz", ("m", "v"), matrix_only=True)),
    examples=(Example("normuon", lambda: NorMuon(lr=0.02), params="matrix", converges=False,
                      note="the update has a fixed RMS 0.2 lr at constant lr, so it orbits the minimum"),
              Example("normuon_preserve", lambda: NorMuon(lr=0.02, update_scale="preserve_norm", scale="jordan",
                                                          weight_decay=0.01, msign="svd"),
                      params="matrix", converges=False,
                      note="the update keeps ||msign(M)||_F at constant lr, so it orbits the minimum")),
)
