"""The optimizer rules: each a frozen record of hyperparameters (see :mod:`refopt.core`)."""
from refopt.rules.adam import Adam, AdamState, AdamW
from refopt.rules.averaging import EMA, Average
from refopt.rules.covariant import Covariant
from refopt.rules.hyperball import Hyperball
from refopt.rules.lr_table import LRTable  # noqa: F401  (a wrapper with a per-array lr table)
from refopt.rules.muon import Muon
from refopt.rules.partition import Partition, gpt_labels, matrix_labels, mlp_labels
from refopt.rules.schedule_free import ScheduleFreeAdamW, ScheduleFreeSGD
from refopt.rules.sgd import SGD, SGDState

__all__ = ["SGD", "SGDState", "Adam", "AdamW", "AdamState", "Muon", "Hyperball", "Covariant", "Average", "EMA",
           "ScheduleFreeSGD", "ScheduleFreeAdamW", "Partition", "gpt_labels", "matrix_labels", "mlp_labels"]
