"""MADGRAD (refopt/rules/madgrad.py) to optax.contrib.madgrad: dual averaging anchored at the params at init x_0,
lambda_k = (lr + eps) sqrt(k + 1) computed in float32 (k from 0), eps after the cube root, x_{k+1} the average
momentum x + (1 - momentum) z, weight decay as L2 on the gradient (add_decayed_weights chained first). torch.optim
ships no MADGRAD."""
from __future__ import annotations

import numpy as np

from refopt.conventions._spec import (
    CliName, Conventions, Example, Oracle, PeerMapping, Preset, counted, gamma, scalar)
from refopt.golden import GoldenCase
from refopt.rules.madgrad import MADGRAD


class MADGRADOracle(Oracle):
    """MADGRAD from Algorithm 1 of the paper and the rule's docstring. Switches: ``lam`` 'sqrt' (the rule's
    (lr + eps) sqrt(k + 1)) | 'constant' (lr + eps, no sqrt); ``eps_mode`` 'outside' (cbrt(nu) + eps, the
    rule's) | 'inside' (cbrt(nu + eps)); ``root`` 'cbrt' (the rule's) | 'sqrt' (Adagrad's square root);
    ``anchor`` 'x0' (z from the params at init, the rule's) | 'x' (z from the current x_k); ``counter``
    {'lam': 'next' | 'prev' | 'frozen'} (sqrt(k + 1) read at k + 2, k or 1)."""

    def init_leaf(self, x, path):
        return {"s": np.zeros_like(x), "nu": np.zeros_like(x), "x0": x.copy()}

    def step_leaf(self, t, s, x, g, path):
        r, d, sw = self.rule, x.dtype, self.switches
        if r.weight_decay != 0:
            g = g + scalar(r.weight_decay, d) * x
        k1 = counted(t, sw.get("counter", {}).get("lam"))        # k + 1, with k = t - 1 counted from 0
        lr = r.lr * gamma(r.schedule, t)
        base = lr + r.eps if r.eps_in_lr else lr
        root = 1.0 if sw.get("lam", "sqrt") == "constant" else None
        if r.lam_dtype == "float32":        # optax: a float32 sqrt of its int32 count, times the lr in float32
            lam = float(np.float32(base) * (np.float32(1.0) if root else np.sqrt(np.float32(k1))))
        else:
            lam = base * (1.0 if root else float(np.sqrt(k1)))
        lam = scalar(lam, d)
        s["s"] = s["s"] + lam * g
        s["nu"] = s["nu"] + lam * (g * g)
        eps = scalar(r.eps, d)
        cube = np.sqrt if sw.get("root", "cbrt") == "sqrt" else np.cbrt
        denom = cube(s["nu"] + eps) if sw.get("eps_mode", "outside") == "inside" else cube(s["nu"]) + eps
        anchor = x if sw.get("anchor", "x0") == "x" else s["x0"]
        z = anchor - s["s"] / denom
        return scalar(1.0 - r.momentum, d) * z + scalar(r.momentum, d) * x


def variants(rule):
    from refopt.conventions._variants import oracle_variant as v
    return [v(rule, "lambda without the sqrt", "lambda_k = lr + eps in place of (lr + eps) sqrt(k + 1)",
              lam="constant"),
            v(rule, "eps inside the cube root", "cbrt(nu + eps) in place of cbrt(nu) + eps", eps_mode="inside"),
            v(rule, "square root in place of the cube root", "sqrt(nu) + eps (Adagrad's) in place of cbrt(nu) + eps",
              root="sqrt"),
            v(rule, "z anchored at x_k", "z = x_k - s / (cbrt(nu) + eps) in place of the params at init x_0",
              anchor="x")]


def facts(rule, of):
    """Not gradient-scale invariant: with c g, s scales by c and cbrt(nu) by c^(2/3), so z - x_0 scales by c^(1/3);
    eps is an absolute constant; per entry."""
    return {"grad_scale": False, "step_scale_free": False, "elementwise": True}


def _match(rule):
    if (type(rule) is not MADGRAD or rule.schedule is not None or not rule.eps_in_lr
            or rule.lam_dtype != "float32"):
        return None
    return dict(learning_rate=rule.lr, momentum=rule.momentum, weight_decay=rule.weight_decay, eps=rule.eps)


OPTAX = PeerMapping("optax.contrib.madgrad", "optax", "contrib.madgrad",
                    dict(momentum=0.9, weight_decay=0.0, eps=1e-6),
                    lambda learning_rate, momentum, weight_decay, eps: MADGRAD(
                        lr=learning_rate, momentum=momentum, eps=eps, weight_decay=weight_decay),
                    "madgrad", required=("learning_rate",),
                    refuse={"learning_rate": (lambda v: not callable(v),
                                              "pass a constant learning_rate and the schedule as MADGRAD's "
                                              "schedule= (refopt reads it at t = k + 1, optax at its count k)"),
                            "weight_decay": (lambda v: not callable(v), "refopt takes a constant weight_decay"),
                            "eps": (lambda v: not callable(v) and v > 0,
                                    "refopt's MADGRAD needs eps > 0 (with eps = 0 a zero gradient on the first "
                                    "step gives 0/0)")},
                    state={"s": "s", "nu": "grad_sum_sq", "x0": "x0"}, match=_match)

_KW = dict(learning_rate=1e-2, momentum=0.8, eps=1e-5, weight_decay=0.01)

CONVENTIONS = Conventions(
    rules=(MADGRAD,),
    final="x = momentum x + (1 - momentum) (x_0 - s / (cbrt(nu) + eps)): the anchor x_0, the cube root, where eps "
          "enters, or the weights of the average",
    per_step="lambda_k = (lr + eps) sqrt(k + 1), in float32",
    counters=(("lam", "the dual-averaging weight sqrt(k + 1) of lambda_k", ("next", "prev", "frozen")),),
    mappings=(OPTAX,),
    no_peer={"torch": "torch.optim ships no MADGRAD",
             "schedulefree": "schedulefree ships the Schedule-Free optimizers only"},
    presets=(
        OPTAX.preset("optax.contrib.madgrad", dict(learning_rate=1e-2), "lambda = fl32((lr + eps) sqrt(k + 1)); "
                     "z = x0 - s / (cbrt(nu) + eps); x = 0.9 x + 0.1 z"),
        OPTAX.preset("optax.contrib.madgrad(momentum,eps,wd)", _KW, "momentum 0.8, eps 1e-5; L2 decay 0.01 added "
                     "to g before s and nu"),
    ),
    wrong=(Preset("WRONG lambda: optax.contrib.madgrad vs refopt MADGRAD with the paper's lambda", "optax",
                  "madgrad", ("contrib.madgrad", dict(learning_rate=1e-3, eps=1e-4)),
                  lambda: MADGRAD(lr=1e-3, eps=1e-4, eps_in_lr=False, lam_dtype="float64"),
                  "the paper's lambda_k = lr sqrt(k + 1) vs optax's (lr + eps) sqrt(k + 1)",
                  state={"s": "s", "nu": "grad_sum_sq"}, expect_fail=True),),
    oracle=MADGRADOracle,
    variants=variants,
    facts=facts,
    golden=(GoldenCase("madgrad", lambda: MADGRAD(lr=1e-2), "optax.contrib.madgrad(1e-2)", ("s", "nu")),
            GoldenCase("madgrad_wd", lambda: MADGRAD(lr=1e-2, momentum=0.8, eps=1e-5, weight_decay=0.01),
                       "MADGRAD momentum 0.8, eps 1e-5, L2 decay 0.01", ("s", "nu"))),
    examples=(Example("madgrad", lambda: MADGRAD(lr=0.01)),
              Example("madgrad_paper", lambda: MADGRAD(lr=0.01, momentum=0.8, eps=1e-5, weight_decay=1e-3,
                                                       eps_in_lr=False, lam_dtype="float64"))),
    cli=(CliName("madgrad", MADGRAD, {"mlp": 1e-2, "gpt": 1e-3}, "MADGRAD (optax.contrib semantics): --momentum, "
                 "--eps, --weight-decay (L2)", {"momentum": "momentum", "eps": "eps",
                                                "weight_decay": "weight_decay"}),),
)
