r"""The divergence atlas: where the major implementations of an optimizer disagree, measured live
(issue 15; docs/divergences.md).

Each :class:`Entry` is one known disagreement between implementations (torch.optim, optax,
facebookresearch/schedulefree, and a few codes that are not installable here, restated by refopt and
marked as such). :func:`run_entry` runs every side on one gradient stream (the seeded ``stream``
problem of :mod:`refopt.crosscheck.problems`, float64, 50 steps, open loop: every side gets the same
gradients) and reports

* the **differences** between the sides (:class:`Figure`): each is measured in that run and checked
  against a bound that says the divergence still exists (``kind='min'``: at least this large) or that
  two sides still agree (``kind='max'``);
* for each **side** (:class:`Side`), the refopt configuration that reproduces it and the measured
  reproduction error, gated at the tolerance of the existing presets (:mod:`refopt.crosscheck.presets`:
  ``EXACT`` 1e-12 in float64 where the side computes in float64, ``OPTAX_F32_WARMUP`` 1e-6 where optax
  computes a schedule in float32, ``MUON_TORCH_BF16`` where torch runs Newton-Schulz in bfloat16). A
  side without an installable peer is *restated*: refopt's configuration stands in for it (checked,
  where one exists, against an independent restatement written from the other code's equations).

Figures (:func:`refopt.crosscheck.run.figures`, maximum over the arrays):

* ``final``: max |a - b| / max |b| over each array after the last step (b the second side);
* ``params``: the same, maximum over all steps;
* ``update``: max over steps of ||Delta_a - Delta_b||_F / ||Delta_b||_F, Delta = x_t - x_{t-1};
* ``step``: the median over steps of ||Delta_a - Delta_b||_F / ||Delta_b||_F over the whole tree (all arrays
  together): the steady per-step relative difference of the update;
* ``abs``: max |a - b| over all steps and arrays (where the reference side is exactly zero).

An entry's status is ``reproduced`` (every side reproduced and every figure within its bound),
``changed`` (a figure or a side is out of bounds: a peer changed, update the atlas) or ``skipped`` (a
peer is missing; the reason names the install command). Nothing is hard-coded: every printed figure
comes from the run.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from importlib import metadata
from typing import Any, Callable

import numpy as np

from refopt.crosscheck import peers
from refopt.crosscheck.presets import EXACT, MUON_TORCH_BF16, OPTAX_F32_WARMUP, PEERS, PRESETS, Preset
from refopt.crosscheck.problems import make_problem
from refopt.crosscheck.run import Trajectory, figures, trajectory

STEPS = 50
SEED = 0
#: the distributions whose versions are recorded (the ``peers`` extra pins them)
VERSIONED = ("torch", "jax", "jaxlib", "optax", "schedulefree")


def versions() -> dict:
    """{distribution: installed version or None} for the peers (and their jax/jaxlib)."""
    out = {}
    for name in VERSIONED:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


# ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Side:
    """One implementation in an entry.

    label: short name used in the figures; impl: what runs (the peer call, or the code restated);
    peer: the library ('torch' | 'optax' | 'schedulefree'), None when refopt's restatement stands in;
    refopt: the refopt configuration (an expression) and ``make_refopt`` () -> a refopt rule or an
    :class:`~refopt.testing.adapters.Adapter`; preset: the peer call (a :class:`Preset`, run by its adapter,
    :func:`refopt.crosscheck.peers.preset_adapter`) unless ``make_peer`` () -> an Adapter is given;
    observe: 'params' or the refopt state field (e.g. 'mu', EMA's average) whose trajectory is compared (the
    peer's entry named by ``preset.state``, else of the same name);
    tol / tol_name: the reproduction tolerance (:class:`~refopt.crosscheck.presets.Tol` figures);
    oracle: for a restated side, () -> an Adapter written independently from the restated code's
    equations, compared with ``make_refopt`` at ``tol``; source: whose code or paper this side follows.
    """

    label: str
    impl: str
    refopt: str
    make_refopt: Callable[[], Any]
    peer: str | None = None
    preset: Preset | None = None
    make_peer: Callable | None = None
    observe: str = "params"
    tol: dict = field(default_factory=lambda: dict(EXACT.float64))
    tol_name: str = "EXACT"
    oracle: Callable[[], Any] | None = None
    source: str = ""

    @property
    def restated(self) -> bool:
        return self.peer is None


@dataclass(frozen=True)
class Pair:
    """A measured difference between two sides: ``figure`` in ('final', 'params', 'update', 'abs',
    'state'); kind 'min' (the divergence: value >= bound) or 'max' (agreement: value <= bound)."""

    a: str
    b: str
    figure: str
    bound: float
    kind: str = "min"
    what: str = ""


@dataclass
class Figure:
    between: str
    figure: str
    value: float
    bound: float
    kind: str
    ok: bool
    what: str = ""


@dataclass(frozen=True)
class Entry:
    """One divergence: name (the CLI's id), title, sides, pairs (the figures), ``follows`` (one line:
    which side follows the paper or the original author's code), reference, problem options, and
    ``extra`` (ctx -> list of Figure) for measurements that are not trajectories (e.g. a schedule's
    values)."""

    name: str
    title: str
    sides: tuple
    pairs: tuple
    follows: str
    reference: str
    problem: str = "stream"
    matrix_only: bool = False
    leaves: Callable | None = None            # () -> (paths, leaves0, grads) replacing the problem
    extra: Callable | None = None             # () -> list[Figure]
    extra_peers: tuple = ()

    @property
    def peers(self) -> tuple:
        return tuple(sorted({s.peer for s in self.sides if s.peer} | set(self.extra_peers)))


@dataclass
class SideResult:
    label: str
    impl: str
    peer: str | None
    restated: bool
    refopt: str
    tolerance: dict
    tolerance_name: str
    measured: dict
    ok: bool
    source: str = ""
    checked_against: str = ""


@dataclass
class EntryResult:
    name: str
    title: str
    status: str                     # reproduced | changed | skipped
    peers: dict                     # {peer: version}
    reason: str = ""
    differences: list = field(default_factory=list)
    sides: list = field(default_factory=list)
    follows: str = ""
    reference: str = ""
    problem: str = ""

    def to_dict(self) -> dict:
        """A JSON-safe dict (a non-finite figure, e.g. a relative difference to an all-zero array, becomes
        the string 'inf' or 'nan')."""
        from dataclasses import asdict

        def safe(o):
            if isinstance(o, float) and not math.isfinite(o):
                return str(o)
            if isinstance(o, dict):
                return {k: safe(v) for k, v in o.items()}
            if isinstance(o, (list, tuple)):
                return [safe(v) for v in o]
            return o
        return safe(asdict(self))


# ---------------------------------------------------------------------------------------------------
def _run(obj, leaves0, grads, observe: str = "params", key: str | None = None) -> Trajectory:
    """The trajectory of ``obj`` (a refopt rule or an Adapter) on ``grads``: its params, or (``observe``) its
    state entry ``key`` (default: ``observe``) as the params."""
    from refopt.core import Rule
    from refopt.testing.adapters import RuleAdapter

    adapter = RuleAdapter(obj) if isinstance(obj, Rule) else obj
    if observe == "params":
        return trajectory(adapter, leaves0, grads)[0]
    traj, _ = trajectory(adapter, leaves0, grads, state={observe: key or observe})
    return Trajectory(params=[s[observe] for s in traj.state])


def _run_peer(side: Side, leaves0, grads) -> Trajectory:
    adapter = side.make_peer() if side.make_peer is not None else peers.preset_adapter(side.preset)
    return _run(adapter, leaves0, grads, side.observe, side.preset.state.get(side.observe))


def _figures(a: Trajectory, b: Trajectory, leaves0, paths) -> dict:
    """The module docstring's figures of ``a`` against ``b`` (``paths``: the arrays' names)."""
    f = figures(b, a, leaves0)
    return {"final": f.final, "params": f.max("params_rel"), "update": f.max("update_rel"), "step": f.step,
            "abs": f.max("params_abs")}


def _gate(figs: dict, tol: dict) -> bool:
    return all(figs.get(k, 0.0) <= v for k, v in tol.items() if k in ("params", "update", "final", "abs"))


def _problem(entry: Entry):
    if entry.leaves is not None:
        return entry.leaves()
    prob = make_problem(entry.problem, np.float64, SEED, matrix_only=entry.matrix_only)
    x = [a.copy() for a in prob.leaves]
    grads = [prob.grad(x, t) for t in range(1, STEPS + 1)]      # the stream ignores x: one stream for all
    return prob.paths, prob.leaves, grads


def run_entry(entry: Entry) -> EntryResult:
    """Run every side of ``entry`` on its gradient stream; measure its pairs and the reproductions."""
    vers = versions()
    res = EntryResult(entry.name, entry.title, "reproduced", {p: vers.get(p) for p in entry.peers},
                      follows=entry.follows, reference=entry.reference,
                      problem=f"{entry.problem if entry.leaves is None else 'own'} float64, {STEPS} steps, "
                              f"seed {SEED}")
    missing = []
    for p in entry.peers:
        ok, why = peers.available(p)
        if not ok:
            missing.append(why)
    if missing:
        res.status, res.reason = "skipped", "; ".join(missing)
        return res
    paths, leaves0, grads = _problem(entry)
    trajs, ok_all = {}, True
    for side in entry.sides:
        ref = _run(side.make_refopt(), leaves0, grads, side.observe)
        if side.restated:
            other = _run(side.oracle(), leaves0, grads) if side.oracle else None
            checked = "an independent restatement of its equations" if side.oracle else ""
        else:
            other = _run_peer(side, leaves0, grads)
            checked = f"{side.peer} {vers.get(side.peer)}"
        if other is not None:
            figs = _figures(other, ref, leaves0, paths)
            ok = _gate(figs, side.tol)
        else:
            figs, ok = {}, True
        ok_all &= ok
        trajs[side.label] = other if (other is not None and not side.restated) else ref
        res.sides.append(SideResult(side.label, side.impl, side.peer, side.restated, side.refopt, dict(side.tol),
                                    side.tol_name, figs, ok, side.source, checked))
    for pair in entry.pairs:
        figs = _figures(trajs[pair.a], trajs[pair.b], leaves0, paths)
        v = figs[pair.figure]
        ok = v >= pair.bound if pair.kind == "min" else v <= pair.bound
        ok_all &= ok
        res.differences.append(Figure(f"{pair.a} vs {pair.b}", pair.figure, v, pair.bound, pair.kind, ok, pair.what))
    if entry.extra is not None:
        for f in entry.extra():
            ok_all &= f.ok
            res.differences.append(f)
    res.status = "reproduced" if ok_all else "changed"
    return res


# ---------------------------------------------------------------------------------------------------
# helpers building sides
def _preset(name: str) -> Preset:
    for p in PRESETS:
        if p.name == name:
            return p
    raise KeyError(name)


def _expr(rule) -> str:
    from refopt.crosscheck.expr import ExprError, to_expr
    try:
        return to_expr(rule)
    except ExprError:
        return repr(rule)


def peer_side(label: str, preset: Preset, observe="params", tol=EXACT, tol_name="EXACT", source="",
              refopt: str | None = None, make_refopt=None, impl: str | None = None, make_peer=None) -> Side:
    """A side run by a peer (the preset's call) and reproduced by the preset's refopt rule."""
    make = make_refopt or preset.make_rule
    return Side(label, impl or preset.describe_peer(), refopt or _expr(make()), make, peer=preset.peer,
                preset=preset, make_peer=make_peer, observe=observe, tol=dict(tol.float64), tol_name=tol_name,
                source=source)


def restated_side(label: str, impl: str, make_refopt, refopt: str | None = None, observe="params", oracle=None,
                  source="") -> Side:
    """A side whose code is not an installable peer: refopt's configuration stands in for it."""
    return Side(label, impl + " [restated by refopt]", refopt or _expr(make_refopt()), make_refopt, peer=None,
                observe=observe, oracle=oracle, source=source)


def _p(name, peer, ctor, kw, make_rule, **extra) -> Preset:
    return Preset(name, peer, "atlas", (ctor, kw), make_rule, "divergence atlas", **extra)


# ---------------------------------------------------------------------------------------------------
# custom peer adapters (the parts a preset's call does not step: a scheduler, clipping, an averaged model): the
# preset's torch optimizer replaced by a subclass, run by the same TorchAdapter
def _torch_subclass(preset: Preset, subclass):
    """() -> the preset's adapter with torch.optim.<ctor> replaced by ``subclass(torch, base class)``."""
    def make():
        torch = peers.require("torch", "torch")
        return peers.preset_adapter(preset, factory=subclass(torch, getattr(torch.optim, preset.peer_call[0])))
    return make


def _torch_lambda_lr(preset: Preset, lam):
    """torch.optim.<ctor> stepped with ``LambdaLR(opt, lam)`` (scheduler.step() after every opt.step())."""
    def subclass(torch, base):
        class WithLambdaLR(base):
            def __init__(self, params, **kwargs):
                super().__init__(params, **kwargs)
                self.scheduler = torch.optim.lr_scheduler.LambdaLR(self, lam)

            def step(self, closure=None):
                loss = super().step(closure)
                self.scheduler.step()
                return loss
        return WithLambdaLR
    return _torch_subclass(preset, subclass)


def _torch_clipped(preset: Preset, max_norm: float):
    """``torch.nn.utils.clip_grad_norm_(params, max_norm)`` before every step of the preset's optimizer."""
    def subclass(torch, base):
        class Clipped(base):
            def step(self, closure=None):
                torch.nn.utils.clip_grad_norm_([p for g in self.param_groups for p in g["params"]], max_norm)
                return super().step(closure)
        return Clipped
    return _torch_subclass(preset, subclass)


def _torch_averaged(preset: Preset, decay: float):
    """torch.optim.swa_utils.AveragedModel(multi_avg_fn=get_ema_multi_avg_fn(decay)) of the params, updated
    after every step of the preset's optimizer; the averaged weights are the state entry 'mu'."""
    def subclass(torch, base):
        from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

        class Averaged(base):
            def __init__(self, params, **kwargs):
                super().__init__(params, **kwargs)
                self.model = torch.nn.ParameterList([p for g in self.param_groups for p in g["params"]])
                self.averaged = AveragedModel(self.model, multi_avg_fn=get_ema_multi_avg_fn(decay))

            def step(self, closure=None):
                loss = super().step(closure)
                self.averaged.update_parameters(self.model)
                for p, mu in zip(self.model, self.averaged.module):
                    self.state[p]["mu"] = mu.detach().clone()
                return loss
        return Averaged
    return _torch_subclass(preset, subclass)


# ---------------------------------------------------------------------------------------------------
# the entries
def _variants():
    from refopt.crosscheck import variants
    return variants


def _rules():
    import refopt
    return refopt


def _nadam() -> Entry:
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


def _sf_warmup() -> Entry:
    R = _rules()
    o = _preset("optax.contrib.schedule_free_sgd(warmup)")
    o64 = _p("optax.contrib.schedule_free_sgd(warmup64)", "optax", "contrib.schedule_free_sgd",
             dict(learning_rate=0.5, warmup_steps=5, float64_warmup=True),
             lambda: R.ScheduleFreeSGD(lr=0.5, warmup_steps=5, warmup_lag=True), state={"z": "z"})
    fb = _p("schedulefree.SGDScheduleFreeReference(warmup)", "schedulefree", "SGDScheduleFreeReference",
            dict(lr=0.5, momentum=0.9, warmup_steps=5), lambda: R.ScheduleFreeSGD(lr=0.5, beta=0.9, warmup_steps=5),
            state={"z": "z", "x": "x"})
    return Entry(
        "schedule-free-warmup", "Schedule-Free warmup: optax.contrib (one step of lag, float32 warmup) vs the "
        "facebookresearch reference",
        (peer_side("optax", o, tol=OPTAX_F32_WARMUP, tol_name="OPTAX_F32_WARMUP",
                   source="optax 0.2.8: inner lr counts from 0, weights from 1 (optax#1744)"),
         peer_side("optax float64 warmup", o64, source="the same call with the warmup evaluated in float64"),
         peer_side("schedulefree", fb, source="Defazio et al. 2024, the authors' reference code")),
        (Pair("optax", "schedulefree", "final", 0.05, what="the one-step lag of the z-step warmup"),
         Pair("optax", "optax float64 warmup", "params", 1e-9, what="optax's float32 warmup (lower bound: still "
              "float32)"),
         Pair("optax", "optax float64 warmup", "params", 1e-6, "max", what="... and only float32 rounding")),
        "the schedulefree reference (the authors' code, Defazio et al. 2024) uses lr (k+1)/W for the z step and the "
        "weights alike; optax's z step lags one step (a bug report: optax#1744).",
        "Defazio et al. 2024, 'The Road Less Scheduled'; optax#1744; CONVENTIONS.md 2.5, 5.1, 10.8")


def _schedule_values() -> list:
    """optax's schedules given their own int32 count (as inside an optimizer) vs the same formula in float64."""
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


def _schedules() -> Entry:
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
        "PITFALLS B17; CONVENTIONS.md 2.1; torchtitan PR #1261", extra=_schedule_values, extra_peers=("optax",))


def _muon_4d() -> Entry:
    R = _rules()
    # refopt's (kh, kw, fan_in, fan_out); torch (out, in, kh, kw): (6, 2, 5, 3) and PITFALLS B07's (64, 1, 3, 3)
    shapes = [(5, 3, 2, 6), (3, 3, 1, 64)]
    kj = [math.sqrt(max(1.0, kh / kw)) for kh, kw, _, _ in shapes]   # KellerJordan: of (out, in, kh, kw)[-2:]
    flat = [math.sqrt(max(1.0, fo / (kh * kw * fi))) for kh, kw, fi, fo in shapes]
    lr = 0.02

    def leaves():
        rng = np.random.default_rng(SEED)
        x0 = [rng.standard_normal(s) for s in shapes]
        grng = np.random.default_rng(SEED + 1)
        return ["conv_a", "conv_b"], x0, [[grng.standard_normal(s) for s in shapes] for _ in range(STEPS)]

    def oracle():
        """KellerJordan's scale applied by hand: Muon without a shape scale at lr * kj, per filter."""
        from refopt.testing.adapters import RuleAdapter
        return RuleAdapter(R.Partition(rules={f"f{i}": R.Muon(lr=lr * k, scale="none", msign="svd")
                                              for i, k in enumerate(kj)}, labels=["f0", "f1"]))
    torch_shapes = [(fo, fi, kh, kw) for kh, kw, fi, fo in shapes]
    return Entry(
        "muon-conv-scale", "Muon on 4-D conv filters: KellerJordan's scale of the 4-D shape vs the scale of the "
        "flattened matrix",
        (restated_side("KellerJordan", f"KellerJordan/Muon on torch (out, in, kh, kw) filters {torch_shapes}: scale "
                       f"max(1, kh/kw)**0.5 = {', '.join(f'{k:.4f}' for k in kj)}",
                       lambda: R.Muon(lr=lr, scale="jordan_4d", msign="svd"), oracle=oracle,
                       source="KellerJordan/Muon muon_update (the original author's code)"),
         restated_side("flattened 'jordan'", "the same rule on the flattened (out, in kh kw) matrices: scale "
                       f"max(1, out/(in kh kw))**0.5 = {', '.join(f'{k:.4f}' for k in flat)} (torch.optim.Muon and "
                       "optax.contrib.muon take 2-D arrays only)",
                       lambda: R.Muon(lr=lr, scale="jordan", msign="svd"),
                       source="PITFALLS B07: the scale of the flattened 2-D shape")),
        (Pair("KellerJordan", "flattened 'jordan'", "update", 0.1, what="per-step update, worst filter"),),
        "the flattened shape: the scale is a property of the linear map (out x in kh kw) that Newton-Schulz "
        "orthogonalises (post 003); KellerJordan's code reads the 4-D tensor's last two dims, a quirk reported "
        "downstream as a bug (PITFALLS B07: updates up to 2.7x too small for a (64, 1, 3, 3) filter).",
        "CONVENTIONS.md 3.1; PITFALLS B07; post 003", leaves=leaves)


def _ema() -> Entry:
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


def _clip() -> Entry:
    R = _rules()
    tp = _p("torch.SGD", "torch", "SGD", dict(lr=0.1), lambda: R.ClipByGlobalNorm(R.SGD(lr=0.1), max_norm=1.0,
                                                                                    eps=1e-6))

    def chain(optax, max_norm, learning_rate):
        return optax.chain(optax.clip_by_global_norm(max_norm), optax.sgd(learning_rate))
    op = _p("optax.chain(clip_by_global_norm, sgd)", "optax", chain, dict(max_norm=1.0, learning_rate=0.1),
            lambda: R.ClipByGlobalNorm(R.SGD(lr=0.1), max_norm=1.0))
    return Entry(
        "clip-eps", "Clipping by the global norm: torch's clip_grad_norm_ adds 1e-6 to the norm, "
        "optax.clip_by_global_norm does not",
        (peer_side("torch", tp, impl="torch.nn.utils.clip_grad_norm_(params, 1.0) before torch.optim.SGD(lr=0.1)",
                   make_peer=_torch_clipped(tp, 1.0), source="factor max_norm / (N + 1e-6), clamped to 1"),
         peer_side("optax", op, impl="optax.chain(optax.clip_by_global_norm(1.0), optax.sgd(0.1))",
                   source="g kept when N < max_norm, else g max_norm / N")),
        (Pair("torch", "optax", "step", 1e-8, what="per-step update (median): about 1e-6/N"),),
        "no paper: torch's 1e-6 guards the division at N = 0; optax handles N = 0 with a select instead.",
        "CONVENTIONS.md 1, 2; torch.nn.utils.clip_grad_norm_")


def _muon_bf16() -> Entry:
    R = _rules()
    t = _preset("torch.Muon")
    t_state = replace(t, name="torch.Muon(state)")
    return Entry(
        "muon-bf16", "torch.optim.Muon runs Newton-Schulz in bfloat16; a float64 iteration differs by percents in "
        "the step while the momentum stays exact",
        (peer_side("torch", t, tol=MUON_TORCH_BF16, tol_name="MUON_TORCH_BF16",
                   source="torch.optim.Muon (as KellerJordan's code: Newton-Schulz in bfloat16)"),
         peer_side("torch momentum", t_state, observe="m", tol=EXACT, tol_name="EXACT",
                   source="the momentum buffer, in the param dtype"),
         restated_side("float64 Newton-Schulz", "the same Muon with Newton-Schulz in float64", t.make_rule),
         restated_side("float64 momentum", "its momentum buffer", t.make_rule, observe="m")),
        (Pair("torch", "float64 Newton-Schulz", "update", 1e-3, what="per-step update, max over steps and arrays"),
         Pair("torch", "float64 Newton-Schulz", "step", 1e-3, what="per-step update, median over steps"),
         Pair("torch momentum", "float64 momentum", "params", 1e-12, "max", what="the momentum buffers agree")),
        "KellerJordan's code and torch run the iteration in bfloat16 for speed; the iteration approximates msign "
        "(the polar factor) whatever the precision, so a float64 iteration is the same method, more accurate.",
        "KellerJordan/Muon; torch.optim.Muon; CONVENTIONS.md 1.3, 3.1, 10.3", matrix_only=True)


def _muon_scale() -> Entry:
    R = _rules()
    t_orig = _p("torch.Muon(original)", "torch", "Muon", dict(lr=0.02, weight_decay=0.0),
                lambda: R.Muon.like_torch(lr=0.02, weight_decay=0.0), layout="transpose", matrix_only=True)
    t_rms = _p("torch.Muon(match_rms_adamw)", "torch", "Muon", dict(lr=0.02, weight_decay=0.0,
                                                                      adjust_lr_fn="match_rms_adamw"),
               lambda: R.Muon.like_torch(lr=0.02, weight_decay=0.0, adjust_lr_fn="match_rms_adamw"),
               layout="transpose", matrix_only=True)
    o_def = _preset("optax.contrib.muon")
    o_rms = _p("optax.contrib.muon(consistent_rms)", "optax", "contrib.muon",
               dict(learning_rate=0.02, consistent_rms=0.2), lambda: R.Muon.like_optax(0.02, consistent_rms=0.2),
               matrix_only=True)
    from refopt.crosscheck.presets import MUON_OPTAX

    def spectral_oracle():      # no shape scale, lr * sqrt(fan_out/fan_in) per matrix of the stream
        from refopt.testing.adapters import RuleAdapter
        base = R.Muon.like_optax(0.02)
        shapes = {"w": (6, 12), "v": (12, 6), "tiny": (4, 5)}
        return RuleAdapter(R.Partition(
            rules={k: replace(base, lr=0.02 * math.sqrt(fo / fi), scale="none") for k, (fi, fo) in shapes.items()},
            labels=list(shapes)))
    return Entry(
        "muon-scale", "Muon's shape scale: KellerJordan/torch 'original' sqrt(max(1, out/in)), torch "
        "'match_rms_adamw' and optax consistent_rms 0.2 sqrt(max(out, in)), muP spectral sqrt(fan_out/fan_in)",
        (peer_side("torch original", t_orig, tol=MUON_TORCH_BF16, tol_name="MUON_TORCH_BF16",
                   source="KellerJordan's scale sqrt(max(1, A/B)) on torch's (out, in)"),
         peer_side("torch match_rms_adamw", t_rms, tol=MUON_TORCH_BF16, tol_name="MUON_TORCH_BF16",
                   source="Moonshot (Liu et al. 2025): 0.2 sqrt(max(A, B)), the RMS of AdamW's update"),
         peer_side("optax", o_def, tol=MUON_OPTAX, tol_name="MUON_OPTAX", source="sqrt(max(1, fan_out/fan_in))"),
         peer_side("optax consistent_rms", o_rms, tol=MUON_OPTAX, tol_name="MUON_OPTAX",
                   source="0.2 sqrt(max(fan_in, fan_out))"),
         restated_side("spectral (muP)", "the spectral condition's sqrt(fan_out/fan_in) (post 003)",
                       lambda: replace(R.Muon.like_optax(0.02), scale="spectral"), oracle=spectral_oracle,
                       source="post 003")),
        (Pair("torch original", "torch match_rms_adamw", "step", 0.1, what="per-step update (median)"),
         Pair("optax", "optax consistent_rms", "step", 0.1, what="per-step update (median)"),
         Pair("spectral (muP)", "optax", "step", 0.1, what="per-step update (median; differs on tall matrices)")),
        "the muP spectral condition (post 003) gives sqrt(fan_out/fan_in); KellerJordan's code clips it at 1 "
        "(never shrinks); 'match_rms_adamw' (Moonshot) targets AdamW's update RMS so AdamW's lr and decay transfer.",
        "post 003; KellerJordan/Muon; Liu et al. 2025 (arXiv:2502.16982); CONVENTIONS.md 1.3, 2.4, 10.1",
        matrix_only=True)


def _muon_nesterov() -> Entry:
    R = _rules()
    from refopt.crosscheck.presets import MUON_OPTAX
    o = _preset("optax.contrib.muon")
    std = lambda: replace(R.Muon.like_optax(0.02), nesterov_mode="standard")
    return Entry(
        "muon-nesterov-mix", "Muon's Nesterov input: optax mixes like NAdam (bias-corrected); KellerJordan and "
        "torch use (1 - mu) g + mu m",
        (peer_side("optax", o, tol=MUON_OPTAX, tol_name="MUON_OPTAX",
                   source="b m/(1 - b^(t+1)) + (1 - b) g/(1 - b^t), as optax.nadam"),
         restated_side("standard mix", "the same call with KellerJordan's / torch's Nesterov input "
                       "(1 - mu) g + mu m (float64; torch's own run adds bfloat16 noise)", std,
                       source="KellerJordan/Muon muon_update; torch.optim.Muon")),
        (Pair("optax", "standard mix", "step", 1e-3, what="per-step update (median)"),
         Pair("optax", "standard mix", "update", 0.05, what="per-step update (max: the first steps)")),
        "KellerJordan's code (the original Muon) uses the plain lerp (1 - mu) g + mu m; optax borrows NAdam's "
        "bias correction, which changes the first steps most (after msign only the direction counts).",
        "CONVENTIONS.md 2.4, 3.1, 10.2", matrix_only=True)


def _lamb_zero() -> Entry:
    R = _rules()
    V = _variants()

    def leaves():
        prob = make_problem("stream", np.float64, SEED)
        x0 = [a.copy() for a in prob.leaves]
        i = prob.paths.index("b")
        x0[i] = np.zeros_like(x0[i])                 # a zero-initialised bias
        return prob.paths, x0, [prob.grad(x0, t) for t in range(1, STEPS + 1)]
    lamb = _p("optax.lamb", "optax", "lamb", dict(learning_rate=1e-2, weight_decay=0.0),
              lambda: R.Covariant(R.Adam(eps=1e-6), lr=1e-2), state={"base.m": "mu", "base.v": "nu"})
    lars = _p("optax.lars", "optax", "lars", dict(learning_rate=1e-2, momentum=0.0, trust_coefficient=1.0,
                                                  weight_decay=1e-3),
              lambda: R.Covariant(R.SGD(weight_decay=1e-3), lr=1e-2))
    cov_l = lambda: R.Covariant(R.Adam(eps=1e-6), lr=1e-2)
    cov_s = lambda: R.Covariant(R.SGD(weight_decay=1e-3), lr=1e-2)
    return Entry(
        "trust-ratio-zero-norm", "LAMB / LARS at a zero norm: optax's trust ratio is 1 (a zero array moves by "
        "-lr u); refopt's Covariant makes no step",
        (peer_side("optax.lamb", lamb, refopt="variants.TrustRatioOneAtZero(Covariant(Adam(eps=1e-6), lr=0.01))",
                   make_refopt=lambda: V.TrustRatioOneAtZero(cov_l()), source="You et al. 2019 code: ratio 1 at 0"),
         peer_side("optax.lars", lars, refopt="variants.TrustRatioOneAtZero(Covariant(SGD(weight_decay=0.001), "
                   "lr=0.01))", make_refopt=lambda: V.TrustRatioOneAtZero(cov_s()), source="ratio 1 at 0"),
         restated_side("Covariant(Adam)", "the ELR form (post 000, eq. elr-u): a zero weight has ELR 0", cov_l,
                       source="post 000"),
         restated_side("Covariant(SGD)", "the ELR form (post 000, eq. elr-g)", cov_s, source="post 000")),
        (Pair("optax.lamb", "Covariant(Adam)", "abs", 1e-3, what="the zero-initialised bias (abs: refopt's stays 0)"),
         Pair("optax.lars", "Covariant(SGD)", "abs", 1e-3, what="the zero-initialised bias")),
        "the papers (LARS: You et al. 2017; LAMB: You et al. 2019) define the ratio ||x||/||u||, 0 for x = 0; "
        "optax's 1 is an implementation choice that lets zero-initialised arrays move (PITFALLS B11).",
        "post 000 eq. (elr-u); PITFALLS B11; optax scale_by_trust_ratio", leaves=leaves)


def _adam_eps() -> Entry:
    R = _rules()
    V = _variants()
    tp = _preset("torch.Adam")
    root = _p("optax.adam(eps=0, eps_root=1e-8)", "optax", "adam", dict(learning_rate=1e-2, eps=0.0, eps_root=1e-8),
              None)
    return Entry(
        "adam-eps-placement", "Adam's eps: outside the square root (torch, optax's eps), inside it (optax's "
        "eps_root), or eps-hat (TensorFlow/Keras, Kingma & Ba's efficient form)",
        (peer_side("torch", tp, source="Kingma & Ba 2015, Algorithm 1: mhat / (sqrt(vhat) + eps)"),
         peer_side("optax eps_root", root, refopt="variants.ConventionAdam(lr=0.01, eps=1e-8, eps_mode='inside')",
                   make_refopt=lambda: V.ConventionAdam(1e-2, 0.9, 0.999, 1e-8, eps_mode="inside"),
                   source="mhat / sqrt(vhat + eps_root)"),
         restated_side("eps-hat (TF/Keras)", "tf.keras.optimizers.Adam / Kingma & Ba section 2's efficient form: "
                       "lr sqrt(1-b2^t)/(1-b1^t) m / (sqrt(v) + eps_hat)",
                       lambda: V.ConventionAdam(1e-2, 0.9, 0.999, 1e-8, eps_mode="hat"),
                       refopt="variants.ConventionAdam(lr=0.01, eps=1e-8, eps_mode='hat')",
                       source="TensorFlow/Keras (not installed here)")),
        (Pair("optax eps_root", "torch", "final", 1e-3, what="params after 50 steps (the 1e-8 gradient leaf)"),
         Pair("eps-hat (TF/Keras)", "torch", "final", 1e-3, what="params after 50 steps (the 1e-8 gradient leaf)")),
        "Kingma & Ba's Algorithm 1 puts eps outside sqrt(vhat) (torch, optax); their efficient form (section 2) "
        "uses eps-hat = eps sqrt(1-b2^t), which TF/Keras ships; eps inside the root is optax's eps_root, for "
        "differentiating through Adam. They differ where |g| ~ eps (PITFALLS B02).",
        "Kingma & Ba 2015; PITFALLS B02; CONVENTIONS.md 1.2, 2.3")


def _adamw_decay() -> Entry:
    R = _rules()
    tw = _preset("torch.AdamW(wd=0.1)")                     # lr 3e-2, betas (0.9, 0.95), wd 0.1
    ow = _preset("optax.adamw(wd=0.1)")
    ind = lambda lr, wd: (lambda: R.AdamW(lr=lr, beta1=0.9, beta2=0.95, weight_decay=wd, wd_mode="independent"))
    V = _variants()

    def ind_oracle(lr, wd):      # x <- x (1 - wd) - lr u, written from the equation (refopt.crosscheck.variants)
        return lambda: V.ConventionAdam(lr, 0.9, 0.95, 1e-8, weight_decay=wd, decay="independent")
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


def _sgd_dampening() -> Entry:
    R = _rules()
    V = _variants()
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
                   make_refopt=lambda: V.ConventionSGD(0.05, momentum=0.9, dampening=0.9, dampen_first=True),
                   source="b_t = mu b_{t-1} + (1 - mu) g_t from b_0 = 0")),
        (Pair("torch", "optax ema momentum", "final", 1e-3, what="params after 50 steps"),),
        "no paper: torch inherits Lua-torch's first-step rule (the buffer starts as g_1); the EMA form is the "
        "exponential average as written (its first steps are shrunk by 1 - mu, a bias that debiasing removes).",
        "CONVENTIONS.md 1.1, 10.6")


def _nesterov_extra():
    """Sutskever's Nesterov (gradient at the look-ahead x + mu v; params x) vs torch's (the look-ahead point
    itself, Bengio et al.'s reformulation) on the quadratic, closed loop; and the identity that maps one onto
    the other: torch's y_t = x_t + mu v_t."""
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


def _nesterov() -> Entry:
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
        extra=_nesterov_extra, extra_peers=("torch",))


def _lion_default() -> Entry:
    R = _rules()
    ol = _p("optax.lion", "optax", "lion", dict(learning_rate=1e-2), lambda: R.Lion(lr=1e-2, weight_decay=1e-3))
    rl = restated_side("Lion paper / refopt default", "Lion(lr=0.01) with the paper's default weight decay 0 "
                       "(lucidrains/lion-pytorch, Google's reference)", lambda: R.Lion(lr=1e-2),
                       source="Chen et al. 2023")
    return Entry(
        "lion-default-decay", "Defaults: optax.lion decays the weights by default (1e-3), refopt's Lion and the "
        "paper's reference code do not; optax.adamw's default decay is 1e-4, torch AdamW's 1e-2",
        (peer_side("optax.lion", ol, source="optax default weight_decay=1e-3"), rl,
         peer_side("optax.adamw", _preset("optax.adamw"), source="optax default weight_decay=1e-4"),
         peer_side("torch.AdamW", _preset("torch.AdamW"), source="torch default weight_decay=1e-2")),
        (Pair("optax.lion", "Lion paper / refopt default", "final", 1e-6, what="params after 50 steps"),
         Pair("optax.adamw", "torch.AdamW", "final", 1e-6, what="both at their default decay")),
        "defaults, not equations: porting a config without its weight_decay changes the run. Chen et al. (2023) "
        "recommend a decay 3-10x larger than AdamW's for Lion, but ship none by default.",
        "CONVENTIONS.md 9, 10.5; Chen et al. 2023 (arXiv:2302.06675)")


def _amsgrad() -> Entry:
    return Entry(
        "amsgrad-max", "AMSGrad: torch keeps the maximum of the raw v and bias-corrects it; optax.amsgrad keeps "
        "the maximum of the bias-corrected v",
        (peer_side("torch", _preset("torch.Adam(amsgrad)"), source="max of v_t, then / sqrt(1 - b2^t)"),
         peer_side("optax", _preset("optax.amsgrad"), source="max of v_t / (1 - b2^t)")),
        (Pair("torch", "optax", "final", 1e-6, what="params after 50 steps"),),
        "Reddi et al. (2018) state AMSGrad without bias correction (max of v); torch adds the correction after the "
        "max (the max then decays with 1/sqrt(1-b2^t)), optax before it.",
        "Reddi et al. 2018; CONVENTIONS.md 1.2, 2.3")


def _sf_adamw_decay() -> Entry:
    R = _rules()
    fb = _p("schedulefree.AdamWScheduleFreeReference(wd)", "schedulefree", "AdamWScheduleFreeReference",
            dict(lr=0.05, weight_decay=1e-2), lambda: R.ScheduleFreeAdamW(lr=0.05, weight_decay=1e-2),
            state={"z": "z", "x": "x", "v": "exp_avg_sq"})
    fbz = _p("schedulefree.AdamWScheduleFreeReference(wd,decay_at_z)", "schedulefree", "AdamWScheduleFreeReference",
             dict(lr=0.05, weight_decay=1e-2, decay_at_z=True),
             lambda: R.ScheduleFreeAdamW(lr=0.05, weight_decay=1e-2, decay_at_z=True),
             state={"z": "z", "x": "x", "v": "exp_avg_sq"})
    return Entry(
        "schedule-free-decay-point", "Schedule-Free AdamW's weight decay: at y (the reference default, optax) "
        "or at z (the reference's decay_at_z=True)",
        (peer_side("schedulefree at y", fb, source="the reference default: the decay term lr wd y joins the z step"),
         peer_side("schedulefree at z", fbz, source="decay_at_z=True: z <- z - lr wd z"),
         peer_side("optax", _preset("optax.contrib.schedule_free_adamw"), source="lr wd y, as the reference")),
        (Pair("schedulefree at y", "schedulefree at z", "final", 1e-6, what="params after 50 steps"),
         Pair("optax", "schedulefree at y", "params", 1e-12, "max", what="optax = the reference default")),
        "Defazio et al. (2024) apply the decay at y (the gradient point); decay_at_z is the later option of the "
        "same code for the primal-averaging view (decay of the iterate that is averaged).",
        "Defazio et al. 2024; CONVENTIONS.md 2.5, 5.2")


ENTRIES: tuple[Callable[[], Entry], ...] = (
    _nadam, _sf_warmup, _schedules, _muon_4d, _ema, _clip, _muon_bf16, _muon_scale, _lamb_zero, _adam_eps,
    _adamw_decay, _sgd_dampening, _nesterov, _amsgrad, _lion_default, _sf_adamw_decay, _muon_nesterov)


def entries() -> list[Entry]:
    """All the atlas's entries, in order."""
    return [make() for make in ENTRIES]


def select(against: str = "all") -> list[Entry]:
    """The entries involving the peer ``against`` ('all': every entry, the restated-only ones included).

    Raises: ValueError for an unknown peer."""
    if against != "all" and against not in PEERS:
        raise ValueError(f"--against must be one of {['all', *PEERS]}, got {against!r}")
    return [e for e in entries() if against == "all" or against in e.peers]


def run_all(against: str = "all") -> list[EntryResult]:
    """:func:`run_entry` for every entry of :func:`select` (``against``). Raises: ValueError for an unknown
    peer. The peers' jit compilations dominate: about 40 s of CPU for all entries."""
    return [run_entry(e) for e in select(against)]


# ---------------------------------------------------------------------------------------------------
def _fmt_tol(tol: dict) -> str:
    return ", ".join(f"{k} <= {v:g}" for k, v in tol.items())


def report(results: list[EntryResult]) -> str:
    """The atlas as plain text: per entry, the measured differences and each side's refopt preset."""
    vers = versions()
    lines = ["refopt divergence atlas: float64, 50 steps, the seeded gradient stream; peers: "
             + ", ".join(f"{k} {v or 'not installed'}" for k, v in vers.items()), ""]
    for r in results:
        lines.append(f"[{r.status}] {r.name}: {r.title}")
        if r.status == "skipped":
            lines += [f"    skipped: {r.reason}", ""]
            continue
        lines.append(f"    peers: {', '.join(f'{k} {v}' for k, v in r.peers.items()) or 'none (restated only)'}; "
                     f"problem: {r.problem}")
        lines.append("    measured differences:")
        for f in r.differences:
            rel = ">=" if f.kind == "min" else "<="
            mark = "ok" if f.ok else "NO LONGER"
            lines.append(f"      {f.between}: {f.figure} {f.value:.3g}  (expected {rel} {f.bound:g}: {mark})"
                         + (f"  -- {f.what}" if f.what else ""))
        lines.append("    sides (each reproduced by its refopt preset):")
        for s in r.sides:
            tag = "restated, refopt stands in" if s.restated else s.peer
            lines.append(f"      {s.label} [{tag}]: {s.impl}")
            lines.append(f"          refopt: {s.refopt}")
            if s.measured:
                fig = ", ".join(f"{k} {v:.2e}" for k, v in s.measured.items() if k in s.tolerance)
                lines.append(f"          vs {s.checked_against}: {fig} ({s.tolerance_name}: {_fmt_tol(s.tolerance)})"
                             f" -> {'reproduced' if s.ok else 'NOT REPRODUCED'}")
            elif s.restated:
                lines.append("          (refopt's restatement stands in for this side; no peer to check it against)")
            if s.source:
                lines.append(f"          follows: {s.source}")
        lines.append(f"    which side: {r.follows}")
        lines.append(f"    reference: {r.reference}")
        lines.append("")
    counts = {s: sum(r.status == s for r in results) for s in ("reproduced", "changed", "skipped")}
    lines.append(", ".join(f"{v} {k}" for k, v in counts.items() if v))
    return "\n".join(lines)
