"""Catalog entries for Partition (see catalog.py): function and tree labellings, nesting, Muon inside."""
from catalog import Case, mixed_params

from refopt.rules.adam import Adam, AdamW
from refopt.rules.partition import Partition, matrix_labels
from refopt.rules.sgd import SGD


def _leaf_rule(rule):
    """The rule a bare leaf gets: the sub-rule its label selects (labels trees depend on the path)."""
    return lambda path, x: rule.rules[rule.label_of(path, x)]


MIXED_TREE_LABELS = {"layers": [{"w": "hidden", "b": "other"}, {"w": "other", "b": "hidden"}], "scale": "hidden"}


def _sgd_adamw():
    return Partition(rules={"hidden": SGD(lr=0.05, momentum=0.9, nesterov=True),
                            "other": AdamW(lr=0.05, weight_decay=0.01)}, labels=matrix_labels)


def _tree_labels():
    return Partition(rules={"hidden": Adam(lr=0.05), "other": SGD(lr=0.1, momentum=0.5, dampening=0.1)},
                     labels=MIXED_TREE_LABELS)


def _nested():
    inner = Partition(rules={"hidden": SGD(lr=0.05, momentum=0.9), "other": Adam(lr=0.05)}, labels=matrix_labels)
    return Partition(rules={"first": inner, "rest": AdamW(lr=0.05, weight_decay=1e-3, wd_mode="independent")},
                     labels={"layers": [{"w": "first", "b": "first"}, {"w": "rest", "b": "rest"}],
                             "scale": "first"})


CASES = [
    Case("partition_sgd_adamw", _sgd_adamw),
    Case("partition_tree_labels", _tree_labels, extra={"leaf_rule": _leaf_rule(_tree_labels())}),
    Case("partition_nested", _nested, extra={"leaf_rule": _leaf_rule(_nested())}),
]

try:
    from refopt.rules.muon import Muon
    from refopt.schedules import LinearDecay
except ImportError:  # pragma: no cover - Muon / schedules not present in this checkout
    pass
else:
    def _muon_adamw():
        return Partition(rules={"hidden": Muon(lr=0.05, schedule=LinearDecay(300)),
                                "other": AdamW(lr=0.05, weight_decay=0.0)}, labels=matrix_labels)

    CASES.append(Case("partition_muon_adamw", _muon_adamw, make_params=mixed_params))

try:
    from refopt.rules.averaging import EMA
    from refopt.rules.schedule_free import ScheduleFreeAdamW
except ImportError:  # pragma: no cover
    pass
else:
    def _sf_ema():
        """Sub-rules with global state (Schedule-Free's weight sum) and their own eval weights."""
        return Partition(rules={"hidden": ScheduleFreeAdamW(lr=0.05), "other": EMA(SGD(lr=0.1), decay=0.9)},
                         labels=matrix_labels)

    CASES.append(Case("partition_schedulefree_ema", _sf_ema))
