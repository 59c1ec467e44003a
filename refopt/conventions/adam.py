"""Adam and AdamW (refopt/rules/adam.py) to torch.optim.{Adam, AdamW, NAdam} and optax.{adam, adamw, nadam,
nadamw, amsgrad}: eps after the square root of the bias-corrected v (E1), t from 1, L2 (Adam) or decoupled
lr-coupled decay (AdamW), AMSGrad in torch's and optax's forms, NAdam with torch's momentum schedule or
optax's constant beta1 (CONVENTIONS.md 1.2, 2.3)."""
from __future__ import annotations

import math

import numpy as np

from refopt.conventions._spec import (
    NO_MASK, NO_MAXIMIZE, Conventions, Example, Oracle, PeerMapping, Preset, counted, gamma, scalar)
from refopt.golden import GoldenCase
from refopt.rules.adam import Adam, AdamW


class AdamOracle(Oracle):
    """Adam / AdamW from their equations (the rules' docstrings): g includes L2 decay where the rule has it;
    mhat = m/(1-b1^t), vhat = v/(1-b2^t); AMSGrad keeps max(v) (torch) or max(vhat) (optax); NAdam mixes
    b1 m/(1-b1^(t+1)) + (1-b1) g/(1-b1^t) (optax) or follows torch's mu_t products.

    Switches (the diagnosis variants): ``eps_mode`` 'outside' (E1) | 'inside' (sqrt(vhat + eps)) |
    'inside_sq' (sqrt(vhat + eps^2)) | 'hat' (lr sqrt(1-b2^t)/(1-b1^t) m/(sqrt(v) + eps)); ``bias``
    'standard' | 'off_by_one' (1 - b^(t+1)) | 'none' | 'm_only' | 'v_only'; ``decay`` 'none' | 'l2' |
    'decoupled' | 'independent' | 'after'; ``nesterov`` (optax's mix); ``counter`` {'bc1' | 'bc2': 'next' |
    'prev' | 'frozen'} (and 'nesterov': optax's look-ahead 1 - b1^(t+1)): that place reads t + 1, t - 1 or 1;
    and lr, weight_decay overriding the rule's."""

    def __init__(self, rule, name=None, **sw):
        super().__init__(rule, name, **sw)
        self.lr, self.b1, self.b2, self.eps = sw.get("lr", rule.lr), rule.beta1, rule.beta2, rule.eps
        self.wd = sw.get("weight_decay", rule.weight_decay)
        mode = getattr(rule, "wd_mode", None)
        kind = "l2" if mode is None else mode
        self.decay = sw.get("decay", kind if rule.weight_decay > 0 else "none")
        self.eps_mode, self.bias = sw.get("eps_mode", "outside"), sw.get("bias", "standard")
        self.nesterov = sw.get("nesterov", rule.nesterov)
        self.psi = rule.momentum_decay if self.nesterov else None
        self.amsgrad, self.schedule = rule.amsgrad, rule.schedule
        self.counter = sw.get("counter", {})

    def init_leaf(self, x, path):
        s = {"m": np.zeros_like(x), "v": np.zeros_like(x)}
        if self.amsgrad:
            s["v_max"] = np.zeros_like(x)
        return s

    def _parts(self, t, s, x, g):
        """(numerator, denominator, step multiplier of num/den, u scale) of step t; m, v (v_max) updated."""
        d = x.dtype
        b1, b2 = self.b1, self.b2
        lr = self.lr * gamma(self.schedule, t)
        if self.decay == "l2":
            g = g + scalar(self.wd, d) * x
        s["m"] = scalar(b1, d) * s["m"] + scalar(1.0 - b1, d) * g
        m = s["m"]
        s["v"] = scalar(b2, d) * s["v"] + scalar(1.0 - b2, d) * (g * g)
        v = s["v"]
        tb = t + 1 if self.bias == "off_by_one" else t
        t1, t2 = (counted(tb, self.counter.get(k)) for k in ("bc1", "bc2"))
        bc1 = 1.0 - b1 ** t1 if self.bias in ("standard", "off_by_one", "m_only") else 1.0
        bc2 = 1.0 - b2 ** t2 if self.bias in ("standard", "off_by_one", "v_only") else 1.0
        root = math.sqrt(bc2)
        if self.amsgrad == "bias_corrected":        # optax: the maximum of vhat
            s["v_max"] = np.maximum(s["v_max"], v * scalar(1.0 / bc2, d))
            v = s["v_max"]
            root = 1.0
        elif self.amsgrad:                           # torch: the maximum of v, then its correction
            s["v_max"] = np.maximum(s["v_max"], v)
            v = s["v_max"]
        step, u_scale = lr / bc1, 1.0 / bc1
        if self.nesterov:
            if self.psi is None:                     # optax.nadam: constant beta1
                c_m, c_g = b1 / (1.0 - b1 ** (counted(tb, self.counter.get("nesterov")) + 1)), (1.0 - b1) / bc1
            else:                                    # torch.optim.NAdam: mu_k = b1 (1 - 0.96^(k psi)/2)
                mu = [b1 * (1.0 - 0.5 * 0.96 ** (k * self.psi)) for k in range(1, t + 2)]
                prod = 1.0
                for k in range(t):
                    prod *= mu[k]
                c_m, c_g = mu[t] / (1.0 - prod * mu[t]), (1.0 - mu[t - 1]) / (1.0 - prod)
            num, step, u_scale = scalar(c_m, d) * m + scalar(c_g, d) * g, lr, 1.0
        else:
            num = m
        if self.eps_mode == "outside":
            den = np.sqrt(v) / scalar(root, d) + scalar(self.eps, d)
        elif self.eps_mode == "inside":
            den = np.sqrt(v / scalar(bc2, d) + scalar(self.eps, d))
        elif self.eps_mode == "inside_sq":
            den = np.sqrt(v / scalar(bc2, d) + scalar(self.eps ** 2, d))
        else:   # 'hat': lr_t = lr sqrt(bc2)/bc1, eps added to sqrt(v) (not bias-corrected)
            den = np.sqrt(v) + scalar(self.eps, d)
            step *= root
        return num, den, step, u_scale, lr

    def direction_leaf(self, t, s, x, g, path):
        num, den, _, u_scale, _ = self._parts(t, s, x, g)
        return scalar(u_scale, x.dtype) * (num / den)

    def step_leaf(self, t, s, x, g, path):
        d = x.dtype
        num, den, step, _, lr = self._parts(t, s, x, g)
        if self.decay in ("decoupled", "independent"):
            x = scalar(1.0 - (lr if self.decay == "decoupled" else gamma(self.schedule, t)) * self.wd, d) * x
        x = x - scalar(step, d) * (num / den)
        if self.decay == "after":
            x = x * scalar(1.0 - lr * self.wd, d)
        return x


def ConventionAdam(lr, beta1, beta2, eps, weight_decay=0.0, decay="none", eps_mode="outside", bias="standard",
                   nesterov=False, schedule=None, name="adam variant"):
    """Adam with switched conventions (:class:`AdamOracle`): the restated sides of the divergence atlas."""
    rule = Adam(lr=lr, beta1=beta1, beta2=beta2, eps=eps, schedule=schedule)
    return AdamOracle(rule, name=name, weight_decay=weight_decay, decay=decay if weight_decay else "none",
                      eps_mode=eps_mode, bias=bias, nesterov=nesterov)


def variants(rule):
    from refopt.conventions._variants import oracle_variant as v

    decoupled = isinstance(rule, AdamW)
    mode = getattr(rule, "wd_mode", "decoupled")
    decay = ("independent" if mode == "independent" else "decoupled") if decoupled else "l2"
    if rule.weight_decay == 0:
        decay = "none"
    out = [
        v(rule, "eps inside the sqrt", "mhat / sqrt(vhat + eps) (E3 with eps_root = eps; PITFALLS B02)", eps_mode="inside"),
        v(rule, "eps^2 inside the sqrt", "mhat / sqrt(vhat + eps^2)", eps_mode="inside_sq"),
        v(rule, "eps-hat", "lr sqrt(1-b2^t)/(1-b1^t) m / (sqrt(v) + eps): eps not bias-corrected (Kingma's "
          "efficient form, TensorFlow)", eps_mode="hat"),
        v(rule, "bias correction off by one", "1 - beta^(t+1) in place of 1 - beta^t (t counted from 0 and "
          "incremented first, or twice)", bias="off_by_one"),
        v(rule, "no bias correction", "m / (sqrt(v) + eps)", bias="none"),
        v(rule, "bias correction of m only", "mhat / (sqrt(v) + eps)", bias="m_only"),
        v(rule, "bias correction of v only", "m / (sqrt(vhat) + eps)", bias="v_only"),
        v(rule, "NAdam" if not rule.nesterov else "no NAdam", "the Nesterov (NAdam) mix of the first moment "
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
                out.append(v(rule, name, detail, decay=kind))
    else:
        out.append(v(rule, "torch AdamW default decay 0.01", "decoupled decay 0.01 (torch.optim.AdamW's default "
                     "weight_decay, not given)", decay="decoupled", weight_decay=1e-2))
        out.append(v(rule, "optax adamw default decay 1e-4", "decoupled decay 1e-4 (optax.adamw's default "
                     "weight_decay, not given)", decay="decoupled", weight_decay=1e-4))
    if decoupled and rule.weight_decay > 0 and rule.weight_decay != 1e-4:
        out.append(v(rule, "optax adamw default decay 1e-4", "decoupled decay 1e-4 (optax.adamw's default) in "
                     f"place of {rule.weight_decay:g}", decay="decoupled", weight_decay=1e-4))
    if decoupled and rule.weight_decay != 1e-2:
        out.append(v(rule, "torch AdamW default decay 0.01", "decoupled decay 0.01 (torch.optim.AdamW's default) "
                     f"in place of {rule.weight_decay:g}", decay="decoupled", weight_decay=1e-2))
    return out


def facts(rule, of):
    """m/sqrt(v) has degree 0 in g (eps -> 0), unless L2 adds lambda x to g (Adam's weight_decay); with
    beta1 = beta2 = 0 each step sees only g_t/|g_t|; sqrt(v) is taken per entry: permutation, not
    orthogonal, equivariant."""
    scale = isinstance(rule, AdamW) or rule.weight_decay == 0
    return {"grad_scale": scale, "step_scale_free": scale and rule.beta1 == 0 and rule.beta2 == 0,
            "elementwise": True}


# ---- the peers ------------------------------------------------------------------------------------------
_NO_ROOT = (lambda v: v == 0, "eps_root (eps inside the square root) is not a refopt convention: refopt adds eps "
                              "after the square root (E1)")
_NO_DTYPE = (lambda v: v is None, "refopt keeps the moments in the params' dtype")
_IMPL = ("foreach", "capturable", "differentiable", "fused")
_TORCH_STATE = {"m": "exp_avg", "v": "exp_avg_sq"}
_OPTAX_STATE = {"m": "mu", "v": "nu"}


def _torch_state(a):
    return {**_TORCH_STATE, "v_max": "max_exp_avg_sq"} if a.get("amsgrad") else dict(_TORCH_STATE)


def _torch_adam(lr, betas, eps, weight_decay, amsgrad, decoupled_weight_decay):
    cls = AdamW if decoupled_weight_decay else Adam
    return cls(lr=lr, beta1=betas[0], beta2=betas[1], eps=eps, weight_decay=weight_decay, amsgrad=amsgrad)


def _torch_adamw(lr, betas, eps, weight_decay, amsgrad):
    return AdamW(lr=lr, beta1=betas[0], beta2=betas[1], eps=eps, weight_decay=weight_decay, amsgrad=amsgrad)


def _torch_nadam(lr, betas, eps, weight_decay, momentum_decay, decoupled_weight_decay):
    cls = AdamW if decoupled_weight_decay else Adam
    return cls(lr=lr, beta1=betas[0], beta2=betas[1], eps=eps, weight_decay=weight_decay, nesterov=True,
               momentum_decay=momentum_decay)


def _plain(rule) -> bool:
    return rule.schedule is None and getattr(rule, "wd_mode", "decoupled") == "decoupled"


def _torch_match(cls):
    def match(rule):
        if type(rule) is not cls or not _plain(rule) or rule.nesterov or rule.amsgrad == "bias_corrected":
            return None
        kw = dict(lr=rule.lr, betas=(rule.beta1, rule.beta2), eps=rule.eps, weight_decay=rule.weight_decay)
        return {**kw, "amsgrad": True} if rule.amsgrad else kw
    return match


def _torch_nadam_match(rule):
    if not _plain(rule) or not rule.nesterov or rule.momentum_decay is None or rule.amsgrad:
        return None
    return dict(lr=rule.lr, betas=(rule.beta1, rule.beta2), eps=rule.eps, weight_decay=rule.weight_decay,
                momentum_decay=rule.momentum_decay, decoupled_weight_decay=isinstance(rule, AdamW))


def _optax_match(cls, nesterov, amsgrad=False):
    def match(rule):
        if type(rule) is not cls or not _plain(rule) or rule.nesterov != nesterov or rule.momentum_decay is not None \
                or (rule.amsgrad == "bias_corrected") != amsgrad or rule.amsgrad is True:
            return None
        if cls is Adam and rule.weight_decay != 0:
            return None
        kw = dict(learning_rate=rule.lr, b1=rule.beta1, b2=rule.beta2, eps=rule.eps)
        return {**kw, "weight_decay": rule.weight_decay} if cls is AdamW else kw
    return match


_TA = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=False, maximize=False,
           decoupled_weight_decay=False)
TORCH_ADAM = PeerMapping("torch.optim.Adam", "torch", "Adam", _TA, _torch_adam, "adam",
                         refuse={"maximize": NO_MAXIMIZE}, ignore=_IMPL, state=_torch_state, match=_torch_match(Adam))
TORCH_ADAMW = PeerMapping("torch.optim.AdamW", "torch", "AdamW", {**{k: v for k, v in _TA.items()
                                                                    if k != "decoupled_weight_decay"},
                                                                 "weight_decay": 1e-2},
                          _torch_adamw, "adamw",
                          refuse={"maximize": NO_MAXIMIZE}, ignore=_IMPL, state=_torch_state, match=_torch_match(AdamW))
TORCH_NADAM = PeerMapping("torch.optim.NAdam", "torch", "NAdam",
                          dict(lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, momentum_decay=4e-3,
                               decoupled_weight_decay=False, maximize=False),
                          _torch_nadam, "nadam", refuse={"maximize": NO_MAXIMIZE}, ignore=_IMPL, state=_TORCH_STATE,
                          match=_torch_nadam_match)

_OA = dict(b1=0.9, b2=0.999, eps=1e-8, eps_root=0.0, mu_dtype=None)
_OREF = {"eps_root": _NO_ROOT, "mu_dtype": _NO_DTYPE}


def _optax_adam(nesterov=False, amsgrad=False, cls=Adam):
    def build(learning_rate, b1, b2, eps, weight_decay=0.0, nesterov=nesterov, mask=None):
        kw = dict(lr=learning_rate, beta1=b1, beta2=b2, eps=eps, nesterov=nesterov,
                  amsgrad="bias_corrected" if amsgrad else False)
        return cls(**kw, weight_decay=weight_decay) if cls is AdamW else cls(**kw)
    return build


OPTAX_ADAM = PeerMapping("optax.adam", "optax", "adam", {**_OA, "nesterov": False}, _optax_adam(), "adam",
                         required=("learning_rate",), refuse=_OREF, state=_OPTAX_STATE,
                         match=_optax_match(Adam, False))
OPTAX_NADAM = PeerMapping("optax.nadam", "optax", "nadam", dict(_OA), _optax_adam(nesterov=True), "nadam",
                          required=("learning_rate",), refuse=_OREF, state=_OPTAX_STATE,
                          match=_optax_match(Adam, True))
OPTAX_ADAMW = PeerMapping("optax.adamw", "optax", "adamw", {**_OA, "weight_decay": 1e-4, "mask": None, "nesterov": False},
                          _optax_adam(cls=AdamW), "adamw", required=("learning_rate",),
                          refuse={**_OREF, "mask": NO_MASK}, state=_OPTAX_STATE, match=_optax_match(AdamW, False))
OPTAX_NADAMW = PeerMapping("optax.nadamw", "optax", "nadamw", {**_OA, "weight_decay": 1e-4, "mask": None},
                           _optax_adam(nesterov=True, cls=AdamW), "adamw", required=("learning_rate",),
                           refuse={**_OREF, "mask": NO_MASK}, state=_OPTAX_STATE, match=_optax_match(AdamW, True))
OPTAX_AMSGRAD = PeerMapping("optax.amsgrad", "optax", "amsgrad", dict(_OA), _optax_adam(amsgrad=True), "amsgrad",
                            required=("learning_rate",), refuse=_OREF, state={**_OPTAX_STATE, "v_max": "nu_max"},
                            match=_optax_match(Adam, False, amsgrad=True))

_ADAM = ("m", "v")

# ---- the divergence-atlas entries about the rule (refopt/crosscheck/divergences.py runs them) ----------
def atlas_nadam():
    from refopt.crosscheck.atlas import Entry, Pair, _p, _preset, _rules, peer_side

    R = _rules()
    t1 = _preset("torch.NAdam")
    o1 = _preset("optax.nadam")
    t3 = _p("torch.NAdam(lr=1e-3)", "torch", "NAdam", dict(lr=1e-3), lambda: R.Adam(lr=1e-3, nesterov=True,
                                                                                      momentum_decay=4e-3),
            state={"m": "exp_avg", "v": "exp_avg_sq"})
    o3 = _p("optax.nadam(1e-3)", "optax", "nadam", dict(learning_rate=1e-3), lambda: R.Adam(lr=1e-3, nesterov=True))
    tinf = _p("torch.NAdam(psi=1e9)", "torch", "NAdam", dict(lr=1e-2, momentum_decay=1e9),
              lambda: R.Adam(lr=1e-2, nesterov=True, momentum_decay=1e9))
    return Entry(
        "nadam-momentum-decay", "torch.optim.NAdam (Dozat's momentum schedule) vs optax.nadam (constant beta1)",
        (peer_side("torch", t1, source="Dozat 2016 (momentum schedule mu_t = b1 (1 - 0.96^(t psi)/2), psi = 4e-3)"),
         peer_side("optax", o1, source="constant beta1 (the psi -> infinity limit)"),
         peer_side("torch lr=1e-3", t3), peer_side("optax lr=1e-3", o3),
         peer_side("torch psi=1e9", tinf)),
        (Pair("torch", "optax", "step", 0.1, what="per-step update (median over steps), lr 1e-2"),
         Pair("torch", "optax", "final", 1e-3, what="params after 50 steps, lr 1e-2"),
         Pair("torch lr=1e-3", "optax lr=1e-3", "final", 1e-4, what="params after 50 steps, lr 1e-3"),
         Pair("torch psi=1e9", "optax", "params", 1e-12, "max", what="psi -> infinity: torch = optax")),
        "torch follows Dozat's paper (the momentum schedule, ICLR 2016 workshop); optax uses its constant-beta1 "
        "special case. Neither applies Dozat's extra beta2 factor on vhat (Optimisers.jl does).",
        "Dozat 2016, 'Incorporating Nesterov Momentum into Adam'; CONVENTIONS.md 1.2, 2.3, 7, 10.7")


def atlas_adam_eps():
    from refopt.crosscheck.atlas import Entry, Pair, _p, _preset, peer_side, restated_side

    tp = _preset("torch.Adam")
    root = _p("optax.adam(eps=0, eps_root=1e-8)", "optax", "adam", dict(learning_rate=1e-2, eps=0.0, eps_root=1e-8),
              None)
    return Entry(
        "adam-eps-placement", "Adam's eps: outside the square root (torch, optax's eps), inside it (optax's "
        "eps_root), or eps-hat (TensorFlow/Keras, Kingma & Ba's efficient form)",
        (peer_side("torch", tp, source="Kingma & Ba 2015, Algorithm 1: mhat / (sqrt(vhat) + eps)"),
         peer_side("optax eps_root", root, refopt="variants.ConventionAdam(lr=0.01, eps=1e-8, eps_mode='inside')",
                   make_refopt=lambda: ConventionAdam(1e-2, 0.9, 0.999, 1e-8, eps_mode="inside"),
                   source="mhat / sqrt(vhat + eps_root)"),
         restated_side("eps-hat (TF/Keras)", "tf.keras.optimizers.Adam / Kingma & Ba section 2's efficient form: "
                       "lr sqrt(1-b2^t)/(1-b1^t) m / (sqrt(v) + eps_hat)",
                       lambda: ConventionAdam(1e-2, 0.9, 0.999, 1e-8, eps_mode="hat"),
                       refopt="variants.ConventionAdam(lr=0.01, eps=1e-8, eps_mode='hat')",
                       source="TensorFlow/Keras (not installed here)")),
        (Pair("optax eps_root", "torch", "final", 1e-3, what="params after 50 steps (the 1e-8 gradient leaf)"),
         Pair("eps-hat (TF/Keras)", "torch", "final", 1e-3, what="params after 50 steps (the 1e-8 gradient leaf)")),
        "Kingma & Ba's Algorithm 1 puts eps outside sqrt(vhat) (torch, optax); their efficient form (section 2) "
        "uses eps-hat = eps sqrt(1-b2^t), which TF/Keras ships; eps inside the root is optax's eps_root, for "
        "differentiating through Adam. They differ where |g| ~ eps (PITFALLS B02).",
        "Kingma & Ba 2015; PITFALLS B02; CONVENTIONS.md 1.2, 2.3")


def atlas_adamw_decay():
    from refopt.crosscheck.atlas import Entry, Pair, _p, _preset, _rules, peer_side, restated_side

    R = _rules()
    tw = _preset("torch.AdamW(wd=0.1)")                     # lr 3e-2, betas (0.9, 0.95), wd 0.1
    ow = _preset("optax.adamw(wd=0.1)")
    ind = lambda lr, wd: (lambda: R.AdamW(lr=lr, beta1=0.9, beta2=0.95, weight_decay=wd, wd_mode="independent"))

    def ind_oracle(lr, wd):      # x <- x (1 - wd) - lr u, written from the equation (ConventionAdam)
        return lambda: ConventionAdam(lr, 0.9, 0.95, 1e-8, weight_decay=wd, decay="independent")
    t1 = _p("torch.AdamW(lr=1e-2)", "torch", "AdamW", dict(lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1),
            lambda: R.AdamW(lr=1e-2, beta1=0.9, beta2=0.95, weight_decay=0.1))
    return Entry(
        "adamw-decay-coupling", "AdamW's decay: coupled to lr (torch, optax: x(1 - lr wd)) vs lr-independent "
        "(arXiv:2405.13698: x(1 - wd'))",
        (peer_side("torch lr=3e-2", tw, source="Loshchilov & Hutter's AdamW as torch ships it: eta_t lr wd"),
         peer_side("optax lr=3e-2", ow, source="the same coupling"),
         restated_side("independent wd'=3e-3, lr=3e-2", "independent decay wd' = lr wd = 3e-3 at lr 3e-2",
                       ind(3e-2, 3e-3), oracle=ind_oracle(3e-2, 3e-3), source="arXiv:2405.13698"),
         peer_side("torch lr=1e-2", t1, source="the same wd = 0.1 at lr 1e-2"),
         restated_side("independent wd'=3e-3, lr=1e-2", "the same wd' = 3e-3 at lr 1e-2", ind(1e-2, 3e-3),
                       oracle=ind_oracle(1e-2, 3e-3), source="arXiv:2405.13698: the decay does not follow lr")),
        (Pair("torch lr=3e-2", "optax lr=3e-2", "params", 1e-12, "max", what="torch and optax agree"),
         Pair("torch lr=3e-2", "independent wd'=3e-3, lr=3e-2", "params", 1e-12, "max",
              what="wd' = lr wd: the same run"),
         Pair("torch lr=1e-2", "independent wd'=3e-3, lr=1e-2", "final", 1e-3,
              what="change lr only: the coupled decay follows it, the independent one does not")),
        "Loshchilov & Hutter decouple the decay from the gradient but scale it by the schedule multiplier eta_t; "
        "torch and optax also multiply it by the peak lr. arXiv:2405.13698 (post 001) argues for lr-independent "
        "decay so that the EMA timescale 1/(lr wd) stays put when lr is retuned (muP).",
        "Loshchilov & Hutter 2019; arXiv:2405.13698; SOURCES.md 'Weight decay that transfers'; PITFALLS B05")


def atlas_amsgrad():
    from refopt.crosscheck.atlas import Entry, Pair, _preset, peer_side

    return Entry(
        "amsgrad-max", "AMSGrad: torch keeps the maximum of the raw v and bias-corrects it; optax.amsgrad keeps "
        "the maximum of the bias-corrected v",
        (peer_side("torch", _preset("torch.Adam(amsgrad)"), source="max of v_t, then / sqrt(1 - b2^t)"),
         peer_side("optax", _preset("optax.amsgrad"), source="max of v_t / (1 - b2^t)")),
        (Pair("torch", "optax", "final", 1e-6, what="params after 50 steps"),),
        "Reddi et al. (2018) state AMSGrad without bias correction (max of v); torch adds the correction after the "
        "max (the max then decays with 1/sqrt(1-b2^t)), optax before it.",
        "Reddi et al. 2018; CONVENTIONS.md 1.2, 2.3")


CONVENTIONS = Conventions(
    rules=(Adam, AdamW),
    final="the step lr/(1 - beta1^t) m/(sqrt(v)/sqrt(1 - beta2^t) + eps): its square root, eps, the bias corrections, the Nesterov mix or the AMSGrad maximum",
    per_step="the bias corrections 1 - beta1^t and 1 - beta2^t",
    mappings=(TORCH_ADAM, TORCH_ADAMW, TORCH_NADAM, OPTAX_ADAM, OPTAX_ADAMW, OPTAX_NADAM, OPTAX_NADAMW, OPTAX_AMSGRAD),
    no_peer={"schedulefree": "schedulefree ships the Schedule-Free optimizers only (see ScheduleFreeAdamW)"},
    presets=(
        TORCH_ADAM.preset("torch.Adam", dict(lr=1e-2), "E1 eps after sqrt of the bias-corrected v; t from 1 (1.2)"),
        TORCH_ADAM.preset("torch.Adam(wd)", dict(lr=1e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=1e-2),
                          "Adam's weight_decay is L2 (added to g before the moments) (1.2)"),
        TORCH_ADAMW.preset("torch.AdamW", dict(lr=1e-2), "torch AdamW default weight_decay 1e-2, decoupled and "
                           "lr-coupled: x <- x(1 - lr*wd) first (1.2; refopt AdamW's default is torch's)"),
        TORCH_ADAMW.preset("torch.AdamW(wd=0.1)", dict(lr=3e-2, betas=(0.9, 0.95), weight_decay=0.1),
                           "decoupled decay uses the pre-update x (PITFALLS B05)"),
        TORCH_ADAM.preset("torch.Adam(amsgrad)", dict(lr=1e-2, amsgrad=True), "AMSGrad: max of the raw v, then its "
                          "bias correction: sqrt(v_max)/sqrt(1-b2^t) + eps (1.2)", family="amsgrad"),
        TORCH_ADAMW.preset("torch.AdamW(amsgrad,wd=0.1)", dict(lr=3e-2, betas=(0.9, 0.95), weight_decay=0.1,
                                                               amsgrad=True),
                           "AMSGrad with decoupled decay", family="amsgrad"),
        TORCH_NADAM.preset("torch.NAdam", dict(lr=1e-2), "Dozat's momentum schedule mu_t = b1 (1 - 0.96^(t psi)/2), "
                           "psi = 4e-3, products kept; denominator sqrt(v/bc2) + eps; mu_product in torch's default "
                           "dtype (float64 while the float64 run steps)"),
        TORCH_NADAM.preset("torch.NAdam(decoupled,wd=0.1)", dict(lr=1e-2, weight_decay=0.1, decoupled_weight_decay=True),
                           "decoupled_weight_decay=True: x(1 - lr wd) first, as AdamW"),
        OPTAX_ADAM.preset("optax.adam", dict(learning_rate=1e-2), "scale_by_adam: E1 eps, eps_root 0, t = count + 1 (2.3)"),
        OPTAX_ADAMW.preset("optax.adamw", dict(learning_rate=1e-2), "optax adamw default weight_decay 1e-4 (torch: "
                           "1e-2), lr-coupled: -lr*(u + wd*x) (2.3)"),
        OPTAX_ADAMW.preset("optax.adamw(wd=0.1)", dict(learning_rate=3e-2, b1=0.9, b2=0.95, weight_decay=0.1),
                           "add_decayed_weights before scale_by_learning_rate = torch AdamW (2.3)"),
        OPTAX_NADAM.preset("optax.nadam", dict(learning_rate=1e-2), "scale_by_adam(nesterov=True): mhat = "
                           "b1*m/(1-b1^(t+1)) + (1-b1)*g/(1-b1^t), no Dozat beta2 factor on vhat; E1 eps (2.3)"),
        OPTAX_NADAMW.preset("optax.nadamw(wd=0.1)", dict(learning_rate=3e-2, b1=0.8, b2=0.95, weight_decay=0.1),
                            "NAdam first moment + add_decayed_weights before scale_by_learning_rate = lr-coupled "
                            "decoupled decay (2.3)", family="nadam"),
        OPTAX_AMSGRAD.preset("optax.amsgrad", dict(learning_rate=1e-2), "scale_by_amsgrad: max of the bias-corrected "
                             "v/(1-b2^t), then sqrt(v_max) + eps (2.3)"),
    ),
    wrong=(
        Preset("WRONG eps placement: optax.adam(eps inside sqrt) vs refopt E1", "optax", "adam",
               ("adam", dict(learning_rate=1e-2, eps=0.0, eps_root=1e-16)), lambda: Adam(lr=1e-2, eps=1e-8),
               "E3 sqrt(vhat + eps_root) vs E1 sqrt(vhat) + eps: differs where |g| ~ eps (PITFALLS B02)",
               expect_fail=True, problems=("stream", "mlp", "gpt"),
               problems_why="the quadratic's gradients are O(1): the eps placement changes the step by ~1e-8 "
                            "relative, invisible in float32 (float64 catches it)"),
        Preset("WRONG wd kind: torch.AdamW vs refopt Adam (L2)", "torch", "adamw",
               ("AdamW", dict(lr=1e-2, weight_decay=0.1)), lambda: Adam(lr=1e-2, weight_decay=0.1),
               "decoupled decay vs L2 decay through the moments (PITFALLS B05)", expect_fail=True),
        Preset("WRONG wd kind: torch.AdamW vs refopt AdamW(independent)", "torch", "adamw",
               ("AdamW", dict(lr=1e-2, weight_decay=0.1)),
               lambda: AdamW(lr=1e-2, weight_decay=0.1, wd_mode="independent"),
               "lr-coupled decay x(1 - lr*wd) vs lr-free x(1 - wd) (PITFALLS B05)", expect_fail=True),
        Preset("WRONG default wd: optax.adamw vs refopt AdamW() (torch's 1e-2)", "optax", "adamw",
               ("adamw", dict(learning_rate=1e-2)), lambda: AdamW(lr=1e-2),
               "optax's default weight_decay is 1e-4, torch's 1e-2 (CONVENTIONS 10.5)", expect_fail=True),
    ),
    oracle=AdamOracle,
    variants=variants,
    counters=lambda rule: (("bc1", "the bias correction of m (1 - beta1^t)"),
                           ("bc2", "the bias correction of v (1 - beta2^t)"))
    + ((("nesterov", "the NAdam look-ahead's 1 - beta1^(t+1)", ("next", "prev", "frozen")),)
       if rule.nesterov and rule.momentum_decay is None else ()),
    facts=facts,
    golden=(
        GoldenCase("adam", lambda: Adam(lr=1e-2), "Adam, eps after sqrt(vhat) (E1), t from 1", _ADAM),
        GoldenCase("adam_l2", lambda: Adam(lr=1e-2, beta1=0.8, beta2=0.99, eps=1e-6, weight_decay=1e-2),
                   "Adam with L2 weight decay in g", _ADAM),
        GoldenCase("adamw", lambda: AdamW(lr=1e-2), "AdamW torch defaults: wd 1e-2 decoupled, lr-coupled", _ADAM),
        GoldenCase("adamw_wd1e-4", lambda: AdamW(lr=1e-2, weight_decay=1e-4), "AdamW with optax's default wd", _ADAM),
        GoldenCase("adamw_wd0.1_b0.95", lambda: AdamW(lr=3e-2, beta1=0.9, beta2=0.95, weight_decay=0.1),
                   "AdamW, decay on the pre-update x", _ADAM),
        GoldenCase("adamw_independent", lambda: AdamW(lr=1e-2, weight_decay=1e-3, wd_mode="independent"),
                   "AdamW with lr-free (independent) decay x(1 - gamma_t wd)", _ADAM),
        GoldenCase("adamw_warmup_cosine", lambda: AdamW(lr=1e-2, schedule=_warmup_cosine()),
                   "AdamW with a warmup-cosine schedule gamma_t (t from 1)", _ADAM),
    ),
    examples=(
        Example("adam", lambda: Adam(lr=0.05, weight_decay=1e-3)),
        Example("adamw_decoupled", lambda: AdamW(lr=0.05, weight_decay=0.01)),
        Example("adamw_independent", lambda: AdamW(lr=0.05, weight_decay=1e-3, wd_mode="independent")),
        Example("nadam_l2", lambda: Adam(lr=0.05, weight_decay=1e-3, nesterov=True)),
        Example("nadamw_decoupled", lambda: AdamW(lr=0.05, weight_decay=0.01, nesterov=True)),
        Example("amsgrad_torch", lambda: Adam(lr=0.05, weight_decay=1e-3, amsgrad=True)),
        Example("amsgradw_optax", lambda: AdamW(lr=0.05, weight_decay=0.01, amsgrad="bias_corrected")),
        Example("nadam_torch", lambda: Adam(lr=0.05, nesterov=True, momentum_decay=4e-3)),
        Example("nadamw_torch", lambda: AdamW(lr=0.05, weight_decay=0.01, nesterov=True, momentum_decay=4e-3)),
    ),
    atlas=(atlas_nadam, atlas_adam_eps, atlas_adamw_decay, atlas_amsgrad,),
)


def _warmup_cosine():
    from refopt.schedules import warmup_cosine
    return warmup_cosine(3, 20, 0.1)
