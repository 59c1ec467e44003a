"""The optimizer rules: each a frozen record of hyperparameters (see :mod:`refopt.core`), one small file per
family: :mod:`~refopt.rules.sgd`, :mod:`~refopt.rules.adam`, :mod:`~refopt.rules.lion`, :mod:`~refopt.rules.muon`,
:mod:`~refopt.rules.schedule_free`, and the wrappers :mod:`~refopt.rules.hyperball`, :mod:`~refopt.rules.covariant`,
:mod:`~refopt.rules.averaging`, :mod:`~refopt.rules.clip`, :mod:`~refopt.rules.partition`
(:mod:`~refopt.rules.base` holds what they share)."""
from refopt.rules.adam import Adam, AdamState, AdamW, AMSGradState
from refopt.rules.averaging import EMA, Average
from refopt.rules.base import ElementwiseRule, Wrapper
from refopt.rules.clip import ClipByGlobalNorm
from refopt.rules.covariant import Covariant
from refopt.rules.hyperball import Hyperball
from refopt.rules.lion import Lion
from refopt.rules.lr_table import LRTable  # noqa: F401  (a wrapper with a per-array lr table)
from refopt.rules.muon import Muon
from refopt.rules.partition import Partition, RefoptWarning, matrix_labels
from refopt.rules.schedule_free import ScheduleFreeAdamW, ScheduleFreeSGD
from refopt.rules.sgd import SGD, SGDState

__all__ = ["SGD", "SGDState", "Adam", "AdamW", "AdamState", "AMSGradState", "Lion", "Muon", "Hyperball", "Covariant",
           "Average", "EMA", "ClipByGlobalNorm", "ScheduleFreeSGD", "ScheduleFreeAdamW", "Partition", "RefoptWarning",
           "ElementwiseRule", "Wrapper", "matrix_labels"]
