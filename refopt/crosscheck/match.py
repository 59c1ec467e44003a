r"""Peer presets matched by hyperparameters: which peer call reproduces a given refopt rule.

:func:`preset_for` builds, for any rule configuration, the :class:`~refopt.crosscheck.presets.Preset` of a
peer that reproduces it -- ``Adam(lr=1e-3, beta2=0.95)`` -> ``torch.optim.Adam(lr=0.001, betas=(0.9,
0.95))`` -- or None when the peer has no such configuration. The peer call lists only the keywords that
differ from the peer's own defaults (:data:`PEER_DEFAULTS`; e.g. ``optax.lamb``'s eps is 1e-6, not
1e-8, so ``Covariant(Adam(eps=1e-8))`` passes ``eps=1e-08``). The conventions behind each mapping are
those of the hand-written presets (CONVENTIONS.md 1, 2, 5); the tolerance tiers are the same
(:data:`~refopt.crosscheck.presets.EXACT`, ``MUON_TORCH_BF16``, ``MUON_OPTAX``).

Covariant (issue 11): ``optax.lamb(weight_decay=0)`` is ``Covariant(Adam(...))`` and
``optax.lars(momentum=0, trust_coefficient=1)`` is ``Covariant(SGD(...))`` (its L2 ``weight_decay``
enters before the trust ratio, as SGD's). **Known gap**: at a zero norm optax's trust ratio is 1 (the
step is then -lr * u) where refopt's Covariant makes no step; the canonical problems have no zero
arrays, so the trajectories agree.
"""
from __future__ import annotations

from refopt.crosscheck.presets import EXACT, MUON_OPTAX, MUON_TORCH_BF16, Preset

__all__ = ["preset_for", "PEER_DEFAULTS"]

_TORCH_MUON_NS = (3.4445, -4.775, 2.0315)

#: the defaults of the peer calls built here (keywords equal to these are left out of the call)
PEER_DEFAULTS = {
    ("torch", "SGD"): dict(lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False),
    ("torch", "Adam"): dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0),
    ("torch", "AdamW"): dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2),
    ("torch", "Muon"): dict(lr=1e-3, weight_decay=0.1, momentum=0.95, nesterov=True,
                            ns_coefficients=_TORCH_MUON_NS, eps=1e-7, ns_steps=5, adjust_lr_fn=None),
    ("optax", "sgd"): dict(momentum=None, nesterov=False),
    ("optax", "adam"): dict(b1=0.9, b2=0.999, eps=1e-8),
    ("optax", "nadam"): dict(b1=0.9, b2=0.999, eps=1e-8),
    ("optax", "adamw"): dict(b1=0.9, b2=0.999, eps=1e-8, weight_decay=1e-4),
    ("optax", "nadamw"): dict(b1=0.9, b2=0.999, eps=1e-8, weight_decay=1e-4),
    ("optax", "lamb"): dict(b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.0),
    ("optax", "lars"): dict(weight_decay=0.0, trust_coefficient=1e-3, eps=0.0, momentum=0.9, nesterov=False),
    ("optax", "lion"): dict(b1=0.9, b2=0.99, weight_decay=1e-3),
    ("optax", "contrib.muon"): dict(ns_coeffs=_TORCH_MUON_NS, ns_steps=5, beta=0.95, eps=1e-8, weight_decay=0.0,
                                    nesterov=True, consistent_rms=None),
    ("schedulefree", "SGDScheduleFreeReference"): dict(momentum=0.9, weight_decay=0.0, warmup_steps=0, r=0.0,
                                                       weight_lr_power=2.0),
    ("schedulefree", "AdamWScheduleFreeReference"): dict(betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                                                         warmup_steps=0, r=0.0, weight_lr_power=2.0,
                                                         decay_at_z=False),
}


def _call(peer: str, ctor: str, kw: dict, always=("lr", "learning_rate")) -> tuple[str, dict]:
    d = PEER_DEFAULTS.get((peer, ctor), {})
    out = {}
    for k, v in kw.items():
        if k in always or k not in d or not _eq(d[k], v):
            out[k] = v
    return ctor, out


def _eq(a, b) -> bool:
    if isinstance(a, tuple) or isinstance(b, tuple):
        return isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b) and all(_eq(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b or (isinstance(a, float) and isinstance(b, (int, float)) and
                                             not isinstance(b, bool) and a == b)


def _plain(rule) -> bool:
    return getattr(rule, "schedule", None) is None


def _torch(rule):
    n = type(rule).__name__
    if not _plain(rule):
        return None
    if n == "SGD":
        kw = dict(lr=rule.lr, momentum=rule.momentum, dampening=rule.dampening, weight_decay=rule.weight_decay,
                  nesterov=rule.nesterov)
        return _call("torch", "SGD", kw), {"b": "momentum_buffer"} if rule.momentum else {}, "same", EXACT, "sgd"
    if n in ("Adam", "AdamW") and not rule.nesterov:
        if n == "AdamW" and rule.wd_mode != "decoupled":
            return None
        kw = dict(lr=rule.lr, betas=(rule.beta1, rule.beta2), eps=rule.eps, weight_decay=rule.weight_decay)
        return _call("torch", n, kw), {"m": "exp_avg", "v": "exp_avg_sq"}, "same", EXACT, n.lower()
    if n == "Muon":
        coeffs = rule.ns_coeffs if not isinstance(rule.ns_coeffs, str) else None
        if rule.ns_coeffs == "jordan":
            coeffs = _TORCH_MUON_NS
        if (rule.msign != "newton_schulz" or rule.nesterov_mode != "standard" or rule.eps_mode != "clamp"
                or rule.norm_factor != 1.0 or rule.wd_mode != "decoupled" or rule.scale not in ("jordan", "rms_match")
                or coeffs is None or len(coeffs) != 3 or isinstance(coeffs[0], tuple)):
            return None
        kw = dict(lr=rule.lr, weight_decay=rule.weight_decay, momentum=rule.momentum, nesterov=rule.nesterov,
                  ns_coefficients=tuple(coeffs), eps=rule.norm_eps, ns_steps=rule.ns_steps,
                  adjust_lr_fn="match_rms_adamw" if rule.scale == "rms_match" else None)
        return _call("torch", "Muon", kw), {"m": "momentum_buffer"}, "transpose", MUON_TORCH_BF16, "muon"
    return None


def _optax(rule):
    n = type(rule).__name__
    if not _plain(rule):
        return None
    if n == "SGD" and rule.dampening == 0 and rule.weight_decay == 0:
        kw = dict(learning_rate=rule.lr, momentum=rule.momentum or None, nesterov=rule.nesterov)
        return _call("optax", "sgd", kw), {"b": "trace"} if rule.momentum else {}, "same", EXACT, "sgd"
    if n == "Adam" and rule.weight_decay == 0:
        ctor = "nadam" if rule.nesterov else "adam"
        kw = dict(learning_rate=rule.lr, b1=rule.beta1, b2=rule.beta2, eps=rule.eps)
        return _call("optax", ctor, kw), {"m": "mu", "v": "nu"}, "same", EXACT, ctor
    if n == "AdamW" and rule.wd_mode == "decoupled":
        ctor = "nadamw" if rule.nesterov else "adamw"
        kw = dict(learning_rate=rule.lr, b1=rule.beta1, b2=rule.beta2, eps=rule.eps, weight_decay=rule.weight_decay)
        return _call("optax", ctor, kw), {"m": "mu", "v": "nu"}, "same", EXACT, "adamw"
    if n == "Covariant" and rule.norm in ("fro", "rms"):
        b = rule.base
        bn = type(b).__name__
        if bn == "Adam" and b.weight_decay == 0 and not b.nesterov and _plain(b):
            kw = dict(learning_rate=rule.lr, b1=b.beta1, b2=b.beta2, eps=b.eps, weight_decay=0.0)
            return _call("optax", "lamb", kw), {"base.m": "mu", "base.v": "nu"}, "same", EXACT, "covariant"
        if bn == "SGD" and b.momentum == 0 and _plain(b):
            kw = dict(learning_rate=rule.lr, weight_decay=b.weight_decay, trust_coefficient=1.0, momentum=0.0)
            return _call("optax", "lars", kw), {}, "same", EXACT, "covariant"
    if n == "Muon" and rule.msign == "newton_schulz" and rule.nesterov_mode == "bias_corrected" and \
            rule.eps_mode == "add" and rule.norm_factor == 1.0 and rule.scale in ("jordan", "rms_match") and \
            rule.wd_mode == "decoupled":
        coeffs = rule.ns_coeffs
        if coeffs == "jordan":
            coeffs = _TORCH_MUON_NS
        if isinstance(coeffs, str):
            coeffs = "dion" if coeffs == "you" else None
        if coeffs is None:
            return None
        kw = dict(learning_rate=rule.lr, ns_coeffs=coeffs, ns_steps=rule.ns_steps, beta=rule.momentum,
                  eps=rule.norm_eps, weight_decay=rule.weight_decay, nesterov=rule.nesterov,
                  consistent_rms=0.2 if rule.scale == "rms_match" else None)
        return _call("optax", "contrib.muon", kw), {"m": "mu"}, "same", MUON_OPTAX, "muon"
    return None


def _schedulefree(rule):
    n = type(rule).__name__
    if not _plain(rule) or getattr(rule, "warmup_lag", False):
        return None
    if n == "ScheduleFreeSGD":
        kw = dict(lr=rule.lr, momentum=rule.beta, weight_decay=rule.weight_decay, warmup_steps=rule.warmup_steps,
                  r=rule.r, weight_lr_power=rule.weight_lr_power)
        return _call("schedulefree", "SGDScheduleFreeReference", kw), {"z": "z", "x": "x"}, "same", EXACT, "sf_sgd"
    if n == "ScheduleFreeAdamW":
        kw = dict(lr=rule.lr, betas=(rule.beta1, rule.beta2), eps=rule.eps, weight_decay=rule.weight_decay,
                  warmup_steps=rule.warmup_steps, r=rule.r, weight_lr_power=rule.weight_lr_power,
                  decay_at_z=rule.decay_at_z)
        return _call("schedulefree", "AdamWScheduleFreeReference", kw), {"z": "z", "x": "x", "v": "exp_avg_sq"}, \
            "same", EXACT, "sf_adamw"
    return None


_MAKERS = {"torch": _torch, "optax": _optax, "schedulefree": _schedulefree}


def preset_for(rule, peer: str) -> Preset | None:
    """The preset of ``peer`` ('torch', 'optax', 'schedulefree') that reproduces ``rule``, or None."""
    if peer not in _MAKERS:
        raise ValueError(f"unknown peer {peer!r}; choose from {sorted(_MAKERS)}")
    try:
        got = _MAKERS[peer](rule)
    except AttributeError:
        return None
    if got is None:
        return None
    (ctor, kw), state, layout, tol, family = got
    p = Preset(f"{peer}.{ctor} (matched by hyperparameters)", peer, family, (ctor, kw), lambda r=rule: r,
               "matched by hyperparameters (refopt.crosscheck.match)", layout=layout,
               matrix_only=type(rule).__name__ == "Muon", state=state, tol=tol)
    return p
