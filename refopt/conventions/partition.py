"""Partition (refopt/rules/partition.py): each array follows the rule of its label, as optax.multi_transform
and torch's parameter groups (optax.contrib.muon's own split is matrix_labels)."""
from __future__ import annotations

from refopt.conventions._spec import Conventions, Example, Oracle
from refopt.golden import GoldenCase
from refopt.rules.adam import Adam, AdamW
from refopt.rules.averaging import EMA
from refopt.rules.muon import Muon
from refopt.rules.partition import Partition, matrix_labels
from refopt.rules.schedule_free import ScheduleFreeAdamW
from refopt.rules.sgd import SGD


class PartitionOracle(Oracle):
    """Each array stepped by the oracle of the rule its label selects (every sub-rule counts the steps t of
    the whole rule). Switch ``subs`` {label: oracle} replacing some groups' oracles (a group's variant)."""

    def __init__(self, rule, name=None, **sw):
        from refopt.conventions import oracle
        super().__init__(rule, name, **sw)
        self.subs = {k: sw.get("subs", {}).get(k) or oracle(r) for k, r in rule.rules.items()}
        self._labels = {}

    def _label(self, path, x):
        if path not in self._labels:
            self._labels[path] = self.rule.label_of(path, x)
        return self._labels[path]

    def init_leaf(self, x, path):
        return self.subs[self._label(path, x)].init_leaf(x, path)

    def step_leaf(self, t, s, x, g, path):
        from refopt.conventions._spec import stepped
        x, new = stepped(self.subs[self._label(path, x)], t, s, x, g, path)   # a group's read-order variant
        if new is not s:
            s.clear()
            s.update(new)
        return x

    def direction_leaf(self, t, s, x, g, path):
        return self.subs[self._label(path, x)].direction_leaf(t, s, x, g, path)


def facts(rule, of):
    """Each array follows one sub-rule: an invariance of the whole tree holds when every sub-rule has it
    (orthogonal transforms of one array are not stated)."""
    subs = [of(r) for r in rule.rules.values()]
    return {k: all(f[k] for f in subs) for k in ("grad_scale", "step_scale_free", "elementwise")}


def _leaf_rule(make):
    """The rule a bare leaf gets: the sub-rule its label selects (labels trees depend on the path)."""
    rule = make()
    return lambda path, x: rule.rules[rule.label_of(path, x)]


_TREE = {"layers": [{"w": "hidden", "b": "other"}, {"w": "other", "b": "hidden"}], "scale": "hidden"}


def _sgd_adamw():
    return Partition(rules={"hidden": SGD(lr=0.05, momentum=0.9, nesterov=True),
                            "other": AdamW(lr=0.05, weight_decay=0.01)}, labels=matrix_labels)


def _tree_labels():
    return Partition(rules={"hidden": Adam(lr=0.05), "other": SGD(lr=0.1, momentum=0.5, dampening=0.1)},
                     labels=_TREE)


def _nested():
    inner = Partition(rules={"hidden": SGD(lr=0.05, momentum=0.9), "other": Adam(lr=0.05)}, labels=matrix_labels)
    return Partition(rules={"first": inner, "rest": AdamW(lr=0.05, weight_decay=1e-3, wd_mode="independent")},
                     labels={"layers": [{"w": "first", "b": "first"}, {"w": "rest", "b": "rest"}], "scale": "first"})


def _muon_adamw():
    from refopt.schedules import LinearDecay
    return Partition(rules={"hidden": Muon(lr=0.05, schedule=LinearDecay(300)), "other": AdamW(lr=0.05, weight_decay=0.0)},
                     labels=matrix_labels)


def _sf_ema():
    """Sub-rules with global state (Schedule-Free's weight sum) and their own eval weights."""
    return Partition(rules={"hidden": ScheduleFreeAdamW(lr=0.05), "other": EMA(SGD(lr=0.1), decay=0.9)},
                     labels=matrix_labels)


CONVENTIONS = Conventions(
    rules=(Partition,),
    final="the step of a group's rule",
    per_step="",
    no_peer={"torch": "torch's parameter groups belong to one optimizer class; the cross-check runs each group's "
                      "optimizer as its own mapping",
             "optax": "optax.multi_transform of optax.contrib.muon's split is checked through optax.contrib.muon",
             "schedulefree": "schedulefree has no partition"},
    oracle=PartitionOracle,
    variants=lambda rule: [],
    facts=facts,
    golden=(GoldenCase("partition_muon_adamw", lambda: Partition({"hidden": Muon(lr=0.02), "other": AdamW(lr=1e-2)},
                                                                 labels=matrix_labels),
                       "Partition: Muon on the matrices, AdamW on the rest (optax.contrib.muon's split)"),),
    examples=(
        Example("partition_sgd_adamw", _sgd_adamw),
        Example("partition_tree_labels", _tree_labels, extra={"leaf_rule": _leaf_rule(_tree_labels)}),
        Example("partition_nested", _nested, extra={"leaf_rule": _leaf_rule(_nested)}),
        Example("partition_muon_adamw", _muon_adamw),
        Example("partition_schedulefree_ema", _sf_ema),
    ),
)
