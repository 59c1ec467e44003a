"""SGD (refopt/rules/sgd.py) to torch.optim.SGD and optax.sgd: torch's first buffer b_1 = g_1 undampened,
L2 decay inside g (CONVENTIONS.md 1.1, 2.2)."""
from __future__ import annotations

from refopt.conventions._spec import (
    NO_MAXIMIZE, OPTAX_F32_WARMUP, Conventions, Example, Oracle, PeerMapping, gamma, scalar)
from refopt.golden import GoldenCase
from refopt.rules.sgd import SGD


class SGDOracle(Oracle):
    """SGD from its equations (refopt.SGD's docstring). Switches (the diagnosis variants): ``nesterov``
    'none' | 'standard' (u = g + mu b_t) | 'previous' (u = g + mu b_{t-1}); ``decay`` 'l2' (in g) |
    'decoupled' (x (1 - lr wd) first) | 'after' ((x - lr u)(1 - lr wd)) | 'none'; ``dampen_first``: b_1 =
    (1 - tau) g_1; and any of momentum, dampening, weight_decay, lr overriding the rule's."""

    def __init__(self, rule, name=None, **switches):
        super().__init__(rule, name, **switches)
        sw = lambda k, d: switches.get(k, d)   # noqa: E731
        self.lr, self.mu = sw("lr", rule.lr), sw("momentum", rule.momentum)
        self.tau, self.wd = sw("dampening", rule.dampening), sw("weight_decay", rule.weight_decay)
        self.nesterov = sw("nesterov", "standard" if rule.nesterov else "none")
        self.decay = sw("decay", "l2" if self.wd > 0 else "none")
        self.dampen_first, self.schedule = sw("dampen_first", False), sw("schedule", rule.schedule)

    def init_leaf(self, x, path):
        return {"b": x * 0}

    def direction_leaf(self, t, s, x, g, path):
        d = x.dtype
        if self.decay == "l2":
            g = g + scalar(self.wd, d) * x
        if self.mu == 0:
            return g
        prev = s["b"]
        if t == 1 and not self.dampen_first:
            s["b"] = g.copy()
        else:
            s["b"] = scalar(self.mu, d) * prev + scalar(1.0 - self.tau, d) * g
        b = s["b"]
        if self.nesterov == "standard":
            return g + scalar(self.mu, d) * b
        if self.nesterov == "previous":
            return g + scalar(self.mu, d) * prev
        return b.copy()

    def step_leaf(self, t, s, x, g, path):
        d = x.dtype
        lr = self.lr * gamma(self.schedule, t)
        u = self.direction_leaf(t, s, x, g, path)
        if self.decay == "decoupled":
            x = x * scalar(1.0 - lr * self.wd, d)
        x = x - scalar(lr, d) * u
        if self.decay == "after":
            x = x * scalar(1.0 - lr * self.wd, d)
        return x


def ConventionSGD(lr, momentum=0.0, dampening=0.0, nesterov="none", weight_decay=0.0, decay="none",
                  dampen_first=False, schedule=None, name="sgd variant"):
    """SGD with switched conventions (:class:`SGDOracle`): the restated sides of the divergence atlas."""
    rule = SGD(lr=lr, schedule=schedule)
    return SGDOracle(rule, name=name, momentum=momentum, dampening=dampening, nesterov=nesterov,
                     weight_decay=weight_decay, decay=decay, dampen_first=dampen_first)


def variants(rule):
    from refopt.conventions._variants import oracle_variant as v

    out = []
    if rule.momentum > 0:
        if rule.dampening > 0:
            out.append(v(rule, "momentum dampening on step 1", "b_1 = (1 - tau) g_1; torch leaves the first buffer "
                         "undampened (b_1 = g_1)", dampen_first=True))
        out.append(v(rule, "EMA momentum", "b = mu b + (1 - mu) g (dampening = momentum), first buffer dampened",
                     dampening=rule.momentum, dampen_first=True, nesterov="none"))
        out.append(v(rule, "EMA momentum, first buffer undampened", "b_1 = g_1, then b = mu b + (1 - mu) g",
                     dampening=rule.momentum, nesterov="none"))
        if rule.nesterov:      # (u = g + mu b_{t-1} is exactly u = b_t without dampening: no separate variant)
            out.append(v(rule, "no Nesterov", "u = b", nesterov="none"))
        else:
            out.append(v(rule, "Nesterov", "u = g + mu b_t", nesterov="standard"))
        out.append(v(rule, "no momentum", "u = g", momentum=0.0, nesterov="none"))
    else:
        out.append(v(rule, "momentum 0.9", "heavy-ball momentum 0.9 (b = 0.9 b + g), not given", momentum=0.9))
    if rule.weight_decay > 0:
        out.append(v(rule, "decoupled decay", "x (1 - lr wd) - lr u in place of L2 in g", decay="decoupled"))
        out.append(v(rule, "decay applied after the update", "(x - lr u)(1 - lr wd)", decay="after"))
        out.append(v(rule, "no weight decay", "the decay is missing", decay="none"))
    return out


def facts(rule, of):
    """The step is linear in g (not scale invariant); linear maps commute with orthogonal and permutation
    transforms; u(c g) = c u(g) without L2 (homogeneous, eq. elr-g), u = g without momentum either."""
    free = rule.weight_decay == 0
    return {"homogeneous": free, "plain_direction": free and rule.momentum == 0, "orthogonal": True,
            "elementwise": True, "exact_scale_free": free}


def _torch_sgd(lr, momentum, dampening, weight_decay, nesterov):
    return SGD(lr=lr, momentum=momentum, dampening=dampening, weight_decay=weight_decay, nesterov=nesterov)


def _torch_match(rule):
    if rule.schedule is not None:
        return None
    return dict(lr=rule.lr, momentum=rule.momentum, dampening=rule.dampening, weight_decay=rule.weight_decay,
                nesterov=rule.nesterov)


def _optax_match(rule):
    if rule.schedule is not None or rule.dampening != 0 or rule.weight_decay != 0:
        return None
    return dict(learning_rate=rule.lr, momentum=rule.momentum or None, nesterov=rule.nesterov)


TORCH = PeerMapping(
    "torch.optim.SGD", "torch", "SGD", dict(lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False,
                                            maximize=False),
    _torch_sgd, "sgd", refuse={"maximize": NO_MAXIMIZE}, ignore=("foreach", "differentiable", "fused"),
    state=lambda a: {"b": "momentum_buffer"} if a["momentum"] else {}, match=_torch_match)
OPTAX = PeerMapping(
    "optax.sgd", "optax", "sgd", dict(momentum=None, nesterov=False),
    lambda learning_rate, momentum, nesterov: SGD(lr=learning_rate, momentum=momentum or 0.0, nesterov=nesterov),
    "sgd", required=("learning_rate",), ignore=("accumulator_dtype",),
    state=lambda a: {"b": "trace"} if a["momentum"] else {}, match=_optax_match)

_SGD = ("b",)

# ---- the divergence-atlas entries about the rule (refopt/crosscheck/divergences.py runs them) ----------
def atlas_schedule_values() -> list:
    """optax's schedules given their own int32 count (as inside an optimizer) vs the same formula in float64."""
    import math
    import numpy as np
    from refopt.crosscheck import peers
    from refopt.crosscheck.atlas import Figure

    optax = peers.require("optax", "optax")
    import jax.numpy as jnp
    from refopt.testing.adapters import x64_scope

    lr, W, T, end = 0.1, 5, 50, 0.01
    counts = np.arange(0, 60)

    def cosine64(c):
        if c < W:
            return lr * c / W
        d = T - W
        p = min(c - W, d) / d
        return end + (lr - end) * 0.5 * (1 + math.cos(math.pi * p))
    cases = [
        ("optax.warmup_cosine_decay_schedule(0, 0.1, 5, 50, 0.01)",
         lambda o: o.warmup_cosine_decay_schedule(0.0, lr, W, T, end), cosine64),
        ("optax.linear_schedule(0.1, 0.01, 50)", lambda o: o.linear_schedule(lr, end, T),
         lambda c: lr + (end - lr) * min(c, T) / T),
        ("optax.exponential_decay(0.1, 10, 0.5)", lambda o: o.exponential_decay(lr, 10, 0.5),
         lambda c: lr * 0.5 ** (c / 10)),
    ]
    out = []
    with x64_scope(True):
        for name, make, f64 in cases:
            s = make(optax)
            rel = 0.0
            dtype = None
            for c in counts:
                v = s(jnp.asarray(c, jnp.int32))
                dtype = str(v.dtype)
                ref = f64(int(c))
                if ref != 0:
                    rel = max(rel, abs(float(v) - ref) / abs(ref))
            what = f"{name} at int32 counts 0..59 (computes in {dtype}) vs float64"
            out.append(Figure("optax int32 count vs float64", "schedule rel", rel, 1e-9, "min", rel >= 1e-9, what))
            out.append(Figure("optax int32 count vs float64", "schedule rel", rel, 2e-6, "max", rel <= 2e-6,
                              "... within float32 rounding"))
    return out


def atlas_schedules():
    from refopt.crosscheck.atlas import Entry, Pair, _expr, _p, _rules, _torch_lambda_lr, peer_side

    R = _rules()
    from refopt import schedules as S
    lr, W, T, floor = 0.1, 5, 50, 0.1
    opt_sched = S.Join(((1, S.Constant(0.0)), (W, S.LinearWarmup(W)), (T - W, S.CosineDecay(T - W, floor))))
    ref_sched = S.warmup_cosine(W, T, floor)

    def optax_tx(optax, learning_rate):
        return optax.sgd(optax.warmup_cosine_decay_schedule(0.0, learning_rate, W, T, floor * learning_rate))
    o = _p("optax.sgd(warmup_cosine_decay_schedule)", "optax", optax_tx, dict(learning_rate=lr),
           lambda: R.SGD(lr=lr, schedule=opt_sched))
    tb = _p("torch.SGD+LambdaLR", "torch", "SGD", dict(lr=lr), lambda: R.SGD(lr=lr, schedule=ref_sched))
    naive = _p("torch.SGD+LambdaLR(s(e))", "torch", "SGD", dict(lr=lr), lambda: R.SGD(lr=lr, schedule=opt_sched))
    return Entry(
        "schedule-count", "Schedules: optax counts from 0 inside an optimizer and evaluates in float32; torch's "
        "LambdaLR needs e -> s(e+1) for refopt's 1-based schedule",
        (peer_side("optax", o, tol=OPTAX_F32_WARMUP, tol_name="OPTAX_F32_WARMUP", refopt=f"SGD(lr={lr}, schedule="
                   f"{_expr(opt_sched)})", impl=f"optax.sgd(optax.warmup_cosine_decay_schedule(0, {lr}, {W}, {T}, "
                   f"{floor * lr:g}))", source="update t uses s(count = t - 1): lr 0 on the first update"),
         peer_side("torch LambdaLR(e -> s(e+1))", tb, refopt=f"SGD(lr={lr}, schedule={_expr(ref_sched)})",
                   impl=f"torch.optim.SGD(lr={lr}) + LambdaLR(lambda e: warmup_cosine({W}, {T}, {floor})(e + 1))",
                   make_peer=_torch_lambda_lr(tb, lambda e: ref_sched(e + 1)),
                   source="refopt's 1-based schedules (PITFALLS B17): no step with lr 0"),
         peer_side("torch LambdaLR(e -> optax s(e))", naive, refopt=f"SGD(lr={lr}, schedule={_expr(opt_sched)})",
                   impl=f"torch.optim.SGD(lr={lr}) + LambdaLR(lambda e: <optax's schedule in float64>(e))",
                   make_peer=_torch_lambda_lr(naive, lambda e: opt_sched(e + 1)),
                   source="LambdaLR's epoch e = t - 1 at update t, as optax's count")),
        (Pair("optax", "torch LambdaLR(e -> s(e+1))", "final", 1e-3, what="the one-step offset of the count"),
         Pair("optax", "torch LambdaLR(e -> optax s(e))", "params", 1e-9, what="same offset: only optax's float32"),
         Pair("optax", "torch LambdaLR(e -> optax s(e))", "params", 1e-6, "max", what="... within float32 rounding")),
        "no paper: optax's count is the number of updates done (0 first), torch's LambdaLR epoch likewise; refopt "
        "counts the update being made from 1 so the first step is not wasted (PITFALLS B17).",
        "PITFALLS B17; CONVENTIONS.md 2.1; torchtitan PR #1261", extra=atlas_schedule_values, extra_peers=("optax",))


def atlas_sgd_dampening():
    from refopt.crosscheck.atlas import Entry, Pair, _p, _rules, peer_side

    R = _rules()
    tp = _p("torch.SGD(dampening=0.9)", "torch", "SGD", dict(lr=0.05, momentum=0.9, dampening=0.9),
            lambda: R.SGD(lr=0.05, momentum=0.9, dampening=0.9), state={"b": "momentum_buffer"})

    def ema_momentum(optax, learning_rate, decay):
        return optax.chain(optax.ema(decay, debias=False), optax.scale_by_learning_rate(learning_rate))
    op = _p("optax.chain(ema(0.9, debias=False), scale_by_learning_rate(0.05))", "optax", ema_momentum,
            dict(learning_rate=0.05, decay=0.9), None)
    return Entry(
        "sgd-dampening-first-step", "SGD with dampening: torch skips it on the first step (b_1 = g_1); an EMA of "
        "the gradients from zero dampens it (b_1 = (1 - tau) g_1)",
        (peer_side("torch", tp, source="torch.optim.SGD: b_1 = g_1, then b = mu b + (1 - tau) g"),
         peer_side("optax ema momentum", op, impl="optax.chain(optax.ema(0.9, debias=False), "
                   "optax.scale_by_learning_rate(0.05))",
                   refopt="variants.ConventionSGD(lr=0.05, momentum=0.9, dampening=0.9, dampen_first=True)",
                   make_refopt=lambda: ConventionSGD(0.05, momentum=0.9, dampening=0.9, dampen_first=True),
                   source="b_t = mu b_{t-1} + (1 - mu) g_t from b_0 = 0")),
        (Pair("torch", "optax ema momentum", "final", 1e-3, what="params after 50 steps"),),
        "no paper: torch inherits Lua-torch's first-step rule (the buffer starts as g_1); the EMA form is the "
        "exponential average as written (its first steps are shrunk by 1 - mu, a bias that debiasing removes).",
        "CONVENTIONS.md 1.1, 10.6")


def atlas_nesterov_extra():
    """Sutskever's Nesterov (gradient at the look-ahead x + mu v; params x) vs torch's (the look-ahead point
    itself, Bengio et al.'s reformulation) on the quadratic, closed loop; and the identity that maps one onto
    the other: torch's y_t = x_t + mu v_t."""
    import numpy as np
    from refopt.crosscheck import peers
    from refopt.crosscheck.atlas import Figure, SEED, STEPS
    from refopt.crosscheck.problems import make_problem

    torch = peers.require("torch", "torch")
    import refopt
    prob = make_problem("quadratic", np.float64, SEED)
    lr, mu = 0.05, 0.9
    # Sutskever, from the paper's equations (3)-(4): v = mu v - lr grad(x + mu v); x = x + v
    x = [a.copy() for a in prob.leaves]
    v = [np.zeros_like(a) for a in x]
    xs, vs = [], []
    for t in range(1, STEPS + 1):
        g = prob.grad([a + mu * b for a, b in zip(x, v)], t)
        v = [mu * b - lr * gi for b, gi in zip(v, g)]
        x = [a + b for a, b in zip(x, v)]
        xs.append(x)
        vs.append(v)
    # torch.optim.SGD(nesterov=True), closed loop on the same quadratic
    ps = [torch.nn.Parameter(torch.from_numpy(a.copy())) for a in prob.leaves]
    opt = torch.optim.SGD(ps, lr=lr, momentum=mu, nesterov=True, foreach=False)
    ys = []
    for t in range(1, STEPS + 1):
        for p, g in zip(ps, prob.grad([p.detach().numpy().copy() for p in ps], t)):
            p.grad = torch.from_numpy(g)
        opt.step()
        ys.append([p.detach().numpy().copy() for p in ps])
    # refopt SGD(nesterov=True) closed loop: its params are the look-ahead y; Sutskever's x = y - mu v with
    # v = -lr b (b refopt's buffer)
    rule = refopt.SGD(lr=lr, momentum=mu, nesterov=True)
    y = [a.copy() for a in prob.leaves]
    s = refopt.init(rule, y)
    ry, rx = [], []
    from refopt import tree as T
    for t in range(1, STEPS + 1):
        y, s = refopt.update(rule, s, y, prob.grad(y, t))
        bs = [leaf.b for leaf in T.flatten_up_to(T.structure(y), s.leaves)]
        ry.append([a.copy() for a in y])
        rx.append([a + mu * lr * b for a, b in zip(y, bs)])

    def rel(A, B):
        return max(float(np.max(np.abs(a - b)) / np.max(np.abs(b))) for SA, SB in zip(A, B) for a, b in zip(SA, SB))
    d = rel(xs, ys)
    e1, e2 = rel(ry, ys), rel(rx, xs)
    return [Figure("Sutskever x vs torch nesterov", "params", d, 1e-3, "min", d >= 1e-3,
                   "quadratic, closed loop: Sutskever's x vs torch's look-ahead params [Sutskever restated]"),
            Figure("refopt SGD(nesterov) vs torch nesterov", "params", e1, 1e-12, "max", e1 <= 1e-12,
                   "torch side: refopt SGD(lr=0.05, momentum=0.9, nesterov=True), closed loop"),
            Figure("refopt y + lr mu b vs Sutskever x", "params", e2, 1e-12, "max", e2 <= 1e-12,
                   "Sutskever side: x = refopt's params + lr mu b (b refopt's buffer)")]


def atlas_nesterov():
    from dataclasses import replace
    from refopt.crosscheck.atlas import Entry, Pair, _p, _rules, peer_side

    o = _p("optax.sgd(nesterov)", "optax", "sgd", dict(learning_rate=0.05, momentum=0.9, nesterov=True),
           None)
    R = _rules()
    t2 = _p("torch.SGD(nesterov)", "torch", "SGD", dict(lr=0.05, momentum=0.9, nesterov=True),
            lambda: R.SGD(lr=0.05, momentum=0.9, nesterov=True), state={"b": "momentum_buffer"})
    o = replace(o, make_rule=lambda: R.SGD(lr=0.05, momentum=0.9, nesterov=True))
    return Entry(
        "nesterov-forms", "Nesterov momentum: torch and optax (g + mu b, params = the look-ahead point) vs "
        "Sutskever et al. 2013 (gradient at x + mu v, params = x)",
        (peer_side("torch", t2, source="Bengio et al. 2013's reformulation: the params are the look-ahead point"),
         peer_side("optax", o, source="the same form (trace, nesterov=True)")),
        (Pair("torch", "optax", "params", 1e-12, "max", what="torch and optax agree"),),
        "Sutskever et al. (2013) keep x and take the gradient at x + mu v; torch/optax store the look-ahead point "
        "y = x + mu v (same method, shifted params: evaluate/checkpoint y - mu v to get Sutskever's x).",
        "Sutskever et al. 2013 eqs. (3)-(4); Bengio et al. 2013; CONVENTIONS.md 1.1, 2.2",
        extra=atlas_nesterov_extra, extra_peers=("torch",))


CONVENTIONS = Conventions(
    rules=(SGD,),
    final="the momentum buffer's use: the Nesterov look-ahead g + momentum b, dampening",
    per_step="",
    mappings=(TORCH, OPTAX),
    no_peer={"schedulefree": "schedulefree ships the Schedule-Free optimizers only (see ScheduleFreeSGD)"},
    presets=(
        TORCH.preset("torch.SGD", dict(lr=0.1), "plain SGD: x <- x - lr*g"),
        TORCH.preset("torch.SGD(momentum,dampening,wd)", dict(lr=0.05, momentum=0.9, dampening=0.3, weight_decay=1e-2),
                     "L2 decay added to g before the buffer; b_1 = g_1 undampened, then b = mu*b + (1-tau)*g (1.1)"),
        TORCH.preset("torch.SGD(nesterov,wd)", dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3),
                     "Nesterov: u = g + mu*b with the updated buffer (1.1)"),
        OPTAX.preset("optax.sgd", dict(learning_rate=0.1), "momentum=None: identity then -lr (2.2)"),
        OPTAX.preset("optax.sgd(momentum)", dict(learning_rate=0.05, momentum=0.9),
                     "trace b = g + mu*b from zeros, so b_1 = g_1 = torch's undampened first buffer (2.2, 1.1)"),
        OPTAX.preset("optax.sgd(nesterov)", dict(learning_rate=0.05, momentum=0.9, nesterov=True),
                     "nesterov output g + mu*b (2.2)"),
    ),
    oracle=SGDOracle,
    variants=variants,
    facts=facts,
    golden=(
        GoldenCase("sgd", lambda: SGD(lr=0.1), "plain SGD"),
        GoldenCase("sgd_momentum", lambda: SGD(lr=0.05, momentum=0.9), "heavy-ball b = mu b + g, b_1 = g_1", _SGD),
        GoldenCase("sgd_momentum_dampening_wd", lambda: SGD(lr=0.05, momentum=0.9, dampening=0.3, weight_decay=1e-2),
                   "torch SGD: L2 in g, first buffer undampened", _SGD),
        GoldenCase("sgd_nesterov_wd", lambda: SGD(lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3),
                   "torch SGD Nesterov u = g + mu b", _SGD),
    ),
    examples=(
        Example("sgd", lambda: SGD(lr=0.05)),
        Example("sgd_momentum_dampening", lambda: SGD(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=1e-3)),
        Example("sgd_nesterov", lambda: SGD(lr=0.05, momentum=0.9, nesterov=True)),
    ),
    atlas=(atlas_schedules, atlas_sgd_dampening, atlas_nesterov,),
)
