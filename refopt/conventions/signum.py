"""Signum and signSGD (refopt/rules/signum.py) to optax.signum and optax.sign_sgd: an undebiased EMA of g
(optax.ema(beta, debias=False)), then its sign, then the lr. torch.optim ships neither."""
from __future__ import annotations

import numpy as np

from refopt.conventions._spec import CliName, Conventions, Example, Oracle, PeerMapping, Preset, gamma, scalar
from refopt.golden import GoldenCase
from refopt.rules.signum import Signum


class SignumOracle(Oracle):
    """Signum from the rule's docstring; switch ``order`` 'momentum_first' (sign of the EMA, the rule's) |
    'sign_first' (the EMA of sign(g) as the step)."""

    def init_leaf(self, x, path):
        return {"m": np.zeros_like(x)}

    def direction_leaf(self, t, s, x, g, path):
        b, d = self.rule.beta, x.dtype
        if self.switches.get("order", "momentum_first") == "sign_first":
            s["m"] = scalar(b, d) * s["m"] + scalar(1.0 - b, d) * np.sign(g)
            return s["m"].copy()
        s["m"] = scalar(b, d) * s["m"] + scalar(1.0 - b, d) * g
        return np.sign(s["m"])

    def step_leaf(self, t, s, x, g, path):
        lr = self.rule.lr * gamma(self.rule.schedule, t)
        return x - scalar(lr, x.dtype) * self.direction_leaf(t, s, x, g, path)


def variants(rule):
    from refopt.conventions._variants import oracle_variant as v
    if rule.beta == 0:
        return []
    return [v(rule, "sign before the momentum", "the EMA of sign(g) as the step, in place of sign(EMA of g)",
              order="sign_first")]


def facts(rule, of):
    """sign(beta c m + (1 - beta) c g) = sign(beta m + (1 - beta) g) for c > 0; with beta = 0 a step sees only
    sign(g_t); the sign is taken per entry."""
    return {"grad_scale": True, "step_scale_free": rule.beta == 0, "elementwise": True}


def _match(sgd):
    def match(rule):
        if type(rule) is not Signum or rule.schedule is not None or (rule.beta == 0) != sgd:
            return None
        return dict(learning_rate=rule.lr) if sgd else dict(learning_rate=rule.lr, beta=rule.beta)
    return match


_DTYPE = (lambda v: v is None, "refopt keeps the momentum in the params' dtype (accumulator_dtype=None)")
SIGNUM = PeerMapping("optax.signum", "optax", "signum", dict(beta=0.9, accumulator_dtype=None),
                     lambda learning_rate, beta: Signum(lr=learning_rate, beta=beta), "signum",
                     required=("learning_rate",), refuse={"accumulator_dtype": _DTYPE}, state={"m": "ema"},
                     match=_match(False))
SIGN_SGD = PeerMapping("optax.sign_sgd", "optax", "sign_sgd", {},
                       lambda learning_rate: Signum(lr=learning_rate, beta=0.0), "signum",
                       required=("learning_rate",), state={}, match=_match(True))

CONVENTIONS = Conventions(
    rules=(Signum,),
    final="lr sign(m): the sign of the momentum (not the momentum of signs), sign(0) = 0",
    per_step="",
    mappings=(SIGNUM, SIGN_SGD),
    no_peer={"torch": "torch.optim ships no sign method (Lion is the closest, refopt.Lion)",
             "schedulefree": "schedulefree ships the Schedule-Free optimizers only"},
    presets=(
        SIGNUM.preset("optax.signum", dict(learning_rate=1e-2), "m = 0.9 m + 0.1 g (not debiased); lr sign(m)"),
        SIGNUM.preset("optax.signum(beta)", dict(learning_rate=5e-3, beta=0.5), "beta 0.5"),
        SIGN_SGD.preset("optax.sign_sgd", dict(learning_rate=1e-2), "lr sign(g): Signum with beta 0"),
    ),
    wrong=(Preset("WRONG momentum: optax.signum vs refopt Signum(beta=0)", "optax", "signum",
                  ("signum", dict(learning_rate=1e-2)), lambda: Signum(lr=1e-2, beta=0.0),
                  "sign(m) vs sign(g): the momentum is missing", state={}, expect_fail=True),),
    oracle=SignumOracle,
    variants=variants,
    facts=facts,
    golden=(GoldenCase("signum", lambda: Signum(lr=1e-2), "optax.signum(1e-2)", ("m",)),
            GoldenCase("sign_sgd", lambda: Signum(lr=1e-2, beta=0.0), "optax.sign_sgd(1e-2)", ("m",))),
    examples=(Example("signum", lambda: Signum(lr=0.01)),
              Example("sign_sgd", lambda: Signum(lr=0.01, beta=0.0))),
    cli=(CliName("signum", Signum, {"mlp": 1e-3, "gpt": 3e-4}, "Signum (optax semantics): the sign of the "
                 "momentum; --momentum sets beta (0: signSGD)", {"beta": "momentum"}),),
)
