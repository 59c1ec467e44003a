"""Average and EMA of the iterates (refopt/rules/averaging.py): optax.ema averages updates, refopt's EMA
iterates; optax.ema(decay, debias=True) fed the iterates of optax.sgd is refopt's EMA (CONVENTIONS.md 2.6,
PITFALLS B16; post 004, eq. (2))."""
from __future__ import annotations

import numpy as np

from refopt.conventions._spec import Conventions, Example, Oracle, PeerMapping, copy_state, counted, scalar
from refopt.golden import GoldenCase
from refopt.rules.adam import Adam, AdamW
from refopt.rules.averaging import EMA, Average
from refopt.rules.sgd import SGD


class AveragingOracle(Oracle):
    """The base rule's oracle steps x; beside it mu_t = (1 - c_t) mu_{t-1} + c_t x_t (post 004, eq. (2)) with
    c_t = 1/t (Average) or, for EMA with beta = decay: c_t = (1 - beta)/(1 - beta^t) (debias: the zero-init
    EMA divided by 1 - beta^t), 1 - beta from mu_0 = x_0 (debias=False), or mu_1 = x_1 then 1 - beta
    (start='after_first_step'). Switches: ``debias``, ``start``, ``counter`` {'weight': 'next' | 'prev' |
    'frozen'} (the step counter c_t reads; the base rule reads t)."""

    def __init__(self, rule, name=None, **sw):
        from refopt.conventions import oracle
        super().__init__(rule, name, **sw)
        self.base = sw.get("base") or oracle(rule.base)
        self.debias = sw.get("debias", getattr(rule, "debias", None))
        self.start = sw.get("start", getattr(rule, "start", None))
        self.counter = sw.get("counter", {})

    def init_leaf(self, x, path):
        s = {"mu": np.array(x, copy=True), "base": self.base.init_leaf(x, path)}
        if self._zero_init():
            s["e"] = np.zeros_like(x)
        return s

    def _zero_init(self) -> bool:
        """The debiased EMA with its counter switched, kept as its zero-init EMA e_t and mu_t = e_t/(1 - beta^t')
        (the recursion on mu holds only when the counter starts at 1)."""
        return isinstance(self.rule, EMA) and bool(self.debias) and "weight" in self.counter

    def step_leaf(self, t, s, x, g, path):
        base = copy_state(s["base"])
        x = self.base.step_leaf(t, base, x, g, path)
        s["base"] = base
        tc = counted(t, self.counter.get("weight"))
        if self._zero_init():
            b = scalar(self.rule.decay, x.dtype)
            s["e"] = b * s["e"] + (1 - b) * x
            s["mu"] = s["e"] / (1 - b ** tc)
            return x
        if isinstance(self.rule, Average):
            c = 1.0 / tc
        else:
            b = self.rule.decay
            if self.start == "after_first_step":
                c = 1.0 if tc == 1 else 1.0 - b
            elif not self.debias:
                c = 1.0 - b
            else:
                c = (1.0 - b) / (1.0 - b ** tc)
        s["mu"] = scalar(1.0 - c, x.dtype) * s["mu"] + scalar(c, x.dtype) * x
        return x


def variants(rule):
    from refopt.conventions._variants import base_variants, oracle_variant as v

    out = []
    if isinstance(rule, EMA):
        out.append(v(rule, "EMA debias flipped", "debiased (zero start) vs started at x0", debias=not rule.debias,
                     start="x0" if rule.debias else rule.start))
        for start in ("x0", "after_first_step"):
            if start != rule.start:
                out.append(v(rule, f"EMA start='{start}'", "where the average starts", start=start, debias=False))
    return out + base_variants(rule)


def facts(rule, of):
    """An average of the base's iterates inherits the base's invariances; the uniform average is post 004's
    eq. (2) with c_t = 1/t."""
    b = of(rule.base)
    out = {k: b[k] for k in ("grad_scale", "step_scale_free", "orthogonal", "elementwise")}
    if isinstance(rule, Average):
        out["averaging"] = True
    return out


OPTAX_EMA = PeerMapping("optax.ema", "optax", "ema", dict(debias=True, momentum=None),
                        lambda decay, debias, learning_rate, momentum: EMA(
                            SGD(lr=learning_rate, momentum=momentum or 0.0), decay=decay, debias=True),
                        "ema", required=("decay", "learning_rate"),
                        refuse={"debias": (lambda v: v is True, "optax.ema(debias=False) is a zero-init EMA that "
                                           "refopt's EMA does not keep (its debias=False starts at x_0)")},
                        state={"mu": "ema"})


# ---- the divergence-atlas entries about the rule (refopt/crosscheck/divergences.py runs them) ----------
def atlas_ema():
    from dataclasses import replace
    from refopt.crosscheck.atlas import Entry, Pair, _p, _preset, _rules, _torch_averaged, peer_side, restated_side

    R = _rules()
    base = dict(lr=0.05, momentum=0.9)
    tp = _p("torch.SGD", "torch", "SGD", base, None)
    after = lambda: R.EMA(R.SGD(**base), decay=0.9, debias=False, start="after_first_step")
    return Entry(
        "ema-start", "Where an EMA of the weights starts: torch AveragedModel (the weights after step 1), "
        "optax.ema (debiased from zero), x_0 (param-init)",
        (peer_side("torch AveragedModel", replace(tp, make_rule=after), observe="mu",
                   impl="torch.optim.swa_utils.AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(0.9)) beside "
                        "torch.optim.SGD(lr=0.05, momentum=0.9)",
                   make_peer=_torch_averaged(tp, 0.9),
                   source="first average = a copy of the weights after step 1"),
         peer_side("optax.ema", _preset("optax.ema"), observe="mu", source="zero-init EMA divided by 1 - beta^t"),
         restated_side("x0 start", "an EMA started from the initial weights (timm ModelEmaV2)",
                       lambda: R.EMA(R.SGD(**base), decay=0.9, debias=False, start="x0"), observe="mu",
                       source="timm ModelEmaV2 (not installed here)")),
        (Pair("torch AveragedModel", "optax.ema", "params", 0.01, what="max over steps"),
         Pair("x0 start", "optax.ema", "params", 0.01, what="max over steps"),
         Pair("x0 start", "torch AveragedModel", "params", 0.01, what="max over steps")),
        "no paper fixes the start; the debiased form (Kingma & Ba's bias correction applied to iterates) weights "
        "x_1..x_t by beta^(t-k) exactly; the other two put extra weight on x_1 or x_0 (PITFALLS B16).",
        "PITFALLS B16; post 004 eq. (2); CONVENTIONS.md 2.6")


CONVENTIONS = Conventions(
    rules=(Average, EMA),
    final="mu = (1 - c_t) mu + c_t x_t of the iterate after the step (its weights c_t, the debias, where it "
          "starts) or the base's step",
    per_step="the averaging weight c_t",
    counters=lambda rule: (() if isinstance(rule, EMA) and not rule.debias else (
        ("weight", "the averaging weight " + ("1/t" if isinstance(rule, Average) else "(1 - decay)/(1 - decay^t)")),)),
    mappings=(OPTAX_EMA,),
    no_peer={"torch": "torch.optim.swa_utils.AveragedModel is not an optimizer; the divergence atlas runs it beside "
                      "torch.optim.SGD (entry ema-start)",
             "schedulefree": "schedulefree keeps its average inside its optimizers (see ScheduleFreeSGD)"},
    presets=(OPTAX_EMA.preset("optax.ema", dict(learning_rate=0.05, momentum=0.9, decay=0.9),
                              "optax.ema averages *updates*; refopt.EMA averages iterates. Comparable: "
                              "optax.ema(decay, debias=True) fed the iterates x_t of optax.sgd equals refopt EMA's "
                              "mu (2.6, PITFALLS B16)"),),
    oracle=AveragingOracle,
    variants=variants,
    facts=facts,
    golden=(
        GoldenCase("ema_sgd_momentum", lambda: EMA(SGD(lr=0.05, momentum=0.9), decay=0.9),
                   "debiased EMA of the iterates (optax.ema fed the iterates)", ("mu", "base.b")),
        GoldenCase("average_adam", lambda: Average(Adam(lr=1e-2)), "uniform average of the iterates (1/t)",
                   ("mu", "base.m", "base.v")),
    ),
    examples=(
        Example("average_sgd", lambda: Average(SGD(lr=0.1, momentum=0.9))),
        Example("ema_adam", lambda: EMA(Adam(lr=0.05), decay=0.9)),
        Example("ema_sgd_param_init", lambda: EMA(SGD(lr=0.1), decay=0.95, debias=False)),
        Example("ema_torch_after_first_step", lambda: EMA(SGD(lr=0.1, momentum=0.9), decay=0.9, debias=False,
                                                          start="after_first_step")),
    ),
    atlas=(atlas_ema,),
)
del AdamW
