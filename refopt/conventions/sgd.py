"""SGD (refopt/rules/sgd.py) to torch.optim.SGD and optax.sgd: torch's first buffer b_1 = g_1 undampened,
L2 decay inside g (CONVENTIONS.md 1.1, 2.2)."""
from __future__ import annotations

from refopt.conventions._spec import Conventions, Example, Oracle, PeerMapping, gamma, scalar
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
        b = s["b"]
        prev = b.copy()
        if t == 1 and not self.dampen_first:
            b[...] = g
        else:
            b[...] = scalar(self.mu, d) * b + scalar(1.0 - self.tau, d) * g
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


def variants(rule):
    from refopt.crosscheck.variants import oracle_variant as v

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


_NOT = (lambda v: not v, "refopt minimises; feed -g to maximise")
TORCH = PeerMapping(
    "torch.optim.SGD", "torch", "SGD", dict(lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False,
                                            maximize=False),
    _torch_sgd, "sgd", refuse={"maximize": _NOT}, ignore=("foreach", "differentiable", "fused"),
    state=lambda a: {"b": "momentum_buffer"} if a["momentum"] else {}, match=_torch_match)
OPTAX = PeerMapping(
    "optax.sgd", "optax", "sgd", dict(momentum=None, nesterov=False),
    lambda learning_rate, momentum, nesterov: SGD(lr=learning_rate, momentum=momentum or 0.0, nesterov=nesterov),
    "sgd", required=("learning_rate",), ignore=("accumulator_dtype",),
    state=lambda a: {"b": "trace"} if a["momentum"] else {}, match=_optax_match)

_SGD = ("b",)
CONVENTIONS = Conventions(
    rules=(SGD,),
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
    atlas=("sgd-dampening-first-step", "nesterov-forms", "schedule-count"),
)
