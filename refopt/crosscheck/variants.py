r"""Convention variants: the known ways an implementation of a rule can differ, each runnable.

When an implementation does not reproduce a refopt rule, :func:`variants` lists the convention variants
of that rule (the deliberately wrong presets of :data:`refopt.crosscheck.presets.MISCONFIGURED` and more,
CONVENTIONS.md / PITFALLS.md), each as an :class:`~refopt.testing.adapters.Adapter`; the plug-in
cross-check (:mod:`refopt.crosscheck.plugin`) runs them all on the same inputs and names the one that
reproduces the implementation's numbers. Variants are written from their equations, in the arrays'
dtype with scalars computed in float64 and cast (as torch does), t = 1 for the first step:

Adam / AdamW (g includes L2 decay where the rule has it; mhat = m/(1-b1^t), vhat = v/(1-b2^t))
    ``eps inside the sqrt``        mhat / sqrt(vhat + eps)                       (PITFALLS B02, E3)
    ``eps^2 inside the sqrt``      mhat / sqrt(vhat + eps^2)
    ``eps-hat``                    lr sqrt(1-b2^t)/(1-b1^t) * m / (sqrt(v) + eps)  (Kingma's "efficient" form)
    ``bias correction off by one`` 1 - b^(t+1) in place of 1 - b^t
    ``no bias correction``         m / (sqrt(v) + eps)
    ``bias correction of m only`` / ``of v only``
    ``L2 decay``                   g + wd x through the moments (torch Adam's weight_decay)
    ``decoupled decay (lr-coupled)``  x (1 - lr wd) - lr u   (torch AdamW)
    ``lr-independent decay``       x (1 - wd) - lr u
    ``decay applied after the update``  (x - lr u)(1 - lr wd)
    ``no weight decay`` / ``torch AdamW default decay 0.01`` / ``optax adamw default decay 1e-4``
    ``NAdam`` / ``no NAdam``       refopt's ``nesterov`` flipped
SGD
    ``momentum dampening on step 1``  b_1 = (1 - tau) g_1 (torch leaves the first buffer undampened)
    ``EMA momentum``               b = mu b + (1 - mu) g (dampening = momentum)
    ``no Nesterov``;  ``Nesterov``;  ``no momentum``;  ``momentum 0.9`` (not given)
    ``decoupled decay`` / ``decay applied after the update`` (for the L2 of the rule)
Muon
    ``layout transposed`` (the rule on W^T), ``scale='...'`` (spectral, jordan, rms_match, none),
    ``nesterov flipped``, ``nesterov_mode='...'``, ``NS normalisation eps`` (none, add 1e-7 / 1e-8,
    clamp 1e-7), ``exact msign (svd)``, ``wd_mode flipped``, ``weight_decay 0`` / ``0.1 (torch default)``
Schedule-Free
    ``warmup lag`` flipped (optax#1744), ``decay_at_z`` flipped
EMA
    ``debias`` flipped, ``start`` variants where the rule has the field
Covariant (LAMB / LARS)
    the variants of the base rule inside; ``momentum after the trust ratio`` (optax.lars with momentum);
    ``trust ratio 1 at a zero norm`` (optax's convention: a zero array moves by -lr u)

Any rule with ``weight_decay`` > 0 or a ``schedule``
    ``no weight decay on vectors`` (decay on arrays of ndim >= 2 only: the usual torch parameter groups);
    ``schedule counted from 0`` (gamma(t - 1) at step t) and ``schedule one step ahead`` (gamma(t + 1))

Variants that equal the rule for its hyperparameters (e.g. the decay variants when weight_decay = 0)
are left out.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import Any, Callable

import numpy as np

from refopt import tree as T
from refopt.testing.adapters import Adapter, RuleAdapter

__all__ = ["Variant", "variants", "ConventionAdam", "ConventionSGD", "TrustRatioThenMomentum"]


@dataclass(frozen=True)
class Variant:
    """A named convention variant: ``make()`` returns its adapter."""

    name: str
    detail: str
    make: Callable[[], Adapter]


# -------------------------------------------------------------------------------------------------------
class _ListStepper(Adapter):
    """Base of the numpy variants: per-leaf state dicts, a step counter, lists of arrays."""

    framework = "numpy"

    def init(self, params):
        xs, _, _ = T.flatten(params)
        return (0, [self.init_leaf(np.asarray(x)) for x in xs])

    def step(self, state, params, grads):
        t, leaves = state
        t += 1
        xs, gs, _, td = T.check_like(params, grads)
        new_x, new_s = [], []
        for x, g, s in zip(xs, gs, leaves):
            s = {k: v.copy() for k, v in s.items()}
            new_x.append(self.step_leaf(t, s, np.array(x, copy=True), np.asarray(g)))
            new_s.append(s)
        return T.unflatten(td, new_x), (t, new_s)

    def state_arrays(self, state) -> dict:
        out: dict = {}
        for i, s in enumerate(state[1]):
            for k, v in s.items():
                out.setdefault(k, [None] * len(state[1]))[i] = v
        return out


def _c(v: float, dtype) -> Any:
    return np.asarray(v, dtype=dtype)[()]


class ConventionAdam(_ListStepper):
    r"""Adam / AdamW with switchable conventions (see the module docstring).

    eps_mode: 'outside' (E1), 'inside' (sqrt(vhat + eps)), 'inside_sq' (sqrt(vhat + eps^2)), 'hat';
    bias: 'standard', 'off_by_one', 'none', 'm_only', 'v_only'; decay: 'none', 'l2', 'decoupled',
    'independent', 'after'; nesterov: optax's NAdam mix."""

    def __init__(self, lr, beta1, beta2, eps, weight_decay=0.0, decay="none", eps_mode="outside",
                 bias="standard", nesterov=False, schedule=None, name="adam variant"):
        self.lr, self.b1, self.b2, self.eps, self.wd = lr, beta1, beta2, eps, weight_decay
        self.decay, self.eps_mode, self.bias, self.nesterov, self.schedule = decay, eps_mode, bias, nesterov, schedule
        self.name = name

    def init_leaf(self, x):
        return {"m": np.zeros_like(x), "v": np.zeros_like(x)}

    def step_leaf(self, t, s, x, g):
        d = x.dtype
        lr = self.lr * (self.schedule(t) if self.schedule is not None else 1.0)
        b1, b2 = self.b1, self.b2
        if self.decay == "l2":
            g = g + _c(self.wd, d) * x
        if self.decay in ("decoupled", "independent"):
            x *= _c(1.0 - (lr if self.decay == "decoupled" else 1.0) * self.wd, d)
        m, v = s["m"], s["v"]
        m *= _c(b1, d)
        m += _c(1.0 - b1, d) * g
        v *= _c(b2, d)
        v += _c(1.0 - b2, d) * g * g
        tb = t + 1 if self.bias == "off_by_one" else t
        bc1 = 1.0 - b1 ** tb if self.bias in ("standard", "off_by_one", "m_only") else 1.0
        bc2 = 1.0 - b2 ** tb if self.bias in ("standard", "off_by_one", "v_only") else 1.0
        if self.nesterov:
            mhat = _c(b1 / (1.0 - b1 ** (tb + 1)), d) * m + _c((1.0 - b1) / bc1, d) * g
            num, step = mhat, lr
        else:
            num, step = m, lr / bc1
        if self.eps_mode == "outside":
            den = np.sqrt(v) / _c(math.sqrt(bc2), d) + _c(self.eps, d)
        elif self.eps_mode == "inside":
            den = np.sqrt(v / _c(bc2, d) + _c(self.eps, d))
        elif self.eps_mode == "inside_sq":
            den = np.sqrt(v / _c(bc2, d) + _c(self.eps ** 2, d))
        else:  # 'hat': lr_t = lr sqrt(bc2)/bc1, eps added to sqrt(v) (not bias-corrected)
            den = np.sqrt(v) + _c(self.eps, d)
            step = step * math.sqrt(bc2)
        x -= _c(step, d) * (num / den)
        if self.decay == "after":
            x *= _c(1.0 - lr * self.wd, d)
        return x


class ConventionSGD(_ListStepper):
    """SGD with switchable conventions: dampen_first, nesterov ('none', 'standard', 'previous'),
    decay ('none', 'l2', 'decoupled', 'after')."""

    def __init__(self, lr, momentum=0.0, dampening=0.0, nesterov="none", weight_decay=0.0, decay="none",
                 dampen_first=False, schedule=None, name="sgd variant"):
        self.lr, self.mu, self.tau, self.nesterov, self.wd = lr, momentum, dampening, nesterov, weight_decay
        self.decay, self.dampen_first, self.schedule, self.name = decay, dampen_first, schedule, name

    def init_leaf(self, x):
        return {"b": np.zeros_like(x)}

    def step_leaf(self, t, s, x, g):
        d = x.dtype
        lr = self.lr * (self.schedule(t) if self.schedule is not None else 1.0)
        if self.decay == "l2":
            g = g + _c(self.wd, d) * x
        if self.decay == "decoupled":
            x *= _c(1.0 - lr * self.wd, d)
        u = g
        if self.mu != 0:
            b = s["b"]
            prev = b.copy()
            if t == 1 and not self.dampen_first:
                b[...] = g
            else:
                b *= _c(self.mu, d)
                b += _c(1.0 - self.tau, d) * g
            if self.nesterov == "standard":
                u = g + _c(self.mu, d) * b
            elif self.nesterov == "previous":
                u = g + _c(self.mu, d) * prev
            else:
                u = b
        x -= _c(lr, d) * u
        if self.decay == "after":
            x *= _c(1.0 - lr * self.wd, d)
        return x


class TrustRatioThenMomentum(_ListStepper):
    """optax.lars order: u = ||x|| / ||g_base|| * g_base (trust ratio, coefficient 1, ratio 1 at a zero
    norm), then momentum on u (trace b = u + mu b), x -= lr * b; g_base = g (+ wd x)."""

    def __init__(self, lr, momentum, weight_decay=0.0, name="trust ratio, then momentum"):
        self.lr, self.mu, self.wd, self.name = lr, momentum, weight_decay, name

    def init_leaf(self, x):
        return {"b": np.zeros_like(x)}

    def step_leaf(self, t, s, x, g):
        d = x.dtype
        g = g + _c(self.wd, d) * x if self.wd else g
        wn, gn = float(np.linalg.norm(x.astype(np.float64))), float(np.linalg.norm(g.astype(np.float64)))
        ratio = wn / gn if wn > 0 and gn > 0 else 1.0
        u = _c(ratio, d) * g
        b = s["b"]
        b *= _c(self.mu, d)
        b += u
        x -= _c(self.lr, d) * b
        return x


class TrustRatioOneAtZero(Adapter):
    """Covariant with optax's zero-norm convention (scale_by_trust_ratio): the step is
    -lr * ratio * u with ratio = ||x|| / ||u||, and ratio = 1 when either norm is 0 (refopt: no step)."""

    framework = "refopt"

    def __init__(self, rule):
        self.rule, self.name = rule, "trust ratio 1 at a zero norm"

    def init(self, params):
        import refopt
        return refopt.init(self.rule.base, params)

    def step(self, state, params, grads):
        import refopt
        xs, _, td = T.flatten(params)
        u, state = refopt.direction(self.rule.base, state, [np.array(x) for x in xs], grads)
        out = []
        for x, d in zip(xs, u):
            wn, un = float(np.linalg.norm(x.astype(np.float64))), float(np.linalg.norm(d.astype(np.float64)))
            ratio = wn / un if wn > 0 and un > 0 else 1.0
            out.append(x - _c(self.rule.lr * ratio, x.dtype) * d)
        return T.unflatten(td, out), state


class TransposedRule(RuleAdapter):
    """A refopt rule run on the transposes (torch's layout) of the matrices."""

    def __init__(self, rule):
        super().__init__(rule)
        self.name = f"{type(rule).__name__} on W^T"

    def _t(self, tree):
        from refopt.testing.adapters import to_layout
        xs, _, td = T.flatten(tree)
        return T.unflatten(td, [to_layout(np.asarray(x), "torch") for x in xs])

    def _b(self, tree):
        from refopt.testing.adapters import from_layout
        xs, _, td = T.flatten(tree)
        return T.unflatten(td, [from_layout(np.asarray(x), "torch") for x in xs])

    def init(self, params):
        return super().init(self._t(params))

    def step(self, state, params, grads):
        x, state = super().step(state, self._t(params), self._t(grads))
        return self._b(x), state

    def state_arrays(self, state) -> dict:
        return {k: [None if a is None else self._b([a])[0] for a in v] for k, v in super().state_arrays(state).items()}


# -------------------------------------------------------------------------------------------------------
def _try(rule, **changes):
    try:
        new = replace(rule, **changes)
    except (TypeError, ValueError):
        return None
    return None if new == rule else new


def _rule_variant(name, detail, rule) -> Variant | None:
    return None if rule is None else Variant(name, detail, lambda r=rule: RuleAdapter(r))


def _adam(rule) -> list[Variant]:
    decoupled = type(rule).__name__ == "AdamW"
    mode = getattr(rule, "wd_mode", "decoupled")
    decay = ("independent" if mode == "independent" else "decoupled") if decoupled else "l2"
    if rule.weight_decay == 0:
        decay = "none"
    base = dict(lr=rule.lr, beta1=rule.beta1, beta2=rule.beta2, eps=rule.eps, weight_decay=rule.weight_decay,
                decay=decay, nesterov=rule.nesterov, schedule=rule.schedule)

    def adam(name, detail, **kw):
        args = {**base, **kw}
        return Variant(name, detail, lambda: ConventionAdam(**args, name=name))

    out = [
        adam("eps inside the sqrt", "mhat / sqrt(vhat + eps) (E3 with eps_root = eps; PITFALLS B02)", eps_mode="inside"),
        adam("eps^2 inside the sqrt", "mhat / sqrt(vhat + eps^2)", eps_mode="inside_sq"),
        adam("eps-hat", "lr sqrt(1-b2^t)/(1-b1^t) m / (sqrt(v) + eps): eps not bias-corrected (Kingma's "
             "efficient form, TensorFlow)", eps_mode="hat"),
        adam("bias correction off by one", "1 - beta^(t+1) in place of 1 - beta^t (t counted from 0 and "
             "incremented first, or twice)", bias="off_by_one"),
        adam("no bias correction", "m / (sqrt(v) + eps)", bias="none"),
        adam("bias correction of m only", "mhat / (sqrt(v) + eps)", bias="m_only"),
        adam("bias correction of v only", "m / (sqrt(vhat) + eps)", bias="v_only"),
        adam("NAdam" if not rule.nesterov else "no NAdam", "the Nesterov (NAdam) mix of the first moment "
             + ("added" if not rule.nesterov else "missing"), nesterov=not rule.nesterov),
    ]
    if rule.weight_decay > 0:
        wd = rule.weight_decay
        for kind, name, detail in [
                ("l2", "L2 decay", f"g + {wd:g} x through the moments (torch Adam's weight_decay; PITFALLS B05)"),
                ("decoupled", "decoupled decay (lr-coupled)", f"x (1 - lr {wd:g}) - lr u (torch AdamW)"),
                ("independent", "lr-independent decay", f"x (1 - {wd:g}) - lr u (wd not multiplied by lr)"),
                ("after", "decay applied after the update", f"(x - lr u)(1 - lr {wd:g}): decay of the updated x, "
                                                            f"not the pre-update x (PITFALLS B05)"),
                ("none", "no weight decay", "the decay is missing")]:
            if kind != decay:
                out.append(adam(name, detail, decay=kind))
    else:
        out.append(adam("torch AdamW default decay 0.01", "decoupled decay 0.01 (torch.optim.AdamW's default "
                        "weight_decay, not given)", decay="decoupled", weight_decay=1e-2))
        out.append(adam("optax adamw default decay 1e-4", "decoupled decay 1e-4 (optax.adamw's default "
                        "weight_decay, not given)", decay="decoupled", weight_decay=1e-4))
    if decoupled and rule.weight_decay > 0 and rule.weight_decay != 1e-4:
        out.append(adam("optax adamw default decay 1e-4", "decoupled decay 1e-4 (optax.adamw's default) in "
                        f"place of {rule.weight_decay:g}", decay="decoupled", weight_decay=1e-4))
    if decoupled and rule.weight_decay != 1e-2:
        out.append(adam("torch AdamW default decay 0.01", "decoupled decay 0.01 (torch.optim.AdamW's default) "
                        f"in place of {rule.weight_decay:g}", decay="decoupled", weight_decay=1e-2))
    return _unique(out)


def _sgd(rule) -> list[Variant]:
    nest = "standard" if rule.nesterov else "none"
    decay = "l2" if rule.weight_decay > 0 else "none"
    base = dict(lr=rule.lr, momentum=rule.momentum, dampening=rule.dampening, nesterov=nest,
                weight_decay=rule.weight_decay, decay=decay, schedule=rule.schedule)

    def sgd(name, detail, **kw):
        args = {**base, **kw}
        return Variant(name, detail, lambda: ConventionSGD(**args, name=name))

    out = []
    if rule.momentum > 0:
        if rule.dampening > 0:
            out.append(sgd("momentum dampening on step 1", "b_1 = (1 - tau) g_1; torch leaves the first buffer "
                           "undampened (b_1 = g_1)", dampen_first=True))
        out.append(sgd("EMA momentum", "b = mu b + (1 - mu) g (dampening = momentum), first buffer dampened",
                       dampening=rule.momentum, dampen_first=True, nesterov="none"))
        out.append(sgd("EMA momentum, first buffer undampened", "b_1 = g_1, then b = mu b + (1 - mu) g",
                       dampening=rule.momentum, nesterov="none"))
        if rule.nesterov:      # (u = g + mu b_{t-1} is exactly u = b_t without dampening: no separate variant)
            out.append(sgd("no Nesterov", "u = b", nesterov="none"))
        else:
            out.append(sgd("Nesterov", "u = g + mu b_t", nesterov="standard"))
        out.append(sgd("no momentum", "u = g", momentum=0.0, nesterov="none"))
    else:
        out.append(sgd("momentum 0.9", "heavy-ball momentum 0.9 (b = 0.9 b + g), not given", momentum=0.9))
    if rule.weight_decay > 0:
        out.append(sgd("decoupled decay", "x (1 - lr wd) - lr u in place of L2 in g", decay="decoupled"))
        out.append(sgd("decay applied after the update", "(x - lr u)(1 - lr wd)", decay="after"))
        out.append(sgd("no weight decay", "the decay is missing", decay="none"))
    return _unique(out)


def _muon(rule) -> list[Variant]:
    out = [Variant("layout transposed", "the rule applied to W^T: torch's (out, in) layout read as refopt's "
                   "(in, out) or the reverse (the shape scale flips on non-square matrices)",
                   lambda: TransposedRule(rule))]
    for sc in ("spectral", "jordan", "rms_match", "none"):
        out.append(_rule_variant(f"scale='{sc}'", "Muon's shape scale: spectral sqrt(fan_out/fan_in), jordan "
                                 "sqrt(max(1, fan_out/fan_in)), rms_match 0.2 sqrt(max(fan_in, fan_out)), none 1",
                                 _try(rule, scale=sc)))
    out.append(_rule_variant("nesterov flipped", "Nesterov input (1-mu) g + mu m vs plain momentum m",
                             _try(rule, nesterov=not rule.nesterov)))
    for nm in ("standard", "bias_corrected"):
        out.append(_rule_variant(f"nesterov_mode='{nm}'", "standard (KJ, torch) (1-mu) g + mu m vs optax's "
                                 "bias-corrected NAdam mix", _try(rule, nesterov_mode=nm)))
    for mode, eps, label in (("none", 0.0, "none"), ("add", 1e-7, "add 1e-7 (KJ)"), ("add", 1e-8, "add 1e-8 (optax)"),
                             ("clamp", 1e-7, "clamp 1e-7 (torch)")):
        out.append(_rule_variant(f"NS normalisation eps {label}", "X / (||X|| + eps) (add), X / max(||X||, eps) "
                                 "(clamp) or X / ||X|| (none) before Newton-Schulz",
                                 _try(rule, eps_mode=mode, norm_eps=eps)))
    out.append(_rule_variant("exact msign (svd)", "the exact polar factor in place of Newton-Schulz",
                             _try(rule, msign="svd")))
    if rule.weight_decay > 0:
        out.append(_rule_variant("weight_decay 0", "the decay is missing", _try(rule, weight_decay=0.0)))
        if rule.weight_decay <= 1:
            other = "independent" if rule.wd_mode == "decoupled" else "decoupled"
            out.append(_rule_variant(f"wd_mode='{other}'", "decay lr-coupled (decoupled) vs lr-free (independent)",
                                     _try(rule, wd_mode=other)))
    if rule.weight_decay != 0.1:
        out.append(_rule_variant("weight_decay 0.1 (torch Muon default)", "torch.optim.Muon's default "
                                 "weight_decay 0.1, not given", _try(rule, weight_decay=0.1)))
    return _unique([v for v in out if v is not None])


def _schedule_free(rule) -> list[Variant]:
    out = [_rule_variant("warmup lag flipped", "the z step uses the warmup of the previous step (optax#1744) "
                         "or not", _try(rule, warmup_lag=not rule.warmup_lag))]
    if hasattr(rule, "decay_at_z"):
        out.append(_rule_variant("decay_at_z flipped", "decoupled decay at z vs at y", _try(rule, decay_at_z=not rule.decay_at_z)))
    return [v for v in out if v is not None]


def _ema(rule) -> list[Variant]:
    out = [_rule_variant("EMA debias flipped", "debiased (zero start) vs started at x0",
                         _try(rule, debias=not rule.debias))]
    names = {f.name for f in fields(rule)}
    if "start" in names:
        for start in ("x0", "after_first_step"):
            out.append(_rule_variant(f"EMA start='{start}'", "where the average starts", _try(rule, start=start)))
    out += [Variant(f"{v.name} (base)", v.detail, _wrap(rule, v)) for v in variants(rule.base)
            if isinstance(v.make(), RuleAdapter) and type(v.make()) is RuleAdapter]
    return _unique([v for v in out if v is not None])


def _wrap(rule, v):
    inner = v.make().rule

    def make():
        return RuleAdapter(replace(rule, base=inner))
    return make


def _covariant(rule) -> list[Variant]:
    out = [Variant(f"{v.name} (base)", v.detail, _wrap(rule, v)) for v in variants(rule.base)
           if type(v.make()) is RuleAdapter]
    b = rule.base
    if rule.schedule is None and rule.norm == "fro":
        out.append(Variant("trust ratio 1 at a zero norm", "at ||x|| = 0 or ||u|| = 0 the step is -lr u (optax's "
                           "scale_by_trust_ratio: LAMB, LARS) where refopt's Covariant makes no step",
                           lambda: TrustRatioOneAtZero(rule)))
    if type(b).__name__ == "SGD" and b.momentum > 0 and rule.schedule is None:
        out.append(Variant("momentum after the trust ratio", "u = ||x||/||g|| g, then b = mu b + u, x -= lr b "
                           "(optax.lars order) in place of the trust ratio of the momentum direction",
                           lambda: TrustRatioThenMomentum(rule.lr, b.momentum, b.weight_decay)))
    return _unique(out)


def _unique(vs: list[Variant]) -> list[Variant]:
    seen, out = set(), []
    for v in vs:
        if v.name not in seen:
            seen.add(v.name)
            out.append(v)
    return out


def _decayed_labels(path: str, x) -> str:
    """'decayed' for arrays of ndim >= 2, 'not_decayed' for vectors and scalars (biases, gains)."""
    return "decayed" if np.ndim(x) >= 2 else "not_decayed"


def _shifted(schedule, shift: int):
    def gamma(t):
        return schedule(t + shift)
    return gamma


def _generic(rule) -> list[Variant]:
    """Variants of any rule with ``weight_decay`` or ``schedule`` fields: weight decay on matrices only (the
    usual torch parameter groups: no decay on biases and gains), and the schedule read one step early or
    late (a torch LR scheduler stepped before the optimizer, or counted from 0: docs/divergences.md)."""
    from refopt.rules.partition import Partition

    out = []
    if (getattr(rule, "weight_decay", 0) or 0) > 0:
        no_wd = _try(rule, weight_decay=0.0)
        if no_wd is not None:
            out.append(_rule_variant("no weight decay on vectors", "weight decay on arrays of ndim >= 2 only: "
                                     "biases and gains in a parameter group without decay (torch, nanoGPT, "
                                     "timm practice)", Partition({"decayed": rule, "not_decayed": no_wd},
                                                                 labels=_decayed_labels)))
    sched = getattr(rule, "schedule", None)
    if callable(sched):
        for name, detail, shift in (("schedule counted from 0", "gamma(t - 1) at step t: t counted from 0, "
                                     "or a torch LR scheduler stepped before the optimizer", -1),
                                    ("schedule one step ahead", "gamma(t + 1) at step t", 1)):
            out.append(_rule_variant(name, detail, _try(rule, schedule=_shifted(sched, shift))))
    return [v for v in out if v is not None]


def variants(rule) -> list[Variant]:
    """The convention variants of ``rule`` (see the module docstring); [] for a rule with none known."""
    return _unique(_specific(rule) + _generic(rule))


def _specific(rule) -> list[Variant]:
    name = type(rule).__name__       # by public class name: robust to how the rules layer is organised
    if name in ("Adam", "AdamW"):
        return _adam(rule)
    if name == "SGD":
        return _sgd(rule)
    if name == "Muon":
        return _muon(rule)
    if name.startswith("ScheduleFree"):
        return _schedule_free(rule)
    if name == "EMA":
        return _ema(rule)
    if name in ("Covariant", "Hyperball", "Average"):
        return _covariant(rule) if name == "Covariant" else \
            [Variant(f"{v.name} (base)", v.detail, _wrap(rule, v)) for v in variants(rule.base)
             if type(v.make()) is RuleAdapter]
    return []
