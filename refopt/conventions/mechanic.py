"""Mechanic (refopt/rules/mechanic.py) to optax.contrib.mechanize: the base optimizer's update u_t, and one learned
scale S_{t+1} over the whole tree from h_t = <Delta_t, g_t + decay term>, kept in OptState.glob; optax recomputes
Delta_t = (x_t - x_ref)/(S_t + eps), clips h_t in the reward and keeps the reward unclipped. The optax base
optimizer is given as (name, kwargs) of an optax call refopt maps, e.g. ('adam', {'learning_rate': 1e-2}), or as
its refopt rule (like('optax.adam', ...)). torch.optim ships no Mechanic."""
from __future__ import annotations

import math

import numpy as np

from refopt import tree as T
from refopt.conventions._spec import Conventions, Example, Oracle, PeerMapping, Preset, norm64, scalar
from refopt.core import Rule
from refopt.golden import GoldenCase
from refopt.rules.adam import Adam, AdamW
from refopt.rules.dog import DoG
from refopt.rules.mechanic import Mechanic, optax_betas
from refopt.rules.partition import Partition, matrix_labels
from refopt.rules.sgd import SGD


# ---- the base optimizer: an optax call refopt maps ------------------------------------------------------
def _plain_ctor(ctor) -> bool:
    """An optax attribute path (``adam``, ``contrib.dog``), not an adapter's special constructor."""
    return isinstance(ctor, str) and not callable(ctor) and all(p.isidentifier() for p in ctor.split("."))


def base_mapping(name):
    """The optax :class:`PeerMapping` named ``name`` (``'adam'`` or ``'optax.adam'``) whose constructor is a plain
    optax attribute path, or None."""
    from refopt.conventions import peers

    if not isinstance(name, str):
        return None
    known = peers()
    m = known.get(name) or known.get(f"optax.{name}")
    return m if m is not None and m.adapter == "optax" and _plain_ctor(m.ctor) else None


def _pair(v):
    """(mapping, kwargs) of a base optimizer given as (name, kwargs) (a list from JSON too), or None."""
    if isinstance(v, (tuple, list)) and len(v) == 2 and isinstance(v[1], dict):
        m = base_mapping(v[0])
        return None if m is None else (m, dict(v[1]))
    return None


def _base_ok(v) -> bool:
    return isinstance(v, Rule) or _pair(v) is not None


def base_rule(v) -> Rule:
    """The refopt rule of a base optimizer: ``v`` itself (a rule) or like(peer, **kwargs) of a (name, kwargs)
    pair (its mapping's refusals apply)."""
    if isinstance(v, Rule):
        return v
    m, kw = _pair(v)
    return m.rule(**kw)


def optax_base(optax, v):
    """The optax GradientTransformation of a base optimizer: a (name, kwargs) pair called as optax.<ctor>(**kwargs),
    a refopt rule through the optax call that reproduces it (:func:`refopt.crosscheck.match.preset_for`), or an
    optax transformation itself."""
    if hasattr(v, "init") and hasattr(v, "update"):
        return v
    if isinstance(v, Rule):
        from refopt.crosscheck.match import preset_for
        p = preset_for(v, "optax")
        if p is None or not _plain_ctor(p.peer_call[0]):
            raise ValueError(f"no plain optax call reproduces the base rule {v!r}")
        ctor, kw = p.peer_call
    else:
        pair = _pair(v)
        if pair is None:
            raise ValueError(f"base_optimizer must be (name, kwargs) of an optax call refopt maps, got {v!r}")
        ctor, kw = pair[0].ctor, pair[1]
    obj = optax
    for part in ctor.split("."):
        obj = getattr(obj, part)
    return obj(**kw)


def optax_mechanize(base_optimizer, **kwargs):
    """``optax.contrib.mechanize(<base>, **kwargs)`` with the base given as in :func:`optax_base` (JSON-friendly:
    ``["adam", {"learning_rate": 0.01}]``): the factory for ``refopt crosscheck --impl
    refopt.conventions.mechanic:optax_mechanize --framework jax --kwargs JSON``."""
    import optax
    return optax.contrib.mechanize(optax_base(optax, base_optimizer), **kwargs)


class _MechanizeCall(str):
    """The optax adapter's constructor of the mechanize rows: the attribute path ``'contrib.mechanize'`` (as the
    tables and golden manifests print it) that is also the builder ``(optax, base_optimizer, **kwargs) ->
    optax.contrib.mechanize(...)``, the base built from its (name, kwargs) pair."""

    def __call__(self, optax, base_optimizer, **kwargs):
        return optax.contrib.mechanize(optax_base(optax, base_optimizer), **kwargs)


MECHANIZE = _MechanizeCall("contrib.mechanize")


def _state(args) -> dict:
    """{refopt state field: optax state key}: x0, and the base's own entries under ``base.``."""
    v = args["base_optimizer"]
    inner = {}
    pair = _pair(v)
    if pair is not None:
        inner = pair[0].state_map(pair[1])
    elif isinstance(v, Rule):
        from refopt.crosscheck.match import preset_for
        p = preset_for(v, "optax")
        inner = {} if p is None else dict(p.state)
    return {"x0": "x0", **{f"base.{k}": key for k, key in inner.items()}}


def _mechanize(base_optimizer, weight_decay, eps, s_init, num_betas):
    return Mechanic(base_rule(base_optimizer), weight_decay=weight_decay, eps=eps, s_init=s_init,
                    betas=optax_betas(num_betas))


def _match(rule):
    if type(rule) is not Mechanic or rule.betas != optax_betas(len(rule.betas)):
        return None
    from refopt.crosscheck.match import preset_for
    p = preset_for(rule.base, "optax")
    if p is None or not _plain_ctor(p.peer_call[0]):
        return None
    return dict(base_optimizer=(str(p.peer_call[0]), dict(p.peer_call[1])), weight_decay=rule.weight_decay,
                eps=rule.eps, s_init=rule.s_init, num_betas=len(rule.betas))


_NUM_BETAS = (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
              "num_betas must be an int >= 1 (optax's betas 1 - 0.1^i, i = 1..num_betas)")
_BASE = (_base_ok, "base_optimizer must be a refopt rule (e.g. like('optax.adam', learning_rate=1e-3)) or (name, "
                   "kwargs) of an optax call that refopt maps, e.g. ('adam', {'learning_rate': 1e-3}); optax.chain "
                   "and optax.ema bases are not mapped (a clip inside Mechanic would change the gradients h_t reads)")

OPTAX_MECHANIZE = PeerMapping("optax.contrib.mechanize", "optax", MECHANIZE,
                              dict(weight_decay=1e-2, eps=1e-8, s_init=1e-6, num_betas=6), _mechanize, "mechanic",
                              required=("base_optimizer",), refuse={"base_optimizer": _BASE, "num_betas": _NUM_BETAS},
                              state=_state, match=_match)


# ---- the plain-numpy oracle ------------------------------------------------------------------------------
class MechanicOracle(Oracle):
    """Mechanic from its docstring: the base's oracle steps the whole tree, u = its x_{t+1} - x_t; then h, m, v, r,
    s and x = x_ref + S (Delta + u), scalars in float64, arrays in x's dtype. The state is (t, (leaves, globs,
    base state)). Switches: ``base`` (the base's oracle), ``per_leaf`` (one Mechanic per array: each its own h
    and scales), ``no_clip`` (r = beta r - s h, h unclipped), ``clip_reward`` (the
    reward kept as max(0, r) in the state), ``stored_delta`` (Delta_{t+1} = Delta_t + u_t accumulated, not
    recomputed from x)."""

    def __init__(self, rule, name=None, **sw):
        from refopt.conventions import oracle
        super().__init__(rule, name, **sw)
        self.base = sw.get("base") or oracle(rule.base)

    def _glob(self) -> dict:
        n = len(self.rule.betas)
        return {"r": np.zeros(n), "m": np.zeros(n), "v": np.zeros(n), "s": np.full(n, float(self.rule.s_init))}

    def init_leaf(self, x, path):
        """The state fields of one array (what the generated variants read): x0 and the base's under ``base``."""
        return {"x0": np.array(x, copy=True), "base": self.base.init_leaf(x, path)}

    def init(self, params):
        xs, _, _ = T.flatten(params)
        leaves = [{"x0": np.array(x, copy=True), "delta": np.zeros_like(np.asarray(x))} for x in xs]
        groups = len(xs) if self.switches.get("per_leaf") else 1
        return (0, (leaves, [self._glob() for _ in range(groups)], self.base.init(params)))

    def _tuner(self, glob: dict, h: float) -> dict:
        r, sw = self.rule, self.switches
        b, eps = np.asarray(r.betas, np.float64), float(r.eps)
        hc = h if sw.get("no_clip") else np.minimum(np.maximum(h, -glob["m"]), glob["m"])
        m = np.maximum(b * glob["m"], abs(h) + eps)
        v = (b * b) * glob["v"] + h * h
        rew = b * glob["r"] - hc * glob["s"]
        if sw.get("clip_reward"):
            rew = np.maximum(0.0, rew)
        w = (float(r.s_init) / len(b)) * m + np.maximum(0.0, rew)
        return {"r": rew, "m": m, "v": v, "s": w / (np.sqrt(v) + eps)}

    def step(self, state, params, grads):
        t, (leaves, globs, bstate) = state
        t += 1
        r, sw = self.rule, self.switches
        xs, gs, _, td = T.check_like(params, grads)
        xs, gs = [np.asarray(x) for x in xs], [np.asarray(g) for g in gs]
        xb, bstate = self.base.step(bstate, params, grads)
        us = [np.asarray(b) - x for b, x in zip(T.flatten(xb)[0], xs)]
        leaves = [dict(s) for s in leaves]
        if t == 1:
            for s, x in zip(leaves, xs):
                s["x0"] = x.copy()
        groups = [[i] for i in range(len(xs))] if sw.get("per_leaf") else [list(range(len(xs)))]
        out, new_globs = [None] * len(xs), []
        for idx, glob in zip(groups, globs):
            S = sum(glob["s"].tolist())
            d = {i: leaves[i]["delta"] if sw.get("stored_delta") else
                 (xs[i] - leaves[i]["x0"]) / scalar(S + r.eps, xs[i].dtype) for i in idx}
            gn = math.sqrt(sum(norm64(gs[i]) ** 2 for i in idx))
            xn = math.sqrt(sum(norm64(xs[i]) ** 2 for i in idx))
            c = r.weight_decay * S * gn / (xn + r.eps)
            h = sum(float(np.sum((gs[i] + scalar(c, xs[i].dtype) * xs[i]).astype(np.float64)
                                 * d[i].astype(np.float64))) for i in idx)
            glob = self._tuner(glob, h)
            S1 = sum(glob["s"].tolist())
            for i in idx:
                leaves[i]["delta"] = d[i] + us[i]
                out[i] = leaves[i]["x0"] + scalar(S1, xs[i].dtype) * leaves[i]["delta"]
            new_globs.append(glob)
        return T.unflatten(td, out), (t, (leaves, new_globs, bstate))

    def state_arrays(self, state) -> dict:
        leaves, _, bstate = state[1]
        out = {"x0": [np.array(s["x0"]) for s in leaves]}
        out.update({f"base.{k}": v for k, v in self.base.state_arrays(bstate).items()})
        return out


def variants(rule):
    from refopt.conventions._variants import base_variants, oracle_variant as v, rule_variant, try_replace
    out = [v(rule, "per-array scale", "one Mechanic per array (its own h, m, v, r and s) in place of one scale "
             "over the whole tree", per_leaf=True),
           v(rule, "h unclipped in the reward", "r = beta r - s h (Algorithm 1) in place of optax's "
             "r = beta r - s clip(h, -m_{t-1}, m_{t-1})", no_clip=True),
           v(rule, "the reward clipped in the state", "r_t = max(0, beta r_{t-1} - s h) kept (Algorithm 1) in place "
             "of the unclipped reward, clipped in the wealth only (optax)", clip_reward=True),
           v(rule, "Delta accumulated", "Delta_{t+1} = Delta_t + u_t stored (Algorithm 1) in place of optax's "
             "Delta_t = (x_t - x_ref)/(S_t + eps)", stored_delta=True),
           rule_variant("no decay term", "h_t = <Delta_t, g_t> without lambda S ||g|| x/(||x|| + eps)",
                        try_replace(rule, weight_decay=0.0)) if rule.weight_decay > 0 else None,
           rule_variant("a single beta", f"one beta ({rule.betas[-1]}) in place of {len(rule.betas)}",
                        try_replace(rule, betas=rule.betas[-1:])) if len(rule.betas) > 1 else None]
    return [x for x in out if x is not None] + base_variants(rule)


def facts(rule, of):
    """Inner products and Frobenius norms over the tree are orthogonally and permutation invariant, so Mechanic
    keeps the base's equivariances; the eps terms (|h| + eps, sqrt(v) + eps) and s_init's share of the wealth
    make the scale depend on the gradients' size, so no scale invariance is stated."""
    b = of(rule.base)
    return {"grad_scale": False, "step_scale_free": False, "orthogonal": b["orthogonal"],
            "elementwise": b["elementwise"]}


_ADAM = ("adam", {"learning_rate": 1e-2})
_SGD = ("sgd", {"learning_rate": 0.1, "momentum": 0.9})
_ADAMW = ("adamw", {"learning_rate": 1e-2, "weight_decay": 1e-2})
#: the optax state keys of those bases (what the mapping's state function gives; written out here because the
#: rows are made while the registry that holds the base mappings is being read; tests/test_mechanic.py checks them)
_ADAM_STATE = {"x0": "x0", "base.m": "mu", "base.v": "nu"}
_SGD_STATE = {"x0": "x0", "base.b": "trace"}
_NOT_LEAFWISE = {"not_leafwise": "the scale is one estimate over the whole tree (each leaf alone gets its own)"}


def _preset(name: str, kwargs: dict, state: dict, why: str) -> Preset:
    """The checked call optax.contrib.mechanize(**kwargs) as a cross-check row whose rule is like() of the call."""
    return Preset(name, "optax", "mechanic", (MECHANIZE, kwargs), lambda: OPTAX_MECHANIZE.rule(**kwargs), why,
                  state=state)


def _partition():
    """A Partition base (its rule-wide state, a dict, nested in Mechanic's)."""
    return Mechanic(Partition({"hidden": Adam(lr=0.05), "other": SGD(lr=0.1, momentum=0.9)}, labels=matrix_labels),
                    weight_decay=0.0, betas=(0.9, 0.999))


CONVENTIONS = Conventions(
    rules=(Mechanic,),
    final="x_ref + S_{t+1} (Delta_t + u_t) with one scale S over the whole tree: h_t's decay term, the clip of h in "
          "the reward, the reward's clip, how Delta is kept, or per-array scales",
    per_step="the scale S_{t+1} = sum_i W_i / (sqrt(v_i) + eps)",
    mappings=(OPTAX_MECHANIZE,),
    no_peer={"torch": "torch.optim ships no Mechanic (the authors' mechanic-pytorch is not a peer here)",
             "schedulefree": "schedulefree ships the Schedule-Free optimizers only"},
    presets=(
        _preset("optax.contrib.mechanize(adam)", dict(base_optimizer=_ADAM), _ADAM_STATE,
                "optax.adam's update u_t scaled by S from h_t = <(x - x_ref)/(S + eps), g + decay>, s_init = 1e-6, h "
                "clipped in the reward, 6 betas"),
        _preset("optax.contrib.mechanize(sgd,wd,eps,s_init,num_betas)",
                dict(base_optimizer=_SGD, weight_decay=0.05, eps=1e-6, s_init=1e-4, num_betas=3), _SGD_STATE,
                "optax.sgd with momentum as the base; lambda 0.05 in h, eps 1e-6, s_init = 1e-4, betas 0.9, 0.99, "
                "0.999"),
        _preset("optax.contrib.mechanize(adamw,wd=0)",
                dict(base_optimizer=_ADAMW, weight_decay=0.0, s_init=1e-3, num_betas=4), _ADAM_STATE,
                "the base's decoupled decay inside u_t; no decay term in h"),
    ),
    wrong=(Preset("WRONG scale: optax.contrib.mechanize(adam) vs refopt Adam", "optax", "mechanic",
                  (MECHANIZE, dict(base_optimizer=_ADAM)), lambda: Adam(lr=1e-2),
                  "the base alone, without Mechanic's learned scale", expect_fail=True),
           Preset("WRONG decay term: optax.contrib.mechanize(sgd, weight_decay=0.5) vs refopt Mechanic(weight_decay=0)",
                  "optax", "mechanic", (MECHANIZE, dict(base_optimizer=_SGD, weight_decay=0.5, s_init=1e-2)),
                  lambda: Mechanic(SGD(lr=0.1, momentum=0.9), weight_decay=0.0, s_init=1e-2),
                  "h_t without lambda S ||g|| x/(||x|| + eps)", state=_SGD_STATE, expect_fail=True)),
    oracle=MechanicOracle,
    variants=variants,
    facts=facts,
    golden=(GoldenCase("mechanize_adam", lambda: Mechanic(Adam(lr=1e-2)),
                       "optax.contrib.mechanize(optax.adam(1e-2))", ("x0", "base.m", "base.v")),
            GoldenCase("mechanize_sgd_wd", lambda: Mechanic(SGD(lr=0.1, momentum=0.9), weight_decay=0.05, eps=1e-6,
                                                            s_init=1e-4, betas=optax_betas(3)),
                       "optax.contrib.mechanize(optax.sgd(0.1, momentum=0.9), weight_decay=0.05, eps=1e-6, "
                       "s_init=1e-4, num_betas=3)", ("x0", "base.b"))),
    examples=(Example("mechanic_adam", lambda: Mechanic(Adam(lr=0.05)), extra=_NOT_LEAFWISE),
              Example("mechanic_sgd_momentum", lambda: Mechanic(SGD(lr=0.1, momentum=0.9), weight_decay=0.05,
                                                                 s_init=1e-4, betas=(0.9, 0.99, 0.999)),
                      extra=_NOT_LEAFWISE),
              Example("mechanic_adamw", lambda: Mechanic(AdamW(lr=0.05, weight_decay=0.01), s_init=1e-3),
                      extra=_NOT_LEAFWISE),
              Example("mechanic_partition", _partition, extra=_NOT_LEAFWISE),
              Example("mechanic_dog", lambda: Mechanic(DoG(init_step="distance", init_value=1e-2), s_init=1e-2),
                      extra=_NOT_LEAFWISE)),
)
