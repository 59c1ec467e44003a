"""AdaBelief (refopt/rules/adabelief.py) to optax.adabelief: eps_root is added to the stored s every step (the
paper's Algorithm 2), the deviation g - m uses the updated m, eps goes after the square root of the corrected s.
torch.optim ships no AdaBelief."""
from __future__ import annotations

import numpy as np

from refopt.conventions._spec import CliName, Conventions, Example, Oracle, PeerMapping, Preset, counted, gamma, \
    scalar
from refopt.golden import GoldenCase
from refopt.rules.adam import Adam
from refopt.rules.adabelief import AdaBelief


class AdaBeliefOracle(Oracle):
    """AdaBelief from the rule's docstring. Switches: ``deviation`` 'updated' (g - m_t, the rule's) | 'previous'
    (g - m_{t-1}); ``eps_root`` 'stored' (added to s every step, the rule's) | 'read' (added to s_hat only);
    ``counter`` {'bc1' | 'bc2': 'next' | 'prev' | 'frozen'}."""

    def init_leaf(self, x, path):
        return {"m": np.zeros_like(x), "s": np.zeros_like(x)}

    def direction_leaf(self, t, s, x, g, path):
        r, d, sw = self.rule, x.dtype, self.switches
        m_prev = s["m"]
        s["m"] = scalar(r.beta1, d) * m_prev + scalar(1.0 - r.beta1, d) * g
        m = s["m"]
        dev = g - (m_prev if sw.get("deviation") == "previous" else m)
        stored = sw.get("eps_root", "stored") == "stored"
        s["s"] = scalar(r.beta2, d) * s["s"] + scalar(1.0 - r.beta2, d) * (dev * dev) + \
            (scalar(r.eps_root, d) if stored else scalar(0.0, d))
        c = sw.get("counter", {})
        t1, t2 = counted(t, c.get("bc1")), counted(t, c.get("bc2"))
        bc1, bc2 = scalar(1.0 - r.beta1 ** t1, d), scalar(1.0 - r.beta2 ** t2, d)
        if r.nesterov:
            m_hat = scalar(r.beta1, d) * (m / scalar(1.0 - r.beta1 ** (t1 + 1), d)) + \
                scalar(1.0 - r.beta1, d) * (g / bc1)
        else:
            m_hat = m / bc1
        v_hat = s["s"] / bc2 + (0 if stored else scalar(r.eps_root, d))
        return m_hat / (np.sqrt(v_hat) + scalar(r.eps, d))

    def step_leaf(self, t, s, x, g, path):
        lr = self.rule.lr * gamma(self.rule.schedule, t)
        return x - scalar(lr, x.dtype) * self.direction_leaf(t, s, x, g, path)


def variants(rule):
    from refopt.conventions._variants import oracle_variant as v
    return [v(rule, "deviation from the previous m", "(g - m_{t-1})^2 in place of (g - m_t)^2", deviation="previous"),
            v(rule, "eps_root not stored", "eps_root added to s_hat when read, not to the stored s",
              eps_root="read")]


def facts(rule, of):
    """m_hat / sqrt(s_hat) has degree 0 in g (eps, eps_root -> 0); per entry."""
    return {"grad_scale": True, "step_scale_free": False, "elementwise": True}


def _match(rule):
    if type(rule) is not AdaBelief or rule.schedule is not None:
        return None
    return dict(learning_rate=rule.lr, b1=rule.beta1, b2=rule.beta2, eps=rule.eps, eps_root=rule.eps_root,
                nesterov=rule.nesterov)


OPTAX = PeerMapping("optax.adabelief", "optax", "adabelief",
                    dict(b1=0.9, b2=0.999, eps=1e-16, eps_root=1e-16, nesterov=False),
                    lambda learning_rate, b1, b2, eps, eps_root, nesterov: AdaBelief(
                        lr=learning_rate, beta1=b1, beta2=b2, eps=eps, eps_root=eps_root, nesterov=nesterov),
                    "adabelief", required=("learning_rate",), refuse={"eps": (lambda v: v > 0, "refopt's "
                    "AdaBelief needs eps > 0 (with eps = 0 a constant gradient gives 0/0)")},
                    state={"m": "mu", "s": "nu"}, match=_match)

CONVENTIONS = Conventions(
    rules=(AdaBelief,),
    final="m_hat / (sqrt(s_hat) + eps) with s the EMA of (g - m)^2 + eps_root: which m the deviation uses, where "
          "eps_root is added, the two bias corrections, or the Nesterov form of m_hat",
    per_step="the bias corrections 1 - beta1^t and 1 - beta2^t",
    counters=(("bc1", "the bias correction of m (1 - beta1^t)"), ("bc2", "the bias correction of s (1 - beta2^t)")),
    mappings=(OPTAX,),
    no_peer={"torch": "torch.optim ships no AdaBelief",
             "schedulefree": "schedulefree ships the Schedule-Free optimizers only"},
    presets=(
        OPTAX.preset("optax.adabelief", dict(learning_rate=1e-3), "s = b2 s + (1-b2)(g - m)^2 + eps_root; "
                     "m_hat / (sqrt(s_hat) + eps)"),
        OPTAX.preset("optax.adabelief(betas,eps,nesterov)", dict(learning_rate=1e-2, b1=0.8, b2=0.95, eps=1e-8,
                                                                 eps_root=1e-10, nesterov=True),
                     "Nesterov m_hat = b1 m/(1 - b1^(t+1)) + (1 - b1) g/(1 - b1^t)"),
    ),
    wrong=(Preset("WRONG deviation: optax.adabelief vs refopt Adam", "optax", "adabelief",
                  ("adabelief", dict(learning_rate=1e-2, b1=0.8, b2=0.95, eps=1e-8)),
                  lambda: Adam(lr=1e-2, beta1=0.8, beta2=0.95, eps=1e-8),
                  "E[(g - m)^2] vs E[g^2]: the belief replaced by Adam's second moment", state={"m": "mu"},
                  expect_fail=True),),
    oracle=AdaBeliefOracle,
    variants=variants,
    facts=facts,
    golden=(GoldenCase("adabelief", lambda: AdaBelief(lr=1e-3), "optax.adabelief's defaults", ("m", "s")),
            GoldenCase("adabelief_nesterov", lambda: AdaBelief(lr=1e-2, beta1=0.8, beta2=0.95, eps=1e-8,
                                                               eps_root=1e-10, nesterov=True),
                       "AdaBelief betas (0.8, 0.95), eps 1e-8, eps_root 1e-10, Nesterov", ("m", "s"))),
    examples=(Example("adabelief", lambda: AdaBelief(lr=0.01)),
              Example("adabelief_nesterov", lambda: AdaBelief(lr=0.01, eps=1e-8, nesterov=True))),
    cli=(CliName("adabelief", AdaBelief, {"mlp": 1e-3, "gpt": 1e-3}, "AdaBelief (optax semantics): --beta1, "
                 "--beta2, --eps", {"beta1": "beta1", "beta2": "beta2", "eps": "eps"}),),
)
