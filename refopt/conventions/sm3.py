"""SM3 (refopt/rules/sm3.py) to optax.sm3: the cover accumulators (min over the covers plus g^2, then the max
over each cover), eps 1e-8 inside the square root, the momentum as an EMA of the scaled gradient; torch.optim
ships none."""
from __future__ import annotations

import numpy as np

from refopt.conventions._spec import CONSTANT, Conventions, Example, Oracle, PeerMapping, Preset, gamma, scalar
from refopt.golden import GoldenCase
from refopt.rules.adagrad import Adagrad
from refopt.rules.sm3 import SM3


class SM3Oracle(Oracle):
    """SM3-II from the paper (Anil et al. 2019, Algorithm 2) with optax's momentum, the covers as a list of
    per-axis arrays. Switches: ``cover`` 'min' (the paper's) | 'full' (Adagrad's per-entry sum, the covers
    bypassed); ``momentum`` 'ema' (b m + (1 - b) u, optax's) | 'sum' (b m + u)."""

    def init_leaf(self, x, path):
        if x.ndim >= 2 and self.switches.get("cover", "min") == "min":
            return {"covers": [np.zeros(n, x.dtype) for n in x.shape], "m": np.zeros_like(x)}
        return {"acc": np.zeros_like(x), "m": np.zeros_like(x)}

    def step_leaf(self, t, s, x, g, path):
        r, d = self.rule, x.dtype
        if "covers" in s:
            k = x.ndim
            nu = g * g + np.min(np.stack(np.broadcast_arrays(
                *[c.reshape([1] * i + [-1] + [1] * (k - i - 1)) for i, c in enumerate(s["covers"])])), axis=0)
            s["covers"] = [np.max(np.moveaxis(nu, i, 0).reshape(x.shape[i], -1), axis=1) for i in range(k)]
        else:
            s["acc"] = g * g + s["acc"]
            nu = s["acc"]
        u = np.zeros_like(g)
        pos = nu > 0
        u[pos] = g[pos] / np.sqrt(nu[pos] + scalar(r.eps, d))
        keep = scalar(1 - r.momentum, d) if self.switches.get("momentum", "ema") == "ema" else scalar(1.0, d)
        s["m"] = keep * u + scalar(r.momentum, d) * s["m"]
        lr = r.lr * gamma(r.schedule, t)
        return x - scalar(lr, d) * s["m"]


def variants(rule):
    from refopt.conventions._variants import oracle_variant as v
    return [v(rule, "Adagrad's full accumulator", "the per-entry sum of g^2 in place of SM3's covers", cover="full"),
            v(rule, "momentum without (1 - b)", "m = b m + u in place of b m + (1 - b) u", momentum="sum")]


def facts(rule, of):
    """g/sqrt(nu) with nu a sum of squares: degree 0 in g (eps -> 0). The covers are per axis: a permutation of
    the rows or the columns maps them to each other, a permutation of the entries does not, so no
    permutation (elementwise) fact for a factored array; not orthogonal."""
    return {"grad_scale": True}


def _match(rule):
    if type(rule) is not SM3 or rule.schedule is not None or rule.eps != 1e-8:
        return None
    return dict(learning_rate=rule.lr, momentum=rule.momentum)


OPTAX = PeerMapping("optax.sm3", "optax", "sm3", dict(momentum=0.9),
                    lambda learning_rate, momentum: SM3(lr=learning_rate, momentum=momentum), "sm3",
                    required=("learning_rate",), refuse={"learning_rate": CONSTANT}, state={"m": "nu"}, match=_match)

CONVENTIONS = Conventions(
    rules=(SM3,),
    final="b m + (1 - b) g/sqrt(nu + eps) with nu = min over the covers + g^2: the covers (min, then max per "
          "cover), eps inside the root, the momentum's (1 - b)",
    per_step="",
    mappings=(OPTAX,),
    no_peer={"torch": "torch.optim ships no SM3", "schedulefree": "schedulefree ships the Schedule-Free optimizers only"},
    presets=(
        OPTAX.preset("optax.sm3", dict(learning_rate=1e-2), "covers per axis; m = 0.9 m + 0.1 g/sqrt(nu + 1e-8); "
                     "optax's state nu is the momentum, mu the covers (compared through the params)"),
        OPTAX.preset("optax.sm3(momentum=0.5)", dict(learning_rate=1e-2, momentum=0.5), "momentum 0.5"),
        OPTAX.preset("optax.sm3(momentum=0)", dict(learning_rate=1e-2, momentum=0.0), "no momentum: lr g/sqrt(nu)"),
    ),
    wrong=(Preset("WRONG covers: optax.sm3(momentum=0) vs refopt Adagrad (full accumulator)", "optax", "sm3",
                  ("sm3", dict(learning_rate=1e-2, momentum=0.0)), lambda: Adagrad(lr=1e-2, eps=1e-8, eps_mode="inside"),
                  "the per-entry sum in place of the covers' bound", expect_fail=True),),
    oracle=SM3Oracle,
    variants=variants,
    facts=facts,
    golden=(GoldenCase("sm3", lambda: SM3(lr=1e-2, momentum=0.5), "optax.sm3(1e-2, momentum=0.5)", ("m", "v")),),
    examples=(Example("sm3", lambda: SM3(lr=0.5)), Example("sm3_no_momentum", lambda: SM3(lr=0.5, momentum=0.0))),
)
