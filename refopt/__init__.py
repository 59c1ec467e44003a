"""refopt: a golden reference for neural-network optimizers, in numpy and numba.

Pure-functional API (Optimisers.jl / optax style)::

    import refopt
    rule = refopt.AdamW(lr=1e-3, weight_decay=0.01)
    state = refopt.init(rule, params)
    params, state = refopt.update(rule, state, params, grads)

See :mod:`refopt.core` for the contract, :mod:`refopt.rules` for the rules, :mod:`refopt.schedules` for
learning-rate multipliers, :mod:`refopt.autograd` for the numpy autograd.
"""
from refopt import autograd, schedules, tree
from refopt.autograd import check_grads, check_grads_per_leaf, grad, value_and_grad
from refopt.checkpoint import Checkpoint, CheckpointError, load, save
from refopt.core import OptState, Rule, direction, eval_params, init, update, update_
from refopt.linalg import msign
from refopt.rules.lr_table import LRTable  # noqa: F401  (seed 002: a recorded lr per array and step)
from refopt.rules import (EMA, SGD, Adam, AdamW, Average, Covariant, Hyperball, Muon, Partition,
                          ScheduleFreeAdamW, ScheduleFreeSGD, gpt_labels, matrix_labels, mlp_labels)

__version__ = "0.1.0"

__all__ = [
    "tree", "autograd", "schedules", "value_and_grad", "grad", "check_grads", "check_grads_per_leaf",
    "OptState", "Rule", "init", "update", "update_", "direction", "eval_params", "save", "load", "Checkpoint", "CheckpointError", "msign",
    "SGD", "Adam", "AdamW", "Muon", "Hyperball", "Covariant", "Average", "EMA",
    "ScheduleFreeSGD", "ScheduleFreeAdamW", "Partition", "gpt_labels", "matrix_labels", "mlp_labels",
    "__version__",
]
