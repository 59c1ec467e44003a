r"""The diagnosis variants generated from a rule's own record: every option changed, pairs swapped, counters
shifted, scopes widened.

:func:`generated` reads the fields of a rule record (a frozen dataclass) and builds, for each, the variants
an implementation written from the same paper most often differs by (each is a refopt rule or the rule's
plain-numpy oracle with a switch, run on the same inputs by the plug-in cross-check):

* **options**: a bool flipped (``nesterov``, ``centered``, ``debias``); every other value of a categorical
  option (the choices its validation lists, :class:`refopt.rules._checks.ChoiceError`: ``scale``,
  ``wd_mode``, ``amsgrad``, ``norm``); an integer option one lower and one higher (``ns_steps``,
  ``warmup_steps``); a coefficient in (0, 1) read as its complement (``beta1`` as 1 - beta1: "the weight
  of the new gradient" and "the weight of the old average" confused); a positive term missing (a field
  other than ``lr`` set to 0: ``momentum``, ``weight_decay``, ``eps``, ``dampening``);
* **swaps**: every pair of numeric hyperparameters exchanged (``beta1`` <-> ``beta2``, ``lr`` <->
  ``weight_decay``);
* **counters**: the schedule read at t - 1 (counted from 0: refopt's schedules are evaluated at the
  virtual step 0 by their formula, :meth:`refopt.schedules.Schedule._at`), at t + 1, or frozen at t = 1;
  and, for each place the conventions file names (``Conventions.counters``, e.g. Adam's two bias
  corrections, its Nesterov look-ahead), that place's counter at t + 1 or frozen at 1 (and t - 1 where the
  place is defined at t = 1), one place at a time, plus the whole rule's
  counter frozen (a state whose step never advances) or one ahead;
* **the schedule's record** (:func:`schedule_variants`): a refopt schedule's integer fields one lower and
  higher, its floor missing, WSD's decay shape changed, and per phase of a :class:`~refopt.schedules.Join`
  (warmup-cosine, WSD): its curve spread over the whole run, read on the run's clock, its length or its
  boundary off by one;
* **read order**: each state field read, wherever the step uses it, as it was before this step's update
  (a stale read) or as the update leaves it (:func:`refopt.conventions._spec.stepped`);
* **one EMA's weights**: each state field updated with a coefficient's two weights swapped,
  ``(1 - c) s + c u``, the rule's other uses of c unchanged (:func:`_ema_swap_variants`);
* **scope**: the rule run on the whole tree as one array where that changes its step (a global trust
  ratio or layer norm in place of one per array: :func:`_whole_tree_variants`); for a
  :class:`~refopt.rules.partition.Partition`, each group's rule applied to every leaf and every variant of
  each group's rule in its group; for a wrapper (a ``base`` field), every variant of the base inside the
  wrapper (:func:`refopt.conventions._variants.base_variants`).

A variant the rule refuses to build (a swap out of a field's range) is not generated; one equal to the rule
is left out. Fields that cannot change the numbers (:data:`INERT`: where Newton-Schulz runs) are skipped.
"""
from __future__ import annotations

import dataclasses
import itertools
import numbers

import numpy as np

from refopt.conventions._variants import Variant, oracle_variant, rule_variant, try_replace
from refopt.rules._checks import ChoiceError
from refopt.testing.adapters import Adapter

__all__ = ["generated", "choices", "INERT", "shifted_schedule", "CounterShift", "GroupVariant", "state_fields",
           "schedule_variants", "PhaseClock"]

#: fields whose value does not change the numbers of a step (the device Newton-Schulz runs on)
INERT = frozenset({"msign_backend"})

_PROBE = "\x00probe"
_NOT_COEFFICIENTS = frozenset({"eps", "norm_eps", "weight_decay"})   # small constants, never read as 1 - value


def choices(rule, name: str) -> list | None:
    """The values a categorical field ``name`` of ``rule`` accepts (from its validation's
    :class:`~refopt.rules._checks.ChoiceError`), or None when the field is not categorical."""
    try:
        dataclasses.replace(rule, **{name: _PROBE})
    except ChoiceError as e:
        return list(e.allowed) if e.field == name else None
    except (TypeError, ValueError):
        return None
    return None


def _number(v) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool)


def _option_variants(rule) -> list:
    out = []
    for f in dataclasses.fields(rule):
        name, v = f.name, getattr(rule, f.name)
        if name in INERT or not f.init or callable(v) or hasattr(v, "init_leaf"):
            continue
        if isinstance(v, bool) and not choices(rule, name):
            out.append(rule_variant(f"{name}={not v}", f"the option {name} flipped ({v} -> {not v})",
                                    try_replace(rule, **{name: not v})))
        elif isinstance(v, (bool, str)) or v is None:
            for c in (choices(rule, name) or []):
                if c != v:
                    out.append(rule_variant(f"{name}={c!r}", f"the option {name} = {c!r} in place of {v!r}",
                                            try_replace(rule, **{name: c})))
        elif isinstance(v, int):
            for w in (v - 1, v + 1):
                out.append(rule_variant(f"{name}={w}", f"{name} {w} in place of {v} (one "
                                        f"{'fewer' if w < v else 'more'})", try_replace(rule, **{name: w})))
        elif _number(v) and v > 0 and name != "lr":
            if v < 1 and name not in _NOT_COEFFICIENTS:
                out.append(rule_variant(f"{name} read as 1 - {name}", f"{1 - v:g} in place of {name} = {v:g} "
                                        f"(the weight of the new term and of the old average confused)",
                                        try_replace(rule, **{name: 1.0 - v})))
            out.append(rule_variant(f"{name}=0", f"the {name} term missing ({name} = {v:g} has no effect)",
                                    try_replace(rule, **{name: 0.0})))
    return out


def _swap_variants(rule) -> list:
    nums = [f.name for f in dataclasses.fields(rule) if f.init and f.name not in INERT and _number(getattr(rule, f.name))
            and not isinstance(getattr(rule, f.name), int)]
    out = []
    for a, b in itertools.combinations(nums, 2):
        va, vb = getattr(rule, a), getattr(rule, b)
        if va != vb:
            out.append(rule_variant(f"{a} and {b} swapped", f"{a} = {vb:g} and {b} = {va:g} (the two "
                                    f"hyperparameters exchanged)", try_replace(rule, **{a: vb, b: va})))
    return out


def shifted_schedule(schedule, how):
    """The schedule read at another step: ``how`` an int shift (gamma(t + shift); refopt schedules are
    evaluated by their formula at t = 0, so -1 gives gamma_0 at the first step) or ``'frozen'`` (gamma_1
    at every step). A plain function is called as is (a ValueError of it at t + shift < 1 reaches the
    caller, which reports the variant as not run)."""
    from refopt.schedules import Schedule

    def at(t):
        t = 1 if how == "frozen" else t + how
        return float(schedule._at(t)) if isinstance(schedule, Schedule) else float(schedule(t))
    return at


def _schedule_variants(rule) -> list:
    sched = getattr(rule, "schedule", None)
    if not callable(sched):
        return []
    out = []
    for name, detail, how in (
            ("schedule counted from 0", "gamma(t - 1) at step t: the step counted from 0, or a torch LR "
             "scheduler stepped before the optimizer", -1),
            ("schedule one step ahead", "gamma(t + 1) at step t: the counter incremented twice", 1),
            ("schedule frozen", "gamma(1) at every step: the schedule's counter never advances", "frozen")):
        out.append(rule_variant(name, detail, try_replace(rule, schedule=shifted_schedule(sched, how))))
    return out


@dataclasses.dataclass(frozen=True)
class PhaseClock:
    """A phase of a :class:`~refopt.schedules.Join` read on the run's clock: ``inner`` at t + ``offset`` where
    the Join hands it its own t - start (a phase whose clock does not restart at its first step)."""

    inner: object
    offset: int

    def _at(self, t):
        return self.inner._at(t + self.offset)


def _length_field(s) -> str | None:
    """The field that holds a schedule's own length (``steps``, ``total_steps``), or None."""
    for name in ("steps", "total_steps"):
        if isinstance(getattr(s, name, None), int) and not hasattr(s, "phases"):
            return name
    return None


def _phase_name(i: int, n: int, start: int, inner) -> str:
    return f"phase {i + 1} ({type(inner).__name__}, steps {start + 1}..{start + n})"


def _join_variants(join) -> list:
    """(name, detail, schedule) for a Join: each phase's curve over the whole run, on the run's clock, one step
    shorter or longer than its phase; a boundary between two phases one step earlier or later (the total
    kept); the last phase one step shorter or longer (the total with it); a floor or final value missing."""
    from refopt.schedules import Join, Schedule

    phases, out = list(join.phases), []
    total = sum(n for n, _ in phases)
    starts = [sum(n for n, _ in phases[:i]) for i in range(len(phases))]

    def joined(ps):
        try:
            return Join(tuple(ps))
        except ValueError:
            return None

    def sized(inner, length):
        f = _length_field(inner)
        if f is None:
            return None
        try:
            return dataclasses.replace(inner, **{f: length})
        except (TypeError, ValueError):
            return None

    for i, (n, inner) in enumerate(phases):
        if n == 0:
            continue
        what, f = _phase_name(i, n, starts[i], inner), _length_field(inner)
        if f is not None and getattr(inner, f) == n and n != total:
            out.append((f"{what} over the whole run", f"the curve of {what} spread over all {total} steps, not its "
                        f"phase's {n} (its progress divided by the total)",
                        joined(phases[:i] + [(n, sized(inner, total))] + phases[i + 1:])))
        if starts[i] > 0:
            out.append((f"{what} on the run's clock", f"{what} read at the run's step t, not at t - {starts[i]} "
                        f"(its clock not restarted at the phase's start)",
                        joined(phases[:i] + [(n, _as_schedule(PhaseClock(inner, starts[i])))] + phases[i + 1:])))
        if f is not None and getattr(inner, f) == n:
            for w in (n - 1, n + 1):
                if w >= 1:
                    out.append((f"{what}'s curve {w} steps long", f"the curve of {what} over {w} steps, its phase "
                                f"{n} (an off-by-one in its length)",
                                joined(phases[:i] + [(n, sized(inner, w))] + phases[i + 1:])))
        for fname in ("floor", "final", "start"):
            v = getattr(inner, fname, None)
            if isinstance(v, float) and v > 0:
                out.append((f"{what}'s {fname} missing", f"{fname} = 0 in place of {v:g} in {what}",
                            joined(phases[:i] + [(n, dataclasses.replace(inner, **{fname: 0.0}))] + phases[i + 1:])))
    for i in range(len(phases) - 1):
        (n1, a), (n2, b) = phases[i], phases[i + 1]
        for shift in (-1, 1):
            m1, m2 = n1 + shift, n2 - shift
            if m1 < 0 or m2 < 0:
                continue
            a2 = sized(a, m1) if _length_field(a) and getattr(a, _length_field(a)) == n1 else a
            b2 = sized(b, m2) if _length_field(b) and getattr(b, _length_field(b)) == n2 else b
            if a2 is None or b2 is None:
                continue
            out.append((f"phase {i + 1} {'one step shorter' if shift < 0 else 'one step longer'}",
                        f"the boundary of phases {i + 1} and {i + 2} at step {starts[i] + m1} in place of "
                        f"{starts[i] + n1} (the total {total} kept)",
                        joined(phases[:i] + [(m1, a2), (m2, b2)] + phases[i + 2:])))
    n, last = phases[-1]
    for w in (n - 1, n + 1):
        lw = sized(last, w) if _length_field(last) and getattr(last, _length_field(last)) == n else last
        if w >= 1 and lw is not None:
            out.append((f"the run {total + w - n} steps long", f"the schedule's total {total + w - n} in place of "
                        f"{total} (its last phase {w} steps)", joined(phases[:-1] + [(w, lw)])))
    return [(a, b, c) for a, b, c in out if isinstance(c, Schedule)]


def _as_schedule(clock):
    """A :class:`PhaseClock` as a :class:`~refopt.schedules.Schedule` (a Join takes only schedules)."""
    from refopt.schedules import Schedule

    class _Clock(Schedule):
        def _at(self, t):
            return clock._at(t)

        def __repr__(self):
            return f"PhaseClock({clock.inner!r}, offset={clock.offset})"
    return _Clock()


def schedule_variants(schedule) -> list:
    """(name, detail, schedule) variants of a refopt schedule from its own record: every integer field one lower
    and one higher, a float field (floor, final, start) missing, a categorical one (WSD's decay) changed, and a
    Join's (or WSD's) phase variants (:func:`_join_variants`: a phase's curve over the whole run or on the run's
    clock, its length or a boundary off by one). A plain function has none."""
    from refopt.schedules import WSD, Join, Product, Schedule

    if not isinstance(schedule, Schedule):
        return []
    out = []
    if isinstance(schedule, Product):
        for i, f in enumerate(schedule.factors):
            for a, b, c in schedule_variants(f):
                out.append((f"{a} (factor {i + 1})", b, Product(schedule.factors[:i] + (c,) + schedule.factors[i + 1:])))
        return out
    if isinstance(schedule, Join):
        return _join_variants(schedule)
    for f in dataclasses.fields(schedule):
        v = getattr(schedule, f.name)
        new = []
        if isinstance(v, int) and not isinstance(v, bool):
            new = [(f"{f.name}={w}", f"{f.name} {w} in place of {v} (one {'fewer' if w < v else 'more'})", w)
                   for w in (v - 1, v + 1)]
        elif isinstance(v, float) and v > 0 and f.name in ("floor", "final", "start"):
            new = [(f"{f.name}=0", f"{f.name} = 0 in place of {v:g} (missing)", 0.0)]
        elif isinstance(v, str):
            new = [(f"{f.name}={c!r}", f"{f.name} {c!r} in place of {v!r}", c) for c in ("linear", "cosine") if c != v]
        for a, b, w in new:
            try:
                out.append((a, b, dataclasses.replace(schedule, **{f.name: w})))
            except (TypeError, ValueError):
                pass
    if isinstance(schedule, WSD):
        out += _join_variants(schedule._joined)
    return out


def _schedule_record_variants(rule) -> list:
    sched = getattr(rule, "schedule", None)
    return [rule_variant(f"schedule {name}", detail, try_replace(rule, schedule=new))
            for name, detail, new in schedule_variants(sched)]


class CounterShift(Adapter):
    """An oracle (:class:`refopt.conventions._spec.Oracle`) whose step counter is read as ``how``
    ('frozen': t = 1 at every step; 'next': t + 1): a counter kept in the state that never advances, or
    one counted from 0 and incremented first. Every place the oracle reads t is shifted alike."""

    framework = "numpy"

    def __init__(self, inner, how: str, name: str):
        self.inner, self.how, self.name = inner, how, name

    def init(self, params):
        return (0, self.inner.init(params))

    @property
    def inputs(self) -> tuple:
        return self.inner.inputs

    def step(self, state, params, grads, **inputs):
        t, inner = state[0] + 1, state[1]      # the oracle's state: (t, leaves) or (t, leaves, rule-wide state)
        seen = 1 if self.how == "frozen" else t + 1
        x, new = self.inner.step((seen - 1, *inner[1:]), params, grads, **inputs)
        return x, (t, (seen, *new[1:]))

    def state_arrays(self, state) -> dict:
        return self.inner.state_arrays(state[1])


def _counter_variants(rule) -> list:
    from refopt.conventions import for_rule, oracle

    conv = for_rule(rule)
    if conv is None or conv.oracle is None:
        return []
    out = [Variant("step counter frozen at 1", "the state's step t never advances: every step is computed "
                   "as the first (bias corrections, schedule, averaging weights)",
                   lambda: CounterShift(oracle(rule), "frozen", "step counter frozen at 1")),
           Variant("step counter one ahead", "t + 1 at step t everywhere the rule reads t (counted from 0 and "
                   "incremented first, or incremented twice)",
                   lambda: CounterShift(oracle(rule), "next", "step counter one ahead"))]
    labels = {"next": "t + 1", "prev": "t - 1", "frozen": "frozen at 1"}
    for place, what, *modes in (conv.counters(rule) if callable(conv.counters) else conv.counters):
        for how in (modes[0] if modes else ("next", "frozen")):
            label = labels[how]
            out.append(oracle_variant(rule, f"{what}: counter {label}", f"only {what} reads its step "
                                      f"counter as {label}; every other place reads t", counter={place: how}))
    return out


def state_fields(rule) -> list[str]:
    """The names of the state arrays the rule's oracle keeps per leaf (a wrapper's as ``'base.m'``), read from
    its ``init_leaf`` on a matrix and a vector; [] without an oracle."""
    from refopt.conventions import for_rule, oracle
    from refopt.conventions._spec import flat_state

    conv = for_rule(rule)
    if conv is None or conv.oracle is None:
        return []
    orc, out = oracle(rule), []
    for path, x in (("w", np.full((4, 3), 0.5)), ("b", np.full(3, 0.5))):
        try:
            s = orc.init_leaf(x, path)
        except (ValueError, TypeError):    # a rule for matrices only: the vector has no state to read
            continue
        out += [k for k, v in flat_state(s).items() if isinstance(v, np.ndarray) and v.ndim > 0 and k not in out]
    return out


def _read_order_variants(rule, orders: dict) -> list:
    """Each state field read, in every formula of the step, before its own update (a stale read: the average
    or maximum of the previous step in the denominator, the momentum of the previous step in a Nesterov mix,
    the previous average in an interpolation) or after it (the update placed before a use that reads the
    previous value: Lion's interpolation with the new momentum), each only where it changes the step on a
    probe (``orders``, :func:`_read_orders`: Adam's m is read after its update, so "m read after its update"
    is the rule itself and is not generated)."""
    out = []
    for k, (after, before) in orders.items():
        if after:
            out.append(oracle_variant(rule, f"{k} read before its update", f"every formula of the step reads {k} as "
                                      f"it was before this step's update of {k} (its update placed after its use)",
                                      reads={k: "before"}))
        if before:
            out.append(oracle_variant(rule, f"{k} read after its update", f"every formula of the step reads {k} as "
                                      f"this step's update leaves it (its update placed before a use of the previous "
                                      f"{k})", reads={k: "after"}))
    return out


def _differences(sub, others) -> str:
    """': its weight_decay=0.1 on the other groups' leaves too' (the fields in which sub differs from them)."""
    same = [o for o in others if type(o) is type(sub)]
    if len(same) != len(others):
        return " (the groups not split)"
    diff = [f.name for f in dataclasses.fields(sub) if any(getattr(sub, f.name) != getattr(o, f.name) for o in others)]
    return ": its " + ", ".join(f"{n}={getattr(sub, n)!r}" for n in diff) + " on the other groups' leaves too"


def _partition_variants(rule) -> list:
    from refopt.conventions import oracle
    from refopt.conventions._variants import variants
    from refopt.rules.partition import Partition

    if not isinstance(rule, Partition):
        return []
    out = []
    for label, sub in rule.rules.items():
        others = [k for k in rule.rules if k != label]
        if others and all(rule.rules[k] != sub for k in others):
            out.append(rule_variant(f"group {label!r}'s rule on every leaf", f"{type(sub).__name__} of group "
                                    f"{label!r} applied to every leaf{_differences(sub, [rule.rules[k] for k in others])}",
                                    Partition({k: sub for k in rule.rules}, labels=rule.labels)))
        for v in variants(sub):
            name = f"{v.name} (group {label!r})"
            if v.rule is not None:
                out.append(rule_variant(name, v.detail, try_replace(rule, rules={**rule.rules, label: v.rule})))
            elif v.switches is not None:
                out.append(Variant(name, v.detail, lambda v=v, label=label, name=name: oracle(
                    rule, name=name, subs={label: v.make()}), switches={"subs": {label: v.switches}}))
            else:     # an adapter (W^T, a shifted counter): run on the group's leaves, the rule on the others
                out.append(Variant(name, v.detail, lambda v=v, label=label, name=name: GroupVariant(
                    rule, label, v.make(), name)))
    return out


class GroupVariant(Adapter):
    """A :class:`~refopt.rules.partition.Partition` whose group ``label`` is stepped by another adapter (a
    variant that is not a refopt rule: the rule on W^T, a shifted counter), its other leaves by the rule.
    The groups of a Partition are independent, so the group's leaves alone are the adapter's whole tree."""

    framework = "numpy"

    def __init__(self, rule, label: str, inner: Adapter, name: str):
        from refopt.testing.adapters import RuleAdapter
        self.rule, self.label, self.inner, self.name, self.whole = rule, label, inner, name, RuleAdapter(rule)

    def init(self, params):
        from refopt import tree as T
        xs, paths, _ = T.flatten(params)
        idx = [i for i, (p, x) in enumerate(zip(paths, xs)) if self.rule.label_of(p, x) == self.label]
        return idx, self.whole.init(params), self.inner.init([xs[i] for i in idx])

    def step(self, state, params, grads):
        idx, whole, inner = state
        out, whole = self.whole.step(whole, params, grads)
        sub, inner = self.inner.step(inner, [params[i] for i in idx], [grads[i] for i in idx])
        out = list(out)
        for j, i in enumerate(idx):
            out[i] = sub[j]
        return out, (idx, whole, inner)

    def state_arrays(self, state) -> dict:
        return {}


def _whole_tree_variants(rule) -> list:
    """The rule run on the whole tree as one array (:class:`~refopt.conventions._variants.WholeTreeRule`: a
    global norm where the rule takes one per array, a trust ratio or a layer's norm over every layer
    together), generated where that changes the rule's step on a probe tree of a matrix and a vector (an
    elementwise rule is the same on one array or many) and the rule takes a vector."""
    from refopt.conventions._variants import WholeTreeRule
    from refopt.rules.partition import Partition
    from refopt.testing.adapters import RuleAdapter

    if isinstance(rule, Partition):
        return []
    try:
        runs = [_probe(a, 0, ((3, 4), (5,)), 2) for a in (RuleAdapter(rule), WholeTreeRule(rule))]
    except (ValueError, TypeError):      # a rule that refuses a vector (Muon) or the probe has no such variant
        return []
    if all(np.array_equal(a, b) for a, b in zip(*runs)):
        return []
    return [Variant("the whole tree as one array", "every norm the rule takes per array taken over the whole tree "
                    "(a global trust ratio or layer norm in place of one per array)", lambda: WholeTreeRule(rule),
                    rule=None)]


def _probe(adapter, seed: int, shapes, steps: int) -> list:
    """The params after ``steps`` steps of ``adapter`` from a seeded standard-normal probe tree of ``shapes``
    (the params first, then each step's gradients: every adapter probed with one seed sees the same inputs)."""
    rng = np.random.default_rng(seed)
    x = [rng.standard_normal(sh) for sh in shapes]
    gs = [[rng.standard_normal(sh) for sh in shapes] for _ in range(steps)]
    s, y = adapter.init([v.copy() for v in x]), [v.copy() for v in x]
    for g in gs:
        y, s = adapter.step(s, y, [v.copy() for v in g])
    return y


def _read_orders(rule) -> dict:
    """{field: (the step reads it after its update, before it)} for each of :func:`state_fields`, from the
    oracle on a probe matrix and vector over four steps: reading a field's old value ('before') changes the
    step only if a formula reads it after its update, and reading the new value only if one reads it before.
    A Partition's come per group ({})."""
    from refopt.conventions import oracle
    from refopt.rules.partition import Partition

    if isinstance(rule, Partition):
        return {}
    shapes = ((16, 12), (12,))     # 204 entries over 4 steps: a sign-based step (Lion) flips on some

    def run(**sw):
        return _probe(oracle(rule, **sw), 1, shapes, 4)

    out = {}
    for k in state_fields(rule):
        try:
            with np.errstate(all="ignore"):      # a reordered read may take the sqrt of a negative: a NaN that differs
                plain, before, after = run(), run(reads={k: "before"}), run(reads={k: "after"})
        except (ValueError, TypeError):
            out[k] = (True, True)
            continue
        same = [all(np.array_equal(a, b) for a, b in zip(plain, other)) for other in (before, after)]
        out[k] = (not same[0], not same[1])
    return out


def _ema_swap_variants(rule, orders: dict) -> list:
    """Each state field updated with the weights of one of the rule's coefficients c in (0, 1) swapped,
    ``(1 - c) s + c u`` in place of ``c s + (1 - c) u`` (in that field's update only: the rule's other uses
    of c unchanged), the value read after the update where the step reads the field after updating it
    and from the next step on where it reads it before (both where it does both; ``orders``,
    :func:`_read_orders`)."""
    coefs = [f.name for f in dataclasses.fields(rule) if f.init and f.name != "lr" and f.name not in _NOT_COEFFICIENTS
             and _number(getattr(rule, f.name)) and not isinstance(getattr(rule, f.name), int)
             and 0 < getattr(rule, f.name) < 1]
    out = []
    for k, (after, before) in orders.items():
        for c in coefs:
            v = float(getattr(rule, c))
            for how, used in (("after", after), ("before", before)):
                if used:
                    out.append(oracle_variant(rule, f"{k}'s EMA weights swapped ({c}, 1 - {c})"
                                              + (" (read on the next step)" if how == "before" and after else ""),
                                              f"{k} updated as (1 - {c}) {k} + {c} u in place of {c} {k} + (1 - {c}) u "
                                              f"({c} = {v:g}; the rule's other uses of {c} unchanged)",
                                              ema_swap={k: (v, how)}))
    return out


def generated(rule) -> list:
    """The generated variants of ``rule`` (see the module docstring), in that order; None entries dropped."""
    from refopt.conventions._variants import base_variants

    out = (_option_variants(rule) + _swap_variants(rule) + _schedule_variants(rule) + _schedule_record_variants(rule)
           + _counter_variants(rule))
    orders = _read_orders(rule)
    out += (_read_order_variants(rule, orders) + _ema_swap_variants(rule, orders) + _whole_tree_variants(rule)
            + _partition_variants(rule))
    if hasattr(getattr(rule, "base", None), "init_leaf"):
        out += base_variants(rule)
    return [v for v in out if v is not None]
