r"""The vocabulary of the conventions files (:mod:`refopt.conventions`): what a rule means to each peer.

:class:`PeerMapping` -- one peer call (``torch.optim.AdamW``, ``optax.adamw``, ...) and the refopt rule that
reproduces it: the peer's own argument names and defaults, the arguments refopt cannot reproduce (with the
reason), the peer's state names, the layout and the tolerance tier. :func:`refopt.like` reads these.
:class:`Preset` -- a checked peer call (one row of the cross-check table); :class:`Tol` -- pass criteria.
:class:`Example` -- a rule configuration the generic tests run. :class:`Oracle` -- the plain-numpy
restatement of a rule's equations (the test oracle, and the source of the diagnosis variants).
:class:`Conventions` -- everything one conventions file declares.

Tolerances (:class:`Tol`, see docs/crosscheck.md for the derivations):

* ``EXACT`` -- float64: the max-norm relative difference of params and state, per array and step, at most
  1e-12 (refopt follows the peers' operation order; what remains is a few ulps of reassociation, e.g.
  ``sqrt(v)/sqrt(bc2)`` vs ``sqrt(v/bc2)``, accumulated over 50 steps). float32: 2e-5, about 50 steps x a
  few float32 ulps (2^-24 = 6e-8) of per-step relative error in the step, rounding order differing.
* ``OPTAX_F32_WARMUP`` -- optax's Schedule-Free wrappers with ``warmup_steps``: optax evaluates the
  warmup schedule count/W in float32 even for float64 params (int32 count; 0.5*1/5 = 0.099999994), so
  the early z steps and averaging weights carry a relative error up to the float32 unit 6e-8 (2^-24);
  it stays in z and x (measured <= 1.1e-7 over 50 steps, the quadratic). float64 1e-6; float32 2e-5 as
  EXACT; the lag itself (warmup_lag=False) differs by >= 0.26. The same
  pairing with the warmup evaluated in float64 (adapter ``float64_warmup``) is EXACT.
* ``MUON_OPTAX`` -- float64 1e-10: Newton-Schulz in float64 on both sides, but BLAS (refopt) and XLA
  (optax) sum the matmuls in a different order and the quintic amplifies rounding (slope a = 3.4 at 0).
  float32: 2e-4.
* ``MUON_TORCH_BF16`` -- torch.optim.Muon casts the Newton-Schulz input to bfloat16 (8 significant
  bits: unit roundoff u = 2^-8 = 3.9e-3) whatever the param dtype, so its orthogonalised update carries
  ~1e-2 relative error per step. The params are therefore gated on the **per-step update**: max over steps of
  ||Delta_peer - Delta_refopt||_F / ||Delta_refopt||_F <= 0.06 on the full-rank random problems
  (stream, quadratic; measured <= 0.043), where Delta = x_t - x_{t-1}. On the real gradients of the MLP
  and the GPT the momentum is ill-conditioned and Jordan's quintic multiplies small singular values by up
  to a^5 = 3.4445^5 = 486, so bfloat16 rounding noise in weak directions is amplified: there the gate is
  0.25 (measured <= 0.145). The momentum buffer is computed in the param dtype by both, so the **state
  stays gated at EXACT**. The errors that must be caught are larger (measured, :data:`MISCONFIGURED`):
  on the stream a wrong scale or an untransposed layout (2:1 matrices: sqrt(2) - 1 = 0.41) gives
  >= 0.40, a sign error 2.1, dropping Nesterov 0.99; on the MLP / GPT the smallest is 0.37 (Nesterov).
* ``SOAP_ROUNDING``, ``SHAMPOO_ROUNDING`` -- SOAP and Shampoo (the Kronecker-factored preconditioners) amplify
  rounding. SOAP normalises every coordinate of its eigenbasis by its own second moment, so a coordinate that is
  zero in exact arithmetic (the null space of a rank-deficient factor, or the quadratic's second gradient, which
  equals the first) carries rounding noise divided by eps, and the eigenvectors of close eigenvalues turn by
  noise / gap. Shampoo's inverse roots of eps I + sum G G^T have condition numbers up to ||H|| / eps, and its
  momentum feeds the preconditioned update back into the statistics. The measurement: refopt against itself, the
  gradients changed by one ulp at random entries, 50 steps, seed 0 (SOAP also seed 1). SOAP parts by up to 2.6e-8
  (float64, the GPT; 5.7e-10 the quadratic, 1.9e-10 the MLP, 3e-16 the stream) and 1.6e-2 (float32, the MLP).
  Shampoo parts by up to 1.4e-8 (momentum 0.5 with decoupled decay on the stream; without momentum 2.5e-10, the
  quadratic); with momentum it is chaotic on the MLP (0.75), so its momentum rows skip the MLP; its state (b, the
  preconditioned update) parts by up to 1.3e-6 (no momentum, the quadratic). The gate: float64 params 1e-6 and
  state 1e-6 (SOAP) or 1e-4 (Shampoo). In float32 refopt parts from itself by up to 1.6e-2 (SOAP, the MLP) and
  0.15 (Shampoo with momentum, the GPT), as large as the errors to catch, so both are cross-checked in float64
  only: the rows skip float32 and ``crosscheck --impl --dtype float32`` refuses them (the float32 entries here
  are EXACT's and never apply). The errors to catch are larger: a decay
  of 0.1 left out moves SOAP by 5e-2, a momentum of 0.9 left out moves Shampoo by 2e-2, and the diagnosis
  variants move either by >= 1e-5.
"""
from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from refopt import tree as T
from refopt.testing.adapters import Adapter

#: the libraries every conventions file answers for (a mapping, or in ``no_peer`` the reason it has none)
PEERS = ("torch", "optax", "schedulefree")
#: torch packages that ship a few optimizers each, checked where they ship the rule (no ``no_peer`` needed)
PACKAGES = ("prodigyopt", "dadaptation", "pytorch_optimizer", "heavyball", "kron_torch", "momo")
ALL_PEERS = PEERS + PACKAGES


@dataclass(frozen=True)
class Tol:
    """Pass criteria, by dtype name. ``params`` / ``state``: max-norm relative difference (None = not
    gated); ``update``: relative Frobenius difference of the per-step update Delta = x_t - x_{t-1}."""

    float64: dict
    float32: dict
    by_problem: dict = field(default_factory=dict)   # problem -> entries overriding both dtypes

    def for_dtype(self, dtype: str, problem: str | None = None) -> dict:
        return {**getattr(self, dtype), **self.by_problem.get(problem, {})}


EXACT = Tol({"params": 1e-12, "state": 1e-12}, {"params": 2e-5, "state": 2e-5})
OPTAX_F32_WARMUP = Tol({"params": 1e-6, "state": 1e-6}, {"params": 2e-5, "state": 2e-5})
MUON_OPTAX = Tol({"params": 1e-10, "state": 1e-12}, {"params": 2e-4, "state": 2e-5})
MUON_TORCH_BF16 = Tol({"update": 0.06, "state": 1e-12}, {"update": 0.06, "state": 2e-5},
                      by_problem={"mlp": {"update": 0.25}, "gpt": {"update": 0.25}})
SOAP_ROUNDING = Tol({"params": 1e-6, "state": 1e-6}, {"params": 2e-5, "state": 2e-5})
SHAMPOO_ROUNDING = Tol({"params": 1e-6, "state": 1e-4}, {"params": 2e-5, "state": 2e-5})
#: the drift SOAP's and Shampoo's golden files allow when refopt replays them (GoldenCase.tolerance): one ulp of the
#: gradients moves 5 steps of the quadratic by up to 8.1e-9 (Shampoo) and 1.8e-9 (SOAP), which another BLAS can do
ROUNDING_GOLDEN = 1e-6


@dataclass(frozen=True)
class Preset:
    """One row of the table.

    name: unique id ``<peer>.<what>``; peer: one of :data:`ALL_PEERS`; family: the refopt rule
    family (the ``--rules`` filter: sgd, adam, adamw, nadam, muon, sf_sgd, sf_adamw, ema);
    peer_call: (constructor, kwargs) as the adapter builds it (torch: a ``torch.optim`` class name;
    optax: an ``optax`` attribute path such as ``'contrib.muon'``; schedulefree and the torch packages: a
    class name);
    make_rule: () -> the refopt rule (None for a known gap); layout: 'same' or 'transpose';
    matrix_only: the rule takes matrices only (problems keep their 2-D leaves);
    state: {refopt state field: peer state key} (the peer's key names, see the adapters);
    tol: the pass criteria; gap: why refopt cannot reproduce the peer (the row is reported, never
    failed); expect_fail: a deliberately wrong preset (:data:`MISCONFIGURED`) that must fail;
    negate_peer_grads: feed the peer -g (only for the sign negative control); factory: a torch package's
    ``factory(params, **kwargs)`` building the optimizer where ``<package>.<ctor>(params, **kwargs)`` does not run
    (NorMuon's ``use_muon`` parameter groups), None for the class itself;
    problems: the problems on which the row is meaningful (None = all), and ``problems_why`` the reason
    (e.g. a wrong preset that coincides with the right one on some shapes); dtypes: likewise the dtypes
    ('float64', 'float32'; None = both), ``dtypes_why`` the reason;
    why: the convention facts the preset relies on.
    """

    name: str
    peer: str
    family: str
    peer_call: tuple[str, dict]
    make_rule: Callable[[], Any] | None
    why: str
    layout: str = "same"
    matrix_only: bool = False
    state: dict = field(default_factory=dict)
    tol: Tol = EXACT
    gap: str | None = None
    expect_fail: bool = False
    negate_peer_grads: bool = False
    problems: tuple[str, ...] | None = None
    problems_why: str = ""
    factory: Callable | None = None
    dtypes: tuple[str, ...] | None = None
    dtypes_why: str = ""

    def describe_peer(self) -> str:
        ctor, kw = self.peer_call
        if self.peer == "optax" and ctor == "ema":      # the adapter's special pairing (peers/optax.py)
            kw = dict(kw)
            decay = kw.pop("decay")
            base = ", ".join(f"{k}={v!r}" for k, v in kw.items())
            return f"optax.ema(decay={decay!r}, debias=True) of the iterates of optax.sgd({base})"
        if self.peer == "optax" and kw.get("float64_warmup"):   # the adapter's float64 warmup (peers/optax.py)
            kw = dict(kw)
            del kw["float64_warmup"]
            lr, w = kw.pop("learning_rate"), kw.pop("warmup_steps")
            kw = {"learning_rate": _Raw(f"<float64 schedule {lr!r}*min(count/{w}, 1)>"), **kw}
        args = ", ".join(f"{k}={v!r}" for k, v in kw.items())
        prefix = {"torch": "torch.optim."}.get(self.peer, f"{self.peer}.")
        return f"{prefix}{ctor}({args})"


class _Raw(str):
    """A string that ``repr`` prints bare (for :meth:`Preset.describe_peer`)."""

    def __repr__(self):
        return str(self)


# ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PeerMapping:
    """One peer call and the refopt rule that reproduces it (:func:`refopt.like`).

    peer: the call's public name (``"torch.optim.AdamW"``, ``"optax.adamw"``, ``"optax.contrib.muon"``);
    adapter: which adapter runs it ('torch', 'optax', 'schedulefree' or a torch package) and ``ctor`` what that adapter builds
    (a ``torch.optim`` class name, an ``optax`` attribute path, or one of the adapters' special
    constructors); defaults: the peer's own default of every argument refopt reproduces; required: its
    arguments without a default; build: ``(**arguments, defaults filled in) -> rule``; refuse: ``{argument:
    (accepted, reason)}``, an argument refopt reproduces only where ``accepted(value)`` is true (else
    ValueError with the reason); ignore: arguments of the peer's implementation that do not change its
    arithmetic (``foreach``, ``fused``); state: ``{refopt state field: peer state key}``, or a function of the
    arguments giving it; layout: 'same' or 'transpose' (torch's (out, in) matrices); matrix_only: the rule
    takes matrices only; tol: the tolerance tier of the reproduction; family: the cross-check's rule family;
    match: ``rule -> arguments or None``, the reverse (which call of this peer reproduces a given rule); factory:
    a torch package's ``factory(params, **kwargs)`` where the class alone does not run (as :class:`Preset`'s)."""

    peer: str
    adapter: str
    ctor: str
    defaults: dict
    build: Callable[..., Any]
    family: str
    required: tuple = ()
    refuse: dict = field(default_factory=dict)
    ignore: tuple = ()
    state: Any = field(default_factory=dict)
    layout: str = "same"
    matrix_only: bool = False
    tol: Tol = EXACT
    match: Callable[[Any], dict | None] | None = None
    factory: Callable | None = None

    def arguments(self, kwargs: dict) -> dict:
        """``kwargs`` checked against the peer's signature, with the peer's defaults filled in. Raises
        ValueError naming an argument the peer does not take, a required one missing, or one refopt cannot
        reproduce (with the reason)."""
        known = set(self.defaults) | set(self.required) | set(self.ignore) | set(self.refuse)
        for k in kwargs:
            if k not in known:
                raise ValueError(f"{self.peer} has no argument {k!r} that refopt knows; its arguments: "
                                 f"{', '.join(sorted(known))}")
        missing = [k for k in self.required if k not in kwargs]
        if missing:
            raise ValueError(f"{self.peer} needs the argument(s) {', '.join(missing)}")
        full = {**self.defaults, **{k: v for k, v in kwargs.items() if k not in self.ignore}}
        for k, (accepted, reason) in self.refuse.items():
            if k in full and not accepted(full[k]):
                raise ValueError(f"like({self.peer!r}): {k}={full[k]!r} cannot be reproduced by refopt: {reason}")
        return full

    def rule(self, **kwargs):
        """The refopt rule that reproduces ``<peer>(**kwargs)``."""
        full = self.arguments(kwargs)
        params = inspect.signature(self.build).parameters
        if not any(p.kind is p.VAR_KEYWORD for p in params.values()):   # (refused and ignored arguments
            full = {k: v for k, v in full.items() if k in params}          # need not be in build's signature)
        return self.build(**full)

    def state_map(self, kwargs: dict) -> dict:
        return self.state(self.arguments(kwargs)) if callable(self.state) else dict(self.state)

    def call(self, kwargs: dict, always=("lr", "learning_rate")) -> tuple[str, dict]:
        """(ctor, the keywords that differ from the peer's defaults, plus the lr): the call as the adapter
        builds it."""
        out = {k: v for k, v in kwargs.items() if k in always or k not in self.defaults or not same(self.defaults[k], v)}
        return self.ctor, out

    def preset(self, name: str, kwargs: dict, why: str, adapter_options: dict | None = None, **fields) -> Preset:
        """The checked call ``<peer>(**kwargs)`` as a cross-check row whose rule is ``like(peer, **kwargs)``;
        ``adapter_options`` go to the adapter only (e.g. optax's ``float64_warmup``); ``fields`` override the
        row's :class:`Preset` fields (family, state, tol, problems, expect_fail, make_rule, ...)."""
        self.arguments(kwargs)
        row = dict(family=self.family, make_rule=lambda: self.rule(**kwargs), state=self.state_map(kwargs),
                   layout=self.layout, matrix_only=self.matrix_only, tol=self.tol, factory=self.factory)
        row.update(fields)
        family, make_rule = row.pop("family"), row.pop("make_rule")
        return Preset(name, self.adapter, family, (self.ctor, {**kwargs, **(adapter_options or {})}), make_rule,
                      why, **row)


def same(a, b) -> bool:
    """Equal values of the same kind (1e-2 == 0.01; True is not 1; tuples elementwise)."""
    if isinstance(a, tuple) or isinstance(b, tuple):
        return isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return (type(a) is type(b) and a == b) or (isinstance(a, float) and isinstance(b, (int, float))
                                               and not isinstance(b, bool) and a == b)


# ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Example:
    """A rule configuration the generic tests run (tests/test_rules_generic.py).

    params: the tree it runs on: 'mixed' (matrices of both orientations, vectors, nesting), 'matrix'
    (2-D leaves only, for Muon) or 'conv' (4-D filters and a matrix); converges: whether the quadratic
    convergence test applies (else ``note`` says why); quad_steps: its steps; extra: flags of the generic
    tests (``not_leafwise``: why each leaf alone is not the rule on that leaf; ``leaf_rule``:
    (path, x) -> the rule a bare leaf gets)."""

    name: str
    make_rule: Callable[[], Any]
    params: str = "mixed"
    converges: bool = True
    quad_steps: int = 300
    note: str = ""
    extra: dict = field(default_factory=dict)


def example_params(kind: str, dtype=np.float64, seed: int = 0) -> dict:
    """The params tree of an :class:`Example` (seeded, in ``dtype``)."""
    rng = np.random.default_rng(seed)
    if kind == "mixed":
        return {"layers": [{"w": rng.standard_normal((5, 3)).astype(dtype), "b": rng.standard_normal(3).astype(dtype)},
                           {"w": rng.standard_normal((3, 4)).astype(dtype), "b": rng.standard_normal(4).astype(dtype)}],
                "scale": rng.standard_normal((2, 2)).astype(dtype)}
    if kind == "matrix":
        return {"w1": rng.standard_normal((6, 4)).astype(dtype), "w2": rng.standard_normal((4, 7)).astype(dtype)}
    if kind == "conv":   # refopt's (kh, kw, fan_in, fan_out) filters and a matrix
        return {"conv": rng.standard_normal((3, 2, 4, 5)).astype(dtype), "w": rng.standard_normal((6, 4)).astype(dtype)}
    raise ValueError(f"unknown params kind {kind!r}")


@dataclass(frozen=True)
class CliName:
    """A ``refopt train --optimizer`` name for the rule: ``build(rule_fields) -> rule`` from the fields the
    command line sets (``lr``, ``schedule``, and those of ``options``: {rule field: argparse dest} used only
    when given on the command line, else the rule's default), default lr per model, help."""

    name: str
    rule: type
    lr: dict
    help: str
    options: dict = field(default_factory=dict)


#: ``PeerMapping.refuse`` entries several peers share: ``maximize=True``, a mask selecting the decayed
#: arrays, a schedule where refopt takes a constant.
class ModuleWith:
    """A module with some names replaced (``ModuleWith(torch, float32=torch.float64)``), every other name the
    module's own: what a package factory puts in place of a package module's global ``torch``."""

    def __init__(self, module, **names):
        self._module = module
        self.__dict__.update(names)

    def __getattr__(self, name):
        return getattr(self._module, name)


@contextlib.contextmanager
def patched(module, **names):
    """``module``'s globals ``names`` set to the given values inside the block and restored after it (also when
    the block raises): how a package factory runs the package's own code with one function or constant replaced."""
    saved = {n: getattr(module, n) for n in names}
    try:
        for n, v in names.items():
            setattr(module, n, v)
        yield
    finally:
        for n, v in saved.items():
            setattr(module, n, v)


def is_number(v) -> bool:
    """A real number (Python or numpy int or float), not a bool: the ``refuse`` predicates' test."""
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


def is_positive_int(v) -> bool:
    """A Python or numpy int > 0, not a bool."""
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) and v > 0


NO_MAXIMIZE = (lambda v: not v, "refopt minimises; feed -g to maximise")
NO_MASK = (lambda v: v is None, "give the decayed and undecayed arrays their own rules with refopt.Partition")
NO_DTYPE = (lambda v: v is None, "refopt keeps the state in the params' dtype")
CONSTANT = (lambda v: not callable(v), "refopt takes a constant here (a schedule goes on the lr)")


def _two_betas(v) -> bool:
    return isinstance(v, (tuple, list)) and len(v) == 2 and all(
        isinstance(b, (int, float)) and not isinstance(b, bool) and 0 <= b < 1 for b in v)


#: a torch-style ``betas`` pair, each in [0, 1)
BETAS2 = (_two_betas, "betas must be (beta1, beta2), each in [0, 1)")

#: heavyball's arguments that do not change its arithmetic, and the ones no refopt rule reproduces, for every
#: heavyball optimizer
HEAVYBALL_IGNORE = ("multi_tensor", "compile_step", "promote")
HEAVYBALL_REFUSE = {
    "storage_dtype": (lambda v: v == "float64", "heavyball keeps its state in storage_dtype (float32 by default), "
                                                "rounding it each step: pass 'float64'"),
    "warmup_steps": (lambda v: not v, "warmup_steps > 0 warms the lr up; pass schedule on the refopt side"),
    "ecc": (lambda v: v is None, "ecc compresses the state"),
    "param_ecc": (lambda v: v is None, "param_ecc compresses the parameters")}


def decoupled_decay_only(owner: str, decayed: bool, weight_decouple: bool, fixed_decay: bool, before: str = "") -> None:
    """pytorch_optimizer's ``weight_decouple`` / ``fixed_decay`` against a refopt rule that decays x by
    lr weight_decay: ValueError naming the switch when some weight_decay > 0 (``decayed``) meets
    weight_decouple=False (L2 on the gradient, ``before`` what) or fixed_decay=True (no lr)."""
    if decayed and not weight_decouple:
        where = f" {before}" if before else ""
        raise ValueError(f"weight_decouple=False adds weight_decay x to the gradient (L2){where}; refopt's {owner} "
                         "decays x by lr weight_decay (pass weight_decouple=True)")
    if decayed and fixed_decay:
        raise ValueError(f"fixed_decay=True decays x by weight_decay, without lr; refopt's {owner} by lr weight_decay")


# ------------------------------------------------------------------------------------------------------
def scalar(v: float, dtype) -> Any:
    """``v`` (computed in float64) cast to the array dtype, as refopt and torch cast a step's scalars."""
    return np.asarray(v, dtype=dtype)[()]


def gamma(schedule, t: int) -> float:
    """The schedule multiplier gamma_t in float64 (1 without a schedule)."""
    return 1.0 if schedule is None else float(schedule(t))


class Oracle(Adapter):
    """A rule's equations restated in plain numpy, array by array: the oracle of its tests and, with a
    convention switched (``switches``), a diagnosis variant (:mod:`refopt.crosscheck.variants`).

    Every scalar is computed in float64 from the hyperparameters and cast to the array dtype; every array
    operation is a numpy expression in the array dtype; t = 1 on the first step. Subclasses define
    ``init_leaf(x, path) -> dict`` of state arrays, ``step_leaf(t, s, x, g, path) -> new x`` (``x`` a copy it
    may write; ``s`` the leaf's state dict, a copy it may write) and, for rules with an additive direction,
    ``direction_leaf(t, s, x, g, path) -> u``; ``prepare(t, xs, gs) -> gs`` for a whole-tree pre-pass; and
    ``glob`` state in ``self.init_glob()`` / ``self.next_glob(t, glob)``."""

    framework = "numpy"
    named = True

    def __init__(self, rule, name: str | None = None, **switches):
        self.rule, self.switches = rule, switches
        self.name = name or f"{type(rule).__name__} (plain numpy)"

    @property
    def inputs(self) -> tuple:
        """The rule's inputs beyond the gradients (``value``): an oracle of such a rule takes them in ``step``."""
        return tuple(getattr(self.rule, "inputs", ()))

    # ---- per-rule hooks -------------------------------------------------------------------------------
    def init_leaf(self, x, path):   # pragma: no cover - abstract
        raise NotImplementedError

    def step_leaf(self, t, s, x, g, path):   # pragma: no cover - abstract
        raise NotImplementedError

    def prepare(self, t, xs, gs):
        return gs

    # ---- the walk -------------------------------------------------------------------------------------
    def init(self, params):
        xs, paths, _ = T.flatten(params)
        return (0, [self.init_leaf(np.asarray(x), p) for x, p in zip(xs, paths)])

    def step(self, state, params, grads):
        t, leaves = state
        t += 1
        xs, gs, paths, td = T.check_like(params, grads)
        gs = self.prepare(t, [np.asarray(x) for x in xs], [np.asarray(g) for g in gs])
        new_x, new_s = [], []
        for x, g, s, p in zip(xs, gs, leaves, paths):
            x, s = stepped(self, t, copy_state(s), np.array(x, copy=True), np.asarray(g), p)
            new_x.append(x)
            new_s.append(s)
        return T.unflatten(td, new_x), (t, new_s)

    def state_arrays(self, state) -> dict:
        out: dict = {}
        leaves = state[1]
        for i, s in enumerate(leaves):
            for k, v in flat_state(s).items():
                if isinstance(v, np.ndarray) and v.ndim > 0:
                    out.setdefault(k, [None] * len(leaves))[i] = np.array(v)
        return out


class ReadOrder(dict):
    """A leaf's state dict (a per-step copy) whose fields named in ``fixed`` read one value for the whole step:
    ``fixed`` {field: value}, with a wrapper's nested fields as ``'base.m'``. The step's writes to those fields
    are set aside and :meth:`commit` stores the value the rule's own step gave them (``new``). With the value
    before the step, every formula reads the field *before its update* (a stale read: the update placed after
    its use); with the value after it, every formula reads it *after its update* (the update placed before a
    use that should see the previous value). See :func:`stepped`."""

    def __init__(self, s: dict, fixed: dict, new: dict):
        super().__init__()
        self.fixed = {k: v for k, v in fixed.items() if "." not in k}
        self.new = {k: v for k, v in new.items() if "." not in k}
        for k, v in s.items():
            sub = {n.split(".", 1)[1]: w for n, w in fixed.items() if n.startswith(k + ".")}
            subnew = {n.split(".", 1)[1]: w for n, w in new.items() if n.startswith(k + ".")}
            dict.__setitem__(self, k, ReadOrder(v, sub, subnew) if isinstance(v, dict) and sub else v)
        for k, v in self.fixed.items():
            dict.__setitem__(self, k, v)

    def __setitem__(self, k, v):
        if k not in self.fixed:
            dict.__setitem__(self, k, v)

    def commit(self) -> dict:
        out = {k: v.commit() if isinstance(v, ReadOrder) else v for k, v in self.items()}
        out.update(self.new)
        return out


def stepped(oracle, t: int, s: dict, x, g, path):
    """(new x, new state) of ``oracle.step_leaf`` on one leaf (``s`` and ``x`` copies it may write), under the
    oracle's diagnosis switches (:mod:`refopt.conventions._generated`):

    * ``reads`` {field: 'before' | 'after'}: each field so named reads, in every formula of the step, its
      value before this step's update ('before': a stale read) or after it ('after'), while the state keeps
      the value the rule's step gives it;
    * ``ema_swap`` {field: (c, 'before' | 'after')}: the field's update, an EMA ``c s + (1 - c) u``, made
      with its two weights swapped, ``(1 - c) s + c u`` (u recovered from the rule's own update), that
      value kept and read by the step's formulas after the update ('after') or only from the next step on
      ('before': a field the step reads before updating it)."""
    reads, swap = oracle.switches.get("reads") or {}, oracle.switches.get("ema_swap") or {}
    if not reads and not swap:
        return oracle.step_leaf(t, s, x, g, path), s
    old = flat_state(copy_state(s))
    ref_s = copy_state(s)
    oracle.step_leaf(t, ref_s, np.array(x, copy=True), g, path)
    new = flat_state(ref_s)
    here = [k for k in (*reads, *swap) if k in old and k in new]     # a leaf without the field: nothing to change
    if not here:
        return oracle.step_leaf(t, s, x, g, path), s
    kept, fixed = {}, {}
    for k in here:
        if k in swap:
            c, how = swap[k]
            u = (new[k] - c * old[k]) / (1 - c)
            kept[k] = (1 - c) * old[k] + c * u
            fixed[k] = old[k] if how == "before" else copy_state({"a": kept[k]})["a"]
        else:
            kept[k] = new[k]
            fixed[k] = old[k] if reads[k] == "before" else copy_state({"a": new[k]})["a"]
    view = ReadOrder(s, fixed, kept)
    return oracle.step_leaf(t, view, x, g, path), view.commit()


def counted(t: int, how) -> int:
    """The step counter a place of an oracle reads at step t under a counter switch ``how`` ('next': t + 1,
    'prev': t - 1, 'frozen': 1, None: t)."""
    return t + 1 if how == "next" else t - 1 if how == "prev" else 1 if how == "frozen" else t


def copy_state(s):
    """A copy of a leaf's state dict (nested dicts of a wrapper's base copied too); a :class:`ReadOrder` view
    is itself the step's copy and is returned as is (a wrapper that copies its base's state keeps the view)."""
    if isinstance(s, ReadOrder):
        return s
    return {k: copy_state(v) if isinstance(v, dict) else (v.copy() if isinstance(v, np.ndarray) else v)
            for k, v in s.items()}


def flat_state(s, prefix: str = "") -> dict:
    """{'base.m': array, ...}: a leaf's state dict with a wrapper's nested base state flattened."""
    out = {}
    for k, v in s.items():
        if isinstance(v, dict):
            out.update(flat_state(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


def norm64(a) -> float:
    """The Frobenius norm of ``a`` computed in float64."""
    return float(np.linalg.norm(np.asarray(a, dtype=np.float64)))


# ------------------------------------------------------------------------------------------------------
class ShapeScaledOracle(Oracle):
    """An :class:`Oracle` of a matrix rule whose step is x_t = (1 - lr_t lambda) x_{t-1} - lr_t s U_t, s the
    shape scale of the rule's ``scale`` (refopt.rules.muon_shape.muon_scale), lambda its ``weight_decay``
    (decoupled): subclasses define ``unscaled(t, s, x, g, path) -> U_t`` shaped like x (the state advanced)."""

    def _s(self, x):
        from refopt.rules.muon_shape import muon_scale
        return muon_scale(x.shape, self.rule.scale)

    def direction_leaf(self, t, s, x, g, path):
        return scalar(self._s(x), x.dtype) * self.unscaled(t, s, x, g, path)

    def step_leaf(self, t, s, x, g, path):
        r, d = self.rule, x.dtype
        lr = r.lr * gamma(r.schedule, t)
        u = self.unscaled(t, s, x, g, path)
        return scalar(1.0 - lr * r.weight_decay, d) * x - scalar(lr * self._s(x), d) * u


@dataclass(frozen=True)
class Conventions:
    """What one conventions file declares about its rules (see :mod:`refopt.conventions`).

    rules: the refopt rule classes it covers; mappings: the :class:`PeerMapping` of every peer that has the
    optimizer; no_peer: {adapter: why that peer has no such optimizer} for the others; presets: the checked
    peer calls (:data:`refopt.crosscheck.presets.PRESETS`); wrong: deliberately wrong rows that must be
    caught; gaps: peer calls refopt does not reproduce, with the reason; oracle: rule -> its plain-numpy
    :class:`Oracle`; variants: rule -> the diagnosis variants (:class:`refopt.crosscheck.variants.Variant`);
    facts: (rule, facts_of) -> {fact: bool}, the invariance facts the theory gives
    (:mod:`refopt.testing.expected`; ``facts_of(base)`` gives a nested rule's); golden: golden cases;
    examples: the generic tests' configurations; atlas: the names of the divergence-atlas entries about the
    rule; cli: ``refopt train --optimizer`` names built generically; counters: the places the oracle reads
    the step counter t, as (switch key, what[, modes]) tuples or rule -> tuples (the oracle's ``counter={key: 'next' |
    'prev' | 'frozen'}`` switch reads t + 1, t - 1 or 1 there: the generated counter variants,
    :mod:`refopt.conventions._generated`); final: what the step computes from the state, in words (the
    evidence names it when the state agrees and the update differs, :mod:`refopt.crosscheck.evidence`);
    per_step: the rule's per-step scalar factors, in words (named when the updates are parallel with a
    ratio that varies with t)."""

    rules: tuple
    mappings: tuple = ()
    no_peer: dict = field(default_factory=dict)
    presets: tuple = ()
    wrong: tuple = ()
    gaps: tuple = ()
    oracle: Callable | None = None
    variants: Callable | None = None
    facts: Callable | None = None
    golden: tuple = ()
    examples: tuple = ()
    atlas: tuple = ()
    cli: tuple = ()
    counters: Callable | tuple = ()
    final: str = ""
    per_step: str = ""
