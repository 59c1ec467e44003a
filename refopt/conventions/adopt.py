"""ADOPT (refopt/rules/adopt.py) to optax.contrib.adopt: the first gradient only fills v (a zero step), then g is
divided by max(sqrt(v_{t-1}), eps), clipped at (t - 1)^(1/4) and averaged into m; x -= lr m. torch.optim ships
no ADOPT."""
from __future__ import annotations

import numpy as np

from refopt.conventions._spec import NO_DTYPE, CliName, Conventions, Example, Oracle, PeerMapping, Preset, counted, \
    gamma, scalar
from refopt.golden import GoldenCase
from refopt.rules.adam import Adam
from refopt.rules.adopt import ADOPT


class ADOPTOracle(Oracle):
    """ADOPT from the rule's docstring. Switches: ``order`` 'previous' (the rule's: g normalised by v_{t-1}) |
    'current' (by v_t, which holds g_t, Adam's order); ``clip`` False drops the clip; ``counter`` {'clip':
    'next' | 'prev' | 'frozen'} (the clip value read at t^(1/4) instead of (t - 1)^(1/4), ...)."""

    def init_leaf(self, x, path):
        return {"m": np.zeros_like(x), "v": np.zeros_like(x)}

    def direction_leaf(self, t, s, x, g, path):
        r, d, sw = self.rule, x.dtype, self.switches
        g2 = g * g
        if t == 1:
            s["v"] = g2
            return np.zeros_like(x)
        v_new = scalar(r.beta2, d) * s["v"] + scalar(1.0 - r.beta2, d) * g2
        v_read = v_new if sw.get("order", "previous") == "current" else s["v"]
        a = g / np.maximum(np.sqrt(v_read), scalar(r.eps, d))
        if sw.get("clip", r.clip):
            k = counted(t, sw.get("counter", {}).get("clip")) - 1
            c = scalar(float(k) ** r.clip_exponent if k > 0 else 0.0, d)
            a = np.clip(a, -c, c)
        s["m"] = scalar(r.beta1, d) * s["m"] + scalar(1.0 - r.beta1, d) * a
        s["v"] = v_new
        if r.nesterov:
            return scalar(r.beta1, d) * s["m"] + scalar(1.0 - r.beta1, d) * a
        return s["m"]

    def step_leaf(self, t, s, x, g, path):
        lr = self.rule.lr * gamma(self.rule.schedule, t)
        return x - scalar(lr, x.dtype) * self.direction_leaf(t, s, x, g, path)


def variants(rule):
    from refopt.conventions._variants import oracle_variant as v
    out = [v(rule, "Adam's order", "g normalised by v_t, which already holds g_t^2, in place of v_{t-1}",
             order="current")]
    if rule.clip:
        out.append(v(rule, "no clip", "the normalised gradient not clipped at (t - 1)^(1/4)", clip=False))
    return out


def facts(rule, of):
    """g / max(sqrt(v_{t-1}), eps) has degree 0 in g (eps -> 0), and so has its clip; per entry. One step is not
    scale free: g_t is divided by the previous gradients' scale, not its own."""
    return {"grad_scale": True, "step_scale_free": False, "elementwise": True}


def _match(rule):
    if type(rule) is not ADOPT or rule.schedule is not None or rule.clip_exponent != 0.25:
        return None
    return dict(learning_rate=rule.lr, b1=rule.beta1, b2=rule.beta2, eps=rule.eps, nesterov=rule.nesterov,
                use_clipping=rule.clip)


_CLIP_FN = (lambda v: v is None, "a clip-value function cannot be compared; refopt's ADOPT clips at (t - 1)^p with "
                                 "p = clip_exponent (optax's default clip_value_fn is p = 0.25)")

OPTAX = PeerMapping("optax.contrib.adopt", "optax", "contrib.adopt",
                    dict(b1=0.9, b2=0.9999, eps=1e-6, mu_dtype=None, nesterov=False, use_clipping=True),
                    lambda learning_rate, b1, b2, eps, nesterov, use_clipping: ADOPT(
                        lr=learning_rate, beta1=b1, beta2=b2, eps=eps, nesterov=nesterov, clip=use_clipping),
                    "adopt", required=("learning_rate",),
                    refuse={"mu_dtype": NO_DTYPE, "clip_value_fn": _CLIP_FN},
                    state={"m": "mu", "v": "nu"}, match=_match)

_KW = dict(learning_rate=1e-2, b1=0.8, b2=0.95, eps=1e-4, nesterov=True)

CONVENTIONS = Conventions(
    rules=(ADOPT,),
    final="m, the EMA of g / max(sqrt(v_{t-1}), eps) clipped at (t - 1)^(1/4): which v divides g, the clip value, "
          "or the zero first step",
    per_step="the clip value (t - 1)^(1/4) and the zero first step",
    counters=(("clip", "the clip value (t - 1)^(1/4)"),),
    mappings=(OPTAX,),
    no_peer={"torch": "torch.optim ships no ADOPT",
             "schedulefree": "schedulefree ships the Schedule-Free optimizers only"},
    presets=(
        OPTAX.preset("optax.contrib.adopt", dict(learning_rate=1e-3), "v_1 = g_1^2 and no step; then m = EMA of "
                     "clip(g / max(sqrt(v_{t-1}), eps), (t-1)^(1/4))"),
        OPTAX.preset("optax.contrib.adopt(betas,eps,nesterov)", _KW, "betas (0.8, 0.95), eps 1e-4, Nesterov"),
        OPTAX.preset("optax.contrib.adopt(use_clipping=False)", dict(learning_rate=1e-3, b2=0.99, use_clipping=False),
                     "no clip, beta2 0.99"),
    ),
    wrong=(Preset("WRONG normaliser: optax.contrib.adopt vs refopt Adam", "optax", "contrib.adopt",
                  ("contrib.adopt", _KW), lambda: Adam(lr=1e-2, beta1=0.8, beta2=0.95, eps=1e-4),
                  "Adam's bias-corrected m_hat / (sqrt(v_hat) + eps) vs the EMA of g / sqrt(v_{t-1})", state={},
                  expect_fail=True),),
    oracle=ADOPTOracle,
    variants=variants,
    facts=facts,
    golden=(GoldenCase("adopt", lambda: ADOPT(lr=1e-3), "optax.contrib.adopt's defaults", ("m", "v")),
            GoldenCase("adopt_nesterov", lambda: ADOPT(lr=1e-2, beta1=0.8, beta2=0.95, eps=1e-4, nesterov=True),
                       "ADOPT betas (0.8, 0.95), eps 1e-4, Nesterov", ("m", "v"))),
    examples=(Example("adopt", lambda: ADOPT(lr=0.05, beta2=0.99)),
              Example("adopt_nesterov_noclip", lambda: ADOPT(lr=0.01, beta2=0.99, clip=False, nesterov=True))),
    cli=(CliName("adopt", ADOPT, {"mlp": 1e-3, "gpt": 1e-3}, "ADOPT (optax.contrib semantics): --beta1, --beta2, "
                 "--eps", {"beta1": "beta1", "beta2": "beta2", "eps": "eps"}),),
)
