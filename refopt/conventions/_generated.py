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
* **scope**: for a :class:`~refopt.rules.partition.Partition`, each group's rule applied to every leaf
  and every variant of each group's rule in its group; for a wrapper (a ``base`` field), every variant of
  the base inside the wrapper (:func:`refopt.conventions._variants.base_variants`).

A variant the rule refuses to build (a swap out of a field's range) is not generated; one equal to the rule
is left out. Fields that cannot change the numbers (:data:`INERT`: where Newton-Schulz runs) are skipped.
"""
from __future__ import annotations

import dataclasses
import itertools
import numbers

from refopt.conventions._variants import Variant, oracle_variant, rule_variant, try_replace
from refopt.rules._checks import ChoiceError
from refopt.testing.adapters import Adapter

__all__ = ["generated", "choices", "INERT", "shifted_schedule", "CounterShift", "GroupVariant"]

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


class CounterShift(Adapter):
    """An oracle (:class:`refopt.conventions._spec.Oracle`) whose step counter is read as ``how``
    ('frozen': t = 1 at every step; 'next': t + 1): a counter kept in the state that never advances, or
    one counted from 0 and incremented first. Every place the oracle reads t is shifted alike."""

    framework = "numpy"

    def __init__(self, inner, how: str, name: str):
        self.inner, self.how, self.name = inner, how, name

    def init(self, params):
        return (0, self.inner.init(params))

    def step(self, state, params, grads):
        t, (_, leaves) = state[0] + 1, state[1]
        seen = 1 if self.how == "frozen" else t + 1
        x, (_, leaves) = self.inner.step((seen - 1, leaves), params, grads)
        return x, (t, (seen, leaves))

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


def generated(rule) -> list:
    """The generated variants of ``rule`` (see the module docstring), in that order; None entries dropped."""
    from refopt.conventions._variants import base_variants

    out = (_option_variants(rule) + _swap_variants(rule) + _schedule_variants(rule) + _counter_variants(rule)
           + _partition_variants(rule))
    if hasattr(getattr(rule, "base", None), "init_leaf"):
        out += base_variants(rule)
    return [v for v in out if v is not None]
