"""RAdam (refopt/rules/radam.py) to torch.optim.RAdam and optax.radam: both rectify with r_t while rho_t > 5 and
take the bias-corrected momentum before; torch adds eps to sqrt(v) and multiplies by sqrt(1 - beta2^t) (so its
eps acts as eps / sqrt(1 - beta2^t) on sqrt(v_hat)), optax adds eps to sqrt(v_hat + eps_root); torch has L2 or
decoupled decay, optax has a threshold and Nesterov."""
from __future__ import annotations

import numpy as np

from refopt.conventions._spec import (
    NO_MAXIMIZE, CliName, Conventions, Example, Oracle, PeerMapping, Preset, counted, gamma, scalar)
from refopt.golden import GoldenCase
from refopt.rules.radam import RAdam, rectification, sma_length


class RAdamOracle(Oracle):
    """RAdam from the rule's docstring. Switches: ``eps_mode`` 'uncorrected' | 'corrected' overriding the
    rule's; ``threshold`` a number in place of the rule's; ``decay`` 'l2' | 'decoupled' overriding the rule's;
    ``counter`` {'bc1' | 'bc2' | 'rho': 'next' | 'prev' | 'frozen'} (rho: the step rho_t and r_t read);
    ``momentum_phase`` 'corrected' | 'uncorrected' (the steps before the rectified ones take the raw m)."""

    def init_leaf(self, x, path):
        return {"m": np.zeros_like(x), "v": np.zeros_like(x)}

    def _decay(self):
        return self.switches.get("decay", "decoupled" if self.rule.decoupled_weight_decay else "l2")

    def direction_leaf(self, t, s, x, g, path):
        r, d, sw = self.rule, x.dtype, self.switches
        if r.weight_decay != 0 and self._decay() == "l2":
            g = g + scalar(r.weight_decay, d) * x
        s["m"] = scalar(r.beta1, d) * s["m"] + scalar(1.0 - r.beta1, d) * g
        m = s["m"]
        s["v"] = scalar(r.beta2, d) * s["v"] + scalar(1.0 - r.beta2, d) * (g * g)
        v = s["v"]
        c = sw.get("counter", {})
        t1, t2, tr = (counted(t, c.get(k)) for k in ("bc1", "bc2", "rho"))
        bc1, bc2 = 1.0 - r.beta1 ** t1, 1.0 - r.beta2 ** t2
        if r.nesterov:
            m_hat = scalar(r.beta1, d) * (m / scalar(1.0 - r.beta1 ** (t1 + 1), d)) + \
                scalar(1.0 - r.beta1, d) * (g / scalar(bc1, d))
        else:
            m_hat = m / scalar(bc1, d)
        if not tr >= 1 or sma_length(r.beta2, tr)[0] <= sw.get("threshold", r.threshold):
            return m if sw.get("momentum_phase") == "uncorrected" else m_hat
        rect, eps, er = scalar(rectification(r.beta2, tr), d), scalar(r.eps, d), scalar(r.eps_root, d)
        if sw.get("eps_mode", r.eps_mode) == "corrected":
            return rect * m_hat / (np.sqrt(v / scalar(bc2, d) + er) + eps)
        return m_hat * (scalar(np.sqrt(bc2), d) / (np.sqrt(v + er) + eps)) * rect

    def step_leaf(self, t, s, x, g, path):
        r, d = self.rule, x.dtype
        lr = r.lr * gamma(r.schedule, t)
        u = self.direction_leaf(t, s, x, g, path)
        decay = 1.0 - lr * r.weight_decay if r.weight_decay != 0 and self._decay() == "decoupled" else 1.0
        return scalar(decay, d) * x - scalar(lr, d) * u


def variants(rule):
    from refopt.conventions._variants import oracle_variant as v
    out = [v(rule, "the paper's threshold 4", "the rectified step from rho_t > 4 in place of "
             f"{rule.threshold:g}", threshold=4.0),
           v(rule, "no bias correction in the momentum steps", "the steps before the rectified ones (rho_t <= "
             f"{rule.threshold:g}) take the raw m_t in place of m_t/(1 - beta1^t)", momentum_phase="uncorrected")]
    if rule.weight_decay:
        other = "l2" if rule.decoupled_weight_decay else "decoupled"
        out.append(v(rule, "decoupled_weight_decay flipped", f"the decay as {'an L2 term in g' if other == 'l2' else 'x (1 - lr wd)'}",
                     decay=other))
    return out


def facts(rule, of):
    """What the invariance properties' 3-step trajectories measure: rho_t <= 4 for t <= 4 whatever beta2
    (rho_1 = 1, rho_t ~ t), so RAdam's first steps are SGD with the bias-corrected momentum m_hat, which is
    linear in g (degree 1: not scale invariant) and commutes with orthogonal maps. From the first rectified
    step on (t >= 6 for beta2 = 0.999) the step is per entry and of degree 0 in g, as Adam's."""
    return {"grad_scale": False, "step_scale_free": False, "orthogonal": True, "elementwise": True}


def _torch_match(rule):
    if type(rule) is not RAdam or rule.schedule is not None or rule.eps_mode != "uncorrected" or rule.eps_root \
            or rule.threshold != 5.0 or rule.nesterov:
        return None
    return dict(lr=rule.lr, betas=(rule.beta1, rule.beta2), eps=rule.eps, weight_decay=rule.weight_decay,
                decoupled_weight_decay=rule.decoupled_weight_decay)


def _optax_match(rule):
    if type(rule) is not RAdam or rule.schedule is not None or rule.eps_mode != "corrected" or rule.weight_decay:
        return None
    return dict(learning_rate=rule.lr, b1=rule.beta1, b2=rule.beta2, eps=rule.eps, eps_root=rule.eps_root,
                threshold=rule.threshold, nesterov=rule.nesterov)


def _torch(lr, betas, eps, weight_decay, decoupled_weight_decay):
    return RAdam(lr=lr, beta1=betas[0], beta2=betas[1], eps=eps, weight_decay=weight_decay,
                 decoupled_weight_decay=decoupled_weight_decay)


def _optax(learning_rate, b1, b2, eps, eps_root, threshold, nesterov):
    return RAdam(lr=learning_rate, beta1=b1, beta2=b2, eps=eps, eps_root=eps_root, threshold=threshold,
                 nesterov=nesterov, eps_mode="corrected")


_STATE = {"m": "exp_avg", "v": "exp_avg_sq"}
_OSTATE = {"m": "mu", "v": "nu"}
TORCH = PeerMapping("torch.optim.RAdam", "torch", "RAdam",
                    dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, decoupled_weight_decay=False,
                         maximize=False),
                    _torch, "radam", refuse={"maximize": NO_MAXIMIZE},
                    ignore=("foreach", "capturable", "differentiable"), state=_STATE, match=_torch_match)
OPTAX = PeerMapping("optax.radam", "optax", "radam",
                    dict(b1=0.9, b2=0.999, eps=1e-8, eps_root=0.0, threshold=5.0, nesterov=False),
                    _optax, "radam", required=("learning_rate",), state=_OSTATE, match=_optax_match)


def atlas_radam():
    from refopt.crosscheck.atlas import Entry, Pair, _p, _rules, peer_side

    R = _rules()
    kw = dict(lr=1e-2, betas=(0.9, 0.99), eps=1e-3)
    t = _p("torch.RAdam(lr=1e-2, betas=(0.9, 0.99), eps=1e-3)", "torch", "RAdam", kw,
           lambda: R.RAdam(lr=1e-2, beta2=0.99, eps=1e-3), state=_STATE)
    o = _p("optax.radam(1e-2, b2=0.99, eps=1e-3)", "optax", "radam", dict(learning_rate=1e-2, b2=0.99, eps=1e-3),
           lambda: R.RAdam(lr=1e-2, beta2=0.99, eps=1e-3, eps_mode="corrected"), state=_OSTATE)
    t0 = _p("torch.RAdam(lr=1e-2, betas=(0.9, 0.99), eps=1e-30)", "torch", "RAdam", {**kw, "eps": 1e-30},
            lambda: R.RAdam(lr=1e-2, beta2=0.99, eps=1e-30), state=_STATE)
    o0 = _p("optax.radam(1e-2, b2=0.99, eps=1e-30)", "optax", "radam", dict(learning_rate=1e-2, b2=0.99, eps=1e-30),
            lambda: R.RAdam(lr=1e-2, beta2=0.99, eps=1e-30, eps_mode="corrected"), state=_OSTATE)
    return Entry(
        "radam-eps", "torch.optim.RAdam (eps on sqrt(v), then sqrt(1 - beta2^t)) vs optax.radam (eps on "
        "sqrt(v_hat))",
        (peer_side("torch", t, source="torch: sqrt(1 - b2^t) / (sqrt(v) + eps)"),
         peer_side("optax", o, source="optax: 1 / (sqrt(v_hat + eps_root) + eps)"),
         peer_side("torch eps 1e-30", t0, source="torch with a negligible eps"),
         peer_side("optax eps 1e-30", o0, source="optax with a negligible eps")),
        (Pair("torch", "optax", "final", 1e-4, what="params after 50 steps, eps 1e-3 (torch's eps is "
              "eps / sqrt(1 - b2^t) on sqrt(v_hat): 4.1x at t = 6, 1.6x at t = 50, b2 = 0.99)"),
         Pair("torch eps 1e-30", "optax eps 1e-30", "final", 1e-9, "max",
              what="eps 1e-30 on both sides: the eps placement is the whole difference")),
        "The paper's Algorithm 2 has no eps (l_t = sqrt((1 - beta2^t) / v_t)); optax's eps on sqrt(v_hat) is Adam's "
        "(Kingma & Ba) placement, torch's eps on sqrt(v) makes the effective eps eps / sqrt(1 - beta2^t), largest "
        "on the first rectified steps.",
        "Liu et al. 2020 (ICLR), Algorithm 2; torch.optim.RAdam; optax.radam")


CONVENTIONS = Conventions(
    rules=(RAdam,),
    final="r_t m_hat / (sqrt(v_hat) + eps) while rho_t > 5, m_hat before: the threshold, the rectification r_t, "
          "where eps is added (sqrt(v) or sqrt(v_hat)), the two bias corrections, or the decay",
    per_step="rho_t, r_t and the switch from the momentum step to the rectified one; the bias corrections",
    counters=(("bc1", "the bias correction of m (1 - beta1^t)"), ("bc2", "the bias correction of v (1 - beta2^t)"),
              ("rho", "the SMA length rho_t and the rectification r_t")),
    mappings=(TORCH, OPTAX),
    no_peer={"schedulefree": "schedulefree ships the Schedule-Free optimizers only"},
    presets=(
        TORCH.preset("torch.RAdam", dict(lr=1e-2), "m_hat for rho_t <= 5, then r_t m_hat sqrt(1-b2^t)/(sqrt(v)+eps)"),
        TORCH.preset("torch.RAdam(betas,eps,wd)", dict(lr=1e-2, betas=(0.8, 0.99), eps=1e-4, weight_decay=1e-2),
                     "b2 0.99 (the rectified step from t = 6); L2 in g; eps 1e-4 on sqrt(v)"),
        TORCH.preset("torch.RAdam(decoupled_weight_decay)", dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-6,
                                                                 weight_decay=0.1, decoupled_weight_decay=True),
                     "x (1 - lr wd) before the step"),
        OPTAX.preset("optax.radam", dict(learning_rate=1e-2), "eps on sqrt(v_hat); rho_t >= 5"),
        OPTAX.preset("optax.radam(betas,eps,eps_root,threshold,nesterov)",
                     dict(learning_rate=1e-2, b1=0.8, b2=0.99, eps=1e-4, eps_root=1e-8, threshold=6.0, nesterov=True),
                     "threshold 6; eps_root in the sqrt; Nesterov m_hat"),
    ),
    wrong=(Preset("WRONG eps: torch.RAdam vs refopt RAdam(eps on sqrt(v_hat))", "torch", "radam",
                  ("RAdam", dict(lr=1e-2, betas=(0.8, 0.99), eps=1e-3)),
                  lambda: RAdam(lr=1e-2, beta1=0.8, beta2=0.99, eps=1e-3, eps_mode="corrected"),
                  "eps on sqrt(v) vs on sqrt(v_hat): the eps placement is swapped", state=_STATE, expect_fail=True),),
    oracle=RAdamOracle,
    variants=variants,
    facts=facts,
    golden=(GoldenCase("radam", lambda: RAdam(lr=1e-2, beta2=0.99), "torch.optim.RAdam, b2 0.99", ("m", "v")),
            GoldenCase("radam_optax_nesterov", lambda: RAdam(lr=1e-2, beta1=0.8, beta2=0.99, eps=1e-4, eps_root=1e-8,
                                                             threshold=6.0, nesterov=True, eps_mode="corrected"),
                       "optax.radam: eps on sqrt(v_hat), eps_root 1e-8, threshold 6, Nesterov", ("m", "v")),
            GoldenCase("radamw", lambda: RAdam(lr=1e-2, beta2=0.95, eps=1e-6, weight_decay=0.1,
                                               decoupled_weight_decay=True),
                       "torch.optim.RAdam(decoupled_weight_decay=True), wd 0.1", ("m", "v"))),
    examples=(Example("radam", lambda: RAdam(lr=0.05, beta2=0.99)),
              Example("radam_optax_nesterov_wd", lambda: RAdam(lr=0.01, beta2=0.99, eps_mode="corrected",
                                                               nesterov=True, weight_decay=1e-3,
                                                               decoupled_weight_decay=True))),
    atlas=(atlas_radam,),
    cli=(CliName("radam", RAdam, {"mlp": 3e-3, "gpt": 3e-3}, "RAdam (torch semantics): --beta1, --beta2, --eps, "
                 "--weight-decay (L2)", {"beta1": "beta1", "beta2": "beta2", "eps": "eps"}),),
)
